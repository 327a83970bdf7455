/* Subquadratic sparse attention: candidates, landmarks and the whole-
 * sequence forward (plain and tiled). See sq-core.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sift/plugin.h>

#include "sq-core.h"
#include "sq-simd.h"

static const gint64 default_globals[] = { 0 };

void
sq_config_default (SqConfig *config)
{
  *config = (SqConfig) {
    .window = 128,
    .block_size = 64,
    .globals = default_globals,
    .n_globals = G_N_ELEMENTS (default_globals),
    .causal = TRUE,
    .log_stride = TRUE,
    .landmarks = TRUE,
    .sort_candidates = FALSE,
  };
}

/* ---- Stamps ------------------------------------------------------------ */

void
sq_stamp_init (SqStamp *s)
{
  *s = (SqStamp) { 0 };
}

void
sq_stamp_clear (SqStamp *s)
{
  g_free (s->marks);
  sq_stamp_init (s);
}

void
sq_stamp_next (SqStamp *s, gint64 n)
{
  if (n > s->capacity)
    {
      gint64 cap = MAX (n, 2 * s->capacity);
      s->marks = g_renew (guint32, s->marks, (gsize) cap);
      memset (s->marks + s->capacity, 0, (gsize) (cap - s->capacity) * sizeof (guint32));
      s->capacity = cap;
    }
  if (++s->stamp == 0)
    {
      /* 2^32 rows later the stamps wrap: forget every mark once. */
      memset (s->marks, 0, (gsize) s->capacity * sizeof (guint32));
      s->stamp = 1;
    }
}

static inline void
push_unique (SqStamp *s, gint64 j, gint64 *out, gsize *n)
{
  if (s->marks[j] != s->stamp)
    {
      s->marks[j] = s->stamp;
      out[(*n)++] = j;
    }
}

/* ---- Candidates -------------------------------------------------------- */

static int
cmp_gint64 (const void *a, const void *b)
{
  gint64 x = *(const gint64 *) a, y = *(const gint64 *) b;
  return (x > y) - (x < y);
}

static gint64
n_strides (gint64 n)
{
  gint64 k = 0;
  for (gint64 s = 1; s < n; s *= 2)
    k++;
  return k;
}

gsize
sq_max_token_candidates (const SqConfig *c, gint64 seq)
{
  gint64 span = c->causal ? c->window + 1 : 2 * c->window + 1;
  gint64 strides = c->log_stride ? (c->causal ? 1 : 2) * n_strides (seq) : 0;
  return (gsize) (MIN (span, MAX (seq, 1)) + (gint64) c->n_globals + strides);
}

gsize
sq_max_landmark_candidates (const SqConfig *c, gint64 seq)
{
  if (!c->landmarks)
    return 0;
  gint64 n_blocks = (seq + c->block_size - 1) / c->block_size;
  return (gsize) (3 + (c->log_stride ? 2 * n_strides (n_blocks) : 0));
}

/* sq_token_candidates, or with `window` FALSE only those outside the
 * window (what the band kernel leaves to the other paths), in the same
 * relative order. */
static gsize
token_candidates (const SqConfig *c, gint64 i, gint64 seq, SqStamp *stamp, gint64 *out, gboolean window)
{
  g_assert (i >= 0 && i < seq && stamp->capacity >= seq);
  gsize n = 0;
  gint64 lo = MAX (i - c->window, 0);
  gint64 hi = c->causal ? i : MIN (i + c->window, seq - 1);

  /* The window is one range: it needs no marks, the others test against it. */
  for (gint64 j = lo; window && j <= hi; j++)
    out[n++] = j;
  for (gsize x = 0; x < c->n_globals; x++)
    {
      gint64 g = c->globals[x];
      if (g >= 0 && g < seq && (!c->causal || g <= i) && (g < lo || g > hi))
        push_unique (stamp, g, out, &n);
    }
  if (c->log_stride)
    for (gint64 s = 1; s < seq; s *= 2)
      {
        if (i >= s && i - s < lo)
          push_unique (stamp, i - s, out, &n);
        if (!c->causal && i + s < seq && i + s > hi)
          push_unique (stamp, i + s, out, &n);
      }
  if (c->sort_candidates)
    qsort (out, n, sizeof (gint64), cmp_gint64);
  return n;
}

gsize
sq_token_candidates (const SqConfig *c, gint64 i, gint64 seq, SqStamp *stamp, gint64 *out)
{
  return token_candidates (c, i, seq, stamp, out, TRUE);
}

gsize
sq_landmark_candidates (const SqConfig *c, gint64 i, gint64 seq, SqStamp *stamp, gint64 *out)
{
  g_assert (i >= 0 && i < seq);
  gsize n = 0;
  if (!c->landmarks)
    return 0;
  gint64 bs = c->block_size;
  gint64 n_blocks = (seq + bs - 1) / bs;
  gint64 cur = i / bs;
  /* Causal: only complete blocks at or before i; their last is the pivot. */
  gint64 avail = c->causal ? (i + 1) / bs : n_blocks;
  if (avail == 0)
    return 0;
  g_assert (stamp->capacity >= n_blocks);
  gint64 pivot = c->causal ? avail - 1 : MIN (cur, n_blocks - 1);

  for (gint64 b = MAX (pivot - 1, 0); b <= MIN (pivot + 1, avail - 1); b++)
    if (c->causal || b != cur)
      push_unique (stamp, b, out, &n);
  if (c->log_stride)
    for (gint64 s = 1; s < n_blocks; s *= 2)
      {
        if (pivot >= s && (c->causal || pivot - s != cur))
          push_unique (stamp, pivot - s, out, &n);
        if (!c->causal && pivot + s < n_blocks && pivot + s != cur)
          push_unique (stamp, pivot + s, out, &n);
      }
  if (c->sort_candidates)
    qsort (out, n, sizeof (gint64), cmp_gint64);
  return n;
}

gint64
sq_count_edges (const SqConfig *c, gint64 seq)
{
  SqStamp ts, bs;
  sq_stamp_init (&ts);
  sq_stamp_init (&bs);
  g_autofree gint64 *tok = g_new (gint64, sq_max_token_candidates (c, seq));
  g_autofree gint64 *blk = g_new (gint64, sq_max_landmark_candidates (c, seq) + 1);
  gint64 n_blocks = (seq + c->block_size - 1) / c->block_size;
  gint64 total = 0;
  for (gint64 i = 0; i < seq; i++)
    {
      sq_stamp_next (&ts, seq);
      sq_stamp_next (&bs, MAX (n_blocks, 1));
      total += (gint64) sq_token_candidates (c, i, seq, &ts, tok);
      total += (gint64) sq_landmark_candidates (c, i, seq, &bs, blk);
    }
  sq_stamp_clear (&ts);
  sq_stamp_clear (&bs);
  return total;
}

/* ---- Landmarks ---------------------------------------------------------- */

/* Block b of kv head g: its mean key and value into ko, vo [d]. */
static void
landmark_block (const SiftView *k, const SiftView *v, gint64 block_size, gint32 g, gint64 b, float *ko,
                float *vo)
{
  const gint32 d = k->head_dim;
  gint64 t0 = b * block_size, t1 = MIN (t0 + block_size, k->n_tokens);
  sq_mean_rows (ko, sift_view_row (k, g, t0), k->token_stride, t1 - t0, d);
  sq_mean_rows (vo, sift_view_row (v, g, t0), v->token_stride, t1 - t0, d);
}

typedef struct {
  const SiftView *k, *v;
  gint64 block_size, n_blocks;
  float *lk, *lv;
} LandmarkJob;

static void
landmark_blocks (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  (void) worker;
  const LandmarkJob *job = user_data;
  const gint32 d = job->k->head_dim;
  for (gint64 x = begin; x < end; x++)
    landmark_block (job->k, job->v, job->block_size, (gint32) (x / job->n_blocks), x % job->n_blocks,
                    job->lk + x * d, job->lv + x * d);
}

void
sq_landmarks_compute (const SiftView *k, const SiftView *v, gint64 block_size, float *lk, float *lv)
{
  g_assert (k->dtype == SIFT_DTYPE_F32 && v->dtype == SIFT_DTYPE_F32);
  LandmarkJob job = { k, v, block_size, (k->n_tokens + block_size - 1) / block_size, lk, lv };
  sift_parallel_for (job.n_blocks * k->n_heads, 4, landmark_blocks, &job);
}

/* ---- Whole-sequence forward --------------------------------------------- */

gboolean
sq_check (const SqConfig *c, const SiftView *q, const SiftView *k, const SiftView *v,
          const SiftView *out, GError **error)
{
  if (!sift_view_check (q, "q", error) || !sift_view_check (k, "k", error)
      || !sift_view_check (v, "v", error) || !sift_view_check (out, "out", error))
    return FALSE;
  if (q->dtype != SIFT_DTYPE_F32 || k->dtype != SIFT_DTYPE_F32 || v->dtype != SIFT_DTYPE_F32
      || out->dtype != SIFT_DTYPE_F32)
    {
      g_set_error_literal (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID,
                           "subquadratic forward takes f32 q, k, v and out");
      return FALSE;
    }
  if (c->block_size < 1 || c->window < 0)
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID,
                   "block_size %" G_GINT64_FORMAT " must be >= 1 and window %" G_GINT64_FORMAT " >= 0",
                   c->block_size, c->window);
      return FALSE;
    }
  if (k->n_tokens != q->n_tokens || v->n_tokens != q->n_tokens || out->n_tokens != q->n_tokens
      || k->n_heads != v->n_heads || out->n_heads != q->n_heads || q->n_heads % k->n_heads != 0
      || k->head_dim != q->head_dim || v->head_dim != q->head_dim || out->head_dim != q->head_dim)
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_SHAPE,
                   "q [%d][%" G_GINT64_FORMAT "][%d], k [%d][%" G_GINT64_FORMAT "][%d], "
                   "v [%d][%" G_GINT64_FORMAT "][%d], out [%d][%" G_GINT64_FORMAT "][%d] do not "
                   "describe one sequence (q heads a multiple of kv heads)",
                   q->n_heads, q->n_tokens, q->head_dim, k->n_heads, k->n_tokens, k->head_dim,
                   v->n_heads, v->n_tokens, v->head_dim, out->n_heads, out->n_tokens, out->head_dim);
      return FALSE;
    }
  if (k->n_tokens > G_MAXINT32)
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_SHAPE,
                   "%" G_GINT64_FORMAT " tokens is more than one call handles", k->n_tokens);
      return FALSE;
    }
  return TRUE;
}

/* Per-worker buffers of one forward call. */
typedef struct {
  SqStamp ts, bs;
  gint64 *tok, *blk;   /* [max candidates] */
  gint32 *idx, *lidx;  /* the same as row indices */
  gint32 *band_idx;    /* [window + SQ_BAND_ROWS] */
  const float **kp, **vp; /* [SQ_BAND_ROWS][max_tok + max_blk] */
  float *lk, *lv;      /* causal forward: this worker's landmarks, [kv_heads][n_blocks][d] */
  gint64 lm_done;      /* blocks [0, lm_done) of lk, lv are computed */
  float *ring;         /* band panels: [kv_heads][ring_n][d][16], or NULL */
  SqSharedCache shared; /* band tiles' shared keys, packed */
  gint64 ring_n, ring_next; /* panels [ring_next - ring_n, ring_next) are packed */
  float *acc;          /* [head_dim], or [tile][head_dim] for the tiled forward */
  float *m, *l;        /* tiled: [tile] */
  gint32 *rows, *pos;  /* tiled: (row, key) pairs grouped by KV tile */
  gint64 *tile_start;  /* tiled: [n_tiles + 1] */
  gsize *row_start;    /* tiled: [tile + 1] into tok; [tile + 1] into blk after it */
} Worker;

typedef struct {
  const SqConfig *c;
  const SiftView *q, *k, *v;
  SiftView *out;
  float *lse;
  float scale;
  gint64 seq, n_blocks, tile, n_tiles;
  gsize max_tok, max_blk;
  float *lk, *lv;      /* f32 [kv_heads][n_blocks][d] (computed up front unless lazy_landmarks) */
  gboolean lazy_landmarks; /* causal band forward: each worker computes blocks as its rows reach them */
  Worker *workers;
} Forward;

static void
worker_alloc (Worker *w, const Forward *f, gboolean tiled)
{
  const gint32 d = f->q->head_dim;
  gsize rows = tiled ? (gsize) f->tile : SQ_BAND_ROWS;
  sq_stamp_init (&w->ts);
  sq_stamp_init (&w->bs);
  w->tok = g_new (gint64, f->max_tok * rows);
  w->blk = g_new (gint64, f->max_blk * rows + 1);
  w->idx = g_new (gint32, f->max_tok * rows);
  w->lidx = g_new (gint32, f->max_blk * rows + 1);
  w->acc = g_new (float, (gsize) d * rows);
  w->band_idx = g_new (gint32, f->c->window + SQ_BAND_ROWS + 1);
  w->kp = g_new (const float *, SQ_BAND_ROWS * (f->max_tok + f->max_blk));
  if (f->lazy_landmarks)
    {
      w->lk = g_new (float, (gsize) f->k->n_heads * f->n_blocks * d);
      w->lv = g_new (float, (gsize) f->k->n_heads * f->n_blocks * d);
    }
  w->vp = g_new (const float *, SQ_BAND_ROWS * (f->max_tok + f->max_blk));
  if (!tiled && f->c->causal && sq_simd_band (d) != NULL)
    {
      w->ring_n = f->c->window / 16 + SQ_BAND_ROWS / 16 + 3;
      w->ring = g_aligned_alloc ((gsize) w->ring_n * 16 * (gsize) d * (gsize) f->k->n_heads, sizeof (float), 64);
      sq_shared_cache_init (&w->shared, f->k->n_heads, d);
    }
  w->row_start = g_new (gsize, 2 * (rows + 1));
  if (tiled)
    {
      w->m = g_new (float, rows);
      w->l = g_new (float, rows);
      w->rows = g_new (gint32, f->max_tok * rows);
      w->pos = g_new (gint32, f->max_tok * rows);
      w->tile_start = g_new (gint64, f->n_tiles + 1);
    }
}

static void
worker_free (Worker *w)
{
  sq_stamp_clear (&w->ts);
  sq_stamp_clear (&w->bs);
  g_free (w->tok);
  g_free (w->blk);
  g_free (w->idx);
  g_free (w->lidx);
  g_free (w->acc);
  g_free (w->band_idx);
  g_free (w->kp);
  g_free (w->lk);
  g_free (w->lv);
  g_free (w->vp);
  g_aligned_free (w->ring);
  sq_shared_cache_clear (&w->shared);
  g_free (w->m);
  g_free (w->l);
  g_free (w->rows);
  g_free (w->pos);
  g_free (w->tile_start);
  g_free (w->row_start);
}

/* Candidates of row i into w->idx (n_tok) and w->lidx (n_blk) at the given
 * offsets; with `window` FALSE only the tokens outside the window. */
static void
row_candidates (const Forward *f, Worker *w, gint64 i, gsize tok_at, gsize blk_at, gsize *n_tok,
                gsize *n_blk, gboolean window)
{
  sq_stamp_next (&w->ts, f->seq);
  sq_stamp_next (&w->bs, MAX (f->n_blocks, 1));
  *n_tok = token_candidates (f->c, i, f->seq, &w->ts, w->tok + tok_at, window);
  *n_blk = sq_landmark_candidates (f->c, i, f->seq, &w->bs, w->blk + blk_at);
  for (gsize x = 0; x < *n_tok; x++)
    w->idx[tok_at + x] = (gint32) w->tok[tok_at + x];
  for (gsize x = 0; x < *n_blk; x++)
    w->lidx[blk_at + x] = (gint32) w->blk[blk_at + x];
}

/* Rows in band tiles of SQ_BAND_ROWS (causal), or one row at a time. */
static void
forward_rows (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  const Forward *f = user_data;
  Worker *w = &f->workers[worker];
  const gint32 d = f->q->head_dim;
  const gint32 group = f->q->n_heads / f->k->n_heads;

  if (!f->c->causal)
    {
      SiftRowState st = { .acc = w->acc };
      for (gint64 i = begin; i < end; i++)
        {
          gsize n_tok, n_blk;
          row_candidates (f, w, i, 0, 0, &n_tok, &n_blk, TRUE);
          for (gint32 h = 0; h < f->q->n_heads; h++)
            {
              gint32 g = h / group;
              const float *q = sift_view_row (f->q, h, i);
              sift_row_state_reset (&st, d);
              /* Tokens first, then landmarks, through one running softmax. */
              sift_attend_row_sparse (&st, q, d, f->scale, sift_view_row (f->k, g, 0), sift_view_row (f->v, g, 0),
                             f->k->token_stride, w->idx, n_tok);
              if (n_blk > 0)
                sift_attend_row_sparse (&st, q, d, f->scale, f->lk + (gint64) g * f->n_blocks * d,
                               f->lv + (gint64) g * f->n_blocks * d, d, w->lidx, n_blk);
              sift_row_state_finish (&st, d, sift_view_row (f->out, h, i),
                               f->lse ? &f->lse[(gint64) h * f->seq + i] : NULL);
            }
        }
      return;
    }

  for (gint64 t0 = begin * SQ_BAND_ROWS; t0 < MIN (end * SQ_BAND_ROWS, f->seq); t0 += SQ_BAND_ROWS)
    {
      gint64 nr = MIN (SQ_BAND_ROWS, f->seq - t0);
      gsize *tok_start = w->row_start, *blk_start = w->row_start + SQ_BAND_ROWS + 1;
      tok_start[0] = blk_start[0] = 0;
      for (gint64 r = 0; r < nr; r++)
        {
          gsize n_tok, n_blk, kept = 0;
          gint64 i = t0 + r;
          row_candidates (f, w, i, tok_start[r], blk_start[r], &n_tok, &n_blk, FALSE);
          /* The window [i - window, i] is the band's; the rest is what remains. */
          for (gsize x = 0; x < n_tok; x++)
            if (w->idx[tok_start[r] + x] < i - f->c->window)
              w->idx[tok_start[r] + kept++] = w->idx[tok_start[r] + x];
          tok_start[r + 1] = tok_start[r] + kept;
          blk_start[r + 1] = blk_start[r] + n_blk;
        }
      /* Panels of this tile's windows not yet in the ring, every kv head. */
      gint64 p_lo = MAX (0, t0 - f->c->window) / 16, p_hi = (t0 + nr - 1) / 16;
      if (w->ring != NULL)
        {
          if (p_lo >= w->ring_next || p_lo < w->ring_next - w->ring_n)
            w->ring_next = p_lo;
          for (; w->ring_next <= p_hi; w->ring_next++)
            for (gint32 g = 0; g < f->k->n_heads; g++)
              {
                gint64 j0 = w->ring_next * 16;
                sq_pack_panels (sift_view_row (f->k, g, j0), f->k->token_stride, MIN (16, f->seq - j0), d,
                                w->ring + (g * w->ring_n + w->ring_next % w->ring_n) * 16 * d);
              }
        }
      /* Landmarks as the rows reach them: a block is computed when its last
       * token is in this tile's windows (its rows are still cached), or on
       * the first tile of a range that starts further on. */
      if (f->lazy_landmarks)
        {
          gint64 need = MIN (f->n_blocks, (t0 + nr) / f->c->block_size);
          for (; w->lm_done < need; w->lm_done++)
            for (gint32 g = 0; g < f->k->n_heads; g++)
              {
                gsize at = ((gsize) g * f->n_blocks + w->lm_done) * d;
                landmark_block (f->k, f->v, f->c->block_size, g, w->lm_done, w->lk + at, w->lv + at);
              }
        }
      SqTile t = {
        .q = sift_view_tokens (f->q, t0, nr),
        .out = sift_view_tokens (f->out, t0, nr),
        .k = *f->k, .v = *f->v,
        .lo = t0 - f->c->window, .hi = t0,
        .panels = w->ring, .panel_stride = w->ring_n * 16 * d, .ring = w->ring_n,
        .scale = f->scale,
        .idx = w->idx, .idx_start = tok_start,
        .lk = f->lazy_landmarks ? w->lk : f->lk, .lv = f->lazy_landmarks ? w->lv : f->lv,
        .l_n = f->n_blocks,
        .lidx = w->lidx, .lidx_start = blk_start,
        .lse = f->lse ? f->lse + t0 : NULL, .lse_stride = f->seq,
        .acc = w->acc, .band_idx = w->band_idx,
        .kp = w->kp, .vp = w->vp, .ptr_max = f->max_tok + f->max_blk,
        /* The next tile's strides are these rows' shifted by its size; they are far
         * behind the window, so fetch them while this tile computes. */
        .prefetch_shift = SQ_BAND_ROWS,
        .shared = w->shared.panels != NULL ? &w->shared : NULL,
      };
      sq_attend_tile (&t);
    }
}

/* Row block [r0, r0 + tile): every (row, key) pair bucketed by KV tile, the
 * buckets walked in ascending order per head, landmarks last. */
static void
forward_tile (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  const Forward *f = user_data;
  Worker *w = &f->workers[worker];
  const gint32 d = f->q->head_dim;
  const gint32 group = f->q->n_heads / f->k->n_heads;

  for (gint64 blk = begin; blk < end; blk++)
    {
      gint64 r0 = blk * f->tile, r1 = MIN (r0 + f->tile, f->seq);
      gint64 nr = r1 - r0;
      gsize *tok_start = w->row_start, *blk_start = w->row_start + nr + 1;
      tok_start[0] = blk_start[0] = 0;
      for (gint64 r = 0; r < nr; r++)
        {
          gsize n_tok, n_blk;
          row_candidates (f, w, r0 + r, tok_start[r], blk_start[r], &n_tok, &n_blk, TRUE);
          tok_start[r + 1] = tok_start[r] + n_tok;
          blk_start[r + 1] = blk_start[r] + n_blk;
        }

      /* Counting sort of the pairs by KV tile, stable in row order. */
      gint64 *ts = w->tile_start;
      memset (ts, 0, (gsize) (f->n_tiles + 1) * sizeof (gint64));
      for (gsize x = 0; x < tok_start[nr]; x++)
        ts[w->idx[x] / f->tile + 1]++;
      for (gint64 t = 0; t < f->n_tiles; t++)
        ts[t + 1] += ts[t];
      for (gint64 r = 0; r < nr; r++)
        for (gsize x = tok_start[r]; x < tok_start[r + 1]; x++)
          {
            gint64 at = ts[w->idx[x] / f->tile]++;
            w->rows[at] = (gint32) r;
            w->pos[at] = w->idx[x];
          }
      /* ts[t] now ends bucket t: bucket t is [ts[t - 1], ts[t]). */

      for (gint32 h = 0; h < f->q->n_heads; h++)
        {
          gint32 g = h / group;
          const float *kb = sift_view_row (f->k, g, 0), *vb = sift_view_row (f->v, g, 0);
          for (gint64 r = 0; r < nr; r++)
            {
              SiftRowState st = { .acc = w->acc + r * d };
              sift_row_state_reset (&st, d);
              w->m[r] = st.m;
              w->l[r] = st.l;
            }
          gint64 x = 0;
          while (x < ts[f->n_tiles - 1])
            {
              /* One run: consecutive pairs of one row inside one tile. */
              gint64 tile_end = ts[w->pos[x] / f->tile];
              gint32 r = w->rows[x];
              gint64 y = x + 1;
              while (y < tile_end && w->rows[y] == r)
                y++;
              SiftRowState st = { .m = w->m[r], .l = w->l[r], .acc = w->acc + (gint64) r * d };
              sift_attend_row_sparse (&st, sift_view_row (f->q, h, r0 + r), d, f->scale, kb, vb,
                             f->k->token_stride, w->pos + x, (gsize) (y - x));
              w->m[r] = st.m;
              w->l[r] = st.l;
              x = y;
            }
          for (gint64 r = 0; r < nr; r++)
            {
              SiftRowState st = { .m = w->m[r], .l = w->l[r], .acc = w->acc + r * d };
              gsize nb = blk_start[r + 1] - blk_start[r];
              if (nb > 0)
                sift_attend_row_sparse (&st, sift_view_row (f->q, h, r0 + r), d, f->scale,
                               f->lk + (gint64) g * f->n_blocks * d, f->lv + (gint64) g * f->n_blocks * d,
                               d, w->lidx + blk_start[r], nb);
              sift_row_state_finish (&st, d, sift_view_row (f->out, h, r0 + r),
                               f->lse ? &f->lse[(gint64) h * f->seq + r0 + r] : NULL);
            }
        }
    }
}

static gboolean
forward_run (const SqConfig *c, gint64 tile, const SiftView *q, const SiftView *k, const SiftView *v,
             SiftView *out, float *lse, GError **error)
{
  if (!sq_check (c, q, k, v, out, error))
    return FALSE;
  const gint64 seq = q->n_tokens;
  if (seq == 0)
    return TRUE;
  Forward f = {
    .c = c, .q = q, .k = k, .v = v, .out = out, .lse = lse,
    .scale = sift_attn_scale (0.0f, q->head_dim),
    .seq = seq,
    .n_blocks = (seq + c->block_size - 1) / c->block_size,
    .tile = tile,
    .n_tiles = tile > 0 ? (seq + tile - 1) / tile : 0,
    .max_tok = sq_max_token_candidates (c, seq),
    .max_blk = sq_max_landmark_candidates (c, seq),
  };
  f.lazy_landmarks = tile == 0 && c->causal && c->landmarks;
  gsize lm = c->landmarks && !f.lazy_landmarks ? (gsize) k->n_heads * (gsize) f.n_blocks * (gsize) q->head_dim : 0;
  g_autofree float *lk = g_new (float, lm + 1);
  g_autofree float *lv = g_new (float, lm + 1);
  if (lm > 0)
    sq_landmarks_compute (k, v, c->block_size, lk, lv);
  f.lk = lk;
  f.lv = lv;

  gint n_workers = sift_parallel_n_threads ();
  f.workers = g_new0 (Worker, n_workers);
  for (gint w = 0; w < n_workers; w++)
    worker_alloc (&f.workers[w], &f, tile > 0);
  if (tile > 0)
    sift_parallel_for ((seq + tile - 1) / tile, 1, forward_tile, &f);
  else
    sift_parallel_for (c->causal ? (seq + SQ_BAND_ROWS - 1) / SQ_BAND_ROWS : seq, c->causal ? 1 : 32,
                       forward_rows, &f);
  for (gint w = 0; w < n_workers; w++)
    worker_free (&f.workers[w]);
  g_free (f.workers);
  return TRUE;
}

gboolean
sq_forward (const SqConfig *c, const SiftView *q, const SiftView *k, const SiftView *v, SiftView *out,
            float *lse, GError **error)
{
  return forward_run (c, 0, q, k, v, out, lse, error);
}

gboolean
sq_forward_tiled (const SqConfig *c, gint64 tile, const SiftView *q, const SiftView *k,
                  const SiftView *v, SiftView *out, float *lse, GError **error)
{
  return forward_run (c, tile > 0 ? tile : 64, q, k, v, out, lse, error);
}
