/* The engine's CUDA backend (engine/backend.h): compute memory is device
 * memory (ring slots, prefill and decode buffers, the cross-layer halves,
 * a call's q, output and partials), host memory is pinned, and the GPU
 * kernels of attn.cu run on a compute stream. Loads run on a copy stream:
 * before each batch of loads the copy stream waits on a "compute done"
 * event recorded on the compute stream (a slot is never overwritten while
 * an earlier attention reads it), an event is recorded after each copy
 * call and shared by its transfers ("slot ready"), and event_wait makes
 * the compute stream wait on it, so the host only enqueues and H2D overlaps attention as the CPU
 * ring's copy worker does. A block of a pinned host store is copied
 * straight from the store; others (a file store, another dtype, a store
 * that held unpinned chunks before) are read and converted on the host
 * into pinned staging first. Stores are written on the submitting thread
 * from the engine's host image of the buffer. See docs/engine.md, "The
 * GPU backend". */
#include <string.h>

#include <cuda_runtime_api.h>

#include <sift/cuda.h>
#include <sift/error.h>

#include "backend.h"
#include "cuda-private.h"
#include "trace.h"
#include "store-private.h"

/* Pinned staging buffers for loads that cannot copy from the store in place. */
#define N_STAGING 8
/* The pinned arena that buffer_write copies through (grown to fit). */
#define ARENA_BYTES (8u << 20)

/* A point on the copy stream after one copy call (a run of whole blocks,
 * a batch of kv-head pieces, one staged block), shared by the transfers
 * of that call: one record for the call and, in event_wait, one stream
 * wait for its transfers, instead of one of each per transfer. Counted:
 * back to the backend's pool when no transfer event and no load timing
 * holds it. Timed: the loads' seconds are read from the marks. */
typedef struct {
  cudaEvent_t ev;
  gint refs;
} Mark;

/* A transfer event: the mark of the copy call that carried its last
 * transfer (NULL: never recorded); `error` is a failed staged read (found
 * when it was submitted). */
struct _SiftEvent {
  Mark *mark;
  GError *error;
};

typedef struct {
  guint8 *stored;      /* one stored block, stored dtype */
  guint8 *block;       /* one block, compute dtype, stored layout */
  cudaEvent_t free_ev; /* its copy finished */
  gboolean used;
} Staging;

/* Two events around work on a stream, timed once both completed. A
 * submit's loads (TIME_LOAD) add no event of their own to the copy stream
 * (two records between every two copies cost 0.06-0.16 ms a step of 64
 * copies, offloaded decode at 128K: docs/benchmarks.md): a is the
 * submit's "compute done" event on the compute stream, which the copies
 * wait for, `end` the mark after its last copy and `prev` the copy
 * stream's mark before its first (NULL: none); the copies ran from the
 * later of a and prev to end. Both marks are held until read. */
typedef struct {
  cudaEvent_t a, b;    /* TIME_LOAD: b is end->ev */
  int kind;            /* TIME_STALL, TIME_LOAD, TIME_COMPUTE */
  Mark *prev, *end;
} Timed;

enum { TIME_STALL, TIME_LOAD, TIME_COMPUTE };

typedef struct {
  SiftBackend parent;
  SiftStore *store;
  SiftModelShape shape;
  SiftDType compute;
  gsize es;
  cudaStream_t cs;           /* compute: kernels, buffer_* */
  cudaStream_t xs;           /* copy: loads */
  Mark *xs_mark;             /* the last mark recorded on xs (held) */
  SiftCudaScratch scratch;
  gboolean store_pinned;     /* every block of the host store is pinned memory */
  gboolean store_failed;     /* a store failed: later ones are skipped until drain (forget) */
  Staging staging[N_STAGING];
  guint next_staging;
  guint8 *pack;              /* a stored block, for stores */
  guint8 *readback;          /* a block of compute elements read back (stores without a host image) */
  guint8 *arena;             /* pinned; buffer_write's source copies */
  gsize arena_size, arena_at;
  cudaEvent_t arena_ev;      /* recorded after the last write that used the arena */
  GArray *piece_dst, *piece_src, *piece_size; /* a batch of copies being built (run_loads) */
  GPtrArray *marks;          /* Mark, every one made (freed with the backend) */
  GPtrArray *marks_free;     /* Mark, held by no event */
  GArray *timed;             /* Timed, not yet read */
  GArray *event_pool;        /* cudaEvent_t with timing, free */
  SiftCudaTrace *trace;      /* SIFT_CUDA_TRACE (trace.h); NULL: off */
  GError *sticky;            /* the first CUDA failure of an asynchronous call */
} CudaBackend;

static void
note_failure (CudaBackend *b, cudaError_t err, const char *what)
{
  if (err == cudaSuccess || b->sticky != NULL)
    return;
  b->sticky = g_error_new (SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_FAILED, "%s: %s", what, cudaGetErrorString (err));
}

static gboolean
check (cudaError_t err, const char *what, GError **error)
{
  if (err == cudaSuccess)
    return TRUE;
  g_set_error (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_FAILED, "%s: %s", what, cudaGetErrorString (err));
  return FALSE;
}

/* ---- Timing ------------------------------------------------------------ */

static cudaEvent_t
timing_event (CudaBackend *b)
{
  cudaEvent_t ev = NULL;
  if (b->event_pool->len > 0)
    {
      ev = g_array_index (b->event_pool, cudaEvent_t, b->event_pool->len - 1);
      g_array_set_size (b->event_pool, b->event_pool->len - 1);
    }
  else
    note_failure (b, cudaEventCreate (&ev), "cudaEventCreate");
  return ev;
}

static Timed
time_begin (CudaBackend *b, cudaStream_t s, int kind)
{
  Timed t = { .a = timing_event (b), .b = timing_event (b), .kind = kind };
  cudaEventRecord (t.a, s);
  return t;
}

static void
time_end (CudaBackend *b, Timed *t, cudaStream_t s)
{
  cudaEventRecord (t->b, s);
  g_array_append_val (b->timed, *t);
}

static void mark_drop (CudaBackend *b, Mark *m);

static void
cuda_timings (SiftBackend *backend, SiftBackendTimes *out)
{
  CudaBackend *b = (CudaBackend *) backend;
  const gint64 t0 = g_get_monotonic_time ();
  *out = (SiftBackendTimes) { 0 };
  guint kept = 0;
  for (guint i = 0; i < b->timed->len; i++)
    {
      Timed t = g_array_index (b->timed, Timed, i);
      float ms = 0, since_prev = 0;
      if (cudaEventQuery (t.b) != cudaSuccess || cudaEventElapsedTime (&ms, t.a, t.b) != cudaSuccess
          || (t.prev != NULL && cudaEventElapsedTime (&since_prev, t.prev->ev, t.b) != cudaSuccess))
        {
          g_array_index (b->timed, Timed, kept++) = t; /* later */
          continue;
        }
      if (t.prev != NULL)
        ms = MIN (ms, since_prev); /* loads: from the later of a and prev */
      const gdouble s = ms / 1000.0;
      if (t.kind == TIME_LOAD)
        out->load += s;
      else if (t.kind == TIME_STALL)
        out->stalled += s;
      else
        out->compute += s;
      g_array_append_val (b->event_pool, t.a);
      if (t.kind == TIME_LOAD) /* b is the end mark's event */
        {
          mark_drop (b, t.prev);
          mark_drop (b, t.end);
        }
      else
        g_array_append_val (b->event_pool, t.b);
    }
  cudaGetLastError (); /* a query's cudaErrorNotReady is no failure */
  g_array_set_size (b->timed, kept);
  sift_cuda_trace_host (b->trace, SIFT_TRACE_TIMINGS, t0);
}

/* ---- Memory -------------------------------------------------------------- */

/* Every live pinned allocation's range: one copy must not span two, even
 * where they lie back to back in the address space (the host store's
 * chunks: consecutive blocks across a chunk boundary are two copies). */
typedef struct {
  guintptr lo, hi;
} PinnedRange;
static GMutex pinned_lock;
static GArray *pinned_ranges;

/* Pinned host memory, zeroed; the host store's chunks too (no backend
 * needed to free them: the store may outlive the engine). */
static void *
pinned_alloc (gsize size)
{
  void *p = NULL;
  cudaError_t err = cudaHostAlloc (&p, MAX (size, 1), cudaHostAllocPortable);
  if (err != cudaSuccess)
    g_error ("engine: cannot pin %" G_GSIZE_FORMAT " bytes of host memory: %s", size, cudaGetErrorString (err));
  memset (p, 0, MAX (size, 1));
  PinnedRange r = { (guintptr) p, (guintptr) p + MAX (size, 1) };
  g_mutex_lock (&pinned_lock);
  if (pinned_ranges == NULL)
    pinned_ranges = g_array_new (FALSE, FALSE, sizeof (PinnedRange));
  g_array_append_val (pinned_ranges, r);
  g_mutex_unlock (&pinned_lock);
  return p;
}

static void
pinned_free (void *p, gsize size)
{
  (void) size;
  if (p == NULL)
    return;
  g_mutex_lock (&pinned_lock);
  for (guint i = 0; pinned_ranges != NULL && i < pinned_ranges->len; i++)
    if (g_array_index (pinned_ranges, PinnedRange, i).lo == (guintptr) p)
      {
        g_array_remove_index_fast (pinned_ranges, i);
        break;
      }
  g_mutex_unlock (&pinned_lock);
  cudaFreeHost (p);
}

/* The end of the pinned allocation that holds p (0: none): a run of
 * copies from p may extend up to it, one lookup per run. */
static guintptr
pinned_end (const guint8 *p)
{
  guintptr end = 0;
  g_mutex_lock (&pinned_lock);
  for (guint i = 0; pinned_ranges != NULL && i < pinned_ranges->len && end == 0; i++)
    {
      const PinnedRange *r = &g_array_index (pinned_ranges, PinnedRange, i);
      if ((guintptr) p >= r->lo && (guintptr) p < r->hi)
        end = r->hi;
    }
  g_mutex_unlock (&pinned_lock);
  return end;
}

static void *
cuda_host_alloc (SiftBackend *backend, gsize size)
{
  (void) backend;
  return pinned_alloc (size);
}

static void
cuda_host_free (SiftBackend *backend, void *p, gsize size)
{
  (void) backend;
  pinned_free (p, size);
}

static gboolean
cuda_buffer_alloc (SiftBackend *backend, gsize size, SiftBuffer *out, GError **error)
{
  CudaBackend *b = (CudaBackend *) backend;
  void *p = NULL;
  if (!check (cudaMalloc (&p, MAX (size, 1)), "cudaMalloc", error))
    return FALSE;
  if (!check (cudaMemsetAsync (p, 0, MAX (size, 1), b->cs), "cudaMemset", error))
    {
      cudaFree (p);
      return FALSE;
    }
  *out = (SiftBuffer) { SIFT_MEMORY_DEVICE, p, size, NULL };
  return TRUE;
}

static void
cuda_buffer_free (SiftBackend *backend, SiftBuffer *buf)
{
  (void) backend;
  cudaFree (buf->data); /* waits for the work that uses it */
  *buf = (SiftBuffer) { 0 };
}

/* Room for n bytes in the arena: the writes that used it before a wrap
 * must have finished reading it. */
static guint8 *
arena_take (CudaBackend *b, gsize n)
{
  n = (n + 255) / 256 * 256;
  if (n > b->arena_size)
    {
      cudaEventSynchronize (b->arena_ev);
      pinned_free (b->arena, b->arena_size);
      b->arena_size = MAX (n, 2 * b->arena_size);
      b->arena = pinned_alloc (b->arena_size);
      b->arena_at = 0;
    }
  if (b->arena_at + n > b->arena_size)
    {
      cudaEventSynchronize (b->arena_ev);
      b->arena_at = 0;
    }
  guint8 *p = b->arena + b->arena_at;
  b->arena_at += n;
  return p;
}

/* Host -> compute memory on the compute stream. The source is copied into
 * the pinned arena first, so the caller may change it at once and the
 * copy is a DMA that overlaps the kernels before it. */
static void
cuda_buffer_write (SiftBackend *backend, guint8 *dst, const void *src, gsize n)
{
  CudaBackend *b = (CudaBackend *) backend;
  if (n == 0)
    return;
  guint8 *p = arena_take (b, n);
  memcpy (p, src, n);
  const guint tr = sift_cuda_trace_begin (b->trace, SIFT_TRACE_WRITE, b->cs);
  note_failure (b, cudaMemcpyAsync (dst, p, n, cudaMemcpyHostToDevice, b->cs), "copy to the GPU (buffer write)");
  cudaEventRecord (b->arena_ev, b->cs);
  sift_cuda_trace_end (b->trace, tr, b->cs, n);
}

static void
cuda_buffer_move (SiftBackend *backend, guint8 *dst, const guint8 *src, gsize n)
{
  CudaBackend *b = (CudaBackend *) backend;
  if (n > 0)
    note_failure (b, cudaMemcpyAsync (dst, src, n, cudaMemcpyDeviceToDevice, b->cs), "copy on the GPU");
}

static void
cuda_buffer_move_rows (SiftBackend *backend, guint8 *dst, gsize dst_pitch, const guint8 *src, gsize src_pitch,
                       gsize width, gsize rows)
{
  CudaBackend *b = (CudaBackend *) backend;
  if (width > 0 && rows > 0)
    note_failure (b, cudaMemcpy2DAsync (dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, b->cs),
                  "copy on the GPU");
}

static void
cuda_buffer_clear (SiftBackend *backend, guint8 *dst, gsize n)
{
  CudaBackend *b = (CudaBackend *) backend;
  if (n > 0)
    note_failure (b, cudaMemsetAsync (dst, 0, n, b->cs), "cudaMemset");
}

/* Compute memory -> host, after every compute call before it; reports a
 * failure of any asynchronous call since the last one. */
static gboolean
cuda_buffer_read (SiftBackend *backend, void *dst, const guint8 *src, gsize n, GError **error)
{
  CudaBackend *b = (CudaBackend *) backend;
  const guint tr = sift_cuda_trace_begin (b->trace, SIFT_TRACE_READ, b->cs);
  note_failure (b, cudaMemcpyAsync (dst, src, n, cudaMemcpyDeviceToHost, b->cs), "copy from the GPU");
  note_failure (b, cudaStreamSynchronize (b->cs), "a GPU kernel failed");
  sift_cuda_trace_end (b->trace, tr, b->cs, n);
  sift_cuda_trace_anchor (b->trace);
  if (b->sticky == NULL)
    return TRUE;
  g_set_error (error, b->sticky->domain, b->sticky->code, "%s", b->sticky->message);
  return FALSE;
}

static gboolean
cuda_can_map (SiftBackend *backend, SiftStore *store, SiftDType compute_dtype)
{
  (void) backend, (void) store, (void) compute_dtype;
  return FALSE; /* the kernels read device memory only */
}

/* ---- Transfers ------------------------------------------------------------ */

static void
mark_drop (CudaBackend *b, Mark *m)
{
  if (m != NULL && --m->refs == 0)
    g_ptr_array_add (b->marks_free, m);
}

/* A mark recorded now on the copy stream, after every copy submitted so far. */
static Mark *
mark_record (CudaBackend *b)
{
  Mark *m;
  if (b->marks_free->len > 0)
    m = g_ptr_array_steal_index_fast (b->marks_free, b->marks_free->len - 1);
  else
    {
      m = g_new0 (Mark, 1);
      note_failure (b, cudaEventCreate (&m->ev), "cudaEventCreate"); /* timed: loads' seconds */
      g_ptr_array_add (b->marks, m);
    }
  cudaEventRecord (m->ev, b->xs);
  m->refs++; /* xs_mark's hold */
  mark_drop (b, b->xs_mark);
  b->xs_mark = m;
  return m;
}

/* Gives the n transfers' events the mark m (m was recorded after their copies). */
static void
mark_events (CudaBackend *b, const SiftTransfer *t, gsize n, Mark *m)
{
  for (gsize j = 0; j < n; j++)
    {
      SiftEvent *ev = t[j].event;
      m->refs++;
      mark_drop (b, ev->mark);
      ev->mark = m;
    }
}

static void
event_fail (SiftEvent *ev, GError *err)
{
  if (ev->error == NULL)
    ev->error = err;
  else
    g_error_free (err);
}

/* Copies one half (K or V: [n_kv_heads][block_size][head_dim] compute
 * elements at src, host) into dst of `cap` tokens per head, on the copy
 * stream: one 2D copy per run of the kv heads asked for (kv_heads as
 * SiftTransfer's: 0, every head, one copy). */
static void
copy_half (CudaBackend *b, guint8 *dst, gint64 cap, const guint8 *src, guint64 kv_heads)
{
  const SiftModelShape *s = &b->shape;
  const gsize width = (gsize) s->block_size * (gsize) s->head_dim * b->es;
  const gsize pitch = (gsize) cap * (gsize) s->head_dim * b->es;
  for (gint32 h0, h1 = 0; sift_kv_heads_next (kv_heads, s->n_kv_heads, &h0, &h1);)
    note_failure (b, cudaMemcpy2DAsync (dst + (gsize) h0 * pitch, pitch, src + (gsize) h0 * width, width, width,
                                        (gsize) (h1 - h0), cudaMemcpyHostToDevice, b->xs),
                  "copy to the GPU (a half, 2D)");
}

/* A staged load: the stored rows of the kv heads asked for (of the half,
 * or both) read on the host into pinned staging, converted to the compute
 * dtype, copied from there; the other heads' rows are neither read nor
 * touched (a packed slot holds other blocks' rows there). Ranges that
 * meet are read as one (every head of K and V: one read of the block).
 * *bytes: the stored bytes read, as the CPU backend counts them. */
static gboolean
load_staged (CudaBackend *b, const SiftTransfer *t, gboolean want_k, gboolean want_v, guint64 *bytes,
             GError **error)
{
  SiftStore *st = b->store;
  const SiftModelShape *s = &b->shape;
  const gsize kb = st->k_bytes;
  const gsize head_stored = (gsize) s->block_size * sift_store_row_bytes (st);
  const gsize head_elems = (gsize) s->block_size * (gsize) s->head_dim;
  const gsize half = (gsize) s->n_kv_heads * head_elems * b->es;
  Staging *sg = &b->staging[b->next_staging++ % N_STAGING];
  if (sg->used)
    cudaEventSynchronize (sg->free_ev); /* its previous copy read it */
  *bytes = 0;
  gsize r_at = 0, r_n = 0; /* the read being gathered */
  gboolean ok = TRUE;
  for (int h = 0; h < 2 && ok; h++)
    for (gint32 h0, h1 = 0; ok && (h == 0 ? want_k : want_v) && sift_kv_heads_next (t->kv_heads, s->n_kv_heads, &h0, &h1);)
      {
        const gsize at = (gsize) h * kb + (gsize) h0 * head_stored, n = (gsize) (h1 - h0) * head_stored;
        if (r_n > 0 && at != r_at + r_n)
          ok = sift_store_read (st, t->store_id, r_at, sg->stored + r_at, r_n, error), r_n = 0;
        if (r_n == 0)
          r_at = at;
        r_n += n;
        *bytes += n;
      }
  if (!ok || (r_n > 0 && !sift_store_read (st, t->store_id, r_at, sg->stored + r_at, r_n, error)))
    return FALSE; /* nothing was copied from this staging */
  for (int h = 0; h < 2; h++)
    {
      if (!(h == 0 ? want_k : want_v))
        continue;
      guint8 *block = sg->block + (gsize) h * half;
      for (gint32 h0, h1 = 0; sift_kv_heads_next (t->kv_heads, s->n_kv_heads, &h0, &h1);)
        sift_convert (sg->stored + (gsize) h * kb + (gsize) h0 * head_stored, st->config.dtype,
                      block + (gsize) h0 * head_elems * b->es, b->compute, (gsize) (h1 - h0) * head_elems);
      copy_half (b, h == 0 ? t->k : t->v, t->cap, block, t->kv_heads);
    }
  cudaEventRecord (sg->free_ev, b->xs);
  sg->used = TRUE;
  return TRUE;
}

/* The stored bytes of a load's block when the copy can read them in
 * place (pinned host store, the compute dtype), else NULL. */
static const guint8 *
in_place (CudaBackend *b, const SiftTransfer *t)
{
  return b->store_pinned && b->store->config.dtype == b->compute ? sift_store_map (b->store, t->store_id) : NULL;
}

/* Whether a load copies its block whole into a slot: K and V, one block
 * of cap, V right after K on both sides (the stored layout). */
static gboolean
whole_block (CudaBackend *b, const SiftTransfer *t)
{
  return t->what == SIFT_LOAD_KV && t->cap == b->shape.block_size && t->v == t->k + b->store->k_bytes;
}

/* The copies of one in-place load of some kv heads: each run of wanted
 * heads is one piece per half when the destination is a whole slot (cap
 * of a block), else one piece per head. Appends to dst/src/size; returns
 * the bytes. */
static guint64
head_pieces (CudaBackend *b, const SiftTransfer *t, const guint8 *p, GArray *dst, GArray *src, GArray *size)
{
  const SiftModelShape *s = &b->shape;
  const gsize head = (gsize) s->block_size * (gsize) s->head_dim * b->es;
  const gsize head_dst = (gsize) t->cap * (gsize) s->head_dim * b->es;
  const gboolean slot = t->cap == s->block_size;
  guint64 bytes = 0;
  for (gint32 h0, h1 = 0; sift_kv_heads_next (t->kv_heads, s->n_kv_heads, &h0, &h1);)
    {
      if (!slot)
        h1 = h0 + 1; /* a piece per head (the next call resumes at h0 + 1) */
      for (int half = 0; half < 2; half++)
        {
          if (!((t->what & (half == 0 ? SIFT_LOAD_K : SIFT_LOAD_V)) != 0))
            continue;
          void *d = (half == 0 ? t->k : t->v) + (gsize) h0 * head_dst;
          const void *sp = p + (gsize) half * b->store->k_bytes + (gsize) h0 * head;
          gsize n = (gsize) (h1 - h0) * head;
          g_array_append_val (dst, d);
          g_array_append_val (src, sp);
          g_array_append_val (size, n);
          bytes += n;
        }
    }
  return bytes;
}

/* One batch of host -> device copies on the copy stream (one call for
 * all of them: a selection's heads are many small pieces). */
static void
copy_batch (CudaBackend *b, GArray *dst, GArray *src, GArray *size)
{
  if (dst->len == 0)
    return;
  struct cudaMemcpyAttributes attr = { .srcAccessOrder = cudaMemcpySrcAccessOrderStream };
  size_t idx = 0;
  cudaError_t e = cudaMemcpyBatchAsync ((void *const *) (void *) dst->data, (const void *const *) (void *) src->data,
                                        (const size_t *) (void *) size->data, dst->len, &attr, &idx, 1, b->xs);
  if (e != cudaSuccess) /* a driver without batches: one copy each */
    {
      cudaGetLastError ();
      for (guint i = 0; i < dst->len; i++)
        note_failure (b, cudaMemcpyAsync (g_array_index (dst, void *, i), g_array_index (src, const void *, i),
                                          g_array_index (size, gsize, i), cudaMemcpyHostToDevice, b->xs),
                      "copy to the GPU (kv heads)");
    }
  g_array_set_size (dst, 0);
  g_array_set_size (src, 0);
  g_array_set_size (size, 0);
}

/* Loads t[0..n) from the store: runs of whole blocks that lie back to
 * back both in the pinned store and in compute memory (a group of ring
 * slots filled from consecutive stored blocks) are one copy; runs of
 * in-place loads of some kv heads are one batch of copies, those heads'
 * rows only; other in-place loads one 2D copy per half; the rest are
 * staged (the heads asked for). One mark is recorded after each copy call and
 * given to the events of its transfers. */
static void
run_loads (CudaBackend *b, const SiftTransfer *t, gsize n)
{
  SiftStore *st = b->store;
  const gsize kb = st->k_bytes, bb = st->block_bytes;
  for (gsize i = 0; i < n;)
    {
      const SiftTransfer *ti = &t[i];
      const gboolean want_k = (ti->what & SIFT_LOAD_K) != 0, want_v = (ti->what & SIFT_LOAD_V) != 0;
      guint64 bytes = (want_k && want_v) ? 2 * kb : kb;
      const guint8 *p = in_place (b, ti);
      GError *err = NULL;
      gboolean ok = TRUE;
      gsize run = 1;
      const guint trc = sift_cuda_trace_begin (b->trace, SIFT_TRACE_COPY, b->xs);
      if (p != NULL && sift_transfer_some_heads (ti, b->shape.n_kv_heads))
        {
          guint64 each[64];
          each[0] = head_pieces (b, ti, p, b->piece_dst, b->piece_src, b->piece_size);
          const guint8 *pr;
          while (i + run < n && run < G_N_ELEMENTS (each) && t[i + run].kind == SIFT_TRANSFER_LOAD
                 && (pr = in_place (b, &t[i + run])) != NULL && sift_transfer_some_heads (&t[i + run], b->shape.n_kv_heads))
            {
              each[run] = head_pieces (b, &t[i + run], pr, b->piece_dst, b->piece_src, b->piece_size);
              run++;
            }
          copy_batch (b, b->piece_dst, b->piece_src, b->piece_size);
          guint64 all = 0;
          for (gsize j = i; j < i + run; j++)
            {
              b->parent.setup.sink.done (b->parent.setup.sink.user, &t[j], TRUE, each[j - i], 0.0, NULL);
              all += each[j - i];
            }
          sift_cuda_trace_end (b->trace, trc, b->xs, all);
          mark_events (b, t + i, run, mark_record (b));
          i += run;
          continue;
        }
      if (p != NULL && whole_block (b, ti))
        {
          const guintptr end = pinned_end (p);
          while (i + run < n && t[i + run].kind == SIFT_TRANSFER_LOAD && whole_block (b, &t[i + run])
                 && t[i + run].k == ti->k + run * bb && in_place (b, &t[i + run]) == p + run * bb
                 && (guintptr) p + (run + 1) * bb <= end)
            run++;
          note_failure (b, cudaMemcpyAsync (ti->k, p, run * bb, cudaMemcpyHostToDevice, b->xs),
                        "copy to the GPU (blocks to slots)");
        }
      else if (p != NULL)
        {
          if (want_k)
            copy_half (b, ti->k, ti->cap, p, 0);
          if (want_v)
            copy_half (b, ti->v, ti->cap, p + kb, 0);
        }
      else
        ok = load_staged (b, ti, want_k, want_v, &bytes, &err);
      for (gsize j = i; j < i + run; j++)
        {
          b->parent.setup.sink.done (b->parent.setup.sink.user, &t[j], ok, ok ? bytes : 0, 0.0, err);
          if (!ok)
            event_fail (t[j].event, err);
        }
      sift_cuda_trace_end (b->trace, trc, b->xs, ok ? run * bytes : 0);
      mark_events (b, t + i, run, mark_record (b));
      i += run;
    }
}

/* Packs one half from [n_kv_heads][cap][head_dim] compute elements
 * (host) into the stored layout and dtype. */
static void
pack_half (CudaBackend *b, const guint8 *src, gint64 cap, guint8 *stored)
{
  const SiftModelShape *s = &b->shape;
  const gsize head_stored = (gsize) s->block_size * sift_store_row_bytes (b->store);
  const gsize n = (gsize) s->block_size * (gsize) s->head_dim;
  for (gint32 h = 0; h < s->n_kv_heads; h++)
    sift_convert (src + (gsize) h * (gsize) cap * (gsize) s->head_dim * b->es, b->compute,
                  stored + h * head_stored, b->store->config.dtype, n);
}

/* A store, on this thread: from the host image when the engine keeps one,
 * else from compute memory read back (after the compute stream's work). */
static void
run_store (CudaBackend *b, const SiftTransfer *t)
{
  const SiftModelShape *s = &b->shape;
  GError *err = NULL;
  gboolean ok = TRUE;
  guint64 bytes = 0;
  gint64 t0 = g_get_monotonic_time ();
  if (!b->store_failed)
    {
      const guint8 *hk = t->host_k, *hv = t->host_v;
      gint64 cap = t->cap;
      if (hk == NULL)
        {
          const gsize width = (gsize) s->block_size * (gsize) s->head_dim * b->es;
          const gsize pitch = (gsize) t->cap * (gsize) s->head_dim * b->es;
          const gsize half = width * (gsize) s->n_kv_heads;
          note_failure (b, cudaMemcpy2DAsync (b->readback, width, t->k, pitch, width, (gsize) s->n_kv_heads,
                                              cudaMemcpyDeviceToHost, b->cs), "copy from the GPU");
          note_failure (b, cudaMemcpy2DAsync (b->readback + half, width, t->v, pitch, width, (gsize) s->n_kv_heads,
                                              cudaMemcpyDeviceToHost, b->cs), "copy from the GPU");
          note_failure (b, cudaStreamSynchronize (b->cs), "a GPU kernel failed");
          hk = b->readback, hv = b->readback + half, cap = s->block_size;
        }
      pack_half (b, hk, cap, b->pack);
      pack_half (b, hv, cap, b->pack + b->store->k_bytes);
      ok = sift_store_write (b->store, t->store_id, b->pack, &err);
      bytes = ok ? b->store->block_bytes : 0;
      b->store_failed = !ok;
    }
  gdouble secs = (gdouble) (g_get_monotonic_time () - t0) / G_USEC_PER_SEC;
  b->parent.setup.sink.done (b->parent.setup.sink.user, t, ok, bytes, secs, err);
  if (!ok)
    event_fail (t->event, err);
}

static void
cuda_submit (SiftBackend *backend, const SiftTransfer *t, gsize n)
{
  CudaBackend *b = (CudaBackend *) backend;
  gboolean loads = FALSE;
  for (gsize i = 0; i < n && !loads; i++)
    loads = t[i].kind == SIFT_TRANSFER_LOAD;
  Timed tm = { NULL, NULL, TIME_LOAD, NULL, NULL };
  const gint64 t0 = g_get_monotonic_time ();
  if (loads)
    {
      /* Compute done: nothing attended before this call still reads the
       * memory these loads overwrite. */
      tm.a = timing_event (b);
      cudaEventRecord (tm.a, b->cs);
      cudaStreamWaitEvent (b->xs, tm.a, 0);
      if ((tm.prev = b->xs_mark) != NULL)
        tm.prev->refs++;
    }
  for (gsize i = 0; i < n;)
    {
      gsize run = 0; /* loads in submission order, stores between them */
      while (i + run < n && t[i + run].kind == SIFT_TRANSFER_LOAD)
        run++;
      if (run > 0)
        run_loads (b, t + i, run), i += run;
      else
        run_store (b, &t[i++]);
    }
  if (loads)
    {
      /* Every load made a copy call, which recorded a mark. */
      tm.end = b->xs_mark;
      tm.end->refs++;
      tm.b = tm.end->ev;
      g_array_append_val (b->timed, tm);
      sift_cuda_trace_host (b->trace, SIFT_TRACE_SUBMIT, t0);
    }
}

static SiftEvent *
cuda_event_new (SiftBackend *backend)
{
  (void) backend;
  return g_new0 (SiftEvent, 1);
}

static void
cuda_event_free (SiftBackend *backend, SiftEvent *ev)
{
  if (ev == NULL)
    return;
  mark_drop ((CudaBackend *) backend, ev->mark);
  g_clear_error (&ev->error);
  g_free (ev);
}

static SiftEventState
cuda_event_query (SiftBackend *backend, SiftEvent *ev)
{
  (void) backend;
  if (ev->mark != NULL && cudaEventQuery (ev->mark->ev) == cudaErrorNotReady)
    {
      cudaGetLastError ();
      return SIFT_EVENT_PENDING;
    }
  return ev->error != NULL ? SIFT_EVENT_FAILED : SIFT_EVENT_DONE;
}

/* The compute stream waits for the events (the host goes on), once per
 * mark where several share one; the wait is timed on the compute stream
 * as stalled time. */
static gboolean
cuda_event_wait (SiftBackend *backend, SiftEvent *const *events, gsize n, gsize *n_ok, GError **error)
{
  CudaBackend *b = (CudaBackend *) backend;
  gsize i = 0;
  gboolean ok = TRUE;
  Timed tm = { .kind = TIME_STALL };
  gboolean timing = FALSE;
  guint tr = 0;
  const Mark *waited = NULL; /* the last mark waited for: transfers of one copy call come together */
  for (; i < n; i++)
    {
      SiftEvent *ev = events[i];
      if (ev->error != NULL)
        {
          g_propagate_error (error, ev->error);
          ev->error = NULL;
          ok = FALSE;
          break;
        }
      if (ev->mark == NULL || ev->mark == waited)
        continue;
      if (!timing)
        {
          tm = time_begin (b, b->cs, TIME_STALL), timing = TRUE;
          tr = sift_cuda_trace_begin (b->trace, SIFT_TRACE_STALL, b->cs);
        }
      cudaStreamWaitEvent (b->cs, ev->mark->ev, 0);
      waited = ev->mark;
    }
  if (timing)
    {
      time_end (b, &tm, b->cs);
      sift_cuda_trace_end (b->trace, tr, b->cs, 0);
    }
  if (n_ok != NULL)
    *n_ok = i;
  return ok;
}

static void
cuda_drain (SiftBackend *backend, gboolean forget)
{
  CudaBackend *b = (CudaBackend *) backend;
  note_failure (b, cudaStreamSynchronize (b->xs), "a copy to the GPU failed");
  note_failure (b, cudaStreamSynchronize (b->cs), "a GPU kernel failed");
  if (forget)
    b->store_failed = FALSE;
}

/* ---- Kernels ---------------------------------------------------------- */

/* A paged call on the compute stream, timed from its first launch: the
 * host's preparation (block views, table) overlaps earlier GPU work and is
 * in the caller's wall time. kv_heads: blocks masked per kv head, or NULL. */
static gboolean
timed_paged (CudaBackend *b, const guint64 *kv_heads, const SiftView *q, const SiftView *k, const SiftView *v, gsize n,
             const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error)
{
  Timed tm = { .a = timing_event (b), .b = timing_event (b), .kind = TIME_COMPUTE };
  const guint tr = sift_cuda_trace_begin (b->trace, SIFT_TRACE_ATTN, b->cs);
  gboolean ok = sift_cuda_attn_paged_on (b->cs, &b->scratch, tm.a, kv_heads, q, k, v, n, opts, out, lse, error);
  if (!ok)
    cudaEventRecord (tm.a, b->cs);
  time_end (b, &tm, b->cs);
  sift_cuda_trace_end (b->trace, tr, b->cs, n);
  return ok;
}

static gboolean
cuda_attend (SiftBackend *backend, const SiftView *q, const SiftView *k, const SiftView *v, gsize n,
             const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error)
{
  return timed_paged ((CudaBackend *) backend, NULL, q, k, v, n, opts, out, lse, error);
}

/* Blocks masked per kv head: one launch where each kv head's rows fit the
 * decode kernel; else one call per kv head over its blocks, with the
 * causal offset less the tokens it skips (backend.h). */
static gboolean
cuda_attend_heads (SiftBackend *backend, const SiftView *q, const SiftView *k, const SiftView *v, const guint64 *kv_heads,
                   gsize n, const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error)
{
  CudaBackend *b = (CudaBackend *) backend;
  const gint32 nkv = b->shape.n_kv_heads, G = q->n_heads / nkv;
  if ((gint64) G * q->n_tokens <= SIFT_CUDA_MASKED_MAX_ROWS)
    return timed_paged (b, kv_heads, q, k, v, n, opts, out, lse, error);
  g_autofree SiftView *ks = g_new (SiftView, MAX (n, 1)), *vs = g_new (SiftView, MAX (n, 1));
  for (gint32 g = 0; g < nkv; g++)
    {
      gsize m = 0;
      gint64 skipped = 0;
      for (gsize i = 0; i < n; i++)
        if ((kv_heads[i] >> g) & 1)
          {
            ks[m] = sift_view_heads (&k[i], g, 1);
            vs[m++] = sift_view_heads (&v[i], g, 1);
          }
        else
          skipped += k[i].n_tokens;
      SiftAttnOpts o = *opts;
      o.q_offset -= skipped;
      SiftView qs = sift_view_heads (q, g * G, G), os = sift_view_heads (out, g * G, G);
      if (!cuda_attend (backend, &qs, ks, vs, m, &o, &os, lse + (gsize) g * (gsize) G * (gsize) q->n_tokens, error))
        return FALSE;
    }
  return TRUE;
}

static gboolean
cuda_merge (SiftBackend *backend, SiftView *out, float *lse, const SiftView *part, const float *part_lse,
            GError **error)
{
  CudaBackend *b = (CudaBackend *) backend;
  Timed tm = time_begin (b, b->cs, TIME_COMPUTE);
  const guint tr = sift_cuda_trace_begin (b->trace, SIFT_TRACE_MERGE, b->cs);
  gboolean ok = sift_cuda_attn_merge_on (b->cs, out, lse, part, part_lse, error);
  time_end (b, &tm, b->cs);
  sift_cuda_trace_end (b->trace, tr, b->cs, 0);
  return ok;
}

static void
cuda_free (SiftBackend *backend)
{
  CudaBackend *b = (CudaBackend *) backend;
  if (b->cs != NULL && b->xs != NULL)
    cuda_drain (backend, FALSE);
  for (guint i = 0; i < N_STAGING; i++)
    {
      pinned_free (b->staging[i].stored, 0);
      pinned_free (b->staging[i].block, 0);
      if (b->staging[i].free_ev != NULL)
        cudaEventDestroy (b->staging[i].free_ev);
    }
  pinned_free (b->pack, 0);
  pinned_free (b->readback, 0);
  pinned_free (b->arena, 0);
  SiftBackendTimes t;
  cuda_timings (backend, &t);
  sift_cuda_trace_free (b->trace);
  b->trace = NULL;
  for (guint i = 0; i < b->timed->len; i++)
    {
      const Timed *t = &g_array_index (b->timed, Timed, i);
      cudaEventDestroy (t->a);
      if (t->kind != TIME_LOAD) /* else a mark's, destroyed below */
        cudaEventDestroy (t->b);
    }
  for (guint i = 0; i < b->event_pool->len; i++)
    cudaEventDestroy (g_array_index (b->event_pool, cudaEvent_t, i));
  g_array_unref (b->timed);
  g_array_unref (b->event_pool);
  for (guint i = 0; i < b->marks->len; i++)
    {
      Mark *m = g_ptr_array_index (b->marks, i);
      cudaEventDestroy (m->ev);
      g_free (m);
    }
  g_ptr_array_unref (b->marks);
  g_ptr_array_unref (b->marks_free);
  g_array_unref (b->piece_dst);
  g_array_unref (b->piece_src);
  g_array_unref (b->piece_size);
  if (b->arena_ev != NULL)
    cudaEventDestroy (b->arena_ev);
  sift_cuda_scratch_clear (&b->scratch);
  if (b->cs != NULL)
    cudaStreamDestroy (b->cs);
  if (b->xs != NULL)
    cudaStreamDestroy (b->xs);
  g_clear_error (&b->sticky);
  g_free (b);
}

static const SiftBackendOps cuda_ops = {
  .version = SIFT_BACKEND_VERSION,
  .struct_size = sizeof (SiftBackendOps),
  .name = "cuda",
  .free = cuda_free,
  .buffer_alloc = cuda_buffer_alloc,
  .buffer_free = cuda_buffer_free,
  .buffer_write = cuda_buffer_write,
  .buffer_move = cuda_buffer_move,
  .buffer_clear = cuda_buffer_clear,
  .host_alloc = cuda_host_alloc,
  .host_free = cuda_host_free,
  .can_map = cuda_can_map,
  .submit = cuda_submit,
  .event_new = cuda_event_new,
  .event_free = cuda_event_free,
  .event_query = cuda_event_query,
  .event_wait = cuda_event_wait,
  .drain = cuda_drain,
  .attend = cuda_attend,
  .merge = cuda_merge,
  .buffer_read = cuda_buffer_read,
  .timings = cuda_timings,
  .buffer_move_rows = cuda_buffer_move_rows,
  .attend_heads = cuda_attend_heads,
};

SiftBackend *
sift_backend_cuda_new (const SiftBackendSetup *setup, GError **error)
{
  g_return_val_if_fail (setup != NULL && setup->store != NULL && setup->sink.done != NULL, NULL);
  if (!sift_cuda_init (error))
    return NULL;
  const SiftModelShape *s = &setup->shape;
  if (setup->compute_dtype != SIFT_DTYPE_F16 && setup->compute_dtype != SIFT_DTYPE_BF16)
    {
      g_set_error (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_UNSUPPORTED,
                   "compute dtype %s: the GPU kernels take f16 or bf16 (kv.compute_dtype)",
                   sift_dtype_name (setup->compute_dtype));
      return NULL;
    }
  if (s->head_dim != 64 && s->head_dim != 128)
    {
      g_set_error (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_UNSUPPORTED,
                   "head_dim %d: the GPU kernels take 64 or 128", s->head_dim);
      return NULL;
    }
  CudaBackend *b = g_new0 (CudaBackend, 1);
  b->parent.ops = &cuda_ops;
  b->parent.setup = *setup;
  b->store = setup->store;
  b->shape = *s;
  b->compute = setup->compute_dtype;
  b->es = sift_dtype_size (b->compute);
  b->timed = g_array_new (FALSE, FALSE, sizeof (Timed));
  b->marks = g_ptr_array_new ();
  b->marks_free = g_ptr_array_new ();
  b->event_pool = g_array_new (FALSE, FALSE, sizeof (cudaEvent_t));
  b->piece_dst = g_array_new (FALSE, FALSE, sizeof (void *));
  b->piece_src = g_array_new (FALSE, FALSE, sizeof (const void *));
  b->piece_size = g_array_new (FALSE, FALSE, sizeof (gsize));
  if (!check (cudaStreamCreateWithFlags (&b->cs, cudaStreamNonBlocking), "cudaStreamCreate", error)
      || !check (cudaStreamCreateWithFlags (&b->xs, cudaStreamNonBlocking), "cudaStreamCreate", error)
      || !check (cudaEventCreateWithFlags (&b->arena_ev, cudaEventDisableTiming), "cudaEventCreate", error))
    {
      cuda_free (&b->parent);
      return NULL;
    }
  b->trace = sift_cuda_trace_new (b->cs);
  /* The host store's blocks in pinned memory: loads copy straight from them. */
  b->store_pinned = sift_store_host_use_memory (b->store, pinned_alloc, pinned_free);
  const gsize block = b->store->block_bytes;
  const gsize half = (gsize) s->n_kv_heads * (gsize) s->block_size * (gsize) s->head_dim * b->es;
  for (guint i = 0; i < N_STAGING; i++)
    {
      b->staging[i].stored = pinned_alloc (block);
      b->staging[i].block = pinned_alloc (2 * half);
      cudaEventCreateWithFlags (&b->staging[i].free_ev, cudaEventDisableTiming);
    }
  b->pack = pinned_alloc (block);
  b->readback = pinned_alloc (2 * half);
  b->arena_size = ARENA_BYTES;
  b->arena = pinned_alloc (b->arena_size);
  return &b->parent;
}
