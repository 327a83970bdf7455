/* sift — vector primitives for policies and kernels (plugin ABI 2.0).
 *
 * Two parts:
 *  - header-only primitives for x86 (AVX2 + FMA, AVX-512F), compiled into
 *    the caller: one exponential with one underflow rule, horizontal sums
 *    and maxima, transposed sums of several vectors, dot products, f16/bf16
 *    loads. They exist only where SIFT_SIMD_X86 is defined (an x86-64 GCC or
 *    Clang, and a libsift built with -Dsimd=true); each is a static inline
 *    function with a target attribute, so it inlines into a caller whose
 *    own target (function attribute or -m flags) includes the one named
 *    beside it. Pick the path at run time from sift_isa_active (), the one
 *    switch that SIFT_ISA, sift_isa_force () and -Dsimd=false all act on.
 *  - exported helpers that dispatch on sift_isa_active () themselves: a
 *    tile of dot products, per-row sparse attention, top-k with forced
 *    sinks and recent items, lower-bound search.
 * docs/kernels.md describes both; the scalar loops beside every SIMD path
 * are the references the tests compare against. */
#pragma once

#include <glib.h>
#include <math.h>

#include <sift/api.h>
#include <sift/version.h>

G_BEGIN_DECLS

#if SIFT_BUILT_WITH_SIMD && defined(__x86_64__) && defined(__GNUC__)
#define SIFT_SIMD_X86 1
#include <immintrin.h>

/* Function attributes for a caller's SIMD path (the primitives below ask
 * for less: "avx2,fma", "avx2,f16c" or "avx512f", so a caller built with
 * -mavx2 -mfma or -mavx512f inlines them too). */
#define SIFT_TARGET_AVX2 __attribute__ ((target ("avx2,fma")))
#define SIFT_TARGET_AVX512 __attribute__ ((target ("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))
#define SIFT_SIMD_INLINE static inline __attribute__ ((always_inline))
#define SIFT_SIMD_256 __attribute__ ((target ("avx2,fma")))
#define SIFT_SIMD_512 __attribute__ ((target ("avx512f")))

/* 2^f - 1 = f P(f) on |f| <= 1/2, P(f) = ((((P0 f + P1) f + P2) f + P3) f + P4) f + P5
 * (minimax coefficients of Cephes' exp2f; relative error of 2^f < 2e-7). */
#define SIFT_EXP2_P0 1.535336188319500e-4f
#define SIFT_EXP2_P1 1.339887440266574e-3f
#define SIFT_EXP2_P2 9.618437357674640e-3f
#define SIFT_EXP2_P3 5.550332471162809e-2f
#define SIFT_EXP2_P4 2.402264791363012e-1f
#define SIFT_EXP2_P5 6.931472028550421e-1f
#define SIFT_LOG2E 1.44269504088896341f

/* ---- The exponential ------------------------------------------------------
 * 2^x: x = n + f with n = round (x), |f| <= 1/2, 2^f by the polynomial
 * above, 2^n into the exponent. e^x: n = round (x log2 e), r = x - n ln 2
 * in two steps (Cody-Waite, so r is exact to float precision for every
 * x), f = r log2 e, then the same polynomial; relative error below 3e-7
 * for both. The one underflow rule: every lane whose result would be
 * below 2^-126 (x < -126 for 2^x, x < -126 ln 2 = -87.3365 for e^x), -inf
 * included, gives exactly +0, so a masked score (-inf) weighs nothing and
 * needs no mask of its own. Lanes above 127 (88 for e^x) saturate; NaN
 * lanes give an unspecified value. */
#define SIFT_EXP_MIN -87.33654475f /* -126 ln 2 */
#define SIFT_LN2_HI 0.693145751953125f
#define SIFT_LN2_LO 1.428606765330187e-06f

/* 2^n p(f) for integral n in [-126, 127], zero where live is clear. */
SIFT_SIMD_INLINE SIFT_SIMD_256 __m256
sift_exp2_parts_256 (__m256 n, __m256 f, __m256 live)
{
  __m256 p = _mm256_set1_ps (SIFT_EXP2_P0);
  p = _mm256_fmadd_ps (p, f, _mm256_set1_ps (SIFT_EXP2_P1));
  p = _mm256_fmadd_ps (p, f, _mm256_set1_ps (SIFT_EXP2_P2));
  p = _mm256_fmadd_ps (p, f, _mm256_set1_ps (SIFT_EXP2_P3));
  p = _mm256_fmadd_ps (p, f, _mm256_set1_ps (SIFT_EXP2_P4));
  p = _mm256_fmadd_ps (p, f, _mm256_set1_ps (SIFT_EXP2_P5));
  p = _mm256_fmadd_ps (p, f, _mm256_set1_ps (1.0f));
  const __m256i e = _mm256_slli_epi32 (_mm256_add_epi32 (_mm256_cvtps_epi32 (n), _mm256_set1_epi32 (127)), 23);
  return _mm256_and_ps (_mm256_mul_ps (p, _mm256_castsi256_ps (e)), live);
}

SIFT_SIMD_INLINE SIFT_SIMD_512 __m512
sift_exp2_parts_512 (__m512 n, __m512 f, __mmask16 live)
{
  __m512 p = _mm512_set1_ps (SIFT_EXP2_P0);
  p = _mm512_fmadd_ps (p, f, _mm512_set1_ps (SIFT_EXP2_P1));
  p = _mm512_fmadd_ps (p, f, _mm512_set1_ps (SIFT_EXP2_P2));
  p = _mm512_fmadd_ps (p, f, _mm512_set1_ps (SIFT_EXP2_P3));
  p = _mm512_fmadd_ps (p, f, _mm512_set1_ps (SIFT_EXP2_P4));
  p = _mm512_fmadd_ps (p, f, _mm512_set1_ps (SIFT_EXP2_P5));
  p = _mm512_fmadd_ps (p, f, _mm512_set1_ps (1.0f));
  return _mm512_maskz_scalef_ps (live, p, n);
}

SIFT_SIMD_INLINE SIFT_SIMD_256 __m256
sift_exp2_256 (__m256 x)
{
  const __m256 live = _mm256_cmp_ps (x, _mm256_set1_ps (-126.0f), _CMP_GE_OQ);
  x = _mm256_max_ps (_mm256_min_ps (x, _mm256_set1_ps (127.0f)), _mm256_set1_ps (-126.0f));
  const __m256 n = _mm256_round_ps (x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return sift_exp2_parts_256 (n, _mm256_sub_ps (x, n), live);
}

SIFT_SIMD_INLINE SIFT_SIMD_512 __m512
sift_exp2_512 (__m512 x)
{
  const __mmask16 live = _mm512_cmp_ps_mask (x, _mm512_set1_ps (-126.0f), _CMP_GE_OQ);
  x = _mm512_min_ps (x, _mm512_set1_ps (127.0f));
  const __m512 n = _mm512_roundscale_ps (x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return sift_exp2_parts_512 (n, _mm512_sub_ps (x, n), live);
}

SIFT_SIMD_INLINE SIFT_SIMD_256 __m256
sift_exp_256 (__m256 x)
{
  const __m256 live = _mm256_cmp_ps (x, _mm256_set1_ps (SIFT_EXP_MIN), _CMP_GE_OQ);
  x = _mm256_max_ps (_mm256_min_ps (x, _mm256_set1_ps (88.0f)), _mm256_set1_ps (SIFT_EXP_MIN));
  const __m256 n = _mm256_round_ps (_mm256_mul_ps (x, _mm256_set1_ps (SIFT_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps (n, _mm256_set1_ps (SIFT_LN2_HI), x);
  r = _mm256_fnmadd_ps (n, _mm256_set1_ps (SIFT_LN2_LO), r);
  return sift_exp2_parts_256 (n, _mm256_mul_ps (r, _mm256_set1_ps (SIFT_LOG2E)), live);
}

SIFT_SIMD_INLINE SIFT_SIMD_512 __m512
sift_exp_512 (__m512 x)
{
  const __mmask16 live = _mm512_cmp_ps_mask (x, _mm512_set1_ps (SIFT_EXP_MIN), _CMP_GE_OQ);
  x = _mm512_min_ps (x, _mm512_set1_ps (88.0f));
  const __m512 n = _mm512_roundscale_ps (_mm512_mul_ps (x, _mm512_set1_ps (SIFT_LOG2E)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps (n, _mm512_set1_ps (SIFT_LN2_HI), x);
  r = _mm512_fnmadd_ps (n, _mm512_set1_ps (SIFT_LN2_LO), r);
  return sift_exp2_parts_512 (n, _mm512_mul_ps (r, _mm512_set1_ps (SIFT_LOG2E)), live);
}

/* ---- Horizontal sums and maxima ------------------------------------------- */

SIFT_SIMD_INLINE SIFT_SIMD_256 float
sift_hsum_256 (__m256 v)
{
  __m128 s = _mm_add_ps (_mm256_castps256_ps128 (v), _mm256_extractf128_ps (v, 1));
  s = _mm_add_ps (s, _mm_movehl_ps (s, s));
  s = _mm_add_ss (s, _mm_movehdup_ps (s));
  return _mm_cvtss_f32 (s);
}

SIFT_SIMD_INLINE SIFT_SIMD_256 float
sift_hmax_256 (__m256 v)
{
  __m128 s = _mm_max_ps (_mm256_castps256_ps128 (v), _mm256_extractf128_ps (v, 1));
  s = _mm_max_ps (s, _mm_movehl_ps (s, s));
  s = _mm_max_ss (s, _mm_movehdup_ps (s));
  return _mm_cvtss_f32 (s);
}

SIFT_SIMD_INLINE SIFT_SIMD_512 float
sift_hsum_512 (__m512 v)
{
  return _mm512_reduce_add_ps (v);
}

SIFT_SIMD_INLINE SIFT_SIMD_512 float
sift_hmax_512 (__m512 v)
{
  return _mm512_reduce_max_ps (v);
}

/* Transposed sum: lane c of the result is the sum of the lanes of t[c]
 * (pairwise horizontal adds, then the two 128-bit halves): eight sums for
 * about the price of two. */
SIFT_SIMD_INLINE SIFT_SIMD_256 __m256
sift_hsum8x8_256 (const __m256 t[8])
{
  const __m256 h01 = _mm256_hadd_ps (t[0], t[1]), h23 = _mm256_hadd_ps (t[2], t[3]);
  const __m256 h45 = _mm256_hadd_ps (t[4], t[5]), h67 = _mm256_hadd_ps (t[6], t[7]);
  const __m256 a = _mm256_hadd_ps (h01, h23), b = _mm256_hadd_ps (h45, h67);
  return _mm256_add_ps (_mm256_permute2f128_ps (a, b, 0x20), _mm256_permute2f128_ps (a, b, 0x31));
}

/* The same for 16 vectors of 16: lane i is the sum of v[i]'s lanes (pairs
 * within 128-bit lanes, then across them). */
SIFT_SIMD_INLINE SIFT_SIMD_512 __m512
sift_hsum16x16_512 (const __m512 v[16])
{
  __m512 x[8], z[4];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++)
    x[i] = _mm512_add_ps (_mm512_unpacklo_ps (v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps (v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++)
    {
      const __m512d lo = _mm512_unpacklo_pd (_mm512_castps_pd (x[2 * i]), _mm512_castps_pd (x[2 * i + 1]));
      const __m512d hi = _mm512_unpackhi_pd (_mm512_castps_pd (x[2 * i]), _mm512_castps_pd (x[2 * i + 1]));
      z[i] = _mm512_add_ps (_mm512_castpd_ps (lo), _mm512_castpd_ps (hi));
    }
  /* z[i][4L + e]: the sum over 128-bit lane L of v[4i + e]. */
  const __m512 w01 = _mm512_add_ps (_mm512_shuffle_f32x4 (z[0], z[1], 0x44), _mm512_shuffle_f32x4 (z[0], z[1], 0xee));
  const __m512 w23 = _mm512_add_ps (_mm512_shuffle_f32x4 (z[2], z[3], 0x44), _mm512_shuffle_f32x4 (z[2], z[3], 0xee));
  return _mm512_add_ps (_mm512_shuffle_f32x4 (w01, w23, 0x88), _mm512_shuffle_f32x4 (w01, w23, 0xdd));
}

/* A 512-bit vector folded to 256 bits (lane i + lane i + 8). */
SIFT_SIMD_INLINE SIFT_SIMD_512 __m256
sift_fold_512 (__m512 z)
{
  return _mm256_add_ps (_mm512_castps512_ps256 (z), _mm256_castpd_ps (_mm512_extractf64x4_pd (_mm512_castps_pd (z), 1)));
}

/* ---- Dot products ----------------------------------------------------------
 * a . b over n floats: whole vectors, one accumulator, then the tail. */
SIFT_SIMD_INLINE SIFT_SIMD_256 float
sift_dot_256 (const float *a, const float *b, gsize n)
{
  __m256 acc = _mm256_setzero_ps ();
  gsize t = 0;
  for (; t + 8 <= n; t += 8)
    acc = _mm256_fmadd_ps (_mm256_loadu_ps (a + t), _mm256_loadu_ps (b + t), acc);
  float r = sift_hsum_256 (acc);
  for (; t < n; t++)
    r += a[t] * b[t];
  return r;
}

SIFT_SIMD_INLINE SIFT_SIMD_512 float
sift_dot_512 (const float *a, const float *b, gsize n)
{
  __m512 acc = _mm512_setzero_ps ();
  gsize t = 0;
  for (; t + 16 <= n; t += 16)
    acc = _mm512_fmadd_ps (_mm512_loadu_ps (a + t), _mm512_loadu_ps (b + t), acc);
  if (t < n)
    {
      const __mmask16 m = (__mmask16) ((1u << (n - t)) - 1);
      acc = _mm512_fmadd_ps (_mm512_maskz_loadu_ps (m, a + t), _mm512_maskz_loadu_ps (m, b + t), acc);
    }
  return _mm512_reduce_add_ps (acc);
}

/* ---- f16 and bf16 loads ----------------------------------------------------
 * 8 or 16 halves to f32, exact (a signalling NaN comes out quiet from the
 * f16 loads; sift_f16_to_f32 keeps its payload). */
SIFT_SIMD_INLINE __attribute__ ((target ("avx2,f16c"))) __m256
sift_load_f16_256 (const guint16 *p)
{
  return _mm256_cvtph_ps (_mm_loadu_si128 ((const __m128i *) p));
}

SIFT_SIMD_INLINE SIFT_SIMD_256 __m256
sift_load_bf16_256 (const guint16 *p)
{
  return _mm256_castsi256_ps (_mm256_slli_epi32 (_mm256_cvtepu16_epi32 (_mm_loadu_si128 ((const __m128i *) p)), 16));
}

SIFT_SIMD_INLINE SIFT_SIMD_512 __m512
sift_load_f16_512 (const guint16 *p)
{
  return _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) p));
}

SIFT_SIMD_INLINE SIFT_SIMD_512 __m512
sift_load_bf16_512 (const guint16 *p)
{
  return _mm512_castsi512_ps (_mm512_slli_epi32 (_mm512_cvtepu16_epi32 (_mm256_loadu_si256 ((const __m256i *) p)), 16));
}
#endif /* SIFT_SIMD_X86 */

/* ---- Exported helpers (dispatched on sift_isa_active ()) ------------------ */

/* out[i * n_cols + j] = rows[i * row_stride ..] . cols[j * col_stride ..]
 * over len floats: a tile of scores q.K with queries and keys row-major.
 * Register tiles of 4 x 4 (AVX-512) or 4 x 2 (AVX2); same sums as the
 * scalar loop up to rounding. */
SIFT_API void sift_score_tile (const float *rows, gsize row_stride, gint64 n_rows, const float *cols,
                               gsize col_stride, gint64 n_cols, gsize len, float *out);
/* The plain loop: the reference of the SIMD paths. */
SIFT_API void sift_score_tile_scalar (const float *rows, gsize row_stride, gint64 n_rows, const float *cols,
                                      gsize col_stride, gint64 n_cols, gsize len, float *out);

/* The online-softmax state of one query row: running max m (natural
 * scale), running sum l of e^(s - m), and acc = sum e^(s - m) v. */
typedef struct {
  float m;
  float l;
  float *acc; /* [head_dim] */
} SiftRowState;

/* m = -inf, l = 0, acc = 0. */
SIFT_API void sift_row_state_reset (SiftRowState *st, gint32 head_dim);
/* o = acc / l and lse = m + ln l; a row that attended nothing gives o = 0
 * and lse = -inf (lse may be NULL). */
SIFT_API void sift_row_state_finish (const SiftRowState *st, gint32 head_dim, float *o, float *lse);

/* Per-row sparse attention: continues st over the keys k_base + idx[x] *
 * stride and values v_base + idx[x] * stride, x < n, with scores
 * scale * q . k. AVX2 / AVX-512 paths for head_dim 32, 64 and 128 (eight
 * candidates a step: one reduction tree, at most one rescale, one vector
 * exponential); every other head_dim, and SIFT_ISA=scalar, take the scalar
 * loop (sift_attend_row_sparse_scalar, the reference). */
SIFT_API void sift_attend_row_sparse (SiftRowState *st, const float *q, gint32 head_dim, float scale,
                                      const float *k_base, const float *v_base, gint64 stride,
                                      const gint32 *idx, gsize n);
SIFT_API void sift_attend_row_sparse_scalar (SiftRowState *st, const float *q, gint32 head_dim, float scale,
                                             const float *k_base, const float *v_base, gint64 stride,
                                             const gint32 *idx, gsize n);

/* Which of n items (in index order) to keep: the first `sinks` and the last
 * `recent` always, then the best-scoring others (score descending, lower
 * index first on ties, NaN last) until `budget` items are kept in all
 * (forced ones count against it; when they alone exceed it they are still
 * kept). keep [n] gets 0/1; returns how many are kept. O(n log budget). */
SIFT_API gsize sift_top_k (const float *score, gsize n, gsize budget, gsize sinks, gsize recent, guint8 *keep);

/* The first index i of ascending a[0, n) with a[i] >= x (n if none). */
SIFT_API gsize sift_lower_bound (const gint64 *a, gsize n, gint64 x);

G_END_DECLS
