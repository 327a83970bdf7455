/* AVX2 matmul dot products (built with -mavx2 -mfma -mf16c): u8 x i8 by
 * vpmaddubsw (pairs to i16; no pair of these codes reaches 2^15) and
 * vpmaddwd (to i32). */
#include <immintrin.h>

static inline __attribute__ ((always_inline)) __m256i
dpbusd (__m256i acc, __m256i u, __m256i s)
{
  return _mm256_add_epi32 (acc, _mm256_madd_epi16 (_mm256_maddubs_epi16 (u, s), _mm256_set1_epi16 (1)));
}

#include "matmul-simd.h"

const LlamaMatmulKernels llama_matmul_avx2 = MATMUL_KERNELS ("avx2");
