/* Every operation of the engine's CUDA backend against the CPU backend's
 * (in the manner of ggml's test-backend-ops): compute memory (alloc
 * zeroed, write / read, move, clear), pinned host memory, stores (from
 * the host image and from device memory) and loads (into a slot and into
 * a strided destination, K, V or both, in place from a pinned host store
 * or staged from a file or another dtype) bit for bit, a failed load's
 * error handed over once, attention over blocks (causal local tokens
 * last) by normalised error within the kernels' bounds (docs/kernels.md),
 * also with blocks masked per kv head (attend_heads),
 * the LSE merge, and the event-timed seconds. Fresh random data each
 * case, never zeros; exits 77 (skipped) without a GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <sift/cuda.h>

#include "backend.h"
#include "store-private.h"

enum { QH = 8, KVH = 2, BLOCK = 64 }; /* attention's heads; transfers also use 4 kv heads */

typedef struct {
  gint n_loads, n_stores, n_failed;
  guint64 bytes_loaded, bytes_stored;
} Heard;

static void
heard (gpointer user, const SiftTransfer *t, gboolean ok, guint64 bytes, gdouble seconds, const GError *error)
{
  Heard *h = user;
  (void) seconds;
  if (t->kind == SIFT_TRANSFER_LOAD)
    h->n_loads++, h->bytes_loaded += ok ? bytes : 0;
  else
    h->n_stores++, h->bytes_stored += bytes;
  h->n_failed += error != NULL;
}

typedef struct {
  SiftStore *store;
  SiftBackend *cpu, *gpu;
  Heard hc, hg;
  SiftModelShape shape;
  SiftDType compute;
  gint32 kvh;   /* kv heads */
  gsize half;   /* bytes of K (or V) of one block, compute dtype */
} Pair;

static void
pair_open (Pair *p, gint32 kvh, gint32 dim, SiftDType compute, SiftDType stored, const char *file)
{
  memset (p, 0, sizeof *p);
  g_autoptr (GError) error = NULL;
  SiftStoreConfig sc = { .dtype = stored, .n_kv_heads = kvh, .block_size = BLOCK, .head_dim = dim, .path = file };
  p->store = file ? sift_store_file_new (&sc, &error) : sift_store_host_new (&sc, &error);
  g_assert_no_error (error);
  p->shape = (SiftModelShape) { 1, QH, kvh, dim, BLOCK, BLOCK, 0 };
  p->compute = compute;
  p->kvh = kvh;
  p->half = (gsize) kvh * BLOCK * (gsize) dim * sift_dtype_size (compute);
  /* The GPU backend first: it makes the host store's chunks pinned. */
  SiftBackendSetup sg = { p->shape, compute, p->store, { heard, &p->hg } };
  p->gpu = sift_backend_cuda_new (&sg, &error);
  g_assert_no_error (error);
  SiftBackendSetup scpu = { p->shape, compute, p->store, { heard, &p->hc } };
  p->cpu = sift_backend_cpu_new (&scpu);
}

static void
pair_close (Pair *p)
{
  p->gpu->ops->free (p->gpu);
  p->cpu->ops->free (p->cpu);
  sift_store_free (p->store);
}

/* Random values of a dtype, never all zero. */
static void
fill_random (GRand *r, void *dst, SiftDType dtype, gsize n)
{
  g_autofree float *f = g_new (float, n);
  for (gsize i = 0; i < n; i++)
    f[i] = (float) g_rand_double_range (r, -2.0, 2.0);
  sift_convert (f, SIFT_DTYPE_F32, dst, dtype, n);
}

static void
read_back (SiftBackend *b, void *dst, const guint8 *src, gsize n)
{
  g_autoptr (GError) error = NULL;
  assert_true (b->ops->buffer_read (b, dst, src, n, &error));
  g_assert_no_error (error);
}

static void
test_memory (void **state)
{
  (void) state;
  Pair p;
  pair_open (&p, KVH, 64, SIFT_DTYPE_BF16, SIFT_DTYPE_BF16, NULL);
  const SiftBackendOps *o = p.gpu->ops;
  assert_int_equal (o->version, SIFT_BACKEND_VERSION);
  assert_true (o->struct_size >= sizeof (SiftBackendOps));
  assert_string_equal (o->name, "cuda");
  assert_non_null (o->buffer_read);
  assert_non_null (o->timings);
  assert_false (o->can_map (p.gpu, p.store, p.compute)); /* the kernels read device memory only */
  GRand *r = g_rand_new_with_seed (1);
  const gsize n = 10000;
  SiftBuffer gb, cb;
  assert_true (o->buffer_alloc (p.gpu, n, &gb, NULL));
  assert_true (p.cpu->ops->buffer_alloc (p.cpu, n, &cb, NULL));
  assert_int_equal (gb.space, SIFT_MEMORY_DEVICE);
  g_autofree guint8 *got = g_malloc (n), *src = g_malloc (n);
  memset (got, 0xAB, n);
  read_back (p.gpu, got, gb.data, n);
  for (gsize i = 0; i < n; i++)
    assert_int_equal (got[i], 0); /* zeroed */
  for (gsize i = 0; i < n; i++)
    src[i] = (guint8) g_rand_int (r);
  /* The same writes, moves and clears on both: the same bytes. */
  for (int w = 0; w < 2; w++)
    {
      SiftBackend *b = w == 0 ? p.gpu : p.cpu;
      guint8 *d = w == 0 ? gb.data : cb.data;
      b->ops->buffer_write (b, d, src, n);
      b->ops->buffer_move (b, d + 100, d + 5000, 3000);
      b->ops->buffer_clear (b, d + 9000, 333);
      b->ops->buffer_write (b, d + 17, src + 4000, 1); /* an odd one */
    }
  memset (src, 0, n); /* the source may change once write returned */
  read_back (p.gpu, got, gb.data, n);
  assert_memory_equal (got, cb.data, n);
  o->buffer_free (p.gpu, &gb);
  p.cpu->ops->buffer_free (p.cpu, &cb);
  guint8 *h = o->host_alloc (p.gpu, 5 << 20);
  for (gsize i = 0; i < (5u << 20); i += 4099)
    assert_int_equal (h[i], 0);
  o->host_free (p.gpu, h, 5 << 20);
  g_rand_free (r);
  pair_close (&p);
}

/* Stores one block through each backend, then loads it through each, in
 * each way, and compares bytes. */
static void
check_transfers (gint32 kvh, gint32 dim, SiftDType compute, SiftDType stored, gboolean file)
{
  g_autofree char *path = file ? g_strdup_printf ("%s/sift-cuda-backend-%d.store", g_get_tmp_dir (), (int) getpid ()) : NULL;
  Pair p;
  pair_open (&p, kvh, dim, compute, stored, path);
  GRand *r = g_rand_new_with_seed ((guint32) (kvh * 1000 + dim + compute * 7 + stored * 31 + file));
  const gsize es = sift_dtype_size (compute), elems = p.half / es;
  /* Compute-side source: [kvh][cap 3 * BLOCK][dim], the block at token BLOCK. */
  const gint64 cap = 3 * BLOCK;
  const gsize big = (gsize) kvh * (gsize) cap * (gsize) dim * es;
  const gsize at = (gsize) BLOCK * (gsize) dim * es;
  g_autofree guint8 *hk = g_malloc (big), *hv = g_malloc (big);
  fill_random (r, hk, compute, big / es);
  fill_random (r, hv, compute, big / es);
  (void) elems;
  SiftBuffer gk, gv;
  assert_true (p.gpu->ops->buffer_alloc (p.gpu, big, &gk, NULL));
  assert_true (p.gpu->ops->buffer_alloc (p.gpu, big, &gv, NULL));
  p.gpu->ops->buffer_write (p.gpu, gk.data, hk, big);
  p.gpu->ops->buffer_write (p.gpu, gv.data, hv, big);
  gint64 id[3];
  for (int i = 0; i < 3; i++)
    assert_true (sift_store_alloc (p.store, &id[i], NULL));
  SiftEvent *eg = p.gpu->ops->event_new (p.gpu), *ec = p.cpu->ops->event_new (p.cpu);
  /* id0: the CPU's store; id1: the GPU's from the host image; id2: from device memory. */
  SiftTransfer st = { .kind = SIFT_TRANSFER_STORE, .what = SIFT_LOAD_KV, .cap = cap, .layer = 0 };
  st.store_id = id[0], st.k = hk + at, st.v = hv + at, st.event = ec;
  p.cpu->ops->submit (p.cpu, &st, 1);
  p.cpu->ops->drain (p.cpu, FALSE);
  st.store_id = id[1], st.k = gk.data + at, st.v = gv.data + at, st.event = eg;
  st.host_k = hk + at, st.host_v = hv + at;
  p.gpu->ops->submit (p.gpu, &st, 1);
  st.store_id = id[2], st.host_k = st.host_v = NULL;
  p.gpu->ops->submit (p.gpu, &st, 1);
  p.gpu->ops->drain (p.gpu, FALSE);
  const gsize bb = sift_store_block_bytes (p.store);
  g_autofree guint8 *b0 = g_malloc (bb), *b1 = g_malloc (bb);
  assert_true (sift_store_read (p.store, id[0], 0, b0, bb, NULL));
  for (int i = 1; i < 3; i++)
    {
      assert_true (sift_store_read (p.store, id[i], 0, b1, bb, NULL));
      assert_memory_equal (b0, b1, bb);
    }
  assert_int_equal (p.hg.bytes_stored, 2 * p.hc.bytes_stored);

  /* Loads of id0: into a slot (cap BLOCK) and into the strided buffer at
   * token 2 * BLOCK; K, V and both; every kv head, and each one alone
   * (in place or staged), and with 4 kv heads every subset, 0b0101 and
   * 0b1011 among them (runs of heads apart): the other heads' rows stay
   * as they were and each load's bytes are the wanted heads' only, as on
   * the CPU. */
  const SiftLoadWhat whats[] = { SIFT_LOAD_KV, SIFT_LOAD_K, SIFT_LOAD_V };
  const int n_masks = 1 << kvh; /* 0: every head */
  g_autofree guint8 *ck = g_malloc0 (big), *cv = g_malloc0 (big), *got = g_malloc (big);
  for (gsize w = 0; w < G_N_ELEMENTS (whats); w++)
    for (int strided = 0; strided < 2; strided++)
      for (int mask = 0; mask < n_masks; mask++)
      {
        const gint64 lcap = strided ? cap : BLOCK;
        const gsize off = strided ? 2 * at : 0;
        memset (ck, 0, big), memset (cv, 0, big);
        p.gpu->ops->buffer_clear (p.gpu, gk.data, big);
        p.gpu->ops->buffer_clear (p.gpu, gv.data, big);
        SiftTransfer ld = { .kind = SIFT_TRANSFER_LOAD, .store_id = id[0], .what = whats[w], .cap = lcap,
                            .kv_heads = (guint64) mask };
        ld.k = ck + off, ld.v = cv + off, ld.event = ec;
        const guint64 cpu0 = p.hc.bytes_loaded, gpu0 = p.hg.bytes_loaded;
        p.cpu->ops->submit (p.cpu, &ld, 1);
        assert_true (p.cpu->ops->event_wait (p.cpu, &ec, 1, NULL, NULL));
        ld.k = gk.data + off, ld.v = gv.data + off, ld.event = eg;
        p.gpu->ops->submit (p.gpu, &ld, 1);
        assert_true (p.gpu->ops->event_wait (p.gpu, &eg, 1, NULL, NULL));
        read_back (p.gpu, got, gk.data, big);
        assert_memory_equal (got, ck, big);
        read_back (p.gpu, got, gv.data, big);
        assert_memory_equal (got, cv, big);
        assert_int_equal (p.gpu->ops->event_query (p.gpu, eg), SIFT_EVENT_DONE);
        const guint64 heads = mask ? (guint64) __builtin_popcount ((unsigned) mask) : (guint64) kvh;
        const guint64 per = whats[w] == SIFT_LOAD_KV ? 2 : 1;
        assert_int_equal (p.hc.bytes_loaded - cpu0, sift_store_block_bytes (p.store) / (guint64) kvh / 2 * heads * per);
        assert_int_equal (p.hg.bytes_loaded - gpu0, p.hc.bytes_loaded - cpu0);
      }
  assert_int_equal (p.hg.bytes_loaded, p.hc.bytes_loaded);
  assert_int_equal (p.hg.n_loads, p.hc.n_loads);

  /* A load that fails (an id the store never held): heard, handed over
   * once by the wait, then gone. A file store fails its read; a host
   * store cannot map it either and stages the same read. */
  SiftTransfer bad = { .kind = SIFT_TRANSFER_LOAD, .store_id = 1000, .what = SIFT_LOAD_KV, .k = gk.data,
                       .v = gv.data, .cap = BLOCK, .event = eg };
  p.gpu->ops->submit (p.gpu, &bad, 1);
  assert_int_equal (p.hg.n_failed, 1);
  p.gpu->ops->drain (p.gpu, FALSE);
  assert_int_equal (p.gpu->ops->event_query (p.gpu, eg), SIFT_EVENT_FAILED);
  g_autoptr (GError) error = NULL;
  gsize n_ok = 9;
  assert_false (p.gpu->ops->event_wait (p.gpu, &eg, 1, &n_ok, &error));
  assert_non_null (error);
  assert_int_equal (n_ok, 0);
  assert_true (p.gpu->ops->event_wait (p.gpu, &eg, 1, NULL, NULL));

  for (int i = 0; i < 3; i++)
    sift_store_release (p.store, id[i]);
  p.gpu->ops->drain (p.gpu, TRUE);
  p.gpu->ops->event_free (p.gpu, eg);
  p.cpu->ops->event_free (p.cpu, ec);
  p.gpu->ops->buffer_free (p.gpu, &gk);
  p.gpu->ops->buffer_free (p.gpu, &gv);
  g_rand_free (r);
  pair_close (&p);
}

static void
test_transfers (void **state)
{
  (void) state;
  check_transfers (KVH, 64, SIFT_DTYPE_BF16, SIFT_DTYPE_BF16, FALSE); /* pinned host store, in place */
  check_transfers (KVH, 128, SIFT_DTYPE_F16, SIFT_DTYPE_F16, FALSE);
  check_transfers (KVH, 64, SIFT_DTYPE_F16, SIFT_DTYPE_F32, FALSE);   /* converted on load and store */
  check_transfers (KVH, 128, SIFT_DTYPE_BF16, SIFT_DTYPE_Q8_0, FALSE);
  check_transfers (KVH, 64, SIFT_DTYPE_BF16, SIFT_DTYPE_BF16, TRUE);  /* a file store: staged */
  check_transfers (KVH, 128, SIFT_DTYPE_F16, SIFT_DTYPE_F32, TRUE);
  check_transfers (4, 64, SIFT_DTYPE_BF16, SIFT_DTYPE_BF16, FALSE);   /* heads in runs apart */
  check_transfers (4, 64, SIFT_DTYPE_F16, SIFT_DTYPE_F32, FALSE);
  check_transfers (4, 128, SIFT_DTYPE_BF16, SIFT_DTYPE_BF16, TRUE);
}

static double
rel_l2 (const float *got, const float *want, gsize n)
{
  double num = 0, den = 0;
  for (gsize i = 0; i < n; i++)
    {
      if (!isfinite (got[i]))
        return INFINITY;
      num += ((double) got[i] - want[i]) * ((double) got[i] - want[i]);
      den += (double) want[i] * want[i];
    }
  return sqrt (num / MAX (den, 1e-30));
}

/* The GPU's output and LSE against the CPU's: relative L2 error of the
 * output within bound, each LSE within 5 bound (1 + |lse|). */
static void
check_close (const char *what, gint32 dim, SiftDType compute, gint32 n_q, const float *gout, const float *glse,
             const float *want, const float *want_lse, double bound)
{
  const gsize qn = (gsize) QH * n_q * dim;
  double e = rel_l2 (gout, want, qn);
  if (e > bound)
    fail_msg ("%s d%d %s rows %d: relative error %.3g > %g", what, dim, sift_dtype_name (compute), n_q, e, bound);
  for (gint32 i = 0; i < QH * n_q; i++)
    assert_true (fabsf (glse[i] - want_lse[i]) <= 5 * bound * (1 + fabsf (want_lse[i])));
}

/* Attention over n_blocks stored blocks of varying length plus causal
 * local tokens, then a second call merged into the first, on both. */
static void
check_attend (gint32 dim, SiftDType compute, gint32 n_q, guint32 seed)
{
  Pair p;
  pair_open (&p, KVH, dim, compute, compute, NULL);
  GRand *r = g_rand_new_with_seed (seed);
  enum { NB = 5 };
  const gint32 valid[NB] = { BLOCK, 17, BLOCK, 40, 33 }; /* the last: the local tokens */
  const gsize es = sift_dtype_size (compute);
  const gsize qn = (gsize) QH * n_q * dim;
  g_autofree float *q = g_new (float, qn);
  fill_random (r, q, SIFT_DTYPE_F32, qn);
  SiftView ck[NB], cv[NB], gkv[NB], gvv[NB];
  g_autofree guint8 *host = g_malloc (2 * NB * p.half);
  SiftBuffer dev;
  assert_true (p.gpu->ops->buffer_alloc (p.gpu, 2 * NB * p.half, &dev, NULL));
  fill_random (r, host, compute, 2 * NB * p.half / es);
  p.gpu->ops->buffer_write (p.gpu, dev.data, host, 2 * NB * p.half);
  for (int i = 0; i < NB; i++)
    {
      const gsize ko = 2 * i * p.half, vo = ko + p.half;
      ck[i] = sift_view_strided (host + ko, compute, KVH, valid[i], dim, (gint64) BLOCK * dim, dim);
      cv[i] = sift_view_strided (host + vo, compute, KVH, valid[i], dim, (gint64) BLOCK * dim, dim);
      gkv[i] = ck[i], gvv[i] = cv[i];
      gkv[i].data = dev.data + ko, gvv[i].data = dev.data + vo;
      gkv[i].space = gvv[i].space = SIFT_MEMORY_DEVICE;
    }
  /* Device q, out, lse, partials. */
  SiftBuffer dq, dout, dlse, dpart, dplse;
  const gsize on = qn * sizeof (float), ln = (gsize) QH * n_q * sizeof (float);
  assert_true (p.gpu->ops->buffer_alloc (p.gpu, on, &dq, NULL));
  assert_true (p.gpu->ops->buffer_alloc (p.gpu, on, &dout, NULL));
  assert_true (p.gpu->ops->buffer_alloc (p.gpu, ln, &dlse, NULL));
  assert_true (p.gpu->ops->buffer_alloc (p.gpu, on, &dpart, NULL));
  assert_true (p.gpu->ops->buffer_alloc (p.gpu, ln, &dplse, NULL));
  p.gpu->ops->buffer_write (p.gpu, dq.data, q, on);
  SiftView hq = sift_view_htd (q, SIFT_DTYPE_F32, QH, n_q, dim), gq = hq;
  gq.data = dq.data, gq.space = SIFT_MEMORY_DEVICE;
  g_autofree float *cout = g_new (float, qn), *clse = g_new (float, QH * n_q);
  g_autofree float *cpart = g_new (float, qn), *cplse = g_new (float, QH * n_q);
  g_autofree float *gout = g_new (float, qn), *glse = g_new (float, QH * n_q);
  SiftView co = sift_view_htd (cout, SIFT_DTYPE_F32, QH, n_q, dim), cp = co, go = co, gp = co;
  cp.data = cpart;
  go.data = dout.data, gp.data = dpart.data;
  go.space = gp.space = SIFT_MEMORY_DEVICE;
  /* Call 1: the first three blocks (not causal); call 2: block 4 and the
   * local tokens, causal; merged. */
  SiftAttnOpts o1 = { .scale = 1.0f / sqrtf ((float) dim) };
  /* The rows are the last n_q local tokens. */
  SiftAttnOpts o2 = { .scale = o1.scale, .causal = TRUE, .q_offset = valid[3] + valid[NB - 1] - n_q };
  g_autoptr (GError) error = NULL;
  assert_true (p.cpu->ops->attend (p.cpu, &hq, ck, cv, 3, &o1, &co, clse, &error));
  assert_true (p.cpu->ops->attend (p.cpu, &hq, ck + 3, cv + 3, 2, &o2, &cp, cplse, &error));
  g_assert_no_error (error);
  g_autofree float *c1 = g_memdup2 (cout, on), *l1 = g_memdup2 (clse, ln);
  assert_true (p.cpu->ops->merge (p.cpu, &co, clse, &cp, cplse, &error));
  assert_true (p.gpu->ops->attend (p.gpu, &gq, gkv, gvv, 3, &o1, &go, (float *) (void *) dlse.data, &error));
  g_assert_no_error (error);
  read_back (p.gpu, gout, dout.data, on);
  read_back (p.gpu, glse, dlse.data, ln);
  const double bound = compute == SIFT_DTYPE_BF16 ? 1e-2 : 2.5e-3;
  check_close ("attend", dim, compute, n_q, gout, glse, c1, l1, bound);
  assert_true (p.gpu->ops->attend (p.gpu, &gq, gkv + 3, gvv + 3, 2, &o2, &gp, (float *) (void *) dplse.data, &error));
  assert_true (p.gpu->ops->merge (p.gpu, &go, (float *) (void *) dlse.data, &gp, (const float *) (void *) dplse.data,
                                  &error));
  g_assert_no_error (error);
  read_back (p.gpu, gout, dout.data, on);
  read_back (p.gpu, glse, dlse.data, ln);
  check_close ("attend+merge", dim, compute, n_q, gout, glse, cout, clse, bound);
  /* The merge alone, on identical inputs: f32 arithmetic on both. */
  g_autofree float *pa = g_new (float, qn), *pb = g_new (float, qn), *la = g_new (float, QH * n_q),
                   *lb = g_new (float, QH * n_q);
  fill_random (r, pa, SIFT_DTYPE_F32, qn);
  fill_random (r, pb, SIFT_DTYPE_F32, qn);
  for (gint32 i = 0; i < QH * n_q; i++)
    la[i] = (float) g_rand_double_range (r, -3, 3), lb[i] = i % 5 == 0 ? -INFINITY : (float) g_rand_double_range (r, -3, 3);
  p.gpu->ops->buffer_write (p.gpu, dout.data, pa, on);
  p.gpu->ops->buffer_write (p.gpu, dlse.data, la, ln);
  p.gpu->ops->buffer_write (p.gpu, dpart.data, pb, on);
  p.gpu->ops->buffer_write (p.gpu, dplse.data, lb, ln);
  SiftView ma = sift_view_htd (pa, SIFT_DTYPE_F32, QH, n_q, dim), mb = ma;
  mb.data = pb;
  assert_true (p.cpu->ops->merge (p.cpu, &ma, la, &mb, lb, &error));
  assert_true (p.gpu->ops->merge (p.gpu, &go, (float *) (void *) dlse.data, &gp, (const float *) (void *) dplse.data,
                                  &error));
  read_back (p.gpu, gout, dout.data, on);
  read_back (p.gpu, glse, dlse.data, ln);
  assert_true (rel_l2 (gout, pa, qn) < 1e-6);
  for (gint32 i = 0; i < QH * n_q; i++)
    assert_true (fabsf (glse[i] - la[i]) <= 1e-5f * (1 + fabsf (la[i])));
  /* attend_heads: every block with the kv heads that attend it (a
   * per-kv-head selection; the local tokens, causal, by both), in one call
   * (up to 16 rows a kv head) or one per kv head, against the CPU's
   * attend per kv head over that head's blocks, its causal offset less
   * the tokens it skips. Output and LSE poisoned (NaN) first. */
  const guint64 masks[NB] = { 1, 2, 3, 2, 3 };
  const gint32 G = QH / KVH;
  gint64 stored = 0;
  for (int i = 0; i < NB - 1; i++)
    stored += valid[i];
  SiftAttnOpts oh = { .scale = o1.scale, .causal = TRUE, .q_offset = stored + valid[NB - 1] - n_q };
  for (gint32 g = 0; g < KVH; g++)
    {
      SiftView hk[NB], hv[NB];
      gint32 m = 0;
      gint64 skipped = 0;
      for (int i = 0; i < NB; i++)
        if ((masks[i] >> g) & 1)
          hk[m] = sift_view_heads (&ck[i], g, 1), hv[m++] = sift_view_heads (&cv[i], g, 1);
        else
          skipped += valid[i];
      SiftAttnOpts og = oh;
      og.q_offset -= skipped;
      SiftView qs = sift_view_heads (&hq, g * G, G), os = sift_view_heads (&co, g * G, G);
      assert_true (p.cpu->ops->attend (p.cpu, &qs, hk, hv, (gsize) m, &og, &os, clse + g * G * n_q, &error));
    }
  g_assert_no_error (error);
  g_autofree float *nan_out = g_new (float, qn);
  for (gsize i = 0; i < qn; i++)
    nan_out[i] = NAN;
  p.gpu->ops->buffer_write (p.gpu, dout.data, nan_out, on);
  p.gpu->ops->buffer_write (p.gpu, dlse.data, nan_out, ln);
  assert_true (p.gpu->ops->attend_heads (p.gpu, &gq, gkv, gvv, masks, NB, &oh, &go, (float *) (void *) dlse.data,
                                         &error));
  g_assert_no_error (error);
  read_back (p.gpu, gout, dout.data, on);
  read_back (p.gpu, glse, dlse.data, ln);
  check_close ("attend_heads", dim, compute, n_q, gout, glse, cout, clse, bound);
  /* The kernels' time, on the GPU's clock. */
  SiftBackendTimes t;
  p.gpu->ops->timings (p.gpu, &t);
  assert_true (t.compute > 0);
  SiftBuffer *all[] = { &dev, &dq, &dout, &dlse, &dpart, &dplse };
  for (gsize i = 0; i < G_N_ELEMENTS (all); i++)
    p.gpu->ops->buffer_free (p.gpu, all[i]);
  g_rand_free (r);
  pair_close (&p);
}

static void
test_attend (void **state)
{
  (void) state;
  guint32 seed = 100;
  const gint32 rows[] = { 1, 4, 16, 33 };
  for (int d = 0; d < 2; d++)
    for (int t = 0; t < 2; t++)
      for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
        check_attend (d == 0 ? 64 : 128, t == 0 ? SIFT_DTYPE_F16 : SIFT_DTYPE_BF16, rows[i], seed++);
}

int
main (void)
{
  g_autoptr (GError) error = NULL;
  if (!sift_cuda_init (&error))
    {
      g_print ("skipped: %s\n", error->message);
      return 77;
    }
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_memory),
    cmocka_unit_test (test_transfers),
    cmocka_unit_test (test_attend),
  };
  if (g_getenv ("SIFT_TEST_FILTER") != NULL) /* a cmocka test-name filter (for the sanitizers) */
    cmocka_set_test_filter (g_getenv ("SIFT_TEST_FILTER"));
  return cmocka_run_group_tests (tests, NULL, NULL);
}
