/* sift bench policy subquadratic — not written yet (work in progress on another branch). */
#include <stdio.h>

#include "commands.h"

int
sift_bench_policy_subquadratic (int argc, char **argv)
{
  (void) argc;
  (void) argv;
  fprintf (stderr, "sift: 'sift bench policy subquadratic' is not available in this build yet\n");
  return 2;
}
