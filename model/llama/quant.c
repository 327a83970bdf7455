/* Dequantisation and activation quantisation, scalar. */
#include <math.h>
#include <string.h>

#include <sift/dtype.h>

#include "quant.h"

gboolean
llama_type_supported (GgufTensorType type)
{
  switch (type)
    {
    case GGUF_TENSOR_F32: case GGUF_TENSOR_F16: case GGUF_TENSOR_BF16:
    case GGUF_TENSOR_Q8_0: case GGUF_TENSOR_Q4_0: case GGUF_TENSOR_Q4_K: case GGUF_TENSOR_Q6_K:
      return TRUE;
    default:
      return FALSE;
    }
}

void
llama_q4_k_scale_min (const guint8 *s, int j, guint8 *sc, guint8 *m)
{
  if (j < 4)
    {
      *sc = s[j] & 63;
      *m = s[j + 4] & 63;
    }
  else
    {
      *sc = (guint8) ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
      *m = (guint8) ((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static void
dequantize_q8_0 (const BlockQ8_0 *b, float *y, gint64 n)
{
  for (gint64 i = 0; i < n / QK; i++, b++, y += QK)
    {
      float d = sift_f16_to_f32 (b->d);
      for (int l = 0; l < QK; l++)
        y[l] = d * b->qs[l];
    }
}

static void
dequantize_q4_0 (const BlockQ4_0 *b, float *y, gint64 n)
{
  for (gint64 i = 0; i < n / QK; i++, b++, y += QK)
    {
      float d = sift_f16_to_f32 (b->d);
      for (int l = 0; l < QK / 2; l++)
        {
          y[l] = d * ((b->qs[l] & 15) - 8);
          y[l + QK / 2] = d * ((b->qs[l] >> 4) - 8);
        }
    }
}

static void
dequantize_q4_k (const BlockQ4_K *b, float *y, gint64 n)
{
  for (gint64 i = 0; i < n / QK_K; i++, b++)
    {
      float d = sift_f16_to_f32 (b->d), dmin = sift_f16_to_f32 (b->dmin);
      const guint8 *q = b->qs;
      for (int c = 0; c < 4; c++, q += 32, y += 64)
        {
          guint8 sc0, m0, sc1, m1;
          llama_q4_k_scale_min (b->scales, 2 * c, &sc0, &m0);
          llama_q4_k_scale_min (b->scales, 2 * c + 1, &sc1, &m1);
          for (int l = 0; l < 32; l++)
            {
              y[l] = d * sc0 * (q[l] & 15) - dmin * m0;
              y[l + 32] = d * sc1 * (q[l] >> 4) - dmin * m1;
            }
        }
    }
}

static void
dequantize_q6_k (const BlockQ6_K *b, float *y, gint64 n)
{
  for (gint64 i = 0; i < n / QK_K; i++, b++)
    {
      float d = sift_f16_to_f32 (b->d);
      /* Each half of 128: four runs of 32 (y[l], y[l+32], y[l+64], y[l+96]);
       * ql[l] holds runs 0 and 2 (low, high nibble), ql[l+32] runs 1 and 3,
       * qh[l] the top two bits of all four. */
      for (int h = 0; h < 2; h++, y += 128)
        {
          const guint8 *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
          const gint8 *sc = b->scales + 8 * h;
          for (int l = 0; l < 32; l++)
            {
              int is = l / 16;
              int q0 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
              int q1 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
              int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
              int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
              y[l] = d * sc[is] * q0;
              y[l + 32] = d * sc[is + 2] * q1;
              y[l + 64] = d * sc[is + 4] * q2;
              y[l + 96] = d * sc[is + 6] * q3;
            }
        }
    }
}

void
llama_dequantize_row (GgufTensorType type, const void *src, float *dst, gint64 n)
{
  switch (type)
    {
    case GGUF_TENSOR_F32: memcpy (dst, src, (gsize) n * sizeof (float)); break;
    case GGUF_TENSOR_F16: sift_convert (src, SIFT_DTYPE_F16, dst, SIFT_DTYPE_F32, (gsize) n); break;
    case GGUF_TENSOR_BF16: sift_convert (src, SIFT_DTYPE_BF16, dst, SIFT_DTYPE_F32, (gsize) n); break;
    case GGUF_TENSOR_Q8_0: dequantize_q8_0 (src, dst, n); break;
    case GGUF_TENSOR_Q4_0: dequantize_q4_0 (src, dst, n); break;
    case GGUF_TENSOR_Q4_K: dequantize_q4_k (src, dst, n); break;
    case GGUF_TENSOR_Q6_K: dequantize_q6_k (src, dst, n); break;
    default: g_assert_not_reached ();
    }
}

/* d = max|x| / 127, q = round (x / d): the symmetric 8-bit code of a block. */
static float
quantize_block (const float *x, gint8 *q, int n)
{
  float amax = 0;
  for (int i = 0; i < n; i++)
    amax = fmaxf (amax, fabsf (x[i]));
  float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
  for (int i = 0; i < n; i++)
    q[i] = (gint8) lrintf (x[i] * id);
  return d;
}

void
llama_quantize_act_q8 (const float *x, ActQ8 *dst, gint64 n)
{
  for (gint64 b = 0; b < n / QK; b++, x += QK, dst++)
    {
      dst->d = quantize_block (x, dst->qs, QK);
      dst->sum = 0;
      for (int i = 0; i < QK; i++)
        dst->sum += dst->qs[i];
    }
}

void
llama_quantize_act_q8k (const float *x, ActQ8K *dst, gint64 n)
{
  for (gint64 b = 0; b < n / QK_K; b++, x += QK_K, dst++)
    {
      dst->d = quantize_block (x, dst->qs, QK_K);
      for (int j = 0; j < QK_K / 16; j++)
        {
          int s = 0;
          for (int i = 0; i < 16; i++)
            s += dst->qs[16 * j + i];
          dst->bsums[j] = (gint16) s;
        }
    }
}
