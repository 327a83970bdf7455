/* Hopper (sm_90a) primitives of the prefill kernel (prefill.cu):
 * wgmma.mma_async m64n128k16 with f32 accumulators, its operands read by
 * the tensor cores from shared memory through matrix descriptors, in the
 * 128-byte swizzled layout. Only code compiled for sm_90a may call the
 * wgmma and setmaxnreg ones (guard: __CUDA_ARCH_FEAT_SM90_ALL); the
 * mbarrier and TMA ones need sm_90 (the TMA decode kernel in attn.cu
 * uses them too; guard: __CUDA_ARCH__ >= 900). docs/kernels.md ("GPU
 * kernels") describes the layouts. */
#pragma once

#include <stdint.h>

namespace sift_wg {

/* A panel is 64 columns of 16-bit values, one 128-byte row per matrix
 * row, 1024-byte aligned. The byte offset of 16-byte chunk `chunk` (0-7)
 * of row `row`: 128-byte swizzling stores it at chunk `chunk ^ (row % 8)`,
 * which the tensor cores undo from the address bits (so shared-memory
 * rows 8 apart never share a bank for the same chunk). */
__device__ __forceinline__ uint32_t
swz (int row, int chunk)
{
  return (uint32_t) (row * 128 + ((chunk ^ (row & 7)) << 4));
}

/* The matrix descriptor of an operand starting at shared address `addr`
 * in 128-byte swizzled panels: `sbo` bytes between groups of 8 rows
 * (1024 for packed panels), `lbo` bytes between panels along a
 * row-contiguous (MN-major) operand's N (unused for K-major ones). */
__device__ __forceinline__ uint64_t
desc (uint32_t addr, uint32_t lbo, uint32_t sbo)
{
  return (uint64_t) ((addr & 0x3ffffu) >> 4) | (uint64_t) (lbo >> 4) << 16 | (uint64_t) (sbo >> 4) << 32
         | (uint64_t) 1 << 62; /* layout type 1: 128-byte swizzle */
}

/* The accumulator registers d (float d[16][4]): warp w of the warpgroup,
 * lane (g = lane / 4, t = lane % 4), d[i][2x + e] = row 16w + 8x + g,
 * column 8i + 2t + e, as in mma.sync's m16n8 tiles. */
#define SIFT_WG_D \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define SIFT_WG_OUT(d) \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
  "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
  "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
  "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
  "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
  "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
  "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
  "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
  "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
  "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
  "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), \
  "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
  "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), \
  "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
  "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
  "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])

/* Orders the warpgroup's register accesses before the wgmma that follow. */
__device__ __forceinline__ void fence () { asm volatile ("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit () { asm volatile ("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait () { asm volatile ("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

/* Keeps the compiler from moving reads or writes of d across this point
 * (the wgmma that writes d runs asynchronously until a wait). */
__device__ __forceinline__ void
hold (float d[16][4])
{
#pragma unroll
  for (int i = 0; i < 16; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
      asm volatile ("" : "+f"(d[i][j])::"memory");
}

/* The same for the A operand's registers. */
__device__ __forceinline__ void
hold (uint32_t a[4])
{
#pragma unroll
  for (int j = 0; j < 4; j++)
    asm volatile ("" : "+r"(a[j])::"memory");
}

/* The same for a descriptor or a flag: computed before the wgmma.fence,
 * not between two wgmma (which would make ptxas serialise them). */
__device__ __forceinline__ void
hold (uint64_t &x)
{
  asm volatile ("" : "+l"(x)::"memory");
}
__device__ __forceinline__ void
hold (int &x)
{
  asm volatile ("" : "+r"(x)::"memory");
}

/* d (+)= A B for a 64x16 A and a 16x128 B, both K-major in shared memory
 * (A's rows and B's columns contiguous along k); accumulate 0 overwrites d. */
template <bool BF16> __device__ __forceinline__ void mma_ss (float d[16][4], uint64_t a, uint64_t b, int accumulate);
/* d += A B with A in registers (a[4]: rows g and g + 8, columns 2t, 2t + 1
 * and 2t + 8, 2t + 9, as mma.sync's A operand) and B MN-major in shared
 * memory (its rows, along N, contiguous). */
template <bool BF16> __device__ __forceinline__ void mma_rs (float d[16][4], const uint32_t a[4], uint64_t b, int accumulate);

#define SIFT_WG_SS(TYPE) \
  asm volatile ("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
                "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " SIFT_WG_D ", %64, %65, p, 1, 1, 0, 0;\n}\n" \
                : SIFT_WG_OUT (d) : "l"(a), "l"(b), "r"(accumulate))
#define SIFT_WG_RS(TYPE) \
  asm volatile ("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
                "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " SIFT_WG_D ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n" \
                : SIFT_WG_OUT (d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))

template <> __device__ __forceinline__ void
mma_ss<true> (float d[16][4], uint64_t a, uint64_t b, int accumulate)
{
  SIFT_WG_SS ("bf16");
}
template <> __device__ __forceinline__ void
mma_ss<false> (float d[16][4], uint64_t a, uint64_t b, int accumulate)
{
  SIFT_WG_SS ("f16");
}
template <> __device__ __forceinline__ void
mma_rs<true> (float d[16][4], const uint32_t a[4], uint64_t b, int accumulate)
{
  SIFT_WG_RS ("bf16");
}
template <> __device__ __forceinline__ void
mma_rs<false> (float d[16][4], const uint32_t a[4], uint64_t b, int accumulate)
{
  SIFT_WG_RS ("f16");
}

#undef SIFT_WG_SS
#undef SIFT_WG_RS
#undef SIFT_WG_OUT
#undef SIFT_WG_D

/* Makes this thread's earlier shared-memory writes (stores, cp.async)
 * visible to the tensor cores' reads (the async proxy); a barrier after
 * it extends that to the block. */
__device__ __forceinline__ void fence_async_smem () { asm volatile ("fence.proxy.async.shared::cta;" ::: "memory"); }

/* mbarriers (shared addresses) and the TMA unit's tensor copies: a
 * phase completes when its arrivals are in and, after an arrival that
 * expects bytes, the copies have written them. */
__device__ __forceinline__ void
mbar_init (uint32_t bar, unsigned count)
{
  asm volatile ("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/* Makes the initialised mbarriers visible to the async proxy; a barrier after it to the block. */
__device__ __forceinline__ void mbar_init_fence () { asm volatile ("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void
mbar_expect (uint32_t bar, uint32_t bytes)
{
  asm volatile ("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void
mbar_arrive (uint32_t bar)
{
  asm volatile ("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* Waits for the completion of the phase of parity `parity`. */
__device__ __forceinline__ void
mbar_wait (uint32_t bar, uint32_t parity)
{
  uint32_t done;
  do
    asm volatile ("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                  : "=r"(done)
                  : "r"(bar), "r"(parity)
                  : "memory");
  while (!done);
}

/* The box of a 3D tensor map (a CUtensorMap kernel parameter) at
 * coordinates (x, y, z) to shared address dst, counted on mbarrier bar;
 * elements outside the tensor read as zeros. */
__device__ __forceinline__ void
tma_load (uint32_t dst, const void *map, int x, int y, int z, uint32_t bar)
{
  asm volatile ("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                ::"r"(dst), "l"(map), "r"(x), "r"(y), "r"(z), "r"(bar)
                : "memory");
}

/* The warpgroup's register budget a thread, lowered or raised (the
 * registers one warpgroup gives up go to the others of the block). */
template <int N> __device__ __forceinline__ void regs_down () { asm volatile ("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N> __device__ __forceinline__ void regs_up () { asm volatile ("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }

/* Named barrier `id` of n threads (id 0 is __syncthreads'). */
__device__ __forceinline__ void bar_sync (int id, int n) { asm volatile ("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }

} // namespace sift_wg
