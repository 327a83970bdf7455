/* The CPU backend: compute memory and host memory are RAM, transfers run on
 * one copy worker thread (worker.c), attention runs on the core kernels
 * (sift_attn_paged, sift_attn_merge). Zero-copy: a store that keeps its
 * blocks in RAM in the compute dtype is read in place. */
#include <stdlib.h>
#include <string.h>

#include <sift/memory.h>

#include "backend-cpu-private.h"

/* From here on a buffer is its own anonymous mapping. */
#define MAPPED_BYTES ((gsize) 64 << 10)

/* Zeroed, 4096-byte aligned (O_DIRECT's staging). From 64 KiB on an
 * anonymous mapping (sift_mem_map0), which the kernel zeroes as each page
 * is first touched: a buffer sized for a whole chunk (a prefill K and V,
 * 1 MiB each at 512 tokens) is resident only as far as steps fill it,
 * instead of all of it from the start; from 2 MiB on it asks for huge
 * pages (a hint). */
static void *
cpu_host_alloc (SiftBackend *backend, gsize size)
{
  (void) backend;
  void *p = NULL;
  if (size >= MAPPED_BYTES)
    p = sift_mem_map0 (size);
  else if (posix_memalign (&p, 4096, MAX (size, 1)) == 0)
    memset (p, 0, MAX (size, 1));
  else
    p = NULL;
  if (p == NULL)
    g_error ("engine: out of memory (%" G_GSIZE_FORMAT " bytes)", size);
  return p;
}

static void
cpu_host_free (SiftBackend *backend, void *p, gsize size)
{
  (void) backend;
  if (p == NULL)
    return;
  if (size >= MAPPED_BYTES)
    sift_mem_unmap (p, size);
  else
    free (p);
}

static gboolean
cpu_buffer_alloc (SiftBackend *backend, gsize size, SiftBuffer *out, GError **error)
{
  (void) error;
  *out = (SiftBuffer) { SIFT_MEMORY_HOST, cpu_host_alloc (backend, size), size, NULL };
  return TRUE;
}

static void
cpu_buffer_free (SiftBackend *backend, SiftBuffer *buf)
{
  cpu_host_free (backend, buf->data, buf->size);
  *buf = (SiftBuffer) { 0 };
}

static void
cpu_buffer_write (SiftBackend *backend, guint8 *dst, const void *src, gsize n)
{
  (void) backend;
  memcpy (dst, src, n);
}

static void
cpu_buffer_move (SiftBackend *backend, guint8 *dst, const guint8 *src, gsize n)
{
  (void) backend;
  memmove (dst, src, n);
}

static void
cpu_buffer_move_rows (SiftBackend *backend, guint8 *dst, gsize dst_pitch, const guint8 *src, gsize src_pitch,
                      gsize width, gsize rows)
{
  (void) backend;
  for (gsize r = 0; r < rows; r++)
    memmove (dst + r * dst_pitch, src + r * src_pitch, width);
}

static void
cpu_buffer_clear (SiftBackend *backend, guint8 *dst, gsize n)
{
  (void) backend;
  memset (dst, 0, n);
}

static gboolean
cpu_can_map (SiftBackend *backend, SiftStore *store, SiftDType compute_dtype)
{
  (void) backend;
  return store->config.dtype == compute_dtype && sift_store_can_map (store);
}

static gboolean
cpu_attend (SiftBackend *backend, const SiftView *q, const SiftView *k, const SiftView *v, gsize n,
            const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error)
{
  (void) backend;
  return sift_attn_paged (q, k, v, n, opts, out, lse, error);
}

static gboolean
cpu_merge (SiftBackend *backend, SiftView *out, float *lse, const SiftView *part, const float *part_lse,
           GError **error)
{
  (void) backend;
  return sift_attn_merge (out, lse, part, part_lse, error);
}

static gboolean
cpu_buffer_read (SiftBackend *backend, void *dst, const guint8 *src, gsize n, GError **error)
{
  (void) backend, (void) error;
  memcpy (dst, src, n);
  return TRUE;
}

static void
cpu_free (SiftBackend *backend)
{
  CpuBackend *b = (CpuBackend *) backend;
  sift_cpu_drain (backend, FALSE);
  sift_cpu_worker_stop (b);
  cpu_host_free (backend, b->staging, b->staging_bytes);
  cpu_host_free (backend, b->help_staging, b->staging_bytes);
  g_free (b);
}

static const SiftBackendOps cpu_ops = {
  .version = SIFT_BACKEND_VERSION,
  .struct_size = sizeof (SiftBackendOps),
  .name = "cpu",
  .free = cpu_free,
  .buffer_alloc = cpu_buffer_alloc,
  .buffer_free = cpu_buffer_free,
  .buffer_write = cpu_buffer_write,
  .buffer_move = cpu_buffer_move,
  .buffer_clear = cpu_buffer_clear,
  .host_alloc = cpu_host_alloc,
  .host_free = cpu_host_free,
  .can_map = cpu_can_map,
  .submit = sift_cpu_submit,
  .event_new = sift_cpu_event_new,
  .event_free = sift_cpu_event_free,
  .event_query = sift_cpu_event_query,
  .event_wait = sift_cpu_event_wait,
  .drain = sift_cpu_drain,
  .attend = cpu_attend,
  .merge = cpu_merge,
  .buffer_read = cpu_buffer_read,
  .buffer_move_rows = cpu_buffer_move_rows,
  .timings = NULL,
};

SiftBackend *
sift_backend_cpu_new (const SiftBackendSetup *setup)
{
  g_return_val_if_fail (setup != NULL && setup->store != NULL && setup->sink.done != NULL, NULL);
  CpuBackend *b = g_new0 (CpuBackend, 1);
  b->parent.ops = &cpu_ops;
  b->parent.setup = *setup;
  b->store = setup->store;
  b->shape = setup->shape;
  b->compute = setup->compute_dtype;
  b->es = sift_dtype_size (setup->compute_dtype);
  b->staging_bytes = (b->store->block_bytes + 4095) / 4096 * 4096;
  b->staging = cpu_host_alloc (&b->parent, b->staging_bytes);
  b->help_staging = cpu_host_alloc (&b->parent, b->staging_bytes);
  sift_cpu_worker_start (b);
  return &b->parent;
}
