/* The OffloadEngine's internals, shared by its files and the runner. The
 * files call each other one way only (docs/engine.md, "Files"): engine.c
 * (construction, reset) calls every part; attend.c (the default attention)
 * and evict.c call block-table.c and ring.c; everything calls counters.c.
 * Transfers, events, compute memory and kernels go through the backend's
 * method table (backend.h); only engine.c names a backend. */
#pragma once

#include <pthread.h>

#include <sift/engine.h>
#include <sift/store.h>

#include <sift/error.h>

#include "backend.h"
#include "store-private.h"

/* Sets a SIFT_ENGINE_ERROR_INVALID error "engine: <message>" and is FALSE.
 * fmt must be a string literal. */
#define sift_engine_invalid(error, ...) \
  (g_set_error ((error), SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID, "engine: " __VA_ARGS__), FALSE)

/* A ring slot: free, or given a block (busy) that is loading, ready or
 * failed as its event says (a mapped slot is ready at once, or failed with
 * `error`). Compute thread only. */
typedef struct {
  gboolean busy;
  SiftEvent *event;    /* the slot's loads */
  gint32 n_valid;
  gint32 layer;
  GError *error;       /* a mapping that failed (the store failed before) */
  /* A zero-copy slot (ready without a copy): K and V in the store's own
   * memory, each [n_kv_heads][block_size][head_dim] compute dtype, and the
   * store id they belong to; NULL / -1 when the slot's memory holds the data.
   * Compute thread only. */
  const guint8 *map_k, *map_v;
  gint64 map_id;
  /* Loaded ahead for the next call (ring.c, "Prefetch across calls"):
   * logical block ahead_block of `layer`, store id ahead_id, every kv head,
   * K and V; the next ring_load asking for it takes the load as it is. */
  gboolean ahead;
  gint64 ahead_block, ahead_id;
} Slot;

/* One half of the cross-layer double buffer: a layer's selected blocks
 * side by side on the token axis. */
typedef struct {
  SiftBuffer k, v;     /* [n_kv_heads][cap_blocks * block_size][head_dim], compute dtype */
  gint64 cap_blocks;
  gint64 n_blocks;     /* loaded or loading */
  gint32 layer;        /* -1: unused */
  SiftEvent *event;    /* the half's loads */
  GArray *ids;         /* gint64 logical ids, in load order (ascending) */
} XlHalf;

typedef struct _SiftBatch SiftBatch;

struct _SiftEngine {
  SiftEngineConfig config;
  SiftStore *store;
  gsize es;                   /* bytes of one compute element */
  gboolean maps;              /* ring loads map slots onto the store (zero-copy) */
  gint32 ring_group;          /* blocks per ring group; 0: chosen per call (sift_engine_ring_group) */
  guint64 n_packed;           /* calls whose selection went through the slots packed by kv head (attend.c), for tests */
  guint64 n_ahead_taken;      /* slots a ring_load took as loaded ahead (ring.c), for tests */
  gint64 block_elems;         /* n_kv_heads * block_size * head_dim */
  gint32 decode_cap;          /* decode buffer tokens: block_size + SIFT_ATTN_DECODE_MAX_ROWS */

  /* Block table. Without eviction logical block i covers the same tokens
   * in every layer; with it each layer keeps its own tokens. */
  GArray **meta;              /* [n_layers] -> SiftBlockMeta [stored blocks of that layer] */
  GArray **store_ids;         /* [n_layers] -> gint64 [stored blocks of that layer] */
  gint64 *stored_tokens;      /* [n_layers] position after that layer's stored blocks (evicted ones included) */

  GArray **rows_pos;          /* [n_layers] -> gint64 [stored blocks][block_size]: each stored row's position (-1: none) */
  gint64 *kept_tokens;        /* [n_layers] valid tokens in stored blocks */

  /* Eviction and H2O accumulated attention (evict.c, docs/eviction.md). */
  SiftEvictConfig evict;
  gboolean *track;            /* [n_layers] keep accumulated attention */
  GArray **acc;               /* [n_layers] -> float [stored blocks][block_size][n_kv_heads] */
  float **acc_local;          /* [n_layers] -> [acc_local_cap][n_kv_heads], tokens from stored_tokens on */
  gint64 acc_local_cap;

  /* Compute-side buffers, compute dtype, from the backend. The engine
   * reaches them through the backend only (backend.h: buffer_write,
   * buffer_move, buffer_clear, buffer_read, transfers, kernels); views of
   * them carry the backend's memory space. */
  gboolean host_compute;      /* compute memory is host memory (the CPU backend) */
  guint8 *slots_mem;          /* [n_slots][2 (K, V)][n_kv_heads][block_size][head_dim] */
  Slot *slots;                /* [n_slots] */
  /* Prefetch across calls (ring.c): on (a GPU backend, unless
   * SIFT_ENGINE_NO_PREFETCH=1), and per layer whether its last decode call
   * streamed every stored block through the ring without a selection. */
  gboolean prefetch;
  gboolean *ring_all;         /* [n_layers] */
  /* Prefill buffers: n_prefill_pairs pairs shared by the layers, layer l
   * using pair l % n_prefill_pairs (a layer's chunk is offloaded before the
   * next layer's arrives; put_prefill waits for the previous user's stores). */
  guint8 **prefill_k, **prefill_v; /* [n_layers] -> [n_kv_heads][chunk_size][head_dim], aliases of the pairs */
  gint32 n_prefill_pairs;
  gint32 *prefill_owner;      /* [n_prefill_pairs] the layer whose rows the pair holds (-1: none) */
  gint64 *prefill_pos;        /* [n_layers] position of the buffer's token 0 */
  gint32 *prefill_len;        /* [n_layers] tokens in the buffer (0 once another layer took it) */
  guint8 **decode_k, **decode_v;   /* [n_layers] -> [n_kv_heads][decode_cap][head_dim] */
  /* Host images of the prefill and decode buffers, same layout: what the
   * engine reads on the host (offload hooks, H2O accumulation, gathered
   * rows) and writes first (rows are converted here, then written through
   * the backend). The buffers themselves when host_compute, else the
   * backend's host memory kept equal to them. */
  guint8 **prefill_hk, **prefill_hv, **decode_hk, **decode_hv;
  GPtrArray *images;          /* the host images that are not the buffers, freed with the engine */
  GArray *image_sizes;        /* gsize, their sizes */
  /* A call's q, output and LSE in compute memory when it is not host
   * memory ([n_q_heads][max_q][head_dim] f32, [n_q_heads][max_q]); NULL
   * when host_compute. */
  float *call_q, *call_out, *call_lse;
  guint8 *q_gather;           /* host scratch where a call's q is gathered before it goes up (attend.c q_up) */
  gint32 *decode_start;       /* [n_layers] first valid token in the decode buffer */
  gint32 *decode_len;         /* [n_layers] valid tokens from decode_start */
  XlHalf xl[2];
  gboolean xl_active;

  /* Resident KV (resident.c; sift_engine_set_resident): compute memory
   * holding a copy of every block this engine stored, by store id. */
  gboolean resident;
  GArray *res_chunks;         /* SiftBuffer [chunks] of res_chunk_blocks blocks: K then V [n_kv_heads][block_size][head_dim] each */
  gint64 res_chunk_blocks;
  SiftEvent *res_event;       /* loads of blocks eviction rewrote in the store */

  /* The compute side (backend.h): transfers, events, memory, kernels. */
  SiftBackend *backend;
  GArray *buffers;            /* SiftBuffer: every buffer above, freed with the engine */
  SiftEvent **store_events;   /* [n_layers] the stores reading that layer's buffers */

  pthread_mutex_t lock;       /* guards the counters and store_error (the backend's sink runs on its threads) */
  GError *store_error;        /* first failed store: sticky until reset */

  /* Counters [n_layers][2 phases], guarded by lock. */
  SiftCounters *counters;

  /* The call in progress (set by the runner or attend_default). */
  SiftPhase phase;            /* loads are counted under it */
  const char *policy_name;    /* named in selection errors */

  SiftBatch *batch;           /* attend.c: the blocks of one kernel call, reused */

  /* Scratch for partial attention results. */
  float *part_out;            /* [n_q_heads][max_q][head_dim] */
  float *part_lse;            /* [n_q_heads][max_q] */
  gint64 max_q;
};

static inline gboolean
sift_engine_check_layer (SiftEngine *e, gint32 layer, GError **error)
{
  if (layer >= 0 && layer < e->config.shape.n_layers)
    return TRUE;
  return sift_engine_invalid (error, "layer %d is outside the model's %d layers", layer, e->config.shape.n_layers);
}

/* ---- Counters (counters.c) ------------------------------------------------ */

SiftCounters *sift_engine_counters_at (SiftEngine *engine, gint32 layer, SiftPhase phase);
/* Adds to a counter under the engine lock. */
void sift_engine_count (SiftEngine *engine, gint32 layer, SiftPhase phase, const SiftCounters *add);
/* Counts a call: blocks available/selected and tokens available. */
void sift_engine_count_call (SiftEngine *engine, const SiftPolicyContext *ctx, gsize n_available,
                             gsize n_selected);

/* The backend's sink: a finished transfer's bytes and seconds, a failed
 * store's error (store_error). Any thread. */
void sift_engine_transfer_done (gpointer engine, const SiftTransfer *t, gboolean ok, guint64 bytes,
                                gdouble seconds, const GError *error);

/* ---- The ring (ring.c) --------------------------------------------------- */

/* The slots' events (their memory, slots_mem, is engine.c's). */
void sift_engine_ring_init (SiftEngine *engine);
/* Every slot free, unmapped and zeroed (no transfer running). */
void sift_engine_ring_clear (SiftEngine *engine);
void sift_engine_ring_free (SiftEngine *engine);

/* Before this engine writes or releases store block `store_id`: a slot
 * mapped onto it gets a copy of the bytes, so it stays valid until
 * slot_done. */
void sift_engine_unmap_id (SiftEngine *engine, gint64 store_id);

/* Blocks the ring attends per call for a call of n_q query rows. When the
 * kernels run a block's attention on the calling thread anyway, as few as
 * keep a call's fixed cost small (1 for a block of 2^18 work or more): the
 * copy worker then runs up to n_slots - 1 blocks ahead and a late load
 * stalls less; at most n_slots / 2. Otherwise n_slots / 2 (fewer calls,
 * each waking the kernels' threads once).
 * sift_engine_set_ring_group fixes it instead (0: back to the choice). */
gint32 sift_engine_ring_group (const SiftEngine *e, gint32 n_q);
void sift_engine_set_ring_group (SiftEngine *e, gint32 blocks);

/* The default ring's group calls: load_block, wait_slot and slot_done for
 * n slots in one backend call each (copies only). ring_wait stops at the first
 * failed load: *n_ready slots before it are ready, that one is free again
 * and the error is its load's. kv_heads (NULL: every head of every block):
 * per block the kv heads to load (SiftTransfer.kv_heads). A slot may come
 * several times in one ring_load, each time with other kv heads (the
 * packed per-kv-head path of attend.c); ring_wait takes each slot once. */
gboolean sift_engine_ring_load (SiftEngine *engine, gint32 layer, const gint64 *block_ids, const guint64 *kv_heads,
                                const gint32 *slots, gint32 n, GError **error);
gboolean sift_engine_ring_wait (SiftEngine *engine, const gint32 *slots, gint32 n, gint32 *n_valid,
                                gint32 *n_ready, GError **error);
void sift_engine_ring_done (SiftEngine *engine, const gint32 *slots, gint32 n);

/* Prefetch across calls (GPU): loads logical block j of `layer` into slot j
 * for each free slot j of slots[0..n) that the layer has a block for, where
 * the next call's ring stream puts its block j, and marks them ahead;
 * ring_load takes such a load as it is when asked for that block, and frees
 * the slot first when asked for another. */
void sift_engine_ring_prefetch (SiftEngine *engine, gint32 layer, const gint32 *slots, gint32 n);
/* Frees every slot loaded ahead, after its copy finished (before the
 * store's memory of those blocks may change: eviction). */
void sift_engine_ring_drop_ahead (SiftEngine *engine);

/* Whether a slot is loaded (no wait); n_valid_out gets its valid tokens. */
gboolean sift_engine_slot_ready (SiftEngine *engine, gint32 slot, gint32 *n_valid_out);
/* Views of the local tokens (sift_engine_local_kv) in the host image. */
void sift_engine_local_kv_host (SiftEngine *engine, const SiftPolicyContext *ctx, SiftView *k, SiftView *v);
/* Views of a slot's first n_tokens tokens (<= block_size). */
void sift_engine_slots_kv (SiftEngine *engine, gint32 slot, gint64 n_tokens, SiftView *k, SiftView *v);

/* ---- Resident KV (resident.c) ---------------------------------------------- */

void sift_engine_resident_init (SiftEngine *engine);
/* Zeroes the resident blocks (a new sequence). */
void sift_engine_resident_clear (SiftEngine *engine);
void sift_engine_resident_free (SiftEngine *engine);
/* Copies a block being stored as `store_id` from compute memory (k, v:
 * [n_kv_heads][cap][head_dim] in a prefill or decode buffer) into its
 * resident place, growing the resident memory by a chunk when needed. */
gboolean sift_engine_resident_put (SiftEngine *engine, gint64 store_id, const guint8 *k, const guint8 *v, gint64 cap,
                                   GError **error);
/* Loads store block `store_id` (rewritten in the store by eviction's
 * compaction) into its resident place; attention after this sees it. */
gboolean sift_engine_resident_reload (SiftEngine *engine, gint32 layer, gint64 store_id, GError **error);
/* The resident copy of store block `store_id`: K then V, each
 * [n_kv_heads][block_size][head_dim] compute elements (compute memory). */
guint8 *sift_engine_resident_block (SiftEngine *engine, gint64 store_id);

/* ---- Streams (stream.c) ----------------------------------------------------- */

/* The default pipeline's stream: KV loads through the group calls above
 * (copies only: for an engine that does not map); kv_heads (NULL: all) the
 * kv heads to load of each block, as sift_engine_ring_load's. */
SiftStream *sift_engine_stream_begin_ring (SiftEngine *engine, gint32 layer, const gint64 *block_ids,
                                           const guint64 *kv_heads, gsize n);
/* Once a ring stream has queued its last load, the slots it frees load
 * `layer`'s first blocks for the next call (sift_engine_ring_prefetch);
 * -1: not (the default; set it back before ending a stream that failed). */
void sift_engine_stream_prefetch (SiftStream *stream, gint32 layer);

/* ---- The cross-layer pipeline (cross-layer.c) ------------------------------ */

void sift_engine_xl_init (SiftEngine *engine);
void sift_engine_xl_clear (SiftEngine *engine);
void sift_engine_xl_free (SiftEngine *engine);

/* ---- The block table (block-table.c) -------------------------------------- */

void sift_engine_blocks_init (SiftEngine *engine);
/* Every block released to the store, every layer empty. */
void sift_engine_blocks_clear (SiftEngine *engine);
void sift_engine_blocks_free (SiftEngine *engine);
/* Waits for the stores reading `layer`'s buffers (stalled time of the
 * current phase); a failed store is not reported (store_ok does). */
void sift_engine_wait_stores (SiftEngine *engine, gint32 layer);
/* FALSE with a copy of the first failed store's error. */
gboolean sift_engine_store_ok (SiftEngine *engine, GError **error);
/* The stored block and row holding `pos`; FALSE when it is not stored. */
gboolean sift_engine_find_row (SiftEngine *engine, gint32 layer, gint64 pos, gint64 *block_out, gint32 *row_out);

/* ---- Calls for the runner ---------------------------------------------- */

/* The phase and policy of the calls that follow (counters, selection errors). */
void sift_engine_begin_call (SiftEngine *engine, SiftPhase phase, const char *policy_name);
/* Writes a prefill chunk's k and v (f32 [n][n_kv_heads][head_dim], tokens
 * pos0..pos0+n-1, pos0 = the layer's stored tokens) into the layer's
 * prefill buffer, after the layer's previous chunk was stored. */
gboolean sift_engine_put_prefill (SiftEngine *engine, gint32 layer, gint64 pos0, gint64 n,
                                  const float *k, const float *v, GError **error);
/* The policies of one layer that see its blocks before they are stored:
 * its prefill and its decode policy (either may be NULL; one instance in
 * both places is called once). A decode policy such as Quest keeps its
 * block metadata from the prompt's blocks even when another policy ran the
 * prefill. */
typedef struct {
  SiftPolicy *prefill;
  SiftPolicy *decode;
} SiftLayerPolicies;

/* Offloads the prefill buffer as blocks (the last possibly partial),
 * calling each layer policy's on_prefill_offload for each first. */
gboolean sift_engine_offload_prefill (SiftEngine *engine, const SiftPolicyContext *ctx,
                                      const SiftLayerPolicies *policies, GError **error);
/* Appends decode rows to the layer's decode buffer. */
gboolean sift_engine_put_decode (SiftEngine *engine, gint32 layer, gint64 pos0, gint64 n,
                                 const float *k, const float *v, GError **error);
/* Offloads every full block of the decode buffer (more than one after a step of more rows than block_size). */
gboolean sift_engine_offload_decode (SiftEngine *engine, const SiftPolicyContext *ctx,
                                     const SiftLayerPolicies *policies, GError **error);
/* Waits for the stores reading or writing `layer`'s blocks; reports a failed store. */
gboolean sift_engine_wait_layer (SiftEngine *engine, gint32 layer, GError **error);
/* Calls one policy's offload hook of `phase` for a block (SIFT_ENGINE_ERROR_POLICY naming it on failure). */
gboolean sift_engine_call_offload_hook (SiftPolicy *policy, SiftPhase phase, const SiftPolicyContext *ctx,
                                        const SiftBlockInfo *info, GError **error);
/* Waits for every queued store; reports the first failed one. */
gboolean sift_engine_sync (SiftEngine *engine, GError **error);
/* Fills the block table part of a context for `layer`. */
void sift_engine_fill_context (SiftEngine *engine, SiftPolicyContext *ctx, gint32 layer);
/* sift_engine_attend_default for a selection the runner has just validated
 * against the layer's blocks (not validated again). */
gboolean sift_engine_attend_validated (SiftEngine *engine, const SiftPolicyContext *ctx,
                                       const SiftSelection *selection, SiftView *out, float *lse, GError **error);
/* Attention over the blocks a cross-layer pipeline_get returned plus the
 * local tokens, merged by LSE. k, v: n_blocks blocks, those of `loaded`
 * (NULL: every stored block); sel: the blocks and heads attended (NULL:
 * all), within `loaded`. */
gboolean sift_engine_attend_loaded (SiftEngine *engine, const SiftPolicyContext *ctx,
                                    const SiftSelection *sel, const SiftSelection *loaded, const SiftView *k,
                                    const SiftView *v, gsize n_blocks, SiftView *out, float *lse,
                                    GError **error);

/* Frees the default attention's reused scratch (attend.c). */
void sift_engine_attend_free (SiftEngine *engine);

/* ---- Eviction (evict.c) -------------------------------------------------- */

/* Per-layer eviction state: allocate, clear for a new sequence, free. */
void sift_engine_evict_init (SiftEngine *engine);
void sift_engine_evict_clear (SiftEngine *engine);
void sift_engine_evict_free (SiftEngine *engine);
/* After a layer's attention: adds the call's softmax probabilities to the
 * accumulated attention of every stored and local token (if tracked). */
gboolean sift_engine_accumulate (SiftEngine *engine, const SiftPolicyContext *ctx, const float *lse,
                                 GError **error);
/* After a layer's offload: evicts down to capacity_tokens when the layer
 * holds more, scored by `scorer` (NULL or without score_eviction: oldest
 * first); compacted or renumbered blocks are offered again to the layer's
 * policies' offload hooks (prefill's and decode's, each once). */
gboolean sift_engine_evict (SiftEngine *engine, const SiftPolicyContext *ctx, SiftPolicy *scorer,
                            SiftPolicy *prefill, SiftPolicy *decode, GError **error);
