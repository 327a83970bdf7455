/* The default attention pipelines: selected stored blocks stream through
 * the ring slots (or arrive from the cross-layer double buffer) and are
 * attended non-causally, the local tokens causally, and every partial result
 * is merged into the output by LSE. A block is attended only by the query
 * heads that selected it: kernels run on head sub-views. */
#include <math.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>

#include "engine-private.h"

/* One kernel call for query heads [q0, q0 + nqh) against kv heads
 * [k0, k0 + nkh), merged into out / lse. */
static gboolean
call_merge (SiftEngine *e, const SiftPolicyContext *ctx, gint32 q0, gint32 nqh, gint32 k0, gint32 nkh,
            const SiftView *k, const SiftView *v, const SiftAttnOpts *opts, SiftView *out, float *lse,
            GError **error)
{
  const gint64 nq = ctx->n_q;
  SiftView part = sift_view_htd (e->part_out, SIFT_DTYPE_F32, e->config.shape.n_q_heads, nq,
                                 e->config.shape.head_dim);
  SiftView qs = sift_view_heads (&ctx->q, q0, nqh), ks = sift_view_heads (k, k0, nkh),
           vs = sift_view_heads (v, k0, nkh), ps = sift_view_heads (&part, q0, nqh),
           os = sift_view_heads (out, q0, nqh);
  float *pl = e->part_lse + (gsize) q0 * (gsize) nq;
  /* The decode kernel reads each key once for a group's heads; same results. */
  gboolean ok = nq <= SIFT_ATTN_DECODE_MAX_ROWS ? sift_attn_decode (&qs, &ks, &vs, opts, &ps, pl, error)
                                                : sift_attn_dense (&qs, &ks, &vs, opts, &ps, pl, error);
  return ok && sift_attn_merge (&os, lse + (gsize) q0 * (gsize) nq, &ps, pl, error);
}

static gboolean
group_full (const gboolean *heads, gint32 g, gint32 G)
{
  for (gint32 h = g * G; heads != NULL && h < (g + 1) * G; h++)
    if (!heads[h])
      return FALSE;
  return TRUE;
}

/* Attends keys k, v ([n_kv_heads][n][head_dim]) for the query heads whose
 * heads[] flag is set (NULL: all), and merges into out / lse. */
static gboolean
attend_part (SiftEngine *e, const SiftPolicyContext *ctx, const SiftView *k, const SiftView *v,
             const gboolean *heads, gboolean causal, gint64 q_offset, SiftView *out, float *lse,
             guint64 *attended, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 G = s->n_q_heads / s->n_kv_heads;
  const gint64 nq = ctx->n_q;
  if (k->n_tokens == 0 || nq == 0)
    return TRUE;
  SiftAttnOpts opts = { .scale = s->scale, .causal = causal, .q_offset = q_offset };
  guint64 keys_per_head = 0;
  for (gint64 i = 0; i < nq; i++)
    keys_per_head += (guint64) (causal ? CLAMP (q_offset + i + 1, 0, k->n_tokens) : k->n_tokens);

  /* Runs of kv heads whose whole group selected the keys go in one call;
   * a group selected only in part goes head by head. */
  for (gint32 g = 0; g < s->n_kv_heads;)
    {
      if (group_full (heads, g, G))
        {
          gint32 g1 = g + 1;
          while (g1 < s->n_kv_heads && group_full (heads, g1, G))
            g1++;
          if (!call_merge (e, ctx, g * G, (g1 - g) * G, g, g1 - g, k, v, &opts, out, lse, error))
            return FALSE;
          *attended += keys_per_head * (guint64) ((g1 - g) * G);
          g = g1;
          continue;
        }
      for (gint32 h = g * G; h < (g + 1) * G; h++)
        if (heads[h])
          {
            if (!call_merge (e, ctx, h, 1, g, 1, k, v, &opts, out, lse, error))
              return FALSE;
            *attended += keys_per_head;
          }
      g++;
    }
  return TRUE;
}

static gboolean
check_call (SiftEngine *e, const SiftPolicyContext *ctx, const SiftView *out, const float *lse, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  const char *why = NULL;
  if (ctx->layer < 0 || ctx->layer >= s->n_layers)
    why = "layer out of range";
  else if (ctx->n_q <= 0 || ctx->n_q > e->max_q
           || (ctx->phase == SIFT_PHASE_DECODE && ctx->n_q > SIFT_ATTN_DECODE_MAX_ROWS))
    why = "query rows out of range";
  else if (ctx->q.n_heads != s->n_q_heads || ctx->q.n_tokens != ctx->n_q || ctx->q.head_dim != s->head_dim
           || ctx->q.dtype != SIFT_DTYPE_F32)
    why = "q is not f32 [n_q_heads][n_q][head_dim]";
  else if (out == NULL || out->n_heads != s->n_q_heads || out->n_tokens != ctx->n_q
           || out->head_dim != s->head_dim || out->dtype != SIFT_DTYPE_F32 || lse == NULL)
    why = "out is not f32 [n_q_heads][n_q][head_dim] or lse is NULL";
  else if (ctx->kv_len != e->stored_tokens[ctx->layer])
    why = "ctx->kv_len differs from the layer's stored tokens";
  if (why == NULL)
    return TRUE;
  g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID,
               "engine: attend (layer %d, %d rows): %s", ctx->layer, ctx->n_q, why);
  return FALSE;
}

static void
clear_out (SiftView *out, float *lse, gint64 nq)
{
  for (gint32 h = 0; h < out->n_heads; h++)
    for (gint64 t = 0; t < nq; t++)
      {
        memset (sift_view_row (out, h, t), 0, (gsize) out->head_dim * sizeof (float));
        lse[h * nq + t] = -INFINITY;
      }
}

/* Per-head flags of block b in sel; NULL when every head selected it. */
static const gboolean *
block_heads (SiftEngine *e, const SiftSelection *sel, gint64 b, gboolean *flags)
{
  if (sel == NULL)
    return NULL;
  gboolean all = TRUE;
  for (gint32 h = 0; h < e->config.shape.n_q_heads; h++)
    {
      flags[h] = sift_selection_has (sel, b, h);
      all = all && flags[h];
    }
  return all ? NULL : flags;
}

static gboolean
attend_local (SiftEngine *e, const SiftPolicyContext *ctx, SiftView *out, float *lse, guint64 *attended,
              GError **error)
{
  SiftView k, v;
  sift_engine_local_kv (e, ctx, &k, &v);
  return attend_part (e, ctx, &k, &v, NULL, TRUE, ctx->q_pos - ctx->kv_len, out, lse, attended, error);
}

/* Validates a selection a policy passes in against the layer's stored blocks. */
static gboolean
validate (SiftEngine *e, const SiftPolicyContext *ctx, const SiftSelection *selection, GError **error)
{
  gint64 n = e->store_ids[ctx->layer]->len;
  g_autofree gint64 *avail = g_new (gint64, MAX (n, 1));
  for (gint64 i = 0; i < n; i++)
    avail[i] = i;
  return sift_selection_validate ((SiftSelection *) selection, avail, (gsize) n,
                                  e->policy_name ? e->policy_name : "(caller)", error);
}

static void
count_compute (SiftEngine *e, const SiftPolicyContext *ctx, gint64 t0, guint64 attended)
{
  SiftCounters add = { .tokens_attended = attended,
                       .seconds_compute = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC };
  sift_engine_count (e, ctx->layer, ctx->phase, &add);
}

gboolean
sift_engine_attend_default (SiftEngine *e, const SiftPolicyContext *ctx, const SiftSelection *selection,
                            SiftView *out, float *lse, GError **error)
{
  g_return_val_if_fail (e != NULL && ctx != NULL, FALSE);
  if (!check_call (e, ctx, out, lse, error))
    return FALSE;
  if (selection != NULL && !validate (e, ctx, selection, error))
    return FALSE;
  e->phase = ctx->phase;
  const gint32 layer = ctx->layer;
  const gint32 n_slots = e->config.n_slots;
  const gint64 m = selection != NULL ? (gint64) sift_selection_n_blocks (selection)
                                     : (gint64) e->store_ids[layer]->len;
  g_autofree gboolean *flags = g_new (gboolean, e->config.shape.n_q_heads);
  guint64 attended = 0;
  gint64 compute_us = 0;
  clear_out (out, lse, ctx->n_q);

  /* The ring: block i goes to slot i mod n_slots. Blocks are taken in
   * groups of G = n_slots / 2 (a group never wraps around the ring): wait
   * for the group's slots, attend each block, free the group, refill every
   * free slot at once, so the copy worker is woken once per group while the
   * next group loads. Each block is one kernel call and one merge, in block
   * order whatever the load timing: results are reproducible bit for bit. */
#define BLOCK_AT(i) (selection != NULL ? sift_selection_block (selection, (gsize) (i)) : (i))
  const gint64 G = MAX (1, n_slots / 2);
  gint64 queued = 0, done = 0;
  gboolean ok = TRUE;
  sift_engine_hold_wake (e, TRUE);
  while (queued < MIN (m, n_slots) && ok)
    if ((ok = sift_engine_load_block (e, layer, BLOCK_AT (queued), (gint32) (queued % n_slots), SIFT_LOAD_KV, error)))
      queued++;
  sift_engine_hold_wake (e, FALSE);
  while (done < queued && ok)
    {
      gint64 end = MIN (queued, (done / G + 1) * G);
      end = MIN (end, done + (n_slots - done % n_slots)); /* no wrap */
      gint64 waited = done;
      for (; waited < end; waited++)
        if (!sift_engine_wait_slot (e, (gint32) (waited % n_slots), error))
          break;
      if (waited < end)
        {
          ok = FALSE;
          for (; done < waited; done++)
            sift_engine_slot_done (e, (gint32) (done % n_slots));
          done++; /* the failed slot is free again */
          break;
        }
      for (gint64 i = done; i < end && ok; i++)
        {
          SiftView k, v;
          gint32 nv = 0;
          sift_engine_slot_ready (e, (gint32) (i % n_slots), &nv);
          sift_engine_slots_kv (e, (gint32) (i % n_slots), nv, &k, &v);
          gint64 t0 = g_get_monotonic_time ();
          ok = attend_part (e, ctx, &k, &v, block_heads (e, selection, BLOCK_AT (i), flags), FALSE, 0, out, lse,
                            &attended, error);
          compute_us += g_get_monotonic_time () - t0;
        }
      for (; done < end; done++)
        sift_engine_slot_done (e, (gint32) (done % n_slots));
      if (ok && queued < m)
        {
          sift_engine_hold_wake (e, TRUE);
          while (queued < m && queued - done < n_slots && ok)
            if ((ok = sift_engine_load_block (e, layer, BLOCK_AT (queued), (gint32) (queued % n_slots),
                                              SIFT_LOAD_KV, error)))
              queued++;
          sift_engine_hold_wake (e, FALSE);
        }
    }
#undef BLOCK_AT
  /* After a failure, let the loads still in flight finish and free their slots. */
  for (; done < queued; done++)
    {
      gint32 slot = (gint32) (done % n_slots);
      sift_engine_wait_slot (e, slot, NULL);
      sift_engine_slot_done (e, slot);
    }
  if (!ok)
    return FALSE;

  gint64 t0 = g_get_monotonic_time ();
  ok = attend_local (e, ctx, out, lse, &attended, error);
  count_compute (e, ctx, t0 - compute_us, attended);
  return ok;
}

gboolean
sift_engine_attend_loaded (SiftEngine *e, const SiftPolicyContext *ctx, const SiftSelection *sel,
                           const SiftView *k, const SiftView *v, gsize n_blocks, SiftView *out, float *lse,
                           GError **error)
{
  if (!check_call (e, ctx, out, lse, error))
    return FALSE;
  const gint32 bs = e->config.shape.block_size;
  const gint32 nqh = e->config.shape.n_q_heads;
  g_autofree gboolean *a = g_new (gboolean, nqh);
  g_autofree gboolean *b = g_new (gboolean, nqh);
  guint64 attended = 0;
  gint64 t0 = g_get_monotonic_time ();
  clear_out (out, lse, ctx->n_q);
  /* Blocks side by side: one call per run of full blocks with one head
   * mask (a run may end with a partial block). */
  gsize i = 0;
  while (i < n_blocks)
    {
      gint64 id = sel != NULL ? sift_selection_block (sel, i) : (gint64) i;
      const gboolean *hi = block_heads (e, sel, id, a);
      gsize j = i;
      for (;;)
        {
          gint64 idj = sel != NULL ? sift_selection_block (sel, j) : (gint64) j;
          if (g_array_index (e->meta, SiftBlockMeta, idj).n_valid < bs || j + 1 >= n_blocks)
            break;
          gint64 idn = sel != NULL ? sift_selection_block (sel, j + 1) : (gint64) (j + 1);
          const gboolean *hn = block_heads (e, sel, idn, b);
          if ((hi == NULL) != (hn == NULL) || (hi != NULL && memcmp (hi, hn, sizeof (gboolean) * (gsize) nqh) != 0))
            break;
          j++;
        }
      gint64 idj = sel != NULL ? sift_selection_block (sel, j) : (gint64) j;
      gint64 tokens = (gint64) (j - i) * bs + g_array_index (e->meta, SiftBlockMeta, idj).n_valid;
      SiftView kr = sift_view_tokens (k, (gint64) i * bs, tokens), vr = sift_view_tokens (v, (gint64) i * bs, tokens);
      if (!attend_part (e, ctx, &kr, &vr, hi, FALSE, 0, out, lse, &attended, error))
        return FALSE;
      i = j + 1;
    }
  gboolean ok = attend_local (e, ctx, out, lse, &attended, error);
  count_compute (e, ctx, t0, attended);
  return ok;
}
