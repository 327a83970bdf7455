/* Subquadratic sparse attention: candidate sets and kernels.
 *
 * Query i attends to four families of keys (docs/policies/subquadratic.md):
 *   window     j in [i - window, i]           (non-causal: [i - window, i + window])
 *   globals    g in globals, g < seq, g <= i  (non-causal: g < seq)
 *   log-stride i - 2^k for 2^k < seq, i >= 2^k (non-causal also i + 2^k < seq)
 *   landmarks  mean key / value of a complete block of block_size tokens:
 *              pivot = (i + 1) / block_size - 1, blocks pivot - 1, pivot and
 *              pivot - 2^k for 2^k < n_blocks (non-causal: pivot = i's block,
 *              pivot + 1 and pivot + 2^k too, never i's own block)
 * Each candidate counts once: a stamp array per worker marks what a row has
 * already taken, so no per-call hash set is built.
 *
 * Everything here is private to the plugin; tests and the bench compile
 * this file directly. */
#pragma once

#include <glib.h>
#include <sift/plugin.h>

G_BEGIN_DECLS

typedef struct {
  gint64 window;          /* >= 0 */
  gint64 block_size;      /* landmark block, >= 1 */
  const gint64 *globals;  /* [n_globals]; entries >= seq (or negative) are skipped */
  gsize n_globals;
  gboolean causal;
  gboolean log_stride;
  gboolean landmarks;
  gboolean sort_candidates; /* ascending candidate order before attending */
} SqConfig;

/* The defaults: window 128, block 64, globals [0], everything on. */
void sq_config_default (SqConfig *config);

/* Dedup marks: one slot per position (or block); a row takes a fresh stamp,
 * so nothing is cleared between rows. */
typedef struct {
  guint32 *marks; /* [capacity] */
  gint64 capacity;
  guint32 stamp;
} SqStamp;

void sq_stamp_init (SqStamp *s);
void sq_stamp_clear (SqStamp *s);
/* Makes room for positions [0, n) and starts a new row (new stamp). */
void sq_stamp_next (SqStamp *s, gint64 n);

/* Upper bounds of what one row can produce, for sizing buffers. */
gsize sq_max_token_candidates (const SqConfig *c, gint64 seq);
gsize sq_max_landmark_candidates (const SqConfig *c, gint64 seq);

/* Candidate positions of row i in a sequence of seq tokens (in order:
 * window, globals, strides; ascending with sort_candidates). `stamp` covers
 * [0, seq). Returns the count written to out. */
gsize sq_token_candidates (const SqConfig *c, gint64 i, gint64 seq, SqStamp *stamp, gint64 *out);
/* Landmark block ids of row i; `stamp` covers [0, n_blocks). Empty unless
 * c->landmarks. */
gsize sq_landmark_candidates (const SqConfig *c, gint64 i, gint64 seq, SqStamp *stamp, gint64 *out);

/* Candidate pairs over every row of one head (tokens plus landmarks). */
gint64 sq_count_edges (const SqConfig *c, gint64 seq);

/* ---- Kernels ---------------------------------------------------------- */

/* One (row, head)'s online softmax is <sift/simd.h>'s SiftRowState, and
 * the keys a row names alone go through sift_attend_row_sparse. */

/* Rows of one band tile. Consecutive rows share most of their windows, so
 * the tile's windows go through the band kernel, which reads each key once
 * for all the tile's rows; what is left of each row (globals and strides
 * outside its window: `idx`) and then its landmarks continue the same
 * online softmax one row at a time. */
#define SQ_BAND_ROWS 8
/* Distances (diagonals) and token entries of one tile the diagonal kernel
 * takes at most; what does not fit goes side by side. */
#define SQ_DIAG_MAX 32
#define SQ_DIAG_ENTRIES 512

/* The keys a band tile shares between its rows (its landmarks, then tokens
 * every row names), packed per kv head; consecutive tiles share the same
 * set until the pivot block moves (every block_size rows), so a caller
 * keeps one across tiles and packs again only when the set changes. */
typedef struct {
  gint32 n;                   /* keys packed; 0: nothing valid */
  gint64 key[16];             /* >= 0: token row; < 0: landmark -1 - key */
  const float *k, *lk;        /* what they were packed from */
  float *panels;              /* [kv_heads][d][16], 64-byte aligned */
} SqSharedCache;

void sq_shared_cache_init (SqSharedCache *cache, gint32 kv_heads, gint32 d);
void sq_shared_cache_clear (SqSharedCache *cache);

typedef struct {
  SiftView q, out;            /* the tile's rows: f32 [q_heads][n_rows <= SQ_BAND_ROWS][d] */
  SiftView k, v;              /* f32 [kv_heads][n][d]: every key row the tile reads */
  gint64 lo, hi;              /* row r's window: key rows [lo + r, hi + r] ... */
  gint64 floor;               /* ... clipped at this row */
  const float *panels;        /* k packed by sq_pack_panels, per kv head at g * panel_stride; or NULL */
  gint64 panel_stride;
  gint64 ring;                /* panels form a ring of this many (0: panel p is the p-th) */
  float scale;
  const gint32 *idx;          /* other key rows: row r's at [idx_start[r], idx_start[r + 1]) */
  const gsize *idx_start;
  const float *lk, *lv;       /* landmarks f32 [kv_heads][l_n][d] */
  gint64 l_n;
  const gint32 *lidx;         /* row r's landmark rows at [lidx_start[r], lidx_start[r + 1]) */
  const gsize *lidx_start;
  float *lse;                 /* out: lse of (h, r) at lse[h * lse_stride + r], or NULL */
  gint64 lse_stride;
  float *acc;                 /* scratch [SQ_BAND_ROWS][d] */
  gint32 *band_idx;           /* scratch [hi - lo + 1] (rows path) */
  const float **kp, **vp;     /* scratch [SQ_BAND_ROWS][ptr_max]: >= most idx + lidx of a row */
  gsize ptr_max;
  gint64 prefetch_shift;      /* > 0: while a head runs, fetch its idx + shift rows and rows [hi + n, hi + n + shift) into L2 (the next tile's) */
  SqSharedCache *shared;      /* packed shared keys kept between tiles, or NULL (packed per tile) */
} SqTile;

void sq_attend_tile (const SqTile *t);

/* Floats sq_pack_panels writes for n keys of one head. */
static inline gsize
sq_panel_floats (gint64 n, gint32 d)
{
  return (gsize) ((n + 15) / 16) * 16 * (gsize) d;
}

/* Block means of f32 k, v [kv_heads][seq][d] into lk, lv f32
 * [kv_heads][n_blocks][d], n_blocks = ceil(seq / block_size); a last partial
 * block averages its valid tokens. */
void sq_landmarks_compute (const SiftView *k, const SiftView *v, gint64 block_size, float *lk, float *lv);

/* Whole-sequence sparse attention (the reference crate's `forward`, plus
 * GQA and LSE): q f32 [q_heads][seq][d]; k, v f32 [kv_heads][seq][d];
 * out f32 [q_heads][seq][d]; lse [q_heads][seq] (may be NULL). Rows split
 * over sift_parallel_for. */
gboolean sq_forward (const SqConfig *c, const SiftView *q, const SiftView *k, const SiftView *v,
                     SiftView *out, float *lse, GError **error);
/* The same result (within rounding) with KV walked in ascending tiles of
 * `tile` tokens for each block of `tile` query rows: every (row, key) pair
 * of a tile is done before the next tile's keys are touched. tile 0: 64. */
gboolean sq_forward_tiled (const SqConfig *c, gint64 tile, const SiftView *q, const SiftView *k,
                           const SiftView *v, SiftView *out, float *lse, GError **error);

/* Shape and config checks shared by the forward variants. */
gboolean sq_check (const SqConfig *c, const SiftView *q, const SiftView *k, const SiftView *v,
                   const SiftView *out, GError **error);

G_END_DECLS
