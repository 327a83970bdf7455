/* A timeline of the CUDA backend's work, for finding where a pipeline's
 * time goes (docs/engine.md, "The GPU backend"): with SIFT_CUDA_TRACE=FILE
 * in the environment each backend writes FILE.<n> when it is freed, one
 * line per copy call, attention, merge, wait, write and read, with the
 * GPU's start and end and the host's issue and return, in microseconds on
 * one clock. Off (NULL, every call a no-op) without the variable. */
#pragma once

#include <glib.h>

typedef struct _SiftCudaTrace SiftCudaTrace;

/* What a record is: a span on the copy stream (TRACE_COPY), on the
 * compute stream (ATTN, MERGE, STALL, WRITE, READ), or on the host only. */
typedef enum {
  SIFT_TRACE_COPY = 'C',   /* one copy call on the copy stream (bytes) */
  SIFT_TRACE_ATTN = 'A',   /* a paged attention call, from its first launch */
  SIFT_TRACE_MERGE = 'M',  /* an LSE merge */
  SIFT_TRACE_STALL = 'S',  /* the compute stream waiting for slot-ready events */
  SIFT_TRACE_WRITE = 'W',  /* buffer_write (bytes) */
  SIFT_TRACE_READ = 'R',   /* buffer_read: the copy back and the host's wait (bytes) */
  SIFT_TRACE_SUBMIT = 'L', /* host: a submit with loads, entry to return */
  SIFT_TRACE_TIMINGS = 'T' /* host: the timings call */
} SiftTraceKind;

/* NULL unless SIFT_CUDA_TRACE is set; stream: the compute stream (anchors). */
SiftCudaTrace *sift_cuda_trace_new (void *stream);
void sift_cuda_trace_free (SiftCudaTrace *tr);

/* A GPU span: begin records its start on stream and the host's time;
 * end records its end (and the host's time) and returns nothing. */
guint sift_cuda_trace_begin (SiftCudaTrace *tr, SiftTraceKind kind, void *stream);
void sift_cuda_trace_end (SiftCudaTrace *tr, guint rec, void *stream, guint64 bytes);
/* A host span from t0 (g_get_monotonic_time) to now. */
void sift_cuda_trace_host (SiftCudaTrace *tr, SiftTraceKind kind, gint64 t0);
/* Ties the GPU's clock to the host's again: an event on the compute
 * stream, which must be idle, waited for at once. */
void sift_cuda_trace_anchor (SiftCudaTrace *tr);
