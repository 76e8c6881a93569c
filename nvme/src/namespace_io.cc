#include "warpfs/nvme/namespace_io.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "warpfs/nvme/io_batch.h"

namespace warpfs::nvme {

constexpr uint64_t kPage = 4096;

class NamespaceIo::ScratchPool {
 public:
  explicit ScratchPool(Transport& t) : t_(t) {}
  ~ScratchPool() {
    for (Scratch& s : free_) {
      t_.dma_free(s.lists);
      t_.dma_free(s.bounce);
    }
  }
  bool take(size_t bounce_bytes, NamespaceIo::Scratch* out) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!free_.empty()) {
        *out = free_.back();
        free_.pop_back();
      } else {
        *out = Scratch{};
      }
    }
    if (out->lists.vaddr == nullptr &&
        !t_.dma_alloc(IoBatch::kWidth * kPage, &out->lists).is_ok()) {
      return false;
    }
    if (out->bounce.bytes < bounce_bytes) {
      t_.dma_free(out->bounce);
      out->bounce = {};
      if (!t_.dma_alloc(bounce_bytes, &out->bounce).is_ok()) return false;
    }
    return true;
  }
  void give(const Scratch& s) {
    std::lock_guard<std::mutex> g(mu_);
    free_.push_back(s);
  }

 private:
  Transport& t_;
  std::mutex mu_;
  std::vector<Scratch> free_;
};

NamespaceIo::NamespaceIo(IoEngine& e, uint32_t nsid)
    : e_(e), t_(e.controller().transport()), nsid_(nsid) {}

std::unique_ptr<NamespaceIo> NamespaceIo::create(IoEngine& engine, uint32_t nsid,
                                                 uint32_t block_bytes, const Options& o,
                                                 std::string* error) {
  const NamespaceInfo* ns = engine.controller().find_namespace(nsid);
  if (ns == nullptr) {
    *error = "namespace " + std::to_string(nsid) + " does not exist";
    return nullptr;
  }
  if (block_bytes == 0 || block_bytes % ns->lba_bytes != 0 || block_bytes > 65536 ||
      (block_bytes & (block_bytes - 1)) != 0) {
    *error = "block size " + std::to_string(block_bytes) + " does not fit LBA size " +
             std::to_string(ns->lba_bytes);
    return nullptr;
  }
  std::unique_ptr<NamespaceIo> b(new NamespaceIo(engine, nsid));
  b->pool_ = std::make_unique<ScratchPool>(b->t_);
  b->o_ = o;
  b->block_bytes_ = block_bytes;
  b->lba_shift_ = static_cast<uint32_t>(__builtin_ctz(ns->lba_bytes));
  b->block_count_ = ns->lba_count * ns->lba_bytes / block_bytes;
  // Whole blocks per command, within MDTS and within one PRP list page (512 pages).
  b->max_transfer_ = std::min<uint32_t>(engine.controller().max_transfer_bytes(), 512 * kPage);
  b->max_transfer_ = std::max(b->max_transfer_ / block_bytes, 1u) * block_bytes;
  return b;
}

NamespaceIo::~NamespaceIo() {
  pool_.reset();
  for (const DmaRegion& r : owned_) t_.dma_free(r);
}

Status NamespaceIo::alloc(size_t bytes, void** out) {
  DmaRegion r;
  Status s = t_.dma_alloc(bytes, &r);
  if (!s.is_ok()) return s;
  std::lock_guard<std::mutex> g(mu_);
  const uint32_t n = nregions_.load(port::Order::kRelaxed);
  uint32_t slot = n;
  for (uint32_t i = 0; i < n; ++i) {
    if (regions_[i].bytes.load(port::Order::kRelaxed) == 0) {
      slot = i;
      break;
    }
  }
  if (slot == kMaxRegions) {
    t_.dma_free(r);
    return Status::error(Code::kNoMemory, "too many DMA regions of one namespace");
  }
  regions_[slot].vaddr.store(reinterpret_cast<uint64_t>(r.vaddr), port::Order::kRelaxed);
  regions_[slot].iova.store(r.iova, port::Order::kRelaxed);
  regions_[slot].bytes.store(r.bytes, port::Order::kRelease);
  if (slot == n) nregions_.store(n + 1, port::Order::kRelease);
  owned_.push_back(r);
  *out = r.vaddr;
  return Status::ok();
}

// REQUIRES (unchecked): no I/O in flight on the memory.
void NamespaceIo::free(void* p, size_t) {
  std::lock_guard<std::mutex> g(mu_);
  for (uint32_t i = 0; i < nregions_.load(port::Order::kRelaxed); ++i) {
    if (regions_[i].vaddr.load(port::Order::kRelaxed) == reinterpret_cast<uint64_t>(p)) {
      regions_[i].bytes.store(0, port::Order::kRelease);
    }
  }
  for (auto it = owned_.begin(); it != owned_.end(); ++it) {
    if (it->vaddr == p) {
      t_.dma_free(*it);
      owned_.erase(it);
      return;
    }
  }
}

uint64_t NamespaceIo::iova_of(const void* p, size_t len) {
  const auto q = reinterpret_cast<uint64_t>(p);
  const uint32_t n = nregions_.load(port::Order::kAcquire);
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t bytes = regions_[i].bytes.load(port::Order::kAcquire);
    const uint64_t base = regions_[i].vaddr.load(port::Order::kRelaxed);
    if (bytes != 0 && q >= base && q - base <= bytes && len <= bytes - (q - base)) {
      return regions_[i].iova.load(port::Order::kRelaxed) + (q - base);
    }
  }
  return 0;
}

// One command of a transfer: [lba, lba + bytes) to or from data (or its bounce copy).
struct NamespaceIo::Cmd {
  int io;  // index of the transfer it belongs to
  uint64_t lba;
  uint32_t bytes;
  uint8_t* data;
  uint64_t iova;    // the data's bus address (its bounce copy's when bounced)
  uint8_t* bounce;  // the bounce copy, or null
};

namespace {

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

void NamespaceIo::note(Class c, uint64_t t0, uint64_t bytes) {
  latency_[c].add(now_ns() - t0);
  if (bytes != 0) bytes_[c].fetch_add(bytes, std::memory_order_relaxed);
}

NamespaceIo::ClassStats NamespaceIo::stats(Class c) const {
  return ClassStats{latency_[c].snapshot(), bytes_[c].load(std::memory_order_relaxed),
                    bounced_[c].load(std::memory_order_relaxed)};
}

// The Read or Write of `bytes` of `io` from LBA `lba`, its data at bus address `iova`, its PRP
// list (where it spans more than two pages) in `list`; max_transfer_ fits one list page.
SubmissionEntry NamespaceIo::rw_command(const BlockIo& io, uint64_t lba, uint32_t bytes,
                                        uint64_t iova, const PrpList& list) const {
  const uint32_t lbas = bytes >> lba_shift_;
  SubmissionEntry cmd = io.write ? make_write(nsid_, lba, lbas) : make_read(nsid_, lba, lbas);
  (void)fill_prps(&cmd, iova, bytes, list);
  return cmd;
}

// Command k's PRP list page in `sc`.
PrpList NamespaceIo::list_page(const Scratch& sc, size_t k) {
  return PrpList{reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(sc.lists.vaddr) + k * kPage),
                 sc.lists.iova + k * kPage};
}

void NamespaceIo::io(BlockIo* ios, int n) {
  // Split every transfer into commands of at most max_transfer_ bytes; transfers whose
  // memory is not DMA memory go through the bounce buffer (copied in before writes, out
  // after reads).
  thread_local std::vector<Cmd> cmds;  // reused: the miss path does not allocate
  cmds.clear();
  for (int i = 0; i < n; ++i) {
    ios[i].status = Status::ok();
    const uint64_t total = uint64_t{ios[i].count} * block_bytes_;
    if (!in_range(ios[i].block, ios[i].count)) {
      ios[i].status = Status::error(Code::kInvalidArgument, "block range beyond the namespace");
      continue;
    }
    // DMA memory at any dword-aligned address moves directly: PRP1 carries the offset into
    // its page (Base §4.3; a FUSE request's data starts 80 bytes into its buffer).
    const uint64_t iova = iova_of(ios[i].data, total);
    const bool direct = iova != 0 && (iova & 3) == 0;
    for (uint64_t off = 0; off < total; off += max_transfer_) {
      const auto bytes = static_cast<uint32_t>(std::min<uint64_t>(max_transfer_, total - off));
      Cmd c{i, lba_of(ios[i].block, off), bytes, ios[i].data + off, 0, nullptr};
      if (direct) c.iova = iova_of(c.data, bytes);
      cmds.push_back(c);
    }
  }
  // The bounce buffer serves one round of up to 32 commands at a time.
  size_t bounce_need = kPage;
  for (size_t first = 0; first < cmds.size(); first += IoBatch::kWidth) {
    size_t round = 0;
    for (size_t k = first; k < std::min(cmds.size(), first + IoBatch::kWidth); ++k) {
      if (cmds[k].iova == 0) round += cmds[k].bytes;
    }
    bounce_need = std::max(bounce_need, round);
  }
  Scratch sc;
  if (!pool_->take(bounce_need, &sc)) {
    for (int i = 0; i < n; ++i) {
      if (ios[i].status.is_ok())
        ios[i].status = Status::error(Code::kNoMemory, "no DMA scratch memory");
    }
    return;
  }
  for (size_t first = 0; first < cmds.size(); first += IoBatch::kWidth) {
    const size_t last = std::min(cmds.size(), first + IoBatch::kWidth);
    run_round(ios, &cmds[first], last - first, sc);
  }
  pool_->give(sc);
}

// Up to 32 commands as one IoBatch: bounce copies in, submit, wait, status and copies out.
void NamespaceIo::run_round(BlockIo* ios, Cmd* cmds, size_t n, const Scratch& sc) {
  const uint64_t t0 = now_ns();
  IoBatch batch(e_.mapper());
  size_t bounce_off = 0;
  for (size_t k = 0; k < n; ++k) {
    Cmd& c = cmds[k];
    const BlockIo& io = ios[c.io];
    if (c.iova == 0) {
      c.bounce = static_cast<uint8_t*>(sc.bounce.vaddr) + bounce_off;
      c.iova = sc.bounce.iova + bounce_off;
      bounce_off += c.bytes;
      if (io.write) std::memcpy(c.bounce, c.data, c.bytes);
    }
    batch.submit(rw_command(io, c.lba, c.bytes, c.iova, list_page(sc, k)), priority(io.priority));
  }
  batch.wait_all();
  for (size_t k = 0; k < n; ++k) {
    const Cmd& c = cmds[k];
    BlockIo& io = ios[c.io];
    const uint16_t st = batch.status(static_cast<int>(k));
    if (!status_ok(st)) {
      if (io.status.is_ok()) io.status = Status::nvme(st);
    } else if (c.bounce != nullptr && !io.write) {
      std::memcpy(c.data, c.bounce, c.bytes);
    }
    note(io.write ? kWrite : kRead, t0, c.bytes);
    if (c.bounce != nullptr)
      bounced_[io.write ? kWrite : kRead].fetch_add(c.bytes, std::memory_order_relaxed);
  }
}

void NamespaceIo::start(BlockIo* ios, int n, Started* s) {
  WARPFS_DCHECK(!s->in_flight_, "NamespaceIo::start on a Started in flight");
  // Every transfer directly in DMA memory, in one batch: else the synchronous path. A PRP list
  // page only where a command spans more than two pages (a 4 KiB read takes none).
  size_t commands = 0;
  bool direct = true, lists = false;
  for (int i = 0; i < n && direct; ++i) {
    const uint64_t total = uint64_t{ios[i].count} * block_bytes_;
    const uint64_t iova = in_range(ios[i].block, ios[i].count) ? iova_of(ios[i].data, total) : 0;
    direct = iova != 0 && (iova & 3) == 0;
    commands += (total + max_transfer_ - 1) / max_transfer_;
    lists = lists || (iova & (kPage - 1)) + std::min<uint64_t>(total, max_transfer_) > 2 * kPage;
  }
  if (!direct || commands > IoBatch::kWidth || (lists && !pool_->take(0, &s->sc_))) {
    io(ios, n);
    return;
  }
  s->ios_ = ios;
  s->npieces_ = 0;
  s->t0_ = now_ns();
  for (int i = 0; i < n; ++i) {
    BlockIo& io = ios[i];
    io.status = Status::ok();
    const uint64_t total = uint64_t{io.count} * block_bytes_;
    for (uint64_t off = 0; off < total; off += max_transfer_) {
      const auto bytes = static_cast<uint32_t>(std::min<uint64_t>(max_transfer_, total - off));
      const size_t k = s->npieces_++;
      const PrpList list = lists ? list_page(s->sc_, k) : PrpList{};  // checked above
      s->pieces_[k] = Started::Piece{static_cast<uint32_t>(i), bytes};
      s->batch_.submit(
          rw_command(io, lba_of(io.block, off), bytes, iova_of(io.data + off, bytes), list),
          priority(io.priority));
    }
  }
  s->in_flight_ = true;
}

NamespaceIo::Started::~Started() {
  if (!in_flight_) return;
  batch_.wait_all();
  finish();
}

bool NamespaceIo::Started::poll() {
  if (!in_flight_) return true;
  batch_.poll();
  if (!batch_.finished()) return false;
  finish();
  return true;
}

void NamespaceIo::Started::finish() {
  for (size_t k = 0; k < npieces_; ++k) {
    BlockIo& io = ios_[pieces_[k].io];
    const uint16_t st = batch_.status(static_cast<int>(k));
    if (!status_ok(st) && io.status.is_ok()) io.status = Status::nvme(st);
    ns_.note(io.write ? kWrite : kRead, t0_, pieces_[k].bytes);
  }
  batch_.clear();
  if (sc_.lists.vaddr != nullptr) ns_.pool_->give(sc_);
  sc_ = Scratch{};
  in_flight_ = false;
}

Status NamespaceIo::flush() {
  const uint64_t t0 = now_ns();
  Status s = e_.execute(make_flush(nsid_), priority(Priority::kMetadata));
  note(kFlush, t0, 0);
  return s;
}

Status NamespaceIo::trim(uint64_t block, uint64_t count) {
  if (!in_range(block, count))
    return Status::error(Code::kInvalidArgument, "trim beyond the namespace");
  Scratch sc;
  if (!pool_->take(kPage, &sc)) return Status::error(Code::kNoMemory, "no DMA scratch memory");
  const uint64_t t0 = now_ns();
  // Dataset Management: up to 256 ranges of at most 2^32 - 1 LBAs per command.
  auto* ranges = static_cast<DsmRange*>(sc.lists.vaddr);
  uint64_t lba = (block * block_bytes_) >> lba_shift_;
  uint64_t left = (count * block_bytes_) >> lba_shift_;
  Status result;
  while (left > 0 && result.is_ok()) {
    uint32_t nr = 0;
    while (left > 0 && nr < kDsmMaxRanges) {
      const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(left, 0xffff0000u));
      ranges[nr++] = DsmRange{0, len, lba};
      lba += len, left -= len;
    }
    result = e_.execute(make_deallocate(nsid_, sc.lists.iova, nr), Priority::kBulk);
  }
  note(kTrim, t0, 0);
  pool_->give(sc);
  return result;
}

}  // namespace warpfs::nvme
