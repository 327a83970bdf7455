/* sift — Llama-family GGUF models behind the model protocol (model/llama/;
 * not installed: the `sift` tool and the tests link the model library). */
#pragma once

#include <glib.h>
#include <sift/config.h>
#include <sift/engine.h>
#include <sift/model.h>

#include "llama.h"

G_BEGIN_DECLS

/* Opens path (llama, qwen2 or qwen3). The shape's layers, heads and head_dim
 * come from the file; block_size and chunk_size from the caller (the
 * config); scale 0 means 1/sqrt(head_dim). */
SiftModel *sift_model_gguf_new (const char *path, gint32 block_size, gint32 chunk_size, float scale,
                                GError **error);
/* Runs the forward pass where offload.device says: SIFT_DEVICE_CUDA moves
 * it to the GPU (llama_model_use_gpu), SIFT_DEVICE_CPU leaves it. */
gboolean sift_model_gguf_use_device (SiftModel *model, SiftDevice device, GError **error);
/* The model under a SiftModel from sift_model_gguf_new, or NULL for another model. */
LlamaModel *sift_model_gguf_llama (SiftModel *model);

/* The GGUF model's keys of the config (model.path), registered with the
 * model source "gguf" by sift_gguf_config_register (the table:
 * model/llama/gguf-config.c). */
typedef struct {
  char *path;                         /* the GGUF file of model.source gguf, or NULL */
} SiftGgufConfig;

extern const SiftConfigSection sift_gguf_config_section;
void sift_gguf_config_register (void);
const SiftGgufConfig *sift_gguf_config (const SiftConfig *config);

G_END_DECLS
