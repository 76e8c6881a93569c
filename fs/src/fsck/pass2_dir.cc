// Pass 2, one directory (FORMAT.md "Directories"): its blocks by index, the index root and
// index blocks, the leaves and their entries. Any structural fault marks the directory for a
// rebuild from the entries that survive; leaves whose checksum fails, or that no index entry
// reaches, still yield the entries whose hash matches their name (a 63-bit check per entry).
#include <cstring>
#include <unordered_set>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

// Checks one directory's blocks and collects its entries into `out`.
// Thread-safety: one per worker (scan_dir in checker.h says what it touches).
class DirScan {
 public:
  DirScan(BlockDevice& io, const Layout& l, Info& d, std::vector<Ent>& out, DirFindings& f)
      : io_(io), L_(l), d_(d), out_(out), f_(f), where_("directory " + num(d.ino)) {}
  void run();

 private:
  enum : uint8_t { kNone, kRoot, kIndex, kLeaf };
  void problem(const std::string& line, const std::string& fix) {
    f_.findings.push_back(Finding{line, fix});
  }
  void flag(const std::string& line) {
    problem(where_ + ": " + line, "directory rebuilt");
    d_.rebuild = true;
  }
  const uint8_t* blk(uint64_t k) const { return buf_.data() + k * kBlockSize; }
  // "leaf block 1234 (directory block 3)": the device block, then its place in the directory.
  std::string bname(const std::string& what, uint64_t k) const {
    return what + "block " + num(phys_[k]) + " (directory block " + num(k) + ")";
  }
  bool map_blocks();
  bool read_all();
  void walk_index();
  void walk_subindex(uint64_t c, uint64_t lo, uint64_t hi);
  bool index_entries(uint64_t k, uint16_t want_depth, uint64_t lo, uint64_t hi,
                     std::vector<DirIndexEntry>* e);
  std::string index_problem(uint64_t k, uint16_t want_depth) const;
  bool refer(uint64_t from, uint64_t c, uint8_t want);
  void scan_leaf(uint64_t k, uint64_t lo, uint64_t hi, bool salvage);
  bool leaf_header(uint64_t k, const DirLeafHeader& h, bool* salvage);
  bool entry_at(const uint8_t* b, size_t off, size_t end, bool verify, DirEntryHeader* e,
                std::string* name) const;
  bool keep_entry(uint64_t k, const DirEntryHeader& e, const std::string& name, uint64_t hash,
                  uint64_t lo, uint64_t hi, uint64_t* prev, bool* sorted);
  void salvage_unreferenced();
  void drop_duplicates();

  BlockDevice& io_;
  const Layout& L_;
  Info& d_;
  std::vector<Ent>& out_;
  DirFindings& f_;
  const std::string where_;
  uint64_t n_ = 0;              // directory blocks looked at
  std::vector<uint64_t> phys_;  // directory block -> device block (0: not mapped)
  std::vector<uint8_t> buf_;    // the n_ blocks
  std::vector<uint8_t> kind_;   // what each block was reached as
  bool salvage_all_ = false;    // the index cannot be followed: every leaf is salvaged
};

namespace {

bool bad_name(const std::string& name) {
  return name.find_first_of(std::string("/\0", 2)) != std::string::npos || name == "." ||
         name == "..";
}

}  // namespace

void DirScan::run() {
  if (!map_blocks() || !read_all()) return;
  kind_.assign(n_, kNone);
  walk_index();
  salvage_unreferenced();
  drop_duplicates();
}

// The directory's blocks by index: 0..n-1, every one mapped and written.
bool DirScan::map_blocks() {
  const uint64_t mapped = mapped_end(d_);
  if (d_.size % kBlockSize != 0 || d_.size / kBlockSize != mapped) {
    flag("size " + num(d_.size) + ", but " + num(mapped) + " blocks are mapped");
  }
  n_ = std::min(mapped, kMaxDirBlocks);
  if (mapped > kMaxDirBlocks) flag("more blocks than a directory can index (" + num(mapped) + ")");
  phys_.assign(n_, 0);
  for (const Extent& e : d_.ext) {
    if (e.logical >= n_) continue;
    if (e.unwritten()) {
      flag("extent " + extent_str(e) + " is unwritten");
      continue;
    }
    for (uint64_t k = 0; k < e.blocks() && e.logical + k < n_; ++k)
      phys_[e.logical + k] = e.physical + k;
  }
  for (uint64_t k = 0; k < n_; ++k) {
    if (phys_[k] == 0) {
      uint64_t j = k;
      while (j + 1 < n_ && phys_[j + 1] == 0) ++j;
      flag(span_str("block", k, j) + " not mapped");
      k = j;
    }
  }
  if (n_ == 0) flag("no blocks");
  return n_ != 0;
}

// Every mapped block, in runs of physically consecutive ones.
bool DirScan::read_all() {
  buf_.assign(n_ * kBlockSize, 0);
  for (uint64_t k = 0; k < n_;) {
    if (phys_[k] == 0) {
      ++k;
      continue;
    }
    uint64_t j = k + 1;
    while (j < n_ && phys_[j] == phys_[j - 1] + 1) ++j;
    f_.error = read_blocks(io_, phys_[k], j - k, buf_.data() + k * kBlockSize);
    if (!f_.error.empty()) return false;
    k = j;
  }
  return true;
}

// From the index root down to the leaves (depth 1: leaves under the root; 2: index blocks).
void DirScan::walk_index() {
  kind_[0] = kRoot;
  std::vector<DirIndexEntry> root;
  if (phys_[0] == 0 || !index_entries(0, 0, 0, kHashEnd, &root)) {
    salvage_all_ = true;
    return;
  }
  DirIndexHeader rh;
  std::memcpy(&rh, blk(0), sizeof rh);
  for (size_t i = 0; i < root.size(); ++i) {
    const uint64_t lo = i == 0 ? 0 : root[i].hash_low;
    const uint64_t hi = i + 1 < root.size() ? root[i + 1].hash_low : kHashEnd;
    const uint64_t c = root[i].block;
    if (rh.depth == 1) {
      if (refer(0, c, kLeaf)) scan_leaf(c, lo, hi, false);
    } else if (refer(0, c, kIndex)) {
      walk_subindex(c, lo, hi);
    }
  }
}

// An index block at depth 2, covering hashes [lo, hi).
void DirScan::walk_subindex(uint64_t c, uint64_t lo, uint64_t hi) {
  std::vector<DirIndexEntry> sub;
  if (phys_[c] == 0 || !index_entries(c, 1, lo, hi, &sub)) {
    salvage_all_ = true;
    return;
  }
  for (size_t j = 0; j < sub.size(); ++j) {
    const uint64_t slo = j == 0 ? lo : sub[j].hash_low;
    const uint64_t shi = j + 1 < sub.size() ? sub[j + 1].hash_low : hi;
    if (refer(c, sub[j].block, kLeaf)) scan_leaf(sub[j].block, slo, shi, false);
  }
}

// An index node (the root or, at depth 2, an index block): its entries and their ranges.
bool DirScan::index_entries(uint64_t k, uint16_t want_depth, uint64_t lo, uint64_t hi,
                            std::vector<DirIndexEntry>* e) {
  const std::string what = k == 0 ? "index root " : "index ";
  if (const std::string why = index_problem(k, want_depth); !why.empty()) {
    flag(bname(what, k) + ": " + why);
    return false;
  }
  DirIndexHeader h;
  std::memcpy(&h, blk(k), sizeof h);
  e->resize(h.count);
  std::memcpy(e->data(), blk(k) + sizeof h, h.count * sizeof(DirIndexEntry));
  for (size_t i = 1; i < e->size(); ++i) {
    if ((*e)[i].hash_low <= (*e)[i - 1].hash_low || (*e)[i].hash_low <= lo ||
        (*e)[i].hash_low >= hi) {
      flag(bname(what, k) + ": entries out of order or out of range");
      break;
    }
  }
  return true;
}

// "" or what is wrong with an index node's header (want_depth 0: the root, depth 1 or 2).
std::string DirScan::index_problem(uint64_t k, uint16_t want_depth) const {
  const std::string why = header_problem<DirIndexHeader>(blk(k), kDirIndexMagic, d_.ino, L_.seed);
  if (!why.empty()) return why;
  DirIndexHeader h;
  std::memcpy(&h, blk(k), sizeof h);
  if (want_depth == 0 ? (h.depth != 1 && h.depth != 2) : h.depth != want_depth)
    return "depth " + num(h.depth);
  if (h.count == 0 || h.count > kDirIndexCapacity)
    return num(h.count) + " entries (1 to " + num(kDirIndexCapacity) + ")";
  return "";
}

// Claims directory block `c` for kind `want`, once.
bool DirScan::refer(uint64_t from, uint64_t c, uint8_t want) {
  if (c == 0 || c >= n_ || kind_[c] != kNone) {
    flag(std::string(from == 0 ? "index root" : "index block " + num(from)) + " points at block " +
         num(c) + (c == 0 || c >= n_ ? ", outside the directory" : ", which is already used"));
    return false;
  }
  kind_[c] = want;
  return true;
}

// Parses a leaf. With `salvage` (its checksum failed, an entry is malformed, or no index
// reaches it) only entries whose hash matches their name are kept, silently: the whole
// block is searched, resynchronising at 8-byte boundaries after anything unparsable.
void DirScan::scan_leaf(uint64_t k, uint64_t lo, uint64_t hi, bool salvage) {
  const uint8_t* b = blk(k);
  DirLeafHeader h;
  std::memcpy(&h, b, sizeof h);
  if (phys_[k] == 0 || !leaf_header(k, h, &salvage)) return;
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
      for (off += 8; off < kBlockSize && !entry_at(b, off, kBlockSize, true, &e, &name); off += 8) {
      }
      continue;
    }
    off += e.rec_len;
    ++found;
    const uint64_t hash = name_hash(name.data(), name.size(), d_.dir_seed);
    if (salvage ? !bad_name(name) : keep_entry(k, e, name, hash, lo, hi, &prev, &sorted))
      out_.push_back(Ent{hash, e.inode, e.type, false, name});
  }
  if (salvage) return;
  if (off != end) {
    flag(bname("leaf ", k) + ": " + num(h.count) + " entries end at byte " + num(off) +
         ", the header says " + num(end));
  }
  if (!sorted) flag(bname("leaf ", k) + ": entries are not sorted by hash");
}

// The leaf's header: false if it is not this directory's leaf at all; a checksum mismatch
// turns the scan into a salvage.
bool DirScan::leaf_header(uint64_t k, const DirLeafHeader& h, bool* salvage) {
  if (h.magic != kDirLeafMagic || h.owner != d_.ino) {
    if (!*salvage)
      flag(bname("leaf ", k) + ": " +
           (h.magic != kDirLeafMagic ? "bad magic" : "owned by inode " + num(h.owner)));
    return false;
  }
  if (h.checksum != block_checksum(blk(k), kHeaderChecksumOffset, L_.seed)) {
    if (!*salvage) flag(bname("leaf ", k) + ": checksum mismatch");
    *salvage = true;
  }
  if (h.used > kLeafSpace && !*salvage)
    flag(bname("leaf ", k) + ": used bytes " + num(h.used) + " overflow the block");
  return true;
}

// The entry at `off` if it parses and, when `verify`, its hash matches its name.
bool DirScan::entry_at(const uint8_t* b, size_t off, size_t end, bool verify, DirEntryHeader* e,
                       std::string* name) const {
  if (off + sizeof *e > end) return false;
  std::memcpy(e, b + off, sizeof *e);
  if (e->name_len == 0 || e->rec_len != rec_len(e->name_len) || off + e->rec_len > end)
    return false;
  name->assign(reinterpret_cast<const char*>(b + off + sizeof *e), e->name_len);
  return !verify || e->hash == name_hash(name->data(), name->size(), d_.dir_seed);
}

// An entry of a sound leaf: its name, its hash, its place in the leaf's hash range. False if
// it is removed.
bool DirScan::keep_entry(uint64_t k, const DirEntryHeader& e, const std::string& name,
                         uint64_t hash, uint64_t lo, uint64_t hi, uint64_t* prev, bool* sorted) {
  if (bad_name(name)) {
    problem(where_ + ": entry '" + printable(name) + "' has an invalid name", "removed");
    d_.rebuild = true;
    return false;
  }
  if (e.hash != hash) {
    problem(where_ + ": entry '" + printable(name) + "' has hash " + num(e.hash) +
                ", but its name hashes to " + num(hash),
            "rehashed");
    d_.rebuild = true;
    return true;
  }
  if (e.hash < *prev) *sorted = false;
  *prev = e.hash;
  if (e.hash < lo || e.hash >= hi) {
    flag("entry '" + printable(name) + "' (hash " + num(e.hash) +
         ") lies outside the hash range of " + bname("leaf ", k));
  }
  return true;
}

// Blocks no index entry reaches. The core never abandons a leaf (directory blocks are never
// freed, and a new one is referenced in the transaction that adds it), so a valid leaf here
// lost its index entry: its entries are salvaged.
void DirScan::salvage_unreferenced() {
  for (uint64_t k = 1; k < n_; ++k) {
    if (kind_[k] != kNone || phys_[k] == 0) continue;
    uint64_t j = k;
    while (j + 1 < n_ && kind_[j + 1] == kNone && phys_[j + 1] != 0) ++j;
    if (!salvage_all_) flag(span_str("directory block", k, j) + " not referenced by the index");
    for (uint64_t i = k; i <= j; ++i) scan_leaf(i, 0, kHashEnd, true);
    k = j;
  }
}

// One name, one entry.
void DirScan::drop_duplicates() {
  std::unordered_set<std::string> seen;
  for (Ent& e : out_) {
    if (!seen.insert(e.name).second) {
      problem(where_ + ": entry '" + printable(e.name) + "' appears twice", "the second removed");
      e.drop = true;
      d_.rebuild = true;
    }
  }
}

void scan_dir(BlockDevice& io, const Layout& l, Info& d, std::vector<Ent>& out, DirFindings* f) {
  DirScan(io, l, d, out, *f).run();
}

}  // namespace warpfs::fs::fsck_impl
