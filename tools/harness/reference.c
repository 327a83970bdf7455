/* The dense reference for a cell's question rows, computed from the model
 * source alone (not through the engine): keys stream in chunks, each
 * chunk's partial result merged by LSE, so a 128K context never needs its
 * whole K and V at once. */
#include <math.h>
#include <string.h>

#include "harness.h"

#define REF_CHUNK 1024

gboolean
harness_dense_reference (SiftModelSource *src, gint64 row0, gint64 n_rows, float *ref, GError **error)
{
  const SiftModelShape *s = &src->shape;
  gsize d = (gsize) s->head_dim, hq = (gsize) s->n_q_heads, hkv = (gsize) s->n_kv_heads;
  gsize rows = (gsize) n_rows;
  g_autofree float *q = g_new (float, rows * hq * d);        /* [rows][hq][d] */
  g_autofree float *qk = g_new (float, rows * hkv * d);      /* the rows' own keys [rows][hkv][d] */
  g_autofree float *qv = g_new (float, rows * hkv * d);
  g_autofree float *cq = g_new (float, REF_CHUNK * hq * d);  /* scratch: queries of a key chunk */
  g_autofree float *ck = g_new (float, REF_CHUNK * hkv * d); /* [chunk][hkv][d] */
  g_autofree float *cv = g_new (float, REF_CHUNK * hkv * d);
  g_autofree float *part = g_new (float, hq * rows * d);     /* [hq][rows][d] */
  g_autofree float *part_lse = g_new (float, hq * rows);
  g_autofree float *lse = g_new (float, hq * rows);
  SiftAttnOpts opts = { .scale = s->scale, .causal = FALSE };

  for (gint32 l = 0; l < s->n_layers; l++)
    {
      float *acc = ref + (gsize) l * hq * rows * d;
      SiftView o = sift_view_htd (acc, SIFT_DTYPE_F32, (gint32) hq, n_rows, (gint32) d);
      SiftView p = sift_view_htd (part, SIFT_DTYPE_F32, (gint32) hq, n_rows, (gint32) d);
      SiftView qv_ = sift_view_thd (q, SIFT_DTYPE_F32, n_rows, (gint32) hq, (gint32) d);
      /* Nothing attended yet: output 0, LSE -inf (the identity of merge). */
      memset (acc, 0, hq * rows * d * sizeof (float));
      for (gsize i = 0; i < hq * rows; i++)
        lse[i] = -INFINITY;
      if (!sift_model_source_qkv (src, l, row0, n_rows, q, qk, qv, error))
        return FALSE;
      /* Keys before the first row: every row sees all of them. */
      for (gint64 c0 = 0; c0 < row0; c0 += REF_CHUNK)
        {
          gint64 m = MIN (REF_CHUNK, row0 - c0);
          if (!sift_model_source_qkv (src, l, c0, m, cq, ck, cv, error))
            return FALSE;
          SiftView k = sift_view_thd (ck, SIFT_DTYPE_F32, m, (gint32) hkv, (gint32) d);
          SiftView v = sift_view_thd (cv, SIFT_DTYPE_F32, m, (gint32) hkv, (gint32) d);
          if (!sift_attn_dense (&qv_, &k, &v, &opts, &p, part_lse, error)
              || !sift_attn_merge (&o, lse, &p, part_lse, error))
            return FALSE;
        }
      /* The rows' own keys, causally. */
      SiftView k = sift_view_thd (qk, SIFT_DTYPE_F32, n_rows, (gint32) hkv, (gint32) d);
      SiftView v = sift_view_thd (qv, SIFT_DTYPE_F32, n_rows, (gint32) hkv, (gint32) d);
      SiftAttnOpts causal = { .scale = s->scale, .causal = TRUE, .q_offset = 0 };
      if (!sift_attn_dense (&qv_, &k, &v, &causal, &p, part_lse, error)
          || !sift_attn_merge (&o, lse, &p, part_lse, error))
        return FALSE;
    }
  return TRUE;
}
