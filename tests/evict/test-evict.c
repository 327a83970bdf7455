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

/* ---- A source with a needle every query attends to ---------------------- */

typedef struct {
  SiftModelSource parent;
  SiftModelSource *inner;
  gint64 needle;      /* position, or -1 */
} NeedleSource;

static gboolean
needle_qkv (SiftModelSource *self, gint32 layer, gint64 pos0, gint64 n, float *q, float *k, float *v,
            GError **error)
{
  NeedleSource *ns = (NeedleSource *) self;
  const SiftModelShape *s = &self->shape;
  if (!sift_model_source_qkv (ns->inner, layer, pos0, n, q, k, v, error))
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
needle_finalize (SiftModelSource *self)
{
  sift_model_source_free (((NeedleSource *) self)->inner);
}

static const SiftModelSourceClass needle_class = { "needle", needle_qkv, needle_finalize };

static SiftModelSource *
needle_source_new (const SiftModelShape *shape, guint64 seed, gint64 needle)
{
  NeedleSource *ns = g_new0 (NeedleSource, 1);
  ns->parent.klass = &needle_class;
  ns->parent.shape = *shape;
  ns->inner = sift_model_random_new (shape, seed);
  ns->needle = needle;
  return &ns->parent;
}

/* ---- In-process test policies ------------------------------------------- */

typedef enum {
  SCORE_RANDOM,    /* pseudo-random scores: scattered victims */
  SCORE_HOSTILE,   /* -inf for every candidate: evict all it may */
} ScoreMode;

#define MAX_LAYERS 4
#define MAX_BLOCKS 256

typedef struct {
  SiftPolicy parent;
  ScoreMode mode;
  gint64 sinks, recent;      /* what the engine protects: candidates must avoid it */
  gint64 bad_candidates;     /* candidates that were protected */
  gint64 calls, hooks;
  /* Quest-style metadata: per (layer, block id) the sum of its valid keys. */
  double key_sum[MAX_LAYERS][MAX_BLOCKS];
} TestPolicy;

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

static const SiftPolicyOps test_ops = {
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

typedef struct {
  const char *policy;            /* NULL: dense, oldest first; "test": test_ops; else a registry name */
  const char *params[4];         /* name=value for a registry policy */
  ScoreMode mode;
  gint64 capacity;
  SiftEvictGranularity gran;
  gint64 sinks, recent;
  gint32 layers, block, chunk;
  gint64 prompt, steps;
  gint32 rows;                   /* per decode step */
  SiftPipeline pipe;
  gint64 needle;                 /* -1: plain random source */
  gboolean check;                /* compare every call with the kept-token reference */
  SiftDType store;               /* stored dtype (the source's k and v rounded through it) */
  gboolean file;                 /* the file store, else host */
  gboolean separate;             /* prefill and decode get their own instances (as the harness does) */
} Scenario;

typedef struct {
  const Scenario *sc;
  SiftModelShape shape;
  SiftModelSource *src;
  SiftStore *store;
  SiftEngine *engine;
  SiftRunner *runner;
  SiftPolicy *policy;
  SiftPolicy *decode_policy;     /* sc->separate: the decode phase's own instance */
  float **q, **k, **v;           /* [layer] -> [tokens][heads][dim] */
  gint64 n_tokens;
  double max_err;
  GArray *outputs;               /* every float of every call */
  gint64 max_blocks;             /* store blocks in use, the most seen */
  gint64 *blocks_after;          /* [steps] blocks in use after each step */
} Run;

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

static SiftRegistry *registry;

static Run *
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
      assert_true (sift_model_source_qkv (r->src, l, 0, r->n_tokens, r->q[l], r->k[l], r->v[l], NULL));
    }
  r->blocks_after = g_new0 (gint64, (gsize) sc->steps + 1);
  return r;
}

static void
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
  sift_model_source_free (r->src);
  g_free (r);
}

/* The stored tokens of every layer are exactly what the engine claims:
 * ascending, within capacity, protected ones present, and each block's
 * Quest-style key sum (test policy) true to the rows it holds. */
static void
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

static void
run_all (Run *r)
{
  g_autoptr (GError) error = NULL;
  if (!sift_runner_prefill (r->runner, r->sc->prompt, &error))
    fail_msg ("prefill: %s", error->message);
  check_state (r);
  for (gint64 i = 0; i < r->sc->steps; i++)
    {
      if (!sift_runner_decode (r->runner, r->sc->rows, &error))
        fail_msg ("decode step %" G_GINT64_FORMAT ": %s", i, error->message);
      r->blocks_after[i] = sift_store_blocks_in_use (r->store);
      r->max_blocks = MAX (r->max_blocks, r->blocks_after[i]);
      if (r->sc->check || i % 16 == 0 || i + 1 == r->sc->steps)
        check_state (r);
    }
}

static const Scenario base = {
  .policy = NULL, .capacity = 96, .gran = SIFT_EVICT_TOKEN, .sinks = 4, .recent = 16, .layers = 2,
  .block = 16, .chunk = 32, .prompt = 100, .steps = 60, .rows = 1, .pipe = SIFT_PIPELINE_RING, .needle = -1,
  .check = TRUE,
};

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
  g_autoptr (SiftModelSource) src = sift_model_random_new (&shape, 3);
  g_autoptr (SiftPolicy) p = sift_policy_new (&own_ops, NULL, &shape, NULL);
  SiftPolicy *per_layer[1] = { p };
  g_autoptr (SiftRunner) r = sift_runner_new (e, src, per_layer, per_layer, NULL);
  g_autoptr (GError) error = NULL;
  assert_true (sift_runner_prefill (r, 64, &error)); /* within the capacity */
  gboolean ok = TRUE;
  for (int i = 0; i < 40 && ok; i++)
    ok = sift_runner_decode (r, 1, &error);
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
      if (!sift_runner_prefill (r->runner, sc.prompt, &error))
        fail_msg ("prefill: %s", error->message);
      for (gint64 i = 0; i < sc.steps; i++)
        {
          if (!sift_runner_decode (r->runner, 1, &error))
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
  gboolean ok = sift_runner_prefill (r->runner, sc.prompt, &error);
  for (gint64 i = 0; ok && i < sc.steps; i++)
    ok = sift_runner_decode (r->runner, 1, &error);
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
