/* Policies through the engine: select_blocks answers are validated (bad
 * ids are SIFT_ENGINE_ERROR_SELECTION naming the policy, never a read out of
 * bounds); per-head selections are honoured in compute; offload hooks see
 * each block before it is stored; a policy's own compute can call the
 * default pipeline with its own selection. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "helpers.h"

typedef enum {
  MODE_OUT_OF_RANGE,
  MODE_NEGATIVE,
  MODE_DUPLICATE,
  MODE_BAD_HEAD,
  MODE_FAIL,
  MODE_PER_Q_HEAD,  /* block b for q head h iff (b + h) % 3 != 0 */
  MODE_PER_KV_HEAD, /* block b for the group of kv head g iff (b + g) % 2 == 0 */
  MODE_MIXED,       /* block b for every head unless b % 3 == 2, then for even q heads only */
} Mode;

typedef struct {
  SiftPolicy parent;
  Mode mode;
  gint64 selects, prefill_offloads, decode_offloads;
  gint64 next_first_token;
  float *src_k;        /* layer 0 keys [tokens][kv_heads][dim] to compare offloaded blocks with */
} TestPolicy;

static gboolean
keep_q (gint64 b, gint32 h, gpointer data)
{
  (void) data;
  return (b + h) % 3 != 0;
}

static gboolean
keep_kv (gint64 b, gint32 h, gpointer data)
{
  const SiftModelShape *s = data;
  return (b + h / (s->n_q_heads / s->n_kv_heads)) % 2 == 0;
}

static gboolean
keep_mixed (gint64 b, gint32 h, gpointer data)
{
  (void) data;
  return b % 3 != 2 || h % 2 == 0;
}

static gboolean
test_select (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *avail, gsize n, SiftSelection *sel,
             GError **error)
{
  TestPolicy *p = (TestPolicy *) self;
  const SiftModelShape *s = ctx->shape;
  p->selects++;
  for (gsize i = 0; i < n; i++)
    assert_int_equal (avail[i], (gint64) i);
  switch (p->mode)
    {
    case MODE_OUT_OF_RANGE:
      sift_selection_add (sel, (gint64) n);
      break;
    case MODE_NEGATIVE:
      sift_selection_add (sel, -1);
      break;
    case MODE_DUPLICATE:
      if (n > 0)
        {
          sift_selection_add_q_head (sel, avail[0], 1);
          sift_selection_add (sel, avail[0]);
        }
      break;
    case MODE_BAD_HEAD:
      if (n > 0)
        sift_selection_add_q_head (sel, avail[0], s->n_q_heads);
      break;
    case MODE_FAIL:
      g_set_error_literal (error, G_FILE_ERROR, G_FILE_ERROR_FAILED, "the test policy refuses");
      return FALSE;
    case MODE_PER_Q_HEAD:
      for (gsize i = 0; i < n; i++)
        for (gint32 h = 0; h < s->n_q_heads; h++)
          if (keep_q (avail[i], h, NULL))
            sift_selection_add_q_head (sel, avail[i], h);
      break;
    case MODE_PER_KV_HEAD:
      for (gsize i = 0; i < n; i++)
        for (gint32 g = 0; g < s->n_kv_heads; g++)
          if ((avail[i] + g) % 2 == 0)
            sift_selection_add_kv_head (sel, avail[i], g);
      break;
    case MODE_MIXED:
      for (gsize i = 0; i < n; i++)
        for (gint32 h = 0; h < s->n_q_heads; h++)
          if (keep_mixed (avail[i], h, NULL))
            sift_selection_add_q_head (sel, avail[i], h);
      break;
    }
  return TRUE;
}

/* Checks the offloaded block against the source's keys. */
static gboolean
test_offload (SiftPolicy *self, const SiftPolicyContext *ctx, const SiftBlockInfo *b, GError **error)
{
  (void) error;
  TestPolicy *p = (TestPolicy *) self;
  /* ABI 2.0: the host says how large the structs it filled are, and the
   * views it hands a policy are host memory. */
  assert_int_equal (ctx->struct_size, sizeof (SiftPolicyContext));
  assert_int_equal (b->struct_size, sizeof (SiftBlockInfo));
  assert_true (SIFT_STRUCT_HAS (ctx, SiftPolicyContext, engine));
  assert_true (b->k.space == SIFT_MEMORY_HOST && b->v.space == SIFT_MEMORY_HOST && ctx->q.space == SIFT_MEMORY_HOST);
  if (ctx->phase == SIFT_PHASE_PREFILL)
    p->prefill_offloads++;
  else
    p->decode_offloads++;
  assert_int_equal (b->block_id, ctx->n_blocks + (b->meta->first_token - ctx->kv_len) / ctx->block_size);
  if (ctx->layer == 0 && p->src_k != NULL)
    {
      assert_int_equal (b->meta->first_token, p->next_first_token);
      p->next_first_token += b->meta->n_valid;
      float row[64];
      for (gint32 t = 0; t < b->meta->n_valid; t++)
        for (gint32 h = 0; h < b->k.n_heads; h++)
          {
            sift_view_row_to_f32 (&b->k, h, t, row);
            assert_memory_equal (row, p->src_k + ((b->meta->first_token + t) * b->k.n_heads + h) * b->k.head_dim,
                                 sizeof (float) * (gsize) b->k.head_dim);
          }
    }
  return TRUE;
}

/* Own compute: the default pipeline over blocks of an even id only. */
static gboolean
test_compute (SiftPolicy *self, const SiftPolicyContext *ctx, SiftView *out, float *lse, GError **error)
{
  (void) self;
  g_autoptr (SiftSelection) sel = sift_selection_new (ctx->shape->n_q_heads, ctx->shape->n_kv_heads);
  for (gint64 b = 0; b < ctx->n_blocks; b += 2)
    sift_selection_add (sel, b);
  return sift_engine_attend_default (ctx->engine, ctx, sel, out, lse, error);
}

static gboolean
keep_even (gint64 b, gint32 h, gpointer data)
{
  (void) h, (void) data;
  return b % 2 == 0;
}

static SiftPolicyOps select_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "test-select",
  .version = "1",
  .description = "selects by a rule",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .instance_size = sizeof (TestPolicy),
  .select_blocks = test_select,
  .on_prefill_offload = test_offload,
  .on_decode_offload = test_offload,
};

static SiftPolicyOps compute_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "test-compute",
  .version = "1",
  .description = "own compute over even blocks",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE,
  .instance_size = sizeof (TestPolicy),
  .compute_chunked_prefill = test_compute,
  .compute_chunked_decode = test_compute,
};

static SiftPolicyOps prefill_only_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "test-prefill-only",
  .version = "1",
  .description = "prefill only",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL,
  .instance_size = sizeof (TestPolicy),
};

typedef struct {
  SiftModelShape shape;
  SiftStore *store;
  SiftEngine *engine;
  SiftModel *src;
  TestPolicy *policy;
  SiftRunner *runner;
  TestChecker *check;
} Fix;

/* Ring slots of the next fix_open. */
static gint32 fix_slots = 3;

static void
fix_open (Fix *f, const SiftPolicyOps *ops, Mode mode, SiftPipeline pipe, gint32 q_heads, gint32 kv_heads,
          gint64 n_tokens)
{
  memset (f, 0, sizeof *f);
  f->shape = (SiftModelShape) { 2, q_heads, kv_heads, 32, 16, 32, 0 };
  g_autoptr (GError) error = NULL;
  SiftStoreConfig sc = test_store_config (&f->shape, SIFT_DTYPE_F32, NULL);
  f->store = sift_store_host_new (&sc, &error);
  SiftEngineConfig ec = { f->shape, SIFT_DTYPE_F32, fix_slots, pipe, 0, SIFT_DEVICE_CPU };
  f->engine = sift_engine_new (&ec, f->store, &error);
  g_assert_no_error (error);
  /* Resident blocks skip the cross-layer pipeline: copy to exercise it. */
  sift_engine_set_force_copy (f->engine, pipe == SIFT_PIPELINE_CROSS_LAYER);
  f->src = test_source_new (&f->shape, 77, SIFT_DTYPE_F32);
  f->policy = (TestPolicy *) sift_policy_new (ops, NULL, &f->shape, &error);
  g_assert_no_error (error);
  f->policy->mode = mode;
  SiftPolicy *per[2] = { &f->policy->parent, &f->policy->parent };
  f->runner = sift_runner_new (f->engine, f->src, per, per, &error);
  g_assert_no_error (error);
  f->check = test_checker_new (f->src, n_tokens);
  f->policy->src_k = f->check->k[0];
  sift_runner_set_observer (f->runner, &test_checker_observer, f->check);
}

static void
fix_close (Fix *f)
{
  test_checker_free (f->check);
  sift_runner_free (f->runner);
  sift_policy_free (&f->policy->parent);
  sift_engine_free (f->engine);
  sift_model_free (f->src);
  sift_store_free (f->store);
}

static void
test_bad_selections (void **state)
{
  (void) state;
  const struct { Mode mode; const char *says; } bad[] = {
    { MODE_OUT_OF_RANGE, "not among the" },
    { MODE_NEGATIVE, "block -1" },
    { MODE_DUPLICATE, "twice" },
    { MODE_BAD_HEAD, "query heads" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    for (int pipe = 0; pipe < 2; pipe++)
      {
        Fix f;
        fix_open (&f, &select_ops, bad[i].mode, (SiftPipeline) pipe, 4, 2, 200);
        g_autoptr (GError) error = NULL;
        /* The first chunk has no stored block: only out-of-range ids fail there. */
        gboolean ok = sift_runner_prefill (f.runner, 100, NULL, NULL, &error);
        assert_false (ok);
        assert_non_null (error);
        assert_true (error->domain == SIFT_ENGINE_ERROR);
        assert_int_equal (error->code, SIFT_ENGINE_ERROR_SELECTION);
        assert_non_null (strstr (error->message, "'test-select'"));
        assert_non_null (strstr (error->message, bad[i].says));
        fix_close (&f);
      }
  Fix f;
  fix_open (&f, &select_ops, MODE_FAIL, SIFT_PIPELINE_RING, 4, 2, 200);
  g_autoptr (GError) error = NULL;
  assert_false (sift_runner_prefill (f.runner, 100, NULL, NULL, &error));
  assert_int_equal (error->code, SIFT_ENGINE_ERROR_POLICY);
  assert_non_null (strstr (error->message, "the test policy refuses"));
  fix_close (&f);
}

static void
test_per_head_selection (void **state)
{
  (void) state;
  for (int pipe = 0; pipe < 2; pipe++)
    for (int kv = 0; kv < 2; kv++)
      {
        Fix f;
        const gint64 prompt = 150, steps = 55;
        fix_open (&f, &select_ops, kv ? MODE_PER_KV_HEAD : MODE_PER_Q_HEAD, (SiftPipeline) pipe, 6, kv ? 3 : 2,
                  prompt + steps);
        f.check->keep = kv ? keep_kv : keep_q;
        f.check->keep_data = &f.shape;
        f.check->prompt = prompt;
        g_autoptr (GError) error = NULL;
        assert_true (sift_runner_prefill (f.runner, prompt, NULL, NULL, &error));
        for (gint64 i = 0; i < steps; i++)
          assert_true (sift_runner_decode (f.runner, 1, NULL, NULL, &error));
        g_assert_no_error (error);
        if (f.check->max_err > 1e-5 || f.check->max_lse_err > 1e-5)
          fail_msg ("per-%s-head selection, %s: error %g, lse %g", kv ? "kv" : "q", pipe ? "cross-layer" : "ring",
                    f.check->max_err, f.check->max_lse_err);
        /* Fewer tokens attended than available. */
        SiftCounters c;
        sift_engine_counters (f.engine, -1, SIFT_PHASE_DECODE, &c);
        assert_true (c.tokens_attended < c.tokens_available);
        assert_true (c.tokens_attended > c.tokens_available / 4);
        assert_int_equal (f.policy->selects, ((prompt + 31) / 32 + steps) * 2);
        /* Every block was seen by an offload hook in each layer. */
        assert_int_equal (f.policy->prefill_offloads, (prompt + 15) / 16 * 2);
        assert_int_equal (f.policy->decode_offloads, (prompt + steps) / 16 * 2 - prompt / 16 * 2);
        fix_close (&f);
      }
}

/* Blocks every head selected, then one that some heads did not: a kernel
 * call over the first ones covers every head, after it the heads go their
 * own ways (the batch learns per-head flags late). Read in place, copied
 * through the ring (6 slots: groups of 3 blocks, 0 1 2 | 3 4 5 ..., and
 * groups of one block) and through the cross-layer buffer; 1 and 4 rows a
 * step. */
static void
test_mixed_selection (void **state)
{
  (void) state;
  for (int variant = 0; variant < 4; variant++)
    for (gint32 rows = 1; rows <= 4; rows += 3)
      {
        Fix f;
        const gint64 prompt = 150, steps = 36;
        SiftPipeline pipe = variant == 2 ? SIFT_PIPELINE_CROSS_LAYER : SIFT_PIPELINE_RING;
        fix_slots = 6;
        fix_open (&f, &select_ops, MODE_MIXED, pipe, 4, 2, prompt + steps * rows);
        fix_slots = 3;
        if (variant == 1 || variant == 3)
          sift_engine_set_force_copy (f.engine, TRUE);
        if (variant == 1 || variant == 3)
          sift_engine_set_ring_group (f.engine, variant == 1 ? 3 : 1);
        f.check->keep = keep_mixed;
        f.check->prompt = prompt;
        g_autoptr (GError) error = NULL;
        assert_true (sift_runner_prefill (f.runner, prompt, NULL, NULL, &error));
        for (gint64 i = 0; i < steps; i++)
          assert_true (sift_runner_decode (f.runner, rows, NULL, NULL, &error));
        g_assert_no_error (error);
        if (f.check->max_err > 1e-5 || f.check->max_lse_err > 1e-5)
          fail_msg ("mixed selection, %s, %d rows: error %g, lse %g",
                    variant == 0 ? "resident" : variant == 1 ? "ring copies" : "cross-layer", rows, f.check->max_err,
                    f.check->max_lse_err);
        SiftCounters c;
        sift_engine_counters (f.engine, -1, SIFT_PHASE_DECODE, &c);
        assert_true (c.tokens_attended < c.tokens_available);
        assert_true (c.bytes_mapped == (variant == 0 ? c.bytes_loaded : 0));
        fix_close (&f);
      }
}

/* A decode policy sees the prompt's blocks through on_prefill_offload even
 * when another policy (here dense, NULL) runs the prefill; a policy in both
 * phases is called once per block, two instances once each. */
static void
test_hooks_reach_every_layer_policy (void **state)
{
  (void) state;
  const gint64 prompt = 150, steps = 40;
  for (int both = 0; both < 2; both++)
    {
      Fix f;
      fix_open (&f, &select_ops, MODE_PER_Q_HEAD, SIFT_PIPELINE_RING, 4, 2, prompt + steps);
      sift_runner_free (f.runner);
      g_autoptr (GError) error = NULL;
      TestPolicy *pre = both ? (TestPolicy *) sift_policy_new (&select_ops, NULL, &f.shape, &error) : NULL;
      g_assert_no_error (error);
      if (pre != NULL)
        pre->mode = MODE_PER_Q_HEAD;
      SiftPolicy *prefill[2] = { pre ? &pre->parent : NULL, pre ? &pre->parent : NULL };
      SiftPolicy *decode[2] = { &f.policy->parent, &f.policy->parent };
      f.runner = sift_runner_new (f.engine, f.src, prefill, decode, &error);
      g_assert_no_error (error);
      assert_true (sift_runner_prefill (f.runner, prompt, NULL, NULL, &error));
      for (gint64 i = 0; i < steps; i++)
        assert_true (sift_runner_decode (f.runner, 1, NULL, NULL, &error));
      g_assert_no_error (error);
      const gint64 prompt_blocks = (prompt + 15) / 16 * 2; /* two layers */
      const gint64 decode_blocks = (prompt + steps) / 16 * 2 - prompt / 16 * 2;
      assert_int_equal (f.policy->prefill_offloads, prompt_blocks);
      assert_int_equal (f.policy->decode_offloads, decode_blocks);
      if (pre != NULL)
        {
          assert_int_equal (pre->prefill_offloads, prompt_blocks);
          assert_int_equal (pre->decode_offloads, decode_blocks);
          sift_runner_free (f.runner);
          f.runner = NULL;
          sift_policy_free (&pre->parent);
        }
      fix_close (&f);
    }
}

static void
test_own_compute (void **state)
{
  (void) state;
  for (int pipe = 0; pipe < 2; pipe++)
    {
      Fix f;
      fix_open (&f, &compute_ops, 0, (SiftPipeline) pipe, 4, 2, 250);
      f.check->keep = keep_even;
      f.check->prompt = 190;
      g_autoptr (GError) error = NULL;
      assert_true (sift_runner_prefill (f.runner, 190, NULL, NULL, &error));
      for (int i = 0; i < 60; i++)
        assert_true (sift_runner_decode (f.runner, 1, NULL, NULL, &error));
      g_assert_no_error (error);
      assert_true (f.check->max_err < 1e-5);
      /* attend_default counted what it attended: about half the stored blocks. */
      SiftCounters c;
      sift_engine_counters (f.engine, -1, SIFT_PHASE_PREFILL, &c);
      assert_true (c.tokens_attended < c.tokens_available && c.tokens_attended > c.tokens_available / 3);
      /* A policy reporting its own count adds to it. */
      SiftPolicyContext ctx = { .phase = SIFT_PHASE_PREFILL, .layer = 1 };
      sift_engine_count_attended (f.engine, &ctx, 1000);
      SiftCounters c2;
      sift_engine_counters (f.engine, -1, SIFT_PHASE_PREFILL, &c2);
      assert_int_equal (c2.tokens_attended, c.tokens_attended + 1000);
      fix_close (&f);
    }
}

/* The ring's group size: when a block's attention stays on the calling
 * thread (SIFT_ATTN_SERIAL_WORK), as few blocks as give a call 2^18 of work
 * (at most half the slots); half the slots when the kernels wake their
 * threads anyway; a fixed size overrides it. */
static void
test_ring_group_choice (void **state)
{
  (void) state;
  const struct { gint32 q_heads, kv_heads, head_dim, block, rows, slots, want; } cases[] = {
    { 4, 1, 64, 128, 1, 4, 2 },      /* 32K of work a block: 8 wanted, half the slots at most */
    { 8, 2, 128, 128, 1, 8, 2 },     /* 128K: 2 */
    { 8, 2, 128, 64, 1, 8, 4 },      /* 64K: 4 */
    { 8, 2, 128, 128, 4, 4, 1 },     /* 512K: 1 */
    { 8, 2, 128, 128, 8, 4, 2 },     /* exactly 2^20: threaded */
    { 8, 2, 128, 128, 16, 8, 4 },
    { 32, 8, 128, 128, 128, 6, 3 },  /* a prefill chunk */
    { 32, 8, 128, 128, 128, 2, 1 },  /* two slots: groups of one either way */
  };
  for (gsize c = 0; c < G_N_ELEMENTS (cases); c++)
    {
      SiftModelShape shape = { 1, cases[c].q_heads, cases[c].kv_heads, cases[c].head_dim, cases[c].block,
                               cases[c].block, 0 };
      g_autoptr (GError) error = NULL;
      SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
      g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
      SiftEngineConfig ec = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = cases[c].slots };
      g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
      g_assert_no_error (error);
      assert_int_equal (sift_engine_ring_group (engine, cases[c].rows), cases[c].want);
      sift_engine_set_ring_group (engine, 2);
      assert_int_equal (sift_engine_ring_group (engine, cases[c].rows), MIN (2, cases[c].slots));
      sift_engine_set_ring_group (engine, 0);
      assert_int_equal (sift_engine_ring_group (engine, cases[c].rows), cases[c].want);
    }
}

static void
test_phase_support (void **state)
{
  (void) state;
  SiftModelShape shape = { 1, 2, 2, 32, 16, 32, 0 };
  g_autoptr (GError) error = NULL;
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
  SiftEngineConfig ec = { shape, SIFT_DTYPE_F32, 2, SIFT_PIPELINE_RING, 0, SIFT_DEVICE_CPU };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
  g_autoptr (SiftModel) src = sift_model_random_new (&shape, 1);
  g_autoptr (SiftPolicy) p = sift_policy_new (&prefill_only_ops, NULL, &shape, &error);
  SiftPolicy *per[1] = { p };
  assert_null (sift_runner_new (engine, src, per, per, &error));
  assert_int_equal (error->code, SIFT_ENGINE_ERROR_INVALID);
  assert_non_null (strstr (error->message, "does not support decode"));
  g_clear_error (&error);
  SiftRunner *r = sift_runner_new (engine, src, per, NULL, &error);
  g_assert_no_error (error);
  sift_runner_free (r);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_bad_selections),
    cmocka_unit_test (test_per_head_selection),
    cmocka_unit_test (test_mixed_selection),
    cmocka_unit_test (test_hooks_reach_every_layer_policy),
    cmocka_unit_test (test_own_compute),
    cmocka_unit_test (test_phase_support),
    cmocka_unit_test (test_ring_group_choice),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
