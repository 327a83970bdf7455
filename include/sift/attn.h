/* sift — attention kernels.
 *
 * Every kernel computes, for each query head h and query row i,
 *   o[h][i] = sum_j softmax_j(scale * q[h][i] . k[g][j]) v[g][j],   g = h / (q_heads / kv_heads)
 *   lse[h][i] = log sum_j exp(scale * q[h][i] . k[g][j])            (natural log)
 * over the keys j that the kernel visits. A row that visits no key gets
 * o = 0 and lse = -inf, which is the identity of sift_attn_merge.
 *
 * Views: q and out are f32 [q_heads][n_q][head_dim]; k and v are f32, f16 or
 * bf16 [kv_heads][n_kv][head_dim]; lse is contiguous f32 [q_heads][n_q].
 * All arithmetic is f32. Each kernel has a scalar path (the reference that
 * tests compare against) and AVX2 / AVX-512 paths chosen at run time. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/view.h>

G_BEGIN_DECLS

typedef struct {
  float scale;      /* 0: 1 / sqrt(head_dim) */
  gboolean causal;  /* query row i sees keys j <= q_offset + i */
  gint64 q_offset;  /* key position of query row 0 (causal only) */
} SiftAttnOpts;

/* Dense attention of n_q queries against n_kv keys, tiled with an online
 * softmax. For a prefill chunk at positions kv_len..kv_len+n_q-1 against
 * keys 0..kv_len+n_q-1: causal = TRUE, q_offset = kv_len. */
SIFT_API gboolean sift_attn_dense (const SiftView *q, const SiftView *k, const SiftView *v,
                                   const SiftAttnOpts *opts, SiftView *out, float *lse,
                                   GError **error);

/* Decode: 1..16 query rows. Reads each K/V row once for all query heads of
 * its group and splits the KV length over threads, merging by LSE. Same
 * results as sift_attn_dense. Memory-bound on long contexts: K/V from
 * sift_mem_alloc (huge pages) streams faster than on 4 KiB pages. */
#define SIFT_ATTN_DECODE_MAX_ROWS 16
SIFT_API gboolean sift_attn_decode (const SiftView *q, const SiftView *k, const SiftView *v,
                                    const SiftAttnOpts *opts, SiftView *out, float *lse,
                                    GError **error);

/* Attention over an explicit list of key rows: rows[0..n_rows) index the
 * token axis of k and v (any order, no duplicates). With opts->causal, query
 * row i skips rows r > q_offset + i. */
SIFT_API gboolean sift_attn_gather (const SiftView *q, const SiftView *k, const SiftView *v,
                                    const gint64 *rows, gsize n_rows, const SiftAttnOpts *opts,
                                    SiftView *out, float *lse, GError **error);

/* Paged attention: K and V given as a list of blocks rather than one view.
 * k_blocks[b] and v_blocks[b] are [kv_heads][n_b][head_dim] (strided, f32,
 * f16 or bf16; n_b >= 0 and may differ per block; every block has the same
 * heads, head_dim and dtype, K's and V's alike). The keys are the
 * concatenation of the blocks in order: the result is that of
 * sift_attn_dense on the concatenated K and V (q_offset and causal mean the
 * same), in one call instead of one call and one sift_attn_merge per block.
 * Up to SIFT_ATTN_DECODE_MAX_ROWS query rows take the decode path (keys
 * split over threads, merged by LSE; same results as sift_attn_decode on the
 * concatenation), more rows the tiled dense path (same results as
 * sift_attn_dense). n_blocks = 0: no key, every row o = 0 and lse = -inf. */
SIFT_API gboolean sift_attn_paged (const SiftView *q, const SiftView *k_blocks, const SiftView *v_blocks,
                                   gsize n_blocks, const SiftAttnOpts *opts, SiftView *out, float *lse,
                                   GError **error);

/* Merges partial result (o2, lse2) into (o1, lse1), in place:
 *   m = max(l1, l2); o = (e^(l1-m) o1 + e^(l2-m) o2) / (e^(l1-m) + e^(l2-m));
 *   l = m + log(e^(l1-m) + e^(l2-m)).
 * o1 and o2 are f32 views of one shape; lse1, lse2 contiguous [heads][tokens]. */
SIFT_API gboolean sift_attn_merge (SiftView *o1, float *lse1, const SiftView *o2, const float *lse2,
                                   GError **error);

/* Instruction sets of the kernels. */
typedef enum {
  SIFT_ISA_SCALAR = 0,
  SIFT_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
  SIFT_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/DQ */
} SiftIsa;

/* The best ISA this CPU supports (detected once). */
SIFT_API SiftIsa sift_isa_detect (void);
/* The ISA kernels use now: the detected one unless forced. */
SIFT_API SiftIsa sift_isa_active (void);
/* Forces kernels to an ISA (tests compare paths); FALSE if the CPU lacks it.
 * SIFT_ISA env var ("scalar", "avx2", "avx512") does the same at start. */
SIFT_API gboolean sift_isa_force (SiftIsa isa);
SIFT_API const char *sift_isa_name (SiftIsa isa);

G_END_DECLS
