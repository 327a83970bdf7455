/* Calls of cuda.c for the engine's CUDA backend (backend-cuda.c): the
 * kernels on a given stream with the caller's own scratch. */
#pragma once

#include <sift/cuda.h>

/* Device scratch of one stream's calls (the block table, split partials). */
typedef struct {
  void *ptr;
  gsize size;
} SiftCudaScratch;

void sift_cuda_scratch_clear (SiftCudaScratch *scratch);

/* sift_cuda_attn_paged and sift_cuda_attn_merge on `stream` (a
 * cudaStream_t); scratch NULL: the shared one on the default stream. */
gboolean sift_cuda_attn_paged_on (void *stream, SiftCudaScratch *scratch, const SiftView *q,
                                  const SiftView *k_blocks, const SiftView *v_blocks, gsize n_blocks,
                                  const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error);
gboolean sift_cuda_attn_merge_on (void *stream, SiftView *o1, float *lse1, const SiftView *o2, const float *lse2,
                                  GError **error);
