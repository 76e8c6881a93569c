// Names: lookup, create (mknod, mkdir, symlink), link, unlink, rmdir, rename, and the
// attribute calls. Changes to names run under namespace_mu_ (filesystem.h), which is what
// lets them lock several inodes in any order.
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "internal.h"

namespace warpfs::fs {

namespace {

uint8_t dtype(uint32_t mode) {
  return static_cast<uint8_t>((mode >> 12) & 017);
}
constexpr uint32_t kMaxLinks = 65000;
constexpr size_t kMaxSymlink = kBlockSize - 1;

}  // namespace

int FsImpl::check_name(std::string_view name) {
  if (name.empty()) return ENOENT;
  if (name.size() > kMaxName) return ENAMETOOLONG;
  if (name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos)
    return EINVAL;
  return 0;
}

int FsImpl::check_writable() const {
  if (ro_) return EROFS;
  if (journal_->failed()) return EROFS;  // after a journal I/O error, as ext4's errors=remount-ro
  return 0;
}

int FsImpl::lookup(Ino parent, std::string_view name, Attr* out) {
  if (name.size() > kMaxName) return ENAMETOOLONG;
  if (name == ".") {
    // A file handle's inode (any type): live and named, or the handle is stale.
    NodeRef n;
    if (int rc = get_node(parent, &n); rc) return rc == ENOENT || rc == EINVAL ? ESTALE : rc;
    std::lock_guard<Mutex> g(namespace_mu_);  // no unlink between the check and the reference
    {
      std::shared_lock<SharedMutex> lk(n->rw);
      if (n->disk.links == 0 || n->disk.mode == 0) return ESTALE;
    }
    ref(*n, 1, 0);
    {
      std::lock_guard<std::mutex> ag(n->attr_mu);
      fill_attr(n->pub, parent, out);
    }
    exact_times_unlocked(*n, out);
    return 0;
  }
  NodeRef dir;
  if (int rc = get_node(parent, &dir); rc) return rc;
  Ino ino;
  NodeRef n;
  {
    // The entry, the node it names and the kernel's reference on it, all under the
    // directory's lock: an unlink (which needs the lock exclusive) then comes wholly before,
    // and the name is gone, or after, and the reference keeps the inode from being freed
    // (and its number reused) until the kernel forgets it.
    std::shared_lock<SharedMutex> lk;
    if (int rc = lock_mapped(*dir, &lk); rc) return rc;
    if (!S_ISDIR(dir->disk.mode)) return ENOTDIR;
    if (name == ".") {
      ino = parent;
    } else if (name == "..") {
      ino = dir->disk.parent;
    } else {
      uint8_t type;
      if (int rc = dir_find(*dir, name, &ino, &type); rc) return rc;
    }
    if (int rc = get_node(ino, &n); rc) {
      if (rc == ENOENT) {
        log("directory " + std::to_string(parent) + ": entry '" + std::string(name) +
            "' names free inode " + std::to_string(ino) + " (run fsck.warpfs)");
        return EIO;
      }
      return rc;
    }
    ref(*n, 1, 0);
  }
  {
    std::lock_guard<std::mutex> g(n->attr_mu);
    fill_attr(n->pub, ino, out);
  }
  exact_times_unlocked(*n, out);
  return 0;
}

namespace {
// Counts a forget() or release() under way (free_held_blocks waits for them).
class Reclaiming {
 public:
  Reclaiming(std::mutex& mu, std::condition_variable& cv, int& n) : mu_(mu), cv_(cv), n_(n) {
    std::lock_guard<std::mutex> g(mu_);
    ++n_;
  }
  ~Reclaiming() {
    {
      std::lock_guard<std::mutex> g(mu_);
      --n_;
    }
    cv_.notify_all();
  }

 private:
  std::mutex& mu_;
  std::condition_variable& cv_;
  int& n_;
};
}  // namespace

bool FsImpl::free_held_blocks() {
  WARPFS_DCHECK(!journal_->in_transaction(), "free_held_blocks: not in a transaction");
  {
    std::unique_lock<std::mutex> g(reclaim_mu_);
    reclaim_cv_.wait_for(g, std::chrono::milliseconds(200), [&] { return reclaiming_ == 0; });
  }
  if (held_blocks_.load(std::memory_order_relaxed) == 0) return false;
  return journal_->commit() == 0;
}

void FsImpl::forget(Ino ino, uint64_t count) {
  Reclaiming r(reclaim_mu_, reclaim_cv_, reclaiming_);
  {
    std::lock_guard<Mutex> g(table_mu_);
    auto it = nodes_.find(ino);
    if (it == nodes_.end()) return;
    Node& n = *it->second;
    n.nlookup = count > n.nlookup ? 0 : n.nlookup - count;
  }
  maybe_reclaim(ino);
}

int FsImpl::getattr(Ino ino, Attr* out) {
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  {
    std::lock_guard<std::mutex> g(n->attr_mu);
    fill_attr(n->pub, ino, out);
  }
  exact_times_unlocked(*n, out);
  return 0;
}

int FsImpl::setattr(Ino ino, const SetAttr& s, Attr* out) {
  if (int rc = check_writable(); rc) return rc;
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::unique_lock<SharedMutex> lk(n->rw);
  Inode& d = n->disk;
  // As notify_change(): nothing on an immutable inode; on an append-only one no size, mode,
  // owner or explicit time (setting the times to now is an append's own). An mtime that comes
  // with a ctime is the kernel's writeback cache handing over the times of its appends (it
  // sends utimensat's UTIME_NOW so too, and an explicit time alike: warpfs(8) says so).
  if (immutable(d)) return EPERM;
  if (append_only(d) && (s.size || s.mode || s.uid || s.gid || (s.atime && !s.atime_now) ||
                         (s.mtime && !s.mtime_now && !s.ctime))) {
    return EPERM;
  }
  if (s.size) {
    if (S_ISDIR(d.mode)) return EISDIR;
    if (!S_ISREG(d.mode)) return EINVAL;
    if (s.kill_suidgid && !s.mode && set_id_bits_to_drop(d.mode) != 0) {
      // First, in a transaction of its own, as for an O_TRUNC open: a crash between the two
      // leaves the privileges dropped, never a truncated file that keeps them.
      Journal::Txn t(*journal_);
      d.mode &= ~set_id_bits_to_drop(d.mode);
      d.ctime_ns = now_ns();
      if (int rc = store(*n); rc) return rc;
    }
    if (s.new_size != d.size) {
      if (int rc = set_size(*n, s.new_size); rc) return rc;
    }
  }
  if ((s.atime && !s.atime_now && (s.new_atime.nsec < 0 || s.new_atime.nsec > 999999999)) ||
      (s.mtime && !s.mtime_now && (s.new_mtime.nsec < 0 || s.new_mtime.nsec > 999999999)) ||
      (s.ctime && (s.new_ctime.nsec < 0 || s.new_ctime.nsec > 999999999))) {
    return EINVAL;
  }
  {
    Journal::Txn t(*journal_);
    fold_times(*n);  // an overwrite's times first: those set here replace them
    const uint64_t now = now_ns();
    uint64_t atime = s.atime ? (s.atime_now ? now : time_ns_from(s.new_atime)) : d.atime_ns;
    uint64_t mtime =
        s.mtime ? (s.mtime_now ? now : time_ns_from(s.new_mtime)) : (s.size ? now : d.mtime_ns);
    if (!xattr_chains()) {  // older code knows no internal record: the nearest end, as it did
      atime = time_clamped(atime);
      mtime = time_clamped(mtime);
    }
    // A time out of range (only utimensat sets one): exact in the internal record, first,
    // so that a failure (ENOSPC) changes nothing. Entries of fields that keep a sentinel
    // stay; store() drops the record when no field holds one (FORMAT.md "Inode").
    const bool a_out = s.atime && time_sentinel(atime), m_out = s.mtime && time_sentinel(mtime);
    if (a_out || m_out) {
      TimesRecord r{};
      if (n->times_record && times_record(*n, &r) != 0) r = TimesRecord{};
      if (a_out) r.t[0] = {s.new_atime.sec, static_cast<uint32_t>(s.new_atime.nsec), 0};
      if (m_out) r.t[1] = {s.new_mtime.sec, static_cast<uint32_t>(s.new_mtime.nsec), 0};
      const std::string v(reinterpret_cast<const char*>(&r), sizeof r);
      if (int rc = xattr_set_locked(*n, kXattrInternal, kTimesRecordName, v); rc) return rc;
      n->times_record = true;
    }
    if (s.mode) {
      d.mode = (d.mode & S_IFMT) | (s.new_mode & 07777);
      // An access ACL follows the new mode (posix_acl_chmod; the kernel forgets its copy).
      std::string a;
      if (xattr_get_locked(*n, kXattrSystem, kAclAccess, &a) == 0 && acl::chmod(&a, d.mode)) {
        if (int rc = xattr_set_locked(*n, kXattrSystem, kAclAccess, a); rc) return rc;
      }
    }
    if (s.uid || s.gid) {
      if (s.uid) d.uid = s.new_uid;
      if (s.gid) d.gid = s.new_gid;
      // chown clears set-user-ID and set-group-ID on non-directories (POSIX).
      if (!S_ISDIR(d.mode) && !s.mode) d.mode &= ~static_cast<uint32_t>(S_ISUID | S_ISGID);
    } else if (S_ISREG(d.mode) && !s.mode && !s.size && !s.atime && !s.mtime && !s.ctime) {
      // A setattr that sets nothing: chown(f, -1, -1), or the privilege drop before a write
      // (notify_change with only ATTR_KILL_*, which FUSE_HANDLE_KILLPRIV_V2 leaves to the
      // filesystem). Set-user-ID goes, and set-group-ID where the group may execute.
      d.mode &= ~set_id_bits_to_drop(d.mode);
    }
    d.atime_ns = atime;
    d.mtime_ns = mtime;
    d.ctime_ns = s.ctime ? time_clamped(time_ns_from(s.new_ctime)) : now;
    if (int rc = store(*n); rc) return rc;
  }
  fill_attr(d, ino, out);
  exact_times(*n, d, out);
  return 0;
}

int FsImpl::create_common(Ino parent, std::string_view name, uint32_t mode, const Caller& c,
                          std::string_view target, Attr* out, uint64_t rdev) {
  return retry_enospc([&] { return create_locked(parent, name, mode, c, target, out, rdev); });
}

int FsImpl::create_locked(Ino parent, std::string_view name, uint32_t mode, const Caller& c,
                          std::string_view target, Attr* out, uint64_t rdev) {
  if (int rc = check_writable(); rc) return rc;
  if (int rc = check_name(name); rc) return rc;
  if (name == "." || name == "..") return EEXIST;
  if (S_ISLNK(mode) && target.size() > kMaxSymlink) return ENAMETOOLONG;
  if (S_ISLNK(mode) && target.empty()) return ENOENT;
  std::lock_guard<Mutex> ns(namespace_mu_);
  NodeRef dir;
  if (int rc = get_node(parent, &dir); rc) return rc;
  std::unique_lock<SharedMutex> dlk(dir->rw);
  if (!S_ISDIR(dir->disk.mode)) return ENOTDIR;
  if (dir->disk.links == 0) return ENOENT;  // removed while someone was inside
  if (immutable(dir->disk)) return EPERM;   // an append-only directory takes new names
  if (S_ISDIR(mode) && dir->disk.links >= kMaxLinks) return EMLINK;
  if (int rc = load_map(*dir); rc) return rc;
  Ino existing;
  uint8_t type;
  if (int rc = dir_find(*dir, name, &existing, &type); rc != ENOENT) return rc ? rc : EEXIST;

  Caller owner = c;
  if (dir->disk.mode & S_ISGID) {
    // A set-group-ID directory hands its group down, and to subdirectories the bit too.
    owner.gid = dir->disk.gid;
    if (S_ISDIR(mode)) mode |= S_ISGID;
  }
  // The permission bits: masked by the umask, or by the directory's default ACL, which the
  // new inode inherits (acl.cc). Symlinks have neither.
  std::string default_acl, access_acl;
  if (!S_ISLNK(mode)) {
    const int arc = xattr_get_locked(*dir, kXattrSystem, kAclDefault, &default_acl);
    if (arc != 0 && arc != ENODATA) return arc;
    if (arc == ENODATA) {
      mode &= ~(c.umask & 0777);
    } else if (!acl::inherit(default_acl, &mode, &access_acl)) {
      log("directory " + std::to_string(parent) + ": its default ACL is damaged (run fsck.warpfs)");
      return EIO;
    }
  }
  Journal::Txn t(*journal_);
  NodeRef n;
  if (int rc = new_node(parent, mode, owner, &n); rc) return rc;
  // The new node is not locked: nobody can reach it before its name exists and the reply
  // reaches the kernel (and locking it after the directory would break NodeLocks' order).
  Inode& d = n->disk;
  d.rdev = rdev;
  int rc = 0;
  if (S_ISDIR(mode)) {
    d.links = 2;
    rc = dir_init(*n, parent);
  } else if (S_ISLNK(mode)) {
    d.size = target.size();
    if (target.size() <= Inode::kInlineSymlinkMax) {
      d.flags |= Inode::kFlagInlineSymlink;
      std::memcpy(d.root.symlink, target.data(), target.size());
    } else {
      uint64_t phys;
      uint32_t got;
      std::vector<uint8_t> block(kBlockSize, 0);
      std::memcpy(block.data(), target.data(), target.size());
      if ((rc = alloc_blocks(alloc_goal(*n, 0), 1, &phys, &got)) == 0) {
        if (const blockdev::Status st = dev_.write(phys, 1, block.data()); !st.is_ok()) {
          free_blocks(phys, 1);
          rc = errno_of(st);
        } else if ((rc = map_insert(*n, Extent{0, 1, phys})) != 0) {
          free_blocks(phys, 1);
        } else {
          d.blocks = 1;
        }
      }
    }
  }
  if (rc == 0 && !access_acl.empty())
    rc = xattr_set_locked(*n, kXattrSystem, kAclAccess, access_acl);
  if (rc == 0 && S_ISDIR(mode) && !default_acl.empty()) {
    rc = xattr_set_locked(*n, kXattrSystem, kAclDefault, default_acl);
  }
  if (rc == 0) rc = map_store(*n);
  if (rc == 0) rc = dir_add(*dir, name, n->ino, dtype(mode));
  if (rc != 0) {
    // Undo: give back the inode and anything it got (the transaction keeps it atomic). The
    // caller hears the create's error; an undo that fails too leaves an inode no name
    // reaches, which fsck frees.
    int urc = punch(*n, 0, uint64_t{1} << 32);
    xattr_free_all(*n);  // an inherited ACL
    if (int frc = free_inode(*n); frc && !urc) urc = frc;
    if (urc) {
      log("inode " + std::to_string(n->ino) + ": undoing a failed create failed (run fsck.warpfs)");
    }
#if WARPFS_DEBUG_CHECKS
    n->creating.store(false, std::memory_order_relaxed);
#endif
    std::lock_guard<Mutex> g(table_mu_);
    nodes_.erase(n->ino);
    ++table_epoch_;
    return rc;
  }
#if WARPFS_DEBUG_CHECKS
  n->creating.store(false, std::memory_order_relaxed);  // named: others reach it from here on
#endif
  if (S_ISDIR(mode)) dir->disk.links += 1;
  dir->disk.mtime_ns = dir->disk.ctime_ns = d.ctime_ns;
  if ((rc = store(*dir))) return rc;
  ref(*n, 1, 0);
  fill_attr(d, n->ino, out);
  return 0;
}

int FsImpl::mknod(Ino parent, std::string_view name, uint32_t mode, uint64_t rdev, const Caller& c,
                  Attr* out) {
  if (S_ISDIR(mode) || S_ISLNK(mode)) return EINVAL;
  if (!S_ISREG(mode) && !S_ISFIFO(mode) && !S_ISSOCK(mode) && !S_ISCHR(mode) && !S_ISBLK(mode)) {
    mode = (mode & 07777) | S_IFREG;
  }
  if (!S_ISCHR(mode) && !S_ISBLK(mode)) rdev = 0;
  return create_common(parent, name, mode, c, {}, out, rdev);
}

int FsImpl::mkdir(Ino parent, std::string_view name, uint32_t mode, const Caller& c, Attr* out) {
  return create_common(parent, name, S_IFDIR | (mode & 07777), c, {}, out);
}

int FsImpl::symlink(Ino parent, std::string_view name, std::string_view target, const Caller& c,
                    Attr* out) {
  return create_common(parent, name, S_IFLNK | 0777, c, target, out);
}

int FsImpl::readlink(Ino ino, std::string* target) {
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::shared_lock<SharedMutex> lk;
  if (int rc = lock_mapped(*n, &lk); rc) return rc;
  const Inode& d = n->disk;
  if (!S_ISLNK(d.mode)) return EINVAL;
  if (d.size > kMaxSymlink) return EIO;
  if (d.flags & Inode::kFlagInlineSymlink) {
    target->assign(d.root.symlink, std::min<uint64_t>(d.size, Inode::kInlineSymlinkMax));
    return 0;
  }
  const Mapping m = map_lookup(*n, 0);
  if (m.hole) return EIO;
  std::vector<uint8_t> block(kBlockSize);
  if (const blockdev::Status st = dev_.read(m.physical, 1, block.data()); !st.is_ok())
    return errno_of(st);
  target->assign(reinterpret_cast<const char*>(block.data()), d.size);
  return 0;
}

int FsImpl::link(Ino ino, Ino new_parent, std::string_view new_name, Attr* out) {
  return retry_enospc([&] { return link_once(ino, new_parent, new_name, out); });
}

int FsImpl::link_once(Ino ino, Ino new_parent, std::string_view new_name, Attr* out) {
  if (int rc = check_writable(); rc) return rc;
  if (int rc = check_name(new_name); rc) return rc;
  std::lock_guard<Mutex> ns(namespace_mu_);
  NodeRef dir, n;
  if (int rc = get_node(new_parent, &dir); rc) return rc;
  if (int rc = get_node(ino, &n); rc) return rc;
  NodeLocks locks(namespace_mu_, {dir.get(), n.get()});
  if (!S_ISDIR(dir->disk.mode)) return ENOTDIR;
  if (dir->disk.links == 0) return ENOENT;
  if (S_ISDIR(n->disk.mode)) return EPERM;
  if (n->disk.links == 0) return ENOENT;
  if (immutable(dir->disk) || pinned(n->disk)) return EPERM;
  if (n->disk.links >= kMaxLinks) return EMLINK;
  if (int rc = load_map(*dir); rc) return rc;
  Ino existing;
  uint8_t type;
  if (int rc = dir_find(*dir, new_name, &existing, &type); rc != ENOENT) return rc ? rc : EEXIST;
  Journal::Txn t(*journal_);
  if (int rc = dir_add(*dir, new_name, ino, dtype(n->disk.mode)); rc) return rc;
  const uint64_t now = now_ns();
  n->disk.links += 1;
  n->disk.ctime_ns = now;
  dir->disk.mtime_ns = dir->disk.ctime_ns = now;
  if (int rc = store(*n); rc) return rc;
  if (int rc = store(*dir); rc) return rc;
  ref(*n, 1, 0);
  fill_attr(n->disk, ino, out);
  exact_times(*n, n->disk, out);
  return 0;
}

int FsImpl::unlink_common(Ino parent, std::string_view name, bool rmdir) {
  if (int rc = check_writable(); rc) return rc;
  if (name.size() > kMaxName) return ENAMETOOLONG;
  if (name == ".") return EINVAL;
  if (name == "..") return ENOTEMPTY;
  NodeRef n;
  {
    std::lock_guard<Mutex> ns(namespace_mu_);
    NodeRef dir;
    if (int rc = get_node(parent, &dir); rc) return rc;
    Ino ino;
    {
      std::unique_lock<SharedMutex> dlk(dir->rw);
      if (!S_ISDIR(dir->disk.mode)) return ENOTDIR;
      if (int rc = load_map(*dir); rc) return rc;
      uint8_t type;
      if (int rc = dir_find(*dir, name, &ino, &type); rc) return rc;
    }
    // Names only change under namespace_mu_: the entry is still there once both are locked.
    if (int rc = get_node(ino, &n); rc) return rc == ENOENT ? EIO : rc;
    NodeLocks locks(namespace_mu_, {dir.get(), n.get()});
    const bool is_dir = S_ISDIR(n->disk.mode);
    if (rmdir && !is_dir) return ENOTDIR;
    if (!rmdir && is_dir) return EISDIR;
    if (pinned(dir->disk) || pinned(n->disk)) return EPERM;  // as may_delete()
    if (is_dir) {
      if (int rc = load_map(*n); rc) return rc;
      bool empty;
      if (int rc = dir_is_empty(*n, &empty); rc) return rc;
      if (!empty) return ENOTEMPTY;
    }
    Journal::Txn t(*journal_);
    if (int rc = dir_remove(*dir, name); rc) return rc;
    const uint64_t now = now_ns();
    if (is_dir) {
      n->disk.links = 0;
      dir->disk.links -= 1;
    } else {
      n->disk.links -= 1;
    }
    n->disk.ctime_ns = now;
    dir->disk.mtime_ns = dir->disk.ctime_ns = now;
    if (int rc = store(*dir); rc) return rc;
    // The last name: the inode lives on the orphan list until its last user lets go.
    if (n->disk.links == 0) {
      if (int rc = orphan_add(*n); rc) return rc;
    } else if (int rc = store(*n); rc) {
      return rc;
    }
  }
  maybe_reclaim(n->ino);
  return 0;
}

int FsImpl::unlink(Ino parent, std::string_view name) {
  return unlink_common(parent, name, false);
}
int FsImpl::rmdir(Ino parent, std::string_view name) {
  return unlink_common(parent, name, true);
}

int FsImpl::rename(Ino parent, std::string_view name, Ino new_parent, std::string_view new_name,
                   unsigned flags) {
  return retry_enospc([&] { return rename_once(parent, name, new_parent, new_name, flags); });
}

int FsImpl::rename_once(Ino parent, std::string_view name, Ino new_parent,
                        std::string_view new_name, unsigned flags) {
  if (int rc = check_writable(); rc) return rc;
  if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) return EINVAL;
  if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE)) return EINVAL;
  if (int rc = check_name(name); rc) return rc;
  if (int rc = check_name(new_name); rc) return rc;
  if (name == "." || name == ".." || new_name == "." || new_name == "..") return EBUSY;
  NodeRef victim;
  {
    std::lock_guard<Mutex> ns(namespace_mu_);
    NodeRef sd, td;
    if (int rc = get_node(parent, &sd); rc) return rc;
    if (int rc = get_node(new_parent, &td); rc) return rc;
    // Find both names, one directory at a time; then lock everything in inode order.
    Ino src_ino, dst_ino = 0;
    uint8_t src_type, dst_type = 0;
    {
      std::unique_lock<SharedMutex> slk(sd->rw);
      if (!S_ISDIR(sd->disk.mode)) return ENOTDIR;
      if (int rc = load_map(*sd); rc) return rc;
      if (int rc = dir_find(*sd, name, &src_ino, &src_type); rc) return rc;
    }
    {
      std::unique_lock<SharedMutex> tlk(td->rw);
      if (!S_ISDIR(td->disk.mode)) return ENOTDIR;
      if (td->disk.links == 0) return ENOENT;
      if (int rc = load_map(*td); rc) return rc;
      if (int rc = dir_find(*td, new_name, &dst_ino, &dst_type); rc && rc != ENOENT) return rc;
    }
    if (flags & RENAME_NOREPLACE && dst_ino) return EEXIST;
    if (flags & RENAME_EXCHANGE && !dst_ino) return ENOENT;
    if (dst_ino == src_ino) return 0;  // the same file under both names: nothing to do
    NodeRef src, dst;
    if (int rc = get_node(src_ino, &src); rc) return rc == ENOENT ? EIO : rc;
    if (dst_ino) {
      if (int rc = get_node(dst_ino, &dst); rc) return rc == ENOENT ? EIO : rc;
    }
    // No directory may move into its own subtree: walk up from each new parent.
    auto inside = [&](Ino dir_ino, Ino ancestor) -> bool {
      for (Ino cur = dir_ino, steps = 0; steps < sb_.inode_count; ++steps) {
        if (cur == ancestor) return true;
        if (cur == kRootInode) return false;
        NodeRef p;
        if (get_node(cur, &p) != 0) return false;
        cur = p->disk.parent;
      }
      return false;
    };
    // The entries' types (a file's type never changes), read before the nodes are locked.
    const bool src_dir = src_type == DT_DIR;
    const bool dst_dir = dst && dst_type == DT_DIR;
    if (src_dir && sd != td && inside(new_parent, src_ino)) return EINVAL;
    if ((flags & RENAME_EXCHANGE) && dst_dir && sd != td && inside(parent, dst_ino)) return EINVAL;
    NodeLocks locks(namespace_mu_, {sd.get(), td.get(), src.get(), dst.get()});
    // As may_delete() for the names that go (and both, exchanged) and may_create() for the one
    // that comes: pinned inodes stay where they are, pinned directories keep their names.
    if (pinned(sd->disk) || pinned(src->disk) || immutable(td->disk) ||
        (dst && (pinned(td->disk) || pinned(dst->disk)))) {
      return EPERM;
    }
    if (dst && !(flags & RENAME_EXCHANGE)) {
      if (src_dir && !dst_dir) return ENOTDIR;
      if (!src_dir && dst_dir) return EISDIR;
      if (dst_dir) {
        if (int rc = load_map(*dst); rc) return rc;
        bool empty;
        if (int rc = dir_is_empty(*dst, &empty); rc) return rc;
        if (!empty) return ENOTEMPTY;
      }
    }
    if (src_dir && !dst && td != sd && td->disk.links >= kMaxLinks) return EMLINK;

    Journal::Txn t(*journal_);
    const uint64_t now = now_ns();
    if (flags & RENAME_EXCHANGE) {
      if (int rc = dir_set(*sd, name, dst_ino, dst_type); rc) return rc;
      if (int rc = dir_set(*td, new_name, src_ino, src_type); rc) return rc;
      if (sd != td) {
        if (src_dir) src->disk.parent = new_parent, td->disk.links += 1, sd->disk.links -= 1;
        if (dst_dir) dst->disk.parent = parent, sd->disk.links += 1, td->disk.links -= 1;
      }
      dst->disk.ctime_ns = now;
      if (int rc = store(*dst); rc) return rc;
    } else {
      if (dst) {
        if (int rc = dir_set(*td, new_name, src_ino, src_type); rc) return rc;
        if (dst_dir) {
          dst->disk.links = 0;
          td->disk.links -= 1;
        } else {
          dst->disk.links -= 1;
        }
        dst->disk.ctime_ns = now;
        if (dst->disk.links == 0) {
          if (int rc = orphan_add(*dst); rc) return rc;
          victim = dst;
        } else if (int rc = store(*dst); rc) {
          return rc;
        }
      } else if (int rc = dir_add(*td, new_name, src_ino, src_type); rc) {
        return rc;
      }
      if (int rc = dir_remove(*sd, name); rc) return rc;
      if (src_dir && sd != td) {
        src->disk.parent = new_parent;
        sd->disk.links -= 1;
        td->disk.links += 1;
      }
    }
    src->disk.ctime_ns = now;
    sd->disk.mtime_ns = sd->disk.ctime_ns = now;
    td->disk.mtime_ns = td->disk.ctime_ns = now;
    if (int rc = store(*src); rc) return rc;
    if (int rc = store(*sd); rc) return rc;
    if (td != sd) {
      if (int rc = store(*td); rc) return rc;
    }
  }
  if (victim) maybe_reclaim(victim->ino);
  return 0;
}

int FsImpl::get_flags(Ino ino, uint32_t* fs_flags) {
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::shared_lock<SharedMutex> lk(n->rw);
  *fs_flags =
      (immutable(n->disk) ? FS_IMMUTABLE_FL : 0u) | (append_only(n->disk) ? FS_APPEND_FL : 0u);
  return 0;
}

int FsImpl::set_flags(Ino ino, uint32_t fs_flags) {
  if (int rc = check_writable(); rc) return rc;
  if (fs_flags & ~static_cast<uint32_t>(FS_IMMUTABLE_FL | FS_APPEND_FL)) return EOPNOTSUPP;
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::unique_lock<SharedMutex> lk(n->rw);
  Inode& d = n->disk;
  const uint32_t flags = (d.flags & ~(Inode::kFlagImmutable | Inode::kFlagAppend)) |
                         (fs_flags & FS_IMMUTABLE_FL ? Inode::kFlagImmutable : 0u) |
                         (fs_flags & FS_APPEND_FL ? Inode::kFlagAppend : 0u);
  if (flags == d.flags) return 0;
  Journal::Txn t(*journal_);
  d.flags = flags;
  d.ctime_ns = now_ns();
  return store(*n);
}

int FsImpl::open(Ino ino, int flags) {
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  {
    // As may_open(): an immutable file opens for reading only; an append-only one for
    // writing only with O_APPEND, and never truncated.
    std::shared_lock<SharedMutex> lk(n->rw);
    const bool writing = (flags & O_ACCMODE) != O_RDONLY;
    if (immutable(n->disk) && (writing || (flags & O_TRUNC))) return EPERM;
    if (append_only(n->disk) && ((writing && !(flags & O_APPEND)) || (flags & O_TRUNC)))
      return EPERM;
  }
  if ((flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY) {
    // libfuse asks for atomic O_TRUNC: the truncate is ours, and like Linux it always
    // updates mtime and ctime, even of an empty file.
    if (int rc = check_writable(); rc) return rc;
    std::unique_lock<SharedMutex> lk(n->rw);
    if (S_ISREG(n->disk.mode)) {
      // The kernel leaves this truncate's privilege drop to us too (do_truncate's
      // dentry_needs_remove_privs does not run for an atomic O_TRUNC): set-user-ID and
      // set-group-ID go. The kernel keeps set-group-ID without group execute for a caller in
      // the file's group (and write_locked does), which the daemon cannot tell here: dropping
      // it is the safe side. First, so that a crash between the two leaves the
      // privileges dropped, never a truncated file that keeps them.
      Inode& d = n->disk;
      const uint32_t kill = S_ISUID | S_ISGID;
      if (d.mode & kill) {
        Journal::Txn t(*journal_);
        d.mode &= ~kill;
        d.ctime_ns = now_ns();
        if (int rc = store(*n); rc) return rc;
      }
      if (int rc = set_size(*n, 0); rc) return rc;
    }
  }
  ref(*n, 0, 1);
  return 0;
}

int FsImpl::opendir(Ino ino) {
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  {
    std::lock_guard<std::mutex> g(n->attr_mu);
    if (!S_ISDIR(n->pub.mode)) return ENOTDIR;
  }
  ref(*n, 0, 1);
  return 0;
}

void FsImpl::release(Ino ino) {
  Reclaiming r(reclaim_mu_, reclaim_cv_, reclaiming_);
  {
    std::lock_guard<Mutex> g(table_mu_);
    auto it = nodes_.find(ino);
    if (it == nodes_.end()) return;
    if (it->second->opens > 0) it->second->opens -= 1;
  }
  maybe_reclaim(ino);
}

int FsImpl::readdir(Ino ino, uint64_t offset, const std::function<bool(const DirEntry&)>& emit) {
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::shared_lock<SharedMutex> lk;
  if (int rc = lock_mapped(*n, &lk); rc) return rc;
  if (!S_ISDIR(n->disk.mode)) return ENOTDIR;
  if (n->disk.links == 0) return 0;  // removed while open: empty
  return dir_readdir(*n, offset, emit);
}

}  // namespace warpfs::fs
