/* xattn_bsa glue: the instance's setup, select_blocks (the estimate over
 * K-only loads, selection, vote, per-head answer, the plan kept for
 * compute) and compute_chunked_prefill (the plan through the engine's
 * default pipeline). The descriptor and parameter parsing are in
 * xattn-bsa.c. */
#include <math.h>
#include <string.h>

#include <sift/plugin.h>

#include "xattn-bsa-private.h"

gboolean
xattn_bsa_configure (SiftPolicy *policy, const XattnBsaConfig *cfg, GError **error)
{
  XattnBsa *self = (XattnBsa *) policy;
  const SiftModelShape *shape = policy->shape;
  if (cfg->stride < 1 || cfg->block < 1 || cfg->block % cfg->stride != 0)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID,
                   "xattn_bsa: stride %" G_GINT64_FORMAT " must divide block_size %" G_GINT64_FORMAT,
                   cfg->stride, cfg->block);
      return FALSE;
    }
  if (shape->block_size % cfg->stride != 0)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID,
                   "xattn_bsa: stride %" G_GINT64_FORMAT " must divide kv.block_size %d",
                   cfg->stride, shape->block_size);
      return FALSE;
    }
  self->geo = (XattnGeometry) {
    .n_q_heads = shape->n_q_heads,
    .n_kv_heads = shape->n_kv_heads,
    .head_dim = shape->head_dim,
    .stride = (gint32) cfg->stride,
    .block = (gint32) cfg->block,
    .scale = sift_attn_scale (shape->scale, shape->head_dim),
    .norm = (float) cfg->norm,
    .sum_exp = cfg->sum_exp,
  };
  self->threshold = cfg->threshold;
  self->vote = cfg->vote;
  self->vote_threshold = cfg->vote_threshold;
  self->min_query_len = cfg->min_query_len;
  self->granularity = cfg->granularity;
  self->last_block = cfg->last_block;
  self->scorer = xattn_scorer_new (&self->geo);
  self->exact_rows = cfg->exact_rows;
  if (self->exact_rows > 0)
    {
      XattnGeometry exact = self->geo;
      exact.stride = 1;
      exact.norm = 1.0f;
      exact.sum_exp = FALSE;
      self->exact = xattn_scorer_new (&exact);
    }
  return TRUE;
}

/* Adds the K of every available (stored) block to the scorer, streaming
 * them through the ring slots with K-only loads, n_slots in flight (the
 * scorer stages them, so a slot is free as soon as it is copied). */
static gboolean
score_history (XattnBsa *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n,
               gint64 n_exact, GError **error)
{
  const gint64 S = self->geo.stride;
  SiftStream *stream = sift_engine_stream_begin (ctx->engine, ctx->layer, available, n, SIFT_LOAD_K);
  SiftStreamBlock b;
  while (sift_engine_stream_next (stream, &b, 1, error) > 0)
    {
      const SiftBlockMeta *m = &ctx->blocks[b.block_id];
      if (m->first_token % S != 0 || (b.n_valid % S != 0 && m->first_token + b.n_valid != ctx->q_pos))
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                       "xattn_bsa: block %" G_GINT64_FORMAT " (tokens %" G_GINT64_FORMAT
                       "..+%d) is not aligned to stride %" G_GINT64_FORMAT,
                       b.block_id, m->first_token, b.n_valid, S);
          sift_engine_stream_end (stream);
          return FALSE;
        }
      if (b.n_valid > 0)
        {
          xattn_scorer_stage_keys (self->scorer, &b.k, m->first_token, b.n_valid);
          if (n_exact > 0)
            xattn_scorer_stage_keys (self->exact, &b.k, m->first_token, b.n_valid);
        }
    }
  return sift_engine_stream_end (stream);
}

typedef struct {
  XattnBsa *self;
  gint64 qb0, n_qb, n_kb;
} SelectTask;

static void
select_heads (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  (void) worker;
  const SelectTask *t = user_data;
  g_autofree gint64 *order = g_new (gint64, (gsize) t->n_kb);
  for (gint64 row = begin; row < end; row++)
    {
      gsize off = (gsize) row * (gsize) t->n_kb;
      xattn_select_row (t->self->scores + off, t->n_kb, t->qb0 + row % t->n_qb, t->self->threshold,
                        t->self->sel + off, order);
    }
}

/* Adds to sel every block whose row of attend ([n_q_heads][n], head-major)
 * has a head: for all heads at once when every head attends it. */
static void
emit (SiftSelection *sel, const guint8 *attend, const gint64 *ids, gint64 n, gint32 n_q_heads)
{
  for (gint64 e = 0; e < n; e++)
    {
      gint32 heads = 0;
      for (gint32 h = 0; h < n_q_heads; h++)
        heads += attend[(gsize) h * (gsize) n + (gsize) e];
      if (heads == n_q_heads)
        sift_selection_add (sel, ids[e]);
      else
        for (gint32 h = 0; h < n_q_heads && heads > 0; h++)
          if (attend[(gsize) h * (gsize) n + (gsize) e])
            sift_selection_add_q_head (sel, ids[e], h);
    }
}

/* Forgets the last chunk's plan. */
static void
plan_reset (XattnBsa *self)
{
  xattn_plan_clear (&self->plan);
  g_clear_pointer (&self->plan_ids, g_free);
  self->plan_state = XATTN_PLAN_NONE;
}

gboolean
xattn_bsa_select_blocks (SiftPolicy *policy, const SiftPolicyContext *ctx, const gint64 *available,
                         gsize n_available, SiftSelection *selected, GError **error)
{
  XattnBsa *self = (XattnBsa *) policy;
  const XattnGeometry *g = &self->geo;
  plan_reset (self);
  self->plan_layer = ctx->layer;
  self->plan_q_pos = ctx->q_pos;
  self->plan_n_q = ctx->n_q;
  if (n_available == 0 || ctx->phase != SIFT_PHASE_PREFILL || ctx->q_pos + ctx->n_q < self->min_query_len)
    {
      for (gsize i = 0; i < n_available; i++)
        sift_selection_add (selected, available[i]);
      self->plan_state = XATTN_PLAN_DENSE;
      return TRUE;
    }

  /* The chunk's last exact_rows queries are also scored exactly. */
  const gint64 n_exact = MIN (self->exact_rows, (gint64) ctx->n_q);
  const gint64 exact_pos = ctx->q_pos + ctx->n_q - n_exact;
  xattn_scorer_begin (self->scorer, &ctx->q, ctx->q_pos, ctx->n_q);
  if (n_exact > 0)
    {
      SiftView q_tail = sift_view_tokens (&ctx->q, ctx->n_q - n_exact, n_exact);
      xattn_scorer_begin (self->exact, &q_tail, exact_pos, n_exact);
    }
  if (!score_history (self, ctx, available, n_available, n_exact, error))
    return FALSE;
  SiftView k_local, v_local;
  sift_engine_local_kv (ctx->engine, ctx, &k_local, &v_local);
  xattn_scorer_add_keys (self->scorer, &k_local, ctx->q_pos, ctx->n_q);
  if (n_exact > 0)
    xattn_scorer_add_keys (self->exact, &k_local, ctx->q_pos, ctx->n_q);

  SelectTask t = { self, xattn_scorer_first_qb (self->scorer), xattn_scorer_n_qb (self->scorer),
                   xattn_scorer_n_kb (self->scorer) };
  gsize need = (gsize) g->n_q_heads * (gsize) t.n_qb * (gsize) t.n_kb;
  if (need > self->cap)
    {
      g_free (self->scores);
      g_free (self->sel);
      self->scores = g_new (float, need);
      self->sel = g_new (guint8, need);
      self->cap = need;
    }
  xattn_scorer_finish (self->scorer, self->scores);
  sift_parallel_for ((gint64) g->n_q_heads * t.n_qb, 1, select_heads, &t);
  if (n_exact > 0)
    {
      gsize need_exact = (gsize) g->n_q_heads * (gsize) n_exact * (gsize) t.n_kb;
      if (need_exact > self->exact_cap)
        {
          g_free (self->exact_mass);
          self->exact_mass = g_new (float, need_exact);
          self->exact_cap = need_exact;
        }
      xattn_scorer_finish_rows (self->exact, self->exact_mass);
      xattn_select_exact_rows (self->exact_mass, g->n_q_heads, n_exact, exact_pos, g->block, t.qb0, t.n_qb, t.n_kb,
                               self->threshold, self->sel);
    }

  xattn_plan_init (&self->plan, g->n_q_heads, t.n_qb, (gint64) n_available);
  xattn_aggregate (g, self->sel, t.n_qb, t.n_kb, ctx->blocks, available, (gint64) n_available, self->vote,
                   self->vote_threshold, self->last_block, &self->plan);
  self->plan_ids = g_memdup2 (available, n_available * sizeof (gint64));
  self->plan_qb0 = t.qb0;
  self->plan_state = XATTN_PLAN_SPARSE;
  emit (selected, self->plan.attend, available, (gint64) n_available, g->n_q_heads);
  return TRUE;
}

/* Attention for query rows [r0, r1) of the chunk over `sel` (NULL: every
 * stored block), through the engine's default pipeline, written into
 * those rows of out and lse. */
static gboolean
attend_rows (XattnBsa *self, const SiftPolicyContext *ctx, gint64 r0, gint64 r1, const SiftSelection *sel,
             SiftView *out, float *lse, GError **error)
{
  const gint32 H = self->geo.n_q_heads, d = self->geo.head_dim;
  const gint64 n = r1 - r0;
  if (r0 == 0 && r1 == ctx->n_q)
    return sift_engine_attend_default (ctx->engine, ctx, sel, out, lse, error);
  SiftPolicyContext sub = *ctx;
  sub.q = sift_view_tokens (&ctx->q, r0, n);
  sub.q_pos = ctx->q_pos + r0;
  sub.n_q = (gint32) n;
  g_autofree float *o = g_new (float, (gsize) H * (gsize) n * (gsize) d);
  g_autofree float *l = g_new (float, (gsize) H * (gsize) n);
  SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, H, n, d);
  if (!sift_engine_attend_default (ctx->engine, &sub, sel, &ov, l, error))
    return FALSE;
  for (gint32 h = 0; h < H; h++)
    for (gint64 t = 0; t < n; t++)
      {
        memcpy (sift_view_row (out, h, r0 + t), o + ((gsize) h * (gsize) n + (gsize) t) * (gsize) d,
                (gsize) d * sizeof (float));
        lse[(gsize) h * (gsize) ctx->n_q + (gsize) (r0 + t)] = l[(gsize) h * (gsize) n + (gsize) t];
      }
  return TRUE;
}

gboolean
xattn_bsa_compute_prefill (SiftPolicy *policy, const SiftPolicyContext *ctx, SiftView *out, float *lse,
                           GError **error)
{
  XattnBsa *self = (XattnBsa *) policy;
  const XattnGeometry *g = &self->geo;
  if (self->plan_state == XATTN_PLAN_NONE || self->plan_layer != ctx->layer || self->plan_q_pos != ctx->q_pos
      || self->plan_n_q != ctx->n_q)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "xattn_bsa: compute for layer %d at position %" G_GINT64_FORMAT
                   " without select_blocks for that chunk", ctx->layer, ctx->q_pos);
      return FALSE;
    }
  if (self->plan_state == XATTN_PLAN_DENSE)
    return sift_engine_attend_default (ctx->engine, ctx, NULL, out, lse, error);

  const gint64 n = self->plan.n;
  const gsize slice = (gsize) g->n_q_heads * (gsize) n;
  g_autoptr (SiftSelection) sel = sift_selection_new (g->n_q_heads, g->n_kv_heads);
  if (self->granularity == XATTN_GRANULARITY_CHUNK)
    {
      emit (sel, self->plan.attend, self->plan_ids, n, g->n_q_heads);
      return attend_rows (self, ctx, 0, ctx->n_q, sel, out, lse, error);
    }
  /* Block-sparse per query block: one pipeline call per run of query
   * blocks whose per-head choices are identical (loads are per call). */
  for (gint64 i = 0; i < self->plan.n_qb;)
    {
      const guint8 *a = self->plan.qb_attend + (gsize) i * slice;
      gint64 j = i + 1;
      while (j < self->plan.n_qb && memcmp (a, self->plan.qb_attend + (gsize) j * slice, slice) == 0)
        j++;
      gint64 r0 = MAX ((self->plan_qb0 + i) * g->block, ctx->q_pos) - ctx->q_pos;
      gint64 r1 = MIN ((self->plan_qb0 + j) * g->block, ctx->q_pos + ctx->n_q) - ctx->q_pos;
      sift_selection_clear (sel);
      emit (sel, a, self->plan_ids, n, g->n_q_heads);
      if (!attend_rows (self, ctx, r0, r1, sel, out, lse, error))
        return FALSE;
      i = j;
    }
  return TRUE;
}

void
xattn_bsa_reset (SiftPolicy *policy)
{
  plan_reset ((XattnBsa *) policy);
}

void
xattn_bsa_finalize (SiftPolicy *policy)
{
  XattnBsa *self = (XattnBsa *) policy;
  plan_reset (self);
  xattn_scorer_free (self->scorer);
  xattn_scorer_free (self->exact);
  g_free (self->exact_mass);
  g_free (self->scores);
  g_free (self->sel);
}
