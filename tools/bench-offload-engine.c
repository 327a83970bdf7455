/* sift bench offload, sections 3 and 4 (bench-offload.c has the rest and
 * the options): what the engine adds over the dense kernels, and the GPU. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sift/cuda.h>
#include <sift/sift.h>

#include "bench-attention-cuda.h"
#include "bench-peak.h"
#include "sift-paths.h"

#include "cli.h"
#include "commands.h"
#include "bench-offload.h"


/* ---- 4. The GPU: offloaded decode with K/V in pinned host memory -------- */

typedef struct {
  double step;        /* median wall seconds of a decode step (all layers) */
  double bytes;       /* bytes loaded per step */
  double load, compute, stalled; /* event-timed seconds per step: copy stream, kernels, compute stream waiting */
  double density;
  double select, attend; /* host wall seconds per step in select_blocks, and from the validated selection
                          * to the output back on the host (a policy that selects; else 0) */
} GpuRun;

/* The host's share of a selecting policy's step: its select_blocks is
 * called through timed_select (a copy of its ops table), the runner's
 * observer marks the validated selection and the attention's end. */
static const SiftPolicyOps *timed_inner;
static SiftPolicyOps timed_ops;
static double timed_select_s, timed_attend_s, timed_mark;

static gboolean
timed_select (SiftPolicy *p, const SiftPolicyContext *ctx, const gint64 *available, gsize n, SiftSelection *sel,
              GError **error)
{
  double t0 = offload_now_s ();
  gboolean ok = timed_inner->select_blocks (p, ctx, available, n, sel, error);
  timed_select_s += offload_now_s () - t0;
  return ok;
}

static void
timed_selection (gpointer user, const SiftPolicyContext *ctx, const SiftSelection *sel)
{
  (void) user, (void) ctx, (void) sel;
  timed_mark = offload_now_s ();
}

static void
timed_attention (gpointer user, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  (void) user, (void) out, (void) lse;
  if (ctx->phase == SIFT_PHASE_DECODE && timed_mark > 0)
    timed_attend_s += offload_now_s () - timed_mark;
  timed_mark = 0;
}

/* Routes p's select_blocks through timed_select (p keeps the copy). */
static void
time_selects (SiftPolicy *p)
{
  timed_inner = p->ops;
  memcpy (&timed_ops, p->ops, MIN ((gsize) p->ops->struct_size, sizeof timed_ops));
  timed_ops.select_blocks = timed_select;
  p->ops = &timed_ops;
}

static int
cmp_seconds (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return (x > y) - (x < y);
}

/* Prefills `tokens` with a select-only prefill (the sink and the last
 * block), then times o->steps decode steps of `rows` rows with `decode`
 * (NULL: full), the KV offloaded (ring) or resident in device memory. */
static gboolean
gpu_run (const Opts *o, const SiftModelShape *shape, gint64 tokens, gint rows, gboolean resident, SiftPolicy *decode,
         GpuRun *out, GError **error)
{
  SiftStoreConfig sc = { SIFT_DTYPE_BF16, shape->n_kv_heads, shape->block_size, shape->head_dim, 0, NULL, FALSE,
                         FALSE };
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, error);
  if (store == NULL)
    return FALSE;
  SiftEngineConfig ec = { *shape, SIFT_DTYPE_BF16, o->slots, SIFT_PIPELINE_RING, 0, SIFT_DEVICE_CUDA };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, error);
  if (engine == NULL || !sift_engine_set_resident (engine, resident, error))
    return FALSE;
  g_autoptr (SiftPolicy) window = sift_policy_new (&offload_window_ops, NULL, shape, error);
  if (window == NULL)
    return FALSE;
  ((WindowPolicy *) window)->budget = 1;
  g_autofree SiftPolicy **pre = g_new (SiftPolicy *, shape->n_layers), **dec = g_new (SiftPolicy *, shape->n_layers);
  for (gint32 l = 0; l < shape->n_layers; l++)
    pre[l] = window, dec[l] = decode;
  g_autoptr (SiftModel) src = offload_pattern_new (shape);
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, src, pre, dec, error);
  if (runner == NULL || !sift_runner_prefill (runner, tokens, NULL, NULL, error)
      || !sift_runner_decode (runner, 1, NULL, NULL, error)) /* untimed: warm-up, Quest's first bounds */
    return FALSE;
  const SiftRunnerObserver marks = { .attention = timed_attention, .selection = timed_selection };
  if (decode != NULL)
    sift_runner_set_observer (runner, &marks, NULL);
  timed_select_s = timed_attend_s = timed_mark = 0;
  g_autofree double *wall = g_new (double, o->steps);
  SiftCounters a, b;
  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &a);
  for (gint i = 0; i < o->steps; i++)
    {
      double t0 = offload_now_s ();
      if (!sift_runner_decode (runner, rows, NULL, NULL, error))
        return FALSE;
      wall[i] = offload_now_s () - t0;
    }
  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &b);
  qsort (wall, (gsize) o->steps, sizeof (double), cmp_seconds);
  out->step = wall[o->steps / 2];
  out->bytes = (double) (b.bytes_loaded - a.bytes_loaded) / o->steps;
  out->load = (b.seconds_load - a.seconds_load) / o->steps;
  out->compute = (b.seconds_compute - a.seconds_compute) / o->steps;
  out->stalled = (b.seconds_stalled - a.seconds_stalled) / o->steps;
  out->select = timed_select_s / o->steps;
  out->attend = timed_attend_s / o->steps;
  guint64 avail = b.tokens_available - a.tokens_available;
  out->density = avail ? (double) (b.tokens_attended - a.tokens_attended) / (double) avail : 0.0;
  return TRUE;
}

static void
gpu_line (const char *what, const GpuRun *r, double copy)
{
  const double rate = r->bytes / r->step, plain = r->bytes / copy;
  printf ("  %-14s %9.3f %9.1f %9.2f %9.2f %7.2f %9.3f %9.3f %9.3f %7.2f %7.3f\n", what, r->step * 1e3,
          r->bytes / 1e6, rate / 1e9, plain / 1e9, rate / plain, copy * 1e3, r->compute * 1e3, r->stalled * 1e3,
          r->step / MAX (copy, r->compute), r->density);
}

/* GPU-resident decode (offload.resident: true): 1 layer, full attention,
 * 1 row, at each length of --resident-at, beside PyTorch SDPA's one-row
 * decode on the same shape measured in the same command. "attn" is the
 * engine's event-timed kernel time of a step (attention, its split merge
 * and the block table), "step" the wall time of the whole decode step
 * (the model's q, k, v, their upload, the output read back). */
static int
bench_gpu_resident (const Opts *o)
{
  const char *at = o->resident_at ? o->resident_at : "16384,32768,65536,131072";
  if (g_str_equal (at, "none"))
    return SIFT_EXIT_OK;
  g_autoptr (GArray) lengths = g_array_new (FALSE, FALSE, sizeof (gint64));
  g_auto (GStrv) parts = g_strsplit (at, ",", -1);
  for (char **p = parts; *p != NULL; p++)
    {
      gint64 L = g_ascii_strtoll (*p, NULL, 10);
      if (L < o->block)
        {
          fprintf (stderr, "sift bench offload: --resident-at: '%s' is not a length of at least one block\n", *p);
          return SIFT_EXIT_USAGE;
        }
      g_array_append_val (lengths, L);
    }
  g_autofree double *sdpa_ms = g_new (double, lengths->len);
  double copy_gbps = NAN;
  g_autofree char *why = NULL;
  const char *script = o->sdpa_script ? o->sdpa_script : SIFT_SOURCE_BENCH_DIR "/sdpa.py";
  gboolean have_sdpa = sift_bench_sdpa_decode (script, lengths, 9, &copy_gbps, sdpa_ms, &why);
  printf ("\nGPU-resident decode (offload.resident: true): 1 layer, 32/8 heads, head_dim 128, bf16, block %d, full, "
          "1 row, medians of %d steps\n", o->block, o->steps);
  if (have_sdpa)
    printf ("  PyTorch SDPA (bf16 q/k/v/out, 1 row) by %s, median of 9; device-to-device copy %.0f GB/s (read + write)\n",
            script, copy_gbps);
  else
    printf ("  PyTorch SDPA not measured: %s\n", why);
  printf ("  %8s %9s %9s %9s %9s %9s %9s %9s %8s\n", "tokens", "step us", "attn us", "KV GB/s", "SDPA us", "SDPA GB/s",
          "attn/SDPA", "step/SDPA", "of copy");
  SiftModelShape shape = { 1, 32, 8, 128, o->block, MAX (o->chunk, 4096), 0.0f };
  for (guint i = 0; i < lengths->len; i++)
    {
      const gint64 L = g_array_index (lengths, gint64, i);
      GpuRun r = { 0 };
      g_autoptr (GError) error = NULL;
      if (!gpu_run (o, &shape, L, 1, TRUE, NULL, &r, &error))
        return sift_cli_fail ("bench offload", error);
      if (r.bytes != 0)
        {
          fprintf (stderr, "sift bench offload: resident decode loaded %.0f bytes per step from the host store\n",
                   r.bytes);
          return 1;
        }
      const double kv = 2.0 * (double) L * 8 * 128 * 2; /* K and V bytes read per step */
      const double sdpa = sdpa_ms[i] * 1e-3;
      printf ("  %8" G_GINT64_FORMAT " %9.1f %9.1f %9.0f %9.1f %9.0f %8.2fx %8.2fx %7.0f%%\n", L, r.step * 1e6,
              r.compute * 1e6, kv / r.compute * 1e-9, sdpa * 1e6, kv / sdpa * 1e-9, sdpa / r.compute, sdpa / r.step,
              100.0 * kv / r.compute * 1e-9 / copy_gbps);
    }
  printf ("  attn/SDPA, step/SDPA: SDPA's time over sift's (above 1: sift faster); of copy: KV GB/s by attn time "
          "against the copy rate; 0 bytes loaded from the host per step (checked)\n");
  return SIFT_EXIT_OK;
}

int
bench_gpu (const Opts *o)
{
  g_autoptr (GError) error = NULL;
  if (!sift_cuda_init (&error))
    return sift_cli_fail ("bench offload", error);
  SiftModelShape shape = { o->layers, 32, 8, 128, o->block, MAX (o->chunk, 4096), 0.0f };
  printf ("offloaded decode on %s: %d layers, 32/8 heads, head_dim 128, bf16 stored and computed, block %d, "
          "%d slots, %" G_GINT64_FORMAT " tokens, %d steps of %d row(s), medians\n",
          sift_cuda_device_name (), o->layers, o->block, o->slots, o->tokens, o->steps, o->rows);
  SiftCliOptions cli = { 0 };
  g_autoptr (SiftRegistry) registry = sift_cli_registry (&cli);
  const SiftPolicyInfo *info = sift_registry_lookup (registry, "quest", &error);
  g_autoptr (SiftParams) params = info ? sift_params_new (info->ops->params, &error) : NULL;
  g_autofree char *budget = g_strdup_printf ("%d", o->budget);
  g_autoptr (SiftPolicy) quest = params && sift_params_set_text (params, "token_budget", budget, &error)
                                     && sift_params_set_text (params, "dense_layers", "[]", &error)
                                   ? sift_policy_new (info->ops, params, &shape, &error) : NULL;
  GpuRun full = { 0 }, q = { 0 };
  double copy_full = 0, copy_q = 0;
  if (quest != NULL)
    time_selects (quest);
  if (quest == NULL || !gpu_run (o, &shape, o->tokens, o->rows, FALSE, NULL, &full, &error)
      || !gpu_run (o, &shape, o->tokens, o->rows, FALSE, quest, &q, &error)
      || !sift_cuda_h2d_seconds ((gsize) full.bytes, 9, &copy_full, &error)
      || !sift_cuda_h2d_seconds ((gsize) MAX (q.bytes, 1), 9, &copy_q, &error))
    return sift_cli_fail ("bench offload", error);
  printf ("  %-14s %9s %9s %9s %9s %7s %9s %9s %9s %7s %7s\n", "decode", "ms/step", "MB/step", "GB/s", "copy GB/s",
          "ratio", "copy ms", "attn ms", "stall ms", "wall/mx", "density");
  gpu_line ("full", &full, copy_full);
  g_autofree char *name = g_strdup_printf ("quest %d", o->budget);
  gpu_line (name, &q, copy_q);
  printf ("  ratio: bytes moved per step / a plain pinned cudaMemcpyAsync of the same bytes (copy GB/s); "
          "wall/mx: wall / max(copy ms, attn ms)\n");
  printf ("  quest %d on the host per step (means): select_blocks %.3f ms, validated selection to output on the "
          "host %.3f ms, the rest %.3f ms (model q/k/v, offload, step mean less median)\n", o->budget, q.select * 1e3,
          q.attend * 1e3, (q.step - q.select - q.attend) * 1e3);
  printf ("  quest %d vs full: %.2fx per-token speed, %.4f of the bytes (budget / context %.4f)\n", o->budget,
          full.step / q.step, q.bytes / full.bytes, (double) o->budget / (double) o->tokens);
  return bench_gpu_resident (o);
}

/* ---- 3. What the engine adds over the dense kernels ---------------------- */

/* Contiguous copies of the pattern's q [tokens][q_heads][dim] and k, v
 * [kv_heads][tokens][dim] in the compute dtype: the engine's own block
 * layout (and the kernels' fastest), so the reference is the best case. */
typedef struct {
  float *q;
  void *k, *v;
  SiftDType dtype;
} Contig;

static void
contig_init (Contig *c, SiftModel *src, const SiftModelShape *s, gint64 n, SiftDType dtype)
{
  const gsize nk = (gsize) n * (gsize) s->n_kv_heads * (gsize) s->head_dim;
  c->q = g_new (float, (gsize) n * (gsize) s->n_q_heads * (gsize) s->head_dim);
  float *k = g_new (float, nk), *v = g_new (float, nk);
  float *kt = g_new (float, nk), *vt = g_new (float, nk);
  offload_pattern_qkv (src, 0, 0, n, c->q, kt, vt, NULL);
  const gsize d = (gsize) s->head_dim, H = (gsize) s->n_kv_heads;
  for (gsize h = 0; h < H; h++)
    for (gsize t = 0; t < (gsize) n; t++)
      {
        memcpy (k + (h * (gsize) n + t) * d, kt + (t * H + h) * d, d * sizeof (float));
        memcpy (v + (h * (gsize) n + t) * d, vt + (t * H + h) * d, d * sizeof (float));
      }
  g_free (kt);
  g_free (vt);
  c->dtype = dtype;
  /* The engine's stores and buffers are on huge pages (sift_mem_alloc):
   * so is the contiguous reference. */
  c->k = sift_mem_alloc (nk * sift_dtype_size (dtype));
  c->v = sift_mem_alloc (nk * sift_dtype_size (dtype));
  if (c->k == NULL || c->v == NULL)
    g_error ("sift bench offload: out of memory");
  sift_convert (k, SIFT_DTYPE_F32, c->k, dtype, nk);
  sift_convert (v, SIFT_DTYPE_F32, c->v, dtype, nk);
  g_free (k);
  g_free (v);
}

static void
contig_clear (Contig *c)
{
  g_free (c->q), sift_mem_free (c->k), sift_mem_free (c->v);
}

/* Seconds the engine spent in attention (kernels and merges) and stalled
 * on loads and stores, summed over layers, of one phase. */
static double
engine_secs (SiftEngine *e, SiftPhase ph)
{
  SiftCounters c;
  sift_engine_counters (e, -1, ph, &c);
  return c.seconds_compute + c.seconds_stalled;
}

/* One layer through the engine: dense decode, and dense prefill or a
 * prefill that only stores. */
typedef struct {
  SiftEngine *engine;
  SiftModel *source;
  SiftPolicy *fill;
  SiftRunner *runner;
} Bed;

static void
bed_clear (Bed *b)
{
  sift_runner_free (b->runner);
  sift_policy_free (b->fill);
  sift_model_free (b->source);
  sift_engine_free (b->engine);
}

static gboolean
bed_init (Bed *b, const Opts *o, SiftStore *store, SiftDType compute, gboolean copy, gboolean prefill_dense,
          GError **error)
{
  memset (b, 0, sizeof *b);
  SiftModelShape shape = { 1, o->q_heads, o->kv_heads, o->head_dim, o->block, o->chunk, 0 };
  SiftEngineConfig ec = { .shape = shape, .compute_dtype = compute, .n_slots = o->slots };
  b->engine = sift_engine_new (&ec, store, error);
  if (b->engine == NULL)
    return FALSE;
  sift_engine_set_force_copy (b->engine, copy);
  b->source = offload_pattern_new (&shape);
  b->fill = prefill_dense ? NULL : sift_policy_new (&offload_store_only_ops, NULL, &shape, NULL);
  SiftPolicy *pre[1] = { b->fill };
  b->runner = sift_runner_new (b->engine, b->source, pre, NULL, error);
  if (b->runner == NULL)
    {
      bed_clear (b);
      return FALSE;
    }
  return TRUE;
}

static void
overhead_line (const char *what, double engine, double kernel, const char *unit, double mult)
{
  printf ("  %-28s engine %9.3f %s, kernel %9.3f %s: %+6.1f%% (target <= +10%%)\n", what, engine * mult, unit,
          kernel * mult, unit, 100.0 * (engine / kernel - 1.0));
}

/* Dense prefill of n tokens through the engine against sift_attn_dense on
 * contiguous memory, alternating, best of `reps`. */
static gboolean
overhead_prefill (const Opts *o, SiftStore *store, SiftDType compute, gboolean copy, gint reps, GError **error)
{
  Bed bed;
  if (!bed_init (&bed, o, store, compute, copy, TRUE, error))
    return FALSE;
  SiftEngine *engine = bed.engine;
  SiftRunner *runner = bed.runner;
  const gint64 n = o->overhead_tokens;
  SiftModelShape shape = sift_engine_config (engine)->shape;
  Contig c;
  SiftModel *src = offload_pattern_new (&shape);
  contig_init (&c, src, &shape, n, compute);
  sift_model_free (src);
  g_autofree float *out = g_new (float, (gsize) n * shape.n_q_heads * shape.head_dim);
  g_autofree float *lse = g_new (float, (gsize) n * shape.n_q_heads);
  SiftView qv = sift_view_thd (c.q, SIFT_DTYPE_F32, n, shape.n_q_heads, shape.head_dim);
  SiftView kv = sift_view_htd (c.k, compute, shape.n_kv_heads, n, shape.head_dim);
  SiftView vv = sift_view_htd (c.v, compute, shape.n_kv_heads, n, shape.head_dim);
  SiftView ov = sift_view_thd (out, SIFT_DTYPE_F32, n, shape.n_q_heads, shape.head_dim);
  SiftAttnOpts causal = { .causal = TRUE };
  double best_e = 1e30, best_k = 1e30;
  gboolean ok = TRUE;
  for (gint r = 0; r < reps && ok; r++)
    {
      sift_runner_reset (runner);
      ok = sift_runner_prefill (runner, n, NULL, NULL, error);
      best_e = MIN (best_e, engine_secs (engine, SIFT_PHASE_PREFILL));
      double t0 = offload_now_s ();
      sift_attn_dense (&qv, &kv, &vv, &causal, &ov, lse, NULL);
      best_k = MIN (best_k, offload_now_s () - t0);
    }
  if (ok)
    {
      g_autofree char *what = g_strdup_printf ("prefill %" G_GINT64_FORMAT " (chunk %d)", n, shape.chunk_size);
      overhead_line (what, best_e, best_k, "s ", 1.0);
    }
  contig_clear (&c);
  bed_clear (&bed);
  return ok;
}

/* Dense decode after a prompt of n tokens (stored without attention):
 * each step through the engine, then sift_attn_decode over the same keys on
 * contiguous memory; best step of each. */
static gboolean
overhead_decode (const Opts *o, SiftStore *store, SiftDType compute, gboolean copy, gint64 n, gint steps,
                 GError **error)
{
  Bed bed;
  if (!bed_init (&bed, o, store, compute, copy, FALSE, error))
    return FALSE;
  SiftEngine *engine = bed.engine;
  SiftRunner *runner = bed.runner;
  SiftModelShape shape = sift_engine_config (engine)->shape;
  const gint64 total = n + steps;
  Contig c;
  SiftModel *src = offload_pattern_new (&shape);
  contig_init (&c, src, &shape, total, compute);
  sift_model_free (src);
  g_autofree float *o1 = g_new (float, (gsize) shape.n_q_heads * shape.head_dim);
  g_autofree float *lse = g_new (float, (gsize) shape.n_q_heads);
  const SiftView kall = sift_view_htd (c.k, compute, shape.n_kv_heads, total, shape.head_dim);
  const SiftView vall = sift_view_htd (c.v, compute, shape.n_kv_heads, total, shape.head_dim);
  double best_e = 1e30, best_k = 1e30;
  gboolean ok = sift_runner_prefill (runner, n, NULL, NULL, error);
  for (gint i = 0; i < steps && ok; i++)
    {
      double before = engine_secs (engine, SIFT_PHASE_DECODE);
      ok = sift_runner_decode (runner, 1, NULL, NULL, error);
      best_e = MIN (best_e, engine_secs (engine, SIFT_PHASE_DECODE) - before);
      const gint64 keys = n + i + 1;
      SiftView q1 = sift_view_thd (c.q + (gsize) (keys - 1) * shape.n_q_heads * shape.head_dim, SIFT_DTYPE_F32, 1,
                                   shape.n_q_heads, shape.head_dim);
      /* The first `keys` tokens of each head (the head stride stays the full length's). */
      SiftView k1 = sift_view_tokens (&kall, 0, keys), v1 = sift_view_tokens (&vall, 0, keys);
      SiftView ov = sift_view_thd (o1, SIFT_DTYPE_F32, 1, shape.n_q_heads, shape.head_dim);
      double t0 = offload_now_s ();
      sift_attn_decode (&q1, &k1, &v1, NULL, &ov, lse, NULL);
      best_k = MIN (best_k, offload_now_s () - t0);
    }
  if (ok)
    {
      g_autofree char *what = g_strdup_printf ("decode at %" G_GINT64_FORMAT, n);
      overhead_line (what, best_e, best_k, "ms", 1e3);
    }
  contig_clear (&c);
  bed_clear (&bed);
  return ok;
}

int
bench_overhead (const Opts *o, SiftDType stored, SiftDType compute)
{
  g_autoptr (GError) error = NULL;
  SiftStoreConfig sc = { stored, o->kv_heads, o->block, o->head_dim, 0, NULL, FALSE, FALSE };
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
  if (store == NULL)
    return sift_cli_fail ("bench offload", error);
  g_auto (GStrv) lengths = g_strsplit (o->decode_at, ",", -1);
  const gint steps = MAX (o->steps / 2, 4), reps = o->reps;
  printf ("\nEngine overhead, dense (no policy), 1 layer, %d/%d heads x %d, block %d, host store %s, compute %s,\n"
          "against the kernels on contiguous %s memory (engine: seconds in attention + stalled; best of %d prefills,"
          " best step of %d):\n",
          o->q_heads, o->kv_heads, o->head_dim, o->block, sift_dtype_name (stored), sift_dtype_name (compute),
          sift_dtype_name (compute), reps, steps);
  for (int copy = 0; copy < 2; copy++)
    {
      if (!copy && stored != compute)
        {
          printf (" zero-copy: not possible (stored %s, compute %s: every load converts)\n", sift_dtype_name (stored),
                  sift_dtype_name (compute));
          continue;
        }
      printf (" %s\n", copy ? "copying (offload.force_copy: true; every block copied into a ring slot)"
                            : "zero-copy (resident blocks read in place)");
      if (!overhead_prefill (o, store, compute, copy, reps, &error))
        return sift_cli_fail ("bench offload", error);
      for (char **l = lengths; *l != NULL; l++)
        if (!overhead_decode (o, store, compute, copy, g_ascii_strtoll (*l, NULL, 10), steps, &error))
          return sift_cli_fail ("bench offload", error);
    }
  return SIFT_EXIT_OK;
}
