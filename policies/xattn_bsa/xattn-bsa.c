/* xattn_bsa — XAttention block-sparse prefill (Xu et al., 2025) as a sift
 * policy: the descriptor and its parameters. select_blocks estimates block
 * importance from antidiagonal sums of a K-only pass over the chunk's
 * history, keeps per head the key blocks that reach the threshold, votes a
 * load list and hands the engine per-head selections; the engine's default
 * pipeline computes attention. Glue in xattn-glue.c, the algorithm in
 * xattn-score.c; docs/policies/xattn_bsa.md. */
#include <sift/policy.h>

#include "xattn-bsa-private.h"

static const SiftParamSpec xattn_params[] = {
  { "threshold", SIFT_PARAM_FLOAT, "0.9", 0.0, 1.0, NULL,
    "softmax mass each (head, query block) keeps; 1 selects every block" },
  { "stride", SIFT_PARAM_INT, "8", 1, 256, NULL,
    "antidiagonal stride S; divides block_size and kv.block_size" },
  { "block_size", SIFT_PARAM_INT, "128", 1, 1 << 20, NULL,
    "XAttention estimation block B in tokens (not kv.block_size)" },
  { "vote", SIFT_PARAM_STRING, "any", 1, 0, "any|majority",
    "load a block chosen by any (kv head, query block), or by more than vote_threshold of them" },
  { "vote_threshold", SIFT_PARAM_FLOAT, "0.5", 0.0, 1.0, NULL,
    "fraction of (kv head, query block) votes a block needs under vote: majority" },
  { "granularity", SIFT_PARAM_STRING, "query_block", 1, 0, "query_block|chunk",
    "attend a chosen block only for the query blocks that chose it, or for the whole chunk (one load per block)" },
  { "antidiagonal", SIFT_PARAM_STRING, "sum_exp", 1, 0, "mean_logit|sum_exp",
    "score a reshaped column by its antidiagonal's mean logit (the reference code) or by the sum of its exp(logit)s" },
  { "norm", SIFT_PARAM_FLOAT, "1.0", 1e-6, 1e6, NULL,
    "the reference's norm: antidiagonal logits are divided by it (1: unchanged)" },
  { "exact_rows", SIFT_PARAM_INT, "0", 0, 1 << 20, NULL,
    "the chunk's last N queries are also scored exactly; each keeps the blocks holding threshold of its own mass" },
  { "min_query_len", SIFT_PARAM_INT, "1024", 0, 1e15, NULL,
    "below this query position + 1, every block is selected (no estimation)" },
  { NULL },
};

static gboolean
xattn_init (SiftPolicy *policy, const SiftParams *params, GError **error)
{
  XattnBsaConfig cfg = {
    .threshold = sift_params_get_float (params, "threshold"),
    .stride = sift_params_get_int (params, "stride"),
    .block = sift_params_get_int (params, "block_size"),
    .vote = g_str_equal (sift_params_get_string (params, "vote"), "majority") ? XATTN_VOTE_MAJORITY
                                                                              : XATTN_VOTE_ANY,
    .vote_threshold = sift_params_get_float (params, "vote_threshold"),
    .min_query_len = sift_params_get_int (params, "min_query_len"),
    .granularity = g_str_equal (sift_params_get_string (params, "granularity"), "query_block")
                     ? XATTN_GRANULARITY_QUERY_BLOCK : XATTN_GRANULARITY_CHUNK,
    .norm = sift_params_get_float (params, "norm"),
    .sum_exp = g_str_equal (sift_params_get_string (params, "antidiagonal"), "sum_exp"),
    .exact_rows = sift_params_get_int (params, "exact_rows"),
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
