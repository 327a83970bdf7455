/* AVX-512 products of reshaped rows and packed key panels, and the block
 * masses (this file alone targets AVX-512F; called only when
 * sift_isa_active () >= AVX512). Exponentials are <sift/simd.h>'s. */
#include "xattn-score.h"

#ifdef XATTN_HAVE_AVX512
#pragma GCC target("avx512f")
#include <immintrin.h>
#include <math.h>

/* ---- Packed key panels -------------------------------------------------
 * The scorer's main path (xattn-score.h, xattn_pack_panels): columns along
 * the lanes, so no horizontal sum. Per step t the microkernel loads np
 * panel vectors (16 columns each) and broadcasts one element of each of mr
 * rows: mr x np accumulators, each loaded vector feeding mr FMAs. */
#define PANEL_MR 6 /* rows per microkernel */
#define PANEL_NP 4 /* panels per microkernel: 24 of the 32 registers accumulate */

static inline __attribute__ ((always_inline)) void
panel_micro (const float *a, gsize a_stride, const float *b, gsize b_stride, gsize len, float *c, gsize c_stride,
             __mmask16 last, const int mr, const int np)
{
  __m512 acc[PANEL_MR][PANEL_NP];
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
    for (int n = 0; n < np; n++)
      acc[i][n] = _mm512_setzero_ps ();
  for (gsize t = 0; t < len; t++)
    {
      __m512 bv[PANEL_NP];
#pragma GCC unroll 4
      for (int n = 0; n < np; n++)
        bv[n] = _mm512_loadu_ps (b + (gsize) n * b_stride + t * 16);
#pragma GCC unroll 8
      for (int i = 0; i < mr; i++)
        {
          __m512 x = _mm512_set1_ps (a[(gsize) i * a_stride + t]);
#pragma GCC unroll 4
          for (int n = 0; n < np; n++)
            acc[i][n] = _mm512_fmadd_ps (x, bv[n], acc[i][n]);
        }
    }
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
    for (int n = 0; n < np; n++)
      {
        float *dst = c + (gsize) i * c_stride + (gsize) n * 16;
        if (n == np - 1)
          _mm512_mask_storeu_ps (dst, last, acc[i][n]);
        else
          _mm512_storeu_ps (dst, acc[i][n]);
      }
}

void
xattn_dots_panels_avx512 (const float *rows, gsize row_stride, gint64 n_rows, const float *panels, gint64 n_cols,
                          gsize len, gint64 n_seg, float *out)
{
  const gsize pstride = (gsize) n_seg * len * 16; /* floats per panel */
  const gint64 n_panels = (n_cols + 15) / 16;
  for (gint64 q0 = 0; q0 < n_panels; q0 += PANEL_NP)
    {
      const int np = (int) MIN (PANEL_NP, n_panels - q0);
      const gint64 left = n_cols - (q0 + np - 1) * 16; /* columns in the group's last panel */
      const __mmask16 last = left >= 16 ? (__mmask16) 0xffff : (__mmask16) ((1u << left) - 1);
      /* The group's panels (np x len x 64 bytes per segment) stay in L1
       * while every row of the tile goes past them. */
      for (gint64 s = 0; s < n_seg; s++)
        for (gint64 i0 = 0; i0 < n_rows; i0 += PANEL_MR)
          {
            const int mr = (int) MIN (PANEL_MR, n_rows - i0);
            const float *a = rows + (gsize) i0 * row_stride + (gsize) s * len;
            const float *b = panels + (gsize) q0 * pstride + (gsize) s * len * 16;
            float *c = out + ((gsize) s * (gsize) n_rows + (gsize) i0) * (gsize) n_cols + (gsize) q0 * 16;
#define PANEL_CASE(MR_, NP_)                                                                    \
  case (MR_) * 8 + (NP_):                                                                       \
    panel_micro (a, row_stride, b, pstride, len, c, (gsize) n_cols, last, MR_, NP_);            \
    break;
            switch (mr * 8 + np)
              {
                PANEL_CASE (6, 4) PANEL_CASE (6, 3) PANEL_CASE (6, 2) PANEL_CASE (6, 1)
                PANEL_CASE (5, 4) PANEL_CASE (5, 3) PANEL_CASE (5, 2) PANEL_CASE (5, 1)
                PANEL_CASE (4, 4) PANEL_CASE (4, 3) PANEL_CASE (4, 2) PANEL_CASE (4, 1)
                PANEL_CASE (3, 4) PANEL_CASE (3, 3) PANEL_CASE (3, 2) PANEL_CASE (3, 1)
                PANEL_CASE (2, 4) PANEL_CASE (2, 3) PANEL_CASE (2, 2) PANEL_CASE (2, 1)
                PANEL_CASE (1, 4) PANEL_CASE (1, 3) PANEL_CASE (1, 2) PANEL_CASE (1, 1)
              default:
                g_assert_not_reached ();
              }
#undef PANEL_CASE
          }
    }
}

float
xattn_max_scaled_avx512 (const float *x, gsize n, float scale)
{
  __m512 vm = _mm512_set1_ps (-INFINITY), vs = _mm512_set1_ps (scale);
  for (gsize i = 0; i < n; i += 16)
    {
      __mmask16 k = n - i >= 16 ? (__mmask16) 0xffff : (__mmask16) ((1u << (n - i)) - 1);
      vm = _mm512_mask_max_ps (vm, k, vm, _mm512_mul_ps (_mm512_maskz_loadu_ps (k, x + i), vs));
    }
  return _mm512_reduce_max_ps (vm);
}

float
xattn_sum_exp_avx512 (const float *x, gsize n, float scale, float m)
{
  __m512 acc = _mm512_setzero_ps (), vs = _mm512_set1_ps (scale), vm = _mm512_set1_ps (m);
  for (gsize i = 0; i < n; i += 16)
    {
      __mmask16 k = n - i >= 16 ? (__mmask16) 0xffff : (__mmask16) ((1u << (n - i)) - 1);
      /* Fused: the top entry gives e^(rounding of m), within 1e-5 of 1. */
      __m512 y = _mm512_fmsub_ps (_mm512_maskz_loadu_ps (k, x + i), vs, vm);
      acc = _mm512_mask_add_ps (acc, k, acc, sift_exp_512 (y));
    }
  return _mm512_reduce_add_ps (acc);
}

float
xattn_block_mass_avx512 (const float *x, gsize seg_stride, gint64 n_seg, gsize n, float scale, float *m_out)
{
  /* scale > 0: the max of x * scale is the max of x, times scale (float
   * rounding is monotonic), so the first pass needs no multiply. */
  if (n == 16 && n_seg == 8)
    {
      /* sum_exp's usual block (B / S = 16 columns, S = 8 segments): the
       * register path of the batched kernel. */
      float sum;
      xattn_block_masses_16x8_avx512 (x, seg_stride, 1, scale, m_out, &sum);
      return sum;
    }
  __m512 vm = _mm512_set1_ps (-INFINITY);
  for (gint64 s = 0; s < n_seg; s++)
    for (gsize i = 0; i < n; i += 16)
      {
        __mmask16 k = n - i >= 16 ? (__mmask16) 0xffff : (__mmask16) ((1u << (n - i)) - 1);
        vm = _mm512_mask_max_ps (vm, k, vm, _mm512_maskz_loadu_ps (k, x + (gsize) s * seg_stride + i));
      }
  const float m = _mm512_reduce_max_ps (vm) * scale;
  *m_out = m;
  __m512 acc = _mm512_setzero_ps (), vs = _mm512_set1_ps (scale), vmm = _mm512_set1_ps (m);
  for (gint64 s = 0; s < n_seg; s++)
    for (gsize i = 0; i < n; i += 16)
      {
        __mmask16 k = n - i >= 16 ? (__mmask16) 0xffff : (__mmask16) ((1u << (n - i)) - 1);
        __m512 y = _mm512_fmsub_ps (_mm512_maskz_loadu_ps (k, x + (gsize) s * seg_stride + i), vs, vmm);
        acc = _mm512_mask_add_ps (acc, k, acc, sift_exp_512 (y));
      }
  return _mm512_reduce_add_ps (acc);
}

void
xattn_block_masses_16x8_avx512 (const float *x, gsize seg_stride, gint64 n_blocks, float scale, float *m,
                                float *sum)
{
  /* As xattn_block_mass_avx512's register path, block after block, in
   * base 2: e^(x scale - mx) = 2^(x scale log2(e) - mx log2(e)). */
  const __m512 vs2 = _mm512_set1_ps (scale * 1.44269504f);
  for (gint64 b = 0; b < n_blocks; b++)
    {
      const float *xb = x + (gsize) b * 16;
      __m512 v[8], vm = _mm512_set1_ps (-INFINITY);
#pragma GCC unroll 8
      for (int p = 0; p < 8; p++)
        {
          v[p] = _mm512_loadu_ps (xb + (gsize) p * seg_stride);
          vm = _mm512_max_ps (vm, v[p]);
        }
      const float mx = _mm512_reduce_max_ps (vm) * scale;
      const __m512 vm2 = _mm512_set1_ps (mx * 1.44269504f);
      __m512 acc = _mm512_setzero_ps ();
#pragma GCC unroll 8
      for (int p = 0; p < 8; p++)
        acc = _mm512_add_ps (acc, sift_exp2_512 (_mm512_fmsub_ps (v[p], vs2, vm2)));
      m[b] = mx;
      sum[b] = _mm512_reduce_add_ps (acc);
    }
}

#endif /* XATTN_HAVE_AVX512 */
