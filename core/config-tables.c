/* The config's key tables: one per section, with types, ranges and defaults.
 * docs/config.md mirrors them (a test checks every key is documented). */
#include <stddef.h>

#include "config-private.h"

#define OFF(field) offsetof (Config, field)
#define SOFF(field) offsetof (Setup, field)
#define NO_RANGE 1.0, 0.0
#define BIG 1e18

const EnumValue sift_config_dtype_values[] = {
  { "f32", SIFT_DTYPE_F32 }, { "f16", SIFT_DTYPE_F16 }, { "bf16", SIFT_DTYPE_BF16 }, { "q8_0", SIFT_DTYPE_Q8_0 },
  { NULL, 0 },
};
static const EnumValue compute_dtypes[] = {
  { "f32", SIFT_DTYPE_F32 }, { "f16", SIFT_DTYPE_F16 }, { "bf16", SIFT_DTYPE_BF16 }, { NULL, 0 },
};
static const EnumValue sources[] = { { "synthetic", 0 }, { "random", 0 }, { "gguf", 0 }, { NULL, 0 } };
static const EnumValue stores[] = { { "host", 0 }, { "file", 0 }, { NULL, 0 } };
static const EnumValue pipelines[] = {
  { "ring", SIFT_PIPELINE_RING }, { "cross_layer", SIFT_PIPELINE_CROSS_LAYER }, { NULL, 0 },
};
static const EnumValue granularities[] = {
  { "token", SIFT_EVICT_TOKEN }, { "block", SIFT_EVICT_BLOCK }, { NULL, 0 },
};
static const EnumValue spacings[] = {
  { "explicit", SIFT_SPACING_EXPLICIT }, { "linear", SIFT_SPACING_LINEAR }, { "sigmoid", SIFT_SPACING_SIGMOID },
  { NULL, 0 },
};
static const EnumValue depth_spans[] = {
  { "interior", SIFT_DEPTH_INTERIOR }, { "full", SIFT_DEPTH_FULL }, { NULL, 0 },
};
static const EnumValue needle_values[] = {
  { "number", SIFT_NEEDLE_VALUE_NUMBER }, { "word", SIFT_NEEDLE_VALUE_WORD }, { "uuid", SIFT_NEEDLE_VALUE_UUID },
  { NULL, 0 },
};
static const EnumValue planted[] = { { "matched", FALSE }, { "exact", TRUE }, { NULL, 0 } };
static const EnumValue needles[] = {
  { "single", SIFT_NEEDLE_SINGLE }, { "multikey", SIFT_NEEDLE_MULTIKEY },
  { "multivalue", SIFT_NEEDLE_MULTIVALUE }, { "multiquery", SIFT_NEEDLE_MULTIQUERY }, { NULL, 0 },
};

static const Key synthetic_keys[] = {
  { "sink_tokens", KEY_INT, OFF (pub.synthetic.sink_tokens), 0, 0, 1 << 20, NULL, NULL, "4; first tokens every query attends to (0: off)" },
  { "sink_strength", KEY_FLOAT, OFF (pub.synthetic.sink_strength), 0, 0, 1e3, NULL, NULL, "11.5; logit boost of sink keys" },
  { "locality", KEY_FLOAT, OFF (pub.synthetic.locality), 0, 0, 1e3, NULL, NULL, "2.0; strength of the rotary recency bias (0: off)" },
  { "locality_scale", KEY_FLOAT, OFF (pub.synthetic.locality_scale), 0, 1e-3, 1e9, NULL, NULL, "64.0; tokens over which recency decays" },
  { "heavy_hitters", KEY_INT, OFF (pub.synthetic.heavy_hitters), 0, 0, 1 << 20, NULL, NULL, "8; columns that attract attention everywhere (0: off)" },
  { "heavy_hitter_strength", KEY_FLOAT, OFF (pub.synthetic.heavy_hitter_strength), 0, 0, 1e3, NULL, NULL, "9.5; logit boost of heavy-hitter keys" },
  { "rope_dims", KEY_INT, OFF (pub.synthetic.rope_dims), 0, 0, 4096, NULL, NULL, "32; dims with rotary embedding (even, <= head_dim; 0: none)" },
  { "rope_base", KEY_FLOAT, OFF (pub.synthetic.rope_base), 0, 1.0, 1e12, NULL, NULL, "10000.0; rotary base" },
  { "retrieval_heads", KEY_FLOAT, OFF (pub.synthetic.retrieval_heads), 0, 0, 1, NULL, NULL, "0.25; fraction of heads whose question attends to the needle" },
  { "needle_strength", KEY_FLOAT, OFF (pub.synthetic.needle_strength), 0, 0, 1e3, NULL, NULL, "16.0; logit of question . needle key in retrieval heads" },
  { "noise", KEY_FLOAT, OFF (pub.synthetic.noise), 0, 0, 1e3, NULL, NULL, "0.8; scale of the random part of q and k" },
  { "drift", KEY_FLOAT, OFF (pub.synthetic.drift), 0, 0, 1e3, NULL, NULL, "6.0; logit of the drifting content q and k share at one position (0: off)" },
  { "drift_scale", KEY_FLOAT, OFF (pub.synthetic.drift_scale), 0, 1, 1e9, NULL, NULL, "64.0; tokens over which the drifting content decorrelates" },
  { "planted_keys", KEY_ENUM, OFF (pub.synthetic.planted_exact), 0, NO_RANGE, planted, NULL, "matched; needle and distractor keys: matched (an ordinary key's noise and norm) | exact (clean, fixed norm: the former model)" },
  { "logn_length", KEY_INT, OFF (pub.synthetic.logn_length), 0, 0, BIG, NULL, NULL, "0; from this length on, queries are scaled by ln(p + 1) / ln(logn_length) (0: off)" },
  { NULL },
};

static const Key model_keys[] = {
  { "source", KEY_STRING, OFF (pub.source), 0, NO_RANGE, sources, NULL, "synthetic; where q, k, v come from: synthetic | random | gguf" },
  { "path", KEY_STRING, OFF (pub.model_path), 0, NO_RANGE, NULL, NULL, "(none); the GGUF file of model.source gguf" },
  { "layers", KEY_INT32, OFF (pub.shape.n_layers), 0, 1, 4096, NULL, NULL, "2; transformer layers" },
  { "q_heads", KEY_INT32, OFF (pub.shape.n_q_heads), 0, 1, 4096, NULL, NULL, "8; query heads" },
  { "kv_heads", KEY_INT32, OFF (pub.shape.n_kv_heads), 0, 1, 4096, NULL, NULL, "2; key/value heads (divides q_heads)" },
  { "head_dim", KEY_INT32, OFF (pub.shape.head_dim), 0, 1, 4096, NULL, NULL, "64; dims per head" },
  { "scale", KEY_FLOAT, OFF (scale), 0, 0, 1e6, NULL, NULL, "0.0; attention scale (0: 1/sqrt(head_dim))" },
  { "seed", KEY_UINT64, OFF (pub.seed), 0, NO_RANGE, NULL, NULL, "1; model source seed" },
  { "synthetic", KEY_SECTION, 0, 0, NO_RANGE, NULL, synthetic_keys, "knobs of the synthetic source" },
  { NULL },
};

static const Key kv_keys[] = {
  { "block_size", KEY_INT32, OFF (pub.shape.block_size), 0, 1, 1 << 16, NULL, NULL, "64; tokens per stored KV block" },
  { "chunk_size", KEY_INT32, OFF (pub.shape.chunk_size), 0, 1, 1 << 24, NULL, NULL, "512; prefill tokens per chunk (a multiple of block_size)" },
  { "store_dtype", KEY_ENUM, OFF (pub.store_dtype), 0, NO_RANGE, sift_config_dtype_values, NULL, "f16; dtype of stored blocks: f32 | f16 | bf16 | q8_0" },
  { "compute_dtype", KEY_ENUM, OFF (pub.compute_dtype), 0, NO_RANGE, compute_dtypes, NULL, "f32; dtype of compute-side buffers: f32 | f16 | bf16" },
  { "capacity_tokens", KEY_INT, OFF (pub.capacity_tokens), 0, 0, BIG, NULL, NULL, "0; stored KV tokens kept per layer, evicting beyond (0: unbounded)" },
  { "evict_granularity", KEY_ENUM, OFF (pub.evict_granularity), 0, NO_RANGE, granularities, NULL, "token; what eviction removes: token (blocks compacted) | block" },
  { "protect_sinks", KEY_INT, OFF (pub.protect_sinks), 0, 0, BIG, NULL, NULL, "4; first tokens never evicted" },
  { "protect_recent", KEY_INT, OFF (pub.protect_recent), 0, 0, BIG, NULL, NULL, "64; most recent tokens never evicted" },
  { NULL },
};

static const Key offload_keys[] = {
  { "store", KEY_STRING, OFF (pub.store), 0, NO_RANGE, stores, NULL, "host; the tier holding stored blocks: host | file" },
  { "path", KEY_STRING, OFF (store_path), 0, NO_RANGE, NULL, NULL, "<harness.out>/kv.store; the file store's backing file" },
  { "keep", KEY_BOOL, OFF (pub.store_keep), 0, NO_RANGE, NULL, NULL, "false; keep the file store's file afterwards" },
  { "direct", KEY_BOOL, OFF (pub.store_direct), 0, NO_RANGE, NULL, NULL, "false; O_DIRECT for the file store" },
  { "ring_slots", KEY_INT32, OFF (pub.ring_slots), 0, 2, 1024, NULL, NULL, "4; compute-side ring slots of one block each (>= 2)" },
  { "pipeline", KEY_ENUM, OFF (pub.pipeline), 0, NO_RANGE, pipelines, NULL, "ring; decode loading: ring | cross_layer" },
  { "force_copy", KEY_BOOL, OFF (pub.force_copy), 0, NO_RANGE, NULL, NULL, "false; copy every ring load, even where the host store's blocks could be read in place (zero-copy)" },
  { NULL },
};

static const Key harness_keys[] = {
  { "lengths", KEY_INT_LIST, OFF (pub.harness.lengths), OFF (pub.harness.n_lengths), 1, BIG, NULL, NULL, "[1024, 2048, 4096]; context lengths (length_spacing: explicit)" },
  { "length_spacing", KEY_ENUM, OFF (pub.harness.length_spacing), 0, NO_RANGE, spacings, NULL, "explicit; explicit | linear | sigmoid (from length_min, length_max, length_count)" },
  { "length_min", KEY_INT, OFF (pub.harness.length_min), 0, 1, BIG, NULL, NULL, "1024; shortest length for linear/sigmoid spacing" },
  { "length_max", KEY_INT, OFF (pub.harness.length_max), 0, 1, BIG, NULL, NULL, "4096; longest length for linear/sigmoid spacing" },
  { "length_count", KEY_INT, OFF (pub.harness.length_count), 0, 1, 1000, NULL, NULL, "3; lengths for linear/sigmoid spacing" },
  { "depths", KEY_FLOAT_LIST, OFF (pub.harness.depths), OFF (pub.harness.n_depths), 0, 1, NULL, NULL, "[0.0, 0.25, 0.5, 0.75, 1.0]; needle depths as fractions of the context" },
  { "depth_spacing", KEY_ENUM, OFF (pub.harness.depth_spacing), 0, NO_RANGE, spacings, NULL, "explicit; explicit | linear | sigmoid (depth_count over [0, 1])" },
  { "depth_count", KEY_INT, OFF (pub.harness.depth_count), 0, 1, 1000, NULL, NULL, "5; depths for linear/sigmoid spacing" },
  { "depth_span", KEY_ENUM, OFF (pub.harness.depth_span), 0, NO_RANGE, depth_spans, NULL, "interior; where depths 0..1 fall: interior (between the first block and the last before the question) | full (the whole haystack)" },
  { "baseline_seeds", KEY_INT, OFF (pub.harness.baseline_seeds), 0, 0, 32, NULL, NULL, "5; random-baseline selections drawn per cell (0: no baseline)" },
  { "needle", KEY_ENUM, OFF (pub.harness.needle), 0, NO_RANGE, needles, NULL, "single; single | multikey | multivalue | multiquery" },
  { "n_distractors", KEY_INT, OFF (pub.harness.n_distractors), 0, 0, 64, NULL, NULL, "3; distractor needles (multikey)" },
  { "n_values", KEY_INT, OFF (pub.harness.n_values), 0, 1, 64, NULL, NULL, "3; values of the one key (multivalue)" },
  { "n_queries", KEY_INT, OFF (pub.harness.n_queries), 0, 1, 64, NULL, NULL, "2; needles asked for (multiquery)" },
  { "value", KEY_ENUM, OFF (pub.harness.value), 0, NO_RANGE, needle_values, NULL, "number; a text needle's value (model.source gguf): number | word | uuid" },
  { "haystack", KEY_STRING, OFF (pub.harness.haystack), 0, NO_RANGE, NULL, NULL, "(none: the King James Bible from Debian's bible-kjv); a text file whose sentences fill a text haystack (model.source gguf)" },
  { "question_tokens", KEY_INT, OFF (pub.harness.question_tokens), 0, 1, 1 << 16, NULL, NULL, "4; last tokens of the prompt that ask" },
  { "decode_steps", KEY_INT, OFF (pub.harness.decode_steps), 0, 0, 1 << 24, NULL, NULL, "8; decode steps after prefill" },
  { "capacities", KEY_INT_LIST, OFF (pub.harness.capacities), OFF (pub.harness.n_capacities), 0, BIG, NULL, NULL, "[]; KV budgets swept (kv.capacity_tokens per run; 0: unbounded); empty: kv.capacity_tokens alone" },
  { "min_accuracy", KEY_FLOAT, OFF (pub.harness.min_accuracy), 0, 0, 1, NULL, NULL, "0.0; exit 1 below this fraction of cells passed" },
  { "seed", KEY_UINT64, OFF (pub.harness.seed), 0, NO_RANGE, NULL, NULL, "1; needle placement and values" },
  { "out", KEY_STRING, OFF (pub.harness.out_dir), 0, NO_RANGE, NULL, NULL, "sift-out; output directory" },
  { NULL },
};

const Key sift_config_root_keys[] = {
  { "model", KEY_SECTION, 0, 0, NO_RANGE, NULL, model_keys, "the model source and its shape" },
  { "kv", KEY_SECTION, 0, 0, NO_RANGE, NULL, kv_keys, "KV blocks and dtypes" },
  { "offload", KEY_SECTION, 0, 0, NO_RANGE, NULL, offload_keys, "the store and the compute-side ring" },
  { "policy", KEY_SETUP, 0, 0, NO_RANGE, NULL, NULL, "one policy setup (or use policies)" },
  { "policies", KEY_SETUPS, 0, 0, NO_RANGE, NULL, NULL, "a list of policy setups compared side by side" },
  { "harness", KEY_SECTION, 0, 0, NO_RANGE, NULL, harness_keys, "the needle grid" },
  { NULL },
};

const Key sift_config_setup_keys[] = {
  { "label", KEY_LABEL, SOFF (pub.label), 0, NO_RANGE, NULL, NULL, "<prefill>+<decode>, or the name both share; the column's name" },
  { "prefill", KEY_CHOICE, SOFF (pub.prefill), 0, NO_RANGE, NULL, NULL, "full; NAME or {name: NAME, params: {...}}" },
  { "decode", KEY_CHOICE, SOFF (pub.decode), 0, NO_RANGE, NULL, NULL, "full; NAME or {name: NAME, params: {...}}" },
  { "dense_layers", KEY_INT_LIST, SOFF (pub.dense_layers), SOFF (pub.n_dense_layers), 0, 1 << 20, NULL, NULL, "[]; layers forced dense in both phases" },
  { "capacity_tokens", KEY_INT, SOFF (pub.capacity_tokens), 0, -1, BIG, NULL, NULL, "-1; this setup's KV budget (kv.capacity_tokens for it; -1: kv.capacity_tokens; 0: unbounded)" },
  { NULL },
};

void
sift_config_init_defaults (Config *c)
{
  SiftConfig *p = &c->pub;
  p->source = g_strdup ("synthetic");
  p->shape = (SiftModelShape) { .n_layers = 2, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = 64,
                                .block_size = 64, .chunk_size = 512, .scale = 0.0f };
  c->scale = 0.0;
  p->seed = 1;
  p->synthetic = (SiftSyntheticConfig) {
    .sink_tokens = 4, .sink_strength = 11.5, .locality = 2.0, .locality_scale = 64.0,
    .heavy_hitters = 8, .heavy_hitter_strength = 9.5, .rope_dims = 32, .rope_base = 10000.0,
    .retrieval_heads = 0.25, .needle_strength = 16.0, .noise = 0.8, .drift = 6.0, .drift_scale = 64.0,
  };
  p->store_dtype = SIFT_DTYPE_F16;
  p->compute_dtype = SIFT_DTYPE_F32;
  p->capacity_tokens = 0;
  p->evict_granularity = SIFT_EVICT_TOKEN;
  p->protect_sinks = 4;
  p->protect_recent = 64;
  p->store = g_strdup ("host");
  p->ring_slots = 4;
  p->pipeline = SIFT_PIPELINE_RING;
  SiftHarnessConfig *h = &p->harness;
  static const gint64 lengths[] = { 1024, 2048, 4096 };
  static const double depths[] = { 0.0, 0.25, 0.5, 0.75, 1.0 };
  h->lengths = g_memdup2 (lengths, sizeof lengths);
  h->n_lengths = G_N_ELEMENTS (lengths);
  h->length_spacing = SIFT_SPACING_EXPLICIT;
  h->length_min = 1024;
  h->length_max = 4096;
  h->length_count = 3;
  h->depths = g_memdup2 (depths, sizeof depths);
  h->n_depths = G_N_ELEMENTS (depths);
  h->depth_spacing = SIFT_SPACING_EXPLICIT;
  h->depth_count = 5;
  h->needle = SIFT_NEEDLE_SINGLE;
  h->n_distractors = 3;
  h->n_values = 3;
  h->n_queries = 2;
  h->question_tokens = 4;
  h->decode_steps = 8;
  h->min_accuracy = 0.0;
  h->seed = 1;
  h->baseline_seeds = 5;
  h->depth_span = SIFT_DEPTH_INTERIOR;
  h->out_dir = g_strdup ("sift-out");
}
