/* sift bench offload — not written yet (work in progress on another branch). */
#include <stdio.h>

#include "commands.h"

int
sift_bench_offload (int argc, char **argv)
{
  (void) argc;
  (void) argv;
  fprintf (stderr, "sift: 'sift bench offload' is not available in this build yet\n");
  return 2;
}
