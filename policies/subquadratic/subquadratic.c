/* The subquadratic policy: local window, global tokens, log-stride and
 * landmarks (docs/policies/subquadratic.md). Declares its parameters and
 * wraps sq-plugin.c in the ops table. */
#include <sift/plugin.h>

#include "sq-plugin.h"

static const SiftParamSpec params[] = {
  SIFT_PARAM_INT ("window", 128, 0, 1 << 20, "recent tokens before each query it attends (j in [i - window, i])"),
  SIFT_PARAM_INT ("block_size", 64, 1, 1 << 16, "tokens per landmark block (its mean key and value), independent of kv.block_size"),
  SIFT_PARAM_INT_LIST ("globals", "[0]", 0, (double) G_MAXINT32, "global (anchor) token positions every later query attends; positions past the sequence are ignored"),
  SIFT_PARAM_BOOL ("log_stride", TRUE, "attend tokens i - 2^k and landmark blocks pivot - 2^k"),
  SIFT_PARAM_BOOL ("landmarks", TRUE, "attend block means of far blocks"),
  SIFT_PARAM_BOOL ("sort_candidates", FALSE, "visit each row's candidates in ascending position order"),
  SIFT_PARAM_CHOICE ("landmark_dtype", "f32", SIFT_CHOICES ("f32", "f16"), "storage of the policy's landmark memory"),
  SIFT_PARAM_END,
};

static gboolean
sq_init (SiftPolicy *policy, const SiftParams *p, GError **error)
{
  SqConfig config;
  gsize n_globals = 0;
  sq_config_default (&config);
  config.window = sift_params_get_int (p, "window");
  config.block_size = sift_params_get_int (p, "block_size");
  config.globals = sift_params_get_int_list (p, "globals", &n_globals);
  config.n_globals = n_globals;
  config.log_stride = sift_params_get_bool (p, "log_stride");
  config.landmarks = sift_params_get_bool (p, "landmarks");
  config.sort_candidates = sift_params_get_bool (p, "sort_candidates");
  static const SiftDType dtypes[] = { SIFT_DTYPE_F32, SIFT_DTYPE_F16 }; /* the landmark_dtype choices */
  SiftDType dtype = dtypes[sift_params_get_choice (p, "landmark_dtype")];
  return sq_policy_setup ((SqPolicy *) policy, &config, dtype, error);
}

static void
sq_finalize (SiftPolicy *policy)
{
  sq_policy_clear ((SqPolicy *) policy);
}

static void
sq_reset (SiftPolicy *policy)
{
  sq_policy_reset ((SqPolicy *) policy);
}

static gboolean
sq_compute (SiftPolicy *policy, const SiftPolicyContext *ctx, SiftView *out, float *lse, GError **error)
{
  return sq_policy_compute ((SqPolicy *) policy, ctx, out, lse, error);
}

static gboolean
sq_offload (SiftPolicy *policy, const SiftPolicyContext *ctx, const SiftBlockInfo *block, GError **error)
{
  return sq_policy_offload ((SqPolicy *) policy, ctx, block, error);
}

static gboolean
sq_score_eviction (SiftPolicy *policy, const SiftPolicyContext *ctx, const SiftEvictCandidates *cand, float *scores,
                   GError **error)
{
  return sq_policy_score_eviction ((SqPolicy *) policy, ctx, cand, scores, error);
}

static const SiftPolicyOps subquadratic_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "subquadratic",
  .version = "0.1.0",
  .description = "local window + global tokens + log-stride tokens + landmark block means: O(N log N)",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE,
  .params = params,
  .instance_size = sizeof (SqPolicy),
  .init = sq_init,
  .finalize = sq_finalize,
  .reset = sq_reset,
  .compute_chunked_prefill = sq_compute,
  .compute_chunked_decode = sq_compute,
  .on_prefill_offload = sq_offload,
  .on_decode_offload = sq_offload,
  .score_eviction = sq_score_eviction,
};

SIFT_PLUGIN_DEFINE (&subquadratic_ops)
