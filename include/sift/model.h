/* sift — the model protocol (version 2): how the runner drives a model.
 *
 * A model turns tokens into q, k, v and attention outputs into logits, one
 * step at a time. A step is one prefill chunk (n tokens at positions
 * pos0..pos0+n-1) or one decode step (1..16 rows):
 *
 *   begin (pos0, n, tokens) -> for layer 0..n_layers-1: qkv (layer) -> attended (layer, out)
 *   -> end (logits)
 *
 * Layer l + 1's q, k, v exist only after layer l's attended(): a real
 * transformer computes them from layer l's output. The entry points below
 * check that order and the arguments; a model's methods may assume both.
 * docs/architecture.md shows the runner's side. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/error.h>
#include <sift/policy.h>

G_BEGIN_DECLS

#define SIFT_MODEL_PROTOCOL_VERSION 2

typedef struct _SiftModel SiftModel;

typedef struct {
  guint32 version;      /* SIFT_MODEL_PROTOCOL_VERSION */
  guint32 struct_size;  /* sizeof (SiftModelClass) */
  const char *name;
  /* Starts a step (abandoning one left unfinished after an error).
   * tokens: [n] token ids, or NULL for a model without tokens (synthetic,
   * random). */
  gboolean (*begin) (SiftModel *self, gint64 pos0, gint64 n, const gint32 *tokens, GError **error);
  /* q [n][n_q_heads][head_dim], k and v [n][n_kv_heads][head_dim], f32,
   * after RoPE. Once per layer per step, layers in order, each after the
   * previous layer's attended(). */
  gboolean (*qkv) (SiftModel *self, gint32 layer, float *q, float *k, float *v, GError **error);
  /* The layer's attention output, out [n][n_q_heads][head_dim] f32,
   * token-major (valid only during the call). */
  gboolean (*attended) (SiftModel *self, gint32 layer, const float *out, GError **error);
  /* Ends the step. logits: [n_vocab] for the step's last token (the
   * caller's buffer), or NULL when the caller wants none; a model with
   * n_vocab == 0 never writes it. */
  gboolean (*end) (SiftModel *self, float *logits, GError **error);
  void (*finalize) (SiftModel *self);
  /* Optional (NULL for a real model): q, k, v of any layer and token range
   * in any order, for a model whose q, k, v are a pure function of (layer,
   * position) because it ignores the hidden state (synthetic, random).
   * Tests and references read such models directly through it. */
  gboolean (*qkv_at) (SiftModel *self, gint32 layer, gint64 pos0, gint64 n, float *q, float *k, float *v,
                      GError **error);
} SiftModelClass;

struct _SiftModel {
  const SiftModelClass *klass;
  SiftModelShape shape;
  gint32 n_vocab;           /* 0: no vocabulary, no logits */
  /* The step in progress, kept by the entry points (read-only to models). */
  gint64 step_pos0, step_n;
  gint32 step_next;         /* 0: no step; 2 l + 1: qkv (l) is next; 2 l + 2: attended (l);
                             * 2 n_layers + 1: end */
};

/* Sets a new model's class and shape (the caller allocated the subclass
 * zeroed); SIFT_MODEL_ERROR_INVALID for a class of another protocol version,
 * a class without a required method or an impossible shape. */
SIFT_API gboolean sift_model_init (SiftModel *model, const SiftModelClass *klass, const SiftModelShape *shape,
                          gint32 n_vocab, GError **error);

/* The checked calls (SIFT_MODEL_ERROR_INVALID for an impossible argument or
 * a call out of order, naming the model). */
SIFT_API gboolean sift_model_begin (SiftModel *model, gint64 pos0, gint64 n, const gint32 *tokens, GError **error);
SIFT_API gboolean sift_model_qkv (SiftModel *model, gint32 layer, float *q, float *k, float *v, GError **error);
SIFT_API gboolean sift_model_attended (SiftModel *model, gint32 layer, const float *out, GError **error);
SIFT_API gboolean sift_model_end (SiftModel *model, float *logits, GError **error);
/* TRUE when the model offers qkv_at. */
SIFT_API gboolean sift_model_is_positional (const SiftModel *model);
/* q, k, v of tokens pos0..pos0+n-1 of `layer` (q [n][n_q_heads][head_dim],
 * k and v [n][n_kv_heads][head_dim]); SIFT_MODEL_ERROR_INVALID for a model
 * without qkv_at. Outside the step protocol: never changes a step. */
SIFT_API gboolean sift_model_qkv_at (SiftModel *model, gint32 layer, gint64 pos0, gint64 n, float *q, float *k, float *v,
                            GError **error);
SIFT_API void sift_model_free (SiftModel *model);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftModel, sift_model_free)

/* Ready-made step methods for a model that ignores the hidden state: begin
 * and end do nothing, qkv reads qkv_at over the step's tokens, attended
 * ignores the output. */
SIFT_API gboolean sift_model_positional_begin (SiftModel *self, gint64 pos0, gint64 n, const gint32 *tokens,
                                      GError **error);
SIFT_API gboolean sift_model_positional_qkv (SiftModel *self, gint32 layer, float *q, float *k, float *v, GError **error);
SIFT_API gboolean sift_model_positional_attended (SiftModel *self, gint32 layer, const float *out, GError **error);
SIFT_API gboolean sift_model_positional_end (SiftModel *self, float *logits, GError **error);

/* A class initializer for such a model: its name, qkv_at and finalize. */
#define SIFT_MODEL_POSITIONAL_CLASS(NAME, QKV_AT, FINALIZE) \
  { \
    .version = SIFT_MODEL_PROTOCOL_VERSION, .struct_size = sizeof (SiftModelClass), .name = (NAME), \
    .begin = sift_model_positional_begin, .qkv = sift_model_positional_qkv, \
    .attended = sift_model_positional_attended, .end = sift_model_positional_end, .finalize = (FINALIZE), \
    .qkv_at = (QKV_AT), \
  }

/* Independent N(0, 1) values seeded by (seed, layer, position): for tests. */
SIFT_API SiftModel *sift_model_random_new (const SiftModelShape *shape, guint64 seed);

G_END_DECLS
