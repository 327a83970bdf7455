/* The input the policy benchmarks share: Q/K/V of a config's synthetic
 * model source (its seed and knobs, no needle), layer 0. */
#pragma once

#include <glib.h>
#include <sift/sift.h>
#include <synthetic/synthetic.h>

/* Query heads 0..q_heads-1 and the kv heads they read, 0..ceil(q_heads /
 * group)-1, of layer 0 for positions 0..n-1, generated 4096 tokens at a
 * time. q: f32 [q_heads][n][head_dim]; k, v: f32 [kv][n][head_dim]. */
gboolean sift_bench_synth_qkv (const SiftConfig *cfg, gint32 q_heads, gint64 n, float *q, float *k, float *v,
                               GError **error);
