// The FUSE daemon's reads that outlive their handlers (Filesystem::read_start, -o
// async_reads): a handler starts the device's reads and returns to take the next request,
// and reaper threads poll the reads in flight and answer each as it ends. So no worker waits
// out the device's latency for one request, and the workers no longer bound the reads in
// flight. The handler still answers a read itself when it has ended by the time the handler
// looks (a cached range, a hole, a device that completes in the submitting thread), and waits
// for it itself when no other read is in flight (a reader at QD1: one wake-up where a hand-off
// costs two). BaM Ch. 7's shape on the CPU: a warp issues its requests and goes on; their
// completions are reaped apart.
//
// Each reaper has reads of its own (added in turn), polls them oldest first and, when a round
// finds nothing ended, sleeps on the oldest one's completion (its interrupt line, bounded:
// Item::idle), which on a device with one latency for every command is the next to end. No
// libfuse here (the daemon's Item answers through it), so that the tests can include it.
//
// Measured (bench/results/async-reads-20261206.md): with an 80 µs device on the 16-core
// device machine, QD32 4 KiB O_DIRECT reads ran 1.03-1.07x with 4 reapers against none, QD1
// and 4 x QD8 at par, and at par with no latency; on the 2-core VM 0.67-1.09x, which is why
// the default there is none (worker_threads.h: default_read_reapers).
//
// Thread-safety: add() from any number of threads; start() and stop() from one (the daemon's
// main thread). Items pass from the adding thread to a reaper's under its lane's mutex.
#pragma once

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "warpfs/nvme/port.h"

namespace warpfs::daemon {

class ReadReaper {
 public:
  // One request whose reads are in flight.
  class Item {
   public:
    virtual ~Item() = default;
    // True once its reads have ended.
    virtual bool poll() = 0;
    // Sleeps (bounded) or backs off until its reads may have ended (after a poll() that said
    // no); `b` is the reaper's, reset on progress.
    virtual void idle(port::Backoff& b) = 0;
    // Answers the request, on a reaper's thread, once poll() has returned true; the item is
    // destroyed right after.
    virtual void answer() = 0;
  };

  ReadReaper() = default;
  ReadReaper(const ReadReaper&) = delete;
  ReadReaper& operator=(const ReadReaper&) = delete;
  ~ReadReaper() { stop(); }

  // Starts `threads` reapers (at least 1), each with reads of its own: an answer costs a
  // write to /dev/fuse that wakes the reader, several microseconds, and one thread answering
  // for a whole machine became the limit (16 CPUs: 130 K reads/s at QD32 against 230 K with
  // every worker waiting for its own read).
  void start(unsigned threads) {
    lanes_.resize(std::max(threads, 1u));
    for (size_t i = 0; i < lanes_.size(); ++i) {
      lanes_[i] = std::make_unique<Lane>();
      lanes_[i]->thread = std::thread([this, i] {
        pthread_setname_np(pthread_self(), "warpfs-reaper");
        run(*lanes_[i]);
      });
    }
  }
  unsigned threads() const { return static_cast<unsigned>(lanes_.size()); }
  // Hands `item` to a reaper, each in turn. REQUIRES: start() was called and stop() was not.
  // REQUIRES: the item's read was counted by enter(); the reaper answers it, then counts it
  // out.
  void add(std::unique_ptr<Item> item) {
    Lane& l = *lanes_[next_.fetch_add(1, std::memory_order_relaxed) % lanes_.size()];
    bool wake = false;
    {
      std::lock_guard<std::mutex> g(l.mu);
      l.incoming.push_back(std::move(item));
      wake = l.asleep;
      l.asleep = false;  // one wake-up is enough
    }
    if (wake) l.cv.notify_one();
  }
  // Answers every item added, then ends the threads. Idempotent.
  void stop() {
    for (auto& l : lanes_) {
      {
        std::lock_guard<std::mutex> g(l->mu);
        l->stopping = true;
      }
      l->cv.notify_one();
    }
    for (auto& l : lanes_) {
      if (l->thread.joinable()) l->thread.join();
    }
  }
  // Requests answered by the reapers since start (relaxed: the live view's counter).
  uint64_t answered() const { return answered_.load(std::memory_order_relaxed); }
  // A handler counts its read in before starting it; returns how many reads were in flight
  // before it (started, not yet answered: by a reaper or by their handlers). With none, the
  // handler waits for its own read itself (a reader at QD1: one wake-up, where a hand-off
  // costs the reaper's and then the reader's). A hint: relaxed, like every count here.
  uint64_t enter() { return in_flight_.fetch_add(1, std::memory_order_relaxed); }
  // A handler that answered its read itself counts it out.
  void leave() { in_flight_.fetch_sub(1, std::memory_order_relaxed); }
  // Reads counted in and not yet out.
  uint64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

 private:
  struct Lane {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::unique_ptr<Item>> incoming;  // mu: added, not yet taken by the reaper
    bool asleep = false;                          // mu: the reaper waits on cv for work
    bool stopping = false;                        // mu
    std::thread thread;                           // start() and stop() only
  };

  void run(Lane& l) {
    std::vector<std::unique_ptr<Item>> active;  // the reaper's own, oldest first
    port::Backoff b;
    for (;;) {
      {
        std::unique_lock<std::mutex> g(l.mu);
        if (active.empty()) {
          l.asleep = l.incoming.empty();
          l.cv.wait(g, [&l] { return !l.incoming.empty() || l.stopping; });
          l.asleep = false;
          if (l.incoming.empty()) return;  // stopping, and nothing left
        }
        for (auto& i : l.incoming) active.push_back(std::move(i));
        l.incoming.clear();
      }
      // Every read each round: a completion that nobody marks holds back its queue's head,
      // and with it every submitter waiting for a slot of that queue (virtual_queue.h).
      size_t kept = 0;
      for (size_t i = 0; i < active.size(); ++i) {
        if (active[i]->poll()) {
          active[i]->answer();
          active[i].reset();
          answered_.fetch_add(1, std::memory_order_relaxed);
          in_flight_.fetch_sub(1, std::memory_order_relaxed);
        } else {
          active[kept++] = std::move(active[i]);
        }
      }
      const bool progress = kept < active.size();
      active.resize(kept);
      if (progress) {
        b.reset();
      } else if (!active.empty()) {
        b.block_now();  // no spinning: the CPU is for the workers meanwhile
        active.front()->idle(b);
      }
    }
  }

  // Set up by start() before any add(), read-only until stop() (whose joins end the threads).
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::atomic<uint64_t> next_{0};  // the lane of the next add()
  std::atomic<uint64_t> answered_{0};
  std::atomic<uint64_t> in_flight_{0};  // enter()ed, not yet answered
};

}  // namespace warpfs::daemon
