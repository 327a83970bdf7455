/* The OffloadEngine: compute-side buffers, the block table, the copy
 * worker thread and the slot / cross-layer events. The default attention
 * pipelines are in pipeline.c. See docs/engine.md for the picture. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sift/attn.h>
#include <sift/error.h>
#include <sift/memory.h>

#include "attn-private.h"
#include "engine-private.h"

typedef enum { JOB_LOAD, JOB_STORE } JobKind;

/* One transfer for the copy worker. Loads write `dst_*`, stores read
 * `src_*`; both address blocks of [n_kv_heads][cap][head_dim] compute
 * elements (cap: tokens from one head to the next in that buffer). */
typedef struct {
  JobKind kind;
  gint32 layer;
  SiftPhase phase;
  gint64 store_id;
  SiftLoadWhat what;
  guint8 *k, *v;
  gint64 cap;
  gint32 slot;    /* load into a ring slot, or -1 */
  gint32 half;    /* load into a cross-layer half, or -1 */
} Job;

SiftCounters *
sift_engine_counters_at (SiftEngine *e, gint32 layer, SiftPhase phase)
{
  return &e->counters[layer * 2 + (phase == SIFT_PHASE_DECODE)];
}

void
sift_engine_count (SiftEngine *e, gint32 layer, SiftPhase phase, const SiftCounters *a)
{
  pthread_mutex_lock (&e->lock);
  SiftCounters *c = sift_engine_counters_at (e, layer, phase);
  c->bytes_loaded += a->bytes_loaded;
  c->bytes_stored += a->bytes_stored;
  c->blocks_available += a->blocks_available;
  c->blocks_selected += a->blocks_selected;
  c->tokens_available += a->tokens_available;
  c->tokens_attended += a->tokens_attended;
  c->seconds_stalled += a->seconds_stalled;
  c->seconds_compute += a->seconds_compute;
  c->seconds_load += a->seconds_load;
  c->tokens_evicted += a->tokens_evicted;
  c->bytes_compacted += a->bytes_compacted;
  c->bytes_mapped += a->bytes_mapped;
  c->summaries_attended += a->summaries_attended;
  pthread_mutex_unlock (&e->lock);
}

/* ---- The copy worker ---------------------------------------------------- */

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

/* Slot memory: slot i holds K then V of one block, each
 * [n_kv_heads][block_size][head_dim], the stored layout, so a load of the
 * stored dtype is one read (for the host store one large memcpy, which runs
 * at full memory bandwidth where many small ones do not). */
static guint8 *
slot_data (SiftEngine *e, gint32 slot, int v)
{
  return e->slots_mem + ((gsize) slot * 2 + (gsize) v) * (gsize) e->block_elems * e->es;
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
static void
wait_done_locked (SiftEngine *e)
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
static gboolean
help_locked (SiftEngine *e)
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
static void
push_job_locked (SiftEngine *e, Job *j)
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
static void
wake_worker_locked (SiftEngine *e)
{
  __atomic_add_fetch (&e->queue_seq, 1, __ATOMIC_RELEASE);
  if (e->worker_idle && e->hold_wake == 0)
    pthread_cond_signal (&e->work_cond);
}

static void
queue_job (SiftEngine *e, Job *j)
{
  pthread_mutex_lock (&e->lock);
  push_job_locked (e, j);
  wake_worker_locked (e);
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
static void
wait_layer_stores_locked (SiftEngine *e, gint32 layer)
{
  if (e->stores_pending[layer] == 0)
    return;
  gint64 t0 = g_get_monotonic_time ();
  while (e->stores_pending[layer] > 0)
    if (!help_locked (e))
      wait_done_locked (e);
  sift_engine_counters_at (e, layer, e->phase)->seconds_stalled
    += (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC;
}

static void
wait_idle_locked (SiftEngine *e)
{
  while (!g_queue_is_empty (&e->jobs) || e->running > 0)
    wait_done_locked (e);
}

static gboolean
store_error_locked (SiftEngine *e, GError **error)
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
  wait_layer_stores_locked (e, layer);
  gboolean ok = store_error_locked (e, error);
  pthread_mutex_unlock (&e->lock);
  return ok;
}

gboolean
sift_engine_sync (SiftEngine *e, GError **error)
{
  pthread_mutex_lock (&e->lock);
  for (gint32 l = 0; l < e->config.shape.n_layers; l++)
    wait_layer_stores_locked (e, l);
  gboolean ok = store_error_locked (e, error);
  pthread_mutex_unlock (&e->lock);
  return ok;
}

/* ---- Construction ------------------------------------------------------- */

static gboolean
invalid (GError **error, const char *fmt, ...) G_GNUC_PRINTF (2, 3);

static gboolean
invalid (GError **error, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_INVALID, "engine: %s", msg);
  return FALSE;
}

static gboolean
check_config (const SiftEngineConfig *c, const SiftStore *store, GError **error)
{
  const SiftModelShape *s = &c->shape;
  if (s->n_layers <= 0 || s->n_q_heads <= 0 || s->n_kv_heads <= 0 || s->head_dim <= 0)
    return invalid (error, "impossible shape: %d layers, %d query heads, %d kv heads, head_dim %d",
                    s->n_layers, s->n_q_heads, s->n_kv_heads, s->head_dim);
  if (s->n_q_heads % s->n_kv_heads != 0)
    return invalid (error, "%d query heads are not a multiple of %d kv heads", s->n_q_heads, s->n_kv_heads);
  if (s->block_size <= 0 || s->chunk_size <= 0)
    return invalid (error, "block_size %d and chunk_size %d must be positive", s->block_size, s->chunk_size);
  if (s->chunk_size % s->block_size != 0)
    return invalid (error, "chunk_size %d is not a multiple of block_size %d", s->chunk_size, s->block_size);
  if (c->n_slots < 2)
    return invalid (error, "ring_slots is %d; the ring pipeline needs at least 2 slots", c->n_slots);
  if (c->compute_dtype != SIFT_DTYPE_F32 && c->compute_dtype != SIFT_DTYPE_F16
      && c->compute_dtype != SIFT_DTYPE_BF16)
    return invalid (error, "compute dtype %s is not f32, f16 or bf16", sift_dtype_name (c->compute_dtype));
  if (c->pipeline != SIFT_PIPELINE_RING && c->pipeline != SIFT_PIPELINE_CROSS_LAYER)
    return invalid (error, "unknown pipeline %d", (int) c->pipeline);
  if (c->max_tokens < 0)
    return invalid (error, "max_tokens %" G_GINT64_FORMAT " is negative", c->max_tokens);
  if (!isfinite (s->scale) || s->scale < 0)
    return invalid (error, "scale %g is not a finite non-negative number", (double) s->scale);
  /* What sift_engine_new allocates, computed before it does: a shape too
   * large for the machine is an error here, not an abort or an OOM kill. */
  const double es = (double) sift_dtype_size (c->compute_dtype);
  const double rows = (double) c->n_slots * s->block_size
                      + (double) s->n_layers * (s->chunk_size + s->block_size + SIFT_ATTN_DECODE_MAX_ROWS);
  const double bytes = 2.0 * s->n_kv_heads * s->head_dim * es * rows
                       + (double) s->n_q_heads * MAX (s->chunk_size, SIFT_ATTN_DECODE_MAX_ROWS) * (s->head_dim + 1) * 4.0;
  const long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
  if (pages > 0 && page > 0 && bytes > (double) pages * (double) page)
    {
      g_autofree char *need = g_format_size ((guint64) MIN (bytes, 1.8e19));
      g_autofree char *have = g_format_size ((guint64) pages * (guint64) page);
      return invalid (error, "the buffers of %d layers x %d kv heads x head_dim %d (chunk %d, block %d, %d slots) "
                      "need %s, more than this machine's %s", s->n_layers, s->n_kv_heads, s->head_dim,
                      s->chunk_size, s->block_size, c->n_slots, need, have);
    }
  const SiftStoreConfig *sc = sift_store_config (store);
  if (sc->n_kv_heads != s->n_kv_heads || sc->block_size != s->block_size || sc->head_dim != s->head_dim)
    return invalid (error,
                    "the %s store holds blocks of [%d kv heads][%d tokens][%d dim], the model needs [%d][%d][%d]",
                    sift_store_name (store), sc->n_kv_heads, sc->block_size, sc->head_dim,
                    s->n_kv_heads, s->block_size, s->head_dim);
  return TRUE;
}

/* Zeroed, 4096-byte aligned (O_DIRECT's staging); from 2 MiB on
 * sift_mem_alloc's huge pages (2 MiB aligned). Freed with free (). */
static void *
aligned_new0 (gsize n)
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

static void
unmap_slot (Slot *s)
{
  s->map_k = s->map_v = NULL;
  s->map_id = -1;
}

void
sift_engine_unmap_id (SiftEngine *e, gint64 store_id)
{
  const gsize kb = e->store->k_bytes;
  for (gint32 i = 0; i < e->config.n_slots; i++)
    {
      Slot *s = &e->slots[i];
      if (s->map_k == NULL || s->map_id != store_id)
        continue;
      /* The slot's own memory has the stored layout: the bytes move as they are. */
      memcpy (slot_data (e, i, 0), s->map_k, kb);
      memcpy (slot_data (e, i, 1), s->map_v, kb);
      unmap_slot (s);
    }
}

void
sift_engine_set_force_copy (SiftEngine *e, gboolean force_copy)
{
  g_return_if_fail (e != NULL);
  e->maps = !force_copy && e->store->config.dtype == e->config.compute_dtype && sift_store_can_map (e->store);
}

/* Work (as SIFT_ATTN_SERIAL_WORK counts it) below which one kernel call's
 * fixed cost shows: a 1-row decode step of 4 q heads x 64 over 128-token
 * blocks (32K a block) took 0.105 s in groups of 1 against 0.091 s in
 * groups of 2 (docs/benchmarks.md). */
#define RING_CALL_WORK ((double) (1 << 18))

gint32
sift_engine_ring_group (const SiftEngine *e, gint32 n_q)
{
  const gint32 half = MAX (1, e->config.n_slots / 2);
  if (e->ring_group > 0)
    return MIN (e->ring_group, e->config.n_slots);
  const SiftModelShape *s = &e->config.shape;
  const double block_work = (double) s->n_q_heads * n_q * s->block_size * s->head_dim;
  if (block_work >= SIFT_ATTN_SERIAL_WORK)
    return half;
  /* Serial calls: as few blocks per call as keep the call's own cost
   * small beside its work (RING_CALL_WORK), so the worker can run ahead. */
  const double want = ceil (RING_CALL_WORK / block_work);
  return (gint32) CLAMP (want, 1.0, (double) half);
}

void
sift_engine_set_ring_group (SiftEngine *e, gint32 blocks)
{
  e->ring_group = MAX (0, blocks);
}

gboolean
sift_engine_maps (const SiftEngine *e)
{
  g_return_val_if_fail (e != NULL, FALSE);
  return e->maps;
}

SiftEngine *
sift_engine_new (const SiftEngineConfig *config, SiftStore *store, GError **error)
{
  g_return_val_if_fail (config != NULL && store != NULL, NULL);
  if (!check_config (config, store, error))
    return NULL;
  SiftEngine *e = g_new0 (SiftEngine, 1);
  e->config = *config;
  e->store = store;
  const SiftModelShape *s = &e->config.shape;
  const gint32 L = s->n_layers;
  e->es = sift_dtype_size (config->compute_dtype);
  sift_engine_set_force_copy (e, FALSE);
  e->block_elems = (gint64) s->n_kv_heads * s->block_size * s->head_dim;
  e->decode_cap = s->block_size + SIFT_ATTN_DECODE_MAX_ROWS;

  e->meta = g_new0 (GArray *, L);
  e->store_ids = g_new0 (GArray *, L);
  for (gint32 l = 0; l < L; l++)
    {
      e->meta[l] = g_array_new (FALSE, TRUE, sizeof (SiftBlockMeta));
      e->store_ids[l] = g_array_new (FALSE, FALSE, sizeof (gint64));
    }
  e->stored_tokens = g_new0 (gint64, L);

  e->slots_mem = aligned_new0 ((gsize) config->n_slots * 2 * (gsize) e->block_elems * e->es);
  e->slots = g_new0 (Slot, config->n_slots);
  for (gint32 i = 0; i < config->n_slots; i++)
    e->slots[i].map_id = -1;
  const gsize pf_bytes = (gsize) s->n_kv_heads * (gsize) s->chunk_size * (gsize) s->head_dim * e->es;
  const gsize dc_bytes = (gsize) s->n_kv_heads * (gsize) e->decode_cap * (gsize) s->head_dim * e->es;
  e->prefill_k = g_new0 (guint8 *, L);
  e->prefill_v = g_new0 (guint8 *, L);
  e->decode_k = g_new0 (guint8 *, L);
  e->decode_v = g_new0 (guint8 *, L);
  for (gint32 l = 0; l < L; l++)
    {
      e->prefill_k[l] = aligned_new0 (pf_bytes);
      e->prefill_v[l] = aligned_new0 (pf_bytes);
      e->decode_k[l] = aligned_new0 (dc_bytes);
      e->decode_v[l] = aligned_new0 (dc_bytes);
    }
  e->prefill_pos = g_new0 (gint64, L);
  e->prefill_len = g_new0 (gint32, L);
  e->decode_start = g_new0 (gint32, L);
  e->decode_len = g_new0 (gint32, L);
  for (int i = 0; i < 2; i++)
    {
      e->xl[i].layer = -1;
      e->xl[i].ids = g_array_new (FALSE, FALSE, sizeof (gint64));
    }

  e->stores_pending = g_new0 (gint32, L);
  e->staging = aligned_new0 ((store->block_bytes + 4095) / 4096 * 4096);
  e->help_staging = aligned_new0 ((store->block_bytes + 4095) / 4096 * 4096);
  e->counters = g_new0 (SiftCounters, (gsize) L * 2);
  e->max_q = MAX (s->chunk_size, SIFT_ATTN_DECODE_MAX_ROWS);
  e->part_out = g_new0 (float, (gsize) s->n_q_heads * (gsize) e->max_q * (gsize) s->head_dim);
  e->part_lse = g_new0 (float, (gsize) s->n_q_heads * (gsize) e->max_q);
  sift_engine_evict_init (e);

  /* Adaptive: the lock is held for a few instructions at a time, and a
   * thread that sleeps on it would stall the pipeline for a wake-up. */
  pthread_mutexattr_t attr;
  pthread_mutexattr_init (&attr);
  pthread_mutexattr_settype (&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init (&e->lock, &attr);
  pthread_mutexattr_destroy (&attr);
  pthread_cond_init (&e->work_cond, NULL);
  pthread_cond_init (&e->done_cond, NULL);
  g_queue_init (&e->jobs);
  e->phase = SIFT_PHASE_PREFILL;
  e->worker = g_thread_new ("sift-copy", worker_main, e);
  return e;
}

static void
release_blocks (SiftEngine *e)
{
  for (gint32 l = 0; l < e->config.shape.n_layers; l++)
    {
      GArray *ids = e->store_ids[l];
      for (guint i = 0; i < ids->len; i++)
        sift_store_release (e->store, g_array_index (ids, gint64, i));
      g_array_set_size (ids, 0);
    }
}

void
sift_engine_free (SiftEngine *e)
{
  if (e == NULL)
    return;
  pthread_mutex_lock (&e->lock);
  e->quit = TRUE;
  pthread_cond_signal (&e->work_cond);
  pthread_mutex_unlock (&e->lock);
  g_thread_join (e->worker);
  release_blocks (e);
  const gint32 L = e->config.shape.n_layers;
  for (gint32 l = 0; l < L; l++)
    {
      g_array_unref (e->store_ids[l]);
      g_array_unref (e->meta[l]);
      free (e->prefill_k[l]);
      free (e->prefill_v[l]);
      free (e->decode_k[l]);
      free (e->decode_v[l]);
    }
  for (gint32 i = 0; i < e->config.n_slots; i++)
    g_clear_error (&e->slots[i].error);
  for (int i = 0; i < 2; i++)
    {
      free (e->xl[i].k);
      free (e->xl[i].v);
      g_clear_error (&e->xl[i].error);
      g_array_unref (e->xl[i].ids);
    }
  g_clear_error (&e->store_error);
  sift_engine_evict_free (e);
  g_free (e->meta);
  g_free (e->store_ids);
  g_free (e->stored_tokens);
  free (e->slots_mem);
  g_free (e->slots);
  g_free (e->prefill_k);
  g_free (e->prefill_v);
  g_free (e->decode_k);
  g_free (e->decode_v);
  g_free (e->prefill_pos);
  g_free (e->prefill_len);
  g_free (e->decode_start);
  g_free (e->decode_len);
  g_free (e->stores_pending);
  free (e->staging);
  free (e->help_staging);
  g_free (e->counters);
  g_free (e->part_out);
  g_free (e->part_lse);
  sift_engine_batch_free (e);
  pthread_mutex_destroy (&e->lock);
  pthread_cond_destroy (&e->work_cond);
  pthread_cond_destroy (&e->done_cond);
  g_free (e);
}

void
sift_engine_reset (SiftEngine *e)
{
  g_return_if_fail (e != NULL);
  const SiftModelShape *s = &e->config.shape;
  pthread_mutex_lock (&e->lock);
  wait_idle_locked (e);
  pthread_mutex_unlock (&e->lock);
  for (gint32 i = 0; i < e->config.n_slots; i++)
    unmap_slot (&e->slots[i]);
  release_blocks (e);
  const gint32 L = s->n_layers;
  for (gint32 l = 0; l < L; l++)
    g_array_set_size (e->meta[l], 0);
  sift_engine_evict_clear (e);
  const gsize pf_bytes = (gsize) s->n_kv_heads * (gsize) s->chunk_size * (gsize) s->head_dim * e->es;
  const gsize dc_bytes = (gsize) s->n_kv_heads * (gsize) e->decode_cap * (gsize) s->head_dim * e->es;
  for (gint32 l = 0; l < L; l++)
    {
      memset (e->prefill_k[l], 0, pf_bytes);
      memset (e->prefill_v[l], 0, pf_bytes);
      memset (e->decode_k[l], 0, dc_bytes);
      memset (e->decode_v[l], 0, dc_bytes);
      e->stored_tokens[l] = e->prefill_pos[l] = 0;
      e->prefill_len[l] = e->decode_start[l] = e->decode_len[l] = 0;
    }
  memset (e->slots_mem, 0, (gsize) e->config.n_slots * 2 * (gsize) e->block_elems * e->es);
  for (gint32 i = 0; i < e->config.n_slots; i++)
    {
      e->slots[i].state = SLOT_FREE;
      g_clear_error (&e->slots[i].error);
    }
  for (int i = 0; i < 2; i++)
    {
      XlHalf *x = &e->xl[i];
      if (x->k != NULL)
        {
          gsize half = (gsize) s->n_kv_heads * (gsize) x->cap_blocks * (gsize) s->block_size
                       * (gsize) s->head_dim * e->es;
          memset (x->k, 0, half);
          memset (x->v, 0, half);
        }
      x->layer = -1;
      x->n_blocks = 0;
      g_clear_error (&x->error);
      g_array_set_size (x->ids, 0);
    }
  e->xl_active = FALSE;
  g_clear_error (&e->store_error);
  memset (e->counters, 0, sizeof (SiftCounters) * (gsize) L * 2);
  e->policy_name = NULL;
  e->phase = SIFT_PHASE_PREFILL;
}

const SiftEngineConfig *
sift_engine_config (const SiftEngine *e)
{
  g_return_val_if_fail (e != NULL, NULL);
  return &e->config;
}

gint32
sift_engine_n_slots (SiftEngine *e)
{
  g_return_val_if_fail (e != NULL, 0);
  return e->config.n_slots;
}

void
sift_engine_counters (const SiftEngine *engine, gint32 layer, SiftPhase phase, SiftCounters *out)
{
  g_return_if_fail (engine != NULL && out != NULL);
  SiftEngine *e = (SiftEngine *) engine;
  g_return_if_fail (layer >= -1 && layer < e->config.shape.n_layers);
  memset (out, 0, sizeof *out);
  pthread_mutex_lock (&e->lock);
  gint32 l0 = layer < 0 ? 0 : layer, l1 = layer < 0 ? e->config.shape.n_layers : layer + 1;
  for (gint32 l = l0; l < l1; l++)
    {
      const SiftCounters *c = sift_engine_counters_at (e, l, phase);
      out->bytes_loaded += c->bytes_loaded;
      out->bytes_stored += c->bytes_stored;
      out->blocks_available += c->blocks_available;
      out->blocks_selected += c->blocks_selected;
      out->tokens_available += c->tokens_available;
      out->tokens_attended += c->tokens_attended;
      out->seconds_stalled += c->seconds_stalled;
      out->seconds_compute += c->seconds_compute;
      out->seconds_load += c->seconds_load;
      out->tokens_evicted += c->tokens_evicted;
      out->bytes_compacted += c->bytes_compacted;
      out->bytes_mapped += c->bytes_mapped;
    }
  pthread_mutex_unlock (&e->lock);
}

void
sift_engine_begin_call (SiftEngine *e, SiftPhase phase, const char *policy_name)
{
  e->phase = phase;
  e->policy_name = policy_name;
}

/* ---- Block table -------------------------------------------------------- */

void
sift_engine_fill_context (SiftEngine *e, SiftPolicyContext *ctx, gint32 layer)
{
  ctx->layer = layer;
  ctx->block_size = e->config.shape.block_size;
  ctx->shape = &e->config.shape;
  ctx->engine = e;
  ctx->kv_len = e->stored_tokens[layer];
  ctx->n_blocks = e->store_ids[layer]->len;
  ctx->blocks = (const SiftBlockMeta *) (const void *) e->meta[layer]->data;
}

static gboolean
check_layer (SiftEngine *e, gint32 layer, GError **error)
{
  if (layer >= 0 && layer < e->config.shape.n_layers)
    return TRUE;
  return invalid (error, "layer %d is outside the model's %d layers", layer, e->config.shape.n_layers);
}

gboolean
sift_engine_call_offload_hook (SiftPolicy *policy, SiftPhase phase, const SiftPolicyContext *ctx,
                   const SiftBlockInfo *info, GError **error)
{
  gboolean (*hook) (SiftPolicy *, const SiftPolicyContext *, const SiftBlockInfo *, GError **)
    = phase == SIFT_PHASE_PREFILL ? policy->ops->on_prefill_offload : policy->ops->on_decode_offload;
  GError *local = NULL;
  if (hook == NULL || hook (policy, ctx, info, &local))
    return TRUE;
  g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_POLICY, "policy '%s': %s failed: %s",
               policy->ops->name, phase == SIFT_PHASE_PREFILL ? "on_prefill_offload" : "on_decode_offload",
               local ? local->message : "(no message)");
  g_clear_error (&local);
  return FALSE;
}

/* Appends one stored block of `layer`: allocates an id, calls the layer
 * policies' offload hooks, queues the store. */
static gboolean
offload_block (SiftEngine *e, const SiftPolicyContext *ctx, const SiftLayerPolicies *policies, gint32 layer,
               SiftPhase phase, gint64 first_token, gint32 n_valid, guint8 *k, guint8 *v, gint64 cap,
               GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  GArray *ids = e->store_ids[layer];
  gint64 logical = ids->len;
  if (e->config.max_tokens > 0 && first_token + n_valid > e->config.max_tokens)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_CAPACITY,
                   "engine: token %" G_GINT64_FORMAT " is past the block table's capacity of %" G_GINT64_FORMAT
                   " tokens",
                   first_token + n_valid - 1, e->config.max_tokens);
      return FALSE;
    }
  /* Without eviction every layer stores the same tokens in block i. */
  const gint32 other = layer == 0 ? 1 : 0;
  if (e->evict.capacity_tokens == 0 && other < s->n_layers && logical < (gint64) e->meta[other]->len)
    {
      const SiftBlockMeta *m = &g_array_index (e->meta[other], SiftBlockMeta, logical);
      if (m->first_token != first_token || m->n_valid != n_valid)
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                       "engine: layer %d stores block %" G_GINT64_FORMAT " as tokens %" G_GINT64_FORMAT
                       "+%d, other layers stored it as %" G_GINT64_FORMAT "+%d",
                       layer, logical, first_token, n_valid, m->first_token, m->n_valid);
          return FALSE;
        }
    }
  SiftBlockMeta m = { first_token, n_valid, phase };
  g_array_append_val (e->meta[layer], m);
  gboolean ok = TRUE;
  gint64 id = -1;
  pthread_mutex_lock (&e->lock);
  ok = store_error_locked (e, error);
  pthread_mutex_unlock (&e->lock);
  if (!ok || !sift_store_alloc (e->store, &id, error))
    {
      g_array_set_size (e->meta[layer], (guint) logical);
      return FALSE;
    }
  SiftBlockInfo info = {
    .block_id = logical,
    .meta = &g_array_index (e->meta[layer], SiftBlockMeta, logical),
    .k = { k, e->config.compute_dtype, s->n_kv_heads, s->head_dim, s->block_size, cap * s->head_dim, s->head_dim },
    .v = { v, e->config.compute_dtype, s->n_kv_heads, s->head_dim, s->block_size, cap * s->head_dim, s->head_dim },
  };
  /* The block table may have moved (appended above, evicted before): the
   * hooks see it as it is now, the new block past n_blocks. */
  SiftPolicyContext now = *ctx;
  sift_engine_fill_context (e, &now, layer);
  SiftPolicy *const seen[] = { policies ? policies->prefill : NULL,
                               policies && policies->decode != policies->prefill ? policies->decode : NULL };
  for (gsize i = 0; i < G_N_ELEMENTS (seen); i++)
    if (seen[i] != NULL && !sift_engine_call_offload_hook (seen[i], phase, &now, &info, error))
      {
        sift_store_release (e->store, id);
        g_array_set_size (e->meta[layer], (guint) logical);
        return FALSE;
      }
  g_array_append_val (ids, id);
  sift_engine_evict_note_offload (e, layer, first_token, n_valid);
  e->stored_tokens[layer] = first_token + n_valid;
  Job *j = g_new0 (Job, 1);
  *j = (Job) { .kind = JOB_STORE, .layer = layer, .phase = phase, .store_id = id, .k = k, .v = v,
               .cap = cap, .slot = -1, .half = -1 };
  queue_job (e, j);
  return TRUE;
}

/* Writes f32 token-major rows [n][n_kv_heads][head_dim] into a compute
 * buffer [n_kv_heads][cap][head_dim] at token t0. */
static void
put_rows (SiftEngine *e, const float *src, gint64 n, guint8 *dst, gint64 cap, gint64 t0)
{
  const SiftModelShape *s = &e->config.shape;
  if (s->n_kv_heads == 1) /* token-major and head-major coincide: one run */
    {
      sift_convert (src, SIFT_DTYPE_F32, dst + (gsize) (t0 * s->head_dim) * e->es, e->config.compute_dtype,
                    (gsize) (n * s->head_dim));
      return;
    }
  for (gint64 t = 0; t < n; t++)
    for (gint32 h = 0; h < s->n_kv_heads; h++)
      sift_convert (src + (t * s->n_kv_heads + h) * s->head_dim, SIFT_DTYPE_F32,
                    dst + (gsize) ((h * cap + t0 + t) * s->head_dim) * e->es, e->config.compute_dtype,
                    (gsize) s->head_dim);
}

gboolean
sift_engine_put_prefill (SiftEngine *e, gint32 layer, gint64 pos0, gint64 n, const float *k,
                         const float *v, GError **error)
{
  if (!check_layer (e, layer, error))
    return FALSE;
  const SiftModelShape *s = &e->config.shape;
  if (n <= 0 || n > s->chunk_size)
    return invalid (error, "a prefill chunk of %" G_GINT64_FORMAT " tokens (chunk_size %d)", n, s->chunk_size);
  if (pos0 != e->stored_tokens[layer] || e->decode_len[layer] > 0
      || (e->stored_tokens[layer] % s->block_size) != 0)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: layer %d cannot prefill at %" G_GINT64_FORMAT ": %" G_GINT64_FORMAT
                   " tokens are stored%s",
                   layer, pos0, e->stored_tokens[layer],
                   e->decode_len[layer] > 0 ? " and decoding started" : "");
      return FALSE;
    }
  pthread_mutex_lock (&e->lock);
  wait_layer_stores_locked (e, layer);
  gboolean ok = store_error_locked (e, error);
  pthread_mutex_unlock (&e->lock);
  if (!ok)
    return FALSE;
  put_rows (e, k, n, e->prefill_k[layer], s->chunk_size, 0);
  put_rows (e, v, n, e->prefill_v[layer], s->chunk_size, 0);
  e->prefill_pos[layer] = pos0;
  e->prefill_len[layer] = (gint32) n;
  return TRUE;
}

gboolean
sift_engine_offload_prefill (SiftEngine *e, const SiftPolicyContext *ctx,
                             const SiftLayerPolicies *policies, GError **error)
{
  const gint32 layer = ctx->layer;
  if (!check_layer (e, layer, error))
    return FALSE;
  const SiftModelShape *s = &e->config.shape;
  const gint64 n = e->prefill_len[layer];
  for (gint64 t = 0; t < n; t += s->block_size)
    {
      gsize off = (gsize) (t * s->head_dim) * e->es;
      if (!offload_block (e, ctx, policies, layer, SIFT_PHASE_PREFILL, e->prefill_pos[layer] + t,
                          (gint32) MIN (s->block_size, n - t), e->prefill_k[layer] + off,
                          e->prefill_v[layer] + off, s->chunk_size, error))
        return FALSE;
    }
  return TRUE;
}

gboolean
sift_engine_put_decode (SiftEngine *e, gint32 layer, gint64 pos0, gint64 n, const float *k,
                        const float *v, GError **error)
{
  if (!check_layer (e, layer, error))
    return FALSE;
  const SiftModelShape *s = &e->config.shape;
  if (n <= 0 || n > SIFT_ATTN_DECODE_MAX_ROWS)
    return invalid (error, "%" G_GINT64_FORMAT " decode rows (1..%d)", n, SIFT_ATTN_DECODE_MAX_ROWS);
  if (pos0 != e->stored_tokens[layer] + e->decode_len[layer])
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: layer %d cannot decode at position %" G_GINT64_FORMAT ", the next is %" G_GINT64_FORMAT,
                   layer, pos0, e->stored_tokens[layer] + e->decode_len[layer]);
      return FALSE;
    }
  pthread_mutex_lock (&e->lock);
  if (e->decode_start[layer] > 0)
    wait_layer_stores_locked (e, layer);
  gboolean ok = store_error_locked (e, error);
  pthread_mutex_unlock (&e->lock);
  if (!ok)
    return FALSE;
  if (e->decode_start[layer] > 0)
    {
      /* The previous step offloaded the first block; its store is done, so
       * the remaining rows can move to the front. */
      gsize row = (gsize) s->head_dim * e->es;
      for (gint32 h = 0; h < s->n_kv_heads; h++)
        {
          gsize base = (gsize) h * (gsize) e->decode_cap * row;
          memmove (e->decode_k[layer] + base, e->decode_k[layer] + base + (gsize) e->decode_start[layer] * row,
                   (gsize) e->decode_len[layer] * row);
          memmove (e->decode_v[layer] + base, e->decode_v[layer] + base + (gsize) e->decode_start[layer] * row,
                   (gsize) e->decode_len[layer] * row);
        }
      e->decode_start[layer] = 0;
    }
  g_assert (e->decode_len[layer] + n <= e->decode_cap);
  put_rows (e, k, n, e->decode_k[layer], e->decode_cap, e->decode_len[layer]);
  put_rows (e, v, n, e->decode_v[layer], e->decode_cap, e->decode_len[layer]);
  e->decode_len[layer] += (gint32) n;
  return TRUE;
}

gboolean
sift_engine_offload_decode (SiftEngine *e, const SiftPolicyContext *ctx,
                            const SiftLayerPolicies *policies, GError **error)
{
  const gint32 layer = ctx->layer;
  if (!check_layer (e, layer, error))
    return FALSE;
  const SiftModelShape *s = &e->config.shape;
  /* Steps of more rows than block_size fill more than one block: offload
   * every full one, or the next step's rows do not fit the buffer. */
  while (e->decode_len[layer] >= s->block_size)
    {
      gsize off = (gsize) e->decode_start[layer] * (gsize) s->head_dim * e->es;
      if (!offload_block (e, ctx, policies, layer, SIFT_PHASE_DECODE, e->stored_tokens[layer] /* before */,
                          s->block_size, e->decode_k[layer] + off, e->decode_v[layer] + off, e->decode_cap,
                          error))
        return FALSE;
      e->decode_start[layer] += s->block_size;
      e->decode_len[layer] -= s->block_size;
    }
  return TRUE;
}

/* ---- Calls for policies ------------------------------------------------- */

/* A zero-copy load: the slot points at the stored block, ready at once.
 * The block's store job must have run first (the queue keeps that order
 * for copies; a mapping does not go through the queue). FALSE when the
 * store cannot map it (then the load is copied). */
static gboolean
map_block (SiftEngine *e, gint32 layer, gint64 store_id, gint32 slot, SiftLoadWhat what)
{
  Slot *s = &e->slots[slot];
  pthread_mutex_lock (&e->lock);
  wait_layer_stores_locked (e, layer);
  const guint8 *p = sift_store_map (e->store, store_id);
  if (p == NULL)
    {
      pthread_mutex_unlock (&e->lock);
      return FALSE;
    }
  if (e->store_error != NULL) /* the block may never have been written */
    {
      s->state = SLOT_FAILED;
      s->error = g_error_copy (e->store_error);
      pthread_mutex_unlock (&e->lock);
      return TRUE;
    }
  const gsize kb = e->store->k_bytes;
  s->map_k = p;
  s->map_v = p + kb;
  s->map_id = store_id;
  s->state = SLOT_READY;
  const guint64 n = what == SIFT_LOAD_KV ? 2 * kb : kb;
  SiftCounters *c = sift_engine_counters_at (e, layer, e->phase);
  c->bytes_loaded += n;
  c->bytes_mapped += n;
  pthread_mutex_unlock (&e->lock);
  return TRUE;
}

/* Gives slot the block's valid tokens and layer (the slot is free). */
static void
slot_take (SiftEngine *e, gint32 layer, gint64 block_id, gint32 slot)
{
  e->slots[slot].n_valid = g_array_index (e->meta[layer], SiftBlockMeta, block_id).n_valid;
  e->slots[slot].layer = layer;
}

/* The job that loads logical block block_id of layer into slot (claimed
 * for it by slot_take). Counted under the current call's phase, not the
 * block's. */
static Job *
slot_load_job (SiftEngine *e, gint32 layer, gint64 block_id, gint32 slot, SiftLoadWhat what)
{
  Job *j = g_new0 (Job, 1);
  *j = (Job) { .kind = JOB_LOAD, .layer = layer, .phase = e->phase,
               .store_id = g_array_index (e->store_ids[layer], gint64, block_id), .what = what,
               .k = slot_data (e, slot, 0), .v = slot_data (e, slot, 1), .cap = e->config.shape.block_size,
               .slot = slot, .half = -1 };
  return j;
}

/* Waits (the lock held) for slot s's load, helping the worker meanwhile;
 * a failed load frees the slot and hands over its error. */
static gboolean
wait_slot_locked (SiftEngine *e, Slot *s, gint32 slot, GError **error)
{
  while (s->state == SLOT_LOADING)
    if (!help_locked (e))
      wait_done_locked (e);
  if (s->state == SLOT_FAILED)
    {
      g_propagate_error (error, s->error);
      s->error = NULL;
      s->state = SLOT_FREE;
      return FALSE;
    }
  if (s->state == SLOT_FREE)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: wait on slot %d, which has no load", slot);
      return FALSE;
    }
  return TRUE;
}

/* Frees a slot that is not loading (the lock held). */
static void
slot_free_locked (Slot *s)
{
  s->state = SLOT_FREE;
  g_clear_error (&s->error);
  unmap_slot (s);
}

gboolean
sift_engine_load_block (SiftEngine *e, gint32 layer, gint64 block_id, gint32 slot, SiftLoadWhat what,
                        GError **error)
{
  g_return_val_if_fail (e != NULL, FALSE);
  if (!check_layer (e, layer, error))
    return FALSE;
  if (slot < 0 || slot >= e->config.n_slots)
    return invalid (error, "slot %d is outside the %d ring slots", slot, e->config.n_slots);
  if (what != SIFT_LOAD_K && what != SIFT_LOAD_V && what != SIFT_LOAD_KV)
    return invalid (error, "load of %d is not K, V or KV", (int) what);
  GArray *ids = e->store_ids[layer];
  if (block_id < 0 || block_id >= (gint64) ids->len)
    return invalid (error, "layer %d has %u stored blocks; block %" G_GINT64_FORMAT " does not exist", layer,
                    ids->len, block_id);
  pthread_mutex_lock (&e->lock);
  SlotState st = e->slots[slot].state;
  pthread_mutex_unlock (&e->lock);
  if (st != SLOT_FREE)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: slot %d is still in use (load it again only after sift_engine_slot_done)", slot);
      return FALSE;
    }
  slot_take (e, layer, block_id, slot);
  if (e->maps && map_block (e, layer, g_array_index (ids, gint64, block_id), slot, what))
    return TRUE;
  queue_job (e, slot_load_job (e, layer, block_id, slot, what));
  return TRUE;
}

gboolean
sift_engine_wait_slot (SiftEngine *e, gint32 slot, GError **error)
{
  g_return_val_if_fail (e != NULL, FALSE);
  if (slot < 0 || slot >= e->config.n_slots)
    return invalid (error, "slot %d is outside the %d ring slots", slot, e->config.n_slots);
  gint64 t0 = g_get_monotonic_time ();
  pthread_mutex_lock (&e->lock);
  Slot *s = &e->slots[slot];
  gboolean ok = wait_slot_locked (e, s, slot, error);
  /* Stall time is charged to the layer whose block the slot holds. */
  sift_engine_counters_at (e, s->layer, e->phase)->seconds_stalled
    += (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC;
  pthread_mutex_unlock (&e->lock);
  return ok;
}

/* ---- The default ring pipeline's group calls (pipeline.c) ------------------
 * The same protocol as load_block / wait_slot / slot_done, n slots under
 * one lock each: a group of blocks per call instead of one lock round trip
 * (with the worker's cache line bouncing between cores) per block. Copies
 * only: the ring runs when blocks are not read in place. */

gboolean
sift_engine_ring_load (SiftEngine *e, gint32 layer, const gint64 *block_ids, const gint32 *slots, gint32 n,
                       GError **error)
{
  GArray *ids = e->store_ids[layer];
  for (gint32 i = 0; i < n; i++)
    if (block_ids[i] < 0 || block_ids[i] >= (gint64) ids->len)
      return invalid (error, "layer %d has %u stored blocks; block %" G_GINT64_FORMAT " does not exist", layer,
                      ids->len, block_ids[i]);
  pthread_mutex_lock (&e->lock);
  for (gint32 i = 0; i < n; i++)
    if (e->slots[slots[i]].state != SLOT_FREE)
      {
        pthread_mutex_unlock (&e->lock);
        g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE, "engine: slot %d is still in use", slots[i]);
        return FALSE;
      }
  for (gint32 i = 0; i < n; i++)
    {
      slot_take (e, layer, block_ids[i], slots[i]);
      push_job_locked (e, slot_load_job (e, layer, block_ids[i], slots[i], SIFT_LOAD_KV));
    }
  wake_worker_locked (e);
  pthread_mutex_unlock (&e->lock);
  return TRUE;
}

gboolean
sift_engine_ring_wait (SiftEngine *e, const gint32 *slots, gint32 n, gint32 *n_valid, gint32 *n_ready,
                       GError **error)
{
  gint64 t0 = g_get_monotonic_time ();
  gboolean ok = TRUE;
  gint32 i = 0;
  pthread_mutex_lock (&e->lock);
  for (; i < n; i++)
    {
      Slot *s = &e->slots[slots[i]];
      n_valid[i] = s->n_valid;
      if (!(ok = wait_slot_locked (e, s, slots[i], error)))
        break;
    }
  *n_ready = i;
  if (n > 0)
    sift_engine_counters_at (e, e->slots[slots[0]].layer, e->phase)->seconds_stalled
      += (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC;
  pthread_mutex_unlock (&e->lock);
  return ok;
}

void
sift_engine_ring_done (SiftEngine *e, const gint32 *slots, gint32 n)
{
  pthread_mutex_lock (&e->lock);
  for (gint32 i = 0; i < n; i++)
    {
      g_assert (e->slots[slots[i]].state != SLOT_LOADING);
      slot_free_locked (&e->slots[slots[i]]);
    }
  pthread_mutex_unlock (&e->lock);
}

void
sift_engine_slots_kv (SiftEngine *e, gint32 slot, gint64 n_tokens, SiftView *k, SiftView *v)
{
  const SiftModelShape *s = &e->config.shape;
  const Slot *sl = &e->slots[slot];
  SiftView kv = { sl->map_k != NULL ? (void *) sl->map_k : slot_data (e, slot, 0), e->config.compute_dtype,
                  s->n_kv_heads, s->head_dim, n_tokens, (gint64) s->block_size * s->head_dim, s->head_dim };
  if (k != NULL)
    *k = kv;
  if (v != NULL)
    {
      *v = kv;
      v->data = sl->map_v != NULL ? (void *) sl->map_v : slot_data (e, slot, 1);
    }
}

gboolean
sift_engine_slot_ready (SiftEngine *e, gint32 slot, gint32 *n_valid_out)
{
  pthread_mutex_lock (&e->lock);
  gboolean ready = e->slots[slot].state == SLOT_READY;
  pthread_mutex_unlock (&e->lock);
  if (n_valid_out != NULL)
    *n_valid_out = e->slots[slot].n_valid;
  return ready;
}

void
sift_engine_slot_kv (SiftEngine *e, gint32 slot, SiftView *k, SiftView *v, gint32 *n_valid_out)
{
  g_return_if_fail (e != NULL && slot >= 0 && slot < e->config.n_slots);
  gint32 nv = 0;
  g_return_if_fail (sift_engine_slot_ready (e, slot, &nv));
  sift_engine_slots_kv (e, slot, nv, k, v);
  if (n_valid_out != NULL)
    *n_valid_out = nv;
}

void
sift_engine_slot_done (SiftEngine *e, gint32 slot)
{
  g_return_if_fail (e != NULL && slot >= 0 && slot < e->config.n_slots);
  pthread_mutex_lock (&e->lock);
  if (e->slots[slot].state != SLOT_LOADING)
    slot_free_locked (&e->slots[slot]);
  else
    g_critical ("sift_engine_slot_done: slot %d is still loading (wait for it first)", slot);
  pthread_mutex_unlock (&e->lock);
}

void
sift_engine_local_kv (SiftEngine *e, const SiftPolicyContext *ctx, SiftView *k, SiftView *v)
{
  g_return_if_fail (e != NULL && ctx != NULL && ctx->layer >= 0 && ctx->layer < e->config.shape.n_layers);
  const SiftModelShape *s = &e->config.shape;
  const gint32 l = ctx->layer;
  SiftView kv = { NULL, e->config.compute_dtype, s->n_kv_heads, s->head_dim, 0, 0, s->head_dim };
  guint8 *kd, *vd;
  if (ctx->phase == SIFT_PHASE_PREFILL)
    {
      kv.n_tokens = e->prefill_len[l];
      kv.head_stride = (gint64) s->chunk_size * s->head_dim;
      kd = e->prefill_k[l];
      vd = e->prefill_v[l];
    }
  else
    {
      gsize off = (gsize) e->decode_start[l] * (gsize) s->head_dim * e->es;
      kv.n_tokens = e->decode_len[l];
      kv.head_stride = (gint64) e->decode_cap * s->head_dim;
      kd = e->decode_k[l] + off;
      vd = e->decode_v[l] + off;
    }
  if (k != NULL)
    {
      *k = kv;
      k->data = kd;
    }
  if (v != NULL)
    {
      *v = kv;
      v->data = vd;
    }
}

gboolean
sift_engine_gather_rows (SiftEngine *e, gint32 layer, const gint64 *positions, gsize n, SiftView *k_out,
                         SiftView *v_out, GError **error)
{
  g_return_val_if_fail (e != NULL && (positions != NULL || n == 0) && k_out != NULL && v_out != NULL, FALSE);
  if (!check_layer (e, layer, error))
    return FALSE;
  const SiftModelShape *s = &e->config.shape;
  for (int i = 0; i < 2; i++)
    {
      const SiftView *o = i == 0 ? k_out : v_out;
      if (o->dtype != SIFT_DTYPE_F32 || o->n_heads != s->n_kv_heads || o->head_dim != s->head_dim
          || o->n_tokens < (gint64) n || (o->data == NULL && n > 0))
        return invalid (error, "gather_rows: %s_out must be f32 [%d kv heads][>= %" G_GSIZE_FORMAT " tokens][%d dim]",
                        i == 0 ? "k" : "v", s->n_kv_heads, n, s->head_dim);
    }
  pthread_mutex_lock (&e->lock);
  wait_layer_stores_locked (e, layer);
  gboolean ok = store_error_locked (e, error);
  pthread_mutex_unlock (&e->lock);
  if (!ok)
    return FALSE;
  const gsize rb = sift_store_row_bytes (e->store);
  g_autofree guint8 *rows = g_malloc (rb * (gsize) s->block_size);
  const gint64 stored = e->stored_tokens[layer];
  const gint64 dec0 = stored, dec1 = stored + e->decode_len[layer];
  const gint64 pf0 = e->prefill_pos[layer], pf1 = pf0 + e->prefill_len[layer];
  guint64 loaded = 0;
  gint64 t0 = g_get_monotonic_time ();
  for (gsize i = 0; i < n;)
    {
      const gint64 p = positions[i];
      gint64 b, b2;
      gint32 t, t2;
      if (p >= 0 && p < stored && sift_engine_find_row (e, layer, p, &b, &t))
        {
          /* A run of consecutive positions in consecutive rows of one block
           * is one read per head and half. */
          gsize run = 1;
          while (i + run < n && t + (gint64) run < s->block_size && positions[i + run] == p + (gint64) run
                 && sift_engine_find_row (e, layer, p + (gint64) run, &b2, &t2) && b2 == b && t2 == t + (gint32) run)
            run++;
          const gint64 id = g_array_index (e->store_ids[layer], gint64, b);
          for (gint32 h = 0; h < s->n_kv_heads; h++)
            for (int which = 0; which < 2; which++)
              {
                SiftView *o = which == 0 ? k_out : v_out;
                gsize off = (which == 0 ? 0 : e->store->k_bytes) + (gsize) ((gint64) h * s->block_size + t) * rb;
                if (!sift_store_read (e->store, id, off, rows, run * rb, error))
                  return FALSE;
                loaded += run * rb;
                for (gsize r = 0; r < run; r++)
                  sift_convert (rows + r * rb, e->store->config.dtype, sift_view_row (o, h, (gint64) (i + r)),
                                SIFT_DTYPE_F32, (gsize) s->head_dim);
              }
          i += run;
          continue;
        }
      for (gint32 h = 0; h < s->n_kv_heads; h++)
        for (int which = 0; which < 2; which++)
          {
            float *dst = sift_view_row (which == 0 ? k_out : v_out, h, (gint64) i);
            if (p >= dec0 && p < dec1 && e->decode_len[layer] > 0)
              {
                guint8 *buf = which == 0 ? e->decode_k[layer] : e->decode_v[layer];
                gint64 td = e->decode_start[layer] + (p - dec0);
                sift_convert (buf + (gsize) (((gint64) h * e->decode_cap + td) * s->head_dim) * e->es,
                              e->config.compute_dtype, dst, SIFT_DTYPE_F32, (gsize) s->head_dim);
              }
            else if (p >= pf0 && p < pf1)
              {
                guint8 *buf = which == 0 ? e->prefill_k[layer] : e->prefill_v[layer];
                sift_convert (buf + (gsize) (((gint64) h * s->chunk_size + (p - pf0)) * s->head_dim) * e->es,
                              e->config.compute_dtype, dst, SIFT_DTYPE_F32, (gsize) s->head_dim);
              }
            else
              return invalid (error, "gather_rows: position %" G_GINT64_FORMAT " is not in layer %d's cache%s", p,
                              layer, p >= 0 && p < stored ? " (evicted)" : "");
          }
      i++;
    }
  SiftCounters add = { .bytes_loaded = loaded,
                       .seconds_load = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC };
  sift_engine_count (e, layer, e->phase, &add);
  return TRUE;
}

/* ---- Cross-layer pipeline ----------------------------------------------- */

/* Queues loads of `layer`'s selected blocks (NULL: all) into half `hi`. */
static gboolean
xl_queue (SiftEngine *e, int hi, gint32 layer, const SiftSelection *sel, GError **error)
{
  const SiftModelShape *s = &e->config.shape;
  XlHalf *x = &e->xl[hi];
  GArray *ids = e->store_ids[layer];
  gint64 n = sel != NULL ? (gint64) sift_selection_n_blocks (sel) : (gint64) ids->len;
  g_array_set_size (x->ids, 0);
  for (gint64 i = 0; i < n; i++)
    {
      gint64 b = sel != NULL ? sift_selection_block (sel, (gsize) i) : i;
      if (b < 0 || b >= (gint64) ids->len)
        {
          g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_SELECTION,
                       "engine: cross-layer selection of layer %d names block %" G_GINT64_FORMAT
                       ", but the layer has %u stored blocks",
                       layer, b, ids->len);
          return FALSE;
        }
      g_array_append_val (x->ids, b);
    }
  if (n > x->cap_blocks)
    {
      gint64 cap = MAX (n, x->cap_blocks * 2);
      gsize bytes = (gsize) s->n_kv_heads * (gsize) cap * (gsize) s->block_size * (gsize) s->head_dim * e->es;
      free (x->k);
      free (x->v);
      x->k = aligned_new0 (bytes);
      x->v = aligned_new0 (bytes);
      x->cap_blocks = cap;
    }
  x->layer = layer;
  x->n_blocks = n;
  g_clear_error (&x->error);
  const gint64 cap_tokens = x->cap_blocks * s->block_size;
  sift_engine_hold_wake (e, TRUE);
  for (gint64 i = 0; i < n; i++)
    {
      gint64 b = g_array_index (x->ids, gint64, i);
      gsize off = (gsize) (i * s->block_size * s->head_dim) * e->es;
      Job *j = g_new0 (Job, 1);
      *j = (Job) { .kind = JOB_LOAD, .layer = layer, .phase = SIFT_PHASE_DECODE,
                   .store_id = g_array_index (ids, gint64, b), .what = SIFT_LOAD_KV, .k = x->k + off,
                   .v = x->v + off, .cap = cap_tokens, .slot = -1, .half = hi };
      queue_job (e, j);
    }
  sift_engine_hold_wake (e, FALSE);
  return TRUE;
}

static void
xl_drain (SiftEngine *e)
{
  pthread_mutex_lock (&e->lock);
  while (e->xl[0].pending > 0 || e->xl[1].pending > 0)
    wait_done_locked (e);
  pthread_mutex_unlock (&e->lock);
}

gboolean
sift_engine_pipeline_start (SiftEngine *e, const SiftSelection *layer0_selection, GError **error)
{
  g_return_val_if_fail (e != NULL, FALSE);
  xl_drain (e);
  for (int i = 0; i < 2; i++)
    {
      e->xl[i].layer = -1;
      g_clear_error (&e->xl[i].error);
    }
  e->xl_active = TRUE;
  if (!xl_queue (e, 0, 0, layer0_selection, error))
    {
      sift_engine_pipeline_end (e);
      return FALSE;
    }
  return TRUE;
}

gboolean
sift_engine_pipeline_get (SiftEngine *e, gint32 layer, const SiftSelection *next_selection, SiftView *k,
                          SiftView *v, gsize *n_blocks_out, GError **error)
{
  g_return_val_if_fail (e != NULL && k != NULL && v != NULL, FALSE);
  const SiftModelShape *s = &e->config.shape;
  XlHalf *x = &e->xl[layer & 1];
  if (!e->xl_active || layer < 0 || layer >= s->n_layers || x->layer != layer)
    {
      g_set_error (error, SIFT_ENGINE_ERROR, SIFT_ENGINE_ERROR_STATE,
                   "engine: pipeline_get for layer %d, but the cross-layer pipeline %s", layer,
                   e->xl_active ? "is loading another layer" : "was not started");
      return FALSE;
    }
  gint64 t0 = g_get_monotonic_time ();
  pthread_mutex_lock (&e->lock);
  while (x->pending > 0)
    if (!help_locked (e))
      wait_done_locked (e);
  GError *failed = x->error;
  x->error = NULL;
  pthread_mutex_unlock (&e->lock);
  SiftCounters add = { .seconds_stalled = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC };
  sift_engine_count (e, layer, SIFT_PHASE_DECODE, &add);
  if (failed != NULL)
    {
      g_propagate_error (error, failed);
      return FALSE;
    }
  if (layer + 1 < s->n_layers && !xl_queue (e, (layer + 1) & 1, layer + 1, next_selection, error))
    return FALSE;
  SiftView kv = { x->k, e->config.compute_dtype, s->n_kv_heads, s->head_dim, x->n_blocks * s->block_size,
                  x->cap_blocks * s->block_size * s->head_dim, s->head_dim };
  *k = kv;
  *v = kv;
  v->data = x->v;
  if (n_blocks_out != NULL)
    *n_blocks_out = (gsize) x->n_blocks;
  return TRUE;
}

void
sift_engine_pipeline_end (SiftEngine *e)
{
  g_return_if_fail (e != NULL);
  xl_drain (e);
  for (int i = 0; i < 2; i++)
    {
      e->xl[i].layer = -1;
      g_clear_error (&e->xl[i].error);
    }
  e->xl_active = FALSE;
}

void
sift_engine_count_call (SiftEngine *e, const SiftPolicyContext *ctx, gsize n_available, gsize n_selected)
{
  /* Row i may attend every token before it and itself. */
  guint64 tokens = 0;
  for (gint64 i = 0; i < ctx->n_q; i++)
    tokens += (guint64) (ctx->q_pos + i + 1);
  SiftCounters add = { .blocks_available = n_available, .blocks_selected = n_selected,
                       .tokens_available = tokens * (guint64) e->config.shape.n_q_heads };
  sift_engine_count (e, ctx->layer, ctx->phase, &add);
}

void
sift_engine_count_attended (SiftEngine *e, const SiftPolicyContext *ctx, guint64 tokens)
{
  g_return_if_fail (e != NULL && ctx != NULL && ctx->layer >= 0 && ctx->layer < e->config.shape.n_layers);
  SiftCounters add = { .tokens_attended = tokens };
  sift_engine_count (e, ctx->layer, ctx->phase, &add);
}

void
sift_engine_count_summaries (SiftEngine *e, const SiftPolicyContext *ctx, guint64 rows)
{
  g_return_if_fail (e != NULL && ctx != NULL && ctx->layer >= 0 && ctx->layer < e->config.shape.n_layers);
  SiftCounters add = { .summaries_attended = rows };
  sift_engine_count (e, ctx->layer, ctx->phase, &add);
}
