/* The engine's backend seam (private): what runs on the compute side of an
 * OffloadEngine. The engine owns the block table, the ring's and the
 * cross-layer buffer's bookkeeping and the default attention's batching;
 * a backend owns compute-side memory, the host memory it copies fastest
 * from, the transfers between a store and compute memory with their
 * events, and the attention kernels. backend-cpu.c is today's behaviour
 * (RAM, the copy worker thread, the CPU kernels); a GPU backend (device
 * buffers, pinned host memory, copy streams and CUDA events) sits behind
 * the same table. Compare ggml's ggml-backend-impl.h. See docs/engine.md,
 * "The backend seam". */
#pragma once

#include <glib.h>

#include <sift/attn.h>
#include <sift/engine.h>
#include <sift/store.h>

/* Bumped when a method changes meaning; methods added later are appended
 * and said "since N", and the engine checks version and struct_size before
 * calling them. */
#define SIFT_BACKEND_VERSION 4

/* Where a piece of compute-side memory lives: SiftMemorySpace of
 * <sift/view.h> (SIFT_MEMORY_HOST, SIFT_MEMORY_DEVICE), the space of the
 * views made of it. */

/* Compute-side memory a backend allocated. `data` is a host pointer in
 * HOST space and an address only the backend interprets in DEVICE space
 * (the engine computes offsets from it, never dereferences it). */
typedef struct {
  SiftMemorySpace space;
  guint8 *data;
  gsize size;
  gpointer handle;     /* the backend's own (NULL on the CPU) */
} SiftBuffer;

typedef struct _SiftBackend SiftBackend;
/* Completion of transfers: a CPU counter, a CUDA event on a copy stream. */
typedef struct _SiftEvent SiftEvent;

typedef enum {
  SIFT_EVENT_DONE,      /* nothing pending, nothing failed */
  SIFT_EVENT_PENDING,   /* a transfer given to it has not finished */
  SIFT_EVENT_FAILED,    /* all finished; one failed */
} SiftEventState;

typedef enum {
  SIFT_TRANSFER_LOAD,   /* store block -> compute memory, converted to the compute dtype */
  SIFT_TRANSFER_STORE,  /* compute memory -> store block, converted to the stored dtype */
} SiftTransferKind;

/* One asynchronous transfer between a stored block and compute memory.
 * k and v address [n_kv_heads][cap][head_dim] compute elements inside
 * buffers of this backend (cap: tokens from one head to the next). */
typedef struct {
  SiftTransferKind kind;
  gint64 store_id;
  SiftLoadWhat what;      /* loads: K, V or both; stores write both */
  guint8 *k, *v;
  gint64 cap;
  SiftEvent *event;       /* completes once this transfer (and the earlier ones given it) finished */
  /* Stores (since 2): the same bytes in the engine's host image of the
   * buffer ([n_kv_heads][cap][head_dim] compute elements) when compute
   * memory is not host memory; a backend may store from there instead of
   * reading compute memory back. NULL on a host-memory backend. */
  const guint8 *host_k, *host_v;
  gint32 layer;           /* handed back to the sink (the counters) */
  SiftPhase phase;
  /* Loads: bit g set, kv head g is wanted (the heads a selection attends
   * the block with); 0, every head. A backend may load more heads than
   * asked; the rows of heads it skips are left as they were. */
  guint64 kv_heads;
} SiftTransfer;

/* The kv_heads mask of every one of n kv heads (n <= 64). */
static inline guint64
sift_kv_heads_all (gint32 n)
{
  return n >= 64 ? G_MAXUINT64 : (G_GUINT64_CONSTANT (1) << n) - 1;
}

/* Whether load t asks for some of the n kv heads only, not all of them
 * (kv_heads 0 means all; a model of more than 64 kv heads loads all). */
static inline gboolean
sift_transfer_some_heads (const SiftTransfer *t, gint32 n)
{
  return t->kv_heads != 0 && n <= 64 && (t->kv_heads & sift_kv_heads_all (n)) != sift_kv_heads_all (n);
}

/* The next run of consecutive kv heads of mask at or after *h1 (0 to
 * begin): sets [*h0, *h1) and returns TRUE, or FALSE when none is left.
 * mask as SiftTransfer's kv_heads: 0, or more than 64 heads, is every
 * head (one run). Loop: for (gint32 h0, h1 = 0; sift_kv_heads_next (m, n, &h0, &h1);) */
static inline gboolean
sift_kv_heads_next (guint64 mask, gint32 n, gint32 *h0, gint32 *h1)
{
  const gboolean all = mask == 0 || n > 64;
  gint32 h = *h1;
  while (h < n && !all && !((mask >> h) & 1))
    h++;
  if (h >= n)
    return FALSE;
  *h0 = h;
  while (++h < n && (all || ((mask >> h) & 1)))
    ;
  *h1 = h;
  return TRUE;
}

/* What a backend reports to its engine. `done` is called once per
 * transfer, on whichever thread finished it, before its event completes:
 * ok, the bytes read (loads) or written (stores; 0 when skipped after an
 * earlier failed store), the seconds it took, and the error of a failed one
 * (borrowed). */
typedef struct {
  void (*done) (gpointer user, const SiftTransfer *t, gboolean ok, guint64 bytes, gdouble seconds,
                const GError *error);
  gpointer user;
} SiftBackendSink;

/* Seconds a backend timed on its own clocks (CUDA events) since the last
 * timings call: the compute side waiting for loads, the loads, the
 * attention and merges. */
typedef struct {
  gdouble stalled, load, compute;
} SiftBackendTimes;

/* What a backend is made for: one engine's shape, store and dtype. */
typedef struct {
  SiftModelShape shape;
  SiftDType compute_dtype;
  SiftStore *store;
  SiftBackendSink sink;
} SiftBackendSetup;

typedef struct {
  guint32 version;        /* SIFT_BACKEND_VERSION */
  gsize struct_size;      /* sizeof (SiftBackendOps) the backend was built with */
  const char *name;

  /* Waits for every transfer, then frees the backend. */
  void (*free) (SiftBackend *b);

  /* Compute-side memory, zeroed: ring slots, the prefill and decode
   * buffers, the cross-layer halves, partial results. */
  gboolean (*buffer_alloc) (SiftBackend *b, gsize size, SiftBuffer *out, GError **error);
  void (*buffer_free) (SiftBackend *b, SiftBuffer *buf);
  /* Synchronous copies into, within and zeroing compute memory (the
   * host-side pointer `src` is host memory). */
  void (*buffer_write) (SiftBackend *b, guint8 *dst, const void *src, gsize n);
  void (*buffer_move) (SiftBackend *b, guint8 *dst, const guint8 *src, gsize n);
  void (*buffer_clear) (SiftBackend *b, guint8 *dst, gsize n);

  /* Host memory, zeroed, that transfers run fastest from: what a host
   * store and staging buffers are made of (pinned memory on a GPU). */
  void *(*host_alloc) (SiftBackend *b, gsize size);
  void (*host_free) (SiftBackend *b, void *p, gsize size);

  /* Zero-copy, decided here, not by the store's class: whether this
   * backend's kernels read the store's blocks in place (through
   * sift_store_map's pointers) in the compute dtype. */
  gboolean (*can_map) (SiftBackend *b, SiftStore *store, SiftDType compute_dtype);

  /* Transfers, n at once (one wake-up). Ordering: transfers run in
   * submission order per backend (a load submitted after a store of the
   * same block sees it), and a transfer starts only after every compute
   * call (attend, merge, buffer_*) made before it finished with the memory:
   * on the CPU those calls have returned; a GPU backend makes its copy
   * stream wait on an event recorded on its compute stream, so a slot is
   * not overwritten while the previous block's attention still reads it. */
  void (*submit) (SiftBackend *b, const SiftTransfer *t, gsize n);
  /* Events: new ones have nothing pending. */
  SiftEvent *(*event_new) (SiftBackend *b);
  void (*event_free) (SiftBackend *b, SiftEvent *ev);
  /* No wait: whether a transfer given to ev is still running, or all
   * finished and one failed (its error kept until a wait hands it over),
   * or all finished well. */
  SiftEventState (*event_query) (SiftBackend *b, SiftEvent *ev);
  /* Waits for events[0..n) in order, stopping at the first one with a
   * failed transfer: its error is handed over (and cleared from the event),
   * *n_ok (may be NULL) gets the events before it. "Waits" is the compute
   * side's: on the CPU the calling thread blocks; a GPU backend makes its
   * compute stream wait (the host goes on), which is all the attend and
   * merge calls that follow need. The host reads compute memory only
   * through buffer_read, which waits for the compute side. */
  gboolean (*event_wait) (SiftBackend *b, SiftEvent *const *events, gsize n, gsize *n_ok, GError **error);
  /* Waits for every transfer; forget: later stores run again after a
   * failed one (a new sequence). */
  void (*drain) (SiftBackend *b, gboolean forget);

  /* Attention over n blocks (views into this backend's buffers or mapped
   * store memory) and the LSE merge, as sift_attn_paged and sift_attn_merge
   * define them. */
  gboolean (*attend) (SiftBackend *b, const SiftView *q, const SiftView *k, const SiftView *v, gsize n,
                      const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error);
  gboolean (*merge) (SiftBackend *b, SiftView *out, float *lse, const SiftView *part, const float *part_lse,
                     GError **error);

  /* Since 2. A synchronous copy out of compute memory into host memory,
   * after every compute call made before it (a call's output). */
  gboolean (*buffer_read) (SiftBackend *b, void *dst, const guint8 *src, gsize n, GError **error);
  /* Seconds timed on the backend's own clocks since the last call (the
   * engine adds them to its counters); NULL where the engine's host clock
   * times the work (the CPU: its calls block until done). */
  void (*timings) (SiftBackend *b, SiftBackendTimes *out);

  /* Since 3. A copy within compute memory of `rows` rows of `width`
   * bytes, `src_pitch` and `dst_pitch` bytes apart (the heads of a block
   * out of a prefill or decode buffer into a resident block), ordered as
   * buffer_move. */
  void (*buffer_move_rows) (SiftBackend *b, guint8 *dst, gsize dst_pitch, const guint8 *src, gsize src_pitch,
                            gsize width, gsize rows);

  /* Since 4, optional (NULL: the engine makes one attend call per run of
   * kv heads whose query groups attend the same blocks). attend over n
   * blocks of which block i is attended only by the query groups of the kv
   * heads set in kv_heads[i] (bit g: query heads [g G, (g + 1) G)): for
   * each kv head, the same as attend over the blocks it attends with
   * opts->q_offset less the tokens of the blocks it skips. Every head's
   * output and LSE are written (o = 0, lse = -inf for a head that attends
   * no key). At most 64 kv heads. One kernel launch where a GPU can mask
   * blocks per head, instead of a launch (and a merge) per kv head. */
  gboolean (*attend_heads) (SiftBackend *b, const SiftView *q, const SiftView *k, const SiftView *v,
                            const guint64 *kv_heads, gsize n, const SiftAttnOpts *opts, SiftView *out, float *lse,
                            GError **error);
} SiftBackendOps;

/* Every backend's instance starts with this. */
struct _SiftBackend {
  const SiftBackendOps *ops;
  SiftBackendSetup setup;
};

/* The CPU backend: RAM, one copy worker thread, the core kernels. */
SiftBackend *sift_backend_cpu_new (const SiftBackendSetup *setup);
/* The CUDA backend (backends/cuda/backend-cuda.c): device buffers, pinned
 * host memory, a copy stream and CUDA events, the GPU kernels. NULL with
 * SIFT_CUDA_ERROR_UNAVAILABLE without the cuda build or a usable GPU, or
 * SIFT_CUDA_ERROR_UNSUPPORTED for a shape or dtype its kernels do not take. */
SiftBackend *sift_backend_cuda_new (const SiftBackendSetup *setup, GError **error);
