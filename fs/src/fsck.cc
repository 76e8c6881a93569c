// The filesystem checker (fs/FORMAT.md "Invariants"; the contract is in fsck.h).
//
// Everything is read once, in big sequential reads where the layout allows (descriptor
// table, bitmaps, inode tables in 1 MiB chunks, each directory's blocks by extent), and
// checked against an in-memory model: one record per allocated inode with its extents,
// mapping blocks and xattr block, a bitmap of the blocks those claim, and each directory's
// entries. Repairs change the model; the write phase then rewrites exactly what changed
// (directories, mapping trees, inodes), rebuilds the bitmaps, descriptors and superblock
// from the model, and flushes. Nothing is written without `repair`; in check mode a
// committed journal is replayed into a memory overlay, so the check sees what a mount
// would see while the device stays byte-identical.
//
// Policy where FORMAT.md leaves a choice:
//  - Exit codes: check mode returns 4 when a problem was found, 0 otherwise. Repair mode
//    returns 1 when something was written (a problem fixed, the journal replayed, orphans
//    freed) and 4 when a problem could not be fixed.
//  - A dirty superblock is what a crash leaves, not a problem. Its committed transactions
//    are replayed (repair) or checked as if replayed (check mode: a notice, exit 0). Only
//    on a *clean* superblock is a committed transaction after the tail a problem (invariant
//    10). The superblock's free counts are compared only when it is clean.
//  - The orphan list is not a problem either: its inodes are reported as notices and, with
//    repair, freed (exit 1), as the next mount would. A malformed list is a problem.
//  - Unreachable inodes with links > 0 are connected to /lost+found (created if missing) as
//    "#<inode>"; allocated inodes with links 0 that are neither reachable nor orphans are
//    freed. Inodes with a bad checksum are cleared, and the entries naming them removed.
//  - A block claimed twice is kept by its first owner (the metadata area, then the lowest
//    inode); with repair each later owner gets a copy of the data.
//  - Any structural fault in a directory (bad index, bad leaf, entries out of order or out
//    of range, unreferenced blocks) is repaired by rebuilding the whole directory from the
//    entries that survive: leaves whose checksum fails still yield the entries whose hash
//    matches their name (a 63-bit check per entry).
//  - Regular files may be sparse: FORMAT.md's "size <= mapped range" is checked for
//    directories (size = blocks x 4096) and symlinks only.
#include "warpfs/fs/fsck.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "warpfs/fs/format.h"
#include "warpfs/fs/layout.h"
#include "warpfs/fs/replay.h"

namespace warpfs::fs {

namespace {

using blockdev::BlockDevice;
using blockdev::Status;

constexpr uint64_t kNoLogical = uint64_t{1} << 32;  // one past the last file block
constexpr uint64_t kHashEnd = uint64_t{1} << 63;    // above every name hash
constexpr size_t kLeafSpace = kBlockSize - sizeof(DirLeafHeader);
constexpr uint32_t kChunk = 256;  // blocks per big read: 1 MiB
constexpr uint64_t kMaxDirBlocks =
    1 + kDirIndexCapacity + uint64_t{kDirIndexCapacity} * kDirIndexCapacity;
constexpr size_t kMaxLines = 10000;

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

// A device whose writes stay in memory: check mode replays the journal into it, so the
// check sees the replayed metadata and the real device is never written.
class OverlayDevice final : public BlockDevice {
 public:
  explicit OverlayDevice(BlockDevice& d) : d_(d) {}
  uint32_t block_bytes() const override { return d_.block_bytes(); }
  uint64_t block_count() const override { return d_.block_count(); }
  Status read(uint64_t block, uint32_t count, void* buf) override {
    if (Status s = d_.read(block, count, buf); !s.is_ok()) return s;
    for (auto it = blocks_.lower_bound(block); it != blocks_.end() && it->first < block + count;
         ++it) {
      std::memcpy(static_cast<uint8_t*>(buf) + (it->first - block) * kBlockSize, it->second.data(),
                  kBlockSize);
    }
    return Status::ok();
  }
  Status write(uint64_t block, uint32_t count, const void* buf) override {
    if (Status s = check(block, count); !s.is_ok()) return s;
    const auto* p = static_cast<const uint8_t*>(buf);
    for (uint32_t i = 0; i < count; ++i) {
      blocks_[block + i].assign(p + size_t{i} * kBlockSize, p + size_t{i + 1} * kBlockSize);
    }
    return Status::ok();
  }
  Status flush() override { return Status::ok(); }
  Status trim(uint64_t, uint64_t) override { return Status::ok(); }

 private:
  BlockDevice& d_;
  std::map<uint64_t, std::vector<uint8_t>> blocks_;
};

// One directory entry as the checker keeps it.
struct Ent {
  uint64_t hash;
  uint64_t ino;
  uint8_t type;
  bool drop;  // removed by a repair
  std::string name;
};

// Leaves for `v` (sorted by hash) as [begin, end) ranges, each as full as it can be without
// splitting equal hashes (FORMAT.md "Directories"). An empty directory has one empty leaf.
std::vector<std::pair<size_t, size_t>> pack_leaves(const std::vector<Ent>& v) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t start = 0, used = 0;
  for (size_t i = 0; i < v.size();) {
    size_t j = i, group = 0;
    while (j < v.size() && v[j].hash == v[i].hash) group += rec_len(v[j++].name.size());
    if (used > 0 && used + group > kLeafSpace) {
      out.emplace_back(start, i);
      start = i;
      used = 0;
    }
    if (group <= kLeafSpace) {
      used += group;
    } else {
      // More names of one hash than a leaf holds (never seen in practice): split them.
      for (size_t k = i; k < j; ++k) {
        const size_t r = rec_len(v[k].name.size());
        if (used > 0 && used + r > kLeafSpace) {
          out.emplace_back(start, k);
          start = k;
          used = 0;
        }
        used += r;
      }
    }
    i = j;
  }
  out.emplace_back(start, v.size());
  return out;
}

class Checker {
 public:
  Checker(BlockDevice& dev, const FsckOptions& o,
          const std::function<void(const std::string&)>& report)
      : dev_(dev),
        o_(o),
        report_(report),
        overlay_(dev),
        io_(o.repair ? &dev : static_cast<BlockDevice*>(&overlay_)) {}
  FsckResult run();

 private:
  enum class State : uint8_t { kLive, kBad, kFreed };
  // A rewritten inode root (write_mapping).
  struct RootPatch {
    uint32_t count = 0, depth = 0;
    uint8_t root[sizeof(Inode::root)] = {};
  };
  struct Info {
    uint64_t ino = 0;
    uint32_t mode = 0, links = 0, flags = 0;
    uint64_t size = 0, blocks = 0, parent = 0, next_orphan = 0, xattr = 0, dir_seed = 0;
    std::vector<Extent> ext;     // sorted by logical, non-overlapping
    std::vector<uint64_t> tree;  // extent-tree blocks
    std::unique_ptr<RootPatch> root;
    State state = State::kLive;
    bool on_orphan_list = false;
    bool dirty = false;    // the inode is rewritten
    bool remap = false;    // its extent tree is rewritten from `ext`
    bool rebuild = false;  // directories: rewritten from their entries
    bool fresh = false;    // created by the checker (root, lost+found)
    bool reached = false;
    uint32_t names = 0, subdirs = 0;  // pass 4
    uint64_t namer = 0;               // directories: the directory whose entry names it
  };

  // --- reporting
  void problem(const std::string& line, const std::string& fix = "") {
    ++res_.problems;
    std::string s = line;
    if (o_.repair) {
      if (fix.empty()) {
        ++uncorrected_;
      } else {
        ++res_.corrected;
        s += ": " + fix;
      }
    }
    if (res_.lines.size() < kMaxLines) res_.lines.push_back(s);
    if (report_) report_(s);
  }
  void unfixable(const std::string& line) {
    ++res_.problems;
    ++uncorrected_;
    if (res_.lines.size() < kMaxLines) res_.lines.push_back(line);
    if (report_) report_(line);
  }
  void notice(const std::string& line) {
    if (report_) report_(line);
  }
  void verbose(const std::string& line) {
    if (o_.verbose && report_) report_(line);
  }
  bool fail(const std::string& why) {
    if (error_.empty()) error_ = why;
    return false;
  }
  bool failed() const { return !error_.empty(); }

  // --- I/O: reads through the overlay in check mode; writes only with repair.
  bool read(uint64_t b, uint64_t n, void* buf) {
    auto* p = static_cast<uint8_t*>(buf);
    for (uint64_t done = 0; done < n;) {
      const auto k = static_cast<uint32_t>(std::min<uint64_t>(kChunk, n - done));
      if (Status s = io_->read(b + done, k, p + done * kBlockSize); !s.is_ok()) {
        std::memset(p + done * kBlockSize, 0, size_t{k} * kBlockSize);
        return fail("cannot read block " + num(b + done) + ": " + s.to_string());
      }
      done += k;
    }
    return true;
  }
  bool write(uint64_t b, uint64_t n, const void* buf) {
    if (!o_.repair) return fail("internal error: a write in check mode");
    const auto* p = static_cast<const uint8_t*>(buf);
    for (uint64_t done = 0; done < n;) {
      const auto k = static_cast<uint32_t>(std::min<uint64_t>(kChunk, n - done));
      if (Status s = dev_.write(b + done, k, p + done * kBlockSize); !s.is_ok()) {
        return fail("cannot write block " + num(b + done) + ": " + s.to_string());
      }
      done += k;
    }
    written_ = true;
    return true;
  }

  Info* info(uint64_t ino) {
    if (ino == 0 || ino > L_.inode_count) return nullptr;
    const uint32_t s = slot_[ino];
    return s ? &infos_[s - 1] : nullptr;
  }
  size_t index_of(const Info& n) const { return static_cast<size_t>(&n - infos_.data()); }
  static bool is_dir(const Info& n) { return S_ISDIR(n.mode); }
  // A directory whose entries count: allocated, sound, not on its way out.
  static bool dir_live(const Info& n) {
    return S_ISDIR(n.mode) && n.state == State::kLive && !n.on_orphan_list;
  }
  std::string iname(const Info& n) const {
    return (is_dir(n) ? "directory " : "inode ") + num(n.ino);
  }

  // --- block claims
  bool claimed(uint64_t b) const { return (claimed_[b / 64] >> (b % 64)) & 1; }
  void claim(uint64_t first, uint64_t n);
  template <typename F>
  void for_each_claim(const Info& n, F f) const;

  // --- passes
  bool load_superblock();
  bool find_backup(Superblock* out, uint64_t* at);
  bool check_journal();
  bool replay();
  void load_groups();
  void pass1();
  void check_inode(uint64_t ino, const Inode& d);
  struct Walk {
    std::vector<Extent> ext;
    std::vector<uint64_t> tree;
    uint64_t prev_end = 0;
    bool changed = false;
  };
  void walk_leaf(Walk& w, const Extent* e, uint32_t count, uint64_t lo, uint64_t hi,
                 const std::string& where);
  void walk_index(const Info& n, Walk& w, const ExtentIndex* e, uint32_t count,
                  uint16_t child_depth, uint64_t lo, uint64_t hi, const std::string& where);
  void walk_node(const Info& n, Walk& w, uint64_t block, uint16_t depth, uint64_t lo, uint64_t hi);
  std::string check_xattr(const Info& n, uint64_t block);
  void orphan_list();
  static bool orphan_truncated(const Info& d);
  static uint64_t mapped_end(const Info& d);
  void pass1b();
  void pass2();
  void scan_dir(Info& d, std::vector<Ent>& out);
  void resolve_entries();
  void pass3();
  void reach(Info& start);
  Info* lost_found();
  void connect(Info& n, bool loop);
  Info* make_directory(uint64_t ino, uint64_t parent);
  void pass4();
  void check_groups();
  // --- repair
  bool alloc(uint64_t want, uint64_t* first, uint64_t* got);
  uint64_t alloc_inode();
  bool copy_blocks(uint64_t from, uint64_t to, uint64_t n);
  void write_directory(Info& d);
  void write_mapping(Info& n);
  bool write_node(uint64_t block, uint16_t depth, const void* entries, size_t count,
                  uint64_t owner);
  void write_inodes();
  void build_bitmaps(std::vector<std::vector<uint8_t>>* bb, std::vector<std::vector<uint8_t>>* ib,
                     std::vector<uint32_t>* dirs);
  void write_groups();
  void reset_journal();
  void write_superblock();
  void summarize();

  BlockDevice& dev_;
  const FsckOptions& o_;
  const std::function<void(const std::string&)>& report_;
  OverlayDevice overlay_;
  BlockDevice* io_;
  FsckResult res_;
  uint64_t uncorrected_ = 0, orphans_freed_ = 0;
  bool written_ = false;
  std::string error_;

  std::unique_ptr<Superblock> sb_ = std::make_unique<Superblock>();
  Layout L_;
  bool used_backup_ = false, primary_bad_ = false, backup_bad_ = false, journal_header_bad_ = false;
  ReplayResult pending_;

  std::vector<GroupDesc> gd_;
  std::vector<uint8_t> gdt_raw_;
  std::vector<bool> gd_ok_, bb_ok_, ib_ok_;
  std::vector<std::vector<uint8_t>> bb_, ib_;

  std::vector<uint64_t> claimed_, found_claims_, dups_;
  std::vector<Info> infos_;
  size_t found_infos_ = 0;  // infos_ as pass 1 found them (the rest are created)
  std::vector<uint32_t> slot_;
  std::vector<std::vector<Ent>> ents_;
  std::vector<uint32_t> extra_names_;  // check mode: names /lost+found would give
  uint64_t lost_found_ = 0;
  uint32_t alloc_group_ = 0;
};

// --- block claims ------------------------------------------------------------------------

// Marks [first, first + n) claimed; blocks claimed before are noted for pass 1B.
void Checker::claim(uint64_t first, uint64_t n) {
  for (uint64_t b = first; b < first + n;) {
    const uint64_t w = b / 64, bit = b % 64, take = std::min<uint64_t>(64 - bit, first + n - b);
    const uint64_t mask = (take == 64 ? ~uint64_t{0} : ((uint64_t{1} << take) - 1)) << bit;
    if (uint64_t both = claimed_[w] & mask; both != 0) {
      for (; both != 0; both &= both - 1)
        dups_.push_back(w * 64 + static_cast<uint64_t>(std::countr_zero(both)));
    }
    claimed_[w] |= mask;
    b += take;
  }
}

// Calls f(first, count, kind) for every block range `n` owns, in a fixed order: the xattr
// block, the extent-tree blocks, the extents (kind 0, 1, 2).
template <typename F>
void Checker::for_each_claim(const Info& n, F f) const {
  if (n.xattr) f(n.xattr, uint64_t{1}, 0);
  for (uint64_t b : n.tree) f(b, uint64_t{1}, 1);
  for (const Extent& e : n.ext) f(e.physical, uint64_t{e.blocks()}, 2);
}

// --- pass 0: the superblock --------------------------------------------------------------

bool Checker::find_backup(Superblock* out, uint64_t* at) {
  // The backup is the last block of the filesystem: at the device's end, or up to a group
  // earlier when mkfs left a partial group out.
  const uint64_t dev_blocks = dev_.block_count();
  std::vector<uint8_t> chunk(size_t{kChunk} * kBlockSize);
  for (uint64_t end = dev_blocks; end > 1 && dev_blocks - end <= kBlocksPerGroup + kChunk;) {
    const uint64_t n = std::min<uint64_t>(kChunk, end - 1);
    if (!read(end - n, n, chunk.data())) return false;
    for (uint64_t i = n; i-- > 0;) {
      std::memcpy(out, chunk.data() + i * kBlockSize, kBlockSize);
      if (out->magic == kMagic && superblock_problem(*out, dev_blocks).empty() &&
          out->block_count == end - n + i + 1) {
        *at = end - n + i;
        return true;
      }
    }
    end -= n;
  }
  return false;
}

bool Checker::load_superblock() {
  const uint64_t dev_blocks = dev_.block_count();
  if (!read(0, 1, sb_.get())) return false;
  const std::string why = superblock_problem(*sb_, dev_blocks);
  if (why.empty()) {
    auto backup = std::make_unique<Superblock>();
    if (!read(sb_->block_count - 1, 1, backup.get())) return false;
    std::string bwhy = superblock_problem(*backup, dev_blocks);
    if (bwhy.empty() && !same_filesystem(*backup, *sb_))
      bwhy = "it does not match the primary's geometry";
    if (!bwhy.empty()) {
      backup_bad_ = true;
      problem("backup superblock (block " + num(sb_->block_count - 1) + "): " + bwhy,
              "rewritten from the primary");
    }
    return true;
  }
  uint64_t at = 0;
  auto backup = std::make_unique<Superblock>();
  if (!find_backup(backup.get(), &at)) {
    if (failed()) return false;
    return fail(
        why == "no warpfs magic"
            ? "not a warpfs filesystem (no superblock at block 0 and no backup near the end)"
            : "the superblock (block 0) is damaged (" + why + ") and no valid backup was found");
  }
  *sb_ = *backup;
  used_backup_ = primary_bad_ = true;
  res_.used_backup = true;
  problem("superblock (block 0): " + why + "; using the backup at block " + num(at),
          "restored from the backup");
  return true;
}

// --- the journal -------------------------------------------------------------------------

bool Checker::check_journal() {
  auto jh = std::make_unique<JournalHeader>();
  if (!read(1, 1, jh.get())) return false;
  std::string why;
  if (jh->magic != kJournalHeaderMagic) {
    why = "bad magic";
  } else if (jh->checksum !=
             block_checksum(jh.get(), offsetof(JournalHeader, checksum), sb_->checksum_seed)) {
    why = "checksum mismatch";
  } else if (jh->tail_block == 0 || jh->tail_block >= sb_->journal_blocks) {
    why = "tail " + num(jh->tail_block) + " lies outside the journal";
  }
  if (!why.empty()) {
    journal_header_bad_ = true;
    problem("journal header (block 1): " + why, "reset (the journal is emptied, nothing replayed)");
    return true;
  }
  if (Status s = replay_journal(*io_, *sb_, /*dry_run=*/true, &pending_); !s.is_ok()) {
    return fail("journal scan failed: " + s.to_string());
  }
  return true;
}

bool Checker::replay() {
  if (journal_header_bad_ || pending_.transactions == 0) return true;
  const uint64_t n = pending_.transactions;
  const std::string what = num(n) + " committed transaction" + (n == 1 ? "" : "s") + " (" +
                           num(pending_.blocks) + " blocks)";
  // Invariant 10: a clean unmount leaves the journal empty. A crash leaves it as it is.
  const bool clean = sb_->state == kStateClean && !used_backup_;
  if (!o_.replay_journal) {
    if (o_.repair) {
      JournalHeader jh{};
      jh.magic = kJournalHeaderMagic;
      jh.tail_block = pending_.next_pos;
      jh.tail_seq = pending_.next_seq;
      jh.checksum = block_checksum(&jh, offsetof(JournalHeader, checksum), sb_->checksum_seed);
      problem("journal: " + what + " not replayed", "discarded");
      return write(1, 1, &jh) && dev_.flush().is_ok();
    }
    if (clean) {
      problem("journal: " + what + " after the tail of a cleanly unmounted filesystem");
    } else {
      notice("journal: " + what + " pending, not replayed: the filesystem is checked as found");
    }
    return true;
  }
  ReplayResult rr;
  if (Status s = replay_journal(*io_, *sb_, /*dry_run=*/false, &rr); !s.is_ok()) {
    return fail("journal replay failed: " + s.to_string());
  }
  res_.journal_transactions = rr.transactions;
  if (clean) {
    problem("journal: " + what + " after the tail of a cleanly unmounted filesystem", "replayed");
  } else if (o_.repair) {
    notice("journal: replayed " + what);
  } else {
    notice("journal: " + what + " not replayed yet (a mount replays them): checked as if replayed");
  }
  if (o_.repair) written_ = true;
  // The superblock may have been among the blocks.
  auto again = std::make_unique<Superblock>();
  if (!read(0, 1, again.get())) return false;
  if (superblock_problem(*again, dev_.block_count()).empty() && same_filesystem(*again, *sb_)) {
    if (used_backup_) notice("superblock (block 0): restored by the journal replay");
    *sb_ = *again;
    used_backup_ = primary_bad_ = false;
  }
  return true;
}

// --- group descriptors and bitmaps -------------------------------------------------------

void Checker::load_groups() {
  const uint32_t G = L_.groups;
  gdt_raw_.assign(L_.gdt_blocks * kBlockSize, 0);
  if (!read(L_.gdt_start, L_.gdt_blocks, gdt_raw_.data())) return;
  gd_.resize(G);
  gd_ok_.assign(G, false);
  bb_ok_.assign(G, false);
  ib_ok_.assign(G, false);
  bb_.assign(G, std::vector<uint8_t>(kBlockSize));
  ib_.assign(G, std::vector<uint8_t>(kBlockSize));
  std::vector<uint8_t> two(2 * kBlockSize);
  for (uint32_t g = 0; g < G; ++g) {
    GroupDesc& d = gd_[g];
    std::memcpy(&d, gdt_raw_.data() + size_t{g} * sizeof d, sizeof d);
    const std::string where = "group " + num(g);
    const uint64_t start = L_.group_start(g);
    gd_ok_[g] = d.checksum == group_checksum(d, L_.seed);
    if (!gd_ok_[g]) {
      problem(where + ": descriptor checksum mismatch", "rewritten");
    } else if (d.block_bitmap != start || d.inode_bitmap != start + 1 ||
               d.inode_table != start + 2) {
      problem(where + ": descriptor points at blocks " + num(d.block_bitmap) + ", " +
                  num(d.inode_bitmap) + ", " + num(d.inode_table) + ", expected " + num(start) +
                  ", " + num(start + 1) + ", " + num(start + 2),
              "rewritten");
    } else if (d.flags != 0) {
      problem(where + ": descriptor flags " + num(d.flags) + " (reserved, 0)", "cleared");
    }
    // The bitmaps sit at the group's start whatever the descriptor says (FORMAT.md "Layout").
    if (!read(start, 2, two.data())) return;
    std::memcpy(bb_[g].data(), two.data(), kBlockSize);
    std::memcpy(ib_[g].data(), two.data() + kBlockSize, kBlockSize);
    if (!gd_ok_[g]) continue;  // no checksums to compare with: the bitmaps are not trusted
    bb_ok_[g] = checksum(bb_[g].data(), kBlockSize, L_.seed) == d.block_bitmap_checksum;
    ib_ok_[g] = checksum(ib_[g].data(), kBlockSize, L_.seed) == d.inode_bitmap_checksum;
    if (!bb_ok_[g])
      problem(where + ": block bitmap (block " + num(start) + ") checksum mismatch", "rebuilt");
    if (!ib_ok_[g])
      problem(where + ": inode bitmap (block " + num(start + 1) + ") checksum mismatch", "rebuilt");
  }
}

// --- pass 1: inodes, extent trees, xattr blocks ------------------------------------------

void Checker::pass1() {
  slot_.assign(L_.inode_count + 1, 0);
  claimed_.assign(div_up(L_.block_count, 64), 0);
  // The metadata area owns its blocks first.
  claim(0, L_.first_group);
  for (uint32_t g = 0; g < L_.groups; ++g) claim(L_.group_start(g), 2 + uint64_t{L_.itb});
  claim(L_.block_count - 1, 1);
  std::vector<uint8_t> buf(size_t{kChunk} * kBlockSize);
  for (uint32_t g = 0; g < L_.groups && !failed(); ++g) {
    for (uint32_t t = 0; t < L_.itb; t += kChunk) {
      const uint32_t n = std::min(kChunk, L_.itb - t);
      if (!read(L_.group_start(g) + 2 + t, n, buf.data())) return;
      for (uint32_t k = 0; k < n * kInodesPerBlock; ++k) {
        const uint64_t ino = uint64_t{g} * L_.ipg + uint64_t{t} * kInodesPerBlock + k + 1;
        Inode d;
        std::memcpy(&d, buf.data() + size_t{k} * kInodeSize, sizeof d);
        if (d.mode != 0) check_inode(ino, d);  // mode 0: free, whatever else the slot holds
      }
    }
    if (o_.progress) o_.progress(g + 1, L_.groups);
  }
  found_infos_ = infos_.size();
  found_claims_ = claimed_;
  ents_.resize(infos_.size());
  // Room for what the repairs may create (root, lost+found) without moving the records.
  infos_.reserve(infos_.size() + 4);
  ents_.reserve(infos_.size() + 4);
  uint64_t dirs = 0;
  for (const Info& n : infos_) dirs += is_dir(n);
  verbose("pass 1: " + num(infos_.size()) + " inodes in use (" + num(dirs) + " directories)");
}

void Checker::check_inode(uint64_t ino, const Inode& d) {
  infos_.emplace_back();
  slot_[ino] = static_cast<uint32_t>(infos_.size());
  Info& n = infos_.back();
  n.ino = ino;
  n.mode = d.mode;
  n.links = d.links;
  n.flags = d.flags;
  n.size = d.size;
  n.blocks = d.blocks;
  n.parent = d.parent;
  n.next_orphan = d.next_orphan;
  n.xattr = d.xattr_block;
  n.dir_seed = d.dir_seed;
  const std::string where = "inode " + num(ino);
  if (d.checksum != inode_checksum(d, ino, L_.seed)) {
    n.state = State::kBad;
    problem(where + ": checksum mismatch", "cleared");
    return;
  }
  if (!valid_type(d.mode)) {
    n.state = State::kBad;
    char m[16];
    std::snprintf(m, sizeof m, "0%o", d.mode);
    problem(where + ": invalid mode " + m, "cleared");
    return;
  }
  const bool lnk = S_ISLNK(d.mode);
  if (n.flags & ~Inode::kKnownFlags) {
    problem(where + ": unknown flags " + num(n.flags), "cleared");
    n.flags &= Inode::kKnownFlags;
    n.dirty = true;
  }
  if ((n.flags & Inode::kFlagInlineSymlink) && !lnk) {
    problem(where + ": the inline-symlink flag is set on " + type_name(d.mode), "cleared");
    n.flags &= ~Inode::kFlagInlineSymlink;
    n.dirty = true;
  }
  if (!is_dir(n) && n.parent != 0) {
    problem(where + ": parent field " + num(n.parent) + " on " + type_name(d.mode), "set to 0");
    n.parent = 0;
    n.dirty = true;
  }
  if (lnk && (n.flags & Inode::kFlagInlineSymlink)) {
    // FORMAT.md "Names, links and the orphan list": up to 127 bytes in the inode.
    if (d.size == 0 || d.size > Inode::kInlineSymlinkMax || d.extent_count != 0 ||
        d.tree_depth != 0 || strnlen(d.root.symlink, sizeof d.root.symlink) < d.size) {
      n.state = State::kBad;
      problem(where + ": malformed inline symlink (" + num(d.size) + " bytes)", "cleared");
      return;
    }
  } else {
    Walk w;
    if (d.tree_depth == 0) {
      uint32_t count = d.extent_count;
      if (count > Inode::kInlineExtents) {
        problem(where + ": " + num(count) + " inline extents (at most 8)",
                "extents past the 8th removed");
        count = Inode::kInlineExtents;
        w.changed = true;
      }
      Extent e[Inode::kInlineExtents];
      std::memcpy(e, d.root.extents, sizeof e);
      walk_leaf(w, e, count, 0, kNoLogical, where);
    } else if (d.tree_depth <= 2) {
      uint32_t count = d.extent_count;
      if (count == 0 || count > Inode::kInlineExtents) {
        problem(where + ": extent tree root with " + num(count) + " entries (1 to 8)",
                "tree rebuilt");
        count = std::min(count, Inode::kInlineExtents);
        w.changed = true;
      }
      ExtentIndex e[Inode::kInlineExtents];
      std::memcpy(e, d.root.extents, sizeof e);
      walk_index(n, w, e, count, static_cast<uint16_t>(d.tree_depth - 1), 0, kNoLogical, where);
    } else {
      problem(where + ": extent tree depth " + num(d.tree_depth) + " (at most 2)",
              "mapping cleared");
      w.changed = true;
    }
    if (lnk) {
      const bool one_block = w.ext.size() == 1 && w.ext[0].logical == 0 && w.ext[0].blocks() == 1 &&
                             !w.ext[0].unwritten() && w.tree.empty();
      // With links 0 (an orphan the mount is freeing), its block may be gone already: the
      // mount truncates an inode in transactions of its own before freeing it.
      const bool freeing = d.links == 0 && w.ext.empty() && w.tree.empty();
      if (!freeing && (!one_block || d.size == 0 || d.size >= kBlockSize)) {
        n.state = State::kBad;
        problem(where + ": malformed symlink (" + num(d.size) + " bytes, " + num(w.ext.size()) +
                    " extents)",
                "cleared");
        return;
      }
    }
    n.ext = std::move(w.ext);
    n.tree = std::move(w.tree);
    if (w.changed) n.remap = n.dirty = true;
  }
  if (n.xattr != 0) {
    if (const std::string why = check_xattr(n, n.xattr); !why.empty()) {
      problem(where + ": xattr block " + num(n.xattr) + ": " + why,
              "detached (its attributes are lost)");
      n.xattr = 0;
      n.dirty = true;
    }
  }
  uint64_t blocks = n.tree.size() + (n.xattr ? 1 : 0);
  for (const Extent& e : n.ext) blocks += e.blocks();
  if (blocks != n.blocks) {
    if (!n.remap && n.xattr == d.xattr_block) {
      problem(where + ": blocks " + num(n.blocks) + ", but " + num(blocks) + " are allocated",
              "set to " + num(blocks));
    }
    n.blocks = blocks;
    n.dirty = true;
  }
  for_each_claim(n, [&](uint64_t first, uint64_t count, int) { claim(first, count); });
}

// Extents of one node (the inode's root or a leaf block) covering [lo, hi): kept in
// `w.ext` when sound, reported and dropped when not.
void Checker::walk_leaf(Walk& w, const Extent* e, uint32_t count, uint64_t lo, uint64_t hi,
                        const std::string& where) {
  for (uint32_t i = 0; i < count; ++i) {
    const Extent x = e[i];
    const uint64_t end = uint64_t{x.logical} + x.blocks();
    std::string why;
    if (x.blocks() == 0) {
      why = "is empty";
    } else if (end > kNoLogical) {
      why = "maps past the 16 TiB limit";
    } else if (x.physical == 0 || x.physical >= L_.block_count ||
               x.blocks() > L_.block_count - x.physical) {
      why = "lies outside the filesystem (blocks 1-" + num(L_.block_count - 1) + ")";
    } else if (x.logical < w.prev_end) {
      why = "overlaps or precedes the extent before it";
    }
    if (!why.empty()) {
      problem(where + ": extent " + extent_str(x) + " " + why, "removed");
      w.changed = true;
      continue;
    }
    if (x.logical < lo || end > hi) {
      problem(where + ": extent " + extent_str(x) + " lies outside its index entry's range",
              "tree rebuilt");
      w.changed = true;
    }
    w.ext.push_back(x);
    w.prev_end = end;
  }
}

void Checker::walk_index(const Info& n, Walk& w, const ExtentIndex* e, uint32_t count,
                         uint16_t child_depth, uint64_t lo, uint64_t hi, const std::string& where) {
  bool ordered = true;
  if (count > 0 && e[0].logical != lo) {
    problem(where + ": the first index entry starts at " + num(e[0].logical) + ", not " + num(lo),
            "tree rebuilt");
    w.changed = true;
  }
  for (uint32_t i = 1; i < count; ++i) {
    if (e[i].logical <= e[i - 1].logical || e[i].logical >= hi) ordered = false;
  }
  if (!ordered) {
    problem(where + ": index entries are out of order", "tree rebuilt");
    w.changed = true;
  }
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t clo = ordered && i > 0 ? e[i].logical : lo;
    const uint64_t chi = ordered && i + 1 < count ? e[i + 1].logical : hi;
    walk_node(n, w, e[i].child, child_depth, clo, chi);
  }
}

void Checker::walk_node(const Info& n, Walk& w, uint64_t block, uint16_t depth, uint64_t lo,
                        uint64_t hi) {
  const std::string where = "inode " + num(n.ino) + ": extent tree block " + num(block);
  if (!L_.is_data(block)) {
    problem(where + " lies outside the data area", "dropped (the extents under it are lost)");
    w.changed = true;
    return;
  }
  if (std::find(w.tree.begin(), w.tree.end(), block) != w.tree.end()) {
    problem(where + " is referenced twice", "tree rebuilt");
    w.changed = true;
    return;
  }
  std::vector<uint8_t> buf(kBlockSize);
  if (!read(block, 1, buf.data())) return;
  ExtentNodeHeader h;
  std::memcpy(&h, buf.data(), sizeof h);
  std::string why;
  if (h.magic != kExtentMagic) {
    why = "bad magic";
  } else if (h.owner != n.ino) {
    why = "owned by inode " + num(h.owner);
  } else if (h.checksum != block_checksum(buf.data(), kHeaderChecksumOffset, L_.seed)) {
    why = "checksum mismatch";
  } else if (h.depth != depth) {
    why = "depth " + num(h.depth) + ", expected " + num(depth);
  } else if (h.count == 0 || h.count > kExtentNodeCapacity) {
    why = num(h.count) + " entries (1 to " + num(kExtentNodeCapacity) + ")";
  }
  if (!why.empty()) {
    problem(where + ": " + why, "dropped (the extents under it are lost)");
    w.changed = true;
    return;
  }
  w.tree.push_back(block);
  if (depth == 0) {
    std::vector<Extent> e(h.count);
    std::memcpy(e.data(), buf.data() + sizeof h, e.size() * sizeof(Extent));
    walk_leaf(w, e.data(), h.count, lo, hi, where);
  } else {
    std::vector<ExtentIndex> e(h.count);
    std::memcpy(e.data(), buf.data() + sizeof h, e.size() * sizeof(ExtentIndex));
    walk_index(n, w, e.data(), h.count, static_cast<uint16_t>(depth - 1), lo, hi, where);
  }
}

// "" or what is wrong with the xattr block (FORMAT.md "Extended attributes").
std::string Checker::check_xattr(const Info& n, uint64_t block) {
  if (!L_.is_data(block)) return "lies outside the data area";
  std::vector<uint8_t> buf(kBlockSize);
  if (!read(block, 1, buf.data())) return "unreadable";
  XattrHeader h;
  std::memcpy(&h, buf.data(), sizeof h);
  if (h.magic != kXattrMagic) return "bad magic";
  if (h.owner != n.ino) return "owned by inode " + num(h.owner);
  if (h.checksum != block_checksum(buf.data(), kHeaderChecksumOffset, L_.seed))
    return "checksum mismatch";
  if (sizeof h + h.used > kBlockSize) return "used bytes " + num(h.used) + " overflow the block";
  const size_t end = sizeof h + h.used;
  size_t off = sizeof h;
  for (uint16_t i = 0; i < h.count; ++i) {
    XattrEntryHeader e;
    if (off + sizeof e > end) return "entry " + num(i) + " runs past the used bytes";
    std::memcpy(&e, buf.data() + off, sizeof e);
    if (e.name_len == 0 || e.name_index < kXattrUser || e.name_index > kXattrSystem) {
      return "entry " + num(i) + " is malformed";
    }
    off += (sizeof e + e.name_len + e.value_len + 3) & ~size_t{3};
    if (off > end) return "entry " + num(i) + " runs past the used bytes";
  }
  if (off != end) return num(h.count) + " entries end at byte " + num(off) + ", not " + num(end);
  return "";
}

// The orphan list: superblock.orphan_head -> next_orphan -> ... -> 0, every inode on it
// allocated with links 0. A list that breaks off is cut there.
void Checker::orphan_list() {
  uint64_t cur = sb_->orphan_head;
  std::string prev = "the superblock";
  std::unordered_set<uint64_t> seen;
  while (cur != 0) {
    Info* n = info(cur);
    std::string why;
    if (cur > L_.inode_count) {
      why = "names inode " + num(cur) + ", which does not exist";
    } else if (n == nullptr) {
      why = "names free inode " + num(cur);
    } else if (n->state != State::kLive) {
      why = "names inode " + num(cur) + ", which is corrupt";
    } else if (!seen.insert(cur).second) {
      why = "loops back to inode " + num(cur);
    } else if (cur == kRootInode) {
      why = "names the root directory";
    }
    if (!why.empty()) {
      problem("orphan list: " + prev + " " + why, "the list is cut there");
      return;
    }
    if (n->links != 0) {
      problem("orphan list: inode " + num(cur) + " has link count " + num(n->links) +
                  " (0 on the list)",
              "taken off the list");
      n->dirty = true;
    } else {
      n->on_orphan_list = true;
    }
    prev = "inode " + num(cur);
    cur = n->next_orphan;
  }
}

// --- pass 1B: blocks with several owners -------------------------------------------------

void Checker::pass1b() {
  if (dups_.empty()) return;
  std::sort(dups_.begin(), dups_.end());
  dups_.erase(std::unique(dups_.begin(), dups_.end()), dups_.end());
  // owners[i]: who claims dups_[i], in claim order; 0 is the metadata area.
  std::vector<std::vector<uint64_t>> owners(dups_.size());
  for (size_t i = 0; i < dups_.size(); ++i) {
    if (!L_.is_data(dups_[i])) owners[i].push_back(0);
  }
  auto each_dup = [&](uint64_t first, uint64_t count, const auto& f) {
    for (auto it = std::lower_bound(dups_.begin(), dups_.end(), first);
         it != dups_.end() && *it < first + count; ++it) {
      f(static_cast<size_t>(it - dups_.begin()));
    }
  };
  for (size_t k = 0; k < found_infos_; ++k) {
    const Info& n = infos_[k];
    if (n.state != State::kLive) continue;
    for_each_claim(n, [&](uint64_t first, uint64_t count, int) {
      each_dup(first, count, [&](size_t i) { owners[i].push_back(n.ino); });
    });
  }
  auto owner_name = [&](uint64_t o, uint64_t block) {
    return o == 0 ? L_.metadata_name(block) : "inode " + num(o);
  };
  for (size_t i = 0; i < dups_.size();) {
    size_t j = i + 1;
    while (j < dups_.size() && dups_[j] == dups_[j - 1] + 1 && owners[j] == owners[i]) ++j;
    std::string who;
    for (size_t k = 0; k < owners[i].size(); ++k) {
      who += (k == 0                      ? ""
              : k + 1 == owners[i].size() ? " and "
                                          : ", ") +
             owner_name(owners[i][k], dups_[i]);
    }
    problem(span_str("block", dups_[i], dups_[j - 1]) + ": owned by " + who,
            "each later owner gets a copy");
    i = j;
  }
  if (!o_.repair) return;
  // The first owner keeps each block; every later claim is moved to a copy.
  std::vector<bool> taken(dups_.size());
  for (size_t i = 0; i < dups_.size(); ++i) taken[i] = !owners[i].empty() && owners[i][0] == 0;
  for (size_t k = 0; k < found_infos_ && !failed(); ++k) {
    Info& n = infos_[k];
    if (n.state != State::kLive) continue;
    // A block of this claim that must move, taking the block for the first claimant.
    auto must_move = [&](uint64_t b) {
      auto it = std::lower_bound(dups_.begin(), dups_.end(), b);
      if (it == dups_.end() || *it != b) return false;
      const auto i = static_cast<size_t>(it - dups_.begin());
      if (!taken[i]) {
        taken[i] = true;
        return false;
      }
      return true;
    };
    if (n.xattr && must_move(n.xattr)) {
      uint64_t to, got;
      if (!alloc(1, &to, &got) || !copy_blocks(n.xattr, to, 1)) {
        unfixable("inode " + num(n.ino) + ": no free block to copy its xattr block to");
      } else {
        n.xattr = to;
        n.dirty = true;
      }
    }
    for (size_t t = 0; t < n.tree.size();) {
      if (must_move(n.tree[t])) {
        n.tree.erase(n.tree.begin() + static_cast<long>(t));  // write_mapping allocates another
        n.remap = n.dirty = true;
      } else {
        ++t;
      }
    }
    std::vector<Extent> out;
    bool moved = false;
    for (const Extent& e : n.ext) {
      auto first_dup = std::lower_bound(dups_.begin(), dups_.end(), e.physical);
      if (first_dup == dups_.end() || *first_dup >= e.physical + e.blocks()) {
        out.push_back(e);
        continue;
      }
      // Split e into runs that stay and runs that move.
      uint64_t run_start = 0;
      bool run_moves = false;
      auto flush_run = [&](uint64_t from, uint64_t to_excl) {
        if (from == to_excl) return;
        const uint32_t flag = e.length & Extent::kUnwritten;
        if (!run_moves) {
          out.push_back(Extent{static_cast<uint32_t>(e.logical + from),
                               static_cast<uint32_t>(to_excl - from) | flag, e.physical + from});
          return;
        }
        moved = true;
        for (uint64_t at = from; at < to_excl;) {
          uint64_t dst, got;
          if (!alloc(to_excl - at, &dst, &got)) {
            unfixable("inode " + num(n.ino) + ": no free blocks to copy shared blocks to");
            out.push_back(Extent{static_cast<uint32_t>(e.logical + at),
                                 static_cast<uint32_t>(to_excl - at) | flag, e.physical + at});
            return;
          }
          if (!e.unwritten() && !copy_blocks(e.physical + at, dst, got)) return;
          out.push_back(Extent{static_cast<uint32_t>(e.logical + at),
                               static_cast<uint32_t>(got) | flag, dst});
          at += got;
        }
      };
      for (uint64_t b = 0; b < e.blocks(); ++b) {
        const bool mv = must_move(e.physical + b);
        if (b == 0) {
          run_moves = mv;
        } else if (mv != run_moves) {
          flush_run(run_start, b);
          run_start = b;
          run_moves = mv;
        }
      }
      flush_run(run_start, e.blocks());
    }
    if (moved) {
      n.ext = std::move(out);
      n.remap = n.dirty = true;
    }
  }
}

// --- pass 2: directories -----------------------------------------------------------------

void Checker::pass2() {
  uint64_t entries = 0;
  for (size_t k = 0; k < found_infos_ && !failed(); ++k) {
    Info& d = infos_[k];
    if (d.state != State::kLive || !is_dir(d)) continue;
    if (d.on_orphan_list && orphan_truncated(d)) continue;  // being freed: nothing to read
    scan_dir(d, ents_[k]);
    entries += ents_[k].size();
    if (d.on_orphan_list && !ents_[k].empty()) {
      problem("directory " + num(d.ino) + ": on the orphan list, but it has " +
                  num(ents_[k].size()) + " entries",
              "they go with it");
    }
  }
  verbose("pass 2: " + num(entries) + " directory entries");
  resolve_entries();
}

// An orphan directory that the mount had begun to free: it truncates the inode in
// transactions of its own (the inode stays on the orphan list until the last one), so its
// mapping may end short of its size.
bool Checker::orphan_truncated(const Info& d) {
  return mapped_end(d) < d.size / kBlockSize;
}

// One past the last logical block d's extents map.
uint64_t Checker::mapped_end(const Info& d) {
  uint64_t end = 0;
  for (const Extent& e : d.ext) end = std::max<uint64_t>(end, uint64_t{e.logical} + e.blocks());
  return end;
}

// Checks one directory's blocks (index root, index blocks, leaves) and collects its entries.
// Any structural fault marks the directory for a rebuild from the entries that survive.
void Checker::scan_dir(Info& d, std::vector<Ent>& out) {
  const std::string where = "directory " + num(d.ino);
  auto flag = [&](const std::string& line) {
    problem(where + ": " + line, "directory rebuilt");
    d.rebuild = true;
  };
  // The directory's blocks by index: 0..n-1, every one mapped and written.
  const uint64_t mapped = mapped_end(d);
  if (d.size % kBlockSize != 0 || d.size / kBlockSize != mapped) {
    flag("size " + num(d.size) + ", but " + num(mapped) + " blocks are mapped");
  }
  const uint64_t n = std::min(mapped, kMaxDirBlocks);
  if (mapped > kMaxDirBlocks) flag("more blocks than a directory can index (" + num(mapped) + ")");
  std::vector<uint64_t> phys(n, 0);
  for (const Extent& e : d.ext) {
    if (e.logical >= n) continue;
    if (e.unwritten()) {
      flag("extent " + extent_str(e) + " is unwritten");
      continue;
    }
    for (uint64_t k = 0; k < e.blocks() && e.logical + k < n; ++k)
      phys[e.logical + k] = e.physical + k;
  }
  for (uint64_t k = 0; k < n; ++k) {
    if (phys[k] == 0) {
      uint64_t j = k;
      while (j + 1 < n && phys[j + 1] == 0) ++j;
      flag(span_str("block", k, j) + " not mapped");
      k = j;
    }
  }
  if (n == 0) {
    flag("no blocks");
    return;
  }
  std::vector<uint8_t> buf(n * kBlockSize, 0);
  for (uint64_t k = 0; k < n;) {
    if (phys[k] == 0) {
      ++k;
      continue;
    }
    uint64_t j = k + 1;
    while (j < n && phys[j] == phys[j - 1] + 1) ++j;
    if (!read(phys[k], j - k, buf.data() + k * kBlockSize)) return;
    k = j;
  }
  auto blk = [&](uint64_t k) { return buf.data() + k * kBlockSize; };
  // "leaf block 1234 (directory block 3)": the device block, then its place in the directory.
  auto bname = [&](const std::string& what, uint64_t k) {
    return what + "block " + num(phys[k]) + " (directory block " + num(k) + ")";
  };
  enum : uint8_t { kNone, kRoot, kIndex, kLeaf };
  std::vector<uint8_t> kind(n, kNone);
  bool salvage_all = false;

  // Parses a leaf. With `salvage` (its checksum failed, an entry is malformed, or no index
  // reaches it) only entries whose hash matches their name are kept, silently: the whole
  // block is searched, resynchronising at 8-byte boundaries after anything unparsable.
  auto bad_name = [](const std::string& name) {
    return name.find_first_of(std::string("/\0", 2)) != std::string::npos || name == "." ||
           name == "..";
  };
  // The entry at `off` if it parses and, when `verify`, its hash matches its name.
  auto entry_at = [&](const uint8_t* b, size_t off, size_t end, bool verify, DirEntryHeader* e,
                      std::string* name) {
    if (off + sizeof *e > end) return false;
    std::memcpy(e, b + off, sizeof *e);
    if (e->name_len == 0 || e->rec_len != rec_len(e->name_len) || off + e->rec_len > end)
      return false;
    name->assign(reinterpret_cast<const char*>(b + off + sizeof *e), e->name_len);
    return !verify || e->hash == name_hash(name->data(), name->size(), d.dir_seed);
  };
  auto scan_leaf = [&](uint64_t k, uint64_t lo, uint64_t hi, bool salvage) {
    const uint8_t* b = blk(k);
    DirLeafHeader h;
    std::memcpy(&h, b, sizeof h);
    if (phys[k] == 0) return;
    if (h.magic != kDirLeafMagic || h.owner != d.ino) {
      if (!salvage)
        flag(bname("leaf ", k) + ": " +
             (h.magic != kDirLeafMagic ? "bad magic" : "owned by inode " + num(h.owner)));
      return;
    }
    if (h.checksum != block_checksum(b, kHeaderChecksumOffset, L_.seed)) {
      if (!salvage) flag(bname("leaf ", k) + ": checksum mismatch");
      salvage = true;
    }
    if (h.used > kLeafSpace && !salvage)
      flag(bname("leaf ", k) + ": used bytes " + num(h.used) + " overflow the block");
    const size_t end = salvage ? kBlockSize : sizeof h + std::min<size_t>(h.used, kLeafSpace);
    size_t off = sizeof h;
    uint64_t prev = 0;
    bool sorted = true;
    uint16_t found = 0;
    DirEntryHeader e;
    std::string name;
    while (off < end && (salvage || found < h.count)) {
      if (!entry_at(b, off, end, salvage, &e, &name)) {
        if (!salvage) {
          flag(bname("leaf ", k) + ": entry " + num(found) + " is malformed");
          salvage = true;
        }
        // Resynchronise: the next aligned offset holding an entry that verifies.
        for (off += 8; off < kBlockSize && !entry_at(b, off, kBlockSize, true, &e, &name);
             off += 8) {
        }
        continue;
      }
      off += e.rec_len;
      ++found;
      const uint64_t hash = name_hash(name.data(), name.size(), d.dir_seed);
      if (salvage) {
        if (!bad_name(name)) out.push_back(Ent{hash, e.inode, e.type, false, name});
        continue;
      }
      if (bad_name(name)) {
        problem(where + ": entry '" + printable(name) + "' has an invalid name", "removed");
        d.rebuild = true;
        continue;
      }
      if (e.hash != hash) {
        problem(where + ": entry '" + printable(name) + "' has hash " + num(e.hash) +
                    ", but its name hashes to " + num(hash),
                "rehashed");
        d.rebuild = true;
      } else {
        if (e.hash < prev) sorted = false;
        prev = e.hash;
        if (e.hash < lo || e.hash >= hi) {
          flag("entry '" + printable(name) + "' (hash " + num(e.hash) +
               ") lies outside the hash range of " + bname("leaf ", k));
        }
      }
      out.push_back(Ent{hash, e.inode, e.type, false, name});
    }
    if (salvage) return;
    if (off != end) {
      flag(bname("leaf ", k) + ": " + num(h.count) + " entries end at byte " + num(off) +
           ", the header says " + num(end));
    }
    if (!sorted) flag(bname("leaf ", k) + ": entries are not sorted by hash");
  };

  // An index node (the root or, at depth 2, an index block): its entries and their ranges.
  auto index_entries = [&](uint64_t k, uint16_t want_depth, uint64_t lo, uint64_t hi,
                           std::vector<DirIndexEntry>* e) -> bool {
    const uint8_t* b = blk(k);
    DirIndexHeader h;
    std::memcpy(&h, b, sizeof h);
    std::string why;
    if (h.magic != kDirIndexMagic) {
      why = "bad magic";
    } else if (h.owner != d.ino) {
      why = "owned by inode " + num(h.owner);
    } else if (h.checksum != block_checksum(b, kHeaderChecksumOffset, L_.seed)) {
      why = "checksum mismatch";
    } else if (want_depth == 0 ? (h.depth != 1 && h.depth != 2) : h.depth != want_depth) {
      why = "depth " + num(h.depth);
    } else if (h.count == 0 || h.count > kDirIndexCapacity) {
      why = num(h.count) + " entries (1 to " + num(kDirIndexCapacity) + ")";
    }
    if (!why.empty()) {
      flag(bname(k == 0 ? "index root " : "index ", k) + ": " + why);
      return false;
    }
    e->resize(h.count);
    std::memcpy(e->data(), b + sizeof h, h.count * sizeof(DirIndexEntry));
    for (size_t i = 1; i < e->size(); ++i) {
      if ((*e)[i].hash_low <= (*e)[i - 1].hash_low || (*e)[i].hash_low <= lo ||
          (*e)[i].hash_low >= hi) {
        flag(bname(k == 0 ? "index root " : "index ", k) +
             ": entries out of order or out of range");
        break;
      }
    }
    return true;
  };
  // Claims directory block `c` for kind `want`, once.
  auto refer = [&](uint64_t from, uint64_t c, uint8_t want) {
    if (c == 0 || c >= n || kind[c] != kNone) {
      flag(std::string(from == 0 ? "index root" : "index block " + num(from)) +
           " points at block " + num(c) +
           (c == 0 || c >= n ? ", outside the directory" : ", which is already used"));
      return false;
    }
    kind[c] = want;
    return true;
  };

  kind[0] = kRoot;
  std::vector<DirIndexEntry> root;
  if (phys[0] == 0 || !index_entries(0, 0, 0, kHashEnd, &root)) {
    salvage_all = true;
  } else {
    DirIndexHeader rh;
    std::memcpy(&rh, blk(0), sizeof rh);
    for (size_t i = 0; i < root.size(); ++i) {
      const uint64_t lo = i == 0 ? 0 : root[i].hash_low;
      const uint64_t hi = i + 1 < root.size() ? root[i + 1].hash_low : kHashEnd;
      const uint64_t c = root[i].block;
      if (rh.depth == 1) {
        if (refer(0, c, kLeaf)) scan_leaf(c, lo, hi, false);
        continue;
      }
      std::vector<DirIndexEntry> sub;
      if (!refer(0, c, kIndex)) continue;
      if (phys[c] == 0 || !index_entries(c, 1, lo, hi, &sub)) {
        salvage_all = true;
        continue;
      }
      for (size_t j = 0; j < sub.size(); ++j) {
        const uint64_t slo = j == 0 ? lo : sub[j].hash_low;
        const uint64_t shi = j + 1 < sub.size() ? sub[j + 1].hash_low : hi;
        if (refer(c, sub[j].block, kLeaf)) scan_leaf(sub[j].block, slo, shi, false);
      }
    }
  }
  // Blocks no index entry reaches. The core never abandons a leaf (directory blocks are
  // never freed, and a new one is referenced in the transaction that adds it), so a valid
  // leaf here lost its index entry: its entries are salvaged.
  for (uint64_t k = 1; k < n; ++k) {
    if (kind[k] != kNone || phys[k] == 0) continue;
    uint64_t j = k;
    while (j + 1 < n && kind[j + 1] == kNone && phys[j + 1] != 0) ++j;
    if (!salvage_all) flag(span_str("directory block", k, j) + " not referenced by the index");
    for (uint64_t i = k; i <= j; ++i) scan_leaf(i, 0, kHashEnd, true);
    k = j;
  }
  // One name, one entry.
  std::unordered_set<std::string> seen;
  for (Ent& e : out) {
    if (!seen.insert(e.name).second) {
      problem(where + ": entry '" + printable(e.name) + "' appears twice", "the second removed");
      e.drop = true;
      d.rebuild = true;
    }
  }
}

// Checks every entry's target (allocated, sound, of the entry's type) and that each
// directory has one name; removes what cannot stand.
void Checker::resolve_entries() {
  for (size_t k = 0; k < found_infos_; ++k) {
    Info& d = infos_[k];
    if (!dir_live(d)) continue;
    const std::string where = "directory " + num(d.ino);
    for (Ent& e : ents_[k]) {
      if (e.drop) continue;
      const std::string entry = where + ": entry '" + printable(e.name) + "'";
      Info* t = info(e.ino);
      std::string why;
      if (e.ino == 0 || e.ino > L_.inode_count) {
        why = "names inode " + num(e.ino) + ", which does not exist";
      } else if (t == nullptr) {
        why = "names free inode " + num(e.ino);
      } else if (t->state == State::kBad) {
        why = "names inode " + num(e.ino) + ", which is corrupt";
      } else if (e.ino == kRootInode) {
        why = "names the root directory";
      }
      if (!why.empty()) {
        problem(entry + " " + why, "removed");
        e.drop = true;
        d.rebuild = true;
        continue;
      }
      if (e.type != dtype(t->mode)) {
        problem(entry + " has type " + num(e.type) + ", but inode " + num(e.ino) + " is " +
                    type_name(t->mode),
                "type set to " + num(dtype(t->mode)));
        e.type = dtype(t->mode);
        d.rebuild = true;
      }
    }
  }
  // A directory has exactly one name: the one its parent field agrees with, else the first.
  std::vector<std::pair<uint64_t, size_t>> namer_ent(infos_.size(),
                                                     {0, 0});  // (dir index + 1, entry)
  for (size_t k = 0; k < found_infos_; ++k) {
    if (!dir_live(infos_[k])) continue;
    for (size_t i = 0; i < ents_[k].size(); ++i) {
      Ent& e = ents_[k][i];
      if (e.drop) continue;
      Info& t = *info(e.ino);
      if (!is_dir(t)) continue;
      const size_t ti = index_of(t);
      auto& cur = namer_ent[ti];
      if (cur.first == 0) {
        cur = {k + 1, i};
        continue;
      }
      size_t loser_dir = k, loser_ent = i;
      if (infos_[cur.first - 1].ino != t.parent && infos_[k].ino == t.parent) {
        loser_dir = cur.first - 1;
        loser_ent = cur.second;
        cur = {k + 1, i};
      }
      Ent& l = ents_[loser_dir][loser_ent];
      problem("directory " + num(infos_[loser_dir].ino) + ": entry '" + printable(l.name) +
                  "' is a second name of directory " + num(t.ino),
              "removed");
      l.drop = true;
      infos_[loser_dir].rebuild = true;
    }
  }
  for (size_t ti = 0; ti < namer_ent.size(); ++ti) {
    if (namer_ent[ti].first != 0) infos_[ti].namer = infos_[namer_ent[ti].first - 1].ino;
  }
}

// --- pass 3: reachability, the orphan list, /lost+found ----------------------------------

// Marks everything reachable from `start` through live directories.
void Checker::reach(Info& start) {
  std::vector<size_t> queue{index_of(start)};
  start.reached = true;
  while (!queue.empty()) {
    const size_t k = queue.back();
    queue.pop_back();
    if (!dir_live(infos_[k])) continue;
    for (const Ent& e : ents_[k]) {
      if (e.drop) continue;
      Info* t = info(e.ino);
      if (t == nullptr || t->reached || t->state != State::kLive) continue;
      t->reached = true;
      if (is_dir(*t)) queue.push_back(index_of(*t));
    }
  }
}

// A new, empty directory `ino` (fsck's root or lost+found), its blocks written later.
Checker::Info* Checker::make_directory(uint64_t ino, uint64_t parent) {
  Info* n = info(ino);
  if (n == nullptr) {
    infos_.emplace_back();
    ents_.emplace_back();
    slot_[ino] = static_cast<uint32_t>(infos_.size());
    n = &infos_.back();
  } else {
    ents_[index_of(*n)].clear();
    *n = Info{};
  }
  std::random_device rd;
  n->ino = ino;
  n->mode = S_IFDIR | 0700;
  n->links = 2;
  n->parent = n->namer = parent;
  n->dir_seed = (uint64_t{rd()} << 32) ^ rd() ^
                static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  n->fresh = n->dirty = n->rebuild = n->reached = true;
  return n;
}

Checker::Info* Checker::lost_found() {
  if (lost_found_ != 0) return info(lost_found_);
  Info& root = *info(kRootInode);
  std::string name = "lost+found";
  for (const Ent& e : ents_[index_of(root)]) {
    if (e.drop || e.name != name) continue;
    Info* t = info(e.ino);
    if (t != nullptr && dir_live(*t)) {
      lost_found_ = t->ino;
      return t;
    }
    name = "lost+found.fsck";  // the name is taken by something else
  }
  const uint64_t ino = alloc_inode();
  if (ino == 0) {
    unfixable("/lost+found: no free inode to create it with");
    return nullptr;
  }
  Info* lf = make_directory(ino, kRootInode);
  Info& r = *info(kRootInode);
  ents_[index_of(r)].push_back(
      Ent{name_hash(name.data(), name.size(), r.dir_seed), ino, dtype(lf->mode), false, name});
  r.rebuild = true;
  r.links += 1;
  r.dirty = true;
  notice("created /" + name + " (inode " + num(ino) + ")");
  lost_found_ = ino;
  return lf;
}

// Gives an unreachable inode a name in /lost+found (check mode: says it would).
void Checker::connect(Info& n, bool loop) {
  const std::string what =
      iname(n) + ": unreachable" +
      (is_dir(n) ? (loop ? " (in a directory loop)" : " (no reachable directory names it)")
                 : " (links " + num(n.links) + ", no directory entry names it)");
  if (!o_.repair) {
    problem(what);
    extra_names_.resize(infos_.size());
    extra_names_[index_of(n)] += 1;
    n.namer = 0;
    reach(n);
    return;
  }
  Info* lf = lost_found();
  if (lf == nullptr) {
    unfixable(what);
    reach(n);
    return;
  }
  std::string name = "#" + num(n.ino);
  auto& le = ents_[index_of(*lf)];
  while (std::any_of(le.begin(), le.end(), [&](const Ent& e) { return !e.drop && e.name == name; }))
    name += "+";
  le.push_back(
      Ent{name_hash(name.data(), name.size(), lf->dir_seed), n.ino, dtype(n.mode), false, name});
  lf->rebuild = true;
  if (is_dir(n)) {
    n.parent = n.namer = lf->ino;
    n.dirty = true;
    lf->links += 1;
    lf->dirty = true;
  }
  problem(what, "connected to /lost+found as '" + name + "'");
  reach(n);
}

void Checker::pass3() {
  Info* root = info(kRootInode);
  if (root == nullptr || root->state != State::kLive || !is_dir(*root) || root->on_orphan_list) {
    const std::string why = root == nullptr               ? "free"
                            : root->state != State::kLive ? "corrupt"
                            : !is_dir(*root)              ? "not a directory"
                                                          : "on the orphan list";
    // Check mode models the new root too, so that both modes report the same problems.
    problem("root directory (inode 1): " + why,
            "recreated empty (what it held goes to /lost+found)");
    root = make_directory(kRootInode, kRootInode);
  }
  if (root->parent != kRootInode) {
    problem("directory 1 (the root): parent field " + num(root->parent) + ", not 1", "set to 1");
    root->parent = kRootInode;
    root->dirty = true;
  }
  // Inodes on the orphan list that still have a name come off the list.
  for (size_t k = 0; k < infos_.size(); ++k) {
    if (!dir_live(infos_[k])) continue;
    for (const Ent& e : ents_[k]) {
      Info* t = e.drop ? nullptr : info(e.ino);
      if (t == nullptr || !t->on_orphan_list) continue;
      problem("inode " + num(t->ino) + ": on the orphan list, but directory " + num(infos_[k].ino) +
                  " names it ('" + printable(e.name) + "')",
              "taken off the orphan list");
      t->on_orphan_list = false;
      t->next_orphan = 0;
      t->dirty = true;
    }
  }
  reach(*root);
  // Inodes with links 0 that nothing names and that are not orphans: freed. A directory
  // freed so frees what only it named, when that has links 0 too.
  std::vector<uint32_t> named(infos_.size(), 0);
  for (size_t k = 0; k < infos_.size(); ++k) {
    if (!dir_live(infos_[k])) continue;
    for (const Ent& e : ents_[k]) {
      if (Info* t = e.drop ? nullptr : info(e.ino)) ++named[index_of(*t)];
    }
  }
  auto doomed = [&](const Info& n) {
    return n.state == State::kLive && !n.reached && !n.on_orphan_list && n.links == 0 &&
           named[index_of(n)] == 0;
  };
  std::vector<size_t> work;
  for (size_t k = 0; k < infos_.size(); ++k) {
    if (doomed(infos_[k])) work.push_back(k);
  }
  while (!work.empty()) {
    Info& n = infos_[work.back()];
    work.pop_back();
    if (!doomed(n)) continue;
    problem(iname(n) + ": link count 0, but it is neither reachable nor on the orphan list",
            "freed");
    const bool was_dir = dir_live(n);
    n.state = State::kFreed;
    if (!was_dir) continue;
    for (const Ent& e : ents_[index_of(n)]) {
      Info* t = e.drop ? nullptr : info(e.ino);
      if (t == nullptr) continue;
      --named[index_of(*t)];
      if (doomed(*t)) work.push_back(index_of(*t));
    }
  }
  // Unreachable directories: connect the top of each unreachable tree (or one member of a
  // loop), which reaches the rest; then files no live directory names.
  for (size_t k = 0; k < infos_.size(); ++k) {
    Info& x = infos_[k];
    if (!dir_live(x) || x.reached) continue;
    std::vector<uint64_t> path;
    Info* top = &x;
    bool loop = false;
    for (;;) {
      path.push_back(top->ino);
      Info* p = top->namer ? info(top->namer) : nullptr;
      if (p == nullptr || !dir_live(*p) || p->reached) break;
      if (std::find(path.begin(), path.end(), p->ino) != path.end()) {
        loop = true;
        break;
      }
      top = p;
    }
    if (loop && o_.repair) {
      // Its old name, inside the loop, goes: /lost+found gives it a new one.
      Info& p = *info(top->namer);
      for (Ent& e : ents_[index_of(p)]) {
        if (!e.drop && e.ino == top->ino) e.drop = true;
      }
      p.rebuild = true;
      if (p.links > 2) p.links -= 1;
      p.dirty = true;
    }
    connect(*top, loop);
  }
  for (size_t k = 0; k < infos_.size(); ++k) {
    Info& x = infos_[k];
    if (x.state == State::kLive && !x.reached && !x.on_orphan_list && !is_dir(x)) connect(x, false);
  }
  uint64_t lost = 0;
  if (lost_found_ != 0) lost = ents_[index_of(*info(lost_found_))].size();
  verbose("pass 3: " +
          num(static_cast<uint64_t>(std::count_if(infos_.begin(), infos_.end(),
                                                  [](const Info& n) { return n.reached; }))) +
          " inodes reachable from the root" +
          (lost ? ", " + num(lost) + " names in /lost+found" : ""));
  // Parent fields agree with the names.
  for (Info& x : infos_) {
    if (!dir_live(x) || x.ino == kRootInode || x.namer == 0 || x.parent == x.namer) continue;
    problem("directory " + num(x.ino) + ": parent field " + num(x.parent) + ", but directory " +
                num(x.namer) + " names it",
            "set to " + num(x.namer));
    x.parent = x.namer;
    x.dirty = true;
  }
  // The orphans: freed as the next mount would.
  for (Info& x : infos_) {
    if (!x.on_orphan_list || x.state != State::kLive) continue;
    const std::string what = "orphan list: " + iname(x) + " (links 0, " + num(x.size) + " bytes)";
    if (o_.repair) {
      notice(what + ": freed");
      x.state = State::kFreed;
      ++orphans_freed_;
    } else {
      notice(what + " is freed at the next mount");
    }
  }
}

// --- pass 4: link counts -----------------------------------------------------------------

void Checker::pass4() {
  for (Info& n : infos_) n.names = n.subdirs = 0;
  for (size_t k = 0; k < infos_.size(); ++k) {
    Info& d = infos_[k];
    if (!dir_live(d)) continue;
    for (const Ent& e : ents_[k]) {
      Info* t = e.drop ? nullptr : info(e.ino);
      if (t == nullptr || t->state != State::kLive) continue;
      t->names += 1;
      if (is_dir(*t)) d.subdirs += 1;
    }
  }
  for (size_t k = 0; k < extra_names_.size(); ++k) infos_[k].names += extra_names_[k];
  for (Info& n : infos_) {
    if (n.state != State::kLive || n.on_orphan_list) continue;
    if (is_dir(n)) {
      const uint64_t want = 2 + uint64_t{n.subdirs};
      if (n.links != want) {
        problem("directory " + num(n.ino) + ": link count " + num(n.links) + ", but it has " +
                    num(n.subdirs) + (n.subdirs == 1 ? " subdirectory" : " subdirectories") +
                    " (expected " + num(want) + ")",
                "set to " + num(want));
        n.links = static_cast<uint32_t>(want);
        n.dirty = true;
      }
    } else if (n.links != n.names) {
      problem("inode " + num(n.ino) + ": link count " + num(n.links) + ", but " + num(n.names) +
                  (n.names == 1 ? " directory entry names it" : " directory entries name it"),
              "set to " + num(n.names));
      n.links = n.names;
      n.dirty = true;
    }
  }
}

// --- pass 5: bitmaps, descriptors, superblock counts (as found) ---------------------------

void Checker::check_groups() {
  uint64_t free_blocks = 0, free_inodes = 0;
  std::vector<uint8_t> want(kBlockSize);
  // Reports the runs of bits in [from, limit) where `have` and `want` differ, one line per run.
  auto diff = [&](const std::vector<uint8_t>& have, uint64_t from, uint64_t limit, uint64_t base,
                  const char* what, const std::string& missing, const std::string& extra) {
    for (uint64_t i = from; i < limit;) {
      if (i % 64 == 0 && std::memcmp(have.data() + i / 8, want.data() + i / 8, 8) == 0) {
        i += 64;  // a whole word agrees
        continue;
      }
      const bool h = test_bit(have.data(), i), x = test_bit(want.data(), i);
      if (h == x) {
        ++i;
        continue;
      }
      uint64_t j = i;
      while (j + 1 < limit && test_bit(have.data(), j + 1) == h &&
             test_bit(want.data(), j + 1) == x)
        ++j;
      problem(span_str(what, base + i, base + j) + ": " + (x ? missing : extra), "bitmap rebuilt");
      i = j + 1;
    }
  };
  for (uint32_t g = 0; g < L_.groups; ++g) {
    const uint64_t start = L_.group_start(g), size = L_.group_size(g);
    const std::string gname = "group " + num(g);
    // Blocks, as pass 1 found their owners.
    std::fill(want.begin(), want.end(), 0);
    for (uint64_t i = 0; i < kBlocksPerGroup; ++i) {
      if (i >= size || i < 2 + uint64_t{L_.itb} ||
          ((found_claims_[(start + i) / 64] >> ((start + i) % 64)) & 1)) {
        set_bit(want.data(), i);
      }
    }
    if (bb_ok_[g]) {
      // The group's own metadata marked free would be handed out by the allocator (a mount
      // refuses such a bitmap): a line per run, naming the structure.
      const uint64_t meta = 2 + uint64_t{L_.itb};
      for (uint64_t i = 0; i < meta; ++i) {
        if (test_bit(bb_[g].data(), i)) continue;
        const uint64_t end = i < 2 ? i + 1 : meta;  // a bitmap, or the inode table
        uint64_t j = i;
        while (j + 1 < end && !test_bit(bb_[g].data(), j + 1)) ++j;
        problem(span_str("block", start + i, start + j) + " (" + L_.metadata_name(start + i) +
                    "): the group's own metadata, marked free in its block bitmap",
                "bitmap rebuilt");
        i = j;
      }
      diff(bb_[g], meta, size, start, "block",
           "in use, but marked free in the block bitmap of " + gname,
           "marked in use in the block bitmap of " + gname + ", but owned by nothing");
      bool past = true;
      for (uint64_t i = size; i < kBlocksPerGroup; ++i) past = past && test_bit(bb_[g].data(), i);
      if (!past)
        problem(gname + ": block bitmap bits past the end of the group are not all set",
                "bitmap rebuilt");
    }
    const uint64_t bfree = zero_bits(bb_ok_[g] ? bb_[g] : want);
    // Inodes, as pass 1 found them (mode != 0).
    std::fill(want.begin(), want.end(), 0);
    uint32_t dirs = 0;
    for (uint64_t i = 0; i < kBlockSize * 8; ++i) {
      if (i >= L_.ipg) {
        set_bit(want.data(), i);
        continue;
      }
      const uint32_t s = slot_[uint64_t{g} * L_.ipg + i + 1];
      if (s != 0 && s - 1 < found_infos_) {
        set_bit(want.data(), i);
        const Info& n = infos_[s - 1];
        dirs += n.state != State::kBad && is_dir(n) && !n.fresh;
      }
    }
    if (ib_ok_[g]) {
      diff(ib_[g], 0, L_.ipg, uint64_t{g} * L_.ipg + 1, "inode",
           "in use, but marked free in the inode bitmap of " + gname,
           "marked in use in the inode bitmap of " + gname + ", but free");
      bool past = true;
      for (uint64_t i = L_.ipg; i < kBlockSize * 8; ++i) past = past && test_bit(ib_[g].data(), i);
      if (!past)
        problem(gname + ": inode bitmap bits past inodes_per_group are not all set",
                "bitmap rebuilt");
    }
    const uint64_t ifree = zero_bits(ib_ok_[g] ? ib_[g] : want);
    free_blocks += bfree;
    free_inodes += ifree;
    if (!gd_ok_[g]) continue;
    const GroupDesc& d = gd_[g];
    if (d.free_blocks != bfree) {
      problem(gname + ": descriptor says " + num(d.free_blocks) +
                  " free blocks, but its bitmap has " + num(bfree),
              "recomputed");
    }
    if (d.free_inodes != ifree) {
      problem(gname + ": descriptor says " + num(d.free_inodes) +
                  " free inodes, but its bitmap has " + num(ifree),
              "recomputed");
    }
    if (d.used_dirs != dirs) {
      problem(
          gname + ": descriptor says " + num(d.used_dirs) + " directories, but it has " + num(dirs),
          "recomputed");
    }
  }
  // The superblock's counts are exact only after a clean unmount (FORMAT.md).
  if (sb_->state == kStateClean && !used_backup_) {
    if (sb_->free_blocks != free_blocks) {
      problem("superblock: " + num(sb_->free_blocks) + " free blocks, but the bitmaps have " +
                  num(free_blocks),
              "recomputed");
    }
    if (sb_->free_inodes != free_inodes) {
      problem("superblock: " + num(sb_->free_inodes) + " free inodes, but the bitmaps have " +
                  num(free_inodes),
              "recomputed");
    }
  } else {
    verbose("superblock: free counts not compared (the filesystem was not cleanly unmounted)");
  }
}

// --- repair: allocation ------------------------------------------------------------------

// Up to `want` contiguous blocks of some data area that nothing claims (and, where the
// bitmap is trusted, that it marks free). Claims them.
bool Checker::alloc(uint64_t want, uint64_t* first, uint64_t* got) {
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t k = 0; k < L_.groups; ++k) {
      const uint32_t g = (alloc_group_ + k) % L_.groups;
      const uint64_t start = L_.group_start(g), size = L_.group_size(g);
      auto is_free = [&](uint64_t i) {
        return !claimed(start + i) && (pass == 1 || !bb_ok_[g] || !test_bit(bb_[g].data(), i));
      };
      for (uint64_t i = 2 + uint64_t{L_.itb}; i < size; ++i) {
        if (claimed_[(start + i) / 64] == ~uint64_t{0}) {
          i = ((start + i) | 63) - start;  // the rest of a fully claimed word
          continue;
        }
        if (!is_free(i)) continue;
        uint64_t n = 1;
        while (n < want && i + n < size && is_free(i + n)) ++n;
        *first = start + i;
        *got = n;
        claim(*first, n);
        alloc_group_ = g;
        return true;
      }
    }
  }
  return false;
}

// A free inode number (the lowest), 0 if none.
uint64_t Checker::alloc_inode() {
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t g = 0; g < L_.groups; ++g) {
      for (uint64_t i = 0; i < L_.ipg; ++i) {
        const uint64_t ino = uint64_t{g} * L_.ipg + i + 1;
        if (ino == kRootInode || slot_[ino] != 0) continue;
        if (pass == 0 && ib_ok_[g] && test_bit(ib_[g].data(), i)) continue;
        return ino;
      }
    }
  }
  return 0;
}

bool Checker::copy_blocks(uint64_t from, uint64_t to, uint64_t n) {
  std::vector<uint8_t> buf(size_t{kChunk} * kBlockSize);
  for (uint64_t done = 0; done < n;) {
    const uint64_t k = std::min<uint64_t>(kChunk, n - done);
    if (!read(from + done, k, buf.data()) || !write(to + done, k, buf.data())) return false;
    done += k;
  }
  return true;
}

// --- repair: writing ---------------------------------------------------------------------

// Rewrites a directory from its surviving entries: index root, index blocks at depth 2,
// leaves packed in hash order. Reuses its blocks in order, allocating more if it needs them;
// the blocks it no longer needs are released (its mapping is rewritten after).
void Checker::write_directory(Info& d) {
  std::vector<Ent> v;
  for (const Ent& e : ents_[index_of(d)]) {
    if (!e.drop) v.push_back(e);
  }
  std::sort(v.begin(), v.end(), [](const Ent& a, const Ent& b) {
    return a.hash != b.hash ? a.hash < b.hash : a.name < b.name;
  });
  const auto leaves = pack_leaves(v);
  const uint64_t nl = leaves.size();
  const uint64_t ni = nl <= kDirIndexCapacity ? 0 : div_up(nl, kDirIndexCapacity);
  if (ni > kDirIndexCapacity) {
    unfixable("directory " + num(d.ino) + ": too many entries to rebuild its index");
    return;
  }
  const uint64_t need = 1 + ni + nl;
  std::vector<uint64_t> phys;
  for (const Extent& e : d.ext) {
    for (uint64_t k = 0; k < e.blocks() && phys.size() < need; ++k) phys.push_back(e.physical + k);
  }
  while (phys.size() < need) {
    uint64_t f, got;
    if (!alloc(need - phys.size(), &f, &got)) {
      unfixable("directory " + num(d.ino) + ": no free blocks to rebuild it in");
      return;
    }
    for (uint64_t k = 0; k < got; ++k) phys.push_back(f + k);
  }
  std::vector<uint8_t> buf(need * kBlockSize, 0);
  auto blk = [&](uint64_t k) { return buf.data() + k * kBlockSize; };
  auto low = [&](uint64_t leaf) -> uint64_t { return leaf == 0 ? 0 : v[leaves[leaf].first].hash; };
  for (uint64_t i = 0; i < nl; ++i) {
    uint8_t* b = blk(1 + ni + i);
    size_t off = sizeof(DirLeafHeader);
    for (size_t j = leaves[i].first; j < leaves[i].second; ++j) {
      const Ent& e = v[j];
      const DirEntryHeader h{e.hash, e.ino, rec_len(e.name.size()),
                             static_cast<uint8_t>(e.name.size()), e.type};
      std::memcpy(b + off, &h, sizeof h);
      std::memcpy(b + off + sizeof h, e.name.data(), e.name.size());
      off += h.rec_len;
    }
    const DirLeafHeader h{kDirLeafMagic,
                          static_cast<uint16_t>(leaves[i].second - leaves[i].first),
                          static_cast<uint16_t>(off - sizeof(DirLeafHeader)),
                          d.ino,
                          0,
                          0};
    std::memcpy(b, &h, sizeof h);
  }
  auto put_index = [&](uint8_t* b, uint16_t depth, const std::vector<DirIndexEntry>& e) {
    const DirIndexHeader h{
        kDirIndexMagic, static_cast<uint16_t>(e.size()), depth, kDirIndexCapacity, 0, d.ino, 0};
    std::memcpy(b, &h, sizeof h);
    std::memcpy(b + sizeof h, e.data(), e.size() * sizeof(DirIndexEntry));
  };
  std::vector<DirIndexEntry> top;
  if (ni == 0) {
    for (uint64_t i = 0; i < nl; ++i)
      top.push_back(DirIndexEntry{low(i), static_cast<uint32_t>(1 + i), 0});
    put_index(blk(0), 1, top);
  } else {
    for (uint64_t j = 0; j < ni; ++j) {
      std::vector<DirIndexEntry> sub;
      const uint64_t from = j * kDirIndexCapacity, to = std::min(nl, from + kDirIndexCapacity);
      for (uint64_t i = from; i < to; ++i)
        sub.push_back(DirIndexEntry{low(i), static_cast<uint32_t>(1 + ni + i), 0});
      put_index(blk(1 + j), 1, sub);
      top.push_back(DirIndexEntry{low(from), static_cast<uint32_t>(1 + j), 0});
    }
    put_index(blk(0), 2, top);
  }
  for (uint64_t k = 0; k < need; ++k) {
    const uint64_t c = block_checksum(blk(k), kHeaderChecksumOffset, L_.seed);
    std::memcpy(blk(k) + kHeaderChecksumOffset, &c, 8);
  }
  std::vector<Extent> ext;
  for (uint64_t k = 0; k < need;) {
    uint64_t j = k + 1;
    while (j < need && phys[j] == phys[j - 1] + 1) ++j;
    if (!write(phys[k], j - k, blk(k))) return;
    ext.push_back(Extent{static_cast<uint32_t>(k), static_cast<uint32_t>(j - k), phys[k]});
    k = j;
  }
  d.ext = std::move(ext);
  d.size = need * kBlockSize;
  d.remap = d.dirty = true;
  d.rebuild = false;
}

bool Checker::write_node(uint64_t block, uint16_t depth, const void* entries, size_t count,
                         uint64_t owner) {
  std::vector<uint8_t> b(kBlockSize, 0);
  const ExtentNodeHeader h{
      kExtentMagic, static_cast<uint16_t>(count), depth, kExtentNodeCapacity, 0, owner, 0};
  std::memcpy(b.data(), &h, sizeof h);
  std::memcpy(b.data() + sizeof h, entries, count * 16);
  const uint64_t c = block_checksum(b.data(), kHeaderChecksumOffset, L_.seed);
  std::memcpy(b.data() + kHeaderChecksumOffset, &c, 8);
  return write(block, 1, b.data());
}

// Rewrites an inode's mapping from `ext`: inline up to 8 extents, else leaves of up to 254
// under the root (depth 1) or under index blocks (depth 2). Its old tree blocks are reused.
void Checker::write_mapping(Info& n) {
  std::vector<Extent> ext;
  std::sort(n.ext.begin(), n.ext.end(),
            [](const Extent& a, const Extent& b) { return a.logical < b.logical; });
  for (const Extent& e : n.ext) {
    if (!ext.empty()) {
      Extent& p = ext.back();
      if (p.unwritten() == e.unwritten() && uint64_t{p.logical} + p.blocks() == e.logical &&
          p.physical + p.blocks() == e.physical &&
          uint64_t{p.blocks()} + e.blocks() < Extent::kUnwritten) {
        p.length += e.blocks();
        continue;
      }
    }
    ext.push_back(e);
  }
  std::vector<uint64_t> pool = n.tree, used;
  auto take = [&](uint64_t* b) {
    if (!pool.empty()) {
      *b = pool.back();
      pool.pop_back();
    } else {
      uint64_t got;
      if (!alloc(1, b, &got)) return false;
    }
    used.push_back(*b);
    return true;
  };
  auto rp = std::make_unique<RootPatch>();
  const size_t E = ext.size();
  bool ok = true;
  if (E <= Inode::kInlineExtents) {
    if (E > 0) std::memcpy(rp->root, ext.data(), E * sizeof(Extent));
    rp->count = static_cast<uint32_t>(E);
    rp->depth = 0;
  } else {
    const size_t per = div_up(E, div_up(E, kExtentNodeCapacity));
    std::vector<ExtentIndex> idx;
    for (size_t i = 0; i < E && ok; i += per) {
      uint64_t b;
      ok = take(&b) && write_node(b, 0, ext.data() + i, std::min(per, E - i), n.ino);
      idx.push_back(ExtentIndex{i == 0 ? 0 : ext[i].logical, 0, b});
    }
    if (ok && idx.size() <= Inode::kInlineExtents) {
      std::memcpy(rp->root, idx.data(), idx.size() * sizeof(ExtentIndex));
      rp->count = static_cast<uint32_t>(idx.size());
      rp->depth = 1;
    } else if (ok) {
      const size_t groups = div_up(idx.size(), kExtentNodeCapacity);
      if (groups > Inode::kInlineExtents) {
        unfixable("inode " + num(n.ino) + ": too fragmented to rebuild its extent tree");
        return;
      }
      const size_t per2 = div_up(idx.size(), groups);
      std::vector<ExtentIndex> root;
      for (size_t j = 0; j < idx.size() && ok; j += per2) {
        uint64_t b;
        ok = take(&b) && write_node(b, 1, idx.data() + j, std::min(per2, idx.size() - j), n.ino);
        root.push_back(ExtentIndex{idx[j].logical, 0, b});
      }
      std::memcpy(rp->root, root.data(), root.size() * sizeof(ExtentIndex));
      rp->count = static_cast<uint32_t>(root.size());
      rp->depth = 2;
    }
  }
  if (!ok) {
    if (!failed())
      unfixable("inode " + num(n.ino) + ": no free blocks to rebuild its extent tree in");
    return;
  }
  n.ext = std::move(ext);
  n.tree = std::move(used);
  n.root = std::move(rp);
  n.blocks = n.tree.size() + (n.xattr ? 1 : 0);
  for (const Extent& e : n.ext) n.blocks += e.blocks();
  n.remap = false;
  n.dirty = true;
}

// Rewrites every inode the repairs changed, one inode-table block at a time.
void Checker::write_inodes() {
  std::vector<size_t> todo;
  for (size_t k = 0; k < infos_.size(); ++k) {
    const Info& n = infos_[k];
    if (n.dirty || n.fresh || n.state != State::kLive) todo.push_back(k);
  }
  std::sort(todo.begin(), todo.end(),
            [&](size_t a, size_t b) { return infos_[a].ino < infos_[b].ino; });
  std::vector<uint8_t> buf(kBlockSize);
  const uint64_t now =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  for (size_t a = 0; a < todo.size() && !failed();) {
    const uint64_t blk = L_.inode_block(infos_[todo[a]].ino);
    if (!read(blk, 1, buf.data())) return;
    size_t b = a;
    for (; b < todo.size() && L_.inode_block(infos_[todo[b]].ino) == blk; ++b) {
      const Info& n = infos_[todo[b]];
      uint8_t* p = buf.data() + L_.inode_offset(n.ino);
      Inode d;
      std::memcpy(&d, p, sizeof d);
      const uint32_t gen = d.generation;
      if (n.state != State::kLive) {
        // FORMAT.md: a freed inode keeps only its generation (and a valid checksum).
        d = Inode{};
        d.generation = gen;
      } else {
        if (n.fresh) {
          d = Inode{};
          d.mode = n.mode;
          d.generation = gen + 1;
          d.atime_ns = d.mtime_ns = d.ctime_ns = d.crtime_ns = now;
          d.dir_seed = n.dir_seed;
        }
        d.links = n.links;
        d.flags = n.flags;
        d.size = n.size;
        d.blocks = n.blocks;
        d.parent = n.parent;
        d.next_orphan = n.on_orphan_list ? n.next_orphan : 0;
        d.xattr_block = n.xattr;
        if (n.root) {
          d.extent_count = n.root->count;
          d.tree_depth = n.root->depth;
          std::memcpy(&d.root, n.root->root, sizeof d.root);
        }
      }
      d.checksum = inode_checksum(d, n.ino, L_.seed);
      std::memcpy(p, &d, sizeof d);
    }
    if (!write(blk, 1, buf.data())) return;
    a = b;
  }
}

// The bitmaps and directory counts the model describes.
void Checker::build_bitmaps(std::vector<std::vector<uint8_t>>* bb,
                            std::vector<std::vector<uint8_t>>* ib, std::vector<uint32_t>* dirs) {
  bb->assign(L_.groups, std::vector<uint8_t>(kBlockSize, 0));
  ib->assign(L_.groups, std::vector<uint8_t>(kBlockSize, 0));
  dirs->assign(L_.groups, 0);
  for (uint32_t g = 0; g < L_.groups; ++g) {
    uint8_t* b = (*bb)[g].data();
    for (uint64_t i = 0; i < 2 + uint64_t{L_.itb}; ++i) set_bit(b, i);
    for (uint64_t i = L_.group_size(g); i < kBlocksPerGroup; ++i) set_bit(b, i);
    for (uint64_t i = L_.ipg; i < kBlockSize * 8; ++i) set_bit((*ib)[g].data(), i);
  }
  for (const Info& n : infos_) {
    if (n.state != State::kLive) continue;
    const auto g = static_cast<uint32_t>((n.ino - 1) / L_.ipg);
    set_bit((*ib)[g].data(), (n.ino - 1) % L_.ipg);
    if (is_dir(n)) (*dirs)[g] += 1;
    for_each_claim(n, [&](uint64_t first, uint64_t count, int) {
      for (uint64_t b = first; b < first + count; ++b) {
        if (!L_.is_data(b)) continue;  // only reachable without repair (claims into metadata)
        const uint32_t bg = L_.group_of(b);
        set_bit((*bb)[bg].data(), b - L_.group_start(bg));
      }
    });
  }
}

// Writes the bitmaps and descriptors that differ from the model's.
void Checker::write_groups() {
  std::vector<std::vector<uint8_t>> bb, ib;
  std::vector<uint32_t> dirs;
  build_bitmaps(&bb, &ib, &dirs);
  std::vector<bool> gdt_dirty(L_.gdt_blocks, false);
  for (uint32_t g = 0; g < L_.groups && !failed(); ++g) {
    const uint64_t start = L_.group_start(g);
    if (bb[g] != bb_[g] && !write(start, 1, bb[g].data())) return;
    if (ib[g] != ib_[g] && !write(start + 1, 1, ib[g].data())) return;
    GroupDesc d{};
    d.block_bitmap = start;
    d.inode_bitmap = start + 1;
    d.inode_table = start + 2;
    d.free_blocks = static_cast<uint32_t>(zero_bits(bb[g]));
    d.free_inodes = static_cast<uint32_t>(zero_bits(ib[g]));
    d.used_dirs = dirs[g];
    d.block_bitmap_checksum = checksum(bb[g].data(), kBlockSize, L_.seed);
    d.inode_bitmap_checksum = checksum(ib[g].data(), kBlockSize, L_.seed);
    d.checksum = group_checksum(d, L_.seed);
    if (std::memcmp(&d, &gd_[g], sizeof d) != 0) {
      std::memcpy(gdt_raw_.data() + size_t{g} * sizeof d, &d, sizeof d);
      gd_[g] = d;
      gdt_dirty[g / kGroupDescsPerBlock] = true;
    }
    bb_[g] = bb[g];
    ib_[g] = ib[g];
  }
  for (uint64_t i = 0; i < L_.gdt_blocks; ++i) {
    if (gdt_dirty[i] && !write(L_.gdt_start + i, 1, gdt_raw_.data() + i * kBlockSize)) return;
  }
}

// A new, empty journal whose sequence numbers lie above every transaction left in the
// ring, so no stale transaction can ever look like the next one.
void Checker::reset_journal() {
  uint64_t max_seq = sb_->journal_seq;
  std::vector<uint8_t> buf(size_t{kChunk} * kBlockSize);
  for (uint64_t b = 2; b <= L_.journal_blocks; b += kChunk) {
    const uint64_t n = std::min<uint64_t>(kChunk, L_.journal_blocks + 1 - b);
    if (!read(b, n, buf.data())) return;
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t magic;
      uint64_t seq;
      std::memcpy(&magic, buf.data() + i * kBlockSize, 4);
      std::memcpy(&seq, buf.data() + i * kBlockSize + 8, 8);
      if (magic == kJournalDescriptorMagic || magic == kJournalCommitMagic)
        max_seq = std::max(max_seq, seq);
    }
  }
  JournalHeader jh{};
  jh.magic = kJournalHeaderMagic;
  jh.tail_block = 1;
  jh.tail_seq = max_seq + 1;
  jh.checksum = block_checksum(&jh, offsetof(JournalHeader, checksum), L_.seed);
  write(1, 1, &jh);
}

// The superblock, clean, with the model's counts: the primary, then the backup, each only
// if it differs from what is on the device.
void Checker::write_superblock() {
  Superblock& s = *sb_;
  s.free_blocks = 0;
  s.free_inodes = 0;
  for (uint32_t g = 0; g < L_.groups; ++g) {
    s.free_blocks += gd_[g].free_blocks;
    s.free_inodes += gd_[g].free_inodes;
  }
  s.orphan_head = 0;
  s.state = kStateClean;
  s.checksum = superblock_checksum(s);
  auto disk = std::make_unique<Superblock>();
  for (const uint64_t b : {uint64_t{0}, L_.block_count - 1}) {
    if (!read(b, 1, disk.get())) return;
    if (std::memcmp(disk.get(), &s, sizeof s) == 0) continue;
    if (b == 0) {
      s.write_time = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::system_clock::now().time_since_epoch())
                                               .count());
      s.checksum = superblock_checksum(s);
    }
    if (!write(b, 1, &s)) return;
  }
}

void Checker::summarize() {
  std::vector<std::vector<uint8_t>> bb, ib;
  std::vector<uint32_t> dirs;
  build_bitmaps(&bb, &ib, &dirs);
  uint64_t free_blocks = 0, free_inodes = 0;
  for (uint32_t g = 0; g < L_.groups; ++g) {
    free_blocks += zero_bits(bb[g]);
    free_inodes += zero_bits(ib[g]);
    res_.directories += dirs[g];
  }
  res_.inode_count = L_.inode_count;
  res_.inodes_used = L_.inode_count - free_inodes;
  res_.block_count = L_.block_count;
  res_.blocks_used = L_.block_count - free_blocks;
}

// --- the run -----------------------------------------------------------------------------

FsckResult Checker::run() {
  auto finish = [&]() {
    int code = kFsckClean;
    if (o_.repair) {
      if (res_.corrected > 0 || written_ || orphans_freed_ > 0) code |= kFsckCorrected;
      if (uncorrected_ > 0) code |= kFsckUncorrected;
    } else if (res_.problems > 0) {
      code |= kFsckUncorrected;
    }
    if (failed()) {
      code |= kFsckOperational;
      res_.error = error_;
    }
    res_.exit_code = code;
    return res_;
  };
  if (dev_.block_bytes() != kBlockSize) {
    fail("the device's block size is " + num(dev_.block_bytes()) + " bytes; warpfs needs 4096");
    return finish();
  }
  if (!load_superblock() || !check_journal()) return finish();
  if (o_.skip_if_clean && !primary_bad_ && !backup_bad_ && !journal_header_bad_ &&
      sb_->state == kStateClean && pending_.transactions == 0 && sb_->orphan_head == 0) {
    res_.skipped = true;
    res_.inode_count = sb_->inode_count;
    res_.inodes_used = sb_->inode_count - std::min(sb_->free_inodes, sb_->inode_count);
    res_.block_count = sb_->block_count;
    res_.blocks_used = sb_->block_count - std::min(sb_->free_blocks, sb_->block_count);
    verbose("clean: not checked further (force a check with -f)");
    return finish();
  }
  if (!replay()) return finish();
  L_.init(*sb_);
  load_groups();
  if (failed()) return finish();
  pass1();
  if (failed()) return finish();
  orphan_list();
  pass1b();
  if (failed()) return finish();
  pass2();
  if (failed()) return finish();
  pass3();
  pass4();
  check_groups();
  if (o_.repair && !failed()) {
    for (Info& n : infos_) {
      if (n.state == State::kLive && n.rebuild && dir_live(n)) write_directory(n);
      if (failed()) return finish();
    }
    for (Info& n : infos_) {
      if (n.state == State::kLive && n.remap) write_mapping(n);
      if (failed()) return finish();
    }
    write_inodes();
    if (!failed()) write_groups();
    if (!failed() && journal_header_bad_) reset_journal();
    const bool sb_changes = written_ || primary_bad_ || backup_bad_ || sb_->state != kStateClean ||
                            sb_->orphan_head != 0 || res_.problems > 0;
    if (!failed() && sb_changes) write_superblock();
    if (!failed() && written_) {
      if (Status s = dev_.flush(); !s.is_ok()) fail("flush failed: " + s.to_string());
    }
  }
  if (!failed()) summarize();
  return finish();
}

}  // namespace

FsckResult fsck(blockdev::BlockDevice& dev, const FsckOptions& o,
                const std::function<void(const std::string&)>& report) {
  auto c = std::make_unique<Checker>(dev, o, report);
  return c->run();
}

}  // namespace warpfs::fs
