// Pass 1B: blocks that pass 1 saw claimed more than once (dups_), as e2fsck's pass1b.c.
// Assumes pass 1's model (only its found inodes own blocks yet) and pass 0's tables. With
// kFeatureSharedBlocks a block that only written extents of regular files claim is shared,
// not a duplicate: refcounts.cc counts its references (refs_, for pass 5 and the write
// phase) and, with repair, gives a group that needs a table and has none a new one. Every
// other block claimed twice is a duplicate: each shared run's owners are named; with repair
// the first owner (the metadata area, then the lowest inode) keeps the blocks and every
// later owner gets a copy, so pass 5 sees one owner per block. A shared block past
// kMaxRefcount references keeps that many, and the later ones get copies the same way.
#include <algorithm>
#include <cstring>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

namespace {

// Blocks [from, from + len) of `e`, at `physical`, with e's unwritten flag.
Extent sub_extent(const Extent& e, uint64_t from, uint64_t len, uint64_t physical) {
  const uint32_t flag = e.length & Extent::kUnwritten;
  return Extent{static_cast<uint32_t>(e.logical + from), static_cast<uint32_t>(len) | flag,
                physical};
}

}  // namespace

void Checker::pass1b() {
  if (dups_.empty()) return;
  std::sort(dups_.begin(), dups_.end());
  dups_.erase(std::unique(dups_.begin(), dups_.end()), dups_.end());
  std::vector<bool> sharable;
  std::vector<std::vector<uint64_t>> owners = dup_owners(&sharable);
  // keep[i]: how many more claims of dups_[i] keep it (the first one; a shared block's
  // first kMaxRefcount); the metadata area's claim comes first and takes it.
  std::vector<uint32_t> keep(dups_.size());
  for (size_t i = 0; i < dups_.size(); ++i)
    keep[i] = !owners[i].empty() && owners[i][0] == 0 ? 0 : 1;
  if (shared_blocks_) {
    split_shared(owners, sharable, keep);
  }
  report_dups(owners, keep);
  if (!o_.repair) return;
  // Every claim past those that keep a block is moved to a copy.
  for (size_t k = 0; k < found_infos_ && !failed(); ++k) {
    if (infos_[k].state == State::kLive) move_shared(infos_[k], keep);
  }
}

// owners[i]: who claims dups_[i], in claim order; 0 is the metadata area (a table block
// included). (*sharable)[i]: whether every claim is one that may share (for_each_claim_kind).
std::vector<std::vector<uint64_t>> Checker::dup_owners(std::vector<bool>* sharable) {
  std::vector<std::vector<uint64_t>> owners(dups_.size());
  sharable->assign(dups_.size(), true);
  for (size_t i = 0; i < dups_.size(); ++i) {
    if (!L_.is_data(dups_[i]) || table_block(dups_[i])) {
      owners[i].push_back(0);
      (*sharable)[i] = false;
    }
  }
  for (size_t k = 0; k < found_infos_; ++k) {
    const Info& n = infos_[k];
    if (n.state != State::kLive) continue;
    for_each_claim_kind(n, [&](uint64_t first, uint64_t count, bool may_share) {
      for (auto it = std::lower_bound(dups_.begin(), dups_.end(), first);
           it != dups_.end() && *it < first + count; ++it) {
        const auto i = static_cast<size_t>(it - dups_.begin());
        owners[i].push_back(n.ino);
        if (!may_share) (*sharable)[i] = false;
      }
    });
  }
  return owners;
}

// One line per run of consecutive blocks with the same owners. A shared block past the
// limit (keep > 1) was reported by split_shared.
void Checker::report_dups(const std::vector<std::vector<uint64_t>>& owners,
                          const std::vector<uint32_t>& keep) {
  for (size_t i = 0; i < dups_.size();) {
    if (keep[i] > 1) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < dups_.size() && dups_[j] == dups_[j - 1] + 1 && owners[j] == owners[i] &&
           keep[j] <= 1)
      ++j;
    std::string who;
    for (size_t k = 0; k < owners[i].size(); ++k) {
      const uint64_t o = owners[i][k];
      who += (k == 0                      ? ""
              : k + 1 == owners[i].size() ? " and "
                                          : ", ") +
             (o == 0 ? owner_name(dups_[i]) : "inode " + num(o));
    }
    problem(span_str("block", dups_[i], dups_[j - 1]) + ": owned by " + who,
            "each later owner gets a copy");
    i = j;
  }
}

// Whether block b of this claim must move: true unless it is not a duplicate or this claim
// is one of those that keep it (keep[i] left).
bool Checker::must_move(uint64_t b, std::vector<uint32_t>& keep) {
  auto it = std::lower_bound(dups_.begin(), dups_.end(), b);
  if (it == dups_.end() || *it != b) return false;
  const auto i = static_cast<size_t>(it - dups_.begin());
  if (keep[i] > 0) {
    --keep[i];
    return false;
  }
  return true;
}

// Gives inode n copies of the shared blocks others took first: the xattr chain and value
// blocks (the block naming each rewritten to name its copy), tree blocks
// (dropped: write_mapping allocates others) and extents.
void Checker::move_shared(Info& n, std::vector<uint32_t>& keep) {
  if (n.xattr && must_move(n.xattr, keep)) {
    uint64_t to, got;
    if (!alloc(1, &to, &got) || !copy_blocks(n.xattr, to, 1)) {
      unfixable("inode " + num(n.ino) + ": no free block to copy its xattr block to");
    } else {
      xattr_block_moved(n, n.xattr, to);
      n.xattr = to;
      n.dirty = true;
    }
  }
  move_xattr_blocks(n, keep);
  for (size_t t = 0; t < n.tree.size();) {
    if (must_move(n.tree[t], keep)) {
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
    moved = move_extent(n, e, keep, &out) || moved;
  }
  if (moved) {
    n.ext = std::move(out);
    n.remap = n.dirty = true;
  }
}

// The chain and value blocks after the first: each shared one is copied, and the chain
// block naming it (its `next`, or an entry's value record) is rewritten to name the copy.
void Checker::move_xattr_blocks(Info& n, std::vector<uint32_t>& keep) {
  for (size_t j = 0; j < n.xblocks.size() && !failed(); ++j) {
    const uint64_t from = n.xblocks[j];
    if (!must_move(from, keep)) continue;
    uint64_t to, got;
    if (!alloc(1, &to, &got) || !copy_blocks(from, to, 1)) {
      unfixable("inode " + num(n.ino) + ": no free block to copy its xattr block " + num(from) +
                " to");
      continue;
    }
    xattr_block_moved(n, from, to);
    const uint64_t at = n.xref[j].first;
    const uint32_t off = n.xref[j].second;
    auto it = std::find_if(n.xpatch.begin(), n.xpatch.end(),
                           [&](const auto& p) { return p.first == at; });
    if (it == n.xpatch.end()) {
      std::vector<uint8_t> buf(kBlockSize);
      if (!read(at, 1, buf.data())) return;
      n.xpatch.emplace_back(at, std::move(buf));
      it = n.xpatch.end() - 1;
    }
    std::memcpy(it->second.data() + off, &to, 8);
    const uint64_t sum = block_checksum(it->second.data(), kHeaderChecksumOffset, L_.seed);
    std::memcpy(it->second.data() + kHeaderChecksumOffset, &sum, 8);
    n.xblocks[j] = to;
    n.dirty = true;
  }
}

// An xattr chain block of n now lives at `to`: what pass 1 rewrote of it, and the references
// its content holds, follow.
void Checker::xattr_block_moved(Info& n, uint64_t from, uint64_t to) {
  for (auto& p : n.xpatch) {
    if (p.first == from) p.first = to;
  }
  for (auto& r : n.xref) {
    if (r.first == from) r.first = to;
  }
}

// Splits e into runs that stay and runs that move (copied); true if a run moved.
bool Checker::move_extent(Info& n, const Extent& e, std::vector<uint32_t>& keep,
                          std::vector<Extent>* out) {
  bool moved = false, run_moves = false;
  uint64_t run_start = 0;
  auto flush_run = [&](uint64_t to) {
    if (run_start == to) return;
    if (!run_moves) {
      out->push_back(sub_extent(e, run_start, to - run_start, e.physical + run_start));
      return;
    }
    moved = true;
    copy_run(n, e, run_start, to, out);
  };
  for (uint64_t b = 0; b < e.blocks(); ++b) {
    const bool mv = must_move(e.physical + b, keep);
    if (b == 0) {
      run_moves = mv;
    } else if (mv != run_moves) {
      flush_run(b);
      run_start = b;
      run_moves = mv;
    }
  }
  flush_run(e.blocks());
  return moved;
}

// Blocks [from, to) of e move to fresh blocks (copied unless unwritten).
bool Checker::copy_run(Info& n, const Extent& e, uint64_t from, uint64_t to,
                       std::vector<Extent>* out) {
  for (uint64_t at = from; at < to;) {
    uint64_t dst, got;
    if (!alloc(to - at, &dst, &got)) {
      unfixable("inode " + num(n.ino) + ": no free blocks to copy shared blocks to");
      out->push_back(sub_extent(e, at, to - at, e.physical + at));
      return false;
    }
    if (!e.unwritten() && !copy_blocks(e.physical + at, dst, got)) return false;
    out->push_back(sub_extent(e, at, got, dst));
    at += got;
  }
  return true;
}

}  // namespace warpfs::fs::fsck_impl
