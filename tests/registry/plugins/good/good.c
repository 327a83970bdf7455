/* Well-formed test policies in one module: "good" (both phases, one
 * parameter of every type, selects every other block) and "good_decode"
 * (decode only), for registry and config tests. */
#include <sift/plugin.h>

typedef struct {
  SiftPolicy parent;
  gint64 stride;
  gint64 resets;
} Good;

static const SiftParamSpec good_params[] = {
  SIFT_PARAM_INT ("stride", 2, 1, 64, "select every stride-th block"),
  SIFT_PARAM_FLOAT ("ratio", 0.5, 0.0, 1.0, "a fraction"),
  SIFT_PARAM_BOOL ("verbose", FALSE, "a switch"),
  SIFT_PARAM_CHOICE ("score", "max", SIFT_CHOICES ("max", "mean"), "how blocks are scored"),
  SIFT_PARAM_INT_LIST ("layers", "[0, 1]", 0, 1024, "some layers"),
  SIFT_PARAM_END,
};

static gboolean
good_init (SiftPolicy *self, const SiftParams *params, GError **error)
{
  (void) error;
  ((Good *) self)->stride = sift_params_get_int (params, "stride");
  return TRUE;
}

static void
good_reset (SiftPolicy *self)
{
  ((Good *) self)->resets++;
}

static gboolean
good_select (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n,
             SiftSelection *selected, GError **error)
{
  (void) ctx;
  (void) error;
  for (gsize i = 0; i < n; i += (gsize) ((Good *) self)->stride)
    sift_selection_add (selected, available[i]);
  return TRUE;
}

static const SiftPolicyOps good_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "good",
  .version = "1.2",
  .description = "a well-formed test policy",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .params = good_params,
  .instance_size = sizeof (Good),
  .init = good_init,
  .reset = good_reset,
  .select_blocks = good_select,
};

static const SiftPolicyOps good_decode_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "good_decode",
  .version = "1.0",
  .description = "a decode-only test policy",
  .flags = SIFT_POLICY_SUPPORTS_DECODE,
  .instance_size = sizeof (SiftPolicy),
};

SIFT_PLUGIN_DEFINE (&good_ops, &good_decode_ops)
