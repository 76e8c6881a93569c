// Pass M: the copies of a mirrored set (RAID 1, 10) agree. Runs first, before pass 0, on
// a device that keeps several copies of each block (BlockDevice::copies()), so that every
// later pass reads one consistent filesystem whichever copy a read lands on.
//
// Assumes nothing: the superblock is taken from the first copy whose checksum verifies,
// and the layout from it. Compares, on every copy that is kept (a failed member's is not),
// every block in use: the superblock, the journal's header (its log too after a crash),
// the used descriptor table, each group's
// bitmaps and inode table, the backup superblock, then each group's data blocks that its
// block bitmap (as the chosen copy has it) marks allocated. Blocks whose copies differ are
// reported, as problems where that is damage and as notices where a crash leaves it (each
// member's volatile write cache is lost on its own, so a block written after the last flush
// may have reached one copy only): every block of a filesystem that was not cleanly
// unmounted (its metadata in flight is in the journal, which replay writes to every copy),
// file data, and metadata whose differing copies all verify (two versions written). Damage
// is a copy that cannot be read, or fails the checksum another copy passes, or metadata no
// checksum speaks for. With repair each differing copy is rewritten from the *source*:
//   - metadata whose own checksum tells (superblocks, descriptors, bitmaps through their
//     descriptor, inodes, journal header/descriptor/commit blocks, and the self-describing
//     blocks: extent-tree, directory, xattr and reference-count table blocks): the first copy
//     that verifies;
//   - anything else (file data, journal payload, or no copy verifies): the lowest-numbered
//     member's copy (copy 0 of the group, else the next kept one).
// A copy that cannot be read counts as differing and is rewritten from the source too.
// Leaves for later: everything FORMAT.md's invariants say; a mismatch the passes then see
// no more. Without a verified superblock only block 0 is compared (pass 0 goes on to the
// backup).
#include <algorithm>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

namespace {

template <typename T>
T at(const uint8_t* b, size_t off) {
  T v;
  std::memcpy(&v, b + off, sizeof v);
  return v;
}

bool superblock_verifies(const uint8_t* b) {
  Superblock sb;
  std::memcpy(&sb, b, sizeof sb);
  return sb.magic == kMagic && sb.checksum == superblock_checksum(sb);
}

}  // namespace

// 1 the block's own checksum verifies, 0 it does not, -1 it has none this pass knows.
int Checker::self_check(const uint8_t* b, uint64_t seed) {
  switch (at<uint32_t>(b, 0)) {
    case kDirIndexMagic:
    case kDirLeafMagic:
    case kExtentMagic:
    case kXattrMagic:
    case kXattrValueMagic:
    case kRefcountMagic:
      return at<uint64_t>(b, kHeaderChecksumOffset) ==
             block_checksum(b, kHeaderChecksumOffset, seed);
    case kJournalHeaderMagic:
    case kJournalDescriptorMagic:
    case kJournalCommitMagic:
      return at<uint64_t>(b, kBlockSize - 8) == block_checksum(b, kBlockSize - 8, seed);
    default:
      return -1;
  }
}

bool Checker::mirror_range(uint64_t first, uint64_t n, const std::string& what, bool data_area,
                           const MirrorVerify& verify, std::vector<uint8_t>* keep) {
  const uint32_t nc = dev_.copies();
  if (keep) keep->assign(n * kBlockSize, 0);
  std::vector<std::vector<uint8_t>> buf(nc);
  std::vector<bool> kept(nc);
  std::vector<std::vector<char>> readable(nc);  // per copy, per block of the chunk
  std::vector<std::string> holder(nc);
  for (uint64_t done = 0; done < n;) {
    const uint64_t b0 = first + done;
    const uint32_t cnt =
        static_cast<uint32_t>(dev_.copy_run(b0, std::min<uint64_t>(kChunk, n - done)));
    int kept_count = 0;
    for (uint32_t c = 0; c < nc; ++c) {
      holder[c] = dev_.copy_holder(b0, c);
      kept[c] = !holder[c].empty();
      readable[c].assign(cnt, 0);
      if (!kept[c]) continue;
      ++kept_count;
      buf[c].resize(size_t{cnt} * kBlockSize);
      if (dev_.read_copy(b0, cnt, c, buf[c].data()).is_ok()) {
        readable[c].assign(cnt, 1);
        continue;
      }
      // A read error somewhere in the chunk: block by block, so that one bad block does not
      // make the whole chunk of this copy unreadable (and a good copy a repair's target).
      for (uint32_t i = 0; i < cnt; ++i) {
        readable[c][i] =
            dev_.read_copy(b0 + i, 1, c, buf[c].data() + size_t{i} * kBlockSize).is_ok();
      }
    }
    for (uint32_t i = 0; i < cnt; ++i) {
      const uint64_t b = b0 + i;
      const size_t off = size_t{i} * kBlockSize;
      auto data = [&](uint32_t c) { return buf[c].data() + off; };
      // The source: the readable copy that verifies best (the first of equals), else the
      // lowest readable one.
      int src = -1, lowest = -1, best = 0;
      for (uint32_t c = 0; c < nc; ++c) {
        if (!readable[c][i]) continue;
        if (lowest < 0) lowest = static_cast<int>(c);
        const int v = verify ? verify(b, data(c)) : -1;
        if (v > best) best = v, src = static_cast<int>(c);
      }
      const bool confirmed = src >= 0;
      if (!confirmed) src = lowest;
      if (src < 0) {
        unfixable("block " + num(b) + " (" + what + "): no copy can be read");
        continue;
      }
      if (keep) std::memcpy(keep->data() + (done + i) * kBlockSize, data(src), kBlockSize);
      std::vector<uint32_t> bad;
      for (uint32_t c = 0; c < nc; ++c) {
        if (kept[c] && (!readable[c][i] || std::memcmp(data(c), data(src), kBlockSize) != 0))
          bad.push_back(c);
      }
      if (bad.empty() || kept_count < 2) continue;
      ++res_.copies_differing;
      std::string line = "block " + num(b) + " (" + what + "): the copy on ";
      for (size_t j = 0; j < bad.size(); ++j)
        line += (j ? ", " : "") + holder[bad[j]] + (readable[bad[j]][i] ? "" : " (unreadable)");
      line += " differs from " + holder[src] + "'s";
      const std::string fix = "rewritten from " + holder[src] + "'s copy (" +
                              (confirmed ? "its checksum verifies" : "the lowest-numbered member") +
                              ")";
      // Damage, on a cleanly unmounted filesystem: a copy that cannot be read, or fails the
      // checksum another copy passes, or metadata that no checksum speaks for. Two copies
      // that both verify are two versions the filesystem wrote (a crash in an offline tool,
      // resize or a repair, that reached one copy only): a notice, repaired from the copy
      // that verifies best (a zeroed inode-table copy verifies too, but holds fewer inodes
      // than the one it lost). File data has no checksum to tell.
      bool damage = false;
      for (uint32_t c : bad) damage |= !readable[c][i] || (confirmed && verify(b, data(c)) == 0);
      if (!confirmed && !data_area) damage = true;
      if (mirror_crashed_ || !damage) {
        notice(line + (o_.repair ? ": " + fix : std::string()) +
               " (what a crash leaves: a write that reached one copy only)");
      } else {
        problem(line, fix);
      }
      if (!o_.repair) continue;
      for (uint32_t c : bad) {
        if (Status s = dev_.write_copy(b, 1, c, data(src)); !s.is_ok())
          return fail("rewriting block " + num(b) + " on " + holder[c] + ": " + s.to_string());
        mirror_written_ = true;
      }
    }
    done += cnt;
  }
  return true;
}

void Checker::pass_mirrors() {
  // Whether the filesystem was cleanly unmounted, from the first copy whose superblock
  // verifies: that decides how differences are reported.
  std::vector<uint8_t> b0(kBlockSize);
  for (uint32_t c = 0; c < dev_.copies(); ++c) {
    if (dev_.copy_holder(0, c).empty() || !dev_.read_copy(0, 1, c, b0.data()).is_ok() ||
        !superblock_verifies(b0.data()))
      continue;
    Superblock s0;
    std::memcpy(&s0, b0.data(), sizeof s0);
    mirror_crashed_ = s0.state != kStateClean;
    break;
  }
  std::vector<uint8_t> sb_block;
  if (!mirror_range(
          0, 1, "the superblock", false,
          [](uint64_t, const uint8_t* b) { return superblock_verifies(b) ? 1 : 0; }, &sb_block))
    return;
  Superblock sb;
  std::memcpy(&sb, sb_block.data(), sizeof sb);
  if (!superblock_verifies(sb_block.data()) ||
      !superblock_problem(sb, dev_.block_count()).empty()) {
    verbose("pass M: no copy of the superblock verifies: only block 0 compared");
    return;
  }
  const Layout l(sb);
  const uint64_t seed = l.seed;
  const MirrorVerify self = [seed](uint64_t, const uint8_t* b) { return self_check(b, seed); };
  // The journal's header; its log (positions 1..) only where it may hold transactions to
  // replay: a clean filesystem's log is empty, its blocks stale and unused.
  if (l.journal_blocks > 0 &&
      !mirror_range(1, mirror_crashed_ ? l.journal_blocks : 1, "the journal", false, self, nullptr))
    return;
  std::vector<uint8_t> gdt;
  const uint64_t groups = l.groups;
  const MirrorVerify descs = [groups, seed, &l](uint64_t b, const uint8_t* p) {
    const uint64_t g0 = (b - l.gdt_start) * kGroupDescsPerBlock;
    for (uint64_t i = 0; i < kGroupDescsPerBlock && g0 + i < groups; ++i) {
      GroupDesc gd;
      std::memcpy(&gd, p + i * sizeof gd, sizeof gd);
      if (gd.checksum != group_checksum(gd, seed)) return 0;
    }
    return 1;
  };
  if (!mirror_range(l.gdt_start, l.gdt_used(), "the group descriptor table", false, descs, &gdt))
    return;
  std::vector<uint8_t> bitmap;
  for (uint32_t g = 0; g < l.groups; ++g) {
    GroupDesc gd;
    std::memcpy(&gd, gdt.data() + size_t{g} * sizeof gd, sizeof gd);
    const uint64_t start = l.group_start(g);
    const std::string of = " of group " + std::to_string(g);
    const MirrorVerify bbm = [&gd, seed](uint64_t, const uint8_t* p) {
      return checksum(p, kBlockSize, seed) == gd.block_bitmap_checksum ? 1 : 0;
    };
    const MirrorVerify ibm = [&gd, seed](uint64_t, const uint8_t* p) {
      return checksum(p, kBlockSize, seed) == gd.inode_bitmap_checksum ? 1 : 0;
    };
    const MirrorVerify inodes = [&l, start, seed, g](uint64_t b, const uint8_t* p) {
      const uint64_t first = uint64_t{g} * l.ipg + (b - start - 2) * kInodesPerBlock + 1;
      static const uint8_t zero[kInodeSize] = {};
      int in_use = 0;
      for (uint32_t i = 0; i < kInodesPerBlock; ++i) {
        Inode ino;
        std::memcpy(&ino, p + i * kInodeSize, sizeof ino);
        if (std::memcmp(&ino, zero, kInodeSize) == 0) continue;  // never written
        if (ino.checksum != inode_checksum(ino, first + i, seed)) return 0;
        ++in_use;
      }
      return 1 + in_use;  // of two verifying copies, the one with more inodes written
    };
    if (!mirror_range(start, 1, "the block bitmap" + of, false, bbm, &bitmap) ||
        !mirror_range(start + 1, 1, "the inode bitmap" + of, false, ibm, nullptr) ||
        !mirror_range(start + 2, l.itb, "the inode table" + of, false, inodes, nullptr))
      return;
    // The data blocks the bitmap marks allocated, run by run.
    const uint64_t size = l.group_size(g);
    for (uint64_t i = l.meta_end(g) - start; i < size;) {
      if (!test_bit(bitmap.data(), i)) {
        ++i;
        continue;
      }
      uint64_t e = i;
      while (e < size && test_bit(bitmap.data(), e)) ++e;
      if (!mirror_range(start + i, e - i, "data area" + of, true, self, nullptr)) return;
      i = e;
    }
  }
  if (!mirror_range(
          l.block_count - 1, 1, "the backup superblock", false,
          [](uint64_t, const uint8_t* b) { return superblock_verifies(b) ? 1 : 0; }, nullptr))
    return;
  if (mirror_written_) {
    if (Status s = dev_.flush(); !s.is_ok()) fail("flush failed: " + s.to_string());
  }
}

}  // namespace warpfs::fs::fsck_impl
