// FileMap: a warpfs file's block map as GPU threads index it (the host side of
// gpu::Volume, volume.cuh). The filesystem core resolves the path and reports the file's
// extents (fs/FORMAT.md "Extents"); the map turns them into one device block per file block,
// so a GPU thread finds the block of element i with one load and no tree walk, as BaM's
// bam::array finds a page by arithmetic (BaM §7.1). Holes and unwritten (preallocated)
// extents map to kHoleBlock: they read as zeros and are never written through the map.
//
// Host C++ only (no CUDA): the CPU build tests it under the sanitizers.
//
// Thread-safety: build_file_map and resolve_path call the filesystem core, which any number
// of threads may call; a FileMap is a value owned by its caller.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "warpfs/fs/filesystem.h"

namespace warpfs::gpu {

inline constexpr uint64_t kHoleBlock = ~0ull;

struct FileMap {
  fs::Ino ino = 0;
  uint64_t size = 0;             // bytes
  uint32_t block_bytes = 0;      // the filesystem's block (fs::kBlockSize)
  std::vector<uint64_t> blocks;  // file block -> device block, or kHoleBlock
  uint64_t holes = 0;            // entries of `blocks` that are kHoleBlock
};

// Resolves an absolute path ("/a/b", "/" alone is the root) inside the filesystem without
// following symbolic links: a symlink as a component or as the last name is ELOOP (the GPU
// reads what the path names, never where a link points). Returns 0 or an errno value, with
// `error` naming the component.
int resolve_path(fs::Filesystem& f, std::string_view path, fs::Attr* out, std::string* error);

// The map of regular file `ino`: blocks.size() = ceil(size / block_bytes). Returns 0, or an
// errno value with `error` saying why (EISDIR/EINVAL for a file that is not regular, EIO for
// an extent that lies outside the device: a damaged file fsck would report).
int build_file_map(fs::Filesystem& f, fs::Ino ino, uint64_t device_blocks, FileMap* out,
                   std::string* error);

// Gives every block of `m`'s file that other extents share (fs/FORMAT.md "Shared blocks")
// a copy of its own, by writing its bytes again through the core (copy-on-write), so that
// writes into the mapped device blocks reach this file alone. *copied: the blocks copied
// (the map is stale if any). Returns 0 or an errno value with `error` saying why.
int unshare_blocks(fs::Filesystem& f, const FileMap& m, uint64_t* copied, std::string* error);

}  // namespace warpfs::gpu
