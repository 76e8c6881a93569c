// Which idle workers of a FUSE session loop (fuse_session.h's SessionLoop) wait in the
// kernel for the next request, and which park in user space. No libfuse here, so that the
// tests can include it.
//
// The kernel queues a FUSE daemon's readers of /dev/fuse first come, first served: with every
// idle worker blocked there, each request goes to the worker that has waited longest. Once a
// burst has started many workers, a light load then hands each request to the thread (and
// the CPU) idle for the longest time. On the 16-core device machine (a VM, where an idle vCPU
// halts and takes ~150-200 µs to wake) 4 KiB O_DIRECT reads at QD1 fell from 77-92 K to 5-6 K
// IOPS after one QD32 job, with 16 workers or 64, warpfs and warpfs-null alike (passthrough_ll,
// libfuse's own loop, to 5-46 K); with 2 workers they stayed at 75-82 K, but QD32 then
// stopped at 293-310 K instead of ~380 K.
//
// So the gate parks the readers that the recent load never needed: a worker done with its
// request parks here, instead of reading again, where at least two others read and, all
// through this window and the last (kWindowNs each), at least two readers were left idle
// whenever a request was taken: readers the kernel never had to use. Under any load that
// uses the whole pool now and then, nobody parks (the kernel wakes as many readers as
// requests arrive, and this loop runs as the ungated one did); a fixed limit of two readers
// instead, parking the rest, cut QD32 reads there to 138-198 K from 298-308 K (every extra
// worker had to be woken by another, one after the other), and a limit that followed the
// peak of busy workers parked and woke workers 1,249 times in one 8-second run of four jobs
// on 2 cores (the busy count there stays below the pool while the pool is all in use).
// When the load falls to one request at a time, the workers that finish requests park until
// two read, which alternate, each idle for one request's time, not for the whole pool's
// round. On the 16-core device machine, QD1 reads right after a burst then ran as on a
// fresh mount (60-64 K IOPS, against 40-46 K without the gate), the burst rows unchanged
// (bench/results/reader-gate-16core-20261206.md).
//
// On few CPUs the gate is off (`parks` false: SessionLoop asks park_idle_workers() in
// worker_threads.h): on the 2-core VM, where the load itself keeps both CPUs busy, QD1 reads
// after a burst ran 20-25 % slower with four workers left reading than with all ten (fio, 2 x
// QD32 then QD1, three rounds: 34-42 K against 46-59 K IOPS), and libfuse's loop limited to
// four workers lost the same; fresh mounts were alike.
//
// A parked worker is woken when the last reader takes a request (nobody could take the
// next), the one parked last first (the warmest thread, likely on a running CPU), and two at
// a time (kWake), so a new burst after a quiet spell grows the readers as fast as
// SessionLoop's start of new workers did (one per last reader) and twice as fast again.
//
// Thread-safety: every member function may be called from any number of workers at once.
// readers_ and the low-water words are atomics, each an estimate that may be off by the
// workers in flight between two steps (a reader too many or too few for a moment, never a
// lost wake-up: see done()); parked_ is guarded by mu_.
#pragma once

#include <semaphore.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <vector>

namespace warpfs::daemon {

class ReaderGate {
 public:
  // A worker's place to park: its semaphore is posted once when the gate makes it a reader
  // again.
  struct Parking {
    Parking() { sem_init(&sem, 0, 0); }
    ~Parking() { sem_destroy(&sem); }
    Parking(const Parking&) = delete;
    Parking& operator=(const Parking&) = delete;
    sem_t sem;
  };

  // Readers kept, whatever the load: with two, a load of one request at a time alternates
  // between two warm workers without a wake-up by the gate (with one, the reader taking each
  // request would be the last and wake another).
  static constexpr int kMinReaders = 2;
  // How long the idle readers must have been spare before workers park: one to two
  // windows. Long against the gaps inside a burst (microseconds), short against a change
  // of load a person would time.
  static constexpr uint64_t kWindowNs = 100'000'000;
  // Parked workers woken at once when the last reader takes a request.
  static constexpr unsigned kWake = 2;

  using Clock = uint64_t (*)();
  static uint64_t coarse_now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
  }

  // `parks` false: no worker ever parks (every idle worker reads, as in libfuse's loop).
  explicit ReaderGate(bool parks = true, Clock now = &coarse_now_ns)
      : parks_(parks), now_(now), window_end_(now() + kWindowNs) {}

  // A worker about to start counts as a reader (it reads first); one that could not start,
  // or that ends, no longer does.
  void add_reader() { readers_.fetch_add(1, std::memory_order_seq_cst); }
  void remove_reader() { readers_.fetch_sub(1, std::memory_order_seq_cst); }

  // A reader took a request. Where it was the last reader, the workers parked last (up to
  // kWake) are readers now: they are returned in `wake` (the caller wakes them: wake()) and
  // their number; with none parked, *start = true (the caller starts a worker if it may,
  // add_reader() first). Otherwise 0 and *start false.
  unsigned took(Parking* wake[kWake], bool* start) {
    *start = false;
    const int left = readers_.fetch_sub(1, std::memory_order_seq_cst) - 1;
    if (!parks_) {  // nobody is ever parked, and the low-water marks are never asked
      *start = left <= 0;
      return 0;
    }
    observe(left);
    if (left > 0) return 0;
    std::lock_guard<std::mutex> g(mu_);
    unsigned n = 0;
    while (n < kWake && !parked_.empty()) {
      wake[n++] = parked_.back();
      parked_.pop_back();
    }
    if (n == 0) *start = true;
    readers_.fetch_add(static_cast<int>(n), std::memory_order_seq_cst);
    return n;
  }

  // A worker done with its request. true: it is a reader again; false: it is parked in
  // `self` and must wait() there before it reads. It parks only where, under mu_, it sees at
  // least kMinReaders readers. A reader count can reach 0 only by a took() that then takes
  // mu_: if that took() holds mu_ first, this worker sees fewer than kMinReaders readers
  // under mu_ and reads; otherwise it is in parked_ when that took() looks.
  bool done(Parking* self) {
    if (parks_ && spare() >= kMinReaders) {
      std::lock_guard<std::mutex> g(mu_);
      if (readers_.load(std::memory_order_seq_cst) >= kMinReaders) {
        parked_.push_back(self);
        return false;
      }
    }
    readers_.fetch_add(1, std::memory_order_seq_cst);
    return true;
  }

  static void wake(Parking* p) { sem_post(&p->sem); }
  // Waits until woken. sem_wait is a cancellation point: a worker cancelled here (the loop's
  // end) is still in parked_, which is not used after that.
  static void wait(Parking* p) {
    while (sem_wait(&p->sem) != 0 && errno == EINTR) {
    }
  }

  // The fewest readers left idle when a request was taken, in this window and the last: the
  // readers the load did not need.
  int spare() const {
    return std::min(low_.load(std::memory_order_relaxed),
                    last_low_.load(std::memory_order_relaxed));
  }
  int readers() const { return readers_.load(std::memory_order_relaxed); }
  size_t parked() const {
    std::lock_guard<std::mutex> g(mu_);
    return parked_.size();
  }

 private:
  // Counts `left` idle readers into this window's low-water mark, first closing the window if
  // its time is up. A whole window that passed without a request had all the readers there
  // are now idle throughout.
  void observe(int left) {
    const uint64_t t = now_();
    uint64_t end = window_end_.load(std::memory_order_relaxed);
    if (t >= end &&
        window_end_.compare_exchange_strong(end, t + kWindowNs, std::memory_order_relaxed)) {
      const int closed = low_.exchange(left, std::memory_order_relaxed);
      last_low_.store(t - end >= kWindowNs ? left + 1 : closed, std::memory_order_relaxed);
      return;
    }
    int low = low_.load(std::memory_order_relaxed);
    while (left < low && !low_.compare_exchange_weak(low, left, std::memory_order_relaxed)) {
    }
  }

  const bool parks_;
  const Clock now_;
  std::atomic<int> readers_{0};       // workers reading, or about to read, /dev/fuse
  std::atomic<int> low_{0};           // the fewest readers left idle by a request in this window
  std::atomic<int> last_low_{0};      // ... in the window before (0 at first: nobody parks)
  std::atomic<uint64_t> window_end_;  // when this window closes (now_'s clock)
  mutable std::mutex mu_;
  std::vector<Parking*> parked_;  // mu_: parked workers, the last parked at the back
};

}  // namespace warpfs::daemon
