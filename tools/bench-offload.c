/* sift bench offload — the OffloadEngine's copy worker and pipelines.
 *
 * 1. Store throughput: the copy worker loading every block of a layer
 *    through the ring (no compute) from the host store against memcpy of the
 *    same bytes, and from the file store against a plain sequential read()
 *    of the same file, measured in the same run (page cache dropped before
 *    each file pass unless --warm).
 * 2. Pipeline efficiency = wall / max(load time, compute time) for prefill
 *    and decode at --tokens, loads overlapping compute through the ring (or
 *    the cross-layer pipeline for decode).
 * 3. What the engine adds: dense prefill and decode through the engine
 *    against the dense kernels on contiguous memory.
 * --device cuda: offloaded decode on the GPU instead (offload.device cuda:
 *    K/V in pinned host memory, the ring's slots on the GPU), 32 q / 8 kv
 *    heads, head_dim 128, bf16: bytes moved per second beside a plain
 *    pinned cudaMemcpyAsync of the same bytes, pipeline efficiency
 *    wall / max(plain copy, attention), and Quest (--budget) against
 *    offloaded full decode.
 * Figures are indicative; see docs/benchmarks.md. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sift/cuda.h>
#include <sift/sift.h>

#include "bench-peak.h"

#include "cli.h"
#include "commands.h"
#include "bench-offload.h"


/* ---- A cheap deterministic source (the benchmark measures the engine) --- */

gboolean
offload_pattern_qkv (SiftModel *src, gint32 layer, gint64 pos0, gint64 n, float *q, float *k, float *v, GError **error)
{
  (void) error;
  const SiftModelShape *s = &src->shape;
  const gint64 nq = (gint64) s->n_q_heads * s->head_dim, nk = (gint64) s->n_kv_heads * s->head_dim;
  for (gint64 t = 0; t < n; t++)
    {
      guint32 h = (guint32) ((pos0 + t) * 2654435761u) ^ (guint32) (layer * 40503);
      for (gint64 i = 0; i < nq; i++)
        q[t * nq + i] = (float) ((h + (guint32) i * 2246822519u) >> 22) / 512.0f - 1.0f;
      for (gint64 i = 0; i < nk; i++)
        {
          k[t * nk + i] = (float) ((h + (guint32) i * 3266489917u) >> 22) / 512.0f - 1.0f;
          v[t * nk + i] = (float) ((h + (guint32) i * 668265263u) >> 22) / 512.0f - 1.0f;
        }
    }
  return TRUE;
}

static const SiftModelClass pattern_class = SIFT_MODEL_POSITIONAL_CLASS ("pattern", offload_pattern_qkv, NULL);

SiftModel *
offload_pattern_new (const SiftModelShape *shape)
{
  SiftModel *s = g_new0 (SiftModel, 1);
  gboolean ok = sift_model_init (s, &pattern_class, shape, 0, NULL);
  g_assert (ok);
  return s;
}

/* ---- Bench policies ------------------------------------------------------ */

/* Prefill that only stores (to fill a store fast). */
static gboolean
no_compute (SiftPolicy *self, const SiftPolicyContext *ctx, SiftView *out, float *lse, GError **error)
{
  (void) self, (void) error;
  for (gint32 h = 0; h < out->n_heads; h++)
    for (gint64 t = 0; t < out->n_tokens; t++)
      {
        memset (sift_view_row (out, h, t), 0, sizeof (float) * (gsize) out->head_dim);
        lse[h * ctx->n_q + t] = -INFINITY;
      }
  return TRUE;
}

const SiftPolicyOps offload_store_only_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "bench-store-only",
  .version = "1",
  .description = "stores without attention",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL,
  .instance_size = sizeof (SiftPolicy),
  .compute_chunked_prefill = no_compute,
};


static gboolean
window_select (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *avail, gsize n, SiftSelection *sel,
               GError **error)
{
  (void) ctx, (void) error;
  gint budget = ((WindowPolicy *) self)->budget;
  for (gsize i = 0; i < n; i++)
    if (budget <= 0 || i == 0 || i + (gsize) budget >= n)
      sift_selection_add (sel, avail[i]);
  return TRUE;
}

const SiftPolicyOps offload_window_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "bench-window",
  .version = "1",
  .description = "sink block and the last blocks",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .instance_size = sizeof (WindowPolicy),
  .select_blocks = window_select,
};

/* Wall time of the attention pipelines: from the call's validated
 * selection (or the previous layer's attention) to its attention. */
typedef struct {
  gint64 mark;
  gint64 wall_us;
} Wall;

static void
on_selection (gpointer data, const SiftPolicyContext *ctx, const SiftSelection *sel)
{
  (void) ctx, (void) sel;
  ((Wall *) data)->mark = g_get_monotonic_time ();
}

static void
on_attention (gpointer data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  (void) ctx, (void) out, (void) lse;
  Wall *w = data;
  gint64 now = g_get_monotonic_time ();
  w->wall_us += now - w->mark;
  w->mark = now;
}

static const SiftRunnerObserver wall_observer = { on_attention, on_selection };

/* ---- Helpers ------------------------------------------------------------- */

double
offload_now_s (void)
{
  return (double) g_get_monotonic_time () / G_USEC_PER_SEC;
}

static void
drop_cache (const char *path)
{
  int fd = open (path, O_RDONLY);
  if (fd < 0)
    return;
  fdatasync (fd);
  posix_fadvise (fd, 0, 0, POSIX_FADV_DONTNEED);
  close (fd);
}

/* Loads every stored block of layer 0 through the ring, n_slots in flight. */
static gboolean
ring_all (SiftEngine *e, gint64 n_blocks, double *secs, GError **error)
{
  const gint32 ns = sift_engine_n_slots (e);
  double t0 = offload_now_s ();
  gint64 queued = 0;
  for (; queued < MIN (ns, n_blocks); queued++)
    if (!sift_engine_load_block (e, 0, queued, (gint32) queued, SIFT_LOAD_KV, error))
      return FALSE;
  for (gint64 done = 0; done < n_blocks; done++)
    {
      gint32 slot = (gint32) (done % ns);
      if (!sift_engine_wait_slot (e, slot, error))
        return FALSE;
      sift_engine_slot_done (e, slot);
      if (queued < n_blocks && !sift_engine_load_block (e, 0, queued++, slot, SIFT_LOAD_KV, error))
        return FALSE;
    }
  *secs = offload_now_s () - t0;
  return TRUE;
}

/* ---- 1. Store throughput ------------------------------------------------- */

static int
bench_stores (const Opts *o, SiftDType stored, SiftDType compute)
{
  SiftModelShape shape = { 1, o->store_kv_heads, o->store_kv_heads, o->store_head_dim, o->store_block,
                           o->store_block, 0 };
  const gint64 n_blocks = o->store_blocks;
  SiftStoreConfig sc = { stored, shape.n_kv_heads, shape.block_size, shape.head_dim, 0, o->path, FALSE, o->direct };
  g_autoptr (SiftStore) probe = sift_store_host_new (&sc, NULL);
  const gsize bb = sift_store_block_bytes (probe);
  const double mib = (double) bb * (double) n_blocks / (1024.0 * 1024.0);
  printf ("Store throughput: %" G_GINT64_FORMAT " blocks of %.2f MiB (%s stored, %s compute), %d slots\n", n_blocks,
          (double) bb / (1024.0 * 1024.0), sift_dtype_name (stored), sift_dtype_name (compute), o->slots);

  /* memcpy of the same bytes: one source buffer per block, into slot-sized
   * destinations; each reference pass alternates with an engine pass so
   * both see the same machine load, and the best of each is kept. */
  guint8 **src = g_new (guint8 *, n_blocks);
  for (gint64 i = 0; i < n_blocks; i++)
    {
      src[i] = sift_mem_alloc (bb); /* as the host store's blocks */
      if (src[i] == NULL)
        g_error ("sift bench offload: out of memory");
      memset (src[i], (int) i, bb);
    }
  g_autofree guint8 *dst = g_malloc0 (bb * (gsize) o->slots);
  void *buf = NULL;
  const gsize stride = o->direct ? (bb + 4095) / 4096 * 4096 : bb;
  if (posix_memalign (&buf, 4096, stride) != 0)
    return SIFT_EXIT_FAILED;

  int status = SIFT_EXIT_OK;
  g_auto (GStrv) which = g_strsplit (o->stores, ",", -1);
  for (char **w = which; *w != NULL && status == SIFT_EXIT_OK; w++)
    {
      gboolean file = strcmp (*w, "file") == 0;
      if (!file && strcmp (*w, "host") != 0)
        {
          fprintf (stderr, "sift bench offload: --stores: unknown store '%s' (host, file)\n", *w);
          status = SIFT_EXIT_USAGE;
          break;
        }
      g_autoptr (GError) error = NULL;
      g_autoptr (SiftStore) store = file ? sift_store_file_new (&sc, &error) : sift_store_host_new (&sc, &error);
      SiftEngineConfig ec = { shape, compute, o->slots, SIFT_PIPELINE_RING, 0, SIFT_DEVICE_CPU };
      g_autoptr (SiftEngine) engine = store ? sift_engine_new (&ec, store, &error) : NULL;
      if (engine != NULL) /* the copy worker is what is measured */
        sift_engine_set_force_copy (engine, TRUE);
      g_autoptr (SiftModel) source = offload_pattern_new (&shape);
      g_autoptr (SiftPolicy) fill = sift_policy_new (&offload_store_only_ops, NULL, &shape, NULL);
      SiftPolicy *pre[1] = { fill };
      g_autoptr (SiftRunner) runner = engine ? sift_runner_new (engine, source, pre, NULL, &error) : NULL;
      if (runner == NULL || !sift_runner_prefill (runner, n_blocks * shape.block_size, NULL, NULL, &error))
        {
          status = sift_cli_fail ("bench offload", error);
          break;
        }
      double best_ref = 1e30, best = 1e30;
      for (int rep = 0; rep < 3 && status == SIFT_EXIT_OK; rep++)
        {
          double t0;
          if (!file)
            {
              t0 = offload_now_s ();
              for (gint64 i = 0; i < n_blocks; i++)
                memcpy (dst + (gsize) (i % o->slots) * bb, src[i], bb);
              best_ref = MIN (best_ref, offload_now_s () - t0);
            }
          else
            {
              /* The plain sequential read of the same file. */
              if (!o->warm)
                drop_cache (o->path);
              int fd = open (o->path, O_RDONLY | (o->direct ? O_DIRECT : 0));
              if (fd < 0)
                {
                  fprintf (stderr, "sift bench offload: %s: %s\n", o->path, g_strerror (errno));
                  status = SIFT_EXIT_FAILED;
                  break;
                }
              t0 = offload_now_s ();
              for (gint64 i = 0; i < n_blocks; i++)
                if (read (fd, buf, stride) != (gssize) stride)
                  break;
              best_ref = MIN (best_ref, offload_now_s () - t0);
              close (fd);
              if (!o->warm)
                drop_cache (o->path);
            }
          double secs;
          if (!ring_all (engine, n_blocks, &secs, &error))
            {
              status = sift_cli_fail ("bench offload", error);
              break;
            }
          best = MIN (best, secs);
        }
      if (status != SIFT_EXIT_OK)
        break;
      double ref = mib / 1024.0 / best_ref, gbs = mib / 1024.0 / best;
      const char *ref_name = file ? (o->direct ? "sequential read (O_DIRECT)" : "sequential read") : "memcpy";
      printf ("  %-34s %8.2f GiB/s\n", ref_name, ref);
      g_autofree char *label = g_strdup_printf ("%s store, copy worker%s", *w,
                                                file ? (g_strcmp0 (g_getenv ("SIFT_STORE_IO"), "pread") == 0
                                                          ? " (pread)" : " (uring)")
                                                     : "");
      printf ("  %-34s %8.2f GiB/s  %5.0f%% of %s (target >= 80%%)\n", label, gbs, 100.0 * gbs / ref, ref_name);
    }
  for (gint64 i = 0; i < n_blocks; i++)
    sift_mem_free (src[i]);
  g_free (src);
  free (buf);
  if (!o->warm)
    printf ("  (file passes start with the page cache dropped: --warm keeps it)\n");
  return status;
}

/* ---- 2. Pipeline efficiency ---------------------------------------------- */

typedef struct {
  double wall, load, compute, stalled;
  double loop_wall, cpu;  /* the whole phase: wall and the process's CPU time (every thread) */
} Phase;

static void
phase_of (SiftEngine *e, SiftPhase ph, const Wall *w, Phase *out)
{
  SiftCounters c;
  sift_engine_counters (e, -1, ph, &c);
  out->wall = (double) w->wall_us / G_USEC_PER_SEC;
  out->load = c.seconds_load;
  out->compute = c.seconds_compute;
  out->stalled = c.seconds_stalled;
}

/* The target (<= 1.15) holds when loads are faster than compute. The CPU
 * line says whether the machine gave the pipeline the CPUs that overlap
 * needs: the copy worker and the kernel threads run at once only on free
 * cores (on a shared machine the process may get one CPU or less). */
static void
print_phase (const char *what, const Phase *p)
{
  double eff = p->wall / MAX (MAX (p->load, p->compute), 1e-9);
  printf ("  %-8s wall %8.3f s  load %8.3f s  compute %8.3f s  stalled %7.3f s  efficiency %.3f (%s)\n", what,
          p->wall, p->load, p->compute, p->stalled, eff,
          p->load == 0.0 ? "nothing copied"
          : p->load < p->compute ? "loads faster than compute: target <= 1.15 applies"
                                 : "loads slower than compute: the target does not apply");
  printf ("  %-8s CPU: the process used %.3f s of CPU in %.3f s (%.2f CPUs of %d online)\n", "", p->cpu,
          p->loop_wall, p->cpu / MAX (p->loop_wall, 1e-9), (int) sysconf (_SC_NPROCESSORS_ONLN));
}

static int
bench_pipeline (const Opts *o, SiftStore *store, SiftDType compute, gboolean copy)
{
  SiftModelShape shape = { o->layers, o->q_heads, o->kv_heads, o->head_dim, o->block, o->chunk, 0 };
  SiftPipeline pipe = strcmp (o->pipeline, "cross-layer") == 0 ? SIFT_PIPELINE_CROSS_LAYER : SIFT_PIPELINE_RING;
  printf ("\nPipeline %s at %" G_GINT64_FORMAT " tokens: %d layers, %d/%d heads x %d, block %d, chunk %d, "
          "%d slots, %s store %s -> %s, %s decode pipeline, %d row%s per step, %s\n",
          copy ? "efficiency" : "without copies", o->tokens, o->layers, o->q_heads, o->kv_heads, o->head_dim, o->block,
          o->chunk, o->slots, sift_store_name (store), sift_dtype_name (sift_store_config (store)->dtype),
          sift_dtype_name (compute), copy ? o->pipeline : "layer-by-layer (resident)", o->rows, o->rows > 1 ? "s" : "",
          copy ? "every load copied (force_copy)" : "resident blocks read in place (zero-copy)");
  printf ("  prefill selects the first and the last %d blocks (--prefill-budget), decode %s (--decode-budget)\n",
          o->prefill_budget, o->decode_budget > 0 ? "the first and last blocks" : "every block");
  g_autoptr (GError) error = NULL;
  SiftEngineConfig ec = { shape, compute, o->slots, pipe, 0, SIFT_DEVICE_CPU };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
  if (engine == NULL)
    return sift_cli_fail ("bench offload", error);
  sift_engine_set_force_copy (engine, copy);
  g_autoptr (SiftModel) source = offload_pattern_new (&shape);
  g_autoptr (SiftPolicy) pp = sift_policy_new (o->decode_only ? &offload_store_only_ops : &offload_window_ops, NULL, &shape, &error);
  g_autoptr (SiftPolicy) dp = sift_policy_new (&offload_window_ops, NULL, &shape, &error);
  if (!o->decode_only)
    ((WindowPolicy *) pp)->budget = o->prefill_budget;
  ((WindowPolicy *) dp)->budget = o->decode_budget;
  SiftPolicy **pre = g_new (SiftPolicy *, o->layers), **dec = g_new (SiftPolicy *, o->layers);
  for (gint l = 0; l < o->layers; l++)
    pre[l] = pp, dec[l] = dp;
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, source, pre, dec, &error);
  g_free (pre);
  g_free (dec);
  if (runner == NULL)
    return sift_cli_fail ("bench offload", error);
  Wall wp = { 0, 0 }, wd = { 0, 0 };
  sift_runner_set_observer (runner, &wall_observer, &wp);
  double t0 = offload_now_s (), c0 = sift_bench_cpu_seconds ();
  if (!sift_runner_prefill (runner, o->tokens, NULL, NULL, &error))
    return sift_cli_fail ("bench offload", error);
  double t1 = offload_now_s (), c1 = sift_bench_cpu_seconds ();
  sift_runner_set_observer (runner, &wall_observer, &wd);
  for (gint i = 0; i < o->steps; i++)
    if (!sift_runner_decode (runner, o->rows, NULL, NULL, &error))
      return sift_cli_fail ("bench offload", error);
  double t2 = offload_now_s (), c2 = sift_bench_cpu_seconds ();
  Phase p, d;
  phase_of (engine, SIFT_PHASE_PREFILL, &wp, &p);
  phase_of (engine, SIFT_PHASE_DECODE, &wd, &d);
  p.loop_wall = t1 - t0, p.cpu = c1 - c0;
  d.loop_wall = t2 - t1, d.cpu = c2 - c1;
  if (o->decode_only)
    printf ("  prefill  (--decode-only: stored without attention)\n");
  else
    print_phase ("prefill", &p);
  print_phase ("decode", &d);
  SiftCounters c;
  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &c);
  printf ("  decode loaded %.1f MiB in %d steps, %.1f MiB of them copied (%.2f GiB/s while copying)\n",
          (double) c.bytes_loaded / 1048576.0, o->steps, (double) (c.bytes_loaded - c.bytes_mapped) / 1048576.0,
          c.seconds_load > 0 ? (double) (c.bytes_loaded - c.bytes_mapped) / c.seconds_load / 1073741824.0 : 0.0);
  return SIFT_EXIT_OK;
}

/* Option checks before anything runs: each named with its value. */
typedef struct {
  const char *name;
  const gint64 value;
  gint64 min;
} Bound;

static gboolean
check_options (const Opts *o)
{
  const Bound bounds[] = {
    { "--layers", o->layers, 1 },          { "--q-heads", o->q_heads, 1 },
    { "--kv-heads", o->kv_heads, 1 },      { "--head-dim", o->head_dim, 1 },
    { "--block", o->block, 1 },            { "--chunk", o->chunk, 1 },
    { "--slots", o->slots, 2 },            { "--tokens", o->tokens, 1 },
    { "--steps", o->steps, 1 },            { "--store-blocks", o->store_blocks, 1 },
    { "--store-block", o->store_block, 1 }, { "--overhead-tokens", o->overhead_tokens, 1 },
    { "--prefill-budget", o->prefill_budget, 0 }, { "--decode-budget", o->decode_budget, 0 },
    { "--rows", o->rows, 1 },              { "--reps", o->reps, 1 },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bounds); i++)
    if (bounds[i].value < bounds[i].min)
      {
        fprintf (stderr, "sift bench offload: %s %" G_GINT64_FORMAT ": must be at least %" G_GINT64_FORMAT "\n",
                 bounds[i].name, bounds[i].value, bounds[i].min);
        return FALSE;
      }
  if (o->rows > SIFT_ATTN_DECODE_MAX_ROWS)
    {
      fprintf (stderr, "sift bench offload: --rows %d: at most %d decode rows per step\n", o->rows,
               SIFT_ATTN_DECODE_MAX_ROWS);
      return FALSE;
    }
  if (o->q_heads % o->kv_heads != 0)
    {
      fprintf (stderr, "sift bench offload: --q-heads %d is not a multiple of --kv-heads %d\n", o->q_heads,
               o->kv_heads);
      return FALSE;
    }
  if (o->chunk % o->block != 0)
    {
      fprintf (stderr, "sift bench offload: --chunk %d is not a multiple of --block %d\n", o->chunk, o->block);
      return FALSE;
    }
  g_auto (GStrv) sections = g_strsplit (o->sections, ",", -1);
  for (char **w = sections; *w != NULL; w++)
    if (strcmp (*w, "stores") != 0 && strcmp (*w, "pipeline") != 0 && strcmp (*w, "overhead") != 0)
      {
        fprintf (stderr, "sift bench offload: --sections: unknown section '%s' (stores, pipeline, overhead)\n", *w);
        return FALSE;
      }
  g_auto (GStrv) lengths = g_strsplit (o->decode_at, ",", -1);
  for (char **l = lengths; *l != NULL; l++)
    {
      char *end = NULL;
      gint64 v = g_ascii_strtoll (*l, &end, 10);
      if (**l == '\0' || end == NULL || *end != '\0' || v < 1)
        {
          fprintf (stderr, "sift bench offload: --decode-at: '%s' is not a positive length\n", *l);
          return FALSE;
        }
    }
  return TRUE;
}

int
sift_bench_offload (int argc, char **argv)
{
  Opts o = {
    .layers = 2, .q_heads = 4, .kv_heads = 1, .head_dim = 64, .block = 128, .chunk = 128, .slots = 4,
    .tokens = 32768, .store_block = 256, .store_kv_heads = 8, .store_head_dim = 128, .store_blocks = 256,
    .prefill_budget = 1, .decode_budget = 0, .steps = 32, .overhead_tokens = 2048, .rows = 1, .reps = 5,
    .budget = 2048,
  };
  GOptionEntry entries[] = {
    { "stores", 0, 0, G_OPTION_ARG_STRING, &o.stores, "Stores to measure: host,file (default both)", "LIST" },
    { "path", 0, 0, G_OPTION_ARG_FILENAME, &o.path, "File store path (default: a temporary file, removed)", "FILE" },
    { "direct", 0, 0, G_OPTION_ARG_NONE, &o.direct, "File store and sequential read with O_DIRECT", NULL },
    { "warm", 0, 0, G_OPTION_ARG_NONE, &o.warm, "Keep the page cache between file passes", NULL },
    { "dtype", 0, 0, G_OPTION_ARG_STRING, &o.stored, "Stored dtype: f32 (default), f16, bf16, q8_0", "T" },
    { "compute", 0, 0, G_OPTION_ARG_STRING, &o.compute, "Compute dtype: f32 (default), f16, bf16", "T" },
    { "slots", 0, 0, G_OPTION_ARG_INT, &o.slots, "Ring slots (default 4)", "N" },
    { "store-blocks", 0, 0, G_OPTION_ARG_INT, &o.store_blocks, "Blocks in the throughput test (default 256)", "N" },
    { "store-block", 0, 0, G_OPTION_ARG_INT, &o.store_block, "Tokens per block in the throughput test (256)", "N" },
    { "tokens", 0, 0, G_OPTION_ARG_INT64, &o.tokens, "Context of the pipeline test (default 32768)", "N" },
    { "layers", 0, 0, G_OPTION_ARG_INT, &o.layers, "Layers of the pipeline test (default 2)", "N" },
    { "q-heads", 0, 0, G_OPTION_ARG_INT, &o.q_heads, "Query heads (default 4)", "N" },
    { "kv-heads", 0, 0, G_OPTION_ARG_INT, &o.kv_heads, "KV heads (default 1)", "N" },
    { "head-dim", 0, 0, G_OPTION_ARG_INT, &o.head_dim, "Head dimension (default 64)", "N" },
    { "block", 0, 0, G_OPTION_ARG_INT, &o.block, "Tokens per block (default 128)", "N" },
    { "chunk", 0, 0, G_OPTION_ARG_INT, &o.chunk, "Prefill chunk (default 128)", "N" },
    { "pipeline", 0, 0, G_OPTION_ARG_STRING, &o.pipeline, "Decode pipeline: ring (default), cross-layer", "P" },
    { "prefill-budget", 0, 0, G_OPTION_ARG_INT, &o.prefill_budget, "Prefill: last blocks selected (0: all; default 1)", "N" },
    { "decode-budget", 0, 0, G_OPTION_ARG_INT, &o.decode_budget, "Decode: last blocks selected (0: all, default)", "N" },
    { "steps", 0, 0, G_OPTION_ARG_INT, &o.steps, "Decode steps (default 32)", "N" },
    { "overhead-tokens", 0, 0, G_OPTION_ARG_INT, &o.overhead_tokens, "Dense prefill length of the overhead test (2048)", "N" },
    { "decode-at", 0, 0, G_OPTION_ARG_STRING, &o.decode_at, "Decode lengths of the overhead test (2048,32768)", "LIST" },
    { "sections", 0, 0, G_OPTION_ARG_STRING, &o.sections, "What to run: stores,pipeline,overhead (default all)", "LIST" },
    { "reps", 0, 0, G_OPTION_ARG_INT, &o.reps, "Overhead test: best of N dense prefills (default 5)", "N" },
    { "rows", 0, 0, G_OPTION_ARG_INT, &o.rows, "Query rows per decode step in the pipeline test (1..16, default 1)", "N" },
    { "decode-only", 0, 0, G_OPTION_ARG_NONE, &o.decode_only, "Prefill stores without attention (decode figures only)", NULL },
    { "quick", 0, 0, G_OPTION_ARG_NONE, &o.quick, "Small sizes (a smoke run)", NULL },
    { "device", 0, 0, G_OPTION_ARG_STRING, &o.device, "cpu (default) or cuda: offloaded decode on the GPU", "D" },
    { "budget", 0, 0, G_OPTION_ARG_INT, &o.budget, "--device cuda: Quest's token budget (default 2048)", "N" },
    { "resident-at", 0, 0, G_OPTION_ARG_STRING, &o.resident_at,
      "--device cuda: context lengths of GPU-resident decode (default 16384,32768,65536,131072; none: skip)", "LIST" },
    { "sdpa-script", 0, 0, G_OPTION_ARG_FILENAME, &o.sdpa_script,
      "--device cuda: the PyTorch script timing SDPA beside resident decode (default bench/sdpa.py of the source tree)", "FILE" },
    G_OPTION_ENTRY_NULL,
  };
  if (!sift_cli_parse ("bench offload", "", entries, &argc, &argv))
    return SIFT_EXIT_USAGE;
  if (o.device != NULL && strcmp (o.device, "cpu") != 0)
    {
      int st = SIFT_EXIT_USAGE;
      if (strcmp (o.device, "cuda") != 0)
        fprintf (stderr, "sift bench offload: --device %s: expected cpu or cuda\n", o.device);
      else if (o.budget < 1 || o.rows < 1 || o.rows > SIFT_ATTN_DECODE_MAX_ROWS || o.steps < 1 || o.slots < 2
               || o.block < 1 || o.tokens < o.block || o.layers < 1)
        fprintf (stderr, "sift bench offload: --device cuda needs --budget >= 1, --rows 1..%d, --steps >= 1, "
                 "--slots >= 2, --layers >= 1 and --tokens >= --block\n", SIFT_ATTN_DECODE_MAX_ROWS);
      else
        st = bench_gpu (&o);
      g_free (o.resident_at), g_free (o.sdpa_script);
      g_free (o.device), g_free (o.stored), g_free (o.compute), g_free (o.pipeline), g_free (o.path), g_free (o.stores), g_free (o.decode_at), g_free (o.sections);
      return st;
    }
  g_free (o.device), g_free (o.resident_at), g_free (o.sdpa_script);
  if (o.sections == NULL)
    o.sections = g_strdup ("stores,pipeline,overhead");
  if (o.decode_at == NULL)
    o.decode_at = g_strdup (o.quick ? "512,4096" : "2048,32768");
  if (o.quick)
    {
      o.tokens = 4096, o.store_blocks = 32, o.steps = 8, o.overhead_tokens = 512;
    }
  if (!check_options (&o))
    {
      g_free (o.stored), g_free (o.compute), g_free (o.pipeline), g_free (o.path), g_free (o.stores), g_free (o.decode_at), g_free (o.sections);
      return SIFT_EXIT_USAGE;
    }
  SiftDType stored = SIFT_DTYPE_F32, compute = SIFT_DTYPE_F32;
  if ((o.stored != NULL && !sift_dtype_from_name (o.stored, &stored))
      || (o.compute != NULL && (!sift_dtype_from_name (o.compute, &compute) || compute == SIFT_DTYPE_Q8_0)))
    {
      fprintf (stderr, "sift bench offload: --dtype takes f32, f16, bf16 or q8_0 and --compute f32, f16 or bf16\n");
      return SIFT_EXIT_USAGE;
    }
  if (o.pipeline == NULL)
    o.pipeline = g_strdup ("ring");
  if (strcmp (o.pipeline, "ring") != 0 && strcmp (o.pipeline, "cross-layer") != 0)
    {
      fprintf (stderr, "sift bench offload: --pipeline takes ring or cross-layer, not '%s'\n", o.pipeline);
      return SIFT_EXIT_USAGE;
    }
  if (o.stores == NULL)
    o.stores = g_strdup ("host,file");
  if (o.path == NULL)
    o.path = g_strdup_printf ("%s/sift-bench-offload-%d.kv", g_get_tmp_dir (), (int) getpid ());

  const gboolean want_stores = strstr (o.sections, "stores") != NULL,
                 want_pipeline = strstr (o.sections, "pipeline") != NULL,
                 want_overhead = strstr (o.sections, "overhead") != NULL;
  int status = want_stores ? bench_stores (&o, stored, compute) : SIFT_EXIT_OK;
  if (status == SIFT_EXIT_OK)
    {
      g_autoptr (GError) error = NULL;
      SiftStoreConfig sc = { stored, o.kv_heads, o.block, o.head_dim, 0, o.path, FALSE, o.direct };
      g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
      if (store == NULL)
        status = sift_cli_fail ("bench offload", error);
      if (status == SIFT_EXIT_OK && want_pipeline)
        status = bench_pipeline (&o, store, compute, TRUE);
      if (status == SIFT_EXIT_OK && want_pipeline && stored == compute)
        status = bench_pipeline (&o, store, compute, FALSE);
      if (status == SIFT_EXIT_OK && want_overhead)
        status = bench_overhead (&o, stored, compute);
    }
  g_free (o.stored), g_free (o.compute), g_free (o.pipeline), g_free (o.path), g_free (o.stores), g_free (o.decode_at), g_free (o.sections);
  return status;
}
