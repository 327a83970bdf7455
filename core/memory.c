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
