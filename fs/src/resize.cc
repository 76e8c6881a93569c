// Growing a filesystem to a larger device (resize.warpfs; FORMAT.md "Growing").
//
// Offline: the filesystem is mounted by the resizer alone, so the group table in memory may
// be rebuilt without locks. The new groups' bitmaps and inode tables are written past the old
// end first (nothing reads there yet), then the backup superblock at the new end; one journal
// transaction then switches the filesystem over: the new descriptors, the old last group's
// bitmap (it grows up to a whole group; its past-the-end bits and the old backup superblock's
// block become free) and the primary superblock. A power cut before that commit leaves the old
// filesystem as it was; after it, replay finishes the new one.
#include "warpfs/fs/resize.h"

#include <algorithm>
#include <cstring>

#include "internal.h"

namespace warpfs::fs {

// The geometry of the filesystem grown to at most `blocks`: a last group too short for its
// metadata and some data is left out, as mkfs does. False with the reason if it cannot grow.
bool FsImpl::plan_growth(uint64_t blocks, Superblock* out, std::string* error) const {
  const uint64_t itb = L_.itb;
  if (blocks <= sb_.block_count) {
    *error = "the filesystem already has " + std::to_string(sb_.block_count) + " blocks";
    return false;
  }
  uint64_t span = blocks - 1 - L_.first_group;
  uint64_t groups = div_up(span, kBlocksPerGroup);
  const uint64_t last = span - (groups - 1) * kBlocksPerGroup;
  if (groups > L_.groups && last < 2 + itb + 16) {
    --groups;  // too short for a group of its own
    span -= last;
  }
  if (groups > L_.max_groups()) {
    *error = "the descriptor table has room for " + std::to_string(L_.max_groups()) + " groups (" +
             std::to_string(L_.max_groups() * kBlocksPerGroup * kBlockSize >> 30) +
             " GiB), this size needs " + std::to_string(groups) +
             " (mkfs.warpfs -E resize= keeps more room)";
    return false;
  }
  const uint64_t count = L_.first_group + span + 1;
  if (count <= sb_.block_count) {
    *error = "the " + std::to_string(blocks - sb_.block_count) +
             " new blocks are too few for a group's bitmaps and inode table";
    return false;
  }
  if (groups * sb_.inodes_per_group > uint32_t{0xffffffff}) {
    *error = "more than 2^32 inodes";
    return false;
  }
  *out = *reinterpret_cast<const Superblock*>(sb_buf_->data);
  out->block_count = count;
  out->group_count = static_cast<uint32_t>(groups);
  out->inode_count = groups * sb_.inodes_per_group;
  // gdt_blocks stays: 0 in an image made before it, whose table keeps exactly the blocks its
  // groups use, so that ceil(groups / 64) does not change (max_groups() saw to it).
  out->gdt_blocks = sb_.gdt_blocks;
  return true;
}

int FsImpl::grow(uint64_t blocks, std::string* error) {
  if (ro_) {
    *error = "mounted read-only";
    return EROFS;
  }
  if (blocks > dev_.block_count()) {
    *error = "the device has only " + std::to_string(dev_.block_count()) + " blocks";
    return EINVAL;
  }
  Superblock nsb;
  if (!plan_growth(blocks, &nsb, error)) return EINVAL;
  const Layout to(nsb);
  const uint32_t old_groups = L_.groups, last = old_groups - 1;
  const uint64_t meta = 2 + uint64_t{L_.itb};

  // 1. The new groups' bitmaps and inode tables, past the old end.
  std::vector<GroupDesc> added(to.groups - old_groups);
  uint64_t added_blocks = 0;
  for (uint32_t g = old_groups; g < to.groups; ++g) {
    GroupDesc& gd = added[g - old_groups];
    const uint64_t start = to.group_start(g), size = to.group_size(g);
    std::vector<uint8_t> bb(kBlockSize, 0), ib(kBlockSize, 0);
    set_bits(bb.data(), 0, meta);
    set_bits(bb.data(), size, kBlocksPerGroup);
    set_bits(ib.data(), sb_.inodes_per_group, uint64_t{kBlockSize} * 8);
    gd.block_bitmap = start;
    gd.inode_bitmap = start + 1;
    gd.inode_table = start + 2;
    gd.free_blocks = static_cast<uint32_t>(size - meta);
    gd.free_inodes = sb_.inodes_per_group;
    gd.block_bitmap_checksum = checksum(bb.data(), kBlockSize, sb_.checksum_seed);
    gd.inode_bitmap_checksum = checksum(ib.data(), kBlockSize, sb_.checksum_seed);
    gd.checksum = group_checksum(gd, sb_.checksum_seed);
    added_blocks += gd.free_blocks;
    // Inode tables are deallocated, as mkfs leaves them: they read back as zeroes.
    if (!dev_.write(start, 1, bb.data()).is_ok() || !dev_.write(start + 1, 1, ib.data()).is_ok() ||
        !dev_.trim(start + 2, L_.itb).is_ok()) {
      *error =
          "cannot write group " + std::to_string(g) + "'s bitmaps (I/O error); nothing changed";
      return EIO;
    }
  }
  // The old last group grows to a whole group or to the new end.
  const uint64_t last_old = L_.group_size(last), last_new = to.group_size(last);
  added_blocks += last_new - last_old;

  // 2. The backup superblock at the new end (what the primary will say, counts included).
  nsb.free_blocks += added_blocks;
  nsb.free_inodes += uint64_t{to.groups - old_groups} * sb_.inodes_per_group;
  nsb.checksum = superblock_checksum(nsb);
  if (!dev_.write(nsb.block_count - 1, 1, &nsb).is_ok() || !dev_.flush().is_ok()) {
    *error = "cannot write the new backup superblock (I/O error); nothing changed";
    return EIO;
  }

  // 3. One transaction switches over (no other operation runs: the resizer's own mount).
  {
    Journal::Txn t(*journal_);
    std::vector<MetaBuf*> gdt = gdt_;
    for (uint64_t i = gdt.size(); i < to.gdt_used(); ++i) {
      MetaBuf* b = journal_->create(sb_.gdt_start + i, MetaKind::kGdt);
      std::memset(b->data, 0, kBlockSize);
      gdt.push_back(b);
    }
    for (uint32_t g = old_groups; g < to.groups; ++g) {
      *desc(gdt, g) = added[g - old_groups];
      journal_->dirty(gdt[g / kGroupDescsPerBlock]);
    }
    // The in-memory geometry first: finish_commit checksums the descriptors of every group
    // and sums the free counts over the group table.
    auto groups = std::make_unique<Group[]>(to.groups);
    for (uint32_t g = 0; g < old_groups; ++g) {
      Group& a = groups[g];
      Group& b = groups_[g];
      a.block_bitmap = b.block_bitmap;
      a.inode_bitmap = b.inode_bitmap;
      a.held = std::move(b.held);
      a.freed = std::move(b.freed);
      a.free_blocks = b.free_blocks.load();
      a.free_inodes = b.free_inodes.load();
      a.next_inode_hint = b.next_inode_hint;
      a.next_block_hint = b.next_block_hint;
      std::copy(std::begin(b.refs), std::end(b.refs), std::begin(a.refs));
      a.has_refs = b.has_refs.load();
      a.unsharing = std::move(b.unsharing);
      a.unshared = std::move(b.unshared);
    }
    Group& lg = groups[last];
    clear_bits(lg.block_bitmap->data, last_old, last_new);
    lg.free_blocks += static_cast<uint32_t>(last_new - last_old);
    desc(gdt, last)->free_blocks += static_cast<uint32_t>(last_new - last_old);
    journal_->dirty(lg.block_bitmap);
    journal_->dirty(gdt[last / kGroupDescsPerBlock]);
    sb_.block_count = nsb.block_count;
    sb_.group_count = nsb.group_count;
    sb_.inode_count = nsb.inode_count;
    sb_.gdt_blocks = nsb.gdt_blocks;
    L_.init(sb_);
    journal_->set_geometry(sb_);
    gdt_ = std::move(gdt);
    for (uint32_t g = old_groups; g < to.groups; ++g) {
      Group& gr = groups[g];
      const GroupDesc& gd = added[g - old_groups];
      if (journal_->get(gd.block_bitmap, MetaKind::kBlockBitmap, g, &gr.block_bitmap) != 0 ||
          journal_->get(gd.inode_bitmap, MetaKind::kInodeBitmap, g, &gr.inode_bitmap) != 0) {
        // The transaction cannot be taken back: the mount stops writing (fsck after).
        *error = "cannot read back group " + std::to_string(g) + "'s bitmaps";
        ro_ = true;
        return EIO;
      }
      gr.free_blocks = gd.free_blocks;
      gr.free_inodes = gd.free_inodes;
      gr.held.assign(kBlocksPerGroup / 64, 0);
      data_blocks_total_ += to.group_size(g) - meta;
    }
    data_blocks_total_ += last_new - last_old;
    groups_ = std::move(groups);
    auto* s = reinterpret_cast<Superblock*>(sb_buf_->data);
    s->block_count = nsb.block_count;
    s->group_count = nsb.group_count;
    s->inode_count = nsb.inode_count;
    s->gdt_blocks = nsb.gdt_blocks;
    journal_->dirty(sb_buf_);
  }
  if (int rc = journal_->commit(); rc) {
    *error = "the switching transaction failed to commit (I/O error); run fsck.warpfs";
    return rc;
  }
  return 0;
}

std::string grow(blockdev::BlockDevice& dev, uint64_t blocks, const ResizeOptions& o,
                 ResizeResult* out) {
  if (blocks == 0) blocks = dev.block_count();
  Superblock sb;
  if (dev.block_bytes() != kBlockSize) return "the device's block size is not 4096";
  if (!dev.read(0, 1, &sb).is_ok()) return "cannot read the superblock (I/O error)";
  if (std::string why = validate_superblock(sb, dev.block_count()); !why.empty()) {
    return why == "no warpfs magic"
               ? "not a warpfs filesystem"
               : "the superblock is damaged (" + why + "): run fsck.warpfs -y first";
  }
  if (sb.state != kStateClean) {
    return "the filesystem was not cleanly unmounted: run fsck.warpfs first";
  }
  ResizeResult r;
  r.old_blocks = sb.block_count;
  r.old_groups = sb.group_count;
  MountOptions mo;
  mo.discard = false;
  mo.log = o.log;
  std::string err;
  std::unique_ptr<Filesystem> fs = Filesystem::mount(dev, mo, &err);
  if (!fs) return "cannot mount it: " + err;
  auto* impl = static_cast<FsImpl*>(fs.get());
  const int rc = impl->grow(blocks, &err);
  const int urc = fs->unmount();
  if (rc != 0) return err;
  if (urc != 0) return "the unmount after growing failed: run fsck.warpfs";
  if (!dev.read(0, 1, &sb).is_ok()) return "cannot read the superblock back (I/O error)";
  r.new_blocks = sb.block_count;
  r.new_groups = sb.group_count;
  if (out) *out = r;
  return "";
}

}  // namespace warpfs::fs
