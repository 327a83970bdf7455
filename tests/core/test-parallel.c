/* The thread pool: every index visited exactly once, ranges respect the
 * grain, worker ids in range, nested and concurrent loops run serially
 * without deadlock. Run under -Dsanitize=thread too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <sift/sift.h>

typedef struct {
  gint *hits;    /* [n] atomic visit counts */
  gint64 n, grain;
  gint bad;      /* atomic: ranges that broke a rule */
  gint workers;  /* atomic bitmask of worker ids seen */
} Visit;

static void
visit (gint64 begin, gint64 end, gint worker, gpointer data)
{
  Visit *v = data;
  /* Only the last range of the loop may be shorter than the grain. */
  if (begin < 0 || end > v->n || begin >= end || (end - begin < v->grain && end != v->n)
      || worker < 0 || worker >= sift_parallel_n_threads ())
    g_atomic_int_inc (&v->bad);
  g_atomic_int_or (&v->workers, 1u << MIN (worker, 30));
  for (gint64 i = begin; i < end; i++)
    g_atomic_int_inc (&v->hits[i]);
}

static void
check_loop (gint64 n, gint64 grain)
{
  Visit v = { g_new0 (gint, MAX (n, 1)), n, MAX (grain, 1), 0, 0 };
  sift_parallel_for (n, grain, visit, &v);
  assert_int_equal (g_atomic_int_get (&v.bad), 0);
  for (gint64 i = 0; i < n; i++)
    assert_int_equal (v.hits[i], 1);
  g_free (v.hits);
}

static void
test_each_index_once (void **state)
{
  (void) state;
  static const gint threads[] = { 1, 2, 3, 8 };
  static const gint64 sizes[] = { 0, 1, 2, 7, 100, 1000, 100003 };
  static const gint64 grains[] = { 0, 1, 3, 64, 5000 };
  for (gsize t = 0; t < G_N_ELEMENTS (threads); t++)
    {
      sift_parallel_set_n_threads (threads[t]);
      assert_int_equal (sift_parallel_n_threads (), threads[t]);
      for (gsize s = 0; s < G_N_ELEMENTS (sizes); s++)
        for (gsize g = 0; g < G_N_ELEMENTS (grains); g++)
          check_loop (sizes[s], grains[g]);
    }
}

/* Many short loops in a row: the generation handshake never loses a wake-up. */
static void
test_many_small_loops (void **state)
{
  (void) state;
  sift_parallel_set_n_threads (4);
  for (int i = 0; i < 3000; i++)
    check_loop (8, 1);
}

static void
nested_body (gint64 begin, gint64 end, gint worker, gpointer data)
{
  (void) worker;
  Visit *outer = data;
  for (gint64 i = begin; i < end; i++)
    {
      /* An inner loop runs serially on this thread: one range, worker 0. */
      Visit inner = { g_new0 (gint, 10), 10, 1, 0, 0 };
      sift_parallel_for (10, 1, visit, &inner);
      if (g_atomic_int_get (&inner.workers) != 1)
        g_atomic_int_inc (&outer->bad);
      for (int j = 0; j < 10; j++)
        if (inner.hits[j] != 1)
          g_atomic_int_inc (&outer->bad);
      g_free (inner.hits);
      g_atomic_int_inc (&outer->hits[i]);
    }
}

static void
test_nested (void **state)
{
  (void) state;
  sift_parallel_set_n_threads (3);
  Visit v = { g_new0 (gint, 50), 50, 1, 0, 0 };
  sift_parallel_for (50, 1, nested_body, &v);
  assert_int_equal (v.bad, 0);
  for (int i = 0; i < 50; i++)
    assert_int_equal (v.hits[i], 1);
  g_free (v.hits);
}

static gpointer
concurrent_main (gpointer data)
{
  (void) data;
  for (int i = 0; i < 200; i++)
    check_loop (1000, 10);
  return NULL;
}

/* Loops from several threads at once: one gets the pool, the others run
 * serially; all finish with every index visited once. */
static void
test_concurrent_callers (void **state)
{
  (void) state;
  sift_parallel_set_n_threads (3);
  GThread *t[3];
  for (int i = 0; i < 3; i++)
    t[i] = g_thread_new ("caller", concurrent_main, NULL);
  for (int i = 0; i < 3; i++)
    g_thread_join (t[i]);
}

/* More threads than items: each range still gets a distinct worker id. */
static void
test_default_threads (void **state)
{
  (void) state;
  sift_parallel_set_n_threads (0); /* back to SIFT_THREADS or the CPU count */
  assert_true (sift_parallel_n_threads () >= 1);
  if (g_getenv ("SIFT_THREADS") == NULL)
    assert_int_equal (sift_parallel_n_threads (), (gint) g_get_num_processors ());
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_each_index_once),
    cmocka_unit_test (test_many_small_loops),
    cmocka_unit_test (test_nested),
    cmocka_unit_test (test_concurrent_callers),
    cmocka_unit_test (test_default_threads),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
