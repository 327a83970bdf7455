/* Bulk conversion kernels behind sift_convert: one table per ISA. The scalar
 * table (dtype.c) is the reference; SIMD tables must equal it bit for bit. */
#pragma once

#include <sift/attn.h>
#include <sift/dtype.h>

typedef struct {
  void (*f16_to_f32) (const guint16 *src, float *dst, gsize n);
  void (*f32_to_f16) (const float *src, guint16 *dst, gsize n);
  void (*bf16_to_f32) (const guint16 *src, float *dst, gsize n);
  void (*f32_to_bf16) (const float *src, guint16 *dst, gsize n);
  void (*q8_0_to_f32) (const SiftBlockQ8_0 *src, float *dst, gsize n_blocks);
} SiftDTypeKernels;

extern const SiftDTypeKernels sift_dtype_kernels_scalar;
#ifdef SIFT_HAVE_AVX2
extern const SiftDTypeKernels sift_dtype_kernels_avx2;
#endif
#ifdef SIFT_HAVE_AVX512
extern const SiftDTypeKernels sift_dtype_kernels_avx512;
#endif
