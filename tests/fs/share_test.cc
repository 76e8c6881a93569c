// Shared blocks (fs/FORMAT.md "Shared blocks"): copy_file_range clones whole blocks, writes
// into a shared block copy it first, freeing drops references, dedupe_range and the dedup pass
// share equal blocks only; all of it exact in the free counts, alone and among threads.
#include <linux/falloc.h>
#include <sys/stat.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

constexpr uint64_t kB = kBlockSize;

uint64_t free_blocks(Rig& r) {
  struct statvfs st;
  EXPECT_EQ(r.fs->statfs(&st), 0);
  return st.f_bfree;
}

// The device blocks a file maps, in logical order (holes and unwritten extents left out).
std::vector<uint64_t> blocks_of(Rig& r, Ino f) {
  InodeReport rep;
  EXPECT_EQ(r.fs->inspect(f, &rep), 0);
  std::vector<uint64_t> out;
  for (const Extent& e : rep.extents) {
    if (e.unwritten()) continue;
    for (uint32_t i = 0; i < e.blocks(); ++i) out.push_back(e.physical + i);
  }
  return out;
}

// The core's counts against the references the files' extents make (what fsck checks,
// from the inside): a block mapped n >= 2 times counts n, one mapped once counts 0.
void expect_counts_match(Rig& r, const std::vector<Ino>& files) {
  std::map<uint64_t, uint32_t> refs;
  for (Ino f : files) {
    for (uint64_t b : blocks_of(r, f)) ++refs[b];
  }
  uint64_t shared = 0;
  for (auto [b, n] : refs) {
    EXPECT_EQ(r.fs->block_refs(b), n >= 2 ? n : 0) << "block " << b;
    shared += n >= 2;
  }
  EXPECT_EQ(r.fs->stats().shared_blocks, shared);
}

std::unique_ptr<Rig> shared_rig(uint64_t mib = 64) {
  auto r = Rig::make(mib);
  if (!r) return r;
  Superblock sb = r->superblock_at(0);
  if (!(sb.features & kFeatureSharedBlocks)) {
    EXPECT_TRUE(r->set_features(sb.features | kFeatureSharedBlocks));
  }
  return r;
}

int clone(Rig& r, Ino in, uint64_t off_in, Ino out, uint64_t off_out, uint64_t len,
          uint64_t* copied = nullptr) {
  uint64_t c = 0;
  const int rc = r.fs->copy_file_range(in, off_in, out, off_out, len, &c);
  if (copied) *copied = c;
  return rc;
}

TEST(Share, CloneSharesEveryBlockAndTakesNoSpace) {
  auto r = shared_rig();
  ASSERT_TRUE(r);
  const Ino a = r->create(kRootInode, "a");
  const std::string data = pattern(1, 0, 300 * kB + 123);  // a partial last block
  ASSERT_EQ(r->write(a, 0, data), 0);
  ASSERT_EQ(r->fs->fsync(a, false), 0);
  const uint64_t before = free_blocks(*r);
  const Ino b = r->create(kRootInode, "b");
  uint64_t copied = 0;
  ASSERT_EQ(clone(*r, a, 0, b, 0, 1 << 30, &copied), 0) << r->log;
  EXPECT_EQ(copied, data.size());
  EXPECT_EQ(r->size(b), data.size());
  EXPECT_EQ(r->read(b, 0, data.size() + 10), data);
  // Every block, the partial last one too, is a's; only the table was allocated.
  const std::vector<uint64_t> ba = blocks_of(*r, a), bb = blocks_of(*r, b);
  EXPECT_EQ(ba.size(), 301u);
  EXPECT_EQ(ba, bb);
  for (uint64_t blk : ba) EXPECT_EQ(r->fs->block_refs(blk), 2u) << blk;
  EXPECT_EQ(before - free_blocks(*r), kRefcountBlocks);
  const FsStats s = r->fs->stats();
  EXPECT_EQ(s.shared_blocks, 301u);
  EXPECT_EQ(s.saved_blocks, 301u);
  Attr at;
  ASSERT_EQ(r->fs->getattr(b, &at), 0);
  EXPECT_EQ(at.blocks, 301u * (kB / 512));  // st_blocks counts shared blocks
  // Survives a remount, and fsck agrees with the counts.
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(r->read(b, 0, data.size()), data);
  EXPECT_EQ(r->fs->stats().shared_blocks, 301u);
}

TEST(Share, WritesCopyTheSharedBlockAndLeaveTheOtherFileAlone) {
  auto r = shared_rig();
  ASSERT_TRUE(r);
  const Ino a = r->create(kRootInode, "a");
  const std::string data = pattern(2, 0, 64 * kB);
  ASSERT_EQ(r->write(a, 0, data), 0);
  const Ino b = r->create(kRootInode, "b");
  ASSERT_EQ(clone(*r, a, 0, b, 0, data.size()), 0);
  const uint64_t before = free_blocks(*r);
  const std::vector<uint64_t> orig = blocks_of(*r, a);
  // A partial write into block 3 of b, a whole-block write over blocks 10-11 of a, and an
  // overwrite through the fast path's size (aligned, inside the file) of b's block 20.
  std::string mb = data, ma = data;
  ASSERT_EQ(r->write(b, 3 * kB + 100, "hello"), 0);
  mb.replace(3 * kB + 100, 5, "hello");
  const std::string w = pattern(9, 0, 2 * kB);
  ASSERT_EQ(r->write(a, 10 * kB, w), 0);
  ma.replace(10 * kB, 2 * kB, w);
  const std::string w2 = pattern(10, 0, kB);
  ASSERT_EQ(r->write(b, 20 * kB, w2), 0);
  mb.replace(20 * kB, kB, w2);
  EXPECT_EQ(r->read(a, 0, data.size()), ma);
  EXPECT_EQ(r->read(b, 0, data.size()), mb);
  // Four blocks copied; their old blocks are now single-owner, the rest still shared.
  EXPECT_EQ(before - free_blocks(*r), 4u);
  for (uint64_t i : {3u, 10u, 11u, 20u}) EXPECT_EQ(r->fs->block_refs(orig[i]), 0u) << i;
  EXPECT_EQ(r->fs->block_refs(orig[0]), 2u);
  EXPECT_EQ(r->fs->stats().shared_blocks, 60u);
  EXPECT_GE(r->fs->stats().cow_blocks, 4u);
  // Truncating into a shared block copies it (its tail must read as zeroes).
  ASSERT_EQ(r->fs->fallocate(b, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 30 * kB + 7, 100), 0);
  mb.replace(30 * kB + 7, 100, std::string(100, '\0'));
  EXPECT_EQ(r->read(a, 0, data.size()), ma);
  EXPECT_EQ(r->read(b, 0, data.size()), mb);
  expect_counts_match(*r, {a, b});
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(r->read(a, 0, data.size()), ma);
  EXPECT_EQ(r->read(b, 0, data.size()), mb);
}

TEST(Share, FreeingEitherOwnerKeepsTheOtherAndTheLastFreesExactly) {
  auto r = shared_rig();
  ASSERT_TRUE(r);
  const uint64_t empty = free_blocks(*r);
  const Ino a = r->create(kRootInode, "a");
  const std::string data = pattern(3, 0, 100 * kB);
  ASSERT_EQ(r->write(a, 0, data), 0);
  const Ino b = r->create(kRootInode, "b");
  const Ino c = r->create(kRootInode, "c");
  ASSERT_EQ(clone(*r, a, 0, b, 0, data.size()), 0);
  ASSERT_EQ(clone(*r, b, 0, c, 0, data.size()), 0);
  const std::vector<uint64_t> blocks = blocks_of(*r, a);
  EXPECT_EQ(r->fs->block_refs(blocks[50]), 3u);
  ASSERT_EQ(r->fs->unlink(kRootInode, "a"), 0);
  r->fs->forget(a, 1);  // the kernel's reference from create(): now it is freed
  ASSERT_EQ(r->fs->sync(), 0);
  EXPECT_EQ(r->fs->block_refs(blocks[50]), 2u);
  EXPECT_EQ(r->read(b, 0, data.size()), data);
  // Truncate b to half: its second half's blocks go back to c alone.
  SetAttr s;
  s.size = true;
  s.new_size = 50 * kB;
  Attr at;
  ASSERT_EQ(r->fs->setattr(b, s, &at), 0);
  EXPECT_EQ(r->fs->block_refs(blocks[10]), 2u);
  EXPECT_EQ(r->fs->block_refs(blocks[80]), 0u);
  EXPECT_EQ(r->read(c, 0, data.size()), data);
  expect_counts_match(*r, {b, c});
  EXPECT_EQ(r->check_and_remount(), "");
  Ino bb = 0, cc = 0;  // after the remount: the kernel's references of lookups
  ASSERT_EQ(r->lookup(kRootInode, "b", &bb), 0);
  ASSERT_EQ(r->lookup(kRootInode, "c", &cc), 0);
  ASSERT_EQ(r->fs->unlink(kRootInode, "b"), 0);
  ASSERT_EQ(r->fs->unlink(kRootInode, "c"), 0);
  ASSERT_EQ(r->fs->sync(), 0);
  ASSERT_EQ(r->fs->sync(), 0);  // the frees commit; their blocks are free after
  EXPECT_EQ(free_blocks(*r), empty - kRefcountBlocks);  // the table stays
  EXPECT_EQ(r->fs->stats().shared_blocks, 0u);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Share, UnalignedRangesCopyAndHolesStayHoles) {
  auto r = shared_rig();
  ASSERT_TRUE(r);
  const Ino a = r->create(kRootInode, "a");
  const std::string data = pattern(4, 0, 40 * kB);
  ASSERT_EQ(r->write(a, 0, data), 0);
  ASSERT_EQ(r->fs->fallocate(a, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 8 * kB, 8 * kB), 0);
  std::string ma = data;
  ma.replace(8 * kB, 8 * kB, std::string(8 * kB, '\0'));
  // Offsets that differ within a block: bytes copied, nothing shared.
  const Ino b = r->create(kRootInode, "b");
  uint64_t copied = 0;
  ASSERT_EQ(clone(*r, a, 100, b, 7, 30 * kB, &copied), 0);
  EXPECT_EQ(copied, 30 * kB);
  EXPECT_EQ(r->read(b, 7, 30 * kB), ma.substr(100, 30 * kB));
  EXPECT_EQ(r->fs->stats().shared_blocks, 0u);
  // Alike within a block: the edges copied, the whole blocks between shared, the hole kept.
  const Ino c = r->create(kRootInode, "c");
  ASSERT_EQ(r->write(c, 0, std::string(50 * kB, 'x')), 0);
  ASSERT_EQ(clone(*r, a, 2 * kB + 5, c, 10 * kB + 5, 20 * kB, &copied), 0);
  EXPECT_EQ(copied, 20 * kB);
  std::string mc(50 * kB, 'x');
  mc.replace(10 * kB + 5, 20 * kB, ma.substr(2 * kB + 5, 20 * kB));
  EXPECT_EQ(r->read(c, 0, 50 * kB), mc);
  // a's blocks 3-7 and 16-21 are c's blocks 11-15 and 24-29: shared; c's 16-23 a hole.
  EXPECT_EQ(r->fs->stats().shared_blocks, 5u + 6u);
  uint64_t hole = 0;
  ASSERT_EQ(r->fs->lseek(c, 16 * kB, SEEK_HOLE, &hole), 0);
  EXPECT_EQ(hole, 16 * kB);
  // Past a's end: nothing. The same file: overlapping ranges are refused, others work.
  EXPECT_EQ(clone(*r, a, 40 * kB, c, 0, kB, &copied), 0);
  EXPECT_EQ(copied, 0u);
  EXPECT_EQ(clone(*r, a, 0, a, 4 * kB, 8 * kB), EINVAL);
  ASSERT_EQ(clone(*r, a, 0, a, 40 * kB, 4 * kB, &copied), 0);
  EXPECT_EQ(r->read(a, 40 * kB, 4 * kB), ma.substr(0, 4 * kB));
  expect_counts_match(*r, {a, b, c});
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(r->read(c, 0, 50 * kB), mc);
}

// Into an empty file: the shared blocks lie past its size until the clone ends, and the bytes
// copied after them (a partial tail, or blocks that could not be shared) must not unmap them
// as blocks past the end (write_locked drops those before it grows a file).
TEST(Share, BytesCopiedAfterSharedBlocksKeepThem) {
  auto r = shared_rig();
  ASSERT_TRUE(r);
  const Ino a = r->create(kRootInode, "a");
  const std::string data = pattern(31, 0, 40 * kB);
  ASSERT_EQ(r->write(a, 0, data), 0);
  const Ino b = r->create(kRootInode, "b");
  uint64_t copied = 0;
  ASSERT_EQ(clone(*r, a, 0, b, 0, 10 * kB + 100, &copied), 0);
  EXPECT_EQ(copied, 10 * kB + 100);
  EXPECT_EQ(r->size(b), 10 * kB + 100);
  EXPECT_TRUE(r->read(b, 0, 10 * kB + 100) == data.substr(0, 10 * kB + 100));
  EXPECT_EQ(r->fs->stats().shared_blocks, 10u);
  // Appending by clone to a file's end, unaligned in both: copied bytes only, then aligned.
  ASSERT_EQ(clone(*r, a, 20 * kB, b, 12 * kB, 8 * kB + 5, &copied), 0);
  std::string want = data.substr(0, 10 * kB + 100);
  want.resize(12 * kB, '\0');
  want += data.substr(20 * kB, 8 * kB + 5);
  EXPECT_TRUE(r->read(b, 0, want.size() + 10) == want);
  expect_counts_match(*r, {a, b});
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_TRUE(r->read(b, 0, want.size() + 10) == want);
}

// A file that fills a group (and goes on in the next) still clones whole: file data leaves
// each group's last 17 blocks to the table the first clone needs there.
TEST(Share, AFileThatFillsItsGroupClonesWhole) {
  auto r = shared_rig(512);  // four groups of 128 MiB
  ASSERT_TRUE(r);
  const Ino a = r->create(kRootInode, "a");
  const std::string chunk = pattern(41, 0, 1 << 20);
  for (uint64_t off = 0; off < (300u << 20); off += chunk.size()) {
    ASSERT_EQ(r->write(a, off, chunk), 0);
  }
  const uint64_t size = r->size(a), blocks = (size + kB - 1) / kB;
  const Ino b = r->create(kRootInode, "b");
  uint64_t copied = 0;
  ASSERT_EQ(clone(*r, a, 0, b, 0, size, &copied), 0) << r->log;
  EXPECT_EQ(copied, size);
  EXPECT_EQ(r->fs->stats().shared_blocks, blocks);
  expect_counts_match(*r, {a, b});
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Share, WithoutTheFeatureCopyFileRangeCopies) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  Superblock sb = r->superblock_at(0);
  ASSERT_TRUE(r->set_features(sb.features & ~uint32_t{kFeatureSharedBlocks}));
  const Ino a = r->create(kRootInode, "a");
  const std::string data = pattern(5, 0, 20 * kB);
  ASSERT_EQ(r->write(a, 0, data), 0);
  const uint64_t before = free_blocks(*r);
  const Ino b = r->create(kRootInode, "b");
  uint64_t copied = 0;
  ASSERT_EQ(clone(*r, a, 0, b, 0, data.size(), &copied), 0);
  EXPECT_EQ(copied, data.size());
  EXPECT_EQ(r->read(b, 0, data.size()), data);
  EXPECT_EQ(before - free_blocks(*r), 20u);
  EXPECT_NE(r->log.find("tune.warpfs -O shared_blocks"), std::string::npos) << r->log;
  uint64_t d = 0;
  EXPECT_EQ(r->fs->dedupe_range(a, 0, b, 0, data.size(), &d), EOPNOTSUPP);
  DedupReport rep;
  EXPECT_EQ(r->fs->dedup(DedupOptions{}, &rep), EOPNOTSUPP);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Share, DedupeRangeSharesOnlyEqualBlocks) {
  auto r = shared_rig();
  ASSERT_TRUE(r);
  const Ino a = r->create(kRootInode, "a"), b = r->create(kRootInode, "b");
  std::string da = pattern(6, 0, 16 * kB), db = da;
  db.replace(5 * kB + 9, 1, "!");  // block 5 differs
  ASSERT_EQ(r->write(a, 0, da), 0);
  ASSERT_EQ(r->write(b, 0, db), 0);
  const uint64_t before = free_blocks(*r);
  uint64_t deduped = 0;
  ASSERT_EQ(r->fs->dedupe_range(a, 0, b, 0, 16 * kB, &deduped), 0);
  EXPECT_EQ(deduped, 15 * kB);
  EXPECT_EQ(r->read(b, 0, 16 * kB), db);
  ASSERT_EQ(r->fs->sync(), 0);
  ASSERT_EQ(r->fs->sync(), 0);  // b's own blocks are free once that commit is done
  const std::vector<uint64_t> ba = blocks_of(*r, a), bb = blocks_of(*r, b);
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(ba[i] == bb[i], i != 5) << i;
  EXPECT_EQ(free_blocks(*r) + kRefcountBlocks, before + 15);  // after the commit
  EXPECT_EQ(r->fs->dedupe_range(a, 1, b, 0, kB, &deduped), EINVAL);
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(r->read(b, 0, 16 * kB), db);
}

TEST(Share, DedupPassSharesDuplicateFilesAndKeepsEveryByte) {
  auto r = shared_rig();
  ASSERT_TRUE(r);
  // 3 distinct contents, each in 4 files, and a file with a block of each inside.
  std::map<Ino, std::string> model;
  const Ino dir = r->mkdir(kRootInode, "d");
  for (int k = 0; k < 12; ++k) {
    const Ino f = r->create(dir, "f" + std::to_string(k));
    model[f] = pattern(100 + k % 3, 0, 32 * kB);
    ASSERT_EQ(r->write(f, 0, model[f]), 0);
  }
  const Ino mix = r->create(dir, "mix");
  model[mix] = pattern(100, 0, kB) + pattern(101, 5 * kB, kB) + pattern(7, 0, 3 * kB);
  ASSERT_EQ(r->write(mix, 0, model[mix]), 0);
  ASSERT_EQ(r->fs->sync(), 0);
  const uint64_t before = free_blocks(*r);
  DedupReport rep;
  ASSERT_EQ(r->fs->dedup(DedupOptions{}, &rep), 0) << r->log;
  EXPECT_EQ(rep.files, 13u);
  EXPECT_EQ(rep.blocks_hashed, 12u * 32 + 5);
  EXPECT_EQ(rep.blocks_shared, 9u * 32 + 2);  // 3 of 12 files keep their blocks
  ASSERT_EQ(r->fs->sync(), 0);
  ASSERT_EQ(r->fs->sync(), 0);
  EXPECT_EQ(free_blocks(*r), before + 9 * 32 + 2 - kRefcountBlocks);
  EXPECT_EQ(r->fs->stats().saved_blocks, 9u * 32 + 2);
  for (auto& [f, want] : model) EXPECT_EQ(r->read(f, 0, want.size()), want) << f;
  std::vector<Ino> all;
  for (auto& [f, want] : model) all.push_back(f);
  expect_counts_match(*r, all);
  // A second pass finds nothing more to share.
  ASSERT_EQ(r->fs->dedup(DedupOptions{}, &rep), 0);
  EXPECT_EQ(rep.blocks_shared, 0u);
  EXPECT_EQ(r->check_and_remount(), "");
  for (auto& [f, want] : model) EXPECT_EQ(r->read(f, 0, want.size()), want) << f;
}

TEST(Share, TheDedupTableStaysWithinItsBound) {
  auto r = shared_rig();
  ASSERT_TRUE(r);
  const Ino a = r->create(kRootInode, "a");
  ASSERT_EQ(r->write(a, 0, pattern(8, 0, 2048 * kB)), 0);
  DedupOptions o;
  o.table_mb = 0;  // the smallest table: 1024 entries
  DedupReport rep;
  ASSERT_EQ(r->fs->dedup(o, &rep), 0);
  EXPECT_EQ(rep.blocks_hashed, 2048u);
  EXPECT_EQ(rep.table_full, 1024u);
}

// Threads clone a source that another thread keeps rewriting whole (each version stamps every
// block), while others write into their clones: every clone is one version of the source
// throughout (a clone is atomic against a write), every write lands in its own file only.
TEST(Share, ClonesAmongWritersSeeOneVersionAndNeverLeak) {
  auto r = shared_rig();
  ASSERT_TRUE(r);
  constexpr uint64_t kBlocks = 64;
  auto version = [](uint64_t v) {
    std::string s;
    for (uint64_t b = 0; b < kBlocks; ++b) s += pattern(1000 + v, b * kB, kB);
    return s;
  };
  const Ino src = r->create(kRootInode, "src");
  ASSERT_EQ(r->write(src, 0, version(0)), 0);
  std::atomic<uint64_t> written_version{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t v = 1; v <= 40; ++v) {
      const std::string s = version(v);
      size_t w = 0;
      EXPECT_EQ(r->fs->write(src, 0, s.size(), s.data(), &w), 0);
      written_version = v;
    }
    stop = true;
  });
  constexpr int kCloners = 3;
  std::vector<std::thread> cloners;
  std::vector<Ino> dst(kCloners);
  for (int t = 0; t < kCloners; ++t) dst[t] = r->create(kRootInode, "dst" + std::to_string(t));
  std::atomic<int> bad{0};
  for (int t = 0; t < kCloners; ++t) {
    cloners.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      int rounds = 0;
      while (!stop || rounds < 3) {
        ++rounds;
        uint64_t copied = 0;
        if (r->fs->copy_file_range(src, 0, dst[t], 0, kBlocks * kB, &copied) != 0 ||
            copied != kBlocks * kB) {
          ++bad;
          continue;
        }
        // Which version did it get? Every block must say the same one.
        std::string got(kBlocks * kB, '\0');
        size_t n = 0;
        EXPECT_EQ(r->fs->read(dst[t], 0, got.size(), got.data(), &n), 0);
        bool one = false;
        for (uint64_t v = 0; v <= 40 && !one; ++v) one = got == version(v);
        if (!one) ++bad;
        // Write into the clone: copy-on-write, never into src.
        const std::string mine = pattern(5000 + t, 0, kB);
        size_t w = 0;
        EXPECT_EQ(r->fs->write(dst[t], (rng() % kBlocks) * kB, kB, mine.data(), &w), 0);
      }
    });
  }
  writer.join();
  for (auto& c : cloners) c.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(r->read(src, 0, kBlocks * kB), version(40));
  std::vector<Ino> all = dst;
  all.push_back(src);
  expect_counts_match(*r, all);
  ASSERT_EQ(r->fs->sync(), 0);
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(r->read(src, 0, kBlocks * kB), version(40));
}

// Dedup beside writers: the writers' files always read what they wrote last.
TEST(Share, DedupBesideWritersLosesNothing) {
  auto r = shared_rig();
  ASSERT_TRUE(r);
  constexpr int kFiles = 6;
  constexpr uint64_t kBlocks = 32;
  std::vector<Ino> files(kFiles);
  std::vector<std::string> model(kFiles);
  for (int k = 0; k < kFiles; ++k) {
    files[k] = r->create(kRootInode, "f" + std::to_string(k));
    model[k] = pattern(77, 0, kBlocks * kB);  // all equal: everything is a candidate
    ASSERT_EQ(r->write(files[k], 0, model[k]), 0);
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int k = 0; k < kFiles; k += 2) {  // every other file keeps changing
    writers.emplace_back([&, k] {
      std::mt19937_64 rng(k);
      for (int i = 0; i < 200 && !stop; ++i) {
        const uint64_t b = rng() % kBlocks;
        const std::string s = (i % 3 == 0) ? pattern(77, b * kB, kB) : pattern(rng(), 0, kB);
        size_t w = 0;
        ASSERT_EQ(r->fs->write(files[k], b * kB, kB, s.data(), &w), 0);
        model[k].replace(b * kB, kB, s);
      }
    });
  }
  for (int pass = 0; pass < 3; ++pass) {
    DedupReport rep;
    ASSERT_EQ(r->fs->dedup(DedupOptions{}, &rep), 0);
  }
  stop = true;
  for (auto& w : writers) w.join();
  for (int k = 0; k < kFiles; ++k) EXPECT_EQ(r->read(files[k], 0, kBlocks * kB), model[k]) << k;
  EXPECT_GT(r->fs->stats().shared_blocks, 0u);
  expect_counts_match(*r, files);
  EXPECT_EQ(r->check_and_remount(), "");
  for (int k = 0; k < kFiles; ++k) EXPECT_EQ(r->read(files[k], 0, kBlocks * kB), model[k]) << k;
}

// A power cut at every point of a clone, a copy-on-write and an unlink of a shared file: the
// image checks clean and each file reads its old or its new contents, block by block.
TEST(Share, PowerCutsThroughClonesAndCopiesCheckClean) {
  for (uint64_t cut = 1; cut < 60; cut += 3) {
    auto r = shared_rig();
    ASSERT_TRUE(r);
    const Ino a = r->create(kRootInode, "a");
    const std::string data = pattern(11, 0, 24 * kB);
    ASSERT_EQ(r->write(a, 0, data), 0);
    const Ino b = r->create(kRootInode, "b");
    ASSERT_EQ(r->fs->sync(), 0);
    r->cut->cut_at(cut, true, cut);
    uint64_t copied = 0;
    (void)r->fs->copy_file_range(a, 0, b, 0, data.size(), &copied);
    (void)r->fs->fsync(b, false);
    (void)r->write(b, 4 * kB, pattern(12, 0, 2 * kB));
    (void)r->fs->fsync(b, false);
    (void)r->fs->unlink(kRootInode, "a");
    (void)r->fs->sync();
    ASSERT_TRUE(r->power_cycle(0.5));
    EXPECT_EQ(r->fsck_unmounted(), "") << "cut " << cut;
    ASSERT_TRUE(r->mount());
    Ino bb = 0;
    ASSERT_EQ(r->lookup(kRootInode, "b", &bb), 0);
    const std::string got = r->read(bb, 0, data.size());
    for (uint64_t i = 0; i * kB < got.size(); ++i) {
      const std::string blk = got.substr(i * kB, kB);
      const bool old_data = blk == data.substr(i * kB, blk.size());
      const bool new_data =
          i >= 4 && i < 6 && blk == pattern(12, 0, 2 * kB).substr((i - 4) * kB, blk.size());
      const bool zero = blk == std::string(blk.size(), '\0');
      EXPECT_TRUE(old_data || new_data || zero) << "cut " << cut << " block " << i;
    }
    Ino aa = 0;
    if (r->lookup(kRootInode, "a", &aa) == 0) {
      EXPECT_EQ(r->read(aa, 0, data.size()), data);
    }
  }
}

// A count that falls to 0 (the other owner truncated) is not yet durable: a power cut brings
// that owner back. Until the fall commits, the survivor's writes must still copy the block,
// or the revived owner would read them.
TEST(Share, AnOwnerRevivedByAPowerCutNeverSeesTheOthersWrites) {
  auto r = shared_rig();
  ASSERT_TRUE(r);
  const Ino a = r->create(kRootInode, "a");
  const std::string p1 = pattern(21, 0, 16 * kB), p2 = pattern(22, 0, 16 * kB);
  ASSERT_EQ(r->write(a, 0, p1), 0);
  const Ino b = r->create(kRootInode, "b");
  ASSERT_EQ(clone(*r, a, 0, b, 0, p1.size()), 0);
  ASSERT_EQ(r->fs->sync(), 0);
  SetAttr s;
  s.size = true;
  s.new_size = 0;
  Attr at;
  ASSERT_EQ(r->fs->setattr(a, s, &at), 0);  // 2 -> 0, in the running transaction
  // Aligned, inside b's size: the overwrite fast path, were the blocks b's alone.
  ASSERT_EQ(r->write(b, 0, p2), 0);
  ASSERT_EQ(r->fs->fsync(b, true), 0);
  EXPECT_EQ(r->read(b, 0, p2.size()), p2);
  ASSERT_TRUE(r->power_cycle(1.0));
  EXPECT_EQ(r->fsck_unmounted(), "");
  ASSERT_TRUE(r->mount());
  Ino aa = 0, bb = 0;
  ASSERT_EQ(r->lookup(kRootInode, "a", &aa), 0);
  ASSERT_EQ(r->lookup(kRootInode, "b", &bb), 0);
  EXPECT_TRUE(r->read(bb, 0, p2.size()) == p2);  // fsync'd
  const uint64_t size = r->size(aa);
  if (size != 0) {  // a is as it was, or truncated
    EXPECT_TRUE(r->read(aa, 0, p1.size()) == p1) << "a reads b's write";
  }
}

}  // namespace
}  // namespace warpfs::fs::test
