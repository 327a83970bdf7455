/* The GGUF model's part of the config: the model source "gguf" and its
 * key model.path, a section beside core's model keys. */
#include <stddef.h>

#include <sift/error.h>

#include "gguf-model.h"

static const SiftConfigKey gguf_keys[] = {
  { "path", SIFT_CONFIG_KEY_STRING, offsetof (SiftGgufConfig, path), 0, SIFT_CONFIG_NO_RANGE, NULL, NULL, "the GGUF file of model.source gguf" },
  { NULL },
};

static gboolean
check (const SiftConfig *config, gconstpointer values, GError **error)
{
  const SiftGgufConfig *g = values;
  if (g_strcmp0 (config->source, "gguf") == 0 && (g->path == NULL || g->path[0] == '\0'))
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_MISSING, (const char *const[]) { "model.source", NULL },
                             "model.source is gguf but model.path (the GGUF file) is not given");
  return TRUE;
}

const SiftConfigSection sift_gguf_config_section = {
  "model", 10, "the model source and its shape", sizeof (SiftGgufConfig), gguf_keys, check,
};

static const SiftConfigModelSource gguf_source = {
  "gguf", "a Llama-family model from the GGUF file model.path (docs/model.md)", FALSE,
};

void
sift_gguf_config_register (void)
{
  sift_config_register_model_source (&gguf_source);
  sift_config_register_section (&sift_gguf_config_section);
}

const SiftGgufConfig *
sift_gguf_config (const SiftConfig *config)
{
  const SiftGgufConfig *values = sift_config_get_section (config, &sift_gguf_config_section);
  if (values == NULL)
    g_error ("%s: made before sift_gguf_config_register () was called", config->file);
  return values;
}
