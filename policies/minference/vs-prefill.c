/* One prefill chunk under the vertical-slash pattern: estimate, select,
 * attend. The keys come from a block source (the whole sequence at once,
 * or the engine's stored blocks and then the chunk itself). */
#include <math.h>

#include <sift/plugin.h>

#include "vs.h"

typedef struct {
  VsEstimator *e;
  int pass;
} EstPass;

static void
est_block (gpointer data, const SiftView *k, const SiftView *v, gint64 key0)
{
  (void) v;
  EstPass *ep = data;
  if (ep->pass == 1)
    vs_estimator_pass1 (ep->e, k, key0);
  else
    vs_estimator_pass2 (ep->e, k, key0);
}

static void
attn_block (gpointer data, const SiftView *k, const SiftView *v, gint64 key0)
{
  vs_attn_block (data, k, v, key0);
}

gboolean
vs_sizes_dense (const VsSizes *sizes, gint32 n_q_heads, gint64 n)
{
  for (gint32 h = 0; h < n_q_heads; h++)
    if (sizes[h].vertical < n && sizes[h].slash < n)
      return FALSE;
  return TRUE;
}

static gint64
causal_keys (gint64 q_pos, gint64 n_q)
{
  return n_q * q_pos + n_q * (n_q + 1) / 2;
}

gboolean
vs_chunk_prefill (const SiftView *q, gint64 q_pos, gint32 n_kv_heads, float scale,
                  const VsEstimateOpts *opts, const VsSizes *sizes, VsWork *work, VsBlockSource source,
                  gpointer source_data, SiftView *out, float *lse, VsStats *stats, GError **error)
{
  const gint32 H = q->n_heads, d = q->head_dim;
  const gint64 n_q = q->n_tokens, n_keys = q_pos + n_q;
  g_return_val_if_fail (q->dtype == SIFT_DTYPE_F32 && n_q > 0 && opts->last_q > 0, FALSE);
  g_return_val_if_fail (opts->tile >= 1 && opts->tile <= VS_TILE_MAX, FALSE);
  gint64 t0 = g_get_monotonic_time ();

  /* Estimate from the chunk's last rows against every key so far. */
  const gint64 r = MIN (opts->last_q, n_q);
  SiftView qe = sift_view_tokens (q, n_q - r, r);
  g_autoptr (VsEstimator) est = vs_estimator_new (H, n_kv_heads, d, scale);
  vs_estimator_begin (est, &qe, n_keys - r, n_keys);
  EstPass ep = { est, 1 };
  if (!source (source_data, FALSE, est_block, &ep, error))
    return FALSE;
  ep.pass = 2;
  if (!source (source_data, FALSE, est_block, &ep, error))
    return FALSE;

  gsize total_v = 0, total_s = 0;
  for (gint32 h = 0; h < H; h++)
    {
      total_v += (gsize) MIN (sizes[h].vertical, n_keys);
      total_s += (gsize) MIN (sizes[h].slash, n_keys);
    }
  g_autofree gint64 *vert = g_new (gint64, MAX (total_v, 1));
  g_autofree gint64 *slash = g_new (gint64, MAX (total_s, 1));
  g_autofree VsPattern *pattern = g_new0 (VsPattern, H);
  gsize ov = 0, os = 0;
  for (gint32 h = 0; h < H; h++)
    {
      pattern[h].vertical = vert + ov;
      pattern[h].n_vertical = vs_select_top (vs_estimator_vertical (est, h), n_keys, sizes[h].vertical,
                                             opts->num_sink, vert + ov);
      pattern[h].slash = slash + os;
      pattern[h].n_slash = vs_select_top (vs_estimator_slash (est, h), n_keys, sizes[h].slash,
                                          opts->num_recent, slash + os);
      ov += pattern[h].n_vertical;
      os += pattern[h].n_slash;
    }
  gint64 t1 = g_get_monotonic_time ();

  g_autoptr (VsAttn) attn = vs_attn_new (q, q_pos, n_kv_heads, scale, opts->tile, pattern, work);
  if (!source (source_data, TRUE, attn_block, attn, error))
    return FALSE;
  vs_attn_finish (attn, out, lse);
  gint64 t2 = g_get_monotonic_time ();
  if (stats)
    {
      stats->keys_attended += vs_attn_attended (attn);
      stats->keys_causal += H * causal_keys (q_pos, n_q);
      stats->seconds_estimate += (t1 - t0) / 1e6;
      stats->seconds_attend += (t2 - t1) / 1e6;
    }
  return TRUE;
}

typedef struct {
  const SiftView *k, *v;
} WholeSource;

static gboolean
whole_source (gpointer source, gboolean want_v, VsBlockFunc fn, gpointer data, GError **error)
{
  (void) error;
  const WholeSource *ws = source;
  fn (data, ws->k, want_v ? ws->v : NULL, 0);
  return TRUE;
}

gboolean
vs_prefill (const SiftView *q, const SiftView *k, const SiftView *v, float scale,
            const VsEstimateOpts *opts, const VsSizes *sizes, VsWork *work, SiftView *out, float *lse,
            VsStats *stats, GError **error)
{
  if (k->n_tokens != q->n_tokens || v->n_tokens != q->n_tokens)
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_SHAPE,
                   "whole-prompt prefill: q has %" G_GINT64_FORMAT " tokens, k %" G_GINT64_FORMAT
                   ", v %" G_GINT64_FORMAT, q->n_tokens, k->n_tokens, v->n_tokens);
      return FALSE;
    }
  if (vs_sizes_dense (sizes, q->n_heads, q->n_tokens))
    {
      /* Every column or every diagonal is kept: that is dense attention. */
      gint64 t0 = g_get_monotonic_time ();
      SiftAttnOpts o = { .scale = scale, .causal = TRUE, .q_offset = 0 };
      if (!sift_attn_dense (q, k, v, &o, out, lse, error))
        return FALSE;
      if (stats)
        {
          gint64 c = q->n_heads * causal_keys (0, q->n_tokens);
          stats->keys_attended += c;
          stats->keys_causal += c;
          stats->seconds_attend += (g_get_monotonic_time () - t0) / 1e6;
        }
      return TRUE;
    }
  WholeSource ws = { k, v };
  return vs_chunk_prefill (q, 0, k->n_heads, scale, opts, sizes, work, whole_source, &ws, out, lse, stats,
                           error);
}
