/* SIMD paths of sq_accumulate. Candidates are taken eight at a time: their
 * eight scores come out of one reduction tree, the running max is raised
 * (and acc rescaled) at most once per batch instead of once per key, the
 * eight exponentials are one vector polynomial, and acc stays in registers
 * for the whole call. Same sums as the scalar path up to rounding. */
#include <math.h>
#include <sift/attn.h>

#include "sq-simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 __attribute__ ((target ("avx2,fma")))
#define AVX512 __attribute__ ((target ("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))
#define INLINE static inline __attribute__ ((always_inline))

/* e^x for x <= 0 (Cephes' polynomial: relative error about 1e-7). Lanes
 * below -87 come out as a tiny positive number; callers mask padding. */
INLINE AVX2 __m256
exp256 (__m256 x)
{
  x = _mm256_max_ps (x, _mm256_set1_ps (-87.0f));
  __m256 fx = _mm256_floor_ps (_mm256_fmadd_ps (x, _mm256_set1_ps (1.44269504088896341f),
                                                _mm256_set1_ps (0.5f)));
  x = _mm256_fnmadd_ps (fx, _mm256_set1_ps (0.693359375f), x);
  x = _mm256_fnmadd_ps (fx, _mm256_set1_ps (-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps (1.9875691500e-4f);
  y = _mm256_fmadd_ps (y, x, _mm256_set1_ps (1.3981999507e-3f));
  y = _mm256_fmadd_ps (y, x, _mm256_set1_ps (8.3334519073e-3f));
  y = _mm256_fmadd_ps (y, x, _mm256_set1_ps (4.1665795894e-2f));
  y = _mm256_fmadd_ps (y, x, _mm256_set1_ps (1.6666665459e-1f));
  y = _mm256_fmadd_ps (y, x, _mm256_set1_ps (5.0000001201e-1f));
  y = _mm256_fmadd_ps (y, _mm256_mul_ps (x, x), _mm256_add_ps (x, _mm256_set1_ps (1.0f)));
  __m256i e = _mm256_slli_epi32 (_mm256_add_epi32 (_mm256_cvtps_epi32 (fx), _mm256_set1_epi32 (127)), 23);
  return _mm256_mul_ps (y, _mm256_castsi256_ps (e));
}

/* Lane c of the result: the sum of t[c]'s eight lanes. */
INLINE AVX2 __m256
reduce8 (const __m256 t[8])
{
  __m256 h01 = _mm256_hadd_ps (t[0], t[1]), h23 = _mm256_hadd_ps (t[2], t[3]);
  __m256 h45 = _mm256_hadd_ps (t[4], t[5]), h67 = _mm256_hadd_ps (t[6], t[7]);
  __m256 a = _mm256_hadd_ps (h01, h23), b = _mm256_hadd_ps (h45, h67);
  return _mm256_add_ps (_mm256_permute2f128_ps (a, b, 0x20), _mm256_permute2f128_ps (a, b, 0x31));
}

INLINE AVX2 float
hmax8 (__m256 v)
{
  __m128 x = _mm_max_ps (_mm256_castps256_ps128 (v), _mm256_extractf128_ps (v, 1));
  x = _mm_max_ps (x, _mm_movehl_ps (x, x));
  x = _mm_max_ss (x, _mm_shuffle_ps (x, x, 1));
  return _mm_cvtss_f32 (x);
}

INLINE AVX2 float
hsum8 (__m256 v)
{
  __m128 x = _mm_add_ps (_mm256_castps256_ps128 (v), _mm256_extractf128_ps (v, 1));
  x = _mm_add_ps (x, _mm_movehl_ps (x, x));
  x = _mm_add_ss (x, _mm_shuffle_ps (x, x, 1));
  return _mm_cvtss_f32 (x);
}

/* Scores of one batch -> weights, after raising the running max. Lanes at
 * or past nb are padding and get weight 0. */
INLINE AVX2 __m256
batch_weights (__m256 s, int nb, float *m, float *l, float *r_out)
{
  __m256i lane = _mm256_setr_epi32 (0, 1, 2, 3, 4, 5, 6, 7);
  __m256 valid = _mm256_castsi256_ps (_mm256_cmpgt_epi32 (_mm256_set1_epi32 (nb), lane));
  s = _mm256_blendv_ps (_mm256_set1_ps (-INFINITY), s, valid);
  float bm = hmax8 (s);
  *r_out = 1.0f;
  if (bm > *m)
    {
      /* Everything summed so far shrinks by e^(m_old - m_new): exponents stay <= 0. */
      *r_out = expf (*m - bm);
      *l *= *r_out;
      *m = bm;
    }
  __m256 p = _mm256_and_ps (exp256 (_mm256_sub_ps (s, _mm256_set1_ps (*m))), valid);
  *l += hsum8 (p);
  return p;
}

/* nv vectors of 8 per row; nv is a constant where it is inlined. */
INLINE AVX2 void
acc_avx2 (SqState *st, const float *q, int nv, float scale, const float *bk, const float *bv,
          gint64 stride, const gint32 *idx, gsize n)
{
  __m256 qv[16], acc[16];
  for (int j = 0; j < nv; j++)
    {
      qv[j] = _mm256_mul_ps (_mm256_loadu_ps (q + 8 * j), _mm256_set1_ps (scale));
      acc[j] = _mm256_loadu_ps (st->acc + 8 * j);
    }
  float m = st->m, l = st->l;
  for (gsize x = 0; x < n; x += 8)
    {
      int nb = (int) MIN (8, n - x);
      __m256 t[8];
      for (int c = 0; c < 8; c++)
        {
          t[c] = _mm256_setzero_ps ();
          if (c < nb)
            {
              const float *k = bk + (gint64) idx[x + c] * stride;
              for (int j = 0; j < nv; j++)
                t[c] = _mm256_fmadd_ps (qv[j], _mm256_loadu_ps (k + 8 * j), t[c]);
            }
        }
      float r;
      __m256 p = batch_weights (reduce8 (t), nb, &m, &l, &r);
      if (r != 1.0f)
        for (int j = 0; j < nv; j++)
          acc[j] = _mm256_mul_ps (acc[j], _mm256_set1_ps (r));
      float pf[8];
      _mm256_storeu_ps (pf, p);
      for (int c = 0; c < nb; c++)
        {
          const float *v = bv + (gint64) idx[x + c] * stride;
          __m256 w = _mm256_set1_ps (pf[c]);
          for (int j = 0; j < nv; j++)
            acc[j] = _mm256_fmadd_ps (w, _mm256_loadu_ps (v + 8 * j), acc[j]);
        }
    }
  for (int j = 0; j < nv; j++)
    _mm256_storeu_ps (st->acc + 8 * j, acc[j]);
  st->m = m;
  st->l = l;
}

static AVX2 void
acc_avx2_64 (SqState *st, const float *q, gint32 d, float scale, const float *bk, const float *bv,
             gint64 stride, const gint32 *idx, gsize n)
{
  (void) d;
  acc_avx2 (st, q, 8, scale, bk, bv, stride, idx, n);
}

static AVX2 void
acc_avx2_any (SqState *st, const float *q, gint32 d, float scale, const float *bk, const float *bv,
              gint64 stride, const gint32 *idx, gsize n)
{
  acc_avx2 (st, q, d / 8, scale, bk, bv, stride, idx, n);
}

/* AVX-512: rows in 16-float vectors, each score folded to 8 lanes first,
 * then the same reduction tree and weights as AVX2. */
INLINE AVX512 void
acc_avx512 (SqState *st, const float *q, int nv, float scale, const float *bk, const float *bv,
            gint64 stride, const gint32 *idx, gsize n)
{
  __m512 qv[8], acc[8];
  for (int j = 0; j < nv; j++)
    {
      qv[j] = _mm512_mul_ps (_mm512_loadu_ps (q + 16 * j), _mm512_set1_ps (scale));
      acc[j] = _mm512_loadu_ps (st->acc + 16 * j);
    }
  float m = st->m, l = st->l;
  for (gsize x = 0; x < n; x += 8)
    {
      int nb = (int) MIN (8, n - x);
      __m256 t[8];
      for (int c = 0; c < 8; c++)
        {
          t[c] = _mm256_setzero_ps ();
          if (c < nb)
            {
              const float *k = bk + (gint64) idx[x + c] * stride;
              __m512 z = _mm512_mul_ps (qv[0], _mm512_loadu_ps (k));
              for (int j = 1; j < nv; j++)
                z = _mm512_fmadd_ps (qv[j], _mm512_loadu_ps (k + 16 * j), z);
              t[c] = _mm256_add_ps (_mm512_castps512_ps256 (z), _mm512_extractf32x8_ps (z, 1));
            }
        }
      float r;
      __m256 p = batch_weights (reduce8 (t), nb, &m, &l, &r);
      if (r != 1.0f)
        for (int j = 0; j < nv; j++)
          acc[j] = _mm512_mul_ps (acc[j], _mm512_set1_ps (r));
      float pf[8];
      _mm256_storeu_ps (pf, p);
      for (int c = 0; c < nb; c++)
        {
          const float *v = bv + (gint64) idx[x + c] * stride;
          __m512 w = _mm512_set1_ps (pf[c]);
          for (int j = 0; j < nv; j++)
            acc[j] = _mm512_fmadd_ps (w, _mm512_loadu_ps (v + 16 * j), acc[j]);
        }
    }
  for (int j = 0; j < nv; j++)
    _mm512_storeu_ps (st->acc + 16 * j, acc[j]);
  st->m = m;
  st->l = l;
}

static AVX512 void
acc_avx512_64 (SqState *st, const float *q, gint32 d, float scale, const float *bk, const float *bv,
               gint64 stride, const gint32 *idx, gsize n)
{
  (void) d;
  acc_avx512 (st, q, 4, scale, bk, bv, stride, idx, n);
}

static AVX512 void
acc_avx512_any (SqState *st, const float *q, gint32 d, float scale, const float *bk, const float *bv,
                gint64 stride, const gint32 *idx, gsize n)
{
  acc_avx512 (st, q, d / 16, scale, bk, bv, stride, idx, n);
}

/* The core's choice (SIFT_ISA, sift_isa_force) when the core has SIMD
 * kernels of its own; otherwise what this CPU supports, unless SIFT_ISA
 * asks for scalar. */
static SiftIsa
own_isa (void)
{
  const char *env = g_getenv ("SIFT_ISA");
  if (env != NULL && g_str_equal (env, "scalar"))
    return SIFT_ISA_SCALAR;
  __builtin_cpu_init ();
  if (__builtin_cpu_supports ("avx512f") && __builtin_cpu_supports ("avx512vl")
      && __builtin_cpu_supports ("avx512dq") && __builtin_cpu_supports ("avx512bw")
      && (env == NULL || !g_str_equal (env, "avx2")))
    return SIFT_ISA_AVX512;
  if (__builtin_cpu_supports ("avx2") && __builtin_cpu_supports ("fma"))
    return SIFT_ISA_AVX2;
  return SIFT_ISA_SCALAR;
}

static SiftIsa
plugin_isa (void)
{
  static gsize once = 0;
  static SiftIsa own = SIFT_ISA_SCALAR;
  if (sift_isa_detect () > SIFT_ISA_SCALAR)
    return sift_isa_active ();
  if (g_once_init_enter (&once))
    {
      own = own_isa ();
      g_once_init_leave (&once, 1);
    }
  return own;
}

SqAccumulateFunc
sq_simd_accumulate (gint32 head_dim)
{
  SiftIsa isa = plugin_isa ();
  if (isa >= SIFT_ISA_AVX512 && head_dim % 16 == 0 && head_dim <= 128)
    return head_dim == 64 ? acc_avx512_64 : acc_avx512_any;
  if (isa >= SIFT_ISA_AVX2 && head_dim % 8 == 0 && head_dim <= 128)
    return head_dim == 64 ? acc_avx2_64 : acc_avx2_any;
  return NULL;
}

#else

SqAccumulateFunc
sq_simd_accumulate (gint32 head_dim)
{
  (void) head_dim;
  return NULL;
}

#endif
