/* sift — model sources: where q, k and v come from.
 *
 * A source yields, for one layer and a token range, the projected q, k, v
 * (after rotary embedding), f32 and token-major. It is deterministic: the
 * same (layer, range) always gives the same values, whatever was asked
 * before, so the runner can ask for any range in any order. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/error.h>
#include <sift/policy.h>

G_BEGIN_DECLS

typedef struct _SiftModelSource SiftModelSource;

typedef struct {
  const char *name;
  /* q: [n][n_q_heads][head_dim], k and v: [n][n_kv_heads][head_dim] for
   * tokens pos0..pos0+n-1 of `layer`. */
  gboolean (*qkv) (SiftModelSource *self, gint32 layer, gint64 pos0, gint64 n,
                   float *q, float *k, float *v, GError **error);
  void (*finalize) (SiftModelSource *self);
} SiftModelSourceClass;

struct _SiftModelSource {
  const SiftModelSourceClass *klass;
  SiftModelShape shape;
};

SIFT_API gboolean sift_model_source_qkv (SiftModelSource *src, gint32 layer, gint64 pos0, gint64 n,
                                         float *q, float *k, float *v, GError **error);
SIFT_API void sift_model_source_free (SiftModelSource *src);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftModelSource, sift_model_source_free)

/* Independent N(0, 1) values seeded by (seed, layer, position): for tests. */
SIFT_API SiftModelSource *sift_model_random_new (const SiftModelShape *shape, guint64 seed);

G_END_DECLS
