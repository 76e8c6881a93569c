#include "warpfs/nvme/tcp.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "warpfs/nvme/tcp_pdu.h"

namespace warpfs::nvme {
namespace {

using tcp::Pdu;
using tcp::PduType;

constexpr uint16_t kMaxIoQueues = 64;  // interrupt lines 1..64, one per I/O queue
constexpr uint32_t kInternalTags = 4;  // Property Get/Set, Keep Alive beside the host's commands
constexpr uint32_t kAdminHostTags = 1024;
constexpr uint64_t kIovaBase = 1ull << 40;    // the bus addresses handed out (never a vaddr)
constexpr uint64_t kPage = 4096;              // CC.MPS = 0
constexpr uint8_t kFabrics = 0x7f;            // NVMe-oF §6: Fabrics command opcode
constexpr uint8_t kFctypePropertySet = 0x00;  // NVMe-oF §3.5.3
constexpr uint8_t kFctypeConnect = 0x01;      // NVMe-oF §3.3
constexpr uint8_t kFctypePropertyGet = 0x04;  // NVMe-oF §3.5.2
constexpr uint8_t kKeepAlive = 0x18;          // Base §5.21
constexpr uint32_t kConnectDataBytes = 1024;  // NVMe-oF §3.3.1, Figure 20
constexpr uint32_t kAdminIcdBytes = 8192;     // TCP §3.3.2: the admin queue's capsule data
constexpr uint32_t kMaxDataPdu = 4u << 20;    // longest C2HData accepted (MDTS is 2 MiB here)
// R2Ts one command may have outstanding (ICReq MAXR2T + 1): the receive thread answers each
// with its H2CData before it reads the next PDU, so any number is served in order of arrival.
constexpr uint32_t kMaxR2t = 16;
constexpr size_t kIoccszOffset = 1792;  // Identify Controller IOCCSZ (Base Figure 275)
// Generic status 22h, Transient Transport Error (Base §4.6.1.2.1): may succeed if retried.
constexpr uint16_t kTransportError = make_status(sct::kGeneric, 0x22, false);

struct Tag {
  bool used = false;
  bool internal = false;
  bool write = false;
  bool admin = false;
  uint8_t opcode = 0;
  uint8_t cns = 0;  // Identify: CNS; Get/Set Features: the feature id
  uint16_t host_cid = 0;
  uint32_t nsid = 0;
  uint32_t len = 0;
  uint32_t done = 0;  // bytes moved so far (receive thread only)
  // Writes: the [offset, end) ranges R2Ts asked for so far (receive thread only).
  std::vector<std::pair<uint32_t, uint32_t>> asked;
  std::vector<iovec> iov;
  bool finished = false;  // internal commands: the response (or failure) is in `cqe`
  CompletionEntry cqe{};
};

void slice(const std::vector<iovec>& src, size_t off, size_t n, std::vector<iovec>* out) {
  out->clear();
  for (const iovec& v : src) {
    if (n == 0) break;
    if (off >= v.iov_len) {
      off -= v.iov_len;
      continue;
    }
    const size_t k = std::min(n, v.iov_len - off);
    out->push_back(iovec{static_cast<uint8_t*>(v.iov_base) + off, k});
    off = 0;
    n -= k;
  }
}

void set_sgl(SubmissionEntry* c, uint8_t type, uint32_t len) {
  c->flags = static_cast<uint8_t>((c->flags & 0x3f) | tcp::kPsdtSgl);
  c->prp1 = 0;  // SGL1 address: offset 0 in the capsule, or unused (TCP §3.3.2)
  c->prp2 = uint64_t{len} | (uint64_t{type} << 56);
}

ssize_t recv_fn(void* ctx, void* buf, size_t n) {
  const int fd = *static_cast<int*>(ctx);
  for (;;) {
    const ssize_t r = ::recv(fd, buf, n, 0);
    if (r >= 0) return r;
    if (errno != EINTR) return -errno;
  }
}

}  // namespace

// One NVMe queue pair: the host's SQ/CQ memory and doorbells, and the TCP connection that
// carries it (TCP §2: one queue pair per connection).
struct Queue {
  TcpTransport::Impl* t = nullptr;
  uint16_t qid = 0;
  port::Atomic<uint32_t> sq_tail_reg, cq_head_reg;  // the doorbells the host rings
  DoorbellKick sq_kick, cq_kick;                    // run() hooks: send / CQ space

  std::mutex sub_mu;  // guards the SQ binding and sq_head; held while SQ entries are sent
  SubmissionEntry* sq = nullptr;
  uint32_t sq_entries = 0;
  uint32_t sq_head = 0;
  uint16_t sq_cqid = 0;                   // the CQ named at creation (always this queue's own)
  std::atomic<uint32_t> sq_head_seen{0};  // reported in CQEs
  std::atomic<bool> pending{false};       // entries left in the SQ for want of a free tag

  std::mutex cq_mu;               // guards the CQ binding and the posting state
  std::condition_variable cq_cv;  // CQ space: the host rang the CQ head doorbell
  CompletionEntry* cq = nullptr;
  uint32_t cq_entries = 0;
  uint32_t cq_tail = 0;
  bool phase = true;
  InterruptLine* irq = nullptr;
  std::atomic<bool> cq_waiting{false};
  std::atomic<bool> closing{false};  // a close in progress: completions are dropped

  std::mutex conn_mu;  // serialises connect and close of this queue

  std::mutex tag_mu;               // guards tags and dead
  std::condition_variable tag_cv;  // internal commands finished, internal tags freed
  std::vector<Tag> tags;
  uint32_t host_tags = 0;
  bool dead = true;  // no live connection

  std::mutex send_mu;  // one PDU at a time on the socket
  std::atomic<int> fd{-1};
  tcp::Digests dg;  // fixed while connected
  uint8_t cpda = 0;
  uint32_t maxh2c = 0;
  uint32_t icd = 0;  // in-capsule data accepted on this queue
  std::thread rx;
};

struct TcpTransport::Impl {
  TcpOptions o;
  uint8_t hostid[16] = {};
  std::string hostnqn;
  std::vector<std::unique_ptr<Queue>> queues;
  std::unique_ptr<InterruptLine[]> lines;

  std::mutex reg_mu;  // register writes; the shadows below
  uint32_t cc_shadow = 0, aqa = 0;
  uint64_t asq = 0, acq = 0;
  uint64_t cap = 0;
  uint32_t vs = 0;
  bool enable_pending = false;
  uint64_t next_retry_ns = 0;
  std::atomic<bool> fatal{false};  // a connection failed while enabled: CSTS.CFS
  std::atomic<uint16_t> cntlid{0xffff};
  // The target has CC.EN = 1 and no CC.SHN, as this transport last told it: Keep Alive then.
  // Set only once the enabling Property Set has succeeded (try_enable_locked), cleared before
  // anything that ends the target's enable goes out (a CC write clearing EN or setting SHN, a
  // new admin connection, whose association starts disabled).
  std::atomic<bool> cc_en{false};
  // Held by the keep-alive thread from its look at cc_en to its command's answer, and across
  // every change of the target's CC (write32, and read32's retry of an enable; under reg_mu,
  // then the admin queue's locks): a Keep Alive reaches the target wholly before such a
  // change or wholly after it. Without it one went out on cc_en's new value ahead of the
  // enabling Property Set (nvmet: "got cmd 24 while CC.EN == 0"; TSan's slowness showed it).
  std::mutex ka_send_mu;
  // I/O queues the controller allocated (Number of Queues, Base §5.27.1.5, as answered to the
  // host, at most kMaxIoQueues): creating a queue beyond it is refused, as a controller does.
  std::atomic<uint32_t> queues_granted{kMaxIoQueues};
  std::atomic<uint32_t> ioccsz{0};

  std::shared_mutex dma_mu;  // guards dma
  std::map<uint64_t, DmaRegion> dma;
  uint64_t next_iova = kIovaBase;

  std::mutex ns_mu;  // guards lbads
  std::map<uint32_t, uint8_t> ns_lbads;

  std::mutex err_mu;  // guards last_error
  std::string last_error;

  std::thread keepalive;
  std::mutex ka_mu;  // guards ka_stop
  std::condition_variable ka_cv;
  bool ka_stop = false;

  std::atomic<uint64_t> n_connects{0}, n_failures{0}, n_capsules{0}, n_r2t{0}, n_c2h{0},
      n_keepalive{0};

  void note_error(const std::string& e) {
    std::lock_guard<std::mutex> g(err_mu);
    last_error = e;
  }

  uint8_t* translate(uint64_t iova, uint64_t len) {
    std::shared_lock<std::shared_mutex> g(dma_mu);
    auto it = dma.upper_bound(iova);
    if (it == dma.begin()) return nullptr;
    --it;
    const DmaRegion& r = it->second;
    if (iova - r.iova > r.bytes || len > r.bytes - (iova - r.iova)) return nullptr;
    return static_cast<uint8_t*>(r.vaddr) + (iova - r.iova);
  }

  // The memory a command's PRP1/PRP2 name for `len` bytes (Base §4.3.1), contiguous pieces
  // merged. False if any of it lies outside DMA memory or a PRP is malformed.
  bool prp_iov(uint64_t prp1, uint64_t prp2, uint64_t len, std::vector<iovec>* out) {
    out->clear();
    auto add = [&](uint64_t iova, uint64_t n) {
      uint8_t* p = translate(iova, n);
      if (p == nullptr) return false;
      if (!out->empty() && static_cast<uint8_t*>(out->back().iov_base) + out->back().iov_len == p) {
        out->back().iov_len += n;
      } else {
        out->push_back(iovec{p, n});
      }
      return true;
    };
    const uint64_t first = std::min(len, kPage - (prp1 & (kPage - 1)));
    if (!add(prp1, first)) return false;
    uint64_t left = len - first;
    if (left == 0) return true;
    if (left <= kPage) return (prp2 & (kPage - 1)) == 0 && add(prp2, left);
    if (prp2 & 7) return false;
    uint64_t list = prp2;
    for (uint64_t guard = 0; left > 0; ++guard) {
      if (guard > len / kPage * 2 + 8) return false;
      const auto* e = reinterpret_cast<const uint64_t*>(translate(list, 8));
      if (e == nullptr) return false;
      const bool last_slot = ((list + 8) & (kPage - 1)) == 0;
      if (last_slot && left > kPage) {  // the list continues on another page
        list = *e;
        if (list & 7) return false;
        continue;
      }
      if (*e & (kPage - 1)) return false;
      const uint64_t n = std::min(left, kPage);
      if (!add(*e, n)) return false;
      left -= n;
      list += 8;
    }
    return true;
  }

  // Data a command moves and its direction: 0, or the status to complete it with here (a
  // transfer longer than this transport takes, a namespace that is not active). A command
  // this transport does not know goes without data: the target answers it (Invalid Opcode
  // for one it lacks; one that needs data fails its transfer length check, moving nothing).
  uint16_t data_shape(const SubmissionEntry& e, bool admin_q, uint32_t* len, bool* write) {
    const uint16_t invalid_field = make_status(sct::kGeneric, sc::kInvalidField);
    *write = (e.opcode & 3) == 1;
    *len = 0;
    if (admin_q) {
      switch (e.opcode) {
        case admin::kIdentify:
          *len = 4096;
          return 0;
        case admin::kGetLogPage: {
          const uint64_t numd = ((uint64_t{e.cdw11 & 0xffff} << 16) | (e.cdw10 >> 16)) + 1;
          if (numd * 4 > kMaxDataPdu) return invalid_field;
          *len = static_cast<uint32_t>(numd * 4);
          return 0;
        }
        default:
          return 0;
      }
    }
    switch (e.opcode) {
      case io::kRead:
      case io::kWrite:
      case 0x05: {  // Compare
        uint8_t lbads = 0;
        if (const uint16_t st = namespace_lbads(e.nsid, &lbads); st != 0) return st;
        const uint64_t n = (uint64_t{e.cdw12 & 0xffff} + 1) << lbads;
        if (n > kMaxDataPdu) return invalid_field;
        *len = static_cast<uint32_t>(n);
        return 0;
      }
      case io::kDatasetManagement:
        *len = ((e.cdw10 & 0xff) + 1) * 16;
        return 0;
      default:
        return 0;
    }
  }

  // The LBA size (log2) of namespace `nsid`: as Identify Namespace told it on its way to the
  // host, else asked for here (an internal Identify on the admin queue). 0 or the status for
  // the command: Invalid Namespace or Format for a namespace that is not active (Base §3.2.1).
  uint16_t namespace_lbads(uint32_t nsid, uint8_t* lbads) {
    const uint16_t invalid_ns = make_status(sct::kGeneric, sc::kInvalidNamespace);
    {
      std::lock_guard<std::mutex> g(ns_mu);
      auto it = ns_lbads.find(nsid);
      if (it != ns_lbads.end()) return *lbads = it->second, 0;
    }
    if (nsid == 0 || nsid == io::kBroadcastNsid) return invalid_ns;
    std::vector<uint8_t> d(4096);
    SubmissionEntry c{};
    c.opcode = admin::kIdentify;
    c.nsid = nsid;
    c.cdw10 = cns::kNamespace;
    CompletionEntry r{};
    std::string err;
    if (!internal(*queues[0], c, &r, &err, d.data(), 4096)) return kTransportError;
    if (!status_ok(r.status >> 1)) return static_cast<uint16_t>(r.status >> 1);
    if (!learn_namespace(nsid, d.data())) return invalid_ns;
    std::lock_guard<std::mutex> g(ns_mu);
    *lbads = ns_lbads[nsid];
    return 0;
  }
  // Records an Identify Namespace structure's LBA size; false for an inactive namespace (all
  // zeroes) or an LBA size outside 512 B..64 KiB.
  bool learn_namespace(uint32_t nsid, const uint8_t* d) {
    const uint8_t fmt = d[26] & 0xf;                                       // FLBAS (NVM Figure 97)
    const uint8_t lbads = d[128 + 4 * fmt + 2];                            // LBAF n: LBADS
    if (tcp::get_le32(d) == 0 && tcp::get_le32(d + 4) == 0) return false;  // NSZE 0: inactive
    if (lbads < 9 || lbads > 16) return false;
    std::lock_guard<std::mutex> g(ns_mu);
    ns_lbads[nsid] = lbads;
    return true;
  }

  bool send_pdu(Queue& q, const Pdu& p, const std::vector<iovec>& data, uint32_t data_len) {
    uint8_t hdr[tcp::kMaxHeaderBytes];
    const size_t hn = tcp::encode_header(p, data_len, q.dg, q.cpda, hdr);
    std::vector<iovec> v;
    v.reserve(data.size() + 2);
    v.push_back(iovec{hdr, hn});
    uint8_t dd[4];
    v.insert(v.end(), data.begin(), data.end());
    if (data_len > 0 && (hdr[1] & tcp::flag::kDdgst)) {
      uint32_t crc = tcp::kCrc32cInit;
      for (const iovec& x : data) crc = tcp::crc32c_update(crc, x.iov_base, x.iov_len);
      tcp::put_le32(dd, tcp::crc32c_final(crc));
      v.push_back(iovec{dd, 4});
    }
    std::lock_guard<std::mutex> g(q.send_mu);
    const int fd = q.fd.load();
    if (fd < 0) return false;
    size_t at = 0;
    while (at < v.size()) {
      msghdr m{};
      m.msg_iov = &v[at];
      m.msg_iovlen = std::min<size_t>(v.size() - at, IOV_MAX);
      ssize_t n = ::sendmsg(fd, &m, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      while (n > 0 && at < v.size()) {
        if (static_cast<size_t>(n) >= v[at].iov_len) {
          n -= static_cast<ssize_t>(v[at].iov_len);
          ++at;
        } else {
          v[at].iov_base = static_cast<uint8_t*>(v[at].iov_base) + n;
          v[at].iov_len -= static_cast<size_t>(n);
          n = 0;
        }
      }
    }
    return true;
  }

  // Posts a completion into the host's CQ (phase tag last) and raises its line. Waits for CQ
  // space; drops the completion when the queue is being closed (the host is resetting).
  void post(Queue& q, uint16_t cid, uint16_t status, uint32_t dw0, uint32_t dw1) {
    std::unique_lock<std::mutex> g(q.cq_mu);
    if (q.cq == nullptr) return;
    for (;;) {
      if (q.closing.load()) return;
      const uint32_t head = q.cq_head_reg.load(port::Order::kAcquire);
      if ((q.cq_tail + 1) % q.cq_entries != head) break;
      q.cq_waiting.store(true);
      q.cq_cv.wait_for(g, std::chrono::milliseconds(50));
    }
    q.cq_waiting.store(false);
    CompletionEntry& e = q.cq[q.cq_tail];
    e.dw0 = dw0;
    e.dw1 = dw1;
    e.sq_head = static_cast<uint16_t>(q.sq_head_seen.load());
    e.sq_id = q.qid;
    const uint32_t dw3 = cid | (uint32_t((status << 1) | (q.phase ? 1 : 0)) << 16);
    reinterpret_cast<port::Atomic<uint32_t>*>(reinterpret_cast<uint8_t*>(&e) + kCqeDw3Offset)
        ->store(dw3, port::Order::kRelease);
    if (++q.cq_tail == q.cq_entries) q.cq_tail = 0, q.phase = !q.phase;
    InterruptLine* irq = q.irq;
    g.unlock();
    if (irq != nullptr) irq->raise();
  }

  // Sends the host's SQ entries up to the tail doorbell. REQUIRES: q.sub_mu held.
  void drain(Queue& q) {
    if (q.sq == nullptr) return;
    const uint32_t tail = q.sq_tail_reg.load(port::Order::kAcquire);
    if (tail >= q.sq_entries) return;  // not a valid tail: ignored, as a controller would
    q.pending.store(false);
    while (q.sq_head != tail) {
      const SubmissionEntry e = q.sq[q.sq_head];
      if (!submit(q, e)) {
        q.pending.store(true);
        return;
      }
      q.sq_head = (q.sq_head + 1) % q.sq_entries;
      q.sq_head_seen.store(q.sq_head);
    }
  }

  // One host command: answered here (queue creation) or sent. False only when no tag is free.
  bool submit(Queue& q, SubmissionEntry e) {
    if (q.qid == 0 && local_admin(q, e)) return true;
    // Base §5.27.1.5: Number of Queues is refused once I/O queues exist. Checked here, where
    // the I/O queues are made (the kernel's nvmet does not check it).
    if (q.qid == 0 && e.opcode == admin::kSetFeatures && (e.cdw10 & 0xff) == fid::kNumberOfQueues &&
        any_io_queue()) {
      post(q, e.cid, make_status(sct::kGeneric, sc::kCommandSequenceError), 0, 0);
      return true;
    }
    uint32_t len = 0;
    bool write = false;
    if (const uint16_t st = data_shape(e, q.qid == 0, &len, &write); st != 0) {
      post(q, e.cid, st, 0, 0);
      return true;
    }
    std::vector<iovec> iov;
    if (len > 0 && !prp_iov(e.prp1, e.prp2, len, &iov)) {
      post(q, e.cid, make_status(sct::kGeneric, sc::kDataTransferError), 0, 0);
      return true;
    }
    uint16_t tag = 0;
    {
      std::lock_guard<std::mutex> g(q.tag_mu);
      if (!q.dead) {
        uint32_t i = 0;
        while (i < q.host_tags && q.tags[i].used) ++i;
        if (i == q.host_tags) return false;
        Tag& t = q.tags[i];
        t = Tag{};
        t.used = true;
        t.write = write;
        t.admin = q.qid == 0;
        t.opcode = e.opcode;
        t.cns = static_cast<uint8_t>(e.cdw10 & 0xff);
        t.host_cid = e.cid;
        t.nsid = e.nsid;
        t.len = len;
        t.iov = std::move(iov);
        tag = static_cast<uint16_t>(i);
      } else {
        tag = 0xffff;
      }
    }
    if (tag == 0xffff) {
      post(q, e.cid, kTransportError, 0, 0);
      return true;
    }
    Pdu p;
    p.type = PduType::kCapsuleCmd;
    p.cmd = e;
    p.cmd.cid = tag;
    const bool in_capsule = write && len > 0 && len <= q.icd;
    set_sgl(&p.cmd, in_capsule ? tcp::kSglInCapsule : tcp::kSglTransport, len);
    static const std::vector<iovec> kNone;
    // The tag's iov is read here without tag_mu: only the receive thread frees the tag,
    // after this command's response, which the target sends after this capsule.
    std::vector<iovec> data;
    if (in_capsule) {
      std::lock_guard<std::mutex> g(q.tag_mu);
      data = q.tags[tag].iov;
    }
    n_capsules.fetch_add(1, std::memory_order_relaxed);
    if (!send_pdu(q, p, in_capsule ? data : kNone, in_capsule ? len : 0)) kill(q, "send failed");
    return true;
  }

  bool any_io_queue() {
    for (size_t i = 1; i < queues.size(); ++i) {
      std::lock_guard<std::mutex> g(queues[i]->cq_mu);
      if (queues[i]->cq != nullptr) return true;
    }
    return false;
  }

  // Create/Delete I/O SQ/CQ (Base §5.4-5.7) are the transport's: a queue is a connection.
  // They are checked as a controller checks them, with the same command specific statuses.
  bool local_admin(Queue& aq, const SubmissionEntry& e) {
    const uint16_t qid = static_cast<uint16_t>(e.cdw10 & 0xffff);
    const uint32_t entries = (e.cdw10 >> 16) + 1;
    auto done = [&](uint16_t status) { post(aq, e.cid, status, 0, 0); };
    const uint16_t bad_qid = make_status(sct::kCommandSpecific, sc::kInvalidQueueId);
    const uint16_t bad_size = make_status(sct::kCommandSpecific, sc::kInvalidQueueSize);
    const uint16_t bad_offset = make_status(sct::kGeneric, sc::kInvalidPrpOffset);
    const uint16_t invalid_field = make_status(sct::kGeneric, sc::kInvalidField);
    const bool creating = e.opcode == admin::kCreateIoCq || e.opcode == admin::kCreateIoSq;
    if (creating || e.opcode == admin::kDeleteIoCq || e.opcode == admin::kDeleteIoSq) {
      const uint32_t limit = creating ? queues_granted.load() : kMaxIoQueues;
      if (qid == 0 || qid > limit) return done(bad_qid), true;
    }
    if (creating) {
      const uint64_t mqes = (cap & 0xffff) + 1;  // CAP.MQES, 0's based
      if (entries < 2 || entries > mqes) return done(bad_size), true;
      if (!(e.cdw11 & 1)) return done(invalid_field), true;  // PC: contiguous queues only
      if (e.prp1 & (kPage - 1)) return done(bad_offset), true;
    }
    switch (e.opcode) {
      case admin::kCreateIoCq: {
        if ((e.cdw11 & 2) && (e.cdw11 >> 16) > kMaxIoQueues)  // IEN with a vector beyond ours
          return done(make_status(sct::kCommandSpecific, sc::kInvalidInterruptVector)), true;
        auto* mem = translate(e.prp1, uint64_t{entries} * sizeof(CompletionEntry));
        if (mem == nullptr) return done(make_status(sct::kGeneric, sc::kDataTransferError)), true;
        Queue& q = *queues[qid];
        {
          std::lock_guard<std::mutex> g(q.cq_mu);
          if (q.cq != nullptr) return done(bad_qid), true;  // exists
        }
        {
          std::lock_guard<std::mutex> g(q.cq_mu);
          q.cq = reinterpret_cast<CompletionEntry*>(mem);
          q.cq_entries = entries;
          q.cq_tail = 0;
          q.phase = true;
          q.cq_head_reg.store(0, port::Order::kRelaxed);
          q.irq = &lines[(e.cdw11 >> 16) % (kMaxIoQueues + 1)];
        }
        return done(0), true;
      }
      case admin::kCreateIoSq: {
        const uint16_t cqid = static_cast<uint16_t>(e.cdw11 >> 16);
        bool cq_exists = false;
        if (cqid != 0 && cqid <= kMaxIoQueues) {
          std::lock_guard<std::mutex> g(queues[cqid]->cq_mu);
          cq_exists = queues[cqid]->cq != nullptr;
        }
        if (!cq_exists) return done(make_status(sct::kCommandSpecific, sc::kCqInvalid)), true;
        // Each connection posts to its own queue's CQ: SQ n completes on CQ n only.
        if (cqid != qid) return done(invalid_field), true;
        auto* mem = translate(e.prp1, uint64_t{entries} * sizeof(SubmissionEntry));
        if (mem == nullptr) return done(make_status(sct::kGeneric, sc::kDataTransferError)), true;
        Queue& q = *queues[qid];
        {
          std::lock_guard<std::mutex> g(q.sub_mu);
          if (q.sq != nullptr) return done(bad_qid), true;  // exists
          q.sq_cqid = cqid;
          q.sq = reinterpret_cast<SubmissionEntry*>(mem);
          q.sq_entries = entries;
          q.sq_head = 0;
          q.sq_head_seen.store(0);
          q.sq_tail_reg.store(0, port::Order::kRelaxed);
        }
        std::string err;
        if (!connect(q, static_cast<uint16_t>(entries - 1), entries, &err)) {
          note_error(err);
          std::lock_guard<std::mutex> g(q.sub_mu);
          q.sq = nullptr;
          return done(kTransportError), true;
        }
        return done(0), true;
      }
      case admin::kDeleteIoSq: {
        Queue& q = *queues[qid];
        {
          std::lock_guard<std::mutex> g(q.sub_mu);
          if (q.sq == nullptr) return done(bad_qid), true;
        }
        close(q);
        std::lock_guard<std::mutex> g(q.sub_mu);
        q.sq = nullptr;
        return done(0), true;
      }
      case admin::kDeleteIoCq: {
        Queue& q = *queues[qid];
        for (uint16_t i = 1; i <= kMaxIoQueues; ++i) {  // an SQ still on it: Base §5.6
          std::lock_guard<std::mutex> g(queues[i]->sub_mu);
          if (queues[i]->sq != nullptr && queues[i]->sq_cqid == qid)
            return done(make_status(sct::kCommandSpecific, sc::kInvalidQueueDeletion)), true;
        }
        std::lock_guard<std::mutex> g(q.cq_mu);
        if (q.cq == nullptr) return done(bad_qid), true;
        q.cq = nullptr;
        return done(0), true;
      }
      default:
        return false;
    }
  }

  // Reads what Identify tells the transport: each namespace's LBA size (for sizing reads
  // and writes) and IOCCSZ (how much write data fits in a capsule).
  void snoop(const Tag& t) {
    if (!t.admin || t.opcode != admin::kIdentify || t.len != 4096 || t.internal) return;
    std::vector<uint8_t> d(4096);
    size_t at = 0;
    for (const iovec& v : t.iov) {
      std::memcpy(d.data() + at, v.iov_base, std::min(v.iov_len, d.size() - at));
      at += v.iov_len;
    }
    if (t.cns == cns::kNamespace) {
      learn_namespace(t.nsid, d.data());
    } else if (t.cns == cns::kController) {
      ioccsz.store(tcp::get_le32(d.data() + kIoccszOffset));
    }
  }

  // A response for tag `tag`: an internal command's waiter is woken; a host command's
  // completion is posted.
  void complete(Queue& q, uint16_t tag, CompletionEntry rsp) {
    uint16_t cid = 0;
    {
      std::lock_guard<std::mutex> g(q.tag_mu);
      Tag& t = q.tags[tag];
      if (t.internal) {
        t.cqe = rsp;
        t.finished = true;
        q.tag_cv.notify_all();
        return;
      }
      if (status_ok(rsp.status >> 1)) snoop(t);
      // Number of Queues as allocated (Base §5.27.1.5): no more than this transport's queues,
      // so the host never creates one beyond them.
      if (t.admin && (t.opcode == admin::kSetFeatures || t.opcode == admin::kGetFeatures) &&
          t.cns == fid::kNumberOfQueues && status_ok(rsp.status >> 1)) {
        const uint32_t nsqa = std::min<uint32_t>(rsp.dw0 & 0xffff, kMaxIoQueues - 1);
        const uint32_t ncqa = std::min<uint32_t>(rsp.dw0 >> 16, kMaxIoQueues - 1);
        rsp.dw0 = nsqa | ncqa << 16;
        queues_granted.store(std::min(nsqa, ncqa) + 1);
      }
      cid = t.host_cid;
      t.used = false;
      t.iov.clear();
    }
    post(q, cid, static_cast<uint16_t>(rsp.status >> 1), rsp.dw0, rsp.dw1);
    if (q.pending.load()) {
      std::lock_guard<std::mutex> g(q.sub_mu);
      drain(q);
    }
  }

  // The receive thread of one connection: sleeps in recv() until the target sends.
  void receive(Queue& q, int fd) {
    int fdv = fd;
    tcp::PduReader r(&recv_fn, &fdv);
    r.limits().host = true;
    r.limits().digests = q.dg;
    r.limits().max_data = kMaxDataPdu;
    std::string err;
    std::vector<iovec> part;
    for (;;) {
      Pdu p;
      if (!r.read_header(&p, &err)) break;
      if (p.type == PduType::kC2HTermReq) {
        err = "the target ended the connection (C2HTermReq FES " + std::to_string(p.fes) + ")";
        break;
      }
      if (p.type == PduType::kIcResp) {
        err = "ICResp after the connection was set up";
        break;
      }
      const uint16_t id = p.type == PduType::kCapsuleResp ? p.rsp.cid : p.cccid;
      Tag* t = nullptr;
      {
        std::lock_guard<std::mutex> g(q.tag_mu);
        if (id < q.tags.size() && q.tags[id].used && !q.tags[id].finished) t = &q.tags[id];
      }
      if (t == nullptr) {
        err = "PDU for command " + std::to_string(id) + ", which is not outstanding";
        break;
      }
      if (p.type == PduType::kCapsuleResp) {
        if (!r.finish_data(&err)) break;
        complete(q, id, p.rsp);
      } else if (p.type == PduType::kC2HData) {
        if (t->write || p.offset != t->done || uint64_t{p.offset} + p.length > t->len) {
          err = "C2HData at offset " + std::to_string(p.offset) + " (+" + std::to_string(p.length) +
                ") for a command of " + std::to_string(t->len) + " bytes, " +
                std::to_string(t->done) + " received";
          break;
        }
        slice(t->iov, p.offset, p.length, &part);
        bool ok = true;
        for (const iovec& v : part) ok = ok && r.read_data(v.iov_base, v.iov_len, &err);
        if (!ok || !r.finish_data(&err)) break;
        t->done += p.length;
        n_c2h.fetch_add(1, std::memory_order_relaxed);
        if (p.flags & tcp::flag::kSuccess) {
          if (t->done != t->len) {
            err = "C2HData SUCCESS before all the data";
            break;
          }
          CompletionEntry ok_rsp{};
          ok_rsp.cid = id;
          complete(q, id, ok_rsp);
        }
      } else {  // R2T
        if (!r.finish_data(&err)) break;
        // TCP §3.6.2.2: up to MAXR2T + 1 R2Ts of one command may be outstanding, for any
        // offsets; each asks for data not asked for before, within the command.
        const bool overlaps = std::any_of(t->asked.begin(), t->asked.end(), [&](const auto& a) {
          return p.offset < a.second && a.first < p.offset + p.length;
        });
        if (!t->write || p.length == 0 || uint64_t{p.offset} + p.length > t->len || overlaps) {
          err = "R2T for offset " + std::to_string(p.offset) + " (+" + std::to_string(p.length) +
                ") of a command of " + std::to_string(t->len) + " bytes" +
                (overlaps ? ", data already asked for" : "");
          break;
        }
        t->asked.emplace_back(p.offset, p.offset + p.length);
        n_r2t.fetch_add(1, std::memory_order_relaxed);
        uint32_t off = p.offset;
        const uint32_t end = p.offset + p.length;
        bool ok = true;
        while (ok && off < end) {
          const uint32_t n = std::min(end - off, q.maxh2c);
          Pdu h;
          h.type = PduType::kH2CData;
          h.cccid = id;
          h.ttag = p.ttag;
          h.offset = off;
          h.length = n;
          h.flags = off + n == end ? tcp::flag::kLastPdu : 0;
          slice(t->iov, off, n, &part);
          ok = send_pdu(q, h, part, n);
          off += n;
        }
        if (!ok) {
          err = "sending H2CData failed";
          break;
        }
        t->done += p.length;
      }
    }
    fail_all(q, err);
  }

  // The connection is gone: every command on it fails (Transient Transport Error), and the
  // controller reads CFS until the host resets it.
  void fail_all(Queue& q, const std::string& err) {
    std::vector<uint16_t> cids;
    {
      std::lock_guard<std::mutex> g(q.tag_mu);
      q.dead = true;
      for (Tag& t : q.tags) {
        if (!t.used || t.finished) continue;
        if (t.internal) {
          t.cqe = CompletionEntry{};
          t.cqe.status = static_cast<uint16_t>(kTransportError << 1);
          t.finished = true;
        } else {
          cids.push_back(t.host_cid);
          t.used = false;
          t.iov.clear();
        }
      }
      q.tag_cv.notify_all();
    }
    if (q.closing.load()) return;
    n_failures.fetch_add(1);
    note_error("queue " + std::to_string(q.qid) + ": " + err);
    fatal.store(true);
    for (uint16_t cid : cids) post(q, cid, kTransportError, 0, 0);
  }

  // Ends a connection from outside its receive thread (that thread notices and fails).
  void kill(Queue& q, const char* why) {
    note_error(std::string("queue ") + std::to_string(q.qid) + ": " + why);
    const int fd = q.fd.load();
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }

  void close(Queue& q) {
    std::lock_guard<std::mutex> c(q.conn_mu);
    close_locked(q);
  }
  void close_locked(Queue& q) {
    const int fd = q.fd.load();
    if (fd < 0) return;
    q.closing.store(true);
    {
      std::lock_guard<std::mutex> g(q.cq_mu);
      q.cq_cv.notify_all();
    }
    ::shutdown(fd, SHUT_RDWR);
    if (q.rx.joinable()) q.rx.join();
    std::lock_guard<std::mutex> g(q.send_mu);
    ::close(fd);
    q.fd.store(-1);
  }

  int tcp_connect(std::string* err) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (const int rc = ::getaddrinfo(o.host.c_str(), o.port.c_str(), &hints, &res); rc != 0) {
      *err = "cannot resolve " + o.host + ":" + o.port + ": " + gai_strerror(rc);
      return -1;
    }
    int fd = -1;
    std::string why = "no address";
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      timeval tv{static_cast<time_t>(o.connect_timeout_ns / 1'000'000'000),
                 static_cast<suseconds_t>(o.connect_timeout_ns % 1'000'000'000 / 1000)};
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);  // bounds connect() too
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);  // the handshake's reads
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
    ::freeaddrinfo(res);
    if (fd < 0) *err = "cannot connect to " + o.host + ":" + o.port + ": " + why;
    return fd;
  }

  // Opens queue q's connection: ICReq/ICResp (TCP §3.6.2.2-3), then Fabrics Connect
  // (NVMe-oF §3.3) with `sqsize` (0's based), and starts its receive thread.
  bool connect(Queue& q, uint16_t sqsize, uint32_t host_tags, std::string* err) {
    std::lock_guard<std::mutex> c(q.conn_mu);
    close_locked(q);
    const int fd = tcp_connect(err);
    if (fd < 0) {
      n_failures.fetch_add(1);
      return false;
    }
    auto fail = [&](const std::string& what) {
      *err = "queue " + std::to_string(q.qid) + ": " + what;
      ::close(fd);
      n_failures.fetch_add(1);
      return false;
    };
    q.dg = tcp::Digests{};
    q.cpda = 0;
    q.fd.store(fd);
    Pdu ic;
    ic.type = PduType::kIcReq;
    ic.dgst = static_cast<uint8_t>((o.header_digest ? 1 : 0) | (o.data_digest ? 2 : 0));
    ic.maxr2t = kMaxR2t - 1;  // 0's based (TCP §3.6.2.2)
    static const std::vector<iovec> kNone;
    if (!send_pdu(q, ic, kNone, 0)) return q.fd.store(-1), fail("sending ICReq failed");
    int fdv = fd;
    tcp::PduReader r(&recv_fn, &fdv);
    r.limits().host = true;
    r.limits().max_data = 0;
    Pdu resp;
    std::string e;
    if (!r.read_header(&resp, &e)) return q.fd.store(-1), fail("no ICResp: " + e);
    if (resp.type != PduType::kIcResp)
      return q.fd.store(-1), fail("the answer to ICReq is not ICResp");
    if (resp.dgst & ~ic.dgst)
      return q.fd.store(-1), fail("the target enables a digest not asked for");
    q.dg.header = resp.dgst & 1;
    q.dg.data = resp.dgst & 2;
    q.cpda = resp.pda;
    q.maxh2c = resp.maxdata;
    r.limits().digests = q.dg;

    Pdu cmd;
    cmd.type = PduType::kCapsuleCmd;
    cmd.cmd.opcode = kFabrics;
    cmd.cmd.cid = 0;
    cmd.cmd.nsid = kFctypeConnect;               // FCTYPE is byte 4
    cmd.cmd.cdw10 = uint32_t{q.qid} << 16;       // RECFMT 0, QID
    cmd.cmd.cdw11 = sqsize;                      // SQSIZE, CATTR 0
    cmd.cmd.cdw12 = q.qid == 0 ? o.kato_ms : 0;  // KATO (admin queue)
    set_sgl(&cmd.cmd, tcp::kSglInCapsule, kConnectDataBytes);
    uint8_t data[kConnectDataBytes] = {};
    std::memcpy(data, hostid, sizeof hostid);
    tcp::put_le16(data + 16, q.qid == 0 ? 0xffff : cntlid.load());
    std::memcpy(data + 256, o.subnqn.data(), std::min<size_t>(o.subnqn.size(), 255));
    std::memcpy(data + 512, hostnqn.data(), std::min<size_t>(hostnqn.size(), 255));
    const std::vector<iovec> dv{iovec{data, sizeof data}};
    if (!send_pdu(q, cmd, dv, sizeof data)) return q.fd.store(-1), fail("sending Connect failed");
    if (!r.read_header(&resp, &e) || !r.finish_data(&e))
      return q.fd.store(-1), fail("no answer to Connect: " + e);
    if (resp.type != PduType::kCapsuleResp || resp.rsp.cid != 0)
      return q.fd.store(-1), fail("the answer to Connect is not its response");
    const uint16_t sf = static_cast<uint16_t>(resp.rsp.status >> 1);
    if (!status_ok(sf))
      return q.fd.store(-1), fail(std::string("Connect refused: ") + status_name(sf));
    if (q.qid == 0) cntlid.store(static_cast<uint16_t>(resp.rsp.dw0 & 0xffff));
    timeval none{};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
    if (q.qid == 0) {
      q.icd = kAdminIcdBytes;
    } else {
      const uint32_t units = ioccsz.load();
      q.icd = units > 4 ? (units - 4) * 16 : 0;  // IOCCSZ counts 16-byte units, the SQE included
    }
    {
      std::lock_guard<std::mutex> g(q.tag_mu);
      q.host_tags = host_tags;
      q.tags.assign(host_tags + kInternalTags, Tag{});
      q.dead = false;
    }
    q.closing.store(false);
    q.rx = std::thread([this, &q, fd] { receive(q, fd); });
    n_connects.fetch_add(1);
    return true;
  }

  // A Fabrics or admin command of the transport's own on queue q, waited for; `len` bytes of
  // data from the controller into `data` when len > 0 (C2HData, like a host read).
  bool internal(Queue& q, SubmissionEntry cmd, CompletionEntry* out, std::string* err,
                void* data = nullptr, uint32_t len = 0) {
    uint32_t tag = 0;
    {
      std::unique_lock<std::mutex> g(q.tag_mu);
      for (;;) {
        if (q.dead) {
          *err = "queue " + std::to_string(q.qid) + " is not connected";
          return false;
        }
        tag = q.host_tags;
        while (tag < q.tags.size() && q.tags[tag].used) ++tag;
        if (tag < q.tags.size()) break;
        q.tag_cv.wait_for(g, std::chrono::milliseconds(10));
      }
      q.tags[tag] = Tag{};
      q.tags[tag].used = true;
      q.tags[tag].internal = true;
      q.tags[tag].opcode = cmd.opcode;
      q.tags[tag].len = len;
      if (len > 0) q.tags[tag].iov.push_back(iovec{data, len});
    }
    cmd.cid = static_cast<uint16_t>(tag);
    set_sgl(&cmd, tcp::kSglTransport, len);
    Pdu p;
    p.type = PduType::kCapsuleCmd;
    p.cmd = cmd;
    static const std::vector<iovec> kNone;
    n_capsules.fetch_add(1, std::memory_order_relaxed);
    if (!send_pdu(q, p, kNone, 0)) kill(q, "send failed");
    std::unique_lock<std::mutex> g(q.tag_mu);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::nanoseconds(o.command_timeout_ns);
    while (!q.tags[tag].finished) {
      if (q.tag_cv.wait_until(g, deadline) == std::cv_status::timeout && !q.tags[tag].finished) {
        g.unlock();
        kill(q, "a command timed out");
        g.lock();
        q.tag_cv.wait(g, [&] { return q.tags[tag].finished; });  // the receive thread fails it
        break;
      }
    }
    *out = q.tags[tag].cqe;
    q.tags[tag].used = false;
    q.tag_cv.notify_all();
    const uint16_t sf = static_cast<uint16_t>(out->status >> 1);
    if (sf == kTransportError) {
      *err = "queue " + std::to_string(q.qid) + ": connection lost";
      return false;
    }
    return true;
  }

  bool property_get(uint32_t offset, bool eight, uint64_t* value) {
    SubmissionEntry c{};
    c.opcode = kFabrics;
    c.nsid = kFctypePropertyGet;
    c.cdw10 = eight ? 1 : 0;  // ATTRIB: size
    c.cdw11 = offset;
    CompletionEntry r{};
    std::string err;
    if (!internal(*queues[0], c, &r, &err)) return false;
    if (!status_ok(r.status >> 1)) return false;
    *value = uint64_t{r.dw0} | (eight ? uint64_t{r.dw1} << 32 : 0);
    return true;
  }
  bool property_set(uint32_t offset, uint32_t value) {
    SubmissionEntry c{};
    c.opcode = kFabrics;
    c.nsid = kFctypePropertySet;
    c.cdw10 = 0;
    c.cdw11 = offset;
    c.cdw12 = value;
    CompletionEntry r{};
    std::string err;
    return internal(*queues[0], c, &r, &err) && status_ok(r.status >> 1);
  }
  bool admin_connected() {
    Queue& q = *queues[0];
    std::lock_guard<std::mutex> g(q.tag_mu);
    return !q.dead;
  }

  // CC.EN 0 -> 1: the admin queue's memory from AQA/ASQ/ACQ, a connection, Property Set.
  // REQUIRES: reg_mu and ka_send_mu held.
  void enable_locked() {
    Queue& q = *queues[0];
    const uint32_t entries = (aqa & 0xfff) + 1;
    auto* sq = translate(asq, uint64_t{entries} * sizeof(SubmissionEntry));
    auto* cq = translate(acq, uint64_t{entries} * sizeof(CompletionEntry));
    if (sq == nullptr || cq == nullptr || entries < 2) {
      fatal.store(true);
      note_error("the admin queue is not in DMA memory");
      return;
    }
    {
      std::lock_guard<std::mutex> g(q.sub_mu);
      q.sq = reinterpret_cast<SubmissionEntry*>(sq);
      q.sq_entries = entries;
      q.sq_head = 0;
      q.sq_head_seen.store(0);
    }
    {
      std::lock_guard<std::mutex> g(q.cq_mu);
      q.cq = reinterpret_cast<CompletionEntry*>(cq);
      q.cq_entries = entries;
      q.cq_tail = 0;
      q.phase = true;
      q.irq = &lines[0];
    }
    enable_pending = true;
    try_enable_locked();
  }
  // REQUIRES: reg_mu and ka_send_mu held.
  void try_enable_locked() {
    if (!admin_connected()) {
      cc_en.store(false);  // a new association starts with CC.EN = 0
      std::string err;
      if (!connect(*queues[0], 31, kAdminHostTags, &err)) {
        note_error(err);
        next_retry_ns = port::now_ns() + 200'000'000ull;
        return;
      }
    }
    enable_pending = false;
    if (!property_set(reg::kCc, cc_shadow)) {
      fatal.store(true);
    } else {
      cc_en.store(enabled(cc_shadow));
    }
  }
  static bool enabled(uint32_t cc_value) {
    return (cc_value & cc::kEn) != 0 && ((cc_value >> cc::kShnShift) & 3) == 0;
  }
  // CC.EN 1 -> 0: the controller forgets its queues; so does the target when the
  // connections close (NVMe-oF §3.4: a disconnected association ends). REQUIRES: reg_mu.
  void disable_locked() {
    for (size_t i = queues.size(); i-- > 0;) close(*queues[i]);
    for (size_t i = 1; i < queues.size(); ++i) {  // the I/O queues are gone (Base §3.5.2)
      Queue& q = *queues[i];
      {
        std::lock_guard<std::mutex> g(q.sub_mu);
        q.sq = nullptr;
      }
      std::lock_guard<std::mutex> g(q.cq_mu);
      q.cq = nullptr;
    }
    fatal.store(false);
    enable_pending = false;
  }

  void keepalive_loop() {
    const auto period = std::chrono::milliseconds(std::max<uint32_t>(o.kato_ms / 2, 1));
    std::unique_lock<std::mutex> g(ka_mu);
    while (!ka_stop) {
      ka_cv.wait_for(g, period);
      if (ka_stop) break;
      g.unlock();
      // NVMe-oF §3.3: Keep Alive belongs to an enabled controller (nvmet refuses it before
      // CC.EN = 1 with Command Sequence Error).
      {
        std::lock_guard<std::mutex> ks(ka_send_mu);
        if (cc_en.load() && admin_connected()) {
          SubmissionEntry c{};
          c.opcode = kKeepAlive;
          CompletionEntry r{};
          std::string err;
          if (internal(*queues[0], c, &r, &err)) n_keepalive.fetch_add(1);
        }
      }
      g.lock();
    }
  }
};

namespace {
bool sq_ring(void* ctx) {
  auto* q = static_cast<Queue*>(ctx);
  std::lock_guard<std::mutex> g(q->sub_mu);
  q->t->drain(*q);
  return true;
}
bool cq_ring(void* ctx) {
  auto* q = static_cast<Queue*>(ctx);
  if (q->cq_waiting.load()) {
    std::lock_guard<std::mutex> g(q->cq_mu);
    q->cq_cv.notify_all();
  }
  return true;
}
}  // namespace

TcpTransport::TcpTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

namespace {
// The transport's state before any connection: host identity, queues, interrupt lines.
std::unique_ptr<TcpTransport::Impl> make_impl(const TcpOptions& o, std::string* error) {
  if (o.host.empty() || o.subnqn.empty()) {
    *error = "NVMe/TCP needs a host and a subsystem NQN";
    return nullptr;
  }
  if (o.subnqn.size() > 223 || o.hostnqn.size() > 223) {  // Base §4.5: NQNs are at most 223 bytes
    *error = "an NQN longer than 223 bytes";
    return nullptr;
  }
  auto impl = std::make_unique<TcpTransport::Impl>();
  impl->o = o;
  std::random_device rd;
  for (size_t i = 0; i < sizeof impl->hostid; i += 4) {
    const uint32_t v = rd();
    std::memcpy(impl->hostid + i, &v, 4);
  }
  impl->hostid[6] = static_cast<uint8_t>((impl->hostid[6] & 0x0f) | 0x40);  // UUID version 4
  impl->hostid[8] = static_cast<uint8_t>((impl->hostid[8] & 0x3f) | 0x80);
  if (o.hostnqn.empty()) {
    char uuid[40];
    const uint8_t* h = impl->hostid;
    std::snprintf(uuid, sizeof uuid,
                  "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", h[0],
                  h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12], h[13],
                  h[14], h[15]);
    impl->hostnqn = std::string("nqn.2014-08.org.nvmexpress:uuid:") + uuid;
  } else {
    impl->hostnqn = o.hostnqn;
  }
  impl->lines = std::make_unique<InterruptLine[]>(kMaxIoQueues + 1);
  for (uint16_t i = 0; i <= kMaxIoQueues; ++i) {
    auto q = std::make_unique<Queue>();
    q->t = impl.get();
    q->qid = i;
    q->sq_kick.run = &sq_ring;
    q->sq_kick.ctx = q.get();
    q->cq_kick.run = &cq_ring;
    q->cq_kick.ctx = q.get();
    impl->queues.push_back(std::move(q));
  }
  return impl;
}
}  // namespace

std::unique_ptr<TcpTransport> TcpTransport::open(const TcpOptions& o, std::string* error) {
  auto impl = make_impl(o, error);
  if (impl == nullptr) return nullptr;
  if (!impl->connect(*impl->queues[0], 31, kAdminHostTags, error)) return nullptr;
  uint64_t v = 0;
  if (!impl->property_get(reg::kCap, true, &v)) {
    *error = "Property Get CAP failed: " + impl->last_error;
    impl->close(*impl->queues[0]);
    return nullptr;
  }
  // No arbitration over fabrics here: the weighted round robin classes stay the host's.
  impl->cap = v & ~(uint64_t{1} << 17);
  if (!impl->property_get(reg::kVs, false, &v)) {
    *error = "Property Get VS failed";
    impl->close(*impl->queues[0]);
    return nullptr;
  }
  impl->vs = static_cast<uint32_t>(v);
  if (o.kato_ms > 0) impl->keepalive = std::thread([p = impl.get()] { p->keepalive_loop(); });
  return std::unique_ptr<TcpTransport>(new TcpTransport(std::move(impl)));
}

namespace {
std::string log_string(const uint8_t* p, size_t n) {
  size_t len = 0;
  while (len < n && p[len] != 0) ++len;
  while (len > 0 && p[len - 1] == ' ') --len;
  return std::string(reinterpret_cast<const char*>(p), len);
}
}  // namespace

bool parse_discovery_log(const uint8_t* page, size_t n, uint64_t* genctr,
                         std::vector<DiscoveryEntry>* out, std::string* error) {
  constexpr size_t kHeader = 1024, kEntry = 1024;  // NVMe-oF 1.1 §5.3, Figures 40-41
  out->clear();
  if (n < kHeader) {
    *error = "a Discovery Log Page of " + std::to_string(n) + " bytes, shorter than its header";
    return false;
  }
  *genctr = tcp::get_le32(page) | uint64_t{tcp::get_le32(page + 4)} << 32;
  const uint64_t numrec = tcp::get_le32(page + 8) | uint64_t{tcp::get_le32(page + 12)} << 32;
  const uint16_t recfmt = tcp::get_le16(page + 16);
  if (recfmt != 0) {
    *error = "Discovery Log Page record format " + std::to_string(recfmt) + " (only 0 is known)";
    return false;
  }
  const uint64_t fit = (n - kHeader) / kEntry;
  for (uint64_t i = 0; i < std::min(numrec, fit); ++i) {
    const uint8_t* e = page + kHeader + i * kEntry;
    DiscoveryEntry d;
    d.trtype = e[0];
    d.adrfam = e[1];
    d.subtype = e[2];
    d.treq = e[3];
    d.portid = tcp::get_le16(e + 4);
    d.cntlid = tcp::get_le16(e + 6);
    d.asqsz = tcp::get_le16(e + 8);
    d.trsvcid = log_string(e + 32, 32);
    d.subnqn = log_string(e + 256, 256);
    d.traddr = log_string(e + 512, 256);
    out->push_back(std::move(d));
  }
  return true;
}

bool TcpTransport::discover(const TcpOptions& given, std::vector<DiscoveryEntry>* out,
                            std::string* error) {
  TcpOptions o = given;
  o.subnqn = kDiscoveryNqn;
  o.kato_ms = 0;  // a short association: no keep-alive (NVMe-oF §5: the target picks a KATO)
  auto made = make_impl(o, error);
  if (made == nullptr) return false;
  // Owned by a transport from here on: its destructor closes the connection.
  std::unique_ptr<TcpTransport> t(new TcpTransport(std::move(made)));
  Impl& impl = *t->impl_;
  Queue& q = *impl.queues[0];
  const std::string where = o.host + ":" + o.port;
  if (!impl.connect(q, 31, kAdminHostTags, error)) {
    *error = "discovery controller at " + where + ": " + *error;
    return false;
  }
  // Enable it (NVMe-oF §3.5: CC through Property Set), then wait for CSTS.RDY within CAP.TO.
  uint64_t cap = 0, csts_v = 0;
  if (!impl.property_get(reg::kCap, true, &cap) ||
      !impl.property_set(reg::kCc, cc::kEn | (6u << 16) | (4u << 20))) {
    *error = "discovery controller at " + where + ": enabling it failed: " + impl.last_error;
    return false;
  }
  const uint64_t to_ns = std::max<uint64_t>((cap >> 24) & 0xff, 1) * 500'000'000ull;
  for (const uint64_t end = port::now_ns() + to_ns;;) {
    if (!impl.property_get(reg::kCsts, false, &csts_v) || (csts_v & csts::kCfs)) {
      *error = "discovery controller at " + where + ": controller fatal status while enabling";
      return false;
    }
    if (csts_v & csts::kRdy) break;
    if (port::now_ns() > end) {
      *error = "discovery controller at " + where + ": not ready within CAP.TO";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a bounded poll (CAP.TO)
  }
  auto get_log = [&](std::vector<uint8_t>* page) {
    const uint32_t numd = static_cast<uint32_t>(page->size() / 4 - 1);
    SubmissionEntry c{};
    c.opcode = admin::kGetLogPage;
    c.cdw10 = 0x70 | (numd & 0xffff) << 16;  // LID 70h, NUMDL (Base §5.16)
    c.cdw11 = numd >> 16;                    // NUMDU; LPO (cdw12/13) 0
    CompletionEntry r{};
    std::string e;
    if (!impl.internal(q, c, &r, &e, page->data(), static_cast<uint32_t>(page->size()))) {
      *error = "discovery controller at " + where + ": Get Log Page 70h: " + e;
      return false;
    }
    if (!status_ok(r.status >> 1)) {
      *error = "discovery controller at " + where +
               ": Get Log Page 70h failed: " + status_name(static_cast<uint16_t>(r.status >> 1));
      return false;
    }
    return true;
  };
  // NVMe-oF §5.3: read the header, then the whole page; a generation counter that moved in
  // between means the page changed: read it again.
  constexpr uint64_t kMaxRecords = 1023;  // a page of 1 MiB at most
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::vector<uint8_t> head(4096);
    uint64_t gen = 0, gen2 = 0;
    if (!get_log(&head) || !parse_discovery_log(head.data(), head.size(), &gen, out, error))
      return false;
    const uint64_t numrec =
        tcp::get_le32(head.data() + 8) | uint64_t{tcp::get_le32(head.data() + 12)} << 32;
    if (numrec <= 3) return true;
    std::vector<uint8_t> page((std::min(numrec, kMaxRecords) + 1) * 1024);
    if (!get_log(&page) || !parse_discovery_log(page.data(), page.size(), &gen2, out, error))
      return false;
    if (gen2 == gen) return true;
  }
  *error = "discovery controller at " + where + ": the log page kept changing while read";
  return false;
}

TcpTransport::~TcpTransport() {
  {
    std::lock_guard<std::mutex> g(impl_->ka_mu);
    impl_->ka_stop = true;
    impl_->ka_cv.notify_all();
  }
  if (impl_->keepalive.joinable()) impl_->keepalive.join();
  for (size_t i = impl_->queues.size(); i-- > 0;) impl_->close(*impl_->queues[i]);
  for (auto& [iova, r] : impl_->dma) std::free(r.vaddr);
}

std::string TcpTransport::name() const {
  return "tcp:" + impl_->o.host + ":" + impl_->o.port + "/" + impl_->o.subnqn;
}

uint32_t TcpTransport::read32(uint32_t offset) {
  Impl& t = *impl_;
  std::lock_guard<std::mutex> g(t.reg_mu);
  switch (offset) {
    case reg::kCap:
      return static_cast<uint32_t>(t.cap);
    case reg::kCap + 4:
      return static_cast<uint32_t>(t.cap >> 32);
    case reg::kVs:
      return t.vs;
    case reg::kCc:
      return t.cc_shadow;
    case reg::kAqa:
      return t.aqa;
    case reg::kCsts: {
      if (t.fatal.load()) return ((t.cc_shadow & cc::kEn) ? csts::kRdy : 0u) | csts::kCfs;
      if (t.enable_pending) {
        if (port::now_ns() < t.next_retry_ns) return 0;
        std::lock_guard<std::mutex> ks(t.ka_send_mu);
        t.try_enable_locked();
        if (t.enable_pending) return 0;
      }
      if (!t.admin_connected()) return (t.cc_shadow & cc::kEn) ? csts::kCfs : 0u;
      uint64_t v = 0;
      if (!t.property_get(reg::kCsts, false, &v))
        return ((t.cc_shadow & cc::kEn) ? csts::kRdy : 0u) | csts::kCfs;
      return static_cast<uint32_t>(v);
    }
    default:
      return 0;
  }
}

uint64_t TcpTransport::read64(uint32_t offset) {
  if (offset == reg::kCap) return impl_->cap;
  std::lock_guard<std::mutex> g(impl_->reg_mu);
  if (offset == reg::kAsq) return impl_->asq;
  if (offset == reg::kAcq) return impl_->acq;
  return 0;
}

void TcpTransport::write32(uint32_t offset, uint32_t value) {
  Impl& t = *impl_;
  std::lock_guard<std::mutex> g(t.reg_mu);
  if (offset == reg::kAqa) {
    t.aqa = value;
  } else if (offset == reg::kCc) {
    std::lock_guard<std::mutex> ks(t.ka_send_mu);
    const uint32_t old = t.cc_shadow;
    t.cc_shadow = value;
    // A shutdown (CC.SHN) ends the controller's life as much as CC.EN = 0 does: nvmet clears
    // its CC then (Base §3.6.2) and refuses Keep Alive after it. No Keep Alive from here
    // until the target has heard an enable (try_enable_locked, or below).
    if (!Impl::enabled(value)) t.cc_en.store(false);
    if (!(old & cc::kEn) && (value & cc::kEn)) {
      t.enable_locked();
    } else if ((old & cc::kEn) && !(value & cc::kEn)) {
      t.disable_locked();
    } else if (t.admin_connected()) {
      if (!t.property_set(reg::kCc, value)) {
        t.fatal.store(true);
      } else if (Impl::enabled(value) && !t.enable_pending) {
        t.cc_en.store(true);
      }
    }
  }
}

void TcpTransport::write64(uint32_t offset, uint64_t value) {
  std::lock_guard<std::mutex> g(impl_->reg_mu);
  if (offset == reg::kAsq) impl_->asq = value;
  if (offset == reg::kAcq) impl_->acq = value;
}

Doorbell TcpTransport::doorbell(uint16_t qid, bool cq) {
  if (qid > kMaxIoQueues) return Doorbell{};
  Queue& q = *impl_->queues[qid];
  Doorbell d;
  d.reg = cq ? &q.cq_head_reg : &q.sq_tail_reg;
  d.kick = cq ? &q.cq_kick : &q.sq_kick;
  return d;
}

InterruptLine* TcpTransport::interrupt(uint16_t vector) {
  return vector <= kMaxIoQueues ? &impl_->lines[vector] : nullptr;
}

uint16_t TcpTransport::interrupt_vectors() const {
  return kMaxIoQueues + 1;
}

Status TcpTransport::dma_alloc(size_t bytes, DmaRegion* out) {
  const size_t n = (bytes + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, n == 0 ? kPage : n);
  if (p == nullptr) return Status::error(Code::kNoMemory, "out of memory");
  std::memset(p, 0, n);
  std::unique_lock<std::shared_mutex> g(impl_->dma_mu);
  out->vaddr = p;
  out->bytes = n;
  out->iova = impl_->next_iova;
  impl_->next_iova += n + kPage;  // a gap: a transfer running off a region is caught
  impl_->dma[out->iova] = *out;
  return Status::ok();
}

void TcpTransport::dma_free(const DmaRegion& region) {
  if (region.vaddr == nullptr) return;
  std::unique_lock<std::shared_mutex> g(impl_->dma_mu);
  impl_->dma.erase(region.iova);
  std::free(region.vaddr);
}

TcpCounters TcpTransport::counters() const {
  TcpCounters c;
  c.connects = impl_->n_connects.load();
  c.connection_failures = impl_->n_failures.load();
  c.capsules = impl_->n_capsules.load();
  c.r2ts = impl_->n_r2t.load();
  c.c2h_pdus = impl_->n_c2h.load();
  c.keep_alives = impl_->n_keepalive.load();
  return c;
}

std::string TcpTransport::last_error() const {
  std::lock_guard<std::mutex> g(impl_->err_mu);
  return impl_->last_error;
}

}  // namespace warpfs::nvme
