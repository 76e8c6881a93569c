// Test rig: an emulated controller over RAM, brought up by the real driver.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/emulated.h"
#include "warpfs/nvme/queue_pair.h"

namespace warpfs::nvme::test {

struct Rig {
  std::shared_ptr<BackingStore> store;
  std::unique_ptr<EmulatedTransport> transport;
  std::unique_ptr<Controller> ctrl;

  static std::unique_ptr<Rig> make(EmulatedConfig cfg = {}, uint64_t bytes = 64ull << 20,
                                   ControllerOptions o = {},
                                   std::shared_ptr<BackingStore> store = nullptr) {
    auto r = std::make_unique<Rig>();
    r->store = store ? store : BackingStore::ram(bytes);
    std::string err;
    r->transport = EmulatedTransport::create(cfg, r->store, &err);
    EXPECT_NE(r->transport, nullptr) << err;
    if (!r->transport) return nullptr;
    r->ctrl = Controller::open(*r->transport, o, &err);
    EXPECT_NE(r->ctrl, nullptr) << err;
    if (!r->ctrl) return nullptr;
    return r;
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
