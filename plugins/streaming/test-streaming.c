/* Tests of the streaming policy, built and run out of tree like the plugin
 * (meson test; SIFT_POLICY_PATH points at the build folder):
 *  - its selection, against the rule written out by hand;
 *  - its attention through sift's engine, against dense attention computed
 *    directly from the model's q, k, v: equal to full dense attention when
 *    the window covers the whole sequence, and equal to dense attention over
 *    exactly the kept tokens (sink blocks, window blocks, unstored tokens)
 *    when it does not. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <sift/sift.h>

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf (stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      exit (1);                                                                \
    }                                                                          \
  } while (0)
#define CHECK_OK(call, error)                                                  \
  do {                                                                         \
    if (!(call)) {                                                             \
      fprintf (stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,          \
               (error) ? (error)->message : "failed");                         \
      exit (1);                                                                \
    }                                                                          \
  } while (0)

static SiftPolicy *
streaming_new (SiftRegistry *reg, const SiftModelShape *shape, const char *sinks, const char *window)
{
  GError *error = NULL;
  const SiftPolicyInfo *info = sift_registry_lookup (reg, "streaming", &error);
  CHECK_OK (info != NULL, error);
  g_autoptr (SiftParams) params = sift_params_new (info->ops->params, &error);
  CHECK_OK (params != NULL, error);
  CHECK_OK (sift_params_set_text (params, "sink_tokens", sinks, &error), error);
  CHECK_OK (sift_params_set_text (params, "window_tokens", window, &error), error);
  SiftPolicy *policy = sift_policy_new (info->ops, params, shape, &error);
  CHECK_OK (policy != NULL, error);
  return policy;
}

static void
test_selection (SiftRegistry *reg)
{
  GError *error = NULL;
  SiftModelShape shape = { .n_layers = 1, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 8,
                           .block_size = 16, .chunk_size = 16 };
  g_autoptr (SiftPolicy) policy = streaming_new (reg, &shape, "4", "64");

  /* Ten full blocks of 16 tokens; the query sits at position 160. */
  SiftBlockMeta blocks[10];
  gint64 available[10];
  for (int i = 0; i < 10; i++)
    {
      blocks[i] = (SiftBlockMeta) { .first_token = 16 * i, .n_valid = 16, .phase = SIFT_PHASE_PREFILL };
      available[i] = i;
    }
  SiftPolicyContext ctx = { .phase = SIFT_PHASE_DECODE, .block_size = 16, .kv_len = 160,
                            .q_pos = 160, .n_q = 1, .shape = &shape, .blocks = blocks,
                            .n_blocks = 10 };
  g_autoptr (SiftSelection) sel = sift_selection_new (4, 2);
  CHECK_OK (policy->ops->select_blocks (policy, &ctx, available, 10, sel, &error), error);
  CHECK_OK (sift_selection_validate (sel, available, 10, "streaming", &error), error);

  /* Window [96, 160) is blocks 6..9; the sinks (tokens 0..3) are in block 0. */
  gint64 expect[] = { 0, 6, 7, 8, 9 };
  CHECK (sift_selection_n_blocks (sel) == G_N_ELEMENTS (expect));
  for (gsize i = 0; i < G_N_ELEMENTS (expect); i++)
    CHECK (sift_selection_block (sel, i) == expect[i]);
}

/* ---- Through the engine, against dense attention ------------------------ */

typedef struct {
  SiftModel *source;
  gint64 sinks, window;  /* the rule the reference applies; window < 0: every token */
  gsize calls;
  double worst;          /* largest |o - o_ref| / max |o_ref| over calls */
} Reference;

/* The keys this call's rows may attend (causality aside), from the policy's
 * documented rule: a stored block is kept when it holds a sink token or a
 * token of [q_pos - window, q_pos); tokens not stored yet always are. */
static gsize
kept_positions (const Reference *ref, const SiftPolicyContext *ctx, gint64 *rows)
{
  gsize n = 0;
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    {
      const SiftBlockMeta *m = &ctx->blocks[b];
      gint64 last = m->first_token + m->n_valid - 1;
      gboolean keep = ref->window < 0 || m->first_token < ref->sinks || last >= ctx->q_pos - ref->window;
      for (gint64 t = m->first_token; keep && t <= last; t++)
        rows[n++] = t;
    }
  for (gint64 t = ctx->kv_len; t < ctx->q_pos + ctx->n_q; t++)
    rows[n++] = t;
  return n;
}

/* Runner observer: the engine's output for this call against attention
 * computed directly from the source's q, k, v over the kept positions. */
static void
check_attention (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  Reference *ref = user_data;
  const SiftModelShape *s = ctx->shape;
  GError *error = NULL;
  gint64 n_kv = ctx->q_pos + ctx->n_q;
  g_autofree float *q = g_new (float, (gsize) n_kv * s->n_q_heads * s->head_dim);
  g_autofree float *k = g_new (float, (gsize) n_kv * s->n_kv_heads * s->head_dim);
  g_autofree float *v = g_new (float, (gsize) n_kv * s->n_kv_heads * s->head_dim);
  CHECK_OK (sift_model_qkv_at (ref->source, ctx->layer, 0, n_kv, q, k, v, &error), error);
  g_autofree gint64 *rows = g_new (gint64, n_kv);
  gsize n_rows = kept_positions (ref, ctx, rows);

  SiftView q_all = sift_view_thd (q, SIFT_DTYPE_F32, n_kv, s->n_q_heads, s->head_dim);
  SiftView qv = sift_view_tokens (&q_all, ctx->q_pos, ctx->n_q);
  SiftView kv = sift_view_thd (k, SIFT_DTYPE_F32, n_kv, s->n_kv_heads, s->head_dim);
  SiftView vv = sift_view_thd (v, SIFT_DTYPE_F32, n_kv, s->n_kv_heads, s->head_dim);
  g_autofree float *o = g_new (float, (gsize) s->n_q_heads * ctx->n_q * s->head_dim);
  g_autofree float *l = g_new (float, (gsize) s->n_q_heads * ctx->n_q);
  SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, s->n_q_heads, ctx->n_q, s->head_dim);
  SiftAttnOpts opts = { .scale = s->scale, .causal = TRUE, .q_offset = ctx->q_pos };
  CHECK_OK (sift_attn_gather (&qv, &kv, &vv, rows, n_rows, &opts, &ov, l, &error), error);

  double max_ref = 0, max_diff = 0;
  for (gint32 h = 0; h < s->n_q_heads; h++)
    for (gint32 i = 0; i < ctx->n_q; i++)
      {
        const float *got = sift_view_row (out, h, i);
        const float *want = sift_view_row (&ov, h, i);
        for (gint32 d = 0; d < s->head_dim; d++)
          {
            max_ref = fmax (max_ref, fabs (want[d]));
            max_diff = fmax (max_diff, fabs (got[d] - want[d]));
          }
        CHECK (fabs (lse[h * ctx->n_q + i] - l[h * ctx->n_q + i]) <= 1e-4 * fmax (1.0, fabs (l[h * ctx->n_q + i])));
      }
  ref->worst = fmax (ref->worst, max_diff / fmax (max_ref, 1e-30));
  ref->calls++;
}

/* Prefills `prompt` tokens and decodes `steps` single tokens through the
 * engine (f32 host store, ring of 3 slots) with streaming in both phases
 * of every layer; every call is checked. Returns the fraction of KV tokens
 * attended; *bytes_loaded gets the bytes read from the store. */
static double
run_engine (SiftRegistry *reg, gint64 prompt, gint64 steps, gint64 sinks, gint64 window,
            guint64 *bytes_loaded)
{
  GError *error = NULL;
  SiftModelShape shape = { .n_layers = 2, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 32,
                           .block_size = 16, .chunk_size = 32, .scale = 1.0f / sqrtf (32.0f) };
  g_autofree char *sinks_text = g_strdup_printf ("%" G_GINT64_FORMAT, sinks);
  g_autofree char *window_text = g_strdup_printf ("%" G_GINT64_FORMAT, window < 0 ? 1 << 30 : window);
  g_autoptr (SiftPolicy) policy = streaming_new (reg, &shape, sinks_text, window_text);
  SiftPolicy *per_layer[] = { policy, policy };

  SiftStoreConfig store_config = { .dtype = SIFT_DTYPE_F32, .n_kv_heads = shape.n_kv_heads,
                                   .block_size = shape.block_size, .head_dim = shape.head_dim };
  g_autoptr (SiftStore) store = sift_store_host_new (&store_config, &error);
  CHECK_OK (store != NULL, error);
  SiftEngineConfig engine_config = { .shape = shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 3,
                                     .pipeline = SIFT_PIPELINE_RING };
  g_autoptr (SiftEngine) engine = sift_engine_new (&engine_config, store, &error);
  CHECK_OK (engine != NULL, error);
  g_autoptr (SiftModel) source = sift_model_random_new (&shape, 7);
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, source, per_layer, per_layer, &error);
  CHECK_OK (runner != NULL, error);

  Reference ref = { .source = source, .sinks = sinks, .window = window };
  SiftRunnerObserver observer = { .attention = check_attention };
  sift_runner_set_observer (runner, &observer, &ref);
  CHECK_OK (sift_runner_prefill (runner, prompt, NULL, NULL, &error), error);
  for (gint64 i = 0; i < steps; i++)
    CHECK_OK (sift_runner_decode (runner, 1, NULL, NULL, &error), error);

  /* Every chunk and step of every layer was checked, within f32 rounding. */
  gint64 chunks = (prompt + shape.chunk_size - 1) / shape.chunk_size;
  CHECK (ref.calls == (gsize) (shape.n_layers * (chunks + steps)));
  if (ref.worst > 1e-5)
    {
      fprintf (stderr, "streaming (sinks %" G_GINT64_FORMAT ", window %" G_GINT64_FORMAT
               "): output differs from the reference by %g (relative)\n", sinks, window, ref.worst);
      exit (1);
    }
  SiftCounters prefill, decode;
  sift_engine_counters (engine, -1, SIFT_PHASE_PREFILL, &prefill);
  sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &decode);
  *bytes_loaded = prefill.bytes_loaded + decode.bytes_loaded;
  return (double) (prefill.tokens_attended + decode.tokens_attended)
         / (double) (prefill.tokens_available + decode.tokens_available);
}

int
main (void)
{
  g_autoptr (SiftRegistry) reg = sift_registry_new (NULL);
  test_selection (reg);
  /* A prompt ending in a partial block, then decode steps past the next
   * block boundary: the window covers everything, so streaming is dense. */
  guint64 dense_bytes, streaming_bytes;
  double density = run_engine (reg, 150, 20, 4, -1, &dense_bytes);
  CHECK (density == 1.0);
  /* A window that ends mid-block and sinks inside block 0: the engine
   * attends exactly the kept tokens, fewer than all, and loads less. */
  density = run_engine (reg, 150, 20, 4, 40, &streaming_bytes);
  CHECK (density < 0.8);
  CHECK (streaming_bytes < dense_bytes / 2);
  printf ("3 passed, 0 failed\n");
  return 0;
}
