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
  /* Needle recall per phase (index phase - 1). */
  guint64 covered[2], asked[2];
  guint64 *head_covered, *head_asked;    /* [2][n_layers][n_q_heads] */
  guint64 unknown_calls[2];  /* question calls whose policy computes without a selection */
  guint64 selection_calls[2]; /* question calls answered with a validated selection */
  HarnessCalls *calls;       /* question calls, for the random baseline */
  gboolean selection_seen;   /* for the layer call in progress */
  SiftPolicy **prefill, **decode; /* [n_layers] */
} Capture;

static gboolean
is_dense (SiftPolicy *p, SiftPhase phase)
{
  if (p == NULL)
    return TRUE;
  gboolean custom = (phase == SIFT_PHASE_PREFILL ? p->ops->compute_chunked_prefill
                                                 : p->ops->compute_chunked_decode) != NULL;
  return !custom && (p->ops->flags & SIFT_POLICY_REQUIRES_BLOCK_SELECTION) == 0;
}

static gboolean
call_asks (const Capture *c, const SiftPolicyContext *ctx)
{
  return ctx->q_pos + ctx->n_q > c->row0 && ctx->q_pos < c->row0 + c->n_rows;
}

/* The stored block of `layer` holding position p, or -1 when a bounded
 * cache evicted it (blocks may hold non-consecutive positions then). */
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

/* Needle tokens (not distractors) and whether each lies in the call's
 * selection: stored blocks must be selected for the head; tokens still in
 * the local buffer are attended anyway; evicted ones are lost. */
static void
count_recall (Capture *c, const SiftPolicyContext *ctx, const SiftSelection *sel)
{
  int ph = ctx->phase == SIFT_PHASE_DECODE;
  for (gsize i = 0; i < c->plan->n_needles; i++)
    {
      const SiftNeedle *n = &c->plan->needles[i];
      if (n->distractor >= 0)
        continue;
      gboolean local = n->position >= ctx->kv_len;
      gint64 block = local ? -1 : stored_block (ctx, n->position);
      for (gint32 h = 0; h < c->shape->n_q_heads; h++)
        {
          gsize at = ((gsize) ph * c->shape->n_layers + ctx->layer) * c->shape->n_q_heads + h;
          c->asked[ph]++;
          c->head_asked[at]++;
          if (local || (block >= 0 && (sel == NULL || sift_selection_has (sel, block, h))))
            {
              c->covered[ph]++;
              c->head_covered[at]++;
            }
        }
    }
}

static void
on_selection (gpointer user_data, const SiftPolicyContext *ctx, const SiftSelection *selection)
{
  Capture *c = user_data;
  c->selection_seen = TRUE;
  if (call_asks (c, ctx))
    {
      count_recall (c, ctx, selection);
      c->selection_calls[ctx->phase == SIFT_PHASE_DECODE]++;
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
      SiftPolicy *p = (ctx->phase == SIFT_PHASE_PREFILL ? c->prefill : c->decode)[ctx->layer];
      gboolean dense = is_dense (p, ctx->phase);
      if (dense)
        count_recall (c, ctx, NULL);
      else
        c->unknown_calls[ctx->phase == SIFT_PHASE_DECODE]++;
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

static SiftStore *
make_store (const SiftConfig *cfg, const SiftModelShape *shape, GError **error)
{
  const SiftOffloadConfig *off = sift_offload_config (cfg);
  const char *out_dir = sift_harness_config (cfg)->out_dir;
  g_autofree char *path = off->store_path != NULL ? g_strdup (off->store_path)
                                                  : g_build_filename (out_dir, "kv.store", NULL);
  SiftStoreConfig sc = {
    .dtype = sift_kv_config (cfg)->store_dtype, .n_kv_heads = shape->n_kv_heads, .block_size = shape->block_size,
    .head_dim = shape->head_dim,
    .path = path, .keep = off->store_keep, .direct = off->store_direct,
  };
  if (g_strcmp0 (off->store, "file") == 0)
    {
      if (g_mkdir_with_parents (out_dir, 0755) != 0)
        {
          g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_IO, "cannot create %s: %s",
                       sift_harness_config (cfg)->out_dir, g_strerror (errno));
          return NULL;
        }
      return sift_store_file_new (&sc, error);
    }
  return sift_store_host_new (&sc, error);
}

static gboolean
layer_forced_dense (const SiftPolicySetup *setup, gint32 l)
{
  for (gsize i = 0; i < setup->n_dense_layers; i++)
    if (setup->dense_layers[i] == l)
      return TRUE;
  return FALSE;
}

/* One instance per layer and phase, so no policy has to key state by layer. */
static gboolean
make_policies (const SiftPolicySetup *setup, const SiftModelShape *shape, SiftPolicy **prefill,
               SiftPolicy **decode, GError **error)
{
  for (gint32 l = 0; l < shape->n_layers; l++)
    {
      if (layer_forced_dense (setup, l))
        continue;
      prefill[l] = sift_policy_new (setup->prefill.ops, setup->prefill.params, shape, error);
      if (prefill[l] == NULL)
        return FALSE;
      decode[l] = sift_policy_new (setup->decode.ops, setup->decode.params, shape, error);
      if (decode[l] == NULL)
        return FALSE;
    }
  return TRUE;
}

static void
free_policies (SiftPolicy **p, gint32 n)
{
  for (gint32 l = 0; l < n; l++)
    sift_policy_free (p[l]);
  g_free (p);
}

static char *
recall_note (const Capture *c)
{
  GString *s = g_string_new ("");
  const char *names[] = { "prefill", "decode" };
  for (int ph = 0; ph < 2; ph++)
    if (c->unknown_calls[ph] > 0)
      g_string_append_printf (s, "%s%s: %" G_GUINT64_FORMAT " layer calls computed attention their own way"
                              " without a block selection (not counted)", s->len ? "; " : "", names[ph],
                              c->unknown_calls[ph]);
  if (s->len == 0)
    g_string_append (s, "from validated selections; dense layers cover every block");
  return g_string_free (s, FALSE);
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
  if (setup->prefill.ops == NULL || setup->decode.ops == NULL)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "%s: setup '%s' has unresolved policies", cfg->file, setup->label);
      return FALSE;
    }
  SiftModelShape shape = cfg->shape;
  const SiftHarnessConfig *h = sift_harness_config (cfg);
  const SiftSyntheticConfig *knobs = sift_synthetic_config (cfg);
  g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (h, length, depth, knobs->sink_tokens, cfg->shape.block_size,
                                                          h->seed, error);
  if (plan == NULL)
    return FALSE;
  g_autoptr (SiftModel) src = sift_model_synthetic_new (&shape, cfg->seed, knobs, plan, error);
  if (src == NULL)
    return FALSE;

  g_autoptr (SiftStore) store = make_store (cfg, &shape, error);
  if (store == NULL)
    return FALSE;
  const SiftKvConfig *kv = sift_kv_config (cfg);
  const SiftOffloadConfig *off = sift_offload_config (cfg);
  SiftEngineConfig ec = {
    .shape = shape, .compute_dtype = kv->compute_dtype, .n_slots = off->ring_slots, .pipeline = off->pipeline,
  };
  /* kv.capacity_tokens bounds the cache: the engine evicts (docs/eviction.md). */
  SiftEvictConfig ev = { kv->capacity_tokens, kv->evict_granularity, kv->protect_sinks, kv->protect_recent };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, error);
  if (engine == NULL || !sift_engine_set_eviction (engine, &ev, error))
    return FALSE;
  sift_engine_set_force_copy (engine, off->force_copy);

  gint32 L = shape.n_layers;
  SiftPolicy **prefill = g_new0 (SiftPolicy *, L), **decode = g_new0 (SiftPolicy *, L);
  gboolean ok = make_policies (setup, &shape, prefill, decode, error);
  SiftRunner *runner = ok ? sift_runner_new (engine, src, prefill, decode, error) : NULL;
  ok = runner != NULL;

  gint64 steps = h->decode_steps;
  Capture c = {
    .shape = &shape, .plan = plan, .src = src, .row0 = plan->question_start,
    .n_rows = plan->question_tokens + steps, .prefill = prefill, .decode = decode,
    .calls = harness_calls_new (),
  };
  gsize plane = (gsize) L * shape.n_q_heads * (gsize) c.n_rows * shape.head_dim;
  c.out = g_new0 (float, plane);
  c.seen = g_new0 (gboolean, c.n_rows);
  c.seen_layers = g_new0 (gint32, c.n_rows);
  c.head_covered = g_new0 (guint64, 2 * (gsize) L * shape.n_q_heads);
  c.head_asked = g_new0 (guint64, 2 * (gsize) L * shape.n_q_heads);
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
      /* A phase without any selection over an unbounded cache has no
       * recall to speak of (dense layers alone would read 100%); under a
       * bounded cache recall still tells what eviction kept. */
      gboolean bounded = kv->capacity_tokens > 0;
      cell->prefill_recall = c.selection_calls[0] > 0 || bounded ? ratio (c.covered[0], c.asked[0]) : NAN;
      cell->decode_recall = c.selection_calls[1] > 0 || bounded ? ratio (c.covered[1], c.asked[1]) : NAN;
      cell->n_layers = L;
      cell->n_q_heads = shape.n_q_heads;
      cell->recall_by_layer = g_new (double, 2 * (gsize) L);
      cell->recall_by_head = g_new (double, 2 * (gsize) L * shape.n_q_heads);
      for (gsize i = 0; i < 2 * (gsize) L; i++)
        {
          guint64 covered = 0, asked = 0;
          for (gsize h = 0; h < (gsize) shape.n_q_heads; h++)
            {
              gsize at = i * (gsize) shape.n_q_heads + h;
              cell->recall_by_head[at] = ratio (c.head_covered[at], c.head_asked[at]);
              covered += c.head_covered[at];
              asked += c.head_asked[at];
            }
          cell->recall_by_layer[i] = ratio (covered, asked);
        }
      cell->recall_note = recall_note (&c);
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
  sift_runner_free (runner);
  free_policies (prefill, L);
  free_policies (decode, L);
  g_free (c.out);
  g_free (c.seen);
  g_free (c.seen_layers);
  g_free (c.head_covered);
  g_free (c.head_asked);
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
}
