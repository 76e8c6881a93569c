// A warpfs image for the gpu::Volume tests (tests/gpu/file_map_test.cc on the CPU,
// tests/gpu/gpu_volume_test.cu on the GPU): formatted, with files written through the
// filesystem core, and the checks afterwards (fsck, read-back through a fresh mount).
// Standard types only at this interface: nvcc includes it, the implementation is C++20.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace warpfs::gpu::test {

struct TestFile {
  std::string path;           // absolute, inside the filesystem
  std::vector<uint8_t> data;  // what reading it gives (holes and unwritten ranges as zeros)
  uint64_t hole_blocks = 0;   // file blocks with no written data (holes, unwritten extents)
};

// Creates `image` (`mib` MiB; an existing file is replaced), formats it and writes:
//   /data/dense.bin   seeded 32-bit words, 6 MiB + 1000 bytes (a partial last block)
//   /data/holes.bin   3 MiB with a hole at blocks [10, 20), an unwritten (fallocated) range at
//                     [40, 48) and a hole at the end (the size set past the last write)
//   /data/frag.bin    1 MiB written block by block, interleaved with /data/other.bin, from the
//                     last block to the first: one extent per block, an extent tree
//   /data/other.bin   the interleaved neighbour
//   /link             a symbolic link to /data/dense.bin; /empty, an empty file
// Returns "" or what failed. `files` gets the regular files with their contents.
std::string make_test_image(const std::string& image, uint64_t mib, uint64_t seed,
                            std::vector<TestFile>* files);

// fsck.warpfs -n -f over the image: "" when clean, else its problem lines.
std::string fsck_image(const std::string& image);

// Reads `path` through a fresh mount of the core: "" or the error.
std::string read_via_core(const std::string& image, const std::string& path,
                          std::vector<uint8_t>* out);

// The file's mtime through a fresh mount, in nanoseconds since the epoch: "" or the error.
std::string mtime_via_core(const std::string& image, const std::string& path, int64_t* ns);

// A clone of `from` (copy_file_range through the core: its blocks shared, fs/FORMAT.md
// "Shared blocks") as `dir`/`name`; *shared: the filesystem's shared blocks after it. "" or
// the error.
std::string clone_via_core(const std::string& image, const std::string& from,
                           const std::string& dir, const std::string& name, uint64_t* shared);

// The device block that holds file block `fb` of `path`, read from the image file directly
// (bypassing the filesystem): "" or the error.
std::string read_device_block(const std::string& image, uint64_t block, std::vector<uint8_t>* out);

}  // namespace warpfs::gpu::test
