// Shared blocks (FORMAT.md "Shared blocks", feature bit 5): each group's reference-count
// table, in the passes that need it.
//   pass 0   load_refcount_table: the descriptor's refcount_table (0 without the feature,
//            else 0 or a run of kRefcountBlocks inside the group's data area) and each
//            table block's header; a table kept is owned like metadata (claim_metadata)
//   pass 1B  split_shared: a block that only written extents of regular files claim is
//            shared, not a duplicate; its references go to refs_. With repair a group that
//            needs a table and has none gets one, or, with no room for it, its shared
//            blocks become duplicates (copied for all but their first owner)
//   pass 5   check_refcounts: each count as read against the references pass 1 found
//   write    write_refcounts: the table blocks whose counts differ from the model's after
//            every repair (freed inodes and copies only ever remove references)
// The model's counts are what FORMAT.md requires: n >= 2 for a block n written extents map,
// 0 for every other block; 1 never.
#include <algorithm>
#include <cstring>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

namespace {

constexpr size_t kTableCounts = size_t{kRefcountBlocks} * kRefcountsPerBlock;

// refs_ ordered by block: the first entry at or after block b.
auto refs_from(const std::vector<std::pair<uint64_t, uint32_t>>& refs, uint64_t b) {
  return std::lower_bound(
      refs.begin(), refs.end(), b,
      [](const std::pair<uint64_t, uint32_t>& r, uint64_t x) { return r.first < x; });
}

std::string references(uint64_t n) {
  return num(n) + (n == 1 ? " reference" : " references");
}

}  // namespace

// --- pass 0 ------------------------------------------------------------------------------

// Group g's table as its descriptor names it: kept in rt_[g] with its counts, or dropped
// (reported when the descriptor is trusted: one whose checksum failed is rewritten anyway).
// A table none of whose blocks verifies as the group's is no table: its blocks are left to
// whoever else claims them rather than taken from a file on a stray field's word.
void Checker::load_refcount_table(uint32_t g) {
  const uint32_t at = gd_[g].refcount_table;
  if (at == 0) return;
  const std::string where = "group " + num(g);
  if (!shared_blocks_) {
    if (gd_ok_[g]) {
      problem(where + ": descriptor names a reference-count table (group block " + num(at) +
                  ") without the shared_blocks feature",
              "cleared");
    }
    return;
  }
  const uint64_t meta = 2 + uint64_t{L_.itb}, size = L_.group_size(g);
  if (at < meta || uint64_t{at} + kRefcountBlocks > size) {
    if (gd_ok_[g]) {
      problem(where + ": reference-count table at group block " + num(at) +
                  " lies outside the group's data area (group blocks " + num(meta) + "-" +
                  num(size - 1) + ")",
              "dropped (the counts are rebuilt from the references)");
    }
    return;
  }
  const uint64_t first = L_.group_start(g) + at;
  std::vector<uint8_t> buf(size_t{kRefcountBlocks} * kBlockSize);
  if (!read(first, kRefcountBlocks, buf.data())) return;
  RefTable t;
  t.at = at;
  t.ok.assign(kRefcountBlocks, false);
  t.count.assign(kTableCounts, 0);
  std::vector<std::string> why(kRefcountBlocks);
  bool any_ok = false;
  for (uint32_t i = 0; i < kRefcountBlocks; ++i) {
    const uint8_t* p = buf.data() + size_t{i} * kBlockSize;
    RefcountHeader h;
    std::memcpy(&h, p, sizeof h);
    if (h.magic != kRefcountMagic) {
      why[i] = "bad magic";
    } else if (h.checksum != block_checksum(p, kHeaderChecksumOffset, L_.seed)) {
      why[i] = "checksum mismatch";
    } else if (h.group != g) {
      why[i] = "names group " + num(h.group);
    } else if (h.index != i) {
      why[i] = "has index " + num(h.index) + ", expected " + num(i);
    } else {
      t.ok[i] = any_ok = true;
      std::memcpy(t.count.data() + size_t{i} * kRefcountsPerBlock, p + sizeof h,
                  kRefcountsPerBlock * sizeof(uint16_t));
    }
  }
  if (!any_ok) {  // no table there: a stray field, whose blocks may be anyone's
    if (gd_ok_[g]) {
      problem(where + ": reference-count table at group block " + num(at) + ": " + why[0] +
                  " in every block",
              "dropped (the counts are rebuilt from the references)");
    }
    return;
  }
  for (uint32_t i = 0; i < kRefcountBlocks; ++i) {
    if (!why[i].empty()) {
      problem(where + ": reference-count table block " + num(first + i) + ": " + why[i],
              "rewritten from the references");
    }
  }
  // Counts past the group's end name no block: they must be 0 (pass 5 compares the rest).
  for (uint64_t k = size; k < kTableCounts; ++k) {
    if (t.ok[k / kRefcountsPerBlock] && t.count[k] != 0) {
      problem(where + ": reference-count table: counts past the group's end are not 0",
              "rewritten");
      break;
    }
  }
  rt_[g] = std::move(t);
}

bool Checker::table_block(uint64_t b) const {
  if (rt_.empty() || b < L_.first_group || b >= L_.block_count - 1) return false;
  const uint32_t g = L_.group_of(b);
  const uint64_t off = b - L_.group_start(g);
  return rt_[g].at != 0 && off >= rt_[g].at && off < uint64_t{rt_[g].at} + kRefcountBlocks;
}

std::string Checker::owner_name(uint64_t b) const {
  if (table_block(b)) return "the reference-count table of group " + num(L_.group_of(b));
  return L_.metadata_name(b);
}

// --- pass 1B -----------------------------------------------------------------------------

// Takes the shared blocks out of dups_ (and owners, keep): those whose claims may all share
// (sharable). Their references go to refs_. A group that has shared blocks and no table gets
// one (repair); with no room in it, its shared blocks stay duplicates. A block past
// kMaxRefcount references stays a duplicate whose first kMaxRefcount claims keep it.
void Checker::split_shared(std::vector<std::vector<uint64_t>>& owners,
                           const std::vector<bool>& sharable, std::vector<uint32_t>& keep) {
  std::vector<bool> no_room(L_.groups, false);
  for (size_t a = 0; a < dups_.size();) {
    if (!sharable[a]) {
      ++a;
      continue;
    }
    const uint32_t g = L_.group_of(dups_[a]);
    const uint64_t end = L_.group_start(g) + L_.group_size(g);
    size_t b = a;
    while (b < dups_.size() && dups_[b] < end) ++b;
    if (rt_[g].at == 0) {
      std::string fix = "a table is written";
      if (o_.repair) {
        if (alloc_table(g)) {
          const uint64_t first = L_.group_start(g) + rt_[g].at;
          fix = "table written at " + span_str("block", first, first + kRefcountBlocks - 1);
        } else {
          no_room[g] = true;
          fix = "no room for a table in the group: each later owner gets a copy";
        }
      }
      // One line per run of consecutive shared blocks with as many references.
      for (size_t i = a; i < b;) {
        if (!sharable[i]) {
          ++i;
          continue;
        }
        size_t j = i + 1;
        while (j < b && sharable[j] && dups_[j] == dups_[j - 1] + 1 &&
               owners[j].size() == owners[i].size())
          ++j;
        problem("group " + num(g) + ": " + span_str("block", dups_[i], dups_[j - 1]) + ": " +
                    references(owners[i].size()) + ", but the group has no reference-count table",
                fix);
        i = j;
      }
    }
    a = b;
  }
  size_t put = 0;
  for (size_t i = 0; i < dups_.size(); ++i) {
    const uint64_t b = dups_[i];
    if (sharable[i] && !no_room[L_.group_of(b)]) {
      const uint64_t n = owners[i].size();
      if (n <= kMaxRefcount) {
        refs_.emplace_back(b, static_cast<uint32_t>(n));
        continue;
      }
      problem("block " + num(b) + ": " + references(n) + ", more than " + num(kMaxRefcount),
              "the references past the " + num(kMaxRefcount) + "th get a copy");
      refs_.emplace_back(b, kMaxRefcount);
      keep[i] = kMaxRefcount;
    }
    if (put != i) {  // (a vector moved onto itself is left empty)
      dups_[put] = b;
      owners[put] = std::move(owners[i]);
      keep[put] = keep[i];
    }
    ++put;
  }
  dups_.resize(put);
  owners.resize(put);
  keep.resize(put);
}

// kRefcountBlocks contiguous blocks of group g's data area that nothing claims (on the first
// try, that a trusted bitmap marks free too, as alloc() does) become its new table.
bool Checker::alloc_table(uint32_t g) {
  const uint64_t start = L_.group_start(g), size = L_.group_size(g);
  for (int pass = 0; pass < 2; ++pass) {
    uint64_t run = 0;
    for (uint64_t i = 2 + uint64_t{L_.itb}; i < size; ++i) {
      const bool free =
          !claimed(start + i) && (pass == 1 || !bb_ok_[g] || !test_bit(bb_[g].data(), i));
      run = free ? run + 1 : 0;
      if (run < kRefcountBlocks) continue;
      const uint64_t first = i + 1 - kRefcountBlocks;
      claim(start + first, kRefcountBlocks);
      RefTable& t = rt_[g];
      t.at = static_cast<uint32_t>(first);
      t.fresh = true;
      t.ok.assign(kRefcountBlocks, false);
      t.count.assign(kTableCounts, 0);
      return true;
    }
  }
  return false;
}

// --- pass 5 ------------------------------------------------------------------------------

// Group g's counts as read against the references pass 1 found: a shared block's count is
// its references, every other block's 0. One finding per run of blocks alike. Reads the
// model only: runs on any worker.
void Checker::check_refcounts(uint32_t g, Findings* f) const {
  const RefTable& t = rt_[g];
  if (t.at == 0 || t.fresh) return;
  const uint64_t start = L_.group_start(g), size = L_.group_size(g);
  auto it = refs_from(refs_, start);
  uint64_t run = 0, run_have = 0, run_refs = 0;
  bool open = false;
  auto flush = [&](uint64_t last) {
    if (!open) return;
    f->push_back(Finding{"group " + num(g) + ": " + span_str("block", start + run, start + last) +
                             ": reference count " + num(run_have) + ", " + references(run_refs),
                         "rewritten"});
    open = false;
  };
  for (uint64_t k = 0; k < size; ++k) {
    while (it != refs_.end() && it->first < start + k) ++it;
    const bool shared = it != refs_.end() && it->first == start + k;
    if (!t.ok[k / kRefcountsPerBlock]) {  // unknown: reported in pass 0, rewritten
      flush(k - 1);
      continue;
    }
    const uint64_t have = t.count[k];
    const uint64_t refs = shared ? it->second : (claimed_found(start + k) ? 1 : 0);
    const uint64_t want = refs >= 2 ? refs : 0;
    if (have == want) {
      flush(k - 1);
      continue;
    }
    if (open && have == run_have && refs == run_refs) continue;
    flush(k - 1);
    open = true;
    run = k;
    run_have = have;
    run_refs = refs;
  }
  flush(size - 1);
}

// --- the write phase ---------------------------------------------------------------------

// Every kept or new table whose counts differ from the model's is rewritten, block by block.
// Only blocks pass 1 found shared can be shared now: the repairs never add a reference.
void Checker::write_refcounts() {
  if (!shared_blocks_) return;  // no table is kept without the feature
  std::vector<uint64_t> now(refs_.size(), 0);
  for (const Info& n : infos_) {
    if (n.state != State::kLive) continue;
    for_each_claim_kind(n, [&](uint64_t first, uint64_t count, bool may_share) {
      if (!may_share) return;
      for (auto it = refs_from(refs_, first); it != refs_.end() && it->first < first + count; ++it)
        ++now[static_cast<size_t>(it - refs_.begin())];
    });
  }
  std::vector<uint16_t> want(kTableCounts);
  std::vector<uint8_t> blk(kBlockSize);
  for (uint32_t g = 0; g < L_.groups && !failed(); ++g) {
    RefTable& t = rt_[g];
    if (t.at == 0) continue;
    const uint64_t start = L_.group_start(g), size = L_.group_size(g);
    std::fill(want.begin(), want.end(), 0);
    for (auto it = refs_from(refs_, start); it != refs_.end() && it->first < start + size; ++it) {
      const uint64_t n = now[static_cast<size_t>(it - refs_.begin())];
      if (n >= 2)
        want[it->first - start] = static_cast<uint16_t>(std::min<uint64_t>(n, kMaxRefcount));
    }
    for (uint32_t i = 0; i < kRefcountBlocks; ++i) {
      const size_t off = size_t{i} * kRefcountsPerBlock;
      if (!t.fresh && t.ok[i] &&
          std::equal(want.begin() + static_cast<long>(off),
                     want.begin() + static_cast<long>(off + kRefcountsPerBlock),
                     t.count.begin() + static_cast<long>(off)))
        continue;
      std::fill(blk.begin(), blk.end(), 0);
      const RefcountHeader h{kRefcountMagic, g, i, 0, 0, 0};
      std::memcpy(blk.data(), &h, sizeof h);
      std::memcpy(blk.data() + sizeof h, want.data() + off, kRefcountsPerBlock * sizeof(uint16_t));
      const uint64_t sum = block_checksum(blk.data(), kHeaderChecksumOffset, L_.seed);
      std::memcpy(blk.data() + kHeaderChecksumOffset, &sum, 8);
      if (!write(start + t.at + i, 1, blk.data())) return;
      std::copy(want.begin() + static_cast<long>(off),
                want.begin() + static_cast<long>(off + kRefcountsPerBlock),
                t.count.begin() + static_cast<long>(off));
      t.ok[i] = true;
    }
    t.fresh = false;
  }
}

}  // namespace warpfs::fs::fsck_impl
