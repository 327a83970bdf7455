#include <sift/model.h>

/* TEMPORARY until the engine branch (engine/model.c) lands on main. */
gboolean
sift_model_source_qkv (SiftModelSource *src, gint32 layer, gint64 pos0, gint64 n, float *q, float *k,
                       float *v, GError **error)
{
  return src->klass->qkv (src, layer, pos0, n, q, k, v, error);
}

void
sift_model_source_free (SiftModelSource *src)
{
  if (src == NULL)
    return;
  src->klass->finalize (src);
  g_free (src);
}
