/* `sift needle` end to end: table, records, PNG and SVG heatmaps, resume,
 * and the exit statuses (0 pass, 1 below min_accuracy, 2 config error). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <glib/gstdio.h>
#include <sift/sift.h>

typedef struct {
  char *out;   /* stdout */
  char *err;   /* stderr */
  int status;
} Result;

static Result
sift (const char *const *args)
{
  GPtrArray *argv = g_ptr_array_new ();
  g_ptr_array_add (argv, (gpointer) SIFT_EXE);
  g_ptr_array_add (argv, (gpointer) "needle");
  g_ptr_array_add (argv, (gpointer) "--policy-path");
  g_ptr_array_add (argv, (gpointer) SINKWINDOW_DIR);
  for (; *args != NULL; args++)
    g_ptr_array_add (argv, (gpointer) *args);
  g_ptr_array_add (argv, NULL);
  Result r = { 0 };
  int wait = 0;
  g_autoptr (GError) error = NULL;
  if (!g_spawn_sync (NULL, (char **) argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL, &r.out, &r.err, &wait, &error))
    fail_msg ("%s", error->message);
  r.status = WIFEXITED (wait) ? WEXITSTATUS (wait) : -1;
  g_ptr_array_free (argv, TRUE);
  return r;
}

static void
result_clear (Result *r)
{
  g_free (r->out);
  g_free (r->err);
}

static int
count_lines (const char *path)
{
  g_autofree char *text = NULL;
  if (!g_file_get_contents (path, &text, NULL, NULL))
    return -1;
  int n = 0;
  for (const char *p = text; *p; p++)
    n += *p == '\n';
  return n;
}

static void
remove_tree (const char *dir)
{
  GDir *d = g_dir_open (dir, 0, NULL);
  const char *name;
  while (d != NULL && (name = g_dir_read_name (d)) != NULL)
    {
      g_autofree char *p = g_build_filename (dir, name, NULL);
      g_remove (p);
    }
  if (d != NULL)
    g_dir_close (d);
  g_rmdir (dir);
}

static void
test_run_records_heatmaps_resume (void **state)
{
  (void) state;
  g_autofree char *out = g_dir_make_tmp ("sift-needle-XXXXXX", NULL);
  const char *args[] = { "--config", SOURCE_DIR "/tiny.yaml", "--out", out, NULL };
  Result r = sift (args);
  if (r.status != 0)
    fail_msg ("exit %d: %s", r.status, r.err);
  /* The table names both setups; full is the speedup baseline. */
  assert_non_null (strstr (r.out, "full"));
  assert_non_null (strstr (r.out, "sinkwindow"));
  assert_non_null (strstr (r.out, "1.00x"));
  g_autofree char *records = g_build_filename (out, "records.jsonl", NULL);
  assert_int_equal (count_lines (records), 2 * 2 * 3);
  const char *files[] = { "heatmap-full.png", "heatmap-full.svg", "heatmap-sinkwindow.png", "heatmap-sinkwindow.svg" };
  for (gsize i = 0; i < G_N_ELEMENTS (files); i++)
    {
      g_autofree char *p = g_build_filename (out, files[i], NULL);
      assert_true (g_file_test (p, G_FILE_TEST_IS_REGULAR));
      assert_non_null (strstr (r.err, p)); /* says where the heatmaps went */
    }
  g_autofree char *first_table = g_steal_pointer (&r.out);
  result_clear (&r);

  /* Again: every cell comes from the records, none is appended, and the
   * table read back from them is the same to the last digit. */
  r = sift (args);
  assert_int_equal (r.status, 0);
  assert_non_null (strstr (r.err, "resumed 12 of 12"));
  assert_int_equal (count_lines (records), 12);
  assert_string_equal (r.out, first_table);
  result_clear (&r);

  /* A changed setting is a new cell; the others are resumed. */
  const char *more[] = { "--config", SOURCE_DIR "/tiny.yaml", "--out", out, "--set", "harness.lengths=[256, 320]", NULL };
  r = sift (more);
  assert_int_equal (r.status, 0);
  assert_int_equal (count_lines (records), 12 + 2 * 3);
  result_clear (&r);
  remove_tree (out);
}

static void
test_below_min_accuracy_exits_1 (void **state)
{
  (void) state;
  g_autofree char *out = g_dir_make_tmp ("sift-needle-XXXXXX", NULL);
  const char *args[] = { "--config", SOURCE_DIR "/tiny.yaml", "--out", out, "--set", "harness.min_accuracy=1.0",
                         "--set", "harness.lengths=[384]", NULL };
  Result r = sift (args);
  assert_int_equal (r.status, 1);
  assert_non_null (strstr (r.err, "'sinkwindow' passes"));
  assert_null (strstr (r.err, "'full' passes"));
  result_clear (&r);
  remove_tree (out);
}

static void
test_progress_line (void **state)
{
  (void) state;
  g_autofree char *out = g_dir_make_tmp ("sift-needle-XXXXXX", NULL);
  const char *args[] = { "--config", SOURCE_DIR "/tiny.yaml", "--out", out, "--set", "harness.lengths=[256]",
                         "--set", "harness.depths=[1.0]", NULL };
  /* stderr is a pipe here: no progress line unless asked. */
  Result r = sift (args);
  assert_int_equal (r.status, 0);
  assert_null (strstr (r.err, "\r"));
  result_clear (&r);
  const char *forced[] = { "--config", SOURCE_DIR "/tiny.yaml", "--out", out, "--set", "harness.lengths=[256]",
                           "--set", "harness.depths=[0.0]", "--progress", NULL };
  r = sift (forced);
  assert_int_equal (r.status, 0);
  assert_non_null (strstr (r.err, "\r\033[K[1/2] sinkwindow  length 256  depth 0%"));
  result_clear (&r);
  remove_tree (out);
}

static void
test_full_failing_warns (void **state)
{
  (void) state;
  g_autofree char *out = g_dir_make_tmp ("sift-needle-XXXXXX", NULL);
  const char *args[] = { "--config", SOURCE_DIR "/tiny.yaml", "--out", out, "--set", "harness.lengths=[256]",
                         "--set", "harness.depths=[0.5]", "--set", "model.synthetic.needle_strength=0", NULL };
  Result r = sift (args);
  assert_int_equal (r.status, 0); /* min_accuracy 0 */
  assert_non_null (strstr (r.err, "warning: full attention ('full') fails 100% of cells"));
  result_clear (&r);
  remove_tree (out);
}

static void
test_bad_records_exit_2 (void **state)
{
  (void) state;
  g_autofree char *out = g_dir_make_tmp ("sift-needle-XXXXXX", NULL);
  g_autofree char *records = g_build_filename (out, "records.jsonl", NULL);
  assert_true (g_file_set_contents (records, "{\"settings\":\"x\",\"length\":1}\nnot json\n", -1, NULL));
  const char *args[] = { "--config", SOURCE_DIR "/tiny.yaml", "--out", out, NULL };
  Result r = sift (args);
  assert_int_equal (r.status, 2);
  g_autofree char *where = g_strdup_printf ("%s:2:", records);
  assert_non_null (strstr (r.err, where));
  result_clear (&r);
  remove_tree (out);
}

static void
test_config_error_exits_2 (void **state)
{
  (void) state;
  const char *args[] = { "--config", SOURCE_DIR "/bad.yaml", NULL };
  Result r = sift (args);
  assert_int_equal (r.status, 2);
  /* file:line:col of the offending value. */
  assert_non_null (strstr (r.err, "bad.yaml:5:15"));
  result_clear (&r);

  const char *tiny[] = { "--config", SOURCE_DIR "/tiny.yaml", "--set", "harness.lengths=[8]", NULL };
  r = sift (tiny);
  assert_int_equal (r.status, 2);
  assert_non_null (strstr (r.err, "haystack"));
  /* Placed at the value that made the grid impossible. */
  assert_non_null (strstr (r.err, "--set:1:17:"));
  result_clear (&r);

  /* A cell that cannot run (its file store cannot be created) is exit 3. */
  g_autofree char *out = g_dir_make_tmp ("sift-needle-XXXXXX", NULL);
  const char *store[] = { "--config", SOURCE_DIR "/tiny.yaml", "--out", out, "--set", "offload.store=file",
                          "--set", "offload.path=/proc/sift-cannot-be-here/kv.store", NULL };
  r = sift (store);
  assert_int_equal (r.status, 3);
  assert_non_null (strstr (r.err, "setup 'full', length 256, depth 0"));
  result_clear (&r);
  remove_tree (out);

  /* An output folder that cannot be written is refused before any cell runs. */
  const char *bad_out[] = { "--config", SOURCE_DIR "/tiny.yaml", "--out", "/proc/sift-cannot-be-here", NULL };
  r = sift (bad_out);
  assert_int_equal (r.status, 2);
  assert_non_null (strstr (r.err, "cannot be written"));
  result_clear (&r);

  /* A config named without --config must not silently run the default one. */
  const char *stray[] = { SOURCE_DIR "/tiny.yaml", NULL };
  r = sift (stray);
  assert_int_equal (r.status, 2);
  assert_non_null (strstr (r.err, "--config"));
  result_clear (&r);

  const char *usage[] = { "--no-such-option", NULL };
  r = sift (usage);
  assert_int_equal (r.status, 2);
  result_clear (&r);
}

/* An unset offload.path follows --out, not the config's harness.out: the
 * config's out points where nothing can be created, --out where it can. */
static void
test_file_store_follows_out (void **state)
{
  (void) state;
  g_autofree char *out = g_dir_make_tmp ("sift-needle-XXXXXX", NULL);
  const char *args[] = { "--config", SOURCE_DIR "/tiny.yaml", "--out", out, "--set", "offload.store=file",
                         "--set", "offload.keep=true", "--set", "harness.out=/proc/sift-cannot-be-here", NULL };
  Result r = sift (args);
  if (r.status != 0)
    fail_msg ("exit %d: %s", r.status, r.err);
  g_autofree char *store = g_build_filename (out, "kv.store", NULL);
  assert_true (g_file_test (store, G_FILE_TEST_IS_REGULAR));
  result_clear (&r);
  remove_tree (out);
}

/* The first record's decode "bytes_loaded" and "bytes_mapped". */
static void
decode_bytes (const char *out, guint64 *loaded, guint64 *mapped)
{
  g_autofree char *path = g_build_filename (out, "records.jsonl", NULL);
  g_autofree char *text = NULL;
  assert_true (g_file_get_contents (path, &text, NULL, NULL));
  const char *dc = strstr (text, "\"decode\":{\"bytes_loaded\":");
  assert_non_null (dc);
  *loaded = g_ascii_strtoull (strchr (dc + 9, ':') + 1, NULL, 10);
  const char *m = strstr (dc, "\"bytes_mapped\":");
  assert_non_null (m);
  *mapped = g_ascii_strtoull (m + strlen ("\"bytes_mapped\":"), NULL, 10);
}

/* A host store in the compute dtype is read in place: the records say so
 * (bytes_mapped = bytes_loaded); force_copy copies every byte again. */
static void
test_records_bytes_mapped (void **state)
{
  (void) state;
  const char *modes[] = { "offload.force_copy=false", "offload.force_copy=true" };
  guint64 loaded[2], mapped[2];
  for (int i = 0; i < 2; i++)
    {
      g_autofree char *out = g_dir_make_tmp ("sift-needle-XXXXXX", NULL);
      const char *args[] = { "--config", SOURCE_DIR "/tiny.yaml", "--out", out, "--set", "kv.store_dtype=f32",
                             "--set", "kv.compute_dtype=f32", "--set", modes[i], NULL };
      Result r = sift (args);
      if (r.status != 0)
        fail_msg ("exit %d: %s", r.status, r.err);
      result_clear (&r);
      decode_bytes (out, &loaded[i], &mapped[i]);
      remove_tree (out);
    }
  assert_true (loaded[0] > 0);
  assert_int_equal (mapped[0], loaded[0]);
  assert_int_equal (loaded[1], loaded[0]);
  assert_int_equal (mapped[1], 0);
}

/* The line of `text` that starts with `prefix` (a copy), or NULL. */
static char *
line_starting (const char *text, const char *prefix)
{
  g_auto (GStrv) lines = g_strsplit (text, "\n", -1);
  for (char **l = lines; *l != NULL; l++)
    if (g_str_has_prefix (*l, prefix))
      return g_strdup (*l);
  return NULL;
}

/* Bounded setups (evict.yaml: sinks+window and h2o at 384 tokens) get a
 * random eviction baseline: a number in the random and vs.rand columns,
 * the summary line's cells above it, the records' kind; resumed from the
 * records, the same table. */
static void
test_eviction_baseline_in_table (void **state)
{
  (void) state;
  g_autofree char *out = g_dir_make_tmp ("sift-needle-XXXXXX", NULL);
  const char *args[] = { "--config", SOURCE_DIR "/evict.yaml", "--out", out, NULL };
  Result r = sift (args);
  if (r.status != 0 && r.status != 1)
    fail_msg ("exit %d: %s", r.status, r.err);
  const char *labels[] = { "sinks+window", "h2o" };
  for (gsize i = 0; i < G_N_ELEMENTS (labels); i++)
    {
      g_autofree char *row_prefix = g_strdup_printf ("%s ", labels[i]);
      g_autofree char *summary_prefix = g_strdup_printf ("%s:", labels[i]);
      g_autofree char *row = line_starting (r.out, row_prefix);
      assert_non_null (row);
      /* label, acc, then "R%+-S%" and the difference, not "-". */
      char label[64];
      double acc, mean, sd, diff;
      if (sscanf (row, "%63s %lf%% %lf%%+-%lf%% %lf%%", label, &acc, &mean, &sd, &diff) != 5)
        fail_msg ("no baseline in: %s", row);
      assert_true (fabs (acc - mean - diff) < 0.11);
      g_autofree char *summary = line_starting (r.out, summary_prefix);
      assert_non_null (summary);
      assert_non_null (strstr (summary, "random eviction at its capacity (384 tokens)"));
      assert_non_null (strstr (summary, "(2 seeds)"));
      assert_non_null (strstr (summary, "cells above random"));
    }
  g_autofree char *records = g_build_filename (out, "records.jsonl", NULL);
  g_autofree char *text = NULL;
  assert_true (g_file_get_contents (records, &text, NULL, NULL));
  assert_non_null (strstr (text, "\"baseline\":{\"kind\":\"eviction\",\"capacity_tokens\":384,"));
  g_autofree char *first_table = g_steal_pointer (&r.out);
  result_clear (&r);
  r = sift (args);
  assert_non_null (strstr (r.err, "resumed 6 of 6"));
  assert_string_equal (r.out, first_table);
  result_clear (&r);
  remove_tree (out);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_run_records_heatmaps_resume),
    cmocka_unit_test (test_below_min_accuracy_exits_1),
    cmocka_unit_test (test_progress_line),
    cmocka_unit_test (test_full_failing_warns),
    cmocka_unit_test (test_bad_records_exit_2),
    cmocka_unit_test (test_config_error_exits_2),
    cmocka_unit_test (test_file_store_follows_out),
    cmocka_unit_test (test_records_bytes_mapped),
    cmocka_unit_test (test_eviction_baseline_in_table),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
