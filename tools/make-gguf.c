/* sift-make-gguf: writes a seeded random-weight GGUF model (built in the
 * build tree for tests, benches and comparisons with llama.cpp; not installed).
 *   sift-make-gguf --arch qwen3 --type Q4_K --seed 7 OUT.gguf
 *   sift-make-gguf --shape llama-3.2-1b --type Q8_0 OUT.gguf */
#include <stdio.h>
#include <string.h>

#include "random-model.h"

static gboolean
type_from_name (const char *name, GgufTensorType *out)
{
  for (int t = 0; t < GGUF_TENSOR_TYPE_COUNT; t++)
    if (gguf_tensor_type_name (t) != NULL && g_ascii_strcasecmp (name, gguf_tensor_type_name (t)) == 0)
      {
        *out = t;
        return TRUE;
      }
  return FALSE;
}

int
main (int argc, char **argv)
{
  g_autofree char *arch = NULL, *type_name = NULL, *shape = NULL, *scaling = NULL;
  gint64 seed = 1;
  int layers = 0, vocab = 0, ctx = 0;
  gboolean tied = FALSE;
  double factor = 0;
  GOptionEntry entries[] = {
    { "arch", 'a', 0, G_OPTION_ARG_STRING, &arch, "llama, qwen2 or qwen3 (llama)", "ARCH" },
    { "type", 't', 0, G_OPTION_ARG_STRING, &type_name, "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K (F32)", "TYPE" },
    { "seed", 's', 0, G_OPTION_ARG_INT64, &seed, "seed (1)", "N" },
    { "shape", 0, 0, G_OPTION_ARG_STRING, &shape, "tiny (default) or llama-3.2-1b", "NAME" },
    { "layers", 0, 0, G_OPTION_ARG_INT, &layers, "override the layer count", "N" },
    { "vocab", 0, 0, G_OPTION_ARG_INT, &vocab, "override the vocabulary size", "N" },
    { "context", 0, 0, G_OPTION_ARG_INT, &ctx, "override the context length", "N" },
    { "rope-scaling", 0, 0, G_OPTION_ARG_STRING, &scaling, "none, linear, yarn, llama3", "KIND" },
    { "rope-factor", 0, 0, G_OPTION_ARG_DOUBLE, &factor, "rope scaling factor", "X" },
    { "tied", 0, 0, G_OPTION_ARG_NONE, &tied, "no output.weight (logits from token_embd)", NULL },
    G_OPTION_ENTRY_NULL,
  };
  g_autoptr (GOptionContext) ctx_opt = g_option_context_new ("OUT.gguf");
  g_option_context_add_main_entries (ctx_opt, entries, NULL);
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (ctx_opt, &argc, &argv, &error) || argc != 2)
    {
      fprintf (stderr, "sift-make-gguf: %s\n", error ? error->message : "one output file expected");
      return 2;
    }
  GgufTensorType type = GGUF_TENSOR_F32;
  if (type_name != NULL && !type_from_name (type_name, &type))
    {
      fprintf (stderr, "sift-make-gguf: unknown type '%s'\n", type_name);
      return 2;
    }
  GgufRandomModel m;
  gguf_random_model_init (&m, arch ? arch : "llama", type, (guint64) seed);
  if (shape != NULL && g_str_equal (shape, "llama-3.2-1b"))
    {
      m.n_layers = 16, m.n_embd = 2048, m.n_ff = 8192, m.n_heads = 32, m.n_kv_heads = 8;
      m.head_dim = 64, m.n_vocab = 128256, m.n_ctx = 131072, m.rope_base = 500000, m.tied = TRUE;
      m.rope_scaling = "llama3", m.rope_factor = 32, m.rope_orig_ctx = 8192;
    }
  else if (shape != NULL && !g_str_equal (shape, "tiny"))
    {
      fprintf (stderr, "sift-make-gguf: unknown shape '%s' (tiny, llama-3.2-1b)\n", shape);
      return 2;
    }
  if (layers > 0)
    m.n_layers = layers;
  if (vocab > 0)
    m.n_vocab = vocab;
  if (ctx > 0)
    m.n_ctx = ctx;
  if (scaling != NULL)
    {
      m.rope_scaling = scaling;
      m.rope_factor = factor > 0 ? (float) factor : 4;
      m.rope_orig_ctx = m.n_ctx / 4;
    }
  m.tied = m.tied || tied;
  if (!gguf_random_model_write (&m, argv[1], &error))
    {
      fprintf (stderr, "sift-make-gguf: %s\n", error->message);
      return 1;
    }
  return 0;
}
