/* sift — the synthetic model source (model/synthetic/; not installed).
 *
 * A seeded, deterministic SiftModelSource whose attention looks like a real
 * model's where sparse policies care: attention sinks, locality (a rotary
 * kernel and slowly drifting content shared by q and k), heavy-hitter
 * columns, relative-position
 * structure (RoPE on the last rope_dims dims) and retrieval heads in which
 * question queries attend to planted needle keys. Every value is a function
 * of (seed, layer, head, position): any range is generated on demand and the
 * sequence is never materialised. docs/synthetic-model.md explains each knob
 * and the geometry behind it. */
#pragma once

#include <glib.h>
#include <sift/config.h>
#include <sift/error.h>
#include <sift/model.h>

G_BEGIN_DECLS

/* One planted token. */
typedef struct {
  gint64 position;
  gint32 key;          /* needle key index 0..n_keys-1 (the one questions ask for) */
  gint32 distractor;   /* -1 for a needle; d >= 0 for distractor d (multikey) */
} SiftNeedle;

/* Where needles, distractors and question tokens are. The question rows are
 * the prompt's last question_tokens positions and every position after the
 * prompt (decode steps ask again); the row at position p asks for key
 * (p - question_start) mod n_keys. */
typedef struct {
  SiftNeedleKind kind;
  gint64 n_tokens;          /* prompt length */
  gint64 question_tokens;   /* >= 1 */
  gint64 question_start;    /* n_tokens - question_tokens */
  double depth;             /* 0..1 as asked */
  gint32 n_keys;            /* multiquery: n_queries; otherwise 1 */
  double distractor_similarity; /* cosine between a distractor's key and the needle key */
  SiftNeedle *needles;      /* [n_needles], ascending position */
  gsize n_needles;
} SiftNeedlePlan;

void sift_needle_plan_free (SiftNeedlePlan *plan);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftNeedlePlan, sift_needle_plan_free)

/* TRUE when position p is a question row. */
gboolean sift_needle_plan_is_question (const SiftNeedlePlan *plan, gint64 p);
/* The key asked at question position p. */
gint32 sift_needle_plan_key_at (const SiftNeedlePlan *plan, gint64 p);
/* Positions of the needles (not distractors) holding `key`, ascending;
 * returns how many were written (at most max_out). */
gsize sift_needle_plan_targets (const SiftNeedlePlan *plan, gint32 key, gint64 *out, gsize max_out);

/* The synthetic source. knobs NULL: the defaults of config.h. plan NULL: no
 * needles and no question rows (heavy hitters spread over 4096 tokens).
 * The plan is copied. SIFT_MODEL_ERROR_INVALID for an impossible shape or
 * knob (message names the knob and value). */
SiftModelSource *sift_model_synthetic_new (const SiftModelShape *shape, guint64 seed,
                                           const SiftSyntheticConfig *knobs,
                                           const SiftNeedlePlan *plan, GError **error);
/* The knobs' defaults (the values config.h documents). */
void sift_synthetic_config_defaults (SiftSyntheticConfig *knobs);
/* TRUE when q head `q_head` of `layer` is a retrieval head. */
gboolean sift_model_synthetic_is_retrieval_head (SiftModelSource *src, gint32 layer, gint32 q_head);
/* The value code of a token: what v holds for (layer, kv_head, position),
 * written to out[head_dim]. */
void sift_model_synthetic_value_code (SiftModelSource *src, gint32 layer, gint32 kv_head,
                                      gint64 position, float *out);
/* Heavy-hitter positions, ascending (owned by the source). */
const gint64 *sift_model_synthetic_heavy_hitters (SiftModelSource *src, gsize *n_out);

G_END_DECLS
