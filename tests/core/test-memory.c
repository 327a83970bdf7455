/* sift_mem_alloc: alignment (a cache line; 2 MiB from SIFT_HUGE_PAGE_BYTES
 * on), every byte usable (ASan checks the ends), zero fill, the huge-page
 * hint visible in /proc/self/smaps, NULL for impossible sizes.
 * sift_mem_map0 and sift_mem_discard: zeroes that are not resident until
 * touched, pages that leave the resident set and read as zeroes again
 * (residency from mincore). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>
#include <sift/sift.h>

static void
test_alignment_and_use (void **state)
{
  (void) state;
  const gsize sizes[] = { 0, 1, 63, 64, 4095, 100000, SIFT_HUGE_PAGE_BYTES - 1, SIFT_HUGE_PAGE_BYTES,
                          SIFT_HUGE_PAGE_BYTES + 1, 3 * SIFT_HUGE_PAGE_BYTES + 12345 };
  for (gsize i = 0; i < G_N_ELEMENTS (sizes); i++)
    {
      const gsize n = sizes[i];
      guint8 *p = sift_mem_alloc (n);
      assert_non_null (p);
      const gsize align = n >= SIFT_HUGE_PAGE_BYTES ? SIFT_HUGE_PAGE_BYTES : 64;
      assert_int_equal ((uintptr_t) p % align, 0);
      memset (p, 0xa5, n);
      if (n > 0)
        assert_int_equal (p[n - 1], 0xa5);
      sift_mem_free (p);

      guint8 *z = sift_mem_alloc0 (n);
      assert_non_null (z);
      for (gsize j = 0; j < n; j++)
        if (z[j] != 0)
          fail_msg ("byte %zu of %zu not zero", j, n);
      sift_mem_free (z);
    }
  sift_mem_free (NULL);
}

static void
test_impossible_size (void **state)
{
  (void) state;
  assert_null (sift_mem_alloc (G_MAXSIZE));
  assert_null (sift_mem_alloc (G_MAXSIZE - SIFT_HUGE_PAGE_BYTES / 2));
  assert_null (sift_mem_alloc0 (G_MAXSIZE / 2 + 1));
  assert_null (sift_mem_alloc ((gsize) PTRDIFF_MAX));
}

/* The VmFlags of the mapping holding address a, or NULL. */
static char *
vm_flags_of (uintptr_t a)
{
  FILE *f = fopen ("/proc/self/smaps", "r");
  if (f == NULL)
    return NULL;
  char line[512];
  gboolean inside = FALSE;
  char *flags = NULL;
  while (flags == NULL && fgets (line, sizeof line, f) != NULL)
    {
      unsigned long lo, hi;
      if (sscanf (line, "%lx-%lx ", &lo, &hi) == 2 && strchr (line, '-') < strchr (line, ' '))
        inside = a >= lo && a < hi;
      else if (inside && g_str_has_prefix (line, "VmFlags:"))
        flags = g_strdup (line + 8);
    }
  fclose (f);
  return flags;
}

static void
test_huge_page_hint (void **state)
{
  (void) state;
  if (!g_file_test ("/sys/kernel/mm/transparent_hugepage/enabled", G_FILE_TEST_EXISTS))
    skip ();
  const gsize n = 4 * SIFT_HUGE_PAGE_BYTES;
  guint8 *big = sift_mem_alloc (n), *small = sift_mem_alloc (4096);
  assert_non_null (big);
  assert_non_null (small);
  g_autofree char *fb = vm_flags_of ((uintptr_t) big + n / 2);
  assert_non_null (fb);
  /* "hg": madvise (MADV_HUGEPAGE) was applied to this range. */
  if (strstr (fb, " hg") == NULL)
    fail_msg ("no huge-page hint on a %zu-byte buffer: VmFlags%s", n, fb);
  sift_mem_free (big);
  sift_mem_free (small);
  guint8 *mapped = sift_mem_map0 (n);
  assert_non_null (mapped);
  g_autofree char *fm = vm_flags_of ((uintptr_t) mapped + n / 2);
  assert_non_null (fm);
  if (strstr (fm, " hg") == NULL)
    fail_msg ("no huge-page hint on a %zu-byte mapping: VmFlags%s", n, fm);
  sift_mem_unmap (mapped, n);
}

/* Resident pages of [p, p + n) (whole 4 KiB pages). */
static gsize
resident_pages (const guint8 *p, gsize n)
{
  const gsize pages = n / 4096;
  g_autofree unsigned char *vec = g_new (unsigned char, pages);
  assert_int_equal (mincore ((void *) p, pages * 4096, vec), 0);
  gsize r = 0;
  for (gsize i = 0; i < pages; i++)
    r += vec[i] & 1;
  return r;
}

static void
test_map_discard (void **state)
{
  (void) state;
  const gsize sizes[] = { 1, 4096, 100000, SIFT_HUGE_PAGE_BYTES + 12345 };
  for (gsize i = 0; i < G_N_ELEMENTS (sizes); i++)
    {
      const gsize n = sizes[i];
      guint8 *p = sift_mem_map0 (n);
      assert_non_null (p);
      assert_int_equal ((uintptr_t) p % (n >= SIFT_HUGE_PAGE_BYTES ? SIFT_HUGE_PAGE_BYTES : 4096), 0);
      if (n >= 3 * 4096 && n < SIFT_HUGE_PAGE_BYTES)
        assert_int_equal (resident_pages (p, n), 0); /* reserved, not yet touched */
      for (gsize j = 0; j < n; j++)
        if (p[j] != 0)
          fail_msg ("byte %zu of %zu not zero", j, n);
      memset (p, 0x5a, n);
      /* Discard all but the first page and a half: the whole pages past it go. */
      const gsize keep = 6144;
      if (n > keep)
        {
          sift_mem_discard (p + keep, n - keep);
          for (gsize j = 0; j < n; j++)
            if (p[j] != (j < 8192 || j >= n / 4096 * 4096 ? 0x5a : 0)) /* whole pages only */
              fail_msg ("byte %zu of %zu after discard: %d", j, n, p[j]);
        }
      sift_mem_unmap (p, n);
    }
  /* Residency: a touched buffer's discarded pages leave the resident set. */
  const gsize n = 64 * 4096;
  guint8 *p = sift_mem_map0 (n);
  assert_non_null (p);
  memset (p, 1, n);
  assert_int_equal (resident_pages (p, n), 64);
  sift_mem_discard (p + 16 * 4096, 48 * 4096);
  assert_int_equal (resident_pages (p, n), 16);
  sift_mem_unmap (p, n);
  sift_mem_unmap (NULL, 0);
  sift_mem_discard (NULL, 0);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_alignment_and_use),
    cmocka_unit_test (test_impossible_size),
    cmocka_unit_test (test_huge_page_hint),
    cmocka_unit_test (test_map_discard),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
