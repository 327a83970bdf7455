/* The Llama-family forward pass: RMSNorm, RoPE (each style and scaling) and
 * SwiGLU against naive loops and their defining properties; the whole
 * forward of tiny random models (llama, qwen2, qwen3; each tensor type)
 * against an f64 reference written here; chunked prefill, and prefill then
 * decode, against one pass; bad models. Attention is the naive causal loop of
 * dense-attention.h, called between qkv() and attended() as the model protocol does. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <glib/gstdio.h>
#include <sift/sift.h>

#include "dense-attention.h"
#include "helpers.h"

#include "llama.h"
#include "quant.h"
#include "random-model.h"

static char *tmpdir;

static int
setup (void **state)
{
  (void) state;
  tmpdir = g_dir_make_tmp ("sift-llama-XXXXXX", NULL);
  return tmpdir == NULL;
}

static int
teardown (void **state)
{
  (void) state;
  g_autoptr (GDir) d = g_dir_open (tmpdir, 0, NULL);
  const char *name;
  while ((name = g_dir_read_name (d)) != NULL)
    {
      g_autofree char *p = g_build_filename (tmpdir, name, NULL);
      g_remove (p);
    }
  g_rmdir (tmpdir);
  g_free (tmpdir);
  return 0;
}

static char *
write_model (const GgufRandomModel *spec)
{
  static int serial;
  char *path = g_strdup_printf ("%s/m%d.gguf", tmpdir, serial++);
  g_autoptr (GError) error = NULL;
  if (!gguf_random_model_write (spec, path, &error))
    fail_msg ("%s", error->message);
  return path;
}

/* ---- ops ---- */

static void
test_rmsnorm_swiglu (void **state)
{
  (void) state;
  GRand *r = g_rand_new_with_seed (1);
  float x[3 * 100], w[100], y[3 * 100], g[50], u[50], s[50];
  randn (r, x, 300, 1.0);
  randn (r, w, 100, 1.0);
  llama_rmsnorm (x, w, 1e-5f, 3, 100, y);
  for (int t = 0; t < 3; t++)
    {
      double ss = 0;
      for (int i = 0; i < 100; i++)
        ss += (double) x[t * 100 + i] * x[t * 100 + i];
      for (int i = 0; i < 100; i++)
        assert_float_equal (y[t * 100 + i], x[t * 100 + i] / sqrt (ss / 100 + 1e-5) * w[i], 1e-5);
    }
  randn (r, g, 50, 1.0);
  randn (r, u, 50, 1.0);
  llama_swiglu (g, u, 50, s);
  for (int i = 0; i < 50; i++)
    assert_float_equal (s[i], g[i] * (1 / (1 + exp (-(double) g[i]))) * u[i], 1e-5);
  g_rand_free (r);
}

static LlamaRope
rope_plain (LlamaRopeStyle style, gint32 n_rot)
{
  return (LlamaRope) { .style = style, .n_rot = n_rot, .base = 10000, .scaling = LLAMA_ROPE_SCALING_NONE,
                       .freq_scale = 1, .attn_factor = 1, .beta_fast = 32, .beta_slow = 1 };
}

/* NORM rotates pairs (2i, 2i+1) by pos * base^(-2i/d), NEOX pairs (i, i + d/2), written out here. */
static void
test_rope_styles (void **state)
{
  (void) state;
  GRand *r = g_rand_new_with_seed (2);
  const int d = 64, heads = 3;
  float x[2 * 3 * 64], y[2 * 3 * 64];
  randn (r, x, sizeof x / sizeof x[0], 1.0);
  for (int style = LLAMA_ROPE_NORM; style <= LLAMA_ROPE_NEOX; style++)
    {
      LlamaRope rope = rope_plain (style, d);
      memcpy (y, x, sizeof x);
      llama_rope (&rope, y, 2, heads, d, 1000);
      for (int t = 0; t < 2; t++)
        for (int h = 0; h < heads; h++)
          for (int i = 0; i < d / 2; i++)
            {
              double th = (1000 + t) * pow (10000, -2.0 * i / d);
              int a = style == LLAMA_ROPE_NORM ? 2 * i : i, b = style == LLAMA_ROPE_NORM ? 2 * i + 1 : i + d / 2;
              const float *v = x + (t * heads + h) * d;
              const float *o = y + (t * heads + h) * d;
              assert_float_equal (o[a], v[a] * cos (th) - v[b] * sin (th), 2e-4);
              assert_float_equal (o[b], v[a] * sin (th) + v[b] * cos (th), 2e-4);
            }
    }
  /* Relative positions: q at p + s and k at s score the same for every shift s. */
  LlamaRope rope = rope_plain (LLAMA_ROPE_NEOX, d);
  float q[64], k[64], q2[64], k2[64];
  randn (r, q, 64, 1.0);
  randn (r, k, 64, 1.0);
  double first = 0;
  for (int s = 0; s < 3; s++)
    {
      memcpy (q2, q, sizeof q);
      memcpy (k2, k, sizeof k);
      llama_rope (&rope, q2, 1, 1, d, 37 + 500 * s);
      llama_rope (&rope, k2, 1, 1, d, 500 * s);
      double dot = 0;
      for (int i = 0; i < d; i++)
        dot += (double) q2[i] * k2[i];
      if (s == 0)
        first = dot;
      assert_float_equal (dot, first, 1e-3);
    }
  g_rand_free (r);
}

static void
test_rope_scaling (void **state)
{
  (void) state;
  const int d = 128;
  LlamaRope none = rope_plain (LLAMA_ROPE_NEOX, d);
  /* Linear: position p scaled by 1/factor is plain RoPE at p/factor. */
  LlamaRope linear = none;
  linear.scaling = LLAMA_ROPE_SCALING_LINEAR;
  linear.freq_scale = 0.25;
  for (int i = 0; i < d / 2; i++)
    {
      double t1, m1, t2, m2;
      llama_rope_angle (&linear, i, 4000, &t1, &m1);
      llama_rope_angle (&none, i, 1000, &t2, &m2);
      assert_float_equal (t1, t2, 1e-9 * fabs (t2) + 1e-12);
      assert_float_equal (m1, 1, 0);
    }
  /* YaRN: pairs that turn more than beta_fast times over orig_ctx keep their
   * angle, those under beta_slow turns are interpolated; cos and sin scale
   * by 1 + 0.1 ln(factor). */
  LlamaRope yarn = none;
  yarn.scaling = LLAMA_ROPE_SCALING_YARN;
  yarn.freq_scale = 0.25;
  yarn.orig_ctx = 4096;
  yarn.ext_factor = 1;
  int seen_fast = 0, seen_slow = 0;
  for (int i = 0; i < d / 2; i++)
    {
      double turns = 4096 * pow (10000, -2.0 * i / d) / (2 * G_PI);
      double ty, my, tn, mn;
      llama_rope_angle (&yarn, i, 3000, &ty, &my);
      llama_rope_angle (&none, i, 3000, &tn, &mn);
      assert_float_equal (my, 1 + 0.1 * log (4), 1e-12);
      if (turns > 32 * 1.2)
        {
          assert_float_equal (ty, tn, 1e-9 * tn);
          seen_fast++;
        }
      else if (turns < 1 / 1.2)
        {
          assert_float_equal (ty, tn * 0.25, 1e-9 * tn);
          seen_slow++;
        }
      else
        assert_true (ty <= tn * (1 + 1e-12) && ty >= tn * 0.25 * (1 - 1e-12));
    }
  assert_true (seen_fast > 0 && seen_slow > 0);
  /* llama3: each pair's frequency divided by its factor: high frequencies
   * (wavelength < orig_ctx / 4) kept, low ones (> orig_ctx) by the factor. */
  float factors[64];
  llama_rope_llama3_factors (500000, d, 8, 1, 4, 8192, factors);
  LlamaRope l3 = rope_plain (LLAMA_ROPE_NORM, d);
  l3.base = 500000;
  l3.freq_factors = factors;
  LlamaRope plain = l3;
  plain.freq_factors = NULL;
  for (int i = 0; i < d / 2; i++)
    {
      double wavelen = 2 * G_PI * pow (500000, 2.0 * i / d);
      double expect = wavelen < 8192 / 4.0 ? 1 : wavelen > 8192 ? 8 : -1;
      if (expect > 0)
        assert_float_equal (factors[i], expect, 1e-6);
      else
        assert_true (factors[i] > 1 && factors[i] < 8);
      double t1, m1, t2, m2;
      llama_rope_angle (&l3, i, 777, &t1, &m1);
      llama_rope_angle (&plain, i, 777, &t2, &m2);
      assert_float_equal (t1, t2 / factors[i], 1e-9 * t2);
    }
}

/* ---- the f64 reference forward ---- */

static double *
weights (GgufFile *f, const char *name, gint64 *rows, gint64 *cols)
{
  const GgufTensor *t = gguf_find_tensor (f, name);
  if (t == NULL)
    return NULL;
  gint64 n0 = (gint64) t->dims[0], n1 = (gint64) t->dims[1];
  gsize rb = (gsize) (n0 / gguf_tensor_type_block (t->type)) * gguf_tensor_type_block_bytes (t->type);
  double *w = g_new (double, n0 * n1);
  g_autofree float *row = g_new (float, n0);
  for (gint64 r = 0; r < n1; r++)
    {
      llama_dequantize_row (t->type, (const guint8 *) t->data + r * rb, row, n0);
      for (gint64 i = 0; i < n0; i++)
        w[r * n0 + i] = row[i];
    }
  if (rows != NULL)
    *rows = n1;
  if (cols != NULL)
    *cols = n0;
  return w;
}

static void
ref_matvec (const double *w, gint64 rows, gint64 cols, const double *x, double *y)
{
  for (gint64 r = 0; r < rows; r++)
    {
      double s = 0;
      for (gint64 i = 0; i < cols; i++)
        s += w[r * cols + i] * x[i];
      y[r] = s;
    }
}

static void
ref_norm (double *x, gint64 d, const double *w, double eps)
{
  double ss = 0;
  for (gint64 i = 0; i < d; i++)
    ss += x[i] * x[i];
  double inv = 1 / sqrt (ss / d + eps);
  for (gint64 i = 0; i < d; i++)
    x[i] = x[i] * inv * w[i];
}

static void
ref_rope (double *x, int hd, gint64 pos, double base, gboolean neox)
{
  for (int i = 0; i < hd / 2; i++)
    {
      double th = pos * pow (base, -2.0 * i / hd);
      int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
      double x0 = x[a], x1 = x[b];
      x[a] = x0 * cos (th) - x1 * sin (th);
      x[b] = x0 * sin (th) + x1 * cos (th);
    }
}

/* Logits of the last of n tokens, the model computed token by token in double. */
static double *
ref_forward (const char *path, const GgufRandomModel *s, const gint32 *tokens, gint64 n)
{
  g_autoptr (GgufFile) f = gguf_open (path, NULL);
  const gint64 D = s->n_embd, F = s->n_ff, H = s->n_heads, KV = s->n_kv_heads, hd = s->head_dim;
  gboolean neox = !g_str_equal (s->arch, "llama");
  g_autofree double *emb = weights (f, "token_embd.weight", NULL, NULL);
  g_autofree double *x = g_new0 (double, n * D);
  for (gint64 t = 0; t < n; t++)
    for (gint64 i = 0; i < D; i++)
      x[t * D + i] = emb[tokens[t] * D + i];
  g_autofree double *K = g_new (double, n * KV * hd), *V = g_new (double, n * KV * hd);
  g_autofree double *xn = g_new (double, D), *q = g_new (double, H * hd), *o = g_new (double, H * hd);
  g_autofree double *g = g_new (double, F), *u = g_new (double, F), *tmp = g_new (double, D), *sc = g_new (double, n);
  for (int l = 0; l < s->n_layers; l++)
    {
      char name[64];
#define W(s_) (g_snprintf (name, sizeof name, "blk.%d." s_, l), weights (f, name, NULL, NULL))
      g_autofree double *an = W ("attn_norm.weight"), *wq = W ("attn_q.weight"), *wk = W ("attn_k.weight");
      g_autofree double *wv = W ("attn_v.weight"), *wo = W ("attn_output.weight"), *fn = W ("ffn_norm.weight");
      g_autofree double *wg = W ("ffn_gate.weight"), *wu = W ("ffn_up.weight"), *wd = W ("ffn_down.weight");
      g_autofree double *bq = W ("attn_q.bias"), *bk = W ("attn_k.bias"), *bv = W ("attn_v.bias");
      g_autofree double *qn = W ("attn_q_norm.weight"), *kn = W ("attn_k_norm.weight");
#undef W
      /* K and V of every token first (causal: token t reads 0..t). */
      g_autofree double *Q = g_new (double, n * H * hd);
      for (gint64 t = 0; t < n; t++)
        {
          memcpy (xn, x + t * D, sizeof (double) * D);
          ref_norm (xn, D, an, s->eps);
          ref_matvec (wq, H * hd, D, xn, Q + t * H * hd);
          ref_matvec (wk, KV * hd, D, xn, K + t * KV * hd);
          ref_matvec (wv, KV * hd, D, xn, V + t * KV * hd);
          for (gint64 i = 0; bq != NULL && i < H * hd; i++)
            Q[t * H * hd + i] += bq[i];
          for (gint64 i = 0; bk != NULL && i < KV * hd; i++)
            {
              K[t * KV * hd + i] += bk[i];
              V[t * KV * hd + i] += bv[i];
            }
          for (gint64 h = 0; h < H; h++)
            {
              if (qn != NULL)
                ref_norm (Q + (t * H + h) * hd, hd, qn, s->eps);
              ref_rope (Q + (t * H + h) * hd, (int) hd, t, s->rope_base, neox);
            }
          for (gint64 h = 0; h < KV; h++)
            {
              if (kn != NULL)
                ref_norm (K + (t * KV + h) * hd, hd, kn, s->eps);
              ref_rope (K + (t * KV + h) * hd, (int) hd, t, s->rope_base, neox);
            }
        }
      for (gint64 t = 0; t < n; t++)
        {
          for (gint64 h = 0; h < H; h++)
            {
              gint64 kvh = h / (H / KV);
              double mx = -INFINITY, sum = 0;
              for (gint64 j = 0; j <= t; j++)
                {
                  double dot = 0;
                  for (gint64 i = 0; i < hd; i++)
                    dot += Q[(t * H + h) * hd + i] * K[(j * KV + kvh) * hd + i];
                  sc[j] = dot / sqrt ((double) hd);
                  mx = MAX (mx, sc[j]);
                }
              for (gint64 j = 0; j <= t; j++)
                sum += sc[j] = exp (sc[j] - mx);
              for (gint64 i = 0; i < hd; i++)
                {
                  double acc = 0;
                  for (gint64 j = 0; j <= t; j++)
                    acc += sc[j] * V[(j * KV + kvh) * hd + i];
                  o[h * hd + i] = acc / sum;
                }
            }
          ref_matvec (wo, D, H * hd, o, tmp);
          for (gint64 i = 0; i < D; i++)
            x[t * D + i] += tmp[i];
          memcpy (xn, x + t * D, sizeof (double) * D);
          ref_norm (xn, D, fn, s->eps);
          ref_matvec (wg, F, D, xn, g);
          ref_matvec (wu, F, D, xn, u);
          for (gint64 i = 0; i < F; i++)
            g[i] = g[i] / (1 + exp (-g[i])) * u[i];
          ref_matvec (wd, D, F, g, tmp);
          for (gint64 i = 0; i < D; i++)
            x[t * D + i] += tmp[i];
        }
    }
  g_autofree double *on = weights (f, "output_norm.weight", NULL, NULL);
  g_autofree double *out = weights (f, "output.weight", NULL, NULL);
  memcpy (xn, x + (n - 1) * D, sizeof (double) * D);
  ref_norm (xn, D, on, s->eps);
  double *logits = g_new (double, s->n_vocab);
  ref_matvec (out != NULL ? out : emb, s->n_vocab, D, xn, logits);
  return logits;
}

static void
check_model (const char *arch, GgufTensorType type, gboolean tied)
{
  GgufRandomModel spec;
  gguf_random_model_init (&spec, arch, type, 42 + type);
  spec.tied = tied;
  g_autofree char *path = write_model (&spec);
  g_autoptr (GError) error = NULL;
  g_autoptr (LlamaModel) m = llama_model_open (path, &error);
  if (m == NULL)
    fail_msg ("%s", error->message);
  const LlamaConfig *c = llama_model_config (m);
  assert_int_equal (c->n_vocab, spec.n_vocab);
  assert_int_equal (c->tied, tied);
  const gint64 n = 13;
  gint32 tokens[13];
  GRand *r = g_rand_new_with_seed (type);
  for (int t = 0; t < n; t++)
    tokens[t] = g_rand_int_range (r, 0, spec.n_vocab);
  g_rand_free (r);

  g_autofree float *one = run (m, tokens, n, n, n);
  g_autofree double *ref = ref_forward (path, &spec, tokens, n);
  /* Float weights: only f32 rounding apart; quantised weights also carry
   * the 8-bit activations of the integer dot products. */
  gboolean quant = type != GGUF_TENSOR_F32 && type != GGUF_TENSOR_F16 && type != GGUF_TENSOR_BF16;
  double e = nmse (one, ref, (gsize) spec.n_vocab);
  if (e > (quant ? 2e-3 : 1e-8))
    fail_msg ("%s %s%s: logits NMSE %g vs the f64 reference", arch, gguf_tensor_type_name (type),
              tied ? " tied" : "", e);

  /* Chunked prefill at every chunk size, and a prefill of 9 then decode
   * of 4 (the KV cache is right), give the one-pass logits. */
  for (gint64 chunk = 1; chunk <= n; chunk++)
    {
      g_autofree float *chunked = chunk < n ? run (m, tokens, n, chunk, chunk) : run (m, tokens, n, 9, 1);
      double d = max_diff (chunked, one, (gsize) spec.n_vocab);
      if (d > 1e-3)
        fail_msg ("%s %s chunk %" G_GINT64_FORMAT ": max |logit difference| %g", arch,
                  gguf_tensor_type_name (type), chunk, d);
    }
}

static void
test_forward_f32 (void **state)
{
  (void) state;
  check_model ("llama", GGUF_TENSOR_F32, FALSE);
  check_model ("qwen2", GGUF_TENSOR_F32, FALSE);
  check_model ("qwen3", GGUF_TENSOR_F32, TRUE);
}

static void
test_forward_types (void **state)
{
  (void) state;
  GgufTensorType types[] = { GGUF_TENSOR_F16, GGUF_TENSOR_BF16, GGUF_TENSOR_Q8_0,
                             GGUF_TENSOR_Q4_0, GGUF_TENSOR_Q4_K, GGUF_TENSOR_Q6_K };
  const char *archs[] = { "llama", "qwen2", "qwen3" };
  for (gsize i = 0; i < G_N_ELEMENTS (types); i++)
    check_model (archs[i % 3], types[i], i % 2 == 1);
}

/* ---- bad models ---- */

static void
expect_open_error (GgufRandomModel *spec, int code, const char *n1, const char *n2)
{
  g_autofree char *path = write_model (spec);
  g_autoptr (GError) error = NULL;
  g_autoptr (LlamaModel) m = llama_model_open (path, &error);
  assert_null (m);
  if (!g_error_matches (error, SIFT_MODEL_ERROR, code) || strstr (error->message, path) == NULL
      || (n1 && strstr (error->message, n1) == NULL) || (n2 && strstr (error->message, n2) == NULL))
    fail_msg ("unexpected: %s", error->message);
}

static void
test_bad_models (void **state)
{
  (void) state;
  GgufRandomModel spec;
  gguf_random_model_init (&spec, "mamba", GGUF_TENSOR_F32, 1);
  expect_open_error (&spec, SIFT_MODEL_ERROR_UNSUPPORTED, "'mamba'", "llama, qwen2, qwen3");
  gguf_random_model_init (&spec, "llama", GGUF_TENSOR_F32, 1);
  spec.omit_tensor = "blk.1.ffn_up.weight";
  expect_open_error (&spec, SIFT_MODEL_ERROR_MISSING, "'blk.1.ffn_up.weight'", NULL);
  gguf_random_model_init (&spec, "qwen2", GGUF_TENSOR_F32, 1);
  spec.omit_tensor = "blk.0.attn_k.bias";
  expect_open_error (&spec, SIFT_MODEL_ERROR_MISSING, "'blk.0.attn_k.bias'", NULL);
  gguf_random_model_init (&spec, "llama", GGUF_TENSOR_F32, 1);
  spec.tokenizer_vocab = spec.n_vocab + 5;
  expect_open_error (&spec, SIFT_MODEL_ERROR_FORMAT, "vocab size 389", "token_embd.weight");
  gguf_random_model_init (&spec, "llama", GGUF_TENSOR_F32, 1);
  spec.rope_scaling = "longrope";
  spec.rope_factor = 2;
  expect_open_error (&spec, SIFT_MODEL_ERROR_UNSUPPORTED, "'llama.rope.scaling.type'", "longrope");

  /* Out-of-order protocol calls are errors, not crashes. */
  gguf_random_model_init (&spec, "llama", GGUF_TENSOR_F32, 1);
  g_autofree char *path = write_model (&spec);
  g_autoptr (LlamaModel) m = llama_model_open (path, NULL);
  g_autoptr (GError) error = NULL;
  float buf[4096];
  gint32 tok = 5, bad = 9999;
  assert_false (llama_model_qkv (m, 0, buf, buf, buf, &error));
  g_clear_error (&error);
  assert_false (llama_model_begin (m, 0, 1, &bad, &error));
  assert_non_null (strstr (error->message, "9999"));
  g_clear_error (&error);
  assert_true (llama_model_begin (m, 0, 1, &tok, &error));
  assert_false (llama_model_qkv (m, 1, buf, buf, buf, &error));
  g_clear_error (&error);
  assert_false (llama_model_end (m, NULL, &error));
}

/* The random models' tokenizer (a gpt2 BPE) read from the file's metadata. */
static void
test_tokenizer_from_gguf (void **state)
{
  (void) state;
  GgufRandomModel spec;
  gguf_random_model_init (&spec, "llama", GGUF_TENSOR_F32, 3);
  g_autofree char *path = write_model (&spec);
  g_autoptr (GError) error = NULL;
  g_autoptr (GgufFile) f = gguf_open (path, &error);
  g_autoptr (SiftTokenizer) tok = llama_tokenizer_from_gguf (f, &error);
  if (tok == NULL)
    fail_msg ("%s", error->message);
  assert_int_equal (sift_tokenizer_n_tokens (tok), spec.n_vocab);
  assert_string_equal (sift_tokenizer_model (tok), "gpt2");
  const char *text = "The quick brown fox: Café 東京 🎉";
  g_autoptr (GArray) ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  assert_true (sift_tokenizer_encode (tok, text, -1, SIFT_TOKENIZE_ADD_SPECIAL, ids, &error));
  assert_int_equal (g_array_index (ids, gint32, 0), sift_tokenizer_bos (tok));
  /* The trained merges shorten the text: fewer tokens than bytes. */
  assert_true (ids->len < strlen (text));
  g_autofree char *back = sift_tokenizer_decode (tok, (const gint32 *) ids->data, ids->len, FALSE, &error);
  assert_string_equal (back, text);
}

static GgufTensorType
type_named (const char *name)
{
  for (int t = 0; t < GGUF_TENSOR_TYPE_COUNT; t++)
    if (g_strcmp0 (gguf_tensor_type_name (t), name) == 0)
      return t;
  fail_msg ("unknown type %s", name);
  return GGUF_TENSOR_F32;
}

/* llama.cpp's greedy steps on the same fixtures (tests/model/data): each
 * step's top-1 id equal wherever llama.cpp's margin over the second is not a
 * near tie, and the logits of the first and last step close. Steps are
 * teacher-forced with llama.cpp's ids, so one near tie does not derail the rest. */
static void
test_llamacpp_reference (void **state)
{
  (void) state;
  g_autofree char *text = NULL;
  assert_true (g_file_get_contents (SIFT_TEST_SRCDIR "/data/llamacpp-reference.txt", &text, NULL, NULL));
  g_auto (GStrv) lines = g_strsplit (text, "\n", -1);
  int n_fixtures = 0;
  for (char **line = lines; *line != NULL; line++)
    {
      if (!g_str_has_prefix (*line, "fixture "))
        continue;
      g_auto (GStrv) f = g_strsplit (*line, " ", -1);
      GgufRandomModel spec;
      gguf_random_model_init (&spec, f[1], type_named (f[2]), g_ascii_strtoull (f[3], NULL, 10));
      g_autofree char *path = write_model (&spec);
      g_autoptr (LlamaModel) m = llama_model_open (path, NULL);
      assert_non_null (m);
      g_auto (GStrv) pr = g_strsplit (*++line + strlen ("prompt "), " ", -1);
      gint32 tokens[64];
      gint64 n = 0;
      for (char **p = pr; *p != NULL; p++)
        tokens[n++] = (gint32) g_ascii_strtoll (*p, NULL, 10);
      Cache kc;
      cache_init (&kc, llama_model_config (m), 64);
      g_autofree float *logits = g_new (float, spec.n_vocab);
      g_autofree float *mine_logits = g_new (float, 64 * spec.n_vocab);
      int n_steps = 0, n_compared = 0;
      double worst = 0;
      gint64 pos = 0, len = n;
      for (int s = 0; g_str_has_prefix (line[1], "step "); s++)
        {
          line++;
          int ref_id;
          double margin;
          assert_int_equal (sscanf (*line, "step %*d %d %lf", &ref_id, &margin), 2);
          step (m, &kc, pos, len, tokens + pos, logits);
          pos += len;
          len = 1;
          gint32 mine = argmax (logits, spec.n_vocab);
          if (mine != ref_id && margin > 0.05)
            fail_msg ("%s %s step %d: top-1 %d, llama.cpp %d (margin %g)", f[1], f[2], s, mine, ref_id, margin);
          memcpy (mine_logits + (gsize) s * spec.n_vocab, logits, sizeof (float) * spec.n_vocab);
          n_steps = s + 1;
          tokens[pos] = ref_id;
        }
      /* The logits lines: all of a step's logits. */
      for (; g_str_has_prefix (line[1], "logits "); line++, n_compared++)
        {
          g_auto (GStrv) v = g_strsplit (line[1], " ", -1);
          int at = atoi (v[1]);
          assert_true (at < n_steps && g_strv_length (v) == 2 + (guint) spec.n_vocab);
          for (gint32 j = 0; j < spec.n_vocab; j++)
            worst = MAX (worst, fabs (mine_logits[(gsize) at * spec.n_vocab + j] - g_ascii_strtod (v[2 + j], NULL)));
        }
      assert_int_equal (n_compared, 2);
      cache_clear (&kc);
      /* Float weights: llama.cpp rounds F16 / BF16 activations; quantised: both quantise activations. */
      gboolean quant = spec.type != GGUF_TENSOR_F32;
      if (worst > (quant ? 0.15 : 2e-2))
        fail_msg ("%s %s: max |logit - llama.cpp's| %g", f[1], f[2], worst);
      g_print ("# %s %s: max |logit - llama.cpp's| %.3g\n", f[1], f[2], worst);
      n_fixtures++;
    }
  assert_int_equal (n_fixtures, 8);
}

int
main (void)
{
  sift_parallel_set_n_threads (2);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_rmsnorm_swiglu),
    cmocka_unit_test (test_rope_styles),
    cmocka_unit_test (test_rope_scaling),
    cmocka_unit_test (test_forward_f32),
    cmocka_unit_test (test_forward_types),
    cmocka_unit_test (test_bad_models),
    cmocka_unit_test (test_tokenizer_from_gguf),
    cmocka_unit_test (test_llamacpp_reference),
  };
  return cmocka_run_group_tests (tests, setup, teardown);
}
