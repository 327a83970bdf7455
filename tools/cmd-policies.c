/* sift policies — not written yet (work in progress on another branch). */
#include <stdio.h>

#include "commands.h"

int
sift_cmd_policies (int argc, char **argv)
{
  (void) argc;
  (void) argv;
  fprintf (stderr, "sift: 'sift policies' is not available in this build yet\n");
  return 2;
}
