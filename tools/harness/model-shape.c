/* A config for a GGUF model against the file's shape (issue 19). */
#include "harness.h"

gboolean
harness_check_model_shape (const SiftConfig *cfg, const char *path, const SiftModel *model, GError **error)
{
  if (g_strcmp0 (cfg->source, "gguf") != 0)
    return TRUE;
  const SiftModelShape *file = &model->shape;
  const struct {
    const char *key, *what;
    gint32 config, file;
  } keys[] = {
    { "model.layers", "layers", cfg->shape.n_layers, file->n_layers },
    { "model.q_heads", "query heads", cfg->shape.n_q_heads, file->n_q_heads },
    { "model.kv_heads", "kv heads", cfg->shape.n_kv_heads, file->n_kv_heads },
    { "model.head_dim", "dims per head", cfg->shape.head_dim, file->head_dim },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (keys); i++)
    if (keys[i].config != keys[i].file && sift_config_is_set (cfg, keys[i].key))
      return sift_config_fail (cfg, error, SIFT_CONFIG_ERROR_INVALID, (const char *const[]) { keys[i].key, NULL },
                               "%s is %d but %s has %d %s (its GGUF metadata); leave the key out to take the file's",
                               keys[i].key, keys[i].config, path, keys[i].file, keys[i].what);
  return TRUE;
}
