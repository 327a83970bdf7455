/* <sift/simd.h>: the header-only primitives on every ISA this CPU runs,
 * against libm and plain loops in double precision; the exported helpers
 * (score tile, per-row sparse attention) on every ISA against their scalar
 * references; top-k and lower bound against sorting and linear search. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sift/plugin.h>

#ifdef SIFT_SIMD_X86
static gboolean
cpu_has (SiftIsa isa)
{
  return sift_isa_detect () >= isa;
}

static SIFT_TARGET_AVX2 void
exp_avx2 (const float *x, float *e, float *e2)
{
  _mm256_storeu_ps (e, sift_exp_256 (_mm256_loadu_ps (x)));
  _mm256_storeu_ps (e2, sift_exp2_256 (_mm256_loadu_ps (x)));
}

static SIFT_TARGET_AVX512 void
exp_avx512 (const float *x, float *e, float *e2)
{
  for (int h = 0; h < 2; h++)
    {
      _mm256_storeu_ps (e + 8 * h, _mm512_castps512_ps256 (sift_exp_512 (_mm512_castps256_ps512 (_mm256_loadu_ps (x + 8 * h)))));
      _mm256_storeu_ps (e2 + 8 * h, _mm512_castps512_ps256 (sift_exp2_512 (_mm512_castps256_ps512 (_mm256_loadu_ps (x + 8 * h)))));
    }
}

/* Checks one batch of 16 inputs computed by fn against exp and exp2. */
static void
check_exp_batch (void (*fn) (const float *, float *, float *), int width, const float *x)
{
  float e[16], e2[16];
  for (int i = 0; i < 16; i += width)
    fn (x + i, e + i, e2 + i);
  for (int i = 0; i < 16; i++)
    {
      const double we = exp ((double) x[i]), we2 = exp2 ((double) x[i]);
      /* The one underflow rule: below 2^-126, -inf included, exactly 0. */
      if (x[i] < SIFT_EXP_MIN)
        assert_true (e[i] == 0.0f);
      else if (fabs (e[i] - we) > 3e-7 * we)
        fail_msg ("e^%.9g: got %.9g, want %.9g", (double) x[i], (double) e[i], we);
      if (x[i] < -126.0f)
        assert_true (e2[i] == 0.0f);
      else if (fabs (e2[i] - we2) > 3e-7 * we2)
        fail_msg ("2^%.9g: got %.9g, want %.9g", (double) x[i], (double) e2[i], we2);
    }
}

static void
test_exp (void **state)
{
  (void) state;
  GRand *r = g_rand_new_with_seed (5);
  void (*fns[2]) (const float *, float *, float *) = { exp_avx2, exp_avx512 };
  const int widths[2] = { 8, 16 };
  for (int k = 0; k < 2; k++)
    {
      if (!cpu_has (k == 0 ? SIFT_ISA_AVX2 : SIFT_ISA_AVX512))
        continue;
      for (int rep = 0; rep < 2000; rep++)
        {
          float x[16];
          for (int i = 0; i < 16; i++)
            x[i] = (float) g_rand_double_range (r, rep < 1000 ? -20.0 : -130.0, rep < 1000 ? 0.0 : 5.0);
          check_exp_batch (fns[k], widths[k], x);
        }
      const float edge[16] = { -INFINITY, -1e30f, -126.5f, -126.0f, -125.99f, -87.34f, -87.33f, -87.0f,
                               0.0f, -0.0f, 1e-8f, -1e-8f, 0.5f, -0.5f, 10.0f, -1000.0f };
      check_exp_batch (fns[k], widths[k], edge);
    }
  g_rand_free (r);
}

static SIFT_TARGET_AVX2 void
reduce_avx2 (const float *x, float *out)
{
  __m256 t[8];
  for (int i = 0; i < 8; i++)
    t[i] = _mm256_loadu_ps (x + 8 * i);
  out[0] = sift_hsum_256 (t[3]);
  out[1] = sift_hmax_256 (t[5]);
  _mm256_storeu_ps (out + 2, sift_hsum8x8_256 (t));
  out[10] = sift_dot_256 (x, x + 64, 61);
  float h[8];
  _mm256_storeu_ps (h, sift_load_bf16_256 ((const guint16 *) (x + 128)));
  out[11] = h[3];
}

static SIFT_TARGET_AVX512 void
reduce_avx512 (const float *x, float *out)
{
  __m512 t[16];
  for (int i = 0; i < 16; i++)
    t[i] = _mm512_loadu_ps (x + 16 * i);
  out[0] = sift_hsum_512 (t[3]);
  out[1] = sift_hmax_512 (t[5]);
  _mm512_storeu_ps (out + 2, sift_hsum16x16_512 (t));
  out[18] = sift_dot_512 (x, x + 64, 61);
  _mm256_storeu_ps (out + 19, sift_fold_512 (t[2]));
}

/* Sums, maxima, transposed sums and dot products against double loops. */
static void
test_reductions (void **state)
{
  (void) state;
  float x[256], out[32];
  for (int i = 0; i < 256; i++)
    x[i] = (float) sin (i * 0.7) * 3.0f;
  if (cpu_has (SIFT_ISA_AVX2))
    {
      reduce_avx2 (x, out);
      double s = 0, m = -INFINITY, dot = 0;
      for (int i = 0; i < 8; i++)
        s += x[24 + i], m = MAX (m, x[40 + i]);
      assert_true (fabs (out[0] - s) < 1e-5);
      assert_true (out[1] == (float) m);
      for (int c = 0; c < 8; c++)
        {
          double w = 0;
          for (int i = 0; i < 8; i++)
            w += x[8 * c + i];
          assert_true (fabs (out[2 + c] - w) < 1e-5);
        }
      for (int i = 0; i < 61; i++)
        dot += (double) x[i] * x[64 + i];
      assert_true (fabs (out[10] - dot) < 1e-4);
      guint16 b[2];
      memcpy (b, x + 128 + 1, sizeof b);
      guint32 u = (guint32) b[1] << 16;
      float want;
      memcpy (&want, &u, sizeof want);
      assert_true (memcmp (&out[11], &want, sizeof want) == 0);
    }
  if (cpu_has (SIFT_ISA_AVX512))
    {
      reduce_avx512 (x, out);
      double s = 0, m = -INFINITY, dot = 0;
      for (int i = 0; i < 16; i++)
        s += x[48 + i], m = MAX (m, x[80 + i]);
      assert_true (fabs (out[0] - s) < 1e-5);
      assert_true (out[1] == (float) m);
      for (int c = 0; c < 16; c++)
        {
          double w = 0;
          for (int i = 0; i < 16; i++)
            w += x[16 * c + i];
          assert_true (fabs (out[2 + c] - w) < 1e-5);
        }
      for (int i = 0; i < 61; i++)
        dot += (double) x[i] * x[64 + i];
      assert_true (fabs (out[18] - dot) < 1e-4);
      for (int i = 0; i < 8; i++)
        assert_true (fabs (out[19 + i] - ((double) x[32 + i] + x[40 + i])) < 1e-6);
    }
}

static __attribute__ ((target ("avx2,f16c"))) void
f16_avx2 (const guint16 *h, float *out)
{
  _mm256_storeu_ps (out, sift_load_f16_256 (h));
}

static SIFT_TARGET_AVX512 void
half_avx512 (const guint16 *h, float *f16, float *bf16)
{
  _mm512_storeu_ps (f16, sift_load_f16_512 (h));
  _mm512_storeu_ps (bf16, sift_load_bf16_512 (h));
}

/* The half loads against the scalar conversions, bit for bit (no NaN). */
static void
test_half_loads (void **state)
{
  (void) state;
  guint16 h[16];
  float f16[16], bf16[16];
  for (int rep = 0; rep < 1000; rep++)
    {
      for (int i = 0; i < 16; i++)
        {
          h[i] = (guint16) ((rep * 977 + i * 4099) & 0xffff);
          if ((h[i] & 0x7c00) == 0x7c00)
            h[i] &= 0xbfff; /* finite f16 */
          if ((h[i] & 0x7f80) == 0x7f80)
            h[i] &= 0xff7f; /* finite bf16 */
        }
      if (cpu_has (SIFT_ISA_AVX2))
        {
          f16_avx2 (h, f16);
          for (int i = 0; i < 8; i++)
            assert_true (f16[i] == sift_f16_to_f32 (h[i]));
        }
      if (cpu_has (SIFT_ISA_AVX512))
        {
          half_avx512 (h, f16, bf16);
          for (int i = 0; i < 16; i++)
            {
              assert_true (f16[i] == sift_f16_to_f32 (h[i]));
              assert_true (bf16[i] == sift_bf16_to_f32 (h[i]));
            }
        }
    }
}
#endif /* SIFT_SIMD_X86 */

/* sift_score_tile on every ISA the CPU has, against a double loop, odd
 * shapes included (tails of rows, columns and len). */
static void
test_score_tile (void **state)
{
  (void) state;
  const SiftIsa active = sift_isa_active ();
  GRand *r = g_rand_new_with_seed (7);
  for (SiftIsa isa = SIFT_ISA_SCALAR; isa <= SIFT_ISA_AVX512; isa++)
    {
      if (!sift_isa_force (isa))
        continue;
      const gint64 shapes[][3] = { { 1, 1, 1 }, { 4, 4, 16 }, { 7, 5, 33 }, { 9, 3, 128 }, { 13, 17, 64 } };
      for (gsize s = 0; s < G_N_ELEMENTS (shapes); s++)
        {
          const gint64 nr = shapes[s][0], nc = shapes[s][1];
          const gsize len = (gsize) shapes[s][2], rs = len + 3, cs = len + 5;
          g_autofree float *a = g_new (float, (gsize) nr * rs), *b = g_new (float, (gsize) nc * cs);
          g_autofree float *out = g_new (float, (gsize) (nr * nc));
          for (gsize i = 0; i < (gsize) nr * rs; i++)
            a[i] = (float) g_rand_double_range (r, -1, 1);
          for (gsize i = 0; i < (gsize) nc * cs; i++)
            b[i] = (float) g_rand_double_range (r, -1, 1);
          sift_score_tile (a, rs, nr, b, cs, nc, len, out);
          for (gint64 i = 0; i < nr; i++)
            for (gint64 j = 0; j < nc; j++)
              {
                double want = 0;
                for (gsize t = 0; t < len; t++)
                  want += (double) a[(gsize) i * rs + t] * b[(gsize) j * cs + t];
                if (fabs (out[i * nc + j] - want) > 1e-5 * MAX (1.0, sqrt ((double) len)))
                  fail_msg ("%s %" G_GINT64_FORMAT "x%" G_GINT64_FORMAT "x%zu: (%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                            ") got %g want %g",
                            sift_isa_name (isa), nr, nc, len, i, j, (double) out[i * nc + j], want);
              }
        }
    }
  sift_isa_force (active);
  g_rand_free (r);
}

/* sift_attend_row_sparse on every ISA against a double-precision softmax
 * over the same keys, in two calls (the state carries over), with repeats
 * and a batch that is not a multiple of 8. */
static void
test_row_sparse (void **state)
{
  (void) state;
  const SiftIsa active = sift_isa_active ();
  GRand *r = g_rand_new_with_seed (9);
  const gint32 dims[] = { 32, 64, 128, 40 };
  for (SiftIsa isa = SIFT_ISA_SCALAR; isa <= SIFT_ISA_AVX512; isa++)
    {
      if (!sift_isa_force (isa))
        continue;
      for (gsize di = 0; di < G_N_ELEMENTS (dims); di++)
        {
          const gint32 d = dims[di];
          const gint64 n_keys = 100, stride = d + 8;
          g_autofree float *k = g_new (float, n_keys * stride), *v = g_new (float, n_keys * stride);
          g_autofree float *q = g_new (float, d), *acc = g_new (float, d), *o = g_new (float, d);
          for (gint64 i = 0; i < n_keys * stride; i++)
            k[i] = (float) g_rand_double_range (r, -1, 1), v[i] = (float) g_rand_double_range (r, -1, 1);
          for (gint32 c = 0; c < d; c++)
            q[c] = (float) g_rand_double_range (r, -2, 2);
          gint32 idx[37];
          for (int x = 0; x < 37; x++)
            idx[x] = g_rand_int_range (r, 0, (gint32) n_keys);
          const float scale = 0.3f;
          SiftRowState st = { .acc = acc };
          sift_row_state_reset (&st, d);
          sift_attend_row_sparse (&st, q, d, scale, k, v, stride, idx, 20);
          sift_attend_row_sparse (&st, q, d, scale, k, v, stride, idx + 20, 17);
          float lse;
          sift_row_state_finish (&st, d, o, &lse);
          double s[37], m = -INFINITY, l = 0;
          for (int x = 0; x < 37; x++)
            {
              s[x] = 0;
              for (gint32 c = 0; c < d; c++)
                s[x] += (double) q[c] * k[idx[x] * stride + c];
              s[x] *= scale;
              m = MAX (m, s[x]);
            }
          for (int x = 0; x < 37; x++)
            l += exp (s[x] - m);
          assert_true (fabs (lse - (m + log (l))) < 1e-5);
          for (gint32 c = 0; c < d; c++)
            {
              double want = 0;
              for (int x = 0; x < 37; x++)
                want += exp (s[x] - m) / l * v[idx[x] * stride + c];
              if (fabs (o[c] - want) > 2e-6)
                fail_msg ("%s d %d: o[%d] got %g want %g", sift_isa_name (isa), d, c, (double) o[c], want);
            }
          /* Nothing attended: output 0 and lse -inf. */
          sift_row_state_reset (&st, d);
          sift_attend_row_sparse (&st, q, d, scale, k, v, stride, idx, 0);
          sift_row_state_finish (&st, d, o, &lse);
          assert_true (lse == -INFINITY && o[0] == 0.0f);
        }
    }
  sift_isa_force (active);
  g_rand_free (r);
}

static const float *sort_scores;

static int
cmp_rank (const void *pa, const void *pb)
{
  const gsize a = *(const gsize *) pa, b = *(const gsize *) pb;
  const float x = sort_scores[a], y = sort_scores[b];
  if (isnan (x) != isnan (y))
    return isnan (x) ? 1 : -1;
  if (!isnan (x) && x != y)
    return x > y ? -1 : 1;
  return (a > b) - (a < b);
}

/* sift_top_k against sorting: forced sinks and recent items, then the best
 * of the rest by score, ties by index, NaN last. */
static void
test_top_k (void **state)
{
  (void) state;
  GRand *r = g_rand_new_with_seed (11);
  for (int rep = 0; rep < 400; rep++)
    {
      const gsize n = (gsize) g_rand_int_range (r, 1, 300);
      const gsize budget = (gsize) g_rand_int_range (r, 0, (gint32) n + 5);
      const gsize sinks = (gsize) g_rand_int_range (r, 0, 6), recent = (gsize) g_rand_int_range (r, 0, 6);
      g_autofree float *score = g_new (float, n);
      for (gsize i = 0; i < n; i++)
        {
          const int kind = g_rand_int_range (r, 0, 20);
          score[i] = kind == 0 ? NAN : kind < 5 ? (float) g_rand_int_range (r, 0, 4) : (float) g_rand_double (r);
        }
      g_autofree guint8 *keep = g_new (guint8, n), *want = g_new0 (guint8, n);
      g_autofree gsize *order = g_new (gsize, n);
      gsize forced = 0, m = 0;
      for (gsize i = 0; i < n; i++)
        if (i < sinks || i + recent >= n)
          want[i] = 1, forced++;
        else
          order[m++] = i;
      sort_scores = score;
      qsort (order, m, sizeof (gsize), cmp_rank);
      gsize extra = budget > forced ? MIN (budget - forced, m) : 0;
      for (gsize j = 0; j < extra; j++)
        want[order[j]] = 1;
      assert_int_equal (sift_top_k (score, n, budget, sinks, recent, keep), forced + extra);
      assert_memory_equal (keep, want, n);
    }
  g_rand_free (r);
}

static void
test_lower_bound (void **state)
{
  (void) state;
  const gint64 a[] = { -5, 0, 0, 3, 7, 7, 7, 12 };
  for (gint64 x = -7; x <= 14; x++)
    {
      gsize want = 0;
      while (want < G_N_ELEMENTS (a) && a[want] < x)
        want++;
      assert_int_equal (sift_lower_bound (a, G_N_ELEMENTS (a), x), want);
    }
  assert_int_equal (sift_lower_bound (NULL, 0, 3), 0);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
#ifdef SIFT_SIMD_X86
    cmocka_unit_test (test_exp),
    cmocka_unit_test (test_reductions),
    cmocka_unit_test (test_half_loads),
#endif
    cmocka_unit_test (test_score_tile),
    cmocka_unit_test (test_row_sparse),
    cmocka_unit_test (test_top_k),
    cmocka_unit_test (test_lower_bound),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
