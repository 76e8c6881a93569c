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

class SharedMutex : public OwnedLock<std::shared_mutex> {
 public:
  void lock() {
    waiting_.fetch_add(1, std::memory_order_relaxed);
    OwnedLock::lock();
    waiting_.fetch_sub(1, std::memory_order_relaxed);
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
class SharedMutex {
 public:
  void lock() {
    waiting_.fetch_add(1, std::memory_order_relaxed);
    mu_.lock();
    waiting_.fetch_sub(1, std::memory_order_relaxed);
  }
  bool try_lock() { return mu_.try_lock(); }
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
