/* The subquadratic policy: local window, global tokens, log-stride and
 * landmarks (docs/policies/subquadratic.md). Declares its parameters and
 * wraps sq-plugin.c in the ops table. */
#include <sift/policy.h>

#include "sq-plugin.h"

static const SiftParamSpec params[] = {
  { "window", SIFT_PARAM_INT, "128", 0, 1 << 20, NULL, "recent tokens before each query it attends (j in [i - window, i])" },
  { "block_size", SIFT_PARAM_INT, "64", 1, 1 << 16, NULL, "tokens per landmark block (its mean key and value), independent of kv.block_size" },
  { "globals", SIFT_PARAM_INT_LIST, "[0]", 0, (double) G_MAXINT32, NULL, "global (anchor) token positions every later query attends; positions past the sequence are ignored" },
  { "log_stride", SIFT_PARAM_BOOL, "true", 0, -1, NULL, "attend tokens i - 2^k and landmark blocks pivot - 2^k" },
  { "landmarks", SIFT_PARAM_BOOL, "true", 0, -1, NULL, "attend block means of far blocks" },
  { "sort_candidates", SIFT_PARAM_BOOL, "false", 0, -1, NULL, "visit each row's candidates in ascending position order" },
  { "landmark_dtype", SIFT_PARAM_STRING, "f32", 0, -1, "f32|f16", "storage of the policy's landmark memory" },
  { NULL },
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
  SiftDType dtype = SIFT_DTYPE_F32;
  sift_dtype_from_name (sift_params_get_string (p, "landmark_dtype"), &dtype);
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
};

SIFT_PLUGIN_DEFINE (&subquadratic_ops)
