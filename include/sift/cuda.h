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

/* Device seconds per call of `calls` back-to-back calls of fn (data,
 * error) that issue work to the legacy default stream (the kernels below
 * run there): one CUDA event recorded before the first call, one after
 * the last, the elapsed time divided by `calls`, as PyTorch's benchmarks
 * time theirs. The final wait is not counted; the first call's host work
 * and launch latency are (spread over `calls`), and later calls' host work
 * only where it outlasts the device's. fn returns FALSE with `error` set
 * if it fails; that error is passed on (a generic one if fn set none). */
typedef gboolean (*SiftCudaCallFn) (gpointer data, GError **error);
SIFT_API gboolean sift_cuda_time_calls (SiftCudaCallFn fn, gpointer data, gint calls, double *seconds,
                                        GError **error);

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

/* ---- Dense operations: a model's forward pass on the GPU ----------------
 * What a transformer's layers need besides attention, on device memory
 * (docs/kernels.md, "The forward pass on the GPU"): matrix products
 * through cuBLAS with f16 operands and f32 accumulation and result, and
 * the element-wise steps that produce the next product's f16 operand.
 * Matrices are row-major. Calls run in order on CUDA's legacy default
 * stream, as the attention calls above. cuBLAS is loaded at the first
 * call (libcublas.so.13 of the CUDA toolkit, found by the dynamic loader
 * or in /usr/local/cuda/lib64); without it these calls fail with
 * SIFT_CUDA_ERROR_UNAVAILABLE naming it. */

/* Loads cuBLAS once (also done by the first product). */
SIFT_API gboolean sift_cuda_blas_init (GError **error);
/* y [n_tok][n_out] = x [n_tok][n_in] W^T + beta y: W f16 [n_out][n_in],
 * x f16, y f32 (not read when beta is 0). */
SIFT_API gboolean sift_cuda_gemm_f16 (const void *w, const void *x, float *y, gint64 n_out, gint64 n_in,
                                      gint64 n_tok, float beta, GError **error);
/* out [rows][d] f16 = x / sqrt (mean (x^2) + eps) * w, per row of f32 x;
 * w f32 [d] or NULL (1). */
SIFT_API gboolean sift_cuda_rmsnorm_f16 (const float *x, const float *w, float eps, gint64 rows, gint64 d,
                                         void *out, GError **error);
/* out [rows][n] f16 = silu (gate) * up = gate / (1 + e^-gate) * up, from
 * gate_up f32 [rows][2 n] (each row's gate, then its up). */
SIFT_API gboolean sift_cuda_swiglu_f16 (const float *gate_up, gint64 rows, gint64 n, void *out, GError **error);
/* out [n] f16 = x [n] f32, rounded to nearest. */
SIFT_API gboolean sift_cuda_f32_to_f16 (const float *x, gsize n, void *out, GError **error);

G_END_DECLS
