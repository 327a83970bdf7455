/* sift — declared policy parameters and their resolved values.
 *
 * A policy declares its parameters in a NULL-terminated SiftParamSpec table;
 * the host validates YAML (and --set overrides) against it and hands the
 * policy's init a SiftParams with one typed value per declared parameter.
 * A policy never parses YAML itself. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef enum {
  SIFT_PARAM_INT = 0,      /* gint64 */
  SIFT_PARAM_FLOAT = 1,    /* double */
  SIFT_PARAM_BOOL = 2,     /* gboolean */
  SIFT_PARAM_STRING = 3,   /* const char *, optionally one of `choices` */
  SIFT_PARAM_INT_LIST = 4, /* gint64[], each element within [min, max] */
} SiftParamType;

typedef struct {
  const char *name;          /* NULL ends the table */
  SiftParamType type;
  const char *default_value; /* YAML scalar or flow list: "4", "0.9", "true", "max", "[0, 1]" */
  double min, max;           /* int, float, int-list: inclusive range; ignored if min > max */
  const char *choices;       /* string: allowed values separated by '|' ("max|mean"), or NULL */
  const char *doc;           /* one line, printed by `sift policies info` */
} SiftParamSpec;

typedef struct _SiftParams SiftParams;

/* Getters for a policy's init. The name must be declared with that type;
 * otherwise g_critical and a zero value. Pointers live as long as params. */
gint64 sift_params_get_int (const SiftParams *params, const char *name);
double sift_params_get_float (const SiftParams *params, const char *name);
gboolean sift_params_get_bool (const SiftParams *params, const char *name);
const char *sift_params_get_string (const SiftParams *params, const char *name);
const gint64 *sift_params_get_int_list (const SiftParams *params, const char *name, gsize *n_out);

/* Host side. A SiftParams starts with every declared default (a default
 * that fails its own validation is an error), then takes values by name as
 * text, each validated against its spec with a message naming the value. */
SiftParams *sift_params_new (const SiftParamSpec *specs, GError **error);
SiftParams *sift_params_copy (const SiftParams *params);
void sift_params_free (SiftParams *params);
/* Sets one value from YAML text (a scalar, or a flow list for int-list).
 * Errors: SIFT_CONFIG_ERROR_PARAM (undeclared, with the nearest declared
 * name), SIFT_CONFIG_ERROR_TYPE, SIFT_CONFIG_ERROR_RANGE. */
gboolean sift_params_set_text (SiftParams *params, const char *name, const char *text, GError **error);
gboolean sift_params_set_int_list (SiftParams *params, const char *name, const gint64 *values, gsize n, GError **error);
const SiftParamSpec *sift_params_specs (const SiftParams *params);
/* The value formatted as YAML text (for records and `config check`); free with g_free. */
char *sift_params_to_text (const SiftParams *params, const char *name);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftParams, sift_params_free)

G_END_DECLS
