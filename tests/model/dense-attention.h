/* Shared by the forward-pass tests: a naive causal softmax attention over a
 * KV cache of its own, called between llama_model_qkv() and
 * llama_model_attended() as the model protocol does. Doubles throughout,
 * so it is the slow, obvious reference the engine's kernels are not. */
#pragma once

#include <math.h>
#include <string.h>

#include <glib.h>

#include "llama.h"

typedef struct {
  const LlamaConfig *c;
  float *k, *v; /* [n_layers][n_ctx][n_kv_heads][head_dim] */
  gint64 n_ctx;
} Cache;

static inline void
cache_init (Cache *kc, const LlamaConfig *c, gint64 n_ctx)
{
  kc->c = c;
  kc->n_ctx = n_ctx;
  gsize n = (gsize) c->n_layers * n_ctx * c->n_kv_heads * c->head_dim;
  kc->k = g_new0 (float, n);
  kc->v = g_new0 (float, n);
}

static inline void
cache_clear (Cache *kc)
{
  g_clear_pointer (&kc->k, g_free);
  g_clear_pointer (&kc->v, g_free);
}

/* Stores layer's k, v [n][n_kv_heads][head_dim] at positions pos0.. and
 * writes out [n][n_heads][head_dim]: each query attends to positions <= its own. */
static inline void
attend (Cache *kc, gint32 layer, gint64 pos0, gint64 n, const float *q, const float *k, const float *v, float *out)
{
  const LlamaConfig *c = kc->c;
  g_assert (pos0 + n <= kc->n_ctx);
  gint64 row = (gint64) c->n_kv_heads * c->head_dim;
  float *K = kc->k + layer * kc->n_ctx * row, *V = kc->v + layer * kc->n_ctx * row;
  memcpy (K + pos0 * row, k, sizeof (float) * (gsize) (n * row));
  memcpy (V + pos0 * row, v, sizeof (float) * (gsize) (n * row));
  int group = c->n_heads / c->n_kv_heads, hd = c->head_dim;
  g_autofree double *s = g_new (double, pos0 + n);
  for (gint64 t = 0; t < n; t++)
    for (int h = 0; h < c->n_heads; h++)
      {
        const float *qv = q + (t * c->n_heads + h) * hd;
        int g = h / group;
        double mx = -INFINITY, sum = 0;
        for (gint64 j = 0; j <= pos0 + t; j++)
          {
            double dot = 0;
            for (int i = 0; i < hd; i++)
              dot += (double) qv[i] * K[j * row + g * hd + i];
            s[j] = dot / sqrt (hd);
            mx = MAX (mx, s[j]);
          }
        for (gint64 j = 0; j <= pos0 + t; j++)
          sum += s[j] = exp (s[j] - mx);
        for (int i = 0; i < hd; i++)
          {
            double o = 0;
            for (gint64 j = 0; j <= pos0 + t; j++)
              o += s[j] * V[j * row + g * hd + i];
            out[(t * c->n_heads + h) * hd + i] = (float) (o / sum);
          }
      }
}

/* One model step over the cache: tokens [pos0, pos0 + n), logits of the
 * last or NULL. A failing call fails the cmocka test (include cmocka.h first). */
static inline void
step (LlamaModel *m, Cache *kc, gint64 pos0, gint64 n, const gint32 *tokens, float *logits)
{
  const LlamaConfig *c = llama_model_config (m);
  gint64 nq = (gint64) c->n_heads * c->head_dim, nkv = (gint64) c->n_kv_heads * c->head_dim;
  g_autofree float *q = g_new (float, n * nq), *k = g_new (float, n * nkv), *v = g_new (float, n * nkv);
  g_autofree float *o = g_new (float, n * nq);
  g_autoptr (GError) error = NULL;
  if (!llama_model_begin (m, pos0, n, tokens, &error))
    fail_msg ("%s", error->message);
  for (gint32 l = 0; l < c->n_layers; l++)
    {
      assert_true (llama_model_qkv (m, l, q, k, v, &error));
      attend (kc, l, pos0, n, q, k, v, o);
      assert_true (llama_model_attended (m, l, o, &error));
    }
  assert_true (llama_model_end (m, logits, &error));
}
