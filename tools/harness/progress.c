/* The progress line on stderr, redrawn in place, only on a terminal. */
#include <stdio.h>
#include <unistd.h>

#include "harness.h"

struct _HarnessProgress {
  FILE *to;
  gsize total;
  gboolean on;
  gint64 start;
};

HarnessProgress *
harness_progress_new (FILE *to, gsize total, gboolean force)
{
  HarnessProgress *p = g_new0 (HarnessProgress, 1);
  p->to = to;
  p->total = total;
  p->on = force || isatty (fileno (to));
  p->start = g_get_monotonic_time ();
  return p;
}

void
harness_progress_update (HarnessProgress *p, gsize done, const char *label, gint64 length, double depth,
                         gsize passed)
{
  if (!p->on)
    return;
  double elapsed = (double) (g_get_monotonic_time () - p->start) / G_USEC_PER_SEC;
  double eta = done > 0 ? elapsed / (double) done * (double) (p->total - done) : 0.0;
  /* \r and erase-line: one line, rewritten. */
  fprintf (p->to, "\r\033[K[%zu/%zu] %s  length %" G_GINT64_FORMAT "  depth %.0f%%  passed %zu  %.0fs left",
           done, p->total, label, length, 100.0 * depth, passed, eta);
  fflush (p->to);
}

void
harness_progress_free (HarnessProgress *p)
{
  if (p == NULL)
    return;
  if (p->on)
    {
      fprintf (p->to, "\r\033[K");
      fflush (p->to);
    }
  g_free (p);
}
