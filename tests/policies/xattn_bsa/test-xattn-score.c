/* XAttention scoring against brute-force references written from the
 * definitions (docs/policies/xattn_bsa.md); selection and vote:
 * test-xattn-select.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "xattn-data.h"

/* The definition, term by term: reshaped row r of the chunk [q_pos, kv_end)
 * against column c sums q[rS+S-1-t] . k[cS+t] over t, missing tokens being
 * zero; softmax over c <= r in double; block sums. [H][n_qb][n_kb]. */
static double *
oracle_scores (const Data *d, gint64 q_pos, gint64 kv_end, gint64 *n_qb_out, gint64 *n_kb_out)
{
  const XattnGeometry *g = &d->geo;
  const gint64 S = g->stride, B = g->block, D = g->head_dim;
  const gint64 qb0 = q_pos / B, n_qb = (kv_end - 1) / B - qb0 + 1, n_kb = (kv_end + B - 1) / B;
  const gint64 row0 = q_pos / S, row_end = (kv_end + S - 1) / S;
  const double norm = g->norm > 0.0f ? g->norm : 1.0;
  double *out = g_new0 (double, (gsize) g->n_q_heads * (gsize) n_qb * (gsize) n_kb);
  double *x = g_new (double, (gsize) row_end);
  for (gint32 h = 0; h < g->n_q_heads; h++)
    for (gint64 r = row0; r < row_end; r++)
      {
        double m = -INFINITY;
        for (gint64 c = 0; c <= r; c++)
          {
            /* mean_logit: the antidiagonal's logits summed, / (S norm);
             * sum_exp: log of the sum of exp(scale logit / norm) over its
             * entries, leaving out keys after their query (diagonal). */
            double acc = 0.0, lsum = 0.0;
            for (gint64 t = 0; t < S; t++)
              {
                gint64 qp = r * S + S - 1 - t, kp = c * S + t;
                if (qp < q_pos || qp >= kv_end || kp >= kv_end)
                  continue;
                double dot = 0.0;
                for (gint64 e = 0; e < D; e++)
                  dot += (double) q_row (d, h, qp)[e] * (double) k_row (d, h / (g->n_q_heads / g->n_kv_heads), kp)[e];
                acc += dot;
                if (kp <= qp)
                  lsum += exp (dot * g->scale / norm);
              }
            x[c] = g->sum_exp ? (lsum > 0 ? log (lsum) : -INFINITY) : acc * g->scale / (double) S / norm;
            m = MAX (m, x[c]);
          }
        double total = 0.0;
        for (gint64 c = 0; c <= r; c++)
          total += exp (x[c] - m);
        gint64 qb = r * S / B - qb0;
        for (gint64 c = 0; c <= r; c++)
          out[((gsize) h * (gsize) n_qb + (gsize) qb) * (gsize) n_kb + (gsize) (c * S / B)] += exp (x[c] - m) / total;
      }
  g_free (x);
  *n_qb_out = n_qb;
  *n_kb_out = n_kb;
  return out;
}

static void
check_against_oracle_geo (const XattnGeometry *geo, gint64 q_pos, gint64 kv_end, gint64 piece, gboolean as_f16,
                          gboolean scalar)
{
  XattnGeometry small_geo = *geo;
  Data *d = data_new (&small_geo, kv_end, 11);
  if (as_f16)
    /* The oracle sees what the scorer sees: keys rounded to f16. */
    for (gsize i = 0; i < (gsize) small_geo.n_kv_heads * (gsize) kv_end * (gsize) small_geo.head_dim; i++)
      d->k[i] = sift_f16_to_f32 (sift_f32_to_f16 (d->k[i]));
  xattn_dots_force_scalar (scalar);
  gint64 n_qb, n_kb;
  g_autofree double *want = oracle_scores (d, q_pos, kv_end, &n_qb, &n_kb);
  for (int staged = 0; staged < 2; staged++)
    {
      g_autofree float *got = scorer_scores_ex (d, q_pos, kv_end, piece, as_f16, staged);
      for (gint64 i = 0; i < (gint64) small_geo.n_q_heads * n_qb * n_kb; i++)
        if (fabs (got[i] - want[i]) > 1e-4 * MAX (1.0, fabs (want[i])))
          fail_msg ("score %" G_GINT64_FORMAT " (staged %d): got %g, want %g", i, staged, (double) got[i], want[i]);
    }
  xattn_dots_force_scalar (FALSE);
  data_free (d);
}

static void
check_against_oracle (gint64 q_pos, gint64 kv_end, gint64 piece, gboolean as_f16, gboolean scalar)
{
  check_against_oracle_geo (&small_geo, q_pos, kv_end, piece, as_f16, scalar);
}

/* The reference's norm and the sum_exp antidiagonal against the same
 * term-by-term definition. */
static void
test_norm_and_sum_exp_match_oracle (void **state)
{
  (void) state;
  XattnGeometry g = small_geo;
  g.norm = 0.5f;
  check_against_oracle_geo (&g, 48, 85, 8, FALSE, FALSE);
  g.norm = 1.0f;
  g.sum_exp = TRUE;
  check_against_oracle_geo (&g, 48, 85, 8, FALSE, FALSE);
  check_against_oracle_geo (&g, 48, 85, 32, FALSE, TRUE);
  check_against_oracle_geo (&g, 0, 61, 8, FALSE, FALSE);
  check_against_oracle_geo (&g, 64, 130, 16, TRUE, FALSE);
  g.norm = 2.0f;
  check_against_oracle_geo (&g, 40, 96, 8, FALSE, FALSE);
}

/* Stride 1 (what exact_rows uses): finish_rows is each query's exact
 * softmax mass per key block, against a direct computation. */
static void
test_exact_rows_mass (void **state)
{
  (void) state;
  XattnGeometry g = small_geo;
  g.stride = 1;
  const gint64 q_pos = 70, kv_end = 101, n_q = kv_end - q_pos, B = g.block, n_kb = (kv_end + B - 1) / B;
  Data *d = data_new (&g, kv_end, 23);
  g_autoptr (XattnScorer) s = xattn_scorer_new (&g);
  SiftView q = sift_view_htd (d->q, SIFT_DTYPE_F32, g.n_q_heads, kv_end, g.head_dim);
  q = sift_view_tokens (&q, q_pos, n_q);
  xattn_scorer_begin (s, &q, q_pos, n_q);
  SiftView k = sift_view_htd (d->k, SIFT_DTYPE_F32, g.n_kv_heads, kv_end, g.head_dim);
  for (gint64 p = 0; p < q_pos; p += 8)
    {
      SiftView part = sift_view_tokens (&k, p, MIN (8, q_pos - p));
      xattn_scorer_stage_keys (s, &part, p, part.n_tokens);
    }
  SiftView local = sift_view_tokens (&k, q_pos, n_q);
  xattn_scorer_add_keys (s, &local, q_pos, n_q);
  assert_int_equal (xattn_scorer_n_rows (s), n_q);
  assert_int_equal (xattn_scorer_n_kb (s), n_kb);
  g_autofree float *got = g_new (float, (gsize) (g.n_q_heads * n_q * n_kb));
  xattn_scorer_finish_rows (s, got);
  g_autofree double *x = g_new (double, (gsize) kv_end);
  for (gint32 h = 0; h < g.n_q_heads; h++)
    for (gint64 i = 0; i < n_q; i++)
      {
        gint64 pos = q_pos + i;
        double m = -INFINITY, total = 0.0, want[8] = { 0 };
        for (gint64 j = 0; j <= pos; j++)
          {
            double dot = 0.0;
            for (gint32 e = 0; e < g.head_dim; e++)
              dot += (double) q_row (d, h, pos)[e] * (double) k_row (d, h / 2, j)[e];
            x[j] = dot * g.scale;
            m = MAX (m, x[j]);
          }
        for (gint64 j = 0; j <= pos; j++)
          total += exp (x[j] - m);
        for (gint64 j = 0; j <= pos; j++)
          want[j / B] += exp (x[j] - m) / total;
        for (gint64 kb = 0; kb < n_kb; kb++)
          {
            float v = got[((gsize) h * (gsize) n_q + (gsize) i) * (gsize) n_kb + (gsize) kb];
            if (fabs (v - want[kb]) > 1e-5)
              fail_msg ("head %d query %" G_GINT64_FORMAT " block %" G_GINT64_FORMAT ": got %g, want %g", h, pos, kb,
                        (double) v, want[kb]);
          }
      }
  data_free (d);
}

/* The smallest number of optional blocks (besides sink and diagonal) whose
 * mass reaches threshold x total, by trying every subset. */
static gint64
min_blocks_brute (const float *row, gint64 qb, double threshold)
{
  double total = 0.0;
  for (gint64 kb = 0; kb <= qb; kb++)
    total += row[kb];
  const gint64 n_opt = MAX (qb - 1, 0);
  gint64 best = n_opt;
  for (guint32 mask = 0; mask < (1u << n_opt); mask++)
    {
      double mass = row[0] + (qb > 0 ? row[qb] : 0.0);
      for (gint64 b = 0; b < n_opt; b++)
        if (mask & (1u << b))
          mass += row[1 + b];
      if (mass >= threshold * total)
        best = MIN (best, (gint64) __builtin_popcount (mask));
    }
  return best;
}

/* Exact rows: each row keeps the smallest block set reaching the threshold
 * of its own mass (brute force over subsets), and its query block's row of
 * sel gets the union of its rows' sets, on top of what was there. */
static void
test_select_exact_rows (void **state)
{
  (void) state;
  const gint32 H = 2;
  const gint64 B = 16, n_kb = 9, pos0 = 120, n_rows = 20; /* queries 120..139: query blocks 7 and 8 */
  const gint64 qb0 = 6, n_qb = 3;
  GRand *r = g_rand_new_with_seed (31);
  g_autofree float *mass = g_new (float, (gsize) (H * n_rows * n_kb));
  for (gint64 i = 0; i < H * n_rows; i++)
    {
      gint64 pos = pos0 + i % n_rows, qb = pos / B;
      double total = 0.0;
      float *row = mass + i * n_kb;
      for (gint64 kb = 0; kb < n_kb; kb++)
        {
          /* Peaked masses: a few blocks matter. */
          double u = g_rand_double (r);
          row[kb] = kb <= qb ? (float) (u * u * u * u) : 0.0f;
          total += row[kb];
        }
      for (gint64 kb = 0; kb < n_kb; kb++)
        row[kb] = (float) (row[kb] / total);
    }
  g_rand_free (r);
  const double thresholds[] = { 0.5, 0.9, 0.99 };
  for (gsize ti = 0; ti < G_N_ELEMENTS (thresholds); ti++)
    {
      g_autofree guint8 *sel = g_new0 (guint8, (gsize) (H * n_qb * n_kb));
      sel[(0 * n_qb + 0) * n_kb + 3] = 1; /* already chosen by the estimate: kept */
      xattn_select_exact_rows (mass, H, n_rows, pos0, B, qb0, n_qb, n_kb, thresholds[ti], sel);
      g_autofree guint8 *want = g_new0 (guint8, (gsize) (H * n_qb * n_kb));
      want[(0 * n_qb + 0) * n_kb + 3] = 1;
      for (gint32 h = 0; h < H; h++)
        for (gint64 i = 0; i < n_rows; i++)
          {
            const float *row = mass + ((gsize) h * (gsize) n_rows + (gsize) i) * (gsize) n_kb;
            gint64 qb = (pos0 + i) / B;
            guint8 one[9];
            gint64 order[9];
            xattn_select_row (row, n_kb, qb, thresholds[ti], one, order);
            gint64 n_opt = 0;
            double got_mass = 0.0, total = 0.0;
            for (gint64 kb = 0; kb < n_kb; kb++)
              {
                total += kb <= qb ? row[kb] : 0.0;
                got_mass += one[kb] ? row[kb] : 0.0;
                n_opt += one[kb] && kb != 0 && kb != qb;
                want[((gsize) h * (gsize) n_qb + (gsize) (qb - qb0)) * (gsize) n_kb + (gsize) kb] |= one[kb];
              }
            assert_true (one[0] && one[qb]);
            assert_true (got_mass >= thresholds[ti] * total - 1e-6);
            assert_int_equal (n_opt, min_blocks_brute (row, qb, thresholds[ti]));
          }
      assert_memory_equal (sel, want, (gsize) (H * n_qb * n_kb));
      /* Query block 6 has no exact row: only what was there before. */
      for (gint64 kb = 0; kb < n_kb; kb++)
        assert_int_equal (sel[(1 * n_qb + 0) * n_kb + kb], 0);
    }
}

static void
test_scores_match_oracle (void **state)
{
  (void) state;
  /* History in engine blocks of 8 (smaller than B = 16) and 32 (larger),
   * a chunk starting mid key block, a partial tail, no history at all. */
  check_against_oracle (48, 85, 8, FALSE, FALSE);
  check_against_oracle (48, 85, 32, FALSE, FALSE);
  check_against_oracle (40, 96, 8, FALSE, FALSE);
  check_against_oracle (0, 61, 8, FALSE, FALSE);
  check_against_oracle (64, 130, 16, TRUE, FALSE);
  check_against_oracle (48, 85, 8, FALSE, TRUE);
}

static void
test_full_rows_sum_to_b_over_s (void **state)
{
  (void) state;
  const XattnGeometry geo = { 8, 2, 32, 8, 64, 0.17677669f, 1.0f, FALSE };
  const gint64 q_pos = 128, kv_end = 128 + 200;
  Data *d = data_new (&geo, kv_end, 5);
  g_autofree float *got = NULL;
  {
    XattnScorer *s = xattn_scorer_new (&geo);
    SiftView q = sift_view_htd (d->q, SIFT_DTYPE_F32, geo.n_q_heads, kv_end, geo.head_dim);
    q = sift_view_tokens (&q, q_pos, kv_end - q_pos);
    xattn_scorer_begin (s, &q, q_pos, kv_end - q_pos);
    SiftView k = sift_view_htd (d->k, SIFT_DTYPE_F32, geo.n_kv_heads, kv_end, geo.head_dim);
    SiftView hist = sift_view_tokens (&k, 0, q_pos), local = sift_view_tokens (&k, q_pos, kv_end - q_pos);
    xattn_scorer_add_keys (s, &hist, 0, q_pos);
    xattn_scorer_add_keys (s, &local, q_pos, kv_end - q_pos);
    gint64 n_qb = xattn_scorer_n_qb (s), n_kb = xattn_scorer_n_kb (s);
    assert_int_equal (xattn_scorer_first_qb (s), 2);
    assert_int_equal (n_qb, 4);   /* blocks 2, 3, 4 full; 5 holds 8 of 64 tokens */
    assert_int_equal (n_kb, 6);
    got = g_new (float, (gsize) geo.n_q_heads * (gsize) n_qb * (gsize) n_kb);
    xattn_scorer_finish (s, got);
    for (gint32 h = 0; h < geo.n_q_heads; h++)
      for (gint64 qb = 0; qb < n_qb; qb++)
        {
          double sum = 0.0;
          for (gint64 kb = 0; kb < n_kb; kb++)
            {
              float v = got[((gsize) h * (gsize) n_qb + (gsize) qb) * (gsize) n_kb + (gsize) kb];
              if (kb > qb + 2)
                assert_true (v == 0.0f); /* future blocks get nothing */
              sum += v;
            }
          double want = qb < 3 ? geo.block / geo.stride : 1.0; /* partial block: its one row */
          assert_true (fabs (sum - want) < 1e-4);
        }
    xattn_scorer_free (s);
  }
  data_free (d);
}

typedef void (*DotsFunc) (const float *rows, gsize row_stride, gint64 n_rows, const float *cols,
                          gsize col_stride, gint64 n_cols, gsize len, float *out);

/* One SIMD path against the scalar reference, over lengths with and without
 * a vector tail and tiles cut at every edge. Rounding in a length-n float
 * sum scales with |a| |b| (not with the dot, which may cancel to ~0), so the
 * squared error is normalized by the sum of (|a_i| |b_j|)^2. */
static void
G_GNUC_UNUSED check_dots (DotsFunc f)
{
  GRand *r = g_rand_new_with_seed (3);
  const gsize lens[] = { 8, 13, 16, 64, 1024, 1031 };
  for (gsize li = 0; li < G_N_ELEMENTS (lens); li++)
    for (gint64 nr = 1; nr <= 9; nr += 2)
      for (gint64 nc = 1; nc <= 9; nc += 2)
        {
          gsize len = lens[li], rs = len + 3, cs = len + 5;
          g_autofree float *a = g_new (float, (gsize) nr * rs);
          g_autofree float *b = g_new (float, (gsize) nc * cs);
          for (gsize i = 0; i < (gsize) nr * rs; i++)
            a[i] = (float) g_rand_double_range (r, -1, 1);
          for (gsize i = 0; i < (gsize) nc * cs; i++)
            b[i] = (float) g_rand_double_range (r, -1, 1);
          g_autofree float *x = g_new (float, (gsize) (nr * nc));
          g_autofree float *y = g_new (float, (gsize) (nr * nc));
          sift_score_tile_scalar (a, rs, nr, b, cs, nc, len, x);
          f (a, rs, nr, b, cs, nc, len, y);
          double num = 0, den = 0;
          for (gint64 i = 0; i < nr * nc; i++)
            {
              double na = 0, nb = 0;
              for (gsize t = 0; t < len; t++)
                {
                  na += (double) a[(gsize) (i / nc) * rs + t] * a[(gsize) (i / nc) * rs + t];
                  nb += (double) b[(gsize) (i % nc) * cs + t] * b[(gsize) (i % nc) * cs + t];
                }
              num += (x[i] - y[i]) * (double) (x[i] - y[i]);
              den += na * nb;
            }
          if (num > 1e-12 * den)
            fail_msg ("len %zu, %" G_GINT64_FORMAT " x %" G_GINT64_FORMAT ": squared error %g of %g", len, nr, nc, num, den);
        }
  g_rand_free (r);
}

#ifdef XATTN_HAVE_AVX512
/* The AVX-512 max and sum of exponentials against expf, over lengths with
 * and without a masked tail and exponents down to the underflow clamp. */
static void
check_exp_avx512 (void)
{
  GRand *r = g_rand_new_with_seed (8);
  const gsize lens[] = { 1, 15, 16, 17, 64, 100 };
  for (gsize li = 0; li < G_N_ELEMENTS (lens); li++)
    {
      gsize n = lens[li];
      g_autofree float *x = g_new (float, n);
      for (gsize i = 0; i < n; i++)
        x[i] = (float) g_rand_double_range (r, -400.0, 40.0);
      const float scale = 0.3f;
      float m = -INFINITY;
      for (gsize i = 0; i < n; i++)
        m = MAX (m, x[i] * scale);
      assert_true (xattn_max_scaled_avx512 (x, n, scale) == m);
      double want = 0.0;
      for (gsize i = 0; i < n; i++)
        want += exp ((double) (x[i] * scale - m));
      double got = xattn_sum_exp_avx512 (x, n, scale, m);
      /* x * scale - m is fused (in the kernel, and maybe here): the top
       * term is e^(rounding error of m), |m| <= 120: within 1e-5. */
      if (fabs (got - want) > 1e-5 * want)
        fail_msg ("sum_exp over %zu: got %.9g, want %.9g", n, got, want);
      /* Each term alone, across the range (a single entry at m - y). */
      for (int k = 0; k <= 100; k++)
        {
          float one = (float) -k + 0.37f;
          double e = exp ((double) one), g = xattn_sum_exp_avx512 (&one, 1, 1.0f, 0.0f);
          /* Clamped at -87: below, a negligible e^-87 instead of 0. */
          if (one > -87.0f ? fabs (g - e) > 2e-7 * e : g > 2e-38)
            fail_msg ("exp(%g): got %.9g, want %.9g", (double) one, g, e);
        }
    }
  g_rand_free (r);
}
#endif

/* xattn_pack_panels against its definition: entry (p, t) of column c in
 * panel c / 16, lane c % 16, is key cS + p, dim t; zeros past the keys and
 * past the last column. */
static void
test_pack_panels_layout (void **state)
{
  (void) state;
  const gint32 S = 4, d = 8;
  const gint64 lens[] = { 4, 37, 64, 65, 200 };
  for (gsize li = 0; li < G_N_ELEMENTS (lens); li++)
    {
      const gint64 n = lens[li], n_cols = (n + S - 1) / S, n_panels = (n_cols + 15) / 16;
      const gsize ks = (gsize) d + 3; /* rows further apart than head_dim */
      g_autofree float *k = g_new (float, (gsize) n * ks);
      for (gsize i = 0; i < (gsize) n * ks; i++)
        k[i] = (float) i + 0.5f;
      const gsize floats = (gsize) n_panels * (gsize) (S * d) * 16;
      g_autofree float *dst = g_new (float, floats);
      memset (dst, 0xff, floats * sizeof (float)); /* NaN: every entry must be written */
      xattn_pack_panels (k, ks, n, S, d, dst);
      /* In two calls at a column offset (how staged keys arrive): the
       * same panels. */
      g_autofree float *two = g_new (float, floats);
      memset (two, 0, floats * sizeof (float));
      const gint64 split = (n_cols / 2) * S;
      if (split > 0)
        xattn_pack_panels_at (k, ks, split, S, d, 0, two);
      xattn_pack_panels_at (k + (gsize) split * ks, ks, n - split, S, d, split / S, two);
      assert_memory_equal (two, dst, floats * sizeof (float));
      for (gint64 q = 0; q < n_panels; q++)
        for (gint64 p = 0; p < S; p++)
          for (gint64 t = 0; t < d; t++)
            for (gint64 l = 0; l < 16; l++)
              {
                gint64 j = (q * 16 + l) * S + p;
                float want = j < n ? k[(gsize) j * ks + (gsize) t] : 0.0f;
                float got = dst[((gsize) q * (gsize) (S * d) + (gsize) (p * d + t)) * 16 + (gsize) l];
                if (got != want)
                  fail_msg ("n %" G_GINT64_FORMAT ", panel %" G_GINT64_FORMAT " (%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                            ") lane %" G_GINT64_FORMAT ": got %g, want %g", n, q, p, t, l, (double) got, (double) want);
              }
    }
}

#ifdef XATTN_HAVE_AVX512
/* The AVX-512 panel products against sift_score_tile_scalar on the same
 * reshaped columns (row-major, zero padded): per segment (sum_exp's S
 * products of length d) and whole (the summed antidiagonal), over row and
 * column counts cutting the 4 x 4-panel microkernel at every edge. */
static void
check_panels_avx512 (void)
{
  GRand *r = g_rand_new_with_seed (12);
  const gint32 S = 8, d = 24;
  const gsize rlen = (gsize) S * (gsize) d, rs = rlen + 5;
  const gint64 token_counts[] = { 8, 60, 128, 136, 520, 1024 };
  for (gsize ti = 0; ti < G_N_ELEMENTS (token_counts); ti++)
    for (gint64 nr = 1; nr <= 9; nr += 4)
      {
        const gint64 n = token_counts[ti], n_cols = (n + S - 1) / S;
        g_autofree float *k = g_new0 (float, (gsize) n_cols * rlen); /* zero padded, as kbuf */
        for (gsize i = 0; i < (gsize) n * (gsize) d; i++)
          k[i] = (float) g_rand_double_range (r, -1, 1);
        g_autofree float *rows = g_new (float, (gsize) nr * rs);
        for (gsize i = 0; i < (gsize) nr * rs; i++)
          rows[i] = (float) g_rand_double_range (r, -1, 1);
        g_autofree float *panels = g_new (float, (gsize) ((n_cols + 15) / 16) * 16 * rlen);
        xattn_pack_panels (k, (gsize) d, n, S, d, panels);
        for (int whole = 0; whole < 2; whole++)
          {
            const gint64 n_seg = whole ? 1 : S;
            const gsize len = whole ? rlen : (gsize) d;
            g_autofree float *want = g_new (float, (gsize) (n_seg * nr * n_cols));
            g_autofree float *got = g_new (float, (gsize) (n_seg * nr * n_cols));
            for (gint64 p = 0; p < n_seg; p++)
              sift_score_tile_scalar (rows + (gsize) p * len, rs, nr, k + (gsize) p * len, rlen, n_cols, len,
                                 want + (gsize) (p * nr * n_cols));
            xattn_dots_panels_avx512 (rows, rs, nr, panels, n_cols, len, n_seg, got);
            for (gint64 i = 0; i < n_seg * nr * n_cols; i++)
              /* |a_i|, |b_i| <= 1: rounding of a length-len sum is below len x 2^-23. */
              if (fabsf (got[i] - want[i]) > (float) len * 1.2e-7f)
                fail_msg ("%" G_GINT64_FORMAT " tokens, %" G_GINT64_FORMAT " rows, whole %d, entry %" G_GINT64_FORMAT
                          ": got %g, want %g", n, nr, whole, i, (double) got[i], (double) want[i]);
          }
      }
  g_rand_free (r);
}
#endif

/* The scorer's SIMD path (packed panels on AVX-512) against its scalar
 * path at the policy's default shape (head_dim 128, stride 8, B 128: one
 * key block per 16-column panel), history staged in engine blocks of 128
 * and a partial last panel: block scores equal within float rounding and
 * the same selection at 0.9; likewise the stride-1 rows (exact_rows). */
static void
test_fast_scoring_matches_scalar (void **state)
{
  (void) state;
  if (xattn_dots_isa () == SIFT_ISA_SCALAR)
    {
      print_message ("no SIMD path built or supported here; scalar only\n");
      skip ();
    }
  const XattnGeometry geo = { 2, 1, 128, 8, 128, 0.08838835f, 1.0f, TRUE };
  const gint64 q_pos = 1280, kv_end = q_pos + 300;
  Data *d = data_new (&geo, kv_end, 41);
  /* Logits of a few units, as attention's: the raw data's span ~64. */
  for (gsize i = 0; i < (gsize) geo.n_q_heads * (gsize) kv_end * 128; i++)
    d->q[i] *= 0.25f;
  for (int mode = 0; mode < 3; mode++)
    {
      XattnGeometry g = geo;
      if (mode == 1)
        g.sum_exp = FALSE; /* the reference's mean logit */
      if (mode == 2)
        g.stride = 1, g.sum_exp = FALSE; /* exact rows */
      d->geo = g;
      gint64 n_qb = (kv_end - 1) / g.block - q_pos / g.block + 1, n_kb = (kv_end + g.block - 1) / g.block;
      gsize n = (gsize) (g.n_q_heads * n_qb * n_kb);
      xattn_dots_force_scalar (TRUE);
      g_autofree float *want = scorer_scores_ex (d, q_pos, kv_end, 128, FALSE, TRUE);
      xattn_dots_force_scalar (FALSE);
      g_autofree float *fast = scorer_scores_ex (d, q_pos, kv_end, 128, FALSE, TRUE);
      for (gsize i = 0; i < n; i++)
        if (fabsf (fast[i] - want[i]) > 2e-5f * MAX (1.0f, fabsf (want[i])))
          fail_msg ("mode %d, score %zu: got %.9g, want %.9g", mode, i, (double) fast[i], (double) want[i]);
      guint8 a[16], b[16];
      gint64 order[16];
      for (gint64 row = 0; row < g.n_q_heads * n_qb; row++)
        {
          gint64 qb = q_pos / g.block + row % n_qb;
          xattn_select_row (want + row * n_kb, n_kb, qb, 0.9, a, order);
          xattn_select_row (fast + row * n_kb, n_kb, qb, 0.9, b, order);
          assert_memory_equal (a, b, (gsize) n_kb);
        }
    }
  data_free (d);
}

/* Each SIMD path the CPU can run (whatever sift_isa_active () says, so the
 * paths are compared even where kernels are forced scalar). */
static void
test_simd_matches_scalar (void **state)
{
  (void) state;
  int checked = 0;
  /* The score tile is libsift's (sift_score_tile): each ISA forced in turn. */
  const SiftIsa active = sift_isa_active ();
  for (SiftIsa isa = SIFT_ISA_AVX2; isa <= SIFT_ISA_AVX512; isa++)
    if (sift_isa_force (isa))
      {
        check_dots (sift_score_tile);
        checked++;
      }
  sift_isa_force (active);
#ifdef XATTN_HAVE_AVX512
  __builtin_cpu_init ();
  if (__builtin_cpu_supports ("avx512f"))
    {
      check_exp_avx512 ();
      check_panels_avx512 ();
      checked++;
    }
#endif
  if (checked == 0)
    {
      print_message ("no SIMD path built or supported here; scalar only\n");
      skip ();
    }
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_scores_match_oracle),
    cmocka_unit_test (test_norm_and_sum_exp_match_oracle),
    cmocka_unit_test (test_exact_rows_mass),
    cmocka_unit_test (test_select_exact_rows),
    cmocka_unit_test (test_full_rows_sum_to_b_over_s),
    cmocka_unit_test (test_simd_matches_scalar),
    cmocka_unit_test (test_pack_panels_layout),
    cmocka_unit_test (test_fast_scoring_matches_scalar),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
