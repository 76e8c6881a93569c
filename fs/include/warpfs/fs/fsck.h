// The filesystem checker (fs/FORMAT.md "Invariants"): used by fsck.warpfs and by tests.
//
// fsck() reads every piece of metadata of an unmounted warpfs, reports each violation of
// FORMAT.md's invariants 1-10 (and of the orphan list) as one line naming the object
// ("inode 12: link count 2, but 1 directory entry names it", "block 5678: owned by inode 12
// and inode 40"), and with `repair` fixes them the way e2fsck -y would. Passes, in order:
//   M  a mirrored set's copies (BlockDevice::copies() > 1, full checks only): every block in
//      use on every kept copy; differing copies are reported and, with repair, rewritten
//      from the copy whose checksum verifies (metadata), else the lowest-numbered member's
//      (fs/src/fsck/mirrors.cc)
//   0  superblock: the primary, else the backup (the last block of the filesystem)
//   J  journal: header; committed transactions are replayed first (repair) or reported
//   1  inodes: checksums, fields, extent trees, xattr blocks; block ownership
//   1B blocks with several owners: who owns them; with repair each later owner gets a copy
//      (with feature bit 5, blocks that written extents of regular files share are counted
//      instead, and a group that needs a reference-count table and has none gets one)
//   2  directories: index root, leaves, entries (names, hashes, targets, types)
//   3  reachability from the root and the orphan list; parent fields; /lost+found
//   4  link counts
//   5  block and inode bitmaps, their checksums, free counts, group descriptors, superblock,
//      reference counts against the references pass 1 found
// Passes 1 and 5 run their groups, pass 2 its directories side by side on
// FsckOptions::threads threads (oneTBB); what is reported, in what order, and what is
// repaired do not depend on the thread count.
//
// What a crash leaves (a dirty superblock, committed transactions in the journal, inodes on
// the orphan list) is not a problem: it is reported as a notice, replayed and freed with
// `repair`. Exit codes and the other policy choices (/lost+found, shared blocks, directory
// rebuilds) are written at the top of fs/src/fsck/fsck.cc, one file per pass beside it. The
// checker is offline code: it lives in warpfs_fs_offline, which the daemon does not link.
//
// Thread-safety: one call at a time per device, and nothing else may use the device while
// it runs (the filesystem must not be mounted). With threads != 1 the device is read from
// several threads at once (block_device.h allows it); `report` and `progress` are called on
// the calling thread only. Without `repair` nothing is ever written:
// the journal is replayed into memory, and the check sees what a mount would see.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "warpfs/blockdev/block_device.h"

namespace warpfs::fs {

struct FsckOptions {
  bool repair = false;         // fix what is found (fsck -y); false: check only (fsck -n)
  bool replay_journal = true;  // replay committed transactions before checking (without
                               // repair: into memory only); false: with repair they are
                               // discarded, without it the filesystem is checked as found
  bool skip_if_clean = false;  // a clean filesystem with an empty journal is not checked
                               // further (fsck.warpfs without -f)
  bool verbose = false;        // also report what each pass found, not only problems
  unsigned threads = 0;        // threads for the inode and group passes: 0 all hardware
                               // threads, 1 the calling thread alone (no oneTBB arena)
  // Called as the inode pass advances (groups done, groups in all).
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// e2fsck's exit codes; a result ORs them (1 | 4: some errors fixed, some left).
enum FsckExit : int {
  kFsckClean = 0,
  kFsckCorrected = 1,
  kFsckUncorrected = 4,
  kFsckOperational = 8,  // cannot read the device, not a warpfs, I/O error while repairing
  kFsckUsage = 16,       // (fsck.warpfs only)
};

struct [[nodiscard]] FsckResult {
  int exit_code = kFsckClean;
  uint64_t problems = 0;           // problems found (each also reported)
  uint64_t corrected = 0;          // of those, repaired
  std::vector<std::string> lines;  // the problem lines, as reported (the first 10000); notices
                                   // (journal replayed, orphans freed) go to `report` only
  std::string error;               // the operational error, when exit_code has kFsckOperational
  bool skipped = false;      // skip_if_clean applied: only the superblock and journal were read
  bool used_backup = false;  // the primary superblock was unusable
  // Totals after repair (or as found, without repair), for the summary line.
  uint64_t inodes_used = 0, inode_count = 0, directories = 0;
  uint64_t blocks_used = 0, block_count = 0;
  uint64_t journal_transactions = 0;  // committed transactions replayed (or pending)
  uint64_t copies_differing = 0;      // pass M: blocks of a mirrored set whose copies differed
};

// Checks (and with o.repair, repairs) the warpfs on `dev`. Every problem line and, with
// o.verbose, every informational line goes to `report` (may be null). Flushes the device
// after repairing.
FsckResult fsck(blockdev::BlockDevice& dev, const FsckOptions& o,
                const std::function<void(const std::string&)>& report);

}  // namespace warpfs::fs
