/* H2O (Zhang et al., NeurIPS 2023, "H2O: Heavy-Hitter Oracle for Efficient
 * Generative Inference of Large Language Models"): a few tokens collect most
 * of the attention over a sequence (heavy hitters); keeping them plus the
 * recent tokens in a bounded KV cache preserves what dense attention
 * computes. The policy attends densely over the kept cache (the engine's
 * default pipeline) and asks the engine to accumulate, per token, the
 * softmax probability every later query gave it; when the cache passes
 * kv.capacity_tokens the lowest-scored unprotected tokens are evicted. The
 * recent window and the sinks are protected by the engine
 * (kv.protect_recent, kv.protect_sinks). See docs/eviction.md. */
#include <math.h>

#include <sift/plugin.h>

typedef enum { COMBINE_SUM, COMBINE_MAX } Combine; /* the order of the "heads" choices */

typedef struct {
  SiftPolicy parent;
  Combine combine;      /* how the kv heads' scores make a token's */
  gboolean normalize;   /* divide by the queries that could see the token */
} H2oPolicy;

static const SiftParamSpec h2o_params[] = {
  SIFT_PARAM_CHOICE ("heads", "sum", SIFT_CHOICES ("sum", "max"),
    "a token's score from its kv heads' accumulated attention: their sum or their maximum"),
  SIFT_PARAM_BOOL ("normalize", FALSE,
    "divide the score by the number of queries since the token (mean instead of sum)"),
  SIFT_PARAM_END,
};

static gboolean
h2o_init (SiftPolicy *self, const SiftParams *params, GError **error)
{
  H2oPolicy *hp = (H2oPolicy *) self;
  (void) error;
  hp->combine = (Combine) sift_params_get_choice (params, "heads");
  hp->normalize = sift_params_get_bool (params, "normalize");
  return TRUE;
}

/* The score of candidate i: its accumulated attention over the kv heads
 * (accumulated is [n_kv_heads][n]); the engine evicts the lowest. */
static gboolean
h2o_score_eviction (SiftPolicy *self, const SiftPolicyContext *ctx, const SiftEvictCandidates *cand,
                    float *scores, GError **error)
{
  H2oPolicy *hp = (H2oPolicy *) self;
  if (cand->accumulated == NULL)
    {
      g_set_error_literal (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY,
                           "h2o: the engine passed no accumulated attention");
      return FALSE;
    }
  const gint32 kvh = self->shape->n_kv_heads;
  const gint64 end = ctx->q_pos + ctx->n_q;
  for (gsize i = 0; i < cand->n; i++)
    {
      float s = hp->combine == COMBINE_MAX ? -INFINITY : 0.0f;
      for (gint32 g = 0; g < kvh; g++)
        {
          float a = cand->accumulated[(gsize) g * cand->n + i];
          s = hp->combine == COMBINE_MAX ? fmaxf (s, a) : s + a;
        }
      if (hp->normalize)
        s /= (float) (end - cand->positions[i]);
      scores[i] = s;
    }
  return TRUE;
}

static const SiftPolicyOps h2o_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "h2o",
  .version = "1.0",
  .description = "H2O: dense over a bounded cache that keeps heavy hitters (accumulated attention) and recent tokens",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_WANTS_ACCUMULATED_ATTENTION,
  .params = h2o_params,
  .instance_size = sizeof (H2oPolicy),
  .init = h2o_init,
  .score_eviction = h2o_score_eviction,
};

SIFT_PLUGIN_DEFINE (&h2o_ops)
