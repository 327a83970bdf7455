/* Quest's math against brute-force oracles on small random data: the bound
 * against the true max of q.k, key boxes over valid tokens only, rankings,
 * and picking against a sort-everything oracle. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "quest.c"
#include "quest-oracle.h"

static void
fill_normal (GRand *rng, float *x, gsize n, double scale)
{
  for (gsize i = 0; i < n; i++)
    {
      /* Box-Muller: independent of any library kernel under test. */
      double u = g_rand_double_range (rng, 1e-12, 1.0), v = g_rand_double (rng);
      x[i] = (float) (scale * sqrt (-2.0 * log (u)) * cos (2.0 * G_PI * v));
    }
}

static double
dot (const float *a, const float *b, gint32 d)
{
  double s = 0.0;
  for (gint32 i = 0; i < d; i++)
    s += (double) a[i] * (double) b[i];
  return s;
}

/* The bound is >= max over the block's valid keys of q.k, for random
 * blocks of every fill and for keys stored as f32, f16 and bf16. */
static void
test_bound_above_true_max (void **state)
{
  (void) state;
  g_autoptr (GRand) rng = g_rand_new_with_seed (11);
  const gint32 nkv = 2, bs = 16, d = 24;
  const SiftDType dtypes[] = { SIFT_DTYPE_F32, SIFT_DTYPE_F16, SIFT_DTYPE_BF16 };
  for (int trial = 0; trial < 300; trial++)
    {
      SiftDType dt = dtypes[trial % 3];
      gint32 n_valid = 1 + g_rand_int_range (rng, 0, bs);
      g_autofree float *k = g_new (float, (gsize) nkv * bs * d);  /* [nkv][bs][d] */
      g_autofree guint16 *k16 = g_new (guint16, (gsize) nkv * bs * d);
      fill_normal (rng, k, (gsize) nkv * bs * d, g_rand_double_range (rng, 0.1, 10.0));
      SiftView kv = sift_view_htd (k, SIFT_DTYPE_F32, nkv, bs, d);
      if (dt != SIFT_DTYPE_F32)
        {
          sift_convert (k, SIFT_DTYPE_F32, k16, dt, (gsize) nkv * bs * d);
          sift_convert (k16, dt, k, SIFT_DTYPE_F32, (gsize) nkv * bs * d); /* the values q.k sees */
          kv = sift_view_htd (k16, dt, nkv, bs, d);
        }
      QuestMeta *meta = quest_meta_new (1, nkv, d);
      assert_true (quest_meta_update (meta, 0, 0, &kv, n_valid, NULL));
      const float *box = quest_meta_block (meta, 0, 0);
      assert_non_null (box);
      float q[24];
      fill_normal (rng, q, (gsize) d, 1.0);
      for (gint32 h = 0; h < nkv; h++)
        {
          double best = -INFINITY;
          for (gint32 t = 0; t < n_valid; t++)
            best = fmax (best, dot (q, k + ((gsize) h * bs + (gsize) t) * d, d));
          float bound = quest_bound (q, box + (gsize) (2 * h + 1) * d, box + (gsize) 2 * h * d, d);
          assert_true ((double) bound >= best - 1e-4 * (1.0 + fabs (best)));
        }
      quest_meta_free (meta);
    }
}

/* With one key the box is a point, and the bound is that key's q.k. */
static void
test_bound_exact_for_one_token (void **state)
{
  (void) state;
  g_autoptr (GRand) rng = g_rand_new_with_seed (12);
  const gint32 d = 64;
  for (int trial = 0; trial < 200; trial++)
    {
      float k[64], q[64];
      fill_normal (rng, k, d, 3.0);
      fill_normal (rng, q, d, 1.0);
      SiftView kv = sift_view_htd (k, SIFT_DTYPE_F32, 1, 1, d);
      QuestMeta *meta = quest_meta_new (1, 1, d);
      assert_true (quest_meta_update (meta, 0, 5, &kv, 1, NULL));
      const float *box = quest_meta_block (meta, 0, 5);
      double want = dot (q, k, d);
      double got = quest_bound (q, box + d, box, d);
      assert_true (fabs (got - want) <= 1e-5 * (1.0 + fabs (want)));
      quest_meta_free (meta);
    }
}

/* A partial block: rows at or past n_valid hold garbage (huge values, NaN)
 * and must not enter the box, which equals a brute-force min/max. */
static void
test_partial_block_uses_valid_rows (void **state)
{
  (void) state;
  g_autoptr (GRand) rng = g_rand_new_with_seed (13);
  const gint32 nkv = 3, bs = 8, d = 5;
  for (gint32 n_valid = 1; n_valid <= bs; n_valid++)
    {
      float k[3 * 8 * 5];
      fill_normal (rng, k, G_N_ELEMENTS (k), 1.0);
      for (gint32 h = 0; h < nkv; h++)
        for (gint32 t = n_valid; t < bs; t++)
          for (gint32 i = 0; i < d; i++)
            k[((gsize) h * bs + (gsize) t) * d + (gsize) i] = (i % 2) ? 1e30f : NAN;
      SiftView kv = sift_view_htd (k, SIFT_DTYPE_F32, nkv, bs, d);
      QuestMeta *meta = quest_meta_new (2, nkv, d);
      assert_true (quest_meta_update (meta, 1, 0, &kv, n_valid, NULL));
      const float *box = quest_meta_block (meta, 1, 0);
      for (gint32 h = 0; h < nkv; h++)
        for (gint32 i = 0; i < d; i++)
          {
            float lo = INFINITY, hi = -INFINITY;
            for (gint32 t = 0; t < n_valid; t++)
              {
                float x = k[((gsize) h * bs + (gsize) t) * d + (gsize) i];
                lo = x < lo ? x : lo;
                hi = x > hi ? x : hi;
              }
            assert_true (box[(gsize) (2 * h + 1) * d + (gsize) i] == lo);
            assert_true (box[(gsize) 2 * h * d + (gsize) i] == hi);
          }
      quest_meta_free (meta);
    }
}

/* Metadata is keyed by (layer, block id); clear forgets every block. */
static void
test_meta_keys_and_clear (void **state)
{
  (void) state;
  const gint32 d = 4;
  float a[4] = { 1, 2, 3, 4 }, b[4] = { -1, -2, -3, -4 };
  SiftView va = sift_view_htd (a, SIFT_DTYPE_F32, 1, 1, d), vb = sift_view_htd (b, SIFT_DTYPE_F32, 1, 1, d);
  QuestMeta *meta = quest_meta_new (3, 1, d);
  assert_true (quest_meta_update (meta, 0, 7, &va, 1, NULL));
  assert_true (quest_meta_update (meta, 2, 7, &vb, 1, NULL));
  assert_true (quest_meta_update (meta, 2, 300, &vb, 1, NULL)); /* grows past the first capacity */
  assert_true (quest_meta_block (meta, 0, 7)[0] == 1.0f);
  assert_true (quest_meta_block (meta, 2, 7)[0] == -1.0f);
  assert_null (quest_meta_block (meta, 1, 7));
  assert_null (quest_meta_block (meta, 0, 6));
  assert_null (quest_meta_block (meta, 0, 100000));
  assert_int_equal (meta->n_present, 3);
  assert_true (quest_meta_update (meta, 0, 7, &vb, 1, NULL)); /* seen again: recomputed, counted once */
  assert_true (quest_meta_block (meta, 0, 7)[0] == -1.0f);
  assert_int_equal (meta->n_present, 3);

  quest_meta_clear (meta);
  assert_int_equal (meta->n_present, 0);
  for (gint32 l = 0; l < 3; l++)
    for (gint64 id = 0; id < 400; id++)
      assert_null (quest_meta_block (meta, l, id));
  assert_true (quest_meta_update (meta, 1, 0, &va, 1, NULL)); /* usable after clear */
  assert_non_null (quest_meta_block (meta, 1, 0));
  quest_meta_free (meta);
}

static void
test_meta_rejects_bad_blocks (void **state)
{
  (void) state;
  float k[2 * 4 * 3] = { 0 };
  SiftView kv = sift_view_htd (k, SIFT_DTYPE_F32, 2, 4, 3);
  QuestMeta *meta = quest_meta_new (2, 2, 3);
  struct {
    gint32 layer;
    gint64 id;
    gint32 n_valid;
  } bad[] = { { 2, 0, 1 }, { -1, 0, 1 }, { 0, -1, 1 }, { 0, 0, 0 }, { 0, 0, 5 } };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr (GError) error = NULL;
      assert_false (quest_meta_update (meta, bad[i].layer, bad[i].id, &kv, bad[i].n_valid, &error));
      assert_true (g_error_matches (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY));
      assert_non_null (strstr (error->message, "quest"));
    }
  g_autoptr (GError) error = NULL;
  SiftView wrong = sift_view_htd (k, SIFT_DTYPE_F32, 1, 4, 3);
  assert_false (quest_meta_update (meta, 0, 0, &wrong, 1, &error));
  assert_true (g_error_matches (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY));
  assert_int_equal (meta->n_present, 0);
  quest_meta_free (meta);
}

/* Head bounds: each q head reads its group's kv head; rows reduce by max,
 * or the mean row is bounded; a run of block ids (read in place) gives the
 * gathered sums; a block without metadata is an error. */
static void
test_head_bounds (void **state)
{
  (void) state;
  g_autoptr (GRand) rng = g_rand_new_with_seed (14);
  const gint32 nq = 6, nkv = 2, bs = 4, d = 8, n_rows = 3, n_blocks = 5, group = nq / nkv;
  g_autofree float *keys = g_new (float, (gsize) n_blocks * nkv * bs * d); /* [blocks][nkv][bs][d] */
  g_autofree float *q = g_new (float, (gsize) nq * n_rows * d);            /* [nq][rows][d] */
  fill_normal (rng, keys, (gsize) n_blocks * nkv * bs * d, 1.0);
  fill_normal (rng, q, (gsize) nq * n_rows * d, 1.0);
  QuestMeta *meta = quest_meta_new (1, nkv, d);
  for (gint32 b = 0; b < n_blocks; b++)
    {
      SiftView kv = sift_view_htd (keys + (gsize) b * nkv * bs * d, SIFT_DTYPE_F32, nkv, bs, d);
      assert_true (quest_meta_update (meta, 0, b, &kv, bs, NULL));
    }
  gint64 avail[] = { 0, 2, 3, 4 };
  const gsize n = G_N_ELEMENTS (avail);
  float got[6 * 4], got_mean[6 * 4];
  SiftView qv = sift_view_htd (q, SIFT_DTYPE_F32, nq, n_rows, d);
  assert_true (quest_head_bounds (meta, 0, &qv, FALSE, avail, n, got, NULL));
  assert_true (quest_head_bounds (meta, 0, &qv, TRUE, avail, n, got_mean, NULL));
  for (gint32 h = 0; h < nq; h++)
    for (gsize b = 0; b < n; b++)
      {
        /* Oracle: min/max by hand, then the bound channel by channel in double. */
        const float *kb = keys + ((gsize) avail[b] * nkv + (gsize) (h / group)) * bs * d;
        double want = -INFINITY, want_mean = 0.0;
        float mean[8] = { 0 };
        for (gint32 r = 0; r < n_rows; r++)
          for (gint32 i = 0; i < d; i++)
            mean[i] += q[((gsize) h * n_rows + (gsize) r) * d + (gsize) i] / (float) n_rows;
        for (gint32 r = -1; r < n_rows; r++)
          {
            const float *qr = r < 0 ? mean : q + ((gsize) h * n_rows + (gsize) r) * d;
            double s = oracle_bound (qr, kb, bs, (gsize) d, d);
            if (r < 0)
              want_mean = s;
            else
              want = fmax (want, s);
          }
        assert_true (fabs (got[(gsize) h * n + b] - want) <= 1e-4 * (1.0 + fabs (want)));
        assert_true (fabs (got_mean[(gsize) h * n + b] - want_mean) <= 1e-4 * (1.0 + fabs (want_mean)));
      }
  /* A run of ids (2, 3, 4) is read in place: the gathered sums (up to the
   * tile kernel's remainder paths' rounding). */
  gint64 run[] = { 2, 3, 4 };
  float got_run[6 * 3];
  assert_true (quest_head_bounds (meta, 0, &qv, FALSE, run, 3, got_run, NULL));
  for (gint32 h = 0; h < nq; h++)
    for (gsize b = 0; b < 3; b++)
      assert_float_equal (got_run[(gsize) h * 3 + b], got[(gsize) h * n + b + 1],
                          1e-5 * (1.0 + fabs (got[(gsize) h * n + b + 1])));

  gint64 missing[] = { 0, 9 };
  g_autoptr (GError) error = NULL;
  assert_false (quest_head_bounds (meta, 0, &qv, FALSE, missing, 2, got, &error));
  assert_true (g_error_matches (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY));
  assert_non_null (strstr (error->message, "block 9 of layer 0"));
  quest_meta_free (meta);
}

/* Many blocks (several chunks of the parallel scoring, a short last one):
 * the bounds are the same bits on 1 thread and on several, read in place
 * or gathered, and equal to the bits of one sift_score_tile per kv head
 * over all blocks (the scoring before it was split). */
static void
test_head_bounds_threads (void **state)
{
  (void) state;
  g_autoptr (GRand) rng = g_rand_new_with_seed (16);
  const gint32 nq = 8, nkv = 2, bs = 3, d = 128, n_rows = 2, group = nq / nkv; /* tasks big enough to go parallel */
  const gsize n = 2 * 128 + 37, w = 2 * (gsize) d;
  g_autofree float *keys = g_new (float, n * nkv * bs * d);
  g_autofree float *q = g_new (float, (gsize) nq * n_rows * d);
  fill_normal (rng, keys, n * nkv * bs * d, 1.0);
  fill_normal (rng, q, (gsize) nq * n_rows * d, 1.0);
  QuestMeta *meta = quest_meta_new (1, nkv, d);
  for (gsize b = 0; b < n; b++)
    {
      SiftView kv = sift_view_htd (keys + b * nkv * bs * d, SIFT_DTYPE_F32, nkv, bs, d);
      assert_true (quest_meta_update (meta, 0, (gint64) b, &kv, bs, NULL));
    }
  g_autofree gint64 *run = g_new (gint64, n), *gathered = g_new (gint64, n);
  for (gsize b = 0; b < n; b++)
    run[b] = (gint64) b, gathered[b] = (gint64) (n - 1 - b);
  SiftView qv = sift_view_htd (q, SIFT_DTYPE_F32, nq, n_rows, d);
  const gsize all = (gsize) nq * n;
  g_autofree float *one = g_new (float, all), *many = g_new (float, all), *rev = g_new (float, all);
  g_autofree float *want = g_new (float, all);
  const gint before = sift_parallel_n_threads ();
  sift_parallel_set_n_threads (1);
  assert_true (quest_head_bounds (meta, 0, &qv, FALSE, run, n, one, NULL));
  sift_parallel_set_n_threads (4);
  assert_true (quest_head_bounds (meta, 0, &qv, FALSE, run, n, many, NULL));
  assert_true (quest_head_bounds (meta, 0, &qv, FALSE, gathered, n, rev, NULL));
  sift_parallel_set_n_threads (before);
  assert_memory_equal (one, many, all * sizeof (float));
  for (gint32 h = 0; h < nq; h++)
    for (gsize b = 0; b < n; b++)
      assert_memory_equal (&rev[(gsize) h * n + b], &one[(gsize) h * n + (n - 1 - b)], sizeof (float));
  /* One tile call per kv head over every block, rows split by sign as quest_head_bounds does. */
  g_autofree float *rows = g_new0 (float, (gsize) nq * n_rows * w), *dots = g_new (float, (gsize) group * n_rows * n);
  for (gsize r = 0; r < (gsize) nq * n_rows; r++)
    for (gint32 i = 0; i < d; i++)
      {
        rows[r * w + (gsize) i] = MAX (q[r * (gsize) d + (gsize) i], 0.0f);
        rows[r * w + (gsize) d + (gsize) i] = MIN (q[r * (gsize) d + (gsize) i], 0.0f);
      }
  for (gint32 g = 0; g < nkv; g++)
    {
      sift_score_tile (rows + (gsize) g * group * n_rows * w, w, group * n_rows, quest_meta_block (meta, 0, 0) + g * w,
                       (gsize) nkv * w, (gint64) n, w, dots);
      for (gint32 hh = 0; hh < group; hh++)
        for (gsize b = 0; b < n; b++)
          want[(gsize) (g * group + hh) * n + b] = fmaxf (dots[((gsize) hh * n_rows) * n + b],
                                                          dots[((gsize) hh * n_rows + 1) * n + b]);
    }
  assert_memory_equal (want, one, all * sizeof (float));
  quest_meta_free (meta);
}

/* select_blocks per kv head (each kv head's bounds, ranking and pick in
 * one task) answers what the bounds, rankings and picks one after another
 * answer, on 1 thread and on several: the same blocks for the same heads. */
static void
test_select_per_kv_head_threads (void **state)
{
  (void) state;
  g_autoptr (GRand) rng = g_rand_new_with_seed (17);
  const gint32 nq = 8, nkv = 4, bs = 2, d = 128, n_rows = 4, budget = 9, group = nq / nkv; /* parallel at 4 threads */
  const gsize n = 3 * 128 + 5;
  const SiftModelShape shape = { 1, nq, nkv, d, bs, 64, 0.0f };
  g_autoptr (SiftParams) params = sift_params_new (quest_ops.params, NULL);
  g_autofree char *top_k = g_strdup_printf ("%d", budget);
  assert_true (sift_params_set_text (params, "top_k", top_k, NULL));
  assert_true (sift_params_set_text (params, "dense_layers", "[]", NULL));
  assert_true (sift_params_set_text (params, "sink_blocks", "1", NULL));
  assert_true (sift_params_set_text (params, "recent_blocks", "2", NULL));
  g_autoptr (SiftPolicy) policy = sift_policy_new (&quest_ops, params, &shape, NULL);
  assert_non_null (policy);
  Quest *quest = (Quest *) policy;
  g_autofree float *keys = g_new (float, n * nkv * bs * d), *q = g_new (float, (gsize) nq * n_rows * d);
  fill_normal (rng, keys, n * nkv * bs * d, 1.0);
  fill_normal (rng, q, (gsize) nq * n_rows * d, 1.0);
  for (gsize b = 0; b < n; b++)
    {
      SiftView kv = sift_view_htd (keys + b * nkv * bs * d, SIFT_DTYPE_F32, nkv, bs, d);
      assert_true (quest_meta_update (quest->meta, 0, (gint64) b, &kv, bs, NULL));
    }
  g_autofree gint64 *avail = g_new (gint64, n);
  for (gsize b = 0; b < n; b++)
    avail[b] = (gint64) b;
  SiftPolicyContext ctx = { .phase = SIFT_PHASE_DECODE, .layer = 0, .n_q = n_rows, .shape = &shape,
                            .n_blocks = (gint64) n };
  ctx.q = sift_view_htd (q, SIFT_DTYPE_F32, nq, n_rows, d);
  /* The answer step by step. */
  g_autofree float *bounds = g_new (float, (gsize) nq * n), *rank = g_new (float, (gsize) nkv * n);
  g_autofree guint8 *keep = g_new (guint8, (gsize) nkv * n);
  assert_true (quest_head_bounds (quest->meta, 0, &ctx.q, FALSE, avail, n, bounds, NULL));
  quest_rank (bounds, nq, nkv, n, QUEST_MODE_PER_KV_HEAD, QUEST_REDUCE_MAX, rank);
  for (gint32 g = 0; g < nkv; g++)
    assert_int_equal (sift_top_k (rank + (gsize) g * n, n, budget, 1, 2, keep + (gsize) g * n), budget);
  const gint before = sift_parallel_n_threads ();
  for (gint threads = 1; threads <= 4; threads += 3)
    {
      sift_parallel_set_n_threads (threads);
      g_autoptr (SiftSelection) sel = sift_selection_new (nq, nkv);
      assert_true (quest_select_blocks (policy, &ctx, avail, n, sel, NULL));
      assert_true (sift_selection_validate (sel, avail, n, "quest", NULL));
      for (gint32 h = 0; h < nq; h++)
        for (gsize b = 0; b < n; b++)
          assert_int_equal (sift_selection_has (sel, (gint64) b, h), keep[(gsize) (h / group) * n + b]);
    }
  sift_parallel_set_n_threads (before);
}

/* Rankings: per kv head reduces its group's heads, shared reduces all. */
static void
test_rank_modes (void **state)
{
  (void) state;
  g_autoptr (GRand) rng = g_rand_new_with_seed (15);
  const gint32 nq = 8, nkv = 2;
  const gsize n = 7;
  float hb[8 * 7], out[8 * 7];
  fill_normal (rng, hb, G_N_ELEMENTS (hb), 2.0);
  for (int mode = 0; mode < 3; mode++)
    for (int reduce = 0; reduce < 2; reduce++)
      {
        gint32 n_rank = quest_n_rankings ((QuestMode) mode, nq, nkv);
        assert_int_equal (n_rank, mode == QUEST_MODE_SHARED ? 1 : mode == QUEST_MODE_PER_Q_HEAD ? nq : nkv);
        gint32 per = nq / n_rank;
        quest_rank (hb, nq, nkv, n, (QuestMode) mode, (QuestReduce) reduce, out);
        for (gint32 r = 0; r < n_rank; r++)
          for (gsize b = 0; b < n; b++)
            {
              gint32 h0 = r * per, h1 = (r + 1) * per;
              double mx = -INFINITY, sum = 0.0;
              for (gint32 h = h0; h < h1; h++)
                {
                  mx = fmax (mx, hb[(gsize) h * n + b]);
                  sum += hb[(gsize) h * n + b];
                }
              double want = reduce == QUEST_REDUCE_MAX ? mx : sum / (h1 - h0);
              assert_true (fabs (out[(gsize) r * n + b] - want) <= 1e-5 * (1.0 + fabs (want)));
            }
      }
}

static void
test_pick_matches_oracle (void **state)
{
  (void) state;
  g_autoptr (GRand) rng = g_rand_new_with_seed (16);
  for (int trial = 0; trial < 3000; trial++)
    {
      gsize n = (gsize) g_rand_int_range (rng, 0, 70);
      gsize budget = (gsize) g_rand_int_range (rng, 0, 80);
      gsize sinks = (gsize) g_rand_int_range (rng, 0, 5), recent = (gsize) g_rand_int_range (rng, 0, 5);
      g_autofree float *score = g_new (float, n + 1);
      g_autofree guint8 *keep = g_new (guint8, n + 1), *want = g_new (guint8, n + 1);
      for (gsize i = 0; i < n; i++)
        {
          /* Few distinct values so ties are common; some NaN and infinities. */
          int kind = g_rand_int_range (rng, 0, 20);
          score[i] = kind == 0 ? NAN : kind == 1 ? -INFINITY : kind == 2 ? INFINITY
                                                             : (float) g_rand_int_range (rng, -4, 5);
        }
      gsize got_n = sift_top_k (score, n, budget, sinks, recent, keep);
      gsize want_n = oracle_pick (score, n, budget, sinks, recent, want);
      assert_int_equal (got_n, want_n);
      assert_memory_equal (keep, want, n);
      gsize count = 0;
      for (gsize i = 0; i < n; i++)
        count += keep[i];
      assert_int_equal (count, got_n);
    }
}

/* Sinks and recent blocks are kept whatever they score, even when they
 * alone exceed the budget (then nothing else is kept). */
static void
test_pick_keeps_sinks_and_recent (void **state)
{
  (void) state;
  const gsize n = 20;
  float score[20];
  guint8 keep[20];
  for (gsize i = 0; i < n; i++)
    score[i] = (i < 2 || i >= n - 3) ? -INFINITY : (float) i;
  assert_int_equal (sift_top_k (score, n, 7, 2, 3, keep), 7);
  for (gsize i = 0; i < n; i++)
    assert_int_equal (keep[i], i < 2 || i >= n - 3 || i == 16 || i == 15);
  assert_int_equal (sift_top_k (score, n, 3, 2, 3, keep), 5);
  for (gsize i = 0; i < n; i++)
    assert_int_equal (keep[i], i < 2 || i >= n - 3);
  assert_int_equal (sift_top_k (score, n, 100, 2, 3, keep), n);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_bound_above_true_max),
    cmocka_unit_test (test_bound_exact_for_one_token),
    cmocka_unit_test (test_partial_block_uses_valid_rows),
    cmocka_unit_test (test_meta_keys_and_clear),
    cmocka_unit_test (test_meta_rejects_bad_blocks),
    cmocka_unit_test (test_head_bounds),
    cmocka_unit_test (test_head_bounds_threads),
    cmocka_unit_test (test_select_per_kv_head_threads),
    cmocka_unit_test (test_rank_modes),
    cmocka_unit_test (test_pick_matches_oracle),
    cmocka_unit_test (test_pick_keeps_sinks_and_recent),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
