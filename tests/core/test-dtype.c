/* dtype conversions: exhaustive over every f16 and bf16 bit pattern, and
 * round-to-nearest-even against a double-precision reference. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

/* Reference: the f16 value nearest to x (ties to even mantissa), by search
 * over the finite halves of x's sign. Returns the bits. */
static guint16
ref_f32_to_f16 (float x)
{
  if (isnan (x))
    return 0x7e00;
  guint16 sign = signbit (x) ? 0x8000 : 0;
  double ax = fabs ((double) x);
  /* 65520 and above round to infinity (half of the last ulp past 65504). */
  if (ax >= 65520.0)
    return sign | 0x7c00;
  guint16 best = 0;
  double best_err = INFINITY;
  for (guint32 h = 0; h < 0x7c00; h++)
    {
      double e = fabs ((double) sift_f16_to_f32 ((guint16) h) - ax);
      if (e < best_err || (e == best_err && (h & 1) == 0))
        {
          best = (guint16) h;
          best_err = e;
        }
    }
  return sign | best;
}

static void
test_f16_roundtrip_exhaustive (void **state)
{
  (void) state;
  for (guint32 h = 0; h < 0x10000; h++)
    {
      float f = sift_f16_to_f32 ((guint16) h);
      guint16 back = sift_f32_to_f16 (f);
      if (isnan (f))
        assert_true ((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0);
      else
        assert_int_equal (back, h);
    }
}

static void
test_f16_round_nearest_even (void **state)
{
  (void) state;
  GRand *r = g_rand_new_with_seed (7);
  for (int i = 0; i < 3000; i++)
    {
      /* Values spread over the normal, subnormal and overflow ranges. */
      float x = (float) (g_rand_double_range (r, -1, 1) * pow (2.0, g_rand_int_range (r, -26, 17)));
      assert_int_equal (sift_f32_to_f16 (x), ref_f32_to_f16 (x));
    }
  /* Exact ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 -> even (1). */
  assert_int_equal (sift_f32_to_f16 (1.0f + 0x1p-11f), 0x3c00);
  assert_int_equal (sift_f32_to_f16 (1.0f + 3 * 0x1p-11f), 0x3c02);
  assert_int_equal (sift_f32_to_f16 (65520.0f), 0x7c00);
  assert_int_equal (sift_f32_to_f16 (65519.0f), 0x7bff);
  assert_int_equal (sift_f32_to_f16 (0x1p-25f), 0x0000);          /* tie to even zero */
  assert_int_equal (sift_f32_to_f16 (0x1p-25f * 1.5f), 0x0001);   /* above the tie */
  g_rand_free (r);
}

static void
test_bf16 (void **state)
{
  (void) state;
  for (guint32 h = 0; h < 0x10000; h++)
    {
      float f = sift_bf16_to_f32 ((guint16) h);
      if (!isnan (f))
        assert_int_equal (sift_f32_to_bf16 (f), h);
      else
        assert_true (isnan (sift_bf16_to_f32 (sift_f32_to_bf16 (f))));
    }
  /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even. */
  assert_int_equal (sift_f32_to_bf16 (1.0f + 0x1p-8f), 0x3f80);
  assert_int_equal (sift_f32_to_bf16 (1.0f + 3 * 0x1p-8f), 0x3f82);
  assert_int_equal (sift_f32_to_bf16 (1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
}

static void
test_q8_0 (void **state)
{
  (void) state;
  float x[64], y[64];
  SiftBlockQ8_0 q[2];
  for (int i = 0; i < 64; i++)
    x[i] = sinf ((float) i) * (i < 32 ? 1.0f : 100.0f);
  sift_convert (x, SIFT_DTYPE_F32, q, SIFT_DTYPE_Q8_0, 64);
  sift_convert (q, SIFT_DTYPE_Q8_0, y, SIFT_DTYPE_F32, 64);
  for (int i = 0; i < 64; i++)
    {
      float amax = i < 32 ? 1.0f : 100.0f;
      assert_true (fabsf (x[i] - y[i]) <= amax / 127.0f * 0.5f + 1e-3f * amax);
    }
  assert_int_equal (sift_dtype_row_bytes (SIFT_DTYPE_Q8_0, 64), 68);
}

/* ---- Every ISA's bulk path equals the scalar functions bit for bit ------ */

/* Per-element reference of sift_convert from src to dst for the 16-bit and
 * f32 types, through the scalar functions only. */
static void
ref_convert (const void *src, SiftDType sd, void *dst, SiftDType dd, gsize n)
{
  for (gsize i = 0; i < n; i++)
    {
      float f;
      switch (sd)
        {
        case SIFT_DTYPE_F16: f = sift_f16_to_f32 (((const guint16 *) src)[i]); break;
        case SIFT_DTYPE_BF16: f = sift_bf16_to_f32 (((const guint16 *) src)[i]); break;
        default: memcpy (&f, (const float *) src + i, 4); break;
        }
      switch (dd)
        {
        case SIFT_DTYPE_F16: ((guint16 *) dst)[i] = sift_f32_to_f16 (f); break;
        case SIFT_DTYPE_BF16: ((guint16 *) dst)[i] = sift_f32_to_bf16 (f); break;
        default: memcpy ((float *) dst + i, &f, 4); break;
        }
    }
}

/* Converts src (n elements) with every ISA this CPU has, whole and in pieces
 * of lengths 0..67 at element offsets 0..3, and asserts each output equals
 * ref bit for bit and nothing past the end is written. */
static void
check_all_isas (const void *src, SiftDType sd, SiftDType dd, gsize n, const void *ref)
{
  const gsize ss = sift_dtype_size (sd), ds = sift_dtype_size (dd);
  const SiftIsa saved = sift_isa_active ();
  g_autofree guint8 *out = g_malloc (n * ds + 64);
  for (int isa = SIFT_ISA_SCALAR; isa <= (int) sift_isa_detect (); isa++)
    {
      assert_true (sift_isa_force ((SiftIsa) isa));
      memset (out, 0xa5, n * ds + 64);
      sift_convert (src, sd, out, dd, n);
      if (memcmp (out, ref, n * ds) != 0)
        for (gsize i = 0; i < n; i++)
          if (memcmp (out + i * ds, (const guint8 *) ref + i * ds, ds) != 0)
            fail_msg ("isa %s, %s -> %s, element %zu differs", sift_isa_name ((SiftIsa) isa),
                      sift_dtype_name (sd), sift_dtype_name (dd), i);
      for (gsize off = 0; off < 4; off++)
        for (gsize len = 0; len <= 67 && off + len <= n; len++)
          {
            memset (out, 0xa5, (len + 4) * ds);
            /* dst starts at a different element offset than src */
            sift_convert ((const guint8 *) src + off * ss, sd, out + (3 - off) * ds, dd, len);
            assert_memory_equal (out + (3 - off) * ds, (const guint8 *) ref + off * ds, len * ds);
            for (gsize b = 0; b < ds; b++)
              assert_int_equal (out[(3 - off + len) * ds + b], 0xa5);
          }
    }
  assert_true (sift_isa_force (saved));
}

static void
test_simd_narrow_to_f32_exhaustive (void **state)
{
  (void) state;
  g_autofree guint16 *h = g_new (guint16, 65536);
  g_autofree float *ref = g_new (float, 65536);
  for (guint i = 0; i < 65536; i++)
    h[i] = (guint16) i;
  SiftDType narrow[] = { SIFT_DTYPE_F16, SIFT_DTYPE_BF16 };
  for (guint k = 0; k < G_N_ELEMENTS (narrow); k++)
    {
      ref_convert (h, narrow[k], ref, SIFT_DTYPE_F32, 65536);
      check_all_isas (h, narrow[k], SIFT_DTYPE_F32, 65536, ref);
    }
  /* f16 <-> bf16 goes through f32 in pieces */
  g_autofree guint16 *ref16 = g_new (guint16, 65536);
  ref_convert (h, SIFT_DTYPE_F16, ref16, SIFT_DTYPE_BF16, 65536);
  check_all_isas (h, SIFT_DTYPE_F16, SIFT_DTYPE_BF16, 65536, ref16);
  ref_convert (h, SIFT_DTYPE_BF16, ref16, SIFT_DTYPE_F16, 65536);
  check_all_isas (h, SIFT_DTYPE_BF16, SIFT_DTYPE_F16, 65536, ref16);
}

/* f32 inputs: random bit patterns (NaNs with payloads, infinities,
 * subnormals of both types) and, for every half and every bf16, the exact
 * ties and their neighbours one ulp away. */
static void
test_simd_f32_to_narrow (void **state)
{
  (void) state;
  GArray *a = g_array_new (FALSE, FALSE, sizeof (guint32));
  g_autoptr (GRand) r = g_rand_new_with_seed (4);
  for (int i = 0; i < 200000; i++)
    {
      guint32 u = g_rand_int (r);
      g_array_append_val (a, u);
    }
  for (guint32 h = 0; h < 65536; h++)
    {
      /* f16: the tie between h and h+1 in f32 bits (0x1000 below the next
       * half's mantissa step for normals) and its neighbours */
      float f = sift_f16_to_f32 ((guint16) h), g = sift_f16_to_f32 ((guint16) (h + 1));
      if (isfinite (f) && isfinite (g) && h != 0x7fff && h != 0xffff)
        {
          float mid = (float) (((double) f + (double) g) / 2);
          guint32 u;
          memcpy (&u, &mid, 4);
          guint32 near[] = { u, u - 1, u + 1 };
          g_array_append_vals (a, near, 3);
        }
      guint32 bt = (h << 16) | 0x8000u; /* bf16 tie */
      guint32 bn[] = { bt, bt - 1, bt + 1, h << 16 };
      g_array_append_vals (a, bn, 4);
    }
  guint32 special[] = { 0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                        0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fffffffu, 0x00000001u,
                        0x807fffffu, 0x7f7fffffu, 0x477fe000u, 0x477ff000u, 0x477fefffu,
                        0x33000000u, 0x33000001u, 0x387fc000u, 0x38800000u };
  g_array_append_vals (a, special, G_N_ELEMENTS (special));
  const gsize n = a->len;
  const float *x = (const float *) (void *) a->data;
  g_autofree guint16 *ref = g_new (guint16, n);
  SiftDType narrow[] = { SIFT_DTYPE_F16, SIFT_DTYPE_BF16 };
  for (guint k = 0; k < G_N_ELEMENTS (narrow); k++)
    {
      ref_convert (x, SIFT_DTYPE_F32, ref, narrow[k], n);
      check_all_isas (x, SIFT_DTYPE_F32, narrow[k], n, ref);
    }
  g_array_free (a, TRUE);
}

/* q8_0 -> f32: random blocks, scales including 0, subnormal, inf and NaN,
 * against d * (float) q through the scalar f16 conversion. */
static void
test_simd_q8_0_to_f32 (void **state)
{
  (void) state;
  enum { NB = 512 };
  g_autofree SiftBlockQ8_0 *q = g_new (SiftBlockQ8_0, NB);
  g_autofree float *ref = g_new (float, NB * SIFT_Q8_0_BLOCK);
  g_autofree float *out = g_new (float, NB * SIFT_Q8_0_BLOCK + 1);
  g_autoptr (GRand) r = g_rand_new_with_seed (8);
  const guint16 scales[] = { 0x0000, 0x8000, 0x0001, 0x03ff, 0x7c00, 0x7e00, 0x7c01, 0x3c00, 0x7bff };
  for (int b = 0; b < NB; b++)
    {
      q[b].d = b < (int) G_N_ELEMENTS (scales) ? scales[b] : (guint16) g_rand_int (r);
      for (int i = 0; i < SIFT_Q8_0_BLOCK; i++)
        q[b].qs[i] = (gint8) g_rand_int (r);
      for (int i = 0; i < SIFT_Q8_0_BLOCK; i++)
        ref[b * SIFT_Q8_0_BLOCK + i] = sift_f16_to_f32 (q[b].d) * (float) q[b].qs[i];
    }
  q[NB - 1].qs[0] = -128;
  ref[(NB - 1) * SIFT_Q8_0_BLOCK] = sift_f16_to_f32 (q[NB - 1].d) * -128.0f;
  const SiftIsa saved = sift_isa_active ();
  for (int isa = SIFT_ISA_SCALAR; isa <= (int) sift_isa_detect (); isa++)
    {
      assert_true (sift_isa_force ((SiftIsa) isa));
      for (gsize nb = 0; nb <= NB; nb += nb < 4 ? 1 : 127)
        {
          /* unaligned destination: one float in */
          sift_convert (q, SIFT_DTYPE_Q8_0, out + 1, SIFT_DTYPE_F32, nb * SIFT_Q8_0_BLOCK);
          assert_memory_equal (out + 1, ref, nb * SIFT_Q8_0_BLOCK * sizeof (float));
        }
    }
  assert_true (sift_isa_force (saved));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_f16_roundtrip_exhaustive),
    cmocka_unit_test (test_f16_round_nearest_even),
    cmocka_unit_test (test_bf16),
    cmocka_unit_test (test_q8_0),
    cmocka_unit_test (test_simd_narrow_to_f32_exhaustive),
    cmocka_unit_test (test_simd_f32_to_narrow),
    cmocka_unit_test (test_simd_q8_0_to_f32),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
