// warpfs::gpu::array<T>: BaM's bam::array (BaM §7.1-7.3) over the GPU cache. Element i of a
// storage-backed array lives in line first_line + i / (line_bytes / sizeof(T)) of the
// namespace; a kernel reads and writes elements through the cache, with the lanes of a warp
// that touch the same line coalesced into one acquisition (cache.cuh: __match_any_sync,
// __popc, __ffs, __any_sync, __shfl_sync).
//
//   array<T>::read(i)   acquire (coalesced), copy the element, release. Not an lvalue.
//                       read(i, &lookups) also counts the acquisitions (for hit rates), in
//                       both classes.
//   array<T>::write(i, v)  the same with a store; the line becomes Dirty.
//   array_ref<T>        BaM's array_ref (§7.2.2): a per-thread cursor that keeps its line
//                       referenced while consecutive accesses stay in it and re-acquires
//                       (coalesced with the lanes that move at the same time) only when the
//                       index leaves the line. It holds one reference at most, released by
//                       reset() or its destructor; a thread holding several may deadlock a
//                       small cache (BaM's caveat), so hold one per thread.
// Elements never straddle lines: line_bytes must be a multiple of sizeof(T).
//
// Thread-safety: any number of GPU threads; an array_ref belongs to its thread. Every lane of
// a warp that reaches an access must take part in it (the warp primitives use __activemask).
#pragma once

#include <cstdint>
#include <cstring>

#include "warpfs/gpu/cache.cuh"

namespace warpfs::gpu {

template <typename T>
class array {
 public:
  array() = default;
  // Host: an array of `n` elements starting at namespace line `first_line`.
  array(const CacheView& c, uint64_t n, uint64_t first_line)
      : c_(c), n_(n), first_(first_line), per_line_(c.line_bytes / sizeof(T)) {}

  __host__ __device__ uint64_t size() const { return n_; }
  __device__ uint64_t line_of(uint64_t i) const { return first_ + i / per_line_; }
  __device__ uint32_t offset_of(uint64_t i) const {
    return static_cast<uint32_t>(i % per_line_ * sizeof(T));
  }

  __device__ T read(uint64_t i) const {
    uint32_t unused = 0;
    return read(i, &unused);
  }
  // read(i), adding to *lookups the line acquisitions this lane made: one per coalesced group,
  // made by its leader. A kernel's lookups against the cache's misses give its hit rate.
  __device__ T read(uint64_t i, uint32_t* lookups) const {
    Group g;
    const uint8_t* d = warp_acquire(c_, line_of(i), &g);
    if (static_cast<int>(threadIdx.x % 32) == g.leader) ++*lookups;
    T v{};
    if (d != nullptr) std::memcpy(&v, d + offset_of(i), sizeof(T));
    warp_release(c_, g, false);
    return v;
  }
  __device__ T operator[](uint64_t i) const { return read(i); }

  __device__ void write(uint64_t i, const T& v) const {
    Group g;
    uint8_t* d = warp_acquire(c_, line_of(i), &g);
    if (d != nullptr) std::memcpy(d + offset_of(i), &v, sizeof(T));
    warp_release(c_, g, d != nullptr);
  }

  // Without coalescing: every lane acquires its own reference (the ablation of BaM Fig 7.2).
  __device__ T read_uncoalesced(uint64_t i) const {
    const uint32_t line = acquire_line_wait(c_, line_of(i), 1);
    T v{};
    if (line == kNoLine) return v;
    std::memcpy(&v, c_.data + uint64_t{line} * c_.line_bytes + offset_of(i), sizeof(T));
    release_line(c_, line, 1, false);
    return v;
  }

  const CacheView& cache() const { return c_; }

 private:
  template <typename U>
  friend class array_ref;
  CacheView c_;
  uint64_t n_ = 0;
  uint64_t first_ = 0;
  uint64_t per_line_ = 1;
};

template <typename T>
class array_ref {
 public:
  __device__ explicit array_ref(const array<T>& a) : a_(a) {}
  __device__ ~array_ref() { reset(); }
  array_ref(const array_ref&) = delete;
  array_ref& operator=(const array_ref&) = delete;

  __device__ T read(uint64_t i) {
    uint32_t unused = 0;
    return read(i, &unused);
  }
  // read(i), adding to *lookups the line acquisitions this lane made (as array<T>::read).
  __device__ T read(uint64_t i, uint32_t* lookups) {
    const uint8_t* d = get(a_.line_of(i), lookups);
    T v{};
    if (d != nullptr) std::memcpy(&v, d + a_.offset_of(i), sizeof(T));
    return v;
  }
  __device__ void write(uint64_t i, const T& v) {
    uint32_t unused = 0;
    uint8_t* d = get(a_.line_of(i), &unused);
    if (d == nullptr) return;
    std::memcpy(d + a_.offset_of(i), &v, sizeof(T));
    wrote_ = true;
  }
  // Whether element i lies in the line this lane holds (reading it acquires nothing). A warp
  // that must never hold a line while one of its lanes acquires another (a small cache could
  // have every way of a set held by waiting lanes) resets all its cursors when any lane would
  // leave its line: if (!__all_sync(mask, r.holds(i))) r.reset();
  __device__ bool holds(uint64_t i) const { return a_.line_of(i) == block_; }
  // Releases the held line; the lanes releasing the same line together do it with one atomic.
  __device__ void reset() {
    cursor_release(a_.c_, line_, wrote_);
    line_ = kNoLine;
    block_ = ~0ull;
    wrote_ = false;
  }

 private:
  __device__ uint8_t* get(uint64_t block, uint32_t* lookups) {
    if (block != block_) {
      reset();  // hold nothing while acquiring (no waiting while holding: cache.cuh, "full")
      line_ = cursor_acquire(a_.c_, block, lookups);  // each lane now holds one reference
      block_ = line_ == kNoLine ? ~0ull : block;
      if (line_ == kNoLine) return nullptr;
    }
    return a_.c_.data + uint64_t{line_} * a_.c_.line_bytes;
  }

  const array<T>& a_;
  uint64_t block_ = ~0ull;
  uint32_t line_ = kNoLine;
  bool wrote_ = false;
};

}  // namespace warpfs::gpu
