/* The subquadratic policy's tile kernels (AVX-512): the window band, rows
 * of scattered keys, diagonals, shared keys, and the packing they read.
 * Vector primitives (exp, transposed sums) come from <sift/simd.h>; a row's
 * lone keys go through sift_attend_row_sparse. Same sums as the scalar
 * paths in sq-core.c up to rounding. */
#include <math.h>
#include <string.h>

#include <sift/plugin.h>

#include "sq-simd.h"

static void
mean_scalar (float *dst, const float *src, gint64 stride, gint64 n, gint32 d)
{
  memset (dst, 0, (gsize) d * sizeof (float));
  for (gint64 t = 0; t < n; t++)
    for (gint32 x = 0; x < d; x++)
      dst[x] += src[t * stride + x];
  float inv = 1.0f / (float) n;
  for (gint32 x = 0; x < d; x++)
    dst[x] *= inv;
}

static void
pack_rows_scalar (const float *const *rows, gint32 n, gint32 d, float *panel)
{
  for (gint32 x = 0; x < d; x++)
    for (gint32 c = 0; c < 16; c++)
      panel[x * 16 + c] = c < n ? rows[c][x] : 0.0f;
}

#ifdef SIFT_SIMD_X86

#define AVX512 SIFT_TARGET_AVX512
#define INLINE SIFT_SIMD_INLINE

/* ---- Band kernel (AVX-512) ----------------------------------------------- */

/* Scores of np (1 or 2) panels from p on for all rows, -inf where a row
 * does not see the key, into sb (row r at sb + r * SQ_BAND_SB); mx takes
 * the running maxima. Two panels a step: 2 loads and 8 broadcasts feed 16
 * FMAs. */
enum { SQ_BAND_CH = 16, SQ_BAND_SB = SQ_BAND_CH * 16 };

INLINE AVX512 void
band_scores (const SqBand *b, const float *qs, int nv, gint64 p, int np, float *sb, __m512 *mx)
{
  enum { R = SQ_BAND_ROWS, L = 16 };
  const int d = 16 * nv;
  const float *panel[2];
  __m512 s[2][R];
  /* A local copy: the vector stores below may alias *b->pf, which would
   * otherwise be stored and reloaded every step. */
  SqPrefetch pf = b->pf != NULL ? *b->pf : (SqPrefetch) { 0 };
#pragma GCC unroll 2
  for (int u = 0; u < np; u++)
    {
      panel[u] = b->panels + (b->ring > 0 ? (p + u) % b->ring : p + u) * d * L;
#pragma GCC unroll 8
      for (int r = 0; r < R; r++)
        s[u][r] = _mm512_setzero_ps ();
    }
#pragma GCC unroll 2
  for (int x = 0; x < d; x++)
    {
      /* Spread the next tile's far rows over the FMAs, one line a step. */
      sq_prefetch_step (&pf);
      __m512 kx[2];
#pragma GCC unroll 2
      for (int u = 0; u < np; u++)
        kx[u] = _mm512_load_ps (panel[u] + x * L);
#pragma GCC unroll 8
      for (int r = 0; r < R; r++)
        {
          __m512 qb = _mm512_set1_ps (qs[r * d + x]);
#pragma GCC unroll 2
          for (int u = 0; u < np; u++)
            s[u][r] = _mm512_fmadd_ps (kx[u], qb, s[u][r]);
        }
    }
#pragma GCC unroll 2
  for (int u = 0; u < np; u++)
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
      {
        /* Row r sees keys [lo + r, hi + r]; the rest score -inf. */
        const gint64 j0 = (p + u) * L;
        gint64 a = CLAMP (MAX (b->lo + r, b->floor) - j0, 0, L), z = CLAMP (b->hi + r - j0 + 1, 0, L);
        __mmask16 k = (__mmask16) (a < z && r < b->n_rows ? ((1u << z) - 1u) & ~((1u << a) - 1u) : 0u);
        __m512 sv = _mm512_mask_blend_ps (k, _mm512_set1_ps (-INFINITY), s[u][r]);
        mx[r] = _mm512_max_ps (mx[r], sv);
        _mm512_store_ps (sb + r * SQ_BAND_SB + u * L, sv);
      }
  if (b->pf != NULL)
    *b->pf = pf;
}

/* P . V of the band and shared kernels for their SQ_BAND_ROWS rows: row r's
 * accumulator (d = 16 nv floats) is rescaled by rf[r], then gains w[r *
 * w_stride + c] times value row c for c in [c0, c1): at vbase + c * vstride,
 * or at vrows[c] when vbase is NULL. Two vectors of d at a time for all the
 * rows: 2R accumulators stay in registers and each line of a value row is
 * read once per head. Rows from n_rows on are padding (weights 0) and are
 * not stored. */
INLINE AVX512 void
pv_rows (SiftRowState *st, int n_rows, int nv, const float *rf, const float *w, gsize w_stride, const float *vbase,
         gint64 vstride, const float *const *vrows, gint64 c0, gint64 c1)
{
  enum { R = SQ_BAND_ROWS };
  for (int jv = 0; jv < nv; jv += 2)
    {
      __m512 acc[R][2];
#pragma GCC unroll 8
      for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++)
          acc[r][j] = r < n_rows ? _mm512_mul_ps (_mm512_loadu_ps (st[r].acc + 16 * (jv + j)), _mm512_set1_ps (rf[r]))
                                 : _mm512_setzero_ps ();
      for (gint64 c = c0; c < c1; c++)
        {
          const float *v = (vbase != NULL ? vbase + c * vstride : vrows[c]) + 16 * jv;
          __m512 v0 = _mm512_loadu_ps (v), v1 = _mm512_loadu_ps (v + 16);
#pragma GCC unroll 8
          for (int r = 0; r < R; r++)
            {
              __m512 x = _mm512_set1_ps (w[(gsize) r * w_stride + (gsize) c]);
              acc[r][0] = _mm512_fmadd_ps (x, v0, acc[r][0]);
              acc[r][1] = _mm512_fmadd_ps (x, v1, acc[r][1]);
            }
        }
#pragma GCC unroll 8
      for (int r = 0; r < R; r++)
        if (r < n_rows)
#pragma GCC unroll 2
          for (int j = 0; j < 2; j++)
            _mm512_storeu_ps (st[r].acc + 16 * (jv + j), acc[r][j]);
    }
}

/* Keys come in panels of 16 packed dimension-major ([d][16]), so a row's
 * 16 scores are one vector: q . k for 8 rows x 16 keys is d steps of one
 * panel load and 8 broadcast FMAs, with no horizontal sums. The band is
 * taken in chunks of up to 16 panels (one chunk for window <= 232): all of
 * a chunk's scores first, then one max per row, the chunk's exponentials
 * against that max (so the running sums rescale at most once per chunk,
 * not once per panel), then P . V for all rows at once, 32 floats of the
 * head dimension at a time. */
INLINE AVX512 void
band_avx512 (const SqBand *b, SiftRowState *st, int nv)
{
  enum { R = SQ_BAND_ROWS, L = 16, CH = SQ_BAND_CH };
  const int d = 16 * nv;
  const int n_rows = b->n_rows;
  float qs[R * 128] __attribute__ ((aligned (64)));
  float sb[R][CH * L] __attribute__ ((aligned (64))); /* scores, then weights */
  float m[R], l[R], rf[R];
  for (int r = 0; r < R; r++)
    {
#pragma GCC unroll 8
      for (int j = 0; j < nv; j++)
        _mm512_store_ps (qs + r * d + 16 * j,
                         r < n_rows ? _mm512_mul_ps (_mm512_loadu_ps (b->q + r * b->q_stride + 16 * j),
                                                     _mm512_set1_ps (b->scale))
                                    : _mm512_setzero_ps ());
      if (r < n_rows)
        memset (st[r].acc, 0, (gsize) d * sizeof (float));
      m[r] = -INFINITY;
      l[r] = 0.0f;
    }
  const gint64 j_lo = MAX (b->lo, b->floor), j_hi = b->hi + n_rows - 1; /* keys any row sees */
  const gint64 p_last = j_hi / L;
  for (gint64 pc = j_lo / L; pc <= p_last; pc += CH)
    {
      const int np = (int) MIN (CH, p_last - pc + 1);
      __m512 mx[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; r++)
        mx[r] = _mm512_set1_ps (-INFINITY);
      int q = 0;
      for (; q + 2 <= np; q += 2)
        band_scores (b, qs, nv, pc + q, 2, sb[0] + q * L, mx);
      if (q < np)
        band_scores (b, qs, nv, pc + q, 1, sb[0] + q * L, mx);
      for (int r = 0; r < R; r++)
        {
          if (r >= n_rows)
            {
              /* Padding rows weigh nothing (their accumulators are never stored). */
              for (int q = 0; q < np; q++)
                _mm512_store_ps (&sb[r][q * L], _mm512_setzero_ps ());
              continue;
            }
          float mn = MAX (m[r], _mm512_reduce_max_ps (mx[r]));
          /* What was summed shrinks by e^(m_old - m_new); a row with no key yet has nothing to shrink. */
          rf[r] = mn > m[r] ? expf (m[r] - mn) : 1.0f;
          l[r] *= rf[r];
          m[r] = mn;
          __m512 base = _mm512_set1_ps (mn == -INFINITY ? 0.0f : mn), ls = _mm512_setzero_ps ();
          for (int q = 0; q < np; q++)
            {
              __m512 w = sift_exp_512 (_mm512_sub_ps (_mm512_load_ps (&sb[r][q * L]), base));
              ls = _mm512_add_ps (ls, w);
              _mm512_store_ps (&sb[r][q * L], w);
            }
          l[r] += _mm512_reduce_add_ps (ls);
        }
      /* The chunk's keys any row sees, as columns of sb. */
      const gint64 c_lo = MAX (j_lo, pc * L) - pc * L, c_hi = MIN (j_hi, (pc + np) * L - 1) - pc * L;
      pv_rows (st, n_rows, nv, rf, sb[0], CH * L, b->v + pc * L * b->v_stride, b->v_stride, NULL, c_lo, c_hi + 1);
    }
  if (b->pf != NULL)
    sq_prefetch_rest (b->pf);
  for (int r = 0; r < n_rows; r++)
    {
      st[r].m = m[r];
      st[r].l = l[r];
    }
}

/* Entry points with a constant vector count, so the row loops unroll. */
#define SQ_DEFINE_TILE(kernel, Args, d, nv)                                                 \
  static AVX512 void kernel##_##d (const Args *b, SiftRowState *st)                              \
  {                                                                                         \
    kernel (b, st, nv);                                                                     \
  }

SQ_DEFINE_TILE (band_avx512, SqBand, 32, 2)
SQ_DEFINE_TILE (band_avx512, SqBand, 64, 4)
SQ_DEFINE_TILE (band_avx512, SqBand, 128, 8)


/* ---- Rows kernel (AVX-512) ------------------------------------------------ */

/* 8 rows along the lanes: q rows r < n_rows scaled into qs ([8][16 nv],
 * zeros past n_rows), their running max and sum into m and l (padding rows
 * at m = 0, so no lane computes -inf - -inf). */
INLINE AVX512 void
lanes_load_rows (const float *q, gint64 q_stride, int n_rows, float scale, int nv, float *qs, const SiftRowState *st,
                 __m256 *m, __m256 *l)
{
  float mf[8], lf[8];
  for (int r = 0; r < 8; r++)
    {
#pragma GCC unroll 8
      for (int j = 0; j < nv; j++)
        _mm512_store_ps (qs + r * 16 * nv + 16 * j,
                         r < n_rows ? _mm512_mul_ps (_mm512_loadu_ps (q + r * q_stride + 16 * j), _mm512_set1_ps (scale))
                                    : _mm512_setzero_ps ());
      mf[r] = r < n_rows ? st[r].m : 0.0f;
      lf[r] = r < n_rows ? st[r].l : 0.0f;
    }
  *m = _mm256_loadu_ps (mf);
  *l = _mm256_loadu_ps (lf);
}

/* The running max and sum of rows r < n_rows back into their states. */
INLINE AVX512 void
lanes_store_states (SiftRowState *st, int n_rows, __m256 m, __m256 l)
{
  float mf[8], lf[8];
  _mm256_storeu_ps (mf, m);
  _mm256_storeu_ps (lf, l);
  for (int r = 0; r < n_rows; r++)
    {
      st[r].m = mf[r];
      st[r].l = lf[r];
    }
}

/* One online-softmax step of 8 rows held along the lanes, over the scores
 * s[c], c < nc (-inf where valid[c] is clear): m rises to the batch's max,
 * l shrinks by e^(m_old - m_new) and takes the new weights; the weights go
 * to pbuf[c][row], each row's rescale factor to rfb[row]. */
INLINE AVX512 void
lanes_softmax_step (const __m256 *s, const __m256 *valid, int nc, __m256 *m, __m256 *l, float pbuf[8][8],
                    float *rfb)
{
  __m256 mx = *m;
#pragma GCC unroll 8
  for (int c = 0; c < 8; c++)
    if (c < nc)
      mx = _mm256_max_ps (mx, s[c]);
  /* Rows that have seen nothing yet (m = -inf) rescale by 0, not NaN. */
  __m256 seen = _mm256_cmp_ps (*m, _mm256_set1_ps (-INFINITY), _CMP_NEQ_OQ);
  __m256 rf = _mm256_and_ps (sift_exp_256 (_mm256_sub_ps (*m, mx)), seen);
  __m256 mxs = _mm256_blendv_ps (_mm256_setzero_ps (), mx, _mm256_cmp_ps (mx, _mm256_set1_ps (-INFINITY), _CMP_NEQ_OQ));
  __m256 sum = _mm256_mul_ps (*l, rf);
#pragma GCC unroll 8
  for (int c = 0; c < 8; c++)
    if (c < nc)
      {
        __m256 p = _mm256_and_ps (sift_exp_256 (_mm256_sub_ps (s[c], mxs)), valid[c]);
        sum = _mm256_add_ps (sum, p);
        _mm256_storeu_ps (pbuf[c], p);
      }
  *m = mx;
  *l = sum;
  _mm256_storeu_ps (rfb, rf);
}


INLINE AVX512 void
rows_avx512 (const SqRows *b, SiftRowState *st, int nv)
{
  enum { R = 8 };
  const int d = 16 * nv, n_rows = b->n_rows;
  float qs[R * 128] __attribute__ ((aligned (64)));
  float pbuf[R][R], rfb[R];
  gsize n_max = 0;
  int nr[R];
  for (int r = 0; r < R; r++)
    {
      nr[r] = r < n_rows ? (int) b->n[r] : 0;
      n_max = MAX (n_max, (gsize) nr[r]);
    }
  const __m256i len = _mm256_loadu_si256 ((const __m256i *) nr);
  __m256 m, l;
  lanes_load_rows (b->q, b->q_stride, n_rows, b->scale, nv, qs, st, &m, &l);
  for (gsize c0 = 0; c0 < n_max; c0 += R)
    {
      __m256 s[R], valid[R];
#pragma GCC unroll 8
      for (int c = 0; c < R; c++)
        {
          __m256 t[R];
#pragma GCC unroll 8
          for (int r = 0; r < R; r++)
            {
              t[r] = _mm256_setzero_ps ();
              if ((int) c0 + c < nr[r])
                {
                  const float *k = b->k[r * b->max + c0 + c];
                  __m512 z = _mm512_mul_ps (_mm512_load_ps (qs + r * d), _mm512_loadu_ps (k));
#pragma GCC unroll 8
                  for (int j = 1; j < nv; j++)
                    z = _mm512_fmadd_ps (_mm512_load_ps (qs + r * d + 16 * j), _mm512_loadu_ps (k + 16 * j), z);
                  t[r] = sift_fold_512 (z);
                }
            }
          valid[c] = _mm256_castsi256_ps (_mm256_cmpgt_epi32 (len, _mm256_set1_epi32 ((int) c0 + c)));
          s[c] = _mm256_blendv_ps (_mm256_set1_ps (-INFINITY), sift_hsum8x8_256 (t), valid[c]);
        }
      lanes_softmax_step (s, valid, R, &m, &l, pbuf, rfb);
      for (int r = 0; r < n_rows; r++)
        {
          int nc = MIN (R, nr[r] - (int) c0);
          if (nc <= 0)
            continue;
          __m512 acc[8];
#pragma GCC unroll 8
          for (int j = 0; j < nv; j++)
            acc[j] = _mm512_mul_ps (_mm512_loadu_ps (st[r].acc + 16 * j), _mm512_set1_ps (rfb[r]));
          for (int c = 0; c < nc; c++)
            {
              const float *v = b->v[r * b->max + c0 + c];
              __m512 w = _mm512_set1_ps (pbuf[c][r]);
#pragma GCC unroll 8
              for (int j = 0; j < nv; j++)
                acc[j] = _mm512_fmadd_ps (w, _mm512_loadu_ps (v + 16 * j), acc[j]);
            }
#pragma GCC unroll 8
          for (int j = 0; j < nv; j++)
            _mm512_storeu_ps (st[r].acc + 16 * j, acc[j]);
        }
    }
  lanes_store_states (st, n_rows, m, l);
}

SQ_DEFINE_TILE (rows_avx512, SqRows, 32, 2)
SQ_DEFINE_TILE (rows_avx512, SqRows, 64, 4)
SQ_DEFINE_TILE (rows_avx512, SqRows, 128, 8)

/* ---- Diagonal kernel (AVX-512) -------------------------------------------- */

/* Up to 8 levels at a time: each level's 8 dot products (row r with key
 * base + r - dist) folded to 8 lanes and reduced together, so the scores
 * come out with rows along the lanes; one vector softmax step per batch;
 * then P . V with the 8 rows' accumulators in registers, 32 floats of d at
 * a time. Rows a level does not name score -inf and read nothing. */
INLINE AVX512 void
diag_avx512 (const SqDiag *b, SiftRowState *st, int nv)
{
  enum { R = 8 };
  const int d = 16 * nv, n_rows = b->n_rows;
  float qs[R * 128] __attribute__ ((aligned (64)));
  float pbuf[R][R], rfb[R];
  const guint8 live = (guint8) ((1u << n_rows) - 1u);
  __m256 m, l;
  lanes_load_rows (b->q, b->q_stride, n_rows, b->scale, nv, qs, st, &m, &l);
  for (gint32 c0 = 0; c0 < b->n; c0 += R)
    {
      const int nb = MIN (R, b->n - c0);
      __m256 s[R], valid[R];
      guint8 mk[R];
      const float *kc[R], *vc[R];
#pragma GCC unroll 8
      for (int c = 0; c < R; c++)
        {
          __m256 t[R];
          mk[c] = c < nb ? b->mask[c0 + c] & live : 0;
          kc[c] = c < nb ? b->k + (b->base - b->dist[c0 + c]) * b->k_stride : b->k;
          vc[c] = c < nb ? b->v + (b->base - b->dist[c0 + c]) * b->v_stride : b->v;
#pragma GCC unroll 8
          for (int r = 0; r < R; r++)
            {
              t[r] = _mm256_setzero_ps ();
              if (mk[c] & (1u << r))
                {
                  const float *k = kc[c] + r * b->k_stride;
                  /* Two chains, so the FMAs' latency halves. */
                  __m512 z0 = _mm512_mul_ps (_mm512_load_ps (qs + r * d), _mm512_loadu_ps (k));
                  __m512 z1 = _mm512_mul_ps (_mm512_load_ps (qs + r * d + 16), _mm512_loadu_ps (k + 16));
#pragma GCC unroll 8
                  for (int j = 2; j < nv; j += 2)
                    {
                      z0 = _mm512_fmadd_ps (_mm512_load_ps (qs + r * d + 16 * j), _mm512_loadu_ps (k + 16 * j), z0);
                      z1 = _mm512_fmadd_ps (_mm512_load_ps (qs + r * d + 16 * j + 16), _mm512_loadu_ps (k + 16 * j + 16), z1);
                    }
                  __m512 z = _mm512_add_ps (z0, z1);
                  t[r] = sift_fold_512 (z);
                }
            }
          valid[c] = _mm256_castsi256_ps (_mm256_movm_epi32 (mk[c]));
          s[c] = _mm256_blendv_ps (_mm256_set1_ps (-INFINITY), sift_hsum8x8_256 (t), valid[c]);
        }
      lanes_softmax_step (s, valid, nb, &m, &l, pbuf, rfb);
      /* Four rows at a time with their whole accumulators (16 registers
       * for d 64; d 128 in two halves of the dimension). */
      for (int r0 = 0; r0 < n_rows; r0 += 4)
        for (int jv = 0; jv < nv; jv += 4)
          {
            const int nj = MIN (4, nv - jv);
            __m512 acc[4][4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
              for (int j = 0; j < 4; j++)
                acc[r][j] = r0 + r < n_rows && j < nj
                              ? _mm512_mul_ps (_mm512_loadu_ps (st[r0 + r].acc + 16 * (jv + j)), _mm512_set1_ps (rfb[r0 + r]))
                              : _mm512_setzero_ps ();
            for (int c = 0; c < nb; c++)
#pragma GCC unroll 4
              for (int r = 0; r < 4; r++)
                if (mk[c] & (1u << (r0 + r)))
                  {
                    const float *v = vc[c] + (r0 + r) * b->v_stride + 16 * jv;
                    __m512 w = _mm512_set1_ps (pbuf[c][r0 + r]);
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++)
                      if (j < nj)
                        acc[r][j] = _mm512_fmadd_ps (w, _mm512_loadu_ps (v + 16 * j), acc[r][j]);
                  }
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
              if (r0 + r < n_rows)
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                  if (j < nj)
                    _mm512_storeu_ps (st[r0 + r].acc + 16 * (jv + j), acc[r][j]);
          }
    }
  lanes_store_states (st, n_rows, m, l);
}

SQ_DEFINE_TILE (diag_avx512, SqDiag, 32, 2)
SQ_DEFINE_TILE (diag_avx512, SqDiag, 64, 4)
SQ_DEFINE_TILE (diag_avx512, SqDiag, 128, 8)

/* 16 keys x 16 dimensions transposed in registers: two in-lane shuffle
 * rounds give each 128-bit lane four keys of one dimension, two rounds of
 * lane shuffles put the four lanes of a dimension together. Keys at or
 * past n read as zeros. */
static AVX512 void
pack_transpose_avx512 (const float *k, gint64 stride, gint64 n, gint32 d, float *panels)
{
  for (gint64 p = 0; p * 16 < n; p++)
    {
      const float *base = k + p * 16 * stride;
      for (gint32 x0 = 0; x0 < d; x0 += 16)
        {
          __m512 r[16], t[16];
#pragma GCC unroll 16
          for (int c = 0; c < 16; c++)
            r[c] = _mm512_maskz_loadu_ps (p * 16 + c < n ? 0xffff : 0, base + c * stride + x0);
#pragma GCC unroll 8
          for (int i = 0; i < 8; i++)
            {
              t[2 * i] = _mm512_unpacklo_ps (r[2 * i], r[2 * i + 1]);
              t[2 * i + 1] = _mm512_unpackhi_ps (r[2 * i], r[2 * i + 1]);
            }
#pragma GCC unroll 4
          for (int b = 0; b < 4; b++)
            {
              r[4 * b] = _mm512_shuffle_ps (t[4 * b], t[4 * b + 2], 0x44);
              r[4 * b + 1] = _mm512_shuffle_ps (t[4 * b], t[4 * b + 2], 0xee);
              r[4 * b + 2] = _mm512_shuffle_ps (t[4 * b + 1], t[4 * b + 3], 0x44);
              r[4 * b + 3] = _mm512_shuffle_ps (t[4 * b + 1], t[4 * b + 3], 0xee);
            }
          /* r[4b + j], lane L: keys 4b..4b+3 of dimension 4L + j. */
#pragma GCC unroll 4
          for (int j = 0; j < 4; j++)
            {
              t[j] = _mm512_shuffle_f32x4 (r[j], r[4 + j], 0x88);
              t[4 + j] = _mm512_shuffle_f32x4 (r[j], r[4 + j], 0xdd);
              t[8 + j] = _mm512_shuffle_f32x4 (r[8 + j], r[12 + j], 0x88);
              t[12 + j] = _mm512_shuffle_f32x4 (r[8 + j], r[12 + j], 0xdd);
            }
          float *out = panels + (p * d + x0) * 16;
#pragma GCC unroll 4
          for (int j = 0; j < 4; j++)
            {
              _mm512_store_ps (out + (0 + j) * 16, _mm512_shuffle_f32x4 (t[j], t[8 + j], 0x88));
              _mm512_store_ps (out + (4 + j) * 16, _mm512_shuffle_f32x4 (t[4 + j], t[12 + j], 0x88));
              _mm512_store_ps (out + (8 + j) * 16, _mm512_shuffle_f32x4 (t[j], t[8 + j], 0xdd));
              _mm512_store_ps (out + (12 + j) * 16, _mm512_shuffle_f32x4 (t[4 + j], t[12 + j], 0xdd));
            }
        }
    }
}

/* ---- Shared-keys kernel (AVX-512) ----------------------------------------- */

/* The keys come packed in one panel ([d][16]), so q . k for 8 rows x 16
 * keys is d steps of one load and 8 broadcast FMAs; a row's keys it does
 * not name score -inf. One max per row, one rescale, then P . V for all
 * rows 32 floats of d at a time, as the band. */
INLINE AVX512 void
shared_avx512 (const SqShared *b, SiftRowState *st, int nv)
{
  enum { R = SQ_BAND_ROWS, L = 16 };
  const int d = 16 * nv, n_rows = b->n_rows, n = b->n;
  const float *panel = b->panel;
  float qs[R * 128] __attribute__ ((aligned (64)));
  float sb[R][L] __attribute__ ((aligned (64))); /* weights */
  float rf[R];
  g_assert (n >= 1 && n <= L);
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int j = 0; j < nv; j++)
      _mm512_store_ps (qs + r * d + 16 * j,
                       r < n_rows ? _mm512_mul_ps (_mm512_loadu_ps (b->q + r * b->q_stride + 16 * j),
                                                   _mm512_set1_ps (b->scale))
                                  : _mm512_setzero_ps ());
  __m512 s[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
    s[r] = _mm512_setzero_ps ();
#pragma GCC unroll 2
  for (int x = 0; x < d; x++)
    {
      __m512 kx = _mm512_loadu_ps (panel + x * L);
#pragma GCC unroll 8
      for (int r = 0; r < R; r++)
        s[r] = _mm512_fmadd_ps (kx, _mm512_set1_ps (qs[r * d + x]), s[r]);
    }
  for (int r = 0; r < R; r++)
    {
      const __mmask16 k = r < n_rows ? (__mmask16) (b->mask[r] & ((1u << n) - 1u)) : 0;
      rf[r] = 1.0f;
      if (k == 0)
        {
          /* Nothing for this row: weights 0, its state unchanged. */
          _mm512_store_ps (sb[r], _mm512_setzero_ps ());
          continue;
        }
      __m512 sv = _mm512_mask_blend_ps (k, _mm512_set1_ps (-INFINITY), s[r]);
      float mn = MAX (st[r].m, _mm512_reduce_max_ps (sv));
      /* What was summed shrinks by e^(m_old - m_new) (0 for a fresh row). */
      if (mn > st[r].m)
        rf[r] = expf (st[r].m - mn);
      __m512 w = sift_exp_512 (_mm512_sub_ps (sv, _mm512_set1_ps (mn)));
      st[r].l = st[r].l * rf[r] + _mm512_reduce_add_ps (w);
      st[r].m = mn;
      _mm512_store_ps (sb[r], w);
    }
  pv_rows (st, n_rows, nv, rf, sb[0], L, NULL, 0, b->v, 0, n);
}

static AVX512 void
pack_rows_avx512 (const float *const *rows, gint32 n, gint32 d, float *panel)
{
  float keys[16 * 128] __attribute__ ((aligned (64)));
  for (gint32 c = 0; c < n; c++)
    for (gint32 x = 0; x < d; x += 16)
      _mm512_store_ps (keys + c * d + x, _mm512_loadu_ps (rows[c] + x));
  pack_transpose_avx512 (keys, d, n, d, panel);
}

SQ_DEFINE_TILE (shared_avx512, SqShared, 32, 2)
SQ_DEFINE_TILE (shared_avx512, SqShared, 64, 4)
SQ_DEFINE_TILE (shared_avx512, SqShared, 128, 8)

static AVX512 void
pack_avx512 (const float *k, gint64 stride, gint64 n, gint32 d, float *panels)
{
  const __m512i rows = _mm512_mullo_epi32 (_mm512_setr_epi32 (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32 ((int) stride));
  for (gint64 p = 0; p * 16 < n; p++)
    {
      __mmask16 live = (__mmask16) (n - p * 16 >= 16 ? 0xffffu : (1u << (n - p * 16)) - 1u);
      const float *base = k + p * 16 * stride;
      for (gint32 x = 0; x < d; x++)
        _mm512_store_ps (panels + (p * d + x) * 16,
                         _mm512_mask_i32gather_ps (_mm512_setzero_ps (), live, rows, base + x, 4));
    }
}

/* Up to 128 floats of the rows at a time, the sums held in registers. */
static AVX512 void
mean_avx512 (float *dst, const float *src, gint64 stride, gint64 n, gint32 d)
{
  const __m512 inv = _mm512_set1_ps (1.0f / (float) n);
  for (gint32 x0 = 0; x0 < d; x0 += 128)
    {
      const int nv = MIN (8, (d - x0) / 16);
      __m512 acc[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; j++)
        acc[j] = _mm512_setzero_ps ();
      for (gint64 t = 0; t < n; t++)
        {
          const float *row = src + t * stride + x0;
#pragma GCC unroll 8
          for (int j = 0; j < 8; j++)
            if (j < nv)
              acc[j] = _mm512_add_ps (acc[j], _mm512_loadu_ps (row + 16 * j));
        }
      for (int j = 0; j < nv; j++)
        _mm512_storeu_ps (dst + x0 + 16 * j, _mm512_mul_ps (acc[j], inv));
    }
}

static AVX512 void
scale_avx512 (float *dst, const float *src, float s, gint32 d)
{
  for (gint32 x = 0; x < d; x += 16)
    _mm512_storeu_ps (dst + x, _mm512_mul_ps (_mm512_loadu_ps (src + x), _mm512_set1_ps (s)));
}

/* TRUE when the AVX-512 kernels take head_dim-wide rows (d a multiple of 16). */
static gboolean
avx512_rows (gint32 d)
{
  return d % 16 == 0 && sift_isa_active () >= SIFT_ISA_AVX512;
}

#endif /* SIFT_SIMD_X86 */

void
sq_scale_row (float *dst, const float *src, float s, gint32 d)
{
#ifdef SIFT_SIMD_X86
  if (avx512_rows (d))
    {
      scale_avx512 (dst, src, s, d);
      return;
    }
#endif
  for (gint32 x = 0; x < d; x++)
    dst[x] = src[x] * s;
}

void
sq_pack_panels (const float *k, gint64 stride, gint64 n, gint32 d, float *panels)
{
#ifdef SIFT_SIMD_X86
  if (avx512_rows (d))
    {
      pack_transpose_avx512 (k, stride, n, d, panels);
      return;
    }
  if (sift_isa_active () >= SIFT_ISA_AVX512 && stride * 16 <= G_MAXINT32)
    {
      pack_avx512 (k, stride, n, d, panels);
      return;
    }
#endif
  for (gint64 p = 0; p * 16 < n; p++)
    for (gint64 c = 0; c < 16; c++)
      for (gint32 x = 0; x < d; x++)
        panels[(p * d + x) * 16 + c] = p * 16 + c < n ? k[(p * 16 + c) * stride + x] : 0.0f;
}

void
sq_mean_rows (float *dst, const float *src, gint64 stride, gint64 n, gint32 d)
{
#ifdef SIFT_SIMD_X86
  if (avx512_rows (d))
    {
      mean_avx512 (dst, src, stride, n, d);
      return;
    }
#endif
  mean_scalar (dst, src, stride, n, d);
}

void
sq_pack_rows (const float *const *rows, gint32 n, gint32 d, float *panel)
{
  g_assert (n >= 0 && n <= 16);
#ifdef SIFT_SIMD_X86
  if (avx512_rows (d) && d <= 128)
    {
      pack_rows_avx512 (rows, n, d, panel);
      return;
    }
#endif
  pack_rows_scalar (rows, n, d, panel);
}

SiftIsa
sq_simd_isa (gint32 head_dim)
{
  if (head_dim != 32 && head_dim != 64 && head_dim != 128)
    return SIFT_ISA_SCALAR;
  return sift_isa_active ();
}

/* The AVX-512 kernel of `table` ({ d 32, 64, 128 }) for head_dim, or NULL. */
#define SQ_KERNEL_FOR(table, head_dim)                                                                  \
  (sq_simd_isa (head_dim) != SIFT_ISA_AVX512 ? NULL                                                    \
   : (table)[(head_dim) == 32 ? 0 : (head_dim) == 64 ? 1 : 2])

#ifdef SIFT_SIMD_X86
static const SqBandFunc band_table[3] = { band_avx512_32, band_avx512_64, band_avx512_128 };
static const SqRowsFunc rows_table[3] = { rows_avx512_32, rows_avx512_64, rows_avx512_128 };
static const SqDiagFunc diag_table[3] = { diag_avx512_32, diag_avx512_64, diag_avx512_128 };
static const SqSharedFunc shared_table[3] = { shared_avx512_32, shared_avx512_64, shared_avx512_128 };
#else
static const SqBandFunc band_table[3];
static const SqRowsFunc rows_table[3];
static const SqDiagFunc diag_table[3];
static const SqSharedFunc shared_table[3];
#endif

SqBandFunc
sq_simd_band (gint32 head_dim)
{
  return SQ_KERNEL_FOR (band_table, head_dim);
}

SqRowsFunc
sq_simd_rows (gint32 head_dim)
{
  return SQ_KERNEL_FOR (rows_table, head_dim);
}

SqDiagFunc
sq_simd_diag (gint32 head_dim)
{
  return SQ_KERNEL_FOR (diag_table, head_dim);
}

SqSharedFunc
sq_simd_shared (gint32 head_dim)
{
  return SQ_KERNEL_FOR (shared_table, head_dim);
}
