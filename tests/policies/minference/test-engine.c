/* The minference plugin through the OffloadEngine and the runner: a chunk
 * that is the whole prompt gives the whole-prompt result; several chunks
 * give, chunk by chunk, the estimate over stored blocks plus the chunk; and
 * sizes past the sequence are the Full policy's numbers exactly. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "vs.h"

enum { LAYERS = 2, QH = 4, KVH = 2, D = 32, BLOCK = 64 };

typedef struct {
  gint64 n;
  float *out;  /* [LAYERS][QH][n][D] */
  float *lse;  /* [LAYERS][QH][n] */
  SiftCounters prefill;  /* the engine's, all layers */
} Capture;

static void
capture_attention (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  Capture *c = user_data;
  if (ctx->phase != SIFT_PHASE_PREFILL)
    return;
  for (gint32 h = 0; h < QH; h++)
    for (gint32 i = 0; i < ctx->n_q; i++)
      {
        gsize row = ((gsize) ctx->layer * QH + h) * c->n + ctx->q_pos + i;
        memcpy (c->out + row * D, sift_view_row (out, h, i), D * sizeof (float));
        c->lse[row] = lse[h * ctx->n_q + i];
      }
}

static const SiftRunnerObserver capture_observer = { capture_attention, NULL };

/* Prefills n tokens of the random source with `policy` on every layer;
 * the prefill outputs land in *cap. */
static void
run_prefill (const char *policy, const char *const *params, gint64 n, gint32 chunk, Capture *cap)
{
  SiftModelShape shape = { LAYERS, QH, KVH, D, BLOCK, chunk, 0.0f };
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftRegistry) registry = sift_registry_new (NULL);
  const SiftPolicyInfo *info = sift_registry_lookup (registry, policy, &error);
  if (info == NULL)
    fail_msg ("%s", error->message);
  g_autoptr (SiftParams) p = sift_params_new (info->ops->params, &error);
  for (gsize i = 0; params && params[i]; i += 2)
    if (!sift_params_set_text (p, params[i], params[i + 1], &error))
      fail_msg ("%s", error->message);
  g_autoptr (SiftPolicy) pol = sift_policy_new (info->ops, p, &shape, &error);
  if (pol == NULL)
    fail_msg ("%s", error->message);
  SiftStoreConfig sc = { SIFT_DTYPE_F32, KVH, BLOCK, D, 0, NULL, FALSE, FALSE };
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
  SiftEngineConfig ec = { shape, SIFT_DTYPE_F32, 3, SIFT_PIPELINE_RING, 0, SIFT_DEVICE_CPU };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
  g_assert_no_error (error);
  g_autoptr (SiftModel) src = sift_model_random_new (&shape, 9);
  SiftPolicy *per_layer[LAYERS] = { pol, pol }, *dense[LAYERS] = { NULL, NULL };
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, src, per_layer, dense, &error);
  g_assert_no_error (error);
  cap->n = n;
  cap->out = g_new0 (float, (gsize) LAYERS * QH * n * D);
  cap->lse = g_new0 (float, (gsize) LAYERS * QH * n);
  sift_runner_set_observer (runner, &capture_observer, cap);
  if (!sift_runner_prefill (runner, n, NULL, NULL, &error))
    fail_msg ("%s", error->message);
  sift_engine_counters (engine, -1, SIFT_PHASE_PREFILL, &cap->prefill);
}

static void
capture_clear (Capture *c)
{
  g_free (c->out);
  g_free (c->lse);
}

/* The source's q, k, v of a layer, token-major. */
typedef struct {
  float *q, *k, *v;
  SiftView qv, kv, vv;
} Layer;

static void
layer_get (Layer *L, gint32 layer, gint64 n, gint32 chunk)
{
  SiftModelShape shape = { LAYERS, QH, KVH, D, BLOCK, chunk, 0.0f };
  g_autoptr (SiftModel) src = sift_model_random_new (&shape, 9);
  L->q = g_new (float, (gsize) n * QH * D);
  L->k = g_new (float, (gsize) n * KVH * D);
  L->v = g_new (float, (gsize) n * KVH * D);
  g_autoptr (GError) error = NULL;
  assert_true (sift_model_qkv_at (src, layer, 0, n, L->q, L->k, L->v, &error));
  L->qv = sift_view_thd (L->q, SIFT_DTYPE_F32, n, QH, D);
  L->kv = sift_view_thd (L->k, SIFT_DTYPE_F32, n, KVH, D);
  L->vv = sift_view_thd (L->v, SIFT_DTYPE_F32, n, KVH, D);
}

static void
layer_clear (Layer *L)
{
  g_free (L->q);
  g_free (L->k);
  g_free (L->v);
}

static const VsEstimateOpts opts = { 4, 64, 30, 100 };

static void
set_sizes (VsSizes *sizes, gint64 n, gint64 vertical, gint64 slash)
{
  for (gint32 h = 0; h < QH; h++)
    vs_sizes (n, vertical, slash, 0.0, opts.num_sink, opts.num_recent, &sizes[h].vertical, &sizes[h].slash);
}

static const char *const sparse_params[] = { "vertical_size", "40", "slash_size", "150", "tile_rows", "4", NULL };

static void
test_whole_prompt_chunk (void **state)
{
  (void) state;
  const gint64 n = 640;
  Capture cap;
  run_prefill ("minference", sparse_params, n, 640, &cap);
  VsSizes sizes[QH];
  set_sizes (sizes, n, 40, 150);
  g_autofree float *out = g_new (float, (gsize) QH * n * D);
  g_autofree float *lse = g_new (float, (gsize) QH * n);
  gint64 total_attended = 0;
  for (gint32 l = 0; l < LAYERS; l++)
    {
      Layer L;
      layer_get (&L, l, n, 640);
      SiftView ov = sift_view_htd (out, SIFT_DTYPE_F32, QH, n, D);
      VsStats st = { 0 };
      g_autoptr (GError) error = NULL;
      assert_true (vs_prefill (&L.qv, &L.kv, &L.vv, 1.0f / sqrtf (D), &opts, sizes, NULL, &ov, lse, &st, &error));
      assert_true (st.keys_attended < st.keys_causal); /* really sparse */
      total_attended += st.keys_attended;
      const float *o = cap.out + (gsize) l * QH * n * D;
      const float *ls = cap.lse + (gsize) l * QH * n;
      for (gsize i = 0; i < (gsize) QH * n * D; i++)
        assert_true (fabsf (o[i] - out[i]) <= 1e-6f);
      for (gsize i = 0; i < (gsize) QH * n; i++)
        assert_true (fabsf (ls[i] - lse[i]) <= 1e-6f);
      layer_clear (&L);
    }
  /* The density counters hear what the kernel attended. */
  assert_int_equal (cap.prefill.tokens_attended, total_attended);
  assert_int_equal (cap.prefill.tokens_available, LAYERS * QH * n * (n + 1) / 2);
  capture_clear (&cap);
}

/* Stored blocks of 64 keys below q_pos, then the chunk itself. */
typedef struct {
  const Layer *L;
  gint64 q_pos, n_q;
} ChunkSource;

static gboolean
chunk_source (gpointer source, gboolean want_v, VsBlockFunc fn, gpointer data, GError **error)
{
  (void) error;
  const ChunkSource *cs = source;
  for (gint64 j0 = 0; j0 < cs->q_pos; j0 += BLOCK)
    {
      SiftView kb = sift_view_tokens (&cs->L->kv, j0, BLOCK), vb = sift_view_tokens (&cs->L->vv, j0, BLOCK);
      fn (data, &kb, want_v ? &vb : NULL, j0);
    }
  SiftView kb = sift_view_tokens (&cs->L->kv, cs->q_pos, cs->n_q), vb = sift_view_tokens (&cs->L->vv, cs->q_pos, cs->n_q);
  fn (data, &kb, want_v ? &vb : NULL, cs->q_pos);
  return TRUE;
}

static void
test_chunks_estimate_over_stored_blocks (void **state)
{
  (void) state;
  const gint64 n = 700;
  const gint32 chunk = 256;
  Capture cap;
  run_prefill ("minference", sparse_params, n, chunk, &cap);
  for (gint32 l = 0; l < LAYERS; l++)
    {
      Layer L;
      layer_get (&L, l, n, chunk);
      for (gint64 q_pos = 0; q_pos < n; q_pos += chunk)
        {
          const gint64 n_q = MIN (chunk, n - q_pos);
          VsSizes sizes[QH];
          set_sizes (sizes, q_pos + n_q, 40, 150);
          g_autofree float *out = g_new (float, (gsize) QH * n_q * D);
          g_autofree float *lse = g_new (float, (gsize) QH * n_q);
          SiftView ov = sift_view_htd (out, SIFT_DTYPE_F32, QH, n_q, D);
          SiftView qc = sift_view_tokens (&L.qv, q_pos, n_q);
          ChunkSource cs = { &L, q_pos, n_q };
          g_autoptr (GError) error = NULL;
          assert_true (vs_chunk_prefill (&qc, q_pos, KVH, 1.0f / sqrtf (D), &opts, sizes, NULL, chunk_source, &cs, &ov,
                                         lse, NULL, &error));
          for (gint32 h = 0; h < QH; h++)
            for (gint64 i = 0; i < n_q; i++)
              {
                gsize row = ((gsize) l * QH + h) * n + q_pos + i;
                assert_true (fabsf (cap.lse[row] - lse[h * n_q + i]) <= 1e-5f);
                for (gint32 c = 0; c < D; c++)
                  assert_true (fabsf (cap.out[row * D + c] - out[(h * n_q + i) * D + c]) <= 1e-5f);
              }
        }
      layer_clear (&L);
    }
  capture_clear (&cap);
}

/* Sizes past the sequence: the Full policy's output, bit for bit. */
static void
test_dense_fallback_is_full (void **state)
{
  (void) state;
  const gint64 n = 300;
  const char *const big[] = { "vertical_size", "5000", NULL };
  Capture a, b;
  run_prefill ("minference", big, n, 128, &a);
  run_prefill ("full", NULL, n, 128, &b);
  assert_memory_equal (a.out, b.out, (gsize) LAYERS * QH * n * D * sizeof (float));
  assert_memory_equal (a.lse, b.lse, (gsize) LAYERS * QH * n * sizeof (float));
  assert_int_equal (a.prefill.tokens_attended, a.prefill.tokens_available);
  capture_clear (&a);
  capture_clear (&b);
}

int
main (void)
{
  sift_parallel_set_n_threads (2);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_whole_prompt_chunk),
    cmocka_unit_test (test_chunks_estimate_over_stored_blocks),
    cmocka_unit_test (test_dense_fallback_is_full),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
