/* sift bench peak — not written yet (work in progress on another branch). */
#include <stdio.h>

#include "commands.h"

int
sift_bench_peak (int argc, char **argv)
{
  (void) argc;
  (void) argv;
  fprintf (stderr, "sift: 'sift bench peak' is not available in this build yet\n");
  return 2;
}
