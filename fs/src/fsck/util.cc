// Small helpers of the checker's passes: formatting of report lines, bitmap bits, the
// superblock's sanity check, chunked reads, and the overlay device of check mode.
#include <algorithm>
#include <bit>
#include <cstring>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

std::string num(uint64_t v) {
  return std::to_string(v);
}
uint16_t rec_len(size_t name_len) {
  return static_cast<uint16_t>((sizeof(DirEntryHeader) + name_len + 7) & ~size_t{7});
}
uint8_t dtype(uint32_t mode) {
  return static_cast<uint8_t>((mode >> 12) & 017);
}
bool test_bit(const uint8_t* bm, uint64_t i) {
  return (bm[i / 8] >> (i % 8)) & 1;
}
void set_bit(uint8_t* bm, uint64_t i) {
  bm[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
}
uint64_t zero_bits(const std::vector<uint8_t>& bm) {
  uint64_t used = 0;
  for (uint8_t x : bm) used += static_cast<uint64_t>(std::popcount(x));
  return bm.size() * 8 - used;
}

bool valid_type(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
    case S_IFDIR:
    case S_IFLNK:
    case S_IFCHR:
    case S_IFBLK:
    case S_IFIFO:
    case S_IFSOCK:
      return true;
    default:
      return false;
  }
}

const char* type_name(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFDIR:
      return "a directory";
    case S_IFREG:
      return "a regular file";
    case S_IFLNK:
      return "a symlink";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFIFO:
      return "a fifo";
    default:
      return "a socket";
  }
}

// A name as it can be printed: control and non-ASCII bytes escaped.
std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::string extent_str(const Extent& e) {
  return "(logical " + num(e.logical) + ", " + num(e.blocks()) + " block" +
         (e.blocks() == 1 ? "" : "s") + " at " + num(e.physical) + ")";
}

// "block 7" or "blocks 7-9" (inclusive).
std::string span_str(const char* what, uint64_t a, uint64_t b) {
  return a == b ? std::string(what) + " " + num(a)
                : std::string(what) + "s " + num(a) + "-" + num(b);
}

// "" or why `sb` cannot describe a warpfs on a device of `dev_blocks` blocks.
std::string superblock_problem(const Superblock& sb, uint64_t dev_blocks) {
  if (sb.magic != kMagic) return "no warpfs magic";
  if (sb.checksum != superblock_checksum(sb)) return "checksum mismatch";
  if (sb.version != kVersion) return "unsupported version " + num(sb.version);
  if (!features_supported(sb.features)) return "unsupported feature flags " + num(sb.features);
  if (sb.block_size != kBlockSize || sb.blocks_per_group != kBlocksPerGroup)
    return "unsupported block geometry";
  if (sb.block_count > dev_blocks) {
    return "the filesystem has " + num(sb.block_count) + " blocks, the device only " +
           num(dev_blocks);
  }
  if (sb.journal_blocks < 8 || sb.gdt_start != 1 + uint64_t{sb.journal_blocks})
    return "inconsistent journal geometry";
  if (sb.inodes_per_group == 0 || sb.inodes_per_group % kInodesPerBlock != 0 ||
      sb.inodes_per_group > kBlockSize * 8) {
    return "bad inodes_per_group " + num(sb.inodes_per_group);
  }
  if (sb.group_count == 0 || sb.inode_count != uint64_t{sb.group_count} * sb.inodes_per_group) {
    return "inconsistent group and inode counts";
  }
  if (sb.root_inode != kRootInode) return "root inode " + num(sb.root_inode) + ", not 1";
  if (sb.state != kStateClean && sb.state != kStateDirty) return "unknown state " + num(sb.state);
  if (sb.reserved_blocks >
      sb.block_count / 2) {  // FORMAT.md "Reserved blocks": mkfs keeps at most 50 %
    return num(sb.reserved_blocks) + " reserved blocks, more than half of " + num(sb.block_count);
  }
  // FORMAT.md "Layout": the groups follow the descriptor table and end at the backup.
  if ((sb.gdt_blocks != 0) != ((sb.features & kFeatureGdtRoom) != 0) ||
      (sb.gdt_blocks != 0 && (sb.gdt_blocks < div_up(sb.group_count, kGroupDescsPerBlock) ||
                              sb.gdt_blocks > kMaxGdtBlocks))) {
    return "descriptor table of " + num(sb.gdt_blocks) + " blocks for " + num(sb.group_count) +
           " groups";
  }
  const uint64_t first = sb.gdt_start + gdt_blocks_of(sb);
  if (sb.block_count < first + 2) return "the block count leaves no room for the groups";
  const uint64_t span = sb.block_count - 1 - first;
  if (div_up(span, kBlocksPerGroup) != sb.group_count) {
    return num(sb.group_count) + " groups do not match " + num(sb.block_count) + " blocks";
  }
  const uint64_t last = span - uint64_t{sb.group_count - 1} * kBlocksPerGroup;
  if (last <= 2 + sb.inodes_per_group / kInodesPerBlock)
    return "the last group is too short for its metadata";
  return "";
}

// Whether two superblocks describe the same filesystem: the same fixed geometry, seed and
// uuid. The sizes may differ (resize.warpfs grows them in one transaction), and so do the
// dynamic fields between the primary and the backup.
bool same_filesystem(const Superblock& a, const Superblock& b) {
  return a.magic == b.magic && a.version == b.version && a.block_size == b.block_size &&
         a.blocks_per_group == b.blocks_per_group && a.inodes_per_group == b.inodes_per_group &&
         a.journal_blocks == b.journal_blocks && a.gdt_start == b.gdt_start &&
         a.checksum_seed == b.checksum_seed && std::memcmp(a.uuid, b.uuid, sizeof a.uuid) == 0;
}

Status OverlayDevice::read(uint64_t block, uint32_t count, void* buf) {
  if (Status s = d_.read(block, count, buf); !s.is_ok()) return s;
  for (auto it = blocks_.lower_bound(block); it != blocks_.end() && it->first < block + count;
       ++it) {
    std::memcpy(static_cast<uint8_t*>(buf) + (it->first - block) * kBlockSize, it->second.data(),
                kBlockSize);
  }
  return Status::ok();
}

Status OverlayDevice::write(uint64_t block, uint32_t count, const void* buf) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  const auto* p = static_cast<const uint8_t*>(buf);
  for (uint32_t i = 0; i < count; ++i) {
    blocks_[block + i].assign(p + size_t{i} * kBlockSize, p + size_t{i + 1} * kBlockSize);
  }
  return Status::ok();
}

std::string read_blocks(BlockDevice& dev, uint64_t b, uint64_t n, void* buf) {
  auto* p = static_cast<uint8_t*>(buf);
  for (uint64_t done = 0; done < n;) {
    const auto k = static_cast<uint32_t>(std::min<uint64_t>(kChunk, n - done));
    if (Status s = dev.read(b + done, k, p + done * kBlockSize); !s.is_ok()) {
      std::memset(p + done * kBlockSize, 0, size_t{k} * kBlockSize);
      return "cannot read block " + num(b + done) + ": " + s.to_string();
    }
    done += k;
  }
  return "";
}

uint64_t mapped_end(const Info& n) {
  uint64_t end = 0;
  for (const Extent& e : n.ext) end = std::max<uint64_t>(end, uint64_t{e.logical} + e.blocks());
  return end;
}

}  // namespace warpfs::fs::fsck_impl
