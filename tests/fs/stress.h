// The concurrent stress harness, in-process: many threads drive one mounted filesystem core
// at once, the way FUSE's worker threads do, on a RAM-backed emulated NVMe controller.
//
//   workers   Each owns a directory /wK and runs crash_harness.h's workload in it (creates,
//             writes, reads, truncates, fallocate in every mode, renames, exchanges, links,
//             unlinks, mkdir/rmdir, xattrs, fsync/fdatasync/sync, files held open and
//             unlinked, clones and dedupes among its files) with a crash::Model of that
//             subtree: nobody else changes what it reads, so every read must return exactly
//             what the model holds, and the subtree must equal the model at the end. Now and
//             then a worker also clones a range of another worker's file (found by readdir)
//             into a file of its own outside every model, /clones/wK: the source's owner
//             goes on writing it (copy-on-write), truncating and reading it against its model.
//   sharers   Work on /shared together: create, mkdir, unlink, rmdir, rename (plain,
//             noreplace, exchange), link, open/release, and data through looked-up inodes
//             (whole stamped blocks, truncates and punches at block boundaries), clones of
//             whole blocks from one file to the same offset of another, and dedupes. Nothing
//             there is anyone's own, so only invariants are checked: a call fails only with
//             the errors its races explain (ENOENT, EEXIST, ENOTEMPTY, ...); a block reads as
//             zeroes or as a block stamped for this offset and for this inode or one that was
//             cloned into it, directly or not (never another file's data, never torn); every
//             name resolves; link counts equal the names.
//   observer  Reads the others' directories while they change: readdir, lookup of what it
//             lists (0 or ENOENT, never EIO), getattr, statfs; now and then a deduplication
//             pass over the whole filesystem (Filesystem::dedup), beside everything else.
// The filesystem's committer thread commits every few milliseconds among all of this.
//
// After the workload: the whole tree is read back (crash::observe: every directory reached
// once, readdir agrees with lookup, ".." right), each worker's subtree must be its model's
// last state, the invariants above must hold, the filesystem must have logged nothing, the
// unmount must succeed and fsck must find the image clean; then it is mounted again and
// checked again, the reference counts of shared blocks too (crash::check_shared_counts).
//
// With `cut`, the power goes at a drawn device call in the middle of it all (a torn write,
// a flush, a trim; or after the workload), the controller loses its volatile write cache,
// and the crashed image must check clean with fsck, mount, and show each worker's subtree in
// a state its model allows (crash::check): any interleaving of the workers' operations may
// have been committed, but each worker's own operations commit in order, everything before
// an fsync/fdatasync/sync that returned 0 must be there (metadata and every byte), and so
// must everything before an operation that ended before a commit began (the filesystem's
// commit counter rose by two since it returned). Then more operations, a clean cycle, and the
// same checks as without a cut.
//
// Reproducing: the seed fixes each thread's operations and the cut's call number; which
// calls interleave depends on timing, so a failing seed is rerun many times.
// Thread-safety: run() starts and joins its own threads; one run() per thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace warpfs::fs::stress {

struct Options {
  uint64_t seed = 1;
  int workers = 4;             // threads with a subtree and a model of their own
  int sharers = 2;             // threads on /shared (invariants only)
  bool observer = true;        // a thread reading the others' directories
  uint64_t ops = 300;          // operations per worker; the sharers and the observer run as long
  bool cut = false;            // a power cut among the operations, then recovery
  uint32_t cache_mb = 0;       // a CachedBlockDevice (the daemon's software cache) of this size
  uint32_t commit_ms = 20;     // the committer thread's interval
  bool commit_each = false;    // MountOptions::commit_every_transaction
  uint32_t meta_cache_mb = 0;  // MountOptions::meta_cache_mb; 0: 1 MiB or 32 MiB by the seed
  uint64_t mib = 512;          // the emulated namespace (RAM)
  bool verbose = false;        // trace each worker's operations (the last 40 of each, on failure)
  // Test-only: after the workload, change one byte of a worker's model behind the
  // filesystem's back; the check must then fail (the harness's own test).
  bool tamper_model = false;
};

struct Report {
  bool passed = false;
  std::string failure;
  uint64_t ops = 0;       // operations run by every thread together
  uint64_t commits = 0;   // journal commits during the workload
  uint64_t cut_call = 0;  // cut: the device call that was cut (0: after the workload)
  // copy_file_range and dedupe_range calls of all threads, dedup passes begun, and the blocks
  // they shared (FsStats, summed over the mounts).
  uint64_t clones = 0, dedupes = 0, dedup_passes = 0, cloned_blocks = 0, deduped_blocks = 0;
  size_t durable_states = 0, reached_states = 0, matched_states = 0;  // summed over workers
  std::vector<std::string> trace;
};

Report run(const Options& o);

}  // namespace warpfs::fs::stress
