/* sift — the plugin SDK: everything a policy may include.
 *
 * A policy (shipped or out of tree) includes only this header: the policy
 * ABI and its selections, declared parameters, tensor views with their
 * memory space, dtypes, the CPU attention kernels, vector primitives and
 * helpers (simd.h), the thread pool, large buffers, and the OffloadEngine
 * calls meant for policies. The host side
 * (engines, stores, models, the runner, configs, the registry) is the host
 * umbrella <sift/sift.h>, which includes this one. */
#pragma once

#include <sift/version.h>
#include <sift/api.h>
#include <sift/error.h>
#include <sift/dtype.h>
#include <sift/view.h>
#include <sift/attn.h>
#include <sift/parallel.h>
#include <sift/memory.h>
#include <sift/simd.h>
#include <sift/params.h>
#include <sift/policy.h>
#include <sift/engine-calls.h>
