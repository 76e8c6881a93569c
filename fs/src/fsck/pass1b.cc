// Pass 1B: blocks that pass 1 saw claimed more than once (dups_), as e2fsck's pass1b.c.
// Assumes pass 1's model (only its found inodes own blocks yet). Names every owner of each
// shared run; with repair the first owner (the metadata area, then the lowest inode) keeps
// the blocks and every later owner gets a copy, so pass 5 sees one owner per block.
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
  const std::vector<std::vector<uint64_t>> owners = dup_owners();
  report_dups(owners);
  if (!o_.repair) return;
  // The first owner keeps each block; every later claim is moved to a copy.
  std::vector<bool> taken(dups_.size());
  for (size_t i = 0; i < dups_.size(); ++i) taken[i] = !owners[i].empty() && owners[i][0] == 0;
  for (size_t k = 0; k < found_infos_ && !failed(); ++k) {
    if (infos_[k].state == State::kLive) move_shared(infos_[k], taken);
  }
}

// owners[i]: who claims dups_[i], in claim order; 0 is the metadata area.
std::vector<std::vector<uint64_t>> Checker::dup_owners() {
  std::vector<std::vector<uint64_t>> owners(dups_.size());
  for (size_t i = 0; i < dups_.size(); ++i) {
    if (!L_.is_data(dups_[i])) owners[i].push_back(0);
  }
  for (size_t k = 0; k < found_infos_; ++k) {
    const Info& n = infos_[k];
    if (n.state != State::kLive) continue;
    for_each_claim(n, [&](uint64_t first, uint64_t count) {
      for (auto it = std::lower_bound(dups_.begin(), dups_.end(), first);
           it != dups_.end() && *it < first + count; ++it) {
        owners[static_cast<size_t>(it - dups_.begin())].push_back(n.ino);
      }
    });
  }
  return owners;
}

// One line per run of consecutive blocks with the same owners.
void Checker::report_dups(const std::vector<std::vector<uint64_t>>& owners) {
  for (size_t i = 0; i < dups_.size();) {
    size_t j = i + 1;
    while (j < dups_.size() && dups_[j] == dups_[j - 1] + 1 && owners[j] == owners[i]) ++j;
    std::string who;
    for (size_t k = 0; k < owners[i].size(); ++k) {
      const uint64_t o = owners[i][k];
      who += (k == 0                      ? ""
              : k + 1 == owners[i].size() ? " and "
                                          : ", ") +
             (o == 0 ? L_.metadata_name(dups_[i]) : "inode " + num(o));
    }
    problem(span_str("block", dups_[i], dups_[j - 1]) + ": owned by " + who,
            "each later owner gets a copy");
    i = j;
  }
}

// Whether block b of this claim must move: true unless it is not shared or this is its
// first claimant (who takes it).
bool Checker::must_move(uint64_t b, std::vector<bool>& taken) {
  auto it = std::lower_bound(dups_.begin(), dups_.end(), b);
  if (it == dups_.end() || *it != b) return false;
  const auto i = static_cast<size_t>(it - dups_.begin());
  if (!taken[i]) {
    taken[i] = true;
    return false;
  }
  return true;
}

// Gives inode n copies of the shared blocks others took first: the xattr chain and value
// blocks (the block naming each rewritten to name its copy), tree blocks
// (dropped: write_mapping allocates others) and extents.
void Checker::move_shared(Info& n, std::vector<bool>& taken) {
  if (n.xattr && must_move(n.xattr, taken)) {
    uint64_t to, got;
    if (!alloc(1, &to, &got) || !copy_blocks(n.xattr, to, 1)) {
      unfixable("inode " + num(n.ino) + ": no free block to copy its xattr block to");
    } else {
      xattr_block_moved(n, n.xattr, to);
      n.xattr = to;
      n.dirty = true;
    }
  }
  move_xattr_blocks(n, taken);
  for (size_t t = 0; t < n.tree.size();) {
    if (must_move(n.tree[t], taken)) {
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
    moved = move_extent(n, e, taken, &out) || moved;
  }
  if (moved) {
    n.ext = std::move(out);
    n.remap = n.dirty = true;
  }
}

// The chain and value blocks after the first: each shared one is copied, and the chain
// block naming it (its `next`, or an entry's value record) is rewritten to name the copy.
void Checker::move_xattr_blocks(Info& n, std::vector<bool>& taken) {
  for (size_t j = 0; j < n.xblocks.size() && !failed(); ++j) {
    const uint64_t from = n.xblocks[j];
    if (!must_move(from, taken)) continue;
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
bool Checker::move_extent(Info& n, const Extent& e, std::vector<bool>& taken,
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
    const bool mv = must_move(e.physical + b, taken);
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
