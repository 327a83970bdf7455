/* The synthetic model's part of the config: its sources' names
 * (model.source synthetic and random), their seed (model.seed) and the
 * synthetic source's knobs (model.synthetic); the key tables are the one
 * place for their defaults. */
#include <stddef.h>

#include <sift/error.h>

#include "synthetic.h"

#define OFF(field) offsetof (SiftSyntheticConfig, field)
#define NO_RANGE SIFT_CONFIG_NO_RANGE
#define BIG 1e18

static const SiftConfigEnumValue planted[] = { { "matched", FALSE }, { "exact", TRUE }, { NULL, 0 } };

static const SiftConfigKey synthetic_keys[] = {
  { "sink_tokens", SIFT_CONFIG_KEY_INT, OFF (sink_tokens), 0, 0, 1 << 20, NULL, "4", "first tokens every query attends to (0: off)" },
  { "sink_strength", SIFT_CONFIG_KEY_FLOAT, OFF (sink_strength), 0, 0, 1e3, NULL, "11.5", "logit boost of sink keys" },
  { "locality", SIFT_CONFIG_KEY_FLOAT, OFF (locality), 0, 0, 1e3, NULL, "2.0", "strength of the rotary recency bias (0: off)" },
  { "locality_scale", SIFT_CONFIG_KEY_FLOAT, OFF (locality_scale), 0, 1e-3, 1e9, NULL, "64.0", "tokens over which recency decays" },
  { "heavy_hitters", SIFT_CONFIG_KEY_INT, OFF (heavy_hitters), 0, 0, 1 << 20, NULL, "8", "columns that attract attention everywhere (0: off)" },
  { "heavy_hitter_strength", SIFT_CONFIG_KEY_FLOAT, OFF (heavy_hitter_strength), 0, 0, 1e3, NULL, "9.5", "logit boost of heavy-hitter keys" },
  { "rope_dims", SIFT_CONFIG_KEY_INT, OFF (rope_dims), 0, 0, 4096, NULL, "32", "dims with rotary embedding (even, <= head_dim; 0: none)" },
  { "rope_base", SIFT_CONFIG_KEY_FLOAT, OFF (rope_base), 0, 1.0, 1e12, NULL, "10000.0", "rotary base" },
  { "retrieval_heads", SIFT_CONFIG_KEY_FLOAT, OFF (retrieval_heads), 0, 0, 1, NULL, "0.25", "fraction of heads whose question attends to the needle" },
  { "needle_strength", SIFT_CONFIG_KEY_FLOAT, OFF (needle_strength), 0, 0, 1e3, NULL, "16.0", "logit of question . needle key in retrieval heads" },
  { "noise", SIFT_CONFIG_KEY_FLOAT, OFF (noise), 0, 0, 1e3, NULL, "0.8", "scale of the random part of q and k" },
  { "drift", SIFT_CONFIG_KEY_FLOAT, OFF (drift), 0, 0, 1e3, NULL, "6.0", "logit of the drifting content q and k share at one position (0: off)" },
  { "drift_scale", SIFT_CONFIG_KEY_FLOAT, OFF (drift_scale), 0, 1, 1e9, NULL, "64.0", "tokens over which the drifting content decorrelates" },
  { "planted_keys", SIFT_CONFIG_KEY_ENUM, OFF (planted_exact), 0, NO_RANGE, planted, "matched", "needle and distractor keys: matched (an ordinary key's noise and norm) | exact (clean, fixed norm: the former model)" },
  { "logn_length", SIFT_CONFIG_KEY_INT, OFF (logn_length), 0, 0, BIG, NULL, "0", "from this length on, queries are scaled by ln(p + 1) / ln(logn_length) (0: off)" },
  { NULL },
};

static gboolean
check (const SiftConfig *config, gconstpointer values, GError **error)
{
  const SiftSyntheticConfig *k = values;
  gint64 rope = k->rope_dims;
  if (g_strcmp0 (config->source, "synthetic") == 0 && (rope % 2 != 0 || rope > config->shape.head_dim))
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_INVALID,
                             (const char *const[]) { "model.synthetic.rope_dims", "model.head_dim", NULL },
                             "model.synthetic.rope_dims = %" G_GINT64_FORMAT " must be even and at most"
                             " model.head_dim = %d", rope, config->shape.head_dim);
  return TRUE;
}

const SiftConfigSection sift_synthetic_config_section = {
  "model.synthetic", 30, "knobs of the synthetic source", sizeof (SiftSyntheticConfig), synthetic_keys, check,
};

static const SiftConfigKey seed_keys[] = {
  { "seed", SIFT_CONFIG_KEY_UINT64, offsetof (SiftSyntheticSeedConfig, seed), 0, NO_RANGE, NULL, "1", "seed of the synthetic and random sources" },
  { NULL },
};

const SiftConfigSection sift_synthetic_seed_section = {
  "model", 5, "the model source and its shape", sizeof (SiftSyntheticSeedConfig), seed_keys, NULL,
};

static const SiftConfigModelSource sources[] = {
  { "synthetic", "the seeded attention model (model.synthetic: its knobs)", TRUE },
  { "random", "q, k, v drawn at random from model.seed", FALSE },
};

void
sift_synthetic_config_register (void)
{
  for (gsize i = 0; i < G_N_ELEMENTS (sources); i++)
    sift_config_register_model_source (&sources[i]);
  sift_config_register_section (&sift_synthetic_seed_section);
  sift_config_register_section (&sift_synthetic_config_section);
}

/* A section's values, or an error naming the call that was missed. */
static gconstpointer
section_of (const SiftConfig *config, const SiftConfigSection *section)
{
  gconstpointer values = sift_config_get_section (config, section);
  if (values == NULL)
    g_error ("%s: made before sift_synthetic_config_register () was called", config->file);
  return values;
}

const SiftSyntheticConfig *
sift_synthetic_config (const SiftConfig *config)
{
  return section_of (config, &sift_synthetic_config_section);
}

guint64
sift_synthetic_seed (const SiftConfig *config)
{
  return ((const SiftSyntheticSeedConfig *) section_of (config, &sift_synthetic_seed_section))->seed;
}

void
sift_synthetic_config_defaults (SiftSyntheticConfig *knobs)
{
  *knobs = (SiftSyntheticConfig) { 0 };
  sift_config_section_init (&sift_synthetic_config_section, knobs);
}
