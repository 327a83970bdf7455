/* The subquadratic plugin end to end: loaded through the registry from the
 * build tree, run by the real runner over the OffloadEngine (host or file
 * store, chunked prefill, decode with partial blocks), every layer's
 * output of every call against the whole-sequence forward over the same
 * model q, k, v. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "sq-core.h"

typedef struct {
  gint32 layers, qh, kvh, d, block, chunk, slots;
  gint64 prompt, steps;
  gboolean file_store, separate_decode; /* decode by its own instance: landmarks caught up by gather */
  const char *window, *lm_block, *globals, *lm_dtype;
  double tol;
} Case;

typedef struct {
  const Case *c;
  gint64 seq;
  float *ref;      /* [layers][seq][qh][d] */
  float *ref_lse;  /* [layers][qh][seq] */
  double err;
  gint64 rows_seen;
} Check;

static void
observe (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  Check *k = user_data;
  const Case *c = k->c;
  for (gint32 h = 0; h < c->qh; h++)
    for (gint64 r = 0; r < ctx->n_q; r++)
      {
        gint64 pos = ctx->q_pos + r;
        const float *o = sift_view_row (out, h, r);
        const float *ref = k->ref + (((gint64) ctx->layer * k->seq + pos) * c->qh + h) * c->d;
        for (gint32 x = 0; x < c->d; x++)
          k->err = MAX (k->err, fabs (o[x] - ref[x]));
        k->err = MAX (k->err, fabs (lse[h * ctx->n_q + r] - k->ref_lse[((gint64) ctx->layer * c->qh + h) * k->seq + pos]));
      }
  k->rows_seen += ctx->n_q;
}

static SiftPolicy *
make_policy (const Case *c, const SiftModelShape *shape)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  const SiftPolicyInfo *info = sift_registry_lookup (registry, "subquadratic", &error);
  g_assert_no_error (error);
  g_autoptr (SiftParams) params = sift_params_new (info->ops->params, &error);
  g_assert_no_error (error);
  const char *set[][2] = { { "window", c->window }, { "block_size", c->lm_block }, { "globals", c->globals },
                           { "landmark_dtype", c->lm_dtype } };
  for (gsize x = 0; x < G_N_ELEMENTS (set); x++)
    assert_true (sift_params_set_text (params, set[x][0], set[x][1], &error));
  SiftPolicy *p = sift_policy_new (info->ops, params, shape, &error);
  g_assert_no_error (error);
  return p;
}

static void
run_case (const Case *c)
{
  SiftModelShape shape = { c->layers, c->qh, c->kvh, c->d, c->block, c->chunk, 0.0f };
  g_autoptr (GError) error = NULL;
  g_autofree char *path = c->file_store ? g_strdup_printf ("%s/sift-sq-%d.kv", g_get_tmp_dir (), (int) getpid ()) : NULL;
  SiftStoreConfig sc = { .dtype = SIFT_DTYPE_F32, .n_kv_heads = c->kvh, .block_size = c->block, .head_dim = c->d,
                         .path = path };
  g_autoptr (SiftStore) store = c->file_store ? sift_store_file_new (&sc, &error) : sift_store_host_new (&sc, &error);
  g_assert_no_error (error);
  SiftEngineConfig ec = { shape, SIFT_DTYPE_F32, c->slots, SIFT_PIPELINE_RING, 0, SIFT_DEVICE_CPU };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
  g_assert_no_error (error);
  g_autoptr (SiftModel) src = sift_model_random_new (&shape, 7);

  /* The reference: the whole sequence of each layer at once. */
  Check k = { .c = c, .seq = c->prompt + c->steps };
  const gint64 seq = k.seq;
  k.ref = g_new (float, (gsize) c->layers * seq * c->qh * c->d);
  k.ref_lse = g_new (float, (gsize) c->layers * c->qh * seq);
  g_autofree float *q = g_new (float, (gsize) seq * c->qh * c->d);
  g_autofree float *kk = g_new (float, (gsize) seq * c->kvh * c->d);
  g_autofree float *vv = g_new (float, (gsize) seq * c->kvh * c->d);
  gint64 globals[8];
  gsize n_globals = 0;
  g_auto (GStrv) parts = g_strsplit_set (c->globals, "[], ", -1);
  for (char **x = parts; *x; x++)
    if (**x)
      globals[n_globals++] = g_ascii_strtoll (*x, NULL, 10);
  SqConfig cfg;
  sq_config_default (&cfg);
  cfg.window = g_ascii_strtoll (c->window, NULL, 10);
  cfg.block_size = g_ascii_strtoll (c->lm_block, NULL, 10);
  cfg.globals = globals;
  cfg.n_globals = n_globals;
  for (gint32 l = 0; l < c->layers; l++)
    {
      assert_true (sift_model_qkv_at (src, l, 0, seq, q, kk, vv, &error));
      SiftView vq = sift_view_thd (q, SIFT_DTYPE_F32, seq, c->qh, c->d);
      SiftView vk = sift_view_thd (kk, SIFT_DTYPE_F32, seq, c->kvh, c->d);
      SiftView vv_ = sift_view_thd (vv, SIFT_DTYPE_F32, seq, c->kvh, c->d);
      SiftView vo = sift_view_thd (k.ref + (gsize) l * seq * c->qh * c->d, SIFT_DTYPE_F32, seq, c->qh, c->d);
      assert_true (sq_forward (&cfg, &vq, &vk, &vv_, &vo, k.ref_lse + (gsize) l * c->qh * seq, &error));
    }

  SiftPolicy *prefill = make_policy (c, &shape);
  SiftPolicy *decode = c->separate_decode ? make_policy (c, &shape) : prefill;
  g_autofree SiftPolicy **pre = g_new (SiftPolicy *, c->layers);
  g_autofree SiftPolicy **dec = g_new (SiftPolicy *, c->layers);
  for (gint32 l = 0; l < c->layers; l++)
    {
      pre[l] = prefill;
      dec[l] = decode;
    }
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, src, pre, dec, &error);
  g_assert_no_error (error);
  SiftRunnerObserver obs = { .attention = observe };
  sift_runner_set_observer (runner, &obs, &k);
  assert_true (sift_runner_prefill (runner, c->prompt, NULL, NULL, &error));
  g_assert_no_error (error);
  for (gint64 s = 0; s < c->steps; s++)
    {
      assert_true (sift_runner_decode (runner, 1, NULL, NULL, &error));
      g_assert_no_error (error);
    }
  assert_int_equal (k.rows_seen, seq * c->layers);
  SiftCounters counters;
  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &counters);
  assert_true (counters.tokens_attended > 0);
  if (k.err > c->tol)
    fail_msg ("engine run differs from the whole-sequence forward by %g (> %g)", k.err, c->tol);
  if (decode != prefill)
    sift_policy_free (decode);
  sift_policy_free (prefill);
  g_free (k.ref);
  g_free (k.ref_lse);
}

static void
test_engine_host (void **state)
{
  (void) state;
  Case c = { 2, 4, 2, 32, 16, 64, 2, 300, 40, FALSE, FALSE, "24", "8", "[0, 5]", "f32", 2e-5 };
  run_case (&c);
}

static void
test_engine_file_separate_decode (void **state)
{
  (void) state;
  Case c = { 2, 4, 4, 64, 32, 64, 3, 200, 70, TRUE, TRUE, "40", "16", "[0]", "f32", 2e-5 };
  run_case (&c);
}

static void
test_engine_f16_landmarks (void **state)
{
  (void) state;
  Case c = { 1, 8, 2, 64, 64, 128, 4, 520, 20, FALSE, FALSE, "128", "64", "[0]", "f16", 5e-3 };
  run_case (&c);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_engine_host),
    cmocka_unit_test (test_engine_file_separate_decode),
    cmocka_unit_test (test_engine_f16_landmarks),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
