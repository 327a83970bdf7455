/* A real-text cell's prompt: RULER's preamble, a haystack with the needles
 * on a sentence boundary at the cell's depth, and the question, word for
 * word as tools/train/haystack.py writes them (the shipped model answers
 * only in that format); and RULER's scoring of the answer. */
#include <math.h>
#include <string.h>

#include "harness.h"
#include "text.h"

/* What a needle's value is called in the text, by SiftNeedleValue. */
static const char *const nouns[] = { "number", "word", "code" };

static char *
random_value (GRand *r, SiftNeedleValue kind, const HarnessCorpus *c)
{
  switch (kind)
    {
    case SIFT_NEEDLE_VALUE_NUMBER:
      return g_strdup_printf ("%d", g_rand_int_range (r, 100000, 1000000));
    case SIFT_NEEDLE_VALUE_WORD:
      return g_strdup (harness_corpus_word (c, FALSE, r));
    case SIFT_NEEDLE_VALUE_UUID:
      {
        char h[17];
        for (int i = 0; i < 16; i++)
          h[i] = "0123456789abcdef"[g_rand_int_range (r, 0, 16)];
        h[16] = 0;
        return g_strdup_printf ("%.8s-%.4s-%.4s", h, h + 8, h + 12);
      }
    }
  g_assert_not_reached ();
}

static gboolean
contains (GPtrArray *a, const char *s)
{
  for (guint i = 0; i < a->len; i++)
    if (strcmp (a->pdata[i], s) == 0)
      return TRUE;
  return FALSE;
}

/* n distinct strings from draw(). */
static GPtrArray *
distinct (gint64 n, GRand *r, SiftNeedleValue kind, const HarnessCorpus *c, gboolean keys)
{
  GPtrArray *a = g_ptr_array_new_with_free_func (g_free);
  while ((gint64) a->len < n)
    {
      char *s = keys ? g_strdup (harness_corpus_word (c, TRUE, r)) : random_value (r, kind, c);
      if (contains (a, s))
        g_free (s);
      else
        g_ptr_array_add (a, s);
    }
  return a;
}

/* "a", "a and b", "a, b and c". */
static char *
join_list (char *const *items, gsize n)
{
  GString *s = g_string_new (items[0]);
  for (gsize i = 1; i < n; i++)
    g_string_append_printf (s, "%s%s", i + 1 == n ? " and " : ", ", items[i]);
  return g_string_free (s, FALSE);
}

char *
harness_text_answer (const char *const *values)
{
  gsize n = g_strv_length ((char **) values);
  g_autofree char *list = join_list ((char *const *) values, n);
  return g_strdup_printf (" %s.", list);
}

/* What a cell asks: needles (key, value) in planting order, the keys the
 * question names and the values expected, in answer order. */
typedef struct {
  GPtrArray *needle_keys, *needle_values;   /* char * */
  gboolean *asked;                          /* [needles] */
  GPtrArray *query_keys, *answers;          /* char * */
} Task;

static void
task_clear (Task *t)
{
  g_clear_pointer (&t->needle_keys, g_ptr_array_unref);
  g_clear_pointer (&t->needle_values, g_ptr_array_unref);
  g_clear_pointer (&t->query_keys, g_ptr_array_unref);
  g_clear_pointer (&t->answers, g_ptr_array_unref);
  g_clear_pointer (&t->asked, g_free);
}

static void
add_copy (GPtrArray *a, const char *s)
{
  g_ptr_array_add (a, g_strdup (s));
}

static void
make_task (const SiftHarnessConfig *h, GRand *r, const HarnessCorpus *c, Task *t)
{
  gint64 n_keys = h->needle == SIFT_NEEDLE_MULTIKEY ? 1 + h->n_distractors
                  : h->needle == SIFT_NEEDLE_MULTIQUERY ? h->n_queries : 1;
  gint64 n_values = h->needle == SIFT_NEEDLE_MULTIVALUE ? h->n_values : n_keys;
  g_autoptr (GPtrArray) keys = distinct (n_keys, r, h->value, c, TRUE);
  g_autoptr (GPtrArray) values = distinct (n_values, r, h->value, c, FALSE);
  t->needle_keys = g_ptr_array_new_with_free_func (g_free);
  t->needle_values = g_ptr_array_new_with_free_func (g_free);
  t->query_keys = g_ptr_array_new_with_free_func (g_free);
  t->answers = g_ptr_array_new_null_terminated (4, g_free, TRUE);
  t->asked = g_new0 (gboolean, n_values);
  /* multikey asks one key of the group, drawn at random, so a model (or a
     policy) that favours the group's first or last needle scores chance. */
  gint64 ask = h->needle == SIFT_NEEDLE_MULTIKEY ? g_rand_int_range (r, 0, (gint32) n_keys) : 0;
  for (gint64 i = 0; i < n_values; i++)
    {
      add_copy (t->needle_keys, keys->pdata[h->needle == SIFT_NEEDLE_MULTIVALUE ? 0 : i]);
      add_copy (t->needle_values, values->pdata[i]);
      t->asked[i] = h->needle != SIFT_NEEDLE_MULTIKEY || i == ask;
    }
  switch (h->needle)
    {
    case SIFT_NEEDLE_SINGLE:
    case SIFT_NEEDLE_MULTIKEY:
      add_copy (t->query_keys, keys->pdata[ask]);
      add_copy (t->answers, values->pdata[ask]);
      break;
    case SIFT_NEEDLE_MULTIVALUE:
      add_copy (t->query_keys, keys->pdata[0]);
      for (guint i = 0; i < values->len; i++)
        add_copy (t->answers, values->pdata[i]);
      break;
    case SIFT_NEEDLE_MULTIQUERY:
      {
        /* Asked in a shuffled order (Fisher-Yates), answered in that order. */
        g_autofree guint *order = g_new (guint, keys->len);
        for (guint i = 0; i < keys->len; i++)
          order[i] = i;
        for (guint i = keys->len - 1; i > 0; i--)
          {
            guint j = (guint) g_rand_int_range (r, 0, (gint32) i + 1), x = order[i];
            order[i] = order[j];
            order[j] = x;
          }
        for (guint i = 0; i < keys->len; i++)
          {
            add_copy (t->query_keys, keys->pdata[order[i]]);
            add_copy (t->answers, values->pdata[order[i]]);
          }
        break;
      }
    }
}

static char *
question_text (SiftNeedleKind kind, GPtrArray *keys, const char *n)
{
  g_autofree char *ks = join_list ((char *const *) keys->pdata, keys->len);
  if (kind == SIFT_NEEDLE_SINGLE || kind == SIFT_NEEDLE_MULTIKEY)
    return g_strdup_printf ("\nQuestion: What is the special magic %s for %s mentioned in the text? "
                            "Answer: The special magic %s for %s is", n, ks, n, ks);
  if (kind == SIFT_NEEDLE_MULTIVALUE)
    return g_strdup_printf ("\nQuestion: What are all the special magic %ss for %s mentioned in the text? "
                            "Answer: The special magic %ss for %s are", n, ks, n, ks);
  return g_strdup_printf ("\nQuestion: What are the special magic %ss for %s mentioned in the text? "
                          "Answer: The special magic %ss for %s are", n, ks, n, ks);
}

static GArray *
encode (const SiftTokenizer *tok, const char *text, GError **error)
{
  GArray *ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  if (!sift_tokenizer_encode (tok, text, -1, SIFT_TOKENIZE_NONE, ids, error))
    g_clear_pointer (&ids, g_array_unref);
  return ids;
}

static GRand *
seeded (guint64 seed, gint64 length, guint64 salt, guint32 tag)
{
  return g_rand_new_with_seed_array ((const guint32[]) { (guint32) seed, (guint32) (seed >> 32), (guint32) length,
                                                        (guint32) salt, (guint32) (salt >> 32), tag }, 6);
}

HarnessTextPrompt *
harness_text_prompt_new (HarnessTextSource *src, const SiftHarnessConfig *h, gint64 length, double depth,
                         guint64 seed, GError **error)
{
  g_return_val_if_fail (src != NULL && h != NULL, NULL);
  if (!(depth >= 0.0 && depth <= 1.0))
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID, "harness: depth %g is not within [0, 1]",
                   depth);
      return NULL;
    }
  const HarnessCorpus *corpus = harness_text_source_corpus (src);
  const SiftTokenizer *tok = harness_text_source_tokenizer (src);
  const char *noun = nouns[h->value];
  /* The task depends on the depth too: each cell asks its own key. */
  guint64 depth_bits;
  memcpy (&depth_bits, &depth, sizeof depth_bits);
  g_autoptr (GRand) task_rand = seeded (seed, length, depth_bits, 0x5441534bu);
  g_autoptr (GRand) hay_rand = seeded (seed, length, 0, 0x48415953u);
  Task task = { 0 };
  make_task (h, task_rand, corpus, &task);

  g_autofree char *pre = g_strdup_printf ("Some special magic %ss are hidden within the following text. Make sure"
                                          " to memorize it. I will quiz you about the %ss afterwards.\n", noun, noun);
  g_autofree char *question = question_text (h->needle, task.query_keys, noun);
  g_autofree char *answer = harness_text_answer ((const char *const *) task.answers->pdata);
  gsize n_needles = task.needle_keys->len;
  g_autoptr (GPtrArray) needle_ids = g_ptr_array_new_with_free_func ((GDestroyNotify) g_array_unref);
  g_autoptr (GArray) pre_ids = encode (tok, pre, error);
  g_autoptr (GArray) q_ids = pre_ids != NULL ? encode (tok, question, error) : NULL;
  g_autoptr (GArray) a_ids = q_ids != NULL ? encode (tok, answer, error) : NULL;
  gint64 fixed = 1 + (a_ids != NULL ? (gint64) pre_ids->len + q_ids->len : 0);
  for (gsize i = 0; a_ids != NULL && i < n_needles; i++)
    {
      g_autofree char *text = g_strdup_printf (" One of the special magic %ss for %s is: %s.", noun,
                                               (const char *) task.needle_keys->pdata[i],
                                               (const char *) task.needle_values->pdata[i]);
      GArray *ids = encode (tok, text, error);
      if (ids == NULL)
        break;
      g_ptr_array_add (needle_ids, ids);
      fixed += ids->len;
    }
  if (needle_ids->len < n_needles || a_ids == NULL)
    {
      task_clear (&task);
      return NULL;
    }
  gint64 budget = length - fixed;
  if (budget < 16)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "harness: a context of %" G_GINT64_FORMAT " tokens cannot hold the %zu needle(s), the preamble"
                   " and the question (%" G_GINT64_FORMAT " tokens) with 16 haystack tokens; raise harness.lengths",
                   length, n_needles, fixed);
      task_clear (&task);
      return NULL;
    }
  g_autoptr (GArray) hay = harness_text_haystack (src, hay_rand, budget);
  /* The sentence boundary nearest depth * budget (the first of two as near). */
  gsize place = 0;
  gint64 at = 0, best_offset = 0;
  double target = depth * (double) budget, best = INFINITY;
  for (gsize i = 0; i <= hay->len; i++)
    {
      if (fabs ((double) at - target) < best)
        {
          best = fabs ((double) at - target);
          place = i;
          best_offset = at;
        }
      if (i < hay->len)
        at += (gint64) g_array_index (hay, HarnessPiece, i).n;
    }

  HarnessTextPrompt *p = g_new0 (HarnessTextPrompt, 1);
  p->n_ids = length;
  p->ids = g_new (gint32, length);
  p->n_needles = n_needles;
  p->needle_start = g_new (gint64, n_needles);
  p->needle_end = g_new (gint64, n_needles);
  p->needle_asked = g_new (gboolean, n_needles);
  p->haystack_tokens = budget;
  p->depth_offset = best_offset;
  gint64 n = 0;
#define PUT(src_ids, count) (memcpy (p->ids + n, (src_ids), (gsize) (count) * sizeof (gint32)), n += (count))
  p->ids[n++] = sift_tokenizer_bos (tok);
  PUT (pre_ids->data, pre_ids->len);
  p->haystack_start = n;
  for (gsize i = 0; i <= hay->len; i++)
    {
      if (i == place)
        for (gsize k = 0; k < n_needles; k++)
          {
            const GArray *ids = needle_ids->pdata[k];
            p->needle_start[k] = n;
            PUT (ids->data, ids->len);
            p->needle_end[k] = n;
            p->needle_asked[k] = task.asked[k];
          }
      if (i < hay->len)
        {
          const HarnessPiece *piece = &g_array_index (hay, HarnessPiece, i);
          PUT (piece->ids, piece->n);
        }
    }
  p->question_start = n;
  PUT (q_ids->data, q_ids->len);
#undef PUT
  g_assert (n == length);
  p->answers = g_new0 (char *, task.answers->len + 1);
  for (guint i = 0; i < task.answers->len; i++)
    p->answers[i] = g_strdup (task.answers->pdata[i]);
  p->answer_text = g_steal_pointer (&answer);
  p->max_new_tokens = (gint64) a_ids->len + 4;
  task_clear (&task);
  return p;
}

void
harness_text_prompt_free (HarnessTextPrompt *p)
{
  if (p == NULL)
    return;
  g_free (p->ids);
  g_free (p->needle_start);
  g_free (p->needle_end);
  g_free (p->needle_asked);
  g_strfreev (p->answers);
  g_free (p->answer_text);
  g_free (p);
}

/* Trims spaces, then trailing periods, then spaces again (as RULER's
 * `strip().rstrip(".").strip()`). */
static char *
trim_answer (const char *s)
{
  char *t = g_strstrip (g_strdup (s));
  gsize n = strlen (t);
  while (n > 0 && t[n - 1] == '.')
    t[--n] = 0;
  return g_strstrip (t);
}

void
harness_text_score (const char *generated, const char *const *answers, double *match, gboolean *exact)
{
  gsize n = 0, found = 0;
  for (; answers[n] != NULL; n++)
    found += strstr (generated, answers[n]) != NULL;
  *match = n > 0 ? (double) found / (double) n : 0.0;
  g_autofree char *expected = harness_text_answer (answers);
  g_autofree char *a = trim_answer (generated), *b = trim_answer (expected);
  *exact = strcmp (a, b) == 0;
}
