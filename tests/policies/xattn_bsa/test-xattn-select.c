/* XAttention selection and vote against constructed cases and
 * brute-force properties (docs/policies/xattn_bsa.md). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "xattn-data.h"


/* ---- Selection ------------------------------------------------------------ */

static void
test_select_constructed (void **state)
{
  (void) state;
  /* Key blocks 6, 7 are future for query block 5 and must never be chosen.
   * Row total over 0..5 is 1.0; the forced sink and diagonal hold 0.23;
   * sorted optional blocks: 2 (0.40), 4 (0.30), 1 (0.05), 3 (0.02). */
  const float row[8] = { 0.10f, 0.05f, 0.40f, 0.02f, 0.30f, 0.13f, 0.9f, 0.9f };
  static const struct {
    gint64 qb;
    double threshold;
    guint8 want[8];
  } cases[] = {
    { 5, 0.9, { 1, 0, 1, 0, 1, 1, 0, 0 } },   /* 0.63 < 0.9, 0.93 reaches it */
    { 5, 0.6, { 1, 0, 1, 0, 0, 1, 0, 0 } },   /* 0.63 reaches 0.6 */
    { 5, 0.95, { 1, 1, 1, 0, 1, 1, 0, 0 } },  /* one more: 0.05 before 0.02 */
    { 5, 1e-9, { 1, 0, 0, 0, 0, 1, 0, 0 } },  /* -> 0: sink and diagonal */
    { 5, 1.0, { 1, 1, 1, 1, 1, 1, 0, 0 } },   /* every causal block */
    { 0, 0.9, { 1, 0, 0, 0, 0, 0, 0, 0 } },   /* the sink is the diagonal */
  };
  guint8 sel[8];
  gint64 order[8];
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      xattn_select_row (row, 8, cases[i].qb, cases[i].threshold, sel, order);
      assert_memory_equal (sel, cases[i].want, 8);
    }
}

/* On real scores: the selection reaches the threshold, is minimal (dropping
 * its smallest optional block falls below), threshold 1 keeps everything
 * causal, threshold -> 0 keeps only sink + diagonal. */
static void
test_select_properties (void **state)
{
  (void) state;
  const XattnGeometry *g = &small_geo;
  const gint64 q_pos = 96, kv_end = 160;
  Data *d = data_new (g, kv_end, 9);
  g_autofree float *scores = scorer_scores (d, q_pos, kv_end, 16, FALSE);
  const gint64 qb0 = q_pos / g->block, n_qb = (kv_end - 1) / g->block - qb0 + 1, n_kb = kv_end / g->block;
  guint8 sel[16];
  gint64 order[16];
  const double thresholds[] = { 0.5, 0.8, 0.9, 0.99 };
  for (gint32 h = 0; h < g->n_q_heads; h++)
    for (gint64 i = 0; i < n_qb; i++)
      {
        const float *row = scores + ((gsize) h * (gsize) n_qb + (gsize) i) * (gsize) n_kb;
        gint64 qb = qb0 + i;
        double total = 0;
        for (gint64 kb = 0; kb <= qb; kb++)
          total += row[kb];
        for (gsize ti = 0; ti < G_N_ELEMENTS (thresholds); ti++)
          {
            xattn_select_row (row, n_kb, qb, thresholds[ti], sel, order);
            double mass = 0, smallest = INFINITY;
            assert_true (sel[0] && sel[qb]);
            for (gint64 kb = 0; kb < n_kb; kb++)
              if (sel[kb])
                {
                  assert_true (kb <= qb);
                  mass += row[kb];
                  if (kb != 0 && kb != qb)
                    smallest = MIN (smallest, row[kb]);
                }
            assert_true (mass >= thresholds[ti] * total - 1e-6);
            if (smallest < INFINITY)
              assert_true (mass - smallest < thresholds[ti] * total);
          }
        xattn_select_row (row, n_kb, qb, 1.0, sel, order);
        for (gint64 kb = 0; kb < n_kb; kb++)
          assert_int_equal (sel[kb], kb <= qb);
        xattn_select_row (row, n_kb, qb, 1e-12, sel, order);
        for (gint64 kb = 0; kb < n_kb; kb++)
          assert_int_equal (sel[kb], kb == 0 || kb == qb);
      }
  data_free (d);
}

/* ---- Vote ----------------------------------------------------------------- */

static void
test_vote_constructed (void **state)
{
  (void) state;
  /* 4 q heads in 2 kv groups ({0,1}, {2,3}); 2 query blocks (4, 5) of B = 16;
   * key blocks 0..5; engine blocks of 8 tokens: ids 0..7 cover key blocks 0..3
   * (two engine blocks per key block). */
  const XattnGeometry geo = { 4, 2, 16, 4, 16, 0.25f, 1.0f, FALSE };
  const gint64 n_qb = 2, n_kb = 6, n_ids = 8;
  SiftBlockMeta meta[8];
  gint64 ids[8];
  for (gint64 e = 0; e < n_ids; e++)
    {
      meta[e] = (SiftBlockMeta) { .first_token = e * 8, .n_valid = 8, .phase = SIFT_PHASE_PREFILL };
      ids[e] = e;
    }
  guint8 sel[4 * 2 * 6] = { 0 };
#define SEL(h, qb, kb) sel[((h) * n_qb + (qb)) * n_kb + (kb)]
  /* Key block 1 (engine 2, 3): head 0 in both query blocks, head 2 in qb 0:
   * votes (g0,qb0) (g0,qb1) (g1,qb0) = 3 of 4. */
  SEL (0, 0, 1) = SEL (0, 1, 1) = SEL (2, 0, 1) = 1;
  /* Key block 2 (engine 4, 5): heads 0 and 1 in qb 0: one group, one block: 1 vote. */
  SEL (0, 0, 2) = SEL (1, 0, 2) = 1;
  /* Key block 3 (engine 6, 7): head 3 in both: 2 votes (exactly half). */
  SEL (3, 0, 3) = SEL (3, 1, 3) = 1;
#undef SEL

  XattnPlan plan;
  xattn_plan_init (&plan, geo.n_q_heads, n_qb, n_ids);
  xattn_aggregate (&geo, sel, n_qb, n_kb, meta, ids, n_ids, XATTN_VOTE_MAJORITY, 0.5, TRUE, &plan);
  const gint64 want_votes[8] = { 0, 0, 3, 3, 1, 1, 2, 2 };
  assert_memory_equal (plan.votes, want_votes, sizeof want_votes);

  static const struct {
    XattnVote vote;
    double threshold;
    guint8 load[8];
    guint8 attend[4][8];
  } cases[] = {
    /* > 0.5 x 4 votes: only key block 1, plus first and last. Head 0 chose
     * key blocks 1 (loaded) and 2 (not loaded). */
    { XATTN_VOTE_MAJORITY, 0.5, { 1, 0, 1, 1, 0, 0, 0, 1 },
      { { 1, 0, 1, 1, 0, 0, 0, 1 }, { 1, 0, 0, 0, 0, 0, 0, 1 },
        { 1, 0, 1, 1, 0, 0, 0, 1 }, { 1, 0, 0, 0, 0, 0, 0, 1 } } },
    /* A lower bar keeps key block 3 (2 votes > 1.2), still not key block 2. */
    { XATTN_VOTE_MAJORITY, 0.3, { 1, 0, 1, 1, 0, 0, 1, 1 },
      { { 1, 0, 1, 1, 0, 0, 0, 1 }, { 1, 0, 0, 0, 0, 0, 0, 1 },
        { 1, 0, 1, 1, 0, 0, 0, 1 }, { 1, 0, 0, 0, 0, 0, 1, 1 } } },
    /* any: every chosen block loads; each head attends exactly its own. */
    { XATTN_VOTE_ANY, 0.5, { 1, 0, 1, 1, 1, 1, 1, 1 },
      { { 1, 0, 1, 1, 1, 1, 0, 1 }, { 1, 0, 0, 0, 1, 1, 0, 1 },
        { 1, 0, 1, 1, 0, 0, 0, 1 }, { 1, 0, 0, 0, 0, 0, 1, 1 } } },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      xattn_aggregate (&geo, sel, n_qb, n_kb, meta, ids, n_ids, cases[i].vote, cases[i].threshold, TRUE, &plan);
      assert_memory_equal (plan.load, cases[i].load, 8);
      assert_memory_equal (plan.attend, cases[i].attend, sizeof cases[i].attend);
      /* Per query block: loaded, and chosen for that query block (engine
       * block e of 8 tokens lies in key block e / 2), or first or last. */
      for (gint64 qb = 0; qb < n_qb; qb++)
        for (gint32 h = 0; h < 4; h++)
          for (gint64 e = 0; e < n_ids; e++)
            assert_int_equal (plan.qb_attend[(qb * 4 + h) * n_ids + e],
                              cases[i].load[e] && (sel[(h * n_qb + qb) * n_kb + e / 2] || e == 0 || e == 7));
    }

  /* Without last_block (the reference) the last block is one like the
   * others: loaded and attended only where chosen (head 3, key block 3). */
  static const struct {
    XattnVote vote;
    guint8 load[8];
    guint8 attend[4][8];
  } plain[] = {
    { XATTN_VOTE_MAJORITY, { 1, 0, 1, 1, 0, 0, 0, 0 },
      { { 1, 0, 1, 1, 0, 0, 0, 0 }, { 1, 0, 0, 0, 0, 0, 0, 0 },
        { 1, 0, 1, 1, 0, 0, 0, 0 }, { 1, 0, 0, 0, 0, 0, 0, 0 } } },
    { XATTN_VOTE_ANY, { 1, 0, 1, 1, 1, 1, 1, 1 },
      { { 1, 0, 1, 1, 1, 1, 0, 0 }, { 1, 0, 0, 0, 1, 1, 0, 0 },
        { 1, 0, 1, 1, 0, 0, 0, 0 }, { 1, 0, 0, 0, 0, 0, 1, 1 } } },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (plain); i++)
    {
      xattn_aggregate (&geo, sel, n_qb, n_kb, meta, ids, n_ids, plain[i].vote, 0.5, FALSE, &plan);
      assert_memory_equal (plan.load, plain[i].load, 8);
      assert_memory_equal (plan.attend, plain[i].attend, sizeof plain[i].attend);
      for (gint64 qb = 0; qb < n_qb; qb++)
        for (gint32 h = 0; h < 4; h++)
          for (gint64 e = 0; e < n_ids; e++)
            assert_int_equal (plan.qb_attend[(qb * 4 + h) * n_ids + e],
                              plain[i].load[e] && (sel[(h * n_qb + qb) * n_kb + e / 2] || e == 0));
    }
  xattn_plan_clear (&plan);

  /* Engine blocks larger than B: ids 0, 1 of 32 tokens cover key blocks
   * {0, 1} and {2, 3}; a subset of ids (only id 1) is allowed. */
  SiftBlockMeta big[2] = { { .first_token = 0, .n_valid = 32, .phase = SIFT_PHASE_PREFILL },
                           { .first_token = 32, .n_valid = 32, .phase = SIFT_PHASE_PREFILL } };
  gint64 only1[1] = { 1 };
  xattn_plan_init (&plan, geo.n_q_heads, n_qb, 1);
  xattn_aggregate (&geo, sel, n_qb, n_kb, big, only1, 1, XATTN_VOTE_MAJORITY, 0.5, TRUE, &plan);
  /* key blocks 2 and 3 together: (g0,qb0) (g1,qb0) (g1,qb1) = 3 votes. */
  assert_int_equal (plan.votes[0], 3);
  assert_int_equal (plan.load[0], 1);
  xattn_plan_clear (&plan);
}

/* Threshold 1 attends every (head, stored block), so block-sparse attention
 * over the plan equals dense attention; threshold -> 0 leaves each head the
 * sink, the first and last stored blocks and the chunk. */
static void
test_threshold_extremes_in_attention (void **state)
{
  (void) state;
  const XattnGeometry geo = { 4, 2, 16, 4, 16, 0.25f, 1.0f, FALSE };
  const gint64 bs = 8, q_pos = 64, kv_end = 100, n_ids = q_pos / bs;
  Data *d = data_new (&geo, kv_end, 17);
  g_autofree float *scores = scorer_scores (d, q_pos, kv_end, bs, FALSE);
  const gint64 qb0 = q_pos / geo.block, n_qb = (kv_end - 1) / geo.block - qb0 + 1, n_kb = (kv_end + 15) / 16;
  SiftBlockMeta meta[8];
  gint64 ids[8];
  for (gint64 e = 0; e < n_ids; e++)
    {
      meta[e] = (SiftBlockMeta) { .first_token = e * bs, .n_valid = (gint32) bs, .phase = SIFT_PHASE_PREFILL };
      ids[e] = e;
    }
  g_autofree guint8 *sel = g_new (guint8, (gsize) (geo.n_q_heads * n_qb * n_kb));
  gint64 order[16];
  const double thresholds[] = { 1.0, 1e-12 };
  for (gsize ti = 0; ti < 2; ti++)
    {
      for (gint64 row = 0; row < geo.n_q_heads * n_qb; row++)
        xattn_select_row (scores + row * n_kb, n_kb, qb0 + row % n_qb, thresholds[ti], sel + row * n_kb, order);
      XattnPlan plan;
      xattn_plan_init (&plan, geo.n_q_heads, n_qb, n_ids);
      xattn_aggregate (&geo, sel, n_qb, n_kb, meta, ids, n_ids, XATTN_VOTE_MAJORITY, 0.5, TRUE, &plan);

      /* Attention over the plan: per head, the attended blocks' rows and the chunk. */
      const gint64 n_q = kv_end - q_pos;
      SiftView q = sift_view_htd (d->q, SIFT_DTYPE_F32, geo.n_q_heads, kv_end, geo.head_dim);
      q = sift_view_tokens (&q, q_pos, n_q);
      SiftView k = sift_view_htd (d->k, SIFT_DTYPE_F32, geo.n_kv_heads, kv_end, geo.head_dim);
      SiftView v = sift_view_htd (d->k, SIFT_DTYPE_F32, geo.n_kv_heads, kv_end, geo.head_dim);
      g_autofree float *dense = g_new (float, (gsize) (geo.n_q_heads * n_q * geo.head_dim));
      g_autofree float *dense_lse = g_new (float, (gsize) (geo.n_q_heads * n_q));
      SiftView dense_v = sift_view_htd (dense, SIFT_DTYPE_F32, geo.n_q_heads, n_q, geo.head_dim);
      SiftAttnOpts causal = { geo.scale, TRUE, q_pos };
      assert_true (sift_attn_dense (&q, &k, &v, &causal, &dense_v, dense_lse, NULL));
      gsize n_blocks_attended = 0;
      for (gint32 h = 0; h < geo.n_q_heads; h++)
        {
          g_autofree gint64 *rows = g_new (gint64, (gsize) kv_end);
          gsize n_rows = 0;
          for (gint64 e = 0; e < n_ids; e++)
            if (plan.attend[h * n_ids + e])
              {
                n_blocks_attended++;
                for (gint64 t = 0; t < bs; t++)
                  rows[n_rows++] = e * bs + t;
              }
          for (gint64 t = q_pos; t < kv_end; t++)
            rows[n_rows++] = t;
          gint32 kvh = h / (geo.n_q_heads / geo.n_kv_heads);
          SiftView qh = sift_view_heads (&q, h, 1), kh = sift_view_heads (&k, kvh, 1), vh = sift_view_heads (&v, kvh, 1);
          g_autofree float *o = g_new (float, (gsize) (n_q * geo.head_dim));
          g_autofree float *lse = g_new (float, (gsize) n_q);
          SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, 1, n_q, geo.head_dim);
          assert_true (sift_attn_gather (&qh, &kh, &vh, rows, n_rows, &causal, &ov, lse, NULL));
          if (ti == 0)
            for (gint64 i = 0; i < n_q * geo.head_dim; i++)
              assert_true (fabsf (o[i] - dense[h * n_q * geo.head_dim + i]) <= 1e-5f * (1.0f + fabsf (o[i])));
        }
      if (ti == 0)
        assert_int_equal (n_blocks_attended, geo.n_q_heads * n_ids);
      else /* the engine blocks of key block 0 (the sink), and the last stored block */
        assert_int_equal (n_blocks_attended, geo.n_q_heads * (geo.block / bs + 1));
      xattn_plan_clear (&plan);
    }
  data_free (d);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_select_constructed),
    cmocka_unit_test (test_select_properties),
    cmocka_unit_test (test_vote_constructed),
    cmocka_unit_test (test_threshold_extremes_in_attention),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
