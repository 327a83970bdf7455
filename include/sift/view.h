/* sift — strided tensor views.
 *
 * Attention works on 3-D views [heads][tokens][dim] whose last axis is
 * contiguous; the head and token axes have arbitrary strides, so one type
 * covers a model's token-major output ([tokens][heads][dim]: head_stride =
 * dim, token_stride = heads * dim) and the engine's block layout
 * ([heads][block][dim]: head_stride = block * dim, token_stride = dim). */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/dtype.h>

G_BEGIN_DECLS

/* Where a view's memory lives. */
typedef enum {
  SIFT_MEMORY_HOST = 0,   /* the CPU reads and writes it (RAM, pinned RAM) */
  SIFT_MEMORY_DEVICE = 1, /* only the backend that allocated it reaches it: never dereference data */
} SiftMemorySpace;

typedef struct {
  void *data;           /* element (h, t, 0) at data + (h * head_stride + t * token_stride) elements */
  SiftDType dtype;      /* f32, f16 or bf16 */
  gint32 n_heads;
  gint32 head_dim;
  gint64 n_tokens;
  gint64 head_stride;   /* elements from head h to h + 1 */
  gint64 token_stride;  /* elements from token t to t + 1 */
  SiftMemorySpace space; /* SIFT_MEMORY_HOST unless a backend says otherwise; the CPU kernels refuse others */
  guint32 reserved[5];  /* zero: room for later minors */
} SiftView;

/* A view of host memory with the given strides (in elements). */
static inline SiftView
sift_view_strided (void *data, SiftDType dtype, gint32 n_heads, gint64 n_tokens, gint32 head_dim,
                   gint64 head_stride, gint64 token_stride)
{
  SiftView v = { .data = data, .dtype = dtype, .n_heads = n_heads, .head_dim = head_dim, .n_tokens = n_tokens,
                 .head_stride = head_stride, .token_stride = token_stride, .space = SIFT_MEMORY_HOST };
  return v;
}

/* A view of contiguous [tokens][heads][dim] host memory. */
static inline SiftView
sift_view_thd (void *data, SiftDType dtype, gint64 n_tokens, gint32 n_heads, gint32 head_dim)
{
  return sift_view_strided (data, dtype, n_heads, n_tokens, head_dim, head_dim, (gint64) n_heads * head_dim);
}

/* A view of contiguous [heads][tokens][dim] host memory. */
static inline SiftView
sift_view_htd (void *data, SiftDType dtype, gint32 n_heads, gint64 n_tokens, gint32 head_dim)
{
  return sift_view_strided (data, dtype, n_heads, n_tokens, head_dim, n_tokens * head_dim, head_dim);
}

/* Pointer to row (h, t). */
static inline void *
sift_view_row (const SiftView *v, gint64 h, gint64 t)
{
  gsize es = v->dtype == SIFT_DTYPE_F32 ? 4 : 2;
  return (char *) v->data + (gsize) (h * v->head_stride + t * v->token_stride) * es;
}

/* Heads [h0, h0 + n) of a view. */
static inline SiftView
sift_view_heads (const SiftView *v, gint32 h0, gint32 n)
{
  SiftView r = *v;
  r.data = sift_view_row (v, h0, 0);
  r.n_heads = n;
  return r;
}

/* Tokens [t0, t0 + n) of a view. */
static inline SiftView
sift_view_tokens (const SiftView *v, gint64 t0, gint64 n)
{
  SiftView r = *v;
  r.data = sift_view_row (v, 0, t0);
  r.n_tokens = n;
  return r;
}

/* Copies row (h, t) into dst[head_dim] as f32. */
SIFT_API void sift_view_row_to_f32 (const SiftView *v, gint64 h, gint64 t, float *dst);

/* Checks that a view is usable: non-NULL data (unless empty), dtype f32/f16/bf16,
 * positive head_dim; `what` names it in the error ("q", "k", ...). */
SIFT_API gboolean sift_view_check (const SiftView *v, const char *what, GError **error);

G_END_DECLS
