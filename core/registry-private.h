/* The registry's private side, for tests. */
#pragma once

#include <sift/registry.h>

/* Modules this registry has tried to open (loaded or failed). */
guint sift_registry_n_opened (SiftRegistry *registry);
