/* sift — the synthetic model source (model/synthetic/; not installed).
 *
 * A seeded, deterministic SiftModel whose attention looks like a real
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

/* model.synthetic: knobs of the synthetic source (docs/synthetic-model.md;
 * their defaults: the key table, model/synthetic/synthetic-config.c). */
typedef struct {
  gint64 sink_tokens;            /* first tokens every query attends to (0: off) */
  double sink_strength;          /* logit boost of sink keys */
  double locality;               /* strength of the rotary recency bias (0: off) */
  double locality_scale;         /* tokens over which recency decays */
  gint64 heavy_hitters;          /* columns that attract attention everywhere (0: off) */
  double heavy_hitter_strength;  /* logit boost of heavy-hitter keys */
  gint64 rope_dims;              /* dims with rotary embedding (0: none; even, <= head_dim) */
  double rope_base;              /* rotary base */
  double retrieval_heads;        /* fraction of heads whose question attends to the needle */
  double needle_strength;        /* logit of question . needle key in retrieval heads */
  double noise;                  /* scale of the random part of q and k */
  double drift;                  /* logit a key gets from a query at its own position through the
                                  * slowly drifting content q and k share (0: off) */
  double drift_scale;            /* tokens over which the drifting content decorrelates */
  gint64 logn_length;            /* 0: off; queries at position p >= logn_length are scaled by
                                  * ln(p + 1) / ln(logn_length), so attention stays as sharp past
                                  * that length as at it (Qwen's logn attention, SSMax) */
  gboolean planted_exact;        /* false ("planted_keys: matched"): needle and distractor keys carry an
                                  * ordinary key's noise and norm; true ("exact"): clean, fixed-norm keys
                                  * (the former model, for comparison) */
} SiftSyntheticConfig;

/* model.seed: the seed of the synthetic and random sources (a section at
 * "model", beside core's keys there). */
typedef struct {
  guint64 seed;
} SiftSyntheticSeedConfig;

/* model.synthetic and model.seed, and the model sources "synthetic" (the
 * default) and "random", registered by sift_synthetic_config_register (the
 * tables: model/synthetic/synthetic-config.c). */
extern const SiftConfigSection sift_synthetic_config_section;
extern const SiftConfigSection sift_synthetic_seed_section;
void sift_synthetic_config_register (void);
/* The knobs of a config made after registration. */
const SiftSyntheticConfig *sift_synthetic_config (const SiftConfig *config);
/* model.seed of a config made after registration. */
guint64 sift_synthetic_seed (const SiftConfig *config);

typedef enum {
  SIFT_NEEDLE_SINGLE = 0,
  SIFT_NEEDLE_MULTIKEY = 1,   /* distractors with near-identical keys, other values */
  SIFT_NEEDLE_MULTIVALUE = 2, /* one key, several values: all must be retrieved */
  SIFT_NEEDLE_MULTIQUERY = 3, /* several needles, each asked for */
} SiftNeedleKind;

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

/* The synthetic source. knobs NULL: the key table's defaults. plan NULL: no
 * needles and no question rows (heavy hitters spread over 4096 tokens).
 * The plan is copied. SIFT_MODEL_ERROR_INVALID for an impossible shape or
 * knob (message names the knob and value). */
SiftModel *sift_model_synthetic_new (const SiftModelShape *shape, guint64 seed,
                                           const SiftSyntheticConfig *knobs,
                                           const SiftNeedlePlan *plan, GError **error);
/* The knobs' defaults: the key table's. */
void sift_synthetic_config_defaults (SiftSyntheticConfig *knobs);
/* TRUE when q head `q_head` of `layer` is a retrieval head. */
gboolean sift_model_synthetic_is_retrieval_head (SiftModel *src, gint32 layer, gint32 q_head);
/* The value code of a token: what v holds for (layer, kv_head, position),
 * written to out[head_dim]. */
void sift_model_synthetic_value_code (SiftModel *src, gint32 layer, gint32 kv_head,
                                      gint64 position, float *out);
/* Heavy-hitter positions, ascending (owned by the source). */
const gint64 *sift_model_synthetic_heavy_hitters (SiftModel *src, gsize *n_out);

G_END_DECLS
