/* AVX2 + FMA inner loops of the vertical-slash kernel (compiled with
 * -mavx2 -mfma; called only when sift_isa_active () >= SIFT_ISA_AVX2 and
 * head_dim is a multiple of 8).
 *
 * Scores: the key group is transposed to [d][VS_KEY_GROUP] once and reused
 * by every row of the tile, so a row's 32 scores are 4 accumulators fed by
 * broadcasts of q[c], with no horizontal sums. P.V: the row's accumulator
 * stays in 8 registers (64 floats) while the keys stream past. */
#include <immintrin.h>
#include <math.h>

#include "vs.h"

#define G VS_KEY_GROUP

/* e^x for x <= 0 (and -inf -> 0): Cody-Waite reduction to r in
 * [-ln2/2, ln2/2], a degree-6 polynomial, 2^n through the exponent bits;
 * relative error ~2e-7, like expf. */
static inline __m256
exp256 (__m256 x)
{
  const __m256 lo = _mm256_set1_ps (-87.3f);
  __m256 under = _mm256_cmp_ps (x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps (x, lo);
  __m256 n = _mm256_round_ps (_mm256_mul_ps (x, _mm256_set1_ps (1.44269504f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps (n, _mm256_set1_ps (0.693145751953125f), x);
  r = _mm256_fnmadd_ps (n, _mm256_set1_ps (1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps (1.0f / 720.0f);
  p = _mm256_fmadd_ps (p, r, _mm256_set1_ps (1.0f / 120.0f));
  p = _mm256_fmadd_ps (p, r, _mm256_set1_ps (1.0f / 24.0f));
  p = _mm256_fmadd_ps (p, r, _mm256_set1_ps (1.0f / 6.0f));
  p = _mm256_fmadd_ps (p, r, _mm256_set1_ps (0.5f));
  p = _mm256_fmadd_ps (p, r, _mm256_set1_ps (1.0f));
  p = _mm256_fmadd_ps (p, r, _mm256_set1_ps (1.0f));
  __m256i e = _mm256_slli_epi32 (_mm256_add_epi32 (_mm256_cvtps_epi32 (n), _mm256_set1_epi32 (127)), 23);
  __m256 y = _mm256_mul_ps (p, _mm256_castsi256_ps (e));
  return _mm256_andnot_ps (under, y);
}

static inline float
hsum (__m256 v)
{
  __m128 s = _mm_add_ps (_mm256_castps256_ps128 (v), _mm256_extractf128_ps (v, 1));
  s = _mm_add_ps (s, _mm_movehl_ps (s, s));
  s = _mm_add_ss (s, _mm_movehdup_ps (s));
  return _mm_cvtss_f32 (s);
}

/* kt[c * G + kk] = krow[kk][c]; keys past n_keys are zero. */
static void
transpose (const float *const *krow, gint32 n_keys, gint32 d, float *kt)
{
  for (gint32 kk = 0; kk < G; kk++)
    if (kk < n_keys)
      for (gint32 c = 0; c < d; c++)
        kt[(gsize) c * G + kk] = krow[kk][c];
    else
      for (gint32 c = 0; c < d; c++)
        kt[(gsize) c * G + kk] = 0.0f;
}

/* s[0..G) = q . kt[:, 0..G) */
static inline void
row_scores (const float *q, const float *kt, gint32 d, float *s)
{
  __m256 s0 = _mm256_setzero_ps (), s1 = s0, s2 = s0, s3 = s0;
  for (gint32 c = 0; c < d; c++)
    {
      __m256 qc = _mm256_broadcast_ss (q + c);
      const float *k = kt + (gsize) c * G;
      s0 = _mm256_fmadd_ps (qc, _mm256_loadu_ps (k), s0);
      s1 = _mm256_fmadd_ps (qc, _mm256_loadu_ps (k + 8), s1);
      s2 = _mm256_fmadd_ps (qc, _mm256_loadu_ps (k + 16), s2);
      s3 = _mm256_fmadd_ps (qc, _mm256_loadu_ps (k + 24), s3);
    }
  _mm256_storeu_ps (s, s0);
  _mm256_storeu_ps (s + 8, s1);
  _mm256_storeu_ps (s + 16, s2);
  _mm256_storeu_ps (s + 24, s3);
}

void
vs_scores_avx2 (const float *q, gint32 n_rows, gint32 d, const float *const *krow, gint32 n_keys, float *s)
{
  float kt[(gsize) d * G];
  transpose (krow, n_keys, d, kt);
  for (gint32 r = 0; r < n_rows; r++)
    row_scores (q + (gsize) r * d, kt, d, s + (gsize) r * G);
}

void
vs_tile_attend_avx2 (VsTile *t, const float *const *krow, const float *const *vrow,
                     const gint64 *key_pos, gint32 n_keys)
{
  const gint32 d = t->d;
  float kt[(gsize) d * G];
  float s[G];
  transpose (krow, n_keys, d, kt);
  const __m256 iota0 = _mm256_setr_ps (0, 1, 2, 3, 4, 5, 6, 7);
  gint32 vis = 0;
  for (gint32 r = 0; r < t->n_rows; r++)
    {
      const gint64 pos = t->pos0 + r;
      while (vis < n_keys && key_pos[vis] <= pos)
        vis++; /* keys ascend: row r sees a prefix */
      if (vis == 0)
        continue;
      t->attended += vis;
      row_scores (t->q + (gsize) r * d, kt, d, s);
      float mx = s[0];
      for (gint32 kk = 1; kk < vis; kk++)
        mx = MAX (mx, s[kk]);
      /* Online softmax: the running max only grows, so alpha <= 1 rescales
       * the earlier sum and accumulator and every exponent stays <= 0. */
      const float m_new = MAX (t->m[r], mx);
      const float alpha = expf (t->m[r] - m_new);
      const __m256 mv = _mm256_set1_ps (m_new), visv = _mm256_set1_ps ((float) vis);
      __m256 lsum = _mm256_setzero_ps ();
      for (gint32 kk = 0; kk < G; kk += 8)
        {
          __m256 inside = _mm256_cmp_ps (_mm256_add_ps (iota0, _mm256_set1_ps ((float) kk)), visv, _CMP_LT_OQ);
          __m256 p = _mm256_and_ps (exp256 (_mm256_sub_ps (_mm256_loadu_ps (s + kk), mv)), inside);
          _mm256_storeu_ps (s + kk, p);
          lsum = _mm256_add_ps (lsum, p);
        }
      t->l[r] = t->l[r] * alpha + hsum (lsum);
      t->m[r] = m_new;
      float *acc = t->acc + (gsize) r * d;
      const __m256 av = _mm256_set1_ps (alpha);
      gint32 c0 = 0;
      for (; c0 + 64 <= d; c0 += 64)
        {
          __m256 a0 = _mm256_mul_ps (_mm256_loadu_ps (acc + c0), av);
          __m256 a1 = _mm256_mul_ps (_mm256_loadu_ps (acc + c0 + 8), av);
          __m256 a2 = _mm256_mul_ps (_mm256_loadu_ps (acc + c0 + 16), av);
          __m256 a3 = _mm256_mul_ps (_mm256_loadu_ps (acc + c0 + 24), av);
          __m256 a4 = _mm256_mul_ps (_mm256_loadu_ps (acc + c0 + 32), av);
          __m256 a5 = _mm256_mul_ps (_mm256_loadu_ps (acc + c0 + 40), av);
          __m256 a6 = _mm256_mul_ps (_mm256_loadu_ps (acc + c0 + 48), av);
          __m256 a7 = _mm256_mul_ps (_mm256_loadu_ps (acc + c0 + 56), av);
          for (gint32 kk = 0; kk < vis; kk++)
            {
              const __m256 pk = _mm256_broadcast_ss (s + kk);
              const float *v = vrow[kk] + c0;
              a0 = _mm256_fmadd_ps (pk, _mm256_loadu_ps (v), a0);
              a1 = _mm256_fmadd_ps (pk, _mm256_loadu_ps (v + 8), a1);
              a2 = _mm256_fmadd_ps (pk, _mm256_loadu_ps (v + 16), a2);
              a3 = _mm256_fmadd_ps (pk, _mm256_loadu_ps (v + 24), a3);
              a4 = _mm256_fmadd_ps (pk, _mm256_loadu_ps (v + 32), a4);
              a5 = _mm256_fmadd_ps (pk, _mm256_loadu_ps (v + 40), a5);
              a6 = _mm256_fmadd_ps (pk, _mm256_loadu_ps (v + 48), a6);
              a7 = _mm256_fmadd_ps (pk, _mm256_loadu_ps (v + 56), a7);
            }
          _mm256_storeu_ps (acc + c0, a0);
          _mm256_storeu_ps (acc + c0 + 8, a1);
          _mm256_storeu_ps (acc + c0 + 16, a2);
          _mm256_storeu_ps (acc + c0 + 24, a3);
          _mm256_storeu_ps (acc + c0 + 32, a4);
          _mm256_storeu_ps (acc + c0 + 40, a5);
          _mm256_storeu_ps (acc + c0 + 48, a6);
          _mm256_storeu_ps (acc + c0 + 56, a7);
        }
      for (; c0 < d; c0 += 8)
        {
          __m256 a0 = _mm256_mul_ps (_mm256_loadu_ps (acc + c0), av);
          for (gint32 kk = 0; kk < vis; kk++)
            a0 = _mm256_fmadd_ps (_mm256_broadcast_ss (s + kk), _mm256_loadu_ps (vrow[kk] + c0), a0);
          _mm256_storeu_ps (acc + c0, a0);
        }
    }
}
