/* One policy name, "shadow", built into two directories with one file name:
 * the first directory on the search path wins. SHADOW_DIR says which. */
#include <sift/plugin.h>

static const SiftPolicyOps shadow_ops = {
  SIFT_POLICY_OPS_HEADER,
  .name = "shadow",
  .version = SHADOW_DIR,
  .description = "the copy in " SHADOW_DIR,
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE,
  .instance_size = sizeof (SiftPolicy),
};

SIFT_PLUGIN_DEFINE (&shadow_ops)
