/* The minference plugin, loaded from the build tree: prefill only, its own
 * compute, no block selection, its parameters, and pattern-file errors
 * surfacing through init. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <glib/gstdio.h>
#include <sift/params.h>
#include <sift/registry.h>

static const SiftModelShape shape = { .n_layers = 2, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = 64,
                                      .block_size = 64, .chunk_size = 512, .scale = 0.125f };

static const SiftPolicyOps *
lookup (SiftRegistry *registry)
{
  g_autoptr (GError) error = NULL;
  const SiftPolicyInfo *info = sift_registry_lookup (registry, "minference", &error);
  if (info == NULL)
    fail_msg ("%s", error->message);
  assert_true (g_str_has_suffix (info->file, "policies/minference/libminference." G_MODULE_SUFFIX));
  assert_true (sift_policy_ops_check (info->ops, info->file, NULL));
  return info->ops;
}

static void
test_descriptor (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  const SiftPolicyOps *ops = lookup (registry);
  assert_int_equal (ops->flags, SIFT_POLICY_SUPPORTS_PREFILL);
  assert_non_null (ops->compute_chunked_prefill);
  assert_null (ops->compute_chunked_decode);
  assert_null (ops->select_blocks);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftParams) params = sift_params_new (ops->params, &error);
  assert_non_null (params);
  assert_int_equal (sift_params_get_int (params, "last_q"), 64);
  assert_int_equal (sift_params_get_int (params, "vertical_size"), 1000);
  assert_int_equal (sift_params_get_int (params, "slash_size"), 6096);
  assert_int_equal (sift_params_get_int (params, "num_sink_tokens"), 30);
  assert_int_equal (sift_params_get_int (params, "num_recent_diags"), 100);
  assert_true (sift_params_get_float (params, "budget") == 0.0);
  assert_string_equal (sift_params_get_string (params, "pattern_file"), "");
  g_autoptr (SiftPolicy) policy = sift_policy_new (ops, params, &shape, &error);
  assert_non_null (policy);
  /* Out of range: rejected by the declaration, before init. */
  assert_false (sift_params_set_text (params, "budget", "1.5", &error));
  assert_true (g_error_matches (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_RANGE));
}

static void
test_pattern_file_param (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  const SiftPolicyOps *ops = lookup (registry);
  g_autoptr (GError) error = NULL;
  char *path = NULL;
  int fd = g_file_open_tmp ("sift-minference-XXXXXX.json", &path, &error);
  assert_true (fd >= 0);
  close (fd);
  g_autofree char *p = path;

  assert_true (g_file_set_contents (p, "[{\"3\": [\"vertical_and_slash\", 30, 800, 0.9]}]", -1, &error));
  g_autoptr (SiftParams) params = sift_params_new (ops->params, &error);
  assert_true (sift_params_set_text (params, "pattern_file", p, &error));
  g_autoptr (SiftPolicy) good = sift_policy_new (ops, params, &shape, &error);
  assert_non_null (good);

  /* A head the model does not have: the policy's message, through init. */
  assert_true (g_file_set_contents (p, "[{\"8\": [\"vertical_and_slash\", 30, 800]}]", -1, &error));
  SiftPolicy *bad = sift_policy_new (ops, params, &shape, &error);
  assert_null (bad);
  assert_true (g_error_matches (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INIT));
  assert_non_null (strstr (error->message, p));
  assert_non_null (strstr (error->message, "head id 8"));
  g_unlink (p);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_descriptor),
    cmocka_unit_test (test_pattern_file_param),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
