// The warpfs on-disk format, version 1, as code. fs/FORMAT.md is the specification: every
// structure here names its section there, and static_asserts pin each size and offset.
//
// Plain data, little-endian (x86 and the GPU are; a big-endian port would byte-swap here).
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

namespace warpfs::fs {

inline constexpr uint32_t kBlockSize = 4096;
inline constexpr uint64_t kMagic = 0x0100'5346'5052'4157ull;  // "WARPFS\0\1"
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kBlocksPerGroup = 32768;  // one bitmap block covers a group
inline constexpr uint32_t kInodeSize = 256;
inline constexpr uint32_t kInodesPerBlock = kBlockSize / kInodeSize;
inline constexpr uint64_t kRootInode = 1;
inline constexpr uint32_t kMaxName = 255;

enum : uint32_t { kStateClean = 1, kStateDirty = 2 };
enum : uint32_t {
  kFeatureHashedDirs = 1,
  kFeatureExtents = 2,
  kFeatureJournal = 4,
  kFeatureGdtRoom = 8,
  // Extended attributes beyond one block (FORMAT.md "Extended attributes"): xattr blocks
  // chained through XattrHeader::next and values in value blocks. Code that predates it
  // would take those blocks for leaked ones and free them, so it must refuse such an image.
  kFeatureXattrChain = 16,
  // Data blocks shared by several extents, counted in per-group reference-count tables
  // (FORMAT.md "Shared blocks"). Code that predates it would free a shared block at the
  // first owner's truncate while another file still maps it, so it must refuse such an image.
  kFeatureSharedBlocks = 32
};
inline constexpr uint32_t kFeaturesV1 = kFeatureHashedDirs | kFeatureExtents | kFeatureJournal;
// Feature sets this code reads: v1, and v1 with a descriptor table that keeps room to grow
// (Superblock::gdt_blocks; FORMAT.md "Layout"), each with or without chained xattrs; code
// that predates either must refuse it.
inline bool features_supported(uint32_t f) {
  f &= ~uint32_t{kFeatureXattrChain | kFeatureSharedBlocks};
  return f == kFeaturesV1 || f == (kFeaturesV1 | kFeatureGdtRoom);
}

// FORMAT.md "Superblock".
struct Superblock {
  uint64_t magic;
  uint32_t version;
  uint32_t block_size;
  uint64_t block_count;
  uint64_t inode_count;
  uint32_t blocks_per_group;
  uint32_t inodes_per_group;
  uint32_t group_count;
  uint32_t journal_blocks;
  uint64_t gdt_start;
  uint64_t free_blocks;
  uint64_t free_inodes;
  uint64_t root_inode;
  uint64_t orphan_head;
  uint32_t state;
  uint32_t features;
  uint64_t checksum_seed;
  uint8_t uuid[16];
  char label[64];
  uint64_t mkfs_time;
  uint64_t mount_time;
  uint64_t write_time;
  uint64_t mount_count;
  uint64_t journal_seq;
  uint64_t reserved_blocks;  // kept for root and reserved_uid/gid (FORMAT.md "Reserved blocks")
  uint32_t reserved_uid;
  uint32_t reserved_gid;
  uint32_t commit_interval_s;  // default journal commit interval; 0: 5 s (tune.warpfs --commit)
  uint32_t pad0;
  // Default mount options (tune.warpfs -E mount_opts=...; FORMAT.md "Default mount options"):
  // NUL-terminated, NUL-padded; "" in images made before it.
  char mount_opts[64];
  // The descriptor table's blocks, room to grow included (resize.warpfs; FORMAT.md
  // "Layout"): group 0 starts after them. 0 in images made before it: exactly
  // ceil(group_count / 64).
  uint32_t gdt_blocks;
  uint32_t pad1;
  uint8_t reserved[3768];
  uint64_t checksum;
};
static_assert(sizeof(Superblock) == kBlockSize);
static_assert(offsetof(Superblock, gdt_start) == 48);
static_assert(offsetof(Superblock, state) == 88);
static_assert(offsetof(Superblock, checksum_seed) == 96);
static_assert(offsetof(Superblock, label) == 120);
static_assert(offsetof(Superblock, journal_seq) == 216);
static_assert(offsetof(Superblock, reserved_blocks) == 224);
static_assert(offsetof(Superblock, commit_interval_s) == 240);
static_assert(offsetof(Superblock, mount_opts) == 248);
static_assert(offsetof(Superblock, gdt_blocks) == 312);
static_assert(offsetof(Superblock, checksum) == 4088);

// FORMAT.md "Group descriptor".
struct GroupDesc {
  uint64_t block_bitmap;
  uint64_t inode_bitmap;
  uint64_t inode_table;
  uint32_t free_blocks;
  uint32_t free_inodes;
  uint32_t used_dirs;
  // The group's reference-count table (kFeatureSharedBlocks; FORMAT.md "Shared blocks"): the
  // group-relative block of the first of its kRefcountBlocks contiguous blocks, 0 = none
  // (no block of the group is shared). 0 without the feature.
  uint32_t refcount_table;
  uint64_t block_bitmap_checksum;
  uint64_t inode_bitmap_checksum;
  uint64_t checksum;
};
static_assert(sizeof(GroupDesc) == 64);
static_assert(offsetof(GroupDesc, refcount_table) == 36);
static_assert(offsetof(GroupDesc, block_bitmap_checksum) == 40);
static_assert(offsetof(GroupDesc, checksum) == 56);
inline constexpr uint32_t kGroupDescsPerBlock = kBlockSize / sizeof(GroupDesc);
// The largest descriptor table (Superblock::gdt_blocks): 4 Mi groups, 512 TiB.
inline constexpr uint32_t kMaxGdtBlocks = 1u << 16;

// FORMAT.md "File data: extents".
struct Extent {
  uint32_t logical;
  uint32_t length;  // bit 31: unwritten (reads as zeroes)
  uint64_t physical;
  static constexpr uint32_t kUnwritten = 1u << 31;
  uint32_t blocks() const { return length & ~kUnwritten; }
  bool unwritten() const { return (length & kUnwritten) != 0; }
};
static_assert(sizeof(Extent) == 16);

// FORMAT.md "Inode".
struct Inode {
  uint32_t mode;
  uint32_t uid;
  uint32_t gid;
  uint32_t links;
  uint64_t size;
  uint64_t blocks;
  uint64_t atime_ns;
  uint64_t mtime_ns;
  uint64_t ctime_ns;
  uint64_t crtime_ns;
  uint32_t flags;
  uint32_t generation;
  uint64_t xattr_block;
  uint64_t next_orphan;
  uint32_t extent_count;
  uint32_t tree_depth;
  uint64_t dir_seed;
  union {
    Extent extents[8];
    char symlink[128];  // NUL-terminated when shorter than 128
  } root;
  uint64_t parent;  // directories: the parent directory (the root: itself); else 0
  uint64_t rdev;    // character and block devices: the device number; else 0
  uint64_t checksum;

  static constexpr uint32_t kInlineExtents = 8;
  static constexpr uint32_t kInlineSymlinkMax = 127;
  static constexpr uint32_t kFlagInlineSymlink = 1;
  static constexpr uint32_t kFlagImmutable = 4;  // chattr +i: no change at all
  static constexpr uint32_t kFlagAppend = 8;     // chattr +a: data only appended, no other change
  static constexpr uint32_t kKnownFlags = 1 | 2 | kFlagImmutable | kFlagAppend;
  bool is_free() const { return mode == 0; }
};
static_assert(sizeof(Inode) == kInodeSize);
static_assert(offsetof(Inode, flags) == 64);
static_assert(offsetof(Inode, extent_count) == 88);
static_assert(offsetof(Inode, dir_seed) == 96);
static_assert(offsetof(Inode, root) == 104);
static_assert(offsetof(Inode, parent) == 232);
static_assert(offsetof(Inode, checksum) == 248);

// FORMAT.md "Directories": the index root / index node header and entry.
struct DirIndexHeader {
  uint32_t magic;  // "WFDR"
  uint16_t count;
  uint16_t depth;  // 1: entries point at leaves; 2: at index blocks
  uint32_t capacity;
  uint32_t reserved;
  uint64_t owner;  // directory inode
  uint64_t checksum;
};
static_assert(sizeof(DirIndexHeader) == 32);
struct DirIndexEntry {
  uint64_t hash_low;
  uint32_t block;  // block index within the directory
  uint32_t reserved;
};
static_assert(sizeof(DirIndexEntry) == 16);
inline constexpr uint32_t kDirIndexMagic = 0x52444657;  // "WFDR"
inline constexpr uint32_t kDirIndexCapacity =
    (kBlockSize - sizeof(DirIndexHeader)) / sizeof(DirIndexEntry);

// FORMAT.md "Directories": a leaf block's header and entry header (name follows).
struct DirLeafHeader {
  uint32_t magic;  // "WFDL"
  uint16_t count;
  uint16_t used;  // bytes of entries after the header
  uint64_t owner;
  uint64_t reserved;
  uint64_t checksum;
};
static_assert(sizeof(DirLeafHeader) == 32);
// Packed: entries follow each other at 8-byte-rounded offsets; access them with memcpy.
struct __attribute__((packed)) DirEntryHeader {
  uint64_t hash;
  uint64_t inode;
  uint16_t rec_len;
  uint8_t name_len;
  uint8_t type;  // DT_* values
};
static_assert(sizeof(DirEntryHeader) == 20);
inline constexpr uint32_t kDirLeafMagic = 0x4c444657;  // "WFDL"

// FORMAT.md "Journal": the header in the first journal block.
struct JournalHeader {
  uint32_t magic;  // "WFJH"
  uint32_t reserved;
  uint64_t tail_block;  // journal-relative index of the oldest live transaction
  uint64_t tail_seq;
  uint8_t pad[kBlockSize - 32];
  uint64_t checksum;
};
static_assert(sizeof(JournalHeader) == kBlockSize);
inline constexpr uint32_t kJournalHeaderMagic = 0x484a4657;  // "WFJH"

// FORMAT.md "File data: extents": the header of an extent-tree block (index or leaf),
// followed by up to kExtentNodeCapacity entries: Extent at depth 0, ExtentIndex above.
struct ExtentNodeHeader {
  uint32_t magic;  // "WFEX"
  uint16_t count;
  uint16_t depth;  // 0: a leaf of extents
  uint32_t capacity;
  uint32_t reserved;
  uint64_t owner;  // the file's inode
  uint64_t checksum;
};
static_assert(sizeof(ExtentNodeHeader) == 32);
struct ExtentIndex {
  uint32_t logical;  // first file block the child maps
  uint32_t reserved;
  uint64_t child;  // block number of the child node
};
static_assert(sizeof(ExtentIndex) == 16);
inline constexpr uint32_t kExtentMagic = 0x58454657;  // "WFEX"
inline constexpr uint32_t kExtentNodeCapacity = (kBlockSize - sizeof(ExtentNodeHeader)) / 16;

// FORMAT.md "Extended attributes": the xattr block's header; entries follow from byte 32,
// each {XattrEntryHeader, name, value} rounded up to 4 bytes.
struct XattrHeader {
  uint32_t magic;  // "WFXA"
  uint16_t count;
  uint16_t used;  // bytes of entries after the header
  uint64_t owner;
  uint64_t next;  // the chain's next xattr block, 0 = the last (kFeatureXattrChain; else 0)
  uint64_t checksum;
};
static_assert(sizeof(XattrHeader) == 32);
struct XattrEntryHeader {
  uint8_t name_len;
  uint8_t name_index;  // kXattr* below: the namespace prefix, not stored in the name
  uint16_t value_len;
};
static_assert(sizeof(XattrEntryHeader) == 4);
inline constexpr uint32_t kXattrMagic = 0x41584657;  // "WFXA"
// kXattrInternal: the filesystem's own records, never listed nor reachable by a name.
enum : uint8_t {
  kXattrUser = 1,
  kXattrTrusted = 2,
  kXattrSecurity = 3,
  kXattrSystem = 4,
  kXattrInternal = 5
};
// name_index bit 7: the entry's value is an XattrValueRef (value_len = its bytes), the value
// itself in value blocks.
inline constexpr uint8_t kXattrOutOfLine = 0x80;
// Values longer than this go to value blocks (kFeatureXattrChain); shorter ones are inline.
inline constexpr uint32_t kXattrInlineMax = 2048;
inline constexpr uint32_t kXattrValueMax = 65536;  // XATTR_SIZE_MAX
// The record of an out-of-line value: `count` value blocks follow as u64 block numbers.
struct XattrValueRef {
  uint32_t size;   // bytes of the value
  uint32_t count;  // value blocks, ceil(size / kXattrValuePayload)
};
static_assert(sizeof(XattrValueRef) == 8);
// A value block: header, then up to kXattrValuePayload bytes of the value.
struct XattrValueHeader {
  uint32_t magic;  // "WFXV"
  uint32_t used;   // bytes of the value in this block
  uint64_t owner;
  uint32_t position;  // this block's index in the value's list
  uint32_t reserved;
  uint64_t checksum;
};
static_assert(sizeof(XattrValueHeader) == 32);
inline constexpr uint32_t kXattrValueMagic = 0x56584657;  // "WFXV"
inline constexpr uint32_t kXattrValuePayload = kBlockSize - sizeof(XattrValueHeader);
inline constexpr uint32_t kXattrMaxValueBlocks =
    (kXattrValueMax + kXattrValuePayload - 1) / kXattrValuePayload;

// FORMAT.md "Shared blocks": a block of a group's reference-count table. Entry k of table
// block i (u16, after the header) counts the references to the group's block
// i * kRefcountsPerBlock + k: 0 = not shared (one owner at most: the bitmap says whether
// any), n >= 2 = mapped by n written extents; 1 never appears.
struct RefcountHeader {
  uint32_t magic;  // "WFRC"
  uint32_t group;
  uint32_t index;  // this block's position in the table, 0 .. kRefcountBlocks - 1
  uint32_t reserved0;
  uint64_t reserved1;
  uint64_t checksum;
};
static_assert(sizeof(RefcountHeader) == 32);
inline constexpr uint32_t kRefcountMagic = 0x43524657;  // "WFRC"
inline constexpr uint32_t kRefcountsPerBlock = (kBlockSize - sizeof(RefcountHeader)) / 2;
inline constexpr uint32_t kRefcountBlocks =
    (kBlocksPerGroup + kRefcountsPerBlock - 1) / kRefcountsPerBlock;
inline constexpr uint32_t kMaxRefcount = 65535;

// Every header-carrying metadata block (directory index and leaf, extent node, xattr block)
// keeps its checksum at byte 24 of the block.
inline constexpr size_t kHeaderChecksumOffset = 24;
static_assert(offsetof(DirIndexHeader, checksum) == kHeaderChecksumOffset);
static_assert(offsetof(DirLeafHeader, checksum) == kHeaderChecksumOffset);
static_assert(offsetof(ExtentNodeHeader, checksum) == kHeaderChecksumOffset);
static_assert(offsetof(XattrHeader, checksum) == kHeaderChecksumOffset);
static_assert(offsetof(XattrValueHeader, checksum) == kHeaderChecksumOffset);
static_assert(offsetof(RefcountHeader, checksum) == kHeaderChecksumOffset);

// The owner inode of a header block: at byte 16 in index-shaped headers (directory index,
// extent node), at byte 8 in the others (directory leaf, xattr block, xattr value block).
inline uint64_t header_owner(const uint8_t* block) {
  uint32_t magic;
  uint64_t owner;
  __builtin_memcpy(&magic, block, 4);
  __builtin_memcpy(&owner, block + ((magic == kDirIndexMagic || magic == kExtentMagic) ? 16 : 8),
                   8);
  return owner;
}
static_assert(offsetof(DirIndexHeader, owner) == 16 && offsetof(ExtentNodeHeader, owner) == 16);
static_assert(offsetof(DirLeafHeader, owner) == 8 && offsetof(XattrHeader, owner) == 8 &&
              offsetof(XattrValueHeader, owner) == 8);

// FORMAT.md "Journal": a transaction is a descriptor, `count` blocks, and a commit. Journal
// positions are journal-relative (0 is the header) and wrap from journal_blocks-1 to 1.
struct JournalDescriptor {
  uint32_t magic;  // "WFJD"
  uint32_t count;
  uint64_t seq;
  uint64_t targets[(kBlockSize - 24) / 8];  // home block numbers of the `count` blocks
  uint64_t checksum;
};
static_assert(sizeof(JournalDescriptor) == kBlockSize);
inline constexpr uint32_t kJournalDescriptorMagic = 0x444a4657;  // "WFJD"
inline constexpr uint32_t kJournalMaxBlocks = (kBlockSize - 24) / 8;
struct JournalCommit {
  uint32_t magic;  // "WFJC"
  uint32_t count;
  uint64_t seq;
  uint64_t data_checksum;  // xxHash64 over the descriptor block then the `count` blocks
  uint8_t pad[kBlockSize - 32];
  uint64_t checksum;
};
static_assert(sizeof(JournalCommit) == kBlockSize);
inline constexpr uint32_t kJournalCommitMagic = 0x434a4657;  // "WFJC"

// xxHash64 of `len` bytes with `seed` (FORMAT.md: every metadata checksum).
uint64_t checksum(const void* data, size_t len, uint64_t seed);
// The checksum of a whole 4 KiB metadata block, its checksum field (8 bytes at
// `field_offset`) taken as zero.
uint64_t block_checksum(const void* block, size_t field_offset, uint64_t seed);
uint64_t superblock_checksum(const Superblock& sb);
// "" or why `sb` cannot describe a warpfs on a device of `dev_blocks` blocks (what mount and
// tune.warpfs accept; fsck.warpfs says more).
std::string validate_superblock(const Superblock& sb, uint64_t dev_blocks);
// The blocks of the groups' data areas: what file data and metadata blocks are taken from.
uint64_t data_blocks(const Superblock& sb);
uint64_t group_checksum(const GroupDesc& gd, uint64_t seed);
uint64_t inode_checksum(const Inode& ino, uint64_t ino_number, uint64_t seed);
// The directory hash of a name (FORMAT.md: top bit clear, 0, 1 and 2^63-1 reserved), in
// [2, kMaxNameHash].
inline constexpr uint64_t kMaxNameHash = (1ull << 63) - 2;
uint64_t name_hash(const char* name, size_t len, uint64_t dir_seed);

// FORMAT.md "Inode": a time, signed seconds since the epoch and nanoseconds 0..999999999.
struct TimeSpec {
  int64_t sec = 0;
  int64_t nsec = 0;
  bool operator==(const TimeSpec&) const = default;
};
// A time field as stored: signed nanoseconds since the epoch (two's complement in the u64
// field), strictly between the two sentinels. A sentinel means the time is out of that range
// (before 1677-09-21 or after 2262-04-11) and is exact in the inode's internal record
// (TimesRecord); which end tells the side.
inline constexpr uint64_t kTimeBelow = static_cast<uint64_t>(INT64_MIN);
inline constexpr uint64_t kTimeAbove = static_cast<uint64_t>(INT64_MAX);
inline bool time_sentinel(uint64_t stored) {
  return stored == kTimeBelow || stored == kTimeAbove;
}
// Whether a time field of d holds a sentinel: its exact time is in the internal record.
inline bool has_time_sentinel(const Inode& d) {
  return time_sentinel(d.atime_ns) || time_sentinel(d.mtime_ns) || time_sentinel(d.ctime_ns) ||
         time_sentinel(d.crtime_ns);
}
// The stored form of (sec, nsec): the nanoseconds, or the sentinel of the side it lies on.
inline uint64_t time_ns_from(int64_t sec, int64_t nsec) {
  const __int128 ns = static_cast<__int128>(sec) * 1000000000 + nsec;  // no int64 sec overflows it
  if (ns >= INT64_MAX) return kTimeAbove;
  if (ns <= INT64_MIN) return kTimeBelow;
  return static_cast<uint64_t>(static_cast<int64_t>(ns));
}
inline uint64_t time_ns_from(const TimeSpec& t) {
  return time_ns_from(t.sec, t.nsec);
}
// The seconds (floor) and nanoseconds (0..999999999) of a stored time; a sentinel reads as
// the nanosecond value it is (the nearest end), what a missing record falls back to.
inline void time_split(uint64_t stored, int64_t* sec, int64_t* nsec) {
  const int64_t ns = static_cast<int64_t>(stored);
  *sec = ns / 1000000000;
  *nsec = ns % 1000000000;
  if (*nsec < 0) {
    *nsec += 1000000000;
    *sec -= 1;
  }
}
inline TimeSpec time_split(uint64_t stored) {
  TimeSpec t;
  time_split(stored, &t.sec, &t.nsec);
  return t;
}
// The later of two stored times, compared as the signed values they are (a time before 1970
// is a large u64).
inline uint64_t time_later(uint64_t a, uint64_t b) {
  return static_cast<int64_t>(a) >= static_cast<int64_t>(b) ? a : b;
}
// A sentinel replaced by the nearest time a field holds exactly (fsck's repair of a
// sentinel without a record).
inline uint64_t time_clamped(uint64_t stored) {
  return stored == kTimeBelow ? kTimeBelow + 1 : stored == kTimeAbove ? kTimeAbove - 1 : stored;
}

// FORMAT.md "Inode": the internal xattr (kXattrInternal) "times": the exact atime, mtime,
// ctime and crtime, of which those whose field holds a sentinel count.
struct TimesRecord {
  struct Entry {
    int64_t sec;
    uint32_t nsec;
    uint32_t pad;
  } t[4];  // atime, mtime, ctime, crtime
};
static_assert(sizeof(TimesRecord) == 64);
inline constexpr const char* kTimesRecordName = "times";

// Group geometry helpers.
inline uint64_t group_of_inode(uint64_t ino, uint32_t inodes_per_group) {
  return (ino - 1) / inodes_per_group;
}

}  // namespace warpfs::fs
