// Inodes: loading and storing them in the inode tables, the node table with FUSE's lookup
// counts and open counts, the orphan list, and reclaiming an inode after its last user.
#include <malloc.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "internal.h"

namespace warpfs::fs {

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

uint64_t FsImpl::inode_block(Ino ino, size_t* off) const {
  const uint64_t g = group_of_inode(ino, sb_.inodes_per_group);
  const uint64_t i = (ino - 1) % sb_.inodes_per_group;
  const auto* gd = reinterpret_cast<const GroupDesc*>(gdt_[g / kGroupDescsPerBlock]->data) +
                   g % kGroupDescsPerBlock;
  *off = (i % kInodesPerBlock) * kInodeSize;
  return gd->inode_table + i / kInodesPerBlock;
}

int FsImpl::with_slot(Ino ino, const std::function<void(MetaBuf*, size_t)>& f) {
  size_t off;
  const uint64_t block = inode_block(ino, &off);
  const uint64_t g = group_of_inode(ino, sb_.inodes_per_group);
  std::lock_guard<std::mutex> lk(slot_mu(block));
  MetaBuf* buf;
  if (int rc = journal_->get(block, MetaKind::kInodeTable, static_cast<uint32_t>(g), &buf); rc)
    return rc;
  f(buf, off);
  return 0;
}

int FsImpl::get_node(Ino ino, NodeRef* out) {
  if (ino == 0 || ino > sb_.inode_count) return ENOENT;
  for (;;) {
    uint64_t epoch;
    {
      std::lock_guard<Mutex> g(table_mu_);
      auto it = nodes_.find(ino);
      if (it != nodes_.end()) {
        *out = it->second;
        return 0;
      }
      epoch = table_epoch_;
    }
    auto n = std::make_shared<Node>(ino);
    if (int rc = with_slot(ino,
                           [&](MetaBuf* buf, size_t off) {
                             std::memcpy(&n->disk, buf->data + off, sizeof(Inode));
                           });
        rc) {
      return rc;
    }
    if (n->disk.mode == 0) return ENOENT;
    if (n->disk.checksum != inode_checksum(n->disk, ino, sb_.checksum_seed)) {
      log("inode " + std::to_string(ino) + ": checksum mismatch (run fsck.warpfs)");
      return EIO;
    }
    n->pub = n->disk;
    n->times_record = has_time_sentinel(n->disk);
    std::lock_guard<Mutex> g(table_mu_);
    auto it = nodes_.find(ino);
    if (it != nodes_.end()) {
      *out = it->second;  // another thread loaded it meanwhile: the one in the table counts
      return 0;
    }
    // A node left the table since the slot was read: it may have been this one, with
    // changes stored after that read. Read again.
    if (table_epoch_ != epoch) continue;
    adopt_sync_state(*n);
    nodes_.emplace(ino, n);
    *out = std::move(n);
    return 0;
  }
}

int FsImpl::store(Node& n) {
  WARPFS_DCHECK(changeable_by_me(n), "store: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "store: in a transaction");
  fold_times(n);  // an overwrite's times (Node::pending_times) go with the inode
  // A time written in range replaced the last sentinel: the record goes with the change.
  if (n.times_record && !has_time_sentinel(n.disk)) {
    const int rc = remove_xattr_locked(n, kXattrInternal, kTimesRecordName);
    if (rc && rc != ENODATA) return rc;
    n.times_record = false;
  }
  n.disk.checksum = inode_checksum(n.disk, n.ino, sb_.checksum_seed);
  bool data = false;  // what fdatasync needs changed too (see Node::data_txn)
  if (int rc = with_slot(n.ino,
                         [&](MetaBuf* buf, size_t off) {
                           Inode old;
                           std::memcpy(&old, buf->data + off, sizeof old);
                           data = old.mode != n.disk.mode || old.size != n.disk.size ||
                                  old.blocks != n.disk.blocks ||
                                  old.extent_count != n.disk.extent_count ||
                                  old.tree_depth != n.disk.tree_depth ||
                                  std::memcmp(&old.root, &n.disk.root, sizeof old.root) != 0;
                           std::memcpy(buf->data + off, &n.disk, sizeof(Inode));
                           journal_->dirty(buf);
                         });
      rc) {
    return rc;
  }
  note_changed(n, data);
  publish(n);
  return 0;
}

void FsImpl::note_changed(Node& n, bool data) {
  WARPFS_DCHECK(journal_->in_transaction(), "note_changed: in a transaction");
  const uint64_t t = journal_->running();
  n.meta_txn.store(t, std::memory_order_release);
  if (data) n.data_txn.store(t, std::memory_order_release);
}

int FsImpl::times_record(Node& n, TimesRecord* r) {
  std::string v;
  if (int rc = xattr_get_locked(n, kXattrInternal, kTimesRecordName, &v); rc) return rc;
  if (v.size() != sizeof *r) return EIO;
  std::memcpy(r, v.data(), sizeof *r);
  for (const auto& e : r->t) {
    if (e.nsec >= 1000000000) return EIO;
  }
  return 0;
}

void FsImpl::exact_times(Node& n, const Inode& d, Attr* out) {
  WARPFS_DCHECK(readable_by_me(n), "exact_times: rw held");
  if (!has_time_sentinel(d)) return;
  TimesRecord r;
  if (int rc = times_record(n, &r); rc) {
    log("inode " + std::to_string(n.ino) + ": a time out of range without its record (" +
        std::strerror(rc) + "; run fsck.warpfs)");
    return;
  }
  const uint64_t fields[3] = {d.atime_ns, d.mtime_ns, d.ctime_ns};
  TimeSpec* outs[3] = {&out->atime, &out->mtime, &out->ctime};
  for (int i = 0; i < 3; ++i) {
    if (time_sentinel(fields[i])) *outs[i] = TimeSpec{r.t[i].sec, r.t[i].nsec};
  }
}

void FsImpl::exact_times_unlocked(Node& n, Attr* out) {
  if (!time_sentinel(time_ns_from(out->atime)) && !time_sentinel(time_ns_from(out->mtime)) &&
      !time_sentinel(time_ns_from(out->ctime))) {
    return;
  }
  std::shared_lock<SharedMutex> lk(n.rw);
  exact_times(n, n.disk, out);
}

void FsImpl::fold_times(Node& n) {
  WARPFS_DCHECK(changeable_by_me(n), "fold_times: rw exclusive");
  const uint64_t t = n.pending_times.exchange(0, std::memory_order_relaxed);
  if (t == 0 || n.disk.mode == 0) return;  // none, or the inode is being freed
  n.disk.mtime_ns = time_later(n.disk.mtime_ns, t);
  n.disk.ctime_ns = time_later(n.disk.ctime_ns, t);
}

int FsImpl::store_times_locked(Node& n) {
  WARPFS_DCHECK(changeable_by_me(n), "store_times_locked: rw exclusive");
  WARPFS_DCHECK(!journal_->in_transaction(), "store_times_locked: not in a transaction");
  if (n.pending_times.load(std::memory_order_relaxed) == 0 || n.disk.mode == 0) return 0;
  Journal::Txn t(*journal_);
  return store(n);
}

int FsImpl::store_times(bool wait) {
  std::vector<Ino> inos, busy;
  {
    std::lock_guard<std::mutex> g(times_mu_);
    inos.swap(times_dirty_);
  }
  int first_rc = 0;
  for (const Ino ino : inos) {
    NodeRef n;
    {
      std::lock_guard<Mutex> g(table_mu_);
      auto it = nodes_.find(ino);
      if (it == nodes_.end()) continue;  // freed (maybe_reclaim keeps a node with times)
      n = it->second;
    }
    if (n->pending_times.load(std::memory_order_relaxed) == 0) continue;
    std::unique_lock<SharedMutex> lk(n->rw, std::defer_lock);
    if (wait) {
      lk.lock();
    } else if (!lk.try_lock()) {
      busy.push_back(ino);
      continue;
    }
    if (int rc = store_times_locked(*n); rc && !first_rc) first_rc = rc;
    lk.unlock();
    n.reset();
    maybe_reclaim(ino);  // forgotten meanwhile: it stayed in the table for its times
  }
  if (!busy.empty()) {
    std::lock_guard<std::mutex> g(times_mu_);
    times_dirty_.insert(times_dirty_.end(), busy.begin(), busy.end());
  }
  return first_rc;
}

void FsImpl::publish(Node& n) {
  std::lock_guard<std::mutex> g(n.attr_mu);
  n.pub = n.disk;
}

void Attr::to_stat(struct stat* st) const {
  std::memset(st, 0, sizeof *st);
  st->st_ino = ino;
  st->st_mode = mode;
  st->st_nlink = nlink;
  st->st_uid = uid;
  st->st_gid = gid;
  st->st_rdev = static_cast<dev_t>(rdev);
  st->st_size = static_cast<off_t>(size);
  st->st_blocks = static_cast<blkcnt_t>(blocks);
  st->st_blksize = kBlockSize;
  // Signed: dates before 1970 too, any int64 seconds (FORMAT.md "Inode").
  auto put = [](const TimeSpec& t, timespec* ts) {
    ts->tv_sec = static_cast<time_t>(t.sec);
    ts->tv_nsec = static_cast<long>(t.nsec);
  };
  put(atime, &st->st_atim);
  put(mtime, &st->st_mtim);
  put(ctime, &st->st_ctim);
}

int FsImpl::new_node(Ino parent, uint32_t mode, const Caller& c, NodeRef* out) {
  Ino ino;
  if (int rc = alloc_inode(parent, S_ISDIR(mode), &ino); rc) return rc;
  Inode old;
  if (int rc = with_slot(
          ino, [&](MetaBuf* buf, size_t off) { std::memcpy(&old, buf->data + off, sizeof old); });
      rc) {
    free_inode_bit(ino, S_ISDIR(mode));
    return rc;
  }
  auto n = std::make_shared<Node>(ino);
#if WARPFS_DEBUG_CHECKS
  n->creating.store(true, std::memory_order_relaxed);  // until create_locked names it
#endif
  Inode& d = n->disk;
  d = Inode{};
  d.mode = mode;
  d.uid = c.uid;
  d.gid = c.gid;
  d.links = 1;
  d.atime_ns = d.mtime_ns = d.ctime_ns = d.crtime_ns = now_ns();
  d.generation = old.generation + 1;  // FUSE: a reused inode number is a new file
  n->mapped = true;
  n->leaves.assign(1, ExtentLeaf{});
  {
    std::lock_guard<Mutex> g(table_mu_);
    auto& slot = nodes_[ino];
    if (slot) {
      // A stale node of a freed inode (kept only while some operation still held it).
      log("inode " + std::to_string(ino) + " reused while still cached");
    }
    slot = n;
  }
  *out = n;
  return 0;
}

void FsImpl::ref(Node& n, uint64_t lookups, uint32_t opens) {
  std::lock_guard<Mutex> g(table_mu_);
  n.nlookup += lookups;
  n.opens += opens;
}

// Drops a node nobody references from the table, or reclaims it if it has no links.
void FsImpl::maybe_reclaim(Ino ino) {
  NodeRef n;
  {
    std::lock_guard<Mutex> g(table_mu_);
    auto it = nodes_.find(ino);
    if (it == nodes_.end()) return;
    n = it->second;
    if (n->nlookup != 0 || n->opens != 0) return;
  }
  bool unlinked;
  {
    std::lock_guard<std::mutex> g(n->attr_mu);
    unlinked = n->pub.links == 0;
  }
  if (!unlinked) {
    if (n->pending_times.load(std::memory_order_relaxed) != 0 && !ro_) {
      // An overwrite's times, which leaving the table would lose.
      std::unique_lock<SharedMutex> lk(n->rw);
      if (store_times_locked(*n) != 0) return;  // stays (and stays on times_dirty_)
    }
    std::lock_guard<Mutex> g(table_mu_);
    // Only the table and `n` hold it: nobody is inside an operation on it. An overwrite
    // since the store above leaves it for store_times.
    if (n->nlookup == 0 && n->opens == 0 && n.use_count() == 2 &&
        n->pending_times.load(std::memory_order_relaxed) == 0) {
      keep_sync_state(*n);
      nodes_.erase(ino);
      ++table_epoch_;
    }
    return;
  }
  if (ro_) return;  // reclaimed at the next read-write mount (it is on the orphan list)
  std::lock_guard<Mutex> ns(namespace_mu_);
  {
    std::lock_guard<Mutex> g(table_mu_);
    if (n->nlookup != 0 || n->opens != 0) return;  // looked up again meanwhile
  }
  // Nobody to tell (the kernel's forget has no reply): a failure leaves the inode on the
  // orphan list, which the next read-write mount frees.
  (void)reclaim(n);
}

void FsImpl::keep_sync_state(Node& n) {
  WARPFS_DCHECK(held_by_me(table_mu_), "keep_sync_state: table_mu_");
  // Nobody else holds `n` now, but the last writer's release of its reference is no
  // happens-before edge to this thread (use_count() is a relaxed load): written_mu (a leaf
  // lock) is, for the fields it guards.
  bool data;
  uint64_t flush_gen;
  {
    std::lock_guard<std::mutex> g(n.written_mu);
    data = n.written_all || !n.written.empty();
    flush_gen = n.flush_gen;
  }
  const Journal& j = *journal_;
  const uint64_t meta = n.meta_txn.load(std::memory_order_acquire);
  if (!data && j.flusher().durable(flush_gen) && meta <= j.durable_txn()) return;
  if (sync_leftovers_.size() >= 4096) {  // forget those that became durable meanwhile
    for (auto it = sync_leftovers_.begin(); it != sync_leftovers_.end();) {
      const SyncLeftover& l = it->second;
      const bool done =
          !l.written_all && j.flusher().durable(l.flush_gen) && l.meta_txn <= j.durable_txn();
      it = done ? sync_leftovers_.erase(it) : std::next(it);
    }
  }
  sync_leftovers_[n.ino] = SyncLeftover{data, flush_gen, meta, n.data_txn.load()};
}

void FsImpl::adopt_sync_state(Node& n) {
  WARPFS_DCHECK(held_by_me(table_mu_), "adopt_sync_state: table_mu_");
  auto it = sync_leftovers_.find(n.ino);
  if (it == sync_leftovers_.end()) return;
  n.written_all = it->second.written_all;
  n.flush_gen = it->second.flush_gen;
  n.meta_txn.store(it->second.meta_txn, std::memory_order_relaxed);
  n.data_txn.store(it->second.data_txn, std::memory_order_relaxed);
  sync_leftovers_.erase(it);
}

int FsImpl::reclaim(const NodeRef& n) {
  WARPFS_DCHECK(held_by_me(namespace_mu_), "reclaim: namespace_mu_");
  NodeRef pred;
  if (int rc = orphan_pred(*n, &pred); rc) return rc;
  NodeLocks locks(namespace_mu_, {n.get(), pred.get()});
  if (n->disk.mode == 0 || n->disk.links != 0) return 0;
  if (int rc = truncate_blocks(*n, 0); rc) return rc;
  {
    // Off the list and freed in one transaction: a commit between the two would leave an
    // allocated inode with no links that nothing leads to (a power cut then leaks it).
    Journal::Txn t(*journal_);
    if (int rc = orphan_remove(*n, pred.get()); rc) return rc;
    xattr_free_all(*n);
    if (int rc = free_inode(*n); rc) return rc;
  }
  std::lock_guard<Mutex> g(table_mu_);
  auto it = nodes_.find(n->ino);
  if (it != nodes_.end() && it->second == n) {
    nodes_.erase(it);
    ++table_epoch_;
  }
  return 0;
}

int FsImpl::free_inode(Node& n) {
  WARPFS_DCHECK(changeable_by_me(n), "free_inode: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "free_inode: in a transaction");
  const bool dir = S_ISDIR(n.disk.mode);
  const uint32_t gen = n.disk.generation;
  n.disk = Inode{};
  n.disk.generation = gen;
  if (int rc = store(n); rc) return rc;
  free_inode_bit(n.ino, dir);
  return 0;
}

int FsImpl::orphan_add(Node& n) {
  WARPFS_DCHECK(held_by_me(namespace_mu_), "orphan_add: namespace_mu_");
  WARPFS_DCHECK(changeable_by_me(n), "orphan_add: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "orphan_add: in a transaction");
  auto* s = reinterpret_cast<Superblock*>(sb_buf_->data);
  std::lock_guard<std::mutex> g(orphan_mu_);
  n.disk.next_orphan = s->orphan_head;
  s->orphan_head = n.ino;
  journal_->dirty(sb_buf_);
  return store(n);
}

// The orphan list is only changed under namespace_mu_, so its links can be followed
// without the nodes' locks.
int FsImpl::orphan_pred(const Node& n, NodeRef* pred) {
  WARPFS_DCHECK(held_by_me(namespace_mu_), "orphan_pred: namespace_mu_");
  pred->reset();
  const auto* s = reinterpret_cast<const Superblock*>(sb_buf_->data);
  Ino cur = s->orphan_head;
  for (uint64_t steps = 0; cur != 0 && cur != n.ino && steps < sb_.inode_count; ++steps) {
    NodeRef p;
    if (int rc = get_node(cur, &p); rc) {
      log("orphan list: inode " + std::to_string(cur) + " unreadable (run fsck.warpfs)");
      return rc;
    }
    if (p->disk.next_orphan == n.ino) {
      *pred = p;
      return 0;
    }
    cur = p->disk.next_orphan;
  }
  return 0;
}

int FsImpl::orphan_remove(Node& n, Node* pred) {
  WARPFS_DCHECK(held_by_me(namespace_mu_), "orphan_remove: namespace_mu_");
  WARPFS_DCHECK(changeable_by_me(n), "orphan_remove: rw exclusive");
  WARPFS_DCHECK(pred == nullptr || changeable_by_me(*pred), "orphan_remove: pred rw exclusive");
  auto* s = reinterpret_cast<Superblock*>(sb_buf_->data);
  if (s->orphan_head == n.ino) {
    std::lock_guard<std::mutex> g(orphan_mu_);
    s->orphan_head = n.disk.next_orphan;
    journal_->dirty(sb_buf_);
  } else if (pred != nullptr) {
    pred->disk.next_orphan = n.disk.next_orphan;
    if (int rc = store(*pred); rc) return rc;
  } else {
    return 0;  // not on the list
  }
  n.disk.next_orphan = 0;
  return store(n);
}

bool FsImpl::forgotten_inode_block(uint64_t block) {
  WARPFS_DCHECK(held_by_me(table_mu_), "forgotten_inode_block: table_mu_");
  if (block < group_start(0)) return false;
  const uint64_t g = (block - group_start(0)) / kBlocksPerGroup;
  const uint64_t first_table = group_start(static_cast<uint32_t>(g)) + 2;
  if (g >= sb_.group_count || block < first_table || block >= first_table + L_.itb) return false;
  const Ino first = g * sb_.inodes_per_group + (block - first_table) * kInodesPerBlock + 1;
  for (Ino ino = first; ino < first + kInodesPerBlock; ++ino) {
    if (nodes_.count(ino)) return false;
  }
  return true;
}

void FsImpl::evict_metadata() {
  if (!journal_) return;
  std::lock_guard<std::mutex> one(evict_mu_);
  // Over the cap: down to 7/8 of it, so that a busy mount does not evict at every block.
  const size_t low = meta_cap_ - meta_cap_ / 8;
  const std::vector<Journal::Candidate> cands = journal_->eviction_candidates(SIZE_MAX);
  size_t dropped = 0;
  for (const Journal::Candidate& c : cands) {
    const bool over = meta_cap_ != 0 && journal_->cached_buffers() > low;
    if (c.kind == MetaKind::kInodeTable) {
      bool forgotten;
      {
        std::lock_guard<Mutex> g(table_mu_);
        forgotten = forgotten_inode_block(c.block);
      }
      if (!forgotten && !over) continue;
      // Its users hold the slot lock throughout (with_slot).
      std::lock_guard<std::mutex> lk(slot_mu(c.block));
      dropped += journal_->drop_if_clean(c.block);
      continue;
    }
    NodeRef owner;
    {
      std::lock_guard<Mutex> g(table_mu_);
      auto it = nodes_.find(c.owner);
      if (it == nodes_.end()) {
        // Forgotten: a node that loads it again is inserted in the table first (which this
        // lock holds off), and reads it from its home, current since it is clean.
        dropped += journal_->drop_if_clean(c.block);
        continue;
      }
      if (!over) continue;
      owner = it->second;
    }
    // Its users hold the owner's lock; while nobody does, it can go.
    if (owner->rw.try_lock()) {
      dropped += journal_->drop_if_clean(c.block);
      owner->rw.unlock();
    }
  }
  untrimmed_ += dropped;
}

void FsImpl::trim_heap() {
  std::lock_guard<std::mutex> one(evict_mu_);
  if (untrimmed_ < 256) return;
  // The dropped buffers' pages (page_pool.h), then what their records left free in the heap.
  PagePool::instance().trim();
  malloc_trim(0);
  untrimmed_ = 0;
}

}  // namespace warpfs::fs
