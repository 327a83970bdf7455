/* Quest's per-block metadata: the key box of every stored block (the
 * channel-wise max and min of its keys, per kv head) and the bound of a
 * query against a box. Private to policies/quest: the ops file (quest.c)
 * fills the boxes from the offload hooks and ranks blocks by the bounds;
 * tests/policies/quest/test-quest-core.c checks both against oracles. */
#pragma once

#include <sift/plugin.h>

/* Key boxes by (layer, block id): for kv head g, kmax then kmin, so that
 * with q split by sign the bound is one dot product (see quest_head_bounds). */
typedef struct {
  gint32 n_layers, n_kv_heads, head_dim;
  gint64 n_present;   /* blocks with a box, all layers */
  float **box;        /* [n_layers] -> [capacity][n_kv_heads][2][head_dim] */
  guint8 **present;   /* [n_layers] -> [capacity] */
  gint64 *capacity;   /* [n_layers] */
  /* quest_head_bounds' scratch, kept across calls (a decode step scores
   * every block: no allocation per step). */
  float *rows;        /* [n_q_heads][n_rows][2 head_dim] */
  float *work;        /* per worker: [BOUNDS_CHUNK][2 head_dim] gathered boxes, [rows][BOUNDS_CHUNK] dots */
  gsize rows_size, work_size; /* floats */
} QuestMeta;

QuestMeta *quest_meta_new (gint32 n_layers, gint32 n_kv_heads, gint32 head_dim);
void quest_meta_free (QuestMeta *meta);
/* A new sequence: forgets every block of every layer. */
void quest_meta_clear (QuestMeta *meta);

/* The box of block `id` of `layer` ([n_kv_heads][2][head_dim]: kmax, kmin), or NULL. */
const float *quest_meta_block (const QuestMeta *meta, gint32 layer, gint64 id);
/* The box of block `id` from k ([n_kv_heads][>= n_valid][head_dim], any
 * dtype): only rows below n_valid count. A block seen again is recomputed. */
gboolean quest_meta_update (QuestMeta *meta, gint32 layer, gint64 id, const SiftView *k, gint32 n_valid,
                            GError **error);

/* The bound of q.k over every key in the box [kmin, kmax] (head_dim
 * channels): the plain reference of quest_head_bounds. */
float quest_bound (const float *q, const float *kmin, const float *kmax, gint32 head_dim);

/* quest_head_bounds in parts, for a caller that splits the work itself
 * (quest.c: a kv head's bounds, ranking and pick in one task). */
typedef struct {
  const QuestMeta *meta;
  gint32 layer, group;
  gint64 n_rows;
  const gint64 *available;
  gsize n, n_chunks, work_floats;
  gboolean run;            /* the blocks are one run of ids: boxes read in place */
  float *out;              /* [n_q_heads][n] */
} QuestBounds;

/* q's rows split by sign into meta's scratch, every block checked for a
 * box (the error names the first without), per-worker scratch for
 * sift_parallel_n_threads () workers; fills qb. */
gboolean quest_bounds_prepare (QuestMeta *meta, gint32 layer, const SiftView *q, gboolean mean_query,
                               const gint64 *available, gsize n, float *out, QuestBounds *qb, GError **error);
/* The bounds of kv head g's query heads over blocks [b0, b0 + nb) (nb <=
 * QUEST_BOUNDS_CHUNK), with worker's scratch: one sift_score_tile. */
void quest_bounds_score (const QuestBounds *qb, gint32 g, gsize b0, gsize nb, gint worker);
#define QUEST_BOUNDS_CHUNK 128

/* Bounds of every query head of q against every available block of
 * `layer`, out [n_q_heads][n]: the largest over q's rows, or with
 * mean_query the bound of their mean (prefill: the chunk's mean query).
 * Fails naming the first block without a box. Scored on sift's thread
 * pool in tasks of (kv head, BOUNDS_CHUNK blocks): each bound is the same
 * dot product whatever the split, so the result does not depend on the
 * thread count. */
gboolean quest_head_bounds (QuestMeta *meta, gint32 layer, const SiftView *q, gboolean mean_query,
                            const gint64 *available, gsize n, float *out, GError **error);
