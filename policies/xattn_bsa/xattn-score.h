/* XAttention (Xu et al., 2025): antidiagonal block scoring, threshold
 * selection and the vote that turns per-head choices into one load list.
 * Private to the xattn_bsa plugin; the tests compile these files directly.
 * docs/policies/xattn_bsa.md explains the algorithm and the block mapping. */
#pragma once

#include <glib.h>
#include <sift/plugin.h>

G_BEGIN_DECLS

/* The AVX-512 panel products and masses are compiled where <sift/simd.h>
 * has its x86 primitives (xattn-dots-avx512.c sets its own target), and
 * used only when sift_isa_active () says so; plain dot products are
 * libsift's sift_score_tile. */
#ifdef SIFT_SIMD_X86
#define XATTN_HAVE_AVX512 1
#endif

typedef struct {
  gint32 n_q_heads;
  gint32 n_kv_heads;  /* divides n_q_heads */
  gint32 head_dim;
  gint32 stride;      /* S: tokens per reshaped row and column */
  gint32 block;       /* B: XAttention's estimation block in tokens, a multiple of S */
  float scale;        /* attention scale (1/sqrt(d)); reshaped logits use scale / (S * norm) */
  float norm;         /* the reference's norm (1, or 0 for 1: the mean of the antidiagonal's logits) */
  gboolean sum_exp;   /* score a column by the sum of its antidiagonal's exp(scale * logit / norm) */
} XattnGeometry;

/* ---- Scoring ------------------------------------------------------------
 * With stride S the reshaped key column c is keys cS..cS+S-1 concatenated,
 * the reshaped query row r is queries rS+S-1, rS+S-2, ..., rS concatenated
 * (reversed), so each product sums one antidiagonal of an SxS tile of
 * q.k^T. Row r sees columns c <= r (causal at reshaped granularity, as in
 * the reference), softmax runs per reshaped row, and the score of (query
 * block i, key block j) is the probability mass of the B/S rows of block i
 * in the B/S columns of block j. A full row of block scores therefore sums
 * to B/S. Missing tokens at the end of the sequence count as zero vectors;
 * a column or row exists if it holds at least one real token. */

typedef struct _XattnScorer XattnScorer;

XattnScorer *xattn_scorer_new (const XattnGeometry *geo);
void xattn_scorer_free (XattnScorer *s);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (XattnScorer, xattn_scorer_free)

/* Starts a chunk of n_q queries at positions q_pos.. (q_pos % S == 0);
 * q is f32 [n_q_heads][n_q][head_dim]. Keys then arrive by add_keys, every
 * position in [0, q_pos + n_q) at most once, in any order. */
void xattn_scorer_begin (XattnScorer *s, const SiftView *q, gint64 q_pos, gint64 n_q);
/* Keys at positions [pos0, pos0 + n): k [n_kv_heads][n][head_dim], f32,
 * f16 or bf16. pos0 % S == 0; n % S == 0 unless pos0 + n == q_pos + n_q. */
void xattn_scorer_add_keys (XattnScorer *s, const SiftView *k, gint64 pos0, gint64 n);
/* Like add_keys, but the keys are copied into a staging buffer and scored
 * when it holds XATTN_STAGE_TOKENS contiguous tokens (or on a gap, a partial
 * column, or finish): each pass over the chunk's reshaped queries then meets
 * many columns, instead of one stored block's few. */
#define XATTN_STAGE_TOKENS 1024
void xattn_scorer_stage_keys (XattnScorer *s, const SiftView *k, gint64 pos0, gint64 n);
/* The chunk's query blocks are first_qb .. first_qb + n_qb - 1 (absolute,
 * B tokens each; the first and last may be partial); key blocks 0 .. n_kb - 1. */
gint64 xattn_scorer_first_qb (const XattnScorer *s);
gint64 xattn_scorer_n_qb (const XattnScorer *s);
gint64 xattn_scorer_n_kb (const XattnScorer *s);
/* Block scores f32 [n_q_heads][n_qb][n_kb] (staged keys are scored
 * first); key blocks whose keys were never added score 0. */
void xattn_scorer_finish (XattnScorer *s, float *scores);

/* The reshaped rows of the chunk; with stride 1, its queries. */
gint64 xattn_scorer_n_rows (const XattnScorer *s);
/* Each reshaped row's softmax mass per key block, f32
 * [n_q_heads][n_rows][n_kb] (a row sums to 1; one that saw no key is 0).
 * With stride 1 this is each query's exact attention mass per key block:
 * what the exact rows (xattn_select_exact_rows) select from. */
void xattn_scorer_finish_rows (XattnScorer *s, float *mass);

#ifdef XATTN_HAVE_AVX512
/* max_i x[i] * scale, and sum_i exp(x[i] * scale - m) for x[i] * scale <= m
 * (a polynomial exp, relative error ~1e-7; the scalar path uses expf). */
float xattn_max_scaled_avx512 (const float *x, gsize n, float scale);
float xattn_sum_exp_avx512 (const float *x, gsize n, float scale, float m);
#endif
/* Packed key panels: the reshaped columns of a key range, 16 per panel
 * with the columns along the lanes: panel q, element (e, l) at
 * dst[(q * rlen + e) * 16 + l] is entry e (= p * head_dim + t, for segment p
 * of the column) of column 16q + l, i.e. key (16q + l) S + p, dim t; keys
 * past n_tokens and columns past the last are zeros. k: one kv head's keys
 * [n_tokens][head_dim], f32, rows `k_stride` floats apart. dst holds
 * ceil(n_cols / 16) * rlen * 16 floats, n_cols = ceil(n_tokens / S). */
void xattn_pack_panels (const float *k, gsize k_stride, gint64 n_tokens, gint32 stride, gint32 head_dim,
                        float *dst);
/* The same keys as columns col0 .. of dst (their panels' other lanes left
 * as they are): how staged keys are packed as they arrive. */
void xattn_pack_panels_at (const float *k, gsize k_stride, gint64 n_tokens, gint32 stride, gint32 head_dim,
                           gint64 col0, float *dst);
#ifdef XATTN_HAVE_AVX512
/* sift_score_tile over packed panels, per segment: out[(s * n_rows + i) *
 * n_cols + j] = sum_t rows[i * row_stride + s * len + t] x entry (s * len
 * + t) of column j, for segments s < n_seg (each panel n_seg * len
 * entries). With n_seg = S and len = head_dim these are the S products of
 * `sum_exp`; with n_seg = 1 and len = S * head_dim, the summed antidiagonal. */
void xattn_dots_panels_avx512 (const float *rows, gsize row_stride, gint64 n_rows, const float *panels,
                               gint64 n_cols, gsize len, gint64 n_seg, float *out);
/* sum over s < n_seg, i < n of exp(x[s * seg_stride + i] * scale) as
 * (returned sum) x e^(*m), *m the largest x * scale; scale > 0, n >= 1. */
float xattn_block_mass_avx512 (const float *x, gsize seg_stride, gint64 n_seg, gsize n, float scale, float *m);
/* The same for n_blocks consecutive blocks of 16 columns x 8 segments
 * (block b's segment p at x + p * seg_stride + 16 b: sum_exp's blocks at
 * stride 8, B = 128), mass b = sum[b] x e^m[b], exponentials in base 2. */
void xattn_block_masses_16x8_avx512 (const float *x, gsize seg_stride, gint64 n_blocks, float scale, float *m,
                                     float *sum);
#endif
/* The path in use: the best one built in that sift_isa_active () allows,
 * unless forced scalar. */
SiftIsa xattn_dots_isa (void);
/* For tests: force the scalar path (TRUE) or allow the SIMD ones (FALSE). */
void xattn_dots_force_scalar (gboolean scalar);

/* ---- Threshold selection --------------------------------------------------
 * One row of block scores (query block qb, key blocks 0..n_kb-1): key block
 * 0 (the sink) and qb (the diagonal) always; the other causal blocks
 * (kb < qb) sorted by score, descending (ties: lower index first), added
 * while the mass selected so far is below threshold x the row's total.
 * threshold >= 1 selects every causal block; future blocks never.
 * selected: guint8 [n_kb], written fully. order: scratch of n_kb entries. */
void xattn_select_row (const float *row, gint64 n_kb, gint64 qb, double threshold,
                       guint8 *selected, gint64 *order);

/* Exact rows (a sift extension, docs/policies/xattn_bsa.md): queries
 * pos0 .. pos0 + n_rows - 1 scored exactly, mass [n_q_heads][n_rows][n_kb]
 * from a stride-1 scorer. Each row keeps what xattn_select_row keeps for
 * its own mass (sink and its query block's diagonal included), and that is
 * added (or) to its query block's row of sel [n_q_heads][n_qb][n_kb]
 * (query blocks qb0 .. qb0 + n_qb - 1, B = block tokens each). */
void xattn_select_exact_rows (const float *mass, gint32 n_q_heads, gint64 n_rows, gint64 pos0, gint64 block,
                              gint64 qb0, gint64 n_qb, gint64 n_kb, double threshold, guint8 *sel);

/* ---- Aggregation for offload ----------------------------------------------
 * From per-(head, query block) selections of key blocks to engine blocks:
 * an engine block of `meta` (tokens [first_token, first_token + n_valid))
 * counts as chosen by a selection if it overlaps one of its key blocks.
 *   head_any[h][e]: q head h chose e for at least one query block;
 *   load[e]: votes over (kv head, query block) pairs, where a kv head votes
 *     for e if any q head of its group chose it: VOTE_ANY keeps e with one
 *     vote, VOTE_MAJORITY with more than vote_threshold x (n_kv_heads x n_qb)
 *     votes; the first entry of `ids` (the sink) is always loaded, and with
 *     last_block the last one too (sift's addition, not the reference's).
 *   attend[h][e]: load[e] and (head_any[h][e] or e is first, or last
 *     with last_block);
 *   qb_attend[qb][h][e]: the same for query block qb alone: load[e] and
 *     (h chose e for qb, or e is first, or last with last_block) — what
 *     block-sparse attention per query block attends.
 * ids: the engine block ids considered (ascending), meta indexed by id. */
typedef enum {
  XATTN_VOTE_ANY = 0,
  XATTN_VOTE_MAJORITY = 1,
} XattnVote;

typedef struct {
  gint64 n;          /* engine blocks considered */
  gint64 n_qb;       /* query blocks */
  guint8 *load;      /* [n] */
  guint8 *attend;    /* [n_q_heads][n] */
  guint8 *qb_attend; /* [n_qb][n_q_heads][n] */
  gint64 *votes;     /* [n] */
} XattnPlan;

void xattn_plan_init (XattnPlan *plan, gint32 n_q_heads, gint64 n_qb, gint64 n);
void xattn_plan_clear (XattnPlan *plan);

/* sel: guint8 [n_q_heads][n_qb][n_kb] from xattn_select_row. */
void xattn_aggregate (const XattnGeometry *geo, const guint8 *sel, gint64 n_qb, gint64 n_kb,
                      const SiftBlockMeta *meta, const gint64 *ids, gint64 n_ids,
                      XattnVote vote, double vote_threshold, gboolean last_block, XattnPlan *plan);

G_END_DECLS
