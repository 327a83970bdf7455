/* Block stores alone and under the engine: round trips, the shared id
 * allocator, capacity, the file's life cycle (created, sized, removed unless
 * keep), a file changed underneath, an unwritable or full file, O_DIRECT,
 * pread and io_uring; then injected read / write failures and short reads
 * through a wrapping store: clear errors, the run stops, nothing already
 * written is corrupted. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "helpers.h"

static const SiftModelShape shape = { 2, 4, 2, 32, 16, 32, 0 };

static void
fill_pattern (guint8 *p, gsize n, guint seed)
{
  for (gsize i = 0; i < n; i++)
    p[i] = (guint8) (i * 131 + seed * 7 + (i >> 9));
}

/* Writes 40 blocks, releases some, reuses them, reads whole blocks and halves. */
static void
roundtrip (SiftStore *store)
{
  g_autoptr (GError) error = NULL;
  const gsize bb = sift_store_block_bytes (store);
  g_autofree guint8 *buf = g_malloc (bb), *got = g_malloc (bb);
  gint64 ids[40];
  for (int i = 0; i < 40; i++)
    {
      assert_true (sift_store_alloc (store, &ids[i], &error));
      assert_int_equal (ids[i], i);
      fill_pattern (buf, bb, (guint) i);
      assert_true (sift_store_write (store, ids[i], buf, &error));
    }
  g_assert_no_error (error);
  assert_int_equal (sift_store_blocks_in_use (store), 40);
  sift_store_release (store, ids[3]);
  sift_store_release (store, ids[17]);
  assert_int_equal (sift_store_blocks_in_use (store), 38);
  gint64 again;
  assert_true (sift_store_alloc (store, &again, &error));
  assert_true (again == 3 || again == 17);
  fill_pattern (buf, bb, 1000);
  assert_true (sift_store_write (store, again, buf, &error));
  for (int i = 0; i < 40; i++)
    {
      if (i == 17 && again == 3)
        continue;
      if (i == 3 && again == 17)
        continue;
      fill_pattern (buf, bb, i == again ? 1000 : (guint) i);
      memset (got, 0, bb);
      assert_true (sift_store_read (store, i, 0, got, bb, &error));
      assert_memory_equal (got, buf, bb);
      /* The V half and an unaligned piece. */
      assert_true (sift_store_read (store, i, bb / 2, got, bb / 2, &error));
      assert_memory_equal (got, buf + bb / 2, bb / 2);
      assert_true (sift_store_read (store, i, 13, got, 1000, &error));
      assert_memory_equal (got, buf + 13, 1000);
    }
  g_assert_no_error (error);
  /* A read past the block or of an id never allocated is refused. */
  assert_false (sift_store_read (store, 0, bb / 2 + 1, got, bb / 2, &error));
  assert_int_equal (error->code, SIFT_STORE_ERROR_INVALID);
  g_clear_error (&error);
  assert_false (sift_store_read (store, 40, 0, got, 16, &error));
  assert_int_equal (error->code, SIFT_STORE_ERROR_INVALID);
  g_clear_error (&error);
  for (int i = 0; i < 40; i++)
    if (i != (again == 3 ? 17 : 3))
      sift_store_release (store, i);
  assert_int_equal (sift_store_blocks_in_use (store), 0);
}

static void
test_host_store (void **state)
{
  (void) state;
  for (SiftDType d = SIFT_DTYPE_F32; d <= SIFT_DTYPE_Q8_0; d++)
    {
      SiftStoreConfig sc = test_store_config (&shape, d, NULL);
      g_autoptr (GError) error = NULL;
      g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
      g_assert_no_error (error);
      assert_string_equal (sift_store_name (store), "host");
      assert_int_equal (sift_store_block_bytes (store), 2 * 2 * 16 * sift_dtype_row_bytes (d, 32));
      roundtrip (store);
    }
}

static void
test_file_store (void **state)
{
  (void) state;
  const char *modes[] = { "pread", "uring" };
  for (int m = 0; m < 2; m++)
    for (int direct = 0; direct < 2; direct++)
      {
        g_setenv ("SIFT_STORE_IO", modes[m], TRUE);
        g_autofree char *path = test_tmp_path ("rt");
        SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F16, path);
        sc.direct = direct;
        g_autoptr (GError) error = NULL;
        SiftStore *store = sift_store_file_new (&sc, &error);
        if (store == NULL && direct)
          {
            /* Some file systems (tmpfs) refuse O_DIRECT: a clear error. */
            assert_int_equal (error->code, SIFT_STORE_ERROR_IO);
            assert_non_null (strstr (error->message, "O_DIRECT"));
            continue;
          }
        g_assert_no_error (error);
        assert_true (g_file_test (path, G_FILE_TEST_IS_REGULAR));
        roundtrip (store);
        struct stat st;
        assert_int_equal (stat (path, &st), 0);
        gsize stride = direct ? (sift_store_block_bytes (store) + 4095) / 4096 * 4096 : sift_store_block_bytes (store);
        assert_true ((gsize) st.st_size >= 40 * stride);
        assert_int_equal ((gsize) st.st_size % stride, 0);
        sift_store_free (store);
        assert_false (g_file_test (path, G_FILE_TEST_EXISTS));
      }
  g_unsetenv ("SIFT_STORE_IO");
}

static void
test_file_keep (void **state)
{
  (void) state;
  g_autofree char *path = test_tmp_path ("keep");
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, path);
  sc.keep = TRUE;
  g_autoptr (GError) error = NULL;
  SiftStore *store = sift_store_file_new (&sc, &error);
  gint64 id;
  assert_true (sift_store_alloc (store, &id, &error));
  sift_store_release (store, id);
  sift_store_free (store);
  assert_true (g_file_test (path, G_FILE_TEST_IS_REGULAR));
  unlink (path);
}

static void
test_capacity (void **state)
{
  (void) state;
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, NULL);
  sc.capacity_blocks = 5;
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftStore) store = sift_store_host_new (&sc, &error);
  gint64 id;
  for (int i = 0; i < 5; i++)
    assert_true (sift_store_alloc (store, &id, &error));
  assert_false (sift_store_alloc (store, &id, &error));
  assert_int_equal (error->code, SIFT_STORE_ERROR_FULL);
  g_clear_error (&error);
  sift_store_release (store, 2);
  assert_true (sift_store_alloc (store, &id, &error));
  assert_int_equal (id, 2);
}

static void
test_file_changed_underneath (void **state)
{
  (void) state;
  for (int how = 0; how < 2; how++)
    {
      g_autofree char *path = test_tmp_path ("changed");
      SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, path);
      g_autoptr (GError) error = NULL;
      g_autoptr (SiftStore) store = sift_store_file_new (&sc, &error);
      const gsize bb = sift_store_block_bytes (store);
      g_autofree guint8 *buf = g_malloc0 (bb);
      gint64 id;
      assert_true (sift_store_alloc (store, &id, &error));
      assert_true (sift_store_write (store, id, buf, &error));
      if (how == 0)
        assert_int_equal (truncate (path, (off_t) bb / 2), 0);
      else
        {
          /* Replaced: another file now has the name. */
          assert_int_equal (unlink (path), 0);
          assert_true (g_file_set_contents (path, "x", 1, NULL));
        }
      assert_false (sift_store_read (store, id, 0, buf, bb, &error));
      assert_int_equal (error->code, SIFT_STORE_ERROR_CHANGED);
      assert_non_null (strstr (error->message, path));
      g_clear_error (&error);
      assert_false (sift_store_write (store, id, buf, &error));
      assert_int_equal (error->code, SIFT_STORE_ERROR_CHANGED);
      if (how == 1)
        {
          /* The store does not remove a file it did not create. */
          g_clear_pointer (&store, sift_store_free);
          assert_true (g_file_test (path, G_FILE_TEST_EXISTS));
          unlink (path);
        }
    }
}

static void
test_file_unwritable (void **state)
{
  (void) state;
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, "/nonexistent-sift-dir/kv.store");
  g_autoptr (GError) error = NULL;
  assert_null (sift_store_file_new (&sc, &error));
  assert_int_equal (error->code, SIFT_STORE_ERROR_IO);
  assert_non_null (strstr (error->message, "/nonexistent-sift-dir/kv.store"));
  g_clear_error (&error);
  sc.path = NULL;
  assert_null (sift_store_file_new (&sc, &error));
  assert_int_equal (error->code, SIFT_STORE_ERROR_INVALID);
}

/* A full disk, made with RLIMIT_FSIZE: growing the file fails with FULL. */
static void
test_file_full (void **state)
{
  (void) state;
  struct rlimit old, lim;
  getrlimit (RLIMIT_FSIZE, &old);
  signal (SIGXFSZ, SIG_IGN);
  g_autofree char *path = test_tmp_path ("full");
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, path);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftStore) store = sift_store_file_new (&sc, &error);
  lim = old;
  lim.rlim_cur = 20 * sift_store_block_bytes (store);
  assert_int_equal (setrlimit (RLIMIT_FSIZE, &lim), 0);
  gint64 id;
  gboolean ok = TRUE;
  int n = 0;
  for (; n < 100 && ok; n++)
    ok = sift_store_alloc (store, &id, &error);
  setrlimit (RLIMIT_FSIZE, &old);
  assert_false (ok);
  assert_int_equal (error->code, SIFT_STORE_ERROR_FULL);
  assert_non_null (strstr (error->message, path));
  assert_int_equal (n - 1, 20); /* 16, then block by block up to the limit (doubling to 32 did not fit) */
  /* What is there still works. */
  g_autofree guint8 *buf = g_malloc0 (sift_store_block_bytes (store));
  g_clear_error (&error);
  assert_true (sift_store_write (store, 15, buf, &error));
  assert_true (sift_store_read (store, 15, 0, buf, sift_store_block_bytes (store), &error));
}

/* ---- Fault injection ---------------------------------------------------- */

typedef struct {
  SiftStore parent;
  SiftStore *inner;
  gint fail_read_at, fail_write_at;  /* 1-based; 0 never */
  gboolean short_read;               /* the failing read is short instead of an I/O error */
  gint reads, writes;
  GHashTable *written;               /* id -> copy of the last successful write */
} FaultStore;

static gboolean
fault_write (SiftStore *store, gint64 id, const void *src, GError **error)
{
  FaultStore *f = (FaultStore *) store;
  if (g_atomic_int_add (&f->writes, 1) + 1 == f->fail_write_at)
    {
      g_set_error (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_IO, "injected: write %d of block %" G_GINT64_FORMAT " failed",
                   f->fail_write_at, id);
      return FALSE;
    }
  if (!f->inner->klass->write (f->inner, id, src, error))
    return FALSE;
  g_hash_table_insert (f->written, g_memdup2 (&id, sizeof id), g_memdup2 (src, store->block_bytes)); /* writes: worker only */
  return TRUE;
}

static gboolean
fault_read (SiftStore *store, gint64 id, gsize offset, void *dst, gsize n, GError **error)
{
  FaultStore *f = (FaultStore *) store;
  gint nth = g_atomic_int_add (&f->reads, 1) + 1; /* the worker and a helping compute thread both read */
  if (nth == f->fail_read_at)
    {
      g_set_error (error, SIFT_STORE_ERROR, f->short_read ? SIFT_STORE_ERROR_SHORT_READ : SIFT_STORE_ERROR_IO,
                   "injected: %s read %d of block %" G_GINT64_FORMAT, f->short_read ? "short" : "failed", nth, id);
      return FALSE;
    }
  return f->inner->klass->read (f->inner, id, offset, dst, n, error);
}

static gboolean
fault_reserve (SiftStore *store, gint64 n, GError **error)
{
  FaultStore *f = (FaultStore *) store;
  return f->inner->klass->reserve (f->inner, n, error);
}

static void
fault_finalize (SiftStore *store)
{
  FaultStore *f = (FaultStore *) store;
  g_hash_table_unref (f->written);
  sift_store_free (f->inner);
}

static const SiftStoreClass fault_class = { "fault", fault_write, fault_read, fault_reserve, fault_finalize };

static FaultStore *
fault_new (SiftStore *inner)
{
  FaultStore *f = (FaultStore *) sift_store_construct (sizeof (FaultStore), &fault_class, sift_store_config (inner), NULL);
  f->inner = inner;
  f->written = g_hash_table_new_full (g_int64_hash, g_int64_equal, g_free, g_free);
  return f;
}

typedef struct {
  FaultStore *store;
  SiftEngine *engine;
  SiftModel *src;
  SiftRunner *runner;
  TestChecker *check;
} FaultRun;

static void
fault_run_open (FaultRun *r, SiftPipeline pipe, gboolean file, gint32 n_slots)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *path = test_tmp_path ("fault");
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, path);
  SiftStore *inner = file ? sift_store_file_new (&sc, &error) : sift_store_host_new (&sc, &error);
  g_assert_no_error (error);
  r->store = fault_new (inner);
  SiftEngineConfig ec = { shape, SIFT_DTYPE_F32, n_slots, pipe, 0, SIFT_DEVICE_CPU };
  r->engine = sift_engine_new (&ec, &r->store->parent, &error);
  sift_engine_set_ring_group (r->engine, MAX (1, ec.n_slots / 2)); /* the groups the cases below count on */
  r->src = sift_model_random_new (&shape, 5);
  r->runner = sift_runner_new (r->engine, r->src, NULL, NULL, &error);
  g_assert_no_error (error);
  r->check = test_checker_new (r->src, 400);
  sift_runner_set_observer (r->runner, &test_checker_observer, r->check);
}

static void
fault_run_close (FaultRun *r)
{
  test_checker_free (r->check);
  sift_runner_free (r->runner);
  sift_engine_free (r->engine);
  sift_model_free (r->src);
  sift_store_free (&r->store->parent);
}

/* After a failure the run stops; a reset makes the engine usable again. */
static void
assert_stopped_then_recovers (FaultRun *r)
{
  g_autoptr (GError) error = NULL;
  assert_false (sift_runner_decode (r->runner, 1, NULL, NULL, &error));
  assert_int_equal (error->code, SIFT_ENGINE_ERROR_STATE);
  g_clear_error (&error);
  sift_runner_reset (r->runner); /* waits for the copy worker */
  r->store->fail_read_at = r->store->fail_write_at = 0;
  assert_int_equal (sift_store_blocks_in_use (&r->store->parent), 0);
  r->check->max_err = 0;
  assert_true (sift_runner_prefill (r->runner, 200, NULL, NULL, &error));
  for (int i = 0; i < 20; i++)
    assert_true (sift_runner_decode (r->runner, 1, NULL, NULL, &error));
  g_assert_no_error (error);
  assert_true (r->check->max_err < 1e-5);
}

/* A failed load anywhere in a group of the ring (2 slots: groups of 1; 6
 * slots: groups of 3, the failure first, second or third in its group). */
static void
test_read_failure_stops_run (void **state)
{
  (void) state;
  const struct { gint32 slots, fail_at; } cases[] = { { 2, 9 }, { 6, 9 }, { 6, 10 }, { 6, 11 } };
  for (int pipe = 0; pipe < 2; pipe++)
    for (int shortr = 0; shortr < 2; shortr++)
      for (gsize c = 0; c < G_N_ELEMENTS (cases); c++)
        {
          FaultRun r;
          fault_run_open (&r, (SiftPipeline) pipe, pipe == 1, cases[c].slots);
          r.store->fail_read_at = cases[c].fail_at;
          r.store->short_read = shortr;
          g_autoptr (GError) error = NULL;
          gboolean ok = sift_runner_prefill (r.runner, 150, NULL, NULL, &error);
          for (int i = 0; i < 10 && ok; i++)
            ok = sift_runner_decode (r.runner, 1, NULL, NULL, &error);
          assert_false (ok);
          assert_true (error->domain == SIFT_STORE_ERROR);
          assert_int_equal (error->code, shortr ? SIFT_STORE_ERROR_SHORT_READ : SIFT_STORE_ERROR_IO);
          assert_non_null (strstr (error->message, "injected"));
          assert_true (r.check->max_err < 1e-5); /* nothing wrong was reported before */
          assert_stopped_then_recovers (&r);
          fault_run_close (&r);
        }
}

static void
test_write_failure (void **state)
{
  (void) state;
  for (int pipe = 0; pipe < 2; pipe++)
    {
      FaultRun r;
      fault_run_open (&r, (SiftPipeline) pipe, TRUE, 2);
      r.store->fail_write_at = 7;
      g_autoptr (GError) error = NULL;
      gboolean ok = sift_runner_prefill (r.runner, 200, NULL, NULL, &error);
      for (int i = 0; i < 10 && ok; i++)
        ok = sift_runner_decode (r.runner, 1, NULL, NULL, &error);
      assert_false (ok);
      assert_int_equal (error->code, SIFT_STORE_ERROR_IO);
      assert_non_null (strstr (error->message, "injected: write 7"));
      /* No write was attempted after the failed one, and every block
       * written before it reads back as written. */
      assert_int_equal (r.store->writes, 7);
      assert_int_equal (g_hash_table_size (r.store->written), 6);
      GHashTableIter it;
      gpointer key, val;
      const gsize bb = sift_store_block_bytes (&r.store->parent);
      g_autofree guint8 *got = g_malloc (bb);
      g_hash_table_iter_init (&it, r.store->written);
      while (g_hash_table_iter_next (&it, &key, &val))
        {
          assert_true (r.store->inner->klass->read (r.store->inner, *(gint64 *) key, 0, got, bb, &error));
          assert_memory_equal (got, val, bb);
        }
      assert_stopped_then_recovers (&r);
      fault_run_close (&r);
    }
}

/* The store file truncated between prefill and decode. */
static void
test_changed_during_run (void **state)
{
  (void) state;
  g_autofree char *path = test_tmp_path ("run");
  SiftStoreConfig sc = test_store_config (&shape, SIFT_DTYPE_F32, path);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftStore) store = sift_store_file_new (&sc, &error);
  SiftEngineConfig ec = { shape, SIFT_DTYPE_F32, 2, SIFT_PIPELINE_RING, 0, SIFT_DEVICE_CPU };
  g_autoptr (SiftEngine) engine = sift_engine_new (&ec, store, &error);
  g_autoptr (SiftModel) src = sift_model_random_new (&shape, 5);
  g_autoptr (SiftRunner) runner = sift_runner_new (engine, src, NULL, NULL, &error);
  assert_true (sift_runner_prefill (runner, 100, NULL, NULL, &error));
  assert_int_equal (truncate (path, 1000), 0);
  assert_false (sift_runner_decode (runner, 1, NULL, NULL, &error));
  assert_int_equal (error->code, SIFT_STORE_ERROR_CHANGED);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_host_store),
    cmocka_unit_test (test_file_store),
    cmocka_unit_test (test_file_keep),
    cmocka_unit_test (test_capacity),
    cmocka_unit_test (test_file_changed_underneath),
    cmocka_unit_test (test_file_unwritable),
    cmocka_unit_test (test_file_full),
    cmocka_unit_test (test_read_failure_stops_run),
    cmocka_unit_test (test_write_failure),
    cmocka_unit_test (test_changed_during_run),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
