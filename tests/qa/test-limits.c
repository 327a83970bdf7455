/* Shapes too large for any machine, through the library as a program
 * calls it: the host store and the engine refuse them with an error
 * instead of aborting in an allocation or being killed by the kernel
 * after overcommitting memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <sift/sift.h>

/* 2 x 4096 kv heads x 65536 tokens x 4096 dims x 4 bytes: 8 TiB a block. */
static const SiftModelShape huge = {
  .n_layers = 4096, .n_q_heads = 4096, .n_kv_heads = 4096, .head_dim = 4096,
  .block_size = 65536, .chunk_size = 65536,
};

static void
test_host_store_refuses_beyond_memory (void **state)
{
  (void) state;
  SiftStoreConfig sc = { SIFT_DTYPE_F32, huge.n_kv_heads, huge.block_size, huge.head_dim, 0, NULL, FALSE, FALSE };
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
  assert_non_null (store);
  gint64 id = -1;
  assert_false (sift_store_alloc (store, &id, &error));
  assert_true (g_error_matches (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_FULL));
  assert_non_null (strstr (error->message, "exceed this machine's memory"));
}

static void
test_engine_refuses_beyond_memory (void **state)
{
  (void) state;
  SiftStoreConfig sc = { SIFT_DTYPE_F16, huge.n_kv_heads, huge.block_size, huge.head_dim, 0, NULL, FALSE, FALSE };
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
  SiftEngineConfig ec = { 0 };
  ec.shape = huge;
  ec.n_slots = 4;
  ec.compute_dtype = SIFT_DTYPE_F32;
  ec.pipeline = SIFT_PIPELINE_RING;
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
  assert_null (engine);
  assert_true (g_error_matches (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID));
  assert_non_null (strstr (error->message, "more than this machine's"));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_host_store_refuses_beyond_memory),
    cmocka_unit_test (test_engine_refuses_beyond_memory),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
