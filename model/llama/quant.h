/* Tensor blocks of the GGUF types sift computes with (ggml's layouts), their
 * dequantisation, and the 8-bit activation blocks the integer dot products
 * read. Private to model/llama/. */
#pragma once

#include <glib.h>

#include "gguf.h"

G_BEGIN_DECLS

#define QK 32   /* elements of a Q8_0 / Q4_0 block */
#define QK_K 256 /* elements of a K-quant super-block */

/* x = d * qs[i] */
typedef struct {
  guint16 d; /* f16 */
  gint8 qs[QK];
} BlockQ8_0;

/* x[i] = d * ((qs[i] & 15) - 8), x[i + 16] = d * ((qs[i] >> 4) - 8) */
typedef struct {
  guint16 d; /* f16 */
  guint8 qs[QK / 2];
} BlockQ4_0;

/* 8 sub-blocks of 32: x = d * sc[j] * q - dmin * m[j], q in 0..15, sc and m
 * 6 bits each packed in scales[12]; each 64 elements: the first 32 in the
 * low nibbles of 32 bytes of qs, the next 32 in the high nibbles. */
typedef struct {
  guint16 d, dmin; /* f16 */
  guint8 scales[12];
  guint8 qs[QK_K / 2];
} BlockQ4_K;

/* 16 sub-blocks of 16: x = d * scales[j] * (q - 32), q in 0..63: low 4 bits
 * in ql, high 2 bits in qh (see dequantize_q6_k). */
typedef struct {
  guint8 ql[QK_K / 2];
  guint8 qh[QK_K / 4];
  gint8 scales[QK_K / 16];
  guint16 d; /* f16 */
} BlockQ6_K;

G_STATIC_ASSERT (sizeof (BlockQ8_0) == 34);
G_STATIC_ASSERT (sizeof (BlockQ4_0) == 18);
G_STATIC_ASSERT (sizeof (BlockQ4_K) == 144);
G_STATIC_ASSERT (sizeof (BlockQ6_K) == 210);

/* Activations quantised for Q8_0 and Q4_0 weights: x ~= d * qs[i]; sum = sum of qs. */
typedef struct {
  float d;
  gint32 sum;
  gint8 qs[QK];
} ActQ8;

/* Activations quantised for Q4_K and Q6_K weights: x ~= d * qs[i];
 * bsums[j] = sum of qs[16 j .. 16 j + 15]. */
typedef struct {
  float d;
  gint16 bsums[QK_K / 16];
  gint8 qs[QK_K];
} ActQ8K;

/* Whether sift computes with this tensor type. */
gboolean llama_type_supported (GgufTensorType type);
/* n elements (a multiple of the type's block) of a row of `type` to f32. */
void llama_dequantize_row (GgufTensorType type, const void *src, float *dst, gint64 n);
/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K block. */
void llama_q4_k_scale_min (const guint8 *scales, int j, guint8 *sc, guint8 *m);

/* n (multiple of 32 / 256) activations to 8 bits. */
void llama_quantize_act_q8 (const float *x, ActQ8 *dst, gint64 n);
void llama_quantize_act_q8k (const float *x, ActQ8K *dst, gint64 n);

G_END_DECLS
