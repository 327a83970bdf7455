/* The needle harness's config section (harness.*; docs/config.md): its
 * values and its registration. */
#pragma once

#include <sift/sift.h>
#include <synthetic/synthetic.h>

G_BEGIN_DECLS

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

/* harness: the needle grid (defaults: the key table, harness-config.c). */
typedef struct {
  gint64 *lengths; gsize n_lengths;   /* length_spacing explicit */
  SiftSpacing length_spacing;         /* linear/sigmoid use length_min/max/count */
  gint64 length_min, length_max, length_count;
  double *depths; gsize n_depths;     /* depth_spacing explicit */
  SiftSpacing depth_spacing;          /* linear/sigmoid use depth_count over [0, 1] */
  gint64 depth_count;
  SiftDepthSpan depth_span;
  SiftNeedleKind needle;
  gint64 n_distractors;               /* multikey */
  gint64 n_values;                    /* multivalue */
  gint64 n_queries;                   /* multiquery */
  SiftNeedleValue value;              /* text needles (model.source gguf) */
  char *haystack;                     /* NULL: the King James Bible from Debian's `bible`; else a text file */
  gint64 question_tokens;             /* last tokens of the prompt that ask */
  gint64 decode_steps;
  gint64 *capacities; gsize n_capacities; /* KV budgets swept (kv.capacity_tokens per run) */
  double min_accuracy;                /* exit 1 below this (fraction of cells passed) */
  guint64 seed;
  gint64 baseline_seeds;              /* random-baseline draws per cell (0: none) */
  char *out_dir;
} SiftHarnessConfig;

/* harness, with the model sections the harness reads (model.synthetic,
 * model.path): register before loading a config the harness runs. */
extern const SiftConfigSection sift_harness_config_section;
void sift_harness_config_register (void);
/* The harness keys of a config made after registration. */
const SiftHarnessConfig *sift_harness_config (const SiftConfig *config);

/* Bytes a run keeps in memory at once (harness-memory.c). */
typedef struct {
  double engine;  /* compute-side buffers, model source */
  double store;   /* the host store's KV for the longest context (0: file store) */
  double machine; /* physical memory (0: unknown) */
} HarnessMemory;

void harness_memory_estimate (const SiftConfig *config, gint64 longest, HarnessMemory *out);

G_END_DECLS
