/* The SIMD paths of core/simd.c's helpers, compiled with target
 * attributes (this file needs no -m flags) and called only after
 * sift_isa_active () says the CPU has them. */
#include <sift/attn.h>

#include "simd-private.h"

#ifdef SIFT_SIMD_X86

/* ---- Score tiles ----------------------------------------------------------
 * AVX2: tiles of 4 rows x 2 columns keep 8 accumulators in registers, so each
 * loaded vector feeds 2 (row) or 4 (column) FMAs. */
SIFT_TARGET_AVX2 void
sift_score_tile_avx2 (const float *rows, gsize row_stride, gint64 n_rows, const float *cols, gsize col_stride,
                      gint64 n_cols, gsize len, float *out)
{
  const gsize vlen = len & ~(gsize) 7;
  gint64 i = 0;
  for (; i + 4 <= n_rows; i += 4)
    {
      const float *a0 = rows + (gsize) i * row_stride;
      const float *a1 = a0 + row_stride, *a2 = a1 + row_stride, *a3 = a2 + row_stride;
      gint64 j = 0;
      for (; j + 2 <= n_cols; j += 2)
        {
          const float *b0 = cols + (gsize) j * col_stride, *b1 = b0 + col_stride;
          __m256 c00 = _mm256_setzero_ps (), c01 = _mm256_setzero_ps ();
          __m256 c10 = _mm256_setzero_ps (), c11 = _mm256_setzero_ps ();
          __m256 c20 = _mm256_setzero_ps (), c21 = _mm256_setzero_ps ();
          __m256 c30 = _mm256_setzero_ps (), c31 = _mm256_setzero_ps ();
          for (gsize t = 0; t < vlen; t += 8)
            {
              __m256 k0 = _mm256_loadu_ps (b0 + t), k1 = _mm256_loadu_ps (b1 + t);
              __m256 q = _mm256_loadu_ps (a0 + t);
              c00 = _mm256_fmadd_ps (q, k0, c00);
              c01 = _mm256_fmadd_ps (q, k1, c01);
              q = _mm256_loadu_ps (a1 + t);
              c10 = _mm256_fmadd_ps (q, k0, c10);
              c11 = _mm256_fmadd_ps (q, k1, c11);
              q = _mm256_loadu_ps (a2 + t);
              c20 = _mm256_fmadd_ps (q, k0, c20);
              c21 = _mm256_fmadd_ps (q, k1, c21);
              q = _mm256_loadu_ps (a3 + t);
              c30 = _mm256_fmadd_ps (q, k0, c30);
              c31 = _mm256_fmadd_ps (q, k1, c31);
            }
          float r[8] = { sift_hsum_256 (c00), sift_hsum_256 (c01), sift_hsum_256 (c10), sift_hsum_256 (c11),
                         sift_hsum_256 (c20), sift_hsum_256 (c21), sift_hsum_256 (c30), sift_hsum_256 (c31) };
          for (gsize t = vlen; t < len; t++)
            {
              r[0] += a0[t] * b0[t]; r[1] += a0[t] * b1[t];
              r[2] += a1[t] * b0[t]; r[3] += a1[t] * b1[t];
              r[4] += a2[t] * b0[t]; r[5] += a2[t] * b1[t];
              r[6] += a3[t] * b0[t]; r[7] += a3[t] * b1[t];
            }
          for (gint64 ii = 0; ii < 4; ii++)
            {
              out[(i + ii) * n_cols + j] = r[2 * ii];
              out[(i + ii) * n_cols + j + 1] = r[2 * ii + 1];
            }
        }
      for (; j < n_cols; j++)
        {
          const float *b = cols + (gsize) j * col_stride;
          out[i * n_cols + j] = sift_dot_256 (a0, b, len);
          out[(i + 1) * n_cols + j] = sift_dot_256 (a1, b, len);
          out[(i + 2) * n_cols + j] = sift_dot_256 (a2, b, len);
          out[(i + 3) * n_cols + j] = sift_dot_256 (a3, b, len);
        }
    }
  for (; i < n_rows; i++)
    for (gint64 j = 0; j < n_cols; j++)
      out[i * n_cols + j] = sift_dot_256 (rows + (gsize) i * row_stride, cols + (gsize) j * col_stride, len);
}

/* AVX-512: tiles of 4 x 4 keep 16 accumulators; the tail of a row
 * (len % 16) goes through masked loads. */
/* Up to 4 x 4 dot products with one code path: rows and columns past
 * nr / nc repeat the last valid one and their results are dropped. */
SIFT_SIMD_INLINE SIFT_TARGET_AVX512 void
tile4x4 (const float *const a[4], const float *const b[4], gsize len, float r[16])
{
  /* Every loop over c is unrolled, so the 16 accumulators live in
   * registers (at -O2 GCC would otherwise keep them on the stack). */
  __m512 c[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i++)
    c[i] = _mm512_setzero_ps ();
  gsize t = 0;
  for (; t + 16 <= len; t += 16)
    {
      __m512 k0 = _mm512_loadu_ps (b[0] + t), k1 = _mm512_loadu_ps (b[1] + t);
      __m512 k2 = _mm512_loadu_ps (b[2] + t), k3 = _mm512_loadu_ps (b[3] + t);
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++)
        {
          __m512 q = _mm512_loadu_ps (a[i] + t);
          c[4 * i] = _mm512_fmadd_ps (q, k0, c[4 * i]);
          c[4 * i + 1] = _mm512_fmadd_ps (q, k1, c[4 * i + 1]);
          c[4 * i + 2] = _mm512_fmadd_ps (q, k2, c[4 * i + 2]);
          c[4 * i + 3] = _mm512_fmadd_ps (q, k3, c[4 * i + 3]);
        }
    }
  if (t < len)
    {
      __mmask16 m = (__mmask16) ((1u << (len - t)) - 1);
      __m512 k[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; j++)
        k[j] = _mm512_maskz_loadu_ps (m, b[j] + t);
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++)
        {
          __m512 q = _mm512_maskz_loadu_ps (m, a[i] + t);
#pragma GCC unroll 4
          for (int j = 0; j < 4; j++)
            c[4 * i + j] = _mm512_fmadd_ps (q, k[j], c[4 * i + j]);
        }
    }
  /* The 16 horizontal sums as one transpose-and-add tree (short rows, as
   * xattn_bsa's sum_exp with len = head_dim, would otherwise spend
   * more on 16 separate reductions than on the FMAs). c[4i + j] is row i,
   * column j. Level 1 folds lanes 2, 3 onto 0, 1 with a second vector in
   * the upper half; level 2 leaves row m's four columns in the four
   * 128-bit lanes of u[m]; level 3 sums within lanes across rows. */
  __m512 s[8], u[4];
#pragma GCC unroll 8
  for (int k = 0; k < 8; k++)
    s[k] = _mm512_add_ps (_mm512_shuffle_f32x4 (c[2 * k], c[2 * k + 1], _MM_SHUFFLE (1, 0, 1, 0)),
                          _mm512_shuffle_f32x4 (c[2 * k], c[2 * k + 1], _MM_SHUFFLE (3, 2, 3, 2)));
#pragma GCC unroll 4
  for (int m = 0; m < 4; m++)
    u[m] = _mm512_add_ps (_mm512_shuffle_f32x4 (s[2 * m], s[2 * m + 1], _MM_SHUFFLE (2, 0, 2, 0)),
                          _mm512_shuffle_f32x4 (s[2 * m], s[2 * m + 1], _MM_SHUFFLE (3, 1, 3, 1)));
  __m512 v01 = _mm512_add_ps (_mm512_unpacklo_ps (u[0], u[1]), _mm512_unpackhi_ps (u[0], u[1]));
  __m512 v23 = _mm512_add_ps (_mm512_unpacklo_ps (u[2], u[3]), _mm512_unpackhi_ps (u[2], u[3]));
  __m512 res = _mm512_add_ps (_mm512_shuffle_ps (v01, v23, _MM_SHUFFLE (1, 0, 1, 0)),
                              _mm512_shuffle_ps (v01, v23, _MM_SHUFFLE (3, 2, 3, 2)));
  float sums[16];
  _mm512_storeu_ps (sums, res); /* sums[4j + i]: row i, column j */
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++)
      r[4 * i + j] = sums[4 * j + i];
}

SIFT_TARGET_AVX512 void
sift_score_tile_avx512 (const float *rows, gsize row_stride, gint64 n_rows, const float *cols, gsize col_stride,
                        gint64 n_cols, gsize len, float *out)
{
  for (gint64 i = 0; i < n_rows; i += 4)
    {
      gint64 nr = MIN (4, n_rows - i);
      const float *a[4];
      for (gint64 ii = 0; ii < 4; ii++)
        a[ii] = rows + (gsize) (i + MIN (ii, nr - 1)) * row_stride;
      for (gint64 j = 0; j < n_cols; j += 4)
        {
          gint64 nc = MIN (4, n_cols - j);
          const float *b[4];
          for (gint64 jj = 0; jj < 4; jj++)
            b[jj] = cols + (gsize) (j + MIN (jj, nc - 1)) * col_stride;
          float r[16];
          tile4x4 (a, b, len, r);
          for (gint64 ii = 0; ii < nr; ii++)
            for (gint64 jj = 0; jj < nc; jj++)
              out[(i + ii) * n_cols + j + jj] = r[4 * ii + jj];
        }
    }
}

/* ---- Per-row sparse attention ---------------------------------------------- */

SIFT_TARGET_AVX2 void
sift_scale_avx2 (float *dst, const float *src, float s, gsize n)
{
  gsize i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps (dst + i, _mm256_mul_ps (_mm256_loadu_ps (src + i), _mm256_set1_ps (s)));
  for (; i < n; i++)
    dst[i] = src[i] * s;
}

SIFT_TARGET_AVX512 void
sift_scale_avx512 (float *dst, const float *src, float s, gsize n)
{
  for (gsize i = 0; i < n; i += 16)
    {
      const __mmask16 m = n - i >= 16 ? (__mmask16) 0xffff : (__mmask16) ((1u << (n - i)) - 1);
      _mm512_mask_storeu_ps (dst + i, m, _mm512_mul_ps (_mm512_maskz_loadu_ps (m, src + i), _mm512_set1_ps (s)));
    }
}

/* Scores of one batch -> weights, after raising the running max. Lanes at
 * or past nb are padding and get weight 0. */
SIFT_SIMD_INLINE SIFT_TARGET_AVX2 __m256
batch_weights (__m256 s, int nb, float *m, float *l, float *r_out)
{
  __m256i lane = _mm256_setr_epi32 (0, 1, 2, 3, 4, 5, 6, 7);
  __m256 valid = _mm256_castsi256_ps (_mm256_cmpgt_epi32 (_mm256_set1_epi32 (nb), lane));
  s = _mm256_blendv_ps (_mm256_set1_ps (-INFINITY), s, valid);
  float bm = sift_hmax_256 (s);
  *r_out = 1.0f;
  if (bm > *m)
    {
      /* Everything summed so far shrinks by e^(m_old - m_new): exponents stay <= 0. */
      *r_out = expf (*m - bm);
      *l *= *r_out;
      *m = bm;
    }
  __m256 p = _mm256_and_ps (sift_exp_256 (_mm256_sub_ps (s, _mm256_set1_ps (*m))), valid);
  *l += sift_hsum_256 (p);
  return p;
}

/* The row loop of both ISAs, as acc_<isa>: nv vectors of W floats per row
 * (nv a constant where it is inlined). Eight candidates a step: their
 * scores (each folded to 8 lanes by TO8) come out of one reduction tree,
 * the running max is raised (and acc rescaled) at most once per step, the
 * eight exponentials are one vector. */
#define DEFINE_ROW_ACC(isa, ATTR, VEC, W, LOAD, STORE, SET1, MUL, FMA, TO8)                               \
  SIFT_SIMD_INLINE ATTR void acc_##isa (SiftRowState *st, const float *q, int nv, float scale,             \
                                        const float *bk, const float *bv, gint64 stride, const gint32 *idx, \
                                        gsize n)                                                           \
  {                                                                                                        \
    VEC qv[128 / (W)], acc[128 / (W)];                                                                     \
    _Pragma ("GCC unroll 16") for (int j = 0; j < nv; j++)                                                 \
    {                                                                                                      \
      qv[j] = MUL (LOAD (q + (W) * j), SET1 (scale));                                                      \
      acc[j] = LOAD (st->acc + (W) * j);                                                                   \
    }                                                                                                      \
    float m = st->m, l = st->l;                                                                            \
    for (gsize x = 0; x < n; x += 8)                                                                       \
      {                                                                                                    \
        int nb = (int) MIN (8, n - x);                                                                     \
        __m256 t[8];                                                                                       \
        _Pragma ("GCC unroll 8") for (int c = 0; c < 8; c++)                                               \
        {                                                                                                  \
          t[c] = _mm256_setzero_ps ();                                                                     \
          if (c < nb)                                                                                      \
            {                                                                                              \
              const float *k = bk + (gint64) idx[x + c] * stride;                                          \
              VEC z = MUL (qv[0], LOAD (k));                                                               \
              _Pragma ("GCC unroll 16") for (int j = 1; j < nv; j++) z = FMA (qv[j], LOAD (k + (W) * j), z); \
              t[c] = TO8 (z);                                                                              \
            }                                                                                              \
        }                                                                                                  \
        float r;                                                                                           \
        __m256 p = batch_weights (sift_hsum8x8_256 (t), nb, &m, &l, &r);                                   \
        if (r != 1.0f)                                                                                     \
          _Pragma ("GCC unroll 16") for (int j = 0; j < nv; j++) acc[j] = MUL (acc[j], SET1 (r));          \
        float pf[8];                                                                                       \
        _mm256_storeu_ps (pf, p);                                                                          \
        for (int c = 0; c < nb; c++)                                                                       \
          {                                                                                                \
            const float *v = bv + (gint64) idx[x + c] * stride;                                            \
            VEC w = SET1 (pf[c]);                                                                          \
            _Pragma ("GCC unroll 16") for (int j = 0; j < nv; j++) acc[j] = FMA (w, LOAD (v + (W) * j), acc[j]); \
          }                                                                                                \
      }                                                                                                    \
    _Pragma ("GCC unroll 16") for (int j = 0; j < nv; j++) STORE (st->acc + (W) * j, acc[j]);              \
    st->m = m;                                                                                             \
    st->l = l;                                                                                             \
  }

SIFT_SIMD_INLINE SIFT_TARGET_AVX2 __m256
same_256 (__m256 z)
{
  return z;
}

DEFINE_ROW_ACC (avx2, SIFT_TARGET_AVX2, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_mul_ps,
                _mm256_fmadd_ps, same_256)
/* AVX-512: rows in 16-float vectors, each score folded to 8 lanes, then the
 * same reduction tree and weights as AVX2. */
DEFINE_ROW_ACC (avx512, SIFT_TARGET_AVX512, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps,
                _mm512_mul_ps, _mm512_fmadd_ps, sift_fold_512)

/* One entry point per head_dim with a constant vector count, so the row
 * loops unroll and acc and q stay in registers. */
#define DEFINE_ROW_SPARSE(isa, ATTR, d, nv)                                                            \
  static ATTR void row_##isa##_##d (SiftRowState *st, const float *q, float scale, const float *bk,     \
                                    const float *bv, gint64 stride, const gint32 *idx, gsize n)         \
  {                                                                                                    \
    acc_##isa (st, q, nv, scale, bk, bv, stride, idx, n);                                              \
  }

DEFINE_ROW_SPARSE (avx2, SIFT_TARGET_AVX2, 32, 4)
DEFINE_ROW_SPARSE (avx2, SIFT_TARGET_AVX2, 64, 8)
DEFINE_ROW_SPARSE (avx2, SIFT_TARGET_AVX2, 128, 16)
DEFINE_ROW_SPARSE (avx512, SIFT_TARGET_AVX512, 32, 2)
DEFINE_ROW_SPARSE (avx512, SIFT_TARGET_AVX512, 64, 4)
DEFINE_ROW_SPARSE (avx512, SIFT_TARGET_AVX512, 128, 8)

SiftRowSparseFunc
sift_row_sparse_func (SiftIsa isa, gint32 head_dim)
{
  static const SiftRowSparseFunc table[2][3] = {
    { row_avx2_32, row_avx2_64, row_avx2_128 },
    { row_avx512_32, row_avx512_64, row_avx512_128 },
  };
  if (isa == SIFT_ISA_SCALAR || (head_dim != 32 && head_dim != 64 && head_dim != 128))
    return NULL;
  return table[isa >= SIFT_ISA_AVX512][head_dim == 32 ? 0 : head_dim == 64 ? 1 : 2];
}

#endif /* SIFT_SIMD_X86 */
