// Pass 1: every inode of every group: checksum, type, flags, the extent tree (its nodes'
// headers, the extents' ranges and order), the xattr chain and value blocks, and the block
// count. Assumes the
// Layout and the descriptors of pass 0; builds the model the later passes read (one Info per
// allocated inode, in inode order) and the block claims (claimed_), whose repeats go to
// pass 1B. Nothing here looks at another inode: directories are pass 2's.
//
// The groups are scanned side by side (Workers::for_each_index), each by an InodeScanner that reads
// only the device and the Layout and writes only its GroupScan; the calling thread then
// merges the scans in group order (reports, Infos, claims), so the outcome is the serial one.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>
#include <set>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

// What pass 1 found in one group: written by the one worker that scans the group, read by
// the calling thread after Workers::for_each_index returns (its join orders the two).
struct GroupScan {
  std::vector<Info> infos;  // the group's allocated inodes, in inode order
  Findings findings;        // in the order a serial scan reports them
  std::string error;        // the first read error
  bool table_read = false;  // the inode table was read to its end
};

namespace {

// An extent tree's walk: what survives of it.
struct Walk {
  std::vector<Extent> ext;
  std::vector<uint64_t> tree;
  uint64_t prev_end = 0;
  bool changed = false;
};

std::string times_problem(const Inode& d, const uint8_t* v, size_t len);

// Scans one group's inode table into a GroupScan.
// Thread-safety: one per worker; shares only the device (BlockDevice: any thread may read)
// and the Layout (not written during pass 1).
class InodeScanner {
 public:
  InodeScanner(BlockDevice& io, const Layout& l, GroupScan& out, bool chains)
      : io_(io), L_(l), out_(out), chains_(chains) {}
  void scan_group(uint32_t g);

 private:
  void problem(const std::string& line, const std::string& fix) {
    out_.findings.push_back(Finding{line, fix});
  }
  bool read(uint64_t b, uint64_t n, void* buf) {
    const std::string why = read_blocks(io_, b, n, buf);
    if (!why.empty() && out_.error.empty()) out_.error = why;
    return why.empty();
  }
  void check_inode(uint64_t ino, const Inode& d);
  bool check_fields(Info& n, const Inode& d, const std::string& where);
  bool check_mapping(Info& n, const Inode& d, const std::string& where);
  void walk_root(const Info& n, Walk& w, const Inode& d, const std::string& where);
  void check_blocks(Info& n, const Inode& d, const std::string& where);
  void walk_leaf(Walk& w, const Extent* e, uint32_t count, uint64_t lo, uint64_t hi,
                 const std::string& where);
  void walk_index(const Info& n, Walk& w, const ExtentIndex* e, uint32_t count,
                  uint16_t child_depth, uint64_t lo, uint64_t hi, const std::string& where);
  void walk_node(const Info& n, Walk& w, uint64_t block, uint16_t depth, uint64_t lo, uint64_t hi);
  std::string node_problem(const Info& n, const std::vector<uint8_t>& buf, uint16_t depth);
  bool check_xattrs(Info& n, const Inode& d, const std::string& where);
  void check_times(Info& n, const Inode& d, const std::string& where);
  std::string chain_block_problem(const Info& n, uint64_t block, std::vector<uint8_t>& buf);
  std::string value_problem(const Info& n, const uint8_t* entry, const XattrEntryHeader& e,
                            std::vector<uint64_t>* blocks);

  BlockDevice& io_;
  const Layout& L_;
  GroupScan& out_;
  const bool chains_;      // kFeatureXattrChain
  bool times_ok_ = false;  // the inode being checked has a sound times record
};

void InodeScanner::scan_group(uint32_t g) {
  std::vector<uint8_t> buf(size_t{kChunk} * kBlockSize);
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
  out_.table_read = true;
}

// One allocated inode. An Info left kBad owns nothing (its blocks are not claimed).
void InodeScanner::check_inode(uint64_t ino, const Inode& d) {
  Info& n = out_.infos.emplace_back(Info{.ino = ino,
                                         .mode = d.mode,
                                         .links = d.links,
                                         .flags = d.flags,
                                         .size = d.size,
                                         .blocks = d.blocks,
                                         .parent = d.parent,
                                         .next_orphan = d.next_orphan,
                                         .xattr = d.xattr_block,
                                         .dir_seed = d.dir_seed});
  const std::string where = "inode " + num(ino);
  if (!check_fields(n, d, where)) return;
  if (S_ISLNK(d.mode) && (n.flags & Inode::kFlagInlineSymlink)) {
    // FORMAT.md "Names, links and the orphan list": up to 127 bytes in the inode.
    if (d.size == 0 || d.size > Inode::kInlineSymlinkMax || d.extent_count != 0 ||
        d.tree_depth != 0 || strnlen(d.root.symlink, sizeof d.root.symlink) < d.size) {
      n.state = State::kBad;
      problem(where + ": malformed inline symlink (" + num(d.size) + " bytes)", "cleared");
      return;
    }
  } else if (!check_mapping(n, d, where)) {
    return;
  }
  check_blocks(n, d, where);
  check_times(n, d, where);
}

// A time field holding a sentinel needs its exact value in the internal record (FORMAT.md
// "Inode"), which check_xattrs found well formed or dropped: without it the field is
// clamped to the nearest time it holds.
void InodeScanner::check_times(Info& n, const Inode& d, const std::string& where) {
  const char* names[] = {"atime", "mtime", "ctime", "crtime"};
  const uint64_t fields[] = {d.atime_ns, d.mtime_ns, d.ctime_ns, d.crtime_ns};
  for (int i = 0; i < 4; ++i) {
    if (!time_sentinel(fields[i]) || times_ok_) continue;
    problem(where + ": " + names[i] + " is out of range but has no record of its value",
            "clamped to the " + std::string(fields[i] == kTimeBelow ? "earliest" : "latest") +
                " time it holds");
    n.clamp_times = n.dirty = true;
  }
}

// "" or what is wrong with the internal times record `v` of an inode `d`: its size, its
// nanoseconds, each field holding a sentinel recorded as out of range on that side.
std::string times_problem(const Inode& d, const uint8_t* v, size_t len) {
  if (!has_time_sentinel(d)) return "is kept though no time is out of range";
  TimesRecord r;
  if (len != sizeof r) return "has " + num(len) + " bytes, not " + num(sizeof r);
  std::memcpy(&r, v, sizeof r);
  const uint64_t fields[] = {d.atime_ns, d.mtime_ns, d.ctime_ns, d.crtime_ns};
  for (int i = 0; i < 4; ++i) {
    if (!time_sentinel(fields[i])) continue;
    if (r.t[i].nsec >= 1000000000 || time_ns_from(r.t[i].sec, r.t[i].nsec) != fields[i]) {
      return "holds a time that does not match its field's sentinel";
    }
  }
  return "";
}

// Checksum, type, flags, parent field: false (and kBad) if the inode cannot be trusted.
bool InodeScanner::check_fields(Info& n, const Inode& d, const std::string& where) {
  if (d.checksum != inode_checksum(d, n.ino, L_.seed)) {
    n.state = State::kBad;
    problem(where + ": checksum mismatch", "cleared");
    return false;
  }
  if (!valid_type(d.mode)) {
    n.state = State::kBad;
    char m[16];
    std::snprintf(m, sizeof m, "0%o", d.mode);
    problem(where + ": invalid mode " + m, "cleared");
    return false;
  }
  if (n.flags & ~Inode::kKnownFlags) {
    problem(where + ": unknown flags " + num(n.flags), "cleared");
    n.flags &= Inode::kKnownFlags;
    n.dirty = true;
  }
  if ((n.flags & Inode::kFlagInlineSymlink) && !S_ISLNK(d.mode)) {
    problem(where + ": the inline-symlink flag is set on " + type_name(d.mode), "cleared");
    n.flags &= ~Inode::kFlagInlineSymlink;
    n.dirty = true;
  }
  if (!is_dir(n) && n.parent != 0) {
    problem(where + ": parent field " + num(n.parent) + " on " + type_name(d.mode), "set to 0");
    n.parent = 0;
    n.dirty = true;
  }
  return true;
}

// The extent tree; a symlink's must be one written block. False (and kBad) if it is not.
bool InodeScanner::check_mapping(Info& n, const Inode& d, const std::string& where) {
  Walk w;
  walk_root(n, w, d, where);
  if (S_ISLNK(d.mode)) {
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
      return false;
    }
  }
  n.ext = std::move(w.ext);
  n.tree = std::move(w.tree);
  if (w.changed) n.remap = n.dirty = true;
  return true;
}

// The inode's root: inline extents (depth 0) or index entries (depth 1 or 2).
void InodeScanner::walk_root(const Info& n, Walk& w, const Inode& d, const std::string& where) {
  uint32_t count = d.extent_count;
  if (d.tree_depth == 0) {
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
    problem(where + ": extent tree depth " + num(d.tree_depth) + " (at most 2)", "mapping cleared");
    w.changed = true;
  }
}

// The xattr chain, then the block count against what the inode owns.
void InodeScanner::check_blocks(Info& n, const Inode& d, const std::string& where) {
  times_ok_ = false;
  const bool xattrs_changed = n.xattr != 0 && check_xattrs(n, d, where);
  uint64_t blocks = meta_blocks(n);
  for (const Extent& e : n.ext) blocks += e.blocks();
  if (blocks != n.blocks) {
    if (!n.remap && !xattrs_changed) {
      problem(where + ": blocks " + num(n.blocks) + ", but " + num(blocks) + " are allocated",
              "set to " + num(blocks));
    }
    n.blocks = blocks;
    n.dirty = true;
  }
}

// The chain of xattr blocks (FORMAT.md "Extended attributes"): each block's header and
// entries, each out-of-line value's blocks, no name twice, no block twice. Repairs lose the
// least they can: a bad block cuts the chain there (the block before it becomes the last),
// a bad entry (malformed value record, bad value block, a name seen before) is removed from
// its block. The value and chain blocks that stay go to n.xblocks; rewritten blocks to
// n.xpatch. True if anything was repaired.
bool InodeScanner::check_xattrs(Info& n, const Inode& d, const std::string& where) {
  std::set<uint64_t> seen;                                       // this inode's xattr blocks so far
  std::set<std::pair<uint8_t, std::string>> names;               // namespace (without bit 7), name
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> chain;  // blocks kept, as repaired
  std::vector<bool> changed;
  bool repaired = false;
  for (uint64_t b = n.xattr; b != 0;) {
    std::vector<uint8_t> buf(kBlockSize);
    std::string why =
        seen.count(b) ? "referenced twice (the chain loops)" : chain_block_problem(n, b, buf);
    if (!why.empty()) {
      problem(where + ": xattr block " + num(b) + ": " + why,
              chain.empty() ? "detached (its attributes are lost)"
                            : "chain cut before it (the attributes from it on are lost)");
      repaired = true;
      if (chain.empty()) {
        n.xattr = 0;
        n.dirty = true;
      } else {
        XattrHeader p;
        std::memcpy(&p, chain.back().second.data(), sizeof p);
        p.next = 0;
        std::memcpy(chain.back().second.data(), &p, sizeof p);
        changed.back() = true;
      }
      break;
    }
    seen.insert(b);
    XattrHeader h;
    std::memcpy(&h, buf.data(), sizeof h);
    // The entries: the good ones are packed again, the bad ones dropped.
    std::vector<uint8_t> out(kBlockSize, 0);
    size_t off = sizeof h, put = sizeof h;
    uint16_t kept = 0;
    bool dropped = false;
    for (uint16_t i = 0; i < h.count; ++i) {
      XattrEntryHeader e;
      std::memcpy(&e, buf.data() + off, sizeof e);
      const size_t sz = (sizeof e + e.name_len + e.value_len + 3) & ~size_t{3};
      const uint8_t* p = buf.data() + off;
      const std::string name(reinterpret_cast<const char*>(p + sizeof e), e.name_len);
      std::vector<uint64_t> vblocks;
      std::string bad;
      if (!names.insert({static_cast<uint8_t>(e.name_index & ~kXattrOutOfLine), name}).second) {
        bad = "repeats a name";
      } else if (e.name_index == kXattrInternal && name == kTimesRecordName) {
        bad = times_problem(d, p + sizeof e + e.name_len, e.value_len);
        if (bad.empty()) times_ok_ = true;
      } else if (e.name_index & kXattrOutOfLine) {
        bad = value_problem(n, p, e, &vblocks);
        for (size_t k = 0; k < vblocks.size() && bad.empty(); ++k) {
          if (seen.count(vblocks[k]) ||
              std::find(vblocks.begin(), vblocks.begin() + static_cast<long>(k), vblocks[k]) !=
                  vblocks.begin() + static_cast<long>(k)) {
            bad = "has value block " + num(vblocks[k]) + " taken twice";
          }
        }
        if (bad.empty()) seen.insert(vblocks.begin(), vblocks.end());
      }
      off += sz;
      if (!bad.empty()) {
        problem(where + ": xattr block " + num(b) + ": entry " + printable(name) + " " + bad,
                "removed");
        dropped = repaired = true;
        continue;
      }
      std::memcpy(out.data() + put, p, sz);
      for (size_t k = 0; k < vblocks.size(); ++k) {
        n.xblocks.push_back(vblocks[k]);
        n.xref.emplace_back(
            b, static_cast<uint32_t>(put + sizeof e + e.name_len + sizeof(XattrValueRef) + 8 * k));
      }
      put += sz;
      ++kept;
    }
    if (dropped) {
      h.count = kept;
      h.used = static_cast<uint16_t>(put - sizeof h);
      std::memcpy(out.data(), &h, sizeof h);
      buf = std::move(out);
    }
    if (!chain.empty()) {
      n.xblocks.push_back(b);
      n.xref.emplace_back(chain.back().first, static_cast<uint32_t>(offsetof(XattrHeader, next)));
    }
    chain.emplace_back(b, std::move(buf));
    changed.push_back(dropped);
    b = h.next;
  }
  for (size_t i = 0; i < chain.size(); ++i) {
    if (!changed[i]) continue;
    const uint64_t sum = block_checksum(chain[i].second.data(), kHeaderChecksumOffset, L_.seed);
    std::memcpy(chain[i].second.data() + kHeaderChecksumOffset, &sum, 8);
    n.xpatch.push_back(std::move(chain[i]));
  }
  return repaired;
}

// "" or what is wrong with a chain block: where it is, its header, its entries' layout.
std::string InodeScanner::chain_block_problem(const Info& n, uint64_t block,
                                              std::vector<uint8_t>& buf) {
  if (!L_.is_data(block)) return "lies outside the data area";
  if (!read(block, 1, buf.data())) return "unreadable";
  if (std::string why = header_problem<XattrHeader>(buf.data(), kXattrMagic, n.ino, L_.seed);
      !why.empty()) {
    return why;
  }
  XattrHeader h;
  std::memcpy(&h, buf.data(), sizeof h);
  if (sizeof h + h.used > kBlockSize) return "used bytes " + num(h.used) + " overflow the block";
  if (h.next != 0 && !chains_) return "links a chain without the xattr_chain feature";
  const size_t end = sizeof h + h.used;
  size_t off = sizeof h;
  for (uint16_t i = 0; i < h.count; ++i) {
    XattrEntryHeader e;
    if (off + sizeof e > end) return "entry " + num(i) + " past the used bytes";
    std::memcpy(&e, buf.data() + off, sizeof e);
    const uint8_t index = e.name_index & ~kXattrOutOfLine;
    if (e.name_len == 0 || index < kXattrUser || index > kXattrInternal ||
        ((e.name_index & kXattrOutOfLine) && !chains_)) {
      return "malformed entry " + num(i);
    }
    off += (sizeof e + e.name_len + e.value_len + 3) & ~size_t{3};
    if (off > end) return "entry " + num(i) + " past the used bytes";
  }
  if (off != end) {
    return num(h.count) + " entries end at byte " + num(off) + ", not " + num(end);
  }
  return "";
}

// "" or what is wrong with an out-of-line value: its record, each value block's place,
// header, position and bytes. *blocks: the value's blocks (when the record is readable).
std::string InodeScanner::value_problem(const Info& n, const uint8_t* entry,
                                        const XattrEntryHeader& e, std::vector<uint64_t>* blocks) {
  XattrValueRef r;
  if (e.value_len < sizeof r) return "has a truncated value record";
  std::memcpy(&r, entry + sizeof e + e.name_len, sizeof r);
  if (r.size == 0 || r.size > kXattrValueMax || r.count != div_up(r.size, kXattrValuePayload) ||
      e.value_len != sizeof r + size_t{r.count} * 8) {
    return "has a malformed value record (" + num(r.size) + " bytes in " + num(r.count) +
           " blocks)";
  }
  blocks->resize(r.count);
  std::memcpy(blocks->data(), entry + sizeof e + e.name_len + sizeof r, size_t{r.count} * 8);
  std::vector<uint8_t> buf(kBlockSize);
  for (uint32_t i = 0; i < r.count; ++i) {
    const uint64_t b = (*blocks)[i];
    const std::string at = "value block " + num(b);
    if (!L_.is_data(b)) return "has " + at + " outside the data area";
    if (!read(b, 1, buf.data())) return "has " + at + " unreadable";
    if (std::string why =
            header_problem<XattrValueHeader>(buf.data(), kXattrValueMagic, n.ino, L_.seed);
        !why.empty()) {
      return "has " + at + " with " + why;
    }
    XattrValueHeader h;
    std::memcpy(&h, buf.data(), sizeof h);
    const uint32_t want = std::min(kXattrValuePayload, r.size - i * kXattrValuePayload);
    if (h.position != i || h.used != want) {
      return "has " + at + " at position " + num(h.position) + " with " + num(h.used) +
             " bytes, expected " + num(i) + " and " + num(want);
    }
  }
  return "";
}

// Extents of one node (the inode's root or a leaf block) covering [lo, hi): kept in
// `w.ext` when sound, reported and dropped when not.
void InodeScanner::walk_leaf(Walk& w, const Extent* e, uint32_t count, uint64_t lo, uint64_t hi,
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

void InodeScanner::walk_index(const Info& n, Walk& w, const ExtentIndex* e, uint32_t count,
                              uint16_t child_depth, uint64_t lo, uint64_t hi,
                              const std::string& where) {
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

void InodeScanner::walk_node(const Info& n, Walk& w, uint64_t block, uint16_t depth, uint64_t lo,
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
  if (const std::string why = node_problem(n, buf, depth); !why.empty()) {
    problem(where + ": " + why, "dropped (the extents under it are lost)");
    w.changed = true;
    return;
  }
  ExtentNodeHeader h;
  std::memcpy(&h, buf.data(), sizeof h);
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

// "" or what is wrong with an extent-tree node's header.
std::string InodeScanner::node_problem(const Info& n, const std::vector<uint8_t>& buf,
                                       uint16_t depth) {
  const std::string why =
      header_problem<ExtentNodeHeader>(buf.data(), kExtentMagic, n.ino, L_.seed);
  if (!why.empty()) return why;
  ExtentNodeHeader h;
  std::memcpy(&h, buf.data(), sizeof h);
  if (h.depth != depth) return "depth " + num(h.depth) + ", expected " + num(depth);
  if (h.count == 0 || h.count > kExtentNodeCapacity)
    return num(h.count) + " entries (1 to " + num(kExtentNodeCapacity) + ")";
  return "";
}

}  // namespace

// --- the pass: groups scanned in windows, merged in order ---------------------------------

void Checker::pass1() {
  slot_.assign(L_.inode_count + 1, 0);
  claimed_.assign(div_up(L_.block_count, 64), 0);
  claim_metadata();
  // The superblock's count of used inodes, as a hint: the Infos are appended without moving.
  infos_.reserve(L_.inode_count - std::min(sb_->free_inodes, L_.inode_count) + 64);
  const unsigned t = workers().count();
  // A window of groups at a time: enough tasks to balance the workers, while the reports
  // and the progress callback still advance as the scan does.
  const uint32_t window = t == 1 ? 1 : 4 * t;
  const bool chains = (sb_->features & kFeatureXattrChain) != 0;
  for (uint32_t base = 0; base < L_.groups && !failed(); base += window) {
    const uint32_t n = std::min(window, L_.groups - base);
    std::vector<GroupScan> scans(n);
    workers().for_each_index(
        n, [&](uint32_t i) { InodeScanner(*io_, L_, scans[i], chains).scan_group(base + i); });
    for (uint32_t i = 0; i < n && !failed(); ++i) {
      merge_group(scans[i]);
      if (!scans[i].table_read) return;
      if (o_.progress) o_.progress(base + i + 1, L_.groups);
    }
  }
  pass1_summary();
}

// The metadata area owns its blocks first, and so do the reference-count tables kept.
void Checker::claim_metadata() {
  claim(0, L_.first_group);
  for (uint32_t g = 0; g < L_.groups; ++g) {
    claim(L_.group_start(g), 2 + uint64_t{L_.itb});
    if (rt_[g].at != 0) claim(L_.group_start(g) + rt_[g].at, kRefcountBlocks);
  }
  claim(L_.block_count - 1, 1);
}

// One group's scan joins the model, as if the calling thread had scanned it.
void Checker::merge_group(GroupScan& s) {
  report_all(s.findings);
  for (Info& n : s.infos) {
    slot_[n.ino] = static_cast<uint32_t>(infos_.size() + 1);
    if (n.state == State::kLive) for_each_claim(n, [&](uint64_t a, uint64_t c) { claim(a, c); });
    infos_.push_back(std::move(n));
  }
  if (!s.error.empty()) fail(s.error);
}

void Checker::pass1_summary() {
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

}  // namespace warpfs::fs::fsck_impl
