/* The host store: blocks in RAM, each 64-byte aligned. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sift/error.h>

#include "store-private.h"

typedef struct {
  SiftStore parent;
  GPtrArray *blocks;  /* void * [reserved], block_bytes each; guarded by parent.lock */
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
  while ((gint64) self->blocks->len < n_blocks)
    {
      void *p = NULL;
      if (posix_memalign (&p, 64, store->block_bytes) != 0)
        {
          g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_FULL,
                       "host store: out of memory reserving block %u (%" G_GSIZE_FORMAT " bytes)",
                       self->blocks->len, store->block_bytes);
          return FALSE;
        }
      memset (p, 0, store->block_bytes);
      g_ptr_array_add (self->blocks, p);
    }
  return TRUE;
}

static void
host_finalize (SiftStore *store)
{
  g_ptr_array_unref (((HostStore *) store)->blocks);
}

static const SiftStoreClass host_class = {
  .name = "host",
  .write = host_write,
  .read = host_read,
  .reserve = host_reserve,
  .finalize = host_finalize,
};

gboolean
sift_store_can_map (const SiftStore *store)
{
  return store->klass == &host_class;
}

const guint8 *
sift_store_map (SiftStore *store, gint64 id)
{
  if (store->klass != &host_class || id < 0)
    return NULL;
  HostStore *self = (HostStore *) store;
  pthread_mutex_lock (&store->lock);
  const guint8 *p = id < (gint64) self->blocks->len ? g_ptr_array_index (self->blocks, (guint) id) : NULL;
  pthread_mutex_unlock (&store->lock);
  return p;
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
  self->blocks = g_ptr_array_new_with_free_func (free);
  return &self->parent;
}
