/* sift bench attention --device cuda (tools/bench-attention-cuda.c). */
#pragma once

#include <glib.h>

/* Prefill lengths `pre` and decode lengths `dec` (gint64 each) on the GPU,
 * beside PyTorch SDPA measured by the Python script `sdpa_script`. Returns
 * the exit status (0, 1 a kernel failed, 2 no GPU). */
int sift_bench_attention_cuda (const GArray *pre, const GArray *dec, int repeats, const char *sdpa_script);
