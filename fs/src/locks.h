// The filesystem core's locks, which know their owner in debug-check builds, so that a
// `REQUIRES: namespace_mu_` or `REQUIRES: rw exclusive` is checked where it is stated:
//
//   WARPFS_DCHECK(held_by_me(namespace_mu_), "namespace_mu_");
//
// With WARPFS_DEBUG_CHECKS on, Mutex and SharedMutex wrap std::mutex and std::shared_mutex
// and record who holds them: the exclusive owner in the lock itself, shared holds in a
// per-thread list (a thread holds a handful of locks at most). With checks off they are
// std::mutex and std::shared_mutex themselves, and the held_*() queries are never evaluated
// (WARPFS_DCHECK does not evaluate its condition): no cost at all.
//
// SharedMutex also says whether a thread waits to take it exclusive (writer_waiting), so
// that a path that could take it shared may queue behind that thread instead: glibc's
// rwlock lets readers in while a writer waits, and shared holders that keep coming (the
// overwrite fast path at a high queue depth) would starve a truncate or an fsync.
//
// SharedMutex also takes shared holds that outlive the thread that took them
// (DetachedHolds): an asynchronous read of a file (FsImpl::read_start) keeps the file's
// blocks from a truncate, a punch or any other change of its mapping until its data is in,
// and it is another thread that sees the data in. lock() and try_lock() wait for, or refuse
// over, every such hold.
//
// The queries answer for the calling thread only: true means this thread holds the lock;
// false says nothing about other threads. Thread-safety: as std::mutex / std::shared_mutex.
#pragma once

#include <algorithm>
#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "warpfs/nvme/check.h"

namespace warpfs::fs {

// Shared holds of a SharedMutex that any thread may release. A hold is taken while the lock
// is held (shared, or exclusive), so the exclusive holder that has seen none left sees no new
// one until it unlocks: lock() takes the mutex, then waits for the holds to go (drain);
// try_lock() fails while one is left. Thread-safety: atomics. The last release wakes a
// drainer: it decrements, then reads drainers_; the drainer increments drainers_, then reads
// the count; both sequentially consistent, so one of them sees the other (no lost wake-up).
class DetachedHolds {
 public:
  // REQUIRES: the calling thread holds the lock, shared or exclusive.
  void hold_detached() { holds_.fetch_add(1, std::memory_order_relaxed); }
  // Any thread. What the holder did before (its reads of the blocks) happens before the
  // drained lock() returns.
  void release_detached() {
    if (holds_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        drainers_.load(std::memory_order_seq_cst) != 0) {
      holds_.notify_all();
    }
  }

 protected:
  bool drained() const { return holds_.load(std::memory_order_acquire) == 0; }
  // REQUIRES: the mutex held exclusive (no hold can come meanwhile).
  void drain() {
    if (drained()) return;
    drainers_.fetch_add(1, std::memory_order_seq_cst);
    for (uint32_t v; (v = holds_.load(std::memory_order_seq_cst)) != 0;) {
      holds_.wait(v, std::memory_order_acquire);
    }
    drainers_.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint32_t> holds_{0};
  std::atomic<uint32_t> drainers_{0};  // threads in drain()
};

#if WARPFS_DEBUG_CHECKS

// The exclusive side of either lock, with its owner. The owner is written only by the thread
// that holds the lock and read for comparison with the reader's own id: relaxed suffices, a
// thread always sees its own latest store.
template <typename M>
class OwnedLock {
 public:
  void lock() {
    mu_.lock();
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  bool try_lock() {
    if (!mu_.try_lock()) return false;
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    return true;
  }
  void unlock() {
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    mu_.unlock();
  }
  bool held_exclusive_by_me() const {
    return owner_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }

 protected:
  M mu_;

 private:
  std::atomic<std::thread::id> owner_{};
};

class Mutex : public OwnedLock<std::mutex> {
 public:
  bool held_by_me() const { return held_exclusive_by_me(); }
};

class SharedMutex : public OwnedLock<std::shared_mutex>, public DetachedHolds {
 public:
  void lock() {
    waiting_.fetch_add(1, std::memory_order_relaxed);
    OwnedLock::lock();
    drain();
    waiting_.fetch_sub(1, std::memory_order_relaxed);
  }
  bool try_lock() {
    if (!OwnedLock::try_lock()) return false;
    if (drained()) return true;
    OwnedLock::unlock();
    return false;
  }
  bool writer_waiting() const { return waiting_.load(std::memory_order_relaxed) != 0; }
  void lock_shared() {
    mu_.lock_shared();
    shared_held().push_back(this);
  }
  bool try_lock_shared() {
    if (!mu_.try_lock_shared()) return false;
    shared_held().push_back(this);
    return true;
  }
  void unlock_shared() {
    auto& v = shared_held();
    auto it = std::find(v.begin(), v.end(), this);
    WARPFS_DCHECK(it != v.end(), "unlock_shared by a thread that holds no shared lock");
    v.erase(it);
    mu_.unlock_shared();
  }
  bool held_by_me() const {
    const auto& v = shared_held();
    return held_exclusive_by_me() || std::find(v.begin(), v.end(), this) != v.end();
  }

 private:
  std::atomic<uint32_t> waiting_{0};  // threads in lock() (writer_waiting)
  // The shared locks this thread holds, one entry per hold.
  static std::vector<const SharedMutex*>& shared_held() {
    static thread_local std::vector<const SharedMutex*> held;
    return held;
  }
};

inline bool held_by_me(const Mutex& m) {
  return m.held_by_me();
}
inline bool held_by_me(const SharedMutex& m) {
  return m.held_by_me();
}
inline bool held_exclusive_by_me(const SharedMutex& m) {
  return m.held_exclusive_by_me();
}

#else

using Mutex = std::mutex;
class SharedMutex : public DetachedHolds {
 public:
  void lock() {
    waiting_.fetch_add(1, std::memory_order_relaxed);
    mu_.lock();
    drain();
    waiting_.fetch_sub(1, std::memory_order_relaxed);
  }
  bool try_lock() {
    if (!mu_.try_lock()) return false;
    if (drained()) return true;
    mu_.unlock();
    return false;
  }
  void unlock() { mu_.unlock(); }
  void lock_shared() { mu_.lock_shared(); }
  bool try_lock_shared() { return mu_.try_lock_shared(); }
  void unlock_shared() { mu_.unlock_shared(); }
  bool writer_waiting() const { return waiting_.load(std::memory_order_relaxed) != 0; }

 private:
  std::shared_mutex mu_;
  std::atomic<uint32_t> waiting_{0};  // threads in lock() (writer_waiting)
};
// Only ever named inside WARPFS_DCHECK, which does not evaluate them with checks off.
bool held_by_me(const Mutex& m);
bool held_by_me(const SharedMutex& m);
bool held_exclusive_by_me(const SharedMutex& m);

#endif

}  // namespace warpfs::fs
