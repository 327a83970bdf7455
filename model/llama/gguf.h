/* GGUF files (versions 2 and 3): metadata and tensor infos, read from a
 * read-only mapping of the file. Everything a GgufFile hands out (strings,
 * arrays, tensor data) lives as long as the GgufFile.
 *
 * Layout, little-endian: "GGUF", u32 version, u64 n_tensors, u64 n_kv;
 * n_kv x (string key, u32 value type, value); n_tensors x (string name,
 * u32 n_dims, u64 dims[n_dims], u32 tensor type, u64 offset); padding to
 * general.alignment (default 32); the data section. A string is a u64 length
 * and that many bytes (no NUL); an array is u32 element type, u64 count and
 * the elements. dims[0] varies fastest (a matrix's row length). */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Metadata value types, as numbered in the file. */
typedef enum {
  GGUF_TYPE_UINT8 = 0,
  GGUF_TYPE_INT8 = 1,
  GGUF_TYPE_UINT16 = 2,
  GGUF_TYPE_INT16 = 3,
  GGUF_TYPE_UINT32 = 4,
  GGUF_TYPE_INT32 = 5,
  GGUF_TYPE_FLOAT32 = 6,
  GGUF_TYPE_BOOL = 7,
  GGUF_TYPE_STRING = 8,
  GGUF_TYPE_ARRAY = 9,
  GGUF_TYPE_UINT64 = 10,
  GGUF_TYPE_INT64 = 11,
  GGUF_TYPE_FLOAT64 = 12,
  GGUF_TYPE_COUNT
} GgufType;

/* Tensor element types (ggml's numbering). Those sift computes with are
 * F32, F16, BF16, Q8_0, Q4_0, Q4_K and Q6_K; the others are known by name
 * and size so that `sift model info` can describe any file. */
typedef enum {
  GGUF_TENSOR_F32 = 0,
  GGUF_TENSOR_F16 = 1,
  GGUF_TENSOR_Q4_0 = 2,
  GGUF_TENSOR_Q4_1 = 3,
  GGUF_TENSOR_Q5_0 = 6,
  GGUF_TENSOR_Q5_1 = 7,
  GGUF_TENSOR_Q8_0 = 8,
  GGUF_TENSOR_Q8_1 = 9,
  GGUF_TENSOR_Q2_K = 10,
  GGUF_TENSOR_Q3_K = 11,
  GGUF_TENSOR_Q4_K = 12,
  GGUF_TENSOR_Q5_K = 13,
  GGUF_TENSOR_Q6_K = 14,
  GGUF_TENSOR_Q8_K = 15,
  GGUF_TENSOR_IQ2_XXS = 16,
  GGUF_TENSOR_IQ2_XS = 17,
  GGUF_TENSOR_IQ3_XXS = 18,
  GGUF_TENSOR_IQ1_S = 19,
  GGUF_TENSOR_IQ4_NL = 20,
  GGUF_TENSOR_IQ3_S = 21,
  GGUF_TENSOR_IQ2_S = 22,
  GGUF_TENSOR_IQ4_XS = 23,
  GGUF_TENSOR_I8 = 24,
  GGUF_TENSOR_I16 = 25,
  GGUF_TENSOR_I32 = 26,
  GGUF_TENSOR_I64 = 27,
  GGUF_TENSOR_F64 = 28,
  GGUF_TENSOR_IQ1_M = 29,
  GGUF_TENSOR_BF16 = 30,
  GGUF_TENSOR_TYPE_COUNT
} GgufTensorType;

#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64 /* a tensor name is shorter than this */
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct _GgufValue GgufValue;

/* An array value. Elements of a numeric or bool array are packed
 * little-endian at `data` (not aligned: read them with gguf_array_*);
 * strings are NUL-terminated copies (lengths beside them, a string may hold
 * a NUL); nested arrays are GgufValues. */
typedef struct {
  GgufType type;             /* element type */
  guint64 n;
  const guint8 *data;        /* numeric and bool elements */
  const char *const *strings; /* [n] for GGUF_TYPE_STRING */
  const guint64 *lengths;    /* [n] byte lengths of strings */
  const GgufValue *items;    /* [n] for GGUF_TYPE_ARRAY */
} GgufArray;

struct _GgufValue {
  GgufType type;
  guint64 offset; /* of the value in the file */
  union {
    guint64 u;    /* unsigned types and bool */
    gint64 i;     /* signed types */
    double f;     /* FLOAT32, FLOAT64 */
    struct {
      const char *s;
      guint64 len;
    } str;
    GgufArray arr;
  };
};

typedef struct {
  const char *name;
  guint32 n_dims;
  guint64 dims[GGUF_MAX_DIMS]; /* [0] fastest; unused ones are 1 */
  GgufTensorType type;
  guint64 offset;     /* in the data section */
  guint64 n_elements;
  guint64 n_bytes;
  const void *data;   /* into the mapping */
  guint64 info_offset; /* of the tensor info in the file (for messages) */
} GgufTensor;

typedef struct _GgufFile GgufFile;

/* Maps and parses `path`. Every failure is a SIFT_MODEL_ERROR naming the
 * file and, where there is one, the key or tensor and the byte offset. */
GgufFile *gguf_open (const char *path, GError **error);
/* Parses a buffer the caller keeps alive (tests); `path` names it in messages. */
GgufFile *gguf_open_bytes (const char *path, const guint8 *bytes, gsize size, GError **error);
void gguf_close (GgufFile *f);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GgufFile, gguf_close)
/* The mapped file's pages wholly inside [p, p + n) leave this process's
 * resident set (madvise MADV_DONTNEED on the private read-only mapping:
 * the page cache keeps them, and a later read maps them again). Nothing
 * for a file opened from bytes. For data that a copy has replaced. */
void gguf_drop_pages (const GgufFile *f, const void *p, gsize n);
/* The same for the header and metadata, [0, data offset): the parse copied
 * the strings out of them, and the numeric arrays they hold (token scores,
 * types) are read again through the mapping if asked for. gguf_open drops
 * them once parsed (5-6 MiB for a 128K-token vocabulary). */
void gguf_drop_metadata_pages (const GgufFile *f);

const char *gguf_path (const GgufFile *f);
guint32 gguf_version (const GgufFile *f);
guint32 gguf_alignment (const GgufFile *f);
guint64 gguf_data_offset (const GgufFile *f); /* start of the data section */
gsize gguf_file_size (const GgufFile *f);

/* Metadata, in file order. */
guint64 gguf_n_kv (const GgufFile *f);
const char *gguf_kv_key (const GgufFile *f, guint64 i);
const GgufValue *gguf_kv_value (const GgufFile *f, guint64 i);
/* NULL when absent. */
const GgufValue *gguf_find (const GgufFile *f, const char *key);
const char *gguf_type_name (GgufType type);

/* Typed getters: FALSE with an error naming the file, the key and (when the
 * key exists) its offset if the key is absent or of another type. Integer
 * getters accept any integer type whose value fits; the float getter
 * FLOAT32 and FLOAT64. */
gboolean gguf_get_string (const GgufFile *f, const char *key, const char **out, GError **error);
gboolean gguf_get_uint (const GgufFile *f, const char *key, guint64 *out, GError **error);
gboolean gguf_get_int (const GgufFile *f, const char *key, gint64 *out, GError **error);
gboolean gguf_get_uint32 (const GgufFile *f, const char *key, guint32 *out, GError **error);
gboolean gguf_get_float (const GgufFile *f, const char *key, double *out, GError **error);
gboolean gguf_get_bool (const GgufFile *f, const char *key, gboolean *out, GError **error);
/* elem_type GGUF_TYPE_COUNT accepts any element type. */
gboolean gguf_get_array (const GgufFile *f, const char *key, GgufType elem_type,
                         const GgufArray **out, GError **error);

/* Elements of numeric arrays (element type checked by the caller). */
gint64 gguf_array_int (const GgufArray *a, guint64 i);    /* any integer or bool type */
double gguf_array_float (const GgufArray *a, guint64 i);  /* FLOAT32, FLOAT64 or integers */

/* Tensors, in file order. */
guint64 gguf_n_tensors (const GgufFile *f);
const GgufTensor *gguf_tensor (const GgufFile *f, guint64 i);
/* NULL when absent. */
const GgufTensor *gguf_find_tensor (const GgufFile *f, const char *name);
/* FALSE with an error naming the file and the tensor when absent. */
gboolean gguf_get_tensor (const GgufFile *f, const char *name, const GgufTensor **out, GError **error);

/* Tensor types: name ("F32", "Q4_K"), elements per block, bytes per block.
 * An id outside ggml's table gives NULL / 0. */
const char *gguf_tensor_type_name (GgufTensorType type);
guint32 gguf_tensor_type_block (GgufTensorType type);
guint32 gguf_tensor_type_block_bytes (GgufTensorType type);

G_END_DECLS
