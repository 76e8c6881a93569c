// The cache line state word (BaM Table 6.1, GPU4FS thesis Table 4.1), shared by the CPU cache
// (cache.cc) and the GPU cache (gpu/include/warpfs/gpu/cache.cuh): one definition of the bits
// and of the atomic steps the protocol in cache.h is built from, compiled for both.
//
//   bit 31 Valid, bit 30 Busy, bit 29 Dirty, bits 28:0 reference count.
//
// The orderings, chosen once here (BaM §6.4, §2.1.1):
//   take     fetch_add(count), acquire: a hit sees the data and tag the filler published.
//   drop     fetch_sub(count), release: our reads/writes of the line happen before an evictor
//            that sees the count reach zero reuses it.
//   claim    fetch_or(Busy), acquire: the evictor/filler owns the line if the returned word
//            shows no references and no Busy (BaM Fig 6.5's second check).
//   unclaim  fetch_and(~Busy), release: give a claimed line back unchanged.
//   publish  fetch_xor(Busy | Valid), release: the filled data is visible to every later take.
//   dirty    fetch_or(Dirty), relaxed: ordered by the drop that follows it.
// `A` is any port::Atomic<uint32_t, Scope> (the GPU cache uses device scope).
//
// Thread-safety: these are single atomic operations; the protocol around them is in cache.h.
#pragma once

#include <cstdint>

#include "warpfs/nvme/port.h"

namespace warpfs::cache::line_state {

inline constexpr uint32_t kValid = 1u << 31;
inline constexpr uint32_t kBusy = 1u << 30;
inline constexpr uint32_t kDirty = 1u << 29;
inline constexpr uint32_t kCountMask = kDirty - 1;
// Line flags (a second word beside the state): the clock's reference bit, read-ahead, and
// whether a metadata-class lane wrote the line's dirty data (its write-back then goes in the
// metadata class too: a commit's checkpoint waits on it), and whether a write-back of the
// line is in flight (set by the flusher that cleared Dirty, cleared once the device has it:
// another flusher that finds the line clean waits for it before it may call it written).
inline constexpr uint32_t kRef = 1;
inline constexpr uint32_t kAhead = 2;
inline constexpr uint32_t kMeta = 4;
inline constexpr uint32_t kWriting = 8;
// Copies in and out of the line at this moment (the CPU cache's Cache::copy_in and
// copy_out), a reader/writer lock of the line's bytes: a writer (kWriter, one at a time) copies
// while no reader, no other writer and no write-back (kWriting) is at the line; readers
// (counted from bit 8) copy while no writer is. So a write-back or a reader gets each
// line whole, old or new, never torn (stable lines).
inline constexpr uint32_t kWriter = 16;
inline constexpr uint32_t kReaderOne = 1u << 8;
inline constexpr uint32_t kReaderMask = ~0u << 8;

// Valid and not being filled or evicted: a reference taken on it is a hit.
WARPFS_HD constexpr bool usable(uint32_t s) {
  return (s & kValid) && !(s & kBusy);
}
// Neither referenced nor Busy: the clock may claim it.
WARPFS_HD constexpr bool idle(uint32_t s) {
  return !(s & kCountMask) && !(s & kBusy);
}

template <typename A>
WARPFS_HD uint32_t take(A& state, uint32_t n) {
  return state.fetch_add(n, port::Order::kAcquire);
}
template <typename A>
WARPFS_HD void drop(A& state, uint32_t n) {
  state.fetch_sub(n, port::Order::kRelease);
}
template <typename A>
WARPFS_HD uint32_t claim(A& state) {
  return state.fetch_or(kBusy, port::Order::kAcquire);
}
template <typename A>
WARPFS_HD void unclaim(A& state) {
  state.fetch_and(~kBusy, port::Order::kRelease);
}
template <typename A>
WARPFS_HD void publish(A& state) {
  state.fetch_xor(kBusy | kValid, port::Order::kRelease);
}
template <typename A>
WARPFS_HD void mark_dirty(A& state) {
  state.fetch_or(kDirty, port::Order::kRelaxed);
}

}  // namespace warpfs::cache::line_state
