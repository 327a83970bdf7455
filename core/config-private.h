/* The config's private side: key tables, origins of values, setups, and
 * the calls between the config's files. */
#pragma once

#include <yaml.h>
#include <sift/config.h>
#include <sift/registry.h>

typedef enum {
  KEY_INT,        /* gint64 */
  KEY_INT32,      /* gint32 */
  KEY_UINT64,     /* guint64 */
  KEY_FLOAT,      /* double */
  KEY_BOOL,       /* gboolean */
  KEY_STRING,     /* char *; one of `values` when given */
  KEY_ENUM,       /* an int-sized enum; one of `values` */
  KEY_INT_LIST,   /* gint64 * at offset, gsize count at count_offset */
  KEY_FLOAT_LIST, /* double * at offset, gsize count at count_offset */
  KEY_SECTION,    /* a nested mapping: `section` */
  KEY_SETUP,      /* policy: one setup (a mapping) */
  KEY_SETUPS,     /* policies: a list of setups */
  KEY_LABEL,      /* a setup's label */
  KEY_CHOICE,     /* a setup's prefill or decode: a name, or {name, params} */
} KeyType;

typedef struct {
  const char *name;
  int value;
} EnumValue;      /* tables end with a NULL name */

typedef struct Key Key;
struct Key {
  const char *name;           /* NULL ends a table */
  KeyType type;
  gsize offset;               /* into the table's base: Config or Setup */
  gsize count_offset;         /* lists */
  double min, max;            /* numbers, list elements: inclusive; unchecked when min > max */
  const EnumValue *values;    /* enums, strings with fixed values */
  const Key *section;         /* KEY_SECTION */
  const char *doc;            /* default and meaning, one line (docs/config.md says more) */
};

typedef struct {
  char *name;                 /* file path, or "--set" */
  char *text;                 /* the whole text, for quoting the offending line */
} Source;

/* Where a value came from: 1-based line and column; seq orders writes. */
typedef struct {
  const Source *src;
  gint line, col;
  guint64 seq;
} Origin;

typedef struct {
  char *key;
  char *text;                 /* YAML text: scalar or flow list */
  Origin key_at, value_at;
} RawParam;

typedef struct {
  SiftPolicySetup pub;
  char *where;                /* for messages: "policy", "policies[2]" */
  gboolean label_given;
  GPtrArray *raw[2];          /* RawParam *: [0] prefill, [1] decode, as written */
  Origin choice_at[2];        /* the name nodes (seq 0: the default) */
  Origin at;                  /* the setup's mapping (seq 0: the implied default) */
  Origin label_at, dense_at;
} Setup;

typedef struct {
  SiftConfig pub;
  double scale;               /* as given; 0: 1/sqrt(head_dim) */
  char *store_path;           /* as given, or NULL for <out_dir>/kv.store */
  GPtrArray *sources;         /* Source *, every text read */
  GHashTable *origins;        /* offset in Config -> Origin * */
  guint64 seq;
  gboolean implied_setup;     /* setups holds only the default full+full */
} Config;

extern const Key sift_config_root_keys[];
extern const Key sift_config_setup_keys[];
extern const EnumValue sift_config_dtype_values[];

/* One document being read (a file, or one --set value). */
typedef struct {
  Config *cfg;
  const Source *src;
  yaml_document_t *doc;
  gint col_offset;            /* --set: where the value starts in the assignment */
  SiftRegistry *registry;
  const Origin *setup_key_at; /* the 'policy' or 'policies' key seen in this document */
  const char *setup_key;
} Ctx;

extern const char *const sift_config_phase_names[2]; /* "prefill", "decode" */

/* ---- Errors and origins (config-locate.c) ---- */
void sift_config_fail_at (GError **error, GQuark domain, gint code, const Origin *at, const char *fallback,
                          const char *fmt, ...) G_GNUC_PRINTF (6, 7);
Origin sift_config_origin_of (Ctx *c, const yaml_node_t *node);
const char *sift_config_node_kind (const yaml_node_t *node);
const char *sift_config_scalar (const yaml_node_t *node);
gboolean sift_config_quoted (const yaml_node_t *node);
char *sift_config_enum_list (const EnumValue *values);
char *sift_config_suggestion (const char *name, const char *const *names, gsize n);
char *sift_config_key_suggestion (const char *name, const Key *table);
void sift_config_remember (Config *cfg, gsize offset, const Origin *at);
const Origin *sift_config_origin_at (const Config *cfg, gsize offset);
const Origin *sift_config_latest_of (const Config *cfg, const gsize *offsets, gsize n);
#define FAIL(code, at, ...) \
  sift_config_fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_##code, at, NULL, __VA_ARGS__)

/* ---- Policy setups (config-setup.c) ---- */
void sift_config_raw_param_free (gpointer data);
Setup *sift_config_setup_new (const char *where);
void sift_config_setup_free (gpointer data);
SiftPolicyChoice *sift_config_setup_choice (Setup *s, int phase);
gboolean sift_config_apply_param (const SiftPolicyChoice *choice, const char *path, const RawParam *r,
                                  GError **error);
gboolean sift_config_resolve_choice (Setup *s, int phase, SiftRegistry *registry, const char *fallback,
                                     GError **error);
gboolean sift_config_param_text (Ctx *c, yaml_node_t *node, const char *path, char **out, GError **error);
void sift_config_raw_put (GPtrArray *raw, RawParam *r);
gboolean sift_config_assign_setup (Ctx *c, Setup *s, const Key *k, yaml_node_t *node, const char *path,
                                   GError **error);
gboolean sift_config_parse_setups_key (Ctx *c, const Key *k, yaml_node_t *key, yaml_node_t *value, GError **error);

/* ---- Values and documents (config-parse.c) ---- */
gboolean sift_config_expect_scalar (Ctx *c, yaml_node_t *node, const char *path, const char *what, GError **error);
gboolean sift_config_assign (Ctx *c, const Key *k, gpointer base, gboolean in_config, yaml_node_t *node,
                             const char *path, GError **error);
gboolean sift_config_parse_mapping (Ctx *c, yaml_node_t *map, const Key *table, gpointer base, const char *path,
                                    GError **error);
const Source *sift_config_add_source (Config *cfg, const char *name, const char *text);
void sift_config_source_free (gpointer data);
void sift_config_at_offset (const char *text, gsize offset, Origin *at);
gboolean sift_config_load_document (const Source *src, const char *text, gint col_offset, yaml_document_t *doc,
                                    GError **error);
gboolean sift_config_merge_text (Config *cfg, const char *name, const char *text, SiftRegistry *registry,
                                 GError **error);

/* ---- Checks across keys (config-check.c) ---- */
gboolean sift_config_validate (Config *cfg, SiftRegistry *registry, GError **error);

/* Sets every default (the values documented in config.h). */
void sift_config_init_defaults (Config *c);

/* Bytes a run keeps in memory at once (core/config-memory.c). */
typedef struct {
  double engine;  /* compute-side buffers, model source */
  double store;   /* the host store's KV for the longest context (0: file store) */
  double machine; /* physical memory (0: unknown) */
} SiftConfigMemory;

void sift_config_memory_estimate (const SiftConfig *config, gint64 longest, SiftConfigMemory *out);
