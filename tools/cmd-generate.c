/* sift generate --model FILE.gguf --prompt TEXT [-n N] [--config FILE]... [--set KEY=VALUE]...
 * Greedy generation through the runner: the config's first policy setup,
 * store and pipeline, exactly as for the synthetic model. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include <glib/gstdio.h>
#include <sift/sift.h>

#include "cli.h"
#include "commands.h"
#include "gguf-model.h"
#include "harness/harness.h"

/* "1,2,3" -> ids. */
static gboolean
parse_tokens (const char *text, GArray *ids, GError **error)
{
  g_auto (GStrv) parts = g_strsplit (text, ",", -1);
  for (char **p = parts; *p != NULL; p++)
    {
      gint64 v;
      if (!g_ascii_string_to_signed (g_strstrip (*p), 10, 0, G_MAXINT32, &v, error))
        return FALSE;
      gint32 id = (gint32) v;
      g_array_append_val (ids, id);
    }
  return TRUE;
}

static SiftModel *
open_model (const SiftConfig *cfg, const char *path, HarnessPipeline *p, GError **error)
{
  g_autoptr (SiftModel) model = sift_model_gguf_new (path, cfg->shape.block_size, cfg->shape.chunk_size,
                                                     cfg->shape.scale, error);
  if (model == NULL || !harness_check_model_shape (cfg, path, model, error)
      || !sift_model_gguf_use_device (model, sift_offload_config (cfg)->device, error))
    return NULL;
  const SiftOffloadConfig *off = sift_offload_config (cfg);
  g_autofree char *store = off->store_path != NULL ? g_strdup (off->store_path)
                                                    : g_build_filename (g_get_tmp_dir (), "sift-generate-kv.store", NULL);
  /* The config's first setup, store and pipeline, as for the synthetic model. */
  if (!harness_pipeline_init (p, cfg, g_ptr_array_index (cfg->setups, 0), model, store, error))
    return NULL;
  return g_steal_pointer (&model);
}

static void
print_counters (const SiftEngine *engine, SiftPhase phase, const char *name)
{
  SiftCounters c;
  sift_engine_counters (engine, -1, phase, &c);
  printf ("%-8s loaded %.2f MiB, stored %.2f MiB, blocks %" G_GUINT64_FORMAT "/%" G_GUINT64_FORMAT
          ", density %.3f, compute %.3f s, stalled %.3f s\n",
          name, c.bytes_loaded / 1048576.0, c.bytes_stored / 1048576.0, c.blocks_selected, c.blocks_available,
          c.tokens_available > 0 ? (double) c.tokens_attended / c.tokens_available : 1.0, c.seconds_compute,
          c.seconds_stalled);
}

static int
generate (const SiftConfig *cfg, const char *path, const char *prompt, const char *token_list, gint n_new)
{
  g_autoptr (GError) error = NULL;
  HarnessPipeline p = { 0 };
  HarnessGeneration gen = { 0 };
  g_autoptr (SiftModel) model = NULL;
  g_autoptr (SiftTokenizer) tok = NULL;
  g_autoptr (GArray) ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  if ((model = open_model (cfg, path, &p, &error)) == NULL)
    goto fail;
  GgufFile *f = llama_model_gguf (sift_model_gguf_llama (model));
  if (gguf_find (f, "tokenizer.ggml.model") != NULL && (tok = llama_tokenizer_from_gguf (f, &error)) == NULL)
    goto fail;
  if (token_list != NULL ? !parse_tokens (token_list, ids, &error)
      : tok == NULL ? (g_set_error (&error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_MISSING,
                                    "%s: no tokenizer in the file: give --tokens", path), TRUE)
                    : !sift_tokenizer_encode (tok, prompt, -1, SIFT_TOKENIZE_ADD_SPECIAL | SIFT_TOKENIZE_PARSE_SPECIAL,
                                              ids, &error))
    goto fail;
  if (ids->len == 0)
    {
      g_set_error (&error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID, "the prompt has no tokens");
      goto fail;
    }
  if (!harness_generate (p.runner, model, tok, (const gint32 *) ids->data, ids->len, n_new, &gen, &error))
    goto fail;
  if (tok != NULL)
    {
      g_autofree char *valid = g_utf8_make_valid (gen.text->str, (gssize) gen.text->len);
      printf ("%s%s\n", prompt != NULL ? prompt : "", valid);
    }
  printf ("tokens  ");
  for (guint i = 0; i < gen.ids->len; i++)
    printf ("%s%d", i ? "," : "", g_array_index (gen.ids, gint32, i));
  double pre = gen.prefill_seconds, dec = gen.decode_seconds;
  printf ("\nprefill %u tokens in %.3f s (%.1f tokens/s); decode %" G_GINT64_FORMAT " tokens in %.3f s (%.1f tokens/s)\n",
          ids->len, pre, ids->len / MAX (pre, 1e-9), gen.n_decoded, dec, gen.n_decoded / MAX (dec, 1e-9));
  const LlamaConfig *c = llama_model_config (sift_model_gguf_llama (model));
  gint64 positions = sift_runner_position (p.runner);
  double weights = llama_model_weight_bytes (sift_model_gguf_llama (model)) / 1048576.0;
  double kv = (double) positions * 2 * c->n_layers * c->n_kv_heads * c->head_dim
              * sift_dtype_row_bytes (sift_kv_config (cfg)->store_dtype, 32) / 32 / 1048576.0;
  printf ("memory  weights %.2f MiB, KV %.2f MiB (%" G_GINT64_FORMAT " positions, %s store)", weights, kv, positions,
          sift_dtype_name (sift_kv_config (cfg)->store_dtype));
  /* The process's peak resident set so far (getrusage's ru_maxrss, KiB on
   * Linux): everything it touched, mapped file pages included. */
  struct rusage ru;
  if (getrusage (RUSAGE_SELF, &ru) == 0 && ru.ru_maxrss > 0)
    printf (", peak resident %.2f MiB (%+.1f%% over weights + KV)", ru.ru_maxrss / 1024.0,
            100.0 * (ru.ru_maxrss / 1024.0 / (weights + kv) - 1.0));
  printf ("\n");
  print_counters (p.engine, SIFT_PHASE_PREFILL, "prefill");
  print_counters (p.engine, SIFT_PHASE_DECODE, "decode");
  harness_generation_clear (&gen);
  harness_pipeline_clear (&p);
  return SIFT_EXIT_OK;

fail:
  harness_generation_clear (&gen);
  harness_pipeline_clear (&p);
  return sift_cli_fail ("generate", error);
}

int
sift_cmd_generate (int argc, char **argv)
{
  SiftCliOptions opts = { 0 };
  g_autofree char *model = NULL, *prompt = NULL, *tokens = NULL;
  gint n_new = 32;
  GOptionEntry entries[] = {
    { "model", 'm', 0, G_OPTION_ARG_FILENAME, &model, "GGUF model (else the config's model.path)", "FILE" },
    { "prompt", 'p', 0, G_OPTION_ARG_STRING, &prompt, "prompt text", "TEXT" },
    { "tokens", 0, 0, G_OPTION_ARG_STRING, &tokens, "prompt as token ids instead of text", "ID,ID,..." },
    { "n-predict", 'n', 0, G_OPTION_ARG_INT, &n_new, "tokens to generate (32)", "N" },
    SIFT_CLI_POLICY_PATH_ENTRY (&opts), SIFT_CLI_CONFIG_ENTRY (&opts), SIFT_CLI_SET_ENTRY (&opts),
    G_OPTION_ENTRY_NULL,
  };
  if (!sift_cli_parse ("generate", "--model FILE.gguf --prompt TEXT", entries, &argc, &argv))
    return SIFT_EXIT_USAGE;
  if ((prompt == NULL) == (tokens == NULL) || n_new < 1 || argc != 1)
    {
      fprintf (stderr, "sift generate: give --prompt TEXT or --tokens IDS (one of them), -n >= 1\n");
      sift_cli_options_clear (&opts);
      return SIFT_EXIT_USAGE;
    }
  g_autoptr (SiftRegistry) registry = sift_cli_registry (&opts);
  g_autoptr (GError) error = NULL;
  g_autoptr (SiftConfig) config = sift_cli_load_config (&opts, registry, sift_cli_default_config (), &error);
  sift_cli_options_clear (&opts);
  if (config == NULL)
    return sift_cli_fail ("generate", error);
  const char *path = model != NULL ? model : sift_gguf_config (config)->path;
  if (path == NULL || path[0] == 0)
    {
      fprintf (stderr, "sift generate: no model: give --model FILE.gguf (or model.source: gguf and model.path)\n");
      return SIFT_EXIT_USAGE;
    }
  return generate (config, path, prompt, tokens, n_new);
}
