// warpfs-bench-gpu-cache: lookups per second through the GPU cache (BaM Fig 7.2 / 7.4's
// experiment): an array<uint64_t> of N elements in 4 KiB lines; thread i reads element i
// (sequential, as BaM), or with array_ref each thread reads cf consecutive elements.
//
//   hit   the cache holds every line (a warm-up pass filled it); a timed pass is lookups only.
//   miss  the cache is invalidated before the timed pass: every line is read from the
//         emulated controller (4 queue pairs, 4 controller threads), routed by the queue
//         mapper (--no-rebalance: its slots never move).
// Variants: coalesced (warp groups, one acquisition per line per warp), uncoalesced (every
// lane its own acquisition), array_ref with coarsening cf (one acquisition per line per warp
// group of lanes that move together).
// lookups/s = N / kernel time (CUDA events), median of --reps passes.
//
// Output: JSON lines. What bounds them (gpu/README.md): hits are GPU atomics on the state
// words (one fetch_add + one fetch_sub per group) and the L2; misses are the controller's host
// threads and PCIe (4 KiB per line through pinned staging, then a GPU copy).
#include <string>
#include <vector>

#include "gpu_bench.cuh"
#include "warpfs/gpu/array.cuh"
#include "warpfs/gpu/cache.cuh"
#include "warpfs/gpu/rig.cuh"

namespace {

using namespace warpfs;
namespace gb = warpfs::gpu::bench;

constexpr uint32_t kLine = 4096;

enum Mode { kCoalesced, kUncoalesced, kRef };

__global__ void lookups(gpu::array<uint64_t> a, Mode mode, uint32_t cf, uint64_t n,
                        unsigned long long* sink) {
  const uint64_t tid = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  uint64_t acc = 0;
  if (mode == kRef) {
    gpu::array_ref<uint64_t> r(a);
    for (uint64_t e = tid * cf; e < (tid + 1) * cf && e < n; ++e) acc += r.read(e);
  } else if (tid < n) {
    acc = mode == kCoalesced ? a.read(tid) : a.read_uncoalesced(tid);
  }
  if (acc == ~0ull) atomicAdd(sink, 1ull);  // keeps the reads alive; never true on this image
}

const char* name(Mode m) {
  return m == kCoalesced ? "coalesced" : m == kUncoalesced ? "uncoalesced" : "array_ref";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> sizes = {1u << 20, 1u << 23, 1u << 25};  // elements (8 B)
  int reps = 5;
  bool misses = true;
  bool rebalance = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--elements") && i + 1 < argc)
      sizes = gb::parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--no-miss"))
      misses = false;
    else if (!std::strcmp(argv[i], "--no-rebalance"))
      rebalance = false;
    else if (!std::strcmp(argv[i], "--quick"))
      sizes = {1u << 20}, reps = 2;
    else {
      std::fprintf(
          stderr,
          "usage: warpfs-bench-gpu-cache [--quick] [--elements LIST] [--reps N] [--no-miss] "
          "[--no-rebalance]\n");
      return 2;
    }
  }
  const std::string dev = gb::device_name();
  uint64_t max_n = 0;
  for (uint64_t n : sizes) max_n = std::max(max_n, n);
  const uint64_t lines = max_n * 8 / kLine;
  // The image: element i holds i + 1 (never 0x1234567 at the sizes used; not all zeroes).
  auto store = nvme::BackingStore::ram(lines * kLine);
  {
    std::vector<uint64_t> v(max_n);
    for (uint64_t i = 0; i < max_n; ++i) v[i] = i + 1;
    (void)store->write(0, v.data(), max_n * 8);  // a RAM store, which cannot fail
  }
  gpu::RigOptions o;
  o.queues = 4;
  o.device_threads = 4;
  o.rebalance = rebalance;
  std::string err;
  auto rig = gpu::Rig::open(o, store, &err);
  if (!rig) {
    std::fprintf(stderr, "warpfs-bench-gpu-cache: %s\n", err.c_str());
    return 1;
  }
  // Every line of the largest array fits: sets x 8 ways = lines (sequential blocks spread
  // evenly over the sets: set = block ^ (block >> log2 sets)).
  uint32_t sets = 1;
  while (uint64_t{sets} * 8 < lines) sets *= 2;
  auto cache = gpu::GpuCache::create(*rig, {sets, 8, kLine}, &err);
  if (!cache) {
    std::fprintf(stderr, "warpfs-bench-gpu-cache: %s\n", err.c_str());
    return 1;
  }
  unsigned long long* sink = nullptr;
  WARPFS_CUDA_CHECK(cudaMalloc(&sink, sizeof *sink));
  WARPFS_CUDA_CHECK(cudaMemset(sink, 0, sizeof *sink));
  struct V {
    Mode m;
    uint32_t cf;
  };
  const V variants[] = {{kUncoalesced, 1}, {kCoalesced, 1}, {kRef, 1}, {kRef, 8}, {kRef, 32}};
  for (uint64_t n : sizes) {
    gpu::array<uint64_t> a(cache->view(), n, 0);
    for (const char* phase : {"hit", "miss"}) {
      const bool hit = phase[0] == 'h';
      if (!hit && !misses) continue;
      for (const V& v : variants) {
        const uint64_t threads = (n + v.cf - 1) / v.cf;
        const uint32_t block = 256;
        const uint32_t grid = static_cast<uint32_t>((threads + block - 1) / block);
        std::vector<double> ms;
        for (int r = 0; r <= reps; ++r) {
          if (!hit) cache->invalidate();  // cold: every line misses
          cache->reset_stats();
          const double t =
              gb::time_ms("lookups", [&] { lookups<<<grid, block>>>(a, v.m, v.cf, n, sink); });
          const gpu::GpuCacheStats st = cache->stats();
          if (st.errors != 0) {
            std::fprintf(stderr, "warpfs-bench-gpu-cache: %llu I/O errors\n",
                         (unsigned long long)st.errors);
            return 1;
          }
          if (r > 0 && hit && st.misses != 0) {
            std::fprintf(stderr, "warpfs-bench-gpu-cache: a hit pass missed %llu times\n",
                         (unsigned long long)st.misses);
            return 1;
          }
          if (r > 0 || !hit) ms.push_back(t);  // the hit warm-up fills the cache
          if (!hit && r >= 2) break;           // cold passes are slow: three are enough
        }
        const double m = gb::median(ms);
        std::printf(
            "{\"bench\":\"gpu_cache\",\"device\":\"%s\",\"phase\":\"%s\",\"impl\":\"%s\","
            "\"cf\":%u,\"elements\":%llu,\"threads\":%llu,\"line_bytes\":%u,\"lines\":%llu,"
            "\"rebalance\":%s,\"ms\":%.3f,\"lookups_per_s\":%.4g,\"gb_per_s\":%.3f}\n",
            dev.c_str(), phase, name(v.m), v.cf, (unsigned long long)n, (unsigned long long)threads,
            kLine, (unsigned long long)(n * 8 / kLine), rebalance ? "true" : "false", m,
            n / (m / 1e3), n * 8.0 / (m / 1e3) / 1e9);
        std::fflush(stdout);
      }
    }
  }
  unsigned long long s = 0;
  WARPFS_CUDA_CHECK(cudaMemcpy(&s, sink, sizeof s, cudaMemcpyDeviceToHost));
  WARPFS_CUDA_CHECK(cudaFree(sink));
  cache.reset();
  return s == 0 ? 0 : 1;
}
