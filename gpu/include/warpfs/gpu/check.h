// Checking CUDA calls: every runtime call and every kernel launch goes through one of these.
// A failure prints the call, the file and line and CUDA's message, and exits with status 1:
// the GPU tests and benchmarks have nothing sensible to do after a failed CUDA call.
//
// Thread-safety: as the CUDA runtime calls they wrap.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace warpfs::gpu {

[[noreturn]] inline void cuda_fail(cudaError_t e, const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", file, line, what, cudaGetErrorString(e),
               cudaGetErrorName(e));
  std::exit(1);
}

}  // namespace warpfs::gpu

#define WARPFS_CUDA_CHECK(call)                                                                   \
  do {                                                                                            \
    const cudaError_t warpfs_e_ = (call);                                                         \
    if (warpfs_e_ != cudaSuccess) ::warpfs::gpu::cuda_fail(warpfs_e_, #call, __FILE__, __LINE__); \
  } while (0)

// After a launch: the launch itself (bad configuration) and, synchronously, the kernel's run
// (a fault, a trap). Benchmarks time around the launch and call this after the timed region.
#define WARPFS_CUDA_CHECK_KERNEL(name)                                                           \
  do {                                                                                           \
    WARPFS_CUDA_CHECK(cudaGetLastError());                                                       \
    const cudaError_t warpfs_e_ = cudaDeviceSynchronize();                                       \
    if (warpfs_e_ != cudaSuccess) ::warpfs::gpu::cuda_fail(warpfs_e_, name, __FILE__, __LINE__); \
  } while (0)

namespace warpfs::gpu {

// Waits for the device like cudaDeviceSynchronize, but gives up after `seconds`: a protocol
// bug shows as a kernel that never finishes, and a test should then fail with a message
// rather than hang until the machine's limit. Exits with status 1 on timeout or error.
void sync_or_die(const char* what, double seconds);

}  // namespace warpfs::gpu
