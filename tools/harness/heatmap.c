/* Heatmaps with cairo: depth down, context length across, each cell
 * coloured by its retrieval score on the red-yellow-green scale of the
 * classic needle-in-a-haystack plots; one drawing for PNG and SVG. */
#include <math.h>
#include <string.h>

#include <cairo-svg.h>
#include <cairo.h>

#include "harness.h"

#define MARGIN_LEFT 80.0
#define MARGIN_TOP 56.0
#define MARGIN_RIGHT 96.0
#define MARGIN_BOTTOM 64.0

/* The three stops of the classic plots' colour map. */
static const double stops[3][3] = {
  { 0xF0 / 255.0, 0x49 / 255.0, 0x6E / 255.0 }, /* red: 0 */
  { 0xEB / 255.0, 0xB8 / 255.0, 0x39 / 255.0 }, /* yellow: 0.5 */
  { 0x0C / 255.0, 0xD7 / 255.0, 0x9F / 255.0 }, /* green: 1 */
};

void
harness_heatmap_colour (double score, double rgb[3])
{
  double s = isfinite (score) ? CLAMP (score, 0.0, 1.0) : 0.0;
  int i = s < 0.5 ? 0 : 1;
  double t = s < 0.5 ? s * 2.0 : (s - 0.5) * 2.0;
  for (int c = 0; c < 3; c++)
    rgb[c] = stops[i][c] + t * (stops[i + 1][c] - stops[i][c]);
}

/* The score a cell shows: mean of its phases' retrieval fractions. */
static double
cell_score (const HarnessCell *c)
{
  if (!isfinite (c->decode_retrieval))
    return c->prefill_retrieval;
  return 0.5 * (c->prefill_retrieval + c->decode_retrieval);
}

static void
length_label (gint64 n, char *buf, gsize size)
{
  if (n >= 1024 && n % 1024 == 0)
    g_snprintf (buf, size, "%" G_GINT64_FORMAT "K", n / 1024);
  else
    g_snprintf (buf, size, "%" G_GINT64_FORMAT, n);
}

static void
text_at (cairo_t *cr, const char *s, double x, double y, double align_x, double align_y)
{
  cairo_text_extents_t e;
  cairo_text_extents (cr, s, &e);
  cairo_move_to (cr, x - e.x_bearing - align_x * e.width, y - e.y_bearing - align_y * e.height);
  cairo_show_text (cr, s);
}

static void
draw (cairo_t *cr, const HarnessSetupResult *r, double cw, double ch)
{
  const HarnessGrid *g = r->grid;
  double gw = cw * (double) g->n_lengths, gh = ch * (double) g->n_depths;
  double width = MARGIN_LEFT + gw + MARGIN_RIGHT, height = MARGIN_TOP + gh + MARGIN_BOTTOM;
  cairo_set_source_rgb (cr, 1, 1, 1);
  cairo_paint (cr);
  cairo_select_font_face (cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);

  char buf[256];
  for (gsize d = 0; d < g->n_depths; d++)
    for (gsize l = 0; l < g->n_lengths; l++)
      {
        const HarnessCell *c = &r->cells[d * g->n_lengths + l];
        double rgb[3], s = cell_score (c);
        harness_heatmap_colour (s, rgb);
        double x = MARGIN_LEFT + cw * (double) l, y = MARGIN_TOP + ch * (double) d;
        cairo_set_source_rgb (cr, rgb[0], rgb[1], rgb[2]);
        cairo_rectangle (cr, x, y, cw, ch);
        cairo_fill_preserve (cr);
        cairo_set_source_rgb (cr, 1, 1, 1);
        cairo_set_line_width (cr, 1.0);
        cairo_stroke (cr);
        cairo_set_source_rgb (cr, 0.1, 0.1, 0.1);
        cairo_set_font_size (cr, MIN (11.0, ch * 0.45));
        g_snprintf (buf, sizeof buf, "%.0f%s", 100.0 * s, c->pass ? "" : " x");
        text_at (cr, buf, x + cw / 2, y + ch / 2, 0.5, 0.5);
      }

  /* Axes. */
  cairo_set_source_rgb (cr, 0.1, 0.1, 0.1);
  cairo_set_font_size (cr, 11.0);
  for (gsize l = 0; l < g->n_lengths; l++)
    {
      length_label (g->lengths[l], buf, sizeof buf);
      text_at (cr, buf, MARGIN_LEFT + cw * ((double) l + 0.5), MARGIN_TOP + gh + 6, 0.5, 0.0);
    }
  for (gsize d = 0; d < g->n_depths; d++)
    {
      g_snprintf (buf, sizeof buf, "%.0f%%", 100.0 * g->depths[d]);
      text_at (cr, buf, MARGIN_LEFT - 6, MARGIN_TOP + ch * ((double) d + 0.5), 1.0, 0.5);
    }
  cairo_set_font_size (cr, 12.0);
  text_at (cr, "context length (tokens)", MARGIN_LEFT + gw / 2, height - 22, 0.5, 0.5);
  cairo_save (cr);
  cairo_translate (cr, 16, MARGIN_TOP + gh / 2);
  cairo_rotate (cr, -G_PI / 2);
  text_at (cr, "needle depth", 0, 0, 0.5, 0.5);
  cairo_restore (cr);
  cairo_set_font_size (cr, 14.0);
  g_snprintf (buf, sizeof buf, "%s: %.0f%% of cells pass", r->label, 100.0 * harness_setup_accuracy (r));
  text_at (cr, buf, MARGIN_LEFT, 18, 0.0, 0.5);
  cairo_set_font_size (cr, 10.0);
  g_autofree char *base = g_path_get_basename (r->config_file);
  g_snprintf (buf, sizeof buf, "%s; cell: retrieval score %%, x = fails", base);
  text_at (cr, buf, MARGIN_LEFT, 38, 0.0, 0.5);

  /* Colour bar. */
  double bx = width - MARGIN_RIGHT + 24, bw = 16;
  for (int i = 0; i < 100; i++)
    {
      double rgb[3];
      harness_heatmap_colour (1.0 - (i + 0.5) / 100.0, rgb);
      cairo_set_source_rgb (cr, rgb[0], rgb[1], rgb[2]);
      cairo_rectangle (cr, bx, MARGIN_TOP + gh * i / 100.0, bw, gh / 100.0 + 0.5);
      cairo_fill (cr);
    }
  cairo_set_source_rgb (cr, 0.1, 0.1, 0.1);
  cairo_set_font_size (cr, 10.0);
  for (int t = 0; t <= 4; t++)
    {
      g_snprintf (buf, sizeof buf, "%d%%", 100 - 25 * t);
      text_at (cr, buf, bx + bw + 4, MARGIN_TOP + gh * t / 4.0, 0.0, 0.5);
    }
}

static void
cell_size (const HarnessGrid *g, double *cw, double *ch)
{
  *cw = MAX (44.0, 560.0 / (double) MAX (g->n_lengths, 1));
  *ch = MAX (22.0, 320.0 / (double) MAX (g->n_depths, 1));
}

static gboolean
cairo_failed (cairo_status_t st, const char *path, GError **error)
{
  if (st == CAIRO_STATUS_SUCCESS)
    return FALSE;
  g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_IO, "cannot write %s: %s", path,
               cairo_status_to_string (st));
  return TRUE;
}

gboolean
harness_heatmap_write (const HarnessSetupResult *r, const char *base, GError **error)
{
  double cw, ch;
  cell_size (r->grid, &cw, &ch);
  double width = MARGIN_LEFT + cw * (double) r->grid->n_lengths + MARGIN_RIGHT;
  double height = MARGIN_TOP + ch * (double) r->grid->n_depths + MARGIN_BOTTOM;

  g_autofree char *png = g_strdup_printf ("%s.png", base);
  cairo_surface_t *surf = cairo_image_surface_create (CAIRO_FORMAT_RGB24, (int) ceil (width), (int) ceil (height));
  cairo_t *cr = cairo_create (surf);
  draw (cr, r, cw, ch);
  cairo_destroy (cr);
  cairo_status_t st = cairo_surface_write_to_png (surf, png);
  cairo_surface_destroy (surf);
  if (cairo_failed (st, png, error))
    return FALSE;

  g_autofree char *svg = g_strdup_printf ("%s.svg", base);
  surf = cairo_svg_surface_create (svg, width, height);
  cr = cairo_create (surf);
  draw (cr, r, cw, ch);
  cairo_destroy (cr);
  cairo_surface_finish (surf);
  st = cairo_surface_status (surf);
  cairo_surface_destroy (surf);
  return !cairo_failed (st, svg, error);
}
