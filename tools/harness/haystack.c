/* The haystack text of real-text needles: a corpus of prose units (KJV
 * verses or a file's sentences), its word list by frequency, and haystacks
 * built in token space as tools/train/haystack.py builds them. */
#include <string.h>

#include "harness.h"
#include "text.h"

/* Share of haystack tokens that are prose (runs of consecutive units). */
#define PROSE_SHARE 0.2
/* Fewer units than this cannot fill a long haystack with varied prose. */
#define MIN_UNITS 100

struct _HarnessCorpus {
  char *source;
  GPtrArray *units;        /* char *: a verse or sentence, whitespace collapsed */
  char **words;            /* [n_words] distinct [A-Za-z]+ words, sorted */
  double *word_cum;        /* [n_words] cumulative frequency, last 1 */
  guint *counts;           /* [n_words] */
  gsize n_words;
  GArray *key_words;       /* guint: lowercase words of 5..10 letters seen >= 3 times */
  GArray *value_words;     /* guint: lowercase words of 4..9 letters seen >= 3 times */
};

/* Collapses runs of whitespace to one space and trims. */
static char *
collapse (const char *s, gssize len)
{
  GString *out = g_string_sized_new (len > 0 ? (gsize) len : 64);
  gboolean space = FALSE;
  for (const char *p = s; len < 0 ? *p != 0 : p < s + len; p++)
    {
      if (g_ascii_isspace (*p))
        {
          space = out->len > 0;
          continue;
        }
      if (space)
        g_string_append_c (out, ' ');
      space = FALSE;
      g_string_append_c (out, *p);
    }
  return g_string_free (out, FALSE);
}

/* `bible -f gen1:1-rev22:21` prints "Ge1:1 In the beginning ..." a line. */
static gboolean
read_kjv (GPtrArray *units, GError **error)
{
  const char *argv[] = { "bible", "-f", "gen1:1-rev22:21", NULL };
  g_autofree char *out = NULL, *err = NULL;
  gint status = 0;
  g_autoptr (GError) local = NULL;
  if (!g_spawn_sync (NULL, (char **) argv, NULL, G_SPAWN_SEARCH_PATH | G_SPAWN_STDIN_FROM_DEV_NULL, NULL, NULL,
                     &out, &err, &status, &local)
      || !g_spawn_check_wait_status (status, &local))
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "the default haystack is the King James Bible from Debian's `bible` reader, which failed (%s):"
                   " install it (apt-get install bible-kjv bible-kjv-text; tools/bootstrap.sh does) or set"
                   " harness.haystack to a text file", local->message);
      return FALSE;
    }
  g_auto (GStrv) lines = g_strsplit (out, "\n", -1);
  for (char **l = lines; *l != NULL; l++)
    {
      const char *text = strchr (*l, ' ');
      if (text == NULL)
        continue;
      char *unit = collapse (text, -1);
      if (unit[0] != 0)
        g_ptr_array_add (units, unit);
      else
        g_free (unit);
    }
  return TRUE;
}

/* A text file cut after each '.', '!' or '?' that ends a word. */
static gboolean
read_sentences (const char *file, GPtrArray *units, GError **error)
{
  g_autofree char *text = NULL;
  gsize len = 0;
  g_autoptr (GError) local = NULL;
  if (!g_file_get_contents (file, &text, &len, &local))
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID, "harness.haystack: %s", local->message);
      return FALSE;
    }
  if (!g_utf8_validate (text, (gssize) len, NULL))
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID, "harness.haystack: %s is not UTF-8 text",
                   file);
      return FALSE;
    }
  const char *start = text;
  for (const char *p = text; p < text + len; p++)
    if ((*p == '.' || *p == '!' || *p == '?') && (p + 1 == text + len || g_ascii_isspace (p[1])))
      {
        char *unit = collapse (start, p + 1 - start);
        if (unit[0] != 0)
          g_ptr_array_add (units, unit);
        else
          g_free (unit);
        start = p + 1;
      }
  return TRUE;
}

static int
cmp_str (gconstpointer a, gconstpointer b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

static gboolean
all_lower (const char *w)
{
  for (; *w; w++)
    if (!g_ascii_islower (*w))
      return FALSE;
  return TRUE;
}

static void
count_words (HarnessCorpus *c)
{
  g_autoptr (GHashTable) counts = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  for (guint i = 0; i < c->units->len; i++)
    {
      const char *s = c->units->pdata[i];
      while (*s)
        {
          if (!g_ascii_isalpha (*s))
            {
              s++;
              continue;
            }
          const char *e = s;
          while (g_ascii_isalpha (*e))
            e++;
          g_autofree char *w = g_strndup (s, (gsize) (e - s));
          gpointer old = g_hash_table_lookup (counts, w);
          g_hash_table_replace (counts, g_steal_pointer (&w), GUINT_TO_POINTER (GPOINTER_TO_UINT (old) + 1));
          s = e;
        }
    }
  guint n = 0;
  g_autofree gpointer *keys = g_hash_table_get_keys_as_array (counts, &n);
  qsort (keys, n, sizeof (gpointer), cmp_str);
  c->n_words = n;
  c->words = g_new0 (char *, n + 1);
  c->counts = g_new (guint, MAX (n, 1));
  c->word_cum = g_new (double, MAX (n, 1));
  double total = 0;
  for (guint i = 0; i < n; i++)
    {
      c->words[i] = g_strdup (keys[i]);
      c->counts[i] = GPOINTER_TO_UINT (g_hash_table_lookup (counts, keys[i]));
      c->word_cum[i] = total += c->counts[i];
    }
  for (guint i = 0; i < n; i++)
    c->word_cum[i] /= total;
  c->key_words = g_array_new (FALSE, FALSE, sizeof (guint));
  c->value_words = g_array_new (FALSE, FALSE, sizeof (guint));
  for (guint i = 0; i < n; i++)
    {
      gsize len = strlen (c->words[i]);
      if (!all_lower (c->words[i]) || c->counts[i] < 3)
        continue;
      if (len >= 5 && len <= 10)
        g_array_append_val (c->key_words, i);
      if (len >= 4 && len <= 9)
        g_array_append_val (c->value_words, i);
    }
}

HarnessCorpus *
harness_corpus_load (const char *file, GError **error)
{
  g_autoptr (HarnessCorpus) c = g_new0 (HarnessCorpus, 1);
  c->units = g_ptr_array_new_with_free_func (g_free);
  gboolean kjv = file == NULL || file[0] == 0;
  c->source = kjv ? g_strdup ("the King James Bible (bible-kjv-text)") : g_strdup (file);
  if (!(kjv ? read_kjv (c->units, error) : read_sentences (file, c->units, error)))
    return NULL;
  count_words (c);
  if (c->units->len < MIN_UNITS || c->key_words->len < 16 || c->value_words->len < 16)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "harness.haystack: %s has %u sentences and %u distinct lowercase words seen 3 times or more;"
                   " a haystack needs at least %d sentences and 16 such words",
                   c->source, c->units->len, c->key_words->len, MIN_UNITS);
      return NULL;
    }
  return g_steal_pointer (&c);
}

void
harness_corpus_free (HarnessCorpus *c)
{
  if (c == NULL)
    return;
  g_free (c->source);
  if (c->units != NULL)
    g_ptr_array_unref (c->units);
  if (c->words != NULL)
    g_strfreev (c->words);
  g_free (c->word_cum);
  g_free (c->counts);
  if (c->key_words != NULL)
    g_array_unref (c->key_words);
  if (c->value_words != NULL)
    g_array_unref (c->value_words);
  g_free (c);
}

const char *
harness_corpus_source (const HarnessCorpus *c)
{
  return c->source;
}

gsize
harness_corpus_n_units (const HarnessCorpus *c)
{
  return c->units->len;
}

/* ---- Token space -------------------------------------------------------------------- */

struct _HarnessTextSource {
  HarnessCorpus *corpus;
  const SiftTokenizer *tok;
  GArray *word_ids;          /* gint32: ids of " word" for every word, concatenated */
  guint *word_off;           /* [n_words + 1] */
  GPtrArray *unit_ids;       /* GArray * of gint32 per unit (" unit"), filled on first use */
  gint32 period;
  GArray *single;            /* guint: words of one token */
  double *single_cum;        /* [single->len] cumulative frequency */
};

static void
array_unref (gpointer a)
{
  if (a != NULL)
    g_array_unref (a);
}

HarnessTextSource *
harness_text_source_new (HarnessCorpus *corpus, const SiftTokenizer *tok, GError **error)
{
  g_autoptr (HarnessTextSource) s = g_new0 (HarnessTextSource, 1);
  s->corpus = corpus;
  s->tok = tok;
  s->word_ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  s->word_off = g_new (guint, corpus->n_words + 1);
  s->unit_ids = g_ptr_array_new_full (corpus->units->len, array_unref);
  g_ptr_array_set_size (s->unit_ids, (gint) corpus->units->len);
  s->single = g_array_new (FALSE, FALSE, sizeof (guint));
  for (gsize i = 0; i < corpus->n_words; i++)
    {
      s->word_off[i] = s->word_ids->len;
      g_autofree char *w = g_strconcat (" ", corpus->words[i], NULL);
      if (!sift_tokenizer_encode (tok, w, -1, SIFT_TOKENIZE_NONE, s->word_ids, error))
        return NULL;
      if (s->word_ids->len - s->word_off[i] == 1)
        g_array_append_val (s->single, i);
    }
  s->word_off[corpus->n_words] = s->word_ids->len;
  g_autoptr (GArray) p = g_array_new (FALSE, FALSE, sizeof (gint32));
  if (!sift_tokenizer_encode (tok, ".", -1, SIFT_TOKENIZE_NONE, p, error))
    return NULL;
  if (p->len != 1 || s->single->len < 10)
    {
      g_set_error (error, SIFT_HARNESS_ERROR, SIFT_HARNESS_ERROR_INVALID,
                   "the model's tokenizer splits '.' into %u tokens and has %u one-token words of %s: a text"
                   " haystack needs '.' as one token and at least 10 one-token words", p->len, s->single->len,
                   corpus->source);
      return NULL;
    }
  s->period = g_array_index (p, gint32, 0);
  s->single_cum = g_new (double, s->single->len);
  double total = 0;
  for (guint i = 0; i < s->single->len; i++)
    s->single_cum[i] = total += corpus->counts[g_array_index (s->single, guint, i)];
  for (guint i = 0; i < s->single->len; i++)
    s->single_cum[i] /= total;
  return g_steal_pointer (&s);
}

void
harness_text_source_free (HarnessTextSource *s)
{
  if (s == NULL)
    return;
  if (s->word_ids != NULL)
    g_array_unref (s->word_ids);
  g_free (s->word_off);
  if (s->unit_ids != NULL)
    g_ptr_array_unref (s->unit_ids);
  if (s->single != NULL)
    g_array_unref (s->single);
  g_free (s->single_cum);
  g_free (s);
}

const HarnessCorpus *
harness_text_source_corpus (const HarnessTextSource *s)
{
  return s->corpus;
}

const SiftTokenizer *
harness_text_source_tokenizer (const HarnessTextSource *s)
{
  return s->tok;
}

/* The index of the first cum[i] > u (u in [0, 1)). */
static gsize
draw (const double *cum, gsize n, double u)
{
  gsize lo = 0, hi = n - 1;
  while (lo < hi)
    {
      gsize mid = (lo + hi) / 2;
      if (cum[mid] > u)
        hi = mid;
      else
        lo = mid + 1;
    }
  return lo;
}

static const GArray *
unit_ids (HarnessTextSource *s, guint i)
{
  GArray *ids = s->unit_ids->pdata[i];
  if (ids == NULL)
    {
      ids = g_array_new (FALSE, FALSE, sizeof (gint32));
      g_autofree char *text = g_strconcat (" ", (const char *) s->corpus->units->pdata[i], NULL);
      /* The corpus is valid UTF-8 (checked on load), so encoding cannot fail. */
      g_autoptr (GError) error = NULL;
      if (!sift_tokenizer_encode (s->tok, text, -1, SIFT_TOKENIZE_NONE, ids, &error))
        g_error ("tokenizing a haystack unit: %s", error->message);
      s->unit_ids->pdata[i] = ids;
    }
  return ids;
}

static void
piece_add (GArray *pieces, const gint32 *ids, gsize n, gint64 *total)
{
  HarnessPiece p = { g_memdup2 (ids, n * sizeof (gint32)), n };
  g_array_append_val (pieces, p);
  *total += (gint64) n;
}

static void
piece_clear (gpointer data)
{
  g_free (((HarnessPiece *) data)->ids);
}

GArray *
harness_text_haystack (HarnessTextSource *s, GRand *rand, gint64 n_tokens)
{
  const HarnessCorpus *c = s->corpus;
  GArray *out = g_array_new (FALSE, FALSE, sizeof (HarnessPiece));
  g_array_set_clear_func (out, piece_clear);
  g_autoptr (GArray) buf = g_array_new (FALSE, FALSE, sizeof (gint32));
  gint64 total = 0, prose = 0;
  while (total < n_tokens)
    {
      if ((double) prose < PROSE_SHARE * (double) (total + 1))
        {
          guint start = (guint) g_rand_int_range (rand, 0, (gint32) c->units->len - 8);
          guint run = (guint) g_rand_int_range (rand, 2, 8);
          for (guint i = start; i < start + run; i++)
            {
              const GArray *ids = unit_ids (s, i);
              piece_add (out, (const gint32 *) ids->data, ids->len, &total);
              prose += ids->len;
            }
          continue;
        }
      gint n_sent = g_rand_int_range (rand, 3, 9);
      for (gint k = 0; k < n_sent; k++)
        {
          gint n_words = g_rand_int_range (rand, 6, 19);
          g_array_set_size (buf, 0);
          for (gint w = 0; w < n_words; w++)
            {
              gsize i = draw (c->word_cum, c->n_words, g_rand_double (rand));
              g_array_append_vals (buf, &g_array_index (s->word_ids, gint32, s->word_off[i]),
                                   s->word_off[i + 1] - s->word_off[i]);
            }
          g_array_append_val (buf, s->period);
          piece_add (out, (const gint32 *) buf->data, buf->len, &total);
        }
    }
  /* Whole sentences past the budget go; one-token words fill the gap. */
  while (total > n_tokens)
    {
      total -= (gint64) g_array_index (out, HarnessPiece, out->len - 1).n;
      g_array_set_size (out, out->len - 1);
    }
  if (total < n_tokens)
    {
      g_array_set_size (buf, 0);
      for (gint64 i = total; i < n_tokens; i++)
        {
          guint w = g_array_index (s->single, guint, draw (s->single_cum, s->single->len, g_rand_double (rand)));
          g_array_append_val (buf, g_array_index (s->word_ids, gint32, s->word_off[w]));
        }
      piece_add (out, (const gint32 *) buf->data, buf->len, &total);
    }
  return out;
}

const char *
harness_corpus_word (const HarnessCorpus *c, gboolean key, GRand *rand)
{
  const GArray *list = key ? c->key_words : c->value_words;
  return c->words[g_array_index (list, guint, g_rand_int_range (rand, 0, (gint32) list->len))];
}
