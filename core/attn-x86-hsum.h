/* Transposed reductions of 8-lane vectors, shared by attn-avx2.c and
 * attn-avx512.c (built with AVX2 in both): the sums of the lanes of several
 * vectors at once, by pairwise horizontal adds, then the two 128-bit halves.
 * Summing n vectors costs about n + 1 instructions instead of ~5 n for a
 * horizontal sum each. */
#pragma once

#include <immintrin.h>

/* dst[n] = sum of the lanes of a[n], n < 4. */
static inline __attribute__ ((always_inline)) void
vhsum4_256 (const __m256 *a, float *dst)
{
  __m256 h = _mm256_hadd_ps (_mm256_hadd_ps (a[0], a[1]), _mm256_hadd_ps (a[2], a[3]));
  _mm_storeu_ps (dst, _mm_add_ps (_mm256_castps256_ps128 (h), _mm256_extractf128_ps (h, 1)));
}

/* dst[n] = sum of the lanes of a[n], n < 8. */
static inline __attribute__ ((always_inline)) void
vhsum8_256 (const __m256 *a, float *dst)
{
  __m256 h01 = _mm256_hadd_ps (a[0], a[1]), h23 = _mm256_hadd_ps (a[2], a[3]);
  __m256 h45 = _mm256_hadd_ps (a[4], a[5]), h67 = _mm256_hadd_ps (a[6], a[7]);
  __m256 h0123 = _mm256_hadd_ps (h01, h23), h4567 = _mm256_hadd_ps (h45, h67);
  _mm256_storeu_ps (dst, _mm256_add_ps (_mm256_permute2f128_ps (h0123, h4567, 0x20),
                                        _mm256_permute2f128_ps (h0123, h4567, 0x31)));
}

/* dst[i] = sum of the lanes of a[i] for i < n (n a constant); a[n..] are
 * read as zeros up to a multiple of 4. */
static inline __attribute__ ((always_inline)) void
vhsum_n_256 (const __m256 *a, const int n, float *dst)
{
  for (int b = 0; b < n; b += 8)
    {
      __m256 x[8];
      const int m = n - b < 8 ? n - b : 8;
      for (int i = 0; i < 8; i++)
        x[i] = i < m ? a[b + i] : _mm256_setzero_ps ();
      if (m > 4)
        vhsum8_256 (x, dst + b);
      else
        vhsum4_256 (x, dst + b);
    }
}
