/* The element-wise kernels of a model's forward pass on the GPU (blas.c
 * has the matrix products, through cuBLAS): RMSNorm and SwiGLU, each
 * writing the f16 activations the next product reads, and f32 -> f16.
 * f32 arithmetic throughout; only the stored result is rounded. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dense-kernels.h"

namespace {

constexpr int NORM_THREADS = 256;

/* One row per thread block: the sum of squares reduced over the block
 * (warp shuffles, then one value per warp in shared memory). */
__global__ void __launch_bounds__ (NORM_THREADS)
rmsnorm_kernel (const float *__restrict__ x, const float *__restrict__ w, float eps, int64_t d,
                __half *__restrict__ out)
{
  const float *xr = x + (int64_t) blockIdx.x * d;
  __half *orow = out + (int64_t) blockIdx.x * d;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < d; i += NORM_THREADS)
    ss += xr[i] * xr[i];
  for (int o = 16; o > 0; o >>= 1)
    ss += __shfl_xor_sync (0xffffffffu, ss, o);
  __shared__ float part[NORM_THREADS / 32];
  if (threadIdx.x % 32 == 0)
    part[threadIdx.x / 32] = ss;
  __syncthreads ();
  float total = 0;
  for (int i = 0; i < NORM_THREADS / 32; i++)
    total += part[i];
  const float inv = 1.0f / sqrtf (total / (float) d + eps);
  for (int64_t i = threadIdx.x; i < d; i += NORM_THREADS)
    orow[i] = __float2half_rn (xr[i] * inv * (w != nullptr ? w[i] : 1.0f));
}

__global__ void
to_f16_kernel (const float *__restrict__ x, int64_t n, __half *__restrict__ out)
{
  for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x)
    out[i] = __float2half_rn (x[i]);
}

/* gate_up [rows][2 n]: gate then up of each row. */
__global__ void
swiglu_kernel (const float *__restrict__ gate_up, int64_t rows, int64_t n, __half *__restrict__ out)
{
  const int64_t total = rows * n;
  for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t) gridDim.x * blockDim.x)
    {
      const int64_t r = i / n, c = i % n;
      const float g = gate_up[r * 2 * n + c], u = gate_up[r * 2 * n + n + c];
      out[i] = __float2half_rn (g / (1.0f + __expf (-g)) * u);
    }
}

unsigned
grid_for (int64_t n)
{
  const int64_t blocks = (n + 255) / 256;
  return (unsigned) (blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

} // namespace

extern "C" int
sift_cuda_rmsnorm_launch (const float *x, const float *w, float eps, int64_t rows, int64_t d, void *out)
{
  if (rows == 0)
    return cudaSuccess;
  rmsnorm_kernel<<<(unsigned) rows, NORM_THREADS>>> (x, w, eps, d, (__half *) out);
  return cudaGetLastError ();
}

extern "C" int
sift_cuda_to_f16_launch (const float *x, int64_t n, void *out)
{
  if (n == 0)
    return cudaSuccess;
  to_f16_kernel<<<grid_for (n), 256>>> (x, n, (__half *) out);
  return cudaGetLastError ();
}

extern "C" int
sift_cuda_swiglu_launch (const float *gate_up, int64_t rows, int64_t n, void *out)
{
  if (rows * n == 0)
    return cudaSuccess;
  swiglu_kernel<<<grid_for (rows * n), 256>>> (gate_up, rows, n, (__half *) out);
  return cudaGetLastError ();
}
