/* Run-time version. */
#include <sift/version.h>

const char *
sift_version_string (void)
{
  return SIFT_VERSION_STRING;
}
