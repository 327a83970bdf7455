/* Needle plans: where needles, distractors and the question go (RULER-style
 * single, multikey, multivalue, multiquery). */
#include <math.h>
#include <string.h>

#include <sift/error.h>
#include <sift/config.h>

#include "needle-plan.h"

/* Cosine between a distractor's key and the needle key it imitates. */
#define DISTRACTOR_SIMILARITY 0.8

static int
cmp_needle (gconstpointer a, gconstpointer b)
{
  gint64 x = ((const SiftNeedle *) a)->position, y = ((const SiftNeedle *) b)->position;
  return x < y ? -1 : x > y;
}

SiftNeedlePlan *
sift_needle_plan_new (const SiftHarnessConfig *h, gint64 n_tokens, double depth, gint64 sink_tokens,
                      gint64 block_size, guint64 seed, GError **error)
{
  g_return_val_if_fail (h != NULL, NULL);
  gint64 group = 1, n_distractors = 0;
  gint32 n_keys = 1;
  switch (h->needle)
    {
    case SIFT_NEEDLE_SINGLE: break;
    case SIFT_NEEDLE_MULTIKEY: n_distractors = h->n_distractors; break;
    case SIFT_NEEDLE_MULTIVALUE: group = h->n_values; break;
    case SIFT_NEEDLE_MULTIQUERY: group = h->n_queries; n_keys = (gint32) h->n_queries; break;
    }
  if (group < 1 || n_distractors < 0 || group > 64 || n_distractors > 64)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "harness: needle group of %" G_GINT64_FORMAT " and %" G_GINT64_FORMAT
                   " distractors: each must be within [1, 64] and [0, 64]", group, n_distractors);
      return NULL;
    }
  if (!(depth >= 0.0 && depth <= 1.0) || h->question_tokens < 1)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "harness: depth %g must be within [0, 1] and question_tokens (%" G_GINT64_FORMAT ") >= 1",
                   depth, h->question_tokens);
      return NULL;
    }
  gint64 lo = sink_tokens, hi = n_tokens - h->question_tokens;
  /* The haystack must hold the group, every distractor and one free token
   * between each, so placement terminates. */
  gint64 need = group + 2 * n_distractors + 2;
  if (hi - lo < need)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "harness: a context of %" G_GINT64_FORMAT " tokens leaves %" G_GINT64_FORMAT
                   " haystack tokens after %" G_GINT64_FORMAT " sink and %" G_GINT64_FORMAT
                   " question tokens; the needles need %" G_GINT64_FORMAT,
                   n_tokens, MAX (hi - lo, 0), sink_tokens, h->question_tokens, need);
      return NULL;
    }

  SiftNeedlePlan *plan = g_new0 (SiftNeedlePlan, 1);
  plan->kind = h->needle;
  plan->n_tokens = n_tokens;
  plan->question_tokens = h->question_tokens;
  plan->question_start = hi;
  plan->depth = depth;
  plan->n_keys = n_keys;
  plan->distractor_similarity = DISTRACTOR_SIMILARITY;
  plan->n_needles = (gsize) (group + n_distractors);
  plan->needles = g_new0 (SiftNeedle, plan->n_needles);

  /* The group is contiguous; depth places its first token, over the
   * interior blocks when they can hold it (docs/needle.md, "Depths"). */
  gint64 span_lo = lo, span_hi = hi;
  if (block_size > 0 && h->depth_span == SIFT_DEPTH_INTERIOR)
    {
      gint64 in_lo = MAX (lo, block_size), in_hi = (hi - 1) / block_size * block_size;
      if (in_hi - in_lo >= group)
        {
          span_lo = in_lo;
          span_hi = in_hi;
        }
    }
  gint64 first = span_lo + (gint64) llround (depth * (double) (span_hi - span_lo - group));
  for (gint64 i = 0; i < group; i++)
    plan->needles[i] = (SiftNeedle) {
      .position = first + i,
      .key = h->needle == SIFT_NEEDLE_MULTIQUERY ? (gint32) i : 0,
      .distractor = -1,
    };
  /* Distractors anywhere else in the haystack, not touching a planted token. */
  GRand *rand = g_rand_new_with_seed_array ((const guint32[]) { (guint32) seed, (guint32) (seed >> 32),
                                                                (guint32) n_tokens, 0x44495354u }, 4);
  for (gint64 d = 0; d < n_distractors; d++)
    {
      gint64 p;
      gboolean clash;
      do
        {
          p = g_rand_int_range (rand, (gint32) lo, (gint32) hi);
          clash = FALSE;
          for (gint64 i = 0; i < group + d && !clash; i++)
            clash = llabs (plan->needles[i].position - p) <= 1;
        }
      while (clash);
      plan->needles[group + d] = (SiftNeedle) { .position = p, .key = 0, .distractor = (gint32) d };
    }
  g_rand_free (rand);
  qsort (plan->needles, plan->n_needles, sizeof (SiftNeedle), cmp_needle);
  return plan;
}
