/* AVX2 attention kernels: the vector operations of attn-simd.h on 8-lane
 * __m256 (built with -mavx2 -mfma -mf16c, called only when the CPU has them).
 * attn-simd.h needs: VL, vf, vload, vstore, vset1, vzero, vfma, vmul, vadd,
 * vsub, vmax, vhsum (sum of the lanes), vtranspose (VL x VL block), vcvt_f16, vcvt_bf16 (VL elements to f32), vmask_ge,
 * vzero_where_neg_inf, vexp2 and the microkernel's block MR x NR (MR must
 * divide BK and VL). */
#include <immintrin.h>
#include <math.h>

#include <sift/simd.h>

#include "attn-private.h"
#include "attn-x86-hsum.h"

#define VL 8
#define MR 4
#define DOT_KEYS 2 /* keys per dot-product block (must divide MR) */
#define DEC_NB_MANY 2 /* decode O += P V, 3-4 rows: registers: 3 or 4 rows keep 2 vectors of O each */
#define DEC_KEYS 2 /* keys per step of the decode scores (divides VL) */
#define NR 2  /* 8 of the 16 registers accumulate */

typedef __m256 vf;

static inline vf vload (const float *p) { return _mm256_loadu_ps (p); }
static inline void vstore (float *p, vf x) { _mm256_storeu_ps (p, x); }
static inline vf vset1 (float x) { return _mm256_set1_ps (x); }
static inline vf vzero (void) { return _mm256_setzero_ps (); }
static inline vf vfma (vf a, vf b, vf c) { return _mm256_fmadd_ps (a, b, c); }
static inline vf vmul (vf a, vf b) { return _mm256_mul_ps (a, b); }
static inline vf vadd (vf a, vf b) { return _mm256_add_ps (a, b); }
static inline vf vsub (vf a, vf b) { return _mm256_sub_ps (a, b); }
static inline vf vmax (vf a, vf b) { return _mm256_max_ps (a, b); }

static inline float vhsum (vf x) { return sift_hsum_256 (x); }

/* dst[i] = the sum of the lanes of acc[i], i < n (n a constant). */
static inline __attribute__ ((always_inline)) void
vhsum_block (const vf *acc, const int n, float *dst)
{
  vhsum_n_256 (acc, n, dst);
}

static inline float vhmax (vf x) { return sift_hmax_256 (x); }

/* dst[j * ld + i] = scale * src[i][c0 + j] for i, j < 8: an 8 x 8 block
 * transposed in registers (4x4 within 128-bit lanes, then lanes). */
static inline void
vtranspose (const float *const *src, gsize c0, vf scale, float *dst, gsize ld)
{
  __m256 r[8], t[8];
  for (int i = 0; i < 8; i++)
    r[i] = _mm256_mul_ps (_mm256_loadu_ps (src[i] + c0), scale);
  for (int i = 0; i < 8; i += 2)
    {
      t[i] = _mm256_unpacklo_ps (r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps (r[i], r[i + 1]);
    }
  for (int m = 0; m < 2; m++)
    {
      __m256d a = _mm256_castps_pd (t[4 * m]), b = _mm256_castps_pd (t[4 * m + 1]);
      __m256d c = _mm256_castps_pd (t[4 * m + 2]), e = _mm256_castps_pd (t[4 * m + 3]);
      r[4 * m] = _mm256_castpd_ps (_mm256_unpacklo_pd (a, c));
      r[4 * m + 1] = _mm256_castpd_ps (_mm256_unpackhi_pd (a, c));
      r[4 * m + 2] = _mm256_castpd_ps (_mm256_unpacklo_pd (b, e));
      r[4 * m + 3] = _mm256_castpd_ps (_mm256_unpackhi_pd (b, e));
    }
  for (int k = 0; k < 4; k++)
    {
      _mm256_storeu_ps (dst + (gsize) k * ld, _mm256_permute2f128_ps (r[k], r[4 + k], 0x20));
      _mm256_storeu_ps (dst + (gsize) (4 + k) * ld, _mm256_permute2f128_ps (r[k], r[4 + k], 0x31));
    }
}

static inline vf
vcvt_f16 (const guint16 *p)
{
  return sift_load_f16_256 (p);
}

static inline vf
vcvt_bf16 (const guint16 *p)
{
  return sift_load_bf16_256 (p);
}

static inline vf
vmask_ge (vf s, gint32 pos, const gint32 *lim)
{
  __m256i visible = _mm256_cmpgt_epi32 (_mm256_loadu_si256 ((const __m256i *) lim),
                                        _mm256_set1_epi32 (pos));
  return _mm256_blendv_ps (_mm256_set1_ps (-INFINITY), s, _mm256_castsi256_ps (visible));
}

static inline vf
vzero_where_neg_inf (vf m)
{
  vf k = _mm256_cmp_ps (m, _mm256_set1_ps (-INFINITY), _CMP_EQ_OQ);
  return _mm256_blendv_ps (m, _mm256_setzero_ps (), k);
}

/* 2^x with <sift/simd.h>'s rule: x < -126 (and -inf) gives exactly 0,
 * so masked keys add nothing. */
static inline vf
vexp2 (vf x)
{
  return sift_exp2_256 (x);
}

#include "attn-simd.h"

const SiftAttnKernels sift_attn_kernels_avx2 = {
  .dense = dense_simd,
  .decode = decode_simd,
  .gather = gather_simd,
  .exp2v = expv_simd,
};
