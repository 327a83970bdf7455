/* Retrieval scoring: nearest value code by cosine among every code in the
 * row's context. */
#include <math.h>
#include <string.h>

#include "harness.h"

#define CODE_CHUNK 512
#define MAX_TARGETS 64

typedef struct {
  const float *o;           /* [head_dim] the output row */
  gint64 position;
  gsize row;
  gint64 targets[MAX_TARGETS];
  gsize n_targets;
  double best_other;        /* highest o . c / |c| over non-target codes */
  double target_min, target_max;
} Probe;

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

gsize
harness_score_retrieval (SiftModelSource *src, const SiftNeedlePlan *plan, const float *out, gint64 row0,
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
  g_autofree float *codes = g_new (float, CODE_CHUNK * d);
  g_autofree float *inv_norm = g_new (float, CODE_CHUNK);
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
                pr->best_other = -INFINITY;
                pr->target_min = INFINITY;
                pr->target_max = -INFINITY;
                last = MAX (last, p);
              }
          }
        /* Each code once for every probe of the group: positions stream in chunks. */
        for (gint64 c0 = 0; c0 <= last; c0 += CODE_CHUNK)
          {
            gint64 m = MIN (CODE_CHUNK, last + 1 - c0);
            for (gint64 j = 0; j < m; j++)
              {
                float *c = codes + (gsize) j * d;
                sift_model_synthetic_value_code (src, l, g, c0 + j, c);
                double nn = 0;
                for (gsize i = 0; i < d; i++)
                  nn += (double) c[i] * c[i];
                inv_norm[j] = nn > 0 ? (float) (1.0 / sqrt (nn)) : 0.0f;
              }
            for (gsize i = 0; i < n_probes; i++)
              {
                Probe *pr = &probes[i];
                gint64 end = MIN (m, pr->position + 1 - c0);
                for (gint64 j = 0; j < end; j++)
                  {
                    const float *c = codes + (gsize) j * d;
                    float dot = 0;
                    for (gsize e = 0; e < d; e++)
                      dot += pr->o[e] * c[e];
                    double sim = (double) dot * inv_norm[j];
                    if (is_target (pr, c0 + j))
                      {
                        pr->target_min = MIN (pr->target_min, sim);
                        pr->target_max = MAX (pr->target_max, sim);
                      }
                    else
                      pr->best_other = MAX (pr->best_other, sim);
                  }
              }
          }
        for (gsize i = 0; i < n_probes; i++)
          {
            const Probe *pr = &probes[i];
            double got = all_values ? pr->target_min : pr->target_max;
            if (pr->n_targets > 0 && got > pr->best_other)
              hits[pr->row]++;
          }
      }
  return pairs;
}
