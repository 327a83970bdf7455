/* The layerwise runner: chunked prefill and decode over every layer,
 * driving the model through protocol v2 (begin, then per layer qkv and
 * attended, then end). For each layer and call: q, k, v from the model; k, v
 * into the engine's local buffer; the policy's select_blocks (validated);
 * its compute or the engine's default attention; the output back to the
 * model; the observer; then the offload of full blocks (the policy's
 * offload hook first). After any error the run stops until
 * sift_runner_reset. */
#include <math.h>
#include <string.h>

#include <sift/attn.h>
#include <sift/error.h>
#include <sift/memory.h>
#include <sift/runner.h>

#include "engine-private.h"

struct _SiftRunner {
  SiftEngine *engine;
  SiftModel *model;
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
  float *out_tm;              /* the same, token-major [max_q][n_q_heads][head_dim], for the model */
  float *lse;                 /* [n_q_heads][max_q] */
  gint64 scratch_rows;        /* rows the last step used of q ... lse (sift_mem_map0'd) */
  SiftSelection **sel;        /* [n_layers] */
  /* Cross-layer decode: what is prefetched for a layer before its query
   * exists (the blocks it chose at the previous step). */
  SiftSelection **guess;      /* [n_layers] */
  gboolean *have_prev;        /* [n_layers]: sel[l] holds the previous decode step's selection */
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
check_policy (SiftEngine *e, SiftPolicy *p, SiftPhase phase, gint32 layer, GError **error)
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
  /* A policy's own compute reads and writes host views; on another device
   * only the default pipeline runs (docs/abi.md, "A GPU compute method"). */
  const gboolean own = phase == SIFT_PHASE_PREFILL ? p->ops->compute_chunked_prefill != NULL
                                                   : p->ops->compute_chunked_decode != NULL;
  if (own && e->config.device != SIFT_DEVICE_CPU)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID,
                   "runner: policy '%s' (layer %d's %s) computes its own attention (compute_chunked_%s) on the "
                   "CPU; offload.device %s runs only policies that select blocks (full, quest, h2o, ...): "
                   "use offload.device cpu for it",
                   p->ops->name, layer, ph, ph, sift_device_name (e->config.device));
      return FALSE;
    }
  return TRUE;
}

/* The per-step scratch, rows of `per` floats, max_q rows each. */
#define SCRATCH_BUFS 6

static void
scratch_layout (SiftRunner *r, const SiftModelShape *s, float **bufs[SCRATCH_BUFS], gint64 per[SCRATCH_BUFS])
{
  const gint64 q = (gint64) s->n_q_heads * s->head_dim, kv = (gint64) s->n_kv_heads * s->head_dim;
  float **b[SCRATCH_BUFS] = { &r->q, &r->k, &r->v, &r->out, &r->out_tm, &r->lse };
  const gint64 p[SCRATCH_BUFS] = { q, kv, kv, q, q, s->n_q_heads };
  memcpy (bufs, b, sizeof b);
  memcpy (per, p, sizeof p);
}

/* Before a step of n rows: the rows past n that a larger step touched go
 * back to the kernel (every step writes its rows before reading them), so
 * decode does not keep a prefill chunk's scratch resident. */
static void
fit_scratch (SiftRunner *r, gint64 n)
{
  if (n < r->scratch_rows)
    {
      float **bufs[SCRATCH_BUFS];
      gint64 per[SCRATCH_BUFS];
      scratch_layout (r, &r->engine->config.shape, bufs, per);
      for (int i = 0; i < SCRATCH_BUFS; i++)
        sift_mem_discard (*bufs[i] + n * per[i], sizeof (float) * (gsize) ((r->scratch_rows - n) * per[i]));
    }
  r->scratch_rows = n;
}

SiftRunner *
sift_runner_new (SiftEngine *engine, SiftModel *model, SiftPolicy *const *prefill,
                 SiftPolicy *const *decode, GError **error)
{
  g_return_val_if_fail (engine != NULL && model != NULL, NULL);
  const SiftModelShape *s = &engine->config.shape, *m = &model->shape;
  if (m->n_layers != s->n_layers || m->n_q_heads != s->n_q_heads || m->n_kv_heads != s->n_kv_heads
      || m->head_dim != s->head_dim)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID,
                   "runner: the %s model yields %d layers x %d/%d heads x %d dim, the engine holds %d x %d/%d x %d",
                   model->klass->name, m->n_layers, m->n_q_heads, m->n_kv_heads, m->head_dim, s->n_layers,
                   s->n_q_heads, s->n_kv_heads, s->head_dim);
      return NULL;
    }
  const gint32 L = s->n_layers;
  for (gint32 l = 0; l < L; l++)
    if (!check_policy (engine, prefill ? prefill[l] : NULL, SIFT_PHASE_PREFILL, l, error)
        || !check_policy (engine, decode ? decode[l] : NULL, SIFT_PHASE_DECODE, l, error))
      return NULL;
  SiftRunner *r = g_new0 (SiftRunner, 1);
  r->engine = engine;
  r->model = model;
  r->prefill = g_new0 (SiftPolicy *, (guint) L);
  r->decode = g_new0 (SiftPolicy *, (guint) L);
  for (gint32 l = 0; l < L; l++)
    {
      r->prefill[l] = prefill ? prefill[l] : NULL;
      r->decode[l] = decode ? decode[l] : NULL;
    }
  float **bufs[SCRATCH_BUFS];
  gint64 per[SCRATCH_BUFS];
  scratch_layout (r, s, bufs, per);
  for (int i = 0; i < SCRATCH_BUFS; i++)
    if ((*bufs[i] = sift_mem_map0 (sizeof (float) * (gsize) (engine->max_q * per[i]))) == NULL)
      g_error ("runner: out of memory (%" G_GINT64_FORMAT " floats)", engine->max_q * per[i]);
  r->sel = g_new0 (SiftSelection *, (guint) L);
  r->guess = g_new0 (SiftSelection *, (guint) L);
  r->have_prev = g_new0 (gboolean, (guint) L);
  for (gint32 l = 0; l < L; l++)
    {
      r->sel[l] = sift_selection_new (s->n_q_heads, s->n_kv_heads);
      r->guess[l] = sift_selection_new (s->n_q_heads, s->n_kv_heads);
    }
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
    {
      sift_selection_free (r->sel[l]);
      sift_selection_free (r->guess[l]);
    }
  sift_selection_free (r->empty);
  g_free (r->sel);
  g_free (r->guess);
  g_free (r->have_prev);
  g_free (r->prefill);
  g_free (r->decode);
  float **bufs[SCRATCH_BUFS];
  gint64 per[SCRATCH_BUFS];
  scratch_layout (r, &r->engine->config.shape, bufs, per);
  for (int i = 0; i < SCRATCH_BUFS; i++)
    sift_mem_unmap (*bufs[i], sizeof (float) * (gsize) (r->engine->max_q * per[i]));
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
  memset (r->have_prev, 0, sizeof (gboolean) * (gsize) r->engine->config.shape.n_layers);
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

/* After a layer's attention: the output to the model (token-major), the
 * observer, H2O accumulation (tracked layers), the offload, then eviction
 * down to capacity (docs/eviction.md). */
static gboolean
finish_layer (SiftRunner *r, const SiftPolicyContext *ctx, SiftView *out, GError **error)
{
  SiftView tm = sift_view_thd (r->out_tm, SIFT_DTYPE_F32, ctx->n_q, out->n_heads, out->head_dim);
  for (gint32 h = 0; h < out->n_heads; h++)
    for (gint64 t = 0; t < ctx->n_q; t++)
      memcpy (sift_view_row (&tm, h, t), sift_view_row (out, h, t), sizeof (float) * (gsize) out->head_dim);
  if (!sift_model_attended (r->model, ctx->layer, r->out_tm, error))
    return FALSE;
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
  if (!sift_model_qkv (r->model, l, r->q, r->k, r->v, error))
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

static gboolean decode_cross_layer (SiftRunner *r, gint64 pos0, gint64 n, GError **error);

/* One step of the model: begin, every layer (each layer's qkv inside
 * run_layer or the cross-layer loop), end. */
static gboolean
run_step (SiftRunner *r, SiftPhase phase, gint64 pos0, gint64 n, const gint32 *tokens, float *logits,
          GError **error)
{
  const gint32 L = r->engine->config.shape.n_layers;
  fit_scratch (r, n);
  if (!sift_model_begin (r->model, pos0, n, tokens, error))
    return FALSE;
  gboolean ok = TRUE;
  /* Resident blocks (zero-copy) need no prefetch: layer by layer. */
  if (phase == SIFT_PHASE_DECODE && r->engine->config.pipeline == SIFT_PIPELINE_CROSS_LAYER
      && !sift_engine_maps (r->engine) && !r->engine->resident)
    ok = decode_cross_layer (r, pos0, n, error);
  else
    for (gint32 l = 0; l < L && ok; l++)
      ok = run_layer (r, phase, l, pos0, n, error);
  return ok && sift_model_end (r->model, logits, error);
}

gboolean
sift_runner_prefill (SiftRunner *r, gint64 n_tokens, const gint32 *tokens, float *logits, GError **error)
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
    {
      gint64 n = MIN (s->chunk_size, n_tokens - pos);
      /* Logits only of the prompt's last token. */
      if (!run_step (r, SIFT_PHASE_PREFILL, pos, n, tokens != NULL ? tokens + pos : NULL,
                     pos + n == n_tokens ? logits : NULL, error))
        {
          r->failed = TRUE;
          return FALSE;
        }
    }
  if (!sift_engine_sync (r->engine, error))
    {
      r->failed = TRUE;
      return FALSE;
    }
  r->position = n_tokens;
  return TRUE;
}

/* What the cross-layer pipeline loads for layer l before its query exists:
 * nothing for a policy with its own compute (it loads what it wants), every
 * block for a layer that selects nothing, and for a selecting layer the
 * blocks it chose at the previous step that are still stored (every block
 * at the first step). */
static const SiftSelection *
prefetch_for (SiftRunner *r, gint32 l)
{
  SiftPolicy *p = r->decode[l];
  if (has_compute (p, SIFT_PHASE_DECODE))
    return r->empty;
  if (p == NULL || (p->ops->flags & SIFT_POLICY_REQUIRES_BLOCK_SELECTION) == 0 || !r->have_prev[l])
    return NULL;
  const gint64 nb = r->engine->store_ids[l]->len;
  SiftSelection *g = r->guess[l];
  sift_selection_clear (g);
  for (gsize i = 0; i < sift_selection_n_blocks (r->sel[l]); i++)
    if (sift_selection_block (r->sel[l], i) < nb)
      sift_selection_add (g, sift_selection_block (r->sel[l], i));
  sift_selection_validate (g, available_ids (r, nb), (gsize) nb, "runner", NULL);
  return g;
}

/* TRUE when every block of sel is among the loaded ones (NULL: every block). */
static gboolean
covers (const SiftSelection *loaded, const SiftSelection *sel)
{
  if (loaded == NULL)
    return TRUE;
  gsize n = sift_selection_n_blocks (loaded), j = 0;
  for (gsize i = 0; i < sift_selection_n_blocks (sel); i++)
    {
      gint64 b = sift_selection_block (sel, i);
      while (j < n && sift_selection_block (loaded, j) < b)
        j++;
      if (j == n || sift_selection_block (loaded, j) != b)
        return FALSE;
    }
  return TRUE;
}

/* A decode step through the cross-layer pipeline: layer l + 1's guessed
 * blocks (prefetch_for) load while layer l computes; layer l + 1's q, k, v
 * come only after layer l's output went back to the model. A selection
 * that reaches past what was prefetched goes through the ring instead. */
static gboolean
decode_cross_layer (SiftRunner *r, gint64 pos0, gint64 n, GError **error)
{
  SiftEngine *e = r->engine;
  const SiftModelShape *s = &e->config.shape;
  const gint32 L = s->n_layers;
  const SiftSelection *loaded = prefetch_for (r, 0);
  if (!sift_engine_pipeline_start (e, loaded, error))
    return FALSE;
  gboolean ok = TRUE;
  for (gint32 l = 0; l < L && ok; l++)
    {
      SiftPolicy *p = r->decode[l];
      SiftPolicyContext ctx;
      SiftSelection *sel = NULL;
      SiftView k, v, out = sift_view_htd (r->out, SIFT_DTYPE_F32, s->n_q_heads, n, s->head_dim);
      gsize nb = 0;
      ok = sift_model_qkv (r->model, l, r->q, r->k, r->v, error)
           && sift_engine_put_decode (e, l, pos0, n, r->k, r->v, error);
      if (ok)
        {
          make_context (r, &ctx, SIFT_PHASE_DECODE, l, pos0, n, r->q);
          sift_engine_begin_call (e, SIFT_PHASE_DECODE, policy_name (p));
          ok = select_for (r, p, &ctx, &sel, error);
        }
      const SiftSelection *next = l + 1 < L ? prefetch_for (r, l + 1) : NULL;
      ok = ok && sift_engine_pipeline_get (e, l, next, &k, &v, &nb, error);
      if (ok)
        {
          if (has_compute (p, SIFT_PHASE_DECODE))
            ok = policy_compute (p, &ctx, &out, r->lse, error);
          else if (sel == NULL || covers (loaded, sel))
            ok = sift_engine_attend_loaded (e, &ctx, sel, loaded, &k, &v, nb, &out, r->lse, error);
          else
            ok = sift_engine_attend_validated (e, &ctx, sel, &out, r->lse, error);
          r->have_prev[l] = sel != NULL;
        }
      ok = ok && finish_layer (r, &ctx, &out, error);
      loaded = next;
    }
  sift_engine_pipeline_end (e);
  return ok;
}

gboolean
sift_runner_decode (SiftRunner *r, gint32 n_rows, const gint32 *tokens, float *logits, GError **error)
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
  if (!run_step (r, SIFT_PHASE_DECODE, r->position, n_rows, tokens, logits, error)
      || !sift_engine_sync (r->engine, error))
    {
      r->failed = TRUE;
      return FALSE;
    }
  r->position += n_rows;
  r->decode_steps++;
  return TRUE;
}
