// Extended attributes: a chain of xattr blocks per inode, large values in value blocks
// (fs/FORMAT.md "Extended attributes"). Entries are read and changed in place in the cached
// blocks; nothing parses a whole chain into copies.
#include <sys/xattr.h>

#include <cerrno>
#include <cstring>

#include "internal.h"

namespace warpfs::fs {

namespace {

constexpr struct {
  const char* prefix;
  uint8_t index;
} kPrefixes[] = {{"user.", kXattrUser},
                 {"trusted.", kXattrTrusted},
                 {"security.", kXattrSecurity},
                 {"system.", kXattrSystem}};

// The longest chain: 16 MiB of attributes. A longer walk is a loop (EIO).
constexpr size_t kMaxChain = 4096;
constexpr std::string_view kCapability = "capability";

// Splits "user.foo" into (kXattrUser, "foo"). Of system.*, only the POSIX ACLs, which the
// kernel writes and enforces (FUSE_CAP_POSIX_ACL; acl.cc). Never kXattrInternal: no name
// reaches the filesystem's own records.
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

size_t entry_size(size_t name_len, size_t value_len) {
  return (sizeof(XattrEntryHeader) + name_len + value_len + 3) & ~size_t{3};
}

XattrHeader header(const MetaBuf* b) {
  XattrHeader h;
  std::memcpy(&h, b->data, sizeof h);
  return h;
}
void set_header(MetaBuf* b, const XattrHeader& h) {
  std::memcpy(b->data, &h, sizeof h);
}
size_t room(const MetaBuf* b) {
  return kBlockSize - sizeof(XattrHeader) - std::min<size_t>(header(b).used, kBlockSize - 32);
}

// One entry of a cached xattr block, read in place.
struct Entry {
  size_t off = 0;  // of its header in the block
  XattrEntryHeader e{};
  size_t size() const { return entry_size(e.name_len, e.value_len); }
  uint8_t index() const { return e.name_index & ~kXattrOutOfLine; }
  bool out_of_line() const { return (e.name_index & kXattrOutOfLine) != 0; }
  std::string_view name(const MetaBuf* b) const {
    return {reinterpret_cast<const char*>(b->data + off + sizeof e), e.name_len};
  }
  const uint8_t* value(const MetaBuf* b) const { return b->data + off + sizeof e + e.name_len; }
};

// Calls f(entry) for the entries of b in order while it returns false; true if one returned
// true. Stops at an entry that runs past the used bytes (fsck reports it).
template <typename F>
bool each_entry(const MetaBuf* b, F f) {
  const XattrHeader h = header(b);
  const size_t end = std::min<size_t>(kBlockSize, sizeof h + h.used);
  size_t off = sizeof h;
  for (uint16_t i = 0; i < h.count; ++i) {
    Entry x;
    x.off = off;
    if (off + sizeof x.e > end) break;
    std::memcpy(&x.e, b->data + off, sizeof x.e);
    if (off + x.size() > end) break;
    if (f(x)) return true;
    off += x.size();
  }
  return false;
}

// "" or what is wrong with an xattr block's entries as read (FORMAT.md "Extended
// attributes": `count` well-formed entries filling exactly `used` bytes), checked once when
// the block is read; changes keep it so.
std::string block_layout(const uint8_t* data) {
  XattrHeader h;
  std::memcpy(&h, data, sizeof h);
  if (h.used > kBlockSize - sizeof h) return "used bytes overflow the block";
  size_t off = sizeof h;
  for (uint16_t i = 0; i < h.count; ++i) {
    XattrEntryHeader e;
    if (off + sizeof e > sizeof h + h.used) return "entries run past the used bytes";
    std::memcpy(&e, data + off, sizeof e);
    if (e.name_len == 0) return "an entry without a name";
    off += entry_size(e.name_len, e.value_len);
  }
  if (off != sizeof h + h.used) return "entries do not fill the used bytes";
  return "";
}

struct Found {
  size_t block = 0;  // in the chain
  Entry x;
};
bool find(const std::vector<MetaBuf*>& chain, uint8_t index, std::string_view name, Found* f) {
  for (size_t i = 0; i < chain.size(); ++i) {
    const bool hit = each_entry(chain[i], [&](const Entry& x) {
      if (x.index() != index || x.name(chain[i]) != name) return false;
      f->block = i;
      f->x = x;
      return true;
    });
    if (hit) return true;
  }
  return false;
}

// The record of an out-of-line value: false if malformed.
bool value_ref(const MetaBuf* b, const Entry& x, XattrValueRef* r, std::vector<uint64_t>* blocks) {
  if (x.e.value_len < sizeof *r) return false;
  std::memcpy(r, x.value(b), sizeof *r);
  if (r->size == 0 || r->size > kXattrValueMax || r->count != div_up(r->size, kXattrValuePayload) ||
      x.e.value_len != sizeof *r + size_t{r->count} * 8) {
    return false;
  }
  blocks->resize(r->count);
  std::memcpy(blocks->data(), x.value(b) + sizeof *r, size_t{r->count} * 8);
  return true;
}

void erase_entry(MetaBuf* b, const Entry& x) {
  XattrHeader h = header(b);
  const size_t end = std::min<size_t>(kBlockSize, sizeof h + h.used), sz = x.size();
  std::memmove(b->data + x.off, b->data + x.off + sz, end - x.off - sz);
  std::memset(b->data + end - sz, 0, sz);
  h.count -= 1;
  h.used = static_cast<uint16_t>(h.used - sz);
  set_header(b, h);
}

// REQUIRES: room(b) >= entry_size(name, len).
void append_entry(MetaBuf* b, uint8_t name_index, std::string_view name, std::string_view value) {
  XattrHeader h = header(b);
  const size_t off = sizeof h + h.used;
  const XattrEntryHeader e{static_cast<uint8_t>(name.size()), name_index,
                           static_cast<uint16_t>(value.size())};
  std::memcpy(b->data + off, &e, sizeof e);
  std::memcpy(b->data + off + sizeof e, name.data(), name.size());
  std::memcpy(b->data + off + sizeof e + name.size(), value.data(), value.size());
  h.count += 1;
  h.used = static_cast<uint16_t>(h.used + entry_size(name.size(), value.size()));
  set_header(b, h);
}

}  // namespace

int FsImpl::xattr_chain(Node& n, std::vector<MetaBuf*>* chain) {
  WARPFS_DCHECK(readable_by_me(n), "xattr_chain: rw held");
  chain->clear();
  for (uint64_t b = n.disk.xattr_block; b != 0;) {
    if (chain->size() >= kMaxChain) {
      log("inode " + std::to_string(n.ino) + ": xattr chain loops (run fsck.warpfs)");
      return EIO;
    }
    MetaBuf* m;
    if (int rc = meta_get(b, &m, kXattrMagic, n.ino, 0, block_layout); rc) return rc;
    chain->push_back(m);
    b = header(m).next;
  }
  return 0;
}

int FsImpl::xattr_read_value(Node& n, uint32_t size, const std::vector<uint64_t>& blocks,
                             std::string* out) {
  out->clear();
  out->reserve(size);
  for (size_t i = 0; i < blocks.size(); ++i) {
    MetaBuf* b;
    if (int rc = meta_get(blocks[i], &b, kXattrValueMagic, n.ino); rc) return rc;
    XattrValueHeader h;
    std::memcpy(&h, b->data, sizeof h);
    const uint32_t want = std::min<uint32_t>(kXattrValuePayload, size - out->size());
    if (h.position != i || h.used != want) {
      log("inode " + std::to_string(n.ino) + ": xattr value block " + std::to_string(blocks[i]) +
          " does not match its record (run fsck.warpfs)");
      return EIO;
    }
    out->append(reinterpret_cast<const char*>(b->data + sizeof h), want);
  }
  return 0;
}

void FsImpl::xattr_free_value(Node& n, const std::vector<uint64_t>& blocks) {
  for (uint64_t blk : blocks) {
    MetaBuf* b;
    if (meta_get(blk, &b, kXattrValueMagic, n.ino) == 0) free_meta_block(n, blk);
  }
}

void FsImpl::xattr_unlink_if_empty(Node& n, std::vector<MetaBuf*>& chain, size_t i) {
  const XattrHeader h = header(chain[i]);
  if (h.count != 0) return;
  if (i == 0) {
    n.disk.xattr_block = h.next;
  } else {
    XattrHeader p = header(chain[i - 1]);
    p.next = h.next;
    set_header(chain[i - 1], p);
    journal_->dirty(chain[i - 1]);
  }
  free_meta_block(n, chain[i]->block);
  chain.erase(chain.begin() + static_cast<long>(i));
}

void FsImpl::xattr_free_all(Node& n) {
  WARPFS_DCHECK(changeable_by_me(n), "xattr_free_all: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "xattr_free_all: in a transaction");
  std::vector<MetaBuf*> chain;
  if (xattr_chain(n, &chain) != 0) {
    log("inode " + std::to_string(n.ino) + ": freeing what of its xattr chain is readable");
  }
  // A loop repeats blocks: each is freed once.
  std::sort(chain.begin(), chain.end());
  chain.erase(std::unique(chain.begin(), chain.end()), chain.end());
  std::vector<uint64_t> blocks;
  for (MetaBuf* b : chain) {
    each_entry(b, [&](const Entry& x) {
      XattrValueRef r;
      if (x.out_of_line() && value_ref(b, x, &r, &blocks)) xattr_free_value(n, blocks);
      return false;
    });
  }
  for (MetaBuf* b : chain) free_meta_block(n, b->block);
  // The inode's own first block goes even when it could not be read (as before chains:
  // free_blocks keeps a block that is not in a data area, and says so).
  if (n.disk.xattr_block != 0 && chain.empty()) free_meta_block(n, n.disk.xattr_block);
  n.disk.xattr_block = 0;
  n.cap = Node::Cap::kAbsent;
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
  // The kernel passes at most XATTR_SIZE_MAX; without kFeatureXattrChain a value that does
  // not fit the one block is ENOSPC, as ext4 without ea_inode.
  if (size > kXattrValueMax) return E2BIG;
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::unique_lock<SharedMutex> lk(n->rw);
  if (pinned(n->disk)) return EPERM;  // as notify_change(): attributes of a pinned inode stay
  if (flags & (XATTR_CREATE | XATTR_REPLACE)) {
    std::vector<MetaBuf*> chain;
    if (int rc = xattr_chain(*n, &chain); rc) return rc;
    Found f;
    const bool exists = find(chain, index, short_name, &f);
    if ((flags & XATTR_CREATE) && exists) return EEXIST;
    if ((flags & XATTR_REPLACE) && !exists) return ENODATA;
  }
  const std::string val(static_cast<const char*>(value), size);
  Journal::Txn t(*journal_);
  if (index == kXattrSystem && short_name == kAclAccess) {
    // The kernel leaves the mode to us (FUSE_CAP_POSIX_ACL): its bits follow the ACL, and an
    // ACL the mode says all of is not kept (as posix_acl_update_mode).
    uint32_t perms;
    bool equivalent;
    if (!acl::mode_of(val, &perms, &equivalent)) return EINVAL;
    if (equivalent) {
      if (int rc = remove_xattr_locked(*n, index, short_name); rc && rc != ENODATA) return rc;
    } else if (int rc = xattr_set_locked(*n, index, short_name, val); rc) {
      return rc;
    }
    n->disk.mode = (n->disk.mode & ~0777u) | perms;
  } else if (int rc = xattr_set_locked(*n, index, short_name, val); rc) {
    return rc;
  }
  n->disk.ctime_ns = now_ns();
  return store(*n);
}

// Allocates every block the change needs before it changes anything, so that ENOSPC (or any
// error) leaves the attributes as they were. Dirties at most: the value's 17 blocks, the
// block the entry goes to, the one it leaves and that one's predecessor in the chain.
int FsImpl::xattr_set_locked(Node& n, uint8_t index, std::string_view short_name,
                             const std::string& value) {
  WARPFS_DCHECK(changeable_by_me(n), "xattr_set_locked: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "xattr_set_locked: in a transaction");
  std::vector<MetaBuf*> chain;
  if (int rc = xattr_chain(n, &chain); rc) return rc;
  Found old;
  const bool exists = find(chain, index, short_name, &old);
  const bool out_of_line = xattr_chains() && value.size() > kXattrInlineMax;
  const auto count =
      static_cast<uint32_t>(out_of_line ? div_up(value.size(), kXattrValuePayload) : 0);
  const size_t stored_len = out_of_line ? sizeof(XattrValueRef) + size_t{count} * 8 : value.size();
  const size_t need = entry_size(short_name.size(), stored_len);
  if (need > kBlockSize - sizeof(XattrHeader)) return ENOSPC;
  // Where the entry goes: where it is, if it still fits there; else the first block with
  // room; else a new block at the end of the chain.
  size_t target = SIZE_MAX;
  if (exists && room(chain[old.block]) + old.x.size() >= need) target = old.block;
  for (size_t i = 0; target == SIZE_MAX && i < chain.size(); ++i) {
    if (room(chain[i]) >= need) target = i;
  }
  const bool grow = target == SIZE_MAX;
  if (grow && !chain.empty() && (!xattr_chains() || chain.size() >= kMaxChain)) return ENOSPC;
  std::vector<uint64_t> fresh;  // the value blocks, then the new chain block
  for (size_t i = 0; i < count + (grow ? 1u : 0u); ++i) {
    uint64_t blk;
    if (int rc = alloc_meta_block(n, &blk); rc) {
      for (uint64_t f : fresh) free_meta_block(n, f);
      return rc;
    }
    fresh.push_back(blk);
  }
  std::string ref;
  if (out_of_line) {
    const XattrValueRef r{static_cast<uint32_t>(value.size()), count};
    ref.append(reinterpret_cast<const char*>(&r), sizeof r);
    for (uint32_t i = 0; i < count; ++i) {
      const size_t at = size_t{i} * kXattrValuePayload;
      const auto used =
          static_cast<uint32_t>(std::min<size_t>(kXattrValuePayload, value.size() - at));
      MetaBuf* vb = journal_->create(fresh[i], MetaKind::kHeader, n.ino);
      const XattrValueHeader h{kXattrValueMagic, used, n.ino, i, 0, 0};
      std::memcpy(vb->data, &h, sizeof h);
      std::memcpy(vb->data + sizeof h, value.data() + at, used);
      journal_->dirty(vb);
      ref.append(reinterpret_cast<const char*>(&fresh[i]), 8);
    }
  }
  if (exists) {  // the old entry goes, and its value blocks
    MetaBuf* ob = chain[old.block];
    XattrValueRef r;
    std::vector<uint64_t> blocks;
    if (old.x.out_of_line() && value_ref(ob, old.x, &r, &blocks)) xattr_free_value(n, blocks);
    erase_entry(ob, old.x);
    journal_->dirty(ob);
  }
  if (grow) {
    MetaBuf* nb = journal_->create(fresh.back(), MetaKind::kHeader, n.ino);
    set_header(nb, XattrHeader{kXattrMagic, 0, 0, n.ino, 0, 0});
    if (chain.empty()) {
      n.disk.xattr_block = nb->block;
    } else {
      XattrHeader last = header(chain.back());
      last.next = nb->block;
      set_header(chain.back(), last);
      journal_->dirty(chain.back());
    }
    chain.push_back(nb);
    target = chain.size() - 1;
  }
  append_entry(chain[target], static_cast<uint8_t>(index | (out_of_line ? kXattrOutOfLine : 0)),
               short_name, out_of_line ? std::string_view(ref) : std::string_view(value));
  journal_->dirty(chain[target]);
  if (exists && target != old.block) xattr_unlink_if_empty(n, chain, old.block);
  if (index == kXattrSecurity && short_name == kCapability) n.cap = Node::Cap::kPresent;
  note_changed(n, false);
  return 0;
}

int FsImpl::xattr_get_locked(Node& n, uint8_t index, std::string_view short_name,
                             std::string* value) {
  WARPFS_DCHECK(readable_by_me(n), "xattr_get_locked: rw held");
  std::vector<MetaBuf*> chain;
  if (int rc = xattr_chain(n, &chain); rc) return rc;
  Found f;
  if (!find(chain, index, short_name, &f)) return ENODATA;
  const MetaBuf* b = chain[f.block];
  if (!f.x.out_of_line()) {
    value->assign(reinterpret_cast<const char*>(f.x.value(b)), f.x.e.value_len);
    return 0;
  }
  XattrValueRef r;
  std::vector<uint64_t> blocks;
  if (!value_ref(b, f.x, &r, &blocks)) {
    log("inode " + std::to_string(n.ino) + ": malformed xattr value record (run fsck.warpfs)");
    return EIO;
  }
  return xattr_read_value(n, r.size, blocks, value);
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

// Every name once, in chain order; the internal namespace is never listed.
int FsImpl::listxattr(Ino ino, std::string* names) {
  names->clear();
  NodeRef n;
  if (int rc = get_node(ino, &n); rc) return rc;
  std::shared_lock<SharedMutex> lk(n->rw);
  std::vector<MetaBuf*> chain;
  if (int rc = xattr_chain(*n, &chain); rc) return rc;
  for (const MetaBuf* b : chain) {
    each_entry(b, [&](const Entry& x) {
      for (const auto& p : kPrefixes) {
        if (p.index != x.index()) continue;
        *names += p.prefix;
        *names += x.name(b);
        names->push_back('\0');
      }
      return false;
    });
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
  std::vector<MetaBuf*> chain;
  if (int rc = xattr_chain(n, &chain); rc) return rc;
  Found f;
  const bool exists = find(chain, index, short_name, &f);
  if (index == kXattrSecurity && short_name == kCapability) n.cap = Node::Cap::kAbsent;
  if (!exists) return ENODATA;
  MetaBuf* b = chain[f.block];
  XattrValueRef r;
  std::vector<uint64_t> blocks;
  if (f.x.out_of_line() && value_ref(b, f.x, &r, &blocks)) xattr_free_value(n, blocks);
  erase_entry(b, f.x);
  journal_->dirty(b);
  xattr_unlink_if_empty(n, chain, f.block);
  note_changed(n, false);
  return 0;
}

// A write drops security.capability (file capabilities), as the kernel's file_remove_privs()
// does: an O_DIRECT write (FOPEN_DIRECT_IO) reaches the daemon without it. REQUIRES: rw
// exclusive, in a transaction. Cost: one scan of the chain the first time a node is written
// (or after it got a capability), nothing after that (Node::cap).
int FsImpl::drop_capability_locked(Node& n) {
  WARPFS_DCHECK(changeable_by_me(n), "drop_capability_locked: rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "drop_capability_locked: in a transaction");
  if (!n.may_have_capability()) return 0;
  const int rc = remove_xattr_locked(n, kXattrSecurity, kCapability);
  return rc == ENODATA ? 0 : rc;
}

}  // namespace warpfs::fs
