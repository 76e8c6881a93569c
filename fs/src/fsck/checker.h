// The checker's state, shared by its passes (the contract is in warpfs/fs/fsck.h; the policy
// choices are written at the top of fsck.cc in this folder).
//
// Everything is read once, in big sequential reads where the layout allows (descriptor
// table, bitmaps, inode tables in 1 MiB chunks, each directory's blocks by extent), and
// checked against an in-memory model: one Info per allocated inode with its extents, mapping
// blocks and xattr block, a bitmap of the blocks those claim, and each directory's entries.
// Repairs change the model; the write phase (repair_*.cc) then rewrites exactly what changed.
// The passes, one file each, in the order run() calls them, in the manner of e2fsck's
// pass1.c ... pass5.c: each says at its top what it assumes and what it leaves for later.
//   mirrors.cc     M     a mirrored set's copies of every block in use agree (first)
//   superblock.cc  0, J  superblock, backup, journal, group descriptors and bitmaps as read
//                        (refcounts.cc: the reference-count tables as read)
//   pass1.cc       1     inodes, extent trees, xattr blocks; block claims (parallel by group)
//   pass1b.cc      1B    blocks with several owners (refcounts.cc: shared blocks counted,
//                        tables planned)
//   pass2.cc       2     directories' entries, names and targets (pass2_dir.cc: one directory,
//                        directories read in parallel)
//   pass3.cc       3     reachability, the root, /lost+found, parent fields
//   pass4.cc       4     link counts; the orphan list (read after pass 1, freed after pass 3)
//   pass5.cc       5     bitmaps, descriptor and superblock counts, reference counts
//                        (parallel by group)
//   repair_*.cc          allocation and the write phase (refcounts.cc: the tables)
//
// Thread-safety: a Checker is used by one thread. The passes that fan out (1, 2 and 5) hand
// their workers only what is immutable while they run (the Layout, the device, the model
// pass 1 built) and give each worker an output record of its own (GroupScan; DirFindings
// with its directory's entries and rebuild flag; GroupCheck), merged by the calling thread in
// group or inode order: messages, their order and the repairs do not depend on the thread
// count. (ThreadSanitizer builds run the workers on plain threads:
// parallel.cc says why.)
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "warpfs/fs/format.h"
#include "warpfs/fs/fsck.h"
#include "warpfs/fs/layout.h"
#include "warpfs/fs/replay.h"

namespace warpfs::fs::fsck_impl {

using blockdev::BlockDevice;
using blockdev::Status;

inline constexpr uint64_t kNoLogical = uint64_t{1} << 32;  // one past the last file block
inline constexpr uint64_t kHashEnd = uint64_t{1} << 63;    // above every name hash
inline constexpr size_t kLeafSpace = kBlockSize - sizeof(DirLeafHeader);
inline constexpr uint32_t kChunk = 256;  // blocks per big read: 1 MiB
inline constexpr uint64_t kMaxDirBlocks =
    1 + kDirIndexCapacity + uint64_t{kDirIndexCapacity} * kDirIndexCapacity;
inline constexpr size_t kMaxLines = 10000;

// --- small helpers (util.cc) --------------------------------------------------------------

std::string num(uint64_t v);
uint16_t rec_len(size_t name_len);
uint8_t dtype(uint32_t mode);
bool test_bit(const uint8_t* bm, uint64_t i);
void set_bit(uint8_t* bm, uint64_t i);
uint64_t zero_bits(const std::vector<uint8_t>& bm);
bool valid_type(uint32_t mode);
const char* type_name(uint32_t mode);
std::string printable(std::string_view s);  // control and non-ASCII bytes escaped
std::string extent_str(const Extent& e);
std::string span_str(const char* what, uint64_t a, uint64_t b);  // "block 7", "blocks 7-9"
// "" or why `sb` cannot describe a warpfs on a device of `dev_blocks` blocks.
std::string superblock_problem(const Superblock& sb, uint64_t dev_blocks);
// The same fixed geometry, seed and uuid (sizes and dynamic fields may differ).
bool same_filesystem(const Superblock& a, const Superblock& b);
// "" or why a block that starts with a Header (magic, owner, checksum at
// kHeaderChecksumOffset: FORMAT.md "Checksums") is not inode `owner`'s block of that kind.
template <typename Header>
std::string header_problem(const uint8_t* block, uint32_t magic, uint64_t owner, uint64_t seed) {
  Header h;
  std::memcpy(&h, block, sizeof h);
  if (h.magic != magic) return "bad magic";
  if (h.owner != owner) return "owned by inode " + num(h.owner);
  if (h.checksum != block_checksum(block, kHeaderChecksumOffset, seed)) return "checksum mismatch";
  return "";
}
// Reads n blocks from b in 1 MiB commands: "" or the error (the unread part is zeroed).
std::string read_blocks(BlockDevice& dev, uint64_t b, uint64_t n, void* buf);

// A device whose writes stay in memory: check mode replays the journal into it, so the
// check sees the replayed metadata and the real device is never written.
// Thread-safety: reads may run on several threads once the writes (the replay) are done:
// they only look blocks_ up.
class OverlayDevice final : public BlockDevice {
 public:
  explicit OverlayDevice(BlockDevice& d) : d_(d) {}
  uint32_t block_bytes() const override { return d_.block_bytes(); }
  uint64_t block_count() const override { return d_.block_count(); }
  Status read(uint64_t block, uint32_t count, void* buf) override;
  Status write(uint64_t block, uint32_t count, const void* buf) override;
  Status flush() override { return Status::ok(); }
  Status trim(uint64_t, uint64_t) override { return Status::ok(); }

 private:
  BlockDevice& d_;
  std::map<uint64_t, std::vector<uint8_t>> blocks_;
};

// --- the model -----------------------------------------------------------------------------

// One directory entry as the checker keeps it.
struct Ent {
  uint64_t hash;
  uint64_t ino;
  uint8_t type;
  bool drop;  // removed by a repair
  std::string name;
};

enum class State : uint8_t { kLive, kBad, kFreed };

// A rewritten inode root (write_mapping).
struct RootPatch {
  uint32_t count = 0, depth = 0;
  uint8_t root[sizeof(Inode::root)] = {};
};

// One allocated inode.
struct Info {
  uint64_t ino = 0;
  uint32_t mode = 0, links = 0, flags = 0;
  uint64_t size = 0, blocks = 0, parent = 0, next_orphan = 0, xattr = 0, dir_seed = 0;
  std::vector<Extent> ext;     // sorted by logical, non-overlapping
  std::vector<uint64_t> tree;  // extent-tree blocks
  // The xattr blocks after the first (chain blocks) and the value blocks, and the chain
  // blocks a repair rewrote (written by the write phase, their checksums set).
  std::vector<uint64_t> xblocks;
  std::vector<std::pair<uint64_t, uint32_t>> xref;  // where each of xblocks is named: a chain
                                                    // block and the offset of the u64 there
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> xpatch;
  std::unique_ptr<RootPatch> root;
  State state = State::kLive;
  bool on_orphan_list = false;
  bool dirty = false;        // the inode is rewritten
  bool remap = false;        // its extent tree is rewritten from `ext`
  bool rebuild = false;      // directories: rewritten from their entries
  bool fresh = false;        // created by the checker (root, lost+found)
  bool clamp_times = false;  // a time's sentinel has no record: the field is clamped
  bool reached = false;
  uint32_t names = 0, subdirs = 0;  // pass 4
  uint64_t namer = 0;               // directories: the directory whose entry names it
};

inline bool is_dir(const Info& n) {
  return S_ISDIR(n.mode);
}
// A directory whose entries count: allocated, sound, not on its way out.
inline bool dir_live(const Info& n) {
  return S_ISDIR(n.mode) && n.state == State::kLive && !n.on_orphan_list;
}
inline std::string iname(const Info& n) {
  return (is_dir(n) ? "directory " : "inode ") + num(n.ino);
}
// One past the last logical block n's extents map.
uint64_t mapped_end(const Info& n);
// The blocks n owns besides its extents' (its Inode::blocks less the data).
inline uint64_t meta_blocks(const Info& n) {
  return n.tree.size() + (n.xattr ? 1 : 0) + n.xblocks.size();
}

// A problem a worker found, reported later by the calling thread (Checker::report_all).
struct Finding {
  std::string line, fix;
};
using Findings = std::vector<Finding>;

// Calls f(first, count, sharable) for every block range `n` owns, in a fixed order: the xattr
// block, the other xattr blocks, the extent-tree blocks, the extents. `sharable`: a written
// extent of a regular file, the only claim that may share a block with others of its kind
// (FORMAT.md "Shared blocks": clones and dedup map regular files' written blocks; a
// directory's blocks are rewritten in place by a rebuild, so they are never shared).
template <typename F>
void for_each_claim_kind(const Info& n, F f) {
  if (n.xattr) f(n.xattr, uint64_t{1}, false);
  for (uint64_t b : n.xblocks) f(b, uint64_t{1}, false);
  for (uint64_t b : n.tree) f(b, uint64_t{1}, false);
  const bool regular = S_ISREG(n.mode);
  for (const Extent& e : n.ext) f(e.physical, uint64_t{e.blocks()}, regular && !e.unwritten());
}
template <typename F>
void for_each_claim(const Info& n, F f) {
  for_each_claim_kind(n, [&](uint64_t first, uint64_t count, bool) { f(first, count); });
}

// A group's reference-count table (FORMAT.md "Shared blocks") as pass 0 read it, and where
// the repairs put it.
struct RefTable {
  uint32_t at = 0;       // group-relative first block; 0: none (absent, or dropped by a repair)
  bool fresh = false;    // allocated by this run: nothing on the device to compare with
  std::vector<bool> ok;  // per table block: its header verified (its counts are known)
  std::vector<uint16_t> count;  // kRefcountBlocks * kRefcountsPerBlock counts as read
};

// The threads passes 1, 2 and 5 fan out to (parallel.cc): a oneTBB arena of `threads`
// (0: all hardware threads) made once per check, or the calling thread alone (1).
// Thread-safety: used by the Checker's thread; the bodies it runs are what runs in parallel.
class Workers {
 public:
  explicit Workers(unsigned threads);
  ~Workers();
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  unsigned count() const { return count_; }
  // Runs body(i) for every i in [0, n); returns when all are done.
  // REQUIRES: body(i) and body(j) touch no common mutable state for i != j.
  void for_each_index(uint32_t n, const std::function<void(uint32_t)>& body);

 private:
  struct Arena;
  unsigned count_;
  std::unique_ptr<Arena> arena_;  // null with one thread
};

// What pass 2 found in one directory: written by the one worker that scans it, read by the
// calling thread after for_each_index returns.
struct DirFindings {
  Findings findings;  // in the order a serial scan reports them
  std::string error;  // the read error that stopped the scan
};
// Pass 2 on one directory (pass2_dir.cc): checks d's blocks and collects its entries into
// `out`; any structural fault sets d.rebuild. Thread-safety: writes only d.rebuild, `out` and
// `f`; reads d, the device (any thread) and the Layout. So workers may scan different
// directories at once.
void scan_dir(BlockDevice& io, const Layout& l, Info& d, std::vector<Ent>& out, DirFindings* f);

// --- the checker ---------------------------------------------------------------------------

struct GroupScan;   // pass1.cc: what pass 1 found in one group
struct GroupCheck;  // pass5.cc: what pass 5 found in one group

class Checker {
 public:
  Checker(BlockDevice& dev, const FsckOptions& o,
          const std::function<void(const std::string&)>& report)
      : dev_(dev),
        o_(o),
        report_(report),
        overlay_(dev),
        io_(o.repair ? &dev : static_cast<BlockDevice*>(&overlay_)) {}
  Checker(const Checker&) = delete;
  Checker& operator=(const Checker&) = delete;
  FsckResult run();

 private:
  // --- reporting (fsck.cc)
  void problem(const std::string& line, const std::string& fix = "");
  void unfixable(const std::string& line);
  void notice(const std::string& line) {
    if (report_) report_(line);
  }
  void verbose(const std::string& line) {
    if (o_.verbose && report_) report_(line);
  }
  void report_all(const Findings& f) {
    for (const Finding& x : f) problem(x.line, x.fix);
  }
  bool fail(const std::string& why) {
    if (error_.empty()) error_ = why;
    return false;
  }
  bool failed() const { return !error_.empty(); }
  FsckResult finish();
  bool check_and_repair();
  bool skip_clean();
  void write_phase();

  // --- I/O: reads through the overlay in check mode; writes only with repair (fsck.cc).
  bool read(uint64_t b, uint64_t n, void* buf) {
    const std::string why = read_blocks(*io_, b, n, buf);
    return why.empty() || fail(why);
  }
  bool write(uint64_t b, uint64_t n, const void* buf);

  Info* info(uint64_t ino) {
    if (ino == 0 || ino > L_.inode_count) return nullptr;
    const uint32_t s = slot_[ino];
    return s ? &infos_[s - 1] : nullptr;
  }
  size_t index_of(const Info& n) const { return static_cast<size_t>(&n - infos_.data()); }
  Workers& workers();

  // --- block claims (pass1.cc)
  bool claimed(uint64_t b) const { return (claimed_[b / 64] >> (b % 64)) & 1; }
  bool claimed_found(uint64_t b) const { return (found_claims_[b / 64] >> (b % 64)) & 1; }
  void claim(uint64_t first, uint64_t n);

  // --- pass M: the copies of a mirrored set (mirrors.cc)
  // >= 1: block `b`'s data verifies as what it is (higher: more of it verified, e.g. inodes
  // in use: of two verifying copies the source is the one with more), 0: it does not, -1:
  // nothing to verify by.
  using MirrorVerify = std::function<int(uint64_t b, const uint8_t* data)>;
  void pass_mirrors();
  // Compares blocks [first, first + n) on every kept copy; reports and (repair) rewrites
  // the differing ones from the source; `keep` (may be null) gets the source's blocks.
  // `data_area`: a data-area block, whose differing copies are a notice (file data may differ
  // after a crash), not a problem.
  bool mirror_range(uint64_t first, uint64_t n, const std::string& what, bool data_area,
                    const MirrorVerify& verify, std::vector<uint8_t>* keep);
  static int self_check(const uint8_t* b, uint64_t seed);
  // --- pass 0 and the journal (superblock.cc)
  bool load_superblock();
  bool use_backup(const std::string& why);
  bool find_backup(Superblock* out, uint64_t* at);
  bool check_journal();
  bool replay();
  bool discard_journal(const std::string& what, bool clean);
  void load_groups();
  void check_descriptor(uint32_t g);
  // --- reference-count tables (refcounts.cc: passes 0, 1B, 5 and the write phase)
  void load_refcount_table(uint32_t g);
  bool table_block(uint64_t b) const;        // a block of a kept table
  std::string owner_name(uint64_t b) const;  // who owns a block the metadata area claims
  void split_shared(std::vector<std::vector<uint64_t>>& owners, const std::vector<bool>& sharable,
                    std::vector<uint32_t>& keep);
  bool alloc_table(uint32_t g);
  void check_refcounts(uint32_t g, Findings* f) const;
  void write_refcounts();
  // --- pass 1 (pass1.cc)
  void pass1();
  void claim_metadata();
  void merge_group(GroupScan& s);
  void pass1_summary();
  // --- pass 1B (pass1b.cc)
  void pass1b();
  std::vector<std::vector<uint64_t>> dup_owners(std::vector<bool>* sharable);
  void report_dups(const std::vector<std::vector<uint64_t>>& owners,
                   const std::vector<uint32_t>& keep);
  void move_shared(Info& n, std::vector<uint32_t>& keep);
  void move_xattr_blocks(Info& n, std::vector<uint32_t>& keep);
  void xattr_block_moved(Info& n, uint64_t from, uint64_t to);
  bool must_move(uint64_t b, std::vector<uint32_t>& keep);
  bool move_extent(Info& n, const Extent& e, std::vector<uint32_t>& keep, std::vector<Extent>* out);
  bool copy_run(Info& n, const Extent& e, uint64_t from, uint64_t to, std::vector<Extent>* out);
  // --- pass 2 (pass2.cc, pass2_dir.cc)
  void pass2();
  size_t merge_dir(size_t k, const DirFindings& f);
  void resolve_entries();
  void check_targets(Info& d, std::vector<Ent>& ents);
  void one_name_per_directory();
  // --- pass 3 (pass3.cc)
  void pass3();
  Info* check_root();
  void unorphan_named();
  void free_unlinked();
  void connect_unreachable();
  void open_loop(Info& top);
  void check_parents();
  void reach(Info& start);
  Info* lost_found();
  Info* find_lost_found(std::string* name);
  void connect(Info& n, bool loop);
  Info* make_directory(uint64_t ino, uint64_t parent);
  // --- pass 4 and the orphan list (pass4.cc)
  void orphan_list();
  void free_orphans();
  void pass4();
  void count_names();
  // --- pass 5 (pass5.cc); the const ones run on workers
  void check_groups();
  void check_group(uint32_t g, GroupCheck* out) const;
  void check_block_bitmap(uint32_t g, const std::vector<uint8_t>& want, Findings* f) const;
  uint32_t inode_want(uint32_t g, std::vector<uint8_t>* want) const;
  void check_descriptor_counts(uint32_t g, const GroupCheck& c, uint32_t dirs, Findings* f) const;
  void check_superblock_counts(uint64_t free_blocks, uint64_t free_inodes);
  // --- repair: allocation (repair_alloc.cc)
  bool alloc(uint64_t want, uint64_t* first, uint64_t* got);
  bool alloc_in_group(uint32_t g, bool trust_bitmap, uint64_t want, uint64_t* first, uint64_t* got);
  uint64_t alloc_inode();
  bool copy_blocks(uint64_t from, uint64_t to, uint64_t n);
  // --- repair: directories (repair_dir.cc)
  void write_directory(Info& d);
  bool dir_blocks(Info& d, uint64_t need, std::vector<uint64_t>* phys);
  // --- repair: mappings, inodes, groups, superblock (repair_write.cc)
  void write_mapping(Info& n);
  bool write_leaves(const Info& n, const std::vector<Extent>& ext, std::vector<uint64_t>& pool,
                    std::vector<uint64_t>* used, std::vector<ExtentIndex>* idx);
  bool write_upper(const Info& n, const std::vector<ExtentIndex>& idx, std::vector<uint64_t>& pool,
                   std::vector<uint64_t>* used, RootPatch* rp);
  bool take_block(std::vector<uint64_t>& pool, std::vector<uint64_t>* used, uint64_t* b);
  bool write_node(uint64_t block, uint16_t depth, const void* entries, size_t count,
                  uint64_t owner);
  void write_inodes();
  void patch_inode(const Info& n, uint64_t now, uint8_t* p) const;
  void build_bitmaps(std::vector<std::vector<uint8_t>>* bb, std::vector<std::vector<uint8_t>>* ib,
                     std::vector<uint32_t>* dirs) const;
  void write_groups();
  void reset_journal();
  void write_superblock();
  void summarize();

  // What the workers of passes 1, 2 and 5 share is marked [shared]: they only read it, and the
  // calling thread writes it only between passes, never while Workers::for_each_index runs (its
  // return orders the workers' reads before the next write). The rest is the calling
  // thread's alone.
  BlockDevice& dev_;
  const FsckOptions& o_;
  const std::function<void(const std::string&)>& report_;
  OverlayDevice overlay_;
  BlockDevice* io_;  // [shared] pass 1 reads through it (block_device.h: any thread)
  FsckResult res_;
  uint64_t uncorrected_ = 0, orphans_freed_ = 0;
  bool written_ = false;
  bool mirror_written_ = false;  // pass M rewrote a copy
  bool mirror_crashed_ = false;  // pass M: the superblock says it was not cleanly unmounted
  std::string error_;

  std::unique_ptr<Superblock> sb_ = std::make_unique<Superblock>();
  Layout L_;  // [shared]
  bool used_backup_ = false, primary_bad_ = false, backup_bad_ = false, journal_header_bad_ = false;
  ReplayResult pending_;

  // [shared] by pass 5: the descriptors and bitmaps as read, and whether they are trusted.
  std::vector<GroupDesc> gd_;
  std::vector<uint8_t> gdt_raw_;
  std::vector<bool> gd_ok_, bb_ok_, ib_ok_;
  std::vector<std::vector<uint8_t>> bb_, ib_;

  std::vector<uint64_t> claimed_, dups_;
  // kFeatureSharedBlocks: [shared] by pass 5: each group's table, and the blocks written
  // extents of regular files share as pass 1 found them (sorted), with their references
  // (at most kMaxRefcount: pass 1B copies the rest).
  bool shared_blocks_ = false;
  std::vector<RefTable> rt_;
  std::vector<std::pair<uint64_t, uint32_t>> refs_;
  std::vector<uint64_t> found_claims_;  // [shared] by pass 5: claims as pass 1 found them
  std::vector<Info>
      infos_;               // [shared] by pass 5; pass 2's workers set one directory's rebuild each
  size_t found_infos_ = 0;  // [shared] infos_ as pass 1 found them (the rest are created)
  std::vector<uint32_t> slot_;          // [shared] by pass 5: inode -> infos_ index + 1
  std::vector<std::vector<Ent>> ents_;  // pass 2's workers fill one directory's each
  std::vector<uint32_t> extra_names_;   // check mode: names /lost+found would give
  uint64_t lost_found_ = 0;
  uint32_t alloc_group_ = 0;
  std::unique_ptr<Workers> workers_;  // made on first use
};

}  // namespace warpfs::fs::fsck_impl
