// tune.warpfs: changes the adjustable fields of an unmounted, clean filesystem's superblock
// (FORMAT.md "Superblock"): its label, the blocks kept for root and who may use them, and
// the default journal commit interval, as tune2fs does for ext4. Nothing else is touched.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "warpfs/blockdev/block_device.h"
#include "warpfs/fs/format.h"

namespace warpfs::fs {

struct TuneRequest {
  std::optional<std::string> label;            // up to 63 bytes
  std::optional<double> reserved_percent;      // of the data blocks, 0 to 50
  std::optional<uint64_t> reserved_blocks;     // or a count, at most half of the blocks
  std::optional<uint32_t> reserved_uid, reserved_gid;
  std::optional<uint32_t> commit_interval_s;   // 0: 5 s; at most 86400
};

// Reads and checks the primary superblock of `dev`: "" or why it cannot be tuned (damaged:
// run fsck.warpfs; not cleanly unmounted: mount it or run fsck.warpfs first, since a journal
// replay would write an older superblock back).
std::string read_tunable_superblock(blockdev::BlockDevice& dev, Superblock* sb);

// Applies `r` to `dev`: the backup superblock first, then the primary, each flushed, so a cut
// leaves either the old or the new fields in the primary and a valid backup. "" or why not
// (nothing written then). `out`, if given, receives the new superblock.
std::string tune(blockdev::BlockDevice& dev, const TuneRequest& r, Superblock* out = nullptr);

}  // namespace warpfs::fs
