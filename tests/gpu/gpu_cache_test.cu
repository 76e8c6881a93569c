// The GPU cache and warpfs::gpu::array<T>: reads through the cache (coalesced,
// uncoalesced, array_ref scans) return the image's content; concurrent writers through the
// cache, then a flush, leave the backing image exactly as a CPU reference model predicts.
//
// The cache is much smaller than the array, so the runs evict and write back under load.
// Writers: element e is owned by thread e % T and written in R rounds with value w(e, r),
// round by round in the owner's program order, so the model's final value is w(e, R - 1);
// lanes of one warp write neighbouring elements (one coalesced group per line) while up to
// 15 other warps write other elements of the same 4 KiB line. Odd rounds write through an
// array_ref over a contiguous chunk instead (the same elements owned differently would race,
// so those rounds own chunks: thread t owns [t*C, (t+1)*C) and the model follows).
// Per-thread results are poisoned before each kernel.
//
// Usage: gpu_cache_test [--small]    Exit: 0 passed, 1 failed, 77 no GPU.
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test.cuh"
#include "warpfs/gpu/array.cuh"
#include "warpfs/gpu/cache.cuh"
#include "warpfs/gpu/rig.cuh"

namespace {

using namespace warpfs;
using gpu::test::image_word;
using gpu::test::mix;

constexpr double kTimeout = 120;
constexpr uint32_t kUnwritten = 0xefefefefu;

__host__ __device__ uint64_t written(uint64_t e, uint32_t round) {
  return mix(e * 131 + round + 1) | 1;
}

enum class ReadMode { kCoalesced, kUncoalesced, kRef };

// Thread t checks elements t, t + T, ... (kCoalesced/kUncoalesced), or its chunk of C
// consecutive elements (kRef). `w_until`: elements below it were written, last round `round`.
__global__ void read_check(gpu::array<uint64_t> a, uint64_t seed, ReadMode mode, uint64_t n,
                           uint64_t w_until, int32_t round, bool chunked_last, uint64_t chunk,
                           uint32_t* result) {
  const uint64_t tid = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  const uint64_t T = uint64_t{gridDim.x} * blockDim.x;
  uint32_t bad = 0;
  auto want = [&](uint64_t e) {
    if (e >= w_until || round < 0) return image_word(seed, e);
    (void)chunked_last;
    return written(e, static_cast<uint32_t>(round));
  };
  if (mode == ReadMode::kRef) {
    gpu::array_ref<uint64_t> r(a);
    for (uint64_t e = tid * chunk; e < (tid + 1) * chunk && e < n; ++e) bad += r.read(e) != want(e);
  } else {
    for (uint64_t e = tid; e < n; e += T) {
      const uint64_t v = mode == ReadMode::kCoalesced ? a.read(e) : a.read_uncoalesced(e);
      bad += v != want(e);
    }
  }
  result[tid] = bad;
}

// One round of writes to elements [0, w_until): strided (even rounds) or chunked via array_ref.
__global__ void write_round(gpu::array<uint64_t> a, uint64_t w_until, uint32_t round, bool chunked,
                            uint64_t chunk, uint32_t* result) {
  const uint64_t tid = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  const uint64_t T = uint64_t{gridDim.x} * blockDim.x;
  if (chunked) {
    gpu::array_ref<uint64_t> r(a);
    for (uint64_t e = tid * chunk; e < (tid + 1) * chunk && e < w_until; ++e)
      r.write(e, written(e, round));
  } else {
    for (uint64_t e = tid; e < w_until; e += T) a.write(e, written(e, round));
  }
  result[tid] = 0;
}

struct Sizes {
  uint32_t threads, sets, ways, rounds;
  uint64_t lines;  // namespace size in 4 KiB lines
};

int run(const Sizes& z, uint64_t seed) {
  gpu::test::Tally tally;
  constexpr uint32_t kLine = 4096;
  const uint64_t n = z.lines * kLine / 8;  // elements
  const uint64_t w_until = n / 2;          // the first half is written
  const uint64_t chunk = (w_until + z.threads - 1) / z.threads;
  std::printf("cache %u sets x %u ways (%u KiB), array of %llu lines, %u GPU threads, %u rounds\n",
              z.sets, z.ways, z.sets * z.ways * 4, static_cast<unsigned long long>(z.lines),
              z.threads, z.rounds);
  auto store = nvme::BackingStore::ram(z.lines * kLine);
  {
    std::vector<uint64_t> words(n);
    for (uint64_t i = 0; i < n; ++i) words[i] = image_word(seed, i);
    if (!store->write(0, words.data(), n * 8).is_ok()) return 1;
  }
  gpu::RigOptions o;
  o.queues = 2;
  o.device_threads = 2;
  std::string err;
  auto rig = gpu::Rig::open(o, store, &err);
  if (!rig) {
    tally.check(false, err.c_str());
    return 1;
  }
  auto cache = gpu::GpuCache::create(*rig, {z.sets, z.ways, kLine}, &err);
  if (!cache) {
    tally.check(false, err.c_str());
    return 1;
  }
  gpu::array<uint64_t> a(cache->view(), n, 0);
  uint32_t* d_result = nullptr;
  WARPFS_CUDA_CHECK(cudaMalloc(&d_result, z.threads * sizeof(uint32_t)));
  std::vector<uint32_t> result(z.threads);
  const uint32_t block = std::min<uint32_t>(128, z.threads), grid = z.threads / block;
  auto poison = [&] {
    WARPFS_CUDA_CHECK(cudaMemset(d_result, 0xef, z.threads * sizeof(uint32_t)));
  };
  auto summary = [&](const char* what) {
    WARPFS_CUDA_CHECK(
        cudaMemcpy(result.data(), d_result, z.threads * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    uint64_t bad = 0, unwritten = 0;
    for (uint32_t v : result) {
      if (v == kUnwritten)
        ++unwritten;
      else
        bad += v;
    }
    tally.check(bad == 0 && unwritten == 0,
                (std::string(what) + " (" + std::to_string(bad) + " wrong elements, " +
                 std::to_string(unwritten) + " threads without a result)")
                    .c_str());
  };
  const struct {
    ReadMode m;
    const char* name;
  } reads[] = {{ReadMode::kCoalesced, "coalesced reads of every element match the image"},
               {ReadMode::kUncoalesced, "uncoalesced reads match the image"},
               {ReadMode::kRef, "array_ref scans match the image"}};
  const uint64_t rchunk = (n + z.threads - 1) / z.threads;
  for (const auto& r : reads) {
    poison();
    read_check<<<grid, block>>>(a, seed, r.m, n, 0, -1, false, rchunk, d_result);
    gpu::sync_or_die("read_check", kTimeout);
    summary(r.name);
  }
  // Concurrent writers.
  for (uint32_t round = 0; round < z.rounds; ++round) {
    poison();
    write_round<<<grid, block>>>(a, w_until, round, round % 2 == 1, chunk, d_result);
    gpu::sync_or_die("write_round", kTimeout);
    summary(("write round " + std::to_string(round) + " finished in every thread").c_str());
  }
  const auto last = static_cast<int32_t>(z.rounds - 1);
  poison();
  read_check<<<grid, block>>>(a, seed, ReadMode::kCoalesced, n, w_until, last, false, rchunk,
                              d_result);
  gpu::sync_or_die("read_check after writes", kTimeout);
  summary("reads through the cache see the last round's values");
  bool flushed = cache->flush(&err);
  tally.check(flushed, flushed ? "flush (write-back + NVMe Flush)" : err.c_str());
  const gpu::GpuCacheStats st = cache->stats();
  std::printf(
      "  stats: misses %llu, evictions %llu, write-backs %llu, set-full retries %llu, "
      "errors %llu\n",
      (unsigned long long)st.misses, (unsigned long long)st.evictions,
      (unsigned long long)st.writebacks, (unsigned long long)st.set_full,
      (unsigned long long)st.errors);
  tally.check(st.errors == 0, "no I/O errors");
  tally.check(st.evictions > 0 && st.writebacks > 0, "the run evicted and wrote back lines");
  WARPFS_CUDA_CHECK(cudaFree(d_result));
  cache.reset();
  tally.check(rig->shutdown().is_ok(), "controller shutdown");
  rig.reset();
  // The image against the model.
  std::vector<uint64_t> words(n);
  (void)store->read(0, words.data(), n * 8);  // a RAM store: a failed read shows as wrong words
  uint64_t wrong = 0;
  for (uint64_t e = 0; e < n; ++e) {
    const uint64_t want =
        e < w_until ? written(e, static_cast<uint32_t>(last)) : image_word(seed, e);
    wrong += words[e] != want;
  }
  tally.check(wrong == 0, ("the backing image equals the CPU model (" + std::to_string(wrong) +
                           " wrong elements of " + std::to_string(n) + ")")
                              .c_str());
  return tally.failed;
}

}  // namespace

int main(int argc, char** argv) {
  const bool small = argc > 1 && std::strcmp(argv[1], "--small") == 0;
  gpu::test::require_gpu("gpu_cache_test");
  const uint64_t seed = 0xca5e0000ull + static_cast<uint64_t>(time(nullptr));
  const int failed = small ? run({256, 16, 8, 2, 256}, seed) : run({16384, 256, 8, 4, 16384}, seed);
  std::printf("gpu_cache_test: %s (%d failed)\n", failed ? "FAILED" : "PASSED", failed);
  return failed ? 1 : 0;
}
