/* sift — the sparse-policy ABI.
 *
 * A policy is a versioned ops table (in the manner of PipeWire's SPA method
 * tables and GStreamer's plugin descriptor) exported by a shared module
 * through SIFT_PLUGIN_DEFINE. The host checks versions, required methods and
 * parameters before it creates an instance; see docs/abi.md for when each
 * method is called and with what. A plugin includes only <sift/...> headers. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <gmodule.h>
#include <sift/error.h>
#include <sift/params.h>
#include <sift/view.h>

G_BEGIN_DECLS

/* Major changes break plugins (the host refuses a different major); minor
 * additions append methods marked "since N" at the end of SiftPolicyOps,
 * and fields at the end of the structs below (their reserved words or
 * struct_size say so). 2.0: docs/abi.md, "ABI 2.0". */
#define SIFT_POLICY_ABI_MAJOR 2
#define SIFT_POLICY_ABI_MINOR 0

typedef struct _SiftEngine SiftEngine;
typedef struct _SiftSelection SiftSelection;
typedef struct _SiftPolicy SiftPolicy;
typedef struct _SiftPolicyOps SiftPolicyOps;

typedef enum {
  SIFT_PHASE_PREFILL = 1,
  SIFT_PHASE_DECODE = 2,
} SiftPhase;

typedef enum {
  SIFT_POLICY_SUPPORTS_PREFILL = 1u << 0,
  SIFT_POLICY_SUPPORTS_DECODE = 1u << 1,
  SIFT_POLICY_REQUIRES_BLOCK_SELECTION = 1u << 2, /* engine calls select_blocks before loading */
  /* The engine keeps H2O accumulated attention for the layers this policy
   * serves and passes it to score_eviction (docs/eviction.md). */
  SIFT_POLICY_WANTS_ACCUMULATED_ATTENTION = 1u << 3,
} SiftPolicyFlags;

/* What a KV eviction removes (kv.evict_granularity). */
typedef enum {
  SIFT_EVICT_TOKEN = 0, /* single tokens; blocks are compacted afterwards */
  SIFT_EVICT_BLOCK = 1, /* whole stored blocks (a block's score: the sum of its tokens') */
} SiftEvictGranularity;

typedef struct {
  gint32 n_layers;
  gint32 n_q_heads;
  gint32 n_kv_heads;   /* divides n_q_heads; q head h reads kv head h / (n_q_heads / n_kv_heads) */
  gint32 head_dim;
  gint32 block_size;   /* tokens per stored KV block */
  gint32 chunk_size;   /* prefill tokens per chunk, a multiple of block_size */
  float scale;         /* attention scale, 1/sqrt(head_dim) unless configured */
} SiftModelShape;

/* One stored block of a layer, indexed by its logical id (0, 1, ... in
 * sequence order). A prompt whose length is not a multiple of block_size
 * ends in a partial block; decode tokens then start a new block. It is an
 * array element (SiftPolicyContext.blocks), so its size is fixed: a later
 * minor gives the reserved words a meaning instead of appending fields. */
typedef struct {
  gint64 first_token;  /* position of the block's first token */
  gint32 n_valid;      /* valid tokens, 1..block_size */
  SiftPhase phase;     /* phase that stored it */
  guint32 reserved[4]; /* zero */
} SiftBlockMeta;

/* What a policy method sees of the current call, filled by the host. A
 * later minor appends fields: one is there when struct_size reaches past
 * it (SIFT_STRUCT_HAS). */
typedef struct {
  guint32 struct_size;         /* sizeof (SiftPolicyContext) as the host was built */
  SiftPhase phase;
  gint32 layer;
  gint32 block_size;
  gint64 chunk_index;          /* prefill: chunk number; decode: step number */
  gint64 n_chunks;             /* prefill: chunks in the prompt; decode: 0 */
  gint64 kv_len;               /* tokens in stored blocks before this call */
  gint64 q_pos;                /* position of query row 0 */
  gint32 n_q;                  /* query rows: the chunk's tokens, or 1..16 decode rows (causal among themselves) */
  SiftView q;                  /* f32 [n_q_heads][n_q][head_dim] */
  const SiftModelShape *shape;
  const SiftBlockMeta *blocks; /* [n_blocks], indexed by logical block id */
  gint64 n_blocks;
  SiftEngine *engine;          /* reach KV only through <sift/engine-calls.h> */
  gpointer reserved[4];        /* zero */
} SiftPolicyContext;

/* A block as it is offloaded, seen by on_prefill_offload / on_decode_offload
 * before it is stored. Rows at or past meta->n_valid are undefined. Filled
 * by the host; grows like SiftPolicyContext. */
typedef struct {
  guint32 struct_size;         /* sizeof (SiftBlockInfo) as the host was built */
  gint64 block_id;
  const SiftBlockMeta *meta;
  SiftView k;                  /* [n_kv_heads][block_size][head_dim], compute dtype */
  SiftView v;
  gpointer reserved[4];        /* zero */
} SiftBlockInfo;

/* Whether a host-filled struct (SiftPolicyContext, SiftBlockInfo,
 * SiftEvictCandidates) that `p`
 * points to has `member`, a field a later minor appended. */
#define SIFT_STRUCT_HAS(p, type, member)                                       \
  ((p)->struct_size >= G_STRUCT_OFFSET (type, member) + G_SIZEOF_MEMBER (type, member))

/* The stored tokens a KV eviction may remove, seen by
 * score_eviction. Tokens protected by the engine (the first sink tokens and
 * the recent window) are not among them: they are never evicted. Filled by
 * the host; grows like SiftPolicyContext. */
typedef struct {
  guint32 struct_size;         /* sizeof (SiftEvictCandidates) as the host was built */
  gsize n;                     /* candidates */
  const gint64 *positions;     /* [n] token positions, ascending */
  const gint64 *block_ids;     /* [n] logical block holding each */
  /* [n_kv_heads][n] H2O accumulated attention: the softmax probability each
   * token received, summed over every query row and query head of its kv
   * group since it was written. NULL unless the policy sets
   * SIFT_POLICY_WANTS_ACCUMULATED_ATTENTION. */
  const float *accumulated;
  gint64 n_evict;              /* tokens the engine must remove (block granularity: at least) */
  SiftEvictGranularity granularity;
  gpointer reserved[4];        /* zero */
} SiftEvictCandidates;

/* The base of every policy instance: a plugin's instance struct starts with
 * a SiftPolicy (`struct { SiftPolicy parent; ... }`). The host allocates
 * ops->instance_size zeroed bytes and fills these fields before init; the
 * reserved words let a later minor add base fields without moving the
 * plugin's own. */
struct _SiftPolicy {
  const SiftPolicyOps *ops;
  const SiftModelShape *shape;
  gpointer host_data;          /* the host's; do not touch */
  gpointer reserved[4];        /* the host's; zero */
};

struct _SiftPolicyOps {
  /* Fixed forever: the host reads these before anything else. */
  guint32 abi_major;
  guint32 abi_minor;
  guint32 struct_size;         /* sizeof (SiftPolicyOps) the plugin was built with */

  const char *name;            /* unique, [a-z0-9_-]+ */
  const char *version;
  const char *description;     /* one line */
  guint32 flags;               /* SiftPolicyFlags */
  const SiftParamSpec *params; /* NULL-terminated table, or NULL for none */
  gsize instance_size;         /* >= sizeof (SiftPolicy) */

  /* Optional. Called once the cache shape is known; params holds every
   * declared parameter (defaults filled in). */
  gboolean (*init) (SiftPolicy *self, const SiftParams *params, GError **error);
  /* Optional. Frees what init allocated (not the instance itself). */
  void (*finalize) (SiftPolicy *self);
  /* Optional. A new sequence starts: clear every piece of per-sequence state. */
  void (*reset) (SiftPolicy *self);

  /* Required with REQUIRES_BLOCK_SELECTION. `available` holds the logical
   * ids of the layer's stored blocks, ascending; add a subset of them to
   * `selected` (all heads, or per head). The engine validates the answer. */
  gboolean (*select_blocks) (SiftPolicy *self, const SiftPolicyContext *ctx,
                             const gint64 *available, gsize n_available,
                             SiftSelection *selected, GError **error);

  /* Optional: NULL runs the engine's default pipeline (selected blocks
   * through the ring buffer, then the local buffer, merged by LSE). A policy
   * that computes attention its own way writes out (f32
   * [n_q_heads][n_q][head_dim]) and lse ([n_q_heads][n_q]) for the call's
   * query rows over every key it chooses to attend. */
  gboolean (*compute_chunked_prefill) (SiftPolicy *self, const SiftPolicyContext *ctx,
                                       SiftView *out, float *lse, GError **error);
  gboolean (*compute_chunked_decode) (SiftPolicy *self, const SiftPolicyContext *ctx,
                                      SiftView *out, float *lse, GError **error);

  /* Optional: see a block's keys and values just before they are stored. */
  gboolean (*on_prefill_offload) (SiftPolicy *self, const SiftPolicyContext *ctx,
                                  const SiftBlockInfo *block, GError **error);
  gboolean (*on_decode_offload) (SiftPolicy *self, const SiftPolicyContext *ctx,
                                 const SiftBlockInfo *block, GError **error);

  /* Optional. When a layer's stored KV passes kv.capacity_tokens
   * the engine asks the layer's policy (of the current phase) to score the
   * candidates: write scores[i] for candidates->positions[i]; the lowest go
   * first (block granularity: the lowest block sums). NULL: the oldest go
   * first (sinks + window). After token eviction the engine compacts the
   * rewritten blocks and calls on_*_offload again for each (docs/eviction.md). */
  gboolean (*score_eviction) (SiftPolicy *self, const SiftPolicyContext *ctx,
                              const SiftEvictCandidates *candidates, float *scores, GError **error);

  /* Methods added in later minors of ABI 2 go below, each marked "since N". */
};

/* Whether the host may call an optional method of `ops` added in minor
 * `since` (1 or later): the plugin's minor and struct_size cover it and it
 * is set. The methods of 2.0 are in every table the loader accepts: test
 * them against NULL. */
#define SIFT_POLICY_OPS_HAS(ops, member, since)                                 \
  ((ops)->abi_minor >= (since)                                                 \
   && (ops)->struct_size >= G_STRUCT_OFFSET (SiftPolicyOps, member) + sizeof (gpointer) \
   && (ops)->member != NULL)

/* Fills the three version fields: `{ SIFT_POLICY_OPS_HEADER, .name = ... }`. */
#define SIFT_POLICY_OPS_HEADER                                                 \
  .abi_major = SIFT_POLICY_ABI_MAJOR, .abi_minor = SIFT_POLICY_ABI_MINOR,      \
  .struct_size = sizeof (SiftPolicyOps)

/* The exported entry point: returns a NULL-terminated list of ops tables. */
#define SIFT_PLUGIN_ENTRY_SYMBOL "sift_plugin_policies"
typedef const SiftPolicyOps *const *(*SiftPluginEntryFunc) (void);

/* Declares, then defines, the entry symbol, so the compiler checks its
 * prototype: SIFT_PLUGIN_DEFINE (&quest_ops) or SIFT_PLUGIN_DEFINE (&a, &b). */
#define SIFT_PLUGIN_DEFINE(...)                                                \
  G_MODULE_EXPORT const SiftPolicyOps *const *sift_plugin_policies (void);     \
  G_MODULE_EXPORT const SiftPolicyOps *const *sift_plugin_policies (void)      \
  {                                                                            \
    static const SiftPolicyOps *const list[] = { __VA_ARGS__, NULL };          \
    return list;                                                               \
  }

/* Selections. A policy adds block ids for every head, for one query head,
 * or for one kv head (its group's query heads). The engine loads a block if
 * any head selected it and attends it only for the heads that did. After
 * select_blocks returns the engine checks every id is in `available` and
 * that no (block, head) pair was added twice; a bad answer is a
 * SIFT_ENGINE_ERROR_SELECTION naming the policy. */
SIFT_API void sift_selection_add (SiftSelection *sel, gint64 block_id);
SIFT_API void sift_selection_add_q_head (SiftSelection *sel, gint64 block_id, gint32 q_head);
SIFT_API void sift_selection_add_kv_head (SiftSelection *sel, gint64 block_id, gint32 kv_head);

/* Read side (for the host, tests and policies that inspect a validated
 * selection): distinct blocks in ascending id order, and per-head membership. */
SIFT_API gsize sift_selection_n_blocks (const SiftSelection *sel);
SIFT_API gint64 sift_selection_block (const SiftSelection *sel, gsize i);
SIFT_API gboolean sift_selection_has (const SiftSelection *sel, gint64 block_id, gint32 q_head);

/* Host side. */
SIFT_API SiftSelection *sift_selection_new (gint32 n_q_heads, gint32 n_kv_heads);
SIFT_API void sift_selection_free (SiftSelection *sel);
SIFT_API void sift_selection_clear (SiftSelection *sel);
/* Validates what was added against `available` (ascending ids) and
 * compacts it into the read-side form. */
SIFT_API gboolean sift_selection_validate (SiftSelection *sel, const gint64 *available, gsize n_available,
                                           const char *policy_name, GError **error);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftSelection, sift_selection_free)

/* Instances (host side): allocate, fill the base, init; the plugin's own
 * error message is kept (SIFT_PLUGIN_ERROR_INIT). */
SIFT_API SiftPolicy *sift_policy_new (const SiftPolicyOps *ops, const SiftParams *params,
                                      const SiftModelShape *shape, GError **error);
SIFT_API void sift_policy_free (SiftPolicy *policy);
SIFT_API void sift_policy_reset (SiftPolicy *policy);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftPolicy, sift_policy_free)

/* Checks an ops table the way the loader does (versions, struct_size,
 * name, required methods for the declared flags, parameter table and its
 * defaults); `file` names it in the error. */
SIFT_API gboolean sift_policy_ops_check (const SiftPolicyOps *ops, const char *file, GError **error);

G_END_DECLS
