/* sift bench policy minference — not written yet (work in progress on another branch). */
#include <stdio.h>

#include "commands.h"

int
sift_bench_policy_minference (int argc, char **argv)
{
  (void) argc;
  (void) argv;
  fprintf (stderr, "sift: 'sift bench policy minference' is not available in this build yet\n");
  return 2;
}
