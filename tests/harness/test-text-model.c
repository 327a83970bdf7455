/* The needle harness on the shipped model (models/sift-needle-14m-f16.gguf)
 * with real text: with full attention the model answers a 2K passkey
 * (the value generated, every needle token covered), and a sinks+window
 * cache that drops the needle's tokens fails the same cell; `sift needle
 * --model` runs, resumes, and refuses bad input with exit 2. The haystack
 * is the King James Bible from Debian's `bible` (tools/bootstrap.sh). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <glib/gstdio.h>
#include <sift/sift.h>

#include "harness.h"

#define MODEL SIFT_TEST_MODELS "/sift-needle-14m-f16.gguf"

static char *out_dir;

static SiftConfig *
load (const char *extra)
{
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  g_autofree char *yaml = g_strdup_printf (
    "model: {source: gguf, path: %s}\n"
    "kv: {block_size: 64, chunk_size: 512}\n"
    "harness: {lengths: [2048], depths: [0.25], baseline_seeds: 0, out: %s}\n"
    "policies:\n"
    "  - label: full\n"
    "  - label: sinks+window\n"
    "    capacity_tokens: 512\n%s", MODEL, out_dir, extra);
  g_autoptr (GError) error = NULL;
  SiftConfig *cfg = sift_config_load_string ("test.yaml", yaml, registry, &error);
  if (cfg == NULL)
    fail_msg ("%s", error->message);
  return cfg;
}

static gboolean
have_kjv (void)
{
  g_autofree char *bible = g_find_program_in_path ("bible");
  if (bible == NULL && g_getenv ("CI") != NULL)
    fail_msg ("CI needs the KJV haystack (apt-get install bible-kjv bible-kjv-text)");
  return bible != NULL;
}

static void
test_dense_passes_window_fails (void **state)
{
  (void) state;
  if (!have_kjv ())
    skip ();
  g_autoptr (SiftConfig) cfg = load ("");
  g_autoptr (GError) error = NULL;
  g_autoptr (HarnessText) text = harness_text_new (cfg, &error);
  if (text == NULL)
    fail_msg ("%s", error->message);
  g_autoptr (SiftConfig) local = sift_config_copy (cfg);
  local->shape = *harness_text_shape (text);
  const SiftPolicySetup *full = g_ptr_array_index (cfg->setups, 0);
  const SiftPolicySetup *window = g_ptr_array_index (cfg->setups, 1);

  HarnessCell cell;
  if (!harness_text_run_cell (text, local, full, TRUE, 2048, 0.25, &cell, &error))
    fail_msg ("%s", error->message);
  /* The answer: the value, as trained (" 123456." then EOS). */
  assert_true (cell.pass);
  assert_true (cell.match == 1.0);
  assert_true (cell.exact);
  assert_string_equal (cell.generated, cell.expected);
  /* The needle sits at a quarter of the haystack, long before the window. */
  gint64 needle = cell.needle_spans[0], needle_end = cell.needle_spans[1];
  assert_true (needle > 2048 / 8 && needle < 2048 / 2);
  assert_true (needle_end - needle >= 10);
  /* Full attention over an unbounded cache selects nothing: no recall to
   * speak of, every layer's output is its own reference. */
  assert_true (isnan (cell.prefill_recall));
  assert_true (cell.prefill_rel_error == 0.0);
  assert_true (cell.prefill_density == 1.0);
  harness_cell_clear (&cell);

  /* Sinks + a recent window of 512 tokens: the needle was evicted. */
  sift_kv_config_edit (local)->capacity_tokens = 512;
  if (!harness_text_run_cell (text, local, window, FALSE, 2048, 0.25, &cell, &error))
    fail_msg ("%s", error->message);
  assert_true (needle + 512 < cell.question_start);
  assert_false (cell.pass);
  assert_true (cell.match == 0.0);
  /* Recall under a bounded cache: no needle token is kept. */
  assert_true (cell.prefill_recall == 0.0);
  assert_true (cell.decode_recall == 0.0);
  assert_true (cell.prefill_counters.tokens_evicted > 0);
  /* Its attention differs from the full run's, which was kept as the reference. */
  assert_true (cell.prefill_rel_error > 0.05);
  harness_cell_clear (&cell);
}

/* configs/default.yaml: the shipped model (found beside the config), the
 * seven setups side by side with full first (the others' dense reference),
 * the two bounded ones with their own KV budget, every cell's prompt fits. */
static void
test_default_config (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) cfg = sift_config_load (CONFIG_DIR "/default.yaml", registry, &error);
  if (cfg == NULL)
    fail_msg ("%s", error->message);
  assert_string_equal (cfg->source, "gguf");
  const char *labels[] = { "full", "quest", "minference", "xattn_bsa", "subquadratic", "h2o", "sinks+window" };
  assert_int_equal (cfg->setups->len, G_N_ELEMENTS (labels));
  for (guint i = 0; i < cfg->setups->len; i++)
    {
      const SiftPolicySetup *s = g_ptr_array_index (cfg->setups, i);
      assert_string_equal (s->label, labels[i]);
      gboolean bounded = i >= 5;
      assert_true (bounded ? s->capacity_tokens > 0 : s->capacity_tokens < 0);
    }
  if (!have_kjv ())
    return;
  g_autoptr (HarnessText) text = harness_text_new (cfg, &error);
  if (text == NULL)
    fail_msg ("%s", error->message);
  assert_true (g_str_has_suffix (harness_text_model_path (text), "models/sift-needle-14m-f16.gguf"));
  HarnessGrid g;
  assert_true (harness_grid_expand (sift_harness_config (cfg), &g, &error));
  for (gsize l = 0; l < g.n_lengths; l++)
    {
      assert_true (harness_text_check (text, cfg, g.lengths[l], &error));
      assert_true (g.lengths[l] <= harness_text_context_length (text));
    }
  harness_grid_clear (&g);
}

/* The random baseline draws stored blocks at the setup's measured density:
 * beside a selecting policy that keeps every block (density 1) it is dense
 * attention and answers as full attention does; at a policy's low density
 * it is scored like the cell; beside a bounded cache it evicts at random. */
static void
test_random_baseline (void **state)
{
  (void) state;
  if (!have_kjv ())
    skip ();
  g_autoptr (SiftConfig) cfg = load ("  - label: quest-all\n"
                                     "    decode: {name: quest, params: {token_budget: 1000000, dense_layers: []}}\n"
                                     "  - label: window\n"
                                     "    decode: {name: quest, params: {token_budget: 128, dense_layers: []}}\n");
  g_autoptr (GError) error = NULL;
  g_autoptr (HarnessText) text = harness_text_new (cfg, &error);
  if (text == NULL)
    fail_msg ("%s", error->message);
  g_autoptr (SiftConfig) local = sift_config_copy (cfg);
  local->shape = *harness_text_shape (text);
  ((SiftHarnessConfig *) sift_config_edit_section (local, &sift_harness_config_section))->baseline_seeds = 1;
  HarnessCell cell;
  if (!harness_text_run_cell (text, local, g_ptr_array_index (cfg->setups, 2), FALSE, 2048, 0.25, &cell, &error))
    fail_msg ("%s", error->message);
  assert_true (cell.pass);
  assert_true (cell.decode_density == 1.0);
  assert_true (cell.decode_recall == 1.0);
  assert_int_equal (cell.baseline.n_seeds, 1);
  assert_true (cell.baseline.pass[0]);
  assert_true (cell.baseline.prefill_retrieval[0] == 1.0);
  harness_cell_clear (&cell);

  /* 2 of 32 blocks per head in decode: the baseline runs at that density. */
  if (!harness_text_run_cell (text, local, g_ptr_array_index (cfg->setups, 3), FALSE, 2048, 0.25, &cell, &error))
    fail_msg ("%s", error->message);
  assert_true (cell.decode_density < 0.2);
  assert_int_equal (cell.baseline.n_seeds, 1);
  double m = cell.baseline.prefill_retrieval[0];
  assert_true (m >= 0.0 && m <= 1.0);
  assert_true (cell.baseline.pass[0] == (m == 1.0));
  assert_int_equal (cell.baseline.capacity_tokens, 0);
  harness_cell_clear (&cell);

  /* A bounded cache (sinks+window at 512 tokens) selects nothing: its
   * baseline is random eviction at the same capacity, evicting as many
   * tokens as the policy, scored like the cell. */
  sift_kv_config_edit (local)->capacity_tokens = 512;
  if (!harness_text_run_cell (text, local, g_ptr_array_index (cfg->setups, 1), FALSE, 2048, 0.25, &cell, &error))
    fail_msg ("%s", error->message);
  assert_int_equal (cell.baseline.n_seeds, 1);
  assert_int_equal (cell.baseline.capacity_tokens, 512);
  assert_true (cell.prefill_counters.tokens_evicted > 0);
  assert_true (cell.baseline.tokens_evicted
               == (double) (cell.prefill_counters.tokens_evicted + cell.decode_counters.tokens_evicted));
  m = cell.baseline.prefill_retrieval[0];
  assert_true (m >= 0.0 && m <= 1.0);
  assert_true (cell.baseline.pass[0] == (m == 1.0));
  harness_cell_clear (&cell);
}

typedef struct {
  char *out, *err;
  int status;
} Result;

static Result
sift (const char *const *args)
{
  g_autoptr (GPtrArray) argv = g_ptr_array_new ();
  g_ptr_array_add (argv, (gpointer) SIFT_EXE);
  g_ptr_array_add (argv, (gpointer) "needle");
  for (; *args != NULL; args++)
    g_ptr_array_add (argv, (gpointer) *args);
  g_ptr_array_add (argv, NULL);
  Result r = { 0 };
  int wait = 0;
  g_autoptr (GError) error = NULL;
  if (!g_spawn_sync (NULL, (char **) argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL, &r.out, &r.err, &wait, &error))
    fail_msg ("%s", error->message);
  r.status = WIFEXITED (wait) ? WEXITSTATUS (wait) : -1;
  return r;
}

static void
result_clear (Result *r)
{
  g_free (r->out);
  g_free (r->err);
}

/* `sift needle --model`: the table and a record with the generated text;
 * again: resumed. */
static void
test_cli (void **state)
{
  (void) state;
  if (!have_kjv ())
    skip ();
  g_autofree char *dir = g_build_filename (out_dir, "cli", NULL);
  const char *args[] = { "--config", CONFIG_DIR "/full.yaml", "--model", MODEL, "--out", dir,
                         "--set", "harness.lengths=[1024]", "--set", "harness.depths=[0.5]", NULL };
  Result r = sift (args);
  if (r.status != 0)
    fail_msg ("exit %d: %s", r.status, r.err);
  assert_non_null (strstr (r.out, "match"));
  assert_non_null (strstr (r.out, "100.0%"));
  g_autofree char *records = g_build_filename (dir, "records.jsonl", NULL);
  g_autofree char *text = NULL;
  assert_true (g_file_get_contents (records, &text, NULL, NULL));
  assert_non_null (strstr (text, "\"generated\":"));
  assert_non_null (strstr (text, "\"needle_spans\":[["));
  result_clear (&r);
  r = sift (args);
  assert_int_equal (r.status, 0);
  assert_non_null (strstr (r.err, "resumed 1 of 1"));
  result_clear (&r);
}

/* Bad input: a missing model, a missing haystack, a needle that does not
 * fit; each a clear message and exit 2, before any cell runs. */
static void
test_bad_input (void **state)
{
  (void) state;
  const char *no_model[] = { "--config", CONFIG_DIR "/full.yaml", "--model", "/nonexistent/m.gguf", "--out",
                             out_dir, NULL };
  Result r = sift (no_model);
  assert_int_equal (r.status, 2);
  assert_non_null (strstr (r.err, "/nonexistent/m.gguf: no such file"));
  result_clear (&r);

  const char *no_hay[] = { "--config", CONFIG_DIR "/full.yaml", "--model", MODEL, "--out", out_dir,
                           "--set", "harness.haystack=/nonexistent/hay.txt", NULL };
  r = sift (no_hay);
  assert_int_equal (r.status, 2);
  assert_non_null (strstr (r.err, "/nonexistent/hay.txt"));
  result_clear (&r);

  if (!have_kjv ())
    return;
  const char *short_cell[] = { "--config", CONFIG_DIR "/full.yaml", "--model", MODEL, "--out", out_dir,
                               "--set", "harness.lengths=[80]", NULL };
  r = sift (short_cell);
  assert_int_equal (r.status, 2);
  assert_non_null (strstr (r.err, "context of 80 tokens cannot hold"));
  assert_non_null (strstr (r.err, "--set:1:17")); /* placed at the value given */
  result_clear (&r);
}

static void
remove_tree (const char *dir)
{
  GDir *d = g_dir_open (dir, 0, NULL);
  const char *name;
  while (d != NULL && (name = g_dir_read_name (d)) != NULL)
    {
      g_autofree char *p = g_build_filename (dir, name, NULL);
      if (g_file_test (p, G_FILE_TEST_IS_DIR))
        remove_tree (p);
      else
        g_remove (p);
    }
  if (d != NULL)
    g_dir_close (d);
  g_rmdir (dir);
}

int
main (void)
{
  sift_harness_config_register ();
  out_dir = g_dir_make_tmp ("sift-text-XXXXXX", NULL);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_default_config),
    cmocka_unit_test (test_dense_passes_window_fails),
    cmocka_unit_test (test_random_baseline),
    cmocka_unit_test (test_cli),
    cmocka_unit_test (test_bad_input),
  };
  int status = cmocka_run_group_tests (tests, NULL, NULL);
  remove_tree (out_dir);
  g_free (out_dir);
  return status;
}
