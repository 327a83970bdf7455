/* Every sparse setup of configs/synthetic.yaml (the synthetic grid, whose
 * lengths keep the shipped policies sparse) passes more cells than its
 * random baseline (random blocks at its own density, docs/needle.md), on
 * a grid reduced to run in CI: the config's setups, policies and model
 * with one layer, at 16K tokens (where minference, dense below its 6096
 * diagonals, is sparse too) and three interior depths. A setup that is
 * dense in both phases would be its own baseline: only the full setup may
 * be. Measured 2026-11-25 (SIFT_TEST_VERBOSE=1 prints it): minference 3 of
 * 3 against a baseline of 2.8 (its density at 16K is 0.65), xattn_bsa 3 of
 * 3 against 1.2.
 *
 * Exceptions, findings rather than passes (docs/needle.md, "Measured"):
 * setups that stand at chance on the synthetic model. For them the test
 * asserts that they stay within one cell of their baseline, so a change
 * that lifts them above luck shows here.
 *   - quest: with matched planted keys its page bound does not single the
 *     needle's page out (docs/needle.md, "Quest with matched planted
 *     keys");
 *   - subquadratic attends an interior needle exactly only at a
 *     power-of-two distance from the question (its log-stride), otherwise
 *     only through its block's landmark, the mean of 64 keys, which
 *     dilutes the needle 64-fold (docs/policies/subquadratic.md). */

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "harness.h"

static gboolean
at_chance (const char *label)
{
  return g_strcmp0 (label, "quest") == 0 || g_strcmp0 (label, "subquadratic") == 0;
}

static void
test_synthetic_policies_above_random (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) cfg = sift_config_load (CONFIG_DIR "/synthetic.yaml", registry, &error);
  if (cfg == NULL)
    fail_msg ("%s", error->message);
  cfg->shape.n_layers = 1;
  const double depths[] = { 0.1, 0.5, 0.9 };
  const gint64 length = 16384;
  int sparse = 0, above = 0;
  for (guint s = 0; s < cfg->setups->len; s++)
    {
      const SiftPolicySetup *setup = g_ptr_array_index (cfg->setups, s);
      double passed = 0, random = 0, density = 1;
      for (gsize d = 0; d < G_N_ELEMENTS (depths); d++)
        {
          HarnessCell c;
          if (!harness_run_cell (cfg, setup, length, depths[d], &c, &error))
            fail_msg ("%s: %s", setup->label, error->message);
          passed += c.pass;
          random += harness_baseline_pass_mean (&c.baseline);
          density = MIN (density, MIN (c.prefill_density, c.decode_density));
          harness_cell_clear (&c);
        }
      if (g_getenv ("SIFT_TEST_VERBOSE"))
        g_printerr ("%s: %.0f of %zu cells, random %.2f, lowest density %.3f\n", setup->label, passed,
                    G_N_ELEMENTS (depths), random, density);
      if (density >= 1.0)
        {
          if (g_strcmp0 (setup->label, "full") != 0)
            fail_msg ("%s is dense in both phases at %" G_GINT64_FORMAT " tokens", setup->label, length);
          continue;
        }
      sparse++;
      if (at_chance (setup->label))
        {
          if (!(passed <= random + 1.0))
            fail_msg ("%s passes %.0f of %zu cells, more than one above its random baseline %.2f: update "
                      "the finding (docs/needle.md) and this test", setup->label, passed, G_N_ELEMENTS (depths),
                      random);
          continue;
        }
      if (!(passed > random))
        fail_msg ("%s passes %.0f of %zu cells, its random baseline %.2f", setup->label, passed,
                  G_N_ELEMENTS (depths), random);
      above++;
    }
  assert_true (sparse >= 4); /* quest, minference, xattn_bsa, subquadratic */
  assert_true (above >= 2);  /* minference, xattn_bsa */
}

int
main (void)
{
  sift_harness_config_register ();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_synthetic_policies_above_random),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
