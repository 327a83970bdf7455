/* sift — memory for K/V and other large buffers. */
#pragma once

#include <glib.h>
#include <sift/api.h>

G_BEGIN_DECLS

/* Big enough for huge pages: buffers from this size on are aligned to it. */
#define SIFT_HUGE_PAGE_BYTES ((gsize) 2 << 20)

/* `bytes` of uninitialised memory, 64-byte aligned (one cache line). From
 * SIFT_HUGE_PAGE_BYTES on the buffer is 2 MiB aligned and asks the kernel
 * for transparent huge pages (madvise MADV_HUGEPAGE; it is a hint, honoured
 * when /sys/kernel/mm/transparent_hugepage/enabled says madvise or always).
 * A decode step streams every K/V row of a long context once: with 4 KiB
 * pages it takes a TLB miss every 16 rows of 256 bytes, and the kernel's
 * prefetches wait on the page walks (docs/benchmarks.md, "Huge pages").
 * Returns NULL when out of memory or past PTRDIFF_MAX (no object is that
 * large). Free with sift_mem_free. */
SIFT_API void *sift_mem_alloc (gsize bytes);

/* As sift_mem_alloc, zero-filled. */
SIFT_API void *sift_mem_alloc0 (gsize bytes);

/* Frees what sift_mem_alloc returned; NULL is ignored. */
SIFT_API void sift_mem_free (void *p);

G_END_DECLS
