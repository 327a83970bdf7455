/* sift — the OffloadEngine calls meant for policies.
 *
 * A policy reaches KV only through these: streams of stored blocks through
 * the ring slots (or the slots themselves: load, wait, view, done), the
 * tokens not yet stored, row gathers, a stored block's
 * positions, the default pipeline and the density counters. The engine's
 * host side (construction, configuration, counters) is <sift/engine.h>.
 * Part of the plugin SDK, <sift/plugin.h>. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/error.h>
#include <sift/policy.h>
#include <sift/view.h>

G_BEGIN_DECLS

typedef enum {
  SIFT_LOAD_K = 1,
  SIFT_LOAD_V = 2,
  SIFT_LOAD_KV = 3,
} SiftLoadWhat;

SIFT_API gint32 sift_engine_n_slots (SiftEngine *engine);
/* Queues a load of a stored block of `layer` into `slot` (asynchronous).
 * The slot must be free (never loaded, or marked done). */
SIFT_API gboolean sift_engine_load_block (SiftEngine *engine, gint32 layer, gint64 block_id, gint32 slot,
                                          SiftLoadWhat what, GError **error);
/* Waits until the slot's load finished; reports the load's error if it failed. */
SIFT_API gboolean sift_engine_wait_slot (SiftEngine *engine, gint32 slot, GError **error);
/* Views of a loaded slot: [n_kv_heads][n_valid][head_dim], the block's valid
 * tokens (strided: use the view's strides); n_valid_out (may be NULL) gets
 * n_valid. Only after wait_slot succeeded. After a K-only load, v is undefined. */
SIFT_API void sift_engine_slot_kv (SiftEngine *engine, gint32 slot, SiftView *k, SiftView *v, gint32 *n_valid_out);
/* Compute on the slot is finished: it may be loaded again. */
SIFT_API void sift_engine_slot_done (SiftEngine *engine, gint32 slot);

/* ---- Streams (since ABI 2.0) ----------------------------------------------
 * Blocks of one layer through the ring slots in order, the ring's slot
 * arithmetic and its error drain kept inside the engine:
 *
 *   SiftStream *s = sift_engine_stream_begin (engine, layer, ids, n, SIFT_LOAD_KV);
 *   SiftStreamBlock b;
 *   while (sift_engine_stream_next (s, &b, 1, error) > 0)
 *     ... b.k, b.v: block b.block_id, valid until the next call ...
 *   return sift_engine_stream_end (s);
 *
 * Up to n_slots loads are in flight ahead of the blocks handed out. */
typedef struct _SiftStream SiftStream;

typedef struct {
  gsize index;       /* position in the stream's list */
  gint64 block_id;   /* the stored block (its SiftBlockMeta: ctx->blocks[block_id]) */
  gint32 n_valid;    /* its valid tokens */
  SiftView k, v;     /* [n_kv_heads][n_valid][head_dim]; v undefined after a K-only load */
} SiftStreamBlock;

/* A stream over stored blocks block_ids[0, n) of `layer` (copied; NULL:
 * blocks 0 .. n - 1), loading `what`. Nothing is loaded before the first
 * sift_engine_stream_next. */
SIFT_API SiftStream *sift_engine_stream_begin (SiftEngine *engine, gint32 layer, const gint64 *block_ids, gsize n,
                                               SiftLoadWhat what);
/* Releases the blocks the previous call handed out, starts the loads that
 * fit in the freed slots, and hands out the next blocks: up to max (>= 1),
 * consecutive in the list, waited for, never more than n_slots and never
 * across the end of the ring. Returns how many: 0 at the end of the list
 * or when a load failed (then error is set, once). */
SIFT_API gsize sift_engine_stream_next (SiftStream *stream, SiftStreamBlock *blocks, gsize max, GError **error);
/* Releases what is held, waits for the loads still in flight and frees
 * their slots (every slot is free afterwards), frees the stream. FALSE when
 * a load of the stream failed (its error was given by stream_next). */
SIFT_API gboolean sift_engine_stream_end (SiftStream *stream);

/* The tokens not yet stored that this call may attend: prefill, the current
 * chunk [q_pos, q_pos + n_q); decode, the decode buffer [kv_len, q_pos + n_q)
 * (the call's own rows included). Views [n_kv_heads][tokens][head_dim]. */
SIFT_API void sift_engine_local_kv (SiftEngine *engine, const SiftPolicyContext *ctx, SiftView *k, SiftView *v);

/* Gathers K and V rows at absolute token positions of `layer` (stored or
 * local, any order) into f32 [n_kv_heads][n][head_dim] views the caller
 * owns; bytes read from the store count as loaded. */
SIFT_API gboolean sift_engine_gather_rows (SiftEngine *engine, gint32 layer, const gint64 *positions, gsize n,
                                           SiftView *k_out, SiftView *v_out, GError **error);

/* Since eviction compacts blocks, a stored block's tokens need not be
 * consecutive: the positions of its n_valid rows, ascending (the engine's
 * memory, valid until the layer's next offload). NULL for a bad id. */
SIFT_API const gint64 *sift_engine_block_positions (SiftEngine *engine, gint32 layer, gint64 block_id);

/* The default pipeline over `selection` (NULL: every stored block), then
 * the local tokens, merged by LSE; what a NULL compute_chunked_* runs. A
 * policy that only wants to alter the selection can call it. */
SIFT_API gboolean sift_engine_attend_default (SiftEngine *engine, const SiftPolicyContext *ctx,
                                              const SiftSelection *selection, SiftView *out, float *lse,
                                              GError **error);

/* A policy that computes attention its own way reports the KV tokens it
 * attended (summed over query rows and query heads) for the density
 * counters; sift_engine_attend_default counts its own. */
SIFT_API void sift_engine_count_attended (SiftEngine *engine, const SiftPolicyContext *ctx, guint64 tokens);
/* Such a policy that also attends summaries of many tokens (landmarks,
 * block means) reports those rows here, apart from the density. */
SIFT_API void sift_engine_count_summaries (SiftEngine *engine, const SiftPolicyContext *ctx, guint64 rows);

/* Cross-layer decode pipeline: start loads layer 0's selected blocks into
 * one half of the double buffer; get returns layer `layer`'s blocks (waiting
 * if needed) and starts loading layer + 1's into the other half; end drains. */
SIFT_API gboolean sift_engine_pipeline_start (SiftEngine *engine, const SiftSelection *layer0_selection,
                                              GError **error);
SIFT_API gboolean sift_engine_pipeline_get (SiftEngine *engine, gint32 layer, const SiftSelection *next_selection,
                                            SiftView *k, SiftView *v, gsize *n_blocks_out, GError **error);
SIFT_API void sift_engine_pipeline_end (SiftEngine *engine);

G_END_DECLS
