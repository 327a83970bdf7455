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

/* `bytes` of zeroes that cost nothing until touched: the buffer is its own
 * anonymous mapping, whose pages the kernel zeroes as each is first
 * touched, so memory reserved ahead of use (a store grown geometrically,
 * a buffer sized for a whole chunk) is resident only as far as it is
 * used. Page aligned; from SIFT_HUGE_PAGE_BYTES on 2 MiB aligned, whole
 * huge pages, with the huge-page hint, as sift_mem_alloc (a KV store read
 * whole every decode step streams at the TLB's pace otherwise). NULL when out of memory. Free with
 * sift_mem_unmap and the same size. */
SIFT_API void *sift_mem_map0 (gsize bytes);

/* Frees what sift_mem_map0 returned (`bytes` as given to it); NULL is ignored. */
SIFT_API void sift_mem_unmap (void *p, gsize bytes);

/* The pages of a sift_mem_map0 buffer wholly inside [p, p + bytes) leave
 * the resident set and read as zeroes again (madvise MADV_DONTNEED): for
 * scratch sized for the largest step once smaller steps follow (a
 * 512-token prefill chunk, then 1-token decode steps). */
SIFT_API void sift_mem_discard (void *p, gsize bytes);

G_END_DECLS
