/* The synthetic model: each property its knob promises, shown by dense
 * attention (sift_attn_dense for the whole row, sift_attn_gather for the
 * mass on a key subset: mass = exp(lse_subset - lse_all)). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include <synthetic/synthetic-private.h>

#include "needle-plan.h"


#define N 1024
#define D 64
#define HQ 8
#define HKV 2

static const SiftModelShape shape = {
  .n_layers = 2, .n_q_heads = HQ, .n_kv_heads = HKV, .head_dim = D,
  .block_size = 64, .chunk_size = 256, .scale = 0,
};

typedef struct {
  float *q; /* [N][HQ][D] */
  float *k; /* [N][HKV][D] */
  float *v; /* [N][HKV][D] */
} Seq;

static Seq
generate (SiftModelSource *src, gint32 layer)
{
  Seq s = { g_new (float, (gsize) N * HQ * D), g_new (float, (gsize) N * HKV * D),
            g_new (float, (gsize) N * HKV * D) };
  g_autoptr (GError) error = NULL;
  assert_true (sift_model_source_qkv (src, layer, 0, N, s.q, s.k, s.v, &error));
  return s;
}

static void
seq_clear (Seq *s)
{
  g_free (s->q);
  g_free (s->k);
  g_free (s->v);
}

static SiftModelSource *
synth (const SiftSyntheticConfig *knobs, const SiftNeedlePlan *plan)
{
  g_autoptr (GError) error = NULL;
  SiftModelSource *src = sift_model_synthetic_new (&shape, 42, knobs, plan, &error);
  assert_non_null (src);
  return src;
}

/* Attention mass of query row p (one head) on the keys in rows[0..n). */
static double
mass (const Seq *s, gint32 head, gint64 p, const gint64 *rows, gsize n)
{
  SiftView q = sift_view_thd (s->q + (gsize) p * HQ * D, SIFT_DTYPE_F32, 1, HQ, D);
  q = sift_view_heads (&q, head, 1);
  SiftView k = sift_view_thd (s->k, SIFT_DTYPE_F32, p + 1, HKV, D);
  SiftView v = sift_view_thd (s->v, SIFT_DTYPE_F32, p + 1, HKV, D);
  gint32 g = head / (HQ / HKV);
  k = sift_view_heads (&k, g, 1);
  v = sift_view_heads (&v, g, 1);
  float o[D], lse_all, lse_sub;
  SiftView out = sift_view_htd (o, SIFT_DTYPE_F32, 1, 1, D);
  SiftAttnOpts opts = { .scale = 0, .causal = FALSE };
  g_autoptr (GError) error = NULL;
  assert_true (sift_attn_dense (&q, &k, &v, &opts, &out, &lse_all, &error));
  g_autofree gint64 *kept = g_new (gint64, MAX (n, 1));
  gsize m = 0;
  for (gsize i = 0; i < n; i++)
    if (rows[i] <= p)
      kept[m++] = rows[i];
  if (m == 0)
    return 0.0;
  assert_true (sift_attn_gather (&q, &k, &v, kept, m, &opts, &out, &lse_sub, &error));
  return exp ((double) lse_sub - (double) lse_all);
}

/* Mean mass over every head and the query rows [p0, p1). */
static double
mean_mass (const Seq *s, gint64 p0, gint64 p1, const gint64 *rows, gsize n)
{
  double sum = 0;
  for (gint64 p = p0; p < p1; p++)
    for (gint32 h = 0; h < HQ; h++)
      sum += mass (s, h, p, rows, n);
  return sum / (double) ((p1 - p0) * HQ);
}

static double
dot (const float *a, const float *b)
{
  double s = 0;
  for (int i = 0; i < D; i++)
    s += (double) a[i] * b[i];
  return s;
}

static void
test_deterministic_any_range (void **state)
{
  (void) state;
  g_autoptr (SiftModelSource) src = synth (NULL, NULL);
  g_autoptr (SiftModelSource) other = synth (NULL, NULL);
  Seq whole = generate (src, 1);
  float q[7 * HQ * D], k[7 * HKV * D], v[7 * HKV * D];
  /* A later range asked first, from another instance, gives the same rows. */
  assert_true (sift_model_source_qkv (other, 1, 500, 7, q, k, v, NULL));
  assert_memory_equal (q, whole.q + (gsize) 500 * HQ * D, sizeof q);
  assert_memory_equal (k, whole.k + (gsize) 500 * HKV * D, sizeof k);
  assert_memory_equal (v, whole.v + (gsize) 500 * HKV * D, sizeof v);
  /* Another seed gives other values. */
  g_autoptr (SiftModelSource) reseeded = sift_model_synthetic_new (&shape, 43, NULL, NULL, NULL);
  assert_true (sift_model_source_qkv (reseeded, 1, 500, 7, q, k, v, NULL));
  assert_memory_not_equal (k, whole.k + (gsize) 500 * HKV * D, sizeof k);
  seq_clear (&whole);
}

static void
test_sinks (void **state)
{
  (void) state;
  const gint64 sinks[] = { 0, 1, 2, 3 };
  SiftSyntheticConfig on, off;
  sift_synthetic_config_defaults (&on);
  off = on;
  off.sink_tokens = 0;
  g_autoptr (SiftModelSource) a = synth (&on, NULL);
  g_autoptr (SiftModelSource) b = synth (&off, NULL);
  Seq sa = generate (a, 0), sb = generate (b, 0);
  double m_on = mean_mass (&sa, 768, 1024, sinks, 4);
  double m_off = mean_mass (&sb, 768, 1024, sinks, 4);
  if (g_getenv ("SIFT_TEST_VERBOSE"))
    g_printerr ("sink mass %g with sinks, %g without\n", m_on, m_off);
  /* 4 of ~1000 keys (uniform share 0.004) hold a large share of every row,
   * as in real models past their first layers (StreamingLLM). */
  assert_true (m_on > 0.3);
  assert_true (m_off < 0.01);
  seq_clear (&sa);
  seq_clear (&sb);
}

/* Mean per-token mass on keys at distance [d0, d1) behind each query row. */
static double
mass_per_token_at (const Seq *s, gint64 d0, gint64 d1)
{
  g_autofree gint64 *rows = g_new (gint64, d1 - d0);
  double sum = 0;
  int n = 0;
  for (gint64 p = 960; p < N; p += 4)
    {
      for (gint64 d = d0; d < d1; d++)
        rows[d - d0] = p - d;
      for (gint32 h = 0; h < HQ; h++, n++)
        sum += mass (s, h, p, rows, (gsize) (d1 - d0));
    }
  return sum / n / (double) (d1 - d0);
}

static SiftHarnessConfig
harness_defaults (SiftNeedleKind kind)
{
  return (SiftHarnessConfig) {
    .needle = kind, .n_distractors = 3, .n_values = 3, .n_queries = 2, .question_tokens = 4,
    .decode_steps = 8, .seed = 1,
  };
}

/* Per-token mass near (distance < 64) and far (512..896) for knobs k. */
static void
near_far (const SiftSyntheticConfig *k, double *near, double *far)
{
  g_autoptr (SiftModelSource) src = synth (k, NULL);
  Seq s = generate (src, 0);
  *near = mass_per_token_at (&s, 0, 64);
  *far = mass_per_token_at (&s, 512, 896);
  seq_clear (&s);
}

static void
test_locality (void **state)
{
  (void) state;
  /* Rotary locality alone (drift off), then neither. */
  SiftSyntheticConfig on, off;
  sift_synthetic_config_defaults (&on);
  on.drift = 0.0;
  off = on;
  off.locality = 0.0;
  double near_on, far_on, near_off, far_off;
  near_far (&on, &near_on, &far_on);
  near_far (&off, &near_off, &far_off);
  if (g_getenv ("SIFT_TEST_VERBOSE"))
    g_printerr ("locality: near %g far %g; off: near %g far %g\n", near_on, far_on, near_off, far_off);
  /* Recent keys attract more than far ones with locality, about as much without. */
  assert_true (near_on > 2.5 * far_on);
  assert_true (near_off < 1.5 * far_off && far_off < 1.5 * near_off);
  assert_true (near_on > 2.0 * near_off);
}

static void
test_drift (void **state)
{
  (void) state;
  /* The drifting content alone (rotary locality off). */
  SiftSyntheticConfig on;
  sift_synthetic_config_defaults (&on);
  on.locality = 0.0;
  double near_on, far_on;
  near_far (&on, &near_on, &far_on);
  if (g_getenv ("SIFT_TEST_VERBOSE"))
    g_printerr ("drift: near %g far %g\n", near_on, far_on);
  /* drift 6: the last 64 keys get e^(~4) more per token than far ones. */
  assert_true (near_on > 20.0 * far_on);
}

/* Real models' attention is concentrated (H2O, MInference, XAttention,
 * Quest): with the defaults at 4K, per query block of 64 rows, the key
 * blocks of 64 holding 90 % of the block's mass are a small minority, and
 * sinks + the last 256 keys + heavy hitters hold most of every row. Exact
 * double softmax over whole rows: the obvious reference. */
static void
test_concentration (void **state)
{
  (void) state;
  enum { LONG = 4096, QB = 64 };
  SiftHarnessConfig h = harness_defaults (SIFT_NEEDLE_SINGLE);
  g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (&h, LONG, 0.5, 4, 0, 1, NULL);
  g_autoptr (SiftModelSource) src = synth (NULL, plan);
  g_autofree float *q = g_new (float, (gsize) LONG * HQ * D);
  g_autofree float *k = g_new (float, (gsize) LONG * HKV * D);
  g_autofree float *v = g_new (float, (gsize) LONG * HKV * D);
  assert_true (sift_model_source_qkv (src, 0, 0, LONG, q, k, v, NULL));
  gsize n_heavy = 0;
  const gint64 *heavy = sift_model_synthetic_heavy_hitters (src, &n_heavy);
  g_autofree double *w = g_new (double, LONG);
  gint64 p0 = plan->question_start / QB * QB - QB, n_blocks = (p0 + QB) / QB;
  double blocks_frac = 0, structured = 0;
  for (gint32 head = 0; head < HQ; head++)
    {
      double bmass[LONG / QB] = { 0 };
      gint32 g = head / (HQ / HKV);
      for (gint64 p = p0; p < p0 + QB; p++)
        {
          double mx = -INFINITY, z = 0;
          for (gint64 j = 0; j <= p; j++)
            {
              w[j] = dot (q + ((gsize) p * HQ + head) * D, k + ((gsize) j * HKV + g) * D) / sqrt (D);
              mx = MAX (mx, w[j]);
            }
          for (gint64 j = 0; j <= p; j++)
            z += (w[j] = exp (w[j] - mx));
          double st = 0;
          for (gint64 j = 0; j <= p; j++)
            {
              w[j] /= z;
              bmass[j / QB] += w[j];
              if (j < 4 || j > p - 256)
                st += w[j];
            }
          for (gsize i = 0; i < n_heavy; i++)
            if (heavy[i] <= p - 256)
              st += w[heavy[i]];
          structured += st / (QB * HQ);
        }
      /* Greedy: the heaviest blocks first, until 90 % of the rows' mass. */
      double acc = 0;
      int used = 0;
      while (acc < 0.9 * QB)
        {
          gint64 best = 0;
          for (gint64 b = 1; b < n_blocks; b++)
            if (bmass[b] > bmass[best])
              best = b;
          acc += bmass[best];
          bmass[best] = -1;
          used++;
        }
      blocks_frac += (double) used / (double) n_blocks / HQ;
    }
  if (g_getenv ("SIFT_TEST_VERBOSE"))
    g_printerr ("concentration: 90%% of the mass in %.3f of the blocks; structured mass %.3f\n",
                blocks_frac, structured);
  assert_true (blocks_frac < 0.25);
  assert_true (structured > 0.8);
}


static void
test_heavy_hitters (void **state)
{
  (void) state;
  SiftSyntheticConfig on, off;
  sift_synthetic_config_defaults (&on);
  off = on;
  off.heavy_hitters = 0;
  /* Heavy hitters spread over the planned prompt. */
  SiftHarnessConfig h = harness_defaults (SIFT_NEEDLE_SINGLE);
  g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (&h, N, 0.5, 4, 0, 1, NULL);
  g_autoptr (SiftModelSource) a = synth (&on, plan);
  g_autoptr (SiftModelSource) b = synth (&off, plan);
  gsize n_heavy = 0, n_none = 0;
  const gint64 *heavy = sift_model_synthetic_heavy_hitters (a, &n_heavy);
  sift_model_synthetic_heavy_hitters (b, &n_none);
  assert_int_equal (n_heavy, 8);
  assert_int_equal (n_none, 0);
  /* Only columns already in every query's past. */
  gint64 past[8];
  gsize n_past = 0;
  for (gsize i = 0; i < n_heavy; i++)
    if (heavy[i] < 768)
      past[n_past++] = heavy[i];
  assert_true (n_past >= 2);
  Seq sa = generate (a, 1), sb = generate (b, 1);
  double m_on = mean_mass (&sa, 768, 1024, past, n_past);
  double m_off = mean_mass (&sb, 768, 1024, past, n_past);
  if (g_getenv ("SIFT_TEST_VERBOSE"))
    g_printerr ("heavy hitters: %g on, %g off\n", m_on, m_off);
  /* A few columns hold a real share of every row (H2O's heavy hitters). */
  assert_true (m_on > 0.05);
  assert_true (m_on > 20.0 * m_off);
  seq_clear (&sa);
  seq_clear (&sb);
}

static void
test_rope_relative_position (void **state)
{
  (void) state;
  g_autoptr (SiftModelSource) a = synth (NULL, NULL);
  g_autoptr (SiftModelSource) b = synth (NULL, NULL);
  sift_model_synthetic_set_rope_offset (b, 5000);
  Seq sa = generate (a, 0), sb = generate (b, 0);
  /* The vectors move with the rotation... */
  double moved = 0;
  for (gsize i = 0; i < (gsize) N * HKV * D; i++)
    moved = MAX (moved, fabs (sa.k[i] - sb.k[i]));
  assert_true (moved > 0.5);
  /* ...yet every q . k is unchanged: it depends on i - j only. */
  for (gint64 i = 0; i < N; i += 37)
    for (gint64 j = 0; j <= i; j += 11)
      for (gint32 h = 0; h < HQ; h++)
        {
          gint32 g = h / (HQ / HKV);
          double x = dot (sa.q + ((gsize) i * HQ + h) * D, sa.k + ((gsize) j * HKV + g) * D);
          double y = dot (sb.q + ((gsize) i * HQ + h) * D, sb.k + ((gsize) j * HKV + g) * D);
          assert_true (fabs (x - y) <= 1e-3 * (1.0 + fabs (x)));
        }
  seq_clear (&sa);
  seq_clear (&sb);
}

static void
test_retrieval_heads (void **state)
{
  (void) state;
  SiftHarnessConfig h = harness_defaults (SIFT_NEEDLE_SINGLE);
  g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (&h, N, 0.4, 4, 0, 1, NULL);
  assert_non_null (plan);
  assert_int_equal (plan->n_needles, 1);
  gint64 needle = plan->needles[0].position;
  g_autoptr (SiftModelSource) src = synth (NULL, plan);
  Seq s = generate (src, 1);
  int n_retrieval = 0;
  for (gint32 head = 0; head < HQ; head++)
    {
      gboolean r = sift_model_synthetic_is_retrieval_head (src, 1, head);
      n_retrieval += r;
      double m = 0;
      for (gint64 p = plan->question_start; p < N; p++)
        m += mass (&s, head, p, &needle, 1) / (double) plan->question_tokens;
      if (g_getenv ("SIFT_TEST_VERBOSE"))
        g_printerr ("head %d retrieval %d mass %g\n", head, r, m);
      if (r)
        assert_true (m > 0.5); /* one key of ~1000 outweighs sinks, window and heavy hitters */
      else
        assert_true (m < 0.01);
      /* Rows before the question do not look for it in any head. */
      double before = 0;
      for (gint64 p = plan->question_start - 64; p < plan->question_start; p++)
        before += mass (&s, head, p, &needle, 1) / 64.0;
      assert_true (before < 0.01);
    }
  assert_int_equal (n_retrieval, 2); /* 0.25 of 8 heads */
  seq_clear (&s);

  SiftSyntheticConfig none;
  sift_synthetic_config_defaults (&none);
  none.retrieval_heads = 0.0;
  g_autoptr (SiftModelSource) off = synth (&none, plan);
  for (gint32 head = 0; head < HQ; head++)
    assert_false (sift_model_synthetic_is_retrieval_head (off, 0, head));
}

/* Distractors draw far more than an ordinary key. With exact planted keys
 * (clean logits) the needle beats every distractor by 2x; matched planted
 * keys carry an ordinary key's noise in their logits, so a distractor may
 * beat the needle in one head: only the mean over them is asked. */
static void
multikey_distractors (gboolean exact)
{
  SiftHarnessConfig h = harness_defaults (SIFT_NEEDLE_MULTIKEY);
  g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (&h, N, 0.6, 4, 0, 1, NULL);
  assert_int_equal (plan->n_needles, 4);
  SiftSyntheticConfig knobs;
  sift_synthetic_config_defaults (&knobs);
  knobs.planted_exact = exact;
  g_autoptr (SiftModelSource) src = synth (&knobs, plan);
  Seq s = generate (src, 0);
  gint64 needle = -1;
  for (gsize i = 0; i < plan->n_needles; i++)
    if (plan->needles[i].distractor < 0)
      needle = plan->needles[i].position;
  for (gint32 head = 0; head < HQ; head++)
    {
      if (!sift_model_synthetic_is_retrieval_head (src, 0, head))
        continue;
      gint64 p = N - 1;
      double m_needle = mass (&s, head, p, &needle, 1);
      /* An ordinary key's mass: mean over far keys that are not planted. */
      gint64 rows[256];
      gsize n_rows = 0;
      for (gint64 j = 256; j < 512; j++)
        {
          gboolean planted = FALSE;
          for (gsize i = 0; i < plan->n_needles; i++)
            planted |= plan->needles[i].position == j;
          gsize n_heavy = 0;
          const gint64 *heavy = sift_model_synthetic_heavy_hitters (src, &n_heavy);
          for (gsize i = 0; i < n_heavy; i++)
            planted |= heavy[i] == j;
          if (!planted)
            rows[n_rows++] = j;
        }
      double ordinary = mass (&s, head, p, rows, n_rows) / (double) n_rows, sum_d = 0;
      for (gsize i = 0; i < plan->n_needles; i++)
        {
          if (plan->needles[i].distractor < 0)
            continue;
          double m_d = mass (&s, head, p, &plan->needles[i].position, 1);
          if (g_getenv ("SIFT_TEST_VERBOSE"))
            g_printerr ("head %d needle %g distractor %g ordinary %g\n", head, m_needle, m_d, ordinary);
          /* Near-identical keys: far above an ordinary key, below the needle. */
          assert_true (m_d > 20.0 * ordinary);
          assert_true (!exact || m_needle > 2.0 * m_d);
          sum_d += m_d;
        }
      assert_true (m_needle > sum_d / (double) h.n_distractors);
    }
  seq_clear (&s);
}

static void
test_multikey_distractors (void **state)
{
  (void) state;
  multikey_distractors (TRUE);
  multikey_distractors (FALSE);
}

static void
test_plan_placement (void **state)
{
  (void) state;
  SiftHarnessConfig h = harness_defaults (SIFT_NEEDLE_MULTIQUERY);
  g_autoptr (SiftNeedlePlan) first = sift_needle_plan_new (&h, 2048, 0.0, 4, 0, 1, NULL);
  g_autoptr (SiftNeedlePlan) last = sift_needle_plan_new (&h, 2048, 1.0, 4, 0, 1, NULL);
  assert_int_equal (first->needles[0].position, 4);
  assert_int_equal (last->needles[1].position, 2048 - 4 - 1);
  assert_int_equal (last->question_start, 2044);
  assert_int_equal (sift_needle_plan_key_at (last, 2044), 0);
  assert_int_equal (sift_needle_plan_key_at (last, 2045), 1);
  assert_int_equal (sift_needle_plan_key_at (last, 2049), 1); /* decode rows ask again */
  gint64 t[4];
  assert_int_equal (sift_needle_plan_targets (last, 1, t, 4), 1);
  assert_int_equal (t[0], 2047 - 4);

  SiftHarnessConfig mv = harness_defaults (SIFT_NEEDLE_MULTIVALUE);
  g_autoptr (SiftNeedlePlan) values = sift_needle_plan_new (&mv, 2048, 0.5, 4, 0, 1, NULL);
  assert_int_equal (sift_needle_plan_targets (values, 0, t, 4), 3);

  g_autoptr (GError) error = NULL;
  g_autoptr (SiftNeedlePlan) tiny = sift_needle_plan_new (&h, 8, 0.5, 4, 0, 1, &error);
  assert_null (tiny);
  assert_true (g_error_matches (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID));
}

/* Interior depths (block_size given, depth_span interior): depth 0 puts the
 * group at the first token of the second block, 1 ends it just before the
 * last block preceding the question, so neither end block ever holds a
 * needle; depth_span full (or block_size 0) is the former placement. */
static void
test_depth_placement_interior (void **state)
{
  (void) state;
  const gint64 B = 64;
  SiftHarnessConfig h = harness_defaults (SIFT_NEEDLE_MULTIVALUE); /* a group of 3 */
  for (gint64 n = 1024; n <= 4100; n += 1019)
    for (double depth = 0.0; depth <= 1.0; depth += 0.125)
      {
        g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (&h, n, depth, 4, B, 1, NULL);
        gint64 last_block = (plan->question_start - 1) / B;
        for (gsize i = 0; i < plan->n_needles; i++)
          {
            gint64 b = plan->needles[i].position / B;
            assert_true (b >= 1 && b < last_block);
          }
        if (depth == 0.0)
          assert_int_equal (plan->needles[0].position, B);
        if (depth == 1.0)
          assert_int_equal (plan->needles[2].position, last_block * B - 1);
      }
  h.depth_span = SIFT_DEPTH_FULL;
  g_autoptr (SiftNeedlePlan) full0 = sift_needle_plan_new (&h, 2048, 0.0, 4, B, 1, NULL);
  g_autoptr (SiftNeedlePlan) full1 = sift_needle_plan_new (&h, 2048, 1.0, 4, B, 1, NULL);
  assert_int_equal (full0->needles[0].position, 4);
  assert_int_equal (full1->needles[2].position, 2048 - 4 - 1);
}

/* Matched planted keys (the default) have the norm of an ordinary key:
 * every needle and distractor key lies within the ordinary keys' range
 * (mean +- 3 sd, measured over the same layer and kv head); exact planted
 * keys (the former model) stand out, every one above mean + 2 sd.
 * Writes the largest |z| and the smallest z of the planted norms. */
static void
planted_norms (gboolean exact, double *max_abs_z, double *min_z)
{
  SiftHarnessConfig h = harness_defaults (SIFT_NEEDLE_MULTIKEY);
  g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (&h, N, 0.5, 4, 0, 1, NULL);
  SiftSyntheticConfig knobs;
  sift_synthetic_config_defaults (&knobs);
  knobs.planted_exact = exact;
  g_autoptr (SiftModelSource) src = synth (&knobs, plan);
  gsize n_heavy = 0;
  const gint64 *heavy = sift_model_synthetic_heavy_hitters (src, &n_heavy);
  *max_abs_z = 0;
  *min_z = INFINITY;
  for (gint32 l = 0; l < shape.n_layers; l++)
    {
      Seq s = generate (src, l);
      for (gint32 g = 0; g < HKV; g++)
        {
          double sum = 0, sum2 = 0;
          gsize n = 0;
          for (gint64 p = knobs.sink_tokens; p < plan->question_start; p++)
            {
              gboolean special = FALSE;
              for (gsize i = 0; i < plan->n_needles; i++)
                special |= plan->needles[i].position == p;
              for (gsize i = 0; i < n_heavy; i++)
                special |= heavy[i] == p;
              if (special)
                continue;
              double x = 0;
              for (gint32 e = 0; e < D; e++)
                x += (double) s.k[((gsize) p * HKV + g) * D + e] * s.k[((gsize) p * HKV + g) * D + e];
              sum += sqrt (x);
              sum2 += x;
              n++;
            }
          double mean = sum / (double) n, sd = sqrt (sum2 / (double) n - mean * mean);
          for (gsize i = 0; i < plan->n_needles; i++)
            {
              double x = 0;
              for (gint32 e = 0; e < D; e++)
                {
                  float v = s.k[((gsize) plan->needles[i].position * HKV + g) * D + e];
                  x += (double) v * v;
                }
              if (g_getenv ("SIFT_TEST_VERBOSE"))
                g_printerr ("exact %d layer %d head %d planted %g ordinary %g +- %g\n", exact, l, g, sqrt (x), mean,
                            sd);
              double z = (sqrt (x) - mean) / sd;
              *max_abs_z = MAX (*max_abs_z, fabs (z));
              *min_z = MIN (*min_z, z);
            }
        }
      seq_clear (&s);
    }
}

static void
test_planted_key_norms (void **state)
{
  (void) state;
  double abs_z, min_z;
  planted_norms (FALSE, &abs_z, &min_z);
  assert_true (abs_z < 3.0);
  planted_norms (TRUE, &abs_z, &min_z);
  assert_true (min_z > 2.0);
}

/* logn_length = L: rows past L keys have every logit scaled by
 * ln(p + 1) / ln(L) (their q is), rows within L and every k and v are
 * untouched; and the sinks then keep at 4L about the share they had at L,
 * where without it the growing number of ordinary keys dilutes them. At
 * N = 1024 the default sinks are far from diluted (ordinary keys weigh in
 * past ~100K), so this model has weak sinks and nothing else but noise. */
static void
test_logn_scaling (void **state)
{
  (void) state;
  const gint64 L = 256;
  SiftSyntheticConfig on, off;
  sift_synthetic_config_defaults (&off);
  off.sink_strength = 5.0;
  off.heavy_hitters = 0;
  off.drift = 0.0;
  off.locality = 0.0;
  on = off;
  on.logn_length = L;
  g_autoptr (SiftModelSource) a = synth (&on, NULL);
  g_autoptr (SiftModelSource) b = synth (&off, NULL);
  Seq sa = generate (a, 1), sb = generate (b, 1);
  assert_memory_equal (sa.k, sb.k, sizeof (float) * N * HKV * D);
  assert_memory_equal (sa.v, sb.v, sizeof (float) * N * HKV * D);
  assert_memory_equal (sa.q, sb.q, sizeof (float) * (gsize) L * HQ * D);
  for (gint64 p = L; p < N; p += 37)
    {
      double f = log ((double) (p + 1)) / log ((double) L);
      for (gint32 h = 0; h < HQ; h++)
        {
          const float *qa = sa.q + ((gsize) p * HQ + h) * D, *qb = sb.q + ((gsize) p * HQ + h) * D;
          const float *k = sb.k + ((gsize) (p / 3) * HKV + h / (HQ / HKV)) * D;
          assert_float_equal (dot (qa, k), f * dot (qb, k), 1e-4 * (1.0 + fabs (f * dot (qb, k))));
        }
    }
  const gint64 sinks[] = { 0, 1, 2, 3 };
  double at_L = mean_mass (&sb, L - 32, L, sinks, 4);
  double far_on = mean_mass (&sa, N - 32, N, sinks, 4);
  double far_off = mean_mass (&sb, N - 32, N, sinks, 4);
  if (g_getenv ("SIFT_TEST_VERBOSE"))
    g_printerr ("sink mass at %d keys %g; at %d keys %g with logn_length %d, %g without\n", (int) L, at_L, N,
                far_on, (int) L, far_off);
  assert_true (far_off < at_L - 0.02);
  assert_true (far_on > far_off + 0.02);
  assert_true (fabs (far_on - at_L) < fabs (far_off - at_L) / 2);
  seq_clear (&sa);
  seq_clear (&sb);
}

static void
test_bad_knobs (void **state)
{
  (void) state;
  SiftSyntheticConfig k;
  sift_synthetic_config_defaults (&k);
  k.rope_dims = 31;
  g_autoptr (GError) error = NULL;
  assert_null (sift_model_synthetic_new (&shape, 1, &k, NULL, &error));
  assert_true (g_error_matches (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID));
  assert_non_null (strstr (error->message, "rope_dims = 31"));
  g_clear_error (&error);
  k.rope_dims = 62; /* 2 content dims cannot hold sinks, heavy hitters and a needle key */
  assert_null (sift_model_synthetic_new (&shape, 1, &k, NULL, &error));
  assert_non_null (strstr (error->message, "content dims"));
  g_clear_error (&error);
  sift_synthetic_config_defaults (&k);
  k.noise = -1;
  assert_null (sift_model_synthetic_new (&shape, 1, &k, NULL, &error));
  assert_non_null (strstr (error->message, "noise"));
  g_clear_error (&error);
  sift_synthetic_config_defaults (&k);
  k.logn_length = 1; /* ln(1) = 0: no scale */
  assert_null (sift_model_synthetic_new (&shape, 1, &k, NULL, &error));
  assert_non_null (strstr (error->message, "logn_length = 1"));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_deterministic_any_range),
    cmocka_unit_test (test_sinks),
    cmocka_unit_test (test_locality),
    cmocka_unit_test (test_drift),
    cmocka_unit_test (test_concentration),
    cmocka_unit_test (test_heavy_hitters),
    cmocka_unit_test (test_rope_relative_position),
    cmocka_unit_test (test_retrieval_heads),
    cmocka_unit_test (test_multikey_distractors),
    cmocka_unit_test (test_plan_placement),
    cmocka_unit_test (test_depth_placement_interior),
    cmocka_unit_test (test_planted_key_norms),
    cmocka_unit_test (test_logn_scaling),
    cmocka_unit_test (test_bad_knobs),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
