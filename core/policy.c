/* Policy instances: allocation, init, reset, finalize. */
#include <sift/error.h>
#include <sift/policy.h>

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
          g_set_error (error, SIFT_PLUGIN_ERROR, SIFT_PLUGIN_ERROR_INIT, "policy '%s': init failed: %s",
                       ops->name, local ? local->message : "(no message)");
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
