/* GPU attention: tiled online softmax on tensor cores (mma.sync m16n8k16,
 * f16 or bf16 operands, f32 accumulators). Here: the decode kernel (up to
 * 16 rows per kv head), split over the key axis and merged by LSE
 * (flash-decoding), the merges and the launch dispatch; the prefill kernel
 * is in prefill.cu.
 * docs/kernels.md ("GPU kernels") describes the tiling; cuda.c checks the
 * arguments before anything here runs. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "mma.cuh"

using namespace sift_mma;

namespace {

constexpr int PAD = 8;   /* halves added to each smem row: 16 bytes, no bank conflicts */

template <int D> __host__ __device__ constexpr int ld () { return D + PAD; }

/* A cursor that also holds the next block's entry, read one block ahead:
 * stepping into it waits for no read (a decode warp's chunks step into
 * the next 128-key block every other chunk, and a dependent table read
 * there held back that chunk's copies). */
struct AheadCursor : Cursor {
  SiftCudaKvBlock nxt;

  __device__ void
  fetch_next (const SiftCudaAttnCall &c)
  {
    nxt = idx + 1 < c.n_blocks ? c.blocks[idx + 1] : cur;
  }

  __device__ void
  advance (const SiftCudaAttnCall &c, int key)
  {
    while (key >= cur.start + cur.n && idx + 1 < c.n_blocks)
      {
        cur = nxt;
        idx++;
        fetch_next (c);
      }
  }
};

/* Where a split's result goes: the output (one split) or its partial. */
struct Dest {
  float *out, *lse;
  int64_t out_hs, out_ts, lse_hs;
};
template <int D>
__device__ __forceinline__ Dest
dest (const SiftCudaAttnCall &c, int split)
{
  if (c.n_splits <= 1)
    return { c.out, c.lse, c.out_hs, c.out_ts, c.n_q };
  return { c.part_o + (int64_t) split * c.q_heads * c.n_q * D, c.part_l + (int64_t) split * c.q_heads * c.n_q,
           (int64_t) c.n_q * D, D, c.n_q };
}

/* A warp's two rows per thread (r0 + g and r0 + g + 8 of `rows`): query
 * head, token and the end of its visible keys within [lo, hi). */
__device__ __forceinline__ void
row_setup (const SiftCudaAttnCall &c, int r0, int rows, int group, int kvh, int lo, int hi, int rh[2], int ri[2],
           int rlim[2])
{
  for (int x = 0; x < 2; x++)
    {
      int r = r0 + 8 * x;
      ri[x] = r / group;
      rh[x] = kvh * group + r % group;
      if (r >= rows)
        rlim[x] = lo; /* padding row: sees nothing */
      else if (c.causal)
        rlim[x] = (int) max ((int64_t) lo, min ((int64_t) hi, c.q_offset + ri[x] + 1));
      else
        rlim[x] = hi;
    }
}

/* Q as A fragments of the rows r0 + g and r0 + g + 8 (thread (g, t)),
 * scaled by scale * log2(e) once and rounded to the K/V type. */
template <int KS, bool BF16>
__device__ __forceinline__ void
load_q (const SiftCudaAttnCall &c, int r0, int rows, int t, const int rh[2], const int ri[2], uint32_t qf[KS][4])
{
  for (int ks = 0; ks < KS; ks++)
    for (int x = 0; x < 4; x++)
      {
        int row = x & 1, col = ks * 16 + 2 * t + (x >> 1) * 8;
        float a = 0.0f, b = 0.0f;
        if (r0 + 8 * row < rows)
          {
            const float *p = c.q + rh[row] * c.q_hs + ri[row] * c.q_ts + col;
            a = p[0] * c.qscale;
            b = p[1] * c.qscale;
          }
        qf[ks][x] = pack2<BF16> (a, b);
      }
}

/* S = Q K^T of 8 NT keys: K's B operands of two k-steps per ldmatrix
 * (matrix i is keys n*8..n*8+7 at columns ks*16 + 8i); k points at the
 * first key's row in shared memory. */
template <int D, int NT, bool BF16>
__device__ __forceinline__ void
scores (const uint16_t *k, int lane, const uint32_t qf[D / 16][4], float s[NT][4])
{
  for (int n = 0; n < NT; n++)
    {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      const uint16_t *krow = k + (n * 8 + (lane & 7)) * ld<D> () + (lane >> 3) * 8;
      for (int ks = 0; ks < D / 16; ks += 2)
        {
          uint32_t b[4];
          ldmatrix_x4 (b, krow + ks * 16);
          mma<BF16> (s[n], qf[ks], b[0], b[1]);
          mma<BF16> (s[n], qf[ks + 1], b[2], b[3]);
        }
    }
}

/* O += P V for 8 NT keys: the score fragments of 16 keys are the A operand
 * as they lie in registers; V's B operands come transposed from shared
 * memory (v: the first key's row). */
template <int D, int NT, bool BF16>
__device__ __forceinline__ void
accumulate_pv (const float s[NT][4], const uint16_t *v, int lane, float o[D / 8][4])
{
  for (int kk = 0; kk < NT / 2; kk++)
    {
      uint32_t pa[4] = {
        pack2<BF16> (s[2 * kk][0], s[2 * kk][1]),
        pack2<BF16> (s[2 * kk][2], s[2 * kk][3]),
        pack2<BF16> (s[2 * kk + 1][0], s[2 * kk + 1][1]),
        pack2<BF16> (s[2 * kk + 1][2], s[2 * kk + 1][3]),
      };
      const uint16_t *vrow = v + (kk * 16 + (lane & 15)) * ld<D> () + (lane >> 4) * 8;
      for (int j = 0; j < D / 8; j += 2)
        {
          uint32_t b[4];
          ldmatrix_x4_trans (b, vrow + j * 8);
          mma<BF16> (o[j], pa, b[0], b[1]);
          mma<BF16> (o[j + 1], pa, b[2], b[3]);
        }
    }
}

/* Decode (up to 16 query rows of a kv head: a GQA group of one token, or
 * a few tokens): a separate kernel built for streaming K/V at the memory's
 * rate. Each of the DW warps of a thread block owns every DW-th 16-key
 * chunk of the block's split and its own ring of DS shared-memory stages
 * (16 keys of K and V each), filled by cp.async with DS - 1 stages in
 * flight while it computes on the oldest: no barrier between warps in the
 * loop, so one warp's wait never idles the others. A chunk's loads are
 * warp-contiguous (lanes 0..15 one key row, lanes 16..31 the next for
 * head_dim 128): each load instruction reads 512 consecutive bytes of a
 * contiguous layout. The block table is looked up once per chunk (per row
 * only where a chunk straddles two blocks). Per chunk: S = Q K^T and
 * O += P V by mma.sync as in prefill.cu (a 16-row tile), the online
 * softmax between; the warps' states merge through shared memory at the
 * end. */
constexpr int DW = 4;   /* warps per decode block */
constexpr int DK = 16;  /* keys per chunk */

template <int D> __host__ __device__ constexpr int dstage_halves () { return 2 * DK * ld<D> (); }
template <int D, int DS> __host__ __device__ constexpr size_t dsmem_bytes ()
{
  /* the warps' rings; the final merge reuses them ([DW][16] m and l, [DW][16][D] o) */
  return (size_t) DW * DS * dstage_halves<D> () * sizeof (uint16_t);
}
static_assert (dsmem_bytes<64, 2> () >= (2 * DW * 16 + DW * 16 * 64) * sizeof (float), "merge space");
static_assert (dsmem_bytes<128, 2> () >= (2 * DW * 16 + DW * 16 * 128) * sizeof (float), "merge space");

/* Issues the copies of the chunk of keys [k0, k0 + DK) into one stage (K
 * rows, then V rows, [DK][ld] halves each); keys at or past hi are zeros. */
template <int D>
__device__ __forceinline__ uint32_t
load_chunk (const SiftCudaAttnCall &c, AheadCursor &cur, int kvh, int k0, int hi, uint16_t *stage, int lane)
{
  constexpr int CPR = D / 8;       /* 16-byte pieces per row */
  constexpr int RPI = 32 / CPR;    /* rows per warp-wide load */
  const int col = lane % CPR;
  cur.advance (c, k0);
  /* Warp-uniform: the whole chunk lies in the cursor's block (the usual
   * case), so one base pointer serves every row. */
  const bool one = min (k0 + DK, hi) <= cur.cur.start + cur.cur.n;
  uint32_t valid = 0; /* bit r: key k0 + r exists for this kv head (masked calls) */
  for (int j = 0; j < DK / RPI; j++)
    {
      const int row = j * RPI + lane / CPR;
      const int key = k0 + row;
      const char *ks = (const char *) cur.cur.k, *vs = (const char *) cur.cur.v; /* read 0 bytes */
      int n = 0;
      if (key < hi)
        {
          SiftCudaKvBlock b = cur.cur;
          if (!one)
            {
              Cursor rc = cur; /* this row's block, a few blocks on at most (rare: no read ahead) */
              rc.advance (c, key);
              b = rc.cur;
            }
          if (!c.masked || ((b.heads >> kvh) & 1))
            {
              const int64_t t = key - b.start;
              ks = (const char *) b.k + ((kvh * b.k_hs + t * b.k_ts) * 2 + col * 16);
              vs = (const char *) b.v + ((kvh * b.v_hs + t * b.v_ts) * 2 + col * 16);
              n = 16;
            }
        }
      cp_async16 (stage + row * ld<D> () + col * 8, ks, n);
      cp_async16 (stage + (DK + row) * ld<D> () + col * 8, vs, n);
      if (c.masked) /* uniform: every lane takes it */
        {
          const uint32_t bits = __ballot_sync (0xffffffffu, n != 0); /* row j RPI + r at lane r CPR */
          for (int r = 0; r < RPI; r++)
            valid |= ((bits >> (r * CPR)) & 1u) << (j * RPI + r);
        }
    }
  return valid;
}

template <int N> __device__ __forceinline__ void cp_async_wait () { asm volatile ("cp.async.wait_group %0;" ::"n"(N)); }

template <int D, bool BF16, int DS>
__global__ void __launch_bounds__ (DW * 32)
decode_kernel (SiftCudaAttnCall c)
{
  constexpr int DT = D / 8;  /* output fragments */
  constexpr int KS = D / 16; /* k-steps of Q K^T */

  extern __shared__ __align__ (16) uint16_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int group = c.q_heads / c.kv_heads;
  const int rows = group * c.n_q; /* <= 16 */
  const int kvh = blockIdx.x, split = blockIdx.y;

  int lo = split * c.split_len;
  int hi = min (c.n_kv, lo + c.split_len);
  if (c.causal)
    {
      int64_t lim = c.q_offset + (rows - 1) / group + 1;
      hi = (int) max ((int64_t) lo, min ((int64_t) hi, lim));
    }

  int rh[2], ri[2], rlim[2];
  row_setup (c, g, rows, group, kvh, lo, hi, rh, ri, rlim);
  const int lim_max = max (rlim[0], rlim[1]), lim_min = min (rlim[0], rlim[1]);

  uint16_t *ring = smem + warp * DS * dstage_halves<D> ();
  __shared__ uint32_t valid[DW][DS]; /* masked calls: each stage's keys that exist for this kv head */
  const int n_chunks = (hi - lo + DK - 1) / DK;
  const int mine = n_chunks > warp ? (n_chunks - warp + DW - 1) / DW : 0; /* chunks warp, warp + DW, ... */
  AheadCursor cur;
  cur.seek_warp (c, lo, lane);
  cur.fetch_next (c);
  /* Prologue: DS - 1 chunks in flight before the first is used. */
  for (int s = 0; s < DS - 1; s++)
    {
      if (s < mine)
        {
          const uint32_t v = load_chunk<D> (c, cur, kvh, lo + (s * DW + warp) * DK, hi, ring + s * dstage_halves<D> (),
                                            lane);
          if (lane == 0)
            valid[warp][s] = v;
        }
      cp_async_commit ();
    }

  uint32_t qf[KS][4];
  load_q<KS, BF16> (c, g, rows, t, rh, ri, qf);

  float m[2] = { -CUDART_INF_F, -CUDART_INF_F }, l[2] = { 0.0f, 0.0f };
  float o[DT][4];
  for (int j = 0; j < DT; j++)
    o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  for (int it = 0; it < mine; it++)
    {
      const int ahead = it + DS - 1;
      if (ahead < mine)
        {
          const uint32_t v = load_chunk<D> (c, cur, kvh, lo + (ahead * DW + warp) * DK, hi,
                                            ring + (ahead % DS) * dstage_halves<D> (), lane);
          if (lane == 0)
            valid[warp][ahead % DS] = v;
        }
      cp_async_commit ();
      cp_async_wait<DS - 1> (); /* this lane's copies of chunk `it` landed */
      __syncwarp ();            /* and every lane's are visible */
      const int k0 = lo + (it * DW + warp) * DK;
      const uint16_t *ks_ = ring + (it % DS) * dstage_halves<D> ();
      const uint16_t *vs_ = ks_ + DK * ld<D> ();
      if (__any_sync (0xffffffffu, k0 < lim_max)) /* warp-uniform: mma.sync needs every lane */
        {
          float s[2][4];
          scores<D, 2, BF16> (ks_, lane, qf, s);
          if (k0 + DK > lim_min)
            for (int n = 0; n < 2; n++)
              for (int x = 0; x < 4; x++)
                if (k0 + n * 8 + 2 * t + (x & 1) >= rlim[x >> 1])
                  s[n][x] = -CUDART_INF_F;
          if (c.masked) /* keys of blocks this kv head does not attend */
            {
              const uint32_t v = valid[warp][it % DS];
              for (int n = 0; n < 2; n++)
                for (int x = 0; x < 4; x++)
                  if (!((v >> (n * 8 + 2 * t + (x & 1))) & 1))
                    s[n][x] = -CUDART_INF_F;
            }
          softmax_step<2, DT> (s, m, l, o);
          accumulate_pv<D, 2, BF16> (s, vs_, lane, o);
        }
      __syncwarp (); /* every lane is done with the stage before it is refilled */
    }
  cp_async_wait<0> ();

  for (int x = 0; x < 2; x++)
    l[x] = quad_sum (l[x]);

  const Dest dst = dest<D> (c, split);

  /* The warps' states merged by max and rescale through shared memory
   * (every warp's ring is done). */
  __syncthreads ();
  float *ms = reinterpret_cast<float *> (smem); /* [DW][16] */
  float *ls = ms + DW * 16;                      /* [DW][16] */
  float *os = ls + DW * 16;                     /* [DW][16][D] */
  for (int x = 0; x < 2; x++)
    {
      if (t == 0)
        {
          ms[warp * 16 + g + 8 * x] = m[x];
          ls[warp * 16 + g + 8 * x] = l[x];
        }
      for (int j = 0; j < DT; j++)
        {
          os[(warp * 16 + g + 8 * x) * D + j * 8 + 2 * t] = o[j][2 * x];
          os[(warp * 16 + g + 8 * x) * D + j * 8 + 2 * t + 1] = o[j][2 * x + 1];
        }
    }
  __syncthreads ();
  for (int e = threadIdx.x; e < rows * D; e += DW * 32)
    {
      const int r = e / D, d = e % D;
      float mm = -CUDART_INF_F;
      for (int w = 0; w < DW; w++)
        mm = fmaxf (mm, ms[w * 16 + r]);
      float base = mm == -CUDART_INF_F ? 0.0f : mm;
      float sum = 0.0f, acc = 0.0f;
      for (int w = 0; w < DW; w++)
        {
          float f = exp2f (ms[w * 16 + r] - base);
          sum += f * ls[w * 16 + r];
          acc += f * os[(w * 16 + r) * D + d];
        }
      const int h = kvh * group + r % group, i = r / group;
      dst.out[h * dst.out_hs + i * dst.out_ts + d] = sum > 0.0f ? acc / sum : 0.0f;
      if (d == 0)
        dst.lse[h * dst.lse_hs + i] = sum > 0.0f ? (base + log2f (sum)) * CUDART_LN2_F : -CUDART_INF_F;
    }
}

/* The splits of each row merged by LSE, in split order: one thread block
 * per (query head, token). The splits' LSEs go to shared memory in one
 * parallel pass (their max by a block reduction, each weight computed
 * once), then one thread per output column sums the partials with many
 * independent loads in flight: a serial walk over the splits would wait
 * on one L2 round trip per split. */
constexpr int MERGE_THREADS = 128;
__host__ __device__ constexpr int merge_padded (int n_splits) { return (n_splits + 7) / 8 * 8 + 8; }

__global__ void __launch_bounds__ (MERGE_THREADS)
merge_splits_kernel (SiftCudaAttnCall c)
{
  extern __shared__ float wts[]; /* [n_splits]: exp (lse_s - max) */
  __shared__ float red[MERGE_THREADS / 32];
  const int row = blockIdx.x; /* h * n_q + i */
  const int h = row / c.n_q, i = row % c.n_q;
  const int64_t per_split = (int64_t) c.q_heads * c.n_q;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float mm = -CUDART_INF_F;
  for (int s = threadIdx.x; s < c.n_splits; s += MERGE_THREADS)
    {
      wts[s] = c.part_l[s * per_split + row];
      mm = fmaxf (mm, wts[s]);
    }
  for (int o = 16; o > 0; o /= 2)
    mm = fmaxf (mm, __shfl_xor_sync (0xffffffffu, mm, o));
  if (lane == 0)
    red[warp] = mm;
  __syncthreads ();
  mm = red[0];
  for (int w = 1; w < MERGE_THREADS / 32; w++)
    mm = fmaxf (mm, red[w]);
  const float base = mm == -CUDART_INF_F ? 0.0f : mm;
  for (int s = threadIdx.x; s < merge_padded (c.n_splits); s += MERGE_THREADS)
    wts[s] = s < c.n_splits ? __expf (wts[s] - base) : 0.0f; /* the unrolled sum may read the padding */
  __syncthreads ();
  for (int d = threadIdx.x; d < c.head_dim; d += MERGE_THREADS)
    {
      const float *p = c.part_o + row * c.head_dim + d;
      const int64_t step = per_split * c.head_dim;
      float sum = 0.0f, acc = 0.0f;
#pragma unroll 8
      for (int s = 0; s < c.n_splits; s++)
        {
          sum += wts[s];
          acc += wts[s] * p[s * step];
        }
      c.out[h * c.out_hs + i * c.out_ts + d] = sum > 0.0f ? acc / sum : 0.0f;
      if (d == 0)
        c.lse[row] = sum > 0.0f ? base + logf (sum) : -CUDART_INF_F;
    }
}

/* A block table written into device memory from the launch's own
 * parameters: no copy engine (a cudaMemcpyAsync would queue behind the
 * copy stream's ring loads) and no reads of host memory by the attention
 * kernel (mapped pinned memory: a PCIe round trip per read, behind the
 * same loads). N entries per launch; tables up to 32 take the small one. */
template <int N> struct TableChunk {
  SiftCudaKvBlock b[N];
};

template <int N>
__global__ void
table_kernel (SiftCudaKvBlock *dst, int n, const __grid_constant__ TableChunk<N> t)
{
  for (int x = threadIdx.x; x < n; x += blockDim.x)
    dst[x] = t.b[x];
}

__global__ void
merge_kernel (float *o1, int64_t o1_hs, int64_t o1_ts, float *lse1, const float *o2, int64_t o2_hs,
              int64_t o2_ts, const float *lse2, int32_t tokens, int32_t head_dim)
{
  const int row = blockIdx.x, h = row / tokens, i = row % tokens;
  const float l1 = lse1[row], l2 = lse2[row];
  if (l2 == -CUDART_INF_F)
    return; /* empty partial: the identity */
  float *a = o1 + h * o1_hs + i * o1_ts;
  const float *b = o2 + h * o2_hs + i * o2_ts;
  const float mm = fmaxf (l1, l2);
  const float w1 = l1 == -CUDART_INF_F ? 0.0f : expf (l1 - mm), w2 = expf (l2 - mm);
  const float inv = 1.0f / (w1 + w2);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
    a[d] = l1 == -CUDART_INF_F ? b[d] : (w1 * a[d] + w2 * b[d]) * inv;
  __syncthreads (); /* every thread has read lse1 before it changes */
  if (threadIdx.x == 0)
    lse1[row] = mm + logf (w1 + w2);
}

/* Stages of each decode warp's ring: two chunks in flight while one is
 * used; 104 KB of shared memory a block for head_dim 128, two blocks an SM. */
constexpr int DECODE_STAGES = 3;

template <int D, bool BF16, int DS>
cudaError_t
decode_configure ()
{
  static bool configured = false; /* benign race: the attribute is idempotent */
  if (configured)
    return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute (decode_kernel<D, BF16, DS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int) dsmem_bytes<D, DS> ());
  configured = e == cudaSuccess;
  return e;
}

template <int D, bool BF16, int DS>
int
decode_resident_ds (void)
{
  static int n = 0;
  if (n == 0
      && (decode_configure<D, BF16, DS> () != cudaSuccess
          || cudaOccupancyMaxActiveBlocksPerMultiprocessor (&n, decode_kernel<D, BF16, DS>, DW * 32,
                                                            dsmem_bytes<D, DS> ()) != cudaSuccess))
    return 1;
  return n > 0 ? n : 1;
}

template <int D, bool BF16>
int
decode_resident (void)
{
  return decode_resident_ds<D, BF16, DECODE_STAGES> ();
}

template <int D, bool BF16, int DS>
cudaError_t
decode_launch_ds (const SiftCudaAttnCall &c, cudaStream_t stream)
{
  cudaError_t e = decode_configure<D, BF16, DS> ();
  if (e != cudaSuccess)
    return e;
  decode_kernel<D, BF16, DS><<<dim3 (c.kv_heads, c.n_splits), DW * 32, dsmem_bytes<D, DS> (), stream>>> (c);
  return cudaGetLastError ();
}

template <int D, bool BF16>
cudaError_t
launch_rows (const SiftCudaAttnCall &c, cudaStream_t stream)
{
  if (sift_cuda_attn_rows_per_block (c.q_heads / c.kv_heads * c.n_q) == 16)
    return decode_launch_ds<D, BF16, DECODE_STAGES> (c, stream);
  return (cudaError_t) sift_cuda_prefill_launch (&c, stream);
}

} // namespace

extern "C" int
sift_cuda_attn_rows_per_block (int32_t rows)
{
  return rows <= 16 ? 16 : SIFT_CUDA_PREFILL_ROWS;
}

extern "C" int
sift_cuda_attn_blocks_per_sm (int32_t head_dim, int32_t bf16, int32_t rows)
{
  if (sift_cuda_attn_rows_per_block (rows) != 16)
    return sift_cuda_prefill_blocks_per_sm (head_dim, bf16);
  if (head_dim == 64)
    return bf16 ? decode_resident<64, true> () : decode_resident<64, false> ();
  return bf16 ? decode_resident<128, true> () : decode_resident<128, false> ();
}

extern "C" int
sift_cuda_attn_launch (const SiftCudaAttnCall *c, void *stream_)
{
  cudaStream_t stream = (cudaStream_t) stream_;
  cudaError_t e;
  if (c->head_dim == 64)
    e = c->bf16 ? launch_rows<64, true> (*c, stream) : launch_rows<64, false> (*c, stream);
  else
    e = c->bf16 ? launch_rows<128, true> (*c, stream) : launch_rows<128, false> (*c, stream);
  if (e != cudaSuccess || c->n_splits <= 1)
    return e;
  merge_splits_kernel<<<c->q_heads * c->n_q, MERGE_THREADS, merge_padded (c->n_splits) * sizeof (float), stream>>> (*c);
  return cudaGetLastError ();
}

extern "C" int
sift_cuda_table_launch (SiftCudaKvBlock *dst, const SiftCudaKvBlock *table, int32_t n, void *stream_)
{
  constexpr int SMALL = 32, LARGE = 480; /* 2 KB and 30 KB of parameters (at most 32764 bytes) */
  cudaStream_t stream = (cudaStream_t) stream_;
  for (int32_t at = 0; at < n;)
    {
      const int32_t m = n - at < LARGE ? n - at : LARGE;
      if (m <= SMALL)
        {
          TableChunk<SMALL> t = {};
          memcpy (t.b, table + at, m * sizeof (SiftCudaKvBlock));
          table_kernel<SMALL><<<1, SMALL, 0, stream>>> (dst + at, m, t);
        }
      else
        {
          TableChunk<LARGE> *t = (TableChunk<LARGE> *) calloc (1, sizeof *t); /* 24 KB: off the stack */
          if (t == NULL)
            return cudaErrorMemoryAllocation;
          memcpy (t->b, table + at, m * sizeof (SiftCudaKvBlock));
          table_kernel<LARGE><<<1, 256, 0, stream>>> (dst + at, m, *t); /* parameters copied at the launch */
          free (t);
        }
      cudaError_t e = cudaGetLastError ();
      if (e != cudaSuccess)
        return e;
      at += m;
    }
  return cudaSuccess;
}

extern "C" int
sift_cuda_merge_launch (float *o1, int64_t o1_hs, int64_t o1_ts, float *lse1, const float *o2,
                        int64_t o2_hs, int64_t o2_ts, const float *lse2, int32_t heads,
                        int32_t tokens, int32_t head_dim, void *stream)
{
  if (heads * tokens == 0)
    return cudaSuccess;
  merge_kernel<<<heads * tokens, head_dim < 128 ? head_dim : 128, 0, (cudaStream_t) stream>>> (
      o1, o1_hs, o1_ts, lse1, o2, o2_hs, o2_ts, lse2, tokens, head_dim);
  return cudaGetLastError ();
}
