// The metadata cache and the journal (fs/FORMAT.md "Journal").
//
// Every metadata block the filesystem reads lives in a MetaBuf for the life of the mount;
// changes are made in place, inside a transaction, and the buffer is marked dirty. A commit
// closes the gate (no operation is inside a transaction), lets the filesystem finish the
// checksums, copies the dirty blocks, reopens the gate, and then writes the copies: journal
// first, home locations after (ordered mode, one live transaction; see FORMAT.md).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "flusher.h"
#include "locks.h"
#include "page_pool.h"
#include "warpfs/blockdev/block_device.h"
#include "warpfs/fs/format.h"

namespace warpfs::fs {

enum class MetaKind : uint8_t {
  kSuper,        // superblock: its own checksum
  kGdt,          // group descriptor table block: a checksum per descriptor
  kBlockBitmap,  // checksummed in the group descriptor
  kInodeBitmap,
  kInodeTable,  // a checksum per inode
  kHeader,      // directory, extent-tree and xattr blocks: checksum at byte 24
  kRefcount,    // a group's reference-count table: checksum at byte 24, pinned once read
};
// Kinds whose block carries its checksum at byte 24 (FORMAT.md "Checksums of header blocks").
inline bool header_checksummed(MetaKind k) {
  return k == MetaKind::kHeader || k == MetaKind::kRefcount;
}

// One cached metadata block. Who may touch `data` (the rules eviction relies on, see
// Journal::drop_if_clean):
//   - superblock, group descriptors and bitmaps: pinned for the mount; bitmaps under their
//     group's lock, the rest under the journal gate (in a transaction) or read-only;
//   - reference-count tables (kRefcount): pinned once read, under their group's lock;
//   - inode-table blocks: only under FsImpl::slot_mu(block), from the lookup in the cache
//     to the last byte copied and the dirty() call;
//   - directory, extent-tree and xattr blocks (kHeader): only under their owner inode's
//     Node::rw (shared to read, exclusive to change), and only through a node that is in
//     the node table;
//   - a commit reads dirty buffers under its closed gate (no operation is inside).
struct MetaBuf {
  uint64_t block = 0;
  MetaKind kind = MetaKind::kHeader;
  uint32_t group = 0;  // bitmaps: their group
  uint64_t owner = 0;  // kHeader: the inode whose block this is (immutable)
  bool dirty = false;  // in the running transaction (journal's dirty_mu_)
  bool dead = false;   // freed: never written again (dirty_mu_)
  // The transaction whose checkpoint writes this content home (dirty_mu_): 0 once the home
  // block holds it (read from the device, or checkpointed), kUnwritten for a new block no
  // commit has copied yet. Only a buffer whose home is current may leave the cache.
  uint64_t home_seq = 0;
  static constexpr uint64_t kUnwritten = ~uint64_t{0};
  std::atomic<bool> referenced{true};  // used since the eviction clock last passed
  // The block's bytes: a page of the metadata cache's pool (page_pool.h), not zeroed.
  uint8_t* const data = PagePool::instance().take();

  MetaBuf() = default;
  ~MetaBuf() { PagePool::instance().give(data); }
  MetaBuf(const MetaBuf&) = delete;
  MetaBuf& operator=(const MetaBuf&) = delete;
};
static_assert(kBlockSize == PagePool::kPage, "a metadata block fills one page of the pool");

class Journal {
 public:
  using Log = std::function<void(const std::string&)>;
  // `pos`/`seq`: where the next transaction goes (after replay).
  Journal(blockdev::BlockDevice& dev, const Superblock& sb, uint64_t pos, uint64_t seq, Log log);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // The cached buffer of `block`, read and verified on first use. A checksum failure is
  // EIO, logged with the block and kind; `verify` checks kinds that need context (bitmaps
  // against their descriptor, header magic): it returns "" or the problem.
  // `owner`: kHeader blocks' inode (MetaBuf::owner).
  [[nodiscard]] int get(uint64_t block, MetaKind kind, uint32_t group, MetaBuf** out,
                        const std::function<std::string(const MetaBuf&)>& verify = nullptr,
                        uint64_t owner = 0);
  // A zeroed buffer for a newly allocated metadata block (no read).
  MetaBuf* create(uint64_t block, MetaKind kind, uint64_t owner = 0);

  // Eviction (the cache's cap, FsImpl::evict_metadata). Candidates: inode-table and kHeader
  // buffers that look clean and written home, not referenced since the last sweep (the
  // sweep clears the bit of those that were): (block, kind, owner).
  struct Candidate {
    uint64_t block;
    MetaKind kind;
    uint64_t owner;
  };
  std::vector<Candidate> eviction_candidates(size_t max);
  // Drops `block`'s buffer if it is still clean and written home. REQUIRES (unchecked: the
  // locks are the filesystem's, not the journal's): the caller excludes every user of the
  // buffer by the rules at MetaBuf (the slot lock, or the owner's lock, or the owner's
  // absence from the node table held locked).
  bool drop_if_clean(uint64_t block);
  size_t cached_buffers() const { return buffers_.load(std::memory_order_relaxed); }
  std::atomic<uint64_t> evicted{0};
  // A freed metadata block: dropped from the cache and from the running transaction.
  void forget_block(uint64_t block);
  // REQUIRES: inside a transaction, or committing under the closed gate (the finish hook).
  void dirty(MetaBuf* b);
  // The filesystem grew (FsImpl::grow): blocks up to the new end are metadata it may cache.
  // REQUIRES (unchecked): no other operation in flight.
  void set_geometry(const Superblock& sb) { sb_ = sb; }

  // A transaction: operations enter it (shared) and leave; commit waits until none is
  // inside. REQUIRES (unchecked: the locks are the filesystem's): the caller holds no lock
  // an operation inside a transaction may wait for (filesystem.h's order: no namespace or
  // inode lock is taken inside).
  class Txn {
   public:
    explicit Txn(Journal& j) : j_(&j) { j.enter(); }
    ~Txn() {
      if (!j_) return;
      j_->leave();
      // Crash testing only; a failure is sticky (failed()): the next commit reports it.
      if (j_->commit_each_transaction) (void)j_->commit();
    }
    Txn(const Txn&) = delete;
    Txn& operator=(const Txn&) = delete;

   private:
    Journal* j_;
  };

  // Commits the running transaction (if it has anything) and makes it durable. Returns 0 or
  // EIO. Serialised; a caller arriving during a commit waits for it and commits again only if
  // more was dirtied.
  [[nodiscard]] int commit();
  // Transaction numbers for fsync (not the on-disk seq): running() is the transaction an
  // operation inside a Txn belongs to (stable while it is inside: a commit moves it on only
  // under its closed gate); durable_txn() is the last one known durable (0: none). A change
  // made in transaction t is durable once durable_txn() >= t.
  uint64_t running() const { return running_.load(std::memory_order_acquire); }
  uint64_t durable_txn() const { return committed_.load(std::memory_order_acquire); }
  // Every flush of the mount's device goes through this (flusher.h).
  Flusher& flusher() { return flusher_; }
  const Flusher& flusher() const { return flusher_; }
  // Blocks a transaction may still dirty before a commit is forced.
  uint32_t capacity() const { return capacity_; }

  // Crash testing (MountOptions::commit_every_transaction): each transaction scope commits
  // as it ends, so that a power cut can fall between any two scopes of one operation. Set
  // once before use.
  bool commit_each_transaction = false;

  // Hooks, set once before use:
  // finish(dirty): under the closed gate, before the copy: compute derived checksums (may
  // dirty more blocks: bitmaps dirty their descriptor block).
  std::function<void(std::vector<MetaBuf*>&)> finish;
  // committed(): after the transaction is durable and checkpointed (frees become reusable).
  std::function<void()> committed;
  // precommit(): under the closed gate, before finish: take the transaction's private
  // lists (e.g. the blocks it freed).
  std::function<void()> precommit;
  // pressure(): the cache has grown past `cap` buffers (0: no cap), from the thread that
  // added one (it may hold any lock of an operation: the hook only asks for eviction).
  std::function<void()> pressure;
  size_t cap = 0;
  // wants_commit(): the running transaction holds kAskAtSixteenths / 16 of the capacity, from
  // enter() in the thread of an operation (which may hold any lock of an operation: the hook only
  // asks). The filesystem commits it from a thread of its own, so that no operation commits in
  // enter() at half the capacity, on its request's path, unless that thread falls behind.
  std::function<void()> wants_commit;
  static constexpr uint32_t kAskAtSixteenths = 7;
  // reopened(): in the committing thread, as soon as the gate has reopened and before the
  // commit's I/O (tests: an operation that runs there meets the commit at its most
  // delicate point).
  std::function<void()> reopened;

  // Commits, makes every checkpoint durable and leaves the journal empty (the header's tail
  // at the next position): a later replay finds nothing. For unmount.
  [[nodiscard]] int close();
  // Writes a block directly (superblock at unmount), bypassing the journal.
  [[nodiscard]] int write_direct(uint64_t block, const void* data);
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  // Whether this thread is inside a transaction of this journal (a Txn in scope). Debug-check
  // builds only (WARPFS_DCHECK): the count is kept only there.
  bool in_transaction() const;

  std::atomic<uint64_t> commits{0}, journal_blocks_written{0}, checkpoint_blocks{0};
  std::atomic<uint64_t> meta_reads{0}, meta_cached{0}, checksum_errors{0};

 private:
  // One transfer of the journal's or the metadata's own, in the device's metadata class
  // (queue_mapper.h): a commit is not stuck behind a deep queue of file data.
  blockdev::Status meta_io(uint64_t block, uint32_t count, const void* data, bool write);
  void enter();
  void leave();
#if WARPFS_DEBUG_CHECKS
  static std::vector<const Journal*>& txns_of_this_thread();
#endif
  [[nodiscard]] int write_header();  // tail at (pos_, seq_); REQUIRES: commit_mu_
  // Writes ring_'s first blocks.size() + 2 blocks as the next transaction (the image of the
  // block whose home is blocks[i] already at ring_ block i + 1), then the checkpoint.
  // REQUIRES: commit_mu_.
  [[nodiscard]] int write_transaction(const std::vector<uint64_t>& blocks);

  blockdev::BlockDevice& dev_;
  Flusher flusher_;
  Superblock sb_;  // geometry and seed (changed only by grow(), which runs alone)
  Log log_;
  uint32_t capacity_;

  // The gate. closed_ stops new entries; a commit waits for active_ == 0. Everything a
  // commit reads under the closed gate (dirty buffers, the filesystem's finish hook) is
  // changed only by operations inside a transaction.
  std::mutex gate_mu_;  // leaf: active_, closed_
  std::condition_variable gate_cv_;
  int active_ = 0;
  bool closed_ = false;

  Mutex commit_mu_;  // one commit at a time; outside the gate
  // running(): changed only under the closed gate with no operation inside, by the commit
  // (commit_mu_) that closes it; committed_ (durable_txn()): written under commit_mu_.
  std::atomic<uint64_t> running_{1}, committed_{0};
  uint64_t pos_, seq_;  // commit_mu_
  // commit_mu_: a commit's image of its run of the ring: the descriptor, the blocks' images
  // (copied there under the closed gate), the commit record. Kept from one commit to the
  // next, grown to the largest (at most kJournalMaxBlocks + 2 blocks, 2 MiB): a new buffer
  // of that size each commit was fresh pages each time, zeroed by the kernel on first touch,
  // and a second copy of every block. Memory the device moves without a copy
  // (BlockDevice::alloc_io_buffer: DMA memory on NVMe), so that the journal's writes and the
  // checkpoint's leave from it as they are (heap memory where the device gives none), grown
  // in steps of 256 KiB so that a run of growing transactions maps few buffers.
  blockdev::IoBuffer ring_;
  // The last transaction whose checkpoint is written (its buffers' homes are current).
  std::atomic<uint64_t> checkpointed_seq_{0};
  std::atomic<size_t> buffers_{0};  // in the shards
  size_t sweep_shard_ = 0;          // eviction_candidates' clock hand (one evictor at a time)
  std::atomic<bool> failed_{false};

  std::mutex dirty_mu_;          // leaf: dirty_, and MetaBuf::dirty, dead, home_seq
  std::vector<MetaBuf*> dirty_;  // the running transaction's buffers (may include dead ones)
  std::atomic<uint32_t> dirty_count_{0};  // dirty_.size(), read without the lock by enter()

  static constexpr int kShards = 64;
  struct Shard {
    std::mutex mu;  // leaf, but for dirty_mu_ (taken inside it by create and drop_if_clean)
    std::unordered_map<uint64_t, std::unique_ptr<MetaBuf>> map;
  };
  Shard shards_[kShards];
  Shard& shard(uint64_t block) {
    return shards_[block % kShards];
  }
  // Buffers dead (freed) in the running transaction: its dirty_ may still point at them,
  // so they are freed only by the commit that prunes them from that list (commit()).
  std::mutex graveyard_mu_;  // leaf
  std::vector<std::unique_ptr<MetaBuf>> graveyard_;
};

}  // namespace warpfs::fs
