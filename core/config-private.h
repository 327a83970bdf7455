/* The config's private side: key tables, origins of values, setups. */
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

/* Sets every default (the values documented in config.h). */
void sift_config_init_defaults (Config *c);

/* Bytes a run keeps in memory at once (core/config-memory.c). */
typedef struct {
  double engine;  /* compute-side buffers, model source */
  double store;   /* the host store's KV for the longest context (0: file store) */
  double machine; /* physical memory (0: unknown) */
} SiftConfigMemory;

void sift_config_memory_estimate (const SiftConfig *config, gint64 longest, SiftConfigMemory *out);
