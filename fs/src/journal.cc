#include "journal.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "warpfs/fs/replay.h"
#include "xxh.h"

namespace warpfs::fs {

namespace {

const char* kind_name(MetaKind k) {
  switch (k) {
    case MetaKind::kSuper:
      return "the superblock";
    case MetaKind::kGdt:
      return "a group descriptor block";
    case MetaKind::kBlockBitmap:
      return "a block bitmap";
    case MetaKind::kInodeBitmap:
      return "an inode bitmap";
    case MetaKind::kInodeTable:
      return "an inode table block";
    case MetaKind::kHeader:
      return "a directory, extent-tree or xattr block";
    case MetaKind::kRefcount:
      return "a reference-count table block";
  }
  return "?";
}

}  // namespace

Journal::Journal(blockdev::BlockDevice& dev, const Superblock& sb, uint64_t pos, uint64_t seq,
                 Log log)
    : dev_(dev), flusher_(dev), sb_(sb), log_(std::move(log)), pos_(pos), seq_(seq), ring_(&dev) {
  // One descriptor per transaction, and the transaction (descriptor + blocks + commit) must
  // fit in the ring of journal_blocks - 1 positions.
  capacity_ = std::min<uint32_t>(kJournalMaxBlocks, sb.journal_blocks - 3);
}

Journal::~Journal() = default;

int Journal::get(uint64_t block, MetaKind kind, uint32_t group, MetaBuf** out,
                 const std::function<std::string(const MetaBuf&)>& verify, uint64_t owner) {
  Shard& s = shard(block);
  {
    std::unique_lock<std::mutex> g(s.mu);
    auto it = s.map.find(block);
    if (it != s.map.end()) {
      const MetaKind held = it->second->kind;
      if (held == kind) {
        meta_cached.fetch_add(1, std::memory_order_relaxed);
        it->second->referenced.store(true, std::memory_order_relaxed);
        *out = it->second.get();
        return 0;
      }
      // A pointer from one structure into another's block (an extent naming a bitmap): the
      // buffer is not handed out as what it is not (to be changed, or retired as freed).
      g.unlock();
      checksum_errors.fetch_add(1, std::memory_order_relaxed);
      log_("metadata block " + std::to_string(block) + " is " + kind_name(held) + ", not " +
           kind_name(kind) + " (run fsck.warpfs)");
      return EIO;
    }
  }
  if (block == 0 || block >= sb_.block_count) {
    log_("metadata block " + std::to_string(block) + " is outside the filesystem");
    return EIO;
  }
  // Read outside the shard lock; a concurrent reader of the same block keeps the first copy.
  // Nobody modifies a block that is not cached, so both copies are equal.
  auto b = std::make_unique<MetaBuf>();
  b->block = block;
  b->kind = kind;
  b->group = group;
  b->owner = owner;
  meta_reads.fetch_add(1, std::memory_order_relaxed);
  if (blockdev::Status st = meta_io(block, 1, b->data, false); !st.is_ok()) {
    log_("read of metadata block " + std::to_string(block) + " failed: " + st.to_string());
    return EIO;
  }
  std::string bad;
  if (header_checksummed(kind)) {
    uint64_t stored;
    std::memcpy(&stored, b->data + kHeaderChecksumOffset, 8);
    if (stored != block_checksum(b->data, kHeaderChecksumOffset, sb_.checksum_seed)) {
      bad = "checksum mismatch";
    }
  } else if (kind == MetaKind::kGdt) {
    const uint64_t first = (block - sb_.gdt_start) * kGroupDescsPerBlock;
    for (uint32_t k = 0; k < kGroupDescsPerBlock && first + k < sb_.group_count; ++k) {
      GroupDesc gd;
      std::memcpy(&gd, b->data + k * sizeof gd, sizeof gd);
      if (gd.checksum != group_checksum(gd, sb_.checksum_seed)) {
        bad = "group descriptor " + std::to_string(first + k) + " checksum mismatch";
        break;
      }
    }
  }
  if (bad.empty() && verify) bad = verify(*b);
  if (!bad.empty()) {
    checksum_errors.fetch_add(1, std::memory_order_relaxed);
    log_("metadata block " + std::to_string(block) + ": " + bad + " (run fsck.warpfs)");
    return EIO;
  }
  {
    std::lock_guard<std::mutex> g(s.mu);
    auto [it, inserted] = s.map.try_emplace(block, std::move(b));
    if (inserted) buffers_.fetch_add(1, std::memory_order_relaxed);
    *out = it->second.get();
  }
  if (cap != 0 && buffers_.load(std::memory_order_relaxed) > cap && pressure) pressure();
  return 0;
}

MetaBuf* Journal::create(uint64_t block, MetaKind kind, uint64_t owner) {
  auto b = std::make_unique<MetaBuf>();
  b->block = block;
  b->kind = kind;
  b->owner = owner;
  b->home_seq = MetaBuf::kUnwritten;  // no commit has copied it: its home holds garbage
  std::memset(b->data, 0, kBlockSize);
  Shard& s = shard(block);
  std::lock_guard<std::mutex> g(s.mu);
  auto& slot = s.map[block];
  if (!slot) buffers_.fetch_add(1, std::memory_order_relaxed);
  if (slot) {
    // A stale cached copy of a block that was freed and is now reused (forget_block missed
    // it only if it was never cached): replace it.
    {
      std::lock_guard<std::mutex> gd(dirty_mu_);
      slot->dead = true;  // commit skips it; the pointer in dirty_ stays valid until then
    }
    std::lock_guard<std::mutex> gy(graveyard_mu_);
    graveyard_.push_back(std::move(slot));
  }
  slot = std::move(b);
  return slot.get();
}

void Journal::forget_block(uint64_t block) {
  Shard& s = shard(block);
  std::unique_ptr<MetaBuf> victim;
  {
    std::unique_lock<std::mutex> g(s.mu);
    auto it = s.map.find(block);
    if (it == s.map.end()) return;
    if (it->second->kind != MetaKind::kHeader) {
      // Only header blocks are ever freed; the others are pinned for the mount (a group
      // keeps pointing at its bitmaps), so a freed pointer to one is corruption.
      const MetaKind held = it->second->kind;
      g.unlock();
      log_("metadata block " + std::to_string(block) + " is " + kind_name(held) +
           ", freed as a directory, extent-tree or xattr block: kept (run fsck.warpfs)");
      return;
    }
    victim = std::move(it->second);
    s.map.erase(it);
    buffers_.fetch_sub(1, std::memory_order_relaxed);
  }
  {
    std::lock_guard<std::mutex> g(dirty_mu_);
    victim->dead = true;  // commit skips it; the pointer in dirty_ stays valid until then
  }
  std::lock_guard<std::mutex> g(graveyard_mu_);
  graveyard_.push_back(std::move(victim));
}

void Journal::dirty(MetaBuf* b) {
  WARPFS_DCHECK(in_transaction() || held_by_me(commit_mu_),
                "Journal::dirty outside a transaction and outside a commit");
  std::lock_guard<std::mutex> g(dirty_mu_);
  // Not home until a commit has copied it and written its checkpoint: from the commit's
  // prune (dirty goes false) to its copy (home_seq set), nothing may evict it.
  b->home_seq = MetaBuf::kUnwritten;
  if (!b->dirty) {
    b->dirty = true;
    dirty_.push_back(b);
    dirty_count_.fetch_add(1, std::memory_order_relaxed);
  }
}

void Journal::enter() {
  // A transaction over half its capacity is committed before more operations join it: the
  // other half is headroom for the operations already inside (each dirties a few blocks).
  // Its result is not this operation's: a failed commit fails every later one (failed_),
  // and the operation's own commit, fsync or sync reports it.
  const uint32_t dirty = dirty_count_.load(std::memory_order_relaxed);
  if (dirty >= capacity_ / 2) {
    (void)commit();
  } else if (dirty >= capacity_ / 16 * kAskAtSixteenths && wants_commit) {
    wants_commit();  // sooner, and off this operation's path
  }
  std::unique_lock<std::mutex> g(gate_mu_);
  gate_cv_.wait(g, [&] { return !closed_; });
  ++active_;
#if WARPFS_DEBUG_CHECKS
  txns_of_this_thread().push_back(this);
#endif
}

void Journal::leave() {
#if WARPFS_DEBUG_CHECKS
  auto& mine = txns_of_this_thread();
  auto it = std::find(mine.begin(), mine.end(), this);
  WARPFS_DCHECK(it != mine.end(), "Journal::leave by a thread that did not enter");
  mine.erase(it);
#endif
  std::lock_guard<std::mutex> g(gate_mu_);
  if (--active_ == 0 && closed_) gate_cv_.notify_all();
}

#if WARPFS_DEBUG_CHECKS
// One entry per Txn in scope on this thread, by journal (a process may mount several).
std::vector<const Journal*>& Journal::txns_of_this_thread() {
  static thread_local std::vector<const Journal*> mine;
  return mine;
}

bool Journal::in_transaction() const {
  const auto& mine = txns_of_this_thread();
  return std::find(mine.begin(), mine.end(), this) != mine.end();
}
#endif

int Journal::commit() {
  std::lock_guard<Mutex> c(commit_mu_);
  if (failed_.load()) return EIO;
  // Close the gate and wait for the operations inside to leave.
  std::vector<MetaBuf*> dirty;
  std::vector<uint64_t> blocks;  // home block numbers; image i at ring_ block i + 1
  {
    std::unique_lock<std::mutex> g(gate_mu_);
    closed_ = true;
    gate_cv_.wait(g, [&] { return active_ == 0; });
  }
  // Operations entering from now on belong to the next transaction.
  const uint64_t closing = running_.load(std::memory_order_relaxed);
  running_.store(closing + 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> g(dirty_mu_);
    dirty.swap(dirty_);
    dirty_count_.store(0, std::memory_order_relaxed);
  }
  if (precommit) precommit();
  if (finish) finish(dirty);  // may dirty descriptor blocks: they go through dirty()
  {
    std::lock_guard<std::mutex> g(dirty_mu_);
    dirty.insert(dirty.end(), dirty_.begin(), dirty_.end());
    dirty_.clear();
    dirty_count_.store(0, std::memory_order_relaxed);
    dirty.erase(std::remove_if(dirty.begin(), dirty.end(),
                               [](MetaBuf* b) {
                                 b->dirty = false;
                                 return b->dead;
                               }),
                dirty.end());
  }
  // The buffers this transaction killed: no list points at them any more (the dirty list
  // was just pruned), so they go once the gate opens. Buffers killed after it opens belong
  // to the next transaction, whose dirty list may still hold them: they stay until then.
  std::vector<std::unique_ptr<MetaBuf>> dead;
  {
    std::lock_guard<std::mutex> g(graveyard_mu_);
    dead.swap(graveyard_);
  }
  // Each block's image goes where write_transaction writes it from: after the descriptor.
  constexpr size_t kStep = 256 << 10;  // ring_'s growth
  ring_.reserve(((dirty.size() + 2) * kBlockSize + kStep - 1) / kStep * kStep);
  for (size_t i = 0; i < dirty.size(); ++i) {
    uint8_t* image = ring_.data() + (i + 1) * kBlockSize;
    std::memcpy(image, dirty[i]->data, kBlockSize);
    {
      std::lock_guard<std::mutex> g(dirty_mu_);
      dirty[i]->home_seq = seq_;  // this transaction's: home once its checkpoint is written
    }
    if (header_checksummed(dirty[i]->kind)) {
      // In the copy, not the buffer: operations outside a transaction (lookups, readdir)
      // read the buffers' headers meanwhile. The buffer's own checksum field is stale until
      // the block is read from the device again.
      const uint64_t sum = block_checksum(image, kHeaderChecksumOffset, sb_.checksum_seed);
      std::memcpy(image + kHeaderChecksumOffset, &sum, 8);
    }
    blocks.push_back(dirty[i]->block);
  }
  {
    std::lock_guard<std::mutex> g(gate_mu_);
    closed_ = false;
  }
  gate_cv_.notify_all();
  if (reopened) reopened();
  dead.clear();

  int rc = 0;
  if (!blocks.empty()) {
    if (blocks.size() > capacity_) {
      log_("journal: a transaction of " + std::to_string(blocks.size()) +
           " blocks exceeds the journal's capacity of " + std::to_string(capacity_) +
           "; the filesystem is now read-only");
      failed_ = true;
      return EIO;
    }
    rc = write_transaction(blocks);
    if (rc != 0) {
      failed_ = true;
      return rc;
    }
  }
  committed_.store(closing, std::memory_order_release);
  if (committed) committed();
  return rc;
}

int Journal::write_transaction(const std::vector<uint64_t>& blocks) {
  auto fail = [&](const char* what, const blockdev::Status& st) {
    log_(std::string("journal: ") + what + " failed: " + st.to_string() +
         "; the filesystem is now read-only");
    return EIO;
  };
  auto jblock = [&](uint64_t p) { return 1 + p; };  // position -> device block
  // (1) Data of this transaction and the previous checkpoint become durable.
  if (auto st = flusher_.flush_all(); !st.is_ok()) return fail("flush before commit", st);
  // (2) The previous transaction is checkpointed: the tail moves to this one.
  if (write_header() != 0) {
    log_("journal: header write failed; the filesystem is now read-only");
    return EIO;
  }
  // (3) Descriptor, blocks, commit.
  const auto n = static_cast<uint32_t>(blocks.size());
  uint8_t* const ring = ring_.data();
  WARPFS_DCHECK(ring_.size() >= (n + 2) * size_t{kBlockSize},
                "Journal::write_transaction: ring_ is shorter than the transaction");
  std::memset(ring, 0, kBlockSize);  // the descriptor's unused targets: zero, as before
  auto* d = reinterpret_cast<JournalDescriptor*>(ring);
  d->magic = kJournalDescriptorMagic;
  d->count = n;
  d->seq = seq_;
  for (uint32_t i = 0; i < n; ++i) d->targets[i] = blocks[i];
  d->checksum = block_checksum(d, offsetof(JournalDescriptor, checksum), sb_.checksum_seed);
  auto* c = reinterpret_cast<JournalCommit*>(ring + (n + 1) * size_t{kBlockSize});
  std::memset(c, 0, kBlockSize);
  c->magic = kJournalCommitMagic;
  c->count = n;
  c->seq = seq_;
  c->data_checksum = checksum(ring, (n + 1) * size_t{kBlockSize}, sb_.checksum_seed);  // FORMAT.md
  c->checksum = block_checksum(c, offsetof(JournalCommit, checksum), sb_.checksum_seed);
  // Write in contiguous runs up to the ring's end, then from position 1.
  uint64_t p = pos_;
  std::vector<blockdev::BlockDevice::Range> mine{{1, 1}};  // the header and the runs
  for (uint32_t i = 0; i < n + 2;) {
    const uint32_t run =
        static_cast<uint32_t>(std::min<uint64_t>(n + 2 - i, sb_.journal_blocks - p));
    if (auto st = meta_io(jblock(p), run, ring + i * size_t{kBlockSize}, true); !st.is_ok()) {
      return fail("journal write", st);
    }
    mine.push_back({jblock(p), run});
    i += run;
    p = p + run >= sb_.journal_blocks ? 1 : p + run;
  }
  // (4) The commit is durable: the header and the ring's runs (cache lines when short) are
  // written back, then the device's Flush; nothing else needs writing back for it.
  if (auto st = flusher_.flush_ranges(mine.data(), mine.size()); !st.is_ok())
    return fail("flush after commit", st);
  journal_blocks_written.fetch_add(n + 2, std::memory_order_relaxed);
  pos_ = p;
  ++seq_;
  commits.fetch_add(1, std::memory_order_relaxed);
  // (5) Checkpoint: home locations (durable at the next commit's flush, or at unmount).
  std::vector<blockdev::BlockDevice::Io> ios(blocks.size());
  for (size_t k = 0; k < blocks.size(); ++k) {
    ios[k].block = blocks[k];
    ios[k].write = true;
    ios[k].priority = nvme::Priority::kMetadata;
    ios[k].data = ring + (k + 1) * size_t{kBlockSize};
  }
  dev_.submit(ios.data(), static_cast<int>(ios.size()));  // a warp of blocks at a time
  for (const auto& io : ios) {
    if (!io.status.is_ok()) return fail("checkpoint write", io.status);
  }
  checkpoint_blocks.fetch_add(n, std::memory_order_relaxed);
  checkpointed_seq_.store(seq_ - 1, std::memory_order_release);
  return 0;
}

std::vector<Journal::Candidate> Journal::eviction_candidates(size_t max) {
  std::vector<Candidate> out;
  const uint64_t done = checkpointed_seq_.load(std::memory_order_acquire);
  for (int k = 0; k < kShards && out.size() < max; ++k) {
    Shard& s = shards_[sweep_shard_];
    sweep_shard_ = (sweep_shard_ + 1) % kShards;
    std::lock_guard<std::mutex> g(s.mu);
    std::lock_guard<std::mutex> gd(dirty_mu_);
    for (auto& [block, b] : s.map) {
      if (b->kind != MetaKind::kInodeTable && b->kind != MetaKind::kHeader) continue;  // pinned
      if (b->dirty || b->dead || (b->home_seq != 0 && b->home_seq > done)) continue;
      if (b->referenced.exchange(false, std::memory_order_relaxed)) continue;  // second chance
      out.push_back(Candidate{block, b->kind, b->owner});
    }
  }
  return out;
}

bool Journal::drop_if_clean(uint64_t block) {
  Shard& s = shard(block);
  std::unique_ptr<MetaBuf> victim;
  {
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.map.find(block);
    if (it == s.map.end()) return false;
    MetaBuf* b = it->second.get();
    if (b->kind != MetaKind::kInodeTable && b->kind != MetaKind::kHeader) return false;
    {
      std::lock_guard<std::mutex> gd(dirty_mu_);
      const uint64_t done = checkpointed_seq_.load(std::memory_order_acquire);
      if (b->dirty || b->dead || (b->home_seq != 0 && b->home_seq > done)) return false;
    }
    victim = std::move(it->second);
    s.map.erase(it);
    buffers_.fetch_sub(1, std::memory_order_relaxed);
  }
  evicted.fetch_add(1, std::memory_order_relaxed);
  return true;
}

int Journal::close() {
  if (int rc = commit(); rc) return rc;
  std::lock_guard<Mutex> c(commit_mu_);
  if (auto st = flusher_.flush_all(); !st.is_ok()) return EIO;
  if (int rc = write_header(); rc) return rc;
  return flusher_.flush_all().is_ok() ? 0 : EIO;
}

int Journal::write_header() {
  WARPFS_DCHECK(held_by_me(commit_mu_), "Journal::write_header without commit_mu_");
  JournalHeader h{};
  h.magic = kJournalHeaderMagic;
  h.tail_block = pos_;
  h.tail_seq = seq_;
  h.checksum = block_checksum(&h, offsetof(JournalHeader, checksum), sb_.checksum_seed);
  return write_direct(1, &h);
}

blockdev::Status Journal::meta_io(uint64_t block, uint32_t count, const void* data, bool write) {
  blockdev::BlockDevice::Io io;
  io.block = block;
  io.count = count;
  io.write = write;
  io.priority = nvme::Priority::kMetadata;
  io.data = static_cast<uint8_t*>(const_cast<void*>(data));
  dev_.submit(&io, 1);
  return io.status;
}

int Journal::write_direct(uint64_t block, const void* data) {
  if (auto st = meta_io(block, 1, data, true); !st.is_ok()) {
    log_("write of block " + std::to_string(block) + " failed: " + st.to_string());
    return EIO;
  }
  return 0;
}

}  // namespace warpfs::fs
