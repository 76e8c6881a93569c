#include "warpfs/fs/mkfs.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "warpfs/blockdev/raid.h"
#include "warpfs/fs/layout.h"

namespace warpfs::fs {

using blockdev::Code;
using blockdev::Status;

namespace {

constexpr uint64_t kMinBlocks = 512;  // 2 MiB
constexpr uint32_t kMinJournal = 64;
constexpr uint32_t kMaxInodesPerGroup = kBlockSize * 8;  // one inode bitmap block
constexpr uint32_t kRootDirBlocks = 2;                   // index root + one empty leaf

// The descriptor table: the groups' descriptors and room for those of a filesystem grown to
// the resize limit (MkfsOptions::resize_max_blocks), as mke2fs reserves descriptor blocks.
uint32_t gdt_for(uint32_t groups, uint64_t device_blocks, const MkfsOptions& o) {
  constexpr uint64_t kDefaultLimit = uint64_t{64} << 40 >> 12;  // 64 TiB in blocks
  const uint64_t limit = o.resize_max_blocks != 0 ? o.resize_max_blocks
                                                  : std::min(device_blocks * 1024, kDefaultLimit);
  const uint64_t room = std::max<uint64_t>(groups, div_up(limit, kBlocksPerGroup));
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(div_up(room, kGroupDescsPerBlock), 1, kMaxGdtBlocks));
}

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

uint32_t inode_table_blocks(const Geometry& g) {
  return static_cast<uint32_t>(div_up(g.inodes_per_group, kInodesPerBlock));
}

uint64_t group_start(const Geometry& g, uint32_t group) {
  return g.first_group_block + uint64_t{group} * kBlocksPerGroup;
}

uint64_t group_blocks(const Geometry& g, uint32_t group) {
  const uint64_t end = g.block_count - 1;  // the backup superblock follows the last group
  return std::min<uint64_t>(kBlocksPerGroup, end - group_start(g, group));
}

bool plan_geometry(uint64_t device_blocks, const MkfsOptions& o, Geometry* g, std::string* error) {
  if (device_blocks < kMinBlocks) {
    *error = "the device is too small: warpfs needs at least " +
             std::to_string(kMinBlocks * kBlockSize >> 20) + " MiB";
    return false;
  }
  Geometry r;
  r.journal_blocks =
      o.journal_blocks
          ? o.journal_blocks
          : static_cast<uint32_t>(std::clamp<uint64_t>(device_blocks / 64, 256, 32768));
  r.journal_blocks = std::min<uint32_t>(r.journal_blocks, static_cast<uint32_t>(device_blocks / 4));
  if (r.journal_blocks < kMinJournal) {
    *error = "the journal must have at least " + std::to_string(kMinJournal) + " blocks";
    return false;
  }
  // The descriptor table's size, the group count, the inodes per group and whether a short
  // last group is worth keeping all depend on each other: iterate until the table's size
  // is exactly what the final group count needs (FORMAT.md: G = ceil(groups * 64 / 4096)).
  const uint64_t want_inodes = o.inodes ? o.inodes : device_blocks * kBlockSize / 16384;
  uint32_t gdt = 1, groups = 0;
  uint64_t ipg = 0, span = 0;
  for (int i = 0; i < 16; ++i) {
    const uint64_t first = 1 + r.journal_blocks + gdt;
    if (device_blocks < first + 2) {
      *error = "the device is too small for its journal";
      return false;
    }
    span = device_blocks - 1 - first;
    groups = static_cast<uint32_t>(div_up(span, kBlocksPerGroup));
    ipg = div_up(std::max<uint64_t>(want_inodes, 16), groups);
    ipg = std::clamp<uint64_t>(div_up(ipg, kInodesPerBlock) * kInodesPerBlock, kInodesPerBlock,
                               kMaxInodesPerGroup);
    r.inodes_per_group = static_cast<uint32_t>(ipg);
    const uint64_t overhead = 2 + inode_table_blocks(r);
    // A last group too short for its bitmaps, inode table and some data is left out.
    const uint64_t last = span - uint64_t{groups - 1} * kBlocksPerGroup;
    if (last < overhead + 16) {
      --groups;
      span -= last;
    }
    const uint32_t need = gdt_for(groups, device_blocks, o);
    if (need == gdt) break;
    gdt = need;
  }
  r.gdt_blocks = gdt;
  r.first_group_block = 1 + r.journal_blocks + gdt;
  if (groups == 0) {
    *error = "the device is too small for one block group with " + std::to_string(ipg) + " inodes";
    return false;
  }
  if (gdt_for(groups, device_blocks, o) != gdt) {
    *error = "no consistent geometry for " + std::to_string(device_blocks) + " blocks";
    return false;
  }
  const uint64_t overhead = 2 + inode_table_blocks(r);
  r.group_count = groups;
  r.block_count = r.first_group_block + span + 1;
  r.inode_count = uint64_t{groups} * r.inodes_per_group;
  if (o.inodes > r.inode_count) {
    *error =
        "too many inodes requested for this device (at most " + std::to_string(r.inode_count) + ")";
    return false;
  }
  r.metadata_blocks = r.first_group_block + uint64_t{groups} * overhead + 1;
  *g = r;
  return true;
}

uint64_t reserved_blocks_for(uint64_t data_blocks, double percent) {
  const double p = std::clamp(percent, 0.0, 50.0);
  return static_cast<uint64_t>(static_cast<double>(data_blocks) * p / 100.0);
}

Existing probe_existing(blockdev::BlockDevice& dev, std::string* what) {
  const uint64_t n = std::min<uint64_t>(dev.block_count(), 32);
  std::vector<uint8_t> buf(n * kBlockSize);
  if (!dev.read(0, static_cast<uint32_t>(n), buf.data()).is_ok()) {
    *what = "unreadable";
    return Existing::kData;
  }
  Superblock sb;
  std::memcpy(&sb, buf.data(), sizeof sb);
  if (sb.magic == kMagic) {
    *what = "a warpfs filesystem";
    if (sb.label[0] != '\0')
      *what += " labelled '" + std::string(sb.label, strnlen(sb.label, sizeof sb.label)) + "'";
    return Existing::kWarpfs;
  }
  uint16_t ext_magic = 0;
  std::memcpy(&ext_magic, buf.data() + 1080, 2);
  if (ext_magic == 0xef53) {
    *what = "an ext2/3/4 filesystem";
    return Existing::kOtherFilesystem;
  }
  if (blockdev::RaidLabel l; blockdev::RaidLabel::has_magic(buf.data())) {
    std::string why;
    *what = blockdev::RaidLabel::decode(buf.data(), &l, &why)
                ? "member " + std::to_string(l.position) + " of RAID set " + l.uuid_text()
                : "a damaged RAID member label";
    return Existing::kData;
  }
  if (std::memcmp(buf.data(), "XFSB", 4) == 0) {
    *what = "an XFS filesystem";
    return Existing::kOtherFilesystem;
  }
  if (buf.size() > 0x10040 + 8 && std::memcmp(buf.data() + 0x10040, "_BHRfS_M", 8) == 0) {
    *what = "a btrfs filesystem";
    return Existing::kOtherFilesystem;
  }
  if (std::any_of(buf.begin(), buf.end(), [](uint8_t b) { return b != 0; })) {
    *what = "data (its first blocks are not zero)";
    return Existing::kData;
  }
  *what = "nothing";
  return Existing::kNothing;
}

Status format(blockdev::BlockDevice& dev, const MkfsOptions& o, const Geometry& g,
              const std::function<void(uint64_t, uint64_t)>& progress) {
  if (dev.block_bytes() != kBlockSize || dev.block_count() < g.block_count) {
    return Status::error(Code::kInvalidArgument, "the device does not fit the geometry");
  }
  std::random_device rd;
  std::mt19937_64 rng(o.seed ? o.seed : (uint64_t{rd()} << 32) ^ rd());
  const uint64_t seed = rng();
  const uint64_t now = now_ns();
  const uint32_t itb = inode_table_blocks(g);
  std::vector<uint8_t> block(kBlockSize);
  auto write_block = [&](uint64_t b, const void* data) { return dev.write(b, 1, data); };

  // The root directory's two blocks: the first data blocks of group 0.
  const uint64_t root_dir_block = group_start(g, 0) + 2 + itb;

  // Group descriptors and bitmaps.
  std::vector<GroupDesc> gds(g.group_count);
  uint64_t free_blocks = 0, free_inodes = 0;
  for (uint32_t gi = 0; gi < g.group_count; ++gi) {
    const uint64_t start = group_start(g, gi), size = group_blocks(g, gi);
    GroupDesc& gd = gds[gi];
    gd = GroupDesc{};
    gd.block_bitmap = start;
    gd.inode_bitmap = start + 1;
    gd.inode_table = start + 2;
    std::vector<uint8_t> bb(kBlockSize, 0), ib(kBlockSize, 0);
    uint64_t used = 2 + itb;
    if (gi == 0) used += kRootDirBlocks;
    set_bits(bb.data(), 0, used);
    set_bits(bb.data(), size, kBlocksPerGroup);  // past the end of a short last group
    set_bits(ib.data(), g.inodes_per_group, uint64_t{kBlockSize} * 8);
    if (gi == 0) set_bits(ib.data(), 0, 1);  // inode 1: the root directory
    gd.free_blocks = static_cast<uint32_t>(size - used);
    gd.free_inodes = g.inodes_per_group - (gi == 0 ? 1 : 0);
    gd.used_dirs = gi == 0 ? 1 : 0;
    gd.block_bitmap_checksum = checksum(bb.data(), kBlockSize, seed);
    gd.inode_bitmap_checksum = checksum(ib.data(), kBlockSize, seed);
    gd.checksum = group_checksum(gd, seed);
    free_blocks += gd.free_blocks;
    free_inodes += gd.free_inodes;
    if (Status s = write_block(gd.block_bitmap, bb.data()); !s.is_ok()) return s;
    if (Status s = write_block(gd.inode_bitmap, ib.data()); !s.is_ok()) return s;
    // Inode tables are deallocated, not written: they read back as zeroes (free inodes).
    if (Status s = dev.trim(gd.inode_table, itb); !s.is_ok()) return s;
    if (progress) progress(gi + 1, g.group_count);
  }
  for (uint32_t b = 0; b < g.gdt_blocks; ++b) {
    std::memset(block.data(), 0, kBlockSize);
    for (uint32_t k = 0; k < kGroupDescsPerBlock; ++k) {
      const uint64_t gi = uint64_t{b} * kGroupDescsPerBlock + k;
      if (gi < gds.size())
        std::memcpy(block.data() + k * sizeof(GroupDesc), &gds[gi], sizeof(GroupDesc));
    }
    if (Status s = write_block(1 + g.journal_blocks + b, block.data()); !s.is_ok()) return s;
  }

  // The root directory: inode 1, an index root pointing at one empty leaf.
  Inode root{};
  root.mode = 040755;
  root.uid = o.root_uid;
  root.gid = o.root_gid;
  root.links = 2;
  root.size = uint64_t{kRootDirBlocks} * kBlockSize;
  root.blocks = kRootDirBlocks;
  root.atime_ns = root.mtime_ns = root.ctime_ns = root.crtime_ns = now;
  root.generation = 1;
  root.dir_seed = rng();
  root.parent = kRootInode;
  root.extent_count = 1;
  root.root.extents[0] = Extent{0, kRootDirBlocks, root_dir_block};
  root.checksum = inode_checksum(root, kRootInode, seed);
  std::memset(block.data(), 0, kBlockSize);
  std::memcpy(block.data(), &root, sizeof root);
  if (Status s = write_block(gds[0].inode_table, block.data()); !s.is_ok()) return s;

  std::memset(block.data(), 0, kBlockSize);
  DirIndexHeader ih{kDirIndexMagic, 1, 1, kDirIndexCapacity, 0, kRootInode, 0};
  DirIndexEntry ie{0, 1, 0};
  std::memcpy(block.data(), &ih, sizeof ih);
  std::memcpy(block.data() + sizeof ih, &ie, sizeof ie);
  ih.checksum = block_checksum(block.data(), offsetof(DirIndexHeader, checksum), seed);
  std::memcpy(block.data(), &ih, sizeof ih);
  if (Status s = write_block(root_dir_block, block.data()); !s.is_ok()) return s;
  std::memset(block.data(), 0, kBlockSize);
  DirLeafHeader lh{kDirLeafMagic, 0, 0, kRootInode, 0, 0};
  std::memcpy(block.data(), &lh, sizeof lh);
  lh.checksum = block_checksum(block.data(), offsetof(DirLeafHeader, checksum), seed);
  std::memcpy(block.data(), &lh, sizeof lh);
  if (Status s = write_block(root_dir_block + 1, block.data()); !s.is_ok()) return s;

  // An empty journal: the header, the rest deallocated.
  JournalHeader jh{};
  jh.magic = kJournalHeaderMagic;
  jh.tail_block = 1;
  jh.tail_seq = 1;
  jh.checksum = block_checksum(&jh, offsetof(JournalHeader, checksum), seed);
  if (Status s = write_block(1, &jh); !s.is_ok()) return s;
  if (g.journal_blocks > 1) {
    if (Status s = dev.trim(2, g.journal_blocks - 1); !s.is_ok()) return s;
  }

  // Superblocks: the backup first, the primary last, each after a flush, so an interrupted
  // mkfs never leaves a valid primary over a half-written filesystem.
  Superblock sb{};
  sb.magic = kMagic;
  sb.version = kVersion;
  sb.block_size = kBlockSize;
  sb.block_count = g.block_count;
  sb.inode_count = g.inode_count;
  sb.blocks_per_group = kBlocksPerGroup;
  sb.inodes_per_group = g.inodes_per_group;
  sb.group_count = g.group_count;
  sb.journal_blocks = g.journal_blocks;
  sb.gdt_start = 1 + g.journal_blocks;
  sb.gdt_blocks = g.gdt_blocks;
  sb.free_blocks = free_blocks;
  sb.free_inodes = free_inodes;
  sb.root_inode = kRootInode;
  sb.state = kStateClean;
  // Every descriptor's refcount_table starts 0: no group has a table before it shares a block.
  sb.features = kFeaturesV1 | kFeatureGdtRoom | kFeatureXattrChain | kFeatureSharedBlocks;
  sb.checksum_seed = seed;
  for (auto& b : sb.uuid) b = static_cast<uint8_t>(rng());
  std::strncpy(sb.label, o.label.c_str(), sizeof sb.label - 1);
  sb.mkfs_time = sb.write_time = now;
  sb.journal_seq = 1;
  sb.reserved_blocks = reserved_blocks_for(g.block_count - g.metadata_blocks, o.reserved_percent);
  sb.reserved_uid = o.reserved_uid;
  sb.reserved_gid = o.reserved_gid;
  sb.checksum = superblock_checksum(sb);
  if (Status s = dev.flush(); !s.is_ok()) return s;
  if (Status s = write_block(g.block_count - 1, &sb); !s.is_ok()) return s;
  if (Status s = dev.flush(); !s.is_ok()) return s;
  if (Status s = write_block(0, &sb); !s.is_ok()) return s;
  return dev.flush();
}

}  // namespace warpfs::fs
