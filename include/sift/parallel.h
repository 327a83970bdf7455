/* sift — a small persistent thread pool for parallel loops. */
#pragma once

#include <glib.h>
#include <sift/api.h>

G_BEGIN_DECLS

/* Body of a parallel loop: handles items [begin, end). `worker` is in
 * [0, sift_parallel_n_threads ()) and may index per-thread scratch. */
typedef void (*SiftParallelFunc) (gint64 begin, gint64 end, gint worker, gpointer user_data);

/* Runs fn over [0, n) split into contiguous ranges of at least `grain`
 * items, on the pool's threads and the caller's; returns when all are done.
 * Nested calls run serially on the calling thread. */
SIFT_API void sift_parallel_for (gint64 n, gint64 grain, SiftParallelFunc fn, gpointer user_data);

/* Threads used by parallel loops (the caller included). Default: the
 * SIFT_THREADS environment variable, else the number of online CPUs. */
SIFT_API gint sift_parallel_n_threads (void);
SIFT_API void sift_parallel_set_n_threads (gint n);

G_END_DECLS
