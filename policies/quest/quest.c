/* The Quest policy (Tang et al., ICML 2024), whole: per-block key boxes
 * (channel-wise min and max) from the offload hooks; for each decode step
 * (and optionally each prefill chunk) the blocks whose keys could score
 * highest for the current query, per kv head. docs/policies/quest.md; the
 * unit tests include this file (tests/policies/quest/test-quest-core.c). */
#include <math.h>
#include <string.h>

#include <sift/plugin.h>

typedef enum { QUEST_MODE_PER_KV_HEAD, QUEST_MODE_SHARED, QUEST_MODE_PER_Q_HEAD } QuestMode;
typedef enum { QUEST_REDUCE_MAX, QUEST_REDUCE_MEAN } QuestReduce;

/* Key boxes by (layer, block id): for kv head g, kmax then kmin, so that
 * with q split by sign the bound is one dot product (see quest_head_bounds). */
typedef struct {
  gint32 n_layers, n_kv_heads, head_dim;
  gint64 n_present;   /* blocks with a box, all layers */
  float **box;        /* [n_layers] -> [capacity][n_kv_heads][2][head_dim] */
  guint8 **present;   /* [n_layers] -> [capacity] */
  gint64 *capacity;   /* [n_layers] */
} QuestMeta;

static QuestMeta *
quest_meta_new (gint32 n_layers, gint32 n_kv_heads, gint32 head_dim)
{
  QuestMeta *meta = g_new0 (QuestMeta, 1);
  *meta = (QuestMeta) { n_layers, n_kv_heads, head_dim, 0, g_new0 (float *, n_layers),
                        g_new0 (guint8 *, n_layers), g_new0 (gint64, n_layers) };
  return meta;
}

/* A new sequence: forgets every block of every layer. */
static void
quest_meta_clear (QuestMeta *meta)
{
  for (gint32 l = 0; l < meta->n_layers; l++)
    {
      g_clear_pointer (&meta->box[l], g_free);
      g_clear_pointer (&meta->present[l], g_free);
      meta->capacity[l] = 0;
    }
  meta->n_present = 0;
}

static void
quest_meta_free (QuestMeta *meta)
{
  quest_meta_clear (meta);
  g_free (meta->box);
  g_free (meta->present);
  g_free (meta->capacity);
  g_free (meta);
}

static gsize
box_floats (const QuestMeta *meta)
{
  return 2 * (gsize) meta->n_kv_heads * (gsize) meta->head_dim;
}

/* The box of block `id` of `layer` ([n_kv_heads][2][head_dim]: kmax, kmin), or NULL. */
static const float *
quest_meta_block (const QuestMeta *meta, gint32 layer, gint64 id)
{
  if (layer < 0 || layer >= meta->n_layers || id < 0 || id >= meta->capacity[layer] || !meta->present[layer][id])
    return NULL;
  return meta->box[layer] + (gsize) id * box_floats (meta);
}

/* The box of block `id` from k ([n_kv_heads][>= n_valid][head_dim], any
 * dtype): only rows below n_valid count. A block seen again is recomputed. */
static gboolean
quest_meta_update (QuestMeta *meta, gint32 layer, gint64 id, const SiftView *k, gint32 n_valid, GError **error)
{
  const gint32 d = meta->head_dim;
  if (!sift_view_check (k, "quest: block keys", error))
    return FALSE;
  if (layer < 0 || layer >= meta->n_layers || id < 0 || k->n_heads != meta->n_kv_heads || k->head_dim != d
      || n_valid < 1 || n_valid > k->n_tokens)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                   "quest: block %" G_GINT64_FORMAT " of layer %d: keys [%d heads][%" G_GINT64_FORMAT
                   " rows][%d dim] with %d valid do not fit %d layers of [%d][..][%d]",
                   id, layer, k->n_heads, k->n_tokens, k->head_dim, n_valid, meta->n_layers, meta->n_kv_heads, d);
      return FALSE;
    }
  if (id >= meta->capacity[layer]) /* doubling: ids arrive in order */
    {
      gint64 cap = MAX (meta->capacity[layer] * 2, 64);
      while (cap <= id)
        cap *= 2;
      meta->box[layer] = g_renew (float, meta->box[layer], (gsize) cap * box_floats (meta));
      meta->present[layer] = g_renew (guint8, meta->present[layer], (gsize) cap);
      memset (meta->present[layer] + meta->capacity[layer], 0, (gsize) (cap - meta->capacity[layer]));
      meta->capacity[layer] = cap;
    }
  float *box = meta->box[layer] + (gsize) id * box_floats (meta);
  g_autofree float *row = g_new (float, d);
  for (gint32 g = 0; g < meta->n_kv_heads; g++)
    {
      float *hi = box + (gsize) g * 2 * d, *lo = hi + d;
      for (gint32 t = 0; t < n_valid; t++)
        {
          sift_view_row_to_f32 (k, g, t, row);
          for (gint32 i = 0; i < d; i++)
            {
              hi[i] = t == 0 ? row[i] : fmaxf (hi[i], row[i]);
              lo[i] = t == 0 ? row[i] : fminf (lo[i], row[i]);
            }
        }
    }
  meta->n_present += !meta->present[layer][id];
  meta->present[layer][id] = 1;
  return TRUE;
}

/* The paper's bound of q.k over every key in the box: each channel's
 * product is linear in k_i, so its maximum over [kmin_i, kmax_i] sits at an
 * end, and the channels are independent inside the box. The plain
 * reference of quest_head_bounds. */
static G_GNUC_UNUSED float
quest_bound (const float *q, const float *kmin, const float *kmax, gint32 head_dim)
{
  float s = 0.0f;
  for (gint32 i = 0; i < head_dim; i++)
    s += fmaxf (q[i] * kmax[i], q[i] * kmin[i]);
  return s;
}

/* Bounds of every query head against every available block, out
 * [n_q_heads][n]: the largest over q's rows, or with mean_query the bound
 * of their mean (prefill: the chunk's mean query). max(q_i M_i, q_i m_i) is
 * q_i M_i for q_i >= 0 and q_i m_i otherwise, so with a row split into
 * [max(q, 0) | min(q, 0)] and a box stored [kmax | kmin], a bound is a dot
 * product of 2 head_dim: one sift_score_tile per kv head. Fails naming the
 * first block without a box. */
static gboolean
quest_head_bounds (const QuestMeta *meta, gint32 layer, const SiftView *q, gboolean mean_query,
                   const gint64 *available, gsize n, float *out, GError **error)
{
  const gint32 d = meta->head_dim, nq = q->n_heads, nkv = meta->n_kv_heads;
  if (!sift_view_check (q, "quest: q", error))
    return FALSE;
  if (d != q->head_dim || nq % nkv != 0 || q->n_tokens < 1)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                   "quest: q is [%d heads][%" G_GINT64_FORMAT " rows][%d dim], the model has %d kv heads of dim %d",
                   nq, q->n_tokens, q->head_dim, nkv, d);
      return FALSE;
    }
  const gint32 group = nq / nkv;
  const gint64 n_rows = mean_query ? 1 : q->n_tokens;
  const gsize w = 2 * (gsize) d;
  g_autofree float *rows = g_new0 (float, (gsize) nq * n_rows * w); /* [nq][n_rows][max part | min part] */
  g_autofree float *cols = g_new (float, MAX (n, 1) * w);           /* [n] boxes of one kv head */
  g_autofree float *dots = g_new (float, (gsize) group * n_rows * MAX (n, 1));
  g_autofree float *x = g_new (float, d);
  for (gint32 h = 0; h < nq; h++)
    for (gint64 t = 0; t < q->n_tokens; t++)
      {
        float *r = rows + ((gsize) h * n_rows + (gsize) (mean_query ? 0 : t)) * w;
        sift_view_row_to_f32 (q, h, t, x);
        for (gint32 i = 0; i < d; i++)
          r[i] += mean_query ? x[i] / (float) q->n_tokens : x[i];
      }
  for (gsize r = 0; r < (gsize) nq * n_rows; r++)
    for (gint32 i = 0; i < d; i++)
      {
        float *p = rows + r * w;
        p[d + i] = MIN (p[i], 0.0f);
        p[i] = MAX (p[i], 0.0f);
      }
  for (gint32 g = 0; g < nkv; g++)
    {
      for (gsize b = 0; b < n; b++)
        {
          const float *box = quest_meta_block (meta, layer, available[b]);
          if (box == NULL)
            {
              g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                           "quest: no key bounds for block %" G_GINT64_FORMAT " of layer %d "
                           "(its offload hook never ran for this policy)", available[b], layer);
              return FALSE;
            }
          memcpy (cols + b * w, box + (gsize) g * w, w * sizeof (float));
        }
      sift_score_tile (rows + (gsize) g * group * n_rows * w, w, group * n_rows, cols, w, (gint64) n, w, dots);
      for (gint32 hh = 0; hh < group; hh++)
        for (gsize b = 0; b < n; b++)
          {
            float best = -INFINITY;
            for (gint64 t = 0; t < n_rows; t++)
              best = fmaxf (best, dots[((gsize) hh * n_rows + (gsize) t) * n + b]);
            out[(gsize) (g * group + hh) * n + b] = best;
          }
    }
  return TRUE;
}

/* Rankings of the head bounds [n_q_heads][n]: per kv head, reducing each
 * group's query heads; per query head, each its own; shared, one for all. */
static gint32
quest_n_rankings (QuestMode mode, gint32 n_q_heads, gint32 n_kv_heads)
{
  return mode == QUEST_MODE_SHARED ? 1 : mode == QUEST_MODE_PER_Q_HEAD ? n_q_heads : n_kv_heads;
}

static void
quest_rank (const float *bounds, gint32 n_q_heads, gint32 n_kv_heads, gsize n, QuestMode mode, QuestReduce reduce,
            float *out)
{
  const gint32 n_rank = quest_n_rankings (mode, n_q_heads, n_kv_heads), per = n_q_heads / n_rank;
  for (gint32 r = 0; r < n_rank; r++)
    for (gsize b = 0; b < n; b++)
      {
        float acc = reduce == QUEST_REDUCE_MAX ? -INFINITY : 0.0f;
        for (gint32 h = r * per; h < (r + 1) * per; h++)
          acc = reduce == QUEST_REDUCE_MAX ? fmaxf (acc, bounds[(gsize) h * n + b])
                                           : acc + bounds[(gsize) h * n + b] / (float) per;
        out[(gsize) r * n + b] = acc;
      }
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
  g_autofree float *bounds = g_new (float, (gsize) shape->n_q_heads * n); /* [n_q_heads][n] */
  g_autofree float *rank = g_new (float, (gsize) n_rank * n);             /* [n_rank][n] */
  g_autofree guint8 *keep = g_new (guint8, n);
  if (!fill_missing_bounds (self, ctx, available, n, error)
      || !quest_head_bounds (self->meta, ctx->layer, &ctx->q, ctx->phase == SIFT_PHASE_PREFILL, available, n,
                             bounds, error))
    return FALSE;
  quest_rank (bounds, shape->n_q_heads, shape->n_kv_heads, n, self->mode, self->reduce, rank);
  for (gint32 r = 0; r < n_rank; r++)
    {
      sift_top_k (rank + (gsize) r * n, n, (gsize) self->budget_blocks, (gsize) self->sink_blocks,
                  (gsize) self->recent_blocks, keep);
      for (gsize b = 0; b < n; b++)
        if (keep[b] && self->mode == QUEST_MODE_SHARED)
          sift_selection_add (selected, available[b]);
        else if (keep[b] && self->mode == QUEST_MODE_PER_Q_HEAD)
          sift_selection_add_q_head (selected, available[b], r);
        else if (keep[b])
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
