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
        if (g_getenv ("DBG") && diff / MAX (ref_max, 1e-3) > 1e-5) g_printerr ("bad: phase %d layer %d qpos %ld nq %d kvlen %ld h %d i %d err %g\n", ctx->phase, ctx->layer, (long) ctx->q_pos, ctx->n_q, (long) ctx->kv_len, h, i, diff / MAX (ref_max, 1e-3));
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
