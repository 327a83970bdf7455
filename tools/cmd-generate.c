/* sift generate --model FILE.gguf --prompt TEXT [-n N] [--config FILE]... [--set KEY=VALUE]...
 * Greedy generation through the runner: the config's first policy setup,
 * store and pipeline, exactly as for the synthetic model. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <glib/gstdio.h>
#include <sift/sift.h>

#include "cli.h"
#include "commands.h"
#include "gguf-model.h"

static SiftStore *
make_store (const SiftConfig *cfg, const SiftModelShape *shape, GError **error)
{
  const SiftOffloadConfig *off = sift_offload_config (cfg);
  g_autofree char *path = off->store_path != NULL ? g_strdup (off->store_path)
                                                  : g_build_filename (g_get_tmp_dir (), "sift-generate-kv.store", NULL);
  SiftStoreConfig sc = {
    .dtype = sift_kv_config (cfg)->store_dtype, .n_kv_heads = shape->n_kv_heads, .block_size = shape->block_size,
    .head_dim = shape->head_dim, .path = path, .keep = off->store_keep, .direct = off->store_direct,
  };
  return g_strcmp0 (off->store, "file") == 0 ? sift_store_file_new (&sc, error) : sift_store_host_new (&sc, error);
}

static gboolean
dense_layer (const SiftPolicySetup *s, gint32 l)
{
  for (gsize i = 0; i < s->n_dense_layers; i++)
    if (s->dense_layers[i] == l)
      return TRUE;
  return FALSE;
}

static gint32
argmax (const float *x, gint32 n)
{
  gint32 best = 0;
  for (gint32 i = 1; i < n; i++)
    if (x[i] > x[best])
      best = i;
  return best;
}

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

typedef struct {
  SiftModel *model;
  SiftStore *store;
  SiftEngine *engine;
  SiftRunner *runner;
  SiftPolicy **prefill, **decode;
  gint32 n_layers;
} Pipeline;

static void
pipeline_clear (Pipeline *p)
{
  sift_runner_free (p->runner);
  for (gint32 l = 0; l < p->n_layers; l++)
    {
      if (p->prefill != NULL)
        sift_policy_free (p->prefill[l]);
      if (p->decode != NULL)
        sift_policy_free (p->decode[l]);
    }
  g_free (p->prefill);
  g_free (p->decode);
  sift_engine_free (p->engine);
  sift_store_free (p->store);
  sift_model_free (p->model);
}

/* A config for a GGUF model (model.source: gguf) takes the model's shape
 * from the file; a shape key it writes must say what the file says, or the
 * run stops with both values (issue 19). The rope base, norm epsilon and
 * context length have no config keys: they come from the file alone. A
 * config for another source (the default one is synthetic) describes
 * another model, so its shape is not compared. */
static gboolean
check_shape (const SiftConfig *cfg, const char *path, const SiftModelShape *file, GError **error)
{
  if (g_strcmp0 (cfg->source, "gguf") != 0)
    return TRUE;
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

static gboolean
pipeline_init (Pipeline *p, const SiftConfig *cfg, const char *path, GError **error)
{
  p->model = sift_model_gguf_new (path, cfg->shape.block_size, cfg->shape.chunk_size, cfg->shape.scale, error);
  if (p->model == NULL || !check_shape (cfg, path, &p->model->shape, error))
    return FALSE;
  SiftModelShape shape = p->model->shape;
  p->n_layers = shape.n_layers;
  p->store = make_store (cfg, &shape, error);
  if (p->store == NULL)
    return FALSE;
  const SiftKvConfig *kv = sift_kv_config (cfg);
  const SiftOffloadConfig *off = sift_offload_config (cfg);
  SiftEngineConfig ec = {
    .shape = shape, .compute_dtype = kv->compute_dtype, .n_slots = off->ring_slots, .pipeline = off->pipeline,
  };
  SiftEvictConfig ev = { kv->capacity_tokens, kv->evict_granularity, kv->protect_sinks, kv->protect_recent };
  p->engine = sift_engine_new (&ec, p->store, error);
  if (p->engine == NULL || !sift_engine_set_eviction (p->engine, &ev, error))
    return FALSE;
  const SiftPolicySetup *s = g_ptr_array_index (cfg->setups, 0);
  p->prefill = g_new0 (SiftPolicy *, shape.n_layers);
  p->decode = g_new0 (SiftPolicy *, shape.n_layers);
  for (gint32 l = 0; l < shape.n_layers; l++)
    if (!dense_layer (s, l))
      {
        p->prefill[l] = sift_policy_new (s->prefill.ops, s->prefill.params, &shape, error);
        if (p->prefill[l] == NULL)
          return FALSE;
        p->decode[l] = sift_policy_new (s->decode.ops, s->decode.params, &shape, error);
        if (p->decode[l] == NULL)
          return FALSE;
      }
  p->runner = sift_runner_new (p->engine, p->model, p->prefill, p->decode, error);
  return p->runner != NULL;
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
  Pipeline p = { 0 };
  int status = SIFT_EXIT_OK;
  g_autoptr (SiftTokenizer) tok = NULL;
  g_autoptr (GArray) ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  g_autoptr (GString) text = g_string_new ("");
  g_autoptr (GArray) out = g_array_new (FALSE, FALSE, sizeof (gint32));
  g_autofree float *logits = NULL;
  if (!pipeline_init (&p, cfg, path, &error))
    goto fail;
  GgufFile *f = llama_model_gguf (sift_model_gguf_llama (p.model));
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
  gint32 n_vocab = p.model->n_vocab;
  logits = g_new (float, n_vocab);
  gint64 t0 = g_get_monotonic_time ();
  if (!sift_runner_prefill (p.runner, ids->len, (const gint32 *) ids->data, logits, &error))
    goto fail;
  gint64 t1 = g_get_monotonic_time ();
  gint n_decoded = 0;
  for (gint i = 0; i < n_new; i++)
    {
      gint32 next = argmax (logits, n_vocab);
      g_array_append_val (out, next);
      if (tok != NULL)
        {
          if (sift_tokenizer_is_eog (tok, next))
            break;
          sift_tokenizer_piece (tok, next, FALSE, text);
        }
      if (i + 1 == n_new)
        break;
      if (!sift_runner_decode (p.runner, 1, &next, logits, &error))
        goto fail;
      n_decoded++;
    }
  gint64 t2 = g_get_monotonic_time ();
  if (tok != NULL)
    {
      g_autofree char *valid = g_utf8_make_valid (text->str, (gssize) text->len);
      printf ("%s%s\n", prompt != NULL ? prompt : "", valid);
    }
  printf ("tokens  ");
  for (guint i = 0; i < out->len; i++)
    printf ("%s%d", i ? "," : "", g_array_index (out, gint32, i));
  double pre = (t1 - t0) / 1e6, dec = (t2 - t1) / 1e6;
  printf ("\nprefill %u tokens in %.3f s (%.1f tokens/s); decode %d tokens in %.3f s (%.1f tokens/s)\n",
          ids->len, pre, ids->len / MAX (pre, 1e-9), n_decoded, dec, n_decoded / MAX (dec, 1e-9));
  const LlamaConfig *c = llama_model_config (sift_model_gguf_llama (p.model));
  gint64 positions = sift_runner_position (p.runner);
  printf ("memory  weights %.2f MiB, KV %.2f MiB (%" G_GINT64_FORMAT " positions, %s store)\n",
          llama_model_weight_bytes (sift_model_gguf_llama (p.model)) / 1048576.0,
          (double) positions * 2 * c->n_layers * c->n_kv_heads * c->head_dim * sift_dtype_row_bytes (sift_kv_config (cfg)->store_dtype, 32) / 32 / 1048576.0,
          positions, sift_dtype_name (sift_kv_config (cfg)->store_dtype));
  print_counters (p.engine, SIFT_PHASE_PREFILL, "prefill");
  print_counters (p.engine, SIFT_PHASE_DECODE, "decode");
  pipeline_clear (&p);
  return status;

fail:
  pipeline_clear (&p);
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
