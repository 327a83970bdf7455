/* sift bench policy NAME: dispatches to one policy's benchmark, which lives
 * beside the policy (policies/NAME/bench-NAME.c) and sees the command only
 * through the SiftBenchHost lent here (<sift/bench.h>). */
#include <stdio.h>
#include <string.h>

#include <glib.h>
#include <sift/bench.h>

#include "bench-peak.h"
#include "bench-synth.h"
#include "cli.h"
#include "commands.h"
#include "sift-paths.h"

SIFT_POLICY_BENCH_DECLARE (quest);
SIFT_POLICY_BENCH_DECLARE (minference);
SIFT_POLICY_BENCH_DECLARE (xattn_bsa);
SIFT_POLICY_BENCH_DECLARE (subquadratic);

typedef struct {
  const char *name;
  int (*run) (const SiftBenchHost *host, int argc, char **argv);
} PolicyBench;

static const PolicyBench benches[] = {
  { "quest", sift_policy_bench_quest },
  { "minference", sift_policy_bench_minference },
  { "xattn_bsa", sift_policy_bench_xattn_bsa },
  { "subquadratic", sift_policy_bench_subquadratic },
};

static SiftRegistry *
registry (const char *const *policy_paths)
{
  SiftCliOptions opts = { .policy_paths = (char **) policy_paths };
  return sift_cli_registry (&opts);
}

int
sift_bench_policy (int argc, char **argv)
{
  static const SiftBenchHost host = {
    .struct_size = sizeof (SiftBenchHost),
    .config_dir = SIFT_SOURCE_CONFIG_DIR,
    .parse = sift_cli_parse,
    .registry = registry,
    .fail = sift_cli_fail,
    .synth_qkv = sift_bench_synth_qkv,
    .synth_seed = sift_synthetic_seed,
    .cpu_seconds = sift_bench_cpu_seconds,
  };
  if (argc >= 2)
    for (gsize i = 0; i < G_N_ELEMENTS (benches); i++)
      if (strcmp (argv[1], benches[i].name) == 0)
        return benches[i].run (&host, argc - 1, argv + 1);
  fprintf (stderr, "Usage: sift bench policy NAME [OPTIONS]\n\nPolicies:\n");
  for (gsize i = 0; i < G_N_ELEMENTS (benches); i++)
    fprintf (stderr, "  %s\n", benches[i].name);
  return 2;
}
