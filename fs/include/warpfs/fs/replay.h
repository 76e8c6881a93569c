// Journal replay (fs/FORMAT.md "Journal"): used by the mount and by fsck.warpfs.
#pragma once

#include <cstdint>
#include <string>

#include "warpfs/blockdev/block_device.h"
#include "warpfs/fs/format.h"

namespace warpfs::fs {

struct ReplayResult {
  uint64_t transactions = 0;  // committed transactions written home
  uint64_t blocks = 0;        // blocks written home
  uint64_t next_seq = 0;      // sequence number the next transaction must use
  uint64_t next_pos = 0;      // journal position where the next transaction starts
  std::string stopped;        // why the scan ended ("no descriptor", "commit checksum", ...)
};

// Reads the journal of the filesystem described by `sb` (already validated) from its tail
// and writes every complete, checksummed transaction to its home blocks, in order. Then
// flushes, and rewrites the journal header with the tail at the first position after the
// replayed transactions (so a second replay finds nothing), and flushes again.
// With `dry_run`, nothing is written: the result says what a replay would do.
// Errors: the device's I/O errors, or kCorrupt-style errors naming the journal header.
blockdev::Status replay_journal(blockdev::BlockDevice& dev, const Superblock& sb, bool dry_run,
                                ReplayResult* out);

// Journal-relative position arithmetic: positions 1..journal_blocks-1 form the ring.
inline uint64_t journal_next(uint64_t pos, uint32_t journal_blocks) {
  return pos + 1 >= journal_blocks ? 1 : pos + 1;
}

}  // namespace warpfs::fs
