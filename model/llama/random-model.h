/* Random-weight GGUF models of each architecture and tensor type, seeded,
 * with a small byte-level BPE (gpt2-kind) tokenizer in the metadata: the
 * fixtures of tests and benches, written in the build tree. */
#pragma once

#include <glib.h>

#include "gguf.h"

G_BEGIN_DECLS

typedef struct {
  const char *arch;     /* "llama", "qwen2" (q, k, v biases), "qwen3" (q, k norms) */
  GgufTensorType type;  /* of the matrices (token_embd and output too); norms and biases F32 */
  gint32 n_layers, n_embd, n_ff, n_heads, n_kv_heads, head_dim, n_vocab;
  gint64 n_ctx;
  float rope_base, eps;
  const char *rope_scaling; /* "none", "linear", "yarn", "llama3" (the rope_freqs tensor) */
  float rope_factor;
  gint64 rope_orig_ctx;
  gboolean tied;        /* no output.weight: logits from token_embd */
  guint64 seed;
  /* For tests of bad files: a tensor to leave out, a tokenizer vocabulary
   * of another size than the embedding (0: n_vocab). */
  const char *omit_tensor;
  gint32 tokenizer_vocab;
} GgufRandomModel;

/* A tiny model: 2 layers, 256 wide, 4 heads of 64 (2 kv), FFN 512, 384 tokens. */
void gguf_random_model_init (GgufRandomModel *m, const char *arch, GgufTensorType type, guint64 seed);
gboolean gguf_random_model_write (const GgufRandomModel *m, const char *path, GError **error);

/* gpt2's byte-level alphabet: the code point that stands for byte b. */
gunichar gguf_gpt2_byte_char (guint8 b);

G_END_DECLS
