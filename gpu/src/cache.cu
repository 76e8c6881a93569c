#include <vector>

#include "warpfs/gpu/cache.cuh"
#include "warpfs/gpu/check.h"
#include "warpfs/nvme/check.h"

namespace warpfs::gpu {

__global__ void flush_lines_kernel(CacheView c) {
  const uint64_t lines = uint64_t{c.nsets} * c.ways;
  for (uint64_t l = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; l < lines;
       l += uint64_t{gridDim.x} * blockDim.x) {
    GpuLineMeta& m = c.meta[l];
    const uint32_t s = m.state.load(port::Order::kAcquire);
    if (!(s & ls::kValid) || !(s & ls::kDirty)) continue;
    const uint32_t prev = ls::claim(m.state);
    if (prev & ls::kBusy) continue;  // someone else's fill or eviction: not quiescent
    m.state.fetch_and(~ls::kDirty, port::Order::kRelaxed);
    const uint64_t block = c.tags[l].load(port::Order::kAcquire) - 1;
    if (nvme::status_ok(detail::line_io(c, static_cast<uint32_t>(l), block, true))) {
      detail::count(c, kWritebacks);
    } else {
      ls::mark_dirty(m.state);
      detail::count(c, kErrors);
    }
    ls::unclaim(m.state);
  }
}

__global__ void flush_device_kernel(IoView io, uint16_t* status) {
  *status = flush(io);
}

std::unique_ptr<GpuCache> GpuCache::create(Rig& rig, const GpuCacheOptions& o, std::string* error) {
  if (!port::is_pow2(o.sets) || o.ways == 0 || o.ways > 64 || o.line_bytes % rig.lba_bytes() != 0 ||
      o.line_bytes > 8192 || o.line_bytes < 16) {
    *error =
        "gpu cache: sets must be a power of two, ways 1..64, lines a multiple of the LBA "
        "size up to 8 KiB";
    return nullptr;
  }
  std::unique_ptr<GpuCache> g(new GpuCache());
  CacheView& v = g->v_;
  v.nsets = o.sets;
  v.ways = o.ways;
  v.set_shift = static_cast<uint32_t>(__builtin_ctz(o.sets));
  v.line_bytes = o.line_bytes;
  v.device_lines = rig.lba_count() * rig.lba_bytes() / o.line_bytes;
  const uint64_t lines = g->lines();
  MappedRegion stage;
  if (!rig.map_dma(lines * o.line_bytes, &stage, error)) return nullptr;
  v.stage = stage.dev;
  v.stage_iova = stage.iova;
  v.io = rig.io();
  WARPFS_CUDA_CHECK(cudaMalloc(&v.meta, lines * sizeof(GpuLineMeta)));
  WARPFS_CUDA_CHECK(cudaMalloc(&v.tags, lines * sizeof(DevAtomic64)));
  WARPFS_CUDA_CHECK(cudaMalloc(&v.sets, o.sets * sizeof(GpuSetMeta)));
  WARPFS_CUDA_CHECK(cudaMalloc(&v.data, lines * o.line_bytes));
  WARPFS_CUDA_CHECK(cudaMalloc(&v.stats, kGpuStats * sizeof(*v.stats)));
  WARPFS_CUDA_CHECK(cudaMemset(v.sets, 0, o.sets * sizeof(GpuSetMeta)));  // unlocked, hand 0
  g->invalidate();
  g->reset_stats();
  return g;
}

GpuCache::~GpuCache() {
  WARPFS_CUDA_CHECK(cudaFree(v_.meta));
  WARPFS_CUDA_CHECK(cudaFree(v_.tags));
  WARPFS_CUDA_CHECK(cudaFree(v_.sets));
  WARPFS_CUDA_CHECK(cudaFree(v_.data));
  WARPFS_CUDA_CHECK(cudaFree(v_.stats));
}

void GpuCache::invalidate() {
  if constexpr (port::kDebugChecks) {
    // The REQUIRES, read back from the GPU (the copy waits for the default stream's kernels):
    // a reference or a dirty line would be dropped without a word.
    std::vector<GpuLineMeta> meta(lines());
    WARPFS_CUDA_CHECK(
        cudaMemcpy(meta.data(), v_.meta, lines() * sizeof(GpuLineMeta), cudaMemcpyDeviceToHost));
    for (GpuLineMeta& m : meta) {
      const uint32_t s = m.state.unsafe_ref();
      WARPFS_DCHECK((s & (ls::kCountMask | ls::kBusy)) == 0, "GpuCache::invalidate: not quiescent");
      WARPFS_DCHECK((s & ls::kDirty) == 0, "GpuCache::invalidate: a dirty line (flush first)");
    }
  }
  WARPFS_CUDA_CHECK(cudaMemset(v_.meta, 0, lines() * sizeof(GpuLineMeta)));
  WARPFS_CUDA_CHECK(cudaMemset(v_.tags, 0, lines() * sizeof(DevAtomic64)));
  // Poison the line data: a hit on a line nobody filled shows as garbage, not zeroes.
  WARPFS_CUDA_CHECK(cudaMemset(v_.data, 0x5a, lines() * v_.line_bytes));
}

bool GpuCache::flush(std::string* error) {
  const uint64_t before = stats().errors;
  flush_lines_kernel<<<256, 128>>>(v_);
  sync_or_die("flush_lines_kernel", 120);
  uint16_t* d = nullptr;
  WARPFS_CUDA_CHECK(cudaMalloc(&d, sizeof(uint16_t)));
  WARPFS_CUDA_CHECK(cudaMemset(d, 0xff, sizeof(uint16_t)));
  flush_device_kernel<<<1, 1>>>(v_.io, d);
  sync_or_die("flush_device_kernel", 60);
  uint16_t s = 0;
  WARPFS_CUDA_CHECK(cudaMemcpy(&s, d, sizeof s, cudaMemcpyDeviceToHost));
  WARPFS_CUDA_CHECK(cudaFree(d));
  if (stats().errors != before) {
    *error = "gpu cache flush: a write-back failed";
    return false;
  }
  if (!nvme::status_ok(s)) {
    *error = "gpu cache flush: the NVMe Flush failed: " + nvme::Status::nvme(s).to_string();
    return false;
  }
  return true;
}

GpuCacheStats GpuCache::stats() const {
  port::Padded<DevAtomic64> h[kGpuStats];
  WARPFS_CUDA_CHECK(cudaMemcpy(h, v_.stats, sizeof h, cudaMemcpyDeviceToHost));
  auto get = [&](int i) { return h[i].value.unsafe_ref(); };
  return GpuCacheStats{get(kMisses), get(kEvictions), get(kWritebacks), get(kSetFull),
                       get(kErrors)};
}

void GpuCache::reset_stats() {
  WARPFS_CUDA_CHECK(cudaMemset(v_.stats, 0, kGpuStats * sizeof(*v_.stats)));
}

}  // namespace warpfs::gpu
