/* The YAML config: loading, merging and freeing (the parser, setups,
 * --set and the checks live in config-parse.c, config-setup.c,
 * config-set.c and config-check.c). Every error points at a node:
 * file:line:col. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>

#include "config-private.h"
#include "nearest.h"
#include "params-private.h"
#include "policy-private.h"

const char *const sift_config_phase_names[2] = { "prefill", "decode" };

static gboolean
read_file (const char *path, char **text, GError **error)
{
  GError *local = NULL;
  gsize len;
  if (!g_file_get_contents (path, text, &len, &local))
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_IO, "%s: cannot read: %s", path, local->message);
      g_error_free (local);
      return FALSE;
    }
  if (strlen (*text) != len)
    {
      Origin at = { NULL, 0, 0, 0 };
      sift_config_at_offset (*text, strlen (*text), &at);
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_SYNTAX,
                   "%s:%d:%d: contains a NUL byte (not a YAML text file)", path, at.line, at.col);
      g_clear_pointer (text, g_free);
      return FALSE;
    }
  return TRUE;
}

void
sift_config_free (SiftConfig *config)
{
  if (config == NULL)
    return;
  Config *cfg = (Config *) config;
  g_free (config->file);
  sift_config_instances_free (cfg);
  g_clear_pointer (&config->setups, g_ptr_array_unref);
  g_clear_pointer (&cfg->origins, g_hash_table_unref);
  g_clear_pointer (&cfg->sources, g_ptr_array_unref);
  g_free (cfg);
}

static Config *
config_new (void)
{
  Config *cfg = g_new0 (Config, 1);
  sift_config_instances_init (cfg);
  cfg->pub.shape.scale = 0.0f;
  cfg->pub.setups = g_ptr_array_new_with_free_func (sift_config_setup_free);
  cfg->sources = g_ptr_array_new_with_free_func (sift_config_source_free);
  cfg->origins = g_hash_table_new_full (g_direct_hash, g_direct_equal, NULL, g_free);
  return cfg;
}

SiftConfig *
sift_config_copy (const SiftConfig *config)
{
  g_return_val_if_fail (config != NULL, NULL);
  const Config *from = (const Config *) config;
  Config *to = g_new0 (Config, 1);
  *to = *from;
  to->pub.file = g_strdup (from->pub.file);
  to->pub.setups = g_ptr_array_ref (from->pub.setups);
  to->sources = g_ptr_array_ref (from->sources);
  sift_config_instances_copy (to, from);
  return &to->pub;
}

SiftConfig *
sift_config_new_default (SiftRegistry *registry, GError **error)
{
  g_autoptr (SiftConfig) config = (SiftConfig *) config_new ();
  config->file = g_strdup ("(defaults)");
  if (!sift_config_validate ((Config *) config, registry, error))
    return NULL;
  return g_steal_pointer (&config);
}

SiftConfig *
sift_config_load (const char *path, SiftRegistry *registry, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  g_autoptr (SiftConfig) config = (SiftConfig *) config_new ();
  config->file = g_strdup (path);
  if (!sift_config_merge_file (config, path, registry, error))
    return NULL;
  return g_steal_pointer (&config);
}

gboolean
sift_config_merge_file (SiftConfig *config, const char *path, SiftRegistry *registry, GError **error)
{
  g_return_val_if_fail (config != NULL && path != NULL, FALSE);
  g_autofree char *text = NULL;
  if (!read_file (path, &text, error))
    return FALSE;
  return sift_config_merge_text ((Config *) config, path, text, registry, error);
}

SiftConfig *
sift_config_load_string (const char *name, const char *text, SiftRegistry *registry, GError **error)
{
  g_return_val_if_fail (name != NULL && text != NULL, NULL);
  g_autoptr (SiftConfig) config = (SiftConfig *) config_new ();
  config->file = g_strdup (name);
  if (!sift_config_merge_text ((Config *) config, name, text, registry, error))
    return NULL;
  return g_steal_pointer (&config);
}
