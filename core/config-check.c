/* The config's checks across keys, after every document and --set. */
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

/* The fields that size what a run keeps in memory. */
static const gsize memory_keys[] = {
  G_STRUCT_OFFSET (Config, pub.shape.n_layers),   G_STRUCT_OFFSET (Config, pub.shape.n_q_heads),
  G_STRUCT_OFFSET (Config, pub.shape.n_kv_heads), G_STRUCT_OFFSET (Config, pub.shape.head_dim),
  G_STRUCT_OFFSET (Config, pub.shape.block_size), G_STRUCT_OFFSET (Config, pub.shape.chunk_size),
  G_STRUCT_OFFSET (Config, pub.ring_slots),       G_STRUCT_OFFSET (Config, pub.store),
  G_STRUCT_OFFSET (Config, pub.store_dtype),      G_STRUCT_OFFSET (Config, pub.compute_dtype),
  G_STRUCT_OFFSET (Config, pub.harness.lengths),  G_STRUCT_OFFSET (Config, pub.harness.length_max),
  G_STRUCT_OFFSET (Config, pub.harness.decode_steps),
};

static char *
size_text (double bytes)
{
  return g_format_size ((guint64) MIN (bytes, 1.8e19));
}

#define AT(field) sift_config_origin_at (cfg, G_STRUCT_OFFSET (Config, field))
#define LATEST(a, b) \
  sift_config_latest_of (cfg, (const gsize[]){ G_STRUCT_OFFSET (Config, a), G_STRUCT_OFFSET (Config, b) }, 2)

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
      /* A setup's own KV budget holds the protected tokens, as kv.capacity_tokens must. */
      const SiftConfig *p = &cfg->pub;
      gint64 need = p->protect_sinks + p->protect_recent + p->shape.block_size
                    + (p->evict_granularity == SIFT_EVICT_BLOCK ? 2 * (gint64) p->shape.block_size : 0);
      if (s->pub.capacity_tokens > 0 && s->pub.capacity_tokens < need)
        {
          sift_config_fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID, s->at.src ? &s->at : NULL, file,
                   "%s.capacity_tokens = %" G_GINT64_FORMAT " cannot hold the %" G_GINT64_FORMAT
                   " protected sink and recent tokens and one block (at least %" G_GINT64_FORMAT " needed)",
                   s->where, s->pub.capacity_tokens, p->protect_sinks + p->protect_recent, need);
          return FALSE;
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
  if (p->store_dtype == SIFT_DTYPE_Q8_0 && shape->head_dim % SIFT_Q8_0_BLOCK != 0)
    return INVALID (LATEST (pub.store_dtype, pub.shape.head_dim),
                    "kv.store_dtype q8_0 packs rows in blocks of %d, but model.head_dim = %d is not a multiple of it",
                    SIFT_Q8_0_BLOCK, shape->head_dim);
  if (g_strcmp0 (p->source, "gguf") == 0 && (p->model_path == NULL || p->model_path[0] == 0))
    return (sift_config_fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_MISSING, AT (pub.source), file,
                                 "model.source is gguf but model.path (the GGUF file) is not given"), FALSE);
  if (g_strcmp0 (p->source, "synthetic") == 0)
    {
      gint64 rope = p->synthetic.rope_dims;
      if (rope % 2 != 0 || rope > shape->head_dim)
        return INVALID (LATEST (pub.synthetic.rope_dims, pub.shape.head_dim),
                        "model.synthetic.rope_dims = %" G_GINT64_FORMAT " must be even and at most model.head_dim = %d",
                        rope, shape->head_dim);
    }
  SiftHarnessConfig *h = &p->harness;
  if (h->length_spacing == SIFT_SPACING_EXPLICIT && h->n_lengths == 0)
    return (sift_config_fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_MISSING, AT (pub.harness.lengths), file,
                     "harness.lengths is empty (give lengths, or length_spacing linear/sigmoid)"), FALSE);
  if (h->length_spacing != SIFT_SPACING_EXPLICIT && h->length_min > h->length_max)
    return INVALID (LATEST (pub.harness.length_min, pub.harness.length_max),
                    "harness.length_min = %" G_GINT64_FORMAT " is above harness.length_max = %" G_GINT64_FORMAT,
                    h->length_min, h->length_max);
  if (h->depth_spacing == SIFT_SPACING_EXPLICIT && h->n_depths == 0)
    return (sift_config_fail_at (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_MISSING, AT (pub.harness.depths), file,
                     "harness.depths is empty (give depths, or depth_spacing linear/sigmoid)"), FALSE);
  gint64 shortest = G_MAXINT64, longest = 0;
  if (h->length_spacing == SIFT_SPACING_EXPLICIT)
    for (gsize i = 0; i < h->n_lengths; i++)
      {
        shortest = MIN (shortest, h->lengths[i]);
        longest = MAX (longest, h->lengths[i]);
      }
  else
    {
      shortest = h->length_min;
      longest = h->length_max;
    }
  if (shortest <= h->question_tokens)
    return INVALID (LATEST (pub.harness.lengths, pub.harness.question_tokens),
                    "a context of %" G_GINT64_FORMAT " tokens leaves no room for the needle before the %"
                    G_GINT64_FORMAT " question tokens", shortest, h->question_tokens);
  /* A bounded cache evicts; it must hold the protected tokens and the
   * block just offloaded (docs/eviction.md). */
  const gint64 need = p->protect_sinks + p->protect_recent + shape->block_size
                      + (p->evict_granularity == SIFT_EVICT_BLOCK ? 2 * (gint64) shape->block_size : 0);
  if (p->capacity_tokens > 0 && p->capacity_tokens < need)
    return INVALID (LATEST (pub.capacity_tokens, pub.protect_recent),
                    "kv.capacity_tokens = %" G_GINT64_FORMAT " cannot hold %" G_GINT64_FORMAT
                    " protected sink and %" G_GINT64_FORMAT " recent tokens with %s eviction of %d-token blocks"
                    " (at least %" G_GINT64_FORMAT " needed)",
                    p->capacity_tokens, p->protect_sinks, p->protect_recent,
                    p->evict_granularity == SIFT_EVICT_BLOCK ? "block" : "token", shape->block_size, need);
  for (gsize i = 0; i < h->n_capacities; i++)
    if (h->capacities[i] > 0 && h->capacities[i] < need)
      return INVALID (AT (pub.harness.capacities),
                      "harness.capacities has %" G_GINT64_FORMAT ", below the %" G_GINT64_FORMAT
                      " tokens the protected sinks, recent window and one block need",
                      h->capacities[i], need);
  SiftConfigMemory mem;
  sift_config_memory_estimate (p, longest, &mem);
  if (mem.machine > 0 && mem.engine + mem.store > mem.machine)
    {
      g_autofree char *need = size_text (mem.engine + mem.store);
      g_autofree char *engine = size_text (mem.engine);
      g_autofree char *store = size_text (mem.store);
      g_autofree char *machine = size_text (mem.machine);
      return INVALID (sift_config_latest_of (cfg, memory_keys, G_N_ELEMENTS (memory_keys)),
                      "this config needs about %s of memory at once (%s of buffers, %s of KV in the host store for "
                      "%" G_GINT64_FORMAT " tokens), more than this machine's %s: make model.layers, the heads, "
                      "model.head_dim, kv.chunk_size or harness.lengths smaller%s",
                      need, engine, store, longest, machine,
                      mem.store > 0 ? ", or keep the KV in a file (offload.store: file)" : "");
    }
#undef INVALID
  if (!validate_setups (cfg, registry, error))
    return FALSE;

  shape->scale = sift_attn_scale ((float) cfg->scale, shape->head_dim);
  /* An unset offload.path stays unset: the harness derives it from the output
   * directory it really uses (`--out` may move it after validation). */
  g_free (p->store_path);
  p->store_path = g_strdup (cfg->store_path);
  return TRUE;
}
