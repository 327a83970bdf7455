/* The copy worker: one thread per engine that runs loads (store -> ring
 * slot or cross-layer half, converting the stored dtype) and stores
 * (compute buffer -> store) in FIFO order, and the waits on them: a waiting
 * compute thread spins briefly, then helps by running the queued job
 * itself, then sleeps. See docs/engine.md, "Buffers, slots, the copy
 * worker". */
#include <stdlib.h>
#include <string.h>

#include <sift/memory.h>

#include "engine-private.h"

/* Hand-offs in a streaming pipeline are microseconds apart (a 64 KiB block
 * loads in ~4 us, a group of blocks is attended in ~10 us), less than a
 * thread sleeping on a condition variable takes to wake: the loads and the
 * compute then run one after the other. So a thread about to wait first
 * spins, briefly, on a sequence number that the awaited event bumps (an
 * atomic; the state itself is still read under the lock). A spin that
 * times out — the event is far off, or the thread it waits for has no CPU
 * (a loaded machine) — backs off: the next 1, 3, 7 ... 63 waits sleep at
 * once, so a starved or long-gapped pipeline wastes no CPU spinning.
 * 100 us: with 8/2 heads x 128 and 4 rows a group's attention outlasts
 * its loads by ~40 us, and a worker that slept there (40 us spins) left
 * the pipeline at 1.22 instead of ~1.1 (docs/benchmarks.md). */
#define SPIN_US 100

static inline void
cpu_relax (void)
{
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause ();
#endif
}

static gboolean
spin_allowed (SpinState *sp)
{
  if (sp->skip == 0)
    return TRUE;
  sp->skip--;
  return FALSE;
}

static void
spin_outcome (SpinState *sp, gboolean success)
{
  sp->backoff = success ? 0 : MIN (sp->backoff * 2 + 1, 63);
  sp->skip = sp->backoff;
}

/* Spins until *seq differs from `seen` (TRUE) or max_us pass (FALSE). */
static gboolean
spin_for_change (const guint64 *seq, guint64 seen, gint64 max_us)
{
  gint64 end = 0;
  for (guint i = 0;; i++)
    {
      if (__atomic_load_n (seq, __ATOMIC_ACQUIRE) != seen)
        return TRUE;
      cpu_relax ();
      if ((i & 31) == 31)
        {
          gint64 now = g_get_monotonic_time ();
          if (end == 0)
            end = now + max_us;
          else if (now >= end)
            return FALSE;
        }
    }
}

/* Converts one half (K or V) from the stored layout [heads][block][row] to
 * a compute-side destination of `cap` tokens per head. */
static void
unpack_half (SiftEngine *e, const guint8 *stored, guint8 *dst, gint64 cap)
{
  const SiftModelShape *s = &e->config.shape;
  const gsize head_stored = (gsize) s->block_size * sift_store_row_bytes (e->store);
  const gsize n = (gsize) s->block_size * (gsize) s->head_dim;
  if (cap == s->block_size)
    {
      sift_convert (stored, e->store->config.dtype, dst, e->config.compute_dtype, n * (gsize) s->n_kv_heads);
      return;
    }
  for (gint32 h = 0; h < s->n_kv_heads; h++)
    sift_convert (stored + h * head_stored, e->store->config.dtype,
                  dst + (gsize) h * (gsize) cap * (gsize) s->head_dim * e->es, e->config.compute_dtype, n);
}

static void
pack_half (SiftEngine *e, const guint8 *src, gint64 cap, guint8 *stored)
{
  const SiftModelShape *s = &e->config.shape;
  const gsize head_stored = (gsize) s->block_size * sift_store_row_bytes (e->store);
  const gsize n = (gsize) s->block_size * (gsize) s->head_dim;
  if (cap == s->block_size) /* both layouts are the same contiguous run */
    {
      sift_convert (src, e->config.compute_dtype, stored, e->store->config.dtype, n * (gsize) s->n_kv_heads);
      return;
    }
  for (gint32 h = 0; h < s->n_kv_heads; h++)
    sift_convert (src + (gsize) h * (gsize) cap * (gsize) s->head_dim * e->es, e->config.compute_dtype,
                  stored + h * head_stored, e->store->config.dtype, n);
}


/* Performs one load; returns the bytes read from the store. */
static gboolean
do_load (SiftEngine *e, const Job *j, guint8 *staging, guint64 *bytes, GError **error)
{
  SiftStore *st = e->store;
  const gsize kb = st->k_bytes;
  const gboolean want_k = (j->what & SIFT_LOAD_K) != 0, want_v = (j->what & SIFT_LOAD_V) != 0;
  const gsize off = want_k ? 0 : kb;
  const gsize n = (want_k && want_v) ? 2 * kb : kb;
  *bytes = n;
  /* Same dtype into a slot (V right after K, the stored layout): straight in. */
  if (st->config.dtype == e->config.compute_dtype && j->cap == e->config.shape.block_size && j->v == j->k + kb)
    return sift_store_read (st, j->store_id, off, want_k ? j->k : j->v, n, error);
  /* Same dtype from a store without a backing file (RAM) into the
   * cross-layer buffer: each head's rows straight into place, one copy. A
   * file is read whole into staging (one request) and converted or spread
   * from there. */
  if (st->config.dtype == e->config.compute_dtype && st->config.path == NULL)
    {
      const SiftModelShape *s = &e->config.shape;
      const gsize head = (gsize) s->block_size * (gsize) s->head_dim * e->es;
      for (int half = 0; half < 2; half++)
        {
          if (!(half == 0 ? want_k : want_v))
            continue;
          guint8 *dst = half == 0 ? j->k : j->v;
          for (gint32 h = 0; h < s->n_kv_heads; h++)
            if (!sift_store_read (st, j->store_id, (gsize) half * kb + (gsize) h * head,
                                  dst + (gsize) h * (gsize) j->cap * (gsize) s->head_dim * e->es, head, error))
              return FALSE;
        }
      return TRUE;
    }
  if (!sift_store_read (st, j->store_id, off, staging, n, error))
    return FALSE;
  if (want_k)
    unpack_half (e, staging, j->k, j->cap);
  if (want_v)
    unpack_half (e, staging + (want_k ? kb : 0), j->v, j->cap);
  return TRUE;
}

static gboolean
do_store (SiftEngine *e, const Job *j, guint8 *staging, GError **error)
{
  pack_half (e, j->k, j->cap, staging);
  pack_half (e, j->v, j->cap, staging + e->store->k_bytes);
  return sift_store_write (e->store, j->store_id, staging, error);
}

/* Waits (lock held) for the worker to finish a job. */
void
sift_engine_wait_done_locked (SiftEngine *e)
{
  /* Never wait on work the worker was not told about. */
  if (e->worker_idle && !g_queue_is_empty (&e->jobs))
    pthread_cond_signal (&e->work_cond);
  /* A job is running: it likely ends within microseconds. */
  if (e->running > 0 && spin_allowed (&e->waiter_spin))
    {
      guint64 seen = e->done_seq;
      pthread_mutex_unlock (&e->lock);
      gboolean changed = spin_for_change (&e->done_seq, seen, SPIN_US);
      pthread_mutex_lock (&e->lock);
      spin_outcome (&e->waiter_spin, changed);
      if (changed || e->done_seq != seen)
        return;
    }
  e->done_waiters++;
  pthread_cond_wait (&e->done_cond, &e->lock);
  e->done_waiters--;
}

/* Runs a popped job (lock held on entry and exit, released meanwhile) and
 * records its outcome: slot or half state, counters, sticky store error. */
static void
run_job_locked (SiftEngine *e, Job *j, guint8 *staging)
{
  e->running++;
  if (j->kind == JOB_STORE)
    e->running_stores++;
  /* A failed store stops later stores (nothing after it is written), so a
   * run that failed never leaves a half-updated cache behind. */
  gboolean skip = j->kind == JOB_STORE && e->store_error != NULL;
  pthread_mutex_unlock (&e->lock);

  GError *err = NULL;
  guint64 bytes = 0;
  gint64 t0 = g_get_monotonic_time ();
  gboolean ok = TRUE;
  if (!skip)
    ok = j->kind == JOB_LOAD ? do_load (e, j, staging, &bytes, &err) : do_store (e, j, staging, &err);
  gdouble secs = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC;

  pthread_mutex_lock (&e->lock);
  SiftCounters *c = sift_engine_counters_at (e, j->layer, j->phase);
  if (j->kind == JOB_LOAD)
    {
      if (ok)
        {
          c->bytes_loaded += bytes;
          c->seconds_load += secs;
        }
      if (j->slot >= 0)
        {
          Slot *s = &e->slots[j->slot];
          s->state = ok ? SLOT_READY : SLOT_FAILED;
          s->error = err;
        }
      else
        {
          XlHalf *x = &e->xl[j->half];
          x->pending--;
          if (err != NULL && x->error == NULL)
            x->error = err;
          else
            g_clear_error (&err);
        }
    }
  else
    {
      if (ok && !skip)
        c->bytes_stored += e->store->block_bytes;
      if (err != NULL && e->store_error == NULL)
        e->store_error = err;
      else
        g_clear_error (&err);
      e->stores_pending[j->layer]--;
      e->running_stores--;
    }
  e->running--;
  g_free (j);
  __atomic_add_fetch (&e->done_seq, 1, __ATOMIC_RELEASE);
  if (e->done_waiters > 0)
    pthread_cond_broadcast (&e->done_cond);
}

/* The compute side, about to wait for a load or a store, runs the next
 * queued job itself: a load when no store is running (a load never
 * overtakes a store that precedes it), a store when nothing is running
 * (the worker pops nothing until it is done, so stores stay one at a time
 * and in order, and a failed one still stops every later one). A loaded
 * machine may take long to schedule the worker, and the data is wanted now.
 * Returns FALSE when there was nothing to take (then wait). Lock held. */
gboolean
sift_engine_help_locked (SiftEngine *e)
{
  Job *head = g_queue_peek_head (&e->jobs);
  if (head == NULL)
    return FALSE;
  if (head->kind == JOB_LOAD && e->running_stores == 0)
    {
      g_queue_pop_head (&e->jobs);
      run_job_locked (e, head, e->help_staging);
      return TRUE;
    }
  if (head->kind != JOB_STORE || e->running > 0)
    return FALSE;
  g_queue_pop_head (&e->jobs);
  e->helping_store = TRUE;
  run_job_locked (e, head, e->help_staging);
  e->helping_store = FALSE;
  if (e->worker_idle && !g_queue_is_empty (&e->jobs))
    pthread_cond_signal (&e->work_cond);
  return TRUE;
}

static gpointer
worker_main (gpointer data)
{
  SiftEngine *e = data;
  pthread_mutex_lock (&e->lock);
  for (;;)
    {
      if (g_queue_is_empty (&e->jobs) && !e->quit && spin_allowed (&e->worker_spin))
        {
          guint64 seen = e->queue_seq;
          pthread_mutex_unlock (&e->lock);
          gboolean got = spin_for_change (&e->queue_seq, seen, SPIN_US);
          pthread_mutex_lock (&e->lock);
          spin_outcome (&e->worker_spin, got);
        }
      while ((g_queue_is_empty (&e->jobs) || e->helping_store) && !e->quit)
        {
          e->worker_idle = TRUE;
          pthread_cond_wait (&e->work_cond, &e->lock);
          e->worker_idle = FALSE;
        }
      if (g_queue_is_empty (&e->jobs))
        break;
      run_job_locked (e, g_queue_pop_head (&e->jobs), e->staging);
    }
  pthread_mutex_unlock (&e->lock);
  return NULL;
}

/* Queues j (the engine lock held) and marks what it will fill as pending. */
void
sift_engine_push_job_locked (SiftEngine *e, Job *j)
{
  if (j->kind == JOB_STORE)
    e->stores_pending[j->layer]++;
  else if (j->slot >= 0)
    e->slots[j->slot].state = SLOT_LOADING;
  else
    e->xl[j->half].pending++;
  g_queue_push_tail (&e->jobs, j);
}

/* Tells the worker (spinning or asleep) that jobs were queued. */
void
sift_engine_wake_worker_locked (SiftEngine *e)
{
  __atomic_add_fetch (&e->queue_seq, 1, __ATOMIC_RELEASE);
  if (e->worker_idle && e->hold_wake == 0)
    pthread_cond_signal (&e->work_cond);
}

void
sift_engine_queue_job (SiftEngine *e, Job *j)
{
  pthread_mutex_lock (&e->lock);
  sift_engine_push_job_locked (e, j);
  sift_engine_wake_worker_locked (e);
  pthread_mutex_unlock (&e->lock);
}

void
sift_engine_hold_wake (SiftEngine *e, gboolean hold)
{
  pthread_mutex_lock (&e->lock);
  e->hold_wake += hold ? 1 : -1;
  if (e->hold_wake == 0 && e->worker_idle && !g_queue_is_empty (&e->jobs))
    pthread_cond_signal (&e->work_cond);
  pthread_mutex_unlock (&e->lock);
}

/* Waits (lock held) until the layer's buffers are no longer read by
 * stores; the wait counts as stalled time of the current phase. */
void
sift_engine_wait_stores_locked (SiftEngine *e, gint32 layer)
{
  if (e->stores_pending[layer] == 0)
    return;
  gint64 t0 = g_get_monotonic_time ();
  while (e->stores_pending[layer] > 0)
    if (!sift_engine_help_locked (e))
      sift_engine_wait_done_locked (e);
  sift_engine_counters_at (e, layer, e->phase)->seconds_stalled
    += (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC;
}

void
sift_engine_wait_idle_locked (SiftEngine *e)
{
  while (!g_queue_is_empty (&e->jobs) || e->running > 0)
    sift_engine_wait_done_locked (e);
}

gboolean
sift_engine_store_error_locked (SiftEngine *e, GError **error)
{
  if (e->store_error == NULL)
    return TRUE;
  g_set_error (error, e->store_error->domain, e->store_error->code, "%s", e->store_error->message);
  return FALSE;
}

gboolean
sift_engine_wait_layer (SiftEngine *e, gint32 layer, GError **error)
{
  pthread_mutex_lock (&e->lock);
  sift_engine_wait_stores_locked (e, layer);
  gboolean ok = sift_engine_store_error_locked (e, error);
  pthread_mutex_unlock (&e->lock);
  return ok;
}

gboolean
sift_engine_sync (SiftEngine *e, GError **error)
{
  pthread_mutex_lock (&e->lock);
  for (gint32 l = 0; l < e->config.shape.n_layers; l++)
    sift_engine_wait_stores_locked (e, l);
  gboolean ok = sift_engine_store_error_locked (e, error);
  pthread_mutex_unlock (&e->lock);
  return ok;
}

/* Zeroed, 4096-byte aligned (O_DIRECT's staging); from 2 MiB on
 * sift_mem_alloc's huge pages (2 MiB aligned). Freed with free (). */
void *
sift_engine_buffer_new0 (gsize n)
{
  void *p = NULL;
  if (n >= SIFT_HUGE_PAGE_BYTES)
    p = sift_mem_alloc (n);
  else if (posix_memalign (&p, 4096, MAX (n, 1)) != 0)
    p = NULL;
  if (p == NULL)
    g_error ("engine: out of memory (%" G_GSIZE_FORMAT " bytes)", n);
  memset (p, 0, MAX (n, 1));
  return p;
}


void
sift_engine_worker_start (SiftEngine *e)
{
  const gsize staging = (e->store->block_bytes + 4095) / 4096 * 4096;
  e->stores_pending = g_new0 (gint32, e->config.shape.n_layers);
  e->staging = sift_engine_buffer_new0 (staging);
  e->help_staging = sift_engine_buffer_new0 (staging);
  pthread_cond_init (&e->work_cond, NULL);
  pthread_cond_init (&e->done_cond, NULL);
  g_queue_init (&e->jobs);
  e->worker = g_thread_new ("sift-copy", worker_main, e);
}

void
sift_engine_worker_stop (SiftEngine *e)
{
  pthread_mutex_lock (&e->lock);
  e->quit = TRUE;
  pthread_cond_signal (&e->work_cond);
  pthread_mutex_unlock (&e->lock);
  g_thread_join (e->worker);
  pthread_cond_destroy (&e->work_cond);
  pthread_cond_destroy (&e->done_cond);
  g_free (e->stores_pending);
  free (e->staging);
  free (e->help_staging);
}
