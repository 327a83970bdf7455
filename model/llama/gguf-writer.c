/* GGUF writer and weight quantisers (tests and benches only). */
#include <math.h>
#include <string.h>

#include <sift/dtype.h>
#include <sift/error.h>

#include "gguf-writer.h"

typedef struct {
  char *name;
  GgufTensorType type;
  guint32 n_dims;
  guint64 dims[GGUF_MAX_DIMS];
  GBytes *data;
} PendingTensor;

struct _GgufWriter {
  guint32 version;
  guint32 alignment;
  guint64 n_kv;
  GByteArray *kv;      /* serialised key-value pairs */
  GArray *tensors;     /* PendingTensor */
};

void
gguf_put_u32 (GByteArray *b, guint32 v)
{
  guint8 bytes[4];
  for (int i = 0; i < 4; i++)
    bytes[i] = (guint8) (v >> (8 * i));
  g_byte_array_append (b, bytes, 4);
}

void
gguf_put_u64 (GByteArray *b, guint64 v)
{
  guint8 bytes[8];
  for (int i = 0; i < 8; i++)
    bytes[i] = (guint8) (v >> (8 * i));
  g_byte_array_append (b, bytes, 8);
}

void
gguf_put_string (GByteArray *b, const char *s)
{
  gsize len = strlen (s);
  gguf_put_u64 (b, len);
  g_byte_array_append (b, (const guint8 *) s, (guint) len);
}

static void
tensor_clear (gpointer p)
{
  PendingTensor *t = p;
  g_free (t->name);
  g_bytes_unref (t->data);
}

GgufWriter *
gguf_writer_new (guint32 version, guint32 alignment)
{
  GgufWriter *w = g_new0 (GgufWriter, 1);
  w->version = version;
  w->alignment = alignment;
  w->kv = g_byte_array_new ();
  w->tensors = g_array_new (FALSE, TRUE, sizeof (PendingTensor));
  g_array_set_clear_func (w->tensors, tensor_clear);
  if (alignment != GGUF_DEFAULT_ALIGNMENT)
    gguf_writer_add_u32 (w, "general.alignment", alignment);
  return w;
}

void
gguf_writer_free (GgufWriter *w)
{
  if (w == NULL)
    return;
  g_byte_array_unref (w->kv);
  g_array_unref (w->tensors);
  g_free (w);
}

void
gguf_writer_add_raw (GgufWriter *w, const char *key, GgufType type, const void *bytes, gsize len)
{
  gguf_put_string (w->kv, key);
  gguf_put_u32 (w->kv, type);
  g_byte_array_append (w->kv, bytes, (guint) len);
  w->n_kv++;
}

static void
add_scalar (GgufWriter *w, const char *key, GgufType type, guint64 bits, guint size)
{
  guint8 bytes[8];
  for (guint i = 0; i < size; i++)
    bytes[i] = (guint8) (bits >> (8 * i));
  gguf_writer_add_raw (w, key, type, bytes, size);
}

void gguf_writer_add_u32 (GgufWriter *w, const char *key, guint32 v) { add_scalar (w, key, GGUF_TYPE_UINT32, v, 4); }
void gguf_writer_add_i32 (GgufWriter *w, const char *key, gint32 v) { add_scalar (w, key, GGUF_TYPE_INT32, (guint32) v, 4); }
void gguf_writer_add_u64 (GgufWriter *w, const char *key, guint64 v) { add_scalar (w, key, GGUF_TYPE_UINT64, v, 8); }
void gguf_writer_add_bool (GgufWriter *w, const char *key, gboolean v) { add_scalar (w, key, GGUF_TYPE_BOOL, v ? 1 : 0, 1); }

void
gguf_writer_add_f32 (GgufWriter *w, const char *key, float v)
{
  guint32 bits;
  memcpy (&bits, &v, 4);
  add_scalar (w, key, GGUF_TYPE_FLOAT32, bits, 4);
}

void
gguf_writer_add_string (GgufWriter *w, const char *key, const char *s)
{
  g_autoptr (GByteArray) b = g_byte_array_new ();
  gguf_put_string (b, s);
  gguf_writer_add_raw (w, key, GGUF_TYPE_STRING, b->data, b->len);
}

void
gguf_writer_add_array (GgufWriter *w, const char *key, GgufType elem_type, guint64 n, const void *elems)
{
  static const guint sizes[GGUF_TYPE_COUNT] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
  g_return_if_fail (elem_type < GGUF_TYPE_COUNT && sizes[elem_type] > 0);
  g_autoptr (GByteArray) b = g_byte_array_new ();
  gguf_put_u32 (b, elem_type);
  gguf_put_u64 (b, n);
  /* Host order is little-endian on every machine sift builds for. */
  g_byte_array_append (b, elems, (guint) (n * sizes[elem_type]));
  gguf_writer_add_raw (w, key, GGUF_TYPE_ARRAY, b->data, b->len);
}

void
gguf_writer_add_string_array (GgufWriter *w, const char *key, guint64 n, const char *const *strs)
{
  g_autoptr (GByteArray) b = g_byte_array_new ();
  gguf_put_u32 (b, GGUF_TYPE_STRING);
  gguf_put_u64 (b, n);
  for (guint64 i = 0; i < n; i++)
    gguf_put_string (b, strs[i]);
  gguf_writer_add_raw (w, key, GGUF_TYPE_ARRAY, b->data, b->len);
}

void
gguf_writer_add_tensor (GgufWriter *w, const char *name, GgufTensorType type,
                        guint32 n_dims, const guint64 *dims, const void *data, gsize n_bytes)
{
  g_return_if_fail (n_dims >= 1 && n_dims <= GGUF_MAX_DIMS);
  PendingTensor t = { g_strdup (name), type, n_dims, { 1, 1, 1, 1 }, g_bytes_new (data, n_bytes) };
  memcpy (t.dims, dims, n_dims * sizeof (guint64));
  g_array_append_val (w->tensors, t);
}

void
gguf_writer_add_tensor_f32 (GgufWriter *w, const char *name, GgufTensorType type,
                            guint32 n_dims, const guint64 *dims, const float *x)
{
  guint64 n = 1;
  for (guint32 d = 0; d < n_dims; d++)
    n *= dims[d];
  guint32 block = gguf_tensor_type_block (type);
  g_return_if_fail (block > 0 && dims[0] % block == 0);
  gsize row_bytes = dims[0] / block * gguf_tensor_type_block_bytes (type);
  gsize rows = n / dims[0];
  g_autofree guint8 *buf = g_malloc (rows * row_bytes);
  for (gsize r = 0; r < rows; r++)
    gguf_quantize_row (type, x + r * dims[0], buf + r * row_bytes, dims[0]);
  gguf_writer_add_tensor (w, name, type, n_dims, dims, buf, rows * row_bytes);
}

static guint64
align_up (guint64 x, guint32 a)
{
  return (x + a - 1) / a * a;
}

GBytes *
gguf_writer_to_bytes (GgufWriter *w)
{
  GByteArray *b = g_byte_array_new ();
  g_byte_array_append (b, (const guint8 *) "GGUF", 4);
  gguf_put_u32 (b, w->version);
  gguf_put_u64 (b, w->tensors->len);
  gguf_put_u64 (b, w->n_kv);
  g_byte_array_append (b, w->kv->data, w->kv->len);
  guint64 offset = 0;
  for (guint i = 0; i < w->tensors->len; i++)
    {
      PendingTensor *t = &g_array_index (w->tensors, PendingTensor, i);
      gguf_put_string (b, t->name);
      gguf_put_u32 (b, t->n_dims);
      for (guint32 d = 0; d < t->n_dims; d++)
        gguf_put_u64 (b, t->dims[d]);
      gguf_put_u32 (b, t->type);
      gguf_put_u64 (b, offset);
      offset = align_up (offset + g_bytes_get_size (t->data), w->alignment);
    }
  /* The header's padding is zeros (set_size leaves new bytes as they were). */
  const guint header = b->len;
  g_byte_array_set_size (b, (guint) align_up (b->len, w->alignment));
  memset (b->data + header, 0, b->len - header);
  for (guint i = 0; i < w->tensors->len; i++)
    {
      PendingTensor *t = &g_array_index (w->tensors, PendingTensor, i);
      gsize size;
      const guint8 *data = g_bytes_get_data (t->data, &size);
      g_byte_array_append (b, data, (guint) size);
      guint pad = (guint) (align_up (b->len, w->alignment) - b->len);
      guint8 zeros[256] = { 0 };
      while (pad > 0)
        {
          guint k = MIN (pad, sizeof zeros);
          g_byte_array_append (b, zeros, k);
          pad -= k;
        }
    }
  return g_byte_array_free_to_bytes (b);
}

gboolean
gguf_writer_write (GgufWriter *w, const char *path, GError **error)
{
  g_autoptr (GBytes) bytes = gguf_writer_to_bytes (w);
  gsize size;
  const char *data = g_bytes_get_data (bytes, &size);
  GError *local = NULL;
  if (!g_file_set_contents (path, data, (gssize) size, &local))
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_IO, "%s", local->message);
      g_error_free (local);
      return FALSE;
    }
  return TRUE;
}

/* ---- quantisers: simple round-to-nearest, not llama.cpp's error-minimising search ---- */

static int
clampi (int x, int lo, int hi)
{
  return x < lo ? lo : x > hi ? hi : x;
}

static void
quantize_q4_0 (const float *x, guint8 *dst, gsize n)
{
  for (gsize b = 0; b < n / 32; b++, x += 32, dst += 18)
    {
      /* The value of largest magnitude maps to -8, so its sign sets d's. */
      float max = 0;
      for (int i = 0; i < 32; i++)
        if (fabsf (x[i]) > fabsf (max))
          max = x[i];
      guint16 dh = sift_f32_to_f16 (max / -8.0f);
      float d = sift_f16_to_f32 (dh);
      memcpy (dst, &dh, 2);
      for (int i = 0; i < 16; i++)
        {
          int lo = d != 0 ? clampi ((int) lrintf (x[i] / d) + 8, 0, 15) : 8;
          int hi = d != 0 ? clampi ((int) lrintf (x[i + 16] / d) + 8, 0, 15) : 8;
          dst[2 + i] = (guint8) (lo | (hi << 4));
        }
    }
}

static void
quantize_q4_k (const float *x, guint8 *dst, gsize n)
{
  for (gsize b = 0; b < n / 256; b++, x += 256, dst += 144)
    {
      float scale[8], min[8], max_scale = 0, max_min = 0;
      for (int j = 0; j < 8; j++)
        {
          float lo = 0, hi = 0; /* the range always holds 0, so min >= 0 */
          for (int i = 0; i < 32; i++)
            {
              lo = fminf (lo, x[32 * j + i]);
              hi = fmaxf (hi, x[32 * j + i]);
            }
          scale[j] = (hi - lo) / 15.0f;
          min[j] = -lo;
          max_scale = fmaxf (max_scale, scale[j]);
          max_min = fmaxf (max_min, min[j]);
        }
      guint16 dh = sift_f32_to_f16 (max_scale / 63.0f), mh = sift_f32_to_f16 (max_min / 63.0f);
      float d = sift_f16_to_f32 (dh), dmin = sift_f16_to_f32 (mh);
      memcpy (dst, &dh, 2);
      memcpy (dst + 2, &mh, 2);
      guint8 *sc = dst + 4, *qs = dst + 16;
      memset (sc, 0, 12);
      guint8 q[256];
      for (int j = 0; j < 8; j++)
        {
          int ls = d > 0 ? clampi ((int) lrintf (scale[j] / d), 0, 63) : 0;
          int lm = dmin > 0 ? clampi ((int) lrintf (min[j] / dmin), 0, 63) : 0;
          /* 6-bit scales and mins: j < 4 in the low 6 bits of bytes j and
           * j + 4; j >= 4 split into a nibble of byte j + 4 and the top two
           * bits of bytes j - 4 (scale) and j (min). */
          if (j < 4)
            {
              sc[j] |= (guint8) ls;
              sc[j + 4] |= (guint8) lm;
            }
          else
            {
              sc[j + 4] |= (guint8) ((ls & 0xf) | ((lm & 0xf) << 4));
              sc[j - 4] |= (guint8) ((ls >> 4) << 6);
              sc[j] |= (guint8) ((lm >> 4) << 6);
            }
          float ds = d * ls, dm = dmin * lm;
          for (int i = 0; i < 32; i++)
            q[32 * j + i] = (guint8) (ds > 0 ? clampi ((int) lrintf ((x[32 * j + i] + dm) / ds), 0, 15) : 0);
        }
      /* Each 64 elements: the first 32 in the low nibbles of 32 bytes, the next 32 in the high. */
      for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
          qs[32 * c + l] = (guint8) (q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}

static void
quantize_q6_k (const float *x, guint8 *dst, gsize n)
{
  for (gsize b = 0; b < n / 256; b++, x += 256, dst += 210)
    {
      float scale[16], max_scale = 0;
      for (int j = 0; j < 16; j++)
        {
          float amax = 0;
          for (int i = 0; i < 16; i++)
            amax = fmaxf (amax, fabsf (x[16 * j + i]));
          scale[j] = amax / 31.0f;
          max_scale = fmaxf (max_scale, scale[j]);
        }
      guint16 dh = sift_f32_to_f16 (max_scale / 127.0f);
      float d = sift_f16_to_f32 (dh);
      guint8 *ql = dst, *qh = dst + 128;
      gint8 *sc = (gint8 *) (dst + 192);
      memcpy (dst + 208, &dh, 2);
      guint8 q[256];
      for (int j = 0; j < 16; j++)
        {
          sc[j] = (gint8) (d > 0 ? clampi ((int) lrintf (scale[j] / d), 0, 127) : 0);
          float ds = d * sc[j];
          for (int i = 0; i < 16; i++)
            q[16 * j + i] = (guint8) (ds > 0 ? clampi ((int) lrintf (x[16 * j + i] / ds), -32, 31) + 32 : 32);
        }
      /* Each 128 elements: 4 runs of 32; low nibbles of runs 0/2 and 1/3
       * share 64 bytes of ql, the 2-bit high parts of all four one byte of qh. */
      for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++)
          {
            const guint8 *r = q + 128 * h + l;
            ql[64 * h + l] = (guint8) ((r[0] & 0xf) | ((r[64] & 0xf) << 4));
            ql[64 * h + 32 + l] = (guint8) ((r[32] & 0xf) | ((r[96] & 0xf) << 4));
            qh[32 * h + l] = (guint8) ((r[0] >> 4) | ((r[32] >> 4) << 2) | ((r[64] >> 4) << 4) | ((r[96] >> 4) << 6));
          }
    }
}

void
gguf_quantize_row (GgufTensorType type, const float *x, void *dst, gsize n)
{
  switch (type)
    {
    case GGUF_TENSOR_F32:
      memcpy (dst, x, n * sizeof (float));
      break;
    case GGUF_TENSOR_F16:
      sift_convert (x, SIFT_DTYPE_F32, dst, SIFT_DTYPE_F16, n);
      break;
    case GGUF_TENSOR_BF16:
      sift_convert (x, SIFT_DTYPE_F32, dst, SIFT_DTYPE_BF16, n);
      break;
    case GGUF_TENSOR_Q8_0: /* core's q8_0 is ggml's block layout */
      sift_convert (x, SIFT_DTYPE_F32, dst, SIFT_DTYPE_Q8_0, n);
      break;
    case GGUF_TENSOR_Q4_0: quantize_q4_0 (x, dst, n); break;
    case GGUF_TENSOR_Q4_K: quantize_q4_k (x, dst, n); break;
    case GGUF_TENSOR_Q6_K: quantize_q6_k (x, dst, n); break;
    default: g_return_if_reached ();
    }
}
