/* sift — what the tokenizer's files share (tokenizer.c, tokenizer-spm.c,
 * tokenizer-bpe.c). */
#pragma once

#include "tokenizer.h"

typedef enum {
  TOKENIZER_LLAMA, /* SentencePiece BPE */
  TOKENIZER_GPT2,  /* byte-level BPE */
} TokenizerKind;

/* An open-addressing table from byte strings to token ids. */
typedef struct {
  gint32 *slots; /* [mask + 1] token id, -1 empty */
  guint32 mask;
} VocabIndex;

/* gpt2 merges: (left id, right id) -> rank and the merged token's id. */
typedef struct {
  guint64 key;   /* left << 32 | right; G_MAXUINT64 empty */
  gint32 rank;   /* position in tokenizer.ggml.merges: lower merges first */
  gint32 result;
} MergeSlot;

struct _SiftTokenizer {
  TokenizerKind kind;
  char *model;
  char *pre;
  gint32 n_tokens;
  const char **text;     /* [n_tokens] the vocabulary entries, in `strings` */
  guint32 *text_len;     /* [n_tokens] */
  const char **piece;    /* [n_tokens] the bytes each token stands for (decode) */
  guint32 *piece_len;    /* [n_tokens] */
  float *scores;         /* [n_tokens] llama: merge priority, higher first */
  guint8 *types;         /* [n_tokens] SiftTokenType */
  GStringChunk *strings; /* owns text and piece bytes */
  VocabIndex index;

  gint32 bos, eos, unk, pad;
  gboolean add_bos, add_eos, add_space_prefix;

  gint32 *special;       /* [n_special] control, user-defined and unknown tokens, longest first */
  gint32 n_special;
  gint32 byte_token[256]; /* llama: <0xXX>; gpt2: the token of the byte's stand-in character; -1 none */

  /* gpt2 */
  MergeSlot *merges;     /* [merge_mask + 1] */
  guint32 merge_mask;
  GRegex **regex;        /* [n_regex] applied in turn, each to the previous one's pieces */
  gint32 n_regex;
  gboolean ignore_merges; /* a pre-token that is itself a token is not merged (llama3) */
};

/* The id of text[0..len), or -1. */
gint32 tokenizer_find (const SiftTokenizer *self, const char *text, gsize len);

/* The merge of left and right, or NULL. */
const MergeSlot *tokenizer_merge (const SiftTokenizer *self, gint32 left, gint32 right);

/* A binary max-heap of candidate merges; "better" is the kind's order. */
typedef struct {
  float priority; /* llama: the merged token's score; gpt2: -rank */
  gint32 left;    /* symbol index of the left side: ties go to the leftmost */
  gint32 right;
  guint32 size;   /* llama: bytes of the merged text; gpt2: the merged token */
} Bigram;

typedef struct {
  Bigram *items;
  gsize n, cap;
} BigramHeap;

void bigram_heap_push (BigramHeap *heap, Bigram b);
Bigram bigram_heap_pop (BigramHeap *heap);

/* One symbol of a word being merged: a span of the word's bytes, linked to
 * its live neighbours. */
typedef struct {
  gint32 prev, next; /* symbol indices, -1 at the ends */
  guint32 off, len;  /* bytes of the word; len 0 once merged into prev */
  gint32 id;         /* gpt2: the token; llama: unused */
} Symbol;

/* Appends the ids of a text fragment free of special tokens. */
void tokenizer_spm_encode (const SiftTokenizer *self, const char *text, gsize len,
                           gboolean space_prefix, GArray *ids);
void tokenizer_bpe_encode (const SiftTokenizer *self, const char *text, gsize len, GArray *ids);

/* gpt2: builds the merge table, the byte tokens and the pre-tokenizer. */
gboolean tokenizer_bpe_init (SiftTokenizer *self, const SiftTokenizerSpec *spec,
                             const char *source, GError **error);
void tokenizer_bpe_clear (SiftTokenizer *self);
/* gpt2: the bytes a vocabulary entry stands for (its characters mapped back). */
void tokenizer_bpe_unmap (const char *text, gsize len, GString *out);
