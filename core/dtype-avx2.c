/* AVX2 + F16C conversions: dtype-simd.h on 8 lanes (built with -mavx2
 * -mf16c, called only when the CPU has them). */
#include <glib.h>
#include <immintrin.h>

#define VL 8
#define KERNELS sift_dtype_kernels_avx2

typedef float vf __attribute__ ((vector_size (32)));

static inline vf
vcvt_ph_ps (const guint16 *p)
{
  return (vf) _mm256_cvtph_ps (_mm_loadu_si128 ((const __m128i *) p));
}

static inline void
vcvt_ps_ph (guint16 *p, vf x)
{
  _mm_storeu_si128 ((__m128i *) p, _mm256_cvtps_ph ((__m256) x, _MM_FROUND_TO_NEAREST_INT));
}

static inline gboolean
vany_nan (vf x)
{
  return _mm256_movemask_ps (_mm256_cmp_ps ((__m256) x, (__m256) x, _CMP_UNORD_Q)) != 0;
}

static inline vf
vcvt_i8_ps (const gint8 *p)
{
  return (vf) _mm256_cvtepi32_ps (_mm256_cvtepi8_epi32 (_mm_loadl_epi64 ((const __m128i *) p)));
}

#include "dtype-simd.h"
