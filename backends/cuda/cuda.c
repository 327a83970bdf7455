/* The GPU's public calls (<sift/cuda.h>): finding the device, memory,
 * copies, and the attention kernels' checks, split plan and launch. The
 * kernels themselves are in attn.cu. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include <sift/cuda.h>
#include <sift/error.h>

#include "attn-private.h"
#include "cuda-private.h"
#include "kernels.h"

G_DEFINE_QUARK (sift-cuda-error-quark, sift_cuda_error)

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static char *init_failure; /* why there is no usable GPU; NULL if there is one */
static char *device_name;
static int sm_count;

static void
init_device (void)
{
  int n = 0;
  cudaError_t e = cudaGetDeviceCount (&n);
  if (e != cudaSuccess || n == 0)
    {
      init_failure = g_strdup_printf ("no usable CUDA GPU: %s",
                                      e != cudaSuccess ? cudaGetErrorString (e) : "none found");
      return;
    }
  struct cudaDeviceProp p;
  if ((e = cudaGetDeviceProperties (&p, 0)) != cudaSuccess || (e = cudaSetDevice (0)) != cudaSuccess)
    {
      init_failure = g_strdup_printf ("CUDA device 0: %s", cudaGetErrorString (e));
      return;
    }
  if (p.major < 8)
    {
      init_failure = g_strdup_printf ("%s has compute capability %d.%d; sift's kernels need 8.0 or newer",
                                      p.name, p.major, p.minor);
      return;
    }
  sm_count = p.multiProcessorCount;
  device_name = g_strdup_printf ("%s, compute %d.%d, %d SMs", p.name, p.major, p.minor, sm_count);
}

gboolean
sift_cuda_built (void)
{
  return TRUE;
}

gboolean
sift_cuda_init (GError **error)
{
  pthread_once (&init_once, init_device);
  if (init_failure == NULL)
    return TRUE;
  g_set_error (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_UNAVAILABLE, "%s", init_failure);
  return FALSE;
}

const char *
sift_cuda_device_name (void)
{
  return sift_cuda_init (NULL) ? device_name : NULL;
}

static gboolean
check (cudaError_t e, const char *what, GError **error)
{
  if (e == cudaSuccess)
    return TRUE;
  g_set_error (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_FAILED, "%s: %s", what, cudaGetErrorString (e));
  return FALSE;
}

void *
sift_cuda_malloc (gsize bytes, GError **error)
{
  if (!sift_cuda_init (error))
    return NULL;
  void *p = NULL;
  if (!check (cudaMalloc (&p, MAX (bytes, 1)), "cudaMalloc", error))
    return NULL;
  return p;
}

void
sift_cuda_free (void *ptr)
{
  if (ptr != NULL)
    cudaFree (ptr);
}

gboolean
sift_cuda_memcpy_to_device (void *dst, const void *src, gsize bytes, GError **error)
{
  return sift_cuda_init (error)
         && check (cudaMemcpy (dst, src, bytes, cudaMemcpyHostToDevice), "copy to the device", error);
}

gboolean
sift_cuda_memcpy_to_host (void *dst, const void *src, gsize bytes, GError **error)
{
  return sift_cuda_init (error)
         && check (cudaMemcpy (dst, src, bytes, cudaMemcpyDeviceToHost), "copy to the host", error);
}

gboolean
sift_cuda_memset (void *ptr, int byte, gsize bytes, GError **error)
{
  return sift_cuda_init (error) && check (cudaMemset (ptr, byte, bytes), "cudaMemset", error);
}

gboolean
sift_cuda_synchronize (GError **error)
{
  return sift_cuda_init (error) && check (cudaDeviceSynchronize (), "a GPU kernel failed", error);
}

static int
cmp_double (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return (x > y) - (x < y);
}

/* Device seconds per call of `calls` calls of fn on stream s: an event
 * before the first, one after the last (sift_cuda_time_calls). */
static gboolean
time_on (cudaStream_t s, SiftCudaCallFn fn, gpointer data, gint calls, double *seconds, GError **error)
{
  cudaEvent_t a = NULL, b = NULL;
  float ms = 0;
  gboolean ok = check (cudaEventCreate (&a), "cudaEventCreate", error)
                && check (cudaEventCreate (&b), "cudaEventCreate", error)
                && check (cudaEventRecord (a, s), "cudaEventRecord", error);
  for (gint i = 0; i < calls && ok; i++)
    if (!(ok = fn (data, error)) && error != NULL && *error == NULL)
      g_set_error (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_FAILED, "timed call %d of %d failed", i + 1, calls);
  ok = ok && check (cudaEventRecord (b, s), "cudaEventRecord", error)
       && check (cudaEventSynchronize (b), "the timed calls", error)
       && check (cudaEventElapsedTime (&ms, a, b), "cudaEventElapsedTime", error);
  if (ok)
    *seconds = ms / 1000.0 / calls;
  if (a != NULL)
    cudaEventDestroy (a);
  if (b != NULL)
    cudaEventDestroy (b);
  return ok;
}

gboolean
sift_cuda_time_calls (SiftCudaCallFn fn, gpointer data, gint calls, double *seconds, GError **error)
{
  g_return_val_if_fail (fn != NULL && calls > 0 && seconds != NULL, FALSE);
  return sift_cuda_init (error) && time_on (0, fn, data, calls, seconds, error);
}

typedef struct {
  void *dev, *host;
  gsize bytes;
  cudaStream_t s;
} H2d;

static gboolean
h2d_copy (gpointer data, GError **error)
{
  H2d *c = data;
  return check (cudaMemcpyAsync (c->dev, c->host, c->bytes, cudaMemcpyHostToDevice, c->s), "copy to the device", error);
}

gboolean
sift_cuda_h2d_seconds (gsize bytes, gint reps, double *seconds, GError **error)
{
  g_return_val_if_fail (reps > 0 && seconds != NULL, FALSE);
  if (!sift_cuda_init (error))
    return FALSE;
  H2d c = { NULL, NULL, bytes, NULL };
  g_autofree double *t = g_new (double, reps);
  gboolean ok = check (cudaHostAlloc (&c.host, MAX (bytes, 1), cudaHostAllocPortable), "cudaHostAlloc", error)
                && check (cudaMalloc (&c.dev, MAX (bytes, 1)), "cudaMalloc", error)
                && check (cudaStreamCreateWithFlags (&c.s, cudaStreamNonBlocking), "cudaStreamCreate", error);
  if (ok)
    memset (c.host, 0x3c, bytes); /* touched, not zero pages */
  double warm;
  ok = ok && time_on (c.s, h2d_copy, &c, 1, &warm, error);
  for (gint i = 0; i < reps && ok; i++)
    ok = time_on (c.s, h2d_copy, &c, 1, &t[i], error);
  if (ok)
    {
      qsort (t, (gsize) reps, sizeof (double), cmp_double);
      *seconds = t[reps / 2];
    }
  if (c.s != NULL)
    cudaStreamDestroy (c.s);
  cudaFree (c.dev);
  cudaFreeHost (c.host);
  return ok;
}

/* Device scratch for the block table and the split partials, grown on
 * demand. Calls run in order on one stream, so a call's scratch is free
 * again once the next call's work starts; growing frees the old buffer,
 * which cudaFree does only after the work in flight is done. The public
 * calls share one (on the legacy default stream), each engine backend
 * has its own (on its compute stream). */
static pthread_mutex_t scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static SiftCudaScratch default_scratch;

static void *
scratch_get (SiftCudaScratch *sc, gsize bytes, GError **error)
{
  if (sc->size < bytes)
    {
      cudaFree (sc->ptr);
      sc->ptr = NULL;
      sc->size = 0;
      gsize n = MAX (bytes, 1 << 20);
      if (check (cudaMalloc (&sc->ptr, n), "cudaMalloc (attention scratch)", error))
        sc->size = n;
    }
  return sc->ptr;
}

void
sift_cuda_scratch_clear (SiftCudaScratch *sc)
{
  cudaFree (sc->ptr);
  cudaFree (sc->table);
  cudaFree (sc->counters);
  g_free (sc->table_host);
  *sc = (SiftCudaScratch) { 0 };
}


static gboolean
unsupported (GError **error, const char *fmt, ...) G_GNUC_PRINTF (2, 3);

static gboolean
unsupported (GError **error, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_set_error_literal (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_UNSUPPORTED, msg);
  g_free (msg);
  return FALSE;
}

/* n zeroed counters of the decode kernel's fused split merge: zeroed once
 * on the stream when allocated; each call leaves them at 0 again. */
static unsigned int *
counters_get (SiftCudaScratch *sc, gsize n, cudaStream_t stream, GError **error)
{
  if (sc->counters_n < n)
    {
      cudaFree (sc->counters);
      sc->counters = NULL;
      sc->counters_n = 0;
      gsize cap = MAX (n, 64);
      if (!check (cudaMalloc (&sc->counters, cap * sizeof (unsigned int)), "cudaMalloc (split counters)", error)
          || !check (cudaMemsetAsync (sc->counters, 0, cap * sizeof (unsigned int), stream),
                     "cudaMemsetAsync (split counters)", error))
        return NULL;
      sc->counters_n = cap;
    }
  return sc->counters;
}

/* Puts the block table t[0..n) in the scratch's device table: only the
 * entries from the first that differs from what it holds are written, by
 * kernels on the stream (ordered after the calls that read the old ones). */
static const SiftCudaKvBlock *
table_put (SiftCudaScratch *sc, const SiftCudaKvBlock *t, gsize n, cudaStream_t stream, cudaEvent_t *start,
           GError **error)
{
  if (n > G_MAXINT32)
    {
      unsupported (error, "%" G_GSIZE_FORMAT " blocks: too many for one launch", n);
      return NULL;
    }
  if (sc->table_cap < n)
    {
      cudaFree (sc->table);
      sc->table = NULL;
      sc->table_cap = sc->table_n = 0;
      gsize cap = MAX (n, 2 * sc->table_cap);
      cap = MAX (cap, 64);
      if (!check (cudaMalloc (&sc->table, cap * sizeof (SiftCudaKvBlock)), "cudaMalloc (block table)", error))
        return NULL;
      sc->table_host = g_realloc (sc->table_host, cap * sizeof (SiftCudaKvBlock));
      sc->table_cap = cap;
    }
  SiftCudaKvBlock *held = sc->table_host;
  gsize same = 0;
  while (same < MIN (n, sc->table_n) && memcmp (&held[same], &t[same], sizeof *t) == 0)
    same++;
  if (same < n)
    {
      const gsize held_n = sc->table_n;
      sc->table_n = 0; /* unknown if a launch fails */
      if (*start != NULL) /* the call's first launch */
        cudaEventRecord (*start, stream);
      *start = NULL;
      if (!check (sift_cuda_table_launch ((SiftCudaKvBlock *) sc->table + same, t + same, (int32_t) (n - same), stream),
                  "block table kernel launch", error))
        return NULL;
      memcpy (held + same, t + same, (n - same) * sizeof *t);
      sc->table_n = MAX (n, held_n); /* entries past n were left as they were */
    }
  return sc->table;
}

/* What the GPU kernels need beyond the CPU's checks: f16/bf16 K and V,
 * head_dim 64 or 128, rows that start 16-byte aligned. */
static gboolean
check_kv (const SiftView *kv, const char *what, gsize b, GError **error)
{
  if (kv->dtype != SIFT_DTYPE_F16 && kv->dtype != SIFT_DTYPE_BF16)
    return unsupported (error, "%s[%" G_GSIZE_FORMAT "] is %s: the GPU kernels take f16 or bf16 keys and values",
                        what, b, sift_dtype_name (kv->dtype));
  if (kv->n_tokens > 0
      && ((guintptr) kv->data % 16 != 0 || kv->head_stride % 8 != 0 || kv->token_stride % 8 != 0))
    return unsupported (error, "%s[%" G_GSIZE_FORMAT "]: rows must start 16-byte aligned (data %p, strides %"
                        G_GINT64_FORMAT " and %" G_GINT64_FORMAT " elements)",
                        what, b, kv->data, kv->head_stride, kv->token_stride);
  return TRUE;
}

static SiftCudaKvBlock
kv_block (const SiftView *k, const SiftView *v, gint64 start)
{
  return (SiftCudaKvBlock) {
    .k = k->data, .v = v->data,
    .k_hs = k->head_stride, .k_ts = k->token_stride,
    .v_hs = v->head_stride, .v_ts = v->token_stride,
    .start = (int32_t) start, .n = (int32_t) k->n_tokens, .heads = ~(uint64_t) 0,
  };
}

/* Launches a checked call: picks the splits of the key axis, uploads the
 * block table of a paged call, launches. */
static gboolean
run (const SiftAttnArgs *a, const guint64 *kv_heads, cudaStream_t stream, SiftCudaScratch *sc, cudaEvent_t start,
     GError **error)
{
  const SiftView *q = a->q;
  const gint32 d = q->head_dim;
  if (d != 64 && d != 128)
    return unsupported (error, "head_dim %d: the GPU kernels take 64 or 128", d);
  if (q->n_heads * q->n_tokens > G_MAXINT32 || a->k->n_heads > 65535)
    return unsupported (error, "%d query heads x %" G_GINT64_FORMAT " rows, %d kv heads: too many for one launch",
                        q->n_heads, q->n_tokens, a->k->n_heads);
  for (gsize b = 0; b < a->n_blocks; b++)
    if (!check_kv (&a->k_blocks[b], "k", b, error) || !check_kv (&a->v_blocks[b], "v", b, error))
      return FALSE;
  if (kv_heads != NULL && (gint64) q->n_heads / a->k->n_heads * q->n_tokens > SIFT_CUDA_MASKED_MAX_ROWS)
    return unsupported (error, "blocks masked per kv head take at most %d rows per kv head",
                        SIFT_CUDA_MASKED_MAX_ROWS);
  if (q->n_tokens == 0)
    {
      if (start != NULL)
        cudaEventRecord (start, stream);
      return TRUE;
    }

  SiftCudaAttnCall c = {
    .q = q->data, .q_hs = q->head_stride, .q_ts = q->token_stride,
    .out = a->out->data, .out_hs = a->out->head_stride, .out_ts = a->out->token_stride,
    .lse = a->lse,
    .n_blocks = 1,
    .n_kv = (int32_t) a->k->n_tokens,
    .q_heads = q->n_heads, .kv_heads = a->k->n_heads, .n_q = (int32_t) q->n_tokens, .head_dim = d,
    .bf16 = a->k->dtype == SIFT_DTYPE_BF16,
    .qscale = a->scale * (float) M_LOG2E,
    .causal = a->causal, .q_offset = a->q_offset, .masked = kv_heads != NULL,
  };
  if (a->n_blocks == 1)
    {
      c.one = kv_block (&a->k_blocks[0], &a->v_blocks[0], 0);
      if (kv_heads != NULL)
        c.one.heads = kv_heads[0];
    }
  else if (a->n_blocks == 0)
    c.bf16 = TRUE; /* no key: every row is empty, any instance will do */

  /* Flash-decoding: split the keys so that the launch fills the GPU in
   * one wave (every block resident at once; a second, partial wave would
   * leave most SMs idle at its end), each split at least one 64-key tile.
   * Short key ranges (a ring group of a few blocks) need the splits most:
   * 256-key splits gave a 513-key call 16 thread blocks on 132 SMs. */
  const gint64 rows = (gint64) q->n_heads / a->k->n_heads * q->n_tokens;
  const int32_t rows32 = (int32_t) MIN (rows, G_MAXINT32);
  const gint64 per_rb = sift_cuda_attn_rows_per_block (rows32);
  const gint64 blocks = (rows + per_rb - 1) / per_rb * a->k->n_heads;
  const gint64 slots = (gint64) sift_cuda_attn_blocks_per_sm (d, c.bf16, rows32, a->n_blocks > 1) * sm_count;
  gint64 splits = MIN (slots / blocks, MAX (c.n_kv / 64, 1));
  splits = CLAMP (splits, 1, 1024);
  c.split_len = (int32_t) ((c.n_kv + splits - 1) / splits + 63) / 64 * 64;
  c.n_splits = c.split_len > 0 ? (int32_t) ((c.n_kv + c.split_len - 1) / c.split_len) : 1;

  /* The block table goes to the device by a kernel that carries it as
   * parameters (sift_cuda_table_launch says why not a copy or mapped
   * host memory), the entries that changed only (table_put). */
  if (a->n_blocks > 1)
    {
      g_autofree SiftCudaKvBlock *t = g_new (SiftCudaKvBlock, a->n_blocks);
      for (gsize b = 0; b < a->n_blocks; b++)
        {
          t[b] = kv_block (&a->k_blocks[b], &a->v_blocks[b], a->block_start[b]);
          if (kv_heads != NULL)
            t[b].heads = kv_heads[b];
        }
      if ((c.blocks = table_put (sc, t, a->n_blocks, stream, &start, error)) == NULL)
        return FALSE;
      c.n_blocks = (int32_t) a->n_blocks;
      c.one = t[0]; /* only its pointers are read, for copies of 0 bytes */
    }
  const gsize part = c.n_splits > 1 ? (gsize) c.n_splits * q->n_heads * q->n_tokens * (d + 1) * sizeof (float) : 0;
  if (part > 0)
    {
      if ((c.part_o = scratch_get (sc, part, error)) == NULL)
        return FALSE;
      c.part_l = c.part_o + (gsize) c.n_splits * q->n_heads * q->n_tokens * d;
      /* Decode rows merge their splits in the decode kernel (its last
       * block per kv head), not in a second launch. */
      if (per_rb == 16 && (c.counters = counters_get (sc, (gsize) c.kv_heads, stream, error)) == NULL)
        return FALSE;
    }
  /* The GPU's time starts at the call's first launch (the table's, or
   * this one), after the host's preparation: building and comparing a
   * table of 1025 entries took longer than a short call's kernels. */
  if (start != NULL)
    cudaEventRecord (start, stream);
  return check (sift_cuda_attn_launch (&c, stream), "attention kernel launch", error);
}

/* run() on the shared scratch and the legacy default stream. */
static gboolean
run_default (const SiftAttnArgs *a, GError **error)
{
  pthread_mutex_lock (&scratch_lock);
  gboolean ok = run (a, NULL, NULL, &default_scratch, NULL, error);
  pthread_mutex_unlock (&scratch_lock);
  return ok;
}

gboolean
sift_cuda_attn_dense (const SiftView *q, const SiftView *k, const SiftView *v,
                      const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error)
{
  SiftAttnArgs a;
  return sift_cuda_init (error) && sift_attn_prepare (&a, q, k, v, opts, out, lse, error)
         && run_default (&a, error);
}

gboolean
sift_cuda_attn_decode (const SiftView *q, const SiftView *k, const SiftView *v,
                       const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error)
{
  SiftAttnArgs a;
  if (!sift_cuda_init (error) || !sift_attn_prepare (&a, q, k, v, opts, out, lse, error))
    return FALSE;
  if (q->n_tokens < 1 || q->n_tokens > SIFT_ATTN_DECODE_MAX_ROWS)
    {
      g_set_error (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_SHAPE,
                   "decode takes 1..%d query rows, not %" G_GINT64_FORMAT,
                   SIFT_ATTN_DECODE_MAX_ROWS, q->n_tokens);
      return FALSE;
    }
  return run_default (&a, error);
}

gboolean
sift_cuda_attn_paged_on (void *stream, SiftCudaScratch *scratch, void *start_event, const guint64 *kv_heads,
                         const SiftView *q, const SiftView *k_blocks,
                         const SiftView *v_blocks, gsize n_blocks, const SiftAttnOpts *opts, SiftView *out,
                         float *lse, GError **error)
{
  if (!sift_cuda_init (error))
    return FALSE;
  SiftView k_all, v_all;
  g_autofree gint64 *block_start = g_new (gint64, n_blocks + 1);
  SiftAttnArgs a;
  if (!sift_attn_prepare_paged (&a, &k_all, &v_all, block_start, q, k_blocks, v_blocks, n_blocks, opts, out, lse,
                                error))
    return FALSE;
  if (scratch != NULL)
    return run (&a, kv_heads, stream, scratch, start_event, error);
  return run_default (&a, error);
}

gboolean
sift_cuda_attn_paged (const SiftView *q, const SiftView *k_blocks, const SiftView *v_blocks,
                      gsize n_blocks, const SiftAttnOpts *opts, SiftView *out, float *lse,
                      GError **error)
{
  return sift_cuda_attn_paged_on (NULL, NULL, NULL, NULL, q, k_blocks, v_blocks, n_blocks, opts, out, lse, error);
}

gboolean
sift_cuda_attn_merge_on (void *stream, SiftView *o1, float *lse1, const SiftView *o2, const float *lse2,
                         GError **error)
{
  if (!sift_cuda_init (error) || !sift_view_check (o1, "o1", error) || !sift_view_check (o2, "o2", error))
    return FALSE;
  if (o1->dtype != SIFT_DTYPE_F32 || o2->dtype != SIFT_DTYPE_F32)
    {
      g_set_error_literal (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID, "merge takes f32 outputs");
      return FALSE;
    }
  if (o1->n_heads != o2->n_heads || o1->n_tokens != o2->n_tokens || o1->head_dim != o2->head_dim)
    {
      g_set_error_literal (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_SHAPE, "merge: shapes differ");
      return FALSE;
    }
  if ((lse1 == NULL || lse2 == NULL) && o1->n_tokens > 0)
    {
      g_set_error_literal (error, SIFT_ATTN_ERROR, SIFT_ATTN_ERROR_INVALID, "merge: lse is NULL");
      return FALSE;
    }
  if ((gint64) o1->n_heads * o1->n_tokens > G_MAXINT32)
    return unsupported (error, "merge: %d heads x %" G_GINT64_FORMAT " rows: too many for one launch",
                        o1->n_heads, o1->n_tokens);
  return check (sift_cuda_merge_launch (o1->data, o1->head_stride, o1->token_stride, lse1, o2->data,
                                        o2->head_stride, o2->token_stride, lse2, o1->n_heads,
                                        (int32_t) o1->n_tokens, o1->head_dim, stream),
                "merge kernel launch", error);
}

gboolean
sift_cuda_attn_merge (SiftView *o1, float *lse1, const SiftView *o2, const float *lse2, GError **error)
{
  return sift_cuda_attn_merge_on (NULL, o1, lse1, o2, lse2, error);
}
