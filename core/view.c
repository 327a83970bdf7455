/* Tensor views: checks and row conversion. */
#include <sift/error.h>
#include <sift/view.h>

void
sift_view_row_to_f32 (const SiftView *v, gint64 h, gint64 t, float *dst)
{
  sift_convert (sift_view_row (v, h, t), v->dtype, dst, SIFT_DTYPE_F32, (gsize) v->head_dim);
}

gboolean
sift_view_check (const SiftView *v, const char *what, GError **error)
{
  if (v == NULL)
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID, "%s: view is NULL", what);
      return FALSE;
    }
  if (v->dtype != SIFT_DTYPE_F32 && v->dtype != SIFT_DTYPE_F16 && v->dtype != SIFT_DTYPE_BF16)
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID,
                   "%s: dtype %d is not f32, f16 or bf16", what, (int) v->dtype);
      return FALSE;
    }
  if (v->head_dim <= 0 || v->n_heads <= 0 || v->n_tokens < 0)
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_SHAPE,
                   "%s: impossible shape [%d heads][%" G_GINT64_FORMAT " tokens][%d dim]", what,
                   v->n_heads, v->n_tokens, v->head_dim);
      return FALSE;
    }
  if (v->data == NULL && v->n_tokens > 0)
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID, "%s: data is NULL", what);
      return FALSE;
    }
  return TRUE;
}
