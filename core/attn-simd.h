/* Tiled attention, written once for any vector width. Included by
 * attn-avx2.c and attn-avx512.c after they define the vector type and its
 * operations (see the list in attn-avx2.c); docs/kernels.md explains the
 * algorithm.
 *
 * One work item is a set of R query rows that read the same kv head: up to
 * `heads` query heads of one GQA group times `bq` consecutive query tokens,
 * against one range of keys. Per tile of BK keys:
 *   1. K and V rows are converted to f32 once (kc, vc) and reused by all R rows;
 *   2. S^T = K Q^T: the queries are kept transposed (qt [d][R], scaled by
 *      scale * log2(e)) so that query rows lie along vector lanes; the
 *      microkernel broadcasts one key element and multiplies a vector of rows;
 *   3. online softmax, in base 2, lane-wise over rows (no horizontal work):
 *      m' = max(m, max_j s_j); p_j = 2^(s_j - m'); l' = l 2^(m - m') + sum_j p_j;
 *      the accumulator is rescaled by the same factor 2^(m - m') so every
 *      exponent stays <= 0 (no overflow) and nothing is summed twice;
 *   4. O = 2^(m - m') O + P V: broadcast p, multiply a vector of V's row.
 * At the end O / l is the output and (m + log2 l) ln 2 the natural LSE. When
 * the key range is split (decode, or few items), each split leaves O, m, l as
 * a partial and the partials of one item merge by LSE in a fixed order, so
 * results depend on the thread count only, not on scheduling. */
#include <math.h>
#include <string.h>

#include <sift/parallel.h>

#define BK 64     /* keys per tile */
#define RMAX 128  /* query rows per item */
#define FEW_ROWS MR /* up to this many rows: dot products, not Q^T */

#define ALWAYS_INLINE static inline __attribute__ ((always_inline))

enum { MODE_DENSE, MODE_GATHER };

typedef struct {
  const SiftAttnArgs *a;
  int mode;
  gboolean decode;      /* few rows may take the streaming decode path */
  gint32 d, dp;         /* head_dim and head_dim rounded up to VL */
  gint32 group;         /* query heads per kv head */
  gint32 heads;         /* query heads per item */
  gint32 n_hc;          /* items per group along heads */
  gint64 bq, n_qt;      /* query tokens per item, items along tokens */
  gint64 n_keys;        /* n_kv, or n_rows for gather */
  gint64 n_base;        /* items before splitting keys */
  gint64 n_split;       /* key splits per item */
  gint64 rmax;          /* rows of the largest item */
  float qscale;         /* scale * log2(e) */
  float *part_o;        /* [n_base][n_split][rmax][dp] unnormalised O of each split */
  float *part_ml;       /* [n_base][n_split][rmax][2]: m (base 2) and l */
} Plan;

/* Scratch of one item, carved from a per-thread buffer. */
typedef struct {
  float *qt;     /* [dp][rp] queries, transposed and scaled */
  float *o;      /* [r4][dp] accumulator */
  float *m, *l;  /* [rp] running max (base 2) and sum */
  float *alpha;  /* [rp] rescale factor of the current tile */
  gint32 *lim;   /* [rp] keys visible to each row: positions < lim */
  float *st;     /* [BK][rp] scores, then probabilities, key-major */
  float *kc;     /* [BK][dp] K tile in f32 */
  float *vc;     /* [BK][dp] V tile in f32 */
  gint32 *pos;   /* [BK] key positions of the tile */
} Scratch;

static gsize
round_up (gsize x, gsize m)
{
  return (x + m - 1) / m * m;
}

static gsize
scratch_floats (gsize rp, gsize dp)
{
  return 2 * dp * rp + 5 * rp + BK * rp + 2 * BK * dp + BK + 64;
}

static Scratch
scratch_carve (float *base, gsize rp, gsize dp)
{
  Scratch s;
  float *p = base;
  s.qt = p, p += dp * rp;
  s.o = p, p += rp * dp;
  s.st = p, p += BK * rp;
  s.kc = p, p += BK * dp;
  s.vc = p, p += BK * dp;
  s.m = p, p += rp;
  s.l = p, p += rp;
  s.alpha = p, p += rp;
  s.lim = (gint32 *) p, p += rp;
  s.pos = (gint32 *) p;
  return s;
}

/* Row (h, t) of k or v as f32 [dp], zero padded. */
ALWAYS_INLINE void
load_row (const SiftView *v, gint64 h, gint64 t, float *dst, gint32 d, gint32 dp)
{
  const void *src = sift_view_row (v, h, t);
  gint32 c = 0;
  switch (v->dtype)
    {
    case SIFT_DTYPE_F32:
      memcpy (dst, src, (gsize) d * sizeof (float));
      c = d;
      break;
    case SIFT_DTYPE_F16:
      for (; c + VL <= d; c += VL)
        vstore (dst + c, vcvt_f16 ((const guint16 *) src + c));
      for (; c < d; c++)
        dst[c] = sift_f16_to_f32 (((const guint16 *) src)[c]);
      break;
    default:
      for (; c + VL <= d; c += VL)
        vstore (dst + c, vcvt_bf16 ((const guint16 *) src + c));
      for (; c < d; c++)
        dst[c] = sift_bf16_to_f32 (((const guint16 *) src)[c]);
      break;
    }
  for (; c < dp; c++)
    dst[c] = 0.0f;
}

ALWAYS_INLINE void
prefetch_bytes (const char *p, gsize bytes)
{
  for (gsize off = 0; off < bytes; off += 64)
    __builtin_prefetch (p + off);
}

/* Prefetches a K row and a V row of `bytes` each: into L1, or only into
 * L2 (to_l2). The decode of several rows per key is slower per byte, so the
 * rows it prefetches wait longer: fetched into L1 they hold L1's fill
 * buffers and may be evicted before use; measured on a Xeon with 2 threads
 * at 16K and 128K keys, L2 costs 1.3x less CPU time per byte for GQA group
 * 4 and 1.1x more for group 1. */
ALWAYS_INLINE void
prefetch_rows (const char *k, const char *v, gsize bytes, const gboolean to_l2)
{
  for (gsize off = 0; off < bytes; off += 64)
    {
      if (to_l2)
        {
          __builtin_prefetch (k + off, 0, 2);
          __builtin_prefetch (v + off, 0, 2);
        }
      else
        {
          __builtin_prefetch (k + off, 0, 3);
          __builtin_prefetch (v + off, 0, 3);
        }
    }
}

ALWAYS_INLINE void
prefetch_row (const SiftView *v, gint64 h, gint64 t, gsize bytes)
{
  prefetch_bytes (sift_view_row (v, h, t), bytes);
}

/* C[i][0..nb VL) = (alpha ? alpha[i] C[i] : 0) + sum_k A(i, k) B[k][0..nb VL)
 * for MR rows i, where A(i, k) = a[i * a_row + k * a_col]: broadcast one
 * element of A, multiply a vector of B, MR x nb accumulators in registers.
 * Both products of a tile are this shape: S^T = K Q^T (A = K tile, B = Q^T)
 * and O = alpha O + P V (A = P read through S^T's layout, B = V tile). */
ALWAYS_INLINE void
micro (const float *a, gsize a_row, gsize a_col, const float *b, gsize b_row, gsize nk,
       float *c, gsize c_row, const float *alpha, const int nb)
{
  vf acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
    {
      vf sc = alpha ? vset1 (alpha[i]) : vzero ();
#pragma GCC unroll 8
      for (int n = 0; n < nb; n++)
        acc[i][n] = alpha ? vmul (vload (c + (gsize) i * c_row + (gsize) n * VL), sc) : vzero ();
    }
  for (gsize k = 0; k < nk; k++)
    {
      vf bv[NR];
#pragma GCC unroll 8
      for (int n = 0; n < nb; n++)
        bv[n] = vload (b + k * b_row + (gsize) n * VL);
#pragma GCC unroll 8
      for (int i = 0; i < MR; i++)
        {
          vf x = vset1 (a[(gsize) i * a_row + k * a_col]);
#pragma GCC unroll 8
          for (int n = 0; n < nb; n++)
            acc[i][n] = vfma (x, bv[n], acc[i][n]);
        }
    }
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
    for (int n = 0; n < nb; n++)
      vstore (c + (gsize) i * c_row + (gsize) n * VL, acc[i][n]);
}

/* st[j][r] = sum_c kc[j][c] qt[c][r] for keys j < nkp, rows r < rp. */
static void
scores (const Scratch *s, gsize nkp, gsize rp, gsize dp)
{
  for (gsize j = 0; j < nkp; j += MR)
    {
      gsize r = 0;
      for (; r + NR * VL <= rp; r += NR * VL)
        micro (s->kc + j * dp, dp, 1, s->qt + r, rp, dp, s->st + j * rp + r, rp, NULL, NR);
      for (; r < rp; r += VL)
        micro (s->kc + j * dp, dp, 1, s->qt + r, rp, dp, s->st + j * rp + r, rp, NULL, 1);
    }
}

/* st[j][i] = sum_c qs[i][c] kc[j][c] for `nr` (<= MR) query rows i and
 * DOT_KEYS keys j: dot products along head_dim, one horizontal sum each.
 * For a few rows (decode) this wastes no lanes, where the transposed form
 * would fill a vector of rows with padding. */
ALWAYS_INLINE void
dot_block (const float *qs, const float *kc, gsize dp, float *st, gsize rp, const int nr)
{
  vf acc[MR][DOT_KEYS];
#pragma GCC unroll 8
  for (int i = 0; i < nr; i++)
#pragma GCC unroll 8
    for (int j = 0; j < DOT_KEYS; j++)
      acc[i][j] = vzero ();
  for (gsize c = 0; c < dp; c += VL)
    {
      vf k[DOT_KEYS];
#pragma GCC unroll 8
      for (int j = 0; j < DOT_KEYS; j++)
        k[j] = vload (kc + (gsize) j * dp + c);
#pragma GCC unroll 8
      for (int i = 0; i < nr; i++)
        {
          vf q = vload (qs + (gsize) i * dp + c);
#pragma GCC unroll 8
          for (int j = 0; j < DOT_KEYS; j++)
            acc[i][j] = vfma (q, k[j], acc[i][j]);
        }
    }
#pragma GCC unroll 8
  for (int i = 0; i < nr; i++)
#pragma GCC unroll 8
    for (int j = 0; j < DOT_KEYS; j++)
      st[(gsize) j * rp + (gsize) i] = vhsum (acc[i][j]);
}

/* scores() for R <= FEW_ROWS rows kept row-major in s->qt [MR][dp]. */
static void
scores_few (const Scratch *s, gsize nkp, gsize R, gsize rp, gsize dp)
{
  for (gsize j = 0; j < nkp; j += DOT_KEYS)
    for (gsize i = 0; i < R; i += MR)
      {
        const float *qs = s->qt + i * dp, *kc = s->kc + j * dp;
        float *st = s->st + j * rp + i;
        switch (MIN (R - i, (gsize) MR))
          {
          case 1: dot_block (qs, kc, dp, st, rp, 1); break;
          case 2: dot_block (qs, kc, dp, st, rp, 2); break;
          case 3: dot_block (qs, kc, dp, st, rp, 3); break;
          default: dot_block (qs, kc, dp, st, rp, MR); break;
          }
      }
}

/* o[i][c] = alpha[i] o[i][c] + sum_j st[j][i] vc[j][c] for rows i < r4. */
static void
accumulate (const Scratch *s, gsize nk, gsize r4, gsize rp, gsize dp)
{
  for (gsize i = 0; i < r4; i += MR)
    {
      gsize c = 0;
      for (; c + NR * VL <= dp; c += NR * VL)
        micro (s->st + i, 1, rp, s->vc + c, dp, nk, s->o + i * dp + c, dp, s->alpha + i, NR);
      for (; c < dp; c += VL)
        micro (s->st + i, 1, rp, s->vc + c, dp, nk, s->o + i * dp + c, dp, s->alpha + i, 1);
    }
}

/* Online softmax of one tile, lane-wise over rows (see the top comment). */
static void
softmax_tile (const Scratch *s, gsize nk, gsize rp, gboolean mask)
{
  const vf neg_inf = vset1 (-INFINITY);
  for (gsize r = 0; r < rp; r += VL)
    {
      if (mask)
        for (gsize j = 0; j < nk; j++)
          vstore (s->st + j * rp + r, vmask_ge (vload (s->st + j * rp + r), s->pos[j], s->lim + r));
      vf mx = neg_inf;
      for (gsize j = 0; j < nk; j++)
        mx = vmax (mx, vload (s->st + j * rp + r));
      vf m_old = vload (s->m + r);
      vf m_new = vmax (m_old, mx);
      /* A row that has seen only masked keys keeps m = -inf; subtracting 0
       * then gives p = 0 instead of NaN from -inf - -inf. */
      vf m_sub = vzero_where_neg_inf (m_new);
      vf alpha = vexp2 (vsub (m_old, m_sub));
      vf sum = vzero ();
      for (gsize j = 0; j < nk; j++)
        {
          vf p = vexp2 (vsub (vload (s->st + j * rp + r), m_sub));
          vstore (s->st + j * rp + r, p);
          sum = vadd (sum, p);
        }
      vstore (s->l + r, vfma (vload (s->l + r), alpha, sum));
      vstore (s->m + r, m_new);
      vstore (s->alpha + r, alpha);
    }
}


#include "attn-simd-decode.h"

static gint32
limit32 (const SiftAttnArgs *a, gint64 t);

static gint32
limit32 (const SiftAttnArgs *a, gint64 t)
{
  return (gint32) sift_attn_limit (a, t);
}

/* The query rows of base item `base`: heads [h0, h0 + nh) of kv head g,
 * tokens [t0, t0 + nt); row r = hi * nt + ti. */
typedef struct {
  gint64 g, h0, nh, t0, nt;
} Rows;

static Rows
item_rows (const Plan *p, gint64 base)
{
  Rows rs;
  gint64 hc = (base / p->n_qt) % p->n_hc;
  rs.g = base / p->n_qt / p->n_hc;
  rs.h0 = rs.g * p->group + hc * p->heads;
  rs.nh = MIN ((gint64) p->heads, (gint64) p->group - hc * p->heads);
  rs.t0 = base % p->n_qt * p->bq;
  rs.nt = MIN (p->bq, p->a->q->n_tokens - rs.t0);
  return rs;
}

/* out(h, t) = acc / l and its LSE from the base-2 max m; l = 0: no key seen. */
static void
write_row (const SiftAttnArgs *a, gint64 h, gint64 t, const float *acc, float m, float l)
{
  float *o = sift_view_row (a->out, h, t);
  const gint32 d = a->q->head_dim;
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
  gint32 c = 0;
  for (; c + VL <= d; c += VL)
    vstore (o + c, vmul (vload (acc + c), vset1 (inv)));
  for (; c < d; c++)
    o[c] = acc[c] * inv;
  a->lse[h * a->q->n_tokens + t] = l > 0.0f ? m * (float) G_LN2 + logf (l) : -INFINITY;
}

/* The tiled path over keys [kb, ke) of one item (see the top comment).
 * Dense keys are read through the blocks (cursors at this tile's key and
 * the next tile's); gathered rows index the one view a->k. */
static void
tiled_keys (const Plan *p, gint64 g, const Scratch *sp, gint64 kb, gint64 ke, gint32 min_lim,
            gsize R, gsize rp, gsize r4, gboolean few)
{
  const SiftAttnArgs *a = p->a;
  const Scratch s = *sp;
  const gsize dp = (gsize) p->dp;
  const gint32 d = p->d;
  const gsize row_bytes = (gsize) d * (a->k->dtype == SIFT_DTYPE_F32 ? 4 : 2);
  const gboolean gather = p->mode == MODE_GATHER;
  SiftKvCursor cur = sift_kv_cursor (a, kb), ahead = sift_kv_cursor (a, kb + BK);
  for (gint64 j0 = kb; j0 < ke; j0 += BK)
    {
      gsize nk = (gsize) MIN ((gint64) BK, ke - j0);
      gsize nkp = round_up (nk, MR);
      gint32 max_pos = 0;
      for (gsize j = 0; j < nk; j++)
        {
          gint64 t = gather ? a->rows[j0 + (gint64) j] : j0 + (gint64) j;
          s.pos[j] = (gint32) t;
          max_pos = MAX (max_pos, (gint32) t);
          const SiftView *kv = a->k, *vv = a->v;
          gint64 r = t;
          if (!gather)
            {
              r = sift_kv_seek (&cur, t);
              kv = &a->k_blocks[cur.b], vv = &a->v_blocks[cur.b];
            }
          load_row (kv, g, r, s.kc + j * dp, d, (gint32) dp);
          load_row (vv, g, r, s.vc + j * dp, d, (gint32) dp);
          /* The same row of the next tile is fetched while this tile
           * computes: strided (token-major) K/V defeat the hardware prefetcher. */
          gint64 jn = j0 + BK + (gint64) j;
          if (jn < ke)
            {
              if (gather)
                {
                  prefetch_row (a->k, g, a->rows[jn], row_bytes);
                  prefetch_row (a->v, g, a->rows[jn], row_bytes);
                }
              else
                {
                  gint64 rn = sift_kv_seek (&ahead, jn);
                  prefetch_row (&a->k_blocks[ahead.b], g, rn, row_bytes);
                  prefetch_row (&a->v_blocks[ahead.b], g, rn, row_bytes);
                }
            }
        }
      memset (s.kc + nk * dp, 0, (nkp - nk) * dp * sizeof (float));
      if (few)
        scores_few (&s, nkp, R, rp, dp);
      else
        scores (&s, nkp, rp, dp);
      softmax_tile (&s, nk, rp, a->causal && max_pos >= min_lim);
      accumulate (&s, nk, r4, rp, dp);
    }
}

/* Runs item `item` of the plan: rows, key range, then output or partial. */
static void
run_item (const Plan *p, gint64 item, float *buf)
{
  const SiftAttnArgs *a = p->a;
  const gint64 split = item % p->n_split;
  const gint64 base = item / p->n_split;
  const Rows rs = item_rows (p, base);
  const gint64 g = rs.g, h0 = rs.h0, nh = rs.nh, t0 = rs.t0, nt = rs.nt;
  const gsize R = (gsize) (nh * nt);
  const gsize rp = round_up (R, VL), r4 = round_up (R, MR);
  const gsize dp = (gsize) p->dp;
  const gint32 d = p->d;
  Scratch s = scratch_carve (buf, rp, dp);

  /* Rows, head-major: row r = hi * nt + ti. Few rows keep Q row-major
   * (dot products along head_dim); many keep it transposed, written column
   * by column so the stores run along memory. */
  const gboolean few = R <= FEW_ROWS;
  const float *qrow[RMAX];
  for (gint64 hi = 0; hi < nh; hi++)
    for (gint64 ti = 0; ti < nt; ti++)
      {
        gsize r = (gsize) (hi * nt + ti);
        qrow[r] = sift_view_row (a->q, h0 + hi, t0 + ti);
        s.lim[r] = limit32 (a, t0 + ti);
      }
  if (few)
    {
      /* Lanes of rows >= R are never scored: keep them finite. */
      memset (s.st, 0, BK * rp * sizeof (float));
      memset (s.qt, 0, MR * dp * sizeof (float));
      const vf qscale = vset1 (p->qscale);
      for (gsize r = 0; r < R; r++)
        {
          gint32 c = 0;
          for (; c + VL <= d; c += VL)
            vstore (s.qt + r * dp + (gsize) c, vmul (vload (qrow[r] + c), qscale));
          for (; c < d; c++)
            s.qt[r * dp + (gsize) c] = qrow[r][c] * p->qscale;
        }
    }
  else
    {
      /* VL x VL blocks transposed in registers; rows past R read zeros. */
      memset (s.o, 0, dp * sizeof (float));
      const vf qscale = vset1 (p->qscale);
      const gint32 dv = d / VL * VL;
      for (gsize r0 = 0; r0 < rp; r0 += VL)
        {
          const float *src[VL];
          for (gsize i = 0; i < VL; i++)
            src[i] = r0 + i < R ? qrow[r0 + i] : s.o;
          for (gint32 c = 0; c < dv; c += VL)
            vtranspose (src, (gsize) c, qscale, s.qt + (gsize) c * rp + r0, rp);
          for (gint32 c = dv; c < (gint32) dp; c++)
            for (gsize i = 0; i < VL; i++)
              s.qt[(gsize) c * rp + r0 + i] = c < d ? src[i][c] * p->qscale : 0.0f;
        }
    }
  for (gsize r = R; r < rp; r++)
    s.lim[r] = G_MAXINT32;
  for (gsize r = 0; r < rp; r++)
    {
      s.m[r] = -INFINITY;
      s.l[r] = 0.0f;
    }
  memset (s.o, 0, r4 * dp * sizeof (float));

  /* Keys of this item: [kb, ke) of the token axis (dense) or of rows (gather). */
  gint64 kend = p->n_keys;
  gint32 min_lim = limit32 (a, t0);
  if (p->mode == MODE_DENSE && a->causal)
    kend = MIN (kend, (gint64) limit32 (a, t0 + nt - 1));
  gint64 kb = kend * split / p->n_split / BK * BK;
  gint64 ke = split + 1 == p->n_split ? kend : kend * (split + 1) / p->n_split / BK * BK;

  if (decode_applies (p, R))
    decode_run (p, g, &s, kb, ke, min_lim, R);
  else
    tiled_keys (p, g, &s, kb, ke, min_lim, R, rp, r4, few);

  if (p->n_split == 1)
    {
      for (gint64 hi = 0; hi < nh; hi++)
        for (gint64 ti = 0; ti < nt; ti++)
          {
            gsize r = (gsize) (hi * nt + ti);
            write_row (a, h0 + hi, t0 + ti, s.o + r * dp, s.m[r], s.l[r]);
          }
      return;
    }
  gsize slot = (gsize) item * (gsize) p->rmax;
  memcpy (p->part_o + slot * dp, s.o, R * dp * sizeof (float));
  for (gsize r = 0; r < R; r++)
    {
      p->part_ml[(slot + r) * 2] = s.m[r];
      p->part_ml[(slot + r) * 2 + 1] = s.l[r];
    }
}

static void
items_body (gint64 begin, gint64 end, gint worker, gpointer data)
{
  (void) worker;
  const Plan *p = data;
  gsize rp = round_up ((gsize) p->rmax, VL);
  float *buf = sift_attn_scratch (SIFT_ATTN_SCRATCH_ITEM, scratch_floats (rp, (gsize) p->dp));
  for (gint64 i = begin; i < end; i++)
    run_item (p, i, buf);
}

/* Merges the splits of base items [begin, end) by LSE, in split order. */
static void
merge_body (gint64 begin, gint64 end, gint worker, gpointer data)
{
  (void) worker;
  const Plan *p = data;
  const SiftAttnArgs *a = p->a;
  const gsize dp = (gsize) p->dp;
  for (gint64 base = begin; base < end; base++)
    {
      const Rows rs = item_rows (p, base);
      const gint64 h0 = rs.h0, nh = rs.nh, t0 = rs.t0, nt = rs.nt;
      for (gint64 hi = 0; hi < nh; hi++)
        for (gint64 ti = 0; ti < nt; ti++)
          {
            gsize r = (gsize) (hi * nt + ti);
            float *o = sift_view_row (a->out, h0 + hi, t0 + ti);
            float mx = -INFINITY;
            for (gint64 sp = 0; sp < p->n_split; sp++)
              mx = MAX (mx, p->part_ml[(((gsize) (base * p->n_split + sp)) * (gsize) p->rmax + r) * 2]);
            memset (o, 0, (gsize) p->d * sizeof (float));
            float l = 0.0f; /* stays 0 when no split saw a key: o = 0, lse = -inf */
            for (gint64 sp = 0; sp < p->n_split; sp++)
              {
                gsize slot = (gsize) (base * p->n_split + sp) * (gsize) p->rmax + r;
                if (p->part_ml[slot * 2 + 1] == 0.0f)
                  continue; /* an empty partial is the identity */
                float w = exp2f (p->part_ml[slot * 2] - mx);
                l += w * p->part_ml[slot * 2 + 1];
                const float *po = p->part_o + slot * dp;
                for (gint32 c = 0; c < p->d; c++)
                  o[c] += w * po[c];
              }
            write_row (a, h0 + hi, t0 + ti, o, mx, l);
          }
    }
}

/* Splits the work: items of at most RMAX rows of one kv head, and the key
 * axis split when there are too few items to keep every thread busy. */
static void
run_plan (const SiftAttnArgs *a, int mode, gint64 rmax_rows, gboolean decode)
{
  Plan p = { .a = a, .mode = mode, .decode = decode };
  const gint64 n_q = a->q->n_tokens;
  if (n_q == 0)
    return;
  p.d = a->q->head_dim;
  p.dp = (gint32) round_up ((gsize) p.d, VL);
  p.group = a->q->n_heads / a->k->n_heads;
  p.n_hc = (gint32) ((p.group + rmax_rows - 1) / rmax_rows);
  p.heads = (p.group + p.n_hc - 1) / p.n_hc;
  p.bq = MIN (MAX (1, rmax_rows / p.heads), n_q);
  p.n_qt = (n_q + p.bq - 1) / p.bq;
  p.n_keys = mode == MODE_GATHER ? (gint64) a->n_rows : a->k->n_tokens;
  p.n_base = (gint64) a->k->n_heads * p.n_hc * p.n_qt;
  p.rmax = p.heads * p.bq;
  p.qscale = a->scale * (float) (1.0 / G_LN2);

  /* Small calls run on the calling thread: waking the pool costs more. */
  double work = (double) a->q->n_heads * (double) n_q * (double) p.n_keys * p.d;
  gint threads = work < SIFT_ATTN_SERIAL_WORK ? 1 : sift_parallel_n_threads ();
  p.n_split = 1;
  /* Two items per thread already balance (a chunk's items see about as
   * many keys each); splitting further costs a partial buffer and a merge
   * pass, which made a 128-row prefill chunk of one kv head 12% slower. */
  if (p.n_base < 2 * threads)
    {
      gint64 want = (4 * threads + p.n_base - 1) / p.n_base;
      p.n_split = MAX (1, MIN (want, p.n_keys / (8 * BK)));
    }
  if (p.n_split > 1)
    {
      gsize n = (gsize) (p.n_base * p.n_split * p.rmax);
      float *buf = sift_attn_scratch (SIFT_ATTN_SCRATCH_PARTIAL, n * ((gsize) p.dp + 2));
      p.part_o = buf;
      p.part_ml = buf + n * (gsize) p.dp;
    }
  gint64 n_items = p.n_base * p.n_split;
  if (threads == 1)
    items_body (0, n_items, 0, &p);
  else
    sift_parallel_for (n_items, 1, items_body, &p);
  if (p.n_split > 1)
    {
      if (threads == 1)
        merge_body (0, p.n_base, 0, &p);
      else
        sift_parallel_for (p.n_base, 1, merge_body, &p);
    }
}

static void
dense_simd (const SiftAttnArgs *a)
{
  run_plan (a, MODE_DENSE, RMAX, FALSE);
}

static void
gather_simd (const SiftAttnArgs *a)
{
  run_plan (a, MODE_GATHER, RMAX, FALSE);
}

static void
decode_simd (const SiftAttnArgs *a)
{
  run_plan (a, MODE_DENSE, RMAX, TRUE);
}

static void
expv_simd (const float *x, float *y, gsize n)
{
  gsize i = 0;
  for (; i + VL <= n; i += VL)
    vstore (y + i, vexp2 (vload (x + i)));
  for (; i < n; i++)
    {
      float tx[VL] = { 0 }, ty[VL];
      tx[0] = x[i];
      vstore (ty, vexp2 (vload (tx)));
      y[i] = ty[0];
    }
}
