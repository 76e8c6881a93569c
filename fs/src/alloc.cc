// Block and inode allocation over per-group bitmaps (fs/FORMAT.md "Layout", "Why groups").
// Each group has its own lock; a thread allocates near a goal (the end of the file's previous
// extent, or the inode's group) and moves to the next group only when one is full, so
// writers of different files rarely meet on a lock. Blocks freed by the running transaction
// are `held` until it commits: reusing them earlier could let a crash resurrect the old owner
// pointing at new data.
//
// Only a group's data area is ever allocated or freed. Its bitmaps and inode table (the
// first meta_bits() bits) and the bits past the end of a short last group are metadata: a
// bitmap that marks them free is refused at mount, the allocator's scan never reaches them,
// and a free that names them (or the superblock, journal or descriptor table, outside every
// group) is logged and not performed. Handing one out would put file data or a directory
// over the group's own bitmaps, whose cached buffers the group keeps pointing at.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "internal.h"

namespace warpfs::fs {

namespace {

constexpr uint32_t kWords = kBlocksPerGroup / 64;

bool test_bit(const uint8_t* bm, uint32_t i) {
  return (bm[i / 8] >> (i % 8)) & 1;
}
void set_bit(uint8_t* bm, uint32_t i) {
  bm[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
}
void clear_bit(uint8_t* bm, uint32_t i) {
  bm[i / 8] &= static_cast<uint8_t>(~(1u << (i % 8)));
}

uint64_t word(const uint8_t* bm, uint32_t w) {
  uint64_t x;
  std::memcpy(&x, bm + w * 8, 8);  // little-endian: bit i of the word is block w*64+i
  return x;
}

// The clear bits of `bm` in [from, to): how many, and the first one (`to` if none).
uint32_t count_clear(const uint8_t* bm, uint32_t from, uint32_t to, uint32_t* first) {
  uint32_t n = 0;
  *first = to;
  for (uint32_t i = from; i < to;) {
    const uint32_t w = i / 64, lo = i % 64, hi = std::min<uint32_t>(64, to - w * 64);
    const uint64_t mask =
        (hi == 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1) & ~((uint64_t{1} << lo) - 1);
    const uint64_t clear = ~word(bm, w) & mask;
    if (clear != 0 && *first == to)
      *first = w * 64 + static_cast<uint32_t>(std::countr_zero(clear));
    n += static_cast<uint32_t>(std::popcount(clear));
    i = w * 64 + hi;
  }
  return n;
}

// "block 7" or "blocks 7-9".
std::string block_span(uint64_t first, uint64_t count) {
  return count == 1 ? "block " + std::to_string(first)
                    : "blocks " + std::to_string(first) + "-" + std::to_string(first + count - 1);
}

}  // namespace

std::string FsImpl::metadata_name(uint64_t b) const {
  const std::string name = L_.metadata_name(b);
  if (!name.empty() || b < L_.first_group) return name;
  const uint32_t g = L_.group_of(b);
  if (b - group_start(g) >= group_size(g)) return "past the end of group " + std::to_string(g);
  return "";
}

std::string FsImpl::check_block_bitmap(uint32_t g) const {
  const uint8_t* bm = groups_[g].block_bitmap->data;
  uint32_t first_meta, first_past;
  const uint32_t meta = count_clear(bm, 0, meta_bits(), &first_meta);
  const uint32_t past = count_clear(bm, group_size(g), kBlocksPerGroup, &first_past);
  if (meta + past == 0) return "";
  const uint64_t first = group_start(g) + (meta ? first_meta : first_past);
  return "the block bitmap (block " + std::to_string(group_start(g)) + ") marks " +
         std::to_string(meta + past) + " of the group's own metadata blocks free, the first " +
         block_span(first, 1) + " (" + metadata_name(first) + ")";
}

int FsImpl::load_groups() {
  const auto gdt_blocks = static_cast<uint32_t>(L_.gdt_used());  // the rest is room to grow
  gdt_.resize(gdt_blocks);
  for (uint32_t i = 0; i < gdt_blocks; ++i) {
    if (int rc = journal_->get(sb_.gdt_start + i, MetaKind::kGdt, 0, &gdt_[i]); rc) return rc;
  }
  groups_ = std::make_unique<Group[]>(sb_.group_count);
  for (uint32_t g = 0; g < sb_.group_count; ++g) {
    GroupDesc* gd = desc(gdt_, g);
    const uint64_t start = group_start(g);
    if (gd->block_bitmap != start || gd->inode_bitmap != start + 1 ||
        gd->inode_table != start + 2) {
      log("group " + std::to_string(g) + ": descriptor points outside its group (run fsck.warpfs)");
      return EIO;
    }
    auto verify = [&](uint64_t want) {
      return [this, want](const MetaBuf& b) -> std::string {
        return checksum(b.data, kBlockSize, sb_.checksum_seed) == want ? ""
                                                                       : "bitmap checksum mismatch";
      };
    };
    Group& gr = groups_[g];
    if (int rc = journal_->get(gd->block_bitmap, MetaKind::kBlockBitmap, g, &gr.block_bitmap,
                               verify(gd->block_bitmap_checksum));
        rc) {
      return rc;
    }
    if (int rc = journal_->get(gd->inode_bitmap, MetaKind::kInodeBitmap, g, &gr.inode_bitmap,
                               verify(gd->inode_bitmap_checksum));
        rc) {
      return rc;
    }
    if (std::string why = check_block_bitmap(g); !why.empty()) {
      log("group " + std::to_string(g) + ": " + why + " (run fsck.warpfs)");
      return EIO;
    }
    gr.free_blocks = gd->free_blocks;
    gr.free_inodes = gd->free_inodes;
    gr.held.assign(kWords, 0);
    if (int rc = load_refcounts(g); rc) return rc;
    data_blocks_total_ += group_size(g) - meta_bits();
  }
  meta_reserve_ = std::clamp<uint64_t>(data_blocks_total_ / 1024, 64, 8192);
  root_reserve_ = std::min(sb_.reserved_blocks, data_blocks_total_);
  return 0;
}

void FsImpl::free_counts(uint64_t* blocks, uint64_t* inodes) const {
  *blocks = *inodes = 0;
  for (uint32_t g = 0; g < sb_.group_count; ++g) {
    *blocks += groups_[g].free_blocks.load(std::memory_order_relaxed);
    *inodes += groups_[g].free_inodes.load(std::memory_order_relaxed);
  }
}

uint64_t FsImpl::available_blocks() const {
  uint64_t free, inodes;
  free_counts(&free, &inodes);
  const uint64_t held = held_blocks_.load(std::memory_order_relaxed);
  return free > held ? free - held : 0;
}

namespace {
thread_local const Caller* t_caller = nullptr;  // CallerScope: this thread's alone
}  // namespace

CallerScope::CallerScope(const Caller& c) : outer_(t_caller), caller_(c) {
  t_caller = &caller_;
}
CallerScope::~CallerScope() {
  t_caller = outer_;
}
const Caller* CallerScope::current() {
  return t_caller;
}

bool FsImpl::may_use_root_reserve() const {
  const Caller* c = CallerScope::current();
  return c == nullptr || c->uid == 0 || (sb_.reserved_uid != 0 && c->uid == sb_.reserved_uid) ||
         (sb_.reserved_gid != 0 && c->gid == sb_.reserved_gid);
}

int FsImpl::alloc_blocks(uint64_t goal, uint32_t want, uint64_t* first, uint32_t* got, bool meta) {
  if (!meta && root_reserve_ > 0 && !may_use_root_reserve()) {
    // File data of a caller without the right to the root reserve stops short of it. Of two
    // such allocations at once, the later to announce itself counts the earlier's blocks,
    // whether or not they are taken yet: together they stay above the line (a racing one may
    // see ENOSPC a little early; retry_enospc tries again after a commit).
    const uint64_t floor = meta_reserve_ + root_reserve_;
    const uint64_t others = unreserved_in_flight_.fetch_add(want);
    const uint64_t avail = available_blocks();
    int rc = ENOSPC;
    if (avail > floor + others) {
      rc = alloc_blocks_from(
          goal, static_cast<uint32_t>(std::min<uint64_t>(want, avail - floor - others)), first, got,
          true);
    }
    unreserved_in_flight_.fetch_sub(want);
    return rc;
  }
  if (!meta) {
    // File data stops short of the metadata reserve (racing allocators may dip into it a
    // little; that is what it is for).
    const uint64_t avail = available_blocks();
    if (avail <= meta_reserve_) return ENOSPC;
    want = static_cast<uint32_t>(std::min<uint64_t>(want, avail - meta_reserve_));
  }
  // Metadata takes the blocks kept for count tables only when nothing else is left.
  int rc = alloc_blocks_from(goal, want, first, got, true);
  if (rc == ENOSPC && meta) rc = alloc_blocks_from(goal, want, first, got, false);
  return rc;
}

int FsImpl::alloc_blocks_from(uint64_t goal, uint32_t want, uint64_t* first, uint32_t* got,
                              bool keep_tables) {
  const uint64_t first_group = group_start(0);
  uint32_t g0 = group_of_block(goal);
  uint32_t start_bit =
      goal >= first_group ? static_cast<uint32_t>((goal - first_group) % kBlocksPerGroup) : 0;
  for (uint32_t k = 0; k < sb_.group_count; ++k) {
    const uint32_t g = (g0 + k) % sb_.group_count;
    Group& gr = groups_[g];
    if (gr.free_blocks.load(std::memory_order_relaxed) == 0) continue;
    std::lock_guard<std::mutex> lk(gr.mu);
    uint8_t* bm = gr.block_bitmap->data;
    // Two passes over the data area [meta_bits(), end): from the goal (or the group's hint)
    // to the end, then from the start. The bitmap's metadata bits are never looked at. The
    // group's last kRefcountBlocks are kept for its reference-count table while it has none
    // (make_refcount_table), so that a group full of a file's data can still share it (a
    // clone of that file); metadata takes them only when nothing else is left (alloc_blocks).
    // File data never does: the metadata reserve it stops short of counts more blocks.
    const uint32_t end = group_size(g) - (keep_tables && table_room(g) ? kRefcountBlocks : 0);
    const uint32_t from = k == 0 ? start_bit : gr.next_block_hint;
    for (int pass = 0; pass < 2; ++pass) {
      const uint32_t lo = std::max(pass == 0 ? from : 0, meta_bits());
      const uint32_t hi = std::min(pass == 0 ? kBlocksPerGroup : from, end);
      uint32_t i = lo;
      while (i < hi) {
        const uint32_t w = i / 64;
        const uint64_t used = word(bm, w) | gr.held[w] | ((uint64_t{1} << (i % 64)) - 1);
        if (used == ~uint64_t{0}) {
          i = (w + 1) * 64;
          continue;
        }
        i = w * 64 + static_cast<uint32_t>(std::countr_one(used));
        if (i >= hi) break;
        uint32_t n = 0;
        while (n < want && i + n < end && !test_bit(bm, i + n) &&
               !((gr.held[(i + n) / 64] >> ((i + n) % 64)) & 1)) {
          set_bit(bm, i + n);
          ++n;
        }
        GroupDesc* gd = desc(gdt_, g);
        gd->free_blocks -= n;
        gr.free_blocks.fetch_sub(n, std::memory_order_relaxed);
        gr.next_block_hint = (i + n) % kBlocksPerGroup;
        journal_->dirty(gr.block_bitmap);
        journal_->dirty(gdt_[g / kGroupDescsPerBlock]);
        *first = group_start(g) + i;
        *got = n;
        return 0;
      }
    }
  }
  return ENOSPC;
}

void FsImpl::free_blocks(uint64_t first, uint64_t count) {
  // A run that is not in a group's data area: logged as the corruption it is, kept.
  auto refuse = [&](uint64_t n) {
    log(block_span(first, n) + " (" + metadata_name(first) +
        ") freed as if it held file data: not freed (run fsck.warpfs)");
    first += n;
    count -= n;
  };
  while (count > 0) {
    if (first < group_start(0)) {
      refuse(std::min(count, group_start(0) - first));
      continue;
    }
    const uint64_t gg = (first - group_start(0)) / kBlocksPerGroup;
    if (gg >= sb_.group_count) {
      refuse(count);
      break;
    }
    const auto g = static_cast<uint32_t>(gg);
    const auto bit = static_cast<uint32_t>(first - group_start(g));
    if (bit < meta_bits()) {
      refuse(std::min<uint64_t>(count, meta_bits() - bit));
      continue;
    }
    if (bit >= group_size(g)) {
      refuse(std::min<uint64_t>(count, kBlocksPerGroup - bit));
      continue;
    }
    const auto n = static_cast<uint32_t>(std::min<uint64_t>(count, group_size(g) - bit));
    Group& gr = groups_[g];
    std::lock_guard<std::mutex> lk(gr.mu);
    uint8_t* bm = gr.block_bitmap->data;
    // Only the blocks actually freed are held and, after the commit, trimmed: one that was
    // already free may belong to someone else by then.
    uint32_t freed = 0, run = bit;
    auto end_run = [&](uint32_t i) {
      if (i > run) gr.freed.emplace_back(run, i - run);
    };
    for (uint32_t i = bit; i < bit + n;) {
      if (const uint32_t refs = refs_locked(gr, i); refs >= 2) {
        // Shared (FORMAT.md "Shared blocks"): one reference fewer, the block stays.
        end_run(i);
        set_refs_locked(gr, i, refs == 2 ? 0 : refs - 1);
        run = ++i;
        continue;
      }
      if (test_bit(bm, i)) {
        clear_bit(bm, i);
        gr.held[i / 64] |= uint64_t{1} << (i % 64);
        ++freed;
        ++i;
        continue;
      }
      end_run(i);
      uint32_t j = i + 1;
      while (j < bit + n && !test_bit(bm, j)) ++j;
      log(block_span(group_start(g) + i, j - i) + " freed twice (run fsck.warpfs)");
      i = run = j;
    }
    end_run(bit + n);
    if (freed > 0) {
      held_blocks_.fetch_add(freed, std::memory_order_relaxed);
      desc(gdt_, g)->free_blocks += freed;
      gr.free_blocks.fetch_add(freed, std::memory_order_relaxed);
      journal_->dirty(gr.block_bitmap);
      journal_->dirty(gdt_[g / kGroupDescsPerBlock]);
    }
    first += n;
    count -= n;
  }
}

int FsImpl::alloc_inode(Ino parent, bool dir, Ino* out) {
  const uint32_t pg = static_cast<uint32_t>(group_of_inode(parent, sb_.inodes_per_group));
  uint32_t g0 = pg;
  if (dir) {
    // Spread directories (Orlov-like): of a few groups after the parent's, the one with the
    // most free inodes, so subtrees land in different groups and allocate in parallel.
    uint32_t best = pg, best_free = 0;
    for (uint32_t k = 0; k < std::min<uint32_t>(sb_.group_count, 4); ++k) {
      const uint32_t g = (pg + 1 + k * 7) % sb_.group_count;
      const uint32_t f = groups_[g].free_inodes.load(std::memory_order_relaxed);
      if (f > best_free) best = g, best_free = f;
    }
    g0 = best;
  }
  for (uint32_t k = 0; k < sb_.group_count; ++k) {
    const uint32_t g = (g0 + k) % sb_.group_count;
    Group& gr = groups_[g];
    if (gr.free_inodes.load(std::memory_order_relaxed) == 0) continue;
    std::lock_guard<std::mutex> lk(gr.mu);
    uint8_t* bm = gr.inode_bitmap->data;
    for (uint32_t j = 0; j < sb_.inodes_per_group; ++j) {
      const uint32_t i = (gr.next_inode_hint + j) % sb_.inodes_per_group;
      if (test_bit(bm, i)) continue;
      set_bit(bm, i);
      GroupDesc* gd = desc(gdt_, g);
      gd->free_inodes -= 1;
      if (dir) gd->used_dirs += 1;
      gr.free_inodes.fetch_sub(1, std::memory_order_relaxed);
      gr.next_inode_hint = i + 1;
      journal_->dirty(gr.inode_bitmap);
      journal_->dirty(gdt_[g / kGroupDescsPerBlock]);
      *out = uint64_t{g} * sb_.inodes_per_group + i + 1;
      return 0;
    }
  }
  return ENOSPC;
}

void FsImpl::free_inode_bit(Ino ino, bool dir) {
  const auto g = static_cast<uint32_t>(group_of_inode(ino, sb_.inodes_per_group));
  const auto i = static_cast<uint32_t>((ino - 1) % sb_.inodes_per_group);
  Group& gr = groups_[g];
  std::lock_guard<std::mutex> lk(gr.mu);
  if (!test_bit(gr.inode_bitmap->data, i)) {
    log("inode " + std::to_string(ino) + " freed twice (run fsck.warpfs)");
    return;
  }
  clear_bit(gr.inode_bitmap->data, i);
  GroupDesc* gd = desc(gdt_, g);
  gd->free_inodes += 1;
  if (dir && gd->used_dirs > 0) gd->used_dirs -= 1;
  gr.free_inodes.fetch_add(1, std::memory_order_relaxed);
  journal_->dirty(gr.inode_bitmap);
  journal_->dirty(gdt_[g / kGroupDescsPerBlock]);
}

// Under the journal's closed gate: bitmaps' checksums go into their descriptors, then every
// touched descriptor block and header block gets its checksums, and the superblock its counts.
void FsImpl::finish_commit(std::vector<MetaBuf*>& dirty) {
  std::vector<bool> gdt_touched(gdt_.size(), false);
  for (MetaBuf* b : dirty) {
    switch (b->kind) {
      case MetaKind::kBlockBitmap:
        desc(gdt_, b->group)->block_bitmap_checksum =
            checksum(b->data, kBlockSize, sb_.checksum_seed);
        gdt_touched[b->group / kGroupDescsPerBlock] = true;
        break;
      case MetaKind::kInodeBitmap:
        desc(gdt_, b->group)->inode_bitmap_checksum =
            checksum(b->data, kBlockSize, sb_.checksum_seed);
        gdt_touched[b->group / kGroupDescsPerBlock] = true;
        break;
      case MetaKind::kGdt:
        gdt_touched[b->block - sb_.gdt_start] = true;
        break;
      case MetaKind::kHeader:  // checksummed in the commit's copy (journal.cc)
      case MetaKind::kRefcount:
      case MetaKind::kSuper:
      case MetaKind::kInodeTable:
        break;  // the superblock below; inodes carry their own checksums (store())
    }
  }
  for (size_t i = 0; i < gdt_.size(); ++i) {
    if (!gdt_touched[i]) continue;
    for (uint32_t k = 0; k < kGroupDescsPerBlock; ++k) {
      const uint64_t g = i * kGroupDescsPerBlock + k;
      if (g >= sb_.group_count) break;
      GroupDesc* gd = desc(gdt_, static_cast<uint32_t>(g));
      gd->checksum = group_checksum(*gd, sb_.checksum_seed);
    }
    journal_->dirty(gdt_[i]);
  }
  if (sb_buf_->dirty) {
    auto* s = reinterpret_cast<Superblock*>(sb_buf_->data);
    free_counts(&s->free_blocks, &s->free_inodes);
    s->write_time = now_ns();
    s->checksum = superblock_checksum(*s);
  }
}

// Under the closed gate: the blocks freed by the transaction being committed.
void FsImpl::take_freed() {
  committing_freed_.clear();
  committing_unshared_.clear();
  for (uint32_t g = 0; g < sb_.group_count; ++g) {
    Group& gr = groups_[g];
    std::lock_guard<std::mutex> lk(gr.mu);
    for (auto [bit, n] : gr.freed) {
      committing_freed_.emplace_back(group_start(g) + bit, n);
    }
    gr.freed.clear();
    for (uint32_t bit : gr.unshared) committing_unshared_.emplace_back(g, bit);
    gr.unshared.clear();
  }
}

// After the commit: the freed blocks are trimmed (Dataset Management, so the device learns
// they are free) and become allocatable.
void FsImpl::release_freed() {
  for (auto [b, n] : committing_freed_) {
    if (opts_.discard) {
      if (dev_.trim(b, n).is_ok()) {
        trims_.fetch_add(1, std::memory_order_relaxed);
        trimmed_blocks_.fetch_add(n, std::memory_order_relaxed);
      }
    }
    const uint32_t g = group_of_block(b);
    const auto bit = static_cast<uint32_t>(b - group_start(g));
    Group& gr = groups_[g];
    std::lock_guard<std::mutex> lk(gr.mu);
    for (uint64_t i = bit; i < bit + n; ++i) gr.held[i / 64] &= ~(uint64_t{1} << (i % 64));
    held_blocks_.fetch_sub(std::min<uint64_t>(n, held_blocks_.load()), std::memory_order_relaxed);
  }
  committing_freed_.clear();
  // Counts that fell to 0 are durable: their blocks are single-owner to writers now.
  for (auto [g, bit] : committing_unshared_) {
    Group& gr = groups_[g];
    std::lock_guard<std::mutex> lk(gr.mu);
    auto it = gr.unsharing.find(bit);
    if (it != gr.unsharing.end() && --it->second == 0) gr.unsharing.erase(it);
  }
  committing_unshared_.clear();
}

}  // namespace warpfs::fs
