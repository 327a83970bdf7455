/* `sift needle`: every config's grid for every setup, records, table,
 * heatmaps, exit status. */
#include <math.h>
#include <string.h>

#include "harness.h"

char *
harness_default_config (void)
{
  const char *env = g_getenv ("SIFT_CONFIG_DIR");
  const char *dirs[] = { env, SIFT_INSTALLED_CONFIG_DIR, SIFT_SOURCE_CONFIG_DIR };
  for (gsize i = 0; i < G_N_ELEMENTS (dirs); i++)
    {
      if (dirs[i] == NULL)
        continue;
      char *path = g_build_filename (dirs[i], "default.yaml", NULL);
      if (g_file_test (path, G_FILE_TEST_IS_REGULAR))
        return path;
      g_free (path);
    }
  return NULL;
}

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

/* Catches what would fail in every cell before any runs: the shortest
 * context must hold the needles. */
static gboolean
check_grid (const SiftConfig *cfg, const HarnessGrid *g, GError **error)
{
  if (g_strcmp0 (cfg->source, "synthetic") != 0)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "%s: model.source is '%s'; the needle harness needs the synthetic source", cfg->file,
                   cfg->source);
      return FALSE;
    }
  g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (&cfg->harness, g->lengths[0], 0.0,
                                                          cfg->synthetic.sink_tokens, cfg->harness.seed, error);
  if (plan == NULL)
    {
      g_prefix_error (error, "%s: ", cfg->file);
      return FALSE;
    }
  return TRUE;
}

static void
print_error (FILE *log, const GError *error)
{
  fprintf (log, "sift needle: %s\n", error->message);
}

typedef struct {
  GPtrArray *configs;        /* SiftConfig * */
  GArray *grids;             /* HarnessGrid */
  GArray *results;           /* HarnessSetupResult */
} Run;

static void
run_clear (Run *r)
{
  for (guint i = 0; r->results != NULL && i < r->results->len; i++)
    {
      HarnessSetupResult *s = &g_array_index (r->results, HarnessSetupResult, i);
      gsize n = s->grid->n_lengths * s->grid->n_depths;
      for (gsize c = 0; c < n; c++)
        harness_cell_clear (&s->cells[c]);
      g_free (s->cells);
    }
  for (guint i = 0; r->grids != NULL && i < r->grids->len; i++)
    harness_grid_clear (&g_array_index (r->grids, HarnessGrid, i));
  g_clear_pointer (&r->results, g_array_unref);
  g_clear_pointer (&r->grids, g_array_unref);
  g_clear_pointer (&r->configs, g_ptr_array_unref);
}

static gboolean
load_configs (const HarnessOptions *o, SiftRegistry *registry, Run *run, GError **error)
{
  g_autoptr (GPtrArray) files = g_ptr_array_new_with_free_func (g_free);
  for (char **f = o->configs; f != NULL && *f != NULL; f++)
    g_ptr_array_add (files, g_strdup (*f));
  if (files->len == 0)
    {
      char *def = harness_default_config ();
      if (def == NULL)
        {
          g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                       "no --config given and no default.yaml in $SIFT_CONFIG_DIR, %s or %s",
                       SIFT_INSTALLED_CONFIG_DIR, SIFT_SOURCE_CONFIG_DIR);
          return FALSE;
        }
      g_ptr_array_add (files, def);
    }
  for (guint i = 0; i < files->len; i++)
    {
      SiftConfig *cfg = sift_config_load (g_ptr_array_index (files, i), registry, error);
      if (cfg == NULL)
        return FALSE;
      g_ptr_array_add (run->configs, cfg);
      for (char **s = o->sets; s != NULL && *s != NULL; s++)
        if (!sift_config_set (cfg, *s, registry, error))
          return FALSE;
      if (o->out_dir != NULL)
        {
          g_free (cfg->harness.out_dir);
          cfg->harness.out_dir = g_strdup (o->out_dir);
        }
      HarnessGrid grid;
      if (!harness_grid_expand (&cfg->harness, &grid, error))
        {
          g_prefix_error (error, "%s: ", cfg->file);
          return FALSE;
        }
      g_array_append_val (run->grids, grid);
      if (!check_grid (cfg, &grid, error))
        return FALSE;
    }
  return TRUE;
}

static gboolean
run_grids (const HarnessOptions *o, Run *run, HarnessRecords *records, GError **error)
{
  gsize total = 0, done = 0, passed = 0;
  for (guint i = 0; i < run->configs->len; i++)
    {
      const SiftConfig *cfg = g_ptr_array_index (run->configs, i);
      const HarnessGrid *g = &g_array_index (run->grids, HarnessGrid, i);
      total += cfg->setups->len * g->n_lengths * g->n_depths;
    }
  HarnessProgress *progress = harness_progress_new (o->log, total, o->force_progress);
  gboolean ok = TRUE;
  for (guint i = 0; ok && i < run->configs->len; i++)
    {
      const SiftConfig *cfg = g_ptr_array_index (run->configs, i);
      const HarnessGrid *g = &g_array_index (run->grids, HarnessGrid, i);
      for (guint s = 0; ok && s < cfg->setups->len; s++)
        {
          const SiftPolicySetup *setup = g_ptr_array_index (cfg->setups, s);
          HarnessSetupResult res = {
            .config_file = cfg->file, .label = setup->label, .is_full = is_full (setup), .grid = g,
            .cells = g_new0 (HarnessCell, g->n_lengths * g->n_depths),
          };
          g_array_append_val (run->results, res);
          for (gsize d = 0; ok && d < g->n_depths; d++)
            for (gsize l = 0; ok && l < g->n_lengths; l++)
              {
                HarnessCell *cell = &res.cells[d * g->n_lengths + l];
                g_autofree char *key = harness_settings_key (cfg, setup, g->lengths[l], g->depths[d]);
                harness_progress_update (progress, done, setup->label, g->lengths[l], g->depths[d], passed);
                if (!harness_records_find (records, key, cell))
                  {
                    ok = harness_run_cell (cfg, setup, g->lengths[l], g->depths[d], cell, error);
                    if (!ok)
                      {
                        g_prefix_error (error, "%s: setup '%s', length %" G_GINT64_FORMAT ", depth %g: ",
                                        cfg->file, setup->label, g->lengths[l], g->depths[d]);
                        break;
                      }
                    g_autofree char *line = harness_record_json (cfg, setup, key, cell);
                    ok = harness_records_append (records, line, error);
                  }
                passed += cell->pass;
                done++;
              }
        }
    }
  harness_progress_free (progress);
  return ok;
}

static gboolean
write_heatmaps (const HarnessOptions *o, Run *run, const char *out_dir, GError **error)
{
  gboolean several = run->configs->len > 1;
  for (guint i = 0; i < run->results->len; i++)
    {
      const HarnessSetupResult *r = &g_array_index (run->results, HarnessSetupResult, i);
      g_autofree char *label = slug (r->label);
      g_autofree char *cfg_base = g_path_get_basename (r->config_file);
      char *dot = strrchr (cfg_base, '.');
      if (dot != NULL)
        *dot = '\0';
      g_autofree char *cfg_slug = slug (cfg_base);
      g_autofree char *name = several ? g_strdup_printf ("heatmap-%s-%s", cfg_slug, label)
                                      : g_strdup_printf ("heatmap-%s", label);
      g_autofree char *base = g_build_filename (out_dir, name, NULL);
      if (!harness_heatmap_write (r, base, error))
        return FALSE;
      fprintf (o->log, "heatmap %-20s %s.png  %s.svg\n", r->label, base, base);
    }
  return TRUE;
}

int
harness_needle_main (const HarnessOptions *o)
{
  g_autoptr (SiftRegistry) registry = sift_registry_new ((const char *const *) o->policy_path);
  g_autoptr (GError) error = NULL;
  Run run = {
    .configs = g_ptr_array_new_with_free_func ((GDestroyNotify) sift_config_free),
    .grids = g_array_new (FALSE, TRUE, sizeof (HarnessGrid)),
    .results = g_array_new (FALSE, TRUE, sizeof (HarnessSetupResult)),
  };
  int status = 2;
  if (!load_configs (o, registry, &run, &error))
    {
      print_error (o->log, error);
      run_clear (&run);
      return 2;
    }
  const SiftConfig *first = g_ptr_array_index (run.configs, 0);
  g_autofree char *out_dir = g_strdup (first->harness.out_dir);
  g_autofree char *records_path = g_build_filename (out_dir, "records.jsonl", NULL);
  g_autoptr (HarnessRecords) records = harness_records_open (records_path, &error);
  if (records == NULL || g_mkdir_with_parents (out_dir, 0755) != 0)
    {
      if (error == NULL)
        g_set_error (&error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_IO, "cannot create %s: %s", out_dir,
                     g_strerror (errno));
      print_error (o->log, error);
      run_clear (&run);
      return 2;
    }
  if (!run_grids (o, &run, records, &error))
    {
      print_error (o->log, error);
      run_clear (&run);
      return 2;
    }
  harness_summary_print (o->table, (HarnessSetupResult *) run.results->data, run.results->len);
  fflush (o->table);
  if (!write_heatmaps (o, &run, out_dir, &error))
    {
      print_error (o->log, error);
      run_clear (&run);
      return 2;
    }
  fprintf (o->log, "records %s\n", records_path);
  status = 0;
  for (guint i = 0; i < run.results->len; i++)
    {
      const HarnessSetupResult *r = &g_array_index (run.results, HarnessSetupResult, i);
      for (guint c = 0; c < run.configs->len; c++)
        {
          const SiftConfig *cfg = g_ptr_array_index (run.configs, c);
          if (cfg->file == r->config_file && harness_setup_accuracy (r) < cfg->harness.min_accuracy)
            {
              fprintf (o->log, "sift needle: %s: '%s' passes %.1f%% of cells, below harness.min_accuracy %.1f%%\n",
                       cfg->file, r->label, 100.0 * harness_setup_accuracy (r), 100.0 * cfg->harness.min_accuracy);
              status = 1;
            }
        }
    }
  run_clear (&run);
  return status;
}
