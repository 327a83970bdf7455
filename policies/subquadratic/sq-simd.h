/* The subquadratic tile kernels (AVX-512), chosen at run time from
 * sift_isa_active (), so SIFT_ISA=scalar and -Dsimd=false force the plain
 * paths. */
#pragma once

#include <sift/plugin.h>

#include "sq-core.h"

/* Rows to ask into the L2 cache while a kernel computes: key and value
 * rows idx[x] + shift (x < n, rows below `limit` only) of one head, far
 * behind the window, that the next tile reads, and the rows the next tile
 * adds to its window. A kernel takes one step
 * (the next 64 bytes of one key and one value row) at a time between its
 * FMAs; sq_prefetch_rest takes what is left. */
typedef struct {
  const char *k, *v;
  gint64 k_stride, v_stride; /* bytes */
  const gint32 *idx;
  gsize n;
  gint64 shift, limit;
  gint64 next_lo, next_n;    /* then rows [next_lo, next_lo + next_n): the next tile's newest keys */
  gint32 row_bytes;
  gsize x;                   /* progress: row x, byte b */
  gint32 b;
} SqPrefetch;

static inline void
sq_prefetch_step (SqPrefetch *p)
{
  if (p->x >= p->n + (gsize) p->next_n)
    return;
  gint64 j = p->x < p->n ? p->idx[p->x] + p->shift : p->next_lo + (gint64) (p->x - p->n);
  if (j < p->limit)
    {
      __builtin_prefetch (p->k + j * p->k_stride + p->b, 0, 2);
      __builtin_prefetch (p->v + j * p->v_stride + p->b, 0, 2);
    }
  p->b += 64;
  if (p->b >= p->row_bytes || j >= p->limit)
    {
      p->b = 0;
      p->x++;
    }
}

static inline void
sq_prefetch_rest (SqPrefetch *p)
{
  while (p->x < p->n + (gsize) p->next_n)
    sq_prefetch_step (p);
}

/* The window band of one tile for one head: rows r < n_rows (<= 8), q row
 * r at q + r * q_stride, attend keys j in [lo + r, hi + r] (j >= floor), keys
 * read from panels of 16 (sq_pack_panels: dimension-major; a ring of
 * `ring` panels when ring > 0) and values at v + j * v_stride. st[r]
 * starts afresh. */
typedef struct {
  const float *q;
  gint64 q_stride;
  gint32 n_rows;
  float scale;
  const float *panels;        /* panel p at panels + (ring ? p % ring : p) * d * 16 */
  gint64 ring;
  const float *v;
  gint64 v_stride;
  gint64 lo, hi;
  gint64 floor;               /* no key below this one */
  SqPrefetch *pf;             /* rows to ask into L2 while the band computes, or NULL */
} SqBand;

typedef void (*SqBandFunc) (const SqBand *band, SiftRowState *st);

/* Packs keys [0, n) of one head into 64-byte aligned panels of 16 keys
 * ([ceil (n / 16)][d][16] floats; keys past n are zero). */
void sq_pack_panels (const float *k, gint64 stride, gint64 n, gint32 d, float *panels);

/* Scattered keys of up to 8 rows of one head at once: row r (q at
 * q + r * q_stride) continues st[r] over keys k[r * max + c], values
 * v[r * max + c], c < n[r]. Lanes are rows, so the rows' short lists run
 * side by side instead of one latency-bound chain after another. */
typedef struct {
  const float *q;
  gint64 q_stride;
  gint32 n_rows;
  float scale;
  const float *const *k, *const *v;
  const gsize *n;
  gsize max;
} SqRows;

typedef void (*SqRowsFunc) (const SqRows *rows, SiftRowState *st);
SqRowsFunc sq_simd_rows (gint32 head_dim);

/* Diagonals of up to 8 rows of one head: consecutive rows at the same
 * distance from their keys (a tile's log-strides: row r's stride-2^k key
 * is the tile's first row + r - 2^k) name consecutive key rows. Row r (q at
 * q + r * q_stride) continues st[r] over the keys base + r - dist[c] (k at
 * k + j * k_stride, v at v + j * v_stride) of the levels c < n whose
 * mask[c] has bit r set. Scores come out with the rows along the lanes (one
 * reduction for eight rows), the softmax update is one vector step for all
 * rows, and each level's eight key rows are one run of memory. */
typedef struct {
  const float *q;
  gint64 q_stride;
  gint32 n_rows;
  float scale;
  const float *k, *v;
  gint64 k_stride, v_stride;
  gint64 base;                      /* row 0's position in k and v */
  const gint64 *dist;               /* [n] */
  const guint8 *mask;               /* [n] */
  gint32 n;
} SqDiag;

typedef void (*SqDiagFunc) (const SqDiag *diag, SiftRowState *st);
/* The diagonal kernel for head_dim on this CPU, or NULL. */
SqDiagFunc sq_simd_diag (gint32 head_dim);

/* Keys shared by the rows of a tile (its landmarks: the rows of a band tile
 * name nearly the same blocks; and tokens every row names, the globals):
 * row r (q at q + r * q_stride) continues st[r] over keys c < n (<= 16)
 * with bit c of mask[r] set, key c packed in `panel` (sq_pack_rows) and
 * its value at v[c]. Every row's scores come from one dense 8 x 16 block
 * and each value line is read once for all rows. */
typedef struct {
  const float *q;
  gint64 q_stride;
  gint32 n_rows;
  float scale;
  const float *panel;               /* [d][16]: key c in lane c */
  const float *const *v;            /* [n] rows of d floats */
  gint32 n;
  const guint16 *mask;              /* [n_rows] */
} SqShared;

#define SQ_SHARED_MAX 16

typedef void (*SqSharedFunc) (const SqShared *shared, SiftRowState *st);
/* The shared-keys kernel for head_dim on this CPU, or NULL. */
SqSharedFunc sq_simd_shared (gint32 head_dim);

/* Packs rows[c] (c < n <= 16, d floats each) into one panel [d][16], key c
 * in lane c, lanes from n on zero. */
void sq_pack_rows (const float *const *rows, gint32 n, gint32 d, float *panel);

/* dst[0, d) = src[0, d) * s. */
void sq_scale_row (float *dst, const float *src, float s, gint32 d);

/* dst[0, d) = the mean of rows src + t * stride, t < n (n >= 1): summed in
 * order, then multiplied by 1 / n. */
void sq_mean_rows (float *dst, const float *src, gint64 stride, gint64 n, gint32 d);

/* The band kernel for head_dim on this CPU, or NULL (then rows go one by one). */
SqBandFunc sq_simd_band (gint32 head_dim);

/* The instruction set the kernels above use for head_dim (sift_isa_active ()
 * for head_dim 32, 64 and 128; scalar otherwise). */
SiftIsa sq_simd_isa (gint32 head_dim);

