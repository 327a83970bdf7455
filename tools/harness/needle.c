/* `sift needle`: the grid for every setup, records, table, heatmaps. */
#include <errno.h>
#include <unistd.h>
#include <math.h>
#include <string.h>

#include "harness.h"

/* A file name piece from a label: [a-z0-9._-], anything else '-'. */
static char *
slug (const char *s)
{
  char *r = g_ascii_strdown (s, -1);
  for (char *p = r; *p; p++)
    if (!g_ascii_isalnum (*p) && *p != '.' && *p != '_' && *p != '-')
      *p = '-';
  return r;
}

static gboolean
is_full (const SiftPolicySetup *s)
{
  return g_strcmp0 (s->prefill.name, "full") == 0 && g_strcmp0 (s->decode.name, "full") == 0;
}

/* The keys a failed check may blame: the error is placed at whichever was
 * written last (file:line:col), or at the file when all are defaults. */
static const char *const plan_keys[] = {
  "harness.lengths", "harness.length_min", "harness.question_tokens", "harness.needle",
  "harness.n_distractors", "harness.n_values", "harness.n_queries", "model.synthetic.sink_tokens", NULL,
};
static const char *const model_keys[] = {
  "model.layers", "model.q_heads", "model.kv_heads", "model.head_dim", "model.synthetic.sink_tokens",
  "model.synthetic.sink_strength", "model.synthetic.locality", "model.synthetic.locality_scale",
  "model.synthetic.heavy_hitters", "model.synthetic.heavy_hitter_strength", "model.synthetic.rope_dims",
  "model.synthetic.rope_base", "model.synthetic.retrieval_heads", "model.synthetic.needle_strength",
  "model.synthetic.noise", "model.synthetic.drift", "model.synthetic.drift_scale",
  "model.synthetic.logn_length", "model.synthetic.planted_keys", NULL,
};

/* Replaces *error by its message placed in the config; returns FALSE. */
static gboolean
config_error (const SiftConfig *cfg, const char *const *keys, GError **error)
{
  if (error == NULL || *error == NULL)
    return FALSE;
  g_autofree char *text = sift_config_locate (cfg, keys, (*error)->message);
  g_clear_error (error);
  g_set_error_literal (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID, text);
  return FALSE;
}

/* Catches what would fail in every cell before any runs. */
static const char *const text_keys[] = {
  "harness.lengths", "harness.length_min", "harness.needle", "harness.n_distractors", "harness.n_values",
  "harness.n_queries", "harness.value", NULL,
};

static gboolean
check_config (const SiftConfig *cfg, const HarnessGrid *g, HarnessText *text, GError **error)
{
  if (text != NULL)
    return harness_text_check (text, cfg, g->lengths[0], error) || config_error (cfg, text_keys, error);
  if (g_strcmp0 (cfg->source, "synthetic") != 0)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "%s: model.source is '%s'; the needle harness runs the synthetic source or a GGUF model"
                   " (model.source gguf)", cfg->file, cfg->source);
      return FALSE;
    }
  /* The shortest context must hold the needles. */
  g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (sift_harness_config (cfg), g->lengths[0], 0.0,
                                                          sift_synthetic_config (cfg)->sink_tokens, cfg->shape.block_size, sift_harness_config (cfg)->seed, error);
  if (plan == NULL)
    return config_error (cfg, plan_keys, error);
  /* The model must take the knobs and the plan's needle keys. */
  g_autoptr (SiftModel) src = sift_model_synthetic_new (&cfg->shape, sift_synthetic_seed (cfg), sift_synthetic_config (cfg), plan, error);
  return src != NULL || config_error (cfg, model_keys, error);
}

static void
results_free (HarnessSetupResult *results, gsize n)
{
  for (gsize i = 0; i < n; i++)
    {
      gsize cells = results[i].grid->n_lengths * results[i].grid->n_depths;
      for (gsize c = 0; c < cells; c++)
        harness_cell_clear (&results[i].cells[c]);
      g_free (results[i].cells);
    }
  g_free (results);
}

static gint64
setup_capacity (const SiftConfig *cfg, const SiftPolicySetup *setup)
{
  return setup->capacity_tokens >= 0 ? setup->capacity_tokens : sift_kv_config (cfg)->capacity_tokens;
}

static gboolean
run_grid (const SiftConfig *cfg, HarnessText *text, const HarnessOptions *o, const HarnessGrid *g,
          HarnessRecords *records, HarnessSetupResult *results, GError **error)
{
  gsize total = cfg->setups->len * g->n_lengths * g->n_depths, done = 0, passed = 0, fresh = 0;
  HarnessProgress *progress = harness_progress_new (o->log, total, o->force_progress);
  gboolean ok = TRUE;
  for (guint s = 0; ok && s < cfg->setups->len; s++)
    {
      const SiftPolicySetup *setup = g_ptr_array_index (cfg->setups, s);
      HarnessSetupResult *res = &results[s];
      /* A setup's own KV budget (policy.capacity_tokens) replaces kv's. */
      g_autoptr (SiftConfig) own = sift_config_copy (cfg);
      sift_kv_config_edit (own)->capacity_tokens
        = setup_capacity (cfg, setup);
      for (gsize d = 0; ok && d < g->n_depths; d++)
        for (gsize l = 0; ok && l < g->n_lengths; l++)
          {
            HarnessCell *cell = &res->cells[d * g->n_lengths + l];
            g_autofree char *key = harness_settings_key (own, setup, g->lengths[l], g->depths[d]);
            harness_progress_update (progress, done, setup->label, g->lengths[l], g->depths[d], passed);
            if (!harness_records_find (records, key, cell))
              {
                ok = text != NULL ? harness_text_run_cell (text, own, setup, res->is_full, g->lengths[l],
                                                           g->depths[d], cell, error)
                                  : harness_run_cell (own, setup, g->lengths[l], g->depths[d], cell, error);
                if (!ok)
                  {
                    g_prefix_error (error, "setup '%s', length %" G_GINT64_FORMAT ", depth %g: ", setup->label,
                                    g->lengths[l], g->depths[d]);
                    break;
                  }
                g_autofree char *line = harness_record_json (own, setup, key, cell);
                ok = harness_records_append (records, line, error);
                fresh++;
              }
            passed += cell->pass;
            done++;
          }
    }
  harness_progress_free (progress);
  if (ok && fresh < total)
    fprintf (o->log, "resumed %zu of %zu cells from the records\n", total - fresh, total);
  return ok;
}

static gboolean
write_heatmaps (const HarnessOptions *o, const HarnessSetupResult *results, gsize n, const char *out_dir,
                GError **error)
{
  for (gsize i = 0; i < n; i++)
    {
      g_autofree char *label = slug (results[i].label);
      g_autofree char *name = g_strdup_printf ("heatmap-%s", label);
      g_autofree char *base = g_build_filename (out_dir, name, NULL);
      if (!harness_heatmap_write (&results[i], base, error))
        return FALSE;
      fprintf (o->log, "heatmap %-16s %s.png  %s.svg\n", results[i].label, base, base);
    }
  return TRUE;
}

gboolean
harness_needle_run (const SiftConfig *cfg, const HarnessOptions *o, gboolean *below_out, GError **error)
{
  *below_out = FALSE;
  HarnessGrid grid;
  if (!harness_grid_expand (sift_harness_config (cfg), &grid, error))
    {
      g_prefix_error (error, "%s: ", cfg->file);
      return FALSE;
    }
  /* A GGUF model: text needles, generated answers (docs/needle.md, "Real text"). */
  g_autoptr (HarnessText) text = NULL;
  if (g_strcmp0 (cfg->source, "gguf") == 0 && (text = harness_text_new (cfg, error)) == NULL)
    {
      harness_grid_clear (&grid);
      return FALSE;
    }
  if (!check_config (cfg, &grid, text, error))
    {
      harness_grid_clear (&grid);
      return FALSE;
    }
  if (text != NULL && grid.lengths[grid.n_lengths - 1] > harness_text_context_length (text))
    fprintf (o->log, "sift needle: note: lengths above %" G_GINT64_FORMAT " pass the model's trained context"
             " (%s): expect it to fail there\n", harness_text_context_length (text), harness_text_model_path (text));
  const char *out_dir = o->out_dir != NULL ? o->out_dir : sift_harness_config (cfg)->out_dir;
  g_autofree char *records_path = g_build_filename (out_dir, "records.jsonl", NULL);
  /* An output folder that cannot be made or written is a usage error found
   * before the first cell runs, not after it. */
  if (out_dir[0] == '\0' || g_mkdir_with_parents (out_dir, 0755) != 0 || access (out_dir, W_OK | X_OK) != 0)
    {
      int err = out_dir[0] == '\0' ? ENOENT : errno;
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID, "output folder '%s' cannot be written: %s",
                   out_dir, g_strerror (err));
      harness_grid_clear (&grid);
      return FALSE;
    }
  g_autoptr (HarnessRecords) records = harness_records_open (records_path, error);
  /* harness.capacities: the grid once per KV budget, each setup's column
   * labelled with it (docs/eviction.md); otherwise kv.capacity_tokens alone. */
  const SiftHarnessConfig *h = sift_harness_config (cfg);
  const gsize n_caps = MAX (h->n_capacities, 1), n_setups = cfg->setups->len, n = n_setups * n_caps;
  g_autoptr (GPtrArray) labels = g_ptr_array_new_with_free_func (g_free);
  HarnessSetupResult *results = g_new0 (HarnessSetupResult, n);
  for (gsize ci = 0; ci < n_caps; ci++)
    for (guint s = 0; s < n_setups; s++)
      {
        const SiftPolicySetup *setup = g_ptr_array_index (cfg->setups, s);
        const char *label = setup->label;
        if (h->n_capacities > 0)
          {
            label = h->capacities[ci] > 0 ? g_strdup_printf ("%s@%" G_GINT64_FORMAT, setup->label, h->capacities[ci])
                                          : g_strdup_printf ("%s@unbounded", setup->label);
            g_ptr_array_add (labels, (gpointer) label);
          }
        results[ci * n_setups + s] = (HarnessSetupResult) {
          .config_file = cfg->file, .label = label, .grid = &grid, .text = text != NULL,
          .cells = g_new0 (HarnessCell, grid.n_lengths * grid.n_depths),
          /* Full attention over a bounded cache is no yardstick. */
          .is_full = is_full (setup)
                     && (setup->capacity_tokens >= 0 ? setup->capacity_tokens
                         : h->n_capacities > 0 ? h->capacities[ci] : sift_kv_config (cfg)->capacity_tokens) == 0,
        };
      }
  /* A copy whose out_dir is the one used (the file store lives there). */
  g_autoptr (SiftConfig) local = sift_config_copy (cfg);
  SiftHarnessConfig *local_h = sift_config_edit_section (local, &sift_harness_config_section);
  g_free (local_h->out_dir);
  local_h->out_dir = g_strdup (out_dir);
  if (text != NULL) /* records and settings name the model's own shape */
    local->shape = *harness_text_shape (text);
  gboolean ok = records != NULL;
  for (gsize ci = 0; ok && ci < n_caps; ci++)
    {
      if (h->n_capacities > 0)
        sift_kv_config_edit (local)->capacity_tokens
          = h->capacities[ci];
      ok = run_grid (local, text, o, &grid, records, results + ci * n_setups, error);
    }
  if (ok)
    {
      harness_summary_print (o->table, results, n);
      if (h->n_capacities > 0)
        harness_capacity_print (o->table, results, n_setups, h->capacities, h->n_capacities);
      fflush (o->table);
      ok = write_heatmaps (o, results, n, out_dir, error);
    }
  if (ok)
    {
      fprintf (o->log, "records %s\n", records_path);
      /* Dense attention is the yardstick: if it misses needles, the grid
       * asks more than the model can answer and every column reads low. */
      for (gsize i = 0; i < n; i++)
        if (text != NULL && results[i].is_full && harness_setup_accuracy (&results[i]) < 1.0)
          fprintf (o->log, "sift needle: note: full attention ('%s') fails %.0f%% of cells: the model does not"
                   " answer every cell even with all of its context (models/README.md has its accuracy)\n",
                   results[i].label, 100.0 * (1.0 - harness_setup_accuracy (&results[i])));
        else if (results[i].is_full && harness_setup_accuracy (&results[i]) < 1.0)
          fprintf (o->log, "sift needle: warning: full attention ('%s') fails %.0f%% of cells: the needles are too"
                   " faint for these lengths; raise model.synthetic.needle_strength (docs/synthetic-model.md)\n",
                   results[i].label, 100.0 * (1.0 - harness_setup_accuracy (&results[i])));
      for (gsize i = 0; i < n; i++)
        if (harness_setup_accuracy (&results[i]) < sift_harness_config (cfg)->min_accuracy)
          {
            fprintf (o->log, "sift needle: '%s' passes %.1f%% of cells, below harness.min_accuracy %.1f%%\n",
                     results[i].label, 100.0 * harness_setup_accuracy (&results[i]),
                     100.0 * sift_harness_config (cfg)->min_accuracy);
            *below_out = TRUE;
          }
    }
  results_free (results, n);
  harness_grid_clear (&grid);
  return ok;
}
