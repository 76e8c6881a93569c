// Repair: where the repairs get blocks and inodes (pass 1B's copies, rebuilt directories and
// extent trees, /lost+found). A block is free when nothing claims it and, on the first
// try, when a trusted bitmap marks it free too: so a block the bitmap still holds is reused
// only when nothing else is left.
#include <cstring>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

// Up to `want` contiguous blocks of some data area that nothing claims (and, where the
// bitmap is trusted, that it marks free). Claims them.
bool Checker::alloc(uint64_t want, uint64_t* first, uint64_t* got) {
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t k = 0; k < L_.groups; ++k) {
      const uint32_t g = (alloc_group_ + k) % L_.groups;
      if (alloc_in_group(g, pass == 0, want, first, got)) {
        alloc_group_ = g;
        return true;
      }
    }
  }
  return false;
}

bool Checker::alloc_in_group(uint32_t g, bool trust_bitmap, uint64_t want, uint64_t* first,
                             uint64_t* got) {
  const uint64_t start = L_.group_start(g), size = L_.group_size(g);
  auto is_free = [&](uint64_t i) {
    return !claimed(start + i) && (!trust_bitmap || !bb_ok_[g] || !test_bit(bb_[g].data(), i));
  };
  for (uint64_t i = 2 + uint64_t{L_.itb}; i < size; ++i) {
    if (claimed_[(start + i) / 64] == ~uint64_t{0}) {
      i = ((start + i) | 63) - start;  // the rest of a fully claimed word
      continue;
    }
    if (!is_free(i)) continue;
    uint64_t n = 1;
    while (n < want && i + n < size && is_free(i + n)) ++n;
    *first = start + i;
    *got = n;
    claim(*first, n);
    return true;
  }
  return false;
}

// A free inode number (the lowest), 0 if none.
uint64_t Checker::alloc_inode() {
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t g = 0; g < L_.groups; ++g) {
      for (uint64_t i = 0; i < L_.ipg; ++i) {
        const uint64_t ino = uint64_t{g} * L_.ipg + i + 1;
        if (ino == kRootInode || slot_[ino] != 0) continue;
        if (pass == 0 && ib_ok_[g] && test_bit(ib_[g].data(), i)) continue;
        return ino;
      }
    }
  }
  return 0;
}

bool Checker::copy_blocks(uint64_t from, uint64_t to, uint64_t n) {
  std::vector<uint8_t> buf(size_t{kChunk} * kBlockSize);
  for (uint64_t done = 0; done < n;) {
    const uint64_t k = std::min<uint64_t>(kChunk, n - done);
    if (!read(from + done, k, buf.data()) || !write(to + done, k, buf.data())) return false;
    done += k;
  }
  return true;
}

}  // namespace warpfs::fs::fsck_impl
