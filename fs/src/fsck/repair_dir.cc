// Repair: a directory rewritten from its surviving entries (FORMAT.md "Directories"): index
// root, index blocks at depth 2, leaves packed in hash order. Pass 2 and pass 3 decide which
// directories (Info::rebuild); the write phase calls write_directory before the mappings
// and inodes are written, since it changes the directory's extents and size.
#include <algorithm>
#include <cstring>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

namespace {

// Leaves for `v` (sorted by hash) as [begin, end) ranges, each as full as it can be without
// splitting equal hashes (FORMAT.md "Directories"). An empty directory has one empty leaf.
std::vector<std::pair<size_t, size_t>> pack_leaves(const std::vector<Ent>& v) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t start = 0, used = 0;
  auto cut = [&](size_t at, size_t r) {
    if (used > 0 && used + r > kLeafSpace) {
      out.emplace_back(start, at);
      start = at;
      used = 0;
    }
  };
  for (size_t i = 0; i < v.size();) {
    size_t j = i, group = 0;
    while (j < v.size() && v[j].hash == v[i].hash) group += rec_len(v[j++].name.size());
    cut(i, group);
    if (group <= kLeafSpace) {
      used += group;
    } else {
      // More names of one hash than a leaf holds (never seen in practice): split them.
      for (size_t k = i; k < j; ++k) {
        cut(k, rec_len(v[k].name.size()));
        used += rec_len(v[k].name.size());
      }
    }
    i = j;
  }
  out.emplace_back(start, v.size());
  return out;
}

// One leaf: the entries v[range.first, range.second) into block `b`.
void put_leaf(uint8_t* b, const std::vector<Ent>& v, std::pair<size_t, size_t> range,
              uint64_t owner) {
  size_t off = sizeof(DirLeafHeader);
  for (size_t j = range.first; j < range.second; ++j) {
    const Ent& e = v[j];
    const DirEntryHeader h{e.hash, e.ino, rec_len(e.name.size()),
                           static_cast<uint8_t>(e.name.size()), e.type};
    std::memcpy(b + off, &h, sizeof h);
    std::memcpy(b + off + sizeof h, e.name.data(), e.name.size());
    off += h.rec_len;
  }
  const DirLeafHeader h{kDirLeafMagic,
                        static_cast<uint16_t>(range.second - range.first),
                        static_cast<uint16_t>(off - sizeof(DirLeafHeader)),
                        owner,
                        0,
                        0};
  std::memcpy(b, &h, sizeof h);
}

void put_index(uint8_t* b, uint16_t depth, const std::vector<DirIndexEntry>& e, uint64_t owner) {
  const DirIndexHeader h{
      kDirIndexMagic, static_cast<uint16_t>(e.size()), depth, kDirIndexCapacity, 0, owner, 0};
  std::memcpy(b, &h, sizeof h);
  std::memcpy(b + sizeof h, e.data(), e.size() * sizeof(DirIndexEntry));
}

// The index over `nl` leaves at directory blocks 1 + ni ...: the root alone (ni == 0) or
// the root over ni index blocks. low(i): leaf i's lowest hash.
void put_indexes(uint8_t* buf, uint64_t nl, uint64_t ni, const std::vector<uint64_t>& low,
                 uint64_t owner) {
  std::vector<DirIndexEntry> top;
  if (ni == 0) {
    for (uint64_t i = 0; i < nl; ++i)
      top.push_back(DirIndexEntry{low[i], static_cast<uint32_t>(1 + i), 0});
    put_index(buf, 1, top, owner);
    return;
  }
  for (uint64_t j = 0; j < ni; ++j) {
    std::vector<DirIndexEntry> sub;
    const uint64_t from = j * kDirIndexCapacity, to = std::min(nl, from + kDirIndexCapacity);
    for (uint64_t i = from; i < to; ++i)
      sub.push_back(DirIndexEntry{low[i], static_cast<uint32_t>(1 + ni + i), 0});
    put_index(buf + (1 + j) * kBlockSize, 1, sub, owner);
    top.push_back(DirIndexEntry{low[from], static_cast<uint32_t>(1 + j), 0});
  }
  put_index(buf, 2, top, owner);
}

}  // namespace

// Reuses the directory's blocks in order, allocating more if it needs them; the blocks it
// no longer needs are released (its mapping is rewritten after).
void Checker::write_directory(Info& d) {
  std::vector<Ent> v;
  for (const Ent& e : ents_[index_of(d)]) {
    if (!e.drop) v.push_back(e);
  }
  std::sort(v.begin(), v.end(), [](const Ent& a, const Ent& b) {
    return a.hash != b.hash ? a.hash < b.hash : a.name < b.name;
  });
  const auto leaves = pack_leaves(v);
  const uint64_t nl = leaves.size();
  const uint64_t ni = nl <= kDirIndexCapacity ? 0 : div_up(nl, kDirIndexCapacity);
  if (ni > kDirIndexCapacity) {
    unfixable("directory " + num(d.ino) + ": too many entries to rebuild its index");
    return;
  }
  const uint64_t need = 1 + ni + nl;
  std::vector<uint64_t> phys;
  if (!dir_blocks(d, need, &phys)) return;
  std::vector<uint8_t> buf(need * kBlockSize, 0);
  std::vector<uint64_t> low(nl);
  for (uint64_t i = 0; i < nl; ++i) {
    put_leaf(buf.data() + (1 + ni + i) * kBlockSize, v, leaves[i], d.ino);
    low[i] = i == 0 ? 0 : v[leaves[i].first].hash;
  }
  put_indexes(buf.data(), nl, ni, low, d.ino);
  std::vector<Extent> ext;
  for (uint64_t k = 0; k < need; ++k) {
    uint8_t* b = buf.data() + k * kBlockSize;
    const uint64_t c = block_checksum(b, kHeaderChecksumOffset, L_.seed);
    std::memcpy(b + kHeaderChecksumOffset, &c, 8);
  }
  for (uint64_t k = 0; k < need;) {
    uint64_t j = k + 1;
    while (j < need && phys[j] == phys[j - 1] + 1) ++j;
    if (!write(phys[k], j - k, buf.data() + k * kBlockSize)) return;
    ext.push_back(Extent{static_cast<uint32_t>(k), static_cast<uint32_t>(j - k), phys[k]});
    k = j;
  }
  d.ext = std::move(ext);
  d.size = need * kBlockSize;
  d.remap = d.dirty = true;
  d.rebuild = false;
}

// The `need` device blocks the rebuilt directory goes to: its own first, in order.
bool Checker::dir_blocks(Info& d, uint64_t need, std::vector<uint64_t>* phys) {
  for (const Extent& e : d.ext) {
    for (uint64_t k = 0; k < e.blocks() && phys->size() < need; ++k)
      phys->push_back(e.physical + k);
  }
  while (phys->size() < need) {
    uint64_t f, got;
    if (!alloc(need - phys->size(), &f, &got)) {
      unfixable("directory " + num(d.ino) + ": no free blocks to rebuild it in");
      return false;
    }
    for (uint64_t k = 0; k < got; ++k) phys->push_back(f + k);
  }
  return true;
}

}  // namespace warpfs::fs::fsck_impl
