/* Element types: names, sizes and exact round-to-nearest-even conversions. */
#include <math.h>
#include <string.h>

#include <sift/dtype.h>

#include "dtype-private.h"

static const char *const dtype_names[] = { "f32", "f16", "bf16", "q8_0" };

const char *
sift_dtype_name (SiftDType dtype)
{
  g_return_val_if_fail ((guint) dtype < G_N_ELEMENTS (dtype_names), "invalid");
  return dtype_names[dtype];
}

gboolean
sift_dtype_from_name (const char *name, SiftDType *out)
{
  for (guint i = 0; name != NULL && i < G_N_ELEMENTS (dtype_names); i++)
    if (strcmp (name, dtype_names[i]) == 0)
      {
        *out = (SiftDType) i;
        return TRUE;
      }
  return FALSE;
}

gsize
sift_dtype_size (SiftDType dtype)
{
  switch (dtype)
    {
    case SIFT_DTYPE_F32: return 4;
    case SIFT_DTYPE_F16:
    case SIFT_DTYPE_BF16: return 2;
    case SIFT_DTYPE_Q8_0: return 0;
    }
  return 0;
}

gsize
sift_dtype_row_bytes (SiftDType dtype, gsize n)
{
  if (dtype == SIFT_DTYPE_Q8_0)
    {
      g_return_val_if_fail (n % SIFT_Q8_0_BLOCK == 0, 0);
      return n / SIFT_Q8_0_BLOCK * sizeof (SiftBlockQ8_0);
    }
  return n * sift_dtype_size (dtype);
}

static inline guint32
f32_bits (float x)
{
  guint32 u;
  memcpy (&u, &x, 4);
  return u;
}

static inline float
bits_f32 (guint32 u)
{
  float x;
  memcpy (&x, &u, 4);
  return x;
}

guint16
sift_f32_to_f16 (float x)
{
  guint32 u = f32_bits (x);
  guint32 sign = (u >> 16) & 0x8000u;
  guint32 exp = (u >> 23) & 0xffu;
  guint32 mant = u & 0x7fffffu;

  if (exp == 0xffu) /* inf or NaN; a NaN keeps a set quiet bit */
    return (guint16) (sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0));

  gint32 e = (gint32) exp - 127 + 15;
  if (e >= 0x1f)
    return (guint16) (sign | 0x7c00u);
  if (e <= 0)
    {
      /* Subnormal half (or zero): shift the full significand right and
       * round to nearest even on the bits shifted out. */
      if (e < -10)
        return (guint16) sign;
      guint32 m = mant | 0x800000u;
      guint32 shift = (guint32) (14 - e);
      guint32 half = m >> shift;
      guint32 rem = m & ((1u << shift) - 1);
      guint32 halfway = 1u << (shift - 1);
      if (rem > halfway || (rem == halfway && (half & 1u)))
        half++;
      return (guint16) (sign | half);
    }
  guint32 h = ((guint32) e << 10) | (mant >> 13);
  guint32 rem = mant & 0x1fffu;
  /* A carry out of the mantissa correctly bumps the exponent (up to inf). */
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
    h++;
  return (guint16) (sign | h);
}

float
sift_f16_to_f32 (guint16 h)
{
  guint32 sign = (guint32) (h & 0x8000u) << 16;
  guint32 exp = (h >> 10) & 0x1fu;
  guint32 mant = h & 0x3ffu;

  if (exp == 0)
    {
      if (mant == 0)
        return bits_f32 (sign);
      /* Subnormal: value = mant * 2^-24, exact in f32. */
      float v = (float) mant * 0x1p-24f;
      return sign ? -v : v;
    }
  if (exp == 0x1f)
    return bits_f32 (sign | 0x7f800000u | (mant << 13));
  return bits_f32 (sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

guint16
sift_f32_to_bf16 (float x)
{
  guint32 u = f32_bits (x);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and NaN */
    return (guint16) ((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (guint16) (u >> 16);
}

float
sift_bf16_to_f32 (guint16 h)
{
  return bits_f32 ((guint32) h << 16);
}

static void
q8_0_quantize (const float *src, SiftBlockQ8_0 *dst, gsize n)
{
  for (gsize b = 0; b < n / SIFT_Q8_0_BLOCK; b++)
    {
      const float *x = src + b * SIFT_Q8_0_BLOCK;
      float amax = 0.0f;
      for (int i = 0; i < SIFT_Q8_0_BLOCK; i++)
        amax = MAX (amax, fabsf (x[i]));
      float d = amax / 127.0f;
      guint16 dh = sift_f32_to_f16 (d);
      /* Quantize against the scale as stored, so dequantization is consistent. */
      float ds = sift_f16_to_f32 (dh);
      float id = ds > 0.0f ? 1.0f / ds : 0.0f;
      dst[b].d = dh;
      for (int i = 0; i < SIFT_Q8_0_BLOCK; i++)
        dst[b].qs[i] = (gint8) CLAMP (lrintf (x[i] * id), -127, 127);
    }
}

/* ---- Bulk kernels: the scalar table is the reference ------------------- */

static void
f16_to_f32_scalar (const guint16 *src, float *dst, gsize n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = sift_f16_to_f32 (src[i]);
}

static void
f32_to_f16_scalar (const float *src, guint16 *dst, gsize n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = sift_f32_to_f16 (src[i]);
}

static void
bf16_to_f32_scalar (const guint16 *src, float *dst, gsize n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = sift_bf16_to_f32 (src[i]);
}

static void
f32_to_bf16_scalar (const float *src, guint16 *dst, gsize n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = sift_f32_to_bf16 (src[i]);
}

static void
q8_0_to_f32_scalar (const SiftBlockQ8_0 *src, float *dst, gsize n_blocks)
{
  for (gsize b = 0; b < n_blocks; b++)
    {
      float d = sift_f16_to_f32 (src[b].d);
      for (int i = 0; i < SIFT_Q8_0_BLOCK; i++)
        dst[b * SIFT_Q8_0_BLOCK + (gsize) i] = d * (float) src[b].qs[i];
    }
}

const SiftDTypeKernels sift_dtype_kernels_scalar = {
  .f16_to_f32 = f16_to_f32_scalar,
  .f32_to_f16 = f32_to_f16_scalar,
  .bf16_to_f32 = bf16_to_f32_scalar,
  .f32_to_bf16 = f32_to_bf16_scalar,
  .q8_0_to_f32 = q8_0_to_f32_scalar,
};

/* The table of the ISA the kernels use now (sift_isa_active, so SIFT_ISA
 * and sift_isa_force switch conversions together with attention). */
static const SiftDTypeKernels *
kernels (void)
{
  switch (sift_isa_active ())
    {
#ifdef SIFT_HAVE_AVX512
    case SIFT_ISA_AVX512: return &sift_dtype_kernels_avx512;
#endif
#ifdef SIFT_HAVE_AVX2
    case SIFT_ISA_AVX2: return &sift_dtype_kernels_avx2;
#endif
    default: return &sift_dtype_kernels_scalar;
    }
}

static void
to_f32 (const SiftDTypeKernels *kt, const void *src, SiftDType dt, float *dst, gsize n)
{
  switch (dt)
    {
    case SIFT_DTYPE_F32: memmove (dst, src, n * 4); break;
    case SIFT_DTYPE_F16: kt->f16_to_f32 (src, dst, n); break;
    case SIFT_DTYPE_BF16: kt->bf16_to_f32 (src, dst, n); break;
    case SIFT_DTYPE_Q8_0: kt->q8_0_to_f32 (src, dst, n / SIFT_Q8_0_BLOCK); break;
    }
}

static void
from_f32 (const SiftDTypeKernels *kt, const float *src, void *dst, SiftDType dt, gsize n)
{
  switch (dt)
    {
    case SIFT_DTYPE_F32: memmove (dst, src, n * 4); break;
    case SIFT_DTYPE_F16: kt->f32_to_f16 (src, dst, n); break;
    case SIFT_DTYPE_BF16: kt->f32_to_bf16 (src, dst, n); break;
    case SIFT_DTYPE_Q8_0: q8_0_quantize (src, dst, n); break;
    }
}

void
sift_convert (const void *src, SiftDType src_dtype, void *dst, SiftDType dst_dtype, gsize n)
{
  g_return_if_fail (src != NULL && dst != NULL);
  g_return_if_fail ((src_dtype != SIFT_DTYPE_Q8_0 && dst_dtype != SIFT_DTYPE_Q8_0)
                    || n % SIFT_Q8_0_BLOCK == 0);
  if (src_dtype == dst_dtype)
    {
      memmove (dst, src, sift_dtype_row_bytes (src_dtype, n));
      return;
    }
  const SiftDTypeKernels *kt = kernels ();
  if (src_dtype == SIFT_DTYPE_F32)
    {
      from_f32 (kt, src, dst, dst_dtype, n);
      return;
    }
  if (dst_dtype == SIFT_DTYPE_F32)
    {
      to_f32 (kt, src, src_dtype, dst, n);
      return;
    }
  /* Between two narrow types: through f32 in pieces (exact: every f16,
   * bf16 and q8_0 value is an f32). */
  float tmp[256];
  gsize done = 0;
  while (done < n)
    {
      gsize m = MIN (n - done, G_N_ELEMENTS (tmp));
      gsize sb = sift_dtype_row_bytes (src_dtype, done);
      gsize db = sift_dtype_row_bytes (dst_dtype, done);
      to_f32 (kt, (const char *) src + sb, src_dtype, tmp, m);
      from_f32 (kt, tmp, (char *) dst + db, dst_dtype, m);
      done += m;
    }
}
