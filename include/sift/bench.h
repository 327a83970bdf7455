/* sift — a policy's benchmark, run by `sift bench policy NAME`.
 *
 * A shipped policy's benchmark lives beside the policy
 * (policies/NAME/bench-NAME.c) and reaches the rest of sift only through
 * the public API and this table of what the `sift` command lends it: its
 * option parsing and error printing, the policy registry, the synthetic
 * model's Q/K/V (the needle harness's source, which libsift does not
 * export) and a CPU clock. SIFT_POLICY_BENCH_DEFINE declares the entry
 * point before defining it, so the `sift` command and the benchmark agree
 * on its prototype. */
#pragma once

#include <glib.h>
#include <sift/config.h>
#include <sift/registry.h>

G_BEGIN_DECLS

/* Exit statuses, those of every sift command. */
enum {
  SIFT_BENCH_EXIT_OK = 0,
  SIFT_BENCH_EXIT_USAGE = 2,  /* usage, config or plugin error */
  SIFT_BENCH_EXIT_FAILED = 3, /* a run failed */
};

typedef struct {
  guint32 struct_size;        /* sizeof (SiftBenchHost) as sift was built */
  const char *config_dir;     /* the shipped configs (the source tree's when uninstalled) */
  /* GOption parsing as every sift command does it (--help text; FALSE on
   * a usage error, already printed). */
  gboolean (*parse) (const char *command, const char *parameter_string, const GOptionEntry *entries, int *argc,
                     char ***argv);
  /* The registry: `policy_paths` (NULL-terminated, or NULL) first, then
   * SIFT_POLICY_PATH, then the build tree's or the installed policies. */
  SiftRegistry *(*registry) (const char *const *policy_paths);
  /* Prints an error as sift commands do; returns the exit status. */
  int (*fail) (const char *command, const GError *error);
  /* Q/K/V of layer 0 of the config's synthetic source (its seed and knobs,
   * no needle) for positions 0..n-1: query heads 0..q_heads-1 and the kv
   * heads they read. q: f32 [q_heads][n][head_dim]; k, v: f32 [kv][n][head_dim]. */
  gboolean (*synth_qkv) (const SiftConfig *config, gint32 q_heads, gint64 n, float *q, float *k, float *v,
                         GError **error);
  /* CPU seconds of every thread of this process so far. */
  double (*cpu_seconds) (void);
  /* model.seed of the config, the seed synth_qkv uses (the synthetic
   * model registers the key, so a config has no field for it). */
  guint64 (*synth_seed) (const SiftConfig *config);
} SiftBenchHost;

#define SIFT_POLICY_BENCH_DECLARE(name) \
  int sift_policy_bench_##name (const SiftBenchHost *host, int argc, char **argv)
/* Declares, then begins the definition of, policy NAME's benchmark. */
#define SIFT_POLICY_BENCH_DEFINE(name) \
  SIFT_POLICY_BENCH_DECLARE (name);    \
  SIFT_POLICY_BENCH_DECLARE (name)

G_END_DECLS
