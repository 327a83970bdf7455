/* Helpers shared by the engine tests: a source whose k and v are already
 * rounded to a stored dtype, a naive double-precision attention reference
 * and an observer that checks every attention call against it. */
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
