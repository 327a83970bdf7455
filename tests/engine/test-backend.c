/* The backend seam on its own, with the CPU backend: a method table of the
 * current version with every method; a store then a load of the same block,
 * submitted back to back, round-trip bit for bit into a strided
 * destination (submission order); the sink hears of every transfer, with
 * its bytes, before the transfer's event completes; a failed load's error
 * is handed over by one wait and then gone; a store after a failed store
 * is skipped until a drain that forgets; a load of some kv heads fills
 * those heads' rows (converted from an f16 store or copied from an f32 one)
 * and leaves every other byte of the destination as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "store-private.h"

enum { HEADS = 2, BLOCK = 16, DIM = 32 };

typedef struct {
  gint n_loads, n_stores;
  guint64 bytes_loaded, bytes_stored;
  gint n_failed;
} Heard;

static void
heard (gpointer user, const SiftTransfer *t, gboolean ok, guint64 bytes, gdouble seconds, const GError *error)
{
  Heard *h = user;
  (void) seconds;
  if (t->kind == SIFT_TRANSFER_LOAD)
    {
      h->n_loads++;
      h->bytes_loaded += ok ? bytes : 0;
    }
  else
    {
      h->n_stores++;
      h->bytes_stored += bytes;
    }
  h->n_failed += error != NULL;
}

static SiftBackend *
backend_open (SiftStore **store, Heard *h)
{
  g_autoptr (GError) error = NULL;
  SiftStoreConfig sc = { .dtype = SIFT_DTYPE_F32, .n_kv_heads = HEADS, .block_size = BLOCK, .head_dim = DIM };
  *store = sift_store_host_new (&sc, &error);
  g_assert_no_error (error);
  SiftModelShape shape = { 1, HEADS, HEADS, DIM, BLOCK, BLOCK, 0 };
  SiftBackendSetup setup = { shape, SIFT_DTYPE_F32, *store, { heard, h } };
  return sift_backend_cpu_new (&setup);
}

static void
test_ops_table (void **state)
{
  (void) state;
  Heard h = { 0 };
  SiftStore *store;
  SiftBackend *b = backend_open (&store, &h);
  const SiftBackendOps *o = b->ops;
  assert_int_equal (o->version, SIFT_BACKEND_VERSION);
  assert_true (o->struct_size >= sizeof (SiftBackendOps));
  assert_string_equal (o->name, "cpu");
  const gboolean all = o->free && o->buffer_alloc && o->buffer_free && o->buffer_write && o->buffer_move
                       && o->buffer_clear && o->host_alloc && o->host_free && o->can_map && o->submit
                       && o->event_new && o->event_free && o->event_query && o->event_wait && o->drain
                       && o->attend && o->merge;
  assert_true (all);
  /* Zero-copy is the backend's call: an f32 host store under f32 compute. */
  assert_true (o->can_map (b, store, SIFT_DTYPE_F32));
  assert_false (o->can_map (b, store, SIFT_DTYPE_F16));
  SiftBuffer buf;
  assert_true (o->buffer_alloc (b, 1000, &buf, NULL));
  assert_int_equal (buf.space, SIFT_MEMORY_HOST);
  assert_true (buf.size >= 1000);
  for (gsize i = 0; i < 1000; i++)
    assert_int_equal (buf.data[i], 0);
  o->buffer_free (b, &buf);
  o->free (b);
  sift_store_free (store);
}

static void
test_store_then_load (void **state)
{
  (void) state;
  Heard h = { 0 };
  SiftStore *store;
  SiftBackend *b = backend_open (&store, &h);
  const SiftBackendOps *o = b->ops;
  g_autoptr (GError) error = NULL;
  const gint64 cap = BLOCK + 5; /* a strided destination, as the cross-layer halves are */
  SiftBuffer src, dst;
  assert_true (o->buffer_alloc (b, 2 * (gsize) HEADS * BLOCK * DIM * sizeof (float), &src, NULL));
  assert_true (o->buffer_alloc (b, 2 * (gsize) HEADS * cap * DIM * sizeof (float), &dst, NULL));
  float *s = (float *) (void *) src.data;
  for (gsize i = 0; i < 2 * (gsize) HEADS * BLOCK * DIM; i++)
    s[i] = (float) (i % 977) * 0.25f - 100.0f;
  gint64 id;
  assert_true (sift_store_alloc (store, &id, &error));
  SiftEvent *stored = o->event_new (b), *loaded = o->event_new (b);
  const gsize half = (gsize) HEADS * BLOCK * DIM * sizeof (float);
  SiftTransfer t[2] = {
    { .kind = SIFT_TRANSFER_STORE, .store_id = id, .what = SIFT_LOAD_KV, .k = src.data, .v = src.data + half,
      .cap = BLOCK, .event = stored },
    { .kind = SIFT_TRANSFER_LOAD, .store_id = id, .what = SIFT_LOAD_KV, .k = dst.data,
      .v = dst.data + dst.size / 2, .cap = cap, .event = loaded },
  };
  o->submit (b, t, 2);
  assert_true (o->event_wait (b, &loaded, 1, NULL, &error));
  g_assert_no_error (error);
  /* The sink heard of both before the load's event completed. */
  assert_int_equal (h.n_stores, 1);
  assert_int_equal (h.n_loads, 1);
  assert_int_equal (h.bytes_stored, 2 * half);
  assert_int_equal (h.bytes_loaded, 2 * half);
  assert_int_equal (o->event_query (b, stored), SIFT_EVENT_DONE);
  const float *d = (const float *) (const void *) dst.data;
  for (int kv = 0; kv < 2; kv++)
    for (gint32 hd = 0; hd < HEADS; hd++)
      assert_memory_equal (d + (gsize) kv * HEADS * cap * DIM + (gsize) hd * cap * DIM,
                           s + (gsize) kv * HEADS * BLOCK * DIM + (gsize) hd * BLOCK * DIM,
                           (gsize) BLOCK * DIM * sizeof (float));
  o->event_free (b, stored);
  o->event_free (b, loaded);
  o->buffer_free (b, &src);
  o->buffer_free (b, &dst);
  o->free (b);
  sift_store_free (store);
}

/* Heads 1, 2 and 4 of 5 (a run and a single), K only or K and V, from
 * an f32 and an f16 store into an f32 destination of the block's tokens
 * per head or more (strided); run by the submitting thread (small, nothing
 * queued) or queued behind a store (the worker's, or a waiter's help). */
static void
test_load_some_heads (void **state)
{
  (void) state;
  enum { NH = 5 };
  const SiftDType dtypes[] = { SIFT_DTYPE_F32, SIFT_DTYPE_F16 };
  const SiftLoadWhat whats[] = { SIFT_LOAD_KV, SIFT_LOAD_K };
  const guint64 mask = (1u << 1) | (1u << 2) | (1u << 4);
  for (gsize di = 0; di < G_N_ELEMENTS (dtypes); di++)
    for (gsize wi = 0; wi < G_N_ELEMENTS (whats); wi++)
      for (gint64 cap = BLOCK; cap <= BLOCK + 3; cap += 3)
        for (int queued = 0; queued < 2; queued++)
          {
            g_autoptr (GError) error = NULL;
            Heard h = { 0 };
            SiftStoreConfig sc = { .dtype = dtypes[di], .n_kv_heads = NH, .block_size = BLOCK, .head_dim = DIM };
            SiftStore *store = sift_store_host_new (&sc, &error);
            g_assert_no_error (error);
            SiftModelShape shape = { 1, NH, NH, DIM, BLOCK, BLOCK, 0 };
            SiftBackendSetup setup = { shape, SIFT_DTYPE_F32, store, { heard, &h } };
            SiftBackend *b = sift_backend_cpu_new (&setup);
            const SiftBackendOps *o = b->ops;
            /* Values exact in f16: the conversion must give them back bit for bit. */
            const gsize n = 2 * (gsize) NH * BLOCK * DIM, row = sift_dtype_row_bytes (dtypes[di], DIM);
            g_autofree float *vals = g_new (float, n);
            g_autofree guint8 *stored = g_malloc (n / DIM * row);
            for (gsize i = 0; i < n; i++)
              vals[i] = (float) (i % 977) * 0.25f - 100.0f;
            sift_convert ((const guint8 *) vals, SIFT_DTYPE_F32, stored, dtypes[di], n);
            gint64 id;
            assert_true (sift_store_alloc (store, &id, &error));
            assert_true (sift_store_write (store, id, stored, &error));
            const gsize half = (gsize) NH * cap * DIM;
            g_autofree float *dst = g_new (float, 2 * half);
            memset (dst, 0xA5, 2 * half * sizeof (float));
            g_autofree float *before = g_memdup2 (dst, 2 * half * sizeof (float));
            SiftEvent *ev = o->event_new (b);
            SiftTransfer t = { .kind = SIFT_TRANSFER_LOAD, .store_id = id, .what = whats[wi], .k = (guint8 *) dst,
                               .v = (guint8 *) (dst + half), .cap = cap, .event = ev, .kv_heads = mask };
            /* Queued: a store of another block goes first, in the same submission. */
            g_autofree float *zeros = g_new0 (float, 2 * (gsize) NH * BLOCK * DIM);
            gint64 other;
            assert_true (sift_store_alloc (store, &other, &error));
            SiftTransfer both[2] = {
              { .kind = SIFT_TRANSFER_STORE, .store_id = other, .what = SIFT_LOAD_KV, .k = (guint8 *) zeros,
                .v = (guint8 *) (zeros + (gsize) NH * BLOCK * DIM), .cap = BLOCK, .event = ev },
              t,
            };
            o->submit (b, queued ? both : &t, queued ? 2 : 1);
            if (!queued) /* ran inline: done when submit returns */
              assert_int_equal (o->event_query (b, ev), SIFT_EVENT_DONE);
            assert_true (o->event_wait (b, &ev, 1, NULL, &error));
            g_assert_no_error (error);
            assert_int_equal (h.n_stores, queued);
            const int halves = whats[wi] == SIFT_LOAD_KV ? 2 : 1;
            assert_int_equal (h.bytes_loaded, (guint64) halves * 3 * BLOCK * row);
            for (int kv = 0; kv < 2; kv++)
              for (gint32 hd = 0; hd < NH; hd++)
                {
                  const float *got = dst + (gsize) kv * half + (gsize) hd * cap * DIM;
                  if (kv < halves && ((mask >> hd) & 1))
                    assert_memory_equal (got, vals + ((gsize) kv * NH + (gsize) hd) * BLOCK * DIM,
                                         (gsize) BLOCK * DIM * sizeof (float));
                  else
                    assert_memory_equal (got, before + (got - dst), (gsize) BLOCK * DIM * sizeof (float));
                }
            /* The rows past the block in each head (cap > BLOCK) are untouched too. */
            for (gint32 hd = 0; hd < 2 * NH; hd++)
              assert_memory_equal (dst + (gsize) hd * cap * DIM + (gsize) BLOCK * DIM,
                                   before + (gsize) hd * cap * DIM + (gsize) BLOCK * DIM,
                                   (gsize) (cap - BLOCK) * DIM * sizeof (float));
            o->event_free (b, ev);
            o->free (b);
            sift_store_free (store);
          }
}

/* A store whose writes fail on demand. */
static gboolean fail_writes;
static gboolean (*host_write) (SiftStore *, gint64, const void *, GError **);

static gboolean
failing_write (SiftStore *store, gint64 id, const void *src, GError **error)
{
  if (fail_writes)
    {
      g_set_error_literal (error, SIFT_STORE_ERROR, SIFT_STORE_ERROR_IO, "injected write failure");
      return FALSE;
    }
  return host_write (store, id, src, error);
}

static void
test_failures (void **state)
{
  (void) state;
  Heard h = { 0 };
  SiftStore *store;
  SiftBackend *b = backend_open (&store, &h);
  SiftStoreClass wrapped = *store->klass;
  host_write = wrapped.write;
  wrapped.write = failing_write;
  store->klass = &wrapped;
  const SiftBackendOps *o = b->ops;
  g_autoptr (GError) error = NULL;
  SiftBuffer buf;
  assert_true (o->buffer_alloc (b, 2 * (gsize) HEADS * BLOCK * DIM * sizeof (float), &buf, NULL));
  const gsize half = buf.size / 2;
  SiftEvent *ev = o->event_new (b);

  /* A load of a block the store never allocated fails; one wait hands the
   * error over, the next finds the event done. */
  SiftTransfer load = { .kind = SIFT_TRANSFER_LOAD, .store_id = 7, .what = SIFT_LOAD_KV, .k = buf.data,
                        .v = buf.data + half, .cap = BLOCK, .event = ev };
  o->submit (b, &load, 1);
  o->drain (b, FALSE);
  assert_int_equal (o->event_query (b, ev), SIFT_EVENT_FAILED);
  gsize n_ok = 99;
  assert_false (o->event_wait (b, &ev, 1, &n_ok, &error));
  assert_non_null (error);
  assert_int_equal (n_ok, 0);
  g_clear_error (&error);
  assert_true (o->event_wait (b, &ev, 1, &n_ok, &error));
  assert_int_equal (n_ok, 1);
  assert_int_equal (o->event_query (b, ev), SIFT_EVENT_DONE);

  /* A failed store makes later stores skip (0 bytes) until drain forgets. */
  gint64 id;
  assert_true (sift_store_alloc (store, &id, &error));
  SiftTransfer st = { .kind = SIFT_TRANSFER_STORE, .store_id = id, .what = SIFT_LOAD_KV, .k = buf.data,
                      .v = buf.data + half, .cap = BLOCK, .event = ev };
  fail_writes = TRUE;
  o->submit (b, &st, 1);
  o->drain (b, FALSE);
  assert_int_equal (h.n_failed, 2);
  fail_writes = FALSE;
  o->submit (b, &st, 1);
  o->drain (b, FALSE);
  assert_int_equal (h.n_stores, 2);
  assert_int_equal (h.bytes_stored, 0);
  o->drain (b, TRUE);
  o->submit (b, &st, 1);
  o->drain (b, FALSE);
  assert_int_equal (h.bytes_stored, 2 * half);
  o->event_wait (b, &ev, 1, NULL, NULL);
  o->event_free (b, ev);
  o->buffer_free (b, &buf);
  o->free (b);
  sift_store_free (store);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_ops_table),
    cmocka_unit_test (test_store_then_load),
    cmocka_unit_test (test_failures),
    cmocka_unit_test (test_load_some_heads),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
