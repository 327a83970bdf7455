/* AVX-512 conversions: dtype-simd.h on 16 lanes (built with -mavx512f/bw/vl/dq,
 * called only when the CPU has them). */
#include <glib.h>
#include <immintrin.h>

#define VL 16
#define KERNELS sift_dtype_kernels_avx512

typedef float vf __attribute__ ((vector_size (64)));

static inline vf
vcvt_ph_ps (const guint16 *p)
{
  return (vf) _mm512_cvtph_ps (_mm256_loadu_si256 ((const __m256i *) p));
}

static inline void
vcvt_ps_ph (guint16 *p, vf x)
{
  _mm256_storeu_si256 ((__m256i *) p, _mm512_cvtps_ph ((__m512) x, _MM_FROUND_TO_NEAREST_INT));
}

static inline gboolean
vany_nan (vf x)
{
  return _mm512_cmp_ps_mask ((__m512) x, (__m512) x, _CMP_UNORD_Q) != 0;
}

static inline vf
vcvt_i8_ps (const gint8 *p)
{
  return (vf) _mm512_cvtepi32_ps (_mm512_cvtepi8_epi32 (_mm_loadu_si128 ((const __m128i *) p)));
}

#include "dtype-simd.h"
