/* MInference vertical-slash sparse prefill: estimation, index and kernel.
 *
 * Private to policies/minference (the plugin and its tests compile these
 * files directly). Positions are absolute token positions; a "slash" is a
 * diagonal named by its distance d = query position - key position (d = 0
 * is the main diagonal); a "vertical" is a key column. See
 * docs/policies/minference.md for the algorithm and the mask definition. */
#pragma once

#include <glib.h>
#include <sift/plugin.h>

G_BEGIN_DECLS

/* Query rows per tile of the sparse kernel by default: the slash diagonals
 * of a tile become whole key ranges [tile_start - d, tile_end - d), so a
 * lone diagonal costs `tile` keys per row. MInference's GPU kernel uses 64;
 * the CPU kernel reuses each key panel across 128 rows whatever the tile,
 * so a small tile wastes less on scattered diagonals at little cost. */
#define VS_TILE_DEFAULT 4
#define VS_TILE_MAX 256

/* ---- Estimation (vs-estimate.c) ------------------------------------------
 *
 * For the last r query rows (positions p0 .. p0 + r - 1) of every query
 * head, the softmax attention over keys [0, n_keys) (causal: row p sees
 * keys <= p), summed per key column (vertical score) and per diagonal
 * (slash score). Keys arrive in blocks of any size in ascending order, in
 * two passes: the first finds each row's log-sum-exp, the second adds the
 * exact probabilities e^(s - lse) into the sums. */
typedef struct _VsEstimator VsEstimator;

VsEstimator *vs_estimator_new (gint32 n_q_heads, gint32 n_kv_heads, gint32 head_dim, float scale);
void vs_estimator_free (VsEstimator *e);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (VsEstimator, vs_estimator_free)

/* q: f32 [n_q_heads][r][head_dim], the rows at positions p0 .. p0 + r - 1
 * (copied); n_keys > p0 + r - 1. Clears both passes. */
void vs_estimator_begin (VsEstimator *e, const SiftView *q, gint64 p0, gint64 n_keys);
/* Pass 1 over keys [key0, key0 + k->n_tokens): k is [n_kv_heads][n][head_dim]. */
void vs_estimator_pass1 (VsEstimator *e, const SiftView *k, gint64 key0);
/* Pass 2, same blocks again (after every pass-1 block). */
void vs_estimator_pass2 (VsEstimator *e, const SiftView *k, gint64 key0);
/* Scores of query head h after pass 2: vertical[j] for key j and slash[d]
 * for distance d, both [n_keys]. */
const float *vs_estimator_vertical (const VsEstimator *e, gint32 h);
const float *vs_estimator_slash (const VsEstimator *e, gint32 h);
/* Per-row log-sum-exp after pass 1: [n_q_heads][r]. */
const float *vs_estimator_lse (VsEstimator *e);

/* Top-k selection. The first n_forced items (columns 0.. or distances 0..)
 * are always kept; the rest of k goes to the highest scores (ties: lower
 * index first, NaN last: sift_top_k). Returns how many were written to out (min (max (k,
 * n_forced), n)), ascending. */
gsize vs_select_top (const float *score, gint64 n, gint64 k, gint64 n_forced, gint64 *out);

/* Vertical and slash counts for a sequence of n keys: fixed sizes, or with
 * budget > 0 a fraction of n split max(31, 0.2 b) / max(101, 0.8 b). The
 * sink and recent counts are lower bounds; both results are capped at n. */
void vs_sizes (gint64 n, gint64 vertical_size, gint64 slash_size, double budget, gint64 num_sink,
               gint64 num_recent, gint64 *n_vertical, gint64 *n_slash);

/* ---- Pattern and index (vs-index.c) ---------------------------------------
 *
 * A head's pattern: vertical columns and slash distances, both ascending.
 * For query rows cut into tiles of `tile` rows from the chunk's first row,
 * tile rows [a, b) visit the union of the key ranges [a - d, b - d) over
 * the slash distances d, merged and clipped to [0, b), and the vertical
 * columns below b outside those ranges; row p of the tile attends the
 * visited keys j <= p. The ranges are generated per key window on the fly,
 * so the index costs O(n_vertical + n_slash) memory whatever the length. */
typedef struct {
  gint64 start, end;  /* keys [start, end) */
} VsRange;

typedef struct {
  const gint64 *vertical; /* [n_vertical] ascending key columns */
  gsize n_vertical;
  const gint64 *slash;    /* [n_slash] ascending distances */
  gsize n_slash;
} VsPattern;

/* The merged slash ranges of tile rows [a, b) inside keys [k0, k1),
 * ascending; out needs room for n_slash ranges. Returns how many. */
gsize vs_tile_ranges (const VsPattern *p, gint64 a, gint64 b, gint64 k0, gint64 k1, VsRange *out);
/* Keys attended by rows [q_pos, q_pos + n_q) under the pattern (causal). */
gint64 vs_pattern_count (const VsPattern *p, gint64 q_pos, gint64 n_q, gint32 tile, VsRange *scratch);

/* ---- Kernel (vs-kernel.c) -------------------------------------------------
 *
 * Streams key blocks in ascending order; every (query head, tile) attends
 * the keys of its index inside the block, with an online softmax whose
 * running max, sum and accumulator live in the state, so each key is
 * visited once whatever the block size. */
typedef struct _VsAttn VsAttn;

/* The kernel's large buffers, kept across calls so that memory is faulted
 * in and zeroed by the OS once per run, not once per call (vs-kernel.c). A
 * workspace serves one call at a time. */
typedef struct _VsWork VsWork;
VsWork *vs_work_new (void);
void vs_work_free (VsWork *w);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (VsWork, vs_work_free)
/* Grows w to what a call of this shape needs (n_q rows of n_q_heads query
 * heads, key blocks of up to block_keys keys, up to max_vertical columns
 * per head) and touches the memory, so that such calls take no page faults. */
void vs_work_reserve (VsWork *w, gint32 n_q_heads, gint64 n_q, gint32 d, gint32 n_kv_heads, gint64 block_keys,
                      gint64 max_vertical);

/* q: f32 [n_q_heads][n_q][head_dim] at positions q_pos..; pattern[h] for
 * each query head (kept by pointer until vs_attn_free). work: the buffers
 * to use until vs_attn_free (NULL: the call's own). */
VsAttn *vs_attn_new (const SiftView *q, gint64 q_pos, gint32 n_kv_heads, float scale, gint32 tile,
                     const VsPattern *pattern, VsWork *work);
void vs_attn_free (VsAttn *a);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (VsAttn, vs_attn_free)
/* Keys [key0, key0 + k->n_tokens): k, v [n_kv_heads][n][head_dim], any dtype. */
void vs_attn_block (VsAttn *a, const SiftView *k, const SiftView *v, gint64 key0);
/* Writes out (f32 [n_q_heads][n_q][head_dim]) and lse ([n_q_heads][n_q]):
 * natural log, -inf with output 0 for a row that attended nothing. */
void vs_attn_finish (VsAttn *a, SiftView *out, float *lse);
/* Keys attended so far, rows x keys summed over heads. */
gint64 vs_attn_attended (const VsAttn *a);

/* ---- Inner loops (vs-group.c; vs-kernel-avx2.c, vs-kernel-avx512.c) -------
 *
 * Rows of one tile against a group of keys: the kernel's online-softmax
 * step and the estimator's scores, with a scalar reference and the
 * dispatch to the SIMD loops. */

/* Keys per call of the inner loop. */
#define VS_KEY_GROUP 32

/* Inner loop of the kernel: rows [0, n_rows) of one tile (row r at position
 * pos0 + r) against one group of keys. m, l: [n_rows]; acc [n_rows][d]. */
typedef struct {
  const float *q;          /* [n_rows][d], pre-multiplied by the scale */
  gint64 pos0;
  gint32 n_rows, d;
  float *m, *l, *acc;
  gint64 attended;         /* keys attended so far, summed over rows */
} VsTile;

/* A panel of VS_KEY_GROUP keys, K transposed so a row's scores are FMAs
 * of broadcast query elements: consecutive keys (positions key0 + lane), or
 * with `pos` set, the keys at pos[lane] (ascending; a head's vertical
 * columns packed together). The lanes set in `mask` are the tile's keys,
 * and row p attends those at positions <= p. */
typedef struct {
  const float *kt;                     /* [d][VS_KEY_GROUP] */
  const float *krow[VS_KEY_GROUP];     /* the same keys untransposed, f32 [d] each (lanes in mask) */
  const float *vrow[VS_KEY_GROUP];     /* f32 [d] each (lanes in mask) */
  const gint64 *pos;                   /* [VS_KEY_GROUP] ascending, G_MAXINT64 past the last key; or NULL */
  gint64 key0;
  guint32 mask;
} VsGroup;

/* Lanes of a group whose key is at position p or before (mask ignored). */
static inline guint32
vs_lanes_upto (const VsGroup *g, gint64 p)
{
  gint64 n;
  if (g->pos == NULL)
    n = p - g->key0 + 1;
  else if (g->pos[VS_KEY_GROUP - 1] <= p)
    n = VS_KEY_GROUP;
  else
    for (n = 0; g->pos[n] <= p; n++)
      ;
  if (n <= 0)
    return 0;
  return n >= VS_KEY_GROUP ? 0xffffffffu : (guint32) ((1u << n) - 1);
}

/* Lanes of a group row p attends: the mask, cut at the causal limit. */
static inline guint32
vs_visible_lanes (const VsGroup *g, gint64 p)
{
  return g->mask & vs_lanes_upto (g, p);
}

void vs_group_attend_scalar (VsTile *t, const VsGroup *g);
#ifdef VS_HAVE_AVX2
void vs_group_attend_avx2 (VsTile *t, const VsGroup *g);
#endif
#ifdef VS_HAVE_AVX512
void vs_group_attend_avx512 (VsTile *t, const VsGroup *g);

/* Tiles of at most 4 rows: a per-(head, tile) buffer of scored keys.
 * Each group's keys are scored as it passes (the K panel is in L1 then)
 * and packed into the buffer, rows' invisible keys as -inf; the online
 * softmax step, the accumulator's rescale and the P.V pass run once the
 * buffer holds VS_PENDING_KEYS keys, however the keys were scattered over
 * groups (lone diagonals, stray columns, partial panels). Scores of a few
 * keys are 4 x 4 blocks of dot products, of many the transposed panel.
 * Every buffered key is flushed before the tile's state is read. */
#define VS_PENDING_KEYS 32
typedef struct {
  float s[4][VS_PENDING_KEYS + 16];    /* scores, then probabilities, of the buffered keys per row */
  const float *vrow[VS_PENDING_KEYS];  /* their value rows */
  gint32 n;                            /* keys buffered */
} VsPending;

void vs_pending_add_avx512 (VsTile *t, VsPending *pd, const VsGroup *g);
/* Two adjacent tiles of one head (t1's rows right after t0's, t0 of 4
 * rows) against the group, with their own lane masks (g->mask unused):
 * when both need the transposed panel, one pass scores all eight rows.
 * Same result as vs_pending_add_avx512 on each. */
void vs_pending_add2_avx512 (VsTile *t0, VsPending *pd0, guint32 mask0, VsTile *t1, VsPending *pd1,
                             guint32 mask1, const VsGroup *g);
void vs_pending_flush_avx512 (VsTile *t, VsPending *pd);
#endif

/* kt[c * VS_KEY_GROUP + i] = krow[i][c] for i < n; zero lanes past n. */
void vs_transpose (const float *const *krow, gint32 n, gint32 d, float *kt);

/* Scores of n_rows query rows (q [n_rows][d], pre-scaled) against
 * n_keys <= VS_KEY_GROUP keys: s[r * VS_KEY_GROUP + kk]. */
void vs_scores_scalar (const float *q, gint32 n_rows, gint32 d, const float *const *krow, gint32 n_keys,
                       float *s);
#ifdef VS_HAVE_AVX2
void vs_scores_avx2 (const float *q, gint32 n_rows, gint32 d, const float *const *krow, gint32 n_keys,
                     float *s);
#endif

/* Tests: force the inner loops to a SiftIsa (the caller checked the CPU
 * has it); -1 follows sift_isa_active () again. */
void vs_set_isa (int isa);
/* The ISA the inner loops use: sift_isa_active () unless a test forced one. */
SiftIsa vs_isa (void);

/* The paths sift_isa_active () picks. */
void vs_group_attend (VsTile *t, const VsGroup *g);
void vs_scores (const float *q, gint32 n_rows, gint32 d, const float *const *krow, gint32 n_keys, float *s);

/* f32 view of k (itself when it is f32; else converted into *buf). */
SiftView vs_view_f32 (const SiftView *k, float **buf, gsize *cap);

/* ---- One chunk (vs-prefill.c) ----------------------------------------------
 *
 * Estimation from the chunk's last rows against every key so far, pattern
 * selection per query head, then the sparse kernel: three passes over the
 * key blocks [0, q_pos + n_q) that a block source yields in ascending order
 * (passes 1 and 2 need K only). */
typedef struct {
  gint32 tile;          /* query rows per kernel tile, 1..VS_TILE_MAX */
  gint32 last_q;        /* rows the estimate uses (the chunk's last) */
  gint64 num_sink;      /* columns 0.. always kept */
  gint64 num_recent;    /* distances 0.. always kept */
} VsEstimateOpts;

typedef void (*VsBlockFunc) (gpointer data, const SiftView *k, const SiftView *v, gint64 key0);
/* Calls fn for every key block in ascending order (v may be NULL when
 * want_v is FALSE). */
typedef gboolean (*VsBlockSource) (gpointer source, gboolean want_v, VsBlockFunc fn, gpointer data,
                                   GError **error);

typedef struct {
  gint64 keys_attended;  /* rows x keys summed over heads */
  gint64 keys_causal;    /* what dense causal attention would attend */
  double seconds_estimate, seconds_attend;
} VsStats;

typedef struct {
  gint64 vertical, slash;  /* columns and diagonals kept (as vs_sizes gives) */
} VsSizes;

/* sizes[h] per query head.
 * q: f32 [n_q_heads][n_q][head_dim] at positions q_pos..; out, lse as
 * sift_attn_dense. */
gboolean vs_chunk_prefill (const SiftView *q, gint64 q_pos, gint32 n_kv_heads, float scale,
                           const VsEstimateOpts *opts, const VsSizes *sizes, VsWork *work,
                           VsBlockSource source, gpointer source_data, SiftView *out, float *lse,
                           VsStats *stats, GError **error);

/* The whole sequence at once (positions 0 .. n-1 in q, k, v): one block.
 * When every head's sizes cover the sequence it calls sift_attn_dense, so
 * the result is exactly dense. */
gboolean vs_prefill (const SiftView *q, const SiftView *k, const SiftView *v, float scale,
                     const VsEstimateOpts *opts, const VsSizes *sizes, VsWork *work, SiftView *out, float *lse,
                     VsStats *stats, GError **error);

/* TRUE when the sizes cover every key of an n-key sequence for all heads. */
gboolean vs_sizes_dense (const VsSizes *sizes, gint32 n_q_heads, gint64 n);

G_END_DECLS
