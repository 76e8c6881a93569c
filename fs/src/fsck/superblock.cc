// Pass 0 and the journal: which superblock to trust (the primary, else the backup at the
// filesystem's last block), the journal header and its committed transactions (replayed
// into the device with repair, into the overlay without), then the group descriptors and the
// bitmaps as found, and each group's reference-count table (refcounts.cc). Assumes nothing;
// leaves a Layout every later pass may trust, the bitmaps' trust (bb_ok_, ib_ok_) for pass 5
// and the allocator, and the tables kept (rt_) for pass 1's claims.
#include <cstring>

#include "fsck/checker.h"
#include "warpfs/blockdev/raid.h"

namespace warpfs::fs::fsck_impl {

bool Checker::find_backup(Superblock* out, uint64_t* at) {
  // The backup is the last block of the filesystem: at the device's end, or up to a group
  // earlier when mkfs left a partial group out.
  const uint64_t dev_blocks = dev_.block_count();
  std::vector<uint8_t> chunk(size_t{kChunk} * kBlockSize);
  for (uint64_t end = dev_blocks; end > 1 && dev_blocks - end <= kBlocksPerGroup + kChunk;) {
    const uint64_t n = std::min<uint64_t>(kChunk, end - 1);
    if (!read(end - n, n, chunk.data())) return false;
    for (uint64_t i = n; i-- > 0;) {
      std::memcpy(out, chunk.data() + i * kBlockSize, kBlockSize);
      if (out->magic == kMagic && superblock_problem(*out, dev_blocks).empty() &&
          out->block_count == end - n + i + 1) {
        *at = end - n + i;
        return true;
      }
    }
    end -= n;
  }
  return false;
}

bool Checker::load_superblock() {
  const uint64_t dev_blocks = dev_.block_count();
  if (!read(0, 1, sb_.get())) return false;
  const std::string why = superblock_problem(*sb_, dev_blocks);
  if (!why.empty()) return use_backup(why);
  auto backup = std::make_unique<Superblock>();
  if (!read(sb_->block_count - 1, 1, backup.get())) return false;
  std::string bwhy = superblock_problem(*backup, dev_blocks);
  if (bwhy.empty() && !same_filesystem(*backup, *sb_))
    bwhy = "it does not match the primary's geometry";
  if (!bwhy.empty()) {
    backup_bad_ = true;
    problem("backup superblock (block " + num(sb_->block_count - 1) + "): " + bwhy,
            "rewritten from the primary");
  }
  return true;
}

// The primary is unusable (`why`): the backup takes its place, if there is one.
bool Checker::use_backup(const std::string& why) {
  uint64_t at = 0;
  auto backup = std::make_unique<Superblock>();
  if (!find_backup(backup.get(), &at)) {
    if (failed()) return false;
    if (std::string member = blockdev::raid_member_hint(sb_.get()); !member.empty())
      return fail("not a warpfs filesystem: " + member);
    return fail(
        why == "no warpfs magic"
            ? "not a warpfs filesystem (no superblock at block 0 and no backup near the end)"
            : "the superblock (block 0) is damaged (" + why + ") and no valid backup was found");
  }
  *sb_ = *backup;
  used_backup_ = primary_bad_ = true;
  res_.used_backup = true;
  problem("superblock (block 0): " + why + "; using the backup at block " + num(at),
          "restored from the backup");
  return true;
}

// --- the journal -------------------------------------------------------------------------

bool Checker::check_journal() {
  auto jh = std::make_unique<JournalHeader>();
  if (!read(1, 1, jh.get())) return false;
  std::string why;
  if (jh->magic != kJournalHeaderMagic) {
    why = "bad magic";
  } else if (jh->checksum !=
             block_checksum(jh.get(), offsetof(JournalHeader, checksum), sb_->checksum_seed)) {
    why = "checksum mismatch";
  } else if (jh->tail_block == 0 || jh->tail_block >= sb_->journal_blocks) {
    why = "tail " + num(jh->tail_block) + " lies outside the journal";
  }
  if (!why.empty()) {
    journal_header_bad_ = true;
    problem("journal header (block 1): " + why, "reset (the journal is emptied, nothing replayed)");
    return true;
  }
  if (Status s = replay_journal(*io_, *sb_, /*dry_run=*/true, &pending_); !s.is_ok()) {
    return fail("journal scan failed: " + s.to_string());
  }
  return true;
}

bool Checker::replay() {
  if (journal_header_bad_ || pending_.transactions == 0) return true;
  const uint64_t n = pending_.transactions;
  const std::string what = num(n) + " committed transaction" + (n == 1 ? "" : "s") + " (" +
                           num(pending_.blocks) + " blocks)";
  // Invariant 10: a clean unmount leaves the journal empty. A crash leaves it as it is.
  const bool clean = sb_->state == kStateClean && !used_backup_;
  if (!o_.replay_journal) return discard_journal(what, clean);
  ReplayResult rr;
  if (Status s = replay_journal(*io_, *sb_, /*dry_run=*/false, &rr); !s.is_ok()) {
    return fail("journal replay failed: " + s.to_string());
  }
  res_.journal_transactions = rr.transactions;
  if (clean) {
    problem("journal: " + what + " after the tail of a cleanly unmounted filesystem", "replayed");
  } else if (o_.repair) {
    notice("journal: replayed " + what);
  } else {
    notice("journal: " + what + " not replayed yet (a mount replays them): checked as if replayed");
  }
  if (o_.repair) written_ = true;
  // The superblock may have been among the blocks.
  auto again = std::make_unique<Superblock>();
  if (!read(0, 1, again.get())) return false;
  if (superblock_problem(*again, dev_.block_count()).empty() && same_filesystem(*again, *sb_)) {
    if (used_backup_) notice("superblock (block 0): restored by the journal replay");
    *sb_ = *again;
    used_backup_ = primary_bad_ = false;
  }
  return true;
}

// FsckOptions::replay_journal off: with repair the transactions are dropped (the header's
// tail moves past them), without it the filesystem is checked as found.
bool Checker::discard_journal(const std::string& what, bool clean) {
  if (o_.repair) {
    JournalHeader jh{};
    jh.magic = kJournalHeaderMagic;
    jh.tail_block = pending_.next_pos;
    jh.tail_seq = pending_.next_seq;
    jh.checksum = block_checksum(&jh, offsetof(JournalHeader, checksum), sb_->checksum_seed);
    problem("journal: " + what + " not replayed", "discarded");
    return write(1, 1, &jh) && dev_.flush().is_ok();
  }
  if (clean) {
    problem("journal: " + what + " after the tail of a cleanly unmounted filesystem");
  } else {
    notice("journal: " + what + " pending, not replayed: the filesystem is checked as found");
  }
  return true;
}

// --- group descriptors and bitmaps -------------------------------------------------------

void Checker::load_groups() {
  const uint32_t G = L_.groups;
  gdt_raw_.assign(L_.gdt_blocks * kBlockSize, 0);
  if (!read(L_.gdt_start, L_.gdt_blocks, gdt_raw_.data())) return;
  gd_.resize(G);
  gd_ok_.assign(G, false);
  bb_ok_.assign(G, false);
  ib_ok_.assign(G, false);
  bb_.assign(G, std::vector<uint8_t>(kBlockSize));
  ib_.assign(G, std::vector<uint8_t>(kBlockSize));
  shared_blocks_ = (sb_->features & kFeatureSharedBlocks) != 0;
  rt_.assign(G, RefTable{});
  std::vector<uint8_t> two(2 * kBlockSize);
  for (uint32_t g = 0; g < G; ++g) {
    std::memcpy(&gd_[g], gdt_raw_.data() + size_t{g} * sizeof gd_[g], sizeof gd_[g]);
    check_descriptor(g);
    // The bitmaps sit at the group's start whatever the descriptor says (FORMAT.md "Layout").
    const uint64_t start = L_.group_start(g);
    if (!read(start, 2, two.data())) return;
    std::memcpy(bb_[g].data(), two.data(), kBlockSize);
    std::memcpy(ib_[g].data(), two.data() + kBlockSize, kBlockSize);
    load_refcount_table(g);
    if (failed()) return;
    if (!gd_ok_[g]) continue;  // no checksums to compare with: the bitmaps are not trusted
    bb_ok_[g] = checksum(bb_[g].data(), kBlockSize, L_.seed) == gd_[g].block_bitmap_checksum;
    ib_ok_[g] = checksum(ib_[g].data(), kBlockSize, L_.seed) == gd_[g].inode_bitmap_checksum;
    const std::string where = "group " + num(g);
    if (!bb_ok_[g])
      problem(where + ": block bitmap (block " + num(start) + ") checksum mismatch", "rebuilt");
    if (!ib_ok_[g])
      problem(where + ": inode bitmap (block " + num(start + 1) + ") checksum mismatch", "rebuilt");
  }
}

// Group g's descriptor: its checksum, where it points (its refcount_table: refcounts.cc).
void Checker::check_descriptor(uint32_t g) {
  const GroupDesc& d = gd_[g];
  const std::string where = "group " + num(g);
  const uint64_t start = L_.group_start(g);
  gd_ok_[g] = d.checksum == group_checksum(d, L_.seed);
  if (!gd_ok_[g]) {
    problem(where + ": descriptor checksum mismatch", "rewritten");
  } else if (d.block_bitmap != start || d.inode_bitmap != start + 1 || d.inode_table != start + 2) {
    problem(where + ": descriptor points at blocks " + num(d.block_bitmap) + ", " +
                num(d.inode_bitmap) + ", " + num(d.inode_table) + ", expected " + num(start) +
                ", " + num(start + 1) + ", " + num(start + 2),
            "rewritten");
  }
}

}  // namespace warpfs::fs::fsck_impl
