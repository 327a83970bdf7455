/* sift bench: dispatches to one benchmark. */
#include <stdio.h>
#include <string.h>

#include <glib.h>

#include "commands.h"

typedef struct {
  const char *name;
  int (*run) (int argc, char **argv);
  const char *summary;
} Bench;

static const Bench benches[] = {
  { "peak", sift_bench_peak, "fp32 FMA rate and memory read bandwidth of this machine" },
  { "attention", sift_bench_attention, "prefill and decode attention against the measured peak" },
  { "offload", sift_bench_offload, "store throughput and pipeline efficiency" },
  { "policy", sift_bench_policy, "a policy's speed against dense attention" },
  { "evict", sift_bench_evict, "bounded KV: token vs block eviction, sinks+window vs H2O" },
};

int
sift_cmd_bench (int argc, char **argv)
{
  if (argc >= 2)
    for (gsize i = 0; i < G_N_ELEMENTS (benches); i++)
      if (strcmp (argv[1], benches[i].name) == 0)
        return benches[i].run (argc - 1, argv + 1);
  FILE *to = argc >= 2 && strcmp (argv[1], "--help") == 0 ? stdout : stderr;
  fprintf (to, "Usage: sift bench BENCHMARK [OPTIONS]\n\nBenchmarks:\n");
  for (gsize i = 0; i < G_N_ELEMENTS (benches); i++)
    fprintf (to, "  %-10s %s\n", benches[i].name, benches[i].summary);
  return to == stdout ? 0 : 2;
}
