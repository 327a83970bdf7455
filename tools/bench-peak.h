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
 * the last-level cache to measure memory). */
void sift_peak_measure (gint threads, gint repeats, gsize read_bytes, SiftPeak *peak);

/* Median of n doubles (sorts them). */
double sift_bench_median (double *x, gsize n);
