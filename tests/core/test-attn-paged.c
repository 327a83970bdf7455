/* sift_attn_paged against the contiguous kernels on the concatenation of
 * its blocks: random splits (empty and partial blocks, blocks of their own
 * layout and strides), causal or not, GQA 1/4/8, f32/f16/bf16, few rows
 * (decode path) and many rows (tiled path), every ISA this CPU has. The
 * paged call must give the same bits as sift_attn_decode (few rows) or
 * sift_attn_dense (many rows) on one view of the same keys, and stay within
 * a tight NMSE of the scalar reference path. Misuse returns errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#define NMSE_BOUND 1e-9

typedef struct {
  gint32 d, kv_heads, group;
  gint64 n_q, n_kv;
  SiftDType dtype;
  gboolean causal;
  gint64 q_offset;
  gint threads;
} Case;

/* K or V of the concatenation and the same values split into blocks. */
typedef struct {
  void *all;          /* [kv_heads][n_kv][d] in dtype */
  SiftView all_view;
  void **block_data;  /* [n_blocks] each block's own buffer */
  SiftView *blocks;   /* [n_blocks] */
} Paged;

/* Splits n_kv keys into blocks of random sizes, some empty. */
static gsize
random_split (GRand *r, gint64 n_kv, gint64 *sizes, gsize max_blocks)
{
  gsize n = 0;
  gint64 left = n_kv;
  gint64 unit = g_rand_boolean (r) ? 128 : g_rand_int_range (r, 1, 200);
  while ((left > 0 || g_rand_int_range (r, 0, 4) == 0) && n + 1 < max_blocks)
    {
      gint64 s;
      switch (g_rand_int_range (r, 0, 5))
        {
        case 0: s = 0; break;                                 /* empty block */
        case 1: s = g_rand_int_range (r, 1, (gint32) unit + 1); break; /* partial */
        default: s = unit; break;
        }
      s = MIN (s, left);
      sizes[n++] = s;
      left -= s;
    }
  if (left > 0)
    sizes[n++] = left;
  return n;
}

/* Fills `p` with random values; blocks copy them, each in a layout of its
 * own: head-major, token-major, or head-major with padded rows. */
static void
paged_fill (Paged *p, const Case *c, GRand *r, const gint64 *sizes, gsize n_blocks, double lo,
            double hi)
{
  gsize n = (gsize) (c->kv_heads * c->n_kv * c->d), es = sift_dtype_size (c->dtype);
  float *tmp = g_new (float, MAX (n, 1));
  for (gsize i = 0; i < n; i++)
    tmp[i] = (float) g_rand_double_range (r, lo, hi);
  p->all = g_malloc (MAX (n, 1) * es);
  sift_convert (tmp, SIFT_DTYPE_F32, p->all, c->dtype, n);
  g_free (tmp);
  p->all_view = sift_view_htd (p->all, c->dtype, c->kv_heads, c->n_kv, c->d);
  p->block_data = g_new0 (void *, MAX (n_blocks, 1));
  p->blocks = g_new0 (SiftView, MAX (n_blocks, 1));
  gint64 t0 = 0;
  for (gsize b = 0; b < n_blocks; b++)
    {
      gint64 nb = sizes[b];
      int layout = g_rand_int_range (r, 0, 3);
      gint64 pad = layout == 2 ? 8 : 0;
      gsize bn = (gsize) (c->kv_heads * nb * (c->d + pad));
      /* An empty block may have no data at all. */
      p->block_data[b] = nb == 0 && g_rand_boolean (r) ? NULL : g_malloc0 (MAX (bn, 1) * es);
      SiftView v = layout == 1 ? sift_view_thd (p->block_data[b], c->dtype, nb, c->kv_heads, c->d)
                               : sift_view_htd (p->block_data[b], c->dtype, c->kv_heads, nb, c->d);
      if (layout == 2)
        {
          v.token_stride = c->d + pad;
          v.head_stride = nb * (c->d + pad);
        }
      for (gint32 h = 0; h < c->kv_heads; h++)
        for (gint64 t = 0; t < nb; t++)
          memcpy (sift_view_row (&v, h, t), sift_view_row (&p->all_view, h, t0 + t),
                  (gsize) c->d * es);
      p->blocks[b] = v;
      t0 += nb;
    }
}

static void
paged_clear (Paged *p, gsize n_blocks)
{
  for (gsize b = 0; b < n_blocks; b++)
    g_free (p->block_data[b]);
  g_free (p->block_data);
  g_free (p->blocks);
  g_free (p->all);
}

static double
nmse (const float *x, const float *ref, gsize n)
{
  double num = 0, den = 0;
  for (gsize i = 0; i < n; i++)
    {
      num += ((double) x[i] - ref[i]) * ((double) x[i] - ref[i]);
      den += (double) ref[i] * ref[i];
    }
  return den > 0 ? num / den : num;
}

static const SiftIsa all_isas[] = { SIFT_ISA_SCALAR, SIFT_ISA_AVX2, SIFT_ISA_AVX512 };

static void
check_case (const Case *c, guint32 seed)
{
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  gint64 sizes[512];
  gsize n_blocks = random_split (r, c->n_kv, sizes, G_N_ELEMENTS (sizes));
  Paged k, v;
  paged_fill (&k, c, r, sizes, n_blocks, -1, 1);
  paged_fill (&v, c, r, sizes, n_blocks, -2, 2);
  gint32 hq = c->kv_heads * c->group;
  gsize nq = (gsize) (hq * c->n_q * c->d), nl = (gsize) (hq * c->n_q);
  float *q = g_new (float, nq), *o = g_new (float, nq), *o_ref = g_new (float, nq);
  float *o_scalar = g_new (float, nq);
  float *lse = g_new (float, nl), *lse_ref = g_new (float, nl), *lse_scalar = g_new (float, nl);
  for (gsize i = 0; i < nq; i++)
    q[i] = (float) g_rand_double_range (r, -1, 1);
  SiftView qv = sift_view_htd (q, SIFT_DTYPE_F32, hq, c->n_q, c->d);
  SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, hq, c->n_q, c->d);
  SiftView rv = sift_view_htd (o_ref, SIFT_DTYPE_F32, hq, c->n_q, c->d);
  SiftAttnOpts opts = { .causal = c->causal, .q_offset = c->q_offset };
  gboolean few = c->n_q <= SIFT_ATTN_DECODE_MAX_ROWS;
  sift_parallel_set_n_threads (c->threads);

  for (gsize i = 0; i < G_N_ELEMENTS (all_isas); i++)
    {
      if (!sift_isa_force (all_isas[i]))
        continue;
      g_autoptr (GError) error = NULL;
      gboolean ok = few ? sift_attn_decode (&qv, &k.all_view, &v.all_view, &opts, &rv, lse_ref, &error)
                        : sift_attn_dense (&qv, &k.all_view, &v.all_view, &opts, &rv, lse_ref, &error);
      if (!ok)
        fail_msg ("contiguous call failed: %s", error->message);
      for (gsize e = 0; e < nq; e++)
        o[e] = NAN; /* every element must be written */
      if (!sift_attn_paged (&qv, k.blocks, v.blocks, n_blocks, &opts, &ov, lse, &error))
        fail_msg ("paged call failed: %s", error->message);
      if (memcmp (o, o_ref, nq * sizeof (float)) != 0 || memcmp (lse, lse_ref, nl * sizeof (float)) != 0)
        fail_msg ("%s d %d kv_heads %d group %d n_q %" G_GINT64_FORMAT " n_kv %" G_GINT64_FORMAT
                  " in %" G_GSIZE_FORMAT " blocks, %s causal %d offset %" G_GINT64_FORMAT
                  " threads %d: paged differs from the contiguous call (nmse %.3g)",
                  sift_isa_name (all_isas[i]), c->d, c->kv_heads, c->group, c->n_q, c->n_kv,
                  n_blocks, sift_dtype_name (c->dtype), c->causal, c->q_offset, c->threads,
                  nmse (o, o_ref, nq));
      if (all_isas[i] == SIFT_ISA_SCALAR)
        {
          memcpy (o_scalar, o, nq * sizeof (float));
          memcpy (lse_scalar, lse, nl * sizeof (float));
          continue;
        }
      double err = nmse (o, o_scalar, nq);
      if (!(err <= NMSE_BOUND))
        fail_msg ("%s: paged nmse %.3g against the scalar path", sift_isa_name (all_isas[i]), err);
      for (gsize e = 0; e < nl; e++)
        if (lse_scalar[e] == -INFINITY)
          assert_true (lse[e] == -INFINITY);
        else
          assert_true (fabsf (lse[e] - lse_scalar[e]) <= 2e-6f * (1.0f + fabsf (lse_scalar[e])));
    }
  sift_isa_force (sift_isa_detect ());
  paged_clear (&k, n_blocks);
  paged_clear (&v, n_blocks);
  g_free (q), g_free (o), g_free (o_ref), g_free (o_scalar);
  g_free (lse), g_free (lse_ref), g_free (lse_scalar);
}

static void
random_cases (gboolean many_rows, guint32 seed, int n_cases)
{
  static const gint32 dims[] = { 64, 96, 128 };
  static const gint32 groups[] = { 1, 4, 8 };
  static const SiftDType dtypes[] = { SIFT_DTYPE_F32, SIFT_DTYPE_F16, SIFT_DTYPE_BF16 };
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  for (int n = 0; n < n_cases; n++)
    {
      Case c = {
        .d = dims[g_rand_int_range (r, 0, G_N_ELEMENTS (dims))],
        .kv_heads = g_rand_int_range (r, 1, 3),
        .group = groups[n % G_N_ELEMENTS (groups)],
        .dtype = dtypes[(n / 3) % G_N_ELEMENTS (dtypes)],
        .causal = g_rand_boolean (r),
        .threads = g_rand_int_range (r, 1, 3),
      };
      c.n_q = many_rows ? g_rand_int_range (r, SIFT_ATTN_DECODE_MAX_ROWS + 1, 80)
                        : g_rand_int_range (r, 1, SIFT_ATTN_DECODE_MAX_ROWS + 1);
      c.n_kv = g_rand_int_range (r, 0, 6) == 0 ? g_rand_int_range (r, 0, 40)
                                               : g_rand_int_range (r, 1, 2500);
      /* Keep the scalar path cheap: q_heads * n_q * n_kv * d <= 2^23. */
      c.n_kv = MIN (c.n_kv, (gint64) (1 << 23) / (c.kv_heads * c.group * c.n_q * c.d));
      /* A chunk at the end of the keys, or an offset anywhere (rows that see no key). */
      c.q_offset = g_rand_boolean (r) ? MAX (0, c.n_kv - c.n_q) : g_rand_int_range (r, -4, (gint32) c.n_kv + 4);
      check_case (&c, g_rand_int (r));
    }
}

static void
test_paged_few_rows (void **state)
{
  (void) state;
  random_cases (FALSE, 11, 36);
}

static void
test_paged_many_rows (void **state)
{
  (void) state;
  random_cases (TRUE, 12, 24);
}

/* A long decode split over threads, keys in 128-token blocks with a
 * partial last block: the split points fall inside and between blocks. */
static void
test_paged_long_decode (void **state)
{
  (void) state;
  Case c = { .d = 128, .kv_heads = 2, .group = 4, .n_q = 1, .n_kv = 16384 + 77,
             .dtype = SIFT_DTYPE_F16, .causal = TRUE, .q_offset = 16384 + 76, .threads = 2 };
  check_case (&c, 5);
  c.group = 1;
  c.causal = FALSE;
  check_case (&c, 6);
}

/* No blocks, and only empty blocks: every row gets o = 0 and lse = -inf. */
static void
test_paged_no_keys (void **state)
{
  (void) state;
  float q[2 * 3 * 64], o[2 * 3 * 64], lse[2 * 3];
  for (gsize i = 0; i < G_N_ELEMENTS (q); i++)
    q[i] = 1.0f;
  SiftView qv = sift_view_htd (q, SIFT_DTYPE_F32, 2, 3, 64);
  SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, 2, 3, 64);
  SiftView empty = sift_view_htd (NULL, SIFT_DTYPE_F16, 1, 0, 64);
  SiftView blocks[3] = { empty, empty, empty };
  for (gsize n = 0; n <= 3; n += 3)
    {
      g_autoptr (GError) error = NULL;
      memset (o, 0xff, sizeof o);
      assert_true (sift_attn_paged (&qv, blocks, blocks, n, NULL, &ov, lse, &error));
      for (gsize i = 0; i < G_N_ELEMENTS (o); i++)
        assert_true (o[i] == 0.0f);
      for (gsize i = 0; i < G_N_ELEMENTS (lse); i++)
        assert_true (lse[i] == -INFINITY);
    }
}

static void
expect_error (gboolean ok, GError **perror, gint code)
{
  assert_false (ok);
  assert_non_null (*perror);
  assert_true (g_error_matches (*perror, SIFT_ATTN_ERROR, code));
  g_clear_error (perror);
}

static void
test_paged_misuse (void **state)
{
  (void) state;
  float q[4 * 64], o[4 * 64], lse[4], kf[2 * 8 * 64];
  guint16 kh[2 * 8 * 64] = { 0 };
  memset (q, 0, sizeof q);
  memset (kf, 0, sizeof kf);
  SiftView qv = sift_view_htd (q, SIFT_DTYPE_F32, 4, 1, 64);
  SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, 4, 1, 64);
  SiftView k32 = sift_view_htd (kf, SIFT_DTYPE_F32, 2, 8, 64);
  SiftView k16 = sift_view_htd (kh, SIFT_DTYPE_F16, 2, 8, 64);
  SiftView blocks[2] = { k32, k32 };
  GError *error = NULL;

  assert_true (sift_attn_paged (&qv, blocks, blocks, 2, NULL, &ov, lse, &error));
  expect_error (sift_attn_paged (NULL, blocks, blocks, 2, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_INVALID);
  expect_error (sift_attn_paged (&qv, NULL, blocks, 2, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_INVALID);
  expect_error (sift_attn_paged (&qv, blocks, NULL, 2, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_INVALID);
  expect_error (sift_attn_paged (&qv, blocks, blocks, 2, NULL, NULL, lse, &error), &error,
                SIFT_ATTN_ERROR_INVALID);
  expect_error (sift_attn_paged (&qv, blocks, blocks, 2, NULL, &ov, NULL, &error), &error,
                SIFT_ATTN_ERROR_INVALID);

  /* K and V of different dtypes, or blocks of different dtypes. */
  SiftView mixed[2] = { k32, k16 };
  SiftView v16[2] = { k16, k16 };
  expect_error (sift_attn_paged (&qv, blocks, v16, 2, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_INVALID);
  expect_error (sift_attn_paged (&qv, mixed, mixed, 2, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_INVALID);

  /* head_dim of a block differs from q's, or from block 0's. */
  SiftView d32 = sift_view_htd (kf, SIFT_DTYPE_F32, 2, 8, 32);
  SiftView bad_d[2] = { k32, d32 };
  expect_error (sift_attn_paged (&qv, bad_d, bad_d, 2, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_SHAPE);
  SiftView all_d32[2] = { d32, d32 };
  expect_error (sift_attn_paged (&qv, all_d32, all_d32, 2, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_SHAPE);

  /* Head counts: a block with other heads, kv heads that do not divide q's. */
  SiftView h1 = sift_view_htd (kf, SIFT_DTYPE_F32, 1, 8, 64);
  SiftView bad_h[2] = { k32, h1 };
  expect_error (sift_attn_paged (&qv, bad_h, bad_h, 2, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_SHAPE);
  SiftView h3 = sift_view_htd (kf, SIFT_DTYPE_F32, 3, 4, 64);
  SiftView all_h3[1] = { h3 };
  expect_error (sift_attn_paged (&qv, all_h3, all_h3, 1, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_SHAPE);

  /* K and V blocks of different lengths; a block with no data. */
  SiftView short_v[2] = { k32, sift_view_htd (kf, SIFT_DTYPE_F32, 2, 4, 64) };
  expect_error (sift_attn_paged (&qv, blocks, short_v, 2, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_SHAPE);
  SiftView no_data[2] = { k32, sift_view_htd (NULL, SIFT_DTYPE_F32, 2, 8, 64) };
  expect_error (sift_attn_paged (&qv, no_data, no_data, 2, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_INVALID);

  /* out of another shape than q. */
  SiftView ov2 = sift_view_htd (o, SIFT_DTYPE_F32, 2, 2, 64);
  expect_error (sift_attn_paged (&qv, blocks, blocks, 2, NULL, &ov2, lse, &error), &error,
                SIFT_ATTN_ERROR_SHAPE);
}

/* Views say where their memory is; the CPU kernels read host memory only
 * and refuse a device view, naming it, before touching any data. Device
 * data here is a pointer no CPU may follow. */
static void
test_device_views_refused (void **state)
{
  (void) state;
  float q[4 * 64], o[4 * 64], lse[4], kf[2 * 8 * 64], o2[4 * 64], lse2[4];
  memset (q, 0, sizeof q);
  memset (kf, 0, sizeof kf);
  memset (o2, 0, sizeof o2);
  memset (lse2, 0, sizeof lse2);
  SiftView qv = sift_view_htd (q, SIFT_DTYPE_F32, 4, 1, 64);
  SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, 4, 1, 64);
  SiftView o2v = sift_view_htd (o2, SIFT_DTYPE_F32, 4, 1, 64);
  SiftView kv = sift_view_htd (kf, SIFT_DTYPE_F32, 2, 8, 64);
  assert_int_equal (kv.space, SIFT_MEMORY_HOST);
  SiftView dev = sift_view_htd ((void *) (guintptr) 0x10, SIFT_DTYPE_F32, 2, 8, 64);
  dev.space = SIFT_MEMORY_DEVICE;
  SiftView qdev = sift_view_htd ((void *) (guintptr) 0x10, SIFT_DTYPE_F32, 4, 1, 64);
  qdev.space = SIFT_MEMORY_DEVICE;
  const gint64 rows[] = { 0, 1 };
  SiftView blocks[2] = { kv, dev };
  GError *error = NULL;

  /* The host views alone work. */
  assert_true (sift_attn_dense (&qv, &kv, &kv, NULL, &ov, lse, &error));
  expect_error (sift_attn_dense (&qv, &dev, &kv, NULL, &ov, lse, &error), &error, SIFT_ATTN_ERROR_INVALID);
  expect_error (sift_attn_dense (&qv, &kv, &dev, NULL, &ov, lse, &error), &error, SIFT_ATTN_ERROR_INVALID);
  expect_error (sift_attn_decode (&qdev, &kv, &kv, NULL, &ov, lse, &error), &error, SIFT_ATTN_ERROR_INVALID);
  expect_error (sift_attn_gather (&qv, &dev, &kv, rows, 2, NULL, &ov, lse, &error), &error,
                SIFT_ATTN_ERROR_INVALID);
  assert_false (sift_attn_paged (&qv, blocks, blocks, 2, NULL, &ov, lse, &error));
  assert_true (g_error_matches (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID));
  assert_non_null (strstr (error->message, "k_blocks[1]: view is in device memory"));
  g_clear_error (&error);
  expect_error (sift_attn_merge (&qdev, lse, &o2v, lse2, &error), &error, SIFT_ATTN_ERROR_INVALID);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_paged_misuse),
    cmocka_unit_test (test_device_views_refused),
    cmocka_unit_test (test_paged_no_keys),
    cmocka_unit_test (test_paged_few_rows),
    cmocka_unit_test (test_paged_many_rows),
    cmocka_unit_test (test_paged_long_decode),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
