/* The xattn_bsa plugin's instance and glue (xattn-glue.c), shared with the
 * descriptor (xattn-bsa.c) and with tests that drive select_blocks without
 * the host's parameter parsing. */
#pragma once

#include <sift/policy.h>

#include "xattn-score.h"

G_BEGIN_DECLS

/* The declared parameters, resolved. */
typedef struct {
  double threshold;
  gint64 stride;
  gint64 block;
  XattnVote vote;
  double vote_threshold;
  gint64 min_query_len;
} XattnBsaConfig;

/* The instance. */
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

/* The methods (xattn-glue.c), for the ops table and for tests. */
void xattn_bsa_finalize (SiftPolicy *self);
gboolean xattn_bsa_select_blocks (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available,
                                  gsize n_available, SiftSelection *selected, GError **error);

/* What init does once the parameters are read: checks them against the
 * shape (self->shape must be set) and sets the instance up. */
gboolean xattn_bsa_configure (SiftPolicy *self, const XattnBsaConfig *cfg, GError **error);

G_END_DECLS
