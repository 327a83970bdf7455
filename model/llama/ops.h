/* The element-wise operations of the Llama forward pass: RMSNorm, rotary
 * position embedding (llama.cpp's NORM and NEOX styles; linear, YaRN and
 * frequency-factor (llama3) scaling), SwiGLU. Private to model/llama/. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* out[i] = x[i] / sqrt (mean (x^2) + eps) * w[i] over rows of d; w NULL: 1.
 * out may be x. */
void llama_rmsnorm (const float *x, const float *w, float eps, gint64 rows, gint64 d, float *out);

typedef enum {
  LLAMA_ROPE_NORM, /* rotates pairs (x[2i], x[2i + 1]) (llama) */
  LLAMA_ROPE_NEOX, /* rotates pairs (x[i], x[i + n_rot / 2]) (qwen2, qwen3) */
} LlamaRopeStyle;

typedef enum {
  LLAMA_ROPE_SCALING_NONE,
  LLAMA_ROPE_SCALING_LINEAR,
  LLAMA_ROPE_SCALING_YARN,
} LlamaRopeScaling;

typedef struct {
  LlamaRopeStyle style;
  gint32 n_rot;            /* rotated dimensions of a head (even, <= head_dim) */
  double base;             /* theta base */
  LlamaRopeScaling scaling;
  double freq_scale;       /* 1 / scaling factor (linear, yarn) */
  gint64 orig_ctx;         /* yarn: the context the model was trained at */
  double ext_factor;       /* yarn: 1 mixes by the ramp, 0 is plain interpolation */
  double attn_factor;      /* multiplies cos and sin */
  double beta_fast, beta_slow; /* yarn ramp ends (32, 1) */
  const float *freq_factors; /* [n_rot / 2] divisors of each pair's frequency (llama3's rope_freqs), or NULL */
} LlamaRope;

/* Rotates x [n][heads][head_dim] in place, row t at position pos0 + t. */
void llama_rope (const LlamaRope *r, float *x, gint64 n, gint32 heads, gint32 head_dim, gint64 pos0);

/* The angle and magnitude that rotate pair i at position pos. */
void llama_rope_angle (const LlamaRope *r, gint32 i, gint64 pos, double *theta, double *mscale);

/* llama3's frequency factors ([n_rot / 2]) for a scaling factor, low and
 * high frequency factors and original context (Llama 3.1's rope_freqs). */
void llama_rope_llama3_factors (double base, gint32 n_rot, double factor, double low_freq_factor,
                                double high_freq_factor, gint64 orig_ctx, float *out);

/* out[i] = silu (gate[i]) * up[i] = gate / (1 + e^-gate) * up; out may be gate. */
void llama_swiglu (const float *gate, const float *up, gint64 n, float *out);

G_END_DECLS
