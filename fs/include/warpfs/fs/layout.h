// Where everything is on a warpfs device (FORMAT.md "Layout"), computed from a superblock in
// one place: the mounted core, fsck, resize and the tests ask this, and mkfs plans the
// geometry the superblock then describes.
//
//   block 0 | journal | descriptor table (used + room to grow) | group 0 | group 1 | ... | backup
//
// Every group but the last holds kBlocksPerGroup blocks: its block bitmap, its inode bitmap,
// its inode table, then data. The last group ends before the backup superblock.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "warpfs/fs/format.h"
#include "warpfs/nvme/check.h"

namespace warpfs::fs {

inline constexpr uint64_t div_up(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

// Bits [from, to) of a bitmap block (FORMAT.md: bit i of byte i/8 is bit i%8).
inline void set_bits(uint8_t* bitmap, uint64_t from, uint64_t to) {
  for (uint64_t i = from; i < to; ++i) bitmap[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
}
inline void clear_bits(uint8_t* bitmap, uint64_t from, uint64_t to) {
  for (uint64_t i = from; i < to; ++i) bitmap[i / 8] &= static_cast<uint8_t>(~(1u << (i % 8)));
}

// The descriptor table's blocks, room to grow included: the superblock's gdt_blocks, or for
// images made before that field, exactly what the groups use.
inline uint64_t gdt_blocks_of(const Superblock& sb) {
  return sb.gdt_blocks != 0 ? sb.gdt_blocks : div_up(sb.group_count, kGroupDescsPerBlock);
}

// REQUIRES: a superblock that passed validate_superblock (or fsck's own check); init()
// checks what its own arithmetic needs (groups, inodes per group, the table before the end).
struct Layout {
  uint64_t block_count = 0, inode_count = 0, gdt_start = 0, gdt_blocks = 0, first_group = 0,
           seed = 0;
  uint32_t groups = 0, ipg = 0, itb = 0, journal_blocks = 0;

  Layout() = default;
  explicit Layout(const Superblock& sb) { init(sb); }
  void init(const Superblock& sb) {
    WARPFS_DCHECK(sb.group_count > 0 && sb.inodes_per_group > 0 &&
                      sb.gdt_start + gdt_blocks_of(sb) < sb.block_count,
                  "Layout of a superblock that was not validated");
    block_count = sb.block_count;
    inode_count = sb.inode_count;
    gdt_start = sb.gdt_start;
    gdt_blocks = gdt_blocks_of(sb);
    first_group = gdt_start + gdt_blocks;
    seed = sb.checksum_seed;
    groups = sb.group_count;
    ipg = sb.inodes_per_group;
    itb = ipg / kInodesPerBlock;
    journal_blocks = sb.journal_blocks;
  }
  // The descriptor table's blocks that hold descriptors (the rest is room to grow).
  uint64_t gdt_used() const { return div_up(groups, kGroupDescsPerBlock); }
  // How many groups the table has room for.
  uint64_t max_groups() const { return gdt_blocks * kGroupDescsPerBlock; }
  uint64_t group_start(uint32_t g) const { return first_group + uint64_t{g} * kBlocksPerGroup; }
  uint64_t group_size(uint32_t g) const {
    return std::min<uint64_t>(kBlocksPerGroup, block_count - 1 - group_start(g));
  }
  // REQUIRES: first_group <= b (clamped to the last group).
  uint32_t group_of(uint64_t b) const {
    WARPFS_DCHECK(first_group <= b, "group_of a block before the first group");
    return static_cast<uint32_t>(
        std::min<uint64_t>((b - first_group) / kBlocksPerGroup, groups - 1));
  }
  uint64_t meta_end(uint32_t g) const { return group_start(g) + 2 + itb; }  // first data block
  uint64_t inode_block(uint64_t ino) const {
    const uint64_t i = (ino - 1) % ipg;
    return group_start(static_cast<uint32_t>((ino - 1) / ipg)) + 2 + i / kInodesPerBlock;
  }
  size_t inode_offset(uint64_t ino) const {
    return ((ino - 1) % ipg % kInodesPerBlock) * kInodeSize;
  }
  // A block a file may own: inside a group's data area.
  bool is_data(uint64_t b) const {
    if (b < first_group || b >= block_count - 1) return false;
    return b >= meta_end(group_of(b));
  }
  // What a block that is not data holds ("the journal"), for reports; "" for a data block.
  std::string metadata_name(uint64_t b) const {
    if (b == 0) return "the superblock";
    if (b <= journal_blocks) return "the journal";
    if (b < first_group) return "the group descriptor table";
    if (b == block_count - 1) return "the backup superblock";
    if (b >= block_count) return "beyond the end of the filesystem";
    const uint32_t g = group_of(b);
    const uint64_t off = b - group_start(g);
    const std::string of = " of group " + std::to_string(g);
    if (off == 0) return "the block bitmap" + of;
    if (off == 1) return "the inode bitmap" + of;
    if (off < 2 + itb) return "the inode table" + of;
    return "";
  }
};

}  // namespace warpfs::fs
