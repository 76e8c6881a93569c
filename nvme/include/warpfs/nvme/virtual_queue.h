// VirtualQueue: BaM's lock-light protocol for many threads sharing one NVMe queue pair
// (BaM dissertation Ch. 5; GPU4FS thesis §4.1.1).
//
// The protocol, and why each step is ordered as it is:
//
//  Enqueue. A thread takes `ticket = fetch_add(ticket_)`; `pos = ticket % size` names its SQ
//  slot and `turn = ticket / size` its place among the threads that will use that slot
//  (BaM Fig 5.2). It waits (acquire) until turn_[pos] == turn, i.e. the device has consumed
//  the slot's previous command, then waits for its command id (below), copies the command in,
//  and publishes it by storing tail_mark_[pos] = ticket + 1 (release). Threads then race
//  for tail_lock_ with try_lock; the winner walks forward from sq_tail_ over consecutive
//  published slots (acquire), stopping at a gap or when the SQ would hold size - 1 entries,
//  and rings the doorbell once for the whole run (BaM §5.2: doorbell coalescing). A thread
//  leaves when sq_tail_ > its ticket, retrying the lock otherwise (BaM: "even if the thread
//  had previously obtained the lock").
//
//  Completion. Without locks, a thread scans the CQ from cq_head_ for an entry whose phase
//  tag is the one expected at that virtual position (phase 1 on even passes, Base §4.6) and
//  whose CID is its own; an entry with the wrong phase is the device's tail (BaM §5.3). It
//  records the status and publishes head_mark_[slot] = cq_position + 1. The winner of
//  head_lock_ walks cq_head_ over consecutive published entries, reads the SQ Head Pointer
//  of the last one and moves sq_head_ there, incrementing turn_ for every SQ slot passed
//  (BaM §5.4: SQ slots reclaimed from the CQE's SQ head), then rings the CQ head doorbell.
//  The holder also releases the CIDs of the entries it consumed, after moving cq_head_, so
//  the next owner of a CID scans from past the stale entry and cannot match it (BaM §5.3).
//  A thread finishes as soon as it has published its entry and tried the head lock once
//  (drain_head): it does not wait for the head to pass its entry. An entry whose owner lost
//  that race is consumed by the holder, which looks at the head's mark again after unlocking
//  (the hand-off in drain_head). Waiting for the head, as BaM's threads do, made every thread
//  wait for the owners of all earlier entries; with more threads than cores, an owner that is
//  descheduled holds up everyone behind it (on 2 cores, QD32 reads through FUSE spent more
//  time in sched_yield than in the device).
//
//  Command ids. cid = ticket % ncid with ncid = size - 1, handed out in ticket order through
//  cid_turn_ (a FIFO per id, like turn_). Holding a CID from submission until the CQ head
//  passes its completion bounds the commands in flight to size - 1, so the CQ (size entries)
//  can never overflow, and no CAS retry loop over a CID lock array is needed (GPU4FS §4.1.1
//  notes CIDs can be derived when the queue is small; this is that, made safe for any size).
//
//  Markers as tags, not bits. BaM stores one bit per slot and then needs two fixes for the
//  races that bits allow: a second turn increment per command (§5.4) and a lock per CQ entry
//  (§5.3; thesis §4.1.1 "The CQ locks prevent a potential race"). Both races come from a
//  descheduled thread seeing a *later* pass's bit on its slot. Here each marker holds the
//  virtual position + 1 of the entry it publishes and every wait compares monotonic 64-bit
//  virtual positions (sq_tail_ > ticket, cq_head_ > cq_position), so a later pass can never
//  be mistaken for one's own: one turn increment per pass and no per-entry CQ lock suffice.
//
//  Recovery. A queue is running, resetting or dead (state_). When the driver gives up on the
//  device (a command timed out, CSTS.CFS; IoEngine's watchdog), it sets resetting: every wait
//  in submit() and poll() sees it and finishes its command with Host Aborted Command (a
//  completion already found keeps its status: that command ran). inside_ counts commands
//  between submit() and the poll() that finishes them, so once it reads zero nobody touches
//  the queue; the driver resets the controller, re-creates the queue pair on the same memory,
//  resets the protocol state and sets running again. Submitters arriving meanwhile wait (and
//  help) until then, or fail at once on a dead queue. The check is a Dekker pair: a submitter
//  increments inside_ then reads state_, the driver writes state_ then reads inside_, both
//  seq_cst, so one of them sees the other.
//
// Every shared atomic sits on its own cache line (port::Padded), locks are FIFO ticket locks,
// waits spin briefly and then back off (port::Backoff) or sleep on the queue's interrupt.
// Sizes are powers of two (the thesis demonstrator's ticket-overflow bug, §4.1.1 / §5).
//
// Thread-safety: submit/poll/execute may be called concurrently from any number of threads.
// A thread that has submitted must keep polling that Ticket until it completes (other
// threads' progress depends on it); the `help` hook of submit() exists so that a thread with
// several commands in flight (IoBatch) can poll them while it waits for a slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "warpfs/nvme/check.h"
#include "warpfs/nvme/port.h"
#include "warpfs/nvme/queue_pair.h"
#include "warpfs/nvme/spec.h"

namespace warpfs::nvme {

// One command's progress through a VirtualQueue.
struct Ticket {
  uint64_t ticket = 0;
  uint16_t cid = 0;
  uint16_t status = 0;  // NVMe status field once found
  uint32_t dw0 = 0;
  uint32_t polls = 0;  // find_completion's misses (the GPU scans only every few)
  bool done = false;
};

class VirtualQueue {
 public:
  enum State : uint32_t { kRunning = 0, kResetting = 1, kDead = 2 };
  // A command the host gave up on: Path Related Status / Host Aborted Command (Base
  // §4.6.1.2.4; what Linux reports for requests cancelled by a controller reset). DNR is clear
  // while the queue is being reset (a retry may succeed) and set once it is dead.
  static constexpr uint16_t kAbortedStatus =
      make_status(sct::kPath, sc::kHostAbortedCommand, false);
  static constexpr uint16_t kDeadStatus = make_status(sct::kPath, sc::kHostAbortedCommand, true);

  // Bytes needed for a queue of `entries` (a power of two), including per-slot arrays.
  WARPFS_HD static size_t footprint(uint32_t entries) {
    // turn_[n], tail_mark_[n], head_mark_[n], cid_turn_[n - 1], one cache line each.
    return sizeof(VirtualQueue) + (4u * entries - 1u) * port::kCacheLine;
  }
  // Lays a queue out in `mem` (footprint() bytes, aligned to port::kCacheLine).
  // REQUIRES: q.entries is a power of two >= 2 and <= 65536; (unchecked) nobody uses `mem`
  // yet.
  static VirtualQueue* init(void* mem, const QueueView& q) {
    WARPFS_DCHECK(port::is_pow2(q.entries) && q.entries >= 2 && q.entries <= 65536,
                  "queue entries: a power of two in 2..65536");
    std::memset(mem, 0, footprint(q.entries));
    auto* vq = new (mem) VirtualQueue();
    vq->q_ = q;
    vq->mask_ = q.entries - 1;
    vq->shift_ = static_cast<uint32_t>(__builtin_ctz(q.entries));
    vq->ncid_ = q.entries - 1;
    return vq;
  }

  const QueueView& view() const { return q_; }
  uint32_t entries() const { return q_.entries; }

  // Commands taken but not yet completed: the outstanding-commands heuristic of the
  // queue mapper (thesis §4.1.2).
  WARPFS_HD uint64_t outstanding() const {
    return ticket_.value.load(port::Order::kRelaxed) - completed_.value.load(port::Order::kRelaxed);
  }
  // The largest number of commands a thread found ahead of it since the last reset.
  WARPFS_HD uint64_t pressure() const { return pressure_.value.load(port::Order::kRelaxed); }
  WARPFS_HD uint64_t take_pressure() { return pressure_.value.exchange(0, port::Order::kRelaxed); }
  // Commands retired (completions consumed) since the last reset: the watchdog's progress.
  WARPFS_HD uint64_t completed() const { return completed_.value.load(port::Order::kRelaxed); }

  // --- recovery (see the class comment) ---------------------------------------------------
  WARPFS_HD State state() const {
    return static_cast<State>(state_.value.load(port::Order::kAcquire));
  }
  // Commands between submit() and the poll() that finished them.
  WARPFS_HD uint64_t inside() const { return inside_.value.load(port::Order::kSeqCst); }
  // Makes every waiter give up (kResetting) or fails the queue for good (kDead).
  void stop(State s) { state_.value.store(s, port::Order::kSeqCst); }
  // Forgets every command. REQUIRES: state() != kRunning, inside() == 0, and (unchecked) the
  // device's queue pair re-created empty on the same memory (CQ zeroed: phase tags start at 1).
  void reset_protocol() {
    WARPFS_DCHECK(state() != kRunning, "reset of a running queue: stop() it first");
    WARPFS_DCHECK(inside() == 0, "reset of a queue with commands inside");
    const uint32_t slots = 4u * q_.entries - 1u;
    for (uint32_t i = 0; i < slots; ++i) turns()[i].value.store(0, port::Order::kRelaxed);
    for (port::Padded<port::Atomic<uint64_t>>* a :
         {&ticket_, &sq_tail_, &sq_head_, &cq_head_, &completed_, &pressure_}) {
      a->value.store(0, port::Order::kRelaxed);
    }
  }
  // Lets commands in again after reset_protocol(); release: they see the reset state.
  void resume() { state_.value.store(kRunning, port::Order::kSeqCst); }

  // Enqueues `cmd` (its CID is overwritten). Returns once the doorbell covers it.
  // `help()` is called while waiting; see the class comment.
  // On a queue that is being reset or is dead, t completes at once with kAbortedStatus or
  // kDeadStatus.
  template <typename Help>
  WARPFS_HD void submit(SubmissionEntry cmd, Ticket* t, Help&& help) {
    *t = Ticket{};
    if (!enter(help)) {
      t->status = kDeadStatus;
      t->done = true;
      return;
    }
    // Relaxed: the ticket only orders threads; slot ownership is handed over by turn_.
    const uint64_t ticket = ticket_.value.fetch_add(1, port::Order::kRelaxed);
    t->ticket = ticket;
    const uint64_t ahead = ticket - sq_tail_.value.load(port::Order::kRelaxed);
    if (ahead > pressure_.value.load(port::Order::kRelaxed)) {
      pressure_.value.fetch_max(ahead, port::Order::kRelaxed);
    }
    const uint32_t pos = static_cast<uint32_t>(ticket & mask_);
    // Acquire: the device has consumed the previous command in this slot (observed by the
    // head-lock holder through the CQE's SQ head and published with release).
    if (!wait_until(turn(pos), static_cast<uint32_t>(ticket >> shift_), help)) return abandon(t);
    const uint32_t cid = static_cast<uint32_t>(ticket % ncid_);
    if (!wait_until(cid_turn(cid), static_cast<uint32_t>(ticket / ncid_), help)) return abandon(t);
    cmd.cid = static_cast<uint16_t>(cid);
    t->cid = static_cast<uint16_t>(cid);
    q_.sq[pos] = cmd;
    // Release: the command's bytes are visible to whoever sees the mark.
    tail_mark(pos).store(ticket + 1, port::Order::kRelease);
    port::Backoff b;
    while (sq_tail_.value.load(port::Order::kAcquire) <= ticket) {
      if (state_.value.load(port::Order::kAcquire) != kRunning) return abandon(t);
      if (tail_lock_.try_lock()) {
        advance_tail();
        tail_lock_.unlock();
        if (sq_tail_.value.load(port::Order::kAcquire) > ticket) break;
      }
      // Still behind a gap (an earlier ticket's owner has not written yet) or a full SQ:
      // make progress on our own earlier commands, whose completions free both.
      help();
      b.pause();
    }
  }

  // Advances `t`; true once its completion has been found and handed to the head (status in
  // t->status).
  WARPFS_HD bool poll(Ticket* t) {
    if (t->done) return true;
    if (state_.value.load(port::Order::kAcquire) != kRunning) {
      // Recovery: stop waiting. (A found completion finished in the poll that found it.)
      abandon(t);
      return true;
    }
    if (!find_completion(t)) {
      drain_head();  // others' published entries may wait for the head
      return false;
    }
    // Our entry is published: the head passes it now (drain_head) or its current holder
    // will, and release our CID then.
    drain_head();
    finish(t);
    return true;
  }

  // Host only: polls `t` until done, sleeping on the queue's interrupt when the completion
  // has not arrived yet. Returns the NVMe status field.
  uint16_t wait(Ticket* t) {
    port::Backoff b;
    uint64_t since = 0;  // when a poll first found nothing (InterruptLine::note_wait_since)
    while (!poll(t)) {
      if (since == 0 && q_.irq != nullptr && q_.irq->learns()) since = port::now_ns();
      if (q_.irq != nullptr && q_.irq->sleep_now(b)) {
        sleep_on_irq(*t, [&] { return poll(t); });
      } else if (q_.irq != nullptr) {
        q_.irq->back_off(b);
      } else {
        b.pause();
      }
    }
    if (since != 0) q_.irq->note_wait_since(since);
    return t->status;
  }

  // Host only: sleeps on this queue's interrupt line until `t`'s completion may have come: on
  // a keyed line its own key, else any completion of the line. `recheck` is the caller's last
  // poll, after the line's word was read; it returns true on progress, and then, as when that
  // poll found `t` (its key was raised already and will not be again), nothing sleeps.
  // Bounded: a wake-up lost some other way costs at most 200 µs.
  // REQUIRES: view().irq != nullptr.
  template <typename Recheck>
  void sleep_on_irq(const Ticket& t, Recheck&& recheck) {
    InterruptLine& irq = *q_.irq;
    const uint32_t k = key_of(t);
    const uint32_t seen = irq.keyed ? irq.key_seq(k) : irq.count.value.load(port::Order::kAcquire);
    if (recheck()) return;
    if (irq.keyed) {
      irq.wait_key(k, seen, 200'000);
    } else {
      irq.wait(seen, 200'000);
    }
  }

  // Host only: the key of `t`'s completion on this queue's (keyed) interrupt line.
  uint32_t key_of(const Ticket& t) const { return InterruptLine::key(q_.qid, t.cid); }

  // Host only: submit + wait, for one command.
  uint16_t execute(const SubmissionEntry& cmd, uint32_t* dw0 = nullptr) {
    Ticket t;
    submit(cmd, &t, [] {});
    const uint16_t s = wait(&t);
    if (dw0 != nullptr) *dw0 = t.dw0;
    return s;
  }

 private:
  using Slot32 = port::Padded<port::Atomic<uint32_t>>;
  using Slot64 = port::Padded<port::Atomic<uint64_t>>;

  VirtualQueue() = default;

  // Per-slot arrays follow the header in the same allocation: turn_[n], tail_mark_[n],
  // head_mark_[n] (64-bit tags in 64-byte lines), cid_turn_[n - 1].
  WARPFS_HD Slot32* turns() const {
    return reinterpret_cast<Slot32*>(const_cast<VirtualQueue*>(this) + 1);
  }
  WARPFS_HD port::Atomic<uint32_t>& turn(uint32_t pos) const { return turns()[pos].value; }
  WARPFS_HD port::Atomic<uint64_t>& tail_mark(uint32_t pos) const {
    return reinterpret_cast<Slot64*>(turns() + q_.entries)[pos].value;
  }
  WARPFS_HD port::Atomic<uint64_t>& head_mark(uint32_t pos) const {
    return reinterpret_cast<Slot64*>(turns() + 2 * q_.entries)[pos].value;
  }
  WARPFS_HD port::Atomic<uint32_t>& cid_turn(uint32_t cid) const {
    return turns()[3 * q_.entries + cid].value;
  }
  static_assert(sizeof(Slot32) == port::kCacheLine && sizeof(Slot64) == port::kCacheLine,
                "per-slot arrays share one stride: a cache line");

  // False if the queue stopped running while we waited.
  template <typename Help>
  WARPFS_HD bool wait_until(port::Atomic<uint32_t>& a, uint32_t want, Help& help) {
    port::Backoff b;
    while (a.load(port::Order::kAcquire) != want) {
      if (state_.value.load(port::Order::kAcquire) != kRunning) return false;
      help();
      b.pause();
    }
    return true;
  }

  // Counts a command in (see Recovery); false on a dead queue. While the queue is being
  // reset, waits for it, calling `help` so the caller's other commands can finish.
  template <typename Help>
  WARPFS_HD bool enter(Help& help) {
    port::Backoff b;
    for (;;) {
      inside_.value.fetch_add(1, port::Order::kSeqCst);
      const uint32_t s = state_.value.load(port::Order::kSeqCst);
      if (s == kRunning) return true;
      inside_.value.fetch_sub(1, port::Order::kSeqCst);
      if (s == kDead) return false;
      help();
      b.pause();
    }
  }
  // The command is over; nothing of it is touched after this.
  WARPFS_HD void finish(Ticket* t) {
    t->done = true;
    inside_.value.fetch_sub(1, port::Order::kSeqCst);
  }
  // Gives up on the command: the queue is being reset (or is dead).
  WARPFS_HD void abandon(Ticket* t) {
    t->status = state_.value.load(port::Order::kAcquire) == kDead ? kDeadStatus : kAbortedStatus;
    finish(t);
  }

  // Tail-lock holder: publish every consecutive written slot with one doorbell write.
  WARPFS_HD void advance_tail() {
    const uint64_t tail = sq_tail_.value.load(port::Order::kRelaxed);
    uint64_t head = sq_head_.value.load(port::Order::kAcquire);
    uint64_t next = tail;
    for (;;) {
      if (next - head >= mask_) {  // size - 1 entries outstanding: the SQ is full
        head = sq_head_.value.load(port::Order::kAcquire);
        if (next - head >= mask_) break;
      }
      // Acquire pairs with the writer's release: its SQE bytes are visible to us, and our
      // doorbell release below passes them on to the device.
      if (tail_mark(static_cast<uint32_t>(next & mask_)).load(port::Order::kAcquire) != next + 1)
        break;
      ++next;
    }
    if (next == tail) return;
    q_.sq_doorbell.ring(static_cast<uint32_t>(next & mask_));
    sq_tail_.value.store(next, port::Order::kRelease);
  }

  enum Probe { kNotYet, kMine, kOther };
  // CQ position v, which lies in [cq head, cq head + entries): not written yet (the device's
  // tail is at or before it), t's entry (taken), or another command's.
  WARPFS_HD Probe probe(Ticket* t, uint64_t v) {
    const uint32_t slot = static_cast<uint32_t>(v & mask_);
    // Acquire: DW0..DW2 were written before DW3 (the device's release store).
    const uint32_t dw3 = q_.cqe_dw3(slot, port::Order::kAcquire);
    const bool expected_phase = ((v >> shift_) & 1) == 0;
    if (dw3_phase(dw3) != expected_phase) return kNotYet;
    if (dw3_cid(dw3) != t->cid) return kOther;
    t->status = dw3_status(dw3);
    t->dw0 = q_.cq[slot].dw0;
    // Release: the head-lock holder that sees the mark sees that we are done reading. Seq_cst
    // for the hand-off in drain_head.
    head_mark(slot).store(v + 1, port::Order::kSeqCst);
    return kMine;
  }

  // Lock-free scan of the CQ for t's completion (BaM §5.3), after one probe where an in-order
  // device puts it. A device that completes in submission order (the emulated controller with
  // one worker per queue, and no latency jitter) writes the entry of ticket k at CQ position k,
  // so that position is looked at first: one read instead of a scan of every entry that has
  // arrived and is not consumed yet. On the GPU every CQ read crosses PCIe (the CQ is in host
  // memory) and every waiting thread scanned (BaM §10.1 names this waste); there, while the
  // guessed position is not written yet, the full scan runs only every kScanEvery-th poll. An
  // entry of another command at the guessed position means the device completes out of order:
  // then the scan runs at once. The scan alone finds out-of-order completions, as before.
  static constexpr uint32_t kScanEvery = 8;
  WARPFS_HD bool find_completion(Ticket* t) {
    const uint64_t head = cq_head_.value.load(port::Order::kAcquire);
    if (t->ticket >= head && t->ticket < head + q_.entries) {
      const Probe p = probe(t, t->ticket);
      if (p == kMine) return true;
#if defined(__CUDA_ARCH__)
      if (p == kNotYet && ++t->polls % kScanEvery != 0) return false;
#endif
    }
    for (uint64_t v = head; v < head + q_.entries; ++v) {
      const Probe p = probe(t, v);
      if (p == kNotYet) return false;  // reached the device's tail
      if (p == kMine) return true;
    }
    return false;
  }

  // Consumes the entries published at the head, if the head lock is free. Either way, an
  // entry published (probe) before this call is consumed by someone: the hand-off. A holder
  // looks at the head's mark again after unlocking, and goes round once more if it is set.
  // The mark's store, the try_lock's load of `serving`, the unlock's store and the re-check
  // are all seq_cst, so in their single total order either the publisher's try_lock comes
  // after the holder's unlock (and takes the lock, or finds a newer holder that will look
  // after its own unlock) or the holder's re-check comes after the mark. Every holder takes
  // the lock here, so every holder re-checks.
  WARPFS_HD void drain_head() {
    while (head_lock_.try_lock_seq_cst()) {
      advance_head();
      head_lock_.unlock_seq_cst();
      const uint64_t h = cq_head_.value.load(port::Order::kAcquire);
      if (head_mark(static_cast<uint32_t>(h & mask_)).load(port::Order::kSeqCst) != h + 1) return;
    }
  }

  // Head-lock holder: consume consecutive finished CQ entries, reclaim SQ slots up to the
  // SQ head the device reported in the last of them, ring the CQ head doorbell once.
  WARPFS_HD void advance_head() {
    const uint64_t head = cq_head_.value.load(port::Order::kRelaxed);
    uint64_t next = head;
    uint32_t sq_head_slot = 0;
    // Each consumed entry's CID, read (like its SQ head) before the doorbell lets the
    // device reuse the slot. A run is capped so the CIDs fit on the stack.
    uint16_t cids[kMaxHeadRun];
    uint32_t run = 0;
    while (run < q_.entries && run < kMaxHeadRun &&
           head_mark(static_cast<uint32_t>(next & mask_)).load(port::Order::kAcquire) == next + 1) {
      sq_head_slot = q_.cq[next & mask_].sq_head;
      cids[run++] = q_.cq[next & mask_].cid;
      ++next;
    }
    if (run == 0) return;
    // The SQ head only moves forward and never by a full lap (at most size - 1 entries
    // are ever outstanding), so the slot delta is unambiguous.
    const uint64_t old_sq = sq_head_.value.load(port::Order::kRelaxed);
    const uint64_t new_sq = old_sq + ((sq_head_slot - old_sq) & mask_);
    for (uint64_t v = old_sq; v < new_sq; ++v) {
      // Release: the next thread of that slot may overwrite the SQ entry.
      turn(static_cast<uint32_t>(v & mask_)).fetch_add(1, port::Order::kRelease);
    }
    sq_head_.value.store(new_sq, port::Order::kRelease);
    // cq_head_ moves before the CIDs are released: a CID's next owner scans from the new
    // head, so it can never match the entry its predecessor left behind (BaM §5.3).
    cq_head_.value.store(next, port::Order::kRelease);
    q_.cq_doorbell.ring(static_cast<uint32_t>(next & mask_));
    // The holder, not each owner, releases the CIDs: an owner that is descheduled after
    // marking its entry must not hold up the next user of its CID (on an oversubscribed
    // machine that cost a scheduler tick, ~4 ms, once per lap of the queue).
    // Marked entries were matched by their owners, so their CIDs are ours and < ncid_.
    for (uint32_t i = 0; i < run; ++i) {
      if (cids[i] < ncid_) cid_turn(cids[i]).fetch_add(1, port::Order::kRelease);
    }
    completed_.value.fetch_add(run, port::Order::kRelaxed);
  }
  static constexpr uint32_t kMaxHeadRun = 256;

  QueueView q_;
  uint32_t mask_ = 0;
  uint32_t shift_ = 0;
  uint32_t ncid_ = 0;
  port::Padded<port::Atomic<uint64_t>> ticket_;
  port::Padded<port::Atomic<uint64_t>> sq_tail_;  // virtual; written under tail_lock_
  port::Padded<port::Atomic<uint64_t>> sq_head_;  // virtual; written under head_lock_
  port::Padded<port::Atomic<uint64_t>> cq_head_;  // virtual; written under head_lock_
  port::Padded<port::Atomic<uint64_t>> completed_;
  port::Padded<port::Atomic<uint64_t>> pressure_;
  port::Padded<port::Atomic<uint64_t>> inside_;  // see Recovery
  port::Padded<port::Atomic<uint32_t>> state_;   // State
  port::TicketLock tail_lock_;                   // Lock order: never held together with head_lock_.
  port::TicketLock head_lock_;
};

// Host-side owner of a VirtualQueue's memory.
struct VirtualQueueDeleter {
  void operator()(VirtualQueue* q) const {
    ::operator delete (q, std::align_val_t{port::kCacheLine});
  }
};
using VirtualQueuePtr = std::unique_ptr<VirtualQueue, VirtualQueueDeleter>;

inline VirtualQueuePtr make_virtual_queue(const QueueView& q) {
  void* mem =
      ::operator new (VirtualQueue::footprint(q.entries), std::align_val_t{port::kCacheLine});
  return VirtualQueuePtr(VirtualQueue::init(mem, q));
}

}  // namespace warpfs::nvme
