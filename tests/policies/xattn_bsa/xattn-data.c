/* Random queries and keys for the XAttention scoring tests (xattn-data.h). */
#include <glib.h>

#include "xattn-data.h"

Data *
data_new (const XattnGeometry *geo, gint64 n_tokens, guint32 seed)
{
  Data *d = g_new0 (Data, 1);
  d->geo = *geo;
  d->n_tokens = n_tokens;
  gsize nq = (gsize) geo->n_q_heads * (gsize) n_tokens * (gsize) geo->head_dim;
  gsize nk = (gsize) geo->n_kv_heads * (gsize) n_tokens * (gsize) geo->head_dim;
  d->q = g_new (float, nq);
  d->k = g_new (float, nk);
  GRand *r = g_rand_new_with_seed (seed);
  /* Spread logits: some structure so scores are far from uniform. */
  for (gsize i = 0; i < nq; i++)
    d->q[i] = (float) g_rand_double_range (r, -2.0, 2.0);
  for (gsize i = 0; i < nk; i++)
    d->k[i] = (float) g_rand_double_range (r, -2.0, 2.0);
  g_rand_free (r);
  return d;
}

void
data_free (Data *d)
{
  g_free (d->q);
  g_free (d->k);
  g_free (d);
}

const float *
q_row (const Data *d, gint32 h, gint64 pos)
{
  return d->q + ((gsize) h * (gsize) d->n_tokens + (gsize) pos) * (gsize) d->geo.head_dim;
}

const float *
k_row (const Data *d, gint32 g, gint64 pos)
{
  return d->k + ((gsize) g * (gsize) d->n_tokens + (gsize) pos) * (gsize) d->geo.head_dim;
}

/* Runs the scorer: history [0, q_pos) in pieces of `piece` tokens, then the
 * chunk. With as_f16 the history goes in as f16 and token-major
 * ([tokens][heads][d]). Pieces go in reverse order through add_keys (order
 * does not matter), or in order through stage_keys when `staged`. */
float *
scorer_scores_ex (const Data *d, gint64 q_pos, gint64 kv_end, gint64 piece, gboolean as_f16, gboolean staged)
{
  const XattnGeometry *g = &d->geo;
  g_autoptr (XattnScorer) s = xattn_scorer_new (g);
  SiftView q = sift_view_htd (d->q, SIFT_DTYPE_F32, g->n_q_heads, d->n_tokens, g->head_dim);
  q = sift_view_tokens (&q, q_pos, kv_end - q_pos);
  xattn_scorer_begin (s, &q, q_pos, kv_end - q_pos);
  SiftView k = sift_view_htd (d->k, SIFT_DTYPE_F32, g->n_kv_heads, d->n_tokens, g->head_dim);
  g_autofree guint16 *k16 = NULL;
  SiftView k16v = { 0 };
  if (as_f16)
    {
      k16 = g_new (guint16, (gsize) d->n_tokens * (gsize) g->n_kv_heads * (gsize) g->head_dim);
      for (gint64 t = 0; t < d->n_tokens; t++)
        for (gint32 h = 0; h < g->n_kv_heads; h++)
          for (gint32 e = 0; e < g->head_dim; e++)
            k16[((gsize) t * (gsize) g->n_kv_heads + (gsize) h) * (gsize) g->head_dim + (gsize) e]
              = sift_f32_to_f16 (k_row (d, h, t)[e]);
      k16v = sift_view_thd (k16, SIFT_DTYPE_F16, d->n_tokens, g->n_kv_heads, g->head_dim);
    }
  gint64 n_pieces = (q_pos + piece - 1) / piece;
  for (gint64 i = 0; i < n_pieces; i++)
    {
      gint64 p = (staged ? i : n_pieces - 1 - i) * piece, n = MIN (piece, q_pos - p);
      SiftView part = sift_view_tokens (as_f16 ? &k16v : &k, p, n);
      if (staged)
        xattn_scorer_stage_keys (s, &part, p, n);
      else
        xattn_scorer_add_keys (s, &part, p, n);
    }
  SiftView local = sift_view_tokens (&k, q_pos, kv_end - q_pos);
  xattn_scorer_add_keys (s, &local, q_pos, kv_end - q_pos);
  gint64 n = (gint64) g->n_q_heads * xattn_scorer_n_qb (s) * xattn_scorer_n_kb (s);
  float *out = g_new (float, (gsize) n);
  xattn_scorer_finish (s, out);
  return out;
}

float *
scorer_scores (const Data *d, gint64 q_pos, gint64 kv_end, gint64 piece, gboolean as_f16)
{
  return scorer_scores_ex (d, q_pos, kv_end, piece, as_f16, FALSE);
}

const XattnGeometry small_geo = {
  .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 16, .stride = 4, .block = 16, .scale = 0.25f,
};
