/* The SIMD dot products of matmul.c, on 256-bit vectors, written once.
 * Included by matmul-avx2.c and matmul-avx512.c after they define
 * dpbusd (acc, u, s): acc + the sums of four adjacent u8 x i8 products per
 * 32-bit lane (AVX2: maddubs + madd; AVX-512 VNNI: one vpdpbusd). Each
 * integer kernel follows its scalar twin in matmul.c step for step. */
#include <immintrin.h>

#include <sift/dtype.h>

#include "matmul.h"
#include "quant.h"

#define ALWAYS_INLINE static inline __attribute__ ((always_inline))

/* f16 to f32 by F16C, inline (the library's exact converter is a call per block). */
ALWAYS_INLINE float
h2f (guint16 h)
{
  return _cvtsh_ss (h);
}

ALWAYS_INLINE float
hsum_ps (__m256 v)
{
  __m128 s = _mm_add_ps (_mm256_castps256_ps128 (v), _mm256_extractf128_ps (v, 1));
  s = _mm_add_ps (s, _mm_movehl_ps (s, s));
  s = _mm_add_ss (s, _mm_movehdup_ps (s));
  return _mm_cvtss_f32 (s);
}

ALWAYS_INLINE int
hsum_epi32 (__m256i v)
{
  __m128i s = _mm_add_epi32 (_mm256_castsi256_si128 (v), _mm256_extracti128_si256 (v, 1));
  s = _mm_add_epi32 (s, _mm_shuffle_epi32 (s, 0x4e));
  s = _mm_add_epi32 (s, _mm_shuffle_epi32 (s, 0xb1));
  return _mm_cvtsi128_si32 (s);
}

ALWAYS_INLINE __m256
load_f16 (const guint16 *p)
{
  return _mm256_cvtph_ps (_mm_loadu_si128 ((const __m128i *) p));
}

ALWAYS_INLINE __m256
load_bf16 (const guint16 *p)
{
  return _mm256_castsi256_ps (_mm256_slli_epi32 (_mm256_cvtepu16_epi32 (_mm_loadu_si128 ((const __m128i *) p)), 16));
}

/* Float weights: four accumulators of 8 lanes hide the FMA latency. */
#define FLOAT_DOT(NAME, TYPE, LOAD, SCALAR)                                        \
  static float NAME (const void *w, const void *act, gint64 n)                     \
  {                                                                                \
    const TYPE *a = w;                                                             \
    const float *x = act;                                                          \
    __m256 acc[4] = { _mm256_setzero_ps (), _mm256_setzero_ps (),                  \
                      _mm256_setzero_ps (), _mm256_setzero_ps () };                \
    gint64 i = 0;                                                                  \
    for (; i + 32 <= n; i += 32)                                                   \
      for (int u = 0; u < 4; u++)                                                  \
        acc[u] = _mm256_fmadd_ps (LOAD (a + i + 8 * u), _mm256_loadu_ps (x + i + 8 * u), acc[u]); \
    for (; i + 8 <= n; i += 8)                                                     \
      acc[0] = _mm256_fmadd_ps (LOAD (a + i), _mm256_loadu_ps (x + i), acc[0]);    \
    float s = hsum_ps (_mm256_add_ps (_mm256_add_ps (acc[0], acc[1]), _mm256_add_ps (acc[2], acc[3]))); \
    for (; i < n; i++)                                                             \
      s += SCALAR (a[i]) * x[i];                                                   \
    return s;                                                                      \
  }

static inline float f32_id (float x) { return x; }
FLOAT_DOT (dot_f32, float, _mm256_loadu_ps, f32_id)
FLOAT_DOT (dot_f16, guint16, load_f16, h2f)
FLOAT_DOT (dot_bf16, guint16, load_bf16, sift_bf16_to_f32)

static float
dot_q8_0 (const void *w, const void *act, gint64 n)
{
  const BlockQ8_0 *b = w;
  const ActQ8 *x = act;
  __m256 acc = _mm256_setzero_ps ();
  for (gint64 i = 0; i < n / QK; i++)
    {
      __m256i q = _mm256_loadu_si256 ((const __m256i *) b[i].qs);
      __m256i xq = _mm256_loadu_si256 ((const __m256i *) x[i].qs);
      /* u8 x i8 products: |q| times x with q's sign. */
      __m256i dot = dpbusd (_mm256_setzero_si256 (), _mm256_sign_epi8 (q, q), _mm256_sign_epi8 (xq, q));
      acc = _mm256_fmadd_ps (_mm256_set1_ps (h2f (b[i].d) * x[i].d), _mm256_cvtepi32_ps (dot), acc);
    }
  return hsum_ps (acc);
}

/* The 32 nibbles of 16 bytes, low nibbles first (elements 0..15, then 16..31). */
ALWAYS_INLINE __m256i
unpack_nibbles16 (const guint8 *p)
{
  __m128i b = _mm_loadu_si128 ((const __m128i *) p);
  __m128i m = _mm_set1_epi8 (15);
  return _mm256_set_m128i (_mm_and_si128 (_mm_srli_epi16 (b, 4), m), _mm_and_si128 (b, m));
}

static float
dot_q4_0 (const void *w, const void *act, gint64 n)
{
  const BlockQ4_0 *b = w;
  const ActQ8 *x = act;
  __m256 acc = _mm256_setzero_ps ();
  float corr = 0;
  for (gint64 i = 0; i < n / QK; i++)
    {
      __m256i xq = _mm256_loadu_si256 ((const __m256i *) x[i].qs);
      __m256i dot = dpbusd (_mm256_setzero_si256 (), unpack_nibbles16 (b[i].qs), xq);
      float d = h2f (b[i].d) * x[i].d;
      acc = _mm256_fmadd_ps (_mm256_set1_ps (d), _mm256_cvtepi32_ps (dot), acc);
      corr += d * (float) (8 * x[i].sum);
    }
  return hsum_ps (acc) - corr;
}

static float
dot_q4_k (const void *w, const void *act, gint64 n)
{
  const BlockQ4_K *b = w;
  const ActQ8K *x = act;
  const __m256i m4 = _mm256_set1_epi8 (15);
  float s = 0;
  for (gint64 i = 0; i < n / QK_K; i++)
    {
      __m256i sum_q = _mm256_setzero_si256 ();
      int sum_m = 0;
      for (int c = 0; c < 4; c++)
        {
          guint8 sc0, m0, sc1, m1;
          llama_q4_k_scale_min (b[i].scales, 2 * c, &sc0, &m0);
          llama_q4_k_scale_min (b[i].scales, 2 * c + 1, &sc1, &m1);
          __m256i q = _mm256_loadu_si256 ((const __m256i *) (b[i].qs + 32 * c));
          __m256i lo = _mm256_and_si256 (q, m4), hi = _mm256_and_si256 (_mm256_srli_epi16 (q, 4), m4);
          __m256i d0 = dpbusd (_mm256_setzero_si256 (), lo, _mm256_loadu_si256 ((const __m256i *) (x[i].qs + 64 * c)));
          __m256i d1 = dpbusd (_mm256_setzero_si256 (), hi, _mm256_loadu_si256 ((const __m256i *) (x[i].qs + 64 * c + 32)));
          sum_q = _mm256_add_epi32 (sum_q, _mm256_add_epi32 (_mm256_mullo_epi32 (d0, _mm256_set1_epi32 (sc0)),
                                                             _mm256_mullo_epi32 (d1, _mm256_set1_epi32 (sc1))));
          sum_m += m0 * (x[i].bsums[4 * c] + x[i].bsums[4 * c + 1]) + m1 * (x[i].bsums[4 * c + 2] + x[i].bsums[4 * c + 3]);
        }
      s += x[i].d * (h2f (b[i].d) * (float) hsum_epi32 (sum_q) - h2f (b[i].dmin) * (float) sum_m);
    }
  return s;
}

static float
dot_q6_k (const void *w, const void *act, gint64 n)
{
  const BlockQ6_K *b = w;
  const ActQ8K *x = act;
  const __m256i m4 = _mm256_set1_epi8 (15), m2 = _mm256_set1_epi8 (3);
  float s = 0;
  for (gint64 i = 0; i < n / QK_K; i++)
    {
      __m256i sum = _mm256_setzero_si256 ();
      for (int h = 0; h < 2; h++)
        {
          const gint8 *sc = b[i].scales + 8 * h;
          const gint8 *xq = x[i].qs + 128 * h;
          __m256i ql0 = _mm256_loadu_si256 ((const __m256i *) (b[i].ql + 64 * h));
          __m256i ql1 = _mm256_loadu_si256 ((const __m256i *) (b[i].ql + 64 * h + 32));
          __m256i qh = _mm256_loadu_si256 ((const __m256i *) (b[i].qh + 32 * h));
          __m256i q[4] = {
            _mm256_or_si256 (_mm256_and_si256 (ql0, m4), _mm256_slli_epi16 (_mm256_and_si256 (qh, m2), 4)),
            _mm256_or_si256 (_mm256_and_si256 (ql1, m4), _mm256_slli_epi16 (_mm256_and_si256 (_mm256_srli_epi16 (qh, 2), m2), 4)),
            _mm256_or_si256 (_mm256_and_si256 (_mm256_srli_epi16 (ql0, 4), m4), _mm256_slli_epi16 (_mm256_and_si256 (_mm256_srli_epi16 (qh, 4), m2), 4)),
            _mm256_or_si256 (_mm256_and_si256 (_mm256_srli_epi16 (ql1, 4), m4), _mm256_slli_epi16 (_mm256_and_si256 (_mm256_srli_epi16 (qh, 6), m2), 4)),
          };
          for (int r = 0; r < 4; r++)
            {
              /* Lanes 0-3 hold sub-block 2r's 16 elements, lanes 4-7 sub-block 2r + 1's. */
              __m256i dot = dpbusd (_mm256_setzero_si256 (), q[r], _mm256_loadu_si256 ((const __m256i *) (xq + 32 * r)));
              __m256i scv = _mm256_setr_epi32 (sc[2 * r], sc[2 * r], sc[2 * r], sc[2 * r],
                                               sc[2 * r + 1], sc[2 * r + 1], sc[2 * r + 1], sc[2 * r + 1]);
              sum = _mm256_add_epi32 (sum, _mm256_mullo_epi32 (dot, scv));
            }
        }
      int corr = 0;
      for (int j = 0; j < 16; j++)
        corr += b[i].scales[j] * x[i].bsums[j];
      s += h2f (b[i].d) * x[i].d * (float) (hsum_epi32 (sum) - 32 * corr);
    }
  return s;
}

#define MATMUL_KERNELS(NAME)                \
  {                                         \
    .name = NAME,                           \
    .dot = {                                \
      [GGUF_TENSOR_F32] = dot_f32,          \
      [GGUF_TENSOR_F16] = dot_f16,          \
      [GGUF_TENSOR_BF16] = dot_bf16,        \
      [GGUF_TENSOR_Q8_0] = dot_q8_0,        \
      [GGUF_TENSOR_Q4_0] = dot_q4_0,        \
      [GGUF_TENSOR_Q4_K] = dot_q4_k,        \
      [GGUF_TENSOR_Q6_K] = dot_q6_k,        \
    },                                      \
  }
