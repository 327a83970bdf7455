/* The file store: blocks in a real file at id * stride, read and written
 * with pread/pwrite, or io_uring when built with liburing (SIFT_STORE_IO=pread
 * turns it off), optionally with O_DIRECT through aligned bounce buffers.
 * Before every access the file's size and inode are compared with what the
 * store made them: a file changed underneath is an error, not wrong data. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef SIFT_HAVE_LIBURING
#include <liburing.h>
#endif

#include <sift/error.h>

#include "store-private.h"

#define DIRECT_ALIGN 4096

typedef struct {
  SiftStore parent;
  int fd;
  gsize stride;        /* bytes from block id to id + 1 (block_bytes, or rounded to 4 KiB for O_DIRECT) */
  gint64 size;         /* file size the store set; guarded by parent.lock */
  dev_t dev;
  ino_t ino;
  gboolean uring;      /* io_uring for this store's reads and writes */
} FileStore;

#ifdef SIFT_HAVE_LIBURING
/* One ring per thread (the copy workers of several engines may share a
 * store); a thread whose ring cannot be set up falls back to pread. */
typedef struct {
  struct io_uring ring;
  gboolean ok;
} ThreadRing;

static void
thread_ring_free (gpointer p)
{
  ThreadRing *r = p;
  if (r->ok)
    io_uring_queue_exit (&r->ring);
  g_free (r);
}

static GPrivate thread_ring = G_PRIVATE_INIT (thread_ring_free);

static ThreadRing *
get_ring (void)
{
  ThreadRing *r = g_private_get (&thread_ring);
  if (r == NULL)
    {
      r = g_new0 (ThreadRing, 1);
      r->ok = io_uring_queue_init (4, &r->ring, 0) == 0;
      g_private_set (&thread_ring, r);
    }
  return r;
}

/* One read or write through the ring: bytes done or -errno. */
static gssize
uring_rw (int fd, gboolean write, void *buf, gsize n, gint64 off, gboolean *used)
{
  ThreadRing *r = get_ring ();
  *used = r->ok;
  if (!r->ok)
    return 0;
  struct io_uring_sqe *sqe = io_uring_get_sqe (&r->ring);
  if (write)
    io_uring_prep_write (sqe, fd, buf, (unsigned) n, (__u64) off);
  else
    io_uring_prep_read (sqe, fd, buf, (unsigned) n, (__u64) off);
  int rc = io_uring_submit (&r->ring);
  if (rc < 0)
    return rc;
  struct io_uring_cqe *cqe = NULL;
  do
    rc = io_uring_wait_cqe (&r->ring, &cqe);
  while (rc == -EINTR);
  if (rc < 0)
    return rc;
  gssize res = cqe->res;
  io_uring_cqe_seen (&r->ring, cqe);
  return res;
}
#endif

/* Reads or writes n bytes at off, looping over partial transfers. Returns
 * the bytes done (< n only at end of file) or -errno. */
static gssize
file_rw (FileStore *self, gboolean write, void *buf, gsize n, gint64 off)
{
  gsize done = 0;
  while (done < n)
    {
      gssize r;
      gboolean used = FALSE;
#ifdef SIFT_HAVE_LIBURING
      if (self->uring)
        r = uring_rw (self->fd, write, (char *) buf + done, MIN (n - done, (gsize) 1 << 30),
                      off + (gint64) done, &used);
#endif
      if (!used)
        r = write ? pwrite (self->fd, (char *) buf + done, n - done, off + (gint64) done)
                  : pread (self->fd, (char *) buf + done, n - done, off + (gint64) done);
      if (!used && r < 0)
        r = -errno;
      if (r == -EINTR || r == -EAGAIN)
        continue;
      if (r < 0)
        return r;
      if (r == 0)
        break;
      done += (gsize) r;
    }
  return (gssize) done;
}

static gboolean
io_error (FileStore *self, const char *what, gint64 id, int err, GError **error)
{
  int code = (err == ENOSPC || err == EFBIG || err == EDQUOT) ? SIFT_STORE_ERROR_FULL : SIFT_STORE_ERROR_IO;
  g_set_error (error, SIFT_STORE_ERROR, code, "file store %s: %s block %" G_GINT64_FORMAT ": %s",
               self->parent.config.path, what, id, g_strerror (err));
  return FALSE;
}

/* The size check: the file must still be the one the store created, with
 * the size it gave it. */
static gboolean
check_unchanged (FileStore *self, GError **error)
{
  struct stat fst, pst;
  pthread_mutex_lock (&self->parent.lock);
  gint64 size = self->size;
  pthread_mutex_unlock (&self->parent.lock);
  const char *path = self->parent.config.path;
  if (fstat (self->fd, &fst) != 0)
    {
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_IO, "file store %s: fstat: %s", path,
                   g_strerror (errno));
      return FALSE;
    }
  if (stat (path, &pst) != 0 || pst.st_ino != self->ino || pst.st_dev != self->dev)
    {
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_CHANGED,
                   "file store %s: the file was removed or replaced underneath the store", path);
      return FALSE;
    }
  if ((gint64) fst.st_size != size)
    {
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_CHANGED,
                   "file store %s: the file changed underneath the store (size %" G_GINT64_FORMAT
                   " bytes, expected %" G_GINT64_FORMAT ")",
                   path, (gint64) fst.st_size, size);
      return FALSE;
    }
  return TRUE;
}

static void *
bounce_new (gsize n)
{
  void *p = NULL;
  if (posix_memalign (&p, DIRECT_ALIGN, n) != 0)
    g_error ("file store: out of memory for a %" G_GSIZE_FORMAT "-byte bounce buffer", n);
  return p;
}

static gboolean
file_write (SiftStore *store, gint64 id, const void *src, GError **error)
{
  FileStore *self = (FileStore *) store;
  if (!check_unchanged (self, error))
    return FALSE;
  gsize n = store->block_bytes;
  void *buf = (void *) src;
  void *bounce = NULL;
  if (store->config.direct && ((guintptr) src % DIRECT_ALIGN != 0 || n % DIRECT_ALIGN != 0))
    {
      buf = bounce = bounce_new (self->stride);
      memcpy (bounce, src, n);
      memset ((char *) bounce + n, 0, self->stride - n);
      n = self->stride;
    }
  gssize r = file_rw (self, TRUE, buf, n, id * (gint64) self->stride);
  free (bounce);
  if (r < 0)
    return io_error (self, "writing", id, (int) -r, error);
  if ((gsize) r < n)
    return io_error (self, "writing", id, ENOSPC, error);
  return TRUE;
}

static gboolean
file_read (SiftStore *store, gint64 id, gsize offset, void *dst, gsize n, GError **error)
{
  FileStore *self = (FileStore *) store;
  if (!check_unchanged (self, error))
    return FALSE;
  gint64 base = id * (gint64) self->stride;
  gsize a0 = offset, a1 = offset + n;
  void *buf = dst, *bounce = NULL;
  if (store->config.direct)
    {
      a0 = offset / DIRECT_ALIGN * DIRECT_ALIGN;
      a1 = (offset + n + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
      if (a0 != offset || a1 != offset + n || (guintptr) dst % DIRECT_ALIGN != 0)
        buf = bounce = bounce_new (a1 - a0);
    }
  gssize r = file_rw (self, FALSE, buf, a1 - a0, base + (gint64) a0);
  if (r >= 0 && (gsize) r == a1 - a0 && bounce != NULL)
    memcpy (dst, (char *) bounce + (offset - a0), n);
  free (bounce);
  if (r < 0)
    return io_error (self, "reading", id, (int) -r, error);
  if ((gsize) r < a1 - a0)
    {
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_SHORT_READ,
                   "file store %s: short read of block %" G_GINT64_FORMAT ": %" G_GSSIZE_FORMAT
                   " of %" G_GSIZE_FORMAT " bytes",
                   store->config.path, id, r, a1 - a0);
      return FALSE;
    }
  return TRUE;
}

/* Called with parent.lock held (by the allocator). */
static gboolean
file_reserve (SiftStore *store, gint64 n_blocks, GError **error)
{
  FileStore *self = (FileStore *) store;
  gint64 want = n_blocks * (gint64) self->stride;
  if (want <= self->size)
    return TRUE;
  /* Allocate the space now so a full disk shows here, not in a later write. */
  int rc = fallocate (self->fd, 0, self->size, want - self->size) == 0 ? 0 : errno;
  if (rc == EOPNOTSUPP || rc == ENOSYS || rc == EINVAL)
    rc = ftruncate (self->fd, want) == 0 ? 0 : errno;
  if (rc != 0)
    {
      /* Keep the file at the size the check expects. */
      if (ftruncate (self->fd, self->size) != 0)
        g_warning ("file store %s: cannot restore size: %s", store->config.path, g_strerror (errno));
      int code = (rc == ENOSPC || rc == EFBIG || rc == EDQUOT) ? SIFT_STORE_ERROR_FULL : SIFT_STORE_ERROR_IO;
      g_set_error (error, SIFT_STORE_ERROR, code,
                   "file store %s: cannot grow to %" G_GINT64_FORMAT " blocks (%" G_GINT64_FORMAT " bytes): %s",
                   store->config.path, n_blocks, want, g_strerror (rc));
      return FALSE;
    }
  self->size = want;
  return TRUE;
}

static void
file_finalize (SiftStore *store)
{
  FileStore *self = (FileStore *) store;
  if (self->fd >= 0)
    close (self->fd);
  if (!store->config.keep && store->config.path != NULL)
    {
      /* Remove only the file this store created (not one put there since). */
      struct stat st;
      if (lstat (store->config.path, &st) == 0 && S_ISREG (st.st_mode) && st.st_ino == self->ino
          && st.st_dev == self->dev)
        unlink (store->config.path);
    }
}

/* The store truncates and later removes its file: it never takes one that
 * holds someone's data. An empty file, or with `keep` a store kept by an
 * earlier run, is taken; a device, a directory or another non-empty file
 * is refused. */
static gboolean
may_take (const SiftStoreConfig *config, GError **error)
{
  struct stat st;
  if (stat (config->path, &st) != 0)
    return TRUE; /* absent: created below (or open names the reason) */
  if (!S_ISREG (st.st_mode))
    {
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_INVALID,
                   "file store %s: exists and is not a regular file (offload.path names the store's own file)",
                   config->path);
      return FALSE;
    }
  if (st.st_size > 0 && !config->keep)
    {
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_INVALID,
                   "file store %s: a file of %" G_GINT64_FORMAT " bytes is already there; the store would "
                   "overwrite and then remove it (remove it, choose another offload.path, or set offload.keep "
                   "to reuse a kept store file)", config->path, (gint64) st.st_size);
      return FALSE;
    }
  return TRUE;
}

static const SiftStoreClass file_class = {
  .name = "file",
  .write = file_write,
  .read = file_read,
  .reserve = file_reserve,
  .finalize = file_finalize,
};

SiftStore *
sift_store_file_new (const SiftStoreConfig *config, GError **error)
{
  g_return_val_if_fail (config != NULL, NULL);
  if (config->path == NULL || config->path[0] == '\0')
    {
      g_set_error_literal (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_INVALID,
                           "file store: no path given");
      return NULL;
    }
  if (!may_take (config, error))
    return NULL;
  FileStore *self = (FileStore *) sift_store_construct (sizeof (FileStore), &file_class, config, error);
  if (self == NULL)
    return NULL;
  self->fd = -1;
  SiftStore *store = &self->parent;
  self->stride = config->direct
                   ? (store->block_bytes + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN
                   : store->block_bytes;
  struct stat st;
  int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | (config->direct ? O_DIRECT : 0);
  self->fd = open (config->path, flags, 0600);
  if (self->fd < 0 || fstat (self->fd, &st) != 0)
    {
      int err = errno;
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_IO, "file store %s: cannot create%s: %s",
                   config->path, config->direct ? " with O_DIRECT" : "", g_strerror (err));
      self->parent.config.keep = TRUE; /* nothing of ours to remove */
      if (self->fd >= 0)
        close (self->fd);
      self->fd = -1;
      sift_store_free (store);
      return NULL;
    }
  self->dev = st.st_dev;
  self->ino = st.st_ino;
#ifdef SIFT_HAVE_LIBURING
  self->uring = g_strcmp0 (g_getenv ("SIFT_STORE_IO"), "pread") != 0;
#endif
  return store;
}

gboolean
sift_store_file_uses_uring (const SiftStore *store)
{
  return store != NULL && store->klass == &file_class && ((const FileStore *) store)->uring;
}
