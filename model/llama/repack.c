/* The x16 layouts (repack.h): repacking, rows back to f32, scalar products. */
#include <string.h>

#include <sift/dtype.h>

#include "repack.h"

gboolean
llama_x16_type (GgufTensorType type)
{
  return type == GGUF_TENSOR_Q8_0 || type == GGUF_TENSOR_Q4_K || type == GGUF_TENSOR_Q6_K;
}

/* The 6-bit code (0..63) of element e (0..255) of a Q6_K x16 block's row r. */
static int
q6_k_code (const BlockQ6_Kx16 *b, int r, int e)
{
  int h = e / 128, k = e % 128, quarter = k / 32, l = k % 32;
  guint8 lo = b->ql[h][quarter % 2][l / 4][r][l % 4];
  int low = quarter < 2 ? lo & 15 : lo >> 4;
  int high = (b->qh[h][l / 4][r][l % 4] >> (2 * quarter)) & 3;
  return low | (high << 4);
}

void
llama_x16_repack (GgufTensorType type, const guint8 *rows, gsize row_bytes, gint64 n_in, guint8 *dst)
{
  g_assert (llama_x16_type (type));
  if (type == GGUF_TENSOR_Q8_0)
    {
      BlockQ8_0x16 *o = (BlockQ8_0x16 *) dst;
      for (gint64 b = 0; b < n_in / QK; b++, o++)
        for (int r = 0; r < 16; r++)
          {
            const BlockQ8_0 *s = (const BlockQ8_0 *) (rows + r * row_bytes) + b;
            o->d[r] = s->d;
            for (int g = 0; g < QK / 4; g++)
              memcpy (o->qs[g][r], s->qs + 4 * g, 4);
          }
      return;
    }
  if (type == GGUF_TENSOR_Q6_K)
    {
      BlockQ6_Kx16 *o = (BlockQ6_Kx16 *) dst;
      for (gint64 b = 0; b < n_in / QK_K; b++, o++)
        for (int r = 0; r < 16; r++)
          {
            const BlockQ6_K *s = (const BlockQ6_K *) (rows + r * row_bytes) + b;
            o->d[r] = s->d;
            for (int j = 0; j < 16; j++)
              o->scales[j][r] = s->scales[j];
            for (int h = 0; h < 2; h++)
              for (int g = 0; g < QK / 4; g++)
                {
                  memcpy (o->ql[h][0][g][r], s->ql + 64 * h + 4 * g, 4);
                  memcpy (o->ql[h][1][g][r], s->ql + 64 * h + 32 + 4 * g, 4);
                  memcpy (o->qh[h][g][r], s->qh + 32 * h + 4 * g, 4);
                }
          }
      return;
    }
  BlockQ4_Kx16 *o = (BlockQ4_Kx16 *) dst;
  for (gint64 b = 0; b < n_in / QK_K; b++, o++)
    for (int r = 0; r < 16; r++)
      {
        const BlockQ4_K *s = (const BlockQ4_K *) (rows + r * row_bytes) + b;
        o->d[r] = s->d;
        o->dmin[r] = s->dmin;
        for (int k = 0; k < 12; k++)
          o->scales[k][r] = s->scales[k];
        /* s->qs[32 c + l]: element 64 c + l (low nibble), 64 c + 32 + l (high). */
        for (int c = 0; c < 4; c++)
          for (int g = 0; g < QK / 4; g++)
            memcpy (o->qs[c][g][r], s->qs + 32 * c + 4 * g, 4);
      }
}

void
llama_x16_q4_k_scales (const BlockQ4_Kx16 *b, guint8 sc[8][16], guint8 m[8][16])
{
  for (int r = 0; r < 16; r++)
    {
      guint8 s[12];
      for (int k = 0; k < 12; k++)
        s[k] = b->scales[k][r];
      for (int j = 0; j < 8; j++)
        llama_q4_k_scale_min (s, j, &sc[j][r], &m[j][r]);
    }
}

void
llama_x16_dequantize_row (GgufTensorType type, const guint8 *group, int lane, gint64 n_in, float *dst)
{
  g_assert (llama_x16_type (type) && lane >= 0 && lane < 16);
  if (type == GGUF_TENSOR_Q8_0)
    {
      const BlockQ8_0x16 *b = (const BlockQ8_0x16 *) group;
      for (gint64 i = 0; i < n_in / QK; i++, b++, dst += QK)
        {
          float d = sift_f16_to_f32 (b->d[lane]);
          for (int e = 0; e < QK; e++)
            dst[e] = d * b->qs[e / 4][lane][e % 4];
        }
      return;
    }
  if (type == GGUF_TENSOR_Q6_K)
    {
      const BlockQ6_Kx16 *b = (const BlockQ6_Kx16 *) group;
      for (gint64 i = 0; i < n_in / QK_K; i++, b++, dst += QK_K)
        {
          float d = sift_f16_to_f32 (b->d[lane]);
          for (int e = 0; e < QK_K; e++)
            dst[e] = d * b->scales[e / 16][lane] * (q6_k_code (b, lane, e) - 32);
        }
      return;
    }
  const BlockQ4_Kx16 *b = (const BlockQ4_Kx16 *) group;
  for (gint64 i = 0; i < n_in / QK_K; i++, b++, dst += QK_K)
    {
      guint8 sc[8][16], m[8][16];
      llama_x16_q4_k_scales (b, sc, m);
      float d = sift_f16_to_f32 (b->d[lane]), dmin = sift_f16_to_f32 (b->dmin[lane]);
      for (int e = 0; e < QK_K; e++)
        {
          int c = e / 64, l = e % 64, j = e / 32;
          guint8 byte = b->qs[c][(l % 32) / 4][lane][l % 4];
          int q = l < 32 ? byte & 15 : byte >> 4;
          dst[e] = d * sc[j][lane] * q - dmin * m[j][lane];
        }
    }
}

void
llama_x16_scalar_q8_0 (const guint8 *group, const guint8 *act, gsize act_stride, int nt, gint64 n, float *y, gsize ys)
{
  for (int t = 0; t < nt; t++)
    for (int r = 0; r < 16; r++)
      {
        const BlockQ8_0x16 *b = (const BlockQ8_0x16 *) group;
        const ActQ8 *x = (const ActQ8 *) (act + (gsize) t * act_stride);
        float s = 0;
        for (gint64 i = 0; i < n / QK; i++)
          {
            int sum = 0;
            for (int e = 0; e < QK; e++)
              sum += b[i].qs[e / 4][r][e % 4] * x[i].qs[e];
            s += sift_f16_to_f32 (b[i].d[r]) * x[i].d * (float) sum;
          }
        y[t * ys + r] = s;
      }
}

void
llama_x16_scalar_q4_k (const guint8 *group, const guint8 *act, gsize act_stride, int nt, gint64 n, float *y, gsize ys)
{
  for (int t = 0; t < nt; t++)
    for (int r = 0; r < 16; r++)
      {
        const BlockQ4_Kx16 *b = (const BlockQ4_Kx16 *) group;
        const ActQ8K *x = (const ActQ8K *) (act + (gsize) t * act_stride);
        float s = 0;
        for (gint64 i = 0; i < n / QK_K; i++)
          {
            guint8 sc[8][16], m[8][16];
            llama_x16_q4_k_scales (&b[i], sc, m);
            int sum_q = 0, sum_m = 0;
            for (int j = 0; j < 8; j++)
              {
                int dot = 0;
                for (int l = 0; l < 32; l++)
                  {
                    guint8 byte = b[i].qs[j / 2][l / 4][r][l % 4];
                    dot += (j % 2 == 0 ? byte & 15 : byte >> 4) * x[i].qs[32 * j + l];
                  }
                sum_q += sc[j][r] * dot;
                sum_m += m[j][r] * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
              }
            s += x[i].d * (sift_f16_to_f32 (b[i].d[r]) * (float) sum_q - sift_f16_to_f32 (b[i].dmin[r]) * (float) sum_m);
          }
        y[t * ys + r] = s;
      }
}

void
llama_x16_scalar_q6_k (const guint8 *group, const guint8 *act, gsize act_stride, int nt, gint64 n, float *y, gsize ys)
{
  for (int t = 0; t < nt; t++)
    for (int r = 0; r < 16; r++)
      {
        const BlockQ6_Kx16 *b = (const BlockQ6_Kx16 *) group;
        const ActQ8K *x = (const ActQ8K *) (act + (gsize) t * act_stride);
        float s = 0;
        for (gint64 i = 0; i < n / QK_K; i++)
          {
            /* The codes are q - 32: sum_j sc_j ((q.x)_j - 32 (sum x)_j). */
            int sum = 0;
            for (int j = 0; j < 16; j++)
              {
                int dot = 0;
                for (int l = 0; l < 16; l++)
                  dot += q6_k_code (&b[i], r, 16 * j + l) * x[i].qs[16 * j + l];
                sum += b[i].scales[j][r] * (dot - 32 * x[i].bsums[j]);
              }
            s += sift_f16_to_f32 (b[i].d[r]) * x[i].d * (float) sum;
          }
        y[t * ys + r] = s;
      }
}
