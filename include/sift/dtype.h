/* sift — element types and exact conversions. */
#pragma once

#include <glib.h>
#include <sift/api.h>

G_BEGIN_DECLS

typedef enum {
  SIFT_DTYPE_F32 = 0,
  SIFT_DTYPE_F16 = 1,  /* IEEE 754 binary16 */
  SIFT_DTYPE_BF16 = 2, /* bfloat16: the top 16 bits of an f32 */
  SIFT_DTYPE_Q8_0 = 3, /* storage only: blocks of 32 int8 with one f16 scale */
} SiftDType;

#define SIFT_Q8_0_BLOCK 32
/* One q8_0 block: d = max|x| / 127, x ~= d * qs[i]. */
typedef struct {
  guint16 d; /* f16 scale */
  gint8 qs[SIFT_Q8_0_BLOCK];
} SiftBlockQ8_0;

SIFT_API const char *sift_dtype_name (SiftDType dtype);
/* Parses "f32", "f16", "bf16", "q8_0"; FALSE for anything else. */
SIFT_API gboolean sift_dtype_from_name (const char *name, SiftDType *out);
/* Bytes of one element; 0 for q8_0 (use sift_dtype_row_bytes). */
SIFT_API gsize sift_dtype_size (SiftDType dtype);
/* Bytes of n elements; for q8_0 n must be a multiple of 32. */
SIFT_API gsize sift_dtype_row_bytes (SiftDType dtype, gsize n);

/* Round-to-nearest-even conversions, exact for every input (NaN stays NaN,
 * overflow goes to infinity, subnormals are kept). */
SIFT_API guint16 sift_f32_to_f16 (float x);
SIFT_API float sift_f16_to_f32 (guint16 h);
SIFT_API guint16 sift_f32_to_bf16 (float x);
SIFT_API float sift_bf16_to_f32 (guint16 h);

/* Converts n elements from one dtype to another (any pair; q8_0 needs n % 32 == 0). */
SIFT_API void sift_convert (const void *src, SiftDType src_dtype, void *dst, SiftDType dst_dtype, gsize n);

G_END_DECLS
