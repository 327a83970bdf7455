/* Just enough JSON for the harness's records: a writer over GString and a
 * strict reader into a small tree. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* ---- Writing: each call appends one member or element, comma first when needed. */

typedef struct {
  GString *s;
  gboolean first;   /* no member written yet in the innermost container */
} JsonWriter;

void json_begin_object (JsonWriter *w, const char *key); /* key NULL: an element / the top */
void json_end_object (JsonWriter *w);
void json_begin_array (JsonWriter *w, const char *key);
void json_end_array (JsonWriter *w);
void json_string (JsonWriter *w, const char *key, const char *value);  /* NULL: null */
void json_double (JsonWriter *w, const char *key, double value);       /* not finite: null */
void json_int (JsonWriter *w, const char *key, gint64 value);
void json_uint (JsonWriter *w, const char *key, guint64 value);
void json_bool (JsonWriter *w, const char *key, gboolean value);

/* ---- Reading ------------------------------------------------------------------ */

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct _JsonNode JsonNode;
struct _JsonNode {
  JsonType type;
  double number;      /* NUMBER, BOOL (0 / 1) */
  char *string;       /* STRING */
  char *key;          /* member name inside an object */
  GPtrArray *items;   /* ARRAY, OBJECT: JsonNode * (owned) */
};

/* Parses one complete value; trailing text other than blanks is an error
 * naming the column. */
JsonNode *json_parse (const char *text, GError **error);
void json_node_free (JsonNode *node);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (JsonNode, json_node_free)

/* Member of an object by a dotted path ("scores.pass"), or NULL. */
const JsonNode *json_get (const JsonNode *node, const char *path);
/* Number at path; NAN if absent or null. */
double json_get_double (const JsonNode *node, const char *path);
/* String at path, or NULL. */
const char *json_get_string (const JsonNode *node, const char *path);

G_END_DECLS
