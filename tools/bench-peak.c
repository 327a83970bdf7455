/* sift bench peak: this machine's fp32 FMA rate and memory read bandwidth,
 * the denominators of every "fraction of peak" that sift prints.
 *
 * FMA: each thread runs a loop of independent vector FMAs (more chains than
 * FMA latency x ports, so the units never wait), on the widest ISA the CPU
 * has. Read: each thread streams its share of a buffer far larger than the
 * last-level cache with vector loads into several accumulators. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <sift/sift.h>

#include "bench-peak.h"
#include "commands.h"

#define FMA_ITERS 2000000
#define FMA_CHAINS 12

typedef struct {
  const float *buf;    /* [n] */
  gsize n;
  gint parts;
  double *sums;        /* [parts] keeps the loads alive */
} ReadJob;

#if defined(__x86_64__)
__attribute__ ((target ("avx512f,fma"))) static float
fma_loop_avx512 (float seed)
{
  __m512 acc[FMA_CHAINS], mul = _mm512_set1_ps (0.999999f), add = _mm512_set1_ps (seed);
  for (int i = 0; i < FMA_CHAINS; i++)
    acc[i] = _mm512_set1_ps ((float) i);
  for (int it = 0; it < FMA_ITERS; it++)
#pragma GCC unroll 16
    for (int i = 0; i < FMA_CHAINS; i++)
      acc[i] = _mm512_fmadd_ps (acc[i], mul, add);
  for (int i = 1; i < FMA_CHAINS; i++)
    acc[0] = _mm512_add_ps (acc[0], acc[i]);
  return _mm512_reduce_add_ps (acc[0]);
}

__attribute__ ((target ("avx2,fma"))) static float
fma_loop_avx2 (float seed)
{
  __m256 acc[FMA_CHAINS], mul = _mm256_set1_ps (0.999999f), add = _mm256_set1_ps (seed);
  for (int i = 0; i < FMA_CHAINS; i++)
    acc[i] = _mm256_set1_ps ((float) i);
  for (int it = 0; it < FMA_ITERS; it++)
#pragma GCC unroll 16
    for (int i = 0; i < FMA_CHAINS; i++)
      acc[i] = _mm256_fmadd_ps (acc[i], mul, add);
  float out[8];
  for (int i = 1; i < FMA_CHAINS; i++)
    acc[0] = _mm256_add_ps (acc[0], acc[i]);
  _mm256_storeu_ps (out, acc[0]);
  return out[0] + out[7];
}

__attribute__ ((target ("avx512f"))) static double
read_avx512 (const float *p, gsize n)
{
  __m512 a0 = _mm512_setzero_ps (), a1 = a0, a2 = a0, a3 = a0;
  gsize i = 0;
  for (; i + 64 <= n; i += 64)
    {
      a0 = _mm512_add_ps (a0, _mm512_load_ps (p + i));
      a1 = _mm512_add_ps (a1, _mm512_load_ps (p + i + 16));
      a2 = _mm512_add_ps (a2, _mm512_load_ps (p + i + 32));
      a3 = _mm512_add_ps (a3, _mm512_load_ps (p + i + 48));
    }
  return _mm512_reduce_add_ps (_mm512_add_ps (_mm512_add_ps (a0, a1), _mm512_add_ps (a2, a3)));
}

__attribute__ ((target ("avx2"))) static double
read_avx2 (const float *p, gsize n)
{
  __m256 a0 = _mm256_setzero_ps (), a1 = a0, a2 = a0, a3 = a0;
  gsize i = 0;
  for (; i + 32 <= n; i += 32)
    {
      a0 = _mm256_add_ps (a0, _mm256_load_ps (p + i));
      a1 = _mm256_add_ps (a1, _mm256_load_ps (p + i + 8));
      a2 = _mm256_add_ps (a2, _mm256_load_ps (p + i + 16));
      a3 = _mm256_add_ps (a3, _mm256_load_ps (p + i + 24));
    }
  float out[8];
  _mm256_storeu_ps (out, _mm256_add_ps (_mm256_add_ps (a0, a1), _mm256_add_ps (a2, a3)));
  return out[0] + out[7];
}
#endif

/* Lanes of one vector FMA on the ISA used (0: no vector FMA loop here). */
static int
fma_lanes (void)
{
#if defined(__x86_64__)
  switch (sift_isa_detect ())
    {
    case SIFT_ISA_AVX512: return 16;
    case SIFT_ISA_AVX2: return 8;
    default: break;
    }
#endif
  return 0;
}

static void
fma_body (gint64 begin, gint64 end, gint worker, gpointer data)
{
  (void) worker;
  float *sink = data;
  for (gint64 i = begin; i < end; i++)
    {
#if defined(__x86_64__)
      if (fma_lanes () == 16)
        sink[i] = fma_loop_avx512 ((float) i);
      else if (fma_lanes () == 8)
        sink[i] = fma_loop_avx2 ((float) i);
#endif
    }
}

static void
read_body (gint64 begin, gint64 end, gint worker, gpointer data)
{
  (void) worker;
  ReadJob *job = data;
  gsize chunk = job->n / (gsize) job->parts / 64 * 64;
  for (gint64 i = begin; i < end; i++)
    {
      const float *p = job->buf + (gsize) i * chunk;
      double s = 0;
#if defined(__x86_64__)
      if (fma_lanes () == 16)
        s = read_avx512 (p, chunk);
      else if (fma_lanes () == 8)
        s = read_avx2 (p, chunk);
      else
#endif
        for (gsize k = 0; k < chunk; k++)
          s += p[k];
      job->sums[i] = s;
    }
}

static int
cmp_double (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return x < y ? -1 : x > y;
}

double
sift_bench_median (double *x, gsize n)
{
  qsort (x, n, sizeof *x, cmp_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

double
sift_bench_cpu_seconds (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

void *
sift_bench_alloc (gsize bytes, gboolean small_pages)
{
  void *p = NULL;
  if (small_pages)
    {
      if (posix_memalign (&p, 64, MAX (bytes, 1)) != 0)
        p = NULL;
    }
  else
    p = sift_mem_alloc (bytes);
  if (p == NULL)
    g_error ("sift bench: out of memory (%" G_GSIZE_FORMAT " bytes)", bytes);
  return p;
}

void
sift_peak_measure (gint threads, gint repeats, gsize read_bytes, gboolean small_pages, SiftPeak *peak)
{
  gint saved = sift_parallel_n_threads ();
  sift_parallel_set_n_threads (threads);
  g_autofree double *fma = g_new (double, repeats), *bw = g_new (double, repeats);
  g_autofree float *sink = g_new0 (float, threads);
  int lanes = fma_lanes ();
  peak->isa = sift_isa_name (sift_isa_detect ());

  gsize n = read_bytes / sizeof (float) / 64 * 64;
  float *buf = sift_bench_alloc (n * sizeof (float), small_pages);
  for (gsize i = 0; i < n; i++)
    buf[i] = (float) (i & 1023);
  g_autofree double *sums = g_new0 (double, threads);
  ReadJob job = { buf, n, threads, sums };

  for (gint r = 0; r < repeats; r++)
    {
      gint64 t0 = g_get_monotonic_time ();
      sift_parallel_for (threads, 1, fma_body, sink);
      double s = (double) (g_get_monotonic_time () - t0) * 1e-6;
      fma[r] = lanes ? 2.0 * lanes * FMA_CHAINS * (double) FMA_ITERS * threads / s * 1e-9 : 0.0;

      t0 = g_get_monotonic_time ();
      sift_parallel_for (threads, 1, read_body, &job);
      s = (double) (g_get_monotonic_time () - t0) * 1e-6;
      gsize chunk = n / (gsize) threads / 64 * 64;
      bw[r] = (double) (chunk * (gsize) threads * sizeof (float)) / s * 1e-9;
    }
  peak->fma_gflops = sift_bench_median (fma, (gsize) repeats);
  peak->read_gbps = sift_bench_median (bw, (gsize) repeats);
  sift_mem_free (buf);
  sift_parallel_set_n_threads (saved);
}

int
sift_bench_peak (int argc, char **argv)
{
  gint threads = 2, repeats = 5, mib = 1024;
  gboolean small_pages = FALSE;
  GOptionEntry entries[] = {
    { "small-pages", 0, 0, G_OPTION_ARG_NONE, &small_pages,
      "Stream a buffer on 4 KiB pages (default: huge pages where the kernel allows)", NULL },
    { "threads", 't', 0, G_OPTION_ARG_INT, &threads, "Threads (default 2)", "N" },
    { "repeats", 'r', 0, G_OPTION_ARG_INT, &repeats, "Runs; the median is printed (default 5)", "N" },
    { "mib", 0, 0, G_OPTION_ARG_INT, &mib, "MiB streamed for the read bandwidth (default 1024)", "N" },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = g_option_context_new ("- fp32 FMA rate and memory read bandwidth");
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (ctx, &argc, &argv, &error))
    {
      fprintf (stderr, "sift bench peak: %s\n", error->message);
      return 2;
    }
  if (threads < 1 || threads > 1024 || repeats < 1 || repeats > 1000 || mib < 16)
    {
      fprintf (stderr, "sift bench peak: --threads must be 1..1024, --repeats 1..1000, --mib >= 16\n");
      return 2;
    }
  SiftPeak peak;
  sift_peak_measure (threads, repeats, (gsize) mib << 20, small_pages, &peak);
  printf ("threads %d, isa %s, median of %d runs\n", threads, peak.isa, repeats);
  printf ("fp32 FMA peak   %10.1f GFLOP/s\n", peak.fma_gflops);
  printf ("read bandwidth  %10.1f GB/s (%d MiB buffer)\n", peak.read_gbps, mib);
  return 0;
}
