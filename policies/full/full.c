/* The Full policy: dense attention over every stored block, in both phases.
 *
 * It is the reference the sparse policies are measured against. It does not
 * set REQUIRES_BLOCK_SELECTION, so the engine attends every stored block
 * without asking; select_blocks is still provided (every available block,
 * for every head) for hosts and tests that want the dense selection
 * explicitly. NULL compute methods: the engine's default pipelines. */
#include <sift/plugin.h>

static gboolean
full_select_blocks (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available,
                    gsize n_available, SiftSelection *selected, GError **error)
{
  (void) self;
  (void) ctx;
  (void) error;
  for (gsize i = 0; i < n_available; i++)
    sift_selection_add (selected, available[i]);
  return TRUE;
}

static const SiftPolicyOps full_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "full",
  .version = "1.0",
  .description = "dense attention over every block (the reference)",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE,
  .params = NULL,
  .instance_size = sizeof (SiftPolicy),
  .select_blocks = full_select_blocks,
};

SIFT_PLUGIN_DEFINE (&full_ops)
