/* AVX-512 VNNI matmul dot products (built with the AVX-512 flags and
 * -mavx512vnni; chosen only when the CPU has VNNI): vpdpbusd on 256-bit
 * vectors, exact (no 16-bit intermediate); and the register tiles that
 * prefill's multi-token products run on (F16, Q8_0, Q4_K). */
#include <immintrin.h>
#include <string.h>

static inline __attribute__ ((always_inline)) __m256i
dpbusd (__m256i acc, __m256i u, __m256i s)
{
  return _mm256_dpbusd_epi32 (acc, u, s);
}

#include "matmul-simd.h"
#include "repack-avx512.h"

/* ---- register tiles (prefill): TR weight rows x up to TT tokens ---- */

#define TR 4
#define TT 4

/* Each tile body is written for a constant token count NT and instantiated
 * for 1..TT, so its loops over rows and tokens unroll into registers. */
#define TILE_DISPATCH(NAME)                                                              \
  static void NAME (const guint8 *w, gsize ws, const guint8 *a, gsize as, int nt, gint64 n, \
                    float *y, gsize ys)                                                  \
  {                                                                                      \
    switch (nt)                                                                          \
      {                                                                                  \
      case 1: NAME##_nt (w, ws, a, as, 1, n, y, ys); break;                              \
      case 2: NAME##_nt (w, ws, a, as, 2, n, y, ys); break;                              \
      case 3: NAME##_nt (w, ws, a, as, 3, n, y, ys); break;                              \
      default: NAME##_nt (w, ws, a, as, TT, n, y, ys); break;                            \
      }                                                                                  \
  }

ALWAYS_INLINE float
hsum512 (__m512 v)
{
  return _mm512_reduce_add_ps (v);
}

/* F16 weights, f32 activations: 16 lanes; each converted weight vector
 * serves NT tokens. The tail (n % 16) is scalar. */
ALWAYS_INLINE void
tile_f16_nt (const guint8 *w, gsize ws, const guint8 *a, gsize as, const int NT, gint64 n, float *y, gsize ys)
{
  __m512 acc[TR][TT];
  for (int r = 0; r < TR; r++)
    for (int t = 0; t < NT; t++)
      acc[r][t] = _mm512_setzero_ps ();
  gint64 i = 0;
  for (; i + 16 <= n; i += 16)
    {
      __m512 x[TT];
      for (int t = 0; t < NT; t++)
        x[t] = _mm512_loadu_ps ((const float *) (a + t * as) + i);
      for (int r = 0; r < TR; r++)
        {
          __m512 wv = _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) ((const guint16 *) (w + r * ws) + i)));
          for (int t = 0; t < NT; t++)
            acc[r][t] = _mm512_fmadd_ps (wv, x[t], acc[r][t]);
        }
    }
  for (int r = 0; r < TR; r++)
    for (int t = 0; t < NT; t++)
      {
        const guint16 *wr = (const guint16 *) (w + r * ws);
        const float *xt = (const float *) (a + t * as);
        float s = hsum512 (acc[r][t]);
        for (gint64 k = i; k < n; k++)
          s += h2f (wr[k]) * xt[k];
        y[t * ys + r] = s;
      }
}
TILE_DISPATCH (tile_f16)

/* Q8_0: (q + 128) as u8 times the token's i8 codes, so one vpdpbusd per
 * pair; the bias 128 * sum (x codes) comes off through the accumulator's
 * start (lane 0). */
ALWAYS_INLINE void
tile_q8_0_nt (const guint8 *w, gsize ws, const guint8 *a, gsize as, const int NT, gint64 n, float *y, gsize ys)
{
  __m256 acc[TR][TT];
  for (int r = 0; r < TR; r++)
    for (int t = 0; t < NT; t++)
      acc[r][t] = _mm256_setzero_ps ();
  const __m256i bias = _mm256_set1_epi8 ((char) 0x80);
  for (gint64 i = 0; i < n / QK; i++)
    {
      __m256i q[TR];
      __m256 dw[TR];
      for (int r = 0; r < TR; r++)
        {
          const BlockQ8_0 *b = (const BlockQ8_0 *) (w + r * ws) + i;
          q[r] = _mm256_xor_si256 (_mm256_loadu_si256 ((const __m256i *) b->qs), bias);
          dw[r] = _mm256_set1_ps (h2f (b->d));
        }
      for (int t = 0; t < NT; t++)
        {
          const ActQ8 *x = (const ActQ8 *) (a + t * as) + i;
          __m256i xq = _mm256_loadu_si256 ((const __m256i *) x->qs);
          __m256i start = _mm256_zextsi128_si256 (_mm_cvtsi32_si128 (-128 * x->sum));
          __m256 dx = _mm256_set1_ps (x->d);
          for (int r = 0; r < TR; r++)
            {
              __m256i dot = _mm256_dpbusd_epi32 (start, q[r], xq);
              acc[r][t] = _mm256_fmadd_ps (_mm256_mul_ps (dw[r], dx), _mm256_cvtepi32_ps (dot), acc[r][t]);
            }
        }
    }
  for (int r = 0; r < TR; r++)
    for (int t = 0; t < NT; t++)
      y[t * ys + r] = hsum_ps (acc[r][t]);
}
TILE_DISPATCH (tile_q8_0)

/* Q4_K: a row's nibbles and 6-bit scales are unpacked once per super-block
 * for NT tokens; per sub-block of 32, u8 nibbles x i8 codes to i16 pairs
 * (vpmaddubsw, at most 2 * 15 * 127: no saturation), then vpdpwssd with the
 * sub-block's scale. The mins meet the token's 16-element sums. */
ALWAYS_INLINE void
tile_q4_k_nt (const guint8 *w, gsize ws, const guint8 *a, gsize as, const int NT, gint64 n, float *y, gsize ys)
{
  __m256 acc[TR][TT];
  for (int r = 0; r < TR; r++)
    for (int t = 0; t < NT; t++)
      acc[r][t] = _mm256_setzero_ps ();
  const __m256i m4 = _mm256_set1_epi8 (15);
  for (gint64 i = 0; i < n / QK_K; i++)
    {
      __m256i sq[TR][TT], sm[TR][TT];
      __m256i mins[TR];
      __m256i sc16[TR][8];
      for (int r = 0; r < TR; r++)
        {
          const BlockQ4_K *b = (const BlockQ4_K *) (w + r * ws) + i;
          gint16 mv[16];
          for (int j = 0; j < 8; j++)
            {
              guint8 sc, m;
              llama_q4_k_scale_min (b->scales, j, &sc, &m);
              sc16[r][j] = _mm256_set1_epi16 (sc);
              mv[2 * j] = mv[2 * j + 1] = m;
            }
          mins[r] = _mm256_loadu_si256 ((const __m256i *) mv);
          for (int t = 0; t < NT; t++)
            sq[r][t] = _mm256_setzero_si256 ();
        }
      for (int t = 0; t < NT; t++)
        {
          const ActQ8K *x = (const ActQ8K *) (a + t * as) + i;
          __m256i bs = _mm256_loadu_si256 ((const __m256i *) x->bsums);
          for (int r = 0; r < TR; r++)
            sm[r][t] = _mm256_madd_epi16 (mins[r], bs);
        }
      for (int c = 0; c < 4; c++)
        {
          __m256i lo[TR], hi[TR];
          for (int r = 0; r < TR; r++)
            {
              const BlockQ4_K *b = (const BlockQ4_K *) (w + r * ws) + i;
              __m256i qv = _mm256_loadu_si256 ((const __m256i *) (b->qs + 32 * c));
              lo[r] = _mm256_and_si256 (qv, m4);
              hi[r] = _mm256_and_si256 (_mm256_srli_epi16 (qv, 4), m4);
            }
          for (int t = 0; t < NT; t++)
            {
              const ActQ8K *x = (const ActQ8K *) (a + t * as) + i;
              __m256i x0 = _mm256_loadu_si256 ((const __m256i *) (x->qs + 64 * c));
              __m256i x1 = _mm256_loadu_si256 ((const __m256i *) (x->qs + 64 * c + 32));
              for (int r = 0; r < TR; r++)
                {
                  sq[r][t] = _mm256_dpwssd_epi32 (sq[r][t], _mm256_maddubs_epi16 (lo[r], x0), sc16[r][2 * c]);
                  sq[r][t] = _mm256_dpwssd_epi32 (sq[r][t], _mm256_maddubs_epi16 (hi[r], x1), sc16[r][2 * c + 1]);
                }
            }
        }
      for (int r = 0; r < TR; r++)
        {
          const BlockQ4_K *b = (const BlockQ4_K *) (w + r * ws) + i;
          __m256 d = _mm256_set1_ps (h2f (b->d)), dmin = _mm256_set1_ps (-h2f (b->dmin));
          for (int t = 0; t < NT; t++)
            {
              const ActQ8K *x = (const ActQ8K *) (a + t * as) + i;
              __m256 dx = _mm256_set1_ps (x->d);
              __m256 v = _mm256_fmadd_ps (d, _mm256_cvtepi32_ps (sq[r][t]), _mm256_mul_ps (dmin, _mm256_cvtepi32_ps (sm[r][t])));
              acc[r][t] = _mm256_fmadd_ps (dx, v, acc[r][t]);
            }
        }
    }
  for (int r = 0; r < TR; r++)
    for (int t = 0; t < NT; t++)
      y[t * ys + r] = hsum_ps (acc[r][t]);
}
TILE_DISPATCH (tile_q4_k)

/* ---- x16 groups (decode and short steps): 16 rows x up to X16_T tokens ---- */

#define X16_T 4

#define X16_DISPATCH(NAME)                                                                 \
  static void NAME (const guint8 *w, const guint8 *a, gsize as, int nt, gint64 n, float *y, gsize ys) \
  {                                                                                        \
    switch (nt)                                                                            \
      {                                                                                    \
      case 1: NAME##_nt (w, a, as, 1, n, y, ys); break;                                    \
      case 2: NAME##_nt (w, a, as, 2, n, y, ys); break;                                    \
      case 3: NAME##_nt (w, a, as, 3, n, y, ys); break;                                    \
      default: NAME##_nt (w, a, as, X16_T, n, y, ys); break;                               \
      }                                                                                    \
  }

/* 4 activation codes (i8) at p in every 32-bit lane. */
ALWAYS_INLINE __m512i
bcast4 (const gint8 *p)
{
  gint32 v;
  memcpy (&v, p, 4);
  return _mm512_set1_epi32 (v);
}

/* Q8_0: per block, 8 vectors of (code + 128) as u8, one vpdpbusd each with
 * 4 of the token's codes in every lane; lane r is row r, so the 16 rows'
 * scales meet their sums as one vector. The bias 128 * sum (x codes) comes
 * off through the accumulator's start. Two integer chains halve the
 * dependency on vpdpbusd's latency. */
ALWAYS_INLINE void
x16_q8_0_nt (const guint8 *w, const guint8 *a, gsize as, const int NT, gint64 n, float *y, gsize ys)
{
  const BlockQ8_0x16 *b = (const BlockQ8_0x16 *) w;
  const __m512i bias = _mm512_set1_epi8 ((char) 0x80);
  __m512 acc[X16_T];
  for (int t = 0; t < NT; t++)
    acc[t] = _mm512_setzero_ps ();
  for (gint64 i = 0; i < n / QK; i++)
    {
      _mm_prefetch ((const char *) (b + i + 4), _MM_HINT_T0);
      __m512i q[QK / 4];
      for (int g = 0; g < QK / 4; g++)
        q[g] = _mm512_xor_si512 (_mm512_loadu_si512 (b[i].qs[g]), bias);
      __m512 dw = _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) b[i].d));
      for (int t = 0; t < NT; t++)
        {
          const ActQ8 *x = (const ActQ8 *) (a + (gsize) t * as) + i;
          __m512i s0 = _mm512_set1_epi32 (-128 * x->sum), s1 = _mm512_setzero_si512 ();
          for (int g = 0; g < QK / 4; g += 2)
            {
              s0 = _mm512_dpbusd_epi32 (s0, q[g], bcast4 (x->qs + 4 * g));
              s1 = _mm512_dpbusd_epi32 (s1, q[g + 1], bcast4 (x->qs + 4 * g + 4));
            }
          acc[t] = _mm512_fmadd_ps (_mm512_cvtepi32_ps (_mm512_add_epi32 (s0, s1)),
                                    _mm512_mul_ps (dw, _mm512_set1_ps (x->d)), acc[t]);
        }
    }
  for (int t = 0; t < NT; t++)
    _mm512_storeu_ps (y + t * ys, acc[t]);
}
X16_DISPATCH (x16_q8_0)

/* Q4_K: per sub-block pair, 8 vectors of nibbles, each split into the low
 * (sub-block 2c) and high (2c + 1) codes as u8, one vpdpbusd each against
 * 4 of the token's codes in every lane; the sums take the rows' 6-bit
 * scales as int32 lanes, the mins meet the token's 32-element sums. */
ALWAYS_INLINE void
x16_q4_k_nt (const guint8 *w, const guint8 *a, gsize as, const int NT, gint64 n, float *y, gsize ys)
{
  const BlockQ4_Kx16 *b = (const BlockQ4_Kx16 *) w;
  const __m512i m4 = _mm512_set1_epi8 (15);
  __m512 acc[X16_T];
  for (int t = 0; t < NT; t++)
    acc[t] = _mm512_setzero_ps ();
  for (gint64 i = 0; i < n / QK_K; i++)
    {
      __m512i sc[8], mn[8];
      x16_q4_k_scales_avx512 (&b[i], sc, mn);
      __m512i sq[X16_T], sm[X16_T];
      for (int t = 0; t < NT; t++)
        {
          const ActQ8K *x = (const ActQ8K *) (a + (gsize) t * as) + i;
          sq[t] = _mm512_setzero_si512 ();
          sm[t] = _mm512_setzero_si512 ();
          for (int j = 0; j < 8; j++)
            sm[t] = _mm512_add_epi32 (sm[t], _mm512_mullo_epi32 (mn[j], _mm512_set1_epi32 (x->bsums[2 * j] + x->bsums[2 * j + 1])));
        }
      for (int c = 0; c < 4; c++)
        {
          __m512i lo[X16_T], hi[X16_T];
          for (int t = 0; t < NT; t++)
            lo[t] = hi[t] = _mm512_setzero_si512 ();
          for (int g = 0; g < QK / 4; g++)
            {
              __m512i v = _mm512_loadu_si512 (b[i].qs[c][g]);
              __m512i vl = _mm512_and_si512 (v, m4), vh = _mm512_and_si512 (_mm512_srli_epi16 (v, 4), m4);
              for (int t = 0; t < NT; t++)
                {
                  const ActQ8K *x = (const ActQ8K *) (a + (gsize) t * as) + i;
                  lo[t] = _mm512_dpbusd_epi32 (lo[t], vl, bcast4 (x->qs + 64 * c + 4 * g));
                  hi[t] = _mm512_dpbusd_epi32 (hi[t], vh, bcast4 (x->qs + 64 * c + 32 + 4 * g));
                }
            }
          for (int t = 0; t < NT; t++)
            sq[t] = _mm512_add_epi32 (sq[t], _mm512_add_epi32 (_mm512_mullo_epi32 (lo[t], sc[2 * c]),
                                                               _mm512_mullo_epi32 (hi[t], sc[2 * c + 1])));
        }
      __m512 d = _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) b[i].d));
      __m512 dmin = _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) b[i].dmin));
      for (int t = 0; t < NT; t++)
        {
          const ActQ8K *x = (const ActQ8K *) (a + (gsize) t * as) + i;
          __m512 v = _mm512_fmsub_ps (d, _mm512_cvtepi32_ps (sq[t]), _mm512_mul_ps (dmin, _mm512_cvtepi32_ps (sm[t])));
          acc[t] = _mm512_fmadd_ps (_mm512_set1_ps (x->d), v, acc[t]);
        }
    }
  for (int t = 0; t < NT; t++)
    _mm512_storeu_ps (y + t * ys, acc[t]);
}
X16_DISPATCH (x16_q4_k)

/* Q6_K: per half of a super-block and 4-byte column g, three vectors (two
 * of low bits, one of high bits) make the 6-bit codes (u8) of four
 * quarters, one vpdpbusd each against 4 of the token's codes; each
 * sub-block's sums start at -32 (sum x) (the codes are q - 32) and take
 * the rows' scales as int32 lanes. */
ALWAYS_INLINE void
x16_q6_k_nt (const guint8 *w, const guint8 *a, gsize as, const int NT, gint64 n, float *y, gsize ys)
{
  const BlockQ6_Kx16 *b = (const BlockQ6_Kx16 *) w;
  const __m512i m4 = _mm512_set1_epi8 (15), m3 = _mm512_set1_epi8 (3);
  __m512 acc[X16_T];
  for (int t = 0; t < NT; t++)
    acc[t] = _mm512_setzero_ps ();
  for (gint64 i = 0; i < n / QK_K; i++)
    {
      __m512i sum[X16_T];
      for (int t = 0; t < NT; t++)
        sum[t] = _mm512_setzero_si512 ();
      for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++)
          {
            /* Quarter k's elements 128 h + 32 k + 16 half + 0..15: sub-block 8 h + 2 k + half. */
            __m512i s[X16_T][4];
            for (int t = 0; t < NT; t++)
              {
                const ActQ8K *x = (const ActQ8K *) (a + (gsize) t * as) + i;
                for (int k = 0; k < 4; k++)
                  s[t][k] = _mm512_set1_epi32 (-32 * x->bsums[8 * h + 2 * k + half]);
              }
            for (int gg = 0; gg < 4; gg++)
              {
                int g = 4 * half + gg;
                __m512i l0 = _mm512_loadu_si512 (b[i].ql[h][0][g]), l1 = _mm512_loadu_si512 (b[i].ql[h][1][g]);
                __m512i hb = _mm512_loadu_si512 (b[i].qh[h][g]);
                /* Shifts of 16-bit lanes, masked per byte: nothing carries across bytes. */
                __m512i q[4] = {
                  _mm512_or_si512 (_mm512_and_si512 (l0, m4), _mm512_slli_epi16 (_mm512_and_si512 (hb, m3), 4)),
                  _mm512_or_si512 (_mm512_and_si512 (l1, m4),
                                   _mm512_slli_epi16 (_mm512_and_si512 (_mm512_srli_epi16 (hb, 2), m3), 4)),
                  _mm512_or_si512 (_mm512_and_si512 (_mm512_srli_epi16 (l0, 4), m4),
                                   _mm512_slli_epi16 (_mm512_and_si512 (_mm512_srli_epi16 (hb, 4), m3), 4)),
                  _mm512_or_si512 (_mm512_and_si512 (_mm512_srli_epi16 (l1, 4), m4),
                                   _mm512_slli_epi16 (_mm512_and_si512 (_mm512_srli_epi16 (hb, 6), m3), 4)),
                };
                for (int t = 0; t < NT; t++)
                  {
                    const ActQ8K *x = (const ActQ8K *) (a + (gsize) t * as) + i;
                    for (int k = 0; k < 4; k++)
                      s[t][k] = _mm512_dpbusd_epi32 (s[t][k], q[k], bcast4 (x->qs + 128 * h + 32 * k + 4 * g));
                  }
              }
            for (int k = 0; k < 4; k++)
              {
                __m512i sc = _mm512_cvtepi8_epi32 (_mm_loadu_si128 ((const __m128i *) b[i].scales[8 * h + 2 * k + half]));
                for (int t = 0; t < NT; t++)
                  sum[t] = _mm512_add_epi32 (sum[t], _mm512_mullo_epi32 (s[t][k], sc));
              }
          }
      __m512 d = _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) b[i].d));
      for (int t = 0; t < NT; t++)
        {
          const ActQ8K *x = (const ActQ8K *) (a + (gsize) t * as) + i;
          acc[t] = _mm512_fmadd_ps (_mm512_cvtepi32_ps (sum[t]), _mm512_mul_ps (d, _mm512_set1_ps (x->d)), acc[t]);
        }
    }
  for (int t = 0; t < NT; t++)
    _mm512_storeu_ps (y + t * ys, acc[t]);
}
X16_DISPATCH (x16_q6_k)

const LlamaMatmulKernels llama_matmul_avx512 = {
  .name = "avx512-vnni",
  .dot = {
    [GGUF_TENSOR_F32] = dot_f32,
    [GGUF_TENSOR_F16] = dot_f16,
    [GGUF_TENSOR_BF16] = dot_bf16,
    [GGUF_TENSOR_Q8_0] = dot_q8_0,
    [GGUF_TENSOR_Q4_0] = dot_q4_0,
    [GGUF_TENSOR_Q4_K] = dot_q4_k,
    [GGUF_TENSOR_Q6_K] = dot_q6_k,
  },
  .tile = {
    [GGUF_TENSOR_F16] = tile_f16,
    [GGUF_TENSOR_Q8_0] = tile_q8_0,
    [GGUF_TENSOR_Q4_K] = tile_q4_k,
  },
  .tile_r = TR,
  .tile_t = TT,
  .x16 = {
    [GGUF_TENSOR_Q8_0] = x16_q8_0,
    [GGUF_TENSOR_Q4_K] = x16_q4_k,
    [GGUF_TENSOR_Q6_K] = x16_q6_k,
  },
  .x16_t = X16_T,
};
