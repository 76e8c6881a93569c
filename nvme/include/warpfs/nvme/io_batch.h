// IoBatch: the CPU form of a warp's asynchronous I/O (BaM Ch. 7; DESIGN.md "A CPU warp").
// One thread submits up to 32 commands, which may land on different virtual queues, and then
// waits for all of them together, so a single thread keeps 32 commands in flight. While a
// submission waits for a queue slot it polls the batch's earlier commands: their completions
// are what frees the slots (a thread must never wait on itself).
//
// Thread-safety: an IoBatch is used by one thread at a time; different batches run
// concurrently. A batch may pass to another thread between calls (NamespaceIo::Started, whose
// commands the thread that answers the request sees through) where a lock or a queue orders
// the two threads' uses.
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
    for (;;) {
      note_progress();
      if (finished()) break;
      if (poll_once()) {
        b.reset();
        continue;
      }
      idle(b);
    }
    int failed = 0;
    for (int i = 0; i < n_; ++i) failed += status_ok(e_[i].ticket.status) ? 0 : 1;
    return failed;
  }

  // Polls every unfinished command once; true if any finished (wait_all in steps).
  bool poll() {
    const bool progress = poll_once();
    note_progress();
    return progress;
  }
  // Whether every submitted command's completion has been seen.
  bool finished() const { return done_count() == n_; }
  // One wait of wait_all, after a poll that found nothing: sleeps on the interrupt of a
  // command whose completion has not been seen (on a keyed line, on that command's own key:
  // every command must complete, so waiting for any one of them loses nothing), or backs off.
  // Bounded (sleep_on_irq). `b` is the caller's, reset by it on progress; a caller with other
  // work to do sleeps at once (Backoff::block_now).
  void idle(port::Backoff& b) {
    const Entry* waiting = first_waiting();
    InterruptLine* irq = waiting != nullptr ? waiting->route.vq->view().irq : nullptr;
    if (irq != nullptr && irq->learns() && since_ == 0) {
      waited_ = irq;
      since_ = port::now_ns();
      done_at_since_ = done_count();
    }
    if (irq != nullptr && irq->sleep_now(b)) {
      waiting->route.vq->sleep_on_irq(waiting->ticket, [this] { return poll_once(); });
    } else if (irq != nullptr) {
      irq->back_off(b);
    } else {
      b.pause();
    }
  }

  uint16_t status(int i) const { return e_[i].ticket.status; }
  uint32_t dw0(int i) const { return e_[i].ticket.dw0; }
  // Forgets completed commands so the batch can be reused. REQUIRES: wait_all() returned.
  void clear() {
    WARPFS_DCHECK(done_count() == n_, "IoBatch::clear before wait_all()");
    n_ = 0;
    since_ = 0;
  }

 private:
  struct Entry {
    QueueMapper::Route route;
    Ticket ticket;
    bool accounted = false;
  };

  // How long a wait lasted, for the line's estimate (InterruptLine::note_wait_since): one
  // sample per stretch of waiting, from the first idle() after progress to the next progress,
  // whichever poll found it (a sleep's recheck included). The line is that of the command
  // waited for in vain.
  void note_progress() {
    if (since_ != 0 && done_count() != done_at_since_) {
      waited_->note_wait_since(since_);
      since_ = 0;
    }
  }

  // The first command whose completion has not been seen and whose queue has an interrupt
  // line, or null.
  const Entry* first_waiting() const {
    for (int i = 0; i < n_; ++i) {
      if (!e_[i].ticket.done && e_[i].route.vq->view().irq != nullptr) return &e_[i];
    }
    return nullptr;
  }

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
  InterruptLine* waited_ = nullptr;  // note_progress: the stretch's line, its start (0: none)
  uint64_t since_ = 0;
  int done_at_since_ = 0;
};

}  // namespace warpfs::nvme
