/* Resident KV (sift_engine_set_resident, offload.resident): the engine
 * keeps every stored block in compute-side memory and attends it in place.
 * Every attention call equals the naive double-precision reference (or the
 * ring's outputs) within the compute dtype's bound, nothing is loaded from
 * the store, block selection, reset and eviction hold as on the ring.
 *
 * Built a second time with SIFT_TEST_CUDA (tests/cuda: test-cuda-resident)
 * the same properties hold on the GPU (offload.device cuda), within the
 * kernels' error bounds (docs/kernels.md); it exits 77 (skipped) without
 * a GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "helpers.h"

#ifdef SIFT_TEST_CUDA
#include <sift/cuda.h>
#endif

/* Selects the even blocks only: the attended set differs from dense. */
static gboolean
select_even (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n, SiftSelection *sel,
             GError **error)
{
  (void) self, (void) ctx, (void) error;
  for (gsize i = 0; i < n; i++)
    if (available[i] % 2 == 0)
      sift_selection_add (sel, available[i]);
  return TRUE;
}

static const SiftPolicyOps select_even_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "test-select-even",
  .version = "1",
  .description = "selects the even blocks",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .instance_size = sizeof (SiftPolicy),
  .select_blocks = select_even,
};

static gboolean
keep_even (gint64 block, gint32 q_head, gpointer data)
{
  (void) q_head, (void) data;
  return block % 2 == 0;
}

/* Resident cases: prefill then 50+ decode steps, the shapes and dtypes of
 * the device (ring and cross-layer asked for: both read the blocks in place). */
static const TestCase resident_cases[] = {
  { 2, 4, 2, T_DIM, 16, 32, 2, FALSE, SIFT_DTYPE_F16, T_COMPUTE, SIFT_PIPELINE_RING, 203, 60, TEST_POL_NULL },
  { 2, 8, 2, T_DIM, 32, 64, 3, TRUE, SIFT_DTYPE_F32, T_COMPUTE, SIFT_PIPELINE_CROSS_LAYER, 300, 55, TEST_POL_FULL },
  { 1, 32, 8, 128, 64, 512, 4, FALSE, SIFT_DTYPE_BF16, SIFT_DTYPE_BF16, SIFT_PIPELINE_RING, 1500, 52, TEST_POL_SELECT_ALL },
};

/* Resident full attention equals the dense reference within the compute
 * dtype's bound, and nothing is loaded from the store: prefill or decode. */
static void
test_resident_dense (void **state)
{
  (void) state;
  for (gsize i = 0; i < G_N_ELEMENTS (resident_cases); i++)
    {
      const TestCase *c = &resident_cases[i];
      TestRun r;
      test_run_open (&r, c, 42, NULL, TRUE);
      assert_true (sift_engine_resident (r.engine));
      test_run_sequence (&r, c);
      gint64 chunks = (c->prompt + c->chunk - 1) / c->chunk;
      assert_int_equal (r.check->calls, (chunks + c->steps) * c->layers);
      if (r.check->max_err > test_tolerance (c->compute) || r.check->max_lse_err > test_tolerance (c->compute))
        fail_msg ("resident case %" G_GSIZE_FORMAT ": max error %.3g, lse %.3g (tolerance %g)", i, r.check->max_err,
                  r.check->max_lse_err, test_tolerance (c->compute));
      SiftCounters pc, dc;
      sift_engine_counters (r.engine, -1, SIFT_PHASE_PREFILL, &pc);
      sift_engine_counters (r.engine, -1, SIFT_PHASE_DECODE, &dc);
      assert_int_equal (pc.bytes_loaded, 0);
      assert_int_equal (dc.bytes_loaded, 0);
      assert_int_equal (dc.bytes_mapped, 0);
      assert_int_equal (dc.tokens_attended, dc.tokens_available);
      assert_true (pc.bytes_stored > 0); /* the store still gets every block */
      test_run_close (&r, TRUE);
    }
}

/* Resident and ring give the same outputs (one kernel call against one
 * per ring group: equal to rounding). */
static void
test_resident_equals_ring (void **state)
{
  (void) state;
  for (gsize i = 0; i < G_N_ELEMENTS (resident_cases); i++)
    {
      const TestCase *c = &resident_cases[i];
      TestRun a, b;
      test_run_open (&a, c, 5, NULL, FALSE);
      test_run_sequence (&a, c);
      test_run_open (&b, c, 5, NULL, TRUE);
      test_run_sequence (&b, c);
      assert_int_equal (a.check->outputs->len, b.check->outputs->len);
      const float *x = (const float *) (void *) a.check->outputs->data, *y = (const float *) (void *) b.check->outputs->data;
      double worst = 0, big = 1e-3;
      for (guint j = 0; j < a.check->outputs->len; j++)
        {
          worst = MAX (worst, fabs ((double) x[j] - y[j]));
          big = MAX (big, fabs ((double) x[j]));
        }
      /* Both are within tolerance of one reference; against each other
       * the difference is the kernels' rounding of another split. */
      if (worst / big > test_tolerance (c->compute))
        fail_msg ("resident case %" G_GSIZE_FORMAT ": resident and ring differ by %.3g of %.3g", i, worst, big);
      SiftCounters ra, rb;
      sift_engine_counters (a.engine, -1, SIFT_PHASE_DECODE, &ra);
      sift_engine_counters (b.engine, -1, SIFT_PHASE_DECODE, &rb);
      assert_true (ra.bytes_loaded > 0);
      assert_int_equal (rb.bytes_loaded, 0);
      assert_int_equal (ra.tokens_attended, rb.tokens_attended);
      test_run_close (&a, TRUE);
      test_run_close (&b, TRUE);
    }
}

/* A policy that selects blocks restricts what resident attention reads:
 * the even blocks only, against a reference that keeps only those. */
static void
test_resident_selection (void **state)
{
  (void) state;
  TestCase c = { 2, 8, 2, T_DIM, 16, 64, 3, FALSE, SIFT_DTYPE_F16, T_COMPUTE, SIFT_PIPELINE_RING, 260, 55, TEST_POL_FULL };
  SiftModelShape shape = test_case_shape (&c);
  TestRun r;
  test_run_open (&r, &c, 9, NULL, TRUE);
  g_autoptr (GError) error = NULL;
  SiftPolicy *even = sift_policy_new (&select_even_ops, NULL, &shape, &error);
  g_assert_no_error (error);
  for (gint32 l = 0; l < c.layers; l++)
    r.per_layer[l] = even;
  sift_runner_free (r.runner);
  r.runner = sift_runner_new (r.engine, r.src, r.per_layer, r.per_layer, &error);
  g_assert_no_error (error);
  sift_runner_set_observer (r.runner, &test_checker_observer, r.check);
  r.check->keep = keep_even;
  r.check->prompt = c.prompt;
  test_run_sequence (&r, &c);
  if (r.check->max_err > test_tolerance (c.compute))
    fail_msg ("resident, even blocks: max error %.3g (tolerance %g)", r.check->max_err, test_tolerance (c.compute));
  SiftCounters dc;
  sift_engine_counters (r.engine, -1, SIFT_PHASE_DECODE, &dc);
  assert_true (dc.tokens_attended < dc.tokens_available);
  assert_true (dc.blocks_selected < dc.blocks_available);
  assert_int_equal (dc.bytes_loaded, 0);
  sift_policy_free (even);
  test_run_close (&r, TRUE);
}

/* Sequence A, reset, sequence B on a resident engine equals B on a fresh
 * resident engine bit for bit; changing the mode once blocks are stored
 * is refused. */
static void
test_resident_reset (void **state)
{
  (void) state;
  TestCase c = { 2, 4, 2, T_DIM, 16, 32, 3, FALSE, SIFT_DTYPE_F16, T_COMPUTE, SIFT_PIPELINE_RING, 150, 50, TEST_POL_FULL };
  TestRun a;
  test_run_open (&a, &c, 1, NULL, TRUE);
  test_run_sequence (&a, &c);
  g_autoptr (GError) error = NULL;
  assert_false (sift_engine_set_resident (a.engine, FALSE, &error));
  g_assert_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE);
  sift_runner_reset (a.runner);
  assert_int_equal (sift_store_blocks_in_use (a.store), 0);
  test_run_reset_matches_fresh (&a, &c, TRUE);
}

/* A bounded cache: eviction compacts blocks in the store, and the resident
 * copies follow (reloaded): resident outputs equal the ring's. */
static void
test_resident_eviction (void **state)
{
  (void) state;
  TestCase c = { 2, 4, 2, T_DIM, 16, 32, 3, FALSE, SIFT_DTYPE_F16, T_COMPUTE, SIFT_PIPELINE_RING, 200, 60, TEST_POL_FULL };
  for (int gran = 0; gran < 2; gran++)
    {
      SiftEvictConfig ev = { 120, gran == 0 ? SIFT_EVICT_TOKEN : SIFT_EVICT_BLOCK, 4, 24 };
      TestRun a, b;
      g_autoptr (GError) error = NULL;
      test_run_open (&a, &c, 3, NULL, FALSE);
      assert_true (sift_engine_set_eviction (a.engine, &ev, &error));
      test_run_sequence (&a, &c);
      test_run_open (&b, &c, 3, NULL, TRUE);
      assert_true (sift_engine_set_eviction (b.engine, &ev, &error));
      test_run_sequence (&b, &c);
      SiftCounters ca, cb;
      sift_engine_counters (b.engine, -1, SIFT_PHASE_DECODE, &cb);
      sift_engine_counters (a.engine, -1, SIFT_PHASE_DECODE, &ca);
      assert_true (cb.tokens_evicted > 0);
      assert_int_equal (ca.tokens_evicted, cb.tokens_evicted);
      assert_int_equal (ca.tokens_attended, cb.tokens_attended);
      const float *x = (const float *) (void *) a.check->outputs->data, *y = (const float *) (void *) b.check->outputs->data;
      assert_int_equal (a.check->outputs->len, b.check->outputs->len);
      double worst = 0, big = 1e-3;
      for (guint j = 0; j < a.check->outputs->len; j++)
        {
          worst = MAX (worst, fabs ((double) x[j] - y[j]));
          big = MAX (big, fabs ((double) x[j]));
        }
      if (worst / big > test_tolerance (c.compute))
        fail_msg ("eviction %d: resident and ring differ by %.3g of %.3g", gran, worst, big);
      test_run_close (&a, TRUE);
      test_run_close (&b, TRUE);
    }
}


int
main (void)
{
#ifdef SIFT_TEST_CUDA
  g_autoptr (GError) error = NULL;
  if (!sift_cuda_init (&error))
    {
      g_print ("skipped: %s\n", error->message);
      return 77;
    }
  if (g_getenv ("SIFT_TEST_FILTER") != NULL) /* a cmocka test-name filter (for the sanitizers) */
    cmocka_set_test_filter (g_getenv ("SIFT_TEST_FILTER"));
#endif
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_resident_dense),
    cmocka_unit_test (test_resident_equals_ring),
    cmocka_unit_test (test_resident_selection),
    cmocka_unit_test (test_resident_reset),
    cmocka_unit_test (test_resident_eviction),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
