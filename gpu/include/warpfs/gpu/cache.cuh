// The GPU software cache: the set-associative cache of cache/cache.h (same state word, same
// protocol: cache/line_state.h) with GPU threads as lanes and the real warp primitives for
// coalescing (BaM Ch. 7, Listings 7.5/7.6).
//
// Layout. N sets × K ways. Line data lives in GPU memory, so hits never leave the GPU. The
// emulated controller cannot write GPU memory (it is host code; BaM's SSDs DMA into it
// peer-to-peer), so each line has a staging slot in pinned host memory mapped into the GPU:
// a fill reads the block into the slot and the filling thread copies it into the line; a
// write-back copies the line into the slot and writes it from there. State words, tags and set
// locks are GPU memory touched only by GPU threads: device-scope atomics (port::Scope), each
// state word alone on a 128-byte line (thesis §6.4: unpadded atomics gave the tails).
//
// Protocol (cache.h has the full argument; the differences are noted):
//   hit:    take(count) on the probed way; Valid, not Busy and our tag -> hit.
//   busy:   our tag and Busy: keep the reference, wait for Busy to clear (a "locked hit").
//   miss:   the set's ticket lock (device scope), probe again, clock victim claimed with
//           claim() and re-checked, write-back of a dirty victim under the lock, retag, take,
//           unlock, fill, publish. A failed fill clears the tag before Busy.
//   full:   every way referenced or Busy: the leader backs off and retries. It holds no
//           reference meanwhile, and no thread waits while holding an unfilled line, so the
//           lines it waits for are released by threads that are not waiting on it.
//   release: mark_dirty() if a lane of the group wrote, then drop(count).
// Coalescing: the lanes of a warp that want the same block form a group with
// __match_any_sync; the first lane (__ffs) acquires for __popc(group) references and
// broadcasts the line with __shfl_sync; writes are OR-ed with __any_sync; after the group's
// accesses (__syncwarp(group)) the leader releases them all at once.
//
// I/O errors: a failed fill or write-back is counted in the stats (kErrors) and the lanes get
// no line (null); array<T> then yields T{}. Tests check the counter.
//
// Thread-safety: every __device__ function may be called by any number of GPU threads.
// GpuCache's host methods: one host thread, no kernel using the cache running.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "warpfs/cache/line_state.h"
#include "warpfs/gpu/io.cuh"
#include "warpfs/gpu/rig.cuh"

namespace warpfs::gpu {

namespace ls = warpfs::cache::line_state;
using DevAtomic32 = port::Atomic<uint32_t, port::Scope::kDevice>;
using DevAtomic64 = port::Atomic<uint64_t, port::Scope::kDevice>;

struct alignas(port::kCacheLine) GpuLineMeta {
  DevAtomic32 state;  // V | B | D | 29-bit count (line_state.h)
  DevAtomic32 flags;  // clock reference bit
};
struct alignas(port::kCacheLine) GpuSetMeta {
  port::BasicTicketLock<port::Scope::kDevice> lock;  // Lock order: one set lock at a time.
  uint32_t hand;                                     // clock hand, under lock
};
static_assert(sizeof(GpuLineMeta) == 128, "one state word per 128-byte line (BaM, thesis §6.4)");

enum GpuStat { kMisses, kEvictions, kWritebacks, kSetFull, kErrors, kGpuStats };

// Everything a kernel needs; plain data, passed by value.
struct CacheView {
  uint32_t nsets = 0, ways = 0, set_shift = 0, line_bytes = 0;
  uint64_t device_lines = 0;  // lines the namespace holds
  GpuLineMeta* meta = nullptr;
  DevAtomic64* tags = nullptr;  // block + 1 per line; 0: empty
  GpuSetMeta* sets = nullptr;
  uint8_t* data = nullptr;   // GPU memory, nsets * ways lines
  uint8_t* stage = nullptr;  // pinned host memory (device address), one slot per line
  uint64_t stage_iova = 0;
  IoView io;
  port::Padded<DevAtomic64>* stats = nullptr;  // kGpuStats counters
};

inline constexpr uint32_t kNoLine = ~0u;

namespace detail {

__device__ inline void count(const CacheView& c, int stat) {
  c.stats[stat].value.fetch_add(1, port::Order::kRelaxed);
}
__device__ inline uint32_t set_of(const CacheView& c, uint64_t block) {
  return static_cast<uint32_t>((block ^ (block >> c.set_shift)) & (c.nsets - 1));
}
__device__ inline int probe(const CacheView& c, uint32_t set, uint64_t block) {
  const uint32_t base = set * c.ways;
  for (uint32_t w = 0; w < c.ways; ++w) {
    if (c.tags[base + w].load(port::Order::kAcquire) == block + 1)
      return static_cast<int>(base + w);
  }
  return -1;
}
__device__ inline void touch(GpuLineMeta& m) {
  if (!(m.flags.load(port::Order::kRelaxed) & ls::kRef))
    m.flags.fetch_or(ls::kRef, port::Order::kRelaxed);
}
// Waits until the line is not Busy or no longer holds `block`; true if it is valid for it.
__device__ inline bool wait_not_busy(const CacheView& c, uint32_t line, uint64_t block) {
  port::Backoff b;
  for (;;) {
    const uint32_t s = c.meta[line].state.load(port::Order::kAcquire);
    if (c.tags[line].load(port::Order::kAcquire) != block + 1) return false;
    if (!(s & ls::kBusy)) return (s & ls::kValid) != 0;
    b.pause();
  }
}
// 16-byte copies (lines are multiples of 512 bytes, both sides 16-byte aligned).
__device__ inline void copy_line(uint8_t* dst, const uint8_t* src, uint32_t bytes) {
  auto* d = reinterpret_cast<uint4*>(dst);
  const auto* s = reinterpret_cast<const uint4*>(src);
#pragma unroll 8
  for (uint32_t i = 0; i < bytes / 16; ++i) d[i] = s[i];
}
// Moves line `line` to or from block `block` on the device through its staging slot.
__device__ inline uint16_t line_io(const CacheView& c, uint32_t line, uint64_t block, bool write) {
  uint8_t* slot = c.stage + uint64_t{line} * c.line_bytes;
  uint8_t* data = c.data + uint64_t{line} * c.line_bytes;
  if (write) copy_line(slot, data, c.line_bytes);
  const uint16_t s = rw(c.io, write, block * c.line_bytes, c.line_bytes,
                        c.stage_iova + uint64_t{line} * c.line_bytes);
  // After the completion (acquire, io.cuh): the slot holds the block.
  if (!write && nvme::status_ok(s)) copy_line(data, slot, c.line_bytes);
  return s;
}

}  // namespace detail

enum class Got : uint8_t { kHit, kFull, kError };

// One acquisition of `n` references on `block` (a coalesced group's leader calls it).
__device__ inline Got acquire_line(const CacheView& c, uint64_t block, uint32_t n,
                                   uint32_t* line_out) {
  using namespace detail;
  const uint32_t set = set_of(c, block);
  for (;;) {
    // Fast path: no lock.
    if (int w = probe(c, set, block); w >= 0) {
      GpuLineMeta& m = c.meta[w];
      const uint32_t s = ls::take(m.state, n);
      const bool ours = c.tags[w].load(port::Order::kAcquire) == block + 1;
      if (ls::usable(s) && ours) {
        touch(m);
        *line_out = static_cast<uint32_t>(w);
        return Got::kHit;
      }
      if ((s & ls::kBusy) && ours && wait_not_busy(c, static_cast<uint32_t>(w), block)) {
        touch(m);
        *line_out = static_cast<uint32_t>(w);
        return Got::kHit;
      }
      ls::drop(m.state, n);
      if ((s & ls::kBusy) && ours) continue;  // the fill failed or the line moved: again
    }
    // Slow path: the set lock orders inserters, so a block is inserted once.
    GpuSetMeta& sm = c.sets[set];
    sm.lock.lock();
    if (int w = probe(c, set, block); w >= 0) {
      GpuLineMeta& m = c.meta[w];
      const uint32_t s = ls::take(m.state, n);
      sm.lock.unlock();
      if (ls::usable(s) || wait_not_busy(c, static_cast<uint32_t>(w), block)) {
        touch(m);
        *line_out = static_cast<uint32_t>(w);
        return Got::kHit;
      }
      ls::drop(m.state, n);
      continue;
    }
    // Clock over the set (BaM §6.3): skip referenced or Busy lines, second chance for
    // recently used ones, claim with Busy and back off if someone raced in.
    int victim = -1;
    uint32_t prev = 0;
    for (uint32_t i = 0; i < 2 * c.ways && victim < 0; ++i) {
      const uint32_t w = set * c.ways + sm.hand;
      sm.hand = sm.hand + 1 == c.ways ? 0 : sm.hand + 1;
      GpuLineMeta& m = c.meta[w];
      const uint32_t s = m.state.load(port::Order::kRelaxed);
      if (!ls::idle(s)) continue;
      if ((s & ls::kValid) && (m.flags.load(port::Order::kRelaxed) & ls::kRef)) {
        m.flags.fetch_and(~ls::kRef, port::Order::kRelaxed);
        continue;
      }
      prev = ls::claim(m.state);
      if (!ls::idle(prev)) {
        if (!(prev & ls::kBusy)) ls::unclaim(m.state);
        continue;
      }
      victim = static_cast<int>(w);
    }
    if (victim < 0) {
      sm.lock.unlock();
      count(c, kSetFull);
      return Got::kFull;
    }
    GpuLineMeta& m = c.meta[victim];
    const auto line = static_cast<uint32_t>(victim);
    if ((prev & ls::kValid) && (prev & ls::kDirty)) {
      // Under the set lock: a reader of the old block (same set) cannot fetch stale data.
      const uint64_t old = c.tags[line].load(port::Order::kRelaxed) - 1;
      if (!nvme::status_ok(line_io(c, line, old, true))) {
        ls::unclaim(m.state);  // keep the dirty line: its data must not be lost
        sm.lock.unlock();
        count(c, kErrors);
        return Got::kError;
      }
      count(c, kWritebacks);
    }
    if (prev & ls::kValid) count(c, kEvictions);
    m.state.fetch_and(~(ls::kValid | ls::kDirty), port::Order::kRelaxed);  // Busy stays
    c.tags[line].store(block + 1, port::Order::kRelease);
    m.flags.store(ls::kRef, port::Order::kRelaxed);
    m.state.fetch_add(n, port::Order::kRelaxed);
    sm.lock.unlock();
    count(c, kMisses);
    if (!nvme::status_ok(line_io(c, line, block, false))) {
      c.tags[line].store(0, port::Order::kRelease);  // waiters see the tag go, then Busy
      m.state.fetch_sub(n, port::Order::kRelaxed);
      ls::unclaim(m.state);
      count(c, kErrors);
      return Got::kError;
    }
    ls::publish(m.state);
    *line_out = line;
    return Got::kHit;
  }
}

// Retries a full set with back-off (see "full" above).
__device__ inline uint32_t acquire_line_wait(const CacheView& c, uint64_t block, uint32_t count) {
  port::Backoff b;
  uint32_t line = kNoLine;
  for (;;) {
    const Got g = acquire_line(c, block, count, &line);
    if (g == Got::kHit) return line;
    if (g == Got::kError) return kNoLine;
    b.pause();
  }
}

__device__ inline void release_line(const CacheView& c, uint32_t line, uint32_t count, bool wrote) {
  GpuLineMeta& m = c.meta[line];
  // Dirty before the drop: a flush that cleared D meanwhile cannot lose this write.
  if (wrote) ls::mark_dirty(m.state);
  ls::drop(m.state, count);
}

// A coalesced access by the calling lanes: the group of lanes on the same block shares one
// acquisition. Returns the line's data (null on an I/O error) and fills *group for release.
struct Group {
  uint32_t mask = 0;
  int leader = 0;
  uint32_t line = kNoLine;
};
__device__ inline uint8_t* warp_acquire(const CacheView& c, uint64_t block, Group* g) {
  const uint32_t mask = __match_any_sync(__activemask(), block);
  const int leader = __ffs(mask) - 1;
  uint32_t line = kNoLine;
  if (static_cast<int>(threadIdx.x % 32) == leader) {
    line = acquire_line_wait(c, block, static_cast<uint32_t>(__popc(mask)));
  }
  line = __shfl_sync(mask, line, leader);
  *g = Group{mask, leader, line};
  return line == kNoLine ? nullptr : c.data + uint64_t{line} * c.line_bytes;
}
// Every lane of the group calls it after its access; `wrote`: this lane modified the line.
__device__ inline void warp_release(const CacheView& c, const Group& g, bool wrote) {
  __syncwarp(g.mask);  // the group's accesses happen before the leader's release (drop)
  const bool any = __any_sync(g.mask, wrote);
  if (g.line != kNoLine && static_cast<int>(threadIdx.x % 32) == g.leader) {
    release_line(c, g.line, static_cast<uint32_t>(__popc(g.mask)), any);
  }
}

// A cursor's acquisition (array_ref, file_array_ref: BaM §7.2.2): the lanes of the warp that
// want `block` form a group, its leader acquires one reference per lane and counts one lookup,
// and every lane gets the line (kNoLine after an I/O error). Each lane then holds its own
// reference until cursor_release.
__device__ inline uint32_t cursor_acquire(const CacheView& c, uint64_t block, uint32_t* lookups) {
  const uint32_t mask = __match_any_sync(__activemask(), block);
  const int leader = __ffs(mask) - 1;
  uint32_t line = kNoLine;
  if (static_cast<int>(threadIdx.x % 32) == leader) {
    line = acquire_line_wait(c, block, static_cast<uint32_t>(__popc(mask)));
    ++*lookups;
  }
  return __shfl_sync(mask, line, leader);
}
// Drops the lane's reference on `line` (kNoLine: none); the lanes releasing the same line
// together do it with one atomic, marking it dirty if any of them wrote.
__device__ inline void cursor_release(const CacheView& c, uint32_t line, bool wrote) {
  const uint32_t mask = __match_any_sync(__activemask(), line);
  if (line == kNoLine) return;
  const int leader = __ffs(mask) - 1;
  const bool any = __any_sync(mask, wrote);
  if (static_cast<int>(threadIdx.x % 32) == leader) {
    release_line(c, line, static_cast<uint32_t>(__popc(mask)), any);
  }
}

// Write-back of every dirty line (thread per line, grid-stride); a quiescent cache is
// REQUIRED (no references held), as CPU Cache::flush_all. Failed writes keep the line dirty.
__global__ void flush_lines_kernel(CacheView c);
// One NVMe Flush: the write-backs become durable (NVM §3.2 / Base §7.1).
__global__ void flush_device_kernel(IoView io, uint16_t* status);

struct GpuCacheOptions {
  uint32_t sets = 1024;  // a power of two
  uint32_t ways = 8;
  uint32_t line_bytes = 4096;  // a multiple of the LBA size, at most 8 KiB (two PRPs)
};

struct GpuCacheStats {
  uint64_t misses = 0, evictions = 0, writebacks = 0, set_full = 0, errors = 0;
};

// Host side: owns the cache's GPU memory and staging slots.
class GpuCache {
 public:
  static std::unique_ptr<GpuCache> create(Rig& rig, const GpuCacheOptions& o, std::string* error);
  ~GpuCache();
  GpuCache(const GpuCache&) = delete;
  GpuCache& operator=(const GpuCache&) = delete;

  const CacheView& view() const { return v_; }
  uint64_t lines() const { return uint64_t{v_.nsets} * v_.ways; }
  // Write-back of every dirty line, then an NVMe Flush. False (and *error) on a failure.
  bool flush(std::string* error);
  // Forgets every line (a cold cache). REQUIRES: quiescent, nothing dirty (flush first);
  // debug builds check both on the lines' state words.
  void invalidate();
  GpuCacheStats stats() const;
  void reset_stats();

 private:
  GpuCache() = default;
  CacheView v_;
};

}  // namespace warpfs::gpu
