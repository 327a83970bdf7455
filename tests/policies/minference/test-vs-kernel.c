/* MInference vertical-slash: the kernel against dense attention restricted
 * to an explicitly built mask (double precision), SIMD against scalar. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "vs-helpers.h"

/* ---- Kernel vs the explicit mask ------------------------------------------- */

/* The mask by its definition: row p (tile [a, b) counted from q_pos)
 * attends j <= p with j a column, or a - d <= j < b - d for a distance d. */
static gboolean *
build_mask (const VsPattern *p, gint64 q_pos, gint64 n_q, gint32 tile)
{
  const gint64 n = q_pos + n_q;
  gboolean *m = g_new0 (gboolean, (gsize) n_q * n);
  for (gint64 i = 0; i < n_q; i++)
    {
      const gint64 row = q_pos + i;
      const gint64 a = q_pos + (i / tile) * tile, b = MIN (a + tile, n);
      for (gsize c = 0; c < p->n_vertical; c++)
        if (p->vertical[c] <= row)
          m[i * n + p->vertical[c]] = TRUE;
      for (gsize s = 0; s < p->n_slash; s++)
        for (gint64 j = MAX (0, a - p->slash[s]); j < b - p->slash[s] && j <= row; j++)
          m[i * n + j] = TRUE;
    }
  return m;
}

/* Dense attention restricted to a mask, in double. */
static void
masked_reference (const Qkv *t, gint32 h, gint64 q_pos, gint64 n_q, const gboolean *mask, float scale,
                  double *o, double *lse)
{
  const gint32 g = h / (t->H / t->G);
  const gint64 n = q_pos + n_q;
  g_autofree double *s = g_new (double, n);
  for (gint64 i = 0; i < n_q; i++)
    {
      const float *q = t->q + ((gsize) h * t->n + q_pos + i) * t->d;
      double mx = -INFINITY, sum = 0.0;
      for (gint64 j = 0; j < n; j++)
        if (mask[i * n + j])
          {
            s[j] = scale * dot_d (q, t->k + ((gsize) g * t->n + j) * t->d, t->d);
            mx = MAX (mx, s[j]);
          }
      double *oi = o + i * t->d;
      memset (oi, 0, t->d * sizeof (double));
      for (gint64 j = 0; j < n; j++)
        if (mask[i * n + j])
          {
            double w = exp (s[j] - mx);
            sum += w;
            for (gint32 c = 0; c < t->d; c++)
              oi[c] += w * t->v[((gsize) g * t->n + j) * t->d + c];
          }
      for (gint32 c = 0; c < t->d && sum > 0.0; c++)
        oi[c] /= sum;
      lse[i] = sum > 0.0 ? mx + log (sum) : -INFINITY;
    }
}

/* A random pattern: columns and distances, ascending, no duplicates. */
static gsize
random_set (GRand *rng, gint64 n, gint64 want, gint64 forced, gint64 *out)
{
  gboolean *in = g_new0 (gboolean, n);
  for (gint64 i = 0; i < MIN (forced, n); i++)
    in[i] = TRUE;
  for (gint64 i = 0; i < want; i++)
    in[g_rand_int_range (rng, 0, (gint32) n)] = TRUE;
  gsize c = 0;
  for (gint64 i = 0; i < n; i++)
    if (in[i])
      out[c++] = i;
  g_free (in);
  return c;
}

/* Random patterns of 4 heads over n keys (vert, slash: [4][n]), the same
 * for the same arguments: want_*[h] picks for head h (-1: an empty list),
 * 3 sink columns, 2 recent diagonals (none for head 3). */
static void
draw_patterns (gint64 n, const gint64 *want_vertical, const gint64 *want_slash, gint64 *vert, gint64 *slash,
               VsPattern *pat)
{
  g_autoptr (GRand) rng = g_rand_new_with_seed (17);
  for (gint32 h = 0; h < 4; h++)
    {
      pat[h].vertical = vert + h * n;
      pat[h].slash = slash + h * n;
      pat[h].n_vertical = want_vertical[h] < 0 ? 0 : random_set (rng, n, want_vertical[h], 3, vert + h * n);
      pat[h].n_slash = want_slash[h] < 0 ? 0 : random_set (rng, n, want_slash[h], h == 3 ? 0 : 2, slash + h * n);
    }
}

/* Runs the kernel for rows [q_pos, q_pos + n_q) over keys streamed in
 * blocks; checks every head against the masked double reference. */
static void
check_kernel_pattern (SiftIsa isa, gint32 d, gint32 tile, gint64 q_pos, gint64 n_q, gint64 block,
                      const gint64 *want_vertical, const gint64 *want_slash);

/* Random patterns per head (head 3 without recent diagonals). */
static void
check_kernel (SiftIsa isa, gint32 d, gint32 tile, gint64 q_pos, gint64 n_q, gint64 block,
              gboolean empty_pattern)
{
  const gint64 wv[4] = { 12, 17, 22, 27 }, ws[4] = { 6, 10, 14, 18 }, none[4] = { -1, -1, -1, -1 };
  check_kernel_pattern (isa, d, tile, q_pos, n_q, block, empty_pattern ? none : wv, empty_pattern ? none : ws);
}

/* want_*[h] random picks for head h (-1: an empty list). */
static void
check_kernel_pattern (SiftIsa isa, gint32 d, gint32 tile, gint64 q_pos, gint64 n_q, gint64 block,
                      const gint64 *want_vertical, const gint64 *want_slash)
{
  if (!use_isa (isa))
    return;
  Qkv t;
  const gint64 n = q_pos + n_q;
  qkv_init (&t, 5 + (guint32) d, 4, 2, d, n, 1.0);
  const float scale = 1.0f / sqrtf ((float) d);
  g_autofree gint64 *vert = g_new (gint64, 4 * n), *slash = g_new (gint64, 4 * n);
  VsPattern pat[4];
  draw_patterns (n, want_vertical, want_slash, vert, slash, pat);
  SiftView qc = sift_view_tokens (&t.qv, q_pos, n_q);
  g_autoptr (VsAttn) a = vs_attn_new (&qc, q_pos, t.G, scale, tile, pat, NULL);
  for (gint64 j0 = 0; j0 < n; j0 += block)
    {
      SiftView kb = sift_view_tokens (&t.kv, j0, MIN (block, n - j0));
      SiftView vb = sift_view_tokens (&t.vv, j0, MIN (block, n - j0));
      vs_attn_block (a, &kb, &vb, j0);
    }
  g_autofree float *out = g_new (float, 4 * n_q * d);
  g_autofree float *lse = g_new (float, 4 * n_q);
  SiftView ov = sift_view_htd (out, SIFT_DTYPE_F32, 4, n_q, d);
  vs_attn_finish (a, &ov, lse);

  g_autofree double *ro = g_new (double, n_q * d), *rl = g_new (double, n_q);
  g_autofree VsRange *scratch = g_new (VsRange, n + 1);
  gint64 mask_count = 0;
  for (gint32 h = 0; h < 4; h++)
    {
      g_autofree gboolean *mask = build_mask (&pat[h], q_pos, n_q, tile);
      masked_reference (&t, h, q_pos, n_q, mask, scale, ro, rl);
      gint64 head_count = 0;
      for (gint64 i = 0; i < n_q * n; i++)
        head_count += mask[i];
      mask_count += head_count;
      assert_int_equal (vs_pattern_count (&pat[h], q_pos, n_q, tile, scratch), head_count);
      /* The tile mask holds the exact vertical-slash pattern. */
      for (gint64 i = 0; i < n_q; i++)
        {
          const gint64 row = q_pos + i;
          for (gsize s = 0; s < pat[h].n_slash; s++)
            if (row - pat[h].slash[s] >= 0)
              assert_true (mask[i * n + row - pat[h].slash[s]]);
        }
      for (gint64 i = 0; i < n_q; i++)
        {
          if (rl[i] == -INFINITY)
            {
              assert_true (lse[h * n_q + i] == -INFINITY);
              for (gint32 c = 0; c < d; c++)
                assert_true (out[(h * n_q + i) * d + c] == 0.0f);
              continue;
            }
          assert_true (fabs (lse[h * n_q + i] - rl[i]) < 1e-4);
          for (gint32 c = 0; c < d; c++)
            assert_true (fabs (out[(h * n_q + i) * d + c] - ro[i * d + c]) < 2e-5);
        }
    }
  assert_int_equal (vs_attn_attended (a), mask_count);
  qkv_clear (&t);
  vs_set_isa (-1);
}

static void
test_kernel_mask_scalar (void **state)
{
  (void) state;
  check_kernel (SIFT_ISA_SCALAR, 16, 64, 0, 200, 200, FALSE);
  check_kernel (SIFT_ISA_SCALAR, 16, 16, 150, 130, 33, FALSE);
  check_kernel (SIFT_ISA_SCALAR, 8, 7, 20, 90, 11, FALSE);
  check_kernel (SIFT_ISA_SCALAR, 16, 4, 0, 150, 150, FALSE);
}

static void
test_kernel_mask_simd (void **state)
{
  (void) state;
  const SiftIsa isas[] = { SIFT_ISA_AVX2, SIFT_ISA_AVX512 };
  for (gsize i = 0; i < G_N_ELEMENTS (isas); i++)
    {
      check_kernel (isas[i], 16, 64, 0, 200, 200, FALSE);
      check_kernel (isas[i], 128, 16, 0, 257, 257, FALSE);
      check_kernel (isas[i], 128, 64, 190, 100, 64, FALSE);
      check_kernel (isas[i], 48, 5, 70, 150, 1, FALSE);
      check_kernel (isas[i], 24, 9, 33, 90, 40, FALSE);
      /* Tiles of at most 4 rows: few-key groups wait in the pending buffer. */
      check_kernel (isas[i], 64, 4, 0, 300, 300, FALSE);
      check_kernel (isas[i], 32, 3, 41, 170, 37, FALSE);
      check_kernel (isas[i], 16, 1, 5, 120, 64, FALSE);
    }
}

/* Tiles of at most 4 rows buffer scored keys (VsPending on AVX-512): whole
 * panels, scattered lone diagonals (few-key dot blocks), stray columns, a
 * mix, and nearly every diagonal (the buffer flushing at every group);
 * row counts not a multiple of 4, blocks that cut panels. */
static void
test_kernel_buffered (void **state)
{
  (void) state;
  const gint64 n = 37 + 301;
  const gint64 dense[4] = { n, n, n / 2, n }, scattered[4] = { n / 10, n / 8, n / 6, n / 12 };
  const gint64 few[4] = { 3, 5, 8, 13 }, none[4] = { -1, -1, -1, -1 };
  const gint64 columns[4] = { n / 3, n / 5, n / 9, n / 2 };
  const SiftIsa isas[] = { SIFT_ISA_SCALAR, SIFT_ISA_AVX2, SIFT_ISA_AVX512 };
  for (gsize i = 0; i < G_N_ELEMENTS (isas); i++)
    for (gint32 tile = 1; tile <= 4; tile++)
      {
        if (isas[i] != SIFT_ISA_AVX512 && (tile == 2 || tile == 3))
          continue; /* the buffered path is AVX-512's; the others get both ends */
        check_kernel_pattern (isas[i], 128, tile, 37, 301, 50, few, dense);
        check_kernel_pattern (isas[i], 128, tile, 37, 301, 1000, none, scattered);
        check_kernel_pattern (isas[i], 64, tile, 37, 301, 64, columns, none);
        check_kernel_pattern (isas[i], 32, tile, 37, 301, 29, columns, scattered);
      }
}

/* The kernel attends a block's vertical columns as packed panels of 32
 * per head, less the columns a tile's slash ranges hold: patterns with
 * several such panels per block, columns inside and outside the ranges and
 * after the tiles' rows, a last tile shorter than the others, against the
 * explicit mask. */
static void
test_kernel_column_panels (void **state)
{
  (void) state;
  const gint64 wv[4] = { 150, 90, 220, 40 }, ws[4] = { 60, 30, 5, 90 };
  const gint64 q_pos = 300, n_q = 203, n = q_pos + n_q;
  const gint32 tiles[] = { 4, 3, 16 };
  /* The cases occur: per (head, tile), columns inside and outside its
   * ranges, and columns past its last row. */
  {
    g_autofree gint64 *vert = g_new (gint64, 4 * n), *slash = g_new (gint64, 4 * n);
    g_autofree VsRange *r = g_new (VsRange, n + 1);
    VsPattern pat[4];
    draw_patterns (n, wv, ws, vert, slash, pat);
    gint64 inside = 0, outside = 0, after = 0;
    for (gint32 h = 0; h < 4; h++)
      for (gint64 a = q_pos; a < n; a += 4)
        {
          const gint64 b = MIN (a + 4, n);
          const gsize nr = vs_tile_ranges (&pat[h], a, b, 0, b, r);
          for (gsize c = 0; c < pat[h].n_vertical; c++)
            {
              const gint64 col = pat[h].vertical[c];
              gboolean in = FALSE;
              for (gsize k = 0; k < nr; k++)
                in |= col >= r[k].start && col < r[k].end;
              inside += in;
              outside += !in && col < b;
              after += col >= b;
            }
        }
    assert_true (inside > 100 && outside > 100 && after > 100);
    assert_true (pat[2].n_vertical > 2 * VS_KEY_GROUP);
  }
  const SiftIsa isas[] = { SIFT_ISA_SCALAR, SIFT_ISA_AVX2, SIFT_ISA_AVX512 };
  for (gsize i = 0; i < G_N_ELEMENTS (isas); i++)
    for (gsize t = 0; t < G_N_ELEMENTS (tiles); t++)
      {
        /* One block, blocks of ~two column panels, blocks splitting a panel. */
        check_kernel_pattern (isas[i], 128, tiles[t], q_pos, n_q, n, wv, ws);
        check_kernel_pattern (isas[i], 16, tiles[t], q_pos, n_q, 160, wv, ws);
        check_kernel_pattern (isas[i], 16, tiles[t], q_pos, n_q, 37, wv, ws);
      }
}

static void
test_kernel_empty_pattern (void **state)
{
  (void) state;
  check_kernel (SIFT_ISA_SCALAR, 8, 16, 10, 70, 16, TRUE);
  check_kernel (SIFT_ISA_AVX2, 8, 16, 10, 70, 16, TRUE);
}

/* The SIMD inner loops against the scalar ones on the same inputs: lanes
 * clipped at both ends, rows that see none, some or all of the keys. */
/* A group of the first VS_KEY_GROUP keys of t at positions 20..; its
 * transposed panel is returned (free it). */
static float *
group_init (const Qkv *t, guint32 mask, VsGroup *grp)
{
  *grp = (VsGroup) { .key0 = 20, .mask = mask };
  for (gint32 kk = 0; kk < VS_KEY_GROUP; kk++)
    {
      grp->krow[kk] = t->k + (gsize) kk * t->d;
      grp->vrow[kk] = t->v + (gsize) kk * t->d;
    }
  float *kt = g_new (float, (gsize) t->d * VS_KEY_GROUP);
  vs_transpose (grp->krow, VS_KEY_GROUP, t->d, kt);
  grp->kt = kt;
  return kt;
}

static void
check_group_paths (SiftIsa isa, guint32 mask)
{
  Qkv t;
  qkv_init (&t, 23, 1, 1, 128, VS_KEY_GROUP + 64, 1.0);
  VsGroup grp;
  g_autofree float *kt = group_init (&t, mask, &grp);
  const float *const *krow = grp.krow;
  float s1[64 * VS_KEY_GROUP], s2[64 * VS_KEY_GROUP];
  vs_set_isa (SIFT_ISA_SCALAR);
  vs_scores (t.q, 64, t.d, krow, 29, s1);
  vs_set_isa (isa);
  vs_scores (t.q, 64, t.d, krow, 29, s2);
  for (gint32 r = 0; r < 64; r++)
    for (gint32 kk = 0; kk < 29; kk++)
      assert_true (fabsf (s1[r * VS_KEY_GROUP + kk] - s2[r * VS_KEY_GROUP + kk]) < 1e-4f);
  float m[2][64], l[2][64];
  g_autofree float *acc0 = g_new0 (float, 64 * t.d), *acc1 = g_new0 (float, 64 * t.d);
  float *acc[2] = { acc0, acc1 };
  gint64 attended[2];
  for (int w = 0; w < 2; w++)
    {
      for (gint32 r = 0; r < 64; r++)
        m[w][r] = -INFINITY, l[w][r] = 0.0f;
      /* Rows at 10..72 against keys 20..51: the first rows see no key, the
       * last all of the mask; 63 rows leave a partial block of 4. */
      VsTile tile = { t.q, 10, 63, t.d, m[w], l[w], acc[w], 0 };
      vs_set_isa (w == 0 ? SIFT_ISA_SCALAR : isa);
      for (int rep = 0; rep < 3; rep++)
        vs_group_attend (&tile, &grp);
      attended[w] = tile.attended;
    }
  gint64 expect = 0;
  for (gint64 p = 10; p < 73; p++)
    expect += 3 * __builtin_popcount (vs_visible_lanes (&grp, p));
  assert_int_equal (attended[0], expect);
  assert_int_equal (attended[1], expect);
  assert_true (expect > 0);
  for (gint32 r = 0; r < 63; r++)
    {
      assert_true (fabsf (l[0][r] - l[1][r]) <= 1e-4f * l[0][r]);
      assert_true (m[0][r] == -INFINITY ? m[1][r] == -INFINITY : fabsf (m[0][r] - m[1][r]) < 1e-4f);
      for (gint32 c = 0; c < t.d; c++)
        assert_true (fabsf (acc0[r * t.d + c] - acc1[r * t.d + c]) <= 1e-4f * (1.0f + l[0][r]));
    }
  qkv_clear (&t);
  vs_set_isa (-1);
}

static void
test_simd_matches_scalar (void **state)
{
  (void) state;
  gboolean any = FALSE;
  const guint32 masks[] = { 0xffffffffu, 0x1ffff0f8u, 0x0000f0f0u, 0x80030000u, 0x1u };
  for (gsize i = 0; i < G_N_ELEMENTS (masks); i++)
    {
      if (have_avx2 ())
        check_group_paths (SIFT_ISA_AVX2, masks[i]), any = TRUE;
      if (have_avx512 ())
        check_group_paths (SIFT_ISA_AVX512, masks[i]), any = TRUE;
    }
  if (!any)
    skip ();
}

#ifdef VS_HAVE_AVX512
/* Two adjacent 4-row tiles fed together (one panel pass scores eight rows
 * when both need it) against each fed alone: same attended counts, same
 * state. Masks reach one half, both halves, few lanes (dot-product blocks)
 * and nothing; rows start before, inside and after the group (causal edge
 * inside the panel); the second tile has 4, 3 or 1 rows. */
static void
check_pending_pair (guint32 m0, guint32 m1, gint64 pos0, gint32 rows1)
{
  Qkv t;
  qkv_init (&t, 29, 1, 1, 128, VS_KEY_GROUP + 8, 1.0);
  VsGroup grp;
  g_autofree float *kt = group_init (&t, 0, &grp);
  float m[2][8], l[2][8];
  g_autofree float *acc0 = g_new0 (float, 8 * t.d), *acc1 = g_new0 (float, 8 * t.d);
  float *acc[2] = { acc0, acc1 };
  gint64 attended[2][2];
  g_autofree VsPending *pd = g_new0 (VsPending, 4);
  for (int w = 0; w < 2; w++)
    {
      for (gint32 r = 0; r < 8; r++)
        m[w][r] = -INFINITY, l[w][r] = 0.0f;
      VsTile t0 = { t.q, pos0, 4, t.d, m[w], l[w], acc[w], 0 };
      VsTile t1 = { t.q + 4 * t.d, pos0 + 4, rows1, t.d, m[w] + 4, l[w] + 4, acc[w] + 4 * t.d, 0 };
      VsPending *p0 = &pd[2 * w], *p1 = &pd[2 * w + 1];
      /* Three rounds: the buffers fill and flush in between. */
      for (int rep = 0; rep < 3; rep++)
        if (w == 0)
          vs_pending_add2_avx512 (&t0, p0, m0, &t1, p1, m1, &grp);
        else
          {
            grp.mask = m0;
            vs_pending_add_avx512 (&t0, p0, &grp);
            grp.mask = m1;
            vs_pending_add_avx512 (&t1, p1, &grp);
          }
      vs_pending_flush_avx512 (&t0, p0);
      vs_pending_flush_avx512 (&t1, p1);
      attended[w][0] = t0.attended;
      attended[w][1] = t1.attended;
    }
  for (int k = 0; k < 2; k++)
    assert_int_equal (attended[0][k], attended[1][k]);
  for (gint32 r = 0; r < 4 + rows1; r++)
    {
      assert_true (fabsf (l[0][r] - l[1][r]) <= 1e-4f * l[1][r]);
      assert_true (m[1][r] == -INFINITY ? m[0][r] == -INFINITY : fabsf (m[0][r] - m[1][r]) < 1e-4f);
      for (gint32 c = 0; c < t.d; c++)
        assert_true (fabsf (acc0[r * t.d + c] - acc1[r * t.d + c]) <= 1e-4f * (1.0f + l[1][r]));
    }
  qkv_clear (&t);
}

static void
test_pending_pair (void **state)
{
  (void) state;
  if (!use_isa (SIFT_ISA_AVX512))
    {
      skip ();
      return;
    }
  const guint32 masks[] = { 0xffffffffu, 0x0000fff0u, 0xfff00000u, 0x0f0f00f0u, 0x00000011u, 0x80000001u, 0 };
  const gint64 pos[] = { 14, 20, 33, 49, 60 };
  const gint32 rows1[] = { 4, 3, 1 };
  gint64 checked = 0;
  for (gsize i = 0; i < G_N_ELEMENTS (masks); i++)
    for (gsize j = 0; j < G_N_ELEMENTS (masks); j++)
      for (gsize p = 0; p < G_N_ELEMENTS (pos); p++)
        for (gsize r = 0; r < G_N_ELEMENTS (rows1); r++, checked++)
          check_pending_pair (masks[i], masks[j], pos[p], rows1[r]);
  assert_true (checked > 0);
  vs_set_isa (-1);
}
#else
static void
test_pending_pair (void **state)
{
  (void) state;
  skip ();
}
#endif

int
main (void)
{
  sift_parallel_set_n_threads (2);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_kernel_mask_scalar),
    cmocka_unit_test (test_kernel_mask_simd),
    cmocka_unit_test (test_kernel_buffered),
    cmocka_unit_test (test_kernel_column_panels),
    cmocka_unit_test (test_kernel_empty_pattern),
    cmocka_unit_test (test_simd_matches_scalar),
    cmocka_unit_test (test_pending_pair),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
