/* The SIMD paths of core/simd.c's helpers (core/simd-x86.c), declared only
 * where SIFT_SIMD_X86 compiles them. */
#pragma once

#include <sift/attn.h>
#include <sift/simd.h>

G_BEGIN_DECLS

#ifdef SIFT_SIMD_X86
void sift_score_tile_avx2 (const float *rows, gsize row_stride, gint64 n_rows, const float *cols, gsize col_stride,
                           gint64 n_cols, gsize len, float *out);
void sift_score_tile_avx512 (const float *rows, gsize row_stride, gint64 n_rows, const float *cols,
                             gsize col_stride, gint64 n_cols, gsize len, float *out);

/* dst[0, n) = src[0, n) * s. */
void sift_scale_avx2 (float *dst, const float *src, float s, gsize n);
void sift_scale_avx512 (float *dst, const float *src, float s, gsize n);

typedef void (*SiftRowSparseFunc) (SiftRowState *st, const float *q, float scale, const float *k_base,
                                   const float *v_base, gint64 stride, const gint32 *idx, gsize n);
/* The path for head_dim (32, 64 or 128) on isa, or NULL. */
SiftRowSparseFunc sift_row_sparse_func (SiftIsa isa, gint32 head_dim);
#endif

G_END_DECLS
