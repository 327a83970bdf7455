/* The interface between backends/cuda/cuda.c (host logic, checks, GError;
 * built by the C compiler) and backends/cuda/attn.cu (kernels and their
 * launches; built by nvcc). Plain C, no GLib: nvcc never sees GLib. */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One block of keys and values on the device: keys [start, start + n) of
 * the concatenation are rows 0..n of k and v ([kv_heads][n][head_dim],
 * f16 or bf16, strides in elements, rows 16-byte aligned). */
typedef struct {
  const void *k;
  const void *v;
  int64_t k_hs, k_ts; /* head and token strides of k */
  int64_t v_hs, v_ts;
  int32_t start;
  int32_t n;
  uint64_t heads;      /* bit h: kv head h attends these keys (masked calls; all ones otherwise) */
} SiftCudaKvBlock;

/* One attention call, checked by cuda.c. */
typedef struct {
  const float *q;      /* [q_heads][n_q][head_dim], device */
  int64_t q_hs, q_ts;
  float *out;          /* [q_heads][n_q][head_dim], device */
  int64_t out_hs, out_ts;
  float *lse;          /* [q_heads][n_q], contiguous, device */
  SiftCudaKvBlock one; /* the keys when n_blocks == 1 */
  const SiftCudaKvBlock *blocks; /* device [n_blocks] when n_blocks > 1 */
  int32_t n_blocks;
  int32_t n_kv;        /* keys in all blocks */
  int32_t q_heads, kv_heads, n_q, head_dim; /* head_dim 64 or 128 */
  int32_t bf16;        /* K/V dtype: bf16 (1) or f16 (0) */
  float qscale;        /* scale * log2(e): the kernels work in base 2 */
  int32_t causal;
  int64_t q_offset;
  int32_t masked;      /* blocks' `heads` apply (decode rows only: up to 16 per kv head) */
  int32_t n_splits;    /* key ranges per row block (flash-decoding) */
  int32_t split_len;   /* keys per split, a multiple of 64 */
  float *part_o;       /* [n_splits][q_heads][n_q][head_dim] when n_splits > 1 */
  float *part_l;       /* [n_splits][q_heads][n_q] (natural log) */
  unsigned int *counters; /* decode rows, n_splits > 1: [kv_heads] zeros (device), the splits done per kv head,
                           * the last merges them (left at 0 again); NULL: a second launch merges */
} SiftCudaAttnCall;

/* Query rows of one thread block: 16 for up to 16 rows (group x queries),
 * else SIFT_CUDA_PREFILL_ROWS. */
int sift_cuda_attn_rows_per_block (int32_t rows);

/* Thread blocks of the attention kernel for these arguments (paged: a
 * call through a block table) that one SM holds at once (shared memory
 * and registers permitting). */
int sift_cuda_attn_blocks_per_sm (int32_t head_dim, int32_t bf16, int32_t rows, int32_t paged);

/* Launches the attention (and, with n_splits > 1, the merge of the splits)
 * on `stream`; returns a cudaError_t. */
int sift_cuda_attn_launch (const SiftCudaAttnCall *c, void *stream);

/* Writes the n entries of `table` (host memory) to `dst` (device) by
 * kernels on `stream` that carry them as parameters; returns a cudaError_t. */
int sift_cuda_table_launch (SiftCudaKvBlock *dst, const SiftCudaKvBlock *table, int32_t n, void *stream);

/* o1, lse1 <- merge (o1, lse1; o2, lse2) by LSE, element-wise over
 * [heads][tokens]; o views f32 with strides in elements. */
int sift_cuda_merge_launch (float *o1, int64_t o1_hs, int64_t o1_ts, float *lse1,
                            const float *o2, int64_t o2_hs, int64_t o2_ts, const float *lse2,
                            int32_t heads, int32_t tokens, int32_t head_dim, void *stream);

/* The prefill kernel (prefill.cu, more than 16 rows per kv head), called
 * by sift_cuda_attn_launch: rows per thread block, blocks an SM holds,
 * the launch (cudaError_t). */
#define SIFT_CUDA_PREFILL_ROWS 128
int sift_cuda_prefill_blocks_per_sm (int32_t head_dim, int32_t bf16);
int sift_cuda_prefill_launch (const SiftCudaAttnCall *c, void *stream);

#ifdef __cplusplus
}
#endif
