// fsck (fs/FORMAT.md "Invariants"): clean images pass (a fresh mkfs, a populated filesystem
// made by the core); each planted corruption is found and named, repaired by a second run,
// after which a third run is clean and the filesystem mounts; check mode never writes; and
// the fsck.warpfs program's exit codes and its -n guarantee.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <sstream>

#include "fs/core_rig.h"
#include "warpfs/fs/format.h"
#include "warpfs/fs/layout.h"

namespace warpfs::fs::test {
namespace {

// --- running fsck ------------------------------------------------------------------------

struct FsckRun {
  FsckResult r;
  std::string text;  // every line reported
  bool has(const std::string& s) const { return text.find(s) != std::string::npos; }
};

FsckRun run_fsck(blockdev::BlockDevice& dev, bool repair, bool replay = true) {
  FsckOptions o;
  o.repair = repair;
  o.replay_journal = replay;
  FsckRun run;
  run.r = fsck(dev, o, [&](const std::string& s) { run.text += s + "\n"; });
  if (!run.r.error.empty()) run.text += "error: " + run.r.error + "\n";
  return run;
}

// --- raw access to an unmounted filesystem, for planting corruptions ----------------------

struct Raw {
  blockdev::BlockDevice& dev;
  Superblock sb;

  explicit Raw(blockdev::BlockDevice& d) : dev(d) { EXPECT_TRUE(d.read(0, 1, &sb).is_ok()); }
  std::vector<uint8_t> get(uint64_t b) {
    std::vector<uint8_t> v(kBlockSize);
    EXPECT_TRUE(dev.read(b, 1, v.data()).is_ok()) << b;
    return v;
  }
  void put(uint64_t b, const void* p) { EXPECT_TRUE(dev.write(b, 1, p).is_ok()) << b; }
  uint64_t seed() const { return sb.checksum_seed; }
  void put_sb() {
    sb.checksum = superblock_checksum(sb);
    put(0, &sb);
  }

  GroupDesc gd(uint32_t g) {
    auto b = get(sb.gdt_start + g / kGroupDescsPerBlock);
    GroupDesc d;
    std::memcpy(&d, b.data() + (g % kGroupDescsPerBlock) * sizeof d, sizeof d);
    return d;
  }
  void put_gd(uint32_t g, GroupDesc d, bool fix = true) {
    if (fix) d.checksum = group_checksum(d, seed());
    auto b = get(sb.gdt_start + g / kGroupDescsPerBlock);
    std::memcpy(b.data() + (g % kGroupDescsPerBlock) * sizeof d, &d, sizeof d);
    put(sb.gdt_start + g / kGroupDescsPerBlock, b.data());
  }
  uint64_t first_group() const { return Layout(sb).first_group; }

  uint64_t inode_block(uint64_t ino) {
    const auto g = static_cast<uint32_t>((ino - 1) / sb.inodes_per_group);
    return gd(g).inode_table + (ino - 1) % sb.inodes_per_group / kInodesPerBlock;
  }
  Inode inode(uint64_t ino) {
    auto b = get(inode_block(ino));
    Inode d;
    std::memcpy(&d, b.data() + (ino - 1) % kInodesPerBlock * kInodeSize, sizeof d);
    return d;
  }
  void put_inode(uint64_t ino, Inode d, bool fix = true) {
    if (fix) d.checksum = inode_checksum(d, ino, seed());
    auto b = get(inode_block(ino));
    std::memcpy(b.data() + (ino - 1) % kInodesPerBlock * kInodeSize, &d, sizeof d);
    put(inode_block(ino), b.data());
  }

  // Flips block b's bit in its group's bitmap, keeping every checksum valid.
  void flip_block_bit(uint64_t b) {
    const auto g = static_cast<uint32_t>((b - first_group()) / kBlocksPerGroup);
    GroupDesc d = gd(g);
    auto bm = get(d.block_bitmap);
    const uint64_t i = (b - first_group()) % kBlocksPerGroup;
    bm[i / 8] ^= static_cast<uint8_t>(1u << (i % 8));
    put(d.block_bitmap, bm.data());
    d.block_bitmap_checksum = checksum(bm.data(), kBlockSize, seed());
    put_gd(g, d);
  }
  bool block_bit(uint64_t b) {
    const auto g = static_cast<uint32_t>((b - first_group()) / kBlocksPerGroup);
    auto bm = get(gd(g).block_bitmap);
    const uint64_t i = (b - first_group()) % kBlocksPerGroup;
    return (bm[i / 8] >> (i % 8)) & 1;
  }
  // Marks inode `ino` used in its bitmap, its descriptor and the superblock's count.
  void allocate_inode_bit(uint64_t ino) {
    const auto g = static_cast<uint32_t>((ino - 1) / sb.inodes_per_group);
    GroupDesc d = gd(g);
    auto bm = get(d.inode_bitmap);
    const uint64_t i = (ino - 1) % sb.inodes_per_group;
    bm[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    put(d.inode_bitmap, bm.data());
    d.inode_bitmap_checksum = checksum(bm.data(), kBlockSize, seed());
    d.free_inodes -= 1;
    put_gd(g, d);
    sb.free_inodes -= 1;
    put_sb();
  }

  // A directory's block `lblk` (its extents are inline: small directories).
  uint64_t dir_block(uint64_t dir, uint32_t lblk) {
    const Inode d = inode(dir);
    EXPECT_EQ(d.tree_depth, 0u);
    for (uint32_t i = 0; i < d.extent_count; ++i) {
      const Extent& e = d.root.extents[i];
      if (lblk >= e.logical && lblk < e.logical + e.blocks())
        return e.physical + (lblk - e.logical);
    }
    ADD_FAILURE() << "directory " << dir << " block " << lblk << " not mapped";
    return 0;
  }

  struct Entry {
    uint64_t hash, ino;
    uint8_t type;
    std::string name;
  };
  std::vector<Entry> leaf(uint64_t phys) {
    auto b = get(phys);
    DirLeafHeader h;
    std::memcpy(&h, b.data(), sizeof h);
    std::vector<Entry> v;
    size_t off = sizeof h;
    for (uint16_t i = 0; i < h.count; ++i) {
      DirEntryHeader e;
      std::memcpy(&e, b.data() + off, sizeof e);
      v.push_back(
          Entry{e.hash, e.inode, e.type,
                std::string(reinterpret_cast<char*>(b.data() + off + sizeof e), e.name_len)});
      off += e.rec_len;
    }
    return v;
  }
  void put_leaf(uint64_t phys, uint64_t owner, const std::vector<Entry>& v) {
    std::vector<uint8_t> b(kBlockSize, 0);
    size_t off = sizeof(DirLeafHeader);
    for (const Entry& x : v) {
      const auto rec =
          static_cast<uint16_t>((sizeof(DirEntryHeader) + x.name.size() + 7) & ~size_t{7});
      const DirEntryHeader e{x.hash, x.ino, rec, static_cast<uint8_t>(x.name.size()), x.type};
      std::memcpy(b.data() + off, &e, sizeof e);
      std::memcpy(b.data() + off + sizeof e, x.name.data(), x.name.size());
      off += rec;
    }
    const DirLeafHeader h{kDirLeafMagic,
                          static_cast<uint16_t>(v.size()),
                          static_cast<uint16_t>(off - sizeof(DirLeafHeader)),
                          owner,
                          0,
                          0};
    std::memcpy(b.data(), &h, sizeof h);
    fix_header(b);
    put(phys, b.data());
  }
  void fix_header(std::vector<uint8_t>& b) {
    const uint64_t c = block_checksum(b.data(), kHeaderChecksumOffset, seed());
    std::memcpy(b.data() + kHeaderChecksumOffset, &c, 8);
  }
  // The leaf of directory `dir` (depth 1, one leaf per index entry) that holds `name`.
  uint64_t leaf_of(uint64_t dir, const std::string& name) {
    auto root = get(dir_block(dir, 0));
    DirIndexHeader h;
    std::memcpy(&h, root.data(), sizeof h);
    EXPECT_EQ(h.depth, 1);
    for (uint16_t i = 0; i < h.count; ++i) {
      DirIndexEntry e;
      std::memcpy(&e, root.data() + sizeof h + i * sizeof e, sizeof e);
      const uint64_t phys = dir_block(dir, e.block);
      for (const Entry& x : leaf(phys)) {
        if (x.name == name) return phys;
      }
    }
    ADD_FAILURE() << "no entry " << name << " in directory " << dir;
    return 0;
  }
};

// --- the populated filesystem ------------------------------------------------------------

// A small tree the corruption tests share. Every name is kept for the checks after repair.
struct Tree {
  Ino dir = 0, a = 0, b = 0, c = 0, link = 0, sub = 0;
  std::string a_data, b_data;
};

Tree populate_small(Rig& r) {
  Tree t;
  t.dir = r.mkdir(kRootInode, "d");
  t.sub = r.mkdir(t.dir, "sub");
  t.a = r.create(t.dir, "a");
  t.b = r.create(kRootInode, "b");
  t.c = r.create(t.dir, "c");
  t.a_data = pattern(1, 0, 4096);
  t.b_data = pattern(2, 0, 4096);
  EXPECT_EQ(r.write(t.a, 0, t.a_data), 0);
  EXPECT_EQ(r.write(t.b, 0, t.b_data), 0);
  EXPECT_EQ(r.write(t.c, 0, pattern(3, 0, 20000)), 0);
  Attr at;
  EXPECT_EQ(r.fs->symlink(t.dir, "s", "a", Caller{}, &at), 0);
  t.link = at.ino;
  EXPECT_EQ(r.fs->link(t.c, kRootInode, "c2", &at), 0);
  EXPECT_EQ(r.fs->setxattr(t.c, "user.color", "blue", 4, 0), 0);
  return t;
}

void unmount(Rig& r) {
  ASSERT_EQ(r.fs->unmount(), 0) << r.log;
  r.fs.reset();
}

// The planted corruption is found (check mode: exit 4, no writes, `needle` reported),
// repaired (exit 1), and a third run is clean; then the filesystem mounts.
void found_repaired_clean(Rig& r, const std::vector<std::string>& needles) {
  const uint64_t writes = r.stack->device_writes();
  const FsckRun a = run_fsck(*r.dev, false);
  EXPECT_EQ(a.r.exit_code, kFsckUncorrected) << a.text;
  for (const std::string& n : needles)
    EXPECT_TRUE(a.has(n)) << "missing '" << n << "' in:\n" << a.text;
  EXPECT_EQ(r.stack->device_writes(), writes) << "check mode wrote to the device";
  const FsckRun b = run_fsck(*r.dev, true);
  EXPECT_EQ(b.r.exit_code, kFsckCorrected) << b.text;
  EXPECT_GT(b.r.corrected, 0u);
  const FsckRun c = run_fsck(*r.dev, false);
  EXPECT_EQ(c.r.exit_code, kFsckClean) << "after repair:\n" << c.text << "repair said:\n" << b.text;
  if (std::getenv("WARPFS_FSCK_TEST_VERBOSE"))
    std::printf("check:\n%srepair:\n%s", a.text.c_str(), b.text.c_str());
  ASSERT_TRUE(r.mount()) << r.log;
}

// --- clean images ------------------------------------------------------------------------

TEST(Fsck, FreshFilesystemsAreClean) {
  for (uint64_t mib : {2ull, 48ull, 300ull}) {
    auto s = cache::test::Stack::make(mib << 20);
    ASSERT_TRUE(s);
    std::string err;
    auto dev = blockdev::NvmeBlockDevice::create(*s->engine, 1, kBlockSize, &err);
    ASSERT_TRUE(dev) << err;
    Geometry g;
    ASSERT_TRUE(plan_geometry(dev->block_count(), MkfsOptions{}, &g, &err)) << err;
    ASSERT_TRUE(format(*dev, MkfsOptions{}, g, nullptr).is_ok());
    const uint64_t writes = s->device_writes();
    const FsckRun a = run_fsck(*dev, false);
    EXPECT_EQ(a.r.exit_code, kFsckClean) << mib << " MiB:\n" << a.text;
    EXPECT_EQ(a.text, "");
    EXPECT_EQ(a.r.inodes_used, 1u);
    EXPECT_EQ(a.r.directories, 1u);
    EXPECT_EQ(a.r.inode_count, g.inode_count);
    EXPECT_EQ(a.r.blocks_used, g.metadata_blocks + 2);  // + the root directory's two blocks
    const FsckRun b = run_fsck(*dev, true);
    EXPECT_EQ(b.r.exit_code, kFsckClean) << b.text;
    EXPECT_EQ(s->device_writes(), writes) << "nothing to repair, nothing written";
    FsckOptions quick;
    quick.skip_if_clean = true;
    const FsckResult q = fsck(*dev, quick, nullptr);
    EXPECT_TRUE(q.skipped);
    EXPECT_EQ(q.exit_code, kFsckClean);
    EXPECT_EQ(q.inodes_used, 1u);
  }
}

TEST(Fsck, PopulatedFilesystemIsClean) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  populate_small(*r);
  const Ino top = r->mkdir(kRootInode, "top");
  Ino cur = top;
  for (int depth = 0; depth < 6; ++depth) cur = r->mkdir(cur, "level" + std::to_string(depth));
  const Ino many = r->mkdir(kRootInode, "many");
  for (int i = 0; i < 1500; ++i) {  // several leaves
    const Ino f = r->create(many, "entry-with-a-longer-name-" + std::to_string(i));
    if (i % 100 == 0) {
      ASSERT_EQ(r->write(f, 0, pattern(i, 0, 1 + i * 7)), 0);
    }
    r->fs->forget(f, 1);
  }
  for (int i = 0; i < 1500; i += 3) {
    ASSERT_EQ(r->fs->unlink(many, "entry-with-a-longer-name-" + std::to_string(i)), 0);
  }
  Attr a;
  ASSERT_EQ(r->fs->symlink(cur, "long", std::string(3000, 'y'), Caller{}, &a), 0);
  ASSERT_EQ(r->fs->mknod(top, "fifo", S_IFIFO | 0600, 0, Caller{}, &a), 0);
  ASSERT_EQ(r->fs->setxattr(top, "user.dir", "x", 1, 0), 0);
  ASSERT_EQ(r->fs->setxattr(top, "trusted.t", std::string(900, 'v').data(), 900, 0), 0);
  // Fragmented: every other block, 600 extents -> an extent tree of depth 1.
  const Ino frag = r->create(kRootInode, "frag");
  for (uint32_t i = 0; i < 600; ++i)
    ASSERT_EQ(r->write(frag, uint64_t{i} * 2 * 4096, pattern(i, 0, 4096)), 0);
  // Sparse, fallocated (unwritten), truncated.
  const Ino sparse = r->create(top, "sparse");
  ASSERT_EQ(r->write(sparse, 3ull << 30, "far"), 0);
  ASSERT_EQ(r->fs->fallocate(sparse, 0, 1 << 20, 1 << 20), 0);
  ASSERT_EQ(r->fs->fallocate(sparse, FALLOC_FL_KEEP_SIZE, 4ull << 30, 1 << 16), 0);
  const Ino trunc = r->create(top, "trunc");
  ASSERT_EQ(r->write(trunc, 0, pattern(5, 0, 300000)), 0);
  SetAttr s;
  s.size = true;
  s.new_size = 12345;
  ASSERT_EQ(r->fs->setattr(trunc, s, &a), 0);
  // Renames across directories, a hard link, removals.
  ASSERT_EQ(r->fs->rename(kRootInode, "frag", top, "frag-moved", 0), 0);
  ASSERT_EQ(r->fs->rename(kRootInode, "d", top, "d-moved", 0), 0);
  ASSERT_EQ(r->fs->link(trunc, many, "trunc-link", &a), 0);
  ASSERT_EQ(r->fs->rmdir(cur, "nothing"), ENOENT);
  ASSERT_EQ(r->fs->unlink(kRootInode, "c2"), 0);
  unmount(*r);

  const uint64_t writes = r->stack->device_writes();
  const auto t0 = std::chrono::steady_clock::now();
  const FsckRun run = run_fsck(*r->dev, false);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(run.r.exit_code, kFsckClean) << run.text;
  EXPECT_EQ(run.text, "");
  EXPECT_GT(run.r.inodes_used, 1000u);
  EXPECT_EQ(run.r.directories, 11u);  // root, d, sub, top, level0-5, many
  const FsckRun y = run_fsck(*r->dev, true);
  EXPECT_EQ(y.r.exit_code, kFsckClean) << y.text;
  EXPECT_EQ(r->stack->device_writes(), writes);
  EXPECT_LT(ms, 2000) << "fsck of a small filesystem took " << ms << " ms";
  ASSERT_TRUE(r->mount());
}

TEST(Fsck, DepthTwoExtentTreeIsClean) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "frag2");
  // 8 * 254 extents fill a depth-1 tree: one more needs depth 2.
  for (uint32_t i = 0; i < 2100; ++i)
    ASSERT_EQ(r->write(f, uint64_t{i} * 2 * 4096, pattern(i, 0, 512)), 0);
  unmount(*r);
  const FsckRun run = run_fsck(*r->dev, false);
  EXPECT_EQ(run.r.exit_code, kFsckClean) << run.text;
  Raw raw(*r->dev);
  EXPECT_EQ(raw.inode(f).tree_depth, 2u);
}

// --- planted corruptions -----------------------------------------------------------------

TEST(FsckRepair, BadPrimarySuperblockUsesTheBackup) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  auto b = raw.get(0);
  b[130] ^= 1;  // inside the label: the checksum catches it
  raw.put(0, b.data());
  found_repaired_clean(*r, {"superblock (block 0): checksum mismatch; using the backup at block " +
                            std::to_string(raw.sb.block_count - 1)});
  EXPECT_EQ(r->read(t.a, 0, 4096), t.a_data);
  unmount(*r);
  EXPECT_EQ(raw.get(0), raw.get(raw.sb.block_count - 1)) << "the primary is the backup again";
}

TEST(FsckRepair, BadGroupDescriptorChecksum) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  GroupDesc d = raw.gd(0);
  d.used_dirs += 7;
  raw.put_gd(0, d, /*fix=*/false);
  found_repaired_clean(*r, {"group 0: descriptor checksum mismatch"});
  EXPECT_EQ(raw.gd(0).used_dirs, 3u);
}

TEST(FsckRepair, BlockBitmapBitFlippedBothWays) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  const uint64_t used = raw.inode(t.a).root.extents[0].physical;
  ASSERT_TRUE(raw.block_bit(used));
  uint64_t unused = used + 1000;
  while (raw.block_bit(unused)) ++unused;
  raw.flip_block_bit(used);
  raw.flip_block_bit(unused);
  found_repaired_clean(
      *r,
      {"block " + std::to_string(used) + ": in use, but marked free in the block bitmap of group 0",
       "block " + std::to_string(unused) +
           ": marked in use in the block bitmap of group 0, but owned by nothing"});
  EXPECT_EQ(r->read(t.a, 0, 4096), t.a_data);
  unmount(*r);
  EXPECT_TRUE(raw.block_bit(used));
  EXPECT_FALSE(raw.block_bit(unused));
}

TEST(FsckRepair, InodeBitmapBitSetForAFreeInode) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  raw.allocate_inode_bit(40);  // the counts agree with the bitmap; the inode is free
  found_repaired_clean(*r, {"inode 40: marked in use in the inode bitmap of group 0, but free"});
}

TEST(FsckRepair, WrongFreeCountsInADescriptor) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  GroupDesc d = raw.gd(0);
  const uint32_t right = d.free_blocks;
  d.free_blocks += 3;
  d.free_inodes -= 1;
  raw.put_gd(0, d);
  found_repaired_clean(*r, {"group 0: descriptor says " + std::to_string(right + 3) +
                                " free blocks, but its bitmap has " + std::to_string(right),
                            "free inodes"});
  EXPECT_EQ(raw.gd(0).free_blocks, right);
}

TEST(FsckRepair, InodeWithABadChecksumIsClearedWithItsEntries) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  Inode d = raw.inode(t.b);
  d.uid ^= 1;
  raw.put_inode(t.b, d, /*fix=*/false);
  const std::string ino = std::to_string(t.b);
  found_repaired_clean(*r, {"inode " + ino + ": checksum mismatch",
                            "directory 1: entry 'b' names inode " + ino + ", which is corrupt"});
  EXPECT_EQ(r->lookup(kRootInode, "b"), ENOENT);
  EXPECT_EQ(r->lookup(t.dir, "a"), 0);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, EntryNamingAFreeInodeIsRemoved) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  const uint64_t leaf = raw.leaf_of(kRootInode, "b");
  auto v = raw.leaf(leaf);
  for (auto& e : v) {
    if (e.name == "b") e.ino = 77;  // a free inode
  }
  raw.put_leaf(leaf, kRootInode, v);
  // "b" loses its only name: it is unreachable, and goes to /lost+found.
  found_repaired_clean(*r, {"directory 1: entry 'b' names free inode 77",
                            "inode " + std::to_string(t.b) +
                                ": unreachable (links 1, no directory entry names it)"});
  EXPECT_EQ(r->lookup(kRootInode, "b"), ENOENT);
  Ino lf = 0;
  ASSERT_EQ(r->lookup(kRootInode, "lost+found", &lf), 0);
  Ino b = 0;
  ASSERT_EQ(r->lookup(lf, "#" + std::to_string(t.b), &b), 0);
  EXPECT_EQ(b, t.b);
  EXPECT_EQ(r->read(b, 0, 4096), t.b_data);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, WrongLinkCount) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  Inode d = raw.inode(t.a);
  d.links = 2;
  raw.put_inode(t.a, d);
  Inode s = raw.inode(t.sub);
  s.links = 5;
  raw.put_inode(t.sub, s);
  found_repaired_clean(
      *r, {"inode " + std::to_string(t.a) + ": link count 2, but 1 directory entry names it",
           "directory " + std::to_string(t.sub) +
               ": link count 5, but it has 0 subdirectories (expected 2)"});
  Attr a;
  ASSERT_EQ(r->fs->getattr(t.a, &a), 0);
  EXPECT_EQ(a.nlink, 1u);
}

TEST(FsckRepair, UnreachableInodeGoesToLostAndFound) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  const uint64_t ino = 30;
  ASSERT_EQ(raw.inode(ino).mode, 0u);
  Inode d{};
  d.mode = S_IFREG | 0640;
  d.links = 1;
  d.generation = 3;
  raw.put_inode(ino, d);
  raw.allocate_inode_bit(ino);
  found_repaired_clean(*r, {"inode 30: unreachable (links 1, no directory entry names it)"});
  Ino lf = 0, got = 0;
  ASSERT_EQ(r->lookup(kRootInode, "lost+found", &lf), 0);
  ASSERT_EQ(r->lookup(lf, "#30", &got), 0);
  EXPECT_EQ(got, ino);
  Attr a;
  ASSERT_EQ(r->fs->getattr(kRootInode, &a), 0);
  EXPECT_EQ(a.nlink, 4u) << "root: d and lost+found";
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, UnreachableDirectoryLoopIsConnected) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  const Ino x = r->mkdir(t.dir, "x");
  const Ino y = r->mkdir(x, "y");
  const Ino f = r->create(y, "inside");
  unmount(*r);
  Raw raw(*r->dev);
  // Cut "x" out of d and make y name x: x -> y -> x, reachable from nowhere.
  const uint64_t dleaf = raw.leaf_of(t.dir, "x");
  auto v = raw.leaf(dleaf);
  std::erase_if(v, [](const Raw::Entry& e) { return e.name == "x"; });
  raw.put_leaf(dleaf, t.dir, v);
  const uint64_t yleaf = raw.leaf_of(y, "inside");
  auto w = raw.leaf(yleaf);
  const std::string nm = "back";
  w.push_back(Raw::Entry{name_hash(nm.data(), nm.size(), raw.inode(y).dir_seed), x, 4, nm});
  std::sort(w.begin(), w.end(), [](const auto& a, const auto& b) { return a.hash < b.hash; });
  raw.put_leaf(yleaf, y, w);
  Inode dd = raw.inode(t.dir);
  dd.links -= 1;
  raw.put_inode(t.dir, dd);
  Inode xi = raw.inode(x);
  xi.parent = y;
  raw.put_inode(x, xi);
  Inode yi = raw.inode(y);
  yi.links += 1;
  raw.put_inode(y, yi);
  found_repaired_clean(*r, {"unreachable (in a directory loop)"});
  EXPECT_EQ(r->lookup(y, "inside"), 0);
  EXPECT_EQ(r->check_and_remount(), "");
  (void)f;
}

// Without kFeatureSharedBlocks (with it two files may share a block: fsck_shared_test.cc).
TEST(FsckRepair, BlockOwnedByTwoInodesIsCopied) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  raw.sb.features &= ~uint32_t{kFeatureSharedBlocks};
  raw.put_sb();
  raw.put(raw.sb.block_count - 1, raw.get(0).data());  // the backup says the same
  const uint64_t shared = raw.inode(t.a).root.extents[0].physical;
  Inode b = raw.inode(t.b);
  const uint64_t lost = b.root.extents[0].physical;
  b.root.extents[0].physical = shared;
  raw.put_inode(t.b, b);
  const uint64_t lo = std::min(t.a, t.b), hi = std::max(t.a, t.b);
  found_repaired_clean(*r, {"block " + std::to_string(shared) + ": owned by inode " +
                                std::to_string(lo) + " and inode " + std::to_string(hi),
                            "block " + std::to_string(lost) + ": marked in use"});
  // The later owner got a copy: both read what `a` held, and they no longer share.
  EXPECT_EQ(r->read(t.a, 0, 4096), t.a_data);
  EXPECT_EQ(r->read(t.b, 0, 4096), t.a_data);
  unmount(*r);
  EXPECT_NE(raw.inode(t.a).root.extents[0].physical, raw.inode(t.b).root.extents[0].physical);
  EXPECT_EQ(run_fsck(*r->dev, false).r.exit_code, kFsckClean);
}

TEST(FsckRepair, DirectoryLeafWithABadChecksumIsRebuilt) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  const uint64_t leaf = raw.leaf_of(t.dir, "c");
  auto b = raw.get(leaf);
  // Damage the name "c": its entry no longer matches its hash; the others survive.
  bool done = false;
  size_t off = sizeof(DirLeafHeader);
  for (const auto& e : raw.leaf(leaf)) {
    if (e.name == "c") {
      b[off + sizeof(DirEntryHeader)] = 'q';
      done = true;
    }
    off += (sizeof(DirEntryHeader) + e.name.size() + 7) & ~size_t{7};
  }
  ASSERT_TRUE(done);
  raw.put(leaf, b.data());
  found_repaired_clean(*r, {"directory " + std::to_string(t.dir) + ": leaf block " +
                            std::to_string(leaf) + " (directory block 1): checksum mismatch"});
  EXPECT_EQ(r->lookup(t.dir, "a"), 0);
  EXPECT_EQ(r->lookup(t.dir, "sub"), 0);
  EXPECT_EQ(r->lookup(t.dir, "s"), 0);
  EXPECT_EQ(r->lookup(t.dir, "c"), ENOENT);
  EXPECT_EQ(r->lookup(kRootInode, "c2"), 0) << "c keeps its other name";
  Attr a;
  ASSERT_EQ(r->fs->getattr(t.c, &a), 0);
  EXPECT_EQ(a.nlink, 1u);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, ExtentOutsideTheDeviceIsRemoved) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  Inode d = raw.inode(t.a);
  const uint64_t old = d.root.extents[0].physical;
  d.root.extents[0].physical = raw.sb.block_count + 100;
  raw.put_inode(t.a, d);
  found_repaired_clean(
      *r, {"inode " + std::to_string(t.a) + ": extent (logical 0, 1 block at " +
               std::to_string(raw.sb.block_count + 100) + ") lies outside the filesystem",
           "block " + std::to_string(old) + ": marked in use"});
  EXPECT_EQ(r->read(t.a, 0, 8), std::string(8, '\0')) << "a hole now";
  Attr a;
  ASSERT_EQ(r->fs->getattr(t.a, &a), 0);
  EXPECT_EQ(a.blocks, 0u);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, XattrBlockWithABadChecksumIsDetached) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  const uint64_t xb = raw.inode(t.c).xattr_block;
  ASSERT_NE(xb, 0u);
  auto b = raw.get(xb);
  b[40] ^= 0x55;
  raw.put(xb, b.data());
  found_repaired_clean(*r, {"inode " + std::to_string(t.c) + ": xattr block " + std::to_string(xb) +
                            ": checksum mismatch"});
  std::string v;
  EXPECT_EQ(r->fs->getxattr(t.c, "user.color", &v), ENODATA);
}

// --- xattr chains and value blocks ---------------------------------------------------------

// A file with `n` small attributes (a chain of several blocks) and two 10000-byte values
// (three value blocks each), unmounted; its inode.
Ino xattr_file(Rig& r, int n) {
  const Ino f = r.create(kRootInode, "xa");
  for (int i = 0; i < n; ++i) {
    const std::string k = "user.k" + std::to_string(10000 + i), v = "val" + std::to_string(i);
    EXPECT_EQ(r.fs->setxattr(f, k, v.data(), v.size(), 0), 0);
  }
  for (const char* k : {"user.big1", "user.big2"}) {
    const std::string v(10000, k[8]);
    EXPECT_EQ(r.fs->setxattr(f, k, v.data(), v.size(), 0), 0);
  }
  unmount(r);
  return f;
}
std::vector<uint64_t> xattr_chain(Raw& raw, Ino f) {
  std::vector<uint64_t> out;
  for (uint64_t b = raw.inode(f).xattr_block; b != 0 && out.size() < 100;) {
    out.push_back(b);
    XattrHeader h;
    std::memcpy(&h, raw.get(b).data(), sizeof h);
    b = h.next;
  }
  return out;
}
void put_header_block(Raw& raw, uint64_t b, std::vector<uint8_t>& data) {
  const uint64_t sum = block_checksum(data.data(), kHeaderChecksumOffset, raw.seed());
  std::memcpy(data.data() + kHeaderChecksumOffset, &sum, 8);
  raw.put(b, data.data());
}
// Calls fn(block, its data, entry offset, entry header) for every entry of `ino`'s chain.
template <typename F>
void each_raw_entry(Raw& raw, Ino ino, F fn) {
  for (uint64_t cb : xattr_chain(raw, ino)) {
    std::vector<uint8_t> b = raw.get(cb);
    XattrHeader h;
    std::memcpy(&h, b.data(), sizeof h);
    size_t off = sizeof h;
    for (uint16_t i = 0; i < h.count; ++i) {
      XattrEntryHeader e;
      std::memcpy(&e, b.data() + off, sizeof e);
      fn(cb, b, off, e);
      off += (sizeof e + e.name_len + e.value_len + 3) & ~size_t{3};
    }
  }
}

// Every listed attribute has the value xattr_file gave it; how many small ones are left.
size_t check_xattr_values(Rig& r, Ino f) {
  std::string names, v;
  EXPECT_EQ(r.fs->listxattr(f, &names), 0);
  std::set<std::string> seen;
  for (size_t at = 0; at < names.size();) {
    const std::string k = names.substr(at, names.find('\0', at) - at);
    at += k.size() + 1;
    EXPECT_TRUE(seen.insert(k).second) << k << " listed twice";
    EXPECT_EQ(r.fs->getxattr(f, k, &v), 0) << k;
    if (k.rfind("user.big", 0) == 0) {
      EXPECT_EQ(v, std::string(10000, k[8]));
    } else {
      EXPECT_EQ(v, "val" + std::to_string(std::stoi(k.substr(6)) - 10000)) << k;
    }
  }
  return seen.size() - seen.count("user.big1") - seen.count("user.big2");
}

TEST(FsckRepair, BadXattrChainBlockCutsTheChainThere) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = xattr_file(*r, 1500);
  Raw raw(*r->dev);
  const std::vector<uint64_t> chain = xattr_chain(raw, f);
  ASSERT_GE(chain.size(), 4u);
  auto b = raw.get(chain[2]);
  b[40] ^= 0x55;
  raw.put(chain[2], b.data());
  found_repaired_clean(*r, {"inode " + std::to_string(f) + ": xattr block " +
                            std::to_string(chain[2]) + ": checksum mismatch"});
  const size_t left = check_xattr_values(*r, f);
  EXPECT_GT(left, 100u) << "the blocks before the bad one are kept";
  EXPECT_LT(left, 1500u);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, XattrChainLoopIsCut) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = xattr_file(*r, 1500);
  Raw raw(*r->dev);
  const std::vector<uint64_t> chain = xattr_chain(raw, f);
  ASSERT_GE(chain.size(), 3u);
  auto b = raw.get(chain.back());
  XattrHeader h;
  std::memcpy(&h, b.data(), sizeof h);
  h.next = chain[1];
  std::memcpy(b.data(), &h, sizeof h);
  put_header_block(raw, chain.back(), b);
  found_repaired_clean(
      *r, {"xattr block " + std::to_string(chain[1]) + ": referenced twice (the chain loops)"});
  EXPECT_EQ(check_xattr_values(*r, f), 1500u) << "nothing lost";
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, BadXattrValueBlockDropsOnlyItsEntry) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = xattr_file(*r, 300);
  Raw raw(*r->dev);
  // big1's record: find its entry in the chain, and its second value block.
  uint64_t victim = 0;
  each_raw_entry(
      raw, f, [&](uint64_t, const std::vector<uint8_t>& b, size_t off, const XattrEntryHeader& e) {
        const std::string name(reinterpret_cast<const char*>(b.data() + off + 4), e.name_len);
        if (name == "big1" && (e.name_index & kXattrOutOfLine)) {
          std::memcpy(&victim, b.data() + off + 4 + e.name_len + 8 + 8, 8);
        }
      });
  ASSERT_NE(victim, 0u);
  auto vb = raw.get(victim);
  vb[100] ^= 1;
  raw.put(victim, vb.data());
  found_repaired_clean(
      *r, {"entry big1 has value block " + std::to_string(victim) + " with checksum mismatch"});
  std::string v;
  EXPECT_EQ(r->fs->getxattr(f, "user.big1", &v), ENODATA);
  EXPECT_EQ(r->fs->getxattr(f, "user.big2", &v), 0);
  EXPECT_EQ(check_xattr_values(*r, f), 300u) << "the small ones all stay";
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, XattrNameTwiceInAChainKeepsTheFirst) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = xattr_file(*r, 1000);
  Raw raw(*r->dev);
  const std::vector<uint64_t> chain = xattr_chain(raw, f);
  ASSERT_GE(chain.size(), 2u);
  // The first entry of the second block takes the name of the first block's first entry.
  auto first = raw.get(chain[0]), second = raw.get(chain[1]);
  const size_t name_at = sizeof(XattrHeader) + sizeof(XattrEntryHeader);
  XattrEntryHeader e0, e1;
  std::memcpy(&e0, first.data() + sizeof(XattrHeader), sizeof e0);
  std::memcpy(&e1, second.data() + sizeof(XattrHeader), sizeof e1);
  ASSERT_EQ(e0.name_len, e1.name_len);
  const std::string lost(reinterpret_cast<const char*>(second.data() + name_at), e1.name_len);
  std::memcpy(second.data() + name_at, first.data() + name_at, e0.name_len);
  put_header_block(raw, chain[1], second);
  found_repaired_clean(
      *r, {"xattr block " + std::to_string(chain[1]) + ": entry " +
           std::string(reinterpret_cast<const char*>(first.data() + name_at), e0.name_len) +
           " repeats a name"});
  std::string v;
  EXPECT_EQ(r->fs->getxattr(f, "user." + lost, &v), ENODATA);
  EXPECT_EQ(check_xattr_values(*r, f), 999u);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, XattrBlockCountIncludesChainAndValueBlocks) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = xattr_file(*r, 1000);
  Raw raw(*r->dev);
  Inode d = raw.inode(f);
  const uint64_t right = d.blocks;
  EXPECT_EQ(right, xattr_chain(raw, f).size() + 6);
  d.blocks = 1;
  raw.put_inode(f, d);
  found_repaired_clean(*r, {"blocks 1, but " + std::to_string(right) + " are allocated"});
  EXPECT_EQ(check_xattr_values(*r, f), 1000u);
}

TEST(FsckRepair, OutOfRangeTimeWithoutItsRecordIsClamped) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "old");
  const Ino g = r->create(kRootInode, "far");
  SetAttr s;
  s.mtime = true;
  s.new_mtime = TimeSpec{INT64_MAX, 5};
  Attr a;
  ASSERT_EQ(r->fs->setattr(g, s, &a), 0);
  ASSERT_EQ(r->fs->setxattr(g, "user.keep", "k", 1, 0), 0);
  unmount(*r);
  Raw raw(*r->dev);
  // f: a sentinel and no xattr block at all; g: its record's bytes damaged (the block's
  // checksum fixed up, so only the record is wrong).
  Inode d = raw.inode(f);
  d.atime_ns = kTimeBelow;
  raw.put_inode(f, d);
  bool found = false;
  each_raw_entry(raw, g,
                 [&](uint64_t xb, std::vector<uint8_t> b, size_t off, const XattrEntryHeader& e) {
                   if (e.name_index != kXattrInternal) return;
                   // mtime's seconds become 0: no longer out of range.
                   std::memset(b.data() + off + sizeof e + e.name_len + 16, 0, 8);
                   put_header_block(raw, xb, b);
                   found = true;
                 });
  ASSERT_TRUE(found);
  found_repaired_clean(
      *r, {"inode " + std::to_string(f) + ": atime is out of range but has no record of its value",
           "entry times holds a time that does not match",
           "inode " + std::to_string(g) + ": mtime is out of range"});
  ASSERT_EQ(r->fs->getattr(f, &a), 0);
  EXPECT_EQ(time_ns_from(a.atime), kTimeBelow + 1) << "the earliest time the field holds";
  ASSERT_EQ(r->fs->getattr(g, &a), 0);
  EXPECT_EQ(time_ns_from(a.mtime), kTimeAbove - 1);
  std::string v;
  EXPECT_EQ(r->fs->getxattr(g, "user.keep", &v), 0) << "the other attributes stay";
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, XattrChainAndValueBlocksSharedWithAFileAreCopied) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  // The data file comes first (lower inode): it keeps the shared blocks; the chain moves.
  const Ino data1 = r->create(kRootInode, "data1");
  const Ino data2 = r->create(kRootInode, "data2");
  ASSERT_EQ(r->write(data1, 0, "one"), 0);
  ASSERT_EQ(r->write(data2, 0, "two"), 0);
  const Ino f = xattr_file(*r, 1500);
  Raw raw(*r->dev);
  const std::vector<uint64_t> chain = xattr_chain(raw, f);
  ASSERT_GE(chain.size(), 3u);
  // data1's block becomes the chain's second block; data2's a value block of big1/big2.
  Inode d1 = raw.inode(data1);
  d1.root.extents[0].physical = chain[1];
  raw.put_inode(data1, d1);
  uint64_t value_block = 0;
  each_raw_entry(
      raw, f, [&](uint64_t, const std::vector<uint8_t>& b, size_t off, const XattrEntryHeader& e) {
        if (e.name_index & kXattrOutOfLine) {
          std::memcpy(&value_block, b.data() + off + 4 + e.name_len + 8, 8);
        }
      });
  ASSERT_NE(value_block, 0u);
  Inode d2 = raw.inode(data2);
  d2.root.extents[0].physical = value_block;
  raw.put_inode(data2, d2);
  found_repaired_clean(*r, {"block " + std::to_string(chain[1]) + ": owned by inode " +
                                std::to_string(data1) + " and inode " + std::to_string(f),
                            "block " + std::to_string(value_block) + ": owned by inode " +
                                std::to_string(data2) + " and inode " + std::to_string(f)});
  EXPECT_EQ(check_xattr_values(*r, f), 1500u) << "every attribute kept";
  std::string v;
  EXPECT_EQ(r->fs->getxattr(f, "user.big1", &v), 0);
  EXPECT_EQ(r->fs->getxattr(f, "user.big2", &v), 0);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, CorruptExtentTreeBlock) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "frag");
  for (uint32_t i = 0; i < 300; ++i)
    ASSERT_EQ(r->write(f, uint64_t{i} * 2 * 4096, pattern(i, 0, 4096)), 0);
  unmount(*r);
  Raw raw(*r->dev);
  const Inode d = raw.inode(f);
  ASSERT_EQ(d.tree_depth, 1u);
  ExtentIndex idx[8];
  std::memcpy(idx, d.root.extents, sizeof idx);
  const uint64_t leaf = idx[1].child;
  auto b = raw.get(leaf);
  b[100] ^= 1;
  raw.put(leaf, b.data());
  found_repaired_clean(*r, {"inode " + std::to_string(f) + ": extent tree block " +
                            std::to_string(leaf) + ": checksum mismatch"});
  EXPECT_EQ(r->read(f, 0, 4096), pattern(0, 0, 4096)) << "extents of the sound leaf survive";
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, OrphanListIsReportedAndFreed) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  // "b" unlinked while open when the daemon died: no name, links 0, on the list.
  const uint64_t leaf = raw.leaf_of(kRootInode, "b");
  auto v = raw.leaf(leaf);
  std::erase_if(v, [](const Raw::Entry& e) { return e.name == "b"; });
  raw.put_leaf(leaf, kRootInode, v);
  Inode d = raw.inode(t.b);
  d.links = 0;
  raw.put_inode(t.b, d);
  raw.sb.orphan_head = t.b;
  raw.put_sb();
  const uint64_t writes = r->stack->device_writes();
  const FsckRun a = run_fsck(*r->dev, false);
  EXPECT_EQ(a.r.exit_code, kFsckClean) << "an orphan list is not corruption:\n" << a.text;
  EXPECT_TRUE(a.has("orphan list: inode " + std::to_string(t.b))) << a.text;
  EXPECT_EQ(r->stack->device_writes(), writes);
  const FsckRun b = run_fsck(*r->dev, true);
  EXPECT_EQ(b.r.exit_code, kFsckCorrected) << b.text;
  EXPECT_TRUE(b.has("freed")) << b.text;
  const FsckRun c = run_fsck(*r->dev, false);
  EXPECT_EQ(c.r.exit_code, kFsckClean) << c.text;
  EXPECT_FALSE(c.has("orphan")) << c.text;
  Raw after(*r->dev);
  EXPECT_EQ(after.sb.orphan_head, 0u);
  EXPECT_EQ(after.inode(t.b).mode, 0u);
  ASSERT_TRUE(r->mount());
  Attr at;
  EXPECT_EQ(r->fs->getattr(t.b, &at), ENOENT);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckRepair, MalformedOrphanList) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  raw.sb.orphan_head = t.a;  // linked, links 1
  raw.put_sb();
  found_repaired_clean(*r, {"orphan list: inode " + std::to_string(t.a) + " has link count 1"});
  EXPECT_EQ(r->read(t.a, 0, 4096), t.a_data);
}

TEST(FsckRepair, AllocatedInodeWithNoLinksIsFreed) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  const uint64_t leaf = raw.leaf_of(kRootInode, "b");
  auto v = raw.leaf(leaf);
  std::erase_if(v, [](const Raw::Entry& e) { return e.name == "b"; });
  raw.put_leaf(leaf, kRootInode, v);
  Inode d = raw.inode(t.b);
  d.links = 0;
  raw.put_inode(t.b, d);
  found_repaired_clean(*r, {"inode " + std::to_string(t.b) +
                            ": link count 0, but it is neither reachable nor on the orphan list"});
  unmount(*r);
  EXPECT_EQ(raw.inode(t.b).mode, 0u);
}

// Writes a transaction at journal position `pos`: descriptor, blocks, and (if `commit`)
// the commit block with a correct data checksum. Returns the position after it.
uint64_t plant_transaction(Raw& raw, uint64_t pos, uint64_t seq,
                           const std::vector<std::pair<uint64_t, std::vector<uint8_t>>>& blocks,
                           bool commit) {
  auto next = [&](uint64_t p) { return p + 1 >= raw.sb.journal_blocks ? 1 : p + 1; };
  std::vector<uint8_t> all(kBlockSize * (blocks.size() + 1), 0);
  auto* d = reinterpret_cast<JournalDescriptor*>(all.data());
  d->magic = kJournalDescriptorMagic;
  d->count = static_cast<uint32_t>(blocks.size());
  d->seq = seq;
  for (size_t i = 0; i < blocks.size(); ++i) d->targets[i] = blocks[i].first;
  d->checksum = block_checksum(d, offsetof(JournalDescriptor, checksum), raw.seed());
  for (size_t i = 0; i < blocks.size(); ++i)
    std::memcpy(all.data() + (i + 1) * kBlockSize, blocks[i].second.data(), kBlockSize);
  uint64_t p = pos;
  for (size_t i = 0; i <= blocks.size(); ++i) {
    raw.put(1 + p, all.data() + i * kBlockSize);
    p = next(p);
  }
  if (commit) {
    JournalCommit c{};
    c.magic = kJournalCommitMagic;
    c.count = d->count;
    c.seq = seq;
    c.data_checksum = checksum(all.data(), all.size(), raw.seed());
    c.checksum = block_checksum(&c, offsetof(JournalCommit, checksum), raw.seed());
    raw.put(1 + p, &c);
  }
  return next(p);
}

TEST(FsckJournal, CommittedTransactionIsReplayedAndIncompleteOneIgnored) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  JournalHeader jh;
  ASSERT_TRUE(r->dev->read(1, 1, &jh).is_ok());
  // A crash after a commit: the superblock says dirty; the transaction sets a's uid.
  raw.sb.state = kStateDirty;
  raw.put_sb();
  const uint64_t home = raw.inode_block(t.a);
  const auto before = raw.get(home);
  auto block = before;
  Inode in;
  const size_t at = (t.a - 1) % kInodesPerBlock * kInodeSize;
  std::memcpy(&in, block.data() + at, sizeof in);
  in.uid = 4242;
  in.checksum = inode_checksum(in, t.a, raw.seed());
  std::memcpy(block.data() + at, &in, sizeof in);
  const uint64_t pos2 = plant_transaction(raw, jh.tail_block, jh.tail_seq, {{home, block}}, true);
  // The next one never got its commit: it must not be replayed.
  auto later = block;
  in.uid = 9999;
  in.checksum = inode_checksum(in, t.a, raw.seed());
  std::memcpy(later.data() + at, &in, sizeof in);
  plant_transaction(raw, pos2, jh.tail_seq + 1, {{home, later}}, false);

  const uint64_t writes = r->stack->device_writes();
  const FsckRun a = run_fsck(*r->dev, false);
  EXPECT_EQ(a.r.exit_code, kFsckClean) << "a crashed filesystem with a journal is not corrupt:\n"
                                       << a.text;
  EXPECT_TRUE(a.has("journal: 1 committed transaction (1 blocks)")) << a.text;
  EXPECT_EQ(a.r.journal_transactions, 1u);
  EXPECT_EQ(r->stack->device_writes(), writes);
  EXPECT_EQ(raw.get(home), before) << "check mode replays into memory only";
  const FsckRun b = run_fsck(*r->dev, true);
  EXPECT_EQ(b.r.exit_code, kFsckCorrected) << b.text;
  EXPECT_TRUE(b.has("journal: replayed 1 committed transaction")) << b.text;
  EXPECT_EQ(raw.inode(t.a).uid, 4242u);
  const FsckRun c = run_fsck(*r->dev, false);
  EXPECT_EQ(c.r.exit_code, kFsckClean) << c.text;
  EXPECT_EQ(c.text, "");
  Raw after(*r->dev);
  EXPECT_EQ(after.sb.state, kStateClean);
  ASSERT_TRUE(r->mount());
  Attr at2;
  ASSERT_EQ(r->fs->getattr(t.a, &at2), 0);
  EXPECT_EQ(at2.uid, 4242u);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(FsckJournal, CommittedTransactionOnACleanFilesystemIsAProblem) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  JournalHeader jh;
  ASSERT_TRUE(r->dev->read(1, 1, &jh).is_ok());
  const uint64_t home = raw.inode_block(t.b);
  plant_transaction(raw, jh.tail_block, jh.tail_seq, {{home, raw.get(home)}}, true);
  found_repaired_clean(*r, {"journal: 1 committed transaction (1 blocks) after the tail of a "
                            "cleanly unmounted filesystem"});
  // Discarding instead of replaying: also a repair.
  unmount(*r);
  ASSERT_TRUE(r->dev->read(1, 1, &jh).is_ok());
  plant_transaction(raw, jh.tail_block, jh.tail_seq, {{home, raw.get(home)}}, true);
  const FsckRun d = run_fsck(*r->dev, true, /*replay=*/false);
  EXPECT_EQ(d.r.exit_code, kFsckCorrected) << d.text;
  EXPECT_TRUE(d.has("discarded")) << d.text;
  EXPECT_EQ(run_fsck(*r->dev, false).r.exit_code, kFsckClean);
}

TEST(FsckJournal, BadJournalHeaderIsReset) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  populate_small(*r);
  unmount(*r);
  Raw raw(*r->dev);
  auto b = raw.get(1);
  b[20] ^= 0xff;
  raw.put(1, b.data());
  found_repaired_clean(*r, {"journal header (block 1): checksum mismatch"});
  EXPECT_EQ(r->check_and_remount(), "");
}

void walk_everything(Filesystem& fs, Ino dir, int depth = 0);

// The machine dies (as Rig::crash_and_remount, without the remount): the device keeps a
// random part of its volatile write cache.
void crash(Rig& r, double persist) {
  ASSERT_TRUE(r.power_cycle(persist));
}

// What a crash leaves (a dirty superblock, a committed transaction in the journal, inodes
// on the orphan list) is not corruption: check mode finds nothing wrong, repair replays and
// frees, and the filesystem mounts.
TEST(FsckJournal, CrashedFilesystemChecksClean) {
  const char* env = std::getenv("WARPFS_FSCK_CRASH_ROUNDS");
  const int rounds = env ? std::atoi(env) : 12;
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto r = Rig::make(32);
    ASSERT_TRUE(r);
    std::mt19937_64 rng(round);
    std::vector<std::pair<Ino, std::string>> live;  // (parent, name) of regular files
    std::vector<Ino> dirs{kRootInode, r->mkdir(kRootInode, "d")};
    const int ops = 100 + static_cast<int>(rng() % 400);
    for (int i = 0; i < ops; ++i) {
      const int op = static_cast<int>(rng() % 20);
      const Ino dir = dirs[rng() % dirs.size()];
      Ino ino = 0;
      size_t pick = 0;
      if (!live.empty()) {
        pick = rng() % live.size();
        if (r->lookup(live[pick].first, live[pick].second, &ino) != 0) {
          live.erase(live.begin() + static_cast<long>(pick));
          continue;
        }
      }
      Attr a;
      if (op < 5 || ino == 0) {
        const std::string name = "file-with-some-length-" + std::to_string(i);
        if (r->fs->mknod(dir, name, S_IFREG | 0644, 0, Caller{}, &a) == 0) {
          live.emplace_back(dir, name);
          r->fs->forget(a.ino, 1);
        }
      } else if (op < 8) {
        // Every other block: extents pile up into a tree.
        for (int k = 0; k < 1 + static_cast<int>(rng() % 20); ++k) {
          ASSERT_EQ(r->write(ino, (rng() % 64) * 8192, pattern(rng(), 0, 1 + rng() % 5000)), 0);
        }
      } else if (op < 9) {
        SetAttr st;
        st.size = true;
        st.new_size = rng() % 200000;
        ASSERT_EQ(r->fs->setattr(ino, st, &a), 0);
      } else if (op < 10) {
        r->fs->fallocate(ino, (rng() % 2) ? 0 : FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                         (rng() % 32) * 4096, (1 + rng() % 16) * 4096);
      } else if (op < 11) {
        const std::string name = "moved-" + std::to_string(i);
        if (r->fs->rename(live[pick].first, live[pick].second, dir, name, 0) == 0) {
          live[pick] = {dir, name};
        }
      } else if (op < 12) {
        const std::string name = "link-" + std::to_string(i);
        if (r->fs->link(ino, dir, name, &a) == 0) {
          live.emplace_back(dir, name);
          r->fs->forget(ino, 1);
        }
      } else if (op < 13) {
        // Unlinked while open: an orphan if the machine dies now.
        ASSERT_EQ(r->fs->open(ino, O_RDWR), 0);
        ASSERT_EQ(r->fs->unlink(live[pick].first, live[pick].second), 0);
        live.erase(live.begin() + static_cast<long>(pick));
      } else if (op < 14) {
        ASSERT_EQ(r->fs->unlink(live[pick].first, live[pick].second), 0);
        live.erase(live.begin() + static_cast<long>(pick));
      } else if (op < 15) {
        if (r->fs->mkdir(dir, "sub-" + std::to_string(i), 0755, Caller{}, &a) == 0) {
          dirs.push_back(a.ino);
          r->fs->forget(a.ino, 1);
        }
      } else if (op < 16 && dirs.size() > 2) {
        // An empty directory (if it is one) goes, or moves under another.
        const size_t k = 2 + rng() % (dirs.size() - 2);
        uint64_t off = 2;
        bool empty = true;
        r->fs->readdir(dirs[k], 0, [&](const DirEntry& e) {
          if (e.name != "." && e.name != "..") empty = false;
          off = e.next_offset;
          return empty;
        });
        std::string name;
        Ino parent = 0;
        for (Ino p : dirs) {
          r->fs->readdir(p, 0, [&](const DirEntry& e) {
            if (e.ino == dirs[k] && e.name != "." && e.name != "..") name = e.name, parent = p;
            return name.empty();
          });
          if (!name.empty()) break;
        }
        if (empty && !name.empty() && r->fs->rmdir(parent, name) == 0) {
          dirs.erase(dirs.begin() + static_cast<long>(k));
        } else if (!name.empty()) {
          r->fs->rename(parent, name, dirs[1], name + "-r", 0);
        }
      } else if (op < 17) {
        r->fs->setxattr(ino, "user.n" + std::to_string(rng() % 4), "value", 5, 0);
      } else if (op < 18) {
        ASSERT_EQ(r->fs->fsync(ino, false), 0);
      } else if (op < 19) {
        ASSERT_EQ(r->fs->sync(), 0);
      } else {
        for (int k = 0; k < 60; ++k) {  // a burst of names: leaves split
          if (r->fs->mknod(dirs[1], "burst-" + std::to_string(i) + "-" + std::to_string(k),
                           S_IFREG | 0600, 0, Caller{}, &a) == 0) {
            r->fs->forget(a.ino, 1);
          }
        }
      }
    }
    crash(*r, static_cast<double>(round % 3) / 2);
    Raw raw(*r->dev);
    EXPECT_EQ(raw.sb.state, kStateDirty);
    const uint64_t writes = r->stack->device_writes();
    const FsckRun a = run_fsck(*r->dev, false);
    EXPECT_EQ(a.r.exit_code, kFsckClean) << a.text;
    EXPECT_EQ(a.r.problems, 0u) << a.text;
    EXPECT_EQ(r->stack->device_writes(), writes);
    const FsckRun b = run_fsck(*r->dev, true);
    if (std::getenv("WARPFS_FSCK_TEST_VERBOSE"))
      std::printf("check:\n%srepair:\n%s", a.text.c_str(), b.text.c_str());
    EXPECT_EQ(b.r.problems, 0u) << b.text;
    EXPECT_EQ(b.r.exit_code, kFsckCorrected) << "the superblock is marked clean:\n" << b.text;
    const FsckRun c = run_fsck(*r->dev, false);
    EXPECT_EQ(c.r.exit_code, kFsckClean) << c.text;
    EXPECT_EQ(c.text, "");
    ASSERT_TRUE(r->mount()) << r->log;
    EXPECT_EQ(r->fs->stats().orphans_freed_at_mount, 0u) << "fsck freed them";
    walk_everything(*r->fs, kRootInode);
    EXPECT_EQ(r->check_and_remount(), "");
  }
}

// --- random damage -----------------------------------------------------------------------

// Walks the whole tree through the core: every directory listed, every file read.
void walk_everything(Filesystem& fs, Ino dir, int depth) {
  std::vector<DirEntry> v;
  ASSERT_EQ(fs.readdir(dir, 0,
                       [&](const DirEntry& e) {
                         v.push_back(e);
                         return true;
                       }),
            0);
  for (const DirEntry& e : v) {
    if (e.name == "." || e.name == "..") continue;
    Attr a;
    ASSERT_EQ(fs.lookup(dir, e.name, &a), 0) << e.name;
    if (S_ISDIR(a.mode) && depth < 16) walk_everything(fs, a.ino, depth + 1);
    if (S_ISREG(a.mode)) {
      std::string buf(std::min<uint64_t>(a.size, 1 << 16), '\0');
      size_t got;
      EXPECT_EQ(fs.read(a.ino, 0, buf.size(), buf.data(), &got), 0) << e.name;
    }
    if (S_ISLNK(a.mode)) {
      std::string t;
      EXPECT_EQ(fs.readlink(a.ino, &t), 0) << e.name;
    }
    fs.forget(a.ino, 1);
  }
}

// What a fuzz round may damage.
enum class Damage { kInodes, kHeader, kGdt, kBitmap, kSuper, kJournalHeader };
using Targets = std::vector<std::pair<uint64_t, Damage>>;

// The metadata blocks of an unmounted filesystem: descriptors, bitmaps and inode tables of
// group 0, the superblock and journal header, and every directory, extent-tree and xattr
// block of the first `inodes` inodes.
Targets metadata_targets(Raw& raw, uint64_t inodes) {
  Targets t;
  const GroupDesc g0 = raw.gd(0);
  t.emplace_back(0, Damage::kSuper);
  t.emplace_back(1, Damage::kJournalHeader);
  t.emplace_back(raw.sb.gdt_start, Damage::kGdt);
  t.emplace_back(g0.block_bitmap, Damage::kBitmap);
  t.emplace_back(g0.inode_bitmap, Damage::kBitmap);
  for (uint64_t b = 0; b < (inodes + kInodesPerBlock - 1) / kInodesPerBlock; ++b) {
    t.emplace_back(g0.inode_table + b, Damage::kInodes);
  }
  auto add_tree = [&](uint64_t block, auto&& self) -> void {
    t.emplace_back(block, Damage::kHeader);
    auto b = raw.get(block);
    ExtentNodeHeader h;
    std::memcpy(&h, b.data(), sizeof h);
    for (uint16_t i = 0; h.depth > 0 && i < h.count; ++i) {
      ExtentIndex x;
      std::memcpy(&x, b.data() + sizeof h + i * sizeof x, sizeof x);
      self(x.child, self);
    }
  };
  for (uint64_t ino = 1; ino <= inodes; ++ino) {
    const Inode d = raw.inode(ino);
    if (d.mode == 0) continue;
    if (d.xattr_block) t.emplace_back(d.xattr_block, Damage::kHeader);
    for (uint32_t i = 0; i < d.extent_count && i < 8; ++i) {
      if (d.tree_depth > 0) {
        ExtentIndex x;
        std::memcpy(&x, &d.root.extents[i], sizeof x);
        add_tree(x.child, add_tree);
      } else if (S_ISDIR(d.mode)) {
        for (uint32_t k = 0; k < d.root.extents[i].blocks(); ++k) {
          t.emplace_back(d.root.extents[i].physical + k, Damage::kHeader);
        }
      }
    }
  }
  return t;
}

// Flips one random bit of `blk`; with `fix`, makes its checksum valid again.
void damage(Raw& raw, std::mt19937_64& rng, uint64_t blk, Damage kind, bool fix) {
  auto b = raw.get(blk);
  auto flip = [&](size_t bits) {
    const size_t bit = rng() % bits;
    b[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  };
  const GroupDesc g0 = raw.gd(0);
  switch (kind) {
    case Damage::kInodes: {
      const size_t slot = rng() % kInodesPerBlock;
      const size_t bit = rng() % (248 * 8);  // not the checksum itself
      b[slot * kInodeSize + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      if (fix) {
        Inode d;
        std::memcpy(&d, b.data() + slot * kInodeSize, sizeof d);
        d.checksum =
            inode_checksum(d, (blk - g0.inode_table) * kInodesPerBlock + slot + 1, raw.seed());
        std::memcpy(b.data() + slot * kInodeSize, &d, sizeof d);
      }
      raw.put(blk, b.data());
      return;
    }
    case Damage::kHeader:
      flip(rng() % 2 == 0 ? 512 * 8 : kBlockSize * 8);  // headers and first entries, more often
      if (fix) raw.fix_header(b);
      raw.put(blk, b.data());
      return;
    case Damage::kGdt:
      flip(56 * 8);
      raw.put(blk, b.data());
      if (fix) raw.put_gd(0, raw.gd(0));
      return;
    case Damage::kBitmap: {
      flip(kBlockSize * 8);
      raw.put(blk, b.data());
      if (!fix) return;
      GroupDesc d = raw.gd(0);
      (blk == d.block_bitmap ? d.block_bitmap_checksum : d.inode_bitmap_checksum) =
          checksum(b.data(), kBlockSize, raw.seed());
      raw.put_gd(0, d);
      return;
    }
    case Damage::kSuper: {
      // The dynamic fields (counts, orphan head, state, times, journal_seq) or anything.
      const size_t bit = rng() % 2 == 0 ? 56 * 8 + rng() % (168 * 8) : rng() % (4088 * 8);
      b[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      Superblock sb;
      std::memcpy(&sb, b.data(), sizeof sb);
      if (fix) sb.checksum = superblock_checksum(sb);
      raw.put(0, &sb);
      return;
    }
    case Damage::kJournalHeader:
      flip(32 * 8);
      if (fix) {
        const uint64_t c = block_checksum(b.data(), offsetof(JournalHeader, checksum), raw.seed());
        std::memcpy(b.data() + offsetof(JournalHeader, checksum), &c, 8);
      }
      raw.put(blk, b.data());
      return;
  }
}

// Rounds of random damage to the unmounted filesystem of `r` (restored between rounds):
// whatever fsck finds, check mode and repair mode agree on it, one repair leaves a
// filesystem that checks clean, mounts, can be walked completely, takes new files, and
// still checks clean after the core used it.
void fuzz(Rig& r, const Targets& targets, int rounds, int max_damage) {
  Raw raw(*r.dev);
  const uint64_t nblocks = raw.sb.block_count;
  std::vector<uint8_t> image(nblocks * kBlockSize);
  ASSERT_TRUE(r.dev->read(0, static_cast<uint32_t>(nblocks), image.data()).is_ok());
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_TRUE(r.dev->write(0, static_cast<uint32_t>(nblocks), image.data()).is_ok());
    std::mt19937_64 rng(round);
    const int n = 1 + static_cast<int>(rng() % max_damage);
    for (int k = 0; k < n; ++k) {
      const auto [blk, kind] = targets[rng() % targets.size()];
      damage(raw, rng, blk, kind, rng() % 3 != 0);
    }
    const FsckRun a = run_fsck(*r.dev, false);
    EXPECT_TRUE(a.r.exit_code == kFsckClean || a.r.exit_code == kFsckUncorrected) << a.text;
    const FsckRun b = run_fsck(*r.dev, true);
    EXPECT_TRUE(b.r.exit_code == kFsckClean || b.r.exit_code == kFsckCorrected) << b.text;
    EXPECT_EQ(a.r.problems, b.r.problems) << "check:\n" << a.text << "repair:\n" << b.text;
    const FsckRun c = run_fsck(*r.dev, false);
    ASSERT_EQ(c.r.exit_code, kFsckClean) << "after repair:\n"
                                         << c.text << "repair said:\n"
                                         << b.text;
    if (std::getenv("WARPFS_FSCK_TEST_VERBOSE"))
      std::printf("round %d:\n%s", round, b.text.c_str());
    ASSERT_TRUE(r.mount()) << r.log << "repair said:\n" << b.text;
    walk_everything(*r.fs, kRootInode);
    Attr at;
    if (r.fs->mknod(kRootInode, "new-after-repair", S_IFREG | 0644, 0, Caller{}, &at) == 0) {
      EXPECT_EQ(r.write(at.ino, 0, pattern(round, 0, 9000)), 0);
      r.fs->forget(at.ino, 1);
    }
    EXPECT_EQ(r.check_and_remount(), "") << "repair said:\n" << b.text;
    unmount(r);
  }
}

int fuzz_rounds(int dflt) {
  const char* env = std::getenv("WARPFS_FSCK_FUZZ_ROUNDS");
  return env ? std::atoi(env) : dflt;
}

TEST(FsckFuzz, RandomMetadataDamageIsRepairedInOneRun) {
  auto r = Rig::make(16);
  ASSERT_TRUE(r);
  const Tree t = populate_small(*r);
  std::vector<Ino> dirs{kRootInode, t.dir, t.sub};
  for (int i = 0; i < 4; ++i)
    dirs.push_back(r->mkdir(dirs[i % dirs.size()], "x" + std::to_string(i)));
  for (int i = 0; i < 300; ++i) {
    const Ino f = r->create(dirs[i % dirs.size()], "f" + std::to_string(i));
    if (i % 7 == 0) {
      ASSERT_EQ(r->write(f, 0, pattern(i, 0, 1 + i * 97)), 0);
    }
    if (i % 50 == 0) {
      ASSERT_EQ(r->fs->setxattr(f, "user.k", "v", 1, 0), 0);
    }
    r->fs->forget(f, 1);
  }
  const Ino frag = r->create(kRootInode, "frag");
  for (uint32_t i = 0; i < 40; ++i)
    ASSERT_EQ(r->write(frag, uint64_t{i} * 2 * 4096, pattern(i, 0, 100)), 0);
  unmount(*r);
  ASSERT_EQ(run_fsck(*r->dev, false).r.exit_code, kFsckClean);
  Raw raw(*r->dev);
  fuzz(*r, metadata_targets(raw, 400), fuzz_rounds(60), 4);
}

TEST(FsckFuzz, DeepTreesAndBigDirectories) {
  MkfsOptions mo;
  mo.inodes = 16384;
  auto r = Rig::make(64, mo);
  ASSERT_TRUE(r);
  const Ino big = r->mkdir(kRootInode, "big");
  for (int i = 0; i < 12000; ++i) {  // more than 254 leaves: a depth-2 index
    Attr a;
    ASSERT_EQ(r->fs->mknod(big, "a-rather-long-file-name-to-fill-leaves-" + std::to_string(i),
                           S_IFREG | 0600, 0, Caller{}, &a),
              0);
    r->fs->forget(a.ino, 1);
  }
  const Ino frag = r->create(kRootInode, "frag");
  for (uint32_t i = 0; i < 2100; ++i)
    ASSERT_EQ(r->write(frag, uint64_t{i} * 2 * 4096, pattern(i, 0, 64)), 0);
  unmount(*r);
  Raw raw(*r->dev);
  ASSERT_EQ(raw.inode(frag).tree_depth, 2u);
  auto root = raw.get(raw.dir_block(big, 0));
  DirIndexHeader h;
  std::memcpy(&h, root.data(), sizeof h);
  ASSERT_EQ(h.depth, 2);
  ASSERT_EQ(run_fsck(*r->dev, false).r.exit_code, kFsckClean);
  // Only the big directory's and the fragmented file's blocks, and the fixed metadata.
  Targets t;
  for (const auto& x : metadata_targets(raw, 3)) t.push_back(x);
  t.emplace_back(raw.inode_block(frag), Damage::kInodes);
  fuzz(*r, t, fuzz_rounds(6), 3);
}

// Regression: a core bug fsck found, fixed by 33a4e38 (fs/src/dir.cc, FsImpl::dir_add, depth 1 -> 2
// conversion): grow() allocates block `a`, maps it and bumps the directory's size in memory; when
// the second grow() then fails with ENOSPC, dir_add returns without undoing or storing that, and
// the transaction commits the bitmap bit. Right after: "block N: marked in use ..., but owned by
// nothing". Once anything stores the directory (an unlink here), its size covers the zeroed
// block: "directory D: directory block 255 not referenced by the index".
TEST(FsckCoreBugs, DirectoryIndexConversionAtEnospc) {
  auto r = Rig::make(16);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  const Ino big = r->mkdir(kRootInode, "big");
  const std::string stem = "a-name-long-enough-to-fill-leaves-quickly-";
  int i = 0;
  Attr a;
  // Hard links (no inodes needed) until the root index holds 254 leaves: it is full.
  while (r->size(big) < 255 * 4096ull) {
    ASSERT_EQ(r->fs->link(f, big, stem + std::to_string(i++), &a), 0);
    r->fs->forget(f, 1);
  }
  // Fill the disk, then give one block back.
  const Ino fill = r->create(kRootInode, "fill");
  uint64_t off = 0;
  while (r->write(fill, off, std::string(1 << 20, 'z')) == 0) off += 1 << 20;
  ASSERT_EQ(r->fs->sync(), 0);
  SetAttr s;
  s.size = true;
  s.new_size = r->size(fill) / 4096 * 4096 - 4096;
  ASSERT_EQ(r->fs->setattr(fill, s, &a), 0);
  ASSERT_EQ(r->fs->sync(), 0);
  int rc = 0;
  while ((rc = r->fs->link(f, big, stem + std::to_string(i++), &a)) == 0) r->fs->forget(f, 1);
  EXPECT_EQ(rc, ENOSPC);
  ASSERT_EQ(r->fs->unlink(big, stem + "5"), 0);  // stores `big`
  EXPECT_EQ(r->check_and_remount(), "");
}

// Regression: a core bug fsck found, fixed by 33a4e38 (fs/src/file.cc, FsImpl::write_locked): a 9th
// extent needs a data block and an extent-tree leaf. With one block free the data block is
// allocated and written, then map_store() fails with ENOSPC before the inode is stored; write()
// still reports the byte written (a short write), and the transaction commits the bitmap bit. After
// remount the byte is gone and fsck finds "block N: marked in use ..., but owned by nothing" (the
// in-memory mapping, size and blocks of the inode also diverge from the disk until then).
TEST(FsckCoreBugs, ExtentTreeGrowthAtEnospc) {
  auto r = Rig::make(16);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  for (int k = 0; k < 8; ++k) ASSERT_EQ(r->write(f, uint64_t(k) * 2 * 4096, "x"), 0);
  Attr a;
  const Ino fill = r->create(kRootInode, "fill");
  uint64_t off = 0;
  while (r->write(fill, off, std::string(1 << 20, 'z')) == 0) off += 1 << 20;
  ASSERT_EQ(r->fs->sync(), 0);
  SetAttr s;
  s.size = true;
  s.new_size = r->size(fill) / 4096 * 4096 - 4096;
  ASSERT_EQ(r->fs->setattr(fill, s, &a), 0);
  ASSERT_EQ(r->fs->sync(), 0);
  const int rc = r->write(f, 100 * 4096, "y");  // a data block and a leaf block
  EXPECT_EQ(r->check_and_remount(), "");
  if (rc == 0) {
    EXPECT_EQ(r->read(f, 100 * 4096, 1), "y") << "write() said it was written";
  }
}

// --- scale -------------------------------------------------------------------------------

// A 1 GiB filesystem with many files checks in well under the target (seconds for 100k).
TEST(FsckScale, ManyFilesCheckQuickly) {
  MkfsOptions mo;
  mo.inodes = 131072;
  auto r = Rig::make(1024, mo);
  ASSERT_TRUE(r);
  const char* env = std::getenv("WARPFS_FSCK_SCALE_FILES");
  const int files = env ? std::atoi(env) : 20000;
  std::vector<Ino> dirs;
  for (int d = 0; d < 20; ++d) dirs.push_back(r->mkdir(kRootInode, "dir" + std::to_string(d)));
  for (int i = 0; i < files; ++i) {
    Attr a;
    ASSERT_EQ(r->fs->mknod(dirs[i % dirs.size()], "file-" + std::to_string(i), S_IFREG | 0644, 0,
                           Caller{}, &a),
              0);
    if (i % 16 == 0) {
      size_t w;
      ASSERT_EQ(r->fs->write(a.ino, 0, 5000, pattern(i, 0, 5000).data(), &w), 0);
    }
    r->fs->forget(a.ino, 1);
  }
  unmount(*r);
  const auto t0 = std::chrono::steady_clock::now();
  const FsckRun run = run_fsck(*r->dev, false);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(run.r.exit_code, kFsckClean) << run.text;
  EXPECT_EQ(run.r.inodes_used, uint64_t(files) + 21);
  std::printf("fsck of %d files on 1 GiB: %.3f s\n", files, s);
  EXPECT_LT(s, 5.0);
}

// --- the program -------------------------------------------------------------------------

#ifdef WARPFS_FSCK_BIN
int run_tool(const std::string& cmd, std::string* out) {
  return run_command(cmd, out);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(FsckProgram, ExitCodesAndCheckModeWritesNothing) {
  char dir[] = "/tmp/warpfs-fsck-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string img = std::string(dir) + "/a.img";
  const std::string fsck_bin = WARPFS_FSCK_BIN;
  std::string out;
  ASSERT_EQ(run_tool(std::string(WARPFS_MKFS_BIN) + " -q --size 64M emu:" + img, &out), 0) << out;
  EXPECT_EQ(run_tool(fsck_bin + " emu:" + img, &out), 0) << out;
  EXPECT_NE(out.find("warpfs emu:" + img + ": clean, 1/"), std::string::npos) << out;
  EXPECT_EQ(run_tool(fsck_bin + " -f -n " + img, &out), 0) << out;
  EXPECT_NE(out.find(" files (1 directories), "), std::string::npos) << out;
  EXPECT_EQ(run_tool(fsck_bin + " -f -y " + img, &out), 0) << out;

  // Damage the superblock: -n finds it and leaves every byte as it was; -y repairs.
  {
    std::fstream f(img, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(130);
    f.put('!');
  }
  const std::string before = slurp(img);
  EXPECT_EQ(run_tool(fsck_bin + " -n " + img, &out), 4) << out;
  EXPECT_NE(out.find("superblock (block 0): checksum mismatch"), std::string::npos) << out;
  EXPECT_TRUE(slurp(img) == before) << "fsck -n changed the image";
  EXPECT_EQ(run_tool(fsck_bin + " " + img, &out), 4) << out;
  EXPECT_TRUE(slurp(img) == before) << "fsck without -y changed the image";
  EXPECT_EQ(run_tool(fsck_bin + " -y " + img, &out), 1) << out;
  EXPECT_NE(out.find("restored from the backup"), std::string::npos) << out;
  EXPECT_EQ(run_tool(fsck_bin + " -f -n " + img, &out), 0) << out;

  // Operational errors and usage.
  EXPECT_EQ(run_tool(fsck_bin + " " + std::string(dir) + "/missing.img", &out), 8) << out;
  EXPECT_NE(out.find("missing.img"), std::string::npos) << out;
  const std::string zero = std::string(dir) + "/zero.img";
  {
    std::ofstream z(zero, std::ios::binary);
    z.seekp((8 << 20) - 1);
    z.put('\0');
  }
  EXPECT_EQ(run_tool(fsck_bin + " " + zero, &out), 8) << out;
  EXPECT_NE(out.find("not a warpfs"), std::string::npos) << out;
  EXPECT_EQ(run_tool(fsck_bin, &out), 16) << out;
  EXPECT_EQ(run_tool(fsck_bin + " -y -n " + img, &out), 16) << out;
  EXPECT_EQ(run_tool(fsck_bin + " -Q " + img, &out), 16) << out;
  EXPECT_EQ(run_tool(fsck_bin + " " + img + " extra", &out), 16) << out;
  ASSERT_EQ(std::system(("rm -rf " + std::string(dir)).c_str()), 0);
}
#endif

}  // namespace
}  // namespace warpfs::fs::test
