// The filesystem checker's driver (fs/FORMAT.md "Invariants"; the contract is in fsck.h,
// the passes are this folder's other files, in the order run() calls them: checker.h).
//
// Policy where FORMAT.md leaves a choice:
//  - Exit codes: check mode returns 4 when a problem was found, 0 otherwise. Repair mode
//    returns 1 when something was written (a problem fixed, the journal replayed, orphans
//    freed) and 4 when a problem could not be fixed.
//  - A dirty superblock is what a crash leaves, not a problem. Its committed transactions
//    are replayed (repair) or checked as if replayed (check mode: a notice, exit 0). Only
//    on a *clean* superblock is a committed transaction after the tail a problem (invariant
//    10). The superblock's free counts are compared only when it is clean.
//  - The orphan list is not a problem either: its inodes are reported as notices and, with
//    repair, freed (exit 1), as the next mount would. A malformed list is a problem.
//  - Unreachable inodes with links > 0 are connected to /lost+found (created if missing) as
//    "#<inode>"; allocated inodes with links 0 that are neither reachable nor orphans are
//    freed. Inodes with a bad checksum are cleared, and the entries naming them removed.
//  - A block claimed twice is kept by its first owner (the metadata area, then the lowest
//    inode); with repair each later owner gets a copy of the data.
//  - With shared blocks (feature bit 5) a block that only written extents of regular files
//    map is shared, not claimed twice, and its group's reference-count table must count
//    them (refcounts.cc). A group that needs a table and has none, or whose table is dropped
//    (misplaced), gets one in 17 free blocks of its own; with no room there its shared
//    blocks are copied as blocks claimed twice are. A table whose counts are all 0 stays.
//  - Any structural fault in a directory (bad index, bad leaf, entries out of order or out
//    of range, unreferenced blocks) is repaired by rebuilding the whole directory from the
//    entries that survive: leaves whose checksum fails still yield the entries whose hash
//    matches their name (a 63-bit check per entry).
//  - Regular files may be sparse: FORMAT.md's "size <= mapped range" is checked for
//    directories (size = blocks x 4096) and symlinks only.
#include <algorithm>

#include "fsck/checker.h"

namespace warpfs::fs {

namespace fsck_impl {

// --- reporting ---------------------------------------------------------------------------

void Checker::problem(const std::string& line, const std::string& fix) {
  ++res_.problems;
  std::string s = line;
  if (o_.repair) {
    if (fix.empty()) {
      ++uncorrected_;
    } else {
      ++res_.corrected;
      s += ": " + fix;
    }
  }
  if (res_.lines.size() < kMaxLines) res_.lines.push_back(s);
  if (report_) report_(s);
}

void Checker::unfixable(const std::string& line) {
  ++res_.problems;
  ++uncorrected_;
  if (res_.lines.size() < kMaxLines) res_.lines.push_back(line);
  if (report_) report_(line);
}

bool Checker::write(uint64_t b, uint64_t n, const void* buf) {
  if (!o_.repair) return fail("internal error: a write in check mode");
  const auto* p = static_cast<const uint8_t*>(buf);
  for (uint64_t done = 0; done < n;) {
    const auto k = static_cast<uint32_t>(std::min<uint64_t>(kChunk, n - done));
    if (Status s = dev_.write(b + done, k, p + done * kBlockSize); !s.is_ok()) {
      return fail("cannot write block " + num(b + done) + ": " + s.to_string());
    }
    done += k;
  }
  written_ = true;
  return true;
}

Workers& Checker::workers() {
  if (!workers_) workers_ = std::make_unique<Workers>(o_.threads);
  return *workers_;
}

// --- the run -----------------------------------------------------------------------------

FsckResult Checker::run() {
  if (dev_.block_bytes() != kBlockSize) {
    fail("the device's block size is " + num(dev_.block_bytes()) + " bytes; warpfs needs 4096");
    return finish();
  }
  // Pass M first: every later pass then reads the same filesystem from any copy. A full
  // check only (it reads every block in use once per copy): not for a clean skip.
  if (dev_.copies() > 1 && !o_.skip_if_clean) {
    pass_mirrors();
    if (failed()) return finish();
  }
  if (!load_superblock() || !check_journal()) return finish();
  if (skip_clean()) return finish();
  if (!replay()) return finish();
  L_.init(*sb_);
  if (!check_and_repair()) return finish();
  if (!failed()) summarize();
  return finish();
}

// fsck.warpfs without -f: a clean filesystem with an empty journal is not checked further.
bool Checker::skip_clean() {
  if (!o_.skip_if_clean || primary_bad_ || backup_bad_ || journal_header_bad_ ||
      sb_->state != kStateClean || pending_.transactions != 0 || sb_->orphan_head != 0) {
    return false;
  }
  res_.skipped = true;
  res_.inode_count = sb_->inode_count;
  res_.inodes_used = sb_->inode_count - std::min(sb_->free_inodes, sb_->inode_count);
  res_.block_count = sb_->block_count;
  res_.blocks_used = sb_->block_count - std::min(sb_->free_blocks, sb_->block_count);
  verbose("clean: not checked further (force a check with -f)");
  return true;
}

// The passes, then (repair) the write phase. False where an operational error stops it.
bool Checker::check_and_repair() {
  load_groups();
  if (failed()) return false;
  pass1();
  if (failed()) return false;
  orphan_list();
  pass1b();
  if (failed()) return false;
  pass2();
  if (failed()) return false;
  pass3();
  pass4();
  check_groups();
  if (o_.repair && !failed()) write_phase();
  return !failed();
}

void Checker::write_phase() {
  for (Info& n : infos_) {
    if (n.state == State::kLive && n.rebuild && dir_live(n)) write_directory(n);
    if (failed()) return;
  }
  for (Info& n : infos_) {
    if (n.state == State::kLive && n.remap) write_mapping(n);
    if (failed()) return;
  }
  for (const Info& n : infos_) {  // chain blocks a repair rewrote (pass 1)
    if (n.state != State::kLive) continue;
    for (const auto& [b, data] : n.xpatch) {
      if (!write(b, 1, data.data())) return;
    }
  }
  write_refcounts();
  if (failed()) return;
  write_inodes();
  if (!failed()) write_groups();
  if (!failed() && journal_header_bad_) reset_journal();
  const bool sb_changes = written_ || primary_bad_ || backup_bad_ || sb_->state != kStateClean ||
                          sb_->orphan_head != 0 || res_.problems > 0;
  if (!failed() && sb_changes) write_superblock();
  if (!failed() && written_) {
    if (Status s = dev_.flush(); !s.is_ok()) fail("flush failed: " + s.to_string());
  }
}

void Checker::summarize() {
  std::vector<std::vector<uint8_t>> bb, ib;
  std::vector<uint32_t> dirs;
  build_bitmaps(&bb, &ib, &dirs);
  uint64_t free_blocks = 0, free_inodes = 0;
  for (uint32_t g = 0; g < L_.groups; ++g) {
    free_blocks += zero_bits(bb[g]);
    free_inodes += zero_bits(ib[g]);
    res_.directories += dirs[g];
  }
  res_.inode_count = L_.inode_count;
  res_.inodes_used = L_.inode_count - free_inodes;
  res_.block_count = L_.block_count;
  res_.blocks_used = L_.block_count - free_blocks;
}

// The exit code (FsckExit) from what happened.
FsckResult Checker::finish() {
  int code = kFsckClean;
  if (o_.repair) {
    if (res_.corrected > 0 || written_ || mirror_written_ || orphans_freed_ > 0)
      code |= kFsckCorrected;
    if (uncorrected_ > 0) code |= kFsckUncorrected;
  } else if (res_.problems > 0) {
    code |= kFsckUncorrected;
  }
  if (failed()) {
    code |= kFsckOperational;
    res_.error = error_;
  }
  res_.exit_code = code;
  return res_;
}

}  // namespace fsck_impl

FsckResult fsck(blockdev::BlockDevice& dev, const FsckOptions& o,
                const std::function<void(const std::string&)>& report) {
  auto c = std::make_unique<fsck_impl::Checker>(dev, o, report);
  return c->run();
}

}  // namespace warpfs::fs
