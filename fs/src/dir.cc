// Hashed directories (fs/FORMAT.md "Directories"): an index root at directory block 0, a
// second index level past 254 leaves, and leaves of entries sorted by name hash. A lookup
// reads at most three blocks; readdir walks leaves in hash order with the hash as cookie.
#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "internal.h"

namespace warpfs::fs {

namespace {

constexpr size_t kLeafSpace = kBlockSize - sizeof(DirLeafHeader);

uint16_t rec_len(size_t name_len) {
  return static_cast<uint16_t>((sizeof(DirEntryHeader) + name_len + 7) & ~size_t{7});
}

struct Entry {
  uint64_t hash;
  Ino ino;
  uint8_t type;
  std::string name;
};

DirLeafHeader leaf_header(const MetaBuf* b) {
  DirLeafHeader h;
  std::memcpy(&h, b->data, sizeof h);
  return h;
}

DirIndexHeader index_header(const MetaBuf* b) {
  DirIndexHeader h;
  std::memcpy(&h, b->data, sizeof h);
  return h;
}

DirIndexEntry* index_entries(MetaBuf* b) {
  return reinterpret_cast<DirIndexEntry*>(b->data + sizeof(DirIndexHeader));
}

// Calls f(offset, header, name) for each entry of a leaf, in order, until f returns false.
template <typename F>
void for_each_entry(const MetaBuf* b, F f) {
  const DirLeafHeader h = leaf_header(b);
  size_t off = sizeof(DirLeafHeader);
  for (uint16_t i = 0; i < h.count && off + sizeof(DirEntryHeader) <= kBlockSize; ++i) {
    DirEntryHeader e;
    std::memcpy(&e, b->data + off, sizeof e);
    if (e.rec_len < sizeof e || off + e.rec_len > kBlockSize) return;
    if (!f(off, e,
           std::string_view(reinterpret_cast<const char*>(b->data + off + sizeof e), e.name_len)))
      return;
    off += e.rec_len;
  }
}

std::vector<Entry> read_leaf(const MetaBuf* b) {
  std::vector<Entry> v;
  for_each_entry(b, [&](size_t, const DirEntryHeader& e, std::string_view name) {
    v.push_back(Entry{e.hash, e.inode, e.type, std::string(name)});
    return true;
  });
  return v;
}

void write_leaf(MetaBuf* b, Ino owner, const std::vector<Entry>& v) {
  std::memset(b->data, 0, kBlockSize);
  size_t off = sizeof(DirLeafHeader);
  for (const Entry& x : v) {
    DirEntryHeader e{x.hash, x.ino, rec_len(x.name.size()), static_cast<uint8_t>(x.name.size()),
                     x.type};
    std::memcpy(b->data + off, &e, sizeof e);
    std::memcpy(b->data + off + sizeof e, x.name.data(), x.name.size());
    off += e.rec_len;
  }
  DirLeafHeader h{kDirLeafMagic,
                  static_cast<uint16_t>(v.size()),
                  static_cast<uint16_t>(off - sizeof(DirLeafHeader)),
                  owner,
                  0,
                  0};
  std::memcpy(b->data, &h, sizeof h);
}

// Where a leaf's entries end, if its header agrees with them (every entry well formed, as
// many as `count`, filling exactly `used` bytes); 0 for a damaged leaf, which the callers
// rebuild from what for_each_entry can read instead of editing it in place.
size_t entries_end(const MetaBuf* b) {
  const DirLeafHeader h = leaf_header(b);
  size_t end = sizeof(DirLeafHeader);
  uint16_t n = 0;
  for_each_entry(b, [&](size_t off, const DirEntryHeader& e, std::string_view) {
    if (off != end || e.rec_len != rec_len(e.name_len)) return false;
    end += e.rec_len;
    ++n;
    return true;
  });
  return n == h.count && end - sizeof(DirLeafHeader) == h.used ? end : 0;
}

void set_leaf_counts(MetaBuf* b, uint16_t count, uint16_t used) {
  DirLeafHeader h = leaf_header(b);
  h.count = count;
  h.used = used;
  std::memcpy(b->data, &h, sizeof h);
}

// The entry of an index node covering `hash`: the last whose hash_low <= hash.
uint16_t index_pick(MetaBuf* b, uint64_t hash) {
  const DirIndexHeader h = index_header(b);
  const DirIndexEntry* e = index_entries(b);
  uint16_t lo = 1, hi = h.count;
  while (lo < hi) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (e[mid].hash_low <= hash)
      lo = static_cast<uint16_t>(mid + 1);
    else
      hi = mid;
  }
  return static_cast<uint16_t>(lo - 1);
}

void index_insert(MetaBuf* b, uint16_t after, uint64_t hash_low, uint32_t block) {
  DirIndexHeader h = index_header(b);
  DirIndexEntry* e = index_entries(b);
  std::memmove(e + after + 2, e + after + 1, (h.count - after - 1) * sizeof *e);
  e[after + 1] = DirIndexEntry{hash_low, block, 0};
  h.count = static_cast<uint16_t>(h.count + 1);
  std::memcpy(b->data, &h, sizeof h);
}

}  // namespace

// A directory block by its index within the directory.
int FsImpl::dir_block(Node& dir, uint32_t lblk, MetaBuf** out) {
  WARPFS_DCHECK(readable_by_me(dir), "dir_block: dir rw held");
  if (int rc = load_map(dir); rc) return rc;
  const Mapping m = map_lookup(dir, lblk);
  if (m.hole || m.unwritten) {
    log("directory " + std::to_string(dir.ino) + ": block " + std::to_string(lblk) +
        " is not mapped (run fsck.warpfs)");
    return EIO;
  }
  return meta_get(m.physical, out, kDirIndexMagic, dir.ino, kDirLeafMagic);
}

namespace {
struct Path {
  uint32_t root_entry = 0;   // entry in the root
  uint32_t index_lblk = 0;   // depth 2: the index block (0: none)
  uint32_t index_entry = 0;  // depth 2: entry in it
  uint32_t leaf = 0;         // leaf lblk
};
}  // namespace

struct DirOps {
  static int find_path(FsImpl& fs, Node& dir, uint64_t hash, Path* p, MetaBuf** root,
                       MetaBuf** index, MetaBuf** leaf) {
    if (int rc = fs.dir_block(dir, 0, root); rc) return rc;
    const DirIndexHeader rh = index_header(*root);
    if (rh.magic != kDirIndexMagic || rh.count == 0 || rh.count > kDirIndexCapacity ||
        (rh.depth != 1 && rh.depth != 2)) {
      fs.log("directory " + std::to_string(dir.ino) + ": bad index root (run fsck.warpfs)");
      return EIO;
    }
    p->root_entry = index_pick(*root, hash);
    uint32_t next = index_entries(*root)[p->root_entry].block;
    *index = nullptr;
    p->index_lblk = 0;
    if (rh.depth == 2) {
      p->index_lblk = next;
      if (int rc = fs.dir_block(dir, next, index); rc) return rc;
      const DirIndexHeader ih = index_header(*index);
      if (ih.magic != kDirIndexMagic || ih.count == 0 || ih.count > kDirIndexCapacity) {
        fs.log("directory " + std::to_string(dir.ino) + ": bad index block (run fsck.warpfs)");
        return EIO;
      }
      p->index_entry = index_pick(*index, hash);
      next = index_entries(*index)[p->index_entry].block;
    }
    p->leaf = next;
    if (int rc = fs.dir_block(dir, next, leaf); rc) return rc;
    if (leaf_header(*leaf).magic != kDirLeafMagic) {
      fs.log("directory " + std::to_string(dir.ino) + ": bad leaf (run fsck.warpfs)");
      return EIO;
    }
    return 0;
  }

  // Appends a new block to the directory. In a transaction.
  static int grow(FsImpl& fs, Node& dir, uint32_t* lblk, MetaBuf** out) {
    const auto l = static_cast<uint32_t>(dir.disk.size / kBlockSize);
    uint64_t phys;
    uint32_t got;
    if (int rc = fs.alloc_blocks(fs.alloc_goal(dir, l), 1, &phys, &got, true); rc) return rc;
    if (int rc = fs.map_insert(dir, Extent{l, 1, phys}); rc) {
      fs.free_blocks(phys, 1);
      return rc;
    }
    dir.disk.size += kBlockSize;
    dir.disk.blocks += 1;
    *lblk = l;
    *out = fs.journal_->create(phys, MetaKind::kHeader, dir.ino);
    fs.journal_->dirty(*out);
    return 0;
  }

  static void new_index(MetaBuf* b, Ino owner, uint16_t depth, const DirIndexEntry* e, uint16_t n) {
    std::memset(b->data, 0, kBlockSize);
    DirIndexHeader h{kDirIndexMagic, n, depth, kDirIndexCapacity, 0, owner, 0};
    std::memcpy(b->data, &h, sizeof h);
    std::memcpy(index_entries(b), e, n * sizeof *e);
  }
};

int FsImpl::dir_init(Node& dir, Ino parent) {
  WARPFS_DCHECK(changeable_by_me(dir), "dir_init: dir rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "dir_init: in a transaction");
  dir.disk.size = 0;
  dir.disk.parent = parent;
  dir.disk.dir_seed = (now_ns() * 0x9e3779b97f4a7c15ull) ^ (dir.ino * 0xbf58476d1ce4e5b9ull);
  uint32_t l0, l1;
  MetaBuf *root, *leaf;
  if (int rc = DirOps::grow(*this, dir, &l0, &root); rc) return rc;
  if (int rc = DirOps::grow(*this, dir, &l1, &leaf); rc) return rc;
  const DirIndexEntry e{0, l1, 0};
  DirOps::new_index(root, dir.ino, 1, &e, 1);
  write_leaf(leaf, dir.ino, {});
  return 0;
}

int FsImpl::dir_find(Node& dir, std::string_view name, Ino* ino, uint8_t* type) {
  WARPFS_DCHECK(readable_by_me(dir), "dir_find: dir rw held");
  const uint64_t h = name_hash(name.data(), name.size(), dir.disk.dir_seed);
  Path p;
  MetaBuf *root, *index, *leaf;
  if (int rc = DirOps::find_path(*this, dir, h, &p, &root, &index, &leaf); rc) return rc;
  int rc = ENOENT;
  for_each_entry(leaf, [&](size_t, const DirEntryHeader& e, std::string_view n) {
    if (e.hash > h) return false;
    if (e.hash == h && n == name) {
      *ino = e.inode;
      *type = e.type;
      rc = 0;
      return false;
    }
    return true;
  });
  return rc;
}

int FsImpl::dir_add(Node& dir, std::string_view name, Ino ino, uint8_t type) {
  WARPFS_DCHECK(changeable_by_me(dir), "dir_add: dir rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "dir_add: in a transaction");
  const uint64_t h = name_hash(name.data(), name.size(), dir.disk.dir_seed);
  const uint16_t need = rec_len(name.size());
  // The worst case below takes three blocks (two index blocks and a leaf) and a mapping
  // block: refuse before changing anything rather than fail halfway.
  if (available_blocks() < 4) return ENOSPC;
  for (int attempt = 0; attempt < 8; ++attempt) {
    Path p;
    MetaBuf *root, *index, *leaf;
    if (int rc = DirOps::find_path(*this, dir, h, &p, &root, &index, &leaf); rc) return rc;
    DirLeafHeader lh = leaf_header(leaf);
    if (lh.used + need <= kLeafSpace) {
      if (const size_t end = entries_end(leaf); end != 0) {
        // In place: the entries from the first of a higher hash move up by `need` (no
        // rebuild of the block, no allocation; the bytes are write_leaf's).
        size_t at = end;
        for_each_entry(leaf, [&](size_t off, const DirEntryHeader& e, std::string_view) {
          if (e.hash <= h) return true;
          at = off;
          return false;
        });
        std::memmove(leaf->data + at + need, leaf->data + at, end - at);
        std::memset(leaf->data + at, 0, need);
        const DirEntryHeader e{h, ino, need, static_cast<uint8_t>(name.size()), type};
        std::memcpy(leaf->data + at, &e, sizeof e);
        std::memcpy(leaf->data + at + sizeof e, name.data(), name.size());
        set_leaf_counts(leaf, static_cast<uint16_t>(lh.count + 1),
                        static_cast<uint16_t>(lh.used + need));
      } else {
        std::vector<Entry> v = read_leaf(leaf);
        auto it = std::upper_bound(v.begin(), v.end(), h,
                                   [](uint64_t x, const Entry& e) { return x < e.hash; });
        v.insert(it, Entry{h, ino, type, std::string(name)});
        write_leaf(leaf, dir.ino, v);
      }
      journal_->dirty(leaf);
      return map_store(dir);
    }
    // The leaf is full. Make room in its parent index first, then split the leaf.
    MetaBuf* parent = index ? index : root;
    const uint16_t parent_entry = static_cast<uint16_t>(index ? p.index_entry : p.root_entry);
    if (index_header(parent).count >= kDirIndexCapacity) {
      const DirIndexHeader rh = index_header(root);
      if (!index) {
        // Depth 1 -> 2: the root's entries move into two index blocks.
        uint32_t la, lb;
        MetaBuf *a, *b;
        if (int rc = DirOps::grow(*this, dir, &la, &a); rc) return rc;
        if (int rc = DirOps::grow(*this, dir, &lb, &b); rc) return rc;
        const DirIndexEntry* e = index_entries(root);
        const uint16_t half = static_cast<uint16_t>(rh.count / 2);
        DirOps::new_index(a, dir.ino, 1, e, half);
        DirOps::new_index(b, dir.ino, 1, e + half, static_cast<uint16_t>(rh.count - half));
        const DirIndexEntry top[2] = {{0, la, 0}, {e[half].hash_low, lb, 0}};
        DirOps::new_index(root, dir.ino, 2, top, 2);
        index_entries(a)[0].hash_low = 0;
      } else {
        if (rh.count >= kDirIndexCapacity) {
          log("directory " + std::to_string(dir.ino) + " is full (" +
              std::to_string(kDirIndexCapacity) + "^2 leaves)");
          return ENOSPC;
        }
        uint32_t lb;
        MetaBuf* b;
        if (int rc = DirOps::grow(*this, dir, &lb, &b); rc) return rc;
        const DirIndexHeader ih = index_header(index);
        const uint16_t half = static_cast<uint16_t>(ih.count / 2);
        const DirIndexEntry* e = index_entries(index);
        const uint64_t split = e[half].hash_low;
        DirOps::new_index(b, dir.ino, 1, e + half, static_cast<uint16_t>(ih.count - half));
        DirIndexHeader nh = ih;
        nh.count = half;
        std::memcpy(index->data, &nh, sizeof nh);
        index_insert(root, static_cast<uint16_t>(p.root_entry), split, lb);
        journal_->dirty(index);
      }
      journal_->dirty(root);
      continue;  // find the path again
    }
    std::vector<Entry> v = read_leaf(leaf);
    // Split at the median, never between equal hashes.
    size_t m = v.size() / 2;
    while (m < v.size() && m > 0 && v[m].hash == v[m - 1].hash) ++m;
    if (m == v.size()) {
      m = v.size() / 2;
      while (m > 0 && v[m].hash == v[m - 1].hash) --m;
    }
    if (m == 0) {
      log("directory " + std::to_string(dir.ino) + ": a leaf full of one hash");
      return ENOSPC;
    }
    uint32_t nl;
    MetaBuf* nb;
    if (int rc = DirOps::grow(*this, dir, &nl, &nb); rc) return rc;
    std::vector<Entry> upper(v.begin() + static_cast<long>(m), v.end());
    v.resize(m);
    write_leaf(leaf, dir.ino, v);
    write_leaf(nb, dir.ino, upper);
    index_insert(parent, parent_entry, upper.front().hash, nl);
    journal_->dirty(leaf);
    journal_->dirty(parent);
  }
  return EIO;
}

int FsImpl::dir_remove(Node& dir, std::string_view name) {
  WARPFS_DCHECK(changeable_by_me(dir), "dir_remove: dir rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "dir_remove: in a transaction");
  const uint64_t h = name_hash(name.data(), name.size(), dir.disk.dir_seed);
  Path p;
  MetaBuf *root, *index, *leaf;
  if (int rc = DirOps::find_path(*this, dir, h, &p, &root, &index, &leaf); rc) return rc;
  if (const size_t end = entries_end(leaf); end != 0) {
    // In place: the entries after it move down over it, and the bytes it leaves are zeroed.
    size_t at = 0, len = 0;
    for_each_entry(leaf, [&](size_t off, const DirEntryHeader& e, std::string_view n) {
      if (e.hash > h) return false;
      if (e.hash == h && n == name) {
        at = off;
        len = e.rec_len;
        return false;
      }
      return true;
    });
    if (len == 0) return ENOENT;
    std::memmove(leaf->data + at, leaf->data + at + len, end - at - len);
    std::memset(leaf->data + end - len, 0, len);
    const DirLeafHeader lh = leaf_header(leaf);
    set_leaf_counts(leaf, static_cast<uint16_t>(lh.count - 1),
                    static_cast<uint16_t>(lh.used - len));
  } else {
    std::vector<Entry> v = read_leaf(leaf);
    auto it = std::find_if(v.begin(), v.end(),
                           [&](const Entry& e) { return e.hash == h && e.name == name; });
    if (it == v.end()) return ENOENT;
    v.erase(it);
    write_leaf(leaf, dir.ino, v);
  }
  journal_->dirty(leaf);
  return map_store(dir);
}

int FsImpl::dir_set(Node& dir, std::string_view name, Ino ino, uint8_t type) {
  WARPFS_DCHECK(changeable_by_me(dir), "dir_set: dir rw exclusive");
  WARPFS_DCHECK(journal_->in_transaction(), "dir_set: in a transaction");
  const uint64_t h = name_hash(name.data(), name.size(), dir.disk.dir_seed);
  Path p;
  MetaBuf *root, *index, *leaf;
  if (int rc = DirOps::find_path(*this, dir, h, &p, &root, &index, &leaf); rc) return rc;
  int rc = ENOENT;
  for_each_entry(leaf, [&](size_t off, const DirEntryHeader& e, std::string_view n) {
    if (e.hash == h && n == name) {
      DirEntryHeader ne = e;
      ne.inode = ino;
      ne.type = type;
      std::memcpy(leaf->data + off, &ne, sizeof ne);
      rc = 0;
      return false;
    }
    return e.hash <= h;
  });
  if (rc == 0) {
    journal_->dirty(leaf);
    return map_store(dir);
  }
  return rc;
}

int FsImpl::dir_is_empty(Node& dir, bool* empty) {
  WARPFS_DCHECK(readable_by_me(dir), "dir_is_empty: dir rw held");
  *empty = true;
  return dir_readdir(dir, 2, [&](const DirEntry&) {
    *empty = false;
    return false;
  });
}

int FsImpl::dir_readdir(Node& dir, uint64_t offset,
                        const std::function<bool(const DirEntry&)>& emit) {
  WARPFS_DCHECK(readable_by_me(dir), "dir_readdir: dir rw held");
  if (offset == 0 && !emit(DirEntry{".", dir.ino, DT_DIR, 1})) return 0;
  if (offset <= 1 && !emit(DirEntry{"..", dir.disk.parent, DT_DIR, 2})) return 0;
  const uint64_t from = std::max<uint64_t>(offset, 2);
  // The leaves in hash order, from the one holding `from`.
  MetaBuf* root;
  if (int rc = dir_block(dir, 0, &root); rc) return rc;
  const DirIndexHeader rh = index_header(root);
  std::vector<uint32_t> leaves;
  std::vector<DirIndexEntry> re(
      index_entries(root), index_entries(root) + std::min<uint32_t>(rh.count, kDirIndexCapacity));
  for (size_t i = 0; i < re.size(); ++i) {
    if (i + 1 < re.size() && re[i + 1].hash_low <= from) continue;
    if (rh.depth == 1) {
      leaves.push_back(re[i].block);
      continue;
    }
    MetaBuf* ib;
    if (int rc = dir_block(dir, re[i].block, &ib); rc) return rc;
    const DirIndexHeader ih = index_header(ib);
    const DirIndexEntry* ie = index_entries(ib);
    const uint32_t entries = std::min<uint32_t>(ih.count, kDirIndexCapacity);
    for (uint16_t k = 0; k < entries; ++k) {
      if (k + 1u < entries && ie[k + 1].hash_low <= from) continue;
      leaves.push_back(ie[k].block);
    }
  }
  for (uint32_t l : leaves) {
    MetaBuf* lb;
    if (int rc = dir_block(dir, l, &lb); rc) return rc;
    std::vector<Entry> v = read_leaf(lb);
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i].hash < from) continue;
      // Colliding hashes share a cookie: all but the last resume at the group's start.
      const bool last_of_group = i + 1 == v.size() || v[i + 1].hash != v[i].hash;
      if (!emit(DirEntry{v[i].name, v[i].ino, v[i].type,
                         last_of_group ? v[i].hash + 1 : v[i].hash})) {
        return 0;
      }
    }
  }
  return 0;
}

}  // namespace warpfs::fs
