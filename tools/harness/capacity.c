/* With harness.capacities: accuracy against the KV budget, one row per
 * setup, one column per budget (docs/eviction.md). */
#include <string.h>

#include "harness.h"

/* The mean decode recall of a setup's cells (needles still held and
 * selected), or -1 when nothing was known. */
static double
decode_recall (const HarnessSetupResult *r)
{
  double sum = 0;
  int n = 0;
  for (gsize i = 0; i < r->grid->n_lengths * r->grid->n_depths; i++)
    if (r->cells[i].decode_recall == r->cells[i].decode_recall) /* not NaN */
      {
        sum += r->cells[i].decode_recall;
        n++;
      }
  return n > 0 ? sum / n : -1;
}

void
harness_capacity_print (FILE *to, const HarnessSetupResult *results, gsize n_setups, const gint64 *caps,
                        gsize n_caps)
{
  fprintf (to, "\naccuracy (decode recall) by KV budget, tokens per layer:\n%-16s", "setup");
  for (gsize c = 0; c < n_caps; c++)
    {
      g_autofree char *head = caps[c] > 0 ? g_strdup_printf ("%" G_GINT64_FORMAT, caps[c]) : g_strdup ("unbounded");
      fprintf (to, " %14s", head);
    }
  fprintf (to, "\n");
  for (gsize s = 0; s < n_setups; s++)
    {
      /* The setup's own label: the first column's, without its @budget. */
      const char *label = results[s].label;
      const char *at = strrchr (label, '@');
      fprintf (to, "%-16.*s", (int) (at ? at - label : (long) strlen (label)), label);
      for (gsize c = 0; c < n_caps; c++)
        {
          const HarnessSetupResult *r = &results[c * n_setups + s];
          double rec = decode_recall (r);
          g_autofree char *cell = rec >= 0 ? g_strdup_printf ("%3.0f%% (%3.0f%%)", 100 * harness_setup_accuracy (r),
                                                              100 * rec)
                                           : g_strdup_printf ("%3.0f%%", 100 * harness_setup_accuracy (r));
          fprintf (to, " %14s", cell);
        }
      fprintf (to, "\n");
    }
}
