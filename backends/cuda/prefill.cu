/* GPU prefill attention (more than 16 query rows per kv head): on a
 * Hopper GPU (compute capability 9.0) with head_dim 128, the wgmma kernels
 * of namespace hopper (sm_90a machine code; TMA loads for contiguous
 * calls); elsewhere, and for head_dim
 * 64, a FlashAttention-2-style kernel on mma.sync m16n8k16. A thread block takes
 * BM query rows of one kv head (row r is token r / group of query head
 * kv_head * group + r % group: the GQA group shares every K/V tile); each
 * warp owns 16 MT rows. Q goes to shared memory once, scaled by
 * scale * log2(e) and rounded to K's type; K/V tiles of BN keys stream
 * through a ring of STAGES shared-memory stages by cp.async; per tile a
 * warp computes S = Q K^T, masks only where a row's limit falls inside
 * the tile, runs the online softmax in base 2 and adds P V with P's score
 * fragments as the A operand straight from registers. Causal blocks stop
 * at the last key their last row sees; the blocks with the most keys are
 * scheduled first. docs/kernels.md ("GPU kernels") has the reasoning. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>

#include "mma.cuh"
#include "tma.h"
#include "wgmma.cuh"

using namespace sift_mma;

namespace sift_tma {

/* cuTensorMapEncodeTiled, from the driver the runtime has loaded (no
 * link against libcuda), looked up once; NULL where it is missing, and
 * with SIFT_CUDA_NO_TMA=1 in the environment (a test hook: contiguous
 * calls then take the cp.async kernel, as where the driver lacks it). */
static PFN_cuTensorMapEncodeTiled_v12000
encode_fn ()
{
  static void *fn = nullptr;
  static bool looked = false; /* set after fn (two first callers find the same) */
  if (!__atomic_load_n (&looked, __ATOMIC_ACQUIRE))
    {
      void *p = nullptr;
      const char *off = getenv ("SIFT_CUDA_NO_TMA");
      if (off == nullptr || strcmp (off, "1") != 0)
        {
          cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
          const bool ok = cudaGetDriverEntryPointByVersion ("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess;
          if (!ok)
            cudaGetLastError (); /* else the fallback launch's cudaGetLastError () reports it */
          if (!ok || q != cudaDriverEntryPointSuccess)
            p = nullptr;
        }
      __atomic_store_n (&fn, p, __ATOMIC_RELAXED);
      __atomic_store_n (&looked, true, __ATOMIC_RELEASE);
    }
  return (PFN_cuTensorMapEncodeTiled_v12000) __atomic_load_n (&fn, __ATOMIC_RELAXED);
}

bool
kv_map (CUtensorMap *map, const void *base, int64_t hs, int64_t ts, int32_t n, int32_t kv_heads, bool bf16,
        uint32_t box_keys, bool l2_promote)
{
  PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn ();
  if (fn == nullptr || n <= 0 || hs <= 0 || ts <= 0)
    return false;
  const cuuint64_t dims[3] = { 128, (cuuint64_t) n, (cuuint64_t) kv_heads };
  const cuuint64_t strides[2] = { (cuuint64_t) ts * 2, (cuuint64_t) hs * 2 };
  const cuuint32_t box[3] = { 64, box_keys, 1 }, unit[3] = { 1, 1, 1 };
  return fn (map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, const_cast<void *> (base), dims,
             strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             l2_promote ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_NONE,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
         == CUDA_SUCCESS;
}

bool
machine_code_runs (const void *kernel)
{
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice (&dev) != cudaSuccess || cudaDeviceGetAttribute (&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess
      || cudaDeviceGetAttribute (&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess || major != 9 || minor != 0)
    return false;
  cudaFuncAttributes a;
  return cudaFuncGetAttributes (&a, kernel) == cudaSuccess && a.ptxVersion >= 90;
}

} // namespace sift_tma

namespace {

/* The kernel's shape: rows per warp (16 MT), warps, keys per tile,
 * pipeline stages. MT = 2 halves the shared-memory reads per mma (each K/V
 * fragment feeds two row tiles), which bounds mma.sync on Hopper; MT = 1
 * keeps Q's fragments in registers instead. */
template <int D, int MT, int WARPS, int BN, int STAGES> struct Shape {
  static constexpr int THREADS = WARPS * 32;
  static constexpr int BM = 16 * MT * WARPS;
  static constexpr int LD = D + 8; /* halves a shared row: 16 bytes of padding, ldmatrix without bank conflicts */
  static constexpr int Q_HALVES = BM * LD;
  static constexpr int KV_HALVES = BN * LD; /* K or V of one stage */
  static constexpr size_t SMEM = (size_t) (Q_HALVES + STAGES * 2 * KV_HALVES) * sizeof (uint16_t);
  static constexpr int MIN_BLOCKS = THREADS * 2 <= 256 ? 2 : 1; /* register budget: up to 255 a thread */
};

/* Where key `key`'s 16-byte column `col` of kv head kvh lies in block b. */
__device__ __forceinline__ void
row_addr (const SiftCudaKvBlock &b, int kvh, int key, int col, const char *&kp, const char *&vp)
{
  const int64_t t = key - b.start;
  kp = (const char *) b.k + ((kvh * b.k_hs + t * b.k_ts) * 2 + col * 16);
  vp = (const char *) b.v + ((kvh * b.v_hs + t * b.v_ts) * 2 + col * 16);
}

/* The copies of keys [k0, k0 + BN) into one stage (K rows at shared
 * address ks, V rows at vs, 16-byte column col of row row at byte
 * at (row, col) of each); keys at or past hi become zeros. A thread's
 * 16-byte column is the same for all its rows (THREADS is a multiple of
 * the chunks per row). A contiguous call reads its one block from the
 * kernel's parameters (no registers held across tiles); a paged one walks
 * the block table with the cursor. */
template <int D, int BN, int THREADS, bool PAGED, typename At>
__device__ __forceinline__ void
load_kv (const SiftCudaAttnCall &c, Cursor &cur, int kvh, int k0, int hi, uint32_t ks, uint32_t vs, At at_)
{
  constexpr int CPR = D / 8;
  static_assert (THREADS % CPR == 0 && BN * CPR % THREADS == 0, "tile and threads");
  const int col = threadIdx.x % CPR;
#pragma unroll
  for (int u = 0; u < BN * CPR / THREADS; u++)
    {
      const int row = threadIdx.x / CPR + u * (THREADS / CPR);
      const int key = k0 + row;
      const char *kp = (const char *) c.one.k, *vp = (const char *) c.one.v; /* read 0 bytes */
      int n = 0;
      if (key < hi)
        {
          if constexpr (PAGED)
            {
              cur.advance (c, key);
              row_addr (cur.cur, kvh, key, col, kp, vp);
            }
          else
            row_addr (c.one, kvh, key, col, kp, vp);
          n = 16;
        }
      const uint32_t at = at_ (row, col);
      cp_async16 (ks + at, kp, n);
      cp_async16 (vs + at, vp, n);
    }
}

/* Byte offsets in the mma.sync kernel's stages: rows of D halves padded by 8. */
template <int D> struct Padded {
  __device__ uint32_t operator() (int row, int col) const { return (uint32_t) ((row * (D + 8) + col * 8) * 2); }
};

/* A thread block's place in the launch and its key range. Block index:
 * kv head fastest, row blocks from the last (causal: the most keys) to
 * the first, so the heavy blocks start first. */
struct Block {
  int group, rows, kvh, r_blk, split;
  int lo, hi; /* keys [lo, hi): the split, cut at the last key the block's last row sees */

  __device__ __forceinline__
  Block (const SiftCudaAttnCall &c, int bm)
  {
    group = c.q_heads / c.kv_heads;
    rows = group * c.n_q;
    const int n_rb = (rows + bm - 1) / bm;
    kvh = (int) (blockIdx.x % (unsigned) c.kv_heads);
    r_blk = (n_rb - 1 - (int) (blockIdx.x / (unsigned) c.kv_heads)) * bm;
    split = blockIdx.y;
    lo = split * c.split_len;
    hi = min (c.n_kv, lo + c.split_len);
    if (c.causal)
      {
        const int r_last = min (rows, r_blk + bm) - 1;
        const int64_t lim = c.q_offset + r_last / group + 1;
        hi = (int) max ((int64_t) lo, min ((int64_t) hi, lim));
      }
  }

  /* The end of row r's keys (padding rows see none). */
  __device__ __forceinline__ int
  limit (const SiftCudaAttnCall &c, int r) const
  {
    if (r >= rows)
      return lo;
    if (c.causal)
      return (int) max ((int64_t) lo, min ((int64_t) hi, c.q_offset + r / group + 1));
    return hi;
  }
};

/* Q of the block's BM rows, times scale * log2(e), rounded to K's type,
 * four columns at a time to at (row, col) (a generic pointer to shared
 * memory); padding rows are zeros. */
template <int D, int BM, int THREADS, bool BF16, typename At>
__device__ __forceinline__ void
stage_q (const SiftCudaAttnCall &c, const Block &b, At at)
{
  for (int e = threadIdx.x; e < BM * (D / 4); e += THREADS)
    {
      const int row = e / (D / 4), col = e % (D / 4) * 4;
      const int r = b.r_blk + row;
      float x0 = 0.0f, x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;
      if (r < b.rows)
        {
          const float *p = c.q + (int64_t) (b.kvh * b.group + r % b.group) * c.q_hs + (int64_t) (r / b.group) * c.q_ts + col;
          x0 = p[0] * c.qscale, x1 = p[1] * c.qscale, x2 = p[2] * c.qscale, x3 = p[3] * c.qscale;
        }
      uint2 v = { pack2<BF16> (x0, x1), pack2<BF16> (x2, x3) };
      *reinterpret_cast<uint2 *> (at (row, col)) = v;
    }
}

/* Row r's result from a thread's part of it (every lane of the quad
 * calls this): output fragments o[j][2x], o[j][2x + 1] at columns
 * 8j + 2t, 8j + 2t + 1, divided by the quad's sum of l; the natural-log
 * LSE from the base-2 max m. The output, or this split's partial. */
template <int D>
__device__ __forceinline__ void
store_row (const SiftCudaAttnCall &c, const Block &b, int r, int x, int t, const float (*o)[4], float l, float m)
{
  const float sum = quad_sum (l);
  if (r >= b.rows)
    return;
  float *out = c.out, *lse = c.lse;
  int64_t out_hs = c.out_hs, out_ts = c.out_ts, lse_hs = c.n_q;
  if (c.n_splits > 1)
    {
      out = c.part_o + (int64_t) b.split * c.q_heads * c.n_q * D;
      lse = c.part_l + (int64_t) b.split * c.q_heads * c.n_q;
      out_hs = (int64_t) c.n_q * D;
      out_ts = D;
    }
  const int h = b.kvh * b.group + r % b.group, i = r / b.group;
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  float *orow = out + h * out_hs + i * out_ts;
#pragma unroll
  for (int j = 0; j < D / 8; j++)
    {
      orow[j * 8 + 2 * t] = o[j][2 * x] * inv;
      orow[j * 8 + 2 * t + 1] = o[j][2 * x + 1] * inv;
    }
  if (t == 0)
    lse[h * lse_hs + i] = sum > 0.0f ? (m + log2f (sum)) * CUDART_LN2_F : -CUDART_INF_F;
}

template <int D, bool BF16, int MT, int WARPS, int BN, int STAGES, bool PAGED>
__global__ void __launch_bounds__ (WARPS * 32, (Shape<D, MT, WARPS, BN, STAGES>::MIN_BLOCKS))
prefill_kernel (const __grid_constant__ SiftCudaAttnCall c)
{
  using S = Shape<D, MT, WARPS, BN, STAGES>;
  constexpr int THREADS = S::THREADS, BM = S::BM, LD = S::LD;
  constexpr int NT = BN / 8;  /* score fragments per row tile */
  constexpr int DT = D / 8;   /* output fragments per row tile */
  constexpr int KS = D / 16;  /* k-steps of Q K^T */
  constexpr bool QREG = MT == 1;
  static_assert (BN % 16 == 0 && STAGES >= 2, "tile");

  extern __shared__ __align__ (16) uint16_t smem[];
  uint16_t *qs = smem; /* [BM][LD] */
  const uint32_t ring = smem_addr (smem + S::Q_HALVES); /* [STAGES][K, V][BN][LD] */
  constexpr uint32_t KV_BYTES = S::KV_HALVES * 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const Block b (c, BM);
  const int kvh = b.kvh, lo = b.lo, hi = b.hi;
  const int r_warp = b.r_blk + warp * 16 * MT;

  /* Each thread's rows r_warp + 16 mt + g + 8 x: the end of their keys
   * (padding rows see none), and the warp's least and greatest end. */
  int rlim[MT][2];
  int lim_min = hi, lim_max = lo;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int x = 0; x < 2; x++)
      {
        rlim[mt][x] = b.limit (c, r_warp + 16 * mt + 8 * x + g);
        lim_min = min (lim_min, rlim[mt][x]);
        lim_max = max (lim_max, rlim[mt][x]);
      }
  lim_min = __reduce_min_sync (0xffffffffu, lim_min); /* warp-uniform from here */
  lim_max = __reduce_max_sync (0xffffffffu, lim_max);

  /* The first stages' copies go out before Q is staged. */
  Cursor cur;
  if constexpr (PAGED)
    cur.seek_warp (c, lo, lane);
  const int n_tiles = (hi - lo + BN - 1) / BN;
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++)
    {
      if (s < n_tiles)
        load_kv<D, BN, THREADS, PAGED> (c, cur, kvh, lo + s * BN, hi, ring + s * 2 * KV_BYTES,
                                        ring + (s * 2 + 1) * KV_BYTES, Padded<D> ());
      cp_async_commit ();
    }

  stage_q<D, BM, THREADS, BF16> (c, b, [&] (int row, int col) { return qs + row * LD + col; });
  __syncthreads ();

  /* Q's A fragments: lanes 0-15 address rows 0-15 at column 0 of a
   * 16x16 block, lanes 16-31 the same rows at column 8. */
  const uint32_t qrow = smem_addr (qs + (warp * 16 * MT + (lane & 15)) * LD + (lane >> 4) * 8); /* row tile mt: + 16 mt LD halves */
  uint32_t qf[QREG ? KS : 1][4];
  if constexpr (QREG)
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
      ldmatrix_x4 (qf[ks], qrow + ks * 32);

  /* Online softmax state of each thread's rows: running max m (base 2),
   * this thread's part of the sum l (the quad's parts add up at the end),
   * the unnormalised output o. */
  float m[MT][2], l[MT][2], o[MT][DT][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
    {
      m[mt][0] = m[mt][1] = -CUDART_INF_F;
      l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
      for (int j = 0; j < DT; j++)
        o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;
    }

  for (int it = 0; it < n_tiles; it++)
    {
      /* Tile `it` landed (STAGES - 2 later ones may still be in flight)
       * and every warp is done with the stage the next copies refill. */
      cp_async_wait<STAGES - 2> ();
      __syncthreads ();
      {
        const int nx = it + STAGES - 1;
        if (nx < n_tiles)
          load_kv<D, BN, THREADS, PAGED> (c, cur, kvh, lo + nx * BN, hi, ring + (nx % STAGES) * 2 * KV_BYTES,
                                          ring + ((nx % STAGES) * 2 + 1) * KV_BYTES, Padded<D> ());
        cp_async_commit ();
      }
      const int k0 = lo + it * BN;
      if (k0 >= lim_max) /* warp-uniform: no row of the warp sees these keys (mma.sync needs every lane) */
        continue;
      const uint32_t kst = ring + (it % STAGES) * 2 * KV_BYTES, vst = kst + KV_BYTES;

      /* S = Q K^T: K's B operands of two k-steps per ldmatrix (matrix i
       * is keys 8n..8n+7 at columns 16 ks + 8 i), each used by every row
       * tile of the warp. */
      float s[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NT; n++)
          s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
      const uint32_t krow = kst + ((lane & 7) * LD + (lane >> 3) * 8) * 2;
#pragma unroll
      for (int ks = 0; ks < KS; ks += 2)
        {
          uint32_t qa[MT][2][4];
#pragma unroll
          for (int mt = 0; mt < MT; mt++)
            if constexpr (QREG)
              for (int x = 0; x < 4; x++)
                qa[mt][0][x] = qf[ks][x], qa[mt][1][x] = qf[ks + 1][x];
            else
              {
                ldmatrix_x4 (qa[mt][0], qrow + (16 * mt * LD + ks * 16) * 2);
                ldmatrix_x4 (qa[mt][1], qrow + (16 * mt * LD + ks * 16 + 16) * 2);
              }
#pragma unroll
          for (int n = 0; n < NT; n++)
            {
              uint32_t b[4];
              ldmatrix_x4 (b, krow + (n * 8 * LD + ks * 16) * 2);
#pragma unroll
              for (int mt = 0; mt < MT; mt++)
                {
                  mma<BF16> (s[mt][n], qa[mt][0], b[0], b[1]);
                  mma<BF16> (s[mt][n], qa[mt][1], b[2], b[3]);
                }
            }
        }

      /* Keys past a row's limit (causal, split end, tail) score -inf:
       * only in tiles that hold some row's limit. */
      if (k0 + BN > lim_min)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
          for (int n = 0; n < NT; n++)
#pragma unroll
            for (int x = 0; x < 4; x++)
              if (k0 + n * 8 + 2 * t + (x & 1) >= rlim[mt][x >> 1])
                s[mt][n][x] = -CUDART_INF_F;

#pragma unroll
      for (int mt = 0; mt < MT; mt++)
        softmax_step<NT, DT> (s[mt], m[mt], l[mt], o[mt]);

      /* O += P V: P's fragments of 16 keys are the A operand as they lie
       * in registers; V's B operands come transposed (matrices: keys
       * 0-7 and 8-15 of columns 8j, then of 8j + 8). */
      const uint32_t vrow = vst + ((lane & 15) * LD + (lane >> 4) * 8) * 2;
#pragma unroll
      for (int kk = 0; kk < NT / 2; kk++)
        {
          uint32_t pa[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; mt++)
            {
              pa[mt][0] = pack2<BF16> (s[mt][2 * kk][0], s[mt][2 * kk][1]);
              pa[mt][1] = pack2<BF16> (s[mt][2 * kk][2], s[mt][2 * kk][3]);
              pa[mt][2] = pack2<BF16> (s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
              pa[mt][3] = pack2<BF16> (s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
          for (int j = 0; j < DT; j += 2)
            {
              uint32_t b[4];
              ldmatrix_x4_trans (b, vrow + (kk * 16 * LD + j * 8) * 2);
#pragma unroll
              for (int mt = 0; mt < MT; mt++)
                {
                  mma<BF16> (o[mt][j], pa[mt], b[0], b[1]);
                  mma<BF16> (o[mt][j + 1], pa[mt], b[2], b[3]);
                }
            }
        }
    }
  cp_async_wait<0> ();

#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int x = 0; x < 2; x++)
      store_row<D> (c, b, r_warp + 16 * mt + 8 * x + g, x, t, o[mt], l[mt][x], m[mt][x]);
}

/* The launch's blocks of BM rows: row blocks x kv heads, by the splits;
 * false past the grid's limit. */
static bool
grid (const SiftCudaAttnCall &c, int bm, dim3 &blocks)
{
  const int64_t rows = (int64_t) c.q_heads / c.kv_heads * c.n_q;
  const int64_t n = (rows + bm - 1) / bm * c.kv_heads;
  blocks = dim3 ((unsigned) n, c.n_splits);
  return n <= 0x7fffffff;
}

/* A kernel's launches: its shared-memory limit set once, blocks per SM,
 * the launch (BM rows a block: row blocks x kv heads, by the splits). */
template <auto FN, int THREADS, size_t SMEM, int BM> struct Launch {
  static_assert (BM == SIFT_CUDA_PREFILL_ROWS, "cuda.c sizes the splits by SIFT_CUDA_PREFILL_ROWS");

  static cudaError_t configure () { return allow_smem<FN, SMEM> (); }

  static int
  resident ()
  {
    return configure () == cudaSuccess ? blocks_per_sm (FN, THREADS, SMEM) : 1;
  }

  static cudaError_t
  launch (const SiftCudaAttnCall &c, cudaStream_t stream)
  {
    cudaError_t e = configure ();
    if (e != cudaSuccess)
      return e;
    dim3 blocks;
    if (!grid (c, BM, blocks))
      return cudaErrorInvalidConfiguration;
    FN<<<blocks, THREADS, SMEM, stream>>> (c);
    return cudaGetLastError ();
  }
};

/* One shape of the mma.sync kernel. */
template <int D, bool BF16, int MT, int WARPS, int BN, int STAGES, bool PAGED, typename S = Shape<D, MT, WARPS, BN, STAGES>>
using Kernel = Launch<prefill_kernel<D, BF16, MT, WARPS, BN, STAGES, PAGED>, S::THREADS, S::SMEM, S::BM>;

/* The Hopper kernel (sm_90a): 128 query rows a block (the same rows as
 * above) in two warpgroups of 64, 128-key tiles, wgmma with the operands
 * read by the tensor cores from 128-byte swizzled shared memory. Q
 * (scaled and rounded as above) stays in shared memory as the A operand
 * of S = Q K^T; K/V tiles stream through three slots: copied by the TMA
 * unit from a producer warpgroup (contiguous calls, tma_prefill_kernel)
 * or by cp.async one tile ahead with one block-wide barrier a tile
 * (through a block table, prefill_kernel). Within a warpgroup
 * the softmax of tile j overlaps the P V product of tile j - 1: per tile
 * the warpgroup issues S = Q K_j and O += P_{j-1} V_{j-1} together, waits
 * for S only, masks and exponentiates it, then waits for P V and
 * rescales O. docs/kernels.md ("GPU kernels") has the reasoning. */
namespace hopper {

constexpr int D = 128, BM = 128, BN = 128, STAGES = 3, THREADS = 256;
constexpr uint32_t PANEL_Q = BM * 128;  /* bytes of a 64-column panel of Q ([BM][64] halves) */
constexpr uint32_t PANEL_KV = BN * 128; /* of K or V */
constexpr uint32_t Q_BYTES = D / 64 * PANEL_Q;
constexpr uint32_t KV_BYTES = D / 64 * PANEL_KV; /* K or V of one tile */
constexpr size_t SMEM = 1024 + Q_BYTES + 2 * STAGES * KV_BYTES; /* 1024: alignment of the panels */

/* The device code below exists only where the arch-specific features
 * do (sm_90a); elsewhere the kernel traps and runs_here keeps it unused. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Byte offsets in a K or V slot: 64-column panels, 128-byte swizzled. */
struct Swizzled {
  __device__ uint32_t operator() (int row, int col) const { return (uint32_t) (col / 8) * PANEL_KV + sift_wg::swz (row, col % 8); }
};

/* The online softmax of one tile's scores without touching O (a P V
 * product may still be writing it): raises the row maxima, makes s the
 * probabilities, and returns in alpha the factor O must be rescaled by.
 * A row with no key yet subtracts 0 instead of -inf, as softmax_step. */
__device__ __forceinline__ void
softmax_scores (float s[16][4], float m[2], float l[2], float alpha[2])
{
#pragma unroll
  for (int x = 0; x < 2; x++)
    {
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int n = 0; n < 16; n++)
        mx = fmaxf (mx, fmaxf (s[n][2 * x], s[n][2 * x + 1]));
      const float m_new = fmaxf (m[x], quad_max (mx));
      const float base = m_new == -CUDART_INF_F ? 0.0f : m_new;
      alpha[x] = fast_exp2 (m[x] - base);
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < 16; n++)
        {
          s[n][2 * x] = fast_exp2 (s[n][2 * x] - base);
          s[n][2 * x + 1] = fast_exp2 (s[n][2 * x + 1] - base);
          sum += s[n][2 * x] + s[n][2 * x + 1];
        }
      l[x] = l[x] * alpha[x] + sum;
      m[x] = m_new;
    }
}

/* Issues S = Q K^T of a warpgroup's 64 rows (Q's panels at qa: k-step ks
 * is panel ks / 4 at byte 32 (ks % 4)) against the K panels of the stage
 * at st, and commits it. Every input of the wgmma is computed before
 * the fence (else ptxas serialises them). */
template <bool BF16>
__device__ __forceinline__ void
scores (float s[16][4], uint32_t qa, uint32_t st)
{
  uint64_t dq[D / 16], dk[D / 16];
  int zero = 0, one = 1;
#pragma unroll
  for (int ks = 0; ks < D / 16; ks++)
    {
      dq[ks] = sift_wg::desc (qa + ks / 4 * PANEL_Q + ks % 4 * 32, 16, 1024);
      dk[ks] = sift_wg::desc (st + ks / 4 * PANEL_KV + ks % 4 * 32, 16, 1024);
      sift_wg::hold (dq[ks]);
      sift_wg::hold (dk[ks]);
    }
  sift_wg::hold (zero);
  sift_wg::hold (one);
  sift_wg::hold (s);
  sift_wg::fence ();
#pragma unroll
  for (int ks = 0; ks < D / 16; ks++)
    sift_wg::mma_ss<BF16> (s, dq[ks], dk[ks], ks > 0 ? one : zero);
  sift_wg::commit ();
}

/* Issues O += P V against the V slot at vst (keys along K, 8-key groups
 * 1024 bytes apart; its two 64-column panels along N PANEL_KV apart)
 * and commits it. */
template <bool BF16>
__device__ __forceinline__ void
add_pv (float o[16][4], uint32_t pa[8][4], uint32_t vst)
{
  uint64_t dv[BN / 16];
  int one = 1;
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++)
    {
      dv[kk] = sift_wg::desc (vst + kk * 16 * 128, PANEL_KV, 1024);
      sift_wg::hold (dv[kk]);
      sift_wg::hold (pa[kk]);
    }
  sift_wg::hold (one);
  sift_wg::hold (o);
  sift_wg::fence ();
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++)
    sift_wg::mma_rs<BF16> (o, pa[kk], dv[kk], one);
  sift_wg::commit ();
}

/* Keys past a row's limit (causal, split end, tail) score -inf: only in
 * tiles that hold one. */
__device__ __forceinline__ void
mask (float s[16][4], int k0, int lim_min, const int rlim[2], int t)
{
  if (k0 + BN > lim_min)
#pragma unroll
    for (int n = 0; n < 16; n++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        if (k0 + n * 8 + 2 * t + (e & 1) >= rlim[e >> 1])
          s[n][e] = -CUDART_INF_F;
}

/* P, rounded to K's type, as the A operand of k-step kk (keys 16 kk to
 * 16 kk + 15): score fragments 2 kk and 2 kk + 1 as they lie. */
template <bool BF16>
__device__ __forceinline__ void
pack_p (uint32_t pa[8][4], const float s[16][4])
{
#pragma unroll
  for (int kk = 0; kk < 8; kk++)
    {
      pa[kk][0] = pack2<BF16> (s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = pack2<BF16> (s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = pack2<BF16> (s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = pack2<BF16> (s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

/* Q as in the mma.sync kernel, into two swizzled 64-column panels at qg
 * (by the first THREADS threads). */
template <bool BF16>
__device__ __forceinline__ void
stage_q_panels (const SiftCudaAttnCall &c, const Block &b, uint8_t *qg)
{
  stage_q<D, BM, THREADS, BF16> (c, b, [&] (int row, int col) {
    return qg + col / 64 * PANEL_Q + sift_wg::swz (row, col % 64 / 8) + col % 8 * 2;
  });
}

/* What a warpgroup's rounds tell the code that brings the tiles:
 * round it may issue (READY: K of tile it and V of tile it - 1 are in
 * their slots; it == n_tiles is the last P V alone), its products are
 * issued (ISSUED), this warp's S = Q K_it has read K (K_READ), its
 * P V has read V of tile it - 1 (V_READ). */
enum Step { READY, ISSUED, K_READ, V_READ };

/* A warpgroup's pass over the block's n_tiles tiles (tile j in slot
 * j % STAGES of kring and vring; Q's panels at qa): round 0 is S = Q K_0
 * and its softmax, round it issues S = Q K_it and O += P_{it-1} V_{it-1}
 * together, waits for S only, masks and exponentiates it while P V
 * runs, then waits for P V and rescales O; the last P V follows. Leaves
 * the unnormalised output in o and the softmax state in m, l. */
template <bool BF16, typename Feed>
__device__ __forceinline__ void
rounds (float o[16][4], float m[2], float l[2], uint32_t qa, uint32_t kring, uint32_t vring, int n_tiles, int lo,
        int lim_min, const int rlim[2], int t, Feed feed)
{
  float s[16][4];
  uint32_t pa[8][4]; /* P of the previous tile: the A operand of k-step kk (keys 16 kk..16 kk + 15) */
#pragma unroll
  for (int i = 0; i < 16; i++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      s[i][e] = o[i][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < 8; kk++)
    pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;

  if (n_tiles > 0)
    {
      feed (READY, 0);
      scores<BF16> (s, qa, kring);
      feed (ISSUED, 0);
      sift_wg::wait<0> ();
      sift_wg::hold (s);
      feed (K_READ, 0);
      float alpha[2];
      mask (s, lo, lim_min, rlim, t);
      softmax_scores (s, m, l, alpha);
      pack_p<BF16> (pa, s);
    }
  for (int it = 1; it < n_tiles; it++)
    {
      feed (READY, it);
      scores<BF16> (s, qa, kring + it % STAGES * KV_BYTES);
      add_pv<BF16> (o, pa, vring + (it - 1) % STAGES * KV_BYTES);
      feed (ISSUED, it);
      sift_wg::wait<1> ();
      sift_wg::hold (s);
      feed (K_READ, it);
      float alpha[2];
      mask (s, lo + it * BN, lim_min, rlim, t);
      softmax_scores (s, m, l, alpha);
      sift_wg::wait<0> ();
      sift_wg::hold (o);
      feed (V_READ, it);
#pragma unroll
      for (int n = 0; n < 16; n++)
        {
          o[n][0] *= alpha[0];
          o[n][1] *= alpha[0];
          o[n][2] *= alpha[1];
          o[n][3] *= alpha[1];
        }
      pack_p<BF16> (pa, s);
    }
  if (n_tiles > 0)
    {
      feed (READY, n_tiles);
      add_pv<BF16> (o, pa, vring + (n_tiles - 1) % STAGES * KV_BYTES);
      sift_wg::wait<0> ();
      sift_wg::hold (o);
    }
}

/* This thread's two rows r_thr, r_thr + 8 of the result. */
__device__ __forceinline__ void
store_rows (const SiftCudaAttnCall &c, const Block &b, int r_thr, int t, const float o[16][4], const float l[2], const float m[2])
{
#pragma unroll
  for (int x = 0; x < 2; x++)
    store_row<D> (c, b, r_thr + 8 * x, x, t, o, l[x], m[x]);
}

#endif

template <bool BF16, bool PAGED>
__global__ void __launch_bounds__ (THREADS, 1)
prefill_kernel (const __grid_constant__ SiftCudaAttnCall c)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__ (1024) uint8_t wsmem[];
  const uint32_t raw = smem_addr (wsmem);
  const uint32_t qs = (raw + 1023u) & ~1023u; /* Q's panels, then the stages */
  const uint32_t kring = qs + Q_BYTES, vring = kring + STAGES * KV_BYTES; /* STAGES slots each */
  uint8_t *qg = wsmem + (qs - raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = warp / 4, w = warp % 4; /* warpgroup, warp in it */
  const int g = lane / 4, t = lane % 4;
  const Block b (c, BM);
  const int kvh = b.kvh, lo = b.lo, hi = b.hi;
  const int r_thr = b.r_blk + wg * 64 + w * 16 + g; /* this thread's rows: r_thr, r_thr + 8 */
  const int rlim[2] = { b.limit (c, r_thr), b.limit (c, r_thr + 8) };
  const int lim_min = min (rlim[0], rlim[1]);

  /* Tile j's K and V go to slot j % STAGES, one tile ahead (copy group
   * j). */
  Cursor cur;
  if constexpr (PAGED)
    cur.seek_warp (c, lo, lane);
  const int n_tiles = (hi - lo + BN - 1) / BN;
  auto copy_tile = [&] (int j) {
    if (j < n_tiles)
      load_kv<D, BN, THREADS, PAGED> (c, cur, kvh, lo + j * BN, hi, kring + j % STAGES * KV_BYTES,
                                      vring + j % STAGES * KV_BYTES, Swizzled ());
    cp_async_commit ();
  };
  copy_tile (0);
  copy_tile (1);

  stage_q_panels<BF16> (c, b, qg);

  /* A warpgroup's 64 rows of Q: k-step ks is panel ks / 4 at byte 32 (ks % 4). */
  const uint32_t qa = qs + (uint32_t) wg * 64 * 128;
  float m[2] = { -CUDART_INF_F, -CUDART_INF_F }, l[2] = { 0.0f, 0.0f }, o[16][4];
  /* Before round it: tile it landed and is visible to the tensor cores,
   * and every warpgroup is done with round it - 1, so with tile it - 2
   * (its P V waited for there), whose slot copy group it + 1 refills.
   * The copies go out after the products are issued, not before: the
   * tensor cores start sooner (3% on an H200). */
  rounds<BF16> (o, m, l, qa, kring, vring, n_tiles, lo, lim_min, rlim, t, [&] (Step step, int it) {
    if (step == READY && it < n_tiles)
      {
        if (it == 0)
          cp_async_wait<1> ();
        else
          cp_async_wait<0> ();
        sift_wg::fence_async_smem ();
        __syncthreads ();
      }
    else if (step == ISSUED && it > 0)
      copy_tile (it + 1);
  });

  store_rows (c, b, r_thr, t, o, l, m);
#else
  __trap (); /* launched only where the sm_90a code runs (runs_here) */
#endif
}

/* The same products and softmax with K/V tiles brought by the TMA unit
 * (contiguous calls): a third, producer warpgroup, one thread of which copies
 * each K and V tile as two 64-column boxes of a 3D tensor map ([kv
 * heads][keys][128], built on the host) into 128-byte swizzled panels,
 * the layout the wgmma descriptors read. K and V have three slots each,
 * each slot a "full" mbarrier (the copies' bytes) and an "empty" one (an
 * arrival of each of the 8 consumer warps once its products have read
 * the slot). No block-wide barrier in the loop: the consumers issue no
 * copy instruction and wait for data only, and the two warpgroups run
 * apart (one's softmax under the other's products). The producer
 * warpgroup gives its registers to the consumers (setmaxnreg 24 / 240). */
constexpr int TMA_THREADS = THREADS + 128;
constexpr size_t TMA_SMEM = SMEM + 4 * STAGES * 8; /* the slots' mbarriers after the V slots */

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Mbarrier `s` of kind `kind` (0: K full, 1: V full, 2: K empty, 3: V empty). */
__device__ __forceinline__ uint32_t
slot_bar (uint32_t bars, int kind, int s)
{
  return bars + (uint32_t) (kind * STAGES + s) * 8;
}
#endif

template <bool BF16>
__global__ void __launch_bounds__ (TMA_THREADS, 1)
tma_prefill_kernel (const __grid_constant__ SiftCudaAttnCall c, const __grid_constant__ CUtensorMap tk,
                    const __grid_constant__ CUtensorMap tv)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__ (1024) uint8_t wsmem[];
  const uint32_t raw = smem_addr (wsmem);
  const uint32_t qs = (raw + 1023u) & ~1023u;
  const uint32_t kring = qs + Q_BYTES, vring = kring + STAGES * KV_BYTES;
  const uint32_t bars = vring + STAGES * KV_BYTES; /* [4][STAGES] mbarriers */
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Block b (c, BM);
  const int lo = b.lo, hi = b.hi;
  const int n_tiles = (hi - lo + BN - 1) / BN;

  if (threadIdx.x == 0)
    {
      for (int s = 0; s < STAGES; s++)
        {
          sift_wg::mbar_init (slot_bar (bars, 0, s), 1);
          sift_wg::mbar_init (slot_bar (bars, 1, s), 1);
          sift_wg::mbar_init (slot_bar (bars, 2, s), THREADS / 32);
          sift_wg::mbar_init (slot_bar (bars, 3, s), THREADS / 32);
        }
      sift_wg::mbar_init_fence ();
    }
  __syncthreads ();

  if (warp >= THREADS / 32)
    {
      sift_wg::regs_down<24> ();
      /* The producer: tile j to slot j % STAGES once use j / STAGES - 1
       * of the slot is released (phase parity of use u: u % 2). */
      if (threadIdx.x == THREADS)
        for (int j = 0; j < n_tiles; j++)
          {
            const int s = j % STAGES, y = lo + j * BN - c.one.start;
            const uint32_t ph = (uint32_t) (j / STAGES) & 1u;
            if (j >= STAGES)
              sift_wg::mbar_wait (slot_bar (bars, 2, s), ph ^ 1u);
            sift_wg::mbar_expect (slot_bar (bars, 0, s), KV_BYTES);
            sift_wg::tma_load (kring + s * KV_BYTES, &tk, 0, y, b.kvh, slot_bar (bars, 0, s));
            sift_wg::tma_load (kring + s * KV_BYTES + PANEL_KV, &tk, 64, y, b.kvh, slot_bar (bars, 0, s));
            if (j >= STAGES)
              sift_wg::mbar_wait (slot_bar (bars, 3, s), ph ^ 1u);
            sift_wg::mbar_expect (slot_bar (bars, 1, s), KV_BYTES);
            sift_wg::tma_load (vring + s * KV_BYTES, &tv, 0, y, b.kvh, slot_bar (bars, 1, s));
            sift_wg::tma_load (vring + s * KV_BYTES + PANEL_KV, &tv, 64, y, b.kvh, slot_bar (bars, 1, s));
          }
      return;
    }

  sift_wg::regs_up<240> ();
  uint8_t *qg = wsmem + (qs - raw);
  const int wg = warp / 4, w = warp % 4;
  const int g = lane / 4, t = lane % 4;
  const int r_thr = b.r_blk + wg * 64 + w * 16 + g;
  const int rlim[2] = { b.limit (c, r_thr), b.limit (c, r_thr + 8) };
  const int lim_min = min (rlim[0], rlim[1]);

  stage_q_panels<BF16> (c, b, qg);
  sift_wg::fence_async_smem ();
  sift_wg::bar_sync (1, THREADS); /* the consumers only */

  const uint32_t qa = qs + (uint32_t) wg * 64 * 128;
  float m[2] = { -CUDART_INF_F, -CUDART_INF_F }, l[2] = { 0.0f, 0.0f }, o[16][4];
  /* Waits for the copies of a tile, and gives its slots back one arrival
   * a warp once this warp's products have read them. */
  rounds<BF16> (o, m, l, qa, kring, vring, n_tiles, lo, lim_min, rlim, t, [&] (Step step, int it) {
    if (step == READY)
      {
        if (it < n_tiles)
          sift_wg::mbar_wait (slot_bar (bars, 0, it % STAGES), (uint32_t) (it / STAGES) & 1u);
        if (it > 0)
          sift_wg::mbar_wait (slot_bar (bars, 1, (it - 1) % STAGES), (uint32_t) ((it - 1) / STAGES) & 1u);
      }
    else if (step == K_READ && lane == 0)
      sift_wg::mbar_arrive (slot_bar (bars, 2, it % STAGES));
    else if (step == V_READ && lane == 0)
      sift_wg::mbar_arrive (slot_bar (bars, 3, (it - 1) % STAGES));
  });

  store_rows (c, b, r_thr, t, o, l, m);
#else
  __trap (); /* launched only where the sm_90a code runs (runs_here) */
#endif
}

/* Launches the TMA kernel for a contiguous call; cudaErrorNotSupported
 * where the tensor maps cannot describe its K/V (the caller falls back). */
template <bool BF16>
cudaError_t
launch_tma (const SiftCudaAttnCall &c, cudaStream_t stream)
{
  CUtensorMap tk, tv;
  /* With the 256-byte L2 promotion (without it: the same speed, session 10) */
  if (!sift_tma::kv_map (&tk, c.one.k, c.one.k_hs, c.one.k_ts, c.one.n, c.kv_heads, BF16, BN, true)
      || !sift_tma::kv_map (&tv, c.one.v, c.one.v_hs, c.one.v_ts, c.one.n, c.kv_heads, BF16, BN, true))
    return cudaErrorNotSupported;
  constexpr auto FN = tma_prefill_kernel<BF16>;
  cudaError_t e = allow_smem<FN, TMA_SMEM> ();
  if (e != cudaSuccess)
    return e;
  dim3 blocks;
  if (!grid (c, BM, blocks))
    return cudaErrorInvalidConfiguration;
  FN<<<blocks, TMA_THREADS, TMA_SMEM, stream>>> (c, tk, tv);
  return cudaGetLastError ();
}

/* Whether the current device runs this file's sm_90a code (see
 * sift_tma::machine_code_runs). */
bool
runs_here ()
{
  return sift_tma::machine_code_runs (reinterpret_cast<const void *> (prefill_kernel<true, false>));
}

template <bool BF16, bool PAGED> using Kernel = Launch<prefill_kernel<BF16, PAGED>, THREADS, SMEM, BM>;

} // namespace hopper

/* The shape used: 32 rows a warp, 4 warps, 64-key tiles, 2 stages (102 KB
 * of shared memory for head_dim 128: two blocks an SM). On an H200 at 16K
 * (docs/benchmarks.md) it beat 16 rows a warp with 8 warps and Q in
 * registers (0.78x its speed), 32-key tiles in 3 stages (0.91x) and 64-key
 * tiles in 3 stages (one block an SM, 0.72x). */
template <int D, bool BF16, bool PAGED> using Prefill = Kernel<D, BF16, 2, 4, 64, 2, PAGED>;

template <int D, bool BF16>
cudaError_t
launch (const SiftCudaAttnCall &c, cudaStream_t stream)
{
  if (D == hopper::D && hopper::runs_here ())
    {
      if (c.n_blocks > 1)
        return hopper::Kernel<BF16, true>::launch (c, stream);
      const cudaError_t e = hopper::launch_tma<BF16> (c, stream);
      if (e != cudaErrorNotSupported)
        return e;
      return hopper::Kernel<BF16, false>::launch (c, stream);
    }
  if (c.n_blocks > 1)
    return Prefill<D, BF16, true>::launch (c, stream);
  return Prefill<D, BF16, false>::launch (c, stream);
}

} // namespace

extern "C" int
sift_cuda_prefill_blocks_per_sm (int32_t head_dim, int32_t bf16)
{
  if (head_dim == hopper::D && hopper::runs_here ())
    return bf16 ? hopper::Kernel<true, false>::resident () : hopper::Kernel<false, false>::resident ();
  if (head_dim == 64)
    return bf16 ? Prefill<64, true, false>::resident ()
                : Prefill<64, false, false>::resident ();
  return bf16 ? Prefill<128, true, false>::resident ()
              : Prefill<128, false, false>::resident ();
}

extern "C" int
sift_cuda_prefill_launch (const SiftCudaAttnCall *c, void *stream_)
{
  cudaStream_t stream = (cudaStream_t) stream_;
  if (c->head_dim == 64)
    return c->bf16 ? launch<64, true> (*c, stream) : launch<64, false> (*c, stream);
  return c->bf16 ? launch<128, true> (*c, stream) : launch<128, false> (*c, stream);
}
