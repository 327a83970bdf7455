/* SIFT_CUDA_TRACE: the CUDA backend's timeline (trace.h). GPU spans are
 * pairs of CUDA events; an anchor (an event on the idle compute stream,
 * waited for at once, beside the host's clock) maps them onto the host's
 * clock: a span's times are its anchor's host time plus the event time
 * since the anchor, the anchor being the last one made before the span was
 * issued. Everything is kept until the backend is freed, then written. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "trace.h"

typedef struct {
  cudaEvent_t ev;
  gint64 host_us;
} Anchor;

typedef struct {
  char kind;
  guint anchor;
  cudaEvent_t a, b;     /* NULL for host spans */
  gint64 h0, h1;        /* host: issue (or entry), return */
  guint64 bytes;
} Rec;

struct _SiftCudaTrace {
  char *path;
  cudaStream_t stream;
  GArray *anchors;      /* Anchor */
  GArray *recs;         /* Rec */
};

SiftCudaTrace *
sift_cuda_trace_new (void *stream)
{
  const char *path = getenv ("SIFT_CUDA_TRACE");
  if (path == NULL || *path == '\0')
    return NULL;
  static gint serial;
  SiftCudaTrace *tr = g_new0 (SiftCudaTrace, 1);
  tr->path = g_strdup_printf ("%s.%d", path, g_atomic_int_add (&serial, 1));
  tr->stream = stream;
  tr->anchors = g_array_new (FALSE, FALSE, sizeof (Anchor));
  tr->recs = g_array_new (FALSE, FALSE, sizeof (Rec));
  sift_cuda_trace_anchor (tr);
  return tr;
}

void
sift_cuda_trace_anchor (SiftCudaTrace *tr)
{
  if (tr == NULL)
    return;
  Anchor an = { NULL, 0 };
  cudaEventCreate (&an.ev);
  gint64 t0 = g_get_monotonic_time ();
  cudaEventRecord (an.ev, tr->stream);
  cudaEventSynchronize (an.ev);
  /* The stream was idle: the event ran between the record and the return. */
  an.host_us = (t0 + g_get_monotonic_time ()) / 2;
  g_array_append_val (tr->anchors, an);
}

guint
sift_cuda_trace_begin (SiftCudaTrace *tr, SiftTraceKind kind, void *stream)
{
  if (tr == NULL)
    return 0;
  Rec r = { (char) kind, tr->anchors->len - 1, NULL, NULL, g_get_monotonic_time (), 0, 0 };
  cudaEventCreate (&r.a);
  cudaEventRecord (r.a, (cudaStream_t) stream);
  g_array_append_val (tr->recs, r);
  return tr->recs->len - 1;
}

void
sift_cuda_trace_end (SiftCudaTrace *tr, guint rec, void *stream, guint64 bytes)
{
  if (tr == NULL)
    return;
  Rec *r = &g_array_index (tr->recs, Rec, rec);
  cudaEventCreate (&r->b);
  cudaEventRecord (r->b, (cudaStream_t) stream);
  r->h1 = g_get_monotonic_time ();
  r->bytes = bytes;
}

void
sift_cuda_trace_host (SiftCudaTrace *tr, SiftTraceKind kind, gint64 t0)
{
  if (tr == NULL)
    return;
  Rec r = { (char) kind, tr->anchors->len - 1, NULL, NULL, t0, g_get_monotonic_time (), 0 };
  g_array_append_val (tr->recs, r);
}

static double
at (SiftCudaTrace *tr, guint anchor, cudaEvent_t ev, gint64 origin)
{
  const Anchor *an = &g_array_index (tr->anchors, Anchor, anchor);
  float ms = 0;
  if (ev == NULL || cudaEventSynchronize (ev) != cudaSuccess || cudaEventElapsedTime (&ms, an->ev, ev) != cudaSuccess)
    return -1.0;
  return (double) (an->host_us - origin) + 1e3 * (double) ms;
}

void
sift_cuda_trace_free (SiftCudaTrace *tr)
{
  if (tr == NULL)
    return;
  FILE *f = fopen (tr->path, "w");
  if (f == NULL) /* a debugging switch: the run goes on, but says so */
    g_printerr ("sift: SIFT_CUDA_TRACE: cannot write '%s': %s; no trace written\n", tr->path, g_strerror (errno));
  const gint64 origin = g_array_index (tr->anchors, Anchor, 0).host_us;
  if (f != NULL)
    fprintf (f, "# kind gpu_start_us gpu_end_us host_issue_us host_return_us bytes (us from the first anchor; "
                "gpu -1: host only)\n");
  for (guint i = 0; i < tr->recs->len; i++)
    {
      Rec *r = &g_array_index (tr->recs, Rec, i);
      if (f != NULL)
        fprintf (f, "%c %.1f %.1f %" G_GINT64_FORMAT " %" G_GINT64_FORMAT " %" G_GUINT64_FORMAT "\n", r->kind,
                 r->a ? at (tr, r->anchor, r->a, origin) : -1.0, r->b ? at (tr, r->anchor, r->b, origin) : -1.0,
                 r->h0 - origin, r->h1 ? r->h1 - origin : -1, r->bytes);
      if (r->a != NULL)
        cudaEventDestroy (r->a);
      if (r->b != NULL)
        cudaEventDestroy (r->b);
    }
  if (f != NULL && (ferror (f) | fclose (f)) != 0)
    g_printerr ("sift: SIFT_CUDA_TRACE: writing '%s' failed: %s; the trace is incomplete\n", tr->path,
                g_strerror (errno));
  for (guint i = 0; i < tr->anchors->len; i++)
    cudaEventDestroy (g_array_index (tr->anchors, Anchor, i).ev);
  cudaGetLastError ();
  g_array_unref (tr->anchors);
  g_array_unref (tr->recs);
  g_free (tr->path);
  g_free (tr);
}
