// The NVMe/TCP transport (tcp.h) under the real driver stack (Controller, IoEngine,
// NamespaceIo) against the scripted target in tcp_target.h, over loopback TCP: connect and
// identify, reads and writes of every shape (in-capsule, R2T/H2CData in several PDUs, C2HData
// in several PDUs, transfers split at MDTS), digests, several threads at once, and a target
// that vanishes in the middle of a write and comes back.
#include "warpfs/nvme/tcp.h"

#include <gtest/gtest.h>

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
  for (const char* bad :
       {"tcp:", "tcp:host/nqn", "tcp:host:4420", "tcp:host:4420/", "tcp::4420/n", "tcp:host:0/n",
        "tcp:host:70000/n", "tcp:host:44x/n", "tcp:host:4420/n,hostnqn=", "tcp:host:4420/n,ns=0"}) {
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

}  // namespace
}  // namespace warpfs::nvme::test
