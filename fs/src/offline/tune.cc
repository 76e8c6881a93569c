// tune.warpfs's work (tune.h): an unmounted, clean filesystem's adjustable superblock
// fields. Offline code: the default mount options' parser it shares with the daemon is in
// the core (fs/src/mount_options.cc).
#include "warpfs/fs/tune.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "warpfs/fs/mkfs.h"

namespace warpfs::fs {

std::string read_tunable_superblock(blockdev::BlockDevice& dev, Superblock* sb) {
  if (dev.block_bytes() != kBlockSize) return "the device's block size is not 4096";
  if (!dev.read(0, 1, sb).is_ok()) return "cannot read the superblock (I/O error)";
  if (std::string why = validate_superblock(*sb, dev.block_count()); !why.empty()) {
    return why == "no warpfs magic"
               ? "not a warpfs filesystem"
               : "the superblock is damaged (" + why + "): run fsck.warpfs -y first";
  }
  if (sb->state != kStateClean) {
    return "the filesystem was not cleanly unmounted: mount it once or run fsck.warpfs first "
           "(its journal would write an older superblock back)";
  }
  return "";
}

std::string tune(blockdev::BlockDevice& dev, const TuneRequest& r, Superblock* out) {
  Superblock sb;
  if (std::string why = read_tunable_superblock(dev, &sb); !why.empty()) return why;
  if (r.label) {
    if (r.label->size() > sizeof sb.label - 1) return "the label is longer than 63 bytes";
    std::memset(sb.label, 0, sizeof sb.label);
    std::memcpy(sb.label, r.label->data(), r.label->size());
  }
  if (r.reserved_percent) {
    if (!(*r.reserved_percent >= 0 && *r.reserved_percent <= 50))
      return "the reserved percentage must be 0 to 50";
    sb.reserved_blocks = reserved_blocks_for(data_blocks(sb), *r.reserved_percent);
  }
  if (r.reserved_blocks) {
    if (*r.reserved_blocks > sb.block_count / 2) {
      return "at most half of the " + std::to_string(sb.block_count) + " blocks may be reserved";
    }
    sb.reserved_blocks = *r.reserved_blocks;
  }
  if (r.reserved_uid) sb.reserved_uid = *r.reserved_uid;
  if (r.reserved_gid) sb.reserved_gid = *r.reserved_gid;
  if (r.commit_interval_s) {
    if (*r.commit_interval_s > 86400) return "the commit interval must be at most 86400 seconds";
    sb.commit_interval_s = *r.commit_interval_s;
  }
  if (r.mount_opts) {
    DefaultMountOptions unused;
    if (std::string why = parse_default_mount_options(*r.mount_opts, &unused); !why.empty()) {
      return "mount options: " + why;
    }
    std::memset(sb.mount_opts, 0, sizeof sb.mount_opts);
    std::memcpy(sb.mount_opts, r.mount_opts->data(), r.mount_opts->size());
  }
  if (r.enable_xattr_chain) sb.features |= kFeatureXattrChain;
  if (r.enable_shared_blocks) sb.features |= kFeatureSharedBlocks;
  sb.checksum = superblock_checksum(sb);
  if (std::string why = validate_superblock(sb, dev.block_count()); !why.empty()) return why;
  // The backup (the filesystem's last block) first: a cut between the two leaves the old
  // primary, which mount and fsck take, beside a backup that is valid either way.
  if (!dev.write(sb.block_count - 1, 1, &sb).is_ok() || !dev.flush().is_ok()) {
    return "cannot write the backup superblock (I/O error); nothing changed in the primary";
  }
  if (!dev.write(0, 1, &sb).is_ok() || !dev.flush().is_ok()) {
    return "cannot write the superblock (I/O error): run fsck.warpfs, which restores it from the "
           "backup";
  }
  if (out) *out = sb;
  return "";
}

}  // namespace warpfs::fs
