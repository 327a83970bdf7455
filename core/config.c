/* The YAML config: parsing (libyaml, table-driven), --set overrides,
 * policy resolution against the registry, and the checks that need
 * several keys at once. Every error points at a node: file:line:col. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <sift/error.h>

#include "config-private.h"
#include "nearest.h"
#include "params-private.h"
#include "policy-private.h"

typedef struct {
  Config *cfg;
  const Source *src;
  yaml_document_t *doc;
  gint col_offset;            /* --set: where the value starts in the assignment */
  SiftRegistry *registry;
  const Origin *setup_key_at; /* the 'policy' or 'policies' key seen in this document */
  const char *setup_key;
} Ctx;

static const char *const phase_names[2] = { "prefill", "decode" };

/* ---- Errors ----------------------------------------------------------------- */

/* "name:line:col: message", the source line, a caret under the column. */
static char *
located (const Origin *at, const char *fallback, const char *message)
{
  if (at == NULL || at->src == NULL)
    return g_strdup_printf ("%s: %s", fallback ? fallback : "(config)", message);
  GString *s = g_string_new (NULL);
  g_string_append_printf (s, "%s:%d:%d: %s", at->src->name, at->line, at->col, message);
  const char *line = at->src->text;
  for (gint l = 1; l < at->line && line != NULL; l++)
    {
      line = strchr (line, '\n');
      line = line ? line + 1 : NULL;
    }
  if (line != NULL)
    {
      const char *end = strchr (line, '\n');
      gsize len = end ? (gsize) (end - line) : strlen (line);
      if (len > 0 && line[len - 1] == '\r')
        len--;
      end = line + len;
      /* A long line shows SHOWN characters either side of the column
       * (next_char may step past the end over bytes that are not UTF-8). */
      enum { SHOWN = 80 };
      const char *at_char = line;
      for (gint col = 1; col < at->col && at_char < end; col++)
        at_char = MIN (g_utf8_next_char (at_char), end);
      const char *from = at_char, *to = at_char;
      for (gint i = 0; i < SHOWN && from > line; i++)
        {
          const char *prev = g_utf8_find_prev_char (line, from);
          from = prev != NULL ? prev : line;
        }
      for (gint i = 0; i < SHOWN && to < end; i++)
        to = MIN (g_utf8_next_char (to), end);
      const char *lead = from > line ? "..." : "";
      g_string_append_printf (s, "\n%s", lead);
      g_string_append_len (s, from, (gssize) (to - from));
      g_string_append_printf (s, "%s\n%s", to < end ? "..." : "", from > line ? "   " : "");
      /* The caret keeps the line's tabs and counts UTF-8 characters as one. */
      for (const char *c = from; c < at_char; c = g_utf8_next_char (c))
        g_string_append_c (s, *c == '\t' ? '\t' : ' ');
      g_string_append_c (s, '^');
    }
  return g_string_free (s, FALSE);
}

static void G_GNUC_PRINTF (6, 7)
fail_at (GError **error, GQuark domain, gint code, const Origin *at, const char *fallback, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *message = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_autofree char *text = located (at, fallback, message);
  g_set_error_literal (error, domain, code, text);
}

#define FAIL(code, at, ...) fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_##code, at, NULL, __VA_ARGS__)

static Origin
origin_of (Ctx *c, const yaml_node_t *node)
{
  Origin o = { c->src, (gint) node->start_mark.line + 1, (gint) node->start_mark.column + 1, ++c->cfg->seq };
  if (node->start_mark.line == 0)
    o.col += c->col_offset;
  return o;
}

static const char *
node_kind (const yaml_node_t *node)
{
  switch (node->type)
    {
    case YAML_MAPPING_NODE: return "a mapping";
    case YAML_SEQUENCE_NODE: return "a list";
    default: return "a scalar";
    }
}

static const char *
scalar (const yaml_node_t *node)
{
  return node->type == YAML_SCALAR_NODE ? (const char *) node->data.scalar.value : NULL;
}

static gboolean
quoted (const yaml_node_t *node)
{
  return node->data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE
         || node->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE;
}

static char *
enum_list (const EnumValue *values)
{
  GString *s = g_string_new (NULL);
  for (gsize i = 0; values[i].name; i++)
    g_string_append_printf (s, "%s%s", i ? " | " : "", values[i].name);
  return g_string_free (s, FALSE);
}

static char *
suggestion (const char *name, const char *const *names, gsize n)
{
  const char *near = sift_nearest_name (name, names, n);
  return near ? g_strdup_printf ("; did you mean '%s'?", near) : g_strdup ("");
}

static char *
key_suggestion (const char *name, const Key *table)
{
  g_autoptr (GPtrArray) names = g_ptr_array_new ();
  for (gsize i = 0; table[i].name; i++)
    g_ptr_array_add (names, (gpointer) table[i].name);
  return suggestion (name, (const char *const *) names->pdata, names->len);
}

/* ---- Origins ---------------------------------------------------------------- */

static void
remember (Config *cfg, gsize offset, const Origin *at)
{
  g_hash_table_insert (cfg->origins, GSIZE_TO_POINTER (offset + 1), g_memdup2 (at, sizeof *at));
}

static const Origin *
origin_at (const Config *cfg, gsize offset)
{
  return g_hash_table_lookup (cfg->origins, GSIZE_TO_POINTER (offset + 1));
}

/* The most recent write among several fields (NULL: all defaults): the
 * write that made a combination impossible. */
static const Origin *
latest_of (const Config *cfg, const gsize *offsets, gsize n)
{
  const Origin *best = NULL;
  for (gsize i = 0; i < n; i++)
    {
      const Origin *o = origin_at (cfg, offsets[i]);
      if (o != NULL && (best == NULL || o->seq > best->seq))
        best = o;
    }
  return best;
}

/* The offset of a dotted root key ("model.synthetic.noise"); FALSE when
 * the path names no value of the root tables. */
static gboolean
root_key_offset (const char *path, gsize *offset)
{
  g_auto (GStrv) parts = g_strsplit (path, ".", -1);
  const Key *table = sift_config_root_keys;
  for (gsize i = 0; parts[i] != NULL; i++)
    {
      const Key *k = table;
      while (k->name != NULL && strcmp (k->name, parts[i]) != 0)
        k++;
      if (k->name == NULL)
        return FALSE;
      if (k->type == KEY_SECTION)
        {
          table = k->section;
          continue;
        }
      if (parts[i + 1] != NULL || k->type == KEY_SETUP || k->type == KEY_SETUPS)
        return FALSE;
      *offset = k->offset;
      return TRUE;
    }
  return FALSE;
}

char *
sift_config_locate (const SiftConfig *config, const char *const *keys, const char *message)
{
  g_return_val_if_fail (config != NULL && message != NULL, NULL);
  const Config *cfg = (const Config *) config;
  const Origin *best = NULL;
  for (gsize i = 0; keys != NULL && keys[i] != NULL; i++)
    {
      gsize offset;
      const Origin *o = root_key_offset (keys[i], &offset) ? origin_at (cfg, offset) : NULL;
      if (o != NULL && (best == NULL || o->seq > best->seq))
        best = o;
    }
  return located (best, config->file, message);
}

/* ---- Setups ----------------------------------------------------------------- */

static void
raw_param_free (gpointer data)
{
  RawParam *r = data;
  g_free (r->key);
  g_free (r->text);
  g_free (r);
}

static void
choice_clear (SiftPolicyChoice *choice)
{
  g_clear_pointer (&choice->name, g_free);
  g_clear_pointer (&choice->params, sift_params_free);
  choice->ops = NULL;
}

static Setup *
setup_new (const char *where)
{
  Setup *s = g_new0 (Setup, 1);
  s->where = g_strdup (where);
  s->pub.prefill.name = g_strdup ("full");
  s->pub.decode.name = g_strdup ("full");
  for (int p = 0; p < 2; p++)
    s->raw[p] = g_ptr_array_new_with_free_func (raw_param_free);
  return s;
}

static void
setup_free (gpointer data)
{
  Setup *s = data;
  g_free (s->pub.label);
  g_free (s->where);
  choice_clear (&s->pub.prefill);
  choice_clear (&s->pub.decode);
  g_free (s->pub.dense_layers);
  for (int p = 0; p < 2; p++)
    g_ptr_array_unref (s->raw[p]);
  g_free (s);
}

static SiftPolicyChoice *
setup_choice (Setup *s, int phase)
{
  return phase == 0 ? &s->pub.prefill : &s->pub.decode;
}

/* Sets one raw param on a resolved choice, with the error at its node. */
static gboolean
apply_param (const SiftPolicyChoice *choice, const char *path, const RawParam *r, GError **error)
{
  GError *local = NULL;
  if (sift_params_set_text (choice->params, r->key, r->text, &local))
    return TRUE;
  const Origin *at = local->code == SIFT_CONFIG_ERROR_PARAM ? &r->key_at : &r->value_at;
  FAIL (PARAM, at, "%s.params.%s: policy '%s': %s", path, r->key, choice->name, local->message);
  g_error_free (local);
  return FALSE;
}

/* Looks the choice's policy up, checks its phase and validates its params. */
static gboolean
resolve_choice (Setup *s, int phase, SiftRegistry *registry, const char *fallback, GError **error)
{
  SiftPolicyChoice *choice = setup_choice (s, phase);
  const Origin *at = s->choice_at[phase].src ? &s->choice_at[phase] : NULL;
  g_autofree char *path = g_strdup_printf ("%s.%s", s->where, phase_names[phase]);
  GError *local = NULL;
  const SiftPolicyInfo *info = sift_registry_lookup (registry, choice->name, &local);
  if (info == NULL)
    {
      if (g_error_matches (local, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_UNKNOWN))
        fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_UNKNOWN_POLICY, at, fallback, "%s: %s", path,
                 local->message);
      else
        fail_at (error, local->domain, local->code, at, fallback, "%s: policy '%s' cannot be loaded: %s", path,
                 choice->name, local->message);
      g_error_free (local);
      return FALSE;
    }
  guint32 need = phase == 0 ? SIFT_POLICY_SUPPORTS_PREFILL : SIFT_POLICY_SUPPORTS_DECODE;
  if (!(info->ops->flags & need))
    {
      fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_PHASE, at, fallback,
               "%s: policy '%s' does not support %s (it supports only %s)", path, choice->name,
               phase_names[phase], phase_names[1 - phase]);
      return FALSE;
    }
  g_autoptr (SiftParams) params = sift_params_new (info->ops->params, &local);
  if (params == NULL)
    {
      fail_at (error, local->domain, local->code, at, fallback, "%s: %s: %s", path, info->file, local->message);
      g_error_free (local);
      return FALSE;
    }
  g_clear_pointer (&choice->params, sift_params_free);
  choice->params = g_steal_pointer (&params);
  choice->ops = info->ops;
  for (guint i = 0; i < s->raw[phase]->len; i++)
    if (!apply_param (choice, path, s->raw[phase]->pdata[i], error))
      return FALSE;
  return TRUE;
}

/* ---- Values ------------------------------------------------------------------- */

static gboolean parse_mapping (Ctx *c, yaml_node_t *map, const Key *table, gpointer base, const char *path,
                               GError **error);
static gboolean assign_setup (Ctx *c, Setup *s, const Key *k, yaml_node_t *node, const char *path,
                              GError **error);

static gboolean
expect_scalar (Ctx *c, yaml_node_t *node, const char *path, const char *what, GError **error)
{
  if (node->type == YAML_SCALAR_NODE && (node->data.scalar.length > 0 || quoted (node)))
    return TRUE;
  Origin at = origin_of (c, node);
  if (node->type == YAML_SCALAR_NODE)
    FAIL (TYPE, &at, "%s: expected %s, got nothing", path, what);
  else
    FAIL (TYPE, &at, "%s: expected %s, got %s", path, what, node_kind (node));
  return FALSE;
}

static gboolean
number (Ctx *c, const Key *k, yaml_node_t *node, const char *path, gboolean integer, double *as_double,
        gint64 *as_int, GError **error)
{
  const char *what = integer ? "an integer" : "a number";
  if (!expect_scalar (c, node, path, what, error))
    return FALSE;
  Origin at = origin_of (c, node);
  const char *text = scalar (node);
  gboolean ok = !quoted (node);
  if (ok && integer)
    {
      ok = sift_text_to_int (text, as_int);
      *as_double = (double) *as_int;
    }
  else if (ok)
    ok = sift_text_to_float (text, as_double);
  if (!ok && !quoted (node) && sift_text_beyond_range (text, integer))
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
      Origin at = origin_of (c, node);
      FAIL (TYPE, &at, "%s: expected a list of %s (e.g. [1, 2]), got %s", path, integer ? "integers" : "numbers",
            node_kind (node));
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
one_of (Ctx *c, const Key *k, yaml_node_t *node, const char *path, int *index, GError **error)
{
  g_autofree char *all = enum_list (k->values);
  if (!expect_scalar (c, node, path, all, error))
    return FALSE;
  const char *text = scalar (node);
  g_autoptr (GPtrArray) names = g_ptr_array_new ();
  for (int i = 0; k->values[i].name; i++)
    {
      if (strcmp (text, k->values[i].name) == 0)
        {
          *index = i;
          return TRUE;
        }
      g_ptr_array_add (names, (gpointer) k->values[i].name);
    }
  g_autofree char *hint = suggestion (text, (const char *const *) names->pdata, names->len);
  Origin at = origin_of (c, node);
  FAIL (RANGE, &at, "%s: '%s' is not one of %s%s", path, text, all, hint);
  return FALSE;
}

/* Stores one value of a Config (or Setup) field after checking it. */
static gboolean
assign (Ctx *c, const Key *k, gpointer base, gboolean in_config, yaml_node_t *node, const char *path,
        GError **error)
{
  gpointer field = (char *) base + k->offset;
  Origin at = origin_of (c, node);
  double d = 0;
  gint64 v = 0;
  switch (k->type)
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
        if (!expect_scalar (c, node, path, "a non-negative integer", error))
          return FALSE;
        if (quoted (node) || !g_ascii_string_to_unsigned (scalar (node), 10, 0, G_MAXUINT64, &u, NULL))
          {
            FAIL (TYPE, &at, "%s: expected a non-negative integer, got '%s'", path, scalar (node));
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
        if (!expect_scalar (c, node, path, "true or false", error))
          return FALSE;
        if (quoted (node) || !sift_text_to_bool (scalar (node), &b))
          {
            FAIL (TYPE, &at, "%s: expected true or false, got '%s'", path, scalar (node));
            return FALSE;
          }
        *(gboolean *) field = b;
        break;
      }
    case KEY_STRING:
    case KEY_LABEL:
      {
        int index;
        if (k->values != NULL && !one_of (c, k, node, path, &index, error))
          return FALSE;
        if (k->values == NULL && !expect_scalar (c, node, path, "a string", error))
          return FALSE;
        if (k->type == KEY_LABEL && (strchr (scalar (node), '.') || strchr (scalar (node), '=')))
          {
            FAIL (INVALID, &at, "%s: a label cannot contain '.' or '=' (--set addresses setups by label)", path);
            return FALSE;
          }
        g_free (*(char **) field);
        *(char **) field = g_strdup (scalar (node));
        break;
      }
    case KEY_ENUM:
      {
        int index;
        if (!one_of (c, k, node, path, &index, error))
          return FALSE;
        *(int *) field = k->values[index].value;
        break;
      }
    case KEY_INT_LIST:
    case KEY_FLOAT_LIST:
      if (!list (c, k, node, path, (gpointer *) field, (gsize *) (void *) ((char *) base + k->count_offset), error))
        return FALSE;
      break;
    case KEY_SECTION:
      if (node->type != YAML_MAPPING_NODE)
        {
          FAIL (TYPE, &at, "%s: expected a mapping, got %s", path, node_kind (node));
          return FALSE;
        }
      return parse_mapping (c, node, k->section, base, path, error);
    case KEY_SETUP:
    case KEY_SETUPS:
    case KEY_CHOICE:
      g_assert_not_reached ();
    }
  if (in_config)
    remember (c->cfg, k->offset, &at);
  return TRUE;
}

/* A YAML node as param text: a scalar, or a flow list of scalars. */
static gboolean
param_text (Ctx *c, yaml_node_t *node, const char *path, char **out, GError **error)
{
  if (node->type == YAML_SCALAR_NODE)
    {
      *out = g_strdup (scalar (node));
      return TRUE;
    }
  Origin at = origin_of (c, node);
  if (node->type != YAML_SEQUENCE_NODE)
    {
      FAIL (PARAM, &at, "%s: expected a scalar or a list, got a mapping", path);
      return FALSE;
    }
  GString *s = g_string_new ("[");
  for (yaml_node_item_t *i = node->data.sequence.items.start; i < node->data.sequence.items.top; i++)
    {
      yaml_node_t *item = yaml_document_get_node (c->doc, *i);
      if (item->type != YAML_SCALAR_NODE)
        {
          Origin item_at = origin_of (c, item);
          FAIL (PARAM, &item_at, "%s: list elements must be scalars, got %s", path, node_kind (item));
          g_string_free (s, TRUE);
          return FALSE;
        }
      g_string_append_printf (s, "%s%s", i == node->data.sequence.items.start ? "" : ", ", scalar (item));
    }
  g_string_append_c (s, ']');
  *out = g_string_free (s, FALSE);
  return TRUE;
}

static void
raw_put (GPtrArray *raw, RawParam *r)
{
  for (guint i = 0; i < raw->len; i++)
    if (strcmp (((RawParam *) raw->pdata[i])->key, r->key) == 0)
      {
        g_ptr_array_remove_index (raw, i);
        break;
      }
  g_ptr_array_add (raw, r);
}

static gboolean
parse_params (Ctx *c, Setup *s, int phase, yaml_node_t *map, const char *path, GError **error)
{
  if (map->type != YAML_MAPPING_NODE)
    {
      Origin at = origin_of (c, map);
      FAIL (TYPE, &at, "%s.params: expected a mapping of parameter names to values, got %s", path,
            node_kind (map));
      return FALSE;
    }
  /* name -> its key node: many parameters cost linear time, not quadratic. */
  g_autoptr (GHashTable) seen = g_hash_table_new (g_str_hash, g_str_equal);
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++)
    {
      yaml_node_t *key = yaml_document_get_node (c->doc, p->key);
      yaml_node_t *value = yaml_document_get_node (c->doc, p->value);
      Origin key_at = origin_of (c, key);
      if (key->type != YAML_SCALAR_NODE)
        {
          FAIL (TYPE, &key_at, "%s.params: parameter names are scalars, got %s", path, node_kind (key));
          return FALSE;
        }
      const yaml_node_t *prev = g_hash_table_lookup (seen, scalar (key));
      if (prev != NULL)
        {
          FAIL (DUPLICATE_KEY, &key_at, "%s.params: duplicate parameter '%s' (first given at line %d)", path,
                scalar (key), (int) prev->start_mark.line + 1);
          return FALSE;
        }
      g_hash_table_insert (seen, (gpointer) scalar (key), key);
      g_autofree char *ppath = g_strdup_printf ("%s.params.%s", path, scalar (key));
      RawParam *r = g_new0 (RawParam, 1);
      if (!param_text (c, value, ppath, &r->text, error))
        {
          g_free (r);
          return FALSE;
        }
      r->key = g_strdup (scalar (key));
      r->key_at = key_at;
      r->value_at = origin_of (c, value);
      g_ptr_array_add (s->raw[phase], r); /* emptied by parse_choice; the names are distinct */
    }
  return TRUE;
}

/* prefill: NAME, or {name: NAME, params: {...}}: replaces the phase's choice. */
static gboolean
parse_choice (Ctx *c, Setup *s, int phase, yaml_node_t *node, const char *path, GError **error)
{
  yaml_node_t *name = NULL, *params = NULL;
  Origin at = origin_of (c, node);
  if (node->type == YAML_SCALAR_NODE)
    name = node;
  else if (node->type == YAML_MAPPING_NODE)
    {
      static const char *const keys[] = { "name", "params" };
      for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top; p++)
        {
          yaml_node_t *key = yaml_document_get_node (c->doc, p->key);
          Origin key_at = origin_of (c, key);
          const char *k = scalar (key);
          yaml_node_t **slot = k && strcmp (k, "name") == 0 ? &name : k && strcmp (k, "params") == 0 ? &params : NULL;
          if (slot == NULL)
            {
              g_autofree char *hint = k ? suggestion (k, keys, 2) : g_strdup ("");
              FAIL (UNKNOWN_KEY, &key_at, "%s: unknown key '%s' (a policy takes name and params)%s", path,
                    k ? k : node_kind (key), hint);
              return FALSE;
            }
          if (*slot != NULL)
            {
              FAIL (DUPLICATE_KEY, &key_at, "%s: duplicate key '%s'", path, k);
              return FALSE;
            }
          *slot = yaml_document_get_node (c->doc, p->value);
        }
      if (name == NULL)
        {
          FAIL (MISSING, &at, "%s: a policy mapping needs 'name'", path);
          return FALSE;
        }
    }
  else
    {
      FAIL (TYPE, &at, "%s: expected a policy name or {name: ..., params: {...}}, got a list", path);
      return FALSE;
    }
  g_autofree char *what = g_strdup_printf ("%s.name", path);
  if (!expect_scalar (c, name, node == name ? path : what, "a policy name", error))
    return FALSE;
  Origin name_at = origin_of (c, name);
  if (!sift_policy_name_valid (scalar (name)))
    {
      FAIL (TYPE, &name_at, "%s: '%s' is not a policy name ([a-z0-9_-]+)", path, scalar (name));
      return FALSE;
    }
  SiftPolicyChoice *choice = setup_choice (s, phase);
  choice_clear (choice);
  choice->name = g_strdup (scalar (name));
  g_ptr_array_set_size (s->raw[phase], 0);
  s->choice_at[phase] = name_at;
  if (params != NULL && !parse_params (c, s, phase, params, path, error))
    return FALSE;
  if (c->registry != NULL)
    return resolve_choice (s, phase, c->registry, NULL, error);
  return TRUE;
}

static gboolean
assign_setup (Ctx *c, Setup *s, const Key *k, yaml_node_t *node, const char *path, GError **error)
{
  if (k->type == KEY_CHOICE)
    return parse_choice (c, s, k->offset == G_STRUCT_OFFSET (Setup, pub.prefill) ? 0 : 1, node, path, error);
  if (!assign (c, k, s, FALSE, node, path, error))
    return FALSE;
  if (k->type == KEY_LABEL)
    {
      s->label_given = TRUE;
      s->label_at = origin_of (c, node);
    }
  else
    s->dense_at = origin_of (c, node);
  return TRUE;
}

static void
add_setup (Config *cfg, Setup *s)
{
  if (cfg->implied_setup)
    {
      g_ptr_array_set_size (cfg->pub.setups, 0);
      cfg->implied_setup = FALSE;
    }
  g_ptr_array_add (cfg->pub.setups, s);
}

static gboolean
parse_setup (Ctx *c, yaml_node_t *node, const char *path, GError **error)
{
  if (node->type != YAML_MAPPING_NODE)
    {
      Origin at = origin_of (c, node);
      FAIL (TYPE, &at, "%s: expected a mapping (label, prefill, decode, dense_layers), got %s", path,
            node_kind (node));
      return FALSE;
    }
  Setup *s = setup_new (path);
  s->at = origin_of (c, node);
  add_setup (c->cfg, s);
  return parse_mapping (c, node, sift_config_setup_keys, s, path, error);
}

static gboolean
parse_setups_key (Ctx *c, const Key *k, yaml_node_t *key, yaml_node_t *value, GError **error)
{
  Origin key_at = origin_of (c, key);
  if (c->setup_key != NULL)
    {
      FAIL (INVALID, &key_at, "give either 'policy' (one setup) or 'policies' (a list), not both ('%s' is at line %d)",
            c->setup_key, c->setup_key_at->line);
      return FALSE;
    }
  c->setup_key = k->name;
  c->setup_key_at = g_memdup2 (&key_at, sizeof key_at);
  if (k->type == KEY_SETUP)
    return parse_setup (c, value, "policy", error);
  if (value->type != YAML_SEQUENCE_NODE)
    {
      Origin at = origin_of (c, value);
      FAIL (TYPE, &at, "policies: expected a list of setups, got %s", node_kind (value));
      return FALSE;
    }
  if (value->data.sequence.items.top == value->data.sequence.items.start)
    {
      Origin at = origin_of (c, value);
      FAIL (MISSING, &at, "policies: the list is empty; give at least one setup");
      return FALSE;
    }
  gsize i = 0;
  for (yaml_node_item_t *it = value->data.sequence.items.start; it < value->data.sequence.items.top; it++, i++)
    {
      g_autofree char *path = g_strdup_printf ("policies[%" G_GSIZE_FORMAT "]", i);
      if (!parse_setup (c, yaml_document_get_node (c->doc, *it), path, error))
        return FALSE;
    }
  return TRUE;
}

static gboolean
parse_mapping (Ctx *c, yaml_node_t *map, const Key *table, gpointer base, const char *path, GError **error)
{
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++)
    {
      yaml_node_t *key = yaml_document_get_node (c->doc, p->key);
      yaml_node_t *value = yaml_document_get_node (c->doc, p->value);
      Origin key_at = origin_of (c, key);
      const char *name = scalar (key);
      if (name == NULL)
        {
          FAIL (TYPE, &key_at, "%s: keys are scalars, got %s", path ? path : "top level", node_kind (key));
          return FALSE;
        }
      for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++)
        {
          yaml_node_t *prev = yaml_document_get_node (c->doc, q->key);
          if (prev->type == YAML_SCALAR_NODE && strcmp (scalar (prev), name) == 0)
            {
              FAIL (DUPLICATE_KEY, &key_at, "duplicate key '%s'%s%s (first given at line %d)", name,
                    path ? " in " : "", path ? path : "", (int) prev->start_mark.line + 1);
              return FALSE;
            }
        }
      const Key *k = table;
      while (k->name != NULL && strcmp (k->name, name) != 0)
        k++;
      if (k->name == NULL)
        {
          g_autofree char *hint = key_suggestion (name, table);
          if (path == NULL)
            FAIL (UNKNOWN_KEY, &key_at, "unknown section '%s'%s", name, hint);
          else
            FAIL (UNKNOWN_KEY, &key_at, "unknown key '%s' in %s%s", name, path, hint);
          return FALSE;
        }
      g_autofree char *sub = path ? g_strdup_printf ("%s.%s", path, name) : g_strdup (name);
      gboolean ok;
      if (k->type == KEY_SETUP || k->type == KEY_SETUPS)
        ok = parse_setups_key (c, k, key, value, error);
      else if (table == sift_config_setup_keys)
        ok = assign_setup (c, base, k, value, sub, error);
      else
        ok = assign (c, k, base, TRUE, value, sub, error);
      if (!ok)
        return FALSE;
    }
  return TRUE;
}

/* ---- Documents ------------------------------------------------------------------- */

static const Source *
add_source (Config *cfg, const char *name, const char *text)
{
  Source *src = g_new0 (Source, 1);
  src->name = g_strdup (name);
  src->text = g_strdup (text);
  g_ptr_array_add (cfg->sources, src);
  return src;
}

static void
source_free (gpointer data)
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
static void
at_offset (const char *text, gsize offset, Origin *at)
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
static gboolean
load_document (const Source *src, const char *text, gint col_offset, yaml_document_t *doc, GError **error)
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
        at_offset (text, parser.problem_offset, &at); /* the reader's mark is not set: its offset is */
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

static gboolean validate (Config *cfg, SiftRegistry *registry, GError **error);

static gboolean
merge_text (Config *cfg, const char *name, const char *text, SiftRegistry *registry, GError **error)
{
  const Source *src = add_source (cfg, name, text);
  yaml_document_t doc;
  if (!load_document (src, src->text, 0, &doc, error))
    return FALSE;
  Ctx c = { cfg, src, &doc, 0, registry, NULL, NULL };
  yaml_node_t *root = yaml_document_get_root_node (&doc);
  gboolean ok = TRUE;
  if (root != NULL && root->type == YAML_SCALAR_NODE && root->data.scalar.length == 0)
    ok = TRUE; /* an empty file: defaults */
  else if (root != NULL && root->type != YAML_MAPPING_NODE)
    {
      Origin at = origin_of (&c, root);
      FAIL (TYPE, &at, "the top level must be a mapping of sections (model, kv, offload, policy, harness), got %s",
            node_kind (root));
      ok = FALSE;
    }
  else if (root != NULL)
    ok = parse_mapping (&c, root, sift_config_root_keys, cfg, NULL, error);
  g_free ((gpointer) c.setup_key_at);
  yaml_document_delete (&doc);
  return ok && validate (cfg, registry, error);
}

static gboolean
read_file (const char *path, char **text, GError **error)
{
  GError *local = NULL;
  gsize len;
  if (!g_file_get_contents (path, text, &len, &local))
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_IO, "%s: cannot read: %s", path, local->message);
      g_error_free (local);
      return FALSE;
    }
  if (strlen (*text) != len)
    {
      Origin at = { NULL, 0, 0, 0 };
      at_offset (*text, strlen (*text), &at);
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_SYNTAX,
                   "%s:%d:%d: contains a NUL byte (not a YAML text file)", path, at.line, at.col);
      g_clear_pointer (text, g_free);
      return FALSE;
    }
  return TRUE;
}

void
sift_config_free (SiftConfig *config)
{
  if (config == NULL)
    return;
  Config *cfg = (Config *) config;
  g_free (config->file);
  g_free (config->source);
  g_free (config->model_path);
  g_free (config->store);
  g_free (config->store_path);
  g_free (cfg->store_path);
  g_free (config->harness.lengths);
  g_free (config->harness.depths);
  g_free (config->harness.capacities);
  g_free (config->harness.out_dir);
  g_clear_pointer (&config->setups, g_ptr_array_unref);
  g_clear_pointer (&cfg->origins, g_hash_table_unref);
  g_clear_pointer (&cfg->sources, g_ptr_array_unref);
  g_free (cfg);
}

static Config *
config_new (void)
{
  Config *cfg = g_new0 (Config, 1);
  sift_config_init_defaults (cfg);
  cfg->pub.setups = g_ptr_array_new_with_free_func (setup_free);
  cfg->sources = g_ptr_array_new_with_free_func (source_free);
  cfg->origins = g_hash_table_new_full (g_direct_hash, g_direct_equal, NULL, g_free);
  return cfg;
}

SiftConfig *
sift_config_new_default (SiftRegistry *registry, GError **error)
{
  g_autoptr (SiftConfig) config = (SiftConfig *) config_new ();
  config->file = g_strdup ("(defaults)");
  if (!validate ((Config *) config, registry, error))
    return NULL;
  return g_steal_pointer (&config);
}

SiftConfig *
sift_config_load (const char *path, SiftRegistry *registry, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  g_autoptr (SiftConfig) config = (SiftConfig *) config_new ();
  config->file = g_strdup (path);
  if (!sift_config_merge_file (config, path, registry, error))
    return NULL;
  return g_steal_pointer (&config);
}

gboolean
sift_config_merge_file (SiftConfig *config, const char *path, SiftRegistry *registry, GError **error)
{
  g_return_val_if_fail (config != NULL && path != NULL, FALSE);
  g_autofree char *text = NULL;
  if (!read_file (path, &text, error))
    return FALSE;
  return merge_text ((Config *) config, path, text, registry, error);
}

SiftConfig *
sift_config_load_string (const char *name, const char *text, SiftRegistry *registry, GError **error)
{
  g_return_val_if_fail (name != NULL && text != NULL, NULL);
  g_autoptr (SiftConfig) config = (SiftConfig *) config_new ();
  config->file = g_strdup (name);
  if (!merge_text ((Config *) config, name, text, registry, error))
    return NULL;
  return g_steal_pointer (&config);
}

/* ---- --set ---------------------------------------------------------------------- */

/* One path component of an assignment, with its column for errors. */
typedef struct {
  char *name;
  Origin at;
} Part;

static Setup *
find_setup (Config *cfg, const Part *label, GError **error)
{
  g_autoptr (GPtrArray) labels = g_ptr_array_new ();
  for (guint i = 0; i < cfg->pub.setups->len; i++)
    {
      Setup *s = cfg->pub.setups->pdata[i];
      if (strcmp (s->pub.label, label->name) == 0)
        return s;
      g_ptr_array_add (labels, s->pub.label);
    }
  g_autofree char *hint = suggestion (label->name, (const char *const *) labels->pdata, labels->len);
  g_ptr_array_add (labels, NULL);
  g_autofree char *all = g_strjoinv (", ", (char **) labels->pdata);
  FAIL (UNKNOWN_KEY, &label->at, "no setup labelled '%s' (setups: %s)%s", label->name, all, hint);
  return NULL;
}

static const Key *
find_key (const Key *table, const Part *part, const char *path, GError **error)
{
  for (const Key *k = table; k->name; k++)
    if (strcmp (k->name, part->name) == 0)
      return k;
  g_autofree char *hint = key_suggestion (part->name, table);
  if (path == NULL)
    FAIL (UNKNOWN_KEY, &part->at, "unknown section '%s'%s", part->name, hint);
  else
    FAIL (UNKNOWN_KEY, &part->at, "unknown key '%s' in %s%s", part->name, path, hint);
  return NULL;
}

static gboolean
declares (const SiftParams *params, const char *name)
{
  for (const SiftParamSpec *spec = sift_params_specs (params); spec != NULL && spec->name; spec++)
    if (strcmp (spec->name, name) == 0)
      return TRUE;
  return FALSE;
}

/* policy.X... (every setup) or policies.LABEL.X... (one setup). */
static gboolean
set_in_setup (Ctx *c, Setup *s, Part *parts, gsize n, yaml_node_t *value, const char *path, gboolean *skipped,
              GError **error)
{
  if (n == 0)
    {
      FAIL (MISSING, &parts[-1].at, "%s: name a key of the setup (label, prefill, decode, dense_layers)", path);
      return FALSE;
    }
  const Key *k = find_key (sift_config_setup_keys, &parts[0], path, error);
  if (k == NULL)
    return FALSE;
  g_autofree char *sub = g_strdup_printf ("%s.%s", path, k->name);
  if (n == 1)
    return assign_setup (c, s, k, value, sub, error);
  int phase = k->type != KEY_CHOICE ? -1 : k->offset == G_STRUCT_OFFSET (Setup, pub.prefill) ? 0 : 1;
  if (phase < 0 || strcmp (parts[1].name, "params") != 0 || n != 3)
    {
      const Part *bad = phase < 0 || strcmp (parts[1].name, "params") != 0 ? &parts[1] : &parts[n > 3 ? 3 : 1];
      FAIL (UNKNOWN_KEY, &bad->at, "%s: only %s.params.NAME can be set below %s", sub, sub, k->name);
      return FALSE;
    }
  RawParam *r = g_new0 (RawParam, 1);
  g_autofree char *ppath = g_strdup_printf ("%s.params.%s", sub, parts[2].name);
  if (!param_text (c, value, ppath, &r->text, error))
    {
      g_free (r);
      return FALSE;
    }
  r->key = g_strdup (parts[2].name);
  r->key_at = parts[2].at;
  r->value_at = origin_of (c, value);
  SiftPolicyChoice *choice = setup_choice (s, phase);
  if (skipped != NULL && choice->params != NULL && !declares (choice->params, r->key))
    {
      /* policy.X.params.P: setups whose policy lacks P are left alone. */
      *skipped = TRUE;
      raw_param_free (r);
      return TRUE;
    }
  if (choice->params != NULL && !apply_param (choice, sub, r, error))
    {
      raw_param_free (r);
      return FALSE;
    }
  raw_put (s->raw[phase], r);
  return TRUE;
}

static gboolean
set_one (Config *cfg, const char *assignment, SiftRegistry *registry, GError **error)
{
  const Source *src = add_source (cfg, "--set", assignment);
  const char *eq = strchr (assignment, '=');
  Origin whole = { src, 1, 1, ++cfg->seq };
  if (eq == NULL || eq == assignment)
    {
      FAIL (SYNTAX, &whole, "expected KEY=VALUE (e.g. kv.block_size=128)");
      return FALSE;
    }
  /* Split the key into parts, each with its column. */
  g_autoptr (GArray) parts = g_array_new (FALSE, TRUE, sizeof (Part));
  for (const char *p = assignment; p < eq;)
    {
      const char *dot = memchr (p, '.', (gsize) (eq - p));
      const char *end = dot ? dot : eq;
      Part part = { g_strndup (p, (gsize) (end - p)), { src, 1, (gint) (p - assignment) + 1, ++cfg->seq } };
      g_array_append_val (parts, part);
      p = end + 1;
      if (*part.name == '\0')
        {
          g_autofree char *key = g_strndup (assignment, (gsize) (eq - assignment));
          FAIL (SYNTAX, &part.at, "'%s' has an empty component", key);
          for (guint i = 0; i < parts->len; i++)
            g_free (g_array_index (parts, Part, i).name);
          return FALSE;
        }
    }
  Part *part = (Part *) (void *) parts->data;
  gsize n = parts->len;

  yaml_document_t doc;
  gint col_offset = (gint) (eq + 1 - assignment);
  gboolean loaded = load_document (src, eq + 1, col_offset, &doc, error);
  gboolean ok = loaded;
  yaml_node_t *value = ok ? yaml_document_get_root_node (&doc) : NULL;
  Ctx c = { cfg, src, &doc, col_offset, registry, NULL, NULL };
  if (ok && value == NULL)
    {
      Origin at = { src, 1, col_offset + 1, ++cfg->seq };
      FAIL (TYPE, &at, "no value after '='");
      ok = FALSE;
    }
  g_autofree char *path = NULL;
  const Key *k = ok ? find_key (sift_config_root_keys, &part[0], NULL, error) : NULL;
  ok = ok && k != NULL;
  if (ok && (k->type == KEY_SETUP || k->type == KEY_SETUPS) && n == 1)
    {
      /* policy=VALUE / policies=VALUE: replace every setup. */
      g_ptr_array_set_size (cfg->pub.setups, 0);
      cfg->implied_setup = FALSE;
      ok = parse_setups_key (&c, k, value, value, error);
      g_free ((gpointer) c.setup_key_at);
    }
  else if (ok && k->type == KEY_SETUP)
    {
      /* A parameter goes to every setup whose policy declares it; when
       * none does, the first setup reports it (with the nearest name). */
      guint applied = 0;
      for (guint i = 0; ok && i < cfg->pub.setups->len; i++)
        {
          gboolean skipped = FALSE;
          ok = set_in_setup (&c, cfg->pub.setups->pdata[i], part + 1, n - 1, value, "policy", &skipped, error);
          applied += ok && !skipped;
        }
      if (ok && applied == 0)
        ok = set_in_setup (&c, cfg->pub.setups->pdata[0], part + 1, n - 1, value, "policy", NULL, error);
    }
  else if (ok && k->type == KEY_SETUPS)
    {
      Setup *s = n >= 2 ? find_setup (cfg, &part[1], error) : NULL;
      path = n >= 2 ? g_strdup_printf ("policies.%s", part[1].name) : NULL;
      ok = s != NULL && set_in_setup (&c, s, part + 2, n - 2, value, path, NULL, error);
    }
  else if (ok)
    {
      /* Sections: walk down to the key (a section takes a mapping). */
      path = g_strdup (k->name);
      for (gsize i = 1; ok && i < n; i++)
        {
          if (k->type != KEY_SECTION)
            {
              FAIL (UNKNOWN_KEY, &part[i].at, "%s is not a section; it has no key '%s'", path, part[i].name);
              ok = FALSE;
              break;
            }
          k = find_key (k->section, &part[i], path, error);
          ok = k != NULL;
          if (ok)
            {
              char *longer = g_strdup_printf ("%s.%s", path, k->name);
              g_free (path);
              path = longer;
            }
        }
      ok = ok && assign (&c, k, cfg, TRUE, value, path, error);
    }
  for (guint i = 0; i < parts->len; i++)
    g_free (part[i].name);
  if (loaded)
    yaml_document_delete (&doc);
  return ok;
}

gboolean
sift_config_apply (SiftConfig *config, const char *const *assignments, SiftRegistry *registry, GError **error)
{
  g_return_val_if_fail (config != NULL, FALSE);
  for (gsize i = 0; assignments != NULL && assignments[i] != NULL; i++)
    if (!set_one ((Config *) config, assignments[i], registry, error))
      return FALSE;
  return validate ((Config *) config, registry, error);
}

gboolean
sift_config_set (SiftConfig *config, const char *assignment, SiftRegistry *registry, GError **error)
{
  g_return_val_if_fail (config != NULL && assignment != NULL, FALSE);
  const char *const one[] = { assignment, NULL };
  return sift_config_apply (config, one, registry, error);
}

/* ---- Checks across keys ----------------------------------------------------------- */

/* The fields that size what a run keeps in memory. */
static const gsize memory_keys[] = {
  G_STRUCT_OFFSET (Config, pub.shape.n_layers),   G_STRUCT_OFFSET (Config, pub.shape.n_q_heads),
  G_STRUCT_OFFSET (Config, pub.shape.n_kv_heads), G_STRUCT_OFFSET (Config, pub.shape.head_dim),
  G_STRUCT_OFFSET (Config, pub.shape.block_size), G_STRUCT_OFFSET (Config, pub.shape.chunk_size),
  G_STRUCT_OFFSET (Config, pub.ring_slots),       G_STRUCT_OFFSET (Config, pub.store),
  G_STRUCT_OFFSET (Config, pub.store_dtype),      G_STRUCT_OFFSET (Config, pub.compute_dtype),
  G_STRUCT_OFFSET (Config, pub.harness.lengths),  G_STRUCT_OFFSET (Config, pub.harness.length_max),
  G_STRUCT_OFFSET (Config, pub.harness.decode_steps),
};

static char *
size_text (double bytes)
{
  return g_format_size ((guint64) MIN (bytes, 1.8e19));
}

#define AT(field) origin_at (cfg, G_STRUCT_OFFSET (Config, field))
#define LATEST(a, b) \
  latest_of (cfg, (const gsize[]){ G_STRUCT_OFFSET (Config, a), G_STRUCT_OFFSET (Config, b) }, 2)

static gboolean
validate_setups (Config *cfg, SiftRegistry *registry, GError **error)
{
  const char *file = cfg->pub.file;
  if (cfg->pub.setups->len == 0)
    {
      g_ptr_array_add (cfg->pub.setups, setup_new ("policy"));
      cfg->implied_setup = TRUE;
    }
  g_autoptr (GHashTable) labels = g_hash_table_new (g_str_hash, g_str_equal); /* borrowed */
  for (guint i = 0; i < cfg->pub.setups->len; i++)
    {
      Setup *s = cfg->pub.setups->pdata[i];
      if (!s->label_given)
        {
          g_free (s->pub.label);
          s->pub.label = strcmp (s->pub.prefill.name, s->pub.decode.name) == 0
                           ? g_strdup (s->pub.prefill.name)
                           : g_strdup_printf ("%s+%s", s->pub.prefill.name, s->pub.decode.name);
        }
      if (!g_hash_table_add (labels, s->pub.label))
        {
          const Origin *at = s->label_given ? &s->label_at : s->at.src ? &s->at : NULL;
          fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID, at, file,
                   "%s: two setups are labelled '%s'; give each a distinct 'label'", s->where, s->pub.label);
          return FALSE;
        }
      for (gsize d = 0; d < s->pub.n_dense_layers; d++)
        {
          gint64 layer = s->pub.dense_layers[d];
          if (layer >= cfg->pub.shape.n_layers)
            {
              fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_RANGE, s->dense_at.src ? &s->dense_at : NULL, file,
                       "%s.dense_layers: layer %" G_GINT64_FORMAT " does not exist (model.layers = %d)",
                       s->where, layer, cfg->pub.shape.n_layers);
              return FALSE;
            }
          for (gsize e = 0; e < d; e++)
            if (s->pub.dense_layers[e] == layer)
              {
                fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID, s->dense_at.src ? &s->dense_at : NULL,
                         file, "%s.dense_layers: layer %" G_GINT64_FORMAT " is listed twice", s->where, layer);
                return FALSE;
              }
        }
      for (int phase = 0; phase < 2 && registry != NULL; phase++)
        if (setup_choice (s, phase)->ops == NULL && !resolve_choice (s, phase, registry, file, error))
          return FALSE;
    }
  return TRUE;
}

static gboolean
validate (Config *cfg, SiftRegistry *registry, GError **error)
{
  SiftConfig *p = &cfg->pub;
  const char *file = p->file;
  SiftModelShape *shape = &p->shape;
#define INVALID(at, ...) (fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID, at, file, __VA_ARGS__), FALSE)
  if (shape->n_q_heads % shape->n_kv_heads != 0)
    return INVALID (LATEST (pub.shape.n_kv_heads, pub.shape.n_q_heads),
                    "model.kv_heads = %d does not divide model.q_heads = %d", shape->n_kv_heads, shape->n_q_heads);
  if (shape->chunk_size % shape->block_size != 0)
    return INVALID (LATEST (pub.shape.chunk_size, pub.shape.block_size),
                    "kv.chunk_size = %d is not a multiple of kv.block_size = %d", shape->chunk_size,
                    shape->block_size);
  if (p->store_dtype == SIFT_DTYPE_Q8_0 && shape->head_dim % SIFT_Q8_0_BLOCK != 0)
    return INVALID (LATEST (pub.store_dtype, pub.shape.head_dim),
                    "kv.store_dtype q8_0 packs rows in blocks of %d, but model.head_dim = %d is not a multiple of it",
                    SIFT_Q8_0_BLOCK, shape->head_dim);
  if (g_strcmp0 (p->source, "gguf") == 0 && (p->model_path == NULL || p->model_path[0] == 0))
    return (fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_MISSING, AT (pub.source), file,
                     "model.source is gguf but model.path (the GGUF file) is not given"), FALSE);
  if (g_strcmp0 (p->source, "synthetic") == 0)
    {
      gint64 rope = p->synthetic.rope_dims;
      if (rope % 2 != 0 || rope > shape->head_dim)
        return INVALID (LATEST (pub.synthetic.rope_dims, pub.shape.head_dim),
                        "model.synthetic.rope_dims = %" G_GINT64_FORMAT " must be even and at most model.head_dim = %d",
                        rope, shape->head_dim);
    }
  SiftHarnessConfig *h = &p->harness;
  if (h->length_spacing == SIFT_SPACING_EXPLICIT && h->n_lengths == 0)
    return (fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_MISSING, AT (pub.harness.lengths), file,
                     "harness.lengths is empty (give lengths, or length_spacing linear/sigmoid)"), FALSE);
  if (h->length_spacing != SIFT_SPACING_EXPLICIT && h->length_min > h->length_max)
    return INVALID (LATEST (pub.harness.length_min, pub.harness.length_max),
                    "harness.length_min = %" G_GINT64_FORMAT " is above harness.length_max = %" G_GINT64_FORMAT,
                    h->length_min, h->length_max);
  if (h->depth_spacing == SIFT_SPACING_EXPLICIT && h->n_depths == 0)
    return (fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_MISSING, AT (pub.harness.depths), file,
                     "harness.depths is empty (give depths, or depth_spacing linear/sigmoid)"), FALSE);
  gint64 shortest = G_MAXINT64, longest = 0;
  if (h->length_spacing == SIFT_SPACING_EXPLICIT)
    for (gsize i = 0; i < h->n_lengths; i++)
      {
        shortest = MIN (shortest, h->lengths[i]);
        longest = MAX (longest, h->lengths[i]);
      }
  else
    {
      shortest = h->length_min;
      longest = h->length_max;
    }
  if (shortest <= h->question_tokens)
    return INVALID (LATEST (pub.harness.lengths, pub.harness.question_tokens),
                    "a context of %" G_GINT64_FORMAT " tokens leaves no room for the needle before the %"
                    G_GINT64_FORMAT " question tokens", shortest, h->question_tokens);
  /* A bounded cache evicts; it must hold the protected tokens and the
   * block just offloaded (docs/eviction.md). */
  const gint64 need = p->protect_sinks + p->protect_recent + shape->block_size
                      + (p->evict_granularity == SIFT_EVICT_BLOCK ? 2 * (gint64) shape->block_size : 0);
  if (p->capacity_tokens > 0 && p->capacity_tokens < need)
    return INVALID (LATEST (pub.capacity_tokens, pub.protect_recent),
                    "kv.capacity_tokens = %" G_GINT64_FORMAT " cannot hold %" G_GINT64_FORMAT
                    " protected sink and %" G_GINT64_FORMAT " recent tokens with %s eviction of %d-token blocks"
                    " (at least %" G_GINT64_FORMAT " needed)",
                    p->capacity_tokens, p->protect_sinks, p->protect_recent,
                    p->evict_granularity == SIFT_EVICT_BLOCK ? "block" : "token", shape->block_size, need);
  for (gsize i = 0; i < h->n_capacities; i++)
    if (h->capacities[i] > 0 && h->capacities[i] < need)
      return INVALID (AT (pub.harness.capacities),
                      "harness.capacities has %" G_GINT64_FORMAT ", below the %" G_GINT64_FORMAT
                      " tokens the protected sinks, recent window and one block need",
                      h->capacities[i], need);
  SiftConfigMemory mem;
  sift_config_memory_estimate (p, longest, &mem);
  if (mem.machine > 0 && mem.engine + mem.store > mem.machine)
    {
      g_autofree char *need = size_text (mem.engine + mem.store);
      g_autofree char *engine = size_text (mem.engine);
      g_autofree char *store = size_text (mem.store);
      g_autofree char *machine = size_text (mem.machine);
      return INVALID (latest_of (cfg, memory_keys, G_N_ELEMENTS (memory_keys)),
                      "this config needs about %s of memory at once (%s of buffers, %s of KV in the host store for "
                      "%" G_GINT64_FORMAT " tokens), more than this machine's %s: make model.layers, the heads, "
                      "model.head_dim, kv.chunk_size or harness.lengths smaller%s",
                      need, engine, store, longest, machine,
                      mem.store > 0 ? ", or keep the KV in a file (offload.store: file)" : "");
    }
#undef INVALID
  if (!validate_setups (cfg, registry, error))
    return FALSE;

  shape->scale = cfg->scale > 0 ? (float) cfg->scale : (float) (1.0 / sqrt ((double) shape->head_dim));
  /* An unset offload.path stays unset: the harness derives it from the output
   * directory it really uses (`--out` may move it after validation). */
  g_free (p->store_path);
  p->store_path = g_strdup (cfg->store_path);
  return TRUE;
}
