/* Helpers of the MInference vertical-slash tests (vs-helpers.c): ISA
 * selection, random buffers and a GQA Q/K/V set. */
#pragma once

#include <sift/sift.h>

#include "vs.h"

typedef struct {
  gint32 H, G, d;
  gint64 n;
  float *q, *k, *v;   /* q [H][n][d], k/v [G][n][d] */
  SiftView qv, kv, vv;
} Qkv;

gboolean have_avx2 (void);
gboolean have_avx512 (void);
gboolean use_isa (SiftIsa isa);
float *random_buf (GRand *rng, gsize n, double amp);
void qkv_init (Qkv *t, guint32 seed, gint32 H, gint32 G, gint32 d, gint64 n, double amp);
void qkv_clear (Qkv *t);
double dot_d (const float *a, const float *b, gint32 d);
