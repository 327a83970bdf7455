/* The config's private side: key tables, origins of values, setups, and
 * the calls between the config's files. */
#pragma once

#include <yaml.h>
#include <sift/config.h>
#include <sift/registry.h>

/* The key types of the public table (SiftConfigKeyType) and core's own:
 * the policy setups. */
#define KEY_INT ((int) SIFT_CONFIG_KEY_INT)
#define KEY_INT32 ((int) SIFT_CONFIG_KEY_INT32)
#define KEY_UINT64 ((int) SIFT_CONFIG_KEY_UINT64)
#define KEY_FLOAT ((int) SIFT_CONFIG_KEY_FLOAT)
#define KEY_BOOL ((int) SIFT_CONFIG_KEY_BOOL)
#define KEY_STRING ((int) SIFT_CONFIG_KEY_STRING)
#define KEY_ENUM ((int) SIFT_CONFIG_KEY_ENUM)
#define KEY_INT_LIST ((int) SIFT_CONFIG_KEY_INT_LIST)
#define KEY_FLOAT_LIST ((int) SIFT_CONFIG_KEY_FLOAT_LIST)
#define KEY_SETUP 64  /* policy: one setup (a mapping) */
#define KEY_SETUPS 65 /* policies: a list of setups */
#define KEY_LABEL 66  /* a setup's label */
#define KEY_CHOICE 67 /* a setup's prefill or decode: a name, or {name, params} */
#define KEY_SOURCE 68 /* model.source: a string, one of the registered model sources */

typedef SiftConfigKey Key;
typedef SiftConfigEnumValue EnumValue;

/* A section's values in one config: the owner's struct (core's own
 * sections keep theirs in the Config itself, `owned` FALSE). */
typedef struct {
  const SiftConfigSection *section;
  gpointer values;
  gboolean owned;
} Instance;

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
  GPtrArray *instances;       /* Instance *, by section order: every section registered when made */
  GPtrArray *sources;         /* Source *, every text read */
  GHashTable *origins;        /* address of a value -> Origin * */
  guint64 seq;
  gboolean implied_setup;     /* setups holds only the default full+full */
} Config;

extern const Key sift_config_root_keys[];  /* core's top-level keys: policy, policies */
extern const Key sift_config_setup_keys[];

/* ---- Sections (config-sections.c) ---- */
/* Every registered section, core's first, by order (the array is the caller's). */
GPtrArray *sift_config_sections (void);
/* Core's own sections: values in the Config (core/config-tables.c). */
extern const SiftConfigSection sift_config_core_sections[];
extern const gsize sift_config_n_core_sections;
/* The key `name` of the sections at `path` in cfg (NULL: the top level),
 * and the values it is stored in; NULL when none has it. */
const Key *sift_config_find_key (const Config *cfg, const char *path, const char *name, gpointer *values);
/* Whether `path.name` (or `name` at the top) is a section of cfg. */
gboolean sift_config_is_section (const Config *cfg, const char *path, const char *name);
/* "; did you mean ..." over the keys, sections and (top) setups at path. */
char *sift_config_path_suggestion (const Config *cfg, const char *path, const char *name);
/* The value of `path` (dotted), or NULL; *key set when found. */
gpointer sift_config_value_at (const Config *cfg, const char *path, const Key **key);
/* Each registered section's values in a new config, at their defaults;
 * freeing them; a copy's own (origins moved along). */
void sift_config_instances_init (Config *cfg);
void sift_config_instances_free (Config *cfg);
void sift_config_instances_copy (Config *to, const Config *from);
/* Sets a key to its default (the text of its `def`; model.source: the
 * default registered source). */
void sift_config_key_default (const Key *k, gpointer values);
/* The registered model sources' names as an enum table (value: the
 * index), NULL-terminated; the array is the caller's, the names are not. */
EnumValue *sift_config_model_sources (void);
/* Keys whose value is a string the config owns (strings, model.source). */
#define KEY_HOLDS_STRING(k) ((k)->type == KEY_STRING || (k)->type == KEY_SOURCE)

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
void sift_config_remember (Config *cfg, gconstpointer field, const Origin *at);
const Origin *sift_config_origin_at (const Config *cfg, gconstpointer field);
const Origin *sift_config_latest_of (const Config *cfg, const gconstpointer *fields, gsize n);
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
/* A mapping of setup keys (table sift_config_setup_keys, base a Setup), or
 * of config keys and sections at `path` (table NULL; NULL path: the top). */
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
