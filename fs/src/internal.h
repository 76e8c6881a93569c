// The filesystem core's private types. See filesystem.h for the contract and lock order.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "journal.h"
#include "locks.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/fs/format.h"
#include "warpfs/fs/layout.h"

namespace warpfs::fs {

uint64_t now_ns();

// One block group's allocation state. Bitmaps live in journal buffers; `held` marks blocks
// freed by the running transaction, which may not be reused until it commits (FORMAT.md).
// Allocating and freeing happen inside a transaction only, so a commit's closed gate (which
// reads the bitmaps and writes the descriptors' checksums, alloc.cc finish_commit) never
// meets them.
struct Group {
  std::mutex mu;  // leaf: the bitmap bits, this group's descriptor fields, held, freed, hints
  MetaBuf* block_bitmap = nullptr;  // pinned for the mount (set at mount, then read-only)
  MetaBuf* inode_bitmap = nullptr;  // pinned likewise
  std::vector<uint64_t> held;       // mu: 512 words
  std::vector<std::pair<uint32_t, uint32_t>> freed;  // mu: (first, count) freed this transaction
  // Exact under mu; read without it (relaxed) as a hint and for statfs.
  std::atomic<uint32_t> free_blocks{0}, free_inodes{0};
  uint32_t next_inode_hint = 0, next_block_hint = 0;  // mu
  // The reference-count table (FORMAT.md "Shared blocks"): its buffers, loaded at mount or
  // made by the first sharing, then pinned; all null while the group has none (mu).
  MetaBuf* refs[kRefcountBlocks] = {};
  // Whether `refs` is set (written under mu, once): read without mu, false means that no
  // block of the group is shared, so the write and free paths need not look.
  std::atomic<bool> has_refs{false};
  // Blocks whose count fell to 0 (2 -> 0: one owner left) in transactions not yet committed,
  // with how many such transactions (mu). Until the fall commits, the block still counts as
  // shared to writers: a power cut before it brings the other owner back, which must not
  // find the survivor's in-place write in its block (the copy-on-write counterpart of
  // `held`). `unshared`: the running transaction's (mu), taken by take_freed.
  std::unordered_map<uint32_t, uint32_t> unsharing;
  std::vector<uint32_t> unshared;
};

// Inode flags immutable (chattr +i) and append-only (chattr +a), FORMAT.md "Inode": the VFS
// checks them for kernel filesystems through S_IMMUTABLE/S_APPEND, which FUSE inodes never
// carry, so the core refuses each change itself (EPERM), with the VFS's rules.
// Group g's descriptor in the descriptor table's buffers.
inline GroupDesc* desc(std::vector<MetaBuf*>& gdt, uint32_t g) {
  return reinterpret_cast<GroupDesc*>(gdt[g / kGroupDescsPerBlock]->data) + g % kGroupDescsPerBlock;
}

// The errno for a device status (errors.cc): ENOSPC for a namespace out of capacity,
// EOPNOTSUPP for a command the device lacks, else EIO; 0 for ok.
int errno_of(const blockdev::Status& st);

inline bool immutable(const Inode& d) {
  return (d.flags & Inode::kFlagImmutable) != 0;
}
inline bool append_only(const Inode& d) {
  return (d.flags & Inode::kFlagAppend) != 0;
}
inline bool pinned(const Inode& d) {
  return immutable(d) || append_only(d);
}
// The set-ID bits of `mode` that a change of a file's contents (or its truncation) clears,
// as the kernel's should_remove_suid(): set-user-ID, and set-group-ID where the group may
// execute (without group execute it marks mandatory locking, not a privilege).
inline uint32_t set_id_bits_to_drop(uint32_t mode) {
  return mode & ((mode & S_IXGRP) ? S_ISUID | S_ISGID : S_ISUID);
}

// The POSIX ACLs' names in the system. namespace (kXattrSystem; acl.cc).
inline constexpr uint64_t kNoBlock = uint64_t{1} << 32;      // one past the last logical block
inline constexpr uint64_t kMaxFileSize = uint64_t{1} << 44;  // 2^32 blocks of 4 KiB: 16 TiB
inline constexpr std::string_view kAclAccess = "posix_acl_access";
inline constexpr std::string_view kAclDefault = "posix_acl_default";

namespace acl {
// A new inode's mode and access ACL from its directory's default ACL (the xattr value of
// system.posix_acl_default): `mode` (the requested one, no umask) is masked by the ACL and
// the ACL by it; `access` is the ACL to store, or empty where the mode says it all. False on
// a value that is no ACL.
bool inherit(const std::string& default_acl, uint32_t* mode, std::string* access);
// The permission bits an access ACL gives the mode (user, mask or else group, other), and
// whether the mode alone says the same (no named entries, no mask). False on no ACL.
bool mode_of(const std::string& access_acl, uint32_t* perms, bool* equivalent);
// chmod of an inode with an access ACL: its owner, mask (or group) and other entries follow.
bool chmod(std::string* access_acl, uint32_t mode);
}  // namespace acl

// The in-memory mapping of a file: its extents, in leaves of at most kExtentNodeCapacity.
// A file with at most Inode::kInlineExtents extents keeps them in the inode (one leaf with
// block 0); larger ones have leaf blocks under an index (in the inode at depth 1, in index
// blocks at depth 2).
struct ExtentLeaf {
  uint64_t block = 0;  // 0: inline in the inode
  std::vector<Extent> ext;
  bool dirty = false;
};

// An inode in memory, shared (NodeRef) by the node table and the operations using it.
struct Node {
  explicit Node(Ino i) : ino(i) {}
  const Ino ino;
  // Operation lock (filesystem.h level 2): shared for reads of contents, exclusive for
  // changes. Guards `disk`, `mapped`, `leaves`, `index_blocks`, `index_dirty`, and the
  // node's directory, extent-tree and xattr buffers (MetaBuf's rules). Exceptions, each
  // argued where it happens: `disk.parent` and `disk.next_orphan` change only under
  // namespace_mu_ too, and are read under it alone (rename's ancestor walk, orphan_pred);
  // a node being created is not locked (no name reaches it yet, create_locked).
  SharedMutex rw;
  Inode disk{};
  bool mapped = false;  // leaves loaded
  std::vector<ExtentLeaf> leaves;
  std::vector<uint64_t> index_blocks;  // depth 2
  bool index_dirty = false;
  // Whether security.capability is among the attributes (rw, like `disk`): found by one
  // scan of the chain, then kept by every set and remove, so that the write path's
  // drop_capability_locked costs nothing for a file without one (xattr.cc), and the
  // overwrite fast path, which may not drop one, knows a file has none.
  enum class Cap : uint8_t { kUnknown, kAbsent, kPresent };
  Cap cap = Cap::kUnknown;
  // Whether security.capability may be there (rw, as `cap`): not known absent.
  bool may_have_capability() const { return disk.xattr_block != 0 && cap != Cap::kAbsent; }
  // Whether the internal times record exists (rw, like `disk`): set where a time field gets
  // a sentinel, and at load from the fields (the record exists exactly while one holds a
  // sentinel); store() removes it when none does any more (FORMAT.md "Inode").
  bool times_record = false;

  // Published attributes for getattr without `rw` (leaf lock): what stat shows, copied
  // from `disk` at every store (a quarter of an Inode: a node per inode the kernel holds).
  struct Published {
    uint32_t mode = 0, uid = 0, gid = 0, links = 0, generation = 0;
    uint64_t size = 0, blocks = 0, atime_ns = 0, mtime_ns = 0, ctime_ns = 0, rdev = 0;
    Published& operator=(const Inode& d) {
      mode = d.mode, uid = d.uid, gid = d.gid, links = d.links, generation = d.generation;
      size = d.size, blocks = d.blocks, atime_ns = d.atime_ns, mtime_ns = d.mtime_ns;
      ctime_ns = d.ctime_ns, rdev = d.rdev;
      return *this;
    }
  };
  std::mutex attr_mu;  // leaf: pub
  Published pub;

  // fsync's bookkeeping (file.cc FsImpl::fsync, "Crash consistency" in ARCHITECTURE.md).
  // sync_mu: one fsync of this node at a time, taken with no other lock held (only
  // written_mu inside it). written_mu (leaf): `written`, `written_all`, `flush_gen`.
  std::mutex sync_mu;
  std::mutex written_mu;
  // Device blocks of data written (write_locked, zero_range) since the last fsync took them
  // (merged runs; past kMaxWrittenRuns, written_all instead: fsync then writes back the
  // whole cache).
  std::vector<blockdev::BlockDevice::Range> written;
  bool written_all = false;
  // The flush (Flusher numbering) that makes the data the last fsync wrote back durable;
  // 0: nothing waits for one.
  uint64_t flush_gen = 0;
  // The transactions (Journal::running) of the last change of the inode that fsync must make
  // durable (any: store()) and of the last one fdatasync must (size, allocation, mapping:
  // what reading the data back needs). Written under rw exclusive, read by fsync without it.
  std::atomic<uint64_t> meta_txn{0}, data_txn{0};
  static constexpr size_t kMaxWrittenRuns = 4096;

  // The overwrite fast path (file.cc FsImpl::overwrite), which holds `rw` shared only.
  // The latest mtime (= ctime) of overwrites not yet in `disk` (0: none). Raised by the fast
  // path (atomically: several run at once under `rw` shared), taken into `disk` by store()
  // under `rw` exclusive (fold_times). Such a node is on FsImpl::times_dirty_, so that the
  // committer, fsync, sync or unmount stores it; a crash before that loses only the times.
  std::atomic<uint64_t> pending_times{0};

  // Kernel references (FUSE lookups) and open handles: FsImpl::table_mu_.
  uint64_t nlookup = 0;
  uint32_t opens = 0;

#if WARPFS_DEBUG_CHECKS
  // From new_node() until create_locked() has given it a name (or undone it): no other
  // thread can reach the node, which is therefore changed without its lock.
  std::atomic<bool> creating{false};
#endif
};

// For WARPFS_DCHECK (locks.h): whether this thread may change `n` (it holds n.rw exclusive,
// or creates the node) or read it (n.rw in either mode, or creating it).
#if WARPFS_DEBUG_CHECKS
inline bool changeable_by_me(const Node& n) {
  return held_exclusive_by_me(n.rw) || n.creating.load(std::memory_order_relaxed);
}
inline bool readable_by_me(const Node& n) {
  return held_by_me(n.rw) || n.creating.load(std::memory_order_relaxed);
}
#else
bool changeable_by_me(const Node& n);
bool readable_by_me(const Node& n);
#endif

// Exclusive locks on several nodes, always taken in inode-number order (so that no two
// operations can ever hold them in opposite orders). REQUIRES: namespace_mu_ (`ns`).
class NodeLocks {
 public:
  NodeLocks(const Mutex& ns, std::vector<Node*> nodes) {
    WARPFS_DCHECK(held_by_me(ns), "NodeLocks without namespace_mu_");
    nodes.erase(std::remove(nodes.begin(), nodes.end(), nullptr), nodes.end());
    std::sort(nodes.begin(), nodes.end(), [](Node* a, Node* b) { return a->ino < b->ino; });
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    for (Node* n : nodes) locks_.emplace_back(n->rw);
  }

 private:
  std::vector<std::unique_lock<SharedMutex>> locks_;
};

class FsImpl final : public Filesystem {
 public:
  FsImpl(blockdev::BlockDevice& dev, const Superblock& sb, const MountOptions& o);
  ~FsImpl() override;
  [[nodiscard]] int start(uint64_t jpos, uint64_t jseq, uint64_t replayed, std::string* error);

  [[nodiscard]] int unmount() override;
  // After a failed start(): stop the committer and write nothing, not even at destruction.
  void abandon();
  // Grows the filesystem to at most `blocks` (resize.cc). REQUIRES (unchecked): no other
  // operation in flight or to come (the resizer's own mount).
  [[nodiscard]] int grow(uint64_t blocks, std::string* error);
  bool plan_growth(uint64_t blocks, Superblock* out, std::string* error) const;
  [[nodiscard]] int lookup(Ino parent, std::string_view name, Attr* out) override;
  void forget(Ino ino, uint64_t n) override;
  [[nodiscard]] int lookup_ino(Ino ino, Attr* out) override;
  [[nodiscard]] int getattr(Ino ino, Attr* out) override;
  [[nodiscard]] int setattr(Ino ino, const SetAttr& s, Attr* out) override;
  [[nodiscard]] int mknod(Ino parent, std::string_view name, uint32_t mode, uint64_t rdev,
                          const Caller& c, Attr* out) override;
  [[nodiscard]] int mkdir(Ino parent, std::string_view name, uint32_t mode, const Caller& c,
                          Attr* out) override;
  [[nodiscard]] int symlink(Ino parent, std::string_view name, std::string_view target,
                            const Caller& c, Attr* out) override;
  [[nodiscard]] int readlink(Ino ino, std::string* target) override;
  [[nodiscard]] int link(Ino ino, Ino new_parent, std::string_view new_name, Attr* out) override;
  [[nodiscard]] int unlink(Ino parent, std::string_view name) override;
  [[nodiscard]] int rmdir(Ino parent, std::string_view name) override;
  [[nodiscard]] int rename(Ino parent, std::string_view name, Ino new_parent,
                           std::string_view new_name, unsigned flags) override;
  [[nodiscard]] int open(Ino ino, int flags) override;
  void release(Ino ino) override;
  [[nodiscard]] int read(Ino ino, uint64_t off, size_t len, char* buf, size_t* got,
                         ReadFor purpose) override;
  [[nodiscard]] int read_start(Ino ino, uint64_t off, size_t len, char* buf, size_t room,
                               size_t* got, std::unique_ptr<PendingRead>* pending) override;
  [[nodiscard]] int write(Ino ino, uint64_t off, size_t len, const char* buf, size_t* written,
                          bool* dropped_privs = nullptr,
                          WriteFrom from = WriteFrom::kWriter) override;
  [[nodiscard]] int fsync(Ino ino, bool datasync) override;
  [[nodiscard]] int fallocate(Ino ino, int mode, uint64_t off, uint64_t len) override;
  [[nodiscard]] int lseek(Ino ino, uint64_t off, int whence, uint64_t* out) override;
  [[nodiscard]] int inspect(Ino ino, InodeReport* out) override;
  [[nodiscard]] int copy_file_range(Ino in, uint64_t off_in, Ino out, uint64_t off_out,
                                    uint64_t len, uint64_t* copied) override;
  [[nodiscard]] int dedupe_range(Ino in, uint64_t off_in, Ino out, uint64_t off_out, uint64_t len,
                                 uint64_t* deduped) override;
  [[nodiscard]] int dedup(const DedupOptions& o, DedupReport* out) override;
  uint32_t block_refs(uint64_t block) override;
  [[nodiscard]] int get_flags(Ino ino, uint32_t* fs_flags) override;
  [[nodiscard]] int set_flags(Ino ino, uint32_t fs_flags) override;
  [[nodiscard]] int opendir(Ino ino) override;
  [[nodiscard]] int readdir(Ino ino, uint64_t offset,
                            const std::function<bool(const DirEntry&)>& emit) override;
  [[nodiscard]] int setxattr(Ino ino, std::string_view name, const void* value, size_t size,
                             int flags) override;
  [[nodiscard]] int getxattr(Ino ino, std::string_view name, std::string* value) override;
  [[nodiscard]] int listxattr(Ino ino, std::string* names) override;
  [[nodiscard]] int removexattr(Ino ino, std::string_view name) override;
  [[nodiscard]] int remove_xattr_locked(Node& n, uint8_t index, std::string_view short_name);
  // One attribute of a node whose rw this thread holds (or that nobody can reach yet); the
  // setter inside a transaction. ENODATA, ENOSPC (the block is full).
  [[nodiscard]] int xattr_get_locked(Node& n, uint8_t index, std::string_view short_name,
                                     std::string* value);
  [[nodiscard]] int xattr_set_locked(Node& n, uint8_t index, std::string_view short_name,
                                     const std::string& value);
  [[nodiscard]] int drop_capability_locked(Node& n);
  [[nodiscard]] int statfs(struct statvfs* out) override;
  [[nodiscard]] int sync() override;
  void shrink_caches() override;
  FsStats stats() const override;
  bool read_only() const override { return ro_; }
  [[nodiscard]] int set_read_only(bool read_only) override;

 private:
  friend struct DirOps;
  using NodeRef = std::shared_ptr<Node>;

  // --- inodes (inode.cc)
  // Loads and verifies; EIO, ENOENT (free inode).
  [[nodiscard]] int get_node(Ino ino, NodeRef* out);
  // REQUIRES: rw exclusive (or the node being created), in a transaction.
  [[nodiscard]] int store(Node& n);
  void publish(Node& n);
  // n changed in the running transaction (Node::meta_txn; `data`: Node::data_txn too).
  // REQUIRES: rw exclusive (or the node being created), in a transaction.
  void note_changed(Node& n, bool data);
  template <typename D>  // Inode or Node::Published
  void fill_attr(const D& d, Ino ino, Attr* out) const {
    out->ino = ino;
    out->mode = d.mode;
    out->nlink = d.links;
    out->uid = d.uid;
    out->gid = d.gid;
    out->generation = d.generation;
    out->rdev = d.rdev;
    out->size = d.size;
    out->blocks = d.blocks * (kBlockSize / 512);
    out->atime = time_split(d.atime_ns);
    out->mtime = time_split(d.mtime_ns);
    out->ctime = time_split(d.ctime_ns);
  }
  // Exact times (FORMAT.md "Inode"): the fields of *out whose stored form in d is a sentinel,
  // from n's internal record; a missing or malformed one is logged and the field stays as
  // the nearest end. REQUIRES: rw held.
  void exact_times(Node& n, const Inode& d, Attr* out);
  // The same for a node read through its published attributes: takes rw shared when a
  // published time is a sentinel (rare). REQUIRES: no lock of n held.
  void exact_times_unlocked(Node& n, Attr* out);
  // n's internal times record: 0, ENODATA, or an error (EIO for a malformed one).
  [[nodiscard]] int times_record(Node& n, TimesRecord* r);
  // The inode-table block holding `ino`, and its slot's offset in it.
  uint64_t inode_block(Ino ino, size_t* off) const;
  // f(buffer, offset) for ino's slot, under its slot lock (MetaBuf's rules): the buffer may
  // be used only inside f.
  [[nodiscard]] int with_slot(Ino ino, const std::function<void(MetaBuf*, size_t)>& f);
  [[nodiscard]] int alloc_inode(Ino parent, bool dir, Ino* out);  // in a transaction
  void free_inode_bit(Ino ino, bool dir);
  // The inode slot becomes free (its generation kept for the next user) and its bit
  // clears. REQUIRES: rw exclusive or the node being created, in a transaction.
  [[nodiscard]] int free_inode(Node& n);
  // In a transaction.
  [[nodiscard]] int new_node(Ino parent, uint32_t mode, const Caller& c, NodeRef* out);
  void ref(Node& n, uint64_t lookups, uint32_t opens);
  // Frees an inode whose links, lookups and opens are all zero. REQUIRES: namespace_mu_.
  [[nodiscard]] int reclaim(const NodeRef& n);
  // REQUIRES: namespace_mu_, n.rw exclusive, in a transaction.
  [[nodiscard]] int orphan_add(Node& n);
  // The node before `n` on the orphan list (null: n is the head or not on it).
  // REQUIRES: namespace_mu_.
  [[nodiscard]] int orphan_pred(const Node& n, NodeRef* pred);
  // REQUIRES: namespace_mu_; n.rw and pred's exclusive (NodeLocks).
  [[nodiscard]] int orphan_remove(Node& n, Node* pred);
  void maybe_reclaim(Ino ino);

  // --- allocation (alloc.cc); in a transaction
  // `meta`: a block for metadata (extent-tree, directory, xattr), which may use the reserve
  // that file data may not: an operation that got its data blocks can then always map them.
  [[nodiscard]] int alloc_blocks(uint64_t goal, uint32_t want, uint64_t* first, uint32_t* got,
                                 bool meta = false);
  uint64_t available_blocks() const;  // free and not held by an uncommitted free
  void free_counts(uint64_t* blocks, uint64_t* inodes) const;  // sums over the groups
  // Frees a run of data blocks. Blocks outside every group's data area (the superblocks,
  // journal, descriptor table, a group's bitmaps and inode table) are logged as corruption
  // and stay as they are; so are blocks already free.
  void free_blocks(uint64_t first, uint64_t count);
  uint32_t group_of_block(uint64_t b) const { return b < L_.first_group ? 0 : L_.group_of(b); }
  uint64_t group_start(uint32_t g) const { return L_.group_start(g); }  // its block bitmap
  uint32_t group_size(uint32_t g) const {  // blocks; the last group may be shorter
    return static_cast<uint32_t>(L_.group_size(g));
  }
  // A group's block bitmap bits below this are its bitmaps and inode table (FORMAT.md
  // "Layout"): never allocatable, like the bits from group_size() on.
  uint32_t meta_bits() const { return 2 + L_.itb; }
  // "" for a block of a group's data area, else what holds it ("the inode table of group 3").
  std::string metadata_name(uint64_t b) const;
  // "" or why group g's block bitmap is corrupt: it marks the group's own metadata free.
  std::string check_block_bitmap(uint32_t g) const;
  [[nodiscard]] int load_groups();
  void finish_commit(std::vector<MetaBuf*>& dirty);

  // --- shared blocks (refcount.cc; FORMAT.md "Shared blocks")
  bool shared_blocks_enabled() const { return (sb_.features & kFeatureSharedBlocks) != 0; }
  // Group g's table, if its descriptor names one, read and verified (mount).
  [[nodiscard]] int load_refcounts(uint32_t g);
  // Raises the counts of the leading blocks of [first, first + count) (one group's run of
  // allocated data blocks) as a new extent comes to map them: *shared of them (fewer where a
  // block is at kMaxRefcount). Makes the group's table if it has none. ENOSPC: no room for a
  // table in the group. In a transaction.
  [[nodiscard]] int share_blocks(uint64_t first, uint32_t count, uint32_t* shared);
  // Of [first, first + count) (one extent's run): how many leading blocks are alike in being
  // shared or not, and which (*shared).
  uint64_t shared_prefix(uint64_t first, uint64_t count, bool* shared);
  // Whether any block of [first, first + count) is shared (count ≥ 2).
  bool any_shared(uint64_t first, uint64_t count) {
    bool shared;
    return shared_prefix(first, count, &shared) < count || shared;
  }
  // The count of group g's block `bit` (0: not shared). REQUIRES: the group's mu.
  uint32_t refs_locked(Group& gr, uint32_t bit) const;
  // Sets it and the statistics. REQUIRES: the group's mu, its table, in a transaction.
  void set_refs_locked(Group& gr, uint32_t bit, uint32_t v);
  // Whether group g keeps its last kRefcountBlocks blocks from file data for a table it may
  // need (shared blocks on, no table yet, a group long enough). REQUIRES: its mu.
  bool table_room(uint32_t g) const {
    return shared_blocks_enabled() && groups_[g].refs[0] == nullptr &&
           group_size(g) >= meta_bits() + 2 * kRefcountBlocks;
  }
  // Makes group g's table: 17 free contiguous blocks of its data area, the last ones kept
  // for it (table_room) if free, else the first such run. REQUIRES: its mu, in a transaction.
  // ENOSPC: no such run.
  [[nodiscard]] int make_refcount_table(uint32_t g);
  // Blocks whose count is at least 2, and the sum of (count - 1) over them: the blocks that
  // sharing saved.
  std::atomic<uint64_t> shared_blocks_{0}, saved_blocks_{0};
  void take_freed();
  void release_freed();

  // --- extents (extents.cc); REQUIRES: rw held (exclusive for changes, which are in a
  // transaction), or the node being created; the mapping loaded (but by load_map)
  [[nodiscard]] int load_map(Node& n);
  // A shared lock on n.rw with the mapping loaded: the exclusive lock is taken only for the
  // first load, so readers of a loaded node never exclude each other. Unlocked on error.
  [[nodiscard]] int lock_mapped(Node& n, std::shared_lock<SharedMutex>* lk);
  // Finds the extent covering `lblk`, or the hole up to the next extent.
  struct Mapping {
    bool hole;
    uint32_t logical, length;  // the run starting at lblk
    uint64_t physical;         // hole: 0
    bool unwritten;
  };
  Mapping map_lookup(Node& n, uint32_t lblk);
  // A read's start (read, read_start): the node, its rw shared with the mapping loaded, and
  // *len cut at the file's end (0: nothing to read).
  [[nodiscard]] int lock_for_read(Ino ino, uint64_t off, size_t* len, NodeRef* n,
                                  std::shared_lock<SharedMutex>* lk);
  // Whole blocks of a file into dst (holes as zeroes). REQUIRES: n.rw held, n mapped.
  int read_blocks(Node& n, uint64_t first, uint64_t count, uint8_t* dst,
                  ReadFor purpose = ReadFor::kCache);
  // Removes [l, l + count) from the mapping; removed runs go to `removed`.
  [[nodiscard]] int map_remove(Node& n, uint32_t l, uint64_t count, std::vector<Extent>* removed);
  [[nodiscard]] int map_insert(Node& n, Extent e);  // REQUIRES: [e.logical, +blocks) is a hole
  [[nodiscard]] int map_store(Node& n);             // writes changed leaves/index, then the inode
  // Frees the mapped blocks in [l, end) and their accounting. In a transaction.
  [[nodiscard]] int punch(Node& n, uint32_t l, uint64_t count);
  // Frees beyond, in transactions of its own. REQUIRES: rw exclusive, not in a transaction.
  [[nodiscard]] int truncate_blocks(Node& n, uint64_t new_size);
  uint64_t alloc_goal(Node& n, uint32_t lblk);
  [[nodiscard]] int alloc_meta_block(Node& n, uint64_t* out);

  // --- file data (file.cc)
  [[nodiscard]] int write_locked(Node& n, uint64_t off, size_t len, const char* buf,
                                 size_t* written, WriteFrom from = WriteFrom::kWriter);
  [[nodiscard]] int zero_range(Node& n, uint64_t off, uint64_t len);  // within mapped blocks
  [[nodiscard]] int remap(Node& n, uint32_t l, uint64_t count, uint64_t to, uint64_t from);
  // What a writer's write does besides the data (write_locked, copy_file_range): mtime and
  // ctime now, set-user-ID and set-group-ID and security.capability dropped. REQUIRES: rw
  // exclusive, in a transaction.
  [[nodiscard]] int written_by_writer(Node& n);
  // Set-user-ID, set-group-ID (group-executable) and security.capability dropped, as a
  // change of the contents does. REQUIRES: rw exclusive, in a transaction.
  [[nodiscard]] int drop_privileges_locked(Node& n);
  // write()'s body: [off, off + len) in transactions of at most kBlocksPerTxn blocks, each
  // retried after a commit on ENOSPC. REQUIRES: rw exclusive, mapping loaded.
  [[nodiscard]] int write_all_locked(Node& n, uint64_t off, size_t len, const char* buf,
                                     size_t* written, WriteFrom from);

  // --- clones and deduplication (share.cc)
  // Bytes of `in` copied to `out` through a buffer. REQUIRES: both rw exclusive, mapped.
  [[nodiscard]] int copy_bytes(Node& in, uint64_t off_in, Node& out, uint64_t off_out, uint64_t len,
                               uint64_t* copied);
  // Whole blocks [l_in, +count) of `in` mapped into `out` at l_out, sharing in's written
  // blocks (in's holes and unwritten ranges become holes); what cannot be shared is copied.
  // REQUIRES: both rw exclusive, mapped, not in a transaction.
  // out's size grows with what is mapped, up to `end` (the copy's end in bytes).
  [[nodiscard]] int clone_blocks(Node& in, uint32_t l_in, Node& out, uint32_t l_out, uint64_t count,
                                 uint64_t end, uint64_t* done);
  // Unmaps [l, l + count) of n a few extents per transaction (truncate_blocks' bound).
  // REQUIRES: rw exclusive, mapped, not in a transaction.
  [[nodiscard]] int punch_bounded(Node& n, uint64_t l, uint64_t count);
  // The whole blocks of `out` at l_out that equal in's at l_in (both written, not yet the same
  // block) come to share in's: *shared of `count`. REQUIRES: both rw exclusive, mapped.
  [[nodiscard]] int dedupe_blocks(Node& in, uint32_t l_in, Node& out, uint32_t l_out,
                                  uint32_t count, uint64_t* shared);
  std::atomic<uint64_t> clones_{0}, cloned_blocks_{0}, cow_blocks_{0}, deduped_blocks_{0};
  std::atomic<bool> copy_notice_{false};  // the notice that clones need the feature: logged once
  // A write wholly over mapped, written blocks inside the size of a file with no privilege
  // to drop (kPageCache: none to drop here), with n.rw shared and no transaction: true if it
  // took it (*rc its result), false if the write must take the ordinary path. REQUIRES: no
  // lock of n's.
  bool overwrite(Node& n, uint64_t off, size_t len, const char* buf, size_t* written, int* rc,
                 WriteFrom from);
  // Whether [off, off + len) of `buf` equals the file's bytes there (the part below the
  // size). REQUIRES: rw exclusive, mapping loaded.
  [[nodiscard]] int same_bytes(Node& n, uint64_t off, size_t len, const char* buf, bool* same);
  // Data of `n` written to device blocks [first, first + count): fsync writes them back.
  // REQUIRES: rw held (shared: the overwrite fast path).
  void note_written(Node& n, uint64_t first, uint64_t count);
  // Overwrite times (Node::pending_times) into n.disk. REQUIRES: rw exclusive.
  void fold_times(Node& n);
  // Stores n's overwrite times, if it has any (not once freed), in a transaction of its own.
  // REQUIRES: rw exclusive, not in a transaction.
  [[nodiscard]] int store_times_locked(Node& n);
  // Stores the nodes on times_dirty_ (each in a transaction of its own). `wait`: blocks on
  // their locks (sync, fsync, unmount); else (the committer, which must never wait for an
  // operation that may wait for a commit) skips a busy node until next time. REQUIRES: no
  // node lock, not in a transaction.
  [[nodiscard]] int store_times(bool wait);
  std::mutex times_mu_;  // leaf: times_dirty_
  // Nodes whose pending_times were raised from 0 (duplicates possible; some may have been
  // stored since by another change).
  std::vector<Ino> times_dirty_;
  [[nodiscard]] int set_size(Node& n, uint64_t size);
  // Before growing from old to size.
  [[nodiscard]] int drop_past_eof(Node& n, uint64_t old, uint64_t size);

  // --- directories (dir.cc); REQUIRES: dir rw held (exclusive for changes, which are in a
  // transaction), or the directory being created
  [[nodiscard]] int dir_find(Node& dir, std::string_view name, Ino* ino, uint8_t* type);
  // These three in a transaction; dir_set replaces the target of an existing name.
  [[nodiscard]] int dir_add(Node& dir, std::string_view name, Ino ino, uint8_t type);
  [[nodiscard]] int dir_remove(Node& dir, std::string_view name);
  [[nodiscard]] int dir_set(Node& dir, std::string_view name, Ino ino, uint8_t type);
  [[nodiscard]] int dir_is_empty(Node& dir, bool* empty);
  [[nodiscard]] int dir_init(Node& dir, Ino parent);  // a new directory's index root and first leaf
  [[nodiscard]] int dir_block(Node& dir, uint32_t lblk, MetaBuf** out);
  [[nodiscard]] int dir_readdir(Node& dir, uint64_t offset,
                                const std::function<bool(const DirEntry&)>& emit);

  // --- xattrs (xattr.cc); REQUIRES: rw held (exclusive for changes, in a transaction)
  // The chain of xattr blocks, first to last (empty: none). EIO on a loop or a bad block.
  [[nodiscard]] int xattr_chain(Node& n, std::vector<MetaBuf*>* chain);
  // Frees every xattr block and value block of n (a freed or undone inode); what cannot be
  // read is left for fsck, but for the first block. Clears xattr_block.
  void xattr_free_all(Node& n);
  bool xattr_chains() const { return (sb_.features & kFeatureXattrChain) != 0; }
  // An out-of-line value: its `size` bytes from value blocks `blocks` (each verified as n's).
  [[nodiscard]] int xattr_read_value(Node& n, uint32_t size, const std::vector<uint64_t>& blocks,
                                     std::string* out);
  // Frees those of `blocks` that are n's value blocks (a corrupt record frees nothing else).
  void xattr_free_value(Node& n, const std::vector<uint64_t>& blocks);
  // Block i of the chain leaves it (and is freed) if it holds no entry.
  void xattr_unlink_if_empty(Node& n, std::vector<MetaBuf*>& chain, size_t i);
  // A metadata block of n's (tree, xattr) freed: dropped from the cache, n.disk.blocks less.
  void free_meta_block(Node& n, uint64_t block);

  // --- helpers
  static int check_name(std::string_view name);
  [[nodiscard]] int check_writable() const;
  void log(const std::string& s) const { log_(s); }
  // A header block of `owner` with magic `magic` (or `alt_magic`, if not 0), verified on
  // its first read; `layout`, if given, checks the rest ("" or what is wrong).
  [[nodiscard]] int meta_get(uint64_t block, MetaBuf** out, uint32_t magic, Ino owner,
                             uint32_t alt_magic = 0,
                             std::string (*layout)(const uint8_t*) = nullptr);
  // The allocating calls, once; their public versions retry them after a commit
  // (retry_enospc).
  [[nodiscard]] int link_once(Ino ino, Ino new_parent, std::string_view new_name, Attr* out);
  [[nodiscard]] int rename_once(Ino parent, std::string_view name, Ino new_parent,
                                std::string_view new_name, unsigned flags);
  [[nodiscard]] int setxattr_once(Ino ino, std::string_view name, const void* value, size_t size,
                                  int flags);
  [[nodiscard]] int create_locked(Ino parent, std::string_view name, uint32_t mode, const Caller& c,
                                  std::string_view symlink_target, Attr* out, uint64_t rdev);
  [[nodiscard]] int create_common(Ino parent, std::string_view name, uint32_t mode, const Caller& c,
                                  std::string_view symlink_target, Attr* out, uint64_t rdev = 0);
  [[nodiscard]] int unlink_common(Ino parent, std::string_view name, bool dir);
  void commit_loop();
  // --- the metadata cache's cap (inode.cc)
  // Drops clean cached metadata (MetaBuf's rules make it safe): blocks whose inodes are not
  // in the node table, and beyond the cap the least recently used. The committer runs it
  // after its commits, and at once when the journal reports pressure.
  void evict_metadata();
  // Gives the free pages of the buffers' pool (PagePool::trim) and of the heap (malloc_trim)
  // back to the kernel once evictions have freed
  // enough buffers since the last time. Not after each eviction: under pressure the freed
  // buffers are allocated again at once, and a trim per pass cost a page fault per buffer
  // (a directory-creating storm at the cap spent 10 % of the daemon's CPU trimming and
  // faulting). The committer's timed pass and shrink_caches() trim.
  void trim_heap();
  bool forgotten_inode_block(uint64_t block);  // REQUIRES: table_mu_
  size_t meta_cap_ = 0;                        // buffers (MountOptions::meta_cache_mb)
  std::mutex evict_mu_;         // one evict_metadata() or trim_heap() at a time (outermost)
  size_t untrimmed_ = 0;        // evict_mu_: buffers dropped since the last trim
  bool evict_wanted_ = false;   // committer_mu_
  bool commit_wanted_ = false;  // committer_mu_ (Journal::wants_commit)
  // Blocks freed by transactions not yet committed are not allocatable (FORMAT.md: reusing
  // them earlier could let a crash resurrect their old owner over new data), so a full disk
  // may only look full. After ENOSPC: commits if such blocks exist (they become free at
  // once); true if it did, and the allocation is worth retrying (ext4's retry_alloc).
  // REQUIRES: not in a transaction (the caller may hold node locks: a commit takes none).
  // Through FUSE, `rm f; fallocate g` may reach two daemon threads with f's FORGET (which
  // frees f: the kernel evicted it inside the unlink) processed beside g's allocation: the
  // freeing that is under way (reclaiming_) is waited for first, briefly (it may need a
  // node the caller holds).
  bool free_held_blocks();
  std::mutex reclaim_mu_;
  std::condition_variable reclaim_cv_;
  int reclaiming_ = 0;  // reclaim_mu_: forget() and release() calls under way
  // Runs f, and again after free_held_blocks() while it fails with ENOSPC and blocks were
  // held, up to kEnospcRetries times. Every allocating operation goes through this (or
  // retries its pieces the same way: write, fallocate), so space freed by unlink, truncate or
  // punch is there for the next one. More than one retry: between this thread's commit and
  // its retry another thread may take the space just freed and free its own into the next
  // transaction (two threads taking turns with most of the disk); each retry needs such a
  // whole cycle elsewhere to fail again, and the bound keeps a thread from committing
  // forever against a disk that is really full (ext4_should_retry_alloc bounds its retries
  // the same way).
  static constexpr int kEnospcRetries = 8;
  template <typename F>
  [[nodiscard]] int retry_enospc(F f) {
    int rc = f();
    for (int i = 0; rc == ENOSPC && i < kEnospcRetries && free_held_blocks(); ++i) rc = f();
    return rc;
  }
  std::atomic<uint64_t> held_blocks_{0};

  // Set at mount (start()), read-only afterwards: shared by every thread without a lock.
  blockdev::BlockDevice& dev_;  // thread-safe itself (block_device.h)
  Superblock sb_;               // the geometry and seed; the live superblock is sb_buf_
  Layout L_;                    // from sb_ (changed only by grow(), which runs alone)
  MountOptions opts_;
  std::function<void(const std::string&)> log_;
  // Read-only: set at mount, flipped only by set_read_only (under remount_mu_); read anywhere.
  std::atomic<bool> ro_;
  std::mutex remount_mu_;
  [[nodiscard]] int write_clean_superblock();  // primary then backup, flushed
  // The live superblock, dirty, written home and flushed (after the commit that marked it):
  // 0, or an errno with *what saying which step failed.
  [[nodiscard]] int write_dirty_superblock(std::string* what);
  std::unique_ptr<Journal> journal_;  // thread-safe itself (journal.h)
  // Pinned buffers: the superblock (orphan_head under orphan_mu_ and namespace_mu_, the
  // counts and checksum written by finish_commit under the closed gate), the descriptor
  // table (each descriptor under its group's mu; checksums under the closed gate).
  MetaBuf* sb_buf_ = nullptr;
  std::vector<MetaBuf*> gdt_;
  std::unique_ptr<Group[]> groups_;
  uint64_t data_blocks_total_ = 0;
  uint64_t meta_reserve_ = 0;  // blocks only metadata may take (alloc_blocks)
  // Blocks file data of callers without the right to them leaves free (FORMAT.md "Reserved
  // blocks"; set at mount, read-only after).
  uint64_t root_reserve_ = 0;
  // Blocks such allocations are taking right now (atomic, sequentially consistent): each
  // counts the others' in its check, so that together they never go below the line.
  std::atomic<uint64_t> unreserved_in_flight_{0};
  bool may_use_root_reserve() const;
  // `keep_tables`: not the blocks kept for a group's count table (table_room).
  [[nodiscard]] int alloc_blocks_from(uint64_t goal, uint32_t want, uint64_t* first, uint32_t* got,
                                      bool keep_tables);

  // Level 1 (filesystem.h): every change of a name (create, link, unlink, rename) and the
  // freeing of an inode (reclaim, the orphan list), so that they may lock several nodes.
  Mutex namespace_mu_;
  mutable Mutex table_mu_;  // leaf: nodes_, table_epoch_, and Node::nlookup/opens
  std::unordered_map<Ino, NodeRef> nodes_;
  uint64_t table_epoch_ = 0;  // bumped whenever a node leaves nodes_ (get_node's re-check)
  // fsync's bookkeeping of linked nodes that left the table with something not yet durable
  // (table_mu_): the next get_node of the inode takes it back, so that a file closed,
  // forgotten and opened again is still synced. Data written since its last fsync is kept
  // as "all" (its next fsync writes back the whole cache) rather than as runs.
  struct SyncLeftover {
    bool written_all;
    uint64_t flush_gen, meta_txn, data_txn;
  };
  std::unordered_map<Ino, SyncLeftover> sync_leftovers_;
  // REQUIRES: table_mu_, and nobody else holds `n` (it is leaving the table).
  void keep_sync_state(Node& n);
  void adopt_sync_state(Node& n);  // REQUIRES: table_mu_, `n` not yet in the table
  // Leaf locks over the inode slots of the inode-table buffers: store() writes a slot while
  // get_node() may be reading another inode's of the same block, or (in the window where a
  // node leaves the table) the same one.
  static constexpr int kSlotLocks = 64;
  std::mutex slot_mus_[kSlotLocks];
  std::mutex& slot_mu(uint64_t block) { return slot_mus_[block % kSlotLocks]; }
  std::mutex orphan_mu_;  // leaf: orphan_head in sb_buf_ (also under namespace_mu_)

  // Blocks freed by the transaction being committed: trimmed, then reusable. Touched only by
  // the journal's precommit and committed hooks, which run inside Journal::commit under its
  // commit_mu_ (one commit at a time).
  std::vector<std::pair<uint64_t, uint64_t>> committing_freed_;
  std::vector<std::pair<uint32_t, uint32_t>> committing_unshared_;  // (group, bit), the same way

  std::thread committer_;    // started at mount, joined by unmount()/abandon()
  std::mutex committer_mu_;  // leaf: stopping_, evict_wanted_, commit_wanted_
  std::condition_variable committer_cv_;
  bool stopping_ = false;
  bool unmounted_ = false;  // unmount()'s caller (the one thread that unmounts)
  std::atomic<uint64_t> trims_{0}, trimmed_blocks_{0};
  uint64_t orphans_freed_ = 0, replayed_ = 0;  // written by start(), before any other thread
};

}  // namespace warpfs::fs
