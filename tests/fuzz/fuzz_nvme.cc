// libFuzzer target: the emulated NVMe controller (nvme/src/emu_controller.cc) driven by a
// hostile host through its only surfaces, as a real device is: register writes (CC, AQA,
// ASQ/ACQ, doorbells with any value) and submission entries with any fields, in DMA memory
// whose contents the input also controls.
//
// Promises checked besides "no crash, no sanitizer report, no hang" (libFuzzer -timeout):
//   - the controller touches no memory outside the DMA regions: the region has inaccessible
//     guard pages on both sides (the model's DMA memory is mmap'ed, which ASan does not
//     watch), and ASan watches the heap;
//   - a controller reset always brings it back: after whatever the input did, CC.EN = 0,
//     then a fresh admin queue and CC.EN = 1, and an Identify completes successfully.
//
// Input: byte 0 configures the controller (bit 0: two worker threads, bit 1: completion
// latency with jitter, bit 2: shuffled completions, bit 3: no weighted round robin, bit 4:
// no volatile write cache, bit 5: doorbell stride 1); then operations, each an opcode
// byte (Op below) and its arguments, until the input ends.
// WARPFS_FUZZ_VERBOSE=1 prints each command's completion status (for triage).
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "warpfs/nvme/emulated.h"
#include "warpfs/nvme/spec.h"

using namespace warpfs::nvme;

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kDmaPages = 16;  // admin SQ, admin CQ, 4 I/O pairs (SQ, CQ), 6 data pages
constexpr size_t kDataPage = 10;
constexpr uint16_t kIoQueues = 4;
constexpr uint32_t kEntries = 64;        // CAP.MQES + 1: one SQ fills a page
constexpr uint64_t kWaitNs = 5'000'000;  // for a completion: the model takes microseconds

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "\nwarpfs fuzz: promise broken: %s\n", what.c_str());
  std::abort();
}

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

struct Reader {
  const uint8_t* p;
  size_t n;
  bool empty() const { return n == 0; }
  // Little-endian, zero-filled past the end of the input.
  uint64_t get(size_t bytes) {
    uint64_t v = 0;
    const size_t k = std::min(bytes, n);
    std::memcpy(&v, p, k);
    p += k, n -= k;
    return v;
  }
  void bytes(void* out, size_t len) {
    std::memset(out, 0, len);
    const size_t k = std::min(len, n);
    std::memcpy(out, p, k);
    p += k, n -= k;
  }
};

enum Op : uint8_t {
  kWrite32,     // u16 offset, u32 value
  kWrite64,     // u8 register (ASQ, ACQ, CAP), u8 into-DMA flag, u64 value
  kEnable,      // u8: admin queue size, AMS
  kDisable,     // u8: CC.SHN bits
  kPoke,        // u16 offset in the DMA region, u8 length, bytes
  kAdmin,       // 64-byte SQE, u8 fix-ups (Fix)
  kIo,          // u8 queue, 64-byte SQE, u8 fix-ups
  kCreatePair,  // u8 queue, u8 size, u8 CQ flags (IEN, vector), u8 priority
  kDeletePair,  // u8 queue
  kRing,        // u8 queue, u8 CQ flag, u32 value: a doorbell write the host's state ignores
  kSleep,       // u8: up to 1.5 ms
  kRead,        // u16 offset: register reads
  kPowerCut,    // u8 persistence: ends the input
  kOps
};

enum Fix : uint8_t {
  kPrp1InDma = 1,    // PRP1 = the region + offset (dword aligned)
  kPrp2InDma = 2,    // PRP2 = the region + offset (qword aligned)
  kValidNsid = 4,    // NSID 1..3 (3 does not exist)
  kKnownOpcode = 8,  // an opcode this controller implements
  kSmallRange = 16,  // a small LBA range, FUA maybe
  kPrps = 32,        // PSDT = 0, FUSE = 0
};

class Host {
 public:
  explicit Host(std::unique_ptr<EmulatedTransport> t) : t_(std::move(t)) {
    if (!t_->dma_alloc(kDmaPages * kPage, &dma_).is_ok()) broken("dma_alloc failed");
    // Guard pages: a stray access just outside the region faults (SEGV is a crash to libFuzzer).
    // MAP_FIXED_NOREPLACE: where something else is mapped already, go without.
    auto* base = static_cast<uint8_t*>(dma_.vaddr);
    guard_[0] = mmap(base - kPage, kPage, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    guard_[1] = mmap(base + dma_.bytes, kPage, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  }
  ~Host() {
    t_.reset();  // the controller's threads stop before the memory goes
    for (void* g : guard_) {
      if (g != MAP_FAILED) munmap(g, kPage);
    }
  }

  void run(Reader r) {
    while (!r.empty()) {
      const uint8_t op = static_cast<uint8_t>(r.get(1) % kOps);
      switch (op) {
        case kWrite32: {
          const auto off = static_cast<uint32_t>(r.get(2) % 0x1400);
          t_->write32(off, static_cast<uint32_t>(r.get(4)));
          break;
        }
        case kWrite64: {
          static const uint32_t regs[] = {reg::kAsq, reg::kAcq, reg::kCap};
          const uint32_t off = regs[r.get(1) % 3];
          const bool in_dma = r.get(1) & 1;
          const uint64_t v = r.get(8);
          t_->write64(off, in_dma ? dma_.iova + v % dma_.bytes : v);
          break;
        }
        case kEnable:
          enable(static_cast<uint8_t>(r.get(1)));
          break;
        case kDisable:
          disable(static_cast<uint32_t>(r.get(1) & 3) << cc::kShnShift);
          break;
        case kPoke: {
          const size_t off = r.get(2) % dma_.bytes;
          const size_t len = std::min<size_t>(r.get(1) + 1, dma_.bytes - off);
          r.bytes(static_cast<uint8_t*>(dma_.vaddr) + off, len);
          break;
        }
        case kAdmin:
        case kIo: {
          const uint16_t qid = op == kAdmin ? 0 : static_cast<uint16_t>(1 + r.get(1) % kIoQueues);
          SubmissionEntry c;
          r.bytes(&c, sizeof c);
          fix(&c, static_cast<uint8_t>(r.get(1)), qid == 0);
          submit(qid, c);
          break;
        }
        case kCreatePair: {
          const auto qid = static_cast<uint16_t>(1 + r.get(1) % kIoQueues);
          const uint32_t size = 2 + r.get(1) % (kEntries - 1);
          const auto cq_flags = static_cast<uint32_t>(r.get(1));
          const auto prio = static_cast<uint32_t>(r.get(1) & 3);
          create_pair(qid, size, cq_flags, prio);
          break;
        }
        case kDeletePair:
          delete_pair(static_cast<uint16_t>(1 + r.get(1) % kIoQueues));
          break;
        case kRing: {
          const auto qid = static_cast<uint16_t>(r.get(1));
          const bool cq = r.get(1) & 1;
          const Doorbell d = t_->doorbell(qid, cq);
          const auto v = static_cast<uint32_t>(r.get(4));
          if (d.reg != nullptr) d.ring(v);
          break;
        }
        case kSleep:
          std::this_thread::sleep_for(std::chrono::microseconds(r.get(1) % 16 * 100));
          break;
        case kRead: {
          const auto off = static_cast<uint32_t>(r.get(2) % 0x1400);
          (void)t_->read32(off);
          (void)t_->read64(off & ~7u);
          break;
        }
        case kPowerCut:
          t_->power_cut(static_cast<double>(r.get(1)) / 255.0);
          return;  // the device is gone: nothing more to check
      }
    }
    recover();
  }

 private:
  struct Queue {
    bool live = false;
    size_t sq_page = 0, cq_page = 0;
    uint32_t size = 0, tail = 0, head = 0;
    bool phase = true;
  };

  uint8_t* page(size_t i) { return static_cast<uint8_t*>(dma_.vaddr) + i * kPage; }
  uint32_t csts() { return t_->read32(reg::kCsts); }

  // Waits until (CSTS & mask) == want; false after `ns`.
  bool wait_csts(uint32_t mask, uint32_t want, uint64_t ns) {
    const uint64_t end = now_ns() + ns;
    while ((csts() & mask) != want) {
      if (now_ns() > end) return false;
      std::this_thread::yield();
    }
    return true;
  }

  void fix(SubmissionEntry* c, uint8_t f, bool admin) {
    if (f & kPrp1InDma) c->prp1 = dma_.iova + ((c->prp1 % dma_.bytes) & ~3ull);
    if (f & kPrp2InDma) c->prp2 = dma_.iova + ((c->prp2 % dma_.bytes) & ~7ull);
    if (f & kValidNsid) c->nsid = 1 + c->nsid % 3;
    if (f & kKnownOpcode) {
      static const uint8_t a[] = {admin::kDeleteIoSq, admin::kCreateIoSq,  admin::kGetLogPage,
                                  admin::kDeleteIoCq, admin::kCreateIoCq,  admin::kIdentify,
                                  admin::kAbort,      admin::kSetFeatures, admin::kGetFeatures};
      static const uint8_t i[] = {io::kFlush, io::kWrite, io::kRead, io::kWriteZeroes,
                                  io::kDatasetManagement};
      c->opcode = admin ? a[c->opcode % sizeof a] : i[c->opcode % sizeof i];
    }
    if (f & kSmallRange) {
      c->cdw10 %= 4096;
      c->cdw11 = 0;
      c->cdw12 &= io::kCdw12Fua | 0x3f;
    }
    if (f & kPrps) c->flags = 0;
  }

  // Puts `c` at the host's tail of SQ `qid`, rings, and reaps what the CQ gets (bounded).
  // Returns the status of the completion with `c`'s CID, or -1 if none came.
  int submit(uint16_t qid, SubmissionEntry c) {
    Queue& q = q_[qid];
    if (!q.live) return -1;
    c.cid = ++cid_;
    std::memcpy(page(q.sq_page) + size_t{q.tail} * sizeof c, &c, sizeof c);
    q.tail = (q.tail + 1) % q.size;
    t_->doorbell(qid, false).ring(q.tail);
    const uint64_t end = now_ns() + kWaitNs;
    int status = -1;
    while (status < 0 && now_ns() < end) {
      CompletionEntry e;
      if (!reap(qid, &e)) {
        if (csts() & csts::kCfs) break;
        std::this_thread::yield();
        continue;
      }
      if (e.cid == c.cid) status = e.status >> 1;
    }
    CompletionEntry e;
    while (reap(qid, &e)) {
    }
    if (verbose_) std::fprintf(stderr, "sq %u opcode %02x: status %x\n", qid, c.opcode, status);
    return status;
  }

  // The next completion of queue `qid`'s CQ, if the device posted one.
  bool reap(uint16_t qid, CompletionEntry* e) {
    Queue& q = q_[qid];
    auto* slot = page(q.cq_page) + size_t{q.head} * sizeof *e;
    uint32_t dw3;
    __atomic_load(reinterpret_cast<uint32_t*>(slot + kCqeDw3Offset), &dw3, __ATOMIC_ACQUIRE);
    if (((dw3 >> 16) & 1) != (q.phase ? 1u : 0u)) return false;
    std::memcpy(e, slot, sizeof *e);
    if (++q.head == q.size) q.head = 0, q.phase = !q.phase;
    t_->doorbell(qid, true).ring(q.head);
    return true;
  }

  void disable(uint32_t shn) {
    t_->write32(reg::kCc, shn);
    (void)wait_csts(csts::kRdy, 0, kWaitNs);
    for (Queue& q : q_) q = Queue{};
  }

  // The admin queue at pages 0 (SQ) and 1 (CQ), then CC.EN = 1 (Base §3.5.1).
  void enable(uint8_t b, uint64_t wait_ns = kWaitNs) {
    const uint32_t size = 2 + b % (kEntries - 1);
    std::memset(page(0), 0, 2 * kPage);
    t_->write32(reg::kAqa, (size - 1) | ((size - 1) << 16));
    t_->write64(reg::kAsq, dma_.iova);
    t_->write64(reg::kAcq, dma_.iova + kPage);
    const uint32_t ams = (b & 0x80) ? cc::kAmsWrr << cc::kAmsShift : 0;
    t_->write32(reg::kCc, cc::kEn | (6u << cc::kIosqesShift) | (4u << cc::kIocqesShift) | ams);
    for (Queue& q : q_) q = Queue{};
    if (!wait_csts(csts::kRdy | csts::kCfs, csts::kRdy, wait_ns)) return;
    q_[0] = Queue{true, 0, 1, size, 0, 0, true};
  }

  // I/O queue pair `qid` at pages 2*qid (SQ) and 2*qid + 1 (CQ).
  void create_pair(uint16_t qid, uint32_t size, uint32_t cq_flags, uint32_t prio) {
    SubmissionEntry c{};
    c.opcode = admin::kSetFeatures;
    c.cdw10 = fid::kNumberOfQueues;
    c.cdw11 = (kIoQueues - 1) | ((kIoQueues - 1u) << 16);
    submit(0, c);
    std::memset(page(2 * qid), 0, 2 * kPage);
    c = SubmissionEntry{};
    c.opcode = admin::kCreateIoCq;
    c.prp1 = dma_.iova + 2 * qid * kPage + kPage;
    c.cdw10 = qid | ((size - 1) << 16);
    c.cdw11 = 1 | (cq_flags & 2) | ((cq_flags >> 4) % 6 << 16);  // PC, IEN, vector (5 exist)
    if (submit(0, c) != 0) return;
    c = SubmissionEntry{};
    c.opcode = admin::kCreateIoSq;
    c.prp1 = dma_.iova + 2 * qid * kPage;
    c.cdw10 = qid | ((size - 1) << 16);
    c.cdw11 = 1 | (prio << 1) | (uint32_t{qid} << 16);
    if (submit(0, c) != 0) return;
    q_[qid] = Queue{true, size_t{2} * qid, size_t{2} * qid + 1, size, 0, 0, true};
  }

  void delete_pair(uint16_t qid) {
    SubmissionEntry c{};
    c.opcode = admin::kDeleteIoSq;
    c.cdw10 = qid;
    submit(0, c);
    c.opcode = admin::kDeleteIoCq;
    submit(0, c);
    q_[qid] = Queue{};
  }

  // Whatever happened, a reset and a fresh admin queue bring the controller back.
  void recover() {
    t_->write32(reg::kCc, 0);
    if (!wait_csts(csts::kRdy, 0, 1'000'000'000))
      broken("CC.EN = 0 did not clear CSTS.RDY within 1 s");
    std::memset(dma_.vaddr, 0, dma_.bytes);
    enable(kEntries - 2, 1'000'000'000);
    if (!q_[0].live)
      broken("the controller did not become ready after a reset (CSTS " + std::to_string(csts()) +
             ")");
    SubmissionEntry c{};
    c.opcode = admin::kIdentify;
    c.cdw10 = cns::kController;
    c.prp1 = dma_.iova + kDataPage * kPage;
    const uint64_t end = now_ns() + 1'000'000'000;
    int status = -1;
    while (status < 0 && now_ns() < end) status = submit(0, c);
    if (status != 0) broken("Identify after a reset: status " + std::to_string(status));
  }

  std::unique_ptr<EmulatedTransport> t_;
  DmaRegion dma_;
  void* guard_[2] = {MAP_FAILED, MAP_FAILED};
  Queue q_[kIoQueues + 1];
  uint16_t cid_ = 0;
  const bool verbose_ = std::getenv("WARPFS_FUZZ_VERBOSE") != nullptr;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{data, size};
  const auto flags = static_cast<uint8_t>(r.get(1));
  EmulatedConfig cfg;
  cfg.namespaces = {NamespaceConfig{512, 2048}, NamespaceConfig{4096, 0}};  // 1 MiB + 2 MiB
  cfg.max_queue_entries = kEntries;
  cfg.max_io_queues = kIoQueues;
  cfg.interrupt_vectors = kIoQueues + 1;
  cfg.mdts = 3;  // 32 KiB: PRP lists of several entries
  cfg.write_cache_bytes = 64 << 10;
  cfg.worker_threads = (flags & 1) ? 2 : 1;
  cfg.latency_ns = (flags & 2) ? 2'000 : 0;
  cfg.latency_jitter_ns = (flags & 2) ? 20'000 : 0;
  cfg.shuffle_completions = flags & 4;
  cfg.wrr = !(flags & 8);
  cfg.volatile_write_cache = !(flags & 16);
  cfg.doorbell_stride = (flags & 32) ? 1 : 0;
  cfg.idle_spin_ns = 20'000;
  std::string err;
  auto t = EmulatedTransport::create(cfg, BackingStore::ram(3 << 20), &err);
  if (!t) broken("EmulatedTransport::create: " + err);
  Host host(std::move(t));
  host.run(r);
  return 0;
}
