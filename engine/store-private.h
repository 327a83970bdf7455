/* Block stores: the base every tier extends, and the calls the engine uses.
 * Private to libsift (tests include it to wrap a store and inject faults). */
#pragma once

#include <pthread.h>

#include <sift/store.h>

struct _SiftStore {
  const SiftStoreClass *klass;
  SiftStoreConfig config;   /* config.path owned (a copy) */
  gsize block_bytes;        /* K and V of one block, in the stored dtype */
  gsize k_bytes;            /* the K half: [n_kv_heads][block_size][row bytes] */
  pthread_mutex_t lock;              /* guards the allocator below */
  gint64 next_id;           /* ids below were handed out at least once */
  gint64 reserved;          /* ids below have room (klass->reserve) */
  GArray *free_ids;         /* gint64, released ids reused first */
  gint64 in_use;
};

/* Allocates instance_size zeroed bytes (>= sizeof (SiftStore)), checks the
 * config and fills the base. */
SiftStore *sift_store_construct (gsize instance_size, const SiftStoreClass *klass,
                                 const SiftStoreConfig *config, GError **error);

/* Range-checked calls through the class. */
gboolean sift_store_write (SiftStore *store, gint64 id, const void *src, GError **error);
gboolean sift_store_read (SiftStore *store, gint64 id, gsize offset, void *dst, gsize n,
                          GError **error);
/* Bytes of one stored row of head_dim elements. */
gsize sift_store_row_bytes (const SiftStore *store);
/* Whether a file store's I/O goes through io_uring (FALSE for other stores). */
gboolean sift_store_file_uses_uring (const SiftStore *store);
