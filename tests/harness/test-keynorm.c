/* Planted keys give a policy that ranks blocks by key norm alone (the
 * keynorm test plugin, no query) nothing beyond luck (issue 22): at 16K,
 * with a budget of 1/8 of the blocks, it may hold the needle's block in the
 * retrieval head's group by chance in about 1 interior cell of 8; it must
 * not pass more than 3 of 6 (binomial tail < 1 %), nor hold the needle in
 * most of its selections. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "harness.h"

static void
test_keynorm_fails_interior_cells (void **state)
{
  (void) state;
  const char *dirs[] = { SINKWINDOW_DIR, NULL };
  g_autoptr (SiftRegistry) registry = sift_registry_new (dirs);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) cfg = sift_config_load (SOURCE_DIR "/keynorm.yaml", registry, &error);
  if (cfg == NULL)
    fail_msg ("%s", error->message);
  const SiftPolicySetup *setup = g_ptr_array_index (cfg->setups, 0);
  const double depths[] = { 0.2, 0.3, 0.4, 0.6, 0.7, 0.8 };
  int passed = 0;
  double recall = 0;
  for (gsize d = 0; d < G_N_ELEMENTS (depths); d++)
    {
      HarnessCell c;
      if (!harness_run_cell (cfg, setup, sift_harness_config (cfg)->lengths[0], depths[d], &c, &error))
        fail_msg ("%s", error->message);
      assert_true (c.decode_density <= 0.13); /* 2048 of 16384 tokens */
      passed += c.decode_pass;
      recall += c.decode_recall / (double) G_N_ELEMENTS (depths);
      harness_cell_clear (&c);
    }
  if (g_getenv ("SIFT_TEST_VERBOSE"))
    g_printerr ("keynorm: %d of %zu interior cells passed, decode recall %.3f\n", passed, G_N_ELEMENTS (depths),
                recall);
  assert_true (passed <= 3);
  assert_true (recall < 0.5);
}

int
main (void)
{
  sift_harness_config_register ();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_keynorm_fails_interior_cells),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
