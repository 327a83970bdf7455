/* Helpers of the MInference vertical-slash tests (vs-helpers.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "vs-helpers.h"

/* The inner-loop paths this build and CPU have, scalar first. */
gboolean
have_avx2 (void)
{
#if defined(VS_HAVE_AVX2)
  __builtin_cpu_init ();
  return __builtin_cpu_supports ("avx2") && __builtin_cpu_supports ("fma");
#else
  return FALSE;
#endif
}

gboolean
have_avx512 (void)
{
#if defined(VS_HAVE_AVX512)
  __builtin_cpu_init ();
  return __builtin_cpu_supports ("avx512f") && __builtin_cpu_supports ("avx512bw")
         && __builtin_cpu_supports ("avx512vl") && __builtin_cpu_supports ("avx512dq");
#else
  return FALSE;
#endif
}

/* Forces the minference inner loops to isa; FALSE (test skipped) when absent. */
gboolean
use_isa (SiftIsa isa)
{
  if ((isa == SIFT_ISA_AVX2 && !have_avx2 ()) || (isa == SIFT_ISA_AVX512 && !have_avx512 ()))
    {
      print_message ("skipping %s: not built or not supported here\n", sift_isa_name (isa));
      return FALSE;
    }
  vs_set_isa (isa);
  return TRUE;
}

float *
random_buf (GRand *rng, gsize n, double amp)
{
  float *b = g_new (float, n);
  for (gsize i = 0; i < n; i++)
    b[i] = (float) g_rand_double_range (rng, -amp, amp);
  return b;
}


void
qkv_init (Qkv *t, guint32 seed, gint32 H, gint32 G, gint32 d, gint64 n, double amp)
{
  g_autoptr (GRand) rng = g_rand_new_with_seed (seed);
  *t = (Qkv) { H, G, d, n, NULL, NULL, NULL, { 0 }, { 0 }, { 0 } };
  t->q = random_buf (rng, (gsize) H * n * d, amp);
  t->k = random_buf (rng, (gsize) G * n * d, amp);
  t->v = random_buf (rng, (gsize) G * n * d, 1.0);
  t->qv = sift_view_htd (t->q, SIFT_DTYPE_F32, H, n, d);
  t->kv = sift_view_htd (t->k, SIFT_DTYPE_F32, G, n, d);
  t->vv = sift_view_htd (t->v, SIFT_DTYPE_F32, G, n, d);
}

void
qkv_clear (Qkv *t)
{
  g_free (t->q);
  g_free (t->k);
  g_free (t->v);
}

double
dot_d (const float *a, const float *b, gint32 d)
{
  double s = 0.0;
  for (gint32 c = 0; c < d; c++)
    s += (double) a[c] * b[c];
  return s;
}
