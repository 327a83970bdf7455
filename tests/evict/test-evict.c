/* Bounded KV memory: eviction in the engine (docs/eviction.md).
 *
 * - memory (store blocks in use) stays constant over 10x capacity of
 *   generated tokens, for every granularity, scorer and pipeline;
 * - a capacity covering everything gives the unbounded run's outputs bit for bit;
 * - every attention call equals a double-precision reference over exactly
 *   the tokens the engine still holds (so compaction keeps rows intact);
 * - H2O accumulated attention equals a reference column sum of the softmax;
 * - a needle that keeps receiving attention survives under H2O and is lost
 *   under sinks + window (the default scoring and the streaming plugin);
 * - protected sinks and recent tokens are never evicted, whatever the policy says;
 * - offload hooks see compacted and renumbered blocks again (Quest-style
 *   metadata stays true);
 * - a plugin built with the ABI 1.0 ops table loads and is never asked to score. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "../engine/helpers.h"

#include "evict-run.h"

/* ---- Tests -------------------------------------------------------------- */

/* Every attention call equals the reference over the tokens kept, for each
 * scorer, granularity and pipeline, with prompts longer than the capacity
 * (eviction during prefill too) and multi-row decode steps. */
static void
test_reference (void **state)
{
  (void) state;
  const char *policies[] = { NULL, "h2o", "test" };
  for (gsize p = 0; p < G_N_ELEMENTS (policies); p++)
    for (int gran = 0; gran < 2; gran++)
      for (int pipe = 0; pipe < 2; pipe++)
        {
          Scenario sc = base;
          sc.policy = policies[p];
          sc.gran = gran;
          sc.pipe = pipe;
          sc.rows = pipe ? 3 : 1;
          sc.capacity = gran == SIFT_EVICT_BLOCK ? 96 : 70;
          Run *r = run_new (&sc);
          run_all (r);
          SiftCounters c;
          sift_engine_counters (r->engine, -1, SIFT_PHASE_DECODE, &c);
          assert_true (c.tokens_evicted > 0);
          if (r->max_err > 1e-4)
            fail_msg ("%s, %s granularity, %s: max error %g vs the reference over kept tokens",
                      policies[p] ? policies[p] : "default", gran ? "block" : "token", pipe ? "cross-layer" : "ring",
                      r->max_err);
          if (r->policy != NULL && r->policy->ops == &test_ops)
            assert_int_equal (((TestPolicy *) r->policy)->bad_candidates, 0);
          run_free (r);
        }
}

/* Compaction copies stored rows as they are: any stored dtype (q8_0's
 * per-row blocks included) and the file store give the reference over the
 * kept tokens (the source's k and v rounded through the stored dtype). */
static void
test_stores (void **state)
{
  (void) state;
  const struct { SiftDType dtype; gboolean file; } stores[] = {
    { SIFT_DTYPE_F16, FALSE }, { SIFT_DTYPE_BF16, TRUE }, { SIFT_DTYPE_Q8_0, TRUE }, { SIFT_DTYPE_Q8_0, FALSE },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (stores); i++)
    for (int gran = 0; gran < 2; gran++)
      {
        Scenario sc = base;
        sc.policy = "test";
        sc.mode = SCORE_RANDOM;
        sc.gran = gran;
        sc.capacity = 96;
        sc.store = stores[i].dtype;
        sc.file = stores[i].file;
        Run *r = run_new (&sc);
        run_all (r);
        if (r->max_err > 1e-4)
          fail_msg ("%s %s store, %s granularity: max error %g", sift_dtype_name (sc.store), sc.file ? "file" : "host",
                    gran ? "block" : "token", r->max_err);
        run_free (r);
      }
}

/* Memory stays constant: 10x the capacity generated, store blocks in use
 * bounded by the capacity and flat once the cache is full. */
static void
test_memory_constant (void **state)
{
  (void) state;
  const char *policies[] = { NULL, "h2o" };
  for (gsize p = 0; p < G_N_ELEMENTS (policies); p++)
    for (int gran = 0; gran < 2; gran++)
      {
        Scenario sc = base;
        sc.policy = policies[p];
        sc.gran = gran;
        sc.capacity = 96;
        sc.prompt = 40;
        sc.steps = 10 * sc.capacity;
        sc.check = FALSE;
        Run *r = run_new (&sc);
        run_all (r);
        /* Per layer at most ceil(capacity / block) blocks, one more for a partial one. */
        const gint64 bound = sc.layers * ((sc.capacity + sc.block - 1) / sc.block + 1);
        assert_true (r->max_blocks <= bound);
        gint64 first_full = -1;
        for (gint64 i = 0; i < sc.steps; i++)
          if (r->blocks_after[i] == r->max_blocks)
            {
              first_full = i;
              break;
            }
        /* Once the cache first reaches its size it never grows, over the
         * remaining ~9x capacity of tokens. */
        assert_true (first_full >= 0 && first_full < 2 * sc.capacity);
        for (gint64 i = first_full; i < sc.steps; i++)
          assert_true (r->blocks_after[i] <= r->max_blocks && r->blocks_after[i] >= r->max_blocks - sc.layers);
        SiftCounters c;
        sift_engine_counters (r->engine, -1, SIFT_PHASE_DECODE, &c);
        assert_true ((gint64) c.tokens_evicted >= sc.steps - sc.capacity);
        run_free (r);
      }
}

/* A capacity covering every token: the unbounded run's outputs, bit for bit
 * (H2O's bookkeeping changes nothing either). */
static void
test_capacity_covers_all (void **state)
{
  (void) state;
  const char *policies[] = { NULL, "h2o" };
  for (gsize p = 0; p < G_N_ELEMENTS (policies); p++)
    for (int pipe = 0; pipe < 2; pipe++)
      {
        Scenario sc = base;
        sc.policy = policies[p];
        sc.pipe = pipe;
        sc.check = FALSE;
        sc.capacity = 0;
        Run *unbounded = run_new (&sc);
        run_all (unbounded);
        sc.capacity = sc.prompt + sc.steps;
        Run *bounded = run_new (&sc);
        run_all (bounded);
        SiftCounters c;
        sift_engine_counters (bounded->engine, -1, SIFT_PHASE_DECODE, &c);
        assert_int_equal (c.tokens_evicted, 0);
        assert_int_equal (unbounded->outputs->len, bounded->outputs->len);
        assert_memory_equal (unbounded->outputs->data, bounded->outputs->data,
                             sizeof (float) * unbounded->outputs->len);
        /* And dense through the h2o policy is the dense run. */
        sc.policy = NULL;
        Run *dense = run_new (&sc);
        run_all (dense);
        assert_memory_equal (dense->outputs->data, bounded->outputs->data, sizeof (float) * dense->outputs->len);
        run_free (dense);
        run_free (unbounded);
        run_free (bounded);
      }
}

/* H2O accumulated attention: for every stored token, the softmax
 * probability every query row and head gave it, against a double reference. */
static void
test_accumulated_reference (void **state)
{
  (void) state;
  Scenario sc = base;
  sc.policy = "h2o";
  sc.capacity = 0;
  sc.check = FALSE;
  sc.rows = 2;
  sc.steps = 20;
  Run *r = run_new (&sc);
  run_all (r);
  const SiftModelShape *s = &r->shape;
  const gint32 d = s->head_dim, group = s->n_q_heads / s->n_kv_heads;
  const gint64 n = r->n_tokens;
  const double scale = s->scale;
  for (gint32 l = 0; l < sc.layers; l++)
    {
      g_autofree double *ref = g_new0 (double, (gsize) n);
      g_autofree double *logit = g_new (double, (gsize) n);
      for (gint32 h = 0; h < s->n_q_heads; h++)
        for (gint64 i = 0; i < n; i++)
          {
            const float *q = r->q[l] + (i * s->n_q_heads + h) * d;
            double m = -INFINITY, z = 0;
            for (gint64 j = 0; j <= i; j++)
              {
                const float *k = r->k[l] + (j * s->n_kv_heads + h / group) * d;
                double dot = 0;
                for (gint32 x = 0; x < d; x++)
                  dot += (double) q[x] * k[x];
                logit[j] = scale * dot;
                m = MAX (m, logit[j]);
              }
            for (gint64 j = 0; j <= i; j++)
              z += exp (logit[j] - m);
            for (gint64 j = 0; j <= i; j++)
              ref[j] += exp (logit[j] - m) / z;
          }
      gsize stored = sift_engine_stored_positions (r->engine, l, NULL);
      assert_true (stored >= (gsize) sc.prompt);
      for (gint64 j = 0; j < (gint64) stored; j++)
        {
          double got = sift_engine_accumulated_attention (r->engine, l, j);
          if (fabs (got - ref[j]) > 1e-4 * MAX (1.0, ref[j]))
            fail_msg ("layer %d token %" G_GINT64_FORMAT ": accumulated %g, reference %g", l, j, got, ref[j]);
        }
    }
  /* Not tracked without a policy that asks. */
  sc.policy = NULL;
  Run *plain = run_new (&sc);
  run_all (plain);
  assert_true (sift_engine_accumulated_attention (plain->engine, 0, 5) < 0);
  run_free (plain);
  run_free (r);
}

/* Positions of the needle still stored (in every layer), after a run. */
static gboolean
needle_kept (Run *r)
{
  for (gint32 l = 0; l < r->sc->layers; l++)
    {
      gint64 b;
      gint32 row;
      if (!sift_engine_find_row (r->engine, l, r->sc->needle, &b, &row))
        return FALSE;
    }
  return TRUE;
}

/* The last decode step's output along the needle's value (dim 1, where the
 * needle's v is 10), averaged over heads and layers' final call. */
static double
needle_signal (Run *r)
{
  const gint32 d = r->shape.head_dim, hq = r->shape.n_q_heads;
  const float *last = &g_array_index (r->outputs, float, r->outputs->len - (guint) (hq * d));
  double sum = 0;
  for (gint32 h = 0; h < hq; h++)
    sum += last[h * d + 1];
  return sum / hq;
}

static void
test_needle (void **state)
{
  (void) state;
  for (int gran = 0; gran < 2; gran++)
    {
      Scenario sc = base;
      sc.needle = 40;
      sc.prompt = 256;
      sc.steps = 200;
      sc.capacity = gran == SIFT_EVICT_BLOCK ? 96 : 64;
      sc.gran = gran;
      sc.check = FALSE;
      sc.policy = "h2o";
      Run *h2o = run_new (&sc);
      run_all (h2o);
      sc.policy = NULL; /* sinks + window: the oldest go first */
      Run *window = run_new (&sc);
      run_all (window);
      sc.policy = "streaming";
      sc.params[0] = "sink_tokens=4";
      sc.params[1] = "window_tokens=32";
      Run *streaming = run_new (&sc);
      run_all (streaming);
      assert_true (needle_kept (h2o));
      assert_false (needle_kept (window));
      assert_false (needle_kept (streaming));
      /* The kept needle is still what attention retrieves. */
      double with = needle_signal (h2o), without = needle_signal (window);
      if (!(with > 3.0 && fabs (without) < 1.0))
        fail_msg ("%s: the needle's value in the last output: %g under h2o, %g under sinks + window",
                  gran ? "block" : "token", with, without);
      run_free (h2o);
      run_free (window);
      run_free (streaming);
    }
}

/* Streaming evicts everything between its sinks and its window whenever
 * eviction runs (not only what the capacity needs). */
static void
test_streaming_window (void **state)
{
  (void) state;
  Scenario sc = base;
  sc.policy = "streaming";
  sc.params[0] = "sink_tokens=4";
  sc.params[1] = "window_tokens=24";
  sc.capacity = 200;
  sc.prompt = 240; /* chunks of 32: 224 tokens pass the capacity at chunk 192..223 */
  sc.steps = 0;
  sc.check = FALSE;
  Run *r = run_new (&sc);
  run_all (r);
  /* That chunk's eviction left the sinks, the window before its first row
   * [192 - 24, 192) and the chunk; the last chunk (224..239) evicted
   * nothing: 4 + 72 of 200 tokens, not the 200 the capacity allows. */
  for (gint32 l = 0; l < sc.layers; l++)
    {
      gsize n = sift_engine_stored_positions (r->engine, l, NULL);
      g_autofree gint64 *pos = g_new (gint64, n);
      sift_engine_stored_positions (r->engine, l, pos);
      assert_int_equal (n, 4 + 72);
      for (gsize i = 0; i < n; i++)
        assert_int_equal (pos[i], i < 4 ? (gint64) i : 168 + (gint64) i - 4);
    }
  run_free (r);
}

/* Protected tokens stay whatever the policy says: a policy that asks for
 * every candidate's eviction leaves exactly the sinks and the recent window. */
static void
test_protected (void **state)
{
  (void) state;
  for (int gran = 0; gran < 2; gran++)
    {
      Scenario sc = base;
      sc.policy = "test";
      sc.mode = SCORE_HOSTILE;
      sc.gran = gran;
      sc.capacity = 128;
      sc.sinks = 5;
      sc.recent = 20;
      sc.check = TRUE;
      Run *r = run_new (&sc);
      run_all (r); /* check_state asserts the protected tokens after every step */
      TestPolicy *tp = (TestPolicy *) r->policy;
      assert_true (tp->calls > 0);
      assert_int_equal (tp->bad_candidates, 0);
      if (gran == SIFT_EVICT_TOKEN)
        {
          gsize n = sift_engine_stored_positions (r->engine, 0, NULL);
          assert_true ((gint64) n <= sc.sinks + sc.recent + sc.block);
        }
      assert_true (r->max_err < 1e-4);
      run_free (r);
    }
}

/* Compaction (scattered victims) keeps Quest-style metadata true: every
 * rewritten or renumbered block is offered to the offload hooks again. */
static void
test_hooks_after_compaction (void **state)
{
  (void) state;
  for (int gran = 0; gran < 2; gran++)
    {
      Scenario sc = base;
      sc.policy = "test";
      sc.mode = SCORE_RANDOM;
      sc.gran = gran;
      sc.check = TRUE;
      Run *r = run_new (&sc);
      run_all (r); /* check_state compares the hook's key sums with the blocks */
      SiftCounters c;
      sift_engine_counters (r->engine, -1, SIFT_PHASE_DECODE, &c);
      assert_true (c.bytes_compacted > 0);
      run_free (r);
    }
}

/* A plugin built against ABI 1.0 (its 128-byte ops table) is refused by
 * this 2.x host, with the file and both versions in the message, and its
 * table is never read past its version fields (ASan would see it). */
static void
test_old_abi (void **state)
{
  (void) state;
  g_autoptr (GError) error = NULL;
  assert_null (sift_registry_lookup (registry, "old-abi", &error));
  assert_non_null (error);
  if (!g_error_matches (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_ABI)
      || strstr (error->message, EVICT_PLUGIN_DIR "/libold-abi.so: built for policy ABI 1.0, "
                                 "but this sift has ABI 2.0 (major versions differ)") == NULL)
    fail_msg ("unexpected error: %s", error->message);
}

static void
test_config_errors (void **state)
{
  (void) state;
  SiftModelShape shape = { 1, 4, 2, 32, 16, 32, 0 };
  SiftStoreConfig stc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
  g_autoptr (SiftStore) store = sift_store_host_new (&stc, NULL);
  SiftEngineConfig ec = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 2 };
  g_autoptr (SiftEngine) e = sift_engine_new (&ec, store, NULL);
  struct {
    SiftEvictConfig ev;
    const char *part;
  } bad[] = {
    { { 30, SIFT_EVICT_TOKEN, 4, 16 }, "capacity_tokens 30 cannot hold 4 protected sink and 16 recent tokens with token eviction of 16-token blocks (at least 36 needed)" },
    { { 60, SIFT_EVICT_BLOCK, 4, 16 }, "(at least 68 needed)" },
    { { -1, SIFT_EVICT_TOKEN, 0, 0 }, "must not be negative" },
    { { 64, 7, 0, 0 }, "unknown eviction granularity 7" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr (GError) error = NULL;
      assert_false (sift_engine_set_eviction (e, &bad[i].ev, &error));
      assert_true (g_error_matches (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID));
      if (strstr (error->message, bad[i].part) == NULL)
        fail_msg ("'%s' lacks '%s'", error->message, bad[i].part);
    }
  SiftEvictConfig ok = { 36, SIFT_EVICT_TOKEN, 4, 16 };
  assert_true (sift_engine_set_eviction (e, &ok, NULL));
}

/* A policy with its own compute that predates eviction (no score_eviction)
 * is stopped at the first eviction with a clear error, never run over a
 * compacted cache it may misread. */
static gboolean
own_compute (SiftPolicy *self, const SiftPolicyContext *ctx, SiftView *out, float *lse, GError **error)
{
  (void) self;
  return sift_engine_attend_default (ctx->engine, ctx, NULL, out, lse, error);
}

static const SiftPolicyOps own_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "own-compute",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE,
  .instance_size = sizeof (SiftPolicy),
  .compute_chunked_prefill = own_compute,
  .compute_chunked_decode = own_compute,
};

static void
test_custom_compute_refused (void **state)
{
  (void) state;
  SiftModelShape shape = { 1, 4, 2, 32, 16, 32, 0 };
  SiftStoreConfig stc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
  g_autoptr (SiftStore) store = sift_store_host_new (&stc, NULL);
  SiftEngineConfig ec = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 2 };
  g_autoptr (SiftEngine) e = sift_engine_new (&ec, store, NULL);
  SiftEvictConfig ev = { 64, SIFT_EVICT_TOKEN, 4, 16 };
  assert_true (sift_engine_set_eviction (e, &ev, NULL));
  g_autoptr (SiftModel) src = sift_model_random_new (&shape, 3);
  g_autoptr (SiftPolicy) p = sift_policy_new (&own_ops, NULL, &shape, NULL);
  SiftPolicy *per_layer[1] = { p };
  g_autoptr (SiftRunner) r = sift_runner_new (e, src, per_layer, per_layer, NULL);
  g_autoptr (GError) error = NULL;
  assert_true (sift_runner_prefill (r, 64, NULL, NULL, &error)); /* within the capacity */
  gboolean ok = TRUE;
  for (int i = 0; i < 40 && ok; i++)
    ok = sift_runner_decode (r, 1, NULL, NULL, &error);
  assert_false (ok);
  assert_true (g_error_matches (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY));
  if (strstr (error->message, "policy 'own-compute' computes attention its own way and does not know eviction") == NULL)
    fail_msg ("%s", error->message);
}

/* Subquadratic offers eviction (evict and append): its window and globals
 * stay, the rest goes oldest first, its landmarks keep the means. Bounded
 * runs keep memory flat with every window token held; a capacity covering
 * everything is the unbounded run bit for bit; a budget below the window
 * is refused by the policy. */
static void
test_subquadratic (void **state)
{
  (void) state;
  Scenario sc = base;
  sc.policy = "subquadratic";
  sc.params[0] = "window=32";
  sc.params[1] = "block_size=16";
  sc.params[2] = "globals=[0, 50]";
  sc.check = FALSE;
  sc.capacity = 0;
  Run *unbounded = run_new (&sc);
  run_all (unbounded);
  sc.capacity = sc.prompt + sc.steps;
  Run *covering = run_new (&sc);
  run_all (covering);
  assert_memory_equal (unbounded->outputs->data, covering->outputs->data, sizeof (float) * unbounded->outputs->len);
  /* Both granularities; then separate prefill and decode instances: the
   * decode one folds the prompt's landmarks from what is still cached. */
  for (int variant = 0; variant < 3; variant++)
    {
      sc.capacity = 96;
      sc.gran = variant == 1 ? SIFT_EVICT_BLOCK : SIFT_EVICT_TOKEN;
      sc.separate = variant == 2;
      sc.steps = 400;
      Run *r = run_new (&sc);
      g_autoptr (GError) error = NULL;
      if (!sift_runner_prefill (r->runner, sc.prompt, NULL, NULL, &error))
        fail_msg ("prefill: %s", error->message);
      for (gint64 i = 0; i < sc.steps; i++)
        {
          if (!sift_runner_decode (r->runner, 1, NULL, NULL, &error))
            fail_msg ("decode step %" G_GINT64_FORMAT ": %s", i, error->message);
          assert_true (sift_store_blocks_in_use (r->store) <= sc.layers * (sc.capacity / sc.block + 1));
          const gint64 end = sift_runner_position (r->runner);
          for (gint32 l = 0; l < sc.layers; l++)
            {
              SiftPolicyContext ctx = { 0 };
              sift_engine_fill_context (r->engine, &ctx, l);
              gint64 b;
              gint32 row;
              /* The window of the next row and the globals are held. */
              for (gint64 t = end - 32; t < ctx.kv_len; t++)
                assert_true (sift_engine_find_row (r->engine, l, t, &b, &row));
              assert_true (sift_engine_find_row (r->engine, l, 0, &b, &row));
              assert_true (sift_engine_find_row (r->engine, l, 50, &b, &row));
            }
        }
      for (guint i = 0; i < r->outputs->len; i++)
        assert_true (isfinite (g_array_index (r->outputs, float, i)));
      SiftCounters c;
      sift_engine_counters (r->engine, -1, SIFT_PHASE_DECODE, &c);
      assert_true (c.tokens_evicted > 0);
      run_free (r);
    }
  run_free (unbounded);
  run_free (covering);
  /* A budget that cannot hold the window. */
  sc.params[0] = "window=100";
  sc.separate = FALSE;
  sc.capacity = 96;
  sc.gran = SIFT_EVICT_TOKEN;
  Run *r = run_new (&sc);
  g_autoptr (GError) error = NULL;
  gboolean ok = sift_runner_prefill (r->runner, sc.prompt, NULL, NULL, &error);
  for (gint64 i = 0; ok && i < sc.steps; i++)
    ok = sift_runner_decode (r->runner, 1, NULL, NULL, &error);
  assert_false (ok);
  if (strstr (error->message, "lie outside its window of 100 and its globals: raise kv.capacity_tokens") == NULL)
    fail_msg ("%s", error->message);
  run_free (r);
}

static int
setup (void **state)
{
  (void) state;
  const char *dirs[] = { EVICT_PLUGIN_DIR, NULL };
  registry = sift_registry_new (dirs);
  return 0;
}

static int
teardown (void **state)
{
  (void) state;
  sift_registry_free (registry);
  return 0;
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_config_errors),
    cmocka_unit_test (test_reference),
    cmocka_unit_test (test_stores),
    cmocka_unit_test (test_memory_constant),
    cmocka_unit_test (test_capacity_covers_all),
    cmocka_unit_test (test_accumulated_reference),
    cmocka_unit_test (test_needle),
    cmocka_unit_test (test_streaming_window),
    cmocka_unit_test (test_protected),
    cmocka_unit_test (test_hooks_after_compaction),
    cmocka_unit_test (test_old_abi),
    cmocka_unit_test (test_custom_compute_refused),
    cmocka_unit_test (test_subquadratic),
  };
  return cmocka_run_group_tests (tests, setup, teardown);
}
