/* sift bench policy quest — not written yet (work in progress on another branch). */
#include <stdio.h>

#include "commands.h"

int
sift_bench_policy_quest (int argc, char **argv)
{
  (void) argc;
  (void) argv;
  fprintf (stderr, "sift: 'sift bench policy quest' is not available in this build yet\n");
  return 2;
}
