/* The needle harness (docs/needle.md): a grid of context lengths x needle
 * depths per policy setup; each cell plants needles in the synthetic model,
 * runs prefill and decode through the engine, and scores retrieval, needle
 * recall, error vs dense, density, bytes and time. Shared by `sift needle`
 * and the tests; errors are SIFT_HARNESS_ERROR unless they come from below. */
#pragma once

#include <stdio.h>

#include <glib.h>
#include <sift/sift.h>

#include "needle-plan.h"
#include "tokenizer.h"

G_BEGIN_DECLS

/* ---- Grid (grid.c) -------------------------------------------------------- */

typedef struct {
  gint64 *lengths;  /* [n_lengths] ascending, distinct */
  gsize n_lengths;
  double *depths;   /* [n_depths] within [0, 1] ascending, distinct */
  gsize n_depths;
} HarnessGrid;

/* Expands the lists or the linear / sigmoid spacings of `h`. */
gboolean harness_grid_expand (const SiftHarnessConfig *h, HarnessGrid *grid, GError **error);
void harness_grid_clear (HarnessGrid *grid);
/* n values over [0, 1]: linear, or logistic (denser near both ends, as the
 * classic needle plots space depths), ends exactly 0 and 1. */
void harness_spacing (SiftSpacing spacing, gsize n, double *out);

/* ---- A run's machinery (pipeline.c) ------------------------------------------ */

typedef struct {
  SiftStore *store;
  SiftEngine *engine;
  SiftRunner *runner;
  SiftPolicy **prefill, **decode;  /* [n_layers], owned; NULL entries: dense layers */
  gint32 n_layers;
} HarnessPipeline;

/* Store (the config's kind at store_path), engine with the config's
 * eviction, one policy instance per layer and phase of `setup`, runner
 * over `model` (borrowed). On failure *p holds nothing. */
gboolean harness_pipeline_init (HarnessPipeline *p, const SiftConfig *cfg, const SiftPolicySetup *setup,
                                SiftModel *model, const char *store_path, GError **error);
/* The same with ready policies (the arrays and instances pass to *p, which frees them). */
gboolean harness_pipeline_init_with (HarnessPipeline *p, const SiftConfig *cfg, SiftModel *model,
                                     SiftPolicy **prefill, SiftPolicy **decode, const char *store_path,
                                     GError **error);
void harness_pipeline_clear (HarnessPipeline *p);
/* Tokens the engine evicted so far, both phases and every layer. */
guint64 harness_pipeline_tokens_evicted (const HarnessPipeline *p);
/* A config for a GGUF model (model.source: gguf) takes the model's shape
 * from the file; a shape key it writes (model.layers, q_heads, kv_heads,
 * head_dim) must say what the file says, else SIFT_CONFIG_ERROR_INVALID
 * with both values at the key's line. The rope base, norm epsilon and
 * context length have no config keys: they come from the file alone. A
 * config for another source describes another model: not compared.
 * (`sift needle --model` turns a synthetic config's source into gguf
 * and keeps its shape keys, written for the synthetic model: the text
 * harness does not call this.) */
gboolean harness_check_model_shape (const SiftConfig *cfg, const char *path, const SiftModel *model,
                                    GError **error);
/* OUT/name, creating OUT (harness.out) when the store is a file. */
char *harness_store_path (const SiftConfig *cfg, const char *name, GError **error);

typedef struct {
  GArray *ids;          /* gint32: generated tokens (an end-of-generation token last when stopped) */
  GString *text;        /* their text, end-of-generation token left out (tokenizer given) */
  gboolean stopped;     /* ended on an end-of-generation token */
  gint64 n_decoded;     /* decode steps run */
  double prefill_seconds, decode_seconds;
} HarnessGeneration;

/* Greedy generation: prefills prompt[0..n_prompt), then takes the argmax
 * token up to max_new times, feeding each back, until the tokenizer (may
 * be NULL) says a token ends generation. */
gboolean harness_generate (SiftRunner *runner, SiftModel *model, const SiftTokenizer *tok, const gint32 *prompt,
                           gint64 n_prompt, gint64 max_new, HarnessGeneration *out, GError **error);
void harness_generation_clear (HarnessGeneration *g);

/* ---- Needle recall (recall.c) ----------------------------------------------------- */

typedef struct _HarnessCell HarnessCell;

typedef struct {
  gint32 n_layers, n_q_heads;
  guint64 covered[2], asked[2];          /* per phase (index phase - 1) */
  guint64 *head_covered, *head_asked;    /* [2][n_layers][n_q_heads] */
  guint64 unknown_calls[2];              /* question calls whose policy computes without a selection */
  guint64 selection_calls[2];            /* question calls answered with a validated selection */
} HarnessRecall;

void harness_recall_init (HarnessRecall *r, const SiftModelShape *shape);
void harness_recall_clear (HarnessRecall *r);
/* A policy that attends every block through the default pipeline (NULL: a dense layer). */
gboolean harness_policy_is_dense (SiftPolicy *p, SiftPhase phase);
/* Counts positions[0..n) for every query head of the call's layer:
 * covered when still in the local buffer or in a stored block that `sel`
 * holds for the head (sel NULL: every block); an evicted token is lost. */
void harness_recall_count (HarnessRecall *r, const SiftPolicyContext *ctx, const SiftSelection *sel,
                           const gint64 *positions, gsize n);
/* A question call's validated selection: counted, and the call noted as selected. */
void harness_recall_selected (HarnessRecall *r, const SiftPolicyContext *ctx, const SiftSelection *sel,
                              const gint64 *positions, gsize n);
/* A question call that attended with no selection seen: a dense layer or
 * policy covers every stored block, any other policy's call is unknown.
 * Returns whether it was dense. `policies` is the phase's [n_layers]. */
gboolean harness_recall_unselected (HarnessRecall *r, SiftPolicy *const *policies, const SiftPolicyContext *ctx,
                                    const gint64 *positions, gsize n);
/* Whether a question call chose among the stored blocks (a validated
 * selection, or a policy computing its own way): random blocks then
 * make its baseline. */
gboolean harness_recall_selects (const HarnessRecall *r);
/* The cell's recall fields: per phase, layer and head, and how it was known. */
void harness_recall_finish (const HarnessRecall *r, gboolean bounded, HarnessCell *cell);

/* ---- One cell (cell.c, score.c, reference.c, baseline.c) ----------------- */

#define HARNESS_BASELINE_MAX_SEEDS 32

/* The random baseline of a cell: the same question rows answered from a
 * random selection of as many stored blocks as the policy attended, call
 * for call and head for head (a policy without a selection: its measured
 * density of the phase), once per seed; over a bounded cache, the cell
 * run again with uniformly random eviction victims at the same capacity
 * (and random blocks at the measured density where the setup selects)
 * (docs/needle.md). */
typedef struct {
  gsize n_seeds;                                      /* 0: none */
  gint64 capacity_tokens;                             /* > 0: random eviction at this capacity; 0: selection only */
  double tokens_evicted;                              /* eviction: mean over seeds, both phases; NAN otherwise */
  gboolean pass[HARNESS_BASELINE_MAX_SEEDS];          /* both phases above 1/2, as a cell */
  double prefill_retrieval[HARNESS_BASELINE_MAX_SEEDS];
  double decode_retrieval[HARNESS_BASELINE_MAX_SEEDS];
  double prefill_recall, decode_recall;               /* fraction of draws holding the needle; NAN: none */
} HarnessBaseline;

struct _HarnessCell {
  gint64 length;
  double depth;
  /* Retrieval: fraction of (layer, retrieval head, question row) whose
   * output's nearest value code is the needle's; a phase passes above 1/2. */
  double prefill_retrieval, decode_retrieval;
  gboolean prefill_pass, decode_pass, pass;
  double chance;             /* probability one row hits by luck: targets / candidate codes */
  /* Needle recall: fraction of (call, layer, head, needle token) whose
   * block the selection held; NAN where nothing can be known. */
  double prefill_recall, decode_recall;
  char *recall_note;         /* how recall was known (owned) */
  double *recall_by_layer;   /* [2][n_layers] prefill then decode, NAN where unknown (owned; NULL when resumed) */
  double *recall_by_head;    /* [2][n_layers][n_q_heads], likewise */
  gint32 n_layers, n_q_heads;
  double prefill_rel_error, decode_rel_error;  /* ||o - o_dense|| / ||o_dense|| at the question rows */
  double prefill_density, decode_density;      /* tokens attended / tokens available */
  double prefill_seconds, decode_seconds;
  gint64 decode_steps;
  SiftCounters prefill_counters, decode_counters;
  gint64 *needle_positions;  /* [n_needle_positions] (owned) needles, then distractors */
  gsize n_needle_positions;
  HarnessBaseline baseline;
  gboolean resumed;          /* read back from records, not run now */
  /* Text needles (model.source gguf): the answer the model generated and
   * RULER's scores of it; NULL / NAN for the synthetic source. There the
   * retrieval fields hold `match` (both phases: one answer) and the
   * relative errors are the last layer's attention output vs dense. */
  char *generated;           /* (owned) */
  char *expected;            /* the trained answer, " v1, v2 and v3." (owned) */
  double match;              /* string_match_all: fraction of values in the generated text */
  gboolean exact;            /* the generated answer equals the expected one */
  gint64 *needle_spans;      /* [n_needle_positions][2] first token and one past the last (owned) */
  gint64 question_start;     /* first token of the question */
  gint64 generated_tokens;
};

void harness_cell_clear (HarnessCell *cell);

/* Runs one cell of `setup` (policies resolved: config loaded with a registry). */
gboolean harness_run_cell (const SiftConfig *config, const SiftPolicySetup *setup, gint64 length,
                           double depth, HarnessCell *cell, GError **error);

/* Copies the attention output rows of ctx that fall in [row0, row0 + n_rows)
 * into dst [n_layers][n_q_heads][n_rows][head_dim]; seen_layers (may be NULL)
 * counts, per row, the layers that delivered it. */
void harness_capture_rows (const SiftModelShape *s, const SiftPolicyContext *ctx, const SiftView *out,
                           gint64 row0, gint64 n_rows, float *dst, gint32 *seen_layers);
/* Dense reference: the cell's prompt of `length` tokens and `steps` decode
 * steps with dense attention in every layer; for every layer the attention
 * output of rows [row0, row0 + n_rows).
 * ref: f32 [n_layers][n_q_heads][n_rows][head_dim]. */
gboolean harness_dense_reference (const SiftConfig *config, SiftModel *model, gint64 length, gint64 steps,
                                  gint64 row0, gint64 n_rows, float *ref, GError **error);
/* The two ways harness_dense_reference takes: through the runner (any
 * model), or one dense call per layer over the rows (a positional model
 * only, sift_model_is_positional). */
gboolean harness_dense_reference_runner (const SiftConfig *config, SiftModel *model, gint64 length, gint64 steps,
                                         gint64 row0, gint64 n_rows, float *ref, GError **error);
gboolean harness_dense_reference_direct (const SiftModelShape *shape, SiftModel *model, gint64 row0,
                                         gint64 n_rows, float *ref, GError **error);

/* Fraction of the baseline's seeds that pass the cell; NAN with none. */
double harness_baseline_pass_mean (const HarnessBaseline *b);

/* The question calls of a cell's run, kept for its baseline (baseline.c). */
typedef struct _HarnessCalls HarnessCalls;
HarnessCalls *harness_calls_new (void);
void harness_calls_free (HarnessCalls *calls);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (HarnessCalls, harness_calls_free)
/* Keeps one call: its stored blocks and, per query head, how many the
 * policy attended (sel NULL: every one); known FALSE: the policy computed
 * its own way, without a selection or over sub-selections of it that the
 * harness does not see (its phase density stands in). */
void harness_calls_add (HarnessCalls *calls, const SiftPolicyContext *ctx, const SiftSelection *sel,
                        gboolean known);
/* The random baseline over n_seeds seeds (at most HARNESS_BASELINE_MAX_SEEDS)
 * for question rows [row0, row0 + n_rows), scored as the cell is. */
gboolean harness_baseline_compute (SiftModel *src, const SiftNeedlePlan *plan, const HarnessCalls *calls,
                                   gsize n_seeds, guint64 seed, double prefill_density, double decode_density,
                                   gint64 row0, gint64 n_rows, HarnessBaseline *out, GError **error);

/* The random policies of a baseline run (random-policy.c), one instance
 * per layer and phase ([n_layers] each, for harness_pipeline_init_with):
 * with a finite density, round(density * n) of the n stored blocks drawn
 * at random for every kv head at each call; NAN: no selection (every kept
 * block attended). Over a bounded cache, victims uniformly random among
 * the engine's candidates (tokens, or blocks with block granularity), as
 * many as the engine evicts for any policy. Seeded by seed (prefill) and
 * seed + 1 (decode), the layer, phase and call. */
gboolean harness_random_policies_new (const SiftModelShape *shape, double prefill_density, double decode_density,
                                      guint64 seed, SiftPolicy ***prefill, SiftPolicy ***decode, GError **error);
/* idx[0..k) := k distinct entries of idx[0..n) drawn uniformly (the first
 * k of a partial Fisher-Yates shuffle; idx holds a permutation). */
void harness_random_draw (GRand *rand, gint64 *idx, gint64 n, gint64 k);

/* Retrieval scoring of captured outputs (score.c). out: f32
 * [n_layers][n_q_heads][n_rows][head_dim] for rows [row0, row0 + n_rows).
 * For every row: hits[r] counts the (layer, retrieval head) pairs whose
 * output is nearer (cosine) to the asked needle's value code than to any
 * other code of the context [0, row] (multivalue: every needle value nearer
 * than any other code); chance[r] the probability of that by luck.
 * Returns the (layer, retrieval head) pairs scored per row. */
gsize harness_score_retrieval (SiftModel *src, const SiftNeedlePlan *plan, const float *out,
                               gint64 row0, gint64 n_rows, gsize *hits, double *chance);

/* ---- Real-text cells (text-cell.c; model.source gguf) ------------------------------- */

/* What every text cell of a run shares: the GGUF model and its tokenizer,
 * the haystack text, and the dense runs kept as references. */
typedef struct _HarnessText HarnessText;
/* Opens model.path (relative: from the working folder, else beside the
 * config file) and harness.haystack. SIFT_HARNESS_ERROR_INVALID for a
 * missing file, a model without a tokenizer, or missing haystack text. */
HarnessText *harness_text_new (const SiftConfig *cfg, GError **error);
void harness_text_free (HarnessText *text);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (HarnessText, harness_text_free)
const char *harness_text_model_path (const HarnessText *text);
/* The model's shape (layers, heads, head_dim from the file; block and chunk from the config). */
const SiftModelShape *harness_text_shape (const HarnessText *text);
/* llama.context_length of the model (its trained length). */
gint64 harness_text_context_length (const HarnessText *text);
/* Whether a prompt of `length` tokens holds the needles and question. */
gboolean harness_text_check (HarnessText *text, const SiftConfig *cfg, gint64 length, GError **error);
/* Runs one cell of `setup`. reference: the setup attends densely over an
 * unbounded cache, so its run is kept as the cell's dense reference for
 * the setups after it (otherwise a dense run is made when first needed). */
gboolean harness_text_run_cell (HarnessText *text, const SiftConfig *cfg, const SiftPolicySetup *setup,
                                gboolean reference, gint64 length, double depth, HarnessCell *cell, GError **error);

/* ---- Records (records.c, json.c) ------------------------------------------ */

/* What identifies a cell's results: every setting that changes them. */
char *harness_settings_key (const SiftConfig *config, const SiftPolicySetup *setup, gint64 length,
                            double depth);
/* One JSON line for a cell (no newline). */
char *harness_record_json (const SiftConfig *config, const SiftPolicySetup *setup, const char *settings,
                           const HarnessCell *cell);

typedef struct _HarnessRecords HarnessRecords;
/* Reads OUT/records.jsonl if it exists (a missing file is an empty set);
 * a line that is not a record is SIFT_HARNESS_ERROR_RECORDS with file:line. */
HarnessRecords *harness_records_open (const char *path, GError **error);
/* A cell recorded with these settings, or FALSE. */
gboolean harness_records_find (HarnessRecords *records, const char *settings, HarnessCell *cell);
/* Appends a line and flushes it. */
gboolean harness_records_append (HarnessRecords *records, const char *line, GError **error);
void harness_records_free (HarnessRecords *records);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (HarnessRecords, harness_records_free)

/* ---- Outputs (summary.c, heatmap.c, progress.c) -------------------------- */

/* One setup's grid of results. */
typedef struct {
  const char *config_file;
  const char *label;
  gboolean is_full;           /* full attention in both phases: the speedup baseline */
  const HarnessGrid *grid;
  HarnessCell *cells;         /* [n_depths][n_lengths] */
  gboolean text;              /* real-text cells (answers scored, not attention outputs) */
} HarnessSetupResult;

double harness_setup_accuracy (const HarnessSetupResult *r);
/* The random baseline's accuracy over the setup's grid: mean and sample
 * standard deviation over seeds (each seed one random grid); NAN without. */
void harness_setup_baseline (const HarnessSetupResult *r, double *mean, double *sd, gsize *n_seeds);
/* The table: per setup accuracy (both, prefill, decode), mean density,
 * bytes loaded, time, speedup over the full setup of the same config. */
void harness_summary_print (FILE *to, const HarnessSetupResult *results, gsize n);
/* With harness.capacities (capacity.c): accuracy per setup (rows) and KV
 * budget (columns); results are [n_caps][n_setups]. */
void harness_capacity_print (FILE *to, const HarnessSetupResult *results, gsize n_setups, const gint64 *caps,
                             gsize n_caps);

/* Colour of a score in [0, 1] on the red-yellow-green scale. */
void harness_heatmap_colour (double score, double rgb[3]);
/* Writes `base`.png and `base`.svg: depth down, length across, each cell
 * coloured by its mean retrieval score. */
gboolean harness_heatmap_write (const HarnessSetupResult *r, const char *base, GError **error);

typedef struct _HarnessProgress HarnessProgress;
/* Draws on `to` only when it is a terminal (or `force`). */
HarnessProgress *harness_progress_new (FILE *to, gsize total, gboolean force);
void harness_progress_update (HarnessProgress *p, gsize done, const char *label, gint64 length,
                              double depth, gsize passed);
void harness_progress_free (HarnessProgress *p);

/* ---- The whole run (needle.c) ----------------------------------------------- */

typedef struct {
  const char *out_dir;        /* NULL: harness.out of the config */
  FILE *table;                /* the summary table (stdout) */
  FILE *log;                  /* progress and where outputs went (stderr) */
  gboolean force_progress;    /* draw the progress line on a non-terminal too */
} HarnessOptions;

/* Runs the grid for every setup of `config` (policies resolved), resuming
 * from OUT/records.jsonl; prints the table, writes the heatmaps. *below_out
 * says whether a setup passed fewer cells than harness.min_accuracy.
 * SIFT_HARNESS_ERROR_INVALID: the config cannot make a grid (a usage
 * error); anything else failed while running. */
gboolean harness_needle_run (const SiftConfig *config, const HarnessOptions *opts, gboolean *below_out,
                             GError **error);

G_END_DECLS
