// File contents: read, write, truncate, fallocate, SEEK_DATA/SEEK_HOLE. Data blocks are
// written to the device before the transaction that maps them closes, and a commit flushes
// before its journal writes: ordered mode (fs/FORMAT.md "Journal").
#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "internal.h"

namespace warpfs::fs {

namespace {

constexpr uint32_t kBlocksPerTxn = 256;  // a write transaction maps at most 1 MiB

// The log line of a failed read of a file's blocks.
std::string read_failure(Ino ino, uint64_t physical, uint64_t count, const blockdev::Status& st) {
  return "inode " + std::to_string(ino) + ": read of blocks " + std::to_string(physical) + "+" +
         std::to_string(count) + " failed: " + st.to_string();
}

}  // namespace

// Blocks [first, first + count) of the file into dst: holes and unwritten extents as zeroes,
// the rest in as few device reads as the mapping allows.
int FsImpl::read_blocks(Node& n, uint64_t first, uint64_t count, uint8_t* dst, ReadFor purpose) {
  for (uint64_t b = first; b < first + count;) {
    const Mapping m = map_lookup(n, static_cast<uint32_t>(b));
    const uint64_t run = std::min<uint64_t>(m.length, first + count - b);
    uint8_t* p = dst + (b - first) * kBlockSize;
    if (m.hole || m.unwritten) {
      std::memset(p, 0, run * kBlockSize);
    } else if (auto st = purpose == ReadFor::kDirect
                             ? dev_.read_uncached(m.physical, static_cast<uint32_t>(run), p)
                             : dev_.read(m.physical, static_cast<uint32_t>(run), p);
               !st.is_ok()) {
      log(read_failure(n.ino, m.physical, run, st));
      return errno_of(st);
    }
    b += run;
  }
  return 0;
}

int FsImpl::lock_for_read(Ino ino, uint64_t off, size_t* len, NodeRef* n,
                          std::shared_lock<SharedMutex>* lk) {
  if (int rc = get_node(ino, n); rc) return rc;
  if (int rc = lock_mapped(**n, lk); rc) return rc;
  if (S_ISDIR((*n)->disk.mode)) return EISDIR;
  const uint64_t size = (*n)->disk.size;
  *len = off >= size ? 0 : static_cast<size_t>(std::min<uint64_t>(*len, size - off));
  return 0;
}

int FsImpl::read(Ino ino, uint64_t off, size_t len, char* buf, size_t* got, ReadFor purpose) {
  *got = 0;
  NodeRef n;
  std::shared_lock<SharedMutex> lk;
  if (int rc = lock_for_read(ino, off, &len, &n, &lk); rc || len == 0) return rc;
  const uint64_t first = off / kBlockSize;
  auto* out = reinterpret_cast<uint8_t*>(buf);
  if (off % kBlockSize == 0) {
    // The whole blocks land in the caller's buffer (DMA memory from the daemon: no copy on
    // the way); only a partial last block (the file's end) goes through a block of our own.
    const uint64_t whole = len / kBlockSize;
    const size_t tail = len % kBlockSize;
    if (int rc = whole ? read_blocks(*n, first, whole, out, purpose) : 0; rc) return rc;
    if (tail != 0) {
      alignas(64) uint8_t last[kBlockSize];
      if (int rc = read_blocks(*n, first + whole, 1, last, purpose); rc) return rc;
      std::memcpy(out + whole * kBlockSize, last, tail);
    }
  } else {  // an unaligned start (O_DIRECT with odd offsets): whole blocks, then the slice
    const uint64_t nblocks = (off + len - 1) / kBlockSize - first + 1;
    std::vector<uint8_t> blocks(nblocks * kBlockSize);
    if (int rc = read_blocks(*n, first, nblocks, blocks.data(), purpose); rc) return rc;
    std::memcpy(out, blocks.data() + off % kBlockSize, len);
  }
  *got = len;
  return 0;
}

namespace {

// FsImpl::read_start's read in flight: the device's read of one extent, the node (kept in
// memory) and its detached hold (locks.h), released when the read has ended.
class FilePendingRead final : public Filesystem::PendingRead {
 public:
  FilePendingRead(std::unique_ptr<blockdev::BlockDevice::PendingRead> part, Ino ino,
                  uint64_t physical, uint64_t count, size_t len,
                  const std::function<void(const std::string&)>& log)
      : part_(std::move(part)),
        ino_(ino),
        physical_(physical),
        count_(count),
        len_(len),
        log_(log) {}
  ~FilePendingRead() override {
    part_.reset();  // waits for the read
    release();
  }

  bool poll() override {
    if (held_ == nullptr) return true;  // ended
    if (!part_->poll()) return false;
    if (const blockdev::Status st = part_->status(); !st.is_ok()) {
      log_(read_failure(ino_, physical_, count_, st));
      rc_ = errno_of(st);
    }
    part_.reset();
    release();
    return true;
  }
  void idle(port::Backoff& b) override {
    if (part_ != nullptr) part_->idle(b);
  }
  int result(size_t* got) const override {
    *got = rc_ == 0 ? len_ : 0;
    return rc_;
  }
  // Takes over the hold of `n`'s rw. REQUIRES: n.rw held (shared) by the caller.
  void hold(std::shared_ptr<Node> n) {
    n->rw.hold_detached();  // see DetachedHolds
    held_ = &n->rw;
    node_ = std::move(n);
  }

 private:
  void release() {
    if (held_ != nullptr) held_->release_detached();
    held_ = nullptr;
    node_.reset();
  }

  std::unique_ptr<blockdev::BlockDevice::PendingRead> part_;
  const Ino ino_;
  const uint64_t physical_, count_;
  const size_t len_;
  const std::function<void(const std::string&)>& log_;
  std::shared_ptr<Node> node_;   // keeps the node in memory
  SharedMutex* held_ = nullptr;  // node_'s rw, held detached until the read ends
  int rc_ = 0;
};

}  // namespace

// read() for the FUSE daemon (ReadFor::kDirect), with the device's read left in flight:
// block-aligned reads into a buffer with room for whole blocks, of one extent (and holes);
// anything else is read() at once. One device read at most, started last: a thread must keep
// polling what it has submitted (virtual_queue.h), and one that left an earlier extent's
// completion unpolled while it waited for a queue slot could wait for itself. The mapping is
// looked up under rw shared, as read() does, and the hold that keeps it (the blocks stay this
// file's) passes to the pending read, whichever thread ends it.
int FsImpl::read_start(Ino ino, uint64_t off, size_t len, char* buf, size_t room, size_t* got,
                       std::unique_ptr<PendingRead>* pending) {
  pending->reset();
  const uint64_t whole = (uint64_t{len} + kBlockSize - 1) / kBlockSize * kBlockSize;
  if (off % kBlockSize != 0 || whole > room) {
    return read(ino, off, len, buf, got, ReadFor::kDirect);
  }
  *got = 0;
  NodeRef n;
  std::shared_lock<SharedMutex> lk;
  const size_t asked = len;
  if (int rc = lock_for_read(ino, off, &len, &n, &lk); rc || len == 0) return rc;
  const uint64_t first = off / kBlockSize, end = first + (len + kBlockSize - 1) / kBlockSize;
  auto* out = reinterpret_cast<uint8_t*>(buf);
  uint64_t device_physical = 0, device_first = 0, device_run = 0;  // the one extent read, if any
  for (uint64_t b = first; b < end;) {
    const Mapping m = map_lookup(*n, static_cast<uint32_t>(b));
    const uint64_t run = std::min<uint64_t>(m.length, end - b);
    if (m.hole || m.unwritten) {
      std::memset(out + (b - first) * kBlockSize, 0, run * kBlockSize);
    } else if (device_run != 0) {  // a second extent: read() at once
      lk.unlock();
      n.reset();
      return read(ino, off, asked, buf, got, ReadFor::kDirect);
    } else {
      device_physical = m.physical, device_first = b, device_run = run;
    }
    b += run;
  }
  std::unique_ptr<blockdev::BlockDevice::PendingRead> part;
  if (device_run != 0) {
    if (const blockdev::Status st =
            dev_.read_uncached_start(device_physical, static_cast<uint32_t>(device_run),
                                     out + (device_first - first) * kBlockSize, &part);
        !st.is_ok()) {
      log(read_failure(ino, device_physical, device_run, st));
      return errno_of(st);
    }
  }
  if (part == nullptr) {  // holes alone, or the device's read ended already
    *got = len;
    return 0;
  }
  auto r = std::make_unique<FilePendingRead>(std::move(part), ino, device_physical, device_run, len,
                                             log_);
  r->hold(std::move(n));  // under lk
  *pending = std::move(r);
  return 0;
}

int FsImpl::write(Ino ino, uint64_t off, size_t len, const char* buf, size_t* written,
                  bool* dropped_privs, WriteFrom from) {
  *written = 0;
  if (dropped_privs) *dropped_privs = false;
  if (int rc = check_writable(); rc) return rc;
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  if (int rc; overwrite(*n, off, len, buf, written, &rc, from)) return rc;
  std::unique_lock<SharedMutex> lk(n->rw);
  if (S_ISDIR(n->disk.mode)) return EISDIR;
  if (int rc = load_map(*n); rc) return rc;
  // Immutable: no write. Append-only: only past the end (an O_APPEND open's writes); the
  // write-back of the page that holds the old end rewrites the bytes below it unchanged.
  if (immutable(n->disk)) return EPERM;
  if (append_only(n->disk) && off < n->disk.size) {
    if (from != WriteFrom::kPageCache) return EPERM;
    bool same = false;
    if (int rc = same_bytes(*n, off, len, buf, &same); rc) return rc;
    if (!same) return EPERM;
  }
  if (off >= kMaxFileSize || len > kMaxFileSize - off) return EFBIG;
  const uint32_t privs = n->disk.mode & (S_ISUID | S_ISGID);  // write_locked clears them
  const int rc = write_all_locked(*n, off, len, buf, written, from);
  if (dropped_privs) *dropped_privs = (privs & ~n->disk.mode) != 0;
  return rc;
}

int FsImpl::write_all_locked(Node& n, uint64_t off, size_t len, const char* buf, size_t* written,
                             WriteFrom from) {
  *written = 0;
  int rc = 0;
  while (*written < len && rc == 0) {
    const uint64_t pos = off + *written;
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(
        len - *written, uint64_t{kBlocksPerTxn} * kBlockSize - pos % kBlockSize));
    size_t done = 0;
    rc = write_locked(n, pos, chunk, buf + *written, &done, from);
    *written += done;
    for (int i = 0; rc == ENOSPC && i < kEnospcRetries && free_held_blocks(); ++i) {
      // Blocks freed by the running transaction are free now: the rest of the piece again.
      done = 0;
      rc = write_locked(n, off + *written, chunk - (off + *written - pos), buf + *written, &done,
                        from);
      *written += done;
    }
  }
  return *written > 0 ? 0 : rc;  // a short write reports what it wrote
}

// The fast path: no allocation, no size or mapping change, no privilege to drop, hence
// nothing to journal. Ordered mode needs nothing either: the data goes to blocks the file
// already owns on the media, and fsync writes them back (note_written). The times go to
// Node::pending_times (see "Overwrites" in ARCHITECTURE.md). Holding rw shared excludes every
// change of the size and mapping (truncate, punch, an extending or filling write: rw
// exclusive) from the check to the last block written. Whole blocks only: a partial block's
// read-modify-write would race another overwrite of the same block, so it takes the ordinary
// path, whose exclusive lock excludes every fast one. Two fast overwrites of the same block
// may land in either order, block by block, as two O_DIRECT writes on ext4 may.
bool FsImpl::overwrite(Node& n, uint64_t off, size_t len, const char* buf, size_t* written, int* rc,
                       WriteFrom from) {
  if (len == 0 || off % kBlockSize != 0 || len % kBlockSize != 0) return false;
  // An exclusive locker waiting: queue behind it (locks.h) rather than keep it out.
  if (n.rw.writer_waiting()) return false;
  std::shared_lock<SharedMutex> lk(n.rw);
  const Inode& d = n.disk;
  const bool own = from == WriteFrom::kWriter;  // times and privileges are this write's
  if (!n.mapped || !S_ISREG(d.mode) || pinned(d) ||
      (own && ((d.mode & (S_ISUID | S_ISGID)) != 0 || n.may_have_capability())) || off >= d.size ||
      len > d.size - off) {
    return false;
  }
  // The write's time replaces the stored ones by being later (fold_times): a file whose mtime
  // or ctime was set past now (utimensat, or a sentinel beyond 2262) takes the ordinary path,
  // which sets them to now.
  const uint64_t t = now_ns();
  if (own && (time_later(d.mtime_ns, t) != t || time_later(d.ctime_ns, t) != t)) return false;
  struct Run {
    uint64_t logical, physical, count;
  };
  Run runs[8];  // a FUSE write (1 MiB at most) over at most 8 extents; more: the ordinary path
  size_t nruns = 0;
  const uint64_t first = off / kBlockSize, end = (off + len) / kBlockSize;
  for (uint64_t b = first; b < end;) {
    const Mapping m = map_lookup(n, static_cast<uint32_t>(b));
    if (m.hole || m.unwritten || nruns == std::size(runs)) return false;
    const uint64_t run = std::min<uint64_t>(m.length, end - b);
    // A shared block is copied first (the ordinary path). A block this file maps becomes
    // shared only under its rw exclusive (clone, dedup: share.cc), which the shared lock
    // excludes until the write is done.
    if (any_shared(m.physical, run)) return false;
    runs[nruns++] = {b, m.physical, run};
    b += run;
  }
  *rc = 0;
  for (size_t i = 0; i < nruns; ++i) {
    const Run& r = runs[i];
    const blockdev::Status st = dev_.write(r.physical, static_cast<uint32_t>(r.count),
                                           buf + (r.logical - first) * kBlockSize);
    if (!st.is_ok()) {
      log("inode " + std::to_string(n.ino) + ": data write failed: " + st.to_string());
      *rc = errno_of(st);
      break;
    }
    note_written(n, r.physical, r.count);
    *written = (r.logical + r.count - first) * kBlockSize;
  }
  if (*written > 0 && own) {
    uint64_t p = n.pending_times.load(std::memory_order_relaxed);
    while (p < t && !n.pending_times.compare_exchange_weak(p, t, std::memory_order_relaxed)) {
    }
    if (p == 0) {  // this thread raised it from 0: the node goes on the list
      std::lock_guard<std::mutex> g(times_mu_);
      times_dirty_.push_back(n.ino);
    }
    std::lock_guard<std::mutex> g(n.attr_mu);  // what stat shows
    n.pub.mtime_ns = time_later(n.pub.mtime_ns, t);
    n.pub.ctime_ns = time_later(n.pub.ctime_ns, t);
    *rc = 0;  // a short write reports what it wrote
  }
  return true;
}

int FsImpl::same_bytes(Node& n, uint64_t off, size_t len, const char* buf, bool* same) {
  *same = true;
  if (off >= n.disk.size) return 0;
  const uint64_t end = std::min<uint64_t>(n.disk.size, off + len);
  const uint64_t first = off / kBlockSize;
  std::vector<uint8_t> blocks(((end - 1) / kBlockSize - first + 1) * kBlockSize);
  if (int rc = read_blocks(n, first, blocks.size() / kBlockSize, blocks.data()); rc) return rc;
  *same = std::memcmp(blocks.data() + off % kBlockSize, buf, end - off) == 0;
  return 0;
}

// One transaction's worth of a write. REQUIRES: rw exclusive, mapping loaded.
int FsImpl::write_locked(Node& n, uint64_t off, size_t len, const char* buf, size_t* written,
                         WriteFrom from) {
  WARPFS_DCHECK(changeable_by_me(n), "write_locked: rw exclusive");
  WARPFS_DCHECK(n.mapped, "write_locked: mapping loaded");
  // Bytes past the end of file in its last block read as zeroes once the file grows over
  // them. They are not always zero on the media: a write that extended the file may have
  // reached the media before a crash lost its new size. Zero the gap between the old end and
  // this write in that block before anything exposes it; blocks wholly past the end go
  // (drop_past_eof).
  if (const uint64_t old = n.disk.size; off + len > old) {
    if (int rc = drop_past_eof(n, old, off + len); rc) return rc;
    if (off > old && old % kBlockSize) {
      const uint64_t end = std::min<uint64_t>(off, (old / kBlockSize + 1) * kBlockSize);
      if (int rc = zero_range(n, old, end - old); rc) return rc;
    }
  }
  Journal::Txn t(*journal_);
  const uint64_t first = off / kBlockSize, last = (off + len - 1) / kBlockSize;
  std::vector<uint8_t> block(kBlockSize);
  int rc = 0;
  uint64_t b = first;
  // Copies of shared runs this transaction makes: each changes a few count-table blocks
  // (its old run's), and many scattered ones (a deduplicated file) could overfill the
  // transaction, so past kMaxCopyRuns the write stops short and the caller (write_all_locked)
  // goes on in the next one.
  constexpr int kMaxCopyRuns = 16;
  int copy_runs = 0;
  while (b <= last && copy_runs < kMaxCopyRuns) {
    Mapping m = map_lookup(n, static_cast<uint32_t>(b));
    uint64_t run = std::min<uint64_t>(m.length, last - b + 1);
    bool fresh = m.hole || m.unwritten;  // the blocks' old contents read as zeroes
    uint64_t phys = m.physical;
    // Copy-on-write (FORMAT.md "Shared blocks"): a run of shared blocks is written to new
    // blocks, its partial edges merged with the old contents (read from cow_from), and the
    // extent then points at them.
    uint64_t cow_from = 0;
    if (!fresh) {
      bool shared;
      run = std::min(run, shared_prefix(m.physical, run, &shared));
      if (shared) {
        uint32_t got;
        if ((rc = alloc_blocks(alloc_goal(n, static_cast<uint32_t>(b)), static_cast<uint32_t>(run),
                               &phys, &got)))
          break;
        run = got;
        cow_from = m.physical;
        ++copy_runs;
      }
    }
    if (m.hole) {
      uint32_t got;
      if ((rc = alloc_blocks(alloc_goal(n, static_cast<uint32_t>(b)), static_cast<uint32_t>(run),
                             &phys, &got)))
        break;
      run = got;
      if ((rc = map_insert(n, Extent{static_cast<uint32_t>(b), got, phys}))) {
        free_blocks(phys, got);
        break;
      }
      n.disk.blocks += got;
    }
    // Write the run: whole blocks straight from the caller, partial edges merged.
    const uint64_t run_start = b * kBlockSize, run_end = (b + run) * kBlockSize;
    const uint64_t ws = std::max(run_start, off), we = std::min<uint64_t>(run_end, off + len);
    uint64_t blk = b;
    while (blk < b + run) {
      const uint64_t bs = blk * kBlockSize;
      const uint64_t s = std::max(bs, ws), e = std::min(bs + kBlockSize, we);
      blockdev::Status st;
      if (s == bs && e == bs + kBlockSize) {
        // A stretch of whole blocks.
        uint64_t k = 1;
        while (blk + k < b + run && (blk + k + 1) * kBlockSize <= we) ++k;
        st = dev_.write(phys + (blk - b), static_cast<uint32_t>(k), buf + (bs - off));
        if (!st.is_ok()) goto io_error;
        note_written(n, phys + (blk - b), k);
        blk += k;
        continue;
      }
      if (fresh) {
        std::memset(block.data(), 0, kBlockSize);
      } else if (st = dev_.read((cow_from ? cow_from : phys) + (blk - b), 1, block.data());
                 !st.is_ok()) {
        goto io_error;
      }
      std::memcpy(block.data() + (s - bs), buf + (s - off), e - s);
      st = dev_.write(phys + (blk - b), 1, block.data());
      if (!st.is_ok()) goto io_error;
      note_written(n, phys + (blk - b), 1);
      ++blk;
      continue;
    io_error:
      log("inode " + std::to_string(n.ino) + ": data write failed: " + st.to_string());
      rc = errno_of(st);  // ENOSPC from a thin-provisioned namespace out of space
      break;
    }
    if (rc) {
      if (cow_from) free_blocks(phys, run);  // the copies: the old blocks stay mapped
      break;
    }
    if (cow_from) {
      if ((rc = remap(n, static_cast<uint32_t>(b), run, phys, cow_from)) != 0) break;
      cow_blocks_.fetch_add(run, std::memory_order_relaxed);
    }
    if (m.unwritten) {
      // The fallocated range now holds data: split off a written extent.
      std::vector<Extent> removed;
      if ((rc = map_remove(n, static_cast<uint32_t>(b), run, &removed)) != 0) break;
      rc = map_insert(n, Extent{static_cast<uint32_t>(b), static_cast<uint32_t>(run), phys});
      if (rc) break;
    }
    *written = static_cast<size_t>(std::min<uint64_t>(we, off + len) - off);
    b += run;
  }
  if (*written > 0) n.disk.size = std::max<uint64_t>(n.disk.size, off + *written);
  if (*written > 0 && from == WriteFrom::kWriter) {  // kPageCache: the kernel's times follow
    if (int xrc = written_by_writer(n); xrc && !rc) rc = xrc;
  }
  if (int src = map_store(n); src && !rc) rc = src;
  return rc;
}

int FsImpl::written_by_writer(Node& n) {
  n.disk.mtime_ns = n.disk.ctime_ns = now_ns();
  return drop_privileges_locked(n);
}

// Changing a file's contents clears set-user-ID (and set-group-ID when group-executable) and
// drops security.capability, as the kernel's file_remove_privs() does; under
// FUSE_HANDLE_KILLPRIV_V2 the kernel leaves it to the daemon. REQUIRES: rw exclusive, in a
// transaction.
int FsImpl::drop_privileges_locked(Node& n) {
  n.disk.mode &= ~set_id_bits_to_drop(n.disk.mode);
  return drop_capability_locked(n);
}

// Points [l, l + count) of n's mapping at `to` instead of `from` (a copy-on-write's new
// blocks, or blocks a dedupe took references of), dropping the old blocks' references
// (FORMAT.md "Shared blocks"); on failure `to` is freed (or loses the references taken) and
// the mapping stays. REQUIRES: rw exclusive, in a transaction.
int FsImpl::remap(Node& n, uint32_t l, uint64_t count, uint64_t to, uint64_t from) {
  std::vector<Extent> removed;
  int rc = map_remove(n, l, count, &removed);
  if (rc == 0) rc = map_insert(n, Extent{l, static_cast<uint32_t>(count), to});
  if (rc) {
    free_blocks(to, count);
    return rc;
  }
  free_blocks(from, count);
  return 0;
}

// Zeroes [off, off + len) where it is mapped and written (the partial edge blocks of a
// truncate or punch); a shared block is copied first, in a transaction of its own.
// REQUIRES: rw exclusive, not in a transaction.
int FsImpl::zero_range(Node& n, uint64_t off, uint64_t len) {
  WARPFS_DCHECK(changeable_by_me(n), "zero_range: rw exclusive");
  WARPFS_DCHECK(!journal_->in_transaction(), "zero_range: not in a transaction");
  if (len == 0) return 0;
  std::vector<uint8_t> block(kBlockSize);
  for (uint64_t pos = off; pos < off + len;) {
    const uint64_t blk = pos / kBlockSize, bs = blk * kBlockSize;
    const uint64_t e = std::min(bs + kBlockSize, off + len);
    const Mapping m = map_lookup(n, static_cast<uint32_t>(blk));
    if (!m.hole && !m.unwritten) {
      if (auto st = dev_.read(m.physical, 1, block.data()); !st.is_ok()) return errno_of(st);
      std::memset(block.data() + (pos - bs), 0, e - pos);
      if (any_shared(m.physical, 1)) {
        Journal::Txn t(*journal_);
        uint64_t copy;
        uint32_t got;
        if (int rc = alloc_blocks(alloc_goal(n, static_cast<uint32_t>(blk)), 1, &copy, &got); rc)
          return rc;
        if (auto st = dev_.write(copy, 1, block.data()); !st.is_ok()) {
          free_blocks(copy, 1);
          return errno_of(st);
        }
        note_written(n, copy, 1);
        if (int rc = remap(n, static_cast<uint32_t>(blk), 1, copy, m.physical); rc) return rc;
        cow_blocks_.fetch_add(1, std::memory_order_relaxed);
        if (int rc = map_store(n); rc) return rc;
      } else {
        if (auto st = dev_.write(m.physical, 1, block.data()); !st.is_ok()) return errno_of(st);
        note_written(n, m.physical, 1);
      }
    }
    pos = e;
  }
  return 0;
}

// Blocks wholly past the end of file hold no data, yet some may still be mapped to written
// blocks: truncate_blocks frees them in transactions after the one that set the smaller
// size, and a crash between the two leaves them mapped. Before the file grows from `old` to
// `size`, such blocks in between are unmapped, so that what the growth exposes reads as
// zeroes and not as the data the truncate cut off. Unwritten extents (fallocate's
// preallocation past the end) read as zeroes already and stay. REQUIRES: rw exclusive,
// mapping loaded, not in a transaction.
int FsImpl::drop_past_eof(Node& n, uint64_t old, uint64_t size) {
  WARPFS_DCHECK(changeable_by_me(n), "drop_past_eof: rw exclusive");
  WARPFS_DCHECK(n.mapped, "drop_past_eof: mapping loaded");
  WARPFS_DCHECK(!journal_->in_transaction(), "drop_past_eof: not in a transaction");
  const uint64_t end = std::min<uint64_t>((size + kBlockSize - 1) / kBlockSize, kNoBlock);
  for (uint64_t b = (old + kBlockSize - 1) / kBlockSize; b < end;) {
    const Mapping m = map_lookup(n, static_cast<uint32_t>(b));
    const uint64_t run = std::min<uint64_t>(m.length, end - b);
    if (!m.hole && !m.unwritten) {
      Journal::Txn t(*journal_);
      if (int rc = punch(n, static_cast<uint32_t>(b), run); rc) return rc;
    }
    b += run;
  }
  return 0;
}

// REQUIRES: rw exclusive, not in a transaction.
int FsImpl::set_size(Node& n, uint64_t size) {
  WARPFS_DCHECK(changeable_by_me(n), "set_size: rw exclusive");
  WARPFS_DCHECK(!journal_->in_transaction(), "set_size: not in a transaction");
  if (size > kMaxFileSize) return EFBIG;
  if (int rc = load_map(n); rc) return rc;
  const uint64_t old = n.disk.size;
  if (size < old && size % kBlockSize) {
    // The tail of the new last block must read as zeroes if the file grows again.
    if (int rc = zero_range(n, size, kBlockSize - size % kBlockSize); rc) return rc;
  } else if (size > old) {
    if (int rc = drop_past_eof(n, old, size); rc) return rc;
    // Growing: the old last block's tail becomes file data and must read as zeroes, whatever
    // an extending write lost in a crash left there (see write_locked).
    if (old % kBlockSize) {
      if (int rc = zero_range(n, old, kBlockSize - old % kBlockSize); rc) return rc;
    }
  }
  {
    Journal::Txn t(*journal_);
    n.disk.size = size;
    n.disk.mtime_ns = n.disk.ctime_ns = now_ns();
    if (int rc = store(n); rc) return rc;
  }
  return size < old ? truncate_blocks(n, size) : 0;
}

int FsImpl::fallocate(Ino ino, int mode, uint64_t off, uint64_t len) {
  if (int rc = check_writable(); rc) return rc;
  if (len == 0) return EINVAL;
  if (mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))
    return EOPNOTSUPP;
  if ((mode & FALLOC_FL_PUNCH_HOLE) && !(mode & FALLOC_FL_KEEP_SIZE)) return EINVAL;
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::unique_lock<SharedMutex> lk(n->rw);
  if (S_ISDIR(n->disk.mode)) return EISDIR;
  if (!S_ISREG(n->disk.mode)) return ENODEV;
  // As vfs_fallocate(): nothing on an immutable file, only allocation on an append-only one.
  if (immutable(n->disk) || (append_only(n->disk) && (mode & ~FALLOC_FL_KEEP_SIZE))) return EPERM;
  if (off >= kMaxFileSize || len > kMaxFileSize - off) return EFBIG;
  if (int rc = load_map(*n); rc) return rc;
  if (set_id_bits_to_drop(n->disk.mode) != 0 || n->may_have_capability()) {
    // The privileges go first (vfs_fallocate's file_modified()), in a transaction of their
    // own: a crash before the change leaves them dropped, never a changed file keeping them.
    Journal::Txn t(*journal_);
    if (int rc = drop_privileges_locked(*n); rc) return rc;
    n->disk.ctime_ns = now_ns();
    if (int rc = store(*n); rc) return rc;
  }
  const uint64_t end = off + len;
  if (const uint64_t old = n->disk.size; !(mode & FALLOC_FL_KEEP_SIZE) && end > old) {
    // Growing the size exposes the old last block's tail and what lies past it: zeroes,
    // whatever a crash left there (as write_locked and set_size do).
    if (int rc = drop_past_eof(*n, old, end); rc) return rc;
    if (old % kBlockSize) {
      if (int rc = zero_range(*n, old, kBlockSize - old % kBlockSize); rc) return rc;
    }
  }
  if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
    // Partial edge blocks are zeroed in place; whole blocks are unmapped.
    const uint64_t fb = (off + kBlockSize - 1) / kBlockSize, lb = end / kBlockSize;
    if (fb > lb) {
      if (int rc = zero_range(*n, off, len); rc) return rc;
    } else {
      if (int rc = zero_range(*n, off, fb * kBlockSize - off); rc) return rc;
      if (int rc = zero_range(*n, lb * kBlockSize, end - lb * kBlockSize); rc) return rc;
      for (uint64_t b = fb; b < lb;) {
        // A bounded piece per transaction.
        const uint64_t piece = std::min<uint64_t>(lb - b, uint64_t{kBlocksPerGroup} * 4);
        Journal::Txn t(*journal_);
        if (int rc = punch(*n, static_cast<uint32_t>(b), piece); rc) return rc;
        b += piece;
      }
    }
    if (mode & FALLOC_FL_PUNCH_HOLE) {
      Journal::Txn t(*journal_);
      n->disk.mtime_ns = n->disk.ctime_ns = now_ns();
      return store(*n);
    }
  }
  // Allocate unwritten extents over the holes (mode 0, KEEP_SIZE, ZERO_RANGE).
  const uint64_t first = off / kBlockSize, last = (end - 1) / kBlockSize;
  int rc = 0;
  int retries = 0;  // commits for space since the last piece that allocated (retry_enospc)
  for (uint64_t b = first; b <= last;) {
    const uint64_t from = b;
    {
      Journal::Txn t(*journal_);
      for (int k = 0; k < 8 && b <= last; ++k) {
        const Mapping m = map_lookup(*n, static_cast<uint32_t>(b));
        const uint64_t run = std::min<uint64_t>(m.length, last - b + 1);
        if (!m.hole) {
          b += run;
          continue;
        }
        uint64_t phys;
        uint32_t got;
        if ((rc = alloc_blocks(alloc_goal(*n, static_cast<uint32_t>(b)), static_cast<uint32_t>(run),
                               &phys, &got)))
          break;
        if ((rc = map_insert(*n,
                             Extent{static_cast<uint32_t>(b), got | Extent::kUnwritten, phys}))) {
          free_blocks(phys, got);
          break;
        }
        n->disk.blocks += got;
        b += got;
      }
      if (rc == 0 && !(mode & FALLOC_FL_KEEP_SIZE)) {
        n->disk.size = std::max(n->disk.size, std::min(end, b * kBlockSize));  // never shrinks
      }
      n->disk.ctime_ns = now_ns();
      if (int src = map_store(*n); src && !rc) rc = src;
    }
    // Out of the transaction: blocks freed before (an unlink, this call's own punch) may only
    // be held; free them and go on from where the allocation stopped.
    if (b != from) retries = 0;
    if (rc == ENOSPC && retries < kEnospcRetries && free_held_blocks()) {
      ++retries;
      rc = 0;
      continue;
    }
    if (rc) break;
  }
  return rc;
}

int FsImpl::lseek(Ino ino, uint64_t off, int whence, uint64_t* out) {
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::shared_lock<SharedMutex> lk;
  if (int rc = lock_mapped(*n, &lk); rc) return rc;
  const uint64_t size = n->disk.size;
  if (whence != SEEK_DATA && whence != SEEK_HOLE) return EINVAL;
  if (off >= size) return ENXIO;
  // Unwritten (fallocated) extents read as zeroes: they count as holes, as on ext4.
  for (uint64_t b = off / kBlockSize; b * kBlockSize < size;) {
    const Mapping m = map_lookup(*n, static_cast<uint32_t>(b));
    const bool data = !m.hole && !m.unwritten;
    if (data == (whence == SEEK_DATA)) {
      *out = std::max(off, b * kBlockSize);
      return 0;
    }
    b += m.length;
  }
  if (whence == SEEK_DATA) return ENXIO;
  *out = size;  // the implicit hole at the end of the file
  return 0;
}

int FsImpl::inspect(Ino ino, InodeReport* out) {
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::shared_lock<SharedMutex> lk;
  if (int rc = lock_mapped(*n, &lk); rc) return rc;
  out->disk = n->disk;
  out->extents.clear();
  out->tree_blocks = n->index_blocks;
  for (const ExtentLeaf& l : n->leaves) {
    out->extents.insert(out->extents.end(), l.ext.begin(), l.ext.end());
    if (l.block != 0) out->tree_blocks.push_back(l.block);
  }
  return 0;
}

void FsImpl::note_written(Node& n, uint64_t first, uint64_t count) {
  WARPFS_DCHECK(readable_by_me(n), "note_written: rw held");
  std::lock_guard<std::mutex> g(n.written_mu);
  if (n.written_all) return;
  auto& w = n.written;
  if (!w.empty() && w.back().block + w.back().count == first) {
    w.back().count += count;  // an append, or a sequential write
    return;
  }
  w.push_back({first, count});
  if (w.size() <= Node::kMaxWrittenRuns) return;
  // Many runs: merge the overlapping and adjacent ones (rewrites of the same blocks).
  std::sort(w.begin(), w.end(), [](const auto& a, const auto& b) { return a.block < b.block; });
  size_t out = 0;
  for (size_t i = 1; i < w.size(); ++i) {
    if (w[i].block <= w[out].block + w[out].count) {
      w[out].count = std::max(w[out].count, w[i].block + w[i].count - w[out].block);
    } else {
      w[++out] = w[i];
    }
  }
  w.resize(out + 1);
  if (w.size() > Node::kMaxWrittenRuns / 2) {  // scattered: the next fsync writes back all
    n.written_all = true;
    w.clear();
    w.shrink_to_fit();
  }
}

// fsync and fdatasync of one node:
//  1. its data blocks written since the last fsync (Node::written) are written back from
//     the device's cache, and nothing else (no scan of the cache);
//  2. if the inode's change fsync needs (Node::meta_txn; fdatasync: data_txn, what reading
//     the data back needs) is not committed, the journal commits: its flushes start after
//     step 1, so they cover the data too;
//  3. else, unless a flush that started after step 1 (or after the previous fsync's
//     write-back, Node::flush_gen) has returned, one device Flush, shared with the fsyncs
//     waiting meanwhile (Flusher::flush_to).
// A node with nothing written or changed since its last durable fsync costs no I/O. A
// directory's names are its metadata: its fdatasync is its fsync.
int FsImpl::fsync(Ino ino, bool datasync) {
  if (ro_) return 0;
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  if (!datasync && n->pending_times.load(std::memory_order_relaxed) != 0) {
    // An overwrite's times (fdatasync needs no time to read the data back): stored now, so
    // that meta_txn names the transaction to commit (store()).
    std::unique_lock<SharedMutex> lk(n->rw);
    if (int rc = store_times_locked(*n); rc) return rc;
  }
  std::lock_guard<std::mutex> one(n->sync_mu);
  Flusher& fl = journal_->flusher();
  std::vector<blockdev::BlockDevice::Range> runs;
  bool all;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> g(n->written_mu);
    runs.swap(n->written);
    all = n->written_all;
    n->written_all = false;
    gen = n->flush_gen;
  }
  bool dir;
  {
    std::lock_guard<std::mutex> g(n->attr_mu);
    dir = S_ISDIR(n->pub.mode);
  }
  const uint64_t need = datasync && !dir ? n->data_txn.load(std::memory_order_acquire)
                                         : n->meta_txn.load(std::memory_order_acquire);
  if (all || !runs.empty()) {
    // A whole-cache write-back is flush_all's, which flushes too: durable at once.
    const blockdev::Status st = all ? fl.flush_all() : dev_.write_back(runs.data(), runs.size());
    const uint64_t after = all ? 0 : fl.next();
    std::lock_guard<std::mutex> g(n->written_mu);
    if (!st.is_ok()) {  // still to write back: the next fsync tries again
      n->written.insert(n->written.end(), runs.begin(), runs.end());
      n->written_all = n->written_all || all;
      return errno_of(st);
    }
    gen = n->flush_gen = after;
  }
  if (need > journal_->durable_txn()) {
    if (int rc = journal_->commit(); rc) return rc;
  }
  return errno_of(fl.flush_to(gen));
}

}  // namespace warpfs::fs
