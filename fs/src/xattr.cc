// Extended attributes: one block per inode (fs/FORMAT.md "Extended attributes").
#include <sys/xattr.h>

#include <cerrno>
#include <cstring>

#include "internal.h"

namespace warpfs::fs {

namespace {

struct Xattr {
  uint8_t index;
  std::string name;  // without the namespace prefix
  std::string value;
};

constexpr struct {
  const char* prefix;
  uint8_t index;
} kPrefixes[] = {{"user.", kXattrUser},
                 {"trusted.", kXattrTrusted},
                 {"security.", kXattrSecurity},
                 {"system.", kXattrSystem}};

// Splits "user.foo" into (kXattrUser, "foo"). Of system.*, only the POSIX ACLs, which the
// kernel writes and enforces (FUSE_CAP_POSIX_ACL; acl.cc).
int split_name(std::string_view full, uint8_t* index, std::string_view* name) {
  if (full.substr(0, 7) == "system." && full.substr(7) != kAclAccess &&
      full.substr(7) != kAclDefault) {
    return EOPNOTSUPP;
  }
  for (const auto& p : kPrefixes) {
    const size_t len = std::strlen(p.prefix);
    if (full.substr(0, len) == p.prefix) {
      *index = p.index;
      *name = full.substr(len);
      if (name->empty()) return EINVAL;
      if (name->size() > 255) return ERANGE;
      return 0;
    }
  }
  return EOPNOTSUPP;
}

std::string full_name(uint8_t index, const std::string& name) {
  for (const auto& p : kPrefixes) {
    if (p.index == index) return p.prefix + name;
  }
  return "unknown." + name;
}

size_t entry_size(size_t name_len, size_t value_len) {
  return (sizeof(XattrEntryHeader) + name_len + value_len + 3) & ~size_t{3};
}

std::vector<Xattr> parse(const MetaBuf* b) {
  std::vector<Xattr> v;
  XattrHeader h;
  std::memcpy(&h, b->data, sizeof h);
  size_t off = sizeof h;
  for (uint16_t i = 0; i < h.count; ++i) {
    XattrEntryHeader e;
    if (off + sizeof e > kBlockSize) break;
    std::memcpy(&e, b->data + off, sizeof e);
    const size_t sz = entry_size(e.name_len, e.value_len);
    if (off + sz > kBlockSize) break;
    const char* p = reinterpret_cast<const char*>(b->data + off + sizeof e);
    v.push_back(
        Xattr{e.name_index, std::string(p, e.name_len), std::string(p + e.name_len, e.value_len)});
    off += sz;
  }
  return v;
}

bool fits(const std::vector<Xattr>& v) {
  size_t total = sizeof(XattrHeader);
  for (const Xattr& x : v) total += entry_size(x.name.size(), x.value.size());
  return total <= kBlockSize;
}

void serialize(MetaBuf* b, Ino owner, const std::vector<Xattr>& v) {
  std::memset(b->data, 0, kBlockSize);
  size_t off = sizeof(XattrHeader);
  for (const Xattr& x : v) {
    XattrEntryHeader e{static_cast<uint8_t>(x.name.size()), x.index,
                       static_cast<uint16_t>(x.value.size())};
    std::memcpy(b->data + off, &e, sizeof e);
    std::memcpy(b->data + off + sizeof e, x.name.data(), x.name.size());
    std::memcpy(b->data + off + sizeof e + x.name.size(), x.value.data(), x.value.size());
    off += entry_size(x.name.size(), x.value.size());
  }
  XattrHeader h{kXattrMagic,
                static_cast<uint16_t>(v.size()),
                static_cast<uint16_t>(off - sizeof(XattrHeader)),
                owner,
                0,
                0};
  std::memcpy(b->data, &h, sizeof h);
}

}  // namespace

int FsImpl::xattr_load(Node& n, MetaBuf** out) {
  WARPFS_DCHECK(readable_by_me(n), "xattr_load: rw held");
  *out = nullptr;
  if (n.disk.xattr_block == 0) return 0;
  return meta_get(n.disk.xattr_block, out, kXattrMagic, n.ino);
}

int FsImpl::setxattr(Ino ino, std::string_view name, const void* value, size_t size, int flags) {
  return retry_enospc([&] { return setxattr_once(ino, name, value, size, flags); });
}

int FsImpl::setxattr_once(Ino ino, std::string_view name, const void* value, size_t size,
                          int flags) {
  if (int rc = check_writable(); rc) return rc;
  uint8_t index;
  std::string_view short_name;
  if (int rc = split_name(name, &index, &short_name); rc) return rc;
  // Values the kernel passes (up to 64 KiB) that do not fit the block: ENOSPC, as ext4.
  if (size > 65536) return E2BIG;
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::unique_lock<SharedMutex> lk(n->rw);
  if (pinned(n->disk)) return EPERM;  // as notify_change(): attributes of a pinned inode stay
  MetaBuf* b;
  if (int rc = xattr_load(*n, &b); rc) return rc;
  std::vector<Xattr> v = b ? parse(b) : std::vector<Xattr>{};
  auto it = std::find_if(v.begin(), v.end(),
                         [&](const Xattr& x) { return x.index == index && x.name == short_name; });
  if ((flags & XATTR_CREATE) && it != v.end()) return EEXIST;
  if ((flags & XATTR_REPLACE) && it == v.end()) return ENODATA;
  const std::string val(static_cast<const char*>(value), size);
  Journal::Txn t(*journal_);
  if (index == kXattrSystem && short_name == kAclAccess) {
    // The kernel leaves the mode to us (FUSE_CAP_POSIX_ACL): its bits follow the ACL, and an
    // ACL the mode says all of is not kept (as posix_acl_update_mode).
    uint32_t perms;
    bool equivalent;
    if (!acl::mode_of(val, &perms, &equivalent)) return EINVAL;
    n->disk.mode = (n->disk.mode & ~0777u) | perms;
    if (equivalent) {
      if (int rc = remove_xattr_locked(*n, index, short_name); rc && rc != ENODATA) return rc;
    } else if (int rc = xattr_set_locked(*n, index, short_name, val); rc) {
      return rc;
    }
  } else if (int rc = xattr_set_locked(*n, index, short_name, val); rc) {
    return rc;
  }
  n->disk.ctime_ns = now_ns();
  return store(*n);
}

int FsImpl::xattr_set_locked(Node& n, uint8_t index, std::string_view short_name,
                             const std::string& value) {
  WARPFS_DCHECK(changeable_by_me(n), "xattr_set_locked: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "xattr_set_locked: in a transaction");
  MetaBuf* b;
  if (int rc = xattr_load(n, &b); rc) return rc;
  std::vector<Xattr> v = b ? parse(b) : std::vector<Xattr>{};
  auto it = std::find_if(v.begin(), v.end(),
                         [&](const Xattr& x) { return x.index == index && x.name == short_name; });
  if (it != v.end()) {
    it->value = value;
  } else {
    v.push_back(Xattr{index, std::string(short_name), value});
  }
  if (!fits(v)) return ENOSPC;
  if (!b) {
    uint64_t blk;
    if (int rc = alloc_meta_block(n, &blk); rc) return rc;
    b = journal_->create(blk, MetaKind::kHeader, n.ino);
    n.disk.xattr_block = blk;
  }
  serialize(b, n.ino, v);
  journal_->dirty(b);
  note_changed(n, false);
  return 0;
}

int FsImpl::xattr_get_locked(Node& n, uint8_t index, std::string_view short_name,
                             std::string* value) {
  WARPFS_DCHECK(readable_by_me(n), "xattr_get_locked: rw held");
  MetaBuf* b;
  if (int rc = xattr_load(n, &b); rc) return rc;
  if (!b) return ENODATA;
  for (const Xattr& x : parse(b)) {
    if (x.index == index && x.name == short_name) {
      *value = x.value;
      return 0;
    }
  }
  return ENODATA;
}

int FsImpl::getxattr(Ino ino, std::string_view name, std::string* value) {
  uint8_t index;
  std::string_view short_name;
  if (int rc = split_name(name, &index, &short_name); rc) return rc == EOPNOTSUPP ? ENODATA : rc;
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::shared_lock<SharedMutex> lk(n->rw);
  return xattr_get_locked(*n, index, short_name, value);
}

int FsImpl::listxattr(Ino ino, std::string* names) {
  names->clear();
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::shared_lock<SharedMutex> lk(n->rw);
  MetaBuf* b;
  if (int rc = xattr_load(*n, &b); rc) return rc;
  if (!b) return 0;
  for (const Xattr& x : parse(b)) {
    *names += full_name(x.index, x.name);
    names->push_back('\0');
  }
  return 0;
}

int FsImpl::removexattr(Ino ino, std::string_view name) {
  if (int rc = check_writable(); rc) return rc;
  uint8_t index;
  std::string_view short_name;
  if (int rc = split_name(name, &index, &short_name); rc) return rc == EOPNOTSUPP ? ENODATA : rc;
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::unique_lock<SharedMutex> lk(n->rw);
  if (pinned(n->disk)) return EPERM;
  Journal::Txn t(*journal_);
  if (int rc = remove_xattr_locked(*n, index, short_name); rc) return rc;
  n->disk.ctime_ns = now_ns();
  return store(*n);
}

// REQUIRES: rw exclusive, in a transaction. ENODATA when the attribute is not there.
int FsImpl::remove_xattr_locked(Node& n, uint8_t index, std::string_view short_name) {
  WARPFS_DCHECK(changeable_by_me(n), "remove_xattr_locked: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "remove_xattr_locked: in a transaction");
  MetaBuf* b;
  if (int rc = xattr_load(n, &b); rc) return rc;
  if (!b) return ENODATA;
  std::vector<Xattr> v = parse(b);
  auto it = std::find_if(v.begin(), v.end(),
                         [&](const Xattr& x) { return x.index == index && x.name == short_name; });
  if (it == v.end()) return ENODATA;
  v.erase(it);
  if (v.empty()) {
    journal_->forget_block(n.disk.xattr_block);
    free_blocks(n.disk.xattr_block, 1);
    n.disk.blocks -= 1;
    n.disk.xattr_block = 0;
  } else {
    serialize(b, n.ino, v);
    journal_->dirty(b);
  }
  note_changed(n, false);
  return 0;
}

// A write drops security.capability (file capabilities), as the kernel's file_remove_privs()
// does: an O_DIRECT write (FOPEN_DIRECT_IO) reaches the daemon without it. REQUIRES: rw
// exclusive, in a transaction.
int FsImpl::drop_capability_locked(Node& n) {
  WARPFS_DCHECK(changeable_by_me(n), "drop_capability_locked: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "drop_capability_locked: in a transaction");
  if (n.disk.xattr_block == 0) return 0;
  uint8_t index;
  std::string_view short_name;
  if (int rc = split_name("security.capability", &index, &short_name); rc) return rc;
  const int rc = remove_xattr_locked(n, index, short_name);
  return rc == ENODATA ? 0 : rc;
}

}  // namespace warpfs::fs
