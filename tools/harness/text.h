/* Text needles for a real model (model.source gguf; docs/needle.md, "Real
 * text"): haystacks of prose and shuffled words, RULER's needles and
 * question template in exactly the format the shipped model was trained on
 * (tools/train/haystack.py), and RULER's scoring of the generated answer.
 * Errors are SIFT_HARNESS_ERROR. */
#pragma once

#include <glib.h>
#include <sift/config.h>

#include "tokenizer.h"

G_BEGIN_DECLS

/* ---- The haystack text (haystack.c) ------------------------------------------ */

typedef struct _HarnessCorpus HarnessCorpus;

/* file NULL or "": the King James Bible, one verse a unit, read from
 * Debian's `bible` reader (packages bible-kjv and bible-kjv-text); else a
 * text file cut into sentences. SIFT_HARNESS_ERROR_INVALID when the reader
 * is missing or the text too short to fill a haystack (the message says
 * what to install or set). */
HarnessCorpus *harness_corpus_load (const char *file, GError **error);
void harness_corpus_free (HarnessCorpus *corpus);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (HarnessCorpus, harness_corpus_free)
/* Where the text came from, for messages and records. */
const char *harness_corpus_source (const HarnessCorpus *corpus);
gsize harness_corpus_n_units (const HarnessCorpus *corpus);
/* A random key word (lowercase, 5-10 letters) or value word (4-9 letters),
 * each seen at least 3 times in the corpus. */
const char *harness_corpus_word (const HarnessCorpus *corpus, gboolean key, GRand *rand);

/* The corpus bound to a tokenizer: token ids of its words and units,
 * computed once (the corpus and tokenizer are borrowed and must outlive it). */
typedef struct _HarnessTextSource HarnessTextSource;
HarnessTextSource *harness_text_source_new (HarnessCorpus *corpus, const SiftTokenizer *tok, GError **error);
void harness_text_source_free (HarnessTextSource *src);
const HarnessCorpus *harness_text_source_corpus (const HarnessTextSource *src);
const SiftTokenizer *harness_text_source_tokenizer (const HarnessTextSource *src);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (HarnessTextSource, harness_text_source_free)

/* One haystack sentence: its token ids (each begins at a pre-token
 * boundary, so the ids of a text are the concatenation of its pieces'). */
typedef struct {
  gint32 *ids;
  gsize n;
} HarnessPiece;

/* Sentences whose ids sum to exactly n_tokens: runs of 2-7 consecutive
 * units (about a fifth of the tokens) between runs of sentences of words
 * drawn at random by their frequency in the corpus, the tail filled with
 * one-token words. Returns a GArray of HarnessPiece (ids owned). */
GArray *harness_text_haystack (HarnessTextSource *src, GRand *rand, gint64 n_tokens);

/* ---- A cell's prompt (text-prompt.c) ---------------------------------------------- */

typedef struct {
  gint32 *ids;              /* [n_ids]: BOS, preamble, haystack with needles, question */
  gint64 n_ids;
  gint64 haystack_start;    /* first haystack token (after BOS and the preamble) */
  gint64 haystack_tokens;   /* haystack tokens, needles not counted */
  gint64 question_start;    /* first token of the question */
  gsize n_needles;
  gint64 *needle_start;     /* [n_needles] first token of each needle sentence, ascending */
  gint64 *needle_end;       /* [n_needles] one past its last token */
  gboolean *needle_asked;   /* [n_needles] its key is asked (multikey: FALSE for distractors) */
  gint64 depth_offset;      /* haystack token offset the needles were inserted at */
  char **answers;           /* NULL-terminated: the values asked for, in answer order */
  char *answer_text;        /* " v1, v2 and v3." as the model was trained to answer */
  gint64 max_new_tokens;    /* the answer's tokens + 4 */
} HarnessTextPrompt;

/* The prompt of one cell: exactly `length` tokens with the needles of
 * h->needle and h->value at `depth` of the haystack, on the sentence
 * boundary nearest it. Same (seed, length): the same haystack at every
 * depth. SIFT_HARNESS_ERROR_INVALID when the needles and question leave
 * too little room, naming the numbers. */
HarnessTextPrompt *harness_text_prompt_new (HarnessTextSource *src, const SiftHarnessConfig *h, gint64 length,
                                            double depth, guint64 seed, GError **error);
void harness_text_prompt_free (HarnessTextPrompt *prompt);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (HarnessTextPrompt, harness_text_prompt_free)

/* RULER's scoring: *match the fraction of answers found in `generated`
 * (string_match_all); *exact whether the generated text, trimmed of spaces
 * and a final period, equals the expected answer so trimmed. */
void harness_text_score (const char *generated, const char *const *answers, double *match, gboolean *exact);
/* " a", " a and b", " a, b and c", then "." (the answer as trained). */
char *harness_text_answer (const char *const *values);

G_END_DECLS
