/* xattn_bsa — XAttention block-sparse prefill (Xu et al., 2025) as a sift
 * policy: the descriptor and its parameters. select_blocks estimates block
 * importance from antidiagonal sums of a K-only pass over the chunk's
 * history, keeps per head the key blocks that reach the threshold, votes a
 * load list and hands the engine per-head selections; the engine's default
 * pipeline computes attention. Glue in xattn-glue.c, the algorithm in
 * xattn-score.c; docs/policies/xattn_bsa.md. */
#include <sift/plugin.h>

#include "xattn-bsa-private.h"

static const SiftParamSpec xattn_params[] = {
  SIFT_PARAM_FLOAT ("threshold", 0.9, 0.0, 1.0,
    "softmax mass each (head, query block) keeps; 1 selects every block"),
  SIFT_PARAM_INT ("stride", 8, 1, 256,
    "antidiagonal stride S; divides block_size and kv.block_size"),
  SIFT_PARAM_INT ("block_size", 128, 1, 1 << 20,
    "XAttention estimation block B in tokens (not kv.block_size)"),
  SIFT_PARAM_CHOICE ("vote", "any", SIFT_CHOICES ("any", "majority"),
    "load a block chosen by any (kv head, query block), or by more than vote_threshold of them"),
  SIFT_PARAM_FLOAT ("vote_threshold", 0.5, 0.0, 1.0,
    "fraction of (kv head, query block) votes a block needs under vote: majority"),
  SIFT_PARAM_CHOICE ("granularity", "query_block", SIFT_CHOICES ("query_block", "chunk"),
    "attend a chosen block only for the query blocks that chose it, or for the whole chunk (one load per block)"),
  SIFT_PARAM_CHOICE ("antidiagonal", "sum_exp", SIFT_CHOICES ("mean_logit", "sum_exp"),
    "score a reshaped column by its antidiagonal's mean logit (the reference code) or by the sum of its exp(logit)s"),
  SIFT_PARAM_FLOAT ("norm", 1.0, 1e-6, 1e6,
    "the reference's norm: antidiagonal logits are divided by it (1: unchanged)"),
  SIFT_PARAM_INT ("exact_rows", 0, 0, 1 << 20,
    "the chunk's last N queries are also scored exactly; each keeps the blocks holding threshold of its own mass"),
  SIFT_PARAM_BOOL ("last_block", FALSE,
    "every head also attends the last stored block (sift's addition; the reference keeps the sink and the diagonal)"),
  SIFT_PARAM_INT ("min_query_len", 1024, 0, 1e15,
    "below this query position + 1, every block is selected (no estimation)"),
  SIFT_PARAM_END,
};

static gboolean
xattn_init (SiftPolicy *policy, const SiftParams *params, GError **error)
{
  /* In the order of the choices declared above. */
  static const XattnVote votes[] = { XATTN_VOTE_ANY, XATTN_VOTE_MAJORITY };
  static const XattnGranularity granularities[] = { XATTN_GRANULARITY_QUERY_BLOCK, XATTN_GRANULARITY_CHUNK };
  XattnBsaConfig cfg = {
    .threshold = sift_params_get_float (params, "threshold"),
    .stride = sift_params_get_int (params, "stride"),
    .block = sift_params_get_int (params, "block_size"),
    .vote = votes[sift_params_get_choice (params, "vote")],
    .vote_threshold = sift_params_get_float (params, "vote_threshold"),
    .min_query_len = sift_params_get_int (params, "min_query_len"),
    .granularity = granularities[sift_params_get_choice (params, "granularity")],
    .norm = sift_params_get_float (params, "norm"),
    .sum_exp = sift_params_get_choice (params, "antidiagonal") == 1, /* sum_exp */
    .exact_rows = sift_params_get_int (params, "exact_rows"),
    .last_block = sift_params_get_bool (params, "last_block"),
  };
  return xattn_bsa_configure (policy, &cfg, error);
}

static const SiftPolicyOps xattn_bsa_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "xattn_bsa",
  .version = "1.0",
  .description = "XAttention: antidiagonal block scoring, threshold selection, block-sparse prefill",
  .params = xattn_params,
  .init = xattn_init,
  XATTN_BSA_OPS_METHODS,
};

SIFT_PLUGIN_DEFINE (&xattn_bsa_ops)
