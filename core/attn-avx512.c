/* AVX-512 attention kernels: the vector operations of attn-simd.h on
 * 16-lane __m512 (built with -mavx512f -mavx512bw -mavx512vl -mavx512dq
 * -mfma -mf16c, called only when the CPU has them). */
#include <immintrin.h>
#include <math.h>

#include <sift/simd.h>

#include "attn-private.h"
#include "attn-x86-hsum.h"

#define VL 16
#define MR 4  /* broadcast rows of the microkernel */
#define DOT_KEYS 4 /* keys per dot-product block (MR x 4 accumulators) */
#define DEC_NB_MANY 4 /* decode O += P V, 3-4 rows: 3 or 4 rows keep 4 vectors of O each in 32 registers */
#define DEC_KEYS 4 /* keys per step of the decode scores (divides VL) */
#define NR 4  /* vectors per row: MR x NR = 16 of the 32 registers accumulate */

typedef __m512 vf;

static inline vf vload (const float *p) { return _mm512_loadu_ps (p); }
static inline void vstore (float *p, vf x) { _mm512_storeu_ps (p, x); }
static inline vf vset1 (float x) { return _mm512_set1_ps (x); }
static inline vf vzero (void) { return _mm512_setzero_ps (); }
static inline vf vfma (vf a, vf b, vf c) { return _mm512_fmadd_ps (a, b, c); }
static inline vf vmul (vf a, vf b) { return _mm512_mul_ps (a, b); }
static inline vf vadd (vf a, vf b) { return _mm512_add_ps (a, b); }
static inline vf vsub (vf a, vf b) { return _mm512_sub_ps (a, b); }
static inline vf vmax (vf a, vf b) { return _mm512_max_ps (a, b); }

static inline float vhsum (vf x) { return sift_hsum_512 (x); }

/* dst[i] = the sum of the lanes of acc[i], i < n (n a constant, at most
 * MR * DEC_KEYS): each vector folded to 8 lanes, then attn-x86-hsum.h. */
static inline __attribute__ ((always_inline)) void
vhsum_block (const vf *acc, const int n, float *dst)
{
  __m256 h[MR * DEC_KEYS];
  for (int i = 0; i < n; i++)
    h[i] = sift_fold_512 (acc[i]);
  vhsum_n_256 (h, n, dst);
}

static inline float vhmax (vf x) { return sift_hmax_512 (x); }

/* dst[j * ld + i] = scale * src[i][c0 + j] for i, j < 16: a 16 x 16 block
 * transposed in registers (4x4 within 128-bit lanes, then lanes). */
static inline void
vtranspose (const float *const *src, gsize c0, vf scale, float *dst, gsize ld)
{
  __m512 r[16], t[16];
  for (int i = 0; i < 16; i++)
    r[i] = _mm512_mul_ps (_mm512_loadu_ps (src[i] + c0), scale);
  for (int i = 0; i < 16; i += 2)
    {
      t[i] = _mm512_unpacklo_ps (r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps (r[i], r[i + 1]);
    }
  /* u[4m + k] holds, in 128-bit lane L, column 4L + k of rows 4m..4m+3. */
  for (int m = 0; m < 4; m++)
    {
      __m512d a = _mm512_castps_pd (t[4 * m]), b = _mm512_castps_pd (t[4 * m + 1]);
      __m512d c = _mm512_castps_pd (t[4 * m + 2]), e = _mm512_castps_pd (t[4 * m + 3]);
      r[4 * m] = _mm512_castpd_ps (_mm512_unpacklo_pd (a, c));
      r[4 * m + 1] = _mm512_castpd_ps (_mm512_unpackhi_pd (a, c));
      r[4 * m + 2] = _mm512_castpd_ps (_mm512_unpacklo_pd (b, e));
      r[4 * m + 3] = _mm512_castpd_ps (_mm512_unpackhi_pd (b, e));
    }
  for (int k = 0; k < 4; k++)
    {
      __m512 pa = _mm512_shuffle_f32x4 (r[k], r[4 + k], 0x44);
      __m512 pb = _mm512_shuffle_f32x4 (r[k], r[4 + k], 0xee);
      __m512 qa = _mm512_shuffle_f32x4 (r[8 + k], r[12 + k], 0x44);
      __m512 qb = _mm512_shuffle_f32x4 (r[8 + k], r[12 + k], 0xee);
      _mm512_storeu_ps (dst + (gsize) k * ld, _mm512_shuffle_f32x4 (pa, qa, 0x88));
      _mm512_storeu_ps (dst + (gsize) (4 + k) * ld, _mm512_shuffle_f32x4 (pa, qa, 0xdd));
      _mm512_storeu_ps (dst + (gsize) (8 + k) * ld, _mm512_shuffle_f32x4 (pb, qb, 0x88));
      _mm512_storeu_ps (dst + (gsize) (12 + k) * ld, _mm512_shuffle_f32x4 (pb, qb, 0xdd));
    }
}

static inline vf
vcvt_f16 (const guint16 *p)
{
  return sift_load_f16_512 (p);
}

static inline vf
vcvt_bf16 (const guint16 *p)
{
  return sift_load_bf16_512 (p);
}

/* -inf in the lanes whose row limit is <= pos (the key is not visible). */
static inline vf
vmask_ge (vf s, gint32 pos, const gint32 *lim)
{
  __mmask16 hidden = _mm512_cmpge_epi32_mask (_mm512_set1_epi32 (pos),
                                               _mm512_loadu_si512 ((const void *) lim));
  return _mm512_mask_mov_ps (s, hidden, _mm512_set1_ps (-INFINITY));
}

static inline vf
vzero_where_neg_inf (vf m)
{
  __mmask16 k = _mm512_cmp_ps_mask (m, _mm512_set1_ps (-INFINITY), _CMP_EQ_OQ);
  return _mm512_mask_mov_ps (m, k, _mm512_setzero_ps ());
}

/* 2^x with <sift/simd.h>'s rule: x < -126 (and -inf) gives exactly 0,
 * so masked keys add nothing. */
static inline vf
vexp2 (vf x)
{
  return sift_exp2_512 (x);
}

#include "attn-simd.h"

const SiftAttnKernels sift_attn_kernels_avx512 = {
  .dense = dense_simd,
  .decode = decode_simd,
  .gather = gather_simd,
  .exp2v = expv_simd,
};
