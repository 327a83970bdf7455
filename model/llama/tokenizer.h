/* sift — the tokenizers of GGUF models (private to model/llama/).
 *
 * Two kinds, named by the GGUF key tokenizer.ggml.model:
 *   "llama": SentencePiece BPE: pieces merge by score, "▁" stands for a space,
 *            unknown bytes fall back to <0xXX> byte tokens;
 *   "gpt2":  byte-level BPE: a pre-tokenizer regex (tokenizer.ggml.pre) splits
 *            the text, each split's bytes map to printable code points, and
 *            pairs merge by rank (tokenizer.ggml.merges).
 * Control and user-defined tokens (BOS, EOS, <|im_start|>, ...) are matched in
 * the raw text before either BPE runs, as llama.cpp does.
 *
 * The spec borrows its arrays: the tokenizer copies what it keeps, so the
 * caller (the GGUF reader) may unmap them after sift_tokenizer_new(). */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
typedef enum {
  SIFT_TOKEN_TYPE_UNDEFINED = 0,
  SIFT_TOKEN_TYPE_NORMAL = 1,
  SIFT_TOKEN_TYPE_UNKNOWN = 2,
  SIFT_TOKEN_TYPE_CONTROL = 3,
  SIFT_TOKEN_TYPE_USER_DEFINED = 4,
  SIFT_TOKEN_TYPE_UNUSED = 5,
  SIFT_TOKEN_TYPE_BYTE = 6,
} SiftTokenType;

typedef struct {
  const char *model;          /* tokenizer.ggml.model: "llama" or "gpt2" */
  const char *pre;            /* tokenizer.ggml.pre; NULL means "default" */
  const char *const *tokens;  /* [n_tokens] tokenizer.ggml.tokens, UTF-8 */
  gint32 n_tokens;
  const float *scores;        /* [n_tokens] tokenizer.ggml.scores, or NULL */
  const gint32 *token_types;  /* [n_tokens] tokenizer.ggml.token_type (SiftTokenType), or NULL */
  const char *const *merges;  /* [n_merges] tokenizer.ggml.merges, "left right"; gpt2 only */
  gint32 n_merges;
  /* tokenizer.ggml.{bos,eos,unknown,padding}_token_id; -1 when absent (the llama
   * kind then takes llama.cpp's defaults: unk 0, bos 1, eos 2) */
  gint32 bos_id, eos_id, unk_id, pad_id;
  /* tokenizer.ggml.add_{bos,eos}_token: 1 or 0; -1 when absent (the kind's default,
   * as llama.cpp's: llama and gpt2 with pre "llama3" add BOS, others do not; none adds EOS) */
  gint8 add_bos, add_eos;
  /* tokenizer.ggml.add_space_prefix: 1 or 0; -1 when absent (1); the gpt2 kind ignores it */
  gint8 add_space_prefix;
  const char *source;         /* names the file in error messages; may be NULL */
} SiftTokenizerSpec;

/* A spec with every id -1 and every optional field NULL. */
#define SIFT_TOKENIZER_SPEC_INIT \
  { .bos_id = -1, .eos_id = -1, .unk_id = -1, .pad_id = -1, .add_bos = -1, .add_eos = -1, \
    .add_space_prefix = -1 }

typedef enum {
  SIFT_TOKENIZE_NONE = 0,
  SIFT_TOKENIZE_ADD_SPECIAL = 1 << 0,   /* add BOS / EOS as the spec asks */
  SIFT_TOKENIZE_PARSE_SPECIAL = 1 << 1, /* text "<s>", "<|im_start|>" becomes the control token */
} SiftTokenizeFlags;

typedef struct _SiftTokenizer SiftTokenizer;

/* Validates the spec: a known model and pre-tokenizer, a non-empty vocabulary,
 * ids in range, merges that name known tokens, byte tokens for byte fallback.
 * Errors are SIFT_MODEL_ERROR_INVALID and name the source, the key and the value. */
SiftTokenizer *sift_tokenizer_new (const SiftTokenizerSpec *spec, GError **error);
void sift_tokenizer_free (SiftTokenizer *self);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftTokenizer, sift_tokenizer_free)

/* Appends the ids of text[0..len) (len -1: NUL-terminated) to ids (a GArray of
 * gint32). Text that is not valid UTF-8 is an error. */
gboolean sift_tokenizer_encode (const SiftTokenizer *self, const char *text, gssize len,
                                SiftTokenizeFlags flags, GArray *ids, GError **error);

/* The text of ids[0..n): byte tokens joined, the space that encoding put before
 * the text removed (llama kind), control tokens left out unless special.
 * Always valid UTF-8 (an incomplete sequence at the end becomes U+FFFD).
 * decode (encode (s)) == s, except that the llama kind reads a "▁" (U+2581) in
 * s as a space, as SentencePiece does.
 * An id out of range is an error naming it. */
char *sift_tokenizer_decode (const SiftTokenizer *self, const gint32 *ids, gsize n,
                             gboolean special, GError **error);

/* Appends the bytes one token stands for (a byte token: its one byte, so a
 * piece may be part of a UTF-8 sequence); for streaming output.
 * Control tokens append nothing unless special. id must be in range. */
void sift_tokenizer_piece (const SiftTokenizer *self, gint32 id, gboolean special, GString *out);

gint32 sift_tokenizer_n_tokens (const SiftTokenizer *self);
const char *sift_tokenizer_model (const SiftTokenizer *self); /* "llama" or "gpt2" */
const char *sift_tokenizer_pre (const SiftTokenizer *self);   /* the pre-tokenizer in use */
gint32 sift_tokenizer_bos (const SiftTokenizer *self);        /* -1 when none */
gint32 sift_tokenizer_eos (const SiftTokenizer *self);
/* Whether generation stops at id: EOS, or a control token such as <|eot_id|>,
 * <|im_end|>, <|endoftext|>. */
gboolean sift_tokenizer_is_eog (const SiftTokenizer *self, gint32 id);
/* The vocabulary entry as stored (e.g. "▁the", "Ġthe", "<0x0A>"); id in range. */
const char *sift_tokenizer_token_text (const SiftTokenizer *self, gint32 id);

G_END_DECLS
