/* RMSNorm, RoPE, SwiGLU. */
#include <math.h>

#include "ops.h"

void
llama_rmsnorm (const float *x, const float *w, float eps, gint64 rows, gint64 d, float *out)
{
  for (gint64 r = 0; r < rows; r++, x += d, out += d)
    {
      double ss = 0; /* in double: d reaches 8192 and x^2 spans decades */
      for (gint64 i = 0; i < d; i++)
        ss += (double) x[i] * x[i];
      float inv = (float) (1.0 / sqrt (ss / (double) d + eps));
      for (gint64 i = 0; i < d; i++)
        out[i] = x[i] * inv * (w != NULL ? w[i] : 1.0f);
    }
}

/* YaRN: 1 for pairs that rotate many times over the original context (kept
 * as trained), 0 for slow ones (interpolated), linear between the pair
 * indices where beta_fast and beta_slow rotations fit in orig_ctx. */
static double
yarn_ramp (const LlamaRope *r, gint32 i)
{
  double lo = r->n_rot * log ((double) r->orig_ctx / (r->beta_fast * 2 * G_PI)) / (2 * log (r->base));
  double hi = r->n_rot * log ((double) r->orig_ctx / (r->beta_slow * 2 * G_PI)) / (2 * log (r->base));
  lo = MAX (0, floor (lo));
  hi = MIN (r->n_rot - 1, ceil (hi));
  double y = (i - lo) / MAX (0.001, hi - lo);
  return 1 - MIN (1, MAX (0, y));
}

void
llama_rope_angle (const LlamaRope *r, gint32 i, gint64 pos, double *theta, double *mscale)
{
  double extrap = (double) pos * pow (r->base, -2.0 * i / r->n_rot);
  if (r->freq_factors != NULL)
    extrap /= r->freq_factors[i];
  *mscale = r->attn_factor;
  switch (r->scaling)
    {
    case LLAMA_ROPE_SCALING_NONE:
      *theta = extrap;
      break;
    case LLAMA_ROPE_SCALING_LINEAR:
      *theta = extrap * r->freq_scale;
      break;
    case LLAMA_ROPE_SCALING_YARN:
      {
        double mix = yarn_ramp (r, i) * r->ext_factor;
        *theta = extrap * r->freq_scale * (1 - mix) + extrap * mix;
        if (r->ext_factor != 0)
          *mscale *= 1 + 0.1 * log (1 / r->freq_scale);
        break;
      }
    }
}

void
llama_rope (const LlamaRope *r, float *x, gint64 n, gint32 heads, gint32 head_dim, gint64 pos0)
{
  gint32 half = r->n_rot / 2;
  float cs[512], sn[512]; /* head_dim <= 1024 */
  g_assert (half <= 512);
  for (gint64 t = 0; t < n; t++)
    {
      for (gint32 i = 0; i < half; i++)
        {
          double theta, m;
          llama_rope_angle (r, i, pos0 + t, &theta, &m);
          cs[i] = (float) (cos (theta) * m);
          sn[i] = (float) (sin (theta) * m);
        }
      for (gint32 h = 0; h < heads; h++)
        {
          float *v = x + (t * heads + h) * head_dim;
          for (gint32 i = 0; i < half; i++)
            {
              gint32 a = r->style == LLAMA_ROPE_NORM ? 2 * i : i;
              gint32 b = r->style == LLAMA_ROPE_NORM ? 2 * i + 1 : i + half;
              float x0 = v[a], x1 = v[b];
              v[a] = x0 * cs[i] - x1 * sn[i];
              v[b] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

void
llama_rope_llama3_factors (double base, gint32 n_rot, double factor, double low_freq_factor,
                           double high_freq_factor, gint64 orig_ctx, float *out)
{
  double low_wavelen = orig_ctx / low_freq_factor, high_wavelen = orig_ctx / high_freq_factor;
  for (gint32 i = 0; i < n_rot / 2; i++)
    {
      double wavelen = 2 * G_PI * pow (base, 2.0 * i / n_rot);
      if (wavelen < high_wavelen)
        out[i] = 1;
      else if (wavelen > low_wavelen)
        out[i] = (float) factor;
      else
        {
          double smooth = (orig_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
          out[i] = (float) (1 / ((1 - smooth) / factor + smooth));
        }
    }
}

void
llama_swiglu (const float *gate, const float *up, gint64 n, float *out)
{
  for (gint64 i = 0; i < n; i++)
    out[i] = gate[i] / (1.0f + expf (-gate[i])) * up[i];
}
