/* The synthetic source: hooks for tests only. */
#pragma once

#include "synthetic.h"

/* Rotary positions become position + offset (content stays keyed by the
 * position): shifting every position by one offset must leave q . k
 * unchanged, which is what "relative-position structure" means. */
void sift_model_synthetic_set_rope_offset (SiftModelSource *src, gint64 offset);

/* Standard normal values from a counter-based hash of (seed, tag, layer,
 * head, position): out[n]. */
void sift_synth_gaussians (guint64 seed, guint32 tag, gint32 layer, gint32 head, gint64 position,
                           float *out, gsize n);
