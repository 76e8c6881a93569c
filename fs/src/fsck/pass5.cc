// Pass 5: group summaries, as e2fsck's pass5.c. Assumes pass 1's claims as found
// (found_claims_: the repairs of later passes are the write phase's to account for) and
// pass 1's inodes, and the references pass 1B counted (refs_). Compares each trusted bitmap
// with what the model says, each trusted descriptor's counts with its bitmaps, each
// reference-count table's counts with the references (refcounts.cc), and, after a clean
// unmount, the superblock's free counts with the sum. Repairs are not made here: the write phase
// rebuilds bitmaps, descriptors and superblock from the model.
//
// The groups are compared side by side (Workers::for_each_index): each worker reads the model,
// which nothing writes during this pass, and writes only its GroupCheck; the calling thread reports
// them in group order.
#include <cstring>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

// What pass 5 found in one group: written by one worker, read after Workers::for_each_index
// returns.
struct GroupCheck {
  Findings findings;  // in the order a serial check reports them
  uint64_t bfree = 0, ifree = 0;
};

namespace {

// The runs of bits in [from, limit) where `have` and `want` differ, one finding per run.
void diff_bits(const std::vector<uint8_t>& have, const std::vector<uint8_t>& want, uint64_t from,
               uint64_t limit, uint64_t base, const char* what, const std::string& missing,
               const std::string& extra, Findings* f) {
  for (uint64_t i = from; i < limit;) {
    if (i % 64 == 0 && std::memcmp(have.data() + i / 8, want.data() + i / 8, 8) == 0) {
      i += 64;  // a whole word agrees
      continue;
    }
    const bool h = test_bit(have.data(), i), x = test_bit(want.data(), i);
    if (h == x) {
      ++i;
      continue;
    }
    uint64_t j = i;
    while (j + 1 < limit && test_bit(have.data(), j + 1) == h && test_bit(want.data(), j + 1) == x)
      ++j;
    f->push_back(Finding{span_str(what, base + i, base + j) + ": " + (x ? missing : extra),
                         "bitmap rebuilt"});
    i = j + 1;
  }
}

bool all_set(const std::vector<uint8_t>& bm, uint64_t from, uint64_t to) {
  bool all = true;
  for (uint64_t i = from; i < to; ++i) all = all && test_bit(bm.data(), i);
  return all;
}

}  // namespace

void Checker::check_groups() {
  std::vector<GroupCheck> checks(L_.groups);
  workers().for_each_index(L_.groups, [&](uint32_t g) { check_group(g, &checks[g]); });
  uint64_t free_blocks = 0, free_inodes = 0;
  for (const GroupCheck& c : checks) {
    report_all(c.findings);
    free_blocks += c.bfree;
    free_inodes += c.ifree;
  }
  check_superblock_counts(free_blocks, free_inodes);
}

// Group g's bitmaps and descriptor. Reads the model only: runs on any worker.
void Checker::check_group(uint32_t g, GroupCheck* out) const {
  const uint64_t start = L_.group_start(g), size = L_.group_size(g);
  std::vector<uint8_t> want(kBlockSize, 0);
  // Blocks, as pass 1 found their owners.
  for (uint64_t i = 0; i < kBlocksPerGroup; ++i) {
    if (i >= size || i < 2 + uint64_t{L_.itb} ||
        ((found_claims_[(start + i) / 64] >> ((start + i) % 64)) & 1)) {
      set_bit(want.data(), i);
    }
  }
  if (bb_ok_[g]) check_block_bitmap(g, want, &out->findings);
  out->bfree = zero_bits(bb_ok_[g] ? bb_[g] : want);
  const uint32_t dirs = inode_want(g, &want);
  if (ib_ok_[g]) {
    const std::string gname = "group " + num(g);
    diff_bits(ib_[g], want, 0, L_.ipg, uint64_t{g} * L_.ipg + 1, "inode",
              "in use, but marked free in the inode bitmap of " + gname,
              "marked in use in the inode bitmap of " + gname + ", but free", &out->findings);
    if (!all_set(ib_[g], L_.ipg, kBlockSize * 8))
      out->findings.push_back(Finding{
          gname + ": inode bitmap bits past inodes_per_group are not all set", "bitmap rebuilt"});
  }
  out->ifree = zero_bits(ib_ok_[g] ? ib_[g] : want);
  if (gd_ok_[g]) check_descriptor_counts(g, *out, dirs, &out->findings);
  if (shared_blocks_) check_refcounts(g, &out->findings);
}

// A trusted block bitmap against `want`, the model's.
void Checker::check_block_bitmap(uint32_t g, const std::vector<uint8_t>& want, Findings* f) const {
  const uint64_t start = L_.group_start(g), size = L_.group_size(g);
  const std::string gname = "group " + num(g);
  const std::vector<uint8_t>& have = bb_[g];
  // The group's own metadata marked free would be handed out by the allocator (a mount
  // refuses such a bitmap): a line per run, naming the structure.
  const uint64_t meta = 2 + uint64_t{L_.itb};
  for (uint64_t i = 0; i < meta; ++i) {
    if (test_bit(have.data(), i)) continue;
    const uint64_t end = i < 2 ? i + 1 : meta;  // a bitmap, or the inode table
    uint64_t j = i;
    while (j + 1 < end && !test_bit(have.data(), j + 1)) ++j;
    f->push_back(Finding{span_str("block", start + i, start + j) + " (" +
                             L_.metadata_name(start + i) +
                             "): the group's own metadata, marked free in its block bitmap",
                         "bitmap rebuilt"});
    i = j;
  }
  diff_bits(have, want, meta, size, start, "block",
            "in use, but marked free in the block bitmap of " + gname,
            "marked in use in the block bitmap of " + gname + ", but owned by nothing", f);
  if (!all_set(have, size, kBlocksPerGroup))
    f->push_back(Finding{gname + ": block bitmap bits past the end of the group are not all set",
                         "bitmap rebuilt"});
}

// The inode bitmap the model describes (pass 1's inodes: mode != 0) into *want; returns the
// group's directories.
uint32_t Checker::inode_want(uint32_t g, std::vector<uint8_t>* want) const {
  std::fill(want->begin(), want->end(), 0);
  uint32_t dirs = 0;
  for (uint64_t i = 0; i < kBlockSize * 8; ++i) {
    if (i >= L_.ipg) {
      set_bit(want->data(), i);
      continue;
    }
    const uint32_t s = slot_[uint64_t{g} * L_.ipg + i + 1];
    if (s != 0 && s - 1 < found_infos_) {
      set_bit(want->data(), i);
      const Info& n = infos_[s - 1];
      dirs += n.state != State::kBad && is_dir(n) && !n.fresh;
    }
  }
  return dirs;
}

void Checker::check_descriptor_counts(uint32_t g, const GroupCheck& c, uint32_t dirs,
                                      Findings* f) const {
  const std::string gname = "group " + num(g);
  const GroupDesc& d = gd_[g];
  if (d.free_blocks != c.bfree) {
    f->push_back(Finding{gname + ": descriptor says " + num(d.free_blocks) +
                             " free blocks, but its bitmap has " + num(c.bfree),
                         "recomputed"});
  }
  if (d.free_inodes != c.ifree) {
    f->push_back(Finding{gname + ": descriptor says " + num(d.free_inodes) +
                             " free inodes, but its bitmap has " + num(c.ifree),
                         "recomputed"});
  }
  if (d.used_dirs != dirs) {
    f->push_back(Finding{
        gname + ": descriptor says " + num(d.used_dirs) + " directories, but it has " + num(dirs),
        "recomputed"});
  }
}

// The superblock's counts are exact only after a clean unmount (FORMAT.md).
void Checker::check_superblock_counts(uint64_t free_blocks, uint64_t free_inodes) {
  if (sb_->state != kStateClean || used_backup_) {
    verbose("superblock: free counts not compared (the filesystem was not cleanly unmounted)");
    return;
  }
  if (sb_->free_blocks != free_blocks) {
    problem("superblock: " + num(sb_->free_blocks) + " free blocks, but the bitmaps have " +
                num(free_blocks),
            "recomputed");
  }
  if (sb_->free_inodes != free_inodes) {
    problem("superblock: " + num(sb_->free_inodes) + " free inodes, but the bitmaps have " +
                num(free_inodes),
            "recomputed");
  }
}

}  // namespace warpfs::fs::fsck_impl
