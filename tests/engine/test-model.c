/* The model protocol v2 (include/sift/model.h) as the runner drives it:
 * the order of calls in prefill, ring decode and cross-layer decode; the
 * output handed back to the model; tokens and logits; and the entry points'
 * refusals. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "helpers.h"

/* A model that records every call and hands q, k, v over from the random
 * model; its logits are the step's first token, its n and its pos0. */
typedef struct {
  SiftModel parent;
  SiftModel *inner;
  GString *log;              /* "b0+3 q0 a0 q1 a1 e|" ... */
  double max_out_diff;       /* attended's out vs the observer's, over every call */
  float *seen_out;           /* [max rows][n_q_heads][head_dim]: the last attended output */
  gint32 first_token;        /* of the step, -1 without tokens */
} Recorder;

static gboolean
rec_begin (SiftModel *m, gint64 pos0, gint64 n, const gint32 *tokens, GError **error)
{
  (void) error;
  Recorder *r = (Recorder *) m;
  g_string_append_printf (r->log, "b%" G_GINT64_FORMAT "+%" G_GINT64_FORMAT " ", pos0, n);
  r->first_token = tokens != NULL ? tokens[0] : -1;
  return TRUE;
}

static gboolean
rec_qkv (SiftModel *m, gint32 layer, float *q, float *k, float *v, GError **error)
{
  Recorder *r = (Recorder *) m;
  g_string_append_printf (r->log, "q%d ", layer);
  return sift_model_qkv_at (r->inner, layer, m->step_pos0, m->step_n, q, k, v, error);
}

static gboolean
rec_attended (SiftModel *m, gint32 layer, const float *out, GError **error)
{
  (void) error;
  Recorder *r = (Recorder *) m;
  g_string_append_printf (r->log, "a%d ", layer);
  gsize n = (gsize) m->step_n * (gsize) m->shape.n_q_heads * (gsize) m->shape.head_dim;
  memcpy (r->seen_out, out, n * sizeof (float));
  return TRUE;
}

static gboolean
rec_end (SiftModel *m, float *logits, GError **error)
{
  (void) error;
  Recorder *r = (Recorder *) m;
  g_string_append (r->log, logits != NULL ? "E| " : "e| ");
  if (logits != NULL)
    {
      logits[0] = (float) r->first_token;
      logits[1] = (float) m->step_n;
      logits[2] = (float) m->step_pos0;
    }
  return TRUE;
}

static void
rec_finalize (SiftModel *m)
{
  Recorder *r = (Recorder *) m;
  sift_model_free (r->inner);
  g_string_free (r->log, TRUE);
  g_free (r->seen_out);
}

static const SiftModelClass rec_class = {
  .version = SIFT_MODEL_PROTOCOL_VERSION, .struct_size = sizeof (SiftModelClass), .name = "recorder",
  .begin = rec_begin, .qkv = rec_qkv, .attended = rec_attended, .end = rec_end, .finalize = rec_finalize,
};

static const SiftModelShape shape = {
  .n_layers = 2, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 16, .block_size = 16, .chunk_size = 32,
};

static Recorder *
recorder_new (void)
{
  Recorder *r = g_new0 (Recorder, 1);
  assert_true (sift_model_init (&r->parent, &rec_class, &shape, 3, NULL));
  r->inner = sift_model_random_new (&shape, 3);
  r->log = g_string_new (NULL);
  r->seen_out = g_new0 (float, 64 * 4 * 16);
  return r;
}

/* The observer compares the head-major output with what attended() saw. */
static void
on_attention (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  (void) lse;
  Recorder *r = user_data;
  for (gint32 t = 0; t < ctx->n_q; t++)
    for (gint32 h = 0; h < shape.n_q_heads; h++)
      {
        const float *a = sift_view_row (out, h, t), *b = r->seen_out + ((gsize) t * shape.n_q_heads + h) * 16;
        for (gint32 e = 0; e < 16; e++)
          r->max_out_diff = MAX (r->max_out_diff, fabs ((double) a[e] - b[e]));
      }
}

static void
run_order (SiftPipeline pipeline)
{
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, NULL);
  SiftEngineConfig ec = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 2, .pipeline = pipeline };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, NULL);
  assert_non_null (engine);
  /* A copying pipeline, so cross-layer decode really prefetches. */
  sift_engine_set_force_copy (engine, TRUE);
  Recorder *rec = recorder_new ();
  g_autoptr (SiftModel) model = &rec->parent;
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, model, NULL, NULL, NULL);
  assert_non_null (runner);
  SiftRunnerObserver obs = { .attention = on_attention };
  sift_runner_set_observer (runner, &obs, rec);

  gint32 tokens[70];
  for (int i = 0; i < 70; i++)
    tokens[i] = 100 + i;
  float logits[3] = { -1, -1, -1 };
  assert_true (sift_runner_prefill (runner, 70, tokens, logits, NULL));
  /* Logits of the last chunk only: tokens 64..69. */
  assert_float_equal (logits[0], 164, 0);
  assert_float_equal (logits[1], 6, 0);
  assert_float_equal (logits[2], 64, 0);
  assert_true (sift_runner_decode (runner, 2, NULL, NULL, NULL));
  gint32 next = 7;
  assert_true (sift_runner_decode (runner, 1, &next, logits, NULL));
  assert_float_equal (logits[0], 7, 0);
  assert_float_equal (logits[2], 72, 0);
  assert_string_equal (rec->log->str,
                       "b0+32 q0 a0 q1 a1 e| b32+32 q0 a0 q1 a1 e| b64+6 q0 a0 q1 a1 E| "
                       "b70+2 q0 a0 q1 a1 e| b72+1 q0 a0 q1 a1 E| ");
  assert_true (rec->max_out_diff == 0.0);
}

static void
test_order_ring (void **state)
{
  (void) state;
  run_order (SIFT_PIPELINE_RING);
}

static void
test_order_cross_layer (void **state)
{
  (void) state;
  run_order (SIFT_PIPELINE_CROSS_LAYER);
}

/* The entry points refuse calls out of order and foreign classes, naming the model. */
static void
test_refusals (void **state)
{
  (void) state;
  Recorder *rec = recorder_new ();
  g_autoptr (SiftModel) m = &rec->parent;
  float q[4 * 16], k[2 * 16], v[2 * 16], out[4 * 16] = { 0 };
  GError *error = NULL;
  assert_false (sift_model_qkv (m, 0, q, k, v, &error));  /* no step */
  assert_true (g_error_matches (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID));
  assert_non_null (strstr (error->message, "recorder model"));
  g_clear_error (&error);
  assert_true (sift_model_begin (m, 5, 1, NULL, NULL));
  assert_false (sift_model_qkv (m, 1, q, k, v, &error));  /* layer 0 first */
  g_clear_error (&error);
  assert_true (sift_model_begin (m, 5, 1, NULL, NULL));   /* a new step after the failure */
  assert_true (sift_model_qkv (m, 0, q, k, v, NULL));
  assert_false (sift_model_qkv (m, 1, q, k, v, &error));  /* attended (0) first */
  g_clear_error (&error);
  assert_true (sift_model_begin (m, 5, 1, NULL, NULL));
  assert_true (sift_model_qkv (m, 0, q, k, v, NULL));
  assert_true (sift_model_attended (m, 0, out, NULL));
  assert_false (sift_model_end (m, NULL, &error));        /* layer 1 missing */
  g_clear_error (&error);
  assert_false (sift_model_begin (m, -1, 1, NULL, &error));
  g_clear_error (&error);
  assert_false (sift_model_qkv_at (m, 0, 0, 1, q, k, v, &error)); /* no random access */
  assert_non_null (strstr (error->message, "qkv_at"));
  g_clear_error (&error);

  SiftModelClass old = rec_class;
  old.version = 1;
  SiftModel other = { 0 };
  assert_false (sift_model_init (&other, &old, &shape, 0, &error));
  assert_non_null (strstr (error->message, "protocol 1"));
  g_clear_error (&error);
  SiftModelClass partial = rec_class;
  partial.attended = NULL;
  assert_false (sift_model_init (&other, &partial, &shape, 0, &error));
  g_clear_error (&error);

  /* The random model reads the same through the step as through qkv_at. */
  g_autoptr (SiftModel) rnd = sift_model_random_new (&shape, 9);
  float q2[4 * 16], k2[2 * 16], v2[2 * 16];
  assert_true (sift_model_begin (rnd, 40, 1, NULL, NULL));
  for (gint32 l = 0; l < 2; l++)
    {
      assert_true (sift_model_qkv (rnd, l, q, k, v, NULL));
      assert_true (sift_model_qkv_at (rnd, l, 40, 1, q2, k2, v2, NULL));
      assert_memory_equal (q, q2, sizeof q);
      assert_memory_equal (k, k2, sizeof k);
      assert_memory_equal (v, v2, sizeof v);
      assert_true (sift_model_attended (rnd, l, out, NULL));
    }
  assert_true (sift_model_end (rnd, NULL, NULL));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_order_ring),
    cmocka_unit_test (test_order_cross_layer),
    cmocka_unit_test (test_refusals),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
