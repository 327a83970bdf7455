/* sift — the layerwise runner: chunked prefill and token-by-token decode
 * over every layer, driven by a model source, with a prefill and a decode
 * policy per layer. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/engine.h>
#include <sift/model.h>
#include <sift/policy.h>

G_BEGIN_DECLS

typedef struct _SiftRunner SiftRunner;

/* Hooks for the harness and tests; any may be NULL. */
typedef struct {
  /* After a layer's attention for a prefill chunk or decode step:
   * out f32 [n_q_heads][ctx->n_q][head_dim], lse [n_q_heads][ctx->n_q]. */
  void (*attention) (gpointer user_data, const SiftPolicyContext *ctx, const SiftView *out, const float *lse);
  /* After the engine validated a policy's selection (not called for
   * layers whose policy selects nothing). */
  void (*selection) (gpointer user_data, const SiftPolicyContext *ctx, const SiftSelection *selection);
} SiftRunnerObserver;

/* prefill[l] and decode[l] are the policies of layer l (not owned; one
 * instance may serve several layers only if it keys its state by
 * ctx->layer). NULL means dense attention over every block through the
 * default pipeline (layers forced dense). Each policy must support the phase
 * it is placed in. */
SIFT_API SiftRunner *sift_runner_new (SiftEngine *engine, SiftModelSource *source,
                                      SiftPolicy *const *prefill, SiftPolicy *const *decode,
                                      GError **error);
SIFT_API void sift_runner_free (SiftRunner *runner);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftRunner, sift_runner_free)

SIFT_API void sift_runner_set_observer (SiftRunner *runner, const SiftRunnerObserver *observer, gpointer user_data);

/* Prefills tokens [0, n_tokens) chunk by chunk (chunk_size tokens, the last
 * chunk possibly shorter). Only once per sequence. */
SIFT_API gboolean sift_runner_prefill (SiftRunner *runner, gint64 n_tokens, GError **error);
/* One decode step of n_rows (1..16) new tokens at the next positions. */
SIFT_API gboolean sift_runner_decode (SiftRunner *runner, gint32 n_rows, GError **error);
/* Tokens processed so far. */
SIFT_API gint64 sift_runner_position (const SiftRunner *runner);
/* New sequence: resets the engine and every policy. */
SIFT_API void sift_runner_reset (SiftRunner *runner);

G_END_DECLS
