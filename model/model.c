/* The model protocol's checked entry points (include/sift/model.h): class
 * version, arguments and the order begin -> (qkv -> attended) per layer ->
 * end. A call out of order fails and ends the step. */
#include <sift/error.h>
#include <sift/model.h>

/* Fails a call: "NAME model: reason"; the step ends. */
static gboolean G_GNUC_PRINTF (3, 4)
invalid (SiftModel *m, GError **error, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *reason = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID, "%s model: %s", m->klass->name, reason);
  m->step_next = 0;
  return FALSE;
}

gboolean
sift_model_init (SiftModel *m, const SiftModelClass *klass, const SiftModelShape *shape, gint32 n_vocab,
                 GError **error)
{
  g_return_val_if_fail (m != NULL && klass != NULL && shape != NULL, FALSE);
  const char *name = klass->name != NULL ? klass->name : "(unnamed)";
  if (klass->version != SIFT_MODEL_PROTOCOL_VERSION || klass->struct_size < sizeof (SiftModelClass))
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s model: speaks model protocol %u (class of %u bytes); sift speaks %d (%zu bytes)", name,
                   klass->version, klass->struct_size, SIFT_MODEL_PROTOCOL_VERSION, sizeof (SiftModelClass));
      return FALSE;
    }
  if (klass->name == NULL || klass->begin == NULL || klass->qkv == NULL || klass->attended == NULL
      || klass->end == NULL)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s model: its class lacks a name or one of begin, qkv, attended, end", name);
      return FALSE;
    }
  if (shape->n_layers <= 0 || shape->n_q_heads <= 0 || shape->n_kv_heads <= 0 || shape->head_dim <= 0
      || n_vocab < 0)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s model: impossible shape %d layers x %d/%d heads x %d dim, %d vocabulary", name,
                   shape->n_layers, shape->n_q_heads, shape->n_kv_heads, shape->head_dim, n_vocab);
      return FALSE;
    }
  m->klass = klass;
  m->shape = *shape;
  m->n_vocab = n_vocab;
  m->step_next = 0;
  return TRUE;
}

gboolean
sift_model_begin (SiftModel *m, gint64 pos0, gint64 n, const gint32 *tokens, GError **error)
{
  g_return_val_if_fail (m != NULL && m->klass != NULL, FALSE);
  if (pos0 < 0 || n < 1)
    return invalid (m, error, "step of %" G_GINT64_FORMAT " tokens at position %" G_GINT64_FORMAT, n, pos0);
  m->step_pos0 = pos0;
  m->step_n = n;
  m->step_next = 1;
  if (!m->klass->begin (m, pos0, n, tokens, error))
    {
      m->step_next = 0;
      return FALSE;
    }
  return TRUE;
}

gboolean
sift_model_qkv (SiftModel *m, gint32 layer, float *q, float *k, float *v, GError **error)
{
  g_return_val_if_fail (m != NULL && m->klass != NULL, FALSE);
  if (layer < 0 || layer >= m->shape.n_layers || m->step_next != 2 * layer + 1)
    return invalid (m, error, "qkv of layer %d out of order (call %d of the step; 0: no step)", layer, m->step_next);
  if (q == NULL || k == NULL || v == NULL)
    return invalid (m, error, "qkv of layer %d without buffers", layer);
  if (!m->klass->qkv (m, layer, q, k, v, error))
    {
      m->step_next = 0;
      return FALSE;
    }
  m->step_next++;
  return TRUE;
}

gboolean
sift_model_attended (SiftModel *m, gint32 layer, const float *out, GError **error)
{
  g_return_val_if_fail (m != NULL && m->klass != NULL, FALSE);
  if (layer < 0 || layer >= m->shape.n_layers || m->step_next != 2 * layer + 2)
    return invalid (m, error, "attended of layer %d out of order (call %d of the step; 0: no step)", layer,
                    m->step_next);
  if (out == NULL)
    return invalid (m, error, "attended of layer %d without an output", layer);
  if (!m->klass->attended (m, layer, out, error))
    {
      m->step_next = 0;
      return FALSE;
    }
  m->step_next++;
  return TRUE;
}

gboolean
sift_model_end (SiftModel *m, float *logits, GError **error)
{
  g_return_val_if_fail (m != NULL && m->klass != NULL, FALSE);
  if (m->step_next != 2 * m->shape.n_layers + 1)
    return invalid (m, error, "end before every layer attended (call %d of the step; 0: no step)", m->step_next);
  m->step_next = 0;
  return m->klass->end (m, m->n_vocab > 0 ? logits : NULL, error);
}

gboolean
sift_model_is_positional (const SiftModel *m)
{
  g_return_val_if_fail (m != NULL && m->klass != NULL, FALSE);
  return m->klass->qkv_at != NULL;
}

gboolean
sift_model_qkv_at (SiftModel *m, gint32 layer, gint64 pos0, gint64 n, float *q, float *k, float *v,
                   GError **error)
{
  g_return_val_if_fail (m != NULL && m->klass != NULL, FALSE);
  const char *name = m->klass->name;
  if (m->klass->qkv_at == NULL)
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s model: q, k, v depend on earlier layers' outputs; no random access (qkv_at)", name);
      return FALSE;
    }
  if (layer < 0 || layer >= m->shape.n_layers || pos0 < 0 || n < 0 || (n > 0 && (q == NULL || k == NULL || v == NULL)))
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID,
                   "%s model: impossible request: layer %d of %d, tokens %" G_GINT64_FORMAT "+%" G_GINT64_FORMAT,
                   name, layer, m->shape.n_layers, pos0, n);
      return FALSE;
    }
  if (n == 0)
    return TRUE;
  return m->klass->qkv_at (m, layer, pos0, n, q, k, v, error);
}

void
sift_model_free (SiftModel *m)
{
  if (m == NULL)
    return;
  if (m->klass->finalize != NULL)
    m->klass->finalize (m);
  g_free (m);
}

gboolean
sift_model_positional_begin (SiftModel *self, gint64 pos0, gint64 n, const gint32 *tokens, GError **error)
{
  (void) self, (void) pos0, (void) n, (void) tokens, (void) error;
  return TRUE;
}

gboolean
sift_model_positional_qkv (SiftModel *self, gint32 layer, float *q, float *k, float *v, GError **error)
{
  return self->klass->qkv_at (self, layer, self->step_pos0, self->step_n, q, k, v, error);
}

gboolean
sift_model_positional_attended (SiftModel *self, gint32 layer, const float *out, GError **error)
{
  (void) self, (void) layer, (void) out, (void) error;
  return TRUE;
}

gboolean
sift_model_positional_end (SiftModel *self, float *logits, GError **error)
{
  (void) self, (void) logits, (void) error;
  return TRUE;
}
