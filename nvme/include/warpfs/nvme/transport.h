// The boundary between the NVMe driver and a controller: register access plus DMA memory
// with bus addresses. The driver above it does not know whether it talks to the emulated
// controller in this process or to a real PCIe device through VFIO; the same tests run on
// both.
//
// Thread-safety: register reads/writes and doorbell rings may come from any thread.
// dma_alloc/dma_free are internally synchronised.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "warpfs/nvme/port.h"
#include "warpfs/nvme/status.h"

namespace warpfs::nvme {

// Memory the controller can reach: `vaddr` for the CPU, `iova` for the device (PRP entries,
// queue base addresses). The two differ: on VFIO the IOMMU maps iova to vaddr; the emulated
// bus uses a distinct address space too, so a driver that leaks a virtual address into a
// command is caught.
struct DmaRegion {
  void* vaddr = nullptr;
  uint64_t iova = 0;
  size_t bytes = 0;
};

// What it takes to wake a controller that sleeps until a doorbell rings. Real hardware
// needs none of this (a doorbell write is an MMIO store the device sees); the emulated
// controller parks its threads on a futex when idle, and a ring kicks it.
struct DoorbellKick {
  port::Padded<port::Atomic<uint32_t>> sleeping;  // non-zero while the device thread is parked
  port::Padded<port::Atomic<uint32_t>> seq;       // futex word: bumped by each kick
  // An emulated controller that runs commands in the ringing thread (EmulatedConfig::
  // inline_io) sets this: ring() calls run(ctx) first, and kicks the device thread only when
  // run() returns false (another thread holds the device, or work is left for later).
  bool (*run)(void* ctx) = nullptr;
  void* ctx = nullptr;
};

// One doorbell register. ring() is the single write the virtual-queue protocol does per batch.
struct Doorbell {
  port::Atomic<uint32_t>* reg = nullptr;  // inside BAR0 (or the emulated register file)
  DoorbellKick* kick = nullptr;           // null on real hardware
  bool mmio = false;                      // reg is a device register (VFIO's BAR0 mapping)

  WARPFS_HD void ring(uint32_t value) const {
#if !defined(__CUDA_ARCH__)
    if (mmio) {
      // A device register takes a plain 32-bit store: a locked RMW (what a seq_cst store
      // compiles to on x86) would be a locked read-write transaction on the bus. The SQ
      // entries written before stay before it: on x86 stores to WB and UC memory keep
      // program order (a compiler barrier is enough, as in Linux's writel()); arm64 takes
      // a store barrier (not tested; it would also need the CQE loads ordered).
      port::mmio_write32(reg->address(), value);
      return;
    }
#endif
    // Release (implied by seq_cst): the SQ entries (or our consumption of CQ entries)
    // written before this ring are visible to the device when it sees the new tail (head).
    // Seq_cst because the emulated device's park() pairs with it (see wake()); on x86 it is
    // one locked store, the same cost as an MMIO write's serialisation.
    reg->store(value, port::Order::kSeqCst);
#if !defined(__CUDA_ARCH__)
    if (kick != nullptr) wake(*kick);
#endif
  }
  // A ring's notice to an emulated device: run it here (DoorbellKick::run), else nudge().
  static void wake(DoorbellKick& k);
  static void nudge(DoorbellKick& k);  // Dekker-style handshake with the parked device thread
};

// Completion notification (an MSI-X vector). `count` increases each time the controller
// posts completions to a CQ bound to this vector; a waiter reads it, re-checks its CQ, and
// sleeps until the count changes. VFIO's eventfd is turned into the same counter by the
// transport's interrupt thread.
//
// Targeted wake-ups. A raise() wakes every thread asleep on `count`: with a thread per
// request in flight, each completion would wake them all, and all but one go back to sleep
// (a thundering herd: at QD32, about 32 switches per command). Where the raiser knows which
// commands it completed (the emulated controller writes the CQEs itself), the transport sets
// `keyed` before the line is used, and the raiser also calls raise_key(key(sqid, cid)) for
// each CQE it posts. A waiter that knows the command it waits for then sleeps on that key's
// word alone (wait_key) and is woken by its own completion only. Keys are hashed: two
// commands on one key cost a spurious wake-up, never a lost one. A VFIO interrupt names no
// command, so its lines stay unkeyed and waiters use `count`.
//
// When to sleep. A waiter spins briefly, then yields, then sleeps (port::Backoff). Yielding
// first pays where a completion is tens of microseconds away and an idle CPU is costly to
// wake (a virtual machine's halted vCPU): on the 2-core VM, with 80 µs of emulated latency,
// sleeping right after the spin cost 0.7x at QD32. Where a running host thread posts the
// completion within microseconds (the emulated controller run inline with no latency), the
// yields take the CPU from that very thread: there a keyed waiter sleeps as soon as its spin
// is over (`prompt`), and QD32 O_DIRECT reads through FUSE ran 1.4x faster on that VM.
// Where the completion is that far away, the spin itself is waste: the waiter burns the CPU
// that other workers (and the emulated controller's thread) would run on, while a yield
// costs little on an idle core. So a waiter on a line that is not prompt yields from the
// start (back_off): with 80 µs of emulated latency, QD32 O_DIRECT 4 KiB reads and writes
// through FUSE ran 1.3x faster on that VM. It yields as many times as it would have spun
// and yielded, so it blocks no sooner: skipping the spin steps instead made 16-core QD1
// reads with 20 µs of latency 0.83x, each completion then needing a wake-up.
//
// Far completions. Yielding through all those steps pays only where the completion comes
// within them. Where it comes later (80 µs of emulated latency on the 2-core VM: 74 yields
// take about as long), the waiter burns a CPU yielding and then sleeps all the same, just
// before its completion, paying for both: QD1 O_DIRECT reads ran at 4.8-5.6 K IOPS with 207
// µs of daemon CPU each, against 8.1-9.1 K and 104-111 µs for waiters that slept after 8
// steps; at QD32 the 8 steps were as fast as the 74 or faster. So the line learns how long
// its waiters wait (`wait_us`, from a first poll in vain to the completion's raise:
// note_wait_since), and where that is kFarUs or more, a waiter sleeps after kFarSteps steps.
// Where completions come sooner (a 20 µs device) the waits stay short and the waiters keep
// yielding. A wait ends at the line's last raise (`raised_ns`), not when the waiter got back
// its CPU: a sleeper's wake-up would otherwise count, and a line made far by one slow stretch
// would stay far on its sleepers' wake-ups alone. A sample counts as at most kFarUs * 2, so
// one preemption of the device's thread moves the estimate by kFarUs / 4 at most. Keyed
// lines only: on a line that is not, each completion wakes every sleeper of the line, and
// more sleepers would make that herd larger (VFIO; not measured).
struct InterruptLine {
  static constexpr uint32_t kKeys = 128;
  static constexpr uint32_t kFarUs = 40;
  static constexpr uint32_t kFarSteps = 8;

  port::Padded<port::Atomic<uint32_t>> count;
  port::Padded<port::Atomic<uint32_t>> waiters;
  // A moving average of how long waiters waited (µs, each sample at most kFarUs * 2;
  // note_wait). Relaxed loads and stores from every waiter: a lost update loses one sample of
  // an estimate, nothing more.
  port::Padded<port::Atomic<uint32_t>> wait_us;
  // When a completion was last raised (port::now_ns), on a line that learns(): stored
  // relaxed by the raisers, read by waiters (note_wait_since); a stale or torn-in-time value
  // only makes one sample end later, at the waiter's own clock.
  port::Padded<port::Atomic<uint64_t>> raised_ns;
  // Set once by the transport before any queue uses the line; read-only afterwards.
  bool keyed = false;
  bool prompt = false;  // completions come from a running host thread, without delay

  // Host only: whether a waiter that has polled in vain (backing off with `b`) should sleep.
  bool sleep_now(const port::Backoff& b) const {
    if (keyed && prompt) return !b.spinning();
    if (learns() && far()) return b.steps() >= kFarSteps;
    return b.should_block();
  }
  // Host only: whether this line's completions typically come kFarUs or more after a waiter
  // first polls for them in vain.
  bool far() const { return wait_us.value.load(port::Order::kRelaxed) >= kFarUs; }
  // Whether sleep_now() consults the estimate, so that waiters should note_wait(): a keyed
  // line that is not prompt.
  bool learns() const { return keyed && !prompt; }
  // Host only: a waiter that first polled in vain at `since_ns` (port::now_ns) has its
  // completion: the wait ends at the line's last raise if that came after `since_ns`, else
  // now. REQUIRES (unchecked: only the time is wasted otherwise): learns().
  void note_wait_since(uint64_t since_ns) {
    uint64_t end = port::now_ns();
    const uint64_t raised = raised_ns.value.load(port::Order::kRelaxed);
    if (raised > since_ns && raised < end) end = raised;
    note_wait(end > since_ns ? end - since_ns : 0);
  }
  // Host only: one sample, a wait of `ns`. REQUIRES (unchecked): learns().
  void note_wait(uint64_t ns) {
    const auto us = static_cast<int64_t>(std::min<uint64_t>(ns / 1000, kFarUs * 2));
    const int64_t old = wait_us.value.load(port::Order::kRelaxed);
    // An eighth of the way to the sample, and at least 1 µs, so that the average reaches a
    // steady sample instead of stopping up to 7 µs short of it (on either side of kFarUs).
    const int64_t d = us - old;
    const int64_t next = old + (d > 0 ? (d + 7) / 8 : (d - 7) / 8);
    wait_us.value.store(static_cast<uint32_t>(next), port::Order::kRelaxed);
  }

  // Host only: one step of a waiter's back-off where sleep_now(b) said no.
  void back_off(port::Backoff& b) const {
    if (!prompt) b.yield_only();
    b.pause();
  }

  // Host only. Sleeps until count != seen, a timeout, or a spurious wake-up.
  void wait(uint32_t seen, uint64_t timeout_ns);
  // Host only: called by whoever posted completions.
  void raise();

  // The key of command `cid` of submission queue `sqid`.
  static uint32_t key(uint16_t sqid, uint16_t cid) {
    return (uint32_t{cid} + uint32_t{sqid} * 37u) & (kKeys - 1);
  }
  // The key's sequence, to pass to wait_key: read it before the last check of the CQ.
  uint32_t key_seq(uint32_t k) const { return keys_[k].seq.load(port::Order::kAcquire); }
  // Host only. Sleeps until key `k` is raised after `seen` was read, a timeout, or a spurious
  // wake-up. REQUIRES: keyed.
  void wait_key(uint32_t k, uint32_t seen, uint64_t timeout_ns);
  // Host only: the completion of a command with key `k` is visible in its CQ.
  void raise_key(uint32_t k);

 private:
  struct alignas(port::kCacheLine) KeyWord {
    port::Atomic<uint32_t> seq;      // futex word: bumped by each raise_key
    port::Atomic<uint32_t> waiters;  // threads in wait_key on this word
  };
  KeyWord keys_[kKeys];
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;

  // Controller registers (Base §3.1.4). Offsets and widths as the spec defines them.
  virtual uint32_t read32(uint32_t offset) = 0;
  virtual void write32(uint32_t offset, uint32_t value) = 0;
  virtual uint64_t read64(uint32_t offset) = 0;
  virtual void write64(uint32_t offset, uint64_t value) = 0;

  // The doorbell for queue `qid` (CQ head if `cq`, else SQ tail). The pointer stays valid
  // for the transport's lifetime.
  virtual Doorbell doorbell(uint16_t qid, bool cq) = 0;

  // The interrupt line for MSI-X vector `vector`, or null if the transport has none (the
  // caller then polls with back-off).
  virtual InterruptLine* interrupt(uint16_t vector) = 0;
  virtual uint16_t interrupt_vectors() const = 0;

  // Zero-filled, page-aligned memory the controller can DMA to and from.
  virtual Status dma_alloc(size_t bytes, DmaRegion* out) = 0;
  virtual void dma_free(const DmaRegion& region) = 0;
};

}  // namespace warpfs::nvme
