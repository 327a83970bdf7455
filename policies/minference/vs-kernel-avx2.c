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

/* Scores of nr rows q[k] (1 or 2, a constant where inlined) against the
 * transposed keys: s[k][0..G) = q[k] . kt[:, 0..G). Two rows give eight
 * independent FMA chains, which hide the FMA latency. */
static inline __attribute__ ((always_inline)) void
rows_scores (const float *const *q, int nr, const float *kt, gint32 d, float *const *s)
{
  __m256 a[2][G / 8];
#pragma GCC unroll 2
  for (int k = 0; k < nr; k++)
#pragma GCC unroll 4
    for (int j = 0; j < G / 8; j++)
      a[k][j] = _mm256_setzero_ps ();
  for (gint32 c = 0; c < d; c++)
    {
      __m256 kv[G / 8];
#pragma GCC unroll 4
      for (int j = 0; j < G / 8; j++)
        kv[j] = _mm256_loadu_ps (kt + (gsize) c * G + 8 * j);
#pragma GCC unroll 2
      for (int k = 0; k < nr; k++)
        {
          const __m256 x = _mm256_broadcast_ss (q[k] + c);
#pragma GCC unroll 4
          for (int j = 0; j < G / 8; j++)
            a[k][j] = _mm256_fmadd_ps (x, kv[j], a[k][j]);
        }
    }
#pragma GCC unroll 2
  for (int k = 0; k < nr; k++)
#pragma GCC unroll 4
    for (int j = 0; j < G / 8; j++)
      _mm256_storeu_ps (s[k] + 8 * j, a[k][j]);
}

void
vs_scores_avx2 (const float *q, gint32 n_rows, gint32 d, const float *const *krow, gint32 n_keys, float *s)
{
  float kt[(gsize) d * G];
  vs_transpose (krow, n_keys, d, kt);
  for (gint32 r = 0; r < n_rows; r++)
    rows_scores ((const float *const[]) { q + (gsize) r * d }, 1, kt, d, (float *const[]) { s + (gsize) r * G });
}

/* Lanes set in `bits` as a vector mask, lanes i0 .. i0 + 7. */
static inline __m256
lane_mask (guint32 bits, gint32 i0)
{
  const __m256i sel = _mm256_setr_epi32 (1, 2, 4, 8, 16, 32, 64, 128);
  __m256i b = _mm256_and_si256 (_mm256_set1_epi32 ((int) (bits >> i0)), sel);
  return _mm256_castsi256_ps (_mm256_cmpeq_epi32 (b, sel));
}

/* acc[0..8 na) = av acc + sum over the lanes i of vis of s[i] vrow[i][c0 ..]
 * (na a constant where inlined). */
static inline __attribute__ ((always_inline)) void
pv_block (float *acc, __m256 av, const float *s, guint32 vis, const float *const *vrow, gint32 c0, int na)
{
  __m256 a[8];
#pragma GCC unroll 8
  for (int j = 0; j < na; j++)
    a[j] = _mm256_mul_ps (_mm256_loadu_ps (acc + 8 * j), av);
  for (guint32 m = vis; m; m &= m - 1)
    {
      const gint32 i = __builtin_ctz (m);
      const __m256 pk = _mm256_broadcast_ss (s + i);
      const float *v = vrow[i] + c0;
#pragma GCC unroll 8
      for (int j = 0; j < na; j++)
        a[j] = _mm256_fmadd_ps (pk, _mm256_loadu_ps (v + 8 * j), a[j]);
    }
#pragma GCC unroll 8
  for (int j = 0; j < na; j++)
    _mm256_storeu_ps (acc + 8 * j, a[j]);
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
  /* acc = alpha acc + p . V, 8 vectors of d at a time while 64 floats
   * remain: the accumulators stay in registers while the values stream. */
  float *acc = t->acc + (gsize) r * d;
  const __m256 av = _mm256_set1_ps (alpha);
  gint32 c0 = 0;
  for (; c0 + 64 <= d; c0 += 64)
    pv_block (acc + c0, av, s, vis, vrow, c0, 8);
  for (; c0 < d; c0 += 8)
    pv_block (acc + c0, av, s, vis, vrow, c0, 1);
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
      const float *const q[2] = { t->q + (gsize) r * d, t->q + (gsize) (r + 1) * d };
      if (nr == 2)
        rows_scores (q, 2, g->kt, d, (float *const[]) { s[0], s[1] });
      else
        rows_scores (q, 1, g->kt, d, (float *const[]) { s[0] });
      for (gint32 k = 0; k < nr; k++)
        if (vis[k])
          row_update (t, r + k, s[k], vis[k], g->vrow);
    }
}
