/* sift config — not written yet (work in progress on another branch). */
#include <stdio.h>

#include "commands.h"

int
sift_cmd_config (int argc, char **argv)
{
  (void) argc;
  (void) argv;
  fprintf (stderr, "sift: 'sift config' is not available in this build yet\n");
  return 2;
}
