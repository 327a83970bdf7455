/* harness.*: the needle grid's keys (the one place for their defaults),
 * and the checks a run needs across sections: the lengths against the
 * question, the swept KV budgets against eviction, the memory a run holds. */
#include <stddef.h>

#include "harness-config.h"

#include "gguf-model.h"

#define OFF(field) offsetof (SiftHarnessConfig, field)
#define NO_RANGE SIFT_CONFIG_NO_RANGE
#define BIG 1e18
#define KEYS(...) ((const char *const[]) { __VA_ARGS__, NULL })

static const SiftConfigEnumValue spacings[] = {
  { "explicit", SIFT_SPACING_EXPLICIT }, { "linear", SIFT_SPACING_LINEAR }, { "sigmoid", SIFT_SPACING_SIGMOID },
  { NULL, 0 },
};
static const SiftConfigEnumValue depth_spans[] = {
  { "interior", SIFT_DEPTH_INTERIOR }, { "full", SIFT_DEPTH_FULL }, { NULL, 0 },
};
static const SiftConfigEnumValue needles[] = {
  { "single", SIFT_NEEDLE_SINGLE }, { "multikey", SIFT_NEEDLE_MULTIKEY },
  { "multivalue", SIFT_NEEDLE_MULTIVALUE }, { "multiquery", SIFT_NEEDLE_MULTIQUERY }, { NULL, 0 },
};

static const SiftConfigEnumValue needle_values[] = {
  { "number", SIFT_NEEDLE_VALUE_NUMBER }, { "word", SIFT_NEEDLE_VALUE_WORD }, { "uuid", SIFT_NEEDLE_VALUE_UUID },
  { NULL, 0 },
};

static const SiftConfigKey harness_keys[] = {
  { "lengths", SIFT_CONFIG_KEY_INT_LIST, OFF (lengths), OFF (n_lengths), 1, BIG, NULL, "[1024, 2048, 4096]", "context lengths (length_spacing: explicit)" },
  { "length_spacing", SIFT_CONFIG_KEY_ENUM, OFF (length_spacing), 0, NO_RANGE, spacings, "explicit", "explicit | linear | sigmoid (from length_min, length_max, length_count)" },
  { "length_min", SIFT_CONFIG_KEY_INT, OFF (length_min), 0, 1, BIG, NULL, "1024", "shortest length for linear/sigmoid spacing" },
  { "length_max", SIFT_CONFIG_KEY_INT, OFF (length_max), 0, 1, BIG, NULL, "4096", "longest length for linear/sigmoid spacing" },
  { "length_count", SIFT_CONFIG_KEY_INT, OFF (length_count), 0, 1, 1000, NULL, "3", "lengths for linear/sigmoid spacing" },
  { "depths", SIFT_CONFIG_KEY_FLOAT_LIST, OFF (depths), OFF (n_depths), 0, 1, NULL, "[0.0, 0.25, 0.5, 0.75, 1.0]", "needle depths as fractions of the context" },
  { "depth_spacing", SIFT_CONFIG_KEY_ENUM, OFF (depth_spacing), 0, NO_RANGE, spacings, "explicit", "explicit | linear | sigmoid (depth_count over [0, 1])" },
  { "depth_count", SIFT_CONFIG_KEY_INT, OFF (depth_count), 0, 1, 1000, NULL, "5", "depths for linear/sigmoid spacing" },
  { "depth_span", SIFT_CONFIG_KEY_ENUM, OFF (depth_span), 0, NO_RANGE, depth_spans, "interior", "where depths 0..1 fall: interior (between the first block and the last before the question) | full (the whole haystack)" },
  { "baseline_seeds", SIFT_CONFIG_KEY_INT, OFF (baseline_seeds), 0, 0, 32, NULL, "5", "random-baseline draws per cell (0: none): random blocks, or random eviction over a bounded cache" },
  { "needle", SIFT_CONFIG_KEY_ENUM, OFF (needle), 0, NO_RANGE, needles, "single", "single | multikey | multivalue | multiquery" },
  { "n_distractors", SIFT_CONFIG_KEY_INT, OFF (n_distractors), 0, 0, 64, NULL, "3", "distractor needles (multikey)" },
  { "n_values", SIFT_CONFIG_KEY_INT, OFF (n_values), 0, 1, 64, NULL, "3", "values of the one key (multivalue)" },
  { "n_queries", SIFT_CONFIG_KEY_INT, OFF (n_queries), 0, 1, 64, NULL, "2", "needles asked for (multiquery)" },
  { "value", SIFT_CONFIG_KEY_ENUM, OFF (value), 0, NO_RANGE, needle_values, "number", "a text needle's value (model.source gguf): number | word | uuid" },
  { "haystack", SIFT_CONFIG_KEY_STRING, OFF (haystack), 0, NO_RANGE, NULL, NULL, "a text file whose sentences fill a text haystack (model.source gguf; unset: the King James Bible from Debian's bible-kjv)" },
  { "question_tokens", SIFT_CONFIG_KEY_INT, OFF (question_tokens), 0, 1, 1 << 16, NULL, "4", "last tokens of the prompt that ask" },
  { "decode_steps", SIFT_CONFIG_KEY_INT, OFF (decode_steps), 0, 0, 1 << 24, NULL, "8", "decode steps after prefill" },
  { "capacities", SIFT_CONFIG_KEY_INT_LIST, OFF (capacities), OFF (n_capacities), 0, BIG, NULL, "[]", "KV budgets swept (kv.capacity_tokens per run; 0: unbounded); empty: kv.capacity_tokens alone" },
  { "min_accuracy", SIFT_CONFIG_KEY_FLOAT, OFF (min_accuracy), 0, 0, 1, NULL, "0.0", "exit 1 below this fraction of cells passed" },
  { "seed", SIFT_CONFIG_KEY_UINT64, OFF (seed), 0, NO_RANGE, NULL, "1", "needle placement and values" },
  { "out", SIFT_CONFIG_KEY_STRING, OFF (out_dir), 0, NO_RANGE, NULL, "sift-out", "output directory" },
  { NULL },
};

static char *
size_text (double bytes)
{
  return g_format_size ((guint64) MIN (bytes, 1.8e19));
}

static gboolean
check (const SiftConfig *config, gconstpointer values, GError **error)
{
  const SiftHarnessConfig *h = values;
  const SiftKvConfig *kv = sift_kv_config (config);
  if (h->length_spacing == SIFT_SPACING_EXPLICIT && h->n_lengths == 0)
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_MISSING, KEYS ("harness.lengths"),
                             "harness.lengths is empty (give lengths, or length_spacing linear/sigmoid)");
  if (h->length_spacing != SIFT_SPACING_EXPLICIT && h->length_min > h->length_max)
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_INVALID, KEYS ("harness.length_min", "harness.length_max"),
                             "harness.length_min = %" G_GINT64_FORMAT " is above harness.length_max = %" G_GINT64_FORMAT,
                             h->length_min, h->length_max);
  if (h->depth_spacing == SIFT_SPACING_EXPLICIT && h->n_depths == 0)
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_MISSING, KEYS ("harness.depths"),
                             "harness.depths is empty (give depths, or depth_spacing linear/sigmoid)");
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
    return sift_config_fail (config, error, SIFT_CONFIG_ERROR_INVALID,
                             KEYS ("harness.lengths", "harness.question_tokens"),
                             "a context of %" G_GINT64_FORMAT " tokens leaves no room for the needle before the %"
                             G_GINT64_FORMAT " question tokens", shortest, h->question_tokens);
  const gint64 need = sift_kv_config_min_capacity (kv, &config->shape);
  for (gsize i = 0; i < h->n_capacities; i++)
    if (h->capacities[i] > 0 && h->capacities[i] < need)
      return sift_config_fail (config, error, SIFT_CONFIG_ERROR_INVALID, KEYS ("harness.capacities"),
                               "harness.capacities has %" G_GINT64_FORMAT ", below the %" G_GINT64_FORMAT
                               " tokens the protected sinks, recent window and one block need",
                               h->capacities[i], need);
  HarnessMemory mem;
  harness_memory_estimate (config, longest, &mem);
  if (mem.machine > 0 && mem.engine + mem.store > mem.machine)
    {
      g_autofree char *all = size_text (mem.engine + mem.store);
      g_autofree char *engine = size_text (mem.engine);
      g_autofree char *store = size_text (mem.store);
      g_autofree char *machine = size_text (mem.machine);
      /* Placed at whichever key sizing memory was written last. */
      return sift_config_fail (config, error, SIFT_CONFIG_ERROR_INVALID,
                               KEYS ("model.layers", "model.q_heads", "model.kv_heads", "model.head_dim",
                                     "kv.block_size", "kv.chunk_size", "offload.ring_slots", "offload.store",
                                     "kv.store_dtype", "kv.compute_dtype", "harness.lengths", "harness.length_max",
                                     "harness.decode_steps"),
                               "this config needs about %s of memory at once (%s of buffers, %s of KV in the host "
                               "store for %" G_GINT64_FORMAT " tokens), more than this machine's %s: make "
                               "model.layers, the heads, model.head_dim, kv.chunk_size or harness.lengths smaller%s",
                               all, engine, store, longest, machine,
                               mem.store > 0 ? ", or keep the KV in a file (offload.store: file)" : "");
    }
  return TRUE;
}

const SiftConfigSection sift_harness_config_section = {
  "harness", 600, "the needle grid", sizeof (SiftHarnessConfig), harness_keys, check,
};

void
sift_harness_config_register (void)
{
  sift_synthetic_config_register ();
  sift_gguf_config_register ();
  sift_config_register_section (&sift_harness_config_section);
}

const SiftHarnessConfig *
sift_harness_config (const SiftConfig *config)
{
  const SiftHarnessConfig *values = sift_config_get_section (config, &sift_harness_config_section);
  if (values == NULL)
    g_error ("%s: made before sift_harness_config_register () was called", config->file);
  return values;
}
