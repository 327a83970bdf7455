/* Host helpers of the Hopper kernels: tensor maps for the TMA unit and
 * whether a kernel's sm_90 machine code runs here (prefill.cu defines
 * them; the TMA prefill and decode kernels use them). C++, nvcc only. */
#pragma once

#include <cuda.h>
#include <stdint.h>

namespace sift_tma {

/* The tensor map of K or V of a contiguous call: [kv_heads][n][128]
 * 16-bit values with strides hs, ts (elements), boxes of 64 columns by
 * box_keys keys in the 128-byte swizzle (a box: box_keys rows of 128
 * bytes, 16-byte piece p of row r at piece p ^ (r % 8)); l2_promote: a
 * miss fetches 256 bytes into L2 (else only the sectors asked for: the
 * faster choice for decode, which reads each key once). False where the
 * driver lacks cuTensorMapEncodeTiled, SIFT_CUDA_NO_TMA=1 is set, or the
 * driver refuses the strides. */
bool kv_map (CUtensorMap *map, const void *base, int64_t hs, int64_t ts, int32_t n, int32_t kv_heads, bool bf16,
             uint32_t box_keys, bool l2_promote);

/* Whether the current device runs `kernel` (a __global__ function) from
 * its sm_90 / sm_90a machine code: compute capability 9.0 exactly (the
 * only one that machine code loads on; elsewhere the driver compiles the
 * compute_80 PTX, where the Hopper kernels trap), and the kernel loaded
 * from that machine code rather than JIT-compiled from the PTX
 * (CUDA_FORCE_PTX_JIT=1 does that even on 9.0): its ptxVersion then
 * reads 80, not 90. */
bool machine_code_runs (const void *kernel);

} // namespace sift_tma
