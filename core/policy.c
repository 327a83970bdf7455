/* Policy instances: allocation, init, reset, finalize; the ops-table check. */
#include <dlfcn.h>

#include <sift/error.h>
#include <sift/params.h>
#include <sift/policy.h>

#include "policy-private.h"

SiftPolicy *
sift_policy_new (const SiftPolicyOps *ops, const SiftParams *params, const SiftModelShape *shape,
                 GError **error)
{
  g_return_val_if_fail (ops != NULL && shape != NULL, NULL);
  g_return_val_if_fail (ops->instance_size >= sizeof (SiftPolicy), NULL);

  SiftPolicy *self = g_malloc0 (ops->instance_size);
  SiftModelShape *copy = g_new (SiftModelShape, 1);
  *copy = *shape;
  self->ops = ops;
  self->shape = copy;
  if (ops->init != NULL)
    {
      GError *local = NULL;
      if (!ops->init (self, params, &local))
        {
          /* The module holding the ops table names the file. */
          Dl_info where = { 0 };
          gboolean named = dladdr (ops, &where) != 0 && where.dli_fname != NULL;
          g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INIT, "%s%spolicy '%s': init failed: %s",
                       named ? where.dli_fname : "", named ? ": " : "", ops->name,
                       local ? local->message : "(no message)");
          g_clear_error (&local);
          g_free (copy);
          g_free (self);
          return NULL;
        }
    }
  return self;
}

void
sift_policy_free (SiftPolicy *policy)
{
  if (policy == NULL)
    return;
  if (policy->ops->finalize != NULL)
    policy->ops->finalize (policy);
  g_free ((gpointer) policy->shape);
  g_free (policy);
}

void
sift_policy_reset (SiftPolicy *policy)
{
  g_return_if_fail (policy != NULL);
  if (policy->ops->reset != NULL)
    policy->ops->reset (policy);
}

/* The size of the ops table each minor of ABI 2 defines: a plugin built
 * against minor m must cover at least ops_size_for_minor[m]. */
static const gsize ops_size_for_minor[] = {
  [0] = G_STRUCT_OFFSET (SiftPolicyOps, score_eviction) + sizeof (gpointer),
};

/* The flags each minor knows. */
static const guint32 flags_for_minor[] = {
  [0] = SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE | SIFT_POLICY_REQUIRES_BLOCK_SELECTION
        | SIFT_POLICY_WANTS_ACCUMULATED_ATTENTION,
};
G_STATIC_ASSERT (G_N_ELEMENTS (flags_for_minor) == SIFT_POLICY_ABI_MINOR + 1);
G_STATIC_ASSERT (G_N_ELEMENTS (ops_size_for_minor) == SIFT_POLICY_ABI_MINOR + 1);

gboolean
sift_policy_name_valid (const char *name)
{
  if (name == NULL || *name == '\0')
    return FALSE;
  for (const char *c = name; *c; c++)
    if (!(g_ascii_islower (*c) || g_ascii_isdigit (*c) || *c == '_' || *c == '-'))
      return FALSE;
  return TRUE;
}

gboolean
sift_policy_ops_check (const SiftPolicyOps *ops, const char *file, GError **error)
{
  g_return_val_if_fail (ops != NULL, FALSE);
  const char *where = file ? file : "(built in)";

  if (ops->abi_major != SIFT_POLICY_ABI_MAJOR || ops->abi_minor > SIFT_POLICY_ABI_MINOR)
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_ABI,
                   "%s: built for policy ABI %u.%u, but this sift has ABI %d.%d (%s)", where,
                   ops->abi_major, ops->abi_minor, SIFT_POLICY_ABI_MAJOR, SIFT_POLICY_ABI_MINOR,
                   ops->abi_major != SIFT_POLICY_ABI_MAJOR ? "major versions differ"
                                                           : "the plugin needs a newer sift");
      return FALSE;
    }
  if (ops->struct_size < ops_size_for_minor[ops->abi_minor])
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_ABI,
                   "%s: ops table is %u bytes, but ABI %u.%u needs at least %" G_GSIZE_FORMAT, where,
                   ops->struct_size, ops->abi_major, ops->abi_minor, ops_size_for_minor[ops->abi_minor]);
      return FALSE;
    }
  if (!sift_policy_name_valid (ops->name))
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID,
                   "%s: policy name '%s' is not of the form [a-z0-9_-]+", where,
                   ops->name ? ops->name : "(null)");
      return FALSE;
    }
  const guint32 known = flags_for_minor[ops->abi_minor];
  if (ops->flags & ~known)
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID,
                   "%s: policy '%s' sets unknown flags 0x%x (ABI %u.%u)", where, ops->name,
                   ops->flags & ~known, ops->abi_major, ops->abi_minor);
      return FALSE;
    }
  if (!(ops->flags & (SIFT_POLICY_SUPPORTS_PREFILL | SIFT_POLICY_SUPPORTS_DECODE)))
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID,
                   "%s: policy '%s' supports neither prefill nor decode", where, ops->name);
      return FALSE;
    }
  if (ops->instance_size < sizeof (SiftPolicy))
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID,
                   "%s: policy '%s' has instance_size %" G_GSIZE_FORMAT ", less than sizeof (SiftPolicy) = %"
                   G_GSIZE_FORMAT, where, ops->name, ops->instance_size, sizeof (SiftPolicy));
      return FALSE;
    }
  if ((ops->flags & SIFT_POLICY_REQUIRES_BLOCK_SELECTION) && ops->select_blocks == NULL)
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_MISSING_METHOD,
                   "%s: policy '%s' declares REQUIRES_BLOCK_SELECTION but select_blocks is NULL", where,
                   ops->name);
      return FALSE;
    }
  GError *local = NULL;
  SiftParams *params = sift_params_new (ops->params, &local);
  if (params == NULL)
    {
      g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INVALID, "%s: policy '%s': %s", where,
                   ops->name, local->message);
      g_error_free (local);
      return FALSE;
    }
  sift_params_free (params);
  return TRUE;
}
