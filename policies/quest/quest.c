/* The Quest policy (Tang et al., ICML 2024): per-block key boxes
 * (channel-wise min and max, quest-meta.c) from the offload hooks; for each
 * decode step (and optionally each prefill chunk) the blocks whose keys
 * could score highest for the current query, per kv head.
 * docs/policies/quest.md; the unit tests include this file
 * (tests/policies/quest/test-quest-core.c). */
#include <math.h>

#include <sift/plugin.h>

#include "quest-meta.h"

typedef enum { QUEST_MODE_PER_KV_HEAD, QUEST_MODE_SHARED, QUEST_MODE_PER_Q_HEAD } QuestMode;
typedef enum { QUEST_REDUCE_MAX, QUEST_REDUCE_MEAN } QuestReduce;

/* Rankings of the head bounds [n_q_heads][n]: per kv head, reducing each
 * group's query heads; per query head, each its own; shared, one for all. */
static gint32
quest_n_rankings (QuestMode mode, gint32 n_q_heads, gint32 n_kv_heads)
{
  return mode == QUEST_MODE_SHARED ? 1 : mode == QUEST_MODE_PER_Q_HEAD ? n_q_heads : n_kv_heads;
}

/* Ranking r alone into out [n]. */
static void
quest_rank_one (const float *bounds, gint32 n_q_heads, gint32 n_kv_heads, gsize n, QuestMode mode, QuestReduce reduce,
                gint32 r, float *out)
{
  const gint32 per = n_q_heads / quest_n_rankings (mode, n_q_heads, n_kv_heads);
  for (gsize b = 0; b < n; b++)
    {
      float acc = reduce == QUEST_REDUCE_MAX ? -INFINITY : 0.0f;
      for (gint32 h = r * per; h < (r + 1) * per; h++)
        acc = reduce == QUEST_REDUCE_MAX ? fmaxf (acc, bounds[(gsize) h * n + b])
                                         : acc + bounds[(gsize) h * n + b] / (float) per;
      out[b] = acc;
    }
}

static void
quest_rank (const float *bounds, gint32 n_q_heads, gint32 n_kv_heads, gsize n, QuestMode mode, QuestReduce reduce,
            float *out)
{
  const gint32 n_rank = quest_n_rankings (mode, n_q_heads, n_kv_heads);
  for (gint32 r = 0; r < n_rank; r++)
    quest_rank_one (bounds, n_q_heads, n_kv_heads, n, mode, reduce, r, out + (gsize) r * n);
}

/* ---- The plugin -------------------------------------------------------- */

typedef struct {
  SiftPolicy parent;
  QuestMode mode;
  QuestReduce reduce;
  gint64 budget_blocks;   /* stored blocks kept per ranking, sinks and recent included */
  gint64 sink_blocks, recent_blocks;
  gint64 dense_threshold; /* at most this many available blocks: every block */
  gboolean prefill;       /* select in prefill too (with the chunk's mean query) */
  gboolean *dense_layer;  /* [n_layers] */
  QuestMeta *meta;
  /* select_blocks' scratch, grown to the blocks of the longest call. */
  float *bounds;          /* [n_q_heads][n] */
  float *rank;            /* [n_rank][n] */
  guint8 *keep;           /* [n_rank][n] */
  gsize scratch_blocks;
} Quest;

static const SiftParamSpec quest_params[] = {
  SIFT_PARAM_CHOICE ("mode", "per_kv_head", SIFT_CHOICES ("per_kv_head", "per_q_head", "shared"),
    "per_kv_head: one ranking per kv head from its group's query heads; per_q_head: one per query head; "
    "shared: one for all heads"),
  SIFT_PARAM_CHOICE ("gqa_reduce", "max", SIFT_CHOICES ("max", "mean"),
    "how the query heads reading one kv head (or all heads, shared) combine their bounds"),
  SIFT_PARAM_INT ("token_budget", 2048, 1, 1e12,
    "stored tokens attended per head, sinks and recent included (token_budget / block_size blocks)"),
  SIFT_PARAM_INT ("top_k", 0, 0, 1e9,
    "blocks attended per head, sinks and recent included; overrides token_budget when > 0"),
  SIFT_PARAM_INT ("sink_blocks", 0, 0, 1e9, "first stored blocks always kept (attention sinks)"),
  SIFT_PARAM_INT ("recent_blocks", 0, 0, 1e9, "last stored blocks always kept (locality)"),
  SIFT_PARAM_INT ("dense_threshold_blocks", 0, 0, 1e12,
    "attend every block while a layer has at most this many stored blocks"),
  SIFT_PARAM_INT_LIST ("dense_layers", "[0, 1]", 0, 1e6,
    "layers that attend every block (the paper keeps the first two dense); layers past the model are ignored"),
  SIFT_PARAM_BOOL ("prefill", FALSE,
    "placed in prefill: select with the chunk's mean query (false: prefill attends every block)"),
  SIFT_PARAM_END,
};

static gboolean
quest_init (SiftPolicy *policy, const SiftParams *params, GError **error)
{
  Quest *self = (Quest *) policy;
  const SiftModelShape *shape = policy->shape;
  /* In the order of the choices declared above. */
  static const QuestMode modes[] = { QUEST_MODE_PER_KV_HEAD, QUEST_MODE_PER_Q_HEAD, QUEST_MODE_SHARED };
  self->mode = modes[sift_params_get_choice (params, "mode")];
  self->reduce = sift_params_get_choice (params, "gqa_reduce") == 0 ? QUEST_REDUCE_MAX : QUEST_REDUCE_MEAN;
  gint64 top_k = sift_params_get_int (params, "top_k"), token_budget = sift_params_get_int (params, "token_budget");
  if (top_k == 0 && token_budget < shape->block_size)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_RANGE,
                   "quest: token_budget %" G_GINT64_FORMAT " is less than one block (block_size %d); "
                   "raise it or set top_k", token_budget, shape->block_size);
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
  g_clear_pointer (&self->bounds, g_free);
  g_clear_pointer (&self->rank, g_free);
  g_clear_pointer (&self->keep, g_free);
}

static void
quest_reset (SiftPolicy *policy)
{
  quest_meta_clear (((Quest *) policy)->meta);
}

static gboolean
quest_on_offload (SiftPolicy *policy, const SiftPolicyContext *ctx, const SiftBlockInfo *block, GError **error)
{
  return quest_meta_update (((Quest *) policy)->meta, ctx->layer, block->block_id, &block->k, block->meta->n_valid,
                            error);
}

/* Boxes for blocks whose offload hook this instance never saw (Quest placed
 * in decode only misses the prompt's): their keys are read once through the
 * engine, counted as bytes loaded. Without an engine a missing block stays
 * missing and quest_head_bounds names it. */
static gboolean
fill_missing_bounds (Quest *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n, GError **error)
{
  g_autoptr (GArray) missing = g_array_new (FALSE, FALSE, sizeof (gint64));
  for (gsize b = 0; b < n; b++)
    if (available[b] >= 0 && available[b] < ctx->n_blocks && !quest_meta_block (self->meta, ctx->layer, available[b]))
      g_array_append_val (missing, available[b]);
  if (ctx->engine == NULL || missing->len == 0)
    return TRUE;
  SiftStream *stream = sift_engine_stream_begin (ctx->engine, ctx->layer, (const gint64 *) missing->data,
                                                 missing->len, SIFT_LOAD_K);
  SiftStreamBlock blk;
  while (sift_engine_stream_next (stream, &blk, 1, error) > 0)
    if (!quest_meta_update (self->meta, ctx->layer, blk.block_id, &blk.k, blk.n_valid, error))
      {
        sift_engine_stream_end (stream);
        return FALSE;
      }
  return sift_engine_stream_end (stream);
}

/* Multiply-adds of a call's bounds below which the per-kv-head picking
 * stays on the calling thread. */
#define PICK_SERIAL_WORK ((gsize) 1 << 19)

typedef struct {
  Quest *self;
  const gint64 *available;
  gsize n;
  float *bounds, *rank;
  guint8 *keep;
  QuestBounds qb;
} Picking;

/* Kv heads [begin, end): each its group's bounds over every block (in
 * chunks, as quest_head_bounds scores them: the same bits), its ranking,
 * its pick into keep[g]. */
static void
pick_tasks (gint64 begin, gint64 end, gint worker, gpointer data)
{
  const Picking *pk = data;
  const Quest *self = pk->self;
  const SiftModelShape *shape = self->parent.shape;
  const gsize n = pk->n;
  for (gint32 g = (gint32) begin; g < (gint32) end; g++)
    {
      for (gsize b0 = 0; b0 < n; b0 += QUEST_BOUNDS_CHUNK)
        quest_bounds_score (&pk->qb, g, b0, MIN (QUEST_BOUNDS_CHUNK, n - b0), worker);
      quest_rank_one (pk->bounds, shape->n_q_heads, shape->n_kv_heads, n, self->mode, self->reduce, g,
                      pk->rank + (gsize) g * n);
      sift_top_k (pk->rank + (gsize) g * n, n, (gsize) self->budget_blocks, (gsize) self->sink_blocks,
                  (gsize) self->recent_blocks, pk->keep + (gsize) g * n);
    }
}

static gboolean
quest_select_blocks (SiftPolicy *policy, const SiftPolicyContext *ctx, const gint64 *available, gsize n,
                     SiftSelection *selected, GError **error)
{
  Quest *self = (Quest *) policy;
  const SiftModelShape *shape = policy->shape;
  if ((ctx->layer >= 0 && ctx->layer < shape->n_layers && self->dense_layer[ctx->layer])
      || (gint64) n <= self->dense_threshold || (gint64) n <= self->budget_blocks
      || (ctx->phase == SIFT_PHASE_PREFILL && !self->prefill))
    {
      for (gsize b = 0; b < n; b++)
        sift_selection_add (selected, available[b]);
      return TRUE;
    }
  const gint32 n_rank = quest_n_rankings (self->mode, shape->n_q_heads, shape->n_kv_heads);
  if (n > self->scratch_blocks)
    {
      self->scratch_blocks = MAX (n, 2 * self->scratch_blocks);
      g_free (self->bounds), g_free (self->rank), g_free (self->keep);
      self->bounds = g_new (float, (gsize) shape->n_q_heads * self->scratch_blocks);
      self->rank = g_new (float, (gsize) shape->n_q_heads * self->scratch_blocks); /* n_rank <= n_q_heads */
      self->keep = g_new (guint8, (gsize) shape->n_q_heads * self->scratch_blocks); /* [n_rank][n] */
    }
  float *bounds = self->bounds, *rank = self->rank;
  guint8 *keep = self->keep;
  if (!fill_missing_bounds (self, ctx, available, n, error))
    return FALSE;
  if (self->mode == QUEST_MODE_PER_KV_HEAD)
    {
      /* A kv head's bounds, ranking and pick in one task: one parallel loop a call. */
      Picking pk = { .self = self, .available = available, .n = n, .bounds = bounds, .rank = rank, .keep = keep };
      if (!quest_bounds_prepare (self->meta, ctx->layer, &ctx->q, ctx->phase == SIFT_PHASE_PREFILL, available, n,
                                 bounds, &pk.qb, error))
        return FALSE;
      const gsize work = n * 2 * (gsize) shape->head_dim * (gsize) pk.qb.group * (gsize) pk.qb.n_rows;
      sift_parallel_for (n_rank, work >= PICK_SERIAL_WORK ? 1 : n_rank, pick_tasks, &pk);
    }
  else
    {
      if (!quest_head_bounds (self->meta, ctx->layer, &ctx->q, ctx->phase == SIFT_PHASE_PREFILL, available, n, bounds,
                              error))
        return FALSE;
      quest_rank (bounds, shape->n_q_heads, shape->n_kv_heads, n, self->mode, self->reduce, rank);
      for (gint32 r = 0; r < n_rank; r++)
        sift_top_k (rank + (gsize) r * n, n, (gsize) self->budget_blocks, (gsize) self->sink_blocks,
                    (gsize) self->recent_blocks, keep + (gsize) r * n);
    }
  for (gint32 r = 0; r < n_rank; r++)
    {
      const guint8 *kept = keep + (gsize) r * n;
      for (gsize b = 0; b < n; b++)
        if (kept[b] && self->mode == QUEST_MODE_SHARED)
          sift_selection_add (selected, available[b]);
        else if (kept[b] && self->mode == QUEST_MODE_PER_Q_HEAD)
          sift_selection_add_q_head (selected, available[b], r);
        else if (kept[b])
          sift_selection_add_kv_head (selected, available[b], r);
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
