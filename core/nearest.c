/* Nearest-name suggestions: Levenshtein distance over bytes. */
#include <string.h>

#include "nearest.h"

static gsize
distance (const char *a, const char *b)
{
  gsize na = strlen (a), nb = strlen (b);
  g_autofree gsize *row = g_new (gsize, nb + 1);
  for (gsize j = 0; j <= nb; j++)
    row[j] = j;
  for (gsize i = 1; i <= na; i++)
    {
      gsize diag = row[0];
      row[0] = i;
      for (gsize j = 1; j <= nb; j++)
        {
          gsize up = row[j];
          gsize best = diag + (a[i - 1] != b[j - 1]);
          best = MIN (best, up + 1);
          best = MIN (best, row[j - 1] + 1);
          row[j] = best;
          diag = up;
        }
    }
  return row[nb];
}

gsize
sift_nearest_names (const char *name, const char *const *candidates, gsize n_candidates,
                    const char **out, gsize max_out)
{
  g_return_val_if_fail (name != NULL, 0);
  gsize limit = MAX (2, strlen (name) / 3);
  gsize n_out = 0;
  g_autofree gsize *dist = g_new (gsize, max_out + 1);
  for (gsize c = 0; c < n_candidates; c++)
    {
      gsize d = distance (name, candidates[c]);
      /* A prefix of three or more characters ("chunk" for "chunk_size") is close. */
      if (strlen (name) >= 3 && g_str_has_prefix (candidates[c], name))
        d = MIN (d, 1);
      if (d > limit || d == 0)
        continue;
      /* Insertion into the sorted short list; equal distances keep candidate order. */
      gsize pos = n_out;
      while (pos > 0 && dist[pos - 1] > d)
        pos--;
      if (pos >= max_out)
        continue;
      gsize last = MIN (n_out, max_out - 1);
      for (gsize k = last; k > pos; k--)
        {
          out[k] = out[k - 1];
          dist[k] = dist[k - 1];
        }
      out[pos] = candidates[c];
      dist[pos] = d;
      n_out = MIN (n_out + 1, max_out);
    }
  return n_out;
}

const char *
sift_nearest_name (const char *name, const char *const *candidates, gsize n_candidates)
{
  const char *best = NULL;
  return sift_nearest_names (name, candidates, n_candidates, &best, 1) ? best : NULL;
}
