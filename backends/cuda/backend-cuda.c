/* The engine's CUDA backend (engine/backend.h). */
#include <sift/cuda.h>

#include "backend.h"

SiftBackend *
sift_backend_cuda_new (const SiftBackendSetup *setup, GError **error)
{
  (void) setup;
  g_set_error_literal (error, SIFT_CUDA_ERROR, SIFT_CUDA_ERROR_UNAVAILABLE, "the CUDA engine backend is not built yet");
  return NULL;
}
