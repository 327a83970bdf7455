/* xattn_bsa — XAttention block-sparse prefill (Xu et al., 2025) as a sift
 * policy. select_blocks estimates block importance from antidiagonal
 * sums of a K-only pass over the chunk's history, keeps per head the key
 * blocks that reach the threshold, votes a load list, and hands the engine
 * per-head selections; the engine's default pipeline computes attention.
 * The algorithm lives in xattn-score.c; docs/policies/xattn_bsa.md. */
#include <math.h>
#include <string.h>

#include <sift/engine.h>
#include <sift/error.h>
#include <sift/parallel.h>
#include <sift/policy.h>

#include "xattn-score.h"

typedef struct {
  SiftPolicy parent;
  XattnGeometry geo;
  double threshold;
  XattnVote vote;
  double vote_threshold;
  gint64 min_query_len;
  XattnScorer *scorer;
  float *scores;       /* [n_q_heads][n_qb][n_kb] */
  guint8 *sel;         /* [n_q_heads][n_qb][n_kb] */
  gsize cap;           /* elements of scores and sel */
} XattnBsa;

static const SiftParamSpec xattn_params[] = {
  { "threshold", SIFT_PARAM_FLOAT, "0.9", 0.0, 1.0, NULL,
    "softmax mass each (head, query block) keeps; 1 selects every block" },
  { "stride", SIFT_PARAM_INT, "8", 1, 256, NULL,
    "antidiagonal stride S; divides block_size and kv.block_size" },
  { "block_size", SIFT_PARAM_INT, "128", 1, 1 << 20, NULL,
    "XAttention estimation block B in tokens (not kv.block_size)" },
  { "vote", SIFT_PARAM_STRING, "any", 1, 0, "any|majority",
    "load a block chosen by any (kv head, query block), or by more than vote_threshold of them" },
  { "vote_threshold", SIFT_PARAM_FLOAT, "0.5", 0.0, 1.0, NULL,
    "fraction of (kv head, query block) votes a block needs under vote: majority" },
  { "min_query_len", SIFT_PARAM_INT, "1024", 0, G_MAXINT64, NULL,
    "below this query position + 1, every block is selected (no estimation)" },
  { NULL },
};

static gboolean
xattn_init (SiftPolicy *policy, const SiftParams *params, GError **error)
{
  XattnBsa *self = (XattnBsa *) policy;
  const SiftModelShape *shape = policy->shape;
  gint64 stride = sift_params_get_int (params, "stride");
  gint64 block = sift_params_get_int (params, "block_size");
  if (block % stride != 0)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID,
                   "xattn_bsa: stride %" G_GINT64_FORMAT " must divide block_size %" G_GINT64_FORMAT,
                   stride, block);
      return FALSE;
    }
  if (shape->block_size % stride != 0)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID,
                   "xattn_bsa: stride %" G_GINT64_FORMAT " must divide kv.block_size %d",
                   stride, shape->block_size);
      return FALSE;
    }
  self->geo = (XattnGeometry) {
    .n_q_heads = shape->n_q_heads,
    .n_kv_heads = shape->n_kv_heads,
    .head_dim = shape->head_dim,
    .stride = (gint32) stride,
    .block = (gint32) block,
    .scale = shape->scale > 0.0f ? shape->scale : 1.0f / sqrtf ((float) shape->head_dim),
  };
  self->threshold = sift_params_get_float (params, "threshold");
  self->vote = g_str_equal (sift_params_get_string (params, "vote"), "majority") ? XATTN_VOTE_MAJORITY
                                                                                : XATTN_VOTE_ANY;
  self->vote_threshold = sift_params_get_float (params, "vote_threshold");
  self->min_query_len = sift_params_get_int (params, "min_query_len");
  self->scorer = xattn_scorer_new (&self->geo);
  return TRUE;
}

static void
xattn_finalize (SiftPolicy *policy)
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

static gboolean
xattn_select_blocks (SiftPolicy *policy, const SiftPolicyContext *ctx, const gint64 *available,
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

static const SiftPolicyOps xattn_bsa_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "xattn_bsa",
  .version = "1.0",
  .description = "XAttention: antidiagonal block scoring, threshold selection, block-sparse prefill",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .params = xattn_params,
  .instance_size = sizeof (XattnBsa),
  .init = xattn_init,
  .finalize = xattn_finalize,
  .select_blocks = xattn_select_blocks,
};

SIFT_PLUGIN_DEFINE (&xattn_bsa_ops)
