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
} SiftAttnKernels;

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
  if (!a->causal)
    return a->k->n_tokens;
  return CLAMP (a->q_offset + i + 1, 0, a->k->n_tokens);
}
