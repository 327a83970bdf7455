/* Vertical-slash pattern estimation (MInference, Jiang et al. 2024, §3.2):
 * the last rows' softmax attention summed per key column and per diagonal.
 *
 * Keys stream in blocks, so the softmax cannot be normalised while the
 * block is at hand: pass 1 finds each row's log-sum-exp with an online
 * max, pass 2 recomputes the scores and adds the exact probabilities
 * e^(s - lse). Two passes over K for r <= 64 rows cost a small fraction of
 * the sparse attention itself and keep memory at O(n_keys) per head,
 * where holding the r x n score matrix would not. */
#include <math.h>
#include <string.h>

#include <sift/plugin.h>

#include "vs.h"

struct _VsEstimator {
  gint32 n_q_heads, n_kv_heads, d;
  float scale;
  gint32 r;              /* estimation rows */
  gint64 p0, n_keys;
  float *q;              /* [n_q_heads][r][d], pre-scaled */
  float *m, *l, *lse;    /* [n_q_heads][r] */
  float *vertical;       /* [n_q_heads][n_keys] */
  float *slash;          /* [n_q_heads][n_keys] */
  gsize cap_rows, cap_keys;
  gboolean lse_ready;    /* lse computed from m, l after pass 1 */
  float *kbuf;           /* f32 copy of a non-f32 block */
  gsize kbuf_cap;
};

VsEstimator *
vs_estimator_new (gint32 n_q_heads, gint32 n_kv_heads, gint32 head_dim, float scale)
{
  g_return_val_if_fail (n_q_heads > 0 && n_kv_heads > 0 && n_q_heads % n_kv_heads == 0, NULL);
  g_return_val_if_fail (head_dim > 0, NULL);
  VsEstimator *e = g_new0 (VsEstimator, 1);
  e->n_q_heads = n_q_heads;
  e->n_kv_heads = n_kv_heads;
  e->d = head_dim;
  e->scale = scale;
  return e;
}

void
vs_estimator_free (VsEstimator *e)
{
  if (e == NULL)
    return;
  g_free (e->q);
  g_free (e->m);
  g_free (e->l);
  g_free (e->lse);
  g_free (e->vertical);
  g_free (e->slash);
  g_free (e->kbuf);
  g_free (e);
}

void
vs_estimator_begin (VsEstimator *e, const SiftView *q, gint64 p0, gint64 n_keys)
{
  g_return_if_fail (q->dtype == SIFT_DTYPE_F32 && q->n_heads == e->n_q_heads && q->head_dim == e->d);
  g_return_if_fail (q->n_tokens > 0 && p0 >= 0 && n_keys >= p0 + q->n_tokens);
  const gint32 r = (gint32) q->n_tokens;
  const gsize rows = (gsize) e->n_q_heads * r;
  if (rows > e->cap_rows)
    {
      e->q = g_renew (float, e->q, rows * e->d);
      e->m = g_renew (float, e->m, rows);
      e->l = g_renew (float, e->l, rows);
      e->lse = g_renew (float, e->lse, rows);
      e->cap_rows = rows;
    }
  const gsize keys = (gsize) e->n_q_heads * n_keys;
  if (keys > e->cap_keys)
    {
      g_free (e->vertical);
      g_free (e->slash);
      e->vertical = g_new (float, keys);
      e->slash = g_new (float, keys);
      e->cap_keys = keys;
    }
  e->r = r;
  e->p0 = p0;
  e->n_keys = n_keys;
  for (gint32 h = 0; h < e->n_q_heads; h++)
    for (gint32 i = 0; i < r; i++)
      {
        const float *src = sift_view_row (q, h, i);
        float *dst = e->q + ((gsize) h * r + i) * e->d;
        for (gint32 c = 0; c < e->d; c++)
          dst[c] = src[c] * e->scale;
      }
  for (gsize i = 0; i < rows; i++)
    {
      e->m[i] = -INFINITY;
      e->l[i] = 0.0f;
      e->lse[i] = -INFINITY;
    }
  e->lse_ready = FALSE;
  memset (e->vertical, 0, keys * sizeof (float));
  memset (e->slash, 0, keys * sizeof (float));
}

typedef struct {
  VsEstimator *e;
  const SiftView *k;  /* f32 */
  gint64 key0;
  int pass;
} PassJob;

/* One query head over one key block, VS_KEY_GROUP keys at a time. */
static void
pass_head (const PassJob *job, gint32 h)
{
  VsEstimator *e = job->e;
  const gint32 r = e->r, d = e->d;
  const gint32 g = h / (e->n_q_heads / e->n_kv_heads);
  const float *q = e->q + (gsize) h * r * d;
  float *m = e->m + (gsize) h * r, *l = e->l + (gsize) h * r, *lse = e->lse + (gsize) h * r;
  float *vert = e->vertical + (gsize) h * e->n_keys, *slash = e->slash + (gsize) h * e->n_keys;
  const float *krow[VS_KEY_GROUP];
  g_autofree float *sc = g_new (float, (gsize) r * VS_KEY_GROUP);
  const gint64 n = job->k->n_tokens;

  for (gint64 j0 = 0; j0 < n; j0 += VS_KEY_GROUP)
    {
      gint32 nk = (gint32) MIN (VS_KEY_GROUP, n - j0);
      gint64 first = job->key0 + j0;
      if (first > e->p0 + r - 1)
        break; /* no estimation row sees these keys */
      for (gint32 kk = 0; kk < nk; kk++)
        krow[kk] = sift_view_row (job->k, g, j0 + kk);
      vs_scores (q, r, d, krow, nk, sc);
      for (gint32 i = 0; i < r; i++)
        {
          const gint64 pos = e->p0 + i;
          const gint32 vis = (gint32) CLAMP (pos - first + 1, 0, nk); /* causal */
          const float *si = sc + (gsize) i * VS_KEY_GROUP;
          if (vis == 0)
            continue;
          if (job->pass == 1)
            {
              /* Online log-sum-exp: keep every exponent <= 0. */
              float mx = si[0];
              for (gint32 kk = 1; kk < vis; kk++)
                mx = MAX (mx, si[kk]);
              float mn = MAX (m[i], mx);
              float sum = l[i] * expf (m[i] - mn);
              for (gint32 kk = 0; kk < vis; kk++)
                sum += expf (si[kk] - mn);
              m[i] = mn;
              l[i] = sum;
            }
          else
            for (gint32 kk = 0; kk < vis; kk++)
              {
                float p = expf (si[kk] - lse[i]);
                vert[first + kk] += p;
                slash[pos - (first + kk)] += p;
              }
        }
    }
}

static void
pass_range (gint64 begin, gint64 end, gint worker, gpointer data)
{
  (void) worker;
  for (gint64 h = begin; h < end; h++)
    pass_head (data, (gint32) h);
}

static void
run_pass (VsEstimator *e, const SiftView *k, gint64 key0, int pass)
{
  g_return_if_fail (k->n_heads == e->n_kv_heads && k->head_dim == e->d);
  g_return_if_fail (key0 >= 0 && key0 + k->n_tokens <= e->n_keys);
  SiftView kf = vs_view_f32 (k, &e->kbuf, &e->kbuf_cap);
  PassJob job = { e, &kf, key0, pass };
  sift_parallel_for (e->n_q_heads, 1, pass_range, &job);
}

void
vs_estimator_pass1 (VsEstimator *e, const SiftView *k, gint64 key0)
{
  run_pass (e, k, key0, 1);
}

static void
finish_pass1 (VsEstimator *e)
{
  if (e->lse_ready)
    return;
  for (gsize i = 0; i < (gsize) e->n_q_heads * e->r; i++)
    e->lse[i] = e->l[i] > 0.0f ? e->m[i] + logf (e->l[i]) : -INFINITY;
  e->lse_ready = TRUE;
}

void
vs_estimator_pass2 (VsEstimator *e, const SiftView *k, gint64 key0)
{
  finish_pass1 (e);
  run_pass (e, k, key0, 2);
}

const float *
vs_estimator_vertical (const VsEstimator *e, gint32 h)
{
  return e->vertical + (gsize) h * e->n_keys;
}

const float *
vs_estimator_slash (const VsEstimator *e, gint32 h)
{
  return e->slash + (gsize) h * e->n_keys;
}

const float *
vs_estimator_lse (VsEstimator *e)
{
  finish_pass1 (e);
  return e->lse;
}

/* ---- Selection ------------------------------------------------------------ */

gsize
vs_select_top (const float *score, gint64 n, gint64 k, gint64 n_forced, gint64 *out)
{
  if (n <= 0)
    return 0;
  n_forced = CLAMP (n_forced, 0, n);
  k = CLAMP (MAX (k, n_forced), 0, n);
  g_autofree guint8 *keep = g_new (guint8, n);
  sift_top_k (score, (gsize) n, (gsize) k, (gsize) n_forced, 0, keep);
  gsize n_out = 0;
  for (gint64 i = 0; i < n; i++)
    if (keep[i])
      out[n_out++] = i;
  return n_out;
}

void
vs_sizes (gint64 n, gint64 vertical_size, gint64 slash_size, double budget, gint64 num_sink,
          gint64 num_recent, gint64 *n_vertical, gint64 *n_slash)
{
  gint64 v = vertical_size, s = slash_size;
  if (budget > 0.0)
    {
      double b = budget * (double) n;
      v = (gint64) MAX (31.0, 0.2 * b);
      s = (gint64) MAX (101.0, 0.8 * b);
    }
  *n_vertical = MIN (n, MAX (v, num_sink));
  *n_slash = MIN (n, MAX (s, num_recent));
}
