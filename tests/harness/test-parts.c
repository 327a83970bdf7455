/* The harness's parts on their own: grid spacing, JSON, scoring against
 * constructed outputs, the dense reference against one materialised
 * sift_attn_dense call, heatmap colours and files. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cairo.h>
#include <cmocka.h>
#include <glib/gstdio.h>
#include <sift/sift.h>

#include "harness.h"
#include "json.h"

static void
test_spacing (void **state)
{
  (void) state;
  double lin[5], sig[9];
  harness_spacing (SIFT_SPACING_LINEAR, 5, lin);
  for (int i = 0; i < 5; i++)
    assert_true (fabs (lin[i] - i * 0.25) < 1e-12);
  harness_spacing (SIFT_SPACING_SIGMOID, 9, sig);
  assert_true (sig[0] == 0.0 && sig[8] == 1.0);
  for (int i = 1; i < 9; i++)
    assert_true (sig[i] > sig[i - 1]);
  /* Denser near the ends than in the middle, symmetric. */
  assert_true (sig[1] - sig[0] < 0.5 * (sig[5] - sig[4]));
  assert_true (fabs (sig[1] - (1.0 - sig[7])) < 1e-12);
}

static void
test_grid_expand (void **state)
{
  (void) state;
  gint64 lengths[] = { 4096, 1024, 1024, 2048 };
  double depths[] = { 1.0, 0.0, 0.5 };
  SiftHarnessConfig h = { .lengths = lengths, .n_lengths = 4, .depths = depths, .n_depths = 3 };
  HarnessGrid g;
  assert_true (harness_grid_expand (&h, &g, NULL));
  assert_int_equal (g.n_lengths, 3); /* sorted, duplicates dropped */
  assert_int_equal (g.lengths[0], 1024);
  assert_int_equal (g.lengths[2], 4096);
  assert_true (g.depths[0] == 0.0 && g.depths[2] == 1.0);
  harness_grid_clear (&g);

  h.length_spacing = SIFT_SPACING_LINEAR;
  h.length_min = 1000;
  h.length_max = 2000;
  h.length_count = 3;
  h.depth_spacing = SIFT_SPACING_SIGMOID;
  h.depth_count = 4;
  assert_true (harness_grid_expand (&h, &g, NULL));
  assert_int_equal (g.n_lengths, 3);
  assert_int_equal (g.lengths[1], 1500);
  assert_int_equal (g.n_depths, 4);
  harness_grid_clear (&g);

  double bad[] = { 1.5 };
  SiftHarnessConfig b = { .lengths = lengths, .n_lengths = 1, .depths = bad, .n_depths = 1 };
  g_autoptr (GError) error = NULL;
  assert_false (harness_grid_expand (&b, &g, &error));
  assert_true (g_error_matches (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID));
  assert_non_null (strstr (error->message, "depths"));
}

static void
test_json_roundtrip (void **state)
{
  (void) state;
  JsonWriter w = { g_string_new (NULL), TRUE };
  json_begin_object (&w, NULL);
  json_string (&w, "label", "a \"quoted\"\\ label\n");
  json_double (&w, "x", 0.1);
  json_double (&w, "none", NAN);
  json_int (&w, "big", G_GINT64_CONSTANT (1) << 52);
  json_bool (&w, "ok", TRUE);
  json_begin_array (&w, "list");
  json_int (&w, NULL, 3);
  json_int (&w, NULL, -4);
  json_end_array (&w);
  json_begin_object (&w, "inner");
  json_double (&w, "y", 1e-300);
  json_end_object (&w);
  json_end_object (&w);
  g_autofree char *text = g_string_free (w.s, FALSE);
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonNode) n = json_parse (text, &error);
  assert_non_null (n);
  assert_string_equal (json_get_string (n, "label"), "a \"quoted\"\\ label\n");
  assert_true (json_get_double (n, "x") == 0.1); /* exact: %.17g round-trips */
  assert_true (isnan (json_get_double (n, "none")));
  assert_true (json_get_double (n, "big") == (double) (G_GINT64_CONSTANT (1) << 52));
  assert_true (json_get_double (n, "ok") == 1.0);
  assert_true (json_get_double (n, "inner.y") == 1e-300);
  assert_int_equal (json_get (n, "list")->items->len, 2);
  assert_null (json_get (n, "missing.key"));

  const char *bad[] = { "{\"a\":1", "{\"a\" 1}", "[1,]", "{} x", "\"open", "" };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr (GError) e = NULL;
      g_autoptr (JsonNode) m = json_parse (bad[i], &e);
      assert_null (m);
      assert_true (g_error_matches (e, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_RECORDS));
      assert_non_null (strstr (e->message, "column"));
    }
}

static const SiftModelShape shape = {
  .n_layers = 2, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 64, .block_size = 64, .chunk_size = 128,
};

static SiftHarnessConfig
needles (SiftNeedleKind kind)
{
  return (SiftHarnessConfig) { .needle = kind, .n_distractors = 2, .n_values = 3, .n_queries = 2,
                               .question_tokens = 2, .decode_steps = 2, .seed = 3 };
}

/* Outputs built from value codes: the right code scores, a wrong one does
 * not, and every retrieval head of every layer is scored. */
static void
test_score_constructed (void **state)
{
  (void) state;
  const gint64 n = 600;
  for (int kind = 0; kind < 4; kind++)
    {
      SiftHarnessConfig h = needles ((SiftNeedleKind) kind);
      g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (&h, n, 0.3, 4, 0, 1, NULL);
      g_autoptr (SiftModel) src = sift_model_synthetic_new (&shape, 9, NULL, plan, NULL);
      gint64 row0 = plan->question_start, rows = h.question_tokens + h.decode_steps;
      gsize d = 64, plane = 2 * 4 * (gsize) rows * d;
      g_autofree float *right = g_new0 (float, plane), *wrong = g_new0 (float, plane),
                       *partial = g_new0 (float, plane);
      float code[64];
      for (gint32 l = 0; l < 2; l++)
        for (gint32 hq = 0; hq < 4; hq++)
          for (gint64 r = 0; r < rows; r++)
            {
              gint64 t[8];
              gsize nt = sift_needle_plan_targets (plan, sift_needle_plan_key_at (plan, row0 + r), t, 8);
              gsize at = (((gsize) l * 4 + hq) * (gsize) rows + (gsize) r) * d;
              for (gsize i = 0; i < nt; i++)
                {
                  sift_model_synthetic_value_code (src, l, hq / 2, t[i], code);
                  for (gsize e = 0; e < d; e++)
                    {
                      right[at + e] += code[e] / (float) nt;
                      if (i + 1 < nt)
                        partial[at + e] += code[e] / (float) nt;
                    }
                }
              sift_model_synthetic_value_code (src, l, hq / 2, 10, code); /* an ordinary token */
              memcpy (wrong + at, code, d * sizeof (float));
            }
      gsize hits[4];
      double chance[4];
      gsize pairs = harness_score_retrieval (src, plan, right, row0, rows, hits, chance);
      assert_int_equal (pairs, 2 * 1); /* 0.25 of 4 heads -> 1 per layer */
      for (int r = 0; r < rows; r++)
        {
          assert_int_equal (hits[r], pairs);
          assert_true (chance[r] > 0 && chance[r] <= 1.0 / 590);
        }
      harness_score_retrieval (src, plan, wrong, row0, rows, hits, chance);
      for (int r = 0; r < rows; r++)
        assert_int_equal (hits[r], 0);
      if (kind == SIFT_NEEDLE_MULTIVALUE)
        {
          /* Two of three values is not retrieving all of them. */
          harness_score_retrieval (src, plan, partial, row0, rows, hits, chance);
          for (int r = 0; r < rows; r++)
            assert_int_equal (hits[r], 0);
        }
    }
}

/* Both references (a dense run through the runner: a prompt of n tokens,
 * then decode steps; and the direct one a positional model gets) equal one
 * dense causal call over the whole sequence. */
static void
test_dense_reference (void **state)
{
  (void) state;
  const gint64 n = 2500, rows = 6, row0 = n - 3;
  SiftHarnessConfig h = needles (SIFT_NEEDLE_SINGLE);
  g_autoptr (SiftNeedlePlan) plan = sift_needle_plan_new (&h, n, 0.5, 4, 0, 1, NULL);
  g_autoptr (SiftModel) src = sift_model_synthetic_new (&shape, 5, NULL, plan, NULL);
  gsize d = 64, total = (gsize) (row0 + rows);
  g_autofree float *ref = g_new (float, 2 * 4 * (gsize) rows * d);
  g_autoptr (SiftConfig) cfg = sift_config_new_default (NULL, NULL);
  assert_non_null (cfg);
  cfg->shape = shape;
  g_autofree float *direct = g_new (float, 2 * 4 * (gsize) rows * d);
  assert_true (harness_dense_reference_runner (cfg, src, n, row0 + rows - n, row0, rows, ref, NULL));
  assert_true (harness_dense_reference_direct (&cfg->shape, src, row0, rows, direct, NULL));
  g_autofree float *q = g_new (float, total * 4 * d), *k = g_new (float, total * 2 * d),
                   *v = g_new (float, total * 2 * d), *o = g_new (float, 4 * (gsize) rows * d);
  float lse[4 * 6];
  for (gint32 l = 0; l < 2; l++)
    {
      assert_true (sift_model_qkv_at (src, l, 0, (gint64) total, q, k, v, NULL));
      SiftView qv = sift_view_thd (q + (gsize) row0 * 4 * d, SIFT_DTYPE_F32, rows, 4, 64);
      SiftView kv = sift_view_thd (k, SIFT_DTYPE_F32, (gint64) total, 2, 64);
      SiftView vv = sift_view_thd (v, SIFT_DTYPE_F32, (gint64) total, 2, 64);
      SiftView ov = sift_view_htd (o, SIFT_DTYPE_F32, 4, rows, 64);
      SiftAttnOpts opts = { .causal = TRUE, .q_offset = row0 };
      assert_true (sift_attn_dense (&qv, &kv, &vv, &opts, &ov, lse, NULL));
      double num = 0, den = 0;
      for (gsize i = 0; i < 4 * (gsize) rows * d; i++)
        {
          double x = ref[(gsize) l * 4 * rows * d + i] - o[i];
          double y = direct[(gsize) l * 4 * rows * d + i] - o[i];
          num += MAX (x * x, y * y);
          den += (double) o[i] * o[i];
        }
      assert_true (sqrt (num / den) < 1e-5);
    }
}

static void
test_heatmap (void **state)
{
  (void) state;
  double rgb[3];
  harness_heatmap_colour (0.0, rgb);
  assert_true (rgb[0] > 0.9 && rgb[1] < 0.3); /* red */
  harness_heatmap_colour (0.5, rgb);
  assert_true (rgb[0] > 0.9 && rgb[1] > 0.7 && rgb[2] < 0.3); /* yellow */
  harness_heatmap_colour (1.0, rgb);
  assert_true (rgb[0] < 0.1 && rgb[1] > 0.8); /* green */

  gint64 lengths[] = { 1024, 2048 };
  double depths[] = { 0.0, 1.0 };
  HarnessGrid g = { lengths, 2, depths, 2 };
  HarnessCell cells[4] = { 0 };
  for (int i = 0; i < 4; i++)
    {
      cells[i].prefill_retrieval = cells[i].decode_retrieval = i == 3 ? 1.0 : 0.0;
      cells[i].pass = i == 3;
    }
  HarnessSetupResult r = { "configs/x.yaml", "test", FALSE, &g, cells, FALSE };
  assert_true (fabs (harness_setup_accuracy (&r) - 0.25) < 1e-12);
  g_autofree char *dir = g_dir_make_tmp ("sift-heatmap-XXXXXX", NULL);
  g_autofree char *base = g_build_filename (dir, "heatmap", NULL);
  g_autoptr (GError) error = NULL;
  assert_true (harness_heatmap_write (&r, base, &error));
  g_autofree char *png = g_strconcat (base, ".png", NULL), *svg = g_strconcat (base, ".svg", NULL);
  g_autofree char *svg_text = NULL;
  assert_true (g_file_get_contents (svg, &svg_text, NULL, NULL));
  assert_non_null (strstr (svg_text, "<svg"));
  /* The PNG shows the failing cell red and the passing one green. */
  cairo_surface_t *img = cairo_image_surface_create_from_png (png);
  assert_int_equal (cairo_surface_status (img), CAIRO_STATUS_SUCCESS);
  int stride = cairo_image_surface_get_stride (img);
  const guint8 *px = cairo_image_surface_get_data (img);
  /* Layout of heatmap.c: cells start at (80, 56), 280 x 160 each for a 2 x 2 grid. */
  const guint32 *first = (const guint32 *) (px + (56 + 20) * stride) + 80 + 20;
  const guint32 *last = (const guint32 *) (px + (56 + 160 + 20) * stride) + 80 + 280 + 20;
  assert_true (((*first >> 16) & 0xff) > 200 && ((*first >> 8) & 0xff) < 100);
  assert_true (((*last >> 16) & 0xff) < 40 && ((*last >> 8) & 0xff) > 180);
  cairo_surface_destroy (img);
  g_remove (png);
  g_remove (svg);
  g_rmdir (dir);
}

int
main (void)
{
  sift_harness_config_register ();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_spacing),
    cmocka_unit_test (test_grid_expand),
    cmocka_unit_test (test_json_roundtrip),
    cmocka_unit_test (test_score_constructed),
    cmocka_unit_test (test_dense_reference),
    cmocka_unit_test (test_heatmap),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
