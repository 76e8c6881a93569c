// Repair: the write phase's mappings, inodes, bitmaps, descriptors, journal and superblock.
// Runs after every pass, with repair only, and writes exactly what the model says changed:
// extent trees (Info::remap), inodes (dirty, fresh or no longer live), the reference-count
// tables (refcounts.cc), the bitmaps and descriptors that differ from the model's, the journal
// header when it was bad, then the superblock, clean, primary and backup.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

namespace {

// `ext` (sorted by logical) with neighbours that continue each other joined.
std::vector<Extent> merged(const std::vector<Extent>& in) {
  std::vector<Extent> ext;
  for (const Extent& e : in) {
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
  return ext;
}

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

// Rewrites an inode's mapping from `ext`: inline up to 8 extents, else leaves of up to 254
// under the root (depth 1) or under index blocks (depth 2). Its old tree blocks are reused.
void Checker::write_mapping(Info& n) {
  std::sort(n.ext.begin(), n.ext.end(),
            [](const Extent& a, const Extent& b) { return a.logical < b.logical; });
  std::vector<Extent> ext = merged(n.ext);
  std::vector<uint64_t> pool = n.tree, used;
  auto rp = std::make_unique<RootPatch>();
  std::vector<ExtentIndex> idx;
  bool ok = true;
  if (ext.size() > Inode::kInlineExtents) ok = write_leaves(n, ext, pool, &used, &idx);
  if (ext.size() <= Inode::kInlineExtents) {
    if (!ext.empty()) std::memcpy(rp->root, ext.data(), ext.size() * sizeof(Extent));
    rp->count = static_cast<uint32_t>(ext.size());
    rp->depth = 0;
  } else if (ok && idx.size() <= Inode::kInlineExtents) {
    std::memcpy(rp->root, idx.data(), idx.size() * sizeof(ExtentIndex));
    rp->count = static_cast<uint32_t>(idx.size());
    rp->depth = 1;
  } else if (ok) {
    if (div_up(idx.size(), kExtentNodeCapacity) > Inode::kInlineExtents) {
      unfixable("inode " + num(n.ino) + ": too fragmented to rebuild its extent tree");
      return;
    }
    ok = write_upper(n, idx, pool, &used, rp.get());
  }
  if (!ok) {
    if (!failed())
      unfixable("inode " + num(n.ino) + ": no free blocks to rebuild its extent tree in");
    return;
  }
  n.ext = std::move(ext);
  n.tree = std::move(used);
  n.root = std::move(rp);
  n.blocks = meta_blocks(n);
  for (const Extent& e : n.ext) n.blocks += e.blocks();
  n.remap = false;
  n.dirty = true;
}

// Leaves of up to 254 extents, evenly filled; their index entries into *idx.
bool Checker::write_leaves(const Info& n, const std::vector<Extent>& ext,
                           std::vector<uint64_t>& pool, std::vector<uint64_t>* used,
                           std::vector<ExtentIndex>* idx) {
  const size_t E = ext.size();
  const size_t per = div_up(E, div_up(E, kExtentNodeCapacity));
  for (size_t i = 0; i < E; i += per) {
    uint64_t b = 0;
    if (!take_block(pool, used, &b) ||
        !write_node(b, 0, ext.data() + i, std::min(per, E - i), n.ino))
      return false;
    idx->push_back(ExtentIndex{i == 0 ? 0 : ext[i].logical, 0, b});
  }
  return true;
}

// Index blocks (depth 1) over the leaves' entries, under a root of depth 2.
bool Checker::write_upper(const Info& n, const std::vector<ExtentIndex>& idx,
                          std::vector<uint64_t>& pool, std::vector<uint64_t>* used, RootPatch* rp) {
  const size_t per = div_up(idx.size(), div_up(idx.size(), kExtentNodeCapacity));
  std::vector<ExtentIndex> root;
  for (size_t j = 0; j < idx.size(); j += per) {
    uint64_t b = 0;
    if (!take_block(pool, used, &b) ||
        !write_node(b, 1, idx.data() + j, std::min(per, idx.size() - j), n.ino))
      return false;
    root.push_back(ExtentIndex{idx[j].logical, 0, b});
  }
  std::memcpy(rp->root, root.data(), root.size() * sizeof(ExtentIndex));
  rp->count = static_cast<uint32_t>(root.size());
  rp->depth = 2;
  return true;
}

// A block for a tree node: one of the old tree's, else a new one.
bool Checker::take_block(std::vector<uint64_t>& pool, std::vector<uint64_t>* used, uint64_t* b) {
  if (!pool.empty()) {
    *b = pool.back();
    pool.pop_back();
  } else {
    uint64_t got;
    if (!alloc(1, b, &got)) return false;
  }
  used->push_back(*b);
  return true;
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
  const uint64_t now = now_ns();
  for (size_t a = 0; a < todo.size() && !failed();) {
    const uint64_t blk = L_.inode_block(infos_[todo[a]].ino);
    if (!read(blk, 1, buf.data())) return;
    size_t b = a;
    for (; b < todo.size() && L_.inode_block(infos_[todo[b]].ino) == blk; ++b) {
      const Info& n = infos_[todo[b]];
      patch_inode(n, now, buf.data() + L_.inode_offset(n.ino));
    }
    if (!write(blk, 1, buf.data())) return;
    a = b;
  }
}

// The on-disk inode at p as the model has it.
void Checker::patch_inode(const Info& n, uint64_t now, uint8_t* p) const {
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
    if (n.clamp_times) {
      for (uint64_t* t : {&d.atime_ns, &d.mtime_ns, &d.ctime_ns, &d.crtime_ns})
        *t = time_clamped(*t);
    }
    if (n.root) {
      d.extent_count = n.root->count;
      d.tree_depth = n.root->depth;
      std::memcpy(&d.root, n.root->root, sizeof d.root);
    }
  }
  d.checksum = inode_checksum(d, n.ino, L_.seed);
  std::memcpy(p, &d, sizeof d);
}

// The bitmaps and directory counts the model describes.
void Checker::build_bitmaps(std::vector<std::vector<uint8_t>>* bb,
                            std::vector<std::vector<uint8_t>>* ib,
                            std::vector<uint32_t>* dirs) const {
  bb->assign(L_.groups, std::vector<uint8_t>(kBlockSize, 0));
  ib->assign(L_.groups, std::vector<uint8_t>(kBlockSize, 0));
  dirs->assign(L_.groups, 0);
  for (uint32_t g = 0; g < L_.groups; ++g) {
    uint8_t* b = (*bb)[g].data();
    for (uint64_t i = 0; i < 2 + uint64_t{L_.itb}; ++i) set_bit(b, i);
    for (uint64_t i = L_.group_size(g); i < kBlocksPerGroup; ++i) set_bit(b, i);
    if (rt_[g].at != 0) set_bits(b, rt_[g].at, uint64_t{rt_[g].at} + kRefcountBlocks);
    for (uint64_t i = L_.ipg; i < kBlockSize * 8; ++i) set_bit((*ib)[g].data(), i);
  }
  for (const Info& n : infos_) {
    if (n.state != State::kLive) continue;
    const auto g = static_cast<uint32_t>((n.ino - 1) / L_.ipg);
    set_bit((*ib)[g].data(), (n.ino - 1) % L_.ipg);
    if (is_dir(n)) (*dirs)[g] += 1;
    for_each_claim(n, [&](uint64_t first, uint64_t count) {
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
    d.refcount_table = rt_[g].at;
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
      s.write_time = now_ns();
      s.checksum = superblock_checksum(s);
    }
    if (!write(b, 1, &s)) return;
  }
}

}  // namespace warpfs::fs::fsck_impl
