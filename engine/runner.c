/* The layerwise runner: chunked prefill and decode over every layer. For
 * each layer and call: q, k, v from the model source; k, v into the engine's
 * local buffer; the policy's select_blocks (validated); its compute or the
 * engine's default attention; the observer; then the offload of full blocks
 * (the policy's offload hook first). After any error the run stops until
 * sift_runner_reset. */
#include <math.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>
#include <sift/runner.h>

#include "engine-private.h"

struct _SiftRunner {
  SiftEngine *engine;
  SiftModelSource *source;
  SiftPolicy **prefill;       /* [n_layers], NULL entries: dense */
  SiftPolicy **decode;        /* [n_layers] */
  SiftRunnerObserver observer;
  gpointer user_data;
  gint64 position;            /* tokens processed */
  gint64 n_chunks;            /* of the prefill */
  gint64 decode_steps;
  gboolean failed;
  /* One layer's call: q [max_q][n_q_heads][head_dim], k and v [max_q][n_kv_heads][head_dim]. */
  float *q, *k, *v;
  float *out;                 /* [n_q_heads][max_q][head_dim] */
  float *lse;                 /* [n_q_heads][max_q] */
  SiftSelection **sel;        /* [n_layers] */
  SiftSelection *empty;       /* validated, no blocks */
  gint64 *available;          /* [capacity] 0, 1, 2, ... */
  gsize n_available_cap;
};

static const char *
policy_name (SiftPolicy *p)
{
  return p != NULL ? p->ops->name : "dense";
}

static gboolean
check_policy (SiftPolicy *p, SiftPhase phase, gint32 layer, GError **error)
{
  if (p == NULL)
    return TRUE;
  guint32 need = phase == SIFT_PHASE_PREFILL ? SIFT_POLICY_SUPPORTS_PREFILL : SIFT_POLICY_SUPPORTS_DECODE;
  const char *ph = phase == SIFT_PHASE_PREFILL ? "prefill" : "decode";
  if ((p->ops->flags & need) == 0)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID,
                   "runner: policy '%s' is placed in layer %d's %s but does not support %s", p->ops->name, layer, ph,
                   ph);
      return FALSE;
    }
  if ((p->ops->flags & SIFT_POLICY_REQUIRES_BLOCK_SELECTION) && p->ops->select_blocks == NULL)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID,
                   "runner: policy '%s' requires block selection but has no select_blocks", p->ops->name);
      return FALSE;
    }
  return TRUE;
}

SiftRunner *
sift_runner_new (SiftEngine *engine, SiftModelSource *source, SiftPolicy *const *prefill,
                 SiftPolicy *const *decode, GError **error)
{
  g_return_val_if_fail (engine != NULL && source != NULL, NULL);
  const SiftModelShape *s = &engine->config.shape, *m = &source->shape;
  if (m->n_layers != s->n_layers || m->n_q_heads != s->n_q_heads || m->n_kv_heads != s->n_kv_heads
      || m->head_dim != s->head_dim)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID,
                   "runner: the %s source yields %d layers x %d/%d heads x %d dim, the engine holds %d x %d/%d x %d",
                   source->klass->name, m->n_layers, m->n_q_heads, m->n_kv_heads, m->head_dim, s->n_layers,
                   s->n_q_heads, s->n_kv_heads, s->head_dim);
      return NULL;
    }
  const gint32 L = s->n_layers;
  for (gint32 l = 0; l < L; l++)
    if (!check_policy (prefill ? prefill[l] : NULL, SIFT_PHASE_PREFILL, l, error)
        || !check_policy (decode ? decode[l] : NULL, SIFT_PHASE_DECODE, l, error))
      return NULL;
  SiftRunner *r = g_new0 (SiftRunner, 1);
  r->engine = engine;
  r->source = source;
  r->prefill = g_new0 (SiftPolicy *, (guint) L);
  r->decode = g_new0 (SiftPolicy *, (guint) L);
  for (gint32 l = 0; l < L; l++)
    {
      r->prefill[l] = prefill ? prefill[l] : NULL;
      r->decode[l] = decode ? decode[l] : NULL;
    }
  const gint64 max_q = engine->max_q;
  /* Cross-layer decode keeps every layer's rows of a step. */
  const gint64 rows = MAX (max_q, (gint64) L * SIFT_ATTN_DECODE_MAX_ROWS);
  r->q = g_new0 (float, (gsize) (rows * s->n_q_heads * s->head_dim));
  r->k = g_new0 (float, (gsize) (rows * s->n_kv_heads * s->head_dim));
  r->v = g_new0 (float, (gsize) (rows * s->n_kv_heads * s->head_dim));
  r->out = g_new0 (float, (gsize) (max_q * s->n_q_heads * s->head_dim));
  r->lse = g_new0 (float, (gsize) (max_q * s->n_q_heads));
  r->sel = g_new0 (SiftSelection *, (guint) L);
  for (gint32 l = 0; l < L; l++)
    r->sel[l] = sift_selection_new (s->n_q_heads, s->n_kv_heads);
  for (gint32 l = 0; l < L; l++)
    {
      guint32 f = (r->prefill[l] ? r->prefill[l]->ops->flags : 0) | (r->decode[l] ? r->decode[l]->ops->flags : 0);
      sift_engine_track_attention (engine, l, (f & SIFT_POLICY_WANTS_ACCUMULATED_ATTENTION) != 0);
    }
  r->empty = sift_selection_new (s->n_q_heads, s->n_kv_heads);
  sift_selection_validate (r->empty, NULL, 0, "runner", NULL);
  return r;
}

void
sift_runner_free (SiftRunner *r)
{
  if (r == NULL)
    return;
  for (gint32 l = 0; l < r->engine->config.shape.n_layers; l++)
    sift_selection_free (r->sel[l]);
  sift_selection_free (r->empty);
  g_free (r->sel);
  g_free (r->prefill);
  g_free (r->decode);
  g_free (r->q);
  g_free (r->k);
  g_free (r->v);
  g_free (r->out);
  g_free (r->lse);
  g_free (r->available);
  g_free (r);
}

void
sift_runner_set_observer (SiftRunner *r, const SiftRunnerObserver *observer, gpointer user_data)
{
  g_return_if_fail (r != NULL);
  if (observer != NULL)
    r->observer = *observer;
  else
    memset (&r->observer, 0, sizeof r->observer);
  r->user_data = user_data;
}

gint64
sift_runner_position (const SiftRunner *r)
{
  g_return_val_if_fail (r != NULL, 0);
  return r->position;
}

void
sift_runner_reset (SiftRunner *r)
{
  g_return_if_fail (r != NULL);
  sift_engine_reset (r->engine);
  for (gint32 l = 0; l < r->engine->config.shape.n_layers; l++)
    {
      if (r->prefill[l] != NULL)
        sift_policy_reset (r->prefill[l]);
      if (r->decode[l] != NULL && r->decode[l] != r->prefill[l])
        sift_policy_reset (r->decode[l]);
    }
  r->position = r->n_chunks = r->decode_steps = 0;
  r->failed = FALSE;
}

static const gint64 *
available_ids (SiftRunner *r, gint64 n)
{
  if ((gsize) n > r->n_available_cap)
    {
      r->n_available_cap = MAX ((gsize) n, r->n_available_cap * 2);
      r->available = g_renew (gint64, r->available, r->n_available_cap);
      for (gsize i = 0; i < r->n_available_cap; i++)
        r->available[i] = (gint64) i;
    }
  return r->available;
}

/* Runs select_blocks for a prepared context; *sel_out is NULL when the
 * layer's policy selects nothing (dense over every block). */
static gboolean
select_for (SiftRunner *r, SiftPolicy *p, const SiftPolicyContext *ctx, SiftSelection **sel_out, GError **error)
{
  *sel_out = NULL;
  if (p == NULL || (p->ops->flags & SIFT_POLICY_REQUIRES_BLOCK_SELECTION) == 0)
    {
      sift_engine_count_call (r->engine, ctx, (gsize) ctx->n_blocks, (gsize) ctx->n_blocks);
      return TRUE;
    }
  SiftSelection *sel = r->sel[ctx->layer];
  sift_selection_clear (sel);
  const gint64 *avail = available_ids (r, ctx->n_blocks);
  GError *local = NULL;
  if (!p->ops->select_blocks (p, ctx, avail, (gsize) ctx->n_blocks, sel, &local))
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY, "policy '%s': select_blocks failed: %s",
                   p->ops->name, local ? local->message : "(no message)");
      g_clear_error (&local);
      return FALSE;
    }
  if (!sift_selection_validate (sel, avail, (gsize) ctx->n_blocks, p->ops->name, error))
    return FALSE;
  if (r->observer.selection != NULL)
    r->observer.selection (r->user_data, ctx, sel);
  sift_engine_count_call (r->engine, ctx, (gsize) ctx->n_blocks, sift_selection_n_blocks (sel));
  *sel_out = sel;
  return TRUE;
}

static gboolean
policy_compute (SiftPolicy *p, const SiftPolicyContext *ctx, SiftView *out, float *lse, GError **error)
{
  gboolean (*fn) (SiftPolicy *, const SiftPolicyContext *, SiftView *, float *, GError **)
    = ctx->phase == SIFT_PHASE_PREFILL ? p->ops->compute_chunked_prefill : p->ops->compute_chunked_decode;
  GError *local = NULL;
  if (fn (p, ctx, out, lse, &local))
    return TRUE;
  if (local != NULL && local->domain != SIFT_ENGINE_ERROR && local->domain != SIFT_STORE_ERROR)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY, "policy '%s': %s failed: %s", p->ops->name,
                   ctx->phase == SIFT_PHASE_PREFILL ? "compute_chunked_prefill" : "compute_chunked_decode",
                   local->message);
      g_clear_error (&local);
      return FALSE;
    }
  if (local == NULL)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY, "policy '%s': compute failed (no message)",
                   p->ops->name);
      return FALSE;
    }
  g_propagate_prefixed_error (error, local, "policy '%s': ", p->ops->name);
  return FALSE;
}

static gboolean
has_compute (SiftPolicy *p, SiftPhase phase)
{
  return p != NULL
         && (phase == SIFT_PHASE_PREFILL ? p->ops->compute_chunked_prefill : p->ops->compute_chunked_decode) != NULL;
}

/* Builds layer l's context for rows q (token-major) at pos0. */
static void
make_context (SiftRunner *r, SiftPolicyContext *ctx, SiftPhase phase, gint32 l, gint64 pos0, gint64 n,
              float *q)
{
  const SiftModelShape *s = &r->engine->config.shape;
  memset (ctx, 0, sizeof *ctx);
  ctx->phase = phase;
  ctx->chunk_index = phase == SIFT_PHASE_PREFILL ? pos0 / s->chunk_size : r->decode_steps;
  ctx->n_chunks = phase == SIFT_PHASE_PREFILL ? r->n_chunks : 0;
  ctx->q_pos = pos0;
  ctx->n_q = (gint32) n;
  ctx->q = sift_view_thd (q, SIFT_DTYPE_F32, n, s->n_q_heads, s->head_dim);
  sift_engine_fill_context (r->engine, ctx, l);
}

/* After a layer's attention: the observer, H2O accumulation (tracked
 * layers), the offload, then eviction down to capacity (docs/eviction.md). */
static gboolean
finish_layer (SiftRunner *r, const SiftPolicyContext *ctx, SiftView *out, GError **error)
{
  if (r->observer.attention != NULL)
    r->observer.attention (r->user_data, ctx, out, r->lse);
  const gint32 l = ctx->layer;
  SiftPolicy *p = ctx->phase == SIFT_PHASE_PREFILL ? r->prefill[l] : r->decode[l];
  const SiftLayerPolicies layer = { r->prefill[l], r->decode[l] };
  return sift_engine_accumulate (r->engine, ctx, r->lse, error)
         && (ctx->phase == SIFT_PHASE_PREFILL ? sift_engine_offload_prefill (r->engine, ctx, &layer, error)
                                              : sift_engine_offload_decode (r->engine, ctx, &layer, error))
         && sift_engine_evict (r->engine, ctx, p, r->prefill[l], r->decode[l], error);
}

/* One layer of one prefill chunk or (ring) decode step. */
static gboolean
run_layer (SiftRunner *r, SiftPhase phase, gint32 l, gint64 pos0, gint64 n, GError **error)
{
  SiftEngine *e = r->engine;
  const SiftModelShape *s = &e->config.shape;
  SiftPolicy *p = phase == SIFT_PHASE_PREFILL ? r->prefill[l] : r->decode[l];
  if (!sift_model_source_qkv (r->source, l, pos0, n, r->q, r->k, r->v, error))
    return FALSE;
  gboolean ok = phase == SIFT_PHASE_PREFILL ? sift_engine_put_prefill (e, l, pos0, n, r->k, r->v, error)
                                            : sift_engine_put_decode (e, l, pos0, n, r->k, r->v, error);
  if (!ok)
    return FALSE;
  SiftPolicyContext ctx;
  make_context (r, &ctx, phase, l, pos0, n, r->q);
  sift_engine_begin_call (e, phase, policy_name (p));
  SiftSelection *sel;
  if (!select_for (r, p, &ctx, &sel, error))
    return FALSE;
  SiftView out = sift_view_htd (r->out, SIFT_DTYPE_F32, s->n_q_heads, n, s->head_dim);
  ok = has_compute (p, phase) ? policy_compute (p, &ctx, &out, r->lse, error)
                              : sift_engine_attend_validated (e, &ctx, sel, &out, r->lse, error);
  return ok && finish_layer (r, &ctx, &out, error);
}

static gboolean
stopped (SiftRunner *r, GError **error)
{
  if (!r->failed)
    return FALSE;
  g_set_error_literal (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                       "runner: a previous call failed; reset before running again");
  return TRUE;
}

gboolean
sift_runner_prefill (SiftRunner *r, gint64 n_tokens, GError **error)
{
  g_return_val_if_fail (r != NULL, FALSE);
  if (stopped (r, error))
    return FALSE;
  if (r->position != 0)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "runner: prefill runs once per sequence (%" G_GINT64_FORMAT " tokens already processed)",
                   r->position);
      return FALSE;
    }
  if (n_tokens <= 0)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID,
                   "runner: prefill of %" G_GINT64_FORMAT " tokens", n_tokens);
      return FALSE;
    }
  const SiftModelShape *s = &r->engine->config.shape;
  r->n_chunks = (n_tokens + s->chunk_size - 1) / s->chunk_size;
  for (gint64 pos = 0; pos < n_tokens; pos += s->chunk_size)
    for (gint32 l = 0; l < s->n_layers; l++)
      if (!run_layer (r, SIFT_PHASE_PREFILL, l, pos, MIN (s->chunk_size, n_tokens - pos), error))
        {
          r->failed = TRUE;
          return FALSE;
        }
  if (!sift_engine_sync (r->engine, error))
    {
      r->failed = TRUE;
      return FALSE;
    }
  r->position = n_tokens;
  return TRUE;
}

/* A decode step through the cross-layer pipeline: every layer's rows and
 * selection first, then layer l + 1's blocks load while layer l computes. */
static gboolean
decode_cross_layer (SiftRunner *r, gint64 pos0, gint64 n, GError **error)
{
  SiftEngine *e = r->engine;
  const SiftModelShape *s = &e->config.shape;
  const gint32 L = s->n_layers;
  const gsize qrow = (gsize) s->n_q_heads * (gsize) s->head_dim, krow = (gsize) s->n_kv_heads * (gsize) s->head_dim;
  g_autofree SiftPolicyContext *ctx = g_new0 (SiftPolicyContext, (guint) L);
  g_autofree SiftSelection **sel = g_new0 (SiftSelection *, (guint) L);  /* for attention (NULL: all) */
  g_autofree SiftSelection **load = g_new0 (SiftSelection *, (guint) L); /* for the pipeline */
  for (gint32 l = 0; l < L; l++)
    {
      float *q = r->q + (gsize) l * SIFT_ATTN_DECODE_MAX_ROWS * qrow;
      float *k = r->k + (gsize) l * SIFT_ATTN_DECODE_MAX_ROWS * krow;
      float *v = r->v + (gsize) l * SIFT_ATTN_DECODE_MAX_ROWS * krow;
      if (!sift_model_source_qkv (r->source, l, pos0, n, q, k, v, error)
          || !sift_engine_put_decode (e, l, pos0, n, k, v, error))
        return FALSE;
      make_context (r, &ctx[l], SIFT_PHASE_DECODE, l, pos0, n, q);
      sift_engine_begin_call (e, SIFT_PHASE_DECODE, policy_name (r->decode[l]));
      if (!select_for (r, r->decode[l], &ctx[l], &sel[l], error))
        return FALSE;
      /* A policy with its own compute loads what it wants itself. */
      load[l] = has_compute (r->decode[l], SIFT_PHASE_DECODE) ? r->empty : sel[l];
    }
  if (!sift_engine_pipeline_start (e, load[0], error))
    return FALSE;
  gboolean ok = TRUE;
  for (gint32 l = 0; l < L && ok; l++)
    {
      SiftPolicy *p = r->decode[l];
      SiftView k, v, out = sift_view_htd (r->out, SIFT_DTYPE_F32, s->n_q_heads, n, s->head_dim);
      gsize nb = 0;
      sift_engine_begin_call (e, SIFT_PHASE_DECODE, policy_name (p));
      ok = sift_engine_pipeline_get (e, l, l + 1 < L ? load[l + 1] : NULL, &k, &v, &nb, error);
      if (ok)
        ok = has_compute (p, SIFT_PHASE_DECODE)
               ? policy_compute (p, &ctx[l], &out, r->lse, error)
               : sift_engine_attend_loaded (e, &ctx[l], sel[l], &k, &v, nb, &out, r->lse, error);
      ok = ok && finish_layer (r, &ctx[l], &out, error);
    }
  sift_engine_pipeline_end (e);
  return ok;
}

gboolean
sift_runner_decode (SiftRunner *r, gint32 n_rows, GError **error)
{
  g_return_val_if_fail (r != NULL, FALSE);
  if (stopped (r, error))
    return FALSE;
  if (r->position == 0)
    {
      g_set_error_literal (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE, "runner: decode before prefill");
      return FALSE;
    }
  if (n_rows < 1 || n_rows > SIFT_ATTN_DECODE_MAX_ROWS)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID, "runner: %d decode rows (1..%d)", n_rows,
                   SIFT_ATTN_DECODE_MAX_ROWS);
      return FALSE;
    }
  const SiftModelShape *s = &r->engine->config.shape;
  gboolean ok = TRUE;
  /* Resident blocks (zero-copy) need no prefetch: layer by layer. */
  if (r->engine->config.pipeline == SIFT_PIPELINE_CROSS_LAYER && !sift_engine_maps (r->engine))
    ok = decode_cross_layer (r, r->position, n_rows, error);
  else
    for (gint32 l = 0; l < s->n_layers && ok; l++)
      ok = run_layer (r, SIFT_PHASE_DECODE, l, r->position, n_rows, error);
  ok = ok && sift_engine_sync (r->engine, error);
  if (!ok)
    {
      r->failed = TRUE;
      return FALSE;
    }
  r->position += n_rows;
  r->decode_steps++;
  return TRUE;
}
