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
 * What a policy may call is in <sift/engine-calls.h>; this is the host side. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/config.h>
#include <sift/engine-calls.h>
#include <sift/error.h>
#include <sift/policy.h>
#include <sift/store.h>
#include <sift/view.h>

G_BEGIN_DECLS

typedef enum {
  SIFT_PIPELINE_RING = 0,        /* ring slots per layer */
  SIFT_PIPELINE_CROSS_LAYER = 1, /* decode: load layer l+1 while layer l computes */
} SiftPipeline;

/* Where the compute side runs (offload.device). */
typedef enum {
  SIFT_DEVICE_CPU = 0,   /* RAM buffers, the copy worker thread, the CPU kernels */
  SIFT_DEVICE_CUDA = 1,  /* GPU buffers, pinned host memory, a copy stream and CUDA events,
                          * the GPU kernels (f16 or bf16 compute, head_dim 64 or 128) */
} SiftDevice;

/* The engine's keys of the config (docs/config.md; defaults: the key table,
 * engine/config-engine.c), registered by libsift itself: kv.* beside core's
 * block and chunk sizes, and offload.*. */
typedef struct {
  SiftDType store_dtype;
  SiftDType compute_dtype;
  gint64 capacity_tokens;             /* stored tokens kept per layer, evicting beyond; 0 = unbounded */
  SiftEvictGranularity evict_granularity;
  gint64 protect_sinks;               /* first tokens never evicted */
  gint64 protect_recent;              /* most recent tokens never evicted */
} SiftKvConfig;

typedef struct {
  char *store;                        /* "host" | "file" */
  char *store_path;                   /* the file store's file; NULL: <harness.out>/kv.store */
  gboolean store_keep;
  gboolean store_direct;
  gint32 ring_slots;
  SiftPipeline pipeline;
  gboolean force_copy;                /* FALSE: ring loads from a host store in the compute dtype map (zero-copy) */
  SiftDevice device;
  gboolean resident;                  /* every stored block kept in compute memory too: attention reads it there (no ring) */
} SiftOffloadConfig;

/* The values of a config (never NULL: libsift registers both sections).
 * libsift exports functions only, no data: a program that holds two copies
 * of the library (a test linking it statically beside plugins that load the
 * shared one) has no duplicate global. */
SIFT_API const SiftKvConfig *sift_kv_config (const SiftConfig *config);
SIFT_API const SiftOffloadConfig *sift_offload_config (const SiftConfig *config);
/* The same, to change before the config is used (a copy's own budget, say). */
SIFT_API SiftKvConfig *sift_kv_config_edit (SiftConfig *config);
SIFT_API SiftOffloadConfig *sift_offload_config_edit (SiftConfig *config);
/* The smallest kv.capacity_tokens that eviction can keep to: the protected
 * sinks and recent window and the blocks one offload adds. */
SIFT_API gint64 sift_kv_config_min_capacity (const SiftKvConfig *kv, const SiftModelShape *shape);
typedef struct {
  SiftModelShape shape;
  SiftDType compute_dtype;  /* slots and buffers: f32, f16 or bf16 */
  gint32 n_slots;           /* >= 2 */
  SiftPipeline pipeline;
  gint64 max_tokens;        /* block table capacity per sequence; 0 = unbounded */
  SiftDevice device;        /* SIFT_DEVICE_CPU (0) unless set */
} SiftEngineConfig;

SIFT_API SiftEngine *sift_engine_new (const SiftEngineConfig *config, SiftStore *store, GError **error);
SIFT_API void sift_engine_free (SiftEngine *engine);
/* New sequence: every buffer, the block table (its blocks released to the
 * store) and the counters cleared. Policies are reset by the runner. */
SIFT_API void sift_engine_reset (SiftEngine *engine);
SIFT_API const SiftEngineConfig *sift_engine_config (const SiftEngine *engine);
/* "cpu" or "cuda" (offload.device's values); NULL for another value. */
SIFT_API const char *sift_device_name (SiftDevice device);
/* Zero-copy slots (docs/engine.md): when the store keeps blocks in memory
 * in the compute dtype (host store, stored dtype == compute dtype), a ring
 * load maps the slot onto the stored bytes instead of copying them, and the
 * default pipeline reads the blocks in place. force_copy = TRUE (offload
 * copy: always) copies every load through the copy worker anyway; call it
 * between attention calls. Whether loads map now: */
SIFT_API void sift_engine_set_force_copy (SiftEngine *engine, gboolean force_copy);
SIFT_API gboolean sift_engine_maps (const SiftEngine *engine);
/* Resident KV (offload.resident; docs/engine.md, "Resident KV"): every
 * block the engine stores from now on is also kept in compute memory
 * (device memory on a GPU) and the default attention reads it there: no
 * ring, no load from the store while attending; the store keeps its copy.
 * Set before a sequence stores its first block (after new or reset);
 * SIFT_ENGINE_ERROR_STATE once blocks are stored. Compute memory running
 * out later is SIFT_ENGINE_ERROR_CAPACITY from the call that stores. */
SIFT_API gboolean sift_engine_set_resident (SiftEngine *engine, gboolean resident, GError **error);
SIFT_API gboolean sift_engine_resident (const SiftEngine *engine);
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
SIFT_API gboolean sift_engine_set_eviction (SiftEngine *engine, const SiftEvictConfig *config, GError **error);

/* Keeps H2O accumulated attention for `layer` (the runner turns it on for
 * layers whose policy sets SIFT_POLICY_WANTS_ACCUMULATED_ATTENTION). */
SIFT_API void sift_engine_track_attention (SiftEngine *engine, gint32 layer, gboolean on);
/* The positions of `layer`'s stored tokens, ascending, into out (NULL: only
 * count them); returns how many. */
SIFT_API gsize sift_engine_stored_positions (SiftEngine *engine, gint32 layer, gint64 *out);
/* The accumulated attention of a stored token (summed over kv heads), or
 * -1 when the layer does not track it or the token is not stored. */
SIFT_API double sift_engine_accumulated_attention (SiftEngine *engine, gint32 layer, gint64 position);

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
SIFT_API void sift_engine_counters (const SiftEngine *engine, gint32 layer, SiftPhase phase, SiftCounters *out);

G_END_DECLS
