// The cache's invariants and behaviours: single copy, one device read per block under a
// storm of misses, coalescing, no eviction of referenced lines, full sets, write-back
// against a model under eviction pressure (TSan), with and without the background
// write-back, its marks and its failures, clean-first eviction, durability, bypass and
// read-ahead.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include "cache/cache_rig.h"

namespace warpfs::cache::test {
namespace {

std::unique_ptr<Cache> make_cache(Backend& b, uint32_t sets, uint32_t ways, bool ra_thread = true,
                                  uint32_t writeback_percent = 0, bool evict_with_set = false) {
  CacheOptions o;
  o.sets = sets;
  o.ways = ways;
  o.readahead_lines = 32;
  o.readahead_thread = ra_thread;
  o.writeback_percent = writeback_percent;
  o.evict_with_set = evict_with_set;
  std::string err;
  auto c = Cache::create(b, o, &err);
  EXPECT_TRUE(c) << err;
  return c;
}

TEST(Cache, ReadsWhatTheDeviceHoldsThroughHeavyEviction) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  seed_device(*s->backend, 0, 200, 1);
  auto c = make_cache(*s->backend, 4, 2);  // 8 lines for 200 blocks
  std::vector<uint8_t> buf(4096);
  for (int pass = 0; pass < 3; ++pass) {
    for (uint64_t b = 0; b < 200; ++b) {
      ASSERT_TRUE(c->read(b, 0, buf.data(), 4096).is_ok());
      ASSERT_TRUE(block_is(buf.data(), b, 1)) << b;
    }
  }
  EXPECT_GT(c->stats().evictions, 500u);
  EXPECT_EQ(c->audit(true), "");
}

TEST(Cache, ConcurrentMissStormReadsEachBlockOnce) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  seed_device(*s->backend, 0, 64, 7);
  auto c = make_cache(*s->backend, 64, 8);  // 512 lines: nothing is evicted
  const uint64_t before = s->device_reads();
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t));
      std::vector<uint64_t> order(64);
      for (uint64_t i = 0; i < 64; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      for (int at = 0; at < 64; at += 16) {  // warps of 16 distinct blocks plus duplicates
        Lane lanes[32];
        LineRef refs[32];
        for (int i = 0; i < 32; ++i) lanes[i] = Lane{order[at + i % 16], Intent::kRead, nullptr};
        if (c->acquire(lanes, 32, refs) != 0) bad++;
        for (int i = 0; i < 32; ++i) {
          if (!refs[i].status.is_ok() || !block_is(refs[i].data, lanes[i].block, 7)) bad++;
        }
        c->release(lanes, 32, refs, nullptr);
      }
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(s->device_reads() - before, 64u) << "each block must be read from the device once";
  const CacheStats st = c->stats();
  EXPECT_EQ(st.misses, 64u);
  EXPECT_EQ(st.coalesced_lanes, 8u * 4 * 16);
  EXPECT_EQ(c->audit(true), "");
}

TEST(Cache, ThirtyTwoLanesOnOneBlockAreOneAcquire) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  seed_device(*s->backend, 0, 8, 3);
  auto c = make_cache(*s->backend, 16, 4);
  const uint64_t before = s->device_reads();
  Lane lanes[32];
  LineRef refs[32];
  for (auto& l : lanes) l = Lane{5, Intent::kRead, nullptr};
  ASSERT_EQ(c->acquire(lanes, 32, refs), 0);
  EXPECT_EQ(s->device_reads() - before, 1u);
  EXPECT_EQ(refs[0].count, 32);
  for (int i = 1; i < 32; ++i) {
    EXPECT_EQ(refs[i].data, refs[0].data);
    EXPECT_EQ(refs[i].count, 0);
  }
  EXPECT_TRUE(block_is(refs[17].data, 5, 3));
  EXPECT_EQ(c->audit(false), "");  // invariants hold with references held too
  c->release(lanes, 32, refs, nullptr);
  EXPECT_EQ(c->stats().coalesced_lanes, 31u);
  EXPECT_EQ(c->stats().misses, 1u);
  EXPECT_EQ(c->audit(true), "");
}

TEST(Cache, ReferencedLinesAreNeverEvictedAndAFullSetFailsCleanly) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  seed_device(*s->backend, 0, 16, 2);
  auto c = make_cache(*s->backend, 1, 4);  // one set of four lines
  Lane held[4];
  LineRef refs[4];
  for (int i = 0; i < 4; ++i) held[i] = Lane{static_cast<uint64_t>(i), Intent::kRead, nullptr};
  ASSERT_EQ(c->acquire(held, 4, refs), 0);
  // Every line is referenced: a fifth block cannot get in, and nothing waits.
  Lane other{9, Intent::kRead, nullptr};
  LineRef r;
  EXPECT_EQ(c->acquire(&other, 1, &r), 1);
  EXPECT_EQ(r.status.code(), Code::kSetFull);
  EXPECT_EQ(c->stats().set_full, 1u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(block_is(refs[i].data, static_cast<uint64_t>(i), 2));
  c->release(held, 4, refs, nullptr);
  ASSERT_EQ(c->acquire(&other, 1, &r), 0);
  EXPECT_TRUE(block_is(r.data, 9, 2));
  c->release(&other, 1, &r, nullptr);
  EXPECT_EQ(c->audit(true), "");
}

TEST(Cache, WholeLineWritesNeverReadTheDevice) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  auto c = make_cache(*s->backend, 8, 4);
  const uint64_t before = s->device_reads();
  std::vector<uint8_t> buf(4096);
  for (uint64_t b = 0; b < 100; ++b) {
    fill_block(buf.data(), b, 4);
    ASSERT_TRUE(c->write(b, 0, buf.data(), 4096).is_ok());
  }
  EXPECT_EQ(s->device_reads(), before) << "a full-line write must not fetch the old line";
  ASSERT_TRUE(c->flush_all().is_ok());
  for (uint64_t b = 0; b < 100; ++b)
    ASSERT_TRUE(block_is(device_block(*s->backend, b).data(), b, 4)) << b;
}

// write_back (fsync of one file): exactly the named blocks' dirty lines reach the device, no
// others, and a second call finds nothing to write.
TEST(Cache, WriteBackWritesExactlyTheNamedBlocks) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  auto c = make_cache(*s->backend, 64, 4);
  std::vector<uint8_t> buf(4096);
  for (uint64_t b = 0; b < 100; ++b) {
    fill_block(buf.data(), b, 5);
    ASSERT_TRUE(c->write(b, 0, buf.data(), 4096).is_ok());
  }
  const uint64_t before = s->device_writes();
  const Cache::Range r[] = {{10, 5}, {50, 1}, {90, 20}};  // 100..109: not cached
  ASSERT_TRUE(c->write_back(r, 3).is_ok());
  EXPECT_EQ(s->device_writes(), before + 5 + 1 + 10);
  for (uint64_t b : {10, 14, 50, 90, 99})
    EXPECT_TRUE(block_is(device_block(*s->backend, b).data(), b, 5)) << b;
  for (uint64_t b : {0, 9, 15, 49, 51, 89})
    EXPECT_FALSE(block_is(device_block(*s->backend, b).data(), b, 5)) << b;
  ASSERT_TRUE(c->write_back(r, 3).is_ok());
  EXPECT_EQ(s->device_writes(), before + 16) << "clean lines are not written again";
  // More blocks named than the cache has lines: the scan form, overlapping runs included.
  const Cache::Range big[] = {{0, 300}, {20, 5}, {40, 1}};
  ASSERT_TRUE(c->write_back(big, 3).is_ok());
  EXPECT_EQ(s->device_writes(), before + 100);
  for (uint64_t b : {0, 9, 15, 49, 51, 89})
    EXPECT_TRUE(block_is(device_block(*s->backend, b).data(), b, 5)) << b;
  ASSERT_TRUE(c->flush_all().is_ok());
  EXPECT_EQ(s->device_writes(), before + 100);
}

// A write-back that finds its line clean because another flusher is writing it must wait for
// that write: when write_back returns, the device holds the block. Writers check the device
// right after their write_back while a flusher keeps flushing everything.
TEST(Cache, WriteBackWaitsForAConcurrentFlushOfTheSameLine) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  auto c = make_cache(*s->backend, 16, 4);
  std::atomic<bool> stop{false};
  std::thread flusher([&] {
    while (!stop.load()) EXPECT_TRUE(c->flush_range(0, 1024).is_ok());
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < 3; ++t) {
    writers.emplace_back([&, t] {
      std::vector<uint8_t> buf(4096);
      for (uint64_t g = 1; g <= 300; ++g) {
        const uint64_t b = static_cast<uint64_t>(t) * 8 + g % 8;
        fill_block(buf.data(), b, g);
        ASSERT_TRUE(c->write(b, 0, buf.data(), 4096).is_ok());
        const Cache::Range r{b, 1};
        ASSERT_TRUE(c->write_back(&r, 1).is_ok());
        ASSERT_TRUE(block_is(device_block(*s->backend, b).data(), b, g)) << b << " gen " << g;
      }
    });
  }
  for (auto& w : writers) w.join();
  stop = true;
  flusher.join();
  EXPECT_EQ(c->audit(true), "");
}

// A backend that passes everything to another (the rig's), for tests that look at or hold
// back some of its I/O. start() is Backend's: io() of the one op, through the subclass's io().
class BackendOver : public Backend {
 public:
  explicit BackendOver(Backend& below) : b_(below) {}
  uint32_t line_bytes() const override { return b_.line_bytes(); }
  uint64_t line_count() const override { return b_.line_count(); }
  Status alloc(size_t bytes, void** out) override { return b_.alloc(bytes, out); }
  void free(void* p, size_t bytes) override { b_.free(p, bytes); }
  void io(Op* ops, int n) override { b_.io(ops, n); }
  Status flush() override { return b_.flush(); }
  Status trim(uint64_t block, uint64_t lines) override { return b_.trim(block, lines); }

 protected:
  Backend& b_;
};

// A backend over the rig's that looks at every line it is asked to write, as the device
// reads it: in two halves with a yield between (a DMA engine reads a line over time too), so
// that a writer copying into the line meanwhile shows as a line of two generations. Every
// writer below writes whole lines of one generation (fill_block).
class TornLineCheck final : public BackendOver {
 public:
  using BackendOver::BackendOver;
  void io(Op* ops, int n) override {
    for (int i = 0; i < n; ++i) {
      if (ops[i].write) look(ops[i]);
    }
    b_.io(ops, n);
  }
  void start(Op* op, std::unique_ptr<Started>* out) override {
    if (op->write) look(*op);
    b_.start(op, out);
  }

  std::atomic<uint64_t> looked{0}, torn{0};

 private:
  void look(const Op& op) {
    std::vector<uint64_t> seen(512);
    for (uint32_t k = 0; k < op.count; ++k) {
      const auto* line = reinterpret_cast<const uint64_t*>(op.data) + size_t{k} * 512;
      const uint64_t blk = op.block + k;
      std::memcpy(seen.data(), line, 2048);
      std::this_thread::yield();
      std::memcpy(seen.data() + 256, line + 256, 2048);
      const uint64_t gen = (seen[0] ^ (blk << 20)) >> 44;  // fill_block's word 0
      looked.fetch_add(1, std::memory_order_relaxed);
      if (!block_is(seen.data(), blk, gen)) torn.fetch_add(1, std::memory_order_relaxed);
    }
  }
};

// Stable lines: a write-back never sends the device a line that a writer is copying into
// (the kernel's stable pages for devices that checksum). Without that, a crash or a kill
// after such a write-back leaves a block on the device that is neither its old contents nor
// its new ones. Writers rewrite lines of their own over and over while flushers (of ranges,
// of named blocks, of everything) and the background write-back write them back.
TEST(Cache, AWriteBackNeverSendsALineAWriterIsCopyingInto) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  constexpr int kWriters = 3;
  constexpr uint64_t kPerWriter = 4;
  constexpr uint64_t kLooks = 3000;
  seed_device(*s->backend, 0, kWriters * kPerWriter, 0);
  TornLineCheck check(*s->backend);
  auto c = make_cache(check, 16, 4, true, 10);  // 64 lines: the background pass starts at 6
  std::atomic<int> writing{kWriters};
  std::vector<std::thread> ts;
  std::vector<uint64_t> last(kWriters * kPerWriter, 0);
  for (int t = 0; t < kWriters; ++t) {
    ts.emplace_back([&, t] {
      std::vector<uint8_t> buf(4096);
      // Until the device has looked at enough write-backs (or 100 million writes, a bound
      // for a cache that never wrote back). fill_block's generations wrap below 2^20.
      for (uint64_t i = 1; i < 100'000'000 && check.looked.load() < kLooks; ++i) {
        const uint64_t b = static_cast<uint64_t>(t) * kPerWriter + i % kPerWriter;
        const uint64_t g = 1 + i % ((1u << 20) - 1);
        fill_block(buf.data(), b, g);
        const Status st = c->write(b, 0, buf.data(), 4096);
        if (!st.is_ok()) {  // (not ASSERT: the flushers wait for this thread's count)
          ADD_FAILURE() << st.to_string();
          break;
        }
        last[b] = g;
      }
      writing--;
    });
  }
  for (int f = 0; f < 2; ++f) {
    ts.emplace_back([&, f] {
      uint64_t n = 0;
      while (writing.load() > 0) {
        const Cache::Range r{n % (kWriters * kPerWriter), 1};
        const Status st = f == 0  ? c->flush_range(0, kWriters * kPerWriter)
                          : n % 8 ? c->write_back(&r, 1)
                                  : c->flush_all();
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        ++n;
      }
    });
  }
  for (auto& th : ts) th.join();
  ASSERT_TRUE(c->flush_all().is_ok());
  c->drain_writeback();
  EXPECT_GE(check.looked.load(), kLooks);  // the write-backs raced the writers
  EXPECT_EQ(check.torn.load(), 0u) << "of " << check.looked.load() << " lines written back";
  for (uint64_t b = 0; b < last.size(); ++b) {
    EXPECT_TRUE(block_is(device_block(*s->backend, b).data(), b, last[b])) << b;
  }
  EXPECT_EQ(c->audit(true), "");
}

// A line is copied in and out whole: readers of lines that two writers both rewrite over and
// over (whole lines of one generation each, the writers' generations odd and even) see one
// generation in every line, never a mix (of a writer's and the line before it, or of the two
// writers'), through the scalar read and the warp API alike.
TEST(Cache, ReadersAndWritersOfOneLineSeeItWhole) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  constexpr uint64_t kBlocks = 4;
  constexpr uint64_t kReads = 50000;
  seed_device(*s->backend, 0, kBlocks, 0);
  auto c = make_cache(*s->backend, 16, 4);
  std::atomic<uint64_t> reads{0}, torn{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 2; ++t) {
    ts.emplace_back([&, t] {
      std::vector<uint8_t> buf(4096);
      // Until the readers are done (generations stay below 2^20).
      for (uint64_t g = 2 + t; g < (1u << 20) && reads.load() < kReads; g += 2) {
        const uint64_t b = g / 2 % kBlocks;  // both writers at every block in turn
        fill_block(buf.data(), b, g);
        ASSERT_TRUE(c->write(b, 0, buf.data(), 4096).is_ok());
      }
    });
  }
  auto whole = [&](const uint8_t* p, uint64_t blk) {
    uint64_t w0;
    std::memcpy(&w0, p, 8);
    const uint64_t gen = (w0 ^ (blk << 20)) >> 44;
    if (!block_is(p, blk, gen)) torn++;
    reads++;
  };
  ts.emplace_back([&] {  // the scalar read
    std::vector<uint8_t> buf(4096);
    for (uint64_t i = 0; reads.load() < kReads; ++i) {
      ASSERT_TRUE(c->read(i % kBlocks, 0, buf.data(), 4096).is_ok());
      whole(buf.data(), i % kBlocks);
    }
  });
  ts.emplace_back([&] {  // a warp over every block, through copy_out
    Lane lanes[kBlocks];
    LineRef refs[kBlocks];
    std::vector<uint8_t> buf(4096);
    for (uint64_t b = 0; b < kBlocks; ++b) lanes[b] = Lane{b, Intent::kRead, nullptr};
    while (reads.load() < kReads) {
      ASSERT_EQ(c->acquire(lanes, kBlocks, refs), 0);
      for (uint64_t b = 0; b < kBlocks; ++b) {
        c->copy_out(refs[b], 0, buf.data(), 4096);
        whole(buf.data(), b);
      }
      c->release(lanes, kBlocks, refs, nullptr);
    }
  });
  for (auto& th : ts) th.join();
  EXPECT_GE(reads.load(), kReads);
  EXPECT_EQ(torn.load(), 0u) << "of " << reads.load() << " reads";
  EXPECT_EQ(c->audit(true), "");
}

// A backend over the rig's whose writes of one block stop at a gate until it is opened: once
// closed, the next `writes` of them (all, by default) wait there; later ones pass.
class GatedWrites final : public BackendOver {
 public:
  GatedWrites(Backend& below, uint64_t block) : BackendOver(below), block_(block) {}
  void io(Op* ops, int n) override {
    for (int i = 0; i < n; ++i) {
      if (ops[i].write && ops[i].block == block_) {
        std::unique_lock<std::mutex> g(mu_);
        ++entered_;
        cv_.notify_all();
        if (to_hold_ == 0) continue;
        --to_hold_;
        cv_.wait(g, [&] { return open_; });
      }
    }
    b_.io(ops, n);
  }
  void close(int writes = std::numeric_limits<int>::max()) {
    std::lock_guard<std::mutex> g(mu_);
    open_ = false;
    to_hold_ = writes;
  }
  void open() {
    std::lock_guard<std::mutex> g(mu_);
    open_ = true;
    to_hold_ = 0;
    cv_.notify_all();
  }
  void wait_entered(int n) {
    std::unique_lock<std::mutex> g(mu_);
    cv_.wait(g, [&] { return entered_ >= n; });
  }

 private:
  const uint64_t block_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int to_hold_ = 0;  // writes still to stop at the gate while it is closed
  int entered_ = 0;
};

// An fsync whose runs name a block three times (a file's runs are merged only when adjacent),
// while a writer's release dirties the block again during its write-back: the call waits for
// its own write-back of the block, then writes the block again, and ends; a later writer of
// the block is not kept waiting. (A flusher that waited for a line it had taken and not yet
// written waited forever, and every writer of that line with it.)
TEST(Cache, AWriteBackNamingABlockTwiceWhileItIsDirtiedAgainEnds) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  constexpr uint64_t kX = 5;
  GatedWrites gate(*s->backend, kX);
  auto c = make_cache(gate, 4, 4);
  std::vector<uint8_t> buf(4096);
  fill_block(buf.data(), kX, 1);
  ASSERT_TRUE(c->write(kX, 0, buf.data(), 4096).is_ok());  // dirty
  Lane l{kX, Intent::kWrite, nullptr};
  LineRef ref;
  ASSERT_EQ(c->acquire(&l, 1, &ref), 0);
  fill_block(buf.data(), kX, 2);
  c->copy_in(ref, 0, buf.data(), 4096);  // a writer has copied, not yet released
  gate.close();
  std::promise<Status> result;
  std::thread fsync([&] {
    const Cache::Range rs[3] = {{kX, 1}, {kX, 1}, {kX, 1}};
    result.set_value(c->write_back(rs, 3));
  });
  gate.wait_entered(1);  // its write-back of X is at the device
  const bool wrote = true;
  c->release(&l, 1, &ref, &wrote);  // X dirty again meanwhile
  gate.open();
  auto done = result.get_future();
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "write_back has not ended after 60 s: it waits on a line it holds\n");
    std::_Exit(1);  // the thread cannot be joined
  }
  fsync.join();
  EXPECT_TRUE(done.get().is_ok());
  EXPECT_TRUE(block_is(device_block(*s->backend, kX).data(), kX, 2));
  fill_block(buf.data(), kX, 3);
  EXPECT_TRUE(c->write(kX, 0, buf.data(), 4096).is_ok());
  ASSERT_TRUE(c->flush_all().is_ok());
  EXPECT_TRUE(block_is(device_block(*s->backend, kX).data(), kX, 3));
  EXPECT_EQ(c->audit(true), "");
}

// Two direct writes of one cached, dirty block at once (the filesystem lets two whole-block
// overwrites run together): A copies into the line and its device write is held; B copies,
// writes the device and returns; a write-back of the line sends B's data; then A's device
// write lands. The line (B's data) must not stay clean over A's data on the device: once A
// returns, a flush makes the device hold what a read through the cache returns.
TEST(Cache, TwoDirectWritesOfOneLineLeaveTheDeviceAndTheLineAlike) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  constexpr uint64_t kX = 5;
  GatedWrites gate(*s->backend, kX);
  auto c = make_cache(gate, 4, 4);
  std::vector<uint8_t> a(4096), b(4096), got(4096);
  fill_block(a.data(), kX, 1);
  ASSERT_TRUE(c->write(kX, 0, a.data(), 4096).is_ok());  // cached and dirty: not dropped
  fill_block(a.data(), kX, 2);
  fill_block(b.data(), kX, 3);
  gate.close(1);  // A's device write waits; B's and the write-back's pass
  std::promise<Status> first;
  std::thread writer_a([&] { first.set_value(c->write_direct(kX, 1, a.data())); });
  gate.wait_entered(1);  // A's data is in the line, its device write held
  ASSERT_TRUE(c->write_direct(kX, 1, b.data()).is_ok());
  const Cache::Range r{kX, 1};
  ASSERT_TRUE(c->write_back(&r, 1).is_ok());  // the line's data (B's) to the device
  gate.open();
  writer_a.join();
  ASSERT_TRUE(first.get_future().get().is_ok());
  ASSERT_TRUE(c->flush_all().is_ok());
  ASSERT_TRUE(c->read(kX, 0, got.data(), 4096).is_ok());
  EXPECT_TRUE(block_is(got.data(), kX, 3));
  EXPECT_TRUE(block_is(device_block(*s->backend, kX).data(), kX, 3))
      << "the device holds other data than the cached line: an eviction would change the block";
  EXPECT_EQ(c->audit(true), "");
}

// Threads own disjoint blocks that share a tiny cache's sets, so every operation fights
// eviction; each thread checks reads against its model, and at the end the device must
// hold exactly the model.
void write_back_matches_model(uint32_t writeback_percent, bool evict_with_set = false,
                              uint32_t sets = 4, uint32_t ways = 2) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  constexpr int kThreads = 4;
  constexpr uint64_t kBlocks = 48;
  seed_device(*s->backend, 0, kBlocks, 0);
  auto c = make_cache(*s->backend, sets, ways, true, writeback_percent, evict_with_set);
  std::atomic<int> bad{0};
  std::mutex first_mu;
  std::string first_error;  // the first thing that went wrong, for the failure message
  auto fail = [&](const std::string& what) {
    bad++;
    std::lock_guard<std::mutex> g(first_mu);
    if (first_error.empty()) first_error = what;
  };
  std::vector<std::vector<uint64_t>> model(kThreads);  // generation per owned block
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(100 + static_cast<uint64_t>(t));
      std::vector<uint64_t>& gen = model[t];
      gen.assign(kBlocks / kThreads, 0);
      std::vector<uint8_t> buf(4096), want(4096);
      for (int op = 0; op < 1500; ++op) {
        const uint64_t k = rng() % gen.size();
        const uint64_t blk = k * kThreads + static_cast<uint64_t>(t);
        switch (rng() % 6) {
          case 0:
          case 1: {  // whole-line write
            fill_block(buf.data(), blk, ++gen[k]);
            Status st = c->write(blk, 0, buf.data(), 4096);
            if (!st.is_ok()) fail("write: " + st.to_string());
            break;
          }
          case 2: {  // partial write: rewrite the second half with the next generation
            fill_block(want.data(), blk, gen[k] + 1);
            Status st = c->write(blk, 2048, want.data() + 2048, 2048);
            if (st.is_ok()) st = c->write(blk, 0, want.data(), 2048);
            if (!st.is_ok()) fail("partial write: " + st.to_string());
            ++gen[k];
            break;
          }
          case 3:
          case 4: {
            Status st = c->read(blk, 0, buf.data(), 4096);
            if (!st.is_ok()) fail("read: " + st.to_string());
            if (st.is_ok() && !block_is(buf.data(), blk, gen[k])) {
              fail("block " + std::to_string(blk) + " read back wrong at op " + std::to_string(op));
            }
            break;
          }
          default: {
            Status st = rng() % 4 ? c->flush_range(blk, 1) : c->flush_all();
            if (!st.is_ok()) fail("flush: " + st.to_string());
          }
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  ASSERT_EQ(bad.load(), 0) << first_error;
  ASSERT_TRUE(c->flush_all().is_ok());
  // The background write-back may still be in a pass the writers kicked, holding a line it
  // writes: quiescent only once it is done.
  c->drain_writeback();
  EXPECT_EQ(c->audit(true), "");
  for (int t = 0; t < kThreads; ++t) {
    for (uint64_t k = 0; k < model[t].size(); ++k) {
      const uint64_t blk = k * kThreads + static_cast<uint64_t>(t);
      EXPECT_TRUE(block_is(device_block(*s->backend, blk).data(), blk, model[t][k])) << blk;
    }
  }
  EXPECT_GT(c->stats().evictions, 100u);
  EXPECT_GT(c->stats().writebacks, 100u);
  if (writeback_percent > 0) {
    EXPECT_GT(c->stats().cleaned, 0u);
  }
}

TEST(Cache, ConcurrentWriteBackMatchesModelUnderEvictionPressure) {
  write_back_matches_model(0);
}

// The same with the background write-back (8 lines: it starts at 2 dirty and runs nearly
// all the time), racing the writers, the flushers and the evictions for the same lines.
TEST(Cache, ConcurrentWriteBackMatchesModelWithTheBackgroundWriteBack) {
  write_back_matches_model(25);
}

// The same where an eviction that writes its dirty victim back sends the set's other dirty,
// unheld lines with it (CacheOptions::evict_with_set): 2 sets of 8 ways, so each such batch
// can take up to 7 lines that other threads are about to write, read, flush or evict, while
// the background write-back takes lines of the same sets.
TEST(Cache, ConcurrentWriteBackMatchesModelWhenEvictionsWriteBackTheirSet) {
  write_back_matches_model(25, true, 2, 8);
}

// 128 lines at 25 %: the thread starts when the 32nd line turns dirty and writes lines back
// until 16 are left; each line it writes reaches the device once, with its newest data.
TEST(Cache, TheBackgroundWriteBackStartsAtItsHighMarkAndStopsAtItsLow) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  seed_device(*s->backend, 0, 64, 1);
  auto c = make_cache(*s->backend, 16, 8, true, 25);
  std::vector<uint8_t> buf(4096);
  const uint64_t writes_before = s->device_writes();
  for (uint64_t b = 0; b < 31; ++b) {
    fill_block(buf.data(), b, 2);
    ASSERT_TRUE(c->write(b, 0, buf.data(), 4096).is_ok());
  }
  c->drain_writeback();
  EXPECT_EQ(c->stats().dirty_lines, 31u);
  EXPECT_EQ(c->stats().cleaned, 0u) << "below the high mark nothing is written";
  EXPECT_EQ(s->device_writes(), writes_before);
  fill_block(buf.data(), 31, 2);
  ASSERT_TRUE(c->write(31, 0, buf.data(), 4096).is_ok());  // the 32nd dirty line
  c->drain_writeback();
  // Two of the 32 blocks per set. The pass checks the count between sets and may meet the
  // last writer's line still referenced (skipped): it stops within a set of the low mark.
  const CacheStats st = c->stats();
  EXPECT_LE(st.dirty_lines, 16u);
  EXPECT_GE(st.dirty_lines, 15u);
  EXPECT_EQ(st.cleaned, 32u - st.dirty_lines);
  EXPECT_EQ(s->device_writes() - writes_before, st.cleaned);
  uint64_t on_device = 0;
  for (uint64_t b = 0; b < 32; ++b) {
    const std::vector<uint8_t> d = device_block(*s->backend, b);
    if (block_is(d.data(), b, 2)) {
      ++on_device;
    } else {
      EXPECT_TRUE(block_is(d.data(), b, 1)) << "block " << b << " is neither old nor new";
    }
    ASSERT_TRUE(c->read(b, 0, buf.data(), 4096).is_ok());
    EXPECT_TRUE(block_is(buf.data(), b, 2)) << b;
  }
  EXPECT_EQ(on_device, st.cleaned);
  ASSERT_TRUE(c->flush_all().is_ok());
  EXPECT_EQ(c->stats().dirty_lines, 0u);
  EXPECT_EQ(c->audit(true), "");
}

// One set of 8 lines, 4 dirty and 4 clean, none recently used: a miss evicts a clean one
// where the background write-back is on (the dirty ones stay cached, nothing is written),
// and the first line the clock meets, a dirty one, where it is off.
TEST(Cache, WithTheBackgroundWriteBackAnEvictionTakesACleanLine) {
  for (const uint32_t pct : {100u, 0u}) {
    SCOPED_TRACE("writeback_percent=" + std::to_string(pct));
    auto s = Stack::make();
    ASSERT_TRUE(s);
    seed_device(*s->backend, 0, 16, 1);
    auto c = make_cache(*s->backend, 1, 8, true, pct);  // 100 %: the thread never starts
    std::vector<uint8_t> buf(4096);
    for (uint64_t b = 0; b < 4; ++b) {
      fill_block(buf.data(), b, 2);
      ASSERT_TRUE(c->write(b, 0, buf.data(), 4096).is_ok());
    }
    for (uint64_t b = 4; b < 8; ++b) ASSERT_TRUE(c->read(b, 0, buf.data(), 4096).is_ok());
    const uint64_t writes_before = s->device_writes();
    ASSERT_TRUE(c->read(8, 0, buf.data(), 4096).is_ok());  // the miss
    EXPECT_TRUE(block_is(buf.data(), 8, 1));
    if (pct > 0) {
      EXPECT_EQ(s->device_writes(), writes_before) << "a clean line was there to take";
      EXPECT_EQ(c->stats().writebacks, 0u);
      EXPECT_EQ(c->stats().dirty_lines, 4u);
      const uint64_t misses = c->stats().misses;
      for (uint64_t b = 0; b < 4; ++b) {
        ASSERT_TRUE(c->read(b, 0, buf.data(), 4096).is_ok());
        EXPECT_TRUE(block_is(buf.data(), b, 2)) << b;
      }
      EXPECT_EQ(c->stats().misses, misses) << "the dirty lines are still cached";
    } else {
      EXPECT_EQ(c->stats().writebacks, 1u) << "the clock's first line was dirty";
      EXPECT_EQ(s->device_writes(), writes_before + 1);
    }
    ASSERT_TRUE(c->flush_all().is_ok());
    for (uint64_t b = 0; b < 4; ++b)
      EXPECT_TRUE(block_is(device_block(*s->backend, b).data(), b, 2)) << b;
    EXPECT_EQ(c->audit(true), "");
  }
}

// A device that fails every write: the background write-back's lines stay dirty (nothing
// is lost, nothing counted as cleaned), and once the device heals a flush writes them all.
TEST(Cache, TheBackgroundWriteBackKeepsLinesItCouldNotWrite) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  auto c = make_cache(*s->backend, 16, 8, true, 25);
  nvme::Fault f;
  f.kind = nvme::FaultKind::kWriteFault;
  f.nlb = 1ull << 40;
  s->transport->inject(f);
  std::vector<uint8_t> buf(4096);
  for (uint64_t b = 0; b < 40; ++b) {
    fill_block(buf.data(), b, 3);
    ASSERT_TRUE(c->write(b, 0, buf.data(), 4096).is_ok());
  }
  c->drain_writeback();
  EXPECT_GT(s->transport->faults_hit(), 0u) << "the thread tried";
  EXPECT_EQ(c->stats().dirty_lines, 40u);
  EXPECT_EQ(c->stats().cleaned, 0u);
  EXPECT_FALSE(c->flush_all().is_ok());
  s->transport->clear_faults();
  ASSERT_TRUE(c->flush_all().is_ok());
  EXPECT_EQ(c->stats().dirty_lines, 0u);
  for (uint64_t b = 0; b < 40; ++b)
    EXPECT_TRUE(block_is(device_block(*s->backend, b).data(), b, 3)) << b;
  EXPECT_EQ(c->audit(true), "");
}

TEST(Cache, FlushedDataSurvivesPowerCutUnflushedIsOnlyInTheCache) {
  auto store = nvme::BackingStore::ram(8 << 20);
  {
    auto s = Stack::make(0, store);
    ASSERT_TRUE(s);
    auto c = make_cache(*s->backend, 16, 4);
    std::vector<uint8_t> buf(4096);
    for (uint64_t b = 0; b < 20; ++b) {
      fill_block(buf.data(), b, 11);
      ASSERT_TRUE(c->write(b, 0, buf.data(), 4096).is_ok());
    }
    ASSERT_TRUE(c->flush_all().is_ok());
    for (uint64_t b = 20; b < 30; ++b) {
      fill_block(buf.data(), b, 12);
      ASSERT_TRUE(c->write(b, 0, buf.data(), 4096).is_ok());  // dirty in the cache only
    }
    c.reset();
    s->transport->power_cut(0.0);
  }
  auto s = Stack::make(0, store);
  ASSERT_TRUE(s);
  for (uint64_t b = 0; b < 20; ++b)
    EXPECT_TRUE(block_is(device_block(*s->backend, b).data(), b, 11)) << b;
  for (uint64_t b = 20; b < 30; ++b)
    EXPECT_FALSE(block_is(device_block(*s->backend, b).data(), b, 12)) << b;
}

TEST(Cache, BypassIsConsistentWithCachedLines) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  seed_device(*s->backend, 0, 64, 1);
  auto c = make_cache(*s->backend, 16, 4);
  std::vector<uint8_t> buf(4096), big(64 * 4096);
  // A dirty cached block inside a bypassed read: the read sees the new data.
  fill_block(buf.data(), 10, 2);
  ASSERT_TRUE(c->write(10, 0, buf.data(), 4096).is_ok());
  ASSERT_TRUE(c->read(11, 0, buf.data(), 4096).is_ok());  // clean cached block
  ASSERT_TRUE(c->read_direct(0, 64, big.data()).is_ok());
  for (uint64_t b = 0; b < 64; ++b) {
    EXPECT_TRUE(block_is(big.data() + b * 4096, b, b == 10 ? 2 : 1)) << b;
  }
  // A bypassed write over cached lines: later cached reads see it.
  for (uint64_t b = 0; b < 64; ++b) fill_block(big.data() + b * 4096, b, 3);
  ASSERT_TRUE(c->write_direct(0, 64, big.data()).is_ok());
  for (uint64_t b : {10ull, 11ull, 40ull}) {
    ASSERT_TRUE(c->read(b, 0, buf.data(), 4096).is_ok());
    EXPECT_TRUE(block_is(buf.data(), b, 3)) << b;
  }
  EXPECT_EQ(c->stats().bypassed_bytes, 2u * 64 * 4096);
  ASSERT_TRUE(c->flush_all().is_ok());  // nothing stale is written back over the bypass
  EXPECT_TRUE(block_is(device_block(*s->backend, 10).data(), 10, 3));
}

// write_direct drops the clean lines it replaces whole that nobody holds: no copy into them
// and no second device write of the same data later; the next cached read of such a block
// is a miss that reads the new data. A dirty line and a line someone holds are updated
// instead (Dirty), and written back once more at the next flush.
TEST(Cache, ADirectWriteDropsTheCleanLinesNobodyHoldsAndUpdatesTheRest) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  seed_device(*s->backend, 0, 64, 1);
  auto c = make_cache(*s->backend, 16, 4);
  std::vector<uint8_t> buf(4096), big(16 * 4096);
  for (uint64_t b = 0; b < 8; ++b) ASSERT_TRUE(c->read(b, 0, buf.data(), 4096).is_ok());
  fill_block(buf.data(), 8, 2);
  ASSERT_TRUE(c->write(8, 0, buf.data(), 4096).is_ok());  // dirty
  ASSERT_TRUE(c->read(9, 0, buf.data(), 4096).is_ok());   // clean, and held below
  Cache::Cursor held(*c, Intent::kRead);
  ASSERT_NE(held.get(9), nullptr);
  const CacheStats before = c->stats();
  for (uint64_t b = 0; b < 16; ++b) fill_block(big.data() + b * 4096, b, 3);
  ASSERT_TRUE(c->write_direct(0, 16, big.data()).is_ok());
  EXPECT_EQ(c->stats().direct_dropped, before.direct_dropped + 8);
  held.copy_out(0, buf.data(), 4096);  // the held line has the new data
  EXPECT_TRUE(block_is(buf.data(), 9, 3));
  held.reset();
  for (uint64_t b = 0; b < 16; ++b) {
    EXPECT_TRUE(block_is(device_block(*s->backend, b).data(), b, 3)) << b;
  }
  ASSERT_TRUE(c->flush_all().is_ok());
  EXPECT_EQ(c->stats().writebacks, before.writebacks + 2) << "blocks 8 and 9 only";
  for (uint64_t b = 0; b < 10; ++b) {
    ASSERT_TRUE(c->read(b, 0, buf.data(), 4096).is_ok());
    EXPECT_TRUE(block_is(buf.data(), b, 3)) << b;
  }
  EXPECT_EQ(c->stats().misses, before.misses + 8) << "the dropped blocks, read again";
  EXPECT_EQ(c->audit(true), "");
}

// read_direct of blocks the cache holds whole copies them from the lines (the dirty one's
// new data) without a device read; of one it does not hold, it reads the device into the
// buffer and takes no line: the next cached read of that block is a miss.
TEST(Cache, DirectReadsOfCachedLinesSkipTheDeviceAndMissesTakeNoLine) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  seed_device(*s->backend, 0, 64, 1);
  auto c = make_cache(*s->backend, 16, 4);
  std::vector<uint8_t> buf(4096), two(2 * 4096);
  fill_block(buf.data(), 10, 2);
  ASSERT_TRUE(c->write(10, 0, buf.data(), 4096).is_ok());  // dirty
  ASSERT_TRUE(c->read(11, 0, buf.data(), 4096).is_ok());   // clean
  const CacheStats before = c->stats();
  const uint64_t reads = s->device_reads();
  ASSERT_TRUE(c->read_direct(10, 2, two.data()).is_ok());
  EXPECT_EQ(s->device_reads(), reads);
  EXPECT_TRUE(block_is(two.data(), 10, 2));
  EXPECT_TRUE(block_is(two.data() + 4096, 11, 1));
  EXPECT_EQ(c->stats().hits, before.hits + 2);
  EXPECT_EQ(c->stats().bypassed_bytes, before.bypassed_bytes);
  // Block 12 is not cached: one device read, no line, no miss counted.
  ASSERT_TRUE(c->read_direct(12, 1, buf.data()).is_ok());
  EXPECT_EQ(s->device_reads(), reads + 1);
  EXPECT_TRUE(block_is(buf.data(), 12, 1));
  EXPECT_EQ(c->stats().misses, before.misses);
  EXPECT_EQ(c->stats().bypassed_bytes, before.bypassed_bytes + 4096);
  ASSERT_TRUE(c->read(12, 0, buf.data(), 4096).is_ok());
  EXPECT_EQ(c->stats().misses, before.misses + 1);
  EXPECT_EQ(s->device_reads(), reads + 2);
  EXPECT_EQ(c->audit(true), "");
}

// read_direct_start: a range the cache holds whole ends at once (no device read); a range
// with misses, into DMA memory, is in flight on return (a 50 ms device) with its cached lines
// pinned, and another thread polls it to its end: the dirty line's data over the device's,
// counted as bypassed, the pins gone (audit). Plain memory is read at once.
TEST(Cache, DirectReadStartLeavesTheDeviceReadInFlightAndLaysCachedLinesOverIt) {
  nvme::EmulatedConfig cfg;
  cfg.latency_ns = 50'000'000;
  auto s = Stack::make(8ull << 20, nullptr, cfg);
  ASSERT_TRUE(s);
  seed_device(*s->backend, 0, 24, 1);  // one 50 ms write each
  auto c = make_cache(*s->backend, 16, 4);
  std::vector<uint8_t> buf(4096);
  fill_block(buf.data(), 10, 2);
  ASSERT_TRUE(c->write(10, 0, buf.data(), 4096).is_ok());  // dirty
  ASSERT_TRUE(c->read(11, 0, buf.data(), 4096).is_ok());   // clean
  void* dma = nullptr;
  ASSERT_TRUE(s->backend->alloc(8 * 4096, &dma).is_ok());
  auto* d = static_cast<uint8_t*>(dma);

  std::unique_ptr<Cache::DirectRead> pending;
  uint64_t reads = s->device_reads();
  ASSERT_TRUE(c->read_direct_start(10, 2, d, nvme::Priority::kBulk, &pending).is_ok());
  EXPECT_EQ(pending, nullptr);
  EXPECT_EQ(s->device_reads(), reads);
  EXPECT_TRUE(block_is(d, 10, 2));
  EXPECT_TRUE(block_is(d + 4096, 11, 1));

  const CacheStats before = c->stats();
  ASSERT_TRUE(c->read_direct_start(8, 8, d, nvme::Priority::kBulk, &pending).is_ok());
  ASSERT_NE(pending, nullptr);
  EXPECT_FALSE(pending->poll()) << "a 50 ms read ended at once";
  std::thread other([&] {
    port::Backoff b;
    while (!pending->poll()) pending->idle(b);
  });
  other.join();
  ASSERT_TRUE(pending->status().is_ok()) << pending->status().to_string();
  for (uint64_t b = 8; b < 16; ++b) {
    EXPECT_TRUE(block_is(d + (b - 8) * 4096, b, b == 10 ? 2 : 1)) << b;
  }
  EXPECT_EQ(c->stats().bypassed_bytes, before.bypassed_bytes + 8 * 4096);
  EXPECT_EQ(c->stats().misses, before.misses);
  pending.reset();
  EXPECT_EQ(c->audit(true), "");  // no pin left

  std::vector<uint8_t> plain(4 * 4096);
  reads = s->device_reads();
  ASSERT_TRUE(c->read_direct_start(20, 4, plain.data(), nvme::Priority::kBulk, &pending).is_ok());
  EXPECT_EQ(pending, nullptr);
  EXPECT_EQ(s->device_reads(), reads + 1);
  for (uint64_t b = 20; b < 24; ++b) EXPECT_TRUE(block_is(plain.data() + (b - 20) * 4096, b, 1));
  s->backend->free(dma, 8 * 4096);
}

TEST(Cache, ReadAheadFetchesAheadOfSequentialStreamsAndStaysFresh) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  seed_device(*s->backend, 0, 256, 1);
  auto c = make_cache(*s->backend, 64, 8);
  std::vector<uint8_t> buf(4096);
  ReadStream st;
  for (uint64_t b = 0; b < 4; ++b) {
    ASSERT_TRUE(c->read(b, 0, buf.data(), 4096).is_ok());
    c->note_read(&st, b, 1);
  }
  c->drain_readahead();
  EXPECT_GE(c->stats().readahead_lines, 16u);
  // A prefetched block rewritten behind the cache's back (bypass) is dropped, not stale: the
  // one miss below, which reads the new data.
  std::vector<uint8_t> fresh(4096);
  fill_block(fresh.data(), 6, 9);
  ASSERT_TRUE(c->write_direct(6, 1, fresh.data()).is_ok());
  const uint64_t misses = c->stats().misses;
  for (uint64_t b = 4; b < 20; ++b) {
    ASSERT_TRUE(c->read(b, 0, buf.data(), 4096).is_ok());
    EXPECT_TRUE(block_is(buf.data(), b, b == 6 ? 9 : 1)) << b;
    c->note_read(&st, b, 1);
  }
  c->drain_readahead();
  EXPECT_EQ(c->stats().misses, misses + 1) << "sequential reads were served by read-ahead";
  EXPECT_GE(c->stats().readahead_hits, 15u);

  // Read-ahead off for a stream (fadvise RANDOM): nothing is fetched ahead.
  ReadStream off;
  off.readahead = false;
  const uint64_t ra = c->stats().readahead_lines;
  for (uint64_t b = 100; b < 110; ++b) {
    ASSERT_TRUE(c->read(b, 0, buf.data(), 4096).is_ok());
    c->note_read(&off, b, 1);
  }
  c->drain_readahead();
  EXPECT_EQ(c->stats().readahead_lines, ra);
  EXPECT_EQ(c->audit(true), "");
}

TEST(Cache, CursorReusesItsReference) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  seed_device(*s->backend, 0, 4, 5);
  auto c = make_cache(*s->backend, 8, 2);
  uint64_t sum = 0;
  {
    Cache::Cursor cur(*c, Intent::kRead);
    for (int i = 0; i < 4 * 512; ++i) {
      const uint64_t blk = static_cast<uint64_t>(i / 512);
      const uint8_t* p = cur.get(blk);
      ASSERT_NE(p, nullptr);
      sum += reinterpret_cast<const uint64_t*>(p)[i % 512];
    }
  }
  EXPECT_NE(sum, 0u);
  const CacheStats st = c->stats();
  EXPECT_EQ(st.hits + st.misses + st.locked_hits, 4u) << "one acquire per block, not per access";
  EXPECT_EQ(c->audit(true), "");
}

TEST(Cache, BadBlocksAndOptionsAreErrors) {
  auto s = Stack::make();
  ASSERT_TRUE(s);
  CacheOptions o;
  o.sets = 3;
  std::string err;
  EXPECT_EQ(Cache::create(*s->backend, o, &err), nullptr);
  EXPECT_NE(err.find("power of two"), std::string::npos);
  auto c = make_cache(*s->backend, 4, 2);
  std::vector<uint8_t> buf(4096);
  EXPECT_EQ(c->read(s->backend->line_count(), 0, buf.data(), 4096).code(), Code::kInvalidArgument);
  EXPECT_EQ(c->read(0, 4000, buf.data(), 200).code(), Code::kInvalidArgument);
  EXPECT_EQ(c->audit(true), "");
}

}  // namespace
}  // namespace warpfs::cache::test
