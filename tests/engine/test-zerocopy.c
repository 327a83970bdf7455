/* Zero-copy slots: a ring load from a host store whose dtype is the
 * compute dtype maps the slot onto the stored block. Mapped and copied runs
 * give the same output bit for bit; a mapped slot stays valid until
 * slot_done even when eviction rewrites or releases its block; force_copy
 * (API and offload.force_copy) copies again; stores that cannot map copy. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "helpers.h"

typedef struct {
  SiftStore *store;
  SiftEngine *engine;
  SiftModel *src;
  SiftRunner *runner;
  TestChecker *check;
} Run;

static void
run_open (Run *r, const SiftModelShape *shape, SiftDType dtype, gint32 slots, SiftPipeline pipe, gboolean force_copy,
          gint64 n_tokens)
{
  g_autoptr (GError) error = NULL;
  SiftStoreConfig sc = test_store_config (shape, dtype, NULL);
  r->store = sift_store_host_new (&sc, &error);
  g_assert_no_error (error);
  SiftEngineConfig ec = { .shape = *shape, .compute_dtype = dtype, .n_slots = slots, .pipeline = pipe };
  r->engine = sift_engine_new (&ec, r->store, &error);
  g_assert_no_error (error);
  sift_engine_set_force_copy (r->engine, force_copy);
  r->src = test_source_new (shape, 21, dtype);
  r->runner = sift_runner_new (r->engine, r->src, NULL, NULL, &error);
  g_assert_no_error (error);
  r->check = test_checker_new (r->src, n_tokens);
  sift_runner_set_observer (r->runner, &test_checker_observer, r->check);
}

static void
run_close (Run *r)
{
  test_checker_free (r->check);
  sift_runner_free (r->runner);
  sift_engine_free (r->engine);
  sift_model_free (r->src);
  assert_int_equal (sift_store_blocks_in_use (r->store), 0);
  sift_store_free (r->store);
}

static void
run_steps (Run *r, gint64 prompt, gint32 steps)
{
  g_autoptr (GError) error = NULL;
  assert_true (sift_runner_prefill (r->runner, prompt, NULL, NULL, &error));
  for (gint32 i = 0; i < steps; i++)
    assert_true (sift_runner_decode (r->runner, i % 5 == 4 ? 3 : 1, NULL, NULL, &error));
  g_assert_no_error (error);
}

static double
max_rel_diff (const GArray *a, const GArray *b)
{
  g_assert_cmpuint (a->len, ==, b->len);
  double scale = 1e-3, d = 0;
  for (guint i = 0; i < a->len; i++)
    scale = MAX (scale, fabs (g_array_index (a, float, i)));
  for (guint i = 0; i < a->len; i++)
    d = MAX (d, fabs ((double) g_array_index (a, float, i) - g_array_index (b, float, i)));
  return d / scale;
}

/* The same sequence mapped and copied: every block a ring slot shows is
 * the same bytes; outputs agree to rounding (the copied ring attends in
 * groups, sift_engine_ring_group, the mapped path all blocks at once); the same
 * bytes are counted as loaded, and only the mapped run reports them as
 * mapped. */
static void
test_mapped_equals_copied (void **state)
{
  (void) state;
  const struct {
    SiftModelShape shape;
    SiftDType dtype;
    gint32 slots;
    SiftPipeline pipe;
  } cases[] = {
    { { 2, 4, 2, 32, 16, 32, 0 }, SIFT_DTYPE_F32, 2, SIFT_PIPELINE_RING },
    { { 1, 8, 2, 64, 64, 128, 0 }, SIFT_DTYPE_F16, 4, SIFT_PIPELINE_RING },
    { { 2, 4, 4, 16, 32, 32, 0 }, SIFT_DTYPE_BF16, 3, SIFT_PIPELINE_CROSS_LAYER },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      const gint64 prompt = 7 * cases[i].shape.block_size + 5;
      const gint32 steps = 40;
      Run m, c;
      run_open (&m, &cases[i].shape, cases[i].dtype, cases[i].slots, cases[i].pipe, FALSE, prompt + 2 * steps);
      run_open (&c, &cases[i].shape, cases[i].dtype, cases[i].slots, cases[i].pipe, TRUE, prompt + 2 * steps);
      assert_true (sift_engine_maps (m.engine));
      assert_false (sift_engine_maps (c.engine));
      run_steps (&m, prompt, steps);
      run_steps (&c, prompt, steps);
      assert_true (m.check->max_err < 1e-5);
      assert_true (c.check->max_err < 1e-5);
      assert_true (max_rel_diff (m.check->outputs, c.check->outputs) < 1e-6);
      for (SiftPhase ph = SIFT_PHASE_PREFILL; ph <= SIFT_PHASE_DECODE; ph++)
        {
          SiftCounters cm, cc;
          sift_engine_counters (m.engine, -1, ph, &cm);
          sift_engine_counters (c.engine, -1, ph, &cc);
          assert_int_equal (cm.bytes_loaded, cc.bytes_loaded);
          assert_int_equal (cc.bytes_mapped, 0);
          /* Resident blocks are read in place in both phases, also where
           * the config asks for the cross-layer pipeline (nothing to prefetch). */
          assert_true (cm.bytes_loaded > 0);
          assert_int_equal (cm.bytes_mapped, cm.bytes_loaded);
          assert_true (cm.seconds_load == 0);
        }
      /* Slot by slot, mapped and copied loads show the same bytes. */
      const SiftModelShape *s = &cases[i].shape;
      const gsize half = sift_store_block_bytes (m.store) / 2;
      for (gint32 l = 0; l < s->n_layers; l++)
        for (gint64 b = 0; b < (gint64) m.engine->store_ids[l]->len; b++)
          {
            SiftView km, vm, kc, vc;
            gint32 nm = 0, nc = 0;
            g_autoptr (GError) error = NULL;
            for (int w = 0; w < 2; w++)
              {
                SiftEngine *e = w == 0 ? m.engine : c.engine;
                assert_true (sift_engine_load_block (e, l, b, (gint32) (b % cases[i].slots), SIFT_LOAD_KV, &error));
                assert_true (sift_engine_wait_slot (e, (gint32) (b % cases[i].slots), &error));
                sift_engine_slot_kv (e, (gint32) (b % cases[i].slots), w == 0 ? &km : &kc, w == 0 ? &vm : &vc,
                                     w == 0 ? &nm : &nc);
              }
            assert_int_equal (nm, nc);
            assert_int_equal (km.head_stride, kc.head_stride);
            assert_memory_equal (km.data, kc.data, half);
            assert_memory_equal (vm.data, vc.data, half);
            assert_ptr_not_equal (km.data, kc.data);
            sift_engine_slot_done (m.engine, (gint32) (b % cases[i].slots));
            sift_engine_slot_done (c.engine, (gint32) (b % cases[i].slots));
          }
      run_close (&m);
      run_close (&c);
    }
}

/* ---- The batched attend against one call and one merge per block -------- */

static double compare_max_err;
static gboolean compare_per_head;
static gboolean compare_late; /* the first two blocks only for query head 1, the rest whole */

/* A selection mixing whole blocks, kv-head and query-head picks. */
static SiftSelection *
mixed_selection (const SiftPolicyContext *ctx, GError **error)
{
  const gint32 H = ctx->shape->n_q_heads, KV = ctx->shape->n_kv_heads;
  SiftSelection *sel = sift_selection_new (H, KV);
  g_autofree gint64 *avail = g_new (gint64, MAX (ctx->n_blocks, 1));
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    {
      avail[b] = b;
      if (b % 4 == 0)
        sift_selection_add (sel, b);
      else if (b % 4 == 1)
        sift_selection_add_kv_head (sel, b, (gint32) (b % KV));
      else
        for (gint32 h = 0; h < H; h++)
          if ((b * 7 + h * 5 + ctx->layer) % 3 != 0)
            sift_selection_add_q_head (sel, b, h);
    }
  if (!sift_selection_validate (sel, avail, (gsize) ctx->n_blocks, "test-compare-batched", error))
    g_clear_pointer (&sel, sift_selection_free);
  return sel;
}

/* Query head 1 alone attends blocks 0 and 1; every head the later ones. A
 * ring group of only the early blocks leaves the other heads unwritten,
 * and a later group is whole. */
static SiftSelection *
late_selection (const SiftPolicyContext *ctx, GError **error)
{
  SiftSelection *sel = sift_selection_new (ctx->shape->n_q_heads, ctx->shape->n_kv_heads);
  g_autofree gint64 *avail = g_new (gint64, MAX (ctx->n_blocks, 1));
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    {
      avail[b] = b;
      if (b < 2)
        sift_selection_add_q_head (sel, b, 1);
      else
        sift_selection_add (sel, b);
    }
  if (!sift_selection_validate (sel, avail, (gsize) ctx->n_blocks, "test-compare-batched", error))
    g_clear_pointer (&sel, sift_selection_free);
  return sel;
}

/* A policy whose compute runs the default pipeline (batched) and checks it
 * against the obvious way: every stored block through the ring protocol,
 * one kernel call and one sift_attn_merge each, then the local tokens. */
static gboolean
compare_compute (SiftPolicy *self, const SiftPolicyContext *ctx, SiftView *out, float *lse, GError **error)
{
  (void) self;
  SiftEngine *e = ctx->engine;
  g_autoptr (SiftSelection) sel = compare_late ? late_selection (ctx, error)
                                  : compare_per_head ? mixed_selection (ctx, error) : NULL;
  if ((compare_per_head + compare_late > 0 && sel == NULL) || !sift_engine_attend_default (e, ctx, sel, out, lse, error))
    return FALSE;
  const gint32 H = ctx->shape->n_q_heads, d = ctx->shape->head_dim, G = H / ctx->shape->n_kv_heads;
  const gint64 nq = ctx->n_q;
  g_autofree float *ro = g_new0 (float, (gsize) H * nq * d), *rl = g_new (float, (gsize) H * nq);
  g_autofree float *po = g_new0 (float, (gsize) H * nq * d), *pl = g_new (float, (gsize) H * nq);
  for (gint64 i = 0; i < H * nq; i++)
    rl[i] = -INFINITY;
  SiftView ref = sift_view_htd (ro, SIFT_DTYPE_F32, H, nq, d), part = sift_view_htd (po, SIFT_DTYPE_F32, H, nq, d);
  SiftAttnOpts opts = { .scale = ctx->shape->scale };
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    {
      gint32 slot = (gint32) (b % sift_engine_n_slots (e));
      SiftView k, v;
      if (!sift_engine_load_block (e, ctx->layer, b, slot, SIFT_LOAD_KV, error) || !sift_engine_wait_slot (e, slot, error))
        return FALSE;
      sift_engine_slot_kv (e, slot, &k, &v, NULL);
      gboolean ok = TRUE;
      for (gint32 h = 0; h < H && ok; h++)
        if (sel == NULL || sift_selection_has (sel, b, h))
          {
            SiftView qs = sift_view_heads (&ctx->q, h, 1), ks = sift_view_heads (&k, h / G, 1),
                     vs = sift_view_heads (&v, h / G, 1), ps = sift_view_heads (&part, h, 1),
                     rs = sift_view_heads (&ref, h, 1);
            ok = sift_attn_dense (&qs, &ks, &vs, &opts, &ps, pl + h * nq, error)
                 && sift_attn_merge (&rs, rl + h * nq, &ps, pl + h * nq, error);
          }
      sift_engine_slot_done (e, slot);
      if (!ok)
        return FALSE;
    }
  SiftView lk, lv;
  sift_engine_local_kv (e, ctx, &lk, &lv);
  opts.causal = TRUE;
  opts.q_offset = ctx->q_pos - ctx->kv_len;
  if (!sift_attn_dense (&ctx->q, &lk, &lv, &opts, &part, pl, error) || !sift_attn_merge (&ref, rl, &part, pl, error))
    return FALSE;
  double scale = 1e-3, diff = 0, ldiff = 0;
  for (gint32 h = 0; h < H; h++)
    for (gint64 t = 0; t < nq; t++)
      {
        const float *a = sift_view_row (out, h, t), *r = sift_view_row (&ref, h, t);
        for (gint32 j = 0; j < d; j++)
          {
            scale = MAX (scale, fabs (r[j]));
            diff = MAX (diff, fabs ((double) a[j] - r[j]));
          }
        ldiff = MAX (ldiff, fabs ((double) lse[h * nq + t] - rl[h * nq + t]) / MAX (1.0, fabs (rl[h * nq + t])));
      }
  compare_max_err = MAX (compare_max_err, MAX (diff / scale, ldiff));
  return TRUE;
}

static const SiftPolicyOps compare_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "test-compare-batched",
  .version = "1",
  .description = "default pipeline checked against one merge per block",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE,
  .instance_size = sizeof (SiftPolicy),
  .compute_chunked_prefill = compare_compute,
  .compute_chunked_decode = compare_compute,
};

static void
test_batched_equals_per_block (void **state)
{
  (void) state;
  for (int copy = 0; copy < 2; copy++)
    for (int gqa = 0; gqa < 2; gqa++)
      for (int per_head = 0; per_head < 2; per_head++)
      {
        compare_per_head = per_head;
        SiftModelShape shape = { 2, 8, gqa ? 2 : 8, 32, 16, 48, 0 };
        g_autoptr (GError) error = NULL;
        SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
        g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
        SiftEngineConfig ec = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 4 };
        g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
        sift_engine_set_force_copy (engine, copy);
        g_autoptr (SiftModel) src = sift_model_random_new (&shape, 5);
        g_autoptr (SiftPolicy) pol = sift_policy_new (&compare_ops, NULL, &shape, &error);
        SiftPolicy *per[2] = { pol, pol };
        g_autoptr (SiftRunner) runner = sift_runner_new (engine, src, per, per, &error);
        g_assert_no_error (error);
        compare_max_err = 0;
        assert_true (sift_runner_prefill (runner, 200, NULL, NULL, &error));
        for (int i = 0; i < 30; i++)
          assert_true (sift_runner_decode (runner, i % 4 == 3 ? 5 : 1, NULL, NULL, &error));
        g_assert_no_error (error);
        assert_true (compare_max_err < 5e-6);
      }
}

/* A head that no block of the first ring groups reaches (and the local
 * tokens come only with the last group) is still unwritten when a later
 * group that every head attends arrives: that group must merge into the
 * heads already written, not overwrite them. */
static void
test_batched_late_heads (void **state)
{
  (void) state;
  compare_late = TRUE;
  for (int copy = 0; copy < 2; copy++)
    for (gint32 slots = 2; slots <= 4; slots += 2)
      for (int gqa = 0; gqa < 2; gqa++)
        {
          SiftModelShape shape = { 1, 4, gqa ? 2 : 4, 16, 16, 32, 0 };
          g_autoptr (GError) error = NULL;
          SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
          g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
          SiftEngineConfig ec = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = slots };
          g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
          sift_engine_set_force_copy (engine, copy);
          sift_engine_set_ring_group (engine, slots / 2); /* several blocks per group */
          g_autoptr (SiftModel) src = sift_model_random_new (&shape, 9);
          g_autoptr (SiftPolicy) pol = sift_policy_new (&compare_ops, NULL, &shape, &error);
          SiftPolicy *per[1] = { pol };
          g_autoptr (SiftRunner) runner = sift_runner_new (engine, src, per, per, &error);
          g_assert_no_error (error);
          compare_max_err = 0;
          assert_true (sift_runner_prefill (runner, 96, NULL, NULL, &error));
          for (int i = 0; i < 6; i++)
            assert_true (sift_runner_decode (runner, 1, NULL, NULL, &error));
          g_assert_no_error (error);
          if (!(compare_max_err < 5e-6))
            fail_msg ("%s, %d slots, %s: error %g", copy ? "copied" : "mapped", slots, gqa ? "gqa" : "mha",
                      compare_max_err);
        }
  compare_late = FALSE;
}

/* ---- Results do not depend on load timing ------------------------------- */

/* A host store whose reads sleep a pseudo-random while: loads finish in
 * another order and at other times than on the plain store. */
typedef struct {
  SiftStore parent;
  SiftStore *inner;
  guint32 seed;
} SlowStore;

static gboolean
slow_write (SiftStore *store, gint64 id, const void *src, GError **error)
{
  SlowStore *s = (SlowStore *) store;
  return s->inner->klass->write (s->inner, id, src, error);
}

static gboolean
slow_read (SiftStore *store, gint64 id, gsize offset, void *dst, gsize n, GError **error)
{
  SlowStore *s = (SlowStore *) store;
  guint32 r = g_atomic_int_add ((gint *) &s->seed, 1) * 2654435761u;
  g_usleep ((r >> 24) % 3 == 0 ? (r >> 16) % 400 : 0);
  return s->inner->klass->read (s->inner, id, offset, dst, n, error);
}

static gboolean
slow_reserve (SiftStore *store, gint64 n, GError **error)
{
  SlowStore *s = (SlowStore *) store;
  return s->inner->klass->reserve (s->inner, n, error);
}

static void
slow_finalize (SiftStore *store)
{
  sift_store_free (((SlowStore *) store)->inner);
}

static const SiftStoreClass slow_class = { "slow", slow_write, slow_read, slow_reserve, slow_finalize };

static void
test_deterministic_timing (void **state)
{
  (void) state;
  SiftModelShape shape = { 2, 4, 2, 32, 16, 32, 0 };
  g_autoptr (GArray) first = NULL;
  for (int rep = 0; rep < 3; rep++)
    {
      g_autoptr (GError) error = NULL;
      SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
      SiftStore *store;
      if (rep == 0)
        store = sift_store_host_new (&sc, &error);
      else
        {
          SlowStore *s = (SlowStore *) sift_store_construct (sizeof (SlowStore), &slow_class, &sc, &error);
          s->inner = sift_store_host_new (&sc, &error);
          s->seed = (guint32) rep;
          store = &s->parent;
        }
      g_assert_no_error (error);
      SiftEngineConfig ec = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 3 };
      SiftEngine *engine = sift_engine_new (&ec, store, &error);
      sift_engine_set_force_copy (engine, TRUE); /* the plain store copies too */
      SiftModel *src = test_source_new (&shape, 8, SIFT_DTYPE_F32);
      SiftRunner *runner = sift_runner_new (engine, src, NULL, NULL, &error);
      TestChecker *check = test_checker_new (src, 300);
      sift_runner_set_observer (runner, &test_checker_observer, check);
      assert_true (sift_runner_prefill (runner, 180, NULL, NULL, &error));
      for (int i = 0; i < 40; i++)
        assert_true (sift_runner_decode (runner, 1, NULL, NULL, &error));
      g_assert_no_error (error);
      assert_true (check->max_err < 1e-5);
      if (first == NULL)
        first = g_array_ref (check->outputs);
      else
        {
          assert_int_equal (first->len, check->outputs->len);
          assert_memory_equal (first->data, check->outputs->data, first->len * sizeof (float));
        }
      test_checker_free (check);
      sift_runner_free (runner);
      sift_engine_free (engine);
      sift_model_free (src);
      sift_store_free (store);
    }
}

/* Stores that cannot map, and dtypes that differ, copy. */
static void
test_when_maps (void **state)
{
  (void) state;
  SiftModelShape shape = { 1, 2, 2, 32, 16, 32, 0 };
  g_autoptr (GError) error = NULL;
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F16, NULL);
  g_autoptr (SiftStore) host16 = sift_store_host_new (&sc, &error);
  SiftEngineConfig ec = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 2 };
  g_autoptr (SiftEngine) e1 = sift_engine_new (&ec, host16, &error);
  assert_false (sift_engine_maps (e1)); /* f16 stored, f32 compute: converted by the copy worker */
  ec.compute_dtype = SIFT_DTYPE_F16;
  g_autoptr (SiftEngine) e2 = sift_engine_new (&ec, host16, &error);
  assert_true (sift_engine_maps (e2));
  sift_engine_set_force_copy (e2, TRUE);
  assert_false (sift_engine_maps (e2));
  sift_engine_set_force_copy (e2, FALSE);
  assert_true (sift_engine_maps (e2));
  g_autofree char *path = test_tmp_path ("zerocopy");
  sc = test_store_config (&shape, SIFT_DTYPE_F16, path);
  g_autoptr (SiftStore) file = sift_store_file_new (&sc, &error);
  g_assert_no_error (error);
  g_autoptr (SiftEngine) e3 = sift_engine_new (&ec, file, &error);
  assert_false (sift_engine_maps (e3)); /* a file is read */
}

static void
copy_slot (SiftEngine *e, gint32 slot, guint8 *k_out, guint8 *v_out, gsize half)
{
  SiftView k, v;
  gint32 nv = 0;
  sift_engine_slot_kv (e, slot, &k, &v, &nv);
  assert_int_equal (nv, k.n_tokens);
  /* Slot views have the stored layout: a block's K (V) half is contiguous. */
  memcpy (k_out, k.data, half);
  memcpy (v_out, v.data, half);
}

/* A mapped slot keeps its block's bytes until slot_done while eviction
 * compacts the blocks in place (token granularity) or releases them
 * (block granularity), and the released ids are reused by new blocks. */
static void
test_mapped_slot_survives_eviction (void **state)
{
  (void) state;
  for (int gran = 0; gran < 2; gran++)
    {
      SiftModelShape shape = { 1, 2, 1, 16, 16, 16, 0 };
      Run r;
      /* Resident blocks are attended in place, leaving the ring slots to
       * the test. */
      run_open (&r, &shape, SIFT_DTYPE_F32, 2, SIFT_PIPELINE_RING, FALSE, 200);
      SiftEvictConfig ev = { 80, gran == 0 ? SIFT_EVICT_TOKEN : SIFT_EVICT_BLOCK, 4, 16 };
      g_autoptr (GError) error = NULL;
      assert_true (sift_engine_set_eviction (r.engine, &ev, &error));
      run_steps (&r, 64, 0);
      SiftEngine *e = r.engine;
      const gsize half = sift_store_block_bytes (r.store) / 2;
      g_autofree guint8 *k0 = g_malloc (half), *v0 = g_malloc (half), *k1 = g_malloc (half), *v1 = g_malloc (half);
      /* Block 1 (tokens 16..31) mapped into slot 0, block 2 into slot 1. */
      assert_true (sift_engine_load_block (e, 0, 1, 0, SIFT_LOAD_KV, &error));
      assert_true (sift_engine_load_block (e, 0, 2, 1, SIFT_LOAD_KV, &error));
      assert_true (sift_engine_wait_slot (e, 0, &error));
      assert_true (sift_engine_wait_slot (e, 1, &error));
      const gint64 id1 = g_array_index (e->store_ids[0], gint64, 1);
      assert_non_null (e->slots[0].map_k);
      assert_ptr_equal (e->slots[0].map_k, sift_store_map (r.store, id1));
      copy_slot (e, 0, k0, v0, half);
      copy_slot (e, 1, k1, v1, half);
      /* Decode past the capacity: eviction rewrites or drops blocks 1 and 2. */
      for (int i = 0; i < 40; i++)
        {
          sift_runner_decode (r.runner, 1, NULL, NULL, &error);
          g_assert_no_error (error);
        }
      SiftCounters c;
      sift_engine_counters (e, -1, SIFT_PHASE_DECODE, &c);
      assert_true (c.tokens_evicted > 0);
      /* Block id1 was rewritten in place (token granularity) or went back
       * to the store (block): reading it in place now would be wrong... */
      gboolean kept = FALSE;
      for (guint b = 0; b < e->store_ids[0]->len; b++)
        kept = kept || g_array_index (e->store_ids[0], gint64, b) == id1;
      if (gran == 0)
        assert_memory_not_equal (sift_store_map (r.store, id1), k0, half);
      else
        assert_false (kept);
      /* ...but the slots still hold what was loaded, now in their own memory. */
      assert_null (e->slots[0].map_k);
      /* Token granularity rewrote every block from the first victim on;
       * block granularity dropped block 1 only: slot 1 still reads block 2
       * in place, untouched. */
      if (gran == 0)
        assert_null (e->slots[1].map_k);
      else
        assert_non_null (e->slots[1].map_k);
      g_autofree guint8 *k = g_malloc (half), *v = g_malloc (half);
      copy_slot (e, 0, k, v, half);
      assert_memory_equal (k, k0, half);
      assert_memory_equal (v, v0, half);
      copy_slot (e, 1, k, v, half);
      assert_memory_equal (k, k1, half);
      assert_memory_equal (v, v1, half);
      sift_engine_slot_done (e, 0);
      sift_engine_slot_done (e, 1);
      /* Loads after that map again, the current bytes. */
      assert_true (sift_engine_load_block (e, 0, 1, 0, SIFT_LOAD_KV, &error));
      assert_true (sift_engine_wait_slot (e, 0, &error));
      assert_ptr_equal (e->slots[0].map_k, sift_store_map (r.store, g_array_index (e->store_ids[0], gint64, 1)));
      sift_engine_slot_done (e, 0);
      /* Reset with a mapped slot frees it. */
      assert_true (sift_engine_load_block (e, 0, 0, 1, SIFT_LOAD_K, &error));
      sift_runner_reset (r.runner);
      assert_null (e->slots[1].map_k);
      assert_true (sift_engine_load_block (e, 0, 0, 1, SIFT_LOAD_K, &error) == FALSE);
      g_clear_error (&error);
      run_close (&r);
    }
}

/* A mapped load waits for its block's store job (the queue orders copies;
 * a mapping bypasses it): reading right after offload sees the data. */
static void
test_mapped_load_after_store (void **state)
{
  (void) state;
  SiftModelShape shape = { 1, 2, 2, 32, 16, 16, 0 };
  for (int rep = 0; rep < 20; rep++)
    {
      Run r;
      run_open (&r, &shape, SIFT_DTYPE_F32, 2, SIFT_PIPELINE_RING, FALSE, 64);
      run_steps (&r, 48, 0);
      for (gint64 b = 0; b < 3; b++)
        {
          g_autoptr (GError) error = NULL;
          assert_true (sift_engine_load_block (r.engine, 0, b, 0, SIFT_LOAD_KV, &error));
          assert_true (sift_engine_wait_slot (r.engine, 0, &error));
          SiftView k;
          sift_engine_slot_kv (r.engine, 0, &k, NULL, NULL);
          for (gint32 t = 0; t < 16; t++)
            for (gint32 h = 0; h < 2; h++)
              assert_memory_equal (sift_view_row (&k, h, t), r.check->k[0] + ((b * 16 + t) * 2 + h) * 32,
                                   32 * sizeof (float));
          sift_engine_slot_done (r.engine, 0);
        }
      run_close (&r);
    }
}

/* ---- Randomized: any slots, block, chunk, store and dtype --------------- */

/* DESIGN.md: the engine's output matches the dense reference within 1e-5
 * relative for any slot count, block size, chunk size and store. Random
 * configurations, mapped and copied, host and file stores, in the stored
 * dtypes the compute dtype can hold exactly. */
static void
test_random_configs (void **state)
{
  (void) state;
  static const SiftDType pairs[][2] = { /* store, compute */
    { SIFT_DTYPE_F32, SIFT_DTYPE_F32 }, { SIFT_DTYPE_F16, SIFT_DTYPE_F16 }, { SIFT_DTYPE_BF16, SIFT_DTYPE_BF16 },
    { SIFT_DTYPE_F16, SIFT_DTYPE_F32 }, { SIFT_DTYPE_BF16, SIFT_DTYPE_F32 }, { SIFT_DTYPE_F32, SIFT_DTYPE_F16 },
  };
  g_autoptr (GRand) rng = g_rand_new_with_seed (2024);
  for (int it = 0; it < 64; it++)
    {
      const gint32 kv = g_rand_int_range (rng, 1, 3), group = 1 << g_rand_int_range (rng, 0, 3);
      const gint32 bs = 4 << g_rand_int_range (rng, 0, 3);
      SiftModelShape shape = { g_rand_int_range (rng, 1, 3), kv * group, kv, 16 << g_rand_int_range (rng, 0, 2), bs,
                               bs * g_rand_int_range (rng, 1, 4), 0 };
      const gint32 slots = g_rand_int_range (rng, 2, 7);
      const SiftDType *dt = pairs[g_rand_int_range (rng, 0, G_N_ELEMENTS (pairs))];
      const gboolean file = g_rand_boolean (rng), copy = g_rand_boolean (rng);
      const SiftPipeline pipe = g_rand_boolean (rng) ? SIFT_PIPELINE_CROSS_LAYER : SIFT_PIPELINE_RING;
      const gint64 prompt = g_rand_int_range (rng, 1, 9 * bs);
      const gint32 steps = g_rand_int_range (rng, 1, 12);
      gint32 rows[12];
      gint64 n_tokens = prompt;
      for (gint32 i = 0; i < steps; i++)
        n_tokens += rows[i] = g_rand_int_range (rng, 1, SIFT_ATTN_DECODE_MAX_ROWS + 1);

      g_autoptr (GError) error = NULL;
      if (g_getenv ("TEST_VERBOSE"))
        g_printerr ("case %d: %d layers %d/%d heads dim %d block %d chunk %d slots %d %s %s->%s %s %s prompt %" G_GINT64_FORMAT " steps %d\n",
                    it, shape.n_layers, shape.n_q_heads, kv, shape.head_dim, bs, shape.chunk_size, slots, file ? "file" : "host",
                    sift_dtype_name (dt[0]), sift_dtype_name (dt[1]), copy ? "copy" : "map", pipe ? "xl" : "ring", prompt, steps);
      g_autofree char *path = file ? test_tmp_path ("random") : NULL;
      SiftStoreConfig sc = test_store_config (&shape, dt[0], path);
      g_autoptr (SiftStore) store = file ? sift_store_file_new (&sc, &error) : sift_store_host_new (&sc, &error);
      g_assert_no_error (error);
      SiftEngineConfig ec = { .shape = shape, .compute_dtype = dt[1], .n_slots = slots, .pipeline = pipe };
      g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
      g_assert_no_error (error);
      sift_engine_set_force_copy (engine, copy);
      g_autoptr (SiftModel) src = test_source_new (&shape, (guint64) it + 1,
                                                        dt[0] != SIFT_DTYPE_F32 ? dt[0] : dt[1]);
      g_autoptr (SiftRunner) runner = sift_runner_new (engine, src, NULL, NULL, &error);
      g_assert_no_error (error);
      TestChecker *check = test_checker_new (src, n_tokens);
      sift_runner_set_observer (runner, &test_checker_observer, check);
      assert_true (sift_runner_prefill (runner, prompt, NULL, NULL, &error));
      for (gint32 i = 0; i < steps && error == NULL; i++)
        sift_runner_decode (runner, rows[i], NULL, NULL, &error);
      g_assert_no_error (error);
      if (!(check->max_err < 1e-5 && check->max_lse_err < 1e-5 && check->calls > 0))
        fail_msg ("case %d: %d layers, %d/%d heads, dim %d, block %d, chunk %d, %d slots, %s store %s -> %s, %s, %s: "
                  "error %g, lse %g, %" G_GINT64_FORMAT " calls", it, shape.n_layers, shape.n_q_heads, kv,
                  shape.head_dim, bs, shape.chunk_size, slots, file ? "file" : "host", sift_dtype_name (dt[0]),
                  sift_dtype_name (dt[1]), copy ? "copied" : "maps", pipe ? "cross-layer" : "ring", check->max_err,
                  check->max_lse_err, check->calls);
      test_checker_free (check);
    }
}

/* ---- Engines sharing a store ------------------------------------------- */

/* DESIGN.md lets engines share a store. Two engines on one host store take
 * turns (their copy workers store while the other engine attends), both
 * reading in place; one evicts (compacting and releasing blocks whose ids
 * the other's new blocks then take). The one without eviction still
 * matches the dense reference. (One calling thread: GLib 2.74's GSlice
 * moves memory between threads unseen by ThreadSanitizer, false races.) */
static void
test_shared_store (void **state)
{
  (void) state;
  for (int gran = 0; gran < 2; gran++)
    {
      SiftModelShape shape = { 2, 4, 2, 16, 8, 16, 0 };
      g_autoptr (GError) error = NULL;
      SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
      g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
      SiftEngineConfig ec = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 3 };
      SiftEngine *a = sift_engine_new (&ec, store, &error), *b = sift_engine_new (&ec, store, &error);
      g_assert_no_error (error);
      SiftEvictConfig ev = { 48, gran == 0 ? SIFT_EVICT_TOKEN : SIFT_EVICT_BLOCK, 4, 16 };
      assert_true (sift_engine_set_eviction (b, &ev, &error));
      assert_true (sift_engine_maps (a) && sift_engine_maps (b));
      SiftModel *sa = test_source_new (&shape, 3, SIFT_DTYPE_F32), *sb = test_source_new (&shape, 4, SIFT_DTYPE_F32);
      SiftRunner *ra = sift_runner_new (a, sa, NULL, NULL, &error), *rb = sift_runner_new (b, sb, NULL, NULL, &error);
      g_assert_no_error (error);
      TestChecker *check = test_checker_new (sa, 37 + 60 * 5);
      sift_runner_set_observer (ra, &test_checker_observer, check);
      assert_true (sift_runner_prefill (ra, 37, NULL, NULL, &error) && sift_runner_prefill (rb, 45, NULL, NULL, &error));
      for (gint32 i = 0; i < 60 && error == NULL; i++)
        assert_true (sift_runner_decode (ra, i % 3 == 2 ? 5 : 1, NULL, NULL, &error)
                     && sift_runner_decode (rb, i % 4 == 1 ? 5 : 1, NULL, NULL, &error));
      g_assert_no_error (error);
      SiftCounters c;
      sift_engine_counters (b, -1, SIFT_PHASE_DECODE, &c);
      assert_true (c.tokens_evicted > 0);
      if (!(check->max_err < 1e-5 && check->calls > 0))
        fail_msg ("engine beside an evicting one on a shared store: error %g", check->max_err);
      test_checker_free (check);
      sift_runner_free (ra);
      sift_runner_free (rb);
      sift_engine_free (a);
      sift_engine_free (b);
      sift_model_free (sa);
      sift_model_free (sb);
      assert_int_equal (sift_store_blocks_in_use (store), 0);
    }
}

/* A load mapped after a store failed reports the store's error (the block
 * may never have been written), and so does the next decode step. No
 * store that maps can fail a write, so the failure is set by hand. */
static void
test_mapped_after_failed_store (void **state)
{
  (void) state;
  SiftModelShape shape = { 1, 2, 2, 32, 16, 16, 0 };
  Run r;
  run_open (&r, &shape, SIFT_DTYPE_F32, 2, SIFT_PIPELINE_RING, FALSE, 64);
  run_steps (&r, 48, 0);
  g_autoptr (GError) error = NULL;
  assert_true (sift_engine_sync (r.engine, &error));
  r.engine->store_error = g_error_new_literal (SIFT_STORE_ERROR, SIFT_STORE_ERROR_IO, "injected: store failed");
  assert_true (sift_engine_load_block (r.engine, 0, 1, 0, SIFT_LOAD_KV, &error));
  assert_false (sift_engine_wait_slot (r.engine, 0, &error));
  assert_non_null (strstr (error->message, "injected"));
  g_clear_error (&error);
  /* The slot is free again. */
  assert_true (sift_engine_load_block (r.engine, 0, 1, 0, SIFT_LOAD_KV, &error));
  assert_false (sift_engine_wait_slot (r.engine, 0, &error));
  g_clear_error (&error);
  assert_false (sift_runner_decode (r.runner, 1, NULL, NULL, &error));
  assert_non_null (strstr (error->message, "injected"));
  sift_runner_reset (r.runner);
  run_close (&r);
}

/* offload.force_copy reaches the config. */
static void
test_config_force_copy (void **state)
{
  (void) state;
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) d = sift_config_load_string ("a.yaml", "kv:\n  block_size: 64\n", NULL, &error);
  g_assert_no_error (error);
  assert_false (sift_offload_config (d)->force_copy);
  g_autoptr (SiftConfig) c = sift_config_load_string ("b.yaml", "offload:\n  force_copy: true\n", NULL, &error);
  g_assert_no_error (error);
  assert_true (sift_offload_config (c)->force_copy);
  g_autoptr (SiftConfig) bad = sift_config_load_string ("c.yaml", "offload:\n  force_copy: 3\n", NULL, &error);
  assert_null (bad);
  assert_non_null (error);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_mapped_equals_copied),
    cmocka_unit_test (test_when_maps),
    cmocka_unit_test (test_batched_equals_per_block),
    cmocka_unit_test (test_batched_late_heads),
    cmocka_unit_test (test_deterministic_timing),
    cmocka_unit_test (test_mapped_slot_survives_eviction),
    cmocka_unit_test (test_mapped_load_after_store),
    cmocka_unit_test (test_config_force_copy),
    cmocka_unit_test (test_random_configs),
    cmocka_unit_test (test_shared_store),
    cmocka_unit_test (test_mapped_after_failed_store),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
