// The on-disk format as mkfs writes it: geometry for many device sizes, every structure of a
// fresh filesystem read back and checked against fs/FORMAT.md's invariants, the overwrite
// guard, and the mkfs.warpfs program's behaviour and exit codes.
#include "warpfs/fs/mkfs.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cache/cache_rig.h"
#include "fs/core_rig.h"
#include "warpfs/blockdev/devices.h"
#include "warpfs/fs/format.h"

namespace warpfs::fs::test {
namespace {

using cache::test::Stack;

TEST(Geometry, CoversTheDeviceForManySizes) {
  for (uint64_t mib : {2ull, 3ull, 16ull, 129ull, 256ull, 1000ull, 4096ull, 20480ull, 5ull << 20}) {
    const uint64_t blocks = mib * 256;
    Geometry g;
    std::string err;
    ASSERT_TRUE(plan_geometry(blocks, MkfsOptions{}, &g, &err)) << mib << " MiB: " << err;
    EXPECT_LE(g.block_count, blocks) << mib;
    EXPECT_GE(g.block_count + kBlocksPerGroup, blocks) << "at most a partial group is left out";
    EXPECT_EQ(g.inodes_per_group % kInodesPerBlock, 0u);
    EXPECT_LE(g.inodes_per_group, kBlockSize * 8);
    EXPECT_EQ(g.first_group_block, 1 + g.journal_blocks + g.gdt_blocks);
    EXPECT_GE(uint64_t{g.gdt_blocks} * kGroupDescsPerBlock, g.group_count);
    // Room for the groups of 1024 times the device (at most 64 TiB), as resize.warpfs needs.
    const uint64_t limit = std::min<uint64_t>(blocks * 1024, uint64_t{1} << 34);
    EXPECT_GE(uint64_t{g.gdt_blocks} * kGroupDescsPerBlock * kBlocksPerGroup, limit) << mib;
    EXPECT_LT(uint64_t{g.gdt_blocks - 1} * kGroupDescsPerBlock * kBlocksPerGroup, limit) << mib;
    const uint64_t overhead = 2 + inode_table_blocks(g);
    for (uint32_t gi = 0; gi < g.group_count; ++gi) {
      EXPECT_GT(group_blocks(g, gi), overhead) << mib << " MiB group " << gi;
    }
    EXPECT_EQ(group_start(g, g.group_count - 1) + group_blocks(g, g.group_count - 1),
              g.block_count - 1);  // the backup superblock follows the last group
  }
  // Around 8.1 GiB a dropped short last group once left the descriptor table a block too
  // big (fsck's finding): with no room to grow, the table must be exactly ceil(groups / 64)
  // blocks at every size.
  MkfsOptions tight;
  tight.resize_max_blocks = 1;
  for (uint64_t blocks = 2129924 - 7 * 400; blocks < 2133000; blocks += 7) {  // incl. 2129924
    Geometry g;
    std::string err;
    ASSERT_TRUE(plan_geometry(blocks, tight, &g, &err)) << blocks << ": " << err;
    ASSERT_EQ(g.gdt_blocks, (g.group_count + kGroupDescsPerBlock - 1) / kGroupDescsPerBlock)
        << blocks;
    ASSERT_EQ(g.first_group_block, 1 + g.journal_blocks + g.gdt_blocks) << blocks;
    ASSERT_EQ(group_start(g, g.group_count - 1) + group_blocks(g, g.group_count - 1),
              g.block_count - 1);
  }
  Geometry g;
  std::string err;
  EXPECT_FALSE(plan_geometry(100, MkfsOptions{}, &g, &err));
  EXPECT_NE(err.find("too small"), std::string::npos);
  MkfsOptions many;
  many.inodes = 1ull << 40;
  EXPECT_FALSE(plan_geometry(65536, many, &g, &err));
  EXPECT_NE(err.find("too many inodes"), std::string::npos);
}

// Reads the whole metadata of a freshly formatted device and checks FORMAT.md's invariants
// 1-7 as they apply to an empty filesystem. Returns the first violation, or "".
std::string verify_fresh(blockdev::BlockDevice& dev) {
  std::vector<uint8_t> b(kBlockSize);
  auto rd = [&](uint64_t blk) { return dev.read(blk, 1, b.data()).is_ok(); };
  Superblock sb;
  if (!rd(0)) return "superblock unreadable";
  std::memcpy(&sb, b.data(), sizeof sb);
  if (sb.magic != kMagic || sb.version != kVersion) return "bad magic/version";
  if (sb.checksum != superblock_checksum(sb)) return "superblock checksum";
  Superblock backup;
  if (!rd(sb.block_count - 1)) return "backup unreadable";
  std::memcpy(&backup, b.data(), sizeof backup);
  if (std::memcmp(&sb, &backup, sizeof sb) != 0) return "backup differs from primary";
  if (sb.state != kStateClean ||
      sb.features != (kFeaturesV1 | kFeatureGdtRoom | kFeatureXattrChain | kFeatureSharedBlocks))
    return "state/features";
  if (sb.gdt_blocks < (sb.group_count + kGroupDescsPerBlock - 1) / kGroupDescsPerBlock)
    return "gdt_blocks";
  const uint64_t seed = sb.checksum_seed;
  const uint32_t itb = sb.inodes_per_group / kInodesPerBlock;
  uint64_t free_blocks = 0, free_inodes = 0;
  for (uint32_t gi = 0; gi < sb.group_count; ++gi) {
    if (!rd(sb.gdt_start + gi / kGroupDescsPerBlock)) return "gdt unreadable";
    GroupDesc gd;
    std::memcpy(&gd, b.data() + (gi % kGroupDescsPerBlock) * sizeof gd, sizeof gd);
    if (gd.checksum != group_checksum(gd, seed)) return "group " + std::to_string(gi) + " checksum";
    if (!rd(gd.block_bitmap)) return "block bitmap unreadable";
    if (gd.block_bitmap_checksum != checksum(b.data(), kBlockSize, seed))
      return "block bitmap checksum";
    uint64_t used = 0;
    for (uint8_t x : b) used += static_cast<uint64_t>(std::popcount(x));
    if (kBlocksPerGroup - used != gd.free_blocks)
      return "group " + std::to_string(gi) + " free blocks";
    if (!rd(gd.inode_bitmap)) return "inode bitmap unreadable";
    if (gd.inode_bitmap_checksum != checksum(b.data(), kBlockSize, seed))
      return "inode bitmap checksum";
    uint64_t iused = 0;
    for (uint8_t x : b) iused += static_cast<uint64_t>(std::popcount(x));
    if (kBlockSize * 8 - iused != gd.free_inodes)
      return "group " + std::to_string(gi) + " free inodes";
    free_blocks += gd.free_blocks;
    free_inodes += gd.free_inodes;
    // Every inode but the root is free (all zero).
    for (uint32_t t = 0; t < itb; ++t) {
      if (!rd(gd.inode_table + t)) return "inode table unreadable";
      for (uint32_t k = 0; k < kInodesPerBlock; ++k) {
        const uint64_t ino = uint64_t{gi} * sb.inodes_per_group + t * kInodesPerBlock + k + 1;
        Inode in;
        std::memcpy(&in, b.data() + k * kInodeSize, sizeof in);
        if (ino == kRootInode) {
          if (in.checksum != inode_checksum(in, ino, seed)) return "root inode checksum";
          if (in.mode != 040755 || in.links != 2 || in.extent_count != 1)
            return "root inode fields";
          continue;
        }
        const auto* raw = b.data() + k * kInodeSize;
        for (uint32_t x = 0; x < kInodeSize; ++x) {
          if (raw[x] != 0) return "inode " + std::to_string(ino) + " is not free";
        }
      }
    }
  }
  if (free_blocks != sb.free_blocks || free_inodes != sb.free_inodes)
    return "superblock free counts";
  // The root directory: an index root with one leaf, both checksummed, the leaf empty.
  GroupDesc gd0;
  if (!rd(sb.gdt_start)) return "gdt unreadable";
  std::memcpy(&gd0, b.data(), sizeof gd0);
  if (!rd(gd0.inode_table)) return "inode table unreadable";
  Inode root;
  std::memcpy(&root, b.data(), sizeof root);
  const Extent e = root.root.extents[0];
  if (!rd(e.physical)) return "root index unreadable";
  DirIndexHeader ih;
  std::memcpy(&ih, b.data(), sizeof ih);
  if (ih.magic != kDirIndexMagic || ih.count != 1 || ih.owner != kRootInode)
    return "root index header";
  if (ih.checksum != block_checksum(b.data(), offsetof(DirIndexHeader, checksum), seed))
    return "root index checksum";
  if (!rd(e.physical + 1)) return "root leaf unreadable";
  DirLeafHeader lh;
  std::memcpy(&lh, b.data(), sizeof lh);
  if (lh.magic != kDirLeafMagic || lh.count != 0) return "root leaf header";
  if (lh.checksum != block_checksum(b.data(), offsetof(DirLeafHeader, checksum), seed))
    return "root leaf checksum";
  // The root's blocks are marked used in group 0's bitmap (they follow the inode table).
  if (e.physical != gd0.inode_table + itb) return "root directory blocks misplaced";
  if (!rd(1)) return "journal header unreadable";
  JournalHeader jh;
  std::memcpy(&jh, b.data(), sizeof jh);
  if (jh.magic != kJournalHeaderMagic ||
      jh.checksum != block_checksum(b.data(), offsetof(JournalHeader, checksum), seed))
    return "journal header";
  return "";
}

TEST(Format, FreshFilesystemPassesEveryCheck) {
  for (uint64_t mib : {2ull, 48ull, 300ull}) {
    auto s = Stack::make(mib << 20);
    ASSERT_TRUE(s);
    std::string err;
    auto dev = blockdev::NvmeBlockDevice::create(*s->engine, 1, kBlockSize, &err);
    ASSERT_TRUE(dev) << err;
    MkfsOptions o;
    o.label = "unit";
    o.seed = 42;
    Geometry g;
    ASSERT_TRUE(plan_geometry(dev->block_count(), o, &g, &err)) << err;
    uint64_t calls = 0;
    ASSERT_TRUE(format(*dev, o, g, [&](uint64_t, uint64_t) { ++calls; }).is_ok());
    EXPECT_EQ(calls, g.group_count);
    EXPECT_EQ(verify_fresh(*dev), "") << mib << " MiB";
    // A flipped byte anywhere in the superblock is caught by its checksum.
    std::vector<uint8_t> b(kBlockSize);
    ASSERT_TRUE(dev->read(0, 1, b.data()).is_ok());
    b[130] ^= 1;  // inside the label
    ASSERT_TRUE(dev->write(0, 1, b.data()).is_ok());
    EXPECT_EQ(verify_fresh(*dev), "superblock checksum");
  }
}

TEST(Format, ProbeRecognisesWhatIsOnTheDevice) {
  auto s = Stack::make(8ull << 20);
  ASSERT_TRUE(s);
  std::string err, what;
  auto dev = blockdev::NvmeBlockDevice::create(*s->engine, 1, kBlockSize, &err);
  ASSERT_TRUE(dev) << err;
  EXPECT_EQ(probe_existing(*dev, &what), Existing::kNothing);
  std::vector<uint8_t> b(kBlockSize, 0);
  b[1080] = 0x53, b[1081] = 0xef;  // an ext4 superblock's magic
  ASSERT_TRUE(dev->write(0, 1, b.data()).is_ok());
  EXPECT_EQ(probe_existing(*dev, &what), Existing::kOtherFilesystem);
  EXPECT_NE(what.find("ext"), std::string::npos);
  b.assign(kBlockSize, 0);
  b[7000 % kBlockSize] = 9;
  ASSERT_TRUE(dev->write(0, 1, b.data()).is_ok());
  EXPECT_EQ(probe_existing(*dev, &what), Existing::kData);
  Geometry g;
  ASSERT_TRUE(plan_geometry(dev->block_count(), MkfsOptions{}, &g, &err));
  MkfsOptions o;
  o.label = "mine";
  ASSERT_TRUE(format(*dev, o, g, nullptr).is_ok());
  EXPECT_EQ(probe_existing(*dev, &what), Existing::kWarpfs);
  EXPECT_NE(what.find("mine"), std::string::npos);
}

// Runs mkfs.warpfs with `args`; returns its exit status and output.
int run_mkfs(const std::string& args, std::string* out) {
  return run_command(std::string(WARPFS_MKFS_BIN) + " " + args, out);
}

TEST(MkfsProgram, CreatesRefusesForcesAndExplains) {
  char dir[] = "/tmp/warpfs-mkfs-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string img = std::string(dir) + "/a.img";
  std::string out;
  EXPECT_EQ(run_mkfs("emu:" + img, &out), 1);
  EXPECT_NE(out.find("--size"), std::string::npos) << out;
  EXPECT_EQ(run_mkfs("--size 64M -L first emu:" + img, &out), 0) << out;
  EXPECT_NE(out.find("16384 blocks"), std::string::npos) << out;
  struct stat st {};
  ASSERT_EQ(stat(img.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 64 << 20);
  EXPECT_EQ(run_mkfs(img, &out), 1);
  EXPECT_NE(out.find("contains a warpfs filesystem labelled 'first'"), std::string::npos) << out;
  EXPECT_EQ(run_mkfs("--force -q -L second " + img, &out), 0) << out;
  EXPECT_EQ(out, "");
  EXPECT_EQ(run_mkfs("--size 12Q " + img, &out), 2);
  EXPECT_EQ(run_mkfs("--label " + std::string(64, 'x') + " " + img, &out), 2);
  EXPECT_EQ(run_mkfs("--size 1M emu:" + std::string(dir) + "/tiny.img", &out), 1);
  EXPECT_NE(out.find("too small"), std::string::npos) << out;
  // A PCI address with no device behind it: a message naming it and the list tool.
  EXPECT_EQ(run_mkfs("vfio:00fe:fe:1f.7", &out), 1);
  EXPECT_NE(out.find("no PCI device 00fe:fe:1f.7"), std::string::npos) << out;
  EXPECT_NE(out.find("warpfs-pci list"), std::string::npos) << out;
  EXPECT_EQ(run_mkfs("", &out), 2);
  std::string rm = std::string("rm -rf ") + dir;
  ASSERT_EQ(std::system(rm.c_str()), 0);
}

}  // namespace
}  // namespace warpfs::fs::test
