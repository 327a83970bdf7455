/* sift bench policy NAME: dispatches to one policy's benchmark. */
#include <stdio.h>
#include <string.h>

#include <glib.h>

#include "commands.h"

typedef struct {
  const char *name;
  int (*run) (int argc, char **argv);
} PolicyBench;

static const PolicyBench benches[] = {
  { "quest", sift_bench_policy_quest },
  { "minference", sift_bench_policy_minference },
  { "xattn_bsa", sift_bench_policy_xattn_bsa },
  { "subquadratic", sift_bench_policy_subquadratic },
};

int
sift_bench_policy (int argc, char **argv)
{
  if (argc >= 2)
    for (gsize i = 0; i < G_N_ELEMENTS (benches); i++)
      if (strcmp (argv[1], benches[i].name) == 0)
        return benches[i].run (argc - 1, argv + 1);
  fprintf (stderr, "Usage: sift bench policy NAME [OPTIONS]\n\nPolicies:\n");
  for (gsize i = 0; i < G_N_ELEMENTS (benches); i++)
    fprintf (stderr, "  %s\n", benches[i].name);
  return 2;
}
