/* y = W x for the projections, the MLP and the logits: every supported
 * tensor type, scalar / AVX2 / AVX-512 (VNNI) kernels chosen at run time
 * (sift_isa_active (), SIFT_ISA), threaded over output rows. Quantised
 * weights take 8-bit activations and integer dot products. */
#pragma once

#include <glib.h>
#include <sift/attn.h>

#include "gguf.h"

G_BEGIN_DECLS

/* A weight matrix: n_out rows of n_in elements of `type`. */
typedef struct {
  GgufTensorType type;
  gint64 n_in, n_out;
  gsize row_bytes;
  const guint8 *data; /* [n_out][row_bytes] */
} LlamaMat;

/* The dot product of one weight row (n elements) with one activation row
 * prepared for that type (f32 for F32/F16/BF16, ActQ8 blocks for Q8_0/Q4_0,
 * ActQ8K blocks for Q4_K/Q6_K). */
typedef float (*LlamaDotFn) (const void *w, const void *act, gint64 n);

/* A register tile: tile_r weight rows (w_stride bytes apart) against nt
 * (1..tile_t) activation rows (act_stride bytes apart), n elements each:
 * y[t * y_stride + r] = dot (row r, activation t). Each weight vector is
 * loaded and unpacked once for nt tokens, which is what prefill needs. */
typedef void (*LlamaTileFn) (const guint8 *w, gsize w_stride, const guint8 *act, gsize act_stride, int nt,
                             gint64 n, float *y, gsize y_stride);

/* Panels: LLAMA_PANEL_ROWS weight rows against all n_tok tokens, which
 * pack has laid out once per product, 16 tokens at a time (the activation
 * rows past n_tok are zeros), in pack_bytes (n) per 16 tokens. */
typedef struct {
  gsize (*pack_bytes) (gint64 n);
  void (*pack) (const guint8 *act, gsize act_stride, gint64 n, guint8 *packed);
  void (*run) (const guint8 *w, gsize w_stride, const guint8 *packed, gint64 n_tok, gint64 n, float *y,
               gsize y_stride);
} LlamaPanel;
#define LLAMA_PANEL_ROWS 16
#define LLAMA_PANEL_MIN_TOKENS 16 /* fewer tokens take the tiles or dots */

typedef struct {
  const char *name;
  LlamaDotFn dot[GGUF_TENSOR_TYPE_COUNT];
  LlamaTileFn tile[GGUF_TENSOR_TYPE_COUNT];   /* optional per type (NULL: dot only) */
  int tile_r, tile_t;
  const LlamaPanel *panel[GGUF_TENSOR_TYPE_COUNT]; /* optional per type, for >= LLAMA_PANEL_MIN_TOKENS */
} LlamaMatmulKernels;

extern const LlamaMatmulKernels llama_matmul_scalar;
#ifdef SIFT_HAVE_AVX2
extern const LlamaMatmulKernels llama_matmul_avx2;
#endif
#ifdef SIFT_HAVE_AVX512
extern const LlamaMatmulKernels llama_matmul_avx512; /* needs AVX-512 VNNI */
#endif
#ifdef SIFT_HAVE_AMX
/* AMX int8 (matmul-amx.c): whether the CPU has it and the kernel grants the
 * tile state; the Q8_0 and Q4_K panels. llama_matmul_kernels_get
 * (SIFT_ISA_AVX512) adds them to the AVX-512 kernels when usable. */
gboolean llama_amx_usable (void);
gsize llama_amx_pack_bytes_q8_0 (gint64 n);
void llama_amx_pack_q8_0 (const guint8 *act, gsize as, gint64 n, guint8 *packed);
void llama_amx_panel_q8_0 (const guint8 *w, gsize ws, const guint8 *packed, gint64 n_tok, gint64 n, float *y, gsize ys);
gsize llama_amx_pack_bytes_q4_k (gint64 n);
void llama_amx_pack_q4_k (const guint8 *act, gsize as, gint64 n, guint8 *packed);
void llama_amx_panel_q4_k (const guint8 *w, gsize ws, const guint8 *packed, gint64 n_tok, gint64 n, float *y, gsize ys);
#endif

/* The kernels of `isa`, or NULL when the CPU lacks it. */
const LlamaMatmulKernels *llama_matmul_kernels_get (SiftIsa isa);

/* A matrix over a tensor of dims [n_in, n_out] (a supported type). */
void llama_mat_init (LlamaMat *m, GgufTensorType type, gint64 n_in, gint64 n_out, const void *data);

/* y [n_tok][n_out] = x [n_tok][n_in] W^T with the active ISA's kernels. */
void llama_matmul (const LlamaMat *w, const float *x, float *y, gint64 n_tok);
void llama_matmul_with (const LlamaMatmulKernels *k, const LlamaMat *w, const float *x, float *y, gint64 n_tok);

G_END_DECLS
