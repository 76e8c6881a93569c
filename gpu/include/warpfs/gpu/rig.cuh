// Rig: the host-side set-up of GPU-initiated I/O against the emulated NVMe controller.
//
// It brings an emulated controller up over a backing store, creates the I/O queue pairs,
// and makes everything a GPU thread touches reachable from the GPU:
//   - SQs, CQs and data buffers (DMA memory from the transport, page-aligned mmap) and the
//     page(s) of the register file that hold the doorbells are page-locked and mapped into
//     the GPU (cudaHostRegister, cudaHostRegisterMapped), as BaM maps an SSD's BAR
//     (digest §1: cudaHostRegister + cudaHostGetDevicePointer);
//   - each VirtualQueue is laid out on the host (VirtualQueue::init, with the device's
//     pointers in its QueueView) and copied into GPU memory: its tickets, turns, marks and
//     locks are touched by GPU threads only.
// The controller's worker threads never park (EmulatedConfig::idle_spin_ns is infinite): a
// parked worker is woken by a host futex, which a GPU doorbell write cannot reach, so they
// poll the doorbells for as long as the rig lives (one host core each).
//
// This file is compiled by nvcc only: port::kCacheLine is 128 under nvcc and 64 under the host
// compiler, so a VirtualQueue laid out here has the device's layout. Only layout-free types
// (QueueView, DmaRegion, Controller, EmulatedTransport) cross into the host-compiled library.
//
// Thread-safety: a Rig is set up and torn down by one host thread; kernels may use its views
// concurrently in between. REQUIRES (unchecked: the host cannot tell which kernels use it): no
// kernel using the rig is running when it is destroyed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "warpfs/gpu/io.cuh"
#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/emulated.h"

namespace warpfs::gpu {

// DMA memory seen three ways: host address, device address, bus address (for PRPs).
struct MappedRegion {
  uint8_t* host = nullptr;
  uint8_t* dev = nullptr;
  uint64_t iova = 0;
  size_t bytes = 0;
};

struct RigOptions {
  uint32_t lba_bytes = 512;
  uint16_t queues = 1;
  uint32_t depth = 1024;        // entries per SQ and CQ (a power of two)
  unsigned device_threads = 1;  // emulated controller worker threads
  uint32_t latency_ns = 0;      // emulated device latency per command
  bool volatile_write_cache = true;
  bool rebalance = true;  // GPU threads may move the mapper's slots (io.cuh, execute_routed)
  // Writes reach the store at once (EmulatedConfig::cache_in_store): another controller over
  // the same store (gpu::Volume's filesystem core) sees them, and no command takes the
  // modelled write cache's device-wide lock (with it, a read took that lock too: on 14
  // workers it cost more than the command). false: the modelled volatile cache, for tests of
  // what a power cut loses.
  bool cache_in_store = true;
};

class Rig {
 public:
  // `error` receives a message naming the step that failed.
  static std::unique_ptr<Rig> open(const RigOptions& o, std::shared_ptr<nvme::BackingStore> store,
                                   std::string* error);
  ~Rig();
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  // For kernels: the queues (in GPU memory) and the namespace.
  const IoView& io() const { return io_; }
  // Queue pair i (0-based) as the GPU sees it: device pointers, no kick, no interrupt.
  const nvme::QueueView& device_view(uint32_t i) const { return dev_views_[i]; }
  uint32_t queues() const { return static_cast<uint32_t>(dev_views_.size()); }

  // DMA memory mapped into the GPU; freed with the rig. Zero-filled.
  bool map_dma(size_t bytes, MappedRegion* out, std::string* error);

  uint32_t lba_bytes() const { return lba_bytes_; }
  uint64_t lba_count() const { return lba_count_; }
  nvme::EmulatedTransport& transport() { return *t_; }
  nvme::Controller& controller() { return *c_; }
  // Normal shutdown (CC.SHN): the volatile write cache reaches the store. No I/O afterwards.
  nvme::Status shutdown() { return c_->shutdown(); }

 private:
  Rig() = default;
  bool register_host(void* p, size_t bytes, uint8_t** dev, std::string* error);

  std::unique_ptr<nvme::EmulatedTransport> t_;
  std::unique_ptr<nvme::Controller> c_;
  std::vector<void*> registered_;     // host ranges to unregister, in order
  std::vector<void*> device_allocs_;  // cudaMalloc'd, to free
  std::vector<nvme::DmaRegion> dma_;  // from map_dma, to free after unregistering
  std::vector<nvme::QueueView> dev_views_;
  IoView io_;
  uint32_t lba_bytes_ = 0;
  uint64_t lba_count_ = 0;
};

}  // namespace warpfs::gpu
