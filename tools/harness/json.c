/* JSON writer and reader for the records (json.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sift/error.h>

#include "json.h"

/* ---- Writer --------------------------------------------------------------------- */

static void
escaped (GString *s, const char *v)
{
  g_string_append_c (s, '"');
  for (const unsigned char *p = (const unsigned char *) v; *p; p++)
    switch (*p)
      {
      case '"': g_string_append (s, "\\\""); break;
      case '\\': g_string_append (s, "\\\\"); break;
      case '\n': g_string_append (s, "\\n"); break;
      case '\t': g_string_append (s, "\\t"); break;
      case '\r': g_string_append (s, "\\r"); break;
      default:
        if (*p < 0x20)
          g_string_append_printf (s, "\\u%04x", *p);
        else
          g_string_append_c (s, (char) *p);
      }
  g_string_append_c (s, '"');
}

static void
member (JsonWriter *w, const char *key)
{
  if (!w->first)
    g_string_append_c (w->s, ',');
  w->first = FALSE;
  if (key != NULL)
    {
      escaped (w->s, key);
      g_string_append_c (w->s, ':');
    }
}

static void
open_container (JsonWriter *w, const char *key, char c)
{
  member (w, key);
  g_string_append_c (w->s, c);
  w->first = TRUE;
}

static void
close_container (JsonWriter *w, char c)
{
  g_string_append_c (w->s, c);
  w->first = FALSE;
}

void json_begin_object (JsonWriter *w, const char *key) { open_container (w, key, '{'); }
void json_end_object (JsonWriter *w) { close_container (w, '}'); }
void json_begin_array (JsonWriter *w, const char *key) { open_container (w, key, '['); }
void json_end_array (JsonWriter *w) { close_container (w, ']'); }

void
json_string (JsonWriter *w, const char *key, const char *value)
{
  member (w, key);
  if (value == NULL)
    g_string_append (w->s, "null");
  else
    escaped (w->s, value);
}

void
json_double (JsonWriter *w, const char *key, double value)
{
  member (w, key);
  if (!isfinite (value))
    {
      g_string_append (w->s, "null");
      return;
    }
  char buf[G_ASCII_DTOSTR_BUF_SIZE];
  /* %.17g round-trips a double; g_ascii_ keeps '.' whatever the locale. */
  g_string_append (w->s, g_ascii_formatd (buf, sizeof buf, "%.17g", value));
}

void
json_int (JsonWriter *w, const char *key, gint64 value)
{
  member (w, key);
  g_string_append_printf (w->s, "%" G_GINT64_FORMAT, value);
}

void
json_uint (JsonWriter *w, const char *key, guint64 value)
{
  member (w, key);
  g_string_append_printf (w->s, "%" G_GUINT64_FORMAT, value);
}

void
json_bool (JsonWriter *w, const char *key, gboolean value)
{
  member (w, key);
  g_string_append (w->s, value ? "true" : "false");
}

/* ---- Reader --------------------------------------------------------------------- */

typedef struct {
  const char *start, *p;
  GError **error;
  int depth;
} Parser;

static gboolean
fail (Parser *ps, const char *what)
{
  if (ps->error != NULL && *ps->error == NULL)
    g_set_error (ps->error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_RECORDS, "column %d: %s",
                 (int) (ps->p - ps->start) + 1, what);
  return FALSE;
}

static void
blanks (Parser *ps)
{
  while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')
    ps->p++;
}

static JsonNode *parse_value (Parser *ps);

static char *
parse_string (Parser *ps)
{
  if (*ps->p != '"')
    {
      fail (ps, "expected a string");
      return NULL;
    }
  ps->p++;
  GString *s = g_string_new ("");
  while (*ps->p != '"')
    {
      if (*ps->p == '\0' || (unsigned char) *ps->p < 0x20)
        {
          fail (ps, "unterminated string");
          return g_string_free (s, TRUE), NULL;
        }
      if (*ps->p != '\\')
        {
          g_string_append_c (s, *ps->p++);
          continue;
        }
      ps->p++;
      switch (*ps->p)
        {
        case '"': case '\\': case '/': g_string_append_c (s, *ps->p); break;
        case 'n': g_string_append_c (s, '\n'); break;
        case 't': g_string_append_c (s, '\t'); break;
        case 'r': g_string_append_c (s, '\r'); break;
        case 'b': g_string_append_c (s, '\b'); break;
        case 'f': g_string_append_c (s, '\f'); break;
        case 'u':
          {
            char hex[5] = { 0 };
            for (int i = 0; i < 4; i++)
              {
                if (!g_ascii_isxdigit (ps->p[1 + i]))
                  {
                    fail (ps, "bad \\u escape");
                    return g_string_free (s, TRUE), NULL;
                  }
                hex[i] = ps->p[1 + i];
              }
            g_string_append_unichar (s, (gunichar) strtoul (hex, NULL, 16));
            ps->p += 4;
            break;
          }
        default:
          fail (ps, "bad escape");
          return g_string_free (s, TRUE), NULL;
        }
      ps->p++;
    }
  ps->p++;
  return g_string_free (s, FALSE);
}

static JsonNode *
node_new (JsonType type)
{
  JsonNode *n = g_new0 (JsonNode, 1);
  n->type = type;
  if (type == JSON_ARRAY || type == JSON_OBJECT)
    n->items = g_ptr_array_new_with_free_func ((GDestroyNotify) json_node_free);
  return n;
}

static JsonNode *
parse_container (Parser *ps, gboolean object)
{
  char close = object ? '}' : ']';
  if (++ps->depth > 64)
    return fail (ps, "nested too deep"), NULL;
  ps->p++;
  g_autoptr (JsonNode) n = node_new (object ? JSON_OBJECT : JSON_ARRAY);
  blanks (ps);
  if (*ps->p == close)
    {
      ps->p++;
      ps->depth--;
      return g_steal_pointer (&n);
    }
  for (;;)
    {
      g_autofree char *key = NULL;
      blanks (ps);
      if (object)
        {
          if ((key = parse_string (ps)) == NULL)
            return NULL;
          blanks (ps);
          if (*ps->p != ':')
            return fail (ps, "expected ':'"), NULL;
          ps->p++;
        }
      JsonNode *item = parse_value (ps);
      if (item == NULL)
        return NULL;
      item->key = g_steal_pointer (&key);
      g_ptr_array_add (n->items, item);
      blanks (ps);
      if (*ps->p == ',')
        {
          ps->p++;
          continue;
        }
      if (*ps->p != close)
        return fail (ps, object ? "expected ',' or '}'" : "expected ',' or ']'"), NULL;
      ps->p++;
      ps->depth--;
      return g_steal_pointer (&n);
    }
}

static JsonNode *
parse_value (Parser *ps)
{
  blanks (ps);
  const struct { const char *word; JsonType type; double value; } words[] = {
    { "null", JSON_NULL, 0 }, { "true", JSON_BOOL, 1 }, { "false", JSON_BOOL, 0 },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (words); i++)
    if (strncmp (ps->p, words[i].word, strlen (words[i].word)) == 0)
      {
        ps->p += strlen (words[i].word);
        JsonNode *n = node_new (words[i].type);
        n->number = words[i].value;
        return n;
      }
  if (*ps->p == '{' || *ps->p == '[')
    return parse_container (ps, *ps->p == '{');
  if (*ps->p == '"')
    {
      char *s = parse_string (ps);
      if (s == NULL)
        return NULL;
      JsonNode *n = node_new (JSON_STRING);
      n->string = s;
      return n;
    }
  if (*ps->p == '-' || g_ascii_isdigit (*ps->p))
    {
      char *end = NULL;
      double v = g_ascii_strtod (ps->p, &end);
      if (end == ps->p)
        return fail (ps, "bad number"), NULL;
      ps->p = end;
      JsonNode *n = node_new (JSON_NUMBER);
      n->number = v;
      return n;
    }
  fail (ps, *ps->p ? "unexpected character" : "unexpected end");
  return NULL;
}

JsonNode *
json_parse (const char *text, GError **error)
{
  Parser ps = { text, text, error, 0 };
  g_autoptr (JsonNode) n = parse_value (&ps);
  if (n == NULL)
    {
      fail (&ps, "not JSON");
      return NULL;
    }
  blanks (&ps);
  if (*ps.p != '\0')
    return fail (&ps, "text after the value"), NULL;
  return g_steal_pointer (&n);
}

void
json_node_free (JsonNode *node)
{
  if (node == NULL)
    return;
  g_free (node->string);
  g_free (node->key);
  if (node->items != NULL)
    g_ptr_array_unref (node->items);
  g_free (node);
}

const JsonNode *
json_get (const JsonNode *node, const char *path)
{
  g_auto (GStrv) parts = g_strsplit (path, ".", -1);
  for (char **part = parts; node != NULL && *part != NULL; part++)
    {
      const JsonNode *next = NULL;
      if (node->type == JSON_OBJECT)
        for (guint i = 0; i < node->items->len && next == NULL; i++)
          {
            const JsonNode *c = g_ptr_array_index (node->items, i);
            if (g_strcmp0 (c->key, *part) == 0)
              next = c;
          }
      node = next;
    }
  return node;
}

double
json_get_double (const JsonNode *node, const char *path)
{
  const JsonNode *n = json_get (node, path);
  return n != NULL && (n->type == JSON_NUMBER || n->type == JSON_BOOL) ? n->number : NAN;
}

const char *
json_get_string (const JsonNode *node, const char *path)
{
  const JsonNode *n = json_get (node, path);
  return n != NULL && n->type == JSON_STRING ? n->string : NULL;
}
