/* The Full policy, loaded from the build tree (SIFT_POLICY_PATH of the
 * test environment): both phases, no required selection, the engine's
 * default compute, and a dense selection when asked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sys/wait.h>
#include <sift/params.h>
#include <sift/registry.h>

static void
test_full (void **state)
{
  (void) state;
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  g_autoptr (GError) error = NULL;
  const SiftPolicyInfo *info = sift_registry_lookup (registry, "full", &error);
  if (info == NULL)
    fail_msg ("%s", error->message);
  assert_true (g_str_has_suffix (info->file, "policies/full/libfull." G_MODULE_SUFFIX));
  const SiftPolicyOps *ops = info->ops;
  assert_true (sift_policy_ops_check (ops, info->file, NULL));
  assert_int_equal (ops->flags, SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE);
  assert_null (ops->compute_chunked_prefill);
  assert_null (ops->compute_chunked_decode);
  assert_true (ops->params == NULL || ops->params[0].name == NULL);

  SiftModelShape shape = { .n_layers = 2, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = 64,
                           .block_size = 64, .chunk_size = 512, .scale = 0.125f };
  g_autoptr (SiftParams) params = sift_params_new (ops->params, &error);
  g_autoptr (SiftPolicy) policy = sift_policy_new (ops, params, &shape, &error);
  assert_non_null (policy);
  assert_ptr_equal (policy->ops, ops);

  /* Its selection is every available block for every head. */
  const gint64 available[] = { 0, 1, 2, 5, 7, 8 };
  SiftBlockMeta metas[9];
  for (gint64 b = 0; b < 9; b++)
    metas[b] = (SiftBlockMeta) { .first_token = b * 64, .n_valid = 64, .phase = SIFT_PHASE_PREFILL };
  for (SiftPhase phase = SIFT_PHASE_PREFILL; phase <= SIFT_PHASE_DECODE; phase++)
    {
      SiftPolicyContext ctx = { .phase = phase, .layer = 1, .block_size = 64, .kv_len = 9 * 64,
                                .q_pos = 9 * 64, .n_q = 1, .shape = &shape, .blocks = metas, .n_blocks = 9 };
      g_autoptr (SiftSelection) sel = sift_selection_new (shape.n_q_heads, shape.n_kv_heads);
      assert_true (ops->select_blocks (policy, &ctx, available, G_N_ELEMENTS (available), sel, &error));
      assert_true (sift_selection_validate (sel, available, G_N_ELEMENTS (available), ops->name, &error));
      assert_int_equal (sift_selection_n_blocks (sel), G_N_ELEMENTS (available));
      for (gsize i = 0; i < G_N_ELEMENTS (available); i++)
        {
          assert_int_equal (sift_selection_block (sel, i), available[i]);
          for (gint32 h = 0; h < shape.n_q_heads; h++)
            assert_true (sift_selection_has (sel, available[i], h));
        }
      assert_false (sift_selection_has (sel, 3, 0));
    }
  sift_policy_reset (policy);
}

/* `sift policies` finds Full in the build tree, uninstalled. */
static char *
run_sift_env (const char *const *args, char **env, gint *exit_status, char **err)
{
  g_autoptr (GPtrArray) argv = g_ptr_array_new ();
  g_ptr_array_add (argv, (gpointer) SIFT_EXE);
  for (gsize i = 0; args[i]; i++)
    g_ptr_array_add (argv, (gpointer) args[i]);
  g_ptr_array_add (argv, NULL);
  char *out = NULL;
  gint status = 0;
  g_autoptr (GError) error = NULL;
  if (!g_spawn_sync (NULL, (char **) argv->pdata, env, G_SPAWN_DEFAULT, NULL, NULL, &out, err, &status, &error))
    fail_msg ("cannot run %s: %s", SIFT_EXE, error->message);
  assert_true (WIFEXITED (status));
  *exit_status = WEXITSTATUS (status);
  return out;
}

static char *
run_sift (const char *const *args, gint *exit_status, char **err)
{
  return run_sift_env (args, NULL, exit_status, err);
}

/* With no search path set at all, the build tree's sift finds the build
 * tree's policies (not an installed sift's). */
static void
test_uninstalled (void **state)
{
  (void) state;
  g_auto (GStrv) env = g_environ_unsetenv (g_get_environ (), "SIFT_POLICY_PATH");
  env = g_environ_unsetenv (env, "SIFT_POLICY_SYSTEM_PATH");
  const char *list[] = { "policies", "list", NULL };
  gint status;
  g_autofree char *err = NULL;
  g_autofree char *out = run_sift_env (list, env, &status, &err);
  assert_int_equal (status, 0);
  assert_non_null (strstr (out, "/policies/full/libfull." G_MODULE_SUFFIX));
  assert_null (strstr (out, sift_registry_installed_dir ()));
}

static void
test_cli (void **state)
{
  (void) state;
  gint status;
  g_autofree char *err1 = NULL, *err2 = NULL, *err3 = NULL;
  const char *list[] = { "policies", "list", NULL };
  g_autofree char *out = run_sift (list, &status, &err1);
  assert_int_equal (status, 0);
  assert_non_null (strstr (out, "full           prefill,decode  -"));
  assert_non_null (strstr (out, "policies/full/libfull." G_MODULE_SUFFIX));
  const char *info[] = { "policies", "info", "full", NULL };
  g_autofree char *out2 = run_sift (info, &status, &err2);
  assert_int_equal (status, 0);
  assert_non_null (strstr (out2, "full 1.0: dense attention"));
  assert_non_null (strstr (out2, "params:   none"));
  const char *unknown[] = { "policies", "info", "fulll", NULL };
  g_autofree char *out3 = run_sift (unknown, &status, &err3);
  assert_int_equal (status, 2);
  assert_non_null (strstr (err3, "no policy named 'fulll'; did you mean 'full'?"));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_full),
    cmocka_unit_test (test_cli),
    cmocka_unit_test (test_uninstalled),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
