/* xattn_bsa glue: the instance, its setup, and select_blocks (the
 * estimate over K-only loads, selection, vote, per-head answer). The
 * plugin descriptor and parameter parsing are in xattn-bsa.c. */
#include <math.h>
#include <string.h>

#include <sift/engine.h>
#include <sift/error.h>
#include <sift/parallel.h>
#include <sift/policy.h>

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
    .scale = shape->scale > 0.0f ? shape->scale : 1.0f / sqrtf ((float) shape->head_dim),
  };
  self->threshold = cfg->threshold;
  self->vote = cfg->vote;
  self->vote_threshold = cfg->vote_threshold;
  self->min_query_len = cfg->min_query_len;
  self->scorer = xattn_scorer_new (&self->geo);
  return TRUE;
}

void
xattn_bsa_finalize (SiftPolicy *policy)
{
  XattnBsa *self = (XattnBsa *) policy;
  xattn_scorer_free (self->scorer);
  g_free (self->scores);
  g_free (self->sel);
}

/* Waits for and releases the slots of loads still in flight after an error,
 * so the engine is left with every slot free. */
static void
drain (SiftEngine *engine, gint64 from, gint64 to, gint32 n_slots)
{
  for (gint64 i = from; i < to; i++)
    {
      sift_engine_wait_slot (engine, (gint32) (i % n_slots), NULL);
      sift_engine_slot_done (engine, (gint32) (i % n_slots));
    }
}

/* Adds the K of every available (stored) block to the scorer, streaming
 * them through the ring slots with K-only loads, n_slots in flight. */
static gboolean
score_history (XattnBsa *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n,
               GError **error)
{
  SiftEngine *engine = ctx->engine;
  const gint32 n_slots = sift_engine_n_slots (engine);
  const gint64 S = self->geo.stride;
  gint64 queued = 0;
  for (gint64 i = 0; i < (gint64) n; i++)
    {
      for (; queued < (gint64) n && queued < i + n_slots; queued++)
        if (!sift_engine_load_block (engine, ctx->layer, available[queued], (gint32) (queued % n_slots),
                                     SIFT_LOAD_K, error))
          {
            drain (engine, i, queued, n_slots);
            return FALSE;
          }
      gint32 slot = (gint32) (i % n_slots);
      if (!sift_engine_wait_slot (engine, slot, error))
        {
          sift_engine_slot_done (engine, slot);
          drain (engine, i + 1, queued, n_slots);
          return FALSE;
        }
      SiftView k, v;
      gint32 n_valid = 0;
      sift_engine_slot_kv (engine, slot, &k, &v, &n_valid);
      const SiftBlockMeta *m = &ctx->blocks[available[i]];
      if (m->first_token % S != 0 || (n_valid % S != 0 && m->first_token + n_valid != ctx->q_pos))
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                       "xattn_bsa: block %" G_GINT64_FORMAT " (tokens %" G_GINT64_FORMAT
                       "..+%d) is not aligned to stride %" G_GINT64_FORMAT,
                       available[i], m->first_token, n_valid, S);
          sift_engine_slot_done (engine, slot);
          drain (engine, i + 1, queued, n_slots);
          return FALSE;
        }
      if (n_valid > 0)
        xattn_scorer_add_keys (self->scorer, &k, m->first_token, n_valid);
      sift_engine_slot_done (engine, slot);
    }
  return TRUE;
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

gboolean
xattn_bsa_select_blocks (SiftPolicy *policy, const SiftPolicyContext *ctx, const gint64 *available,
                     gsize n_available, SiftSelection *selected, GError **error)
{
  XattnBsa *self = (XattnBsa *) policy;
  const XattnGeometry *g = &self->geo;
  if (n_available == 0)
    return TRUE;
  if (ctx->phase != SIFT_PHASE_PREFILL || ctx->q_pos + ctx->n_q < self->min_query_len)
    {
      for (gsize i = 0; i < n_available; i++)
        sift_selection_add (selected, available[i]);
      return TRUE;
    }

  xattn_scorer_begin (self->scorer, &ctx->q, ctx->q_pos, ctx->n_q);
  if (!score_history (self, ctx, available, n_available, error))
    return FALSE;
  SiftView k_local, v_local;
  sift_engine_local_kv (ctx->engine, ctx, &k_local, &v_local);
  xattn_scorer_add_keys (self->scorer, &k_local, ctx->q_pos, ctx->n_q);

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

  XattnPlan plan;
  xattn_plan_init (&plan, g->n_q_heads, (gint64) n_available);
  xattn_aggregate (g, self->sel, t.n_qb, t.n_kb, ctx->blocks, available, (gint64) n_available,
                   self->vote, self->vote_threshold, &plan);
  for (gsize e = 0; e < n_available; e++)
    {
      if (!plan.load[e])
        continue;
      gint32 heads = 0;
      for (gint32 h = 0; h < g->n_q_heads; h++)
        heads += plan.attend[(gsize) h * n_available + e];
      if (heads == g->n_q_heads)
        sift_selection_add (selected, available[e]);
      else
        for (gint32 h = 0; h < g->n_q_heads; h++)
          if (plan.attend[(gsize) h * n_available + e])
            sift_selection_add_q_head (selected, available[e], h);
    }
  xattn_plan_clear (&plan);
  return TRUE;
}

