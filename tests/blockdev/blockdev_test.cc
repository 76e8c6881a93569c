// The block devices: NVMe, file and cached, against a model; bypass sizes, vectored submit,
// the full-set fallback and trims.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <set>
#include <thread>

#include "cache/cache_rig.h"
#include "warpfs/blockdev/devices.h"
#include "warpfs/blockdev/stack.h"

namespace warpfs::blockdev::test {
namespace {

using cache::test::block_is;
using cache::test::fill_block;
using cache::test::Stack;

void roundtrip(BlockDevice& d) {
  std::vector<uint8_t> w(40 * 4096), r(40 * 4096);
  for (uint64_t b = 0; b < 40; ++b) fill_block(w.data() + b * 4096, 100 + b, 1);
  ASSERT_TRUE(d.write(100, 40, w.data()).is_ok());
  ASSERT_TRUE(d.read(100, 40, r.data()).is_ok());
  EXPECT_EQ(w, r);
  EXPECT_EQ(d.read(d.block_count(), 1, r.data()).code(), Code::kInvalidArgument);
  EXPECT_EQ(d.write(d.block_count() - 1, 2, w.data()).code(), Code::kInvalidArgument);
  EXPECT_EQ(d.read(0, 0, r.data()).code(), Code::kInvalidArgument);
  // Vectored submit.
  BlockDevice::Io ios[3] = {{100, 1, false, r.data(), {}},
                            {139, 1, false, r.data() + 4096, {}},
                            {d.block_count(), 1, false, r.data() + 8192, {}}};
  d.submit(ios, 3);
  EXPECT_TRUE(ios[0].status.is_ok());
  EXPECT_TRUE(ios[1].status.is_ok());
  EXPECT_FALSE(ios[2].status.is_ok());
  EXPECT_TRUE(block_is(r.data(), 100, 1));
  EXPECT_TRUE(block_is(r.data() + 4096, 139, 1));
  ASSERT_TRUE(d.flush().is_ok());
}

TEST(NvmeBlockDevice, RoundTripWithDmaAndPlainBuffers) {
  auto s = Stack::make(16ull << 20);
  ASSERT_TRUE(s);
  std::string err;
  auto d = NvmeBlockDevice::create(*s->engine, 1, 4096, &err);
  ASSERT_TRUE(d) << err;
  EXPECT_EQ(d->block_count(), (16u << 20) / 4096);
  roundtrip(*d);
  void* dma = nullptr;
  ASSERT_TRUE(d->alloc_io_buffer(8 * 4096, &dma).is_ok());
  for (uint64_t b = 0; b < 8; ++b) fill_block(static_cast<uint8_t*>(dma) + b * 4096, b, 2);
  ASSERT_TRUE(d->write(0, 8, dma).is_ok());
  std::vector<uint8_t> r(8 * 4096);
  ASSERT_TRUE(d->read(0, 8, r.data()).is_ok());
  EXPECT_EQ(0, std::memcmp(r.data(), dma, r.size()));
  d->free_io_buffer(dma, 8 * 4096);
  ASSERT_TRUE(d->trim(0, 8).is_ok());
  ASSERT_TRUE(d->read(0, 8, r.data()).is_ok());
  EXPECT_EQ(std::count(r.begin(), r.end(), 0), static_cast<long>(r.size()));  // DLFEAT: zeroes
  EXPECT_EQ(NvmeBlockDevice::create(*s->engine, 7, 4096, &err), nullptr);
}

// IoBuffer: memory from the device that grows only when asked for more, moves with its
// owner, and carries a transfer like any buffer; with no device, heap memory.
TEST(IoBuffer, GrowsMovesAndCarriesTransfers) {
  auto s = Stack::make(16ull << 20);
  ASSERT_TRUE(s);
  std::string err;
  auto d = NvmeBlockDevice::create(*s->engine, 1, 4096, &err);
  ASSERT_TRUE(d) << err;
  IoBuffer a(d.get());
  EXPECT_EQ(a.data(), nullptr);
  a.reserve(8 * 4096);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), 8u * 4096);
  uint8_t* const first = a.data();
  a.reserve(4096);  // enough already: kept
  EXPECT_EQ(a.data(), first);
  a.reserve(40 * 4096);
  EXPECT_EQ(a.size(), 40u * 4096);
  IoBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(a.size(), 0u);
  for (uint64_t k = 0; k < 40; ++k) fill_block(b.data() + k * 4096, 200 + k, 3);
  ASSERT_TRUE(d->write(200, 40, b.data()).is_ok());
  IoBuffer h;  // no device: heap memory
  h.reserve(40 * 4096);
  ASSERT_TRUE(d->read(200, 40, h.data()).is_ok());
  EXPECT_EQ(0, std::memcmp(h.data(), b.data(), 40 * 4096));
  h = std::move(b);              // h's heap memory given back, b's device memory taken
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(block_is(h.data() + 39 * 4096, 239, 3));
}

TEST(FileBlockDevice, RoundTrip) {
  char path[] = "/tmp/warpfs-blockdev-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4 << 20), 0);
  close(fd);
  std::string err;
  auto d = FileBlockDevice::open(path, 4096, &err);
  ASSERT_TRUE(d) << err;
  roundtrip(*d);
  EXPECT_TRUE(d->trim(100, 2).is_ok());
  d.reset();
  unlink(path);
  EXPECT_EQ(FileBlockDevice::open(path, 4096, &err), nullptr);
  EXPECT_NE(err.find(path), std::string::npos);
}

// A stack says it is prompt (a command completes in the thread that submits it, at once) for
// the emulated controller run inline with no latency, and only then: the daemon sizes its
// worker threads by it. Each stack also moves data, so the answer is about a working device.
TEST(DeviceStack, PromptOnlyWhereCompletionsComeInlineAtOnce) {
  char path[] = "/tmp/warpfs-stack-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  unlink(path);  // DeviceStack creates it (create_bytes)
  struct Case {
    bool inline_io;
    uint32_t latency_ns;
    bool prompt;
  } cases[] = {{true, 0, true}, {true, 80'000, false}, {false, 0, false}};
  for (const Case& c : cases) {
    StackOptions so;
    so.create_bytes = 16 << 20;
    so.wait_for_release_s = 0;
    so.emulated.inline_io = c.inline_io;
    so.emulated.latency_ns = c.latency_ns;
    std::string err;
    auto st = DeviceStack::open(std::string("emu:") + path, so, &err);
    ASSERT_TRUE(st) << err;
    EXPECT_EQ(st->prompt(), c.prompt)
        << "inline_io " << c.inline_io << ", latency " << c.latency_ns;
    std::vector<uint8_t> w(4096), r(4096);
    fill_block(w.data(), 7, 1);
    ASSERT_TRUE(st->device().write(7, 1, w.data()).is_ok());
    ASSERT_TRUE(st->device().read(7, 1, r.data()).is_ok());
    EXPECT_EQ(w, r);
  }
  unlink(path);
}

// Threads own disjoint block ranges and do random reads and writes of 1..40 blocks (the
// larger ones bypass the cache; reads also as batches of one-block transfers in either
// class, and around the cache with read_uncached, which must see the lines other threads'
// misses keep evicting and writing back); each read is checked against the model, and after
// a flush the NVMe device itself must hold the model. `set_evictions`: with the background
// write-back, and evictions that write their set back with their victim
// (CacheOptions::evict_with_set), through the NVMe queues in one batch.
void random_io_matches_model(bool set_evictions) {
  auto s = Stack::make(16ull << 20);
  ASSERT_TRUE(s);
  std::string err;
  auto raw = NvmeBlockDevice::create(*s->engine, 1, 4096, &err);
  ASSERT_TRUE(raw) << err;
  cache::CacheOptions o;
  o.sets = 8;
  o.ways = 4;
  o.bypass_lines = 24;
  if (set_evictions) {
    o.writeback_percent = 25;
    o.evict_with_set = true;
  }
  auto d = CachedBlockDevice::create(*s->backend, o, &err);
  ASSERT_TRUE(d) << err;
  roundtrip(*d);
  constexpr int kThreads = 3;
  constexpr uint64_t kSpan = 256;
  std::vector<std::vector<uint64_t>> gen(kThreads, std::vector<uint64_t>(kSpan, 0));
  {
    std::vector<uint8_t> z(kSpan * 4096);
    for (int t = 0; t < kThreads; ++t) {
      for (uint64_t b = 0; b < kSpan; ++b) fill_block(z.data() + b * 4096, 1000 + t * kSpan + b, 0);
      ASSERT_TRUE(raw->write(1000 + t * kSpan, kSpan, z.data()).is_ok());
    }
  }
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t) + 9);
      const uint64_t base = 1000 + t * kSpan;
      std::vector<uint8_t> buf(40 * 4096);
      for (int op = 0; op < 400; ++op) {
        const uint32_t n = 1 + static_cast<uint32_t>(rng() % (rng() % 4 ? 8 : 40));
        const uint64_t off = rng() % (kSpan - n + 1);
        if (rng() % 2) {
          for (uint32_t i = 0; i < n; ++i) {
            fill_block(buf.data() + i * 4096, base + off + i, ++gen[t][off + i]);
          }
          if (!d->write(base + off, n, buf.data()).is_ok()) bad++;
        } else {
          const uint64_t how = rng() % 3;
          if (how == 0) {
            if (!d->read(base + off, n, buf.data()).is_ok()) bad++;
          } else if (how == 1) {  // around the cache: cached lines, else the device
            if (!d->read_uncached(base + off, n, buf.data()).is_ok()) bad++;
          } else {  // the same blocks as n one-block transfers in one batch, any class
            std::vector<BlockDevice::Io> ios(n);
            for (uint32_t i = 0; i < n; ++i) {
              ios[i] =
                  BlockDevice::Io{base + off + i,
                                  1,
                                  false,
                                  buf.data() + i * 4096,
                                  {},
                                  rng() % 2 ? nvme::Priority::kMetadata : nvme::Priority::kBulk};
            }
            d->submit(ios.data(), static_cast<int>(n));
            for (const auto& io : ios) bad += io.status.is_ok() ? 0 : 1;
          }
          for (uint32_t i = 0; i < n; ++i) {
            if (!block_is(buf.data() + i * 4096, base + off + i, gen[t][off + i])) bad++;
          }
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  ASSERT_EQ(bad.load(), 0);
  ASSERT_TRUE(d->flush().is_ok());
  std::vector<uint8_t> r(kSpan * 4096);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(raw->read(1000 + t * kSpan, kSpan, r.data()).is_ok());
    for (uint64_t b = 0; b < kSpan; ++b) {
      EXPECT_TRUE(block_is(r.data() + b * 4096, 1000 + t * kSpan + b, gen[t][b])) << t << "/" << b;
    }
  }
  EXPECT_GT(d->cache().stats().bypassed_bytes, 0u);
  if (set_evictions) d->cache().drain_writeback();
  EXPECT_EQ(d->cache().audit(true), "");
}

TEST(CachedBlockDevice, ConcurrentRandomIoMatchesModel) {
  random_io_matches_model(false);
}

TEST(CachedBlockDevice, ConcurrentRandomIoMatchesModelWhenEvictionsWriteBackTheirSet) {
  random_io_matches_model(true);
}

// Every line of the (single) set is referenced by someone: the device still serves reads
// and writes of other blocks, straight from and to the device, with the right data.
TEST(CachedBlockDevice, FullSetFallsBackToTheDevice) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  std::string err;
  auto raw = NvmeBlockDevice::create(*s->engine, 1, 4096, &err);
  ASSERT_TRUE(raw) << err;
  cache::CacheOptions o;
  o.sets = 1;
  o.ways = 2;
  auto d = CachedBlockDevice::create(*s->backend, o, &err);
  ASSERT_TRUE(d) << err;
  cache::Lane held[2] = {{0, cache::Intent::kRead, nullptr}, {1, cache::Intent::kRead, nullptr}};
  cache::LineRef refs[2];
  ASSERT_EQ(d->cache().acquire(held, 2, refs), 0);
  std::vector<uint8_t> w(4 * 4096), r(4 * 4096);
  for (uint64_t b = 0; b < 4; ++b) fill_block(w.data() + b * 4096, 10 + b, 6);
  ASSERT_TRUE(d->write(10, 4, w.data()).is_ok());
  ASSERT_TRUE(d->read(10, 4, r.data()).is_ok());
  EXPECT_EQ(w, r);
  EXPECT_GT(d->cache().stats().set_full, 0u);
  d->cache().release(held, 2, refs, nullptr);
  ASSERT_TRUE(raw->read(10, 4, r.data()).is_ok());
  EXPECT_EQ(w, r);
}

TEST(CachedBlockDevice, TrimDropsCachedLinesAndDeallocates) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  std::string err;
  auto raw = NvmeBlockDevice::create(*s->engine, 1, 4096, &err);
  ASSERT_TRUE(raw) << err;
  auto d = CachedBlockDevice::create(*s->backend, cache::CacheOptions{}, &err);
  ASSERT_TRUE(d) << err;
  std::vector<uint8_t> w(4 * 4096), r(4 * 4096);
  for (uint64_t b = 0; b < 4; ++b) fill_block(w.data() + b * 4096, 50 + b, 1);
  ASSERT_TRUE(d->write(50, 4, w.data()).is_ok());
  ASSERT_TRUE(d->flush().is_ok());
  ASSERT_TRUE(d->trim(50, 4).is_ok());
  ASSERT_TRUE(d->read(50, 4, r.data()).is_ok());
  EXPECT_EQ(std::count(r.begin(), r.end(), 0), static_cast<long>(r.size()));
}

// The queues (by qid) the device fetched commands from while `work` ran.
template <typename F>
std::set<uint16_t> queues_during(Stack& s, F&& work) {
  s.transport->trace_fetches(true);
  work();
  s.transport->trace_fetches(false);
  const std::vector<uint16_t> t = s.transport->fetch_trace();
  return std::set<uint16_t>(t.begin(), t.end());
}

// A metadata-class write that lands in a cache line keeps its class when the line is
// written back (a commit's checkpoint waits on it); file data's lines go back as bulk.
TEST(CachedBlockDevice, WriteBacksKeepTheClassOfTheirWriter) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  std::string err;
  auto d = CachedBlockDevice::create(*s->backend, cache::CacheOptions{}, &err);
  ASSERT_TRUE(d) << err;
  std::vector<uint8_t> buf(8 * 4096);
  const auto write8 = [&](uint64_t first, nvme::Priority p) {
    std::vector<BlockDevice::Io> ios(8);
    for (uint32_t i = 0; i < 8; ++i) {
      fill_block(buf.data() + i * 4096, first + i, 3);
      ios[i] = BlockDevice::Io{first + i, 1, true, buf.data() + i * 4096, {}, p};
    }
    d->submit(ios.data(), 8);
    for (const auto& io : ios) ASSERT_TRUE(io.status.is_ok());
  };
  write8(200, nvme::Priority::kMetadata);
  const std::set<uint16_t> meta = queues_during(*s, [&] { ASSERT_TRUE(d->flush().is_ok()); });
  write8(300, nvme::Priority::kBulk);
  const std::set<uint16_t> bulk = queues_during(*s, [&] { ASSERT_TRUE(d->flush().is_ok()); });
  // Each flush is eight write-backs and a Flush (metadata class). The rig's engine has one
  // metadata queue: the first flush used only it, the second's writes went elsewhere.
  EXPECT_EQ(meta.size(), 1u) << "metadata write-backs went to a bulk queue";
  size_t elsewhere = 0;
  for (uint16_t q : bulk) elsewhere += meta.count(q) == 0 ? 1 : 0;
  EXPECT_GE(elsewhere, 1u) << "bulk write-backs went to the metadata queue";
  for (uint64_t b = 200; b < 208; ++b)
    EXPECT_TRUE(block_is(cache::test::device_block(*s->backend, b).data(), b, 3)) << b;
}

}  // namespace
}  // namespace warpfs::blockdev::test
