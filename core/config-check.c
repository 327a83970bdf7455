/* The config's checks across keys, after every document and --set: core's
 * (the shape, the setups), then each registered section's own. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>

#include "config-private.h"
#include "nearest.h"
#include "params-private.h"
#include "policy-private.h"

/* ---- Checks across keys ----------------------------------------------------------- */

#define LATEST(a, b) sift_config_latest_of (cfg, (const gconstpointer[]){ &cfg->a, &cfg->b }, 2)

static gboolean
validate_setups (Config *cfg, SiftRegistry *registry, GError **error)
{
  const char *file = cfg->pub.file;
  if (cfg->pub.setups->len == 0)
    {
      g_ptr_array_add (cfg->pub.setups, sift_config_setup_new ("policy"));
      cfg->implied_setup = TRUE;
    }
  g_autoptr (GHashTable) labels = g_hash_table_new (g_str_hash, g_str_equal); /* borrowed */
  for (guint i = 0; i < cfg->pub.setups->len; i++)
    {
      Setup *s = cfg->pub.setups->pdata[i];
      if (!s->label_given)
        {
          g_free (s->pub.label);
          s->pub.label = strcmp (s->pub.prefill.name, s->pub.decode.name) == 0
                           ? g_strdup (s->pub.prefill.name)
                           : g_strdup_printf ("%s+%s", s->pub.prefill.name, s->pub.decode.name);
        }
      if (!g_hash_table_add (labels, s->pub.label))
        {
          const Origin *at = s->label_given ? &s->label_at : s->at.src ? &s->at : NULL;
          sift_config_fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID, at, file,
                   "%s: two setups are labelled '%s'; give each a distinct 'label'", s->where, s->pub.label);
          return FALSE;
        }
      for (gsize d = 0; d < s->pub.n_dense_layers; d++)
        {
          gint64 layer = s->pub.dense_layers[d];
          if (layer >= cfg->pub.shape.n_layers)
            {
              sift_config_fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_RANGE, s->dense_at.src ? &s->dense_at : NULL, file,
                       "%s.dense_layers: layer %" G_GINT64_FORMAT " does not exist (model.layers = %d)",
                       s->where, layer, cfg->pub.shape.n_layers);
              return FALSE;
            }
          for (gsize e = 0; e < d; e++)
            if (s->pub.dense_layers[e] == layer)
              {
                sift_config_fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID, s->dense_at.src ? &s->dense_at : NULL,
                         file, "%s.dense_layers: layer %" G_GINT64_FORMAT " is listed twice", s->where, layer);
                return FALSE;
              }
        }
      for (int phase = 0; phase < 2 && registry != NULL; phase++)
        if (sift_config_setup_choice (s, phase)->ops == NULL && !sift_config_resolve_choice (s, phase, registry, file, error))
          return FALSE;
    }
  return TRUE;
}

gboolean
sift_config_validate (Config *cfg, SiftRegistry *registry, GError **error)
{
  SiftConfig *p = &cfg->pub;
  const char *file = p->file;
  SiftModelShape *shape = &p->shape;
#define INVALID(at, ...) (sift_config_fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID, at, file, __VA_ARGS__), FALSE)
  if (shape->n_q_heads % shape->n_kv_heads != 0)
    return INVALID (LATEST (pub.shape.n_kv_heads, pub.shape.n_q_heads),
                    "model.kv_heads = %d does not divide model.q_heads = %d", shape->n_kv_heads, shape->n_q_heads);
  if (shape->chunk_size % shape->block_size != 0)
    return INVALID (LATEST (pub.shape.chunk_size, pub.shape.block_size),
                    "kv.chunk_size = %d is not a multiple of kv.block_size = %d", shape->chunk_size,
                    shape->block_size);
  /* Then each owner's checks, in section order. */
  for (guint i = 0; i < cfg->instances->len; i++)
    {
      const Instance *in = cfg->instances->pdata[i];
      if (in->section->check != NULL && !in->section->check (p, in->values, error))
        return FALSE;
    }
#undef INVALID
  if (!validate_setups (cfg, registry, error))
    return FALSE;

  shape->scale = sift_attn_scale ((float) cfg->scale, shape->head_dim);
  return TRUE;
}
