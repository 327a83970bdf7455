/* The policy registry against the test plugins only: search order, the
 * suffix filter, first basename wins, lazy opening, and every load failure
 * with its exact domain and code. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/error.h>
#include <sift/params.h>
#include <sift/registry.h>

#include "registry-private.h"

/* The search path is always set here: never the installed policies. */
static SiftRegistry *
registry_of (const char *a, const char *b)
{
  g_setenv ("SIFT_POLICY_PATH", "", TRUE);
  g_setenv ("SIFT_POLICY_SYSTEM_PATH", "", TRUE);
  const char *dirs[] = { a, b, NULL };
  return sift_registry_new (dirs);
}

static void
assert_error (const GError *error, GQuark domain, gint code, const char *part1, const char *part2)
{
  assert_non_null (error);
  if (error->domain != domain || error->code != code || strstr (error->message, part1) == NULL
      || (part2 != NULL && strstr (error->message, part2) == NULL))
    fail_msg ("got %s %d '%s'; wanted code %d with '%s' and '%s'", g_quark_to_string (error->domain), error->code,
              error->message, code, part1, part2 ? part2 : "");
}

static void
lookup_fails (const char *name, gint code, const char *part1, const char *part2)
{
  g_autoptr (SiftRegistry) r = registry_of (BROKEN_DIR, NULL);
  g_autoptr (GError) error = NULL;
  assert_null (sift_registry_lookup (r, name, &error));
  assert_error (error, SIFT_PLUGIN_ERROR, code, part1, part2);
  /* Asking again gives the same answer from the remembered failure. */
  g_autoptr (GError) again = NULL;
  assert_null (sift_registry_lookup (r, name, &again));
  assert_error (again, SIFT_PLUGIN_ERROR, code, part1, part2);
}

/* One deliberately broken plugin each: the policy named after its file. */
typedef struct {
  const char *name;
  gint code;
  const char *part1, *part2;
} Broken;

static const Broken not_shared_object = { "not-elf", SIFT_PLUGIN_ERROR_OPEN,
                                          BROKEN_DIR "/not-elf.so: cannot open", NULL };
static const Broken no_entry = { "no-entry", SIFT_PLUGIN_ERROR_NOT_PLUGIN,
                                 BROKEN_DIR "/no-entry.so: not a sift plugin", "sift_plugin_policies" };
static const Broken abi_major = { "abi_major", SIFT_PLUGIN_ERROR_ABI,
                                  BROKEN_DIR "/abi-major.so: built for policy ABI 3.0", "this sift has ABI 2.0" };
static const Broken abi_minor = { "abi_minor", SIFT_PLUGIN_ERROR_ABI,
                                  BROKEN_DIR "/abi-minor.so: built for policy ABI 2.1", "needs a newer sift" };
static const Broken missing_method = { "no_select", SIFT_PLUGIN_ERROR_MISSING_METHOD, BROKEN_DIR "/no-select.so",
                                       "REQUIRES_BLOCK_SELECTION but select_blocks is NULL" };
static const Broken bad_default = { "bad_default", SIFT_PLUGIN_ERROR_INVALID, BROKEN_DIR "/bad-default.so",
                                    "invalid default '0': parameter 'budget' = 0 is out of range [1, 100]" };
static const Broken duplicate = { "dup", SIFT_PLUGIN_ERROR_DUPLICATE,
                                  BROKEN_DIR "/dup-b.so: policy 'dup' is also provided by", BROKEN_DIR "/dup-a.so" };

#define BROKEN_TEST(c) { "broken plugin: " #c, test_broken, NULL, NULL, (void *) &c }

static void
test_broken (void **state)
{
  const Broken *b = *state;
  lookup_fails (b->name, b->code, b->part1, b->part2);
}

static void
test_init_fails (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) r = registry_of (BROKEN_DIR, NULL);
  g_autoptr (GError) error = NULL;
  const SiftPolicyInfo *info = sift_registry_lookup (r, "init_fails", &error);
  assert_non_null (info);
  assert_string_equal (info->file, BROKEN_DIR "/init-fails.so");
  SiftModelShape shape = { 1, 4, 2, 32, 16, 64, 0.1f };
  g_autoptr (SiftParams) params = sift_params_new (info->ops->params, &error);
  assert_null (sift_policy_new (info->ops, params, &shape, &error));
  assert_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INIT, BROKEN_DIR "/init-fails.so: policy 'init_fails': init failed",
                "the test plugin refuses to start (as designed)");
}

static void
test_unknown (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) r = registry_of (GOOD_DIR, NULL);
  g_autoptr (GError) error = NULL;
  assert_null (sift_registry_lookup (r, "god", &error));
  assert_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_UNKNOWN, "no policy named 'god'; did you mean 'good'?",
                GOOD_DIR);
  g_clear_error (&error);
  assert_null (sift_registry_lookup (r, "good_decod", &error));
  assert_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_UNKNOWN, "did you mean 'good_decode'?", NULL);
}

/* Every broken module reports its own code once in a listing; the suffix
 * filter skips ignored.txt; good modules are listed beside them. */
static void
test_list (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) r = registry_of (BROKEN_DIR, GOOD_DIR);
  assert_int_equal (sift_registry_n_opened (r), 0);
  g_autoptr (GPtrArray) failures = g_ptr_array_new_with_free_func ((GDestroyNotify) g_error_free);
  g_autoptr (GPtrArray) infos = sift_registry_list (r, failures, NULL);
  static const struct {
    const char *file;
    gint code;
  } want[] = {
    { "/abi-major.so", SIFT_PLUGIN_ERROR_ABI },
    { "/abi-minor.so", SIFT_PLUGIN_ERROR_ABI },
    { "/bad-default.so", SIFT_PLUGIN_ERROR_INVALID },
    { "/dup-b.so", SIFT_PLUGIN_ERROR_DUPLICATE },
    { "/no-entry.so", SIFT_PLUGIN_ERROR_NOT_PLUGIN },
    { "/no-select.so", SIFT_PLUGIN_ERROR_MISSING_METHOD },
    { "/not-elf.so", SIFT_PLUGIN_ERROR_OPEN },
  };
  assert_int_equal (failures->len, G_N_ELEMENTS (want));
  for (gsize i = 0; i < G_N_ELEMENTS (want); i++)
    {
      guint hits = 0;
      for (guint k = 0; k < failures->len; k++)
        {
          const GError *e = failures->pdata[k];
          if (g_str_has_prefix (e->message, BROKEN_DIR) && strstr (e->message, want[i].file) == e->message + strlen (BROKEN_DIR))
            {
              assert_true (e->domain == SIFT_PLUGIN_ERROR);
              assert_int_equal (e->code, want[i].code);
              hits++;
            }
        }
      if (hits != 1)
        fail_msg ("%s reported %u times", want[i].file, hits);
    }
  for (guint k = 0; k < failures->len; k++)
    assert_null (strstr (((GError *) failures->pdata[k])->message, "ignored.txt"));
  /* dup (from dup-a.so, first), good, good_decode, init_fails. */
  const char *names[] = { "dup", "good", "good_decode", "init_fails" };
  assert_int_equal (infos->len, G_N_ELEMENTS (names));
  for (gsize i = 0; i < G_N_ELEMENTS (names); i++)
    assert_string_equal (((SiftPolicyInfo *) infos->pdata[i])->ops->name, names[i]);
  assert_string_equal (((SiftPolicyInfo *) infos->pdata[0])->file, BROKEN_DIR "/dup-a.so");
  assert_string_equal (((SiftPolicyInfo *) infos->pdata[1])->file, GOOD_DIR "/libgood.so");
  assert_string_equal (((SiftPolicyInfo *) infos->pdata[2])->file, GOOD_DIR "/libgood.so");
}

/* A lookup opens the module named after the policy and nothing else. */
static void
test_lazy (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) r = registry_of (BROKEN_DIR, GOOD_DIR);
  g_autoptr (GError) error = NULL;
  const SiftPolicyInfo *good = sift_registry_lookup (r, "good", &error);
  assert_non_null (good);
  assert_null (error);
  assert_int_equal (sift_registry_n_opened (r), 1);
  /* good_decode lives in libgood.so too: already open, nothing else opened. */
  const SiftPolicyInfo *decode = sift_registry_lookup (r, "good_decode", &error);
  assert_non_null (decode);
  assert_int_equal (sift_registry_n_opened (r), 1);
  assert_string_equal (decode->file, good->file);
  g_autoptr (GPtrArray) all = sift_registry_list (r, NULL, NULL);
  assert_int_equal (sift_registry_n_opened (r), 10);
}

static void
test_search_order (void **state)
{
  (void) state;
  g_setenv ("SIFT_POLICY_PATH", SECOND_DIR G_SEARCHPATH_SEPARATOR_S G_SEARCHPATH_SEPARATOR_S GOOD_DIR, TRUE);
  g_setenv ("SIFT_POLICY_SYSTEM_PATH", BROKEN_DIR, TRUE);
  const char *dirs[] = { FIRST_DIR, NULL };
  g_autoptr (SiftRegistry) r = sift_registry_new (dirs);
  const char *const *path = sift_registry_search_path (r);
  assert_string_equal (path[0], FIRST_DIR);
  assert_string_equal (path[1], SECOND_DIR);
  assert_string_equal (path[2], GOOD_DIR);
  assert_string_equal (path[3], BROKEN_DIR);
  assert_null (path[4]);

  /* first/libshadow.so hides second/libshadow.so (the same file name). */
  const SiftPolicyInfo *info = sift_registry_lookup (r, "shadow", NULL);
  assert_non_null (info);
  assert_string_equal (info->ops->version, "first");
  assert_string_equal (info->file, FIRST_DIR "/libshadow.so");

  g_autoptr (SiftRegistry) swapped = registry_of (SECOND_DIR, FIRST_DIR);
  info = sift_registry_lookup (swapped, "shadow", NULL);
  assert_string_equal (info->ops->version, "second");
  g_autoptr (GPtrArray) failures = g_ptr_array_new_with_free_func ((GDestroyNotify) g_error_free);
  g_autoptr (GPtrArray) all = sift_registry_list (swapped, failures, NULL);
  assert_int_equal (all->len, 1);
  assert_int_equal (failures->len, 0);

  g_setenv ("SIFT_POLICY_PATH", "", TRUE);
  g_unsetenv ("SIFT_POLICY_SYSTEM_PATH");
  g_autoptr (SiftRegistry) with_installed = sift_registry_new (NULL);
  path = sift_registry_search_path (with_installed);
  assert_string_equal (path[0], sift_registry_installed_dir ());
}

/* Modules stay loaded (resident) and shared across registries. */
static void
test_shared_and_resident (void **state)
{
  (void) state;
  SiftRegistry *a = registry_of (GOOD_DIR, NULL);
  g_autoptr (SiftRegistry) b = registry_of (GOOD_DIR, NULL);
  const SiftPolicyInfo *ia = sift_registry_lookup (a, "good", NULL);
  const SiftPolicyInfo *ib = sift_registry_lookup (b, "good", NULL);
  assert_ptr_equal (ia->ops, ib->ops);
  const SiftPolicyOps *ops = ia->ops;
  sift_registry_free (a);
  /* The code and tables are still mapped: create an instance from them. */
  SiftModelShape shape = { 1, 4, 2, 32, 16, 64, 0.1f };
  g_autoptr (SiftParams) params = sift_params_new (ops->params, NULL);
  assert_true (sift_params_set_text (params, "stride", "3", NULL));
  g_autoptr (SiftPolicy) policy = sift_policy_new (ops, params, &shape, NULL);
  assert_non_null (policy);
  g_autoptr (SiftSelection) sel = sift_selection_new (4, 2);
  const gint64 available[] = { 0, 1, 2, 3, 4, 5, 6 };
  SiftPolicyContext ctx = { .phase = SIFT_PHASE_DECODE, .shape = &shape, .n_blocks = 7 };
  assert_true (ops->select_blocks (policy, &ctx, available, 7, sel, NULL));
  assert_true (sift_selection_validate (sel, available, 7, ops->name, NULL));
  assert_int_equal (sift_selection_n_blocks (sel), 3); /* 0, 3, 6 */
  assert_int_equal (sift_selection_block (sel, 2), 6);
}

/* sift_policy_ops_check on tables built here. */
static void
test_ops_check (void **state)
{
  (void) state;
  static const SiftParamSpec bad_params[] = { SIFT_PARAM_FLOAT ("x", 2.0, 0, 1, ""), SIFT_PARAM_END };
  const SiftPolicyOps good = {
    SIFT_POLICY_OPS_HEADER, .name = "ok-1_x", .flags = SIFT_POLICY_SUPPORTS_DECODE,
    .instance_size = sizeof (SiftPolicy),
  };
  assert_true (sift_policy_ops_check (&good, "here.so", NULL));
  /* Plugins built for ABI 1 are refused since 2.0, however complete. */
  SiftPolicyOps old = good;
  old.abi_major = 1;
  old.abi_minor = 1;
  g_autoptr (GError) old_error = NULL;
  assert_false (sift_policy_ops_check (&old, "here.so", &old_error));
  assert_error (old_error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_ABI,
                "here.so: built for policy ABI 1.1, but this sift has ABI 2.0", "major versions differ");
  struct {
    SiftPolicyOps ops;
    gint code;
    const char *part;
  } cases[] = {
    { good, SIFT_PLUGIN_ERROR_ABI, "ops table is 64 bytes, but ABI 2.0 needs at least 136" },
    { good, SIFT_PLUGIN_ERROR_ABI, "ops table is 128 bytes, but ABI 2.0 needs at least 136" },
    { good, SIFT_PLUGIN_ERROR_INVALID, "policy name 'Bad Name' is not of the form" },
    { good, SIFT_PLUGIN_ERROR_INVALID, "supports neither prefill nor decode" },
    { good, SIFT_PLUGIN_ERROR_INVALID, "sets unknown flags 0x10 (ABI 2.0)" },
    { good, SIFT_PLUGIN_ERROR_ABI, "built for policy ABI 1.0, but this sift has ABI 2.0 (major versions differ)" },
    { good, SIFT_PLUGIN_ERROR_INVALID, "instance_size 8, less than sizeof (SiftPolicy) = 56" },
    { good, SIFT_PLUGIN_ERROR_INVALID, "invalid default '2.0'" },
    { good, SIFT_PLUGIN_ERROR_INVALID, "policy name '(null)'" },
  };
  cases[0].ops.struct_size = 64;
  cases[1].ops.struct_size = 128; /* the 1.0 size, claiming 2.0 */
  cases[2].ops.name = "Bad Name";
  cases[3].ops.flags = 0;
  cases[4].ops.flags |= 1u << 4;
  cases[5].ops.abi_major = 1;     /* a 1.0 table */
  cases[5].ops.abi_minor = 0;
  cases[5].ops.struct_size = 128;
  cases[6].ops.instance_size = 8;
  cases[7].ops.params = bad_params;
  cases[8].ops.name = NULL;
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (GError) error = NULL;
      assert_false (sift_policy_ops_check (&cases[i].ops, "here.so", &error));
      assert_error (error, SIFT_PLUGIN_ERROR, cases[i].code, "here.so: ", cases[i].part);
    }
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    BROKEN_TEST (not_shared_object),
    BROKEN_TEST (no_entry),
    BROKEN_TEST (abi_major),
    BROKEN_TEST (abi_minor),
    BROKEN_TEST (missing_method),
    BROKEN_TEST (bad_default),
    BROKEN_TEST (duplicate),
    cmocka_unit_test (test_init_fails),
    cmocka_unit_test (test_unknown),
    cmocka_unit_test (test_list),
    cmocka_unit_test (test_lazy),
    cmocka_unit_test (test_search_order),
    cmocka_unit_test (test_shared_and_resident),
    cmocka_unit_test (test_ops_check),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
