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
/* The checks of sift_store_read (the id was allocated, the range inside a block). */
gboolean sift_store_check_range (SiftStore *store, gint64 id, gsize offset, gsize n, GError **error);
/* The same range of the block in place (*out), when the store keeps it
 * addressable in memory (the host store: a load converts from there, no
 * copy into staging first); *out NULL when it does not (then read). FALSE
 * with the read's error for a bad id or range. */
gboolean sift_store_peek (SiftStore *store, gint64 id, gsize offset, gsize n, const guint8 **out,
                          GError **error);
/* Bytes of one stored row of head_dim elements. */
gsize sift_store_row_bytes (const SiftStore *store);
/* The block's bytes in place (K at 0, V at k_bytes) when the store keeps
 * it addressable in memory (the host store), else NULL. The address stays
 * valid while the store lives; the bytes change when the block is written
 * (the engine unmaps its slots before it writes or releases a block). */
const guint8 *sift_store_map (SiftStore *store, gint64 id);
/* sift_store_map of n ids under one lock: out[i] for ids[i]; FALSE (out
 * unspecified) when one cannot be mapped. */
gboolean sift_store_map_many (SiftStore *store, const gint64 *ids, gsize n, const guint8 **out);
/* Whether sift_store_map works for this store's blocks. */
gboolean sift_store_can_map (const SiftStore *store);
/* Whether a file store's I/O goes through io_uring (FALSE for other stores). */
gboolean sift_store_file_uses_uring (const SiftStore *store);
/* Host store: the chunks it reserves from now on come from alloc (zeroed)
 * and go back through release (a GPU backend's pinned memory, so copies
 * run straight from the stored blocks). FALSE when it is no host store or
 * already holds chunks of other memory (then nothing changes). */
gboolean sift_store_host_use_memory (SiftStore *store, void *(*alloc) (gsize size),
                                     void (*release) (void *p, gsize size));
