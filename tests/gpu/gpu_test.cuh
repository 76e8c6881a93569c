// Shared by the GPU test programs: the content model of the test images, a check macro, and
// the "no GPU here" exit code (77: ctest reports the test as skipped, so CI machines without
// a GPU compile the tests but do not fail them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "warpfs/gpu/check.h"
#include "warpfs/nvme/port.h"

namespace warpfs::gpu::test {

inline constexpr int kSkip = 77;

// A 64-bit mix (splitmix64's finaliser): the expected content of word `i` of the image,
// seeded per run so that stale data from an earlier run cannot pass.
WARPFS_HD inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
WARPFS_HD inline uint64_t image_word(uint64_t seed, uint64_t word_index) {
  return mix(seed ^ mix(word_index));
}

// Exits with kSkip when no CUDA device can be used.
inline void require_gpu(const char* program) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows even if a step hangs
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("%s: SKIPPED (no CUDA device: %s)\n", program,
                e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    std::exit(kSkip);
  }
  cudaDeviceProp p;
  WARPFS_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  std::printf("%s: device %s (sm_%d%d, %d SMs)\n", program, p.name, p.major, p.minor,
              p.multiProcessorCount);
}

struct Tally {
  int failed = 0;
  void check(bool ok, const char* what) {
    std::printf("  [%s] %s\n", ok ? "ok" : "FAIL", what);
    if (!ok) ++failed;
  }
};

}  // namespace warpfs::gpu::test
