/* Every sparse setup of the shipped default config passes more cells than
 * its random baseline (random blocks at its own density, docs/needle.md)
 * on interior depths at 4K, where each is sparse in some phase; a setup
 * that is dense in both phases is its own baseline and is skipped.
 *
 * One exception, a finding rather than a pass: subquadratic attends an
 * interior needle exactly only at a power-of-two distance from the
 * question (its log-stride), otherwise only through its block's landmark,
 * the mean of 64 keys, which dilutes the needle 64-fold
 * (docs/policies/subquadratic.md); measured 2026-11-25 it passes 0 of 5
 * interior cells, as does its baseline. For it the test asserts that it
 * stays within one cell of its baseline, so a change that lifts it above
 * luck shows here. */

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
  return g_strcmp0 (label, "subquadratic") == 0;
}

static void
test_default_policies_above_random (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) cfg = sift_config_load (CONFIG_DIR "/default.yaml", registry, &error);
  if (cfg == NULL)
    fail_msg ("%s", error->message);
  const double depths[] = { 0.1, 0.3, 0.5, 0.7, 0.9 };
  const gint64 length = 4096;
  int sparse = 0;
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
        continue;
      sparse++;
      if (at_chance (setup->label))
        {
          assert_true (passed <= random + 1.0);
          continue;
        }
      if (!(passed > random))
        fail_msg ("%s passes %.0f of %zu cells, its random baseline %.2f", setup->label, passed,
                  G_N_ELEMENTS (depths), random);
    }
  assert_true (sparse >= 3); /* quest, xattn_bsa, subquadratic */
}

int
main (void)
{
  sift_harness_config_register ();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_default_policies_above_random),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
