// Test rig: emulated controller (RAM) -> driver -> IoEngine -> NamespaceIo (4 KiB lines),
// and the cache's backend over it.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "warpfs/cache/cache.h"
#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/emulated.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::cache::test {

struct Stack {
  std::shared_ptr<nvme::BackingStore> store;
  std::unique_ptr<nvme::EmulatedTransport> transport;
  std::unique_ptr<nvme::Controller> ctrl;
  std::unique_ptr<nvme::IoEngine> engine;
  std::unique_ptr<nvme::NamespaceIo> ns;
  std::unique_ptr<NamespaceBackend> backend;

  static std::unique_ptr<Stack> make(uint64_t bytes = 8ull << 20,
                                     std::shared_ptr<nvme::BackingStore> store = nullptr,
                                     nvme::EmulatedConfig cfg = {},
                                     uint64_t io_timeout_ns = nvme::EngineOptions{}.io_timeout_ns) {
    auto s = std::make_unique<Stack>();
    s->store = store ? store : nvme::BackingStore::ram(bytes);
    std::string err;
    s->transport = nvme::EmulatedTransport::create(cfg, s->store, &err);
    EXPECT_TRUE(s->transport) << err;
    if (!s->transport) return nullptr;
    nvme::ControllerOptions o;
    o.io_queues = 3;
    s->ctrl = nvme::Controller::open(*s->transport, o, &err);
    EXPECT_TRUE(s->ctrl) << err;
    if (!s->ctrl) return nullptr;
    nvme::EngineOptions eo;
    eo.queue_entries = 64;
    eo.io_timeout_ns = io_timeout_ns;
    eo.log = [](const std::string&) {};  // tests look at the counters
    s->engine = nvme::IoEngine::create(*s->ctrl, eo, &err);
    EXPECT_TRUE(s->engine) << err;
    if (!s->engine) return nullptr;
    s->ns = nvme::NamespaceIo::create(*s->engine, 1, 4096, &err);
    EXPECT_TRUE(s->ns) << err;
    if (!s->ns) return nullptr;
    s->backend = std::make_unique<NamespaceBackend>(*s->ns);
    return s;
  }
  uint64_t device_reads() const { return transport->counters().reads; }
  uint64_t device_writes() const { return transport->counters().writes; }
  ~Stack() {
    backend.reset();
    ns.reset();
    engine.reset();
    ctrl.reset();
  }
};

inline void fill_block(void* p, uint64_t block, uint64_t gen) {
  auto* w = static_cast<uint64_t*>(p);
  for (int i = 0; i < 512; ++i) w[i] = (block << 20) ^ (gen << 44) ^ static_cast<uint64_t>(i);
}
inline bool block_is(const void* p, uint64_t block, uint64_t gen) {
  const auto* w = static_cast<const uint64_t*>(p);
  for (int i = 0; i < 512; ++i) {
    if (w[i] != ((block << 20) ^ (gen << 44) ^ static_cast<uint64_t>(i))) return false;
  }
  return true;
}

// Writes generation `gen` of blocks [first, first + n) straight to the device.
inline void seed_device(Backend& b, uint64_t first, uint64_t n, uint64_t gen) {
  std::vector<uint8_t> buf(4096);
  for (uint64_t blk = first; blk < first + n; ++blk) {
    fill_block(buf.data(), blk, gen);
    Backend::Op op;
    op.block = blk;
    op.write = true;
    op.data = buf.data();
    b.io(&op, 1);
    ASSERT_TRUE(op.status.is_ok()) << op.status.to_string();
  }
}

// Reads block `blk` straight from the device.
inline std::vector<uint8_t> device_block(Backend& b, uint64_t blk) {
  std::vector<uint8_t> buf(4096);
  Backend::Op op;
  op.block = blk;
  op.data = buf.data();
  b.io(&op, 1);
  EXPECT_TRUE(op.status.is_ok()) << op.status.to_string();
  return buf;
}

}  // namespace warpfs::cache::test
