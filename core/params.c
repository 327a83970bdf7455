/* Declared policy parameters: defaults, typed values, validation. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sift/error.h>
#include <sift/params.h>

#include "nearest.h"
#include "params-private.h"

typedef struct {
  gint64 *v;
  gsize n;
} IntList;

typedef union {
  gint64 i;
  double f;
  gboolean b;
  char *s;
  IntList list;
} Value;

struct _SiftParams {
  const SiftParamSpec *specs; /* the policy's table (static in the plugin) */
  gsize n;
  Value *values;              /* [n], in table order */
};

/* ---- Scalar text -------------------------------------------------------- */

gboolean
sift_text_to_int (const char *text, gint64 *out)
{
  if (text == NULL || *text == '\0')
    return FALSE;
  gint64 v;
  if (!g_ascii_string_to_signed (text, 10, G_MININT64, G_MAXINT64, &v, NULL))
    return FALSE;
  *out = v;
  return TRUE;
}

gboolean
sift_text_to_float (const char *text, double *out)
{
  if (text == NULL || *text == '\0' || g_ascii_isspace (*text))
    return FALSE;
  char *end = NULL;
  errno = 0;
  double v = g_ascii_strtod (text, &end);
  if (end == text || *end != '\0' || errno == ERANGE || !isfinite (v))
    return FALSE;
  /* strtod reads hex floats and "infinity"; YAML users mean neither. */
  for (const char *c = text; *c; c++)
    if (!(g_ascii_isdigit (*c) || *c == '.' || *c == 'e' || *c == 'E' || *c == '+' || *c == '-'))
      return FALSE;
  *out = v;
  return TRUE;
}

gboolean
sift_text_beyond_range (const char *text, gboolean integer)
{
  if (text == NULL)
    return FALSE;
  if (integer)
    {
      const char *digits = text + (*text == '+' || *text == '-');
      return *digits != '\0' && strspn (digits, "0123456789") == strlen (digits);
    }
  if (strspn (text, "+-0123456789.eE") != strlen (text))
    return FALSE;
  char *end = NULL;
  errno = 0;
  g_ascii_strtod (text, &end);
  return end != text && *end == '\0' && errno == ERANGE;
}

gboolean
sift_text_to_bool (const char *text, gboolean *out)
{
  static const char *const yes[] = { "true", "yes", "on" };
  static const char *const no[] = { "false", "no", "off" };
  if (text == NULL)
    return FALSE;
  for (gsize i = 0; i < G_N_ELEMENTS (yes); i++)
    {
      if (g_ascii_strcasecmp (text, yes[i]) == 0)
        return *out = TRUE, TRUE;
      if (g_ascii_strcasecmp (text, no[i]) == 0)
        return *out = FALSE, TRUE;
    }
  return FALSE;
}

gboolean
sift_text_to_int_list (const char *text, gint64 **values, gsize *n)
{
  if (text == NULL)
    return FALSE;
  g_autofree char *s = g_strstrip (g_strdup (text));
  gsize len = strlen (s);
  if (len < 2 || s[0] != '[' || s[len - 1] != ']')
    return FALSE;
  s[len - 1] = '\0';
  g_autoptr (GArray) out = g_array_new (FALSE, FALSE, sizeof (gint64));
  g_autofree char *inner = g_strstrip (g_strdup (s + 1));
  if (*inner != '\0')
    {
      g_auto (GStrv) items = g_strsplit (inner, ",", -1);
      for (gsize i = 0; items[i]; i++)
        {
          gint64 v;
          if (!sift_text_to_int (g_strstrip (items[i]), &v))
            return FALSE;
          g_array_append_val (out, v);
        }
    }
  *n = out->len;
  *values = (gint64 *) (void *) g_array_free (g_steal_pointer (&out), FALSE);
  return TRUE;
}

char *
sift_float_to_text (double value)
{
  char buf[G_ASCII_DTOSTR_BUF_SIZE];
  char fmt[8];
  /* Plain decimals where they read well, else the shortest %g. */
  gboolean plain = value == 0.0 || (fabs (value) >= 1e-4 && fabs (value) < 1e15);
  for (int digits = plain ? 0 : 1; digits <= 17; digits++)
    {
      g_snprintf (fmt, sizeof fmt, plain ? "%%.%df" : "%%.%dg", digits);
      g_ascii_formatd (buf, sizeof buf, fmt, value);
      if (g_ascii_strtod (buf, NULL) == value)
        break;
    }
  /* Keep it a float to a YAML reader: 4 -> 4.0. */
  if (strpbrk (buf, ".eEn") == NULL)
    return g_strconcat (buf, ".0", NULL);
  return g_strdup (buf);
}

char *
sift_yaml_quote (const char *text)
{
  gboolean plain = text[0] != '\0';
  for (const char *c = text; *c && plain; c++)
    plain = g_ascii_isalnum (*c) || strchr ("_-./+", *c) != NULL;
  gboolean scalar_lookalike;
  double d;
  gboolean b;
  scalar_lookalike = sift_text_to_float (text, &d) || sift_text_to_bool (text, &b)
                     || g_ascii_strcasecmp (text, "null") == 0 || strcmp (text, "~") == 0;
  if (plain && !scalar_lookalike && text[0] != '-')
    return g_strdup (text);
  GString *s = g_string_new ("\"");
  for (const char *c = text; *c; c++)
    {
      if (*c == '"' || *c == '\\')
        g_string_append_c (s, '\\');
      if (*c == '\n')
        g_string_append (s, "\\n");
      else
        g_string_append_c (s, *c);
    }
  g_string_append_c (s, '"');
  return g_string_free (s, FALSE);
}

static char *
number_text (double x, gboolean integer)
{
  if (integer && fabs (x) < 9.0e15)
    return g_strdup_printf ("%" G_GINT64_FORMAT, (gint64) x);
  return sift_float_to_text (x);
}

char *
sift_range_to_text (double lo, double hi, gboolean integer)
{
  g_autofree char *a = number_text (lo, integer);
  g_autofree char *b = number_text (hi, integer);
  return g_strdup_printf ("[%s, %s]", a, b);
}

/* ---- Specs -------------------------------------------------------------- */

static const char *
type_name (SiftParamType type)
{
  switch (type)
    {
    case SIFT_PARAM_TYPE_INT: return "an integer";
    case SIFT_PARAM_TYPE_FLOAT: return "a number";
    case SIFT_PARAM_TYPE_BOOL: return "a boolean (true or false)";
    case SIFT_PARAM_TYPE_STRING: return "a string";
    case SIFT_PARAM_TYPE_CHOICE: return "one of its choices";
    case SIFT_PARAM_TYPE_INT_LIST: return "a list of integers";
    }
  return "?";
}

static gboolean
has_range (const SiftParamSpec *spec)
{
  return spec->type == SIFT_PARAM_TYPE_INT || spec->type == SIFT_PARAM_TYPE_FLOAT
         || spec->type == SIFT_PARAM_TYPE_INT_LIST;
}

/* A value holding text: strings, choices. */
static gboolean
is_text (SiftParamType type)
{
  return type == SIFT_PARAM_TYPE_STRING || type == SIFT_PARAM_TYPE_CHOICE;
}

static gboolean
check_range (const SiftParamSpec *spec, double x, const char *shown, GError **error)
{
  if (!has_range (spec) || (x >= spec->min && x <= spec->max))
    return TRUE;
  g_autofree char *range = sift_range_to_text (spec->min, spec->max, spec->type != SIFT_PARAM_TYPE_FLOAT);
  g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_RANGE,
               "parameter '%s' = %s is out of range %s", spec->name, shown, range);
  return FALSE;
}

static gssize
choice_index (const SiftParamSpec *spec, const char *text)
{
  for (gsize i = 0; spec->choices[i] != NULL; i++)
    if (strcmp (spec->choices[i], text) == 0)
      return (gssize) i;
  return -1;
}

static gboolean
check_choice (const SiftParamSpec *spec, const char *text, GError **error)
{
  if (spec->type != SIFT_PARAM_TYPE_CHOICE || choice_index (spec, text) >= 0)
    return TRUE;
  const char *near = sift_nearest_name (text, spec->choices, g_strv_length ((char **) spec->choices));
  g_autofree char *hint = near ? g_strdup_printf ("; did you mean '%s'?", near) : g_strdup ("");
  g_autofree char *all = g_strjoinv ("|", (char **) spec->choices);
  g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_RANGE,
               "parameter '%s' = '%s' is not one of %s%s", spec->name, text, all, hint);
  return FALSE;
}

static void
value_clear (const SiftParamSpec *spec, Value *v)
{
  if (is_text (spec->type))
    g_clear_pointer (&v->s, g_free);
  else if (spec->type == SIFT_PARAM_TYPE_INT_LIST)
    g_clear_pointer (&v->list.v, g_free);
}

static gboolean
check_list (const SiftParamSpec *spec, const gint64 *values, gsize n, GError **error)
{
  for (gsize i = 0; i < n; i++)
    {
      g_autofree char *shown = g_strdup_printf ("%" G_GINT64_FORMAT " (element %" G_GSIZE_FORMAT ")",
                                                values[i], i);
      if (!check_range (spec, (double) values[i], shown, error))
        return FALSE;
    }
  return TRUE;
}

/* Parses and validates text for one spec into *out (not touching it on error). */
static gboolean
parse_value (const SiftParamSpec *spec, const char *text, Value *out, GError **error)
{
  Value v = { 0 };
  gboolean ok = FALSE;
  switch (spec->type)
    {
    case SIFT_PARAM_TYPE_INT: ok = sift_text_to_int (text, &v.i); break;
    case SIFT_PARAM_TYPE_FLOAT: ok = sift_text_to_float (text, &v.f); break;
    case SIFT_PARAM_TYPE_BOOL: ok = sift_text_to_bool (text, &v.b); break;
    case SIFT_PARAM_TYPE_STRING:
    case SIFT_PARAM_TYPE_CHOICE: ok = text != NULL; break;
    case SIFT_PARAM_TYPE_INT_LIST: ok = sift_text_to_int_list (text, &v.list.v, &v.list.n); break;
    }
  if (!ok && (spec->type == SIFT_PARAM_TYPE_INT || spec->type == SIFT_PARAM_TYPE_FLOAT)
      && sift_text_beyond_range (text, spec->type == SIFT_PARAM_TYPE_INT))
    {
      g_autofree char *range = sift_range_to_text (spec->min, spec->max, spec->type == SIFT_PARAM_TYPE_INT);
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_RANGE, "parameter '%s' = %s is out of range %s",
                   spec->name, text, range);
      return FALSE;
    }
  if (!ok)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_TYPE, "parameter '%s' expects %s, got '%s'",
                   spec->name, type_name (spec->type), text ? text : "(null)");
      return FALSE;
    }
  switch (spec->type)
    {
    case SIFT_PARAM_TYPE_INT: ok = check_range (spec, (double) v.i, text, error); break;
    case SIFT_PARAM_TYPE_FLOAT: ok = check_range (spec, v.f, text, error); break;
    case SIFT_PARAM_TYPE_BOOL: break;
    case SIFT_PARAM_TYPE_STRING:
    case SIFT_PARAM_TYPE_CHOICE:
      ok = check_choice (spec, text, error);
      v.s = ok ? g_strdup (text) : NULL;
      break;
    case SIFT_PARAM_TYPE_INT_LIST: ok = check_list (spec, v.list.v, v.list.n, error); break;
    }
  if (!ok)
    {
      value_clear (spec, &v);
      return FALSE;
    }
  *out = v;
  return TRUE;
}

static gboolean
valid_name (const char *name)
{
  if (name == NULL || !(g_ascii_islower (name[0]) || name[0] == '_'))
    return FALSE;
  for (const char *c = name; *c; c++)
    if (!(g_ascii_islower (*c) || g_ascii_isdigit (*c) || *c == '_'))
      return FALSE;
  return TRUE;
}

/* What the default cannot show: a type the host knows, choices exactly
 * on CHOICE, text defaults present, a range that is one. */
static gboolean
check_spec (const SiftParamSpec *spec, GError **error)
{
  if ((guint) spec->type > SIFT_PARAM_TYPE_INT_LIST)
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID,
                   "parameter '%s' has an unknown type %d", spec->name, (int) spec->type);
      return FALSE;
    }
  if ((spec->choices != NULL) != (spec->type == SIFT_PARAM_TYPE_CHOICE)
      || (spec->choices != NULL && spec->choices[0] == NULL))
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID,
                   spec->choices != NULL && spec->type == SIFT_PARAM_TYPE_CHOICE ? "parameter '%s' has no choices"
                   : spec->choices != NULL ? "parameter '%s' has choices but is not a choice"
                                           : "parameter '%s' is a choice without choices",
                   spec->name);
      return FALSE;
    }
  if ((is_text (spec->type) || spec->type == SIFT_PARAM_TYPE_INT_LIST) && spec->default_text == NULL)
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID, "parameter '%s' has no default", spec->name);
      return FALSE;
    }
  if (has_range (spec) && !(spec->min <= spec->max))
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID,
                   "parameter '%s' has an empty range (min > max)", spec->name);
      return FALSE;
    }
  return TRUE;
}

char *
sift_param_spec_default_text (const SiftParamSpec *spec)
{
  g_return_val_if_fail (spec != NULL, NULL);
  switch (spec->type)
    {
    case SIFT_PARAM_TYPE_INT: return g_strdup_printf ("%" G_GINT64_FORMAT, spec->default_int);
    case SIFT_PARAM_TYPE_FLOAT: return sift_float_to_text (spec->default_float);
    case SIFT_PARAM_TYPE_BOOL: return g_strdup (spec->default_bool ? "true" : "false");
    case SIFT_PARAM_TYPE_STRING:
    case SIFT_PARAM_TYPE_CHOICE:
    case SIFT_PARAM_TYPE_INT_LIST: return g_strdup (spec->default_text);
    }
  return NULL;
}

/* ---- SiftParams ----------------------------------------------------------- */

void
sift_params_free (SiftParams *params)
{
  if (params == NULL)
    return;
  for (gsize i = 0; i < params->n; i++)
    value_clear (&params->specs[i], &params->values[i]);
  g_free (params->values);
  g_free (params);
}

SiftParams *
sift_params_new (const SiftParamSpec *specs, GError **error)
{
  g_autoptr (SiftParams) params = g_new0 (SiftParams, 1);
  params->specs = specs;
  while (specs != NULL && specs[params->n].name != NULL)
    params->n++;
  params->values = g_new0 (Value, params->n + 1);
  for (gsize i = 0; i < params->n; i++)
    {
      const SiftParamSpec *spec = &specs[i];
      if (!valid_name (spec->name))
        {
          g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID,
                       "parameter %" G_GSIZE_FORMAT " has an invalid name '%s' (expected [a-z_][a-z0-9_]*)",
                       i, spec->name);
          return NULL;
        }
      for (gsize j = 0; j < i; j++)
        if (strcmp (specs[j].name, spec->name) == 0)
          {
            g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID,
                         "parameter '%s' is declared twice", spec->name);
            return NULL;
          }
      if (!check_spec (spec, error))
        return NULL;
      g_autofree char *text = sift_param_spec_default_text (spec);
      GError *local = NULL;
      if (!parse_value (spec, text, &params->values[i], &local))
        {
          g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID, "invalid default '%s': %s",
                       text, local->message);
          g_error_free (local);
          return NULL;
        }
    }
  return g_steal_pointer (&params);
}

SiftParams *
sift_params_copy (const SiftParams *params)
{
  g_return_val_if_fail (params != NULL, NULL);
  SiftParams *copy = g_new0 (SiftParams, 1);
  copy->specs = params->specs;
  copy->n = params->n;
  copy->values = g_memdup2 (params->values, sizeof (Value) * (params->n + 1));
  for (gsize i = 0; i < params->n; i++)
    {
      Value *v = &copy->values[i];
      if (is_text (params->specs[i].type))
        v->s = g_strdup (v->s);
      else if (params->specs[i].type == SIFT_PARAM_TYPE_INT_LIST)
        v->list.v = g_memdup2 (v->list.v, sizeof (gint64) * v->list.n);
    }
  return copy;
}

const SiftParamSpec *
sift_params_specs (const SiftParams *params)
{
  g_return_val_if_fail (params != NULL, NULL);
  return params->specs;
}

static gssize
find (const SiftParams *params, const char *name)
{
  for (gsize i = 0; i < params->n; i++)
    if (strcmp (params->specs[i].name, name) == 0)
      return (gssize) i;
  return -1;
}

static gssize
find_or_suggest (const SiftParams *params, const char *name, GError **error)
{
  gssize i = find (params, name);
  if (i >= 0)
    return i;
  g_autofree const char **names = g_new0 (const char *, params->n + 1);
  for (gsize k = 0; k < params->n; k++)
    names[k] = params->specs[k].name;
  const char *near = sift_nearest_name (name, names, params->n);
  g_autofree char *all = g_strjoinv (", ", (char **) names);
  if (near != NULL)
    g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_PARAM,
                 "undeclared parameter '%s'; did you mean '%s'?", name, near);
  else if (params->n > 0)
    g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_PARAM,
                 "undeclared parameter '%s' (declared: %s)", name, all);
  else
    g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_PARAM,
                 "undeclared parameter '%s' (the policy declares none)", name);
  return -1;
}

gboolean
sift_params_set_text (SiftParams *params, const char *name, const char *text, GError **error)
{
  g_return_val_if_fail (params != NULL && name != NULL && text != NULL, FALSE);
  gssize i = find_or_suggest (params, name, error);
  if (i < 0)
    return FALSE;
  Value v;
  if (!parse_value (&params->specs[i], text, &v, error))
    return FALSE;
  value_clear (&params->specs[i], &params->values[i]);
  params->values[i] = v;
  return TRUE;
}

gboolean
sift_params_set_int_list (SiftParams *params, const char *name, const gint64 *values, gsize n, GError **error)
{
  g_return_val_if_fail (params != NULL && name != NULL && (values != NULL || n == 0), FALSE);
  gssize i = find_or_suggest (params, name, error);
  if (i < 0)
    return FALSE;
  const SiftParamSpec *spec = &params->specs[i];
  if (spec->type != SIFT_PARAM_TYPE_INT_LIST)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_TYPE, "parameter '%s' expects %s, got a list",
                   name, type_name (spec->type));
      return FALSE;
    }
  if (!check_list (spec, values, n, error))
    return FALSE;
  value_clear (spec, &params->values[i]);
  params->values[i].list.v = g_memdup2 (values, sizeof (gint64) * n);
  params->values[i].list.n = n;
  return TRUE;
}

char *
sift_params_to_text (const SiftParams *params, const char *name)
{
  g_return_val_if_fail (params != NULL && name != NULL, NULL);
  gssize i = find (params, name);
  g_return_val_if_fail (i >= 0, NULL);
  const Value *v = &params->values[i];
  switch (params->specs[i].type)
    {
    case SIFT_PARAM_TYPE_INT: return g_strdup_printf ("%" G_GINT64_FORMAT, v->i);
    case SIFT_PARAM_TYPE_FLOAT: return sift_float_to_text (v->f);
    case SIFT_PARAM_TYPE_BOOL: return g_strdup (v->b ? "true" : "false");
    case SIFT_PARAM_TYPE_STRING:
    case SIFT_PARAM_TYPE_CHOICE: return sift_yaml_quote (v->s);
    case SIFT_PARAM_TYPE_INT_LIST:
      {
        GString *s = g_string_new ("[");
        for (gsize k = 0; k < v->list.n; k++)
          g_string_append_printf (s, "%s%" G_GINT64_FORMAT, k ? ", " : "", v->list.v[k]);
        g_string_append_c (s, ']');
        return g_string_free (s, FALSE);
      }
    }
  return NULL;
}

/* ---- Getters -------------------------------------------------------------- */

/* The value of a parameter declared with `type` (or `alt`, the same when
 * only one type will do), with its index in *index_out when non-NULL. */
static const Value *
get_either (const SiftParams *params, const char *name, SiftParamType type, SiftParamType alt, gssize *index_out)
{
  g_return_val_if_fail (params != NULL && name != NULL, NULL);
  gssize i = find (params, name);
  if (i < 0 || (params->specs[i].type != type && params->specs[i].type != alt))
    {
      g_critical ("policy parameter '%s' is not declared as %s", name, type_name (type));
      return NULL;
    }
  if (index_out != NULL)
    *index_out = i;
  return &params->values[i];
}

static const Value *
get (const SiftParams *params, const char *name, SiftParamType type)
{
  return get_either (params, name, type, type, NULL);
}

gint64
sift_params_get_int (const SiftParams *params, const char *name)
{
  const Value *v = get (params, name, SIFT_PARAM_TYPE_INT);
  return v ? v->i : 0;
}

double
sift_params_get_float (const SiftParams *params, const char *name)
{
  const Value *v = get (params, name, SIFT_PARAM_TYPE_FLOAT);
  return v ? v->f : 0.0;
}

gboolean
sift_params_get_bool (const SiftParams *params, const char *name)
{
  const Value *v = get (params, name, SIFT_PARAM_TYPE_BOOL);
  return v ? v->b : FALSE;
}

const char *
sift_params_get_string (const SiftParams *params, const char *name)
{
  const Value *v = get_either (params, name, SIFT_PARAM_TYPE_STRING, SIFT_PARAM_TYPE_CHOICE, NULL);
  return v ? v->s : NULL;
}

gint
sift_params_get_choice (const SiftParams *params, const char *name)
{
  gssize i = -1;
  const Value *v = get_either (params, name, SIFT_PARAM_TYPE_CHOICE, SIFT_PARAM_TYPE_CHOICE, &i);
  return v ? (gint) choice_index (&params->specs[i], v->s) : 0;
}

const gint64 *
sift_params_get_int_list (const SiftParams *params, const char *name, gsize *n_out)
{
  const Value *v = get (params, name, SIFT_PARAM_TYPE_INT_LIST);
  if (n_out != NULL)
    *n_out = v ? v->list.n : 0;
  return v ? v->list.v : NULL;
}
