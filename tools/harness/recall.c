/* Needle recall: whether the blocks a policy attended held the needle's
 * tokens, per phase, layer and query head (docs/needle.md). */
#include <math.h>

#include "harness.h"

void
harness_recall_init (HarnessRecall *r, const SiftModelShape *shape)
{
  *r = (HarnessRecall) { .n_layers = shape->n_layers, .n_q_heads = shape->n_q_heads };
  r->head_covered = g_new0 (guint64, 2 * (gsize) shape->n_layers * shape->n_q_heads);
  r->head_asked = g_new0 (guint64, 2 * (gsize) shape->n_layers * shape->n_q_heads);
}

void
harness_recall_clear (HarnessRecall *r)
{
  g_clear_pointer (&r->head_covered, g_free);
  g_clear_pointer (&r->head_asked, g_free);
}

gboolean
harness_policy_is_dense (SiftPolicy *p, SiftPhase phase)
{
  if (p == NULL)
    return TRUE;
  gboolean custom = (phase == SIFT_PHASE_PREFILL ? p->ops->compute_chunked_prefill
                                                 : p->ops->compute_chunked_decode) != NULL;
  return !custom && (p->ops->flags & SIFT_POLICY_REQUIRES_BLOCK_SELECTION) == 0;
}

/* The stored block of the call's layer holding position p, or -1 when a
 * bounded cache evicted it (blocks may hold non-consecutive positions then). */
static gint64
stored_block (const SiftPolicyContext *ctx, gint64 p)
{
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    {
      const gint64 *pos = sift_engine_block_positions (ctx->engine, ctx->layer, b);
      if (pos[0] > p || pos[ctx->blocks[b].n_valid - 1] < p)
        continue;
      for (gint32 t = 0; t < ctx->blocks[b].n_valid; t++)
        if (pos[t] == p)
          return b;
    }
  return -1;
}

void
harness_recall_count (HarnessRecall *r, const SiftPolicyContext *ctx, const SiftSelection *sel,
                      const gint64 *positions, gsize n)
{
  int ph = ctx->phase == SIFT_PHASE_DECODE;
  for (gsize i = 0; i < n; i++)
    {
      /* Tokens still in the local buffer are attended anyway; evicted ones are lost. */
      gboolean local = positions[i] >= ctx->kv_len;
      gint64 block = local ? -1 : stored_block (ctx, positions[i]);
      for (gint32 h = 0; h < r->n_q_heads; h++)
        {
          gsize at = ((gsize) ph * r->n_layers + ctx->layer) * r->n_q_heads + h;
          r->asked[ph]++;
          r->head_asked[at]++;
          if (local || (block >= 0 && (sel == NULL || sift_selection_has (sel, block, h))))
            {
              r->covered[ph]++;
              r->head_covered[at]++;
            }
        }
    }
}

gboolean
harness_recall_selects (const HarnessRecall *r)
{
  return r->selection_calls[0] + r->selection_calls[1] + r->unknown_calls[0] + r->unknown_calls[1] > 0;
}

static double
ratio (guint64 a, guint64 b)
{
  return b > 0 ? (double) a / (double) b : NAN;
}

static char *
recall_note (const HarnessRecall *r)
{
  GString *s = g_string_new ("");
  const char *names[] = { "prefill", "decode" };
  for (int ph = 0; ph < 2; ph++)
    if (r->unknown_calls[ph] > 0)
      g_string_append_printf (s, "%s%s: %" G_GUINT64_FORMAT " layer calls computed attention their own way"
                              " without a block selection (not counted)", s->len ? "; " : "", names[ph],
                              r->unknown_calls[ph]);
  if (s->len == 0)
    g_string_append (s, "from validated selections; dense layers cover every block");
  return g_string_free (s, FALSE);
}

void
harness_recall_finish (const HarnessRecall *r, gboolean bounded, HarnessCell *cell)
{
  /* A phase without any selection over an unbounded cache has no recall
   * to speak of (dense layers alone would read 100%); under a bounded
   * cache recall still tells what eviction kept. */
  cell->prefill_recall = r->selection_calls[0] > 0 || bounded ? ratio (r->covered[0], r->asked[0]) : NAN;
  cell->decode_recall = r->selection_calls[1] > 0 || bounded ? ratio (r->covered[1], r->asked[1]) : NAN;
  gint32 L = r->n_layers, H = r->n_q_heads;
  cell->n_layers = L;
  cell->n_q_heads = H;
  cell->recall_by_layer = g_new (double, 2 * (gsize) L);
  cell->recall_by_head = g_new (double, 2 * (gsize) L * H);
  for (gsize i = 0; i < 2 * (gsize) L; i++)
    {
      guint64 covered = 0, asked = 0;
      for (gsize h = 0; h < (gsize) H; h++)
        {
          gsize at = i * (gsize) H + h;
          cell->recall_by_head[at] = ratio (r->head_covered[at], r->head_asked[at]);
          covered += r->head_covered[at];
          asked += r->head_asked[at];
        }
      cell->recall_by_layer[i] = ratio (covered, asked);
    }
  cell->recall_note = recall_note (r);
}

void
harness_recall_selected (HarnessRecall *r, const SiftPolicyContext *ctx, const SiftSelection *sel,
                         const gint64 *positions, gsize n)
{
  harness_recall_count (r, ctx, sel, positions, n);
  r->selection_calls[ctx->phase == SIFT_PHASE_DECODE]++;
}

gboolean
harness_recall_unselected (HarnessRecall *r, SiftPolicy *const *policies, const SiftPolicyContext *ctx,
                           const gint64 *positions, gsize n)
{
  gboolean dense = harness_policy_is_dense (policies[ctx->layer], ctx->phase);
  if (dense)
    harness_recall_count (r, ctx, NULL, positions, n);
  else
    r->unknown_calls[ctx->phase == SIFT_PHASE_DECODE]++;
  return dense;
}
