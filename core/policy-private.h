/* Policy names: one rule for plugins (sift_policy_ops_check) and configs. */
#pragma once

#include <glib.h>

/* Non-empty, [a-z0-9_-] only. */
gboolean sift_policy_name_valid (const char *name);
