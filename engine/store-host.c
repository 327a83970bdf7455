/* The host store: blocks in RAM, each 64-byte aligned, carved out of the
 * chunks that each reserve call allocates (one chunk per call; the store
 * reserves geometrically, so chunks soon span many huge pages:
 * include/sift/memory.h). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sift/error.h>
#include <sift/memory.h>

#include "store-private.h"

typedef struct {
  SiftStore parent;
  GPtrArray *blocks;  /* void * [reserved], block_bytes each, inside chunks; guarded by parent.lock */
  GPtrArray *chunks;  /* runs of blocks, owned: sift_mem_map0'd, or from memory_alloc */
  GArray *chunk_sizes; /* gsize [chunks] */
  /* Where chunks come from once set (a GPU backend's pinned memory); NULL:
   * sift_mem_map0, so that a chunk reserved ahead is resident only as far
   * as blocks are written (docs/benchmarks.md, "Peak resident memory"). */
  void *(*memory_alloc) (gsize size);
  void (*memory_free) (void *p, gsize size);
} HostStore;

static void *
block_at (HostStore *self, gint64 id)
{
  pthread_mutex_lock (&self->parent.lock);
  void *p = g_ptr_array_index (self->blocks, (guint) id);
  pthread_mutex_unlock (&self->parent.lock);
  return p;
}

static gboolean
host_write (SiftStore *store, gint64 id, const void *src, GError **error)
{
  (void) error;
  memcpy (block_at ((HostStore *) store, id), src, store->block_bytes);
  return TRUE;
}

static gboolean
host_read (SiftStore *store, gint64 id, gsize offset, void *dst, gsize n, GError **error)
{
  (void) error;
  memcpy (dst, (const char *) block_at ((HostStore *) store, id) + offset, n);
  return TRUE;
}

/* Called with parent.lock held (by the allocator). */
static gboolean
host_reserve (SiftStore *store, gint64 n_blocks, GError **error)
{
  HostStore *self = (HostStore *) store;
  /* Past physical memory the allocations still succeed (overcommit) and
   * the kernel kills the process later: refuse while it can be said. */
  const long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
  if (pages > 0 && page > 0 && (double) n_blocks * (double) store->block_bytes > (double) pages * (double) page)
    {
      g_autofree char *have = g_format_size ((guint64) pages * (guint64) page);
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_FULL,
                   "host store: %" G_GINT64_FORMAT " blocks of %" G_GSIZE_FORMAT " bytes exceed this machine's "
                   "memory (%s); keep the KV in a file store", n_blocks, store->block_bytes, have);
      return FALSE;
    }
  if (n_blocks <= (gint64) self->blocks->len)
    return TRUE;
  const gsize n_new = (gsize) (n_blocks - (gint64) self->blocks->len);
  const gsize stride = (store->block_bytes + 63) / 64 * 64; /* each block 64-byte aligned */
  guint8 *chunk = NULL;
  if (n_new <= G_MAXSIZE / stride)
    chunk = self->memory_alloc != NULL ? self->memory_alloc (n_new * stride) : sift_mem_map0 (n_new * stride);
  if (chunk == NULL)
    {
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_FULL,
                   "host store: out of memory reserving blocks %u..%" G_GINT64_FORMAT " (%" G_GSIZE_FORMAT
                   " bytes each)", self->blocks->len, n_blocks - 1, store->block_bytes);
      return FALSE;
    }
  g_ptr_array_add (self->chunks, chunk);
  const gsize size = n_new * stride;
  g_array_append_val (self->chunk_sizes, size);
  for (gsize i = 0; i < n_new; i++)
    g_ptr_array_add (self->blocks, chunk + i * stride);
  return TRUE;
}

static void
host_finalize (SiftStore *store)
{
  HostStore *self = (HostStore *) store;
  for (guint i = 0; i < self->chunks->len; i++)
    {
      void *chunk = g_ptr_array_index (self->chunks, i);
      if (self->memory_alloc != NULL)
        self->memory_free (chunk, g_array_index (self->chunk_sizes, gsize, i));
      else
        sift_mem_unmap (chunk, g_array_index (self->chunk_sizes, gsize, i));
    }
  g_ptr_array_unref (self->blocks);
  g_ptr_array_unref (self->chunks);
  g_array_unref (self->chunk_sizes);
}

static const SiftStoreClass host_class = {
  .name = "host",
  .write = host_write,
  .read = host_read,
  .reserve = host_reserve,
  .finalize = host_finalize,
};

gboolean
sift_store_host_use_memory (SiftStore *store, void *(*alloc) (gsize size), void (*release) (void *p, gsize size))
{
  if (store->klass != &host_class)
    return FALSE;
  HostStore *self = (HostStore *) store;
  pthread_mutex_lock (&store->lock);
  gboolean ok = self->chunks->len == 0 || self->memory_alloc == alloc;
  if (self->chunks->len == 0)
    {
      self->memory_alloc = alloc;
      self->memory_free = release;
    }
  pthread_mutex_unlock (&store->lock);
  return ok;
}

gboolean
sift_store_can_map (const SiftStore *store)
{
  return store->klass == &host_class;
}

const guint8 *
sift_store_map (SiftStore *store, gint64 id)
{
  const guint8 *p = NULL;
  return sift_store_map_many (store, &id, 1, &p) ? p : NULL;
}

gboolean
sift_store_peek (SiftStore *store, gint64 id, gsize offset, gsize n, const guint8 **out, GError **error)
{
  *out = NULL;
  if (!sift_store_check_range (store, id, offset, n, error))
    return FALSE;
  const guint8 *p = sift_store_map (store, id);
  *out = p != NULL ? p + offset : NULL;
  return TRUE;
}

gboolean
sift_store_map_many (SiftStore *store, const gint64 *ids, gsize n, const guint8 **out)
{
  if (store->klass != &host_class)
    return FALSE;
  HostStore *self = (HostStore *) store;
  gboolean ok = TRUE;
  pthread_mutex_lock (&store->lock);
  for (gsize i = 0; i < n && ok; i++)
    {
      ok = ids[i] >= 0 && ids[i] < (gint64) self->blocks->len;
      out[i] = ok ? g_ptr_array_index (self->blocks, (guint) ids[i]) : NULL;
    }
  pthread_mutex_unlock (&store->lock);
  return ok;
}

SiftStore *
sift_store_host_new (const SiftStoreConfig *config, GError **error)
{
  HostStore *self = (HostStore *) sift_store_construct (sizeof (HostStore), &host_class, config, error);
  if (self == NULL)
    return NULL;
  self->blocks = g_ptr_array_new ();
  self->chunks = g_ptr_array_new ();
  self->chunk_sizes = g_array_new (FALSE, FALSE, sizeof (gsize));
  return &self->parent;
}
