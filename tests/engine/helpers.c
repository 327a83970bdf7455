#include <math.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

typedef struct {
  SiftModel parent;
  SiftModel *inner;
  SiftDType round_to;
} RoundSource;

static gboolean
round_qkv (SiftModel *src, gint32 layer, gint64 pos0, gint64 n, float *q, float *k, float *v,
           GError **error)
{
  RoundSource *self = (RoundSource *) src;
  if (!sift_model_qkv_at (self->inner, layer, pos0, n, q, k, v, error))
    return FALSE;
  gsize m = (gsize) (n * src->shape.n_kv_heads * src->shape.head_dim);
  if (self->round_to != SIFT_DTYPE_F32)
    {
      guint16 *tmp = g_new (guint16, m);
      for (int w = 0; w < 2; w++)
        {
          float *x = w == 0 ? k : v;
          sift_convert (x, SIFT_DTYPE_F32, tmp, self->round_to, m);
          sift_convert (tmp, self->round_to, x, SIFT_DTYPE_F32, m);
        }
      g_free (tmp);
    }
  return TRUE;
}

static void
round_finalize (SiftModel *src)
{
  sift_model_free (((RoundSource *) src)->inner);
}

static const SiftModelClass round_class = SIFT_MODEL_POSITIONAL_CLASS ("rounded-random", round_qkv, round_finalize);

SiftModel *
test_source_new (const SiftModelShape *shape, guint64 seed, SiftDType round_to)
{
  RoundSource *s = g_new0 (RoundSource, 1);
  g_assert_true (sift_model_init (&s->parent, &round_class, shape, 0, NULL));
  s->inner = sift_model_random_new (shape, seed);
  s->round_to = round_to;
  return &s->parent;
}

TestChecker *
test_checker_new (SiftModel *src, gint64 n_tokens)
{
  TestChecker *c = g_new0 (TestChecker, 1);
  const SiftModelShape *s = &src->shape;
  c->src = src;
  c->shape = s;
  c->n_tokens = n_tokens;
  c->k = g_new0 (float *, s->n_layers);
  c->v = g_new0 (float *, s->n_layers);
  gsize kn = (gsize) n_tokens * (gsize) s->n_kv_heads * (gsize) s->head_dim;
  float *q = g_new (float, (gsize) n_tokens * (gsize) s->n_q_heads * (gsize) s->head_dim);
  for (gint32 l = 0; l < s->n_layers; l++)
    {
      c->k[l] = g_new (float, kn);
      c->v[l] = g_new (float, kn);
      g_assert_true (sift_model_qkv_at (src, l, 0, n_tokens, q, c->k[l], c->v[l], NULL));
    }
  g_free (q);
  c->outputs = g_array_new (FALSE, FALSE, sizeof (float));
  return c;
}

void
test_checker_free (TestChecker *c)
{
  for (gint32 l = 0; l < c->shape->n_layers; l++)
    {
      g_free (c->k[l]);
      g_free (c->v[l]);
    }
  g_free (c->k);
  g_free (c->v);
  g_array_unref (c->outputs);
  g_free (c);
}

/* The logical block of token j: the prompt's blocks (the last possibly
 * partial), then decode blocks of block_size. */
static gint64
block_of (const TestChecker *c, gint64 j)
{
  const gint64 bs = c->shape->block_size;
  if (c->prompt == 0 || j < c->prompt)
    return j / bs;
  return (c->prompt + bs - 1) / bs + (j - c->prompt) / bs;
}

/* softmax(scale q.k) v over the keys row i may see, in double. */
static void
check_call (gpointer data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  TestChecker *c = data;
  const SiftModelShape *s = c->shape;
  const gint32 d = s->head_dim, G = s->n_q_heads / s->n_kv_heads;
  const double scale = s->scale > 0 ? s->scale : 1.0 / sqrt ((double) d);
  g_assert_cmpint (ctx->q_pos + ctx->n_q, <=, c->n_tokens);
  const float *K = c->k[ctx->layer], *V = c->v[ctx->layer];
  double *logit = g_new (double, (gsize) (ctx->q_pos + ctx->n_q));
  double *acc = g_new (double, (gsize) d);
  float *qrow = g_new (float, (gsize) d);
  for (gint32 h = 0; h < s->n_q_heads; h++)
    for (gint32 i = 0; i < ctx->n_q; i++)
      {
        sift_view_row_to_f32 (&ctx->q, h, i, qrow);
        const gint32 g = h / G;
        const gint64 limit = ctx->q_pos + i + 1;
        double m = -INFINITY;
        for (gint64 j = 0; j < limit; j++)
          {
            logit[j] = -INFINITY;
            if (j < ctx->kv_len && c->keep != NULL && !c->keep (block_of (c, j), h, c->keep_data))
              continue;
            const float *kr = K + (j * s->n_kv_heads + g) * d;
            double dot = 0;
            for (gint32 x = 0; x < d; x++)
              dot += (double) qrow[x] * kr[x];
            logit[j] = dot * scale;
            m = MAX (m, logit[j]);
          }
        double sum = 0;
        memset (acc, 0, sizeof (double) * (gsize) d);
        for (gint64 j = 0; j < limit; j++)
          {
            if (logit[j] == -INFINITY)
              continue;
            double w = exp (logit[j] - m);
            sum += w;
            const float *vr = V + (j * s->n_kv_heads + g) * d;
            for (gint32 x = 0; x < d; x++)
              acc[x] += w * vr[x];
          }
        const float *o = sift_view_row (out, h, i);
        double ref_max = 0, diff = 0;
        for (gint32 x = 0; x < d; x++)
          {
            double r = acc[x] / sum;
            ref_max = MAX (ref_max, fabs (r));
            diff = MAX (diff, fabs (r - o[x]));
          }
        c->max_err = MAX (c->max_err, diff / MAX (ref_max, 1e-3));
        double ref_lse = m + log (sum);
        c->max_lse_err = MAX (c->max_lse_err, fabs (ref_lse - lse[h * ctx->n_q + i]) / MAX (1.0, fabs (ref_lse)));
        g_array_append_vals (c->outputs, o, (guint) d);
      }
  c->calls++;
  g_free (logit);
  g_free (acc);
  g_free (qrow);
}

const SiftRunnerObserver test_checker_observer = { .attention = check_call };

SiftStoreConfig
test_store_config (const SiftModelShape *shape, SiftDType dtype, const char *path)
{
  SiftStoreConfig c = { .dtype = dtype, .n_kv_heads = shape->n_kv_heads, .block_size = shape->block_size,
                        .head_dim = shape->head_dim, .path = path };
  return c;
}

char *
test_tmp_path (const char *tag)
{
  static gint counter;
  return g_strdup_printf ("%s/sift-test-%d-%s-%d.kv", g_get_tmp_dir (), (int) getpid (), tag,
                          g_atomic_int_add (&counter, 1));
}

/* The error bound of a compute dtype: the CPU kernels compute in f32; the
 * GPU's round q and the probabilities to K's type (docs/kernels.md). */
double
test_tolerance (SiftDType compute)
{
  if (TEST_DEVICE == SIFT_DEVICE_CPU)
    return 1e-5;
  return compute == SIFT_DTYPE_BF16 ? 3e-2 : 8e-3;
}

/* The Full policy as a test sees it: both phases, every method NULL. */
const SiftPolicyOps test_full_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "test-full",
  .version = "1",
  .description = "dense, all methods NULL",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE,
  .instance_size = sizeof (SiftPolicy),
};

/* Selects every available block: exercises select + validate + the
 * selection path of the default pipeline. */
static gboolean
select_all (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n,
            SiftSelection *sel, GError **error)
{
  (void) self, (void) ctx, (void) error;
  for (gsize i = 0; i < n; i++)
    sift_selection_add (sel, available[i]);
  return TRUE;
}

const SiftPolicyOps test_select_all_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "test-select-all",
  .version = "1",
  .description = "selects every block",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .instance_size = sizeof (SiftPolicy),
  .select_blocks = select_all,
};

gint32
test_rows_of_step (gint32 i)
{
  return i % 23 == 22 ? 16 : i % 7 == 6 ? 3 : 1;
}

gint64
test_case_tokens (const TestCase *c)
{
  gint64 n = c->prompt;
  for (gint32 i = 0; i < c->steps; i++)
    n += test_rows_of_step (i);
  return n;
}

SiftModelShape
test_case_shape (const TestCase *c)
{
  SiftModelShape s = { c->layers, c->q_heads, c->kv_heads, c->head_dim, c->block, c->chunk, 0.0f };
  return s;
}

void
test_run_open (TestRun *r, const TestCase *c, guint64 seed, SiftStore *shared, gboolean resident)
{
  memset (r, 0, sizeof *r);
  SiftModelShape shape = test_case_shape (c);
  SiftDType round = c->compute != SIFT_DTYPE_F32 ? c->compute : c->stored == SIFT_DTYPE_Q8_0 ? SIFT_DTYPE_F32 : c->stored;
  g_autoptr (GError) error = NULL;
  if (shared != NULL)
    r->store = shared;
  else
    {
      r->path = c->file ? test_tmp_path ("dense") : NULL;
      SiftStoreConfig sc = test_store_config (&shape, c->stored, r->path);
      r->store = c->file ? sift_store_file_new (&sc, &error) : sift_store_host_new (&sc, &error);
      g_assert_no_error (error);
    }
  SiftEngineConfig ec = { shape, c->compute, c->slots, c->pipeline, 0, TEST_DEVICE };
  r->engine = sift_engine_new (&ec, r->store, &error);
  g_assert_no_error (error);
  g_assert_true (sift_engine_set_resident (r->engine, resident, &error));
  r->src = test_source_new (&shape, seed, round);
  r->per_layer = g_new0 (SiftPolicy *, c->layers);
  if (c->policy != TEST_POL_NULL)
    {
      r->policy = sift_policy_new (c->policy == TEST_POL_FULL ? &test_full_ops : &test_select_all_ops, NULL, &shape, &error);
      g_assert_no_error (error);
      for (gint32 l = 0; l < c->layers; l++)
        r->per_layer[l] = r->policy;
    }
  r->runner = sift_runner_new (r->engine, r->src, r->per_layer, r->per_layer, &error);
  g_assert_no_error (error);
  r->check = test_checker_new (r->src, test_case_tokens (c));
  sift_runner_set_observer (r->runner, &test_checker_observer, r->check);
}

void
test_run_sequence (TestRun *r, const TestCase *c)
{
  g_autoptr (GError) error = NULL;
  g_assert_true (sift_runner_prefill (r->runner, c->prompt, NULL, NULL, &error));
  g_assert_no_error (error);
  for (gint32 i = 0; i < c->steps; i++)
    {
      g_assert_true (sift_runner_decode (r->runner, test_rows_of_step (i), NULL, NULL, &error));
      g_assert_no_error (error);
    }
  g_assert_cmpint (sift_runner_position (r->runner), ==, test_case_tokens (c));
}

void
test_run_close (TestRun *r, gboolean own_store)
{
  test_checker_free (r->check);
  sift_runner_free (r->runner);
  sift_engine_free (r->engine);
  sift_policy_free (r->policy);
  g_free (r->per_layer);
  sift_model_free (r->src);
  if (own_store)
    {
      g_assert_cmpint (sift_store_blocks_in_use (r->store), ==, 0);
      sift_store_free (r->store);
      if (r->path != NULL)
        g_assert_false (g_file_test (r->path, G_FILE_TEST_EXISTS));
    }
  g_free (r->path);
}

void
test_run_reset_matches_fresh (TestRun *a, const TestCase *c, gboolean resident)
{
  test_checker_free (a->check);
  sift_model_free (a->src);
  SiftModelShape shape = test_case_shape (c);
  a->src = test_source_new (&shape, 2, SIFT_DTYPE_F16);
  sift_runner_free (a->runner);
  g_autoptr (GError) error = NULL;
  a->runner = sift_runner_new (a->engine, a->src, a->per_layer, a->per_layer, &error);
  g_assert_no_error (error);
  a->check = test_checker_new (a->src, test_case_tokens (c));
  sift_runner_set_observer (a->runner, &test_checker_observer, a->check);
  test_run_sequence (a, c);
  TestRun b;
  test_run_open (&b, c, 2, NULL, resident);
  test_run_sequence (&b, c);
  g_assert_cmpmem (a->check->outputs->data, a->check->outputs->len * sizeof (float), b.check->outputs->data,
                   b.check->outputs->len * sizeof (float));
  g_assert_cmpfloat (a->check->max_err, <, test_tolerance (c->compute));
  test_run_close (a, TRUE);
  test_run_close (&b, TRUE);
}
