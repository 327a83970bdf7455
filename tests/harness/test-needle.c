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
    cmocka_unit_test (test_needles_off_nothing_passes),
    cmocka_unit_test (test_every_kind_full_passes),
    cmocka_unit_test (test_shipped_configs),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
