/* Parallel loops. PLACEHOLDER: runs serially until the thread pool lands. */
#include <sift/parallel.h>

static gint n_threads = 1;

void
sift_parallel_for (gint64 n, gint64 grain, SiftParallelFunc fn, gpointer user_data)
{
  (void) grain;
  if (n > 0)
    fn (0, n, 0, user_data);
}

gint
sift_parallel_n_threads (void)
{
  return n_threads;
}

void
sift_parallel_set_n_threads (gint n)
{
  (void) n;
}
