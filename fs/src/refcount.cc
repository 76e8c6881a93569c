// Reference counts of shared data blocks (fs/FORMAT.md "Shared blocks"): a table per group
// that shares anything, 17 header blocks of u16 counts, pinned once read and changed under
// the group's lock like its bitmap, in the running transaction. A count of 0 means "not
// shared", so a group without a table (the usual case) costs the write and free paths one
// relaxed load (Group::has_refs).
#include <algorithm>
#include <cstring>

#include "internal.h"

namespace warpfs::fs {

namespace {

uint8_t* count_at(MetaBuf* b, uint32_t k) {
  return b->data + sizeof(RefcountHeader) + 2 * size_t{k};
}

}  // namespace

uint32_t FsImpl::refs_locked(Group& gr, uint32_t bit) const {
  if (!gr.refs[0] || bit >= kBlocksPerGroup) return 0;
  uint16_t v;
  std::memcpy(&v, count_at(gr.refs[bit / kRefcountsPerBlock], bit % kRefcountsPerBlock), 2);
  return v;
}

void FsImpl::set_refs_locked(Group& gr, uint32_t bit, uint32_t v) {
  const uint32_t old = refs_locked(gr, bit);
  const auto nv = static_cast<uint16_t>(v);
  MetaBuf* b = gr.refs[bit / kRefcountsPerBlock];
  std::memcpy(count_at(b, bit % kRefcountsPerBlock), &nv, 2);
  journal_->dirty(b);
  // Statistics: blocks shared, and blocks saved (a block of count n saves n - 1).
  if (old < 2 && v >= 2) shared_blocks_.fetch_add(1, std::memory_order_relaxed);
  if (old >= 2 && v < 2) {
    shared_blocks_.fetch_sub(1, std::memory_order_relaxed);
    ++gr.unsharing[bit];  // held shared until this transaction commits (Group::unsharing)
    gr.unshared.push_back(bit);
  }
  const int64_t saved = (v >= 2 ? int64_t{v} - 1 : 0) - (old >= 2 ? int64_t{old} - 1 : 0);
  saved_blocks_.fetch_add(static_cast<uint64_t>(saved), std::memory_order_relaxed);
}

int FsImpl::load_refcounts(uint32_t g) {
  const uint32_t t = desc(gdt_, g)->refcount_table;
  if (t == 0) return 0;
  const std::string where = "group " + std::to_string(g) + ": ";
  if (!shared_blocks_enabled()) {
    log(where + "a reference-count table without the shared_blocks feature (run fsck.warpfs)");
    return EIO;
  }
  if (t < meta_bits() || uint64_t{t} + kRefcountBlocks > group_size(g)) {
    log(where + "reference-count table at " + std::to_string(t) +
        " is outside the group's data area (run fsck.warpfs)");
    return EIO;
  }
  Group& gr = groups_[g];
  for (uint32_t i = 0; i < kRefcountBlocks; ++i) {
    auto verify = [g, i](const MetaBuf& b) -> std::string {
      RefcountHeader h;
      std::memcpy(&h, b.data, sizeof h);
      if (h.magic != kRefcountMagic) return "bad magic";
      if (h.group != g || h.index != i) return "not block " + std::to_string(i) + " of its table";
      return "";
    };
    if (int rc = journal_->get(group_start(g) + t + i, MetaKind::kRefcount, g, &gr.refs[i], verify);
        rc) {
      return rc;
    }
  }
  uint64_t shared = 0, saved = 0;
  for (uint32_t bit = 0; bit < group_size(g); ++bit) {
    if (const uint32_t v = refs_locked(gr, bit); v >= 2) ++shared, saved += v - 1;
  }
  shared_blocks_ += shared;
  saved_blocks_ += saved;
  gr.has_refs.store(true, std::memory_order_release);
  return 0;
}

int FsImpl::make_refcount_table(uint32_t g) {
  Group& gr = groups_[g];
  const uint8_t* bm = gr.block_bitmap->data;
  auto busy = [&](uint32_t i) {
    return ((bm[i / 8] >> (i % 8)) & 1) || ((gr.held[i / 64] >> (i % 64)) & 1);
  };
  // The group's last blocks, which file data left for it (alloc_blocks_from), else the first
  // run of kRefcountBlocks free blocks of the data area (metadata took them, or an image made
  // before the feature).
  if (group_size(g) < meta_bits() + kRefcountBlocks) return ENOSPC;
  uint32_t at = group_size(g) - kRefcountBlocks, run = 0;
  while (run < kRefcountBlocks && !busy(at + run)) ++run;
  if (run < kRefcountBlocks) {
    at = meta_bits();
    run = 0;
    for (uint32_t i = meta_bits(); i < group_size(g) && run < kRefcountBlocks; ++i) {
      if (busy(i)) {
        run = 0;
        at = i + 1;
      } else {
        ++run;
      }
    }
  }
  if (run < kRefcountBlocks) return ENOSPC;
  uint8_t* bits = gr.block_bitmap->data;
  for (uint32_t i = at; i < at + kRefcountBlocks; ++i) {
    bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
  }
  GroupDesc* gd = desc(gdt_, g);
  gd->free_blocks -= kRefcountBlocks;
  gd->refcount_table = at;
  gr.free_blocks.fetch_sub(kRefcountBlocks, std::memory_order_relaxed);
  journal_->dirty(gr.block_bitmap);
  journal_->dirty(gdt_[g / kGroupDescsPerBlock]);
  for (uint32_t i = 0; i < kRefcountBlocks; ++i) {
    MetaBuf* b = journal_->create(group_start(g) + at + i, MetaKind::kRefcount);
    b->group = g;
    RefcountHeader h{};
    h.magic = kRefcountMagic;
    h.group = g;
    h.index = i;
    std::memcpy(b->data, &h, sizeof h);
    journal_->dirty(b);
    gr.refs[i] = b;
  }
  gr.has_refs.store(true, std::memory_order_release);
  log("group " + std::to_string(g) + ": reference-count table made at block " +
      std::to_string(group_start(g) + at));
  return 0;
}

int FsImpl::share_blocks(uint64_t first, uint32_t count, uint32_t* shared) {
  WARPFS_DCHECK(journal_->in_transaction(), "share_blocks: in a transaction");
  *shared = 0;
  if (!shared_blocks_enabled()) return EOPNOTSUPP;
  if (count == 0) return 0;
  const uint32_t g = group_of_block(first);
  if (first < group_start(0) || g >= sb_.group_count) return EIO;
  const auto bit = static_cast<uint32_t>(first - group_start(g));
  if (bit < meta_bits() || uint64_t{bit} + count > group_size(g)) {
    log(std::to_string(first) + "+" + std::to_string(count) +
        ": shared blocks outside a group's data area (run fsck.warpfs)");
    return EIO;
  }
  Group& gr = groups_[g];
  std::lock_guard<std::mutex> lk(gr.mu);
  if (!gr.refs[0]) {
    if (int rc = make_refcount_table(g); rc) return rc;
  }
  const uint8_t* bm = gr.block_bitmap->data;
  for (uint32_t i = bit; i < bit + count; ++i) {
    if (!((bm[i / 8] >> (i % 8)) & 1)) {
      log("block " + std::to_string(group_start(g) + i) +
          " shared while free in its bitmap (run fsck.warpfs)");
      return *shared ? 0 : EIO;
    }
    const uint32_t v = refs_locked(gr, i);
    if (v >= kMaxRefcount) break;
    set_refs_locked(gr, i, v < 2 ? 2 : v + 1);
    ++*shared;
  }
  return 0;
}

uint64_t FsImpl::shared_prefix(uint64_t first, uint64_t count, bool* shared) {
  *shared = false;
  if (count == 0 || first < group_start(0)) return count;
  const uint32_t g = group_of_block(first);
  if (g >= sb_.group_count) return count;
  // A run never reaches past its group (no extent does), but should one, it ends there.
  const auto bit = static_cast<uint32_t>(first - group_start(g));
  const auto end = static_cast<uint32_t>(
      std::max<uint64_t>(bit + 1, std::min<uint64_t>(kBlocksPerGroup, bit + count)));
  Group& gr = groups_[g];
  if (!gr.has_refs.load(std::memory_order_acquire)) return end - bit;
  std::lock_guard<std::mutex> lk(gr.mu);
  // A count that fell to 0 in a transaction not yet committed is still shared (unsharing).
  auto shared_now = [&](uint32_t i) {
    return refs_locked(gr, i) >= 2 || (!gr.unsharing.empty() && gr.unsharing.count(i) != 0);
  };
  *shared = shared_now(bit);
  uint32_t i = bit + 1;
  while (i < end && shared_now(i) == *shared) ++i;
  return i - bit;
}

}  // namespace warpfs::fs
