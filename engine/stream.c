/* Streams: stored blocks through the ring slots in order, for the default
 * pipeline and for policies (<sift/engine-calls.h>). Block i of the list
 * goes to slot i mod n_slots; up to n_slots loads run ahead of the blocks
 * handed out; after a failure, or an early end, every load in flight is
 * waited for and its slot freed, so the engine is left with every slot
 * free whatever happened.
 *
 * A policy's stream goes through the per-slot calls (load_block, wait_slot,
 * slot_kv, slot_done), which map slots onto the store where the engine
 * can; the default pipeline's (sift_engine_stream_begin_ring) through the
 * group calls, one backend call per group (copies only). The groups a
 * caller asks for depend on the list, max and n_slots only, never on load
 * timing, so results are reproducible bit for bit. */
#include "engine-private.h"

struct _SiftStream {
  SiftEngine *engine;
  gint32 layer, n_slots;
  SiftLoadWhat what;
  gboolean ring;         /* group calls (the default pipeline) */
  gint64 *ids;           /* [n] */
  guint64 *kv_heads;     /* [n] the kv heads to load (ring); NULL: every head */
  gsize n;
  gsize queued, done;    /* loads started; blocks released (or failed) */
  gsize held;            /* blocks [done, done + held) are the caller's */
  gboolean failed;
  gint32 ahead_layer;    /* whose first blocks the slots freed after the last load get (-1: none) */
  gint32 *slots, *nv;    /* [n_slots] scratch of the group calls */
  gint64 *batch;         /* [n_slots] */
  guint64 *batch_heads;  /* [n_slots] */
};

static SiftStream *
stream_new (SiftEngine *engine, gint32 layer, const gint64 *block_ids, const guint64 *kv_heads, gsize n,
            SiftLoadWhat what, gboolean ring)
{
  SiftStream *s = g_new0 (SiftStream, 1);
  s->engine = engine;
  s->layer = layer;
  s->what = what;
  s->ring = ring;
  s->ahead_layer = -1;
  s->n_slots = sift_engine_n_slots (engine);
  s->n = n;
  s->ids = g_new (gint64, MAX (n, 1));
  for (gsize i = 0; i < n; i++)
    s->ids[i] = block_ids != NULL ? block_ids[i] : (gint64) i;
  s->kv_heads = kv_heads != NULL ? g_memdup2 (kv_heads, MAX (n, 1) * sizeof (guint64)) : NULL;
  s->slots = g_new (gint32, MAX (s->n_slots, 1));
  s->nv = g_new (gint32, MAX (s->n_slots, 1));
  s->batch = g_new (gint64, MAX (s->n_slots, 1));
  s->batch_heads = g_new (guint64, MAX (s->n_slots, 1));
  return s;
}

SiftStream *
sift_engine_stream_begin (SiftEngine *engine, gint32 layer, const gint64 *block_ids, gsize n, SiftLoadWhat what)
{
  g_return_val_if_fail (engine != NULL, NULL);
  return stream_new (engine, layer, block_ids, NULL, n, what, FALSE);
}

SiftStream *
sift_engine_stream_begin_ring (SiftEngine *engine, gint32 layer, const gint64 *block_ids, const guint64 *kv_heads,
                               gsize n)
{
  return stream_new (engine, layer, block_ids, kv_heads, n, SIFT_LOAD_KV, TRUE);
}

void
sift_engine_stream_prefetch (SiftStream *s, gint32 layer)
{
  s->ahead_layer = layer;
}

static gint32
slot_of (const SiftStream *s, gsize i)
{
  return (gint32) (i % (gsize) s->n_slots);
}

/* The caller's blocks go back to the ring. */
static void
release_held (SiftStream *s)
{
  if (s->held == 0)
    return;
  if (s->ring)
    {
      for (gsize i = 0; i < s->held; i++)
        s->slots[i] = slot_of (s, s->done + i);
      sift_engine_ring_done (s->engine, s->slots, (gint32) s->held);
      /* Every load queued: no later block of this stream takes these slots. */
      if (s->ahead_layer >= 0 && s->queued == s->n && !s->failed)
        sift_engine_ring_prefetch (s->engine, s->ahead_layer, s->slots, (gint32) s->held);
    }
  else
    for (gsize i = 0; i < s->held; i++)
      sift_engine_slot_done (s->engine, slot_of (s, s->done + i));
  s->done += s->held;
  s->held = 0;
}

/* Starts the loads of the list up to `to` (every slot they need is free). */
static gboolean
load_upto (SiftStream *s, gsize to, GError **error)
{
  if (s->ring)
    {
      gint32 k = 0;
      for (gsize i = s->queued; i < to; i++, k++)
        {
          s->batch[k] = s->ids[i];
          s->batch_heads[k] = s->kv_heads != NULL ? s->kv_heads[i] : 0;
          s->slots[k] = slot_of (s, i);
        }
      if (k > 0 && !sift_engine_ring_load (s->engine, s->layer, s->batch, s->batch_heads, s->slots, k, error))
        return FALSE;
      s->queued = to;
      return TRUE;
    }
  for (; s->queued < to; s->queued++)
    if (!sift_engine_load_block (s->engine, s->layer, s->ids[s->queued], slot_of (s, s->queued), s->what, error))
      return FALSE;
  return TRUE;
}

/* Waits for the m blocks from done on; on a failure frees the slots before
 * the failed one and the failed one itself, and counts them as done. */
static gboolean
wait_blocks (SiftStream *s, gsize m, GError **error)
{
  for (gsize i = 0; i < m; i++)
    s->slots[i] = slot_of (s, s->done + i);
  if (s->ring)
    {
      gint32 ready = 0;
      if (sift_engine_ring_wait (s->engine, s->slots, (gint32) m, s->nv, &ready, error))
        return TRUE;
      sift_engine_ring_done (s->engine, s->slots, ready);
      s->done += (gsize) ready + 1; /* the failed slot is free again */
      return FALSE;
    }
  for (gsize i = 0; i < m; i++)
    if (!sift_engine_wait_slot (s->engine, s->slots[i], error))
      {
        for (gsize j = 0; j <= i; j++)
          sift_engine_slot_done (s->engine, s->slots[j]);
        s->done += i + 1;
        return FALSE;
      }
  return TRUE;
}

gsize
sift_engine_stream_next (SiftStream *s, SiftStreamBlock *blocks, gsize max, GError **error)
{
  g_return_val_if_fail (s != NULL && blocks != NULL && max >= 1, 0);
  release_held (s);
  if (s->failed || s->done >= s->n)
    return 0;
  if (s->n_slots < 1)
    {
      s->failed = TRUE;
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: no ring slots to stream %" G_GSIZE_FORMAT " blocks of layer %d through", s->n, s->layer);
      return 0;
    }
  if (!load_upto (s, MIN (s->n, s->done + (gsize) s->n_slots), error))
    {
      s->failed = TRUE;
      return 0;
    }
  max = MIN (max, (gsize) s->n_slots);
  gsize end = MIN (s->queued, (s->done / max + 1) * max);
  end = MIN (end, s->done + ((gsize) s->n_slots - s->done % (gsize) s->n_slots)); /* no wrap */
  const gsize m = end - s->done;
  if (!wait_blocks (s, m, error))
    {
      s->failed = TRUE;
      return 0;
    }
  for (gsize i = 0; i < m; i++)
    {
      SiftStreamBlock *b = &blocks[i];
      b->index = s->done + i;
      b->block_id = s->ids[s->done + i];
      if (s->ring)
        {
          b->n_valid = s->nv[i];
          sift_engine_slots_kv (s->engine, s->slots[i], b->n_valid, &b->k, &b->v);
        }
      else
        {
          sift_engine_slot_kv (s->engine, s->slots[i], &b->k, &b->v, &b->n_valid);
          b->k = sift_view_tokens (&b->k, 0, b->n_valid);
          b->v = sift_view_tokens (&b->v, 0, b->n_valid);
        }
    }
  s->held = m;
  return m;
}

gboolean
sift_engine_stream_end (SiftStream *s)
{
  if (s == NULL)
    return TRUE;
  release_held (s);
  for (; s->done < s->queued; s->done++)
    {
      sift_engine_wait_slot (s->engine, slot_of (s, s->done), NULL);
      sift_engine_slot_done (s->engine, slot_of (s, s->done));
    }
  const gboolean ok = !s->failed;
  g_free (s->ids);
  g_free (s->slots);
  g_free (s->nv);
  g_free (s->batch);
  g_free (s->batch_heads);
  g_free (s->kv_heads);
  g_free (s);
  return ok;
}
