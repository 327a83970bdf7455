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
  HarnessCalls *calls;       /* question calls, for the random baseline (NULL: not kept) */
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
      if (c->calls != NULL)
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
      if (c->calls != NULL)
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

static void
capture_init (Capture *c, const SiftModelShape *shape, SiftModel *src, const SiftNeedlePlan *plan, gint64 steps,
              HarnessPipeline *pl, gboolean keep_calls)
{
  *c = (Capture) {
    .shape = shape, .plan = plan, .src = src, .row0 = plan->question_start, .n_rows = plan->question_tokens + steps,
    .prefill = pl->prefill, .decode = pl->decode, .calls = keep_calls ? harness_calls_new () : NULL,
  };
  harness_recall_init (&c->recall, shape);
  c->targets = g_new (gint64, MAX (plan->n_needles, 1));
  for (gsize i = 0; i < plan->n_needles; i++)
    if (plan->needles[i].distractor < 0)
      c->targets[c->n_targets++] = plan->needles[i].position;
  c->out = g_new0 (float, (gsize) shape->n_layers * shape->n_q_heads * (gsize) c->n_rows * shape->head_dim);
  c->seen = g_new0 (gboolean, c->n_rows);
  c->seen_layers = g_new0 (gint32, c->n_rows);
}

static void
capture_clear (Capture *c)
{
  g_clear_pointer (&c->out, g_free);
  g_clear_pointer (&c->seen, g_free);
  g_clear_pointer (&c->seen_layers, g_free);
  g_clear_pointer (&c->targets, g_free);
  harness_recall_clear (&c->recall);
  g_clear_pointer (&c->calls, harness_calls_free);
}

/* The prompt of `length` tokens and `steps` decode steps through the
 * pipeline, every question row captured; seconds[2]: prefill, decode. */
static gboolean
capture_run (Capture *c, HarnessPipeline *pl, gint64 length, gint64 steps, double seconds[2], GError **error)
{
  SiftRunnerObserver obs = { .attention = on_attention, .selection = on_selection };
  sift_runner_set_observer (pl->runner, &obs, c);
  gint64 t0 = g_get_monotonic_time ();
  gboolean ok = sift_runner_prefill (pl->runner, length, NULL, NULL, error);
  gint64 t1 = g_get_monotonic_time ();
  for (gint64 s = 0; ok && s < steps; s++)
    ok = sift_runner_decode (pl->runner, 1, NULL, NULL, error);
  gint64 t2 = g_get_monotonic_time ();
  seconds[0] = (double) (t1 - t0) / G_USEC_PER_SEC;
  seconds[1] = (double) (t2 - t1) / G_USEC_PER_SEC;
  for (gint64 r = 0; ok && r < c->n_rows; r++)
    if (!c->seen[r])
      {
        g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                     "the runner reported no attention output for question row %" G_GINT64_FORMAT, c->row0 + r);
        ok = FALSE;
      }
  return ok;
}

/* Retrieval of the captured rows per phase (decode NAN without steps);
 * returns whether the cell passes (both phases above 1/2). */
static gboolean
capture_score (const Capture *c, double *prefill, double *decode, double *chance)
{
  g_autofree gsize *hits = g_new0 (gsize, c->n_rows);
  g_autofree double *luck = g_new0 (double, c->n_rows);
  gsize pairs = harness_score_retrieval (c->src, c->plan, c->out, c->row0, c->n_rows, hits, luck);
  gint64 q = c->plan->question_tokens, steps = c->n_rows - q;
  gsize hp = 0, hd = 0;
  for (gint64 r = 0; r < c->n_rows; r++)
    *(r < q ? &hp : &hd) += hits[r];
  *prefill = pairs > 0 ? (double) hp / (double) (pairs * (gsize) q) : 0.0;
  *decode = pairs > 0 && steps > 0 ? (double) hd / (double) (pairs * (gsize) steps) : NAN;
  if (chance != NULL)
    *chance = luck[q - 1];
  return *prefill > 0.5 && (steps == 0 || *decode > 0.5);
}

/* The random baseline of a bounded cache, once per seed: the cell again
 * with uniformly random eviction at the same capacity (and random blocks
 * at the measured density where the setup selects), scored as the cell. */
static gboolean
eviction_baseline (const SiftConfig *cfg, SiftModel *src, const SiftNeedlePlan *plan, gboolean selects,
                   HarnessCell *cell, GError **error)
{
  const SiftHarnessConfig *h = sift_harness_config (cfg);
  HarnessBaseline *b = &cell->baseline;
  memset (b, 0, sizeof *b);
  b->n_seeds = (gsize) MIN (h->baseline_seeds, HARNESS_BASELINE_MAX_SEEDS);
  b->capacity_tokens = sift_kv_config (cfg)->capacity_tokens;
  b->prefill_recall = b->decode_recall = b->tokens_evicted = NAN;
  g_autofree char *store = harness_store_path (cfg, "kv-baseline.store", error);
  if (store == NULL)
    return FALSE;
  double pf = selects ? cell->prefill_density : NAN, dc = selects ? cell->decode_density : NAN;
  guint64 covered[2] = { 0 }, asked[2] = { 0 }, evicted = 0;
  for (gsize s = 0; s < b->n_seeds; s++)
    {
      SiftPolicy **prefill, **decode;
      HarnessPipeline pl;
      if (!harness_random_policies_new (&src->shape, pf, dc, h->seed + 7919 * s, &prefill, &decode, error)
          || !harness_pipeline_init_with (&pl, cfg, src, prefill, decode, store, error))
        return FALSE;
      Capture c;
      capture_init (&c, &src->shape, src, plan, h->decode_steps, &pl, FALSE);
      double seconds[2];
      gboolean ok = capture_run (&c, &pl, cell->length, h->decode_steps, seconds, error);
      if (ok)
        {
          b->pass[s] = capture_score (&c, &b->prefill_retrieval[s], &b->decode_retrieval[s], NULL);
          for (int ph = 0; ph < 2; ph++)
            {
              covered[ph] += c.recall.covered[ph];
              asked[ph] += c.recall.asked[ph];
            }
          evicted += harness_pipeline_tokens_evicted (&pl);
        }
      capture_clear (&c);
      harness_pipeline_clear (&pl);
      if (!ok)
        return FALSE;
    }
  b->prefill_recall = ratio (covered[0], asked[0]);
  b->decode_recall = ratio (covered[1], asked[1]);
  if (b->n_seeds > 0)
    b->tokens_evicted = (double) evicted / (double) b->n_seeds;
  return TRUE;
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
  if (store_path == NULL || !harness_pipeline_init (&pl, cfg, setup, src, store_path, error))
    return FALSE;
  const gboolean bounded = sift_kv_config (cfg)->capacity_tokens > 0;
  const gint64 steps = h->decode_steps;
  Capture c;
  capture_init (&c, &shape, src, plan, steps, &pl, !bounded);
  g_autofree float *ref = g_new0 (float, (gsize) shape.n_layers * shape.n_q_heads * (gsize) c.n_rows * shape.head_dim);
  double seconds[2];
  gboolean ok = capture_run (&c, &pl, length, steps, seconds, error)
                && harness_dense_reference (cfg, src, length, steps, c.row0, c.n_rows, ref, error);
  if (ok)
    {
      cell->prefill_seconds = seconds[0];
      cell->decode_seconds = seconds[1];
      cell->pass = capture_score (&c, &cell->prefill_retrieval, &cell->decode_retrieval, &cell->chance);
      cell->prefill_pass = cell->prefill_retrieval > 0.5;
      cell->decode_pass = steps == 0 || cell->decode_retrieval > 0.5;
      gint64 q = plan->question_tokens;
      cell->prefill_rel_error = rel_error (&shape, c.out, ref, c.n_rows, 0, q);
      cell->decode_rel_error = steps > 0 ? rel_error (&shape, c.out, ref, c.n_rows, q, c.n_rows) : NAN;
      harness_recall_finish (&c.recall, bounded, cell);
      cell->decode_steps = steps;
      cell->n_needle_positions = plan->n_needles;
      cell->needle_positions = g_new (gint64, MAX (plan->n_needles, 1));
      gsize k = 0;
      for (int pass = 0; pass < 2; pass++) /* needles first, then distractors */
        for (gsize i = 0; i < plan->n_needles; i++)
          if ((plan->needles[i].distractor >= 0) == pass)
            cell->needle_positions[k++] = plan->needles[i].position;
      sift_engine_counters (pl.engine, -1, SIFT_PHASE_PREFILL, &cell->prefill_counters);
      sift_engine_counters (pl.engine, -1, SIFT_PHASE_DECODE, &cell->decode_counters);
      cell->prefill_density = ratio (cell->prefill_counters.tokens_attended, cell->prefill_counters.tokens_available);
      cell->decode_density = ratio (cell->decode_counters.tokens_attended, cell->decode_counters.tokens_available);
    }
  harness_pipeline_clear (&pl);
  /* A bounded cache: random eviction at its capacity; else random blocks
   * drawn from the kept calls, at the policy's own size. */
  if (ok && bounded)
    ok = eviction_baseline (cfg, src, plan, harness_recall_selects (&c.recall), cell, error);
  else if (ok)
    ok = harness_baseline_compute (src, plan, c.calls, (gsize) h->baseline_seeds, h->seed, cell->prefill_density,
                                   cell->decode_density, c.row0, c.n_rows, &cell->baseline, error);
  capture_clear (&c);
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
