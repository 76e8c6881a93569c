#include "warpfs/cache/nvme_backend.h"

#include <algorithm>
#include <cstring>

#include "warpfs/nvme/io_batch.h"

namespace warpfs::cache {

constexpr uint64_t kPage = 4096;

// Per-call scratch: one PRP list page per command in flight and a bounce buffer for data
// that does not live in DMA memory. Pooled so that a miss path does not allocate.
struct Scratch {
  nvme::DmaRegion lists;
  nvme::DmaRegion bounce;
};

class NvmeBackend::ScratchPool {
 public:
  explicit ScratchPool(nvme::Transport& t) : t_(t) {}
  ~ScratchPool() {
    for (Scratch& s : free_) {
      t_.dma_free(s.lists);
      t_.dma_free(s.bounce);
    }
  }
  bool take(size_t bounce_bytes, Scratch* out) {
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
        !t_.dma_alloc(nvme::IoBatch::kWidth * kPage, &out->lists).is_ok()) {
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
  nvme::Transport& t_;
  std::mutex mu_;
  std::vector<Scratch> free_;
};

NvmeBackend::NvmeBackend(nvme::IoEngine& e, uint32_t nsid)
    : e_(e), t_(e.controller().transport()), nsid_(nsid) {}

std::unique_ptr<NvmeBackend> NvmeBackend::create(nvme::IoEngine& engine, uint32_t nsid,
                                                 uint32_t line_bytes, std::string* error) {
  const nvme::NamespaceInfo* ns = engine.controller().find_namespace(nsid);
  if (ns == nullptr) {
    *error = "namespace " + std::to_string(nsid) + " does not exist";
    return nullptr;
  }
  if (line_bytes == 0 || line_bytes % ns->lba_bytes != 0 || line_bytes > 65536 ||
      (line_bytes & (line_bytes - 1)) != 0) {
    *error = "line size " + std::to_string(line_bytes) + " does not fit LBA size " +
             std::to_string(ns->lba_bytes);
    return nullptr;
  }
  std::unique_ptr<NvmeBackend> b(new NvmeBackend(engine, nsid));
  b->pool_ = std::make_unique<ScratchPool>(b->t_);
  b->line_bytes_ = line_bytes;
  b->lba_shift_ = static_cast<uint32_t>(__builtin_ctz(ns->lba_bytes));
  b->line_count_ = ns->lba_count * ns->lba_bytes / line_bytes;
  // Whole lines per command, within MDTS and within one PRP list page (512 pages).
  b->max_transfer_ = std::min<uint32_t>(engine.controller().max_transfer_bytes(), 512 * kPage);
  b->max_transfer_ = std::max(b->max_transfer_ / line_bytes, 1u) * line_bytes;
  return b;
}

NvmeBackend::~NvmeBackend() {
  pool_.reset();
  for (const nvme::DmaRegion& r : owned_) t_.dma_free(r);
}

Status NvmeBackend::alloc(size_t bytes, void** out) {
  nvme::DmaRegion r;
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
    return Status::error(Code::kNoMemory, "too many backend memory regions");
  }
  regions_[slot].vaddr.store(reinterpret_cast<uint64_t>(r.vaddr), port::Order::kRelaxed);
  regions_[slot].iova.store(r.iova, port::Order::kRelaxed);
  regions_[slot].bytes.store(r.bytes, port::Order::kRelease);
  if (slot == n) nregions_.store(n + 1, port::Order::kRelease);
  owned_.push_back(r);
  *out = r.vaddr;
  return Status::ok();
}

// REQUIRES: no I/O in flight on the memory.
void NvmeBackend::free(void* p, size_t) {
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

uint64_t NvmeBackend::iova_of(const void* p, size_t len) {
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

void NvmeBackend::io(Op* ops, int n) {
  // Split every op into commands of at most max_transfer_ bytes; ops whose memory is not
  // DMA memory go through the bounce buffer (copied in before writes, out after reads).
  struct Cmd {
    int op;
    uint64_t lba;
    uint32_t bytes;
    uint8_t* data;
    uint64_t iova;
    uint8_t* bounce;
  };
  thread_local std::vector<Cmd> cmds;  // reused: the miss path does not allocate
  cmds.clear();
  for (int i = 0; i < n; ++i) {
    ops[i].status = Status::ok();
    const uint64_t total = uint64_t{ops[i].lines} * line_bytes_;
    if (ops[i].block + ops[i].lines > line_count_ || ops[i].lines == 0) {
      ops[i].status = Status::error(Code::kInvalidArgument, "line range beyond the namespace");
      continue;
    }
    const bool direct = iova_of(ops[i].data, total) != 0;
    for (uint64_t off = 0; off < total; off += max_transfer_) {
      const auto bytes = static_cast<uint32_t>(std::min<uint64_t>(max_transfer_, total - off));
      Cmd c{i,      ((ops[i].block * line_bytes_) + off) >> lba_shift_, bytes, ops[i].data + off, 0,
            nullptr};
      if (direct) c.iova = iova_of(c.data, bytes);
      cmds.push_back(c);
    }
  }
  // The bounce buffer serves one round of up to 32 commands at a time.
  size_t bounce_need = kPage;
  for (size_t first = 0; first < cmds.size(); first += nvme::IoBatch::kWidth) {
    size_t round = 0;
    for (size_t k = first; k < std::min(cmds.size(), first + nvme::IoBatch::kWidth); ++k) {
      if (cmds[k].iova == 0) round += cmds[k].bytes;
    }
    bounce_need = std::max(bounce_need, round);
  }
  Scratch sc;
  ScratchPool& pool = *pool_;
  if (!pool.take(bounce_need, &sc)) {
    for (int i = 0; i < n; ++i) {
      if (ops[i].status.is_ok())
        ops[i].status = Status::error(Code::kNoMemory, "no DMA scratch memory");
    }
    return;
  }
  for (size_t first = 0; first < cmds.size(); first += nvme::IoBatch::kWidth) {
    const size_t last = std::min(cmds.size(), first + nvme::IoBatch::kWidth);
    nvme::IoBatch batch(e_.mapper());
    size_t bounce_off = 0;
    for (size_t k = first; k < last; ++k) {
      Cmd& c = cmds[k];
      if (c.iova == 0) {
        c.bounce = static_cast<uint8_t*>(sc.bounce.vaddr) + bounce_off;
        c.iova = sc.bounce.iova + bounce_off;
        bounce_off += c.bytes;
        if (ops[c.op].write) std::memcpy(c.bounce, c.data, c.bytes);
      }
      const uint32_t blocks = c.bytes >> lba_shift_;
      nvme::SubmissionEntry cmd = ops[c.op].write ? nvme::make_write(nsid_, c.lba, blocks)
                                                  : nvme::make_read(nsid_, c.lba, blocks);
      const size_t slot = k - first;
      nvme::PrpList list{
          reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(sc.lists.vaddr) + slot * kPage),
          sc.lists.iova + slot * kPage};
      (void)nvme::fill_prps(&cmd, c.iova, c.bytes, list);  // max_transfer_ fits one list page
      batch.submit(cmd, nvme::Priority::kBulk);
    }
    batch.wait_all();
    for (size_t k = first; k < last; ++k) {
      const Cmd& c = cmds[k];
      const uint16_t st = batch.status(static_cast<int>(k - first));
      if (!nvme::status_ok(st)) {
        if (ops[c.op].status.is_ok()) ops[c.op].status = Status::nvme(st);
      } else if (c.bounce != nullptr && !ops[c.op].write) {
        std::memcpy(c.data, c.bounce, c.bytes);
      }
    }
  }
  pool.give(sc);
}

Status NvmeBackend::flush() {
  return e_.execute(nvme::make_flush(nsid_), nvme::Priority::kMetadata);
}

Status NvmeBackend::trim(uint64_t block, uint64_t lines) {
  if (block + lines > line_count_)
    return Status::error(Code::kInvalidArgument, "trim beyond the namespace");
  Scratch sc;
  ScratchPool& pool = *pool_;
  if (!pool.take(kPage, &sc)) return Status::error(Code::kNoMemory, "no DMA scratch memory");
  // Dataset Management: up to 256 ranges of at most 2^32 - 1 LBAs per command.
  auto* ranges = static_cast<nvme::DsmRange*>(sc.lists.vaddr);
  uint64_t lba = (block * line_bytes_) >> lba_shift_;
  uint64_t left = (lines * line_bytes_) >> lba_shift_;
  Status result;
  while (left > 0 && result.is_ok()) {
    uint32_t nr = 0;
    while (left > 0 && nr < nvme::kDsmMaxRanges) {
      const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(left, 0xffff0000u));
      ranges[nr++] = nvme::DsmRange{0, len, lba};
      lba += len, left -= len;
    }
    result = e_.execute(nvme::make_deallocate(nsid_, sc.lists.iova, nr), nvme::Priority::kBulk);
  }
  pool.give(sc);
  return result;
}

}  // namespace warpfs::cache
