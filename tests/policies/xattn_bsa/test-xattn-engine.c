/* xattn_bsa end to end through the real OffloadEngine and runner: with
 * threshold 1 the output equals dense attention bit for bit; with a low
 * threshold every attention call equals a reference that attends, per
 * head and per query row, exactly the stored blocks the policy's plan gave
 * that row's query block and head (plus the chunk, causally). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "xattn-bsa-private.h"

/* The plugin's methods in a table without init (the parameter parsing in
 * xattn-bsa.c belongs to the registry's tests); xattn_bsa_configure does
 * what init would. */
static const SiftPolicyOps test_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "xattn_bsa",
  .version = "test",
  .description = "xattn_bsa methods without parameter parsing",
  XATTN_BSA_OPS_METHODS,
};

static const SiftModelShape shape = {
  .n_layers = 2, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 32, .block_size = 16, .chunk_size = 64,
  .scale = 0.0f,
};
#define N_TOKENS 360

typedef struct {
  SiftModel *src;
  SiftPolicy *policy[2];     /* per layer; NULL: dense */
  GArray *outputs;           /* every output float, in call order */
  double max_err;            /* against the plan's reference */
  gint64 checked_calls, sparse_calls;
} Run;

/* The reference for one attention call: per head and row, the stored
 * blocks the plan gives the row's query block (all when the plan is dense),
 * then the chunk up to the row. */
static void
check_call (Run *run, const SiftPolicyContext *ctx, const SiftView *out)
{
  const XattnBsa *self = (const XattnBsa *) run->policy[ctx->layer];
  const gint32 H = shape.n_q_heads, KV = shape.n_kv_heads, d = shape.head_dim, bs = shape.block_size;
  const gint64 end = ctx->q_pos + ctx->n_q;
  g_autofree float *q = g_new (float, (gsize) end * (gsize) H * (gsize) d);
  g_autofree float *k = g_new (float, (gsize) end * (gsize) KV * (gsize) d);
  g_autofree float *v = g_new (float, (gsize) end * (gsize) KV * (gsize) d);
  assert_true (sift_model_qkv_at (run->src, ctx->layer, 0, end, q, k, v, NULL));
  SiftView qv = sift_view_thd (q, SIFT_DTYPE_F32, end, H, d);
  SiftView kv = sift_view_thd (k, SIFT_DTYPE_F32, end, KV, d);
  SiftView vv = sift_view_thd (v, SIFT_DTYPE_F32, end, KV, d);
  const gboolean sparse = self->plan_state == XATTN_PLAN_SPARSE;
  run->sparse_calls += sparse;
  g_autofree gint64 *rows = g_new (gint64, (gsize) end);
  float o[64], lse;
  for (gint32 h = 0; h < H; h++)
    for (gint64 t = 0; t < ctx->n_q; t++)
      {
        gint64 pos = ctx->q_pos + t;
        gsize n = 0;
        for (gint64 b = 0; b < ctx->kv_len / bs; b++)
          {
            gboolean keep = TRUE;
            if (sparse)
              {
                gint64 qb = pos / self->geo.block - self->plan_qb0;
                const guint8 *a = self->granularity == XATTN_GRANULARITY_CHUNK
                                    ? self->plan.attend
                                    : self->plan.qb_attend + (gsize) qb * (gsize) H * (gsize) self->plan.n;
                keep = a[(gsize) h * (gsize) self->plan.n + (gsize) b];
              }
            for (gint64 j = 0; keep && j < bs; j++)
              rows[n++] = b * bs + j;
          }
        for (gint64 j = ctx->kv_len; j <= pos; j++)
          rows[n++] = j;
        SiftView qh = sift_view_tokens (&qv, pos, 1);
        qh = sift_view_heads (&qh, h, 1);
        SiftView kh = sift_view_heads (&kv, h / (H / KV), 1), vh = sift_view_heads (&vv, h / (H / KV), 1);
        SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, 1, 1, d);
        SiftAttnOpts opts = { 0.0f, FALSE, 0 };
        assert_true (sift_attn_gather (&qh, &kh, &vh, rows, n, &opts, &ov, &lse, NULL));
        const float *got = sift_view_row (out, h, t);
        for (gint32 i = 0; i < d; i++)
          run->max_err = MAX (run->max_err, fabs (got[i] - o[i]) / MAX (fabs (o[i]), 1e-2));
      }
  run->checked_calls++;
}

static void
on_attention (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  (void) lse;
  Run *run = user_data;
  if (ctx->phase != SIFT_PHASE_PREFILL)
    return;
  for (gint32 h = 0; h < out->n_heads; h++)
    for (gint64 t = 0; t < out->n_tokens; t++)
      g_array_append_vals (run->outputs, sift_view_row (out, h, t), (guint) out->head_dim);
  if (run->policy[ctx->layer] != NULL)
    check_call (run, ctx, out);
}

static const SiftRunnerObserver observer = { .attention = on_attention };

/* Prefills N_TOKENS with xattn_bsa configured by cfg (NULL: dense). */
static Run *
run_prefill (const XattnBsaConfig *cfg)
{
  Run *run = g_new0 (Run, 1);
  run->outputs = g_array_new (FALSE, FALSE, sizeof (float));
  run->src = sift_model_random_new (&shape, 5);
  g_autoptr (GError) error = NULL;
  SiftStoreConfig sc = { .dtype = SIFT_DTYPE_F32, .n_kv_heads = shape.n_kv_heads, .block_size = shape.block_size,
                         .head_dim = shape.head_dim };
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
  assert_non_null (store);
  SiftEngineConfig ec = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 3,
                          .pipeline = SIFT_PIPELINE_RING };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
  assert_non_null (engine);
  SiftPolicy *decode[2] = { NULL, NULL };
  for (gint32 l = 0; l < 2 && cfg != NULL; l++)
    {
      run->policy[l] = sift_policy_new (&test_ops, NULL, &shape, &error);
      assert_non_null (run->policy[l]);
      assert_true (xattn_bsa_configure (run->policy[l], cfg, &error));
    }
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, run->src, run->policy, decode, &error);
  assert_non_null (runner);
  sift_runner_set_observer (runner, &observer, run);
  if (!sift_runner_prefill (runner, N_TOKENS, NULL, NULL, &error))
    fail_msg ("prefill: %s", error->message);
  return run;
}

static void
run_free (Run *run)
{
  for (gint32 l = 0; l < 2; l++)
    if (run->policy[l] != NULL)
      sift_policy_free (run->policy[l]);
  sift_model_free (run->src);
  g_array_unref (run->outputs);
  g_free (run);
}

static void
test_threshold_one_is_dense (void **state)
{
  (void) state;
  XattnBsaConfig cfg = { 1.0, 4, 32, XATTN_VOTE_MAJORITY, 0.5, 0, XATTN_GRANULARITY_QUERY_BLOCK, 1.0, FALSE, 0, FALSE };
  Run *dense = run_prefill (NULL);
  Run *x = run_prefill (&cfg);
  assert_int_equal (x->outputs->len, dense->outputs->len);
  assert_memory_equal (x->outputs->data, dense->outputs->data, x->outputs->len * sizeof (float));
  assert_true (x->sparse_calls > 0); /* the estimate ran, and selected everything */
  run_free (dense);
  run_free (x);
}

static void
test_plan_honoured (void **state)
{
  (void) state;
  const XattnGranularity gran[] = { XATTN_GRANULARITY_QUERY_BLOCK, XATTN_GRANULARITY_CHUNK };
  Run *dense = run_prefill (NULL);
  for (gsize i = 0; i < G_N_ELEMENTS (gran); i++)
    {
      /* Low threshold on random data: few blocks, different per head and
       * query block; min_query_len keeps the first chunk dense. */
      XattnBsaConfig cfg = { 0.3, 4, 32, XATTN_VOTE_ANY, 0.5, 100, gran[i], 1.0, FALSE, 0, FALSE };
      Run *x = run_prefill (&cfg);
      assert_int_equal (x->checked_calls, 2 * ((N_TOKENS + 63) / 64));
      assert_true (x->sparse_calls >= 2 * 4);
      if (x->max_err > 1e-4)
        fail_msg ("granularity %d: max relative error %g against the plan's reference", (int) gran[i], x->max_err);
      /* ... and the plan is sparse enough to change the output. */
      assert_int_equal (x->outputs->len, dense->outputs->len);
      assert_true (memcmp (x->outputs->data, dense->outputs->data, x->outputs->len * sizeof (float)) != 0);
      run_free (x);
    }
  run_free (dense);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_threshold_one_is_dense),
    cmocka_unit_test (test_plan_honoured),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
