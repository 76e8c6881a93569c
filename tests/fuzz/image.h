// What fuzz_mount and fuzz_fsck share: warpfs images made by warpfs itself, a copy-on-write
// RAM block device over them, and the structure-aware patch format a fuzz input decodes to.
//
// Why patches over a real image rather than raw images: a raw image that libFuzzer mutates
// almost never gets past the superblock, and never past a checksum. Here the input names
// places in a populated filesystem (an inode, a directory leaf, a journal block, a group
// descriptor, ...) and bytes to put there; by default every patched block's checksum is
// then recomputed, so the corruption reaches the code that interprets the structure.
//
// Input layout (all integers little-endian; a truncated tail is ignored):
//   byte 0   flags: bits 0-1 base image (kBaseImages), bit 2 keep checksums as patched,
//            bits 3-7 for the target (see fuzz_mount.cc, fuzz_fsck.cc)
//   byte 1   device fault: 0 none; n: every device call from the (4n)-th on fails (EIO)
//   then patches, each: op u8, index u16, offset u16, len u8, then len % 32 + 1 bytes
//     op bits 0-2: region (Region below), bits 3-4: mode (Mode below), bit 5: raw (do not
//     fix this block's checksum)
//
// Thread-safety: base_image() may be called from any thread; a CowDevice is thread-safe
// (the filesystem's committer thread uses it too).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "warpfs/blockdev/block_device.h"
#include "warpfs/fs/format.h"

namespace warpfs::fuzz {

// A base image: the bytes of a whole device, and where its structures are.
struct BaseImage {
  std::string name;
  std::vector<uint8_t> bytes;
  fs::Superblock sb;
  std::vector<fs::GroupDesc> groups;
  std::vector<uint64_t> meta;     // metadata blocks in use: patch targets of region kMeta
  std::vector<uint64_t> headers;  // directory, extent-tree, xattr chain and value blocks,
                                  // reference-count table blocks
  std::vector<uint64_t> data;     // file data blocks that are not zero (symlink targets too)
  bool shares = false;            // has a block shared by two files (FORMAT.md "Shared blocks")
  uint64_t blocks() const { return bytes.size() / fs::kBlockSize; }
};

// 0 "clean": a populated filesystem (directories, a split directory, files with holes and
//   more than 8 extents, fallocated ranges, symlinks short and long, hard links, xattrs in
//   every namespace, a file with a chain of xattr blocks and values in value blocks, a fifo
//   and a device node), cleanly unmounted. 4 MiB.
// 1 "crashed": the same, snapshot while mounted after a commit: the last transaction is
//   still in the journal, the superblock is dirty and an unlinked-but-open file is on the
//   orphan list.
// 2 "groups": two block groups (about 129 MiB, but a run only copies what it writes),
//   cleanly unmounted.
// 3 "shared": image 0 with two more files of one block each that share a block (edited by
//   hand as a clone would leave them: group 0's reference-count table counts 2), cleanly
//   unmounted.
inline constexpr unsigned kBaseImages = 4;
const BaseImage& base_image(unsigned i);

// A block device over a base image: reads see the base until a block is written, writes
// go to a private overlay. Every call from the `fail_from`-th on fails with an I/O error.
class CowDevice final : public blockdev::BlockDevice {
 public:
  explicit CowDevice(const BaseImage& base, uint64_t fail_from = 0);
  uint32_t block_bytes() const override { return fs::kBlockSize; }
  uint64_t block_count() const override { return blocks_; }
  blockdev::Status read(uint64_t block, uint32_t count, void* buf) override;
  blockdev::Status write(uint64_t block, uint32_t count, const void* buf) override;
  blockdev::Status flush() override;
  blockdev::Status trim(uint64_t block, uint64_t count) override;

  // For patching (not counted as writes, never failing).
  uint8_t* mutable_block(uint64_t block);
  const uint8_t* block(uint64_t block) const;
  uint64_t writes() const { return writes_.load(); }  // blocks written through write/trim
  void set_fail_from(uint64_t n) { fail_from_ = n; }
  uint64_t calls() const { return calls_.load(); }
  // The whole device as it reads now.
  std::vector<uint8_t> snapshot() const;

 private:
  bool failing();
  const BaseImage& base_;
  const uint64_t blocks_;
  mutable std::mutex mu_;  // overlay_
  std::vector<std::unique_ptr<uint8_t[]>> overlay_;
  std::atomic<uint64_t> writes_{0}, calls_{0};
  uint64_t fail_from_;
};

enum Region : uint8_t {
  kMeta = 0,     // base.meta[index]
  kInode = 1,    // inode 1 + index % inode_count, offset % 256
  kSuper = 2,    // primary superblock, offset % 224 (the fields before `reserved`)
  kHeaders = 3,  // base.headers[index]
  kJournal = 4,  // journal block 1 + index % journal_blocks
  kGroup = 5,    // group descriptor index % group_count, offset % 64
  kAny = 6,      // block index % block count
  kData = 7,     // base.data[index]
};
enum Mode : uint8_t {
  kOverwrite = 0,
  kXor = 1,
  kAdd = 2,    // add the bytes (1, 2, 4 or 8 of them: a signed delta) to the integer there
  kMagic = 3,  // write an interesting value (bytes[0] picks it) in 1, 2, 4 or 8 bytes
};

struct Input {
  unsigned base = 0;
  bool keep_checksums = false;
  uint8_t target_flags = 0;  // bits 3-7 of byte 0, shifted down
  uint8_t fault = 0;
  size_t patches = 0;
};

// The first two bytes of an input.
Input decode_header(const uint8_t* data, size_t size);
// A device over the base image `data` names, with its patches applied and, unless the input
// says not to, the checksums of every patched block and of what depends on it recomputed
// (group descriptors of patched bitmaps; the journal's transactions, resealed). The device
// fails from the call the input names on. `in` receives the decoded header.
std::unique_ptr<CowDevice> make_device(const uint8_t* data, size_t size, Input* in);

}  // namespace warpfs::fuzz
