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

#include <sift/simd.h>

#include "vs.h"

#define G VS_KEY_GROUP

/* s[0..G) = q . kt[:, 0..G) for one row. */
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

/* Two rows at once: eight independent FMA chains hide the FMA latency. */
static inline void
row2_scores (const float *q0, const float *q1, const float *kt, gint32 d, float *s0, float *s1)
{
  __m256 a0 = _mm256_setzero_ps (), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  for (gint32 c = 0; c < d; c++)
    {
      const float *k = kt + (gsize) c * G;
      __m256 k0 = _mm256_loadu_ps (k), k1 = _mm256_loadu_ps (k + 8);
      __m256 k2 = _mm256_loadu_ps (k + 16), k3 = _mm256_loadu_ps (k + 24);
      __m256 x = _mm256_broadcast_ss (q0 + c), y = _mm256_broadcast_ss (q1 + c);
      a0 = _mm256_fmadd_ps (x, k0, a0);
      a1 = _mm256_fmadd_ps (x, k1, a1);
      a2 = _mm256_fmadd_ps (x, k2, a2);
      a3 = _mm256_fmadd_ps (x, k3, a3);
      b0 = _mm256_fmadd_ps (y, k0, b0);
      b1 = _mm256_fmadd_ps (y, k1, b1);
      b2 = _mm256_fmadd_ps (y, k2, b2);
      b3 = _mm256_fmadd_ps (y, k3, b3);
    }
  _mm256_storeu_ps (s0, a0);
  _mm256_storeu_ps (s0 + 8, a1);
  _mm256_storeu_ps (s0 + 16, a2);
  _mm256_storeu_ps (s0 + 24, a3);
  _mm256_storeu_ps (s1, b0);
  _mm256_storeu_ps (s1 + 8, b1);
  _mm256_storeu_ps (s1 + 16, b2);
  _mm256_storeu_ps (s1 + 24, b3);
}

void
vs_scores_avx2 (const float *q, gint32 n_rows, gint32 d, const float *const *krow, gint32 n_keys, float *s)
{
  float kt[(gsize) d * G];
  vs_transpose (krow, n_keys, d, kt);
  for (gint32 r = 0; r < n_rows; r++)
    row_scores (q + (gsize) r * d, kt, d, s + (gsize) r * G);
}

/* Lanes set in `bits` as a vector mask, lanes i0 .. i0 + 7. */
static inline __m256
lane_mask (guint32 bits, gint32 i0)
{
  const __m256i sel = _mm256_setr_epi32 (1, 2, 4, 8, 16, 32, 64, 128);
  __m256i b = _mm256_and_si256 (_mm256_set1_epi32 ((int) (bits >> i0)), sel);
  return _mm256_castsi256_ps (_mm256_cmpeq_epi32 (b, sel));
}

/* Online-softmax update of row r with the scores s of the lanes in vis. */
static inline void
row_update (VsTile *t, gint32 r, float *s, guint32 vis, const float *const *vrow)
{
  const gint32 d = t->d;
  float mx = -INFINITY;
  for (guint32 m = vis; m; m &= m - 1)
    mx = MAX (mx, s[__builtin_ctz (m)]);
  /* The running max only grows, so alpha <= 1 rescales the earlier sum and
   * accumulator, and every exponent stays <= 0. */
  const float m_new = MAX (t->m[r], mx);
  const float alpha = expf (t->m[r] - m_new);
  const __m256 mv = _mm256_set1_ps (m_new);
  __m256 lsum = _mm256_setzero_ps ();
  for (gint32 i = 0; i < G; i += 8)
    {
      __m256 x = _mm256_min_ps (_mm256_sub_ps (_mm256_loadu_ps (s + i), mv), _mm256_setzero_ps ());
      __m256 p = _mm256_and_ps (sift_exp_256 (x), lane_mask (vis, i));
      _mm256_storeu_ps (s + i, p);
      lsum = _mm256_add_ps (lsum, p);
    }
  t->l[r] = t->l[r] * alpha + sift_hsum_256 (lsum);
  t->m[r] = m_new;
  t->attended += __builtin_popcount (vis);
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
      for (guint32 m = vis; m; m &= m - 1)
        {
          const gint32 i = __builtin_ctz (m);
          const __m256 pk = _mm256_broadcast_ss (s + i);
          const float *v = vrow[i] + c0;
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
      for (guint32 m = vis; m; m &= m - 1)
        {
          const gint32 i = __builtin_ctz (m);
          a0 = _mm256_fmadd_ps (_mm256_broadcast_ss (s + i), _mm256_loadu_ps (vrow[i] + c0), a0);
        }
      _mm256_storeu_ps (acc + c0, a0);
    }
}

void
vs_group_attend_avx2 (VsTile *t, const VsGroup *g)
{
  const gint32 d = t->d;
  float s[2][G];
  for (gint32 r = 0; r < t->n_rows; r += 2)
    {
      const gint32 nr = MIN (2, t->n_rows - r);
      guint32 vis[2] = { vs_visible_lanes (g, t->pos0 + r), 0 };
      if (nr == 2)
        vis[1] = vs_visible_lanes (g, t->pos0 + r + 1);
      if ((vis[0] | vis[1]) == 0)
        continue;
      if (nr == 2)
        row2_scores (t->q + (gsize) r * d, t->q + (gsize) (r + 1) * d, g->kt, d, s[0], s[1]);
      else
        row_scores (t->q + (gsize) r * d, g->kt, d, s[0]);
      for (gint32 k = 0; k < nr; k++)
        if (vis[k])
          row_update (t, r + k, s[k], vis[k], g->vrow);
    }
}
