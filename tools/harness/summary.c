/* The summary table on stdout: one row per setup. */
#include <math.h>

#include "harness.h"

static gsize
n_cells (const HarnessSetupResult *r)
{
  return r->grid->n_lengths * r->grid->n_depths;
}

double
harness_setup_accuracy (const HarnessSetupResult *r)
{
  gsize n = n_cells (r), passed = 0;
  for (gsize i = 0; i < n; i++)
    passed += r->cells[i].pass;
  return n > 0 ? (double) passed / (double) n : 0.0;
}

void
harness_setup_baseline (const HarnessSetupResult *r, double *mean, double *sd, gsize *n_seeds)
{
  gsize n = n_cells (r), seeds = n > 0 ? HARNESS_BASELINE_MAX_SEEDS : 0;
  for (gsize i = 0; i < n; i++)
    seeds = MIN (seeds, r->cells[i].baseline.n_seeds);
  *n_seeds = seeds;
  *mean = *sd = NAN;
  if (seeds == 0)
    return;
  /* Each seed is one random grid: its accuracy, then mean and spread. */
  double sum = 0, sum2 = 0;
  for (gsize s = 0; s < seeds; s++)
    {
      gsize passed = 0;
      for (gsize i = 0; i < n; i++)
        passed += r->cells[i].baseline.pass[s];
      double acc = (double) passed / (double) n;
      sum += acc;
      sum2 += acc * acc;
    }
  *mean = sum / (double) seeds;
  *sd = seeds > 1 ? sqrt (MAX (0.0, (sum2 - sum * sum / (double) seeds) / (double) (seeds - 1))) : 0.0;
}

typedef struct {
  double acc, acc_prefill, acc_decode;
  double density_prefill, density_decode;  /* mean over cells with a value */
  double recall_prefill, recall_decode;    /* mean where known; NAN if never */
  double rand_mean, rand_sd;               /* random baseline's accuracy over seeds; NAN without */
  gsize rand_seeds;
  double mib_loaded;                       /* mean per cell */
  double seconds;                          /* prefill + decode, summed over cells */
  double prefill_seconds, decode_seconds;
  double tokens;                           /* prompt tokens summed */
  double rel_error;                        /* mean prefill relative error */
  double match_sum;                        /* text: string_match_all summed over cells */
  int match_n;
} Totals;

static void
mean_add (double v, double *sum, int *n)
{
  if (isfinite (v))
    {
      *sum += v;
      (*n)++;
    }
}

static Totals
totals (const HarnessSetupResult *r)
{
  Totals t = { 0 };
  gsize n = n_cells (r);
  double dp = 0, dd = 0, rp = 0, rd = 0, re = 0;
  int ndp = 0, ndd = 0, nrp = 0, nrd = 0, nre = 0;
  gsize pp = 0, pd = 0;
  for (gsize i = 0; i < n; i++)
    {
      const HarnessCell *c = &r->cells[i];
      /* Text cells: the answer's mean string_match_all and exact matches. */
      if (r->text)
        {
          mean_add (c->match, &t.match_sum, &t.match_n);
          pd += c->exact;
        }
      else
        {
          pp += c->prefill_pass;
          pd += c->decode_pass;
        }
      mean_add (c->prefill_density, &dp, &ndp);
      mean_add (c->decode_density, &dd, &ndd);
      mean_add (c->prefill_recall, &rp, &nrp);
      mean_add (c->decode_recall, &rd, &nrd);
      mean_add (c->prefill_rel_error, &re, &nre);
      t.mib_loaded += (double) (c->prefill_counters.bytes_loaded + c->decode_counters.bytes_loaded) / (1 << 20);
      t.prefill_seconds += c->prefill_seconds;
      t.decode_seconds += c->decode_seconds;
      t.tokens += (double) c->length;
    }
  t.acc = harness_setup_accuracy (r);
  t.acc_prefill = r->text ? (t.match_n ? t.match_sum / t.match_n : NAN) : n ? (double) pp / (double) n : 0;
  t.acc_decode = n ? (double) pd / (double) n : 0;
  t.density_prefill = ndp ? dp / ndp : NAN;
  t.density_decode = ndd ? dd / ndd : NAN;
  t.recall_prefill = nrp ? rp / nrp : NAN;
  t.recall_decode = nrd ? rd / nrd : NAN;
  harness_setup_baseline (r, &t.rand_mean, &t.rand_sd, &t.rand_seeds);
  t.rel_error = nre ? re / nre : NAN;
  t.mib_loaded = n ? t.mib_loaded / (double) n : 0;
  t.seconds = t.prefill_seconds + t.decode_seconds;
  return t;
}

static void
cell_pct (FILE *to, double v)
{
  if (isfinite (v))
    fprintf (to, " %6.1f%%", 100.0 * v);
  else
    fprintf (to, " %7s", "-");
}

void
harness_summary_print (FILE *to, const HarnessSetupResult *results, gsize n)
{
  const char *last_config = NULL;
  for (gsize i = 0; i < n; i++)
    {
      const HarnessSetupResult *r = &results[i];
      if (last_config == NULL || g_strcmp0 (last_config, r->config_file) != 0)
        {
          /* Speedup is over the config's own full setup, cell for cell. */
          const HarnessSetupResult *full = NULL;
          for (gsize j = i; j < n && g_strcmp0 (results[j].config_file, r->config_file) == 0; j++)
            if (results[j].is_full && full == NULL)
              full = &results[j];
          double full_seconds = full != NULL ? totals (full).seconds : NAN;
          fprintf (to, "\n%s: %zu lengths x %zu depths\n", r->config_file, r->grid->n_lengths, r->grid->n_depths);
          fprintf (to, "%-24s %7s %13s %7s %7s %7s %7s %7s %8s %8s %8s %9s %9s %8s %8s\n", "setup", "acc",
                   "random", "vs.rand", r->text ? "match" : "prefill", r->text ? "exact" : "decode", "rec.pf", "rec.dc", "dens.pf", "dens.dc", "rel.err",
                   "MiB/cell", "prefill/s", "time s", "speedup");
          for (gsize j = i; j < n && g_strcmp0 (results[j].config_file, r->config_file) == 0; j++)
            {
              Totals t = totals (&results[j]);
              fprintf (to, "%-24s", results[j].label);
              cell_pct (to, t.acc);
              if (isfinite (t.rand_mean))
                {
                  fprintf (to, " %5.1f%%+-%4.1f%%", 100.0 * t.rand_mean, 100.0 * t.rand_sd);
                  fprintf (to, " %+6.1f%%", 100.0 * (t.acc - t.rand_mean));
                }
              else
                fprintf (to, " %13s %7s", "-", "-");
              cell_pct (to, t.acc_prefill);
              cell_pct (to, t.acc_decode);
              cell_pct (to, t.recall_prefill);
              cell_pct (to, t.recall_decode);
              cell_pct (to, t.density_prefill);
              cell_pct (to, t.density_decode);
              if (isfinite (t.rel_error))
                fprintf (to, " %8.1e", t.rel_error);
              else
                fprintf (to, " %8s", "-");
              fprintf (to, " %9.2f %9.0f %8.2f", t.mib_loaded,
                       t.prefill_seconds > 0 ? t.tokens / t.prefill_seconds : 0.0, t.seconds);
              if (isfinite (full_seconds) && t.seconds > 0)
                fprintf (to, " %7.2fx\n", full_seconds / t.seconds);
              else
                fprintf (to, " %8s\n", "-");
            }
          if (r->text)
            fprintf (to, "acc: cells whose answer holds every value asked (RULER's string_match_all = 1); match: its"
                     " mean; exact: the answer as trained; rel.err: the last layer's attention vs dense\n");
          /* The chance of a hit by luck, worst cell: a pass must not be it. */
          double chance = 0;
          for (gsize j = i; j < n && g_strcmp0 (results[j].config_file, r->config_file) == 0; j++)
            for (gsize c = 0; c < n_cells (&results[j]); c++)
              if (isfinite (results[j].cells[c].chance))
                chance = MAX (chance, results[j].cells[c].chance);
          if (!r->text)
            fprintf (to, "chance of a retrieval hit by luck with the needle unseen: at most %.2g per row (a cell passes"
                     " above 50%% of rows)\n", chance);
          /* How far above luck: cells passed minus those a random selection
           * of the policy's own size passes, or over a bounded cache a
           * random eviction at its capacity (mean over seeds). */
          for (gsize j = i; j < n && g_strcmp0 (results[j].config_file, r->config_file) == 0; j++)
            {
              Totals t = totals (&results[j]);
              double cells = (double) n_cells (&results[j]);
              if (!isfinite (t.rand_mean))
                continue;
              gint64 cap = results[j].cells[0].baseline.capacity_tokens;
              g_autofree char *kind = cap > 0 ? g_strdup_printf ("random eviction at its capacity (%" G_GINT64_FORMAT
                                                                 " tokens)", cap)
                                              : g_strdup ("random blocks at its density");
              fprintf (to, "%s: %.0f of %.0f cells passed, %s %.1f +- %.1f (%zu seeds): %+.1f cells above random\n",
                       results[j].label, t.acc * cells, cells, kind, t.rand_mean * cells, t.rand_sd * cells,
                       t.rand_seeds, (t.acc - t.rand_mean) * cells);
            }
          last_config = r->config_file;
        }
    }
}
