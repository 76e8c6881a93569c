// A group's metadata (its bitmaps and inode table, the blocks past the end of a short last
// group, and outside the groups the superblocks, journal and descriptor table) is never
// allocated nor freed as data (fs/src/alloc.cc). A block bitmap that marks it free, with a
// valid checksum, is refused at mount and named by fsck; a file or xattr pointer into it is
// not freed when its owner goes. The fuzzer found the first as a use-after-free: a new
// directory block over the group's block bitmap retired the bitmap's cached buffer
// (tests/fuzz/regress/fuzz_mount/block-bitmap-frees-group-metadata-use-after-free).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "fs/core_rig.h"
#include "warpfs/fs/format.h"

namespace warpfs::fs::test {
namespace {

// The unmounted filesystem's group 0, its inodes and its block bitmap, changed in place
// with every checksum kept valid.
struct Group0 {
  blockdev::BlockDevice& dev;
  Superblock sb{};
  GroupDesc gd{};
  std::vector<uint8_t> bitmap = std::vector<uint8_t>(kBlockSize);

  explicit Group0(blockdev::BlockDevice& d) : dev(d) {
    EXPECT_TRUE(dev.read(0, 1, &sb).is_ok());
    std::vector<uint8_t> b(kBlockSize);
    EXPECT_TRUE(dev.read(sb.gdt_start, 1, b.data()).is_ok());
    std::memcpy(&gd, b.data(), sizeof gd);
    EXPECT_TRUE(dev.read(gd.block_bitmap, 1, bitmap.data()).is_ok());
  }
  uint32_t itb() const { return sb.inodes_per_group / kInodesPerBlock; }
  uint64_t size() const {
    return std::min<uint64_t>(kBlocksPerGroup, sb.block_count - 1 - gd.block_bitmap);
  }
  bool bit(uint64_t block) const {
    const uint64_t i = block - gd.block_bitmap;
    return (bitmap[i / 8] >> (i % 8)) & 1;
  }
  void clear(uint64_t first, uint64_t n) {
    for (uint64_t i = first - gd.block_bitmap; i < first - gd.block_bitmap + n; ++i) {
      bitmap[i / 8] &= static_cast<uint8_t>(~(1u << (i % 8)));
    }
  }
  // The bitmap and its descriptor (with the bitmap's checksum) back on the device.
  void store() {
    ASSERT_TRUE(dev.write(gd.block_bitmap, 1, bitmap.data()).is_ok());
    gd.block_bitmap_checksum = checksum(bitmap.data(), kBlockSize, sb.checksum_seed);
    gd.checksum = group_checksum(gd, sb.checksum_seed);
    std::vector<uint8_t> b(kBlockSize);
    ASSERT_TRUE(dev.read(sb.gdt_start, 1, b.data()).is_ok());
    std::memcpy(b.data(), &gd, sizeof gd);
    ASSERT_TRUE(dev.write(sb.gdt_start, 1, b.data()).is_ok());
  }
  // Inode `ino` of group 0, changed by `f`, its checksum recomputed.
  template <typename F>
  void edit_inode(uint64_t ino, F f) {
    const uint64_t block = gd.inode_table + (ino - 1) / kInodesPerBlock;
    std::vector<uint8_t> b(kBlockSize);
    ASSERT_TRUE(dev.read(block, 1, b.data()).is_ok());
    Inode d;
    std::memcpy(&d, b.data() + (ino - 1) % kInodesPerBlock * kInodeSize, sizeof d);
    f(d);
    d.checksum = inode_checksum(d, ino, sb.checksum_seed);
    std::memcpy(b.data() + (ino - 1) % kInodesPerBlock * kInodeSize, &d, sizeof d);
    ASSERT_TRUE(dev.write(block, 1, b.data()).is_ok());
  }
};

void unmount(Rig& r) {
  ASSERT_EQ(r.fs->unmount(), 0) << r.log;
  r.fs.reset();
}

// Mounting fails (read-write and read-only), says why in the log, and writes nothing.
void mount_refused(Rig& r, const std::string& why) {
  for (bool ro : {false, true}) {
    const uint64_t writes = r.stack->device_writes();
    MountOptions o;
    o.read_only = ro;
    std::string log, err;
    o.log = [&](const std::string& s) { log += s + "\n"; };
    EXPECT_EQ(Filesystem::mount(*r.dev, o, &err), nullptr) << (ro ? "read-only" : "read-write");
    EXPECT_NE(err.find("cannot load the block groups"), std::string::npos) << err;
    EXPECT_NE(log.find(why), std::string::npos) << "missing '" << why << "' in:\n" << log;
    EXPECT_EQ(r.stack->device_writes(), writes) << "a refused mount wrote";
  }
}

struct FsckRun {
  FsckResult r;
  std::string text;
};
FsckRun run_fsck(blockdev::BlockDevice& dev, bool repair) {
  FsckOptions o;
  o.repair = repair;
  FsckRun run;
  run.r = fsck(dev, o, [&](const std::string& s) { run.text += s + "\n"; });
  return run;
}

TEST(BitmapCorrupt, MetadataMarkedFreeIsRefusedAtMountAndNamedByFsck) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino dir = r->mkdir(kRootInode, "d");
  const Ino f = r->create(dir, "f");
  const std::string data = pattern(1, 0, 3 * kBlockSize);
  ASSERT_EQ(r->write(f, 0, data), 0);
  unmount(*r);
  // The fuzzer's image: the bits of the group's bitmaps and inode table all clear.
  Group0 g0(*r->dev);
  const uint64_t bb = g0.gd.block_bitmap, table = g0.gd.inode_table, itb = g0.itb();
  ASSERT_TRUE(g0.bit(bb) && g0.bit(bb + 1) && g0.bit(table + itb - 1));
  g0.clear(bb, 2 + itb);
  g0.store();

  mount_refused(*r, "group 0: the block bitmap (block " + std::to_string(bb) + ") marks " +
                        std::to_string(2 + itb) +
                        " of the group's own metadata blocks free, the first block " +
                        std::to_string(bb) + " (the block bitmap of group 0) (run fsck.warpfs)");

  // fsck names each structure, repairs the bitmap, and the filesystem mounts with its data.
  const FsckRun check = run_fsck(*r->dev, false);
  EXPECT_EQ(check.r.exit_code, kFsckUncorrected) << check.text;
  for (const std::string& line :
       {"block " + std::to_string(bb) + " (the block bitmap of group 0): the group's own metadata",
        "block " + std::to_string(bb + 1) +
            " (the inode bitmap of group 0): the group's own metadata",
        "blocks " + std::to_string(table) + "-" + std::to_string(table + itb - 1) +
            " (the inode table of group 0): the group's own metadata, marked free in its block "
            "bitmap"}) {
    EXPECT_NE(check.text.find(line), std::string::npos) << "missing '" << line << "' in:\n"
                                                        << check.text;
  }
  const FsckRun repair = run_fsck(*r->dev, true);
  EXPECT_EQ(repair.r.exit_code, kFsckCorrected) << repair.text;
  EXPECT_EQ(r->fsck_unmounted(), "");
  ASSERT_TRUE(r->mount()) << r->log;
  Ino found = 0;
  ASSERT_EQ(r->lookup(dir, "f", &found), 0);
  EXPECT_EQ(r->read(found, 0, data.size()), data);
}

// Block `block`'s bit cleared in group 0's bitmap (checksums kept): the mount is refused,
// naming the block as `name`, and fsck's check reports `fsck_line`.
void clear_one_refused(Rig& r, uint64_t block, const std::string& name,
                       const std::string& fsck_line) {
  Group0 g0(*r.dev);
  ASSERT_TRUE(g0.bit(block));
  g0.clear(block, 1);
  g0.store();
  mount_refused(r, "marks 1 of the group's own metadata blocks free, the first block " +
                       std::to_string(block) + " (" + name + ")");
  const FsckRun check = run_fsck(*r.dev, false);
  EXPECT_EQ(check.r.exit_code, kFsckUncorrected) << check.text;
  EXPECT_NE(check.text.find(fsck_line), std::string::npos) << check.text;
}

TEST(BitmapCorrupt, OneInodeTableBlockMarkedFreeIsRefused) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  unmount(*r);
  const Group0 g0(*r->dev);
  const uint64_t last = g0.gd.inode_table + g0.itb() - 1;
  clear_one_refused(*r, last, "the inode table of group 0",
                    "block " + std::to_string(last) + " (the inode table of group 0)");
}

TEST(BitmapCorrupt, BackupSuperblockMarkedFreeInAShortLastGroupIsRefused) {
  auto r = Rig::make();  // 64 MiB: one group, shorter than 32768 blocks
  ASSERT_TRUE(r);
  unmount(*r);
  const Group0 g0(*r->dev);
  ASSERT_LT(g0.size(), kBlocksPerGroup);
  const uint64_t backup = g0.sb.block_count - 1;
  ASSERT_EQ(backup, g0.gd.block_bitmap + g0.size());
  clear_one_refused(*r, backup, "the backup superblock",
                    "group 0: block bitmap bits past the end of the group are not all set");
}

// An empty file of the unmounted filesystem made to own one block at `physical` (its
// size and block count to match), then deleted through a fresh mount.
std::string delete_file_owning(Rig& r, const std::string& name, uint64_t physical) {
  const Ino f = r.create(kRootInode, name);
  unmount(r);
  Group0 g0(*r.dev);
  g0.edit_inode(f, [&](Inode& d) {
    d.size = kBlockSize;
    d.blocks = 1;
    d.extent_count = 1;
    d.root.extents[0] = Extent{0, 1, physical};
  });
  r.log.clear();
  if (!r.mount()) return "no mount";
  EXPECT_EQ(r.fs->unlink(kRootInode, name), 0) << r.log;
  EXPECT_EQ(r.fs->sync(), 0) << r.log;
  return r.log;
}

TEST(BitmapCorrupt, FreeingMetadataIsRefused) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  unmount(*r);
  Group0 before(*r->dev);
  ASSERT_TRUE(r->mount());
  const uint64_t table = before.gd.inode_table + 1, journal = 5;
  for (auto [block, name] : {std::pair{table, "the inode table of group 0"},
                             std::pair{before.gd.block_bitmap, "the block bitmap of group 0"},
                             std::pair{journal, "the journal"}}) {
    const std::string log = delete_file_owning(*r, "f", block);
    EXPECT_NE(log.find("block " + std::to_string(block) + " (" + name +
                       ") freed as if it held file data: not freed (run fsck.warpfs)"),
              std::string::npos)
        << log;
    unmount(*r);
    // Nothing was freed: the block bitmap is as it was, and fsck finds nothing (the file
    // with the bad pointer is gone).
    Group0 after(*r->dev);
    EXPECT_EQ(after.bitmap, before.bitmap) << name;
    EXPECT_EQ(r->fsck_unmounted(), "") << name;
    ASSERT_TRUE(r->mount());
  }
}

TEST(BitmapCorrupt, XattrBlockNamingTheBlockBitmapIsNotRetired) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  unmount(*r);
  Group0 g0(*r->dev);
  const uint64_t bb = g0.gd.block_bitmap;
  g0.edit_inode(f, [&](Inode& d) {
    d.xattr_block = bb;
    d.blocks = 1;
  });
  ASSERT_TRUE(r->mount());
  std::string v;
  EXPECT_EQ(r->fs->getxattr(f, "user.x", &v), EIO);
  EXPECT_NE(r->log.find("metadata block " + std::to_string(bb) +
                        " is a block bitmap, not a directory, extent-tree or xattr block"),
            std::string::npos)
      << r->log;
  // Deleting the file neither retires the group's cached bitmap (a use-after-free under
  // ASan at the next allocation) nor frees the block.
  ASSERT_EQ(r->fs->unlink(kRootInode, "f"), 0) << r->log;
  EXPECT_NE(
      r->log.find("metadata block " + std::to_string(bb) +
                  " is a block bitmap, freed as a directory, extent-tree or xattr block: kept"),
      std::string::npos)
      << r->log;
  EXPECT_NE(
      r->log.find("block " + std::to_string(bb) + " (the block bitmap of group 0) freed as if"),
      std::string::npos)
      << r->log;
  ASSERT_EQ(r->fs->sync(), 0);
  const Ino d = r->mkdir(kRootInode, "d");
  const Ino g = r->create(d, "g");
  ASSERT_EQ(r->write(g, 0, pattern(2, 0, 5 * kBlockSize)), 0);
  ASSERT_EQ(r->fs->sync(), 0);
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(r->read(g, 0, 5 * kBlockSize), pattern(2, 0, 5 * kBlockSize));
}

}  // namespace
}  // namespace warpfs::fs::test
