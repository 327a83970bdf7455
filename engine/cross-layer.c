/* The cross-layer pipeline: a double buffer whose halves hold two layers'
 * selected blocks side by side, so the backend loads layer l+1's blocks
 * while layer l is attended (sift_engine_pipeline_start / get / end). */
#include <stdlib.h>
#include <string.h>

#include <sift/error.h>

#include "engine-private.h"

/* Queues loads of `layer`'s selected blocks (NULL: all) into half `hi`. */
static gboolean
xl_queue (SiftEngine *e, int hi, gint32 layer, const SiftSelection *sel, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  XlHalf *x = &e->xl[hi];
  GArray *ids = e->store_ids[layer];
  gint64 n = sel != NULL ? (gint64) sift_selection_n_blocks (sel) : (gint64) ids->len;
  g_array_set_size (x->ids, 0);
  for (gint64 i = 0; i < n; i++)
    {
      gint64 b = sel != NULL ? sift_selection_block (sel, (gsize) i) : i;
      if (b < 0 || b >= (gint64) ids->len)
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_SELECTION,
                       "engine: cross-layer selection of layer %d names block %" G_GINT64_FORMAT
                       ", but the layer has %u stored blocks",
                       layer, b, ids->len);
          return FALSE;
        }
      g_array_append_val (x->ids, b);
    }
  SiftBackend *be = e->backend;
  if (n > x->cap_blocks)
    {
      gint64 cap = MAX (n, x->cap_blocks * 2);
      gsize bytes = (gsize) s->n_kv_heads * (gsize) cap * (gsize) s->block_size * (gsize) s->head_dim * e->es;
      if (x->k.data != NULL)
        {
          be->ops->buffer_free (be, &x->k);
          be->ops->buffer_free (be, &x->v);
          x->cap_blocks = 0;
        }
      if (!be->ops->buffer_alloc (be, bytes, &x->k, error))
        return FALSE;
      if (!be->ops->buffer_alloc (be, bytes, &x->v, error))
        {
          be->ops->buffer_free (be, &x->k);
          return FALSE;
        }
      x->cap_blocks = cap;
    }
  x->layer = layer;
  x->n_blocks = n;
  const gint64 cap_tokens = x->cap_blocks * s->block_size;
  g_autofree SiftTransfer *t = g_new (SiftTransfer, MAX (n, 1));
  for (gint64 i = 0; i < n; i++)
    {
      gint64 b = g_array_index (x->ids, gint64, i);
      gsize off = (gsize) (i * s->block_size * s->head_dim) * e->es;
      t[i] = (SiftTransfer) { .kind = SIFT_TRANSFER_LOAD, .store_id = g_array_index (ids, gint64, b),
                              .what = SIFT_LOAD_KV, .k = x->k.data + off, .v = x->v.data + off, .cap = cap_tokens,
                              .event = x->event, .layer = layer, .phase = SIFT_PHASE_DECODE };
    }
  be->ops->submit (be, t, (gsize) n);
  return TRUE;
}

/* Waits for both halves' loads; a failed one's error is dropped. */
static void
xl_drain (SiftEngine *e)
{
  SiftEvent *both[2] = { e->xl[0].event, e->xl[1].event };
  for (int i = 0; i < 2; i++)
    e->backend->ops->event_wait (e->backend, &both[i], 1, NULL, NULL);
}

gboolean
sift_engine_pipeline_start (SiftEngine *e, const SiftSelection *layer0_selection, GError **error)
{
  g_return_val_if_fail (e != NULL, FALSE);
  xl_drain (e);
  for (int i = 0; i < 2; i++)
    e->xl[i].layer = -1;
  e->xl_active = TRUE;
  if (!xl_queue (e, 0, 0, layer0_selection, error))
    {
      sift_engine_pipeline_end (e);
      return FALSE;
    }
  return TRUE;
}

gboolean
sift_engine_pipeline_get (SiftEngine *e, gint32 layer, const SiftSelection *next_selection, SiftView *k,
                          SiftView *v, gsize *n_blocks_out, GError **error)
{
  g_return_val_if_fail (e != NULL && k != NULL && v != NULL, FALSE);
  const SiftModelShape *s = &e->config.shape;
  XlHalf *x = &e->xl[layer & 1];
  if (!e->xl_active || layer < 0 || layer >= s->n_layers || x->layer != layer)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: pipeline_get for layer %d, but the cross-layer pipeline %s", layer,
                   e->xl_active ? "is loading another layer" : "was not started");
      return FALSE;
    }
  gint64 t0 = g_get_monotonic_time ();
  GError *failed = NULL;
  e->backend->ops->event_wait (e->backend, &x->event, 1, NULL, &failed);
  SiftCounters add = { .seconds_stalled = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC };
  sift_engine_count (e, layer, SIFT_PHASE_DECODE, &add);
  if (failed != NULL)
    {
      g_propagate_error (error, failed);
      return FALSE;
    }
  if (layer + 1 < s->n_layers && !xl_queue (e, (layer + 1) & 1, layer + 1, next_selection, error))
    return FALSE;
  SiftView kv = sift_view_strided (x->k.data, e->config.compute_dtype, s->n_kv_heads, x->n_blocks * s->block_size,
                                   s->head_dim, x->cap_blocks * s->block_size * s->head_dim, s->head_dim);
  kv.space = x->k.space;
  *k = kv;
  *v = kv;
  v->data = x->v.data;
  if (n_blocks_out != NULL)
    *n_blocks_out = (gsize) x->n_blocks;
  return TRUE;
}

void
sift_engine_pipeline_end (SiftEngine *e)
{
  g_return_if_fail (e != NULL);
  xl_drain (e);
  for (int i = 0; i < 2; i++)
    e->xl[i].layer = -1;
  e->xl_active = FALSE;
}


void
sift_engine_xl_init (SiftEngine *e)
{
  for (int i = 0; i < 2; i++)
    {
      e->xl[i].layer = -1;
      e->xl[i].ids = g_array_new (FALSE, FALSE, sizeof (gint64));
      e->xl[i].event = e->backend->ops->event_new (e->backend);
    }
}

void
sift_engine_xl_clear (SiftEngine *e)
{
  for (int i = 0; i < 2; i++)
    {
      XlHalf *x = &e->xl[i];
      if (x->k.data != NULL)
        {
          e->backend->ops->buffer_clear (e->backend, x->k.data, x->k.size);
          e->backend->ops->buffer_clear (e->backend, x->v.data, x->v.size);
        }
      /* The transfers are drained: a failed load's error is all that is left. */
      e->backend->ops->event_wait (e->backend, &x->event, 1, NULL, NULL);
      x->layer = -1;
      x->n_blocks = 0;
      g_array_set_size (x->ids, 0);
    }
  e->xl_active = FALSE;
}

void
sift_engine_xl_free (SiftEngine *e)
{
  SiftBackend *be = e->backend;
  for (int i = 0; i < 2; i++)
    {
      XlHalf *x = &e->xl[i];
      if (x->k.data != NULL)
        {
          be->ops->buffer_free (be, &x->k);
          be->ops->buffer_free (be, &x->v);
        }
      be->ops->event_wait (be, &x->event, 1, NULL, NULL);
      be->ops->event_free (be, x->event);
      g_array_unref (x->ids);
    }
}
