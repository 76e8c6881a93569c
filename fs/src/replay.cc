// Journal replay (fs/FORMAT.md "Journal"). The scan is bounded by the ring: every position
// it reads is journal-relative and wraps with journal_next(), so it never leaves blocks
// 1..journal_blocks, and it reads at most journal_blocks - 1 positions in all. Home
// locations are checked before anything is written: a transaction that names a block
// outside the filesystem, or inside the journal itself, ends the replay as if incomplete.
#include "warpfs/fs/replay.h"

#include <cstring>
#include <memory>
#include <vector>

#include "xxh.h"

namespace warpfs::fs {

using blockdev::Code;
using blockdev::Status;

namespace {

// Streaming xxHash64 state (held by value: xxh.h inlines xxHash).
struct Xxh64 {
  explicit Xxh64(uint64_t seed) { XXH64_reset(&st, seed); }
  void update(const void* p, size_t n) { XXH64_update(&st, p, n); }
  uint64_t digest() const { return XXH64_digest(&st); }
  XXH64_state_t st;
};

// Device block of journal position `pos` (position 0 is the header at block 1).
uint64_t journal_block(uint64_t pos) {
  return 1 + pos;
}

}  // namespace

Status replay_journal(blockdev::BlockDevice& dev, const Superblock& sb, bool dry_run,
                      ReplayResult* out) {
  *out = ReplayResult{};
  const uint32_t jblocks = sb.journal_blocks;
  // A header, a descriptor and a commit at the least; the journal must sit on the device.
  if (jblocks < 3 || dev.block_bytes() != kBlockSize || uint64_t{jblocks} + 1 > dev.block_count() ||
      sb.block_count > dev.block_count()) {
    return Status::error(Code::kInvalidArgument, "journal: geometry does not fit the device");
  }
  std::vector<uint8_t> buf(kBlockSize);
  if (Status s = dev.read(journal_block(0), 1, buf.data()); !s.is_ok()) return s;
  JournalHeader jh;
  std::memcpy(&jh, buf.data(), sizeof jh);
  if (jh.magic != kJournalHeaderMagic) {
    return Status::error(Code::kIoError, "journal header (block 1): bad magic");
  }
  if (jh.checksum !=
      block_checksum(buf.data(), offsetof(JournalHeader, checksum), sb.checksum_seed)) {
    return Status::error(Code::kIoError, "journal header (block 1): bad checksum");
  }
  if (jh.tail_block == 0 || jh.tail_block >= jblocks) {
    return Status::error(Code::kIoError, "journal header (block 1): tail outside the journal");
  }

  const uint64_t ring = jblocks - 1;  // positions 1..jblocks-1
  uint64_t pos = jh.tail_block, seq = jh.tail_seq, scanned = 0;
  std::vector<uint8_t> data;  // the n blocks of the transaction being read
  auto desc_buf = std::make_unique<JournalDescriptor>();
  auto commit_buf = std::make_unique<JournalCommit>();
  JournalDescriptor& d = *desc_buf;
  JournalCommit& c = *commit_buf;
  std::string stopped;
  while (true) {
    if (scanned + 2 > ring) {
      stopped = "journal end";
      break;
    }
    // Descriptor.
    if (Status s = dev.read(journal_block(pos), 1, &d); !s.is_ok()) return s;
    if (d.magic != kJournalDescriptorMagic) {
      stopped = "no descriptor";
      break;
    }
    if (d.checksum != block_checksum(&d, offsetof(JournalDescriptor, checksum), sb.checksum_seed)) {
      stopped = "descriptor checksum";
      break;
    }
    if (d.seq != seq) {
      stopped = "descriptor sequence";  // an older transaction: the log ends here
      break;
    }
    if (d.count == 0 || d.count > kJournalMaxBlocks || d.count + 2 > ring - scanned) {
      stopped = "descriptor count";
      break;
    }
    bool targets_ok = true;
    for (uint32_t i = 0; i < d.count; ++i) {
      const uint64_t t = d.targets[i];
      // Home blocks lie in the filesystem and never inside the journal (blocks 1..J).
      if (t >= sb.block_count || (t >= 1 && t <= jblocks)) targets_ok = false;
    }
    if (!targets_ok) {
      stopped = "descriptor target";
      break;
    }
    // The n blocks, hashed after the descriptor.
    Xxh64 h(sb.checksum_seed);
    h.update(&d, kBlockSize);
    data.resize(size_t{d.count} * kBlockSize);
    uint64_t p = pos;
    for (uint32_t i = 0; i < d.count; ++i) {
      p = journal_next(p, jblocks);
      uint8_t* dst = data.data() + size_t{i} * kBlockSize;
      if (Status s = dev.read(journal_block(p), 1, dst); !s.is_ok()) return s;
      h.update(dst, kBlockSize);
    }
    // Commit.
    p = journal_next(p, jblocks);
    if (Status s = dev.read(journal_block(p), 1, &c); !s.is_ok()) return s;
    if (c.magic != kJournalCommitMagic) {
      stopped = "no commit";
      break;
    }
    if (c.checksum != block_checksum(&c, offsetof(JournalCommit, checksum), sb.checksum_seed)) {
      stopped = "commit checksum";
      break;
    }
    if (c.seq != d.seq || c.count != d.count) {
      stopped = "commit does not match its descriptor";
      break;
    }
    if (c.data_checksum != h.digest()) {
      stopped = "data checksum";
      break;
    }
    // Complete: write it home, in order (a later transaction overrides an earlier one).
    if (!dry_run) {
      for (uint32_t i = 0; i < d.count; ++i) {
        if (Status s = dev.write(d.targets[i], 1, data.data() + size_t{i} * kBlockSize);
            !s.is_ok()) {
          return s;
        }
      }
    }
    out->transactions += 1;
    out->blocks += d.count;
    scanned += d.count + 2;
    seq += 1;
    pos = journal_next(p, jblocks);
  }
  out->next_seq = seq;
  out->next_pos = pos;
  out->stopped = stopped;
  if (dry_run || out->transactions == 0) return Status::ok();

  // The home writes are durable before the header stops pointing at them.
  if (Status s = dev.flush(); !s.is_ok()) return s;
  std::memset(&jh, 0, sizeof jh);
  jh.magic = kJournalHeaderMagic;
  jh.tail_block = pos;
  jh.tail_seq = seq;
  jh.checksum = block_checksum(&jh, offsetof(JournalHeader, checksum), sb.checksum_seed);
  if (Status s = dev.write(journal_block(0), 1, &jh); !s.is_ok()) return s;
  return dev.flush();
}

}  // namespace warpfs::fs
