/* Attention kernels: the arguments every ISA's implementation receives,
 * already validated by core/attn.c. */
#pragma once

#include <sift/attn.h>

typedef struct {
  const SiftView *q;    /* f32 [q_heads][n_q][d] */
  const SiftView *k;    /* [kv_heads][n_kv][d]; for paged calls only its shape
                         * and dtype hold (data NULL): read keys through blocks */
  const SiftView *v;
  /* K and V as blocks, key order (dense and decode read rows only here):
   * block b holds keys [block_start[b], block_start[b + 1]) as rows
   * 0..n of k_blocks[b] and v_blocks[b]. A contiguous call is one block. */
  const SiftView *k_blocks; /* [n_blocks] [kv_heads][n_b][d] */
  const SiftView *v_blocks;
  gsize n_blocks;
  const gint64 *block_start; /* [n_blocks + 1] */
  gint64 one_block[2];       /* block_start of a contiguous call */
  SiftView *out;        /* f32 [q_heads][n_q][d] */
  float *lse;           /* [q_heads][n_q], never NULL here */
  float scale;          /* resolved */
  gboolean causal;
  gint64 q_offset;
  const gint64 *rows;   /* gather only */
  gsize n_rows;
} SiftAttnArgs;

typedef struct {
  void (*dense) (const SiftAttnArgs *a);
  void (*decode) (const SiftAttnArgs *a);
  void (*gather) (const SiftAttnArgs *a);
  void (*exp2v) (const float *x, float *y, gsize n); /* y = 2^x, the softmax's exponential */
} SiftAttnKernels;

/* Work (q heads x query rows x keys x head_dim) below which a kernel call
 * runs on the calling thread: waking the pool costs more. The engine's
 * ring sizes its groups by it (engine/ring.c, engine/attend.c). */
#define SIFT_ATTN_SERIAL_WORK (1 << 20)

/* The checks of sift_attn_dense / decode / gather (every view, then their
 * agreement): fills `a` for a contiguous call. The GPU backend checks its
 * calls with these too. */
gboolean sift_attn_prepare (SiftAttnArgs *a, const SiftView *q, const SiftView *k, const SiftView *v,
                            const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error);
/* The checks of sift_attn_paged: fills `a`, the shape of the concatenation
 * (k_all, v_all, whose data are NULL) and block_start[n_blocks + 1]. */
gboolean sift_attn_prepare_paged (SiftAttnArgs *a, SiftView *k_all, SiftView *v_all,
                                  gint64 *block_start, const SiftView *q, const SiftView *k_blocks,
                                  const SiftView *v_blocks, gsize n_blocks, const SiftAttnOpts *opts,
                                  SiftView *out, float *lse, GError **error);

/* The kernels of one ISA (NULL if not built or not supported by this CPU). */
const SiftAttnKernels *sift_attn_kernels_get (SiftIsa isa);

/* Per-thread scratch, 64-byte aligned, grown on demand and kept for the
 * thread's life, so calls on small blocks allocate nothing. One buffer per
 * slot; a slot's previous contents are lost when it grows. */
enum {
  SIFT_ATTN_SCRATCH_ITEM,    /* one work item's tiles (any thread) */
  SIFT_ATTN_SCRATCH_PARTIAL, /* split partials (the calling thread) */
  SIFT_ATTN_SCRATCH_N,
};
float *sift_attn_scratch (int slot, gsize n_floats);

extern const SiftAttnKernels sift_attn_kernels_scalar;
#ifdef SIFT_HAVE_AVX2
extern const SiftAttnKernels sift_attn_kernels_avx2;
#endif
#ifdef SIFT_HAVE_AVX512
extern const SiftAttnKernels sift_attn_kernels_avx512;
#endif

/* Keys visible to query row i: [0, limit). */
static inline gint64
sift_attn_limit (const SiftAttnArgs *a, gint64 i)
{
  /* q_offset is caller input: compare before adding so no value overflows. */
  if (!a->causal || a->q_offset >= a->k->n_tokens)
    return a->k->n_tokens;
  return CLAMP (a->q_offset + i + 1, 0, a->k->n_tokens);
}

/* The block of key t (block_start[b] <= t < block_start[b + 1]); t in
 * [0, n_kv). Empty blocks are never returned. */
static inline gsize
sift_attn_block_of (const SiftAttnArgs *a, gint64 t)
{
  gsize lo = 0, hi = a->n_blocks; /* block_start[lo] <= t < block_start[hi] */
  while (hi - lo > 1)
    {
      gsize mid = lo + (hi - lo) / 2;
      if (a->block_start[mid] <= t)
        lo = mid;
      else
        hi = mid;
    }
  return lo;
}

/* A forward walk over the key rows of the blocks: the block of the current
 * key, resolved once per block rather than per row. */
typedef struct {
  const SiftAttnArgs *a;
  gsize b;              /* current block */
  gint64 start, end;    /* its keys [start, end) */
} SiftKvCursor;

static inline SiftKvCursor
sift_kv_cursor (const SiftAttnArgs *a, gint64 t)
{
  SiftKvCursor c = { a, 0, 0, 0 };
  if (a->n_blocks == 0)
    return c;
  c.b = sift_attn_block_of (a, MIN (t, a->k->n_tokens - 1));
  c.start = a->block_start[c.b];
  c.end = a->block_start[c.b + 1];
  return c;
}

/* Moves the cursor forward to key t (t >= the current block's start) and
 * returns t's row in the current block. */
static inline gint64
sift_kv_seek (SiftKvCursor *c, gint64 t)
{
  while (t >= c->end)
    {
      c->b++;
      c->start = c->end;
      c->end = c->a->block_start[c->b + 1];
    }
  return t - c->start;
}
