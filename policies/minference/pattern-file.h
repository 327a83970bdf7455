/* Per-head vertical-slash patterns from a file, in MInference's shipped
 * format: a list with one mapping per layer, head id -> [pattern name,
 * vertical size, slash size, score]. JSON or YAML (libyaml reads both). */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct {
  gboolean set;     /* listed in the file */
  gint64 vertical;  /* top columns */
  gint64 slash;     /* top diagonals */
} VsHeadPattern;

typedef struct {
  gint32 n_layers, n_heads;
  VsHeadPattern *heads;  /* [n_layers][n_heads] */
} VsPatternFile;

/* Reads path for a model of n_layers x n_heads query heads. Errors are
 * SIFT_CONFIG_ERROR "path:line:col: message". Layers or heads the file
 * does not list stay unset. */
gboolean vs_pattern_file_load (VsPatternFile *pf, const char *path, gint32 n_layers, gint32 n_heads,
                               GError **error);
void vs_pattern_file_clear (VsPatternFile *pf);
const VsHeadPattern *vs_pattern_file_get (const VsPatternFile *pf, gint32 layer, gint32 head);

G_END_DECLS
