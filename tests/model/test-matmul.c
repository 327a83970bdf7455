/* Dequantisation of every supported tensor type against a per-element
 * decoder written here from the block layouts; the matmul of every type and
 * ISA against the scalar kernels and an f64 reference, by NMSE. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "helpers.h"

#include "gguf-writer.h"
#include "matmul.h"
#include "quant.h"
#include "repack.h"

static const GgufTensorType types[] = {
  GGUF_TENSOR_F32, GGUF_TENSOR_F16, GGUF_TENSOR_BF16, GGUF_TENSOR_Q8_0,
  GGUF_TENSOR_Q4_0, GGUF_TENSOR_Q4_K, GGUF_TENSOR_Q6_K,
};

static float
f16 (const guint8 *p)
{
  return sift_f16_to_f32 ((guint16) (p[0] | (p[1] << 8)));
}

/* Element e of a row of `type`, read straight from the bytes. */
static double
element (GgufTensorType type, const guint8 *row, gint64 e)
{
  switch (type)
    {
    case GGUF_TENSOR_F32:
      {
        float x;
        memcpy (&x, row + 4 * e, 4);
        return x;
      }
    case GGUF_TENSOR_F16: return f16 (row + 2 * e);
    case GGUF_TENSOR_BF16:
      {
        guint32 bits = (guint32) (row[2 * e] | (row[2 * e + 1] << 8)) << 16;
        float x;
        memcpy (&x, &bits, 4);
        return x;
      }
    case GGUF_TENSOR_Q8_0:
      {
        const guint8 *b = row + 34 * (e / 32);
        return (double) f16 (b) * (gint8) b[2 + e % 32];
      }
    case GGUF_TENSOR_Q4_0:
      {
        const guint8 *b = row + 18 * (e / 32);
        int l = (int) (e % 32);
        int nib = l < 16 ? b[2 + l] & 15 : b[2 + l - 16] >> 4;
        return (double) f16 (b) * (nib - 8);
      }
    case GGUF_TENSOR_Q4_K:
      {
        /* d, dmin, 12 bytes of 6-bit (scale, min) pairs, 128 bytes of nibbles. */
        const guint8 *b = row + 144 * (e / 256), *s = b + 4, *qs = b + 16;
        int k = (int) (e % 256), j = k / 32, p = k % 64;
        int byte = qs[32 * (k / 64) + p % 32];
        int q = p < 32 ? byte & 15 : byte >> 4;
        int sc, m;
        if (j < 4)
          {
            sc = s[j] & 0x3f;
            m = s[4 + j] & 0x3f;
          }
        else
          {
            sc = (s[8 + j - 4] & 0x0f) + 16 * (s[j - 4] >> 6);
            m = (s[8 + j - 4] >> 4) + 16 * (s[j] >> 6);
          }
        return (double) f16 (b) * sc * q - (double) f16 (b + 2) * m;
      }
    case GGUF_TENSOR_Q6_K:
      {
        /* ql[128], qh[64], scales[16] (int8), d. */
        const guint8 *b = row + 210 * (e / 256);
        int k = (int) (e % 256), h = k / 128, p = k % 128, r = p / 32, l = p % 32;
        int lo_byte = b[64 * h + 32 * (r % 2) + l];
        int low = r < 2 ? lo_byte & 15 : lo_byte >> 4;
        int high = (b[128 + 32 * h + l] >> (2 * r)) & 3;
        return (double) f16 (b + 208) * (gint8) b[192 + k / 16] * ((low | (high << 4)) - 32);
      }
    default:
      g_assert_not_reached ();
    }
}

static guint8 *
quantized (GgufTensorType type, const float *x, gint64 rows, gint64 n, gsize *row_bytes)
{
  *row_bytes = (gsize) (n / gguf_tensor_type_block (type)) * gguf_tensor_type_block_bytes (type);
  guint8 *q = g_malloc (*row_bytes * (gsize) rows);
  for (gint64 r = 0; r < rows; r++)
    gguf_quantize_row (type, x + r * n, q + (gsize) r * *row_bytes, n);
  return q;
}

static void
test_dequantize (void **state)
{
  (void) state;
  GRand *r = g_rand_new_with_seed (11);
  const gint64 n = 1024;
  g_autofree float *x = g_new (float, n), *y = g_new (float, n);
  g_autofree double *ref = g_new (double, n);
  for (gsize t = 0; t < G_N_ELEMENTS (types); t++)
    for (int trial = 0; trial < 4; trial++)
      {
        randn (r, x, n, trial == 3 ? 1e-3 : 1.0);
        if (trial == 2)
          for (gint64 i = 0; i < n; i += 3)
            x[i] = fabsf (x[i]) + 0.5f; /* skewed sub-blocks: Q4_K's mins at work */
        gsize rb;
        g_autofree guint8 *q = quantized (types[t], x, 1, n, &rb);
        llama_dequantize_row (types[t], q, y, n);
        double xref[1024];
        for (gint64 i = 0; i < n; i++)
          {
            ref[i] = element (types[t], q, i);
            xref[i] = x[i];
            if (fabs (y[i] - ref[i]) > 1e-6 * fabs (ref[i]) + 1e-12)
              fail_msg ("%s element %" G_GINT64_FORMAT ": %g vs per-element %g",
                        gguf_tensor_type_name (types[t]), i, y[i], ref[i]);
          }
        /* The writer's quantiser and this layout agree: the round trip is close. */
        double limit = types[t] == GGUF_TENSOR_F32 ? 0 : types[t] == GGUF_TENSOR_Q4_0 || types[t] == GGUF_TENSOR_Q4_K ? 2e-2 : 1e-3;
        double e = nmse (y, xref, n);
        if (e > limit)
          fail_msg ("%s round trip NMSE %g > %g (trial %d)", gguf_tensor_type_name (types[t]), e, limit, trial);
      }
  g_rand_free (r);
}

/* Every ISA's kernels against the scalar ones and those against f64: 37 rows
 * (two AMX panels, register tiles of 4 and one row left for the dot) by n_tok
 * tokens (5: tiles and dots only; 37: panels of 16 tokens, the last padded;
 * n_in 2304: a Q4_K panel's two passes). */
static void
check_matmul (gint64 n_in, gint64 n_tok)
{
  GRand *r = g_rand_new_with_seed (12);
  const gint64 n_out = 37;
  g_autofree float *w = g_new (float, n_in * n_out), *x = g_new (float, n_in * n_tok);
  g_autofree float *y = g_new (float, n_out * n_tok), *ys = g_new (float, n_out * n_tok);
  g_autofree double *ref = g_new (double, n_out * n_tok);
  randn (r, w, (gsize) (n_in * n_out), 0.05);
  randn (r, x, (gsize) (n_in * n_tok), 1.0);
  for (gsize t = 0; t < G_N_ELEMENTS (types); t++)
    {
      gint64 nin = types[t] == GGUF_TENSOR_F32 || types[t] == GGUF_TENSOR_F16 ? n_in - 3 : n_in; /* a ragged tail */
      if (types[t] == GGUF_TENSOR_Q4_K || types[t] == GGUF_TENSOR_Q6_K || types[t] == GGUF_TENSOR_BF16)
        nin = n_in;
      gsize rb;
      g_autofree guint8 *q = quantized (types[t], w, n_out, nin, &rb);
      g_autofree float *xs = g_new (float, nin * n_tok);
      for (gint64 k = 0; k < n_tok; k++)
        memcpy (xs + k * nin, x + k * n_in, (gsize) nin * sizeof (float));
      for (gint64 k = 0; k < n_tok; k++)
        for (gint64 o = 0; o < n_out; o++)
          {
            double s = 0;
            for (gint64 i = 0; i < nin; i++)
              s += element (types[t], q + (gsize) o * rb, i) * xs[k * nin + i];
            ref[k * n_out + o] = s;
          }
      LlamaMat m;
      llama_mat_init (&m, types[t], nin, n_out, q);
      llama_matmul_with (&llama_matmul_scalar, &m, xs, ys, n_tok);
      gboolean quant = !(types[t] == GGUF_TENSOR_F32 || types[t] == GGUF_TENSOR_F16 || types[t] == GGUF_TENSOR_BF16);
      /* 8-bit activations cost ~1e-5 of NMSE; float weights are exact up to rounding. */
      double e = nmse (ys, ref, (gsize) (n_out * n_tok));
      if (e > (quant ? 1e-4 : 1e-10))
        fail_msg ("%s scalar vs f64: NMSE %g", gguf_tensor_type_name (types[t]), e);
      const LlamaMatmulKernels *ks[] = {
        llama_matmul_kernels_get (SIFT_ISA_AVX2),
#ifdef SIFT_HAVE_AVX512
        __builtin_cpu_supports ("avx512vnni") ? &llama_matmul_avx512 : NULL,
#endif
        llama_matmul_kernels_get (SIFT_ISA_AVX512), /* with AMX panels where usable */
      };
      for (gsize i_k = 0; i_k < G_N_ELEMENTS (ks); i_k++)
        {
          const LlamaMatmulKernels *k = ks[i_k];
          if (k == NULL)
            continue;
          llama_matmul_with (k, &m, xs, y, n_tok);
          double ek = nmse_f (y, ys, (gsize) (n_out * n_tok));
          if (ek > 1e-11)
            fail_msg ("%s %s vs scalar: NMSE %g", gguf_tensor_type_name (types[t]), k->name, ek);
        }
    }
  g_rand_free (r);
}

/* The x16 layout (Q8_0, Q4_K, Q6_K; 48 rows: three groups): every row reads back
 * as the row layout's, and every table's products on it (the scalar x16
 * kernels, the AVX-512 ones, the AMX panels) match the scalar dots on the
 * rows in order; q, k, v shared out in one loop match three products. */
static void
check_x16 (gint64 n_in, gint64 n_tok)
{
  GRand *r = g_rand_new_with_seed (13);
  const gint64 n_out = 48;
  g_autofree float *w = g_new (float, n_in * n_out), *x = g_new (float, n_in * n_tok);
  g_autofree float *y = g_new (float, n_out * n_tok), *ys = g_new (float, n_out * n_tok);
  g_autofree float *row = g_new (float, n_in), *row_x16 = g_new (float, n_in);
  randn (r, w, (gsize) (n_in * n_out), 0.05);
  for (gint64 i = 0; i < n_in * n_out; i += 5)
    w[i] = fabsf (w[i]) + 0.02f; /* skewed sub-blocks: Q4_K's mins at work */
  randn (r, x, (gsize) (n_in * n_tok), 1.0);
  const GgufTensorType x16_types[] = { GGUF_TENSOR_Q8_0, GGUF_TENSOR_Q4_K, GGUF_TENSOR_Q6_K };
  for (gsize t = 0; t < G_N_ELEMENTS (x16_types); t++)
    {
      gsize rb;
      g_autofree guint8 *q = quantized (x16_types[t], w, n_out, n_in, &rb);
      g_autofree guint8 *packed = g_malloc (rb * (gsize) n_out);
      LlamaMat m, mx;
      llama_mat_init (&m, x16_types[t], n_in, n_out, q);
      llama_mat_repack_groups (&m, 0, n_out / LLAMA_X16, packed);
      mx = m;
      mx.data = packed;
      mx.x16 = TRUE;
      for (gint64 o = 0; o < n_out; o++)
        {
          llama_mat_row (&m, o, row);
          llama_mat_row (&mx, o, row_x16);
          if (memcmp (row, row_x16, (gsize) n_in * sizeof (float)) != 0)
            fail_msg ("%s x16 row %" G_GINT64_FORMAT " differs from the row layout's", gguf_tensor_type_name (x16_types[t]), o);
        }
      llama_matmul_with (&llama_matmul_scalar, &m, x, ys, n_tok);
      const LlamaMatmulKernels *ks[] = {
        &llama_matmul_scalar,
        llama_matmul_kernels_get (SIFT_ISA_AVX2), /* no x16 kernels: the scalar ones */
#ifdef SIFT_HAVE_AVX512
        __builtin_cpu_supports ("avx512vnni") ? &llama_matmul_avx512 : NULL,
#endif
        llama_matmul_kernels_get (SIFT_ISA_AVX512), /* with AMX panels where usable */
      };
      for (gsize i_k = 0; i_k < G_N_ELEMENTS (ks); i_k++)
        {
          const LlamaMatmulKernels *k = ks[i_k];
          if (k == NULL)
            continue;
          llama_matmul_with (k, &mx, x, y, n_tok);
          double ek = nmse_f (y, ys, (gsize) (n_out * n_tok));
          if (ek > 1e-11)
            fail_msg ("%s x16 %s vs scalar rows: NMSE %g (%" G_GINT64_FORMAT " tokens)",
                      gguf_tensor_type_name (x16_types[t]), k->name, ek, n_tok);
          /* Three matrices (the last one of 16 rows) in one loop. */
          LlamaMat small = mx;
          small.n_out = 16;
          const LlamaMat *three[] = { &mx, &mx, &small };
          g_autofree float *y1 = g_new (float, n_out * n_tok), *y2 = g_new (float, n_out * n_tok);
          g_autofree float *y3 = g_new (float, 16 * n_tok);
          float *outs[] = { y1, y2, y3 };
          llama_matmul_multi_with (k, three, outs, 3, x, n_tok);
          for (gint64 tk = 0; tk < n_tok; tk++)
            for (gint64 o = 0; o < n_out; o++)
              if (y1[tk * n_out + o] != y[tk * n_out + o] || y2[tk * n_out + o] != y[tk * n_out + o]
                  || (o < 16 && y3[tk * 16 + o] != y[tk * n_out + o]))
                fail_msg ("%s %s: the fused product differs at token %" G_GINT64_FORMAT " row %" G_GINT64_FORMAT,
                          gguf_tensor_type_name (x16_types[t]), k->name, tk, o);
        }
    }
  g_rand_free (r);
}

static void
test_x16 (void **state)
{
  (void) state;
  check_x16 (512, 1);  /* decode */
  check_x16 (768, 7);  /* x16 kernels of 4 tokens and 3 */
  check_x16 (2304, 37); /* AMX panels, the last tile padded */
}

static void
test_matmul_few_tokens (void **state)
{
  (void) state;
  check_matmul (768, 5);
}

static void
test_matmul_many_tokens (void **state)
{
  (void) state;
  check_matmul (2304, 37);
}

int
main (void)
{
  sift_parallel_set_n_threads (2);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_dequantize),
    cmocka_unit_test (test_matmul_few_tokens),
    cmocka_unit_test (test_matmul_many_tokens),
    cmocka_unit_test (test_x16),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
