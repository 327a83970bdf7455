/* AVX-512 VNNI matmul dot products (built with the AVX-512 flags and
 * -mavx512vnni; chosen only when the CPU has VNNI): vpdpbusd on 256-bit
 * vectors, exact (no 16-bit intermediate). */
#include <immintrin.h>

static inline __attribute__ ((always_inline)) __m256i
dpbusd (__m256i acc, __m256i u, __m256i s)
{
  return _mm256_dpbusd_epi32 (acc, u, s);
}

#include "matmul-simd.h"

const LlamaMatmulKernels llama_matmul_avx512 = MATMUL_KERNELS ("avx512-vnni");
