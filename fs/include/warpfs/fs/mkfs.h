// Formatting: computes a geometry for a device and writes a fresh, empty warpfs on it
// (fs/FORMAT.md). Used by mkfs.warpfs and by tests.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "warpfs/blockdev/block_device.h"
#include "warpfs/fs/format.h"

namespace warpfs::fs {

struct MkfsOptions {
  uint64_t inodes = 0;          // 0: one per 16 KiB
  uint32_t journal_blocks = 0;  // 0: 1/64 of the device, between 256 and 32768
  std::string label;
  uint32_t root_uid = 0, root_gid = 0;
  double reserved_percent = 0;  // of the data blocks, kept for root (FORMAT.md "Reserved blocks")
  uint32_t reserved_uid = 0, reserved_gid = 0;
  uint64_t seed = 0;  // 0: random checksum seed and uuid
  // The largest size, in blocks, resize.warpfs may grow the filesystem to (mke2fs -E
  // resize=): the descriptor table keeps room for its groups. 0: 1024 times the device, at
  // most 64 TiB.
  uint64_t resize_max_blocks = 0;
};

struct Geometry {
  uint64_t block_count = 0;
  uint32_t group_count = 0;
  uint32_t inodes_per_group = 0;
  uint32_t journal_blocks = 0;
  uint32_t gdt_blocks = 0;  // room to grow included
  uint64_t first_group_block = 0;
  uint64_t inode_count = 0;
  uint64_t metadata_blocks = 0;  // everything that is not data
};

// Computes the layout for `device_blocks` blocks. False with a message if too small.
bool plan_geometry(uint64_t device_blocks, const MkfsOptions& o, Geometry* g, std::string* error);

// The blocks kept for root: `percent` (clamped to 0..50) of `data_blocks` (a Geometry's
// block_count - metadata_blocks, a superblock's data_blocks()).
uint64_t reserved_blocks_for(uint64_t data_blocks, double percent);

// What a device holds before formatting, for the overwrite guard.
enum class Existing { kNothing, kWarpfs, kOtherFilesystem, kData };
Existing probe_existing(blockdev::BlockDevice& dev, std::string* what);

// Writes the filesystem. `progress(done, total)` is called as groups are written.
blockdev::Status format(blockdev::BlockDevice& dev, const MkfsOptions& o, const Geometry& g,
                        const std::function<void(uint64_t, uint64_t)>& progress);

// Group g's first block, bitmaps and inode table position.
uint64_t group_start(const Geometry& g, uint32_t group);
uint64_t group_blocks(const Geometry& g, uint32_t group);  // the last group may be shorter
uint32_t inode_table_blocks(const Geometry& g);

}  // namespace warpfs::fs
