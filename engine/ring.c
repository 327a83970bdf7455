/* The ring: n_slots compute-side slots of one block each, loaded by the
 * backend's transfers (or mapped onto a resident stored block: zero-copy),
 * waited for on their events and released by the compute side: load_block /
 * wait_slot / slot_kv / slot_done for policies, and the same protocol for a
 * group of slots in one backend call for the default attention (attend.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>

#include "attn-private.h"
#include "engine-private.h"

/* Slot memory: slot i holds K then V of one block, each
 * [n_kv_heads][block_size][head_dim], the stored layout, so a load of the
 * stored dtype is one read (for the host store one large memcpy, which runs
 * at full memory bandwidth where many small ones do not). */
static guint8 *
slot_data (SiftEngine *e, gint32 slot, int v)
{
  return e->slots_mem + ((gsize) slot * 2 + (gsize) v) * (gsize) e->block_elems * e->es;
}

static void
unmap_slot (Slot *s)
{
  s->map_k = s->map_v = NULL;
  s->map_id = -1;
}

void
sift_engine_unmap_id (SiftEngine *e, gint64 store_id)
{
  const gsize kb = e->store->k_bytes;
  for (gint32 i = 0; i < e->config.n_slots; i++)
    {
      Slot *s = &e->slots[i];
      if (s->map_k == NULL || s->map_id != store_id)
        continue;
      /* The slot's own memory has the stored layout: the bytes move as they are. */
      e->backend->ops->buffer_write (e->backend, slot_data (e, i, 0), s->map_k, kb);
      e->backend->ops->buffer_write (e->backend, slot_data (e, i, 1), s->map_v, kb);
      unmap_slot (s);
    }
}

void
sift_engine_set_force_copy (SiftEngine *e, gboolean force_copy)
{
  g_return_if_fail (e != NULL);
  /* Whether blocks are read in place is the backend's call. */
  e->maps = !force_copy && e->backend->ops->can_map (e->backend, e->store, e->config.compute_dtype);
}

/* Work (as SIFT_ATTN_SERIAL_WORK counts it) below which one kernel call's
 * fixed cost shows: a 1-row decode step of 4 q heads x 64 over 128-token
 * blocks (32K a block) took 0.105 s in groups of 1 against 0.091 s in
 * groups of 2 (docs/benchmarks.md). */
#define RING_CALL_WORK ((double) (1 << 18))

gint32
sift_engine_ring_group (const SiftEngine *e, gint32 n_q)
{
  const gint32 half = MAX (1, e->config.n_slots / 2);
  if (e->ring_group > 0)
    return MIN (e->ring_group, e->config.n_slots);
  const SiftModelShape *s = &e->config.shape;
  const double block_work = (double) s->n_q_heads * n_q * s->block_size * s->head_dim;
  /* A GPU's call costs several kernel launches (~15-20 us on an H100,
   * whatever the keys): one block per call spent that on each block's
   * 0.5 us of reading (docs/benchmarks.md, offloaded decode on the GPU). */
  if (block_work >= SIFT_ATTN_SERIAL_WORK || !e->host_compute)
    return half;
  /* Serial calls: as few blocks per call as keep the call's own cost
   * small beside its work (RING_CALL_WORK), so the worker can run ahead. */
  const double want = ceil (RING_CALL_WORK / block_work);
  return (gint32) CLAMP (want, 1.0, (double) half);
}

void
sift_engine_set_ring_group (SiftEngine *e, gint32 blocks)
{
  e->ring_group = MAX (0, blocks);
}

gboolean
sift_engine_maps (const SiftEngine *e)
{
  g_return_val_if_fail (e != NULL, FALSE);
  return e->maps;
}

/* A zero-copy load: the slot points at the stored block, ready at once.
 * The block's store must have run first (submission order keeps that for
 * copies; a mapping is no transfer). FALSE when the store cannot map it
 * (then the load is copied). */
static gboolean
map_block (SiftEngine *e, gint32 layer, gint64 store_id, gint32 slot, SiftLoadWhat what)
{
  Slot *s = &e->slots[slot];
  sift_engine_wait_stores (e, layer);
  const guint8 *p = sift_store_map (e->store, store_id);
  if (p == NULL)
    return FALSE;
  s->busy = TRUE;
  if (!sift_engine_store_ok (e, &s->error)) /* the block may never have been written */
    return TRUE;
  const gsize kb = e->store->k_bytes;
  s->map_k = p;
  s->map_v = p + kb;
  s->map_id = store_id;
  const guint64 n = what == SIFT_LOAD_KV ? 2 * kb : kb;
  SiftCounters add = { .bytes_loaded = n, .bytes_mapped = n };
  sift_engine_count (e, layer, e->phase, &add);
  return TRUE;
}

/* Gives slot the block's valid tokens and layer (the slot is free). */
static void
slot_take (SiftEngine *e, gint32 layer, gint64 block_id, gint32 slot)
{
  e->slots[slot].busy = TRUE;
  e->slots[slot].n_valid = g_array_index (e->meta[layer], SiftBlockMeta, block_id).n_valid;
  e->slots[slot].layer = layer;
}

/* The transfer that loads logical block block_id of layer into slot
 * (claimed for it by slot_take). Counted under the current call's phase,
 * not the block's. */
static SiftTransfer
slot_load (SiftEngine *e, gint32 layer, gint64 block_id, gint32 slot, SiftLoadWhat what, guint64 kv_heads)
{
  return (SiftTransfer) { .kind = SIFT_TRANSFER_LOAD, .store_id = g_array_index (e->store_ids[layer], gint64, block_id),
                          .what = what, .k = slot_data (e, slot, 0), .v = slot_data (e, slot, 1),
                          .cap = e->config.shape.block_size, .event = e->slots[slot].event, .layer = layer,
                          .phase = e->phase, .kv_heads = kv_heads };
}

/* Waits for slot s's load (the backend helps or spins meanwhile); a failed
 * load frees the slot and hands over its error. */
static gboolean
wait_slot (SiftEngine *e, Slot *s, gint32 slot, GError **error)
{
  if (!s->busy)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: wait on slot %d, which has no load", slot);
      return FALSE;
    }
  if (s->error != NULL)
    {
      g_propagate_error (error, s->error);
      s->error = NULL;
      s->busy = FALSE;
      return FALSE;
    }
  if (s->map_k != NULL)
    return TRUE;
  if (e->backend->ops->event_wait (e->backend, &s->event, 1, NULL, error))
    return TRUE;
  s->busy = FALSE;
  return FALSE;
}

/* Frees a slot whose load finished. A failed load's error, never waited
 * for, goes with it (clear: the event may hold one). */
static void
slot_free (SiftEngine *e, Slot *s, gboolean clear)
{
  if (clear && s->busy && s->map_k == NULL && s->error == NULL)
    e->backend->ops->event_wait (e->backend, &s->event, 1, NULL, NULL);
  s->busy = FALSE;
  s->ahead = FALSE;
  g_clear_error (&s->error);
  unmap_slot (s);
}

/* Whether a busy slot's load is still running. */
static gboolean
slot_loading (SiftEngine *e, Slot *s)
{
  return s->busy && s->map_k == NULL && s->error == NULL
         && e->backend->ops->event_query (e->backend, s->event) == SIFT_EVENT_PENDING;
}

gint32
sift_engine_n_slots (SiftEngine *e)
{
  g_return_val_if_fail (e != NULL, 0);
  return e->config.n_slots;
}

gboolean
sift_engine_load_block (SiftEngine *e, gint32 layer, gint64 block_id, gint32 slot, SiftLoadWhat what,
                        GError **error)
{
  g_return_val_if_fail (e != NULL, FALSE);
  if (!sift_engine_check_layer (e, layer, error))
    return FALSE;
  if (slot < 0 || slot >= e->config.n_slots)
    return sift_engine_invalid (error, "slot %d is outside the %d ring slots", slot, e->config.n_slots);
  if (what != SIFT_LOAD_K && what != SIFT_LOAD_V && what != SIFT_LOAD_KV)
    return sift_engine_invalid (error, "load of %d is not K, V or KV", (int) what);
  if (e->slots[slot].ahead)
    slot_free (e, &e->slots[slot], TRUE);
  GArray *ids = e->store_ids[layer];
  if (block_id < 0 || block_id >= (gint64) ids->len)
    return sift_engine_invalid (error, "layer %d has %u stored blocks; block %" G_GINT64_FORMAT " does not exist", layer,
                    ids->len, block_id);
  if (e->slots[slot].busy)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: slot %d is still in use (load it again only after sift_engine_slot_done)", slot);
      return FALSE;
    }
  slot_take (e, layer, block_id, slot);
  if (e->maps && map_block (e, layer, g_array_index (ids, gint64, block_id), slot, what))
    return TRUE;
  SiftTransfer t = slot_load (e, layer, block_id, slot, what, 0);
  e->backend->ops->submit (e->backend, &t, 1);
  return TRUE;
}

gboolean
sift_engine_wait_slot (SiftEngine *e, gint32 slot, GError **error)
{
  g_return_val_if_fail (e != NULL, FALSE);
  if (slot < 0 || slot >= e->config.n_slots)
    return sift_engine_invalid (error, "slot %d is outside the %d ring slots", slot, e->config.n_slots);
  gint64 t0 = g_get_monotonic_time ();
  Slot *s = &e->slots[slot];
  gboolean ok = wait_slot (e, s, slot, error);
  /* Stall time is charged to the layer whose block the slot holds. */
  SiftCounters add = { .seconds_stalled = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC };
  sift_engine_count (e, s->layer, e->phase, &add);
  return ok;
}

/* ---- Group calls for the default attention (attend.c) ---------------------
 * The same protocol as load_block / wait_slot / slot_done, n slots in one
 * backend call each: a group of blocks per call instead of one lock round
 * trip (with the worker's cache line bouncing between cores) per block.
 * Copies only: the ring runs when blocks are not read in place. */

gboolean
sift_engine_ring_load (SiftEngine *e, gint32 layer, const gint64 *block_ids, const guint64 *kv_heads,
                       const gint32 *slots, gint32 n, GError **error)
{
  GArray *ids = e->store_ids[layer];
  for (gint32 i = 0; i < n; i++)
    if (block_ids[i] < 0 || block_ids[i] >= (gint64) ids->len)
      return sift_engine_invalid (error, "layer %d has %u stored blocks; block %" G_GINT64_FORMAT " does not exist", layer,
                      ids->len, block_ids[i]);
  /* A slot loaded ahead with this very block (every kv head) is taken as
   * it is; one loaded ahead with another is freed. */
  gboolean *taken = g_newa (gboolean, MAX (n, 1));
  const guint64 all = sift_kv_heads_all (e->config.shape.n_kv_heads);
  for (gint32 i = 0; i < n; i++)
    {
      Slot *sl = &e->slots[slots[i]];
      const guint64 want = kv_heads != NULL ? kv_heads[i] : 0;
      taken[i] = sl->ahead && sl->layer == layer && sl->ahead_block == block_ids[i]
                 && sl->ahead_id == g_array_index (ids, gint64, block_ids[i]) && (want == 0 || want == all);
      if (taken[i])
        sl->ahead = FALSE, e->n_ahead_taken++;
      else if (sl->ahead)
        slot_free (e, sl, TRUE);
    }
  for (gint32 i = 0; i < n; i++)
    if (!taken[i] && e->slots[slots[i]].busy)
      {
        g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE, "engine: slot %d is still in use", slots[i]);
        return FALSE;
      }
  SiftTransfer *t = g_newa (SiftTransfer, MAX (n, 1));
  gsize k = 0;
  for (gint32 i = 0; i < n; i++)
    if (!taken[i])
      {
        slot_take (e, layer, block_ids[i], slots[i]);
        t[k++] = slot_load (e, layer, block_ids[i], slots[i], SIFT_LOAD_KV, kv_heads != NULL ? kv_heads[i] : 0);
      }
  if (k > 0)
    e->backend->ops->submit (e->backend, t, k);
  return TRUE;
}

/* ---- Prefetch across calls (GPU) ------------------------------------------
 * A decode step's layer that streams every stored block through the ring
 * leaves the copy stream idle from its last load until the next call's
 * first: the last groups' attention, the output read back, the host's
 * work between the calls (the model, the next q, k, v). The slots its last
 * groups free are loaded meanwhile with the next call's first blocks (the
 * next layer's, which streams every block too when its last call did):
 * block j into slot j, where the next stream puts it (docs/engine.md). */

void
sift_engine_ring_prefetch (SiftEngine *e, gint32 layer, const gint32 *slots, gint32 n)
{
  GArray *ids = e->store_ids[layer];
  SiftTransfer *t = g_newa (SiftTransfer, MAX (n, 1));
  gsize k = 0;
  for (gint32 i = 0; i < n; i++)
    {
      const gint32 j = slots[i];
      Slot *sl = &e->slots[j];
      if ((gint64) j >= (gint64) ids->len || sl->busy)
        continue;
      slot_take (e, layer, j, j);
      sl->ahead = TRUE;
      sl->ahead_block = j;
      sl->ahead_id = g_array_index (ids, gint64, j);
      t[k++] = slot_load (e, layer, j, j, SIFT_LOAD_KV, 0);
    }
  if (k > 0)
    e->backend->ops->submit (e->backend, t, k);
}

void
sift_engine_ring_drop_ahead (SiftEngine *e)
{
  gboolean any = FALSE;
  for (gint32 i = 0; i < e->config.n_slots; i++)
    any = any || e->slots[i].ahead;
  if (!any)
    return;
  e->backend->ops->drain (e->backend, FALSE);
  for (gint32 i = 0; i < e->config.n_slots; i++)
    if (e->slots[i].ahead)
      slot_free (e, &e->slots[i], TRUE);
}

gboolean
sift_engine_ring_wait (SiftEngine *e, const gint32 *slots, gint32 n, gint32 *n_valid, gint32 *n_ready,
                       GError **error)
{
  gint64 t0 = g_get_monotonic_time ();
  SiftEvent **events = g_newa (SiftEvent *, MAX (n, 1));
  for (gint32 i = 0; i < n; i++)
    {
      n_valid[i] = e->slots[slots[i]].n_valid;
      events[i] = e->slots[slots[i]].event;
    }
  gsize n_ok = 0;
  gboolean ok = e->backend->ops->event_wait (e->backend, events, (gsize) n, &n_ok, error);
  *n_ready = (gint32) n_ok;
  if (!ok)
    e->slots[slots[n_ok]].busy = FALSE;
  if (n > 0)
    {
      SiftCounters add = { .seconds_stalled = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC };
      sift_engine_count (e, e->slots[slots[0]].layer, e->phase, &add);
    }
  return ok;
}

/* The slots were waited for: no error is left on their events. */
void
sift_engine_ring_done (SiftEngine *e, const gint32 *slots, gint32 n)
{
  for (gint32 i = 0; i < n; i++)
    slot_free (e, &e->slots[slots[i]], FALSE);
}

void
sift_engine_slots_kv (SiftEngine *e, gint32 slot, gint64 n_tokens, SiftView *k, SiftView *v)
{
  const SiftModelShape *s = &e->config.shape;
  const Slot *sl = &e->slots[slot];
  SiftView kv = sift_view_strided (sl->map_k != NULL ? (void *) sl->map_k : slot_data (e, slot, 0), e->config.compute_dtype,
                                   s->n_kv_heads, n_tokens, s->head_dim, (gint64) s->block_size * s->head_dim, s->head_dim);
  if (sl->map_k == NULL && !e->host_compute)
    kv.space = SIFT_MEMORY_DEVICE;
  if (k != NULL)
    *k = kv;
  if (v != NULL)
    {
      *v = kv;
      v->data = sl->map_v != NULL ? (void *) sl->map_v : slot_data (e, slot, 1);
    }
}

gboolean
sift_engine_slot_ready (SiftEngine *e, gint32 slot, gint32 *n_valid_out)
{
  Slot *s = &e->slots[slot];
  gboolean ready = s->busy && s->error == NULL
                   && (s->map_k != NULL || e->backend->ops->event_query (e->backend, s->event) == SIFT_EVENT_DONE);
  if (n_valid_out != NULL)
    *n_valid_out = s->n_valid;
  return ready;
}

void
sift_engine_slot_kv (SiftEngine *e, gint32 slot, SiftView *k, SiftView *v, gint32 *n_valid_out)
{
  g_return_if_fail (e != NULL && slot >= 0 && slot < e->config.n_slots);
  gint32 nv = 0;
  g_return_if_fail (sift_engine_slot_ready (e, slot, &nv));
  sift_engine_slots_kv (e, slot, nv, k, v);
  if (n_valid_out != NULL)
    *n_valid_out = nv;
}

void
sift_engine_slot_done (SiftEngine *e, gint32 slot)
{
  g_return_if_fail (e != NULL && slot >= 0 && slot < e->config.n_slots);
  Slot *s = &e->slots[slot];
  if (!slot_loading (e, s))
    slot_free (e, s, TRUE);
  else
    g_critical ("sift_engine_slot_done: slot %d is still loading (wait for it first)", slot);
}

void
sift_engine_ring_init (SiftEngine *e)
{
  e->slots = g_new0 (Slot, e->config.n_slots);
  for (gint32 i = 0; i < e->config.n_slots; i++)
    {
      e->slots[i].map_id = -1;
      e->slots[i].event = e->backend->ops->event_new (e->backend);
    }
}

void
sift_engine_ring_clear (SiftEngine *e)
{
  e->backend->ops->buffer_clear (e->backend, e->slots_mem,
                                 (gsize) e->config.n_slots * 2 * (gsize) e->block_elems * e->es);
  for (gint32 i = 0; i < e->config.n_slots; i++)
    slot_free (e, &e->slots[i], TRUE);
}

void
sift_engine_ring_free (SiftEngine *e)
{
  for (gint32 i = 0; i < e->config.n_slots; i++)
    {
      g_clear_error (&e->slots[i].error);
      e->backend->ops->event_free (e->backend, e->slots[i].event);
    }
  g_free (e->slots);
}
