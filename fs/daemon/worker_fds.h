// Which /dev/fuse descriptor a FUSE reply goes to, when SessionLoop's workers (fuse_session.h)
// each read requests from a descriptor of their own. No libfuse here, so that the tests can
// include it.
//
// Why a descriptor each. The kernel keeps the requests a daemon has read, and waits for the
// replies to, on the descriptor they were read from (its "processing queue", struct
// fuse_pqueue), under one spinlock per descriptor: every read of a request takes it to file
// the request there, every reply takes it twice to find and retire its request. With all
// workers on the session's one descriptor that lock is shared by all of them: on the 16-core
// device machine, 4 KiB O_DIRECT I/O at QD32 spent 30-40 % of all CPU time spinning for it
// (__pv_queued_spin_lock_slowpath under fuse_dev_do_read and fuse_dev_do_write), warpfs and
// warpfs-null alike, and warpfs used 33-35 µs of CPU a request against passthrough_ll's 9.
// A descriptor cloned from the session's (FUSE_DEV_IOC_CLONE) has a processing queue of its
// own; the input queue, where requests wait to be read, stays shared.
//
// The catch: a reply must go to the descriptor its request was read from (the kernel looks
// for the request in that descriptor's queue alone, else answers ENOENT). libfuse 3.14 sends
// every reply through the session's descriptor, or through the custom I/O hooks
// (fuse_session_custom_io), which get the session's descriptor and the reply's bytes, and
// does not export its per-channel calls. So the hooks route: the read hook reads from the
// calling worker's own descriptor and notes which descriptor each request (by its `unique`)
// came from; the writev hook looks the reply's `unique` up and writes there. A reply from
// another thread (a read reaper's, fs/daemon/read_reaper.h) finds its descriptor the same way.
//
// The note is a table of kSlots slots indexed by a hash of `unique`, each slot the last request
// noted there; a request still unanswered after kSlots later ones (a lock waiter, a read of a
// slow device) may have lost its slot. Where the lookup misses, or names a descriptor the
// kernel answers ENOENT on, the reply goes to the session's descriptor and then to each
// worker's in turn until one takes it (ENOENT from all: the request is gone, as when the
// kernel ended it for an interrupt or an abort). So a stale slot costs a few more writes,
// never a lost reply.
//
// Thread safety: note() and find() from any thread at once: a slot is two relaxed-or-release
// atomics, and a torn read of one (a descriptor from one request with the unique of another)
// is caught by the ENOENT fallback above. The list of descriptors (for that fallback) is
// guarded by mu_. The descriptors are never closed: they go with the process (one session
// a process), since a reply in flight on a reaper's thread could otherwise write to a
// descriptor number that a later open had reused.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

namespace warpfs::daemon {

class WorkerFds {
 public:
  static constexpr int kBits = 12;
  static constexpr uint32_t kSlots = 1u << kBits;

  // The slot of `unique`. Fibonacci hashing: FUSE's uniques step by 2 (or more), and the top
  // bits of the product spread any such stride over the table.
  static uint32_t index(uint64_t unique) {
    return static_cast<uint32_t>((unique * 0x9e3779b97f4a7c15ull) >> (64 - kBits));
  }

  // The request `unique` was read from descriptor `fd`.
  void note(uint64_t unique, int fd) {
    Slot& s = slot(unique);
    s.fd.store(fd, std::memory_order_relaxed);
    s.unique.store(unique, std::memory_order_release);
  }
  // The descriptor `unique` was read from, or -1 where the table no longer knows.
  // The acquire pairs with note()'s release: the descriptor read is at least the one noted
  // with `unique`, or a later request's whose note into this slot has begun (the torn case
  // the reply's fallback covers).
  int find(uint64_t unique) const {
    const Slot& s = slot(unique);
    if (s.unique.load(std::memory_order_acquire) != unique) return -1;
    return s.fd.load(std::memory_order_relaxed);
  }
  // A worker's descriptor, for the fallback.
  void add(int fd) {
    std::lock_guard<std::mutex> g(mu_);
    fds_.push_back(fd);
  }
  // Workers with a descriptor of their own.
  size_t size() const {
    std::lock_guard<std::mutex> g(mu_);
    return fds_.size();
  }
  // Replies the table sent to a descriptor that did not have their request, and that then
  // went to another (the fallback above). Relaxed: a statistic.
  std::atomic<uint64_t> rerouted{0};

  // Calls f(fd) for each worker's descriptor in turn, until f returns true; whether one did.
  // Under the lock (the fallback's rare path: no allocation there, and a worker starting
  // meanwhile waits for it).
  template <class F>
  bool any(F f) const {
    std::lock_guard<std::mutex> g(mu_);
    for (const int fd : fds_) {
      if (f(fd)) return true;
    }
    return false;
  }

 private:
  struct alignas(16) Slot {
    std::atomic<uint64_t> unique{0};
    std::atomic<int> fd{-1};
  };

  Slot& slot(uint64_t unique) { return slots_[index(unique)]; }
  const Slot& slot(uint64_t unique) const { return slots_[index(unique)]; }

  Slot slots_[kSlots];
  mutable std::mutex mu_;  // leaf: fds_
  std::vector<int> fds_;
};

}  // namespace warpfs::daemon
