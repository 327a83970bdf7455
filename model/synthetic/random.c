/* The random model source: independent N(0, 1) values, each a pure
 * function of (seed, layer, position, tensor, element), so any range can be
 * asked in any order and gives the same numbers. */
#include <math.h>

#include <sift/model.h>

typedef struct {
  SiftModelSource parent;
  guint64 seed;
} RandomSource;

/* splitmix64's finalizer: a bijective mix with good avalanche. */
static inline guint64
mix (guint64 x)
{
  x += G_GUINT64_CONSTANT (0x9e3779b97f4a7c15);
  x = (x ^ (x >> 30)) * G_GUINT64_CONSTANT (0xbf58476d1ce4e5b9);
  x = (x ^ (x >> 27)) * G_GUINT64_CONSTANT (0x94d049bb133111eb);
  return x ^ (x >> 31);
}

/* Uniform in (0, 1), never 0 (log below). */
static inline double
uniform (guint64 h)
{
  return ((double) (h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Fills n values of one token's tensor (0 q, 1 k, 2 v) by Box-Muller pairs. */
static void
fill (const RandomSource *self, gint32 layer, gint64 pos, guint64 tensor, float *dst, gint64 n)
{
  guint64 base = mix (mix (mix (self->seed) ^ (guint64) layer) ^ (guint64) pos) ^ (tensor << 56);
  for (gint64 i = 0; i < n; i += 2)
    {
      guint64 h = mix (base + (guint64) i);
      double u1 = uniform (h), u2 = uniform (mix (h));
      double r = sqrt (-2.0 * log (u1));
      dst[i] = (float) (r * cos (2.0 * G_PI * u2));
      if (i + 1 < n)
        dst[i + 1] = (float) (r * sin (2.0 * G_PI * u2));
    }
}

static gboolean
random_qkv (SiftModelSource *src, gint32 layer, gint64 pos0, gint64 n, float *q, float *k, float *v,
            GError **error)
{
  (void) error;
  const RandomSource *self = (const RandomSource *) src;
  const SiftModelShape *s = &src->shape;
  const gint64 nq = (gint64) s->n_q_heads * s->head_dim, nk = (gint64) s->n_kv_heads * s->head_dim;
  for (gint64 t = 0; t < n; t++)
    {
      fill (self, layer, pos0 + t, 0, q + t * nq, nq);
      fill (self, layer, pos0 + t, 1, k + t * nk, nk);
      fill (self, layer, pos0 + t, 2, v + t * nk, nk);
    }
  return TRUE;
}

static const SiftModelSourceClass random_class = {
  .name = "random",
  .qkv = random_qkv,
  .finalize = NULL,
};

SiftModelSource *
sift_model_random_new (const SiftModelShape *shape, guint64 seed)
{
  g_return_val_if_fail (shape != NULL && shape->n_layers > 0 && shape->n_q_heads > 0 && shape->n_kv_heads > 0
                          && shape->head_dim > 0,
                        NULL);
  RandomSource *self = g_new0 (RandomSource, 1);
  self->parent.klass = &random_class;
  self->parent.shape = *shape;
  self->seed = seed;
  return &self->parent;
}
