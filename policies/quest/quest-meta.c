/* Quest's key boxes and bounds (quest-meta.h). */
#include <math.h>
#include <string.h>

#include "quest-meta.h"

QuestMeta *
quest_meta_new (gint32 n_layers, gint32 n_kv_heads, gint32 head_dim)
{
  QuestMeta *meta = g_new0 (QuestMeta, 1);
  *meta = (QuestMeta) { .n_layers = n_layers, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
                        .box = g_new0 (float *, n_layers), .present = g_new0 (guint8 *, n_layers),
                        .capacity = g_new0 (gint64, n_layers) };
  return meta;
}

void
quest_meta_clear (QuestMeta *meta)
{
  for (gint32 l = 0; l < meta->n_layers; l++)
    {
      g_clear_pointer (&meta->box[l], g_free);
      g_clear_pointer (&meta->present[l], g_free);
      meta->capacity[l] = 0;
    }
  meta->n_present = 0;
}

void
quest_meta_free (QuestMeta *meta)
{
  quest_meta_clear (meta);
  g_free (meta->rows);
  g_free (meta->work);
  g_free (meta->box);
  g_free (meta->present);
  g_free (meta->capacity);
  g_free (meta);
}

static gsize
box_floats (const QuestMeta *meta)
{
  return 2 * (gsize) meta->n_kv_heads * (gsize) meta->head_dim;
}

const float *
quest_meta_block (const QuestMeta *meta, gint32 layer, gint64 id)
{
  if (layer < 0 || layer >= meta->n_layers || id < 0 || id >= meta->capacity[layer] || !meta->present[layer][id])
    return NULL;
  return meta->box[layer] + (gsize) id * box_floats (meta);
}

gboolean
quest_meta_update (QuestMeta *meta, gint32 layer, gint64 id, const SiftView *k, gint32 n_valid, GError **error)
{
  const gint32 d = meta->head_dim;
  if (!sift_view_check (k, "quest: block keys", error))
    return FALSE;
  if (layer < 0 || layer >= meta->n_layers || id < 0 || k->n_heads != meta->n_kv_heads || k->head_dim != d
      || n_valid < 1 || n_valid > k->n_tokens)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                   "quest: block %" G_GINT64_FORMAT " of layer %d: keys [%d heads][%" G_GINT64_FORMAT
                   " rows][%d dim] with %d valid do not fit %d layers of [%d][..][%d]",
                   id, layer, k->n_heads, k->n_tokens, k->head_dim, n_valid, meta->n_layers, meta->n_kv_heads, d);
      return FALSE;
    }
  if (id >= meta->capacity[layer]) /* doubling: ids arrive in order */
    {
      gint64 cap = MAX (meta->capacity[layer] * 2, 64);
      while (cap <= id)
        cap *= 2;
      meta->box[layer] = g_renew (float, meta->box[layer], (gsize) cap * box_floats (meta));
      meta->present[layer] = g_renew (guint8, meta->present[layer], (gsize) cap);
      memset (meta->present[layer] + meta->capacity[layer], 0, (gsize) (cap - meta->capacity[layer]));
      meta->capacity[layer] = cap;
    }
  float *box = meta->box[layer] + (gsize) id * box_floats (meta);
  g_autofree float *row = g_new (float, d);
  for (gint32 g = 0; g < meta->n_kv_heads; g++)
    {
      float *hi = box + (gsize) g * 2 * d, *lo = hi + d;
      for (gint32 t = 0; t < n_valid; t++)
        {
          sift_view_row_to_f32 (k, g, t, row);
          for (gint32 i = 0; i < d; i++)
            {
              hi[i] = t == 0 ? row[i] : fmaxf (hi[i], row[i]);
              lo[i] = t == 0 ? row[i] : fminf (lo[i], row[i]);
            }
        }
    }
  meta->n_present += !meta->present[layer][id];
  meta->present[layer][id] = 1;
  return TRUE;
}

/* The paper's bound of q.k over every key in the box: each channel's
 * product is linear in k_i, so its maximum over [kmin_i, kmax_i] sits at an
 * end, and the channels are independent inside the box. The plain
 * reference of quest_head_bounds. */
float
quest_bound (const float *q, const float *kmin, const float *kmax, gint32 head_dim)
{
  float s = 0.0f;
  for (gint32 i = 0; i < head_dim; i++)
    s += fmaxf (q[i] * kmax[i], q[i] * kmin[i]);
  return s;
}

/* Multiply-adds below which the scoring stays on the calling thread: a
 * parallel loop costs some microseconds of waking the pool. */
#define BOUNDS_SERIAL_WORK ((gsize) 1 << 18)

static float *
grow (float **p, gsize *size, gsize want)
{
  if (*size < want)
    {
      g_free (*p);
      *p = g_new (float, want);
      *size = want;
    }
  return *p;
}

void
quest_bounds_score (const QuestBounds *a, gint32 g, gsize b0, gsize nb, gint worker)
{
  const QuestMeta *meta = a->meta;
  const gint32 d = meta->head_dim, nkv = meta->n_kv_heads, group = a->group;
  const gsize w = 2 * (gsize) d, n = a->n;
  const gint64 n_rows = a->n_rows;
  float *cols = meta->work + (gsize) worker * a->work_floats; /* [QUEST_BOUNDS_CHUNK][w], gathered boxes */
  float *dots = cols + QUEST_BOUNDS_CHUNK * w;                 /* [group * n_rows][nb] */
  const float *c = cols;
  gsize c_stride = w;
  if (a->run)
    {
      c = quest_meta_block (meta, a->layer, a->available[b0]) + (gsize) g * w;
      c_stride = (gsize) nkv * w;
    }
  else
    for (gsize b = 0; b < nb; b++)
      memcpy (cols + b * w, quest_meta_block (meta, a->layer, a->available[b0 + b]) + (gsize) g * w,
              w * sizeof (float));
  sift_score_tile (meta->rows + (gsize) g * group * n_rows * w, w, group * n_rows, c, c_stride, (gint64) nb, w, dots);
  for (gint32 hh = 0; hh < group; hh++)
    for (gsize b = 0; b < nb; b++)
      {
        float best = -INFINITY;
        for (gint64 t = 0; t < n_rows; t++)
          best = fmaxf (best, dots[((gsize) hh * n_rows + (gsize) t) * nb + b]);
        a->out[(gsize) (g * group + hh) * n + b0 + b] = best;
      }
}

/* Tasks [begin, end): task i is kv head i / n_chunks over the blocks of
 * chunk i % n_chunks. */
static void
bounds_tasks (gint64 begin, gint64 end, gint worker, gpointer data)
{
  const QuestBounds *a = data;
  for (gint64 task = begin; task < end; task++)
    {
      const gsize b0 = (gsize) (task % (gint64) a->n_chunks) * QUEST_BOUNDS_CHUNK;
      quest_bounds_score (a, (gint32) (task / (gint64) a->n_chunks), b0, MIN (QUEST_BOUNDS_CHUNK, a->n - b0), worker);
    }
}

/* max(q_i M_i, q_i m_i) is q_i M_i for q_i >= 0 and q_i m_i otherwise, so
 * with a row split into [max(q, 0) | min(q, 0)] and a box stored
 * [kmax | kmin], a bound is a dot product of 2 head_dim: one
 * sift_score_tile per kv head and chunk of blocks. */
gboolean
quest_bounds_prepare (QuestMeta *meta, gint32 layer, const SiftView *q, gboolean mean_query, const gint64 *available,
                      gsize n, float *out, QuestBounds *qb, GError **error)
{
  const gint32 d = meta->head_dim, nq = q->n_heads, nkv = meta->n_kv_heads;
  if (!sift_view_check (q, "quest: q", error))
    return FALSE;
  if (d != q->head_dim || nq % nkv != 0 || q->n_tokens < 1)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                   "quest: q is [%d heads][%" G_GINT64_FORMAT " rows][%d dim], the model has %d kv heads of dim %d",
                   nq, q->n_tokens, q->head_dim, nkv, d);
      return FALSE;
    }
  const gint32 group = nq / nkv;
  const gint64 n_rows = mean_query ? 1 : q->n_tokens;
  const gsize w = 2 * (gsize) d;
  float *rows = grow (&meta->rows, &meta->rows_size, (gsize) nq * n_rows * w); /* [nq][n_rows][max part | min part] */
  memset (rows, 0, (gsize) nq * n_rows * w * sizeof (float));
  g_autofree float *xr = g_new (float, d);
  for (gint32 h = 0; h < nq; h++)
    for (gint64 t = 0; t < q->n_tokens; t++)
      {
        float *r = rows + ((gsize) h * n_rows + (gsize) (mean_query ? 0 : t)) * w;
        sift_view_row_to_f32 (q, h, t, xr);
        for (gint32 i = 0; i < d; i++)
          r[i] += mean_query ? xr[i] / (float) q->n_tokens : xr[i];
      }
  for (gsize r = 0; r < (gsize) nq * n_rows; r++)
    for (gint32 i = 0; i < d; i++)
      {
        float *p = rows + r * w;
        p[d + i] = MIN (p[i], 0.0f);
        p[i] = MAX (p[i], 0.0f);
      }
  /* Blocks available as one run of ids (a decode step without eviction:
   * 0 .. n-1) are read in place, head g's boxes n_kv_heads * w apart;
   * otherwise each task gathers its kv head's boxes first. */
  gboolean run = n > 0;
  for (gsize b = 0; b < n; b++)
    {
      if (quest_meta_block (meta, layer, available[b]) == NULL)
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                       "quest: no key bounds for block %" G_GINT64_FORMAT " of layer %d "
                       "(its offload hook never ran for this policy)", available[b], layer);
          return FALSE;
        }
      run = run && available[b] == available[0] + (gint64) b;
    }
  *qb = (QuestBounds) { meta, layer, group, n_rows, available, n, (n + QUEST_BOUNDS_CHUNK - 1) / QUEST_BOUNDS_CHUNK,
                        QUEST_BOUNDS_CHUNK * w + (gsize) group * n_rows * QUEST_BOUNDS_CHUNK, run, out };
  grow (&meta->work, &meta->work_size, (gsize) sift_parallel_n_threads () * qb->work_floats);
  return TRUE;
}

gboolean
quest_head_bounds (QuestMeta *meta, gint32 layer, const SiftView *q, gboolean mean_query,
                   const gint64 *available, gsize n, float *out, GError **error)
{
  QuestBounds a;
  if (!quest_bounds_prepare (meta, layer, q, mean_query, available, n, out, &a, error))
    return FALSE;
  if (n == 0)
    return TRUE;
  const gint64 tasks = (gint64) meta->n_kv_heads * (gint64) a.n_chunks;
  const gsize task_work = MIN (n, (gsize) QUEST_BOUNDS_CHUNK) * 2 * (gsize) meta->head_dim * (gsize) a.group
                          * (gsize) a.n_rows;
  const gint64 grain = (gint64) MAX ((gsize) 1, BOUNDS_SERIAL_WORK / MAX (task_work, (gsize) 1));
  sift_parallel_for (tasks, grain, bounds_tasks, &a);
  return TRUE;
}
