/* The OffloadEngine's construction, reset and teardown: it checks the
 * configuration, makes the backend (backend.h: the CPU one, or the CUDA
 * one for offload.device cuda), allocates the
 * compute-side buffers from it and hands each part (block table, ring,
 * cross-layer buffer, eviction) its own setup. The parts live in their own
 * files (docs/engine.md, "Files"); this file calls them and none of them
 * calls back. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sift/attn.h>
#include <sift/error.h>

#include "engine-private.h"

/* Prefill buffer pairs shared by the layers (engine-private.h): two, so
 * that layer l's stores overlap layer l+1's projections, and a 16-layer
 * model holds 2 chunks of K and V instead of 16 (docs/engine.md,
 * "Per-layer buffers"). */
#define PREFILL_PAIRS 2

static gboolean
check_config (const SiftEngineConfig *c, const SiftStore *store, GError **error)
{
  const SiftModelShape *s = &c->shape;
  if (s->n_layers <= 0 || s->n_q_heads <= 0 || s->n_kv_heads <= 0 || s->head_dim <= 0)
    return sift_engine_invalid (error, "impossible shape: %d layers, %d query heads, %d kv heads, head_dim %d",
                    s->n_layers, s->n_q_heads, s->n_kv_heads, s->head_dim);
  if (s->n_q_heads % s->n_kv_heads != 0)
    return sift_engine_invalid (error, "%d query heads are not a multiple of %d kv heads", s->n_q_heads, s->n_kv_heads);
  if (s->block_size <= 0 || s->chunk_size <= 0)
    return sift_engine_invalid (error, "block_size %d and chunk_size %d must be positive", s->block_size, s->chunk_size);
  if (s->chunk_size % s->block_size != 0)
    return sift_engine_invalid (error, "chunk_size %d is not a multiple of block_size %d", s->chunk_size, s->block_size);
  if (c->n_slots < 2)
    return sift_engine_invalid (error, "ring_slots is %d; the ring pipeline needs at least 2 slots", c->n_slots);
  if (c->compute_dtype != SIFT_DTYPE_F32 && c->compute_dtype != SIFT_DTYPE_F16
      && c->compute_dtype != SIFT_DTYPE_BF16)
    return sift_engine_invalid (error, "compute dtype %s is not f32, f16 or bf16", sift_dtype_name (c->compute_dtype));
  if (sift_device_name (c->device) == NULL)
    return sift_engine_invalid (error, "unknown device %d", (int) c->device);
  if (c->pipeline != SIFT_PIPELINE_RING && c->pipeline != SIFT_PIPELINE_CROSS_LAYER)
    return sift_engine_invalid (error, "unknown pipeline %d", (int) c->pipeline);
  if (c->max_tokens < 0)
    return sift_engine_invalid (error, "max_tokens %" G_GINT64_FORMAT " is negative", c->max_tokens);
  if (!isfinite (s->scale) || s->scale < 0)
    return sift_engine_invalid (error, "scale %g is not a finite non-negative number", (double) s->scale);
  /* What sift_engine_new allocates, computed before it does: a shape too
   * large for the machine is an error here, not an abort or an OOM kill. */
  const double es = (double) sift_dtype_size (c->compute_dtype);
  const double rows = (double) c->n_slots * s->block_size
                      + (double) MIN (s->n_layers, PREFILL_PAIRS) * s->chunk_size
                      + (double) s->n_layers * (s->block_size + SIFT_ATTN_DECODE_MAX_ROWS);
  const double bytes = 2.0 * s->n_kv_heads * s->head_dim * es * rows
                       + (double) s->n_q_heads * MAX (s->chunk_size, SIFT_ATTN_DECODE_MAX_ROWS) * (s->head_dim + 1) * 4.0;
  const long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
  if (pages > 0 && page > 0 && bytes > (double) pages * (double) page)
    {
      g_autofree char *need = g_format_size ((guint64) MIN (bytes, 1.8e19));
      g_autofree char *have = g_format_size ((guint64) pages * (guint64) page);
      return sift_engine_invalid (error, "the buffers of %d layers x %d kv heads x head_dim %d (chunk %d, block %d, %d slots) "
                      "need %s, more than this machine's %s", s->n_layers, s->n_kv_heads, s->head_dim,
                      s->chunk_size, s->block_size, c->n_slots, need, have);
    }
  const SiftStoreConfig *sc = sift_store_config (store);
  if (sc->n_kv_heads != s->n_kv_heads || sc->block_size != s->block_size || sc->head_dim != s->head_dim)
    return sift_engine_invalid (error,
                    "the %s store holds blocks of [%d kv heads][%d tokens][%d dim], the model needs [%d][%d][%d]",
                    sift_store_name (store), sc->n_kv_heads, sc->block_size, sc->head_dim,
                    s->n_kv_heads, s->block_size, s->head_dim);
  return TRUE;
}

/* A compute-side buffer of the backend, freed with the engine; NULL when
 * the backend has no memory for it (*error set, the first time). */
static guint8 *
buffer_new (SiftEngine *e, gsize size, GError **error)
{
  SiftBuffer buf = { 0 };
  GError *local = NULL;
  if (!e->backend->ops->buffer_alloc (e->backend, size, &buf, &local))
    {
      if (*error == NULL)
        g_propagate_prefixed_error (error, local, "engine: backend '%s': ", e->backend->ops->name);
      else
        g_clear_error (&local);
      return NULL;
    }
  g_array_append_val (e->buffers, buf);
  return buf.data;
}

/* The host image of a buffer (engine-private.h): the buffer itself when
 * compute memory is host memory, else zeroed host memory of the backend
 * (pinned on a GPU), freed with the engine. */
static guint8 *
image_new (SiftEngine *e, guint8 *buf, gsize size)
{
  if (e->host_compute || buf == NULL)
    return buf;
  guint8 *p = e->backend->ops->host_alloc (e->backend, size);
  g_ptr_array_add (e->images, p);
  g_array_append_val (e->image_sizes, size);
  return p;
}

const char *
sift_device_name (SiftDevice device)
{
  switch (device)
    {
    case SIFT_DEVICE_CPU:
      return "cpu";
    case SIFT_DEVICE_CUDA:
      return "cuda";
    }
  return NULL;
}

SiftEngine *
sift_engine_new (const SiftEngineConfig *config, SiftStore *store, GError **error)
{
  g_return_val_if_fail (config != NULL && store != NULL, NULL);
  if (!check_config (config, store, error))
    return NULL;
  SiftEngine *e = g_new0 (SiftEngine, 1);
  e->config = *config;
  e->store = store;
  const SiftModelShape *s = &e->config.shape;
  const gint32 L = s->n_layers;
  e->es = sift_dtype_size (config->compute_dtype);
  e->block_elems = (gint64) s->n_kv_heads * s->block_size * s->head_dim;
  e->decode_cap = s->block_size + SIFT_ATTN_DECODE_MAX_ROWS;
  /* Adaptive: the lock is held for a few instructions at a time, and a
   * thread that sleeps on it would stall the pipeline for a wake-up. */
  pthread_mutexattr_t attr;
  pthread_mutexattr_init (&attr);
  pthread_mutexattr_settype (&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init (&e->lock, &attr);
  pthread_mutexattr_destroy (&attr);
  e->phase = SIFT_PHASE_PREFILL;
  e->counters = g_new0 (SiftCounters, (gsize) L * 2);
  const SiftBackendSetup setup = { *s, config->compute_dtype, store, { sift_engine_transfer_done, e } };
  e->backend = config->device == SIFT_DEVICE_CUDA ? sift_backend_cuda_new (&setup, error)
                                                  : sift_backend_cpu_new (&setup);
  if (e->backend == NULL)
    {
      g_prefix_error (error, "engine: offload.device cuda: ");
      pthread_mutex_destroy (&e->lock);
      g_free (e->counters);
      g_free (e);
      return NULL;
    }
  g_assert (e->backend->ops->version == SIFT_BACKEND_VERSION
            && e->backend->ops->struct_size >= sizeof (SiftBackendOps));
  e->buffers = g_array_new (FALSE, FALSE, sizeof (SiftBuffer));
  e->images = g_ptr_array_new ();
  e->image_sizes = g_array_new (FALSE, FALSE, sizeof (gsize));
  sift_engine_set_force_copy (e, FALSE);
  GError *local = NULL;

  sift_engine_blocks_init (e);
  e->slots_mem = buffer_new (e, (gsize) config->n_slots * 2 * (gsize) e->block_elems * e->es, &local);
  e->host_compute = e->buffers->len > 0 && g_array_index (e->buffers, SiftBuffer, 0).space == SIFT_MEMORY_HOST;
  const gsize pf_bytes = (gsize) s->n_kv_heads * (gsize) s->chunk_size * (gsize) s->head_dim * e->es;
  const gsize dc_bytes = (gsize) s->n_kv_heads * (gsize) e->decode_cap * (gsize) s->head_dim * e->es;
  e->prefill_k = g_new0 (guint8 *, L);
  e->prefill_v = g_new0 (guint8 *, L);
  e->decode_k = g_new0 (guint8 *, L);
  e->decode_v = g_new0 (guint8 *, L);
  e->n_prefill_pairs = MIN (L, PREFILL_PAIRS);
  e->prefill_owner = g_new (gint32, e->n_prefill_pairs);
  for (gint32 l = 0; l < L; l++)
    {
      const gboolean own = l < e->n_prefill_pairs;
      e->prefill_k[l] = own ? buffer_new (e, pf_bytes, &local) : e->prefill_k[l % e->n_prefill_pairs];
      e->prefill_v[l] = own ? buffer_new (e, pf_bytes, &local) : e->prefill_v[l % e->n_prefill_pairs];
      e->decode_k[l] = buffer_new (e, dc_bytes, &local);
      e->decode_v[l] = buffer_new (e, dc_bytes, &local);
    }
  e->prefill_hk = g_new0 (guint8 *, L);
  e->prefill_hv = g_new0 (guint8 *, L);
  e->decode_hk = g_new0 (guint8 *, L);
  e->decode_hv = g_new0 (guint8 *, L);
  for (gint32 l = 0; l < L && local == NULL; l++)
    {
      const gboolean own = l < e->n_prefill_pairs;
      e->prefill_hk[l] = own ? image_new (e, e->prefill_k[l], pf_bytes) : e->prefill_hk[l % e->n_prefill_pairs];
      e->prefill_hv[l] = own ? image_new (e, e->prefill_v[l], pf_bytes) : e->prefill_hv[l % e->n_prefill_pairs];
      e->decode_hk[l] = image_new (e, e->decode_k[l], dc_bytes);
      e->decode_hv[l] = image_new (e, e->decode_v[l], dc_bytes);
    }
  for (gint32 i = 0; i < e->n_prefill_pairs; i++)
    e->prefill_owner[i] = -1;
  e->prefill_pos = g_new0 (gint64, L);
  e->prefill_len = g_new0 (gint32, L);
  e->decode_start = g_new0 (gint32, L);
  e->decode_len = g_new0 (gint32, L);
  e->max_q = MAX (s->chunk_size, SIFT_ATTN_DECODE_MAX_ROWS);
  e->part_out = (float *) (void *) buffer_new (e, sizeof (float) * (gsize) s->n_q_heads * (gsize) e->max_q
                                                  * (gsize) s->head_dim, &local);
  e->part_lse = (float *) (void *) buffer_new (e, sizeof (float) * (gsize) s->n_q_heads * (gsize) e->max_q, &local);
  if (!e->host_compute)
    {
      const gsize rows = (gsize) s->n_q_heads * (gsize) e->max_q;
      e->call_q = (float *) (void *) buffer_new (e, sizeof (float) * rows * (gsize) s->head_dim, &local);
      e->call_out = (float *) (void *) buffer_new (e, sizeof (float) * rows * (gsize) s->head_dim, &local);
      e->call_lse = (float *) (void *) buffer_new (e, sizeof (float) * rows, &local);
    }
  sift_engine_ring_init (e);
  /* Prefetch across calls: on a GPU (SIFT_ENGINE_NO_PREFETCH=1 turns it
   * off, a test and benchmark hook, read here). */
  e->prefetch = !e->host_compute && g_strcmp0 (g_getenv ("SIFT_ENGINE_NO_PREFETCH"), "1") != 0;
  e->ring_all = g_new0 (gboolean, L);
  sift_engine_xl_init (e);
  sift_engine_evict_init (e);
  sift_engine_resident_init (e);
  if (local != NULL)
    {
      g_propagate_error (error, local);
      sift_engine_free (e);
      return NULL;
    }
  return e;
}

void
sift_engine_free (SiftEngine *e)
{
  if (e == NULL)
    return;
  SiftBackend *b = e->backend;
  b->ops->drain (b, FALSE);
  sift_engine_ring_free (e);
  g_free (e->ring_all);
  sift_engine_xl_free (e);
  sift_engine_resident_free (e);
  g_clear_error (&e->store_error);
  sift_engine_evict_free (e);
  sift_engine_blocks_free (e);
  g_free (e->prefill_k);
  g_free (e->prefill_v);
  g_free (e->prefill_owner);
  g_free (e->decode_k);
  g_free (e->decode_v);
  for (guint i = 0; i < e->images->len; i++)
    b->ops->host_free (b, g_ptr_array_index (e->images, i), g_array_index (e->image_sizes, gsize, i));
  g_ptr_array_unref (e->images);
  g_array_unref (e->image_sizes);
  g_free (e->prefill_hk);
  g_free (e->prefill_hv);
  g_free (e->decode_hk);
  g_free (e->decode_hv);
  g_free (e->prefill_pos);
  g_free (e->prefill_len);
  g_free (e->decode_start);
  g_free (e->decode_len);
  g_free (e->counters);
  sift_engine_attend_free (e);
  g_free (e->q_gather);
  for (guint i = 0; i < e->buffers->len; i++)
    b->ops->buffer_free (b, &g_array_index (e->buffers, SiftBuffer, i));
  g_array_unref (e->buffers);
  b->ops->free (b);
  pthread_mutex_destroy (&e->lock);
  g_free (e);
}

void
sift_engine_reset (SiftEngine *e)
{
  g_return_if_fail (e != NULL);
  const SiftModelShape *s = &e->config.shape;
  /* Every transfer finished, and stores run again after a failed one. */
  e->backend->ops->drain (e->backend, TRUE);
  sift_engine_ring_clear (e);
  memset (e->ring_all, 0, sizeof (gboolean) * (gsize) s->n_layers);
  sift_engine_blocks_clear (e);
  sift_engine_evict_clear (e);
  sift_engine_resident_clear (e);
  const gint32 L = s->n_layers;
  const gsize pf_bytes = (gsize) s->n_kv_heads * (gsize) s->chunk_size * (gsize) s->head_dim * e->es;
  const gsize dc_bytes = (gsize) s->n_kv_heads * (gsize) e->decode_cap * (gsize) s->head_dim * e->es;
  for (gint32 i = 0; i < e->n_prefill_pairs; i++)
    {
      e->backend->ops->buffer_clear (e->backend, e->prefill_k[i], pf_bytes);
      e->backend->ops->buffer_clear (e->backend, e->prefill_v[i], pf_bytes);
      if (!e->host_compute)
        {
          memset (e->prefill_hk[i], 0, pf_bytes);
          memset (e->prefill_hv[i], 0, pf_bytes);
        }
      e->prefill_owner[i] = -1;
    }
  for (gint32 l = 0; l < L; l++)
    {
      e->backend->ops->buffer_clear (e->backend, e->decode_k[l], dc_bytes);
      e->backend->ops->buffer_clear (e->backend, e->decode_v[l], dc_bytes);
      if (!e->host_compute)
        {
          memset (e->decode_hk[l], 0, dc_bytes);
          memset (e->decode_hv[l], 0, dc_bytes);
        }
      e->prefill_pos[l] = 0;
      e->prefill_len[l] = e->decode_start[l] = e->decode_len[l] = 0;
    }
  sift_engine_xl_clear (e);
  g_clear_error (&e->store_error);
  memset (e->counters, 0, sizeof (SiftCounters) * (gsize) L * 2);
  e->policy_name = NULL;
  e->phase = SIFT_PHASE_PREFILL;
}

const SiftEngineConfig *
sift_engine_config (const SiftEngine *e)
{
  g_return_val_if_fail (e != NULL, NULL);
  return &e->config;
}

void
sift_engine_begin_call (SiftEngine *e, SiftPhase phase, const char *policy_name)
{
  e->phase = phase;
  e->policy_name = policy_name;
}

