/* The Llama forward pass on the GPU (offload.device cuda): the weights in
 * device memory as f16, the residual stream on the device, the
 * projections, MLP and logits by the dense operations of <sift/cuda.h>
 * (cuBLAS). The model protocol still hands q, k, v to the caller and
 * takes the attention output back in host memory: q, k, v come down after
 * their projection (bias, q/k norm and RoPE run on the host, where the
 * CPU pass runs them), the output goes up before its projection. No CUDA
 * header here or in llama.c. Private to model/llama/; docs/kernels.md,
 * "The forward pass on the GPU". */
#pragma once

#include <glib.h>

#include "llama.h"

G_BEGIN_DECLS

typedef struct _LlamaGpu LlamaGpu;

/* Uploads the weights: every matrix as f16 (F16 as it is; F32, BF16 and
 * the quantised types dequantised and rounded to f16), q/k/v and gate/up
 * each side by side as one matrix; norms as f32. */
LlamaGpu *llama_gpu_new (const LlamaConfig *c, const LlamaLayer *layers, const LlamaMat *output,
                         const float *output_norm, GError **error);
void llama_gpu_free (LlamaGpu *g);
/* Device bytes of the uploaded weights. */
guint64 llama_gpu_weight_bytes (const LlamaGpu *g);

/* A step of n tokens: x [n][n_embd] (host, the embeddings) goes up. */
gboolean llama_gpu_begin (LlamaGpu *g, const float *x, gint64 n, GError **error);
/* qkv [n][n_q + 2 n_kv] (host) = the layer's q, k, v projections of its
 * normed residual stream (before bias, q/k norm and RoPE). */
gboolean llama_gpu_qkv (LlamaGpu *g, gint32 layer, float *qkv, GError **error);
/* out [n][n_heads * head_dim] (host, the attention output): the output
 * projection and the MLP, added to the residual stream. */
gboolean llama_gpu_attended (LlamaGpu *g, gint32 layer, const float *out, GError **error);
/* logits [n_vocab] (host) of the step's last token. */
gboolean llama_gpu_end (LlamaGpu *g, float *logits, GError **error);

G_END_DECLS
