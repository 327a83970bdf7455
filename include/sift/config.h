/* sift — the YAML configuration, parsed and validated.
 *
 * Every key, its type, default and range is in docs/config.md. Errors
 * (SIFT_CONFIG_ERROR) read "file:line:col: message" followed by the source
 * line and a caret under the offending node. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/dtype.h>
#include <sift/engine.h>
#include <sift/params.h>
#include <sift/policy.h>

G_BEGIN_DECLS

typedef struct _SiftRegistry SiftRegistry;

/* model.synthetic: knobs of the synthetic source (docs/synthetic-model.md). */
typedef struct {
  gint64 sink_tokens;            /* 4; first tokens every query attends to (0: off) */
  double sink_strength;          /* 11.5; logit boost of sink keys */
  double locality;               /* 2.0; strength of the rotary recency bias (0: off) */
  double locality_scale;         /* 64.0; tokens over which recency decays */
  gint64 heavy_hitters;          /* 8; columns that attract attention everywhere (0: off) */
  double heavy_hitter_strength;  /* 9.5; logit boost of heavy-hitter keys */
  gint64 rope_dims;              /* 32; dims with rotary embedding (0: none; even, <= head_dim) */
  double rope_base;              /* 10000.0 */
  double retrieval_heads;        /* 0.25; fraction of heads whose question attends to the needle */
  double needle_strength;        /* 16.0; logit of question . needle key in retrieval heads */
  double noise;                  /* 0.8; scale of the random part of q and k */
  double drift;                  /* 6.0; logit a key gets from a query at its own position through the
                                  * slowly drifting content q and k share (0: off) */
  double drift_scale;            /* 64.0; tokens over which the drifting content decorrelates */
  gint64 logn_length;            /* 0 (off); queries at position p >= logn_length are scaled by
                                  * ln(p + 1) / ln(logn_length), so attention stays as sharp past
                                  * that length as at it (Qwen's logn attention, SSMax) */
  gboolean planted_exact;        /* false ("planted_keys: matched"): needle and distractor keys carry an
                                  * ordinary key's noise and norm; true ("exact"): clean, fixed-norm keys
                                  * (the former model, for comparison) */
} SiftSyntheticConfig;

typedef enum {
  SIFT_NEEDLE_SINGLE = 0,
  SIFT_NEEDLE_MULTIKEY = 1,   /* distractors with near-identical keys, other values */
  SIFT_NEEDLE_MULTIVALUE = 2, /* one key, several values: all must be retrieved */
  SIFT_NEEDLE_MULTIQUERY = 3, /* several needles, each asked for */
} SiftNeedleKind;

/* What a text needle's value is (model.source gguf): RULER's kinds. */
typedef enum {
  SIFT_NEEDLE_VALUE_NUMBER = 0, /* 6 digits */
  SIFT_NEEDLE_VALUE_WORD = 1,   /* a word of the haystack text */
  SIFT_NEEDLE_VALUE_UUID = 2,   /* 8-4-4 hex digits */
} SiftNeedleValue;

typedef enum {
  SIFT_SPACING_EXPLICIT = 0,  /* the list as given */
  SIFT_SPACING_LINEAR = 1,
  SIFT_SPACING_SIGMOID = 2,   /* denser near the ends (classic NIAH depth spacing) */
} SiftSpacing;

typedef enum {
  SIFT_DEPTH_INTERIOR = 0,    /* depths span the blocks between the first and the last before the question */
  SIFT_DEPTH_FULL = 1,        /* depths span the whole haystack (0 in the first block, 1 in the last) */
} SiftDepthSpan;

/* harness: the needle grid. */
typedef struct {
  gint64 *lengths; gsize n_lengths;   /* [1024, 2048, 4096] */
  SiftSpacing length_spacing;         /* explicit; linear/sigmoid use length_min/max/count */
  gint64 length_min, length_max, length_count;
  double *depths; gsize n_depths;     /* [0.0, 0.25, 0.5, 0.75, 1.0] */
  SiftSpacing depth_spacing;          /* explicit; linear/sigmoid use depth_count over [0, 1] */
  gint64 depth_count;
  SiftDepthSpan depth_span;           /* interior */
  SiftNeedleKind needle;              /* single */
  gint64 n_distractors;               /* 3 (multikey) */
  gint64 n_values;                    /* 3 (multivalue) */
  gint64 n_queries;                   /* 2 (multiquery) */
  SiftNeedleValue value;              /* number (text needles: model.source gguf) */
  char *haystack;                     /* NULL: the King James Bible from Debian's `bible`; else a text file */
  gint64 question_tokens;             /* 4: last tokens of the prompt that ask */
  gint64 decode_steps;                /* 8 */
  gint64 *capacities; gsize n_capacities; /* []: KV budgets swept (kv.capacity_tokens per run) */
  double min_accuracy;                /* 0.0; exit 1 below this (fraction of cells passed) */
  guint64 seed;                       /* 1 */
  gint64 baseline_seeds;              /* 5: random-baseline draws per cell (0: none) */
  char *out_dir;                      /* "sift-out" */
} SiftHarnessConfig;

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

typedef struct {
  char *file;                         /* the first file read */
  /* model */
  char *source;                       /* "synthetic" | "random" | "gguf" */
  char *model_path;                   /* the GGUF file (source "gguf"), or NULL */
  SiftModelShape shape;               /* layers 2, q_heads 8, kv_heads 2, head_dim 64; scale 0 = 1/sqrt(d) */
  guint64 seed;                       /* 1 */
  SiftSyntheticConfig synthetic;
  /* kv */
  SiftDType store_dtype;              /* f16 */
  SiftDType compute_dtype;            /* f32 */
  gint64 capacity_tokens;             /* stored tokens kept per layer, evicting beyond; 0 = unbounded */
  SiftEvictGranularity evict_granularity; /* token */
  gint64 protect_sinks;               /* 4; first tokens never evicted */
  gint64 protect_recent;              /* 64; most recent tokens never evicted */
  /* offload */
  char *store;                        /* "host" | "file" */
  char *store_path;                   /* file store path; default "<out_dir>/kv.store" */
  gboolean store_keep;
  gboolean store_direct;
  gint32 ring_slots;                  /* 4 */
  SiftPipeline pipeline;              /* ring */
  gboolean force_copy;                /* false: ring loads from a host store in the compute dtype map (zero-copy) */
  /* policies */
  GPtrArray *setups;                  /* SiftPolicySetup *, at least one */
  /* harness */
  SiftHarnessConfig harness;
} SiftConfig;

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
/* The resolved config as YAML (every key, defaults filled). */
SIFT_API char *sift_config_to_yaml (const SiftConfig *config);
SIFT_API void sift_config_free (SiftConfig *config);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftConfig, sift_config_free)

G_END_DECLS
