/* The Full policy, loaded from the build tree (SIFT_POLICY_PATH of the
 * test environment): both phases, no required selection, the engine's
 * default compute, and a dense selection when asked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
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
    metas[b] = (SiftBlockMeta) { b * 64, 64, SIFT_PHASE_PREFILL };
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

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_full),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
