/* Quest's math (Tang et al., ICML 2024): per-block key bounds, the
 * query-aware upper bound, and block selection. No plugin glue here: the
 * unit tests compile this file directly. See docs/policies/quest.md. */
#pragma once

#include <glib.h>
#include <sift/plugin.h>

G_BEGIN_DECLS

typedef enum {
  QUEST_MODE_PER_KV_HEAD = 0, /* one ranking per kv head, from its group's query heads */
  QUEST_MODE_SHARED = 1,      /* one ranking for every head */
  QUEST_MODE_PER_Q_HEAD = 2,  /* one ranking per query head (the paper's reference code, after repeat_kv) */
} QuestMode;

typedef enum {
  QUEST_REDUCE_MAX = 0,  /* a block scores the highest bound among the heads it serves */
  QUEST_REDUCE_MEAN = 1, /* ... the mean of their bounds */
} QuestReduce;

/* One layer's key statistics, indexed by block id. */
typedef struct {
  float *minmax;          /* [capacity][2][n_kv_heads][head_dim]: min rows, then max rows */
  guint8 *present;        /* [capacity] */
  gint64 capacity;        /* block ids < capacity have a slot */
} QuestLayerMeta;

/* Per-sequence key statistics: for each (layer, block id) the per-channel
 * minimum and maximum of the block's keys over its valid tokens. */
typedef struct {
  gint32 n_layers, n_kv_heads, head_dim;
  gint64 n_present;       /* blocks with metadata, all layers */
  QuestLayerMeta *layers; /* [n_layers] */
} QuestMeta;

QuestMeta *quest_meta_new (gint32 n_layers, gint32 n_kv_heads, gint32 head_dim);
void quest_meta_free (QuestMeta *meta);
/* A new sequence: forgets every block of every layer. */
void quest_meta_clear (QuestMeta *meta);
/* Records block `block_id` of `layer` from k ([n_kv_heads][>= n_valid][head_dim],
 * any dtype a view takes): only rows 0..n_valid-1 count. A block seen again
 * is recomputed. */
gboolean quest_meta_update (QuestMeta *meta, gint32 layer, gint64 block_id, const SiftView *k,
                            gint32 n_valid, GError **error);
/* The block's [2][n_kv_heads][head_dim] (min then max), or NULL if unknown. */
const float *quest_meta_block (const QuestMeta *meta, gint32 layer, gint64 block_id);

/* The paper's upper bound of q.k over every key k inside the box [kmin, kmax]:
 * sum_i max(q_i * kmax_i, q_i * kmin_i). */
float quest_bound (const float *q, const float *kmin, const float *kmax, gint32 head_dim);

/* Bounds of every query head against every available block:
 * q f32 [n_q_heads][n_q][head_dim]; with mean_query the bound of each
 * head's mean row (prefill: the chunk's mean query), otherwise the largest
 * bound over the rows. out [n_q_heads][n]. Fails naming the first block
 * without metadata. */
gboolean quest_head_bounds (const QuestMeta *meta, gint32 layer, const SiftView *q, gboolean mean_query,
                            const gint64 *available, gsize n, float *out, GError **error);

/* Rankings from head bounds [n_q_heads][n]: per_kv_head gives [n_kv_heads][n]
 * reducing each group's query heads, per_q_head [n_q_heads][n] (each head's
 * own bounds), shared [1][n] reducing all heads. */
gint32 quest_n_rankings (QuestMode mode, gint32 n_q_heads, gint32 n_kv_heads);
void quest_rank (const float *head_bounds, gint32 n_q_heads, gint32 n_kv_heads, gsize n, QuestMode mode,
                 QuestReduce reduce, float *out);

/* Which blocks to keep of a ranking: sift_top_k (<sift/simd.h>), with the
 * sink and recent blocks forced. */

G_END_DECLS
