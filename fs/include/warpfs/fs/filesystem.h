// The warpfs filesystem core: inodes, hashed directories, extents, the group allocator and
// the metadata journal over a BlockDevice (fs/FORMAT.md). The FUSE daemon (fs/daemon/) is a
// thin translation of libfuse's low-level requests into these calls; tests drive it directly.
//
// Errors are returned as positive errno values (0 = success), the way FUSE replies carry
// them. A metadata block that fails its checksum gives EIO and a log line naming the block.
//
// Thread-safety: every method may be called from any number of threads at once. Lock order
// (outermost first), written once here:
//   1. namespace_mu_     namespace changes (create, link, unlink, rename, inode freeing)
//   2. Node::rw          one per inode; several only under namespace_mu_, or two without
//                        it, in inode-number order (copy_file_range, dedupe_range: share.cc)
//   3. the journal gate  a running transaction (never held while waiting for 1 or 2)
//   4. leaf locks        allocator groups, metadata cache (and its PagePool), node table,
//                        Node::attr_mu, Node::written_mu, FsImpl::times_mu_
#pragma once

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "warpfs/blockdev/block_device.h"
#include "warpfs/fs/format.h"

namespace warpfs::fs {

using Ino = uint64_t;

struct Attr {
  Ino ino = 0;
  uint32_t mode = 0, nlink = 0, uid = 0, gid = 0, generation = 0;
  uint64_t rdev = 0;
  uint64_t size = 0;
  uint64_t blocks = 0;           // 512-byte units, as st_blocks
  TimeSpec atime, mtime, ctime;  // exact, any int64 seconds (FORMAT.md "Inode" times)
  void to_stat(struct stat* st) const;
};

// setattr: which fields to change (FUSE_SET_ATTR_* in spirit).
struct SetAttr {
  bool mode = false, uid = false, gid = false, size = false, atime = false, mtime = false;
  bool atime_now = false, mtime_now = false;  // UTIME_NOW
  // An explicit ctime: only the kernel's FUSE writeback cache sends one (its own times of
  // buffered writes, with the mtime); otherwise a change sets ctime to now.
  bool ctime = false;
  // With a size: the truncate's caller lacks CAP_FSETID, so set-user-ID goes, and
  // set-group-ID with group execute (the kernel's FATTR_KILL_SUIDGID under
  // FUSE_HANDLE_KILLPRIV_V2, which leaves that drop to the filesystem).
  bool kill_suidgid = false;
  uint32_t new_mode = 0, new_uid = 0, new_gid = 0;
  uint64_t new_size = 0;
  TimeSpec new_atime, new_mtime, new_ctime;  // any int64 seconds, nsec 0..999999999
};

// Whose write a write is. kWriter: the writer's own (every write without FUSE's writeback
// cache, and O_DIRECT): it sets mtime and ctime to now and drops set-user-ID, set-group-ID and
// security.capability. kPageCache: the write-back of pages of the kernel's page cache under
// FUSE_CAP_WRITEBACK_CACHE, long after the write(2) or the store into a mapping: the kernel
// set the times then (it sends them later with a setattr, SetAttr::ctime) and dropped the
// privileges then (a setattr of the mode, a removexattr), so only the data and a size that
// grows change here. On an append-only file such a write may cover bytes below the size (the
// page that holds the old end) as long as it leaves them as they are.
enum class WriteFrom { kWriter, kPageCache };

// Where a read's data is meant to stay. kCache: in the device's cache too (a reader with no
// cache of its own). kDirect: a reader that keeps its own copy (an O_DIRECT reader, the
// kernel's page cache: every read of the FUSE daemon): blocks the device's cache does not
// hold go from the device to the caller's buffer without taking a cache line
// (BlockDevice::read_uncached), as the kernel's direct reads leave its page cache alone.
enum class ReadFor { kCache, kDirect };

struct MountOptions {
  bool read_only = false;
  // Commit the running transaction at least this often (ext4's commit=5); 0: the
  // superblock's commit_interval_s (tune.warpfs --commit), or 5 s where that is 0.
  uint32_t commit_interval_ms = 0;
  // Issue Dataset Management (trim) for blocks once their freeing commits.
  bool discard = true;
  // The metadata cache's cap in MiB (inode tables, directory, extent-tree and xattr blocks;
  // 0: none). Beyond it, clean blocks are dropped, least recently used first; blocks of
  // inodes the kernel has forgotten are dropped whatever the size. The running
  // transaction's dirty blocks (at most the journal's capacity) come on top.
  uint32_t meta_cache_mb = 32;
  // For crash testing only: commit at the end of every transaction scope (Journal::Txn),
  // not only at fsync, the interval or a full journal. An operation that spans several
  // scopes must leave a consistent filesystem between any two of them; with this set, a
  // power cut finds each such state on the device. Slow: one flush per scope.
  bool commit_every_transaction = false;
  std::function<void(const std::string&)> log;  // errors and notices; default: stderr
};

// Who asks: for ownership of new inodes (permissions are checked by the kernel through
// default_permissions).
struct Caller {
  uint32_t uid = 0, gid = 0;
  // The creating process's umask: applied to a new inode's mode unless its directory has a
  // default ACL, which masks it instead (POSIX.1e; acl.cc).
  uint32_t umask = 0;
};

// Whom the calling thread's file-data allocations are for, as a kernel filesystem reads the
// current task's credentials: an allocation for a caller other than root, the superblock's
// reserved_uid or a member of reserved_gid stops short of the blocks kept for root (FORMAT.md
// "Reserved blocks"). The daemon names each writing request's caller for the length of the
// call; a thread that names none (the tools, the in-process tests) allocates as root.
// Thread-local: each thread's scope is its own, so no two workers share one.
class CallerScope {
 public:
  explicit CallerScope(const Caller& c);
  ~CallerScope();
  CallerScope(const CallerScope&) = delete;
  CallerScope& operator=(const CallerScope&) = delete;
  // The calling thread's caller, or nullptr (root) outside any scope.
  static const Caller* current();

 private:
  const Caller* outer_;
  Caller caller_;
};

// One readdir entry: name, inode, type (DT_*), and the offset to resume after it.
struct DirEntry {
  std::string name;
  Ino ino;
  uint8_t type;
  uint64_t next_offset;
};

struct FsStats {
  uint64_t commits = 0, journal_blocks_written = 0, checkpoint_blocks = 0;
  uint64_t meta_reads = 0, meta_cached = 0, checksum_errors = 0;
  uint64_t trims = 0, trimmed_blocks = 0;
  uint64_t orphans_freed_at_mount = 0, replayed_transactions = 0;
  uint64_t nodes = 0;                           // inodes in the node table (the kernel's)
  uint64_t meta_buffers = 0, meta_evicted = 0;  // the metadata cache: now, dropped so far
  uint32_t commit_interval_ms = 0;  // in force: the mount's, else the superblock's, else 5 s
  bool read_only = false;           // now (a remount changes it)
  bool discard = false;             // freed blocks are trimmed
  uint32_t meta_cache_mb = 0;       // the metadata cache's cap
  // Shared blocks (FORMAT.md "Shared blocks"): blocks mapped more than once, and the blocks
  // that saves (the sum of count - 1 over them).
  uint64_t shared_blocks = 0, saved_blocks = 0;
  uint64_t clones = 0, cloned_blocks = 0, cow_blocks = 0;  // since mount
  uint64_t deduped_blocks = 0;                             // since mount
};

// The deduplication pass (Filesystem::dedup; FORMAT.md "Deduplication").
struct DedupOptions {
  size_t table_mb = 64;        // the hash table's bound: past it, new hashes are not kept
  std::function<bool()> stop;  // asked between files: true ends the pass early
};
struct DedupReport {
  uint64_t files = 0;          // regular files read
  uint64_t blocks_hashed = 0;  // written blocks hashed
  uint64_t candidates = 0;     // blocks whose hash was seen before at another block
  uint64_t blocks_shared = 0;  // of those, now pointing at the earlier block
  // Of those, not shared: unequal bytes (or changed since they were read), already one
  // block, or a block at the highest count.
  uint64_t not_shared = 0;
  uint64_t table_full = 0;  // hashes not kept: the table was at its bound
  double seconds = 0;
};
struct InodeReport {
  Inode disk{};
  std::vector<Extent> extents;
  std::vector<uint64_t> tree_blocks;
};

class Filesystem {
 public:
  // Mounts the filesystem on `dev`: validates the superblock (falling back to the backup),
  // replays the journal, frees orphans, marks the superblock dirty (unless read-only).
  static std::unique_ptr<Filesystem> mount(blockdev::BlockDevice& dev, const MountOptions& o,
                                           std::string* error);
  virtual ~Filesystem() = default;
  Filesystem(const Filesystem&) = delete;
  Filesystem& operator=(const Filesystem&) = delete;

  // Commits everything, writes the superblock (and its backup) clean. Idempotent; the
  // destructor calls it. Returns 0 or EIO.
  [[nodiscard]] virtual int unmount() = 0;

  // Names. A successful lookup/mknod/mkdir/symlink/link/create counts one kernel reference
  // on the inode returned (FUSE's lookup count); forget() drops them.
  // "." of any inode and ".." of a directory are what a file handle is decoded through (the
  // kernel's export operations, FUSE_CAP_EXPORT_SUPPORT): "." of an inode not in use or with
  // no name left is ESTALE, as ext4 answers a stale handle.
  [[nodiscard]] virtual int lookup(Ino parent, std::string_view name, Attr* out) = 0;
  virtual void forget(Ino ino, uint64_t n) = 0;
  // The attributes of an inode, counting one kernel reference (readdirplus entries).
  [[nodiscard]] virtual int lookup_ino(Ino ino, Attr* out) = 0;
  [[nodiscard]] virtual int getattr(Ino ino, Attr* out) = 0;
  [[nodiscard]] virtual int setattr(Ino ino, const SetAttr& s, Attr* out) = 0;
  [[nodiscard]] virtual int mknod(Ino parent, std::string_view name, uint32_t mode, uint64_t rdev,
                                  const Caller& c, Attr* out) = 0;
  [[nodiscard]] virtual int mkdir(Ino parent, std::string_view name, uint32_t mode, const Caller& c,
                                  Attr* out) = 0;
  [[nodiscard]] virtual int symlink(Ino parent, std::string_view name, std::string_view target,
                                    const Caller& c, Attr* out) = 0;
  [[nodiscard]] virtual int readlink(Ino ino, std::string* target) = 0;
  [[nodiscard]] virtual int link(Ino ino, Ino new_parent, std::string_view new_name, Attr* out) = 0;
  [[nodiscard]] virtual int unlink(Ino parent, std::string_view name) = 0;
  [[nodiscard]] virtual int rmdir(Ino parent, std::string_view name) = 0;
  // flags: RENAME_NOREPLACE, RENAME_EXCHANGE (linux/fs.h values).
  [[nodiscard]] virtual int rename(Ino parent, std::string_view name, Ino new_parent,
                                   std::string_view new_name, unsigned flags) = 0;

  // Files. open/release count users of an inode: an unlinked inode lives until the last.
  [[nodiscard]] virtual int open(Ino ino, int flags) = 0;
  virtual void release(Ino ino) = 0;
  [[nodiscard]] virtual int read(Ino ino, uint64_t off, size_t len, char* buf, size_t* got,
                                 ReadFor purpose = ReadFor::kCache) = 0;
  // A read in flight from read_start(), polled to its end by whoever holds it (one thread at
  // a time; it may pass between threads where a lock or a queue orders their uses). Until it
  // ends, the blocks it reads stay the file's: a truncate, a punch, or any other change that
  // takes the file's lock exclusive waits for it, so that it never returns another file's
  // data. So it must be polled to its end (or destroyed, which waits for it) by a thread
  // that does not wait for that lock meanwhile.
  class PendingRead {
   public:
    virtual ~PendingRead() = default;
    // True once the read has ended; result() then says how.
    virtual bool poll() = 0;
    // Sleeps (bounded) or backs off until it may have ended: after a poll() that said no;
    // `b` is the caller's, reset by it when a poll succeeds.
    virtual void idle(port::Backoff& b) = 0;
    // 0 and the bytes read (*got), or an errno. REQUIRES: poll() returned true.
    virtual int result(size_t* got) const = 0;
  };
  // read(..., ReadFor::kDirect) in two halves, for a caller that answers a request when its
  // data is in and meanwhile serves others (the FUSE daemon, so that no worker waits out the
  // device's latency). Where device reads are still in flight on return, `*pending` is set
  // and `buf` must stay until its poll() returns true; the result comes from it then.
  // Otherwise the read has ended: `*pending` is empty and the return and *got are read()'s.
  // `room`: the bytes buf holds, which may be more than len: whole blocks are read into it
  // (a file's partial last block included) when it has room for them. Default: read().
  [[nodiscard]] virtual int read_start(Ino ino, uint64_t off, size_t len, char* buf, size_t room,
                                       size_t* got, std::unique_ptr<PendingRead>* pending) {
    (void)room;
    pending->reset();
    return read(ino, off, len, buf, got, ReadFor::kDirect);
  }
  // A write clears set-user-ID (and set-group-ID on a group-executable file), as the kernel's
  // filesystems do for a writer without CAP_FSETID; *dropped_privs (when given) says whether
  // this one did, so that a FUSE daemon can tell the kernel, whose cached mode is stale then.
  // WriteFrom::kPageCache: neither times nor privileges (see WriteFrom).
  [[nodiscard]] virtual int write(Ino ino, uint64_t off, size_t len, const char* buf,
                                  size_t* written, bool* dropped_privs = nullptr,
                                  WriteFrom from = WriteFrom::kWriter) = 0;
  [[nodiscard]] virtual int fsync(Ino ino, bool datasync) = 0;
  [[nodiscard]] virtual int fallocate(Ino ino, int mode, uint64_t off, uint64_t len) = 0;
  [[nodiscard]] virtual int lseek(Ino ino, uint64_t off, int whence, uint64_t* out) = 0;
  // copy_file_range(2) from `in` to `out` (the same inode: the ranges may not overlap,
  // EINVAL): up to `len` bytes, fewer at in's end (0 at or past it); *copied says how many.
  // Whole blocks are shared, not copied (FORMAT.md "Shared blocks"), where both offsets lie
  // alike in a block and the filesystem has the shared_blocks feature; the rest is copied.
  // A last partial block at in's end is shared too when it becomes out's end. `out` grows to
  // cover the range and loses set-user-ID as a write's target does. Not atomic: a failure or
  // crash part way leaves a part copied; in the shared part, out's old blocks go in
  // transactions before the new ones are mapped, so a crash between them leaves a hole
  // (zeroes) where the copy had not arrived, not out's old bytes.
  [[nodiscard]] virtual int copy_file_range(Ino in, uint64_t off_in, Ino out, uint64_t off_out,
                                            uint64_t len, uint64_t* copied) = 0;
  // FIDEDUPERANGE for one destination: the whole blocks of [off_out, off_out + len) of `out`
  // that equal, byte for byte, those of `in` at off_in come to share in's blocks (both offsets
  // block-aligned; len rounded down to blocks). *deduped: bytes now shared. EOPNOTSUPP without
  // the shared_blocks feature.
  [[nodiscard]] virtual int dedupe_range(Ino in, uint64_t off_in, Ino out, uint64_t off_out,
                                         uint64_t len, uint64_t* deduped) = 0;
  // The deduplication pass over every regular file (FORMAT.md "Deduplication"), beside any
  // other operation. EOPNOTSUPP without the shared_blocks feature, EROFS read-only.
  [[nodiscard]] virtual int dedup(const DedupOptions& o, DedupReport* out) = 0;
  // The reference count of device block `block` (FORMAT.md "Shared blocks"): 0 where it is
  // not shared (one owner or none), else the number of extents that map it.
  virtual uint32_t block_refs(uint64_t block) = 0;
  // An inode as stored (dump.warpfs): its record, its extents in logical order and the
  // blocks of its extent tree (index and leaf blocks; none while the extents fit in the
  // inode), as of the last change. Read-only.
  [[nodiscard]] virtual int inspect(Ino ino, InodeReport* out) = 0;
  // Inode flags as FS_IOC_GETFLAGS/SETFLAGS carry them (linux/fs.h FS_*_FL): immutable and
  // append-only (FORMAT.md "Inode"); set_flags refuses other bits with EOPNOTSUPP. Who may
  // change them (CAP_LINUX_IMMUTABLE) is the kernel's check, before the call.
  [[nodiscard]] virtual int get_flags(Ino ino, uint32_t* fs_flags) = 0;
  [[nodiscard]] virtual int set_flags(Ino ino, uint32_t fs_flags) = 0;

  // Directories. readdir returns entries from `offset` (0 = the start; "." and ".." first)
  // until `emit` returns false; offsets stay valid while entries come and go.
  [[nodiscard]] virtual int opendir(Ino ino) = 0;
  [[nodiscard]] virtual int readdir(Ino ino, uint64_t offset,
                                    const std::function<bool(const DirEntry&)>& emit) = 0;

  // Extended attributes. getxattr/listxattr with size 0 report the size needed.
  [[nodiscard]] virtual int setxattr(Ino ino, std::string_view name, const void* value, size_t size,
                                     int flags) = 0;
  [[nodiscard]] virtual int getxattr(Ino ino, std::string_view name, std::string* value) = 0;
  [[nodiscard]] virtual int listxattr(Ino ino, std::string* names) = 0;  // NUL-separated
  [[nodiscard]] virtual int removexattr(Ino ino, std::string_view name) = 0;

  [[nodiscard]] virtual int statfs(struct statvfs* out) = 0;
  [[nodiscard]] virtual int sync() = 0;  // commit the running transaction and flush the device
  // Commits, then drops every cached metadata block it can: those of inodes the kernel has
  // forgotten, and beyond the cap the least recently used (what the committer does on its
  // own after commits and under pressure).
  virtual void shrink_caches() = 0;
  virtual FsStats stats() const = 0;
  virtual bool read_only() const = 0;
  // Remount (mount -o remount,ro|rw): read-only commits everything and leaves the image
  // clean, as an unmount does, and refuses changes from then on (EROFS); read-write marks it
  // dirty again and takes changes. REQUIRES: not after unmount(); and (unchecked) no
  // modifying call under way (the kernel stops writers first: its remount to read-only fails
  // while a file is open for writing). Orphans wait for the next read-write mount. 0, or EIO.
  [[nodiscard]] virtual int set_read_only(bool read_only) = 0;

 protected:
  Filesystem() = default;
};

}  // namespace warpfs::fs
