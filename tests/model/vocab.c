/* tests/model: the vocabularies of vocab.h. A naive BPE trainer (count every
 * adjacent pair, merge the most frequent, repeat) over the corpus. */
#include "vocab.h"

#include <string.h>

const char *const vocab_corpus[] = {
  "Hello world! It's a test, isn't it? We'll see what they've done, I'm sure you'd agree.",
  "Caf\xc3\xa9, na\xc3\xafve fa\xc3\xa7" "ade, r\xc3\xa9sum\xc3\xa9, \xc3\x85ngstr\xc3\xb6m, Stra\xc3\x9f" "e, "
  "\xce\x95\xce\xbb\xce\xbb\xce\xb7\xce\xbd\xce\xb9\xce\xba\xce\xac, \xd1\x80\xd1\x83\xd1\x81\xd1\x81\xd0\xba\xd0\xb8\xd0\xb9 \xd1\x82\xd0\xb5\xd0\xba\xd1\x81\xd1\x82.",
  "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88\xe3\x81\xa8"
  "\xe4\xb8\xad\xe6\x96\x87\xe6\x96\x87\xe6\x9c\xac\xef\xbc\x8c\xe8\xbf\x98\xe6\x9c\x89"
  "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4\xeb\x8f\x84 \xec\x9e\x88\xec\x8a\xb5\xeb\x8b\x88\xeb\x8b\xa4\xe3\x80\x82",
  "Emoji: \xf0\x9f\x98\x80\xf0\x9f\x8e\x89\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7"
  " and \xe2\x9d\xa4\xef\xb8\x8f flags \xf0\x9f\x87\xab\xf0\x9f\x87\xb7\xf0\x9f\x87\xaf\xf0\x9f\x87\xb5 \xf0\x9f\x98\x80!",
  "Numbers 1234567 and 3.14159, 2024-11-25, $100,000 + 42% <= 99 ^ ~ |x| 7 77 777 7777",
  "  leading spaces,\ttabs\t\tand\nnew lines\n\n\nand \r\n crlf and trailing   ",
  "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello<|endoftext|> <tool>call</tool>",
  "code: for (int i = 0; i < n; i++) { x += a[i] * 2; } // done\n    return x;",
  "mixed: l'\xc3\xa9t\xc3\xa9 dernier, we DON'T care; THEY'RE 'quoted' \"double\" \xc5\xbf's 'S 'Ll",
  "unicode spaces: a\xc2\xa0" "b\xe3\x80\x80" "c\xe2\x80\x83" "d \xc2\xa0 e",
  " ",
  "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away from the dog.",
};
const gsize vocab_corpus_len = G_N_ELEMENTS (vocab_corpus);

gunichar
test_byte_char (guint8 b)
{
  gunichar next = 0x100;
  for (guint i = 0; i < 256; i++)
    {
      gboolean printable = (i >= '!' && i <= '~') || (i >= 0xa1 && i <= 0xac) || i >= 0xae;
      if (i == b)
        return printable ? i : next;
      if (!printable)
        next++;
    }
  g_assert_not_reached ();
}

static gint32
add_token (TestVocab *v, const char *text, float score, gint32 type)
{
  g_ptr_array_add (v->tokens, g_strdup (text));
  g_array_append_val (v->scores, score);
  g_array_append_val (v->types, type);
  return (gint32) v->tokens->len - 1;
}

static gint32
find_token (const TestVocab *v, const char *text)
{
  for (guint i = 0; i < v->tokens->len; i++)
    if (strcmp (g_ptr_array_index (v->tokens, i), text) == 0)
      return (gint32) i;
  return -1;
}

/* words: a GPtrArray of GArray(gint32), each word a run of token ids. Merges
 * the most frequent adjacent pair (ties: the smaller pair of ids) n times;
 * each merge's text is appended to the vocabulary (score -rank) and, when
 * merges is not NULL, "left right" to merges. */
static void
train (TestVocab *v, GPtrArray *words, guint n, GPtrArray *merges)
{
  for (guint m = 0; m < n; m++)
    {
      g_autoptr (GHashTable) counts = g_hash_table_new_full (g_int64_hash, g_int64_equal, g_free, NULL);
      gint64 best = -1;
      guint best_count = 1;
      for (guint w = 0; w < words->len; w++)
        {
          GArray *word = g_ptr_array_index (words, w);
          for (guint i = 0; i + 1 < word->len; i++)
            {
              gint64 key = (gint64) g_array_index (word, gint32, i) << 32 | g_array_index (word, gint32, i + 1);
              guint c = GPOINTER_TO_UINT (g_hash_table_lookup (counts, &key)) + 1;
              g_hash_table_replace (counts, g_memdup2 (&key, sizeof key), GUINT_TO_POINTER (c));
              if (c > best_count || (c == best_count && key < best))
                best = key, best_count = c;
            }
        }
      if (best < 0)
        return;
      gint32 a = (gint32) (best >> 32), b = (gint32) (best & 0xffffffff);
      g_autofree char *text = g_strconcat (g_ptr_array_index (v->tokens, a), g_ptr_array_index (v->tokens, b), NULL);
      gint32 id = find_token (v, text);
      if (id < 0)
        id = add_token (v, text, -(float) m, SIFT_TOKEN_TYPE_NORMAL);
      if (merges != NULL)
        g_ptr_array_add (merges, g_strdup_printf ("%s %s", (char *) g_ptr_array_index (v->tokens, a),
                                                  (char *) g_ptr_array_index (v->tokens, b)));
      for (guint w = 0; w < words->len; w++)
        {
          GArray *word = g_ptr_array_index (words, w);
          for (guint i = 0; i + 1 < word->len; i++)
            if (g_array_index (word, gint32, i) == a && g_array_index (word, gint32, i + 1) == b)
              {
                g_array_index (word, gint32, i) = id;
                g_array_remove_index (word, i + 1);
              }
        }
    }
}

static TestVocab *
vocab_new (const char *model)
{
  TestVocab *v = g_new0 (TestVocab, 1);
  v->tokens = g_ptr_array_new_with_free_func (g_free);
  v->scores = g_array_new (FALSE, FALSE, sizeof (float));
  v->types = g_array_new (FALSE, FALSE, sizeof (gint32));
  v->merges = g_ptr_array_new_with_free_func (g_free);
  v->spec = (SiftTokenizerSpec) SIFT_TOKENIZER_SPEC_INIT;
  v->spec.model = model;
  return v;
}

static void
vocab_finish (TestVocab *v)
{
  v->spec.tokens = (const char *const *) v->tokens->pdata;
  v->spec.n_tokens = (gint32) v->tokens->len;
  v->spec.scores = (const float *) (void *) v->scores->data;
  v->spec.token_types = (const gint32 *) (void *) v->types->data;
  v->spec.merges = v->merges->len > 0 ? (const char *const *) v->merges->pdata : NULL;
  v->spec.n_merges = (gint32) v->merges->len;
}

static void
free_string (gpointer s)
{
  g_string_free (s, TRUE);
}

/* Training words: split before each space (the space starts the next word);
 * words with '<' left out. */
static GPtrArray *
corpus_words (void)
{
  GPtrArray *words = g_ptr_array_new_with_free_func (free_string);
  for (gsize c = 0; c < vocab_corpus_len; c++)
    for (const char *p = vocab_corpus[c]; *p != '\0';)
      {
        const char *q = p + 1;
        while (*q != '\0' && *q != ' ')
          q++;
        /* special-token text stays out, so that no learned piece repeats one */
        if (memchr (p, '<', q - p) == NULL)
          g_ptr_array_add (words, g_string_new_len (p, q - p));
        p = q;
      }
  return words;
}

TestVocab *
test_vocab_gpt2 (const char *pre, guint n_merges)
{
  TestVocab *v = vocab_new ("gpt2");
  v->spec.pre = pre;
  for (guint b = 0; b < 256; b++)
    {
      char buf[8] = { 0 };
      g_unichar_to_utf8 (test_byte_char ((guint8) b), buf);
      add_token (v, buf, 0.0f, SIFT_TOKEN_TYPE_NORMAL);
    }
  g_autoptr (GPtrArray) text = corpus_words ();
  g_autoptr (GPtrArray) words = g_ptr_array_new_with_free_func ((GDestroyNotify) g_array_unref);
  for (guint w = 0; w < text->len; w++)
    {
      GString *s = g_ptr_array_index (text, w);
      GArray *ids = g_array_new (FALSE, FALSE, sizeof (gint32));
      for (gsize i = 0; i < s->len; i++)
        {
          gint32 id = (guint8) s->str[i];
          g_array_append_val (ids, id);
        }
      g_ptr_array_add (words, ids);
    }
  train (v, words, n_merges, v->merges);
  v->spec.bos_id = v->spec.eos_id = add_token (v, "<|endoftext|>", 0.0f, SIFT_TOKEN_TYPE_CONTROL);
  add_token (v, "<|im_start|>", 0.0f, SIFT_TOKEN_TYPE_CONTROL);
  add_token (v, "<|im_end|>", 0.0f, SIFT_TOKEN_TYPE_CONTROL);
  add_token (v, "<tool>", 0.0f, SIFT_TOKEN_TYPE_USER_DEFINED);
  vocab_finish (v);
  return v;
}

TestVocab *
test_vocab_llama (guint n_merges)
{
  TestVocab *v = vocab_new ("llama");
  v->spec.unk_id = add_token (v, "<unk>", 0.0f, SIFT_TOKEN_TYPE_UNKNOWN);
  v->spec.bos_id = add_token (v, "<s>", 0.0f, SIFT_TOKEN_TYPE_CONTROL);
  v->spec.eos_id = add_token (v, "</s>", 0.0f, SIFT_TOKEN_TYPE_CONTROL);
  for (guint b = 0; b < 256; b++)
    {
      g_autofree char *name = g_strdup_printf ("<0x%02X>", b);
      add_token (v, name, 0.0f, SIFT_TOKEN_TYPE_BYTE);
    }
  /* the corpus as SentencePiece sees it: "▁" for spaces, one before each text */
  g_autoptr (GPtrArray) text = corpus_words ();
  g_autoptr (GHashTable) chars = g_hash_table_new (g_direct_hash, g_direct_equal);
  g_autoptr (GPtrArray) escaped = g_ptr_array_new_with_free_func (g_free);
  for (guint w = 0; w < text->len; w++)
    {
      GString *s = g_ptr_array_index (text, w);
      g_autoptr (GString) e = g_string_new (NULL);
      for (gsize i = 0; i < s->len; i++)
        if (s->str[i] == ' ')
          g_string_append (e, "\xe2\x96\x81");
        else
          g_string_append_c (e, s->str[i]);
      for (const char *p = e->str; *p != '\0'; p = g_utf8_next_char (p))
        {
          gpointer key = GUINT_TO_POINTER (g_utf8_get_char (p));
          g_hash_table_replace (chars, key, GUINT_TO_POINTER (GPOINTER_TO_UINT (g_hash_table_lookup (chars, key)) + 1));
        }
      g_ptr_array_add (escaped, g_string_free (g_steal_pointer (&e), FALSE));
    }
  /* characters seen twice or more, in code point order; the rest need byte fallback */
  for (gunichar c = 1; c < 0x110000; c++)
    {
      if (GPOINTER_TO_UINT (g_hash_table_lookup (chars, GUINT_TO_POINTER (c))) < 2)
        continue;
      char buf[8] = { 0 };
      g_unichar_to_utf8 (c, buf);
      add_token (v, buf, -1000.0f, SIFT_TOKEN_TYPE_NORMAL);
    }
  g_autoptr (GPtrArray) words = g_ptr_array_new_with_free_func ((GDestroyNotify) g_array_unref);
  for (guint w = 0; w < escaped->len; w++)
    {
      GArray *ids = g_array_new (FALSE, FALSE, sizeof (gint32));
      for (const char *p = g_ptr_array_index (escaped, w); *p != '\0'; p = g_utf8_next_char (p))
        {
          char buf[8] = { 0 };
          memcpy (buf, p, g_utf8_next_char (p) - p);
          gint32 id = find_token (v, buf);
          if (id < 0) /* a rare character: it splits the word */
            {
              if (ids->len > 0)
                g_ptr_array_add (words, g_steal_pointer (&ids)), ids = g_array_new (FALSE, FALSE, sizeof (gint32));
              continue;
            }
          g_array_append_val (ids, id);
        }
      g_ptr_array_add (words, ids);
    }
  train (v, words, n_merges, NULL);
  vocab_finish (v);
  return v;
}

void
test_vocab_free (TestVocab *v)
{
  if (v == NULL)
    return;
  g_ptr_array_unref (v->tokens);
  g_array_unref (v->scores);
  g_array_unref (v->types);
  g_ptr_array_unref (v->merges);
  g_free (v);
}
