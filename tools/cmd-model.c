/* sift model info FILE.gguf: what a GGUF file holds and whether sift runs it. */
#include <stdio.h>
#include <string.h>

#include <sift/error.h>

#include "cli.h"
#include "commands.h"
#include "gguf.h"
#include "llama.h"

static const char *
meta_string (const GgufFile *f, const char *key, const char *def)
{
  const GgufValue *v = gguf_find (f, key);
  return v != NULL && v->type == GGUF_TYPE_STRING ? v->str.s : def;
}

static gint64
meta_array_len (const GgufFile *f, const char *key)
{
  const GgufValue *v = gguf_find (f, key);
  return v != NULL && v->type == GGUF_TYPE_ARRAY ? (gint64) v->arr.n : -1;
}

static gint64
meta_int (const GgufFile *f, const char *key)
{
  gint64 x;
  return gguf_find (f, key) != NULL && gguf_get_int (f, key, &x, NULL) ? x : -1;
}

static void
print_tensor_types (const GgufFile *f)
{
  guint64 count[GGUF_TENSOR_TYPE_COUNT] = { 0 }, bytes[GGUF_TENSOR_TYPE_COUNT] = { 0 }, total = 0;
  for (guint64 i = 0; i < gguf_n_tensors (f); i++)
    {
      const GgufTensor *t = gguf_tensor (f, i);
      count[t->type]++;
      bytes[t->type] += t->n_bytes;
      total += t->n_bytes;
    }
  printf ("tensors       %" G_GUINT64_FORMAT ", %.2f MiB\n", gguf_n_tensors (f), total / 1048576.0);
  for (int t = 0; t < GGUF_TENSOR_TYPE_COUNT; t++)
    if (count[t] > 0)
      printf ("  %-8s    %5" G_GUINT64_FORMAT " tensors %12" G_GUINT64_FORMAT " bytes\n",
              gguf_tensor_type_name (t), count[t], bytes[t]);
}

static void
print_tokenizer (const GgufFile *f)
{
  const char *model = meta_string (f, "tokenizer.ggml.model", NULL);
  if (model == NULL)
    {
      printf ("tokenizer     none\n");
      return;
    }
  printf ("tokenizer     %s (pre-tokenizer %s), %" G_GINT64_FORMAT " tokens", model,
          meta_string (f, "tokenizer.ggml.pre", "default"), meta_array_len (f, "tokenizer.ggml.tokens"));
  gint64 merges = meta_array_len (f, "tokenizer.ggml.merges");
  if (merges >= 0)
    printf (", %" G_GINT64_FORMAT " merges", merges);
  gint64 bos = meta_int (f, "tokenizer.ggml.bos_token_id"), eos = meta_int (f, "tokenizer.ggml.eos_token_id");
  if (bos >= 0)
    printf (", bos %" G_GINT64_FORMAT, bos);
  if (eos >= 0)
    printf (", eos %" G_GINT64_FORMAT, eos);
  printf ("\n");
}

static const char *
scaling_name (LlamaRopeScaling s)
{
  return s == LLAMA_ROPE_SCALING_LINEAR ? "linear" : s == LLAMA_ROPE_SCALING_YARN ? "yarn" : "none";
}

static int
model_info (const char *path)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GgufFile) f = gguf_open (path, &error);
  if (f == NULL)
    return sift_cli_fail ("model info", error);
  const char *arch = meta_string (f, "general.architecture", "(none)");
  printf ("file          %s\n", path);
  printf ("format        GGUF v%u, %" G_GUINT64_FORMAT " metadata keys, alignment %u, %.2f MiB\n",
          gguf_version (f), gguf_n_kv (f), gguf_alignment (f), gguf_file_size (f) / 1048576.0);
  printf ("name          %s\n", meta_string (f, "general.name", "(none)"));
  printf ("architecture  %s\n", arch);
  print_tensor_types (f);
  print_tokenizer (f);

  g_autoptr (LlamaModel) m = llama_model_open_checked (path, &error);
  if (m == NULL)
    {
      printf ("runnable      no\n");
      return sift_cli_fail ("model info", error);
    }
  const LlamaConfig *c = llama_model_config (m);
  printf ("shape         %d layers, %d wide, %d heads (%d kv) of %d, FFN %d, vocab %d%s\n",
          c->n_layers, c->n_embd, c->n_heads, c->n_kv_heads, c->head_dim, c->n_ff, c->n_vocab,
          c->tied ? ", tied output" : "");
  printf ("context       %" G_GINT64_FORMAT " tokens\n", c->n_ctx);
  printf ("rope          %s, %d dims, base %g, scaling %s", c->rope.style == LLAMA_ROPE_NORM ? "norm" : "neox",
          c->rope.n_rot, c->rope.base, scaling_name (c->rope.scaling));
  if (c->rope.scaling != LLAMA_ROPE_SCALING_NONE)
    printf (" (factor %g, original context %" G_GINT64_FORMAT ")", 1 / c->rope.freq_scale, c->rope.orig_ctx);
  if (c->rope.freq_factors != NULL)
    printf (", frequency factors (rope_freqs)");
  printf ("\nnorm eps      %g\n", c->eps);
  printf ("weights       %.2f MiB; KV cache %.1f KiB per token (f32)\n", llama_model_weight_bytes (m) / 1048576.0,
          2.0 * c->n_layers * c->n_kv_heads * c->head_dim * sizeof (float) / 1024.0);
  printf ("runnable      yes\n");
  return SIFT_EXIT_OK;
}

int
sift_cmd_model (int argc, char **argv)
{
  GOptionEntry entries[] = { G_OPTION_ENTRY_NULL };
  if (!sift_cli_parse ("model", "info FILE.gguf", entries, &argc, &argv))
    return SIFT_EXIT_USAGE;
  if (argc != 3 || strcmp (argv[1], "info") != 0)
    {
      fprintf (stderr, "usage: sift model info FILE.gguf\n");
      return SIFT_EXIT_USAGE;
    }
  return model_info (argv[2]);
}
