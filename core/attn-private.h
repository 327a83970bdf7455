/* Attention kernels: the arguments every ISA's implementation receives,
 * already validated by core/attn.c. */
#pragma once

#include <sift/attn.h>

typedef struct {
  const SiftView *q;    /* f32 [q_heads][n_q][d] */
  const SiftView *k;    /* [kv_heads][n_kv][d] */
  const SiftView *v;
  SiftView *out;        /* f32 [q_heads][n_q][d] */
  float *lse;           /* [q_heads][n_q], never NULL here */
  float scale;          /* resolved */
  gboolean causal;
  gint64 q_offset;
  const gint64 *rows;   /* gather only */
  gsize n_rows;
} SiftAttnArgs;

typedef struct {
  void (*dense) (const SiftAttnArgs *a);
  void (*decode) (const SiftAttnArgs *a);
  void (*gather) (const SiftAttnArgs *a);
  void (*exp2v) (const float *x, float *y, gsize n); /* y = 2^x, the softmax's exponential */
} SiftAttnKernels;

/* The kernels of one ISA (NULL if not built or not supported by this CPU). */
const SiftAttnKernels *sift_attn_kernels_get (SiftIsa isa);

/* Per-thread scratch, 64-byte aligned, grown on demand and kept for the
 * thread's life, so calls on small blocks allocate nothing. One buffer per
 * slot; a slot's previous contents are lost when it grows. */
enum {
  SIFT_ATTN_SCRATCH_ITEM,    /* one work item's tiles (any thread) */
  SIFT_ATTN_SCRATCH_PARTIAL, /* split partials (the calling thread) */
  SIFT_ATTN_SCRATCH_N,
};
float *sift_attn_scratch (int slot, gsize n_floats);

/* 2^f - 1 = f P(f) on |f| <= 1/2, P(f) = ((((P0 f + P1) f + P2) f + P3) f + P4) f + P5
 * (minimax coefficients of Cephes' exp2f; relative error of 2^f < 2e-7). */
#define SIFT_EXP2_P0 1.535336188319500e-4f
#define SIFT_EXP2_P1 1.339887440266574e-3f
#define SIFT_EXP2_P2 9.618437357674640e-3f
#define SIFT_EXP2_P3 5.550332471162809e-2f
#define SIFT_EXP2_P4 2.402264791363012e-1f
#define SIFT_EXP2_P5 6.931472028550421e-1f

extern const SiftAttnKernels sift_attn_kernels_scalar;
#ifdef SIFT_HAVE_AVX2
extern const SiftAttnKernels sift_attn_kernels_avx2;
#endif
#ifdef SIFT_HAVE_AVX512
extern const SiftAttnKernels sift_attn_kernels_avx512;
#endif

/* Keys visible to query row i: [0, limit). */
static inline gint64
sift_attn_limit (const SiftAttnArgs *a, gint64 i)
{
  /* q_offset is caller input: compare before adding so no value overflows. */
  if (!a->causal || a->q_offset >= a->k->n_tokens)
    return a->k->n_tokens;
  return CLAMP (a->q_offset + i + 1, 0, a->k->n_tokens);
}
