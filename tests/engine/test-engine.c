/* The OffloadEngine through the runner with dense ("full") attention:
 * every attention call equals a naive double-precision reference within
 * 1e-5 relative, across slots, block and chunk sizes, stores, stored and
 * compute dtypes, MHA / GQA and both decode pipelines; reset leaves no
 * trace; several sequences share one store. (Resident KV: test-resident.c.)
 *
 * Built a second time with SIFT_TEST_CUDA (tests/cuda: test-cuda-engine)
 * the same properties hold for an engine on the GPU (offload.device cuda):
 * its own grid of the shapes and dtypes the GPU kernels take, within the
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
/* The CPU-only tests below are not run here. */
#pragma GCC diagnostic ignored "-Wunused-function"
#endif

static void
check_case (const TestCase *c, double tol)
{
  TestRun r;
  test_run_open (&r, c, 42, NULL, FALSE);
  test_run_sequence (&r, c);
  gint64 chunks = (c->prompt + c->chunk - 1) / c->chunk;
  assert_int_equal (r.check->calls, (chunks + c->steps) * c->layers);
  if (r.check->max_err > tol || r.check->max_lse_err > tol)
    fail_msg ("L%d q%d kv%d d%d block %d chunk %d slots %d %s %s->%s %s prompt %" G_GINT64_FORMAT
              ": max error %.3g, lse %.3g (tolerance %g)",
              c->layers, c->q_heads, c->kv_heads, c->head_dim, c->block, c->chunk, c->slots, c->file ? "file" : "host",
              sift_dtype_name (c->stored), sift_dtype_name (c->compute),
              c->pipeline == SIFT_PIPELINE_RING ? "ring" : "cross-layer", c->prompt, r.check->max_err,
              r.check->max_lse_err, tol);
  /* Every stored block was counted once per layer, and dense attends all it may. */
  SiftCounters pc, dc;
  sift_engine_counters (r.engine, -1, SIFT_PHASE_PREFILL, &pc);
  sift_engine_counters (r.engine, -1, SIFT_PHASE_DECODE, &dc);
  assert_int_equal (pc.tokens_attended, pc.tokens_available);
  assert_int_equal (dc.tokens_attended, dc.tokens_available);
  assert_int_equal (pc.blocks_selected, pc.blocks_available);
  gint64 stored_blocks = (c->prompt + c->block - 1) / c->block + (test_case_tokens (c) - c->prompt) / c->block;
  assert_int_equal (pc.bytes_stored + dc.bytes_stored,
                    (guint64) (stored_blocks * c->layers) * sift_store_block_bytes (r.store));
  /* Loads: every chunk after the first reads every earlier block once. */
  guint64 loads = 0;
  for (gint64 ch = 1; ch < chunks; ch++)
    loads += (guint64) (ch * c->chunk / c->block);
  assert_int_equal (pc.bytes_loaded, loads * (guint64) c->layers * sift_store_block_bytes (r.store));
  test_run_close (&r, TRUE);
}

#ifdef SIFT_TEST_CUDA
/* The GPU kernels take f16 / bf16 compute and head_dim 64 or 128; slots 2..8,
 * blocks 16..256, chunks, host (pinned, copied in place) and file (staged)
 * stores, stored dtypes converted on load, both pipelines, 50+ steps. */
static const TestCase grid[] = {
  /* L  q  kv  d   block chunk slots file  stored          compute          pipeline                prompt steps policy */
  { 2, 4, 2, 64, 16, 32, 2, FALSE, SIFT_DTYPE_F16, SIFT_DTYPE_F16, SIFT_PIPELINE_RING, 203, 60, TEST_POL_NULL },
  { 2, 4, 4, 64, 32, 64, 3, TRUE, SIFT_DTYPE_BF16, SIFT_DTYPE_BF16, SIFT_PIPELINE_CROSS_LAYER, 300, 55, TEST_POL_FULL },
  { 3, 8, 2, 128, 16, 16, 8, FALSE, SIFT_DTYPE_BF16, SIFT_DTYPE_BF16, SIFT_PIPELINE_RING, 170, 52, TEST_POL_SELECT_ALL },
  { 2, 4, 1, 64, 64, 128, 4, TRUE, SIFT_DTYPE_F32, SIFT_DTYPE_F16, SIFT_PIPELINE_RING, 390, 70, TEST_POL_FULL },
  { 2, 2, 2, 128, 128, 256, 5, FALSE, SIFT_DTYPE_F16, SIFT_DTYPE_F16, SIFT_PIPELINE_CROSS_LAYER, 520, 55, TEST_POL_SELECT_ALL },
  { 1, 4, 2, 64, 256, 256, 6, TRUE, SIFT_DTYPE_F32, SIFT_DTYPE_BF16, SIFT_PIPELINE_RING, 700, 60, TEST_POL_NULL },
  { 2, 6, 3, 64, 16, 64, 7, FALSE, SIFT_DTYPE_F32, SIFT_DTYPE_F16, SIFT_PIPELINE_CROSS_LAYER, 131, 80, TEST_POL_SELECT_ALL },
  { 1, 32, 8, 128, 64, 512, 4, FALSE, SIFT_DTYPE_BF16, SIFT_DTYPE_BF16, SIFT_PIPELINE_RING, 1500, 52, TEST_POL_FULL },
};
#else
static const TestCase grid[] = {
  /* L  q  kv  d   block chunk slots file  stored          compute          pipeline                prompt steps policy */
  { 2, 4, 2, 32, 16, 32, 2, FALSE, SIFT_DTYPE_F32, SIFT_DTYPE_F32, SIFT_PIPELINE_RING, 203, 60, TEST_POL_NULL },
  { 2, 4, 4, 32, 32, 64, 3, TRUE, SIFT_DTYPE_F32, SIFT_DTYPE_F32, SIFT_PIPELINE_CROSS_LAYER, 300, 55, TEST_POL_FULL },
  { 3, 8, 2, 16, 16, 16, 8, FALSE, SIFT_DTYPE_F16, SIFT_DTYPE_F32, SIFT_PIPELINE_RING, 170, 52, TEST_POL_SELECT_ALL },
  { 2, 4, 1, 32, 64, 128, 4, TRUE, SIFT_DTYPE_BF16, SIFT_DTYPE_F32, SIFT_PIPELINE_RING, 390, 70, TEST_POL_FULL },
  { 2, 2, 2, 64, 128, 256, 5, FALSE, SIFT_DTYPE_F16, SIFT_DTYPE_F16, SIFT_PIPELINE_CROSS_LAYER, 520, 55, TEST_POL_SELECT_ALL },
  { 1, 4, 2, 32, 256, 256, 6, TRUE, SIFT_DTYPE_F32, SIFT_DTYPE_BF16, SIFT_PIPELINE_RING, 700, 60, TEST_POL_NULL },
  { 1, 2, 1, 16, 1024, 1024, 2, FALSE, SIFT_DTYPE_F32, SIFT_DTYPE_F32, SIFT_PIPELINE_CROSS_LAYER, 2100, 52, TEST_POL_FULL },
  { 2, 6, 3, 32, 16, 64, 7, TRUE, SIFT_DTYPE_F16, SIFT_DTYPE_F32, SIFT_PIPELINE_CROSS_LAYER, 131, 80, TEST_POL_SELECT_ALL },
};
#endif

static void
test_dense_grid (void **state)
{
  (void) state;
  for (gsize i = 0; i < G_N_ELEMENTS (grid); i++)
    check_case (&grid[i], test_tolerance (grid[i].compute));
}

/* q8_0 is lossy: against the unrounded reference within the quantization error. */
static void
test_q8_0_store (void **state)
{
  (void) state;
  TestCase c = { 2, 4, 2, 32, 32, 64, 3, TRUE, SIFT_DTYPE_Q8_0, SIFT_DTYPE_F32, SIFT_PIPELINE_RING, 200, 50, TEST_POL_FULL };
  TestRun r;
  test_run_open (&r, &c, 7, NULL, FALSE);
  test_run_sequence (&r, &c);
  assert_true (r.check->max_err < 5e-2);
  assert_true (r.check->max_err > 1e-6); /* it really went through q8_0 */
  test_run_close (&r, TRUE);
}

/* Sequence A, reset, sequence B equals B on a fresh engine, bit for bit. */
static void
test_reset_leaves_no_trace (void **state)
{
  (void) state;
  for (int pipe = 0; pipe < 2; pipe++)
    {
      TestCase c = { 2, 4, 2, T_DIM, 16, 32, 3, pipe == 1, SIFT_DTYPE_F16, T_COMPUTE, (SiftPipeline) pipe, 150, 50, TEST_POL_FULL };
      TestRun a;
      test_run_open (&a, &c, 1, NULL, FALSE);
      test_run_sequence (&a, &c);
      sift_runner_reset (a.runner);
      assert_int_equal (sift_store_blocks_in_use (a.store), 0);
      SiftCounters z;
      sift_engine_counters (a.engine, -1, SIFT_PHASE_PREFILL, &z);
      assert_int_equal (z.bytes_stored, 0);
      assert_int_equal (z.bytes_loaded, 0);
      /* The same engine, a new sequence of another seed. */
      test_run_reset_matches_fresh (&a, &c, FALSE);
    }
}

/* Two sequences interleaved on one shared store: ids never collide, each
 * equals its reference, and freeing both returns every block. */
static void
test_multi_sequence (void **state)
{
  (void) state;
  TestCase c = { 2, 4, 2, T_DIM, 16, 64, 2, TRUE, SIFT_DTYPE_F32, T_COMPUTE, SIFT_PIPELINE_RING, 250, 50, TEST_POL_FULL };
  SiftModelShape shape = test_case_shape (&c);
  g_autofree char *path = test_tmp_path ("shared");
  SiftStoreConfig sc = test_store_config (&shape, c.stored, path);
  g_autoptr (GError) error = NULL;
  SiftStore *store = sift_store_file_new (&sc, &error);
  g_assert_no_error (error);
  TestRun a, b;
  test_run_open (&a, &c, 11, store, FALSE);
  TestCase cb = c;
  cb.prompt = 190;
  cb.pipeline = SIFT_PIPELINE_CROSS_LAYER;
  test_run_open (&b, &cb, 12, store, FALSE);
  assert_true (sift_runner_prefill (a.runner, c.prompt, NULL, NULL, &error));
  assert_true (sift_runner_prefill (b.runner, cb.prompt, NULL, NULL, &error));
  for (gint32 i = 0; i < c.steps; i++)
    {
      assert_true (sift_runner_decode (a.runner, test_rows_of_step (i), NULL, NULL, &error));
      assert_true (sift_runner_decode (b.runner, test_rows_of_step (i), NULL, NULL, &error));
    }
  g_assert_no_error (error);
  /* Store ids of the two engines are disjoint. */
  GHashTable *seen = g_hash_table_new (g_int64_hash, g_int64_equal);
  gint64 total = 0, of_b = 0;
  for (int w = 0; w < 2; w++)
    {
      SiftEngine *e = w == 0 ? a.engine : b.engine;
      for (gint32 l = 0; l < c.layers; l++)
        for (guint i = 0; i < e->store_ids[l]->len; i++)
          {
            gint64 *id = &g_array_index (e->store_ids[l], gint64, i);
            assert_false (g_hash_table_contains (seen, id));
            g_hash_table_add (seen, id);
            total++;
            of_b += w;
          }
    }
  g_hash_table_unref (seen);
  assert_int_equal (sift_store_blocks_in_use (store), total);
  assert_true (a.check->max_err < test_tolerance (c.compute));
  assert_true (b.check->max_err < test_tolerance (c.compute));
  test_run_close (&a, FALSE);
  assert_int_equal (sift_store_blocks_in_use (store), of_b);
  test_run_close (&b, FALSE);
  assert_int_equal (sift_store_blocks_in_use (store), 0);
  sift_store_free (store);
}

/* gather_rows returns the source's k, v for stored and local positions. */
static void
test_gather_rows (void **state)
{
  (void) state;
  TestCase c = { 2, 4, 2, 32, 16, 32, 2, TRUE, SIFT_DTYPE_BF16, SIFT_DTYPE_F32, SIFT_PIPELINE_RING, 100, 5, TEST_POL_FULL };
  TestRun r;
  test_run_open (&r, &c, 3, NULL, FALSE);
  test_run_sequence (&r, &c);
  const gint64 pos[] = { 104, 0, 57, 99, 15, 16, 100, 31 };
  const gsize n = G_N_ELEMENTS (pos);
  g_autofree float *kb = g_new (float, n * 2 * 32), *vb = g_new (float, n * 2 * 32);
  SiftView k = sift_view_htd (kb, SIFT_DTYPE_F32, 2, (gint64) n, 32), v = sift_view_htd (vb, SIFT_DTYPE_F32, 2, (gint64) n, 32);
  g_autoptr (GError) error = NULL;
  SiftCounters before, after;
  sift_engine_counters (r.engine, 1, SIFT_PHASE_DECODE, &before);
  assert_true (sift_engine_gather_rows (r.engine, 1, pos, n, &k, &v, &error));
  g_assert_no_error (error);
  sift_engine_counters (r.engine, 1, SIFT_PHASE_DECODE, &after);
  for (gsize i = 0; i < n; i++)
    for (gint32 h = 0; h < 2; h++)
      {
        assert_memory_equal (sift_view_row (&k, h, (gint64) i), r.check->k[1] + (pos[i] * 2 + h) * 32, 32 * sizeof (float));
        assert_memory_equal (sift_view_row (&v, h, (gint64) i), r.check->v[1] + (pos[i] * 2 + h) * 32, 32 * sizeof (float));
      }
  /* 100 and 104 are in the decode buffer; the other 6 were read from the store (bf16 rows). */
  assert_int_equal (after.bytes_loaded - before.bytes_loaded, 6 * 2 * 2 * 32 * 2);
  /* Runs of consecutive positions (read a run per block at once) across
   * block boundaries and into the decode buffer: the same rows. */
  gint64 run[45];
  for (gsize i = 0; i < 31; i++)
    run[i] = 10 + (gint64) i; /* 10..40: blocks 0, 1, 2 */
  for (gsize i = 31; i < 45; i++)
    run[i] = 90 + (gint64) (i - 31); /* 90..103: stored up to 99, then local */
  g_autofree float *kr = g_new (float, 45 * 2 * 32), *vr = g_new (float, 45 * 2 * 32);
  SiftView k2 = sift_view_thd (kr, SIFT_DTYPE_F32, 45, 2, 32), v2 = sift_view_thd (vr, SIFT_DTYPE_F32, 45, 2, 32);
  sift_engine_counters (r.engine, 1, SIFT_PHASE_DECODE, &before);
  assert_true (sift_engine_gather_rows (r.engine, 1, run, 45, &k2, &v2, &error));
  sift_engine_counters (r.engine, 1, SIFT_PHASE_DECODE, &after);
  for (gsize i = 0; i < 45; i++)
    for (gint32 h = 0; h < 2; h++)
      {
        assert_memory_equal (sift_view_row (&k2, h, (gint64) i), r.check->k[1] + (run[i] * 2 + h) * 32, 32 * sizeof (float));
        assert_memory_equal (sift_view_row (&v2, h, (gint64) i), r.check->v[1] + (run[i] * 2 + h) * 32, 32 * sizeof (float));
      }
  assert_int_equal (after.bytes_loaded - before.bytes_loaded, (31 + 10) * 2 * 2 * 32 * 2);
  const gint64 bad = 105;
  assert_false (sift_engine_gather_rows (r.engine, 1, &bad, 1, &k, &v, &error));
  assert_int_equal (error->code, SIFT_ENGINE_ERROR_INVALID);
  test_run_close (&r, TRUE);
}

/* A policy-style K-only load: the slot's K equals the stored keys. */
static void
test_k_only_load (void **state)
{
  (void) state;
  TestCase c = { 1, 2, 2, 32, 16, 32, 2, FALSE, SIFT_DTYPE_F16, SIFT_DTYPE_F32, SIFT_PIPELINE_RING, 40, 0, TEST_POL_NULL };
  TestRun r;
  test_run_open (&r, &c, 5, NULL, FALSE);
  test_run_sequence (&r, &c);
  g_autoptr (GError) error = NULL;
  SiftCounters before, after;
  sift_engine_counters (r.engine, 0, SIFT_PHASE_PREFILL, &before);
  assert_true (sift_engine_load_block (r.engine, 0, 2, 1, SIFT_LOAD_K, &error));
  /* A busy slot cannot be loaded again. */
  assert_false (sift_engine_load_block (r.engine, 0, 1, 1, SIFT_LOAD_K, &error));
  assert_int_equal (error->code, SIFT_ENGINE_ERROR_STATE);
  g_clear_error (&error);
  assert_true (sift_engine_wait_slot (r.engine, 1, &error));
  SiftView k;
  gint32 nv = 0;
  sift_engine_slot_kv (r.engine, 1, &k, NULL, &nv);
  assert_int_equal (nv, 8); /* tokens 32..39 */
  assert_int_equal (k.n_tokens, 8);
  for (gint32 t = 0; t < nv; t++)
    for (gint32 h = 0; h < 2; h++)
      assert_memory_equal (sift_view_row (&k, h, t), r.check->k[0] + ((32 + t) * 2 + h) * 32, 32 * sizeof (float));
  sift_engine_slot_done (r.engine, 1);
  sift_engine_counters (r.engine, 0, SIFT_PHASE_PREFILL, &after);
  assert_int_equal (after.bytes_loaded - before.bytes_loaded, sift_store_block_bytes (r.store) / 2);
  /* Out-of-range block and slot are errors, not reads. */
  assert_false (sift_engine_load_block (r.engine, 0, 3, 0, SIFT_LOAD_KV, &error));
  g_clear_error (&error);
  assert_false (sift_engine_load_block (r.engine, 0, 0, 2, SIFT_LOAD_KV, &error));
  g_clear_error (&error);
  test_run_close (&r, TRUE);
}

/* Every slot can take a load: none was left busy. */
static void
assert_slots_free (SiftEngine *engine, gint32 n_slots)
{
  g_autoptr (GError) error = NULL;
  for (gint32 slot = 0; slot < n_slots; slot++)
    {
      assert_true (sift_engine_load_block (engine, 0, 0, slot, SIFT_LOAD_K, &error));
      assert_true (sift_engine_wait_slot (engine, slot, &error));
      sift_engine_slot_done (engine, slot);
    }
}

/* A stream hands out every listed block in order, its K equal to the
 * stored keys, in groups that never cross the end of the ring; an early
 * end and a bad block id (an error, not a read) both leave every slot free. */
static void
test_stream (void **state)
{
  (void) state;
  TestCase c = { 1, 2, 2, 32, 16, 32, 3, FALSE, SIFT_DTYPE_F16, SIFT_DTYPE_F32, SIFT_PIPELINE_RING, 120, 0, TEST_POL_NULL };
  TestRun r;
  test_run_open (&r, &c, 5, NULL, FALSE);
  test_run_sequence (&r, &c); /* 120 tokens: blocks 0..6 full, 7 partial */
  g_autoptr (GError) error = NULL;
  const gint64 ids[] = { 6, 0, 3, 3, 5, 1, 2 };
  for (gsize max = 1; max <= 4; max++)
    {
      SiftStream *s = sift_engine_stream_begin (r.engine, 0, ids, G_N_ELEMENTS (ids), SIFT_LOAD_K);
      SiftStreamBlock b[4];
      gsize n, seen = 0;
      while ((n = sift_engine_stream_next (s, b, max, &error)) > 0)
        {
          assert_true (n <= MIN (max, 3));
          /* Slots are index mod 3: a group stays inside one turn of the ring. */
          assert_true (b[0].index % 3 + n <= 3);
          for (gsize i = 0; i < n; i++, seen++)
            {
              assert_int_equal (b[i].index, seen);
              assert_int_equal (b[i].block_id, ids[seen]);
              assert_int_equal (b[i].n_valid, 16);
              for (gint32 t = 0; t < 16; t++)
                for (gint32 h = 0; h < 2; h++)
                  assert_memory_equal (sift_view_row (&b[i].k, h, t),
                                       r.check->k[0] + ((ids[seen] * 16 + t) * 2 + h) * 32, 32 * sizeof (float));
            }
        }
      assert_null (error);
      assert_int_equal (seen, G_N_ELEMENTS (ids));
      assert_true (sift_engine_stream_end (s));
    }
  /* An early end: loads in flight are waited for and their slots freed. */
  SiftStream *s = sift_engine_stream_begin (r.engine, 0, NULL, 7, SIFT_LOAD_KV);
  SiftStreamBlock b;
  assert_int_equal (sift_engine_stream_next (s, &b, 1, &error), 1);
  assert_true (sift_engine_stream_end (s));
  assert_slots_free (r.engine, 3);
  /* A bad id: the error comes from next, end reports the failure. */
  const gint64 bad[] = { 0, 1, 9, 2 };
  s = sift_engine_stream_begin (r.engine, 0, bad, G_N_ELEMENTS (bad), SIFT_LOAD_KV);
  assert_int_equal (sift_engine_stream_next (s, &b, 1, &error), 0);
  assert_int_equal (error->code, SIFT_ENGINE_ERROR_INVALID);
  g_clear_error (&error);
  assert_false (sift_engine_stream_end (s));
  assert_slots_free (r.engine, 3);
  test_run_close (&r, TRUE);
}

static void
test_config_errors (void **state)
{
  (void) state;
  SiftModelShape shape = { 1, 2, 2, 32, 64, 96, 0 };
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
  SiftEngineConfig ec = { shape, SIFT_DTYPE_F32, 4, SIFT_PIPELINE_RING, 0, SIFT_DEVICE_CPU };
  assert_null (sift_engine_new (&ec, store, &error));
  assert_int_equal (error->code, SIFT_ENGINE_ERROR_INVALID);
  assert_non_null (strstr (error->message, "chunk_size 96 is not a multiple of block_size 64"));
  g_clear_error (&error);
  ec.shape.chunk_size = 128;
  ec.n_slots = 1;
  assert_null (sift_engine_new (&ec, store, &error));
  assert_non_null (strstr (error->message, "at least 2 slots"));
  g_clear_error (&error);
  ec.n_slots = 2;
  ec.shape.head_dim = 64;
  assert_null (sift_engine_new (&ec, store, &error));
  assert_non_null (strstr (error->message, "store holds blocks"));
  g_clear_error (&error);
  /* offload.device cuda with f32 compute: no GPU or no cuda build here is
   * "unavailable", a GPU refuses the dtype; either way an error naming it. */
  ec.shape.head_dim = 32;
  ec.device = SIFT_DEVICE_CUDA;
  assert_null (sift_engine_new (&ec, store, &error));
  assert_true (error->domain == SIFT_CUDA_ERROR);
  assert_true (g_str_has_prefix (error->message, "engine: offload.device cuda: "));
  assert_true (error->code == SIFT_CUDA_ERROR_UNAVAILABLE
               || (error->code == SIFT_CUDA_ERROR_UNSUPPORTED && strstr (error->message, "compute dtype f32")));
  g_clear_error (&error);
  ec.device = (SiftDevice) 7;
  assert_null (sift_engine_new (&ec, store, &error));
  assert_non_null (strstr (error->message, "unknown device 7"));
  g_clear_error (&error);
  sc.dtype = SIFT_DTYPE_Q8_0;
  sc.head_dim = 48;
  assert_null (sift_store_host_new (&sc, &error));
  assert_int_equal (error->code, SIFT_STORE_ERROR_INVALID);
}

/* A policy with its own attention on a GPU engine: the runner refuses it,
 * naming it and the method (a policy that only selects blocks runs). */
static gboolean
own_compute (SiftPolicy *self, const SiftPolicyContext *ctx, SiftView *out, float *lse, GError **error)
{
  (void) self, (void) ctx, (void) out, (void) lse, (void) error;
  return TRUE;
}

static const SiftPolicyOps own_compute_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "test-own-compute",
  .version = "1",
  .description = "its own decode attention",
  .flags = SIFT_POLICY_SUPPORTS_DECODE,
  .instance_size = sizeof (SiftPolicy),
  .compute_chunked_decode = own_compute,
};

static void
test_own_compute_refused (void **state)
{
  (void) state;
  TestCase c = { 2, 4, 2, T_DIM, 16, 32, 3, FALSE, SIFT_DTYPE_F16, T_COMPUTE, SIFT_PIPELINE_RING, 64, 1, TEST_POL_FULL };
  TestRun r;
  test_run_open (&r, &c, 5, NULL, FALSE);
  g_autoptr (GError) error = NULL;
  SiftModelShape shape = test_case_shape (&c);
  g_autoptr (SiftPolicy) own = sift_policy_new (&own_compute_ops, NULL, &shape, &error);
  SiftPolicy *dec[2] = { r.policy, own };
  SiftRunner *bad = sift_runner_new (r.engine, r.src, r.per_layer, dec, &error);
  if (TEST_DEVICE == SIFT_DEVICE_CPU)
    {
      g_assert_no_error (error);
      sift_runner_free (bad);
    }
  else
    {
      assert_null (bad);
      assert_int_equal (error->code, SIFT_ENGINE_ERROR_INVALID);
      assert_non_null (strstr (error->message, "policy 'test-own-compute' (layer 1's decode)"));
      assert_non_null (strstr (error->message, "compute_chunked_decode"));
    }
  test_run_close (&r, TRUE);
}

/* Capacity of the block table. */
static void
test_max_tokens (void **state)
{
  (void) state;
  SiftModelShape shape = { 1, 2, 2, 32, 16, 32, 0 };
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
  SiftEngineConfig ec = { shape, SIFT_DTYPE_F32, 2, SIFT_PIPELINE_RING, 64, SIFT_DEVICE_CPU };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
  g_autoptr (SiftModel) src = sift_model_random_new (&shape, 1);
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, src, NULL, NULL, &error);
  assert_false (sift_runner_decode (runner, 1, NULL, NULL, &error));
  assert_int_equal (error->code, SIFT_ENGINE_ERROR_STATE);
  g_clear_error (&error);
  assert_true (sift_runner_prefill (runner, 60, NULL, NULL, &error));
  assert_false (sift_runner_prefill (runner, 60, NULL, NULL, &error));
  assert_int_equal (error->code, SIFT_ENGINE_ERROR_STATE);
  g_clear_error (&error);
  gboolean ok = TRUE;
  for (int i = 0; i < 40 && ok; i++)
    ok = sift_runner_decode (runner, 1, NULL, NULL, &error);
  assert_false (ok);
  assert_int_equal (error->code, SIFT_ENGINE_ERROR_CAPACITY);
  g_clear_error (&error);
  /* The run stopped. */
  assert_false (sift_runner_decode (runner, 1, NULL, NULL, &error));
  assert_int_equal (error->code, SIFT_ENGINE_ERROR_STATE);
}

/* The random source is a function of (seed, layer, position). */
static void
test_random_source (void **state)
{
  (void) state;
  SiftModelShape shape = { 2, 4, 2, 16, 16, 16, 0 };
  g_autoptr (SiftModel) a = sift_model_random_new (&shape, 9), b = sift_model_random_new (&shape, 9);
  g_autoptr (SiftModel) c = sift_model_random_new (&shape, 10);
  float q1[20 * 64], k1[20 * 32], v1[20 * 32], q2[5 * 64], k2[5 * 32], v2[5 * 32];
  assert_true (sift_model_qkv_at (a, 1, 100, 20, q1, k1, v1, NULL));
  assert_true (sift_model_qkv_at (b, 0, 7, 5, q2, k2, v2, NULL));
  assert_true (sift_model_qkv_at (b, 1, 113, 5, q2, k2, v2, NULL));
  assert_memory_equal (q1 + 13 * 64, q2, sizeof q2);
  assert_memory_equal (k1 + 13 * 32, k2, sizeof k2);
  assert_memory_equal (v1 + 13 * 32, v2, sizeof v2);
  assert_true (sift_model_qkv_at (c, 1, 113, 5, q2, k2, v2, NULL));
  assert_memory_not_equal (q1 + 13 * 64, q2, sizeof q2);
  double sum = 0, sq = 0;
  for (gsize i = 0; i < G_N_ELEMENTS (q1); i++)
    sum += q1[i], sq += (double) q1[i] * q1[i];
  assert_true (fabs (sum / G_N_ELEMENTS (q1)) < 0.1);
  assert_true (fabs (sq / G_N_ELEMENTS (q1) - 1.0) < 0.1);
  g_autoptr (GError) error = NULL;
  assert_false (sift_model_qkv_at (a, 2, 0, 1, q2, k2, v2, &error));
  assert_int_equal (error->code, SIFT_MODEL_ERROR_INVALID);
}

#ifdef SIFT_TEST_CUDA
/* Prefetch across calls (engine/ring.c): a decode call that streams every
 * block through the ring loads the next call's first blocks after its last
 * load, and the next call takes them as they are. The outputs are those of
 * an engine without it (SIFT_ENGINE_NO_PREFETCH=1) bit for bit; each step
 * loads its blocks once, so the bytes differ by what was loaded ahead
 * after the last step only (at most the ring's slots); a selection (even of
 * every block) loads nothing ahead. */
static void
test_prefetch (void **state)
{
  (void) state;
  static const TestCase cases[] = {
    /* L  q  kv  d   block chunk slots file  stored          compute          pipeline            prompt steps policy */
    { 1, 4, 2, 64, 16, 32, 4, FALSE, SIFT_DTYPE_F16, SIFT_DTYPE_F16, SIFT_PIPELINE_RING, 203, 40, TEST_POL_NULL },
    { 3, 4, 2, 64, 16, 32, 5, TRUE, SIFT_DTYPE_F32, SIFT_DTYPE_F16, SIFT_PIPELINE_RING, 150, 30, TEST_POL_FULL },
    { 2, 8, 2, 128, 32, 64, 6, FALSE, SIFT_DTYPE_BF16, SIFT_DTYPE_BF16, SIFT_PIPELINE_RING, 300, 30, TEST_POL_FULL },
    { 2, 8, 2, 128, 32, 64, 6, FALSE, SIFT_DTYPE_BF16, SIFT_DTYPE_BF16, SIFT_PIPELINE_RING, 300, 30,
      TEST_POL_SELECT_ALL },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      const TestCase *c = &cases[i];
      TestRun a, b;
      test_run_open (&a, c, 42, NULL, FALSE);
      g_setenv ("SIFT_ENGINE_NO_PREFETCH", "1", TRUE);
      test_run_open (&b, c, 42, NULL, FALSE);
      g_unsetenv ("SIFT_ENGINE_NO_PREFETCH");
      assert_true (a.engine->prefetch);
      assert_false (b.engine->prefetch);
      test_run_sequence (&a, c);
      test_run_sequence (&b, c);
      g_assert_cmpmem (a.check->outputs->data, a.check->outputs->len * sizeof (float), b.check->outputs->data,
                       b.check->outputs->len * sizeof (float));
      SiftCounters ad, bd;
      sift_engine_counters (a.engine, -1, SIFT_PHASE_DECODE, &ad);
      sift_engine_counters (b.engine, -1, SIFT_PHASE_DECODE, &bd);
      const guint64 block = sift_store_block_bytes (a.store);
      assert_int_equal (b.engine->n_ahead_taken, 0);
      if (c->policy == TEST_POL_SELECT_ALL)
        {
          assert_int_equal (a.engine->n_ahead_taken, 0);
          assert_int_equal (ad.bytes_loaded, bd.bytes_loaded);
        }
      else
        {
          /* Every step after the first (the first layer's, after the last
           * layer's first call) takes its first blocks as loaded ahead. */
          assert_true (a.engine->n_ahead_taken >= (guint64) (c->steps - 1) * (guint64) MIN (c->slots, 2));
          assert_true (ad.bytes_loaded > bd.bytes_loaded);
          assert_true (ad.bytes_loaded - bd.bytes_loaded <= (guint64) c->slots * block);
          assert_int_equal ((ad.bytes_loaded - bd.bytes_loaded) % block, 0);
        }
      test_run_close (&a, TRUE);
      test_run_close (&b, TRUE);
    }
}
#endif

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
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_dense_grid),
    cmocka_unit_test (test_reset_leaves_no_trace),
    cmocka_unit_test (test_multi_sequence),
    cmocka_unit_test (test_own_compute_refused),
    cmocka_unit_test (test_prefetch),
  };
  if (g_getenv ("SIFT_TEST_FILTER") != NULL) /* a cmocka test-name filter (for the sanitizers) */
    cmocka_set_test_filter (g_getenv ("SIFT_TEST_FILTER"));
  return cmocka_run_group_tests (tests, NULL, NULL);
#else
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_dense_grid),
    cmocka_unit_test (test_q8_0_store),
    cmocka_unit_test (test_reset_leaves_no_trace),
    cmocka_unit_test (test_multi_sequence),
    cmocka_unit_test (test_gather_rows),
    cmocka_unit_test (test_k_only_load),
    cmocka_unit_test (test_stream),
    cmocka_unit_test (test_config_errors),
    cmocka_unit_test (test_own_compute_refused),
    cmocka_unit_test (test_max_tokens),
    cmocka_unit_test (test_random_source),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
#endif
}
