/* sift bench policy subquadratic: the candidate-count table, the forward
 * kernel against dense attention in the same run, and time per doubling.
 *
 * The kernels measured are the plugin's own: its module is opened from the
 * policy search path and its forward / count entry points looked up by name,
 * so the bench times exactly the code the engine runs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>
#include <gmodule.h>
#include <sift/bench.h>
#include <sift/sift.h>

#include "sq-core.h"

/* What `sift bench policy` lends this benchmark (set on entry). */
static const SiftBenchHost *bench_host;

typedef struct {
  void (*config_default) (SqConfig *c);
  gint64 (*count_edges) (const SqConfig *c, gint64 seq);
  gboolean (*forward) (const SqConfig *c, const SiftView *q, const SiftView *k, const SiftView *v,
                       SiftView *out, float *lse, GError **error);
  gboolean (*forward_tiled) (const SqConfig *c, gint64 tile, const SiftView *q, const SiftView *k,
                             const SiftView *v, SiftView *out, float *lse, GError **error);
  SiftIsa (*isa) (gint32 head_dim);
} Api;

/* Published by ruvllm_sparse_attention 0.1.1 (default config, one head). */
static const struct { gint64 seq, edges; } published[] = {
  { 512, 59778 },    { 1024, 129858 },   { 2048, 272130 },   { 4096, 560834 },
  { 8192, 1146498 }, { 16384, 2334274 }, { 32768, 4742658 },
};

static GModule *
open_plugin (GError **error)
{
  g_autoptr (GPtrArray) dirs = g_ptr_array_new_with_free_func (g_free);
  const char *env = g_getenv ("SIFT_POLICY_PATH");
  if (env != NULL)
    {
      g_auto (GStrv) parts = g_strsplit (env, G_SEARCHPATH_SEPARATOR_S, -1);
      for (char **p = parts; *p; p++)
        if (**p)
          g_ptr_array_add (dirs, g_strdup (*p));
    }
  /* The build tree: tools/sift beside policies/subquadratic/. */
  g_autofree char *exe = g_file_read_link ("/proc/self/exe", NULL);
  if (exe != NULL)
    {
      g_autofree char *bin = g_path_get_dirname (exe);
      g_ptr_array_add (dirs, g_build_filename (bin, "..", "policies", "subquadratic", NULL));
      g_ptr_array_add (dirs, g_build_filename (bin, "..", "lib", "sift", "policies", NULL));
      g_ptr_array_add (dirs, g_build_filename (bin, "..", "lib64", "sift", "policies", NULL));
    }
  for (guint i = 0; i < dirs->len; i++)
    {
      g_autofree char *path = g_module_build_path (dirs->pdata[i], "subquadratic");
      if (!g_file_test (path, G_FILE_TEST_EXISTS))
        continue;
      /* Lazy: the bench calls only the kernels, not the engine-facing glue. */
      GModule *m = g_module_open (path, G_MODULE_BIND_LAZY | G_MODULE_BIND_LOCAL);
      if (m == NULL)
        {
          g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_OPEN, "%s: %s", path, g_module_error ());
          return NULL;
        }
      return m;
    }
  g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_UNKNOWN,
               "the subquadratic plugin is not on SIFT_POLICY_PATH (meson devenv sets it)");
  return NULL;
}

static gboolean
load_api (GModule *m, Api *api, GError **error)
{
  static const struct { const char *name; gsize offset; } syms[] = {
    { "sq_config_default", G_STRUCT_OFFSET (Api, config_default) },
    { "sq_count_edges", G_STRUCT_OFFSET (Api, count_edges) },
    { "sq_forward", G_STRUCT_OFFSET (Api, forward) },
    { "sq_forward_tiled", G_STRUCT_OFFSET (Api, forward_tiled) },
    { "sq_simd_isa", G_STRUCT_OFFSET (Api, isa) },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (syms); i++)
    if (!g_module_symbol (m, syms[i].name, (gpointer *) ((char *) api + syms[i].offset)))
      {
        g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_NOT_PLUGIN, "%s: no symbol %s",
                     g_module_name (m), syms[i].name);
        return FALSE;
      }
  return TRUE;
}

typedef struct {
  gint64 seq;
  gint32 heads, dim;
  float *q, *k, *v, *out, *lse;
  SiftView vq, vk, vv, vo;
} Data;

static void
data_init (Data *d, gint64 seq, gint32 heads, gint32 dim)
{
  gsize n = (gsize) seq * heads * dim;
  *d = (Data) { .seq = seq, .heads = heads, .dim = dim };
  d->q = g_new (float, n);
  d->k = g_new (float, n);
  d->v = g_new (float, n);
  d->out = g_new (float, n);
  d->lse = g_new (float, (gsize) seq * heads);
  guint32 s = 12345;
  for (gsize x = 0; x < n; x++)
    {
      s = s * 1664525u + 1013904223u;
      d->q[x] = (float) ((s >> 8) & 0xffff) / 32768.0f - 1.0f;
      s = s * 1664525u + 1013904223u;
      d->k[x] = (float) ((s >> 8) & 0xffff) / 32768.0f - 1.0f;
      s = s * 1664525u + 1013904223u;
      d->v[x] = (float) ((s >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
  /* Token-major like the reference crate's Tensor3 [seq][heads][dim]. */
  d->vq = sift_view_thd (d->q, SIFT_DTYPE_F32, seq, heads, dim);
  d->vk = sift_view_thd (d->k, SIFT_DTYPE_F32, seq, heads, dim);
  d->vv = sift_view_thd (d->v, SIFT_DTYPE_F32, seq, heads, dim);
  d->vo = sift_view_thd (d->out, SIFT_DTYPE_F32, seq, heads, dim);
}

static void
data_clear (Data *d)
{
  g_free (d->q);
  g_free (d->k);
  g_free (d->v);
  g_free (d->out);
  g_free (d->lse);
}

typedef enum { RUN_SPARSE, RUN_TILED, RUN_DENSE } Run;

typedef struct {
  double wall, cpu; /* best of the repetitions, seconds */
} Timing;

static Timing
time_run (const Api *api, const SqConfig *c, Data *d, Run run, int reps, GError **error)
{
  Timing best = { INFINITY, INFINITY };
  for (int r = 0; r < reps; r++)
    {
      double c0 = bench_host->cpu_seconds ();
      gint64 t0 = g_get_monotonic_time ();
      gboolean ok;
      if (run == RUN_DENSE)
        {
          SiftAttnOpts opts = { .causal = TRUE };
          ok = sift_attn_dense (&d->vq, &d->vk, &d->vv, &opts, &d->vo, d->lse, error);
        }
      else if (run == RUN_TILED)
        ok = api->forward_tiled (c, 0, &d->vq, &d->vk, &d->vv, &d->vo, d->lse, error);
      else
        ok = api->forward (c, &d->vq, &d->vk, &d->vv, &d->vo, d->lse, error);
      if (!ok)
        return (Timing) { -1.0, -1.0 };
      best.wall = MIN (best.wall, (double) (g_get_monotonic_time () - t0) / 1e6);
      best.cpu = MIN (best.cpu, bench_host->cpu_seconds () - c0);
    }
  return best;
}

SIFT_POLICY_BENCH_DEFINE (subquadratic)
{
  bench_host = host;
  gint64 seq = 8192, min_seq = 1024, max_seq = 32768;
  gint heads = 8, dim = 64, reps = 3, threads = 0;
  gboolean no_dense = FALSE, no_tiled = FALSE, table_only = FALSE;
  g_autofree char *lengths_text = NULL;
  GOptionEntry entries[] = {
    { "seq", 0, 0, G_OPTION_ARG_INT64, &seq, "sequence of the dense comparison (8192)", "N" },
    { "lengths", 'l', 0, G_OPTION_ARG_STRING, &lengths_text,
      "lengths of the scaling series, ascending, comma-separated (default 1024,2048,...,32768)", "N,..." },
    { "min-seq", 0, 0, G_OPTION_ARG_INT64, &min_seq, "scaling series by doubling from N (1024; ignored with --lengths)", "N" },
    { "max-seq", 0, 0, G_OPTION_ARG_INT64, &max_seq, "... up to N (32768; ignored with --lengths)", "N" },
    { "heads", 0, 0, G_OPTION_ARG_INT, &heads, "heads (8)", "H" },
    { "dim", 0, 0, G_OPTION_ARG_INT, &dim, "head_dim (64)", "D" },
    { "reps", 0, 0, G_OPTION_ARG_INT, &reps, "repetitions, best kept (3)", "R" },
    { "threads", 0, 0, G_OPTION_ARG_INT, &threads, "threads (default: SIFT_THREADS or all CPUs)", "T" },
    { "no-dense", 0, 0, G_OPTION_ARG_NONE, &no_dense, "skip the dense comparison", NULL },
    { "no-tiled", 0, 0, G_OPTION_ARG_NONE, &no_tiled, "skip the tiled variant", NULL },
    { "table", 0, 0, G_OPTION_ARG_NONE, &table_only, "print the candidate-count table only", NULL },
    { NULL },
  };
  g_autoptr (GOptionContext) octx = g_option_context_new ("- subquadratic sparse attention");
  g_option_context_add_main_entries (octx, entries, NULL);
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (octx, &argc, &argv, &error))
    {
      fprintf (stderr, "sift bench policy subquadratic: %s\n", error->message);
      return 2;
    }
  if (seq < 1 || min_seq < 1 || max_seq < min_seq || heads < 1 || dim < 1 || reps < 1 || threads < 0)
    {
      fprintf (stderr, "sift bench policy subquadratic: --seq, --min-seq <= --max-seq, --heads, --dim "
                       "and --reps must be positive\n");
      return 2;
    }
  /* The scaling series: --lengths, or doubling from --min-seq to --max-seq. */
  g_autoptr (GArray) lengths = g_array_new (FALSE, FALSE, sizeof (gint64));
  if (lengths_text != NULL)
    {
      g_auto (GStrv) parts = g_strsplit (lengths_text, ",", -1);
      for (gsize i = 0; parts[i] != NULL; i++)
        {
          gint64 v;
          if (!g_ascii_string_to_signed (g_strstrip (parts[i]), 10, 1, G_MAXINT32, &v, NULL)
              || (lengths->len > 0 && v <= g_array_index (lengths, gint64, lengths->len - 1)))
            {
              fprintf (stderr, "sift bench policy subquadratic: --lengths: '%s' is not a positive integer "
                               "above the previous length\n", parts[i]);
              return 2;
            }
          g_array_append_val (lengths, v);
        }
    }
  else
    for (gint64 n = min_seq; n <= max_seq; n *= 2)
      g_array_append_val (lengths, n);
  if (threads > 0)
    sift_parallel_set_n_threads (threads);

  GModule *module = open_plugin (&error);
  Api api;
  if (module == NULL || !load_api (module, &api, &error))
    {
      fprintf (stderr, "sift bench policy subquadratic: %s\n", error->message);
      return 2;
    }
  SqConfig c;
  api.config_default (&c);

  int status = 0;
  printf ("Candidate pairs per head (window %" G_GINT64_FORMAT ", block %" G_GINT64_FORMAT
          ", globals [0], log-stride, landmarks, causal)\n",
          c.window, c.block_size);
  printf ("%8s %12s %14s %10s %12s\n", "seq", "sparse", "dense", "reduction", "published");
  for (gsize i = 0; i < G_N_ELEMENTS (published); i++)
    {
      gint64 n = published[i].seq, e = api.count_edges (&c, n), dense = n * (n + 1) / 2;
      gboolean same = e == published[i].edges;
      status |= !same;
      printf ("%8" G_GINT64_FORMAT " %12" G_GINT64_FORMAT " %14" G_GINT64_FORMAT " %9.1fx %12s\n", n, e,
              dense, (double) dense / (double) e, same ? "matches" : "DIFFERS");
    }
  if (table_only)
    return status;

  printf ("\nForward, %d heads, head_dim %d, %d thread(s), sparse isa %s, dense isa %s, best of %d\n",
          heads, dim, sift_parallel_n_threads (), sift_isa_name (api.isa (dim)),
          sift_isa_name (sift_isa_active ()), reps);
  Data d;
  data_init (&d, seq, heads, dim);
  Timing ts = time_run (&api, &c, &d, RUN_SPARSE, reps, &error);
  double checksum = 0.0; /* sum of outputs: the same inputs give the reference crate's sum */
  for (gsize x = 0; x < (gsize) seq * heads * dim; x++)
    checksum += d.out[x];
  Timing tt = ts.wall >= 0 && !no_tiled ? time_run (&api, &c, &d, RUN_TILED, reps, &error) : ts;
  Timing td = no_dense || tt.wall < 0 ? (Timing) { 0.0, 0.0 } : time_run (&api, &c, &d, RUN_DENSE, reps, &error);
  data_clear (&d);
  if (ts.wall < 0 || tt.wall < 0 || td.wall < 0)
    {
      fprintf (stderr, "sift bench policy subquadratic: %s\n", error->message);
      return 2;
    }
  printf ("  seq %" G_GINT64_FORMAT ", checksum %.6f (sum of outputs)\n", seq, checksum);
  printf ("  %-8s %10s %10s %12s %12s\n", "", "wall s", "cpu s", "dense/wall", "dense/cpu");
  printf ("  %-8s %10.4f %10.4f", "sparse", ts.wall, ts.cpu);
  if (!no_dense)
    printf (" %11.1fx %11.1fx", td.wall / ts.wall, td.cpu / ts.cpu);
  if (!no_tiled)
    {
      printf ("\n  %-8s %10.4f %10.4f", "tiled", tt.wall, tt.cpu);
      if (!no_dense)
        printf (" %11.1fx %11.1fx", td.wall / tt.wall, td.cpu / tt.cpu);
    }
  if (!no_dense)
    printf ("\n  %-8s %10.4f %10.4f", "dense", td.wall, td.cpu);
  /* Time per doubling: the ratio to the previous length, taken to the
   * power 1 / log2 (n / previous) when the lengths do not double. */
  printf ("\n\nTime per doubling (sparse forward)\n%8s %10s %8s %10s %8s\n", "seq", "wall s", "ratio",
          "cpu s", "ratio");
  Timing prev = { 0.0, 0.0 }, first = { 0.0, 0.0 };
  for (guint i = 0; i < lengths->len; i++)
    {
      gint64 n = g_array_index (lengths, gint64, i);
      data_init (&d, n, heads, dim);
      Timing t = time_run (&api, &c, &d, RUN_SPARSE, reps, &error);
      data_clear (&d);
      if (t.wall < 0)
        {
          fprintf (stderr, "sift bench policy subquadratic: %s\n", error->message);
          return 2;
        }
      if (i > 0)
        {
          double dbl = log2 ((double) n / (double) g_array_index (lengths, gint64, i - 1));
          printf ("%8" G_GINT64_FORMAT " %10.4f %7.2fx %10.4f %7.2fx\n", n, t.wall, pow (t.wall / prev.wall, 1.0 / dbl),
                  t.cpu, pow (t.cpu / prev.cpu, 1.0 / dbl));
        }
      else
        {
          printf ("%8" G_GINT64_FORMAT " %10.4f %8s %10.4f %8s\n", n, t.wall, "-", t.cpu, "-");
          first = t;
        }
      prev = t;
    }
  if (lengths->len > 1)
    {
      gint64 n0 = g_array_index (lengths, gint64, 0), n1 = g_array_index (lengths, gint64, lengths->len - 1);
      double dbl = log2 ((double) n1 / (double) n0);
      printf ("%" G_GINT64_FORMAT " to %" G_GINT64_FORMAT ": %.2fx per doubling (wall), %.2fx (cpu), "
              "geometric mean\n", n0, n1, pow (prev.wall / first.wall, 1.0 / dbl), pow (prev.cpu / first.cpu, 1.0 / dbl));
    }
  return status;
}
