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

#include <type_traits>

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
 * only where a chunk straddles two blocks); a call without a table
 * (PAGED false) has no cursor at all, 26 registers fewer. Per chunk:
 * S = Q K^T and O += P V by mma.sync as in prefill.cu (a 16-row tile),
 * the online softmax between; the warps' states merge through shared
 * memory at the end, and with several splits the last block of a kv head
 * to finish merges that kv head's splits (merge_last): one launch. */
constexpr int DK = 16; /* keys per chunk */

template <int D> __host__ __device__ constexpr int dstage_halves () { return 2 * DK * ld<D> (); }
template <int D, int DW, int DS> __host__ __device__ constexpr size_t dsmem_bytes ()
{
  /* the warps' rings; the final merge reuses them ([DW][16] m and l, [DW][16][D] o) */
  return (size_t) DW * DS * dstage_halves<D> () * sizeof (uint16_t);
}

/* Issues the copies of the chunk of keys [k0, k0 + DK) into one stage (K
 * rows, then V rows, [DK][ld] halves each); keys at or past hi are zeros. */
template <int D, bool PAGED>
__device__ __forceinline__ uint32_t
load_chunk (const SiftCudaAttnCall &c, AheadCursor &cur, int kvh, int k0, int hi, uint16_t *stage, int lane)
{
  constexpr int CPR = D / 8;       /* 16-byte pieces per row */
  constexpr int RPI = 32 / CPR;    /* rows per warp-wide load */
  const int col = lane % CPR;
  if (PAGED)
    cur.advance (c, k0);
  /* Warp-uniform: the whole chunk lies in the cursor's block (the usual
   * case; always without a table), so one base pointer serves every row. */
  const bool one = !PAGED || min (k0 + DK, hi) <= cur.cur.start + cur.cur.n;
  uint32_t valid = 0; /* bit r: key k0 + r exists for this kv head (masked calls) */
  for (int j = 0; j < DK / RPI; j++)
    {
      const int row = j * RPI + lane / CPR;
      const int key = k0 + row;
      const SiftCudaKvBlock &b0 = PAGED ? cur.cur : c.one;
      const char *ks = (const char *) b0.k, *vs = (const char *) b0.v; /* read 0 bytes */
      int n = 0;
      if (key < hi)
        {
          SiftCudaKvBlock b = b0;
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

/* The splits of a kv head's rows merged by the block that finishes that
 * kv head's last split (a counter per kv head, reset to 0 by that block
 * for the next call): no second launch. Thread e takes 4 columns of a row
 * at a time; partials are read past L1 (written by other SMs). */
template <int D, int DW>
__device__ __forceinline__ void
merge_last (const SiftCudaAttnCall &c, int kvh, int rows, int group)
{
  __shared__ bool last;
  __threadfence (); /* this block's partial is visible before the count */
  __syncthreads ();
  if (threadIdx.x == 0)
    {
      const unsigned done = atomicAdd (&c.counters[kvh], 1u);
      last = done == (unsigned) c.n_splits - 1;
    }
  __syncthreads ();
  if (!last)
    return;
  __threadfence ();
  const int64_t per_split = (int64_t) c.q_heads * c.n_q;
  for (int e = threadIdx.x; e < rows * (D / 4); e += DW * 32)
    {
      const int r = e / (D / 4), d = (e % (D / 4)) * 4;
      const int h = kvh * group + r % group, i = r / group;
      const int64_t row = (int64_t) h * c.n_q + i;
      float mm = -CUDART_INF_F;
#pragma unroll 8
      for (int s = 0; s < c.n_splits; s++)
        mm = fmaxf (mm, __ldcg (c.part_l + s * per_split + row));
      const float base = mm == -CUDART_INF_F ? 0.0f : mm;
      float sum = 0.0f;
      float4 acc = make_float4 (0.0f, 0.0f, 0.0f, 0.0f);
      const float4 *p = reinterpret_cast<const float4 *> (c.part_o + row * D + d);
      const int64_t step = per_split * D / 4;
#pragma unroll 8
      for (int s = 0; s < c.n_splits; s++)
        {
          const float w = __expf (__ldcg (c.part_l + s * per_split + row) - base);
          const float4 x = __ldcg (p + s * step);
          sum += w;
          acc.x += w * x.x, acc.y += w * x.y, acc.z += w * x.z, acc.w += w * x.w;
        }
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      float *o = c.out + h * c.out_hs + i * c.out_ts + d;
      o[0] = acc.x * inv, o[1] = acc.y * inv, o[2] = acc.z * inv, o[3] = acc.w * inv;
      if (d == 0)
        c.lse[row] = sum > 0.0f ? base + logf (sum) : -CUDART_INF_F;
    }
  if (threadIdx.x == 0)
    c.counters[kvh] = 0; /* every block of this kv head has counted */
}

template <int D, bool BF16, int DW, int DS, int MINB, bool PAGED>
__global__ void __launch_bounds__ (DW * 32, MINB)
decode_kernel (SiftCudaAttnCall c)
{
  constexpr int DT = D / 8;  /* output fragments */
  constexpr int KS = D / 16; /* k-steps of Q K^T */
  constexpr int NT = DK / 8; /* score fragments of a chunk */
  static_assert (dsmem_bytes<D, DW, DS> () >= (2 * DW * 16 + DW * 16 * D) * sizeof (float), "merge space");

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
  if (PAGED)
    {
      cur.seek_warp (c, lo, lane);
      cur.fetch_next (c);
    }
  /* Prologue: DS - 1 chunks in flight before the first is used. */
  for (int s = 0; s < DS - 1; s++)
    {
      if (s < mine)
        {
          const uint32_t v = load_chunk<D, PAGED> (c, cur, kvh, lo + (s * DW + warp) * DK, hi,
                                                    ring + s * dstage_halves<D> (), lane);
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
          const uint32_t v = load_chunk<D, PAGED> (c, cur, kvh, lo + (ahead * DW + warp) * DK, hi,
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
          float s[NT][4];
          scores<D, NT, BF16> (ks_, lane, qf, s);
          if (k0 + DK > lim_min)
            for (int n = 0; n < NT; n++)
              for (int x = 0; x < 4; x++)
                if (k0 + n * 8 + 2 * t + (x & 1) >= rlim[x >> 1])
                  s[n][x] = -CUDART_INF_F;
          if (c.masked) /* keys of blocks this kv head does not attend */
            {
              const uint32_t v = valid[warp][it % DS];
              for (int n = 0; n < NT; n++)
                for (int x = 0; x < 4; x++)
                  if (!((v >> (n * 8 + 2 * t + (x & 1))) & 1))
                    s[n][x] = -CUDART_INF_F;
            }
          softmax_step<NT, DT> (s, m, l, o);
          accumulate_pv<D, NT, BF16> (s, vs_, lane, o);
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
  if (c.n_splits > 1 && c.counters != NULL)
    merge_last<D, DW> (c, kvh, rows, group);
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

/* One decode kernel shape: its shared-memory limit set once, its blocks
 * per SM, its launch. */
template <int D, bool BF16, int DW, int DS, int MINB, bool PAGED> struct Decode {
  static cudaError_t
  configure ()
  {
    static bool configured = false; /* benign race: the attribute is idempotent */
    if (configured)
      return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute (decode_kernel<D, BF16, DW, DS, MINB, PAGED>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int) dsmem_bytes<D, DW, DS> ());
    configured = e == cudaSuccess;
    return e;
  }

  static int
  resident ()
  {
    static int n = 0; /* queried once */
    if (n == 0 && configure () == cudaSuccess)
      n = blocks_per_sm (decode_kernel<D, BF16, DW, DS, MINB, PAGED>, DW * 32, dsmem_bytes<D, DW, DS> ());
    return n > 0 ? n : 1;
  }

  static cudaError_t
  launch (const SiftCudaAttnCall &c, cudaStream_t stream)
  {
    cudaError_t e = configure ();
    if (e != cudaSuccess)
      return e;
    decode_kernel<D, BF16, DW, DS, MINB, PAGED>
        <<<dim3 (c.kv_heads, c.n_splits), DW * 32, dsmem_bytes<D, DW, DS> (), stream>>> (c);
    return cudaGetLastError ();
  }
};

/* The decode kernel's shape for head_dim D, the K/V type and a call with
 * or without a block table: warps a block, ring stages a warp, blocks an
 * SM asked of the register allocator. Chosen by a sweep on an H200 for
 * head_dim 128, bf16 (docs/benchmarks.md, "GPU attention", 2026-11-28
 * 11:19-11:42): what limits the kernel is warps per SM, not bytes in
 * flight per warp, so two stages a warp (one chunk copied while one is
 * used) and 12 warps an SM: 2 blocks of 6 without a table (142
 * registers), 3 blocks of 4 with one (registers capped at 168: no
 * spills). Other shapes keep the earlier 4 warps, 3 stages, 2 blocks an
 * SM (not swept). */
template <int D, bool BF16, bool PAGED>
using DecodeFor = std::conditional_t<D == 128 && BF16,
                                     std::conditional_t<PAGED, Decode<D, BF16, 4, 2, 3, true>, Decode<D, BF16, 6, 2, 2, false>>,
                                     Decode<D, BF16, 4, 3, 1, PAGED>>;

template <int D, bool BF16>
int
decode_resident (bool paged)
{
  return paged ? DecodeFor<D, BF16, true>::resident () : DecodeFor<D, BF16, false>::resident ();
}

template <int D, bool BF16>
cudaError_t
launch_rows (const SiftCudaAttnCall &c, cudaStream_t stream)
{
  if (sift_cuda_attn_rows_per_block (c.q_heads / c.kv_heads * c.n_q) == 16)
    return c.n_blocks > 1 ? DecodeFor<D, BF16, true>::launch (c, stream) : DecodeFor<D, BF16, false>::launch (c, stream);
  return (cudaError_t) sift_cuda_prefill_launch (&c, stream);
}

} // namespace

extern "C" int
sift_cuda_attn_rows_per_block (int32_t rows)
{
  return rows <= 16 ? 16 : SIFT_CUDA_PREFILL_ROWS;
}

extern "C" int
sift_cuda_attn_blocks_per_sm (int32_t head_dim, int32_t bf16, int32_t rows, int32_t paged)
{
  if (sift_cuda_attn_rows_per_block (rows) != 16)
    return sift_cuda_prefill_blocks_per_sm (head_dim, bf16);
  if (head_dim == 64)
    return bf16 ? decode_resident<64, true> (paged) : decode_resident<64, false> (paged);
  return bf16 ? decode_resident<128, true> (paged) : decode_resident<128, false> (paged);
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
  const bool fused = c->counters != NULL && sift_cuda_attn_rows_per_block (c->q_heads / c->kv_heads * c->n_q) == 16;
  if (e != cudaSuccess || c->n_splits <= 1 || fused) /* the decode kernel merged its splits */
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
