/* Needle plans as the synthetic model reads them: which rows ask, for
 * which key, and where the answers are. The planner is the harness's
 * (tools/harness/needle-plan.c). */
#include "synthetic.h"

void
sift_needle_plan_free (SiftNeedlePlan *plan)
{
  if (plan == NULL)
    return;
  g_free (plan->needles);
  g_free (plan);
}

gboolean
sift_needle_plan_is_question (const SiftNeedlePlan *plan, gint64 p)
{
  return plan != NULL && p >= plan->question_start;
}

gint32
sift_needle_plan_key_at (const SiftNeedlePlan *plan, gint64 p)
{
  g_return_val_if_fail (plan != NULL && p >= plan->question_start, 0);
  return (gint32) ((p - plan->question_start) % plan->n_keys);
}

gsize
sift_needle_plan_targets (const SiftNeedlePlan *plan, gint32 key, gint64 *out, gsize max_out)
{
  gsize n = 0;
  for (gsize i = 0; i < plan->n_needles; i++)
    if (plan->needles[i].distractor < 0 && plan->needles[i].key == key && n < max_out)
      out[n++] = plan->needles[i].position;
  return n;
}
