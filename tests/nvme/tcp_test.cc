// The NVMe/TCP transport (tcp.h) under the real driver stack (Controller, IoEngine,
// NamespaceIo) against the scripted target in tcp_target.h, over loopback TCP: connect and
// identify, reads and writes of every shape (in-capsule, R2T/H2CData in several PDUs, C2HData
// in several PDUs, transfers split at MDTS), digests, several threads at once, and a target
// that vanishes in the middle of a write and comes back.
#include "warpfs/nvme/tcp.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nvme/rig.h"
#include "nvme/tcp_target.h"
#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/device.h"
#include "warpfs/nvme/io_engine.h"
#include "warpfs/nvme/namespace_io.h"

namespace warpfs::nvme::test {
namespace {

struct TcpRig {
  std::unique_ptr<TcpTarget> target;
  std::unique_ptr<TcpTransport> transport;
  std::unique_ptr<Controller> ctrl;
  std::unique_ptr<IoEngine> engine;
  std::unique_ptr<NamespaceIo> ns;

  static std::unique_ptr<TcpRig> make(uint32_t block, bool digests = false,
                                      TcpTarget::Options to = {}) {
    auto r = std::make_unique<TcpRig>();
    r->target = std::make_unique<TcpTarget>(to);
    TcpOptions o;
    o.host = "127.0.0.1";
    o.port = std::to_string(r->target->port());
    o.subnqn = to.subnqn;
    o.header_digest = o.data_digest = digests;
    o.kato_ms = 2000;
    std::string err;
    r->transport = TcpTransport::open(o, &err);
    EXPECT_TRUE(r->transport) << err;
    if (!r->transport) return nullptr;
    ControllerOptions co;
    co.io_queues = 3;
    r->ctrl = Controller::open(*r->transport, co, &err);
    EXPECT_TRUE(r->ctrl) << err;
    if (!r->ctrl) return nullptr;
    EngineOptions eo;
    eo.io_timeout_ns = 4'000'000'000ull;
    eo.log = [](const std::string&) {};
    r->engine = IoEngine::create(*r->ctrl, eo, &err);
    EXPECT_TRUE(r->engine) << err;
    if (!r->engine) return nullptr;
    r->ns = NamespaceIo::create(*r->engine, 1, block, &err);
    EXPECT_TRUE(r->ns) << err;
    return r->ns ? std::move(r) : nullptr;
  }
  ~TcpRig() {
    ns.reset();
    engine.reset();
    ctrl.reset();
    transport.reset();
  }
};

std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((seed * 2654435761u + i * 131) >> 3);
  return v;
}

Status rw(NamespaceIo& ns, uint64_t block, std::vector<uint8_t>& buf, bool write) {
  BlockIo io;
  io.block = block;
  io.count = static_cast<uint32_t>(buf.size() / ns.block_bytes());
  io.write = write;
  io.data = buf.data();
  ns.io(&io, 1);
  return io.status;
}

// The transport against the in-process target over loopback TCP. Where the suite runs on a
// device it does not configure (WARPFS_NVME_TEST_DEVICE: the VFIO guest, whose network may
// not be up), these tests have nothing of that device to test and are skipped.
class Tcp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Rig::real_device()) GTEST_SKIP() << "the TCP transport against its own test target";
  }
};

TEST_F(Tcp, ConnectsAndIdentifies) {
  TcpTarget target;
  TcpOptions o;
  o.host = "127.0.0.1";
  o.port = std::to_string(target.port());
  o.subnqn = target.options().subnqn;
  std::string err;
  auto t = TcpTransport::open(o, &err);
  ASSERT_TRUE(t) << err;
  auto c = Controller::open(*t, ControllerOptions{}, &err);
  ASSERT_TRUE(c) << err;
  ASSERT_EQ(c->namespaces().size(), 1u);
  EXPECT_EQ(c->namespaces()[0].nsid, 1u);
  EXPECT_EQ(c->namespaces()[0].lba_bytes, 512u);
  EXPECT_EQ(c->namespaces()[0].lba_count, target.options().lbas);
  EXPECT_EQ(c->max_transfer_bytes(), 4096u << target.options().mdts);
  EXPECT_TRUE(c->volatile_write_cache());
  EXPECT_FALSE(c->wrr());
  EXPECT_GE(c->io_queues_granted(), 1);
  c.reset();  // a normal shutdown: CC.SHN through Property Set
  EXPECT_EQ(target.shutdowns.load(), 1u);
}

TEST_F(Tcp, WrongSubsystemIsRefusedWithAMessage) {
  TcpTarget target;
  TcpOptions o;
  o.host = "127.0.0.1";
  o.port = std::to_string(target.port());
  o.subnqn = "nqn.2026-11.io.warpfs:nobody";
  std::string err;
  EXPECT_EQ(TcpTransport::open(o, &err), nullptr);
  EXPECT_NE(err.find("Connect refused"), std::string::npos) << err;
  o.port = "1";  // nothing listens there
  EXPECT_EQ(TcpTransport::open(o, &err), nullptr);
  EXPECT_NE(err.find("cannot connect"), std::string::npos) << err;
}

// Every path data takes: 512 B and 4 KiB writes in the capsule, 8 KiB to 128 KiB by R2T and
// H2CData (several PDUs of MAXH2CDATA), 1 MiB split at MDTS into 8 commands; reads in
// C2HData PDUs of 32 KiB, ended by SUCCESS or by a CapsuleResp.
void sizes(bool digests, bool success_flag) {
  TcpTarget::Options to;
  to.success_flag = success_flag;
  auto r = TcpRig::make(512, digests, to);
  ASSERT_TRUE(r);
  uint64_t block = 0;
  for (size_t bytes :
       {size_t{512}, size_t{4096}, size_t{8192}, size_t{20480}, size_t{131072}, size_t{1} << 20}) {
    SCOPED_TRACE(bytes);
    auto data = pattern(bytes, bytes);
    ASSERT_TRUE(rw(*r->ns, block, data, true).is_ok()) << r->transport->last_error();
    EXPECT_EQ(r->target->read_ram(block * 512, bytes), data);
    std::vector<uint8_t> back(bytes, 0);
    ASSERT_TRUE(rw(*r->ns, block, back, false).is_ok());
    EXPECT_EQ(back, data);
    block += bytes / 512 + 3;
  }
  EXPECT_EQ(r->target->in_capsule_writes.load(), 2u);
  EXPECT_EQ(r->target->r2t_writes.load(), 3u + 8u);
  EXPECT_GT(r->transport->counters().r2ts, 0u);
  EXPECT_GT(r->transport->counters().c2h_pdus, 0u);
  EXPECT_EQ(r->target->digest_connections.load(), digests ? r->target->connects.load() : 0u);
  // Flush and trim reach the target and complete.
  EXPECT_TRUE(r->ns->flush().is_ok());
  EXPECT_TRUE(r->ns->trim(0, 16).is_ok());
  // A range past the end fails that transfer alone, with the target's status.
  std::vector<uint8_t> one(512);
  EXPECT_FALSE(rw(*r->ns, r->target->options().lbas, one, false).is_ok());
  EXPECT_TRUE(rw(*r->ns, 0, one, false).is_ok());
}

TEST_F(Tcp, ReadsAndWritesOfEverySize) {
  sizes(false, true);
}
TEST_F(Tcp, ReadsAndWritesOfEverySizeWithDigests) {
  sizes(true, true);
}
TEST_F(Tcp, ReadsEndedByCapsuleResponses) {
  sizes(false, false);
}

// Several R2Ts outstanding per command (TCP §3.6.2.2, MAXR2T): the target asks for a write's
// data in 4 KiB pieces, 4 at a time and in descending offsets; every piece lands where it
// belongs, from 4 threads at once.
TEST_F(Tcp, SeveralR2tsOutstandingPerCommand) {
  TcpTarget::Options to;
  to.icd = 0;  // every write by R2T
  to.r2t_max = 4096;
  to.r2t_burst = 4;
  to.r2t_reverse = true;
  auto r = TcpRig::make(4096, false, to);
  ASSERT_TRUE(r);
  std::vector<std::thread> th;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    th.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const uint32_t blocks = 1 + (i * 5 + t) % 24;  // 4 KiB to 96 KiB
        const uint64_t block = uint64_t(t) * 1024 + (i % 4) * 32;
        auto data = pattern(blocks * 4096, t * 100 + i);
        std::vector<uint8_t> back(data.size());
        if (!rw(*r->ns, block, data, true).is_ok() || !rw(*r->ns, block, back, false).is_ok() ||
            back != data || r->target->read_ram(block * 4096, data.size()) != data)
          bad.fetch_add(1);
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_EQ(bad.load(), 0) << r->transport->last_error();
  EXPECT_GT(r->target->r2t_bursts.load(), 0u);
}

TEST_F(Tcp, SeveralThreadsAtOnce) {
  auto r = TcpRig::make(4096);
  ASSERT_TRUE(r);
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  std::vector<std::thread> th;
  std::atomic<int> bad{0};
  for (int t = 0; t < kThreads; ++t) {
    th.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const uint32_t blocks = 1 + (i * 7 + t) % 12;  // 4 KiB (capsule) to 48 KiB (R2T)
        const uint64_t block = uint64_t(t) * 1024 + (i % 8) * 16;
        auto data = pattern(blocks * 4096, t * 1000 + i);
        std::vector<uint8_t> back(data.size());
        if (!rw(*r->ns, block, data, true).is_ok() || !rw(*r->ns, block, back, false).is_ok() ||
            back != data)
          bad.fetch_add(1);
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_EQ(bad.load(), 0) << r->transport->last_error();
}

// The target goes away in the middle of a 256 KiB write: the write fails (EIO above), no
// thread hangs; once the target is back, the engine's recovery reconnects every queue and
// I/O works again, on a new association (a second admin Connect).
TEST_F(Tcp, TargetVanishingMidWriteGivesAnErrorThenReconnects) {
  auto r = TcpRig::make(4096);
  ASSERT_TRUE(r);
  auto before = pattern(8192, 1);
  ASSERT_TRUE(rw(*r->ns, 0, before, true).is_ok());
  const uint64_t connects = r->target->connects.load();
  r->target->vanish_after_write_bytes = 64 * 1024;
  auto big = pattern(256 * 1024, 2);
  const Status s = rw(*r->ns, 64, big, true);
  EXPECT_FALSE(s.is_ok());
  // Others fail at once too while it is away (no hang).
  std::vector<uint8_t> back(8192);
  r->target->vanish_after_write_bytes = 0;
  r->target->come_back();
  ASSERT_TRUE(r->engine->recover("test: the target is back").is_ok()) << r->transport->last_error();
  ASSERT_TRUE(rw(*r->ns, 0, back, false).is_ok()) << r->transport->last_error();
  EXPECT_EQ(back, before);
  ASSERT_TRUE(rw(*r->ns, 64, big, true).is_ok());
  EXPECT_EQ(r->target->read_ram(64 * 4096, big.size()), big);
  EXPECT_GT(r->target->connects.load(), connects);
  EXPECT_GT(r->transport->counters().connection_failures, 0u);
}

// Keep Alive is sent while the association is idle (every KATO/2), and nothing else is.
TEST_F(Tcp, KeepAliveWhileIdle) {
  auto r = TcpRig::make(4096);
  ASSERT_TRUE(r);
  const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
  while (r->target->keep_alives.load() < 2 && port::now_ns() < deadline) port::sleep_ns(50'000'000);
  EXPECT_GE(r->target->keep_alives.load(), 2u);
}

// Keep Alive belongs to an enabled controller: none while CC.EN = 0 or after a shutdown (nvmet
// logs "got cmd 24 while CC.EN == 0" and fails it; the guest's driver tests showed it), every
// KATO/2 while enabled. The two disabled stretches watch five keep-alive periods each for a
// command that must not come (an observation window, not a wait for something to happen).
TEST_F(Tcp, KeepAliveOnlyWhileEnabled) {
  TcpTarget target;
  TcpOptions o;
  o.host = "127.0.0.1";
  o.port = std::to_string(target.port());
  o.subnqn = target.options().subnqn;
  o.kato_ms = 100;
  std::string err;
  auto t = TcpTransport::open(o, &err);
  ASSERT_TRUE(t) << err;
  port::sleep_ns(250'000'000);
  EXPECT_EQ(target.keep_alives_disabled.load(), 0u);
  auto c = Controller::open(*t, ControllerOptions{}, &err);
  ASSERT_TRUE(c) << err;
  const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
  while (target.keep_alives.load() < 2 && port::now_ns() < deadline) port::sleep_ns(10'000'000);
  EXPECT_GE(target.keep_alives.load(), 2u);
  EXPECT_EQ(target.keep_alives_disabled.load(), 0u);
  c.reset();  // a normal shutdown (CC.SHN), the admin connection still up
  EXPECT_EQ(target.shutdowns.load(), 1u);
  port::sleep_ns(250'000'000);
  EXPECT_EQ(target.keep_alives_disabled.load(), 0u);
}

// What a controller checks in queue creation and deletion (Base §5.4-5.7), the transport
// checks too, since it makes the queues: the same command specific statuses. Number of
// Queues cannot change once queues exist (Base §5.27.1.5); after a reset the queues are gone
// and can be made again. Commands the transport does not know, and namespaces it has not
// seen identified, get the target's own answers (Invalid Opcode, Invalid Namespace).
TEST_F(Tcp, QueueCommandsOpcodesAndNamespacesAsAController) {
  TcpTarget target;
  TcpOptions o;
  o.host = "127.0.0.1";
  o.port = std::to_string(target.port());
  o.subnqn = target.options().subnqn;
  std::string err;
  auto t = TcpTransport::open(o, &err);
  ASSERT_TRUE(t) << err;
  ControllerOptions co;
  co.io_queues = 2;
  auto c = Controller::open(*t, co, &err);
  ASSERT_TRUE(c) << err;
  auto admin = [&](SubmissionEntry e) {
    const Status st = c->admin(e, nullptr, 0, false, nullptr);
    return st.is_ok() ? uint16_t{0} : static_cast<uint16_t>(st.nvme_status() & 0x7ff);
  };
  // Status fields compared by type and code (Do Not Retry is the answerer's judgement).
  auto spec = [](uint8_t code) {
    return static_cast<uint16_t>(make_status(sct::kCommandSpecific, code) & 0x7ff);
  };
  auto gen = [](uint8_t code) {
    return static_cast<uint16_t>(make_status(sct::kGeneric, code) & 0x7ff);
  };
  auto raw = [&](RawQueuePair& qp, SubmissionEntry e) {
    return static_cast<uint16_t>(sf(run_raw(qp, e)) & 0x7ff);
  };
  QueueView v;
  ASSERT_TRUE(c->create_queue_pair(1, 16, QueuePriority::kMedium, &v).is_ok());
  DmaRegion q;
  ASSERT_TRUE(t->dma_alloc(64 * 64, &q).is_ok());
  SubmissionEntry cq{};
  cq.opcode = admin::kCreateIoCq;
  cq.prp1 = q.iova;
  cq.cdw11 = 1;
  cq.cdw10 = 1 | (7u << 16);
  EXPECT_EQ(admin(cq), spec(sc::kInvalidQueueId));  // exists
  cq.cdw10 = 0 | (7u << 16);
  EXPECT_EQ(admin(cq), spec(sc::kInvalidQueueId));  // the admin queue
  cq.cdw10 = 9 | (7u << 16);
  EXPECT_EQ(admin(cq), spec(sc::kInvalidQueueId));  // beyond the 8 the target allocated
  cq.cdw10 = 2 | (0u << 16);
  EXPECT_EQ(admin(cq), spec(sc::kInvalidQueueSize));  // one entry
  cq.cdw10 = 2 | (0xffffu << 16);
  EXPECT_EQ(admin(cq), spec(sc::kInvalidQueueSize));  // beyond CAP.MQES (1023)
  cq.cdw10 = 2 | (7u << 16);
  cq.cdw11 = 1 | 2 | (2048u << 16);
  EXPECT_EQ(admin(cq), spec(sc::kInvalidInterruptVector));
  cq.cdw11 = 1;
  cq.prp1 = q.iova + 64;
  EXPECT_EQ(admin(cq), gen(sc::kInvalidPrpOffset));
  SubmissionEntry sq{};
  sq.opcode = admin::kCreateIoSq;
  sq.prp1 = q.iova;
  sq.cdw10 = 2 | (7u << 16);
  sq.cdw11 = 1 | (3u << 16);
  EXPECT_EQ(admin(sq), spec(sc::kCqInvalid));  // CQ 3 does not exist
  SubmissionEntry del{};
  del.opcode = admin::kDeleteIoCq;
  del.cdw10 = 1;
  EXPECT_EQ(admin(del), spec(sc::kInvalidQueueDeletion));  // SQ 1 is on it
  del.opcode = admin::kDeleteIoSq;
  del.cdw10 = 5;
  EXPECT_EQ(admin(del), spec(sc::kInvalidQueueId));  // never created
  SubmissionEntry nq{};
  nq.opcode = admin::kSetFeatures;
  nq.cdw10 = fid::kNumberOfQueues;
  nq.cdw11 = 3 | (3u << 16);
  EXPECT_EQ(admin(nq), gen(sc::kCommandSequenceError));

  RawQueuePair qp(v);
  SubmissionEntry unknown{};
  unknown.opcode = 0x7e;
  unknown.nsid = 1;
  EXPECT_EQ(raw(qp, unknown), gen(sc::kInvalidOpcode));
  DmaRegion buf;
  ASSERT_TRUE(t->dma_alloc(kPage, &buf).is_ok());
  SubmissionEntry rd = make_read(5, 0, 1);  // namespace 5: never identified, not there
  rd.prp1 = buf.iova;
  EXPECT_EQ(raw(qp, rd), gen(sc::kInvalidNamespace));
  rd.nsid = 1;
  EXPECT_EQ(raw(qp, rd), 0);
  t->dma_free(q);
  t->dma_free(buf);

  // A second driver instance resets the controller: the queues are gone and come back.
  c.reset();
  c = Controller::open(*t, co, &err);
  ASSERT_TRUE(c) << err;
  ASSERT_TRUE(c->create_queue_pair(1, 16, QueuePriority::kMedium, &v).is_ok());
}

TEST_F(Tcp, DeviceStrings) {
  DeviceSpec s;
  std::string err;
  ASSERT_TRUE(parse_device("tcp:10.0.0.2:4420/nqn.2014-08.org.example:disk1", &s, &err)) << err;
  EXPECT_EQ(s.kind, DeviceSpec::Kind::kTcp);
  EXPECT_EQ(s.tcp.host, "10.0.0.2");
  EXPECT_EQ(s.tcp.port, "4420");
  EXPECT_EQ(s.tcp.subnqn, "nqn.2014-08.org.example:disk1");
  EXPECT_EQ(s.tcp.hostnqn, "");
  EXPECT_EQ(s.nsid, 0u);
  ASSERT_TRUE(parse_device("tcp:[::1]:4421/nqn.x:y,ns=3,hostnqn=nqn.h:1", &s, &err)) << err;
  EXPECT_EQ(s.tcp.host, "::1");
  EXPECT_EQ(s.tcp.port, "4421");
  EXPECT_EQ(s.tcp.subnqn, "nqn.x:y");
  EXPECT_EQ(s.tcp.hostnqn, "nqn.h:1");
  EXPECT_EQ(s.nsid, 3u);
  ASSERT_TRUE(parse_device("tcp:store.example:4420/nqn.x:y,hostnqn=nqn.h:2,ns=5", &s, &err));
  EXPECT_EQ(s.tcp.hostnqn, "nqn.h:2");
  EXPECT_EQ(s.nsid, 5u);
  EXPECT_FALSE(s.tcp.header_digest || s.tcp.data_digest);
  ASSERT_TRUE(parse_device("tcp:h:4420/nqn.x:y,digest=both,ns=2,hostnqn=nqn.h:3", &s, &err));
  EXPECT_TRUE(s.tcp.header_digest && s.tcp.data_digest);
  EXPECT_EQ(s.tcp.hostnqn, "nqn.h:3");
  EXPECT_EQ(s.tcp.subnqn, "nqn.x:y");
  EXPECT_EQ(s.nsid, 2u);
  ASSERT_TRUE(parse_device("tcp:h:4420/nqn.x:y,ns=2,digest=data", &s, &err)) << err;
  EXPECT_TRUE(!s.tcp.header_digest && s.tcp.data_digest);
  ASSERT_TRUE(parse_device("tcp:h:4420/nqn.x:y,digest=header", &s, &err)) << err;
  EXPECT_TRUE(s.tcp.header_digest && !s.tcp.data_digest);
  EXPECT_EQ(s.tcp.subnqn, "nqn.x:y");
  for (const char* bad :
       {"tcp:", "tcp:host/nqn", "tcp:host:4420", "tcp:host:4420/", "tcp::4420/n", "tcp:host:0/n",
        "tcp:host:70000/n", "tcp:host:44x/n", "tcp:host:4420/n,hostnqn=", "tcp:host:4420/n,ns=0",
        "tcp:host:4420/n,digest=", "tcp:host:4420/n,digest=crc"}) {
    EXPECT_FALSE(parse_device(bad, &s, &err)) << bad;
    EXPECT_NE(err.find(bad), std::string::npos) << err;
  }
  // The one place DEVICE names are opened takes it to a target.
  TcpTarget target;
  ASSERT_TRUE(parse_device(
      "tcp:127.0.0.1:" + std::to_string(target.port()) + "/" + target.options().subnqn + ",ns=1",
      &s, &err))
      << err;
  auto t = open_transport(s, EmulatedConfig{}, VfioOptions{}, 0, &err);
  ASSERT_TRUE(t) << err;
  EXPECT_EQ(t->name(),
            "tcp:127.0.0.1:" + std::to_string(target.port()) + "/" + target.options().subnqn);
  auto c = Controller::open(*t, ControllerOptions{}, &err);
  ASSERT_TRUE(c) << err;
  EXPECT_NE(c->find_namespace(1), nullptr);
}

// Discovery (NVMe-oF §5): the Discovery Log Page read whole (7 entries: more than the first
// 4 KiB read holds, so header then page), each NVM subsystem over TCP named as a DEVICE that
// opens, the other entries (the discovery subsystem, an RDMA port) left out. Four threads
// discover at once.
TEST_F(Tcp, DiscoveryNamesEachSubsystemAsADevice) {
  TcpTarget::Options to;
  to.discovery_extra = 4;
  TcpTarget target(to);
  TcpOptions o;
  std::string err;
  const std::string at = "127.0.0.1:" + std::to_string(target.port());
  ASSERT_TRUE(parse_discovery_target("tcp:" + at, &o, &err)) << err;
  auto names_of = [&](std::vector<std::string>* names, std::string* e) {
    std::vector<DiscoveryEntry> entries;
    if (!TcpTransport::discover(o, &entries, e)) return false;
    names->clear();
    for (const DiscoveryEntry& d : entries) {
      const std::string n = discovery_device_name(d);
      if (!n.empty()) names->push_back(n);
    }
    return entries.size() == 7;
  };
  std::vector<std::string> names;
  ASSERT_TRUE(names_of(&names, &err)) << err;
  const std::vector<std::string> want{
      "tcp:" + at + "/" + to.subnqn, "tcp:" + at + "/" + to.subnqn + ".1",
      "tcp:" + at + "/" + to.subnqn + ".2", "tcp:" + at + "/" + to.subnqn + ".3",
      "tcp:" + at + "/" + to.subnqn + ".4"};
  EXPECT_EQ(names, want);
  DeviceSpec spec;
  ASSERT_TRUE(parse_device(names[0], &spec, &err)) << err;
  auto t = open_transport(spec, EmulatedConfig{}, VfioOptions{}, 0, &err);
  ASSERT_TRUE(t) << err;
  auto c = Controller::open(*t, ControllerOptions{}, &err);
  ASSERT_TRUE(c) << err;
  EXPECT_NE(c->find_namespace(1), nullptr);

  std::vector<std::thread> ts;
  std::vector<std::vector<std::string>> got(4);
  std::vector<std::string> errs(4);
  std::vector<int> ok(4, 0);
  for (int i = 0; i < 4; ++i) ts.emplace_back([&, i] { ok[i] = names_of(&got[i], &errs[i]); });
  for (std::thread& th : ts) th.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(ok[i]) << errs[i];
    EXPECT_EQ(got[i], want);
  }
}

// Discovery targets and log pages that are wrong: a message, never a crash.
TEST_F(Tcp, DiscoveryBadTargetsAndPages) {
  TcpOptions o;
  std::string err;
  ASSERT_TRUE(parse_discovery_target("tcp:[fe80::1]:4420,hostnqn=nqn.h:1", &o, &err)) << err;
  EXPECT_EQ(o.host, "fe80::1");
  EXPECT_EQ(o.port, "4420");
  EXPECT_EQ(o.hostnqn, "nqn.h:1");
  ASSERT_TRUE(parse_discovery_target("tcp:store.example", &o, &err)) << err;
  EXPECT_EQ(o.port, "8009");
  for (const char* bad : {"tcp:", "vfio:0000:01:00.0", "tcp:h:0", "tcp:h:x", "tcp:h:1/nqn",
                          "tcp:[::1", "tcp:[::1]x", "tcp:h,hostnqn="}) {
    EXPECT_FALSE(parse_discovery_target(bad, &o, &err)) << bad;
    EXPECT_NE(err.find(bad), std::string::npos) << err;
  }
  std::vector<uint8_t> page(2048, 0);
  uint64_t gen = 0;
  std::vector<DiscoveryEntry> es;
  EXPECT_FALSE(parse_discovery_log(page.data(), 512, &gen, &es, &err));
  EXPECT_NE(err.find("shorter than its header"), std::string::npos) << err;
  page[16] = 1;  // RECFMT 1
  EXPECT_FALSE(parse_discovery_log(page.data(), page.size(), &gen, &es, &err));
  EXPECT_NE(err.find("record format"), std::string::npos) << err;
  page[16] = 0;
  page[8] = 200;  // NUMREC beyond the bytes: only what they hold
  page[1024] = 3;
  page[1024 + 2] = 2;
  std::memcpy(&page[1024 + 256], "nqn.a,b", 7);  // a comma: no DEVICE name
  ASSERT_TRUE(parse_discovery_log(page.data(), page.size(), &gen, &es, &err)) << err;
  ASSERT_EQ(es.size(), 1u);
  EXPECT_EQ(discovery_device_name(es[0]), "");
  // Nothing listening: a message naming the place.
  TcpOptions none;
  ASSERT_TRUE(parse_discovery_target("tcp:127.0.0.1:1", &none, &err));
  EXPECT_FALSE(TcpTransport::discover(none, &es, &err));
  EXPECT_NE(err.find("127.0.0.1:1"), std::string::npos) << err;
}

}  // namespace
}  // namespace warpfs::nvme::test
