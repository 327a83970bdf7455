/* Nearest-name suggestions for error messages ("did you mean ...?"). */
#pragma once

#include <glib.h>

/* Up to max_out candidates close to `name` by edit distance, nearest first
 * (ties in candidate order), written to out; returns how many. A candidate
 * is close when its distance is at most max (2, strlen (name) / 3), or
 * when name (three characters or more) is a prefix of it. */
gsize sift_nearest_names (const char *name, const char *const *candidates, gsize n_candidates,
                          const char **out, gsize max_out);

/* The single nearest candidate, or NULL when none is close. */
const char *sift_nearest_name (const char *name, const char *const *candidates, gsize n_candidates);
