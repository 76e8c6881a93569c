// fsck and shared blocks (fs/FORMAT.md "Shared blocks", feature bit 5). The images are made
// by formatting and writing files through the core, then shared by hand on the device: file
// b's extent is pointed at file a's block (b's own block freed) and the group's
// reference-count table is written as the core would. A sound image checks clean; each
// wrong count, missing or damaged table is found and named, repaired, and a second run is
// clean with both files reading the shared data; without the feature the block is a
// duplicate as before; tune.warpfs enables the feature on an older image.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "fs/core_rig.h"
#include "warpfs/fs/format.h"
#include "warpfs/fs/layout.h"
#include "warpfs/fs/tune.h"

namespace warpfs::fs::test {
namespace {

struct FsckRun {
  FsckResult r;
  std::string text;  // every line reported
  bool has(const std::string& s) const { return text.find(s) != std::string::npos; }
};

FsckRun run_fsck(blockdev::BlockDevice& dev, bool repair, unsigned threads = 0) {
  FsckOptions o;
  o.repair = repair;
  o.threads = threads;
  FsckRun run;
  run.r = fsck(dev, o, [&](const std::string& s) { run.text += s + "\n"; });
  if (!run.r.error.empty()) run.text += "error: " + run.r.error + "\n";
  return run;
}

// Raw access to the unmounted image (one block group: the 64 MiB Rig).
struct Raw {
  blockdev::BlockDevice& dev;
  Superblock sb{};
  Layout L;

  explicit Raw(blockdev::BlockDevice& d) : dev(d) {
    EXPECT_TRUE(d.read(0, 1, &sb).is_ok());
    L.init(sb);
  }
  std::vector<uint8_t> get(uint64_t b) {
    std::vector<uint8_t> v(kBlockSize);
    EXPECT_TRUE(dev.read(b, 1, v.data()).is_ok()) << b;
    return v;
  }
  void put(uint64_t b, const std::vector<uint8_t>& v) {
    EXPECT_TRUE(dev.write(b, 1, v.data()).is_ok()) << b;
  }
  void put_sb() {  // both copies
    sb.checksum = superblock_checksum(sb);
    EXPECT_TRUE(dev.write(0, 1, &sb).is_ok());
    EXPECT_TRUE(dev.write(sb.block_count - 1, 1, &sb).is_ok());
  }
  GroupDesc gd(uint32_t g) {
    GroupDesc d;
    std::memcpy(
        &d,
        get(L.gdt_start + g / kGroupDescsPerBlock).data() + (g % kGroupDescsPerBlock) * sizeof d,
        sizeof d);
    return d;
  }
  void put_gd(uint32_t g, GroupDesc d) {
    d.checksum = group_checksum(d, L.seed);
    auto b = get(L.gdt_start + g / kGroupDescsPerBlock);
    std::memcpy(b.data() + (g % kGroupDescsPerBlock) * sizeof d, &d, sizeof d);
    put(L.gdt_start + g / kGroupDescsPerBlock, b);
  }
  Inode inode(uint64_t ino) {
    Inode d;
    std::memcpy(&d, get(L.inode_block(ino)).data() + L.inode_offset(ino), sizeof d);
    return d;
  }
  void put_inode(uint64_t ino, Inode d) {
    d.checksum = inode_checksum(d, ino, L.seed);
    auto b = get(L.inode_block(ino));
    std::memcpy(b.data() + L.inode_offset(ino), &d, sizeof d);
    put(L.inode_block(ino), b);
  }
  bool used(uint64_t b) {
    const uint32_t g = L.group_of(b);
    const uint64_t i = b - L.group_start(g);
    return (get(L.group_start(g))[i / 8] >> (i % 8)) & 1;
  }
  // Marks [b, b + n) used (or free) in its group's bitmap, descriptor and superblock counts.
  void mark(uint64_t b, uint64_t n, bool use) {
    const uint32_t g = L.group_of(b);
    auto bm = get(L.group_start(g));
    const uint64_t i = b - L.group_start(g);
    if (use) {
      set_bits(bm.data(), i, i + n);
    } else {
      clear_bits(bm.data(), i, i + n);
    }
    put(L.group_start(g), bm);
    GroupDesc d = gd(g);
    d.block_bitmap_checksum = checksum(bm.data(), kBlockSize, L.seed);
    d.free_blocks = static_cast<uint32_t>(use ? d.free_blocks - n : d.free_blocks + n);
    put_gd(g, d);
    sb.free_blocks = use ? sb.free_blocks - n : sb.free_blocks + n;
    put_sb();
  }
  // The first run of n free blocks of group g's data area at or after group block `from`.
  uint64_t free_run(uint32_t g, uint64_t n, uint64_t from = 0) {
    const uint64_t start = L.group_start(g);
    const auto bm = get(start);
    uint64_t run = 0;
    for (uint64_t i = std::max<uint64_t>(from, 2 + L.itb); i < L.group_size(g); ++i) {
      run = ((bm[i / 8] >> (i % 8)) & 1) ? 0 : run + 1;
      if (run == n) return start + i + 1 - n;
    }
    ADD_FAILURE() << "no " << n << " free blocks in group " << g;
    return 0;
  }

  // Table block i of a table at `first` with `counts` (group-relative block -> count).
  void put_table_block(uint32_t g, uint64_t first, uint32_t i,
                       const std::vector<std::pair<uint64_t, uint16_t>>& counts) {
    std::vector<uint8_t> b(kBlockSize, 0);
    const RefcountHeader h{kRefcountMagic, g, i, 0, 0, 0};
    std::memcpy(b.data(), &h, sizeof h);
    for (const auto& [k, c] : counts) {
      if (k / kRefcountsPerBlock == i)
        std::memcpy(b.data() + sizeof h + (k % kRefcountsPerBlock) * 2, &c, 2);
    }
    const uint64_t sum = block_checksum(b.data(), kHeaderChecksumOffset, L.seed);
    std::memcpy(b.data() + kHeaderChecksumOffset, &sum, 8);
    put(first + i, b);
  }
  // A new table for group g (allocated, named by the descriptor), with `counts` by block.
  uint64_t make_table(uint32_t g, const std::vector<std::pair<uint64_t, uint16_t>>& counts) {
    const uint64_t first = free_run(g, kRefcountBlocks, 2000);
    mark(first, kRefcountBlocks, true);
    std::vector<std::pair<uint64_t, uint16_t>> rel;
    for (const auto& [b, c] : counts) rel.emplace_back(b - L.group_start(g), c);
    for (uint32_t i = 0; i < kRefcountBlocks; ++i) put_table_block(g, first, i, rel);
    GroupDesc d = gd(g);
    d.refcount_table = static_cast<uint32_t>(first - L.group_start(g));
    put_gd(g, d);
    return first;
  }
  // The count the table of block b's group keeps for b (0 without a table).
  uint16_t count(uint64_t b) {
    const uint32_t g = L.group_of(b);
    const uint32_t at = gd(g).refcount_table;
    if (at == 0) return 0;
    const uint64_t k = b - L.group_start(g);
    const auto blk = get(L.group_start(g) + at + k / kRefcountsPerBlock);
    EXPECT_EQ(block_checksum(blk.data(), kHeaderChecksumOffset, L.seed),
              *reinterpret_cast<const uint64_t*>(blk.data() + kHeaderChecksumOffset));
    uint16_t c;
    std::memcpy(&c, blk.data() + sizeof(RefcountHeader) + (k % kRefcountsPerBlock) * 2, 2);
    return c;
  }
};

// Files a and b of one block each, unmounted; `share`: b's extent then maps a's block and
// b's own block is freed (no table yet: the tests add what they need).
struct Pair {
  Ino a = 0, b = 0;
  std::string a_data, b_data;
  uint64_t block = 0, b_old = 0;  // a's block; b's before the sharing
};

Pair make_pair_of_files(Rig& r, bool share) {
  Pair p;
  p.a = r.create(kRootInode, "a");
  p.b = r.create(kRootInode, "b");
  p.a_data = pattern(11, 0, 4096);
  p.b_data = pattern(12, 0, 4096);
  EXPECT_EQ(r.write(p.a, 0, p.a_data), 0);
  EXPECT_EQ(r.write(p.b, 0, p.b_data), 0);
  EXPECT_EQ(r.fs->unmount(), 0) << r.log;
  r.fs.reset();
  Raw raw(*r.dev);
  p.block = raw.inode(p.a).root.extents[0].physical;
  p.b_old = raw.inode(p.b).root.extents[0].physical;
  if (share) {
    Inode d = raw.inode(p.b);
    d.root.extents[0].physical = p.block;
    raw.put_inode(p.b, d);
    raw.mark(p.b_old, 1, false);
  }
  return p;
}

// Found (check mode: exit 4, every needle named), repaired (exit 1), then clean.
void found_repaired_clean(Rig& r, const std::vector<std::string>& needles) {
  const FsckRun a = run_fsck(*r.dev, false);
  EXPECT_EQ(a.r.exit_code, kFsckUncorrected) << a.text;
  for (const std::string& n : needles)
    EXPECT_TRUE(a.has(n)) << "missing '" << n << "' in:\n" << a.text;
  const FsckRun b = run_fsck(*r.dev, true);
  EXPECT_EQ(b.r.exit_code, kFsckCorrected) << b.text;
  EXPECT_EQ(b.r.corrected, b.r.problems) << b.text;
  const FsckRun c = run_fsck(*r.dev, false);
  EXPECT_EQ(c.r.exit_code, kFsckClean) << "after repair:\n" << c.text << "repair said:\n" << b.text;
  if (std::getenv("WARPFS_FSCK_TEST_VERBOSE"))
    std::printf("check:\n%srepair:\n%s", a.text.c_str(), b.text.c_str());
}

// Both files read a's data through a mount.
void both_read_a(Rig& r, const Pair& p) {
  ASSERT_TRUE(r.mount()) << r.log;
  EXPECT_EQ(r.read(p.a, 0, 4096), p.a_data);
  EXPECT_EQ(r.read(p.b, 0, 4096), p.a_data);
  EXPECT_EQ(r.fs->unmount(), 0) << r.log;
  r.fs.reset();
}

std::string at(uint64_t b) {
  return "block " + std::to_string(b);
}

TEST(FsckShared, MkfsSetsTheFeatureWithNoTable) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->fs->unmount(), 0);
  r->fs.reset();
  Raw raw(*r->dev);
  EXPECT_NE(raw.sb.features & kFeatureSharedBlocks, 0u);
  for (uint32_t g = 0; g < raw.L.groups; ++g) EXPECT_EQ(raw.gd(g).refcount_table, 0u);
  EXPECT_EQ(run_fsck(*r->dev, false).r.exit_code, kFsckClean);
}

TEST(FsckShared, SharedBlockWithItsCountIsClean) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Pair p = make_pair_of_files(*r, true);
  Raw raw(*r->dev);
  raw.make_table(0, {{p.block, 2}});
  const FsckRun a = run_fsck(*r->dev, false);
  EXPECT_EQ(a.r.exit_code, kFsckClean) << a.text;
  EXPECT_EQ(a.r.problems, 0u) << a.text;
  const FsckRun b = run_fsck(*r->dev, true);
  EXPECT_EQ(b.r.exit_code, kFsckClean) << "repair found nothing to do:\n" << b.text;
  EXPECT_EQ(raw.count(p.block), 2);
  both_read_a(*r, p);
}

TEST(FsckShared, WrongCountIsRepaired) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Pair p = make_pair_of_files(*r, true);
  Raw raw(*r->dev);
  raw.make_table(0, {{p.block, 3}});
  found_repaired_clean(*r, {"group 0: " + at(p.block) + ": reference count 3, 2 references"});
  EXPECT_EQ(raw.count(p.block), 2);
  both_read_a(*r, p);
}

TEST(FsckShared, CountOfABlockWithOneReferenceBecomesZero) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Pair p = make_pair_of_files(*r, false);
  Raw raw(*r->dev);
  const uint64_t table = raw.make_table(0, {{p.block, 2}, {p.b_old + 1000, 7}});
  found_repaired_clean(*r,
                       {"group 0: " + at(p.block) + ": reference count 2, 1 reference",
                        "group 0: " + at(p.b_old + 1000) + ": reference count 7, 0 references"});
  EXPECT_EQ(raw.count(p.block), 0);
  EXPECT_EQ(raw.count(p.b_old + 1000), 0);
  EXPECT_EQ(raw.gd(0).refcount_table, table - raw.L.group_start(0)) << "a table of zeroes stays";
  EXPECT_TRUE(raw.used(table));
  ASSERT_TRUE(r->mount()) << r->log;
  EXPECT_EQ(r->read(p.a, 0, 4096), p.a_data);
  EXPECT_EQ(r->read(p.b, 0, 4096), p.b_data);
}

TEST(FsckShared, MissingTableIsWritten) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Pair p = make_pair_of_files(*r, true);
  Raw raw(*r->dev);
  found_repaired_clean(*r, {"group 0: " + at(p.block) +
                            ": 2 references, but the group has no reference-count table"});
  const uint32_t t = raw.gd(0).refcount_table;
  EXPECT_NE(t, 0u);
  EXPECT_TRUE(raw.used(raw.L.group_start(0) + t));
  EXPECT_TRUE(raw.used(raw.L.group_start(0) + t + kRefcountBlocks - 1));
  EXPECT_EQ(raw.count(p.block), 2);
  EXPECT_EQ(raw.inode(p.b).root.extents[0].physical, p.block) << "still shared, not copied";
  both_read_a(*r, p);
}

// No 17 free blocks in a row are left in the group: the block is copied for b instead.
TEST(FsckShared, MissingTableWithoutRoomFallsBackToACopy) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino filler = r->create(kRootInode, "filler");
  const Pair p = make_pair_of_files(*r, true);
  Raw raw(*r->dev);
  // filler's unwritten extents take every free run of 17 or more but the last 14 blocks.
  const uint64_t start = raw.L.group_start(0), size = raw.L.group_size(0);
  std::vector<Extent> ext;
  uint64_t logical = 0, blocks = 0;
  for (uint64_t i = 2 + raw.L.itb; i < size;) {
    if (raw.used(start + i)) {
      ++i;
      continue;
    }
    uint64_t e = i;
    while (e < size && !raw.used(start + e)) ++e;
    const uint64_t n = e == size ? e - i - 14 : e - i;
    if (e - i >= kRefcountBlocks) {
      ext.push_back(Extent{static_cast<uint32_t>(logical),
                           static_cast<uint32_t>(n) | Extent::kUnwritten, start + i});
      raw.mark(start + i, n, true);
      logical += n;
      blocks += n;
    }
    i = e;
  }
  ASSERT_LE(ext.size(), size_t{Inode::kInlineExtents});
  ASSERT_FALSE(ext.empty());
  Inode f = raw.inode(filler);
  std::memcpy(f.root.extents, ext.data(), ext.size() * sizeof(Extent));
  f.extent_count = static_cast<uint32_t>(ext.size());
  f.blocks = blocks;
  raw.put_inode(filler, f);
  ASSERT_EQ(run_fsck(*r->dev, false).r.problems, 1u) << "only the missing table";
  const FsckRun fix = run_fsck(*r->dev, true);
  EXPECT_TRUE(fix.has("no room for a table in the group: each later owner gets a copy"))
      << fix.text;
  EXPECT_TRUE(fix.has(at(p.block) + ": owned by inode " + std::to_string(p.a) + " and inode " +
                      std::to_string(p.b)))
      << fix.text;
  EXPECT_EQ(fix.r.exit_code, kFsckCorrected) << fix.text;
  const FsckRun again = run_fsck(*r->dev, false);
  EXPECT_EQ(again.r.exit_code, kFsckClean) << again.text << "repair said:\n" << fix.text;
  EXPECT_EQ(raw.gd(0).refcount_table, 0u);
  EXPECT_NE(raw.inode(p.b).root.extents[0].physical, p.block) << "b got a copy";
  both_read_a(*r, p);
}

// Without the feature two files mapping a block is a duplicate, repaired as before.
TEST(FsckShared, WithoutTheFeatureTwoReferencesAreADuplicate) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Pair p = make_pair_of_files(*r, true);
  Raw raw(*r->dev);
  raw.sb.features &= ~uint32_t{kFeatureSharedBlocks};
  raw.put_sb();
  found_repaired_clean(*r, {at(p.block) + ": owned by inode " + std::to_string(p.a) +
                            " and inode " + std::to_string(p.b)});
  EXPECT_EQ(raw.gd(0).refcount_table, 0u) << "no table without the feature";
  EXPECT_NE(raw.inode(p.b).root.extents[0].physical, p.block);
  both_read_a(*r, p);
}

TEST(FsckShared, WithoutTheFeatureATableFieldIsCleared) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Pair p = make_pair_of_files(*r, false);
  Raw raw(*r->dev);
  raw.sb.features &= ~uint32_t{kFeatureSharedBlocks};
  raw.put_sb();
  const uint64_t table = raw.make_table(0, {});
  found_repaired_clean(
      *r, {"group 0: descriptor names a reference-count table (group block " +
               std::to_string(table - raw.L.group_start(0)) + ") without the shared_blocks feature",
           "blocks " + std::to_string(table) + "-" + std::to_string(table + kRefcountBlocks - 1) +
               ": marked in use in the block bitmap of group 0, but owned by "
               "nothing"});
  EXPECT_EQ(raw.gd(0).refcount_table, 0u);
  EXPECT_FALSE(raw.used(table));
  (void)p;
}

TEST(FsckShared, TableBlockWithABadChecksumIsRewritten) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Pair p = make_pair_of_files(*r, true);
  Raw raw(*r->dev);
  const uint64_t table = raw.make_table(0, {{p.block, 2}});
  const uint64_t tb = table + (p.block - raw.L.group_start(0)) / kRefcountsPerBlock;
  auto b = raw.get(tb);
  b[sizeof(RefcountHeader) + 2 * ((p.block - raw.L.group_start(0)) % kRefcountsPerBlock)] = 9;
  raw.put(tb, b);  // the count says 9; the checksum no longer matches
  found_repaired_clean(*r, {"group 0: reference-count table " + at(tb) + ": checksum mismatch"});
  EXPECT_EQ(raw.count(p.block), 2);
  both_read_a(*r, p);
}

// A table named where it cannot be (over the inode table) is dropped; the counts are rebuilt
// into a new one.
TEST(FsckShared, TableOutsideTheDataAreaIsDroppedAndRebuilt) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Pair p = make_pair_of_files(*r, true);
  Raw raw(*r->dev);
  GroupDesc d = raw.gd(0);
  d.refcount_table = 3;
  raw.put_gd(0, d);
  found_repaired_clean(*r, {"group 0: reference-count table at group block 3 lies outside the "
                            "group's data area",
                            "group 0: " + at(p.block) +
                                ": 2 references, but the group has no reference-count table"});
  EXPECT_GE(raw.gd(0).refcount_table, 2 + raw.L.itb);
  EXPECT_EQ(raw.count(p.block), 2);
  both_read_a(*r, p);
}

// Counts where no data block is (the group's metadata, past its end) must be 0.
TEST(FsckShared, StrayCountsAreCleared) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Pair p = make_pair_of_files(*r, true);
  Raw raw(*r->dev);
  const uint64_t start = raw.L.group_start(0);
  ASSERT_LT(raw.L.group_size(0), 30000u) << "the 64 MiB group ends before the table does";
  raw.make_table(0, {{p.block, 2}, {start + 2, 4}, {start + 30000, 5}});
  found_repaired_clean(*r, {"group 0: " + at(start + 2) + ": reference count 4, 1 reference",
                            "group 0: reference-count table: counts past the group's end are "
                            "not 0"});
  EXPECT_EQ(raw.count(start + 2), 0);
  EXPECT_EQ(raw.count(p.block), 2);
}

// A block both shared by written extents and claimed by something that may not share is a
// duplicate: an unwritten extent, and a table block.
TEST(FsckShared, SharingWithAnUnwrittenExtentOrATableIsADuplicate) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino c = r->create(kRootInode, "c");
  ASSERT_EQ(r->fs->fallocate(c, 0, 0, 4096), 0);
  const Pair p = make_pair_of_files(*r, true);
  Raw raw(*r->dev);
  const uint64_t table = raw.make_table(0, {{p.block, 2}});
  Inode ci = raw.inode(c);
  ASSERT_TRUE(ci.root.extents[0].unwritten());
  const uint64_t c_old = ci.root.extents[0].physical;
  ci.root.extents[0].physical = p.block;
  raw.put_inode(c, ci);
  raw.mark(c_old, 1, false);
  // b's second block: the table's first.
  Inode bi = raw.inode(p.b);
  bi.root.extents[1] = Extent{1, 1, table};
  bi.extent_count = 2;
  bi.blocks = 2;
  bi.size = 8192;
  raw.put_inode(p.b, bi);
  // Owners are named in inode order: c was made first.
  ASSERT_LT(c, p.a);
  found_repaired_clean(*r, {at(p.block) + ": owned by inode " + std::to_string(c) + ", inode " +
                                std::to_string(p.a) + " and inode " + std::to_string(p.b),
                            at(table) +
                                ": owned by the reference-count table of group 0 and "
                                "inode " +
                                std::to_string(p.b)});
  EXPECT_NE(raw.inode(p.b).root.extents[1].physical, table) << "b's block moved off the table";
  ASSERT_TRUE(r->mount()) << r->log;
  EXPECT_EQ(r->read(p.a, 0, 4096), p.a_data);
  EXPECT_EQ(r->read(p.b, 0, 4096), p.a_data);
  EXPECT_EQ(r->read(c, 0, 4096), std::string(4096, '\0'));
}

// One file mapping its block 65536 times (a depth-2 extent tree of one-block extents): one
// reference more than a count holds. The last one gets a copy; the table counts 65535.
TEST(FsckShared, ReferencesPastTheLimitGetCopies) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "many");
  ASSERT_EQ(r->write(f, 0, pattern(7, 0, 4096)), 0);
  ASSERT_EQ(r->fs->unmount(), 0) << r->log;
  r->fs.reset();
  Raw raw(*r->dev);
  Inode d = raw.inode(f);
  const uint64_t x = d.root.extents[0].physical;
  constexpr uint32_t kRefs = kMaxRefcount + 1;
  const uint32_t leaves = (kRefs + kExtentNodeCapacity - 1) / kExtentNodeCapacity;
  const uint32_t uppers = (leaves + kExtentNodeCapacity - 1) / kExtentNodeCapacity;
  ASSERT_LE(uppers, Inode::kInlineExtents);
  const uint64_t tree = raw.free_run(0, leaves + uppers);
  raw.mark(tree, leaves + uppers, true);
  auto node = [&](uint64_t b, uint16_t depth, const void* entries, uint32_t count) {
    std::vector<uint8_t> blk(kBlockSize, 0);
    const ExtentNodeHeader h{
        kExtentMagic, static_cast<uint16_t>(count), depth, kExtentNodeCapacity, 0, f, 0};
    std::memcpy(blk.data(), &h, sizeof h);
    std::memcpy(blk.data() + sizeof h, entries, size_t{count} * 16);
    const uint64_t sum = block_checksum(blk.data(), kHeaderChecksumOffset, raw.L.seed);
    std::memcpy(blk.data() + kHeaderChecksumOffset, &sum, 8);
    raw.put(b, blk);
  };
  std::vector<ExtentIndex> idx;
  for (uint32_t j = 0; j < leaves; ++j) {
    std::vector<Extent> e;
    for (uint32_t k = j * kExtentNodeCapacity; k < std::min(kRefs, (j + 1) * kExtentNodeCapacity);
         ++k)
      e.push_back(Extent{k, 1, x});
    node(tree + j, 0, e.data(), static_cast<uint32_t>(e.size()));
    idx.push_back(ExtentIndex{e[0].logical, 0, tree + j});
  }
  std::vector<ExtentIndex> root;
  for (uint32_t u = 0; u < uppers; ++u) {
    const uint32_t from = u * kExtentNodeCapacity;
    const uint32_t n = std::min(leaves - from, kExtentNodeCapacity);
    node(tree + leaves + u, 1, idx.data() + from, n);
    root.push_back(ExtentIndex{idx[from].logical, 0, tree + leaves + u});
  }
  std::memcpy(d.root.extents, root.data(), root.size() * sizeof(ExtentIndex));
  d.extent_count = uppers;
  d.tree_depth = 2;
  d.blocks = kRefs + leaves + uppers;
  d.size = uint64_t{kRefs} * kBlockSize;
  raw.put_inode(f, d);
  found_repaired_clean(*r, {"block " + std::to_string(x) + ": 65536 references, more than 65535",
                            "group 0: block " + std::to_string(x) +
                                ": 65536 references, but the group has no reference-count table"});
  EXPECT_EQ(raw.count(x), kMaxRefcount);
  ASSERT_TRUE(r->mount()) << r->log;
  const std::string want = pattern(7, 0, 4096);
  EXPECT_EQ(r->read(f, 0, 4096), want);
  EXPECT_EQ(r->read(f, uint64_t{kMaxRefcount - 1} * kBlockSize, 4096), want);
  EXPECT_EQ(r->read(f, uint64_t{kMaxRefcount} * kBlockSize, 4096), want) << "the copy";
}

// Messages, their order and the repair are the same at one thread and at four.
TEST(FsckShared, SameOutcomeAtOneAndFourThreads) {
  auto r = Rig::make(320);  // three groups
  ASSERT_TRUE(r);
  const Pair p = make_pair_of_files(*r, true);
  Raw raw(*r->dev);
  ASSERT_GE(raw.L.groups, 3u);
  raw.make_table(0, {{p.block, 3}});
  raw.make_table(2, {{raw.L.group_start(2) + 5000, 2}});
  const FsckRun one = run_fsck(*r->dev, false, 1), four = run_fsck(*r->dev, false, 4);
  EXPECT_EQ(one.r.exit_code, kFsckUncorrected) << one.text;
  EXPECT_TRUE(
      one.has("group 2: " + at(raw.L.group_start(2) + 5000) + ": reference count 2, 0 references"))
      << one.text;
  EXPECT_EQ(one.text, four.text);
  EXPECT_EQ(run_fsck(*r->dev, true, 4).r.exit_code, kFsckCorrected);
  EXPECT_EQ(run_fsck(*r->dev, false, 1).r.exit_code, kFsckClean);
}

// tune.warpfs -O shared_blocks on an image made without the feature: fsck stays clean.
TEST(FsckShared, TuneEnablesTheFeature) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  ASSERT_TRUE(r->set_features(r->superblock_at(0).features & ~uint32_t{kFeatureSharedBlocks}));
  const Ino f = r->create(kRootInode, "f");
  ASSERT_EQ(r->write(f, 0, pattern(5, 0, 10000)), 0);
  ASSERT_EQ(r->fs->unmount(), 0) << r->log;
  r->fs.reset();
  ASSERT_EQ(r->superblock_at(0).features & kFeatureSharedBlocks, 0u);
  TuneRequest t;
  t.enable_shared_blocks = true;
  Superblock out;
  ASSERT_EQ(tune(*r->dev, t, &out), "");
  for (uint64_t b : {uint64_t{0}, out.block_count - 1})
    EXPECT_NE(r->superblock_at(b).features & kFeatureSharedBlocks, 0u) << "block " << b;
  const FsckRun c = run_fsck(*r->dev, false);
  EXPECT_EQ(c.r.exit_code, kFsckClean) << c.text;
  ASSERT_TRUE(r->mount()) << r->log;
  EXPECT_EQ(r->read(f, 0, 10000), pattern(5, 0, 10000));
}

}  // namespace
}  // namespace warpfs::fs::test
