/* MInference vertical-slash: estimation against a brute-force oracle,
 * selection, block streaming and the dense fallback (the kernel against an
 * explicit mask: test-vs-kernel.c). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "vs-helpers.h"

/* ---- Estimation ------------------------------------------------------------ */

/* Oracle: full softmax of the last r rows in double, summed by column and diagonal. */
static void
oracle_scores (const Qkv *t, gint32 h, gint64 r, float scale, double *vert, double *slash)
{
  const gint32 g = h / (t->H / t->G);
  memset (vert, 0, t->n * sizeof (double));
  memset (slash, 0, t->n * sizeof (double));
  g_autofree double *s = g_new (double, t->n);
  for (gint64 p = t->n - r; p < t->n; p++)
    {
      double mx = -INFINITY, sum = 0.0;
      const float *q = t->q + ((gsize) h * t->n + p) * t->d;
      for (gint64 j = 0; j <= p; j++)
        {
          s[j] = scale * dot_d (q, t->k + ((gsize) g * t->n + j) * t->d, t->d);
          mx = MAX (mx, s[j]);
        }
      for (gint64 j = 0; j <= p; j++)
        sum += exp (s[j] - mx);
      for (gint64 j = 0; j <= p; j++)
        {
          double pr = exp (s[j] - mx) / sum;
          vert[j] += pr;
          slash[p - j] += pr;
        }
    }
}

/* Runs the estimator over t streamed in blocks of `block` keys. */
static VsEstimator *
estimate (const Qkv *t, gint64 r, float scale, gint64 block)
{
  VsEstimator *e = vs_estimator_new (t->H, t->G, t->d, scale);
  SiftView qe = sift_view_tokens (&t->qv, t->n - r, r);
  vs_estimator_begin (e, &qe, t->n - r, t->n);
  for (int pass = 1; pass <= 2; pass++)
    for (gint64 j0 = 0; j0 < t->n; j0 += block)
      {
        SiftView kb = sift_view_tokens (&t->kv, j0, MIN (block, t->n - j0));
        if (pass == 1)
          vs_estimator_pass1 (e, &kb, j0);
        else
          vs_estimator_pass2 (e, &kb, j0);
      }
  return e;
}

static void
check_estimate (SiftIsa isa)
{
  if (!use_isa (isa))
    return;
  Qkv t;
  qkv_init (&t, 7, 4, 2, 16, 300, 1.5);
  const gint64 r = 24;
  const float scale = 0.25f;
  g_autofree double *vo = g_new (double, t.n), *so = g_new (double, t.n);
  const gint64 blocks[] = { 300, 37, 1 };
  for (gsize bi = 0; bi < G_N_ELEMENTS (blocks); bi++)
    {
      g_autoptr (VsEstimator) e = estimate (&t, r, scale, blocks[bi]);
      for (gint32 h = 0; h < t.H; h++)
        {
          oracle_scores (&t, h, r, scale, vo, so);
          const float *ve = vs_estimator_vertical (e, h), *se = vs_estimator_slash (e, h);
          double vsum = 0.0;
          for (gint64 j = 0; j < t.n; j++)
            {
              assert_true (fabs (ve[j] - vo[j]) <= 1e-5 + 1e-4 * vo[j]);
              assert_true (fabs (se[j] - so[j]) <= 1e-5 + 1e-4 * so[j]);
              vsum += ve[j];
            }
          /* Each row's probabilities sum to one. */
          assert_true (fabs (vsum - (double) r) < 1e-3);

          /* The selection keeps the best oracle scores (up to rounding). */
          gint64 sel[300];
          gsize ns = vs_select_top (ve, t.n, 40, 5, sel);
          assert_int_equal (ns, 40);
          gboolean in[300] = { FALSE };
          for (gsize i = 0; i < ns; i++)
            in[sel[i]] = TRUE;
          double worst_in = INFINITY, best_out = -INFINITY;
          for (gint64 j = 5; j < t.n; j++)
            if (in[j])
              worst_in = MIN (worst_in, vo[j]);
            else
              best_out = MAX (best_out, vo[j]);
          assert_true (worst_in >= best_out - 1e-5);
        }
    }
  qkv_clear (&t);
  vs_set_isa (-1);
}

static void
test_estimate_oracle_scalar (void **state)
{
  (void) state;
  check_estimate (SIFT_ISA_SCALAR);
}

static void
test_estimate_oracle_simd (void **state)
{
  (void) state;
  check_estimate (SIFT_ISA_AVX2);
}

/* vs_select_top against sorting every item. */
static int
cmp_desc (const void *a, const void *b, gpointer data)
{
  const float *sc = data;
  gint64 x = *(const gint64 *) a, y = *(const gint64 *) b;
  if (sc[x] != sc[y])
    return sc[x] > sc[y] ? -1 : 1;
  return (x > y) - (x < y);
}

static int
cmp_asc (const void *a, const void *b)
{
  gint64 x = *(const gint64 *) a, y = *(const gint64 *) b;
  return (x > y) - (x < y);
}

static void
test_select_brute_force (void **state)
{
  (void) state;
  g_autoptr (GRand) rng = g_rand_new_with_seed (3);
  for (int trial = 0; trial < 200; trial++)
    {
      gint64 n = g_rand_int_range (rng, 1, 400);
      g_autofree float *sc = g_new (float, n);
      for (gint64 i = 0; i < n; i++)
        sc[i] = (float) g_rand_int_range (rng, 0, 20); /* many ties */
      gint64 k = g_rand_int_range (rng, 0, (gint32) n + 50), forced = g_rand_int_range (rng, 0, (gint32) n + 5);
      g_autofree gint64 *out = g_new (gint64, n);
      gsize got = vs_select_top (sc, n, k, forced, out);

      gint64 nf = MIN (forced, n), want = MIN (MAX (k, nf), n);
      assert_int_equal (got, want);
      g_autofree gint64 *all = g_new (gint64, n);
      for (gint64 i = 0; i < n - nf; i++)
        all[i] = nf + i;
      g_qsort_with_data (all, (gint) (n - nf), sizeof (gint64), cmp_desc, sc);
      g_autofree gint64 *ref = g_new (gint64, n);
      for (gint64 i = 0; i < nf; i++)
        ref[i] = i;
      for (gint64 i = 0; i < want - nf; i++)
        ref[nf + i] = all[i];
      qsort (ref, (gsize) want, sizeof (gint64), cmp_asc);
      assert_memory_equal (out, ref, (gsize) want * sizeof (gint64));
    }
}

/* Sinks and recent diagonals are kept even when every score says otherwise. */
static void
test_sinks_and_recent_always_kept (void **state)
{
  (void) state;
  const gint64 n = 500;
  g_autofree float *sc = g_new (float, n);
  for (gint64 i = 0; i < n; i++)
    sc[i] = i < 30 ? 0.0f : 1.0f + (float) i; /* forced ones score lowest */
  g_autofree gint64 *out = g_new (gint64, n);
  gsize got = vs_select_top (sc, n, 50, 30, out);
  assert_int_equal (got, 50);
  for (gint64 i = 0; i < 30; i++)
    assert_int_equal (out[i], i);
  for (gsize i = 30; i < got; i++)
    assert_true (out[i] >= n - 20); /* the 20 best of the rest */

  /* Through the whole estimate: keys that look useless still get kept. */
  Qkv t;
  qkv_init (&t, 11, 2, 1, 8, 400, 2.0);
  g_autoptr (VsEstimator) e = estimate (&t, 16, 0.35f, 64);
  VsSizes sz;
  vs_sizes (t.n, 10, 10, 0.0, 30, 100, &sz.vertical, &sz.slash);
  assert_int_equal (sz.vertical, 30);
  assert_int_equal (sz.slash, 100);
  gsize nv = vs_select_top (vs_estimator_vertical (e, 1), t.n, sz.vertical, 30, out);
  for (gint64 i = 0; i < 30; i++)
    assert_int_equal (out[i], i);
  assert_int_equal (nv, 30);
  gsize nsl = vs_select_top (vs_estimator_slash (e, 1), t.n, 150, 100, out);
  assert_int_equal (nsl, 150);
  for (gint64 i = 0; i < 100; i++)
    assert_int_equal (out[i], i);
  qkv_clear (&t);
}

static void
test_sizes (void **state)
{
  (void) state;
  gint64 v, s;
  vs_sizes (100000, 1000, 6096, 0.0, 30, 100, &v, &s);
  assert_int_equal (v, 1000);
  assert_int_equal (s, 6096);
  vs_sizes (100000, 1000, 6096, 0.1, 30, 100, &v, &s); /* b = 10000 */
  assert_int_equal (v, 2000);
  assert_int_equal (s, 8000);
  vs_sizes (1000, 1000, 6096, 0.01, 30, 100, &v, &s); /* b = 10: the floors */
  assert_int_equal (v, 31);
  assert_int_equal (s, 101);
  vs_sizes (50, 1000, 6096, 0.0, 30, 100, &v, &s); /* capped at n */
  assert_int_equal (v, 50);
  assert_int_equal (s, 50);
  vs_sizes (5000, 10, 20, 0.0, 30, 100, &v, &s); /* sink and recent are floors */
  assert_int_equal (v, 30);
  assert_int_equal (s, 100);
}

/* ---- Whole prompt, chunk source, dense fallback ------------------------------ */

typedef struct {
  const Qkv *t;
  gint64 block;
} BlockSource;

static gboolean
blocks_source (gpointer source, gboolean want_v, VsBlockFunc fn, gpointer data, GError **error)
{
  (void) error;
  const BlockSource *bs = source;
  for (gint64 j0 = 0; j0 < bs->t->n; j0 += bs->block)
    {
      SiftView kb = sift_view_tokens (&bs->t->kv, j0, MIN (bs->block, bs->t->n - j0));
      SiftView vb = sift_view_tokens (&bs->t->vv, j0, MIN (bs->block, bs->t->n - j0));
      fn (data, &kb, want_v ? &vb : NULL, j0);
    }
  return TRUE;
}

/* A chunk that is the whole prompt gives the whole-prompt result, whether
 * its keys arrive at once or in stored blocks. */
static void
test_chunk_equals_whole (void **state)
{
  (void) state;
  Qkv t;
  qkv_init (&t, 31, 4, 2, 32, 1000, 1.5);
  const VsEstimateOpts opts = { VS_TILE_DEFAULT, 64, 30, 100 };
  VsSizes sizes[4];
  for (gint32 h = 0; h < 4; h++)
    vs_sizes (t.n, 40 + 20 * h, 103, 0.0, opts.num_sink, opts.num_recent, &sizes[h].vertical, &sizes[h].slash);
  const gsize sz = (gsize) 4 * t.n * t.d;
  g_autofree float *o1 = g_new (float, sz), *o2 = g_new (float, sz), *o3 = g_new (float, sz);
  g_autofree float *l1 = g_new (float, 4 * t.n), *l2 = g_new (float, 4 * t.n), *l3 = g_new (float, 4 * t.n);
  SiftView v1 = sift_view_htd (o1, SIFT_DTYPE_F32, 4, t.n, t.d);
  SiftView v2 = sift_view_htd (o2, SIFT_DTYPE_F32, 4, t.n, t.d);
  SiftView v3 = sift_view_htd (o3, SIFT_DTYPE_F32, 4, t.n, t.d);
  g_autoptr (GError) error = NULL;
  VsStats st1 = { 0 }, st3 = { 0 };
  assert_true (vs_prefill (&t.qv, &t.kv, &t.vv, 0.2f, &opts, sizes, NULL, &v1, l1, &st1, &error));
  BlockSource one = { &t, t.n }, many = { &t, 64 };
  assert_true (vs_chunk_prefill (&t.qv, 0, 2, 0.2f, &opts, sizes, NULL, blocks_source, &one, &v2, l2, NULL, &error));
  assert_true (vs_chunk_prefill (&t.qv, 0, 2, 0.2f, &opts, sizes, NULL, blocks_source, &many, &v3, l3, &st3, &error));
  assert_memory_equal (o1, o2, sz * sizeof (float));
  assert_memory_equal (l1, l2, 4 * t.n * sizeof (float));
  assert_int_equal (st1.keys_attended, st3.keys_attended); /* same pattern */
  assert_true (st1.keys_attended < st1.keys_causal);
  for (gsize i = 0; i < sz; i++)
    assert_true (fabsf (o1[i] - o3[i]) < 1e-5f);
  for (gsize i = 0; i < (gsize) 4 * t.n; i++)
    assert_true (fabsf (l1[i] - l3[i]) < 1e-5f);
  qkv_clear (&t);
}

/* One call of (q, k, v, sizes) with workspace w (NULL: its own) into
 * fresh out and lse. */
static void
prefill_into (Qkv *t, const VsSizes *sizes, gint64 block, VsWork *w, float *o, float *l)
{
  const VsEstimateOpts opts = { VS_TILE_DEFAULT, 64, 30, 100 };
  SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, t->H, t->n, t->d);
  BlockSource bs = { t, block };
  g_autoptr (GError) error = NULL;
  assert_true (vs_chunk_prefill (&t->qv, 0, t->G, 0.2f, &opts, sizes, w, blocks_source, &bs, &ov, l, NULL, &error));
}

/* A workspace kept across calls (as the policy keeps it for every layer
 * and chunk) changes nothing: after a larger call, a smaller one with other
 * data, and a reserve, each result is bit for bit the one of a call with
 * its own buffers, so nothing of an earlier call leaks into a later one. */
static void
test_workspace_reuse (void **state)
{
  (void) state;
  Qkv big, small;
  qkv_init (&big, 51, 4, 2, 32, 900, 1.5);
  qkv_init (&small, 52, 4, 2, 32, 500, 0.7);
  VsSizes sb[4], ss[4];
  for (gint32 h = 0; h < 4; h++)
    {
      vs_sizes (big.n, 50 + 10 * h, 160, 0.0, 30, 100, &sb[h].vertical, &sb[h].slash);
      vs_sizes (small.n, 35, 120 + 7 * h, 0.0, 30, 100, &ss[h].vertical, &ss[h].slash);
    }
  const gsize zb = (gsize) 4 * big.n * big.d, zs = (gsize) 4 * small.n * small.d;
  g_autofree float *ob = g_new (float, zb), *rb = g_new (float, zb), *lb = g_new (float, 4 * big.n);
  g_autofree float *rlb = g_new (float, 4 * big.n);
  g_autofree float *os = g_new (float, zs), *rs = g_new (float, zs), *ls = g_new (float, 4 * small.n);
  g_autofree float *rls = g_new (float, 4 * small.n);
  prefill_into (&big, sb, 128, NULL, rb, rlb);
  prefill_into (&small, ss, 64, NULL, rs, rls);

  g_autoptr (VsWork) w = vs_work_new ();
  prefill_into (&big, sb, 128, w, ob, lb);
  assert_memory_equal (ob, rb, zb * sizeof (float));
  assert_memory_equal (lb, rlb, 4 * big.n * sizeof (float));
  prefill_into (&small, ss, 64, w, os, ls); /* smaller, in the larger call's leftovers */
  assert_memory_equal (os, rs, zs * sizeof (float));
  assert_memory_equal (ls, rls, 4 * small.n * sizeof (float));
  vs_work_reserve (w, 4, 2 * big.n, big.d, 2, 2 * big.n, 100);
  prefill_into (&big, sb, big.n, w, ob, lb); /* one block: the panels hold every key */
  prefill_into (&big, sb, big.n, NULL, rb, rlb);
  assert_memory_equal (ob, rb, zb * sizeof (float));
  assert_memory_equal (lb, rlb, 4 * big.n * sizeof (float));
  prefill_into (&small, ss, 64, w, os, ls);
  assert_memory_equal (os, rs, zs * sizeof (float));
  qkv_clear (&big);
  qkv_clear (&small);
}

/* Sizes past the sequence: exactly sift_attn_dense. */
static void
test_budget_past_sequence_is_dense (void **state)
{
  (void) state;
  Qkv t;
  qkv_init (&t, 41, 4, 2, 16, 300, 1.0);
  const VsEstimateOpts opts = { VS_TILE_DEFAULT, 64, 30, 100 };
  VsSizes sizes[4];
  for (gint32 h = 0; h < 4; h++)
    vs_sizes (t.n, h % 2 ? 5000 : 10, h % 2 ? 10 : 400, 0.0, 30, 100, &sizes[h].vertical, &sizes[h].slash);
  assert_true (vs_sizes_dense (sizes, 4, t.n));
  const gsize sz = (gsize) 4 * t.n * t.d;
  g_autofree float *o1 = g_new (float, sz), *o2 = g_new (float, sz);
  g_autofree float *l1 = g_new (float, 4 * t.n), *l2 = g_new (float, 4 * t.n);
  SiftView v1 = sift_view_htd (o1, SIFT_DTYPE_F32, 4, t.n, t.d);
  SiftView v2 = sift_view_htd (o2, SIFT_DTYPE_F32, 4, t.n, t.d);
  g_autoptr (GError) error = NULL;
  VsStats st = { 0 };
  assert_true (vs_prefill (&t.qv, &t.kv, &t.vv, 0.25f, &opts, sizes, NULL, &v1, l1, &st, &error));
  SiftAttnOpts ao = { .scale = 0.25f, .causal = TRUE, .q_offset = 0 };
  assert_true (sift_attn_dense (&t.qv, &t.kv, &t.vv, &ao, &v2, l2, &error));
  assert_memory_equal (o1, o2, sz * sizeof (float));
  assert_memory_equal (l1, l2, 4 * t.n * sizeof (float));
  assert_int_equal (st.keys_attended, st.keys_causal);

  /* Budget mode: the floors (31 columns, 101 diagonals) pass a short sequence. */
  vs_sizes (80, 1, 1, 0.05, 30, 100, &sizes[0].vertical, &sizes[0].slash);
  assert_int_equal (sizes[0].slash, 80);
  vs_sizes (300, 1, 1, 1.0, 30, 100, &sizes[0].vertical, &sizes[0].slash);
  assert_int_equal (sizes[0].vertical, 60);
  assert_int_equal (sizes[0].slash, 240);

  /* Every diagonal through the sparse kernel itself: dense within rounding. */
  g_autofree gint64 *all = g_new (gint64, t.n);
  for (gint64 i = 0; i < t.n; i++)
    all[i] = i;
  VsPattern full[4];
  for (gint32 h = 0; h < 4; h++)
    full[h] = (VsPattern) { NULL, 0, all, (gsize) t.n };
  g_autoptr (VsAttn) a = vs_attn_new (&t.qv, 0, 2, 0.25f, 16, full, NULL);
  vs_attn_block (a, &t.kv, &t.vv, 0);
  vs_attn_finish (a, &v1, l1);
  assert_int_equal (vs_attn_attended (a), st.keys_causal);
  for (gsize i = 0; i < sz; i++)
    assert_true (fabsf (o1[i] - o2[i]) < 1e-5f);
  qkv_clear (&t);
}

int
main (void)
{
  sift_parallel_set_n_threads (2);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_estimate_oracle_scalar),
    cmocka_unit_test (test_estimate_oracle_simd),
    cmocka_unit_test (test_select_brute_force),
    cmocka_unit_test (test_sinks_and_recent_always_kept),
    cmocka_unit_test (test_sizes),
    cmocka_unit_test (test_chunk_equals_whole),
    cmocka_unit_test (test_workspace_reuse),
    cmocka_unit_test (test_budget_past_sequence_is_dense),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
