/* Subquadratic core: candidate sets against a brute-force reading of the
 * rules, the published count table, and the forward kernels against a
 * double-precision reference (dense and sparse). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "sq-core.h"
#include "sq-simd.h"

/* ---- Brute-force candidate sets ---------------------------------------- */

static gboolean
is_pow2_distance (gint64 d)
{
  return d > 0 && (d & (d - 1)) == 0;
}

/* Whether key j is a token candidate of row i, straight from the rules. */
static gboolean
ref_token (const SqConfig *c, gint64 i, gint64 j, gint64 seq)
{
  if (c->causal && j > i)
    return FALSE;
  if (llabs (i - j) <= c->window)
    return TRUE;
  for (gsize x = 0; x < c->n_globals; x++)
    if (c->globals[x] == j && j < seq)
      return TRUE;
  if (c->log_stride && is_pow2_distance (llabs (i - j)) && llabs (i - j) < seq)
    return TRUE;
  return FALSE;
}

/* Whether block b is a landmark candidate of row i. */
static gboolean
ref_landmark (const SqConfig *c, gint64 i, gint64 b, gint64 seq)
{
  if (!c->landmarks)
    return FALSE;
  gint64 n_blocks = (seq + c->block_size - 1) / c->block_size;
  gint64 cur = i / c->block_size;
  gint64 avail = c->causal ? (i + 1) / c->block_size : n_blocks;
  if (avail == 0 || b >= avail)
    return FALSE;
  if (!c->causal && b == cur)
    return FALSE;
  gint64 pivot = c->causal ? avail - 1 : MIN (cur, n_blocks - 1);
  if (llabs (b - pivot) <= 1)
    return TRUE;
  return c->log_stride && is_pow2_distance (llabs (b - pivot)) && llabs (b - pivot) < n_blocks;
}

static gint64
ref_count (const SqConfig *c, gint64 seq)
{
  gint64 n_blocks = (seq + c->block_size - 1) / c->block_size;
  gint64 total = 0;
  for (gint64 i = 0; i < seq; i++)
    {
      for (gint64 j = 0; j < seq; j++)
        total += ref_token (c, i, j, seq);
      for (gint64 b = 0; b < n_blocks; b++)
        total += ref_landmark (c, i, b, seq);
    }
  return total;
}

/* The candidate lists themselves: no duplicates, exactly the reference set. */
static void
check_lists (const SqConfig *c, gint64 seq)
{
  SqStamp ts, bs;
  sq_stamp_init (&ts);
  sq_stamp_init (&bs);
  g_autofree gint64 *tok = g_new (gint64, sq_max_token_candidates (c, seq));
  g_autofree gint64 *blk = g_new (gint64, sq_max_landmark_candidates (c, seq) + 1);
  gint64 n_blocks = (seq + c->block_size - 1) / c->block_size;
  g_autofree int *hit = g_new0 (int, seq + n_blocks);
  for (gint64 i = 0; i < seq; i++)
    {
      sq_stamp_next (&ts, seq);
      sq_stamp_next (&bs, MAX (n_blocks, 1));
      gsize nt = sq_token_candidates (c, i, seq, &ts, tok);
      gsize nb = sq_landmark_candidates (c, i, seq, &bs, blk);
      memset (hit, 0, (gsize) (seq + n_blocks) * sizeof (int));
      for (gsize x = 0; x < nt; x++)
        {
          assert_true (tok[x] >= 0 && tok[x] < seq);
          assert_int_equal (hit[tok[x]]++, 0);
          if (c->sort_candidates && x > 0)
            assert_true (tok[x - 1] < tok[x]);
        }
      for (gsize x = 0; x < nb; x++)
        {
          assert_true (blk[x] >= 0 && blk[x] < n_blocks);
          assert_int_equal (hit[seq + blk[x]]++, 0);
        }
      for (gint64 j = 0; j < seq; j++)
        assert_int_equal (hit[j], ref_token (c, i, j, seq));
      for (gint64 b = 0; b < n_blocks; b++)
        assert_int_equal (hit[seq + b], ref_landmark (c, i, b, seq));
    }
  sq_stamp_clear (&ts);
  sq_stamp_clear (&bs);
}

static void
test_count_table (void **state)
{
  (void) state;
  /* ruvllm_sparse_attention 0.1.1, default config, one head. */
  static const struct { gint64 seq, edges; } table[] = {
    { 512, 59778 },     { 1024, 129858 },     { 2048, 272130 },     { 4096, 560834 },
    { 8192, 1146498 },  { 16384, 2334274 },   { 32768, 4742658 },
  };
  SqConfig c;
  sq_config_default (&c);
  for (gsize x = 0; x < G_N_ELEMENTS (table); x++)
    assert_int_equal (sq_count_edges (&c, table[x].seq), table[x].edges);
  /* The two smallest against the brute-force reading as well. */
  assert_int_equal (ref_count (&c, 512), 59778);
  assert_int_equal (ref_count (&c, 1024), 129858);
}

static void
test_lists_match_rules (void **state)
{
  (void) state;
  static const gint64 g_two[] = { 0, 5 };
  static const gint64 g_far[] = { 3, 1000, 70 }; /* 1000 and 70 beyond some sequences */
  SqConfig c;
  for (int causal = 0; causal < 2; causal++)
    for (int variant = 0; variant < 6; variant++)
      {
        sq_config_default (&c);
        c.causal = causal;
        c.window = 4;
        c.block_size = 4;
        switch (variant)
          {
          case 1: c.globals = NULL; c.n_globals = 0; break;     /* empty */
          case 2: c.globals = g_far; c.n_globals = 3; break;    /* out of range */
          case 3: c.block_size = 1; c.globals = g_two; c.n_globals = 2; break;
          case 4: c.log_stride = FALSE; c.window = 0; break;
          case 5: c.sort_candidates = TRUE; c.landmarks = FALSE; c.window = 2; break;
          default: break;
          }
        for (gint64 seq = 1; seq <= 67; seq += 11)
          {
            check_lists (&c, seq);
            assert_int_equal (sq_count_edges (&c, seq), ref_count (&c, seq));
          }
      }
}

/* ---- Forward against a double-precision reference ------------------------ */

typedef struct {
  gint32 qh, kvh, d;
  gint64 seq;
  float *q, *k, *v, *out, *lse; /* q/out [qh][seq][d], k/v [kvh][seq][d] */
  SiftView vq, vk, vv, vo;
} Case;

static float
rnd (guint32 *s)
{
  *s = *s * 1664525u + 1013904223u;
  return (float) ((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void
case_init (Case *t, gint32 qh, gint32 kvh, gint32 d, gint64 seq, guint32 seed)
{
  *t = (Case) { .qh = qh, .kvh = kvh, .d = d, .seq = seq };
  t->q = g_new (float, (gsize) qh * seq * d + 1);
  t->out = g_new (float, (gsize) qh * seq * d + 1);
  t->lse = g_new (float, (gsize) qh * seq + 1);
  t->k = g_new (float, (gsize) kvh * seq * d + 1);
  t->v = g_new (float, (gsize) kvh * seq * d + 1);
  for (gint64 x = 0; x < (gint64) qh * seq * d; x++)
    t->q[x] = 2.0f * rnd (&seed);
  for (gint64 x = 0; x < (gint64) kvh * seq * d; x++)
    {
      t->k[x] = 2.0f * rnd (&seed);
      t->v[x] = rnd (&seed);
    }
  t->vq = sift_view_htd (t->q, SIFT_DTYPE_F32, qh, seq, d);
  t->vo = sift_view_htd (t->out, SIFT_DTYPE_F32, qh, seq, d);
  t->vk = sift_view_htd (t->k, SIFT_DTYPE_F32, kvh, seq, d);
  t->vv = sift_view_htd (t->v, SIFT_DTYPE_F32, kvh, seq, d);
}

static void
case_clear (Case *t)
{
  g_free (t->q);
  g_free (t->k);
  g_free (t->v);
  g_free (t->out);
  g_free (t->lse);
}

/* Softmax over the reference candidate set (tokens, then landmark means
 * recomputed here), in double. Checks out and lse of every row. */
static void
check_against_reference (const Case *t, const SqConfig *c, gboolean dense, double tol)
{
  const gint32 d = t->d;
  const gint64 seq = t->seq;
  const gint64 nb = (seq + c->block_size - 1) / c->block_size;
  const double scale = 1.0 / sqrt ((double) d);
  g_autofree double *lk = g_new0 (double, (gsize) t->kvh * nb * d + 1);
  g_autofree double *lv = g_new0 (double, (gsize) t->kvh * nb * d + 1);
  for (gint32 g = 0; g < t->kvh; g++)
    for (gint64 b = 0; b < nb; b++)
      {
        gint64 t0 = b * c->block_size, t1 = MIN (t0 + c->block_size, seq);
        for (gint64 j = t0; j < t1; j++)
          for (gint32 x = 0; x < d; x++)
            {
              lk[(g * nb + b) * d + x] += t->k[(g * seq + j) * d + x] / (double) (t1 - t0);
              lv[(g * nb + b) * d + x] += t->v[(g * seq + j) * d + x] / (double) (t1 - t0);
            }
      }
  g_autofree double *s = g_new (double, seq + nb);
  g_autofree double *o = g_new (double, d);
  double max_err = 0.0;
  for (gint32 h = 0; h < t->qh; h++)
    for (gint64 i = 0; i < seq; i++)
      {
        gint32 g = h / (t->qh / t->kvh);
        const float *q = t->q + (h * seq + i) * d;
        double m = -INFINITY;
        for (gint64 j = 0; j < seq + nb; j++)
          {
            gboolean on = j < seq ? (dense ? (!c->causal || j <= i) : ref_token (c, i, j, seq))
                                  : (!dense && ref_landmark (c, i, j - seq, seq));
            s[j] = -INFINITY;
            if (!on)
              continue;
            double dot = 0.0;
            for (gint32 x = 0; x < d; x++)
              dot += q[x] * (j < seq ? t->k[(g * seq + j) * d + x] : lk[(g * nb + j - seq) * d + x]);
            s[j] = dot * scale;
            m = MAX (m, s[j]);
          }
        double l = 0.0;
        memset (o, 0, (gsize) d * sizeof (double));
        for (gint64 j = 0; j < seq + nb; j++)
          if (s[j] > -INFINITY)
            {
              double p = exp (s[j] - m);
              l += p;
              for (gint32 x = 0; x < d; x++)
                o[x] += p * (j < seq ? t->v[(g * seq + j) * d + x] : lv[(g * nb + j - seq) * d + x]);
            }
        for (gint32 x = 0; x < d; x++)
          max_err = MAX (max_err, fabs (o[x] / l - t->out[(h * seq + i) * d + x]));
        max_err = MAX (max_err, fabs (m + log (l) - t->lse[h * seq + i]));
      }
  if (max_err > tol)
    fail_msg ("max error %g > %g", max_err, tol);
}

static void
run_forward (Case *t, const SqConfig *c, gint64 tile)
{
  g_autoptr (GError) error = NULL;
  gboolean ok = tile < 0 ? sq_forward (c, &t->vq, &t->vk, &t->vv, &t->vo, t->lse, &error)
                         : sq_forward_tiled (c, tile, &t->vq, &t->vk, &t->vv, &t->vo, t->lse, &error);
  assert_null (error);
  assert_true (ok);
}

static void
test_dense_when_window_covers (void **state)
{
  (void) state;
  for (int causal = 0; causal < 2; causal++)
    {
      Case t;
      case_init (&t, 4, 2, 32, 150, 7);
      SqConfig c;
      sq_config_default (&c);
      c.causal = causal;
      c.window = 200; /* covers the sequence */
      c.landmarks = FALSE;
      run_forward (&t, &c, -1);
      check_against_reference (&t, &c, TRUE, 2e-5);
      run_forward (&t, &c, 16);
      check_against_reference (&t, &c, TRUE, 2e-5);
      case_clear (&t);
    }
}

static void
test_single_token_attends_itself (void **state)
{
  (void) state;
  Case t;
  case_init (&t, 2, 1, 64, 1, 3);
  SqConfig c;
  sq_config_default (&c);
  run_forward (&t, &c, -1);
  for (gint32 h = 0; h < 2; h++)
    {
      double dot = 0.0;
      for (gint32 x = 0; x < 64; x++)
        {
          assert_float_equal (t.out[h * 64 + x], t.v[x], 1e-6);
          dot += t.q[h * 64 + x] * t.k[x];
        }
      assert_float_equal (t.lse[h], dot / 8.0, 1e-5);
    }
  case_clear (&t);
}

static void
test_sparse_matches_reference (void **state)
{
  (void) state;
  static const gint64 globals[] = { 0, 37, 5000 };
  for (int variant = 0; variant < 5; variant++)
    {
      Case t;
      case_init (&t, 4, variant == 3 ? 4 : 2, 64, 300, 11 + variant);
      SqConfig c;
      sq_config_default (&c);
      c.window = 16;
      c.block_size = 8;
      c.globals = globals;
      c.n_globals = G_N_ELEMENTS (globals);
      if (variant == 1)
        c.causal = FALSE;
      if (variant == 2)
        c.block_size = 1;
      if (variant == 4)
        c.sort_candidates = TRUE;
      run_forward (&t, &c, -1);
      check_against_reference (&t, &c, FALSE, 2e-5);
      run_forward (&t, &c, 32);
      check_against_reference (&t, &c, FALSE, 2e-5);
      case_clear (&t);
    }
}

/* SIMD and scalar paths, and the tiled walk, agree within 1e-5; windows
 * past 240 keys take the band kernel in more than one chunk. */
static void
test_paths_agree (void **state)
{
  (void) state;
  static const struct { gint32 d; gint64 window; } cases[] = {
    { 64, 128 }, { 48, 128 }, { 128, 128 }, { 32, 128 }, { 20, 128 }, { 64, 400 }, { 32, 300 },
  };
  for (gsize x = 0; x < G_N_ELEMENTS (cases); x++)
    {
      Case t;
      case_init (&t, 8, 2, cases[x].d, 700, 5);
      SqConfig c;
      sq_config_default (&c);
      c.window = cases[x].window;
      gsize n = (gsize) t.qh * t.seq * t.d;
      g_autofree float *fast = g_new (float, n);
      g_autofree float *tiled = g_new (float, n);
      run_forward (&t, &c, -1);
      memcpy (fast, t.out, n * sizeof (float));
      run_forward (&t, &c, 64);
      memcpy (tiled, t.out, n * sizeof (float));
      /* The scalar function is the reference. */
      SiftRowState st = { .acc = g_new (float, t.d) };
      double e_fast = 0.0, e_tiled = 0.0;
      for (gint32 h = 0; h < t.qh; h++)
        for (gint64 i = 0; i < t.seq; i += 7)
          {
            SqStamp ts, bs;
            sq_stamp_init (&ts);
            sq_stamp_init (&bs);
            sq_stamp_next (&ts, t.seq);
            sq_stamp_next (&bs, t.seq);
            g_autofree gint64 *tok = g_new (gint64, sq_max_token_candidates (&c, t.seq));
            gint64 blk[64];
            gsize nt = sq_token_candidates (&c, i, t.seq, &ts, tok);
            gsize nb = sq_landmark_candidates (&c, i, t.seq, &bs, blk);
            g_autofree gint32 *idx = g_new (gint32, nt + 1);
            gint32 lidx[64];
            for (gsize y = 0; y < nt; y++)
              idx[y] = (gint32) tok[y];
            for (gsize y = 0; y < nb; y++)
              lidx[y] = (gint32) blk[y];
            gint64 n_blocks = (t.seq + c.block_size - 1) / c.block_size;
            g_autofree float *lk = g_new (float, (gsize) t.kvh * n_blocks * t.d);
            g_autofree float *lv = g_new (float, (gsize) t.kvh * n_blocks * t.d);
            sq_landmarks_compute (&t.vk, &t.vv, c.block_size, lk, lv);
            gint32 g = h / (t.qh / t.kvh);
            const float *q = t.q + (h * t.seq + i) * t.d;
            float scale = 1.0f / sqrtf ((float) t.d);
            sift_row_state_reset (&st, t.d);
            sift_attend_row_sparse_scalar (&st, q, t.d, scale, t.k + g * t.seq * t.d, t.v + g * t.seq * t.d,
                                  t.d, idx, nt);
            sift_attend_row_sparse_scalar (&st, q, t.d, scale, lk + g * n_blocks * t.d, lv + g * n_blocks * t.d,
                                  t.d, lidx, nb);
            float o[128], lse;
            sift_row_state_finish (&st, t.d, o, &lse);
            for (gint32 y = 0; y < t.d; y++)
              {
                e_fast = MAX (e_fast, fabs (o[y] - fast[(h * t.seq + i) * t.d + y]));
                e_tiled = MAX (e_tiled, fabs (o[y] - tiled[(h * t.seq + i) * t.d + y]));
              }
            sq_stamp_clear (&ts);
            sq_stamp_clear (&bs);
          }
      g_free (st.acc);
      if (e_fast > 1e-5 || e_tiled > 1e-5)
        fail_msg ("d %d, window %" G_GINT64_FORMAT ": fast %g, tiled %g off the scalar path", cases[x].d,
                  cases[x].window, e_fast, e_tiled);
      case_clear (&t);
    }
}

/* A tile's query rows and three earlier keys and values, at random. */
static void
random_rows (guint32 *seed, gint32 d, float q[SQ_BAND_ROWS][128], float pre_k[3][128], float pre_v[3][128])
{
  for (gint32 r = 0; r < SQ_BAND_ROWS; r++)
    for (gint32 y = 0; y < d; y++)
      q[r][y] = 2.0f * rnd (seed);
  for (gint32 c = 0; c < 3; c++)
    for (gint32 y = 0; y < d; y++)
      {
        pre_k[c][y] = 2.0f * rnd (seed);
        pre_v[c][y] = rnd (seed);
      }
}

/* A kernel's state and the reference's for row r, afresh; rows 0..3 over
 * three other keys first (pre_k, pre_v), as a tile's earlier kernels leave
 * them. */
static void
start_states (SiftRowState *st, SiftRowState *ref, float *acc, float *ref_acc, gint32 r, gint32 d, const float *q,
              float scale, float pre_k[3][128], float pre_v[3][128])
{
  static const gint32 pre_idx[] = { 0, 1, 2 };
  *st = (SiftRowState) { .acc = acc };
  *ref = (SiftRowState) { .acc = ref_acc };
  sift_row_state_reset (st, d);
  sift_row_state_reset (ref, d);
  if (r < 4)
    {
      sift_attend_row_sparse_scalar (st, q, d, scale, pre_k[0], pre_v[0], 128, pre_idx, 3);
      sift_attend_row_sparse_scalar (ref, q, d, scale, pre_k[0], pre_v[0], 128, pre_idx, 3);
    }
}

/* Rows r < n_rows of a kernel's states against the scalar path's within
 * 1e-5 (output and lse); a row the reference left empty stays empty. */
static void
assert_states_match (const SiftRowState *st, const SiftRowState *ref, gint32 n_rows, gint32 d, const char *kernel,
                     gint32 n)
{
  for (gint32 r = 0; r < n_rows; r++)
    {
      float o[128], ro[128], lse, rlse;
      sift_row_state_finish (&st[r], d, o, &lse);
      sift_row_state_finish (&ref[r], d, ro, &rlse);
      if (ref[r].l == 0.0f)
        {
          /* Nothing at all (row 1 without earlier keys): still nothing. */
          assert_true (st[r].l == 0.0f && isinf (lse) && lse < 0);
          continue;
        }
      double err = fabs (lse - rlse);
      for (gint32 y = 0; y < d; y++)
        err = MAX (err, fabs (o[y] - ro[y]));
      if (err > 1e-5)
        fail_msg ("%s kernel, d %d, n %d, row %d: %g off the scalar path", kernel, d, n, r, err);
    }
}

/* sq_pack_rows against the obvious transpose, and the shared-keys kernel
 * (the 8 x 16 block a tile's rows share) against the scalar path over each
 * row's masked keys, continuing a state that already holds other keys. */
static void
test_shared_kernel (void **state)
{
  (void) state;
  static const gint32 dims[] = { 32, 64, 128, 48 };
  guint32 seed = 77;
  for (gsize x = 0; x < G_N_ELEMENTS (dims); x++)
    for (gint32 n = 1; n <= SQ_SHARED_MAX; n += 5)
      {
        const gint32 d = dims[x], n_rows = n == 6 ? 5 : SQ_BAND_ROWS;
        const float scale = 1.0f / sqrtf ((float) d);
        float keys[16][128], vals[16][128], q[SQ_BAND_ROWS][128], pre_k[3][128], pre_v[3][128];
        const float *kp[16], *vp[16];
        float panel[128 * 16] __attribute__ ((aligned (64)));
        for (gint32 c = 0; c < n; c++)
          {
            for (gint32 y = 0; y < d; y++)
              {
                keys[c][y] = 2.0f * rnd (&seed);
                vals[c][y] = rnd (&seed);
              }
            kp[c] = keys[c];
            vp[c] = vals[c];
          }
        random_rows (&seed, d, q, pre_k, pre_v);
        sq_pack_rows (kp, n, d, panel);
        for (gint32 y = 0; y < d; y++)
          for (gint32 c = 0; c < 16; c++)
            assert_true (panel[y * 16 + c] == (c < n ? keys[c][y] : 0.0f));
        SqSharedFunc fn = sq_simd_shared (d);
        if (fn == NULL)
          continue; /* no SIMD kernel here: the rows path takes these keys */
        /* Row 1 names nothing, row 0 everything, the rest at random; rows
         * 0..3 start from a state over three other keys, the rest afresh. */
        guint16 mask[SQ_BAND_ROWS];
        float acc[SQ_BAND_ROWS][128], ref_acc[SQ_BAND_ROWS][128];
        SiftRowState st[SQ_BAND_ROWS], ref[SQ_BAND_ROWS];
        for (gint32 r = 0; r < n_rows; r++)
          {
            mask[r] = r == 0 ? (guint16) ((1u << n) - 1u) : r == 1 ? 0 : (guint16) ((seed = seed * 1664525u + 1013904223u) >> 16);
            start_states (&st[r], &ref[r], acc[r], ref_acc[r], r, d, q[r], scale, pre_k, pre_v);
            gint32 idx[16], ni = 0;
            for (gint32 c = 0; c < n; c++)
              if (mask[r] & (1u << c))
                idx[ni++] = c;
            sift_attend_row_sparse_scalar (&ref[r], q[r], d, scale, keys[0], vals[0], 128, idx, (gsize) ni);
          }
        SqShared b = {
          .q = q[0], .q_stride = 128, .n_rows = n_rows, .scale = scale,
          .panel = panel, .v = vp, .n = n, .mask = mask,
        };
        fn (&b, st);
        assert_states_match (st, ref, n_rows, d, "shared", n);
      }
}

/* The diagonal kernel (a tile's strides: row r at level c reads key
 * base + r - dist[c]) against the scalar path over each row's keys in
 * level order: one level, a batch of five, exactly eight, and eleven (two
 * batches); rows naming nothing, tiles of fewer than eight rows, states
 * that already hold other keys. */
static void
test_diag_kernel (void **state)
{
  (void) state;
  enum { N = 96, BASE = 60 };
  static const gint32 dims[] = { 32, 64, 128 };
  static const gint32 levels[] = { 1, 5, 8, 11 };
  guint32 seed = 91;
  for (gsize x = 0; x < G_N_ELEMENTS (dims); x++)
    for (gsize z = 0; z < G_N_ELEMENTS (levels); z++)
      {
        const gint32 d = dims[x], n = levels[z], n_rows = z == 1 ? 5 : SQ_BAND_ROWS;
        SqDiagFunc fn = sq_simd_diag (d);
        if (fn == NULL)
          continue; /* no SIMD kernel here: the side-by-side path takes these keys */
        const float scale = 1.0f / sqrtf ((float) d);
        g_autofree float *keys = g_new (float, N * d);
        g_autofree float *vals = g_new (float, N * d);
        float q[SQ_BAND_ROWS][128], pre_k[3][128], pre_v[3][128];
        for (gint32 y = 0; y < N * d; y++)
          {
            keys[y] = 2.0f * rnd (&seed);
            vals[y] = rnd (&seed);
          }
        random_rows (&seed, d, q, pre_k, pre_v);
        /* Distances 1, 2, 4, ... and some not powers of two; level 0 (a
         * distance larger than row 0's base) leaves row 0 out, as a stride
         * longer than the row is. */
        gint64 dist[16];
        guint8 mask[16];
        for (gint32 c = 0; c < n; c++)
          {
            dist[c] = c == 0 ? BASE + 1 : c < 6 ? (gint64) 1 << c : 3 * c + 1;
            mask[c] = c == 0 ? 0xfe : c == 1 ? 0xff : (guint8) ((seed = seed * 1664525u + 1013904223u) >> 20);
            mask[c] &= (guint8) ~2u; /* row 1 names nothing */
          }
        float acc[SQ_BAND_ROWS][128], ref_acc[SQ_BAND_ROWS][128];
        SiftRowState st[SQ_BAND_ROWS], ref[SQ_BAND_ROWS];
        for (gint32 r = 0; r < n_rows; r++)
          {
            start_states (&st[r], &ref[r], acc[r], ref_acc[r], r, d, q[r], scale, pre_k, pre_v);
            gint32 idx[16], ni = 0;
            for (gint32 c = 0; c < n; c++)
              if (mask[c] & (1u << r))
                {
                  gint64 j = BASE + r - dist[c];
                  assert_true (j >= 0 && j < N);
                  idx[ni++] = (gint32) j;
                }
            sift_attend_row_sparse_scalar (&ref[r], q[r], d, scale, keys, vals, d, idx, (gsize) ni);
          }
        SqDiag b = {
          .q = q[0], .q_stride = 128, .n_rows = n_rows, .scale = scale,
          .k = keys, .v = vals, .k_stride = d, .v_stride = d, .base = BASE,
          .dist = dist, .mask = mask, .n = n,
        };
        fn (&b, st);
        assert_states_match (st, ref, n_rows, d, "diagonal", n);
      }
}

static void
test_bad_shapes (void **state)
{
  (void) state;
  Case t;
  case_init (&t, 3, 2, 16, 10, 1); /* 3 q heads over 2 kv heads */
  SqConfig c;
  sq_config_default (&c);
  g_autoptr (GError) error = NULL;
  assert_false (sq_forward (&c, &t.vq, &t.vk, &t.vv, &t.vo, t.lse, &error));
  assert_true (g_error_matches (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_SHAPE));
  g_clear_error (&error);
  c.block_size = 0;
  t.vq.n_heads = 2;
  t.vo.n_heads = 2;
  assert_false (sq_forward (&c, &t.vq, &t.vk, &t.vv, &t.vo, t.lse, &error));
  assert_true (g_error_matches (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID));
  case_clear (&t);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_count_table),
    cmocka_unit_test (test_lists_match_rules),
    cmocka_unit_test (test_dense_when_window_covers),
    cmocka_unit_test (test_single_token_attends_itself),
    cmocka_unit_test (test_sparse_matches_reference),
    cmocka_unit_test (test_paths_agree),
    cmocka_unit_test (test_shared_kernel),
    cmocka_unit_test (test_diag_kernel),
    cmocka_unit_test (test_bad_shapes),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
