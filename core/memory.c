/* Large aligned buffers, backed by transparent huge pages where the kernel
 * allows (include/sift/memory.h). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <sift/memory.h>

void *
sift_mem_alloc (gsize bytes)
{
  if (bytes > (gsize) PTRDIFF_MAX - SIFT_HUGE_PAGE_BYTES) /* no object is larger than PTRDIFF_MAX */
    return NULL;
  const gboolean huge = bytes >= SIFT_HUGE_PAGE_BYTES;
  const gsize align = huge ? SIFT_HUGE_PAGE_BYTES : 64;
  /* Whole huge pages, so that the last one is not shared with malloc's
   * other users (madvise covers it entirely). */
  const gsize n = huge ? (bytes + align - 1) / align * align : MAX (bytes, 1);
  void *p = NULL;
  if (posix_memalign (&p, align, n) != 0)
    return NULL;
#ifdef MADV_HUGEPAGE
  if (huge)
    (void) madvise (p, n, MADV_HUGEPAGE); /* a hint: without it 4 KiB pages serve */
#endif
  return p;
}

void *
sift_mem_alloc0 (gsize bytes)
{
  void *p = sift_mem_alloc (bytes);
  if (p != NULL)
    memset (p, 0, MAX (bytes, 1));
  return p;
}

void
sift_mem_free (void *p)
{
  free (p);
}

static gsize
map_size (gsize bytes)
{
  return (MAX (bytes, 1) + 4095) / 4096 * 4096;
}

void *
sift_mem_map0 (gsize bytes)
{
  if (bytes > (gsize) PTRDIFF_MAX - 4096)
    return NULL;
  void *p = mmap (NULL, map_size (bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
#ifdef MADV_HUGEPAGE
  if (bytes >= SIFT_HUGE_PAGE_BYTES)
    (void) madvise (p, map_size (bytes), MADV_HUGEPAGE); /* a hint */
#endif
  return p;
}

void
sift_mem_unmap (void *p, gsize bytes)
{
  if (p != NULL)
    munmap (p, map_size (bytes));
}

void
sift_mem_discard (void *p, gsize bytes)
{
  const guintptr lo = ((guintptr) p + 4095) / 4096 * 4096, hi = ((guintptr) p + bytes) / 4096 * 4096;
  if (p != NULL && hi > lo)
    (void) madvise ((void *) lo, hi - lo, MADV_DONTNEED); /* a hint: on failure the pages stay */
}
