// File block mapping by extents (fs/FORMAT.md "File data: extents"). A node's mapping is
// held in memory as leaves of at most 254 extents; a change touches the leaf it falls in
// (splitting a full leaf, dropping an empty one), and map_store() writes only the leaves
// and index that changed. Up to 8 extents live in the inode itself.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "internal.h"

namespace warpfs::fs {

namespace {

uint64_t end_of(const Extent& e) {
  return uint64_t{e.logical} + e.blocks();
}

bool mergeable(const Extent& a, const Extent& b) {
  return a.unwritten() == b.unwritten() && end_of(a) == b.logical &&
         a.physical + a.blocks() == b.physical &&
         uint64_t{a.blocks()} + b.blocks() < Extent::kUnwritten;
}

Extent make_extent(uint32_t logical, uint32_t blocks, uint64_t physical, bool unwritten) {
  return Extent{logical, blocks | (unwritten ? Extent::kUnwritten : 0u), physical};
}

// Index of the leaf covering lblk: the last leaf whose first extent starts at or before it.
size_t leaf_for(const std::vector<ExtentLeaf>& leaves, uint64_t lblk) {
  size_t lo = 1, hi = leaves.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (leaves[mid].ext.front().logical <= lblk)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - 1;
}

}  // namespace

int FsImpl::meta_get(uint64_t block, MetaBuf** out, uint32_t magic, Ino owner, uint32_t alt_magic,
                     std::string (*layout)(const uint8_t*)) {
  auto verify = [magic, alt_magic, owner, layout](const MetaBuf& b) -> std::string {
    uint32_t m;
    std::memcpy(&m, b.data, 4);
    const uint64_t o = header_owner(b.data);
    if (m != magic && (alt_magic == 0 || m != alt_magic)) return "wrong magic";
    if (o != owner) return "owned by inode " + std::to_string(o) + ", not " + std::to_string(owner);
    return layout ? layout(b.data) : "";
  };
  return journal_->get(block, MetaKind::kHeader, 0, out, verify, owner);
}

int FsImpl::lock_mapped(Node& n, std::shared_lock<SharedMutex>* lk) {
  WARPFS_DCHECK(!held_by_me(n.rw), "lock_mapped: rw already held");
  *lk = std::shared_lock<SharedMutex>(n.rw);
  if (n.mapped) return 0;
  lk->unlock();
  {
    std::unique_lock<SharedMutex> ex(n.rw);
    if (int rc = load_map(n); rc) return rc;
  }
  lk->lock();
  return 0;
}

int FsImpl::load_map(Node& n) {
  WARPFS_DCHECK(n.mapped ? readable_by_me(n) : changeable_by_me(n),
                "load_map: rw held (exclusive for the first load)");
  if (n.mapped) return 0;
  n.leaves.clear();
  n.index_blocks.clear();
  const Inode& d = n.disk;
  auto bad = [&](const std::string& why) {
    log("inode " + std::to_string(n.ino) + ": extent tree " + why + " (run fsck.warpfs)");
    n.leaves.assign(1, ExtentLeaf{});
    return EIO;
  };
  if (d.flags & Inode::kFlagInlineSymlink) {
    n.leaves.assign(1, ExtentLeaf{});
    n.mapped = true;
    return 0;
  }
  auto read_node = [&](uint64_t block, uint16_t want_depth, const uint8_t** entries,
                       uint16_t* count) -> int {
    MetaBuf* b;
    if (block == 0 || block >= sb_.block_count) return bad("points outside the device");
    if (int rc = meta_get(block, &b, kExtentMagic, n.ino); rc) return rc;
    ExtentNodeHeader h;
    std::memcpy(&h, b->data, sizeof h);
    if (h.depth != want_depth || h.count > kExtentNodeCapacity) return bad("node has a bad header");
    *entries = b->data + sizeof h;
    *count = h.count;
    return 0;
  };
  auto add_leaf = [&](uint64_t block) -> int {
    const uint8_t* e = nullptr;
    uint16_t count = 0;
    if (int rc = read_node(block, 0, &e, &count); rc) return rc;
    if (count == 0) return bad("has an empty leaf");
    ExtentLeaf l;
    l.block = block;
    l.ext.resize(count);
    std::memcpy(l.ext.data(), e, count * sizeof(Extent));
    n.leaves.push_back(std::move(l));
    return 0;
  };
  if (d.tree_depth == 0) {
    if (d.extent_count > Inode::kInlineExtents) return bad("inline count too large");
    ExtentLeaf l;
    l.ext.assign(d.root.extents, d.root.extents + d.extent_count);
    n.leaves.push_back(std::move(l));
  } else if (d.tree_depth == 1 || d.tree_depth == 2) {
    if (d.extent_count == 0 || d.extent_count > Inode::kInlineExtents)
      return bad("root count out of range");
    ExtentIndex root[Inode::kInlineExtents];
    std::memcpy(root, d.root.extents, sizeof root);
    for (uint32_t i = 0; i < d.extent_count; ++i) {
      if (d.tree_depth == 1) {
        if (int rc = add_leaf(root[i].child); rc) return rc;
        continue;
      }
      const uint8_t* e = nullptr;
      uint16_t count = 0;
      if (int rc = read_node(root[i].child, 1, &e, &count); rc) return rc;
      n.index_blocks.push_back(root[i].child);
      std::vector<ExtentIndex> idx(count);
      std::memcpy(idx.data(), e, count * sizeof(ExtentIndex));
      for (const ExtentIndex& x : idx) {
        if (int rc = add_leaf(x.child); rc) return rc;
      }
    }
  } else {
    return bad("depth " + std::to_string(d.tree_depth) + " is not supported");
  }
  // Sorted and non-overlapping across leaves.
  uint64_t prev_end = 0;
  for (const ExtentLeaf& l : n.leaves) {
    for (const Extent& e : l.ext) {
      if (e.logical < prev_end || e.blocks() == 0 || e.physical + e.blocks() > sb_.block_count) {
        return bad("has overlapping or out-of-range extents");
      }
      prev_end = end_of(e);
    }
  }
  n.mapped = true;
  return 0;
}

FsImpl::Mapping FsImpl::map_lookup(Node& n, uint32_t lblk) {
  WARPFS_DCHECK(readable_by_me(n), "map_lookup: rw held");
  WARPFS_DCHECK(n.mapped, "map_lookup: mapping loaded");
  const size_t li = leaf_for(n.leaves, lblk);
  const std::vector<Extent>& ext = n.leaves[li].ext;
  auto it = std::upper_bound(ext.begin(), ext.end(), lblk,
                             [](uint32_t l, const Extent& e) { return l < e.logical; });
  if (it != ext.begin()) {
    const Extent& e = *(it - 1);
    if (lblk < end_of(e)) {
      return Mapping{false, lblk, static_cast<uint32_t>(end_of(e) - lblk),
                     e.physical + (lblk - e.logical), e.unwritten()};
    }
  }
  uint64_t next = kNoBlock;
  if (it != ext.end()) {
    next = it->logical;
  } else if (li + 1 < n.leaves.size()) {
    next = n.leaves[li + 1].ext.front().logical;
  }
  const uint64_t len = std::min<uint64_t>(next - lblk, 0x7fffffffu);
  return Mapping{true, lblk, static_cast<uint32_t>(len), 0, false};
}

int FsImpl::map_remove(Node& n, uint32_t l, uint64_t count, std::vector<Extent>* removed) {
  WARPFS_DCHECK(changeable_by_me(n), "map_remove: rw exclusive");
  WARPFS_DCHECK(n.mapped, "map_remove: mapping loaded");
  const uint64_t end = std::min<uint64_t>(uint64_t{l} + count, kNoBlock);
  bool changed_starts = false;
  for (size_t li = leaf_for(n.leaves, l); li < n.leaves.size(); ++li) {
    ExtentLeaf& leaf = n.leaves[li];
    if (!leaf.ext.empty() && leaf.ext.front().logical >= end) break;
    std::vector<Extent> keep;
    bool touched = false;
    for (const Extent& e : leaf.ext) {
      const uint64_t es = e.logical, ee = end_of(e);
      if (ee <= l || es >= end) {
        keep.push_back(e);
        continue;
      }
      touched = true;
      const uint64_t cs = std::max<uint64_t>(es, l), ce = std::min(ee, end);
      if (es < cs)
        keep.push_back(
            make_extent(e.logical, static_cast<uint32_t>(cs - es), e.physical, e.unwritten()));
      removed->push_back(make_extent(static_cast<uint32_t>(cs), static_cast<uint32_t>(ce - cs),
                                     e.physical + (cs - es), e.unwritten()));
      if (ce < ee) {
        keep.push_back(make_extent(static_cast<uint32_t>(ce), static_cast<uint32_t>(ee - ce),
                                   e.physical + (ce - es), e.unwritten()));
      }
    }
    if (touched) {
      if (!leaf.ext.empty() && (keep.empty() || keep.front().logical != leaf.ext.front().logical)) {
        changed_starts = true;
      }
      leaf.ext.swap(keep);
      leaf.dirty = true;
    }
  }
  if (changed_starts) n.index_dirty = true;
  return 0;
}

int FsImpl::map_insert(Node& n, Extent e) {
  WARPFS_DCHECK(changeable_by_me(n), "map_insert: rw exclusive");
  WARPFS_DCHECK(n.mapped, "map_insert: mapping loaded");
  WARPFS_DCHECK(
      [&] {
        const Mapping m = map_lookup(n, e.logical);
        return m.hole && m.length >= e.blocks();
      }(),
      "map_insert: the range is a hole");
  const size_t li = leaf_for(n.leaves, e.logical);
  std::vector<Extent>& ext = n.leaves[li].ext;
  auto it = std::upper_bound(ext.begin(), ext.end(), e.logical,
                             [](uint32_t l, const Extent& x) { return l < x.logical; });
  const bool new_front = it == ext.begin();
  it = ext.insert(it, e);
  // Merge with the neighbours when contiguous on the device too.
  if (it + 1 != ext.end() && mergeable(*it, *(it + 1))) {
    it->length += (it + 1)->blocks();
    ext.erase(it + 1);
  }
  if (it != ext.begin() && mergeable(*(it - 1), *it)) {
    (it - 1)->length += it->blocks();
    ext.erase(it);
  }
  n.leaves[li].dirty = true;
  if (new_front && li > 0) n.index_dirty = true;
  return 0;
}

uint64_t FsImpl::alloc_goal(Node& n, uint32_t lblk) {
  WARPFS_DCHECK(readable_by_me(n), "alloc_goal: rw held");
  if (lblk > 0) {
    Mapping m = map_lookup(n, lblk - 1);
    if (!m.hole) return m.physical + 1;
  }
  // The inode's own group, spread a little by inode number.
  const uint64_t g = group_of_inode(n.ino, sb_.inodes_per_group);
  return group_start(static_cast<uint32_t>(g)) + 2 + L_.itb + (n.ino % 64) * 256;
}

int FsImpl::alloc_meta_block(Node& n, uint64_t* out) {
  WARPFS_DCHECK(changeable_by_me(n), "alloc_meta_block: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "alloc_meta_block: in a transaction");
  uint32_t got;
  const uint64_t g = group_of_inode(n.ino, sb_.inodes_per_group);
  if (int rc = alloc_blocks(group_start(static_cast<uint32_t>(g)), 1, out, &got, true); rc)
    return rc;
  n.disk.blocks += 1;
  return 0;
}

void FsImpl::free_meta_block(Node& n, uint64_t block) {
  journal_->forget_block(block);
  free_blocks(block, 1);
  n.disk.blocks -= 1;
}

// Writes the mapping back: leaves that changed, then the index, then the inode. Leaves are
// first brought into shape: the inline form while 8 extents suffice, full leaves split,
// empty ones dropped, and a second index level when more than 8 leaves are needed.
int FsImpl::map_store(Node& n) {
  WARPFS_DCHECK(changeable_by_me(n), "map_store: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "map_store: in a transaction");
  if (n.disk.flags & Inode::kFlagInlineSymlink) return store(n);
  auto free_meta = [&](uint64_t b) { free_meta_block(n, b); };
  size_t total = 0;
  for (const ExtentLeaf& l : n.leaves) total += l.ext.size();
  const bool inline_now = n.leaves.size() == 1 && n.leaves[0].block == 0;
  if (total <= Inode::kInlineExtents) {
    if (!inline_now) {
      std::vector<Extent> all;
      for (ExtentLeaf& l : n.leaves) {
        all.insert(all.end(), l.ext.begin(), l.ext.end());
        if (l.block) free_meta(l.block);
      }
      for (uint64_t b : n.index_blocks) free_meta(b);
      n.index_blocks.clear();
      n.leaves.assign(1, ExtentLeaf{0, std::move(all), true});
    }
    Inode& d = n.disk;
    std::memset(d.root.extents, 0, sizeof d.root.extents);
    std::copy(n.leaves[0].ext.begin(), n.leaves[0].ext.end(), d.root.extents);
    d.extent_count = static_cast<uint32_t>(n.leaves[0].ext.size());
    d.tree_depth = 0;
    n.leaves[0].dirty = false;
    n.index_dirty = false;
    return store(n);
  }
  // Tree form. Drop empty leaves, give the inline leaf a block, split full leaves.
  for (size_t i = 0; i < n.leaves.size();) {
    if (n.leaves[i].ext.empty()) {
      if (n.leaves[i].block) free_meta(n.leaves[i].block);
      n.leaves.erase(n.leaves.begin() + static_cast<long>(i));
      n.index_dirty = true;
      continue;
    }
    if (n.leaves[i].block == 0) {
      if (int rc = alloc_meta_block(n, &n.leaves[i].block); rc) return rc;
      journal_->create(n.leaves[i].block, MetaKind::kHeader, n.ino);
      n.leaves[i].dirty = true;
      n.index_dirty = true;
    }
    if (n.leaves[i].ext.size() > kExtentNodeCapacity) {
      ExtentLeaf upper;
      if (int rc = alloc_meta_block(n, &upper.block); rc) return rc;
      journal_->create(upper.block, MetaKind::kHeader, n.ino);
      auto& lower = n.leaves[i].ext;
      const auto half = static_cast<long>(lower.size() / 2);
      upper.ext.assign(lower.begin() + half, lower.end());
      lower.erase(lower.begin() + half, lower.end());
      upper.dirty = true;
      n.leaves[i].dirty = true;
      n.leaves.insert(n.leaves.begin() + static_cast<long>(i) + 1, std::move(upper));
      n.index_dirty = true;
      continue;  // the lower half may still be too full
    }
    ++i;
  }
  auto write_node = [&](uint64_t block, uint16_t depth, const void* entries,
                        uint16_t count) -> int {
    // Every node block is cached (loaded by load_map, or created this mount), so this
    // never reads: a block created this transaction is returned zeroed, unchecked.
    MetaBuf* b;
    if (int rc = meta_get(block, &b, kExtentMagic, n.ino); rc) return rc;
    ExtentNodeHeader h{kExtentMagic, count, depth, kExtentNodeCapacity, 0, n.ino, 0};
    std::memset(b->data, 0, kBlockSize);
    std::memcpy(b->data, &h, sizeof h);
    std::memcpy(b->data + sizeof h, entries, count * size_t{16});
    journal_->dirty(b);
    note_changed(n, true);  // the mapping, in a block of the tree: fdatasync needs it
    return 0;
  };
  for (ExtentLeaf& l : n.leaves) {
    if (!l.dirty) continue;
    if (int rc = write_node(l.block, 0, l.ext.data(), static_cast<uint16_t>(l.ext.size())); rc)
      return rc;
    l.dirty = false;
  }
  if (n.index_dirty) {
    Inode& d = n.disk;
    std::vector<ExtentIndex> idx;
    for (const ExtentLeaf& l : n.leaves)
      idx.push_back(ExtentIndex{l.ext.front().logical, 0, l.block});
    idx[0].logical = 0;
    std::memset(d.root.extents, 0, sizeof d.root.extents);
    if (idx.size() <= Inode::kInlineExtents) {
      for (uint64_t b : n.index_blocks) free_meta(b);
      n.index_blocks.clear();
      std::memcpy(d.root.extents, idx.data(), idx.size() * sizeof(ExtentIndex));
      d.extent_count = static_cast<uint32_t>(idx.size());
      d.tree_depth = 1;
    } else {
      const size_t need = (idx.size() + kExtentNodeCapacity - 1) / kExtentNodeCapacity;
      if (need > Inode::kInlineExtents) {
        log("inode " + std::to_string(n.ino) + ": too fragmented for a depth-2 extent tree");
        return EFBIG;
      }
      while (n.index_blocks.size() < need) {
        uint64_t b;
        if (int rc = alloc_meta_block(n, &b); rc) return rc;
        journal_->create(b, MetaKind::kHeader, n.ino);
        n.index_blocks.push_back(b);
      }
      while (n.index_blocks.size() > need) {
        free_meta(n.index_blocks.back());
        n.index_blocks.pop_back();
      }
      ExtentIndex root[Inode::kInlineExtents] = {};
      // Spread leaves evenly over the index blocks.
      const size_t per = (idx.size() + need - 1) / need;
      for (size_t k = 0; k < need; ++k) {
        const size_t from = k * per, to = std::min(idx.size(), from + per);
        if (int rc = write_node(n.index_blocks[k], 1, idx.data() + from,
                                static_cast<uint16_t>(to - from));
            rc) {
          return rc;
        }
        root[k] = ExtentIndex{idx[from].logical, 0, n.index_blocks[k]};
      }
      std::memcpy(d.root.extents, root, need * sizeof(ExtentIndex));
      d.extent_count = static_cast<uint32_t>(need);
      d.tree_depth = 2;
    }
    n.index_dirty = false;
  }
  return store(n);
}

int FsImpl::punch(Node& n, uint32_t l, uint64_t count) {
  WARPFS_DCHECK(changeable_by_me(n), "punch: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "punch: in a transaction");
  std::vector<Extent> removed;
  if (int rc = map_remove(n, l, count, &removed); rc) return rc;
  for (const Extent& e : removed) {
    free_blocks(e.physical, e.blocks());
    n.disk.blocks -= e.blocks();
  }
  return map_store(n);
}

// Frees every block at or beyond the block holding `new_size`, a few extents per
// transaction so that truncating a huge fragmented file never overflows the journal. A
// crash in between leaves blocks past EOF mapped: harmless, and freed by the next truncate.
int FsImpl::truncate_blocks(Node& n, uint64_t new_size) {
  WARPFS_DCHECK(changeable_by_me(n), "truncate_blocks: rw exclusive");
  WARPFS_DCHECK(!journal_->in_transaction(), "truncate_blocks: not in a transaction");
  if (n.disk.flags & Inode::kFlagInlineSymlink) return 0;
  if (int rc = load_map(n); rc) return rc;
  const uint64_t keep = (new_size + kBlockSize - 1) / kBlockSize;
  if (keep >= kNoBlock) return 0;
  // Each extent lies in one group: its bitmap, descriptor and (shared blocks) up to 17
  // count-table blocks per extent.
  const size_t kPerTxn = shared_blocks_enabled() ? 4 : 8;
  for (;;) {
    // The start of the kPerTxn-th last extent that reaches past `keep`.
    std::vector<uint32_t> starts;
    for (auto l = n.leaves.rbegin(); l != n.leaves.rend() && starts.size() < kPerTxn; ++l) {
      for (auto e = l->ext.rbegin(); e != l->ext.rend() && starts.size() < kPerTxn; ++e) {
        if (end_of(*e) <= keep) break;
        starts.push_back(e->logical);
      }
      if (!l->ext.empty() && end_of(l->ext.front()) <= keep) break;
    }
    if (starts.empty()) return 0;
    const uint64_t from = std::max<uint64_t>(keep, starts.back());
    Journal::Txn t(*journal_);
    if (int rc = punch(n, static_cast<uint32_t>(from), kNoBlock - from); rc) return rc;
  }
}

}  // namespace warpfs::fs
