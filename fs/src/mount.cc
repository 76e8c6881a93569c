// Mount and unmount: superblock validation (with the backup as fallback), journal replay,
// orphan recovery, the periodic committer, and the clean unmount.
#include <cerrno>
#include <cstring>
#include <iostream>

#include "internal.h"
#include "warpfs/blockdev/raid.h"
#include "warpfs/fs/layout.h"
#include "warpfs/fs/replay.h"

namespace warpfs::fs {

// "" or why `sb` cannot describe a filesystem on a device of `dev_blocks` blocks.
std::string validate_superblock(const Superblock& sb, uint64_t dev_blocks) {
  if (sb.magic != kMagic) return "no warpfs magic";
  if (sb.checksum != superblock_checksum(sb)) return "superblock checksum mismatch";
  if (sb.version != kVersion) return "unsupported version " + std::to_string(sb.version);
  if (!features_supported(sb.features))
    return "unsupported feature flags " + std::to_string(sb.features);
  if (sb.block_size != kBlockSize || sb.blocks_per_group != kBlocksPerGroup)
    return "unsupported block geometry";
  if (sb.block_count > dev_blocks) {
    return "the filesystem has " + std::to_string(sb.block_count) + " blocks but the device only " +
           std::to_string(dev_blocks);
  }
  if ((sb.gdt_blocks != 0) != ((sb.features & kFeatureGdtRoom) != 0) ||
      (sb.gdt_blocks != 0 && (sb.gdt_blocks < div_up(sb.group_count, kGroupDescsPerBlock) ||
                              sb.gdt_blocks > kMaxGdtBlocks))) {
    return "inconsistent descriptor table size";
  }
  const uint64_t gdt_blocks = gdt_blocks_of(sb);
  if (sb.group_count == 0 || sb.inodes_per_group == 0 || sb.inodes_per_group % kInodesPerBlock ||
      sb.inodes_per_group > kBlockSize * 8 || sb.journal_blocks < 8 ||
      sb.gdt_start != 1 + uint64_t{sb.journal_blocks} ||
      sb.gdt_start + gdt_blocks + uint64_t{sb.group_count - 1} * kBlocksPerGroup >=
          sb.block_count ||
      sb.inode_count != uint64_t{sb.group_count} * sb.inodes_per_group ||
      sb.root_inode != kRootInode) {
    return "inconsistent geometry";
  }
  if (sb.reserved_blocks > sb.block_count / 2) return "more than half of the blocks reserved";
  // FORMAT.md "Layout": the groups end at the backup superblock, and the last one holds at
  // least its bitmaps and inode table (as fsck.warpfs requires).
  const uint64_t span = sb.block_count - 1 - (sb.gdt_start + gdt_blocks);
  const uint64_t last = span - uint64_t{sb.group_count - 1} * kBlocksPerGroup;
  if ((span + kBlocksPerGroup - 1) / kBlocksPerGroup != sb.group_count) {
    return std::to_string(sb.group_count) + " groups do not match " +
           std::to_string(sb.block_count) + " blocks";
  }
  if (last <= 2 + sb.inodes_per_group / kInodesPerBlock)
    return "the last group is too short for its metadata";
  return "";
}

uint64_t data_blocks(const Superblock& sb) {
  // FORMAT.md "Layout": the groups run from after the descriptor table to the backup; each
  // starts with its two bitmaps and its inode table.
  const uint64_t first = sb.gdt_start + gdt_blocks_of(sb);
  const uint64_t meta = uint64_t{sb.group_count} * (2 + sb.inodes_per_group / kInodesPerBlock);
  const uint64_t span = sb.block_count - 1 - first;
  return span > meta ? span - meta : 0;
}

namespace {

bool read_sb(blockdev::BlockDevice& dev, uint64_t block, Superblock* sb) {
  return dev.read(block, 1, sb).is_ok();
}

}  // namespace

std::unique_ptr<Filesystem> Filesystem::mount(blockdev::BlockDevice& dev, const MountOptions& o,
                                              std::string* error) {
  if (dev.block_bytes() != kBlockSize) {
    *error =
        "the device's block size is " + std::to_string(dev.block_bytes()) + ", warpfs needs 4096";
    return nullptr;
  }
  auto log = o.log ? o.log : [](const std::string& s) { std::cerr << "warpfs: " << s << "\n"; };
  const uint64_t dev_blocks = dev.block_count();
  auto sb = std::make_unique<Superblock>();
  if (!read_sb(dev, 0, sb.get())) {
    *error = "cannot read the superblock (I/O error)";
    return nullptr;
  }
  std::string why = validate_superblock(*sb, dev_blocks);
  if (!why.empty()) {
    // The backup sits in the last block of the filesystem: at the device's end, or up to a
    // group earlier when mkfs left a partial group out.
    auto backup = std::make_unique<Superblock>();
    bool found = false;
    std::vector<uint8_t> chunk(256 * size_t{kBlockSize});
    for (uint64_t end = dev_blocks;
         end > 1 && dev_blocks - end <= kBlocksPerGroup + 256 && !found;) {
      const uint64_t n = std::min<uint64_t>(256, end - 1);
      if (!dev.read(end - n, static_cast<uint32_t>(n), chunk.data()).is_ok()) break;
      for (uint64_t i = n; i-- > 0;) {
        std::memcpy(backup.get(), chunk.data() + i * kBlockSize, kBlockSize);
        if (backup->magic == kMagic && validate_superblock(*backup, dev_blocks).empty() &&
            backup->block_count == end - n + i + 1) {
          found = true;
          break;
        }
      }
      end -= n;
    }
    if (!found) {
      const std::string member = blockdev::raid_member_hint(sb.get());
      *error = !member.empty() ? "not a warpfs filesystem: " + member
               : why == "no warpfs magic"
                   ? "not a warpfs filesystem (no warpfs superblock)"
                   : "the superblock is damaged (" + why + ") and no valid backup was found";
      return nullptr;
    }
    log("primary superblock damaged (" + why + "): using the backup at block " +
        std::to_string(backup->block_count - 1) + "; run fsck.warpfs");
    sb = std::move(backup);
  }
  if (sb->state == kStateDirty)
    log("the filesystem was not cleanly unmounted: replaying the journal");
  ReplayResult rr;
  if (blockdev::Status st = replay_journal(dev, *sb, false, &rr); !st.is_ok()) {
    *error = "journal replay failed: " + st.to_string() +
             (rr.stopped.empty() ? "" : " (" + rr.stopped + ")");
    return nullptr;
  }
  if (rr.transactions > 0) {
    log("replayed " + std::to_string(rr.transactions) + " journal transaction(s), " +
        std::to_string(rr.blocks) + " blocks");
    // Block 0 may have been among them.
    Superblock again;
    if (read_sb(dev, 0, &again) && validate_superblock(again, dev_blocks).empty()) *sb = again;
  }
  MountOptions mo = o;
  mo.log = log;
  if (mo.commit_interval_ms ==
      0) {  // the filesystem's own default (tune.warpfs --commit), else 5 s
    mo.commit_interval_ms =
        sb->commit_interval_s != 0 ? std::min(sb->commit_interval_s, 86400u) * 1000 : 5000;
  }
  auto fs = std::make_unique<FsImpl>(dev, *sb, mo);
  if (fs->start(rr.next_pos, rr.next_seq, rr.transactions, error) != 0) {
    // A mount that failed writes nothing: its destructor must not commit or mark the
    // superblock clean (fsck would then skip a filesystem that does not mount).
    fs->abandon();
    return nullptr;
  }
  return fs;
}

FsImpl::FsImpl(blockdev::BlockDevice& dev, const Superblock& sb, const MountOptions& o)
    : dev_(dev), sb_(sb), L_(sb), opts_(o), log_(o.log), ro_(o.read_only) {}

int FsImpl::start(uint64_t jpos, uint64_t jseq, uint64_t replayed, std::string* error) {
  replayed_ = replayed;
  journal_ = std::make_unique<Journal>(dev_, sb_, jpos, jseq, log_);
  journal_->commit_each_transaction = opts_.commit_every_transaction;
  journal_->precommit = [this] { take_freed(); };
  journal_->finish = [this](std::vector<MetaBuf*>& d) { finish_commit(d); };
  journal_->committed = [this] { release_freed(); };
  meta_cap_ = size_t{opts_.meta_cache_mb} * (1 << 20) / kBlockSize;
  journal_->cap = meta_cap_;
  journal_->pressure = [this] {
    {
      std::lock_guard<std::mutex> lk(committer_mu_);
      if (evict_wanted_) return;
      evict_wanted_ = true;
    }
    committer_cv_.notify_all();
  };
  journal_->wants_commit = [this] {
    {
      std::lock_guard<std::mutex> lk(committer_mu_);
      if (commit_wanted_) return;
      commit_wanted_ = true;
    }
    committer_cv_.notify_all();
  };
  sb_buf_ = journal_->create(0, MetaKind::kSuper);
  std::memcpy(sb_buf_->data, &sb_, sizeof sb_);
  if (int rc = load_groups(); rc) {
    *error = "cannot load the block groups (see the log above; run fsck.warpfs)";
    return rc;
  }
  NodeRef root;
  if (int rc = get_node(kRootInode, &root); rc || !S_ISDIR(root->disk.mode)) {
    *error = "the root directory (inode 1) is unreadable or not a directory; run fsck.warpfs";
    return rc ? rc : EIO;
  }
  if (!ro_) {
    auto* s = reinterpret_cast<Superblock*>(sb_buf_->data);
    // Dirty on the media before the first transaction: a power cut after a commit must never
    // find a clean superblock beside it (fsck calls that damage).
    s->state = kStateDirty;
    if (int rc = write_dirty_superblock(error); rc) return rc;
    // Inodes unlinked while open when the last mount ended: free them now.
    std::lock_guard<Mutex> ns(namespace_mu_);
    for (uint64_t steps = 0; s->orphan_head != 0 && steps < sb_.inode_count; ++steps) {
      NodeRef n;
      const Ino ino = s->orphan_head;
      if (int rc = get_node(ino, &n); rc) {
        log("orphan list: inode " + std::to_string(ino) +
            " unreadable; the list is dropped (run fsck.warpfs)");
        Journal::Txn t(*journal_);
        s->orphan_head = 0;
        journal_->dirty(sb_buf_);
        break;
      }
      if (n->disk.links != 0) {
        // Linked again: just take it off the list.
        NodeLocks locks(namespace_mu_, {n.get()});
        Journal::Txn t(*journal_);
        if (int rc = orphan_remove(*n, nullptr); rc) break;  // it is the head
        continue;
      }
      if (int rc = reclaim(n); rc) {
        *error = "cannot free orphan inode " + std::to_string(ino);
        return rc;
      }
      ++orphans_freed_;
    }
    {
      Journal::Txn t(*journal_);
      s->state = kStateDirty;
      s->mount_time = now_ns();
      s->mount_count += 1;
      journal_->dirty(sb_buf_);
    }
    if (int rc = journal_->commit(); rc) {
      *error = "cannot write to the device (journal commit failed)";
      return rc;
    }
  }
  // Read-only mounts too: the committer also keeps the metadata cache under its cap.
  committer_ = std::thread([this] { commit_loop(); });
  return 0;
}

void FsImpl::commit_loop() {
  std::unique_lock<std::mutex> lk(committer_mu_);
  while (!stopping_) {
    committer_cv_.wait_for(lk, std::chrono::milliseconds(opts_.commit_interval_ms),
                           [&] { return stopping_ || evict_wanted_ || commit_wanted_; });
    if (stopping_) break;
    const bool pressed = evict_wanted_, asked = commit_wanted_;
    evict_wanted_ = commit_wanted_ = false;
    lk.unlock();
    // Woken by the cache's pressure: clean blocks first; a commit (which makes dirty ones
    // clean, and evictable once written home) only if that was not enough. On the timer: a
    // commit, then the blocks of forgotten inodes. Asked by the journal (its running
    // transaction fills up): a commit.
    if (pressed) evict_metadata();
    if (asked || !pressed || journal_->cached_buffers() > meta_cap_) {
      // The timer's or the journal's commit: a failure is sticky (Journal::failed), so the next
      // fsync, sync or unmount reports it to someone who can act on it.
      if (!ro_) {
        (void)store_times(false);  // a failure is the journal's, sticky as the commit's
        (void)journal_->commit();
        // Asks made before this commit took the transaction are answered; one that still
        // holds comes again from the next operation that enters.
        std::lock_guard<std::mutex> g(committer_mu_);
        commit_wanted_ = false;
      }
      // Eviction is the timer's and the pressure's: after every asked commit, it would drop
      // blocks that the operations filling the journal are about to use again.
      if (!asked || pressed) evict_metadata();
    }
    if (!asked && !pressed) trim_heap();  // the timer's pass (see trim_heap)
    lk.lock();
  }
}

FsImpl::~FsImpl() {
  // A destructor cannot report: a caller who needs the result called unmount() itself (a
  // second call returns at once).
  (void)unmount();
}

void FsImpl::abandon() {
  {
    std::lock_guard<std::mutex> lk(committer_mu_);
    stopping_ = true;
  }
  committer_cv_.notify_all();
  if (committer_.joinable()) committer_.join();
  unmounted_ = true;
}

int FsImpl::unmount() {
  if (unmounted_) return 0;
  unmounted_ = true;
  {
    std::lock_guard<std::mutex> lk(committer_mu_);
    stopping_ = true;
  }
  committer_cv_.notify_all();
  if (committer_.joinable()) committer_.join();
  if (ro_ || !journal_) return 0;
  if (journal_->failed()) {
    log("unmount: the journal failed earlier; the superblock stays dirty (run fsck.warpfs)");
    return EIO;
  }
  if (int rc = store_times(true); rc) return rc;
  if (int rc = journal_->close(); rc) return rc;
  return write_clean_superblock();
}

int FsImpl::write_clean_superblock() {
  // The superblock, clean, last: primary then backup.
  Superblock s;
  std::memcpy(&s, sb_buf_->data, sizeof s);
  free_counts(&s.free_blocks, &s.free_inodes);
  s.state = kStateClean;
  s.write_time = now_ns();
  s.checksum = superblock_checksum(s);
  if (int rc = journal_->write_direct(0, &s); rc) return rc;
  if (int rc = journal_->write_direct(sb_.block_count - 1, &s); rc) return rc;
  return dev_.flush().is_ok() ? 0 : EIO;
}

int FsImpl::set_read_only(bool read_only) {
  WARPFS_DCHECK(!unmounted_, "set_read_only after unmount()");
  std::lock_guard<std::mutex> g(remount_mu_);
  if (read_only == ro_.load()) return 0;  // (never after unmount(): the daemon stops calling first)
  if (read_only) {
    ro_ = true;  // changes from now on: EROFS
    if (journal_->failed()) return EIO;
    if (int rc = store_times(true); rc) return rc;  // (overwrites in flight finish first)
    if (int rc = journal_->close(); rc) return rc;
    return write_clean_superblock();
  }
  if (journal_->failed()) return EIO;
  {
    // Dirty on the media first, as at mount (start()).
    auto* s = reinterpret_cast<Superblock*>(sb_buf_->data);
    Journal::Txn t(*journal_);
    s->state = kStateDirty;
    std::string what;
    if (int rc = write_dirty_superblock(&what); rc) return rc;
    journal_->dirty(sb_buf_);
  }
  if (int rc = journal_->commit(); rc) return rc;
  ro_ = false;
  return 0;
}

int FsImpl::write_dirty_superblock(std::string* what) {
  // The dirty state must be on the media before any transaction is committed: a commit only
  // checkpoints the superblock home, which becomes durable at a later flush, and a crash
  // before that would leave a "clean" superblock beside a committed transaction.
  Superblock d;
  std::memcpy(&d, sb_buf_->data, sizeof d);
  d.checksum = superblock_checksum(d);
  if (int rc = journal_->write_direct(0, &d); rc) {
    *what = "cannot write the superblock";
    return rc;
  }
  if (!dev_.flush().is_ok()) {
    *what = "cannot flush the device";
    return EIO;
  }
  return 0;
}

int FsImpl::lookup_ino(Ino ino, Attr* out) {
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  ref(*n, 1, 0);
  {
    std::lock_guard<std::mutex> g(n->attr_mu);
    fill_attr(n->pub, ino, out);
  }
  exact_times_unlocked(*n, out);
  return 0;
}

int FsImpl::statfs(struct statvfs* out) {
  std::memset(out, 0, sizeof *out);
  uint64_t fb, fi;
  free_counts(&fb, &fi);
  out->f_bsize = kBlockSize;
  out->f_frsize = kBlockSize;
  out->f_blocks = data_blocks_total_;
  // Held blocks (freed, commit pending) count as free; neither the metadata reserve nor
  // the blocks kept for root are available to file data, as ext4's reserved blocks are not
  // (for every caller: f_bavail is what an ordinary user may still write).
  out->f_bfree = fb;
  const uint64_t avail = available_blocks();
  const uint64_t kept = meta_reserve_ + root_reserve_;
  out->f_bavail = avail > kept ? avail - kept : 0;
  out->f_files = sb_.inode_count;
  out->f_ffree = fi;
  out->f_favail = fi;
  out->f_namemax = kMaxName;
  std::memcpy(&out->f_fsid, sb_.uuid, sizeof out->f_fsid);
  return 0;
}

int FsImpl::sync() {
  if (ro_) return 0;
  if (int rc = store_times(true); rc) return rc;
  if (int rc = journal_->commit(); rc) return rc;
  return journal_->flusher().flush_all().is_ok() ? 0 : EIO;
}

void FsImpl::shrink_caches() {
  // Best effort (it only makes buffers clean, hence evictable); a failure is sticky and the
  // next fsync, sync or unmount reports it.
  if (!ro_) (void)journal_->commit();
  // Twice: the first sweep gives recently used blocks their second chance.
  evict_metadata();
  evict_metadata();
  trim_heap();
}

FsStats FsImpl::stats() const {
  FsStats s;
  s.commits = journal_->commits.load();
  s.journal_blocks_written = journal_->journal_blocks_written.load();
  s.checkpoint_blocks = journal_->checkpoint_blocks.load();
  s.meta_reads = journal_->meta_reads.load();
  s.meta_cached = journal_->meta_cached.load();
  s.checksum_errors = journal_->checksum_errors.load();
  s.trims = trims_.load();
  s.trimmed_blocks = trimmed_blocks_.load();
  s.orphans_freed_at_mount = orphans_freed_;
  s.replayed_transactions = replayed_;
  s.meta_buffers = journal_->cached_buffers();
  s.meta_evicted = journal_->evicted.load();
  s.commit_interval_ms = opts_.commit_interval_ms;
  s.read_only = ro_.load();
  s.discard = opts_.discard;
  s.meta_cache_mb = opts_.meta_cache_mb;
  s.shared_blocks = shared_blocks_.load(std::memory_order_relaxed);
  s.saved_blocks = saved_blocks_.load(std::memory_order_relaxed);
  s.clones = clones_.load(std::memory_order_relaxed);
  s.cloned_blocks = cloned_blocks_.load(std::memory_order_relaxed);
  s.cow_blocks = cow_blocks_.load(std::memory_order_relaxed);
  s.deduped_blocks = deduped_blocks_.load(std::memory_order_relaxed);
  {
    std::lock_guard<Mutex> g(table_mu_);
    s.nodes = nodes_.size();
  }
  return s;
}

}  // namespace warpfs::fs
