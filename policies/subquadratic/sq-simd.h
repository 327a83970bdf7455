/* SIMD paths of sq_accumulate (AVX2 + FMA, AVX-512), chosen at run time
 * from sift_isa_active (), so SIFT_ISA=scalar forces the plain path. */
#pragma once

#include "sq-core.h"

typedef void (*SqAccumulateFunc) (SqState *st, const float *q, gint32 head_dim, float scale,
                                  const float *base_k, const float *base_v, gint64 stride,
                                  const gint32 *idx, gsize n);

/* The fastest path for head_dim on this CPU, or NULL for the scalar one. */
SqAccumulateFunc sq_simd_accumulate (gint32 head_dim);
