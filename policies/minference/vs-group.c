/* The inner loops of the vertical-slash kernel and of the estimator: rows
 * of one tile against a group of VS_KEY_GROUP keys. The scalar loops here
 * are the reference the AVX2 and AVX-512 loops (vs-kernel-avx2.c,
 * vs-kernel-avx512.c) are tested against; vs_group_attend and vs_scores
 * pick among them by sift_isa_active () (or a test's vs_set_isa). */
#include <math.h>

#include <sift/plugin.h>

#include "vs.h"

/* ---- Scalar inner loops: the reference the SIMD paths are tested against. */

void
vs_scores_scalar (const float *q, gint32 n_rows, gint32 d, const float *const *krow, gint32 n_keys,
                  float *s)
{
  for (gint32 r = 0; r < n_rows; r++)
    for (gint32 kk = 0; kk < n_keys; kk++)
      {
        float acc = 0.0f;
        for (gint32 c = 0; c < d; c++)
          acc += q[(gsize) r * d + c] * krow[kk][c];
        s[(gsize) r * VS_KEY_GROUP + kk] = acc;
      }
}

void
vs_group_attend_scalar (VsTile *t, const VsGroup *g)
{
  const gint32 d = t->d;
  for (gint32 r = 0; r < t->n_rows; r++)
    {
      const float *q = t->q + (gsize) r * d;
      float *acc = t->acc + (gsize) r * d;
      const guint32 vis = vs_visible_lanes (g, t->pos0 + r);
      for (gint32 i = 0; i < VS_KEY_GROUP; i++)
        {
          if (!(vis >> i & 1))
            continue;
          float s = 0.0f;
          for (gint32 c = 0; c < d; c++)
            s += q[c] * g->kt[(gsize) c * VS_KEY_GROUP + i];
          if (s > t->m[r])
            {
              /* A new max: rescale what was summed under the old one so
               * every exponent stays <= 0. */
              float alpha = expf (t->m[r] - s);
              t->l[r] *= alpha;
              for (gint32 c = 0; c < d; c++)
                acc[c] *= alpha;
              t->m[r] = s;
            }
          float p = expf (s - t->m[r]);
          t->l[r] += p;
          t->attended++;
          for (gint32 c = 0; c < d; c++)
            acc[c] += p * g->vrow[i][c];
        }
    }
}

void
vs_transpose (const float *const *krow, gint32 n, gint32 d, float *kt)
{
  for (gint32 i = 0; i < VS_KEY_GROUP; i++)
    if (i < n)
      for (gint32 c = 0; c < d; c++)
        kt[(gsize) c * VS_KEY_GROUP + i] = krow[i][c];
    else
      for (gint32 c = 0; c < d; c++)
        kt[(gsize) c * VS_KEY_GROUP + i] = 0.0f;
}

static int isa_override = -1;

void
vs_set_isa (int isa)
{
  isa_override = isa;
}

SiftIsa
vs_isa (void)
{
  return isa_override >= 0 ? (SiftIsa) isa_override : sift_isa_active ();
}

void
vs_group_attend (VsTile *t, const VsGroup *g)
{
#ifdef VS_HAVE_AVX512
  if (vs_isa () >= SIFT_ISA_AVX512 && t->d % 16 == 0)
    {
      vs_group_attend_avx512 (t, g);
      return;
    }
#endif
#ifdef VS_HAVE_AVX2
  if (vs_isa () >= SIFT_ISA_AVX2 && t->d % 8 == 0)
    {
      vs_group_attend_avx2 (t, g);
      return;
    }
#endif
  vs_group_attend_scalar (t, g);
}

void
vs_scores (const float *q, gint32 n_rows, gint32 d, const float *const *krow, gint32 n_keys, float *s)
{
#ifdef VS_HAVE_AVX2
  if (vs_isa () >= SIFT_ISA_AVX2 && d % 8 == 0)
    {
      vs_scores_avx2 (q, n_rows, d, krow, n_keys, s);
      return;
    }
#endif
  vs_scores_scalar (q, n_rows, d, krow, n_keys, s);
}

SiftView
vs_view_f32 (const SiftView *k, float **buf, gsize *cap)
{
  if (k->dtype == SIFT_DTYPE_F32)
    return *k;
  gsize need = (gsize) k->n_heads * k->n_tokens * k->head_dim;
  if (need > *cap)
    {
      g_free (*buf);
      *buf = g_new (float, need);
      *cap = need;
    }
  SiftView f = sift_view_htd (*buf, SIFT_DTYPE_F32, k->n_heads, k->n_tokens, k->head_dim);
  for (gint32 h = 0; h < k->n_heads; h++)
    for (gint64 t = 0; t < k->n_tokens; t++)
      sift_view_row_to_f32 (k, h, t, sift_view_row (&f, h, t));
  return f;
}
