/* The Q4_K x16 scale planes unpacked with AVX-512 (repack.h): included by
 * the AVX-512 and AMX kernels, which are built with those flags. */
#pragma once

#include <immintrin.h>

#include "repack.h"

/* The 6-bit scales (sc) and mins (m) of sub-blocks j of 16 rows as int32
 * lanes, from the 12 byte planes (llama_q4_k_scale_min, 16 rows at once). */
static inline __attribute__ ((always_inline)) void
x16_q4_k_scales_avx512 (const BlockQ4_Kx16 *b, __m512i sc[8], __m512i m[8])
{
  __m128i p[12];
  for (int k = 0; k < 12; k++)
    p[k] = _mm_loadu_si128 ((const __m128i *) b->scales[k]);
  const __m128i m63 = _mm_set1_epi8 (63), m15 = _mm_set1_epi8 (15), top = _mm_set1_epi8 ((char) 0xc0);
  for (int j = 0; j < 4; j++)
    {
      sc[j] = _mm512_cvtepu8_epi32 (_mm_and_si128 (p[j], m63));
      m[j] = _mm512_cvtepu8_epi32 (_mm_and_si128 (p[j + 4], m63));
      /* (byte >> 6) << 4 is (byte & 0xc0) >> 2: a 16-bit shift of masked bytes carries nothing across. */
      __m128i hi_sc = _mm_srli_epi16 (_mm_and_si128 (p[j], top), 2);
      __m128i hi_m = _mm_srli_epi16 (_mm_and_si128 (p[j + 4], top), 2);
      sc[j + 4] = _mm512_cvtepu8_epi32 (_mm_or_si128 (_mm_and_si128 (p[j + 8], m15), hi_sc));
      m[j + 4] = _mm512_cvtepu8_epi32 (_mm_or_si128 (_mm_and_si128 (_mm_srli_epi16 (p[j + 8], 4), m15), hi_m));
    }
}
