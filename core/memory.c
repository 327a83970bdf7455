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

/* Whole 4 KiB pages; from SIFT_HUGE_PAGE_BYTES on, whole huge pages. */
static gsize
map_size (gsize bytes)
{
  const gsize unit = bytes >= SIFT_HUGE_PAGE_BYTES ? SIFT_HUGE_PAGE_BYTES : 4096;
  return (MAX (bytes, 1) + unit - 1) / unit * unit;
}

void *
sift_mem_map0 (gsize bytes)
{
  if (bytes > (gsize) PTRDIFF_MAX - 2 * SIFT_HUGE_PAGE_BYTES)
    return NULL;
  const gsize n = map_size (bytes);
  const gboolean huge = bytes >= SIFT_HUGE_PAGE_BYTES;
  /* Huge pages need 2 MiB aligned ranges: map one huge page more and
   * unmap the ends around an aligned start. */
  const gsize span = huge ? n + SIFT_HUGE_PAGE_BYTES : n;
  guint8 *p = mmap (NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  if (!huge)
    return p;
  guint8 *a = (guint8 *) (((guintptr) p + SIFT_HUGE_PAGE_BYTES - 1) / SIFT_HUGE_PAGE_BYTES * SIFT_HUGE_PAGE_BYTES);
  if (a > p)
    munmap (p, (gsize) (a - p));
  if (a + n < p + span)
    munmap (a + n, (gsize) (p + span - (a + n)));
#ifdef MADV_HUGEPAGE
  (void) madvise (a, n, MADV_HUGEPAGE); /* a hint */
#endif
  return a;
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
