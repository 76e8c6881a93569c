// A small NVMe/TCP target for the tests: one subsystem with one RAM namespace, served on a
// loopback TCP port, written against the codec (tcp_pdu.h) and the specifications (NVMe/TCP
// Transport 1.0, NVMe over Fabrics 1.1), never against the initiator's code. Each connection
// has its own thread handling one command at a time: ICReq/ICResp, Fabrics Connect, Property
// Get/Set, Identify, Set/Get Features, Keep Alive, and as the discovery controller (NVMe-oF
// §5: Connect to nqn.2014-08.org.nvmexpress.discovery) Get Log Page 70h; Read (C2HData, with
// SUCCESS or a CapsuleResp), Write (in-capsule data or R2T/H2CData), Flush, Dataset Management,
// Write Zeroes. Faults for the tests: vanish() (listener and every connection gone, as a target
// that goes away), come_back() (listening again on the same port), and a write-byte budget
// after which the target vanishes in the middle of a write.
//
// Thread-safety: every public method from any thread; RAM under ram_mu_.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "warpfs/nvme/spec.h"
#include "warpfs/nvme/tcp_pdu.h"

namespace warpfs::nvme::test {

// What the target offers (TcpTarget::Options).
struct TcpTargetOptions {
  uint32_t lba_shift = 9;
  uint64_t lbas = 1 << 16;
  std::string subnqn = "nqn.2026-11.io.warpfs:test";
  uint32_t icd = 4096;         // in-capsule data on I/O queues (IOCCSZ)
  uint32_t maxh2c = 16384;     // MAXH2CDATA
  uint32_t c2h_chunk = 32768;  // C2HData PDUs per read of this size
  uint32_t r2t_max = 65536;    // the most one R2T asks for
  // R2Ts of one command sent before its data is read (at most the host's MAXR2T + 1), and in
  // descending offsets when r2t_reverse: TCP §3.6.2.2 lets a controller have several out.
  uint32_t r2t_burst = 1;
  bool r2t_reverse = false;
  uint8_t cpda = 0;
  uint8_t mdts = 5;          // 128 KiB
  bool success_flag = true;  // end reads with C2HData SUCCESS, not a CapsuleResp
  // The Discovery Log Page lists the subsystem, this discovery subsystem, an RDMA port of the
  // subsystem and this many more NVM subsystems over TCP (subnqn + ".1", ".2", ...).
  uint32_t discovery_extra = 0;
};

class TcpTarget {
 public:
  using Options = TcpTargetOptions;

  explicit TcpTarget(Options o = {}) : o_(o), ram_(o.lbas << o.lba_shift) { listen_on(0); }
  ~TcpTarget() {
    vanish();
    // Joined without mu_ (a connection's thread takes it as it ends); the accept thread adds
    // none once the listener is gone.
    for (;;) {
      std::vector<std::thread> ts;
      {
        std::lock_guard<std::mutex> g(mu_);
        ts.swap(threads_);
      }
      if (ts.empty()) break;
      for (std::thread& t : ts) t.join();
    }
  }

  uint16_t port() const { return port_; }
  const Options& options() const { return o_; }
  std::vector<uint8_t> read_ram(uint64_t off, size_t n) {
    std::lock_guard<std::mutex> g(ram_mu_);
    return std::vector<uint8_t>(ram_.begin() + static_cast<long>(off),
                                ram_.begin() + static_cast<long>(off + n));
  }

  // The target goes away: no listener, every connection shut down.
  void vanish() {
    std::lock_guard<std::mutex> g(mu_);
    if (listen_fd_ >= 0) {
      ::shutdown(listen_fd_, SHUT_RDWR);
      ::close(listen_fd_);
      listen_fd_ = -1;
    }
    for (int fd : conns_) ::shutdown(fd, SHUT_RDWR);
  }
  void come_back() { listen_on(port_); }
  // > 0: once this many bytes of write data have arrived in total, the target vanishes.
  std::atomic<uint64_t> vanish_after_write_bytes{0};

  std::atomic<uint64_t> connects{0}, in_capsule_writes{0}, r2t_writes{0}, keep_alives{0},
      keep_alives_disabled{0}, digest_connections{0}, shutdowns{0}, r2t_bursts{0};

 private:
  // A command capsule read whole (its in-capsule data with it): a host may send the next
  // capsule while this target waits for a command's H2CData, so they queue here.
  struct Cmd {
    tcp::Pdu p;
    std::vector<uint8_t> data;
  };
  struct Conn {
    int fd;
    tcp::Digests dg;
    uint16_t qid = 0;
    uint32_t maxr2t = 0;     // the host's ICReq MAXR2T (0's based)
    bool discovery = false;  // connected to the discovery subsystem
    std::deque<Cmd> queued;
  };
  static bool read_cmd(tcp::PduReader& r, const tcp::Pdu& p, Cmd* out) {
    std::string err;
    out->p = p;
    out->data.resize(p.data_len);
    return r.read_data(out->data.data(), p.data_len, &err) && r.finish_data(&err);
  }

  void listen_on(uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0) {
      ADD_FAILURE() << "target cannot listen: " << std::strerror(errno);
      ::close(fd);
      return;
    }
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    std::lock_guard<std::mutex> g(mu_);
    port_ = ntohs(a.sin_port);
    listen_fd_ = fd;
    threads_.emplace_back([this, fd] { accept_loop(fd); });
  }

  void accept_loop(int lfd) {
    for (;;) {
      const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard<std::mutex> g(mu_);
      if (listen_fd_ != lfd) {  // vanished meanwhile
        ::close(fd);
        return;
      }
      conns_.push_back(fd);
      threads_.emplace_back([this, fd] {
        serve(fd);
        std::lock_guard<std::mutex> g2(mu_);
        conns_.erase(std::find(conns_.begin(), conns_.end(), fd));
        ::close(fd);
      });
    }
  }

  static ssize_t rd(void* ctx, void* buf, size_t n) {
    const ssize_t r = ::recv(*static_cast<int*>(ctx), buf, n, 0);
    return r < 0 ? -errno : r;
  }

  bool send(Conn& c, const tcp::Pdu& p, const uint8_t* data, uint32_t n) {
    uint8_t h[tcp::kMaxHeaderBytes];
    const size_t hn = tcp::encode_header(p, n, c.dg, 0, h);
    std::vector<uint8_t> out(h, h + hn);
    if (n > 0) {
      out.insert(out.end(), data, data + n);
      if (h[1] & tcp::flag::kDdgst) {
        uint8_t d[4];
        tcp::put_le32(d, tcp::crc32c(data, n));
        out.insert(out.end(), d, d + 4);
      }
    }
    return ::send(c.fd, out.data(), out.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(out.size());
  }

  bool respond(Conn& c, uint16_t cid, uint16_t status, uint32_t dw0 = 0, uint32_t dw1 = 0) {
    tcp::Pdu p;
    p.type = tcp::PduType::kCapsuleResp;
    p.rsp.cid = cid;
    p.rsp.dw0 = dw0;
    p.rsp.dw1 = dw1;
    p.rsp.sq_id = c.qid;
    p.rsp.status = static_cast<uint16_t>(status << 1);
    return send(c, p, nullptr, 0);
  }

  // Sends `data` to the host for command `cid` in C2HData PDUs.
  bool to_host(Conn& c, uint16_t cid, const uint8_t* data, uint32_t n) {
    for (uint32_t off = 0; off < n;) {
      const uint32_t k = std::min(n - off, o_.c2h_chunk);
      tcp::Pdu p;
      p.type = tcp::PduType::kC2HData;
      p.cccid = cid;
      p.offset = off;
      p.length = k;
      if (off + k == n) p.flags = tcp::flag::kLastPdu | (o_.success_flag ? tcp::flag::kSuccess : 0);
      if (!send(c, p, data + off, k)) return false;
      off += k;
    }
    return o_.success_flag ? true : respond(c, cid, 0);
  }

  // Gets the host's data for a command: from its capsule, or by R2T/H2CData.
  bool from_host(Conn& c, tcp::PduReader& r, const Cmd& cmd, uint8_t* dst, uint32_t n, bool* ok) {
    *ok = false;
    std::string err;
    const SubmissionEntry& e = cmd.p.cmd;
    const uint8_t type = static_cast<uint8_t>(e.prp2 >> 56);
    const uint32_t sgl_len = static_cast<uint32_t>(e.prp2);
    if (sgl_len != n) return true;
    if (type == tcp::kSglInCapsule) {
      if (cmd.data.size() != n) return true;
      std::memcpy(dst, cmd.data.data(), n);
      in_capsule_writes.fetch_add(1);
      *ok = count_write(n);
      return *ok;
    }
    if (type != tcp::kSglTransport) return true;
    r2t_writes.fetch_add(1);
    struct Ask {
      uint16_t ttag;
      uint32_t off, len, got;
    };
    const uint32_t burst = std::max<uint32_t>(1, std::min(o_.r2t_burst, c.maxr2t + 1));
    uint16_t ttag = 1;
    for (uint32_t next = 0; next < n;) {
      std::vector<Ask> asks;
      while (asks.size() < burst && next < n) {
        const uint32_t want = std::min(n - next, o_.r2t_max);
        asks.push_back(Ask{ttag++, next, want, 0});
        next += want;
      }
      if (asks.size() > 1) r2t_bursts.fetch_add(1);
      if (o_.r2t_reverse) std::reverse(asks.begin(), asks.end());
      for (const Ask& a : asks) {
        tcp::Pdu r2t;
        r2t.type = tcp::PduType::kR2T;
        r2t.cccid = e.cid;
        r2t.ttag = a.ttag;
        r2t.offset = a.off;
        r2t.length = a.len;
        if (!send(c, r2t, nullptr, 0)) return false;
      }
      for (size_t open = asks.size(); open > 0;) {
        tcp::Pdu d;
        if (!r.read_header(&d, &err)) return false;
        if (d.type == tcp::PduType::kCapsuleCmd) {
          c.queued.emplace_back();
          if (!read_cmd(r, d, &c.queued.back())) return false;
          continue;
        }
        auto a =
            std::find_if(asks.begin(), asks.end(), [&](const Ask& x) { return x.ttag == d.ttag; });
        if (d.type != tcp::PduType::kH2CData || d.cccid != e.cid || a == asks.end() ||
            d.offset != a->off + a->got || d.length > a->len - a->got)
          return false;
        if (!r.read_data(dst + d.offset, d.length, &err) || !r.finish_data(&err)) return false;
        a->got += d.length;
        if (a->got == a->len) --open;
        if (!count_write(d.length)) return false;
      }
    }
    *ok = true;
    return true;
  }

  // NVMe-oF 1.1 §5.3: a 1 KiB header (GENCTR, NUMREC, RECFMT) and 1 KiB entries, strings
  // padded with spaces (TRSVCID, TRADDR) or NULs (SUBNQN).
  std::vector<uint8_t> discovery_log() const {
    struct E {
      uint8_t trtype, subtype;
      std::string nqn;
    };
    std::vector<E> es{
        {3, 2, o_.subnqn}, {3, 3, "nqn.2014-08.org.nvmexpress.discovery"}, {1, 2, o_.subnqn}};
    for (uint32_t i = 1; i <= o_.discovery_extra; ++i)
      es.push_back({3, 2, o_.subnqn + "." + std::to_string(i)});
    std::vector<uint8_t> p(1024 * (es.size() + 1), 0);
    tcp::put_le32(p.data(), 7);  // GENCTR
    tcp::put_le32(p.data() + 8, static_cast<uint32_t>(es.size()));
    for (size_t i = 0; i < es.size(); ++i) {
      uint8_t* e = p.data() + 1024 * (i + 1);
      e[0] = es[i].trtype;
      e[1] = 1;  // IPv4
      e[2] = es[i].subtype;
      tcp::put_le16(e + 4, 1);       // PORTID
      tcp::put_le16(e + 6, 0xffff);  // CNTLID: dynamic
      tcp::put_le16(e + 8, 32);      // ASQSZ
      std::memset(e + 32, ' ', 32);
      const std::string svc = std::to_string(port_);
      std::memcpy(e + 32, svc.data(), svc.size());
      std::memcpy(e + 256, es[i].nqn.data(), std::min<size_t>(es[i].nqn.size(), 255));
      std::memset(e + 512, ' ', 256);
      std::memcpy(e + 512, "127.0.0.1", 9);
    }
    return p;
  }

  // The budget is spent once: the connection thread that spends it takes it back (to 0)
  // and vanishes. Another connection's thread past the budget at the same moment only fails
  // its write: a second vanish() could come after the test's come_back() and close the new
  // listener (the host's reconnect then refused, seen once on a loaded 2-CPU machine).
  bool count_write(uint64_t n) {
    uint64_t limit = vanish_after_write_bytes.load();
    if (limit == 0) return true;
    if (written_.fetch_add(n) + n < limit) return true;
    if (vanish_after_write_bytes.compare_exchange_strong(limit, 0)) vanish();
    return false;
  }

  void serve(int fd) {
    Conn c{fd, {}, 0};
    int fdv = fd;
    tcp::PduReader r(&rd, &fdv);
    r.limits().host = false;
    r.limits().max_data = 8 << 20;
    std::string err;
    tcp::Pdu p;
    if (!r.read_header(&p, &err) || p.type != tcp::PduType::kIcReq) return;
    c.maxr2t = p.maxr2t;
    tcp::Pdu ic;
    ic.type = tcp::PduType::kIcResp;
    ic.pda = o_.cpda;
    ic.dgst = p.dgst & 3;
    ic.maxdata = o_.maxh2c;
    if (!send(c, ic, nullptr, 0)) return;
    c.dg.header = ic.dgst & 1;
    c.dg.data = ic.dgst & 2;
    if (ic.dgst) digest_connections.fetch_add(1);
    r.limits().digests = c.dg;
    std::vector<uint8_t> buf;
    for (;;) {
      Cmd cmd;
      if (!c.queued.empty()) {
        cmd = std::move(c.queued.front());
        c.queued.pop_front();
      } else if (!r.read_header(&p, &err) || p.type != tcp::PduType::kCapsuleCmd ||
                 !read_cmd(r, p, &cmd)) {
        return;
      }
      if (!handle(c, r, cmd, &buf)) return;
    }
  }

  bool handle(Conn& c, tcp::PduReader& r, const Cmd& cmd, std::vector<uint8_t>* buf) {
    const SubmissionEntry& e = cmd.p.cmd;
    const uint16_t invalid_field = make_status(sct::kGeneric, sc::kInvalidField);
    if (e.opcode == 0x7f) {  // Fabrics
      const uint8_t fctype = static_cast<uint8_t>(e.nsid & 0xff);
      if (fctype == 0x01) {  // Connect
        if (cmd.data.size() != 1024) return false;
        const uint8_t* d = cmd.data.data();
        c.qid = static_cast<uint16_t>(e.cdw10 >> 16);
        const std::string nqn(reinterpret_cast<const char*>(d + 256));
        c.discovery = nqn == "nqn.2014-08.org.nvmexpress.discovery";
        if (nqn != o_.subnqn && !(c.discovery && c.qid == 0))
          return respond(c, e.cid, make_status(sct::kCommandSpecific, 0x82));  // invalid params
        connects.fetch_add(1);
        uint16_t id = tcp::get_le16(d + 16);
        if (c.qid == 0) {
          std::lock_guard<std::mutex> g(mu_);
          id = ++cntlid_;
          cc_ = 0;
        }
        return respond(c, e.cid, 0, id);
      }
      const uint32_t ofst = e.cdw11;
      std::lock_guard<std::mutex> g(mu_);
      if (fctype == 0x04) {  // Property Get
        uint64_t v = 0;
        const uint32_t csts = ((cc_ & cc::kEn) ? csts::kRdy : 0) |
                              (((cc_ >> cc::kShnShift) & 3) ? csts::kShstComplete : 0);
        if (ofst == reg::kCap) v = Cap::make(1023, false, 20, 0, 0, 0);
        if (ofst == reg::kVs) v = 0x00010400;
        if (ofst == reg::kCc) v = cc_;
        if (ofst == reg::kCsts) v = csts;
        return respond(c, e.cid, 0, static_cast<uint32_t>(v), static_cast<uint32_t>(v >> 32));
      }
      if (fctype == 0x00) {  // Property Set
        if (ofst != reg::kCc) return respond(c, e.cid, invalid_field);
        cc_ = e.cdw12;
        if ((cc_ >> cc::kShnShift) & 3) shutdowns.fetch_add(1);
        return respond(c, e.cid, 0);
      }
      return respond(c, e.cid, invalid_field);
    }
    const uint8_t sgl_type = static_cast<uint8_t>(e.prp2 >> 56);
    if ((e.flags & 0xc0) != tcp::kPsdtSgl ||
        (sgl_type != tcp::kSglInCapsule && sgl_type != tcp::kSglTransport)) {
      return respond(c, e.cid, invalid_field);
    }
    if (c.discovery) {
      if (e.opcode != admin::kGetLogPage || (e.cdw10 & 0xff) != 0x70)
        return respond(c, e.cid, make_status(sct::kGeneric, sc::kInvalidOpcode));
      const uint64_t len = ((uint64_t{e.cdw11 & 0xffff} << 16 | e.cdw10 >> 16) + 1) * 4;
      const uint64_t lpo = uint64_t{e.cdw13} << 32 | e.cdw12;
      const std::vector<uint8_t> page = discovery_log();
      std::vector<uint8_t> d(len, 0);
      for (uint64_t i = 0; i < len && lpo + i < page.size(); ++i) d[i] = page[lpo + i];
      return to_host(c, e.cid, d.data(), static_cast<uint32_t>(len));
    }
    if (c.qid == 0) {
      if (e.opcode == admin::kIdentify) {
        std::vector<uint8_t> d(4096, 0);
        const uint8_t cns = static_cast<uint8_t>(e.cdw10 & 0xff);
        if (cns == cns::kController) {
          auto* id = reinterpret_cast<IdentifyController*>(d.data());
          id->mdts = o_.mdts;
          id->ver = 0x00010400;
          id->sqes = 0x66;
          id->cqes = 0x44;
          id->nn = 1;
          id->vwc = 1;
          tcp::put_le32(d.data() + 1792, (64 + o_.icd) / 16);  // IOCCSZ
          tcp::put_le32(d.data() + 1796, 1);                   // IORCSZ
        } else if (cns == cns::kActiveNamespaceList) {
          tcp::put_le32(d.data(), 1);
        } else if (cns == cns::kNamespace && e.nsid == 1) {
          auto* ns = reinterpret_cast<IdentifyNamespace*>(d.data());
          ns->nsze = ns->ncap = ns->nuse = o_.lbas;
          ns->lbaf[0].lbads = static_cast<uint8_t>(o_.lba_shift);
        } else {
          return respond(c, e.cid, make_status(sct::kGeneric, sc::kInvalidNamespace));
        }
        return to_host(c, e.cid, d.data(), 4096);
      }
      if (e.opcode == admin::kSetFeatures && (e.cdw10 & 0xff) == fid::kNumberOfQueues)
        return respond(c, e.cid, 0, 7 | (7u << 16));
      if (e.opcode == admin::kSetFeatures || e.opcode == admin::kGetFeatures)
        return respond(c, e.cid, 0);
      if (e.opcode ==
          0x18) {  // Keep Alive: refused before CC.EN = 1 and after a shutdown, as nvmet does
        std::lock_guard<std::mutex> g(mu_);
        if (!(cc_ & cc::kEn) || ((cc_ >> cc::kShnShift) & 3)) {
          keep_alives_disabled.fetch_add(1);
          return respond(c, e.cid, make_status(sct::kGeneric, sc::kCommandSequenceError));
        }
        keep_alives.fetch_add(1);
        return respond(c, e.cid, 0);
      }
      return respond(c, e.cid, make_status(sct::kGeneric, sc::kInvalidOpcode));
    }
    const uint64_t slba = (uint64_t{e.cdw11} << 32) | e.cdw10;
    const uint32_t nlb = (e.cdw12 & 0xffff) + 1;
    const uint64_t off = slba << o_.lba_shift;
    const uint32_t n = nlb << o_.lba_shift;
    const bool in_range = e.nsid == 1 && slba + nlb <= o_.lbas;
    switch (e.opcode) {
      case io::kRead: {
        if (!in_range) return respond(c, e.cid, make_status(sct::kGeneric, sc::kLbaOutOfRange));
        const std::vector<uint8_t> d = read_ram(off, n);
        return to_host(c, e.cid, d.data(), n);
      }
      case io::kWrite: {
        buf->resize(n);
        bool ok = false;
        if (!from_host(c, r, cmd, buf->data(), n, &ok)) return false;
        if (!ok) return respond(c, e.cid, invalid_field);
        if (!in_range) return respond(c, e.cid, make_status(sct::kGeneric, sc::kLbaOutOfRange));
        {
          std::lock_guard<std::mutex> g(ram_mu_);
          std::memcpy(ram_.data() + off, buf->data(), n);
        }
        return respond(c, e.cid, 0);
      }
      case io::kWriteZeroes: {
        if (!in_range) return respond(c, e.cid, make_status(sct::kGeneric, sc::kLbaOutOfRange));
        std::lock_guard<std::mutex> g(ram_mu_);
        std::memset(ram_.data() + off, 0, n);
        return respond(c, e.cid, 0);
      }
      case io::kDatasetManagement: {
        const uint32_t len = ((e.cdw10 & 0xff) + 1) * 16;
        buf->resize(len);
        bool ok = false;
        if (!from_host(c, r, cmd, buf->data(), len, &ok)) return false;
        return respond(c, e.cid, ok ? 0 : invalid_field);
      }
      case io::kFlush:
        return respond(c, e.cid, 0);
      default:
        return respond(c, e.cid, make_status(sct::kGeneric, sc::kInvalidOpcode));
    }
  }

  const Options o_;
  std::mutex ram_mu_;  // guards ram_
  std::vector<uint8_t> ram_;
  std::mutex mu_;  // guards listen_fd_, port_, conns_, threads_, cntlid_, cc_
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::vector<int> conns_;
  std::vector<std::thread> threads_;
  uint16_t cntlid_ = 0;
  uint32_t cc_ = 0;
  std::atomic<uint64_t> written_{0};
};

}  // namespace warpfs::nvme::test
