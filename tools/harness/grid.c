/* The grid: context lengths x needle depths, as lists or spacings. */
#include <math.h>
#include <stdlib.h>

#include "harness.h"

/* Steepness of the logistic spacing: at 10 the middle step is about a
 * twelfth of the end steps (compare the classic harness's logistic depths). */
#define SIGMOID_K 10.0

void
harness_spacing (SiftSpacing spacing, gsize n, double *out)
{
  if (n == 1)
    {
      out[0] = spacing == SIFT_SPACING_SIGMOID ? 0.5 : 0.0;
      return;
    }
  double lo = 1.0 / (1.0 + exp (SIGMOID_K * 0.5)), hi = 1.0 / (1.0 + exp (-SIGMOID_K * 0.5));
  for (gsize i = 0; i < n; i++)
    {
      double t = (double) i / (double) (n - 1);
      /* The logistic maps evenly spaced t onto values that crowd near 0 and
       * 1: a needle's behaviour changes most at the context's two ends. */
      if (spacing == SIFT_SPACING_SIGMOID)
        {
          double s = 1.0 / (1.0 + exp (-SIGMOID_K * (t - 0.5)));
          t = (s - lo) / (hi - lo);
        }
      out[i] = t;
    }
  out[0] = 0.0;
  out[n - 1] = 1.0;
}

static int
cmp_i64 (const void *a, const void *b)
{
  gint64 x = *(const gint64 *) a, y = *(const gint64 *) b;
  return x < y ? -1 : x > y;
}

static int
cmp_double (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return x < y ? -1 : x > y;
}

static gboolean
grid_error (GError **error, const char *what, const char *why)
{
  g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID, "harness.%s: %s", what, why);
  return FALSE;
}

static gboolean
expand_lengths (const SiftHarnessConfig *h, HarnessGrid *g, GError **error)
{
  if (h->length_spacing == SIFT_SPACING_EXPLICIT)
    {
      if (h->n_lengths == 0)
        return grid_error (error, "lengths", "the list is empty");
      g->lengths = g_memdup2 (h->lengths, h->n_lengths * sizeof (gint64));
      g->n_lengths = h->n_lengths;
    }
  else
    {
      if (h->length_count < 1 || h->length_count > 4096 || h->length_min < 1 || h->length_max < h->length_min)
        return grid_error (error, "length_count",
                           "spaced lengths need 1 <= length_count <= 4096 and 1 <= length_min <= length_max");
      g_autofree double *t = g_new (double, h->length_count);
      harness_spacing (h->length_spacing, (gsize) h->length_count, t);
      g->lengths = g_new (gint64, h->length_count);
      g->n_lengths = (gsize) h->length_count;
      for (gsize i = 0; i < g->n_lengths; i++)
        g->lengths[i] = h->length_min + llround (t[i] * (double) (h->length_max - h->length_min));
    }
  qsort (g->lengths, g->n_lengths, sizeof (gint64), cmp_i64);
  gsize m = 0;
  for (gsize i = 0; i < g->n_lengths; i++)
    {
      if (g->lengths[i] < 1)
        return grid_error (error, "lengths", "every length must be >= 1");
      if (m == 0 || g->lengths[i] != g->lengths[m - 1])
        g->lengths[m++] = g->lengths[i];
    }
  g->n_lengths = m;
  return TRUE;
}

static gboolean
expand_depths (const SiftHarnessConfig *h, HarnessGrid *g, GError **error)
{
  if (h->depth_spacing == SIFT_SPACING_EXPLICIT)
    {
      if (h->n_depths == 0)
        return grid_error (error, "depths", "the list is empty");
      g->depths = g_memdup2 (h->depths, h->n_depths * sizeof (double));
      g->n_depths = h->n_depths;
    }
  else
    {
      if (h->depth_count < 1 || h->depth_count > 1024)
        return grid_error (error, "depth_count", "spaced depths need 1 <= depth_count <= 1024");
      g->depths = g_new (double, h->depth_count);
      g->n_depths = (gsize) h->depth_count;
      harness_spacing (h->depth_spacing, g->n_depths, g->depths);
    }
  qsort (g->depths, g->n_depths, sizeof (double), cmp_double);
  gsize m = 0;
  for (gsize i = 0; i < g->n_depths; i++)
    {
      if (!(g->depths[i] >= 0.0 && g->depths[i] <= 1.0))
        return grid_error (error, "depths", "every depth must be within [0, 1]");
      if (m == 0 || g->depths[i] != g->depths[m - 1])
        g->depths[m++] = g->depths[i];
    }
  g->n_depths = m;
  return TRUE;
}

gboolean
harness_grid_expand (const SiftHarnessConfig *h, HarnessGrid *grid, GError **error)
{
  *grid = (HarnessGrid) { 0 };
  if (!expand_lengths (h, grid, error) || !expand_depths (h, grid, error))
    {
      harness_grid_clear (grid);
      return FALSE;
    }
  return TRUE;
}

void
harness_grid_clear (HarnessGrid *grid)
{
  g_clear_pointer (&grid->lengths, g_free);
  g_clear_pointer (&grid->depths, g_free);
  grid->n_lengths = grid->n_depths = 0;
}
