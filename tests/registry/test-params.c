/* Declared policy parameters: defaults, typed values, validation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/error.h>
#include <sift/params.h>

static const SiftParamSpec specs[] = {
  SIFT_PARAM_INT ("budget", 1024, 16, 1 << 20, "tokens kept"),
  SIFT_PARAM_FLOAT ("ratio", 0.9, 0.0, 1.0, "a fraction"),
  SIFT_PARAM_BOOL ("verbose", FALSE, "a switch"),
  SIFT_PARAM_CHOICE ("score", "max", SIFT_CHOICES ("max", "mean", "min"), "scoring"),
  SIFT_PARAM_STRING ("tag", "any text", "free text"),
  SIFT_PARAM_INT_LIST ("layers", "[0, 1]", 0, 31, "layers"),
  SIFT_PARAM_INT ("offsets", -5, G_MININT64, G_MAXINT64, "the widest range"),
  SIFT_PARAM_END,
};

static void
expect_error (gboolean ok, GError *error, GQuark domain, gint code, const char *part)
{
  assert_false (ok);
  assert_non_null (error);
  if (error->domain != domain || error->code != code || strstr (error->message, part) == NULL)
    fail_msg ("got %s %d '%s', wanted code %d containing '%s'", g_quark_to_string (error->domain), error->code,
              error->message, code, part);
  g_error_free (error);
}

static void
test_defaults (void **state)
{
  (void) state;
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftParams) p = sift_params_new (specs, &error);
  assert_non_null (p);
  assert_int_equal (sift_params_get_int (p, "budget"), 1024);
  assert_float_equal (sift_params_get_float (p, "ratio"), 0.9, 0);
  assert_false (sift_params_get_bool (p, "verbose"));
  assert_string_equal (sift_params_get_string (p, "score"), "max");
  assert_int_equal (sift_params_get_choice (p, "score"), 0);
  assert_string_equal (sift_params_get_string (p, "tag"), "any text");
  gsize n = 0;
  const gint64 *layers = sift_params_get_int_list (p, "layers", &n);
  assert_int_equal (n, 2);
  assert_int_equal (layers[0], 0);
  assert_int_equal (layers[1], 1);
  assert_int_equal (sift_params_get_int (p, "offsets"), -5);
  assert_ptr_equal (sift_params_specs (p), specs);

  g_autoptr (SiftParams) none = sift_params_new (NULL, &error);
  assert_non_null (none);
}

static void
test_set_valid (void **state)
{
  (void) state;
  g_autoptr (SiftParams) p = sift_params_new (specs, NULL);
  GError *error = NULL;
  assert_true (sift_params_set_text (p, "budget", "16", &error));
  assert_true (sift_params_set_text (p, "ratio", "1", &error));
  assert_true (sift_params_set_text (p, "verbose", "yes", &error));
  assert_true (sift_params_set_text (p, "score", "mean", &error));
  assert_true (sift_params_set_text (p, "layers", "[31, 2,7 ]", &error));
  assert_true (sift_params_set_text (p, "offsets", "-9000000000", &error));
  assert_null (error);
  assert_int_equal (sift_params_get_int (p, "budget"), 16);
  assert_float_equal (sift_params_get_float (p, "ratio"), 1.0, 0);
  assert_true (sift_params_get_bool (p, "verbose"));
  assert_string_equal (sift_params_get_string (p, "score"), "mean");
  assert_int_equal (sift_params_get_choice (p, "score"), 1);
  assert_true (sift_params_set_text (p, "score", "min", &error));
  assert_int_equal (sift_params_get_choice (p, "score"), 2);
  gsize n;
  const gint64 *l = sift_params_get_int_list (p, "layers", &n);
  assert_int_equal (n, 3);
  assert_int_equal (l[0] + l[1] + l[2], 40);
  assert_int_equal (sift_params_get_int (p, "offsets"), G_GINT64_CONSTANT (-9000000000));
  assert_true (sift_params_set_text (p, "layers", "[]", &error));
  sift_params_get_int_list (p, "layers", &n);
  assert_int_equal (n, 0);
  const gint64 direct[] = { 3, 4 };
  assert_true (sift_params_set_int_list (p, "layers", direct, 2, &error));
  l = sift_params_get_int_list (p, "layers", &n);
  assert_int_equal (n, 2);
  assert_int_equal (l[1], 4);
}

static void
test_set_errors (void **state)
{
  (void) state;
  g_autoptr (SiftParams) p = sift_params_new (specs, NULL);
  GError *error = NULL;
  gboolean ok;
  ok = sift_params_set_text (p, "budgt", "1", &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_PARAM, "did you mean 'budget'");
  error = NULL;
  ok = sift_params_set_text (p, "zzzzzzzz", "1", &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_PARAM, "declared: budget, ratio");
  error = NULL;
  ok = sift_params_set_text (p, "budget", "12.5", &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_TYPE, "expects an integer, got '12.5'");
  error = NULL;
  ok = sift_params_set_text (p, "budget", "8", &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_RANGE, "8 is out of range [16, 1048576]");
  error = NULL;
  ok = sift_params_set_text (p, "ratio", "1.5", &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_RANGE, "out of range [0.0, 1.0]");
  error = NULL;
  ok = sift_params_set_text (p, "ratio", "nan", &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_TYPE, "expects a number");
  error = NULL;
  ok = sift_params_set_text (p, "ratio", "0x1p-1", &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_TYPE, "expects a number");
  error = NULL;
  ok = sift_params_set_text (p, "verbose", "maybe", &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_TYPE, "expects a boolean");
  error = NULL;
  ok = sift_params_set_text (p, "score", "maxx", &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_RANGE, "not one of max|mean|min; did you mean 'max'?");
  error = NULL;
  ok = sift_params_set_text (p, "layers", "[1, x]", &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_TYPE, "expects a list of integers");
  error = NULL;
  ok = sift_params_set_text (p, "layers", "[1, 32]", &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_RANGE, "32 (element 1) is out of range [0, 31]");
  error = NULL;
  const gint64 bad[] = { -1 };
  ok = sift_params_set_int_list (p, "layers", bad, 1, &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_RANGE, "out of range");
  error = NULL;
  ok = sift_params_set_int_list (p, "budget", bad, 1, &error);
  expect_error (ok, error, SIFT_CONFIG_ERROR,
                SIFT_CONFIG_ERROR_TYPE, "got a list");
  /* A failed set leaves the value as it was. */
  assert_int_equal (sift_params_get_int (p, "budget"), 1024);
  assert_string_equal (sift_params_get_string (p, "score"), "max");
}

static void
test_bad_specs (void **state)
{
  (void) state;
  const char *const no_choices[] = { NULL };
  const struct {
    SiftParamSpec spec;
    const char *part;
  } cases[] = {
    { SIFT_PARAM_INT ("budget", 0, 1, 100, ""), "invalid default '0': parameter 'budget' = 0 is out of range" },
    { SIFT_PARAM_FLOAT ("ratio", 1.5, 0, 1, ""), "invalid default '1.5'" },
    { SIFT_PARAM_INT_LIST ("layers", "[1, x]", 0, 9, ""), "invalid default '[1, x]'" },
    { SIFT_PARAM_STRING ("tag", NULL, ""), "has no default" },
    { SIFT_PARAM_INT ("Budget", 1, 1, 100, ""), "invalid name 'Budget'" },
    { SIFT_PARAM_INT ("budget", 5, 10, 1, ""), "has an empty range (min > max)" },
    { SIFT_PARAM_CHOICE ("score", "min", SIFT_CHOICES ("max", "mean"), ""), "is not one of max|mean" },
    { SIFT_PARAM_CHOICE ("score", "max", no_choices, ""), "has no choices" },
    { SIFT_PARAM_CHOICE ("score", "max", NULL, ""), "is a choice without choices" },
    { { .name = "budget", .type = SIFT_PARAM_TYPE_STRING, .default_text = "a", .choices = SIFT_CHOICES ("a") },
      "has choices but is not a choice" },
    { { .name = "budget", .type = (SiftParamType) 9 }, "unknown type 9" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      SiftParamSpec table[2] = { cases[i].spec, SIFT_PARAM_END };
      GError *error = NULL;
      SiftParams *p = sift_params_new (table, &error);
      assert_null (p);
      expect_error (FALSE, error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID, cases[i].part);
    }
  SiftParamSpec twice[] = { specs[0], specs[0], SIFT_PARAM_END };
  GError *error = NULL;
  assert_null (sift_params_new (twice, &error));
  expect_error (FALSE, error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID, "declared twice");
}

static void
test_copy_and_text (void **state)
{
  (void) state;
  g_autoptr (SiftParams) p = sift_params_new (specs, NULL);
  assert_true (sift_params_set_text (p, "tag", "a: b", NULL));
  g_autoptr (SiftParams) q = sift_params_copy (p);
  assert_true (sift_params_set_text (p, "budget", "99", NULL));
  assert_true (sift_params_set_text (p, "layers", "[5]", NULL));
  assert_int_equal (sift_params_get_int (q, "budget"), 1024);
  gsize n;
  assert_int_equal (sift_params_get_int_list (q, "layers", &n)[1], 1);
  assert_int_equal (n, 2);

  /* Text reads back as the same value through set_text. */
  g_autoptr (SiftParams) r = sift_params_new (specs, NULL);
  for (const SiftParamSpec *s = specs; s->name; s++)
    {
      g_autofree char *text = sift_params_to_text (q, s->name);
      if (s->type == SIFT_PARAM_TYPE_STRING && text[0] == '"')
        {
          assert_string_equal (text, "\"a: b\"");
          continue;
        }
      assert_true (sift_params_set_text (r, s->name, text, NULL));
      g_autofree char *again = sift_params_to_text (r, s->name);
      assert_string_equal (text, again);
    }
  g_autofree char *ratio = sift_params_to_text (q, "ratio");
  assert_string_equal (ratio, "0.9");
  g_autofree char *layers = sift_params_to_text (q, "layers");
  assert_string_equal (layers, "[0, 1]");
  g_autofree char *score = sift_params_to_text (q, "score");
  assert_string_equal (score, "max");
}

/* Each constructor's default as the text `sift policies info` prints, and
 * as the value init reads. */
static void
test_default_text (void **state)
{
  (void) state;
  static const char *const expected[] = { "1024", "0.9", "false", "max", "any text", "[0, 1]", "-5" };
  gsize i = 0;
  for (const SiftParamSpec *s = specs; s->name; s++, i++)
    {
      g_autofree char *text = sift_param_spec_default_text (s);
      assert_string_equal (text, expected[i]);
    }
  assert_int_equal (i, G_N_ELEMENTS (expected));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_defaults),
    cmocka_unit_test (test_set_valid),
    cmocka_unit_test (test_set_errors),
    cmocka_unit_test (test_bad_specs),
    cmocka_unit_test (test_copy_and_text),
    cmocka_unit_test (test_default_text),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
