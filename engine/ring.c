/* The ring: n_slots compute-side slots of one block each, loaded by the
 * copy worker (or mapped onto a resident stored block: zero-copy), waited
 * for and released by the compute side: load_block / wait_slot / slot_kv /
 * slot_done for policies, and the same protocol for a group of slots under
 * one lock for the default attention (attend.c). */
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
      memcpy (slot_data (e, i, 0), s->map_k, kb);
      memcpy (slot_data (e, i, 1), s->map_v, kb);
      unmap_slot (s);
    }
}

void
sift_engine_set_force_copy (SiftEngine *e, gboolean force_copy)
{
  g_return_if_fail (e != NULL);
  e->maps = !force_copy && e->store->config.dtype == e->config.compute_dtype && sift_store_can_map (e->store);
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
  if (block_work >= SIFT_ATTN_SERIAL_WORK)
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
 * The block's store job must have run first (the queue keeps that order
 * for copies; a mapping does not go through the queue). FALSE when the
 * store cannot map it (then the load is copied). */
static gboolean
map_block (SiftEngine *e, gint32 layer, gint64 store_id, gint32 slot, SiftLoadWhat what)
{
  Slot *s = &e->slots[slot];
  pthread_mutex_lock (&e->lock);
  sift_engine_wait_stores_locked (e, layer);
  const guint8 *p = sift_store_map (e->store, store_id);
  if (p == NULL)
    {
      pthread_mutex_unlock (&e->lock);
      return FALSE;
    }
  if (e->store_error != NULL) /* the block may never have been written */
    {
      s->state = SLOT_FAILED;
      s->error = g_error_copy (e->store_error);
      pthread_mutex_unlock (&e->lock);
      return TRUE;
    }
  const gsize kb = e->store->k_bytes;
  s->map_k = p;
  s->map_v = p + kb;
  s->map_id = store_id;
  s->state = SLOT_READY;
  const guint64 n = what == SIFT_LOAD_KV ? 2 * kb : kb;
  SiftCounters *c = sift_engine_counters_at (e, layer, e->phase);
  c->bytes_loaded += n;
  c->bytes_mapped += n;
  pthread_mutex_unlock (&e->lock);
  return TRUE;
}

/* Gives slot the block's valid tokens and layer (the slot is free). */
static void
slot_take (SiftEngine *e, gint32 layer, gint64 block_id, gint32 slot)
{
  e->slots[slot].n_valid = g_array_index (e->meta[layer], SiftBlockMeta, block_id).n_valid;
  e->slots[slot].layer = layer;
}

/* The job that loads logical block block_id of layer into slot (claimed
 * for it by slot_take). Counted under the current call's phase, not the
 * block's. */
static Job *
slot_load_job (SiftEngine *e, gint32 layer, gint64 block_id, gint32 slot, SiftLoadWhat what)
{
  Job *j = g_new0 (Job, 1);
  *j = (Job) { .kind = JOB_LOAD, .layer = layer, .phase = e->phase,
               .store_id = g_array_index (e->store_ids[layer], gint64, block_id), .what = what,
               .k = slot_data (e, slot, 0), .v = slot_data (e, slot, 1), .cap = e->config.shape.block_size,
               .slot = slot, .half = -1 };
  return j;
}

/* Waits (the lock held) for slot s's load, helping the worker meanwhile;
 * a failed load frees the slot and hands over its error. */
static gboolean
wait_slot_locked (SiftEngine *e, Slot *s, gint32 slot, GError **error)
{
  while (s->state == SLOT_LOADING)
    if (!sift_engine_help_locked (e))
      sift_engine_wait_done_locked (e);
  if (s->state == SLOT_FAILED)
    {
      g_propagate_error (error, s->error);
      s->error = NULL;
      s->state = SLOT_FREE;
      return FALSE;
    }
  if (s->state == SLOT_FREE)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: wait on slot %d, which has no load", slot);
      return FALSE;
    }
  return TRUE;
}

/* Frees a slot that is not loading (the lock held). */
static void
slot_free_locked (Slot *s)
{
  s->state = SLOT_FREE;
  g_clear_error (&s->error);
  unmap_slot (s);
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
  GArray *ids = e->store_ids[layer];
  if (block_id < 0 || block_id >= (gint64) ids->len)
    return sift_engine_invalid (error, "layer %d has %u stored blocks; block %" G_GINT64_FORMAT " does not exist", layer,
                    ids->len, block_id);
  pthread_mutex_lock (&e->lock);
  SlotState st = e->slots[slot].state;
  pthread_mutex_unlock (&e->lock);
  if (st != SLOT_FREE)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: slot %d is still in use (load it again only after sift_engine_slot_done)", slot);
      return FALSE;
    }
  slot_take (e, layer, block_id, slot);
  if (e->maps && map_block (e, layer, g_array_index (ids, gint64, block_id), slot, what))
    return TRUE;
  sift_engine_queue_job (e, slot_load_job (e, layer, block_id, slot, what));
  return TRUE;
}

gboolean
sift_engine_wait_slot (SiftEngine *e, gint32 slot, GError **error)
{
  g_return_val_if_fail (e != NULL, FALSE);
  if (slot < 0 || slot >= e->config.n_slots)
    return sift_engine_invalid (error, "slot %d is outside the %d ring slots", slot, e->config.n_slots);
  gint64 t0 = g_get_monotonic_time ();
  pthread_mutex_lock (&e->lock);
  Slot *s = &e->slots[slot];
  gboolean ok = wait_slot_locked (e, s, slot, error);
  /* Stall time is charged to the layer whose block the slot holds. */
  sift_engine_counters_at (e, s->layer, e->phase)->seconds_stalled
    += (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC;
  pthread_mutex_unlock (&e->lock);
  return ok;
}

/* ---- Group calls for the default attention (attend.c) ---------------------
 * The same protocol as load_block / wait_slot / slot_done, n slots under
 * one lock each: a group of blocks per call instead of one lock round trip
 * (with the worker's cache line bouncing between cores) per block. Copies
 * only: the ring runs when blocks are not read in place. */

gboolean
sift_engine_ring_load (SiftEngine *e, gint32 layer, const gint64 *block_ids, const gint32 *slots, gint32 n,
                       GError **error)
{
  GArray *ids = e->store_ids[layer];
  for (gint32 i = 0; i < n; i++)
    if (block_ids[i] < 0 || block_ids[i] >= (gint64) ids->len)
      return sift_engine_invalid (error, "layer %d has %u stored blocks; block %" G_GINT64_FORMAT " does not exist", layer,
                      ids->len, block_ids[i]);
  pthread_mutex_lock (&e->lock);
  for (gint32 i = 0; i < n; i++)
    if (e->slots[slots[i]].state != SLOT_FREE)
      {
        pthread_mutex_unlock (&e->lock);
        g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE, "engine: slot %d is still in use", slots[i]);
        return FALSE;
      }
  for (gint32 i = 0; i < n; i++)
    {
      slot_take (e, layer, block_ids[i], slots[i]);
      sift_engine_push_job_locked (e, slot_load_job (e, layer, block_ids[i], slots[i], SIFT_LOAD_KV));
    }
  sift_engine_wake_worker_locked (e);
  pthread_mutex_unlock (&e->lock);
  return TRUE;
}

gboolean
sift_engine_ring_wait (SiftEngine *e, const gint32 *slots, gint32 n, gint32 *n_valid, gint32 *n_ready,
                       GError **error)
{
  gint64 t0 = g_get_monotonic_time ();
  gboolean ok = TRUE;
  gint32 i = 0;
  pthread_mutex_lock (&e->lock);
  for (; i < n; i++)
    {
      Slot *s = &e->slots[slots[i]];
      n_valid[i] = s->n_valid;
      if (!(ok = wait_slot_locked (e, s, slots[i], error)))
        break;
    }
  *n_ready = i;
  if (n > 0)
    sift_engine_counters_at (e, e->slots[slots[0]].layer, e->phase)->seconds_stalled
      += (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC;
  pthread_mutex_unlock (&e->lock);
  return ok;
}

void
sift_engine_ring_done (SiftEngine *e, const gint32 *slots, gint32 n)
{
  pthread_mutex_lock (&e->lock);
  for (gint32 i = 0; i < n; i++)
    {
      g_assert (e->slots[slots[i]].state != SLOT_LOADING);
      slot_free_locked (&e->slots[slots[i]]);
    }
  pthread_mutex_unlock (&e->lock);
}

void
sift_engine_slots_kv (SiftEngine *e, gint32 slot, gint64 n_tokens, SiftView *k, SiftView *v)
{
  const SiftModelShape *s = &e->config.shape;
  const Slot *sl = &e->slots[slot];
  SiftView kv = sift_view_strided (sl->map_k != NULL ? (void *) sl->map_k : slot_data (e, slot, 0), e->config.compute_dtype,
                                   s->n_kv_heads, n_tokens, s->head_dim, (gint64) s->block_size * s->head_dim, s->head_dim);
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
  pthread_mutex_lock (&e->lock);
  gboolean ready = e->slots[slot].state == SLOT_READY;
  pthread_mutex_unlock (&e->lock);
  if (n_valid_out != NULL)
    *n_valid_out = e->slots[slot].n_valid;
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
  pthread_mutex_lock (&e->lock);
  if (e->slots[slot].state != SLOT_LOADING)
    slot_free_locked (&e->slots[slot]);
  else
    g_critical ("sift_engine_slot_done: slot %d is still loading (wait for it first)", slot);
  pthread_mutex_unlock (&e->lock);
}


void
sift_engine_ring_init (SiftEngine *e)
{
  e->slots_mem = sift_engine_buffer_new0 ((gsize) e->config.n_slots * 2 * (gsize) e->block_elems * e->es);
  e->slots = g_new0 (Slot, e->config.n_slots);
  for (gint32 i = 0; i < e->config.n_slots; i++)
    e->slots[i].map_id = -1;
}

void
sift_engine_ring_clear (SiftEngine *e)
{
  memset (e->slots_mem, 0, (gsize) e->config.n_slots * 2 * (gsize) e->block_elems * e->es);
  for (gint32 i = 0; i < e->config.n_slots; i++)
    slot_free_locked (&e->slots[i]);
}

void
sift_engine_ring_free (SiftEngine *e)
{
  for (gint32 i = 0; i < e->config.n_slots; i++)
    g_clear_error (&e->slots[i].error);
  free (e->slots_mem);
  g_free (e->slots);
}
