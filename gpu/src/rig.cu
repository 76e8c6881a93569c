#include <algorithm>
#include <cstring>
#include <new>

#include "warpfs/gpu/check.h"
#include "warpfs/gpu/rig.cuh"

namespace warpfs::gpu {
namespace {

constexpr uint64_t kPage = 4096;

std::string cuda_message(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

}  // namespace

bool Rig::register_host(void* p, size_t bytes, uint8_t** dev, std::string* error) {
  // Mapped: the GPU reaches the pages through its own address (UVA makes it equal to the host
  // address on the GPU machine, but the runtime's answer is the one to use). Portable: any
  // context may use it.
  cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    *error = cuda_message("cudaHostRegister of queue/DMA memory", e);
    return false;
  }
  registered_.push_back(p);
  void* d = nullptr;
  e = cudaHostGetDevicePointer(&d, p, 0);
  if (e != cudaSuccess) {
    *error = cuda_message("cudaHostGetDevicePointer", e);
    return false;
  }
  *dev = static_cast<uint8_t*>(d);
  return true;
}

std::unique_ptr<Rig> Rig::open(const RigOptions& o, std::shared_ptr<nvme::BackingStore> store,
                               std::string* error) {
  if (!port::is_pow2(o.depth) || o.depth < 2 || o.queues == 0) {
    *error = "rig: depth must be a power of two >= 2 and queues >= 1";
    return nullptr;
  }
  std::unique_ptr<Rig> r(new Rig());
  nvme::EmulatedConfig cfg;
  cfg.namespaces = {nvme::NamespaceConfig{o.lba_bytes, 0}};
  cfg.max_queue_entries = std::max<uint32_t>(cfg.max_queue_entries, o.depth);
  cfg.max_io_queues = std::max<uint16_t>(cfg.max_io_queues, o.queues);
  cfg.interrupt_vectors = static_cast<uint16_t>(cfg.max_io_queues + 1);
  cfg.worker_threads = o.device_threads;
  cfg.latency_ns = o.latency_ns;
  cfg.volatile_write_cache = o.volatile_write_cache;
  cfg.cache_in_store = o.cache_in_store;
  // A GPU doorbell write cannot wake a parked worker (the kick is a host futex): never park.
  cfg.idle_spin_ns = ~0ull;
  r->t_ = nvme::EmulatedTransport::create(cfg, std::move(store), error);
  if (!r->t_) return nullptr;
  nvme::ControllerOptions co;
  co.io_queues = o.queues;
  r->c_ = nvme::Controller::open(*r->t_, co, error);
  if (!r->c_) return nullptr;
  if (r->c_->io_queues_granted() < o.queues) {
    *error = "rig: the controller granted " + std::to_string(r->c_->io_queues_granted()) +
             " I/O queues, fewer than the " + std::to_string(o.queues) + " asked for";
    return nullptr;
  }
  const nvme::NamespaceInfo& ns = r->c_->namespaces().at(0);
  r->lba_bytes_ = ns.lba_bytes;
  r->lba_count_ = ns.lba_count;

  std::vector<nvme::QueueView> host_views;
  for (uint16_t qid = 1; qid <= o.queues; ++qid) {
    nvme::QueueView v;
    nvme::Status s = r->c_->create_queue_pair(qid, o.depth, nvme::QueuePriority::kMedium, &v);
    if (!s.is_ok()) {
      *error = "rig: creating I/O queue pair " + std::to_string(qid) + ": " + s.to_string();
      return nullptr;
    }
    host_views.push_back(v);
  }

  // The doorbells: one range of the register file from the first SQ tail doorbell to the
  // last CQ head doorbell, widened to whole pages (cudaHostRegister pins pages).
  uintptr_t lo = ~uintptr_t{0}, hi = 0;
  for (const nvme::QueueView& v : host_views) {
    for (const nvme::Doorbell* d : {&v.sq_doorbell, &v.cq_doorbell}) {
      const auto a = reinterpret_cast<uintptr_t>(d->reg);
      lo = std::min(lo, a);
      hi = std::max(hi, a + sizeof(uint32_t));
    }
  }
  lo &= ~(kPage - 1);
  hi = (hi + kPage - 1) & ~(kPage - 1);
  uint8_t* db_dev = nullptr;
  if (!r->register_host(reinterpret_cast<void*>(lo), hi - lo, &db_dev, error)) return nullptr;
  auto db = [&](const nvme::Doorbell& d) {
    nvme::Doorbell g;
    g.reg = reinterpret_cast<port::Atomic<uint32_t>*>(db_dev +
                                                      (reinterpret_cast<uintptr_t>(d.reg) - lo));
    g.kick = nullptr;  // nothing to wake: the workers poll
    g.mmio = false;    // a store the host thread observes, not a device register
    return g;
  };

  std::vector<nvme::VirtualQueue*> dev_queues;
  for (const nvme::QueueView& v : host_views) {
    nvme::QueueView g = v;
    uint8_t *sq = nullptr, *cq = nullptr;
    if (!r->register_host(v.sq, size_t{v.entries} * sizeof(nvme::SubmissionEntry), &sq, error) ||
        !r->register_host(v.cq, size_t{v.entries} * sizeof(nvme::CompletionEntry), &cq, error)) {
      return nullptr;
    }
    g.sq = reinterpret_cast<nvme::SubmissionEntry*>(sq);
    g.cq = reinterpret_cast<nvme::CompletionEntry*>(cq);
    g.sq_doorbell = db(v.sq_doorbell);
    g.cq_doorbell = db(v.cq_doorbell);
    g.irq = nullptr;  // GPU threads poll
    r->dev_views_.push_back(g);

    // Lay the queue out on the host with the device's pointers, then copy it over.
    const size_t bytes = nvme::VirtualQueue::footprint(v.entries);
    void* staging = ::operator new (bytes, std::align_val_t{port::kCacheLine});
    nvme::VirtualQueue::init(staging, g);
    void* d = nullptr;
    cudaError_t e = cudaMalloc(&d, bytes);
    if (e == cudaSuccess) e = cudaMemcpy(d, staging, bytes, cudaMemcpyHostToDevice);
    ::operator delete (staging, std::align_val_t{port::kCacheLine});
    if (d != nullptr) r->device_allocs_.push_back(d);
    if (e != cudaSuccess) {
      *error = cuda_message("rig: a VirtualQueue in GPU memory", e);
      return nullptr;
    }
    dev_queues.push_back(static_cast<nvme::VirtualQueue*>(d));
  }
  void* qarr = nullptr;
  cudaError_t e = cudaMalloc(&qarr, dev_queues.size() * sizeof(nvme::VirtualQueue*));
  if (e == cudaSuccess) r->device_allocs_.push_back(qarr);
  if (e == cudaSuccess) {
    e = cudaMemcpy(qarr, dev_queues.data(), dev_queues.size() * sizeof(nvme::VirtualQueue*),
                   cudaMemcpyHostToDevice);
  }
  // The queue mapper GPU threads route through: built by the host library over the queues'
  // GPU addresses (it stores them, reads none: their depth comes in the options), its tables
  // copied into GPU memory. Both priority classes share the queues.
  nvme::QueueMapper::Options mo;
  mo.queue_entries = o.depth;
  const nvme::QueueMapper mapper({dev_queues}, mo);
  void* tables = nullptr;
  if (e == cudaSuccess) e = cudaMalloc(&tables, sizeof(nvme::QueueMapper::Tables));
  if (e == cudaSuccess) r->device_allocs_.push_back(tables);
  if (e == cudaSuccess) {
    e = cudaMemcpy(tables, &mapper.tables(), sizeof(nvme::QueueMapper::Tables),
                   cudaMemcpyHostToDevice);
  }
  if (e != cudaSuccess) {
    *error = cuda_message("rig: queue table and mapper in GPU memory", e);
    return nullptr;
  }
  r->io_.queues = static_cast<nvme::VirtualQueue* const*>(qarr);
  r->io_.nqueues = static_cast<uint32_t>(dev_queues.size());
  r->io_.nsid = ns.nsid;
  r->io_.lba_shift = static_cast<uint32_t>(__builtin_ctz(ns.lba_bytes));
  r->io_.mapper = static_cast<nvme::QueueMapper::Tables*>(tables);
  r->io_.rebalance = o.rebalance;
  return r;
}

bool Rig::map_dma(size_t bytes, MappedRegion* out, std::string* error) {
  nvme::DmaRegion d;
  nvme::Status s = t_->dma_alloc(bytes, &d);
  if (!s.is_ok()) {
    *error = "rig: DMA memory (" + std::to_string(bytes) + " bytes): " + s.to_string();
    return false;
  }
  dma_.push_back(d);
  uint8_t* dev = nullptr;
  if (!register_host(d.vaddr, d.bytes, &dev, error)) return false;
  *out = MappedRegion{static_cast<uint8_t*>(d.vaddr), dev, d.iova, d.bytes};
  return true;
}

Rig::~Rig() {
  // Reverse order of acquisition: GPU memory, then the page-locking, then the DMA memory and
  // the controller (whose destructor shuts it down and frees the queues' memory).
  for (void* d : device_allocs_) (void)cudaFree(d);
  for (auto it = registered_.rbegin(); it != registered_.rend(); ++it) {
    (void)cudaHostUnregister(*it);
  }
  if (t_) {
    for (const nvme::DmaRegion& d : dma_) t_->dma_free(d);
  }
  c_.reset();
  t_.reset();
}

}  // namespace warpfs::gpu
