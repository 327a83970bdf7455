/* The shipped model (models/sift-needle-14m-f16.gguf) against transformers'
 * outputs for the same weights (models/ref/, README.md there): the C
 * tokenizer of the GGUF (llama_tokenizer_from_gguf); every position's
 * argmax and the last position's logits of a forward pass with the dense attention of
 * dense-attention.h; greedy decoding through that attention's KV cache.
 * docs/model.md ("Validated against transformers") gives the figures. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <sift/sift.h>

#include "dense-attention.h"
#include "helpers.h"
#include "json.h"
#include "llama.h"

#define N_PROMPTS 3
#define N_GREEDY 8
/* Logits within this fraction of the reference's range (max - min); a
 * position whose argmax differs passes only as a near-tie: sift's logit of
 * the reference's token within this much of sift's top logit. */
#define LOGIT_TOL 1e-3

static LlamaModel *model;
static SiftTokenizer *tok;

static char *
ref_path (const char *name)
{
  return g_build_filename (SIFT_TEST_MODELS, "ref", name, NULL);
}

static char *
read_ref (const char *name)
{
  g_autofree char *path = ref_path (name);
  g_autoptr (GError) error = NULL;
  char *text = NULL;
  if (!g_file_get_contents (path, &text, NULL, &error))
    fail_msg ("%s", error->message);
  return text;
}

/* Whitespace-separated integers (ids) or decimals (logits). */
static GArray *
parse_numbers (const char *text, gboolean decimals, const char *what)
{
  GArray *a = g_array_new (FALSE, FALSE, decimals ? sizeof (double) : sizeof (gint32));
  g_auto (GStrv) words = g_strsplit_set (text, " \t\n,", -1);
  for (char **w = words; *w != NULL; w++)
    {
      if (**w == '\0')
        continue;
      char *end;
      if (decimals)
        {
          double d = g_ascii_strtod (*w, &end);
          g_array_append_val (a, d);
        }
      else
        {
          gint32 id = (gint32) g_ascii_strtoll (*w, &end, 10);
          g_array_append_val (a, id);
        }
      if (*end != '\0')
        fail_msg ("%s: bad number '%s'", what, *w);
    }
  return a;
}

static GArray *
read_numbers (int prompt, const char *ext, gboolean decimals)
{
  g_autofree char *name = g_strdup_printf ("prompt%d.%s", prompt, ext);
  g_autofree char *text = read_ref (name);
  return parse_numbers (text, decimals, name);
}

static int
setup (void **state)
{
  (void) state;
  g_autofree char *path = g_build_filename (SIFT_TEST_MODELS, "sift-needle-14m-f16.gguf", NULL);
  g_autoptr (GError) error = NULL;
  model = llama_model_open (path, &error);
  if (model != NULL)
    tok = llama_tokenizer_from_gguf (llama_model_gguf (model), &error);
  if (tok == NULL)
    fprintf (stderr, "%s\n", error->message);
  return tok == NULL;
}

static int
teardown (void **state)
{
  (void) state;
  g_clear_pointer (&tok, sift_tokenizer_free);
  g_clear_pointer (&model, llama_model_free);
  return 0;
}

static void
assert_ids_equal (const GArray *got, const GArray *want, const char *what)
{
  for (guint i = 0; i < MIN (got->len, want->len); i++)
    if (g_array_index (got, gint32, i) != g_array_index (want, gint32, i))
      fail_msg ("%s: id %u is %d, transformers' %d", what, i, g_array_index (got, gint32, i),
                g_array_index (want, gint32, i));
  if (got->len != want->len)
    fail_msg ("%s: %u ids, transformers' %u", what, got->len, want->len);
}

static void
assert_round_trip (const char *text, gssize len, SiftTokenizeFlags flags, const GArray *want, const char *decoded,
                   const char *what)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GArray) ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  if (!sift_tokenizer_encode (tok, text, len, flags, ids, &error))
    fail_msg ("%s: %s", what, error->message);
  assert_ids_equal (ids, want, what);
  g_autofree char *back = sift_tokenizer_decode (tok, (const gint32 *) (void *) ids->data, ids->len, FALSE, &error);
  assert_non_null (back);
  if (strcmp (back, decoded) != 0)
    fail_msg ("%s: decodes to \"%s\", not \"%s\"", what, back, decoded);
}

/* Each prompt: BOS, then tokenizers' ids; decoding (BOS left out) gives the text. */
static void
test_prompts_encode (void **state)
{
  (void) state;
  for (int p = 0; p < N_PROMPTS; p++)
    {
      g_autofree char *name = g_strdup_printf ("prompt%d.txt", p);
      g_autofree char *text = read_ref (name);
      g_autoptr (GArray) want = read_numbers (p, "ids", FALSE);
      assert_round_trip (text, -1, SIFT_TOKENIZE_ADD_SPECIAL, want, text, name);
    }
}

/* tokenizer-cases.json: each {text, ids, decoded}, no BOS (read with the
 * harness's JSON reader). */
static void
test_cases_encode (void **state)
{
  (void) state;
  g_autofree char *text = read_ref ("tokenizer-cases.json");
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonNode) cases = json_parse (text, &error);
  if (cases == NULL)
    fail_msg ("tokenizer-cases.json: %s", error->message);
  assert_int_equal (cases->type, JSON_ARRAY);
  assert_true (cases->items->len > 0);
  for (guint i = 0; i < cases->items->len; i++)
    {
      const JsonNode *c = g_ptr_array_index (cases->items, i), *ids = json_get (c, "ids");
      const char *in = json_get_string (c, "text"), *decoded = json_get_string (c, "decoded");
      assert_true (in != NULL && decoded != NULL && ids != NULL && ids->type == JSON_ARRAY);
      g_autoptr (GArray) want = g_array_new (FALSE, FALSE, sizeof (gint32));
      for (guint j = 0; j < ids->items->len; j++)
        {
          const JsonNode *id = g_ptr_array_index (ids->items, j);
          assert_int_equal (id->type, JSON_NUMBER);
          gint32 v = (gint32) id->number;
          g_array_append_val (want, v);
        }
      g_autofree char *what = g_strdup_printf ("tokenizer case %u \"%s\"", i, in);
      assert_round_trip (in, -1, SIFT_TOKENIZE_NONE, want, decoded, what);
    }
}

static double
logit_range (const float *x, gint32 n)
{
  float lo = x[0], hi = x[0];
  for (gint32 i = 1; i < n; i++)
    lo = MIN (lo, x[i]), hi = MAX (hi, x[i]);
  return hi - lo;
}

/* The last position's logits within LOGIT_TOL of promptN.logits' range. */
static void
assert_logits_close (const float *logits, int p, const char *how)
{
  gint32 n = llama_model_config (model)->n_vocab;
  g_autoptr (GArray) ref = read_numbers (p, "logits", TRUE);
  assert_int_equal (ref->len, n);
  double lo = INFINITY, hi = -INFINITY, worst = 0;
  for (gint32 i = 0; i < n; i++)
    {
      double r = g_array_index (ref, double, i);
      lo = MIN (lo, r), hi = MAX (hi, r);
      worst = MAX (worst, fabs (logits[i] - r));
    }
  print_message ("prompt%d %s: last logits max |diff| %.3g, range %.3g, %.3g of the range\n", p, how, worst,
                 hi - lo, worst / (hi - lo));
  if (worst > LOGIT_TOL * (hi - lo))
    fail_msg ("prompt%d %s: last logits max |diff| %g > %g of the range %g", p, how, worst, LOGIT_TOL, hi - lo);
}

/* The argmax at every position. The model protocol gives a step's last
 * logits only, so every position is its own step of one token through the
 * cache; a differing argmax passes only as a near-tie (LOGIT_TOL). */
static void
test_argmax_every_position (void **state)
{
  (void) state;
  const LlamaConfig *c = llama_model_config (model);
  for (int p = 0; p < N_PROMPTS; p++)
    {
      g_autoptr (GArray) ids = read_numbers (p, "ids", FALSE), want = read_numbers (p, "argmax", FALSE);
      assert_int_equal (ids->len, want->len);
      Cache kc;
      cache_init (&kc, c, ids->len);
      g_autofree float *logits = g_new (float, c->n_vocab);
      int differ = 0, ties = 0;
      for (guint t = 0; t < ids->len; t++)
        {
          step (model, &kc, t, 1, &g_array_index (ids, gint32, t), logits);
          gint32 got = argmax (logits, c->n_vocab), ref = g_array_index (want, gint32, t);
          if (got == ref)
            continue;
          double gap = (logits[got] - logits[ref]) / logit_range (logits, c->n_vocab);
          print_message ("prompt%d position %u: argmax %d, transformers' %d (logit gap %.3g of the range)\n", p, t,
                         got, ref, gap);
          if (gap <= LOGIT_TOL)
            ties++;
          else
            differ++;
        }
      cache_clear (&kc);
      assert_logits_close (logits, p, "one token a step");
      print_message ("prompt%d: %u positions, %d argmax differ, %d near-ties\n", p, ids->len, differ, ties);
      assert_int_equal (differ, 0);
    }
}

/* The prompt in one step (a full prefill): its last logits within
 * LOGIT_TOL of transformers' range; then greedy decoding, one token a step
 * through the same cache, gives transformers' ids up to EOS. */
static void
test_prefill_logits_and_greedy (void **state)
{
  (void) state;
  const LlamaConfig *c = llama_model_config (model);
  assert_true (c->tied);
  for (int p = 0; p < N_PROMPTS; p++)
    {
      g_autoptr (GArray) ids = read_numbers (p, "ids", FALSE), want = read_numbers (p, "greedy", FALSE);
      Cache kc;
      cache_init (&kc, c, ids->len + N_GREEDY);
      g_autofree float *logits = g_new (float, c->n_vocab);
      step (model, &kc, 0, ids->len, (const gint32 *) (void *) ids->data, logits);

      assert_logits_close (logits, p, "prefill");

      g_autoptr (GArray) got = g_array_new (FALSE, FALSE, sizeof (gint32));
      for (gint64 pos = ids->len;; pos++)
        {
          gint32 next = argmax (logits, c->n_vocab);
          g_array_append_val (got, next);
          if (next == sift_tokenizer_eos (tok) || got->len == N_GREEDY)
            break;
          step (model, &kc, pos, 1, &next, logits);
        }
      cache_clear (&kc);
      g_autofree char *what = g_strdup_printf ("prompt%d greedy", p);
      assert_ids_equal (got, want, what);
    }
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_prompts_encode),
    cmocka_unit_test (test_cases_encode),
    cmocka_unit_test (test_argmax_every_position),
    cmocka_unit_test (test_prefill_logits_and_greedy),
  };
  return cmocka_run_group_tests (tests, setup, teardown);
}
