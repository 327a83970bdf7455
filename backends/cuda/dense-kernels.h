/* The interface between backends/cuda/blas.c (checks, GError, cuBLAS) and
 * backends/cuda/dense.cu (element-wise kernels, built by nvcc). Plain C,
 * no GLib. Launches on CUDA's legacy default stream; each returns a
 * cudaError_t. */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out [rows][d] f16 = x [rows][d] / sqrt (mean (x^2) + eps) * w (w NULL: 1). */
int sift_cuda_rmsnorm_launch (const float *x, const float *w, float eps, int64_t rows, int64_t d, void *out);
/* out [n] f16 = x [n] f32, rounded to nearest. */
int sift_cuda_to_f16_launch (const float *x, int64_t n, void *out);
/* out [rows][n] f16 = silu (gate) * up, gate_up [rows][2 n] f32 (gate, then up, per row). */
int sift_cuda_swiglu_launch (const float *gate_up, int64_t rows, int64_t n, void *out);

#ifdef __cplusplus
}
#endif
