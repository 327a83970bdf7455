/* The eviction tests' fixtures (evict-run.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "../engine/helpers.h"

#include "evict-run.h"

/* ---- A source with a needle every query attends to ---------------------- */

typedef struct {
  SiftModel parent;
  SiftModel *inner;
  gint64 needle;      /* position, or -1 */
} NeedleSource;

static gboolean
needle_qkv (SiftModel *self, gint32 layer, gint64 pos0, gint64 n, float *q, float *k, float *v,
            GError **error)
{
  NeedleSource *ns = (NeedleSource *) self;
  const SiftModelShape *s = &self->shape;
  if (!sift_model_qkv_at (ns->inner, layer, pos0, n, q, k, v, error))
    return FALSE;
  for (gint64 t = 0; t < n; t++)
    {
      /* Every query leans along dim 0; the needle's key points there. */
      for (gint32 h = 0; h < s->n_q_heads; h++)
        q[(t * s->n_q_heads + h) * s->head_dim] = 6.0f;
      if (pos0 + t != ns->needle)
        continue;
      for (gint32 g = 0; g < s->n_kv_heads; g++)
        {
          float *kr = k + (t * s->n_kv_heads + g) * s->head_dim, *vr = v + (t * s->n_kv_heads + g) * s->head_dim;
          memset (kr, 0, sizeof (float) * (gsize) s->head_dim);
          kr[0] = 8.0f;
          for (gint32 x = 0; x < s->head_dim; x++)
            vr[x] = x == 1 ? 10.0f : 0.0f;
        }
    }
  return TRUE;
}

static void
needle_finalize (SiftModel *self)
{
  sift_model_free (((NeedleSource *) self)->inner);
}

static const SiftModelClass needle_class = SIFT_MODEL_POSITIONAL_CLASS ("needle", needle_qkv, needle_finalize);

SiftModel *
needle_source_new (const SiftModelShape *shape, guint64 seed, gint64 needle)
{
  NeedleSource *ns = g_new0 (NeedleSource, 1);
  g_assert_true (sift_model_init (&ns->parent, &needle_class, shape, 0, NULL));
  ns->inner = sift_model_random_new (shape, seed);
  ns->needle = needle;
  return &ns->parent;
}

/* ---- In-process test policies ------------------------------------------- */




static gboolean
test_score (SiftPolicy *self, const SiftPolicyContext *ctx, const SiftEvictCandidates *c, float *scores,
            GError **error)
{
  TestPolicy *p = (TestPolicy *) self;
  (void) error;
  p->calls++;
  for (gsize i = 0; i < c->n; i++)
    {
      gint64 t = c->positions[i];
      if (t < p->sinks || t >= ctx->q_pos + ctx->n_q - p->recent)
        p->bad_candidates++;
      if (i > 0 && c->positions[i - 1] >= t)
        p->bad_candidates++; /* ascending */
      guint32 hsh = (guint32) (t * 2654435761u) ^ (guint32) ctx->layer;
      scores[i] = p->mode == SCORE_HOSTILE ? -INFINITY : (float) (hsh % 1000);
    }
  return TRUE;
}

static gboolean
test_offload (SiftPolicy *self, const SiftPolicyContext *ctx, const SiftBlockInfo *b, GError **error)
{
  TestPolicy *p = (TestPolicy *) self;
  (void) error;
  g_assert (ctx->layer < MAX_LAYERS && b->block_id < MAX_BLOCKS);
  p->hooks++;
  double sum = 0;
  g_autofree float *row = g_new (float, b->k.head_dim);
  for (gint32 h = 0; h < b->k.n_heads; h++)
    for (gint32 t = 0; t < b->meta->n_valid; t++)
      {
        sift_view_row_to_f32 (&b->k, h, t, row);
        for (gint32 x = 0; x < b->k.head_dim; x++)
          sum += row[x];
      }
  p->key_sum[ctx->layer][b->block_id] = sum;
  return TRUE;
}

const SiftPolicyOps test_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "test-evict",
  .version = "1",
  .description = "scores eviction candidates at random or all -inf; keeps key sums per block",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE,
  .instance_size = sizeof (TestPolicy),
  .on_prefill_offload = test_offload,
  .on_decode_offload = test_offload,
  .score_eviction = test_score,
};

/* ---- A run, checked against a reference over the tokens kept ------------ */



static void
reference_check (Run *r, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  const SiftModelShape *s = &r->shape;
  const gint32 l = ctx->layer, d = s->head_dim, group = s->n_q_heads / s->n_kv_heads;
  gsize n_stored = sift_engine_stored_positions (r->engine, l, NULL);
  g_autofree gint64 *pos = g_new (gint64, n_stored + (gsize) (ctx->q_pos + ctx->n_q - ctx->kv_len) + 1);
  sift_engine_stored_positions (r->engine, l, pos);
  const double scale = s->scale > 0 ? s->scale : 1.0 / sqrt ((double) d);
  g_autofree double *acc = g_new (double, d);
  for (gint32 h = 0; h < s->n_q_heads; h++)
    for (gint32 i = 0; i < ctx->n_q; i++)
      {
        gsize n = n_stored;
        for (gint64 t = ctx->kv_len; t <= ctx->q_pos + i; t++)
          pos[n++] = t;
        const float *q = r->q[l] + ((ctx->q_pos + i) * s->n_q_heads + h) * d;
        double m = -INFINITY;
        for (gsize j = 0; j < n; j++)
          {
            const float *k = r->k[l] + (pos[j] * s->n_kv_heads + h / group) * d;
            double dot = 0;
            for (gint32 x = 0; x < d; x++)
              dot += (double) q[x] * k[x];
            m = MAX (m, scale * dot);
          }
        double z = 0;
        memset (acc, 0, sizeof (double) * (gsize) d);
        for (gsize j = 0; j < n; j++)
          {
            const float *k = r->k[l] + (pos[j] * s->n_kv_heads + h / group) * d;
            const float *v = r->v[l] + (pos[j] * s->n_kv_heads + h / group) * d;
            double dot = 0;
            for (gint32 x = 0; x < d; x++)
              dot += (double) q[x] * k[x];
            double w = exp (scale * dot - m);
            z += w;
            for (gint32 x = 0; x < d; x++)
              acc[x] += w * v[x];
          }
        const float *o = sift_view_row (out, h, i);
        double err = 0, ref_max = 1e-3;
        for (gint32 x = 0; x < d; x++)
          {
            err = MAX (err, fabs (o[x] - acc[x] / z));
            ref_max = MAX (ref_max, fabs (acc[x] / z));
          }
        r->max_err = MAX (r->max_err, err / ref_max);
        r->max_err = MAX (r->max_err, fabs (lse[(gsize) h * ctx->n_q + i] - (m + log (z))) / MAX (1.0, fabs (m)));
      }
}

static void
on_attention (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  Run *r = user_data;
  for (gint32 h = 0; h < out->n_heads; h++)
    for (gint64 i = 0; i < out->n_tokens; i++)
      g_array_append_vals (r->outputs, sift_view_row (out, h, i), (guint) out->head_dim);
  if (r->sc->check)
    reference_check (r, ctx, out, lse);
}

static const SiftRunnerObserver observer = { on_attention, NULL };

SiftRegistry *registry;

Run *
run_new (const Scenario *sc)
{
  Run *r = g_new0 (Run, 1);
  r->sc = sc;
  r->shape = (SiftModelShape) { sc->layers, 4, 2, 32, sc->block, sc->chunk, 0 };
  r->shape.scale = 1.0f / sqrtf (32.0f);
  r->src = sc->needle >= 0 ? needle_source_new (&r->shape, 7, sc->needle) : test_source_new (&r->shape, 7, sc->store);
  g_autofree char *path = sc->file ? test_tmp_path ("evict") : NULL;
  SiftStoreConfig stc = test_store_config (&r->shape, sc->store, path);
  r->store = sc->file ? sift_store_file_new (&stc, NULL) : sift_store_host_new (&stc, NULL);
  assert_non_null (r->store);
  SiftEngineConfig ec = { .shape = r->shape, .compute_dtype = SIFT_DTYPE_F32, .n_slots = 4, .pipeline = sc->pipe };
  g_autoptr (GError) error = NULL;
  r->engine = sift_engine_new (&ec, r->store, &error);
  assert_non_null (r->engine);
  SiftEvictConfig ev = { sc->capacity, sc->gran, sc->sinks, sc->recent };
  assert_true (sift_engine_set_eviction (r->engine, &ev, &error));
  if (sc->policy != NULL && g_str_equal (sc->policy, "test"))
    {
      r->policy = sift_policy_new (&test_ops, NULL, &r->shape, &error);
      TestPolicy *tp = (TestPolicy *) r->policy;
      tp->mode = sc->mode;
      tp->sinks = sc->sinks;
      tp->recent = sc->recent;
    }
  else if (sc->policy != NULL)
    {
      const SiftPolicyInfo *info = sift_registry_lookup (registry, sc->policy, &error);
      if (info == NULL)
        fail_msg ("%s", error->message);
      g_autoptr (SiftParams) params = sift_params_new (info->ops->params, &error);
      for (int i = 0; i < 4 && sc->params[i] != NULL; i++)
        {
          g_auto (GStrv) kv = g_strsplit (sc->params[i], "=", 2);
          assert_true (sift_params_set_text (params, kv[0], kv[1], &error));
        }
      r->policy = sift_policy_new (info->ops, params, &r->shape, &error);
      if (sc->separate)
        r->decode_policy = sift_policy_new (info->ops, params, &r->shape, &error);
    }
  assert_true (sc->policy == NULL || r->policy != NULL);
  SiftPolicy *per_layer[MAX_LAYERS], *per_layer_decode[MAX_LAYERS];
  for (gint32 l = 0; l < sc->layers; l++)
    {
      per_layer[l] = r->policy;
      per_layer_decode[l] = r->decode_policy != NULL ? r->decode_policy : r->policy;
    }
  r->runner = sift_runner_new (r->engine, r->src, per_layer, per_layer_decode, &error);
  assert_non_null (r->runner);
  sift_runner_set_observer (r->runner, &observer, r);
  r->outputs = g_array_new (FALSE, FALSE, sizeof (float));
  r->n_tokens = sc->prompt + sc->steps * sc->rows;
  r->q = g_new0 (float *, sc->layers);
  r->k = g_new0 (float *, sc->layers);
  r->v = g_new0 (float *, sc->layers);
  for (gint32 l = 0; l < sc->layers; l++)
    {
      r->q[l] = g_new (float, (gsize) r->n_tokens * 4 * 32);
      r->k[l] = g_new (float, (gsize) r->n_tokens * 2 * 32);
      r->v[l] = g_new (float, (gsize) r->n_tokens * 2 * 32);
      assert_true (sift_model_qkv_at (r->src, l, 0, r->n_tokens, r->q[l], r->k[l], r->v[l], NULL));
    }
  r->blocks_after = g_new0 (gint64, (gsize) sc->steps + 1);
  return r;
}

void
run_free (Run *r)
{
  for (gint32 l = 0; l < r->sc->layers; l++)
    {
      g_free (r->q[l]);
      g_free (r->k[l]);
      g_free (r->v[l]);
    }
  g_free (r->q);
  g_free (r->k);
  g_free (r->v);
  g_free (r->blocks_after);
  g_array_unref (r->outputs);
  sift_runner_free (r->runner);
  sift_policy_free (r->policy);
  sift_policy_free (r->decode_policy);
  sift_engine_free (r->engine);
  sift_store_free (r->store);
  sift_model_free (r->src);
  g_free (r);
}

/* The stored tokens of every layer are exactly what the engine claims:
 * ascending, within capacity, protected ones present, and each block's
 * Quest-style key sum (test policy) true to the rows it holds. */
void
check_state (Run *r)
{
  const Scenario *sc = r->sc;
  const SiftModelShape *s = &r->shape;
  const gint64 end = sift_runner_position (r->runner);
  for (gint32 l = 0; l < sc->layers; l++)
    {
      SiftPolicyContext ctx = { 0 };
      sift_engine_fill_context (r->engine, &ctx, l);
      gsize n = sift_engine_stored_positions (r->engine, l, NULL);
      g_autofree gint64 *pos = g_new (gint64, n + 1);
      sift_engine_stored_positions (r->engine, l, pos);
      if (sc->capacity > 0)
        assert_true ((gint64) n <= sc->capacity);
      for (gsize i = 1; i < n; i++)
        assert_true (pos[i - 1] < pos[i]);
      /* Protected: every sink, and every recent token already stored. */
      gsize at = 0;
      for (gint64 t = 0; t < MIN (sc->sinks, ctx.kv_len); t++, at++)
        assert_int_equal (pos[at], t);
      for (gint64 t = MAX (end - sc->recent, sc->sinks); t < ctx.kv_len; t++)
        {
          gint64 b;
          gint32 row;
          assert_true (sift_engine_find_row (r->engine, l, t, &b, &row));
        }
      if (r->policy == NULL || r->policy->ops != &test_ops)
        continue;
      TestPolicy *tp = (TestPolicy *) r->policy;
      for (gint64 b = 0; b < ctx.n_blocks; b++)
        {
          const gint64 *bp = sift_engine_block_positions (r->engine, l, b);
          double sum = 0;
          for (gint32 t = 0; t < ctx.blocks[b].n_valid; t++)
            for (gint32 x = 0; x < s->n_kv_heads * s->head_dim; x++)
              sum += r->k[l][bp[t] * s->n_kv_heads * s->head_dim + x];
          assert_true (ctx.blocks[b].first_token == bp[0]);
          if (fabs (sum - tp->key_sum[l][b]) > 1e-3 * MAX (1.0, fabs (sum)))
            fail_msg ("layer %d block %" G_GINT64_FORMAT ": the hook saw key sum %g, the block holds %g", l, b,
                      tp->key_sum[l][b], sum);
        }
    }
}

void
run_all (Run *r)
{
  g_autoptr (GError) error = NULL;
  if (!sift_runner_prefill (r->runner, r->sc->prompt, NULL, NULL, &error))
    fail_msg ("prefill: %s", error->message);
  check_state (r);
  for (gint64 i = 0; i < r->sc->steps; i++)
    {
      if (!sift_runner_decode (r->runner, r->sc->rows, NULL, NULL, &error))
        fail_msg ("decode step %" G_GINT64_FORMAT ": %s", i, error->message);
      r->blocks_after[i] = sift_store_blocks_in_use (r->store);
      r->max_blocks = MAX (r->max_blocks, r->blocks_after[i]);
      if (r->sc->check || i % 16 == 0 || i + 1 == r->sc->steps)
        check_state (r);
    }
}

const Scenario base = {
  .policy = NULL, .capacity = 96, .gran = SIFT_EVICT_TOKEN, .sinks = 4, .recent = 16, .layers = 2,
  .block = 16, .chunk = 32, .prompt = 100, .steps = 60, .rows = 1, .pipe = SIFT_PIPELINE_RING, .needle = -1,
  .check = TRUE,
};
