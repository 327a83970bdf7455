/* sift bench attention: prefill and decode attention against the machine's
 * peaks measured in the same run.
 *
 * Prefill: causal dense attention of L queries against L keys, 32 query
 * heads / 8 kv heads, head_dim 128, f16 K/V; GFLOP/s counts the matmuls only,
 * 4 * L * L * head_dim per query head, halved for causal (--non-causal:
 * every score, to compare with kernels that do not skip masked tiles).
 * Decode: one query row against L keys, same heads; GB/s counts the K and V
 * bytes read. The
 * decode is run with GQA group 4 (8 kv heads) and group 1 (32 kv heads): the
 * same rate per KV byte means the group's query heads share each K/V read. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <sift/sift.h>

#include "bench-peak.h"
#include "commands.h"

#define Q_HEADS 32
#define HEAD_DIM 128

typedef struct {
  float *q, *out, *lse;
  guint16 *k, *v;          /* [kv_heads][n_kv][HEAD_DIM] f16 */
  SiftView qv, ov, kv, vv;
} Problem;

static void
problem_init (Problem *p, gint64 n_q, gint64 n_kv, gint32 kv_heads, GRand *r)
{
  gsize nq = (gsize) (Q_HEADS * n_q * HEAD_DIM), nk = (gsize) (kv_heads * n_kv * HEAD_DIM);
  p->q = g_new (float, nq);
  p->out = g_new (float, nq);
  p->lse = g_new (float, (gsize) (Q_HEADS * n_q));
  p->k = g_new (guint16, nk);
  p->v = g_new (guint16, nk);
  for (gsize i = 0; i < nq; i++)
    p->q[i] = (float) g_rand_double_range (r, -1, 1);
  /* A few distinct f16 values are enough for timing and fill GBs fast. */
  guint16 pool[256];
  for (int i = 0; i < 256; i++)
    pool[i] = sift_f32_to_f16 ((float) g_rand_double_range (r, -1, 1));
  for (gsize i = 0; i < nk; i++)
    {
      p->k[i] = pool[(i * 7 + i / 131) & 255];
      p->v[i] = pool[(i * 13 + i / 97) & 255];
    }
  p->qv = sift_view_htd (p->q, SIFT_DTYPE_F32, Q_HEADS, n_q, HEAD_DIM);
  p->ov = sift_view_htd (p->out, SIFT_DTYPE_F32, Q_HEADS, n_q, HEAD_DIM);
  p->kv = sift_view_htd (p->k, SIFT_DTYPE_F16, kv_heads, n_kv, HEAD_DIM);
  p->vv = sift_view_htd (p->v, SIFT_DTYPE_F16, kv_heads, n_kv, HEAD_DIM);
}

static void
problem_clear (Problem *p)
{
  g_free (p->q);
  g_free (p->out);
  g_free (p->lse);
  g_free (p->k);
  g_free (p->v);
}

/* Median over `repeats` samples of the seconds per call, each sample
 * averaging `calls` calls; one warm-up call first. */
static double
time_calls (Problem *p, gboolean decode, gboolean causal, gint repeats, gint calls)
{
  SiftAttnOpts opts = { .causal = causal, .q_offset = p->kv.n_tokens - p->qv.n_tokens };
  g_autofree double *t = g_new (double, repeats);
  for (gint r = -1; r < repeats; r++)
    {
      gint64 t0 = g_get_monotonic_time ();
      for (gint c = 0; c < (r < 0 ? 1 : calls); c++)
        {
          g_autoptr (GError) error = NULL;
          gboolean ok = decode ? sift_attn_decode (&p->qv, &p->kv, &p->vv, &opts, &p->ov, p->lse, &error)
                               : sift_attn_dense (&p->qv, &p->kv, &p->vv, &opts, &p->ov, p->lse, &error);
          if (!ok)
            g_error ("attention failed: %s", error->message);
        }
      if (r >= 0)
        t[r] = (double) (g_get_monotonic_time () - t0) * 1e-6 / calls;
    }
  return sift_bench_median (t, (gsize) repeats);
}

/* Parses "4096,16384" (a "k" suffix multiplies by 1024). */
static gboolean
parse_lengths (const char *s, GArray *out, GError **error)
{
  g_auto (GStrv) parts = g_strsplit (s, ",", -1);
  for (int i = 0; parts[i] != NULL; i++)
    {
      char *end = NULL;
      gint64 v = g_ascii_strtoll (parts[i], &end, 10);
      if (end != parts[i] && (*end == 'k' || *end == 'K'))
        v *= 1024, end++;
      if (end == parts[i] || *end != '\0' || v < 1 || v > (1 << 24))
        {
          g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                       "length '%s' is not a token count in 1..16M", parts[i]);
          return FALSE;
        }
      g_array_append_val (out, v);
    }
  return TRUE;
}

int
sift_bench_attention (int argc, char **argv)
{
  gint threads = 2, repeats = 3, mib = 1024;
  gboolean full = FALSE;
  g_autofree char *lengths = NULL, *decode_lengths = NULL, *blocks = NULL;
  GOptionEntry entries[] = {
    { "threads", 't', 0, G_OPTION_ARG_INT, &threads, "Threads (default 2)", "N" },
    { "repeats", 'r', 0, G_OPTION_ARG_INT, &repeats, "Runs per figure; the median is printed (default 3)", "N" },
    { "lengths", 'l', 0, G_OPTION_ARG_STRING, &lengths, "Prefill lengths (default 4096,16384)", "L,..." },
    { "decode-lengths", 0, 0, G_OPTION_ARG_STRING, &decode_lengths,
      "Decode KV lengths (default 16k,128k)", "L,..." },
    { "mib", 0, 0, G_OPTION_ARG_INT, &mib, "MiB streamed for the peak read bandwidth (default 1024)", "N" },
    { "blocks", 0, 0, G_OPTION_ARG_STRING, &blocks,
      "Block sizes for the per-call figures (default 64,256,1024)", "B,..." },
    { "non-causal", 0, 0, G_OPTION_ARG_NONE, &full, "Prefill without the causal mask (all L x L scores)", NULL },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = g_option_context_new ("- prefill and decode attention against the measured peak");
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (GArray) pre = g_array_new (FALSE, FALSE, sizeof (gint64));
  g_autoptr (GArray) dec = g_array_new (FALSE, FALSE, sizeof (gint64));
  g_autoptr (GArray) blk = g_array_new (FALSE, FALSE, sizeof (gint64));
  if (!g_option_context_parse (ctx, &argc, &argv, &error)
      || !parse_lengths (lengths ? lengths : "4096,16384", pre, &error)
      || !parse_lengths (decode_lengths ? decode_lengths : "16k,128k", dec, &error)
      || !parse_lengths (blocks ? blocks : "64,256,1024", blk, &error))
    {
      fprintf (stderr, "sift bench attention: %s\n", error->message);
      return 2;
    }
  if (threads < 1 || threads > 1024 || repeats < 1 || repeats > 1000 || mib < 16)
    {
      fprintf (stderr, "sift bench attention: --threads must be 1..1024, --repeats 1..1000, --mib >= 16\n");
      return 2;
    }

  setvbuf (stdout, NULL, _IOLBF, 0); /* each figure as soon as it is measured */
  SiftPeak peak;
  sift_peak_measure (threads, MAX (repeats, 3), (gsize) mib << 20, &peak);
  sift_parallel_set_n_threads (threads);
  printf ("threads %d, kernels %s, median of %d runs\n", threads, sift_isa_name (sift_isa_active ()),
          repeats);
  printf ("peak: fp32 FMA %.1f GFLOP/s (%s), read %.1f GB/s\n\n", peak.fma_gflops, peak.isa,
          peak.read_gbps);

  g_autoptr (GRand) r = g_rand_new_with_seed (1);
  printf ("prefill  %s, %d q heads / 8 kv heads, head_dim %d, f16 K/V\n", full ? "non-causal" : "causal",
          Q_HEADS, HEAD_DIM);
  printf ("  %8s %10s %12s %10s\n", "tokens", "ms", "GFLOP/s", "of peak");
  for (guint i = 0; i < pre->len; i++)
    {
      gint64 L = g_array_index (pre, gint64, i);
      Problem p;
      problem_init (&p, L, L, 8, r);
      double s = time_calls (&p, FALSE, !full, repeats, 1);
      double flops = 4.0 * (double) L * (double) L * HEAD_DIM * Q_HEADS / (full ? 1.0 : 2.0);
      printf ("  %8" G_GINT64_FORMAT " %10.2f %12.1f %9.1f%%\n", L, s * 1e3, flops / s * 1e-9,
              100.0 * flops / s * 1e-9 / peak.fma_gflops);
      problem_clear (&p);
    }

  printf ("\ndecode   1 query row, %d q heads, head_dim %d, f16 K/V\n", Q_HEADS, HEAD_DIM);
  printf ("  %8s %6s %10s %12s %10s\n", "tokens", "group", "ms", "KV GB/s", "of read");
  for (guint i = 0; i < dec->len; i++)
    for (gint32 group = 4; group >= 1; group -= 3)
      {
        gint64 L = g_array_index (dec, gint64, i);
        Problem p;
        problem_init (&p, 1, L, Q_HEADS / group, r);
        double s = time_calls (&p, TRUE, TRUE, repeats, 1);
        double bytes = 2.0 * (double) L * (Q_HEADS / group) * HEAD_DIM * sizeof (guint16);
        printf ("  %8" G_GINT64_FORMAT " %6d %10.3f %12.1f %9.1f%%\n", L, group, s * 1e3,
                bytes / s * 1e-9, 100.0 * bytes / s * 1e-9 / peak.read_gbps);
        problem_clear (&p);
      }

  /* The engine calls the kernels block by block: per-call cost matters. */
  printf ("\nper block  %d q heads / 8 kv heads, f16 K/V: decode of 1 row, and a chunk of B\n"
          "           queries against the block (non-causal)\n", Q_HEADS);
  printf ("  %8s %12s %12s %12s %12s\n", "block", "decode us", "KV GB/s", "chunk us", "GFLOP/s");
  for (guint i = 0; i < blk->len; i++)
    {
      gint64 B = g_array_index (blk, gint64, i);
      Problem d, c;
      problem_init (&d, 1, B, 8, r);
      problem_init (&c, B, B, 8, r);
      gint calls = (gint) CLAMP ((1 << 22) / B, 1, 20000);
      double sd = time_calls (&d, TRUE, FALSE, repeats, calls);
      double sc = time_calls (&c, FALSE, FALSE, repeats, MAX (1, calls / (gint) B));
      double bytes = 2.0 * (double) B * 8 * HEAD_DIM * sizeof (guint16);
      double flops = 4.0 * (double) B * (double) B * HEAD_DIM * Q_HEADS;
      printf ("  %8" G_GINT64_FORMAT " %12.2f %12.1f %12.1f %12.1f\n", B, sd * 1e6, bytes / sd * 1e-9,
              sc * 1e6, flops / sc * 1e-9);
      problem_clear (&d);
      problem_clear (&c);
    }
  return 0;
}
