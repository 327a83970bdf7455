/* The needle planner: where a cell's needles, distractors and question go. */
#pragma once

#include <sift/config.h>
#include <synthetic/synthetic.h>

G_BEGIN_DECLS

/* Plans a prompt of n_tokens with the needle group at `depth` (0: just
 * after the sink tokens, 1: just before the question). Distractors
 * (multikey) fall at seeded positions elsewhere in the haystack.
 * SIFT_HARNESS_ERROR_INVALID when the prompt cannot hold them. */
SiftNeedlePlan *sift_needle_plan_new (const SiftHarnessConfig *harness, gint64 n_tokens, double depth,
                                      gint64 sink_tokens, guint64 seed, GError **error);

G_END_DECLS
