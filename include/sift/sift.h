/* sift — long-context attention with pluggable sparse policies.
 *
 * The host umbrella: the plugin SDK (<sift/plugin.h>) and the host side
 * (stores, the OffloadEngine, model sources, the runner, the YAML config,
 * the policy registry). A policy includes <sift/plugin.h> only. */
#pragma once

#include <sift/plugin.h>
#include <sift/store.h>
#include <sift/engine.h>
#include <sift/model.h>
#include <sift/runner.h>
#include <sift/config.h>
#include <sift/registry.h>
#include <sift/cuda.h>
