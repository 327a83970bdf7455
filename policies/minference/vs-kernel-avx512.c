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

/* The four query rows of a tile (past nr the last one again). */
static inline void
tile_rows (const float *q, gint32 nr, gint32 d, const float *qr[4])
{
  for (gint32 k = 0; k < 4; k++)
    qr[k] = q + (gsize) MIN (k, nr - 1) * d;
}

/* Scores of nq query rows qr[k] (4 or 8, a constant where inlined) against
 * all 32 transposed keys, the first nr stored: one load of each key vector
 * serves every row. */
static inline __attribute__ ((always_inline)) void
panel_scores (const float *const *qr, int nq, gint32 nr, const float *kt, gint32 d, float (*s)[G])
{
  __m512 a[8][2];
#pragma GCC unroll 8
  for (int k = 0; k < nq; k++)
    a[k][0] = a[k][1] = _mm512_setzero_ps ();
  for (gint32 c = 0; c < d; c++)
    {
      const float *kc = kt + (gsize) c * G;
      const __m512 k0 = _mm512_loadu_ps (kc), k1 = _mm512_loadu_ps (kc + 16);
#pragma GCC unroll 8
      for (int k = 0; k < nq; k++)
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

/* Scores of rows q[0..nr) against lanes [h, h + 16) only: four chains. */
static inline void
rows_scores_half (const float *q, gint32 nr, const float *kt, gint32 d, float (*s)[G], gint32 h)
{
  const float *qr[4];
  tile_rows (q, nr, d, qr);
  __m512 a[2][4]; /* [c parity][row] */
#pragma GCC unroll 2
  for (int u = 0; u < 2; u++)
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
      a[u][k] = _mm512_setzero_ps ();
  gint32 c = 0;
  /* Two c at a time: eight independent chains. */
  for (; c + 2 <= d; c += 2)
#pragma GCC unroll 2
    for (int u = 0; u < 2; u++)
      {
        const __m512 kc = _mm512_loadu_ps (kt + (gsize) (c + u) * G + h);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
          a[u][k] = _mm512_fmadd_ps (_mm512_set1_ps (qr[k][c + u]), kc, a[u][k]);
      }
  for (; c < d; c++)
    {
      const __m512 kc = _mm512_loadu_ps (kt + (gsize) c * G + h);
#pragma GCC unroll 4
      for (int k = 0; k < 4; k++)
        a[0][k] = _mm512_fmadd_ps (_mm512_set1_ps (qr[k][c]), kc, a[0][k]);
    }
  for (gint32 k = 0; k < nr; k++)
    _mm512_storeu_ps (s[k] + h, _mm512_add_ps (a[0][k], a[1][k]));
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
  const float *qr[4];
  tile_rows (q, nr, d, qr);
  panel_scores (qr, 4, nr, kt, d, s);
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

/* acc[k] = alpha[k] acc[k] + p[k] . V over `lanes` for NR rows (1 or 4, a
 * constant where inlined), row k's accumulator at acc + k d, its weights
 * p[k][i] for value row vrow[i]: the rows share each value load, NR x NA
 * accumulators per 16 NA dims (NA 4 while 64 floats remain, then 1). */
static inline __attribute__ ((always_inline)) void
pv_rows (float *acc, gint32 d, int nr, const float *const *p, const float *alpha, guint64 lanes,
         const float *const *vrow)
{
  __m512 al[4];
#pragma GCC unroll 4
  for (int k = 0; k < nr; k++)
    al[k] = _mm512_set1_ps (alpha[k]);
  gint32 c0 = 0;
#define PV_BLOCK(NA)                                                                         \
  do                                                                                         \
    {                                                                                        \
      __m512 a[4][NA];                                                                       \
      _Pragma ("GCC unroll 4") for (int k = 0; k < nr; k++)                                  \
      _Pragma ("GCC unroll 4") for (int j = 0; j < (NA); j++)                                \
        a[k][j] = _mm512_mul_ps (_mm512_loadu_ps (acc + (gsize) k * d + c0 + 16 * j), al[k]); \
      for (guint64 m = lanes; m; m &= m - 1)                                                 \
        {                                                                                    \
          const gint32 i = __builtin_ctzll (m);                                              \
          __m512 v[NA];                                                                      \
          _Pragma ("GCC unroll 4") for (int j = 0; j < (NA); j++)                            \
            v[j] = _mm512_loadu_ps (vrow[i] + c0 + 16 * j);                                  \
          _Pragma ("GCC unroll 4") for (int k = 0; k < nr; k++)                              \
          {                                                                                  \
            const __m512 x = _mm512_set1_ps (p[k][i]);                                       \
            _Pragma ("GCC unroll 4") for (int j = 0; j < (NA); j++)                          \
              a[k][j] = _mm512_fmadd_ps (x, v[j], a[k][j]);                                  \
          }                                                                                  \
        }                                                                                    \
      _Pragma ("GCC unroll 4") for (int k = 0; k < nr; k++)                                  \
      _Pragma ("GCC unroll 4") for (int j = 0; j < (NA); j++)                                \
        _mm512_storeu_ps (acc + (gsize) k * d + c0 + 16 * j, a[k][j]);                       \
    }                                                                                        \
  while (0)
  for (; c0 + 64 <= d; c0 += 64)
    PV_BLOCK (4);
  for (; c0 < d; c0 += 16)
    PV_BLOCK (1);
#undef PV_BLOCK
}

/* Online-softmax update of row r with the scores s of the lanes in vis. */
static inline void
row_update (VsTile *t, gint32 r, float *s, guint32 vis, const float *const *vrow)
{
  const float alpha = row_softmax (t, r, s, vis);
  pv_rows (t->acc + (gsize) r * t->d, t->d, 1, (const float *const[]) { s }, &alpha, vis, vrow);
}

/* acc[r..r+3] = alpha * acc + p . V over `lanes` (p[k][i] for row r + k,
 * value row vrow[i]): four rows share each value load. */
static inline void
pv4 (VsTile *t, gint32 r, float *const *p, const float *alpha, guint64 lanes, const float *const *vrow)
{
  pv_rows (t->acc + (gsize) r * t->d, t->d, 4, (const float *const *) p, alpha, lanes, vrow);
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
  tile_rows (q, nr, d, qr);
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
  panel_scores (qr, 8, nr, kt, d, s);
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
      pv_rows (t->acc + (gsize) k * t->d, t->d, 1, (const float *const[]) { pd->s[k] }, &alpha[k], lanes,
               pd->vrow);
  pd->n = 0;
}
