/* Scalar attention: the plain reference path every SIMD path is tested
 * against. One query row at a time with an online softmax: a running max m
 * keeps every exponent <= 0 (no overflow), and the sum l and accumulator
 * are rescaled by e^(m_old - m_new) whenever the max grows. */
#include <math.h>

#include "attn-private.h"

static void
row_attend (const SiftAttnArgs *a, gint64 h, gint64 i, const gint64 *rows, gint64 n_keys)
{
  const gint32 d = a->q->head_dim;
  const gint64 g = h / (a->q->n_heads / a->k->n_heads);
  const float *q = sift_view_row (a->q, h, i);
  float *o = sift_view_row (a->out, h, i);
  float kr[d], vr[d], acc[d];
  float m = -INFINITY, l = 0.0f;
  gint64 limit = sift_attn_limit (a, i);

  for (gint32 c = 0; c < d; c++)
    acc[c] = 0.0f;
  /* Gathered rows index a->k; dense keys are read through the blocks. */
  SiftKvCursor cur = sift_kv_cursor (a, 0);
  for (gint64 n = 0; n < n_keys; n++)
    {
      gint64 j = rows ? rows[n] : n;
      if (j >= limit)
        {
          if (rows)
            continue;
          break;
        }
      const SiftView *kv = a->k, *vv = a->v;
      gint64 r = j;
      if (!rows)
        {
          r = sift_kv_seek (&cur, j);
          kv = &a->k_blocks[cur.b], vv = &a->v_blocks[cur.b];
        }
      sift_view_row_to_f32 (kv, g, r, kr);
      float s = 0.0f;
      for (gint32 c = 0; c < d; c++)
        s += q[c] * kr[c];
      s *= a->scale;
      sift_view_row_to_f32 (vv, g, r, vr);
      if (s > m)
        {
          float r = expf (m - s); /* rescale what was summed under the old max */
          l *= r;
          for (gint32 c = 0; c < d; c++)
            acc[c] *= r;
          m = s;
        }
      float p = expf (s - m);
      l += p;
      for (gint32 c = 0; c < d; c++)
        acc[c] += p * vr[c];
    }
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (gint32 c = 0; c < d; c++)
    o[c] = acc[c] * inv;
  a->lse[h * a->q->n_tokens + i] = l > 0.0f ? m + logf (l) : -INFINITY;
}

static void
dense_scalar (const SiftAttnArgs *a)
{
  for (gint64 h = 0; h < a->q->n_heads; h++)
    for (gint64 i = 0; i < a->q->n_tokens; i++)
      row_attend (a, h, i, NULL, a->k->n_tokens);
}

static void
gather_scalar (const SiftAttnArgs *a)
{
  for (gint64 h = 0; h < a->q->n_heads; h++)
    for (gint64 i = 0; i < a->q->n_tokens; i++)
      row_attend (a, h, i, a->rows, (gint64) a->n_rows);
}

static void
exp2v_scalar (const float *x, float *y, gsize n)
{
  for (gsize i = 0; i < n; i++)
    y[i] = exp2f (x[i]);
}

const SiftAttnKernels sift_attn_kernels_scalar = {
  .dense = dense_scalar,
  .decode = dense_scalar,
  .gather = gather_scalar,
  .exp2v = exp2v_scalar,
};
