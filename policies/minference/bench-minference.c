/* sift bench policy minference: vertical-slash sparse prefill against dense
 * attention, whole prompt (one chunk), estimation included.
 *
 * Shapes default to configs/large.yaml (32 q heads, 8 kv heads, head_dim
 * 128); --heads runs a subset of query heads (with their kv heads) and the
 * times are scaled to all heads, which is exact for attention because heads
 * are independent. Dense at long lengths can take long: --dense-tiles times
 * dense attention on that many 64-row tiles spread over the sequence and
 * scales by the causal work (sum of keys over rows), which is how dense
 * cost grows. See docs/benchmarks.md for the figures. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <glib.h>
#include <sift/bench.h>
#include <sift/sift.h>

#include "vs.h"

/* What `sift bench policy` lends this benchmark (set on entry). */
static const SiftBenchHost *bench_host;

typedef struct {
  gint32 q_heads, kv_heads, head_dim, heads, tile;
  gint64 vertical, slash, last_q, sink, recent;
  double budget;
  gint dense_tiles;
  gint threads;
  gint64 seed;
  char *lengths, *data;
  char *config;      /* --data synth: the config whose synthetic source gives Q/K/V */
  SiftConfig *cfg;
} Options;

/* Query and key content shared per head, rotated by position as RoPE does:
 * q_i . k_j then depends on i - j (plus noise), which gives the local and
 * periodic diagonals real models show, with a few sink keys. "random"
 * fills everything with independent noise (no structure at all). */
static void
fill_qkv (const Options *o, gint64 n, float *q, float *k, float *v)
{
  const gint32 d = o->head_dim, H = o->heads, G = MAX (1, o->heads / (o->q_heads / o->kv_heads));
  g_autoptr (GRand) rng = g_rand_new_with_seed ((guint32) o->seed);
  const gboolean rope = strcmp (o->data, "rope") == 0;
  g_autofree float *base = g_new (float, (gsize) G * d); /* per kv head, shared by its q heads */
  for (gsize i = 0; i < (gsize) G * d; i++)
    base[i] = (float) g_rand_double_range (rng, -1.0, 1.0) * (rope ? 2.0f : 0.0f);
  g_autofree double *theta = g_new (double, d / 2);
  for (gint32 c = 0; c < d / 2; c++)
    theta[c] = pow (10000.0, -2.0 * c / d);
  for (gint32 h = 0; h < H + 2 * G; h++)
    {
      const gboolean is_q = h < H, is_v = h >= H + G;
      float *dst = is_q ? q + (gsize) h * n * d : is_v ? v + (gsize) (h - H - G) * n * d : k + (gsize) (h - H) * n * d;
      const float *b = is_v ? NULL : base + (gsize) (is_q ? h / (H / G) : h - H) * d;
      for (gint64 t = 0; t < n; t++)
        {
          float *row = dst + t * d;
          for (gint32 c = 0; c < d; c++)
            row[c] = (float) g_rand_double_range (rng, -1.0, 1.0) + (b ? b[c] * (!is_q && t < 4 ? 2.0f : 1.0f) : 0.0f);
          if (!rope || is_v)
            continue;
          for (gint32 c = 0; c < d / 2; c++)
            {
              double s = sin (t * theta[c]), co = cos (t * theta[c]);
              float x = row[2 * c], y = row[2 * c + 1];
              row[2 * c] = (float) (x * co - y * s);
              row[2 * c + 1] = (float) (x * s + y * co);
            }
        }
    }
}

/* Dense causal attention of `tiles` 64-row tiles spread over [0, n);
 * returns seconds scaled to every row. With `vs`, the sparse kernel keeping
 * every diagonal (dense through the same inner loops). */
static double
time_dense (const SiftView *q, const SiftView *k, const SiftView *v, float scale, gint tiles, gint32 o_tile,
            gboolean vs, double *cpu)
{
  const gint64 n = q->n_tokens;
  gint64 n_tiles = (n + 64 - 1) / 64;
  tiles = (gint) MIN (tiles, n_tiles);
  double seconds = 0.0, cpu_s = 0.0, sampled = 0.0;
  g_autofree float *out = g_new (float, (gsize) q->n_heads * 64 * q->head_dim);
  g_autofree float *lse = g_new (float, (gsize) q->n_heads * 64);
  g_autofree gint64 *all = vs ? g_new (gint64, n) : NULL;
  for (gint64 i = 0; vs && i < n; i++)
    all[i] = i;
  g_autofree VsPattern *pat = g_new0 (VsPattern, q->n_heads);
  for (gint32 h = 0; h < q->n_heads; h++)
    pat[h] = (VsPattern) { NULL, 0, all, (gsize) n };
  /* As for the sparse run: the workspace is faulted in before the timing. */
  g_autoptr (VsWork) work = vs_work_new ();
  if (vs)
    vs_work_reserve (work, q->n_heads, MIN (64, n), q->head_dim, k->n_heads, n, 0);
  for (gint i = 0; i < tiles; i++)
    {
      /* Tiles evenly spaced, the last one ending the sequence. */
      gint64 t = tiles == 1 ? n_tiles - 1 : (n_tiles - 1) * i / (tiles - 1);
      gint64 a = t * 64, rows = MIN (64, n - a);
      SiftView qt = sift_view_tokens (q, a, rows);
      SiftView kt = sift_view_tokens (k, 0, a + rows), vt = sift_view_tokens (v, 0, a + rows);
      SiftView ov = sift_view_htd (out, SIFT_DTYPE_F32, q->n_heads, rows, q->head_dim);
      gint64 t0 = g_get_monotonic_time ();
      double c0 = bench_host->cpu_seconds ();
      if (vs)
        {
          g_autoptr (VsAttn) at = vs_attn_new (&qt, a, k->n_heads, scale, o_tile, pat, work);
          vs_attn_block (at, &kt, &vt, 0);
          vs_attn_finish (at, &ov, lse);
        }
      else
        {
          SiftAttnOpts opts = { .scale = scale, .causal = TRUE, .q_offset = a };
          g_autoptr (GError) error = NULL;
          if (!sift_attn_dense (&qt, &kt, &vt, &opts, &ov, lse, &error))
            g_error ("dense: %s", error->message);
        }
      seconds += (g_get_monotonic_time () - t0) / 1e6;
      cpu_s += bench_host->cpu_seconds () - c0;
      sampled += (double) rows * a + rows * (rows + 1) / 2.0;
    }
  double total = (double) n * (n + 1) / 2.0;
  *cpu = cpu_s * total / sampled;
  return seconds * total / sampled;
}

static int
run_length (const Options *o, gint64 n)
{
  g_autoptr (GError) error = NULL;
  const gint32 d = o->head_dim, H = o->heads, G = MAX (1, o->heads / (o->q_heads / o->kv_heads));
  const float scale = 1.0f / sqrtf ((float) d);
  const double head_factor = (double) o->q_heads / H;
  g_autofree float *q = g_new (float, (gsize) H * n * d);
  g_autofree float *k = g_new (float, (gsize) G * n * d);
  g_autofree float *v = g_new (float, (gsize) G * n * d);
  g_autofree float *out = g_new (float, (gsize) H * n * d);
  g_autofree float *lse = g_new (float, (gsize) H * n);
  if (o->cfg != NULL)
    {
      if (!bench_host->synth_qkv (o->cfg, H, n, q, k, v, &error))
        {
          fprintf (stderr, "sift bench policy minference: %s\n", error->message);
          return 2;
        }
    }
  else
    fill_qkv (o, n, q, k, v);
  SiftView qv = sift_view_htd (q, SIFT_DTYPE_F32, H, n, d);
  SiftView kv = sift_view_htd (k, SIFT_DTYPE_F32, G, n, d);
  SiftView vv = sift_view_htd (v, SIFT_DTYPE_F32, G, n, d);
  SiftView ov = sift_view_htd (out, SIFT_DTYPE_F32, H, n, d);

  VsEstimateOpts est = { o->tile, (gint32) o->last_q, o->sink, o->recent };
  g_autofree VsSizes *sizes = g_new (VsSizes, H);
  for (gint32 h = 0; h < H; h++)
    vs_sizes (n, o->vertical, o->slash, o->budget, o->sink, o->recent, &sizes[h].vertical, &sizes[h].slash);
  VsStats st = { 0 };
  /* Touch the output first: the dense timing reuses a warm buffer, so the
   * page faults of a fresh one would count against the sparse side only. */
  memset (out, 0, (gsize) H * n * d * sizeof (float));
  memset (lse, 0, (gsize) H * n * sizeof (float));
  /* Likewise the kernel's workspace: the policy keeps one for all layers
   * and chunks, so a run faults it in once, not once per layer. The first
   * touch is timed apart (the "work" column). */
  g_autoptr (VsWork) work = vs_work_new ();
  gint64 tw = g_get_monotonic_time ();
  gint64 max_vertical = 0;
  for (gint32 h = 0; h < H; h++)
    max_vertical = MAX (max_vertical, sizes[h].vertical);
  vs_work_reserve (work, H, n, d, G, n, max_vertical);
  double work_s = (g_get_monotonic_time () - tw) / 1e6 * head_factor;
  gint64 t0 = g_get_monotonic_time ();
  double c0 = bench_host->cpu_seconds ();
  if (!vs_prefill (&qv, &kv, &vv, scale, &est, sizes, work, &ov, lse, &st, &error))
    {
      fprintf (stderr, "sift: minference prefill: %s\n", error->message);
      return 2;
    }
  double sparse = (g_get_monotonic_time () - t0) / 1e6 * head_factor;
  double sparse_cpu = (bench_host->cpu_seconds () - c0) * head_factor;
  double dense_cpu, dense_vs_cpu;
  double dense = time_dense (&qv, &kv, &vv, scale, o->dense_tiles, o->tile, FALSE, &dense_cpu) * head_factor;
  double dense_vs = time_dense (&qv, &kv, &vv, scale, o->dense_tiles, o->tile, TRUE, &dense_vs_cpu) * head_factor;
  dense_cpu *= head_factor;
  dense_vs_cpu *= head_factor;
  printf ("%8" G_GINT64_FORMAT "  %7.4f  %8.2f %8.2f  %7.2f  %6.2f  %8.2f %8.2f  %8.2f %8.2f  %6.2fx %6.2fx  %6.2fx\n",
          n, (double) st.keys_attended / (double) st.keys_causal, sparse, sparse_cpu,
          st.seconds_estimate * head_factor, work_s, dense, dense_cpu, dense_vs, dense_vs_cpu,
          dense / sparse, dense_cpu / sparse_cpu, dense_vs_cpu / sparse_cpu);
  fflush (stdout);
  return 0;
}

SIFT_POLICY_BENCH_DEFINE (minference)
{
  bench_host = host;
  Options o = {
    .q_heads = 32, .kv_heads = 8, .head_dim = 128, .heads = 32, .tile = VS_TILE_DEFAULT,
    .vertical = 1000, .slash = 6096, .last_q = 64, .sink = 30, .recent = 100,
    .dense_tiles = 16, .threads = 0, .seed = 1,
  };
  const GOptionEntry entries[] = {
    { "lengths", 'n', 0, G_OPTION_ARG_STRING, &o.lengths, "sequence lengths, comma-separated (default 32768,131072)", "N,..." },
    { "heads", 0, 0, G_OPTION_ARG_INT, &o.heads, "query heads actually run (times scaled to --q-heads)", "H" },
    { "q-heads", 0, 0, G_OPTION_ARG_INT, &o.q_heads, "model query heads (32)", "H" },
    { "kv-heads", 0, 0, G_OPTION_ARG_INT, &o.kv_heads, "model kv heads (8)", "H" },
    { "head-dim", 0, 0, G_OPTION_ARG_INT, &o.head_dim, "head dimension (128)", "D" },
    { "vertical", 0, 0, G_OPTION_ARG_INT64, &o.vertical, "vertical_size (1000)", "N" },
    { "slash", 0, 0, G_OPTION_ARG_INT64, &o.slash, "slash_size (6096)", "N" },
    { "budget", 0, 0, G_OPTION_ARG_DOUBLE, &o.budget, "adaptive budget fraction (0: fixed sizes)", "F" },
    { "tile", 0, 0, G_OPTION_ARG_INT, &o.tile, "query rows per kernel tile (4)", "N" },
    { "last-q", 0, 0, G_OPTION_ARG_INT64, &o.last_q, "estimation rows (64)", "N" },
    { "dense-tiles", 0, 0, G_OPTION_ARG_INT, &o.dense_tiles, "64-row tiles dense is timed on, scaled to all rows (16)", "N" },
    { "threads", 't', 0, G_OPTION_ARG_INT, &o.threads, "threads (default: SIFT_THREADS or all CPUs)", "N" },
    { "data", 0, 0, G_OPTION_ARG_STRING, &o.data, "rope (position-structured q/k, default), random, or synth (the synthetic model of --config)", "KIND" },
    { "config", 0, 0, G_OPTION_ARG_FILENAME, &o.config, "with --data synth: the config whose synthetic source gives Q/K/V and the shape (configs/large.yaml)", "FILE" },
    { "seed", 0, 0, G_OPTION_ARG_INT64, &o.seed, "random seed (1)", "S" },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = g_option_context_new ("- MInference prefill against dense");
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (ctx, &argc, &argv, &error))
    {
      fprintf (stderr, "sift bench policy minference: %s\n", error->message);
      return 2;
    }
  g_autofree char *lengths = o.lengths ? o.lengths : g_strdup ("32768,131072");
  g_autofree char *data = o.data ? o.data : g_strdup ("rope");
  o.lengths = lengths;
  o.data = data;
  g_autofree char *config = o.config;
  g_autoptr (SiftConfig) cfg = NULL;
  if (config != NULL && strcmp (data, "synth") != 0)
    {
      fprintf (stderr, "sift bench policy minference: --config is the input of --data synth\n");
      return 2;
    }
  if (strcmp (data, "synth") == 0)
    {
      if (config == NULL)
        config = g_build_filename (host->config_dir, "large.yaml", NULL);
      cfg = sift_config_load (config, NULL, &error);
      if (cfg == NULL)
        {
          fprintf (stderr, "sift bench policy minference: %s\n", error->message);
          return 2;
        }
      o.cfg = cfg;
      o.q_heads = cfg->shape.n_q_heads;
      o.kv_heads = cfg->shape.n_kv_heads;
      o.head_dim = cfg->shape.head_dim;
      o.heads = MIN (o.heads, o.q_heads);
    }
  if (o.q_heads <= 0 || o.kv_heads <= 0 || o.q_heads % o.kv_heads != 0 || o.head_dim <= 0
      || o.head_dim % 2 != 0 || o.heads <= 0 || o.heads > o.q_heads || o.heads % (o.q_heads / o.kv_heads) != 0
      || o.dense_tiles < 1 || o.last_q < 1 || o.tile < 1 || o.tile > VS_TILE_MAX || (strcmp (data, "rope") != 0 && strcmp (data, "random") != 0 && strcmp (data, "synth") != 0))
    {
      fprintf (stderr, "sift bench policy minference: bad shape or option (heads must be a multiple of "
                       "q-heads / kv-heads, head-dim even, data rope|random|synth)\n");
      return 2;
    }
  g_auto (GStrv) parts = g_strsplit (lengths, ",", -1);
  const gsize n_lengths = g_strv_length (parts);
  g_autofree gint64 *ns = g_new (gint64, MAX (n_lengths, 1));
  for (gsize i = 0; i < n_lengths; i++)
    {
      char *end = NULL;
      ns[i] = g_ascii_strtoll (parts[i], &end, 10);
      if (end == parts[i] || *end != '\0' || ns[i] < 1)
        {
          fprintf (stderr, "sift bench policy minference: bad length '%s'\n", parts[i]);
          return 2;
        }
    }
  if (o.threads > 0)
    sift_parallel_set_n_threads (o.threads);
  printf ("# minference prefill, whole prompt: %d q heads (%d run), %d kv heads, head_dim %d; "
          "vertical %" G_GINT64_FORMAT ", slash %" G_GINT64_FORMAT ", budget %g, last_q %" G_GINT64_FORMAT
          ", tile %d; data %s; isa %s, %d threads\n",
          o.q_heads, o.heads, o.kv_heads, o.head_dim, o.vertical, o.slash, o.budget, o.last_q, o.tile, data,
          sift_isa_name (sift_isa_active ()), sift_parallel_n_threads ());
  if (cfg != NULL)
    printf ("# input: synthetic source of %s (seed %" G_GUINT64_FORMAT ", its knobs, no needle), layer 0\n", config,
            bench_host->synth_seed (cfg));
  printf ("# seconds (wall, cpu) for all %d heads; sparse includes the estimate (estim, wall); work = the "
          "first touch of the kernel's workspace, once per run (not in sparse); dense = sift_attn_dense, densevs = the sparse kernel keeping every diagonal, both timed on %d 64-row "
          "tiles and scaled by causal work; speedups: wall, cpu, cpu against densevs\n",
          o.q_heads, o.dense_tiles);
  printf ("#    len  density    sparse      cpu    estim    work     dense      cpu   densevs      cpu   speedup  cpu-x   vs-x\n");
  for (gsize i = 0; i < n_lengths; i++)
    {
      int rc = run_length (&o, ns[i]);
      if (rc != 0)
        return rc;
    }
  return 0;
}
