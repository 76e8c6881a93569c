#include "emu_controller.h"

#include <pthread.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstring>

namespace warpfs::nvme {
namespace {

// Adds to a counter that one thread at a time writes (a load and a store: no locked
// instruction) and any thread may read.
void bump(std::atomic<uint64_t>& c, uint64_t n) {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

constexpr uint32_t kErrorLogEntries = 64;
constexpr uint32_t kAdminBudget = 64;
constexpr uint16_t kVendorId = 0x1d0f;  // an arbitrary id; the model name says what it is

// Doorbell and register offsets are dword aligned; anything else is ignored, as hardware does.
bool aligned4(uint32_t off) {
  return (off & 3) == 0;
}

void put_u128(uint8_t (&dst)[16], uint64_t v) {
  std::memset(dst, 0, sizeof dst);
  std::memcpy(dst, &v, sizeof v);  // little endian, as the spec and x86 agree
}

void fill_string(char* dst, size_t n, const std::string& s) {
  // Identify strings are ASCII, space padded, not NUL terminated (Base §5.17.2.1).
  std::memset(dst, ' ', n);
  std::memcpy(dst, s.data(), std::min(n, s.size()));
}

}  // namespace

EmulatedController::EmulatedController(const EmulatedConfig& config,
                                       std::shared_ptr<BackingStore> store)
    : config_(config),
      media_(store, config.volatile_write_cache, config.write_cache_bytes, config.cache_in_store),
      dstrd_(config.doorbell_stride),
      store_bytes_(store->bytes()) {
  uint64_t base = 0;
  for (const NamespaceConfig& n : config_.namespaces) {
    const uint32_t shift = n.lba_bytes == 4096 ? 12 : 9;
    uint64_t count = n.lba_count;
    if (count == 0 && store->bytes() > base) count = (store->bytes() - base) >> shift;
    namespaces_.push_back(Namespace{base, count, shift});
    base += ((count << shift) + 4095) & ~4095ull;  // each namespace starts on a 4 KiB unit
  }
  const uint16_t maxq = config_.max_io_queues;
  reg_words_ = (reg::cq_doorbell(maxq, dstrd_) + 4) / 4;
  regs_.reset(new port::Atomic<uint32_t>[reg_words_]());
  irqs_.reset(new InterruptLine[config_.interrupt_vectors]());
  // This controller writes every CQE itself, so it can name each one's waiter. Run inline
  // with no latency, the thread that rang (or the one that held the device then) posts the
  // completion at once: waiters need not yield to it first (InterruptLine, "When to sleep").
  const bool prompt = config_.inline_io && config_.latency_ns == 0 &&
                      config_.latency_jitter_ns == 0 && config_.bandwidth_bytes_per_s == 0;
  for (uint16_t v = 0; v < config_.interrupt_vectors; ++v) {
    irqs_[v].keyed = true;
    irqs_[v].prompt = prompt;
  }
  sqs_.resize(maxq + 1u);
  cqs_.reset(new CqState[maxq + 1u]);
  const unsigned nw = std::max(1u, config_.worker_threads);
  for (unsigned i = 0; i < nw; ++i) {
    workers_.emplace_back();
    Worker& w = workers_.back();
    w.rng.seed(config_.seed * 7919 + i);
    w.owner = this;
    w.idx = i;
    if (config_.inline_io) {
      w.kick.run = [](void* ctx) {
        auto* me = static_cast<Worker*>(ctx);
        return me->owner->run_inline(me->idx);
      };
      w.kick.ctx = &w;
    }
  }
  // CAP (Base §3.1.4.1): MQES, CQR=1, AMS, TO = 2 (1 s), DSTRD, CSS NVM, MPSMIN=MPSMAX=0.
  const uint64_t cap = Cap::make(config_.max_queue_entries - 1, config_.wrr, 2, dstrd_, 0, 0);
  reg_store(reg::kCap, static_cast<uint32_t>(cap));
  reg_store(reg::kCap + 4, static_cast<uint32_t>(cap >> 32));
  reg_store(reg::kVs, 0x00020000);  // NVMe 2.0
}

bool EmulatedController::start(std::string* error) {
  uint64_t need = 0;
  for (const Namespace& n : namespaces_) {
    if (n.lba_count == 0) {
      *error = "namespace has no blocks: the backing store is too small";
      return false;
    }
    need = std::max(need, n.base + (n.lba_count << n.lba_shift));
  }
  if (config_.max_queue_entries < 2 || config_.max_queue_entries > kIoQueueMaxEntries ||
      config_.interrupt_vectors == 0 || config_.max_io_queues == 0) {
    *error = "invalid emulated controller configuration";
    return false;
  }
  if (need > store_bytes_) {
    *error = "the backing store (" + std::to_string(store_bytes_) +
             " bytes) is smaller than the configured namespaces (" + std::to_string(need) + ")";
    return false;
  }
  for (unsigned i = 0; i < workers_.size(); ++i) {
    workers_[i].thread = std::thread([this, i] { run(i); });
  }
  return true;
}

EmulatedController::~EmulatedController() {
  stop_.store(true);
  for (Worker& w : workers_) {
    w.kick.seq.value.fetch_add(1, port::Order::kRelease);
    port::futex_wake_all(w.kick.seq.value.address());
  }
  for (Worker& w : workers_) {
    if (w.thread.joinable()) w.thread.join();
  }
}

// ---------------------------------------------------------------------------------------------
// Registers
// ---------------------------------------------------------------------------------------------

uint32_t EmulatedController::reg_load(uint32_t off) const {
  return regs_[off / 4].load(port::Order::kAcquire);
}
void EmulatedController::reg_store(uint32_t off, uint32_t v) {
  // Seq_cst: register writes by the host (CC, doorbells) take part in park()'s handshake.
  regs_[off / 4].store(v, port::Order::kSeqCst);
}

uint32_t EmulatedController::read32(uint32_t off) {
  if (dead_.load() || !aligned4(off) || off / 4 >= reg_words_) return 0xffffffffu;
  return reg_load(off);
}

uint64_t EmulatedController::read64(uint32_t off) {
  return uint64_t{read32(off)} | (uint64_t{read32(off + 4)} << 32);
}

void EmulatedController::write32(uint32_t off, uint32_t v) {
  if (dead_.load() || !aligned4(off) || off / 4 >= reg_words_) return;
  switch (off) {
    case reg::kCc: {
      // The register first, then the flag: a worker that takes the flag (handle_cc) then
      // reads this value or a later one, never the one before the disable.
      const bool disabling = (reg_load(reg::kCc) & cc::kEn) && !(v & cc::kEn);
      reg_store(off, v);
      if (disabling) disable_seen_.store(true);
      Doorbell::nudge(workers_[0].kick);  // worker 0 notices the change
      return;
    }
    case reg::kAqa:
    case reg::kAsq:
    case reg::kAsq + 4:
    case reg::kAcq:
    case reg::kAcq + 4:
      reg_store(off, v);
      return;
    default:
      if (off >= reg::kDoorbellBase) {
        // A disabled controller has no queues: their doorbells ignore writes (an admin CQ
        // head written now would otherwise outlive the next enable and stall the queue).
        if (!(reg_load(reg::kCc) & cc::kEn)) return;
        reg_store(off, v);
        const uint32_t qid = (off - reg::kDoorbellBase) / (4u << dstrd_) / 2;
        Doorbell::wake(workers_[worker_of(static_cast<uint16_t>(qid))].kick);
      }
      return;  // read-only or unimplemented registers ignore writes
  }
}

void EmulatedController::write64(uint32_t off, uint64_t v) {
  write32(off, static_cast<uint32_t>(v));
  write32(off + 4, static_cast<uint32_t>(v >> 32));
}

Doorbell EmulatedController::doorbell(uint16_t qid, bool cq) {
  const uint32_t off = cq ? reg::cq_doorbell(qid, dstrd_) : reg::sq_doorbell(qid, dstrd_);
  if (qid > config_.max_io_queues) return Doorbell{};
  return Doorbell{&regs_[off / 4], &workers_[worker_of(qid)].kick};
}

InterruptLine* EmulatedController::interrupt(uint16_t vector) {
  return vector < config_.interrupt_vectors ? &irqs_[vector] : nullptr;
}

// ---------------------------------------------------------------------------------------------
// Worker threads
// ---------------------------------------------------------------------------------------------

void EmulatedController::run(unsigned idx) {
  // Timed waits for the latency model want microsecond precision, not 50 µs of timer slack.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  char name[16];
  std::snprintf(name, sizeof name, "nvme-emu-%u", idx);
  pthread_setname_np(pthread_self(), name);
  Worker& w = workers_[idx];
  w.last_work_ns = port::now_ns();
  while (!stop_.load(std::memory_order_relaxed)) {
    bool worked;
    const uint64_t start = port::now_ns();
    {
      std::lock_guard<std::mutex> g(w.mu);
      worked = pass(idx);
    }
    if (worked) {
      w.last_work_ns = port::now_ns();
      bump(w.busy_ns, w.last_work_ns - start);
    } else {
      park(idx);
    }
  }
}

// One arbitration round (Base §4.13: round robin, or weighted round robin with an urgent
// class when CC.AMS selects it): admin first, then urgent SQs, then the weighted classes.
bool EmulatedController::pass(unsigned idx) {
  Worker& w = workers_[idx];
  bool worked = false;
  if (idx == 0) worked |= handle_cc();
  if (fatal_.load() != 0) {
    // A failed controller (Base §3.1.4.6) fetches and completes nothing until a reset.
    if (idx == 0 && enabled_ && !(reg_load(reg::kCsts) & csts::kCfs)) {
      reg_store(reg::kCsts, reg_load(reg::kCsts) | csts::kCfs);
      worked = true;
    }
    return worked;
  }
  if (enabled_ && !paused_.load(std::memory_order_relaxed)) {
    if (idx == 0) worked |= fetch(w, 0, kAdminBudget) > 0;
    const uint32_t ab = arbitration_ & 7;
    const uint32_t burst = ab == 7 ? 1024 : 1u << ab;  // 111b: no limit
    const uint32_t weight[4] = {burst, ((arbitration_ >> 24) & 0xff) + 1,
                                ((arbitration_ >> 16) & 0xff) + 1,
                                ((arbitration_ >> 8) & 0xff) + 1};
    const uint32_t step = sq_step();
    const uint32_t first = idx == 0 ? step : first_sq(idx);  // the admin queue is above
    for (int cls = 0; cls < 4; ++cls) {
      for (uint32_t q = first; q < sq_end_; q += step) {
        const SqState& sq = sqs_[q];
        if (!sq.live) continue;
        if (wrr_active_ ? static_cast<int>(sq.prio) != cls : cls != 0) continue;
        worked |= fetch(w, static_cast<uint16_t>(q), wrr_active_ ? weight[cls] : burst) > 0;
      }
    }
  }
  worked |= post_ready(w);
  return worked;
}

// Inline mode (EmulatedConfig::inline_io): the thread that rang a doorbell runs the
// worker's arbitration rounds itself, as long as they find work, and returns with its
// completions already posted: no hand-off to the worker thread and back. A real controller
// works beside the host; emulated, that hand-off is two context switches per command on a
// small machine. True when nothing is left for the worker thread: not when the worker (or
// another ringer) holds the device, nor when completions wait for their due time or for
// room in a full CQ.
bool EmulatedController::run_inline(unsigned idx) {
  Worker& w = workers_[idx];
  std::unique_lock<std::mutex> g(w.mu, std::try_to_lock);
  if (!g.owns_lock()) return false;
  for (int round = 0; round < kInlineRounds; ++round) {
    if (!pass(idx)) return w.timed.empty() && w.blocked.empty();
  }
  return false;  // still busy: the worker takes over
}

bool EmulatedController::has_work(unsigned idx) {
  if (stop_.load()) return true;
  // Seq_cst loads: the other half of the handshake with Doorbell::nudge (see park()).
  auto load = [this](uint32_t off) { return regs_[off / 4].load(port::Order::kSeqCst); };
  if (idx == 0 && (load(reg::kCc) != cc_seen_ || disable_seen_.load())) return true;
  if (fatal_.load() != 0) return idx == 0 && enabled_ && !(load(reg::kCsts) & csts::kCfs);
  if (!enabled_ || paused_.load()) return false;
  for (uint32_t q = first_sq(idx); q < sq_end_; q += sq_step()) {
    const SqState& sq = sqs_[q];
    if (sq.live && load(reg::sq_doorbell(static_cast<uint16_t>(q), dstrd_)) != sq.head) {
      return true;
    }
  }
  return false;
}

uint64_t EmulatedController::next_wake(const Worker& w, uint64_t now) {
  uint64_t wake_at = 0;
  if (!w.blocked.empty()) wake_at = now + 20'000;  // retry a full CQ soon
  if (!w.timed.empty()) {
    const uint64_t due = w.timed.top().due_ns;
    wake_at = wake_at ? std::min(wake_at, due) : due;
  }
  return wake_at;
}

// Idle: keep polling for idle_spin_ns (the next command usually arrives within
// microseconds), then park on the kick futex until a doorbell rings or a timed completion
// falls due. Inline with a latency model the worker only posts timed completions (ringers
// run the commands and kick it if it is parked), so it parks at once.
//
// The sleep is planned twice. An inline ringer (run_inline) adds timed or blocked
// completions under w.mu and then kicks us only if `sleeping` is set. So after announcing
// ourselves we plan again under w.mu: either the ringer's addition came first and we see it
// here, or our announcement came first and the ringer sees it and bumps `seq` (loaded before
// the announcement, so the futex wait returns at once). Planning only before the
// announcement lost such a completion until the next doorbell: with no other I/O, until the
// driver's watchdog reset the controller.
//
// A completion due soon is waited for by yielding: a futex timeout returns tens of
// microseconds late (25-45 µs on a 2-core VM, a few on bare metal). One due later is slept
// for until `close` before it (1.5 times the measured lateness) and yielded for from there:
// an emulated 80 µs device then takes part of a CPU per command in flight, not all of one.
void EmulatedController::park(unsigned idx) {
  static constexpr uint64_t kMinCloseNs = 10'000, kMaxCloseNs = 100'000;
  Worker& w = workers_[idx];
  const uint64_t close = std::clamp<uint64_t>(w.overshoot_ns * 3 / 2, kMinCloseNs, kMaxCloseNs);
  const bool spin_idle =
      !config_.inline_io || (config_.latency_ns == 0 && config_.latency_jitter_ns == 0);
  uint64_t now = port::now_ns();
  uint64_t wake_at;
  {
    std::lock_guard<std::mutex> g(w.mu);
    wake_at = next_wake(w, now);
  }
  if (wake_at != 0 && wake_at <= now + close) {
    port::thread_yield();
    return;
  }
  if (wake_at == 0 && spin_idle && now - w.last_work_ns < config_.idle_spin_ns) {
    // Poll, but let a host thread that shares this core run: on a small machine the
    // thread we wait for is often the one that will ring the next doorbell.
    port::thread_yield();
    return;
  }
  if (config_.park_window_hook) config_.park_window_hook(wake_at);
  const uint32_t seq = w.kick.seq.value.load(port::Order::kAcquire);
  w.kick.sleeping.value.store(1, port::Order::kSeqCst);  // then re-check: see has_work()
  bool work;
  {
    std::lock_guard<std::mutex> g(w.mu);
    work = has_work(idx);
    now = port::now_ns();
    wake_at = next_wake(w, now);
  }
  if (wake_at != 0 && wake_at <= now + close) work = true;  // back to pass() at once
  if (!work) {
    // Wake `close` early; on a timeout (not a kick: then it returns before `target`), learn
    // how late it came back.
    const uint64_t target = wake_at ? wake_at - close : 0;
    port::futex_wait(w.kick.seq.value.address(), seq, target ? target - now : 0);
    if (target != 0) {
      const uint64_t back = port::now_ns();
      if (back >= target) w.overshoot_ns += (back - target) / 8 - w.overshoot_ns / 8;
    }
  }
  w.kick.sleeping.value.store(0, port::Order::kRelaxed);
}

void EmulatedController::set_sq_end() {
  uint32_t end = 1;
  for (size_t q = 1; q < sqs_.size(); ++q) {
    if (sqs_[q].live) end = static_cast<uint32_t>(q + 1);
  }
  sq_end_ = end;
}

void EmulatedController::clear_doorbells() {
  for (uint32_t off = reg::kDoorbellBase; off / 4 < reg_words_; off += 4) reg_store(off, 0);
}

void EmulatedController::lock_others() {
  for (size_t i = 1; i < workers_.size(); ++i) workers_[i].mu.lock();
}
void EmulatedController::unlock_others() {
  for (size_t i = workers_.size(); i-- > 1;) workers_[i].mu.unlock();
}

// CC changes (Base §3.1.4.5, §3.5): enable brings the admin queue up, disable resets the
// controller, SHN performs a shutdown (the volatile write cache is made durable).
bool EmulatedController::handle_cc() {
  // The flag before the register (write32 stores them the other way round). Read the other
  // way, a disable that came between the two reads was taken with the value from before it:
  // the old CC acted on again as an enable (failing, CFS, if it had been refused before),
  // and the host, seeing RDY clear, enabled anew with a CC this worker took for no change,
  // so the controller stayed failed (found by fuzz_nvme).
  const bool disabled = disable_seen_.exchange(false);
  const uint32_t cc = reg_load(reg::kCc);
  if (cc == cc_seen_ && !disabled) return false;
  uint32_t prev = cc_seen_;
  cc_seen_ = cc;
  if ((prev & cc::kEn) && (disabled || !(cc & cc::kEn))) {
    reset_locked();
    reg_store(reg::kCsts, 0);
    uint8_t once = 1;
    fatal_.compare_exchange_strong(once, 0);  // a reset clears a transient fatal status
    if (!(cc & cc::kEn)) return true;
    prev = 0;  // EN went 1 -> 0 -> 1 between two looks: the enable below follows the reset
  }
  if (!(prev & cc::kEn) && (cc & cc::kEn)) {
    const uint32_t aqa = reg_load(reg::kAqa);
    const uint32_t asqs = (aqa & 0xfff) + 1, acqs = ((aqa >> 16) & 0xfff) + 1;
    const uint64_t asq = reg_load(reg::kAsq) | (uint64_t{reg_load(reg::kAsq + 4)} << 32);
    const uint64_t acq = reg_load(reg::kAcq) | (uint64_t{reg_load(reg::kAcq + 4)} << 32);
    auto* sq = reinterpret_cast<SubmissionEntry*>(dma_.translate(asq, asqs * 64ull));
    auto* cq = reinterpret_cast<CompletionEntry*>(dma_.translate(acq, acqs * 16ull));
    const uint32_t mps = (cc >> cc::kMpsShift) & 0xf;
    if (asqs < 2 || acqs < 2 || sq == nullptr || cq == nullptr || (asq | acq) % 4096 != 0 ||
        mps != 0 || fatal_.load() == 2) {
      reg_store(reg::kCsts, csts::kCfs);  // the host gave us nothing we can run
      return true;
    }
    lock_others();
    // Doorbells start at zero with the queues. Doorbell::ring stores to the register file
    // directly (as an MMIO store reaches a device), so a ring while disabled is not seen by
    // write32's filter: a stale admin CQ head would otherwise stall the new admin queue.
    clear_doorbells();
    sqs_[0] = SqState{true, sq, asqs, 0, 0, QueuePriority::kUrgent};
    CqState& c = cqs_[0];
    c.live = true, c.ring = cq, c.size = acqs, c.tail = 0, c.head = 0, c.phase = true;
    c.ien = true;
    c.vector = 0, c.sq_refs = 1;
    wrr_active_ = config_.wrr && ((cc & cc::kAmsMask) >> cc::kAmsShift) == cc::kAmsWrr;
    enabled_ = true;
    unlock_others();
    reg_store(reg::kCsts, csts::kRdy);
  }
  if ((cc & cc::kShnMask) && !(prev & cc::kShnMask)) {
    // Base §3.6.1: normal shutdown; everything acknowledged becomes durable.
    // The model's CSTS has no shutdown-failed state to report a failing store with: the data
    // it lost shows on the next read.
    (void)media_.flush();
    reg_store(reg::kCsts, (reg_load(reg::kCsts) & ~csts::kShstMask) | csts::kShstComplete);
  }
  return true;
}

// Controller reset (Base §3.7.2): every queue is deleted, commands in flight are dropped. The
// media and its volatile cache survive, as they do in a device.
void EmulatedController::reset_locked() {
  lock_others();
  for (SqState& s : sqs_) s = SqState{};
  set_sq_end();
  for (size_t q = 0; q < sqs_.size(); ++q) {
    std::lock_guard<std::mutex> g(cqs_[q].mu);
    cqs_[q].live = false, cqs_[q].sq_refs = 0;
  }
  for (Worker& w : workers_) {
    w.timed = {};
    w.ready.clear();
    w.blocked.clear();
  }
  clear_doorbells();
  enabled_ = false;
  granted_sq_ = granted_cq_ = 0;
  arbitration_ = 0;
  io_queues_live_ = 0;
  unlock_others();
}

// Fetches and executes up to `budget` commands from SQ `qid`; their completions are queued.
uint32_t EmulatedController::fetch(Worker& w, uint16_t qid, uint32_t budget) {
  SqState& sq = sqs_[qid];
  if (!sq.live) return 0;
  // Acquire pairs with the host's release ring: the entries up to the tail are written.
  const uint32_t tail = reg_load(reg::sq_doorbell(qid, dstrd_));
  if (tail >= sq.size) {
    // Base §4.1 / §5.2.1: an Invalid Doorbell Write Value; the write is ignored and logged.
    reg_store(reg::sq_doorbell(qid, dstrd_), sq.head);
    log_error_raw(qid, 0xffff, make_status(sct::kGeneric, sc::kInvalidField));
    return 0;
  }
  uint32_t n = 0;
  while (sq.head != tail && n < budget) {
    SubmissionEntry cmd;
    std::memcpy(&cmd, &sq.ring[sq.head], sizeof cmd);
    sq.head = (sq.head + 1) % sq.size;
    ++n;
    if (qid != 0 && tracing_.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> g(trace_mu_);
      trace_.push_back(qid);
    }
    Result r = qid == 0 ? execute_admin(w, cmd) : execute_io(w, cmd);
    if (!status_ok(r.status)) {
      n_errors_.fetch_add(1, std::memory_order_relaxed);
      log_error(qid, cmd, r.status, cmd.cdw10 | (uint64_t{cmd.cdw11} << 32));
    }
    Completion c{0, qid, cmd.cid, r.status, r.dw0};
    if (r.lost) {
      // Swallowed: the slot is consumed (the SQ head moves on), no entry is ever posted.
    } else if (qid != 0 &&
               (config_.latency_ns || config_.latency_jitter_ns || config_.bandwidth_bytes_per_s)) {
      uint64_t lat = config_.latency_ns;
      if (config_.latency_jitter_ns) lat += w.rng() % (config_.latency_jitter_ns + 1ull);
      c.due_ns = (status_ok(r.status) ? transfer_end(cmd, port::now_ns()) : port::now_ns()) + lat;
      w.timed.push(c);
    } else {
      w.ready.push_back(c);
    }
    if (!sq.live) break;  // the command deleted its own queue
  }
  return n;
}

uint64_t EmulatedController::transfer_end(const SubmissionEntry& cmd, uint64_t now) {
  const uint64_t bw = config_.bandwidth_bytes_per_s;
  if (bw == 0 || (cmd.opcode != io::kRead && cmd.opcode != io::kWrite) || cmd.nsid == 0 ||
      cmd.nsid > namespaces_.size())
    return now;
  // NLB is 0's based (NVM Command Set §3.2.4, Command Dword 12).
  const uint64_t bytes = ((cmd.cdw12 & 0xffff) + 1ull) << namespaces_[cmd.nsid - 1].lba_shift;
  const uint64_t xfer = bytes * 1'000'000'000ull / bw;  // at most 2^28 B x 1e9: fits
  uint64_t free_at = channel_free_ns_.load(std::memory_order_relaxed);
  uint64_t end;
  do {
    end = std::max(free_at, now) + xfer;
  } while (!channel_free_ns_.compare_exchange_weak(free_at, end, std::memory_order_relaxed));
  transfer_ns_.fetch_add(xfer, std::memory_order_relaxed);
  return end;
}

// Posts what is due: earlier blocked completions first (they keep their order), then due
// timed ones, shuffled when configured. One interrupt per vector per round.
bool EmulatedController::post_ready(Worker& w) {
  if (!w.timed.empty()) {
    const uint64_t now = port::now_ns();
    while (!w.timed.empty() && w.timed.top().due_ns <= now) {
      w.ready.push_back(w.timed.top());
      w.timed.pop();
    }
  }
  if (w.ready.empty() && w.blocked.empty()) return false;
  if (config_.shuffle_completions && w.ready.size() > 1) {
    std::shuffle(w.ready.begin(), w.ready.end(), w.rng);
  }
  w.raised.clear();
  w.keys.clear();
  w.still_blocked.clear();
  bool progress = false;
  for (const Completion& c : w.blocked) {
    if (!w.still_blocked.empty() && w.still_blocked.back().sqid == c.sqid) {
      w.still_blocked.push_back(c);  // keep per-queue order behind an earlier blocked entry
    } else if (post(c, w)) {
      progress = true;
    } else {
      w.still_blocked.push_back(c);
    }
  }
  for (const Completion& c : w.ready) {
    if (post(c, w)) {
      progress = true;
    } else {
      w.still_blocked.push_back(c);
    }
  }
  w.ready.clear();
  w.blocked.swap(w.still_blocked);
  // Each waiter's own key first (it sleeps on that alone), then the count that pollers and
  // unkeyed waiters watch.
  for (const auto& [v, k] : w.keys) irqs_[v].raise_key(k);
  for (uint16_t v : w.raised) irqs_[v].raise();
  return progress;
}

// Writes one completion entry (Base §4.6) unless the CQ is full (Base §4.1.2: full when the
// tail is one behind the head).
bool EmulatedController::post(const Completion& c, Worker& w) {
  const uint16_t cqid = sqs_[c.sqid].cqid;
  if (!sqs_[c.sqid].live) return true;  // its SQ was deleted: the completion is dropped
  CqState& cq = cqs_[cqid];
  std::lock_guard<std::mutex> g(cq.mu);
  if (!cq.live) return true;
  uint32_t head = reg_load(reg::cq_doorbell(cqid, dstrd_));
  if (head >= cq.size) {
    // Base §4.1: an Invalid Doorbell Write Value is ignored (and logged), as fetch() does
    // for an SQ tail: the last valid head stands.
    reg_store(reg::cq_doorbell(cqid, dstrd_), cq.head);
    log_error_raw(cqid, 0xffff, make_status(sct::kGeneric, sc::kInvalidField));
    head = cq.head;
  }
  cq.head = head;
  if ((cq.tail + 1) % cq.size == head) return false;
  CompletionEntry* e = &cq.ring[cq.tail];
  e->dw0 = c.dw0;
  e->dw1 = 0;
  e->sq_head = static_cast<uint16_t>(sqs_[c.sqid].head);  // this worker owns the SQ head
  e->sq_id = c.sqid;
  // DW3 last, in one release store: a host that sees the new phase tag sees the whole entry.
  const uint32_t dw3 = c.cid | (uint32_t{cq.phase ? 1u : 0u} << 16) | (uint32_t{c.status} << 17);
  reinterpret_cast<port::Atomic<uint32_t>*>(reinterpret_cast<uint8_t*>(e) + kCqeDw3Offset)
      ->store(dw3, port::Order::kRelease);
  if (++cq.tail == cq.size) cq.tail = 0, cq.phase = !cq.phase;
  if (cq.ien) {
    w.keys.emplace_back(cq.vector, InterruptLine::key(c.sqid, c.cid));
    if (std::find(w.raised.begin(), w.raised.end(), cq.vector) == w.raised.end()) {
      w.raised.push_back(cq.vector);
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

void EmulatedController::log_error(uint16_t sqid, const SubmissionEntry& cmd, uint16_t status,
                                   uint64_t lba) {
  std::lock_guard<std::mutex> g(error_mu_);
  ErrorLogEntry e{};
  e.error_count = ++error_count_;
  e.sqid = sqid;
  e.cid = cmd.cid;
  e.status = static_cast<uint16_t>(status << 1);
  e.param_location = 0xffff;
  e.lba = lba;
  e.nsid = cmd.nsid;
  error_log_.push_front(e);
  if (error_log_.size() > kErrorLogEntries) error_log_.pop_back();
}

void EmulatedController::log_error_raw(uint16_t sqid, uint16_t cid, uint16_t status) {
  SubmissionEntry cmd{};
  cmd.cid = cid;
  n_errors_.fetch_add(1, std::memory_order_relaxed);
  log_error(sqid, cmd, status, 0);
}

// ---------------------------------------------------------------------------------------------
// Data transfer
// ---------------------------------------------------------------------------------------------

// PRP rules (Base §4.3, Figures 87/88): PRP1 may start at a dword-aligned offset within a
// page; every later entry is page aligned. With one page left PRP2 is that page; with more,
// PRP2 points at a PRP list whose last entry chains to the next list page while entries remain.
uint16_t EmulatedController::map_prps(const SubmissionEntry& cmd, uint64_t len,
                                      std::vector<emu::Segment>* out) {
  const uint64_t page = page_bytes();
  const uint16_t bad_offset = make_status(sct::kGeneric, sc::kInvalidPrpOffset);
  const uint16_t bad_xfer = make_status(sct::kGeneric, sc::kDataTransferError);
  out->clear();
  if (len == 0) return 0;
  if (cmd.flags & 0xc0) return make_status(sct::kGeneric, sc::kInvalidField);  // SGLs: no
  if (cmd.prp1 & 3) return bad_offset;
  auto add = [&](uint64_t iova, uint64_t n) -> uint16_t {
    uint8_t* p = dma_.translate(iova, n);
    if (p == nullptr) return bad_xfer;
    out->push_back(emu::Segment{p, n});
    return 0;
  };
  uint64_t first = std::min(len, page - (cmd.prp1 & (page - 1)));
  if (uint16_t s = add(cmd.prp1, first)) return s;
  uint64_t rem = len - first;
  if (rem == 0) return 0;
  if (rem <= page) {
    if (cmd.prp2 & (page - 1)) return bad_offset;
    return add(cmd.prp2, rem);
  }
  uint64_t list = cmd.prp2;
  if (list & 7) return bad_offset;
  while (rem > 0) {
    const uint64_t entries = (page - (list & (page - 1))) / 8;
    const auto* e = reinterpret_cast<const uint64_t*>(dma_.translate(list, entries * 8));
    if (e == nullptr) return bad_xfer;
    for (uint64_t i = 0; i < entries && rem > 0; ++i) {
      const uint64_t entry = e[i];
      if (i == entries - 1 && rem > page) {  // last slot of a list page: chain pointer
        if (entry & 7) return bad_offset;
        list = entry;
        break;
      }
      if (entry & (page - 1)) return bad_offset;
      const uint64_t n = std::min(rem, page);
      if (uint16_t s = add(entry, n)) return s;
      rem -= n;
    }
  }
  // Merge physically contiguous segments: fewer, larger copies.
  size_t k = 0;
  for (size_t i = 1; i < out->size(); ++i) {
    if ((*out)[k].ptr + (*out)[k].len == (*out)[i].ptr) {
      (*out)[k].len += (*out)[i].len;
    } else {
      (*out)[++k] = (*out)[i];
    }
  }
  out->resize(k + 1);
  return 0;
}

EmulatedController::Result EmulatedController::copy_out(Worker& w, const SubmissionEntry& cmd,
                                                        const void* data, size_t len) {
  uint16_t s = map_prps(cmd, len, &w.segs);
  if (s != 0) return {s, 0};
  const auto* p = static_cast<const uint8_t*>(data);
  for (const emu::Segment& sg : w.segs) std::memcpy(sg.ptr, p, sg.len), p += sg.len;
  return {0, 0};
}

// ---------------------------------------------------------------------------------------------
// Admin commands (Base §5)
// ---------------------------------------------------------------------------------------------

EmulatedController::Result EmulatedController::execute_admin(Worker& w,
                                                             const SubmissionEntry& cmd) {
  n_admin_.fetch_add(1, std::memory_order_relaxed);
  switch (cmd.opcode) {
    case admin::kIdentify:
      return identify(w, cmd);
    case admin::kGetLogPage:
      return get_log_page(w, cmd);
    case admin::kSetFeatures:
      return features(cmd, true);
    case admin::kGetFeatures:
      return features(cmd, false);
    case admin::kCreateIoCq:
      return create_cq(cmd);
    case admin::kCreateIoSq:
      return create_sq(cmd);
    case admin::kDeleteIoCq:
      return delete_queue(cmd, true);
    case admin::kDeleteIoSq:
      return delete_queue(cmd, false);
    default:
      return {make_status(sct::kGeneric, sc::kInvalidOpcode), 0};
  }
}

EmulatedController::Result EmulatedController::identify(Worker& w, const SubmissionEntry& cmd) {
  const uint8_t cns = cmd.cdw10 & 0xff;
  if (cns == cns::kController) {
    IdentifyController id{};
    id.vid = id.ssvid = kVendorId;
    fill_string(id.sn, sizeof id.sn, config_.serial);
    fill_string(id.mn, sizeof id.mn, "warpfs emulated NVMe controller");
    fill_string(id.fr, sizeof id.fr, "1.0");
    id.mdts = config_.mdts;
    id.cntlid = 1;
    id.ver = 0x00020000;
    id.aerl = 3;
    id.lpa = 0;
    id.elpe = kErrorLogEntries - 1;
    id.sqes = 0x66;  // required and maximum 64 B
    id.cqes = 0x44;  // 16 B
    id.maxcmd = 0;
    id.nn = static_cast<uint32_t>(namespaces_.size());
    id.oncs = oncs::kDatasetManagement | oncs::kWriteZeroes;
    id.vwc = config_.volatile_write_cache ? 1 : 0;
    id.awun = id.awupf = 0;  // per-namespace values in NAWUPF (NSFEAT.NSABP)
    return copy_out(w, cmd, &id, sizeof id);
  }
  if (cns == cns::kNamespace) {
    if (cmd.nsid == 0 || cmd.nsid > namespaces_.size()) {
      return {make_status(sct::kGeneric, sc::kInvalidNamespace), 0};
    }
    const Namespace& ns = namespaces_[cmd.nsid - 1];
    IdentifyNamespace id{};
    id.nsze = id.ncap = id.nuse = ns.lba_count;
    id.nsfeat = 1u << 1;  // NSABP: the atomicity fields below are valid
    id.nlbaf = 1;
    id.flbas = ns.lba_shift == 12 ? 1 : 0;
    id.dlfeat = 1;  // deallocated blocks read as zeroes
    const uint16_t unit_blocks = static_cast<uint16_t>((emu::Media::kUnit >> ns.lba_shift) - 1);
    id.nawun = id.nawupf = id.nabsn = id.nabspf = unit_blocks;
    id.lbaf[0] = LbaFormat{0, 9, 0};
    id.lbaf[1] = LbaFormat{0, 12, 0};
    return copy_out(w, cmd, &id, sizeof id);
  }
  if (cns == cns::kActiveNamespaceList) {
    uint32_t list[1024] = {};
    uint32_t n = 0;
    for (uint32_t id = cmd.nsid + 1; id <= namespaces_.size() && n < 1024; ++id) list[n++] = id;
    return copy_out(w, cmd, list, sizeof list);
  }
  return {make_status(sct::kGeneric, sc::kInvalidField), 0};
}

EmulatedController::Result EmulatedController::get_log_page(Worker& w, const SubmissionEntry& cmd) {
  const uint8_t id = cmd.cdw10 & 0xff;
  const uint64_t dwords = ((uint64_t{cmd.cdw11 & 0xffff} << 16) | (cmd.cdw10 >> 16)) + 1;
  const uint64_t offset = cmd.cdw12 | (uint64_t{cmd.cdw13} << 32);
  std::vector<uint8_t> page;
  if (id == lid::kErrorInformation) {
    page.assign(kErrorLogEntries * sizeof(ErrorLogEntry), 0);
    std::lock_guard<std::mutex> g(error_mu_);
    size_t i = 0;
    for (const ErrorLogEntry& e : error_log_) {
      std::memcpy(page.data() + i++ * sizeof e, &e, sizeof e);
    }
  } else if (id == lid::kSmartHealth) {
    SmartLog s{};
    s.temperature = 273 + 35;
    s.available_spare = 100;
    s.spare_threshold = 10;
    // Data units are thousands of 512-byte units, rounded up (Base Figure 207).
    put_u128(s.data_units_read, (io_sum(&Worker::IoCounts::bytes_read) / 512 + 999) / 1000);
    put_u128(s.data_units_written, (io_sum(&Worker::IoCounts::bytes_written) / 512 + 999) / 1000);
    put_u128(s.host_reads, io_sum(&Worker::IoCounts::reads));
    put_u128(s.host_writes, io_sum(&Worker::IoCounts::writes));
    put_u128(s.power_cycles, 1);
    {
      std::lock_guard<std::mutex> g(error_mu_);
      put_u128(s.error_log_entries, error_count_);
    }
    page.resize(sizeof s);
    std::memcpy(page.data(), &s, sizeof s);
  } else {
    return {make_status(sct::kCommandSpecific, sc::kInvalidLogPage), 0};
  }
  if (offset > page.size() || (offset & 3)) {
    return {make_status(sct::kGeneric, sc::kInvalidField), 0};
  }
  // A transfer beyond MDTS is refused before anything is allocated (NUMD reaches 16 GiB).
  if (dwords * 4 > std::min<uint64_t>(max_transfer(), 16u << 20))
    return {make_status(sct::kGeneric, sc::kInvalidField), 0};
  std::vector<uint8_t> out(dwords * 4, 0);
  std::memcpy(out.data(), page.data() + offset,
              std::min<uint64_t>(out.size(), page.size() - offset));
  return copy_out(w, cmd, out.data(), out.size());
}

EmulatedController::Result EmulatedController::features(const SubmissionEntry& cmd, bool set) {
  const uint8_t f = cmd.cdw10 & 0xff;
  if (set && (cmd.cdw10 >> 31))
    return {make_status(sct::kCommandSpecific, sc::kFeatureNotSaveable), 0};
  const uint16_t invalid = make_status(sct::kGeneric, sc::kInvalidField);
  switch (f) {
    case fid::kArbitration:
      if (set) {  // other workers read it in pass(): change it under their locks
        lock_others();
        arbitration_ = cmd.cdw11;
        unlock_others();
      }
      return {0, arbitration_};
    case fid::kVolatileWriteCache:
      if (!config_.volatile_write_cache) return {invalid, 0};
      if (set) media_.set_cache_enabled(cmd.cdw11 & 1);
      return {0, media_.cache_enabled() ? 1u : 0u};
    case fid::kNumberOfQueues: {
      if (set) {
        const uint32_t nsq = cmd.cdw11 & 0xffff, ncq = cmd.cdw11 >> 16;
        if (nsq == 0xffff || ncq == 0xffff) return {invalid, 0};
        if (io_queues_live_ != 0) return {make_status(sct::kGeneric, sc::kCommandSequenceError), 0};
        const uint32_t max = config_.max_io_queues - 1u;
        granted_sq_ = static_cast<uint16_t>(std::min(nsq, max));
        granted_cq_ = static_cast<uint16_t>(std::min(ncq, max));
      }
      return {0, granted_sq_ | (uint32_t{granted_cq_} << 16)};
    }
    default:
      return {invalid, 0};
  }
}

// Create I/O Completion Queue (Base §5.4).
EmulatedController::Result EmulatedController::create_cq(const SubmissionEntry& cmd) {
  const uint16_t qid = cmd.cdw10 & 0xffff;
  const uint32_t size = (cmd.cdw10 >> 16) + 1;
  const bool pc = cmd.cdw11 & 1, ien = cmd.cdw11 & 2;
  const uint16_t iv = static_cast<uint16_t>(cmd.cdw11 >> 16);
  if (qid == 0 || qid > granted_cq_ + 1u || qid >= sqs_.size() || cqs_[qid].live) {
    return {make_status(sct::kCommandSpecific, sc::kInvalidQueueId), 0};
  }
  if (size < 2 || size > config_.max_queue_entries) {
    return {make_status(sct::kCommandSpecific, sc::kInvalidQueueSize), 0};
  }
  if (!pc || ((reg_load(reg::kCc) >> cc::kIocqesShift) & 0xf) != 4) {
    return {make_status(sct::kGeneric, sc::kInvalidField), 0};
  }
  if (ien && iv >= config_.interrupt_vectors) {
    return {make_status(sct::kCommandSpecific, sc::kInvalidInterruptVector), 0};
  }
  if (cmd.prp1 & (page_bytes() - 1)) return {make_status(sct::kGeneric, sc::kInvalidPrpOffset), 0};
  auto* ring = reinterpret_cast<CompletionEntry*>(dma_.translate(cmd.prp1, size * 16ull));
  if (ring == nullptr) return {make_status(sct::kGeneric, sc::kDataTransferError), 0};
  lock_others();
  {
    CqState& c = cqs_[qid];
    std::lock_guard<std::mutex> g(c.mu);
    c.ring = ring, c.size = size, c.tail = 0, c.head = 0, c.phase = true, c.ien = ien,
    c.vector = iv;
    c.sq_refs = 0, c.live = true;
    reg_store(reg::cq_doorbell(qid, dstrd_), 0);
  }
  ++io_queues_live_;
  unlock_others();
  return {0, 0};
}

// Create I/O Submission Queue (Base §5.5).
EmulatedController::Result EmulatedController::create_sq(const SubmissionEntry& cmd) {
  const uint16_t qid = cmd.cdw10 & 0xffff;
  const uint32_t size = (cmd.cdw10 >> 16) + 1;
  const bool pc = cmd.cdw11 & 1;
  const auto prio = static_cast<QueuePriority>((cmd.cdw11 >> 1) & 3);
  const uint16_t cqid = static_cast<uint16_t>(cmd.cdw11 >> 16);
  if (qid == 0 || qid > granted_sq_ + 1u || qid >= sqs_.size() || sqs_[qid].live) {
    return {make_status(sct::kCommandSpecific, sc::kInvalidQueueId), 0};
  }
  if (size < 2 || size > config_.max_queue_entries) {
    return {make_status(sct::kCommandSpecific, sc::kInvalidQueueSize), 0};
  }
  if (cqid == 0 || cqid >= sqs_.size() || !cqs_[cqid].live) {
    return {make_status(sct::kCommandSpecific, sc::kCqInvalid), 0};
  }
  if (!pc || ((reg_load(reg::kCc) >> cc::kIosqesShift) & 0xf) != 6) {
    return {make_status(sct::kGeneric, sc::kInvalidField), 0};
  }
  if (cmd.prp1 & (page_bytes() - 1)) return {make_status(sct::kGeneric, sc::kInvalidPrpOffset), 0};
  auto* ring = reinterpret_cast<SubmissionEntry*>(dma_.translate(cmd.prp1, size * 64ull));
  if (ring == nullptr) return {make_status(sct::kGeneric, sc::kDataTransferError), 0};
  lock_others();
  reg_store(reg::sq_doorbell(qid, dstrd_), 0);
  sqs_[qid] = SqState{true, ring, size, 0, cqid, prio};
  set_sq_end();
  {
    std::lock_guard<std::mutex> g(cqs_[cqid].mu);
    ++cqs_[cqid].sq_refs;
  }
  ++io_queues_live_;
  unlock_others();
  return {0, 0};
}

// Delete I/O Submission Queue (Base §5.7) / Completion Queue (Base §5.6).
EmulatedController::Result EmulatedController::delete_queue(const SubmissionEntry& cmd, bool cq) {
  const uint16_t qid = cmd.cdw10 & 0xffff;
  const uint16_t bad_id = make_status(sct::kCommandSpecific, sc::kInvalidQueueId);
  if (qid == 0 || qid >= sqs_.size()) return {bad_id, 0};
  lock_others();
  Result r{0, 0};
  if (cq) {
    CqState& c = cqs_[qid];
    std::lock_guard<std::mutex> g(c.mu);
    if (!c.live) {
      r.status = bad_id;
    } else if (c.sq_refs != 0) {
      r.status = make_status(sct::kCommandSpecific, sc::kInvalidQueueDeletion);
    } else {
      c.live = false;
      --io_queues_live_;
    }
  } else if (!sqs_[qid].live) {
    r.status = bad_id;
  } else {
    std::lock_guard<std::mutex> g(cqs_[sqs_[qid].cqid].mu);
    --cqs_[sqs_[qid].cqid].sq_refs;
    sqs_[qid] = SqState{};
    set_sq_end();
    --io_queues_live_;
  }
  unlock_others();
  return r;
}

// ---------------------------------------------------------------------------------------------
// NVM commands (NVM §3)
// ---------------------------------------------------------------------------------------------

EmulatedController::Result EmulatedController::execute_io(Worker& w, const SubmissionEntry& cmd) {
  bump(w.io.commands, 1);
  const uint16_t bad_ns = make_status(sct::kGeneric, sc::kInvalidNamespace);
  if (cmd.opcode == io::kFlush) {
    // Base §7.1: NSID FFFFFFFFh flushes every namespace; one cache serves them all.
    if (cmd.nsid != io::kBroadcastNsid && (cmd.nsid == 0 || cmd.nsid > namespaces_.size())) {
      return {bad_ns, 0};
    }
    bump(w.io.flushes, 1);
    Status s = media_.flush();
    return {s.is_ok() ? uint16_t{0} : make_status(sct::kMedia, sc::kWriteFault), 0};
  }
  if (cmd.opcode != io::kRead && cmd.opcode != io::kWrite && cmd.opcode != io::kWriteZeroes &&
      cmd.opcode != io::kDatasetManagement) {
    return {make_status(sct::kGeneric, sc::kInvalidOpcode), 0};
  }
  if (cmd.nsid == 0 || cmd.nsid > namespaces_.size()) return {bad_ns, 0};
  const Namespace& ns = namespaces_[cmd.nsid - 1];
  if (cmd.opcode == io::kDatasetManagement) return dataset_management(w, cmd, ns);
  return read_write(w, cmd, ns, cmd.opcode != io::kRead);
}

EmulatedController::Result EmulatedController::read_write(Worker& w, const SubmissionEntry& cmd,
                                                          const Namespace& ns, bool write) {
  const uint64_t slba = cmd.cdw10 | (uint64_t{cmd.cdw11} << 32);
  const uint64_t nlb = (cmd.cdw12 & 0xffff) + 1ull;
  const bool fua = cmd.cdw12 & io::kCdw12Fua;
  if (slba >= ns.lba_count || nlb > ns.lba_count - slba) {
    return {make_status(sct::kGeneric, sc::kLbaOutOfRange), 0};
  }
  if (write && capacity_exceeded_.load(std::memory_order_relaxed) && cmd.opcode == io::kWrite) {
    faults_hit_.fetch_add(1, std::memory_order_relaxed);
    return {make_status(sct::kGeneric, sc::kCapacityExceeded), 0};
  }
  if (any_fault_.load(std::memory_order_relaxed)) {
    if (Result r = injected(cmd.nsid, slba, nlb, write); r.status != 0 || r.lost) return r;
  }
  const uint64_t offset = ns.base + (slba << ns.lba_shift);
  const uint64_t bytes = nlb << ns.lba_shift;
  Status s;
  if (cmd.opcode == io::kWriteZeroes) {
    s = (cmd.cdw12 & io::kCdw12WriteZeroesDeac) ? media_.deallocate(offset, bytes)
                                                : media_.write_zeroes(offset, bytes, fua);
  } else {
    if (bytes > max_transfer()) return {make_status(sct::kGeneric, sc::kInvalidField), 0};
    if (uint16_t st = map_prps(cmd, bytes, &w.segs)) return {st, 0};
    s = write ? media_.write(offset, w.segs, fua) : media_.read(offset, w.segs);
  }
  if (!s.is_ok()) {
    return {write ? make_status(sct::kMedia, sc::kWriteFault)
                  : make_status(sct::kMedia, sc::kUnrecoveredReadError),
            0};
  }
  if (write) {
    bump(w.io.writes, 1);
    bump(w.io.bytes_written, bytes);
  } else {
    bump(w.io.reads, 1);
    bump(w.io.bytes_read, bytes);
  }
  return {0, 0};
}

// Dataset Management (NVM §3.2.3): the range list arrives by PRP; Deallocate trims.
EmulatedController::Result EmulatedController::dataset_management(Worker& w,
                                                                  const SubmissionEntry& cmd,
                                                                  const Namespace& ns) {
  const uint32_t nr = (cmd.cdw10 & 0xff) + 1;
  if (uint16_t st = map_prps(cmd, nr * sizeof(DsmRange), &w.segs)) return {st, 0};
  DsmRange ranges[kDsmMaxRanges];
  auto* p = reinterpret_cast<uint8_t*>(ranges);
  for (const emu::Segment& sg : w.segs) std::memcpy(p, sg.ptr, sg.len), p += sg.len;
  for (uint32_t i = 0; i < nr; ++i) {
    if (ranges[i].slba >= ns.lba_count || ranges[i].lba_count > ns.lba_count - ranges[i].slba) {
      return {make_status(sct::kGeneric, sc::kLbaOutOfRange), 0};
    }
  }
  if (cmd.cdw11 & io::kDsmDeallocate) {
    for (uint32_t i = 0; i < nr; ++i) {
      Status s = media_.deallocate(ns.base + (ranges[i].slba << ns.lba_shift),
                                   uint64_t{ranges[i].lba_count} << ns.lba_shift);
      if (!s.is_ok()) return {make_status(sct::kMedia, sc::kWriteFault), 0};
    }
  }
  return {0, 0};
}

// ---------------------------------------------------------------------------------------------
// Test hooks
// ---------------------------------------------------------------------------------------------

void EmulatedController::pause(bool paused) {
  paused_.store(paused);
  if (!paused) {
    for (Worker& w : workers_) Doorbell::nudge(w.kick);
  }
}

uint64_t EmulatedController::io_sum(std::atomic<uint64_t> Worker::IoCounts::*field) const {
  uint64_t n = 0;
  for (const Worker& w : workers_) n += (w.io.*field).load(std::memory_order_relaxed);
  return n;
}

EmulatedCounters EmulatedController::counters() const {
  EmulatedCounters c;
  c.admin_commands = n_admin_.load();
  c.io_commands = io_sum(&Worker::IoCounts::commands);
  c.reads = io_sum(&Worker::IoCounts::reads);
  c.writes = io_sum(&Worker::IoCounts::writes);
  c.flushes = io_sum(&Worker::IoCounts::flushes);
  c.errors = n_errors_.load();
  c.transfer_ns = transfer_ns_.load(std::memory_order_relaxed);
  c.doorbell_kicks = 0;
  for (const Worker& w : workers_) {
    c.busy_ns += w.busy_ns.load(std::memory_order_relaxed);
    c.doorbell_kicks += w.kick.seq.value.load(port::Order::kRelaxed);
    c.parked_workers += w.kick.sleeping.value.load(port::Order::kRelaxed) != 0 ? 1 : 0;
  }
  return c;
}

void EmulatedController::inject(const Fault& f) {
  std::lock_guard<std::mutex> g(fault_mu_);
  faults_.push_back(f);
  any_fault_.store(true);
}

void EmulatedController::clear_faults() {
  std::lock_guard<std::mutex> g(fault_mu_);
  faults_.clear();
  any_fault_.store(false);
}

// What the first fault covering any LBA of [slba, slba + nlb) does to the command: an error
// status in its direction, or no completion at all; {0, 0} when none applies.
EmulatedController::Result EmulatedController::injected(uint32_t nsid, uint64_t slba, uint64_t nlb,
                                                        bool write) {
  std::lock_guard<std::mutex> g(fault_mu_);
  for (Fault& f : faults_) {
    if (f.nsid != nsid || f.times == 0) continue;
    const bool lost = f.kind == FaultKind::kNoCompletion;
    if (!lost && (f.kind == FaultKind::kWriteFault) != write) continue;
    if (slba >= f.slba + f.nlb || f.slba >= slba + nlb) continue;
    if (f.times != UINT32_MAX) --f.times;
    faults_hit_.fetch_add(1, std::memory_order_relaxed);
    if (lost) return {0, 0, true};
    return {write ? make_status(sct::kMedia, sc::kWriteFault)
                  : make_status(sct::kMedia, sc::kUnrecoveredReadError),
            0};
  }
  return {0, 0};
}

void EmulatedController::inject_fatal(bool persistent) {
  fatal_.store(persistent ? 2 : 1);
  faults_hit_.fetch_add(1, std::memory_order_relaxed);
  Doorbell::nudge(workers_[0].kick);  // worker 0 raises CSTS.CFS
}

void EmulatedController::trace_fetches(bool enable) {
  std::lock_guard<std::mutex> g(trace_mu_);
  if (enable) trace_.clear();
  tracing_.store(enable);
}

std::vector<uint16_t> EmulatedController::fetch_trace() const {
  std::lock_guard<std::mutex> g(trace_mu_);
  return trace_;
}

void EmulatedController::power_cut(double persist_probability) {
  dead_.store(true);
  stop_.store(true);
  for (Worker& w : workers_) {
    w.kick.seq.value.fetch_add(1, port::Order::kRelease);
    port::futex_wake_all(w.kick.seq.value.address());
  }
  for (Worker& w : workers_) {
    if (w.thread.joinable()) w.thread.join();
  }
  std::mt19937_64 rng(config_.seed);
  media_.lose_power(persist_probability, rng);
}

// ---------------------------------------------------------------------------------------------
// EmulatedTransport
// ---------------------------------------------------------------------------------------------

std::unique_ptr<EmulatedTransport> EmulatedTransport::create(const EmulatedConfig& config,
                                                             std::shared_ptr<BackingStore> store,
                                                             std::string* error) {
  if (store == nullptr) {
    *error = "no backing store";
    return nullptr;
  }
  auto c = std::make_unique<EmulatedController>(config, store);
  if (!c->start(error)) return nullptr;
  return std::unique_ptr<EmulatedTransport>(new EmulatedTransport(std::move(c)));
}

EmulatedTransport::EmulatedTransport(std::unique_ptr<EmulatedController> c) : c_(std::move(c)) {}
EmulatedTransport::~EmulatedTransport() = default;
std::string EmulatedTransport::name() const {
  return "emulated";
}
uint32_t EmulatedTransport::read32(uint32_t o) {
  return c_->read32(o);
}
void EmulatedTransport::write32(uint32_t o, uint32_t v) {
  c_->write32(o, v);
}
uint64_t EmulatedTransport::read64(uint32_t o) {
  return c_->read64(o);
}
void EmulatedTransport::write64(uint32_t o, uint64_t v) {
  c_->write64(o, v);
}
Doorbell EmulatedTransport::doorbell(uint16_t q, bool cq) {
  return c_->doorbell(q, cq);
}
InterruptLine* EmulatedTransport::interrupt(uint16_t v) {
  return c_->interrupt(v);
}
uint16_t EmulatedTransport::interrupt_vectors() const {
  return c_->vectors();
}
Status EmulatedTransport::dma_alloc(size_t b, DmaRegion* out) {
  return c_->dma().alloc(b, out);
}
void EmulatedTransport::dma_free(const DmaRegion& r) {
  c_->dma().free(r);
}
void EmulatedTransport::pause(bool p) {
  c_->pause(p);
}
EmulatedCounters EmulatedTransport::counters() const {
  return c_->counters();
}
void EmulatedTransport::trace_fetches(bool e) {
  c_->trace_fetches(e);
}
std::vector<uint16_t> EmulatedTransport::fetch_trace() const {
  return c_->fetch_trace();
}
void EmulatedTransport::inject(const Fault& f) {
  c_->inject(f);
}
void EmulatedTransport::inject_fatal(bool persistent) {
  c_->inject_fatal(persistent);
}
void EmulatedTransport::clear_faults() {
  c_->clear_faults();
}
void EmulatedTransport::set_capacity_exceeded(bool full) {
  c_->set_capacity_exceeded(full);
}
uint64_t EmulatedTransport::faults_hit() const {
  return c_->faults_hit();
}
void EmulatedTransport::power_cut(double p) {
  c_->power_cut(p);
}
const EmulatedConfig& EmulatedTransport::config() const {
  return c_->config();
}

}  // namespace warpfs::nvme
