/* sift — the YAML configuration, parsed and validated.
 *
 * Every key, its type, default and range is in docs/config.md. Errors
 * (SIFT_CONFIG_ERROR) read "file:line:col: message" followed by the source
 * line and a caret under the offending node. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/dtype.h>
#include <sift/params.h>
#include <sift/policy.h>

G_BEGIN_DECLS

typedef struct _SiftRegistry SiftRegistry;
typedef struct _SiftConfig SiftConfig;

/* ---- Sections, registered by their owners ------------------------------------
 *
 * The config's sections are key tables that their owners register: core
 * reads the model's shape (model.layers ... model.scale, kv.block_size,
 * kv.chunk_size), model.source and the policy setups; the engine registers
 * the rest of kv and offload; the synthetic model its sources' seed
 * (model.seed) and model.synthetic; the GGUF model model.path; the needle
 * harness harness.
 * Each section's values live in a struct of the owner's type, one per
 * config, read with sift_config_get_section (owners wrap it in a typed
 * getter). Parsing, --set, defaults, errors and the resolved YAML all walk
 * the same tables; docs/config.md documents every key. */

typedef enum {
  SIFT_CONFIG_KEY_INT,        /* gint64 */
  SIFT_CONFIG_KEY_INT32,      /* gint32 */
  SIFT_CONFIG_KEY_UINT64,     /* guint64 */
  SIFT_CONFIG_KEY_FLOAT,      /* double */
  SIFT_CONFIG_KEY_BOOL,       /* gboolean */
  SIFT_CONFIG_KEY_STRING,     /* char * (owned by the config); one of `values` when given */
  SIFT_CONFIG_KEY_ENUM,       /* an int-sized enum; one of `values` */
  SIFT_CONFIG_KEY_INT_LIST,   /* gint64 * at offset, gsize count at count_offset */
  SIFT_CONFIG_KEY_FLOAT_LIST, /* double * at offset, gsize count at count_offset */
} SiftConfigKeyType;

/* A name a key may take and the value stored for it; tables end with a NULL name. */
typedef struct {
  const char *name;
  int value;
} SiftConfigEnumValue;

/* One key of a section. Its default is YAML text read like a value in a
 * file ("4", "[1024, 2048]", "f16"): the key table is the one place for
 * every default. */
typedef struct {
  const char *name;                   /* NULL ends a table */
  SiftConfigKeyType type;
  gsize offset;                       /* into the section's struct */
  gsize count_offset;                 /* lists: where the count is */
  double min, max;                    /* numbers and list elements, inclusive; unchecked when min > max */
  const SiftConfigEnumValue *values;  /* enums, and strings with fixed values */
  const char *def;                    /* the default as YAML text; NULL: unset (strings only) */
  const char *doc;                    /* one line; docs/config.md says more */
} SiftConfigKey;

#define SIFT_CONFIG_NO_RANGE 1.0, 0.0

typedef struct _SiftConfigSection SiftConfigSection;
struct _SiftConfigSection {
  const char *path;                   /* where the keys sit: "harness", "model.synthetic"; several
                                       * sections may share a path (their key names must differ) */
  gint order;                         /* place in the resolved YAML, ascending (core: model 0, kv 100) */
  const char *doc;                    /* the section, one line */
  gsize size;                         /* of the owner's struct holding the values */
  const SiftConfigKey *keys;          /* NULL-terminated */
  /* Checks across keys after every file and --set (NULL: none); fails
   * with SIFT_CONFIG_ERROR, placing the message with sift_config_locate. */
  gboolean (*check) (const SiftConfig *config, gconstpointer values, GError **error);
};

/* Adds a section to every config made afterwards (once; again is a no-op).
 * libsift registers the engine's itself; a program using another owner's
 * section calls that owner's register function before loading a config. */
SIFT_API void sift_config_register_section (const SiftConfigSection *section);
/* The values of a registered section in a config (NULL when the section
 * was registered after the config was made). */
SIFT_API gconstpointer sift_config_get_section (const SiftConfig *config, const SiftConfigSection *section);
/* The same, to change (a copy made with sift_config_copy, for one run). */
SIFT_API gpointer sift_config_edit_section (SiftConfig *config, const SiftConfigSection *section);
/* Every key of a section's struct at its default, and freeing what its
 * strings and lists hold (the struct itself is the caller's). */
SIFT_API void sift_config_section_init (const SiftConfigSection *section, gpointer values);
SIFT_API void sift_config_section_clear (const SiftConfigSection *section, gpointer values);

/* ---- Model sources, registered by the models -----------------------------------
 *
 * model.source names where q, k, v come from. Core knows no source: the
 * models register theirs (the synthetic model "synthetic" and "random",
 * the GGUF model "gguf"), with their keys as sections beside. A value that
 * names no registered source is an error listing those that are; with
 * none registered, model.source is unset (NULL) and any value is refused. */
typedef struct {
  const char *name;                   /* model.source's value */
  const char *doc;                    /* one line */
  gboolean is_default;                /* the source of a config that names none (one at most) */
} SiftConfigModelSource;

/* Adds a source to every config made afterwards (once: again, also by
 * another copy of the same table, is a no-op). */
SIFT_API void sift_config_register_model_source (const SiftConfigModelSource *source);

/* A policy in one phase: its name, resolved ops and validated params. */
typedef struct {
  char *name;
  const SiftPolicyOps *ops;
  SiftParams *params;
} SiftPolicyChoice;

/* One column of a comparison: `policy:` (one) or `policies:` (a list). */
typedef struct {
  char *label;                        /* default: "<prefill>+<decode>" or the common name */
  SiftPolicyChoice prefill;           /* default: full */
  SiftPolicyChoice decode;            /* default: full */
  gint64 *dense_layers; gsize n_dense_layers; /* layers that use dense attention in both phases */
  gint64 capacity_tokens;             /* -1: kv.capacity_tokens; else this setup's KV budget (0: unbounded) */
} SiftPolicySetup;

/* Core's keys (defaults: the key table, core/config-tables.c). */
struct _SiftConfig {
  char *file;                         /* the first file read */
  /* model */
  char *source;                       /* a registered model source's name, or NULL (none registered) */
  SiftModelShape shape;               /* scale resolved (model.scale 0: 1/sqrt(head_dim)) */
  /* policies */
  GPtrArray *setups;                  /* SiftPolicySetup *, at least one */
};

/* Parses one file. With registry non-NULL, policy names are resolved and
 * their params validated against the plugins' declarations (loading only
 * the modules named); with NULL they are only checked syntactically. */
SIFT_API SiftConfig *sift_config_load (const char *path, SiftRegistry *registry, GError **error);
/* Parses YAML text; `name` stands for the file in error messages. */
SIFT_API SiftConfig *sift_config_load_string (const char *name, const char *text, SiftRegistry *registry,
                                              GError **error);
/* The defaults alone (one setup: full in both phases). */
SIFT_API SiftConfig *sift_config_new_default (SiftRegistry *registry, GError **error);
/* Reads another file over a config: its keys replace earlier values, its
 * `policy`/`policies` setups are appended (labels must stay distinct). */
SIFT_API gboolean sift_config_merge_file (SiftConfig *config, const char *path, SiftRegistry *registry, GError **error);
/* Applies several assignments, then checks the combination once (so
 * "kv.block_size=100" and "kv.chunk_size=500" may be given together).
 * After an error the config may be partly changed: free it. */
SIFT_API gboolean sift_config_apply (SiftConfig *config, const char *const *assignments, SiftRegistry *registry,
                                     GError **error);
/* Applies "section.key=value" (e.g. "kv.block_size=128",
 * "policy.decode.params.token_budget=1024"), checked like the file. */
SIFT_API gboolean sift_config_set (SiftConfig *config, const char *assignment, SiftRegistry *registry, GError **error);
/* For checks made after loading (the harness, the model source): the
 * message placed at whichever of `keys` (dotted paths such as
 * "harness.lengths" or "model.synthetic.sink_tokens", NULL-terminated) was
 * written last, as "file:line:col: message" with the source line and a
 * caret; "file: message" when every one of them holds its default. */
SIFT_API char *sift_config_locate (const SiftConfig *config, const char *const *keys, const char *message);
/* Whether a file or an assignment wrote `key` (a dotted path such as
 * "model.layers"); FALSE for a key left at its default or unknown. */
SIFT_API gboolean sift_config_is_set (const SiftConfig *config, const char *key);
/* For a section's check: sets `error` (SIFT_CONFIG_ERROR, `code`) to the
 * message placed as sift_config_locate places it; returns FALSE. */
SIFT_API gboolean sift_config_fail (const SiftConfig *config, GError **error, gint code, const char *const *keys,
                                    const char *fmt, ...) G_GNUC_PRINTF (5, 6);
/* The same for a check of setup `index` (config->setups): placed at the
 * setup's mapping; the message continues the setup's name ("policies[1]"),
 * so it starts with its key (".capacity_tokens = ..."). */
SIFT_API gboolean sift_config_fail_setup (const SiftConfig *config, guint index, GError **error, gint code,
                                          const char *fmt, ...) G_GNUC_PRINTF (5, 6);
/* The resolved config as YAML (every key, defaults filled). */
SIFT_API char *sift_config_to_yaml (const SiftConfig *config);
/* A copy with its own section values (the sources and setups are shared). */
SIFT_API SiftConfig *sift_config_copy (const SiftConfig *config);
SIFT_API void sift_config_free (SiftConfig *config);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftConfig, sift_config_free)

G_END_DECLS
