/* sift — long-context attention with pluggable sparse policies. */
#pragma once

#include <sift/version.h>
#include <sift/error.h>
#include <sift/dtype.h>
#include <sift/view.h>
#include <sift/attn.h>
#include <sift/parallel.h>
#include <sift/memory.h>
#include <sift/params.h>
#include <sift/policy.h>
#include <sift/store.h>
#include <sift/engine.h>
#include <sift/model.h>
#include <sift/runner.h>
#include <sift/config.h>
#include <sift/registry.h>
#include <sift/cuda.h>
