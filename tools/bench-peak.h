/* Machine peaks measured by `sift bench peak`, shared with the benchmarks
 * that report fractions of them. */
#pragma once

#include <glib.h>

typedef struct {
  double fma_gflops;   /* fp32 FMA rate, GFLOP/s (2 per FMA lane) */
  double read_gbps;    /* memory read bandwidth, GB/s (1e9 bytes) */
  const char *isa;     /* the vector ISA the FMA loop used */
} SiftPeak;

/* Medians over `repeats` runs on `threads` threads (the pool's threads).
 * `read_bytes` is the buffer streamed for the bandwidth (much larger than
 * the last-level cache to measure memory), allocated by sift_bench_alloc
 * with small_pages. */
void sift_peak_measure (gint threads, gint repeats, gsize read_bytes, gboolean small_pages, SiftPeak *peak);

/* A benchmark buffer: sift_mem_alloc's (huge pages from 2 MiB on, as the
 * engine's stores and buffers use), or with small_pages 64-byte aligned
 * memory on the kernel's default 4 KiB pages, for an A/B. Aborts when out
 * of memory; free with sift_mem_free. */
void *sift_bench_alloc (gsize bytes, gboolean small_pages);

/* CPU seconds of every thread of this process so far: on a shared
 * machine the cost that other processes do not inflate, where they do
 * inflate the wall clock. */
double sift_bench_cpu_seconds (void);

/* Median of n doubles (sorts them). */
double sift_bench_median (double *x, gsize n);
