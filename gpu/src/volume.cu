#include <cstdio>

#include "warpfs/gpu/check.h"
#include "warpfs/gpu/volume.cuh"

namespace warpfs::gpu {

std::unique_ptr<Volume> Volume::open(const std::string& image, const VolumeOptions& o,
                                     std::string* error) {
  if (o.cache.line_bytes != 4096) {
    *error = "gpu volume: the cache's lines must be 4096 bytes (one filesystem block)";
    return nullptr;
  }
  std::unique_ptr<Volume> v(new Volume());
  if (!(v->host_ = HostVolume::open(image, o.writable, error))) return nullptr;
  RigOptions ro = o.rig;
  ro.cache_in_store = true;  // the core's controller reads what the GPU's wrote, and back
  if (!(v->rig_ = Rig::open(ro, v->host_->store(), error))) {
    *error = image + ": " + *error;
    return nullptr;
  }
  if (!(v->cache_ = GpuCache::create(*v->rig_, o.cache, error))) {
    *error = image + ": " + *error;
    return nullptr;
  }
  WARPFS_CUDA_CHECK(cudaMalloc(&v->dropped_, sizeof(DevAtomic64)));
  WARPFS_CUDA_CHECK(cudaMemset(v->dropped_, 0, sizeof(DevAtomic64)));
  return v;
}

Volume::~Volume() {
  std::string error;
  if (!close(&error)) std::fprintf(stderr, "warpfs gpu volume: %s\n", error.c_str());
}

int Volume::map_file(const std::string& path, bool writable, const MappedFile** f,
                     const uint64_t** map, std::string* error) {
  if (closed_) {
    *error = "the volume is closed";
    return EBADF;
  }
  auto m = std::make_unique<MappedFile>();
  if (int rc = host_->map(path, writable, m.get(), error); rc) return rc;
  uint64_t* d = nullptr;
  const size_t bytes = std::max<size_t>(1, m->blocks.size()) * sizeof(uint64_t);
  WARPFS_CUDA_CHECK(cudaMalloc(&d, bytes));
  if (!m->blocks.empty()) {
    WARPFS_CUDA_CHECK(cudaMemcpy(d, m->blocks.data(), m->blocks.size() * sizeof(uint64_t),
                                 cudaMemcpyHostToDevice));
  }
  maps_.push_back(d);
  any_writable_ |= writable;
  *f = m.get();
  *map = d;
  files_.push_back(std::move(m));
  return 0;
}

uint64_t Volume::dropped_writes() const {
  if (dropped_ == nullptr) return dropped_at_close_;
  DevAtomic64 h;
  WARPFS_CUDA_CHECK(cudaMemcpy(&h, dropped_, sizeof h, cudaMemcpyDeviceToHost));
  return h.unsafe_ref();
}

bool Volume::close(std::string* error) {
  if (closed_) return true;
  closed_ = true;
  bool ok = true;
  bool wrote = false;
  if (cache_) {  // (an open that failed part-way has no cache or rig)
    // Every dirty line to the device, then one NVMe Flush from the GPU.
    if (any_writable_ && !cache_->flush(error)) ok = false;
    // Data reached the files (write-backs count evictions and the flush's; a caller that
    // reset the cache's counters after writing makes this miss, and the times stay as they
    // were).
    wrote = any_writable_ && cache_->stats().writebacks > 0;
  }
  if (dropped_ != nullptr) dropped_at_close_ = dropped_writes();
  if (rig_) {
    if (nvme::Status s = rig_->shutdown(); !s.is_ok() && ok) {
      *error = "gpu controller shutdown: " + s.to_string();
      ok = false;
    }
  }
  cache_.reset();
  rig_.reset();
  for (uint64_t* d : maps_) WARPFS_CUDA_CHECK(cudaFree(d));
  maps_.clear();
  if (dropped_ != nullptr) WARPFS_CUDA_CHECK(cudaFree(dropped_));
  dropped_ = nullptr;
  std::string host_error;
  if (host_ && !host_->close(wrote, &host_error) && ok) {
    *error = host_error;
    ok = false;
  }
  return ok;
}

}  // namespace warpfs::gpu
