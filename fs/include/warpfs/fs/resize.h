// resize.warpfs: grows an unmounted, clean filesystem to a larger device or image (FORMAT.md
// "Growing"), as resize2fs does for ext4. Offline only: the argument is in FORMAT.md.
// Shrinking is not supported.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "warpfs/blockdev/block_device.h"

namespace warpfs::fs {

struct ResizeOptions {
  std::function<void(const std::string&)> log;  // the mount's notices; default: stderr
};

struct ResizeResult {
  uint64_t old_blocks = 0, new_blocks = 0;
  uint32_t old_groups = 0, new_groups = 0;
};

// Grows the filesystem on `dev` to `blocks` (0: the whole device), or as close below it as
// whole groups allow (a last group too short for its metadata is left out). "" or why not:
// not a clean warpfs, no larger, beyond the room its descriptor table keeps (mkfs.warpfs
// -E resize=), an I/O error. A power cut at any point leaves the old filesystem or the new
// one, each fsck-clean.
[[nodiscard]] std::string grow(blockdev::BlockDevice& dev, uint64_t blocks, const ResizeOptions& o,
                               ResizeResult* out = nullptr);

}  // namespace warpfs::fs
