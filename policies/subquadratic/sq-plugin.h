/* Subquadratic policy state and its engine-facing calls. subquadratic.c
 * wraps these in the ops table; tests drive them against a fake engine. */
#pragma once

#include <sift/plugin.h>

#include "sq-core.h"

/* Landmark memory of one layer: complete block means in the storage dtype,
 * and a running mean of the block being filled. Tokens [0, folded) have
 * been folded in, in position order. */
typedef struct {
  gint64 n_done;      /* complete blocks, 0 .. n_done - 1 */
  gint64 capacity;    /* blocks allocated */
  void *k, *v;        /* [capacity][kv_heads][head_dim], f32 or f16 */
  float *open_k;      /* [kv_heads][head_dim]: running mean of block n_done */
  float *open_v;
  gint64 open_count;  /* its positions folded so far, < block_size */
  gint64 open_present; /* of those, tokens in the mean (a bounded cache may have evicted the rest) */
} SqLandmarks;

typedef struct {
  SiftPolicy parent;
  SqConfig config;
  gint64 *globals;          /* owned copy behind config.globals */
  SiftDType lm_dtype;       /* f32 or f16 */
  gint32 n_layers, kv_heads, q_heads, head_dim;
  float scale;
  SqLandmarks *layers;      /* [n_layers] */

  /* Scratch of one call, kept between calls. */
  SqStamp call_stamp;       /* positions already listed for this call */
  SqStamp call_bstamp;      /* landmark blocks already listed for this call */
  gint64 *blocks_needed;    /* landmark blocks of this call, first use order */
  gsize blocks_needed_cap;
  SqStamp ts, bs;           /* per-row dedup */
  gint64 *cand;             /* [rows][max_tok]: each row's token candidates */
  gint64 *lcand;            /* [rows][max_blk] */
  gsize *n_cand, *n_lcand;  /* [rows] */
  gsize cand_cap, lcand_cap, rows_cap;
  gint64 *scattered;        /* positions gathered from the store, ascending */
  gsize scattered_cap;
  gint32 *pos_map;          /* [positions]: workspace row of a scattered position */
  gint64 pos_map_cap;
  gint32 *blk_map;          /* [blocks]: landmark workspace row */
  gint64 blk_map_cap;
  float *ws_k, *ws_v;       /* f32 [kv_heads][n_ws][head_dim] */
  gsize ws_cap;
  float *lws_k, *lws_v;     /* f32 [kv_heads][n_lws][head_dim] */
  gsize lws_cap;
  float *tmp_k, *tmp_v;     /* gather / catch-up staging */
  gsize tmp_cap;
  /* Per worker, one tile of SQ_BAND_ROWS rows: */
  gint32 *idx;              /* [workers][SQ_BAND_ROWS * (max_tok + max_blk) + window + SQ_BAND_ROWS] */
  gsize idx_cap;
  const float **ptrs;       /* [workers][2 * SQ_BAND_ROWS * (max_tok + max_blk)] */
  gsize ptrs_cap;
  float *acc;               /* [workers][SQ_BAND_ROWS * head_dim] */
  gsize acc_cap;
  float *panels;            /* workspace keys packed for the band: [kv_heads][sq_panel_floats (n_ws)] */
  gsize panels_cap;
} SqPolicy;

/* After the base fields are set (parent.shape): copies config (and its
 * globals). lm_dtype is f32 or f16. */
gboolean sq_policy_setup (SqPolicy *self, const SqConfig *config, SiftDType lm_dtype, GError **error);
void sq_policy_clear (SqPolicy *self);
/* New sequence: landmark memory of every layer emptied. */
void sq_policy_reset (SqPolicy *self);

/* Prefill chunk or decode step: writes out f32 [q_heads][n_q][head_dim]
 * and lse [q_heads][n_q] over the row's candidates. */
gboolean sq_policy_compute (SqPolicy *self, const SiftPolicyContext *ctx, SiftView *out, float *lse,
                            GError **error);
/* A block about to be stored: its tokens fold into the layer's landmarks. */
gboolean sq_policy_offload (SqPolicy *self, const SiftPolicyContext *ctx, const SiftBlockInfo *block,
                            GError **error);

/* With a bounded cache (score_eviction, ABI 1.1): the window the next call
 * needs and the globals stay, the other tokens go oldest first; a budget
 * that cannot hold window and globals is an error. */
gboolean sq_policy_score_eviction (SqPolicy *self, const SiftPolicyContext *ctx, const SiftEvictCandidates *cand,
                                   float *scores, GError **error);

/* Landmark block b of `layer`, kv head g, as f32 (tests): FALSE unless complete. */
gboolean sq_policy_landmark (const SqPolicy *self, gint32 layer, gint64 b, gint32 g, float *k, float *v);
