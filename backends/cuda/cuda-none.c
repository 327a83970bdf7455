/* <sift/cuda.h> in a library built without CUDA (meson -Dcuda=disabled, or
 * no nvcc found): every call fails with SIFT_CUDA_ERROR_UNAVAILABLE. */
#include <sift/cuda.h>

G_DEFINE_QUARK (sift-cuda-error-quark, sift_cuda_error)

static gboolean
unavailable (GError **error)
{
  g_set_error_literal (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_UNAVAILABLE,
                       "sift was built without CUDA (meson setup -Dcuda=enabled needs nvcc)");
  return FALSE;
}

gboolean sift_cuda_built (void) { return FALSE; }
gboolean sift_cuda_init (GError **error) { return unavailable (error); }
const char *sift_cuda_device_name (void) { return NULL; }

void *
sift_cuda_malloc (gsize bytes, GError **error)
{
  (void) bytes;
  unavailable (error);
  return NULL;
}

void sift_cuda_free (void *ptr) { (void) ptr; }

gboolean
sift_cuda_memcpy_to_device (void *dst, const void *src, gsize bytes, GError **error)
{
  (void) dst, (void) src, (void) bytes;
  return unavailable (error);
}

gboolean
sift_cuda_memcpy_to_host (void *dst, const void *src, gsize bytes, GError **error)
{
  (void) dst, (void) src, (void) bytes;
  return unavailable (error);
}

gboolean
sift_cuda_memset (void *ptr, int byte, gsize bytes, GError **error)
{
  (void) ptr, (void) byte, (void) bytes;
  return unavailable (error);
}

gboolean sift_cuda_synchronize (GError **error) { return unavailable (error); }

gboolean
sift_cuda_attn_dense (const SiftView *q, const SiftView *k, const SiftView *v,
                      const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error)
{
  (void) q, (void) k, (void) v, (void) opts, (void) out, (void) lse;
  return unavailable (error);
}

gboolean
sift_cuda_attn_decode (const SiftView *q, const SiftView *k, const SiftView *v,
                       const SiftAttnOpts *opts, SiftView *out, float *lse, GError **error)
{
  (void) q, (void) k, (void) v, (void) opts, (void) out, (void) lse;
  return unavailable (error);
}

gboolean
sift_cuda_attn_paged (const SiftView *q, const SiftView *k_blocks, const SiftView *v_blocks,
                      gsize n_blocks, const SiftAttnOpts *opts, SiftView *out, float *lse,
                      GError **error)
{
  (void) q, (void) k_blocks, (void) v_blocks, (void) n_blocks, (void) opts, (void) out, (void) lse;
  return unavailable (error);
}

gboolean
sift_cuda_attn_merge (SiftView *o1, float *lse1, const SiftView *o2, const float *lse2, GError **error)
{
  (void) o1, (void) lse1, (void) o2, (void) lse2;
  return unavailable (error);
}

gboolean
sift_cuda_h2d_seconds (gsize bytes, gint reps, double *seconds, GError **error)
{
  (void) bytes, (void) reps, (void) seconds;
  return unavailable (error);
}

gboolean
sift_cuda_time_calls (SiftCudaCallFn fn, gpointer data, gint calls, double *seconds, GError **error)
{
  (void) fn, (void) data, (void) calls, (void) seconds;
  return unavailable (error);
}

/* The engine's CUDA backend (engine/backend.h) is not built either. */
#include "backend.h"

SiftBackend *
sift_backend_cuda_new (const SiftBackendSetup *setup, GError **error)
{
  (void) setup;
  unavailable (error);
  return NULL;
}

gboolean sift_cuda_blas_init (GError **error) { return unavailable (error); }

gboolean
sift_cuda_gemm_f16 (const void *w, const void *x, float *y, gint64 n_out, gint64 n_in, gint64 n_tok, float beta,
                    GError **error)
{
  (void) w, (void) x, (void) y, (void) n_out, (void) n_in, (void) n_tok, (void) beta;
  return unavailable (error);
}

gboolean
sift_cuda_rmsnorm_f16 (const float *x, const float *w, float eps, gint64 rows, gint64 d, void *out, GError **error)
{
  (void) x, (void) w, (void) eps, (void) rows, (void) d, (void) out;
  return unavailable (error);
}

gboolean
sift_cuda_swiglu_f16 (const float *gate_up, gint64 rows, gint64 n, void *out, GError **error)
{
  (void) gate_up, (void) rows, (void) n, (void) out;
  return unavailable (error);
}

gboolean
sift_cuda_f32_to_f16 (const float *x, gsize n, void *out, GError **error)
{
  (void) x, (void) n, (void) out;
  return unavailable (error);
}
