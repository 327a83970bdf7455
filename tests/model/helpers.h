/* Shared by the model tests: seeded normal values, the NMSE of a result
 * against a double-precision reference, the argmax of logits. */
#pragma once

#include <math.h>

#include <glib.h>

/* N(0, scale^2) by Box-Muller. */
static inline void
randn (GRand *r, float *x, gsize n, double scale)
{
  for (gsize i = 0; i < n; i++)
    {
      double u = g_rand_double_range (r, 1e-12, 1), v = g_rand_double (r);
      x[i] = (float) (scale * sqrt (-2 * log (u)) * cos (2 * G_PI * v));
    }
}

static inline double
nmse (const float *y, const double *ref, gsize n)
{
  double num = 0, den = 0;
  for (gsize i = 0; i < n; i++)
    {
      num += (y[i] - ref[i]) * (y[i] - ref[i]);
      den += ref[i] * ref[i];
    }
  return num / MAX (den, 1e-300);
}

/* nmse against a float reference (another kernel's output). */
static inline double
nmse_f (const float *y, const float *ref, gsize n)
{
  double num = 0, den = 0;
  for (gsize i = 0; i < n; i++)
    {
      num += (double) (y[i] - ref[i]) * (y[i] - ref[i]);
      den += (double) ref[i] * ref[i];
    }
  return num / MAX (den, 1e-300);
}

/* The largest |a[i] - b[i]|. */
static inline double
max_diff (const float *a, const float *b, gsize n)
{
  double m = 0;
  for (gsize i = 0; i < n; i++)
    m = MAX (m, fabs ((double) a[i] - b[i]));
  return m;
}

/* The first index of the largest x[i]. */
static inline gint32
argmax (const float *x, gint32 n)
{
  gint32 best = 0;
  for (gint32 i = 1; i < n; i++)
    if (x[i] > x[best])
      best = i;
  return best;
}
