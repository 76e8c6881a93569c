// IoBatch: the CPU form of a warp's asynchronous I/O (BaM Ch. 7; DESIGN.md "A CPU warp").
// One thread submits up to 32 commands, which may land on different virtual queues, and then
// waits for all of them together, so a single thread keeps 32 commands in flight. While a
// submission waits for a queue slot it polls the batch's earlier commands: their completions
// are what frees the slots (a thread must never wait on itself).
//
// Thread-safety: an IoBatch belongs to one thread; different batches run concurrently.
#pragma once

#include <cstdint>

#include "warpfs/nvme/check.h"
#include "warpfs/nvme/queue_mapper.h"

namespace warpfs::nvme {

class IoBatch {
 public:
  static constexpr int kWidth = 32;

  explicit IoBatch(QueueMapper& mapper) : m_(mapper) {}
  IoBatch(const IoBatch&) = delete;
  IoBatch& operator=(const IoBatch&) = delete;
  ~IoBatch() { wait_all(); }  // a submitted command must be seen through

  int size() const { return n_; }
  bool full() const { return n_ == kWidth; }

  // Submits `cmd` now. REQUIRES: !full(). Returns its index in the batch.
  int submit(const SubmissionEntry& cmd, Priority p) {
    WARPFS_DCHECK(!full(), "IoBatch::submit on a full batch");
    Entry& e = e_[n_];
    e.accounted = false;  // the slot may hold a command from before clear()
    e.route = m_.route(p);
    e.route.vq->submit(cmd, &e.ticket, [this] { poll_once(); });
    return n_++;
  }

  // Waits until every submitted command has completed. Returns how many failed.
  int wait_all() {
    port::Backoff b;
    // One sample per stretch of waiting: from a poll that found nothing (since) to the
    // next progress, whichever poll found it (the sleep's recheck included). The line is
    // that of the command waited for in vain.
    InterruptLine* waited = nullptr;
    uint64_t since = 0;
    int done_at_since = 0;
    for (;;) {
      const int done = done_count();
      if (since != 0 && done != done_at_since) {
        waited->note_wait_since(since);
        since = 0;
      }
      if (done >= n_) break;
      if (poll_once()) {
        b.reset();
        continue;
      }
      // Sleep on the interrupt of a command whose completion has not been seen: on a keyed
      // line, on that command's own key (every command must complete, so waiting for any
      // one of them loses nothing).
      const Entry* waiting = nullptr;
      for (int i = 0; i < n_ && waiting == nullptr; ++i) {
        const Entry& e = e_[i];
        if (!e.ticket.done && e.route.vq->view().irq != nullptr) {
          waiting = &e;
        }
      }
      InterruptLine* irq = waiting != nullptr ? waiting->route.vq->view().irq : nullptr;
      if (irq != nullptr && irq->learns()) {
        waited = irq;
        if (since == 0) {
          since = port::now_ns();
          done_at_since = done;
        }
      }
      if (irq != nullptr && irq->sleep_now(b)) {
        waiting->route.vq->sleep_on_irq(waiting->ticket, [this] { return poll_once(); });
      } else if (irq != nullptr) {
        irq->back_off(b);
      } else {
        b.pause();
      }
    }
    int failed = 0;
    for (int i = 0; i < n_; ++i) failed += status_ok(e_[i].ticket.status) ? 0 : 1;
    return failed;
  }

  uint16_t status(int i) const { return e_[i].ticket.status; }
  uint32_t dw0(int i) const { return e_[i].ticket.dw0; }
  // Forgets completed commands so the batch can be reused. REQUIRES: wait_all() returned.
  void clear() {
    WARPFS_DCHECK(done_count() == n_, "IoBatch::clear before wait_all()");
    n_ = 0;
  }

 private:
  struct Entry {
    QueueMapper::Route route;
    Ticket ticket;
    bool accounted = false;
  };

  int done_count() const {
    int d = 0;
    for (int i = 0; i < n_; ++i) d += e_[i].accounted ? 1 : 0;
    return d;
  }

  // Polls every unfinished command once; true if any finished.
  bool poll_once() {
    bool progress = false;
    for (int i = 0; i < n_; ++i) {
      Entry& e = e_[i];
      if (e.accounted) continue;
      if (e.route.vq->poll(&e.ticket)) {
        e.accounted = true;
        m_.complete(e.route);
        progress = true;
      }
    }
    return progress;
  }

  QueueMapper& m_;
  Entry e_[kWidth];
  int n_ = 0;
};

}  // namespace warpfs::nvme
