/* The CPU backend's state, shared by backend-cpu.c (the method table,
 * memory, kernels) and worker.c (the copy worker and events). */
#pragma once

#include <pthread.h>

#include "backend.h"
#include "store-private.h"

/* Spinning before a wait, with back-off after a spin that timed out
 * (worker.c). Guarded by the backend lock. */
typedef struct {
  gint32 backoff;  /* waits to sleep through after the next timeout */
  gint32 skip;     /* waits left that sleep at once */
} SpinState;

/* Transfers given to an event and not finished, and the first failure's
 * error. Guarded by the backend lock. */
struct _SiftEvent {
  gint32 pending;
  GError *error;
};

typedef struct {
  SiftBackend parent;
  SiftStore *store;
  SiftModelShape shape;
  SiftDType compute;
  gsize es;                   /* bytes of one compute element */

  /* Copy worker. */
  GThread *worker;
  pthread_mutex_t lock;       /* guards everything below and the events */
  pthread_cond_t work_cond;   /* the worker waits here for transfers (signalled only when it is idle) */
  pthread_cond_t done_cond;   /* the compute side waits here for finished transfers */
  gboolean worker_idle;
  gboolean helping_store;     /* the compute thread runs a store: the worker pops nothing meanwhile */
  gint32 done_waiters;
  guint64 queue_seq;          /* atomic: bumped by every submission (the worker spins on it) */
  guint64 done_seq;           /* atomic: bumped by every finished transfer (waiters spin on it) */
  SpinState worker_spin;      /* the worker's spins for a transfer */
  SpinState waiter_spin;      /* the compute side's spins for a finished transfer */
  GQueue jobs;                /* SiftTransfer * (g_memdup2'd) */
  gint32 running;             /* transfers popped and not finished (worker and helping compute thread) */
  gint32 running_stores;      /* of those, stores */
  gboolean quit;
  gboolean store_failed;      /* a store failed: later ones are skipped until drain (forget) */
  guint8 *staging;            /* worker only: one stored block, 4 KiB aligned */
  guint8 *help_staging;       /* the compute thread's, when it runs a transfer itself */
  gsize staging_bytes;
} CpuBackend;

/* worker.c (backend-cpu.c calls it, never the reverse) */
/* Starts the worker thread (staging allocated); stops it. */
void sift_cpu_worker_start (CpuBackend *b);
void sift_cpu_worker_stop (CpuBackend *b);
void sift_cpu_submit (SiftBackend *backend, const SiftTransfer *t, gsize n);
SiftEvent *sift_cpu_event_new (SiftBackend *backend);
void sift_cpu_event_free (SiftBackend *backend, SiftEvent *ev);
SiftEventState sift_cpu_event_query (SiftBackend *backend, SiftEvent *ev);
gboolean sift_cpu_event_wait (SiftBackend *backend, SiftEvent *const *events, gsize n, gsize *n_ok,
                              GError **error);
void sift_cpu_drain (SiftBackend *backend, gboolean forget);
