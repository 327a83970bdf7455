/* sift bench evict — bounded KV memory: token against block granularity.
 *
 * On the synthetic model (sinks, locality, heavy-hitter columns), a prompt
 * then decode steps run once unbounded (the reference) and once per
 * (capacity, granularity, scorer): the default sinks + window (oldest
 * first) and H2O's accumulated attention. For each run: the decode
 * outputs' relative error against the unbounded run, the fraction of the
 * model's heavy-hitter tokens (outside the protected sinks and window)
 * still held at the end, the bytes compaction
 * and re-offload moved per evicted token, and the time per decode step.
 * Figures are indicative; see docs/eviction.md and docs/benchmarks.md. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <sift/sift.h>
#include <synthetic/synthetic.h>

#include "cli.h"
#include "commands.h"

typedef struct {
  gint layers, q_heads, kv_heads, head_dim, block, chunk, sinks, recent;
  gint64 prompt, steps;
  char *capacities;
  gboolean quick;
} Opts;

typedef struct {
  GArray *outputs;  /* decode outputs, every float in call order */
} Capture;

static void
capture (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  Capture *c = user_data;
  (void) lse;
  if (ctx->phase != SIFT_PHASE_DECODE)
    return;
  for (gint32 h = 0; h < out->n_heads; h++)
    g_array_append_vals (c->outputs, sift_view_row (out, h, 0), (guint) out->head_dim);
}

typedef struct {
  double rel_error, heavy_kept, bytes_per_evicted, ms_per_step;
  guint64 evicted;
} Result;

static gboolean
run_one (const Opts *o, SiftRegistry *registry, gint64 capacity, SiftEvictGranularity gran, const char *policy,
         GArray *outputs, Result *res, GError **error)
{
  SiftModelShape shape = { o->layers, o->q_heads, o->kv_heads, o->head_dim, o->block, o->chunk, 0 };
  shape.scale = 1.0f / sqrtf ((float) o->head_dim);
  g_autoptr (SiftModelSource) src = sift_model_synthetic_new (&shape, 1, NULL, NULL, error);
  if (src == NULL)
    return FALSE;
  SiftStoreConfig sc = { SIFT_DTYPE_F16, o->kv_heads, o->block, o->head_dim, 0, NULL, FALSE, FALSE };
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, error);
  if (store == NULL)
    return FALSE;
  SiftEngineConfig ec = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 4 };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, error);
  SiftEvictConfig ev = { capacity, gran, o->sinks, o->recent };
  if (engine == NULL || !sift_engine_set_eviction (engine, &ev, error))
    return FALSE;
  g_autoptr (SiftPolicy) pol = NULL;
  if (policy != NULL)
    {
      const SiftPolicyInfo *info = sift_registry_lookup (registry, policy, error);
      if (info == NULL)
        return FALSE;
      g_autoptr (SiftParams) params = sift_params_new (info->ops->params, error);
      if (params == NULL || (pol = sift_policy_new (info->ops, params, &shape, error)) == NULL)
        return FALSE;
    }
  g_autofree SiftPolicy **per_layer = g_new0 (SiftPolicy *, o->layers);
  for (gint l = 0; l < o->layers; l++)
    per_layer[l] = pol;
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, src, per_layer, per_layer, error);
  if (runner == NULL)
    return FALSE;
  Capture cap = { outputs };
  const SiftRunnerObserver obs = { capture, NULL };
  sift_runner_set_observer (runner, &obs, &cap);
  if (!sift_runner_prefill (runner, o->prompt, error))
    return FALSE;
  gint64 t0 = g_get_monotonic_time ();
  for (gint64 i = 0; i < o->steps; i++)
    if (!sift_runner_decode (runner, 1, error))
      return FALSE;
  res->ms_per_step = (double) (g_get_monotonic_time () - t0) / 1e3 / (double) MAX (o->steps, 1);
  SiftCounters pc, dc;
  sift_engine_counters (engine, -1, SIFT_PHASE_PREFILL, &pc);
  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &dc);
  res->evicted = pc.tokens_evicted + dc.tokens_evicted;
  res->bytes_per_evicted = res->evicted ? (double) (pc.bytes_compacted + dc.bytes_compacted) / res->evicted : 0;
  gsize n_heavy = 0, kept = 0, exist = 0;
  const gint64 *heavy = sift_model_synthetic_heavy_hitters (src, &n_heavy);
  g_autofree gint64 *pos = g_new (gint64, o->prompt + o->steps);
  for (gint l = 0; l < o->layers; l++)
    {
      gsize n = sift_engine_stored_positions (engine, l, pos);
      for (gsize i = 0; i < n_heavy; i++)
        exist += heavy[i] >= o->sinks && heavy[i] < o->prompt + o->steps - o->recent;
      for (gsize i = 0; i < n_heavy; i++)
        for (gsize j = 0; j < n && heavy[i] >= o->sinks && heavy[i] < o->prompt + o->steps - o->recent; j++)
          if (pos[j] == heavy[i])
            {
              kept++;
              break;
            }
    }
  /* Of the heavy hitters the engine could evict (not sinks, not recent). */
  res->heavy_kept = exist ? (double) kept / (double) exist : NAN;
  return TRUE;
}

static double
rel_error (GArray *a, GArray *ref)
{
  double num = 0, den = 0;
  for (guint i = 0; i < MIN (a->len, ref->len); i++)
    {
      double d = g_array_index (a, float, i) - g_array_index (ref, float, i);
      num += d * d;
      den += (double) g_array_index (ref, float, i) * g_array_index (ref, float, i);
    }
  return sqrt (num / MAX (den, 1e-30));
}

int
sift_bench_evict (int argc, char **argv)
{
  Opts o = { .layers = 2, .q_heads = 8, .kv_heads = 2, .head_dim = 64, .block = 64, .chunk = 256, .sinks = 4,
             .recent = 64, .prompt = 4096, .steps = 512 };
  SiftCliOptions cli = { 0 };
  GOptionEntry entries[] = {
    SIFT_CLI_POLICY_PATH_ENTRY (&cli),
    { "capacities", 0, 0, G_OPTION_ARG_STRING, &o.capacities, "KV budgets in tokens (default 512,1024,2048)", "LIST" },
    { "prompt", 0, 0, G_OPTION_ARG_INT64, &o.prompt, "Prompt tokens (default 4096)", "N" },
    { "steps", 0, 0, G_OPTION_ARG_INT64, &o.steps, "Decode steps (default 512)", "N" },
    { "layers", 0, 0, G_OPTION_ARG_INT, &o.layers, "Layers (default 2)", "N" },
    { "block", 0, 0, G_OPTION_ARG_INT, &o.block, "Tokens per block (default 64)", "N" },
    { "chunk", 0, 0, G_OPTION_ARG_INT, &o.chunk, "Prefill chunk (default 256)", "N" },
    { "sinks", 0, 0, G_OPTION_ARG_INT, &o.sinks, "Protected sink tokens (default 4)", "N" },
    { "recent", 0, 0, G_OPTION_ARG_INT, &o.recent, "Protected recent tokens (default 64)", "N" },
    { "quick", 0, 0, G_OPTION_ARG_NONE, &o.quick, "Small sizes (a smoke run)", NULL },
    G_OPTION_ENTRY_NULL,
  };
  if (!sift_cli_parse ("bench evict", "", entries, &argc, &argv))
    return SIFT_EXIT_USAGE;
  if (o.quick)
    {
      o.prompt = 1024, o.steps = 128, o.chunk = 128;
      if (o.capacities == NULL)
        o.capacities = g_strdup ("320,640");
    }
  if (o.capacities == NULL)
    o.capacities = g_strdup ("512,1024,2048");
  g_auto (GStrv) caps = g_strsplit (o.capacities, ",", -1);
  g_autoptr (SiftRegistry) registry = sift_cli_registry (&cli);
  g_autoptr (GError) error = NULL;
  g_autoptr (GArray) ref = g_array_new (FALSE, FALSE, sizeof (float));
  Result base = { 0 };
  if (!run_one (&o, registry, 0, SIFT_EVICT_TOKEN, NULL, ref, &base, &error))
    return sift_cli_fail ("bench evict", error);
  printf ("bench evict: synthetic model, %d layers, %d/%d heads x %d, block %d, prompt %" G_GINT64_FORMAT
          ", %" G_GINT64_FORMAT " decode steps, sinks %d, recent %d\n",
          o.layers, o.q_heads, o.kv_heads, o.head_dim, o.block, o.prompt, o.steps, o.sinks, o.recent);
  printf ("unbounded: %.2f ms/step\n\n", base.ms_per_step);
  printf ("%-8s %-6s %-14s %10s %12s %10s %14s %10s\n", "budget", "gran", "scorer", "rel.err", "heavy kept",
          "evicted", "bytes/evicted", "ms/step");
  for (int i = 0; caps[i] != NULL; i++)
    {
      gint64 capacity = g_ascii_strtoll (caps[i], NULL, 10);
      for (int gran = 0; gran < 2; gran++)
        for (int p = 0; p < 2; p++)
          {
            const char *policy = p ? "h2o" : NULL;
            g_autoptr (GArray) out = g_array_new (FALSE, FALSE, sizeof (float));
            Result r = { 0 };
            if (!run_one (&o, registry, capacity, gran, policy, out, &r, &error))
              return sift_cli_fail ("bench evict", error);
            printf ("%-8" G_GINT64_FORMAT " %-6s %-14s %10.4f %11.0f%% %10" G_GUINT64_FORMAT " %14.0f %10.2f\n",
                    capacity, gran ? "block" : "token", p ? "h2o" : "sinks+window", rel_error (out, ref),
                    100 * r.heavy_kept, r.evicted, r.bytes_per_evicted, r.ms_per_step);
          }
    }
  sift_cli_options_clear (&cli);
  return SIFT_EXIT_OK;
}
