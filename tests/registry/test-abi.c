/* The policy ABI's layout, pinned on x86-64: a change here breaks every
 * plugin built before it, so it must come with an ABI major bump (or, for
 * appended methods, a minor bump and a larger SiftPolicyOps). The numbers
 * are worked out by hand from the C layout rules, not read from the
 * compiler. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <sift/plugin.h>

#define PIN_SIZE(type, n) assert_int_equal (sizeof (type), n)
#define PIN_OFF(type, field, n) assert_int_equal (offsetof (type, field), n)

static void
test_versions (void **state)
{
  (void) state;
  assert_int_equal (SIFT_POLICY_ABI_MAJOR, 2);
  assert_int_equal (SIFT_POLICY_ABI_MINOR, 0);
  assert_string_equal (SIFT_PLUGIN_ENTRY_SYMBOL, "sift_plugin_policies");
  assert_int_equal (SIFT_POLICY_SUPPORTS_PREFILL, 1);
  assert_int_equal (SIFT_POLICY_SUPPORTS_DECODE, 2);
  assert_int_equal (SIFT_POLICY_REQUIRES_BLOCK_SELECTION, 4);
  assert_int_equal (SIFT_POLICY_WANTS_ACCUMULATED_ATTENTION, 8);
  assert_int_equal (SIFT_EVICT_TOKEN, 0);
  assert_int_equal (SIFT_EVICT_BLOCK, 1);
  assert_int_equal (SIFT_PHASE_PREFILL, 1);
  assert_int_equal (SIFT_PHASE_DECODE, 2);
  assert_int_equal (SIFT_PARAM_TYPE_INT, 0);
  assert_int_equal (SIFT_PARAM_TYPE_FLOAT, 1);
  assert_int_equal (SIFT_PARAM_TYPE_BOOL, 2);
  assert_int_equal (SIFT_PARAM_TYPE_STRING, 3);
  assert_int_equal (SIFT_PARAM_TYPE_CHOICE, 4);
  assert_int_equal (SIFT_PARAM_TYPE_INT_LIST, 5);
  assert_int_equal (SIFT_MEMORY_HOST, 0);
  assert_int_equal (SIFT_MEMORY_DEVICE, 1);
}

static void
test_ops (void **state)
{
  (void) state;
  PIN_OFF (SiftPolicyOps, abi_major, 0);
  PIN_OFF (SiftPolicyOps, abi_minor, 4);
  PIN_OFF (SiftPolicyOps, struct_size, 8);
  PIN_OFF (SiftPolicyOps, name, 16);
  PIN_OFF (SiftPolicyOps, version, 24);
  PIN_OFF (SiftPolicyOps, description, 32);
  PIN_OFF (SiftPolicyOps, flags, 40);
  PIN_OFF (SiftPolicyOps, params, 48);
  PIN_OFF (SiftPolicyOps, instance_size, 56);
  PIN_OFF (SiftPolicyOps, init, 64);
  PIN_OFF (SiftPolicyOps, finalize, 72);
  PIN_OFF (SiftPolicyOps, reset, 80);
  PIN_OFF (SiftPolicyOps, select_blocks, 88);
  PIN_OFF (SiftPolicyOps, compute_chunked_prefill, 96);
  PIN_OFF (SiftPolicyOps, compute_chunked_decode, 104);
  PIN_OFF (SiftPolicyOps, on_prefill_offload, 112);
  PIN_OFF (SiftPolicyOps, on_decode_offload, 120);
  PIN_OFF (SiftPolicyOps, score_eviction, 128);
  PIN_SIZE (SiftPolicyOps, 136);
  PIN_OFF (SiftEvictCandidates, struct_size, 0);
  PIN_OFF (SiftEvictCandidates, n, 8);
  PIN_OFF (SiftEvictCandidates, positions, 16);
  PIN_OFF (SiftEvictCandidates, block_ids, 24);
  PIN_OFF (SiftEvictCandidates, accumulated, 32);
  PIN_OFF (SiftEvictCandidates, n_evict, 40);
  PIN_OFF (SiftEvictCandidates, granularity, 48);
  PIN_OFF (SiftEvictCandidates, reserved, 56);
  PIN_SIZE (SiftEvictCandidates, 88);
  PIN_OFF (SiftPolicy, ops, 0);
  PIN_OFF (SiftPolicy, shape, 8);
  PIN_OFF (SiftPolicy, host_data, 16);
  PIN_OFF (SiftPolicy, reserved, 24);
  PIN_SIZE (SiftPolicy, 56);
}

static void
test_context (void **state)
{
  (void) state;
  PIN_OFF (SiftView, data, 0);
  PIN_OFF (SiftView, dtype, 8);
  PIN_OFF (SiftView, n_heads, 12);
  PIN_OFF (SiftView, head_dim, 16);
  PIN_OFF (SiftView, n_tokens, 24);
  PIN_OFF (SiftView, head_stride, 32);
  PIN_OFF (SiftView, token_stride, 40);
  PIN_OFF (SiftView, space, 48);
  PIN_OFF (SiftView, reserved, 52);
  PIN_SIZE (SiftView, 72);

  PIN_OFF (SiftPolicyContext, struct_size, 0);
  PIN_OFF (SiftPolicyContext, phase, 4);
  PIN_OFF (SiftPolicyContext, layer, 8);
  PIN_OFF (SiftPolicyContext, block_size, 12);
  PIN_OFF (SiftPolicyContext, chunk_index, 16);
  PIN_OFF (SiftPolicyContext, n_chunks, 24);
  PIN_OFF (SiftPolicyContext, kv_len, 32);
  PIN_OFF (SiftPolicyContext, q_pos, 40);
  PIN_OFF (SiftPolicyContext, n_q, 48);
  PIN_OFF (SiftPolicyContext, q, 56);
  PIN_OFF (SiftPolicyContext, shape, 128);
  PIN_OFF (SiftPolicyContext, blocks, 136);
  PIN_OFF (SiftPolicyContext, n_blocks, 144);
  PIN_OFF (SiftPolicyContext, engine, 152);
  PIN_OFF (SiftPolicyContext, reserved, 160);
  PIN_SIZE (SiftPolicyContext, 192);

  PIN_OFF (SiftBlockInfo, struct_size, 0);
  PIN_OFF (SiftBlockInfo, block_id, 8);
  PIN_OFF (SiftBlockInfo, meta, 16);
  PIN_OFF (SiftBlockInfo, k, 24);
  PIN_OFF (SiftBlockInfo, v, 96);
  PIN_OFF (SiftBlockInfo, reserved, 168);
  PIN_SIZE (SiftBlockInfo, 200);

  PIN_OFF (SiftBlockMeta, first_token, 0);
  PIN_OFF (SiftBlockMeta, n_valid, 8);
  PIN_OFF (SiftBlockMeta, phase, 12);
  PIN_OFF (SiftBlockMeta, reserved, 16);
  PIN_SIZE (SiftBlockMeta, 32);
}

static void
test_shape_and_params (void **state)
{
  (void) state;
  PIN_OFF (SiftModelShape, n_layers, 0);
  PIN_OFF (SiftModelShape, n_q_heads, 4);
  PIN_OFF (SiftModelShape, n_kv_heads, 8);
  PIN_OFF (SiftModelShape, head_dim, 12);
  PIN_OFF (SiftModelShape, block_size, 16);
  PIN_OFF (SiftModelShape, chunk_size, 20);
  PIN_OFF (SiftModelShape, scale, 24);
  PIN_SIZE (SiftModelShape, 28);

  PIN_OFF (SiftParamSpec, name, 0);
  PIN_OFF (SiftParamSpec, type, 8);
  PIN_OFF (SiftParamSpec, default_bool, 12);
  PIN_OFF (SiftParamSpec, doc, 16);
  PIN_OFF (SiftParamSpec, default_int, 24);
  PIN_OFF (SiftParamSpec, default_float, 32);
  PIN_OFF (SiftParamSpec, default_text, 40);
  PIN_OFF (SiftParamSpec, min, 48);
  PIN_OFF (SiftParamSpec, max, 56);
  PIN_OFF (SiftParamSpec, choices, 64);
  PIN_OFF (SiftParamSpec, reserved, 72);
  PIN_SIZE (SiftParamSpec, 104);
}

int
main (void)
{
#if !defined(__x86_64__) || !defined(__LP64__)
  return 77; /* the pinned numbers are the x86-64 SysV layout */
#endif
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_versions),
    cmocka_unit_test (test_ops),
    cmocka_unit_test (test_context),
    cmocka_unit_test (test_shape_and_params),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
