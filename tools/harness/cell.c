/* One cell of the grid: plant needles, prefill and decode through the
 * engine with the setup's policies, then score (docs/needle.md). */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "harness.h"

/* What the runner's observer fills while a cell runs. */
typedef struct {
  const SiftModelShape *shape;
  const SiftNeedlePlan *plan;
  SiftModel *src;
  gint64 row0, n_rows;       /* question rows: prompt's last tokens, then decode steps */
  float *out;                /* [n_layers][n_q_heads][n_rows][head_dim] */
  gboolean *seen;            /* [n_rows] every layer's output captured */
  gint32 *seen_layers;       /* [n_rows] */
  HarnessRecall recall;
  gint64 *targets;           /* [n_targets] needle positions (not distractors) */
  gsize n_targets;
  HarnessCalls *calls;       /* question calls, for the random baseline */
  gboolean selection_seen;   /* for the layer call in progress */
  SiftPolicy **prefill, **decode; /* [n_layers] */
} Capture;

static gboolean
call_asks (const Capture *c, const SiftPolicyContext *ctx)
{
  return ctx->q_pos + ctx->n_q > c->row0 && ctx->q_pos < c->row0 + c->n_rows;
}

static void
on_selection (gpointer user_data, const SiftPolicyContext *ctx, const SiftSelection *selection)
{
  Capture *c = user_data;
  c->selection_seen = TRUE;
  if (call_asks (c, ctx))
    {
      harness_recall_selected (&c->recall, ctx, selection, c->targets, c->n_targets);
      /* A policy that computes its own way over its selection (xattn_bsa:
       * each query block attends only its own choice) attends at most the
       * selection per row, often far less: its random baseline draws at the
       * phase's measured density instead of the selection's size. */
      SiftPolicy *p = (ctx->phase == SIFT_PHASE_PREFILL ? c->prefill : c->decode)[ctx->layer];
      gboolean custom = p != NULL && (ctx->phase == SIFT_PHASE_PREFILL ? p->ops->compute_chunked_prefill
                                                                       : p->ops->compute_chunked_decode) != NULL;
      harness_calls_add (c->calls, ctx, selection, !custom);
    }
}

static void
on_attention (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse)
{
  Capture *c = user_data;
  (void) lse;
  gboolean had_selection = c->selection_seen;
  c->selection_seen = FALSE;
  if (!call_asks (c, ctx))
    return;
  if (!had_selection)
    {
      gboolean dense = harness_recall_unselected (&c->recall, ctx->phase == SIFT_PHASE_PREFILL ? c->prefill : c->decode,
                                                  ctx, c->targets, c->n_targets);
      harness_calls_add (c->calls, ctx, NULL, dense);
    }
  harness_capture_rows (c->shape, ctx, out, c->row0, c->n_rows, c->out, c->seen_layers);
  for (gint64 r = MAX (ctx->q_pos - c->row0, 0); r < MIN (ctx->q_pos + ctx->n_q - c->row0, c->n_rows); r++)
    if (c->seen_layers[r] == c->shape->n_layers)
      c->seen[r] = TRUE;
}

/* ||a - b|| / ||b|| over rows [r0, r1) of every layer and head. */
static double
rel_error (const SiftModelShape *s, const float *a, const float *b, gint64 n_rows, gint64 r0, gint64 r1)
{
  double num = 0, den = 0;
  gsize d = (gsize) s->head_dim;
  for (gint64 lh = 0; lh < (gint64) s->n_layers * s->n_q_heads; lh++)
    for (gint64 r = r0; r < r1; r++)
      for (gsize e = 0; e < d; e++)
        {
          gsize i = ((gsize) lh * n_rows + r) * d + e;
          double x = (double) a[i] - b[i];
          num += x * x;
          den += (double) b[i] * b[i];
        }
  return den > 0 ? sqrt (num / den) : NAN;
}

static double
ratio (guint64 a, guint64 b)
{
  return b > 0 ? (double) a / (double) b : NAN;
}

gboolean
harness_run_cell (const SiftConfig *cfg, const SiftPolicySetup *setup, gint64 length, double depth,
                  HarnessCell *cell, GError **error)
{
  memset (cell, 0, sizeof *cell);
  cell->length = length;
  cell->depth = depth;
  if (g_strcmp0 (cfg->source, "synthetic") != 0)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "%s: model.source is '%s'; the needle harness needs the synthetic source (it plants the needles)",
                   cfg->file, cfg->source);
      return FALSE;
    }
  SiftModelShape shape = cfg->shape;
  const SiftHarnessConfig *h = sift_harness_config (cfg);
  const SiftSyntheticConfig *knobs = sift_synthetic_config (cfg);
  g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (h, length, depth, knobs->sink_tokens, cfg->shape.block_size,
                                                          h->seed, error);
  if (plan == NULL)
    return FALSE;
  g_autoptr (SiftModel) src = sift_model_synthetic_new (&shape, sift_synthetic_seed (cfg), knobs, plan, error);
  if (src == NULL)
    return FALSE;

  const SiftOffloadConfig *off = sift_offload_config (cfg);
  g_autofree char *store_path = off->store_path != NULL ? g_strdup (off->store_path)
                                                        : harness_store_path (cfg, "kv.store", error);
  HarnessPipeline pl = { 0 };
  gboolean ok = store_path != NULL && harness_pipeline_init (&pl, cfg, setup, src, store_path, error);
  gint32 L = shape.n_layers;
  SiftRunner *runner = pl.runner;
  SiftEngine *engine = pl.engine;

  gint64 steps = h->decode_steps;
  Capture c = {
    .shape = &shape, .plan = plan, .src = src, .row0 = plan->question_start,
    .n_rows = plan->question_tokens + steps, .prefill = pl.prefill, .decode = pl.decode,
    .calls = harness_calls_new (),
  };
  harness_recall_init (&c.recall, &shape);
  c.targets = g_new (gint64, MAX (plan->n_needles, 1));
  for (gsize i = 0; i < plan->n_needles; i++)
    if (plan->needles[i].distractor < 0)
      c.targets[c.n_targets++] = plan->needles[i].position;
  gsize plane = (gsize) L * shape.n_q_heads * (gsize) c.n_rows * shape.head_dim;
  c.out = g_new0 (float, plane);
  c.seen = g_new0 (gboolean, c.n_rows);
  c.seen_layers = g_new0 (gint32, c.n_rows);
  g_autofree float *ref = g_new0 (float, plane);
  if (ok)
    {
      SiftRunnerObserver obs = { .attention = on_attention, .selection = on_selection };
      sift_runner_set_observer (runner, &obs, &c);
      gint64 t0 = g_get_monotonic_time ();
      ok = sift_runner_prefill (runner, length, NULL, NULL, error);
      gint64 t1 = g_get_monotonic_time ();
      for (gint64 s = 0; ok && s < steps; s++)
        ok = sift_runner_decode (runner, 1, NULL, NULL, error);
      gint64 t2 = g_get_monotonic_time ();
      cell->prefill_seconds = (double) (t1 - t0) / G_USEC_PER_SEC;
      cell->decode_seconds = (double) (t2 - t1) / G_USEC_PER_SEC;
    }
  for (gint64 r = 0; ok && r < c.n_rows; r++)
    if (!c.seen[r])
      {
        g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                     "the runner reported no attention output for question row %" G_GINT64_FORMAT, c.row0 + r);
        ok = FALSE;
      }
  if (ok)
    ok = harness_dense_reference (cfg, src, length, steps, c.row0, c.n_rows, ref, error);
  if (ok)
    {
      g_autofree gsize *hits = g_new0 (gsize, c.n_rows);
      g_autofree double *chance = g_new0 (double, c.n_rows);
      gsize pairs = harness_score_retrieval (src, plan, c.out, c.row0, c.n_rows, hits, chance);
      gint64 q = plan->question_tokens;
      gsize hp = 0, hd = 0;
      for (gint64 r = 0; r < c.n_rows; r++)
        *(r < q ? &hp : &hd) += hits[r];
      cell->prefill_retrieval = pairs > 0 ? (double) hp / (double) (pairs * (gsize) q) : 0.0;
      cell->decode_retrieval = pairs > 0 && steps > 0 ? (double) hd / (double) (pairs * (gsize) steps) : NAN;
      cell->prefill_pass = cell->prefill_retrieval > 0.5;
      cell->decode_pass = steps == 0 || cell->decode_retrieval > 0.5;
      cell->pass = cell->prefill_pass && cell->decode_pass;
      cell->chance = chance[q - 1];
      cell->prefill_rel_error = rel_error (&shape, c.out, ref, c.n_rows, 0, q);
      cell->decode_rel_error = steps > 0 ? rel_error (&shape, c.out, ref, c.n_rows, q, c.n_rows) : NAN;
      harness_recall_finish (&c.recall, sift_kv_config (cfg)->capacity_tokens > 0, cell);
      cell->decode_steps = steps;
      cell->n_needle_positions = plan->n_needles;
      cell->needle_positions = g_new (gint64, MAX (plan->n_needles, 1));
      gsize k = 0;
      for (int pass = 0; pass < 2; pass++) /* needles first, then distractors */
        for (gsize i = 0; i < plan->n_needles; i++)
          if ((plan->needles[i].distractor >= 0) == pass)
            cell->needle_positions[k++] = plan->needles[i].position;
      sift_engine_counters (engine, -1, SIFT_PHASE_PREFILL, &cell->prefill_counters);
      sift_engine_counters (engine, -1, SIFT_PHASE_DECODE, &cell->decode_counters);
      cell->prefill_density = ratio (cell->prefill_counters.tokens_attended, cell->prefill_counters.tokens_available);
      cell->decode_density = ratio (cell->decode_counters.tokens_attended, cell->decode_counters.tokens_available);
      ok = harness_baseline_compute (src, plan, c.calls, (gsize) h->baseline_seeds, h->seed, cell->prefill_density,
                                     cell->decode_density, c.row0, c.n_rows, &cell->baseline, error);
    }
  harness_pipeline_clear (&pl);
  g_free (c.out);
  g_free (c.seen);
  g_free (c.seen_layers);
  g_free (c.targets);
  harness_recall_clear (&c.recall);
  harness_calls_free (c.calls);
  if (!ok)
    harness_cell_clear (cell);
  return ok;
}

void
harness_cell_clear (HarnessCell *cell)
{
  g_clear_pointer (&cell->recall_note, g_free);
  g_clear_pointer (&cell->needle_positions, g_free);
  g_clear_pointer (&cell->recall_by_layer, g_free);
  g_clear_pointer (&cell->recall_by_head, g_free);
  g_clear_pointer (&cell->generated, g_free);
  g_clear_pointer (&cell->expected, g_free);
  g_clear_pointer (&cell->needle_spans, g_free);
}
