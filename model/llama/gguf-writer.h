/* A small GGUF writer for tests and benches (built in the build tree, not
 * installed): metadata of every type, tensors of any type, and the
 * quantisers that make F16, BF16, Q8_0, Q4_0, Q4_K and Q6_K data. */
#pragma once

#include <glib.h>

#include "gguf.h"

G_BEGIN_DECLS

typedef struct _GgufWriter GgufWriter;

GgufWriter *gguf_writer_new (guint32 version, guint32 alignment);
void gguf_writer_free (GgufWriter *w);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GgufWriter, gguf_writer_free)

void gguf_writer_add_u32 (GgufWriter *w, const char *key, guint32 v);
void gguf_writer_add_i32 (GgufWriter *w, const char *key, gint32 v);
void gguf_writer_add_u64 (GgufWriter *w, const char *key, guint64 v);
void gguf_writer_add_f32 (GgufWriter *w, const char *key, float v);
void gguf_writer_add_bool (GgufWriter *w, const char *key, gboolean v);
void gguf_writer_add_string (GgufWriter *w, const char *key, const char *s);
/* Numeric or bool elements, packed little-endian in `elems`. */
void gguf_writer_add_array (GgufWriter *w, const char *key, GgufType elem_type, guint64 n, const void *elems);
void gguf_writer_add_string_array (GgufWriter *w, const char *key, guint64 n, const char *const *strs);
/* A value already serialised (for nested arrays and deliberately odd files). */
void gguf_writer_add_raw (GgufWriter *w, const char *key, GgufType type, const void *bytes, gsize len);

/* Serialisation helpers for gguf_writer_add_raw. */
void gguf_put_u32 (GByteArray *b, guint32 v);
void gguf_put_u64 (GByteArray *b, guint64 v);
void gguf_put_string (GByteArray *b, const char *s);

/* Copies `data` ([n_bytes], already in `type`'s layout). */
void gguf_writer_add_tensor (GgufWriter *w, const char *name, GgufTensorType type,
                             guint32 n_dims, const guint64 *dims, const void *data, gsize n_bytes);
/* Quantises f32 `x` ([n_elements], rows of dims[0]) to `type` and adds it. */
void gguf_writer_add_tensor_f32 (GgufWriter *w, const char *name, GgufTensorType type,
                                 guint32 n_dims, const guint64 *dims, const float *x);

GBytes *gguf_writer_to_bytes (GgufWriter *w);
gboolean gguf_writer_write (GgufWriter *w, const char *path, GError **error);

/* Row quantisers: n elements (a multiple of the type's block) of x into dst. */
void gguf_quantize_row (GgufTensorType type, const float *x, void *dst, gsize n);

G_END_DECLS
