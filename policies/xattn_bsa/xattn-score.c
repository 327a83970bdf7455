/* XAttention antidiagonal scoring (threshold selection and vote aggregation: xattn-select.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sift/plugin.h>

#include "xattn-score.h"

/* Rows of one parallel task: enough work to amortise the scratch, small
 * enough to spread a 512-row chunk of one head over threads. */
#define ROW_TILE 16
/* Key blocks per call of the batched block-mass path. */
#define BATCH_BLOCKS 64

struct _XattnScorer {
  XattnGeometry geo;
  gsize rlen;         /* S * head_dim: floats per reshaped row or column */
  gint64 q_pos, n_q, kv_end;
  gint64 row0, n_rows; /* reshaped rows row0 .. row0 + n_rows - 1 (absolute) */
  gint64 n_kb;
  float *qr;          /* [n_q_heads][n_rows][S * head_dim] reshaped queries */
  /* Each key block's unnormalised mass, as lsum x e^lmax (no log per
   * block: the softmax in row_mass needs only ratios). */
  float *lmax;        /* [n_q_heads][n_rows][n_kb] largest scaled logit; -inf: none yet */
  float *lsum;        /* [n_q_heads][n_rows][n_kb] sum of e^(logit - lmax); 0: none yet */
  gsize qr_cap, lmax_cap, lsum_cap;
  float *kbuf;        /* [n_kv_heads][n_cols * S][head_dim] keys made contiguous, zero padded */
  gsize kbuf_cap;
  float *stage;       /* [n_kv_heads][XATTN_STAGE_TOKENS][head_dim] keys waiting to be scored */
  float *kpack;       /* [n_kv_heads][ceil(n_cols / 16)][S * head_dim][16] packed panels (AVX-512 path) */
  gsize kpack_cap;
  gboolean stage_packed; /* AVX-512: staged keys go straight into spack, not stage */
  float *spack;       /* [n_kv_heads][stage_panels ()][S * head_dim][16] staged keys, packed */
  gsize spack_cap;
  gint64 stage_pos0, stage_n;
};

static gboolean force_scalar = FALSE;

void
xattn_dots_force_scalar (gboolean scalar)
{
  force_scalar = scalar;
}

SiftIsa
xattn_dots_isa (void)
{
  SiftIsa isa = force_scalar ? SIFT_ISA_SCALAR : sift_isa_active ();
#ifdef XATTN_HAVE_AVX512
  if (isa >= SIFT_ISA_AVX512)
    return SIFT_ISA_AVX512;
#endif
  return isa >= SIFT_ISA_AVX2 ? SIFT_ISA_AVX2 : SIFT_ISA_SCALAR;
}

static void
dots (SiftIsa isa, const float *rows, gsize row_stride, gint64 n_rows, const float *cols, gsize col_stride,
      gint64 n_cols, gsize len, float *out)
{
  if (isa == SIFT_ISA_SCALAR)
    sift_score_tile_scalar (rows, row_stride, n_rows, cols, col_stride, n_cols, len, out);
  else
    sift_score_tile (rows, row_stride, n_rows, cols, col_stride, n_cols, len, out);
}

XattnScorer *
xattn_scorer_new (const XattnGeometry *geo)
{
  g_return_val_if_fail (geo != NULL, NULL);
  g_return_val_if_fail (geo->n_q_heads > 0 && geo->n_kv_heads > 0
                        && geo->n_q_heads % geo->n_kv_heads == 0, NULL);
  g_return_val_if_fail (geo->head_dim > 0 && geo->stride > 0 && geo->block > 0
                        && geo->block % geo->stride == 0, NULL);
  XattnScorer *s = g_new0 (XattnScorer, 1);
  s->geo = *geo;
  if (!(s->geo.norm > 0.0f))
    s->geo.norm = 1.0f;
  s->rlen = (gsize) geo->stride * (gsize) geo->head_dim;
  return s;
}

void
xattn_scorer_free (XattnScorer *s)
{
  if (s == NULL)
    return;
  g_free (s->qr);
  g_free (s->lmax);
  g_free (s->lsum);
  g_free (s->kbuf);
  g_free (s->stage);
  sift_mem_free (s->kpack);
  sift_mem_free (s->spack);
  g_free (s);
}

/* As grow, 64-byte aligned (sift_mem_alloc): the panel kernel's vector
 * loads would otherwise each straddle two cache lines. */
static float *
grow_aligned (float *buf, gsize *cap, gsize n)
{
  if (n <= *cap)
    return buf;
  sift_mem_free (buf);
  *cap = n;
  buf = sift_mem_alloc (n * sizeof (float));
  if (buf == NULL)
    g_error ("xattn_bsa: out of memory for %zu packed key floats", n);
  return buf;
}

static float *
grow (float *buf, gsize *cap, gsize n)
{
  if (n <= *cap)
    return buf;
  g_free (buf);
  *cap = n;
  return g_new (float, n);
}

void
xattn_scorer_begin (XattnScorer *s, const SiftView *q, gint64 q_pos, gint64 n_q)
{
  const XattnGeometry *g = &s->geo;
  const gint64 S = g->stride, B = g->block;
  g_return_if_fail (q != NULL && q->n_heads == g->n_q_heads && q->head_dim == g->head_dim);
  g_return_if_fail (q_pos >= 0 && q_pos % S == 0 && n_q > 0 && q->n_tokens >= n_q);

  s->q_pos = q_pos;
  s->n_q = n_q;
  s->kv_end = q_pos + n_q;
  s->row0 = q_pos / S;
  s->n_rows = (s->kv_end + S - 1) / S - s->row0;
  s->n_kb = (s->kv_end + B - 1) / B;

  gsize nq = (gsize) g->n_q_heads * (gsize) s->n_rows * s->rlen;
  s->qr = grow (s->qr, &s->qr_cap, nq);
  memset (s->qr, 0, nq * sizeof (float));
  /* Row r, segment t holds query rS + S - 1 - t: the reversal that makes
   * segment t meet key cS + t, an antidiagonal of the SxS tile. */
  for (gint32 h = 0; h < g->n_q_heads; h++)
    for (gint64 i = 0; i < s->n_rows; i++)
      for (gint64 t = 0; t < S; t++)
        {
          gint64 pos = (s->row0 + i) * S + S - 1 - t;
          if (pos < q_pos || pos >= s->kv_end)
            continue;
          float *dst = s->qr + ((gsize) h * (gsize) s->n_rows + (gsize) i) * s->rlen
                       + (gsize) t * (gsize) g->head_dim;
          sift_view_row_to_f32 (q, h, pos - q_pos, dst);
        }

  s->stage_n = 0;
  gsize nl = (gsize) g->n_q_heads * (gsize) s->n_rows * (gsize) s->n_kb;
  s->lmax = grow (s->lmax, &s->lmax_cap, nl);
  s->lsum = grow (s->lsum, &s->lsum_cap, nl);
  for (gsize i = 0; i < nl; i++)
    s->lmax[i] = -INFINITY;
  memset (s->lsum, 0, nl * sizeof (float));
}

typedef struct {
  XattnScorer *s;
  const float *k;      /* kv head g's columns at k + g * k_head_stride */
  gsize k_head_stride;
  const float *kp;     /* NULL, or kv head g's packed panels at kp + g * kp_head_stride */
  gsize kp_head_stride;
  gint64 col0, n_cols;
  gint64 tiles_per_head;
  SiftIsa isa;         /* dot-product path */
} AddTask;

/* (m, sum) += (m2, sum2), masses sum x e^m, without overflow; m = -inf is
 * the identity. */
static inline void
mass_add (float *m, float *sum, float m2, float sum2)
{
  if (m2 == -INFINITY)
    return;
  if (*m == -INFINITY)
    {
      *m = m2;
      *sum = sum2;
    }
  else if (m2 > *m)
    {
      *sum = *sum * expf (*m - m2) + sum2;
      *m = m2;
    }
  else
    *sum += sum2 * expf (m2 - *m);
}

/* max_i x[i] * scale and sum_i exp(x[i] * scale - m), SIMD where there is. */
static float
max_scaled (SiftIsa isa, const float *x, gint64 n, float scale)
{
#ifdef XATTN_HAVE_AVX512
  if (isa == SIFT_ISA_AVX512)
    return xattn_max_scaled_avx512 (x, (gsize) n, scale);
#endif
  (void) isa;
  float m = -INFINITY;
  for (gint64 i = 0; i < n; i++)
    m = MAX (m, x[i] * scale);
  return m;
}

static float
sum_exp (SiftIsa isa, const float *x, gint64 n, float scale, float m)
{
#ifdef XATTN_HAVE_AVX512
  if (isa == SIFT_ISA_AVX512)
    return xattn_sum_exp_avx512 (x, (gsize) n, scale, m);
#endif
  (void) isa;
  float sum = 0.0f;
  for (gint64 i = 0; i < n; i++)
    sum += expf (x[i] * scale - m);
  return sum;
}

/* sum_{p < n_seg, j < n} exp(x[p * seg_stride + j] * scale) as *sum x e^m,
 * m the largest x * scale, for stability (scale > 0). */
static void
block_mass (SiftIsa isa, const float *x, gsize seg_stride, gint64 n_seg, gint64 n, float scale, float *m,
            float *sum)
{
#ifdef XATTN_HAVE_AVX512
  if (isa == SIFT_ISA_AVX512)
    {
      *sum = xattn_block_mass_avx512 (x, seg_stride, n_seg, (gsize) n, scale, m);
      return;
    }
#endif
  *m = -INFINITY;
  *sum = 0.0f;
  for (gint64 p = 0; p < n_seg; p++)
    *m = MAX (*m, max_scaled (isa, x + (gsize) p * seg_stride, n, scale));
  for (gint64 p = 0; p < n_seg; p++)
    *sum += sum_exp (isa, x + (gsize) p * seg_stride, n, scale, *m);
}

void
xattn_pack_panels_at (const float *k, gsize k_stride, gint64 n_tokens, gint32 stride, gint32 head_dim, gint64 col0,
                      float *dst)
{
  const gint64 S = stride, d = head_dim, rlen = S * d, n_cols = (n_tokens + S - 1) / S;
  for (gint64 q = col0 / 16; q * 16 < col0 + n_cols; q++)
    {
      float *panel = dst + (gsize) q * (gsize) rlen * 16;
      /* Lanes [lo, hi) are this call's columns: lane l is column 16q + l,
       * i.e. source column 16q + l - col0, keys (16q + l - col0) S + p. */
      const gint64 lo = MAX (col0 - q * 16, 0), hi = MIN (col0 + n_cols - q * 16, 16);
      for (gint64 p = 0; p < S; p++)
        {
          const float *src[16] = { NULL };
          gint64 n_in = 0;
          for (gint64 l = lo; l < hi; l++)
            {
              gint64 j = (q * 16 + l - col0) * S + p;
              src[l] = j < n_tokens ? k + (gsize) j * k_stride : NULL;
              n_in += src[l] != NULL;
            }
          float *e = panel + (gsize) p * (gsize) d * 16;
          if (n_in == 16)
            for (gint64 t = 0; t < d; t++)
              for (gint64 l = 0; l < 16; l++)
                e[t * 16 + l] = src[l][t];
          else
            for (gint64 t = 0; t < d; t++)
              for (gint64 l = lo; l < hi; l++)
                e[t * 16 + l] = src[l] != NULL ? src[l][t] : 0.0f;
        }
    }
}

/* Zeros the lanes past column n_cols - 1 in its panel (dst: panels of
 * rlen entries x 16 lanes). */
static void
zero_tail_lanes (float *dst, gint64 n_cols, gsize rlen)
{
  if (n_cols % 16 == 0)
    return;
  float *panel = dst + (gsize) (n_cols / 16) * rlen * 16;
  for (gsize e = 0; e < rlen; e++)
    memset (panel + e * 16 + n_cols % 16, 0, (gsize) (16 - n_cols % 16) * sizeof (float));
}

void
xattn_pack_panels (const float *k, gsize k_stride, gint64 n_tokens, gint32 stride, gint32 head_dim, float *dst)
{
  xattn_pack_panels_at (k, k_stride, n_tokens, stride, head_dim, 0, dst);
  zero_tail_lanes (dst, (n_tokens + stride - 1) / stride, (gsize) stride * (gsize) head_dim);
}

typedef struct {
  const float *k;     /* kv head g's keys at k + g * k_head_stride, rows head_dim apart */
  gsize k_head_stride;
  gint64 n_tokens, n_panels;
  gint32 stride, head_dim;
  float *dst;         /* kv head g's panels at dst + g * dst_head_stride */
  gsize dst_head_stride;
} PackTask;

static void
pack_range (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  (void) worker;
  const PackTask *t = user_data;
  const gint64 per_panel = 16 * (gint64) t->stride; /* tokens */
  const gsize panel_floats = (gsize) t->stride * (gsize) t->head_dim * 16;
  for (gint64 item = begin; item < end; item++)
    {
      gint64 g = item / t->n_panels, q = item % t->n_panels;
      xattn_pack_panels (t->k + (gsize) g * t->k_head_stride + (gsize) (q * per_panel) * (gsize) t->head_dim,
                         (gsize) t->head_dim, MIN (per_panel, t->n_tokens - q * per_panel), t->stride, t->head_dim,
                         t->dst + (gsize) g * t->dst_head_stride + (gsize) q * panel_floats);
    }
}

/* sum_exp: the summed exp(scale / norm x logit) of key block columns
 * [j, jend) of row r (row i of the tile's products x, [S][nr][nc], column
 * 0 = col0), as *sum x e^m. Segment p pairs query rS + S - 1 - p with key
 * cS + p; padding (past kv_end) and, on the diagonal column, keys after
 * their query are left out. m = -inf when no entry counts. */
static void
block_sum_exp (const XattnScorer *s, SiftIsa isa, const float *x, gint64 nr, gint64 nc, gint64 i, gint64 r,
               gint64 col0, gint64 j, gint64 jend, float *m_out, float *sum_out)
{
  const XattnGeometry *g = &s->geo;
  const gint64 S = g->stride, c_last = col0 + jend - 1;
  const float escale = g->scale / g->norm;
  float m = -INFINITY, sum = 0.0f;
  if (r * S + S - 1 < s->kv_end && c_last < r && c_last * S + S - 1 < s->kv_end)
    {
      /* No padding, no diagonal: every entry counts. */
      block_mass (isa, x + (gsize) i * (gsize) nc + j, (gsize) nr * (gsize) nc, S, jend - j, escale, m_out, sum_out);
      return;
    }
  for (int pass = 0; pass < 2; pass++)
    for (gint64 p = 0; p < S; p++)
      {
        if (r * S + S - 1 - p >= s->kv_end)
          continue;
        const float *xp = x + ((gsize) p * (gsize) nr + (gsize) i) * (gsize) nc;
        for (gint64 jj = j; jj < jend; jj++)
          {
            gint64 c = col0 + jj;
            if (c * S + p >= s->kv_end || (c == r && p > S - 1 - p))
              continue;
            if (pass == 0)
              m = MAX (m, xp[jj] * escale);
            else
              sum += expf (xp[jj] * escale - m);
          }
      }
  *m_out = m;
  *sum_out = sum;
}

static void
add_range (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  (void) worker;
  const AddTask *t = user_data;
  XattnScorer *s = t->s;
  const XattnGeometry *g = &s->geo;
  const gint64 S = g->stride, cols_per_kb = g->block / g->stride;
  const gint32 group = g->n_q_heads / g->n_kv_heads;
  const float lscale = g->scale / (float) S / g->norm;
  const gint64 d = g->head_dim;
  /* mean: one product per (row, column), the antidiagonal's summed logits;
   * sum_exp: its S logits apart, one product of length d per segment. */
  const gint64 n_parts = g->sum_exp ? S : 1;
  float *x = g_new (float, (gsize) n_parts * (gsize) ROW_TILE * (gsize) t->n_cols);
  /* sum_exp's usual shape (16 columns x 8 segments per key block) on
   * AVX-512: runs of whole key blocks in one call. */
#ifdef XATTN_HAVE_AVX512
  const gboolean batched = t->isa == SIFT_ISA_AVX512 && g->sum_exp && S == 8 && cols_per_kb == 16;
  float bm[BATCH_BLOCKS], bs[BATCH_BLOCKS];
#endif

  for (gint64 item = begin; item < end; item++)
    {
      gint32 h = (gint32) (item / t->tiles_per_head);
      /* Rows before col0 see none of these columns (row r sees c <= r). */
      gint64 first = MAX (s->row0, t->col0) + (item % t->tiles_per_head) * ROW_TILE;
      gint64 last = MIN (first + ROW_TILE, s->row0 + s->n_rows);
      if (first >= last)
        continue;
      gint64 nr = last - first;
      /* The tile's last row sees the most columns. */
      gint64 nc = MIN (t->n_cols, last - 1 - t->col0 + 1);
      const float *rows = s->qr + ((gsize) h * (gsize) s->n_rows + (gsize) (first - s->row0)) * s->rlen;
      const float *cols = t->k + (gsize) (h / group) * t->k_head_stride;
      if (t->kp != NULL)
        {
#ifdef XATTN_HAVE_AVX512
          /* Packed panels: the S products (sum_exp) or the summed
           * antidiagonal, columns 0 .. nc - 1 of this call. */
          xattn_dots_panels_avx512 (rows, s->rlen, nr, t->kp + (gsize) (h / group) * t->kp_head_stride, nc,
                                    g->sum_exp ? (gsize) d : s->rlen, n_parts, x);
#endif
        }
      else if (g->sum_exp)
        for (gint64 p = 0; p < S; p++)
          dots (t->isa, rows + p * d, s->rlen, nr, cols + p * d, s->rlen, nc, (gsize) d,
                x + (gsize) p * (gsize) nr * (gsize) nc);
      else
        dots (t->isa, rows, s->rlen, nr, cols, s->rlen, nc, s->rlen, x);

      for (gint64 i = 0; i < nr; i++)
        {
          gint64 r = first + i;
          gint64 visible = MIN (nc, r - t->col0 + 1);
          gsize off = ((gsize) h * (gsize) s->n_rows + (gsize) (r - s->row0)) * (gsize) s->n_kb;
          float *lmax = s->lmax + off, *lsum = s->lsum + off;
#ifdef XATTN_HAVE_AVX512
          /* Columns j < fast_end (c < r: no diagonal; c < kv_end / S: no
           * padding) of a row without padding may go through the batched
           * AVX-512 path, whole key blocks at a time. */
          const gint64 fast_end = batched && r * S + S - 1 < s->kv_end
                                    ? MIN (visible, MIN (r, s->kv_end / S) - t->col0) : 0;
#endif
          /* Per key block: the mass of its columns (max first, for
           * stability), merged into what earlier calls added. */
          for (gint64 j = 0; j < visible;)
            {
              gint64 c = t->col0 + j;
              gint64 kb = c / cols_per_kb;
#ifdef XATTN_HAVE_AVX512
              if (c % cols_per_kb == 0 && fast_end - j >= cols_per_kb)
                {
                  gint64 nb = MIN ((fast_end - j) / cols_per_kb, BATCH_BLOCKS);
                  xattn_block_masses_16x8_avx512 (x + i * nc + j, (gsize) nr * (gsize) nc, nb, g->scale / g->norm,
                                                  bm, bs);
                  for (gint64 b = 0; b < nb; b++)
                    mass_add (&lmax[kb + b], &lsum[kb + b], bm[b], bs[b]);
                  j += nb * cols_per_kb;
                  continue;
                }
#endif
              gint64 jend = MIN (visible, (kb + 1) * cols_per_kb - t->col0);
              float m, sum;
              if (!g->sum_exp)
                block_mass (t->isa, x + i * nc + j, 0, 1, jend - j, lscale, &m, &sum);
              else
                block_sum_exp (s, t->isa, x, nr, nc, i, r, t->col0, j, jend, &m, &sum);
              mass_add (&lmax[kb], &lsum[kb], m, sum);
              j = jend;
            }
        }
    }
  g_free (x);
}

static void score_columns (XattnScorer *s, AddTask *tp, gint64 n);

void
xattn_scorer_add_keys (XattnScorer *s, const SiftView *k, gint64 pos0, gint64 n)
{
  const XattnGeometry *g = &s->geo;
  const gint64 S = g->stride;
  g_return_if_fail (k != NULL && k->n_heads == g->n_kv_heads && k->head_dim == g->head_dim);
  g_return_if_fail (pos0 >= 0 && pos0 % S == 0 && n > 0 && k->n_tokens >= n);
  g_return_if_fail (pos0 + n <= s->kv_end);
  g_return_if_fail (n % S == 0 || pos0 + n == s->kv_end);

  /* Long ranges (the chunk's own keys) in pieces of about
   * XATTN_STAGE_TOKENS: each piece's columns (512 KiB packed, at head_dim
   * 128) then stay in L2 while every row tile reads them. */
  const gint64 piece = MAX (XATTN_STAGE_TOKENS / S, 1) * S;
  if (n > piece)
    {
      for (gint64 off = 0; off < n; off += piece)
        {
          SiftView part = sift_view_tokens (k, off, MIN (piece, n - off));
          xattn_scorer_add_keys (s, &part, pos0 + off, part.n_tokens);
        }
      return;
    }

  AddTask t = { .s = s, .col0 = pos0 / S, .n_cols = (n + S - 1) / S, .isa = xattn_dots_isa () };
  if (k->dtype == SIFT_DTYPE_F32 && k->token_stride == g->head_dim && n % S == 0)
    {
      /* Block layout already: a head's reshaped columns are contiguous rows. */
      t.k = k->data;
      t.k_head_stride = (gsize) k->head_stride;
    }
  else
    {
      gsize per_head = (gsize) t.n_cols * s->rlen;
      s->kbuf = grow (s->kbuf, &s->kbuf_cap, per_head * (gsize) g->n_kv_heads);
      memset (s->kbuf, 0, per_head * (gsize) g->n_kv_heads * sizeof (float));
      for (gint32 h = 0; h < g->n_kv_heads; h++)
        for (gint64 j = 0; j < n; j++)
          sift_view_row_to_f32 (k, h, j, s->kbuf + (gsize) h * per_head + (gsize) j * (gsize) g->head_dim);
      t.k = s->kbuf;
      t.k_head_stride = per_head;
    }

  score_columns (s, &t, n);
}

/* Scores t's columns against every row that sees them; on AVX-512 packs
 * them first unless t->kp already holds them. */
static void
score_columns (XattnScorer *s, AddTask *tp, gint64 n)
{
  const XattnGeometry *g = &s->geo;
  AddTask t = *tp;
  gint64 first_row = MAX (s->row0, t.col0);
  gint64 rows = s->row0 + s->n_rows - first_row;
  if (rows <= 0)
    return;
  if (t.isa == SIFT_ISA_AVX512 && t.kp == NULL)
    {
      /* Columns along the lanes (xattn_dots_panels_avx512): each kv head's
       * columns packed once, for every row of its q heads. */
      PackTask pt = { t.k, t.k_head_stride, n, (t.n_cols + 15) / 16, g->stride, g->head_dim, NULL,
                      (gsize) ((t.n_cols + 15) / 16) * 16 * s->rlen };
      s->kpack = grow_aligned (s->kpack, &s->kpack_cap, pt.dst_head_stride * (gsize) g->n_kv_heads);
      pt.dst = s->kpack;
      sift_parallel_for ((gint64) g->n_kv_heads * pt.n_panels, 1, pack_range, &pt);
      t.kp = s->kpack;
      t.kp_head_stride = pt.dst_head_stride;
    }
  t.tiles_per_head = (rows + ROW_TILE - 1) / ROW_TILE;
  sift_parallel_for ((gint64) g->n_q_heads * t.tiles_per_head, 1, add_range, &t);
}

/* Panels per kv head of the packed stage. */
static gsize
stage_panels (const XattnScorer *s)
{
  const gint64 S = s->geo.stride, cols = (XATTN_STAGE_TOKENS + S - 1) / S;
  return (gsize) ((cols + 15) / 16);
}

static void
stage_flush (XattnScorer *s)
{
  if (s->stage_n == 0)
    return;
  const XattnGeometry *g = &s->geo;
  if (s->stage_packed)
    {
      AddTask t = { .s = s, .col0 = s->stage_pos0 / g->stride, .n_cols = (s->stage_n + g->stride - 1) / g->stride,
                    .isa = SIFT_ISA_AVX512, .kp = s->spack, .kp_head_stride = stage_panels (s) * 16 * s->rlen };
      gint64 n = s->stage_n;
      s->stage_n = 0;
      /* Lanes past the last column are never read into a result; zeros
       * keep them free of NaN or denormal leftovers. */
      for (gint32 h = 0; h < g->n_kv_heads; h++)
        zero_tail_lanes (s->spack + (gsize) h * t.kp_head_stride, t.n_cols, s->rlen);
      score_columns (s, &t, n);
      return;
    }
  SiftView v = sift_view_strided (s->stage, SIFT_DTYPE_F32, g->n_kv_heads, s->stage_n, g->head_dim,
                                  (gint64) XATTN_STAGE_TOKENS * g->head_dim, g->head_dim);
  s->stage_n = 0;
  xattn_scorer_add_keys (s, &v, s->stage_pos0, v.n_tokens);
}

void
xattn_scorer_stage_keys (XattnScorer *s, const SiftView *k, gint64 pos0, gint64 n)
{
  const XattnGeometry *g = &s->geo;
  g_return_if_fail (k != NULL && k->n_heads == g->n_kv_heads && k->head_dim == g->head_dim);
  g_return_if_fail (pos0 >= 0 && pos0 % g->stride == 0 && n > 0 && k->n_tokens >= n);
  if (s->stage_n > 0 && (pos0 != s->stage_pos0 + s->stage_n || s->stage_n + n > XATTN_STAGE_TOKENS))
    stage_flush (s);
  if (n > XATTN_STAGE_TOKENS)
    {
      xattn_scorer_add_keys (s, k, pos0, n);
      return;
    }
  if (s->stage_n == 0)
    {
      s->stage_pos0 = pos0;
      s->stage_packed = xattn_dots_isa () == SIFT_ISA_AVX512;
    }
  if (s->stage_packed)
    {
      /* Straight into the packed panels (no staging copy): columns from
       * (pos0 - stage_pos0) / S on; f16 / bf16 rows through kbuf first. */
      const gsize per_head = stage_panels (s) * 16 * s->rlen;
      s->spack = grow_aligned (s->spack, &s->spack_cap, per_head * (gsize) g->n_kv_heads);
      const gint64 col0 = (pos0 - s->stage_pos0) / g->stride;
      for (gint32 h = 0; h < g->n_kv_heads; h++)
        {
          const float *src;
          gsize src_stride;
          if (k->dtype == SIFT_DTYPE_F32)
            {
              src = sift_view_row (k, h, 0);
              src_stride = (gsize) k->token_stride;
            }
          else
            {
              s->kbuf = grow (s->kbuf, &s->kbuf_cap, (gsize) n * (gsize) g->head_dim);
              for (gint64 t = 0; t < n; t++)
                sift_view_row_to_f32 (k, h, t, s->kbuf + (gsize) t * (gsize) g->head_dim);
              src = s->kbuf;
              src_stride = (gsize) g->head_dim;
            }
          xattn_pack_panels_at (src, src_stride, n, g->stride, g->head_dim, col0, s->spack + (gsize) h * per_head);
        }
    }
  else
    {
      if (s->stage == NULL)
        s->stage = g_new (float, (gsize) g->n_kv_heads * XATTN_STAGE_TOKENS * (gsize) g->head_dim);
      for (gint32 h = 0; h < g->n_kv_heads; h++)
        for (gint64 t = 0; t < n; t++)
          sift_view_row_to_f32 (k, h, t,
                                s->stage + ((gsize) h * XATTN_STAGE_TOKENS + (gsize) (s->stage_n + t)) * (gsize) g->head_dim);
    }
  s->stage_n += n;
  /* A partial column ends what can be scored together. */
  if (n % g->stride != 0)
    stage_flush (s);
}

gint64
xattn_scorer_first_qb (const XattnScorer *s)
{
  return s->q_pos / s->geo.block;
}

gint64
xattn_scorer_n_qb (const XattnScorer *s)
{
  return (s->kv_end - 1) / s->geo.block - s->q_pos / s->geo.block + 1;
}

gint64
xattn_scorer_n_kb (const XattnScorer *s)
{
  return s->n_kb;
}

gint64
xattn_scorer_n_rows (const XattnScorer *s)
{
  return s->n_rows;
}

/* Row i's softmax over key blocks, from its per-block masses lsum e^lmax:
 * into out[kb] (added when add, else written); FALSE if the row saw no key.
 * Relative to the largest lmax each term is at most lsum (<= the entries
 * summed), so nothing overflows. */
static gboolean
row_mass (const XattnScorer *s, gint32 h, gint64 i, float *out, gboolean add)
{
  gsize off = ((gsize) h * (gsize) s->n_rows + (gsize) i) * (gsize) s->n_kb;
  const float *lmax = s->lmax + off, *lsum = s->lsum + off;
  float m = -INFINITY;
  for (gint64 kb = 0; kb < s->n_kb; kb++)
    m = MAX (m, lmax[kb]);
  if (m == -INFINITY)
    return FALSE;
  double total = 0.0;
  for (gint64 kb = 0; kb < s->n_kb; kb++)
    total += (double) lsum[kb] * exp ((double) (lmax[kb] - m));
  for (gint64 kb = 0; kb < s->n_kb; kb++)
    {
      float p = (float) ((double) lsum[kb] * exp ((double) (lmax[kb] - m)) / total);
      out[kb] = add ? out[kb] + p : p;
    }
  return TRUE;
}

void
xattn_scorer_finish (XattnScorer *s, float *scores)
{
  const XattnGeometry *g = &s->geo;
  const gint64 n_qb = xattn_scorer_n_qb (s), qb0 = xattn_scorer_first_qb (s);
  stage_flush (s);
  memset (scores, 0, (gsize) g->n_q_heads * (gsize) n_qb * (gsize) s->n_kb * sizeof (float));
  for (gint32 h = 0; h < g->n_q_heads; h++)
    for (gint64 i = 0; i < s->n_rows; i++)
      {
        gint64 qb = (s->row0 + i) * g->stride / g->block - qb0;
        row_mass (s, h, i, scores + ((gsize) h * (gsize) n_qb + (gsize) qb) * (gsize) s->n_kb, TRUE);
      }
}

void
xattn_scorer_finish_rows (XattnScorer *s, float *mass)
{
  const XattnGeometry *g = &s->geo;
  stage_flush (s);
  for (gint32 h = 0; h < g->n_q_heads; h++)
    for (gint64 i = 0; i < s->n_rows; i++)
      {
        float *out = mass + ((gsize) h * (gsize) s->n_rows + (gsize) i) * (gsize) s->n_kb;
        if (!row_mass (s, h, i, out, FALSE))
          memset (out, 0, (gsize) s->n_kb * sizeof (float));
      }
}
