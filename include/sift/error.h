/* sift — error domains, one per area. */
#pragma once

#include <glib.h>
#include <sift/api.h>

G_BEGIN_DECLS

#define SIFT_ATTN_ERROR (sift_attn_error_quark ())
#define SIFT_CONFIG_ERROR (sift_config_error_quark ())
#define SIFT_PLUGIN_ERROR (sift_plugin_error_quark ())
#define SIFT_ENGINE_ERROR (sift_engine_error_quark ())
#define SIFT_STORE_ERROR (sift_store_error_quark ())
#define SIFT_MODEL_ERROR (sift_model_error_quark ())
#define SIFT_HARNESS_ERROR (sift_harness_error_quark ())

SIFT_API GQuark sift_attn_error_quark (void);
SIFT_API GQuark sift_config_error_quark (void);
SIFT_API GQuark sift_plugin_error_quark (void);
SIFT_API GQuark sift_engine_error_quark (void);
SIFT_API GQuark sift_store_error_quark (void);
SIFT_API GQuark sift_model_error_quark (void);
SIFT_API GQuark sift_harness_error_quark (void);

/* Kernels and tensor views: a call the shapes or arguments make impossible. */
typedef enum {
  SIFT_ATTN_ERROR_INVALID, /* NULL argument, bad dtype, empty head_dim */
  SIFT_ATTN_ERROR_SHAPE,   /* shapes disagree, heads do not divide */
} SiftAttnError;

/* YAML configuration; messages read "file:line:col: message". */
typedef enum {
  SIFT_CONFIG_ERROR_IO,             /* file cannot be read */
  SIFT_CONFIG_ERROR_SYNTAX,         /* not valid YAML */
  SIFT_CONFIG_ERROR_UNKNOWN_KEY,    /* key not in the section's table */
  SIFT_CONFIG_ERROR_DUPLICATE_KEY,  /* key given twice in one mapping */
  SIFT_CONFIG_ERROR_TYPE,           /* wrong YAML type for the key */
  SIFT_CONFIG_ERROR_RANGE,          /* value outside the allowed range */
  SIFT_CONFIG_ERROR_UNKNOWN_POLICY, /* no plugin provides that policy */
  SIFT_CONFIG_ERROR_PARAM,          /* policy param unknown, wrong type or range */
  SIFT_CONFIG_ERROR_PHASE,          /* policy placed in a phase it does not support */
  SIFT_CONFIG_ERROR_MISSING,        /* a required key is absent */
  SIFT_CONFIG_ERROR_INVALID,        /* keys valid alone, impossible together */
} SiftConfigError;

/* Plugin loading; every message names the file. */
typedef enum {
  SIFT_PLUGIN_ERROR_OPEN,           /* g_module_open failed (loader's message) */
  SIFT_PLUGIN_ERROR_NOT_PLUGIN,     /* entry symbol missing */
  SIFT_PLUGIN_ERROR_ABI,            /* ABI major differs or minor is newer */
  SIFT_PLUGIN_ERROR_DUPLICATE,      /* two files provide one policy name */
  SIFT_PLUGIN_ERROR_MISSING_METHOD, /* a method required by a declared flag is NULL */
  SIFT_PLUGIN_ERROR_INVALID,        /* descriptor malformed (no name, bad param table) */
  SIFT_PLUGIN_ERROR_INIT,           /* the policy's init failed */
  SIFT_PLUGIN_ERROR_UNKNOWN,        /* no plugin provides that policy name */
} SiftPluginError;

/* The OffloadEngine and the layerwise runner. */
typedef enum {
  SIFT_ENGINE_ERROR_INVALID,   /* bad configuration or arguments */
  SIFT_ENGINE_ERROR_SELECTION, /* select_blocks answered ids out of range, duplicated or not available */
  SIFT_ENGINE_ERROR_POLICY,    /* a policy method failed */
  SIFT_ENGINE_ERROR_STATE,     /* call out of order (e.g. decode before prefill) */
  SIFT_ENGINE_ERROR_CAPACITY,  /* block table or buffer full */
} SiftEngineError;

/* Block stores (tiers). */
typedef enum {
  SIFT_STORE_ERROR_IO,         /* read or write failed (errno message) */
  SIFT_STORE_ERROR_SHORT_READ, /* fewer bytes than a block */
  SIFT_STORE_ERROR_FULL,       /* no space left (store capacity or disk) */
  SIFT_STORE_ERROR_CHANGED,    /* backing file changed underneath (size check) */
  SIFT_STORE_ERROR_INVALID,    /* bad id, bad configuration */
} SiftStoreError;

/* Model sources. */
typedef enum {
  SIFT_MODEL_ERROR_INVALID,     /* impossible shape or range */
  SIFT_MODEL_ERROR_FAILED,
  SIFT_MODEL_ERROR_IO,          /* a model file cannot be opened or mapped */
  SIFT_MODEL_ERROR_FORMAT,      /* a model file is malformed (truncated, bad offsets, bad types) */
  SIFT_MODEL_ERROR_UNSUPPORTED, /* well-formed but not supported (version, architecture, tensor type) */
  SIFT_MODEL_ERROR_MISSING,     /* a required metadata key or tensor is absent */
} SiftModelError;

/* The needle harness. */
typedef enum {
  SIFT_HARNESS_ERROR_INVALID,
  SIFT_HARNESS_ERROR_IO,
  SIFT_HARNESS_ERROR_RECORDS, /* existing records cannot be resumed */
} SiftHarnessError;

G_END_DECLS
