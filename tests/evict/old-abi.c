/* A plugin as built against ABI 1.0: its ops table is the 1.0 layout (128
 * bytes, ending at on_decode_offload), declared here as its own struct so
 * the object is exactly that size. A 2.x host refuses it by its version
 * fields alone; a read past the table would trip AddressSanitizer. It
 * selects every block. */
#include <sift/plugin.h>

typedef struct {
  guint32 abi_major, abi_minor, struct_size;
  const char *name, *version, *description;
  guint32 flags;
  const void *params;
  gsize instance_size;
  gpointer init, finalize, reset;
  gboolean (*select_blocks) (SiftPolicy *, const SiftPolicyContext *, const gint64 *, gsize, SiftSelection *,
                             GError **);
  gpointer compute_chunked_prefill, compute_chunked_decode, on_prefill_offload, on_decode_offload;
} OpsV1_0;

G_STATIC_ASSERT (sizeof (OpsV1_0) == 128);

static gboolean
all_blocks (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n,
            SiftSelection *selected, GError **error)
{
  (void) self, (void) ctx, (void) error;
  for (gsize i = 0; i < n; i++)
    sift_selection_add (selected, available[i]);
  return TRUE;
}

static const OpsV1_0 old_ops = {
  .abi_major = 1, .abi_minor = 0, .struct_size = sizeof (OpsV1_0),
  .name = "old-abi", .version = "1.0", .description = "built with the ABI 1.0 ops table",
  .flags = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .instance_size = sizeof (SiftPolicy),
  .select_blocks = all_blocks,
};

G_MODULE_EXPORT const SiftPolicyOps *const *sift_plugin_policies (void);
G_MODULE_EXPORT const SiftPolicyOps *const *
sift_plugin_policies (void)
{
  static const SiftPolicyOps *list[2];
  list[0] = (const SiftPolicyOps *) (gconstpointer) &old_ops;
  return list;
}
