/* AVX-512 inner loop of the vertical-slash kernel (compiled with
 * -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma; called only when
 * sift_isa_active () >= SIFT_ISA_AVX512 and head_dim is a multiple of 16).
 * Same structure as the AVX2 path: 32 scores of a row are two registers
 * fed by broadcasts of q[c] against the transposed keys (four rows at once,
 * eight FMA chains), and the row's accumulator (128 floats = 8 registers)
 * stays in registers while the values stream past. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include <sift/simd.h>

#include "vs.h"

#define G VS_KEY_GROUP

/* Scores of rows q[0..nr) against lanes [h, h + 16) only: four chains. */
static inline void
rows_scores_half (const float *q, gint32 nr, const float *kt, gint32 d, float (*s)[G], gint32 h)
{
  __m512 a0 = _mm512_setzero_ps (), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  const float *q1 = q + (gsize) MIN (1, nr - 1) * d, *q2 = q + (gsize) MIN (2, nr - 1) * d,
              *q3 = q + (gsize) MIN (3, nr - 1) * d;
  gint32 c = 0;
  /* Two c at a time: eight independent chains. */
  for (; c + 2 <= d; c += 2)
    {
      __m512 k0 = _mm512_loadu_ps (kt + (gsize) c * G + h), k1 = _mm512_loadu_ps (kt + (gsize) (c + 1) * G + h);
      a0 = _mm512_fmadd_ps (_mm512_set1_ps (q[c]), k0, a0);
      a1 = _mm512_fmadd_ps (_mm512_set1_ps (q1[c]), k0, a1);
      a2 = _mm512_fmadd_ps (_mm512_set1_ps (q2[c]), k0, a2);
      a3 = _mm512_fmadd_ps (_mm512_set1_ps (q3[c]), k0, a3);
      b0 = _mm512_fmadd_ps (_mm512_set1_ps (q[c + 1]), k1, b0);
      b1 = _mm512_fmadd_ps (_mm512_set1_ps (q1[c + 1]), k1, b1);
      b2 = _mm512_fmadd_ps (_mm512_set1_ps (q2[c + 1]), k1, b2);
      b3 = _mm512_fmadd_ps (_mm512_set1_ps (q3[c + 1]), k1, b3);
    }
  for (; c < d; c++)
    {
      __m512 k0 = _mm512_loadu_ps (kt + (gsize) c * G + h);
      a0 = _mm512_fmadd_ps (_mm512_set1_ps (q[c]), k0, a0);
      a1 = _mm512_fmadd_ps (_mm512_set1_ps (q1[c]), k0, a1);
      a2 = _mm512_fmadd_ps (_mm512_set1_ps (q2[c]), k0, a2);
      a3 = _mm512_fmadd_ps (_mm512_set1_ps (q3[c]), k0, a3);
    }
  const __m512 out[4] = { _mm512_add_ps (a0, b0), _mm512_add_ps (a1, b1), _mm512_add_ps (a2, b2),
                          _mm512_add_ps (a3, b3) };
  for (gint32 k = 0; k < nr; k++)
    _mm512_storeu_ps (s[k] + h, out[k]);
}

/* Scores of rows q[0..nr) (nr <= 4) against the 32 transposed keys; a
 * half of the lanes no row needs is left unwritten. */
static inline void
rows_scores (const float *q, gint32 nr, const float *kt, gint32 d, guint32 need, float (*s)[G])
{
  if ((need & 0xffff0000u) == 0)
    {
      rows_scores_half (q, nr, kt, d, s, 0);
      return;
    }
  if ((need & 0xffffu) == 0)
    {
      rows_scores_half (q, nr, kt, d, s, 16);
      return;
    }
  __m512 a00 = _mm512_setzero_ps (), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
         a31 = a00;
  const float *q1 = q + (gsize) MIN (1, nr - 1) * d, *q2 = q + (gsize) MIN (2, nr - 1) * d,
              *q3 = q + (gsize) MIN (3, nr - 1) * d;
  for (gint32 c = 0; c < d; c++)
    {
      const float *k = kt + (gsize) c * G;
      __m512 k0 = _mm512_loadu_ps (k), k1 = _mm512_loadu_ps (k + 16);
      __m512 x0 = _mm512_set1_ps (q[c]), x1 = _mm512_set1_ps (q1[c]);
      __m512 x2 = _mm512_set1_ps (q2[c]), x3 = _mm512_set1_ps (q3[c]);
      a00 = _mm512_fmadd_ps (x0, k0, a00);
      a01 = _mm512_fmadd_ps (x0, k1, a01);
      a10 = _mm512_fmadd_ps (x1, k0, a10);
      a11 = _mm512_fmadd_ps (x1, k1, a11);
      a20 = _mm512_fmadd_ps (x2, k0, a20);
      a21 = _mm512_fmadd_ps (x2, k1, a21);
      a30 = _mm512_fmadd_ps (x3, k0, a30);
      a31 = _mm512_fmadd_ps (x3, k1, a31);
    }
  const __m512 out[4][2] = { { a00, a01 }, { a10, a11 }, { a20, a21 }, { a30, a31 } };
  for (gint32 k = 0; k < nr; k++)
    {
      _mm512_storeu_ps (s[k], out[k][0]);
      _mm512_storeu_ps (s[k] + 16, out[k][1]);
    }
}

/* Softmax step of row r without the P.V part: p = e^(s - m_new) in the
 * lanes of vis, 0 elsewhere (all 32 lanes written); returns alpha. */
static inline float
row_softmax (VsTile *t, gint32 r, float *s, guint32 vis)
{
  const __mmask16 in0 = (__mmask16) vis, in1 = (__mmask16) (vis >> 16);
  const __m512 ninf = _mm512_set1_ps (-INFINITY);
  __m512 s0 = in0 ? _mm512_mask_loadu_ps (ninf, in0, s) : ninf;
  __m512 s1 = in1 ? _mm512_mask_loadu_ps (ninf, in1, s + 16) : ninf;
  const float mx = _mm512_reduce_max_ps (_mm512_max_ps (s0, s1));
  /* The running max only grows: alpha <= 1, exponents <= 0; most groups
   * leave it unchanged and need no rescaling at all. */
  const float m_old = t->m[r];
  const float m_new = mx > m_old ? mx : m_old;
  const float alpha = m_new == m_old ? 1.0f : expf (m_old - m_new);
  const __m512 mv = _mm512_set1_ps (m_new);
  __m512 p0 = _mm512_setzero_ps (), p1 = p0;
  if (in0)
    p0 = _mm512_maskz_mov_ps (in0, sift_exp_512 (_mm512_sub_ps (s0, mv)));
  if (in1)
    p1 = _mm512_maskz_mov_ps (in1, sift_exp_512 (_mm512_sub_ps (s1, mv)));
  _mm512_storeu_ps (s, p0);
  _mm512_storeu_ps (s + 16, p1);
  t->l[r] = t->l[r] * alpha + _mm512_reduce_add_ps (_mm512_add_ps (p0, p1));
  t->m[r] = m_new;
  t->attended += __builtin_popcount (vis);
  return alpha;
}

/* Online-softmax update of row r with the scores s of the lanes in vis. */
static inline void
row_update (VsTile *t, gint32 r, float *s, guint32 vis, const float *const *vrow)
{
  const gint32 d = t->d;
  const float alpha = row_softmax (t, r, s, vis);
  float *acc = t->acc + (gsize) r * d;
  const __m512 av = _mm512_set1_ps (alpha);
  for (gint32 c0 = 0; c0 < d; c0 += 16)
    {
      __m512 a0 = _mm512_mul_ps (_mm512_loadu_ps (acc + c0), av);
      for (guint32 m = vis; m; m &= m - 1)
        {
          const gint32 i = __builtin_ctz (m);
          a0 = _mm512_fmadd_ps (_mm512_set1_ps (s[i]), _mm512_loadu_ps (vrow[i] + c0), a0);
        }
      _mm512_storeu_ps (acc + c0, a0);
    }
}

/* acc[r..r+3] = alpha * acc + p . V over `lanes` (p[k][i] for row r + k,
 * value row vrow[i]): four rows share each value load, 16 accumulators per
 * 64 dims. */
static inline void
pv4 (VsTile *t, gint32 r, float *const *p, const float *alpha, guint64 lanes, const float *const *vrow)
{
  const gint32 d = t->d;
  float *acc0 = t->acc + (gsize) r * d, *acc1 = acc0 + d, *acc2 = acc1 + d, *acc3 = acc2 + d;
  const __m512 al0 = _mm512_set1_ps (alpha[0]), al1 = _mm512_set1_ps (alpha[1]);
  const __m512 al2 = _mm512_set1_ps (alpha[2]), al3 = _mm512_set1_ps (alpha[3]);
  gint32 c0 = 0;
  for (; c0 + 64 <= d; c0 += 64)
    {
      __m512 a00 = _mm512_mul_ps (_mm512_loadu_ps (acc0 + c0), al0);
      __m512 a01 = _mm512_mul_ps (_mm512_loadu_ps (acc0 + c0 + 16), al0);
      __m512 a02 = _mm512_mul_ps (_mm512_loadu_ps (acc0 + c0 + 32), al0);
      __m512 a03 = _mm512_mul_ps (_mm512_loadu_ps (acc0 + c0 + 48), al0);
      __m512 a10 = _mm512_mul_ps (_mm512_loadu_ps (acc1 + c0), al1);
      __m512 a11 = _mm512_mul_ps (_mm512_loadu_ps (acc1 + c0 + 16), al1);
      __m512 a12 = _mm512_mul_ps (_mm512_loadu_ps (acc1 + c0 + 32), al1);
      __m512 a13 = _mm512_mul_ps (_mm512_loadu_ps (acc1 + c0 + 48), al1);
      __m512 a20 = _mm512_mul_ps (_mm512_loadu_ps (acc2 + c0), al2);
      __m512 a21 = _mm512_mul_ps (_mm512_loadu_ps (acc2 + c0 + 16), al2);
      __m512 a22 = _mm512_mul_ps (_mm512_loadu_ps (acc2 + c0 + 32), al2);
      __m512 a23 = _mm512_mul_ps (_mm512_loadu_ps (acc2 + c0 + 48), al2);
      __m512 a30 = _mm512_mul_ps (_mm512_loadu_ps (acc3 + c0), al3);
      __m512 a31 = _mm512_mul_ps (_mm512_loadu_ps (acc3 + c0 + 16), al3);
      __m512 a32 = _mm512_mul_ps (_mm512_loadu_ps (acc3 + c0 + 32), al3);
      __m512 a33 = _mm512_mul_ps (_mm512_loadu_ps (acc3 + c0 + 48), al3);
      for (guint64 m = lanes; m; m &= m - 1)
        {
          const gint32 i = __builtin_ctzll (m);
          const float *v = vrow[i] + c0;
          const __m512 v0 = _mm512_loadu_ps (v), v1 = _mm512_loadu_ps (v + 16);
          const __m512 v2 = _mm512_loadu_ps (v + 32), v3 = _mm512_loadu_ps (v + 48);
          __m512 x = _mm512_set1_ps (p[0][i]);
          a00 = _mm512_fmadd_ps (x, v0, a00);
          a01 = _mm512_fmadd_ps (x, v1, a01);
          a02 = _mm512_fmadd_ps (x, v2, a02);
          a03 = _mm512_fmadd_ps (x, v3, a03);
          x = _mm512_set1_ps (p[1][i]);
          a10 = _mm512_fmadd_ps (x, v0, a10);
          a11 = _mm512_fmadd_ps (x, v1, a11);
          a12 = _mm512_fmadd_ps (x, v2, a12);
          a13 = _mm512_fmadd_ps (x, v3, a13);
          x = _mm512_set1_ps (p[2][i]);
          a20 = _mm512_fmadd_ps (x, v0, a20);
          a21 = _mm512_fmadd_ps (x, v1, a21);
          a22 = _mm512_fmadd_ps (x, v2, a22);
          a23 = _mm512_fmadd_ps (x, v3, a23);
          x = _mm512_set1_ps (p[3][i]);
          a30 = _mm512_fmadd_ps (x, v0, a30);
          a31 = _mm512_fmadd_ps (x, v1, a31);
          a32 = _mm512_fmadd_ps (x, v2, a32);
          a33 = _mm512_fmadd_ps (x, v3, a33);
        }
      _mm512_storeu_ps (acc0 + c0, a00);
      _mm512_storeu_ps (acc0 + c0 + 16, a01);
      _mm512_storeu_ps (acc0 + c0 + 32, a02);
      _mm512_storeu_ps (acc0 + c0 + 48, a03);
      _mm512_storeu_ps (acc1 + c0, a10);
      _mm512_storeu_ps (acc1 + c0 + 16, a11);
      _mm512_storeu_ps (acc1 + c0 + 32, a12);
      _mm512_storeu_ps (acc1 + c0 + 48, a13);
      _mm512_storeu_ps (acc2 + c0, a20);
      _mm512_storeu_ps (acc2 + c0 + 16, a21);
      _mm512_storeu_ps (acc2 + c0 + 32, a22);
      _mm512_storeu_ps (acc2 + c0 + 48, a23);
      _mm512_storeu_ps (acc3 + c0, a30);
      _mm512_storeu_ps (acc3 + c0 + 16, a31);
      _mm512_storeu_ps (acc3 + c0 + 32, a32);
      _mm512_storeu_ps (acc3 + c0 + 48, a33);
    }
  for (; c0 < d; c0 += 16)
    {
      __m512 a0 = _mm512_mul_ps (_mm512_loadu_ps (acc0 + c0), al0);
      __m512 a1 = _mm512_mul_ps (_mm512_loadu_ps (acc1 + c0), al1);
      __m512 a2 = _mm512_mul_ps (_mm512_loadu_ps (acc2 + c0), al2);
      __m512 a3 = _mm512_mul_ps (_mm512_loadu_ps (acc3 + c0), al3);
      for (guint64 m = lanes; m; m &= m - 1)
        {
          const gint32 i = __builtin_ctzll (m);
          const __m512 v0 = _mm512_loadu_ps (vrow[i] + c0);
          a0 = _mm512_fmadd_ps (_mm512_set1_ps (p[0][i]), v0, a0);
          a1 = _mm512_fmadd_ps (_mm512_set1_ps (p[1][i]), v0, a1);
          a2 = _mm512_fmadd_ps (_mm512_set1_ps (p[2][i]), v0, a2);
          a3 = _mm512_fmadd_ps (_mm512_set1_ps (p[3][i]), v0, a3);
        }
      _mm512_storeu_ps (acc0 + c0, a0);
      _mm512_storeu_ps (acc1 + c0, a1);
      _mm512_storeu_ps (acc2 + c0, a2);
      _mm512_storeu_ps (acc3 + c0, a3);
    }
}

/* Scores of rows q[0..nr) (nr <= 4) against the lanes of `any` as 4 x 4
 * blocks of dot products along head_dim (d a multiple of 16): each block
 * loads 4 query and 4 key vectors per 16 dims for 16 FMAs, then one
 * transposed reduction; for a few keys this beats a pass over the
 * transposed panel, whose cost is per 16 lanes whatever the lanes used. */
static inline void
rows_scores_few (const float *q, gint32 nr, gint32 d, const VsGroup *g, guint32 any, float (*s)[G])
{
  const float *qr[4];
  for (gint32 k = 0; k < 4; k++)
    qr[k] = q + (gsize) MIN (k, nr - 1) * d;
  gint32 idx[G], n = 0;
  for (guint32 m = any; m; m &= m - 1)
    idx[n++] = __builtin_ctz (m);
  for (gint32 j0 = 0; j0 < n; j0 += 4)
    {
      const float *kr[4];
      for (gint32 j = 0; j < 4; j++)
        kr[j] = g->krow[idx[MIN (j0 + j, n - 1)]];
      __m512 acc[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++)
        acc[i] = _mm512_setzero_ps ();
      for (gint32 c = 0; c < d; c += 16)
        {
          const __m512 k0 = _mm512_loadu_ps (kr[0] + c), k1 = _mm512_loadu_ps (kr[1] + c);
          const __m512 k2 = _mm512_loadu_ps (kr[2] + c), k3 = _mm512_loadu_ps (kr[3] + c);
#pragma GCC unroll 4
          for (int r = 0; r < 4; r++)
            {
              const __m512 x = _mm512_loadu_ps (qr[r] + c);
              acc[4 * r] = _mm512_fmadd_ps (x, k0, acc[4 * r]);
              acc[4 * r + 1] = _mm512_fmadd_ps (x, k1, acc[4 * r + 1]);
              acc[4 * r + 2] = _mm512_fmadd_ps (x, k2, acc[4 * r + 2]);
              acc[4 * r + 3] = _mm512_fmadd_ps (x, k3, acc[4 * r + 3]);
            }
        }
      float out[16];
      _mm512_storeu_ps (out, sift_hsum16x16_512 (acc));
      for (gint32 r = 0; r < nr; r++)
        for (gint32 j = 0; j < 4 && j0 + j < n; j++)
          s[r][idx[j0 + j]] = out[4 * r + j];
    }
}

/* Few lanes: dot-product blocks, else the transposed panel (see above).
 * One block, i.e. a lone diagonal of a 4-row tile: at 32K on the synthetic
 * model, thresholds from 0 to 20 lanes timed the same within the noise of
 * the shared machine (the blocks read K rows, the panel pass the transposed
 * copy already in cache), and 32 was ~10% slower. */
#define FEW_LANES_HALF 4  /* lanes inside one half of the panel */
#define FEW_LANES 4       /* lanes in both halves */

static inline void
rows_scores_any (const float *q, gint32 nr, gint32 d, const VsGroup *g, guint32 any, float (*s)[G])
{
  const gint32 n = __builtin_popcount (any);
  const gboolean one_half = (any & 0xffff0000u) == 0 || (any & 0xffffu) == 0;
  if (n <= (one_half ? FEW_LANES_HALF : FEW_LANES))
    rows_scores_few (q, nr, d, g, any, s);
  else
    rows_scores (q, nr, g->kt, d, any, s);
}

void
vs_group_attend_avx512 (VsTile *t, const VsGroup *g)
{
  const gint32 d = t->d;
  float s[4][G];
  float alpha[4];
  guint32 vis[4];
  for (gint32 r = 0; r < t->n_rows; r += 4)
    {
      const gint32 nr = MIN (4, t->n_rows - r);
      guint32 any = 0;
      for (gint32 k = 0; k < 4; k++)
        any |= vis[k] = k < nr ? vs_visible_lanes (g, t->pos0 + r + k) : 0;
      if (any == 0)
        continue;
      rows_scores_any (t->q + (gsize) r * d, nr, d, g, any, s);
      if (nr < 4)
        {
          for (gint32 k = 0; k < nr; k++)
            if (vis[k])
              row_update (t, r + k, s[k], vis[k], g->vrow);
          continue;
        }
      for (gint32 k = 0; k < 4; k++)
        if (vis[k])
          alpha[k] = row_softmax (t, r + k, s[k], vis[k]);
        else
          {
            alpha[k] = 1.0f; /* the row sees none of these keys: unchanged */
            memset (s[k], 0, sizeof s[k]);
          }
      float *const p[4] = { s[0], s[1], s[2], s[3] };
      pv4 (t, r, p, alpha, any, g->vrow);
    }
}

/* Scores of rows q[0..nr) (4 < nr <= 8: two adjacent tiles of one head,
 * rows consecutive in q) against the halves of the transposed panel that
 * `need` touches: one load of each key vector serves eight rows. Rows past
 * nr repeat the last one and are not stored. */
static inline void
rows_scores8 (const float *q, gint32 nr, const float *kt, gint32 d, guint32 need, float (*s)[G])
{
  const float *qr[8];
  for (gint32 k = 0; k < 8; k++)
    qr[k] = q + (gsize) MIN (k, nr - 1) * d;
  if ((need & 0xffffu) == 0 || (need & 0xffff0000u) == 0)
    {
      const gint32 h = (need & 0xffffu) == 0 ? 16 : 0;
      __m512 a[8];
#pragma GCC unroll 8
      for (int k = 0; k < 8; k++)
        a[k] = _mm512_setzero_ps ();
      for (gint32 c = 0; c < d; c++)
        {
          const __m512 k0 = _mm512_loadu_ps (kt + (gsize) c * G + h);
#pragma GCC unroll 8
          for (int k = 0; k < 8; k++)
            a[k] = _mm512_fmadd_ps (_mm512_set1_ps (qr[k][c]), k0, a[k]);
        }
      for (gint32 k = 0; k < nr; k++)
        _mm512_storeu_ps (s[k] + h, a[k]);
      return;
    }
  __m512 a[8][2];
#pragma GCC unroll 8
  for (int k = 0; k < 8; k++)
    a[k][0] = a[k][1] = _mm512_setzero_ps ();
  for (gint32 c = 0; c < d; c++)
    {
      const __m512 k0 = _mm512_loadu_ps (kt + (gsize) c * G), k1 = _mm512_loadu_ps (kt + (gsize) c * G + 16);
#pragma GCC unroll 8
      for (int k = 0; k < 8; k++)
        {
          const __m512 x = _mm512_set1_ps (qr[k][c]);
          a[k][0] = _mm512_fmadd_ps (x, k0, a[k][0]);
          a[k][1] = _mm512_fmadd_ps (x, k1, a[k][1]);
        }
    }
  for (gint32 k = 0; k < nr; k++)
    {
      _mm512_storeu_ps (s[k], a[k][0]);
      _mm512_storeu_ps (s[k] + 16, a[k][1]);
    }
}

/* Visible lanes of each row of t under `mask`, counted as attended; the
 * buffer is flushed first when they would overflow it. Returns their union. */
static inline guint32
pending_prepare (VsTile *t, VsPending *pd, const VsGroup *g, guint32 mask, guint32 vis[4])
{
  guint32 any = 0;
  for (gint32 k = 0; k < 4; k++)
    vis[k] = 0;
  for (gint32 k = 0; k < t->n_rows; k++)
    {
      vis[k] = mask & vs_lanes_upto (g, t->pos0 + k);
      any |= vis[k];
      t->attended += __builtin_popcount (vis[k]);
    }
  if (any != 0 && pd->n + __builtin_popcount (any) > VS_PENDING_KEYS)
    vs_pending_flush_avx512 (t, pd);
  return any;
}

/* Packs the lanes of `any` (scores s) to the buffer's end, -inf where the
 * row does not see the key (its probability is then exactly 0). */
static inline void
pending_pack (const VsTile *t, VsPending *pd, const VsGroup *g, guint32 any, const guint32 vis[4],
              float (*s)[G])
{
  const __mmask16 a0 = (__mmask16) any, a1 = (__mmask16) (any >> 16);
  const gint32 n0 = __builtin_popcount (a0);
  const __m512 ninf = _mm512_set1_ps (-INFINITY);
  for (gint32 k = 0; k < t->n_rows; k++)
    {
      float *dst = pd->s[k] + pd->n;
      if (a0)
        _mm512_storeu_ps (dst, _mm512_maskz_compress_ps (a0, _mm512_mask_loadu_ps (ninf, (__mmask16) vis[k], s[k])));
      if (a1)
        _mm512_storeu_ps (dst + n0, _mm512_maskz_compress_ps (
                                        a1, _mm512_mask_loadu_ps (ninf, (__mmask16) (vis[k] >> 16), s[k] + 16)));
    }
  for (guint32 m = any; m; m &= m - 1)
    pd->vrow[pd->n++] = g->vrow[__builtin_ctz (m)];
}

/* TRUE when lanes `any` are scored by dot-product blocks (see rows_scores_any). */
static inline gboolean
few_lanes (guint32 any)
{
  const gboolean one_half = (any & 0xffff0000u) == 0 || (any & 0xffffu) == 0;
  return __builtin_popcount (any) <= (one_half ? FEW_LANES_HALF : FEW_LANES);
}

void
vs_pending_add_avx512 (VsTile *t, VsPending *pd, const VsGroup *g)
{
  guint32 vis[4];
  const guint32 any = pending_prepare (t, pd, g, g->mask, vis);
  if (any == 0)
    return;
  float s[4][G];
  rows_scores_any (t->q, t->n_rows, t->d, g, any, s);
  pending_pack (t, pd, g, any, vis, s);
}

void
vs_pending_add2_avx512 (VsTile *t0, VsPending *pd0, guint32 mask0, VsTile *t1, VsPending *pd1,
                        guint32 mask1, const VsGroup *g)
{
  guint32 vis0[4], vis1[4];
  const guint32 any0 = pending_prepare (t0, pd0, g, mask0, vis0);
  const guint32 any1 = pending_prepare (t1, pd1, g, mask1, vis1);
  float s[8][G];
  if (any0 != 0 && any1 != 0 && !few_lanes (any0) && !few_lanes (any1) && t0->n_rows == 4)
    {
      /* Both tiles take the panel pass: one pass of eight rows. */
      rows_scores8 (t0->q, 4 + t1->n_rows, g->kt, t0->d, any0 | any1, s);
      pending_pack (t0, pd0, g, any0, vis0, s);
      pending_pack (t1, pd1, g, any1, vis1, s + 4);
      return;
    }
  if (any0 != 0)
    {
      rows_scores_any (t0->q, t0->n_rows, t0->d, g, any0, s);
      pending_pack (t0, pd0, g, any0, vis0, s);
    }
  if (any1 != 0)
    {
      rows_scores_any (t1->q, t1->n_rows, t1->d, g, any1, s);
      pending_pack (t1, pd1, g, any1, vis1, s);
    }
}

/* Softmax step of row r over the n buffered scores s (-inf: not seen):
 * p = e^(s - m_new) written over s (zero past n up to a whole vector);
 * returns alpha. A row that sees none of them is left unchanged. */
static inline float
buffer_softmax (VsTile *t, gint32 r, float *s, gint32 n)
{
  const __m512 ninf = _mm512_set1_ps (-INFINITY);
  __m512 v[VS_PENDING_KEYS / 16];
  __m512 mx = ninf;
  const gint32 nv = (n + 15) / 16;
  for (gint32 i = 0; i < nv; i++)
    {
      const gint32 left = n - 16 * i;
      const __mmask16 in = left >= 16 ? (__mmask16) 0xffff : (__mmask16) ((1u << left) - 1);
      v[i] = _mm512_mask_loadu_ps (ninf, in, s + 16 * i);
      mx = _mm512_max_ps (mx, v[i]);
    }
  const float m_old = t->m[r], mxs = _mm512_reduce_max_ps (mx);
  if (mxs == -INFINITY)
    {
      for (gint32 i = 0; i < nv; i++)
        _mm512_storeu_ps (s + 16 * i, _mm512_setzero_ps ());
      return 1.0f;
    }
  const float m_new = mxs > m_old ? mxs : m_old;
  const float alpha = m_new == m_old ? 1.0f : expf (m_old - m_new);
  const __m512 mv = _mm512_set1_ps (m_new);
  __m512 sum = _mm512_setzero_ps ();
  for (gint32 i = 0; i < nv; i++)
    {
      /* -inf - m_new is -inf: sift_exp_512 flushes it to 0. */
      const __m512 p = sift_exp_512 (_mm512_sub_ps (v[i], mv));
      _mm512_storeu_ps (s + 16 * i, p);
      sum = _mm512_add_ps (sum, p);
    }
  t->l[r] = t->l[r] * alpha + _mm512_reduce_add_ps (sum);
  t->m[r] = m_new;
  return alpha;
}

void
vs_pending_flush_avx512 (VsTile *t, VsPending *pd)
{
  const gint32 n = pd->n;
  if (n == 0)
    return;
  float alpha[4] = { 1.0f, 1.0f, 1.0f, 1.0f };
  for (gint32 k = 0; k < t->n_rows; k++)
    alpha[k] = buffer_softmax (t, k, pd->s[k], n);
  const guint64 lanes = n == 64 ? ~(guint64) 0 : ((guint64) 1 << n) - 1;
  if (t->n_rows == 4)
    {
      float *const p[4] = { pd->s[0], pd->s[1], pd->s[2], pd->s[3] };
      pv4 (t, 0, p, alpha, lanes, pd->vrow);
    }
  else
    for (gint32 k = 0; k < t->n_rows; k++)
      {
        float *acc = t->acc + (gsize) k * t->d;
        const __m512 av = _mm512_set1_ps (alpha[k]);
        for (gint32 c0 = 0; c0 < t->d; c0 += 16)
          {
            __m512 a0 = _mm512_mul_ps (_mm512_loadu_ps (acc + c0), av);
            for (gint32 i = 0; i < n; i++)
              a0 = _mm512_fmadd_ps (_mm512_set1_ps (pd->s[k][i]), _mm512_loadu_ps (pd->vrow[i] + c0), a0);
            _mm512_storeu_ps (acc + c0, a0);
          }
      }
  pd->n = 0;
}
