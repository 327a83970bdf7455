/* The default attention: selected stored blocks are read in place
 * (resident in the store, when the backend can map it), stream through the
 * ring slots, or arrive from the cross-layer double buffer; a run of them
 * and the local tokens (causal, last) go to one backend attend call
 * (sift_attn_paged on the CPU), and runs are merged into the output by LSE
 * (the backend's merge). A block is attended only by
 * the query heads that selected it: kernels run on head sub-views. */
#include <math.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>

#include "engine-private.h"
#include "selection-private.h"

/* A batch: stored blocks attended in one kernel call (per head set), then
 * optionally the local tokens. Views [n_kv_heads][n_valid][head_dim]. One
 * per engine, reused by every call (a decode step at 32K adds 256 blocks:
 * no allocation per block or per step). */
struct _SiftBatch {
  GArray *k, *v;      /* SiftView [blocks] */
  GArray *heads;      /* gboolean [blocks][n_q_heads]: which query heads attend the block; empty while uniform */
  gboolean uniform;   /* every head attends every block */
  gint64 tokens;      /* keys in the blocks */
  /* Scratch of one call's head sub-views. */
  GArray *ks, *vs;    /* SiftView */
  GArray *masks;      /* guint64: one call's blocks' kv heads (batch_call_heads) */
};

static SiftBatch *
batch_get (SiftEngine *e)
{
  if (e->batch == NULL)
    {
      SiftBatch *b = g_new0 (SiftBatch, 1);
      b->k = g_array_new (FALSE, FALSE, sizeof (SiftView));
      b->v = g_array_new (FALSE, FALSE, sizeof (SiftView));
      b->heads = g_array_new (FALSE, FALSE, sizeof (gboolean));
      b->ks = g_array_new (FALSE, FALSE, sizeof (SiftView));
      b->vs = g_array_new (FALSE, FALSE, sizeof (SiftView));
      b->masks = g_array_new (FALSE, FALSE, sizeof (guint64));
      b->uniform = TRUE;
      e->batch = b;
    }
  return e->batch;
}

static void
batch_clear (SiftBatch *b)
{
  g_array_set_size (b->k, 0);
  g_array_set_size (b->v, 0);
  g_array_set_size (b->heads, 0);
  b->uniform = TRUE;
  b->tokens = 0;
}

void
sift_engine_attend_free (SiftEngine *e)
{
  SiftBatch *b = e->batch;
  if (b == NULL)
    return;
  g_array_unref (b->k);
  g_array_unref (b->v);
  g_array_unref (b->heads);
  g_array_unref (b->ks);
  g_array_unref (b->vs);
  g_array_unref (b->masks);
  g_free (b);
  e->batch = NULL;
}

/* Adds a block; heads: the query heads attending it (NULL: all). */
static void
batch_add (SiftEngine *e, SiftBatch *b, const SiftView *k, const SiftView *v, const gboolean *heads)
{
  const gint32 nqh = e->config.shape.n_q_heads;
  g_array_append_vals (b->k, k, 1);
  g_array_append_vals (b->v, v, 1);
  b->tokens += k->n_tokens;
  if (heads == NULL && b->uniform)
    return;
  guint at = b->heads->len;
  if (b->uniform)
    {
      /* The first block not attended by every head: the ones before were. */
      at = (b->k->len - 1) * (guint) nqh;
      g_array_set_size (b->heads, at);
      for (guint i = 0; i < at; i++)
        g_array_index (b->heads, gboolean, i) = TRUE;
      b->uniform = FALSE;
    }
  g_array_set_size (b->heads, at + (guint) nqh);
  for (gint32 h = 0; h < nqh; h++)
    g_array_index (b->heads, gboolean, at + (guint) h) = heads == NULL || heads[h];
}

static gboolean
attends (const SiftBatch *b, gint32 nqh, guint block, gint32 h)
{
  return b->uniform || g_array_index (b->heads, gboolean, block * (guint) nqh + (guint) h);
}

/* Whether query heads h1 and h2 attend the same blocks of the batch. */
static gboolean
same_blocks (const SiftBatch *b, gint32 nqh, gint32 h1, gint32 h2)
{
  for (guint i = 0; i < b->k->len && !b->uniform; i++)
    if (attends (b, nqh, i, h1) != attends (b, nqh, i, h2))
      return FALSE;
  return TRUE;
}

/* The engine's partial output (e->part_out, all query heads, nq rows), where
 * a later contribution is attended before it is merged into out by LSE. */
static SiftView
part_view (SiftEngine *e, gint64 nq)
{
  SiftView part = sift_view_htd (e->part_out, SIFT_DTYPE_F32, e->config.shape.n_q_heads, nq, e->config.shape.head_dim);
  part.space = e->host_compute ? SIFT_MEMORY_HOST : SIFT_MEMORY_DEVICE;
  return part;
}

/* One kernel call: query heads [q0, q0 + nqh) against kv heads [k0, k0 +
 * nkh) over the batch's blocks that head q0 attends, then the local tokens
 * (causal) when given. The first contribution to the heads goes straight
 * into out / lse; later ones are merged by LSE. */
static gboolean
batch_call (SiftEngine *e, const SiftPolicyContext *ctx, SiftBatch *b, const SiftView *lk, const SiftView *lv,
            gint32 q0, gint32 nqh, gint32 k0, gint32 nkh, SiftView *out, float *lse, gboolean *written,
            guint64 *attended, GError **error)
{
  const gint32 all = e->config.shape.n_q_heads;
  const gint64 nq = ctx->n_q;
  const gboolean local = lk != NULL && lk->n_tokens > 0;
  gint64 stored = 0;
  GArray *ka = b->ks, *va = b->vs;
  if (b->uniform && nqh == all)
    {
      /* Every block, every head: the batch's own views, the local tokens
       * appended for the call (batch_attend empties the batch after it). */
      ka = b->k, va = b->v;
      stored = b->tokens;
      if (local)
        {
          g_array_append_vals (ka, lk, 1);
          g_array_append_vals (va, lv, 1);
        }
    }
  else
    {
      g_array_set_size (ka, 0);
      g_array_set_size (va, 0);
      for (guint i = 0; i < b->k->len; i++)
        if (attends (b, all, i, q0))
          {
            SiftView ks = sift_view_heads (&g_array_index (b->k, SiftView, i), k0, nkh);
            SiftView vs = sift_view_heads (&g_array_index (b->v, SiftView, i), k0, nkh);
            g_array_append_val (ka, ks);
            g_array_append_val (va, vs);
            stored += ks.n_tokens;
          }
      if (local)
        {
          SiftView ks = sift_view_heads (lk, k0, nkh), vs = sift_view_heads (lv, k0, nkh);
          g_array_append_val (ka, ks);
          g_array_append_val (va, vs);
        }
    }
  if (ka->len == 0)
    return TRUE;
  /* The local tokens come last: a query row at position q_pos + i sees
   * every stored key and the local ones up to itself. */
  const gint64 past = ctx->q_pos - ctx->kv_len;
  SiftAttnOpts opts = { .scale = e->config.shape.scale, .causal = local, .q_offset = stored + past };
  guint64 keys = 0;
  for (gint64 i = 0; i < nq; i++)
    keys += (guint64) (stored + (local ? CLAMP (past + i + 1, 0, lk->n_tokens) : 0));
  *attended += keys * (guint64) nqh;

  SiftBackend *be = e->backend;
  SiftView qs = sift_view_heads (&ctx->q, q0, nqh), os = sift_view_heads (out, q0, nqh);
  float *ls = lse + (gsize) q0 * (gsize) nq;
  const SiftView *kb = (const SiftView *) (const void *) ka->data, *vb = (const SiftView *) (const void *) va->data;
  if (!written[q0])
    {
      for (gint32 h = q0; h < q0 + nqh; h++)
        written[h] = TRUE;
      return be->ops->attend (be, &qs, kb, vb, ka->len, &opts, &os, ls, error);
    }
  SiftView part = part_view (e, nq);
  SiftView ps = sift_view_heads (&part, q0, nqh);
  float *pl = e->part_lse + (gsize) q0 * (gsize) nq;
  return be->ops->attend (be, &qs, kb, vb, ka->len, &opts, &ps, pl, error)
         && be->ops->merge (be, &os, ls, &ps, pl, error);
}

/* Whether every kv head's query group attends the same blocks of the
 * batch (a per-kv-head selection, or a uniform one). */
static gboolean
groups_whole (SiftEngine *e, const SiftBatch *b)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 G = s->n_q_heads / s->n_kv_heads;
  for (gint32 g = 0; g < s->n_kv_heads; g++)
    for (gint32 h = g * G + 1; h < (g + 1) * G; h++)
      if (!same_blocks (b, s->n_q_heads, g * G, h))
        return FALSE;
  return TRUE;
}

/* One call over the whole batch (and the local tokens) where kv heads'
 * groups attend different blocks, on a backend that masks blocks per kv
 * head (attend_heads): each block goes with the kv heads attending it,
 * every head is written, later calls merged by LSE. */
static gboolean
batch_call_heads (SiftEngine *e, const SiftPolicyContext *ctx, SiftBatch *b, const SiftView *lk, const SiftView *lv,
                  SiftView *out, float *lse, gboolean *written, guint64 *attended, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 all = s->n_q_heads, G = all / s->n_kv_heads;
  const gint64 nq = ctx->n_q;
  const gboolean local = lk != NULL && lk->n_tokens > 0;
  GArray *ka = b->ks, *va = b->vs;
  g_array_set_size (ka, 0);
  g_array_set_size (va, 0);
  g_array_set_size (b->masks, 0);
  gint64 stored = 0;
  guint64 keys = 0; /* keys x query heads, stored blocks */
  for (guint i = 0; i < b->k->len; i++)
    {
      guint64 m = 0;
      for (gint32 g = 0; g < s->n_kv_heads; g++)
        if (attends (b, all, i, g * G))
          m |= G_GUINT64_CONSTANT (1) << g;
      if (m == 0)
        continue;
      const SiftView *k = &g_array_index (b->k, SiftView, i);
      g_array_append_vals (ka, k, 1);
      g_array_append_vals (va, &g_array_index (b->v, SiftView, i), 1);
      g_array_append_val (b->masks, m);
      stored += k->n_tokens;
      keys += (guint64) k->n_tokens * (guint64) __builtin_popcountll (m) * (guint64) G;
    }
  if (local)
    {
      const guint64 m = sift_kv_heads_all (s->n_kv_heads);
      g_array_append_vals (ka, lk, 1);
      g_array_append_vals (va, lv, 1);
      g_array_append_val (b->masks, m);
    }
  if (ka->len == 0)
    return TRUE;
  const gint64 past = ctx->q_pos - ctx->kv_len;
  SiftAttnOpts opts = { .scale = s->scale, .causal = local, .q_offset = stored + past };
  *attended += keys * (guint64) nq;
  for (gint64 i = 0; i < nq && local; i++)
    *attended += (guint64) CLAMP (past + i + 1, 0, lk->n_tokens) * (guint64) all;

  SiftBackend *be = e->backend;
  const SiftView *kb = (const SiftView *) (const void *) ka->data, *vb = (const SiftView *) (const void *) va->data;
  const guint64 *mb = (const guint64 *) (const void *) b->masks->data;
  if (!written[0])
    {
      for (gint32 h = 0; h < all; h++)
        written[h] = TRUE;
      return be->ops->attend_heads (be, &ctx->q, kb, vb, mb, ka->len, &opts, out, lse, error);
    }
  SiftView part = part_view (e, nq);
  return be->ops->attend_heads (be, &ctx->q, kb, vb, mb, ka->len, &opts, &part, e->part_lse, error)
         && be->ops->merge (be, out, lse, &part, e->part_lse, error);
}

/* Attends a batch (and the local tokens when lk != NULL) into out / lse:
 * one kernel call when every head attends every block, or when each kv
 * head's query group attends the same blocks and the backend masks blocks
 * per kv head (attend_heads); otherwise one per run of kv heads whose
 * query groups attend the same blocks, and one per query head of a group
 * that differs. The calls depend on the selection
 * only, never on load timing. Empties the batch. */
static gboolean
batch_attend (SiftEngine *e, const SiftPolicyContext *ctx, SiftBatch *b, const SiftView *lk, const SiftView *lv,
              SiftView *out, float *lse, gboolean *written, guint64 *attended, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 G = s->n_q_heads / s->n_kv_heads;
  gboolean ok = TRUE;
  /* One call needs every head in the same state too: an earlier group may
   * have reached some heads only (batch_call writes or merges by head q0). */
  gboolean same_written = TRUE;
  for (gint32 h = 1; h < s->n_q_heads; h++)
    same_written = same_written && written[h] == written[0];
  if (b->uniform && same_written)
    ok = batch_call (e, ctx, b, lk, lv, 0, s->n_q_heads, 0, s->n_kv_heads, out, lse, written, attended, error);
  else if (same_written && e->backend->ops->attend_heads != NULL && s->n_kv_heads <= 64 && groups_whole (e, b))
    ok = batch_call_heads (e, ctx, b, lk, lv, out, lse, written, attended, error);
  else
    for (gint32 g = 0; g < s->n_kv_heads && ok;)
      {
        gboolean whole = TRUE;
        for (gint32 h = g * G + 1; h < (g + 1) * G && whole; h++)
          whole = same_blocks (b, s->n_q_heads, g * G, h) && written[h] == written[g * G];
        if (!whole)
          {
            for (gint32 h = g * G; h < (g + 1) * G && ok; h++)
              ok = batch_call (e, ctx, b, lk, lv, h, 1, g, 1, out, lse, written, attended, error);
            g++;
            continue;
          }
        gint32 g1 = g + 1;
        for (; g1 < s->n_kv_heads; g1++)
          {
            gboolean same = TRUE;
            for (gint32 h = g1 * G; h < (g1 + 1) * G && same; h++)
              same = same_blocks (b, s->n_q_heads, g * G, h) && written[h] == written[g * G];
            if (!same)
              break;
          }
        ok = batch_call (e, ctx, b, lk, lv, g * G, (g1 - g) * G, g, g1 - g, out, lse, written, attended, error);
        g = g1;
      }
  batch_clear (b);
  return ok;
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

/* The same for the selection's i-th block, read from its head bits. */
static const gboolean *
block_heads_at (SiftEngine *e, const SiftSelection *sel, gsize i, gboolean *flags)
{
  const guint64 *bits = sift_selection_heads_at (sel, i);
  gboolean all = TRUE;
  for (gint32 h = 0; h < e->config.shape.n_q_heads; h++)
    {
      flags[h] = (bits[h / 64] >> (h % 64)) & 1;
      all = all && flags[h];
    }
  return all ? NULL : flags;
}

/* The kv heads whose query groups attend a block (heads: its query
 * heads' flags, NULL: all) as bits, for a load of those heads only; 0
 * (every head) when all do or a mask cannot hold them. */
static guint64
block_kv_heads (SiftEngine *e, const gboolean *heads)
{
  const SiftModelShape *s = &e->config.shape;
  if (heads == NULL || s->n_kv_heads > 64)
    return 0;
  const gint32 G = s->n_q_heads / s->n_kv_heads;
  guint64 mask = 0;
  for (gint32 h = 0; h < s->n_q_heads; h++)
    if (heads[h])
      mask |= G_GUINT64_CONSTANT (1) << (h / G);
  return mask;
}

static gboolean
any_head (const gboolean *flags, gint32 n)
{
  for (gint32 h = 0; h < n; h++)
    if (flags[h])
      return TRUE;
  return FALSE;
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

/* Counts a call's attended tokens and its compute time: the host clock's
 * from t0 on, or, where the backend times its own work (a GPU), the
 * backend's seconds of attention, loads and stalls. */
static void
count_compute (SiftEngine *e, const SiftPolicyContext *ctx, gint64 t0, guint64 attended)
{
  SiftCounters add = { .tokens_attended = attended,
                       .seconds_compute = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC };
  SiftBackend *be = e->backend;
  if (be->ops->timings != NULL)
    {
      SiftBackendTimes t = { 0 };
      be->ops->timings (be, &t);
      add.seconds_compute = t.compute;
      add.seconds_stalled = t.stalled;
      add.seconds_load = t.load;
    }
  sift_engine_count (e, ctx->layer, ctx->phase, &add);
}

/* ---- A call on a backend whose compute memory is not host memory --------
 * The policy's q and the caller's out and lse are host memory: q goes up
 * into call_q before the call, and out and lse of the heads the call
 * attended come down after it (the rest stay as clear_out left them). */

typedef struct {
  SiftPolicyContext ctx;  /* the caller's, q in compute memory */
  SiftView out;           /* [n_q_heads][n_q][head_dim] in call_out */
} DeviceCall;

/* The host scratch kept for gathering a call's q (a decode step's, up to
 * 16 rows; a prefill chunk's is allocated for the call). */
#define Q_GATHER_KEEP ((gsize) 1 << 20)

/* Writes view rows [h][t] of f32 host src into compact compute memory dst:
 * one write, the rows gathered on the host first where src is not compact
 * (the runner's q is token-major: a write per row was a copy call each). */
static void
q_up (SiftEngine *e, const SiftView *src, float *dst)
{
  SiftBackend *be = e->backend;
  const gsize row = (gsize) src->head_dim * sizeof (float);
  const gsize head = (gsize) src->n_tokens * row, bytes = head * (gsize) src->n_heads;
  if (src->token_stride == src->head_dim && src->head_stride == src->n_tokens * src->head_dim)
    {
      be->ops->buffer_write (be, (guint8 *) dst, src->data, bytes);
      return;
    }
  if (bytes <= Q_GATHER_KEEP && e->q_gather == NULL)
    e->q_gather = g_malloc (Q_GATHER_KEEP);
  guint8 *tmp = bytes <= Q_GATHER_KEEP ? e->q_gather : g_malloc (bytes);
  for (gint32 h = 0; h < src->n_heads; h++)
    for (gint64 t = 0; t < src->n_tokens; t++)
      memcpy (tmp + h * head + (gsize) t * row, sift_view_row (src, h, t), row);
  be->ops->buffer_write (be, (guint8 *) dst, tmp, bytes);
  if (tmp != e->q_gather)
    g_free (tmp);
}

static void
device_begin (SiftEngine *e, const SiftPolicyContext *ctx, DeviceCall *dc)
{
  const SiftModelShape *s = &e->config.shape;
  dc->ctx = *ctx;
  q_up (e, &ctx->q, e->call_q);
  dc->ctx.q = sift_view_htd (e->call_q, SIFT_DTYPE_F32, s->n_q_heads, ctx->n_q, s->head_dim);
  dc->ctx.q.space = SIFT_MEMORY_DEVICE;
  dc->out = sift_view_htd (e->call_out, SIFT_DTYPE_F32, s->n_q_heads, ctx->n_q, s->head_dim);
  dc->out.space = SIFT_MEMORY_DEVICE;
}

/* Reads the attended heads' output and LSE back (waiting for the call). */
static gboolean
device_end (SiftEngine *e, const DeviceCall *dc, SiftView *out, float *lse, const gboolean *written, GError **error)
{
  SiftBackend *be = e->backend;
  const gint64 nq = dc->ctx.n_q;
  const gsize row = (gsize) out->head_dim * sizeof (float), head = (gsize) nq * row;
  const gboolean compact = out->token_stride == out->head_dim && out->head_stride == nq * out->head_dim;
  for (gint32 h = 0; h < out->n_heads; h++)
    {
      if (!written[h])
        continue;
      gint32 h1 = h + 1; /* a run of attended heads: one read each */
      while (compact && h1 < out->n_heads && written[h1])
        h1++;
      const guint8 *src = (const guint8 *) e->call_out + (gsize) h * head;
      gboolean ok = TRUE;
      if (compact)
        ok = be->ops->buffer_read (be, sift_view_row (out, h, 0), src, head * (gsize) (h1 - h), error);
      else
        for (gint64 t = 0; t < nq && ok; t++)
          ok = be->ops->buffer_read (be, sift_view_row (out, h, t), src + (gsize) t * row, row, error);
      ok = ok && be->ops->buffer_read (be, lse + (gsize) h * (gsize) nq,
                                       (const guint8 *) (e->call_lse + (gsize) h * (gsize) nq),
                                       sizeof (float) * (gsize) nq * (gsize) (h1 - h), error);
      if (!ok)
        return FALSE;
      h = h1 - 1;
    }
  return TRUE;
}

/* Resident blocks (zero-copy): every selected block is read in place in
 * the store, all of them and the local tokens in one batch. */
static gboolean
attend_mapped (SiftEngine *e, const SiftPolicyContext *ctx, const SiftSelection *selection, gint64 m, SiftBatch *b,
               const SiftView *lk, const SiftView *lv, SiftView *out, float *lse, gboolean *written,
               guint64 *attended, gint64 *compute_us, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 layer = ctx->layer;
  /* The queue orders a copy after the store of its block; a block read in
   * place needs its layer's stores done. */
  if (!sift_engine_wait_layer (e, layer, error))
    return FALSE;
  /* Building the block list counts as attention time: it is the engine's
   * cost over a kernel on contiguous memory. */
  gint64 t0 = g_get_monotonic_time ();
  g_autofree gboolean *flags = g_new (gboolean, s->n_q_heads);
  const gint64 *all_ids = (const gint64 *) (const void *) e->store_ids[layer]->data;
  const SiftBlockMeta *meta = (const SiftBlockMeta *) (const void *) e->meta[layer]->data;
  g_autofree gint64 *ids = NULL;
  if (selection != NULL)
    {
      ids = g_new (gint64, m);
      for (gint64 i = 0; i < m; i++)
        ids[i] = all_ids[sift_selection_block (selection, (gsize) i)];
    }
  g_autofree const guint8 **p = g_new (const guint8 *, m);
  gboolean mapped = sift_store_map_many (e->store, ids != NULL ? ids : all_ids, (gsize) m, p);
  g_assert (mapped);
  for (gint64 i = 0; i < m; i++)
    {
      gint64 id = selection != NULL ? sift_selection_block (selection, (gsize) i) : i;
      SiftView k = sift_view_strided ((void *) p[i], e->config.compute_dtype, s->n_kv_heads, meta[id].n_valid, s->head_dim,
                                      (gint64) s->block_size * s->head_dim, s->head_dim);
      SiftView v = k;
      v.data = (void *) (p[i] + e->store->k_bytes);
      batch_add (e, b, &k, &v, block_heads (e, selection, id, flags));
    }
  SiftCounters add = { .bytes_loaded = (guint64) m * e->store->block_bytes,
                       .bytes_mapped = (guint64) m * e->store->block_bytes };
  sift_engine_count (e, layer, ctx->phase, &add);
  gboolean ok = batch_attend (e, ctx, b, lk, lv, out, lse, written, attended, error);
  *compute_us += g_get_monotonic_time () - t0;
  return ok;
}

/* Resident KV (resident.c): every selected block is read in place in its
 * copy in compute memory, all of them and the local tokens in one batch,
 * as attend_mapped does with the store's memory; nothing is loaded, so
 * nothing is counted as loaded. */
static gboolean
attend_resident (SiftEngine *e, const SiftPolicyContext *ctx, const SiftSelection *selection, gint64 m, SiftBatch *b,
                 const SiftView *lk, const SiftView *lv, SiftView *out, float *lse, gboolean *written,
                 guint64 *attended, gint64 *compute_us, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  gint64 t0 = g_get_monotonic_time ();
  g_autofree gboolean *flags = g_new (gboolean, s->n_q_heads);
  const gint64 *all_ids = (const gint64 *) (const void *) e->store_ids[ctx->layer]->data;
  const SiftBlockMeta *meta = (const SiftBlockMeta *) (const void *) e->meta[ctx->layer]->data;
  const SiftMemorySpace space = e->host_compute ? SIFT_MEMORY_HOST : SIFT_MEMORY_DEVICE;
  for (gint64 i = 0; i < m; i++)
    {
      gint64 id = selection != NULL ? sift_selection_block (selection, (gsize) i) : i;
      guint8 *p = sift_engine_resident_block (e, all_ids[id]);
      SiftView k = sift_view_strided (p, e->config.compute_dtype, s->n_kv_heads, meta[id].n_valid, s->head_dim,
                                      (gint64) s->block_size * s->head_dim, s->head_dim);
      k.space = space;
      SiftView v = k;
      v.data = p + (gsize) e->block_elems * e->es;
      batch_add (e, b, &k, &v, block_heads (e, selection, id, flags));
    }
  gboolean ok = batch_attend (e, ctx, b, lk, lv, out, lse, written, attended, error);
  *compute_us += g_get_monotonic_time () - t0;
  return ok;
}

/* ---- A per-kv-head selection on a GPU: kv heads packed into slots --------
 * Where each kv head's query group attends blocks of its own (Quest per kv
 * head), the ring loads only those heads' rows of a block but still gives
 * the block a whole slot: B blocks per kv head spread over up to
 * B x n_kv_heads slots, each group of them a load batch, a wait, an
 * attention launch and a merge. Packed, slot j holds for each kv head g
 * the j-th full block of g's selection (ascending ids), so B slots carry
 * the selection (a block of fewer tokens, as the prompt's last, takes a
 * slot of its own after them): when that fits the slots, one load batch,
 * one wait and one attention call (with the local tokens) for the layer.
 * Each kv head attends the same keys as through the ring; only their
 * order in the kernel's table differs. A backend that computes in host
 * memory keeps the ring (its results stay bit for bit what they were). */

typedef struct {
  gint64 n;             /* packed blocks */
  gint64 *first;        /* [n + 1]: packed block j loads pieces first[j] .. first[j + 1] - 1 */
  gint64 *piece_id;     /* [pieces] the logical block a piece loads from */
  guint64 *piece_heads; /* [pieces] the kv heads it loads (into the packed block's slot) */
  guint64 *heads;       /* [n] the kv heads present in packed block j */
  gint32 *n_valid;      /* [n] its tokens */
} Packing;

static void
packing_clear (Packing *pk)
{
  g_free (pk->first);
  g_free (pk->piece_id);
  g_free (pk->piece_heads);
  g_free (pk->heads);
  g_free (pk->n_valid);
}

/* Whether the selection (blocks ids[0..m), ascending; heads[i]: block i's
 * query heads, NULL: all) is per kv head and packs (see above) into fewer
 * slots than it has blocks; fills pk then. */
static gboolean
pack_selection (SiftEngine *e, const SiftPolicyContext *ctx, const gint64 *ids, const gboolean *const *heads, gint64 m,
                Packing *pk)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 nkv = s->n_kv_heads, G = s->n_q_heads / nkv;
  if (e->host_compute || e->backend->ops->attend_heads == NULL || nkv > 64 || m < 2)
    return FALSE;
  const SiftBlockMeta *meta = (const SiftBlockMeta *) (const void *) e->meta[ctx->layer]->data;
  g_autofree guint64 *kv = g_new (guint64, m); /* each block's kv heads */
  g_autofree gint64 *count = g_new0 (gint64, nkv);
  gint64 depth = 0, partial = 0;
  for (gint64 i = 0; i < m; i++)
    {
      kv[i] = 0;
      for (gint32 h = 0; h < s->n_q_heads; h++)
        {
          if (heads[i] != NULL && heads[i][h] != heads[i][h / G * G]) /* a query group split */
            return FALSE;
          if (heads[i] == NULL || heads[i][h])
            kv[i] |= G_GUINT64_CONSTANT (1) << (h / G);
        }
      if (meta[ids[i]].n_valid != s->block_size)
        {
          partial++;
          continue;
        }
      for (gint32 g = 0; g < nkv; g++)
        if ((kv[i] >> g) & 1)
          depth = MAX (depth, ++count[g]);
    }
  if (depth + partial >= m)
    return FALSE;
  pk->n = depth + partial;
  pk->first = g_new (gint64, pk->n + 1);
  pk->piece_id = g_new (gint64, (gsize) m * (gsize) nkv);
  pk->piece_heads = g_new (guint64, (gsize) m * (gsize) nkv);
  pk->heads = g_new0 (guint64, pk->n);
  pk->n_valid = g_new (gint32, pk->n);
  /* Each kv head's full blocks in order: list[g][j] is the j-th. */
  g_autofree gint64 *list = g_new (gint64, (gsize) nkv * (gsize) depth + 1);
  memset (count, 0, sizeof (gint64) * (gsize) nkv);
  for (gint64 i = 0; i < m; i++)
    for (gint32 g = 0; g < nkv && meta[ids[i]].n_valid == s->block_size; g++)
      if ((kv[i] >> g) & 1)
        list[(gsize) g * (gsize) depth + (gsize) count[g]++] = ids[i];
  gint64 np = 0;
  for (gint64 j = 0; j < depth; j++)
    {
      pk->first[j] = np;
      pk->n_valid[j] = s->block_size;
      for (gint32 g = 0; g < nkv; g++)
        {
          if (j >= count[g] || ((pk->heads[j] >> g) & 1))
            continue;
          const gint64 id = list[(gsize) g * (gsize) depth + (gsize) j];
          guint64 mask = 0; /* the kv heads whose j-th block is this one: one load */
          for (gint32 g2 = g; g2 < nkv; g2++)
            if (j < count[g2] && list[(gsize) g2 * (gsize) depth + (gsize) j] == id)
              mask |= G_GUINT64_CONSTANT (1) << g2;
          pk->heads[j] |= mask;
          pk->piece_id[np] = id;
          pk->piece_heads[np++] = mask;
        }
    }
  gint64 j = depth;
  for (gint64 i = 0; i < m; i++)
    if (meta[ids[i]].n_valid != s->block_size)
      {
        pk->first[j] = np;
        pk->n_valid[j] = meta[ids[i]].n_valid;
        pk->heads[j++] = kv[i];
        pk->piece_id[np] = ids[i];
        pk->piece_heads[np++] = kv[i];
      }
  pk->first[pk->n] = np;
  return TRUE;
}

/* Frees the slots of packed blocks [from, to) after a failure (their loads waited for). */
static void
packed_release (SiftEngine *e, gint64 from, gint64 to)
{
  const gint32 ns = e->config.n_slots;
  for (gint64 j = from; j < to; j++)
    {
      sift_engine_wait_slot (e, (gint32) (j % ns), NULL);
      sift_engine_slot_done (e, (gint32) (j % ns));
    }
}

/* Streams the packed blocks through the slots: all in one group when they
 * fit, else in ring groups with the loads up to n_slots ahead, as the
 * ring does. Packed block j goes to slot j mod n_slots. */
static gboolean
attend_packed (SiftEngine *e, const SiftPolicyContext *ctx, const Packing *pk, SiftBatch *b, const SiftView *lk,
               const SiftView *lv, SiftView *out, float *lse, gboolean *written, guint64 *attended,
               gint64 *compute_us, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  const gint32 G = s->n_q_heads / s->n_kv_heads, ns = e->config.n_slots;
  const gint64 P = pk->n;
  const gint64 group = P <= ns ? P : sift_engine_ring_group (e, ctx->n_q);
  g_autofree gint32 *piece_slots = g_new (gint32, (gsize) pk->first[P] + 1);
  g_autofree gint32 *slots = g_new (gint32, ns), *nv = g_new (gint32, ns);
  g_autofree gboolean *flags = g_new (gboolean, s->n_q_heads);
  for (gint64 j = 0; j < P; j++)
    for (gint64 p = pk->first[j]; p < pk->first[j + 1]; p++)
      piece_slots[p] = (gint32) (j % ns);
  gint64 queued = 0, done = 0;
  gboolean ok = TRUE;
  e->n_packed++;
  while (ok && done < P)
    {
      /* Loads into every free slot: packed blocks up to done + n_slots. */
      const gint64 to = MIN (P, done + ns), p0 = pk->first[queued], np = pk->first[to] - p0;
      if (np > 0
          && !sift_engine_ring_load (e, ctx->layer, pk->piece_id + p0, pk->piece_heads + p0, piece_slots + p0,
                                     (gint32) np, error))
        {
          packed_release (e, done, queued); /* ring_load checks before it takes a slot */
          return FALSE;
        }
      queued = to;
      const gint64 end = MIN (P, done + group);
      const gint32 n = (gint32) (end - done);
      for (gint32 i = 0; i < n; i++)
        slots[i] = (gint32) ((done + i) % ns);
      gint32 ready = 0;
      if (!sift_engine_ring_wait (e, slots, n, nv, &ready, error))
        {
          sift_engine_ring_done (e, slots, ready);
          packed_release (e, done + ready + 1, queued);
          return FALSE;
        }
      for (gint32 i = 0; i < n; i++)
        {
          SiftView k, v;
          const gint64 j = done + i;
          sift_engine_slots_kv (e, slots[i], pk->n_valid[j], &k, &v);
          gboolean all = TRUE;
          for (gint32 h = 0; h < s->n_q_heads; h++)
            {
              flags[h] = (pk->heads[j] >> (h / G)) & 1;
              all = all && flags[h];
            }
          batch_add (e, b, &k, &v, all ? NULL : flags);
        }
      gint64 t0 = g_get_monotonic_time ();
      const gboolean last = end == P;
      ok = batch_attend (e, ctx, b, last ? lk : NULL, last ? lv : NULL, out, lse, written, attended, error);
      *compute_us += g_get_monotonic_time () - t0;
      sift_engine_ring_done (e, slots, n);
      done = end;
    }
  if (!ok)
    packed_release (e, done, queued);
  return ok;
}

/* The ring: the selection streams through the slots in groups of G blocks
 * (sift_engine_ring_group: n_slots / 2 when a block's attention wakes the
 * kernels' threads, else as few as keep a call's fixed cost small); each
 * group is attended in one batch (the last with the local tokens) while
 * the copy worker loads the next ones into the slots the previous group
 * freed. The groups depend on the selection, the shape and n_slots only,
 * never on load timing: results are reproducible bit for bit. A per-kv-head
 * selection on a GPU goes through the slots packed instead (above). */
static gboolean
attend_ring (SiftEngine *e, const SiftPolicyContext *ctx, const SiftSelection *selection, gint64 m, SiftBatch *b,
             const SiftView *lk, const SiftView *lv, SiftView *out, float *lse, gboolean *written,
             guint64 *attended, gint64 *compute_us, GError **error)
{
  const gint32 nqh = e->config.shape.n_q_heads;
  g_autofree gint64 *ids = g_new (gint64, MAX (m, 1));
  /* Each block's query heads (looked up once), and the kv heads to load:
   * a block only some kv heads' query groups selected loads those heads. */
  g_autofree gboolean *flags = selection != NULL ? g_new (gboolean, (gsize) MAX (m, 1) * (gsize) nqh) : NULL;
  g_autofree const gboolean **heads = g_new0 (const gboolean *, MAX (m, 1));
  g_autofree guint64 *kv_heads = selection != NULL ? g_new (guint64, MAX (m, 1)) : NULL;
  for (gint64 i = 0; i < m; i++)
    {
      ids[i] = selection != NULL ? sift_selection_block (selection, (gsize) i) : i;
      if (selection == NULL)
        continue;
      heads[i] = block_heads_at (e, selection, (gsize) i, flags + (gsize) i * (gsize) nqh);
      kv_heads[i] = block_kv_heads (e, heads[i]);
    }
  Packing pk;
  if (selection != NULL && pack_selection (e, ctx, ids, heads, m, &pk))
    {
      gboolean ok = attend_packed (e, ctx, &pk, b, lk, lv, out, lse, written, attended, compute_us, error);
      packing_clear (&pk);
      return ok;
    }
  const gsize G = (gsize) sift_engine_ring_group (e, ctx->n_q);
  g_autofree SiftStreamBlock *blocks = g_new (SiftStreamBlock, G);
  SiftStream *stream = sift_engine_stream_begin_ring (e, ctx->layer, ids, kv_heads, (gsize) m);
  /* Prefetch across calls (ring.c): a decode call over every block loads,
   * after its last load, the first blocks of the next layer (the next
   * step's first layer after the last) when that layer's last call was
   * such a call too. */
  const gint32 L = e->config.shape.n_layers, next = (ctx->layer + 1) % L;
  e->ring_all[ctx->layer] = e->prefetch && selection == NULL && ctx->phase == SIFT_PHASE_DECODE;
  if (e->ring_all[ctx->layer] && e->ring_all[next])
    sift_engine_stream_prefetch (stream, next);
  gboolean ok = TRUE;
  gsize n;
  while (ok && (n = sift_engine_stream_next (stream, blocks, G, error)) > 0)
    {
      for (gsize i = 0; i < n; i++)
        batch_add (e, b, &blocks[i].k, &blocks[i].v, heads[blocks[i].index]);
      gint64 t0 = g_get_monotonic_time ();
      const gboolean last = (gint64) blocks[n - 1].index == m - 1;
      ok = batch_attend (e, ctx, b, last ? lk : NULL, last ? lv : NULL, out, lse, written, attended, error);
      *compute_us += g_get_monotonic_time () - t0;
    }
  if (!ok)
    sift_engine_stream_prefetch (stream, -1);
  if (!sift_engine_stream_end (stream) || !ok)
    return FALSE;
  if (m > 0)
    return TRUE;
  gint64 t0 = g_get_monotonic_time ();
  ok = batch_attend (e, ctx, b, lk, lv, out, lse, written, attended, error);
  *compute_us += g_get_monotonic_time () - t0;
  return ok;
}

/* The default attention over a validated selection (NULL: every block). */
static gboolean
attend (SiftEngine *e, const SiftPolicyContext *ctx, const SiftSelection *selection, SiftView *out, float *lse,
        GError **error)
{
  e->phase = ctx->phase;
  const gint64 m = selection != NULL ? (gint64) sift_selection_n_blocks (selection)
                                     : (gint64) e->store_ids[ctx->layer]->len;
  g_autofree gboolean *written = g_new0 (gboolean, e->config.shape.n_q_heads);
  guint64 attended = 0;
  gint64 compute_us = 0, t0 = g_get_monotonic_time ();
  clear_out (out, lse, ctx->n_q);
  compute_us += g_get_monotonic_time () - t0;
  DeviceCall dc;
  SiftView *cout = out;
  float *clse = lse;
  if (!e->host_compute)
    {
      device_begin (e, ctx, &dc);
      ctx = &dc.ctx;
      cout = &dc.out;
      clse = e->call_lse;
    }
  SiftView lk, lv;
  sift_engine_local_kv (e, ctx, &lk, &lv);
  SiftBatch *b = batch_get (e);
  batch_clear (b);
  gboolean ok;
  e->ring_all[ctx->layer] = FALSE; /* attend_ring sets it */
  if (e->resident && m > 0)
    ok = attend_resident (e, ctx, selection, m, b, &lk, &lv, cout, clse, written, &attended, &compute_us, error);
  else if (e->maps && m > 0)
    ok = attend_mapped (e, ctx, selection, m, b, &lk, &lv, cout, clse, written, &attended, &compute_us, error);
  else
    ok = attend_ring (e, ctx, selection, m, b, &lk, &lv, cout, clse, written, &attended, &compute_us, error);
  if (ok && !e->host_compute)
    ok = device_end (e, &dc, out, lse, written, error);
  if (ok)
    count_compute (e, ctx, g_get_monotonic_time () - compute_us, attended);
  return ok;
}

gboolean
sift_engine_attend_default (SiftEngine *e, const SiftPolicyContext *ctx, const SiftSelection *selection,
                            SiftView *out, float *lse, GError **error)
{
  g_return_val_if_fail (e != NULL && ctx != NULL, FALSE);
  return check_call (e, ctx, out, lse, error) && (selection == NULL || validate (e, ctx, selection, error))
         && attend (e, ctx, selection, out, lse, error);
}

gboolean
sift_engine_attend_validated (SiftEngine *e, const SiftPolicyContext *ctx, const SiftSelection *selection,
                              SiftView *out, float *lse, GError **error)
{
  return check_call (e, ctx, out, lse, error) && attend (e, ctx, selection, out, lse, error);
}

gboolean
sift_engine_attend_loaded (SiftEngine *e, const SiftPolicyContext *ctx, const SiftSelection *sel,
                           const SiftSelection *loaded, const SiftView *k, const SiftView *v, gsize n_blocks,
                           SiftView *out, float *lse, GError **error)
{
  if (!check_call (e, ctx, out, lse, error))
    return FALSE;
  const gint32 bs = e->config.shape.block_size;
  g_autofree gboolean *flags = g_new (gboolean, e->config.shape.n_q_heads);
  g_autofree gboolean *written = g_new0 (gboolean, e->config.shape.n_q_heads);
  guint64 attended = 0;
  gint64 t0 = g_get_monotonic_time ();
  clear_out (out, lse, ctx->n_q);
  DeviceCall dc;
  SiftView *cout = out;
  float *clse = lse;
  if (!e->host_compute)
    {
      device_begin (e, ctx, &dc);
      ctx = &dc.ctx;
      cout = &dc.out;
      clse = e->call_lse;
    }
  /* The blocks lie side by side: each one a view, all in one batch with
   * the local tokens. */
  SiftBatch *b = batch_get (e);
  batch_clear (b);
  for (gsize i = 0; i < n_blocks; i++)
    {
      gint64 id = loaded != NULL ? sift_selection_block (loaded, i) : (gint64) i;
      const gboolean *heads = block_heads (e, sel, id, flags);
      if (heads != NULL && !any_head (heads, e->config.shape.n_q_heads))
        continue; /* loaded ahead, not selected */
      gint64 nv = g_array_index (e->meta[ctx->layer], SiftBlockMeta, id).n_valid;
      SiftView kr = sift_view_tokens (k, (gint64) i * bs, nv), vr = sift_view_tokens (v, (gint64) i * bs, nv);
      batch_add (e, b, &kr, &vr, heads);
    }
  SiftView lk, lv;
  sift_engine_local_kv (e, ctx, &lk, &lv);
  gboolean ok = batch_attend (e, ctx, b, &lk, &lv, cout, clse, written, &attended, error);
  if (ok && !e->host_compute)
    ok = device_end (e, &dc, out, lse, written, error);
  count_compute (e, ctx, t0, attended);
  return ok;
}
