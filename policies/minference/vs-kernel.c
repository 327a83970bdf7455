/* Vertical-slash sparse attention kernel.
 *
 * Per (query head, tile of rows): the merged slash ranges and the
 * leftover vertical columns of the current key block are walked in
 * ascending key order and fed VS_KEY_GROUP keys at a time to the inner
 * loop, which updates the tile's online softmax. A key of the block is fed
 * at most once per tile (ranges are disjoint, columns inside a range are
 * skipped), so no key is counted twice, and the state carries over between
 * blocks, so any block split gives the same result up to rounding. */
#include <math.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/parallel.h>

#include "vs.h"

/* ---- Scalar inner loops: the reference the SIMD paths are tested against. */

void
vs_scores_scalar (const float *q, gint32 n_rows, gint32 d, const float *const *krow, gint32 n_keys,
                  float *s)
{
  for (gint32 r = 0; r < n_rows; r++)
    for (gint32 kk = 0; kk < n_keys; kk++)
      {
        float acc = 0.0f;
        for (gint32 c = 0; c < d; c++)
          acc += q[(gsize) r * d + c] * krow[kk][c];
        s[(gsize) r * VS_KEY_GROUP + kk] = acc;
      }
}

void
vs_tile_attend_scalar (VsTile *t, const float *const *krow, const float *const *vrow,
                       const gint64 *key_pos, gint32 n_keys)
{
  const gint32 d = t->d;
  for (gint32 r = 0; r < t->n_rows; r++)
    {
      const float *q = t->q + (gsize) r * d;
      float *acc = t->acc + (gsize) r * d;
      const gint64 pos = t->pos0 + r;
      for (gint32 kk = 0; kk < n_keys && key_pos[kk] <= pos; kk++)
        {
          float s = 0.0f;
          for (gint32 c = 0; c < d; c++)
            s += q[c] * krow[kk][c];
          if (s > t->m[r])
            {
              /* A new max: rescale what was summed under the old one so
               * every exponent stays <= 0. */
              float alpha = expf (t->m[r] - s);
              t->l[r] *= alpha;
              for (gint32 c = 0; c < d; c++)
                acc[c] *= alpha;
              t->m[r] = s;
            }
          float p = expf (s - t->m[r]);
          t->l[r] += p;
          t->attended++;
          for (gint32 c = 0; c < d; c++)
            acc[c] += p * vrow[kk][c];
        }
    }
}

static int isa_override = -1;

void
vs_set_isa (int isa)
{
  isa_override = isa;
}

/* The ISA the inner loops use: sift_isa_active () unless a test forced one. */
static inline SiftIsa
vs_isa (void)
{
  return isa_override >= 0 ? (SiftIsa) isa_override : sift_isa_active ();
}

void
vs_tile_attend (VsTile *t, const float *const *krow, const float *const *vrow, const gint64 *key_pos,
                gint32 n_keys)
{
#ifdef VS_HAVE_AVX2
  if (vs_isa () >= SIFT_ISA_AVX2 && t->d % 8 == 0)
    {
      vs_tile_attend_avx2 (t, krow, vrow, key_pos, n_keys);
      return;
    }
#endif
  vs_tile_attend_scalar (t, krow, vrow, key_pos, n_keys);
}

void
vs_scores (const float *q, gint32 n_rows, gint32 d, const float *const *krow, gint32 n_keys, float *s)
{
#ifdef VS_HAVE_AVX2
  if (vs_isa () >= SIFT_ISA_AVX2 && d % 8 == 0)
    {
      vs_scores_avx2 (q, n_rows, d, krow, n_keys, s);
      return;
    }
#endif
  vs_scores_scalar (q, n_rows, d, krow, n_keys, s);
}

SiftView
vs_view_f32 (const SiftView *k, float **buf, gsize *cap)
{
  if (k->dtype == SIFT_DTYPE_F32)
    return *k;
  gsize need = (gsize) k->n_heads * k->n_tokens * k->head_dim;
  if (need > *cap)
    {
      g_free (*buf);
      *buf = g_new (float, need);
      *cap = need;
    }
  SiftView f = sift_view_htd (*buf, SIFT_DTYPE_F32, k->n_heads, k->n_tokens, k->head_dim);
  for (gint32 h = 0; h < k->n_heads; h++)
    for (gint64 t = 0; t < k->n_tokens; t++)
      sift_view_row_to_f32 (k, h, t, sift_view_row (&f, h, t));
  return f;
}

/* ---- Streaming driver ------------------------------------------------------ */

struct _VsAttn {
  gint32 n_q_heads, n_kv_heads, d;
  gint64 q_pos;
  gint32 n_q;
  gint32 tile;
  gint64 n_tiles;
  float *q;                  /* [n_q_heads][n_q][d], pre-scaled */
  float *m, *l;              /* [n_q_heads][n_q] */
  float *acc;                /* [n_q_heads][n_q][d] */
  const VsPattern *pattern;  /* [n_q_heads] */
  gsize max_slash;
  VsRange *scratch;          /* [n_threads][max_slash] */
  gint64 *attended;          /* [n_q_heads * n_tiles] */
  gint n_threads;
  float *kbuf, *vbuf;        /* f32 copies of non-f32 blocks */
  gsize kcap, vcap;
};

VsAttn *
vs_attn_new (const SiftView *q, gint64 q_pos, gint32 n_kv_heads, float scale, gint32 tile,
             const VsPattern *pattern)
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
  a->pattern = pattern;
  const gsize rows = (gsize) a->n_q_heads * a->n_q;
  a->q = g_new (float, rows * a->d);
  a->acc = g_new0 (float, rows * a->d);
  a->m = g_new (float, rows);
  a->l = g_new0 (float, rows);
  for (gint32 h = 0; h < a->n_q_heads; h++)
    {
      a->max_slash = MAX (a->max_slash, pattern[h].n_slash);
      for (gint32 i = 0; i < a->n_q; i++)
        {
          const float *src = sift_view_row (q, h, i);
          float *dst = a->q + ((gsize) h * a->n_q + i) * a->d;
          for (gint32 c = 0; c < a->d; c++)
            dst[c] = src[c] * scale;
          a->m[(gsize) h * a->n_q + i] = -INFINITY;
        }
    }
  a->attended = g_new0 (gint64, (gsize) a->n_q_heads * a->n_tiles);
  a->n_threads = sift_parallel_n_threads ();
  a->scratch = g_new (VsRange, (gsize) a->n_threads * MAX (a->max_slash, 1));
  return a;
}

void
vs_attn_free (VsAttn *a)
{
  if (a == NULL)
    return;
  g_free (a->q);
  g_free (a->m);
  g_free (a->l);
  g_free (a->acc);
  g_free (a->scratch);
  g_free (a->attended);
  g_free (a->kbuf);
  g_free (a->vbuf);
  g_free (a);
}

typedef struct {
  VsAttn *a;
  const SiftView *k, *v;  /* f32 */
  gint64 key0;
} BlockJob;

/* Keys waiting for the inner loop, ascending. */
typedef struct {
  VsTile tile;
  const SiftView *k, *v;
  gint32 g;
  gint64 key0;
  gint32 n;
  gint64 pos[VS_KEY_GROUP];
  const float *krow[VS_KEY_GROUP], *vrow[VS_KEY_GROUP];
} Feed;

static inline void
feed_flush (Feed *f)
{
  if (f->n > 0)
    vs_tile_attend (&f->tile, f->krow, f->vrow, f->pos, f->n);
  f->n = 0;
}

static inline void
feed_key (Feed *f, gint64 j)
{
  f->pos[f->n] = j;
  f->krow[f->n] = sift_view_row (f->k, f->g, j - f->key0);
  f->vrow[f->n] = sift_view_row (f->v, f->g, j - f->key0);
  if (++f->n == VS_KEY_GROUP)
    feed_flush (f);
}

static void
block_item (const BlockJob *job, gint64 item, VsRange *scratch)
{
  VsAttn *a = job->a;
  const gint32 h = (gint32) (item / a->n_tiles);
  const gint64 t = item % a->n_tiles;
  const gint64 a0 = a->q_pos + t * a->tile, b0 = MIN (a0 + a->tile, a->q_pos + a->n_q);
  const gint64 lo = job->key0, hi = MIN (job->key0 + job->k->n_tokens, b0);
  if (lo >= hi)
    return;
  const VsPattern *p = &a->pattern[h];
  const gsize row0 = (gsize) h * a->n_q + (gsize) (a0 - a->q_pos);
  Feed f = {
    .tile = { a->q + row0 * a->d, a0, (gint32) (b0 - a0), a->d, a->m + row0, a->l + row0,
              a->acc + row0 * a->d },
    .k = job->k, .v = job->v,
    .g = h / (a->n_q_heads / a->n_kv_heads),
    .key0 = job->key0,
  };
  gsize nr = vs_tile_ranges (p, a0, b0, lo, hi, scratch);
  /* Columns in [lo, hi), merged with the ranges in ascending order. */
  gsize c = 0;
  while (c < p->n_vertical && p->vertical[c] < lo)
    c++;
  for (gsize i = 0; i < nr; i++)
    {
      for (; c < p->n_vertical && p->vertical[c] < scratch[i].start; c++)
        feed_key (&f, p->vertical[c]);
      for (gint64 j = scratch[i].start; j < scratch[i].end; j++)
        feed_key (&f, j);
      while (c < p->n_vertical && p->vertical[c] < scratch[i].end)
        c++; /* visited by the range */
    }
  for (; c < p->n_vertical && p->vertical[c] < hi; c++)
    feed_key (&f, p->vertical[c]);
  feed_flush (&f);
  a->attended[item] += f.tile.attended;
}

static void
block_range (gint64 begin, gint64 end, gint worker, gpointer data)
{
  const BlockJob *job = data;
  VsRange *scratch = job->a->scratch + (gsize) worker * MAX (job->a->max_slash, 1);
  for (gint64 item = begin; item < end; item++)
    block_item (job, item, scratch);
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
  sift_parallel_for ((gint64) a->n_q_heads * a->n_tiles, 1, block_range, &job);
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
