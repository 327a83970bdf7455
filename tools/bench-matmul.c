/* sift-bench-matmul: model/llama's matmul (y = W x over n_tok tokens) per
 * tensor type and ISA, in one run: wall and process CPU seconds per product
 * and GFLOP/s (2 n_in n_out n_tok per product, on wall time), so kernel
 * changes can be timed without a whole model.
 * Usage: sift-bench-matmul [n_in] [n_out] [n_tok] [repeats] [TYPE,...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sift/parallel.h>

#include "gguf-writer.h"
#include "matmul.h"

static double
seconds (clockid_t clock)
{
  struct timespec ts;
  clock_gettime (clock, &ts);
  return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

int
main (int argc, char **argv)
{
  const gint64 n_in = argc > 1 ? g_ascii_strtoll (argv[1], NULL, 10) : 2048;
  const gint64 n_out = argc > 2 ? g_ascii_strtoll (argv[2], NULL, 10) : 2048;
  const gint64 n_tok = argc > 3 ? g_ascii_strtoll (argv[3], NULL, 10) : 512;
  const int reps = argc > 4 ? atoi (argv[4]) : 3;
  const char *types = argc > 5 ? argv[5] : "F16,Q8_0,Q4_K";
  if (n_in <= 0 || n_in % 256 != 0 || n_out <= 0 || n_tok <= 0 || reps <= 0)
    {
      fprintf (stderr, "usage: %s [n_in: multiple of 256] [n_out] [n_tok] [repeats] [TYPE,...]\n", argv[0]);
      return 2;
    }
  GRand *r = g_rand_new_with_seed (1);
  float *w = g_new (float, n_in * n_out), *x = g_new (float, n_in * n_tok), *y = g_new (float, n_out * n_tok);
  for (gint64 i = 0; i < n_in * n_out; i++)
    w[i] = (float) g_rand_double_range (r, -0.05, 0.05);
  for (gint64 i = 0; i < n_in * n_tok; i++)
    x[i] = (float) g_rand_double_range (r, -1, 1);
  g_rand_free (r);
  printf ("n_in %" G_GINT64_FORMAT " n_out %" G_GINT64_FORMAT " n_tok %" G_GINT64_FORMAT ", %d threads, median of %d\n",
          n_in, n_out, n_tok, sift_parallel_n_threads (), reps);
  g_auto (GStrv) names = g_strsplit (types, ",", -1);
  for (char **name = names; *name != NULL; name++)
    {
      GgufTensorType type = GGUF_TENSOR_TYPE_COUNT;
      for (int t = 0; t < GGUF_TENSOR_TYPE_COUNT; t++)
        if (gguf_tensor_type_name (t) != NULL && g_ascii_strcasecmp (*name, gguf_tensor_type_name (t)) == 0)
          type = t;
      if (type == GGUF_TENSOR_TYPE_COUNT)
        {
          fprintf (stderr, "%s: unknown type '%s'\n", argv[0], *name);
          return 2;
        }
      gsize rb = (gsize) (n_in / gguf_tensor_type_block (type)) * gguf_tensor_type_block_bytes (type);
      guint8 *q = g_malloc (rb * (gsize) n_out);
      for (gint64 o = 0; o < n_out; o++)
        gguf_quantize_row (type, w + o * n_in, q + (gsize) o * rb, (gsize) n_in);
      LlamaMat rows, x16;
      llama_mat_init (&rows, type, n_in, n_out, q);
      guint8 *q16 = NULL;
      for (SiftIsa isa = SIFT_ISA_AVX2; isa <= SIFT_ISA_AVX512; isa++)
        {
          const LlamaMatmulKernels *k = llama_matmul_kernels_get (isa);
          if (k == NULL)
            continue;
          /* As the model runs it: x16 groups where k has kernels for them. */
          const LlamaMat *mp = &rows;
          if (llama_mat_can_repack (&rows, k))
            {
              if (q16 == NULL)
                {
                  q16 = g_malloc (rb * (gsize) n_out);
                  llama_mat_repack_groups (&rows, 0, n_out / 16, q16);
                }
              x16 = rows;
              x16.data = q16;
              x16.x16 = TRUE;
              mp = &x16;
            }
          const LlamaMat m = *mp;
          llama_matmul_with (k, &m, x, y, n_tok); /* warm: weights in cache as far as they fit */
          double *wall = g_new (double, reps), *cpu = g_new (double, reps);
          for (int i = 0; i < reps; i++)
            {
              double w0 = seconds (CLOCK_MONOTONIC), c0 = seconds (CLOCK_PROCESS_CPUTIME_ID);
              llama_matmul_with (k, &m, x, y, n_tok);
              wall[i] = seconds (CLOCK_MONOTONIC) - w0;
              cpu[i] = seconds (CLOCK_PROCESS_CPUTIME_ID) - c0;
            }
          /* medians by insertion sort: reps is small */
          for (int i = 1; i < reps; i++)
            for (int j = i; j > 0 && wall[j] < wall[j - 1]; j--)
              {
                double tw = wall[j]; wall[j] = wall[j - 1]; wall[j - 1] = tw;
              }
          for (int i = 1; i < reps; i++)
            for (int j = i; j > 0 && cpu[j] < cpu[j - 1]; j--)
              {
                double tc = cpu[j]; cpu[j] = cpu[j - 1]; cpu[j - 1] = tc;
              }
          double flop = 2.0 * (double) n_in * (double) n_out * (double) n_tok;
          printf ("%-5s %-12s wall %8.4f s  cpu %8.4f s  %7.1f GFLOP/s wall  %7.1f GFLOP/cpu-s\n",
                  gguf_tensor_type_name (type), k->name, wall[reps / 2], cpu[reps / 2], flop / wall[reps / 2] * 1e-9,
                  flop / cpu[reps / 2] * 1e-9);
          g_free (wall);
          g_free (cpu);
        }
      g_free (q16);
      g_free (q);
    }
  g_free (w);
  g_free (x);
  g_free (y);
  return 0;
}
