/* Slow, obvious references for Quest's tests: sort everything and take the
 * first, rather than the heap the policy uses. */
#pragma once

#include <math.h>
#include <stdlib.h>

#include <glib.h>

/* qsort has no user pointer: the scores being sorted. */
static const float *oracle_score;

/* Score descending, index ascending, NaN last. */
static int
oracle_cmp (const void *pa, const void *pb)
{
  gsize a = *(const gsize *) pa, b = *(const gsize *) pb;
  float x = oracle_score[a], y = oracle_score[b];
  int na = isnan (x), nb = isnan (y);
  if (na != nb)
    return na - nb;
  if (!na && x != y)
    return x > y ? -1 : 1;
  return a < b ? -1 : a > b;
}

/* Forced blocks (first `sinks`, last `recent`), then every other index in
 * oracle_cmp order until `budget` blocks in all. keep [n] gets 0/1. */
static G_GNUC_UNUSED gsize
oracle_pick (const float *score, gsize n, gsize budget, gsize sinks, gsize recent, guint8 *keep)
{
  gsize forced = 0, n_rest = 0;
  g_autofree gsize *rest = g_new (gsize, n + 1);
  for (gsize i = 0; i < n; i++)
    {
      keep[i] = i < sinks || i + recent >= n;
      if (keep[i])
        forced++;
      else
        rest[n_rest++] = i;
    }
  oracle_score = score;
  qsort (rest, n_rest, sizeof (gsize), oracle_cmp);
  gsize take = budget > forced ? MIN (budget - forced, n_rest) : 0;
  for (gsize j = 0; j < take; j++)
    keep[rest[j]] = 1;
  return forced + take;
}

/* max over the box of q.k, channel by channel in double, from the keys
 * themselves: k [n_valid rows][stride floats], the first d used. */
static G_GNUC_UNUSED double
oracle_bound (const float *q, const float *k, gint32 n_valid, gsize stride, gint32 d)
{
  double s = 0.0;
  for (gint32 i = 0; i < d; i++)
    {
      double lo = INFINITY, hi = -INFINITY;
      for (gint32 t = 0; t < n_valid; t++)
        {
          lo = fmin (lo, k[(gsize) t * stride + (gsize) i]);
          hi = fmax (hi, k[(gsize) t * stride + (gsize) i]);
        }
      s += fmax (q[i] * lo, q[i] * hi);
    }
  return s;
}
