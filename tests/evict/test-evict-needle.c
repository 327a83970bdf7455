/* The needle harness's capacity axis (harness.capacities): the grid runs
 * once per KV budget; under a budget below the context plus the decode
 * steps, H2O keeps a needle the decode steps keep asking for where sinks +
 * window loses the early ones; unbounded, both pass every cell. The table
 * gains "accuracy by KV budget". */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "harness.h"

static const char *yaml =
  "model: {source: synthetic, layers: 2, q_heads: 4, kv_heads: 2, head_dim: 64}\n"
  "kv: {block_size: 32, chunk_size: 256, protect_sinks: 4, protect_recent: 32}\n"
  "harness: {lengths: [512], depths: [0.0, 0.5, 1.0], decode_steps: 64, capacities: [320, 0]}\n"
  "policies:\n"
  "  - {label: window, prefill: full, decode: full}\n"
  "  - {label: h2o, prefill: h2o, decode: h2o}\n";

static void
test_capacity_axis (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) cfg = sift_config_load_string ("capacity.yaml", yaml, registry, &error);
  if (cfg == NULL)
    fail_msg ("%s", error->message);
  g_autofree char *dir = g_dir_make_tmp ("sift-evict-needle-XXXXXX", NULL);
  char *table = NULL;
  size_t table_len = 0;
  FILE *to = open_memstream (&table, &table_len);
  FILE *log = fopen ("/dev/null", "w");
  HarnessOptions o = { .out_dir = dir, .table = to, .log = log };
  gboolean below = FALSE;
  gboolean ok = harness_needle_run (cfg, &o, &below, &error);
  fclose (to);
  fclose (log);
  if (!ok)
    fail_msg ("%s", error->message);
  g_autofree char *t = table;
  /* One row per setup and budget, then the budget table. */
  const char *want[] = { "window@320 ", "h2o@320 ", "window@unbounded ", "h2o@unbounded ",
                         "accuracy (decode recall) by KV budget", "\nwindow ", "\nh2o " };
  for (gsize i = 0; i < G_N_ELEMENTS (want); i++)
    if (strstr (t, want[i]) == NULL)
      fail_msg ("the table lacks '%s':\n%s", want[i], t);
  /* The budget table's rows: window loses the needle at depth 0 under 320
   * tokens, h2o keeps every needle; unbounded both pass. */
  const char *w = strstr (t, "\nwindow "), *h = strstr (t, "\nh2o ");
  double w320, wun, h320, hun;
  assert_int_equal (sscanf (w, " window %lf%% (%*f%%) %lf%%", &w320, &wun), 2);
  assert_int_equal (sscanf (h, " h2o %lf%% (%*f%%) %lf%%", &h320, &hun), 2);
  if (!(h320 == 100 && hun == 100 && wun == 100 && w320 < 100))
    fail_msg ("accuracy window %g%% / %g%%, h2o %g%% / %g%% (320 / unbounded):\n%s", w320, wun, h320, hun, t);
  g_autofree char *cmd = g_strdup_printf ("rm -rf '%s'", dir);
  assert_int_equal (system (cmd), 0);
}

/* A budget below what the protected tokens need is a config error naming it. */
static void
test_capacity_too_small (void **state)
{
  (void) state;
  g_autoptr (GError) error = NULL;
  g_autofree char *bad = g_strdup_printf ("%s", yaml);
  char *at = strstr (bad, "[320, 0]");
  memcpy (at, "[ 60, 0]", 8);
  g_autoptr (SiftConfig) cfg = sift_config_load_string ("capacity.yaml", bad, NULL, &error);
  assert_null (cfg);
  assert_true (g_error_matches (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID));
  if (strstr (error->message, "capacity.yaml:3:") == NULL
      || strstr (error->message, "harness.capacities has 60, below the 68 tokens") == NULL)
    fail_msg ("%s", error->message);
}

int
main (void)
{
  sift_harness_config_register ();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_capacity_too_small),
    cmocka_unit_test (test_capacity_axis),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
