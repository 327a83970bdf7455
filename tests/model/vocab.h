/* tests/model: small vocabularies built here, the same way every time, in the
 * formats GGUF files carry (see vocab.c). */
#pragma once

#include "tokenizer.h"

/* The texts every tokenizer test encodes: accents, CJK, emoji, digits,
 * contractions, whitespace runs, special-token text. */
extern const char *const vocab_corpus[];
extern const gsize vocab_corpus_len;

/* A vocabulary and what a SiftTokenizerSpec borrows from it. */
typedef struct {
  GPtrArray *tokens;  /* char* */
  GArray *scores;     /* float */
  GArray *types;      /* gint32 */
  GPtrArray *merges;  /* char*, gpt2 */
  SiftTokenizerSpec spec;
} TestVocab;

/* gpt2: the 256 byte characters, merges learned from the corpus (most frequent
 * pair first), then <|endoftext|> (BOS and EOS), <|im_start|>, <|im_end|>
 * (control) and <tool> (user-defined). */
TestVocab *test_vocab_gpt2 (const char *pre, guint n_merges);
/* llama: <unk>, <s>, </s>, <0x00>..<0xFF>, the corpus's characters seen at
 * least twice, and pieces learned from the corpus scored by when they were learned. */
TestVocab *test_vocab_llama (guint n_merges);
void test_vocab_free (TestVocab *v);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (TestVocab, test_vocab_free)

/* GPT-2's byte map, written from its description: printable Latin-1 bytes keep
 * their code point, the others take U+0100.. in byte order. */
gunichar test_byte_char (guint8 b);
