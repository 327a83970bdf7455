/* Subquadratic sparse attention: one band tile of rows (sq_attend_tile)
 * and the shared keys kept between tiles. The AVX-512 kernels it calls are
 * sq-simd.c's; a row's lone keys go through sift_attend_row_sparse. See
 * sq-core.h. */
#include <math.h>
#include <string.h>

#include <sift/plugin.h>

#include "sq-core.h"
#include "sq-simd.h"

void
sq_shared_cache_init (SqSharedCache *cache, gint32 kv_heads, gint32 d)
{
  *cache = (SqSharedCache) { 0 };
  cache->panels = g_aligned_alloc ((gsize) kv_heads * (gsize) d * 16, sizeof (float), 64);
}

void
sq_shared_cache_clear (SqSharedCache *cache)
{
  g_aligned_free (cache->panels);
  *cache = (SqSharedCache) { 0 };
}

/* The union of the tile's landmark blocks into key (as -1 - block), bit c
 * of mask[r] for row r's; -1 if more than SQ_SHARED_MAX. */
static gint32
shared_landmarks (const SqTile *t, gint64 *key, guint16 *mask)
{
  gint32 n = 0;
  for (gint64 r = 0; r < t->q.n_tokens; r++)
    for (gsize x = t->lidx_start[r]; x < t->lidx_start[r + 1]; x++)
      {
        gint64 id = -1 - (gint64) t->lidx[x];
        gint32 c = 0;
        while (c < n && key[c] != id)
          c++;
        if (c == n)
          {
            if (n == SQ_SHARED_MAX)
              return -1;
            key[n++] = id;
          }
        mask[r] |= (guint16) (1u << c);
      }
  return n;
}

static gboolean
is_shared_token (const gint64 *key, gint32 n, gint64 j)
{
  for (gint32 c = 0; c < n; c++)
    if (key[c] == j)
      return TRUE;
  return FALSE;
}

/* Tokens every row of the tile names (the globals outside the windows),
 * while there is room, after the n keys already in key; returns the new
 * count. */
static gint32
shared_tokens (const SqTile *t, gint64 *key, gint32 n, guint16 *mask)
{
  const gint64 rows = t->q.n_tokens;
  if (rows < 2)
    return n;
  for (gsize x = t->idx_start[0]; x < t->idx_start[1] && n < SQ_SHARED_MAX; x++)
    {
      gint64 j = t->idx[x];
      gboolean everywhere = TRUE;
      for (gint64 r = 1; r < rows && everywhere; r++)
        {
          gsize y = t->idx_start[r];
          while (y < t->idx_start[r + 1] && t->idx[y] != j)
            y++;
          everywhere = y < t->idx_start[r + 1];
        }
      if (!everywhere)
        continue;
      for (gint64 r = 0; r < rows; r++)
        mask[r] |= (guint16) (1u << n);
      key[n++] = j;
    }
  return n;
}

void
sq_attend_tile (const SqTile *t)
{
  const gint32 d = t->q.head_dim, group = t->q.n_heads / t->k.n_heads;
  const gint64 n = t->q.n_tokens;
  const SqBandFunc band = t->panels != NULL ? sq_simd_band (d) : NULL;
  const SqRowsFunc rows = t->kp != NULL ? sq_simd_rows (d) : NULL;
  SiftRowState st[SQ_BAND_ROWS];
  g_assert (n <= SQ_BAND_ROWS);
  for (gint64 r = 0; r < n; r++)
    st[r].acc = t->acc + r * d;
  /* The rows of a tile name nearly the same landmark blocks (the pivot
   * moves once every block_size rows) and the same globals: these go
   * through the shared-keys kernel as one small dense block, a mask per
   * row; each row's strides stay its own. */
  SqSharedFunc shared = rows != NULL ? sq_simd_shared (d) : NULL;
  gint64 sh_key[SQ_SHARED_MAX];
  gint32 sh_n = 0, sh_lm = 0;
  guint16 sh_mask[SQ_BAND_ROWS] = { 0 };
  if (shared != NULL)
    sh_n = sh_lm = shared_landmarks (t, sh_key, sh_mask);
  if (sh_n < 0)
    shared = NULL; /* too many: the landmarks stay with each row */
  if (shared != NULL)
    sh_n = shared_tokens (t, sh_key, sh_n, sh_mask);
  /* The rest of the rows' tokens (their strides) by distance from the row:
   * rows at the same distance name consecutive keys, a diagonal the
   * diagonal kernel takes for all rows at once. taken[x]: entry x is in a
   * diagonal (or shared). */
  SqDiagFunc diag = rows != NULL ? sq_simd_diag (d) : NULL;
  gint64 dg_dist[SQ_DIAG_MAX];
  guint8 dg_mask[SQ_DIAG_MAX] = { 0 }, taken[SQ_DIAG_ENTRIES];
  gint32 dg_n = 0;
  if (t->idx_start[n] > SQ_DIAG_ENTRIES)
    diag = NULL;
  for (gint64 r = 0; diag != NULL && r < n; r++)
    for (gsize x = t->idx_start[r]; x < t->idx_start[r + 1]; x++)
      {
        taken[x] = shared != NULL && is_shared_token (sh_key + sh_lm, sh_n - sh_lm, t->idx[x]);
        if (taken[x])
          continue;
        gint64 dist = t->hi + r - t->idx[x];
        gint32 c = 0;
        while (c < dg_n && dg_dist[c] != dist)
          c++;
        if (c == dg_n)
          {
            if (dg_n == SQ_DIAG_MAX)
              continue;
            dg_dist[dg_n++] = dist;
          }
        dg_mask[c] |= (guint8) (1u << r);
        taken[x] = TRUE;
      }
  /* Packed keys: kept from earlier tiles when the set is the same. */
  SqSharedCache local = { 0 };
  float local_panel[128 * 16] __attribute__ ((aligned (64)));
  SqSharedCache *cache = t->shared != NULL ? t->shared : &local;
  gboolean repack = t->shared == NULL || cache->n != sh_n || cache->k != t->k.data || cache->lk != t->lk
                    || memcmp (cache->key, sh_key, (gsize) sh_n * sizeof (gint64)) != 0;
  for (gint32 h = 0; h < t->q.n_heads; h++)
    {
      gint32 g = h / group;
      const float *kb = sift_view_row (&t->k, g, 0), *vb = sift_view_row (&t->v, g, 0);
      SqPrefetch pf = {
        .k = (const char *) kb, .v = (const char *) vb,
        .k_stride = t->k.token_stride * (gint64) sizeof (float),
        .v_stride = t->v.token_stride * (gint64) sizeof (float),
        /* Far rows only for the side-by-side kernel: a diagonal's rows
         * advance by eight rows a tile, a stream the hardware prefetcher
         * follows (asking for them as well measured 1-2% slower). */
        .idx = t->idx, .n = t->prefetch_shift > 0 && h % group == 0 && diag == NULL ? t->idx_start[n] : 0,
        .shift = t->prefetch_shift, .limit = t->k.n_tokens, .row_bytes = d * (gint32) sizeof (float),
        .next_lo = t->hi + n, .next_n = t->prefetch_shift > 0 && h % group == 0 ? t->prefetch_shift : 0,
      };
      /* The next tile's query and output rows of this head. */
      for (gint64 r = n; r < n + t->prefetch_shift && t->hi + r < t->k.n_tokens; r++)
        for (gint32 x = 0; x < d; x += 16)
          {
            __builtin_prefetch ((const float *) sift_view_row (&t->q, h, r) + x, 0, 2);
            __builtin_prefetch ((float *) sift_view_row (&t->out, h, r) + x, 1, 2);
          }
      if (band != NULL)
        {
          SqBand b = {
            .q = sift_view_row (&t->q, h, 0), .q_stride = t->q.token_stride, .n_rows = (gint32) n,
            .scale = t->scale, .panels = t->panels + g * t->panel_stride, .ring = t->ring,
            .v = vb, .v_stride = t->v.token_stride, .lo = t->lo, .hi = t->hi, .floor = t->floor,
            .pf = &pf,
          };
          band (&b, st);
        }
      else
        for (gint64 r = 0; r < n; r++)
          {
            gint64 a = MAX (t->lo + r, t->floor), nb = 0;
            for (gint64 j = a; j <= t->hi + r; j++)
              t->band_idx[nb++] = (gint32) j;
            sift_row_state_reset (&st[r], d);
            sift_attend_row_sparse (&st[r], sift_view_row (&t->q, h, r), d, t->scale, kb, vb, t->k.token_stride,
                           t->band_idx, (gsize) nb);
          }
      sq_prefetch_rest (&pf);
      if (rows != NULL)
        {
          const float *lkb = t->lk + (gint64) g * t->l_n * d, *lvb = t->lv + (gint64) g * t->l_n * d;
          if (shared != NULL && sh_n > 0)
            {
              const float *shk[SQ_SHARED_MAX], *shv[SQ_SHARED_MAX];
              for (gint32 c = 0; c < sh_n; c++)
                {
                  gint64 j = sh_key[c];
                  shk[c] = j >= 0 ? kb + j * t->k.token_stride : lkb + (-1 - j) * d;
                  shv[c] = j >= 0 ? vb + j * t->v.token_stride : lvb + (-1 - j) * d;
                }
              float *panel = t->shared != NULL ? cache->panels + (gsize) g * d * 16 : local_panel;
              if (repack && h % group == 0)
                sq_pack_rows (shk, sh_n, d, panel);
              SqShared b = {
                .q = sift_view_row (&t->q, h, 0), .q_stride = t->q.token_stride, .n_rows = (gint32) n,
                .scale = t->scale, .panel = panel, .v = shv, .n = sh_n, .mask = sh_mask,
              };
              shared (&b, st);
            }
          if (diag != NULL && dg_n > 0)
            {
              SqDiag b = {
                .q = sift_view_row (&t->q, h, 0), .q_stride = t->q.token_stride, .n_rows = (gint32) n,
                .scale = t->scale, .k = kb, .v = vb, .k_stride = t->k.token_stride,
                .v_stride = t->v.token_stride, .base = t->hi, .dist = dg_dist, .mask = dg_mask, .n = dg_n,
              };
              diag (&b, st);
            }
          /* Every row's other keys, then its landmarks (unless shared), side by side. */
          gsize cnt[SQ_BAND_ROWS], any = 0;
          for (gint64 r = 0; r < n; r++)
            {
              gsize c = 0;
              const float **kp = t->kp + r * t->ptr_max, **vp = t->vp + r * t->ptr_max;
              for (gsize x = t->idx_start[r]; x < t->idx_start[r + 1]; x++)
                {
                  if (diag != NULL ? taken[x]
                                   : shared != NULL && is_shared_token (sh_key + sh_lm, sh_n - sh_lm, t->idx[x]))
                    continue;
                  kp[c] = kb + t->idx[x] * t->k.token_stride;
                  vp[c] = vb + t->idx[x] * t->v.token_stride;
                  c++;
                }
              for (gsize x = t->lidx_start[r]; shared == NULL && x < t->lidx_start[r + 1]; x++, c++)
                {
                  kp[c] = lkb + (gint64) t->lidx[x] * d;
                  vp[c] = lvb + (gint64) t->lidx[x] * d;
                }
              cnt[r] = c;
              any += c;
            }
          SqRows b = {
            .q = sift_view_row (&t->q, h, 0), .q_stride = t->q.token_stride, .n_rows = (gint32) n,
            .scale = t->scale, .k = t->kp, .v = t->vp, .n = cnt, .max = t->ptr_max,
          };
          if (any > 0)
            rows (&b, st);
          for (gint64 r = 0; r < n; r++)
            sift_row_state_finish (&st[r], d, sift_view_row (&t->out, h, r),
                             t->lse ? &t->lse[h * t->lse_stride + r] : NULL);
          continue;
        }
      for (gint64 r = 0; r < n; r++)
        {
          const float *q = sift_view_row (&t->q, h, r);
          gsize nt = t->idx_start[r + 1] - t->idx_start[r];
          gsize nb = t->lidx_start[r + 1] - t->lidx_start[r];
          if (nt > 0)
            sift_attend_row_sparse (&st[r], q, d, t->scale, kb, vb, t->k.token_stride, t->idx + t->idx_start[r], nt);
          if (nb > 0)
            sift_attend_row_sparse (&st[r], q, d, t->scale, t->lk + (gint64) g * t->l_n * d,
                           t->lv + (gint64) g * t->l_n * d, d, t->lidx + t->lidx_start[r], nb);
          sift_row_state_finish (&st[r], d, sift_view_row (&t->out, h, r),
                           t->lse ? &t->lse[h * t->lse_stride + r] : NULL);
        }
    }
  if (shared != NULL && sh_n > 0 && t->shared != NULL)
    {
      /* Every kv head's panel now holds this set. */
      memcpy (cache->key, sh_key, (gsize) sh_n * sizeof (gint64));
      cache->n = sh_n;
      cache->k = t->k.data;
      cache->lk = t->lk;
    }
}
