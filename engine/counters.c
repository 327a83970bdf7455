/* The engine's counters: bytes per tier, blocks and tokens per call, time
 * stalled, computing and loading, per layer and phase; and the backend's
 * sink, which counts finished transfers and keeps the first failed store's
 * error. Every other engine file counts here; this file calls none of them. */
#include <string.h>

#include "engine-private.h"

SiftCounters *
sift_engine_counters_at (SiftEngine *e, gint32 layer, SiftPhase phase)
{
  return &e->counters[layer * 2 + (phase == SIFT_PHASE_DECODE)];
}

void
sift_engine_count (SiftEngine *e, gint32 layer, SiftPhase phase, const SiftCounters *a)
{
  pthread_mutex_lock (&e->lock);
  SiftCounters *c = sift_engine_counters_at (e, layer, phase);
  c->bytes_loaded += a->bytes_loaded;
  c->bytes_stored += a->bytes_stored;
  c->blocks_available += a->blocks_available;
  c->blocks_selected += a->blocks_selected;
  c->tokens_available += a->tokens_available;
  c->tokens_attended += a->tokens_attended;
  c->seconds_stalled += a->seconds_stalled;
  c->seconds_compute += a->seconds_compute;
  c->seconds_load += a->seconds_load;
  c->tokens_evicted += a->tokens_evicted;
  c->bytes_compacted += a->bytes_compacted;
  c->bytes_mapped += a->bytes_mapped;
  c->summaries_attended += a->summaries_attended;
  pthread_mutex_unlock (&e->lock);
}

void
sift_engine_counters (const SiftEngine *engine, gint32 layer, SiftPhase phase, SiftCounters *out)
{
  g_return_if_fail (engine != NULL && out != NULL);
  SiftEngine *e = (SiftEngine *) engine;
  g_return_if_fail (layer >= -1 && layer < e->config.shape.n_layers);
  memset (out, 0, sizeof *out);
  pthread_mutex_lock (&e->lock);
  gint32 l0 = layer < 0 ? 0 : layer, l1 = layer < 0 ? e->config.shape.n_layers : layer + 1;
  for (gint32 l = l0; l < l1; l++)
    {
      const SiftCounters *c = sift_engine_counters_at (e, l, phase);
      out->bytes_loaded += c->bytes_loaded;
      out->bytes_stored += c->bytes_stored;
      out->blocks_available += c->blocks_available;
      out->blocks_selected += c->blocks_selected;
      out->tokens_available += c->tokens_available;
      out->tokens_attended += c->tokens_attended;
      out->seconds_stalled += c->seconds_stalled;
      out->seconds_compute += c->seconds_compute;
      out->seconds_load += c->seconds_load;
      out->tokens_evicted += c->tokens_evicted;
      out->bytes_compacted += c->bytes_compacted;
      out->bytes_mapped += c->bytes_mapped;
      out->summaries_attended += c->summaries_attended;
    }
  pthread_mutex_unlock (&e->lock);
}

void
sift_engine_count_call (SiftEngine *e, const SiftPolicyContext *ctx, gsize n_available, gsize n_selected)
{
  /* Row i may attend every token before it and itself. */
  guint64 tokens = 0;
  for (gint64 i = 0; i < ctx->n_q; i++)
    tokens += (guint64) (ctx->q_pos + i + 1);
  SiftCounters add = { .blocks_available = n_available, .blocks_selected = n_selected,
                       .tokens_available = tokens * (guint64) e->config.shape.n_q_heads };
  sift_engine_count (e, ctx->layer, ctx->phase, &add);
}

void
sift_engine_count_attended (SiftEngine *e, const SiftPolicyContext *ctx, guint64 tokens)
{
  g_return_if_fail (e != NULL && ctx != NULL && ctx->layer >= 0 && ctx->layer < e->config.shape.n_layers);
  SiftCounters add = { .tokens_attended = tokens };
  sift_engine_count (e, ctx->layer, ctx->phase, &add);
}

void
sift_engine_count_summaries (SiftEngine *e, const SiftPolicyContext *ctx, guint64 rows)
{
  g_return_if_fail (e != NULL && ctx != NULL && ctx->layer >= 0 && ctx->layer < e->config.shape.n_layers);
  SiftCounters add = { .summaries_attended = rows };
  sift_engine_count (e, ctx->layer, ctx->phase, &add);
}

void
sift_engine_transfer_done (gpointer engine, const SiftTransfer *t, gboolean ok, guint64 bytes, gdouble seconds,
                           const GError *error)
{
  SiftEngine *e = engine;
  pthread_mutex_lock (&e->lock);
  SiftCounters *c = sift_engine_counters_at (e, t->layer, t->phase);
  if (t->kind == SIFT_TRANSFER_LOAD)
    {
      if (ok)
        {
          c->bytes_loaded += bytes;
          c->seconds_load += seconds;
        }
    }
  else
    {
      c->bytes_stored += bytes;
      if (error != NULL && e->store_error == NULL)
        e->store_error = g_error_copy (error);
    }
  pthread_mutex_unlock (&e->lock);
}
