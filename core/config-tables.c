/* Core's own key tables: the model's shape and source (one of the sources
 * the models register), the KV block and chunk sizes (model, kv), and the
 * policy setups. The other keys are the tables their owners register
 * (config.h, "Sections"); docs/config.md mirrors them all (a test checks
 * every key is documented). */
#include <stddef.h>

#include "config-private.h"

#define OFF(field) offsetof (Config, field)
#define SOFF(field) offsetof (Setup, field)
#define NO_RANGE SIFT_CONFIG_NO_RANGE

static const Key model_keys[] = {
  { "source", KEY_SOURCE, OFF (pub.source), 0, NO_RANGE, NULL, NULL, "where q, k, v come from: a model source the models register" },
  { "layers", KEY_INT32, OFF (pub.shape.n_layers), 0, 1, 4096, NULL, "2", "transformer layers" },
  { "q_heads", KEY_INT32, OFF (pub.shape.n_q_heads), 0, 1, 4096, NULL, "8", "query heads" },
  { "kv_heads", KEY_INT32, OFF (pub.shape.n_kv_heads), 0, 1, 4096, NULL, "2", "key/value heads (divides q_heads)" },
  { "head_dim", KEY_INT32, OFF (pub.shape.head_dim), 0, 1, 4096, NULL, "64", "dims per head" },
  { "scale", KEY_FLOAT, OFF (scale), 0, 0, 1e6, NULL, "0.0", "attention scale (0: 1/sqrt(head_dim))" },
  { NULL },
};

static const Key kv_keys[] = {
  { "block_size", KEY_INT32, OFF (pub.shape.block_size), 0, 1, 1 << 16, NULL, "64", "tokens per stored KV block" },
  { "chunk_size", KEY_INT32, OFF (pub.shape.chunk_size), 0, 1, 1 << 24, NULL, "512", "prefill tokens per chunk (a multiple of block_size)" },
  { NULL },
};

const SiftConfigSection sift_config_core_sections[] = {
  { "model", 0, "the model source and its shape", 0, model_keys, NULL },
  { "kv", 100, "KV blocks and dtypes", 0, kv_keys, NULL },
};
const gsize sift_config_n_core_sections = G_N_ELEMENTS (sift_config_core_sections);

/* Written between the sections ordered below 500 and the rest. */
const Key sift_config_root_keys[] = {
  { "policy", KEY_SETUP, 0, 0, NO_RANGE, NULL, NULL, "one policy setup (or use policies)" },
  { "policies", KEY_SETUPS, 0, 0, NO_RANGE, NULL, NULL, "a list of policy setups compared side by side" },
  { NULL },
};

const Key sift_config_setup_keys[] = {
  { "label", KEY_LABEL, SOFF (pub.label), 0, NO_RANGE, NULL, NULL, "<prefill>+<decode>, or the name both share; the column's name" },
  { "prefill", KEY_CHOICE, SOFF (pub.prefill), 0, NO_RANGE, NULL, "full", "NAME or {name: NAME, params: {...}}" },
  { "decode", KEY_CHOICE, SOFF (pub.decode), 0, NO_RANGE, NULL, "full", "NAME or {name: NAME, params: {...}}" },
  { "dense_layers", KEY_INT_LIST, SOFF (pub.dense_layers), SOFF (pub.n_dense_layers), 0, 1 << 20, NULL, "[]", "layers forced dense in both phases" },
  { "capacity_tokens", KEY_INT, SOFF (pub.capacity_tokens), 0, -1, 1e18, NULL, "-1", "this setup's KV budget (kv.capacity_tokens for it; -1: kv.capacity_tokens; 0: unbounded)" },
  { NULL },
};
