// fsck at one thread and at four (FsckOptions::threads: passes 1 and 5 scan their groups,
// pass 2 its directories in parallel) on the same damaged images: the same exit code and counts,
// the same lines in the same order, and, with repair, the same blocks written with the same
// contents.
#include <sys/stat.h>

#include <functional>
#include <map>
#include <mutex>

#include "fs/core_rig.h"
#include "warpfs/fs/format.h"
#include "warpfs/fs/layout.h"

namespace warpfs::fs::test {
namespace {

// A copy of an image that is never written: reads go through to `base` unless the copy
// wrote the block. Several over one device are independent copies of it.
class CopyDevice final : public blockdev::BlockDevice {
 public:
  explicit CopyDevice(blockdev::BlockDevice& base) : base_(base) {}
  uint32_t block_bytes() const override { return base_.block_bytes(); }
  uint64_t block_count() const override { return base_.block_count(); }
  blockdev::Status read(uint64_t b, uint32_t n, void* buf) override {
    if (auto s = base_.read(b, n, buf); !s.is_ok()) return s;
    std::lock_guard<std::mutex> g(mu_);  // written_ (the checker reads on several threads)
    for (auto it = written_.lower_bound(b); it != written_.end() && it->first < b + n; ++it)
      std::memcpy(static_cast<uint8_t*>(buf) + (it->first - b) * kBlockSize, it->second.data(),
                  kBlockSize);
    return blockdev::Status::ok();
  }
  blockdev::Status write(uint64_t b, uint32_t n, const void* buf) override {
    std::lock_guard<std::mutex> g(mu_);
    const auto* p = static_cast<const uint8_t*>(buf);
    for (uint32_t i = 0; i < n; ++i)
      written_[b + i].assign(p + size_t{i} * kBlockSize, p + size_t{i + 1} * kBlockSize);
    return blockdev::Status::ok();
  }
  blockdev::Status flush() override { return blockdev::Status::ok(); }
  blockdev::Status trim(uint64_t, uint64_t) override { return blockdev::Status::ok(); }
  // What was written, the superblocks' write time and checksum zeroed (a repair stamps the
  // time it writes the primary).
  std::map<uint64_t, std::vector<uint8_t>> writes() const {
    std::lock_guard<std::mutex> g(mu_);
    auto w = written_;
    for (auto& [b, v] : w) {
      if (b != 0 && b != block_count() - 1) continue;
      std::memset(v.data() + offsetof(Superblock, write_time), 0, sizeof(Superblock::write_time));
      std::memset(v.data() + offsetof(Superblock, checksum), 0, sizeof(Superblock::checksum));
    }
    return w;
  }

 private:
  blockdev::BlockDevice& base_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::vector<uint8_t>> written_;
};

struct Outcome {
  FsckResult r;
  std::string text;
};

Outcome check(blockdev::BlockDevice& dev, bool repair, unsigned threads) {
  FsckOptions o;
  o.repair = repair;
  o.threads = threads;
  Outcome out;
  out.r = fsck(dev, o, [&](const std::string& s) { out.text += s + "\n"; });
  return out;
}

// Raw access to the unmounted image for planting damage.
struct Image {
  blockdev::BlockDevice& dev;
  Superblock sb{};
  Layout L;
  explicit Image(blockdev::BlockDevice& d) : dev(d) {
    EXPECT_TRUE(d.read(0, 1, &sb).is_ok());
    L.init(sb);
  }
  std::vector<uint8_t> get(uint64_t b) {
    std::vector<uint8_t> v(kBlockSize);
    EXPECT_TRUE(dev.read(b, 1, v.data()).is_ok());
    return v;
  }
  void put(uint64_t b, const std::vector<uint8_t>& v) {
    EXPECT_TRUE(dev.write(b, 1, v.data()).is_ok());
  }
  Inode inode(uint64_t ino) {
    Inode d;
    std::memcpy(&d, get(L.inode_block(ino)).data() + L.inode_offset(ino), sizeof d);
    return d;
  }
  void put_inode(uint64_t ino, Inode d, bool fix = true) {
    if (fix) d.checksum = inode_checksum(d, ino, L.seed);
    auto b = get(L.inode_block(ino));
    std::memcpy(b.data() + L.inode_offset(ino), &d, sizeof d);
    put(L.inode_block(ino), b);
  }
  GroupDesc gd(uint32_t g) {
    GroupDesc d;
    const auto b = get(L.gdt_start + g / kGroupDescsPerBlock);
    std::memcpy(&d, b.data() + (g % kGroupDescsPerBlock) * sizeof d, sizeof d);
    return d;
  }
  void put_gd(uint32_t g, GroupDesc d) {
    d.checksum = group_checksum(d, L.seed);
    auto b = get(L.gdt_start + g / kGroupDescsPerBlock);
    std::memcpy(b.data() + (g % kGroupDescsPerBlock) * sizeof d, &d, sizeof d);
    put(L.gdt_start + g / kGroupDescsPerBlock, b);
  }
  // Flips bit i of group g's block (which 0) or inode (1) bitmap, checksums kept valid.
  void flip_bit(uint32_t g, int which, uint64_t i) {
    GroupDesc d = gd(g);
    auto bm = get(L.group_start(g) + which);
    bm[i / 8] ^= static_cast<uint8_t>(1u << (i % 8));
    put(L.group_start(g) + which, bm);
    (which == 0 ? d.block_bitmap_checksum : d.inode_bitmap_checksum) =
        checksum(bm.data(), kBlockSize, L.seed);
    put_gd(g, d);
  }
};

// The populated image: files in several directories, some with data and an xattr.
struct Tree {
  Ino dir = 0, a = 0, b = 0, c = 0;
};

Tree populate(Rig& r) {
  Tree t;
  t.dir = r.mkdir(kRootInode, "d");
  t.a = r.create(t.dir, "a");
  t.b = r.create(kRootInode, "b");
  t.c = r.create(t.dir, "c");
  EXPECT_EQ(r.write(t.a, 0, pattern(1, 0, 4096)), 0);
  EXPECT_EQ(r.write(t.b, 0, pattern(2, 0, 4096)), 0);
  EXPECT_EQ(r.write(t.c, 0, pattern(3, 0, 20000)), 0);
  EXPECT_EQ(r.fs->setxattr(t.c, "user.color", "blue", 4, 0), 0);
  for (int d = 0; d < 20; ++d) {  // enough directories for pass 2 to fan out too
    const Ino sub = r.mkdir(kRootInode, "s" + std::to_string(d));
    for (int f = 0; f < 12; ++f) r.create(sub, "f" + std::to_string(f));
  }
  return t;
}

struct Case {
  const char* name;
  bool compare_image;  // false where the repair makes a directory (its hash seed is random)
  std::function<void(Image&, const Tree&)> damage;
};

const Case kCases[] = {
    {"BitmapsOfSeveralGroups", true,
     [](Image& m, const Tree&) {
       m.flip_bit(1, 0, 5000);  // a free block marked in use
       m.flip_bit(2, 1, 7);     // a free inode marked in use
       m.flip_bit(0, 1, 3);     // an inode in use (the root's neighbours) marked free
     }},
    {"DescriptorCounts", true,
     [](Image& m, const Tree&) {
       GroupDesc d = m.gd(1);
       d.free_blocks += 3;
       m.put_gd(1, d);
     }},
    {"InodeChecksum", true,
     [](Image& m, const Tree& t) {
       Inode d = m.inode(t.b);
       d.uid ^= 1;
       m.put_inode(t.b, d, /*fix=*/false);
     }},
    {"LinkCount", true,
     [](Image& m, const Tree& t) {
       Inode d = m.inode(t.a);
       d.links = 3;
       m.put_inode(t.a, d);
     }},
    {"SharedBlock", true,
     [](Image& m, const Tree& t) {
       Inode d = m.inode(t.b);
       d.root.extents[0].physical = m.inode(t.a).root.extents[0].physical;
       m.put_inode(t.b, d);
     }},
    {"ExtentOutside", true,
     [](Image& m, const Tree& t) {
       Inode d = m.inode(t.c);
       d.root.extents[0].physical = m.sb.block_count + 100;
       m.put_inode(t.c, d);
     }},
    {"DirectoryLeafChecksum", true,
     [](Image& m, const Tree& t) {
       const Inode d = m.inode(t.dir);
       ASSERT_EQ(d.tree_depth, 0u);
       uint64_t leaf = 0;  // directory block 1
       for (uint32_t i = 0; i < d.extent_count; ++i) {
         const Extent& e = d.root.extents[i];
         if (e.logical <= 1 && 1 < e.logical + e.blocks()) leaf = e.physical + 1 - e.logical;
       }
       ASSERT_NE(leaf, 0u);
       auto b = m.get(leaf);
       b[kBlockSize - 1] ^= 0x20;  // past the entries: every one survives the salvage
       m.put(leaf, b);
     }},
    {"UnreachableInodeInGroup2", false,
     [](Image& m, const Tree&) {
       const uint64_t ino = 2 * uint64_t{m.L.ipg} + 9;
       Inode d{};
       d.mode = S_IFREG | 0640;
       d.links = 1;
       m.put_inode(ino, d);
       m.flip_bit(2, 1, 8);
     }},
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class FsckThreads : public ::testing::TestWithParam<Case> {};

TEST_P(FsckThreads, SameOutcomeAtOneAndFourThreads) {
  auto r = Rig::make(320);  // three block groups
  ASSERT_TRUE(r);
  const Tree t = populate(*r);
  ASSERT_EQ(r->fs->unmount(), 0) << r->log;
  r->fs.reset();
  Image m(*r->dev);
  ASSERT_GE(m.L.groups, 3u);
  GetParam().damage(m, t);
  for (const bool repair : {false, true}) {
    CopyDevice one(*r->dev), four(*r->dev);
    const Outcome x = check(one, repair, 1), y = check(four, repair, 4);
    EXPECT_NE(x.r.exit_code, kFsckClean) << "the damage is found:\n" << x.text;
    EXPECT_EQ(x.r.exit_code, y.r.exit_code);
    EXPECT_EQ(x.r.problems, y.r.problems);
    EXPECT_EQ(x.r.corrected, y.r.corrected);
    EXPECT_EQ(x.r.lines, y.r.lines);
    EXPECT_EQ(x.text, y.text);
    EXPECT_EQ(x.r.inodes_used, y.r.inodes_used);
    EXPECT_EQ(x.r.blocks_used, y.r.blocks_used);
    if (!repair) {
      EXPECT_TRUE(one.writes().empty() && four.writes().empty()) << "check mode wrote";
      continue;
    }
    EXPECT_FALSE(one.writes().empty());
    if (GetParam().compare_image) {
      EXPECT_TRUE(one.writes() == four.writes()) << "repaired images";
    }
    EXPECT_EQ(check(four, false, 4).r.exit_code, kFsckClean) << "after the 4-thread repair";
  }
}

INSTANTIATE_TEST_SUITE_P(Damage, FsckThreads, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace warpfs::fs::test
