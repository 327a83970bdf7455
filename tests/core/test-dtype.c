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

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_f16_roundtrip_exhaustive),
    cmocka_unit_test (test_f16_round_nearest_even),
    cmocka_unit_test (test_bf16),
    cmocka_unit_test (test_q8_0),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
