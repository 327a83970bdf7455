/* Deliberately broken policy plugins: one source, one failure per build
 * (BROKEN_<CASE> defined by meson). Each loads into a specific
 * SiftPluginError that tests/registry/test-registry.c asserts. */
#include <sift/plugin.h>

G_GNUC_UNUSED static gboolean
select_last (SiftPolicy *self, const SiftPolicyContext *ctx, const gint64 *available, gsize n,
             SiftSelection *selected, GError **error)
{
  (void) self;
  (void) ctx;
  (void) error;
  if (n > 0)
    sift_selection_add (selected, available[n - 1]);
  return TRUE;
}

G_GNUC_UNUSED static gboolean
init_fails (SiftPolicy *self, const SiftParams *params, GError **error)
{
  (void) self;
  (void) params;
  g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INIT, "the test plugin refuses to start (as designed)");
  return FALSE;
}

#if defined(BROKEN_NO_ENTRY)
/* A shared object without the entry symbol. */
G_MODULE_EXPORT int not_a_sift_plugin (void);
G_MODULE_EXPORT int
not_a_sift_plugin (void)
{
  return 42;
}
#else

static const SiftPolicyOps ops = {
#if defined(BROKEN_ABI_MAJOR)
  .abi_major = SIFT_POLICY_ABI_MAJOR + 1, .abi_minor = 0, .struct_size = sizeof (SiftPolicyOps),
  .name = "abi_major",
#elif defined(BROKEN_ABI_MINOR)
  .abi_major = SIFT_POLICY_ABI_MAJOR, .abi_minor = SIFT_POLICY_ABI_MINOR + 1,
  .struct_size = sizeof (SiftPolicyOps), .name = "abi_minor",
#elif defined(BROKEN_NO_SELECT)
  SIFT_POLICY_OPS_HEADER, .name = "no_select",
#elif defined(BROKEN_INIT_FAILS)
  SIFT_POLICY_OPS_HEADER, .name = "init_fails", .init = init_fails,
#elif defined(BROKEN_BAD_DEFAULT)
  SIFT_POLICY_OPS_HEADER, .name = "bad_default",
  .params = (const SiftParamSpec[]) {
    SIFT_PARAM_INT ("budget", 0, 1, 100, "default below its own minimum"),
    SIFT_PARAM_END,
  },
#elif defined(BROKEN_DUP_A) || defined(BROKEN_DUP_B)
  SIFT_POLICY_OPS_HEADER, .name = "dup",
#else
#error "define one BROKEN_* case"
#endif
  .version = "0",
  .description = "a deliberately broken test plugin",
#if defined(BROKEN_NO_SELECT)
  /* Declares block selection but provides no select_blocks. */
  .flags = SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
#else
  .flags = SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION,
  .select_blocks = select_last,
#endif
  .instance_size = sizeof (SiftPolicy),
};

SIFT_PLUGIN_DEFINE (&ops)
#endif
