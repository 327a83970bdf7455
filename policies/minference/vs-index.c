/* Vertical-slash index: which keys a tile of query rows visits.
 *
 * MInference's index builder turns each slash diagonal into the key range
 * the whole tile of rows covers along it, [a - d, b - d), and merges the
 * overlapping ranges, so the kernel runs dense sub-blocks instead of single
 * diagonal elements; vertical columns inside a merged range are dropped
 * (the range visits them already). Here the ranges are produced for one
 * key window at a time, straight from the sorted distances. */
#include "vs.h"

gsize
vs_tile_ranges (const VsPattern *p, gint64 a, gint64 b, gint64 k0, gint64 k1, VsRange *out)
{
  const gint64 lo = MAX (k0, 0), hi = MIN (k1, b);
  if (lo >= hi || p->n_slash == 0)
    return 0;
  /* Diagonal d meets [lo, hi) iff a - hi < d < b - lo. */
  gsize first = sift_lower_bound (p->slash, p->n_slash, a - hi + 1);
  gsize last = sift_lower_bound (p->slash, p->n_slash, b - lo); /* exclusive */
  gsize n = 0;
  /* Descending d gives ascending starts. */
  for (gsize i = last; i-- > first;)
    {
      gint64 d = p->slash[i];
      gint64 s = MAX (a - d, lo), e = MIN (b - d, hi);
      if (s >= e)
        continue;
      if (n > 0 && s <= out[n - 1].end)
        out[n - 1].end = MAX (out[n - 1].end, e);
      else
        out[n++] = (VsRange) { s, e };
    }
  return n;
}

gint64
vs_pattern_count (const VsPattern *p, gint64 q_pos, gint64 n_q, gint32 tile, VsRange *scratch)
{
  gint64 total = 0;
  for (gint64 a = q_pos; a < q_pos + n_q; a += tile)
    {
      const gint64 b = MIN (a + tile, q_pos + n_q);
      gsize nr = vs_tile_ranges (p, a, b, 0, b, scratch);
      for (gsize i = 0; i < nr; i++)
        for (gint64 row = a; row < b; row++)
          total += MAX (0, MIN (scratch[i].end, row + 1) - scratch[i].start);
      gsize ri = 0;
      for (gsize c = 0; c < p->n_vertical && p->vertical[c] < b; c++)
        {
          gint64 col = p->vertical[c];
          while (ri < nr && scratch[ri].end <= col)
            ri++;
          if (ri < nr && scratch[ri].start <= col)
            continue; /* inside a range */
          total += b - MAX (a, col);
        }
    }
  return total;
}
