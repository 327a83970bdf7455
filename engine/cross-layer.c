/* The cross-layer pipeline: a double buffer whose halves hold two layers'
 * selected blocks side by side, so the copy worker loads layer l+1's blocks
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
  if (n > x->cap_blocks)
    {
      gint64 cap = MAX (n, x->cap_blocks * 2);
      gsize bytes = (gsize) s->n_kv_heads * (gsize) cap * (gsize) s->block_size * (gsize) s->head_dim * e->es;
      free (x->k);
      free (x->v);
      x->k = sift_engine_buffer_new0 (bytes);
      x->v = sift_engine_buffer_new0 (bytes);
      x->cap_blocks = cap;
    }
  x->layer = layer;
  x->n_blocks = n;
  g_clear_error (&x->error);
  const gint64 cap_tokens = x->cap_blocks * s->block_size;
  sift_engine_hold_wake (e, TRUE);
  for (gint64 i = 0; i < n; i++)
    {
      gint64 b = g_array_index (x->ids, gint64, i);
      gsize off = (gsize) (i * s->block_size * s->head_dim) * e->es;
      Job *j = g_new0 (Job, 1);
      *j = (Job) { .kind = JOB_LOAD, .layer = layer, .phase = SIFT_PHASE_DECODE,
                   .store_id = g_array_index (ids, gint64, b), .what = SIFT_LOAD_KV, .k = x->k + off,
                   .v = x->v + off, .cap = cap_tokens, .slot = -1, .half = hi };
      sift_engine_queue_job (e, j);
    }
  sift_engine_hold_wake (e, FALSE);
  return TRUE;
}

static void
xl_drain (SiftEngine *e)
{
  pthread_mutex_lock (&e->lock);
  while (e->xl[0].pending > 0 || e->xl[1].pending > 0)
    sift_engine_wait_done_locked (e);
  pthread_mutex_unlock (&e->lock);
}

gboolean
sift_engine_pipeline_start (SiftEngine *e, const SiftSelection *layer0_selection, GError **error)
{
  g_return_val_if_fail (e != NULL, FALSE);
  xl_drain (e);
  for (int i = 0; i < 2; i++)
    {
      e->xl[i].layer = -1;
      g_clear_error (&e->xl[i].error);
    }
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
  pthread_mutex_lock (&e->lock);
  while (x->pending > 0)
    if (!sift_engine_help_locked (e))
      sift_engine_wait_done_locked (e);
  GError *failed = x->error;
  x->error = NULL;
  pthread_mutex_unlock (&e->lock);
  SiftCounters add = { .seconds_stalled = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC };
  sift_engine_count (e, layer, SIFT_PHASE_DECODE, &add);
  if (failed != NULL)
    {
      g_propagate_error (error, failed);
      return FALSE;
    }
  if (layer + 1 < s->n_layers && !xl_queue (e, (layer + 1) & 1, layer + 1, next_selection, error))
    return FALSE;
  SiftView kv = sift_view_strided (x->k, e->config.compute_dtype, s->n_kv_heads, x->n_blocks * s->block_size, s->head_dim,
                                   x->cap_blocks * s->block_size * s->head_dim, s->head_dim);
  *k = kv;
  *v = kv;
  v->data = x->v;
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
    {
      e->xl[i].layer = -1;
      g_clear_error (&e->xl[i].error);
    }
  e->xl_active = FALSE;
}


void
sift_engine_xl_init (SiftEngine *e)
{
  for (int i = 0; i < 2; i++)
    {
      e->xl[i].layer = -1;
      e->xl[i].ids = g_array_new (FALSE, FALSE, sizeof (gint64));
    }
}

void
sift_engine_xl_clear (SiftEngine *e)
{
  const SiftModelShape *s = &e->config.shape;
  for (int i = 0; i < 2; i++)
    {
      XlHalf *x = &e->xl[i];
      if (x->k != NULL)
        {
          gsize half = (gsize) s->n_kv_heads * (gsize) x->cap_blocks * (gsize) s->block_size
                       * (gsize) s->head_dim * e->es;
          memset (x->k, 0, half);
          memset (x->v, 0, half);
        }
      x->layer = -1;
      x->n_blocks = 0;
      g_clear_error (&x->error);
      g_array_set_size (x->ids, 0);
    }
  e->xl_active = FALSE;
}

void
sift_engine_xl_free (SiftEngine *e)
{
  for (int i = 0; i < 2; i++)
    {
      free (e->xl[i].k);
      free (e->xl[i].v);
      g_clear_error (&e->xl[i].error);
      g_array_unref (e->xl[i].ids);
    }
}
