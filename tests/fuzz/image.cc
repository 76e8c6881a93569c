// Base images, the copy-on-write device and the patch decoder (image.h).
#include "image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "warpfs/fs/filesystem.h"
#include "warpfs/fs/layout.h"
#include "warpfs/fs/mkfs.h"
#include "warpfs/fs/replay.h"

// Deterministic base images. The filesystem stamps inodes and seeds each directory's name
// hash from the clock (system_clock, i.e. CLOCK_REALTIME), so two processes would build
// different images, lay "many"'s entries out in different leaves, and a saved input would
// mean something else in the next run. While the bases are built, CLOCK_REALTIME is a
// counter; otherwise this is the plain system call. (It replaces libc's clock_gettime, and
// ASan's interceptor of it, in the fuzz programs only.)
namespace {
std::atomic<bool> g_fake_clock{false};
std::atomic<uint64_t> g_fake_ns{1'700'000'000'000'000'000ull};
}  // namespace

extern "C" int clock_gettime(clockid_t id, struct timespec* ts) {
  if (id == CLOCK_REALTIME && g_fake_clock.load(std::memory_order_relaxed)) {
    const uint64_t ns = g_fake_ns.fetch_add(1000, std::memory_order_relaxed);
    ts->tv_sec = static_cast<time_t>(ns / 1'000'000'000);
    ts->tv_nsec = static_cast<long>(ns % 1'000'000'000);
    return 0;
  }
  return static_cast<int>(syscall(SYS_clock_gettime, id, ts));
}

namespace warpfs::fuzz {

using blockdev::Code;
using blockdev::Status;
using fs::kBlockSize;

namespace {

// What a block of a base image is, for the checksum fix-up: by position (the layout the
// base was formatted with), else by the magic at its start.
enum class Kind : uint8_t {
  kOther,
  kSuper,
  kJournal,
  kGdt,
  kBlockBitmap,
  kInodeBitmap,
  kInodeTable
};

struct Layout {
  std::vector<Kind> kind;
  std::vector<uint64_t> aux;  // bitmaps: the group; inode-table blocks: their first inode
};

// Building a base image must not fail; if it does, the harness itself is broken.
[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "fuzz image: %s\n", what.c_str());
  std::abort();
}
void must(int rc, const char* what) {
  if (rc != 0) die(std::string(what) + ": " + std::strerror(rc));
}

bool zero(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t c) { return c == 0; });
}

uint32_t magic_of(const uint8_t* b) {
  uint32_t m;
  std::memcpy(&m, b, 4);
  return m;
}
bool header_magic(uint32_t m) {
  return m == fs::kDirIndexMagic || m == fs::kDirLeafMagic || m == fs::kExtentMagic ||
         m == fs::kXattrMagic || m == fs::kXattrValueMagic || m == fs::kRefcountMagic;
}

Layout layout_of(const BaseImage& b) {
  Layout l;
  const uint64_t n = b.blocks();
  l.kind.assign(n, Kind::kOther);
  l.aux.assign(n, 0);
  l.kind[0] = Kind::kSuper;
  if (b.sb.block_count - 1 < n) l.kind[b.sb.block_count - 1] = Kind::kSuper;
  for (uint64_t j = 1; j <= b.sb.journal_blocks; ++j) l.kind[j] = Kind::kJournal;
  const uint64_t gdt_blocks = fs::Layout(b.sb).gdt_used();
  for (uint64_t k = 0; k < gdt_blocks; ++k) l.kind[b.sb.gdt_start + k] = Kind::kGdt;
  const uint32_t itb = b.sb.inodes_per_group / fs::kInodesPerBlock;
  for (uint32_t g = 0; g < b.groups.size(); ++g) {
    const fs::GroupDesc& d = b.groups[g];
    l.kind[d.block_bitmap] = Kind::kBlockBitmap;
    l.aux[d.block_bitmap] = g;
    l.kind[d.inode_bitmap] = Kind::kInodeBitmap;
    l.aux[d.inode_bitmap] = g;
    for (uint32_t t = 0; t < itb; ++t) {
      l.kind[d.inode_table + t] = Kind::kInodeTable;
      l.aux[d.inode_table + t] =
          uint64_t{g} * b.sb.inodes_per_group + uint64_t{t} * fs::kInodesPerBlock + 1;
    }
  }
  return l;
}

const Layout& layout(unsigned i);

// --- building the base images --------------------------------------------------------------

// The files and directories every base image holds (image.h lists them).
void populate(fs::Filesystem& f, bool small) {
  const fs::Caller c{};
  fs::Attr a, dir, sub, many, file;
  const fs::Ino root = fs::kRootInode;
  auto put = [&](fs::Ino ino, uint64_t off, size_t len, char fill) {
    std::string s(len, fill);
    for (size_t i = 0; i < len; ++i) s[i] = static_cast<char>(fill + i % 23);
    size_t w = 0;
    must(f.write(ino, off, len, s.data(), &w), "write");
    if (w != len) die("short write");
  };
  must(f.mkdir(root, "dir", 0755, c, &dir), "mkdir dir");
  must(f.mkdir(dir.ino, "sub", 0700, c, &sub), "mkdir sub");
  must(f.mknod(dir.ino, "small", S_IFREG | 0644, 0, c, &file), "mknod small");
  put(file.ino, 0, 100, 'a');
  must(f.setxattr(file.ino, "user.short", "1", 1, 0), "setxattr");
  const std::string longval(300, 'v');
  must(f.setxattr(file.ino, "user.long", longval.data(), longval.size(), 0), "setxattr");
  must(f.setxattr(file.ino, "trusted.t", "tt", 2, 0), "setxattr");
  must(f.setxattr(dir.ino, "security.s", "ss", 2, 0), "setxattr");
  // A chain of xattr blocks and out-of-line values (value blocks), the last one partly used.
  fs::Attr many_x;
  must(f.mknod(dir.ino, "xattrs", S_IFREG | 0644, 0, c, &many_x), "mknod xattrs");
  for (int i = 0; i < 260; ++i) {
    const std::string k = "user.x" + std::to_string(i), v = "value" + std::to_string(i);
    must(f.setxattr(many_x.ino, k, v.data(), v.size(), 0), "setxattr chain");
  }
  const std::string bigval(9000, 'B');
  must(f.setxattr(many_x.ino, "user.big", bigval.data(), bigval.size(), 0), "setxattr big");
  must(f.setxattr(many_x.ino, "trusted.edge", bigval.data(), fs::kXattrInlineMax + 1, 0),
       "setxattr edge");
  must(f.link(file.ino, root, "hard", &a), "link");
  // More than 8 extents: the inode's root becomes an index over a leaf block.
  must(f.mknod(root, "fragmented", S_IFREG | 0600, 0, c, &a), "mknod fragmented");
  for (int i = 0; i < (small ? 3 : 12); ++i)
    put(a.ino, uint64_t(2 * i) * kBlockSize, kBlockSize, 'f');
  // A hole, then data far out; an unwritten (fallocated) range.
  must(f.mknod(root, "sparse", S_IFREG | 0644, 0, c, &a), "mknod sparse");
  put(a.ino, 0, 10, 's');
  put(a.ino, 64ull << 20, 5000, 't');
  must(f.fallocate(a.ino, 0, 8 * kBlockSize, 3 * kBlockSize), "fallocate");
  must(f.symlink(root, "short-link", "dir/small", c, &a), "symlink");
  const std::string far(300, 'x');
  must(f.symlink(dir.ino, "long-link", far, c, &a), "symlink");
  must(f.mknod(root, "fifo", S_IFIFO | 0644, 0, c, &a), "mknod fifo");
  must(f.mknod(sub.ino, "null", S_IFCHR | 0666, makedev(1, 3), c, &a), "mknod chr");
  if (small) return;
  // A directory of several leaves: hard links with long names, one inode for all.
  must(f.mkdir(root, "many", 0755, c, &many), "mkdir many");
  must(f.mknod(many.ino, "target", S_IFREG | 0644, 0, c, &file), "mknod target");
  for (int i = 0; i < 140; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "a-fairly-long-name-so-that-leaves-split-%03d", i);
    must(f.link(file.ino, many.ino, name, &a), "link many");
  }
}

// Shares a block by hand, as a clone would (FORMAT.md "Shared blocks"): file b's extent is
// pointed at file a's block, b's own block freed, and group 0 gets a reference-count table
// (17 free blocks) that counts 2 for it. `image` is the unmounted image's bytes.
void share_block(std::vector<uint8_t>& image, fs::Ino a, fs::Ino b) {
  fs::Superblock sb;
  std::memcpy(&sb, image.data(), sizeof sb);
  const fs::Layout l(sb);
  const uint64_t seed = sb.checksum_seed;
  auto block = [&](uint64_t n) { return image.data() + n * kBlockSize; };
  auto inode = [&](fs::Ino ino) { return block(l.inode_block(ino)) + l.inode_offset(ino); };
  fs::Inode ia, ib;
  std::memcpy(&ia, inode(a), sizeof ia);
  std::memcpy(&ib, inode(b), sizeof ib);
  if (ia.extent_count != 1 || ib.extent_count != 1 || ia.tree_depth != 0 || ib.tree_depth != 0)
    die("share_block: the files are not one extent each");
  const uint64_t shared = ia.root.extents[0].physical, freed = ib.root.extents[0].physical;
  ib.root.extents[0].physical = shared;
  ib.checksum = fs::inode_checksum(ib, b, seed);
  std::memcpy(inode(b), &ib, sizeof ib);
  const uint64_t start = l.group_start(0);
  uint8_t* bm = block(start);
  fs::clear_bits(bm, freed - start, freed - start + 1);
  uint64_t table = 0;
  for (uint64_t i = l.meta_end(0) - start, run = 0; i < l.group_size(0) && table == 0; ++i) {
    run = (bm[i / 8] >> (i % 8)) & 1 ? 0 : run + 1;
    if (run == fs::kRefcountBlocks) table = i + 1 - run;
  }
  if (table == 0) die("share_block: no room for a table");
  fs::set_bits(bm, table, table + fs::kRefcountBlocks);
  for (uint32_t i = 0; i < fs::kRefcountBlocks; ++i) {
    uint8_t* p = block(start + table + i);
    std::memset(p, 0, kBlockSize);
    const fs::RefcountHeader h{fs::kRefcountMagic, 0, i, 0, 0, 0};
    std::memcpy(p, &h, sizeof h);
    const uint64_t k = shared - start;
    if (k / fs::kRefcountsPerBlock == i) {
      const uint16_t two = 2;
      std::memcpy(p + sizeof h + (k % fs::kRefcountsPerBlock) * 2, &two, 2);
    }
    const uint64_t sum = fs::block_checksum(p, fs::kHeaderChecksumOffset, seed);
    std::memcpy(p + fs::kHeaderChecksumOffset, &sum, 8);
  }
  fs::GroupDesc d;
  std::memcpy(&d, block(sb.gdt_start), sizeof d);
  d.free_blocks = d.free_blocks + 1 - fs::kRefcountBlocks;
  d.refcount_table = static_cast<uint32_t>(table);
  d.block_bitmap_checksum = fs::checksum(bm, kBlockSize, seed);
  d.checksum = fs::group_checksum(d, seed);
  std::memcpy(block(sb.gdt_start), &d, sizeof d);
  sb.free_blocks = sb.free_blocks + 1 - fs::kRefcountBlocks;
  sb.checksum = fs::superblock_checksum(sb);
  std::memcpy(block(0), &sb, sizeof sb);
  std::memcpy(block(sb.block_count - 1), &sb, sizeof sb);
}

fs::MountOptions quiet_options(std::string* log) {
  fs::MountOptions o;
  o.commit_interval_ms = 3'600'000;  // commits happen when we say
  o.log = [log](const std::string& s) { *log += s + "\n"; };
  return o;
}

BaseImage build(const std::string& name, uint64_t blocks, bool crash, bool small,
                bool share = false) {
  BaseImage zero_base;
  zero_base.bytes.assign(blocks * kBlockSize, 0);
  CowDevice dev(zero_base);
  fs::MkfsOptions mo;
  mo.inodes = 512;
  mo.journal_blocks = 64;
  mo.label = "fuzz-" + name;
  mo.seed = 0x5eed'0000 + blocks;
  fs::Geometry g;
  std::string err, log;
  if (!fs::plan_geometry(blocks, mo, &g, &err)) die("plan_geometry: " + err);
  if (!fs::format(dev, mo, g, nullptr).is_ok()) die("format failed");
  BaseImage out;
  out.name = name;
  {
    auto f = fs::Filesystem::mount(dev, quiet_options(&log), &err);
    if (!f) die("mount: " + err + "\n" + log);
    populate(*f, small);
    if (crash) {
      // An orphan: unlinked while open. Then one more transaction, committed: a crash now
      // leaves it in the journal, the superblock dirty, the orphan on its list.
      fs::Attr a, d;
      must(f->mknod(fs::kRootInode, "victim", S_IFREG | 0644, 0, fs::Caller{}, &a), "mknod victim");
      size_t w;
      must(f->write(a.ino, 0, 9000, std::string(9000, 'o').data(), &w), "write victim");
      must(f->open(a.ino, O_RDWR), "open victim");
      must(f->unlink(fs::kRootInode, "victim"), "unlink victim");
      must(f->sync(), "sync");
      must(f->mkdir(fs::kRootInode, "late", 0755, fs::Caller{}, &d), "mkdir late");
      must(f->mknod(d.ino, "file", S_IFREG | 0644, 0, fs::Caller{}, &a), "mknod late/file");
      must(f->write(a.ino, 0, 5, "hello", &w), "write late/file");
      must(f->setxattr(a.ino, "user.late", "x", 1, 0), "setxattr late");
      must(f->rename(fs::kRootInode, "fifo", d.ino, "fifo2", 0), "rename");
      must(f->sync(), "sync");
      out.bytes = dev.snapshot();  // the machine dies here
    } else {
      fs::Attr a, b;
      if (share) {
        size_t w;
        must(f->mknod(fs::kRootInode, "shared-a", S_IFREG | 0644, 0, fs::Caller{}, &a), "mknod");
        must(f->mknod(fs::kRootInode, "shared-b", S_IFREG | 0644, 0, fs::Caller{}, &b), "mknod");
        must(f->write(a.ino, 0, 4096, std::string(4096, 'A').data(), &w), "write shared-a");
        must(f->write(b.ino, 0, 4096, std::string(4096, 'B').data(), &w), "write shared-b");
      }
      must(f->unmount(), "unmount");
      out.bytes = dev.snapshot();
      if (share) share_block(out.bytes, a.ino, b.ino);
    }
  }
  out.shares = share;
  std::memcpy(&out.sb, out.bytes.data(), sizeof out.sb);
  out.groups.resize(out.sb.group_count);
  std::memcpy(out.groups.data(), out.bytes.data() + out.sb.gdt_start * kBlockSize,
              out.groups.size() * sizeof(fs::GroupDesc));
  const Layout l = layout_of(out);
  for (uint64_t b = 0; b < out.blocks(); ++b) {
    const uint8_t* p = out.bytes.data() + b * kBlockSize;
    if (zero(p, kBlockSize)) continue;
    if (l.kind[b] != Kind::kOther) {
      out.meta.push_back(b);
    } else if (header_magic(magic_of(p))) {
      out.meta.push_back(b);
      out.headers.push_back(b);
    } else {
      out.data.push_back(b);
    }
  }
  if (out.headers.empty() || out.data.empty()) die("base image " + name + " lacks structures");
  return out;
}

struct Bases {
  BaseImage image[kBaseImages];
  Layout layout[kBaseImages];
  Bases() {
    g_fake_clock = true;
    image[0] = build("clean", 1024, false, false);
    image[1] = build("crashed", 1024, true, false);
    image[2] = build("groups", fs::kBlocksPerGroup + 200, false, true);
    image[3] = build("shared", 1024, false, false, /*share=*/true);
    for (unsigned i = 0; i < kBaseImages; ++i) layout[i] = layout_of(image[i]);
    g_fake_clock = false;
    if (std::getenv("WARPFS_FUZZ_VERBOSE") != nullptr) {
      for (const BaseImage& b : image) {
        std::fprintf(
            stderr,
            "base image %s: %llu blocks, %zu metadata (%zu header) and %zu data blocks, hash "
            "%016llx\n",
            b.name.c_str(), static_cast<unsigned long long>(b.blocks()), b.meta.size(),
            b.headers.size(), b.data.size(),
            static_cast<unsigned long long>(fs::checksum(b.bytes.data(), b.bytes.size(), 0)));
      }
    }
  }
};

Bases& bases() {
  static Bases* b = new Bases();  // never destroyed: libFuzzer exits from anywhere
  return *b;
}

const Layout& layout(unsigned i) {
  return bases().layout[i];
}

// --- patches -------------------------------------------------------------------------------

// Little-endian reader over the input.
struct Reader {
  const uint8_t* p;
  size_t n;
  bool has(size_t k) const { return n >= k; }
  uint8_t u8() {
    const uint8_t v = *p;
    ++p, --n;
    return v;
  }
  uint16_t u16() {
    uint16_t v;
    std::memcpy(&v, p, 2);
    p += 2, n -= 2;
    return v;
  }
};

uint64_t get_le(const uint8_t* p, size_t w) {
  uint64_t v = 0;
  std::memcpy(&v, p, w);
  return v;
}
void put_le(uint8_t* p, size_t w, uint64_t v) {
  std::memcpy(p, &v, w);
}
size_t width_of(size_t len) {
  return len >= 8 ? 8 : len >= 4 ? 4 : len >= 2 ? 2 : 1;
}

// Values that sit on the edges of what the format allows.
uint64_t interesting(const BaseImage& b, uint8_t pick) {
  const uint64_t v[] = {
      0,
      1,
      2,
      3,
      7,
      8,
      15,
      16,
      31,
      32,
      0x7f,
      0x80,
      0xff,
      0x100,
      0x7fff,
      0x8000,
      0xffff,
      0x7fffffff,
      0x80000000,
      0xffffffff,
      0x7fffffffffffffff,
      0x8000000000000000,
      ~0ull,
      kBlockSize - 1,
      kBlockSize,
      kBlockSize + 1,
      kBlockSize - 32,
      254,
      255,
      256,
      fs::kJournalMaxBlocks,
      fs::kJournalMaxBlocks + 1,
      b.blocks() - 1,
      b.blocks(),
      b.blocks() + 1,
      b.sb.inode_count,
      b.sb.inode_count + 1,
      b.sb.journal_blocks,
      b.sb.journal_blocks + 1,
      b.sb.gdt_start,
      b.sb.inodes_per_group,
      b.groups[0].inode_table,
      fs::kDirIndexMagic,
      fs::kDirLeafMagic,
      fs::kExtentMagic,
      fs::kXattrMagic,
      fs::kXattrValueMagic,
      fs::kXattrValuePayload,
      fs::kXattrValueMax,
      fs::kXattrInlineMax,
      fs::kJournalHeaderMagic,
      fs::kJournalDescriptorMagic,
      fs::kJournalCommitMagic,
      S_IFDIR | 0755,
      S_IFREG | 0644,
      S_IFLNK | 0777,
      S_IFCHR | 0666,
      S_IFIFO | 0644,
      fs::Extent::kUnwritten,
      fs::kMagic,
      1ull << 32,
      1ull << 63,
      fs::kMaxNameHash,
  };
  return v[pick % (sizeof v / sizeof v[0])];
}

// Recomputes the checksums `home`'s block carries (a copy of it, for journal payloads).
void fix_block(uint8_t* p, uint64_t home, unsigned base) {
  const BaseImage& b = bases().image[base];
  const Layout& l = layout(base);
  const uint64_t seed = b.sb.checksum_seed;
  const Kind k = home < l.kind.size() ? l.kind[home] : Kind::kOther;
  switch (k) {
    case Kind::kSuper: {
      fs::Superblock sb;
      std::memcpy(&sb, p, sizeof sb);
      sb.checksum = fs::superblock_checksum(sb);
      std::memcpy(p, &sb, sizeof sb);
      return;
    }
    case Kind::kGdt: {
      const uint64_t first = (home - b.sb.gdt_start) * fs::kGroupDescsPerBlock;
      for (uint32_t i = 0; i < fs::kGroupDescsPerBlock && first + i < b.sb.group_count; ++i) {
        fs::GroupDesc d;
        std::memcpy(&d, p + i * sizeof d, sizeof d);
        d.checksum = fs::group_checksum(d, seed);
        std::memcpy(p + i * sizeof d, &d, sizeof d);
      }
      return;
    }
    case Kind::kInodeTable:
      for (uint32_t i = 0; i < fs::kInodesPerBlock; ++i) {
        uint8_t* slot = p + i * fs::kInodeSize;
        if (zero(slot, fs::kInodeSize)) continue;  // a free inode carries no checksum
        fs::Inode ino;
        std::memcpy(&ino, slot, sizeof ino);
        ino.checksum = fs::inode_checksum(ino, l.aux[home] + i, seed);
        std::memcpy(slot, &ino, sizeof ino);
      }
      return;
    case Kind::kJournal: {
      const uint32_t m = magic_of(p);
      if (m == fs::kJournalHeaderMagic || m == fs::kJournalDescriptorMagic ||
          m == fs::kJournalCommitMagic) {
        put_le(p + kBlockSize - 8, 8, fs::block_checksum(p, kBlockSize - 8, seed));
      }
      return;
    }
    case Kind::kBlockBitmap:
    case Kind::kInodeBitmap:
      return;  // their checksums live in the group descriptor (fix_bitmap)
    case Kind::kOther:
      if (header_magic(magic_of(p))) {
        put_le(p + fs::kHeaderChecksumOffset, 8,
               fs::block_checksum(p, fs::kHeaderChecksumOffset, seed));
      }
      return;
  }
}

// A patched bitmap: its checksum in the group descriptor, and that descriptor's checksum.
void fix_bitmap(CowDevice& dev, uint64_t block, unsigned base, const std::vector<bool>& raw) {
  const BaseImage& b = bases().image[base];
  const Layout& l = layout(base);
  const uint64_t g = l.aux[block];
  const uint64_t gdt = b.sb.gdt_start + g / fs::kGroupDescsPerBlock;
  if (raw[gdt]) return;
  uint8_t* p = dev.mutable_block(gdt) + (g % fs::kGroupDescsPerBlock) * sizeof(fs::GroupDesc);
  const uint64_t sum = fs::checksum(dev.block(block), kBlockSize, b.sb.checksum_seed);
  put_le(p + (l.kind[block] == Kind::kBlockBitmap ? offsetof(fs::GroupDesc, block_bitmap_checksum)
                                                  : offsetof(fs::GroupDesc, inode_bitmap_checksum)),
         8, sum);
  fix_block(dev.mutable_block(gdt), gdt, base);
}

// Walks the journal from its tail as replay does and makes each transaction consistent
// again: its blocks' own checksums (by their home block), the descriptor, and the commit
// with its checksum over the descriptor and the blocks. Stops where replay would.
void fix_journal(CowDevice& dev, unsigned base, const std::vector<bool>& raw) {
  const BaseImage& b = bases().image[base];
  const uint32_t jb = b.sb.journal_blocks;
  fs::JournalHeader jh;
  std::memcpy(&jh, dev.block(1), sizeof jh);
  if (jh.magic != fs::kJournalHeaderMagic || jh.tail_block == 0 || jh.tail_block >= jb) return;
  const uint64_t ring = jb - 1;
  uint64_t pos = jh.tail_block, scanned = 0;
  std::vector<uint8_t> txn;
  while (scanned + 2 <= ring) {
    const uint64_t dblock = 1 + pos;
    if (magic_of(dev.block(dblock)) != fs::kJournalDescriptorMagic) return;
    fs::JournalDescriptor d;
    std::memcpy(&d, dev.block(dblock), sizeof d);
    if (d.count == 0 || d.count > fs::kJournalMaxBlocks || d.count + 2 > ring - scanned) return;
    if (!raw[dblock]) fix_block(dev.mutable_block(dblock), dblock, base);
    txn.assign(dev.block(dblock), dev.block(dblock) + kBlockSize);
    uint64_t p = pos;
    for (uint32_t i = 0; i < d.count; ++i) {
      p = fs::journal_next(p, jb);
      if (!raw[1 + p] && d.targets[i] < b.blocks())
        fix_block(dev.mutable_block(1 + p), d.targets[i], base);
      txn.insert(txn.end(), dev.block(1 + p), dev.block(1 + p) + kBlockSize);
    }
    p = fs::journal_next(p, jb);
    if (magic_of(dev.block(1 + p)) != fs::kJournalCommitMagic) return;
    if (!raw[1 + p]) {
      uint8_t* c = dev.mutable_block(1 + p);
      put_le(c + offsetof(fs::JournalCommit, data_checksum), 8,
             fs::checksum(txn.data(), txn.size(), b.sb.checksum_seed));
      fix_block(c, 1 + p, base);
    }
    scanned += d.count + 2;
    pos = fs::journal_next(p, jb);
  }
}

}  // namespace

const BaseImage& base_image(unsigned i) {
  return bases().image[i % kBaseImages];
}

// --- CowDevice -----------------------------------------------------------------------------

CowDevice::CowDevice(const BaseImage& base, uint64_t fail_from)
    : base_(base), blocks_(base.blocks()), overlay_(blocks_), fail_from_(fail_from) {}

bool CowDevice::failing() {
  const uint64_t n = calls_.fetch_add(1) + 1;
  return fail_from_ != 0 && n >= fail_from_;
}

const uint8_t* CowDevice::block(uint64_t b) const {
  std::lock_guard<std::mutex> g(mu_);
  return overlay_[b] ? overlay_[b].get() : base_.bytes.data() + b * kBlockSize;
}

uint8_t* CowDevice::mutable_block(uint64_t b) {
  std::lock_guard<std::mutex> g(mu_);
  if (!overlay_[b]) {
    overlay_[b].reset(new uint8_t[kBlockSize]);
    std::memcpy(overlay_[b].get(), base_.bytes.data() + b * kBlockSize, kBlockSize);
  }
  return overlay_[b].get();
}

Status CowDevice::read(uint64_t b, uint32_t count, void* buf) {
  if (Status s = check(b, count); !s.is_ok()) return s;
  if (failing()) return Status::error(Code::kIoError, "injected read error");
  auto* out = static_cast<uint8_t*>(buf);
  for (uint32_t i = 0; i < count; ++i)
    std::memcpy(out + size_t{i} * kBlockSize, block(b + i), kBlockSize);
  return Status::ok();
}

Status CowDevice::write(uint64_t b, uint32_t count, const void* buf) {
  if (Status s = check(b, count); !s.is_ok()) return s;
  if (failing()) return Status::error(Code::kIoError, "injected write error");
  const auto* in = static_cast<const uint8_t*>(buf);
  for (uint32_t i = 0; i < count; ++i) {
    std::memcpy(mutable_block(b + i), in + size_t{i} * kBlockSize, kBlockSize);
  }
  writes_.fetch_add(count);
  return Status::ok();
}

Status CowDevice::flush() {
  if (failing()) return Status::error(Code::kIoError, "injected flush error");
  return Status::ok();
}

Status CowDevice::trim(uint64_t b, uint64_t count) {
  if (Status s = check(b, count); !s.is_ok()) return s;
  if (failing()) return Status::error(Code::kIoError, "injected trim error");
  writes_.fetch_add(count);  // a trim changes what may be read: it counts as a write
  return Status::ok();
}

std::vector<uint8_t> CowDevice::snapshot() const {
  std::vector<uint8_t> v(blocks_ * kBlockSize);
  for (uint64_t b = 0; b < blocks_; ++b)
    std::memcpy(v.data() + b * kBlockSize, block(b), kBlockSize);
  return v;
}

// --- decoding ------------------------------------------------------------------------------

Input decode_header(const uint8_t* data, size_t size) {
  Input in;
  if (size >= 1) {
    in.base = data[0] & 3;
    if (in.base >= kBaseImages) in.base = 0;
    in.keep_checksums = data[0] & 4;
    in.target_flags = static_cast<uint8_t>(data[0] >> 3);
  }
  if (size >= 2) in.fault = data[1];
  return in;
}

std::unique_ptr<CowDevice> make_device(const uint8_t* data, size_t size, Input* in) {
  *in = decode_header(data, size);
  const BaseImage& b = bases().image[in->base];
  const Layout& l = layout(in->base);
  auto dev = std::make_unique<CowDevice>(b);
  std::vector<bool> raw(b.blocks(), false);
  std::vector<uint64_t> patched;
  Reader r{data + std::min<size_t>(size, 2), size - std::min<size_t>(size, 2)};
  while (r.has(6)) {
    const uint8_t op = r.u8();
    const uint16_t index = r.u16();
    const uint16_t offset = r.u16();
    size_t len = r.u8() % 32 + 1;
    len = std::min(len, r.n);
    if (len == 0) break;
    const uint8_t* bytes = r.p;
    r.p += len, r.n -= len;

    // Where: a block and a byte range inside it.
    uint64_t block = 0;
    size_t at = 0, end = kBlockSize;
    auto pick = [&](const std::vector<uint64_t>& v) { return v[index % v.size()]; };
    switch (op & 7) {
      case kMeta:
        block = pick(b.meta), at = offset % kBlockSize;
        break;
      case kInode: {
        const uint64_t ino = index % b.sb.inode_count;  // 0-based
        const uint64_t g = ino / b.sb.inodes_per_group, i = ino % b.sb.inodes_per_group;
        block = b.groups[g].inode_table + i / fs::kInodesPerBlock;
        at = (i % fs::kInodesPerBlock) * fs::kInodeSize;
        end = at + fs::kInodeSize;
        at += offset % fs::kInodeSize;
        break;
      }
      case kSuper:
        block = 0, at = offset % offsetof(fs::Superblock, reserved);
        break;
      case kHeaders:
        block = pick(b.headers), at = offset % kBlockSize;
        break;
      case kJournal:
        block = 1 + index % b.sb.journal_blocks, at = offset % kBlockSize;
        break;
      case kGroup: {
        const uint64_t g = index % b.sb.group_count;
        block = b.sb.gdt_start + g / fs::kGroupDescsPerBlock;
        at = (g % fs::kGroupDescsPerBlock) * sizeof(fs::GroupDesc);
        end = at + sizeof(fs::GroupDesc);
        at += offset % sizeof(fs::GroupDesc);
        break;
      }
      case kAny:
        block = index % b.blocks(), at = offset % kBlockSize;
        break;
      case kData:
        block = pick(b.data), at = offset % kBlockSize;
        break;
    }
    len = std::min(len, end - at);
    uint8_t* p = dev->mutable_block(block) + at;
    switch ((op >> 3) & 3) {
      case kOverwrite:
        std::memcpy(p, bytes, len);
        break;
      case kXor:
        for (size_t i = 0; i < len; ++i) p[i] ^= bytes[i];
        break;
      case kAdd: {
        const size_t w = width_of(len);
        uint64_t delta = get_le(bytes, w);
        if (w < 8 && (delta >> (8 * w - 1))) delta |= ~0ull << (8 * w);  // sign-extend
        put_le(p, w, get_le(p, w) + delta);
        break;
      }
      case kMagic: {
        const size_t w = size_t{1} << ((len > 1 ? bytes[1] : 3) % 4);
        put_le(p, std::min(w, end - at), interesting(b, bytes[0]));
        break;
      }
    }
    if (op & 0x20) raw[block] = true;
    patched.push_back(block);
  }
  if (!in->keep_checksums && !patched.empty()) {
    std::sort(patched.begin(), patched.end());
    patched.erase(std::unique(patched.begin(), patched.end()), patched.end());
    bool journal = false;
    for (uint64_t blk : patched) {
      if (raw[blk]) continue;
      const Kind k = l.kind[blk];
      if (k == Kind::kJournal) journal = true;
      if (k == Kind::kBlockBitmap || k == Kind::kInodeBitmap) {
        fix_bitmap(*dev, blk, in->base, raw);
      } else {
        fix_block(dev->mutable_block(blk), blk, in->base);
      }
    }
    // Journal payloads are copies of home blocks: a patched home block shows up in the
    // journal only if replayed; a patched journal block needs its transaction re-sealed.
    if (journal) fix_journal(*dev, in->base, raw);
  }
  in->patches = patched.size();
  if (in->fault) dev->set_fail_from(uint64_t{in->fault} * 4);
  return dev;
}

}  // namespace warpfs::fuzz
