// Test rig: a controller brought up by the real driver, on the device the environment names.
//
// WARPFS_NVME_TEST_DEVICE picks it (the same tests run against a real controller):
//   unset or empty            an emulated controller over RAM, shaped by the test's own
//                             EmulatedConfig; `emu` points at it, so the test may use the
//                             model's hooks (pause, counters, fetch trace, power cut)
//   vfio:DDDD:BB:DD.F[,ns=N]  a PCIe controller bound to vfio-pci (the QEMU guest runs the
//                             suite this way); the namespace under test is N, else the first
//                             active one
//   tcp:HOST:PORT/SUBNQN[,ns=N][,hostnqn=NQN]
//                             an NVMe/TCP target (the QEMU guest's tcp configuration runs the
//                             suite against the kernel's nvmet-tcp); where nvmet answers
//                             otherwise than the base specification (no Arbitration feature,
//                             no LBA range check of its own, zeroed Identify beyond NN) the
//                             tests accept its answer when Rig::fabrics()
//   foreign                   an emulated controller the test does not shape, built like QEMU's
//                             "multi" configuration (three namespaces of 4 KiB LBAs, the one
//                             under test is 2, 128 KiB MDTS, 2048-entry queues, no WRR). CI
//                             runs the suite this way to catch tests that assume 512 B
//                             sectors, namespace 1, or a config they did not get.
//
// A test uses r->nsid, r->lba, r->lbas and the controller's reported limits, never constants
// from its EmulatedConfig. A test about the emulated model itself starts with
// WARPFS_EMULATED_ONLY(); a test with a model-only part guards that part with `if (r->emu)`.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/device.h"
#include "warpfs/nvme/emulated.h"
#include "warpfs/nvme/queue_pair.h"
#include "warpfs/nvme/vfio.h"

namespace warpfs::nvme::test {

inline constexpr uint64_t kPage = 4096;  // CC.MPS = 0: the driver's memory page size

// Skips the test when the device under test is not the test's own emulated controller.
// Append the reason: `WARPFS_EMULATED_ONLY() << "power cuts";`.
#define WARPFS_EMULATED_ONLY()                     \
  if (!::warpfs::nvme::test::Rig::real_device()) { \
  } else                                           \
    GTEST_SKIP() << "tests the emulated controller model: "

struct Rig {
  std::shared_ptr<BackingStore> store;  // null on a real device
  std::unique_ptr<Transport> transport;
  // The test's own emulated controller (WARPFS_NVME_TEST_DEVICE unset), else null.
  EmulatedTransport* emu = nullptr;
  std::unique_ptr<Controller> ctrl;  // declared last: destroyed before the transport
  uint32_t nsid = 0;                 // the namespace under test
  uint32_t lba = 0;                  // its LBA size in bytes
  uint64_t lbas = 0;                 // its LBA count

  static std::string device() {
    const char* e = std::getenv("WARPFS_NVME_TEST_DEVICE");
    return e != nullptr ? std::string(e) : std::string();
  }
  // True when the tests run on a device they do not configure (vfio, tcp or foreign).
  static bool real_device() { return !device().empty(); }
  // True when that device is an NVMe over Fabrics target (tcp:).
  static bool fabrics() { return device().rfind("tcp:", 0) == 0; }

  // The shape of the `foreign` device: QEMU's "multi" configuration in smaller sizes.
  static EmulatedConfig foreign_config() {
    EmulatedConfig f;
    f.namespaces = {NamespaceConfig{4096, (64ull << 20) / 4096},
                    NamespaceConfig{4096, (256ull << 20) / 4096},
                    NamespaceConfig{4096, (128ull << 20) / 4096}};
    f.mdts = 5;  // 128 KiB
    f.max_queue_entries = 2048;
    f.wrr = false;  // QEMU's controller offers round robin only (CAP.AMS = 0)
    f.serial = "WARPFS-FOREIGN";
    return f;
  }
  static constexpr uint32_t kForeignNsid = 2;

  // `cfg`, `bytes`, `store` and `nsid` shape the test's own emulated controller and are
  // ignored on any other device; `o` is honoured everywhere.
  static std::unique_ptr<Rig> make(EmulatedConfig cfg = {}, uint64_t bytes = 64ull << 20,
                                   ControllerOptions o = {},
                                   std::shared_ptr<BackingStore> store = nullptr,
                                   uint32_t nsid = 1) {
    auto r = std::make_unique<Rig>();
    const std::string dev = device();
    std::string err;
    if (dev.empty()) {
      r->store = store ? store : BackingStore::ram(bytes);
      auto t = EmulatedTransport::create(cfg, r->store, &err);
      r->emu = t.get();
      r->transport = std::move(t);
      r->nsid = nsid;
    } else if (dev == "foreign") {
      const EmulatedConfig f = foreign_config();
      uint64_t total = 0;
      for (const NamespaceConfig& n : f.namespaces) total += n.lba_count * n.lba_bytes;
      r->store = BackingStore::ram(total);
      r->transport = EmulatedTransport::create(f, r->store, &err);
      r->nsid = kForeignNsid;
    } else {
      DeviceSpec spec;
      if (!parse_device(dev, &spec, &err) || spec.kind == DeviceSpec::Kind::kEmulated) {
        ADD_FAILURE() << "WARPFS_NVME_TEST_DEVICE='" << dev
                      << "': expected vfio:DDDD:BB:DD.F[,ns=N], tcp:HOST:PORT/SUBNQN[,ns=N] or "
                         "foreign"
                      << (err.empty() ? "" : ": ") << err;
        return nullptr;
      }
      if (spec.kind == DeviceSpec::Kind::kTcp) {
        r->transport = TcpTransport::open(spec.tcp, &err);
      } else {
        r->transport = VfioTransport::open(spec.bdf, VfioOptions{}, &err);
      }
      r->nsid = spec.nsid;  // 0: the first active namespace, once identified
    }
    if (!r->transport) {
      ADD_FAILURE() << (dev.empty() ? "the emulated controller" : "WARPFS_NVME_TEST_DEVICE=" + dev)
                    << ": " << err;
      return nullptr;
    }
    r->ctrl = Controller::open(*r->transport, o, &err);
    if (!r->ctrl) {
      ADD_FAILURE() << r->transport->name() << ": " << err;
      return nullptr;
    }
    if (r->nsid == 0 && !r->ctrl->namespaces().empty()) r->nsid = r->ctrl->namespaces()[0].nsid;
    const NamespaceInfo* ns = r->ctrl->find_namespace(r->nsid);
    if (ns == nullptr) {
      ADD_FAILURE() << r->transport->name() << ": namespace " << r->nsid
                    << " is not an active namespace with a usable LBA format";
      return nullptr;
    }
    r->lba = ns->lba_bytes;
    r->lbas = ns->lba_count;
    return r;
  }

  // The largest transfer of whole blocks one command may move within MDTS whose PRPs
  // fill_prps can build (one list page: 2 MiB).
  uint32_t max_io_bytes() const {
    const uint64_t m = std::min<uint64_t>(ctrl->max_transfer_bytes(), kPage * (kPage / 8));
    return static_cast<uint32_t>(m / lba * lba);
  }

  // A status field as this device is held to it: the emulated controller exactly, any other
  // by its type and code (Base §4.6.1, Figure 92). Do Not Retry and More are the
  // controller's judgement: QEMU, for one, lets a refused queue deletion be retried.
  uint16_t status(uint16_t s) const { return emu ? s : static_cast<uint16_t>(s & 0x7ff); }

  // True if `got` (a status field) answers a command whose LBAs lie beyond the namespace as
  // this device is held to: LBA Out of Range (Base §4.6.1.2.2). The kernel's nvmet does not
  // check the range itself (Linux 6.1): its block device backend fails the I/O at the device's
  // end (Internal Error), its file backend answers Capacity Exceeded.
  bool lba_range_status(uint16_t got) const {
    const uint16_t s = status(got);
    if (s == status(make_status(sct::kGeneric, sc::kLbaOutOfRange))) return true;
    return fabrics() && (s == status(make_status(sct::kGeneric, sc::kInternalError)) ||
                         s == status(make_status(sct::kGeneric, sc::kCapacityExceeded)));
  }

  DmaRegion alloc(size_t bytes) {
    DmaRegion d;
    Status s = transport->dma_alloc(bytes, &d);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return d;
  }
};

// Runs one command on a raw queue pair and waits for its completion (test-only helper).
inline CompletionEntry run_raw(RawQueuePair& qp, SubmissionEntry cmd) {
  EXPECT_TRUE(qp.push(cmd).is_ok());
  qp.ring_sq();
  CompletionEntry cqe{};
  const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
  while (!qp.pop(&cqe)) {
    if (port::now_ns() > deadline) {
      ADD_FAILURE() << "no completion within 10 s";
      return cqe;
    }
    port::thread_yield();
  }
  qp.ring_cq();
  return cqe;
}

inline uint16_t sf(const CompletionEntry& c) {
  return static_cast<uint16_t>(c.status >> 1);
}

// A deterministic pattern for block `lba` in generation `gen`.
inline void fill_pattern(void* p, size_t len, uint64_t lba, uint64_t gen) {
  auto* w = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < len / 8; ++i) w[i] = (lba * 0x9e3779b97f4a7c15ull) ^ (gen << 48) ^ i;
}
inline bool check_pattern(const void* p, size_t len, uint64_t lba, uint64_t gen) {
  const auto* w = static_cast<const uint64_t*>(p);
  for (size_t i = 0; i < len / 8; ++i) {
    if (w[i] != ((lba * 0x9e3779b97f4a7c15ull) ^ (gen << 48) ^ i)) return false;
  }
  return true;
}

}  // namespace warpfs::nvme::test
