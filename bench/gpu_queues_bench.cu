// warpfs-bench-gpu-queues: GPU-initiated I/O through one or more queue pairs of the emulated
// controller (BaM Fig 5.6 and §5.5's scaling experiment, on this project's stack).
//
//   contention  one queue pair of depth 1024, one controller thread; T GPU threads each issue
//               one 512 B random read (submit, poll, done) through locked_queue or
//               virtual_queue; T = 1K..32K. IOPS = T / kernel time (CUDA events), the median
//               of --reps runs after one warm-up.
//   scaling     virtual_queue over Q queue pairs and Q controller threads (round robin by
//               ticket), T GPU threads, one read each.
//
// Output: JSON lines on stdout, like warpfs-bench-queues (bench/README.md) plus "device" and the
// controller's host cost (host_cost below).
// What bounds the numbers (gpu/README.md): the controller's host threads (each moves one
// command at a time: fetch, memcpy, CQE), PCIe round trips of GPU loads from the host-memory
// CQ, and system-scope atomics/fences in the queue protocol.
#include <string>
#include <vector>

#include "gpu_bench.cuh"
#include "warpfs/gpu/io.cuh"
#include "warpfs/gpu/locked_queue.cuh"
#include "warpfs/gpu/rig.cuh"

namespace {

using namespace warpfs;
namespace gb = warpfs::gpu::bench;

constexpr uint32_t kLba = 512;
constexpr uint64_t kStoreBytes = 1ull << 30;

__device__ uint64_t hash(uint64_t x) {
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdull;
  return x ^ (x >> 33);
}

__global__ void one_read_each(gpu::IoView io, gpu::LockedQueueGpu* lq, uint64_t buf_iova,
                              uint64_t lbas, uint64_t salt, uint32_t* failed) {
  const uint64_t tid = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  const uint64_t lba = hash(tid * 0x9e3779b97f4a7c15ull + salt) % lbas;
  const uint64_t iova = buf_iova + tid * kLba;
  uint16_t s;
  if (lq != nullptr) {
    s = lq->execute(gpu::make_rw(nvme::io::kRead, io.nsid, lba, 1, iova, kLba));
  } else {
    s = gpu::rw(io, false, lba * kLba, kLba, iova);
  }
  if (!nvme::status_ok(s)) atomicAdd(failed, 1u);
}

struct Point {
  const char* impl;
  uint32_t queues, threads;
};

double measure(gpu::Rig& rig, gpu::LockedQueueGpu* lq, uint64_t buf_iova, uint32_t threads,
               int reps, uint32_t* d_failed) {
  const uint32_t block = 128, grid = (threads + block - 1) / block;
  std::vector<double> ms;
  for (int r = 0; r <= reps; ++r) {  // r == 0: warm-up
    WARPFS_CUDA_CHECK(cudaMemset(d_failed, 0, sizeof(uint32_t)));
    const double t = gb::time_ms("one_read_each", [&] {
      one_read_each<<<grid, block>>>(rig.io(), lq, buf_iova, rig.lba_count(), r * 7919ull,
                                     d_failed);
    });
    uint32_t failed = 0;
    WARPFS_CUDA_CHECK(cudaMemcpy(&failed, d_failed, sizeof failed, cudaMemcpyDeviceToHost));
    if (failed != 0) {
      std::fprintf(stderr, "warpfs-bench-gpu-queues: %u reads failed\n", failed);
      std::exit(1);
    }
    if (r > 0) ms.push_back(t);
  }
  return gb::median(ms);
}

// The device model's host cost over a measurement (its warm-up included): host_ns_per_command
// = the controller threads' busy time (EmulatedCounters::busy_ns: rounds that found work) per
// I/O command; controller_busy = that busy time over threads x the runs' time (the median
// run's time times the runs: approximate). Near 1: the controller threads are the limit; well
// below: they wait for the GPU (submissions, CQ polling over PCIe).
struct HostCost {
  double ns_per_command = 0, busy = 0;
};
HostCost host_cost(const nvme::EmulatedCounters& a, const nvme::EmulatedCounters& b,
                   uint64_t threads, double median_ms, int reps) {
  HostCost h;
  const double busy = double(b.busy_ns - a.busy_ns);
  const double cmds = double(b.io_commands - a.io_commands);
  if (cmds > 0) h.ns_per_command = busy / cmds;
  h.busy = busy / (double(threads) * median_ms * 1e6 * (reps + 1));
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> threads = {1024, 2048, 4096, 8192, 16384, 32768};
  std::vector<uint64_t> scale_queues = {1, 2, 4, 8};
  std::vector<uint64_t> scale_threads = {32768, 65536};
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = gb::parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--scale-queues") && i + 1 < argc)
      scale_queues = gb::parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--scale-threads") && i + 1 < argc)
      scale_threads = gb::parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick"))
      threads = {1024, 8192}, scale_queues = {1, 4}, scale_threads = {32768}, reps = 2;
    else {
      std::fprintf(stderr,
                   "usage: warpfs-bench-gpu-queues [--quick] [--threads LIST] "
                   "[--scale-queues LIST] [--scale-threads LIST] [--reps N]\n");
      return 2;
    }
  }
  const std::string dev = gb::device_name();
  auto store = nvme::BackingStore::ram(kStoreBytes);
  uint64_t max_threads = 0;
  for (uint64_t t : threads) max_threads = std::max(max_threads, t);
  for (uint64_t t : scale_threads) max_threads = std::max(max_threads, t);
  uint32_t* d_failed = nullptr;
  WARPFS_CUDA_CHECK(cudaMalloc(&d_failed, sizeof(uint32_t)));

  auto open = [&](uint16_t queues, gpu::MappedRegion* buf) {
    gpu::RigOptions o;
    o.queues = queues;
    o.depth = 1024;
    o.device_threads = queues;
    std::string err;
    auto rig = gpu::Rig::open(o, store, &err);
    if (!rig || !rig->map_dma(max_threads * kLba, buf, &err)) {
      std::fprintf(stderr, "warpfs-bench-gpu-queues: %s\n", err.c_str());
      std::exit(1);
    }
    return rig;
  };
  // 1. Contention on one queue pair (fresh controller per implementation).
  for (const char* impl : {"locked_queue", "virtual_queue"}) {
    gpu::MappedRegion buf;
    auto rig = open(1, &buf);
    gpu::LockedQueueGpu* lq = std::strcmp(impl, "locked_queue") == 0
                                  ? gpu::LockedQueueGpu::create(rig->device_view(0))
                                  : nullptr;
    for (uint64_t t : threads) {
      const nvme::EmulatedCounters c0 = rig->transport().counters();
      const double ms = measure(*rig, lq, buf.iova, static_cast<uint32_t>(t), reps, d_failed);
      const HostCost hc = host_cost(c0, rig->transport().counters(), 1, ms, reps);
      std::printf(
          "{\"bench\":\"gpu_queues\",\"device\":\"%s\",\"impl\":\"%s\",\"threads\":%llu,"
          "\"queues\":1,\"controller_threads\":1,\"depth\":1024,\"block_bytes\":512,"
          "\"ms\":%.3f,\"iops\":%.0f,\"host_ns_per_command\":%.0f,\"controller_busy\":%.3f}\n",
          dev.c_str(), impl, (unsigned long long)t, ms, t / (ms / 1e3), hc.ns_per_command, hc.busy);
      std::fflush(stdout);
    }
    if (lq != nullptr) gpu::LockedQueueGpu::destroy(lq);
  }
  // 2. Scaling over queue pairs and controller threads.
  for (uint64_t q : scale_queues) {
    gpu::MappedRegion buf;
    auto rig = open(static_cast<uint16_t>(q), &buf);
    for (uint64_t t : scale_threads) {
      const nvme::EmulatedCounters c0 = rig->transport().counters();
      const double ms = measure(*rig, nullptr, buf.iova, static_cast<uint32_t>(t), reps, d_failed);
      const HostCost hc = host_cost(c0, rig->transport().counters(), q, ms, reps);
      std::printf(
          "{\"bench\":\"gpu_queues_scaling\",\"device\":\"%s\",\"impl\":\"virtual_queue\","
          "\"threads\":%llu,\"queues\":%llu,\"controller_threads\":%llu,\"depth\":1024,"
          "\"block_bytes\":512,\"ms\":%.3f,\"iops\":%.0f,\"host_ns_per_command\":%.0f,"
          "\"controller_busy\":%.3f}\n",
          dev.c_str(), (unsigned long long)t, (unsigned long long)q, (unsigned long long)q, ms,
          t / (ms / 1e3), hc.ns_per_command, hc.busy);
      std::fflush(stdout);
    }
  }
  WARPFS_CUDA_CHECK(cudaFree(d_failed));
  return 0;
}
