/* The block table: per layer, each stored block's meta, store id and row
 * positions (the row index); the prefill and decode buffers filled and
 * offloaded as blocks (policies' offload hooks first, then a store job);
 * the local tokens and row gathering over all of it; waiting for a layer's
 * stores. Eviction (evict.c) edits the table; this file never calls it. */
#include <stdlib.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>

#include "engine-private.h"

/* ---- State -------------------------------------------------------------- */

void
sift_engine_blocks_init (SiftEngine *e)
{
  const gint32 L = e->config.shape.n_layers;
  e->meta = g_new0 (GArray *, L);
  e->store_ids = g_new0 (GArray *, L);
  e->rows_pos = g_new0 (GArray *, L);
  for (gint32 l = 0; l < L; l++)
    {
      e->meta[l] = g_array_new (FALSE, TRUE, sizeof (SiftBlockMeta));
      e->store_ids[l] = g_array_new (FALSE, FALSE, sizeof (gint64));
      e->rows_pos[l] = g_array_new (FALSE, FALSE, sizeof (gint64));
    }
  e->stored_tokens = g_new0 (gint64, L);
  e->kept_tokens = g_new0 (gint64, L);
  e->store_events = g_new0 (SiftEvent *, L);
  for (gint32 l = 0; l < L; l++)
    e->store_events[l] = e->backend->ops->event_new (e->backend);
}

/* Gives every stored block back to the store. */
static void
release_blocks (SiftEngine *e)
{
  for (gint32 l = 0; l < e->config.shape.n_layers; l++)
    {
      GArray *ids = e->store_ids[l];
      for (guint i = 0; i < ids->len; i++)
        sift_store_release (e->store, g_array_index (ids, gint64, i));
      g_array_set_size (ids, 0);
    }
}

void
sift_engine_blocks_clear (SiftEngine *e)
{
  release_blocks (e);
  for (gint32 l = 0; l < e->config.shape.n_layers; l++)
    {
      g_array_set_size (e->meta[l], 0);
      g_array_set_size (e->rows_pos[l], 0);
      e->stored_tokens[l] = e->kept_tokens[l] = 0;
      /* The stores are drained: a failed one's error is all that is left. */
      e->backend->ops->event_wait (e->backend, &e->store_events[l], 1, NULL, NULL);
    }
}

void
sift_engine_blocks_free (SiftEngine *e)
{
  release_blocks (e);
  for (gint32 l = 0; l < e->config.shape.n_layers; l++)
    {
      g_array_unref (e->store_ids[l]);
      g_array_unref (e->meta[l]);
      g_array_unref (e->rows_pos[l]);
      e->backend->ops->event_wait (e->backend, &e->store_events[l], 1, NULL, NULL);
      e->backend->ops->event_free (e->backend, e->store_events[l]);
    }
  g_free (e->store_events);
  g_free (e->meta);
  g_free (e->store_ids);
  g_free (e->rows_pos);
  g_free (e->stored_tokens);
  g_free (e->kept_tokens);
}

/* ---- Stores -------------------------------------------------------------- */

void
sift_engine_wait_stores (SiftEngine *e, gint32 layer)
{
  SiftBackend *b = e->backend;
  if (b->ops->event_query (b, e->store_events[layer]) != SIFT_EVENT_PENDING)
    return;
  gint64 t0 = g_get_monotonic_time ();
  b->ops->event_wait (b, &e->store_events[layer], 1, NULL, NULL);
  SiftCounters add = { .seconds_stalled = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC };
  sift_engine_count (e, layer, e->phase, &add);
}

gboolean
sift_engine_store_ok (SiftEngine *e, GError **error)
{
  pthread_mutex_lock (&e->lock);
  gboolean ok = e->store_error == NULL;
  if (!ok)
    g_set_error (error, e->store_error->domain, e->store_error->code, "%s", e->store_error->message);
  pthread_mutex_unlock (&e->lock);
  return ok;
}

gboolean
sift_engine_wait_layer (SiftEngine *e, gint32 layer, GError **error)
{
  sift_engine_wait_stores (e, layer);
  return sift_engine_store_ok (e, error);
}

gboolean
sift_engine_sync (SiftEngine *e, GError **error)
{
  for (gint32 l = 0; l < e->config.shape.n_layers; l++)
    sift_engine_wait_stores (e, l);
  return sift_engine_store_ok (e, error);
}

/* ---- Offload ------------------------------------------------------------ */

void
sift_engine_fill_context (SiftEngine *e, SiftPolicyContext *ctx, gint32 layer)
{
  ctx->struct_size = sizeof (SiftPolicyContext);
  ctx->layer = layer;
  ctx->block_size = e->config.shape.block_size;
  ctx->shape = &e->config.shape;
  ctx->engine = e;
  ctx->kv_len = e->stored_tokens[layer];
  ctx->n_blocks = e->store_ids[layer]->len;
  ctx->blocks = (const SiftBlockMeta *) (const void *) e->meta[layer]->data;
}

gboolean
sift_engine_call_offload_hook (SiftPolicy *policy, SiftPhase phase, const SiftPolicyContext *ctx,
                   const SiftBlockInfo *info, GError **error)
{
  gboolean (*hook) (SiftPolicy *, const SiftPolicyContext *, const SiftBlockInfo *, GError **)
    = phase == SIFT_PHASE_PREFILL ? policy->ops->on_prefill_offload : policy->ops->on_decode_offload;
  GError *local = NULL;
  if (hook == NULL || hook (policy, ctx, info, &local))
    return TRUE;
  g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY, "policy '%s': %s failed: %s",
               policy->ops->name, phase == SIFT_PHASE_PREFILL ? "on_prefill_offload" : "on_decode_offload",
               local ? local->message : "(no message)");
  g_clear_error (&local);
  return FALSE;
}

/* A block of `layer` was appended (before stored_tokens moves on): its rows
 * join the row index, and their accumulated attention (H2O, when the layer
 * tracks it) moves from the local accumulator to the block's. */
static void
note_rows (SiftEngine *e, gint32 layer, gint64 first_token, gint32 n_valid)
{
  const gint32 bs = e->config.shape.block_size, kvh = e->config.shape.n_kv_heads;
  for (gint32 t = 0; t < bs; t++)
    {
      gint64 p = t < n_valid ? first_token + t : -1;
      g_array_append_val (e->rows_pos[layer], p);
    }
  e->kept_tokens[layer] += n_valid;
  if (!e->track[layer])
    return;
  /* The local accumulator starts at stored_tokens: its first n_valid rows
   * become the block's, the rest move to the front. */
  float *loc = e->acc_local[layer];
  GArray *acc = e->acc[layer];
  guint at = acc->len;
  g_array_set_size (acc, at + (guint) bs * (guint) kvh);
  memcpy (&g_array_index (acc, float, at), loc, sizeof (float) * (gsize) n_valid * (gsize) kvh);
  gsize rest = (gsize) (e->acc_local_cap - n_valid) * (gsize) kvh;
  memmove (loc, loc + (gsize) n_valid * (gsize) kvh, sizeof (float) * rest);
  memset (loc + rest, 0, sizeof (float) * (gsize) n_valid * (gsize) kvh);
}

/* Appends one stored block of `layer`: allocates an id, calls the layer
 * policies' offload hooks, queues the store. */
static gboolean
offload_block (SiftEngine *e, const SiftPolicyContext *ctx, const SiftLayerPolicies *policies, gint32 layer,
               SiftPhase phase, gint64 first_token, gint32 n_valid, guint8 *k, guint8 *v, const guint8 *hk,
               const guint8 *hv, gint64 cap, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  GArray *ids = e->store_ids[layer];
  gint64 logical = ids->len;
  if (e->config.max_tokens > 0 && first_token + n_valid > e->config.max_tokens)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_CAPACITY,
                   "engine: token %" G_GINT64_FORMAT " is past the block table's capacity of %" G_GINT64_FORMAT
                   " tokens",
                   first_token + n_valid - 1, e->config.max_tokens);
      return FALSE;
    }
  /* Without eviction every layer stores the same tokens in block i. */
  const gint32 other = layer == 0 ? 1 : 0;
  if (e->evict.capacity_tokens == 0 && other < s->n_layers && logical < (gint64) e->meta[other]->len)
    {
      const SiftBlockMeta *m = &g_array_index (e->meta[other], SiftBlockMeta, logical);
      if (m->first_token != first_token || m->n_valid != n_valid)
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                       "engine: layer %d stores block %" G_GINT64_FORMAT " as tokens %" G_GINT64_FORMAT
                       "+%d, other layers stored it as %" G_GINT64_FORMAT "+%d",
                       layer, logical, first_token, n_valid, m->first_token, m->n_valid);
          return FALSE;
        }
    }
  SiftBlockMeta m = { .first_token = first_token, .n_valid = n_valid, .phase = phase };
  g_array_append_val (e->meta[layer], m);
  gint64 id = -1;
  if (!sift_engine_store_ok (e, error) || !sift_store_alloc (e->store, &id, error))
    {
      g_array_set_size (e->meta[layer], (guint) logical);
      return FALSE;
    }
  SiftBlockInfo info = {
    .struct_size = sizeof (SiftBlockInfo),
    .block_id = logical,
    .meta = &g_array_index (e->meta[layer], SiftBlockMeta, logical),
    /* The hooks read the host image. */
    .k = sift_view_strided ((void *) hk, e->config.compute_dtype, s->n_kv_heads, s->block_size, s->head_dim,
                            cap * s->head_dim, s->head_dim),
    .v = sift_view_strided ((void *) hv, e->config.compute_dtype, s->n_kv_heads, s->block_size, s->head_dim,
                            cap * s->head_dim, s->head_dim),
  };
  /* The block table may have moved (appended above, evicted before): the
   * hooks see it as it is now, the new block past n_blocks. */
  SiftPolicyContext now = *ctx;
  sift_engine_fill_context (e, &now, layer);
  SiftPolicy *const seen[] = { policies ? policies->prefill : NULL,
                               policies && policies->decode != policies->prefill ? policies->decode : NULL };
  for (gsize i = 0; i < G_N_ELEMENTS (seen); i++)
    if (seen[i] != NULL && !sift_engine_call_offload_hook (seen[i], phase, &now, &info, error))
      {
        sift_store_release (e->store, id);
        g_array_set_size (e->meta[layer], (guint) logical);
        return FALSE;
      }
  g_array_append_val (ids, id);
  note_rows (e, layer, first_token, n_valid);
  e->stored_tokens[layer] = first_token + n_valid;
  SiftTransfer t = { .kind = SIFT_TRANSFER_STORE, .store_id = id, .what = SIFT_LOAD_KV, .k = k, .v = v,
                     .cap = cap, .event = e->store_events[layer], .layer = layer, .phase = phase,
                     .host_k = e->host_compute ? NULL : hk, .host_v = e->host_compute ? NULL : hv };
  e->backend->ops->submit (e->backend, &t, 1);
  /* Resident KV: the block's copy in compute memory, straight from the buffer. */
  return !e->resident || sift_engine_resident_put (e, id, k, v, cap, error);
}

/* Makes compute memory buf[off, off + n) equal to its host image (nothing
 * to do when the image is the buffer). */
static void
upload (SiftEngine *e, guint8 *buf, const guint8 *image, gsize off, gsize n)
{
  if (buf != image && n > 0)
    e->backend->ops->buffer_write (e->backend, buf + off, image + off, n);
}

/* Writes f32 token-major rows [n][n_kv_heads][head_dim] into the host
 * image of a compute buffer [n_kv_heads][cap][head_dim] at token t0, then
 * the rows' span (head 0's first row to the last head's last) into the
 * buffer: one write. */
static void
put_rows (SiftEngine *e, const float *src, gint64 n, guint8 *buf, guint8 *dst, gint64 cap, gint64 t0)
{
  const SiftModelShape *s = &e->config.shape;
  const gsize row = (gsize) s->head_dim * e->es;
  if (s->n_kv_heads == 1) /* token-major and head-major coincide: one run */
    sift_convert (src, SIFT_DTYPE_F32, dst + (gsize) (t0 * s->head_dim) * e->es, e->config.compute_dtype,
                  (gsize) (n * s->head_dim));
  else
    for (gint64 t = 0; t < n; t++)
      for (gint32 h = 0; h < s->n_kv_heads; h++)
        sift_convert (src + (t * s->n_kv_heads + h) * s->head_dim, SIFT_DTYPE_F32,
                      dst + (gsize) ((h * cap + t0 + t) * s->head_dim) * e->es, e->config.compute_dtype,
                      (gsize) s->head_dim);
  upload (e, buf, dst, (gsize) t0 * row, ((gsize) (s->n_kv_heads - 1) * (gsize) cap + (gsize) n) * row);
}

gboolean
sift_engine_put_prefill (SiftEngine *e, gint32 layer, gint64 pos0, gint64 n, const float *k,
                         const float *v, GError **error)
{
  if (!sift_engine_check_layer (e, layer, error))
    return FALSE;
  const SiftModelShape *s = &e->config.shape;
  if (n <= 0 || n > s->chunk_size)
    return sift_engine_invalid (error, "a prefill chunk of %" G_GINT64_FORMAT " tokens (chunk_size %d)", n, s->chunk_size);
  if (pos0 != e->stored_tokens[layer] || e->decode_len[layer] > 0
      || (e->stored_tokens[layer] % s->block_size) != 0)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: layer %d cannot prefill at %" G_GINT64_FORMAT ": %" G_GINT64_FORMAT
                   " tokens are stored%s",
                   layer, pos0, e->stored_tokens[layer],
                   e->decode_len[layer] > 0 ? " and decoding started" : "");
      return FALSE;
    }
  /* The buffer pair is shared (engine-private.h): its previous layer's
   * rows must be offloaded, and their stores done, before these overwrite them. */
  gint32 *owner = &e->prefill_owner[layer % e->n_prefill_pairs];
  if (*owner >= 0 && *owner != layer)
    {
      const gint32 o = *owner;
      if (e->prefill_len[o] > 0 && e->stored_tokens[o] < e->prefill_pos[o] + e->prefill_len[o])
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                       "engine: layer %d cannot prefill at %" G_GINT64_FORMAT ": layer %d's chunk at %" G_GINT64_FORMAT
                       " shares its buffer and is not offloaded yet", layer, pos0, o, e->prefill_pos[o]);
          return FALSE;
        }
      sift_engine_wait_stores (e, o);
      e->prefill_len[o] = 0;
    }
  sift_engine_wait_stores (e, layer);
  if (!sift_engine_store_ok (e, error))
    return FALSE;
  put_rows (e, k, n, e->prefill_k[layer], e->prefill_hk[layer], s->chunk_size, 0);
  put_rows (e, v, n, e->prefill_v[layer], e->prefill_hv[layer], s->chunk_size, 0);
  *owner = layer;
  e->prefill_pos[layer] = pos0;
  e->prefill_len[layer] = (gint32) n;
  return TRUE;
}

gboolean
sift_engine_offload_prefill (SiftEngine *e, const SiftPolicyContext *ctx,
                             const SiftLayerPolicies *policies, GError **error)
{
  const gint32 layer = ctx->layer;
  if (!sift_engine_check_layer (e, layer, error))
    return FALSE;
  const SiftModelShape *s = &e->config.shape;
  const gint64 n = e->prefill_len[layer];
  for (gint64 t = 0; t < n; t += s->block_size)
    {
      gsize off = (gsize) (t * s->head_dim) * e->es;
      if (!offload_block (e, ctx, policies, layer, SIFT_PHASE_PREFILL, e->prefill_pos[layer] + t,
                          (gint32) MIN (s->block_size, n - t), e->prefill_k[layer] + off,
                          e->prefill_v[layer] + off, e->prefill_hk[layer] + off, e->prefill_hv[layer] + off,
                          s->chunk_size, error))
        return FALSE;
    }
  return TRUE;
}

gboolean
sift_engine_put_decode (SiftEngine *e, gint32 layer, gint64 pos0, gint64 n, const float *k,
                        const float *v, GError **error)
{
  if (!sift_engine_check_layer (e, layer, error))
    return FALSE;
  const SiftModelShape *s = &e->config.shape;
  if (n <= 0 || n > SIFT_ATTN_DECODE_MAX_ROWS)
    return sift_engine_invalid (error, "%" G_GINT64_FORMAT " decode rows (1..%d)", n, SIFT_ATTN_DECODE_MAX_ROWS);
  if (pos0 != e->stored_tokens[layer] + e->decode_len[layer])
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: layer %d cannot decode at position %" G_GINT64_FORMAT ", the next is %" G_GINT64_FORMAT,
                   layer, pos0, e->stored_tokens[layer] + e->decode_len[layer]);
      return FALSE;
    }
  if (e->decode_start[layer] > 0)
    sift_engine_wait_stores (e, layer);
  if (!sift_engine_store_ok (e, error))
    return FALSE;
  if (e->decode_start[layer] > 0)
    {
      /* The previous step offloaded the first block; its store is done, so
       * the remaining rows can move to the front. */
      gsize row = (gsize) s->head_dim * e->es;
      for (gint32 h = 0; h < s->n_kv_heads; h++)
        {
          gsize base = (gsize) h * (gsize) e->decode_cap * row;
          gsize from = base + (gsize) e->decode_start[layer] * row, n = (gsize) e->decode_len[layer] * row;
          e->backend->ops->buffer_move (e->backend, e->decode_k[layer] + base, e->decode_k[layer] + from, n);
          e->backend->ops->buffer_move (e->backend, e->decode_v[layer] + base, e->decode_v[layer] + from, n);
          if (!e->host_compute)
            {
              memmove (e->decode_hk[layer] + base, e->decode_hk[layer] + from, n);
              memmove (e->decode_hv[layer] + base, e->decode_hv[layer] + from, n);
            }
        }
      e->decode_start[layer] = 0;
    }
  g_assert (e->decode_len[layer] + n <= e->decode_cap);
  put_rows (e, k, n, e->decode_k[layer], e->decode_hk[layer], e->decode_cap, e->decode_len[layer]);
  put_rows (e, v, n, e->decode_v[layer], e->decode_hv[layer], e->decode_cap, e->decode_len[layer]);
  e->decode_len[layer] += (gint32) n;
  return TRUE;
}

gboolean
sift_engine_offload_decode (SiftEngine *e, const SiftPolicyContext *ctx,
                            const SiftLayerPolicies *policies, GError **error)
{
  const gint32 layer = ctx->layer;
  if (!sift_engine_check_layer (e, layer, error))
    return FALSE;
  const SiftModelShape *s = &e->config.shape;
  /* Steps of more rows than block_size fill more than one block: offload
   * every full one, or the next step's rows do not fit the buffer. */
  while (e->decode_len[layer] >= s->block_size)
    {
      gsize off = (gsize) e->decode_start[layer] * (gsize) s->head_dim * e->es;
      if (!offload_block (e, ctx, policies, layer, SIFT_PHASE_DECODE, e->stored_tokens[layer] /* before */,
                          s->block_size, e->decode_k[layer] + off, e->decode_v[layer] + off,
                          e->decode_hk[layer] + off, e->decode_hv[layer] + off, e->decode_cap, error))
        return FALSE;
      e->decode_start[layer] += s->block_size;
      e->decode_len[layer] -= s->block_size;
    }
  return TRUE;
}

/* ---- Reading the table -------------------------------------------------- */

gboolean
sift_engine_find_row (SiftEngine *e, gint32 layer, gint64 pos, gint64 *block_out, gint32 *row_out)
{
  const SiftBlockMeta *m = (const SiftBlockMeta *) (const void *) e->meta[layer]->data;
  const gint64 *rp = (const gint64 *) (const void *) e->rows_pos[layer]->data;
  const gint32 bs = e->config.shape.block_size;
  gint64 lo = 0, hi = e->store_ids[layer]->len;
  if (hi == 0)
    return FALSE;
  /* Blocks hold ascending positions, blocks after blocks. */
  while (hi - lo > 1)
    {
      gint64 mid = lo + (hi - lo) / 2;
      if (m[mid].first_token <= pos)
        lo = mid;
      else
        hi = mid;
    }
  const gint64 *row = rp + lo * bs;
  gint32 a = 0, b = m[lo].n_valid;
  while (a < b)
    {
      gint32 mid = a + (b - a) / 2;
      if (row[mid] < pos)
        a = mid + 1;
      else
        b = mid;
    }
  if (a >= m[lo].n_valid || row[a] != pos)
    return FALSE;
  *block_out = lo;
  *row_out = a;
  return TRUE;
}

const gint64 *
sift_engine_block_positions (SiftEngine *e, gint32 layer, gint64 block_id)
{
  g_return_val_if_fail (e != NULL && layer >= 0 && layer < e->config.shape.n_layers, NULL);
  if (block_id < 0 || block_id >= (gint64) e->store_ids[layer]->len)
    return NULL;
  return &g_array_index (e->rows_pos[layer], gint64, block_id * e->config.shape.block_size);
}

gsize
sift_engine_stored_positions (SiftEngine *e, gint32 layer, gint64 *out)
{
  g_return_val_if_fail (e != NULL && layer >= 0 && layer < e->config.shape.n_layers, 0);
  const gint32 bs = e->config.shape.block_size;
  gsize n = 0;
  for (guint b = 0; b < e->store_ids[layer]->len; b++)
    {
      const SiftBlockMeta *m = &g_array_index (e->meta[layer], SiftBlockMeta, b);
      for (gint32 t = 0; t < m->n_valid; t++, n++)
        if (out != NULL)
          out[n] = g_array_index (e->rows_pos[layer], gint64, (gsize) b * bs + t);
    }
  return n;
}

/* The local tokens' views in compute memory (host: in the host image). */
static void
local_kv (SiftEngine *e, const SiftPolicyContext *ctx, gboolean host, SiftView *k, SiftView *v)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 l = ctx->layer;
  SiftView kv = sift_view_strided (NULL, e->config.compute_dtype, s->n_kv_heads, 0, s->head_dim, 0, s->head_dim);
  guint8 *kd, *vd;
  if (ctx->phase == SIFT_PHASE_PREFILL)
    {
      kv.n_tokens = e->prefill_len[l];
      kv.head_stride = (gint64) s->chunk_size * s->head_dim;
      kd = host ? e->prefill_hk[l] : e->prefill_k[l];
      vd = host ? e->prefill_hv[l] : e->prefill_v[l];
    }
  else
    {
      gsize off = (gsize) e->decode_start[l] * (gsize) s->head_dim * e->es;
      kv.n_tokens = e->decode_len[l];
      kv.head_stride = (gint64) e->decode_cap * s->head_dim;
      kd = (host ? e->decode_hk[l] : e->decode_k[l]) + off;
      vd = (host ? e->decode_hv[l] : e->decode_v[l]) + off;
    }
  if (!host && !e->host_compute)
    kv.space = SIFT_MEMORY_DEVICE;
  if (k != NULL)
    {
      *k = kv;
      k->data = kd;
    }
  if (v != NULL)
    {
      *v = kv;
      v->data = vd;
    }
}

void
sift_engine_local_kv (SiftEngine *e, const SiftPolicyContext *ctx, SiftView *k, SiftView *v)
{
  g_return_if_fail (e != NULL && ctx != NULL && ctx->layer >= 0 && ctx->layer < e->config.shape.n_layers);
  local_kv (e, ctx, FALSE, k, v);
}

void
sift_engine_local_kv_host (SiftEngine *e, const SiftPolicyContext *ctx, SiftView *k, SiftView *v)
{
  local_kv (e, ctx, TRUE, k, v);
}

gboolean
sift_engine_gather_rows (SiftEngine *e, gint32 layer, const gint64 *positions, gsize n, SiftView *k_out,
                         SiftView *v_out, GError **error)
{
  g_return_val_if_fail (e != NULL && (positions != NULL || n == 0) && k_out != NULL && v_out != NULL, FALSE);
  if (!sift_engine_check_layer (e, layer, error))
    return FALSE;
  const SiftModelShape *s = &e->config.shape;
  for (int i = 0; i < 2; i++)
    {
      const SiftView *o = i == 0 ? k_out : v_out;
      if (o->dtype != SIFT_DTYPE_F32 || o->n_heads != s->n_kv_heads || o->head_dim != s->head_dim
          || o->n_tokens < (gint64) n || (o->data == NULL && n > 0))
        return sift_engine_invalid (error, "gather_rows: %s_out must be f32 [%d kv heads][>= %" G_GSIZE_FORMAT " tokens][%d dim]",
                        i == 0 ? "k" : "v", s->n_kv_heads, n, s->head_dim);
    }
  sift_engine_wait_stores (e, layer);
  if (!sift_engine_store_ok (e, error))
    return FALSE;
  const gsize rb = sift_store_row_bytes (e->store);
  g_autofree guint8 *rows = g_malloc (rb * (gsize) s->block_size);
  const gint64 stored = e->stored_tokens[layer];
  const gint64 dec0 = stored, dec1 = stored + e->decode_len[layer];
  const gint64 pf0 = e->prefill_pos[layer], pf1 = pf0 + e->prefill_len[layer];
  guint64 loaded = 0;
  gint64 t0 = g_get_monotonic_time ();
  for (gsize i = 0; i < n;)
    {
      const gint64 p = positions[i];
      gint64 b, b2;
      gint32 t, t2;
      if (p >= 0 && p < stored && sift_engine_find_row (e, layer, p, &b, &t))
        {
          /* A run of consecutive positions in consecutive rows of one block
           * is one read per head and half. */
          gsize run = 1;
          while (i + run < n && t + (gint64) run < s->block_size && positions[i + run] == p + (gint64) run
                 && sift_engine_find_row (e, layer, p + (gint64) run, &b2, &t2) && b2 == b && t2 == t + (gint32) run)
            run++;
          const gint64 id = g_array_index (e->store_ids[layer], gint64, b);
          for (gint32 h = 0; h < s->n_kv_heads; h++)
            for (int which = 0; which < 2; which++)
              {
                SiftView *o = which == 0 ? k_out : v_out;
                gsize off = (which == 0 ? 0 : e->store->k_bytes) + (gsize) ((gint64) h * s->block_size + t) * rb;
                if (!sift_store_read (e->store, id, off, rows, run * rb, error))
                  return FALSE;
                loaded += run * rb;
                for (gsize r = 0; r < run; r++)
                  sift_convert (rows + r * rb, e->store->config.dtype, sift_view_row (o, h, (gint64) (i + r)),
                                SIFT_DTYPE_F32, (gsize) s->head_dim);
              }
          i += run;
          continue;
        }
      for (gint32 h = 0; h < s->n_kv_heads; h++)
        for (int which = 0; which < 2; which++)
          {
            float *dst = sift_view_row (which == 0 ? k_out : v_out, h, (gint64) i);
            if (p >= dec0 && p < dec1 && e->decode_len[layer] > 0)
              {
                guint8 *buf = which == 0 ? e->decode_hk[layer] : e->decode_hv[layer];
                gint64 td = e->decode_start[layer] + (p - dec0);
                sift_convert (buf + (gsize) (((gint64) h * e->decode_cap + td) * s->head_dim) * e->es,
                              e->config.compute_dtype, dst, SIFT_DTYPE_F32, (gsize) s->head_dim);
              }
            else if (p >= pf0 && p < pf1)
              {
                guint8 *buf = which == 0 ? e->prefill_hk[layer] : e->prefill_hv[layer];
                sift_convert (buf + (gsize) (((gint64) h * s->chunk_size + (p - pf0)) * s->head_dim) * e->es,
                              e->config.compute_dtype, dst, SIFT_DTYPE_F32, (gsize) s->head_dim);
              }
            else
              return sift_engine_invalid (error, "gather_rows: position %" G_GINT64_FORMAT " is not in layer %d's cache%s", p,
                              layer, p >= 0 && p < stored ? " (evicted)" : "");
          }
      i++;
    }
  SiftCounters add = { .bytes_loaded = loaded,
                       .seconds_load = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC };
  sift_engine_count (e, layer, e->phase, &add);
  return TRUE;
}

