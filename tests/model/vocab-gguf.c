/* vocab-gguf OUT_DIR: writes the vocabularies of vocab.c as vocabulary-only
 * GGUF files (a one-layer "llama" shape and no tensors, which is what
 * llama.cpp's vocab_only loading reads) and each corpus text as
 * case-N.txt, so that another tokenizer can encode the same texts with the same
 * vocabularies. docs/model.md ("Tokenizers") says how tokenizer-ref.txt was
 * made from them. Not run by the test suite. */
#include <stdio.h>

#include "gguf-writer.h"
#include "vocab.h"

static gboolean
write_gguf (const char *path, const SiftTokenizerSpec *s, GError **error)
{
  g_autoptr (GgufWriter) w = gguf_writer_new (3, 32);
  gguf_writer_add_string (w, "general.architecture", "llama");
  gguf_writer_add_u32 (w, "llama.context_length", 512);
  gguf_writer_add_u32 (w, "llama.embedding_length", 64);
  gguf_writer_add_u32 (w, "llama.block_count", 1);
  gguf_writer_add_u32 (w, "llama.feed_forward_length", 128);
  gguf_writer_add_u32 (w, "llama.attention.head_count", 2);
  gguf_writer_add_f32 (w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  gguf_writer_add_string (w, "tokenizer.ggml.model", s->model);
  if (s->pre != NULL)
    gguf_writer_add_string (w, "tokenizer.ggml.pre", s->pre);
  gguf_writer_add_string_array (w, "tokenizer.ggml.tokens", (guint64) s->n_tokens, s->tokens);
  gguf_writer_add_array (w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, (guint64) s->n_tokens, s->scores);
  gguf_writer_add_array (w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, (guint64) s->n_tokens, s->token_types);
  if (s->n_merges > 0)
    gguf_writer_add_string_array (w, "tokenizer.ggml.merges", (guint64) s->n_merges, s->merges);
  const struct {
    const char *key;
    gint32 id;
  } ids[] = {
    { "tokenizer.ggml.bos_token_id", s->bos_id },
    { "tokenizer.ggml.eos_token_id", s->eos_id },
    { "tokenizer.ggml.unknown_token_id", s->unk_id },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (ids); i++)
    if (ids[i].id >= 0)
      gguf_writer_add_u32 (w, ids[i].key, (guint32) ids[i].id);
  return gguf_writer_write (w, path, error);
}

int
main (int argc, char **argv)
{
  if (argc != 2)
    {
      fprintf (stderr, "usage: %s OUT_DIR\n", argv[0]);
      return 2;
    }
  g_autoptr (GError) error = NULL;
  static const char *const pres[] = { "default", "gpt-2", "llama3", "qwen2" };
  for (gsize p = 0; p < G_N_ELEMENTS (pres); p++)
    {
      g_autoptr (TestVocab) v = test_vocab_gpt2 (pres[p], 400);
      g_autofree char *name = g_strdup_printf ("gpt2-%s.gguf", pres[p]);
      g_autofree char *path = g_build_filename (argv[1], name, NULL);
      if (!write_gguf (path, &v->spec, &error))
        break;
    }
  if (error == NULL)
    {
      g_autoptr (TestVocab) v = test_vocab_llama (400);
      g_autofree char *path = g_build_filename (argv[1], "llama.gguf", NULL);
      write_gguf (path, &v->spec, &error);
    }
  for (gsize c = 0; error == NULL && c < vocab_corpus_len; c++)
    {
      g_autofree char *name = g_strdup_printf ("case-%" G_GSIZE_FORMAT ".txt", c);
      g_autofree char *path = g_build_filename (argv[1], name, NULL);
      g_file_set_contents (path, vocab_corpus[c], -1, &error);
    }
  if (error != NULL)
    {
      fprintf (stderr, "vocab-gguf: %s\n", error->message);
      return 1;
    }
  return 0;
}
