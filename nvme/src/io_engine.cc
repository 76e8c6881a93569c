#include "warpfs/nvme/io_engine.h"

#include <algorithm>

namespace warpfs::nvme {

std::unique_ptr<IoEngine> IoEngine::create(Controller& c, const EngineOptions& o,
                                           std::string* error) {
  std::unique_ptr<IoEngine> e(new IoEngine(c));
  uint32_t entries = std::min(o.queue_entries, c.max_queue_entries());
  while (!port::is_pow2(entries)) entries &= entries - 1;  // the ticket protocol needs 2^k
  if (entries < 2) {
    *error = "controller queues are too small";
    return nullptr;
  }
  e->entries_ = entries;
  const uint16_t granted = c.io_queues_granted();
  const uint16_t meta = std::max<uint16_t>(1, std::min<uint16_t>(o.metadata_queues, granted));
  uint16_t bulk = o.bulk_queues ? o.bulk_queues : static_cast<uint16_t>(granted - meta);
  bulk = std::min<uint16_t>(bulk, static_cast<uint16_t>(granted - meta));
  std::vector<std::vector<VirtualQueue*>> classes(2);
  for (uint16_t i = 0; i < meta + bulk; ++i) {
    const bool is_meta = i < meta;
    const QueuePriority prio = is_meta ? QueuePriority::kHigh : QueuePriority::kLow;
    QueueView v;
    Status s = c.create_queue_pair(static_cast<uint16_t>(i + 1), entries, prio, &v);
    if (!s.is_ok()) {
      *error = "creating I/O queue pair " + std::to_string(i + 1) + ": " + s.to_string();
      return nullptr;
    }
    e->views_.push_back(v);
    e->vqs_.push_back(make_virtual_queue(v));
    classes[is_meta ? 0 : 1].push_back(e->vqs_.back().get());
  }
  if (classes[1].empty()) classes[1] = classes[0];  // one queue granted: classes share it
  e->mapper_ = std::make_unique<QueueMapper>(std::move(classes), o.mapper);
  return e;
}

IoEngine::~IoEngine() {
  mapper_.reset();
  vqs_.clear();
  for (const QueueView& v : views_) (void)c_.delete_queue_pair(v.qid);
}

Status IoEngine::execute(const SubmissionEntry& cmd, Priority p) {
  return Status::nvme(mapper_->execute(cmd, p));
}

bool fill_prps(SubmissionEntry* cmd, uint64_t iova, uint64_t len, const PrpList& list) {
  constexpr uint64_t kPage = 4096;
  cmd->prp1 = iova;
  cmd->prp2 = 0;
  const uint64_t first = std::min(len, kPage - (iova & (kPage - 1)));
  if (len <= first) return true;
  const uint64_t second = (iova & ~(kPage - 1)) + kPage;
  if (len - first <= kPage) {
    cmd->prp2 = second;
    return true;
  }
  const uint64_t pages = (len - first + kPage - 1) / kPage;
  if (list.vaddr == nullptr || pages > kPage / 8) return false;
  for (uint64_t i = 0; i < pages; ++i) list.vaddr[i] = second + i * kPage;
  cmd->prp2 = list.iova;
  return true;
}

static SubmissionEntry make_rw(uint8_t op, uint32_t nsid, uint64_t slba, uint32_t blocks) {
  SubmissionEntry c{};
  c.opcode = op;
  c.nsid = nsid;
  c.cdw10 = static_cast<uint32_t>(slba);
  c.cdw11 = static_cast<uint32_t>(slba >> 32);
  c.cdw12 = (blocks - 1) & 0xffff;  // NLB is 0's based
  return c;
}

SubmissionEntry make_read(uint32_t nsid, uint64_t slba, uint32_t blocks) {
  return make_rw(io::kRead, nsid, slba, blocks);
}
SubmissionEntry make_write(uint32_t nsid, uint64_t slba, uint32_t blocks, bool fua) {
  SubmissionEntry c = make_rw(io::kWrite, nsid, slba, blocks);
  if (fua) c.cdw12 |= io::kCdw12Fua;
  return c;
}
SubmissionEntry make_flush(uint32_t nsid) {
  SubmissionEntry c{};
  c.opcode = io::kFlush;
  c.nsid = nsid;
  return c;
}
SubmissionEntry make_write_zeroes(uint32_t nsid, uint64_t slba, uint32_t blocks, bool deallocate) {
  SubmissionEntry c = make_rw(io::kWriteZeroes, nsid, slba, blocks);
  if (deallocate) c.cdw12 |= io::kCdw12WriteZeroesDeac;
  return c;
}
SubmissionEntry make_deallocate(uint32_t nsid, uint64_t iova, uint32_t n) {
  SubmissionEntry c{};
  c.opcode = io::kDatasetManagement;
  c.nsid = nsid;
  c.prp1 = iova;
  c.cdw10 = (n - 1) & 0xff;
  c.cdw11 = io::kDsmDeallocate;
  return c;
}

}  // namespace warpfs::nvme
