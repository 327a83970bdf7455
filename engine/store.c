/* Block stores: configuration checks, the id allocator shared by every
 * engine using one store, and the range-checked read/write entry points. */
#include <string.h>

#include <sift/error.h>

#include "store-private.h"

static gboolean
check_config (const SiftStoreConfig *c, GError **error)
{
  const char *why = NULL;
  if (c->dtype != SIFT_DTYPE_F32 && c->dtype != SIFT_DTYPE_F16 && c->dtype != SIFT_DTYPE_BF16
      && c->dtype != SIFT_DTYPE_Q8_0)
    why = "dtype is not f32, f16, bf16 or q8_0";
  else if (c->n_kv_heads <= 0 || c->block_size <= 0 || c->head_dim <= 0)
    why = "n_kv_heads, block_size and head_dim must be positive";
  else if (c->dtype == SIFT_DTYPE_Q8_0 && c->head_dim % SIFT_Q8_0_BLOCK != 0)
    why = "q8_0 needs a head_dim that is a multiple of 32";
  else if (c->capacity_blocks < 0)
    why = "capacity_blocks is negative";
  if (why == NULL)
    return TRUE;
  g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_INVALID,
               "store: %s (dtype %d, kv_heads %d, block_size %d, head_dim %d)", why, (int) c->dtype,
               c->n_kv_heads, c->block_size, c->head_dim);
  return FALSE;
}

SiftStore *
sift_store_construct (gsize instance_size, const SiftStoreClass *klass, const SiftStoreConfig *config,
                      GError **error)
{
  g_return_val_if_fail (instance_size >= sizeof (SiftStore) && klass != NULL && config != NULL, NULL);
  if (!check_config (config, error))
    return NULL;
  SiftStore *s = g_malloc0 (instance_size);
  s->klass = klass;
  s->config = *config;
  s->config.path = g_strdup (config->path);
  s->k_bytes = (gsize) config->n_kv_heads * (gsize) config->block_size
               * sift_dtype_row_bytes (config->dtype, (gsize) config->head_dim);
  s->block_bytes = 2 * s->k_bytes;
  pthread_mutex_init (&s->lock, NULL);
  s->free_ids = g_array_new (FALSE, FALSE, sizeof (gint64));
  return s;
}

void
sift_store_free (SiftStore *store)
{
  if (store == NULL)
    return;
  if (store->klass->finalize != NULL)
    store->klass->finalize (store);
  g_array_unref (store->free_ids);
  pthread_mutex_destroy (&store->lock);
  g_free ((char *) store->config.path);
  g_free (store);
}

const SiftStoreConfig *
sift_store_config (const SiftStore *store)
{
  g_return_val_if_fail (store != NULL, NULL);
  return &store->config;
}

const char *
sift_store_name (const SiftStore *store)
{
  g_return_val_if_fail (store != NULL, NULL);
  return store->klass->name;
}

gsize
sift_store_block_bytes (const SiftStore *store)
{
  g_return_val_if_fail (store != NULL, 0);
  return store->block_bytes;
}

gsize
sift_store_row_bytes (const SiftStore *store)
{
  return sift_dtype_row_bytes (store->config.dtype, (gsize) store->config.head_dim);
}

gboolean
sift_store_alloc (SiftStore *store, gint64 *id_out, GError **error)
{
  g_return_val_if_fail (store != NULL && id_out != NULL, FALSE);
  pthread_mutex_lock (&store->lock);
  gboolean ok = TRUE;
  if (store->free_ids->len > 0)
    {
      *id_out = g_array_index (store->free_ids, gint64, store->free_ids->len - 1);
      g_array_set_size (store->free_ids, store->free_ids->len - 1);
    }
  else if (store->config.capacity_blocks > 0 && store->next_id >= store->config.capacity_blocks)
    {
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_FULL,
                   "%s store is full: all %" G_GINT64_FORMAT " blocks are in use", store->klass->name,
                   store->config.capacity_blocks);
      ok = FALSE;
    }
  else
    {
      if (store->next_id >= store->reserved)
        {
          /* Grow geometrically so a long sequence reserves O(log n) times. */
          gint64 want = MAX (store->reserved * 2, 16);
          if (store->config.capacity_blocks > 0)
            want = MIN (want, store->config.capacity_blocks);
          ok = store->klass->reserve (store, want, error);
          if (!ok && want > store->next_id + 1)
            {
              /* The doubled size may not fit (memory, disk) where the next block still does. */
              g_clear_error (error);
              want = store->next_id + 1;
              ok = store->klass->reserve (store, want, error);
            }
          if (ok)
            store->reserved = want;
        }
      if (ok)
        *id_out = store->next_id++;
    }
  if (ok)
    store->in_use++;
  pthread_mutex_unlock (&store->lock);
  return ok;
}

void
sift_store_release (SiftStore *store, gint64 id)
{
  g_return_if_fail (store != NULL);
  pthread_mutex_lock (&store->lock);
  if (id >= 0 && id < store->next_id && store->in_use > 0)
    {
      g_array_append_val (store->free_ids, id);
      store->in_use--;
    }
  else
    g_critical ("sift_store_release: id %" G_GINT64_FORMAT " was never allocated", id);
  pthread_mutex_unlock (&store->lock);
}

gint64
sift_store_blocks_in_use (const SiftStore *store)
{
  g_return_val_if_fail (store != NULL, 0);
  SiftStore *s = (SiftStore *) store;
  pthread_mutex_lock (&s->lock);
  gint64 n = s->in_use;
  pthread_mutex_unlock (&s->lock);
  return n;
}

static gboolean
check_id (SiftStore *store, gint64 id, GError **error)
{
  pthread_mutex_lock (&store->lock);
  gint64 limit = store->next_id;
  pthread_mutex_unlock (&store->lock);
  if (id >= 0 && id < limit)
    return TRUE;
  g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_INVALID,
               "%s store: block id %" G_GINT64_FORMAT " was never allocated", store->klass->name, id);
  return FALSE;
}

gboolean
sift_store_write (SiftStore *store, gint64 id, const void *src, GError **error)
{
  return check_id (store, id, error) && store->klass->write (store, id, src, error);
}

gboolean
sift_store_check_range (SiftStore *store, gint64 id, gsize offset, gsize n, GError **error)
{
  if (!check_id (store, id, error))
    return FALSE;
  if (offset > store->block_bytes || n > store->block_bytes - offset)
    {
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_INVALID,
                   "%s store: read of %" G_GSIZE_FORMAT " bytes at %" G_GSIZE_FORMAT
                   " is outside a block of %" G_GSIZE_FORMAT " bytes",
                   store->klass->name, n, offset, store->block_bytes);
      return FALSE;
    }
  return TRUE;
}

gboolean
sift_store_read (SiftStore *store, gint64 id, gsize offset, void *dst, gsize n, GError **error)
{
  return sift_store_check_range (store, id, offset, n, error) && store->klass->read (store, id, offset, dst, n, error);
}

