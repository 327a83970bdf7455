/* The config's parser: YAML documents (libyaml) walked through the key
 * tables, each value checked and stored. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>

#include "config-private.h"
#include "nearest.h"
#include "params-private.h"
#include "policy-private.h"

/* ---- Values ------------------------------------------------------------------- */


gboolean
sift_config_expect_scalar (Ctx *c, yaml_node_t *node, const char *path, const char *what, GError **error)
{
  if (node->type == YAML_SCALAR_NODE && (node->data.scalar.length > 0 || sift_config_quoted (node)))
    return TRUE;
  Origin at = sift_config_origin_of (c, node);
  if (node->type == YAML_SCALAR_NODE)
    FAIL (TYPE, &at, "%s: expected %s, got nothing", path, what);
  else
    FAIL (TYPE, &at, "%s: expected %s, got %s", path, what, sift_config_node_kind (node));
  return FALSE;
}

static gboolean
number (Ctx *c, const Key *k, yaml_node_t *node, const char *path, gboolean integer, double *as_double,
        gint64 *as_int, GError **error)
{
  const char *what = integer ? "an integer" : "a number";
  if (!sift_config_expect_scalar (c, node, path, what, error))
    return FALSE;
  Origin at = sift_config_origin_of (c, node);
  const char *text = sift_config_scalar (node);
  gboolean ok = !sift_config_quoted (node);
  if (ok && integer)
    {
      ok = sift_text_to_int (text, as_int);
      *as_double = (double) *as_int;
    }
  else if (ok)
    ok = sift_text_to_float (text, as_double);
  if (!ok && !sift_config_quoted (node) && sift_text_beyond_range (text, integer))
    {
      g_autofree char *range = sift_range_to_text (k->min, k->max, integer);
      FAIL (RANGE, &at, "%s: %s is out of range %s", path, text, k->min <= k->max ? range : "(too large)");
      return FALSE;
    }
  if (!ok)
    {
      FAIL (TYPE, &at, "%s: expected %s, got '%s'", path, what, text);
      return FALSE;
    }
  if (k->min <= k->max && (*as_double < k->min || *as_double > k->max))
    {
      g_autofree char *range = sift_range_to_text (k->min, k->max, integer);
      FAIL (RANGE, &at, "%s: %s is out of range %s", path, text, range);
      return FALSE;
    }
  return TRUE;
}

static gboolean
list (Ctx *c, const Key *k, yaml_node_t *node, const char *path, gpointer *out, gsize *n_out, GError **error)
{
  gboolean integer = k->type == KEY_INT_LIST;
  if (node->type != YAML_SEQUENCE_NODE)
    {
      Origin at = sift_config_origin_of (c, node);
      FAIL (TYPE, &at, "%s: expected a list of %s (e.g. [1, 2]), got %s", path, integer ? "integers" : "numbers",
            sift_config_node_kind (node));
      return FALSE;
    }
  gsize n = (gsize) (node->data.sequence.items.top - node->data.sequence.items.start);
  gsize elem = integer ? sizeof (gint64) : sizeof (double);
  g_autofree guint8 *values = g_malloc0 (elem * (n + 1));
  for (gsize i = 0; i < n; i++)
    {
      yaml_node_t *item = yaml_document_get_node (c->doc, node->data.sequence.items.start[i]);
      g_autofree char *item_path = g_strdup_printf ("%s[%" G_GSIZE_FORMAT "]", path, i);
      double d;
      gint64 v = 0;
      if (!number (c, k, item, item_path, integer, &d, &v, error))
        return FALSE;
      if (integer)
        ((gint64 *) (void *) values)[i] = v;
      else
        ((double *) (void *) values)[i] = d;
    }
  g_free (*out);
  *out = g_steal_pointer (&values);
  *n_out = n;
  return TRUE;
}

static gboolean
one_of (Ctx *c, const EnumValue *values, yaml_node_t *node, const char *path, int *index, GError **error)
{
  g_autofree char *all = values[0].name != NULL ? sift_config_enum_list (values) : g_strdup ("(none registered)");
  if (!sift_config_expect_scalar (c, node, path, all, error))
    return FALSE;
  const char *text = sift_config_scalar (node);
  g_autoptr (GPtrArray) names = g_ptr_array_new ();
  for (int i = 0; values[i].name; i++)
    {
      if (strcmp (text, values[i].name) == 0)
        {
          *index = i;
          return TRUE;
        }
      g_ptr_array_add (names, (gpointer) values[i].name);
    }
  g_autofree char *hint = sift_config_suggestion (text, (const char *const *) names->pdata, names->len);
  Origin at = sift_config_origin_of (c, node);
  FAIL (RANGE, &at, "%s: '%s' is not one of %s%s", path, text, all, hint);
  return FALSE;
}

/* Stores one value of a Config (or Setup) field after checking it. */
gboolean
sift_config_assign (Ctx *c, const Key *k, gpointer base, gboolean in_config, yaml_node_t *node, const char *path,
        GError **error)
{
  gpointer field = (char *) base + k->offset;
  Origin at = sift_config_origin_of (c, node);
  double d = 0;
  gint64 v = 0;
  switch ((int) k->type)
    {
    case KEY_INT:
      if (!number (c, k, node, path, TRUE, &d, &v, error))
        return FALSE;
      *(gint64 *) field = v;
      break;
    case KEY_INT32:
      if (!number (c, k, node, path, TRUE, &d, &v, error))
        return FALSE;
      *(gint32 *) field = (gint32) v;
      break;
    case KEY_UINT64:
      {
        guint64 u;
        if (!sift_config_expect_scalar (c, node, path, "a non-negative integer", error))
          return FALSE;
        if (sift_config_quoted (node) || !g_ascii_string_to_unsigned (sift_config_scalar (node), 10, 0, G_MAXUINT64, &u, NULL))
          {
            FAIL (TYPE, &at, "%s: expected a non-negative integer, got '%s'", path, sift_config_scalar (node));
            return FALSE;
          }
        *(guint64 *) field = u;
        break;
      }
    case KEY_FLOAT:
      if (!number (c, k, node, path, FALSE, &d, &v, error))
        return FALSE;
      *(double *) field = d;
      break;
    case KEY_BOOL:
      {
        gboolean b;
        if (!sift_config_expect_scalar (c, node, path, "true or false", error))
          return FALSE;
        if (sift_config_quoted (node) || !sift_text_to_bool (sift_config_scalar (node), &b))
          {
            FAIL (TYPE, &at, "%s: expected true or false, got '%s'", path, sift_config_scalar (node));
            return FALSE;
          }
        *(gboolean *) field = b;
        break;
      }
    case KEY_STRING:
    case KEY_LABEL:
      {
        int index;
        if (k->values != NULL && !one_of (c, k->values, node, path, &index, error))
          return FALSE;
        if (k->values == NULL && !sift_config_expect_scalar (c, node, path, "a string", error))
          return FALSE;
        if (k->type == KEY_LABEL && (strchr (sift_config_scalar (node), '.') || strchr (sift_config_scalar (node), '=')))
          {
            FAIL (INVALID, &at, "%s: a label cannot contain '.' or '=' (--set addresses setups by label)", path);
            return FALSE;
          }
        g_free (*(char **) field);
        *(char **) field = g_strdup (sift_config_scalar (node));
        break;
      }
    case KEY_SOURCE:
      {
        /* The names the models registered (config.h, "Model sources"). */
        g_autofree EnumValue *sources = sift_config_model_sources ();
        int index;
        if (!one_of (c, sources, node, path, &index, error))
          return FALSE;
        g_free (*(char **) field);
        *(char **) field = g_strdup (sources[index].name);
        break;
      }
    case KEY_ENUM:
      {
        int index;
        if (!one_of (c, k->values, node, path, &index, error))
          return FALSE;
        *(int *) field = k->values[index].value;
        break;
      }
    case KEY_INT_LIST:
    case KEY_FLOAT_LIST:
      if (!list (c, k, node, path, (gpointer *) field, (gsize *) (void *) ((char *) base + k->count_offset), error))
        return FALSE;
      break;
    default:
      g_assert_not_reached ();
    }
  if (in_config)
    sift_config_remember (c->cfg, field, &at);
  return TRUE;
}

gboolean
sift_config_parse_mapping (Ctx *c, yaml_node_t *map, const Key *table, gpointer base, const char *path, GError **error)
{
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++)
    {
      yaml_node_t *key = yaml_document_get_node (c->doc, p->key);
      yaml_node_t *value = yaml_document_get_node (c->doc, p->value);
      Origin key_at = sift_config_origin_of (c, key);
      const char *name = sift_config_scalar (key);
      if (name == NULL)
        {
          FAIL (TYPE, &key_at, "%s: keys are scalars, got %s", path ? path : "top level", sift_config_node_kind (key));
          return FALSE;
        }
      for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++)
        {
          yaml_node_t *prev = yaml_document_get_node (c->doc, q->key);
          if (prev->type == YAML_SCALAR_NODE && strcmp (sift_config_scalar (prev), name) == 0)
            {
              FAIL (DUPLICATE_KEY, &key_at, "duplicate key '%s'%s%s (first given at line %d)", name,
                    path ? " in " : "", path ? path : "", (int) prev->start_mark.line + 1);
              return FALSE;
            }
        }
      g_autofree char *sub = path ? g_strdup_printf ("%s.%s", path, name) : g_strdup (name);
      const Key *k = NULL;
      gpointer values = base;
      if (table != NULL || path == NULL)
        {
          const Key *t = table != NULL ? table : sift_config_root_keys;
          for (k = t; k->name != NULL && strcmp (k->name, name) != 0; k++)
            ;
          k = k->name != NULL ? k : NULL;
        }
      if (k == NULL && table == NULL)
        k = sift_config_find_key (c->cfg, path, name, &values);
      gboolean ok;
      if (k == NULL && table == NULL && sift_config_is_section (c->cfg, path, name))
        {
          if (value->type != YAML_MAPPING_NODE)
            {
              Origin at = sift_config_origin_of (c, value);
              FAIL (TYPE, &at, "%s: expected a mapping, got %s", sub, sift_config_node_kind (value));
              return FALSE;
            }
          ok = sift_config_parse_mapping (c, value, NULL, NULL, sub, error);
        }
      else if (k == NULL)
        {
          g_autofree char *hint = table != NULL ? sift_config_key_suggestion (name, table)
                                                : sift_config_path_suggestion (c->cfg, path, name);
          if (path == NULL)
            FAIL (UNKNOWN_KEY, &key_at, "unknown section '%s'%s", name, hint);
          else
            FAIL (UNKNOWN_KEY, &key_at, "unknown key '%s' in %s%s", name, path, hint);
          return FALSE;
        }
      else if (k->type == KEY_SETUP || k->type == KEY_SETUPS)
        ok = sift_config_parse_setups_key (c, k, key, value, error);
      else if (table == sift_config_setup_keys)
        ok = sift_config_assign_setup (c, base, k, value, sub, error);
      else
        ok = sift_config_assign (c, k, values, TRUE, value, sub, error);
      if (!ok)
        return FALSE;
    }
  return TRUE;
}

/* ---- Documents ------------------------------------------------------------------- */

const Source *
sift_config_add_source (Config *cfg, const char *name, const char *text)
{
  Source *src = g_new0 (Source, 1);
  src->name = g_strdup (name);
  src->text = g_strdup (text);
  g_ptr_array_add (cfg->sources, src);
  return src;
}

void
sift_config_source_free (gpointer data)
{
  Source *src = data;
  if (src == NULL)
    return;
  g_free (src->name);
  g_free (src->text);
  g_free (src);
}

/* An error at the end of the input points after the last character. */
static void
clamp_to_text (Origin *at)
{
  g_auto (GStrv) lines = g_strsplit (at->src->text, "\n", -1);
  gint n = (gint) g_strv_length (lines);
  while (n > 1 && lines[n - 1][0] == '\0')
    n--;
  if (n > 0 && at->line > n)
    {
      at->line = n;
      at->col = (gint) g_utf8_strlen (lines[n - 1], -1) + 1;
    }
}

/* Line and column (1-based, bytes) of a byte offset in text. */
void
sift_config_at_offset (const char *text, gsize offset, Origin *at)
{
  at->line = 1;
  const char *line = text;
  for (const char *c = text; c < text + offset && *c; c++)
    if (*c == '\n')
      {
        at->line++;
        line = c + 1;
      }
  at->col = (gint) (text + offset - line) + 1;
}

/* libyaml's scanner takes time quadratic in the nesting of flow
 * collections (minutes for a few hundred thousand '['): a config never
 * nests deeper than a few levels, so the events are read first and a deep
 * document refused at its first level too many. Other errors are left to
 * the loader, which reports them. */
#define MAX_DEPTH 64

static gboolean
check_depth (const Source *src, const char *text, gint col_offset, GError **error)
{
  yaml_parser_t parser;
  yaml_parser_initialize (&parser);
  yaml_parser_set_input_string (&parser, (const unsigned char *) text, strlen (text));
  gint depth = 0;
  gboolean ok = TRUE, done = FALSE;
  while (ok && !done)
    {
      yaml_event_t event;
      if (!yaml_parser_parse (&parser, &event))
        break;
      if (event.type == YAML_SEQUENCE_START_EVENT || event.type == YAML_MAPPING_START_EVENT)
        depth++;
      else if (event.type == YAML_SEQUENCE_END_EVENT || event.type == YAML_MAPPING_END_EVENT)
        depth--;
      done = event.type == YAML_STREAM_END_EVENT;
      if (depth > MAX_DEPTH)
        {
          Origin at = { src, (gint) event.start_mark.line + 1, (gint) event.start_mark.column + 1, 0 };
          if (event.start_mark.line == 0)
            at.col += col_offset;
          FAIL (SYNTAX, &at, "nested deeper than %d levels", MAX_DEPTH);
          ok = FALSE;
        }
      yaml_event_delete (&event);
    }
  yaml_parser_delete (&parser);
  return ok;
}

/* Parses text as one YAML document into doc; FALSE with a located SYNTAX error. */
gboolean
sift_config_load_document (const Source *src, const char *text, gint col_offset, yaml_document_t *doc, GError **error)
{
  if (!check_depth (src, text, col_offset, error))
    return FALSE;
  yaml_parser_t parser;
  yaml_parser_initialize (&parser);
  yaml_parser_set_input_string (&parser, (const unsigned char *) text, strlen (text));
  gboolean ok = yaml_parser_load (&parser, doc);
  if (ok && yaml_document_get_root_node (doc) != NULL)
    {
      /* A second document would be silently ignored: refuse it. */
      yaml_document_t extra;
      if (yaml_parser_load (&parser, &extra))
        {
          gboolean more = yaml_document_get_root_node (&extra) != NULL;
          Origin at = { src, (gint) extra.start_mark.line + 1, (gint) extra.start_mark.column + 1, 0 };
          yaml_document_delete (&extra);
          if (more)
            {
              FAIL (SYNTAX, &at, "only one YAML document per config");
              yaml_document_delete (doc);
              yaml_parser_delete (&parser);
              return FALSE;
            }
        }
      else
        ok = FALSE;
      if (!ok)
        yaml_document_delete (doc);
    }
  if (!ok)
    {
      Origin at = { src, (gint) parser.problem_mark.line + 1, (gint) parser.problem_mark.column + 1, 0 };
      if (parser.error == YAML_READER_ERROR)
        sift_config_at_offset (text, parser.problem_offset, &at); /* the reader's mark is not set: its offset is */
      if (parser.problem_mark.line == 0)
        at.col += col_offset;
      clamp_to_text (&at);
      if (parser.context != NULL)
        FAIL (SYNTAX, &at, "invalid YAML: %s %s (started at line %d, column %d)",
              parser.problem ? parser.problem : "syntax error", parser.context, (int) parser.context_mark.line + 1,
              (int) parser.context_mark.column + 1 + (parser.context_mark.line == 0 ? col_offset : 0));
      else
        FAIL (SYNTAX, &at, "invalid YAML: %s", parser.problem ? parser.problem : "syntax error");
    }
  yaml_parser_delete (&parser);
  return ok;
}


gboolean
sift_config_merge_text (Config *cfg, const char *name, const char *text, SiftRegistry *registry, GError **error)
{
  const Source *src = sift_config_add_source (cfg, name, text);
  yaml_document_t doc;
  if (!sift_config_load_document (src, src->text, 0, &doc, error))
    return FALSE;
  Ctx c = { cfg, src, &doc, 0, registry, NULL, NULL };
  yaml_node_t *root = yaml_document_get_root_node (&doc);
  gboolean ok = TRUE;
  if (root != NULL && root->type == YAML_SCALAR_NODE && root->data.scalar.length == 0)
    ok = TRUE; /* an empty file: defaults */
  else if (root != NULL && root->type != YAML_MAPPING_NODE)
    {
      Origin at = sift_config_origin_of (&c, root);
      FAIL (TYPE, &at, "the top level must be a mapping of sections (model, kv, offload, policy, harness), got %s",
            sift_config_node_kind (root));
      ok = FALSE;
    }
  else if (root != NULL)
    ok = sift_config_parse_mapping (&c, root, NULL, NULL, NULL, error);
  g_free ((gpointer) c.setup_key_at);
  yaml_document_delete (&doc);
  return ok && sift_config_validate (cfg, registry, error);
}
