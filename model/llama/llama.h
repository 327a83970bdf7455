/* A Llama-family model (llama, qwen2, qwen3) from a GGUF file: its shape,
 * weights (mapped, used in place) and forward pass, driven one step at a
 * time as the model protocol drives a model: begin -> for each layer
 * qkv, attention (by the caller), attended -> end. Private to model/llama/. */
#pragma once

#include <glib.h>

#include "gguf.h"
#include "matmul.h"
#include "ops.h"
#include "tokenizer.h"

G_BEGIN_DECLS

typedef enum {
  LLAMA_ARCH_LLAMA,
  LLAMA_ARCH_QWEN2, /* + q, k, v biases */
  LLAMA_ARCH_QWEN3, /* + RMSNorm of each q and k head */
} LlamaArch;

#define LLAMA_SUPPORTED_ARCHS "llama, qwen2, qwen3"

typedef struct {
  LlamaArch arch;
  const char *arch_name;
  gint32 n_layers, n_embd, n_ff;
  gint32 n_heads, n_kv_heads, head_dim;
  gint32 n_vocab;
  gint64 n_ctx;       /* {arch}.context_length */
  float eps;          /* RMSNorm epsilon */
  LlamaRope rope;
  gboolean tied;      /* logits from token_embd (no output.weight) */
} LlamaConfig;

typedef struct {
  LlamaMat q, k, v, o;       /* q: [n_heads * head_dim][n_embd] ... o: [n_embd][n_heads * head_dim] */
  LlamaMat gate, up, down;   /* gate, up: [n_ff][n_embd]; down: [n_embd][n_ff] */
  float *attn_norm, *ffn_norm; /* [n_embd] */
  float *q_norm, *k_norm;    /* [head_dim] (qwen3) or NULL */
  float *bq, *bk, *bv;       /* [n_heads * head_dim], [n_kv_heads * head_dim] x 2 (qwen2) or NULL */
} LlamaLayer;

typedef struct _LlamaModel LlamaModel;

/* Opens and checks the file: architecture, shape, every tensor's presence,
 * type and dims. Errors are SIFT_MODEL_ERROR naming the file and the key or tensor. */
LlamaModel *llama_model_open (const char *path, GError **error);
/* As llama_model_open, without repacking any weights (repack.h): for what
 * reads the shape and tensors only (`sift model info`); its forward pass
 * runs on the rows in the mapping. */
LlamaModel *llama_model_open_checked (const char *path, GError **error);
void llama_model_free (LlamaModel *m);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (LlamaModel, llama_model_free)

const LlamaConfig *llama_model_config (const LlamaModel *m);
GgufFile *llama_model_gguf (const LlamaModel *m);
/* Bytes of the weight tensors. */
guint64 llama_model_weight_bytes (const LlamaModel *m);

/* One step: tokens [n] at positions pos0..pos0+n-1 (abandons a step an error left unfinished). */
gboolean llama_model_begin (LlamaModel *m, gint64 pos0, gint64 n, const gint32 *tokens, GError **error);
/* q [n][n_heads][head_dim], k and v [n][n_kv_heads][head_dim] of `layer`,
 * after RoPE; layers in order, each after the previous one's attended(). */
gboolean llama_model_qkv (LlamaModel *m, gint32 layer, float *q, float *k, float *v, GError **error);
/* out [n][n_heads][head_dim]: the layer's attention output. */
gboolean llama_model_attended (LlamaModel *m, gint32 layer, const float *out, GError **error);
/* logits [n_vocab] of the step's last token, or NULL for none. */
gboolean llama_model_end (LlamaModel *m, float *logits, GError **error);

/* Moves the forward pass to the GPU (llama-gpu.h): the weights uploaded
 * as f16, the projections, MLP and logits by cuBLAS; the protocol's calls
 * are the same. SIFT_CUDA_ERROR without a GPU or cuBLAS. */
gboolean llama_model_use_gpu (LlamaModel *m, GError **error);
gboolean llama_model_on_gpu (const LlamaModel *m);

/* The tokenizer of a GGUF file, from its tokenizer.ggml.* keys (gguf-tokenizer.c). */
SiftTokenizer *llama_tokenizer_from_gguf (const GgufFile *f, GError **error);

G_END_DECLS
