/* GGUF reader: parses the header of a mapped file, checking every length,
 * count and offset against the bytes that are there before using it. */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <sift/error.h>

#include "gguf.h"

/* Nested arrays deeper than this are refused (no real file nests more than
 * twice; the limit keeps a hostile file from exhausting the stack). */
#define MAX_DEPTH 8

struct _GgufFile {
  char *path;
  GMappedFile *mapped; /* NULL for gguf_open_bytes */
  const guint8 *base;
  gsize size;
  guint32 version;
  guint32 alignment;
  guint64 data_offset;
  guint64 n_kv;
  char **keys;          /* [n_kv] */
  GgufValue *values;    /* [n_kv] */
  GHashTable *by_key;   /* key -> GgufValue* */
  guint64 n_tensors;
  GgufTensor *tensors;  /* [n_tensors] */
  GHashTable *by_name;  /* name -> GgufTensor* */
  GStringChunk *strings;
  GPtrArray *allocs;    /* arrays of items, string tables */
};

typedef struct {
  const GgufFile *f;
  gsize pos;
} Cursor;

typedef struct {
  const char *name;
  guint32 block;
  guint32 bytes;
} TensorTypeInfo;

/* Elements and bytes per block, from ggml's block layouts. */
static const TensorTypeInfo tensor_types[GGUF_TENSOR_TYPE_COUNT] = {
  [GGUF_TENSOR_F32] = { "F32", 1, 4 },
  [GGUF_TENSOR_F16] = { "F16", 1, 2 },
  [GGUF_TENSOR_Q4_0] = { "Q4_0", 32, 18 },
  [GGUF_TENSOR_Q4_1] = { "Q4_1", 32, 20 },
  [GGUF_TENSOR_Q5_0] = { "Q5_0", 32, 22 },
  [GGUF_TENSOR_Q5_1] = { "Q5_1", 32, 24 },
  [GGUF_TENSOR_Q8_0] = { "Q8_0", 32, 34 },
  [GGUF_TENSOR_Q8_1] = { "Q8_1", 32, 36 },
  [GGUF_TENSOR_Q2_K] = { "Q2_K", 256, 84 },
  [GGUF_TENSOR_Q3_K] = { "Q3_K", 256, 110 },
  [GGUF_TENSOR_Q4_K] = { "Q4_K", 256, 144 },
  [GGUF_TENSOR_Q5_K] = { "Q5_K", 256, 176 },
  [GGUF_TENSOR_Q6_K] = { "Q6_K", 256, 210 },
  [GGUF_TENSOR_Q8_K] = { "Q8_K", 256, 292 },
  [GGUF_TENSOR_IQ2_XXS] = { "IQ2_XXS", 256, 66 },
  [GGUF_TENSOR_IQ2_XS] = { "IQ2_XS", 256, 74 },
  [GGUF_TENSOR_IQ3_XXS] = { "IQ3_XXS", 256, 98 },
  [GGUF_TENSOR_IQ1_S] = { "IQ1_S", 256, 50 },
  [GGUF_TENSOR_IQ4_NL] = { "IQ4_NL", 32, 18 },
  [GGUF_TENSOR_IQ3_S] = { "IQ3_S", 256, 110 },
  [GGUF_TENSOR_IQ2_S] = { "IQ2_S", 256, 82 },
  [GGUF_TENSOR_IQ4_XS] = { "IQ4_XS", 256, 136 },
  [GGUF_TENSOR_I8] = { "I8", 1, 1 },
  [GGUF_TENSOR_I16] = { "I16", 1, 2 },
  [GGUF_TENSOR_I32] = { "I32", 1, 4 },
  [GGUF_TENSOR_I64] = { "I64", 1, 8 },
  [GGUF_TENSOR_F64] = { "F64", 1, 8 },
  [GGUF_TENSOR_IQ1_M] = { "IQ1_M", 256, 56 },
  [GGUF_TENSOR_BF16] = { "BF16", 1, 2 },
};

static const char *const type_names[GGUF_TYPE_COUNT] = {
  "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
  "bool", "string", "array", "uint64", "int64", "float64",
};

/* Bytes of one element of a fixed-size type; 0 for string and array. */
static guint32
type_size (GgufType t)
{
  switch (t)
    {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

const char *
gguf_type_name (GgufType type)
{
  return (guint) type < GGUF_TYPE_COUNT ? type_names[type] : "invalid";
}

const char *
gguf_tensor_type_name (GgufTensorType type)
{
  return (guint) type < GGUF_TENSOR_TYPE_COUNT ? tensor_types[type].name : NULL;
}

guint32
gguf_tensor_type_block (GgufTensorType type)
{
  return (guint) type < GGUF_TENSOR_TYPE_COUNT ? tensor_types[type].block : 0;
}

guint32
gguf_tensor_type_block_bytes (GgufTensorType type)
{
  return (guint) type < GGUF_TENSOR_TYPE_COUNT ? tensor_types[type].bytes : 0;
}

/* ---- cursor over the header ---- */

static gboolean
need (Cursor *c, guint64 n, const char *what, GError **error)
{
  if (n <= c->f->size - c->pos)
    return TRUE;
  g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
               "%s: truncated header at offset %" G_GSIZE_FORMAT ": %s needs %" G_GUINT64_FORMAT
               " bytes, the file has %" G_GSIZE_FORMAT " left",
               c->f->path, c->pos, what, n, c->f->size - c->pos);
  return FALSE;
}

static guint64
load_le (const guint8 *p, guint32 size)
{
  guint64 v = 0;
  for (guint32 i = 0; i < size; i++)
    v |= (guint64) p[i] << (8 * i);
  return v;
}

static gboolean
read_u32 (Cursor *c, guint32 *out, const char *what, GError **error)
{
  if (!need (c, 4, what, error))
    return FALSE;
  *out = (guint32) load_le (c->f->base + c->pos, 4);
  c->pos += 4;
  return TRUE;
}

static gboolean
read_u64 (Cursor *c, guint64 *out, const char *what, GError **error)
{
  if (!need (c, 8, what, error))
    return FALSE;
  *out = load_le (c->f->base + c->pos, 8);
  c->pos += 8;
  return TRUE;
}

/* A string: u64 length, bytes. Stored NUL-terminated in the file's chunk. */
static gboolean
read_string (Cursor *c, GgufFile *f, const char **out, guint64 *len_out, const char *what, GError **error)
{
  guint64 len;
  if (!read_u64 (c, &len, what, error) || !need (c, len, what, error))
    return FALSE;
  *out = g_string_chunk_insert_len (f->strings, (const char *) f->base + c->pos, (gssize) len);
  if (len_out != NULL)
    *len_out = len;
  c->pos += len;
  return TRUE;
}

static gboolean read_value (Cursor *c, GgufFile *f, GgufType type, GgufValue *v, int depth,
                            const char *what, GError **error);

static gboolean
read_array (Cursor *c, GgufFile *f, GgufArray *a, int depth, const char *what, GError **error)
{
  guint64 at = c->pos;
  guint32 et;
  if (!read_u32 (c, &et, what, error) || !read_u64 (c, &a->n, what, error))
    return FALSE;
  if (et >= GGUF_TYPE_COUNT)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                   "%s: %s: unknown array element type %u at offset %" G_GUINT64_FORMAT,
                   f->path, what, et, at);
      return FALSE;
    }
  a->type = et;
  guint32 size = type_size (a->type);
  if (size > 0)
    {
      /* n * size without overflow: compare n with what is left. */
      if (!need (c, a->n > G_MAXUINT64 / size ? G_MAXUINT64 : a->n * size, what, error))
        return FALSE;
      a->data = f->base + c->pos;
      c->pos += a->n * size;
      return TRUE;
    }
  if (a->type == GGUF_TYPE_ARRAY && depth + 1 >= MAX_DEPTH)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                   "%s: %s: arrays nested deeper than %d at offset %" G_GUINT64_FORMAT,
                   f->path, what, MAX_DEPTH, at);
      return FALSE;
    }
  /* Each string takes at least 8 bytes, each nested array 12: a count the
   * file cannot hold fails here, before any allocation. */
  guint64 min_size = a->type == GGUF_TYPE_STRING ? 8 : 12;
  if (!need (c, a->n > G_MAXUINT64 / min_size ? G_MAXUINT64 : a->n * min_size, what, error))
    return FALSE;
  if (a->type == GGUF_TYPE_STRING)
    {
      const char **strings = g_new (const char *, a->n + 1);
      guint64 *lengths = g_new (guint64, a->n + 1);
      g_ptr_array_add (f->allocs, strings);
      g_ptr_array_add (f->allocs, lengths);
      for (guint64 i = 0; i < a->n; i++)
        if (!read_string (c, f, &strings[i], &lengths[i], what, error))
          return FALSE;
      strings[a->n] = NULL;
      a->strings = strings;
      a->lengths = lengths;
      return TRUE;
    }
  GgufValue *items = g_new0 (GgufValue, a->n + 1);
  g_ptr_array_add (f->allocs, items);
  for (guint64 i = 0; i < a->n; i++)
    if (!read_value (c, f, GGUF_TYPE_ARRAY, &items[i], depth + 1, what, error))
      return FALSE;
  a->items = items;
  return TRUE;
}

static gboolean
read_value (Cursor *c, GgufFile *f, GgufType type, GgufValue *v, int depth, const char *what, GError **error)
{
  v->type = type;
  v->offset = c->pos;
  guint32 size = type_size (type);
  if (size > 0)
    {
      if (!need (c, size, what, error))
        return FALSE;
      guint64 raw = load_le (f->base + c->pos, size);
      c->pos += size;
      switch (type)
        {
        case GGUF_TYPE_INT8: v->i = (gint8) raw; break;
        case GGUF_TYPE_INT16: v->i = (gint16) raw; break;
        case GGUF_TYPE_INT32: v->i = (gint32) raw; break;
        case GGUF_TYPE_INT64: v->i = (gint64) raw; break;
        case GGUF_TYPE_FLOAT32:
          {
            guint32 bits = (guint32) raw;
            float x;
            memcpy (&x, &bits, 4);
            v->f = x;
            break;
          }
        case GGUF_TYPE_FLOAT64: memcpy (&v->f, &raw, 8); break;
        default: v->u = raw; break;
        }
      return TRUE;
    }
  if (type == GGUF_TYPE_STRING)
    return read_string (c, f, &v->str.s, &v->str.len, what, error);
  g_assert (type == GGUF_TYPE_ARRAY);
  return read_array (c, f, &v->arr, depth, what, error);
}

/* ---- tensor infos ---- */

static gboolean
tensor_fail (const GgufFile *f, const GgufTensor *t, GError **error, const char *fmt, ...) G_GNUC_PRINTF (4, 5);

static gboolean
tensor_fail (const GgufFile *f, const GgufTensor *t, GError **error, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT, "%s: tensor '%s' (info at offset %" G_GUINT64_FORMAT "): %s",
               f->path, t->name, t->info_offset, msg);
  return FALSE;
}

static gboolean
read_tensor_info (Cursor *c, GgufFile *f, guint64 index, GgufTensor *t, GError **error)
{
  g_autofree char *what = g_strdup_printf ("tensor info %" G_GUINT64_FORMAT, index);
  t->info_offset = c->pos;
  guint64 name_len;
  if (!read_string (c, f, &t->name, &name_len, what, error))
    return FALSE;
  if (name_len >= GGUF_MAX_NAME || strlen (t->name) != name_len)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                   "%s: tensor info %" G_GUINT64_FORMAT " at offset %" G_GUINT64_FORMAT
                   ": name of %" G_GUINT64_FORMAT " bytes (at most %d, no NUL)",
                   f->path, index, t->info_offset, name_len, GGUF_MAX_NAME - 1);
      return FALSE;
    }
  if (!read_u32 (c, &t->n_dims, t->name, error))
    return FALSE;
  if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
    return tensor_fail (f, t, error, "%u dimensions (1 to %d)", t->n_dims, GGUF_MAX_DIMS);
  t->n_elements = 1;
  for (guint32 d = 0; d < GGUF_MAX_DIMS; d++)
    {
      t->dims[d] = 1;
      if (d < t->n_dims && !read_u64 (c, &t->dims[d], t->name, error))
        return FALSE;
      if (t->dims[d] == 0 || t->dims[d] > (guint64) G_MAXINT64)
        return tensor_fail (f, t, error, "dimension %u is %" G_GUINT64_FORMAT, d, t->dims[d]);
      if (!g_uint64_checked_mul (&t->n_elements, t->n_elements, t->dims[d]) || t->n_elements > (guint64) G_MAXINT64)
        return tensor_fail (f, t, error, "the product of the dimensions overflows");
    }
  guint32 type;
  if (!read_u32 (c, &type, t->name, error) || !read_u64 (c, &t->offset, t->name, error))
    return FALSE;
  t->type = type;
  if (type >= GGUF_TENSOR_TYPE_COUNT || tensor_types[type].name == NULL)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_UNSUPPORTED,
                   "%s: tensor '%s' (info at offset %" G_GUINT64_FORMAT "): unknown tensor type %u",
                   f->path, t->name, t->info_offset, type);
      return FALSE;
    }
  guint32 block = tensor_types[type].block;
  if (t->dims[0] % block != 0)
    return tensor_fail (f, t, error, "row of %" G_GUINT64_FORMAT " elements is not a multiple of %s's block of %u",
                        t->dims[0], tensor_types[type].name, block);
  if (!g_uint64_checked_mul (&t->n_bytes, t->n_elements / block, tensor_types[type].bytes))
    return tensor_fail (f, t, error, "its size in bytes overflows");
  return TRUE;
}

/* Offsets and sizes of the tensors against the data section. */
static gboolean
place_tensors (GgufFile *f, GError **error)
{
  guint64 data_size = f->size - f->data_offset;
  for (guint64 i = 0; i < f->n_tensors; i++)
    {
      GgufTensor *t = &f->tensors[i];
      if (t->offset % f->alignment != 0)
        return tensor_fail (f, t, error, "data offset %" G_GUINT64_FORMAT " is not a multiple of the alignment %u",
                            t->offset, f->alignment);
      if (t->offset > data_size || t->n_bytes > data_size - t->offset)
        return tensor_fail (f, t, error,
                            "data at file offset %" G_GUINT64_FORMAT " + %" G_GUINT64_FORMAT
                            " bytes runs past the end of the file (%" G_GSIZE_FORMAT " bytes): truncated data",
                            f->data_offset + t->offset, t->n_bytes, f->size);
      t->data = f->base + f->data_offset + t->offset;
    }
  return TRUE;
}

/* ---- the header ---- */

static gboolean
parse (GgufFile *f, GError **error)
{
  Cursor c = { f, 0 };
  if (!need (&c, 4, "the magic", error))
    return FALSE;
  if (memcmp (f->base, "GGUF", 4) != 0)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                   "%s: not a GGUF file (magic at offset 0 is %02x %02x %02x %02x, not \"GGUF\")",
                   f->path, f->base[0], f->base[1], f->base[2], f->base[3]);
      return FALSE;
    }
  c.pos = 4;
  if (!read_u32 (&c, &f->version, "the version", error))
    return FALSE;
  if (f->version != 2 && f->version != 3)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_UNSUPPORTED,
                   "%s: unsupported GGUF version %u at offset 4 (sift reads versions 2 and 3%s)",
                   f->path, f->version, (f->version & 0xffff) == 0 ? "; a big-endian file?" : "");
      return FALSE;
    }
  if (!read_u64 (&c, &f->n_tensors, "the tensor count", error)
      || !read_u64 (&c, &f->n_kv, "the metadata count", error))
    return FALSE;
  /* A key-value pair takes at least 12 bytes, a tensor info 24: refuse
   * counts the file cannot hold before allocating for them. */
  if (!need (&c, f->n_kv > G_MAXUINT64 / 12 ? G_MAXUINT64 : f->n_kv * 12, "the metadata", error))
    return FALSE;

  f->keys = g_new0 (char *, f->n_kv + 1);
  f->values = g_new0 (GgufValue, f->n_kv + 1);
  for (guint64 i = 0; i < f->n_kv; i++)
    {
      g_autofree char *what = g_strdup_printf ("key %" G_GUINT64_FORMAT, i);
      guint64 key_at = c.pos;
      const char *key;
      if (!read_string (&c, f, &key, NULL, what, error))
        return FALSE;
      f->keys[i] = (char *) key;
      g_autofree char *kwhat = g_strdup_printf ("key '%s'", key);
      guint32 type;
      if (!read_u32 (&c, &type, kwhat, error))
        return FALSE;
      if (type >= GGUF_TYPE_COUNT)
        {
          g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                       "%s: key '%s' at offset %" G_GUINT64_FORMAT ": unknown value type %u",
                       f->path, key, key_at, type);
          return FALSE;
        }
      if (!read_value (&c, f, type, &f->values[i], 0, kwhat, error))
        return FALSE;
      if (g_hash_table_contains (f->by_key, key))
        {
          g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                       "%s: key '%s' at offset %" G_GUINT64_FORMAT " appears twice", f->path, key, key_at);
          return FALSE;
        }
      g_hash_table_insert (f->by_key, (gpointer) key, &f->values[i]);
    }

  f->alignment = GGUF_DEFAULT_ALIGNMENT;
  const GgufValue *al = gguf_find (f, "general.alignment");
  if (al != NULL)
    {
      if (al->type != GGUF_TYPE_UINT32 || al->u == 0 || (al->u & (al->u - 1)) != 0)
        {
          g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                       "%s: key 'general.alignment' at offset %" G_GUINT64_FORMAT
                       ": must be a uint32 power of two (is %s %" G_GUINT64_FORMAT ")",
                       f->path, al->offset, gguf_type_name (al->type), al->u);
          return FALSE;
        }
      f->alignment = (guint32) al->u;
    }

  if (!need (&c, f->n_tensors > G_MAXUINT64 / 24 ? G_MAXUINT64 : f->n_tensors * 24, "the tensor infos", error))
    return FALSE;
  f->tensors = g_new0 (GgufTensor, f->n_tensors + 1);
  for (guint64 i = 0; i < f->n_tensors; i++)
    {
      GgufTensor *t = &f->tensors[i];
      if (!read_tensor_info (&c, f, i, t, error))
        return FALSE;
      if (g_hash_table_contains (f->by_name, t->name))
        return tensor_fail (f, t, error, "a second tensor of that name");
      g_hash_table_insert (f->by_name, (gpointer) t->name, t);
    }
  f->data_offset = (c.pos + f->alignment - 1) / f->alignment * f->alignment;
  if (f->data_offset > f->size)
    {
      if (f->n_tensors > 0)
        {
          g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                       "%s: truncated: the data section starts at offset %" G_GUINT64_FORMAT
                       ", past the end of the file (%" G_GSIZE_FORMAT " bytes)",
                       f->path, f->data_offset, f->size);
          return FALSE;
        }
      f->data_offset = f->size;
    }
  return place_tensors (f, error);
}

static GgufFile *
file_new (const char *path)
{
  GgufFile *f = g_new0 (GgufFile, 1);
  f->path = g_strdup (path);
  f->by_key = g_hash_table_new (g_str_hash, g_str_equal);
  f->by_name = g_hash_table_new (g_str_hash, g_str_equal);
  f->strings = g_string_chunk_new (4096);
  f->allocs = g_ptr_array_new_with_free_func (g_free);
  return f;
}

GgufFile *
gguf_open_bytes (const char *path, const guint8 *bytes, gsize size, GError **error)
{
  g_return_val_if_fail (path != NULL && (bytes != NULL || size == 0), NULL);
  g_autoptr (GgufFile) f = file_new (path);
  static const guint8 empty[1];
  f->base = bytes != NULL ? bytes : empty;
  f->size = size;
  if (!parse (f, error))
    return NULL;
  return g_steal_pointer (&f);
}

GgufFile *
gguf_open (const char *path, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  GError *local = NULL;
  GMappedFile *mapped = g_mapped_file_new (path, FALSE, &local);
  if (mapped == NULL)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_IO, "%s", local->message);
      g_error_free (local);
      return NULL;
    }
  g_autoptr (GgufFile) f = file_new (path);
  f->mapped = mapped;
  static const guint8 empty[1];
  f->size = g_mapped_file_get_length (mapped);
  f->base = f->size > 0 ? (const guint8 *) g_mapped_file_get_contents (mapped) : empty;
  if (!parse (f, error))
    return NULL;
  gguf_drop_metadata_pages (f);
  return g_steal_pointer (&f);
}

void
gguf_drop_pages (const GgufFile *f, const void *p, gsize n)
{
  const guint8 *b = p;
  g_return_if_fail (b >= f->base && n <= f->size && (gsize) (b - f->base) <= f->size - n);
  if (f->mapped == NULL)
    return;
  guintptr page = (guintptr) sysconf (_SC_PAGESIZE);
  guintptr lo = ((guintptr) b + page - 1) / page * page, hi = ((guintptr) b + n) / page * page;
  if (hi > lo)
    (void) madvise ((void *) lo, hi - lo, MADV_DONTNEED); /* a hint: on failure the pages stay */
}

void
gguf_drop_metadata_pages (const GgufFile *f)
{
  gguf_drop_pages (f, f->base, f->data_offset);
}

void
gguf_close (GgufFile *f)
{
  if (f == NULL)
    return;
  if (f->mapped != NULL)
    g_mapped_file_unref (f->mapped);
  g_hash_table_destroy (f->by_key);
  g_hash_table_destroy (f->by_name);
  g_string_chunk_free (f->strings);
  g_ptr_array_unref (f->allocs);
  g_free (f->keys);
  g_free (f->values);
  g_free (f->tensors);
  g_free (f->path);
  g_free (f);
}

const char *gguf_path (const GgufFile *f) { return f->path; }
guint32 gguf_version (const GgufFile *f) { return f->version; }
guint32 gguf_alignment (const GgufFile *f) { return f->alignment; }
guint64 gguf_data_offset (const GgufFile *f) { return f->data_offset; }
gsize gguf_file_size (const GgufFile *f) { return f->size; }
guint64 gguf_n_kv (const GgufFile *f) { return f->n_kv; }
guint64 gguf_n_tensors (const GgufFile *f) { return f->n_tensors; }

const char *
gguf_kv_key (const GgufFile *f, guint64 i)
{
  g_return_val_if_fail (i < f->n_kv, NULL);
  return f->keys[i];
}

const GgufValue *
gguf_kv_value (const GgufFile *f, guint64 i)
{
  g_return_val_if_fail (i < f->n_kv, NULL);
  return &f->values[i];
}

const GgufValue *
gguf_find (const GgufFile *f, const char *key)
{
  return g_hash_table_lookup (f->by_key, key);
}

const GgufTensor *
gguf_tensor (const GgufFile *f, guint64 i)
{
  g_return_val_if_fail (i < f->n_tensors, NULL);
  return &f->tensors[i];
}

const GgufTensor *
gguf_find_tensor (const GgufFile *f, const char *name)
{
  return g_hash_table_lookup (f->by_name, name);
}

gboolean
gguf_get_tensor (const GgufFile *f, const char *name, const GgufTensor **out, GError **error)
{
  *out = gguf_find_tensor (f, name);
  if (*out != NULL)
    return TRUE;
  g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_MISSING,
               "%s: tensor '%s' is missing (the file has %" G_GUINT64_FORMAT " tensors, data at offset %"
               G_GUINT64_FORMAT ")", f->path, name, f->n_tensors, f->data_offset);
  return FALSE;
}

/* ---- typed getters ---- */

static const GgufValue *
lookup (const GgufFile *f, const char *key, GError **error)
{
  const GgufValue *v = gguf_find (f, key);
  if (v == NULL)
    g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_MISSING,
                 "%s: metadata key '%s' is missing", f->path, key);
  return v;
}

static gboolean
wrong_type (const GgufFile *f, const char *key, const GgufValue *v, const char *wanted, GError **error)
{
  g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
               "%s: key '%s' at offset %" G_GUINT64_FORMAT ": %s, expected %s",
               f->path, key, v->offset, gguf_type_name (v->type), wanted);
  return FALSE;
}

static gboolean
is_signed (GgufType t)
{
  return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

static gboolean
is_unsigned (GgufType t)
{
  return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}

gboolean
gguf_get_string (const GgufFile *f, const char *key, const char **out, GError **error)
{
  const GgufValue *v = lookup (f, key, error);
  if (v == NULL)
    return FALSE;
  if (v->type != GGUF_TYPE_STRING)
    return wrong_type (f, key, v, "a string", error);
  *out = v->str.s;
  return TRUE;
}

gboolean
gguf_get_uint (const GgufFile *f, const char *key, guint64 *out, GError **error)
{
  const GgufValue *v = lookup (f, key, error);
  if (v == NULL)
    return FALSE;
  if (is_unsigned (v->type))
    *out = v->u;
  else if (is_signed (v->type) && v->i >= 0)
    *out = (guint64) v->i;
  else if (is_signed (v->type))
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                   "%s: key '%s' at offset %" G_GUINT64_FORMAT ": %" G_GINT64_FORMAT " is negative",
                   f->path, key, v->offset, v->i);
      return FALSE;
    }
  else
    return wrong_type (f, key, v, "an unsigned integer", error);
  return TRUE;
}

gboolean
gguf_get_uint32 (const GgufFile *f, const char *key, guint32 *out, GError **error)
{
  guint64 u;
  if (!gguf_get_uint (f, key, &u, error))
    return FALSE;
  if (u > G_MAXUINT32)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                   "%s: key '%s' at offset %" G_GUINT64_FORMAT ": %" G_GUINT64_FORMAT " does not fit 32 bits",
                   f->path, key, gguf_find (f, key)->offset, u);
      return FALSE;
    }
  *out = (guint32) u;
  return TRUE;
}

gboolean
gguf_get_int (const GgufFile *f, const char *key, gint64 *out, GError **error)
{
  const GgufValue *v = lookup (f, key, error);
  if (v == NULL)
    return FALSE;
  if (is_signed (v->type))
    *out = v->i;
  else if (is_unsigned (v->type) && v->u <= (guint64) G_MAXINT64)
    *out = (gint64) v->u;
  else if (is_unsigned (v->type))
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                   "%s: key '%s' at offset %" G_GUINT64_FORMAT ": %" G_GUINT64_FORMAT " does not fit int64",
                   f->path, key, v->offset, v->u);
      return FALSE;
    }
  else
    return wrong_type (f, key, v, "an integer", error);
  return TRUE;
}

gboolean
gguf_get_float (const GgufFile *f, const char *key, double *out, GError **error)
{
  const GgufValue *v = lookup (f, key, error);
  if (v == NULL)
    return FALSE;
  if (v->type != GGUF_TYPE_FLOAT32 && v->type != GGUF_TYPE_FLOAT64)
    return wrong_type (f, key, v, "a float32 or float64", error);
  *out = v->f;
  return TRUE;
}

gboolean
gguf_get_bool (const GgufFile *f, const char *key, gboolean *out, GError **error)
{
  const GgufValue *v = lookup (f, key, error);
  if (v == NULL)
    return FALSE;
  if (v->type != GGUF_TYPE_BOOL)
    return wrong_type (f, key, v, "a bool", error);
  *out = v->u != 0;
  return TRUE;
}

gboolean
gguf_get_array (const GgufFile *f, const char *key, GgufType elem_type, const GgufArray **out, GError **error)
{
  const GgufValue *v = lookup (f, key, error);
  if (v == NULL)
    return FALSE;
  if (v->type != GGUF_TYPE_ARRAY)
    return wrong_type (f, key, v, "an array", error);
  if (elem_type != GGUF_TYPE_COUNT && v->arr.type != elem_type)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                   "%s: key '%s' at offset %" G_GUINT64_FORMAT ": array of %s, expected an array of %s",
                   f->path, key, v->offset, gguf_type_name (v->arr.type), gguf_type_name (elem_type));
      return FALSE;
    }
  *out = &v->arr;
  return TRUE;
}

gint64
gguf_array_int (const GgufArray *a, guint64 i)
{
  g_return_val_if_fail (i < a->n && a->data != NULL, 0);
  guint32 size = type_size (a->type);
  guint64 raw = load_le (a->data + i * size, size);
  switch (a->type)
    {
    case GGUF_TYPE_INT8: return (gint8) raw;
    case GGUF_TYPE_INT16: return (gint16) raw;
    case GGUF_TYPE_INT32: return (gint32) raw;
    default: return (gint64) raw;
    }
}

double
gguf_array_float (const GgufArray *a, guint64 i)
{
  g_return_val_if_fail (i < a->n && a->data != NULL, 0);
  if (a->type == GGUF_TYPE_FLOAT32)
    {
      guint32 bits = (guint32) load_le (a->data + i * 4, 4);
      float x;
      memcpy (&x, &bits, 4);
      return x;
    }
  if (a->type == GGUF_TYPE_FLOAT64)
    {
      guint64 bits = load_le (a->data + i * 8, 8);
      double x;
      memcpy (&x, &bits, 8);
      return x;
    }
  if (a->type == GGUF_TYPE_UINT64)
    return (double) (guint64) gguf_array_int (a, i);
  return (double) gguf_array_int (a, i);
}
