// Shared by the GPU benchmarks: option parsing, timing with CUDA events, JSON lines.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "warpfs/gpu/check.h"

namespace warpfs::gpu::bench {

inline std::vector<uint64_t> parse_list(const char* s) {
  std::vector<uint64_t> v;
  std::string str(s);
  size_t pos = 0;
  while (pos <= str.size()) {
    const size_t comma = str.find(',', pos);
    const std::string item =
        str.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    const unsigned long long x = std::strtoull(item.c_str(), &end, 0);
    if (item.empty() || *end != '\0') {
      std::fprintf(stderr, "bad list item '%s'\n", item.c_str());
      std::exit(2);
    }
    uint64_t mult = 1;
    v.push_back(x * mult);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

// The device's name with spaces as dashes, for the JSON lines ("NVIDIA-H100-80GB-HBM3").
inline std::string device_name() {
  cudaDeviceProp p;
  WARPFS_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  std::string n = p.name;
  std::replace(n.begin(), n.end(), ' ', '-');
  return n;
}

// Times `launch` (which enqueues kernels on the default stream) with CUDA events; returns ms.
// Waits with sync_or_die so that a hang is reported instead of stalling the run.
template <typename Launch>
double time_ms(const char* what, Launch&& launch) {
  cudaEvent_t a, b;
  WARPFS_CUDA_CHECK(cudaEventCreate(&a));
  WARPFS_CUDA_CHECK(cudaEventCreate(&b));
  WARPFS_CUDA_CHECK(cudaEventRecord(a));
  launch();
  WARPFS_CUDA_CHECK(cudaEventRecord(b));
  sync_or_die(what, 120);
  float ms = 0;
  WARPFS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  WARPFS_CUDA_CHECK(cudaEventDestroy(a));
  WARPFS_CUDA_CHECK(cudaEventDestroy(b));
  return ms;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace warpfs::gpu::bench
