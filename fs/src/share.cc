// Clones and deduplication (fs/FORMAT.md "Shared blocks", "Deduplication"): copy_file_range
// maps the source's blocks into the destination and counts them in the reference-count
// tables (refcount.cc) instead of copying bytes; dedupe_range and the dedup pass do the same
// for blocks that are equal byte for byte. Writes into a shared block copy it first
// (file.cc write_locked, zero_range), and freeing one drops a reference (alloc.cc).
//
// Locks: both inodes' rw exclusive, taken in inode-number order without namespace_mu_
// (filesystem.h level 2): every holder of several node locks takes them in that order, and
// nobody waits for namespace_mu_ while holding one, so no cycle can form.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "internal.h"
#include "xxh.h"

namespace warpfs::fs {

namespace {

constexpr uint32_t kCopyBlocks = 256;  // a copy's buffer: 1 MiB
constexpr int kRunsPerTxn = 4;         // extents a clone maps per transaction

// Exclusive locks on one or two nodes, in inode-number order.
class PairLock {
 public:
  PairLock(Node& a, Node& b) {
    Node* first = a.ino <= b.ino ? &a : &b;
    Node* second = a.ino <= b.ino ? &b : &a;
    l1_ = std::unique_lock<SharedMutex>(first->rw);
    if (second != first) l2_ = std::unique_lock<SharedMutex>(second->rw);
  }

 private:
  std::unique_lock<SharedMutex> l1_, l2_;
};

}  // namespace

uint32_t FsImpl::block_refs(uint64_t block) {
  if (block < group_start(0)) return 0;
  const uint32_t g = group_of_block(block);
  if (g >= sb_.group_count) return 0;
  Group& gr = groups_[g];
  if (!gr.has_refs.load(std::memory_order_acquire)) return 0;
  std::lock_guard<std::mutex> lk(gr.mu);
  return refs_locked(gr, static_cast<uint32_t>(block - group_start(g)));
}

int FsImpl::copy_bytes(Node& in, uint64_t off_in, Node& out, uint64_t off_out, uint64_t len,
                       uint64_t* copied) {
  std::vector<uint8_t> buf((kCopyBlocks + 1) * size_t{kBlockSize});
  while (*copied < len) {
    const uint64_t pos = off_in + *copied;
    const uint64_t chunk = std::min<uint64_t>(len - *copied, uint64_t{kCopyBlocks} * kBlockSize);
    const uint64_t first = pos / kBlockSize, last = (pos + chunk - 1) / kBlockSize;
    if (int rc = read_blocks(in, first, last - first + 1, buf.data()); rc) return rc;
    size_t done = 0;
    const int rc = write_all_locked(out, off_out + *copied, chunk,
                                    reinterpret_cast<const char*>(buf.data() + pos % kBlockSize),
                                    &done, WriteFrom::kWriter);
    *copied += done;
    if (rc) return rc;
    if (done < chunk) return ENOSPC;
  }
  return 0;
}

int FsImpl::punch_bounded(Node& n, uint64_t l, uint64_t count) {
  WARPFS_DCHECK(!journal_->in_transaction(), "punch_bounded: not in a transaction");
  const uint64_t end = l + count;
  for (uint64_t b = l; b < end;) {
    // The next few mapped runs: each lies in one group, so the transaction dirties at most
    // their groups' bitmaps, descriptors and count tables, and the tree's leaves.
    uint64_t first = end, last = b;
    int runs = 0;
    for (uint64_t p = b; p < end && runs < kRunsPerTxn;) {
      const Mapping m = map_lookup(n, static_cast<uint32_t>(p));
      const uint64_t run = std::min<uint64_t>(m.length, end - p);
      if (!m.hole) {
        if (first == end) first = p;
        last = p + run;
        ++runs;
      }
      p += run;
    }
    if (runs == 0) return 0;
    Journal::Txn t(*journal_);
    if (int rc = punch(n, static_cast<uint32_t>(first), last - first); rc) return rc;
    b = last;
  }
  return 0;
}

int FsImpl::clone_blocks(Node& in, uint32_t l_in, Node& out, uint32_t l_out, uint64_t count,
                         uint64_t end, uint64_t* done) {
  WARPFS_DCHECK(changeable_by_me(in) && changeable_by_me(out), "clone_blocks: rw exclusive");
  WARPFS_DCHECK(!journal_->in_transaction(), "clone_blocks: not in a transaction");
  *done = 0;
  // out's old blocks there go first, a few extents a transaction (a crash in between leaves
  // a hole where the copy was to go, as a copy cut short would leave old bytes).
  if (int rc = punch_bounded(out, l_out, count); rc) return rc;
  while (*done < count) {
    // What the transaction could not share (a group without room for a table, a block at
    // kMaxRefcount): copied after it, outside it.
    uint64_t copy_from = 0, copy_count = 0;
    int rc = 0;
    {
      Journal::Txn t(*journal_);
      for (int k = 0; k < kRunsPerTxn && *done < count && copy_count == 0 && rc == 0; ++k) {
        const auto li = static_cast<uint32_t>(l_in + *done),
                   lo = static_cast<uint32_t>(l_out + *done);
        const Mapping m = map_lookup(in, li);
        const uint64_t run = std::min<uint64_t>(m.length, count - *done);
        // out's size follows what is in place, up to the copy's end: bytes copied after this
        // (a partial tail, or blocks that could not be shared) grow out through write_locked,
        // which unmaps blocks past the size first (drop_past_eof).
        auto grow = [&](uint64_t blocks) {
          out.disk.size = std::max(out.disk.size, std::min(end, (lo + blocks) * kBlockSize));
        };
        if (m.hole || m.unwritten) {
          grow(run);
          *done += run;
          continue;
        }
        // One source extent's run: one group, so at most its table's 17 blocks change.
        uint32_t shared = 0;
        rc = share_blocks(m.physical, static_cast<uint32_t>(run), &shared);
        if (rc == ENOSPC) rc = 0;  // no room for the group's table: copied below
        if (rc) break;
        if (shared > 0) {
          if ((rc = map_insert(out, Extent{lo, shared, m.physical}))) {
            free_blocks(m.physical, shared);  // the references just taken
            break;
          }
          out.disk.blocks += shared;
          grow(shared);
          note_written(out, m.physical, shared);  // its fsync writes back what in had cached
          cloned_blocks_.fetch_add(shared, std::memory_order_relaxed);
          *done += shared;
        }
        if (shared < run) {
          copy_from = *done;
          copy_count = std::min<uint64_t>(run - shared, kCopyBlocks);
        }
      }
      // What this transaction mapped goes with the counts it raised, error or not.
      if (int src = map_store(out); src && !rc) rc = src;
    }
    if (rc) return rc;
    if (copy_count > 0) {
      // Bytes, up to in's end: a last partial block copied whole would carry in's bytes past
      // its end into out (and round out's size up).
      const uint64_t pos = (l_in + copy_from) * kBlockSize;
      const uint64_t bytes =
          std::min(copy_count * kBlockSize, in.disk.size - std::min(in.disk.size, pos));
      uint64_t copied = 0;
      if (bytes > 0) {
        if (int crc = copy_bytes(in, pos, out, (l_out + copy_from) * kBlockSize, bytes, &copied);
            crc)
          return crc;
      }
      *done += copy_count;
    }
  }
  return 0;
}

int FsImpl::copy_file_range(Ino in_ino, uint64_t off_in, Ino out_ino, uint64_t off_out,
                            uint64_t len, uint64_t* copied) {
  *copied = 0;
  if (int rc = check_writable(); rc) return rc;
  NodeRef in, out;
  if (int rc = get_node(in_ino, &in); rc) return rc;
  if (int rc = get_node(out_ino, &out); rc) return rc;
  PairLock locks(*in, *out);
  if (S_ISDIR(in->disk.mode) || S_ISDIR(out->disk.mode)) return EISDIR;
  if (!S_ISREG(in->disk.mode) || !S_ISREG(out->disk.mode)) return EINVAL;
  if (pinned(out->disk)) return EPERM;  // immutable, or append-only (an O_APPEND fd: EBADF)
  if (int rc = load_map(*in); rc) return rc;
  if (int rc = load_map(*out); rc) return rc;
  if (len == 0 || off_in >= in->disk.size) return 0;
  len = std::min<uint64_t>(len, in->disk.size - off_in);
  if (off_out >= kMaxFileSize || len > kMaxFileSize - off_out) return EFBIG;
  if (in == out && off_in < off_out + len && off_out < off_in + len) return EINVAL;
  const uint64_t end = off_out + len;
  // Growing exposes out's old last block's tail and what lies past it: zeroes, as a write
  // that extends the file makes them (write_locked).
  if (const uint64_t old = out->disk.size; end > old) {
    if (int rc = drop_past_eof(*out, old, end); rc) return rc;
    if (off_out > old && old % kBlockSize) {
      const uint64_t z = std::min<uint64_t>(off_out, (old / kBlockSize + 1) * kBlockSize);
      if (int rc = zero_range(*out, old, z - old); rc) return rc;
    }
  }
  int rc = 0;
  if (!shared_blocks_enabled() || off_in % kBlockSize != off_out % kBlockSize) {
    if (!shared_blocks_enabled() && !copy_notice_.exchange(true)) {
      log("copy_file_range copies bytes: this filesystem has no shared_blocks feature (an "
          "image made before it); `tune.warpfs -O shared_blocks` lets it clone");
    }
    rc = copy_bytes(*in, off_in, *out, off_out, len, copied);
  } else {
    // The edges by bytes, the whole blocks between by sharing. The last partial block too
    // when it ends both files: its bytes past the end are past out's end as well.
    const uint64_t head = std::min<uint64_t>(len, (kBlockSize - off_in % kBlockSize) % kBlockSize);
    uint64_t blocks = (len - head) / kBlockSize;
    uint64_t tail = (len - head) % kBlockSize;
    if (tail > 0 && off_in + len == in->disk.size && end >= out->disk.size) {
      ++blocks;
      tail = 0;
    }
    rc = copy_bytes(*in, off_in, *out, off_out, head, copied);
    if (rc == 0 && blocks > 0) {
      uint64_t done = 0;
      rc = clone_blocks(*in, static_cast<uint32_t>((off_in + head) / kBlockSize), *out,
                        static_cast<uint32_t>((off_out + head) / kBlockSize), blocks, end, &done);
      *copied = std::min(len, head + done * kBlockSize);  // what is in place, error or not
    }
    if (rc == 0 && tail > 0 && *copied == len - tail) {
      uint64_t t = 0;
      rc = copy_bytes(*in, off_in + len - tail, *out, end - tail, tail, &t);
      *copied += t;
    }
    if (*copied > 0) {
      Journal::Txn t(*journal_);
      out->disk.size = std::max(out->disk.size, off_out + *copied);
      if (int xrc = written_by_writer(*out); xrc && !rc) rc = xrc;  // as a write
      if (int src = store(*out); src && !rc) rc = src;
      clones_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return *copied > 0 ? 0 : rc;
}

int FsImpl::dedupe_blocks(Node& in, uint32_t l_in, Node& out, uint32_t l_out, uint32_t count,
                          uint64_t* shared) {
  WARPFS_DCHECK(changeable_by_me(in) && changeable_by_me(out), "dedupe_blocks: rw exclusive");
  *shared = 0;
  constexpr uint32_t kMax = 64;
  std::vector<uint8_t> a(kMax * size_t{kBlockSize}), b(kMax * size_t{kBlockSize});
  for (uint32_t i = 0; i < count;) {
    const Mapping mi = map_lookup(in, l_in + i), mo = map_lookup(out, l_out + i);
    uint32_t run = std::min({mi.length, mo.length, count - i, kMax});
    if (mi.hole || mi.unwritten || mo.hole || mo.unwritten || mi.physical == mo.physical) {
      i += run;
      continue;
    }
    if (auto st = dev_.read(mi.physical, run, a.data()); !st.is_ok()) return errno_of(st);
    if (auto st = dev_.read(mo.physical, run, b.data()); !st.is_ok()) return errno_of(st);
    uint32_t equal = 0;
    while (equal < run && std::memcmp(a.data() + size_t{equal} * kBlockSize,
                                      b.data() + size_t{equal} * kBlockSize, kBlockSize) == 0) {
      ++equal;
    }
    if (equal == 0) {
      ++i;  // this block differs; the next may not
      continue;
    }
    if (ro_) return EROFS;  // remounted read-only meanwhile (the -o dedup pass)
    {
      Journal::Txn t(*journal_);
      uint32_t got = 0;
      int rc = share_blocks(mi.physical, equal, &got);
      if (rc == ENOSPC || (rc == 0 && got == 0)) {
        i += equal;
        continue;
      }
      if (rc) return rc;
      // out's run now points at in's blocks; its own are freed, or one reference fewer (on
      // failure remap drops the references just taken instead).
      if ((rc = remap(out, l_out + i, got, mi.physical, mo.physical))) return rc;
      if (int src = map_store(out); src) return src;
      *shared += got;
      deduped_blocks_.fetch_add(got, std::memory_order_relaxed);
      i += got;
    }
  }
  return 0;
}

int FsImpl::dedupe_range(Ino in_ino, uint64_t off_in, Ino out_ino, uint64_t off_out, uint64_t len,
                         uint64_t* deduped) {
  *deduped = 0;
  if (int rc = check_writable(); rc) return rc;
  if (!shared_blocks_enabled()) return EOPNOTSUPP;
  if (off_in % kBlockSize || off_out % kBlockSize) return EINVAL;
  NodeRef in, out;
  if (int rc = get_node(in_ino, &in); rc) return rc;
  if (int rc = get_node(out_ino, &out); rc) return rc;
  PairLock locks(*in, *out);
  if (S_ISDIR(in->disk.mode) || S_ISDIR(out->disk.mode)) return EISDIR;
  if (!S_ISREG(in->disk.mode) || !S_ISREG(out->disk.mode)) return EINVAL;
  if (immutable(out->disk)) return EPERM;
  if (int rc = load_map(*in); rc) return rc;
  if (int rc = load_map(*out); rc) return rc;
  if (off_in + len > in->disk.size || off_out + len > out->disk.size) return EINVAL;
  if (in == out && off_in < off_out + len && off_out < off_in + len) return EINVAL;
  const uint64_t blocks = len / kBlockSize;
  uint64_t shared = 0;
  const int rc = dedupe_blocks(*in, static_cast<uint32_t>(off_in / kBlockSize), *out,
                               static_cast<uint32_t>(off_out / kBlockSize),
                               static_cast<uint32_t>(blocks), &shared);
  *deduped = shared * kBlockSize;
  return rc;
}

namespace {

struct Hash128 {
  uint64_t lo, hi;
  bool operator==(const Hash128&) const = default;
};
struct Hash128Hasher {
  size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo); }
};
// Where a hash was first seen.
struct Place {
  Ino ino;
  uint32_t lblk;
};
// A block of the file being read whose hash names an earlier block.
struct Match {
  Place from;
  uint32_t lblk;
};

}  // namespace

int FsImpl::dedup(const DedupOptions& o, DedupReport* r) {
  *r = DedupReport{};
  if (!shared_blocks_enabled()) return EOPNOTSUPP;
  if (int rc = check_writable(); rc) return rc;
  const auto t0 = std::chrono::steady_clock::now();
  // About 48 bytes a node in the map: the bound in entries.
  const size_t cap = std::max<size_t>(1024, o.table_mb * (size_t{1} << 20) / 48);
  std::unordered_map<Hash128, Place, Hash128Hasher> table;
  std::vector<uint8_t> buf(size_t{kCopyBlocks} * kBlockSize);
  // A node taken for the pass leaves the table again when nobody else holds it.
  auto done_with = [this](NodeRef& n) {
    const Ino ino = n->ino;
    n.reset();
    maybe_reclaim(ino);
  };
  // The matches of a run of file n's blocks: those that continue each other (the next
  // block of both files) go together, under both files' locks, compared byte for byte.
  auto share_matches = [&](NodeRef& n, const std::vector<Match>& matches) {
    for (size_t i = 0; i < matches.size();) {
      size_t j = i + 1;
      while (j < matches.size() && matches[j].from.ino == matches[i].from.ino &&
             matches[j].from.lblk == matches[i].from.lblk + (j - i) &&
             matches[j].lblk == matches[i].lblk + (j - i)) {
        ++j;
      }
      const Place from = matches[i].from;
      const uint32_t lblk = matches[i].lblk, count = static_cast<uint32_t>(j - i);
      i = j;
      NodeRef src;
      if (from.ino == n->ino) {
        src = n;
      } else if (get_node(from.ino, &src) != 0) {
        r->not_shared += count;
        continue;
      }
      uint64_t shared = 0;
      {
        // Either may have changed since it was read: dedupe_blocks compares the bytes.
        PairLock locks(*src, *n);
        if (src->disk.mode != 0 && n->disk.mode != 0 && S_ISREG(src->disk.mode) &&
            !immutable(n->disk) && load_map(*src) == 0 && load_map(*n) == 0) {
          if (int rc = dedupe_blocks(*src, from.lblk, *n, lblk, count, &shared); rc) {
            log("dedup: inode " + std::to_string(n->ino) + ": " + std::strerror(rc));
          }
        }
      }
      r->blocks_shared += shared;
      r->not_shared += count - std::min<uint64_t>(count, shared);
      if (src != n) done_with(src);
    }
  };
  for (Ino ino = 1; ino <= sb_.inode_count; ++ino) {
    if ((o.stop && o.stop()) || ro_) break;
    {
      const auto g = static_cast<uint32_t>(group_of_inode(ino, sb_.inodes_per_group));
      const auto i = static_cast<uint32_t>((ino - 1) % sb_.inodes_per_group);
      Group& gr = groups_[g];
      std::lock_guard<std::mutex> lk(gr.mu);
      if (!((gr.inode_bitmap->data[i / 8] >> (i % 8)) & 1)) continue;
    }
    NodeRef n;
    if (get_node(ino, &n) != 0) continue;
    // A run of up to 1 MiB at a time is read and hashed under the file's lock shared, then
    // its matches are shared: a writer of the file waits for one run at most, and the
    // matches kept at once are one run's.
    bool counted = false;
    std::vector<Match> matches;
    for (uint64_t b = 0; !ro_;) {
      matches.clear();
      {
        std::shared_lock<SharedMutex> lk;
        if (lock_mapped(*n, &lk) != 0 || !S_ISREG(n->disk.mode) || n->disk.links == 0) break;
        const uint64_t nblocks = (n->disk.size + kBlockSize - 1) / kBlockSize;
        if (b >= nblocks) break;
        if (!counted) {
          ++r->files;
          counted = true;
        }
        const Mapping m = map_lookup(*n, static_cast<uint32_t>(b));
        const uint64_t run = std::min<uint64_t>({m.length, nblocks - b, kCopyBlocks});
        const uint64_t at = b;
        b += run;
        if (m.hole || m.unwritten) continue;
        if (!dev_.read(m.physical, static_cast<uint32_t>(run), buf.data()).is_ok()) continue;
        for (uint64_t k = 0; k < run; ++k) {
          const XXH128_hash_t h = XXH3_128bits(buf.data() + k * kBlockSize, kBlockSize);
          ++r->blocks_hashed;
          const auto lblk = static_cast<uint32_t>(at + k);
          auto it = table.find(Hash128{h.low64, h.high64});
          if (it == table.end()) {
            if (table.size() < cap) {
              table.emplace(Hash128{h.low64, h.high64}, Place{ino, lblk});
            } else {
              ++r->table_full;
            }
          } else if (!(it->second.ino == ino && it->second.lblk == lblk)) {
            matches.push_back({it->second, lblk});
          }
        }
      }
      r->candidates += matches.size();
      share_matches(n, matches);
    }
    done_with(n);
  }
  r->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 0;
}

}  // namespace warpfs::fs
