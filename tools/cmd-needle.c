/* sift needle — not written yet (work in progress on another branch). */
#include <stdio.h>

#include "commands.h"

int
sift_cmd_needle (int argc, char **argv)
{
  (void) argc;
  (void) argv;
  fprintf (stderr, "sift: 'sift needle' is not available in this build yet\n");
  return 2;
}
