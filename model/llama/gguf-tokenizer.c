/* The tokenizer of a GGUF file: its tokenizer.ggml.* metadata as a
 * SiftTokenizerSpec. */
#include <sift/error.h>

#include "llama.h"

/* An optional id key: -1 when absent. */
static gboolean
opt_id (const GgufFile *f, const char *key, gint32 *out, GError **error)
{
  *out = -1;
  if (gguf_find (f, key) == NULL)
    return TRUE;
  guint32 v;
  if (!gguf_get_uint32 (f, key, &v, error))
    return FALSE;
  *out = v > G_MAXINT32 ? G_MAXINT32 : (gint32) v; /* out of range: the tokenizer names it */
  return TRUE;
}

static gboolean
opt_flag (const GgufFile *f, const char *key, gint8 *out, GError **error)
{
  *out = -1;
  gboolean b;
  if (gguf_find (f, key) == NULL)
    return TRUE;
  if (!gguf_get_bool (f, key, &b, error))
    return FALSE;
  *out = b ? 1 : 0;
  return TRUE;
}

SiftTokenizer *
llama_tokenizer_from_gguf (const GgufFile *f, GError **error)
{
  SiftTokenizerSpec spec = SIFT_TOKENIZER_SPEC_INIT;
  spec.source = gguf_path (f);
  const GgufArray *tokens, *scores = NULL, *types = NULL, *merges = NULL;
  if (!gguf_get_string (f, "tokenizer.ggml.model", &spec.model, error)
      || !gguf_get_array (f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tokens, error))
    return NULL;
  if (gguf_find (f, "tokenizer.ggml.pre") != NULL && !gguf_get_string (f, "tokenizer.ggml.pre", &spec.pre, error))
    return NULL;
  if ((gguf_find (f, "tokenizer.ggml.scores") != NULL
       && !gguf_get_array (f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &scores, error))
      || (gguf_find (f, "tokenizer.ggml.token_type") != NULL
          && !gguf_get_array (f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, error))
      || (gguf_find (f, "tokenizer.ggml.merges") != NULL
          && !gguf_get_array (f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges, error)))
    return NULL;
  if (tokens->n > G_MAXINT32 || (scores && scores->n != tokens->n) || (types && types->n != tokens->n)
      || (merges && merges->n > G_MAXINT32))
    {
      g_set_error (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_FORMAT,
                   "%s: tokenizer arrays disagree: %" G_GUINT64_FORMAT " tokens, %" G_GUINT64_FORMAT
                   " scores, %" G_GUINT64_FORMAT " token types", gguf_path (f), tokens->n,
                   scores ? scores->n : 0, types ? types->n : 0);
      return NULL;
    }
  spec.tokens = tokens->strings;
  spec.n_tokens = (gint32) tokens->n;
  /* The file's arrays are packed and maybe unaligned: copy them out. */
  g_autofree float *score_copy = NULL;
  g_autofree gint32 *type_copy = NULL;
  if (scores != NULL)
    {
      score_copy = g_new (float, tokens->n);
      for (guint64 i = 0; i < tokens->n; i++)
        score_copy[i] = (float) gguf_array_float (scores, i);
      spec.scores = score_copy;
    }
  if (types != NULL)
    {
      type_copy = g_new (gint32, tokens->n);
      for (guint64 i = 0; i < tokens->n; i++)
        type_copy[i] = (gint32) gguf_array_int (types, i);
      spec.token_types = type_copy;
    }
  if (merges != NULL)
    {
      spec.merges = merges->strings;
      spec.n_merges = (gint32) merges->n;
    }
  if (!opt_id (f, "tokenizer.ggml.bos_token_id", &spec.bos_id, error)
      || !opt_id (f, "tokenizer.ggml.eos_token_id", &spec.eos_id, error)
      || !opt_id (f, "tokenizer.ggml.unknown_token_id", &spec.unk_id, error)
      || !opt_id (f, "tokenizer.ggml.padding_token_id", &spec.pad_id, error)
      || !opt_flag (f, "tokenizer.ggml.add_bos_token", &spec.add_bos, error)
      || !opt_flag (f, "tokenizer.ggml.add_eos_token", &spec.add_eos, error)
      || !opt_flag (f, "tokenizer.ggml.add_space_prefix", &spec.add_space_prefix, error))
    return NULL;
  SiftTokenizer *tok = sift_tokenizer_new (&spec, error);
  gguf_drop_metadata_pages (f); /* the scores and types read above */
  return tok;
}
