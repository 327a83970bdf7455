/* vocab-gguf OUT_DIR: writes the vocabularies of vocab.c as vocabulary-only
 * GGUF files (a one-layer "llama" shape and no tensors, which is what
 * llama.cpp's vocab_only loading reads) and each corpus text as
 * case-N.txt, so that another tokenizer can encode the same texts with the same
 * vocabularies. docs/model.md ("Tokenizers") says how tokenizer-ref.txt was
 * made from them. Not run by the test suite. */
#include <stdio.h>
#include <string.h>

#include "vocab.h"

/* GGUF metadata value types */
enum { T_UINT32 = 4, T_INT32 = 5, T_FLOAT32 = 6, T_STRING = 8, T_ARRAY = 9 };

typedef struct {
  GByteArray *kv;
  guint64 n_kv;
} Meta;

static void
put (Meta *m, const void *p, gsize n)
{
  g_byte_array_append (m->kv, p, (guint) n);
}

static void
put_u32 (Meta *m, guint32 v)
{
  put (m, &v, 4);
}

static void
put_str (Meta *m, const char *s)
{
  guint64 n = strlen (s);
  put (m, &n, 8);
  put (m, s, n);
}

static void
key (Meta *m, const char *k, guint32 type)
{
  put_str (m, k);
  put_u32 (m, type);
  m->n_kv++;
}

static void
kv_u32 (Meta *m, const char *k, guint32 v)
{
  key (m, k, T_UINT32);
  put_u32 (m, v);
}

static void
kv_f32 (Meta *m, const char *k, float v)
{
  key (m, k, T_FLOAT32);
  put (m, &v, 4);
}

static void
kv_str (Meta *m, const char *k, const char *v)
{
  key (m, k, T_STRING);
  put_str (m, v);
}

static void
kv_array (Meta *m, const char *k, guint32 type, guint64 n, const void *items)
{
  key (m, k, T_ARRAY);
  put_u32 (m, type);
  put (m, &n, 8);
  if (type == T_STRING)
    for (guint64 i = 0; i < n; i++)
      put_str (m, ((const char *const *) items)[i]);
  else
    put (m, items, n * 4);
}

static gboolean
write_gguf (const char *path, const SiftTokenizerSpec *s, GError **error)
{
  Meta m = { g_byte_array_new (), 0 };
  kv_str (&m, "general.architecture", "llama");
  kv_u32 (&m, "general.alignment", 32);
  kv_u32 (&m, "llama.context_length", 512);
  kv_u32 (&m, "llama.embedding_length", 64);
  kv_u32 (&m, "llama.block_count", 1);
  kv_u32 (&m, "llama.feed_forward_length", 128);
  kv_u32 (&m, "llama.attention.head_count", 2);
  kv_f32 (&m, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  kv_str (&m, "tokenizer.ggml.model", s->model);
  if (s->pre != NULL)
    kv_str (&m, "tokenizer.ggml.pre", s->pre);
  kv_array (&m, "tokenizer.ggml.tokens", T_STRING, (guint64) s->n_tokens, s->tokens);
  kv_array (&m, "tokenizer.ggml.scores", T_FLOAT32, (guint64) s->n_tokens, s->scores);
  kv_array (&m, "tokenizer.ggml.token_type", T_INT32, (guint64) s->n_tokens, s->token_types);
  if (s->n_merges > 0)
    kv_array (&m, "tokenizer.ggml.merges", T_STRING, (guint64) s->n_merges, s->merges);
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
      kv_u32 (&m, ids[i].key, (guint32) ids[i].id);

  GByteArray *file = g_byte_array_new ();
  guint32 version = 3;
  guint64 n_tensors = 0;
  g_byte_array_append (file, (const guint8 *) "GGUF", 4);
  g_byte_array_append (file, (const guint8 *) &version, 4);
  g_byte_array_append (file, (const guint8 *) &n_tensors, 8);
  g_byte_array_append (file, (const guint8 *) &m.n_kv, 8);
  g_byte_array_append (file, m.kv->data, m.kv->len);
  while (file->len % 32 != 0) /* the (empty) data section starts aligned */
    g_byte_array_append (file, (const guint8 *) "", 1);
  gboolean ok = g_file_set_contents (path, (const char *) file->data, file->len, error);
  g_byte_array_unref (file);
  g_byte_array_unref (m.kv);
  return ok;
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
  static const char *const pres[] = { "default", "gpt2", "llama3", "qwen2" };
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
