/* Model sources: the checked entry points over a source's class. */
#include <sift/error.h>
#include <sift/model.h>

gboolean
sift_model_source_qkv (SiftModelSource *src, gint32 layer, gint64 pos0, gint64 n, float *q, float *k,
                       float *v, GError **error)
{
  g_return_val_if_fail (src != NULL && src->klass != NULL && src->klass->qkv != NULL, FALSE);
  if (layer < 0 || layer >= src->shape.n_layers || pos0 < 0 || n < 0 || (n > 0 && (q == NULL || k == NULL || v == NULL)))
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s source: impossible request: layer %d of %d, tokens %" G_GINT64_FORMAT "+%" G_GINT64_FORMAT,
                   src->klass->name, layer, src->shape.n_layers, pos0, n);
      return FALSE;
    }
  if (n == 0)
    return TRUE;
  return src->klass->qkv (src, layer, pos0, n, q, k, v, error);
}

void
sift_model_source_free (SiftModelSource *src)
{
  if (src == NULL)
    return;
  if (src->klass->finalize != NULL)
    src->klass->finalize (src);
  g_free (src);
}
