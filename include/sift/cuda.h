/* sift — attention on a CUDA GPU (meson option `cuda`).
 *
 * Device memory, copies, and the GPU versions of the attention kernels of
 * <sift/attn.h>: the same views, shapes, options and results (output and
 * natural-log LSE, -inf and 0 for a row that sees no key), with every
 * view's data a device pointer. The kernels run on tensor cores: K and V
 * are f16 or bf16 (not f32), q is rounded to K's type inside the kernel,
 * accumulation is f32; docs/kernels.md ("GPU kernels") states the error
 * bounds. head_dim is 64 or 128; K/V rows start 16-byte aligned (data and
 * strides multiples of 8 elements).
 *
 * Calls are asynchronous on CUDA's legacy default stream: an error in the
 * arguments or the launch is reported at once; a fault during the run
 * surfaces at the next sift_cuda_synchronize() or copy.
 *
 * A library built without CUDA, or a machine without a usable GPU
 * (compute capability 8.0 or newer), answers every call with
 * SIFT_CUDA_ERROR_UNAVAILABLE. */
#pragma once

#include <glib.h>
#include <sift/api.h>
#include <sift/attn.h>

G_BEGIN_DECLS

#define SIFT_CUDA_ERROR (sift_cuda_error_quark ())
SIFT_API GQuark sift_cuda_error_quark (void);

typedef enum {
  SIFT_CUDA_ERROR_UNAVAILABLE, /* built without CUDA, no GPU, or a GPU too old */
  SIFT_CUDA_ERROR_FAILED,      /* a CUDA call failed (CUDA's message follows) */
  SIFT_CUDA_ERROR_UNSUPPORTED, /* a shape or dtype the GPU kernels do not take */
} SiftCudaError;

/* TRUE if this library was built with CUDA (it may still find no GPU). */
SIFT_API gboolean sift_cuda_built (void);

/* Finds a GPU (device 0) once; FALSE with SIFT_CUDA_ERROR_UNAVAILABLE
 * saying why when there is none. Every other call does this first. */
SIFT_API gboolean sift_cuda_init (GError **error);

/* "NVIDIA H100 80GB HBM3, compute 9.0, 132 SMs" (static string), or NULL. */
SIFT_API const char *sift_cuda_device_name (void);

/* Device memory: uninitialised, 256-byte aligned. */
SIFT_API void *sift_cuda_malloc (gsize bytes, GError **error);
SIFT_API void sift_cuda_free (void *ptr);
SIFT_API gboolean sift_cuda_memcpy_to_device (void *dst, const void *src, gsize bytes, GError **error);
SIFT_API gboolean sift_cuda_memcpy_to_host (void *dst, const void *src, gsize bytes, GError **error);
/* Every byte of [ptr, ptr + bytes) set to `byte`. */
SIFT_API gboolean sift_cuda_memset (void *ptr, int byte, gsize bytes, GError **error);
/* Waits for every call issued so far; reports a fault that happened in one. */
SIFT_API gboolean sift_cuda_synchronize (GError **error);

/* Seconds of one cudaMemcpyAsync of `bytes` from pinned host memory to
 * the device, timed with events (the median of `reps`): the plain copy
 * that an offload pipeline's loads are held against. */
SIFT_API gboolean sift_cuda_h2d_seconds (gsize bytes, gint reps, double *seconds, GError **error);

/* The kernels: what their CPU namesakes in <sift/attn.h> compute, on
 * device views. Shape and argument errors are SIFT_ATTN_ERROR as on the
 * CPU; f32 K/V or another head_dim is SIFT_CUDA_ERROR_UNSUPPORTED. */
SIFT_API gboolean sift_cuda_attn_dense (const SiftView *q, const SiftView *k, const SiftView *v,
                                        const SiftAttnOpts *opts, SiftView *out, float *lse,
                                        GError **error);
/* 1..SIFT_ATTN_DECODE_MAX_ROWS query rows: the keys split over thread
 * blocks (flash-decoding), merged by LSE. */
SIFT_API gboolean sift_cuda_attn_decode (const SiftView *q, const SiftView *k, const SiftView *v,
                                         const SiftAttnOpts *opts, SiftView *out, float *lse,
                                         GError **error);
/* k_blocks / v_blocks: a host array of views whose data are device
 * pointers (ring slots, blocks of a device cache). */
SIFT_API gboolean sift_cuda_attn_paged (const SiftView *q, const SiftView *k_blocks,
                                        const SiftView *v_blocks, gsize n_blocks,
                                        const SiftAttnOpts *opts, SiftView *out, float *lse,
                                        GError **error);
SIFT_API gboolean sift_cuda_attn_merge (SiftView *o1, float *lse1, const SiftView *o2, const float *lse2,
                                        GError **error);

G_END_DECLS
