/* The harness's built-in sanity (docs/needle.md): dense attention passes
 * every cell; the sinkwindow test plugin passes exactly the needles it
 * keeps; with needles off nothing passes. Cells run through the real
 * engine, runner and plugins. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "harness.h"

static SiftConfig *
load_file (const char *file, const char *const *sets)
{
  const char *dirs[] = { SINKWINDOW_DIR, NULL };
  g_autoptr (SiftRegistry) registry = sift_registry_new (dirs);
  g_autoptr (GError) error = NULL;
  SiftConfig *cfg = sift_config_load (file, registry, &error);
  if (cfg == NULL)
    fail_msg ("%s", error->message);
  for (; sets != NULL && *sets != NULL; sets++)
    if (!sift_config_set (cfg, *sets, registry, &error))
      fail_msg ("%s", error->message);
  return cfg;
}

static SiftConfig *
load (const char *const *sets)
{
  return load_file (SOURCE_DIR "/sanity.yaml", sets);
}

static const SiftPolicySetup *
setup_named (const SiftConfig *cfg, const char *label)
{
  for (guint i = 0; i < cfg->setups->len; i++)
    {
      const SiftPolicySetup *s = g_ptr_array_index (cfg->setups, i);
      if (g_strcmp0 (s->label, label) == 0)
        return s;
    }
  fail_msg ("no setup %s", label);
  return NULL;
}

static HarnessCell
run (const SiftConfig *cfg, const char *label, gint64 length, double depth)
{
  HarnessCell cell;
  g_autoptr (GError) error = NULL;
  if (!harness_run_cell (cfg, setup_named (cfg, label), length, depth, &cell, &error))
    fail_msg ("%s", error->message);
  return cell;
}

static void
test_full_passes_every_cell (void **state)
{
  (void) state;
  g_autoptr (SiftConfig) cfg = load (NULL);
  for (gsize d = 0; d < sift_harness_config (cfg)->n_depths; d++)
    {
      HarnessCell c = run (cfg, "full", sift_harness_config (cfg)->lengths[0], sift_harness_config (cfg)->depths[d]);
      assert_true (c.prefill_pass && c.decode_pass && c.pass);
      /* No selection in either phase: recall is unknown, not 100%. */
      assert_true (isnan (c.prefill_recall) && isnan (c.decode_recall));
      assert_true (c.prefill_density == 1.0 && c.decode_density == 1.0);
      /* A random selection of every block is the full selection. */
      assert_int_equal (c.baseline.n_seeds, sift_harness_config (cfg)->baseline_seeds);
      for (gsize s = 0; s < c.baseline.n_seeds; s++)
        assert_true (c.baseline.pass[s] && c.baseline.prefill_retrieval[s] == c.prefill_retrieval
                     && c.baseline.decode_retrieval[s] == c.decode_retrieval);
      /* f16 store against the f32 reference. */
      assert_true (c.prefill_rel_error < 1e-2 && c.decode_rel_error < 1e-2);
      assert_true (c.chance < 2e-3); /* one code of the 768 in context */
      harness_cell_clear (&c);
    }
}

/* Whether sinkwindow keeps `pos` for query rows starting at q_pos: its
 * block holds a sink token, reaches into the window, or is not stored yet
 * (the current chunk, attended anyway). Slow and obvious, from the
 * plugin's documented rule. */
static gboolean
kept (gint64 pos, gint64 q_pos, gint64 block, gint64 sinks, gint64 window, gint64 stored_end)
{
  gint64 first = pos / block * block;
  if (pos >= stored_end)
    return TRUE;
  return first < sinks || MIN (first + block, stored_end) > q_pos - window;
}

static void
test_sinkwindow_fails_outside_window (void **state)
{
  (void) state;
  g_autoptr (SiftConfig) cfg = load (NULL);
  gint64 n = sift_harness_config (cfg)->lengths[0], block = cfg->shape.block_size, chunk = cfg->shape.chunk_size;
  int inside = 0, outside = 0;
  for (gsize d = 0; d < sift_harness_config (cfg)->n_depths; d++)
    {
      HarnessCell c = run (cfg, "sinkwindow", n, sift_harness_config (cfg)->depths[d]);
      gint64 pos = c.needle_positions[0];
      /* Prefill: the question sits in the last chunk; decode: rows past the prompt. */
      gint64 last_chunk = (n - 1) / chunk * chunk;
      gboolean in_prefill = kept (pos, last_chunk, block, 4, 192, last_chunk);
      gboolean in_decode = kept (pos, n, block, 4, 192, n / block * block);
      assert_int_equal (c.prefill_pass, in_prefill);
      assert_int_equal (c.decode_pass, in_decode);
      assert_true (c.prefill_recall == (in_prefill ? 1.0 : 0.0));
      for (gint32 l = 0; l < c.n_layers; l++)
        {
          assert_true (c.recall_by_layer[l] == (in_prefill ? 1.0 : 0.0));
          assert_true (c.recall_by_layer[c.n_layers + l] == (in_decode ? 1.0 : 0.0));
        }
      assert_true (c.prefill_density < 1.0);
      inside += in_prefill && in_decode;
      outside += !in_prefill && !in_decode;
      harness_cell_clear (&c);
    }
  /* The grid must test both sides. */
  assert_true (inside >= 2 && outside >= 2);
}

/* The random baseline where its hit rate is known: sinkwindow (sanity.yaml,
 * 768 tokens, chunks of 128, window 192) keeps 4 of the 10 stored blocks
 * at the prompt's question call (the sink block, blocks 7-9) and 4 of the
 * 12 at every decode step (block 0, blocks 9-11), worked out from its rule.
 * A random draw of 4 blocks holds a given block with probability 4/10 and
 * 4/12; the needle (depths 0.1-0.6: blocks 1-6, outside the window) is hit
 * exactly when held, so both the baseline's needle recall and its
 * retrieval must come out near 0.4 and 1/3 (32 seeds x 6 cells x 2
 * layers: 384 prefill and 1536 decode draws, 4 standard deviations). */
static void
test_baseline_hit_rate (void **state)
{
  (void) state;
  const char *sets[] = { "harness.baseline_seeds=32", NULL };
  g_autoptr (SiftConfig) cfg = load (sets);
  const double depths[] = { 0.1, 0.2, 0.3, 0.4, 0.5, 0.6 };
  const gsize n = G_N_ELEMENTS (depths);
  double recall[2] = { 0 }, hits[2] = { 0 };
  for (gsize d = 0; d < n; d++)
    {
      HarnessCell c = run (cfg, "sinkwindow", sift_harness_config (cfg)->lengths[0], depths[d]);
      assert_true (c.needle_positions[0] >= 64 && c.needle_positions[0] < 448);
      assert_false (c.prefill_pass || c.decode_pass); /* the policy itself misses it */
      assert_int_equal (c.baseline.n_seeds, 32);
      recall[0] += c.baseline.prefill_recall / (double) n;
      recall[1] += c.baseline.decode_recall / (double) n;
      for (gsize s = 0; s < 32; s++)
        {
          hits[0] += c.baseline.prefill_retrieval[s] / (32.0 * (double) n);
          hits[1] += c.baseline.decode_retrieval[s] / (32.0 * (double) n);
        }
      harness_cell_clear (&c);
    }
  if (g_getenv ("SIFT_TEST_VERBOSE"))
    g_printerr ("baseline recall %.3f %.3f hits %.3f %.3f\n", recall[0], recall[1], hits[0], hits[1]);
  assert_true (fabs (recall[0] - 0.4) < 0.1 && fabs (hits[0] - 0.4) < 0.1);
  assert_true (fabs (recall[1] - 1.0 / 3.0) < 0.05 && fabs (hits[1] - 1.0 / 3.0) < 0.05);
}

/* What a bounded cache held at every attention call of a run: its
 * stored tokens (per call), their positions (call after call), and where
 * the tokens not yet stored began. */
typedef struct {
  GArray *stored;   /* gint64 */
  GArray *kv_len;   /* gint64 */
  GArray *kept;     /* gint64 */
} Trace;

static void
trace_attention (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  Trace *t = user_data;
  (void) out;
  (void) lse;
  gint64 n = 0;
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    {
      g_array_append_vals (t->kept, sift_engine_block_positions (ctx->engine, ctx->layer, b), ctx->blocks[b].n_valid);
      n += ctx->blocks[b].n_valid;
    }
  g_array_append_val (t->stored, n);
  g_array_append_val (t->kv_len, ctx->kv_len);
}

/* The cell (length, depth 0.5) through setup `label`, or with label NULL
 * through the random eviction baseline's policies seeded with `seed`. */
static Trace
trace_run (const SiftConfig *cfg, const char *label, guint64 seed)
{
  const SiftHarnessConfig *h = sift_harness_config (cfg);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (h, h->lengths[0], 0.5, sift_synthetic_config (cfg)->sink_tokens,
                                                          cfg->shape.block_size, h->seed, &error);
  assert_non_null (plan);
  g_autoptr (SiftModel) src = sift_model_synthetic_new (&cfg->shape, sift_synthetic_seed (cfg),
                                                        sift_synthetic_config (cfg), plan, &error);
  assert_non_null (src);
  g_autofree char *store = harness_store_path (cfg, "kv.store", &error);
  HarnessPipeline pl;
  SiftPolicy **prefill, **decode;
  gboolean ok = label != NULL ? harness_pipeline_init (&pl, cfg, setup_named (cfg, label), src, store, &error)
                              : harness_random_policies_new (&cfg->shape, NAN, NAN, seed, &prefill, &decode, &error)
                                  && harness_pipeline_init_with (&pl, cfg, src, prefill, decode, store, &error);
  if (!ok)
    fail_msg ("%s", error->message);
  Trace t = { g_array_new (FALSE, FALSE, sizeof (gint64)), g_array_new (FALSE, FALSE, sizeof (gint64)),
              g_array_new (FALSE, FALSE, sizeof (gint64)) };
  SiftRunnerObserver obs = { .attention = trace_attention };
  sift_runner_set_observer (pl.runner, &obs, &t);
  ok = sift_runner_prefill (pl.runner, h->lengths[0], NULL, NULL, &error);
  for (gint64 s = 0; ok && s < h->decode_steps; s++)
    ok = sift_runner_decode (pl.runner, 1, NULL, NULL, &error);
  if (!ok)
    fail_msg ("%s", error->message);
  harness_pipeline_clear (&pl);
  return t;
}

static void
trace_clear (Trace *t)
{
  g_array_unref (t->stored);
  g_array_unref (t->kv_len);
  g_array_unref (t->kept);
}

static gboolean
same (const GArray *a, const GArray *b)
{
  return a->len == b->len && memcmp (a->data, b->data, a->len * sizeof (gint64)) == 0;
}

/* The random eviction baseline keeps exactly the capacity: at every call
 * min(tokens stored so far, capacity), as many as sinks+window and h2o
 * keep at the same call (128-token chunks and 100 decode steps: evictions
 * in both phases); its victims are reproducible for a seed, differ
 * between seeds and from the oldest-first ones; with block granularity
 * whole blocks go. */
static void
test_random_eviction_keeps_capacity (void **state)
{
  (void) state;
  const char *sets[] = { "kv.chunk_size=128", "harness.decode_steps=100", NULL };
  g_autoptr (SiftConfig) cfg = load_file (SOURCE_DIR "/evict.yaml", sets);
  const gint64 cap = sift_kv_config (cfg)->capacity_tokens, length = sift_harness_config (cfg)->lengths[0];
  Trace r = trace_run (cfg, NULL, 1), again = trace_run (cfg, NULL, 1), other = trace_run (cfg, NULL, 2);
  Trace window = trace_run (cfg, "sinks+window", 0), h2o = trace_run (cfg, "h2o", 0);
  int evicted_prefill = 0, evicted_decode = 0;
  for (guint i = 0; i < r.stored->len; i++)
    {
      gint64 stored = g_array_index (r.stored, gint64, i), kv_len = g_array_index (r.kv_len, gint64, i);
      assert_int_equal (stored, MIN (kv_len, cap));
      evicted_prefill += kv_len > cap && kv_len <= length;
      evicted_decode += kv_len > length;
    }
  assert_true (evicted_prefill > 0 && evicted_decode > 0);
  assert_true (same (r.stored, window.stored) && same (r.stored, h2o.stored));
  assert_true (same (r.kv_len, window.kv_len));
  assert_true (same (r.kept, again.kept));
  assert_false (same (r.kept, other.kept));
  assert_false (same (r.kept, window.kept));
  trace_clear (&r);
  trace_clear (&again);
  trace_clear (&other);
  trace_clear (&window);
  trace_clear (&h2o);

  const char *blocks[] = { "kv.chunk_size=128", "harness.decode_steps=100", "kv.evict_granularity=block", NULL };
  g_autoptr (SiftConfig) bcfg = load_file (SOURCE_DIR "/evict.yaml", blocks);
  const gint64 bs = bcfg->shape.block_size;
  Trace b = trace_run (bcfg, NULL, 1);
  gsize at = 0;
  for (guint i = 0; i < b.stored->len; i++)
    {
      gint64 stored = g_array_index (b.stored, gint64, i), kv_len = g_array_index (b.kv_len, gint64, i);
      assert_true (stored <= cap && stored > MIN (kv_len, cap) - bs);
      /* Whole blocks as written: runs of block_size positions from a multiple of it. */
      for (gint64 j = 0; j < stored; j++)
        {
          gint64 p = g_array_index (b.kept, gint64, at + (gsize) j);
          assert_true (j % bs != 0 || p % bs == 0);
          assert_true (j % bs == 0 || p == g_array_index (b.kept, gint64, at + (gsize) j - 1) + 1);
        }
      at += (gsize) stored;
    }
  trace_clear (&b);
}

/* The random eviction baseline's hit rate where it is known: evict.yaml
 * prefills its 768 tokens as one chunk (the question's rows attend them
 * all) and evicts once to 384 before the decode steps, uniformly among the
 * tokens outside the 4 sinks and the 64 recent ones, so a needle among
 * them stays with probability (384 - 68) / (768 - 68) in each layer, and
 * is hit exactly when kept. Over 32 seeds x 2 layers x 6 cells both the
 * decode recall and the decode retrieval must come out there (4 binomial
 * standard deviations; draws of one seed in different cells are
 * negatively correlated, which only narrows the spread). */
static void
test_random_eviction_hit_rate (void **state)
{
  (void) state;
  const char *sets[] = { "harness.baseline_seeds=32", NULL };
  g_autoptr (SiftConfig) cfg = load_file (SOURCE_DIR "/evict.yaml", sets);
  const SiftKvConfig *kv = sift_kv_config (cfg);
  const gint64 length = sift_harness_config (cfg)->lengths[0], guarded = kv->protect_sinks + kv->protect_recent;
  const double p = (double) (kv->capacity_tokens - guarded) / (double) (length - guarded);
  const double depths[] = { 0.1, 0.2, 0.3, 0.4, 0.5, 0.6 };
  const gsize n = G_N_ELEMENTS (depths);
  double recall = 0, hits = 0;
  for (gsize d = 0; d < n; d++)
    {
      HarnessCell c = run (cfg, "sinks+window", length, depths[d]);
      assert_true (c.needle_positions[0] >= kv->protect_sinks && c.needle_positions[0] < length - kv->protect_recent);
      assert_int_equal (c.baseline.n_seeds, 32);
      assert_int_equal (c.baseline.capacity_tokens, kv->capacity_tokens);
      /* As many tokens evicted as the policy: (768 - 384) per layer. */
      assert_true (c.baseline.tokens_evicted == (double) (c.prefill_counters.tokens_evicted + c.decode_counters.tokens_evicted));
      assert_true (c.baseline.tokens_evicted == (double) (cfg->shape.n_layers * (length - kv->capacity_tokens)));
      assert_true (c.baseline.prefill_recall == 1.0);
      recall += c.baseline.decode_recall / (double) n;
      for (gsize s = 0; s < 32; s++)
        {
          assert_true (c.baseline.prefill_retrieval[s] == 1.0);
          hits += c.baseline.decode_retrieval[s] / (32.0 * (double) n);
        }
      harness_cell_clear (&c);
    }
  double sd = sqrt (p * (1 - p) / (32.0 * (double) cfg->shape.n_layers * (double) n));
  if (g_getenv ("SIFT_TEST_VERBOSE"))
    g_printerr ("eviction baseline recall %.3f hits %.3f expected %.3f +- %.3f\n", recall, hits, p, sd);
  assert_true (fabs (recall - p) < 4 * sd && fabs (hits - p) < 4 * sd);
}

/* A layer forced dense sees every block: the needle outside the window is
 * covered there and only there. */
static void
test_dense_layers_recall (void **state)
{
  (void) state;
  const char *sets[] = { "policies.sinkwindow.dense_layers=[0]", NULL };
  g_autoptr (SiftConfig) cfg = load (sets);
  HarnessCell c = run (cfg, "sinkwindow", sift_harness_config (cfg)->lengths[0], 0.5);
  assert_int_equal (c.n_layers, 2);
  assert_true (c.recall_by_layer[0] == 1.0 && c.recall_by_layer[1] == 0.0);  /* prefill */
  assert_true (c.recall_by_layer[2] == 1.0 && c.recall_by_layer[3] == 0.0);  /* decode */
  assert_true (fabs (c.prefill_recall - 0.5) < 1e-12);
  /* Per head: [phase][layer][head], every head of the dense layer covered,
   * none of the windowed one (the plugin selects for all heads alike). */
  assert_int_equal (c.n_q_heads, cfg->shape.n_q_heads);
  for (gint32 ph = 0; ph < 2; ph++)
    for (gint32 l = 0; l < 2; l++)
      for (gint32 h = 0; h < c.n_q_heads; h++)
        assert_true (c.recall_by_head[(ph * 2 + l) * c.n_q_heads + h] == (l == 0 ? 1.0 : 0.0));
  harness_cell_clear (&c);
}

static const char *const kinds[] = { "single", "multikey", "multivalue", "multiquery" };

static void
test_needles_off_nothing_passes (void **state)
{
  (void) state;
  for (gsize k = 0; k < G_N_ELEMENTS (kinds); k++)
    {
      g_autofree char *kind = g_strdup_printf ("harness.needle=%s", kinds[k]);
      const char *sets[] = { "model.synthetic.needle_strength=0", kind, NULL };
      g_autoptr (SiftConfig) cfg = load (sets);
      /* Next to the sinks and next to the question: where luck would come from. */
      const double depths[] = { 0.0, 1.0 };
      for (gsize d = 0; d < G_N_ELEMENTS (depths); d++)
        {
          HarnessCell c = run (cfg, "full", 512, depths[d]);
          assert_false (c.prefill_pass || c.decode_pass || c.pass);
          assert_true (c.prefill_retrieval < 0.5 && c.decode_retrieval < 0.5);
          assert_true (c.chance > 0 && c.chance < 0.01);
          harness_cell_clear (&c);
        }
    }
}

/* Every RULER variant at default difficulty: dense attention retrieves. */
static void
test_every_kind_full_passes (void **state)
{
  (void) state;
  for (gsize k = 0; k < G_N_ELEMENTS (kinds); k++)
    {
      g_autofree char *kind = g_strdup_printf ("harness.needle=%s", kinds[k]);
      const char *sets[] = { kind, NULL };
      g_autoptr (SiftConfig) cfg = load (sets);
      const double depths[] = { 0.0, 0.5, 1.0 };
      for (gsize d = 0; d < G_N_ELEMENTS (depths); d++)
        {
          HarnessCell c = run (cfg, "full", 512, depths[d]);
          if (!c.pass)
            fail_msg ("%s at depth %g: retrieval %g / %g", kinds[k], depths[d], c.prefill_retrieval,
                      c.decode_retrieval);
          assert_int_equal (c.n_needle_positions, k == 1 ? 4 : k == 2 ? 3 : k == 3 ? 2 : 1);
          harness_cell_clear (&c);
        }
    }
}

/* The shipped synthetic configs load, expand, plan and build their model
 * (configs/default.yaml runs the GGUF model: test-text-model.c). */
static void
test_shipped_configs (void **state)
{
  (void) state;
  const char *files[] = { CONFIG_DIR "/synthetic.yaml", CONFIG_DIR "/large.yaml" };
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  for (gsize f = 0; f < G_N_ELEMENTS (files); f++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (SiftConfig) cfg = sift_config_load (files[f], registry, &error);
      if (cfg == NULL)
        fail_msg ("%s", error->message);
      HarnessGrid g;
      assert_true (harness_grid_expand (sift_harness_config (cfg), &g, &error));
      assert_true (g.n_lengths * g.n_depths >= 3);
      for (gsize l = 0; l < g.n_lengths; l++)
        {
          g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (sift_harness_config (cfg), g.lengths[l], 1.0,
                                                                  sift_synthetic_config (cfg)->sink_tokens, cfg->shape.block_size, sift_harness_config (cfg)->seed, &error);
          assert_non_null (plan);
          g_autoptr (SiftModel) src = sift_model_synthetic_new (&cfg->shape, sift_synthetic_seed (cfg), sift_synthetic_config (cfg), plan,
                                                                      &error);
          assert_non_null (src);
        }
      harness_grid_clear (&g);
    }
}

int
main (void)
{
  sift_harness_config_register ();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_full_passes_every_cell),
    cmocka_unit_test (test_sinkwindow_fails_outside_window),
    cmocka_unit_test (test_dense_layers_recall),
    cmocka_unit_test (test_baseline_hit_rate),
    cmocka_unit_test (test_random_eviction_keeps_capacity),
    cmocka_unit_test (test_random_eviction_hit_rate),
    cmocka_unit_test (test_needles_off_nothing_passes),
    cmocka_unit_test (test_every_kind_full_passes),
    cmocka_unit_test (test_shipped_configs),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
