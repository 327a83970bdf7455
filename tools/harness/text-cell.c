/* One real-text cell (model.source gguf): the prompt of text-prompt.c
 * through the engine with the setup's policies, greedy generation, RULER's
 * score of the answer, needle recall from the validated selections, the
 * last layer's attention output against dense attention (the full setup's
 * run of the same cell, kept, or a dense run made for it), and a random
 * baseline: random blocks at the policy's measured density, or random
 * eviction at its capacity (docs/needle.md, "Real text"). */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "gguf-model.h"
#include "harness.h"
#include "text.h"

struct _HarnessText {
  SiftModel *model;
  char *model_path;
  SiftTokenizer *tok;
  HarnessCorpus *corpus;
  HarnessTextSource *source;
  GHashTable *dense;         /* "length depth" -> DenseRun: the reference of a cell */
};

/* The dense reference of a cell: what the question rows and decode steps
 * of a dense run attended to, in its last layer. */
typedef struct {
  float *last;               /* [n_q_heads][n_rows][head_dim] */
  gint64 n_rows, n_decoded;
  GArray *ids;               /* gint32: generated tokens */
} DenseRun;

static void
dense_run_free (gpointer data)
{
  DenseRun *d = data;
  g_free (d->last);
  g_array_unref (d->ids);
  g_free (d);
}

/* ---- Shared state ------------------------------------------------------------------ */

/* A relative model.path: from the working folder, else beside the config file. */
static char *
model_file (const SiftConfig *cfg)
{
  const char *p = sift_gguf_config (cfg)->path;
  if (g_path_is_absolute (p) || g_file_test (p, G_FILE_TEST_EXISTS) || cfg->file == NULL)
    return g_strdup (p);
  g_autofree char *dir = g_path_get_dirname (cfg->file);
  g_autofree char *beside = g_build_filename (dir, p, NULL);
  return g_file_test (beside, G_FILE_TEST_EXISTS) ? g_steal_pointer (&beside) : g_strdup (p);
}

HarnessText *
harness_text_new (const SiftConfig *cfg, GError **error)
{
  g_autoptr (HarnessText) t = g_new0 (HarnessText, 1);
  t->dense = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, dense_run_free);
  if (sift_gguf_config (cfg)->path == NULL || sift_gguf_config (cfg)->path[0] == 0)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "%s: model.source is gguf but model.path is not set (give --model FILE.gguf)", cfg->file);
      return NULL;
    }
  t->model_path = model_file (cfg);
  if (!g_file_test (t->model_path, G_FILE_TEST_IS_REGULAR))
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "%s: model.path: %s: no such file (the shipped model is models/sift-needle-14m-f16.gguf)",
                   cfg->file, t->model_path);
      return NULL;
    }
  t->model = sift_model_gguf_new (t->model_path, cfg->shape.block_size, cfg->shape.chunk_size, cfg->shape.scale,
                                  error);
  if (t->model == NULL || !sift_model_gguf_use_device (t->model, sift_offload_config (cfg)->device, error))
    return NULL;
  GgufFile *f = llama_model_gguf (sift_model_gguf_llama (t->model));
  if (gguf_find (f, "tokenizer.ggml.model") == NULL)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "%s: the model has no tokenizer: text needles need one", t->model_path);
      return NULL;
    }
  if ((t->tok = llama_tokenizer_from_gguf (f, error)) == NULL)
    return NULL;
  if ((t->corpus = harness_corpus_load (sift_harness_config (cfg)->haystack, error)) == NULL)
    return NULL;
  if ((t->source = harness_text_source_new (t->corpus, t->tok, error)) == NULL)
    return NULL;
  return g_steal_pointer (&t);
}

void
harness_text_free (HarnessText *t)
{
  if (t == NULL)
    return;
  harness_text_source_free (t->source);
  harness_corpus_free (t->corpus);
  sift_tokenizer_free (t->tok);
  sift_model_free (t->model);
  g_free (t->model_path);
  g_hash_table_unref (t->dense);
  g_free (t);
}

const char *
harness_text_model_path (const HarnessText *t)
{
  return t->model_path;
}

const SiftModelShape *
harness_text_shape (const HarnessText *t)
{
  return &t->model->shape;
}

gint64
harness_text_context_length (const HarnessText *t)
{
  return llama_model_config (sift_model_gguf_llama (t->model))->n_ctx;
}

gboolean
harness_text_check (HarnessText *t, const SiftConfig *cfg, gint64 length, GError **error)
{
  g_autoptr (HarnessTextPrompt) p = harness_text_prompt_new (t->source, sift_harness_config (cfg), length, 0.0,
                                                             sift_harness_config (cfg)->seed, error);
  return p != NULL;
}

/* ---- One run -------------------------------------------------------------------------- */

typedef struct {
  const SiftModelShape *shape;
  gint64 row0, n_rows;       /* the question's tokens, then the decode steps */
  float *out;                /* [n_layers][n_q_heads][n_rows][head_dim] */
  HarnessRecall recall;
  const gint64 *targets;     /* token positions of the asked needles */
  gsize n_targets;
  gboolean selection_seen;   /* for the layer call in progress */
  SiftPolicy **prefill, **decode;
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
  if (!call_asks (c, ctx))
    return;
  harness_recall_selected (&c->recall, ctx, selection, c->targets, c->n_targets);
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
    harness_recall_unselected (&c->recall, ctx->phase == SIFT_PHASE_PREFILL ? c->prefill : c->decode, ctx,
                               c->targets, c->n_targets);
  harness_capture_rows (c->shape, ctx, out, c->row0, c->n_rows, c->out, NULL);
}

/* Runs the prompt through a ready pipeline and generates; *c collects. */
static gboolean
run (HarnessText *t, HarnessPipeline *pl, const HarnessTextPrompt *p, Capture *c, HarnessGeneration *gen,
     GError **error)
{
  c->prefill = pl->prefill;
  c->decode = pl->decode;
  SiftRunnerObserver obs = { .attention = on_attention, .selection = on_selection };
  sift_runner_set_observer (pl->runner, &obs, c);
  return harness_generate (pl->runner, t->model, t->tok, p->ids, p->n_ids, p->max_new_tokens, gen, error);
}

static void
capture_init (Capture *c, const SiftModelShape *shape, const HarnessTextPrompt *p, const gint64 *targets,
              gsize n_targets)
{
  *c = (Capture) { .shape = shape, .row0 = p->question_start, .targets = targets, .n_targets = n_targets };
  c->n_rows = p->n_ids - p->question_start + p->max_new_tokens;
  c->out = g_new0 (float, (gsize) shape->n_layers * shape->n_q_heads * c->n_rows * shape->head_dim);
  harness_recall_init (&c->recall, shape);
}

static void
capture_clear (Capture *c)
{
  g_clear_pointer (&c->out, g_free);
  harness_recall_clear (&c->recall);
}

static DenseRun *
keep_dense (const Capture *c, const HarnessGeneration *gen)
{
  const SiftModelShape *s = c->shape;
  gsize plane = (gsize) s->n_q_heads * c->n_rows * s->head_dim;
  DenseRun *d = g_new0 (DenseRun, 1);
  d->n_rows = c->n_rows;
  d->n_decoded = gen->n_decoded;
  d->last = g_memdup2 (c->out + (gsize) (s->n_layers - 1) * plane, plane * sizeof (float));
  d->ids = g_array_copy (gen->ids);
  return d;
}

/* A copy of cfg whose cache is unbounded. */
static SiftConfig *
unbounded (const SiftConfig *cfg)
{
  SiftConfig *c = sift_config_copy (cfg);
  sift_kv_config_edit (c)->capacity_tokens = 0;
  return c;
}

static char *
cell_key (gint64 length, double depth)
{
  return g_strdup_printf ("%" G_GINT64_FORMAT " %.17g", length, depth);
}

/* The cell's dense run: kept from the full setup, or run now (dense in
 * every layer, an unbounded cache). */
static const DenseRun *
dense_run (HarnessText *t, const SiftConfig *cfg, const HarnessTextPrompt *p, gint64 length, double depth,
           GError **error)
{
  g_autofree char *key = cell_key (length, depth);
  DenseRun *d = g_hash_table_lookup (t->dense, key);
  if (d != NULL)
    return d;
  g_autoptr (SiftConfig) dense = unbounded (cfg);
  g_autofree char *store = harness_store_path (cfg, "kv-reference.store", error);
  gint32 L = t->model->shape.n_layers;
  HarnessPipeline pl;
  if (store == NULL
      || !harness_pipeline_init_with (&pl, dense, t->model, g_new0 (SiftPolicy *, L), g_new0 (SiftPolicy *, L), store,
                                   error))
    return NULL;
  Capture c;
  capture_init (&c, &t->model->shape, p, NULL, 0);
  HarnessGeneration gen = { 0 };
  if (run (t, &pl, p, &c, &gen, error))
    {
      d = keep_dense (&c, &gen);
      g_hash_table_insert (t->dense, g_steal_pointer (&key), d);
    }
  harness_generation_clear (&gen);
  capture_clear (&c);
  harness_pipeline_clear (&pl);
  return d;
}

/* ||a - b|| / ||b|| of the last layer over rows [r0, r1). */
static double
last_layer_error (const SiftModelShape *s, const float *out, const DenseRun *d, gint64 r0, gint64 r1)
{
  if (r1 <= r0)
    return NAN;
  gsize plane = (gsize) s->n_q_heads * d->n_rows * s->head_dim;
  const float *a = out + (gsize) (s->n_layers - 1) * plane;
  double num = 0, den = 0;
  for (gint32 h = 0; h < s->n_q_heads; h++)
    for (gint64 r = r0; r < r1; r++)
      for (gint32 e = 0; e < s->head_dim; e++)
        {
          gsize i = ((gsize) h * d->n_rows + r) * s->head_dim + e;
          double x = (double) a[i] - d->last[i];
          num += x * x;
          den += (double) d->last[i] * d->last[i];
        }
  return den > 0 ? sqrt (num / den) : NAN;
}

static double
ratio (guint64 a, guint64 b)
{
  return b > 0 ? (double) a / (double) b : NAN;
}

/* The random baseline, once per seed: over an unbounded cache, the cell
 * again with random blocks at the setup's measured density per phase;
 * over a bounded one, with uniformly random eviction at the same capacity
 * (and random blocks at the measured density if the setup selects). */
static gboolean
baseline (HarnessText *t, const SiftConfig *cfg, const HarnessTextPrompt *p, gboolean selects, HarnessCell *cell,
          GError **error)
{
  const SiftHarnessConfig *h = sift_harness_config (cfg);
  HarnessBaseline *b = &cell->baseline;
  b->prefill_recall = b->decode_recall = b->tokens_evicted = NAN;
  b->n_seeds = (gsize) MIN (h->baseline_seeds, HARNESS_BASELINE_MAX_SEEDS);
  b->capacity_tokens = sift_kv_config (cfg)->capacity_tokens;
  const SiftModelShape *shape = &t->model->shape;
  g_autofree char *store = harness_store_path (cfg, "kv-baseline.store", error);
  if (store == NULL)
    return FALSE;
  /* Unbounded: a phase without a selection draws every block. */
  double pf = selects ? (isfinite (cell->prefill_density) ? cell->prefill_density : 1.0) : NAN;
  double dc = selects ? (isfinite (cell->decode_density) ? cell->decode_density : 1.0) : NAN;
  guint64 evicted = 0;
  for (gsize s = 0; s < b->n_seeds; s++)
    {
      SiftPolicy **prefill, **decode;
      HarnessPipeline pl;
      if (!harness_random_policies_new (shape, pf, dc, h->seed + 7919 * s, &prefill, &decode, error)
          || !harness_pipeline_init_with (&pl, cfg, t->model, prefill, decode, store, error))
        return FALSE;
      Capture c;
      capture_init (&c, shape, p, NULL, 0);
      HarnessGeneration gen = { 0 };
      gboolean ok = run (t, &pl, p, &c, &gen, error);
      if (ok)
        {
          double match;
          gboolean exact;
          harness_text_score (gen.text->str, (const char *const *) p->answers, &match, &exact);
          b->pass[s] = match == 1.0;
          b->prefill_retrieval[s] = match;
          b->decode_retrieval[s] = NAN;
          evicted += harness_pipeline_tokens_evicted (&pl);
        }
      harness_generation_clear (&gen);
      capture_clear (&c);
      harness_pipeline_clear (&pl);
      if (!ok)
        return FALSE;
    }
  if (b->capacity_tokens > 0 && b->n_seeds > 0)
    b->tokens_evicted = (double) evicted / (double) b->n_seeds;
  return TRUE;
}

gboolean
harness_text_run_cell (HarnessText *t, const SiftConfig *cfg, const SiftPolicySetup *setup, gboolean reference,
                       gint64 length, double depth, HarnessCell *cell, GError **error)
{
  memset (cell, 0, sizeof *cell);
  cell->length = length;
  cell->depth = depth;
  const SiftHarnessConfig *h = sift_harness_config (cfg);
  g_autoptr (HarnessTextPrompt) p = harness_text_prompt_new (t->source, h, length, depth, h->seed, error);
  if (p == NULL)
    return FALSE;
  /* Recall asks about every token of the needles whose key is asked. */
  g_autoptr (GArray) targets = g_array_new (FALSE, FALSE, sizeof (gint64));
  for (gsize i = 0; i < p->n_needles; i++)
    for (gint64 pos = p->needle_start[i]; p->needle_asked[i] && pos < p->needle_end[i]; pos++)
      g_array_append_val (targets, pos);

  const SiftModelShape *shape = &t->model->shape;
  g_autofree char *store = sift_offload_config (cfg)->store_path != NULL ? g_strdup (sift_offload_config (cfg)->store_path)
                                                    : harness_store_path (cfg, "kv.store", error);
  HarnessPipeline pl;
  if (store == NULL || !harness_pipeline_init (&pl, cfg, setup, t->model, store, error))
    return FALSE;
  Capture c;
  capture_init (&c, shape, p, (const gint64 *) targets->data, targets->len);
  HarnessGeneration gen = { 0 };
  gboolean ok = run (t, &pl, p, &c, &gen, error);
  if (ok)
    {
      cell->generated = g_utf8_make_valid (gen.text->str, (gssize) gen.text->len);
      cell->expected = g_strdup (p->answer_text);
      harness_text_score (cell->generated, (const char *const *) p->answers, &cell->match, &cell->exact);
      cell->pass = cell->prefill_pass = cell->decode_pass = cell->match == 1.0;
      cell->prefill_retrieval = cell->match;
      cell->decode_retrieval = NAN;
      cell->chance = NAN;
      cell->prefill_seconds = gen.prefill_seconds;
      cell->decode_seconds = gen.decode_seconds;
      cell->decode_steps = gen.n_decoded;
      cell->generated_tokens = gen.ids->len;
      cell->question_start = p->question_start;
      harness_recall_finish (&c.recall, sift_kv_config (cfg)->capacity_tokens > 0, cell);
      /* Needles whose key is asked first, then the distractors. */
      cell->n_needle_positions = p->n_needles;
      cell->needle_positions = g_new (gint64, p->n_needles);
      cell->needle_spans = g_new (gint64, 2 * p->n_needles);
      gsize k = 0;
      for (int distractors = 0; distractors < 2; distractors++)
        for (gsize i = 0; i < p->n_needles; i++)
          if (p->needle_asked[i] != distractors)
            {
              cell->needle_positions[k] = p->needle_start[i];
              cell->needle_spans[2 * k] = p->needle_start[i];
              cell->needle_spans[2 * k + 1] = p->needle_end[i];
              k++;
            }
      sift_engine_counters (pl.engine, -1, SIFT_PHASE_PREFILL, &cell->prefill_counters);
      sift_engine_counters (pl.engine, -1, SIFT_PHASE_DECODE, &cell->decode_counters);
      cell->prefill_density = ratio (cell->prefill_counters.tokens_attended, cell->prefill_counters.tokens_available);
      cell->decode_density = ratio (cell->decode_counters.tokens_attended, cell->decode_counters.tokens_available);
    }
  harness_pipeline_clear (&pl);
  const DenseRun *d = NULL;
  if (ok && reference)
    {
      g_hash_table_insert (t->dense, cell_key (length, depth), keep_dense (&c, &gen));
    }
  if (ok)
    ok = (d = dense_run (t, cfg, p, length, depth, error)) != NULL;
  if (ok)
    {
      /* Prefill: the question's rows. Decode: the steps whose tokens so
       * far are the dense run's (later ones attend to other text). */
      gint64 q = p->n_ids - p->question_start, same = 0;
      while (same < MIN (gen.n_decoded, d->n_decoded)
             && g_array_index (gen.ids, gint32, same) == g_array_index (d->ids, gint32, same))
        same++;
      cell->prefill_rel_error = last_layer_error (shape, c.out, d, 0, q);
      cell->decode_rel_error = last_layer_error (shape, c.out, d, q, q + same);
      /* Full attention over the whole cache is its own baseline: none. */
      gboolean selects = harness_recall_selects (&c.recall);
      if ((selects || sift_kv_config (cfg)->capacity_tokens > 0) && h->baseline_seeds > 0)
        ok = baseline (t, cfg, p, selects, cell, error);
    }
  harness_generation_clear (&gen);
  capture_clear (&c);
  if (!ok)
    harness_cell_clear (cell);
  return ok;
}
