/* Resident KV (offload.resident): every block this engine stores is kept
 * in compute memory as well — device memory on a GPU — so that the default
 * attention reads it in place: no ring, no load from the store while a
 * step attends. The store still receives each block (from the host image:
 * no bus traffic on a GPU) and stays the tier of record for gather_rows,
 * eviction's compaction and policies that load blocks themselves.
 *
 * The copies live in chunks of compute memory indexed by store id (ids are
 * unique in a store, whichever engine holds them; a chunk is allocated the
 * first time one of its ids is stored here). A block is copied in when it
 * is offloaded, on the compute side, from the prefill or decode buffer
 * that holds it (buffer_move_rows: one copy per half), so it is ordered
 * before any attention that reads it; a block that compaction rewrote in
 * the store is loaded back by a transfer. See docs/engine.md, "Resident
 * KV". */
#include <string.h>

#include <sift/error.h>

#include "engine-private.h"

/* Compute memory per chunk: few allocations for a long context, little
 * waste for a short one. */
#define CHUNK_BYTES ((gsize) 32 << 20)

static gsize
block_bytes (const SiftEngine *e)
{
  return 2 * (gsize) e->block_elems * e->es;
}

void
sift_engine_resident_init (SiftEngine *e)
{
  e->res_chunks = g_array_new (FALSE, TRUE, sizeof (SiftBuffer));
  e->res_chunk_blocks = (gint64) MAX (CHUNK_BYTES / block_bytes (e), 1);
  e->res_event = e->backend->ops->event_new (e->backend);
}

gboolean
sift_engine_set_resident (SiftEngine *e, gboolean resident, GError **error)
{
  g_return_val_if_fail (e != NULL, FALSE);
  if (!resident == !e->resident)
    return TRUE;
  for (gint32 l = 0; l < e->config.shape.n_layers; l++)
    if (e->store_ids[l]->len > 0)
      {
        g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                     "engine: offload.resident can change only before a sequence stores a block "
                     "(layer %d holds %u)", l, e->store_ids[l]->len);
        return FALSE;
      }
  e->resident = resident;
  return TRUE;
}

gboolean
sift_engine_resident (const SiftEngine *e)
{
  g_return_val_if_fail (e != NULL, FALSE);
  return e->resident;
}

void
sift_engine_resident_clear (SiftEngine *e)
{
  for (guint i = 0; i < e->res_chunks->len; i++)
    {
      SiftBuffer *b = &g_array_index (e->res_chunks, SiftBuffer, i);
      if (b->data != NULL)
        e->backend->ops->buffer_clear (e->backend, b->data, b->size);
    }
}

void
sift_engine_resident_free (SiftEngine *e)
{
  for (guint i = 0; i < e->res_chunks->len; i++)
    {
      SiftBuffer *b = &g_array_index (e->res_chunks, SiftBuffer, i);
      if (b->data != NULL)
        e->backend->ops->buffer_free (e->backend, b);
    }
  g_array_unref (e->res_chunks);
  e->res_chunks = NULL;
  e->backend->ops->event_free (e->backend, e->res_event);
  e->res_event = NULL;
}

guint8 *
sift_engine_resident_block (SiftEngine *e, gint64 store_id)
{
  const gint64 c = store_id / e->res_chunk_blocks;
  g_assert (store_id >= 0 && c < (gint64) e->res_chunks->len);
  SiftBuffer *b = &g_array_index (e->res_chunks, SiftBuffer, (guint) c);
  g_assert (b->data != NULL);
  return b->data + (gsize) (store_id % e->res_chunk_blocks) * block_bytes (e);
}

/* The chunk of store_id, allocated (zeroed) the first time. */
static gboolean
ensure_chunk (SiftEngine *e, gint64 store_id, GError **error)
{
  const gint64 c = store_id / e->res_chunk_blocks;
  if (c >= (gint64) e->res_chunks->len)
    g_array_set_size (e->res_chunks, (guint) c + 1);
  SiftBuffer *b = &g_array_index (e->res_chunks, SiftBuffer, (guint) c);
  if (b->data != NULL)
    return TRUE;
  const gsize size = (gsize) e->res_chunk_blocks * block_bytes (e);
  GError *local = NULL;
  if (e->backend->ops->buffer_alloc (e->backend, size, b, &local))
    return TRUE;
  gsize held = 0;
  for (guint i = 0; i < e->res_chunks->len; i++)
    held += g_array_index (e->res_chunks, SiftBuffer, i).size;
  g_autofree char *have = g_format_size (held), *more = g_format_size (size);
  g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_CAPACITY,
               "engine: offload.resident: the %s backend cannot hold %s more of resident KV (%s held): %s "
               "(the cache does not fit; offload.resident: false streams it through the ring)",
               e->backend->ops->name, more, have, local->message);
  g_error_free (local);
  *b = (SiftBuffer) { 0 };
  return FALSE;
}

gboolean
sift_engine_resident_put (SiftEngine *e, gint64 store_id, const guint8 *k, const guint8 *v, gint64 cap,
                          GError **error)
{
  if (!ensure_chunk (e, store_id, error))
    return FALSE;
  const SiftModelShape *s = &e->config.shape;
  const gsize width = (gsize) s->block_size * (gsize) s->head_dim * e->es;
  const gsize pitch = (gsize) cap * (gsize) s->head_dim * e->es;
  guint8 *dst = sift_engine_resident_block (e, store_id);
  SiftBackend *be = e->backend;
  be->ops->buffer_move_rows (be, dst, width, k, pitch, width, (gsize) s->n_kv_heads);
  be->ops->buffer_move_rows (be, dst + (gsize) e->block_elems * e->es, width, v, pitch, width, (gsize) s->n_kv_heads);
  return TRUE;
}

gboolean
sift_engine_resident_reload (SiftEngine *e, gint32 layer, gint64 store_id, GError **error)
{
  if (!ensure_chunk (e, store_id, error))
    return FALSE;
  guint8 *dst = sift_engine_resident_block (e, store_id);
  SiftTransfer t = { .kind = SIFT_TRANSFER_LOAD, .store_id = store_id, .what = SIFT_LOAD_KV, .k = dst,
                     .v = dst + (gsize) e->block_elems * e->es, .cap = e->config.shape.block_size,
                     .event = e->res_event, .layer = layer, .phase = e->phase };
  SiftBackend *be = e->backend;
  be->ops->submit (be, &t, 1);
  return be->ops->event_wait (be, &e->res_event, 1, NULL, error);
}
