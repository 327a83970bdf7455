/* Random queries and keys for the XAttention scoring tests (xattn-data.c). */
#pragma once

#include <sift/sift.h>

#include "xattn-score.h"

typedef struct {
  XattnGeometry geo;
  gint64 n_tokens;   /* keys 0 .. n_tokens - 1 */
  float *q;          /* [n_q_heads][n_tokens][d]: queries at every position */
  float *k;          /* [n_kv_heads][n_tokens][d] */
} Data;

/* Uniform in [-2, 2], seeded. */
Data *data_new (const XattnGeometry *geo, gint64 n_tokens, guint32 seed);
void data_free (Data *d);
/* Query row of head h, key row of kv head g, at a position. */
const float *q_row (const Data *d, gint32 h, gint64 pos);
const float *k_row (const Data *d, gint32 g, gint64 pos);

/* The scorer's block scores for the chunk [q_pos, kv_end) (xattn-data.c
 * says how the history is fed). */
float *scorer_scores_ex (const Data *d, gint64 q_pos, gint64 kv_end, gint64 piece, gboolean as_f16, gboolean staged);
float *scorer_scores (const Data *d, gint64 q_pos, gint64 kv_end, gint64 piece, gboolean as_f16);
/* A small geometry the tests share. */
extern const XattnGeometry small_geo;
