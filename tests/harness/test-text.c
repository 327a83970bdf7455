/* Real-text needles (tools/harness/text.h): RULER's scoring on crafted
 * outputs; prompts of exactly the cell's length whose needles land on a
 * sentence boundary at the asked depth, whose token ids are the shipped
 * tokenizer's ids of the prompt's text, and whose text is in the format
 * the shipped model was trained on (tools/train/haystack.py). The haystack
 * is the King James Bible from Debian's `bible` (tools/bootstrap.sh installs
 * it); without it the prompt tests are skipped outside CI. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <glib/gstdio.h>
#include <sift/sift.h>

#include "gguf-model.h"
#include "harness.h"
#include "text.h"

static HarnessCorpus *corpus;
static LlamaModel *llama;
static SiftTokenizer *tok;
static HarnessTextSource *source;

static void
test_score (void **state)
{
  (void) state;
  const char *one[] = { "482913", NULL };
  const char *four[] = { "cedar", "olive", "myrrh", "flax", NULL };
  double m;
  gboolean exact;
  harness_text_score (" 482913.", one, &m, &exact);
  assert_true (m == 1.0 && exact);
  harness_text_score (" 482913", one, &m, &exact);      /* no period: still exact */
  assert_true (m == 1.0 && exact);
  harness_text_score (" 482913 and 7.", one, &m, &exact); /* found, not exact */
  assert_true (m == 1.0 && !exact);
  harness_text_score (" 48291.", one, &m, &exact);      /* a prefix is no match */
  assert_true (m == 0.0 && !exact);
  harness_text_score ("", one, &m, &exact);
  assert_true (m == 0.0 && !exact);
  /* string_match_all: the fraction found, in any order. */
  harness_text_score (" flax, olive, cedar and myrrh.", four, &m, &exact);
  assert_true (m == 1.0 && !exact);
  harness_text_score (" cedar, olive, myrrh and flax.", four, &m, &exact);
  assert_true (m == 1.0 && exact);
  harness_text_score (" cedar and olive.", four, &m, &exact);
  assert_true (m == 0.5 && !exact);
  g_autofree char *a = harness_text_answer (four);
  assert_string_equal (a, " cedar, olive, myrrh and flax.");
}

static gboolean
have_text (void)
{
  if (source != NULL)
    return TRUE;
  if (g_getenv ("CI") != NULL)
    fail_msg ("CI needs the KJV haystack (apt-get install bible-kjv bible-kjv-text)");
  return FALSE;
}

static SiftHarnessConfig
harness_config (SiftNeedleKind kind, SiftNeedleValue value)
{
  return (SiftHarnessConfig) { .needle = kind, .value = value, .n_distractors = 3, .n_values = 4, .n_queries = 4 };
}

static char *
decode (const gint32 *ids, gsize n)
{
  g_autoptr (GError) error = NULL;
  char *s = sift_tokenizer_decode (tok, ids, n, FALSE, &error);
  assert_non_null (s);
  return s;
}

/* Every depth: the needle starts at the sentence boundary nearest the
 * depth's token offset (no sentence of the haystack is longer than 200
 * tokens), the prompt has the cell's length and its ids re-encode from
 * its text. */
static void
test_depth (void **state)
{
  (void) state;
  if (!have_text ())
    skip ();
  SiftHarnessConfig h = harness_config (SIFT_NEEDLE_SINGLE, SIFT_NEEDLE_VALUE_NUMBER);
  const double depths[] = { 0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0 };
  for (gsize i = 0; i < G_N_ELEMENTS (depths); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (HarnessTextPrompt) p = harness_text_prompt_new (source, &h, 2048, depths[i], 7, &error);
      assert_non_null (p);
      assert_int_equal (p->n_ids, 2048);
      assert_int_equal (p->ids[0], sift_tokenizer_bos (tok));
      assert_int_equal (p->n_needles, 1);
      double want = depths[i] * (double) p->haystack_tokens;
      assert_true (fabs ((double) p->depth_offset - want) <= 200);
      assert_int_equal (p->needle_start[0], p->haystack_start + p->depth_offset);
      if (depths[i] == 0.0)
        assert_int_equal (p->depth_offset, 0);
      if (depths[i] == 1.0)
        assert_int_equal (p->needle_end[0], p->question_start);
      /* The needle's tokens say the needle; the question asks its key. */
      g_autofree char *needle = decode (p->ids + p->needle_start[0], p->needle_end[0] - p->needle_start[0]);
      assert_true (g_str_has_prefix (needle, " One of the special magic numbers for "));
      g_autofree char *tail = g_strdup_printf (" is: %s.", p->answers[0]);
      assert_true (g_str_has_suffix (needle, tail));
      g_autofree char *question = decode (p->ids + p->question_start, p->n_ids - p->question_start);
      const char *key = needle + strlen (" One of the special magic numbers for ");
      g_autofree char *key_only = g_strndup (key, strlen (key) - strlen (tail));
      g_autofree char *q = g_strdup_printf ("\nQuestion: What is the special magic number for %s mentioned in the"
                                            " text? Answer: The special magic number for %s is", key_only, key_only);
      assert_string_equal (question, q);
      g_autofree char *text = decode (p->ids + 1, (gsize) p->n_ids - 1);
      g_autoptr (GArray) again = g_array_new (FALSE, FALSE, sizeof (gint32));
      assert_true (sift_tokenizer_encode (tok, text, -1, SIFT_TOKENIZE_NONE, again, &error));
      assert_int_equal (again->len, p->n_ids - 1);
      assert_memory_equal (again->data, p->ids + 1, again->len * sizeof (gint32));
      assert_true (g_str_has_prefix (text, "Some special magic numbers are hidden within the following text. Make"
                                           " sure to memorize it. I will quiz you about the numbers afterwards.\n"));
    }
}

/* Same seed and length: the same haystack at every depth, the needle moved. */
static void
test_same_haystack (void **state)
{
  (void) state;
  if (!have_text ())
    skip ();
  SiftHarnessConfig h = harness_config (SIFT_NEEDLE_SINGLE, SIFT_NEEDLE_VALUE_WORD);
  g_autoptr (HarnessTextPrompt) a = harness_text_prompt_new (source, &h, 1024, 0.2, 3, NULL);
  g_autoptr (HarnessTextPrompt) b = harness_text_prompt_new (source, &h, 1024, 0.2, 3, NULL);
  g_autoptr (HarnessTextPrompt) c = harness_text_prompt_new (source, &h, 1024, 0.8, 3, NULL);
  assert_memory_equal (a->ids, b->ids, (gsize) a->n_ids * sizeof (gint32));
  /* The haystack before a's needle is c's too (c's needle comes later). */
  assert_true (c->needle_start[0] > a->needle_start[0]);
  assert_memory_equal (a->ids, c->ids, (gsize) a->needle_start[0] * sizeof (gint32));
}

/* The multi-needle kinds: every needle in its place, the answers as asked. */
static void
test_kinds (void **state)
{
  (void) state;
  if (!have_text ())
    skip ();
  struct { SiftNeedleKind kind; SiftNeedleValue value; gsize needles, answers, asked; const char *q; } cases[] = {
    { SIFT_NEEDLE_MULTIKEY, SIFT_NEEDLE_VALUE_NUMBER, 4, 1, 1, "What is the special magic number for " },
    { SIFT_NEEDLE_MULTIVALUE, SIFT_NEEDLE_VALUE_UUID, 4, 4, 4, "What are all the special magic codes for " },
    { SIFT_NEEDLE_MULTIQUERY, SIFT_NEEDLE_VALUE_WORD, 4, 4, 4, "What are the special magic words for " },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      SiftHarnessConfig h = harness_config (cases[i].kind, cases[i].value);
      g_autoptr (GError) error = NULL;
      g_autoptr (HarnessTextPrompt) p = harness_text_prompt_new (source, &h, 1500, 0.5, 11, &error);
      assert_non_null (p);
      assert_int_equal (p->n_ids, 1500);
      assert_int_equal (p->n_needles, cases[i].needles);
      assert_int_equal (g_strv_length (p->answers), cases[i].answers);
      gsize asked = 0;
      for (gsize k = 0; k < p->n_needles; k++)
        {
          asked += p->needle_asked[k];
          if (k > 0)
            assert_int_equal (p->needle_start[k], p->needle_end[k - 1]); /* planted together */
        }
      assert_int_equal (asked, cases[i].asked);
      g_autofree char *q = decode (p->ids + p->question_start, p->n_ids - p->question_start);
      assert_non_null (strstr (q, cases[i].q));
      /* Each answer is in some needle's text. */
      g_autofree char *needles = decode (p->ids + p->needle_start[0], p->needle_end[p->n_needles - 1] - p->needle_start[0]);
      for (char **a = p->answers; *a != NULL; a++)
        assert_non_null (strstr (needles, *a));
      if (cases[i].value == SIFT_NEEDLE_VALUE_UUID)
        assert_int_equal (strlen (p->answers[0]), 18);
    }
}

/* multikey asks one key drawn at random: over seeds every place in the
   group is asked, and the answer is the asked needle's value. */
static void
test_multikey_asks_any_key (void **state)
{
  (void) state;
  if (!have_text ())
    skip ();
  SiftHarnessConfig h = harness_config (SIFT_NEEDLE_MULTIKEY, SIFT_NEEDLE_VALUE_NUMBER);
  gsize times[4] = { 0 };
  for (guint64 seed = 1; seed <= 32; seed++)
    {
      g_autoptr (HarnessTextPrompt) p = harness_text_prompt_new (source, &h, 600, 0.5, seed, NULL);
      assert_non_null (p);
      assert_int_equal (p->n_needles, 4);
      gsize asked = 0, which = 0;
      for (gsize k = 0; k < p->n_needles; k++)
        if (p->needle_asked[k])
          asked++, which = k;
      assert_int_equal (asked, 1);
      times[which]++;
      g_autofree char *needle = decode (p->ids + p->needle_start[which], p->needle_end[which] - p->needle_start[which]);
      assert_non_null (strstr (needle, p->answers[0]));
      /* The question names the asked needle's key: the word before " is:". */
      g_autofree char *q = decode (p->ids + p->question_start, p->n_ids - p->question_start);
      const char *for_ = strstr (needle, " for "), *is = strstr (needle, " is:");
      assert_true (for_ != NULL && is != NULL && is > for_);
      g_autofree char *key = g_strndup (for_ + 5, (gsize) (is - for_ - 5));
      g_autofree char *asks = g_strdup_printf ("number for %s mentioned", key);
      assert_non_null (strstr (q, asks));
    }
  for (gsize k = 0; k < 4; k++)
    assert_true (times[k] >= 2); /* P(a place asked < 2 times in 32) < 1e-2 each */
}

/* A needle that does not fit: an error naming the numbers. */
static void
test_too_short (void **state)
{
  (void) state;
  if (!have_text ())
    skip ();
  SiftHarnessConfig h = harness_config (SIFT_NEEDLE_MULTIQUERY, SIFT_NEEDLE_VALUE_NUMBER);
  g_autoptr (GError) error = NULL;
  g_autoptr (HarnessTextPrompt) p = harness_text_prompt_new (source, &h, 100, 0.5, 1, &error);
  assert_null (p);
  assert_true (g_error_matches (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID));
  assert_non_null (strstr (error->message, "context of 100 tokens"));
}

/* A haystack file that is missing or too short: clear errors. */
static void
test_bad_haystack (void **state)
{
  (void) state;
  g_autoptr (GError) error = NULL;
  assert_null (harness_corpus_load ("/nonexistent/haystack.txt", &error));
  assert_true (g_error_matches (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID));
  assert_non_null (strstr (error->message, "/nonexistent/haystack.txt"));
  g_clear_error (&error);
  g_autofree char *path = NULL;
  int fd = g_file_open_tmp ("sift-hay-XXXXXX.txt", &path, NULL);
  assert_true (fd >= 0);
  close (fd);
  assert_true (g_file_set_contents (path, "One sentence. Two sentences here.", -1, NULL));
  assert_null (harness_corpus_load (path, &error));
  assert_non_null (strstr (error->message, "2 sentences"));
  g_unlink (path);
}

int
main (void)
{
  g_autoptr (GError) error = NULL;
  corpus = harness_corpus_load (NULL, &error);
  if (corpus == NULL)
    g_printerr ("no KJV haystack: %s\n", error->message);
  llama = llama_model_open (SIFT_TEST_MODELS "/sift-needle-14m-f16.gguf", &error);
  if (llama == NULL)
    g_error ("%s", error->message);
  tok = llama_tokenizer_from_gguf (llama_model_gguf (llama), &error);
  if (tok == NULL)
    g_error ("%s", error->message);
  if (corpus != NULL && (source = harness_text_source_new (corpus, tok, &error)) == NULL)
    g_error ("%s", error->message);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_score),
    cmocka_unit_test (test_depth),
    cmocka_unit_test (test_same_haystack),
    cmocka_unit_test (test_kinds),
    cmocka_unit_test (test_multikey_asks_any_key),
    cmocka_unit_test (test_too_short),
    cmocka_unit_test (test_bad_haystack),
  };
  int status = cmocka_run_group_tests (tests, NULL, NULL);
  harness_text_source_free (source);
  sift_tokenizer_free (tok);
  llama_model_free (llama);
  harness_corpus_free (corpus);
  return status;
}
