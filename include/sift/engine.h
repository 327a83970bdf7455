/* sift — the OffloadEngine: compute-side buffers, the copy worker, pipelines.
 *
 * One engine serves one sequence; several engines may share a SiftStore.
 * Compute-side buffers (all in the compute dtype, block layout
 * [n_kv_heads][block_size][head_dim] per K and per V):
 *   - n_slots ring slots of one block each (n_slots >= 2);
 *   - a prefill buffer per layer holding the current chunk;
 *   - a decode buffer per layer of block_size tokens;
 *   - a double buffer for the cross-layer decode pipeline.
 * A copy worker thread performs loads (store -> slot, converting dtype) and
 * stores asynchronously; slot events say "ready" and "compute done".
 * The first section is what a policy may call; the rest is the host's. */
#pragma once

#include <glib.h>
#include <sift/error.h>
#include <sift/policy.h>
#include <sift/store.h>
#include <sift/view.h>

G_BEGIN_DECLS

/* ---- Calls for policies ------------------------------------------------ */

typedef enum {
  SIFT_LOAD_K = 1,
  SIFT_LOAD_V = 2,
  SIFT_LOAD_KV = 3,
} SiftLoadWhat;

gint32 sift_engine_n_slots (SiftEngine *engine);
/* Queues a load of a stored block of `layer` into `slot` (asynchronous).
 * The slot must be free (never loaded, or marked done). */
gboolean sift_engine_load_block (SiftEngine *engine, gint32 layer, gint64 block_id, gint32 slot,
                                 SiftLoadWhat what, GError **error);
/* Waits until the slot's load finished; reports the load's error if it failed. */
gboolean sift_engine_wait_slot (SiftEngine *engine, gint32 slot, GError **error);
/* Views of a loaded slot: [n_kv_heads][n_valid][head_dim], the block's valid
 * tokens (strided: use the view's strides); n_valid_out (may be NULL) gets
 * n_valid. Only after wait_slot succeeded. After a K-only load, v is undefined. */
void sift_engine_slot_kv (SiftEngine *engine, gint32 slot, SiftView *k, SiftView *v, gint32 *n_valid_out);
/* Compute on the slot is finished: it may be loaded again. */
void sift_engine_slot_done (SiftEngine *engine, gint32 slot);

/* The tokens not yet stored that this call may attend: prefill, the current
 * chunk [q_pos, q_pos + n_q); decode, the decode buffer [kv_len, q_pos + n_q)
 * (the call's own rows included). Views [n_kv_heads][tokens][head_dim]. */
void sift_engine_local_kv (SiftEngine *engine, const SiftPolicyContext *ctx, SiftView *k, SiftView *v);

/* Gathers K and V rows at absolute token positions of `layer` (stored or
 * local, any order) into f32 [n_kv_heads][n][head_dim] views the caller
 * owns; bytes read from the store count as loaded. */
gboolean sift_engine_gather_rows (SiftEngine *engine, gint32 layer, const gint64 *positions, gsize n,
                                  SiftView *k_out, SiftView *v_out, GError **error);

/* Since eviction compacts blocks, a stored block's tokens need not be
 * consecutive: the positions of its n_valid rows, ascending (the engine's
 * memory, valid until the layer's next offload). NULL for a bad id. */
const gint64 *sift_engine_block_positions (SiftEngine *engine, gint32 layer, gint64 block_id);

/* The default pipeline over `selection` (NULL: every stored block), then
 * the local tokens, merged by LSE; what a NULL compute_chunked_* runs. A
 * policy that only wants to alter the selection can call it. */
gboolean sift_engine_attend_default (SiftEngine *engine, const SiftPolicyContext *ctx,
                                     const SiftSelection *selection, SiftView *out, float *lse,
                                     GError **error);

/* A policy that computes attention its own way reports the KV tokens it
 * attended (summed over query rows and query heads) for the density
 * counters; sift_engine_attend_default counts its own. */
void sift_engine_count_attended (SiftEngine *engine, const SiftPolicyContext *ctx, guint64 tokens);
/* Such a policy that also attends summaries of many tokens (landmarks,
 * block means) reports those rows here, apart from the density. */
void sift_engine_count_summaries (SiftEngine *engine, const SiftPolicyContext *ctx, guint64 rows);

/* Cross-layer decode pipeline: start loads layer 0's selected blocks into
 * one half of the double buffer; get returns layer `layer`'s blocks (waiting
 * if needed) and starts loading layer + 1's into the other half; end drains. */
gboolean sift_engine_pipeline_start (SiftEngine *engine, const SiftSelection *layer0_selection,
                                     GError **error);
gboolean sift_engine_pipeline_get (SiftEngine *engine, gint32 layer, const SiftSelection *next_selection,
                                   SiftView *k, SiftView *v, gsize *n_blocks_out, GError **error);
void sift_engine_pipeline_end (SiftEngine *engine);

/* ---- Host side ---------------------------------------------------------- */

typedef enum {
  SIFT_PIPELINE_RING = 0,        /* ring slots per layer */
  SIFT_PIPELINE_CROSS_LAYER = 1, /* decode: load layer l+1 while layer l computes */
} SiftPipeline;

typedef struct {
  SiftModelShape shape;
  SiftDType compute_dtype;  /* slots and buffers: f32, f16 or bf16 */
  gint32 n_slots;           /* >= 2 */
  SiftPipeline pipeline;
  gint64 max_tokens;        /* block table capacity per sequence; 0 = unbounded */
} SiftEngineConfig;

SiftEngine *sift_engine_new (const SiftEngineConfig *config, SiftStore *store, GError **error);
void sift_engine_free (SiftEngine *engine);
/* New sequence: every buffer, the block table (its blocks released to the
 * store) and the counters cleared. Policies are reset by the runner. */
void sift_engine_reset (SiftEngine *engine);
const SiftEngineConfig *sift_engine_config (const SiftEngine *engine);
/* Zero-copy slots (docs/engine.md): when the store keeps blocks in memory
 * in the compute dtype (host store, stored dtype == compute dtype), a ring
 * load maps the slot onto the stored bytes instead of copying them, and the
 * default pipeline reads the blocks in place. force_copy = TRUE (offload
 * copy: always) copies every load through the copy worker anyway; call it
 * between attention calls. Whether loads map now: */
void sift_engine_set_force_copy (SiftEngine *engine, gboolean force_copy);
gboolean sift_engine_maps (const SiftEngine *engine);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftEngine, sift_engine_free)

/* Bounded KV (docs/eviction.md): each layer keeps at most capacity_tokens
 * stored tokens, evicting after an offload that passes it. */
typedef struct {
  gint64 capacity_tokens;   /* 0 = unbounded (no eviction) */
  SiftEvictGranularity granularity;
  gint64 protect_sinks;     /* the first tokens: never evicted */
  gint64 protect_recent;    /* the most recent tokens (the call's rows counted): never evicted */
} SiftEvictConfig;

/* Sets eviction before a sequence starts (after new or reset);
 * SIFT_ENGINE_ERROR_INVALID when the capacity cannot hold the protected
 * tokens (see docs/eviction.md for the bound). */
gboolean sift_engine_set_eviction (SiftEngine *engine, const SiftEvictConfig *config, GError **error);

/* Keeps H2O accumulated attention for `layer` (the runner turns it on for
 * layers whose policy sets SIFT_POLICY_WANTS_ACCUMULATED_ATTENTION). */
void sift_engine_track_attention (SiftEngine *engine, gint32 layer, gboolean on);
/* The positions of `layer`'s stored tokens, ascending, into out (NULL: only
 * count them); returns how many. */
gsize sift_engine_stored_positions (SiftEngine *engine, gint32 layer, gint64 *out);
/* The accumulated attention of a stored token (summed over kv heads), or
 * -1 when the layer does not track it or the token is not stored. */
double sift_engine_accumulated_attention (SiftEngine *engine, gint32 layer, gint64 position);

/* Counters since the last reset. */
typedef struct {
  guint64 bytes_loaded;       /* store -> compute side: bytes the compute side got from the store, copied or mapped */
  guint64 bytes_stored;       /* compute side -> store */
  guint64 blocks_available;   /* summed over select calls */
  guint64 blocks_selected;
  guint64 tokens_available;   /* KV tokens that could be attended, summed over rows and heads */
  guint64 tokens_attended;    /* KV tokens actually attended, summed over rows and heads */
  gdouble seconds_stalled;    /* compute thread waiting for loads */
  gdouble seconds_compute;    /* in attention kernels */
  gdouble seconds_load;       /* copy worker busy loading */
  guint64 tokens_evicted;     /* stored tokens removed to stay within capacity_tokens */
  guint64 bytes_compacted;    /* bytes read and rewritten by compaction and re-offload hooks (also in loaded/stored) */
  guint64 bytes_mapped;       /* of bytes_loaded, those read in place through zero-copy slots (not copied) */
  guint64 summaries_attended; /* summary rows attended (landmarks, block means), summed over rows and heads;
                               * not KV tokens of the sequence, so not in tokens_attended */
} SiftCounters;

/* Per layer and phase (layer = -1: totals over layers). */
void sift_engine_counters (const SiftEngine *engine, gint32 layer, SiftPhase phase, SiftCounters *out);

G_END_DECLS
