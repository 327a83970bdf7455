/* Subquadratic policy in the engine: one call (prefill chunk or decode
 * step) gathers exactly the keys its rows need into an f32 workspace,
 *   [scattered: globals and strides before the window, ascending]
 *   [window start .. end of the call: stored part through ring slots, the
 *    not-yet-stored part from the engine's local buffer]
 * builds the landmarks its rows need (complete ones from this policy's
 * memory, the rest from the workspace rows), then runs the one-pass kernel
 * row by row. A decode step touches O(window + log T + landmarks) rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sift/plugin.h>

#include "sq-plugin.h"
#include "sq-simd.h"

#define GROW(ptr, type, cap, need)                                             \
  do                                                                           \
    {                                                                          \
      if ((gsize) (need) > (gsize) (cap))                                      \
        {                                                                      \
          (cap) = MAX ((gsize) (need), 2 * (gsize) (cap));                     \
          g_free (ptr);                                                        \
          (ptr) = g_new (type, (cap));                                         \
        }                                                                      \
    }                                                                          \
  while (0)

gboolean
sq_policy_setup (SqPolicy *self, const SqConfig *config, SiftDType lm_dtype, GError **error)
{
  const SiftModelShape *shape = self->parent.shape;
  if (!config->causal)
    {
      g_set_error_literal (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID,
                           "subquadratic: the engine's chunked pipeline is causal; non-causal "
                           "attention is only available to whole-sequence callers");
      return FALSE;
    }
  if (config->window < 0 || config->block_size < 1)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_RANGE,
                   "subquadratic: window %" G_GINT64_FORMAT " must be >= 0 and block_size %" G_GINT64_FORMAT
                   " >= 1",
                   config->window, config->block_size);
      return FALSE;
    }
  if (lm_dtype != SIFT_DTYPE_F32 && lm_dtype != SIFT_DTYPE_F16)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID,
                   "subquadratic: landmarks are stored as f32 or f16, not %s", sift_dtype_name (lm_dtype));
      return FALSE;
    }
  if (shape->n_layers < 1 || shape->n_kv_heads < 1 || shape->head_dim < 1
      || shape->n_q_heads % shape->n_kv_heads != 0)
    {
      g_set_error (error, SIFT_CONFIG_ERROR, SIFT_CONFIG_ERROR_INVALID,
                   "subquadratic: impossible model shape (%d layers, %d q heads, %d kv heads, dim %d)",
                   shape->n_layers, shape->n_q_heads, shape->n_kv_heads, shape->head_dim);
      return FALSE;
    }
  self->config = *config;
  self->globals = g_new0 (gint64, config->n_globals + 1); /* + 1: never a zero-sized block */
  if (config->n_globals > 0)
    memcpy (self->globals, config->globals, config->n_globals * sizeof (gint64));
  self->config.globals = self->globals;
  self->lm_dtype = lm_dtype;
  self->n_layers = shape->n_layers;
  self->q_heads = shape->n_q_heads;
  self->kv_heads = shape->n_kv_heads;
  self->head_dim = shape->head_dim;
  self->scale = sift_attn_scale (shape->scale, shape->head_dim);
  self->layers = g_new0 (SqLandmarks, self->n_layers);
  for (gint32 l = 0; l < self->n_layers; l++)
    {
      self->layers[l].open_k = g_new0 (float, (gsize) self->kv_heads * self->head_dim);
      self->layers[l].open_v = g_new0 (float, (gsize) self->kv_heads * self->head_dim);
    }
  sq_stamp_init (&self->call_stamp);
  sq_stamp_init (&self->call_bstamp);
  sq_stamp_init (&self->ts);
  sq_stamp_init (&self->bs);
  return TRUE;
}

void
sq_policy_clear (SqPolicy *self)
{
  for (gint32 l = 0; self->layers && l < self->n_layers; l++)
    {
      g_free (self->layers[l].k);
      g_free (self->layers[l].v);
      g_free (self->layers[l].open_k);
      g_free (self->layers[l].open_v);
    }
  g_clear_pointer (&self->layers, g_free);
  g_clear_pointer (&self->globals, g_free);
  sq_stamp_clear (&self->call_stamp);
  sq_stamp_clear (&self->call_bstamp);
  sq_stamp_clear (&self->ts);
  sq_stamp_clear (&self->bs);
  g_clear_pointer (&self->cand, g_free);
  g_clear_pointer (&self->lcand, g_free);
  g_clear_pointer (&self->n_cand, g_free);
  g_clear_pointer (&self->n_lcand, g_free);
  g_clear_pointer (&self->scattered, g_free);
  g_clear_pointer (&self->pos_map, g_free);
  g_clear_pointer (&self->blk_map, g_free);
  g_clear_pointer (&self->blocks_needed, g_free);
  g_clear_pointer (&self->ws_k, g_free);
  g_clear_pointer (&self->ws_v, g_free);
  g_clear_pointer (&self->lws_k, g_free);
  g_clear_pointer (&self->lws_v, g_free);
  g_clear_pointer (&self->tmp_k, g_free);
  g_clear_pointer (&self->tmp_v, g_free);
  g_clear_pointer (&self->idx, g_free);
  g_clear_pointer (&self->ptrs, g_free);
  g_clear_pointer (&self->acc, g_free);
  g_clear_pointer (&self->panels, g_aligned_free);
}

void
sq_policy_reset (SqPolicy *self)
{
  gsize row = (gsize) self->kv_heads * self->head_dim;
  for (gint32 l = 0; l < self->n_layers; l++)
    {
      SqLandmarks *L = &self->layers[l];
      L->n_done = 0;
      L->open_count = L->open_present = 0;
      memset (L->open_k, 0, row * sizeof (float));
      memset (L->open_v, 0, row * sizeof (float));
    }
}

/* ---- A bounded cache (kv.capacity_tokens, docs/eviction.md) -------------- */

/* Whether the engine evicted any of the layer's tokens: then blocks may
 * hold non-consecutive positions (read through sift_engine_block_positions)
 * and scattered positions may be gone. */
static gboolean
cache_evicted (const SiftPolicyContext *ctx)
{
  gint64 held = 0;
  for (gint64 b = 0; b < ctx->n_blocks; b++)
    held += ctx->blocks[b].n_valid;
  return ctx->n_blocks > 0 && held < ctx->kv_len; /* no blocks: nothing to read either way */
}

/* Whether stored position p is still held (blocks ascend by position). */
static gboolean
still_stored (const SiftPolicyContext *ctx, gint64 p)
{
  gint64 a = 0, z = ctx->n_blocks;
  while (z - a > 1)
    {
      gint64 mid = (a + z) / 2;
      if (ctx->blocks[mid].first_token <= p)
        a = mid;
      else
        z = mid;
    }
  if (ctx->n_blocks == 0)
    return FALSE;
  const gint64 *pos = sift_engine_block_positions (ctx->engine, ctx->layer, a);
  for (gint32 t = 0; pos != NULL && t < ctx->blocks[a].n_valid; t++)
    if (pos[t] == p)
      return TRUE;
  return FALSE;
}

/* ---- Landmark memory ---------------------------------------------------- */

static gint64
lm_folded (const SqPolicy *self, const SqLandmarks *L)
{
  return L->n_done * self->config.block_size + L->open_count;
}

/* Folds the next token (rows k, v f32 [kv_heads][head_dim]) into the open
 * block's running mean; a block whose last token arrives is stored. k and
 * v NULL: the token was evicted before this policy saw it (the mean is over
 * the tokens present). */
static void
lm_fold (SqPolicy *self, SqLandmarks *L, const float *k, const float *v)
{
  const gsize row = (gsize) self->kv_heads * self->head_dim;
  L->open_count++;
  if (k != NULL)
    {
      float inv = 1.0f / (float) ++L->open_present;
      for (gsize x = 0; x < row; x++)
        {
          L->open_k[x] += (k[x] - L->open_k[x]) * inv;
          L->open_v[x] += (v[x] - L->open_v[x]) * inv;
        }
    }
  if (L->open_count < self->config.block_size)
    return;
  if (L->n_done == L->capacity)
    {
      L->capacity = MAX (16, 2 * L->capacity);
      gsize bytes = (gsize) L->capacity * row * sift_dtype_size (self->lm_dtype);
      L->k = g_realloc (L->k, bytes);
      L->v = g_realloc (L->v, bytes);
    }
  gsize at = (gsize) L->n_done * row * sift_dtype_size (self->lm_dtype);
  sift_convert (L->open_k, SIFT_DTYPE_F32, (char *) L->k + at, self->lm_dtype, row);
  sift_convert (L->open_v, SIFT_DTYPE_F32, (char *) L->v + at, self->lm_dtype, row);
  L->n_done++;
  L->open_count = L->open_present = 0;
  memset (L->open_k, 0, row * sizeof (float));
  memset (L->open_v, 0, row * sizeof (float));
}

/* Folds stored tokens [folded, upto) that no offload hook showed this
 * policy (another policy ran then), reading them through the engine; a
 * token a bounded cache evicted meanwhile is skipped. */
static gboolean
lm_catch_up (SqPolicy *self, const SiftPolicyContext *ctx, SqLandmarks *L, gint64 upto, GError **error)
{
  const gint32 d = self->head_dim, kvh = self->kv_heads;
  enum { PIECE = 256 };
  gint64 pos[PIECE];
  gboolean held[PIECE];
  float row_k[kvh * d], row_v[kvh * d];
  const gboolean evicted = cache_evicted (ctx);
  while (lm_folded (self, L) < upto)
    {
      gint64 from = lm_folded (self, L), n = MIN (upto - from, PIECE), m = 0;
      for (gint64 t = 0; t < n; t++)
        {
          held[t] = !evicted || still_stored (ctx, from + t);
          if (held[t])
            pos[m++] = from + t;
        }
      GROW (self->tmp_k, float, self->tmp_cap, (gsize) kvh * MAX (m, 1) * d);
      self->tmp_v = g_renew (float, self->tmp_v, self->tmp_cap);
      SiftView gk = sift_view_htd (self->tmp_k, SIFT_DTYPE_F32, kvh, m, d);
      SiftView gv = sift_view_htd (self->tmp_v, SIFT_DTYPE_F32, kvh, m, d);
      if (m > 0 && !sift_engine_gather_rows (ctx->engine, ctx->layer, pos, (gsize) m, &gk, &gv, error))
        return FALSE;
      for (gint64 t = 0, j = 0; t < n; t++)
        {
          if (!held[t])
            {
              lm_fold (self, L, NULL, NULL);
              continue;
            }
          for (gint32 g = 0; g < kvh; g++)
            {
              memcpy (row_k + g * d, sift_view_row (&gk, g, j), (gsize) d * sizeof (float));
              memcpy (row_v + g * d, sift_view_row (&gv, g, j), (gsize) d * sizeof (float));
            }
          j++;
          lm_fold (self, L, row_k, row_v);
        }
    }
  return TRUE;
}

gboolean
sq_policy_offload (SqPolicy *self, const SiftPolicyContext *ctx, const SiftBlockInfo *block,
                   GError **error)
{
  if (!self->config.landmarks)
    return TRUE;
  if (ctx->layer < 0 || ctx->layer >= self->n_layers || block->meta == NULL)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                   "subquadratic: offload of layer %d outside the model's %d layers", ctx->layer,
                   self->n_layers);
      return FALSE;
    }
  SqLandmarks *L = &self->layers[ctx->layer];
  const gint32 d = self->head_dim, kvh = self->kv_heads;
  const gint64 first = block->meta->first_token;
  /* A block compacted by eviction (offered again) holds the positions the
   * engine lists; a block being stored holds consecutive ones. */
  const gint64 *pos = cache_evicted (ctx) ? sift_engine_block_positions (ctx->engine, ctx->layer, block->block_id)
                                          : NULL;
  float row_k[kvh * d], row_v[kvh * d];
  for (gint64 t = 0; t < block->meta->n_valid; t++)
    {
      gint64 p = pos != NULL ? pos[t] : first + t;
      if (p < lm_folded (self, L))
        continue; /* folded already */
      if (p > lm_folded (self, L) && !lm_catch_up (self, ctx, L, p, error))
        return FALSE;
      for (gint32 g = 0; g < kvh; g++)
        {
          sift_view_row_to_f32 (&block->k, g, t, row_k + g * d);
          sift_view_row_to_f32 (&block->v, g, t, row_v + g * d);
        }
      lm_fold (self, L, row_k, row_v);
    }
  return TRUE;
}

gboolean
sq_policy_landmark (const SqPolicy *self, gint32 layer, gint64 b, gint32 g, float *k, float *v)
{
  const SqLandmarks *L = &self->layers[layer];
  if (b >= L->n_done)
    return FALSE;
  gsize es = sift_dtype_size (self->lm_dtype);
  gsize at = ((gsize) b * self->kv_heads + g) * self->head_dim * es;
  sift_convert ((char *) L->k + at, self->lm_dtype, k, SIFT_DTYPE_F32, self->head_dim);
  sift_convert ((char *) L->v + at, self->lm_dtype, v, SIFT_DTYPE_F32, self->head_dim);
  return TRUE;
}

/* ---- One call ------------------------------------------------------------ */

typedef struct {
  SqPolicy *self;
  const SiftPolicyContext *ctx;
  SiftView *out;
  float *lse;
  gint64 r_lo, n_scat, n_ws, n_lws;
  gsize max_tok, max_blk;
  gsize idx_stride;        /* gint32 per worker in self->idx */
  const float *panels;     /* workspace keys for the band kernel, or NULL */
} Call;

/* Workspace row of position p. */
static inline gint32
ws_row (const Call *c, gint64 p)
{
  return p >= c->r_lo ? (gint32) (c->n_scat + p - c->r_lo) : c->self->pos_map[p];
}

gboolean
sq_policy_score_eviction (SqPolicy *self, const SiftPolicyContext *ctx, const SiftEvictCandidates *cand,
                          float *scores, GError **error)
{
  /* Evict and append: the window the next call needs and the globals stay,
   * the rest goes oldest first (the landmarks already hold its means). */
  const gint64 window_from = ctx->q_pos + ctx->n_q - self->config.window;
  gint64 evictable = 0;
  for (gsize i = 0; i < cand->n; i++)
    {
      gint64 p = cand->positions[i];
      gboolean keep = p >= window_from;
      for (gsize g = 0; !keep && g < self->config.n_globals; g++)
        keep = self->config.globals[g] == p;
      scores[i] = keep ? G_MAXFLOAT : (float) p;
      evictable += !keep;
    }
  if (evictable < cand->n_evict)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                   "subquadratic: layer %d must evict %" G_GINT64_FORMAT " tokens but only %" G_GINT64_FORMAT
                   " lie outside its window of %" G_GINT64_FORMAT " and its globals: raise kv.capacity_tokens",
                   ctx->layer, cand->n_evict, evictable, self->config.window);
      return FALSE;
    }
  return TRUE;
}

/* Window rows [r_lo, kv_len) from the stored blocks, through an engine stream. */
static gboolean
load_window (Call *c, GError **error)
{
  SqPolicy *self = c->self;
  const SiftPolicyContext *ctx = c->ctx;
  const gint32 d = self->head_dim;
  gint64 lo = c->r_lo, hi = ctx->kv_len;
  if (lo >= hi)
    return TRUE;
  /* After eviction a block's rows are the positions the engine lists. */
  const gboolean evicted = cache_evicted (ctx);
  gint64 filled = 0;
  /* First block ending after lo (blocks are in sequence order). */
  gint64 a = 0, z = ctx->n_blocks;
  while (a < z)
    {
      gint64 mid = (a + z) / 2;
      gint64 last = evicted ? sift_engine_block_positions (ctx->engine, ctx->layer, mid)[ctx->blocks[mid].n_valid - 1]
                            : ctx->blocks[mid].first_token + ctx->blocks[mid].n_valid - 1;
      if (last < lo)
        a = mid + 1;
      else
        z = mid;
    }
  gint64 b_end = a;
  while (b_end < ctx->n_blocks && ctx->blocks[b_end].first_token < hi)
    b_end++;
  g_autofree gint64 *ids = g_new (gint64, MAX (b_end - a, 1));
  for (gint64 b = a; b < b_end; b++)
    ids[b - a] = b;
  GError *local = NULL;
  SiftStream *stream = sift_engine_stream_begin (ctx->engine, ctx->layer, ids, (gsize) (b_end - a), SIFT_LOAD_KV);
  SiftStreamBlock blk;
  while (sift_engine_stream_next (stream, &blk, 1, &local) > 0)
    {
      const gint64 first = ctx->blocks[blk.block_id].first_token;
      const gint64 *pos = evicted ? sift_engine_block_positions (ctx->engine, ctx->layer, blk.block_id) : NULL;
      for (gint64 t = 0; t < blk.n_valid; t++)
        {
          gint64 p = pos != NULL ? pos[t] : first + t;
          if (p < lo || p >= hi)
            continue;
          filled++;
          for (gint32 g = 0; g < self->kv_heads; g++)
            {
              gsize at = ((gsize) g * c->n_ws + (gsize) ws_row (c, p)) * d;
              sift_view_row_to_f32 (&blk.k, g, t, self->ws_k + at);
              sift_view_row_to_f32 (&blk.v, g, t, self->ws_v + at);
            }
        }
    }
  if (!sift_engine_stream_end (stream))
    {
      g_propagate_prefixed_error (error, local, "subquadratic: window of layer %d: ", ctx->layer);
      return FALSE;
    }
  if (filled < hi - lo)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                   "subquadratic: %" G_GINT64_FORMAT " tokens of layer %d's window [%" G_GINT64_FORMAT
                   ", %" G_GINT64_FORMAT ") are no longer cached (evicted by another policy's scores?)",
                   hi - lo - filled, ctx->layer, lo, hi);
      return FALSE;
    }
  return TRUE;
}

/* Landmark b into workspace row x: from memory when complete there, else
 * the open running mean plus the block's rows not yet stored. */
static void
fill_landmark (Call *c, SqLandmarks *L, gint64 b, gint64 x)
{
  SqPolicy *self = c->self;
  const gint32 d = self->head_dim, kvh = self->kv_heads;
  const gint64 bs = self->config.block_size;
  for (gint32 g = 0; g < kvh; g++)
    {
      float *ok = self->lws_k + ((gsize) g * c->n_lws + x) * d;
      float *ov = self->lws_v + ((gsize) g * c->n_lws + x) * d;
      if (sq_policy_landmark (self, c->ctx->layer, b, g, ok, ov))
        continue;
      gint64 have = b == L->n_done ? L->open_count : 0;          /* positions folded */
      gint64 present = b == L->n_done ? L->open_present : 0;    /* of those, not evicted */
      for (gint32 e = 0; e < d; e++)
        {
          ok[e] = L->open_k[g * d + e] * (float) present;
          ov[e] = L->open_v[g * d + e] * (float) present;
        }
      for (gint64 p = b * bs + have; p < (b + 1) * bs; p++)
        {
          g_assert (p >= c->ctx->kv_len);
          const float *kr = self->ws_k + ((gsize) g * c->n_ws + (gsize) ws_row (c, p)) * d;
          const float *vr = self->ws_v + ((gsize) g * c->n_ws + (gsize) ws_row (c, p)) * d;
          for (gint32 e = 0; e < d; e++)
            {
              ok[e] += kr[e];
              ov[e] += vr[e];
            }
        }
      for (gint32 e = 0; e < d; e++)
        {
          ok[e] /= (float) (present + bs - have);
          ov[e] /= (float) (present + bs - have);
        }
    }
}

/* Rows [begin, end) of the call in tiles of SQ_BAND_ROWS: the window band
 * over the workspace's contiguous range, the rest (strides and globals
 * outside the window, landmarks) row by row. */
static void
attend_tiles (gint64 begin, gint64 end, gint worker, gpointer user_data)
{
  const Call *c = user_data;
  SqPolicy *self = c->self;
  const gint32 d = self->head_dim;
  const gint64 window = self->config.window, per_ptr = (gint64) (c->max_tok + c->max_blk);
  gint32 *idx = self->idx + (gsize) worker * c->idx_stride;
  gint32 *lidx = idx + SQ_BAND_ROWS * c->max_tok;
  gint32 *band_idx = lidx + SQ_BAND_ROWS * c->max_blk;
  const float **kp = self->ptrs + (gsize) worker * 2 * SQ_BAND_ROWS * per_ptr;
  const float **vp = kp + SQ_BAND_ROWS * per_ptr;
  gsize idx_start[SQ_BAND_ROWS + 1], lidx_start[SQ_BAND_ROWS + 1];
  for (gint64 t0 = begin * SQ_BAND_ROWS; t0 < MIN (end * SQ_BAND_ROWS, c->ctx->n_q); t0 += SQ_BAND_ROWS)
    {
      gint64 nr = MIN (SQ_BAND_ROWS, c->ctx->n_q - t0);
      idx_start[0] = lidx_start[0] = 0;
      for (gint64 r = 0; r < nr; r++)
        {
          gint64 i = c->ctx->q_pos + t0 + r;
          const gint64 *cand = self->cand + (gsize) (t0 + r) * c->max_tok;
          const gint64 *lcand = self->lcand + (gsize) (t0 + r) * c->max_blk;
          gsize n = idx_start[r];
          for (gsize x = 0; x < self->n_cand[t0 + r]; x++)
            if (cand[x] < i - window && ws_row (c, cand[x]) >= 0) /* < 0: evicted */
              idx[n++] = ws_row (c, cand[x]);
          idx_start[r + 1] = n;
          n = lidx_start[r];
          for (gsize x = 0; x < self->n_lcand[t0 + r]; x++)
            lidx[n++] = self->blk_map[lcand[x]];
          lidx_start[r + 1] = n;
        }
      gint64 i0 = c->ctx->q_pos + t0;
      SqTile t = {
        .q = sift_view_tokens (&c->ctx->q, t0, nr),
        .out = sift_view_tokens (c->out, t0, nr),
        .k = sift_view_htd (self->ws_k, SIFT_DTYPE_F32, self->kv_heads, c->n_ws, d),
        .v = sift_view_htd (self->ws_v, SIFT_DTYPE_F32, self->kv_heads, c->n_ws, d),
        .lo = c->n_scat + (i0 - window - c->r_lo), .hi = c->n_scat + (i0 - c->r_lo),
        .floor = c->n_scat,
        .panels = c->panels, .panel_stride = (gint64) sq_panel_floats (c->n_ws, d),
        .scale = self->scale,
        .idx = idx, .idx_start = idx_start,
        .lk = self->lws_k, .lv = self->lws_v, .l_n = c->n_lws,
        .lidx = lidx, .lidx_start = lidx_start,
        .lse = c->lse + t0, .lse_stride = c->ctx->n_q,
        .acc = self->acc + (gsize) worker * SQ_BAND_ROWS * d,
        .band_idx = band_idx,
        .kp = kp, .vp = vp, .ptr_max = (gsize) per_ptr,
      };
      sq_attend_tile (&t);
    }
}

static int
cmp_gint64 (const void *a, const void *b)
{
  gint64 x = *(const gint64 *) a, y = *(const gint64 *) b;
  return (x > y) - (x < y);
}

gboolean
sq_policy_compute (SqPolicy *self, const SiftPolicyContext *ctx, SiftView *out, float *lse,
                   GError **error)
{
  const SqConfig *cfg = &self->config;
  const gint32 d = self->head_dim, kvh = self->kv_heads;
  const gint64 n_q = ctx->n_q, q_pos = ctx->q_pos, kv_len = ctx->kv_len, end = q_pos + n_q;
  if (n_q == 0)
    return TRUE;
  if (ctx->layer < 0 || ctx->layer >= self->n_layers || n_q < 0 || q_pos < kv_len
      || (ctx->phase == SIFT_PHASE_PREFILL && q_pos != kv_len) || ctx->q.n_heads != self->q_heads
      || ctx->q.head_dim != d || ctx->q.dtype != SIFT_DTYPE_F32 || end > G_MAXINT32)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "subquadratic: call of layer %d with rows [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                   ") after %" G_GINT64_FORMAT " stored tokens, q [%d heads][dim %d] does not fit the "
                   "model (%d layers, %d q heads, dim %d)",
                   ctx->layer, q_pos, end, kv_len, ctx->q.n_heads, ctx->q.head_dim, self->n_layers,
                   self->q_heads, d);
      return FALSE;
    }
  SqLandmarks *L = &self->layers[ctx->layer];
  if (cfg->landmarks && !lm_catch_up (self, ctx, L, kv_len, error))
    return FALSE;

  Call c = {
    .self = self, .ctx = ctx, .out = out, .lse = lse,
    .r_lo = MAX (0, MIN (q_pos - cfg->window, kv_len)),
    .max_tok = sq_max_token_candidates (cfg, end),
    .max_blk = sq_max_landmark_candidates (cfg, end) + 1,
  };
  const gint64 n_blocks = (end + cfg->block_size - 1) / cfg->block_size;

  /* Every row's candidates; the call's scattered positions (before the
   * contiguous range) and landmark blocks, each listed once. */
  if ((gsize) n_q > self->rows_cap)
    {
      self->rows_cap = (gsize) n_q;
      self->n_cand = g_renew (gsize, self->n_cand, self->rows_cap);
      self->n_lcand = g_renew (gsize, self->n_lcand, self->rows_cap);
    }
  GROW (self->cand, gint64, self->cand_cap, (gsize) n_q * c.max_tok);
  GROW (self->lcand, gint64, self->lcand_cap, (gsize) n_q * c.max_blk);
  GROW (self->scattered, gint64, self->scattered_cap, (gsize) n_q * c.max_tok);
  GROW (self->blocks_needed, gint64, self->blocks_needed_cap, (gsize) n_q * c.max_blk);
  sq_stamp_next (&self->call_stamp, end);
  sq_stamp_next (&self->call_bstamp, MAX (n_blocks, 1));
  gint64 n_needed = 0;
  for (gint64 r = 0; r < n_q; r++)
    {
      gint64 *cand = self->cand + (gsize) r * c.max_tok;
      gint64 *lcand = self->lcand + (gsize) r * c.max_blk;
      sq_stamp_next (&self->ts, end);
      sq_stamp_next (&self->bs, MAX (n_blocks, 1));
      self->n_cand[r] = sq_token_candidates (cfg, q_pos + r, end, &self->ts, cand);
      self->n_lcand[r] = sq_landmark_candidates (cfg, q_pos + r, end, &self->bs, lcand);
      for (gsize x = 0; x < self->n_cand[r]; x++)
        if (cand[x] < c.r_lo && self->call_stamp.marks[cand[x]] != self->call_stamp.stamp)
          {
            self->call_stamp.marks[cand[x]] = self->call_stamp.stamp;
            self->scattered[c.n_scat++] = cand[x];
          }
      for (gsize x = 0; x < self->n_lcand[r]; x++)
        if (self->call_bstamp.marks[lcand[x]] != self->call_bstamp.stamp)
          {
            self->call_bstamp.marks[lcand[x]] = self->call_bstamp.stamp;
            self->blocks_needed[n_needed++] = lcand[x];
          }
    }
  qsort (self->scattered, (gsize) c.n_scat, sizeof (gint64), cmp_gint64);
  c.n_ws = c.n_scat + (end - c.r_lo);
  c.n_lws = n_needed;
  GROW (self->ws_k, float, self->ws_cap, (gsize) kvh * c.n_ws * d);
  self->ws_v = g_renew (float, self->ws_v, self->ws_cap);
  GROW (self->lws_k, float, self->lws_cap, (gsize) kvh * c.n_lws * d + 1);
  self->lws_v = g_renew (float, self->lws_v, self->lws_cap);
  if (end > self->pos_map_cap)
    {
      self->pos_map_cap = MAX (end, 2 * self->pos_map_cap);
      self->pos_map = g_renew (gint32, self->pos_map, self->pos_map_cap);
    }
  if (n_blocks > self->blk_map_cap)
    {
      self->blk_map_cap = MAX (n_blocks, 2 * self->blk_map_cap);
      self->blk_map = g_renew (gint32, self->blk_map, self->blk_map_cap);
    }

  /* A bounded cache may have evicted scattered positions: they drop out
   * of every row (pos_map -1), their blocks' landmarks remain. */
  guint64 dropped = 0;
  if (c.n_scat > 0 && cache_evicted (ctx))
    {
      gint64 kept = 0;
      for (gint64 s = 0; s < c.n_scat; s++)
        {
          gint64 p = self->scattered[s];
          gboolean held = still_stored (ctx, p);
          self->pos_map[p] = held ? (gint32) kept : -1;
          if (held)
            self->scattered[kept++] = p;
        }
      for (gint64 r = 0; r < n_q && kept < c.n_scat; r++)
        for (gsize x = 0; x < self->n_cand[r]; x++)
          {
            gint64 p = self->cand[(gsize) r * c.max_tok + x];
            dropped += p < c.r_lo && self->pos_map[p] < 0;
          }
      c.n_scat = kept;
      c.n_ws = c.n_scat + (end - c.r_lo);
    }

  /* Scattered rows through the engine's row gather. */
  if (c.n_scat > 0)
    {
      for (gint64 s = 0; s < c.n_scat; s++)
        self->pos_map[self->scattered[s]] = (gint32) s;
      GROW (self->tmp_k, float, self->tmp_cap, (gsize) kvh * c.n_scat * d);
      self->tmp_v = g_renew (float, self->tmp_v, self->tmp_cap);
      SiftView gk = sift_view_htd (self->tmp_k, SIFT_DTYPE_F32, kvh, c.n_scat, d);
      SiftView gv = sift_view_htd (self->tmp_v, SIFT_DTYPE_F32, kvh, c.n_scat, d);
      if (!sift_engine_gather_rows (ctx->engine, ctx->layer, self->scattered, (gsize) c.n_scat, &gk, &gv,
                                    error))
        return FALSE;
      for (gint32 g = 0; g < kvh; g++)
        {
          memcpy (self->ws_k + (gsize) g * c.n_ws * d, self->tmp_k + (gsize) g * c.n_scat * d,
                  (gsize) c.n_scat * d * sizeof (float));
          memcpy (self->ws_v + (gsize) g * c.n_ws * d, self->tmp_v + (gsize) g * c.n_scat * d,
                  (gsize) c.n_scat * d * sizeof (float));
        }
    }

  /* The window's stored part through ring slots, then the local tokens. */
  if (!load_window (&c, error))
    return FALSE;
  SiftView lk, lv;
  sift_engine_local_kv (ctx->engine, ctx, &lk, &lv);
  if (lk.n_tokens != end - kv_len || lk.n_heads != kvh || lk.head_dim != d)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "subquadratic: the engine's local buffer holds %" G_GINT64_FORMAT " tokens, not "
                   "[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT ")",
                   lk.n_tokens, kv_len, end);
      return FALSE;
    }
  for (gint64 p = kv_len; p < end; p++)
    for (gint32 g = 0; g < kvh; g++)
      {
        gsize at = ((gsize) g * c.n_ws + (gsize) ws_row (&c, p)) * d;
        sift_view_row_to_f32 (&lk, g, p - kv_len, self->ws_k + at);
        sift_view_row_to_f32 (&lv, g, p - kv_len, self->ws_v + at);
      }

  /* Landmarks the rows name. */
  for (gint64 x = 0; x < n_needed; x++)
    {
      self->blk_map[self->blocks_needed[x]] = (gint32) x;
      fill_landmark (&c, L, self->blocks_needed[x], x);
    }

  /* A band needs rows to share it: prefill chunks, not single decode rows. */
  if (n_q >= SQ_BAND_ROWS && sq_simd_band (d) != NULL)
    {
      gsize per_head = sq_panel_floats (c.n_ws, d);
      if (per_head * kvh > self->panels_cap)
        {
          self->panels_cap = per_head * kvh;
          g_aligned_free (self->panels);
          self->panels = g_aligned_alloc (self->panels_cap, sizeof (float), 64);
        }
      for (gint32 g = 0; g < kvh; g++)
        sq_pack_panels (self->ws_k + (gsize) g * c.n_ws * d, d, c.n_ws, d, self->panels + g * per_head);
      c.panels = self->panels;
    }
  gint n_workers = sift_parallel_n_threads ();
  c.idx_stride = SQ_BAND_ROWS * (c.max_tok + c.max_blk) + (gsize) cfg->window + SQ_BAND_ROWS + 1;
  GROW (self->idx, gint32, self->idx_cap, (gsize) n_workers * c.idx_stride);
  GROW (self->ptrs, const float *, self->ptrs_cap, (gsize) n_workers * 2 * SQ_BAND_ROWS * (c.max_tok + c.max_blk));
  GROW (self->acc, float, self->acc_cap, (gsize) n_workers * SQ_BAND_ROWS * d);
  sift_parallel_for ((n_q + SQ_BAND_ROWS - 1) / SQ_BAND_ROWS, 1, attend_tiles, &c);

  /* Density counts the sequence's tokens a row attends (its token
   * candidates), for every query head; landmarks are summaries, counted
   * apart, so density stays a fraction of the KV. */
  guint64 attended = 0, landmarks = 0;
  for (gint64 r = 0; r < n_q; r++)
    {
      attended += self->n_cand[r];
      landmarks += self->n_lcand[r];
    }
  attended -= dropped;
  sift_engine_count_attended (ctx->engine, ctx, attended * (guint64) self->q_heads);
  sift_engine_count_summaries (ctx->engine, ctx, landmarks * (guint64) self->q_heads);
  return TRUE;
}
