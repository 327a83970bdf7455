/* Quest's math: key bounds per block, the query-aware upper bound, picking. */
#include <math.h>
#include <string.h>

#include <sift/plugin.h>

#include "quest-core.h"

QuestMeta *
quest_meta_new (gint32 n_layers, gint32 n_kv_heads, gint32 head_dim)
{
  g_return_val_if_fail (n_layers > 0 && n_kv_heads > 0 && head_dim > 0, NULL);
  QuestMeta *meta = g_new0 (QuestMeta, 1);
  meta->n_layers = n_layers;
  meta->n_kv_heads = n_kv_heads;
  meta->head_dim = head_dim;
  meta->layers = g_new0 (QuestLayerMeta, n_layers);
  return meta;
}

void
quest_meta_clear (QuestMeta *meta)
{
  g_return_if_fail (meta != NULL);
  for (gint32 l = 0; l < meta->n_layers; l++)
    {
      g_clear_pointer (&meta->layers[l].minmax, g_free);
      g_clear_pointer (&meta->layers[l].present, g_free);
      meta->layers[l].capacity = 0;
    }
  meta->n_present = 0;
}

void
quest_meta_free (QuestMeta *meta)
{
  if (meta == NULL)
    return;
  quest_meta_clear (meta);
  g_free (meta->layers);
  g_free (meta);
}

static gsize
block_floats (const QuestMeta *meta)
{
  return 2 * (gsize) meta->n_kv_heads * (gsize) meta->head_dim;
}

/* Grows a layer's table so that block_id has a slot (doubling: ids arrive in order). */
static void
reserve (QuestMeta *meta, QuestLayerMeta *lm, gint64 block_id)
{
  if (block_id < lm->capacity)
    return;
  gint64 cap = MAX (lm->capacity * 2, 64);
  while (cap <= block_id)
    cap *= 2;
  lm->minmax = g_renew (float, lm->minmax, (gsize) cap * block_floats (meta));
  lm->present = g_renew (guint8, lm->present, (gsize) cap);
  memset (lm->present + lm->capacity, 0, (gsize) (cap - lm->capacity));
  lm->capacity = cap;
}

gboolean
quest_meta_update (QuestMeta *meta, gint32 layer, gint64 block_id, const SiftView *k, gint32 n_valid,
                   GError **error)
{
  g_return_val_if_fail (meta != NULL && k != NULL, FALSE);
  if (!sift_view_check (k, "quest: block keys", error))
    return FALSE;
  if (layer < 0 || layer >= meta->n_layers || block_id < 0)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                   "quest: block %" G_GINT64_FORMAT " of layer %d is out of range (%d layers)", block_id,
                   layer, meta->n_layers);
      return FALSE;
    }
  if (k->n_heads != meta->n_kv_heads || k->head_dim != meta->head_dim)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                   "quest: block keys are [%d heads][%d dim], the model has [%d][%d]", k->n_heads,
                   k->head_dim, meta->n_kv_heads, meta->head_dim);
      return FALSE;
    }
  if (n_valid < 1 || n_valid > k->n_tokens)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                   "quest: block %" G_GINT64_FORMAT " of layer %d has %d valid tokens, not 1..%" G_GINT64_FORMAT,
                   block_id, layer, n_valid, k->n_tokens);
      return FALSE;
    }

  QuestLayerMeta *lm = &meta->layers[layer];
  reserve (meta, lm, block_id);
  const gint32 d = meta->head_dim, nkv = meta->n_kv_heads;
  float *kmin = lm->minmax + (gsize) block_id * block_floats (meta); /* [n_kv_heads][d] */
  float *kmax = kmin + (gsize) nkv * d;                              /* [n_kv_heads][d] */
  g_autofree float *row = g_new (float, d);
  for (gint32 h = 0; h < nkv; h++)
    {
      float *lo = kmin + (gsize) h * d, *hi = kmax + (gsize) h * d;
      /* Rows at or past n_valid are undefined: only valid rows enter the box. */
      for (gint32 t = 0; t < n_valid; t++)
        {
          sift_view_row_to_f32 (k, h, t, row);
          if (t == 0)
            {
              memcpy (lo, row, sizeof (float) * (gsize) d);
              memcpy (hi, row, sizeof (float) * (gsize) d);
              continue;
            }
          for (gint32 i = 0; i < d; i++)
            {
              lo[i] = fminf (lo[i], row[i]);
              hi[i] = fmaxf (hi[i], row[i]);
            }
        }
    }
  if (!lm->present[block_id])
    meta->n_present++;
  lm->present[block_id] = 1;
  return TRUE;
}

const float *
quest_meta_block (const QuestMeta *meta, gint32 layer, gint64 block_id)
{
  g_return_val_if_fail (meta != NULL, NULL);
  if (layer < 0 || layer >= meta->n_layers || block_id < 0)
    return NULL;
  const QuestLayerMeta *lm = &meta->layers[layer];
  if (block_id >= lm->capacity || !lm->present[block_id])
    return NULL;
  return lm->minmax + (gsize) block_id * block_floats (meta);
}

float
quest_bound (const float *q, const float *kmin, const float *kmax, gint32 head_dim)
{
  /* For each channel the product q_i * k_i is linear in k_i, so over
   * k_i in [kmin_i, kmax_i] its maximum sits at one end; channels are
   * independent inside the box, so the sum of the per-channel maxima bounds
   * q.k for every key in the block, and is reached by a key at a corner. */
  float s = 0.0f;
  for (gint32 i = 0; i < head_dim; i++)
    s += fmaxf (q[i] * kmax[i], q[i] * kmin[i]);
  return s;
}

/* The bound with q split by sign beforehand: max(q_i M_i, q_i m_i) is
 * q_i M_i for q_i >= 0 and q_i m_i otherwise (M_i >= m_i), so the bound is
 * qpos . kmax + qneg . kmin. Four partial sums break the add chain (the
 * loop is latency-bound otherwise); quest_bound is the plain reference. */
static float
bound_split (const float *qpos, const float *qneg, const float *kmin, const float *kmax, gint32 d)
{
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  gint32 i = 0;
  for (; i + 4 <= d; i += 4)
    {
      s0 += qpos[i] * kmax[i] + qneg[i] * kmin[i];
      s1 += qpos[i + 1] * kmax[i + 1] + qneg[i + 1] * kmin[i + 1];
      s2 += qpos[i + 2] * kmax[i + 2] + qneg[i + 2] * kmin[i + 2];
      s3 += qpos[i + 3] * kmax[i + 3] + qneg[i + 3] * kmin[i + 3];
    }
  for (; i < d; i++)
    s0 += qpos[i] * kmax[i] + qneg[i] * kmin[i];
  return (s0 + s1) + (s2 + s3);
}

gboolean
quest_head_bounds (const QuestMeta *meta, gint32 layer, const SiftView *q, gboolean mean_query,
                   const gint64 *available, gsize n, float *out, GError **error)
{
  g_return_val_if_fail (meta != NULL && q != NULL && out != NULL, FALSE);
  if (!sift_view_check (q, "quest: q", error))
    return FALSE;
  const gint32 d = meta->head_dim, nq = q->n_heads;
  if (d != q->head_dim || nq % meta->n_kv_heads != 0 || q->n_tokens < 1)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                   "quest: q is [%d heads][%" G_GINT64_FORMAT " rows][%d dim], the model has %d kv heads of dim %d",
                   nq, q->n_tokens, q->head_dim, meta->n_kv_heads, d);
      return FALSE;
    }
  const gint32 group = nq / meta->n_kv_heads;
  const gint64 n_rows = mean_query ? 1 : q->n_tokens;
  const gsize n_q = (gsize) nq * (gsize) n_rows;
  g_autofree float *rows = g_new0 (float, n_q * (gsize) d); /* [nq][n_rows][d] */
  g_autofree float *split = g_new (float, 2 * n_q * (gsize) d); /* [nq][n_rows][2][d]: positive, negative part */
  g_autofree float *tmp = g_new (float, d);
  for (gint32 h = 0; h < nq; h++)
    for (gint64 t = 0; t < q->n_tokens; t++)
      {
        float *dst = rows + ((gsize) h * (gsize) n_rows + (gsize) (mean_query ? 0 : t)) * (gsize) d;
        if (!mean_query)
          {
            sift_view_row_to_f32 (q, h, t, dst);
            continue;
          }
        sift_view_row_to_f32 (q, h, t, tmp);
        for (gint32 i = 0; i < d; i++)
          dst[i] += tmp[i] / (float) q->n_tokens;
      }
  for (gsize r = 0; r < n_q; r++)
    for (gint32 i = 0; i < d; i++)
      {
        float x = rows[r * (gsize) d + (gsize) i];
        split[(2 * r) * (gsize) d + (gsize) i] = x > 0.0f ? x : 0.0f;
        split[(2 * r + 1) * (gsize) d + (gsize) i] = x > 0.0f ? 0.0f : x;
      }

  for (gsize b = 0; b < n; b++)
    {
      const float *box = quest_meta_block (meta, layer, available[b]);
      if (box == NULL)
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                       "quest: no key bounds for block %" G_GINT64_FORMAT " of layer %d "
                       "(its offload hook never ran for this policy)",
                       available[b], layer);
          return FALSE;
        }
      for (gint32 h = 0; h < nq; h++)
        {
          const float *kmin = box + (gsize) (h / group) * d;
          const float *kmax = kmin + (gsize) meta->n_kv_heads * d;
          float best = -INFINITY;
          for (gint64 t = 0; t < n_rows; t++)
            {
              const float *qp = split + (2 * ((gsize) h * (gsize) n_rows + (gsize) t)) * (gsize) d;
              best = fmaxf (best, bound_split (qp, qp + d, kmin, kmax, d));
            }
          out[(gsize) h * n + b] = best;
        }
    }
  return TRUE;
}

gint32
quest_n_rankings (QuestMode mode, gint32 n_q_heads, gint32 n_kv_heads)
{
  return mode == QUEST_MODE_SHARED ? 1 : mode == QUEST_MODE_PER_Q_HEAD ? n_q_heads : n_kv_heads;
}

void
quest_rank (const float *head_bounds, gint32 n_q_heads, gint32 n_kv_heads, gsize n, QuestMode mode,
            QuestReduce reduce, float *out)
{
  g_return_if_fail (head_bounds != NULL && out != NULL && n_kv_heads > 0 && n_q_heads % n_kv_heads == 0);
  const gint32 n_rank = quest_n_rankings (mode, n_q_heads, n_kv_heads);
  const gint32 per = n_q_heads / n_rank; /* query heads reduced into one ranking */
  for (gint32 r = 0; r < n_rank; r++)
    for (gsize b = 0; b < n; b++)
      {
        float acc = reduce == QUEST_REDUCE_MAX ? -INFINITY : 0.0f;
        for (gint32 h = r * per; h < (r + 1) * per; h++)
          {
            float s = head_bounds[(gsize) h * n + b];
            acc = reduce == QUEST_REDUCE_MAX ? fmaxf (acc, s) : acc + s / (float) per;
          }
        out[(gsize) r * n + b] = acc;
      }
}
