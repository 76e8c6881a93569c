#include "warpfs/nvme/port.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

#include "warpfs/nvme/transport.h"

namespace warpfs::port {

void thread_yield() {
  sched_yield();
}

void sleep_ns(uint64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  nanosleep(&ts, nullptr);
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void futex_wait(uint32_t* word, uint32_t expected, uint64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000),
              static_cast<long>(timeout_ns % 1'000'000'000)};
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, timeout_ns ? &ts : nullptr, nullptr, 0);
}

void futex_wake_all(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace warpfs::port

namespace warpfs::nvme {

// The ringing side of the handshake in the device's park(). Both sides use seq_cst
// operations (the doorbell store in ring(), then this load; the device's `sleeping` store,
// then its doorbell loads), so in the single total order one side sees the other's write:
// a ring is never lost while the device goes to sleep. (No standalone fences: TSan cannot
// model them, and seq_cst operations say the same thing.)
void Doorbell::wake(DoorbellKick& k) {
  if (k.run != nullptr && k.run(k.ctx)) return;
  nudge(k);
}

void Doorbell::nudge(DoorbellKick& k) {
  if (k.sleeping.value.load(port::Order::kSeqCst) != 0) {
    k.seq.value.fetch_add(1, port::Order::kRelease);
    port::futex_wake_all(k.seq.value.address());
  }
}

// Same pattern: a waiter announces itself (seq_cst RMW) before re-reading the count; a
// raiser bumps the count (seq_cst RMW) before reading the waiter count.
void InterruptLine::wait(uint32_t seen, uint64_t timeout_ns) {
  waiters.value.fetch_add(1, port::Order::kSeqCst);
  if (count.value.load(port::Order::kSeqCst) == seen) {
    port::futex_wait(count.value.address(), seen, timeout_ns);
  }
  waiters.value.fetch_sub(1, port::Order::kRelaxed);
}

void InterruptLine::raise() {
  if (learns()) raised_ns.value.store(port::now_ns(), port::Order::kRelaxed);
  count.value.fetch_add(1, port::Order::kSeqCst);
  if (waiters.value.load(port::Order::kSeqCst) != 0) port::futex_wake_all(count.value.address());
}

// The same handshake, per key.
void InterruptLine::wait_key(uint32_t k, uint32_t seen, uint64_t timeout_ns) {
  KeyWord& w = keys_[k];
  w.waiters.fetch_add(1, port::Order::kSeqCst);
  if (w.seq.load(port::Order::kSeqCst) == seen) port::futex_wait(w.seq.address(), seen, timeout_ns);
  w.waiters.fetch_sub(1, port::Order::kRelaxed);
}

void InterruptLine::raise_key(uint32_t k) {
  KeyWord& w = keys_[k];
  // Before the bump: a waiter that sees the bump sees the time too (note_wait_since).
  if (learns()) raised_ns.value.store(port::now_ns(), port::Order::kRelaxed);
  w.seq.fetch_add(1, port::Order::kSeqCst);
  if (w.waiters.load(port::Order::kSeqCst) != 0) port::futex_wake_all(w.seq.address());
}

}  // namespace warpfs::nvme
