/* What the engine reads of a validated selection beyond <sift/policy.h>. */
#pragma once

#include <sift/policy.h>

/* The query-head bits of the selection's i-th block (ascending ids, as
 * sift_selection_block): bit h % 64 of word h / 64 for query head h. */
const guint64 *sift_selection_heads_at (const SiftSelection *sel, gsize i);
