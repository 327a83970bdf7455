/* sift — declared policy parameters and their resolved values.
 *
 * A policy declares its parameters in a NULL-terminated SiftParamSpec table;
 * the host validates YAML (and --set overrides) against it and hands the
 * policy's init a SiftParams with one typed value per declared parameter.
 * A policy never parses YAML itself. */
#pragma once

#include <glib.h>
#include <sift/api.h>

G_BEGIN_DECLS

typedef enum {
  SIFT_PARAM_TYPE_INT = 0,      /* gint64 within [min, max] */
  SIFT_PARAM_TYPE_FLOAT = 1,    /* finite double within [min, max] */
  SIFT_PARAM_TYPE_BOOL = 2,     /* gboolean */
  SIFT_PARAM_TYPE_STRING = 3,   /* any text */
  SIFT_PARAM_TYPE_CHOICE = 4,   /* one of `choices`; read as its index */
  SIFT_PARAM_TYPE_INT_LIST = 5, /* gint64[], each element within [min, max] */
} SiftParamType;

/* One declared parameter. Write tables with the constructors below, never
 * positionally: each takes what its type needs, and every number has a
 * range (the widest: G_MININT64, G_MAXINT64 or -G_MAXDOUBLE, G_MAXDOUBLE). */
typedef struct {
  const char *name;            /* [a-z_][a-z0-9_]*; NULL ends the table */
  SiftParamType type;
  gboolean default_bool;       /* BOOL */
  const char *doc;             /* one line, printed by `sift policies info` */
  gint64 default_int;          /* INT */
  double default_float;        /* FLOAT */
  const char *default_text;    /* STRING, CHOICE (one of choices), INT_LIST (a flow list: "[0, 1]") */
  double min, max;             /* INT, FLOAT, INT_LIST (each element): inclusive */
  const char *const *choices;  /* CHOICE: the allowed values, NULL-terminated */
  gpointer reserved[4];        /* zero: room for later minors */
} SiftParamSpec;

/* Table constructors, in the manner of GLib's g_param_spec_*:
 *   static const SiftParamSpec params[] = {
 *     SIFT_PARAM_INT ("token_budget", 1024, 16, 1 << 20, "KV tokens kept per head"),
 *     SIFT_PARAM_CHOICE ("score", "max", SIFT_CHOICES ("max", "mean"), "how a block is scored"),
 *     SIFT_PARAM_END,
 *   };
 * The host checks each default against its own range or choices when the
 * plugin loads (SIFT_PLUGIN_ERROR_INVALID otherwise). */
#define SIFT_PARAM_INT(name_, default_, min_, max_, doc_)                      \
  { .name = (name_), .type = SIFT_PARAM_TYPE_INT, .doc = (doc_),                \
    .default_int = (default_), .min = (double) (min_), .max = (double) (max_) }
#define SIFT_PARAM_FLOAT(name_, default_, min_, max_, doc_)                    \
  { .name = (name_), .type = SIFT_PARAM_TYPE_FLOAT, .doc = (doc_),              \
    .default_float = (default_), .min = (min_), .max = (max_) }
#define SIFT_PARAM_BOOL(name_, default_, doc_)                                 \
  { .name = (name_), .type = SIFT_PARAM_TYPE_BOOL, .doc = (doc_), .default_bool = (default_) }
#define SIFT_PARAM_STRING(name_, default_, doc_)                               \
  { .name = (name_), .type = SIFT_PARAM_TYPE_STRING, .doc = (doc_), .default_text = (default_) }
/* choices_: SIFT_CHOICES ("a", "b", ...); sift_params_get_choice returns
 * the index of the value in this list, so a plugin's enum follows its order. */
#define SIFT_PARAM_CHOICE(name_, default_, choices_, doc_)                     \
  { .name = (name_), .type = SIFT_PARAM_TYPE_CHOICE, .doc = (doc_),             \
    .default_text = (default_), .choices = (choices_) }
#define SIFT_CHOICES(...) ((const char *const[]) { __VA_ARGS__, NULL })
/* default_: a flow list as text, "[0, 1]" or "[]". */
#define SIFT_PARAM_INT_LIST(name_, default_, min_, max_, doc_)                 \
  { .name = (name_), .type = SIFT_PARAM_TYPE_INT_LIST, .doc = (doc_),           \
    .default_text = (default_), .min = (double) (min_), .max = (double) (max_) }
#define SIFT_PARAM_END { .name = NULL }

typedef struct _SiftParams SiftParams;

/* Getters for a policy's init. The name must be declared with that type;
 * otherwise g_critical and a zero value. Pointers live as long as params. */
SIFT_API gint64 sift_params_get_int (const SiftParams *params, const char *name);
SIFT_API double sift_params_get_float (const SiftParams *params, const char *name);
SIFT_API gboolean sift_params_get_bool (const SiftParams *params, const char *name);
/* A STRING's value, or a CHOICE's value as text. */
SIFT_API const char *sift_params_get_string (const SiftParams *params, const char *name);
/* A CHOICE's value as its index in the spec's choices. */
SIFT_API gint sift_params_get_choice (const SiftParams *params, const char *name);
SIFT_API const gint64 *sift_params_get_int_list (const SiftParams *params, const char *name, gsize *n_out);

/* Host side. A SiftParams starts with every declared default (a default
 * that fails its own validation is an error), then takes values by name as
 * text, each validated against its spec with a message naming the value. */
SIFT_API SiftParams *sift_params_new (const SiftParamSpec *specs, GError **error);
SIFT_API SiftParams *sift_params_copy (const SiftParams *params);
SIFT_API void sift_params_free (SiftParams *params);
/* Sets one value from YAML text (a scalar, or a flow list for int-list).
 * Errors: SIFT_CONFIG_ERROR_PARAM (undeclared, with the nearest declared
 * name), SIFT_CONFIG_ERROR_TYPE, SIFT_CONFIG_ERROR_RANGE. */
SIFT_API gboolean sift_params_set_text (SiftParams *params, const char *name, const char *text, GError **error);
SIFT_API gboolean sift_params_set_int_list (SiftParams *params, const char *name, const gint64 *values, gsize n, GError **error);
SIFT_API const SiftParamSpec *sift_params_specs (const SiftParams *params);
/* A spec's default as YAML text ("4", "0.9", "true", "max", "[0, 1]"); free with g_free. */
SIFT_API char *sift_param_spec_default_text (const SiftParamSpec *spec);
/* The value formatted as YAML text (for records and `config check`); free with g_free. */
SIFT_API char *sift_params_to_text (const SiftParams *params, const char *name);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftParams, sift_params_free)

G_END_DECLS
