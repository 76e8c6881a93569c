// The portability layer for the lock-light core (virtual queues, queue mapper, cache).
//
// The core is plain data manipulated through `Atomic<T>`, which wraps std::atomic_ref on the
// host and cuda::atomic_ref under nvcc. Every ordering is named at the call site; the protocol
// headers say why each one was chosen. Nothing here allocates, throws or takes a std::mutex.
//
// Scope (CUDA only; the host ignores it). An atomic synchronises with the threads its scope
// names. The default, Scope::kSystem, is for memory the host also touches (queues shared with
// the host-side device model, doorbells): it compiles to .sys operations and system-wide
// fences. Scope::kDevice is for memory only GPU threads touch (the GPU cache's state words,
// tags and set locks): .gpu operations, whose release fences need not wait for PCIe writes
// (BaM §2.1.1 uses the narrowest scope that is correct, with acquire/release orderings).
//
// Thread-safety: everything in this header is safe to use from any number of threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda/atomic>
#define WARPFS_HD __host__ __device__
#else
#define WARPFS_HD
#endif

// WARPFS_TSAN: 1 in a ThreadSanitizer build (GCC's __SANITIZE_THREAD__, Clang's
// __has_feature), else 0: for the few places that must take another path under it.
#if defined(__SANITIZE_THREAD__)
#define WARPFS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WARPFS_TSAN 1
#endif
#endif
#ifndef WARPFS_TSAN
#define WARPFS_TSAN 0
#endif

namespace warpfs::port {

// One shared atomic per line avoids false sharing: 64 B on x86 CPUs, 128 B on NVIDIA GPUs
// (their L2 sectors are 32 B but coherence and atomics work on 128 B lines).
#if defined(__CUDACC__)
inline constexpr std::size_t kCacheLine = 128;
#else
inline constexpr std::size_t kCacheLine = 64;
#endif

enum class Order { kRelaxed, kAcquire, kRelease, kAcqRel, kSeqCst };
enum class Scope { kSystem, kDevice };

#if defined(__CUDACC__)
WARPFS_HD constexpr cuda::std::memory_order to_std(Order o) {
  switch (o) {
    case Order::kRelaxed:
      return cuda::std::memory_order_relaxed;
    case Order::kAcquire:
      return cuda::std::memory_order_acquire;
    case Order::kRelease:
      return cuda::std::memory_order_release;
    case Order::kAcqRel:
      return cuda::std::memory_order_acq_rel;
    default:
      return cuda::std::memory_order_seq_cst;
  }
}
template <typename T, Scope S = Scope::kSystem>
using AtomicRef = cuda::atomic_ref<T, S == Scope::kSystem ? cuda::thread_scope_system
                                                          : cuda::thread_scope_device>;
#else
constexpr std::memory_order to_std(Order o) {
  switch (o) {
    case Order::kRelaxed:
      return std::memory_order_relaxed;
    case Order::kAcquire:
      return std::memory_order_acquire;
    case Order::kRelease:
      return std::memory_order_release;
    case Order::kAcqRel:
      return std::memory_order_acq_rel;
    default:
      return std::memory_order_seq_cst;
  }
}
template <typename T, Scope S = Scope::kSystem>
using AtomicRef = std::atomic_ref<T>;
#endif

// A plain integer that is only ever accessed atomically. Trivially constructible, so it can
// live in shared or device memory that was zero-filled rather than constructed.
template <typename T, Scope S = Scope::kSystem>
class Atomic {
  static_assert(std::is_integral_v<T>, "Atomic<T> holds integers");

 public:
  WARPFS_HD T load(Order o) const { return AtomicRef<T, S>(const_cast<T&>(v_)).load(to_std(o)); }
  WARPFS_HD void store(T x, Order o) { AtomicRef<T, S>(v_).store(x, to_std(o)); }
  WARPFS_HD T fetch_add(T x, Order o) { return AtomicRef<T, S>(v_).fetch_add(x, to_std(o)); }
  WARPFS_HD T fetch_sub(T x, Order o) { return AtomicRef<T, S>(v_).fetch_sub(x, to_std(o)); }
  WARPFS_HD T fetch_or(T x, Order o) { return AtomicRef<T, S>(v_).fetch_or(x, to_std(o)); }
  WARPFS_HD T fetch_and(T x, Order o) { return AtomicRef<T, S>(v_).fetch_and(x, to_std(o)); }
  WARPFS_HD T fetch_xor(T x, Order o) { return AtomicRef<T, S>(v_).fetch_xor(x, to_std(o)); }
  WARPFS_HD T exchange(T x, Order o) { return AtomicRef<T, S>(v_).exchange(x, to_std(o)); }
  // On failure `expected` receives the current value.
  WARPFS_HD bool compare_exchange(T& expected, T desired, Order o) {
    return AtomicRef<T, S>(v_).compare_exchange_strong(expected, desired, to_std(o),
                                                       to_std(Order::kRelaxed));
  }
  // Raises the value to at least x; returns the previous value.
  WARPFS_HD T fetch_max(T x, Order o) {
    T cur = load(Order::kRelaxed);
    while (cur < x && !compare_exchange(cur, x, o)) {
    }
    return cur;
  }
  // Plain access for single-threaded set-up only (before the structure is shared).
  WARPFS_HD T& unsafe_ref() { return v_; }
  // The address, for futex waits on 32-bit words.
  T* address() { return &v_; }

 private:
  T v_;
};
static_assert(std::is_trivially_default_constructible_v<Atomic<uint32_t>>);
static_assert(sizeof(Atomic<uint64_t>) == 8);

// A value alone on its cache line.
template <typename T>
struct alignas(kCacheLine) Padded {
  T value;
};
static_assert(sizeof(Padded<Atomic<uint32_t>>) == kCacheLine);

WARPFS_HD inline void fence_seq_cst() {
#if defined(__CUDACC__)
  cuda::atomic_thread_fence(cuda::std::memory_order_seq_cst, cuda::thread_scope_system);
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

// A store to a device register (MMIO), ordered after every earlier store to memory. On x86
// stores to write-back and uncached memory stay in program order, so a compiler barrier is
// all it takes (as in Linux's writel()); arm64 needs the outer-shareable store barrier. (No
// std::atomic_thread_fence: TSan cannot model fences, and this is not a thread-to-thread
// ordering anyway.)
inline void mmio_write32(uint32_t* reg, uint32_t value) {
#if defined(__aarch64__)
  asm volatile("dmb oshst" ::: "memory");
#else
  asm volatile("" ::: "memory");
#endif
  *static_cast<volatile uint32_t*>(reg) = value;
}

// One iteration of a spin-wait loop: tells the core (or the SM scheduler) we are waiting.
WARPFS_HD inline void cpu_relax() {
#if defined(__CUDA_ARCH__)
  __nanosleep(32);
#elif defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Host-only: give the core away / sleep briefly. Declared here, defined in port.cc.
void thread_yield();
void sleep_ns(uint64_t ns);
uint64_t now_ns();  // CLOCK_MONOTONIC

// Futex on a 32-bit word (host only). `wait` returns when *word != expected, on a wake-up,
// on timeout (timeout_ns == 0: no timeout) or spuriously: callers re-check their condition.
void futex_wait(uint32_t* word, uint32_t expected, uint64_t timeout_ns);
void futex_wake_all(uint32_t* word);

// Spin briefly, then yield, then sleep with exponential growth. A waiter on a 2-core machine
// must not starve the thread it waits for (the emulated controller, or a lock holder that
// was preempted): the thesis saw seconds of tail latency from exactly that (§6.4).
class Backoff {
 public:
  WARPFS_HD void pause() {
#if defined(__CUDA_ARCH__)
    __nanosleep(ns_);
    if (ns_ < 4096) ns_ *= 2;
#else
    if (step_ < kSpin && !yield_only_) {
      for (uint32_t i = 0; i < (1u << (step_ < 6 ? step_ : 6)); ++i) cpu_relax();
    } else if (step_ < kSpin + kYield) {
      thread_yield();
    } else {
      sleep_ns(ns_);
      if (ns_ < kMaxSleepNs) ns_ *= 2;
    }
    ++step_;
#endif
  }
  WARPFS_HD uint32_t steps() const {
    return step_;
  }
  WARPFS_HD bool spinning() const {
    return step_ < kSpin;
  }
  // Yields where it would spin: the steps, and so the time before should_block(), stay.
  WARPFS_HD void yield_only() {
    yield_only_ = true;
  }
  // Past spinning and yielding: a waiter with something to block on (an interrupt) should
  // block now rather than sleep blindly.
  WARPFS_HD bool should_block() const {
    return step_ >= kSpin + kYield;
  }
  // Past spinning and yielding at once: for a waiter with other work to do (the FUSE
  // daemon's read reapers), which should block on an interrupt rather than spin for one.
  WARPFS_HD void block_now() {
    step_ = kSpin + kYield;
  }
  WARPFS_HD void reset() {
    step_ = 0;
    ns_ = kFirstSleepNs;
    yield_only_ = false;
  }

 private:
  static constexpr uint32_t kSpin = 10;
  static constexpr uint32_t kYield = 64;
  static constexpr uint32_t kFirstSleepNs = 1000;
  static constexpr uint32_t kMaxSleepNs = 200000;
  uint32_t step_ = 0;
  uint32_t ns_ = kFirstSleepNs;
  bool yield_only_ = false;
};

// A fair FIFO lock (ticket lock): waiters are served in arrival order, so no waiter starves
// (the thesis's unfair spinlocks produced "locked hits" over 100 ms, §6.3). `next` and
// `serving` live on separate lines: arriving threads do not disturb the holder's line.
// Trivially constructible; zero-filled memory is an unlocked lock. `S`: see Scope above.
template <Scope S>
struct BasicTicketLock {
  Padded<Atomic<uint32_t, S>> next;
  Padded<Atomic<uint32_t, S>> serving;

  WARPFS_HD void lock() {
    const uint32_t me = next.value.fetch_add(1, Order::kRelaxed);
    Backoff b;
    // Acquire: the holder's writes before unlock() are visible once we are served.
    while (serving.value.load(Order::kAcquire) != me) b.pause();
  }
  // Acquire: the holder's writes before unlock() are visible once we hold it.
  WARPFS_HD bool try_lock() { return try_take(Order::kRelaxed, Order::kAcquire); }
  // Release: publishes the critical section to the next holder.
  WARPFS_HD void unlock() { give_up(Order::kRelease); }
  // try_lock and unlock as seq_cst accesses of `serving`, for a hand-off that must be ordered
  // against the caller's own seq_cst accesses (VirtualQueue::drain_head). A lock taken this
  // way is released with unlock_seq_cst.
  WARPFS_HD bool try_lock_seq_cst() { return try_take(Order::kSeqCst, Order::kSeqCst); }
  WARPFS_HD void unlock_seq_cst() { give_up(Order::kSeqCst); }

 private:
  // Only takes a ticket when nobody holds or waits: next == serving.
  WARPFS_HD bool try_take(Order load, Order take) {
    uint32_t s = serving.value.load(load);
    uint32_t n = s;
    return next.value.compare_exchange(n, s + 1, take);
  }
  // Only the holder writes `serving`.
  WARPFS_HD void give_up(Order o) {
    serving.value.store(serving.value.load(Order::kRelaxed) + 1, o);
  }
};

using TicketLock = BasicTicketLock<Scope::kSystem>;

// RAII holder for TicketLock.
class TicketGuard {
 public:
  WARPFS_HD explicit TicketGuard(TicketLock& l) : l_(l) { l_.lock(); }
  WARPFS_HD ~TicketGuard() { l_.unlock(); }
  TicketGuard(const TicketGuard&) = delete;
  TicketGuard& operator=(const TicketGuard&) = delete;

 private:
  TicketLock& l_;
};

WARPFS_HD constexpr bool is_pow2(uint64_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

}  // namespace warpfs::port
