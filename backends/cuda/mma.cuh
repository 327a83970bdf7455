/* Device primitives of the GPU attention kernels (attn.cu, prefill.cu):
 * mma.sync m16n8k16 on f16 or
 * bf16 operands with f32 accumulators, ldmatrix, cp.async, base-2
 * exponentials, quad reductions, the block-table cursor and one online
 * softmax step. docs/kernels.md ("GPU kernels") describes the layouts. */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "kernels.h"

/* Blocks of `kernel` that one SM holds at `threads` threads and `smem`
 * bytes of dynamic shared memory: at least 1, and 1 when the query fails. */
template <typename Kernel>
static inline int
blocks_per_sm (Kernel kernel, int threads, size_t smem)
{
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor (&n, kernel, threads, smem) != cudaSuccess)
    return 1;
  return n > 0 ? n : 1;
}

/* Allows kernel FN `smem` bytes of dynamic shared memory (over the
 * default 48 KB), asked of the runtime once per kernel. */
template <auto FN, size_t SMEM>
static inline cudaError_t
allow_smem ()
{
  static bool allowed = false; /* benign race: the attribute is idempotent */
  if (allowed)
    return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute (FN, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) SMEM);
  allowed = e == cudaSuccess;
  return e;
}

namespace sift_mma {

/* Two floats as one register of two 16-bit operands, the lower index in the low half. */
template <bool BF16> __device__ __forceinline__ uint32_t pack2 (float lo, float hi);
template <> __device__ __forceinline__ uint32_t
pack2<true> (float lo, float hi)
{
  __nv_bfloat162 h = __floats2bfloat162_rn (lo, hi);
  return *reinterpret_cast<uint32_t *> (&h);
}
template <> __device__ __forceinline__ uint32_t
pack2<false> (float lo, float hi)
{
  __half2 h = __floats2half2_rn (lo, hi);
  return *reinterpret_cast<uint32_t *> (&h);
}

/* c += a b: a 16x16 (rows x k, 4 registers), b 16x8 (k x cols, 2 registers),
 * c 16x8 f32. Thread (g = lane / 4, t = lane % 4) holds c rows g and g + 8,
 * columns 2t and 2t + 1. */
template <bool BF16> __device__ __forceinline__ void mma (float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void
mma<true> (float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
  asm volatile ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void
mma<false> (float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
  asm volatile ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 matrices of 16-bit values from shared memory; lanes 8i..8i+7
 * give the row addresses of matrix i. Plain: thread (g, t) gets row g,
 * columns 2t and 2t + 1 of each (Q's A and K's B operands). Transposed:
 * rows 2t and 2t + 1 of column g (V's B operands of P V). */
__device__ __forceinline__ uint32_t smem_addr (const void *p) { return (uint32_t) __cvta_generic_to_shared (p); }

/* a: a shared-memory address (smem_addr) */
__device__ __forceinline__ void
ldmatrix_x4 (uint32_t r[4], uint32_t a)
{
  asm volatile ("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void
ldmatrix_x4_trans (uint32_t r[4], uint32_t a)
{
  asm volatile ("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void
ldmatrix_x4 (uint32_t r[4], const uint16_t *p)
{
  ldmatrix_x4 (r, smem_addr (p));
}
__device__ __forceinline__ void
ldmatrix_x4_trans (uint32_t r[4], const uint16_t *p)
{
  ldmatrix_x4_trans (r, smem_addr (p));
}

/* 16 bytes global -> shared address a without registers; src_bytes 0
 * writes zeros (keys past the range: a zero V row keeps 0 * garbage from
 * making NaN). */
__device__ __forceinline__ void
cp_async16 (uint32_t a, const void *src, int src_bytes)
{
  asm volatile ("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void
cp_async16 (uint16_t *dst, const void *src, int src_bytes)
{
  cp_async16 (smem_addr (dst), src, src_bytes);
}
__device__ __forceinline__ void cp_async_commit () { asm volatile ("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait () { asm volatile ("cp.async.wait_group %0;" ::"n"(N)); }

/* 2^x by the special-function unit (relative error ~2^-22, 2^-inf = 0). */
__device__ __forceinline__ float
fast_exp2 (float x)
{
  float y;
  asm ("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float
quad_max (float x)
{
  x = fmaxf (x, __shfl_xor_sync (0xffffffffu, x, 1));
  return fmaxf (x, __shfl_xor_sync (0xffffffffu, x, 2));
}
__device__ __forceinline__ float
quad_sum (float x)
{
  x += __shfl_xor_sync (0xffffffffu, x, 1);
  return x + __shfl_xor_sync (0xffffffffu, x, 2);
}

/* Walks the key blocks in increasing key order: one compare per row, the
 * next block's descriptor read only when a key passes the current block. */
struct Cursor {
  SiftCudaKvBlock cur;
  int idx;

  /* seek by a whole warp (key warp-uniform): 32 probes a round, so a
   * table of 1024 blocks takes two dependent reads, not ten. */
  __device__ void
  seek_warp (const SiftCudaAttnCall &c, int key, int lane)
  {
    if (c.n_blocks == 1)
      {
        cur = c.one;
        idx = 0;
        return;
      }
    int lo = 0, hi = c.n_blocks - 1; /* the answer lies in [lo, hi] */
    while (lo < hi)
      {
        const int stride = (hi - lo + 31) / 32;
        const int p = lo + (lane + 1) * stride;
        const bool below = p <= hi && c.blocks[p].start <= key; /* true on a prefix of the lanes */
        const int nlo = lo + __popc (__ballot_sync (0xffffffffu, below)) * stride;
        hi = min (hi, nlo + stride - 1);
        lo = nlo;
      }
    idx = lo;
    cur = c.blocks[idx];
  }

  __device__ void
  advance (const SiftCudaAttnCall &c, int key)
  {
    while (key >= cur.start + cur.n && idx + 1 < c.n_blocks)
      cur = c.blocks[++idx];
  }
};

/* Online softmax over one set of scores (two rows a thread: g and g + 8):
 * raise the max, rescale what was summed under the old one, so every
 * exponent is <= 0; s becomes the probabilities. A row with no key yet
 * keeps m = -inf and subtracts 0 instead, so its terms are 2^-inf = 0
 * rather than NaN. */
template <int NT, int DT>
__device__ __forceinline__ void
softmax_step (float s[NT][4], float m[2], float l[2], float o[DT][4])
{
#pragma unroll
  for (int x = 0; x < 2; x++)
    {
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int n = 0; n < NT; n++)
        mx = fmaxf (mx, fmaxf (s[n][2 * x], s[n][2 * x + 1]));
      const float m_new = fmaxf (m[x], quad_max (mx));
      const float base = m_new == -CUDART_INF_F ? 0.0f : m_new;
      const float alpha = fast_exp2 (m[x] - base);
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < NT; n++)
        {
          s[n][2 * x] = fast_exp2 (s[n][2 * x] - base);
          s[n][2 * x + 1] = fast_exp2 (s[n][2 * x + 1] - base);
          sum += s[n][2 * x] + s[n][2 * x + 1];
        }
      l[x] = l[x] * alpha + sum;
      m[x] = m_new;
#pragma unroll
      for (int j = 0; j < DT; j++)
        {
          o[j][2 * x] *= alpha;
          o[j][2 * x + 1] *= alpha;
        }
    }
}

} // namespace sift_mma
