/* Pattern files: MInference's JSON format and YAML read into per-head
 * sizes; every malformed file is a SIFT_CONFIG_ERROR naming file:line:col. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <glib/gstdio.h>
#include <unistd.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "pattern-file.h"

static char *
write_tmp (const char *text)
{
  GError *error = NULL;
  char *path = NULL;
  int fd = g_file_open_tmp ("sift-pattern-XXXXXX.json", &path, &error);
  assert_true (fd >= 0);
  close (fd);
  assert_true (g_file_set_contents (path, text, -1, &error));
  return path;
}

static void
test_json_as_shipped (void **state)
{
  (void) state;
  g_autofree char *path = write_tmp (
    "[{\"0\": [\"vertical_and_slash\", 1000, 6096, 0.96], \"3\": [\"vertical_and_slash\", 30, 800, 0.5]},\n"
    " {\"1\": [\"vertical_and_slash\", 3500, 100, 0.81]}]\n");
  VsPatternFile pf;
  g_autoptr (GError) error = NULL;
  assert_true (vs_pattern_file_load (&pf, path, 3, 4, &error));
  const VsHeadPattern *hp = vs_pattern_file_get (&pf, 0, 0);
  assert_non_null (hp);
  assert_int_equal (hp->vertical, 1000);
  assert_int_equal (hp->slash, 6096);
  hp = vs_pattern_file_get (&pf, 0, 3);
  assert_int_equal (hp->vertical, 30);
  assert_int_equal (hp->slash, 800);
  assert_null (vs_pattern_file_get (&pf, 0, 1)); /* not listed: defaults */
  hp = vs_pattern_file_get (&pf, 1, 1);
  assert_int_equal (hp->vertical, 3500);
  assert_int_equal (hp->slash, 100);
  assert_null (vs_pattern_file_get (&pf, 2, 0)); /* layer not listed */
  vs_pattern_file_clear (&pf);
  g_unlink (path);
}

static void
test_yaml_block_style (void **state)
{
  (void) state;
  g_autofree char *path = write_tmp ("- 0: [vertical_and_slash, 64, 256]\n  1: [vertical_and_slash, 10, 20, 0.1]\n");
  VsPatternFile pf;
  g_autoptr (GError) error = NULL;
  assert_true (vs_pattern_file_load (&pf, path, 1, 2, &error));
  assert_int_equal (vs_pattern_file_get (&pf, 0, 0)->slash, 256);
  assert_int_equal (vs_pattern_file_get (&pf, 0, 1)->vertical, 10);
  vs_pattern_file_clear (&pf);
  g_unlink (path);
}

typedef struct {
  const char *text;
  gint code;
  const char *where;  /* ":line:col:" expected in the message */
  const char *words;  /* expected in the message */
} Bad;

static const Bad bad_files[] = {
  { "[{\"0\": [\"vertical_and_slash\", 1000, 6096]}", SIFT_CONFIG_ERROR_SYNTAX, ":2:1:", "" },
  { "{\"0\": 1}", SIFT_CONFIG_ERROR_TYPE, ":1:1:", "one mapping per layer" },
  { "[{\"0\": [\"vertical_and_slash\", \"many\", 6096]}]", SIFT_CONFIG_ERROR_TYPE, ":1:31:", "'many'" },
  { "[{\"7\": [\"vertical_and_slash\", 10, 10]}]", SIFT_CONFIG_ERROR_RANGE, ":1:3:", "head id 7" },
  { "[{\"0\": [\"block_sparse\", 10, 10]}]", SIFT_CONFIG_ERROR_RANGE, ":1:9:", "block_sparse" },
  { "[{\"0\": [\"vertical_and_slash\", 0, 10]}]", SIFT_CONFIG_ERROR_RANGE, ":1:31:", "vertical size 0" },
  { "[{\"0\": [\"vertical_and_slash\", 10]}]", SIFT_CONFIG_ERROR_TYPE, ":1:8:", "2 items" },
  { "[{}, {}, {}]", SIFT_CONFIG_ERROR_RANGE, ":1:1:", "3 layers" },
  { "[{\"0\": [\"vertical_and_slash\", 1, 1], \"0\": [\"vertical_and_slash\", 2, 2]}]",
    SIFT_CONFIG_ERROR_DUPLICATE_KEY, ":1:38:", "listed twice" },
  { "[[1, 2]]", SIFT_CONFIG_ERROR_TYPE, ":1:2:", "layer 0" },
  /* No document at all: the message still names a position, not 0:0. */
  { "", SIFT_CONFIG_ERROR_SYNTAX, ":1:1:", "file is empty" },
  { "# only a comment\n", SIFT_CONFIG_ERROR_SYNTAX, ":1:1:", "file is empty" },
};

static void
test_bad_files (void **state)
{
  (void) state;
  for (gsize i = 0; i < G_N_ELEMENTS (bad_files); i++)
    {
      g_autofree char *path = write_tmp (bad_files[i].text);
      VsPatternFile pf;
      g_autoptr (GError) error = NULL;
      assert_false (vs_pattern_file_load (&pf, path, 2, 4, &error));
      assert_non_null (error);
      if (!g_error_matches (error, SIFT_CONFIG_ERROR, bad_files[i].code)
          || !g_str_has_prefix (error->message, path) || !strstr (error->message, bad_files[i].where)
          || !strstr (error->message, bad_files[i].words))
        fail_msg ("case %zu: got '%s' (code %d)", i, error->message, error->code);
      assert_null (pf.heads);
      g_unlink (path);
    }
}

static void
test_missing_file (void **state)
{
  (void) state;
  VsPatternFile pf;
  g_autoptr (GError) error = NULL;
  assert_false (vs_pattern_file_load (&pf, "/nonexistent/patterns.json", 1, 1, &error));
  assert_true (g_error_matches (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_IO));
  assert_non_null (strstr (error->message, "/nonexistent/patterns.json"));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_json_as_shipped),
    cmocka_unit_test (test_yaml_block_style),
    cmocka_unit_test (test_bad_files),
    cmocka_unit_test (test_missing_file),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
