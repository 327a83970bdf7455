/* The xattn_bsa plugin's instance and glue (xattn-glue.c), shared with the
 * descriptor (xattn-bsa.c) and with tests that drive select_blocks without
 * the host's parameter parsing. */
#pragma once

#include <sift/plugin.h>

#include "xattn-score.h"

G_BEGIN_DECLS

typedef enum {
  XATTN_GRANULARITY_QUERY_BLOCK = 0, /* a block is attended only by the query blocks that chose it */
  XATTN_GRANULARITY_CHUNK = 1,       /* ... by every row of the chunk, for the heads that chose it */
} XattnGranularity;

typedef enum {
  XATTN_PLAN_NONE = 0,   /* no select_blocks yet for this chunk */
  XATTN_PLAN_DENSE = 1,  /* every block (short context, or nothing stored) */
  XATTN_PLAN_SPARSE = 2, /* plan and plan_ids hold the chunk's choice */
} XattnPlanState;

/* The declared parameters, resolved. */
typedef struct {
  double threshold;
  gint64 stride;
  gint64 block;
  XattnVote vote;
  double vote_threshold;
  gint64 min_query_len;
  XattnGranularity granularity;
  double norm;
  gboolean sum_exp;
  gint64 exact_rows;
  gboolean last_block;
} XattnBsaConfig;

/* The instance. */
typedef struct {
  SiftPolicy parent;
  XattnGeometry geo;
  double threshold;
  XattnVote vote;
  double vote_threshold;
  gint64 min_query_len;
  XattnGranularity granularity;
  gboolean last_block;  /* every head also attends the last stored block (sift's addition) */
  XattnScorer *scorer;
  gint64 exact_rows;   /* the chunk's last rows also scored exactly (0: none) */
  XattnScorer *exact;  /* stride 1, for those rows */
  float *exact_mass;   /* [n_q_heads][exact rows][n_kb] */
  gsize exact_cap;
  float *scores;       /* [n_q_heads][n_qb][n_kb] */
  guint8 *sel;         /* [n_q_heads][n_qb][n_kb] */
  gsize cap;           /* elements of scores and sel */
  /* The last select_blocks' answer, for compute on the same chunk. */
  XattnPlanState plan_state;
  gint32 plan_layer, plan_n_q;
  gint64 plan_q_pos, plan_qb0;
  XattnPlan plan;
  gint64 *plan_ids;    /* [plan.n] the available ids it was made for */
} XattnBsa;

/* The methods (xattn-glue.c), for the ops table and for tests. */
void xattn_bsa_finalize (SiftPolicy *self);
void xattn_bsa_reset (SiftPolicy *self);
gboolean xattn_bsa_select_blocks (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available,
                                  gsize n_available, SiftSelection *selected, GError **error);
/* Attends what the chunk's select_blocks chose, through the engine's
 * default pipeline: per run of query blocks (granularity query_block) or
 * once for the chunk. */
gboolean xattn_bsa_compute_prefill (SiftPolicy *self, const SiftPolicyContext *ctx, SiftView *out, float *lse,
                                    GError **error);

/* The ops table fields every table of these methods shares (the plugin's,
 * and the tests' without init). */
#define XATTN_BSA_OPS_METHODS                                                  \
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_REQUIRES_BLOCK_SELECTION, \
  .instance_size = sizeof (XattnBsa), .finalize = xattn_bsa_finalize,         \
  .reset = xattn_bsa_reset, .select_blocks = xattn_bsa_select_blocks,         \
  .compute_chunked_prefill = xattn_bsa_compute_prefill

/* What init does once the parameters are read: checks them against the
 * shape (self->shape must be set) and sets the instance up. */
gboolean xattn_bsa_configure (SiftPolicy *self, const XattnBsaConfig *cfg, GError **error);

G_END_DECLS
