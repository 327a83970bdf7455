/* GPU attention: tiled online softmax on tensor cores (mma.sync m16n8k16,
 * f16 or bf16 operands, f32 accumulators). Here: the decode kernels (up
 * to 8 rows per kv head by K Q^T, up to 16 by a 16-row tile), split over
 * the key axis and merged by LSE
 * (flash-decoding), the merges and the launch dispatch; the prefill kernel
 * is in prefill.cu.
 * docs/kernels.md ("GPU kernels") describes the tiling; cuda.c checks the
 * arguments before anything here runs. */
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "kernels.h"
#include "mma.cuh"
#include "tma.h"
#include "wgmma.cuh"

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

/* The keys [lo, hi) of a split of a block of `rows` rows (`group` query
 * heads a token), causal calls stopped at the last row's last key. */
__device__ __forceinline__ void
split_range (const SiftCudaAttnCall &c, int split, int rows, int group, int &lo, int &hi)
{
  lo = split * c.split_len;
  hi = min (c.n_kv, lo + c.split_len);
  if (c.causal)
    {
      int64_t lim = c.q_offset + (rows - 1) / group + 1;
      hi = (int) max ((int64_t) lo, min ((int64_t) hi, lim));
    }
}

/* A thread's two rows (r0 and r0 + step of `rows`): query head, token and
 * the end of its visible keys within [lo, hi). */
__device__ __forceinline__ void
row_setup (const SiftCudaAttnCall &c, int r0, int step, int rows, int group, int kvh, int lo, int hi, int rh[2],
           int ri[2], int rlim[2])
{
  for (int x = 0; x < 2; x++)
    {
      int r = r0 + step * x;
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

/* Decode (9 to 16 query rows of a kv head: a few tokens of a GQA group;
 * up to 8 take decode_kq_kernel below): a kernel built for streaming K/V at the memory's
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

/* A block's DW warp states (R rows each: max m and sum l in base 2, the
 * unnormalised output) merged by max and rescale into the split's result. */
template <int D, int DW, int R, int NTH = DW * 32>
__device__ __forceinline__ void
merge_warps (const Dest &dst, const float *ms, int kvh, int rows, int group)
{
  const float *ls = ms + DW * R, *os = ls + DW * R;
  for (int e = threadIdx.x; e < rows * D; e += NTH)
    {
      const int r = e / D, d = e % D;
      float mm = -CUDART_INF_F;
      for (int w = 0; w < DW; w++)
        mm = fmaxf (mm, ms[w * R + r]);
      float base = mm == -CUDART_INF_F ? 0.0f : mm;
      float sum = 0.0f, acc = 0.0f;
      for (int w = 0; w < DW; w++)
        {
          float f = exp2f (ms[w * R + r] - base);
          sum += f * ls[w * R + r];
          acc += f * os[(w * R + r) * D + d];
        }
      const int h = kvh * group + r % group, i = r / group;
      dst.out[h * dst.out_hs + i * dst.out_ts + d] = sum > 0.0f ? acc / sum : 0.0f;
      if (d == 0)
        dst.lse[h * dst.lse_hs + i] = sum > 0.0f ? (base + log2f (sum)) * CUDART_LN2_F : -CUDART_INF_F;
    }
}

/* The splits of a kv head's rows merged by the block that finishes that
 * kv head's last split (a counter per kv head, reset to 0 by that block
 * for the next call): no second launch. Thread e takes 4 columns of a row
 * at a time; partials are read past L1 (written by other SMs). */
template <int D, int DW, int NTH = DW * 32>
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
  for (int e = threadIdx.x; e < rows * (D / 4); e += NTH)
    {
      const int r = e / (D / 4), d = (e % (D / 4)) * 4;
      const int h = kvh * group + r % group, i = r / group;
      const int64_t row = (int64_t) h * c.n_q + i;
      /* One pass, the running max rescaling the sums: every split's loads
       * are independent of the arithmetic, so an unrolled stretch has all
       * of them in flight at once (one L2 round trip, not one for the
       * maxima and another for the partials). */
      float mm = -CUDART_INF_F, sum = 0.0f;
      float4 acc = make_float4 (0.0f, 0.0f, 0.0f, 0.0f);
      const float4 *p = reinterpret_cast<const float4 *> (c.part_o + row * D + d);
      const int64_t step = per_split * D / 4;
#pragma unroll 16
      for (int s = 0; s < c.n_splits; s++)
        {
          const float ls = __ldcg (c.part_l + s * per_split + row);
          const float4 x = __ldcg (p + s * step);
          /* b is 0 while every split so far is empty: exp (-inf - b) stays 0, not NaN */
          const float nm = fmaxf (mm, ls), b = nm == -CUDART_INF_F ? 0.0f : nm;
          const float a = __expf (mm - b), w = __expf (ls - b);
          sum = sum * a + w;
          acc.x = acc.x * a + w * x.x, acc.y = acc.y * a + w * x.y;
          acc.z = acc.z * a + w * x.z, acc.w = acc.w * a + w * x.w;
          mm = nm;
        }
      const float base = mm == -CUDART_INF_F ? 0.0f : mm;
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

  int lo, hi;
  split_range (c, split, rows, group, lo, hi);
  int rh[2], ri[2], rlim[2]; /* rows g and g + 8 */
  row_setup (c, g, 8, rows, group, kvh, lo, hi, rh, ri, rlim);
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
  merge_warps<D, DW, 16> (dst, ms, kvh, rows, group);
  if (c.n_splits > 1 && c.counters != NULL)
    merge_last<D, DW> (c, kvh, rows, group);
}

/* Hopper's bulk copies (sm_90; the compute_80 PTX build falls back to
 * cp.async): one thread copies a whole row global -> shared through the
 * TMA unit, its completion counted in bytes on an mbarrier. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kBulk = false;
#else
constexpr bool kBulk = true;
#endif

[[maybe_unused]] __device__ __forceinline__ void
mbar_init (uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile ("mbarrier.init.shared::cta.b64 [%0], 1;\n\t"
                "fence.mbarrier_init.release.cluster;" ::"r"(smem_addr (bar))
                : "memory");
#endif
}

/* The one arrival of the stage's phase, expecting `bytes` of copies. */
[[maybe_unused]] __device__ __forceinline__ void
mbar_expect (uint64_t *bar, unsigned bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile ("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr (bar)), "r"(bytes)
                : "memory");
#endif
}

[[maybe_unused]] __device__ __forceinline__ void
mbar_wait (uint64_t *bar, unsigned parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done;
  do
    asm volatile ("{\n\t.reg .pred p;\n\t"
                  "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                  "selp.u32 %0, 1, 0, p;\n\t}"
                  : "=r"(done)
                  : "r"(smem_addr (bar)), "r"(parity)
                  : "memory");
  while (!done);
#endif
}

/* Orders this thread's earlier shared-memory accesses (generic proxy)
 * before its later bulk copies (async proxy) into the same stage. */
[[maybe_unused]] __device__ __forceinline__ void
fence_proxy_async ()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile ("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

[[maybe_unused]] __device__ __forceinline__ void
bulk_copy (uint16_t *dst, const void *src, unsigned bytes, uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile ("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                    smem_addr (dst)),
                "l"(src), "r"(bytes), "r"(smem_addr (bar))
                : "memory");
#endif
}

/* The 8x8 16-bit matrix of a fragment transposed across the warp: thread
 * (g, t) holds row g, columns 2t and 2t + 1, before and after. */
__device__ __forceinline__ uint32_t
movmatrix_trans (uint32_t x)
{
  uint32_t y;
  asm volatile ("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

/* Issues the copies of keys [k0, k0 + DK) into one stage by bulk copies:
 * lane r < 16 copies K row r, lane 16 + r V row r (one row each); a V row
 * with no key (past hi, or masked) is zeroed instead, so that 0 x V never
 * meets garbage. Returns bit r: key k0 + r exists for this kv head. The
 * stage's mbarrier expects the bytes copied. */
template <int D, bool PAGED>
__device__ __forceinline__ uint32_t
issue_bulk (const SiftCudaAttnCall &c, AheadCursor &cur, int kvh, int k0, int hi, uint16_t *stage, uint64_t *bar,
            int lane)
{
  if (PAGED)
    cur.advance (c, k0);
  static_assert (DK == 16, "a row a lane");
  const bool one = !PAGED || min (k0 + DK, hi) <= cur.cur.start + cur.cur.n;
  const bool isv = lane >= 16;
  const int row = lane & 15, key = k0 + row;
  fence_proxy_async (); /* this stage's earlier reads and zero rows come first */
  const char *src = NULL;
  if (key < hi)
    {
      SiftCudaKvBlock b = PAGED ? cur.cur : c.one;
      if (!one)
        {
          Cursor rc = cur; /* this row's block (rare: no read ahead) */
          rc.advance (c, key);
          b = rc.cur;
        }
      if (!c.masked || ((b.heads >> kvh) & 1))
        {
          const int64_t t = key - b.start;
          src = isv ? (const char *) b.v + (kvh * b.v_hs + t * b.v_ts) * 2
                    : (const char *) b.k + (kvh * b.k_hs + t * b.k_ts) * 2;
        }
    }
  uint16_t *dst = stage + (isv ? DK + row : row) * ld<D> ();
  const uint32_t bits = __ballot_sync (0xffffffffu, src != NULL);
  if (lane == 0)
    mbar_expect (bar, __popc (bits) * D * 2); /* may follow some copies' completion: tx-count goes negative */
  if (src != NULL)
    bulk_copy (dst, src, D * 2, bar);
  else if (isv)
    for (int x = 0; x < D / 8; x++)
      reinterpret_cast<uint4 *> (dst)[x] = make_uint4 (0, 0, 0, 0);
  return bits & 0xffffu;
}

/* S^T = K Q^T of 16 keys: K rows are the A operand (16 keys x 16 columns
 * per k-step, one ldmatrix.x4 each), Q^T the B operand (8 rows of the
 * group); thread (g, t) gets keys g and g + 8 of rows 2t and 2t + 1. Two
 * accumulators halve the dependent chain. */
template <int D, bool BF16, typename At>
__device__ __forceinline__ void
scores_kq_at (At at, const uint32_t qf[D / 16][2], float s[4])
{
  float s0[4] = { 0.0f, 0.0f, 0.0f, 0.0f }, s1[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
  for (int ks = 0; ks < D / 16; ks += 2)
    {
      uint32_t a[4];
      ldmatrix_x4 (a, at (2 * ks));
      mma<BF16> (s0, a, qf[ks][0], qf[ks][1]);
      ldmatrix_x4 (a, at (2 * ks + 2));
      mma<BF16> (s1, a, qf[ks + 1][0], qf[ks + 1][1]);
    }
  for (int x = 0; x < 4; x++)
    s[x] = s0[x] + s1[x];
}
/* at (p): the shared address of 16-byte piece p + lane / 16 of this
 * lane's K row (key lane % 16 of the chunk); here the padded rows. */
template <int D, bool BF16>
__device__ __forceinline__ void
scores_kq (const uint16_t *k, int lane, const uint32_t qf[D / 16][2], float s[4])
{
  const uint32_t krow = smem_addr (k + (lane & 15) * ld<D> () + (lane >> 4) * 8);
  scores_kq_at<D, BF16> ([&] (int p) { return krow + p * 16; }, qf, s);
}

/* The online softmax of "Online softmax" (docs/kernels.md) on S^T: a row
 * is a column here (rows 2t and 2t + 1 of thread (g, t)), its max over
 * the 8 lanes of a column; l stays a per-lane partial sum until the end. */
template <int D>
__device__ __forceinline__ void
softmax_kq (float s[4], float m[2], float l[2], float o[D / 16][4])
{
#pragma unroll
  for (int e = 0; e < 2; e++)
    {
      float mx = fmaxf (s[e], s[2 + e]);
      mx = fmaxf (mx, __shfl_xor_sync (0xffffffffu, mx, 4));
      mx = fmaxf (mx, __shfl_xor_sync (0xffffffffu, mx, 8));
      mx = fmaxf (mx, __shfl_xor_sync (0xffffffffu, mx, 16));
      const float m_new = fmaxf (m[e], mx);
      const float base = m_new == -CUDART_INF_F ? 0.0f : m_new;
      const float alpha = fast_exp2 (m[e] - base);
      s[e] = fast_exp2 (s[e] - base);
      s[2 + e] = fast_exp2 (s[2 + e] - base);
      l[e] = l[e] * alpha + s[e] + s[2 + e];
      m[e] = m_new;
#pragma unroll
      for (int j = 0; j < D / 16; j++)
        {
          o[j][e] *= alpha;
          o[j][2 + e] *= alpha;
        }
    }
}

/* O^T += V^T P^T of 16 keys: V^T's A operands (16 columns of V by the
 * 16 keys) by ldmatrix.trans, P^T's B operands from the score fragments
 * rounded to the K/V type and transposed by movmatrix (keys 0..7, then
 * 8..15): thread (g, t) gets keys 2t, 2t + 1 of row g. */
template <int D, bool BF16, typename At>
__device__ __forceinline__ void
accumulate_kq_at (const float s[4], At at, float o[D / 16][4])
{
  const uint32_t b0 = movmatrix_trans (pack2<BF16> (s[0], s[1]));
  const uint32_t b1 = movmatrix_trans (pack2<BF16> (s[2], s[3]));
  for (int j = 0; j < D / 16; j++)
    {
      uint32_t a[4];
      ldmatrix_x4_trans (a, at (2 * j));
      mma<BF16> (o[j], a, b0, b1);
    }
}
/* at (p): the shared address of piece p + (lane / 8) % 2 of V row
 * lane % 8 + 8 (lane / 16) of the chunk; here the padded rows. */
template <int D, bool BF16>
__device__ __forceinline__ void
accumulate_kq (const float s[4], const uint16_t *v, int lane, float o[D / 16][4])
{
  const uint32_t vrow = smem_addr (v + ((lane & 7) + ((lane >> 4) << 3)) * ld<D> () + ((lane >> 3) & 1) * 8);
  accumulate_kq_at<D, BF16> (s, [&] (int p) { return vrow + p * 16; }, o);
}

/* Decode of up to 8 rows per kv head (one token of a GQA group of up to
 * 8) with the group on the 8-wide side of the tensor-core tile: S^T =
 * K Q^T and O^T = V^T P^T, keys on the 16-row side, so Q's fragments and
 * the output accumulators are half those of decode_kernel's 16-row tile
 * (98-100 registers against 142, 131 with a table against 168). Otherwise
 * the same streaming design: each of DW warps takes every DW-th chunk of
 * DK keys of the split through its own ring of DS stages, filled by bulk
 * copies on sm_90 (one row a lane, completion counted on a stage's
 * mbarrier; no registers or issue slots held by bytes in flight), by
 * cp.async elsewhere. */
template <int D, int DW, int DS> __host__ __device__ constexpr size_t kq_smem_bytes ()
{
  return (size_t) DW * DS * dstage_halves<D> () * sizeof (uint16_t);
}

/* Q^T's values of thread (g, t) of a K Q^T decode block: row g
 * (padding rows zero), columns 2t, 2t + 1 and 2t + 8, 2t + 9 of each
 * k-step. */
template <int KS>
__device__ __forceinline__ void
q_values (const SiftCudaAttnCall &c, int kvh, int group, int rows, int g, int t, float qv[KS][4])
{
  const float *qp = c.q + (kvh * group + g % group) * c.q_hs + (g / group) * c.q_ts;
  for (int ks = 0; ks < KS; ks++)
    for (int x = 0; x < 4; x++)
      qv[ks][x] = g < rows ? qp[ks * 16 + 2 * t + 8 * (x >> 1) + (x & 1)] : 0.0f;
}

/* Q^T as B operands, times scale * log2(e). */
template <int KS, bool BF16>
__device__ __forceinline__ void
q_fragments (const SiftCudaAttnCall &c, const float qv[KS][4], uint32_t qf[KS][2])
{
  for (int ks = 0; ks < KS; ks++)
    for (int x = 0; x < 2; x++)
      qf[ks][x] = pack2<BF16> (qv[ks][2 * x] * c.qscale, qv[ks][2 * x + 1] * c.qscale);
}

/* The end of a K Q^T decode block: each consumer warp's state (rows 2t,
 * 2t + 1 of thread (g, t)) to shared memory ms (the ring, free once every
 * stage is read), the warps merged into the split's result, and with
 * several splits the kv head's splits merged by its last block. Every one
 * of the block's NTH threads calls it (the barriers); `mine` is false for
 * a warp that holds no state (the TMA kernel's producer). */
template <int D, int DW, int NTH = DW * 32>
__device__ __forceinline__ void
finish_kq (const SiftCudaAttnCall &c, float *ms, int kvh, int split, int rows, int group, bool mine, float m[2],
           float l[2], const float o[D / 16][4])
{
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  if (mine) /* warp-uniform */
    for (int e = 0; e < 2; e++)
      {
        l[e] += __shfl_xor_sync (0xffffffffu, l[e], 4);
        l[e] += __shfl_xor_sync (0xffffffffu, l[e], 8);
        l[e] += __shfl_xor_sync (0xffffffffu, l[e], 16);
      }
  const Dest dst = dest<D> (c, split);
  __syncthreads ();
  float *ls = ms + DW * 8;  /* [DW][8]; ms [DW][8] */
  float *os = ls + DW * 8;  /* [DW][8][D] */
  if (mine)
    for (int e = 0; e < 2; e++)
      {
        const int r = warp * 8 + 2 * t + e;
        if (g == 0)
          {
            ms[r] = m[e];
            ls[r] = l[e];
          }
        for (int j = 0; j < D / 16; j++)
          {
            os[r * D + 16 * j + g] = o[j][e];
            os[r * D + 16 * j + g + 8] = o[j][2 + e];
          }
      }
  __syncthreads ();
  merge_warps<D, DW, 8, NTH> (dst, ms, kvh, rows, group);
  if (c.n_splits > 1 && c.counters != NULL)
    merge_last<D, DW, NTH> (c, kvh, rows, group);
}

template <int D, bool BF16, int DW, int DS, int MINB, bool PAGED>
__global__ void __launch_bounds__ (DW * 32, MINB)
decode_kq_kernel (SiftCudaAttnCall c)
{
  constexpr int KS = D / 16;
  constexpr int STAGE = dstage_halves<D> ();
  constexpr bool bulk = kBulk;
  static_assert (kq_smem_bytes<D, DW, DS> () >= (2 * DW * 8 + DW * 8 * D) * sizeof (float), "merge space");

  extern __shared__ __align__ (16) uint16_t smem[];
  __shared__ uint32_t valid[DW][DS];
  __shared__ __align__ (8) uint64_t bars[DW][DS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int group = c.q_heads / c.kv_heads;
  const int rows = group * c.n_q; /* <= 8 */
  const int kvh = blockIdx.x, split = blockIdx.y;

  /* Q^T's values, read before the first copies are issued: behind them
   * these reads waited for the launch's whole first wave of copies, and no
   * warp could start on its first chunk meanwhile. */
  float qv[KS][4];
  q_values<KS> (c, kvh, group, rows, g, t, qv);

  int lo, hi;
  split_range (c, split, rows, group, lo, hi);
  int rh[2], ri[2], rlim[2]; /* rows 2t and 2t + 1 */
  row_setup (c, 2 * t, 1, rows, group, kvh, lo, hi, rh, ri, rlim);
  const int lim_max = max (rlim[0], rlim[1]), lim_min = min (rlim[0], rlim[1]);

  uint16_t *ring = smem + warp * DS * STAGE;
  uint64_t *bar = bars[warp];
  if (bulk)
    {
      if (lane < DS)
        mbar_init (&bar[lane]);
      __syncwarp ();
    }
  const int n_chunks = (hi - lo + DK - 1) / DK;
  const int mine = n_chunks > warp ? (n_chunks - warp + DW - 1) / DW : 0; /* chunks warp, warp + DW, ... */
  AheadCursor cur;
  if (PAGED)
    {
      cur.seek_warp (c, lo, lane);
      cur.fetch_next (c);
    }
  auto issue = [&] (int n) {
    const int k0 = lo + (n * DW + warp) * DK;
    uint16_t *stage = ring + (n % DS) * STAGE;
    uint32_t v;
    if constexpr (bulk)
      v = issue_bulk<D, PAGED> (c, cur, kvh, k0, hi, stage, &bar[n % DS], lane);
    else
      v = load_chunk<D, PAGED> (c, cur, kvh, k0, hi, stage, lane);
    if (lane == 0)
      valid[warp][n % DS] = v;
  };
  for (int s = 0; s < DS - 1; s++)
    {
      if (s < mine)
        issue (s);
      if (!bulk)
        cp_async_commit ();
    }

  uint32_t qf[KS][2];
  q_fragments<KS, BF16> (c, qv, qf);

  float m[2] = { -CUDART_INF_F, -CUDART_INF_F }, l[2] = { 0.0f, 0.0f };
  float o[KS][4];
  for (int j = 0; j < KS; j++)
    o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  for (int it = 0; it < mine; it++)
    {
      if (it + DS - 1 < mine)
        issue (it + DS - 1);
      if constexpr (bulk)
        mbar_wait (&bar[it % DS], (it / DS) & 1);
      else
        {
          cp_async_commit ();
          cp_async_wait<DS - 1> ();
        }
      __syncwarp (); /* and every lane's copies (cp.async) are visible */
      const int k0 = lo + (it * DW + warp) * DK;
      const uint16_t *ks_ = ring + (it % DS) * STAGE;
      const uint16_t *vs_ = ks_ + DK * ld<D> ();
      if (__any_sync (0xffffffffu, k0 < lim_max)) /* warp-uniform: mma.sync needs every lane */
        {
          /* thread (g, t): keys k0 + g (s[0], s[1]) and k0 + g + 8 (s[2], s[3]) of rows 2t, 2t + 1 */
          float s[4];
          scores_kq<D, BF16> (ks_, lane, qf, s);
          if (k0 + DK > lim_min)
            for (int x = 0; x < 4; x++)
              if (k0 + g + 8 * (x >> 1) >= rlim[x & 1])
                s[x] = -CUDART_INF_F;
          if (c.masked) /* keys of blocks this kv head does not attend */
            {
              const uint32_t v = valid[warp][it % DS];
              for (int x = 0; x < 4; x++)
                if (!((v >> (g + 8 * (x >> 1))) & 1))
                  s[x] = -CUDART_INF_F;
            }
          softmax_kq<D> (s, m, l, o);
          accumulate_kq<D, BF16> (s, vs_, lane, o);
        }
      __syncwarp (); /* every lane is done with the stage before it is refilled */
    }
  if (!bulk)
    cp_async_wait<0> ();

  finish_kq<D, DW> (c, reinterpret_cast<float *> (smem), kvh, split, rows, group, true, m, l, o);
}

/* Decode of up to 8 rows per kv head over contiguous K/V on sm_90 with
 * block-wide tiles (docs/kernels.md, "TMA decode"). A producer warp
 * copies tiles of TK = 16 DW keys by the TMA unit from tensor maps, K and
 * V each as two 64-column panels in the 128-byte swizzle (four copy
 * instructions a tile where decode_kq_kernel issues one a row), into S
 * stages, each counted on its "full" mbarrier; consumer warp w takes keys
 * 16 w .. 16 w + 15 of every tile with decode_kq_kernel's K Q^T step
 * (ldmatrix addresses swizzled as the copies wrote them) and gives the
 * stage back on its "empty" mbarrier (DW arrivals). The warps' states
 * and the splits merge as in decode_kq_kernel (finish_kq). Keys past the
 * split's end are masked; past the tensor's end the copies read zeros. */
template <int DW, int S> __host__ __device__ constexpr size_t tma_decode_smem ()
{
  return 1024 + (size_t) S * 16 * DW * 4 * 128; /* 1024: the panels' alignment; a stage: K and V, 2 panels each */
}

/* Byte offset of 16-byte piece `piece` (0..15: columns 8 piece ..) of key
 * row r in a tile of TK rows stored as two swizzled 64-column panels. */
template <int TK>
__device__ __forceinline__ uint32_t
swz (int r, int piece)
{
  return (uint32_t) ((piece >> 3) * TK * 128) + sift_wg::swz (r, piece & 7);
}

template <bool BF16, int DW, int S>
__global__ void __launch_bounds__ ((DW + 1) * 32, 1)
decode_tma_kernel (const __grid_constant__ SiftCudaAttnCall c, const __grid_constant__ CUtensorMap tk,
                   const __grid_constant__ CUtensorMap tv)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int D = 128, KS = D / 16, TK = 16 * DW, NTH = (DW + 1) * 32;
  constexpr uint32_t HALF = TK * 2 * 128, STAGE = 2 * HALF; /* K (or V) of a tile; a stage */
  static_assert (S * STAGE >= (2 * DW * 8 + DW * 8 * D) * sizeof (float), "merge space");
  extern __shared__ __align__ (1024) uint8_t tsmem[];
  __shared__ __align__ (8) uint64_t bars[2][S];
  const uint32_t raw = smem_addr (tsmem), ring = (raw + 1023u) & ~1023u;
  const uint32_t full = smem_addr (bars[0]), empty = smem_addr (bars[1]); /* stage s's: + 8 s */
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int group = c.q_heads / c.kv_heads;
  const int rows = group * c.n_q; /* <= 8 */
  const int kvh = blockIdx.x, split = blockIdx.y;
  int lo, hi;
  split_range (c, split, rows, group, lo, hi);
  const int n_tiles = (hi - lo + TK - 1) / TK;

  if (threadIdx.x == 0)
    {
      for (int s = 0; s < S; s++)
        {
          sift_wg::mbar_init (full + 8 * s, 1);
          sift_wg::mbar_init (empty + 8 * s, DW);
        }
      sift_wg::mbar_init_fence ();
    }
  __syncthreads ();

  float m[2] = { -CUDART_INF_F, -CUDART_INF_F }, l[2] = { 0.0f, 0.0f };
  float o[KS][4];
  for (int j = 0; j < KS; j++)
    o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  if (warp == DW)
    {
      /* The producer: tile j to stage j % S once use j / S - 1 of the
       * stage is given back (the phase of parity (j / S - 1) % 2). */
      if (lane == 0)
        for (int j = 0; j < n_tiles; j++)
          {
            const int s = j % S, y = lo + j * TK - c.one.start;
            const uint32_t f = full + 8 * s, at = ring + s * STAGE;
            if (j >= S)
              sift_wg::mbar_wait (empty + 8 * s, (uint32_t) ((j / S) & 1) ^ 1u);
            sift_wg::mbar_expect (f, STAGE);
            sift_wg::tma_load (at, &tk, 0, y, kvh, f);
            sift_wg::tma_load (at + TK * 128, &tk, 64, y, kvh, f);
            sift_wg::tma_load (at + HALF, &tv, 0, y, kvh, f);
            sift_wg::tma_load (at + HALF + TK * 128, &tv, 64, y, kvh, f);
          }
      __syncwarp ();
    }
  else
    {
      float qv[KS][4];
      q_values<KS> (c, kvh, group, rows, g, t, qv);
      int rh[2], ri[2], rlim[2]; /* rows 2t and 2t + 1 */
      row_setup (c, 2 * t, 1, rows, group, kvh, lo, hi, rh, ri, rlim);
      const int lim_max = max (rlim[0], rlim[1]), lim_min = min (rlim[0], rlim[1]);
      uint32_t qf[KS][2];
      q_fragments<KS, BF16> (c, qv, qf);

      /* this lane's ldmatrix rows: K (non-transposed) and V (transposed), as in scores_kq and accumulate_kq */
      const int kr = 16 * warp + (lane & 15), kp = lane >> 4;
      const int vr = 16 * warp + (lane & 7) + ((lane >> 4) << 3), vp = (lane >> 3) & 1;
      for (int it = 0; it < n_tiles; it++)
        {
          const int s = it % S;
          sift_wg::mbar_wait (full + 8 * s, (uint32_t) (it / S) & 1u);
          const int k0 = lo + it * TK + 16 * warp;
          const uint32_t kt = ring + s * STAGE, vt = kt + HALF;
          if (__any_sync (0xffffffffu, k0 < lim_max)) /* warp-uniform: mma.sync needs every lane */
            {
              float sc[4];
              scores_kq_at<D, BF16> ([&] (int p) { return kt + swz<TK> (kr, p + kp); }, qf, sc);
              if (k0 + 16 > lim_min)
                for (int x = 0; x < 4; x++)
                  if (k0 + g + 8 * (x >> 1) >= rlim[x & 1])
                    sc[x] = -CUDART_INF_F;
              softmax_kq<D> (sc, m, l, o);
              accumulate_kq_at<D, BF16> (sc, [&] (int p) { return vt + swz<TK> (vr, p + vp); }, o);
            }
          __syncwarp (); /* every lane is done with the stage */
          if (lane == 0)
            sift_wg::mbar_arrive (empty + 8 * s);
        }
    }
  finish_kq<D, DW, NTH> (c, reinterpret_cast<float *> (tsmem + (ring - raw)), kvh, split, rows, group, warp < DW, m, l,
                         o);
#else
  __trap (); /* launched only where the sm_90 machine code runs (tma_decode_runs) */
#endif
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

/* One decode kernel instance: its shared-memory limit set once, its
 * blocks per SM, its launch (a block per kv head and split). */
template <auto KERNEL, int THREADS, size_t SMEM> struct Launcher {
  static cudaError_t configure () { return allow_smem<KERNEL, SMEM> (); }

  static int
  resident ()
  {
    static int n = 0; /* queried once */
    if (n == 0 && configure () == cudaSuccess)
      n = blocks_per_sm (KERNEL, THREADS, SMEM);
    return n > 0 ? n : 1;
  }

  static cudaError_t
  launch (const SiftCudaAttnCall &c, cudaStream_t stream)
  {
    cudaError_t e = configure ();
    if (e != cudaSuccess)
      return e;
    KERNEL<<<dim3 (c.kv_heads, c.n_splits), THREADS, SMEM, stream>>> (c);
    return cudaGetLastError ();
  }
};

template <int D, bool BF16, int DW, int DS, int MINB, bool PAGED>
using Decode = Launcher<decode_kernel<D, BF16, DW, DS, MINB, PAGED>, DW * 32, dsmem_bytes<D, DW, DS> ()>;
template <int D, bool BF16, int DW, int DS, int MINB, bool PAGED>
using DecodeKq = Launcher<decode_kq_kernel<D, BF16, DW, DS, MINB, PAGED>, DW * 32, kq_smem_bytes<D, DW, DS> ()>;

/* The decode kernels' shapes (warps a block, ring stages a warp, blocks
 * an SM asked of the register allocator) for head_dim D, the K/V type and
 * a call with or without a block table. Up to 8 rows (the K Q^T kernel):
 * without a table one block of 8 warps an SM, 2 stages each (139 KB:
 * A100s hold it too), 3-5% faster from 16K to 128K keys on an H200
 * than 2 blocks of 6 (docs/benchmarks.md, "K Q^T decode: where the time
 * goes"); through a table 2 blocks of 6 warps, 2 stages each, as chosen
 * by the earlier sweep ("GPU attention", 2026-11-28 13:47: 8 to 24
 * warps an SM, 1 to 3 stages and 32-key chunks within 3%; 131
 * registers, no cap needed).
 * 9 to 16 rows (decode_kernel, 16-row tile), head_dim 128, bf16: 12
 * warps an SM (sweep of 2026-11-28 11:19-11:42): 2 blocks of 6 without a
 * table (142 registers), 3 blocks of 4 with one (registers capped at 168:
 * no spills); other head dims and f16 keep 4 warps, 3 stages, 1 block. */
template <int D, bool BF16, bool PAGED>
using DecodeKqFor = std::conditional_t<PAGED, DecodeKq<D, BF16, 6, 2, 2, true>, DecodeKq<D, BF16, 8, 2, 1, false>>;
template <int D, bool BF16, bool PAGED>
using DecodeFor = std::conditional_t<D == 128 && BF16,
                                     std::conditional_t<PAGED, Decode<D, BF16, 4, 2, 3, true>, Decode<D, BF16, 6, 2, 2, false>>,
                                     Decode<D, BF16, 4, 3, 1, PAGED>>;

bool tma_decode_runs ();
template <bool BF16> int tma_decode_resident ();

template <int D, bool BF16>
int
decode_resident (int rows, bool paged)
{
  if (D == 128 && rows <= 8 && !paged && tma_decode_runs ())
    return tma_decode_resident<BF16> ();
  if (rows <= 8)
    return paged ? DecodeKqFor<D, BF16, true>::resident () : DecodeKqFor<D, BF16, false>::resident ();
  return paged ? DecodeFor<D, BF16, true>::resident () : DecodeFor<D, BF16, false>::resident ();
}

/* The TMA decode kernel's shape: 8 consumer warps (128-key tiles), 3
 * stages (193 KB: one block an SM). On an H200 (docs/benchmarks.md,
 * session 9, all with the L2 promotion on) it beat 2 stages, 4 warps
 * with 3, 4 or 6 stages, 2 warps with 4, more than one block an SM,
 * several waves of splits, tiles in a rotated or interleaved order and
 * whole-row boxes. */
constexpr int TMA_DW = 8, TMA_S = 3;

/* Whether contiguous decode of up to 8 rows at head_dim 128 takes
 * decode_tma_kernel: its sm_90 machine code runs on the current device
 * (compute capability 9.0, not JIT-compiled from the compute_80 PTX,
 * where it traps) and SIFT_CUDA_DECODE_TMA=0 (a hook for comparisons and
 * tests: decode_kq_kernel instead) is not set; asked once. */
bool
tma_decode_runs ()
{
  static int runs = -1; /* benign race: every caller finds the same */
  if (runs < 0)
    {
      const char *off = getenv ("SIFT_CUDA_DECODE_TMA");
      runs = (off == nullptr || strcmp (off, "0") != 0)
             && sift_tma::machine_code_runs (reinterpret_cast<const void *> (decode_tma_kernel<true, TMA_DW, TMA_S>));
    }
  return runs == 1;
}

template <bool BF16>
int
tma_decode_resident ()
{
  constexpr auto FN = decode_tma_kernel<BF16, TMA_DW, TMA_S>;
  constexpr size_t SMEM = tma_decode_smem<TMA_DW, TMA_S> ();
  return allow_smem<FN, SMEM> () == cudaSuccess ? blocks_per_sm (FN, (TMA_DW + 1) * 32, SMEM) : 1;
}

/* Launches decode_tma_kernel for a call it serves; cudaErrorNotSupported
 * where it does not (a table, masked blocks, or strides the tensor maps
 * cannot describe): the caller takes decode_kq_kernel. */
template <bool BF16>
cudaError_t
launch_tma_decode (const SiftCudaAttnCall &c, cudaStream_t stream)
{
  constexpr int TK = 16 * TMA_DW;
  CUtensorMap tk, tv;
  /* Without L2 sector promotion: each key is read once, and the 256-byte
   * promotion cut the steady read rate from 4.7 to 4.25 TB/s (126.5 us at
   * 128K against 134.8, docs/benchmarks.md, session 10). */
  if (c.masked || c.n_blocks != 1 || c.one.n <= 0 || !tma_decode_runs ()
      || !sift_tma::kv_map (&tk, c.one.k, c.one.k_hs, c.one.k_ts, c.one.n, c.kv_heads, BF16, TK, false)
      || !sift_tma::kv_map (&tv, c.one.v, c.one.v_hs, c.one.v_ts, c.one.n, c.kv_heads, BF16, TK, false))
    return cudaErrorNotSupported;
  constexpr auto FN = decode_tma_kernel<BF16, TMA_DW, TMA_S>;
  constexpr size_t SMEM = tma_decode_smem<TMA_DW, TMA_S> ();
  const cudaError_t e = allow_smem<FN, SMEM> ();
  if (e != cudaSuccess)
    return e;
  FN<<<dim3 (c.kv_heads, c.n_splits), (TMA_DW + 1) * 32, SMEM, stream>>> (c, tk, tv);
  return cudaGetLastError ();
}

template <int D, bool BF16>
cudaError_t
launch_rows (const SiftCudaAttnCall &c, cudaStream_t stream)
{
  const int rows = c.q_heads / c.kv_heads * c.n_q;
  if (sift_cuda_attn_rows_per_block (rows) != 16)
    return (cudaError_t) sift_cuda_prefill_launch (&c, stream);
  const bool paged = c.n_blocks > 1;
  if (D == 128 && rows <= 8 && !paged)
    {
      const cudaError_t e = launch_tma_decode<BF16> (c, stream);
      if (e != cudaErrorNotSupported)
        return e;
    }
  if (rows <= 8)
    return paged ? DecodeKqFor<D, BF16, true>::launch (c, stream) : DecodeKqFor<D, BF16, false>::launch (c, stream);
  return paged ? DecodeFor<D, BF16, true>::launch (c, stream) : DecodeFor<D, BF16, false>::launch (c, stream);
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
    return bf16 ? decode_resident<64, true> (rows, paged) : decode_resident<64, false> (rows, paged);
  return bf16 ? decode_resident<128, true> (rows, paged) : decode_resident<128, false> (rows, paged);
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
