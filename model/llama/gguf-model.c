/* The model protocol's methods over a LlamaModel. */
#include "gguf-model.h"

typedef struct {
  SiftModel parent;
  LlamaModel *llama;
} GgufModel;

static gboolean
gguf_begin (SiftModel *self, gint64 pos0, gint64 n, const gint32 *tokens, GError **error)
{
  return llama_model_begin (((GgufModel *) self)->llama, pos0, n, tokens, error);
}

static gboolean
gguf_qkv (SiftModel *self, gint32 layer, float *q, float *k, float *v, GError **error)
{
  return llama_model_qkv (((GgufModel *) self)->llama, layer, q, k, v, error);
}

static gboolean
gguf_attended (SiftModel *self, gint32 layer, const float *out, GError **error)
{
  return llama_model_attended (((GgufModel *) self)->llama, layer, out, error);
}

static gboolean
gguf_end (SiftModel *self, float *logits, GError **error)
{
  return llama_model_end (((GgufModel *) self)->llama, logits, error);
}

static void
gguf_finalize (SiftModel *self)
{
  llama_model_free (((GgufModel *) self)->llama);
}

static const SiftModelClass gguf_class = {
  .version = SIFT_MODEL_PROTOCOL_VERSION,
  .struct_size = sizeof (SiftModelClass),
  .name = "gguf",
  .begin = gguf_begin,
  .qkv = gguf_qkv,
  .attended = gguf_attended,
  .end = gguf_end,
  .finalize = gguf_finalize,
};

SiftModel *
sift_model_gguf_new (const char *path, gint32 block_size, gint32 chunk_size, float scale, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  LlamaModel *llama = llama_model_open (path, error);
  if (llama == NULL)
    return NULL;
  const LlamaConfig *c = llama_model_config (llama);
  SiftModelShape shape = {
    .n_layers = c->n_layers, .n_q_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
    .block_size = block_size, .chunk_size = chunk_size,
    .scale = sift_attn_scale (scale, c->head_dim),
  };
  GgufModel *m = g_new0 (GgufModel, 1);
  m->llama = llama;
  if (!sift_model_init (&m->parent, &gguf_class, &shape, c->n_vocab, error))
    {
      llama_model_free (llama);
      g_free (m);
      return NULL;
    }
  return &m->parent;
}

LlamaModel *
sift_model_gguf_llama (SiftModel *model)
{
  return model != NULL && model->klass == &gguf_class ? ((GgufModel *) model)->llama : NULL;
}

gboolean
sift_model_gguf_use_device (SiftModel *model, SiftDevice device, GError **error)
{
  LlamaModel *llama = sift_model_gguf_llama (model);
  g_return_val_if_fail (llama != NULL, FALSE);
  return device != SIFT_DEVICE_CUDA || llama_model_use_gpu (llama, error);
}
