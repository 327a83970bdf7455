/* The config's errors and origins: "file:line:col: message" with the source
 * line and a caret, where each value was written, and sift_config_locate. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>

#include "config-private.h"
#include "nearest.h"
#include "params-private.h"
#include "policy-private.h"

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

void G_GNUC_PRINTF (6, 7)
sift_config_fail_at (GError **error, GQuark domain, gint code, const Origin *at, const char *fallback, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *message = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_autofree char *text = located (at, fallback, message);
  g_set_error_literal (error, domain, code, text);
}


Origin
sift_config_origin_of (Ctx *c, const yaml_node_t *node)
{
  Origin o = { c->src, (gint) node->start_mark.line + 1, (gint) node->start_mark.column + 1, ++c->cfg->seq };
  if (node->start_mark.line == 0)
    o.col += c->col_offset;
  return o;
}

const char *
sift_config_node_kind (const yaml_node_t *node)
{
  switch (node->type)
    {
    case YAML_MAPPING_NODE: return "a mapping";
    case YAML_SEQUENCE_NODE: return "a list";
    default: return "a scalar";
    }
}

const char *
sift_config_scalar (const yaml_node_t *node)
{
  return node->type == YAML_SCALAR_NODE ? (const char *) node->data.scalar.value : NULL;
}

gboolean
sift_config_quoted (const yaml_node_t *node)
{
  return node->data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE
         || node->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE;
}

char *
sift_config_enum_list (const EnumValue *values)
{
  GString *s = g_string_new (NULL);
  for (gsize i = 0; values[i].name; i++)
    g_string_append_printf (s, "%s%s", i ? " | " : "", values[i].name);
  return g_string_free (s, FALSE);
}

char *
sift_config_suggestion (const char *name, const char *const *names, gsize n)
{
  const char *near = sift_nearest_name (name, names, n);
  return near ? g_strdup_printf ("; did you mean '%s'?", near) : g_strdup ("");
}

char *
sift_config_key_suggestion (const char *name, const Key *table)
{
  g_autoptr (GPtrArray) names = g_ptr_array_new ();
  for (gsize i = 0; table[i].name; i++)
    g_ptr_array_add (names, (gpointer) table[i].name);
  return sift_config_suggestion (name, (const char *const *) names->pdata, names->len);
}

/* ---- Origins ---------------------------------------------------------------- */

void
sift_config_remember (Config *cfg, gconstpointer field, const Origin *at)
{
  g_hash_table_insert (cfg->origins, (gpointer) field, g_memdup2 (at, sizeof *at));
}

const Origin *
sift_config_origin_at (const Config *cfg, gconstpointer field)
{
  return g_hash_table_lookup (cfg->origins, field);
}

/* The most recent write among several fields (NULL: all defaults): the
 * write that made a combination impossible. */
const Origin *
sift_config_latest_of (const Config *cfg, const gconstpointer *fields, gsize n)
{
  const Origin *best = NULL;
  for (gsize i = 0; i < n; i++)
    {
      const Origin *o = fields[i] != NULL ? sift_config_origin_at (cfg, fields[i]) : NULL;
      if (o != NULL && (best == NULL || o->seq > best->seq))
        best = o;
    }
  return best;
}

char *
sift_config_locate (const SiftConfig *config, const char *const *keys, const char *message)
{
  g_return_val_if_fail (config != NULL && message != NULL, NULL);
  const Config *cfg = (const Config *) config;
  const Origin *best = NULL;
  for (gsize i = 0; keys != NULL && keys[i] != NULL; i++)
    {
      gpointer field = sift_config_value_at (cfg, keys[i], NULL);
      const Origin *o = field != NULL ? sift_config_origin_at (cfg, field) : NULL;
      if (o != NULL && (best == NULL || o->seq > best->seq))
        best = o;
    }
  return located (best, config->file, message);
}

gboolean
sift_config_is_set (const SiftConfig *config, const char *key)
{
  g_return_val_if_fail (config != NULL && key != NULL, FALSE);
  const Config *cfg = (const Config *) config;
  gpointer field = sift_config_value_at (cfg, key, NULL);
  return field != NULL && sift_config_origin_at (cfg, field) != NULL;
}

gboolean
sift_config_fail (const SiftConfig *config, GError **error, gint code, const char *const *keys, const char *fmt, ...)
{
  g_return_val_if_fail (config != NULL && fmt != NULL, FALSE);
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *message = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_autofree char *text = sift_config_locate (config, keys, message);
  g_set_error_literal (error, SIFT_CONFIG_ERROR, code, text);
  return FALSE;
}

gboolean
sift_config_fail_setup (const SiftConfig *config, guint index, GError **error, gint code, const char *fmt, ...)
{
  g_return_val_if_fail (config != NULL && index < config->setups->len && fmt != NULL, FALSE);
  const Setup *s = config->setups->pdata[index];
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *message = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  sift_config_fail_at (error, SIFT_CONFIG_ERROR, code, s->at.src ? &s->at : NULL, config->file, "%s%s", s->where,
                       message);
  return FALSE;
}
