/* StreamingLLM (Xiao et al., ICLR 2024, "Efficient Streaming Language Models
 * with Attention Sinks"): every query attends to the first few tokens (the
 * attention sinks) and to a window of recent tokens; everything between is
 * skipped. This policy works at block granularity: it selects the stored
 * blocks that hold a sink token or a token of the recent window, so the
 * engine loads (and attends) only those. The current chunk or decode buffer
 * is always attended by the engine's default pipeline. With a bounded KV
 * cache (kv.capacity_tokens) it also says what to evict: everything
 * between the sinks and the window.
 *
 * Built out of tree against an installed sift (see meson.build), it is the
 * example docs/writing-a-policy.md walks through. */
#include <math.h>

#include <sift/plugin.h>

typedef struct {
  SiftPolicy parent;
  gint64 sink_tokens;   /* tokens at the start of the sequence always kept */
  gint64 window_tokens; /* tokens before the first query row always kept */
} StreamingPolicy;

static const SiftParamSpec streaming_params[] = {
  SIFT_PARAM_INT ("sink_tokens", 4, 0, 1 << 20,
    "tokens at the start of the sequence every query attends (attention sinks)"),
  SIFT_PARAM_INT ("window_tokens", 1024, 0, 1 << 30,
    "recent tokens before the query that every query attends"),
  SIFT_PARAM_END,
};

static gboolean
streaming_init (SiftPolicy *self, const SiftParams *params, GError **error)
{
  StreamingPolicy *sp = (StreamingPolicy *) self;
  (void) error; /* the host already checked every value against its range */
  sp->sink_tokens = sift_params_get_int (params, "sink_tokens");
  sp->window_tokens = sift_params_get_int (params, "window_tokens");
  return TRUE;
}

/* A block is kept, for every head, when it holds a sink token or reaches
 * into the window [q_pos - window_tokens, q_pos) before the call's first
 * query row. The policy keeps no per-sequence state, so it needs no reset. */
static gboolean
streaming_select_blocks (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available,
                         gsize n_available, SiftSelection *selected, GError **error)
{
  StreamingPolicy *sp = (StreamingPolicy *) self;
  gint64 window_start = ctx->q_pos - sp->window_tokens;
  (void) error;

  for (gsize i = 0; i < n_available; i++)
    {
      const SiftBlockMeta *b = &ctx->blocks[available[i]];
      gint64 last = b->first_token + b->n_valid - 1;
      gboolean sink = b->first_token < sp->sink_tokens;
      gboolean recent = last >= window_start;
      if (sink || recent)
        sift_selection_add (selected, available[i]);
    }
  return TRUE;
}

/* With a bounded KV cache (kv.capacity_tokens): when a
 * layer holds more tokens than the capacity, the engine asks for a score
 * per stored token it may evict (never its protected sinks and recent
 * tokens) and evicts the lowest. A score of -inf asks it to evict a token
 * even beyond what the capacity needs: everything between the sinks and the
 * window goes. Other tokens score their position, so the oldest go first. */
static gboolean
streaming_score_eviction (SiftPolicy *self, const SiftPolicyContext *ctx,
                          const SiftEvictCandidates *candidates, float *scores, GError **error)
{
  StreamingPolicy *sp = (StreamingPolicy *) self;
  gint64 window_start = ctx->q_pos - sp->window_tokens;
  (void) error;

  for (gsize i = 0; i < candidates->n; i++)
    {
      gint64 t = candidates->positions[i];
      gboolean between = t >= sp->sink_tokens && t < window_start;
      scores[i] = between ? -INFINITY : (float) t;
    }
  return TRUE;
}

static const SiftPolicyOps streaming_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "streaming",
  .version = "2.0",
  .description = "StreamingLLM: attention sinks + recent window, selected by block",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE
           | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .params = streaming_params,
  .instance_size = sizeof (StreamingPolicy),
  .init = streaming_init,
  .select_blocks = streaming_select_blocks,
  .score_eviction = streaming_score_eviction,
};

SIFT_PLUGIN_DEFINE (&streaming_ops)
