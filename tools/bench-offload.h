/* sift bench offload's parts (bench-offload.c: options, the pattern
 * source, the bench policies, store throughput, pipeline efficiency;
 * bench-offload-engine.c: the GPU run and what the engine adds over the
 * dense kernels). */
#pragma once

#include <sift/sift.h>

typedef struct {
  gint layers, q_heads, kv_heads, head_dim, block, chunk, slots;
  gint64 tokens;
  char *stored, *compute, *pipeline, *path, *stores;
  gboolean direct, warm, quick, decode_only;
  gint store_block, store_kv_heads, store_head_dim, store_blocks;
  gint prefill_budget, decode_budget, steps;
  gint overhead_tokens;
  gint rows, reps;
  char *decode_at, *sections, *device;
  gint budget;
  char *resident_at, *sdpa_script;  /* --device cuda: resident decode lengths, SDPA's script */
} Opts;

/* Block 0 and the last `budget` blocks (all when budget <= 0). */
typedef struct {
  SiftPolicy parent;
  gint budget;
} WindowPolicy;

/* A cheap deterministic source (the benchmark measures the engine). */
gboolean offload_pattern_qkv (SiftModel *src, gint32 layer, gint64 pos0, gint64 n, float *q, float *k, float *v,
                              GError **error);
SiftModel *offload_pattern_new (const SiftModelShape *shape);
/* A policy that stores blocks and attends nothing, and one that keeps
 * block 0 and the last `budget` blocks (WindowPolicy). */
extern const SiftPolicyOps offload_store_only_ops;
extern const SiftPolicyOps offload_window_ops;
double offload_now_s (void);

/* --device cuda: offloaded decode on the GPU (section 4). */
int bench_gpu (const Opts *o);
/* What the engine adds over the dense kernels (section 3). */
int bench_overhead (const Opts *o, SiftDType stored, SiftDType compute);
