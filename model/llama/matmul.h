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
  const guint8 *data; /* [n_out][row_bytes], or x16: [n_out / 16] groups of 16 * row_bytes */
  gboolean x16;       /* rows interleaved by 16 (repack.h) */
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

/* x16 groups (repack.h): a group of 16 rows against nt (1..x16_t)
 * activation rows (act_stride bytes apart): y[t * y_stride + r], r < 16. */
typedef void (*LlamaX16Fn) (const guint8 *group, const guint8 *act, gsize act_stride, int nt, gint64 n, float *y,
                            gsize y_stride);

/* Panels (AMX): one x16 group against all n_tok tokens, 16 at a time; the
 * tokens' codes are read in place (rows past n_tok are zeros), pack lays
 * out what else a panel needs per 16 tokens (their scales) once per
 * product, pack_bytes (n) per 16 tokens; run may use scratch_bytes (n) of
 * 64-byte aligned scratch (its thread's own). */
typedef struct {
  gsize (*pack_bytes) (gint64 n);
  void (*pack) (const guint8 *act, gsize act_stride, gint64 n, guint8 *packed);
  gsize (*scratch_bytes) (gint64 n);
  void (*run) (const guint8 *group, const guint8 *act, gsize act_stride, const guint8 *packed, guint8 *scratch,
               gint64 n_tok, gint64 n, float *y, gsize y_stride);
} LlamaPanel;
#define LLAMA_PANEL_MIN_TOKENS 16 /* fewer tokens take the x16 kernels */

typedef struct {
  const char *name;
  LlamaDotFn dot[GGUF_TENSOR_TYPE_COUNT];
  LlamaTileFn tile[GGUF_TENSOR_TYPE_COUNT];   /* optional per type (NULL: dot only) */
  int tile_r, tile_t;
  LlamaX16Fn x16[GGUF_TENSOR_TYPE_COUNT];     /* per x16 type; NULL: the scalar table's serve */
  int x16_t;
  const LlamaPanel *panel[GGUF_TENSOR_TYPE_COUNT]; /* optional per x16 type, for >= LLAMA_PANEL_MIN_TOKENS */
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
extern const LlamaPanel llama_amx_panel_q8_0, llama_amx_panel_q4_k;
#endif

/* The kernels of `isa`, or NULL when the CPU lacks it. */
const LlamaMatmulKernels *llama_matmul_kernels_get (SiftIsa isa);

/* A matrix over a tensor of dims [n_in, n_out] (a supported type), rows in order. */
void llama_mat_init (LlamaMat *m, GgufTensorType type, gint64 n_in, gint64 n_out, const void *data);
/* Whether k has x16 kernels of its own for m's type and m's rows come in whole groups. */
gboolean llama_mat_can_repack (const LlamaMat *m, const LlamaMatmulKernels *k);
/* Rows [g0 * 16, g1 * 16) of m (rows in order) as x16 groups at dst + g0 * 16 * row_bytes. */
void llama_mat_repack_groups (const LlamaMat *m, gint64 g0, gint64 g1, guint8 *dst);
/* Row r of m (either layout) to f32. */
void llama_mat_row (const LlamaMat *m, gint64 r, float *dst);

/* y [n_tok][n_out] = x [n_tok][n_in] W^T with the active ISA's kernels. */
void llama_matmul (const LlamaMat *w, const float *x, float *y, gint64 n_tok);
void llama_matmul_with (const LlamaMatmulKernels *k, const LlamaMat *w, const float *x, float *y, gint64 n_tok);
/* y[i] [n_tok][w[i]->n_out] = x W_i^T for n_mats (<= 3) matrices of one type
 * and n_in (q, k, v; gate, up): the activations are prepared once and the
 * rows of all of them shared out in one parallel loop. */
void llama_matmul_multi (const LlamaMat *const *w, float *const *y, int n_mats, const float *x, gint64 n_tok);
void llama_matmul_multi_with (const LlamaMatmulKernels *k, const LlamaMat *const *w, float *const *y, int n_mats,
                              const float *x, gint64 n_tok);

G_END_DECLS
