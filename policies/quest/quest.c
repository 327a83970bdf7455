/* The Quest policy plugin: keeps per-block key bounds from the offload
 * hooks and, for each decode step (and optionally each prefill chunk),
 * selects per kv head the blocks whose keys could score highest for the
 * current query. The math lives in quest-core.c; docs/policies/quest.md. */
#include <string.h>

#include <sift/engine.h>
#include <sift/error.h>
#include <sift/params.h>
#include <sift/policy.h>

#include "quest-core.h"

typedef struct {
  SiftPolicy parent;
  QuestMode mode;
  QuestReduce reduce;
  gint64 budget_blocks;   /* stored blocks kept per ranking, sinks and recent included */
  gint64 sink_blocks;
  gint64 recent_blocks;
  gint64 dense_threshold; /* at most this many available blocks: every block */
  gboolean prefill;       /* select in prefill too (with the chunk's mean query) */
  gboolean *dense_layer;  /* [n_layers] */
  QuestMeta *meta;
} Quest;

static const SiftParamSpec quest_params[] = {
  { "mode", SIFT_PARAM_STRING, "per_kv_head", 1, 0, "per_kv_head|per_q_head|shared",
    "per_kv_head: one ranking per kv head from its group's query heads; per_q_head: one per query head; "
    "shared: one for all heads" },
  { "gqa_reduce", SIFT_PARAM_STRING, "max", 1, 0, "max|mean",
    "how the query heads reading one kv head (or all heads, shared) combine their bounds" },
  { "token_budget", SIFT_PARAM_INT, "2048", 1, 1e12, NULL,
    "stored tokens attended per head, sinks and recent included (token_budget / block_size blocks)" },
  { "top_k", SIFT_PARAM_INT, "0", 0, 1e9, NULL,
    "blocks attended per head, sinks and recent included; overrides token_budget when > 0" },
  { "sink_blocks", SIFT_PARAM_INT, "0", 0, 1e9, NULL, "first stored blocks always kept (attention sinks)" },
  { "recent_blocks", SIFT_PARAM_INT, "0", 0, 1e9, NULL, "last stored blocks always kept (locality)" },
  { "dense_threshold_blocks", SIFT_PARAM_INT, "0", 0, 1e12, NULL,
    "attend every block while a layer has at most this many stored blocks" },
  { "dense_layers", SIFT_PARAM_INT_LIST, "[0, 1]", 0, 1e6, NULL,
    "layers that attend every block (the paper keeps the first two dense); layers past the model are ignored" },
  { "prefill", SIFT_PARAM_BOOL, "false", 1, 0, NULL,
    "placed in prefill: select with the chunk's mean query (false: prefill attends every block)" },
  { NULL },
};

static gboolean
quest_init (SiftPolicy *policy, const SiftParams *params, GError **error)
{
  Quest *self = (Quest *) policy;
  const SiftModelShape *shape = policy->shape;

  static const struct {
    const char *name;
    QuestMode mode;
  } modes[] = { { "per_kv_head", QUEST_MODE_PER_KV_HEAD }, { "per_q_head", QUEST_MODE_PER_Q_HEAD },
                { "shared", QUEST_MODE_SHARED } };
  const char *mode = sift_params_get_string (params, "mode");
  for (gsize i = 0; i < G_N_ELEMENTS (modes); i++)
    if (g_str_equal (mode, modes[i].name))
      self->mode = modes[i].mode;
  self->reduce = g_str_equal (sift_params_get_string (params, "gqa_reduce"), "mean") ? QUEST_REDUCE_MEAN
                                                                                      : QUEST_REDUCE_MAX;
  gint64 top_k = sift_params_get_int (params, "top_k");
  gint64 token_budget = sift_params_get_int (params, "token_budget");
  if (top_k == 0 && token_budget < shape->block_size)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_RANGE,
                   "quest: token_budget %" G_GINT64_FORMAT " is less than one block (block_size %d); "
                   "raise it or set top_k",
                   token_budget, shape->block_size);
      return FALSE;
    }
  self->budget_blocks = top_k > 0 ? top_k : token_budget / shape->block_size;
  self->sink_blocks = sift_params_get_int (params, "sink_blocks");
  self->recent_blocks = sift_params_get_int (params, "recent_blocks");
  self->dense_threshold = sift_params_get_int (params, "dense_threshold_blocks");
  self->prefill = sift_params_get_bool (params, "prefill");

  self->dense_layer = g_new0 (gboolean, shape->n_layers);
  gsize n_dense = 0;
  const gint64 *dense = sift_params_get_int_list (params, "dense_layers", &n_dense);
  for (gsize i = 0; i < n_dense; i++)
    if (dense[i] < shape->n_layers)
      self->dense_layer[dense[i]] = TRUE;

  self->meta = quest_meta_new (shape->n_layers, shape->n_kv_heads, shape->head_dim);
  return TRUE;
}

static void
quest_finalize (SiftPolicy *policy)
{
  Quest *self = (Quest *) policy;
  g_clear_pointer (&self->meta, quest_meta_free);
  g_clear_pointer (&self->dense_layer, g_free);
}

static void
quest_reset (SiftPolicy *policy)
{
  quest_meta_clear (((Quest *) policy)->meta);
}

static gboolean
quest_on_offload (SiftPolicy *policy, const SiftPolicyContext *ctx, const SiftBlockInfo *block,
                  GError **error)
{
  Quest *self = (Quest *) policy;
  return quest_meta_update (self->meta, ctx->layer, block->block_id, &block->k, block->meta->n_valid, error);
}

/* Bounds for blocks whose offload hook this instance never saw (the runner
 * calls the hooks of the layer's prefill policy; Quest placed in decode
 * only misses the prompt's blocks): their keys are read once through the
 * engine, counted as bytes loaded. Without an engine the missing block stays
 * missing and quest_head_bounds names it. */
static gboolean
fill_missing_bounds (Quest *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n,
                     GError **error)
{
  const SiftModelShape *shape = self->parent.shape;
  if (ctx->engine == NULL)
    return TRUE;
  for (gsize b = 0; b < n; b++)
    {
      if (quest_meta_block (self->meta, ctx->layer, available[b]) != NULL)
        continue;
      if (available[b] < 0 || available[b] >= ctx->n_blocks)
        continue; /* not a block of this layer: quest_head_bounds reports it */
      const SiftBlockMeta *m = &ctx->blocks[available[b]];
      g_autofree gint64 *pos = g_new (gint64, m->n_valid);
      for (gint32 t = 0; t < m->n_valid; t++)
        pos[t] = m->first_token + t;
      gsize floats = (gsize) shape->n_kv_heads * (gsize) m->n_valid * (gsize) shape->head_dim;
      g_autofree float *kbuf = g_new (float, floats); /* [n_kv_heads][n_valid][head_dim] */
      g_autofree float *vbuf = g_new (float, floats);
      SiftView k = sift_view_htd (kbuf, SIFT_DTYPE_F32, shape->n_kv_heads, m->n_valid, shape->head_dim);
      SiftView v = sift_view_htd (vbuf, SIFT_DTYPE_F32, shape->n_kv_heads, m->n_valid, shape->head_dim);
      if (!sift_engine_gather_rows (ctx->engine, ctx->layer, pos, (gsize) m->n_valid, &k, &v, error)
          || !quest_meta_update (self->meta, ctx->layer, available[b], &k, m->n_valid, error))
        return FALSE;
    }
  return TRUE;
}

static gboolean
quest_select_blocks (SiftPolicy *policy, const SiftPolicyContext *ctx, const gint64 *available,
                     gsize n, SiftSelection *selected, GError **error)
{
  Quest *self = (Quest *) policy;
  const SiftModelShape *shape = policy->shape;
  gboolean dense = (ctx->layer >= 0 && ctx->layer < shape->n_layers && self->dense_layer[ctx->layer])
                   || (gint64) n <= self->dense_threshold || (gint64) n <= self->budget_blocks
                   || (ctx->phase == SIFT_PHASE_PREFILL && !self->prefill);
  if (dense)
    {
      for (gsize b = 0; b < n; b++)
        sift_selection_add (selected, available[b]);
      return TRUE;
    }

  const gint32 n_rank = quest_n_rankings (self->mode, shape->n_q_heads, shape->n_kv_heads);
  g_autofree float *bounds = g_new (float, (gsize) shape->n_q_heads * n); /* [n_q_heads][n] */
  g_autofree float *rank = g_new (float, (gsize) n_rank * n);             /* [n_rank][n] */
  g_autofree guint8 *keep = g_new (guint8, n);                            /* [n] */
  if (!fill_missing_bounds (self, ctx, available, n, error))
    return FALSE;
  if (!quest_head_bounds (self->meta, ctx->layer, &ctx->q, ctx->phase == SIFT_PHASE_PREFILL, available, n,
                          bounds, error))
    return FALSE;
  quest_rank (bounds, shape->n_q_heads, shape->n_kv_heads, n, self->mode, self->reduce, rank);
  for (gint32 r = 0; r < n_rank; r++)
    {
      quest_pick (rank + (gsize) r * n, n, (gsize) self->budget_blocks, (gsize) self->sink_blocks,
                  (gsize) self->recent_blocks, keep);
      for (gsize b = 0; b < n; b++)
        {
          if (!keep[b])
            continue;
          if (self->mode == QUEST_MODE_SHARED)
            sift_selection_add (selected, available[b]);
          else if (self->mode == QUEST_MODE_PER_Q_HEAD)
            sift_selection_add_q_head (selected, available[b], r);
          else
            sift_selection_add_kv_head (selected, available[b], r);
        }
    }
  return TRUE;
}

static const SiftPolicyOps quest_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "quest",
  .version = "1.0",
  .description = "query-aware block selection from per-block key min/max bounds (Tang et al., ICML 2024)",
  .flags = SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .params = quest_params,
  .instance_size = sizeof (Quest),
  .init = quest_init,
  .finalize = quest_finalize,
  .reset = quest_reset,
  .select_blocks = quest_select_blocks,
  .on_prefill_offload = quest_on_offload,
  .on_decode_offload = quest_on_offload,
};

SIFT_PLUGIN_DEFINE (&quest_ops)
