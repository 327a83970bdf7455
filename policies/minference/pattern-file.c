/* Pattern files: MInference's per-layer, per-head best-pattern lists. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <yaml.h>

#include <sift/plugin.h>

#include "pattern-file.h"

typedef struct {
  const char *path;
  yaml_document_t *doc;
} Reader;

static gboolean
node_error (const Reader *rd, const yaml_node_t *node, GError **error, SiftConfigError code,
            const char *fmt, ...) G_GNUC_PRINTF (5, 6);

static gboolean
node_error (const Reader *rd, const yaml_node_t *node, GError **error, SiftConfigError code,
            const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  /* No node (an empty file): point at its start. */
  g_set_error (error, SIFT_CONFIG_ERROR, code, "%s:%zu:%zu: %s", rd->path,
               node ? node->start_mark.line + 1 : 1, node ? node->start_mark.column + 1 : 1, msg);
  return FALSE;
}

/* A scalar holding an integer in [lo, hi]. */
static gboolean
node_int (const Reader *rd, const yaml_node_t *node, const char *what, gint64 lo, gint64 hi,
          gint64 *out, GError **error)
{
  if (node == NULL || node->type != YAML_SCALAR_NODE)
    return node_error (rd, node, error, SIFT_CONFIG_ERROR_TYPE, "%s must be an integer", what);
  const char *text = (const char *) node->data.scalar.value;
  char *end = NULL;
  errno = 0;
  gint64 v = g_ascii_strtoll (text, &end, 10);
  if (errno != 0 || end == text || *end != '\0')
    return node_error (rd, node, error, SIFT_CONFIG_ERROR_TYPE, "%s must be an integer, not '%s'",
                       what, text);
  if (v < lo || v > hi)
    return node_error (rd, node, error, SIFT_CONFIG_ERROR_RANGE,
                       "%s %" G_GINT64_FORMAT " is outside [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "]",
                       what, v, lo, hi);
  *out = v;
  return TRUE;
}

/* [name, vertical, slash] or [name, vertical, slash, score]. */
static gboolean
read_head (const Reader *rd, const yaml_node_t *node, VsHeadPattern *hp, GError **error)
{
  if (node->type != YAML_SEQUENCE_NODE)
    return node_error (rd, node, error, SIFT_CONFIG_ERROR_TYPE,
                       "a head's pattern must be a list [name, vertical, slash, score]");
  yaml_node_item_t *it = node->data.sequence.items.start;
  gsize n = (gsize) (node->data.sequence.items.top - it);
  if (n < 3 || n > 4)
    return node_error (rd, node, error, SIFT_CONFIG_ERROR_TYPE,
                       "a head's pattern has %zu items; expected [name, vertical, slash] and an optional score", n);
  yaml_node_t *name = yaml_document_get_node (rd->doc, it[0]);
  if (name->type != YAML_SCALAR_NODE)
    return node_error (rd, name, error, SIFT_CONFIG_ERROR_TYPE, "pattern name must be a string");
  const char *nm = (const char *) name->data.scalar.value;
  if (strcmp (nm, "vertical_and_slash") != 0)
    return node_error (rd, name, error, SIFT_CONFIG_ERROR_RANGE,
                       "pattern '%s' is not supported (this policy runs vertical_and_slash)", nm);
  if (!node_int (rd, yaml_document_get_node (rd->doc, it[1]), "vertical size", 1, G_MAXINT32,
                 &hp->vertical, error)
      || !node_int (rd, yaml_document_get_node (rd->doc, it[2]), "slash size", 1, G_MAXINT32,
                    &hp->slash, error))
    return FALSE;
  hp->set = TRUE;
  return TRUE;
}

static gboolean
read_root (const Reader *rd, VsPatternFile *pf, GError **error)
{
  yaml_node_t *root = yaml_document_get_root_node (rd->doc);
  if (root == NULL)
    return node_error (rd, NULL, error, SIFT_CONFIG_ERROR_SYNTAX, "the file is empty");
  if (root->type != YAML_SEQUENCE_NODE)
    return node_error (rd, root, error, SIFT_CONFIG_ERROR_TYPE,
                       "expected a list with one mapping per layer");
  yaml_node_item_t *layers = root->data.sequence.items.start;
  gsize n_layers = (gsize) (root->data.sequence.items.top - layers);
  if (n_layers > (gsize) pf->n_layers)
    return node_error (rd, root, error, SIFT_CONFIG_ERROR_RANGE,
                       "the file lists %zu layers; the model has %d", n_layers, pf->n_layers);
  for (gsize l = 0; l < n_layers; l++)
    {
      yaml_node_t *layer = yaml_document_get_node (rd->doc, layers[l]);
      if (layer->type != YAML_MAPPING_NODE)
        return node_error (rd, layer, error, SIFT_CONFIG_ERROR_TYPE,
                           "layer %zu must be a mapping of head id to pattern", l);
      for (yaml_node_pair_t *p = layer->data.mapping.pairs.start; p < layer->data.mapping.pairs.top; p++)
        {
          gint64 head = 0;
          if (!node_int (rd, yaml_document_get_node (rd->doc, p->key), "head id", 0, pf->n_heads - 1,
                         &head, error))
            return FALSE;
          VsHeadPattern *hp = &pf->heads[l * pf->n_heads + head];
          if (hp->set)
            return node_error (rd, yaml_document_get_node (rd->doc, p->key), error,
                               SIFT_CONFIG_ERROR_DUPLICATE_KEY, "head %" G_GINT64_FORMAT
                               " of layer %zu is listed twice", head, l);
          if (!read_head (rd, yaml_document_get_node (rd->doc, p->value), hp, error))
            return FALSE;
        }
    }
  return TRUE;
}

gboolean
vs_pattern_file_load (VsPatternFile *pf, const char *path, gint32 n_layers, gint32 n_heads, GError **error)
{
  memset (pf, 0, sizeof *pf);
  FILE *f = fopen (path, "rb");
  if (f == NULL)
    {
      int err = errno;
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_IO, "%s: cannot open pattern file: %s",
                   path, g_strerror (err));
      return FALSE;
    }
  yaml_parser_t parser;
  yaml_document_t doc;
  yaml_parser_initialize (&parser);
  yaml_parser_set_input_file (&parser, f);
  gboolean ok = yaml_parser_load (&parser, &doc);
  if (!ok)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_SYNTAX, "%s:%zu:%zu: %s", path,
                   parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                   parser.problem ? parser.problem : "syntax error");
      yaml_parser_delete (&parser);
      fclose (f);
      return FALSE;
    }
  pf->n_layers = n_layers;
  pf->n_heads = n_heads;
  pf->heads = g_new0 (VsHeadPattern, (gsize) n_layers * n_heads);
  Reader rd = { path, &doc };
  ok = read_root (&rd, pf, error);
  yaml_document_delete (&doc);
  yaml_parser_delete (&parser);
  fclose (f);
  if (!ok)
    vs_pattern_file_clear (pf);
  return ok;
}

void
vs_pattern_file_clear (VsPatternFile *pf)
{
  g_clear_pointer (&pf->heads, g_free);
  pf->n_layers = pf->n_heads = 0;
}

const VsHeadPattern *
vs_pattern_file_get (const VsPatternFile *pf, gint32 layer, gint32 head)
{
  if (pf->heads == NULL || layer < 0 || layer >= pf->n_layers || head < 0 || head >= pf->n_heads)
    return NULL;
  const VsHeadPattern *hp = &pf->heads[(gsize) layer * pf->n_heads + head];
  return hp->set ? hp : NULL;
}
