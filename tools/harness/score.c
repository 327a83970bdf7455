/* Retrieval scoring: which value codes of the row's context does an
 * attention output carry? One needle: the code nearest by cosine.
 * Multivalue: k codes picked by orthogonal matching pursuit (nearest code,
 * its part removed from the output, again), which separates a mixture of k
 * codes where plain nearest-k would confuse the mixture's crosstalk with a
 * match. */
#include <math.h>
#include <string.h>

#include "harness.h"

#define MAX_TARGETS 64

typedef struct {
  const float *o;           /* [head_dim] the output row */
  gint64 position;
  gsize row;
  gint64 targets[MAX_TARGETS];
  gsize n_targets;
} Probe;

/* Value codes of one (layer, kv head) for positions [0, n), unit length. */
typedef struct {
  float *unit;              /* [n][head_dim] */
  gint64 n;
} Codes;

static gboolean
is_target (const Probe *p, gint64 j)
{
  for (gsize t = 0; t < p->n_targets; t++)
    if (p->targets[t] == j)
      return TRUE;
  return FALSE;
}

/* log C(n, k) */
static double
log_choose (double n, double k)
{
  return lgamma (n + 1) - lgamma (k + 1) - lgamma (n - k + 1);
}

static double
dot (const float *a, const float *b, gsize d)
{
  double s = 0;
  for (gsize i = 0; i < d; i++)
    s += (double) a[i] * b[i];
  return s;
}

/* The position in [0, p] (not in taken[0..n_taken)) whose code has the
 * largest projection on r. */
static gint64
nearest (const Codes *c, const double *r, gint64 p, gsize d, const gint64 *taken, gsize n_taken)
{
  gint64 best = -1;
  double best_v = -INFINITY;
  for (gint64 j = 0; j <= p && j < c->n; j++)
    {
      const float *u = c->unit + (gsize) j * d;
      double v = 0;
      for (gsize i = 0; i < d; i++)
        v += r[i] * u[i];
      if (v <= best_v)
        continue;
      gboolean used = FALSE;
      for (gsize t = 0; t < n_taken && !used; t++)
        used = taken[t] == j;
      if (!used)
        {
          best_v = v;
          best = j;
        }
    }
  return best;
}

/* Picks as many codes as the probe has targets, each time the one nearest
 * to what the earlier picks leave unexplained (the output minus its
 * projection on their span); a hit when the picks are exactly the targets. */
static gboolean
pursuit_hits (const Probe *pr, const Codes *c, gsize d)
{
  g_autofree double *r = g_new (double, d);
  g_autofree double *basis = g_new (double, pr->n_targets * d); /* orthonormal span of the picks */
  gint64 picked[MAX_TARGETS];
  for (gsize i = 0; i < d; i++)
    r[i] = pr->o[i];
  for (gsize k = 0; k < pr->n_targets; k++)
    {
      picked[k] = nearest (c, r, pr->position, d, picked, k);
      if (picked[k] < 0 || !is_target (pr, picked[k]))
        return FALSE;
      double *q = basis + k * d;
      const float *u = c->unit + (gsize) picked[k] * d;
      for (gsize i = 0; i < d; i++)
        q[i] = u[i];
      for (gsize b = 0; b < k; b++)
        {
          const double *qb = basis + b * d;
          double a = 0;
          for (gsize i = 0; i < d; i++)
            a += q[i] * qb[i];
          for (gsize i = 0; i < d; i++)
            q[i] -= a * qb[i];
        }
      double nq = 0;
      for (gsize i = 0; i < d; i++)
        nq += q[i] * q[i];
      nq = sqrt (nq);
      if (nq < 1e-9)
        return FALSE;
      double a = 0;
      for (gsize i = 0; i < d; i++)
        {
          q[i] /= nq;
          a += r[i] * q[i];
        }
      for (gsize i = 0; i < d; i++)
        r[i] -= a * q[i];
    }
  return TRUE;
}

/* One needle: the asked needle's code beats every other code. */
static gboolean
nearest_hits (const Probe *pr, const Codes *c, gsize d)
{
  double target = -INFINITY, other = -INFINITY;
  for (gint64 j = 0; j <= pr->position && j < c->n; j++)
    {
      double v = dot (pr->o, c->unit + (gsize) j * d, d);
      if (is_target (pr, j))
        target = MAX (target, v);
      else
        other = MAX (other, v);
    }
  return pr->n_targets > 0 && target > other;
}

static void
codes_fill (SiftModel *src, gint32 layer, gint32 kv_head, gint64 n, Codes *c)
{
  gsize d = (gsize) src->shape.head_dim;
  c->n = n;
  c->unit = g_new (float, (gsize) n * d);
  for (gint64 j = 0; j < n; j++)
    {
      float *u = c->unit + (gsize) j * d;
      sift_model_synthetic_value_code (src, layer, kv_head, j, u);
      double nn = 0;
      for (gsize i = 0; i < d; i++)
        nn += (double) u[i] * u[i];
      float inv = nn > 0 ? (float) (1.0 / sqrt (nn)) : 0.0f;
      for (gsize i = 0; i < d; i++)
        u[i] *= inv;
    }
}

gsize
harness_score_retrieval (SiftModel *src, const SiftNeedlePlan *plan, const float *out, gint64 row0,
                         gint64 n_rows, gsize *hits, double *chance)
{
  const SiftModelShape *s = &src->shape;
  gsize d = (gsize) s->head_dim, rows = (gsize) n_rows;
  gint32 group = s->n_q_heads / s->n_kv_heads;
  gboolean all_values = plan->kind == SIFT_NEEDLE_MULTIVALUE;
  memset (hits, 0, rows * sizeof (gsize));
  for (gsize r = 0; r < rows; r++)
    {
      gint64 p = row0 + (gint64) r;
      gint64 t[MAX_TARGETS];
      gsize k = sift_needle_plan_is_question (plan, p)
                  ? sift_needle_plan_targets (plan, sift_needle_plan_key_at (plan, p), t, MAX_TARGETS) : 0;
      /* Matching k specific codes out of p + 1 by luck. */
      chance[r] = k == 0 ? 0.0 : all_values ? exp (-log_choose ((double) p + 1, (double) k)) : 1.0 / (double) (p + 1);
    }

  gsize pairs = 0;
  g_autofree Probe *probes = g_new0 (Probe, (gsize) group * rows);
  for (gint32 l = 0; l < s->n_layers; l++)
    for (gint32 g = 0; g < s->n_kv_heads; g++)
      {
        gsize n_probes = 0;
        gint64 last = -1;
        for (gint32 h = g * group; h < (g + 1) * group; h++)
          {
            if (!sift_model_synthetic_is_retrieval_head (src, l, h))
              continue;
            pairs++;
            for (gsize r = 0; r < rows; r++)
              {
                gint64 p = row0 + (gint64) r;
                if (!sift_needle_plan_is_question (plan, p))
                  continue;
                Probe *pr = &probes[n_probes++];
                pr->o = out + (((gsize) l * s->n_q_heads + h) * rows + r) * d;
                pr->position = p;
                pr->row = r;
                pr->n_targets = sift_needle_plan_targets (plan, sift_needle_plan_key_at (plan, p), pr->targets,
                                                          MAX_TARGETS);
                last = MAX (last, p);
              }
          }
        if (n_probes == 0)
          continue;
        /* Every probe of the group reads the same codes: make them once. */
        Codes codes;
        codes_fill (src, l, g, last + 1, &codes);
        for (gsize i = 0; i < n_probes; i++)
          {
            const Probe *pr = &probes[i];
            if (pr->n_targets > 0
                && (all_values ? pursuit_hits (pr, &codes, d) : nearest_hits (pr, &codes, d)))
              hits[pr->row]++;
          }
        g_free (codes.unit);
      }
  return pairs;
}
