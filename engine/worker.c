/* The CPU backend's copy worker: one thread per engine that runs the
 * submitted transfers — loads (store -> compute memory, converting the
 * stored dtype) and stores (compute memory -> store) — in FIFO order, and
 * the waits on their events: a waiting compute thread spins briefly, then
 * helps by running the queued transfer itself, then sleeps. See
 * docs/engine.md, "Buffers, slots, the copy worker". */
#include <stdlib.h>
#include <string.h>

#include "backend-cpu-private.h"

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
unpack_half (CpuBackend *b, const guint8 *stored, guint8 *dst, gint64 cap)
{
  const SiftModelShape *s = &b->shape;
  const gsize head_stored = (gsize) s->block_size * sift_store_row_bytes (b->store);
  const gsize n = (gsize) s->block_size * (gsize) s->head_dim;
  if (cap == s->block_size)
    {
      sift_convert (stored, b->store->config.dtype, dst, b->compute, n * (gsize) s->n_kv_heads);
      return;
    }
  for (gint32 h = 0; h < s->n_kv_heads; h++)
    sift_convert (stored + h * head_stored, b->store->config.dtype,
                  dst + (gsize) h * (gsize) cap * (gsize) s->head_dim * b->es, b->compute, n);
}

static void
pack_half (CpuBackend *b, const guint8 *src, gint64 cap, guint8 *stored)
{
  const SiftModelShape *s = &b->shape;
  const gsize head_stored = (gsize) s->block_size * sift_store_row_bytes (b->store);
  const gsize n = (gsize) s->block_size * (gsize) s->head_dim;
  if (cap == s->block_size) /* both layouts are the same contiguous run */
    {
      sift_convert (src, b->compute, stored, b->store->config.dtype, n * (gsize) s->n_kv_heads);
      return;
    }
  for (gint32 h = 0; h < s->n_kv_heads; h++)
    sift_convert (src + (gsize) h * (gsize) cap * (gsize) s->head_dim * b->es, b->compute,
                  stored + h * head_stored, b->store->config.dtype, n);
}


/* A load of some kv heads only (j->kv_heads): each run of wanted heads is
 * one read per half, straight into place in the same dtype, else through
 * staging and converted; the other heads' rows are not touched. */
static gboolean
load_heads (CpuBackend *b, const SiftTransfer *j, gboolean want_k, gboolean want_v, guint8 *staging,
            guint64 *bytes, GError **error)
{
  SiftStore *st = b->store;
  const SiftModelShape *s = &b->shape;
  const gsize head_stored = (gsize) s->block_size * sift_store_row_bytes (st);
  const gsize n = (gsize) s->block_size * (gsize) s->head_dim;
  const gsize head_dst = (gsize) j->cap * (gsize) s->head_dim * b->es;
  const gboolean same = st->config.dtype == b->compute && j->cap == s->block_size;
  *bytes = 0;
  for (gint32 h0, h1 = 0; sift_kv_heads_next (j->kv_heads, s->n_kv_heads, &h0, &h1);)
    {
      const gsize nh = (gsize) (h1 - h0);
      for (int half = 0; half < 2; half++)
        {
          if (!(half == 0 ? want_k : want_v))
            continue;
          const gsize off = (gsize) half * st->k_bytes + (gsize) h0 * head_stored;
          guint8 *dst = (half == 0 ? j->k : j->v) + (gsize) h0 * head_dst;
          /* In place (the host store): converted (or copied) from there. */
          const guint8 *src;
          if (!sift_store_peek (st, j->store_id, off, nh * head_stored, &src, error))
            return FALSE;
          *bytes += nh * head_stored;
          if (src == NULL)
            {
              if (!sift_store_read (st, j->store_id, off, same ? dst : staging, nh * head_stored, error))
                return FALSE;
              if (same)
                continue;
              src = staging;
            }
          else if (same)
            {
              memcpy (dst, src, nh * head_stored);
              continue;
            }
          for (gsize h = 0; h < nh; h++)
            sift_convert (src + h * head_stored, st->config.dtype, dst + h * head_dst, b->compute, n);
        }
    }
  return TRUE;
}

/* Performs one load; returns the bytes read from the store. */
static gboolean
do_load (CpuBackend *b, const SiftTransfer *j, guint8 *staging, guint64 *bytes, GError **error)
{
  SiftStore *st = b->store;
  const gsize kb = st->k_bytes;
  const gboolean want_k = (j->what & SIFT_LOAD_K) != 0, want_v = (j->what & SIFT_LOAD_V) != 0;
  const gint32 nkv = b->shape.n_kv_heads;
  if (sift_transfer_some_heads (j, nkv))
    return load_heads (b, j, want_k, want_v, staging, bytes, error);
  const gsize off = want_k ? 0 : kb;
  const gsize n = (want_k && want_v) ? 2 * kb : kb;
  *bytes = n;
  /* Same dtype into a slot (V right after K, the stored layout): straight in. */
  if (st->config.dtype == b->compute && j->cap == b->shape.block_size && j->v == j->k + kb)
    return sift_store_read (st, j->store_id, off, want_k ? j->k : j->v, n, error);
  /* Same dtype from a store without a backing file (RAM) into the
   * cross-layer buffer: each head's rows straight into place, one copy. A
   * file is read whole into staging (one request) and converted or spread
   * from there. */
  if (st->config.dtype == b->compute && st->config.path == NULL)
    {
      const SiftModelShape *s = &b->shape;
      const gsize head = (gsize) s->block_size * (gsize) s->head_dim * b->es;
      for (int half = 0; half < 2; half++)
        {
          if (!(half == 0 ? want_k : want_v))
            continue;
          guint8 *dst = half == 0 ? j->k : j->v;
          for (gint32 h = 0; h < s->n_kv_heads; h++)
            if (!sift_store_read (st, j->store_id, (gsize) half * kb + (gsize) h * head,
                                  dst + (gsize) h * (gsize) j->cap * (gsize) s->head_dim * b->es, head, error))
              return FALSE;
        }
      return TRUE;
    }
  if (!sift_store_read (st, j->store_id, off, staging, n, error))
    return FALSE;
  if (want_k)
    unpack_half (b, staging, j->k, j->cap);
  if (want_v)
    unpack_half (b, staging + (want_k ? kb : 0), j->v, j->cap);
  return TRUE;
}

static gboolean
do_store (CpuBackend *b, const SiftTransfer *j, guint8 *staging, GError **error)
{
  pack_half (b, j->k, j->cap, staging);
  pack_half (b, j->v, j->cap, staging + b->store->k_bytes);
  return sift_store_write (b->store, j->store_id, staging, error);
}

/* Waits (lock held) for the worker to finish a transfer. */
static void
wait_done_locked (CpuBackend *b)
{
  /* Never wait on work the worker was not told about. */
  if (b->worker_idle && !g_queue_is_empty (&b->jobs))
    pthread_cond_signal (&b->work_cond);
  /* A transfer is running: it likely ends within microseconds. */
  if (b->running > 0 && spin_allowed (&b->waiter_spin))
    {
      guint64 seen = b->done_seq;
      pthread_mutex_unlock (&b->lock);
      gboolean changed = spin_for_change (&b->done_seq, seen, SPIN_US);
      pthread_mutex_lock (&b->lock);
      spin_outcome (&b->waiter_spin, changed);
      if (changed || b->done_seq != seen)
        return;
    }
  b->done_waiters++;
  pthread_cond_wait (&b->done_cond, &b->lock);
  b->done_waiters--;
}

/* Runs a popped transfer (lock held on entry and exit, released meanwhile),
 * tells the sink, then completes its event. */
static void
run_job_locked (CpuBackend *b, SiftTransfer *j, guint8 *staging)
{
  b->running++;
  if (j->kind == SIFT_TRANSFER_STORE)
    b->running_stores++;
  /* A failed store stops later stores (nothing after it is written), so a
   * run that failed never leaves a half-updated cache behind. */
  gboolean skip = j->kind == SIFT_TRANSFER_STORE && b->store_failed;
  pthread_mutex_unlock (&b->lock);

  GError *err = NULL;
  guint64 bytes = 0;
  gint64 t0 = g_get_monotonic_time ();
  gboolean ok = TRUE;
  if (j->kind == SIFT_TRANSFER_LOAD)
    ok = do_load (b, j, staging, &bytes, &err);
  else if (!skip && (ok = do_store (b, j, staging, &err)))
    bytes = b->store->block_bytes;
  gdouble secs = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC;
  b->parent.setup.sink.done (b->parent.setup.sink.user, j, ok, bytes, secs, err);

  pthread_mutex_lock (&b->lock);
  if (j->kind == SIFT_TRANSFER_STORE)
    {
      b->store_failed = b->store_failed || !ok;
      b->running_stores--;
    }
  SiftEvent *ev = j->event;
  ev->pending--;
  if (err != NULL && ev->error == NULL)
    ev->error = err;
  else
    g_clear_error (&err);
  b->running--;
  g_free (j);
  __atomic_add_fetch (&b->done_seq, 1, __ATOMIC_RELEASE);
  if (b->done_waiters > 0)
    pthread_cond_broadcast (&b->done_cond);
}

/* The compute side, about to wait for a transfer, runs the next queued one
 * itself: a load when no store is running (a load never overtakes a store
 * that precedes it), a store when nothing is running (the worker pops
 * nothing until it is done, so stores stay one at a time and in order, and
 * a failed one still stops every later one). A loaded machine may take long
 * to schedule the worker, and the data is wanted now. Returns FALSE when
 * there was nothing to take (then wait). Lock held. */
static gboolean
help_locked (CpuBackend *b)
{
  SiftTransfer *head = g_queue_peek_head (&b->jobs);
  if (head == NULL)
    return FALSE;
  if (head->kind == SIFT_TRANSFER_LOAD && b->running_stores == 0)
    {
      g_queue_pop_head (&b->jobs);
      run_job_locked (b, head, b->help_staging);
      return TRUE;
    }
  if (head->kind != SIFT_TRANSFER_STORE || b->running > 0)
    return FALSE;
  g_queue_pop_head (&b->jobs);
  b->helping_store = TRUE;
  run_job_locked (b, head, b->help_staging);
  b->helping_store = FALSE;
  if (b->worker_idle && !g_queue_is_empty (&b->jobs))
    pthread_cond_signal (&b->work_cond);
  return TRUE;
}

static gpointer
worker_main (gpointer data)
{
  CpuBackend *b = data;
  pthread_mutex_lock (&b->lock);
  for (;;)
    {
      if (g_queue_is_empty (&b->jobs) && !b->quit && spin_allowed (&b->worker_spin))
        {
          guint64 seen = b->queue_seq;
          pthread_mutex_unlock (&b->lock);
          gboolean got = spin_for_change (&b->queue_seq, seen, SPIN_US);
          pthread_mutex_lock (&b->lock);
          spin_outcome (&b->worker_spin, got);
        }
      while ((g_queue_is_empty (&b->jobs) || b->helping_store) && !b->quit)
        {
          b->worker_idle = TRUE;
          pthread_cond_wait (&b->work_cond, &b->lock);
          b->worker_idle = FALSE;
        }
      if (g_queue_is_empty (&b->jobs))
        break;
      run_job_locked (b, g_queue_pop_head (&b->jobs), b->staging);
    }
  pthread_mutex_unlock (&b->lock);
  return NULL;
}

/* A load of some kv heads only, of at most INLINE_LOAD_BYTES stored: it
 * takes about what handing it to the worker takes (a wake-up, a spin). */
#define INLINE_LOAD_BYTES (32 * 1024)

static gboolean
small_partial_load (const CpuBackend *b, const SiftTransfer *t)
{
  const gint32 nkv = b->shape.n_kv_heads;
  if (t->kind != SIFT_TRANSFER_LOAD || !sift_transfer_some_heads (t, nkv))
    return FALSE;
  const gsize halves = (t->what & SIFT_LOAD_K ? 1 : 0) + (t->what & SIFT_LOAD_V ? 1 : 0);
  const gsize head = (gsize) b->shape.block_size * sift_store_row_bytes (b->store);
  return (gsize) __builtin_popcountll (t->kv_heads & sift_kv_heads_all (nkv)) * head * halves <= INLINE_LOAD_BYTES;
}

void
sift_cpu_submit (SiftBackend *backend, const SiftTransfer *t, gsize n)
{
  CpuBackend *b = (CpuBackend *) backend;
  pthread_mutex_lock (&b->lock);
  gsize i = 0;
  /* Small partial loads (a per-head selection's pieces) run here while
   * the worker has nothing queued or running, so none can overtake a
   * store: no hand-off and no wake-up for a few microseconds of copying.
   * The submitting thread is the one that waits, so help_staging is free. */
  for (; i < n && g_queue_is_empty (&b->jobs) && b->running == 0 && small_partial_load (b, &t[i]); i++)
    {
      t[i].event->pending++;
      run_job_locked (b, g_memdup2 (&t[i], sizeof t[i]), b->help_staging);
    }
  if (i == n)
    {
      pthread_mutex_unlock (&b->lock);
      return;
    }
  for (; i < n; i++)
    {
      t[i].event->pending++;
      g_queue_push_tail (&b->jobs, g_memdup2 (&t[i], sizeof t[i]));
    }
  /* Tell the worker (spinning or asleep), once for the batch. */
  __atomic_add_fetch (&b->queue_seq, 1, __ATOMIC_RELEASE);
  if (b->worker_idle)
    pthread_cond_signal (&b->work_cond);
  pthread_mutex_unlock (&b->lock);
}

SiftEvent *
sift_cpu_event_new (SiftBackend *backend)
{
  (void) backend;
  return g_new0 (SiftEvent, 1);
}

void
sift_cpu_event_free (SiftBackend *backend, SiftEvent *ev)
{
  (void) backend;
  if (ev == NULL)
    return;
  g_assert (ev->pending == 0);
  g_clear_error (&ev->error);
  g_free (ev);
}

SiftEventState
sift_cpu_event_query (SiftBackend *backend, SiftEvent *ev)
{
  CpuBackend *b = (CpuBackend *) backend;
  pthread_mutex_lock (&b->lock);
  SiftEventState st = ev->pending > 0 ? SIFT_EVENT_PENDING : ev->error != NULL ? SIFT_EVENT_FAILED : SIFT_EVENT_DONE;
  pthread_mutex_unlock (&b->lock);
  return st;
}

gboolean
sift_cpu_event_wait (SiftBackend *backend, SiftEvent *const *events, gsize n, gsize *n_ok, GError **error)
{
  CpuBackend *b = (CpuBackend *) backend;
  gsize i = 0;
  gboolean ok = TRUE;
  pthread_mutex_lock (&b->lock);
  for (; i < n; i++)
    {
      SiftEvent *ev = events[i];
      while (ev->pending > 0)
        if (!help_locked (b))
          wait_done_locked (b);
      if (ev->error != NULL)
        {
          g_propagate_error (error, ev->error);
          ev->error = NULL;
          ok = FALSE;
          break;
        }
    }
  pthread_mutex_unlock (&b->lock);
  if (n_ok != NULL)
    *n_ok = i;
  return ok;
}

void
sift_cpu_drain (SiftBackend *backend, gboolean forget)
{
  CpuBackend *b = (CpuBackend *) backend;
  pthread_mutex_lock (&b->lock);
  while (!g_queue_is_empty (&b->jobs) || b->running > 0)
    wait_done_locked (b);
  if (forget)
    b->store_failed = FALSE;
  pthread_mutex_unlock (&b->lock);
}

void
sift_cpu_worker_start (CpuBackend *b)
{
  /* Adaptive: the lock is held for a few instructions at a time, and a
   * thread that sleeps on it would stall the pipeline for a wake-up. */
  pthread_mutexattr_t attr;
  pthread_mutexattr_init (&attr);
  pthread_mutexattr_settype (&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init (&b->lock, &attr);
  pthread_mutexattr_destroy (&attr);
  pthread_cond_init (&b->work_cond, NULL);
  pthread_cond_init (&b->done_cond, NULL);
  g_queue_init (&b->jobs);
  b->worker = g_thread_new ("sift-copy", worker_main, b);
}

void
sift_cpu_worker_stop (CpuBackend *b)
{
  pthread_mutex_lock (&b->lock);
  b->quit = TRUE;
  pthread_cond_signal (&b->work_cond);
  pthread_mutex_unlock (&b->lock);
  g_thread_join (b->worker);
  pthread_mutex_destroy (&b->lock);
  pthread_cond_destroy (&b->work_cond);
  pthread_cond_destroy (&b->done_cond);
}
