// resize.warpfs's library (fs/resize.h): a filesystem grows to a larger device, keeps every
// file, uses the new space and checks clean; what it cannot do is refused with nothing
// written; a power cut at any device call of a grow leaves the old filesystem or the new one.
#include "warpfs/fs/resize.h"

#include <sys/statvfs.h>

#include "fs/core_rig.h"
#include "warpfs/fs/layout.h"

namespace warpfs::fs::test {
namespace {

// A device of `device_mib` with a filesystem of only `fs_blocks` blocks on it (as an image
// that was grown with truncate), holding a few files; unmounted.
std::unique_ptr<Rig> small_fs_on_big_device(uint64_t device_mib, uint64_t fs_blocks,
                                            MkfsOptions mo = {}) {
  auto r = Rig::make(device_mib, mo);
  if (!r) return nullptr;
  EXPECT_EQ(r->fs->unmount(), 0) << r->log;
  r->fs.reset();
  Geometry g;
  std::string err;
  mo.seed = 7;
  EXPECT_TRUE(plan_geometry(fs_blocks, mo, &g, &err)) << err;
  EXPECT_TRUE(format(*r->dev, mo, g, nullptr).is_ok());
  if (!r->mount()) return nullptr;
  const Ino d = r->mkdir(kRootInode, "d");
  for (int i = 0; i < 20; ++i) {
    const Ino f = r->create(d, "f" + std::to_string(i));
    EXPECT_EQ(r->write(f, 0, std::string(5000 * (i + 1), static_cast<char>('a' + i))), 0);
  }
  EXPECT_EQ(r->fs->unmount(), 0) << r->log;
  r->fs.reset();
  return r;
}

void expect_files(Rig& r) {
  Ino d = 0;
  ASSERT_EQ(r.lookup(kRootInode, "d", &d), 0);
  for (int i = 0; i < 20; ++i) {
    Ino f = 0;
    ASSERT_EQ(r.lookup(d, "f" + std::to_string(i), &f), 0) << i;
    EXPECT_EQ(r.read(f, 0, 200000), std::string(5000 * (i + 1), static_cast<char>('a' + i))) << i;
  }
}

TEST(Grow, KeepsEveryFileAndTheNewSpaceIsUsable) {
  auto r = small_fs_on_big_device(320, 10240);  // 40 MiB of 320: one group, then three
  ASSERT_TRUE(r);
  const Superblock before = r->superblock_at(0);
  ASSERT_EQ(before.group_count, 1u);
  ResizeResult res;
  ASSERT_EQ(grow(*r->dev, 0, {}, &res), "");
  EXPECT_EQ(res.old_blocks, before.block_count);
  EXPECT_EQ(res.old_groups, 1u);
  EXPECT_EQ(res.new_groups, 3u);
  const Superblock after = r->superblock_at(0);
  EXPECT_EQ(after.block_count, res.new_blocks);
  EXPECT_LE(after.block_count, r->dev->block_count());
  EXPECT_GT(after.block_count + kBlocksPerGroup, r->dev->block_count());
  EXPECT_EQ(after.inode_count, 3ull * before.inodes_per_group);
  EXPECT_EQ(after.state, kStateClean);
  // The backup moved to the new end and describes the grown filesystem.
  const Superblock backup = r->superblock_at(after.block_count - 1);
  EXPECT_EQ(backup.magic, kMagic);
  EXPECT_EQ(backup.block_count, after.block_count);
  EXPECT_EQ(backup.group_count, after.group_count);
  EXPECT_EQ(r->fsck_unmounted(), "");

  ASSERT_TRUE(r->mount());
  expect_files(*r);
  struct statvfs st;
  ASSERT_EQ(r->fs->statfs(&st), 0);
  EXPECT_GT(st.f_blocks, 3 * (after.block_count / 4));
  // 200 MiB: more than the old filesystem had in all; the new groups' inodes too.
  const Ino big = r->create(kRootInode, "big");
  const std::string mib(1 << 20, 'B');
  for (int i = 0; i < 200; ++i) ASSERT_EQ(r->write(big, uint64_t(i) << 20, mib), 0) << i;
  const Ino many = r->mkdir(kRootInode, "many");
  for (uint32_t i = 0; i < before.inodes_per_group + 10; ++i) {
    ASSERT_NE(r->create(many, "n" + std::to_string(i)), 0u) << i;
  }
  EXPECT_EQ(r->read(big, 199ull << 20, 1 << 20), mib);
  EXPECT_EQ(r->check_and_remount(), "");
  expect_files(*r);
  // Grown again, from three groups to the same device: nothing to add.
  ASSERT_EQ(r->fs->unmount(), 0);
  r->fs.reset();
  EXPECT_NE(grow(*r->dev, 0, {}, nullptr), "");
}

TEST(Grow, AFullLastGroupGrowsByNewGroupsOnly) {
  // Exactly one whole group, then a device with room for one more and a bit.
  Geometry g;
  std::string err;
  MkfsOptions mo;
  mo.seed = 7;
  mo.resize_max_blocks = 1 << 20;  // the descriptor table's size, whatever the device's
  mo.journal_blocks = 256;         // and the journal's
  ASSERT_TRUE(plan_geometry(40000, mo, &g, &err)) << err;
  const uint64_t whole = g.first_group_block + kBlocksPerGroup + 1;
  auto r = small_fs_on_big_device(512, whole, mo);
  ASSERT_TRUE(r);
  ASSERT_EQ(Layout(r->superblock_at(0)).group_size(0), kBlocksPerGroup);
  EXPECT_NE(grow(*r->dev, whole + 10, {}, nullptr), "");  // too few for a group of its own
  EXPECT_EQ(r->superblock_at(0).block_count, whole);
  ResizeResult res;
  ASSERT_EQ(grow(*r->dev, whole + kBlocksPerGroup / 2, {}, &res), "");
  EXPECT_EQ(res.new_groups, 2u);
  EXPECT_EQ(res.new_blocks, whole + kBlocksPerGroup / 2);
  EXPECT_EQ(r->fsck_unmounted(), "");
  ASSERT_TRUE(r->mount());
  expect_files(*r);
}

TEST(Grow, RefusesWhatItCannotDoAndWritesNothing) {
  auto r = small_fs_on_big_device(96, 10240);
  ASSERT_TRUE(r);
  const Superblock sb = r->superblock_at(0);
  EXPECT_NE(grow(*r->dev, sb.block_count, {}, nullptr), "");             // no larger
  EXPECT_NE(grow(*r->dev, sb.block_count - 100, {}, nullptr), "");       // smaller
  EXPECT_NE(grow(*r->dev, r->dev->block_count() + 1, {}, nullptr), "");  // past the device
  EXPECT_EQ(r->superblock_at(0).block_count, sb.block_count);
  // Not cleanly unmounted: refused until fsck or a mount.
  ASSERT_TRUE(r->mount());
  r->create(kRootInode, "dirty");
  ASSERT_EQ(r->fs->fsync(kRootInode, false), 0);
  ASSERT_TRUE(r->power_cycle(1.0));
  const std::string why = grow(*r->dev, 0, {}, nullptr);
  EXPECT_NE(why.find("not cleanly unmounted"), std::string::npos) << why;
  EXPECT_EQ(r->superblock_at(0).block_count, sb.block_count);
  // Not a warpfs.
  std::string zero(kBlockSize, '\0');
  ASSERT_TRUE(r->dev->write(0, 1, zero.data()).is_ok());
  EXPECT_NE(grow(*r->dev, 0, {}, nullptr), "");
}

TEST(Grow, BeyondTheDescriptorTablesRoomIsRefused) {
  MkfsOptions tight;
  tight.resize_max_blocks = 1;  // one descriptor block: room for 64 groups (8 GiB)
  // A 9 GiB device (memory is only used where written).
  auto r = small_fs_on_big_device(9 << 10, 10240, tight);
  ASSERT_TRUE(r);
  const std::string why = grow(*r->dev, 0, {}, nullptr);
  EXPECT_NE(why.find("room for 64 groups"), std::string::npos) << why;
  EXPECT_EQ(r->fsck_unmounted(), "");
  ResizeResult res;  // up to the room is fine
  ASSERT_EQ(grow(*r->dev, 64ull * kBlocksPerGroup, {}, &res), "");
  EXPECT_EQ(res.new_groups, 64u);
  EXPECT_EQ(r->fsck_unmounted(), "");
}

// An image made before the descriptor table kept room (no gdt_blocks, no feature bit): it
// grows as far as its table's last block allows, and stays readable by the code it came from.
TEST(Grow, AnImageMadeBeforeTheRoomGrowsWithinItsTable) {
  MkfsOptions tight;
  tight.resize_max_blocks = 1;  // a table of exactly the blocks the groups use
  auto r = small_fs_on_big_device(400, 10240, tight);
  ASSERT_TRUE(r);
  Superblock sb = r->superblock_at(0);
  ASSERT_EQ(sb.gdt_blocks, 1u);
  sb.gdt_blocks = 0;
  sb.features = kFeaturesV1;
  sb.checksum = superblock_checksum(sb);
  ASSERT_TRUE(r->dev->write(0, 1, &sb).is_ok());
  ASSERT_TRUE(r->dev->write(sb.block_count - 1, 1, &sb).is_ok());
  ASSERT_EQ(r->fsck_unmounted(), "");
  ResizeResult res;
  ASSERT_EQ(grow(*r->dev, 0, {}, &res), "");
  EXPECT_EQ(res.new_groups, 4u);
  const Superblock after = r->superblock_at(0);
  EXPECT_EQ(after.gdt_blocks, 0u);
  EXPECT_EQ(after.features, kFeaturesV1);
  EXPECT_EQ(r->fsck_unmounted(), "");
  ASSERT_TRUE(r->mount());
  expect_files(*r);
}

// A power cut at each mutating device call of a grow in turn: fsck (replaying the journal)
// finds the old filesystem or the new one, clean, and it mounts with every file.
TEST(Grow, APowerCutAtAnyPointLeavesTheOldOrTheNewFilesystem) {
  uint64_t calls = 0;
  {
    auto r = small_fs_on_big_device(200, 10240);
    ASSERT_TRUE(r);
    const uint64_t before = r->cut->mutations();
    ASSERT_EQ(grow(*r->cut, 0, {}, nullptr), "");
    calls = r->cut->mutations() - before;
  }
  ASSERT_GT(calls, 5u);
  uint64_t old_seen = 0, new_seen = 0;
  for (uint64_t n = 1; n <= calls; ++n) {
    auto r = small_fs_on_big_device(200, 10240);
    ASSERT_TRUE(r);
    const uint64_t old_blocks = r->superblock_at(0).block_count;
    r->cut->cut_at(n, true, n);
    EXPECT_NE(grow(*r->cut, 0, {}, nullptr), "") << n;
    ASSERT_TRUE(r->power_cycle(n % 3 == 0 ? 0.0 : n % 3 == 1 ? 1.0 : 0.5));
    EXPECT_EQ(r->fsck_unmounted(), "") << "cut at call " << n << " of " << calls;
    ASSERT_TRUE(r->mount()) << n;
    expect_files(*r);
    const uint64_t now = r->superblock_at(0).block_count;
    (now == old_blocks ? old_seen : new_seen) += 1;
    EXPECT_EQ(r->check_and_remount(), "") << n;
  }
  EXPECT_GT(old_seen, 0u);
  EXPECT_GT(new_seen, 0u);
}

}  // namespace
}  // namespace warpfs::fs::test
