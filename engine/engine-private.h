/* The OffloadEngine's internals shared by engine.c (buffers, block table,
 * copy worker), pipeline.c (the default pipelines) and runner.c. */
#pragma once

#include <pthread.h>

#include <sift/engine.h>
#include <sift/store.h>

#include "store-private.h"

typedef enum {
  SLOT_FREE = 0,   /* never loaded, or marked done */
  SLOT_LOADING,    /* a load is queued or running */
  SLOT_READY,      /* loaded; compute may read it */
  SLOT_FAILED,     /* the load failed; wait_slot reports it */
} SlotState;

typedef struct {
  SlotState state;
  gint32 n_valid;
  gint32 layer;
  GError *error;
} Slot;

/* One half of the cross-layer double buffer: a layer's selected blocks
 * side by side on the token axis. */
typedef struct {
  guint8 *k, *v;       /* [n_kv_heads][cap_blocks * block_size][head_dim], compute dtype */
  gint64 cap_blocks;
  gint64 n_blocks;     /* loaded or loading */
  gint32 layer;        /* -1: unused */
  gint32 pending;      /* loads not finished */
  GError *error;       /* first failed load */
  GArray *ids;         /* gint64 logical ids, in load order (ascending) */
} XlHalf;

struct _SiftEngine {
  SiftEngineConfig config;
  SiftStore *store;
  gsize es;                   /* bytes of one compute element */
  gint64 block_elems;         /* n_kv_heads * block_size * head_dim */
  gint32 decode_cap;          /* decode buffer tokens: block_size + SIFT_ATTN_DECODE_MAX_ROWS */

  /* Block table. Logical block i covers the same tokens in every layer. */
  GArray *meta;               /* SiftBlockMeta [logical blocks of the furthest layer] */
  GArray **store_ids;         /* [n_layers] -> gint64 [stored blocks of that layer] */
  gint64 *stored_tokens;      /* [n_layers] tokens in that layer's stored blocks */

  /* Compute-side buffers, compute dtype. */
  guint8 *slots_mem;          /* [n_slots][2 (K, V)][n_kv_heads][block_size][head_dim] */
  Slot *slots;                /* [n_slots] */
  guint8 **prefill_k, **prefill_v; /* [n_layers] -> [n_kv_heads][chunk_size][head_dim] */
  gint64 *prefill_pos;        /* [n_layers] position of the buffer's token 0 */
  gint32 *prefill_len;        /* [n_layers] tokens in the buffer */
  guint8 **decode_k, **decode_v;   /* [n_layers] -> [n_kv_heads][decode_cap][head_dim] */
  gint32 *decode_start;       /* [n_layers] first valid token in the decode buffer */
  gint32 *decode_len;         /* [n_layers] valid tokens from decode_start */
  XlHalf xl[2];
  gboolean xl_active;

  /* Copy worker. */
  GThread *worker;
  pthread_mutex_t lock;                /* guards everything the worker touches below, slots and xl states */
  pthread_cond_t work_cond;   /* the worker waits here for jobs (signalled only when it is idle) */
  pthread_cond_t done_cond;   /* the compute side waits here for finished jobs */
  gboolean worker_idle;
  gint32 hold_wake;           /* > 0: queue without waking the worker (a batch follows) */
  gint32 done_waiters;
  GQueue jobs;                /* Job * */
  gint32 running;             /* jobs popped and not finished (worker and helping compute thread) */
  gint32 running_stores;      /* of those, stores */
  gboolean quit;
  gint32 *stores_pending;     /* [n_layers] store jobs reading that layer's buffers */
  GError *store_error;        /* first failed store: sticky until reset */
  guint8 *staging;            /* worker only: one stored block, 4 KiB aligned */
  guint8 *help_staging;       /* the compute thread's, when it runs a load itself */

  /* Counters [n_layers][2 phases], guarded by lock. */
  SiftCounters *counters;

  /* The call in progress (set by the runner or attend_default). */
  SiftPhase phase;            /* loads are counted under it */
  const char *policy_name;    /* named in selection errors */

  /* Scratch for partial attention results. */
  float *part_out;            /* [n_q_heads][max_q][head_dim] */
  float *part_lse;            /* [n_q_heads][max_q] */
  gint64 max_q;
};

SiftCounters *sift_engine_counters_at (SiftEngine *engine, gint32 layer, SiftPhase phase);
/* Adds to a counter under the engine lock. */
void sift_engine_count (SiftEngine *engine, gint32 layer, SiftPhase phase, const SiftCounters *add);

/* Batches loads: while held, queued jobs do not wake the worker; the last
 * release wakes it once. Waiting on a slot wakes it too. */
void sift_engine_hold_wake (SiftEngine *engine, gboolean hold);

/* Whether a slot is loaded (no wait); n_valid_out gets its valid tokens. */
gboolean sift_engine_slot_ready (SiftEngine *engine, gint32 slot, gint32 *n_valid_out);
/* Views of a slot's first n_tokens tokens (<= block_size). */
void sift_engine_slots_kv (SiftEngine *engine, gint32 slot, gint64 n_tokens, SiftView *k, SiftView *v);

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
/* Offloads one full block of the decode buffer if it holds block_size tokens. */
gboolean sift_engine_offload_decode (SiftEngine *engine, const SiftPolicyContext *ctx,
                                     const SiftLayerPolicies *policies, GError **error);
/* Waits for every queued store; reports the first failed one. */
gboolean sift_engine_sync (SiftEngine *engine, GError **error);
/* Fills the block table part of a context for `layer`. */
void sift_engine_fill_context (SiftEngine *engine, SiftPolicyContext *ctx, gint32 layer);
/* Counts a call: blocks available/selected and tokens available. */
void sift_engine_count_call (SiftEngine *engine, const SiftPolicyContext *ctx, gsize n_available,
                             gsize n_selected);
/* Attention over the blocks a cross-layer pipeline_get returned (k, v:
 * n_blocks blocks of `sel`, or of every stored block) plus the local
 * tokens, merged by LSE. */
gboolean sift_engine_attend_loaded (SiftEngine *engine, const SiftPolicyContext *ctx,
                                    const SiftSelection *sel, const SiftView *k, const SiftView *v,
                                    gsize n_blocks, SiftView *out, float *lse, GError **error);
