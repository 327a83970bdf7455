/* AVX2 + FMA dot products of reshaped rows and columns (this file alone
 * targets AVX2; called only when sift_isa_active () >= AVX2). Tiles of
 * 4 rows x 2 columns keep 8 accumulators in registers, so each loaded
 * vector feeds 2 (row) or 4 (column) FMAs instead of one. */
#include "xattn-score.h"

#ifdef XATTN_HAVE_AVX2
#pragma GCC target("avx2,fma")
#include <immintrin.h>

static inline float
hsum (__m256 v)
{
  __m128 s = _mm_add_ps (_mm256_castps256_ps128 (v), _mm256_extractf128_ps (v, 1));
  s = _mm_add_ps (s, _mm_movehl_ps (s, s));
  s = _mm_add_ss (s, _mm_movehdup_ps (s));
  return _mm_cvtss_f32 (s);
}

static float
dot1 (const float *a, const float *b, gsize len)
{
  __m256 acc = _mm256_setzero_ps ();
  gsize t = 0;
  for (; t + 8 <= len; t += 8)
    acc = _mm256_fmadd_ps (_mm256_loadu_ps (a + t), _mm256_loadu_ps (b + t), acc);
  float r = hsum (acc);
  for (; t < len; t++)
    r += a[t] * b[t];
  return r;
}

void
xattn_dots_avx2 (const float *rows, gsize row_stride, gint64 n_rows, const float *cols,
                 gsize col_stride, gint64 n_cols, gsize len, float *out)
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
          float r[8] = { hsum (c00), hsum (c01), hsum (c10), hsum (c11),
                         hsum (c20), hsum (c21), hsum (c30), hsum (c31) };
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
          out[i * n_cols + j] = dot1 (a0, b, len);
          out[(i + 1) * n_cols + j] = dot1 (a1, b, len);
          out[(i + 2) * n_cols + j] = dot1 (a2, b, len);
          out[(i + 3) * n_cols + j] = dot1 (a3, b, len);
        }
    }
  for (; i < n_rows; i++)
    for (gint64 j = 0; j < n_cols; j++)
      out[i * n_cols + j] = dot1 (rows + (gsize) i * row_stride, cols + (gsize) j * col_stride, len);
}

#endif /* XATTN_HAVE_AVX2 */
