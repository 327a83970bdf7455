/* The eviction tests' fixtures (evict-run.c): a source with a needle
 * every query attends to, an in-process scoring policy, and a run of a
 * scenario checked against a reference over the tokens the engine keeps. */
#pragma once

#include <sift/sift.h>

typedef enum {
  SCORE_RANDOM,    /* pseudo-random scores: scattered victims */
  SCORE_HOSTILE,   /* -inf for every candidate: evict all it may */
} ScoreMode;

#define MAX_LAYERS 4
#define MAX_BLOCKS 256

typedef struct {
  SiftPolicy parent;
  ScoreMode mode;
  gint64 sinks, recent;      /* what the engine protects: candidates must avoid it */
  gint64 bad_candidates;     /* candidates that were protected */
  gint64 calls, hooks;
  /* Quest-style metadata: per (layer, block id) the sum of its valid keys. */
  double key_sum[MAX_LAYERS][MAX_BLOCKS];
} TestPolicy;

typedef struct {
  const char *policy;            /* NULL: dense, oldest first; "test": test_ops; else a registry name */
  const char *params[4];         /* name=value for a registry policy */
  ScoreMode mode;
  gint64 capacity;
  SiftEvictGranularity gran;
  gint64 sinks, recent;
  gint32 layers, block, chunk;
  gint64 prompt, steps;
  gint32 rows;                   /* per decode step */
  SiftPipeline pipe;
  gint64 needle;                 /* -1: plain random source */
  gboolean check;                /* compare every call with the kept-token reference */
  SiftDType store;               /* stored dtype (the source's k and v rounded through it) */
  gboolean file;                 /* the file store, else host */
  gboolean separate;             /* prefill and decode get their own instances (as the harness does) */
} Scenario;

typedef struct {
  const Scenario *sc;
  SiftModelShape shape;
  SiftModel *src;
  SiftStore *store;
  SiftEngine *engine;
  SiftRunner *runner;
  SiftPolicy *policy;
  SiftPolicy *decode_policy;     /* sc->separate: the decode phase's own instance */
  float **q, **k, **v;           /* [layer] -> [tokens][heads][dim] */
  gint64 n_tokens;
  double max_err;
  GArray *outputs;               /* every float of every call */
  gint64 max_blocks;             /* store blocks in use, the most seen */
  gint64 *blocks_after;          /* [steps] blocks in use after each step */
} Run;

/* The random source with a needle at `needle` (-1: none) every query attends to. */
SiftModel *needle_source_new (const SiftModelShape *shape, guint64 seed, gint64 needle);

extern const SiftPolicyOps test_ops;  /* the in-process policy ("test") */
extern SiftRegistry *registry;        /* the build tree's policies, set up by the test */
extern const Scenario base;           /* a small scenario the tests vary */

Run *run_new (const Scenario *sc);
void run_free (Run *r);
/* The engine's state after a step: memory bounded, protected tokens kept. */
void check_state (Run *r);
/* Prefill and every decode step of the scenario. */
void run_all (Run *r);
