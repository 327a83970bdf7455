/* XAttention's threshold selection of key blocks per query block and the
 * aggregation of the per-head selections into what each head attends
 * (docs/policies/xattn_bsa.md); the scoring is in xattn-score.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sift/plugin.h>

#include "xattn-score.h"

/* ---- Threshold selection -------------------------------------------------- */

static int
cmp_desc (const void *a, const void *b, void *user_data)
{
  const float *row = user_data;
  gint64 x = *(const gint64 *) a, y = *(const gint64 *) b;
  if (row[x] != row[y])
    return row[x] > row[y] ? -1 : 1;
  return x < y ? -1 : x > y;
}

void
xattn_select_row (const float *row, gint64 n_kb, gint64 qb, double threshold, guint8 *selected,
                  gint64 *order)
{
  memset (selected, 0, (gsize) n_kb);
  gint64 last = MIN (qb, n_kb - 1);
  if (last < 0)
    return;
  if (threshold >= 1.0)
    {
      memset (selected, 1, (gsize) last + 1);
      return;
    }
  double total = 0.0;
  for (gint64 kb = 0; kb <= last; kb++)
    total += row[kb];
  const double required = threshold * total;

  selected[0] = 1;
  selected[last] = 1;
  double mass = row[0] + (last > 0 ? row[last] : 0.0);
  gint64 n = 0;
  for (gint64 kb = 1; kb < last; kb++)
    order[n++] = kb;
  qsort_r (order, (size_t) n, sizeof (gint64), cmp_desc, (void *) row);
  for (gint64 i = 0; i < n && mass < required; i++)
    {
      selected[order[i]] = 1;
      mass += row[order[i]];
    }
}

void
xattn_select_exact_rows (const float *mass, gint32 n_q_heads, gint64 n_rows, gint64 pos0, gint64 block,
                         gint64 qb0, gint64 n_qb, gint64 n_kb, double threshold, guint8 *sel)
{
  g_autofree gint64 *order = g_new (gint64, (gsize) MAX (n_kb, 1));
  g_autofree guint8 *mine = g_new (guint8, (gsize) MAX (n_kb, 1));
  for (gint32 h = 0; h < n_q_heads; h++)
    for (gint64 i = 0; i < n_rows; i++)
      {
        gint64 qb = (pos0 + i) / block;
        g_return_if_fail (qb >= qb0 && qb < qb0 + n_qb);
        xattn_select_row (mass + ((gsize) h * (gsize) n_rows + (gsize) i) * (gsize) n_kb, n_kb, qb, threshold,
                          mine, order);
        guint8 *dst = sel + ((gsize) h * (gsize) n_qb + (gsize) (qb - qb0)) * (gsize) n_kb;
        for (gint64 kb = 0; kb < n_kb; kb++)
          dst[kb] |= mine[kb];
      }
}

/* ---- Aggregation ---------------------------------------------------------- */

void
xattn_plan_init (XattnPlan *plan, gint32 n_q_heads, gint64 n_qb, gint64 n)
{
  plan->n = n;
  plan->n_qb = n_qb;
  plan->load = g_new0 (guint8, (gsize) MAX (n, 1));
  plan->attend = g_new0 (guint8, (gsize) n_q_heads * (gsize) MAX (n, 1));
  plan->qb_attend = g_new0 (guint8, (gsize) MAX (n_qb, 1) * (gsize) n_q_heads * (gsize) MAX (n, 1));
  plan->votes = g_new0 (gint64, (gsize) MAX (n, 1));
}

void
xattn_plan_clear (XattnPlan *plan)
{
  g_clear_pointer (&plan->load, g_free);
  g_clear_pointer (&plan->attend, g_free);
  g_clear_pointer (&plan->qb_attend, g_free);
  g_clear_pointer (&plan->votes, g_free);
  plan->n = 0;
  plan->n_qb = 0;
}

void
xattn_aggregate (const XattnGeometry *geo, const guint8 *sel, gint64 n_qb, gint64 n_kb,
                 const SiftBlockMeta *meta, const gint64 *ids, gint64 n_ids, XattnVote vote,
                 double vote_threshold, gboolean last_block, XattnPlan *plan)
{
  const gint32 H = geo->n_q_heads, group = geo->n_q_heads / geo->n_kv_heads;
  g_return_if_fail (plan->n == n_ids && plan->n_qb == n_qb);
  const gsize per_qb = (gsize) H * (gsize) n_ids;
  memset (plan->load, 0, (gsize) n_ids);
  memset (plan->attend, 0, per_qb);
  memset (plan->qb_attend, 0, per_qb * (gsize) n_qb);
  memset (plan->votes, 0, (gsize) n_ids * sizeof (gint64));
  if (n_ids == 0)
    return;

  /* Key blocks each engine block overlaps: [kb_lo, kb_hi]. */
  g_autofree gint64 *kb_lo = g_new (gint64, (gsize) n_ids);
  g_autofree gint64 *kb_hi = g_new (gint64, (gsize) n_ids);
  for (gint64 e = 0; e < n_ids; e++)
    {
      const SiftBlockMeta *m = &meta[ids[e]];
      kb_lo[e] = m->first_token / geo->block;
      kb_hi[e] = MIN ((m->first_token + MAX (m->n_valid, 1) - 1) / geo->block, n_kb - 1);
    }

  g_autofree guint8 *group_pick = g_new (guint8, (gsize) n_ids);
  for (gint32 kvh = 0; kvh < geo->n_kv_heads; kvh++)
    for (gint64 qb = 0; qb < n_qb; qb++)
      {
        memset (group_pick, 0, (gsize) n_ids);
        for (gint32 h = kvh * group; h < (kvh + 1) * group; h++)
          {
            const guint8 *row = sel + ((gsize) h * (gsize) n_qb + (gsize) qb) * (gsize) n_kb;
            for (gint64 e = 0; e < n_ids; e++)
              for (gint64 kb = kb_lo[e]; kb <= kb_hi[e]; kb++)
                if (row[kb])
                  {
                    group_pick[e] = 1;
                    plan->attend[(gsize) h * (gsize) n_ids + (gsize) e] = 1;
                    plan->qb_attend[(gsize) qb * per_qb + (gsize) h * (gsize) n_ids + (gsize) e] = 1;
                    break;
                  }
          }
        for (gint64 e = 0; e < n_ids; e++)
          plan->votes[e] += group_pick[e];
      }

  const double needed = vote_threshold * (double) geo->n_kv_heads * (double) n_qb;
  for (gint64 e = 0; e < n_ids; e++)
    plan->load[e] = vote == XATTN_VOTE_ANY ? plan->votes[e] > 0 : (double) plan->votes[e] > needed;
  /* The first block holds key block 0, the sink every selection keeps. */
  plan->load[0] = 1;
  const gint64 last = last_block ? n_ids - 1 : 0;
  plan->load[last] = 1;

  /* attend and qb_attend so far hold "head chose it"; keep what is loaded,
   * and give the always-loaded first (and with last_block the last) block
   * to every head. */
  for (gint64 row = 0; row < H * (n_qb + 1); row++)
    {
      guint8 *a = row < H ? plan->attend + (gsize) row * (gsize) n_ids
                          : plan->qb_attend + (gsize) (row - H) * (gsize) n_ids;
      for (gint64 e = 0; e < n_ids; e++)
        a[e] = plan->load[e] && (a[e] || e == 0 || e == last);
    }
}
