/* sift bench attention --device cuda (tools/bench-attention-cuda.c). */
#pragma once

#include <glib.h>

/* Prefill lengths `pre` and decode lengths `dec` (gint64 each) on the GPU,
 * beside PyTorch SDPA measured by the Python script `sdpa_script`. Returns
 * the exit status (0, 1 a kernel failed, 2 no GPU). */
int sift_bench_attention_cuda (const GArray *pre, const GArray *dec, int repeats, const char *sdpa_script);

/* PyTorch SDPA's one-row decode (32/8 heads, head_dim 128, bf16) at each
 * length of `dec` (gint64): ms[i] (NAN where not measured) and the
 * device-to-device copy rate, measured by the script; FALSE with *why
 * (g_free it) when python3 or torch is missing. */
gboolean sift_bench_sdpa_decode (const char *script, const GArray *dec, int repeats, double *copy_gbps, double *ms,
                                 char **why);
