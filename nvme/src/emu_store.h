// Internal to the emulated controller: media access through the volatile write cache, and
// the emulated bus address space (the "IOMMU") that DMA goes through.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <unordered_map>
#include <vector>

#include "warpfs/nvme/emulated.h"

namespace warpfs::nvme::emu {

// A host buffer segment of one command's data, already translated from its PRPs.
struct Segment {
  uint8_t* ptr;
  size_t len;
};

// The device's volatile write cache in front of the media, in 4 KiB atomic units
// (Identify NAWUPF/NABSPF advertise exactly this unit, so a write inside one unit is
// power-fail atomic and larger writes may tear only at unit boundaries).
class Media {
 public:
  static constexpr uint64_t kUnit = 4096;

  // `in_store`: EmulatedConfig::cache_in_store (the store's cache plays the volatile cache;
  // the model's stays empty and mu_ is not taken for media access).
  Media(std::shared_ptr<BackingStore> store, bool cache_enabled, uint64_t cache_bytes,
        bool in_store);
  // Gather-scatter between the media at `offset` and the segments.
  Status write(uint64_t offset, const std::vector<Segment>& segs, bool fua);
  Status read(uint64_t offset, const std::vector<Segment>& segs);
  Status write_zeroes(uint64_t offset, uint64_t len, bool fua);
  Status deallocate(uint64_t offset, uint64_t len);
  Status flush();  // destage the cache and sync the store
  void set_cache_enabled(bool on);
  bool cache_enabled() const;
  // Power loss: persist each cached unit with the given probability, drop the rest.
  void lose_power(double persist_probability, std::mt19937_64& rng);

 private:
  Status destage_locked();
  Status unit_for_write_locked(uint64_t unit, bool whole, uint8_t** out);
  Status write_store(uint64_t offset, const std::vector<Segment>& segs);
  Status read_store(uint64_t offset, const std::vector<Segment>& segs);
  const std::shared_ptr<BackingStore> store_;  // thread-safe: concurrent pread/pwrite or memcpy
  const bool in_store_;
  mutable std::mutex mu_;  // guards cache_ and cache_enabled_
  bool cache_enabled_;
  uint64_t cache_limit_units_;
  std::unordered_map<uint64_t, std::unique_ptr<uint8_t[]>> cache_;  // unit index -> data
  // Unit buffers of destaged or dropped units, reused by the next writes: a full-cache
  // destage would otherwise free 64 MiB and fault it back in page by page.
  std::vector<std::unique_ptr<uint8_t[]>> spare_;
  void recycle_locked(std::unique_ptr<uint8_t[]> buf);
  void clear_cache_locked();  // every cached unit dropped, its buffer kept as a spare
};

// The emulated bus: DMA regions registered at IOVAs distinct from their virtual addresses.
// Translation checks that a whole range lies inside one live region, so a bad PRP is a
// Data Transfer Error, never a stray memory access.
class DmaSpace {
 public:
  static constexpr size_t kMaxRegions = 4096;
  DmaSpace();
  ~DmaSpace();
  Status alloc(size_t bytes, DmaRegion* out);
  void free(const DmaRegion& r);
  // The host address of [iova, iova+len), or null if any byte is outside a live region.
  uint8_t* translate(uint64_t iova, uint64_t len) const;

 private:
  struct Entry {
    port::Atomic<uint64_t> iova;
    port::Atomic<uint64_t> bytes;  // 0: slot free
    port::Atomic<uint64_t> vaddr;
  };
  std::mutex mu_;  // serialises alloc/free; translate is lock-free
  std::unique_ptr<Entry[]> entries_;
  port::Atomic<uint32_t> used_;  // entries [0, used_) may be live
  uint64_t next_iova_;
};

}  // namespace warpfs::nvme::emu
