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
 * same rate per KV byte means the group's query heads share each K/V read.
 * Paged: the decode lengths and prefill lengths again with K/V in blocks of
 * --page tokens, through one sift_attn_paged call, against one call on the
 * contiguous view and against one call per block merged by sift_attn_merge
 * (the engine's block-by-block way). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sift/sift.h>

#include "bench-attention-cuda.h"
#include "bench-peak.h"
#include "sift-paths.h"
#include "commands.h"

#define Q_HEADS 32
#define HEAD_DIM 128

typedef struct {
  float *q, *out, *lse;
  guint16 *k, *v;          /* [kv_heads][n_kv][HEAD_DIM] f16 */
  SiftView qv, ov, kv, vv;
} Problem;

static gboolean small_pages; /* --small-pages: K/V and the peak's buffer on 4 KiB pages */

static void
problem_init (Problem *p, gint64 n_q, gint64 n_kv, gint32 kv_heads, GRand *r)
{
  gsize nq = (gsize) (Q_HEADS * n_q * HEAD_DIM), nk = (gsize) (kv_heads * n_kv * HEAD_DIM);
  p->q = g_new (float, nq);
  p->out = g_new (float, nq);
  p->lse = g_new (float, (gsize) (Q_HEADS * n_q));
  p->k = sift_bench_alloc (nk * sizeof (guint16), small_pages);
  p->v = sift_bench_alloc (nk * sizeof (guint16), small_pages);
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
  sift_mem_free (p->k);
  sift_mem_free (p->v);
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

/* K and V of a problem copied into blocks of `page` tokens, each block
 * [kv_heads][page][HEAD_DIM] on its own (the engine's layout), the last
 * one partial. */
typedef struct {
  guint16 *k, *v;       /* [n_blocks][kv_heads][page][HEAD_DIM] */
  SiftView *kb, *vb;    /* [n_blocks] */
  gsize n_blocks;
} Paged;

static void
paged_init (Paged *pg, const Problem *p, gint64 page)
{
  const gint64 n_kv = p->kv.n_tokens;
  const gint32 kv_heads = p->kv.n_heads;
  pg->n_blocks = (gsize) ((n_kv + page - 1) / page);
  gsize block_elems = (gsize) (kv_heads * page * HEAD_DIM);
  pg->k = sift_bench_alloc (pg->n_blocks * block_elems * sizeof (guint16), small_pages);
  pg->v = sift_bench_alloc (pg->n_blocks * block_elems * sizeof (guint16), small_pages);
  pg->kb = g_new (SiftView, pg->n_blocks);
  pg->vb = g_new (SiftView, pg->n_blocks);
  for (gsize b = 0; b < pg->n_blocks; b++)
    {
      gint64 t0 = (gint64) b * page, n = MIN (page, n_kv - t0);
      pg->kb[b] = sift_view_htd (pg->k + b * block_elems, SIFT_DTYPE_F16, kv_heads, page, HEAD_DIM);
      pg->vb[b] = sift_view_htd (pg->v + b * block_elems, SIFT_DTYPE_F16, kv_heads, page, HEAD_DIM);
      pg->kb[b].n_tokens = pg->vb[b].n_tokens = n;
      for (gint32 h = 0; h < kv_heads; h++)
        for (gint64 t = 0; t < n; t++)
          {
            memcpy (sift_view_row (&pg->kb[b], h, t), sift_view_row (&p->kv, h, t0 + t), HEAD_DIM * 2);
            memcpy (sift_view_row (&pg->vb[b], h, t), sift_view_row (&p->vv, h, t0 + t), HEAD_DIM * 2);
          }
    }
}

static void
paged_clear (Paged *pg)
{
  sift_mem_free (pg->k);
  sift_mem_free (pg->v);
  g_free (pg->kb);
  g_free (pg->vb);
}

enum { VIA_CONTIGUOUS, VIA_PAGED, VIA_PER_BLOCK };

/* One attention of p's queries against the keys of pg, `via` one call on
 * the contiguous view, one sift_attn_paged call, or one call per block
 * merged by sift_attn_merge (into part / part_lse, p's shape). */
static void
paged_call (Problem *p, const Paged *pg, int via, float *part, float *part_lse)
{
  const gint64 n_q = p->qv.n_tokens, n_kv = p->kv.n_tokens;
  SiftAttnOpts opts = { .causal = TRUE, .q_offset = n_kv - n_q };
  g_autoptr (GError) error = NULL;
  gboolean ok = TRUE;
  if (via == VIA_CONTIGUOUS)
    ok = n_q <= SIFT_ATTN_DECODE_MAX_ROWS
           ? sift_attn_decode (&p->qv, &p->kv, &p->vv, &opts, &p->ov, p->lse, &error)
           : sift_attn_dense (&p->qv, &p->kv, &p->vv, &opts, &p->ov, p->lse, &error);
  else if (via == VIA_PAGED)
    ok = sift_attn_paged (&p->qv, pg->kb, pg->vb, pg->n_blocks, &opts, &p->ov, p->lse, &error);
  else
    {
      SiftView pv = p->ov;
      pv.data = part;
      gint64 t0 = 0;
      for (gsize b = 0; ok && b < pg->n_blocks; t0 += pg->kb[b].n_tokens, b++)
        {
          /* The block's keys start at t0: the causal offset moves back by t0. */
          SiftAttnOpts bo = { .causal = TRUE, .q_offset = opts.q_offset - t0 };
          SiftView *dst = b == 0 ? &p->ov : &pv;
          float *dst_lse = b == 0 ? p->lse : part_lse;
          ok = n_q <= SIFT_ATTN_DECODE_MAX_ROWS
                 ? sift_attn_decode (&p->qv, &pg->kb[b], &pg->vb[b], &bo, dst, dst_lse, &error)
                 : sift_attn_dense (&p->qv, &pg->kb[b], &pg->vb[b], &bo, dst, dst_lse, &error);
          if (ok && b > 0)
            ok = sift_attn_merge (&p->ov, p->lse, &pv, part_lse, &error);
        }
    }
  if (!ok)
    g_error ("attention failed: %s", error->message);
}

/* Median seconds per paged_call over `repeats` runs, after one warm-up. */
static double
time_paged (Problem *p, const Paged *pg, int via, gint repeats)
{
  gsize n_out = (gsize) (p->qv.n_heads * p->qv.n_tokens);
  g_autofree float *part = g_new (float, n_out * HEAD_DIM);
  g_autofree float *part_lse = g_new (float, n_out);
  g_autofree double *t = g_new (double, repeats);
  for (gint r = -1; r < repeats; r++)
    {
      gint64 t0 = g_get_monotonic_time ();
      paged_call (p, pg, via, part, part_lse);
      if (r >= 0)
        t[r] = (double) (g_get_monotonic_time () - t0) * 1e-6;
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
  gint64 page = 128;
  gboolean full = FALSE;
  g_autofree char *lengths = NULL, *decode_lengths = NULL, *blocks = NULL;
  g_autofree char *device = NULL, *sdpa = NULL;
  GOptionEntry entries[] = {
    { "threads", 't', 0, G_OPTION_ARG_INT, &threads, "Threads (default 2)", "N" },
    { "repeats", 'r', 0, G_OPTION_ARG_INT, &repeats, "Runs per figure; the median is printed (default 3)", "N" },
    { "lengths", 'l', 0, G_OPTION_ARG_STRING, &lengths, "Prefill lengths (default 4096,16384)", "L,..." },
    { "decode-lengths", 0, 0, G_OPTION_ARG_STRING, &decode_lengths,
      "Decode KV lengths (default 16k,128k)", "L,..." },
    { "mib", 0, 0, G_OPTION_ARG_INT, &mib, "MiB streamed for the peak read bandwidth (default 1024)", "N" },
    { "blocks", 0, 0, G_OPTION_ARG_STRING, &blocks,
      "Block sizes for the per-call figures (default 64,256,1024)", "B,..." },
    { "page", 0, 0, G_OPTION_ARG_INT64, &page, "Tokens per block of the paged figures (default 128)", "N" },
    { "small-pages", 0, 0, G_OPTION_ARG_NONE, &small_pages,
      "K/V and the read-bandwidth buffer on 4 KiB pages (default: huge pages where the kernel allows)", NULL },
    { "non-causal", 0, 0, G_OPTION_ARG_NONE, &full, "Prefill without the causal mask (all L x L scores)", NULL },
    { "device", 0, 0, G_OPTION_ARG_STRING, &device,
      "cpu (default) or cuda: the GPU kernels beside PyTorch SDPA (lengths default 16k..128k)", "DEV" },
    { "sdpa-script", 0, 0, G_OPTION_ARG_FILENAME, &sdpa,
      "With --device cuda: the PyTorch script (default bench/sdpa.py of the source tree)", "FILE" },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = g_option_context_new ("- prefill and decode attention against the measured peak");
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (GArray) pre = g_array_new (FALSE, FALSE, sizeof (gint64));
  g_autoptr (GArray) dec = g_array_new (FALSE, FALSE, sizeof (gint64));
  g_autoptr (GArray) blk = g_array_new (FALSE, FALSE, sizeof (gint64));
  gboolean cuda = FALSE;
  if (!g_option_context_parse (ctx, &argc, &argv, &error))
    {
      fprintf (stderr, "sift bench attention: %s\n", error->message);
      return 2;
    }
  if (device != NULL && !(cuda = g_str_equal (device, "cuda")) && !g_str_equal (device, "cpu"))
    {
      fprintf (stderr, "sift bench attention: --device %s: expected cpu or cuda\n", device);
      return 2;
    }
  const char *gpu_lengths = "16k,32k,64k,128k";
  if (!parse_lengths (lengths ? lengths : cuda ? gpu_lengths : "4096,16384", pre, &error)
      || !parse_lengths (decode_lengths ? decode_lengths : cuda ? gpu_lengths : "16k,128k", dec, &error)
      || !parse_lengths (blocks ? blocks : "64,256,1024", blk, &error))
    {
      fprintf (stderr, "sift bench attention: %s\n", error->message);
      return 2;
    }
  if (threads < 1 || threads > 1024 || repeats < 1 || repeats > 1000 || mib < 16 || page < 1
      || page > (1 << 24))
    {
      fprintf (stderr, "sift bench attention: --threads must be 1..1024, --repeats 1..1000, --mib >= 16,"
               " --page 1..16M\n");
      return 2;
    }

  if (cuda)
    return sift_bench_attention_cuda (pre, dec, repeats, sdpa ? sdpa : SIFT_SOURCE_BENCH_DIR "/sdpa.py");

  setvbuf (stdout, NULL, _IOLBF, 0); /* each figure as soon as it is measured */
  SiftPeak peak;
  sift_peak_measure (threads, MAX (repeats, 3), (gsize) mib << 20, small_pages, &peak);
  sift_parallel_set_n_threads (threads);
  printf ("threads %d, kernels %s, median of %d runs\n", threads, sift_isa_name (sift_isa_active ()),
          repeats);
  printf ("peak: fp32 FMA %.1f GFLOP/s (%s), read %.1f GB/s; buffers on %s\n\n", peak.fma_gflops, peak.isa,
          peak.read_gbps, small_pages ? "4 KiB pages" : "huge pages where the kernel allows");

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

  /* Keys in blocks of `page` tokens: one sift_attn_paged call against one
   * call on a contiguous view, and against a call per block + merge. */
  printf ("\npaged    %d q heads / 8 kv heads, f16 K/V in blocks of %" G_GINT64_FORMAT
          " tokens, causal: ms per attention\n", Q_HEADS, page);
  printf ("  %-8s %8s %12s %12s %12s %8s %10s\n", "", "tokens", "contiguous", "paged", "per block",
          "paged/c", "blocks/c");
  for (guint i = 0; i < dec->len + pre->len; i++)
    {
      gboolean decode = i < dec->len;
      gint64 L = decode ? g_array_index (dec, gint64, i) : g_array_index (pre, gint64, i - dec->len);
      Problem p;
      Paged pg;
      problem_init (&p, decode ? 1 : L, L, 8, r);
      paged_init (&pg, &p, page);
      double sc = time_paged (&p, &pg, VIA_CONTIGUOUS, repeats);
      double sp = time_paged (&p, &pg, VIA_PAGED, repeats);
      double sb = time_paged (&p, &pg, VIA_PER_BLOCK, repeats);
      printf ("  %-8s %8" G_GINT64_FORMAT " %12.3f %12.3f %12.3f %7.2fx %9.2fx\n",
              decode ? "decode" : "prefill", L, sc * 1e3, sp * 1e3, sb * 1e3, sp / sc, sb / sc);
      paged_clear (&pg);
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
