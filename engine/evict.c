/* Bounded KV: eviction down to capacity_tokens per layer, block compaction,
 * and the H2O accumulated attention the heavy-hitter policy scores with.
 * See docs/eviction.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>
#include <sift/simd.h>

#include "engine-private.h"

/* ---- State -------------------------------------------------------------- */

void
sift_engine_evict_init (SiftEngine *e)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 L = s->n_layers;
  e->acc = g_new0 (GArray *, L);
  e->acc_local = g_new0 (float *, L);
  e->track = g_new0 (gboolean, L);
  e->acc_local_cap = MAX (s->chunk_size, e->decode_cap);
  for (gint32 l = 0; l < L; l++)
    {
      e->acc[l] = g_array_new (FALSE, TRUE, sizeof (float));
      e->acc_local[l] = g_new0 (float, (gsize) e->acc_local_cap * (gsize) s->n_kv_heads);
    }
}

void
sift_engine_evict_clear (SiftEngine *e)
{
  const SiftModelShape *s = &e->config.shape;
  for (gint32 l = 0; l < s->n_layers; l++)
    {
      g_array_set_size (e->acc[l], 0);
      memset (e->acc_local[l], 0, sizeof (float) * (gsize) e->acc_local_cap * (gsize) s->n_kv_heads);
    }
}

void
sift_engine_evict_free (SiftEngine *e)
{
  for (gint32 l = 0; l < e->config.shape.n_layers; l++)
    {
      g_array_unref (e->acc[l]);
      g_free (e->acc_local[l]);
    }
  g_free (e->acc);
  g_free (e->acc_local);
  g_free (e->track);
}

gboolean
sift_engine_set_eviction (SiftEngine *e, const SiftEvictConfig *c, GError **error)
{
  g_return_val_if_fail (e != NULL && c != NULL, FALSE);
  const gint64 bs = e->config.shape.block_size;
  if (c->capacity_tokens < 0 || c->protect_sinks < 0 || c->protect_recent < 0)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID,
                   "engine: capacity_tokens %" G_GINT64_FORMAT ", protect_sinks %" G_GINT64_FORMAT
                   " and protect_recent %" G_GINT64_FORMAT " must not be negative",
                   c->capacity_tokens, c->protect_sinks, c->protect_recent);
      return FALSE;
    }
  if (c->granularity != SIFT_EVICT_TOKEN && c->granularity != SIFT_EVICT_BLOCK)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID, "engine: unknown eviction granularity %d",
                   (int) c->granularity);
      return FALSE;
    }
  for (gint32 l = 0; l < e->config.shape.n_layers; l++)
    if (e->store_ids[l]->len > 0 || e->decode_len[l] > 0)
      {
        g_set_error_literal (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                             "engine: eviction is set before a sequence starts (after new or reset)");
        return FALSE;
      }
  /* Eviction must always find enough unprotected tokens: protected ones
   * fill at most sinks + recent tokens, or (whole blocks) two blocks more,
   * and one block must fit besides (the block just offloaded). */
  gint64 need = c->protect_sinks + c->protect_recent + bs
                + (c->granularity == SIFT_EVICT_BLOCK ? 2 * bs : 0);
  if (c->capacity_tokens > 0 && c->capacity_tokens < need)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID,
                   "engine: capacity_tokens %" G_GINT64_FORMAT " cannot hold %" G_GINT64_FORMAT
                   " protected sink and %" G_GINT64_FORMAT " recent tokens with %s eviction of %" G_GINT64_FORMAT
                   "-token blocks (at least %" G_GINT64_FORMAT " needed)",
                   c->capacity_tokens, c->protect_sinks, c->protect_recent,
                   c->granularity == SIFT_EVICT_BLOCK ? "block" : "token", bs, need);
      return FALSE;
    }
  e->evict = *c;
  return TRUE;
}

void
sift_engine_track_attention (SiftEngine *e, gint32 layer, gboolean on)
{
  g_return_if_fail (e != NULL && layer >= 0 && layer < e->config.shape.n_layers);
  g_return_if_fail (e->store_ids[layer]->len == 0); /* before the sequence starts */
  e->track[layer] = on;
}

double
sift_engine_accumulated_attention (SiftEngine *e, gint32 layer, gint64 position)
{
  g_return_val_if_fail (e != NULL && layer >= 0 && layer < e->config.shape.n_layers, -1);
  gint64 b;
  gint32 t;
  if (!e->track[layer] || !sift_engine_find_row (e, layer, position, &b, &t))
    return -1;
  const gint32 bs = e->config.shape.block_size, kvh = e->config.shape.n_kv_heads;
  double sum = 0;
  for (gint32 g = 0; g < kvh; g++)
    sum += g_array_index (e->acc[layer], float, ((gsize) b * bs + t) * kvh + g);
  return sum;
}

/* ---- H2O accumulated attention ----------------------------------------- */

/* Adds, for kv head g's keys k (f32 [n][d]) at positions pos, the softmax
 * probability p = exp(scale q.k - lse) of every query row of the group
 * that may see them (causal) to acc[i * kvh + g]. The scores come a tile
 * of ACC_TILE query rows at a time from sift_score_tile (the dispatched
 * SIMD dot products; same sums as a plain loop up to rounding). */
enum { ACC_TILE = 16 };

static void
accumulate_rows (SiftEngine *e, const SiftPolicyContext *ctx, const float *lse, gint32 g, const float *k,
                 const gint64 *pos, gsize n, float *acc)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 d = s->head_dim, group = s->n_q_heads / s->n_kv_heads, kvh = s->n_kv_heads;
  const float scale = sift_attn_scale (s->scale, d);
  if (n == 0)
    return;
  g_autofree float *dots = g_new (float, (gsize) ACC_TILE * n);
  for (gint32 hq = g * group; hq < (g + 1) * group; hq++)
    for (gint32 i0 = 0; i0 < ctx->n_q; i0 += ACC_TILE)
      {
        const gint32 rows = MIN (ACC_TILE, ctx->n_q - i0);
        sift_score_tile (sift_view_row (&ctx->q, hq, i0), (gsize) ctx->q.token_stride, rows, k, (gsize) d,
                         (gint64) n, (gsize) d, dots);
        for (gint32 r = 0; r < rows; r++)
          {
            const gint32 i = i0 + r;
            const float l = lse[(gsize) hq * ctx->n_q + i];
            if (!isfinite (l))
              continue; /* the row attended nothing */
            const gint64 qp = ctx->q_pos + i;
            const float *dot = dots + (gsize) r * n;
            for (gsize j = 0; j < n; j++)
              if (pos[j] >= 0 && pos[j] <= qp)
                acc[j * (gsize) kvh + g] += expf (scale * dot[j] - l);
          }
      }
}

gboolean
sift_engine_accumulate (SiftEngine *e, const SiftPolicyContext *ctx, const float *lse, GError **error)
{
  const gint32 l = ctx->layer;
  if (!e->track[l])
    return TRUE;
  const SiftModelShape *s = &e->config.shape;
  const gint32 bs = s->block_size, d = s->head_dim, kvh = s->n_kv_heads;
  const gsize rb = sift_store_row_bytes (e->store);
  if (!sift_engine_wait_layer (e, l, error))
    return FALSE;
  /* Stored blocks: the K half of each, read and converted head by head. */
  g_autofree guint8 *raw = g_malloc (e->store->k_bytes);
  g_autofree float *k = g_new (float, (gsize) MAX (bs, e->acc_local_cap) * (gsize) d);
  guint64 loaded = 0;
  GArray *ids = e->store_ids[l];
  for (guint b = 0; b < ids->len; b++)
    {
      const SiftBlockMeta *m = &g_array_index (e->meta[l], SiftBlockMeta, b);
      if (!sift_store_read (e->store, g_array_index (ids, gint64, b), 0, raw, e->store->k_bytes, error))
        return FALSE;
      loaded += e->store->k_bytes;
      const gint64 *pos = &g_array_index (e->rows_pos[l], gint64, (gsize) b * bs);
      float *acc = &g_array_index (e->acc[l], float, (gsize) b * bs * kvh);
      for (gint32 g = 0; g < kvh; g++)
        {
          sift_convert (raw + (gsize) g * bs * rb, e->store->config.dtype, k, SIFT_DTYPE_F32,
                        (gsize) m->n_valid * (gsize) d);
          accumulate_rows (e, ctx, lse, g, k, pos, (gsize) m->n_valid, acc);
        }
    }
  /* Local tokens (the chunk, or the decode buffer with the step's rows). */
  SiftView lk;
  sift_engine_local_kv_host (e, ctx, &lk, NULL);
  const gint64 n = lk.n_tokens, p0 = e->stored_tokens[l];
  g_autofree gint64 *pos = g_new (gint64, (gsize) MAX (n, 1));
  for (gint64 j = 0; j < n; j++)
    pos[j] = p0 + j;
  for (gint32 g = 0; g < kvh; g++)
    {
      for (gint64 j = 0; j < n; j++)
        sift_view_row_to_f32 (&lk, g, j, k + j * d);
      accumulate_rows (e, ctx, lse, g, k, pos, (gsize) n, e->acc_local[l]);
    }
  SiftCounters add = { .bytes_loaded = loaded };
  sift_engine_count (e, l, ctx->phase, &add);
  return TRUE;
}

/* ---- Eviction ----------------------------------------------------------- */

typedef struct {
  float score;
  gint64 pos;
  gsize index;
} Ranked;

static int
ranked_cmp (const void *a, const void *b)
{
  const Ranked *x = a, *y = b;
  if (x->score != y->score)
    return x->score < y->score ? -1 : 1;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Offers stored block b of layer l again to the layer's policies' offload
 * hooks (its keys and values converted from the stored bytes `raw`). */
static gboolean
reoffload (SiftEngine *e, const SiftPolicyContext *ctx, SiftPolicy *const pol[2], gint64 b,
           const guint8 *raw, guint8 *kbuf, guint8 *vbuf, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 l = ctx->layer;
  const gsize n = (gsize) s->n_kv_heads * (gsize) s->block_size * (gsize) s->head_dim;
  sift_convert (raw, e->store->config.dtype, kbuf, e->config.compute_dtype, n);
  sift_convert (raw + e->store->k_bytes, e->store->config.dtype, vbuf, e->config.compute_dtype, n);
  SiftPolicyContext c = *ctx;
  sift_engine_fill_context (e, &c, l);
  const SiftBlockMeta *m = &g_array_index (e->meta[l], SiftBlockMeta, b);
  SiftBlockInfo info = {
    .struct_size = sizeof (SiftBlockInfo),
    .block_id = b,
    .meta = m,
    .k = sift_view_strided (kbuf, e->config.compute_dtype, s->n_kv_heads, s->block_size, s->head_dim,
                            (gint64) s->block_size * s->head_dim, s->head_dim),
    .v = sift_view_strided (vbuf, e->config.compute_dtype, s->n_kv_heads, s->block_size, s->head_dim,
                            (gint64) s->block_size * s->head_dim, s->head_dim),
  };
  /* Each of the layer's policies once, through the hook of the block's
   * phase, as when it was first stored. */
  SiftPolicy *const seen[2] = { pol[0], pol[1] != pol[0] ? pol[1] : NULL };
  for (int i = 0; i < 2; i++)
    if (seen[i] != NULL && !sift_engine_call_offload_hook (seen[i], m->phase, &c, &info, error))
      {
        g_prefix_error (error, "after compaction of block %" G_GINT64_FORMAT ": ", b);
        return FALSE;
      }
  return TRUE;
}

static gboolean
has_hook (SiftPolicy *const pol[2])
{
  for (int i = 0; i < 2; i++)
    if (pol[i] != NULL && (pol[i]->ops->on_prefill_offload != NULL || pol[i]->ops->on_decode_offload != NULL))
      return TRUE;
  return FALSE;
}

/* Token granularity: the kept rows of blocks b0.. are packed again into as
 * few blocks as they need (all full but the last), rewritten in place; the
 * ids left over go back to the store. */
static gboolean
compact_tokens (SiftEngine *e, const SiftPolicyContext *ctx, SiftPolicy *const pol[2], const gboolean *victim,
                gint64 b0, SiftCounters *add, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 l = ctx->layer, bs = s->block_size, kvh = s->n_kv_heads;
  const gsize bb = e->store->block_bytes, kb = e->store->k_bytes, rb = sift_store_row_bytes (e->store);
  GArray *ids = e->store_ids[l], *meta = e->meta[l], *rp = e->rows_pos[l], *acc = e->acc[l];
  const gint64 nb = ids->len, n_src = nb - b0;
  g_autofree guint8 *src = g_malloc ((gsize) n_src * bb);
  for (gint64 b = b0; b < nb; b++)
    if (!sift_store_read (e->store, g_array_index (ids, gint64, b), 0, src + (gsize) (b - b0) * bb, bb, error))
      return FALSE;
  g_autofree guint8 *dst = g_malloc0 ((gsize) n_src * bb);
  g_autofree gint64 *npos = g_new (gint64, (gsize) n_src * bs);
  g_autofree float *nacc = e->track[l] ? g_new0 (float, (gsize) n_src * bs * kvh) : NULL;
  g_autofree SiftPhase *nphase = g_new (SiftPhase, (gsize) n_src);
  gint64 j = 0;
  for (gint64 b = b0; b < nb; b++)
    {
      const SiftBlockMeta *m = &g_array_index (meta, SiftBlockMeta, b);
      for (gint32 t = 0; t < m->n_valid; t++)
        {
          gsize r = (gsize) b * bs + t;
          if (victim[r])
            continue;
          const gint64 jb = j / bs, jt = j % bs;
          if (jt == 0)
            nphase[jb] = m->phase;
          for (int half = 0; half < 2; half++)
            for (gint32 h = 0; h < kvh; h++)
              memcpy (dst + (gsize) jb * bb + (gsize) half * kb + ((gsize) h * bs + (gsize) jt) * rb,
                      src + (gsize) (b - b0) * bb + (gsize) half * kb + ((gsize) h * bs + (gsize) t) * rb, rb);
          npos[j] = g_array_index (rp, gint64, r);
          if (nacc != NULL)
            memcpy (nacc + (gsize) j * kvh, &g_array_index (acc, float, r * kvh), sizeof (float) * (gsize) kvh);
          j++;
        }
    }
  const gint64 n_keep = j, n_new = (n_keep + bs - 1) / bs;
  for (gint64 i = 0; i < n_new; i++)
    {
      sift_engine_unmap_id (e, g_array_index (ids, gint64, b0 + i));
      if (!sift_store_write (e->store, g_array_index (ids, gint64, b0 + i), dst + (gsize) i * bb, error)
          || (e->resident && !sift_engine_resident_reload (e, l, g_array_index (ids, gint64, b0 + i), error)))
        return FALSE;
    }
  for (gint64 b = b0 + n_new; b < nb; b++)
    {
      sift_engine_unmap_id (e, g_array_index (ids, gint64, b));
      sift_store_release (e->store, g_array_index (ids, gint64, b));
    }
  g_array_set_size (ids, (guint) (b0 + n_new));
  g_array_set_size (meta, (guint) (b0 + n_new));
  g_array_set_size (rp, (guint) ((b0 + n_new) * bs));
  for (gint64 i = 0; i < n_new; i++)
    {
      gint32 nv = (gint32) MIN ((gint64) bs, n_keep - i * bs);
      g_array_index (meta, SiftBlockMeta, b0 + i) = (SiftBlockMeta) { .first_token = npos[i * bs], .n_valid = nv, .phase = nphase[i] };
      for (gint32 t = 0; t < bs; t++)
        g_array_index (rp, gint64, (b0 + i) * bs + t) = t < nv ? npos[i * bs + t] : -1;
    }
  if (nacc != NULL)
    {
      g_array_set_size (acc, (guint) ((b0 + n_new) * bs * kvh));
      memcpy (&g_array_index (acc, float, (gsize) b0 * bs * kvh), nacc, sizeof (float) * (gsize) n_new * bs * kvh);
    }
  add->bytes_loaded += (guint64) n_src * bb;
  add->bytes_stored += (guint64) n_new * bb;
  if (!has_hook (pol))
    return TRUE;
  const gsize half_bytes = (gsize) kvh * (gsize) bs * (gsize) s->head_dim * e->es;
  g_autofree guint8 *kbuf = g_malloc (half_bytes), *vbuf = g_malloc (half_bytes);
  for (gint64 i = 0; i < n_new; i++)
    if (!reoffload (e, ctx, pol, b0 + i, dst + (gsize) i * bb, kbuf, vbuf, error))
      return FALSE;
  return TRUE;
}

/* Block granularity: victim blocks leave the table; the blocks after the
 * first of them get new logical ids (offered again to the offload hooks,
 * read back from the store when a policy has one). */
static gboolean
drop_blocks (SiftEngine *e, const SiftPolicyContext *ctx, SiftPolicy *const pol[2], const gboolean *drop,
             SiftCounters *add, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 l = ctx->layer, bs = s->block_size, kvh = s->n_kv_heads;
  GArray *ids = e->store_ids[l], *meta = e->meta[l], *rp = e->rows_pos[l], *acc = e->acc[l];
  gint64 b0 = -1;
  for (gint64 b = (gint64) ids->len - 1; b >= 0; b--)
    {
      if (!drop[b])
        continue;
      b0 = b;
      sift_engine_unmap_id (e, g_array_index (ids, gint64, b));
      sift_store_release (e->store, g_array_index (ids, gint64, b));
      g_array_remove_index (ids, (guint) b);
      g_array_remove_index (meta, (guint) b);
      g_array_remove_range (rp, (guint) (b * bs), (guint) bs);
      if (e->track[l])
        g_array_remove_range (acc, (guint) (b * bs * kvh), (guint) (bs * kvh));
    }
  if (b0 < 0 || !has_hook (pol))
    return TRUE;
  const gsize bb = e->store->block_bytes;
  const gsize half_bytes = (gsize) kvh * (gsize) bs * (gsize) s->head_dim * e->es;
  g_autofree guint8 *raw = g_malloc (bb), *kbuf = g_malloc (half_bytes), *vbuf = g_malloc (half_bytes);
  for (gint64 b = b0; b < (gint64) ids->len; b++)
    {
      if (!sift_store_read (e->store, g_array_index (ids, gint64, b), 0, raw, bb, error)
          || !reoffload (e, ctx, pol, b, raw, kbuf, vbuf, error))
        return FALSE;
      add->bytes_loaded += bb;
    }
  return TRUE;
}

gboolean
sift_engine_evict (SiftEngine *e, const SiftPolicyContext *ctx, SiftPolicy *scorer, SiftPolicy *prefill,
                   SiftPolicy *decode, GError **error)
{
  const gint32 l = ctx->layer;
  const SiftEvictConfig *c = &e->evict;
  if (c->capacity_tokens == 0 || e->kept_tokens[l] <= c->capacity_tokens)
    return TRUE;
  const gint32 bs = e->config.shape.block_size, kvh = e->config.shape.n_kv_heads;
  /* A policy that computes attention its own way may take block i for
   * tokens [i * block_size, ...): unless it knows eviction (it has
   * score_eviction) it must not see a compacted cache. The
   * prefill policy computes no more once decoding runs. */
  SiftPolicy *const users[2] = { scorer, ctx->phase == SIFT_PHASE_PREFILL ? decode : NULL };
  for (int i = 0; i < 2; i++)
    {
      SiftPolicy *p = users[i];
      if (p == NULL || p->ops->score_eviction != NULL)
        continue;
      if (p->ops->compute_chunked_prefill != NULL || p->ops->compute_chunked_decode != NULL)
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                       "policy '%s' computes attention its own way and does not know eviction (no score_eviction):"
                       " layer %d passed kv.capacity_tokens = %" G_GINT64_FORMAT
                       "; run it unbounded (capacity_tokens: 0)",
                       p->ops->name, l, c->capacity_tokens);
          return FALSE;
        }
    }
  /* Compaction reads and rewrites the layer's blocks: its stores first,
   * and no copy still reading a block loaded ahead (ring.c). */
  sift_engine_ring_drop_ahead (e);
  if (!sift_engine_wait_layer (e, l, error))
    return FALSE;
  GArray *ids = e->store_ids[l];
  const gint64 nb = ids->len, n_evict = e->kept_tokens[l] - c->capacity_tokens;
  const gint64 recent_from = ctx->q_pos + ctx->n_q - c->protect_recent;
  const gint64 *rp = (const gint64 *) (const void *) e->rows_pos[l]->data;

  /* Candidates: every stored row outside the sinks and the recent window. */
  g_autoptr (GArray) cpos = g_array_new (FALSE, FALSE, sizeof (gint64));
  g_autoptr (GArray) cblock = g_array_new (FALSE, FALSE, sizeof (gint64));
  g_autoptr (GArray) crow = g_array_new (FALSE, FALSE, sizeof (gsize));
  for (gint64 b = 0; b < nb; b++)
    {
      const SiftBlockMeta *m = &g_array_index (e->meta[l], SiftBlockMeta, b);
      for (gint32 t = 0; t < m->n_valid; t++)
        {
          gsize r = (gsize) b * bs + t;
          if (rp[r] < c->protect_sinks || rp[r] >= recent_from)
            continue;
          g_array_append_val (cpos, rp[r]);
          g_array_append_val (cblock, b);
          g_array_append_val (crow, r);
        }
    }
  const gsize n = cpos->len;
  g_autofree float *scores = g_new0 (float, MAX (n, 1));
  g_autofree float *accum = NULL;
  if (e->track[l])
    {
      accum = g_new (float, MAX ((gsize) kvh * n, 1));
      for (gint32 g = 0; g < kvh; g++)
        for (gsize i = 0; i < n; i++)
          accum[(gsize) g * n + i] = g_array_index (e->acc[l], float, g_array_index (crow, gsize, i) * kvh + g);
    }
  SiftEvictCandidates cand = {
    .struct_size = sizeof (SiftEvictCandidates), .n = n, .positions = (const gint64 *) (const void *) cpos->data,
    .block_ids = (const gint64 *) (const void *) cblock->data, .accumulated = accum, .n_evict = n_evict,
    .granularity = c->granularity,
  };
  if (scorer != NULL && scorer->ops->score_eviction != NULL)
    {
      SiftPolicyContext pc = *ctx;
      sift_engine_fill_context (e, &pc, l);
      GError *local = NULL;
      if (!scorer->ops->score_eviction (scorer, &pc, &cand, scores, &local))
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY, "policy '%s': score_eviction failed: %s",
                       scorer->ops->name, local ? local->message : "(no message)");
          g_clear_error (&local);
          return FALSE;
        }
      for (gsize i = 0; i < n; i++)
        if (isnan (scores[i]))
          {
            g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                         "policy '%s': score_eviction gave NaN for token %" G_GINT64_FORMAT, scorer->ops->name,
                         cand.positions[i]);
            return FALSE;
          }
    }
  else
    for (gsize i = 0; i < n; i++)
      scores[i] = (float) cand.positions[i]; /* oldest first: sinks + window */

  g_autofree gboolean *victim = g_new0 (gboolean, (gsize) MAX (nb * bs, 1));
  g_autofree gboolean *drop = g_new0 (gboolean, (gsize) MAX (nb, 1));
  gint64 evicted = 0, b0 = nb;
  if (c->granularity == SIFT_EVICT_TOKEN)
    {
      g_autofree Ranked *rk = g_new (Ranked, MAX (n, 1));
      for (gsize i = 0; i < n; i++)
        rk[i] = (Ranked) { scores[i], cand.positions[i], i };
      qsort (rk, n, sizeof *rk, ranked_cmp);
      /* The lowest go; -inf asks for a token's eviction beyond n_evict. */
      for (gsize i = 0; i < n && (evicted < n_evict || rk[i].score == -INFINITY); i++, evicted++)
        {
          victim[g_array_index (crow, gsize, rk[i].index)] = TRUE;
          b0 = MIN (b0, cand.block_ids[rk[i].index]);
        }
    }
  else
    {
      /* Only blocks all of whose tokens are candidates may go. */
      g_autofree gint32 *n_cand = g_new0 (gint32, (gsize) MAX (nb, 1));
      g_autofree Ranked *rk = g_new0 (Ranked, (gsize) MAX (nb, 1));
      for (gint64 b = 0; b < nb; b++)
        rk[b] = (Ranked) { 0, g_array_index (e->meta[l], SiftBlockMeta, b).first_token, (gsize) b };
      for (gsize i = 0; i < n; i++)
        {
          n_cand[cand.block_ids[i]]++;
          rk[cand.block_ids[i]].score += scores[i];
        }
      gsize nr = 0;
      for (gint64 b = 0; b < nb; b++)
        if (n_cand[b] == g_array_index (e->meta[l], SiftBlockMeta, b).n_valid)
          rk[nr++] = rk[b];
      qsort (rk, nr, sizeof *rk, ranked_cmp);
      for (gsize i = 0; i < nr && (evicted < n_evict || rk[i].score == -INFINITY); i++)
        {
          drop[rk[i].index] = TRUE;
          evicted += g_array_index (e->meta[l], SiftBlockMeta, rk[i].index).n_valid;
        }
    }
  if (evicted < n_evict)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_CAPACITY,
                   "engine: layer %d holds %" G_GINT64_FORMAT " tokens, capacity_tokens is %" G_GINT64_FORMAT
                   ", but only %" G_GINT64_FORMAT " may be evicted (the rest are protected)",
                   l, e->kept_tokens[l], c->capacity_tokens, evicted);
      return FALSE;
    }
  SiftPolicy *const pol[2] = { prefill, decode };
  SiftCounters add = { .tokens_evicted = (guint64) evicted };
  gboolean ok = c->granularity == SIFT_EVICT_TOKEN
                  ? compact_tokens (e, ctx, pol, victim, b0, &add, error)
                  : drop_blocks (e, ctx, pol, drop, &add, error);
  e->kept_tokens[l] -= evicted;
  add.bytes_compacted = add.bytes_loaded + add.bytes_stored;
  sift_engine_count (e, l, ctx->phase, &add);
  return ok;
}
