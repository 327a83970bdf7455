/* sift bench policy quest: decode with Quest against full decode through the
 * same engine, at several context lengths. For each length and each decode
 * policy the prompt is prefilled once (by the same cheap prefill for both, so
 * only decode differs), then a few decode steps are timed; the table shows
 * time per step, attention time per step, bytes loaded per step, density
 * and the speedup over full. docs/policies/quest.md, docs/benchmarks.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>
#include <sift/bench.h>
#include <sift/sift.h>

typedef struct {
  gchar *lengths;     /* "8192,32768,131072" */
  gint budget;        /* Quest token budget */
  gint steps;         /* decode steps timed */
  gint block_size;
  gint layers, q_heads, kv_heads, head_dim;
  gchar *mode;        /* per_kv_head | shared */
  gchar *store_dtype; /* f32 | f16 | bf16 */
  gboolean json;
} Options;

typedef struct {
  double seconds_step;       /* wall time of one decode step (all layers) */
  double seconds_attn_step;  /* engine compute (attention kernels) per step */
  double stall_step;         /* compute thread waiting for loads, per step */
  double bytes_step;         /* bytes loaded store -> compute per step */
  double density;            /* tokens attended / tokens available */
} Result;

static int
cmp_double (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return (x > y) - (x < y);
}

/* Median of n values (sorts them). */
static double
median (double *x, gint n)
{
  qsort (x, (gsize) n, sizeof (double), cmp_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* A policy by name with "name=value" settings over its defaults. */
static SiftPolicy *
policy_new (SiftRegistry *registry, const char *name, const char *const *settings, const SiftModelShape *shape,
            GError **error)
{
  const SiftPolicyInfo *info = sift_registry_lookup (registry, name, error);
  if (info == NULL)
    return NULL;
  g_autoptr (SiftParams) params = sift_params_new (info->ops->params, error);
  if (params == NULL)
    return NULL;
  for (gsize i = 0; settings != NULL && settings[i] != NULL; i++)
    {
      g_auto (GStrv) kv = g_strsplit (settings[i], "=", 2);
      if (!sift_params_set_text (params, kv[0], kv[1], error))
        return NULL;
    }
  return sift_policy_new (info->ops, params, shape, error);
}

/* One run: prefill `length` tokens with `prefill`, then `steps` timed
 * decode steps with `decode` in every layer. */
static gboolean
run_one (const Options *o, const SiftModelShape *shape, gint64 length, SiftPolicy *prefill, SiftPolicy *decode,
         Result *out, GError **error)
{
  SiftStoreConfig sc = { 0 };
  if (!sift_dtype_from_name (o->store_dtype, &sc.dtype))
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_RANGE, "--store-dtype '%s' is not f32, f16 or bf16",
                   o->store_dtype);
      return FALSE;
    }
  sc.n_kv_heads = shape->n_kv_heads;
  sc.block_size = shape->block_size;
  sc.head_dim = shape->head_dim;
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, error);
  if (store == NULL)
    return FALSE;
  SiftEngineConfig ec = { *shape, SIFT_DTYPE_F32, 4, SIFT_PIPELINE_RING, 0, SIFT_DEVICE_CPU };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, error);
  if (engine == NULL)
    return FALSE;
  g_autoptr (SiftModel) source = sift_model_random_new (shape, 1);
  g_autofree SiftPolicy **pre = g_new (SiftPolicy *, shape->n_layers);
  g_autofree SiftPolicy **dec = g_new (SiftPolicy *, shape->n_layers);
  for (gint32 l = 0; l < shape->n_layers; l++)
    {
      pre[l] = prefill;
      dec[l] = decode;
    }
  sift_policy_reset (prefill);
  sift_policy_reset (decode);
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, source, pre, dec, error);
  if (runner == NULL || !sift_runner_prefill (runner, length, NULL, NULL, error))
    return FALSE;

  /* One untimed step: Quest reads the prompt blocks' keys once for its
   * bounds (the prefill policy's hooks saw them, not the decode policy's). */
  if (!sift_runner_decode (runner, 1, NULL, NULL, error))
    return FALSE;
  /* Medians over the steps: the machine may be shared, and one preempted
   * step should not move the figure. */
  g_autofree double *wall = g_new (double, o->steps);
  g_autofree double *attn = g_new (double, o->steps);
  SiftCounters first, before, after;
  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &first);
  before = first;
  for (gint s = 0; s < o->steps; s++)
    {
      gint64 t0 = g_get_monotonic_time ();
      if (!sift_runner_decode (runner, 1, NULL, NULL, error))
        return FALSE;
      wall[s] = (double) (g_get_monotonic_time () - t0) / 1e6;
      sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &after);
      attn[s] = after.seconds_compute - before.seconds_compute;
      before = after;
    }
  out->seconds_step = median (wall, o->steps);
  out->seconds_attn_step = median (attn, o->steps);
  out->bytes_step = (double) (after.bytes_loaded - first.bytes_loaded) / o->steps;
  out->stall_step = (after.seconds_stalled - first.seconds_stalled) / o->steps;
  guint64 avail = after.tokens_available - first.tokens_available;
  out->density = avail ? (double) (after.tokens_attended - first.tokens_attended) / (double) avail : 0.0;
  return TRUE;
}

SIFT_POLICY_BENCH_DEFINE (quest)
{
  Options o = { NULL, 2048, 8, 64, 2, 8, 2, 64, NULL, NULL, FALSE };
  g_auto (GStrv) policy_paths = NULL;
  GOptionEntry entries[] = {
    { "policy-path", 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &policy_paths,
      "Search DIR for policy plugins before SIFT_POLICY_PATH (repeatable)", "DIR" },
    { "lengths", 'l', 0, G_OPTION_ARG_STRING, &o.lengths, "context lengths (default 8192,32768,131072)", "L,..." },
    { "budget", 'b', 0, G_OPTION_ARG_INT, &o.budget, "Quest token budget (default 2048)", "TOKENS" },
    { "steps", 's', 0, G_OPTION_ARG_INT, &o.steps, "decode steps timed per run (default 8)", "N" },
    { "block-size", 0, 0, G_OPTION_ARG_INT, &o.block_size, "tokens per KV block (default 64)", "N" },
    { "layers", 0, 0, G_OPTION_ARG_INT, &o.layers, "layers (default 2)", "N" },
    { "q-heads", 0, 0, G_OPTION_ARG_INT, &o.q_heads, "query heads (default 8)", "N" },
    { "kv-heads", 0, 0, G_OPTION_ARG_INT, &o.kv_heads, "kv heads (default 2)", "N" },
    { "head-dim", 0, 0, G_OPTION_ARG_INT, &o.head_dim, "head dimension (default 64)", "N" },
    { "mode", 0, 0, G_OPTION_ARG_STRING, &o.mode, "Quest mode: per_kv_head, per_q_head or shared (default per_kv_head)", "M" },
    { "store-dtype", 0, 0, G_OPTION_ARG_STRING, &o.store_dtype, "stored K/V dtype: f32, f16, bf16, q8_0 (default f16)", "T" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &o.json, "one JSON record per length instead of the table", NULL },
    G_OPTION_ENTRY_NULL,
  };
  if (!host->parse ("bench policy quest",
                       "- Quest decode against full decode. Each length is prefilled once per\n"
                       "policy by the same cheap Quest prefill; then decode steps are timed with full\n"
                       "and with Quest (every layer sparse: dense_layers=[]) through one engine\n"
                       "configuration, host store; figures are medians over the steps.",
                       entries, &argc, &argv))
    return SIFT_BENCH_EXIT_USAGE;
  g_autoptr (GError) error = NULL;
  g_autofree gchar *lengths_text = o.lengths ? o.lengths : g_strdup ("8192,32768,131072");
  g_autofree gchar *mode = o.mode ? o.mode : g_strdup ("per_kv_head");
  g_autofree gchar *store_dtype = o.store_dtype ? o.store_dtype : g_strdup ("f16");
  o.mode = mode;
  o.store_dtype = store_dtype;
  if (o.steps < 1 || o.budget < 1 || o.block_size < 1 || o.layers < 1 || o.q_heads < 1 || o.kv_heads < 1
      || o.head_dim < 1 || o.q_heads % o.kv_heads != 0)
    {
      fprintf (stderr, "sift bench policy quest: steps, budget and shape must be positive, kv heads dividing q heads\n");
      return SIFT_BENCH_EXIT_USAGE;
    }
  SiftDType dt;
  if (!g_str_equal (o.mode, "per_kv_head") && !g_str_equal (o.mode, "per_q_head") && !g_str_equal (o.mode, "shared"))
    {
      fprintf (stderr, "sift bench policy quest: --mode '%s' is not per_kv_head, per_q_head or shared\n", o.mode);
      return SIFT_BENCH_EXIT_USAGE;
    }
  if (!sift_dtype_from_name (o.store_dtype, &dt))
    {
      fprintf (stderr, "sift bench policy quest: --store-dtype '%s' is not f32, f16, bf16 or q8_0\n", o.store_dtype);
      return SIFT_BENCH_EXIT_USAGE;
    }

  g_auto (GStrv) parts = g_strsplit (lengths_text, ",", -1);
  g_autoptr (GArray) lengths = g_array_new (FALSE, FALSE, sizeof (gint64));
  for (gsize i = 0; parts[i] != NULL; i++)
    {
      gint64 v;
      if (!g_ascii_string_to_signed (g_strstrip (parts[i]), 10, 1, G_MAXINT32, &v, NULL))
        {
          fprintf (stderr, "sift bench policy quest: --lengths: '%s' is not a positive integer\n", parts[i]);
          return SIFT_BENCH_EXIT_USAGE;
        }
      g_array_append_val (lengths, v);
    }

  SiftModelShape shape = { o.layers, o.q_heads, o.kv_heads, o.head_dim, o.block_size, 8 * o.block_size, 0.0f };
  shape.scale = 1.0f / sqrtf ((float) o.head_dim);
  g_autoptr (SiftRegistry) registry = host->registry ((const char *const *) policy_paths);
  g_autofree gchar *budget = g_strdup_printf ("token_budget=%d", o.budget);
  g_autofree gchar *mode_set = g_strdup_printf ("mode=%s", o.mode);
  const char *quest_decode[] = { budget, mode_set, "dense_layers=[]", NULL };
  /* Prefill only has to store the prompt; a 2-block Quest prefill keeps it linear in the length. */
  const char *quest_prefill[] = { "top_k=2", "prefill=true", "dense_layers=[]", NULL };
  g_autoptr (SiftPolicy) prefill = policy_new (registry, "quest", quest_prefill, &shape, &error);
  g_autoptr (SiftPolicy) full = prefill ? policy_new (registry, "full", NULL, &shape, &error) : NULL;
  g_autoptr (SiftPolicy) quest = full ? policy_new (registry, "quest", quest_decode, &shape, &error) : NULL;
  if (quest == NULL)
    return host->fail ("bench policy quest", error);

  if (!o.json)
    printf ("%8s %-6s %9s %9s %9s %12s %8s %8s %8s\n", "context", "decode", "ms/step", "attn ms", "stall ms",
            "bytes/step", "density", "speedup", "attn x");
  for (guint i = 0; i < lengths->len; i++)
    {
      gint64 len = g_array_index (lengths, gint64, i);
      Result r[2];
      if (!run_one (&o, &shape, len, prefill, full, &r[0], &error)
          || !run_one (&o, &shape, len, prefill, quest, &r[1], &error))
        {
          g_prefix_error (&error, "context %" G_GINT64_FORMAT ": ", len);
          return host->fail ("bench policy quest", error);
        }
      for (int p = 0; p < 2; p++)
        {
          const char *name = p == 0 ? "full" : "quest";
          double speed = r[p].seconds_step > 0 ? r[0].seconds_step / r[p].seconds_step : 0.0;
          double speed_attn = r[p].seconds_attn_step > 0 ? r[0].seconds_attn_step / r[p].seconds_attn_step : 0.0;
          if (o.json)
            printf ("{\"context\": %" G_GINT64_FORMAT ", \"decode\": \"%s\", \"budget\": %d, \"mode\": \"%s\", "
                    "\"s_step\": %.6g, \"attn_s_step\": %.6g, \"stall_s_step\": %.6g, \"bytes_step\": %.0f, "
                    "\"density\": %.4f, \"speedup\": %.3f, \"attn_speedup\": %.3f}\n",
                    len, name, o.budget, o.mode, r[p].seconds_step, r[p].seconds_attn_step, r[p].stall_step,
                    r[p].bytes_step, r[p].density, speed, speed_attn);
          else
            printf ("%8" G_GINT64_FORMAT " %-6s %9.3f %9.3f %9.3f %12.0f %8.4f %7.2fx %7.2fx\n", len, name,
                    r[p].seconds_step * 1e3, r[p].seconds_attn_step * 1e3, r[p].stall_step * 1e3, r[p].bytes_step,
                    r[p].density, speed, speed_attn);
        }
      fflush (stdout);
    }
  return 0;
}
