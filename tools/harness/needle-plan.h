/* The needle planner: where a cell's needles, distractors and question go. */
#pragma once

#include "harness-config.h"

G_BEGIN_DECLS

/* Plans a prompt of n_tokens with the needle group at `depth`. With
 * block_size > 0 and harness.depth_span interior (the default) depths span
 * the interior blocks: 0 is the first token of the second block, 1 puts the
 * group's last token just before the last block that precedes the
 * question, so no depth hands the needle to a policy that keeps the first
 * or last block; otherwise (or when the interior cannot hold the group)
 * 0 is the first token after the sink tokens and 1 the last before the
 * question. Distractors (multikey) fall at seeded positions elsewhere in
 * the haystack. SIFT_HARNESS_ERROR_INVALID when the prompt cannot hold them. */
SiftNeedlePlan *sift_needle_plan_new (const SiftHarnessConfig *harness, gint64 n_tokens, double depth,
                                      gint64 sink_tokens, gint64 block_size, guint64 seed, GError **error);

G_END_DECLS
