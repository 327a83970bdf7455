/* tests/model: the GGUF tokenizers (model/llama/tokenizer*.c).
 *
 * Known encodings are checked on vocabularies small enough to work out by hand,
 * and against the token ids that llama.cpp gave for the vocabularies of vocab.c
 * (tokenizer-ref.txt; docs/model.md, "Tokenizers", says how it was made). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sift/error.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer.h"
#include "vocab.h"

static GArray *
encode (const SiftTokenizer *tok, const char *text, SiftTokenizeFlags flags)
{
  g_autoptr (GError) error = NULL;
  GArray *ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  gboolean ok = sift_tokenizer_encode (tok, text, -1, flags, ids, &error);
  if (!ok)
    fail_msg ("encode \"%s\": %s", text, error->message);
  return ids;
}

static gint32
id_of (const TestVocab *v, const char *text)
{
  for (guint i = 0; i < v->tokens->len; i++)
    if (strcmp (g_ptr_array_index (v->tokens, i), text) == 0)
      return (gint32) i;
  fail_msg ("no token \"%s\"", text);
  return -1;
}

/* ids equals the tokens named by texts (a NULL-terminated list) */
static void
assert_tokens (const TestVocab *v, const GArray *ids, ...)
{
  va_list ap;
  va_start (ap, ids);
  guint n = 0;
  for (const char *t; (t = va_arg (ap, const char *)) != NULL; n++)
    {
      if (n >= ids->len)
        fail_msg ("token %u: expected \"%s\", the encoding has only %u tokens", n, t, ids->len);
      gint32 got = g_array_index (ids, gint32, n);
      if (got != id_of (v, t))
        fail_msg ("token %u: expected \"%s\", got \"%s\"", n, t, (char *) g_ptr_array_index (v->tokens, got));
    }
  va_end (ap);
  assert_int_equal (ids->len, n);
}

/* 256 byte characters and the given merges (each merge's result added) */
static TestVocab *
hand_gpt2 (const char *pre, const char *const *merges)
{
  g_autoptr (TestVocab) v = test_vocab_gpt2 (pre, 0);
  g_ptr_array_set_size (v->tokens, 256);
  g_array_set_size (v->scores, 256);
  g_array_set_size (v->types, 256);
  for (const char *const *m = merges; *m != NULL; m++)
    {
      g_auto (GStrv) parts = g_strsplit (*m, " ", 2);
      g_autofree char *both = g_strconcat (parts[0], parts[1], NULL);
      float zero = 0.0f;
      gint32 normal = SIFT_TOKEN_TYPE_NORMAL;
      g_ptr_array_add (v->tokens, g_steal_pointer (&both));
      g_array_append_val (v->scores, zero);
      g_array_append_val (v->types, normal);
      g_ptr_array_add (v->merges, g_strdup (*m));
    }
  v->spec = (SiftTokenizerSpec) SIFT_TOKENIZER_SPEC_INIT;
  v->spec.model = "gpt2";
  v->spec.pre = pre;
  v->spec.add_bos = 0;
  v->spec.tokens = (const char *const *) v->tokens->pdata;
  v->spec.n_tokens = (gint32) v->tokens->len;
  v->spec.merges = (const char *const *) v->merges->pdata;
  v->spec.n_merges = (gint32) v->merges->len;
  return g_steal_pointer (&v);
}

static SiftTokenizer *
tokenizer (const TestVocab *v)
{
  g_autoptr (GError) error = NULL;
  SiftTokenizer *tok = sift_tokenizer_new (&v->spec, &error);
  if (tok == NULL)
    fail_msg ("sift_tokenizer_new: %s", error->message);
  return tok;
}

/* Pairs merge by rank, not from the left: "b c" (rank 0) before "a b" (rank 1). */
static void
test_gpt2_rank_order (void **state)
{
  (void) state;
  static const char *const merges[] = { "b c", "a b", "Ġ a", "h e", "l l", "he ll", "hell o", NULL };
  g_autoptr (TestVocab) v = hand_gpt2 ("gpt2", merges);
  g_autoptr (SiftTokenizer) tok = tokenizer (v);
  g_autoptr (GArray) abc = encode (tok, "abc", SIFT_TOKENIZE_NONE);
  assert_tokens (v, abc, "a", "bc", NULL);
  g_autoptr (GArray) sabc = encode (tok, " abc", SIFT_TOKENIZE_NONE);
  assert_tokens (v, sabc, "Ġa", "bc", NULL);
  g_autoptr (GArray) hello = encode (tok, "hello world", SIFT_TOKENIZE_NONE);
  assert_tokens (v, hello, "hello", "Ġ", "w", "o", "r", "l", "d", NULL);
  /* a merge never crosses pre-tokens: "o" and "Ġ" sit in "hello" and " world" */
  g_autoptr (GArray) ab_c = encode (tok, "ab c", SIFT_TOKENIZE_NONE);
  assert_tokens (v, ab_c, "ab", "Ġ", "c", NULL);
}

/* The pre-tokenizers split digits differently: GPT-2 keeps a run, Llama 3
 * takes three at a time, Qwen2 one at a time. */
static void
test_gpt2_digits (void **state)
{
  (void) state;
  static const char *const merges[] = { "1 2", "12 3", "123 4", "4 5", NULL };
  static const struct {
    const char *pre;
    const char *expect[5];
  } cases[] = {
    { "gpt2", { "1234", "5" } },
    { "llama3", { "123", "45" } },
    { "qwen2", { "1", "2", "3", "4", "5" } },
  };
  for (gsize c = 0; c < G_N_ELEMENTS (cases); c++)
    {
      g_autoptr (TestVocab) v = hand_gpt2 (cases[c].pre, merges);
      g_autoptr (SiftTokenizer) tok = tokenizer (v);
      g_autoptr (GArray) ids = encode (tok, "12345", SIFT_TOKENIZE_NONE);
      guint n = 0;
      while (n < 5 && cases[c].expect[n] != NULL)
        n++;
      if (ids->len != n)
        fail_msg ("pre %s: %u tokens, expected %u", cases[c].pre, ids->len, n);
      for (guint i = 0; i < n; i++)
        assert_int_equal (g_array_index (ids, gint32, i), id_of (v, cases[c].expect[i]));
    }
}

/* SentencePiece: the highest-scoring piece merges first; "▁" before the text;
 * characters outside the vocabulary fall back to <0xXX> bytes. */
static void
test_llama_known (void **state)
{
  (void) state;
  g_autoptr (TestVocab) v = test_vocab_llama (0);
  g_ptr_array_set_size (v->tokens, 3 + 256);
  g_array_set_size (v->scores, 3 + 256);
  g_array_set_size (v->types, 3 + 256);
  static const struct {
    const char *text;
    float score;
  } pieces[] = { { "▁", -5 }, { "a", -5 }, { "b", -5 }, { "c", -5 }, { "ab", -1 }, { "bc", -0.5f }, { "▁a", -2 } };
  for (gsize i = 0; i < G_N_ELEMENTS (pieces); i++)
    {
      gint32 normal = SIFT_TOKEN_TYPE_NORMAL;
      g_ptr_array_add (v->tokens, g_strdup (pieces[i].text));
      g_array_append_val (v->scores, pieces[i].score);
      g_array_append_val (v->types, normal);
    }
  v->spec.tokens = (const char *const *) v->tokens->pdata;
  v->spec.n_tokens = (gint32) v->tokens->len;
  v->spec.scores = (const float *) (void *) v->scores->data;
  v->spec.token_types = (const gint32 *) (void *) v->types->data;
  g_autoptr (SiftTokenizer) tok = tokenizer (v);

  /* "▁abc": bc (-0.5) beats ab (-1) and ▁a (-2); then ▁a; "▁abc" is no piece */
  g_autoptr (GArray) abc = encode (tok, "abc", SIFT_TOKENIZE_ADD_SPECIAL);
  assert_tokens (v, abc, "<s>", "▁a", "bc", NULL);
  g_autoptr (GArray) e = encode (tok, "\xc3\xa9", SIFT_TOKENIZE_NONE);
  assert_tokens (v, e, "▁", "<0xC3>", "<0xA9>", NULL);
  g_autofree char *back = sift_tokenizer_decode (tok, (const gint32 *) (void *) e->data, e->len, FALSE, NULL);
  assert_string_equal (back, "\xc3\xa9");
  /* a control token in the text: recognised only with PARSE_SPECIAL, and the
   * text after it gets its own "▁" */
  g_autoptr (GArray) s = encode (tok, "a</s>b", SIFT_TOKENIZE_PARSE_SPECIAL);
  assert_tokens (v, s, "▁a", "</s>", "▁", "b", NULL);
  assert_true (sift_tokenizer_is_eog (tok, id_of (v, "</s>")));
}

/* Control tokens only with PARSE_SPECIAL, user-defined ones always, BOS as the
 * pre-tokenizer's default asks (Llama 3 adds it, GPT-2 does not). */
static void
test_special_tokens (void **state)
{
  (void) state;
  g_autoptr (TestVocab) v = test_vocab_gpt2 ("llama3", 200);
  g_autoptr (SiftTokenizer) tok = tokenizer (v);
  gint32 start = id_of (v, "<|im_start|>"), tool = id_of (v, "<tool>"), bos = id_of (v, "<|endoftext|>");
  const char *text = "<|im_start|>user <tool>";
  g_autoptr (GArray) parsed = encode (tok, text, SIFT_TOKENIZE_ADD_SPECIAL | SIFT_TOKENIZE_PARSE_SPECIAL);
  assert_int_equal (g_array_index (parsed, gint32, 0), bos);
  assert_int_equal (g_array_index (parsed, gint32, 1), start);
  assert_int_equal (g_array_index (parsed, gint32, parsed->len - 1), tool);
  g_autoptr (GArray) plain = encode (tok, text, SIFT_TOKENIZE_NONE);
  for (guint i = 0; i < plain->len; i++)
    assert_int_not_equal (g_array_index (plain, gint32, i), start);
  assert_int_equal (g_array_index (plain, gint32, plain->len - 1), tool);
  g_autofree char *shown = sift_tokenizer_decode (tok, (const gint32 *) (void *) parsed->data, parsed->len, TRUE, NULL);
  g_autofree char *expect = g_strconcat ("<|endoftext|>", text, NULL);
  assert_string_equal (shown, expect);
  g_autofree char *hidden = sift_tokenizer_decode (tok, (const gint32 *) (void *) parsed->data, parsed->len, FALSE, NULL);
  assert_string_equal (hidden, "user <tool>");
  assert_true (sift_tokenizer_is_eog (tok, bos));
  assert_true (sift_tokenizer_is_eog (tok, id_of (v, "<|im_end|>")));
  assert_false (sift_tokenizer_is_eog (tok, start));

  g_autoptr (TestVocab) g = test_vocab_gpt2 ("gpt2", 200);
  g_autoptr (SiftTokenizer) gt = tokenizer (g);
  g_autoptr (GArray) nobos = encode (gt, "hi", SIFT_TOKENIZE_ADD_SPECIAL);
  assert_int_not_equal (g_array_index (nobos, gint32, 0), bos);
}

static void
assert_round_trip (const SiftTokenizer *tok, const char *label)
{
  for (gsize c = 0; c < vocab_corpus_len; c++)
    {
      const char *s = vocab_corpus[c];
      static const struct {
        SiftTokenizeFlags flags;
        gboolean special;
      } modes[] = {
        { SIFT_TOKENIZE_NONE, FALSE },
        { SIFT_TOKENIZE_ADD_SPECIAL, FALSE },
        { SIFT_TOKENIZE_PARSE_SPECIAL, TRUE },
      };
      for (gsize m = 0; m < G_N_ELEMENTS (modes); m++)
        {
          g_autoptr (GArray) ids = encode (tok, s, modes[m].flags);
          g_autoptr (GError) error = NULL;
          g_autofree char *back = sift_tokenizer_decode (tok, (const gint32 *) (void *) ids->data, ids->len,
                                                        modes[m].special, &error);
          assert_non_null (back);
          if (strcmp (back, s) != 0)
            fail_msg ("%s, mode %" G_GSIZE_FORMAT ": decode(encode(\"%s\")) = \"%s\"", label, m, s, back);
          if (modes[m].flags != SIFT_TOKENIZE_NONE)
            continue;
          /* streamed pieces are the same bytes, the first space aside */
          g_autoptr (GString) pieces = g_string_new (NULL);
          for (guint i = 0; i < ids->len; i++)
            sift_tokenizer_piece (tok, g_array_index (ids, gint32, i), FALSE, pieces);
          const char *p = pieces->str;
          if (strcmp (sift_tokenizer_model (tok), "llama") == 0 && *p == ' ')
            p++;
          assert_string_equal (p, s);
        }
    }
}

/* decode(encode(s)) == s on accents, CJK, emoji, whitespace runs, for every
 * kind and pre-tokenizer, with vocabularies that merge across characters. */
static void
test_round_trip (void **state)
{
  (void) state;
  static const char *const pres[] = { "default", "gpt-2", "llama3", "qwen2" };
  for (gsize p = 0; p < G_N_ELEMENTS (pres); p++)
    {
      g_autoptr (TestVocab) v = test_vocab_gpt2 (pres[p], 400);
      g_autoptr (SiftTokenizer) tok = tokenizer (v);
      g_autofree char *label = g_strdup_printf ("gpt2/%s", pres[p]);
      assert_round_trip (tok, label);
    }
  g_autoptr (TestVocab) v = test_vocab_llama (400);
  g_autoptr (SiftTokenizer) tok = tokenizer (v);
  assert_round_trip (tok, "llama");
}

/* A byte sequence cut inside a character still decodes to valid UTF-8. */
static void
test_decode_partial (void **state)
{
  (void) state;
  g_autoptr (TestVocab) v = test_vocab_llama (0);
  g_autoptr (SiftTokenizer) tok = tokenizer (v);
  gint32 ids[] = { id_of (v, "<0xF0>"), id_of (v, "<0x9F>") };
  g_autofree char *s = sift_tokenizer_decode (tok, ids, 2, FALSE, NULL);
  assert_true (g_utf8_validate (s, -1, NULL));
  g_autoptr (GString) raw = g_string_new (NULL);
  sift_tokenizer_piece (tok, ids[0], FALSE, raw);
  assert_int_equal (raw->len, 1);
  assert_int_equal ((guint8) raw->str[0], 0xF0);
}

/* The ids llama.cpp gave for each vocabulary, flag set and corpus text. */
static void
test_reference (void **state)
{
  (void) state;
  g_autofree char *path = g_build_filename (SIFT_TEST_SRCDIR, "tokenizer-ref.txt", NULL);
  g_autofree char *contents = NULL;
  g_autoptr (GError) error = NULL;
  if (!g_file_get_contents (path, &contents, NULL, &error))
    fail_msg ("%s", error->message);
  g_auto (GStrv) lines = g_strsplit (contents, "\n", -1);
  /* "KIND PRE" -> its tokenizer, built once */
  g_autoptr (GHashTable) cache = g_hash_table_new_full (g_str_hash, g_str_equal, g_free,
                                                        (GDestroyNotify) sift_tokenizer_free);
  guint checked = 0;
  for (char **l = lines; *l != NULL; l++)
    {
      if (**l == '#' || **l == '\0')
        continue;
      /* "KIND PRE FLAGS CASE: id id ..." */
      char kind[16], pre[16], flags[8];
      guint c;
      int used = 0;
      if (sscanf (*l, "%15s %15s %7s %u:%n", kind, pre, flags, &c, &used) != 4 || c >= vocab_corpus_len)
        fail_msg ("%s: bad line \"%s\"", path, *l);
      g_autofree char *name = g_strdup_printf ("%s %s", kind, pre);
      SiftTokenizer *tok = g_hash_table_lookup (cache, name);
      if (tok == NULL)
        {
          g_autoptr (TestVocab) v = strcmp (kind, "llama") == 0 ? test_vocab_llama (400) : test_vocab_gpt2 (pre, 400);
          tok = tokenizer (v);
          g_hash_table_insert (cache, g_strdup (name), tok);
        }
      SiftTokenizeFlags f = (strchr (flags, 'a') ? SIFT_TOKENIZE_ADD_SPECIAL : 0)
                            | (strchr (flags, 'p') ? SIFT_TOKENIZE_PARSE_SPECIAL : 0);
      g_autoptr (GArray) ids = encode (tok, vocab_corpus[c], f);
      g_auto (GStrv) want = g_strsplit (g_strstrip (*l + used), " ", -1);
      guint n_want = *want[0] == '\0' ? 0 : g_strv_length (want);
      gboolean same = n_want == ids->len;
      for (guint i = 0; same && i < n_want; i++)
        same = g_array_index (ids, gint32, i) == atoi (want[i]);
      if (!same)
        {
          g_autoptr (GString) got = g_string_new (NULL);
          for (guint i = 0; i < ids->len; i++)
            g_string_append_printf (got, " %d", g_array_index (ids, gint32, i));
          fail_msg ("%s %s %s case %u:\n  llama.cpp: %s\n  sift:     %s", kind, pre, flags, c, *l + used, got->str);
        }
      checked++;
    }
  /* 5 vocabularies x 3 flag sets x every corpus text */
  assert_int_equal (checked, 5 * 3 * vocab_corpus_len);
}

static double
cpu_seconds (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Merging runs off a heap: 16K tokens of text, and one 64 KiB word, encode in
 * well under a second (a rescan per merge would take minutes on the word). */
static void
test_long_text (void **state)
{
  (void) state;
  g_autoptr (GString) text = g_string_new (NULL);
  while (text->len < 96 * 1024)
    for (gsize c = 0; c < vocab_corpus_len; c++)
      g_string_append_printf (text, "%s\n", vocab_corpus[c]);
  g_autofree char *word = g_strnfill (64 * 1024, 'x');
  g_autoptr (TestVocab) g = test_vocab_gpt2 ("llama3", 400);
  g_autoptr (TestVocab) l = test_vocab_llama (400);
  TestVocab *vocabs[] = { g, l };
  for (gsize i = 0; i < G_N_ELEMENTS (vocabs); i++)
    {
      g_autoptr (SiftTokenizer) tok = tokenizer (vocabs[i]);
      double t0 = cpu_seconds ();
      g_autoptr (GArray) ids = encode (tok, text->str, SIFT_TOKENIZE_NONE);
      double t1 = cpu_seconds ();
      g_autoptr (GArray) wids = encode (tok, word, SIFT_TOKENIZE_NONE);
      double t2 = cpu_seconds ();
      g_test_message ("%s: %u tokens in %.3f s, one word of 64 KiB in %.3f s", vocabs[i]->spec.model, ids->len,
                      t1 - t0, t2 - t1);
      assert_true (ids->len >= 16384);
      if (t1 - t0 > 1.0 || t2 - t1 > 1.0)
        fail_msg ("%s: %u tokens took %.3f s, the 64 KiB word %.3f s", vocabs[i]->spec.model, ids->len, t1 - t0,
                  t2 - t1);
      g_autofree char *back = sift_tokenizer_decode (tok, (const gint32 *) (void *) ids->data, ids->len, FALSE, NULL);
      assert_string_equal (back, text->str);
    }
}

/* Each bad spec is an error that names the key and the value. */
static void
expect_error (const SiftTokenizerSpec *spec, const char *const *needles)
{
  g_autoptr (GError) error = NULL;
  SiftTokenizer *tok = sift_tokenizer_new (spec, &error);
  assert_null (tok);
  assert_non_null (error);
  assert_true (g_error_matches (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID));
  for (const char *const *n = needles; *n != NULL; n++)
    if (strstr (error->message, *n) == NULL)
      fail_msg ("\"%s\" does not name \"%s\"", error->message, *n);
}

static void
test_bad_spec (void **state)
{
  (void) state;
  g_autoptr (TestVocab) v = test_vocab_gpt2 ("gpt2", 50);
  v->spec.source = "m.gguf";

  SiftTokenizerSpec s = v->spec;
  s.n_tokens = 0;
  expect_error (&s, (const char *const[]) { "m.gguf", "tokenizer.ggml.tokens", "empty", NULL });

  s = v->spec;
  s.model = "bert";
  expect_error (&s, (const char *const[]) { "tokenizer.ggml.model", "\"bert\"", "llama, gpt2", NULL });

  s = v->spec;
  s.pre = "chatglm-bpe";
  expect_error (&s, (const char *const[]) { "tokenizer.ggml.pre", "\"chatglm-bpe\"", "qwen2", NULL });

  const char *merges[] = { "Ġ t", "Ġt zzz" };
  s = v->spec;
  s.merges = merges;
  s.n_merges = 2;
  expect_error (&s, (const char *const[]) { "m.gguf", "tokenizer.ggml.merges[1]", "\"Ġt zzz\"", "\"zzz\"", NULL });

  const char *nospace[] = { "Ġt" };
  s.merges = nospace;
  s.n_merges = 1;
  expect_error (&s, (const char *const[]) { "tokenizer.ggml.merges[0]", "\"Ġt\"", NULL });

  s = v->spec;
  s.eos_id = s.n_tokens + 5;
  g_autofree char *eos = g_strdup_printf ("%d", s.n_tokens + 5);
  expect_error (&s, (const char *const[]) { "tokenizer.ggml.eos_token_id", eos, NULL });

  gint32 *types = g_memdup2 (v->types->data, v->types->len * sizeof (gint32));
  types[7] = 9;
  s = v->spec;
  s.token_types = types;
  expect_error (&s, (const char *const[]) { "tokenizer.ggml.token_type[7]", "9", NULL });
  g_free (types);

  /* a gpt2 vocabulary without the byte characters cannot encode every text */
  s = v->spec;
  s.tokens += 1;
  s.n_tokens -= 1;
  s.n_merges = 0;
  s.bos_id = s.eos_id = -1;
  expect_error (&s, (const char *const[]) { "byte 0x00", "\"Ā\"", NULL });

  /* llama without byte tokens: unknown characters become the unknown token,
   * which llama.cpp's default puts at id 0 when the file names none */
  g_autoptr (TestVocab) l = test_vocab_llama (0);
  g_autoptr (GPtrArray) nobytes = g_ptr_array_new ();
  for (guint i = 0; i < l->tokens->len; i++)
    if (i < 3 || i >= 3 + 256)
      g_ptr_array_add (nobytes, g_ptr_array_index (l->tokens, i));
  s = l->spec;
  s.tokens = (const char *const *) nobytes->pdata;
  s.n_tokens = (gint32) nobytes->len;
  s.scores = NULL;
  s.token_types = NULL;
  s.bos_id = s.eos_id = s.unk_id = -1;
  g_autoptr (SiftTokenizer) tok = sift_tokenizer_new (&s, NULL);
  assert_non_null (tok);
  g_autoptr (GArray) ids = encode (tok, "\xe2\x98\x83", SIFT_TOKENIZE_ADD_SPECIAL);
  assert_int_equal (g_array_index (ids, gint32, 0), 1);
  assert_int_equal (g_array_index (ids, gint32, ids->len - 1), 0);
}

static void
test_bad_input (void **state)
{
  (void) state;
  g_autoptr (TestVocab) v = test_vocab_llama (50);
  g_autoptr (SiftTokenizer) tok = tokenizer (v);
  g_autoptr (GArray) ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  g_autoptr (GError) error = NULL;
  assert_false (sift_tokenizer_encode (tok, "ok \xff no", -1, SIFT_TOKENIZE_NONE, ids, &error));
  assert_true (g_error_matches (error, SIFT_MODEL_ERROR, SIFT_MODEL_ERROR_INVALID));
  assert_non_null (strstr (error->message, "byte 3"));
  g_clear_error (&error);
  gint32 bad[] = { 5, 100000 };
  assert_null (sift_tokenizer_decode (tok, bad, 2, FALSE, &error));
  assert_non_null (strstr (error->message, "100000"));
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_gpt2_rank_order),
    cmocka_unit_test (test_gpt2_digits),
    cmocka_unit_test (test_llama_known),
    cmocka_unit_test (test_special_tokens),
    cmocka_unit_test (test_round_trip),
    cmocka_unit_test (test_decode_partial),
    cmocka_unit_test (test_reference),
    cmocka_unit_test (test_long_text),
    cmocka_unit_test (test_bad_spec),
    cmocka_unit_test (test_bad_input),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
