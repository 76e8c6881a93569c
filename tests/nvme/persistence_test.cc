// Durability: Flush, FUA and shutdown persist what was written before them; a power cut
// may lose unflushed writes but never tears one inside the atomic write unit. Power cuts are
// the emulated controller's hook, so every test here is about the model (on any device,
// Controller.ResetDeletesQueuesAndBringUpWorksAgain checks that a shutdown keeps the data).
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>
#include <thread>
#include <vector>

#include "nvme/rig.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::nvme::test {
namespace {

// Writes `blocks` blocks at `lba` of generation `gen` through a fresh queue.
void write_gen(Rig& r, RawQueuePair& qp, uint64_t lba, uint32_t blocks, uint64_t gen,
               bool fua = false) {
  DmaRegion buf = r.alloc(uint64_t{blocks} * r.lba + kPage);
  for (uint32_t b = 0; b < blocks; ++b) {
    fill_pattern(static_cast<uint8_t*>(buf.vaddr) + uint64_t{b} * r.lba, r.lba, lba + b, gen);
  }
  DmaRegion list = r.alloc(kPage);
  SubmissionEntry w = make_write(r.nsid, lba, blocks, fua);
  ASSERT_TRUE(fill_prps(&w, buf.iova, uint64_t{blocks} * r.lba,
                        PrpList{static_cast<uint64_t*>(list.vaddr), list.iova}));
  ASSERT_EQ(sf(run_raw(qp, w)), 0);
  r.transport->dma_free(buf);
  r.transport->dma_free(list);
}

// Which generation each block holds (-1: neither expected one).
std::vector<int> read_gens(Rig& r, RawQueuePair& qp, uint64_t lba, uint32_t blocks,
                           std::initializer_list<uint64_t> gens) {
  DmaRegion buf = r.alloc(r.lba);
  std::vector<int> out;
  for (uint32_t b = 0; b < blocks; ++b) {
    SubmissionEntry rd = make_read(r.nsid, lba + b, 1);
    rd.prp1 = buf.iova;
    EXPECT_EQ(sf(run_raw(qp, rd)), 0);
    int g = -1;
    for (uint64_t x : gens) {
      if (check_pattern(buf.vaddr, r.lba, lba + b, x)) g = static_cast<int>(x);
    }
    out.push_back(g);
  }
  r.transport->dma_free(buf);
  return out;
}

struct Session {
  std::unique_ptr<Rig> rig;
  QueueView v;
  std::unique_ptr<RawQueuePair> qp;
};
Session power_on(std::shared_ptr<BackingStore> store, uint64_t seed = 1) {
  Session s;
  EmulatedConfig cfg;
  cfg.seed = seed;
  s.rig = Rig::make(cfg, 0, {}, store);
  if (!s.rig) return s;
  EXPECT_TRUE(s.rig->ctrl->create_queue_pair(1, 64, QueuePriority::kMedium, &s.v).is_ok());
  s.qp = std::make_unique<RawQueuePair>(s.v);
  return s;
}
void cut(Session& s, double persist) {
  s.qp.reset();
  s.rig->emu->power_cut(persist);
  s.rig->ctrl.reset();  // its shutdown now fails quietly: the device is gone
  s.rig.reset();
}

TEST(Persistence, UnflushedWritesAreVolatileFlushedOnesSurvive) {
  WARPFS_EMULATED_ONLY() << "power cuts";
  auto store = BackingStore::ram(8 << 20);
  Session s = power_on(store);
  ASSERT_TRUE(s.rig);
  write_gen(*s.rig, *s.qp, 0, 64, 1);
  ASSERT_EQ(sf(run_raw(*s.qp, make_flush(s.rig->nsid))), 0);
  write_gen(*s.rig, *s.qp, 64, 64, 2);  // never flushed
  cut(s, 0.0);
  s = power_on(store);
  ASSERT_TRUE(s.rig);
  for (int g : read_gens(*s.rig, *s.qp, 0, 64, {1})) ASSERT_EQ(g, 1);
  for (int g : read_gens(*s.rig, *s.qp, 64, 64, {2})) ASSERT_EQ(g, -1);  // lost with the cache
}

TEST(Persistence, FuaWritesSurviveWithoutFlush) {
  WARPFS_EMULATED_ONLY() << "power cuts";
  auto store = BackingStore::ram(8 << 20);
  Session s = power_on(store);
  ASSERT_TRUE(s.rig);
  write_gen(*s.rig, *s.qp, 8, 24, 3, /*fua=*/true);
  cut(s, 0.0);
  s = power_on(store);
  for (int g : read_gens(*s.rig, *s.qp, 8, 24, {3})) ASSERT_EQ(g, 3);
}

TEST(Persistence, NormalShutdownPersistsEverything) {
  WARPFS_EMULATED_ONLY() << "power cuts";
  auto store = BackingStore::ram(8 << 20);
  Session s = power_on(store);
  ASSERT_TRUE(s.rig);
  write_gen(*s.rig, *s.qp, 200, 100, 4);
  s.qp.reset();
  ASSERT_TRUE(s.rig->ctrl->shutdown().is_ok());
  cut(s, 0.0);  // the power goes out after the shutdown completed
  s = power_on(store);
  for (int g : read_gens(*s.rig, *s.qp, 200, 100, {4})) ASSERT_EQ(g, 4);
}

// Many 16 KiB writes (four atomic units each) over old data, then a cut that persists a
// random half of the cached units: writes tear, but only at 4 KiB boundaries.
TEST(Persistence, PowerCutTearsOnlyAtAtomicUnitBoundaries) {
  WARPFS_EMULATED_ONLY() << "power cuts";
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    auto store = BackingStore::ram(8 << 20);
    Session s = power_on(store, seed);
    ASSERT_TRUE(s.rig);
    const uint32_t unit = s.rig->ctrl->find_namespace(s.rig->nsid)->atomic_write_blocks;
    ASSERT_EQ(unit * s.rig->lba, 4096u);  // the model's atomic write unit
    constexpr uint32_t kWrite = 32;       // blocks per write: 4 units
    constexpr int kWrites = 16;
    for (int i = 0; i < kWrites; ++i) write_gen(*s.rig, *s.qp, i * kWrite, kWrite, 1);
    ASSERT_EQ(sf(run_raw(*s.qp, make_flush(s.rig->nsid))), 0);
    for (int i = 0; i < kWrites; ++i) write_gen(*s.rig, *s.qp, i * kWrite, kWrite, 2);
    cut(s, 0.5);
    s = power_on(store, seed);
    ASSERT_TRUE(s.rig);
    int torn_writes = 0;
    for (int i = 0; i < kWrites; ++i) {
      std::vector<int> g = read_gens(*s.rig, *s.qp, i * kWrite, kWrite, {1, 2});
      bool mixed = false;
      for (uint32_t b = 0; b < kWrite; ++b) {
        ASSERT_NE(g[b], -1) << "block " << i * kWrite + b << " is neither old nor new";
        // Inside one atomic unit every block has the same generation.
        ASSERT_EQ(g[b], g[b - b % unit]) << "torn inside a unit at block " << b;
        mixed |= g[b] != g[0];
      }
      torn_writes += mixed ? 1 : 0;
    }
    // With half the units persisted, some writes are torn (at unit boundaries).
    EXPECT_GT(torn_writes, 0) << "seed " << seed;
  }
}

TEST(Persistence, ImageFileKeepsDataAcrossControllers) {
  WARPFS_EMULATED_ONLY() << "the model's image file";
  char path[] = "/tmp/warpfs-nvme-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  unlink(path);
  std::string err;
  {
    auto store = BackingStore::open_file(path, 4 << 20, &err);
    ASSERT_TRUE(store) << err;
    Session s = power_on(store);
    ASSERT_TRUE(s.rig);
    write_gen(*s.rig, *s.qp, 10, 40, 9);
    s.qp.reset();
    s.rig.reset();  // the driver shuts the controller down: the cache reaches the file
  }
  auto store = BackingStore::open_file(path, 0, &err);
  ASSERT_TRUE(store) << err;
  EXPECT_EQ(store->bytes(), 4u << 20);
  Session s = power_on(store);
  ASSERT_TRUE(s.rig);
  for (int g : read_gens(*s.rig, *s.qp, 10, 40, {9})) EXPECT_EQ(g, 9);
  s.qp.reset();
  s.rig.reset();
  unlink(path);
}

// The store moves data through a shared mapping of the image file. A page the mapping cannot
// have (here: the file was cut short under it, as an I/O error or a full tmpfs would also
// leave it) raises SIGBUS in the copy; the store then reads or writes with pread/pwrite, which
// say what the file holds: zeroes past its end, and a write there lands in it. From several
// threads at once, each with its own faults, one of them with every signal blocked (as the
// io_uring transport's threads run).
TEST(ImageFile, SurvivesTheFileCutShortUnderItsMapping) {
  char path[] = "/tmp/warpfs-nvme-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::string err;
  auto store = BackingStore::open_file(path, 1 << 20, &err);
  ASSERT_TRUE(store) << err;
  const std::vector<uint8_t> a(8192, 0xab);
  std::vector<uint8_t> b(8192);
  ASSERT_TRUE(store->write(512 << 10, a.data(), a.size()).is_ok());
  ASSERT_TRUE(store->read(512 << 10, b.data(), b.size()).is_ok());
  EXPECT_EQ(b, a);
  ASSERT_EQ(truncate(path, 64 << 10), 0);  // behind the store's back
  std::vector<std::thread> readers;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      if (t == 0) {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, nullptr);
      }
      std::vector<uint8_t> mine(8192);
      for (int i = 0; i < 200; ++i) {
        std::fill(mine.begin(), mine.end(), 0x11);
        const uint64_t off = (uint64_t{128} + uint64_t(t) * 64 + uint64_t(i % 8) * 4) << 10;
        if (!store->read(off, mine.data(), mine.size()).is_ok() ||
            mine != std::vector<uint8_t>(8192, 0)) {
          ++wrong[t];
        }
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
  ASSERT_TRUE(store->write(768 << 10, a.data(), a.size()).is_ok());
  struct stat st {};
  ASSERT_EQ(stat(path, &st), 0);
  EXPECT_EQ(st.st_size, (768 << 10) + 8192);
  std::fill(b.begin(), b.end(), 0);
  ASSERT_TRUE(store->read(768 << 10, b.data(), b.size()).is_ok());
  EXPECT_EQ(b, a);
  store.reset();
  unlink(path);
}

// Large writes populate the mapping first (one madvise instead of a fault per page) and
// remember where; what they write must land in the file all the same: in holes, at region
// edges, after a punch (the store's own, or one behind its back), and past a cut the file
// suffered under the mapping (the populate fails there, the copy faults, pwrite lands it).
// Four threads at once, each in its own slice; every check reads the file itself (pread on
// a descriptor of its own), not the store's mapping.
TEST(ImageFile, LargeWritesLandInHolesAfterPunchesAndPastACut) {
  char path[] = "/tmp/warpfs-nvme-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  std::string err;
  auto store = BackingStore::open_file(path, 8 << 20, &err);
  ASSERT_TRUE(store) << err;
  auto pattern = [](uint64_t off, size_t len, uint8_t seed) {
    std::vector<uint8_t> v(len);
    for (size_t i = 0; i < len; ++i) v[i] = static_cast<uint8_t>(((off + i) >> 9) * 31 + seed);
    return v;
  };
  auto on_file = [&](uint64_t off, size_t len) {
    std::vector<uint8_t> v(len, 0x5a);
    const ssize_t n = pread(fd, v.data(), len, static_cast<off_t>(off));
    if (n >= 0 && static_cast<size_t>(n) < len) std::fill(v.begin() + n, v.end(), 0);
    return v;
  };
  // Each thread: a 256 KiB write at its slice's start, one of 100 KiB that starts 4 KiB into
  // a region and ends inside another, then both again twice: the first write of a region goes
  // through pwrite, the second populates the mapping, the third is a copy alone. Each is read
  // back through the file and through the store (the mapping).
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      const uint64_t base = uint64_t(t) << 20;
      for (uint8_t seed = 1; seed <= 3; ++seed) {
        for (auto [off, len] : {std::pair<uint64_t, size_t>{base, 256 << 10},
                                std::pair<uint64_t, size_t>{base + (260 << 10), 100 << 10}}) {
          const auto v = pattern(off, len, static_cast<uint8_t>(seed + t * 4));
          std::vector<uint8_t> back(len, 0x33);
          if (!store->write(off, v.data(), v.size()).is_ok() || on_file(off, len) != v ||
              !store->read(off, back.data(), len).is_ok() || back != v) {
            ++wrong[t];
          }
        }
      }
    });
  }
  for (auto& w : writers) w.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
  // The store's punch of a populated range: zeroes, and a new write lands.
  ASSERT_TRUE(store->punch(0, 256 << 10).is_ok());
  std::vector<uint8_t> got(256 << 10, 0x77);
  ASSERT_TRUE(store->read(0, got.data(), got.size()).is_ok());
  EXPECT_EQ(got, std::vector<uint8_t>(256 << 10, 0));
  auto v = pattern(0, 256 << 10, 9);
  ASSERT_TRUE(store->write(0, v.data(), v.size()).is_ok());
  EXPECT_EQ(on_file(0, v.size()), v);
  // A punch behind its back: the region stays marked, its pages are gone; the write lands.
  ASSERT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1 << 20, 256 << 10), 0);
  v = pattern(1 << 20, 256 << 10, 10);
  ASSERT_TRUE(store->write(1 << 20, v.data(), v.size()).is_ok());
  EXPECT_EQ(on_file(1 << 20, v.size()), v);
  // The file cut short under the mapping: a large write past the cut lands in the file.
  ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
  v = pattern(5 << 20, 512 << 10, 11);
  ASSERT_TRUE(store->write(5 << 20, v.data(), v.size()).is_ok());
  EXPECT_EQ(on_file(5 << 20, v.size()), v);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, (5 << 20) + (512 << 10));
  store.reset();
  close(fd);
  unlink(path);
}

// The store's SIGBUS handler serves its own copies only: any other SIGBUS still ends the
// process (or reaches the handler installed before, as a sanitizer's).
TEST(ImageFileDeathTest, OtherSigbusStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // TSan: no fork() from a threaded process
  char path[] = "/tmp/warpfs-nvme-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  std::string err;
  auto store = BackingStore::open_file(path, 1 << 20, &err);  // installs the handler
  ASSERT_TRUE(store) << err;
  ASSERT_EQ(ftruncate(fd, 0), 0);
  void* p = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_DEATH(
      {
        volatile uint8_t v = *static_cast<volatile uint8_t*>(p);  // past the end: SIGBUS
        (void)v;
      },
      "");
  munmap(p, 4096);
  close(fd);
  store.reset();
  unlink(path);
}

}  // namespace
}  // namespace warpfs::nvme::test
