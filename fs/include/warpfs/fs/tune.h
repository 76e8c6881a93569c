// tune.warpfs: changes the adjustable fields of an unmounted, clean filesystem's superblock
// (FORMAT.md "Superblock"): its label, the blocks kept for root and who may use them, the
// default journal commit interval and default mount options, and the xattr_chain and
// shared_blocks features, as
// tune2fs does for ext4. Nothing else is touched.
//
// Libraries: tune() and read_tunable_superblock() are offline code (warpfs_fs_offline, linked
// by tune.warpfs and the tests); the default mount options' parser and accessor are the
// core's (warpfs_fs), since the daemon applies them at mount.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "warpfs/blockdev/block_device.h"
#include "warpfs/fs/format.h"

namespace warpfs::fs {

struct TuneRequest {
  std::optional<std::string> label;         // up to 63 bytes
  std::optional<double> reserved_percent;   // of the data blocks, 0 to 50
  std::optional<uint64_t> reserved_blocks;  // or a count, at most half of the blocks
  std::optional<uint32_t> reserved_uid, reserved_gid;
  std::optional<uint32_t> commit_interval_s;  // 0: 5 s; at most 86400
  std::optional<std::string> mount_opts;      // default mount options; "" clears them
  // -O xattr_chain: extended attributes beyond one block (kFeatureXattrChain). Enabling it
  // needs nothing else: an image's one-block attributes are a chain of one. Not reversible
  // here (blocks already chained would be lost to older code).
  bool enable_xattr_chain = false;
  // -O shared_blocks: data blocks shared by several files (kFeatureSharedBlocks). Enabling it
  // needs nothing else: every descriptor's refcount_table is 0 without the feature, and a
  // group without a table shares nothing. Not reversible here (shared blocks would be freed
  // by older code while another file still maps them).
  bool enable_shared_blocks = false;
};

// The default mount options a superblock may keep (FORMAT.md "Default mount options"), as
// ext4's s_mount_opts: options of the filesystem only, applied by the daemon where its
// command line names none of the same kind. Options of the device stack (cache_mb=, queues=,
// ...) belong to the machine, not to the filesystem, and are refused here.
struct DefaultMountOptions {
  std::optional<bool> read_only;          // ro / rw
  std::optional<bool> discard;            // discard / nodiscard
  std::optional<uint32_t> meta_cache_mb;  // meta_cache_mb=N, 0..65536
};
// Parses a comma-separated list: "" or what is wrong with it (nothing set then). At most 63
// bytes.
std::string parse_default_mount_options(const std::string& s, DefaultMountOptions* out);
// The superblock's list ("" if none, or if the field is not NUL-terminated).
std::string default_mount_options(const Superblock& sb);

// Reads and checks the primary superblock of `dev`: "" or why it cannot be tuned (damaged:
// run fsck.warpfs; not cleanly unmounted: mount it or run fsck.warpfs first, since a journal
// replay would write an older superblock back).
std::string read_tunable_superblock(blockdev::BlockDevice& dev, Superblock* sb);

// Applies `r` to `dev`: the backup superblock first, then the primary, each flushed, so a cut
// leaves either the old or the new fields in the primary and a valid backup. "" or why not
// (nothing written then). `out`, if given, receives the new superblock.
std::string tune(blockdev::BlockDevice& dev, const TuneRequest& r, Superblock* out = nullptr);

}  // namespace warpfs::fs
