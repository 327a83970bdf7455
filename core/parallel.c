/* Parallel loops on a persistent thread pool.
 *
 * Workers are created the first time a loop needs them and then live until
 * the process exits, sleeping on a condition variable between loops. A loop
 * publishes its job under the pool lock and bumps a generation counter; each
 * worker wakes, sees the new generation, claims ranges of the index space
 * from an atomic counter until none is left, and reports back. The caller
 * claims ranges too, so a loop on T threads wakes T - 1 workers.
 *
 * One loop runs on the pool at a time. A loop started while another one runs
 * (from a different thread) or from inside a loop body runs serially on the
 * calling thread: never a deadlock, and the results are the same because
 * loop bodies must not depend on which thread runs which range. */
#include <pthread.h>

#include <sift/parallel.h>

typedef struct {
  SiftParallelFunc fn;
  gpointer user_data;
  gint64 n;
  gint64 chunk;         /* items claimed at a time */
} Job;

typedef struct {
  pthread_mutex_t lock; /* guards every field below but `next` */
  pthread_cond_t wake;  /* workers wait here for a new generation */
  pthread_cond_t done;  /* the caller waits here for running == 0 */
  GPtrArray *threads;   /* GThread *[n_workers] */
  guint64 generation;
  gint active;          /* workers 1..active take part in the current job */
  gint running;         /* of those, how many have not finished */
  Job job;
  gint64 next;          /* atomic: first unclaimed item of the job */
} Pool;

typedef struct {
  gint index;           /* 1..: the caller is worker 0 */
  guint64 generation;   /* the pool's generation when the worker was created */
} WorkerStart;

/* pthread rather than GMutex/GCond: GLib's futex-based locks are invisible
 * to ThreadSanitizer, which then reports every handshake as a race. */
static Pool pool = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .wake = PTHREAD_COND_INITIALIZER,
  .done = PTHREAD_COND_INITIALIZER,
};
static pthread_mutex_t submit_lock = PTHREAD_MUTEX_INITIALIZER; /* held while a loop runs on the pool */
static gint n_threads_set;    /* atomic: 0 = default */
static __thread gboolean in_loop; /* this thread runs a loop body */

static void
run_ranges (const Job *job, gint worker)
{
  for (;;)
    {
      gint64 begin = __atomic_fetch_add (&pool.next, job->chunk, __ATOMIC_RELAXED);
      if (begin >= job->n)
        break;
      job->fn (begin, MIN (begin + job->chunk, job->n), worker, job->user_data);
    }
}

static gpointer
worker_main (gpointer data)
{
  WorkerStart start = *(WorkerStart *) data;
  g_free (data);
  in_loop = TRUE; /* loops started from a body run serially */
  guint64 seen = start.generation;

  pthread_mutex_lock (&pool.lock);
  for (;;)
    {
      while (pool.generation == seen)
        pthread_cond_wait (&pool.wake, &pool.lock);
      seen = pool.generation;
      if (start.index > pool.active)
        continue;
      Job job = pool.job;
      pthread_mutex_unlock (&pool.lock);
      run_ranges (&job, start.index);
      pthread_mutex_lock (&pool.lock);
      if (--pool.running == 0)
        pthread_cond_signal (&pool.done);
    }
  return NULL; /* not reached: workers live as long as the process */
}

/* Called with pool.lock held. */
static void
ensure_workers (gint n)
{
  if (pool.threads == NULL)
    pool.threads = g_ptr_array_new ();
  while ((gint) pool.threads->len < n)
    {
      WorkerStart *start = g_new (WorkerStart, 1);
      start->index = (gint) pool.threads->len + 1;
      start->generation = pool.generation;
      g_autofree char *name = g_strdup_printf ("sift-worker-%d", start->index);
      g_ptr_array_add (pool.threads, g_thread_new (name, worker_main, start));
    }
}

void
sift_parallel_for (gint64 n, gint64 grain, SiftParallelFunc fn, gpointer user_data)
{
  g_return_if_fail (fn != NULL);
  if (n <= 0)
    return;
  grain = MAX (grain, 1);
  gint threads = sift_parallel_n_threads ();
  gint64 max_ranges = (n + grain - 1) / grain;
  if (threads <= 1 || max_ranges <= 1 || in_loop || pthread_mutex_trylock (&submit_lock) != 0)
    {
      gboolean was = in_loop;
      in_loop = TRUE;
      fn (0, n, 0, user_data);
      in_loop = was;
      return;
    }

  gint helpers = (gint) MIN ((gint64) threads, max_ranges) - 1;
  /* Ranges several times smaller than n / threads balance uneven items
   * (causal attention tiles) without many trips to the shared counter. */
  gint64 chunk = MAX (grain, n / ((gint64) (helpers + 1) * 4));
  Job job = { fn, user_data, n, chunk };

  pthread_mutex_lock (&pool.lock);
  ensure_workers (helpers);
  pool.job = job;
  __atomic_store_n (&pool.next, 0, __ATOMIC_RELAXED);
  pool.active = helpers;
  pool.running = helpers;
  pool.generation++;
  pthread_cond_broadcast (&pool.wake);
  pthread_mutex_unlock (&pool.lock);

  in_loop = TRUE;
  run_ranges (&job, 0);
  in_loop = FALSE;

  pthread_mutex_lock (&pool.lock);
  while (pool.running > 0)
    pthread_cond_wait (&pool.done, &pool.lock);
  pthread_mutex_unlock (&pool.lock);
  pthread_mutex_unlock (&submit_lock);
}

static gint
default_threads (void)
{
  const char *env = g_getenv ("SIFT_THREADS");
  if (env != NULL && *env != '\0')
    {
      char *end = NULL;
      gint64 v = g_ascii_strtoll (env, &end, 10);
      if (*end == '\0' && v >= 1 && v <= 1024)
        return (gint) v;
      g_warning ("SIFT_THREADS=%s is not a thread count in 1..1024; using the CPU count", env);
    }
  return MAX (1, (gint) g_get_num_processors ());
}

gint
sift_parallel_n_threads (void)
{
  gint n = g_atomic_int_get (&n_threads_set);
  if (n > 0)
    return n;
  n = default_threads ();
  /* Another thread may have set a count meanwhile: keep theirs. */
  g_atomic_int_compare_and_exchange (&n_threads_set, 0, n);
  return g_atomic_int_get (&n_threads_set);
}

/* n <= 0 goes back to the default (SIFT_THREADS, else the CPU count). */
void
sift_parallel_set_n_threads (gint n)
{
  g_atomic_int_set (&n_threads_set, n > 0 ? MIN (n, 1024) : default_threads ());
}
