/* sift bench attention — not written yet (work in progress on another branch). */
#include <stdio.h>

#include "commands.h"

int
sift_bench_attention (int argc, char **argv)
{
  (void) argc;
  (void) argv;
  fprintf (stderr, "sift: 'sift bench attention' is not available in this build yet\n");
  return 2;
}
