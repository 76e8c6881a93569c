#include "warpfs/nvme/controller.h"

#include <algorithm>
#include <cstring>

namespace warpfs::nvme {

Controller::Controller(Transport& t, const ControllerOptions& o) : t_(t), o_(o) {}

std::unique_ptr<Controller> Controller::open(Transport& t, const ControllerOptions& o,
                                             std::string* error) {
  std::unique_ptr<Controller> c(new Controller(t, o));
  if (!c->bring_up(error)) return nullptr;
  return c;
}

const NamespaceInfo* Controller::find_namespace(uint32_t nsid) const {
  for (const NamespaceInfo& n : namespaces_) {
    if (n.nsid == nsid) return &n;
  }
  return nullptr;
}

// Waits for CSTS.RDY to reach `ready`, at most CAP.TO (Base §3.1.4.1) or `timeout_ns`.
Status Controller::wait_ready(bool ready, uint64_t timeout_ns) {
  const uint64_t deadline = port::now_ns() + timeout_ns;
  port::Backoff b;
  for (;;) {
    const uint32_t csts = t_.read32(reg::kCsts);
    if (csts == 0xffffffffu) return Status::error(Code::kNotReady, "controller is not responding");
    if (((csts & csts::kRdy) != 0) == ready) return Status::ok();
    // Disabling is the way out of a fatal status (CC.EN = 0 resets it): only an enable
    // that meets CFS has failed.
    if (ready && (csts & csts::kCfs))
      return Status::error(Code::kNotReady, "controller fatal status (CSTS.CFS)");
    if (port::now_ns() > deadline) {
      return Status::error(Code::kTimeout, ready ? "timed out waiting for CSTS.RDY=1"
                                                 : "timed out waiting for CSTS.RDY=0");
    }
    b.pause();
  }
}

// CC.EN = 0 and a wait for CSTS.RDY = 0: the controller forgets its queues and stops DMA. A
// controller caught half-way through an enable (EN = 1, RDY = 0) finishes it first: clearing
// EN then is undefined (Base §3.1.4.5).
Status Controller::disable() {
  const uint32_t cc = t_.read32(reg::kCc);
  if (cc == 0xffffffffu) return Status::error(Code::kNotReady, "controller is not responding");
  if (cc & cc::kEn) {
    // The half-way enable above, finished first; on a timeout EN is cleared anyway, and the
    // wait below reports what the controller does.
    if (!(t_.read32(reg::kCsts) & csts::kRdy)) (void)wait_ready(true, ready_timeout_ns());
    t_.write32(reg::kCc, 0);
  }
  return wait_ready(false, ready_timeout_ns());
}

// Controller initialisation, Base §3.5.1 steps 1-9.
bool Controller::bring_up(std::string* error) {
  auto fail = [&](const std::string& what, const Status& s) {
    *error = what + (s.is_ok() ? "" : ": " + s.to_string());
    return false;
  };
  cap_.raw = t_.read64(reg::kCap);
  if (cap_.raw == ~0ull) return fail("controller registers read all ones (device gone?)", {});
  if (!cap_.css_nvm()) return fail("controller does not support the NVM command set", {});
  if (cap_.mpsmin() > 0) return fail("controller needs pages larger than 4 KiB", {});

  const uint32_t entries = std::min(o_.admin_entries, cap_.mqes() + 1);
  if (Status s = t_.dma_alloc(entries * sizeof(SubmissionEntry), &admin_sq_); !s.is_ok())
    return fail("admin SQ allocation", s);
  if (Status s = t_.dma_alloc(entries * sizeof(CompletionEntry), &admin_cq_); !s.is_ok())
    return fail("admin CQ allocation", s);
  if (Status s = t_.dma_alloc(4096, &scratch_); !s.is_ok()) return fail("scratch allocation", s);
  const char* stage = nullptr;
  if (Status s = start_admin(&stage); !s.is_ok()) return fail(stage, s);

  // 4. Identify Controller (CNS 01h).
  id_ = std::make_unique<IdentifyController>();
  SubmissionEntry cmd{};
  cmd.opcode = admin::kIdentify;
  cmd.cdw10 = cns::kController;
  if (Status s = admin(cmd, id_.get(), sizeof *id_, false, nullptr); !s.is_ok())
    return fail("Identify Controller", s);
  if ((id_->sqes & 0xf) > 6 || (id_->cqes & 0xf) > 4)
    return fail("controller needs larger queue entries than 64/16 B", {});
  max_transfer_ = (id_->mdts == 0 || id_->mdts >= 18) ? (1u << 30) : (4096u << id_->mdts);

  // 5. Active namespaces (CNS 02h) and each namespace (CNS 00h).
  std::vector<uint32_t> list(1024);
  cmd = SubmissionEntry{};
  cmd.opcode = admin::kIdentify;
  cmd.cdw10 = cns::kActiveNamespaceList;
  if (Status s = admin(cmd, list.data(), 4096, false, nullptr); !s.is_ok())
    return fail("Identify Active Namespace List", s);
  for (uint32_t nsid : list) {
    if (nsid == 0) break;
    IdentifyNamespace ns{};
    cmd = SubmissionEntry{};
    cmd.opcode = admin::kIdentify;
    cmd.nsid = nsid;
    cmd.cdw10 = cns::kNamespace;
    if (Status s = admin(cmd, &ns, sizeof ns, false, nullptr); !s.is_ok())
      return fail("Identify Namespace " + std::to_string(nsid), s);
    const LbaFormat& f = ns.lbaf[ns.flbas & 0xf];
    if (ns.nsze == 0 || f.lbads < 9 || f.lbads > 12 || f.ms != 0) continue;  // unusable
    NamespaceInfo info;
    info.nsid = nsid;
    info.lba_count = ns.nsze;
    info.lba_bytes = 1u << f.lbads;
    info.atomic_write_blocks = (ns.nsfeat & 2) ? ns.nawupf + 1u : id_->awupf + 1u;
    namespaces_.push_back(info);
  }

  // 6. Number of Queues and arbitration.
  if (Status s = configure_queues(&stage); !s.is_ok()) return fail(stage, s);
  if (granted_ == 0) return fail("no I/O queue's doorbells are reachable", {});
  return true;
}

// Steps 1-3 of initialisation on the admin queue memory already allocated: disable, program
// the admin queue (zeroed: a reset starts it over), enable. `stage` names what failed.
Status Controller::start_admin(const char** stage) {
  // 1. Disable, wait for CSTS.RDY = 0.
  *stage = "controller reset failed";
  if (Status s = disable(); !s.is_ok()) return s;

  // 2. Admin queues (Base §3.1.4.8-10).
  const auto entries = static_cast<uint32_t>(admin_sq_.bytes / sizeof(SubmissionEntry));
  std::memset(admin_sq_.vaddr, 0, admin_sq_.bytes);
  std::memset(admin_cq_.vaddr, 0, admin_cq_.bytes);
  t_.write32(reg::kAqa, (entries - 1) | ((entries - 1) << 16));
  t_.write64(reg::kAsq, admin_sq_.iova);
  t_.write64(reg::kAcq, admin_cq_.iova);
  QueueView av;
  av.qid = 0;
  av.entries = entries;
  av.sq = static_cast<SubmissionEntry*>(admin_sq_.vaddr);
  av.cq = static_cast<CompletionEntry*>(admin_cq_.vaddr);
  av.sq_doorbell = t_.doorbell(0, false);
  av.cq_doorbell = t_.doorbell(0, true);
  *stage = "the admin doorbells are not reachable through the transport";
  if (av.sq_doorbell.reg == nullptr || av.cq_doorbell.reg == nullptr)
    return Status::error(Code::kInvalidArgument, "no admin doorbells");
  av.irq = t_.interrupt(0);
  {
    std::lock_guard<std::mutex> g(admin_mu_);
    admin_ = std::make_unique<RawQueuePair>(av);
    failed_ = false;
    next_cid_ = 0;
  }

  // 3. Enable with 4 KiB pages, 64 B SQEs, 16 B CQEs, and WRR if offered and wanted.
  wrr_ = o_.wrr && cap_.ams_wrr();
  const uint32_t cc = cc::kEn | (0u << cc::kCssShift) | (0u << cc::kMpsShift) |
                      ((wrr_ ? cc::kAmsWrr : 0u) << cc::kAmsShift) | (6u << cc::kIosqesShift) |
                      (4u << cc::kIocqesShift);
  t_.write32(reg::kCc, cc);
  *stage = "controller enable failed";
  return wait_ready(true, ready_timeout_ns());
}

// Number of Queues (Base §5.27.1.5), then arbitration weights (Base §5.27.1.1): at bring-up
// and again after every reset.
Status Controller::configure_queues(const char** stage) {
  uint32_t dw0 = 0;
  SubmissionEntry cmd{};
  cmd.opcode = admin::kSetFeatures;
  cmd.cdw10 = fid::kNumberOfQueues;
  const uint32_t want = std::max<uint16_t>(o_.io_queues, 1) - 1u;
  cmd.cdw11 = want | (want << 16);
  *stage = "Set Features (Number of Queues)";
  if (Status s = admin(cmd, nullptr, 0, false, &dw0); !s.is_ok()) return s;
  // The controller may allocate more than was asked for (QEMU reports its maximum): use
  // what was asked for, at most what it allocated (Base §5.27.1.5).
  granted_ =
      static_cast<uint16_t>(std::min<uint32_t>(std::min(dw0 & 0xffff, dw0 >> 16) + 1, want + 1));
  // ...and no queue whose doorbells the transport cannot reach (a sparse BAR mapping).
  while (granted_ > 0 && (t_.doorbell(granted_, false).reg == nullptr ||
                          t_.doorbell(granted_, true).reg == nullptr))
    --granted_;
  if (wrr_) {
    cmd = SubmissionEntry{};
    cmd.opcode = admin::kSetFeatures;
    cmd.cdw10 = fid::kArbitration;
    cmd.cdw11 = 3u /* burst of 8 */ | (uint32_t{o_.low_weight} << 8) |
                (uint32_t{o_.medium_weight} << 16) | (uint32_t{o_.high_weight} << 24);
    *stage = "Set Features (Arbitration)";
    if (Status s = admin(cmd, nullptr, 0, false, nullptr); !s.is_ok()) return s;
  }
  return Status::ok();
}

Status Controller::reset() {
  {
    std::lock_guard<std::mutex> g(admin_mu_);
    if (shut_down_) return Status::error(Code::kNotReady, "controller is shut down");
  }
  const char* stage = nullptr;
  if (Status s = start_admin(&stage); !s.is_ok()) return s;
  const uint16_t before = granted_;
  if (Status s = configure_queues(&stage); !s.is_ok()) return s;
  if (granted_ < before) {
    return Status::error(Code::kNotReady, "the controller grants fewer queues after the reset");
  }
  std::vector<IoQueueMemory> queues;
  {
    std::lock_guard<std::mutex> g(admin_mu_);
    queues = io_queues_;
  }
  for (const IoQueueMemory& q : queues) {
    // Zeroed: the SQ starts empty and the CQ's phase tags at 0, so the first pass posts 1.
    std::memset(q.sq.vaddr, 0, q.sq.bytes);
    std::memset(q.cq.vaddr, 0, q.cq.bytes);
    if (Status s = create_queues(q); !s.is_ok()) return s;
  }
  return Status::ok();
}

bool Controller::needs_reset() {
  std::lock_guard<std::mutex> g(admin_mu_);
  return failed_;
}

Controller::~Controller() {
  // A controller that failed (or never came up) may still hold queue addresses: stop it
  // before its memory goes back to the transport, where it could be reused.
  // A destructor cannot report; disable() is the last resort, whose failure leaves nothing
  // else to try.
  if (!shutdown().is_ok() || failed_) (void)disable();
  for (const IoQueueMemory& q : io_queues_) {
    t_.dma_free(q.sq);
    t_.dma_free(q.cq);
  }
  t_.dma_free(scratch_);
  t_.dma_free(admin_sq_);
  t_.dma_free(admin_cq_);
}

Status Controller::admin(SubmissionEntry cmd, void* data, size_t len, bool to_device,
                         uint32_t* dw0) {
  if (len > scratch_.bytes) return Status::error(Code::kInvalidArgument, "admin data over 4 KiB");
  std::lock_guard<std::mutex> g(admin_mu_);
  if (shut_down_) return Status::error(Code::kNotReady, "controller is shut down");
  if (failed_)
    return Status::error(Code::kNotReady, "an earlier admin command timed out: reset needed");
  if (next_cid_ == 0xffff) next_cid_ = 0;  // CID FFFFh is reserved (Base §4.6.1)
  cmd.cid = next_cid_++;
  if (len > 0) {
    cmd.prp1 = scratch_.iova;
    if (to_device) {
      std::memcpy(scratch_.vaddr, data, len);
    } else {
      std::memset(scratch_.vaddr, 0, len);
    }
  }
  if (Status s = admin_->push(cmd); !s.is_ok()) return s;
  admin_->ring_sq();
  const uint64_t deadline = port::now_ns() + o_.admin_timeout_ns;
  port::Backoff b;
  CompletionEntry cqe{};
  for (;;) {
    InterruptLine* irq = admin_->view().irq;
    const uint32_t seen = irq ? irq->count.value.load(port::Order::kAcquire) : 0;
    if (admin_->pop(&cqe)) break;
    if (port::now_ns() > deadline) {
      // The command is still outstanding: it may complete later, write into the scratch
      // buffer and shift the admin CQ. No further admin command until a reset.
      failed_ = true;
      return Status::error(Code::kTimeout, "admin command timed out");
    }
    if (b.should_block()) {  // waiting long: is there still a controller to answer?
      const uint32_t csts = t_.read32(reg::kCsts);
      if (csts == 0xffffffffu || (csts & csts::kCfs)) {
        return Status::error(Code::kNotReady, "controller failed or is gone");
      }
    }
    if (irq != nullptr && b.should_block()) {
      irq->wait(seen, 1'000'000);
    } else {
      b.pause();
    }
  }
  admin_->ring_cq();
  if (cqe.cid != cmd.cid)
    return Status::error(Code::kIoError, "admin completion for another command");
  const uint16_t sf = static_cast<uint16_t>(cqe.status >> 1);  // drop the phase tag
  if (dw0 != nullptr) *dw0 = cqe.dw0;
  if (!status_ok(sf)) return Status::nvme(sf);
  if (len > 0 && !to_device) std::memcpy(data, scratch_.vaddr, len);
  return Status::ok();
}

Status Controller::create_queue_pair(uint16_t qid, uint32_t entries, QueuePriority prio,
                                     QueueView* out) {
  if (qid == 0 || qid > granted_)
    return Status::error(Code::kInvalidArgument, "queue id not granted");
  if (entries < 2 || entries > max_queue_entries())
    return Status::error(Code::kInvalidArgument, "queue size beyond CAP.MQES");
  if (t_.doorbell(qid, false).reg == nullptr || t_.doorbell(qid, true).reg == nullptr)
    return Status::error(Code::kInvalidArgument,
                         "the queue's doorbells lie outside the mapped BAR");
  IoQueueMemory mem;
  mem.qid = qid;
  if (Status s = t_.dma_alloc(entries * sizeof(SubmissionEntry), &mem.sq); !s.is_ok()) return s;
  if (Status s = t_.dma_alloc(entries * sizeof(CompletionEntry), &mem.cq); !s.is_ok()) {
    t_.dma_free(mem.sq);
    return s;
  }
  const uint16_t vectors = t_.interrupt_vectors();
  mem.entries = entries;
  mem.prio = prio;
  mem.vector = vectors > 1 ? static_cast<uint16_t>(1 + (qid - 1) % (vectors - 1)) : 0;
  if (Status s = create_queues(mem); !s.is_ok()) {
    t_.dma_free(mem.sq);
    t_.dma_free(mem.cq);
    return s;
  }
  {
    std::lock_guard<std::mutex> g(admin_mu_);
    io_queues_.push_back(mem);
  }
  out->qid = qid;
  out->entries = entries;
  out->sq = static_cast<SubmissionEntry*>(mem.sq.vaddr);
  out->cq = static_cast<CompletionEntry*>(mem.cq.vaddr);
  out->sq_doorbell = t_.doorbell(qid, false);
  out->cq_doorbell = t_.doorbell(qid, true);
  out->irq = vectors ? t_.interrupt(mem.vector) : nullptr;
  return Status::ok();
}

// Create I/O CQ then SQ (Base §5.4, §5.5) on `q`'s memory; neither is left behind on failure.
Status Controller::create_queues(const IoQueueMemory& q) {
  SubmissionEntry cmd{};
  cmd.opcode = admin::kCreateIoCq;
  cmd.prp1 = q.cq.iova;
  cmd.cdw10 = q.qid | ((q.entries - 1) << 16);
  cmd.cdw11 =
      1u /* PC */ | (t_.interrupt_vectors() ? 2u /* IEN */ : 0u) | (uint32_t{q.vector} << 16);
  if (Status s = admin(cmd, nullptr, 0, false, nullptr); !s.is_ok()) return s;
  cmd = SubmissionEntry{};
  cmd.opcode = admin::kCreateIoSq;
  cmd.prp1 = q.sq.iova;
  cmd.cdw10 = q.qid | ((q.entries - 1) << 16);
  cmd.cdw11 = 1u | (uint32_t{static_cast<uint8_t>(q.prio)} << 1) | (uint32_t{q.qid} << 16);
  Status s = admin(cmd, nullptr, 0, false, nullptr);
  if (!s.is_ok()) {
    SubmissionEntry del{};
    del.opcode = admin::kDeleteIoCq;
    del.cdw10 = q.qid;
    (void)admin(del, nullptr, 0, false, nullptr);
  }
  return s;
}

Status Controller::delete_queue_pair(uint16_t qid) {
  SubmissionEntry cmd{};
  cmd.opcode = admin::kDeleteIoSq;  // Base §5.7: the SQ before its CQ
  cmd.cdw10 = qid;
  if (Status s = admin(cmd, nullptr, 0, false, nullptr); !s.is_ok()) return s;
  cmd.opcode = admin::kDeleteIoCq;
  if (Status s = admin(cmd, nullptr, 0, false, nullptr); !s.is_ok()) return s;
  std::lock_guard<std::mutex> g(admin_mu_);
  for (auto it = io_queues_.begin(); it != io_queues_.end(); ++it) {
    if (it->qid == qid) {
      t_.dma_free(it->sq);
      t_.dma_free(it->cq);
      io_queues_.erase(it);
      break;
    }
  }
  return Status::ok();
}

// Normal shutdown (Base §3.6.1): CC.SHN = 01b, then wait for CSTS.SHST = 10b.
Status Controller::shutdown() {
  {
    std::lock_guard<std::mutex> g(admin_mu_);
    if (shut_down_) return Status::ok();
    shut_down_ = true;
  }
  const uint32_t cc = t_.read32(reg::kCc);
  if (cc == 0xffffffffu) return Status::error(Code::kNotReady, "controller is not responding");
  // Only a running controller can be shut down (a failed bring-up leaves nothing to save).
  if (!(cc & cc::kEn) || !(t_.read32(reg::kCsts) & csts::kRdy)) return Status::ok();
  t_.write32(reg::kCc, (cc & ~cc::kShnMask) | (1u << cc::kShnShift));
  // As Linux: RTD3E when the controller reports it, at least 5 s, at most 60 s.
  const uint64_t rtd3e_ns = id_ ? uint64_t{id_->rtd3e} * 1000 : 0;
  const uint64_t limit_ns =
      std::min<uint64_t>(std::max<uint64_t>(rtd3e_ns, 5'000'000'000ull), 60'000'000'000ull);
  const uint64_t deadline = port::now_ns() + limit_ns;
  port::Backoff b;
  for (;;) {
    const uint32_t csts = t_.read32(reg::kCsts);
    if (csts == 0xffffffffu) return Status::error(Code::kNotReady, "controller is not responding");
    if ((csts & csts::kShstMask) == csts::kShstComplete) break;
    if (port::now_ns() > deadline) return Status::error(Code::kTimeout, "shutdown timed out");
    b.pause();
  }
  return Status::ok();
}

}  // namespace warpfs::nvme
