/* sift version */
#include <stdio.h>

#include <sift/sift.h>

#include "commands.h"

int
sift_cmd_version (int argc, char **argv)
{
  (void) argc;
  (void) argv;
  printf ("sift %s (kernels: %s, policy ABI %d.%d)\n", sift_version_string (),
          sift_isa_name (sift_isa_active ()), SIFT_POLICY_ABI_MAJOR, SIFT_POLICY_ABI_MINOR);
  return 0;
}
