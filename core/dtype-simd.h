/* SIMD conversions, written once over GCC vector extensions of VL 32-bit
 * lanes and included by dtype-avx2.c (VL 8) and dtype-avx512.c (VL 16).
 * The includer defines VL, KERNELS (the table's name), vf (VL floats) and
 * the two hardware f16 conversions:
 *   vf   vcvt_ph_ps (const guint16 *p);      VL halves -> f32, exact
 *   void vcvt_ps_ph (guint16 *p, vf x);      VL f32 -> halves, round to nearest even
 *   gboolean vany_nan (vf x);                 TRUE if a lane is NaN
 *   vf   vcvt_i8_ps (const gint8 *p);        VL int8 -> f32, exact
 * Every kernel works on whole vectors and finishes a tail of n % VL through
 * a padded copy, so each lane sees the same operations: the result does not
 * depend on length or alignment. The scalar functions in dtype.c are the
 * reference; the fix-ups below make NaN payloads match them exactly. */
#include <string.h>

#include "dtype-private.h"

typedef guint32 vu __attribute__ ((vector_size (VL * 4)));
typedef gint32 vi __attribute__ ((vector_size (VL * 4)));
typedef guint16 vh __attribute__ ((vector_size (VL * 2)));

static inline vu
vsel (vi mask, vu a, vu b)
{
  return ((vu) mask & a) | (~(vu) mask & b);
}

/* f16 -> f32: the hardware conversion is exact except that it quiets a
 * signalling NaN; the scalar path keeps the payload as is. */
static inline void
f16_vec (const guint16 *src, float *dst)
{
  vf r = vcvt_ph_ps (src);
  if (G_LIKELY (!vany_nan (r)))
    {
      memcpy (dst, &r, sizeof r);
      return;
    }
  vh h16;
  memcpy (&h16, src, sizeof h16);
  vu h = __builtin_convertvector (h16, vu);
  vi nan = (vi) ((h & 0x7fffu) > 0x7c00u);
  vu fix = ((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13);
  vu bits;
  memcpy (&bits, &r, sizeof bits);
  bits = vsel (nan, fix, bits);
  memcpy (dst, &bits, sizeof bits);
}

/* f32 -> f16: round to nearest even in hardware (not MXCSR); a NaN becomes
 * sign | 0x7c00 | 0x200 | mant >> 13 as in the scalar path. */
static inline void
f32_f16_vec (const float *src, guint16 *dst)
{
  vf x;
  memcpy (&x, src, sizeof x);
  vcvt_ps_ph (dst, x);
}

static inline void
bf16_vec (const guint16 *src, float *dst)
{
  vh h16;
  memcpy (&h16, src, sizeof h16);
  vu u = __builtin_convertvector (h16, vu) << 16;
  memcpy (dst, &u, sizeof u);
}

/* f32 -> bf16: the scalar path's integer rounding, lane by lane. */
static inline void
f32_bf16_vec (const float *src, guint16 *dst)
{
  vu u;
  memcpy (&u, src, sizeof u);
  vi nan = (vi) ((u & 0x7fffffffu) > 0x7f800000u);
  vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  vh r = __builtin_convertvector (vsel (nan, (u >> 16) | 0x40u, rounded), vh);
  memcpy (dst, &r, sizeof r);
}

/* Runs vec over whole vectors, then the tail through a zero-padded copy. */
#define CONVERT_LOOP(vec, S, D, src, dst, n)             \
  do                                                     \
    {                                                    \
      gsize i_ = 0;                                      \
      for (; i_ + VL <= (n); i_ += VL)                   \
        vec ((src) + i_, (dst) + i_);                    \
      if (i_ < (n))                                      \
        {                                                \
          S s_[VL] = { 0 };                              \
          D d_[VL];                                      \
          memcpy (s_, (src) + i_, ((n) - i_) * sizeof (S)); \
          vec (s_, d_);                                  \
          memcpy ((dst) + i_, d_, ((n) - i_) * sizeof (D)); \
        }                                                \
    }                                                    \
  while (0)

static void
f16_to_f32 (const guint16 *src, float *dst, gsize n)
{
  CONVERT_LOOP (f16_vec, guint16, float, src, dst, n);
}

static void
f32_to_f16 (const float *src, guint16 *dst, gsize n)
{
  CONVERT_LOOP (f32_f16_vec, float, guint16, src, dst, n);
}

static void
bf16_to_f32 (const guint16 *src, float *dst, gsize n)
{
  CONVERT_LOOP (bf16_vec, guint16, float, src, dst, n);
}

static void
f32_to_bf16 (const float *src, guint16 *dst, gsize n)
{
  CONVERT_LOOP (f32_bf16_vec, float, guint16, src, dst, n);
}

/* q8_0 -> f32: one multiply per element, d * (float) q, as the scalar path;
 * the scales of VL blocks are converted together by f16_to_f32. */
static void
q8_0_to_f32 (const SiftBlockQ8_0 *src, float *dst, gsize n_blocks)
{
  G_STATIC_ASSERT (SIFT_Q8_0_BLOCK % VL == 0);
  for (gsize b0 = 0; b0 < n_blocks; b0 += VL)
    {
      const gsize m = MIN ((gsize) VL, n_blocks - b0);
      guint16 dh[VL];
      float d[VL];
      for (gsize b = 0; b < m; b++)
        dh[b] = src[b0 + b].d;
      f16_to_f32 (dh, d, m);
      for (gsize b = 0; b < m; b++)
        for (int i = 0; i < SIFT_Q8_0_BLOCK; i += VL)
          {
            vf x = vcvt_i8_ps (src[b0 + b].qs + i) * d[b];
            memcpy (dst + (b0 + b) * SIFT_Q8_0_BLOCK + (gsize) i, &x, sizeof x);
          }
    }
}

const SiftDTypeKernels KERNELS = {
  .f16_to_f32 = f16_to_f32,
  .f32_to_f16 = f32_to_f16,
  .bf16_to_f32 = bf16_to_f32,
  .f32_to_bf16 = f32_to_bf16,
  .q8_0_to_f32 = q8_0_to_f32,
};
