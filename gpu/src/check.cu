#include <chrono>
#include <thread>

#include "warpfs/gpu/check.h"

namespace warpfs::gpu {

void sync_or_die(const char* what, double seconds) {
  WARPFS_CUDA_CHECK(cudaGetLastError());  // the launch itself
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(nullptr);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) cuda_fail(e, what, __FILE__, __LINE__);
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr,
                   "%s did not finish within %.0f s (a hang: lost completion or "
                   "deadlock)\n",
                   what, seconds);
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(1);  // no destructors: they would wait for the stuck kernel
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace warpfs::gpu
