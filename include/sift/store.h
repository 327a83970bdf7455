/* sift — block stores (memory tiers).
 *
 * A store keeps fixed-size blocks addressed by id. One stored block holds one
 * layer's K and V for block_size tokens, each [kv_heads][block_size][head_dim]
 * in the store's dtype (K first, then V; q8_0 packs each head's rows in
 * blocks of 32). Several engines (sequences) may share one store: ids come
 * from the store's allocator and never collide. Every byte that moves between
 * tiers moves inside the OffloadEngine; policies never call a store. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/dtype.h>
#include <sift/error.h>

G_BEGIN_DECLS

typedef struct _SiftStore SiftStore;

typedef struct {
  SiftDType dtype;          /* stored dtype: f32, f16, bf16, q8_0 (head_dim % 32 == 0) */
  gint32 n_kv_heads;
  gint32 block_size;
  gint32 head_dim;
  gint64 capacity_blocks;   /* 0: grow on demand (host) or without limit (file, until the disk is full) */
  const char *path;         /* file store: the backing file, created (and sized) by the store */
  gboolean keep;            /* file store: keep the file after free */
  gboolean direct;          /* file store: O_DIRECT (aligned buffers) */
} SiftStoreConfig;

/* The small interface every tier implements (tests wrap it to inject faults). */
typedef struct {
  const char *name;  /* "host", "file" */
  /* Writes a whole block (block_bytes) to id. */
  gboolean (*write) (SiftStore *store, gint64 id, const void *src, GError **error);
  /* Reads n bytes at byte offset `offset` inside block id (K-only loads read the first half). */
  gboolean (*read) (SiftStore *store, gint64 id, gsize offset, void *dst, gsize n, GError **error);
  /* Makes room for ids < n_blocks (file: extends the file). */
  gboolean (*reserve) (SiftStore *store, gint64 n_blocks, GError **error);
  void (*finalize) (SiftStore *store);
} SiftStoreClass;

SIFT_API SiftStore *sift_store_host_new (const SiftStoreConfig *config, GError **error);
SIFT_API SiftStore *sift_store_file_new (const SiftStoreConfig *config, GError **error);
SIFT_API void sift_store_free (SiftStore *store);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftStore, sift_store_free)

SIFT_API const SiftStoreConfig *sift_store_config (const SiftStore *store);
SIFT_API const char *sift_store_name (const SiftStore *store);
/* Bytes of one stored block (K and V). */
SIFT_API gsize sift_store_block_bytes (const SiftStore *store);
/* Allocates a block id (reusing freed ones first); release returns it. */
SIFT_API gboolean sift_store_alloc (SiftStore *store, gint64 *id_out, GError **error);
SIFT_API void sift_store_release (SiftStore *store, gint64 id);
SIFT_API gint64 sift_store_blocks_in_use (const SiftStore *store);

G_END_DECLS
