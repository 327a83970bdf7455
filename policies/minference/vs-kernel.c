/* Vertical-slash sparse attention kernel.
 *
 * Per (query head, tile of rows): the leftover vertical columns of the
 * current key block (packed panels), then its merged slash ranges in
 * ascending key order, are fed VS_KEY_GROUP keys at a time to the inner
 * loop, which updates the tile's online softmax. A key of the block is fed
 * at most once per tile (ranges are disjoint, columns inside a range are
 * left to the range), so no key is counted twice, and the state carries over between
 * blocks, so any block split gives the same result up to rounding. */
#include <math.h>
#include <string.h>

#include <sift/plugin.h>

#include "vs.h"

/* ---- Streaming driver ------------------------------------------------------
 *
 * Key-stationary: a work item is one kv head and VS_CHUNK_ROWS query rows
 * (every tile of them, for every query head of the group). It walks the
 * block's key panels once, in order, and each panel, while it sits in L1,
 * serves every (query head, tile) whose mask meets it. A tile's mask in a
 * panel is a lane bitmask of its merged slash ranges. The head's vertical
 * columns of the block are packed 32 to a panel once per block (VsGroup
 * with positions) and every tile attends them as a few whole panels, less
 * the columns its slash ranges already hold (so no key is visited twice):
 * in the key walk they were one lane in each of ~1000 panels at 128K. */

#define VS_CHUNK_ROWS 128

struct _VsAttn {
  gint32 n_q_heads, n_kv_heads, d;
  gint64 q_pos;
  gint32 n_q;
  gint32 tile;
  gint64 n_tiles;
  gint32 chunk_rows;         /* rows per work item, a multiple of tile */
  VsWork *work;              /* the caller's, or own_work */
  VsWork *own_work;
  float *q;                  /* [n_q_heads][n_q][d], pre-scaled (in work) */
  float *m, *l;              /* [n_q_heads][n_q] (in work) */
  float *acc;                /* [n_q_heads][n_q][d] (in work) */
  const VsPattern *pattern;  /* [n_q_heads] */
  gsize max_ranges;          /* per (head, tile, block): at most n_slash */
  gsize scratch_per_worker;
  VsRange *scratch;          /* [n_threads][heads per group][tiles per chunk][max_ranges] */
  VsRange *rel;              /* per head, the merged ranges of a whole tile at rows [0, tile) */
  gsize *rel_first, *rel_n;  /* [n_q_heads]: head h's are rel[rel_first[h] ..][rel_n[h]] */
  guint64 *relbits;          /* per head, bit x - (its first rel start) set when x lies in a rel range */
  gsize *relbits_first;      /* [n_q_heads]: head h's words start at relbits[relbits_first[h]] */
  gint n_threads;
  gint64 *attended;          /* [n_q_heads * n_tiles] */
  float *kbuf, *vbuf;        /* f32 copies of non-f32 blocks */
  gsize kcap, vcap;
  float *panels;             /* the block's K by 32 keys: [n_kv_heads][n_panels][d][32] (in work) */
  gint64 n_panels;
  /* The block's vertical columns, per query head by 32: */
  gint64 *n_colpanels;       /* [n_q_heads] */
  gint64 max_colpanels;      /* the most of any head */
  VsGroup *colgrp;           /* [n_q_heads][max_colpanels], mask = lanes holding a column */
  float *colkt;              /* [n_q_heads][max_colpanels][d][32] (in work) */
  gint64 *colpos;            /* [n_q_heads][max_colpanels][32] */
  gsize colgrp_cap;          /* colgrp's room; colpos has the same in panels */
#ifdef VS_HAVE_AVX512
  VsPending *pending;        /* [n_threads][heads per group][tiles per chunk] */
  gsize pending_per_worker;
#endif
};

/* ---- Workspace ----------------------------------------------------------
 *
 * The large working buffers (the scaled query copy and the accumulators of
 * every row, the transposed K panels: hundreds of MiB at 128K) live in a
 * VsWork that a caller may keep across calls, on transparent huge pages
 * (sift_mem_alloc). Fresh memory costs a page fault and the kernel's
 * zeroing of every page on first touch: done inside each call, that was
 * about 5-8% of the sparse time (with g_new0 the accumulators even took two
 * faults per 4 KiB page, a zero-page read, then a copy-on-write),
 * docs/benchmarks.md, MInference, "the kernel's buffers on huge pages". A policy instance keeps one
 * for all its layers and chunks, so a run pays it once. */
enum { WORK_Q, WORK_ACC, WORK_M, WORK_L, WORK_PANELS, WORK_COLKT, WORK_N };

struct _VsWork {
  float *buf[WORK_N];
  gsize cap[WORK_N];  /* floats */
};

VsWork *
vs_work_new (void)
{
  return g_new0 (VsWork, 1);
}

void
vs_work_free (VsWork *w)
{
  if (w == NULL)
    return;
  for (int i = 0; i < WORK_N; i++)
    sift_mem_free (w->buf[i]);
  g_free (w);
}

/* Buffer `which` with room for n floats (contents not kept). New memory is
 * touched (zeroed) at once; with `zero` kept memory is zeroed too. Out of
 * memory aborts, as g_new does. */
static float *
work_floats (VsWork *w, int which, gsize n, gboolean zero)
{
  if (n <= w->cap[which])
    {
      if (zero)
        memset (w->buf[which], 0, n * sizeof (float));
      return w->buf[which];
    }
  if (n > G_MAXSIZE / sizeof (float))
    g_error ("minference: %" G_GSIZE_FORMAT " floats overflow", n);
  sift_mem_free (w->buf[which]);
  w->buf[which] = sift_mem_alloc0 (n * sizeof (float));
  if (w->buf[which] == NULL)
    g_error ("minference: out of memory allocating %" G_GSIZE_FORMAT " bytes", n * sizeof (float));
  w->cap[which] = n;
  return w->buf[which];
}

static gsize
panel_floats (gint64 n_keys, gint32 d)
{
  return (gsize) ((n_keys + VS_KEY_GROUP - 1) / VS_KEY_GROUP) * (gsize) d * VS_KEY_GROUP;
}

void
vs_work_reserve (VsWork *w, gint32 n_q_heads, gint64 n_q, gint32 d, gint32 n_kv_heads, gint64 block_keys,
                 gint64 max_vertical)
{
  const gsize rows = (gsize) n_q_heads * (gsize) n_q;
  work_floats (w, WORK_Q, rows * d, FALSE);
  work_floats (w, WORK_ACC, rows * d, FALSE);
  work_floats (w, WORK_M, rows, FALSE);
  work_floats (w, WORK_L, rows, FALSE);
  work_floats (w, WORK_PANELS, (gsize) n_kv_heads * panel_floats (block_keys, d), FALSE);
  work_floats (w, WORK_COLKT, (gsize) n_q_heads * panel_floats (MIN (max_vertical, block_keys), d), FALSE);
}

VsAttn *
vs_attn_new (const SiftView *q, gint64 q_pos, gint32 n_kv_heads, float scale, gint32 tile,
             const VsPattern *pattern, VsWork *work)
{
  g_return_val_if_fail (q->dtype == SIFT_DTYPE_F32 && q->n_heads % n_kv_heads == 0, NULL);
  g_return_val_if_fail (tile >= 1 && tile <= VS_TILE_MAX, NULL);
  VsAttn *a = g_new0 (VsAttn, 1);
  a->n_q_heads = q->n_heads;
  a->n_kv_heads = n_kv_heads;
  a->d = q->head_dim;
  a->q_pos = q_pos;
  a->n_q = (gint32) q->n_tokens;
  a->tile = tile;
  a->n_tiles = (a->n_q + tile - 1) / tile;
  a->chunk_rows = tile * MAX (1, VS_CHUNK_ROWS / tile);
  a->pattern = pattern;
  if (work == NULL)
    work = a->own_work = vs_work_new ();
  a->work = work;
  const gsize rows = (gsize) a->n_q_heads * a->n_q;
  a->q = work_floats (work, WORK_Q, rows * a->d, FALSE);
  a->acc = work_floats (work, WORK_ACC, rows * a->d, TRUE);
  a->m = work_floats (work, WORK_M, rows, FALSE);
  a->l = work_floats (work, WORK_L, rows, TRUE);
  for (gint32 h = 0; h < a->n_q_heads; h++)
    {
      a->max_ranges = MAX (a->max_ranges, pattern[h].n_slash);
      for (gint32 i = 0; i < a->n_q; i++)
        {
          const float *src = sift_view_row (q, h, i);
          float *dst = a->q + ((gsize) h * a->n_q + i) * a->d;
          for (gint32 c = 0; c < a->d; c++)
            dst[c] = src[c] * scale;
          a->m[(gsize) h * a->n_q + i] = -INFINITY;
        }
    }
  a->max_ranges = MAX (a->max_ranges, 1);
  /* A whole tile at rows [ta, ta + tile) meets the ranges below shifted by
   * ta: a tile's ranges are the same for every tile, up to the shift, so
   * they are merged once per head (vs_tile_ranges with no clipping) and the
   * kernel clips them to the key block and the panel as it walks. */
  gsize total = 0;
  for (gint32 h = 0; h < a->n_q_heads; h++)
    total += pattern[h].n_slash;
  a->rel = g_new (VsRange, MAX (total, 1));
  a->rel_first = g_new (gsize, a->n_q_heads);
  a->rel_n = g_new (gsize, a->n_q_heads);
  gsize off = 0;
  for (gint32 h = 0; h < a->n_q_heads; h++)
    {
      VsRange *r = a->rel + off;
      gsize n = 0;
      /* Descending d gives ascending starts. */
      for (gsize i = pattern[h].n_slash; i-- > 0;)
        {
          const gint64 d = pattern[h].slash[i];
          if (n > 0 && -d <= r[n - 1].end)
            r[n - 1].end = MAX (r[n - 1].end, tile - d);
          else
            r[n++] = (VsRange) { -d, tile - d };
        }
      a->rel_first[h] = off;
      a->rel_n[h] = n;
      off += n;
    }
  /* The same ranges as bitmaps: the column pass asks, per column and tile,
   * whether a range holds it. */
  a->relbits_first = g_new (gsize, a->n_q_heads);
  gsize words = 0;
  for (gint32 h = 0; h < a->n_q_heads; h++)
    {
      const VsRange *r = a->rel + a->rel_first[h];
      const gsize n = a->rel_n[h];
      a->relbits_first[h] = words;
      if (n > 0) /* ascending and disjoint: they span [r[0].start, r[n - 1].end) */
        words += (gsize) (r[n - 1].end - r[0].start + 63) / 64;
    }
  a->relbits = g_new0 (guint64, MAX (words, 1));
  for (gint32 h = 0; h < a->n_q_heads; h++)
    {
      const VsRange *r = a->rel + a->rel_first[h];
      guint64 *bits = a->relbits + a->relbits_first[h];
      for (gsize i = 0; i < a->rel_n[h]; i++)
        for (gint64 x = r[i].start - r[0].start; x < r[i].end - r[0].start; x++)
          bits[x / 64] |= (guint64) 1 << (x % 64);
    }
  a->n_colpanels = g_new0 (gint64, a->n_q_heads);
  a->attended = g_new0 (gint64, (gsize) a->n_q_heads * a->n_tiles);
  a->n_threads = sift_parallel_n_threads ();
  a->scratch_per_worker = (gsize) (a->n_q_heads / n_kv_heads) * (a->chunk_rows / tile) * a->max_ranges;
  a->scratch = g_new (VsRange, (gsize) a->n_threads * a->scratch_per_worker);
#ifdef VS_HAVE_AVX512
  if (tile <= 4)
    {
      a->pending_per_worker = (gsize) (a->n_q_heads / n_kv_heads) * (a->chunk_rows / tile);
      a->pending = g_new (VsPending, (gsize) a->n_threads * a->pending_per_worker);
    }
#endif
  return a;
}

void
vs_attn_free (VsAttn *a)
{
  if (a == NULL)
    return;
  vs_work_free (a->own_work);
  g_free (a->scratch);
  g_free (a->rel);
  g_free (a->rel_first);
  g_free (a->rel_n);
  g_free (a->relbits);
  g_free (a->relbits_first);
  g_free (a->n_colpanels);
  g_free (a->colgrp);
  g_free (a->colpos);
  g_free (a->attended);
  g_free (a->kbuf);
  g_free (a->vbuf);
#ifdef VS_HAVE_AVX512
  g_free (a->pending);
#endif
  g_free (a);
}

typedef struct {
  VsAttn *a;
  const SiftView *k, *v;  /* f32 */
  gint64 key0;
} BlockJob;

static void
transpose_range (gint64 begin, gint64 end, gint worker, gpointer data)
{
  (void) worker;
  const BlockJob *job = data;
  VsAttn *a = job->a;
  const gint64 n = job->k->n_tokens;
  for (gint64 item = begin; item < end; item++)
    {
      const gint32 g = (gint32) (item / a->n_panels);
      const gint64 p = item % a->n_panels;
      const float *krow[VS_KEY_GROUP];
      gint32 nk = (gint32) MIN (VS_KEY_GROUP, n - p * VS_KEY_GROUP);
      for (gint32 i = 0; i < nk; i++)
        krow[i] = sift_view_row (job->k, g, p * VS_KEY_GROUP + i);
      vs_transpose (krow, nk, a->d, a->panels + (gsize) item * a->d * VS_KEY_GROUP);
    }
}

static void
colpanel_range (gint64 begin, gint64 end, gint worker, gpointer data)
{
  (void) worker;
  VsAttn *a = data;
  for (gint64 item = begin; item < end; item++)
    {
      VsGroup *cg = &a->colgrp[item];
      if (item % a->max_colpanels < a->n_colpanels[item / a->max_colpanels])
        vs_transpose (cg->krow, __builtin_popcount (cg->mask), a->d, (float *) cg->kt);
    }
}

/* A tile's merged ranges: r[i] + shift, keys below `limit` (the block's end). */
typedef struct {
  const VsRange *r;
  gsize n, cur;
  gint64 shift, limit;
} Cursor;

/* Lanes of the panel at key `base` that a tile's merged ranges cover;
 * advances the cursor past ranges that end before the panel. */
static inline guint32
tile_mask (Cursor *c, gint64 base)
{
  guint32 mask = 0;
  const gint64 b = base - c->shift, top = MIN (base + VS_KEY_GROUP, c->limit) - c->shift;
  while (c->cur < c->n && c->r[c->cur].end <= b)
    c->cur++;
  for (gsize k = c->cur; k < c->n && c->r[k].start < top; k++)
    {
      gint64 s = MAX (c->r[k].start, b) - b, e = MIN (c->r[k].end, top) - b;
      mask |= (guint32) ((((guint64) 1 << e) - 1) & ~(((guint64) 1 << s) - 1));
    }
  return mask;
}

/* Index of the first of n ascending, disjoint ranges that ends after x. */
static gsize
first_ending_after (const VsRange *r, gsize n, gint64 x)
{
  gsize lo = 0, hi = n;
  while (lo < hi)
    {
      gsize mid = lo + (hi - lo) / 2;
      if (r[mid].end <= x)
        lo = mid + 1;
      else
        hi = mid;
    }
  return lo;
}

/* Lanes of column panel cg (among `lanes`) that the merged ranges of the
 * tile at rows [ta, tb) of head h hold: the key walk visits those. A whole
 * tile asks the head's bitmap at column - ta; the last, shorter tile its
 * own ranges (cursor c, absolute positions). */
static guint32
cols_in_ranges (const VsAttn *a, gint32 h, gint64 ta, gint64 tb, const Cursor *c, const VsGroup *cg,
                guint32 lanes)
{
  guint32 in = 0;
  if (tb - ta == a->tile)
    {
      const gsize n = a->rel_n[h];
      if (n == 0)
        return 0;
      const guint64 *bits = a->relbits + a->relbits_first[h];
      const VsRange *r = a->rel + a->rel_first[h];
      const gint64 lo = r[0].start, hi = r[n - 1].end;
      for (guint32 m = lanes; m; m &= m - 1)
        {
          const gint32 i = __builtin_ctz (m);
          const gint64 x = cg->pos[i] - ta;
          if (x >= lo && x < hi && (bits[(x - lo) / 64] >> ((x - lo) % 64) & 1))
            in |= 1u << i;
        }
      return in;
    }
  for (guint32 m = lanes; m; m &= m - 1)
    {
      const gint32 i = __builtin_ctz (m);
      const gsize k = first_ending_after (c->r, c->n, cg->pos[i] - c->shift);
      if (k < c->n && c->r[k].start <= cg->pos[i] - c->shift)
        in |= 1u << i;
    }
  return in;
}

/* The mask of column panel cg for the tile at rows [ta, tb): its columns
 * before tb that the tile's ranges do not hold. */
static inline guint32
cols_mask (const VsAttn *a, gint32 h, gint64 ta, gint64 tb, const Cursor *c, const VsGroup *cg)
{
  const guint32 lanes = cg->mask & vs_lanes_upto (cg, tb - 1);
  return lanes == 0 ? 0 : lanes & ~cols_in_ranges (a, h, ta, tb, c, cg, lanes);
}

#ifndef VS_HAVE_AVX512
typedef struct VsPendingNone VsPending; /* only ever NULL here */
#endif

/* Head h's rows [ta, tb) as the kernel's VsTile. */
static VsTile
tile_at (VsAttn *a, gint32 h, gint64 ta, gint64 tb)
{
  const gsize row = (gsize) h * a->n_q + (gsize) (ta - a->q_pos);
  return (VsTile) { a->q + row * a->d, ta, (gint32) (tb - ta), a->d, a->m + row, a->l + row,
                    a->acc + row * a->d, 0 };
}

/* Group g's lanes for tile `tile` of head h: into buffer pending[i] when
 * there are buffers (AVX-512), attended at once otherwise. */
static void
attend_tile (VsAttn *a, gint32 h, gint64 tile, gint64 ta, gint64 tb, VsPending *pending, gint64 i,
             const VsGroup *g)
{
  VsTile t = tile_at (a, h, ta, tb);
#ifdef VS_HAVE_AVX512
  if (pending != NULL)
    vs_pending_add_avx512 (&t, &pending[i], g);
  else
#endif
    vs_group_attend (&t, g);
  (void) pending;
  (void) i;
  a->attended[(gsize) h * a->n_tiles + tile] += t.attended;
}

#ifdef VS_HAVE_AVX512
/* Masks m0 / m1 of group g for the adjacent 4-row tiles `tile` (rows
 * [ta, tb)) and, when `two`, tile + 1 (rows [tb, tb1)) of head h, scored in
 * one pass; pd[0], pd[1] are their buffers. */
static void
pending_pair (VsAttn *a, gint32 h, gint64 tile, gboolean two, gint64 ta, gint64 tb, gint64 tb1, VsPending *pd,
              guint32 m0, guint32 m1, const VsGroup *g)
{
  VsTile t0 = tile_at (a, h, ta, tb), t1 = { 0 };
  if (two)
    t1 = tile_at (a, h, tb, tb1);
  vs_pending_add2_avx512 (&t0, pd, m0, &t1, two ? pd + 1 : NULL, m1, g);
  a->attended[(gsize) h * a->n_tiles + tile] += t0.attended;
  if (two)
    a->attended[(gsize) h * a->n_tiles + tile + 1] += t1.attended;
}
#endif

static void
chunk_item (const BlockJob *job, gint64 item, gint worker)
{
  VsAttn *a = job->a;
  const gint32 hg = a->n_q_heads / a->n_kv_heads;
  const gint64 n_chunks = (a->n_q + a->chunk_rows - 1) / a->chunk_rows;
  const gint32 g = (gint32) (item / n_chunks);
  const gint64 row0 = (item % n_chunks) * a->chunk_rows;
  const gint64 row1 = MIN (row0 + a->chunk_rows, a->n_q);
  const gint64 t0 = row0 / a->tile, nt = (row1 - row0 + a->tile - 1) / a->tile;
  const gint64 key_end = MIN (job->key0 + job->k->n_tokens, a->q_pos + row1);
  if (job->key0 >= key_end)
    return;
  Cursor cur[hg * nt];
  VsRange *scratch = a->scratch + (gsize) worker * a->scratch_per_worker;
  for (gint32 hh = 0; hh < hg; hh++)
    for (gint64 t = 0; t < nt; t++)
      {
        const gint64 ta = a->q_pos + (t0 + t) * a->tile, tb = MIN (ta + a->tile, a->q_pos + a->n_q);
        const gint32 h = g * hg + hh;
        if (tb - ta == a->tile)
          {
            const VsRange *r = a->rel + a->rel_first[h];
            const gsize n = a->rel_n[h];
            cur[hh * nt + t] = (Cursor) { r, n, first_ending_after (r, n, job->key0 - ta), ta, key_end };
            continue;
          }
        VsRange *r = scratch + ((gsize) hh * nt + t) * a->max_ranges;
        cur[hh * nt + t] = (Cursor) { r, vs_tile_ranges (&a->pattern[h], ta, tb, job->key0, key_end, r), 0, 0,
                                      key_end };
      }
  const gint64 last_panel = (key_end - job->key0 + VS_KEY_GROUP - 1) / VS_KEY_GROUP;
#ifdef VS_HAVE_AVX512
  /* Tiles of at most 4 rows buffer their scored keys (see VsPending). */
  const gboolean pend = vs_isa () >= SIFT_ISA_AVX512 && a->tile <= 4 && a->d % 16 == 0;
  VsPending *pending = pend ? a->pending + (gsize) worker * a->pending_per_worker : NULL;
  for (gint64 i = 0; pend && i < hg * nt; i++)
    pending[i].n = 0;
#else
  VsPending *pending = NULL; /* no buffering without AVX-512 */
#endif
  /* The head's columns first, as whole panels; the cursors are still at
   * the block's start. */
  for (gint32 hh = 0; hh < hg; hh++)
    {
      const gint32 h = g * hg + hh;
      for (gint64 cp = 0; cp < a->n_colpanels[h]; cp++)
        {
          VsGroup cg = a->colgrp[(gsize) h * a->max_colpanels + cp];
          if (cg.pos[0] >= key_end)
            break;
#ifdef VS_HAVE_AVX512
          for (gint64 t = 0; pend && a->tile == 4 && t < nt; t += 2)
            {
              const gint64 ta = a->q_pos + (t0 + t) * a->tile;
              const gint64 tb1 = MIN (ta + 2 * a->tile, a->q_pos + a->n_q);
              if (cg.pos[0] >= tb1)
                continue;
              const gint64 tb = MIN (ta + a->tile, tb1);
              const guint32 m0 = cols_mask (a, h, ta, tb, &cur[hh * nt + t], &cg);
              const guint32 m1 = t + 1 < nt ? cols_mask (a, h, tb, tb1, &cur[hh * nt + t + 1], &cg) : 0;
              if (m0 == 0 && m1 == 0)
                continue;
              pending_pair (a, h, t0 + t, t + 1 < nt, ta, tb, tb1, &pending[hh * nt + t], m0, m1, &cg);
            }
          if (pend && a->tile == 4)
            continue;
#endif
          const guint32 lanes = cg.mask;
          for (gint64 t = 0; t < nt; t++)
            {
              const gint64 ta = a->q_pos + (t0 + t) * a->tile, tb = MIN (ta + a->tile, a->q_pos + a->n_q);
              if (cg.pos[0] >= tb)
                continue;
              cg.mask = lanes;
              cg.mask = cols_mask (a, h, ta, tb, &cur[hh * nt + t], &cg);
              if (cg.mask == 0)
                continue;
              attend_tile (a, h, t0 + t, ta, tb, pending, hh * nt + t, &cg);
            }
        }
    }
  VsGroup grp = { .pos = NULL };
  for (gint64 pi = 0; pi < last_panel; pi++)
    {
      const gint64 base = job->key0 + pi * VS_KEY_GROUP;
      const gint32 nk = (gint32) MIN (VS_KEY_GROUP, job->key0 + job->k->n_tokens - base);
      grp.kt = a->panels + ((gsize) g * a->n_panels + pi) * a->d * VS_KEY_GROUP;
      grp.key0 = base;
      for (gint32 i = 0; i < nk; i++)
        {
          grp.krow[i] = sift_view_row (job->k, g, base - job->key0 + i);
          grp.vrow[i] = sift_view_row (job->v, g, base - job->key0 + i);
        }
      for (gint32 hh = 0; hh < hg; hh++)
        {
          const gint32 h = g * hg + hh;
#ifdef VS_HAVE_AVX512
          /* 4-row tiles go in adjacent pairs: one panel pass scores both. */
          for (gint64 t = 0; pend && a->tile == 4 && t < nt; t += 2)
            {
              const gint64 ta = a->q_pos + (t0 + t) * a->tile;
              const gint64 tb1 = MIN (ta + 2 * a->tile, a->q_pos + a->n_q);
              if (base >= tb1)
                continue; /* every row of both tiles precedes the panel */
              const gint64 tb = MIN (ta + a->tile, tb1);
              const guint32 m0 = base < tb ? tile_mask (&cur[hh * nt + t], base) : 0;
              const guint32 m1 = t + 1 < nt ? tile_mask (&cur[hh * nt + t + 1], base) : 0;
              if (m0 == 0 && m1 == 0)
                continue;
              pending_pair (a, h, t0 + t, t + 1 < nt, ta, tb, tb1, &pending[hh * nt + t], m0, m1, &grp);
            }
          if (pend && a->tile == 4)
            continue;
#endif
          for (gint64 t = 0; t < nt; t++)
            {
              const gint64 ta = a->q_pos + (t0 + t) * a->tile, tb = MIN (ta + a->tile, a->q_pos + a->n_q);
              if (base >= tb)
                continue; /* every row of this tile precedes the panel */
              const guint32 mask = tile_mask (&cur[hh * nt + t], base);
              if (mask == 0)
                continue;
              grp.mask = mask;
              attend_tile (a, h, t0 + t, ta, tb, pending, hh * nt + t, &grp);
            }
        }
    }
#ifdef VS_HAVE_AVX512
  for (gint32 hh = 0; pend && hh < hg; hh++)
    for (gint64 t = 0; t < nt; t++)
      {
        const gint32 h = g * hg + hh;
        const gint64 ta = a->q_pos + (t0 + t) * a->tile, tb = MIN (ta + a->tile, a->q_pos + a->n_q);
        const gsize row = (gsize) h * a->n_q + (gsize) (ta - a->q_pos);
        VsTile tile = { a->q + row * a->d, ta, (gint32) (tb - ta), a->d, a->m + row, a->l + row,
                        a->acc + row * a->d, 0 };
        vs_pending_flush_avx512 (&tile, &pending[hh * nt + t]);
        a->attended[(gsize) h * a->n_tiles + t0 + t] += tile.attended;
      }
#endif
}

static void
chunk_range (gint64 begin, gint64 end, gint worker, gpointer data)
{
  for (gint64 item = begin; item < end; item++)
    chunk_item (data, item, worker);
}

void
vs_attn_block (VsAttn *a, const SiftView *k, const SiftView *v, gint64 key0)
{
  g_return_if_fail (k->n_heads == a->n_kv_heads && v->n_heads == a->n_kv_heads);
  g_return_if_fail (k->head_dim == a->d && v->head_dim == a->d && k->n_tokens == v->n_tokens);
  if (k->n_tokens == 0 || key0 >= a->q_pos + a->n_q)
    return;
  SiftView kf = vs_view_f32 (k, &a->kbuf, &a->kcap);
  SiftView vf = vs_view_f32 (v, &a->vbuf, &a->vcap);
  BlockJob job = { a, &kf, &vf, key0 };
  g_assert (sift_parallel_n_threads () <= a->n_threads);
  /* K transposed once per block, shared by every tile and query head. */
  a->n_panels = (k->n_tokens + VS_KEY_GROUP - 1) / VS_KEY_GROUP;
  a->panels = work_floats (a->work, WORK_PANELS, (gsize) a->n_kv_heads * panel_floats (k->n_tokens, a->d), FALSE);
  /* The block's columns per head, packed 32 to a panel. */
  const gint32 hg = a->n_q_heads / a->n_kv_heads;
  gsize first[a->n_q_heads];
  a->max_colpanels = 0;
  for (gint32 h = 0; h < a->n_q_heads; h++)
    {
      const VsPattern *p = &a->pattern[h];
      first[h] = sift_lower_bound (p->vertical, p->n_vertical, key0);
      const gsize end = sift_lower_bound (p->vertical, p->n_vertical, key0 + k->n_tokens);
      a->n_colpanels[h] = (gint64) (end - first[h] + VS_KEY_GROUP - 1) / VS_KEY_GROUP;
      a->max_colpanels = MAX (a->max_colpanels, a->n_colpanels[h]);
    }
  const gsize n_cg = (gsize) a->n_q_heads * a->max_colpanels;
  a->colkt = work_floats (a->work, WORK_COLKT, n_cg * a->d * VS_KEY_GROUP, FALSE);
  if (n_cg > a->colgrp_cap)
    {
      g_free (a->colgrp);
      g_free (a->colpos);
      a->colgrp = g_new (VsGroup, n_cg);
      a->colpos = g_new (gint64, n_cg * VS_KEY_GROUP);
      a->colgrp_cap = n_cg;
    }
  for (gint32 h = 0; h < a->n_q_heads; h++)
    {
      const VsPattern *p = &a->pattern[h];
      for (gint64 cp = 0; cp < a->n_colpanels[h]; cp++)
        {
          const gsize idx = (gsize) h * a->max_colpanels + cp;
          VsGroup *cg = &a->colgrp[idx];
          gint64 *pos = a->colpos + idx * VS_KEY_GROUP;
          *cg = (VsGroup) { .kt = a->colkt + idx * a->d * VS_KEY_GROUP, .pos = pos };
          for (gint32 i = 0; i < VS_KEY_GROUP; i++)
            {
              const gsize c = first[h] + (gsize) cp * VS_KEY_GROUP + i;
              if (c < p->n_vertical && p->vertical[c] < key0 + k->n_tokens)
                {
                  pos[i] = p->vertical[c];
                  cg->krow[i] = sift_view_row (&kf, h / hg, pos[i] - key0);
                  cg->vrow[i] = sift_view_row (&vf, h / hg, pos[i] - key0);
                  cg->mask |= 1u << i;
                }
              else
                {
                  pos[i] = G_MAXINT64;
                  cg->krow[i] = cg->krow[0];
                  cg->vrow[i] = cg->vrow[0];
                }
            }
          cg->key0 = pos[0];
        }
    }
  sift_parallel_for ((gint64) n_cg, 4, colpanel_range, a);
  sift_parallel_for ((gint64) a->n_kv_heads * a->n_panels, 16, transpose_range, &job);
  const gint64 n_chunks = (a->n_q + a->chunk_rows - 1) / a->chunk_rows;
  sift_parallel_for ((gint64) a->n_kv_heads * n_chunks, 1, chunk_range, &job);
}

void
vs_attn_finish (VsAttn *a, SiftView *out, float *lse)
{
  for (gint32 h = 0; h < a->n_q_heads; h++)
    for (gint32 i = 0; i < a->n_q; i++)
      {
        const gsize row = (gsize) h * a->n_q + i;
        float *o = sift_view_row (out, h, i);
        const float l = a->l[row];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (gint32 c = 0; c < a->d; c++)
          o[c] = a->acc[row * a->d + c] * inv;
        lse[row] = l > 0.0f ? a->m[row] + logf (l) : -INFINITY;
      }
}

gint64
vs_attn_attended (const VsAttn *a)
{
  gint64 total = 0;
  for (gint64 i = 0; i < (gint64) a->n_q_heads * a->n_tiles; i++)
    total += a->attended[i];
  return total;
}
