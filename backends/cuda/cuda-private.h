/* Calls of cuda.c for the engine's CUDA backend (backend-cuda.c): the
 * kernels on a given stream with the caller's own scratch. */
#pragma once

#include <sift/cuda.h>

/* Device scratch of one stream's calls: the split partials, and the block
 * table in a buffer of its own with a host copy of what it holds (table_n
 * entries), so that a call whose table repeats the last one's first
 * entries (resident decode: the same blocks step after step, then the
 * growing decode buffer) uploads the entries that changed only. */
typedef struct {
  void *ptr;
  gsize size;
  void *table;          /* device, table_cap entries */
  void *table_host;     /* the entries the device table holds */
  gsize table_cap, table_n;
  void *counters;       /* device, counters_n zeros: the decode kernel's fused split merge */
  gsize counters_n;
} SiftCudaScratch;

void sift_cuda_scratch_clear (SiftCudaScratch *scratch);

/* sift_cuda_attn_paged and sift_cuda_attn_merge on `stream` (a
 * cudaStream_t); scratch NULL: the shared one on the default stream.
 * start_event (a cudaEvent_t, or NULL) is recorded on the stream after the
 * host's preparation, right before the call's first launch. kv_heads
 * (NULL: every head attends every block) masks blocks per kv head. */
/* Rows per kv head (group x query tokens) of a call with blocks masked
 * per kv head (kv_heads[i]: bit g, kv head g attends block i; the decode
 * kernel's 16-row tile). */
#define SIFT_CUDA_MASKED_MAX_ROWS 16

gboolean sift_cuda_attn_paged_on (void *stream, SiftCudaScratch *scratch, void *start_event, const guint64 *kv_heads,
                                  const SiftView *q,
                                  const SiftView *k_blocks, const SiftView *v_blocks, gsize n_blocks,
                                  const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error);
gboolean sift_cuda_attn_merge_on (void *stream, SiftView *o1, float *lse1, const SiftView *o2, const float *lse2,
                                  GError **error);
