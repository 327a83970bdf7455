/* placeholder while the glue is written */
#include <sift/policy.h>
