/* GPU prefill attention (more than 16 query rows per kv head): an
 * FlashAttention-2-style kernel on mma.sync m16n8k16. A thread block takes
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
#include "mma.cuh"

using namespace sift_mma;

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
 * address ks, V rows at vs); keys at or past hi become zeros. A thread's
 * 16-byte column is the same for all its rows (THREADS is a multiple of
 * the chunks per row). A contiguous call reads its one block from the
 * kernel's parameters (no registers held across tiles); a paged one walks
 * the block table with the cursor. */
template <int D, int BN, int THREADS, bool PAGED>
__device__ __forceinline__ void
load_kv (const SiftCudaAttnCall &c, Cursor &cur, int kvh, int k0, int hi, uint32_t ks, uint32_t vs)
{
  constexpr int CPR = D / 8, LD = D + 8;
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
      const uint32_t at = (uint32_t) ((row * LD + col * 8) * 2);
      cp_async16 (ks + at, kp, n);
      cp_async16 (vs + at, vp, n);
    }
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
  const int group = c.q_heads / c.kv_heads;
  const int rows = group * c.n_q;
  const int n_rb = (rows + BM - 1) / BM;
  /* Block index: kv head fastest, row blocks from the last (causal: the
   * most keys) to the first, so the heavy blocks start first. */
  const int kvh = (int) (blockIdx.x % (unsigned) c.kv_heads);
  const int rb = n_rb - 1 - (int) (blockIdx.x / (unsigned) c.kv_heads);
  const int split = blockIdx.y;
  const int r_blk = rb * BM, r_warp = r_blk + warp * 16 * MT;

  /* Key range: the split, cut at the last key the block's last row sees. */
  const int lo = split * c.split_len;
  int hi = min (c.n_kv, lo + c.split_len);
  if (c.causal)
    {
      const int r_last = min (rows, r_blk + BM) - 1;
      const int64_t lim = c.q_offset + r_last / group + 1;
      hi = (int) max ((int64_t) lo, min ((int64_t) hi, lim));
    }

  /* Each thread's rows r_warp + 16 mt + g + 8 x: the end of their keys
   * (padding rows see none), and the warp's least and greatest end. */
  int rlim[MT][2];
  int lim_min = hi, lim_max = lo;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int x = 0; x < 2; x++)
      {
        const int r = r_warp + 16 * mt + 8 * x + g;
        if (r >= rows)
          rlim[mt][x] = lo;
        else if (c.causal)
          rlim[mt][x] = (int) max ((int64_t) lo, min ((int64_t) hi, c.q_offset + r / group + 1));
        else
          rlim[mt][x] = hi;
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
                                        ring + (s * 2 + 1) * KV_BYTES);
      cp_async_commit ();
    }

  /* Q of the block's rows, times scale * log2(e), rounded to K's type;
   * padding rows are zeros. */
  for (int e = threadIdx.x; e < BM * (D / 4); e += THREADS)
    {
      const int row = e / (D / 4), col = e % (D / 4) * 4;
      const int r = r_blk + row;
      float a = 0.0f, b = 0.0f, cc = 0.0f, d = 0.0f;
      if (r < rows)
        {
          const float *p = c.q + (int64_t) (kvh * group + r % group) * c.q_hs + (int64_t) (r / group) * c.q_ts + col;
          a = p[0] * c.qscale, b = p[1] * c.qscale, cc = p[2] * c.qscale, d = p[3] * c.qscale;
        }
      uint2 v = { pack2<BF16> (a, b), pack2<BF16> (cc, d) };
      *reinterpret_cast<uint2 *> (qs + row * LD + col) = v;
    }
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
                                          ring + ((nx % STAGES) * 2 + 1) * KV_BYTES);
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

  /* The block's result: the output (one split) or this split's partial. */
  float *out = c.out, *lse = c.lse;
  int64_t out_hs = c.out_hs, out_ts = c.out_ts, lse_hs = c.n_q;
  if (c.n_splits > 1)
    {
      out = c.part_o + (int64_t) split * c.q_heads * c.n_q * D;
      lse = c.part_l + (int64_t) split * c.q_heads * c.n_q;
      out_hs = (int64_t) c.n_q * D;
      out_ts = D;
    }
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int x = 0; x < 2; x++)
      {
        const float sum = quad_sum (l[mt][x]);
        const int r = r_warp + 16 * mt + 8 * x + g;
        if (r >= rows)
          continue;
        const int h = kvh * group + r % group, i = r / group;
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        float *orow = out + h * out_hs + i * out_ts;
#pragma unroll
        for (int j = 0; j < DT; j++)
          {
            orow[j * 8 + 2 * t] = o[mt][j][2 * x] * inv;
            orow[j * 8 + 2 * t + 1] = o[mt][j][2 * x + 1] * inv;
          }
        if (t == 0)
          lse[h * lse_hs + i] = sum > 0.0f ? (m[mt][x] + log2f (sum)) * CUDART_LN2_F : -CUDART_INF_F;
      }
}

/* One shape's kernel: shared-memory limit set once, blocks per SM, launch. */
template <int D, bool BF16, int MT, int WARPS, int BN, int STAGES, bool PAGED> struct Kernel {
  using S = Shape<D, MT, WARPS, BN, STAGES>;
  static_assert (S::BM == SIFT_CUDA_PREFILL_ROWS, "cuda.c sizes the splits by SIFT_CUDA_PREFILL_ROWS");
  static constexpr auto fn = prefill_kernel<D, BF16, MT, WARPS, BN, STAGES, PAGED>;

  /* Allows the kernel its dynamic shared memory (over the default 48 KB). */
  static cudaError_t
  configure ()
  {
    static bool configured = false; /* benign race: the attribute is idempotent */
    if (configured)
      return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute (fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) S::SMEM);
    configured = e == cudaSuccess;
    return e;
  }

  static int
  resident ()
  {
    return configure () == cudaSuccess ? blocks_per_sm (fn, S::THREADS, S::SMEM) : 1;
  }

  static cudaError_t
  launch (const SiftCudaAttnCall &c, cudaStream_t stream)
  {
    cudaError_t e = configure ();
    if (e != cudaSuccess)
      return e;
    const int64_t rows = (int64_t) c.q_heads / c.kv_heads * c.n_q;
    const int64_t blocks = (rows + S::BM - 1) / S::BM * c.kv_heads;
    if (blocks > 0x7fffffff)
      return cudaErrorInvalidConfiguration;
    fn<<<dim3 ((unsigned) blocks, c.n_splits), S::THREADS, S::SMEM, stream>>> (c);
    return cudaGetLastError ();
  }
};

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
  if (c.n_blocks > 1)
    return Prefill<D, BF16, true>::launch (c, stream);
  return Prefill<D, BF16, false>::launch (c, stream);
}

} // namespace

extern "C" int
sift_cuda_prefill_blocks_per_sm (int32_t head_dim, int32_t bf16)
{
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
