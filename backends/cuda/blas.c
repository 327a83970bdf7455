/* A model's dense operations on the GPU (<sift/cuda.h>, "Dense
 * operations"): y = x W^T through cuBLAS, and the element-wise kernels of
 * dense.cu. cuBLAS is loaded at the first product (dlopen of the CUDA
 * toolkit's libcublas.so.13), so libsift itself still needs only the
 * driver at run time, and a machine without cuBLAS gets a GError naming
 * the library when a GPU forward pass is asked for, not a loader failure.
 * Everything runs on CUDA's legacy default stream, in call order, like
 * the public attention calls. */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <sift/cuda.h>
#include <sift/error.h>

#include "dense-kernels.h"

typedef cublasStatus_t (*CreateFn) (cublasHandle_t *);
typedef cublasStatus_t (*GemmExFn) (cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                                    const void *, cudaDataType, int, const void *, cudaDataType, int, const void *,
                                    void *, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
typedef const char *(*StatusStringFn) (cublasStatus_t);

static struct {
  pthread_once_t once;
  char *failure;          /* why there is no cuBLAS; NULL when loaded */
  void *lib;
  cublasHandle_t handle;
  GemmExFn gemm;
  StatusStringFn status_string;
} blas = { PTHREAD_ONCE_INIT, NULL, NULL, NULL, NULL, NULL };

/* The library names tried in order: the soname (LD_LIBRARY_PATH, the
 * loader's cache), then the toolkit's usual place. */
static const char *const blas_names[] = { "libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.13", NULL };

/* A function of the library into *fn (NULL when absent); copied as bytes:
 * ISO C has no conversion from dlsym's object pointer to a function's. */
static void
symbol (void *fn, gsize size, const char *name)
{
  void *p = dlsym (blas.lib, name);
  g_assert (size == sizeof p);
  memcpy (fn, &p, size);
}

static void
blas_load (void)
{
  GString *why = g_string_new (NULL);
  for (const char *const *n = blas_names; *n != NULL && blas.lib == NULL; n++)
    if ((blas.lib = dlopen (*n, RTLD_NOW | RTLD_LOCAL)) == NULL)
      g_string_append_printf (why, "%s%s", why->len ? "; " : "", dlerror ());
  if (blas.lib == NULL)
    {
      blas.failure = g_strdup_printf ("cannot load cuBLAS (%s)", why->str);
      g_string_free (why, TRUE);
      return;
    }
  g_string_free (why, TRUE);
  CreateFn create = NULL;
  symbol (&create, sizeof create, "cublasCreate_v2");
  symbol (&blas.gemm, sizeof blas.gemm, "cublasGemmEx");
  symbol (&blas.status_string, sizeof blas.status_string, "cublasGetStatusString");
  if (create == NULL || blas.gemm == NULL)
    {
      blas.failure = g_strdup ("libcublas.so.13 lacks cublasCreate_v2 or cublasGemmEx");
      return;
    }
  cublasStatus_t st = create (&blas.handle);
  if (st != CUBLAS_STATUS_SUCCESS)
    blas.failure = g_strdup_printf ("cublasCreate: %s", blas.status_string ? blas.status_string (st) : "failed");
}

gboolean
sift_cuda_blas_init (GError **error)
{
  if (!sift_cuda_init (error))
    return FALSE;
  pthread_once (&blas.once, blas_load);
  if (blas.failure == NULL)
    return TRUE;
  g_set_error (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_UNAVAILABLE, "%s", blas.failure);
  return FALSE;
}

static gboolean
launched (int err, const char *what, GError **error)
{
  if (err == cudaSuccess)
    return TRUE;
  g_set_error (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_FAILED, "%s: %s", what, cudaGetErrorString ((cudaError_t) err));
  return FALSE;
}

static gboolean
dims_fit (const char *what, GError **error, gint64 a, gint64 b, gint64 c)
{
  if (a >= 0 && b >= 0 && c >= 0 && a <= G_MAXINT32 && b <= G_MAXINT32 && c <= G_MAXINT32)
    return TRUE;
  g_set_error (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_UNSUPPORTED,
               "%s: dimensions %" G_GINT64_FORMAT " x %" G_GINT64_FORMAT " x %" G_GINT64_FORMAT
               " are negative or past 2^31", what, a, b, c);
  return FALSE;
}

gboolean
sift_cuda_gemm_f16 (const void *w, const void *x, float *y, gint64 n_out, gint64 n_in, gint64 n_tok, float beta,
                    GError **error)
{
  if (!sift_cuda_blas_init (error) || !dims_fit ("gemm", error, n_out, n_in, n_tok))
    return FALSE;
  if (n_out == 0 || n_tok == 0)
    return TRUE;
  /* Row-major y [n_tok][n_out] is column-major n_out x n_tok: y = W x,
   * W column-major n_in x n_out transposed, x column-major n_in x n_tok. */
  const float alpha = 1.0f;
  cublasStatus_t st = blas.gemm (blas.handle, CUBLAS_OP_T, CUBLAS_OP_N, (int) n_out, (int) n_tok, (int) n_in, &alpha,
                                 w, CUDA_R_16F, (int) n_in, x, CUDA_R_16F, (int) n_in, &beta, y, CUDA_R_32F,
                                 (int) n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st == CUBLAS_STATUS_SUCCESS)
    return TRUE;
  g_set_error (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_FAILED, "cublasGemmEx (%" G_GINT64_FORMAT " x %" G_GINT64_FORMAT
               " by %" G_GINT64_FORMAT " tokens): %s", n_out, n_in, n_tok,
               blas.status_string ? blas.status_string (st) : "failed");
  return FALSE;
}

gboolean
sift_cuda_rmsnorm_f16 (const float *x, const float *w, float eps, gint64 rows, gint64 d, void *out, GError **error)
{
  return sift_cuda_init (error) && dims_fit ("rmsnorm", error, rows, d, 0)
         && launched (sift_cuda_rmsnorm_launch (x, w, eps, rows, d, out), "rmsnorm kernel launch", error);
}

gboolean
sift_cuda_swiglu_f16 (const float *gate_up, gint64 rows, gint64 n, void *out, GError **error)
{
  return sift_cuda_init (error) && dims_fit ("swiglu", error, rows, n, 0)
         && launched (sift_cuda_swiglu_launch (gate_up, rows, n, out), "swiglu kernel launch", error);
}

gboolean
sift_cuda_f32_to_f16 (const float *x, gsize n, void *out, GError **error)
{
  return sift_cuda_init (error)
         && launched (sift_cuda_to_f16_launch (x, (int64_t) n, out), "f16 conversion kernel launch", error);
}
