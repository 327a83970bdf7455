/* sift-bench-convert: sift_convert throughput per dtype pair and ISA
 * against memcpy of the same f32 data, in one run. Times are process CPU
 * time (robust on a shared machine); GB/s counts bytes read + written.
 * Usage: sift-bench-convert [elements] [repeats] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sift/sift.h>

static double
cpu_seconds (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

typedef struct {
  SiftDType src, dst;
} Pair;

int
main (int argc, char **argv)
{
  const gsize n = argc > 1 ? (gsize) g_ascii_strtoull (argv[1], NULL, 10) / 32 * 32 : (gsize) 1 << 16;
  const int reps = argc > 2 ? atoi (argv[2]) : 200;
  if (n == 0 || reps <= 0)
    {
      fprintf (stderr, "usage: %s [elements >= 32] [repeats >= 1]\n", argv[0]);
      return 2;
    }
  float *f = g_malloc (n * 4), *g = g_malloc (n * 4);
  void *narrow = g_malloc (sift_dtype_row_bytes (SIFT_DTYPE_F32, n));
  GRand *r = g_rand_new_with_seed (1);
  for (gsize i = 0; i < n; i++)
    f[i] = (float) g_rand_double_range (r, -4, 4);
  g_rand_free (r);

  double t0 = cpu_seconds ();
  for (int k = 0; k < reps; k++)
    {
      memcpy (g, f, n * 4);
      __asm__ volatile ("" ::"r"(g) : "memory");
    }
  const double t_memcpy = (cpu_seconds () - t0) / reps;
  printf ("elements %zu, repeats %d; memcpy f32: %.2f GB/s (%.3f ms)\n", n, reps, 8.0 * (double) n / t_memcpy / 1e9,
          t_memcpy * 1e3);
  printf ("%-13s %-7s %9s %12s %12s\n", "pair", "isa", "GB/s", "time/memcpy", "scalar/this");

  const Pair pairs[] = { { SIFT_DTYPE_F16, SIFT_DTYPE_F32 }, { SIFT_DTYPE_F32, SIFT_DTYPE_F16 },
                         { SIFT_DTYPE_BF16, SIFT_DTYPE_F32 }, { SIFT_DTYPE_F32, SIFT_DTYPE_BF16 },
                         { SIFT_DTYPE_Q8_0, SIFT_DTYPE_F32 } };
  const SiftIsa saved = sift_isa_active ();
  for (gsize p = 0; p < G_N_ELEMENTS (pairs); p++)
    {
      const SiftDType narrow_dt = pairs[p].src == SIFT_DTYPE_F32 ? pairs[p].dst : pairs[p].src;
      sift_convert (f, SIFT_DTYPE_F32, narrow, narrow_dt, n);
      const void *src = pairs[p].src == SIFT_DTYPE_F32 ? (void *) f : narrow;
      void *dst = pairs[p].dst == SIFT_DTYPE_F32 ? (void *) g : narrow;
      const double bytes = (double) (sift_dtype_row_bytes (pairs[p].src, n) + sift_dtype_row_bytes (pairs[p].dst, n));
      double t_scalar = 0;
      for (int isa = SIFT_ISA_SCALAR; isa <= (int) sift_isa_detect (); isa++)
        {
          sift_isa_force ((SiftIsa) isa);
          t0 = cpu_seconds ();
          for (int k = 0; k < reps; k++)
            {
              sift_convert (src, pairs[p].src, dst, pairs[p].dst, n);
              __asm__ volatile ("" ::"r"(dst) : "memory");
            }
          const double t = (cpu_seconds () - t0) / reps;
          if (isa == SIFT_ISA_SCALAR)
            t_scalar = t;
          char name[32];
          g_snprintf (name, sizeof name, "%s->%s", sift_dtype_name (pairs[p].src), sift_dtype_name (pairs[p].dst));
          printf ("%-13s %-7s %9.2f %12.2f %12.1f\n", name, sift_isa_name ((SiftIsa) isa), bytes / t / 1e9,
                  t / t_memcpy, t_scalar / t);
        }
    }
  sift_isa_force (saved);
  g_free (f);
  g_free (g);
  g_free (narrow);
  return 0;
}
