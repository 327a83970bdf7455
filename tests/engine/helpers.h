/* Helpers shared by the engine tests: a source whose k and v are already
 * rounded to a stored dtype, a naive double-precision attention reference,
 * an observer that checks every attention call against it, and a test case
 * (shape, store, dtypes, pipeline, policy, steps) run through the runner. */
#pragma once

#include <sift/sift.h>

#include "engine-private.h"

/* The random source, k and v rounded through `dtype` (f32: unchanged). */
SiftModel *test_source_new (const SiftModelShape *shape, guint64 seed, SiftDType round_to);

/* Which stored keys a query head attends: NULL = all. */
typedef gboolean (*TestKeep) (gint64 block, gint32 q_head, gpointer data);

typedef struct {
  SiftModel *src;
  const SiftModelShape *shape;
  gint64 n_tokens;         /* tokens cached */
  float **k, **v;          /* [n_layers] -> [n_tokens][n_kv_heads][head_dim] */
  gint64 prompt;           /* prefill tokens, for the block of a token (keep) */
  TestKeep keep;
  gpointer keep_data;
  double max_err;          /* max over calls of |out - ref|_inf / max(|ref|_inf, 1e-3) per row */
  double max_lse_err;
  gint64 calls;
  GArray *outputs;         /* every float of every call, in order (for bitwise comparisons) */
} TestChecker;

TestChecker *test_checker_new (SiftModel *src, gint64 n_tokens);
void test_checker_free (TestChecker *c);
/* The observer: compares each attention call with the reference. */
extern const SiftRunnerObserver test_checker_observer;

/* A store config for a shape; path used only by the file store. */
SiftStoreConfig test_store_config (const SiftModelShape *shape, SiftDType dtype, const char *path);
/* A temporary path (removed by the store unless keep). */
char *test_tmp_path (const char *tag);

/* ---- A case run through the runner against the checker ------------------
 * Shared by test-engine.c and test-resident.c, each also built with
 * SIFT_TEST_CUDA (tests/cuda): then every engine is on the GPU and the
 * shared cases take the GPU kernels' head_dim and compute dtype. */
#ifdef SIFT_TEST_CUDA
#define TEST_DEVICE SIFT_DEVICE_CUDA
#define T_DIM 64                      /* head_dim of the shared cases */
#define T_COMPUTE SIFT_DTYPE_F16      /* their compute dtype */
#else
#define TEST_DEVICE SIFT_DEVICE_CPU
#define T_DIM 32
#define T_COMPUTE SIFT_DTYPE_F32
#endif

/* The error bound of a compute dtype on TEST_DEVICE. */
double test_tolerance (SiftDType compute);

/* Dense with every method NULL, and a policy that selects every block. */
extern const SiftPolicyOps test_full_ops;
extern const SiftPolicyOps test_select_all_ops;

typedef enum { TEST_POL_NULL, TEST_POL_FULL, TEST_POL_SELECT_ALL } TestPolicyKind;

typedef struct {
  gint32 layers, q_heads, kv_heads, head_dim, block, chunk, slots;
  gboolean file;
  SiftDType stored, compute;
  SiftPipeline pipeline;
  gint64 prompt;
  gint32 steps;        /* decode steps; every 7th has 3 rows, every 23rd 16 rows */
  TestPolicyKind policy;
} TestCase;

gint32 test_rows_of_step (gint32 i);
gint64 test_case_tokens (const TestCase *c);
SiftModelShape test_case_shape (const TestCase *c);

typedef struct {
  SiftStore *store;
  SiftEngine *engine;
  SiftModel *src;
  SiftPolicy *policy;
  SiftPolicy **per_layer;  /* [layers], each the case's policy (or NULL) */
  SiftRunner *runner;
  TestChecker *check;
  char *path;
} TestRun;

/* An engine on TEST_DEVICE for the case (its own store, or `shared`), KV
 * resident if asked (sift_engine_set_resident), the case's policy on every
 * layer, the checker observing; seed of the random source. */
void test_run_open (TestRun *r, const TestCase *c, guint64 seed, SiftStore *shared, gboolean resident);
/* After sift_runner_reset on a: a sequence of seed 2 on a's engine equals the
 * same sequence on a fresh engine (resident or not), bit for bit; closes both. */
void test_run_reset_matches_fresh (TestRun *a, const TestCase *c, gboolean resident);
/* Prefill the prompt, then the case's decode steps. */
void test_run_sequence (TestRun *r, const TestCase *c);
/* Frees the run; with own_store, checks its store is empty and its file gone. */
void test_run_close (TestRun *r, gboolean own_store);
