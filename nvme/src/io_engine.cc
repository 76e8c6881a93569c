#include "warpfs/nvme/io_engine.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace warpfs::nvme {

std::unique_ptr<IoEngine> IoEngine::create(Controller& c, const EngineOptions& o,
                                           std::string* error) {
  std::unique_ptr<IoEngine> e(new IoEngine(c));
  e->o_ = o;
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
  e->progress_.resize(e->vqs_.size());
  if (o.io_timeout_ns > 0) e->watchdog_ = std::thread([p = e.get()] { p->watchdog(); });
  return e;
}

IoEngine::~IoEngine() {
  if (watchdog_.joinable()) {
    {
      std::lock_guard<std::mutex> g(wd_mu_);
      stop_ = true;
    }
    wd_cv_.notify_all();
    watchdog_.join();
  }
  for (const VirtualQueuePtr& vq : vqs_) {
    WARPFS_DCHECK(vq->inside() == 0, "IoEngine destroyed with I/O in flight");
  }
  mapper_.reset();
  vqs_.clear();
  // Best effort: a destructor cannot report, and the controller's shutdown (or reset) drops
  // every queue the device still has.
  for (const QueueView& v : views_) (void)c_.delete_queue_pair(v.qid);
}

Status IoEngine::execute(const SubmissionEntry& cmd, Priority p) {
  return Status::nvme(mapper_->execute(cmd, p));
}

void IoEngine::log(const std::string& line) const {
  if (o_.log) {
    o_.log(line);
  } else {
    std::fprintf(stderr, "warpfs: nvme: %s\n", line.c_str());
  }
}

std::vector<IoEngine::QueueLoad> IoEngine::queue_loads() const {
  std::vector<QueueLoad> out;
  std::unique_lock<std::mutex> lk(recover_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return out;  // a recovery is rebuilding them
  for (size_t i = 0; i < vqs_.size(); ++i) {
    out.push_back({views_[i].qid, vqs_[i]->outstanding(), vqs_[i]->completed()});
  }
  return out;
}

EngineCounters IoEngine::counters() const {
  EngineCounters c;
  c.timeouts = timeouts_.load();
  c.fatal_status = fatal_.load();
  c.resets = resets_.load();
  c.failed_resets = failed_resets_.load();
  c.dead = dead_.load();
  return c;
}

// A few looks per timeout, at least one a second: an idle engine wakes once a second (the
// cost of noticing CSTS.CFS on a quiet device), a busy one is judged within a quarter timeout.
void IoEngine::watchdog() {
  pthread_setname_np(pthread_self(), "nvme-watchdog");
  const uint64_t period_ns = std::min<uint64_t>(o_.io_timeout_ns / 4 + 1, 1'000'000'000ull);
  std::unique_lock<std::mutex> l(wd_mu_);
  while (!stop_) {
    wd_cv_.wait_for(l, std::chrono::nanoseconds(period_ns));
    if (stop_ || dead_.load()) continue;
    l.unlock();
    std::string why;
    {
      std::lock_guard<std::mutex> g(recover_mu_);  // progress_ is reset by recover()
      why = check(port::now_ns());
    }
    if (!why.empty()) (void)recover(why);
    l.lock();
  }
}

std::string IoEngine::check(uint64_t now) {
  const uint32_t csts = c_.transport().read32(reg::kCsts);
  if (csts == 0xffffffffu) return "the controller does not respond (registers read all ones)";
  if (csts & csts::kCfs) {
    fatal_.fetch_add(1);
    return "controller fatal status (CSTS.CFS)";
  }
  if (c_.needs_reset()) return "an admin command timed out";
  for (size_t i = 0; i < vqs_.size(); ++i) {
    Progress& p = progress_[i];
    const uint64_t done = vqs_[i]->completed();
    if (vqs_[i]->outstanding() == 0 || done != p.completed || p.since_ns == 0) {
      p.completed = done;
      p.since_ns = now;
      continue;
    }
    if (now - p.since_ns >= o_.io_timeout_ns) {
      timeouts_.fetch_add(1);
      return "I/O queue " + std::to_string(views_[i].qid) + ": no completion for " +
             std::to_string((now - p.since_ns) / 1'000'000) + " ms with " +
             std::to_string(vqs_[i]->outstanding()) + " command(s) outstanding";
    }
  }
  return "";
}

Status IoEngine::recover(const std::string& why) {
  std::lock_guard<std::mutex> g(recover_mu_);
  if (dead_.load()) return Status::error(Code::kNotReady, "the I/O queues are dead");
  log(why + "; resetting the controller");
  for (const VirtualQueuePtr& q : vqs_) q->stop(VirtualQueue::kResetting);
  // Every waiter sees the state within one back-off step; a thread that stopped polling its
  // command (a caller's bug) would hold the queues forever, so this wait is bounded too.
  const uint64_t quiesce_deadline = port::now_ns() + 10'000'000'000ull;
  port::Backoff b;
  bool quiet = false;
  while (!quiet) {
    quiet = true;
    for (const VirtualQueuePtr& q : vqs_) quiet = quiet && q->inside() == 0;
    if (quiet || port::now_ns() > quiesce_deadline) break;
    b.pause();
  }
  if (!quiet) {
    std::string held;
    for (size_t i = 0; i < vqs_.size(); ++i) {
      if (vqs_[i]->inside() != 0) {
        held +=
            " queue " + std::to_string(views_[i].qid) + ": " + std::to_string(vqs_[i]->inside());
      }
    }
    log("commands still inside the queues after 10 s:" + held);
  }
  Status s = quiet ? c_.reset()
                   : Status::error(Code::kTimeout, "commands still inside the queues after 10 s");
  if (!s.is_ok()) {
    for (const VirtualQueuePtr& q : vqs_) q->stop(VirtualQueue::kDead);
    log("controller reset failed (" + s.to_string() + "); every command fails from now on");
    dead_.store(true);  // the counters move last: a test waiting on them sees the log
    failed_resets_.fetch_add(1);
    return s;
  }
  for (const VirtualQueuePtr& q : vqs_) {
    q->reset_protocol();
    q->resume();
  }
  for (Progress& p : progress_) p = Progress{};
  log("controller reset done; I/O queues re-created");
  resets_.fetch_add(1);
  return Status::ok();
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
