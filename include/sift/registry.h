/* sift — the policy registry: finds plugins, loads them on demand.
 *
 * Search path: the directories given to sift_registry_new (the command's
 * --policy-path options), then SIFT_POLICY_PATH (G_SEARCHPATH_SEPARATOR
 * separated), then the installed policy directory (replaced by
 * SIFT_POLICY_SYSTEM_PATH when that is set; empty: none). Files are filtered by
 * G_MODULE_SUFFIX; when two directories hold a file of one basename, the
 * first wins. A module is opened (g_module_open_full, made resident,
 * reference-counted) only when a config names one of its policies, or when
 * a listing asks for every descriptor. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/error.h>
#include <sift/policy.h>

G_BEGIN_DECLS

typedef struct _SiftRegistry SiftRegistry;

typedef struct {
  const SiftPolicyOps *ops;
  const char *file;           /* the module's path */
} SiftPolicyInfo;

SIFT_API SiftRegistry *sift_registry_new (const char *const *extra_dirs);
SIFT_API void sift_registry_free (SiftRegistry *registry);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (SiftRegistry, sift_registry_free)

/* The directories searched, in order (NULL-terminated, owned by the registry). */
SIFT_API const char *const *sift_registry_search_path (SiftRegistry *registry);
/* The installed policy directory compiled into the library. */
SIFT_API const char *sift_registry_installed_dir (void);

/* Finds a policy by name. SIFT_PLUGIN_ERROR_UNKNOWN names the nearest known
 * names; load failures keep their own codes (OPEN, NOT_PLUGIN, ABI, ...). */
SIFT_API const SiftPolicyInfo *sift_registry_lookup (SiftRegistry *registry, const char *name, GError **error);

/* Every policy of every module (opening each); a module that fails to load
 * is reported in `failures` (GError * items, may be NULL) and skipped. */
SIFT_API GPtrArray *sift_registry_list (SiftRegistry *registry, GPtrArray *failures, GError **error);

G_END_DECLS
