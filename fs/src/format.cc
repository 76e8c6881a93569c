#include "warpfs/fs/format.h"

#include <cstring>

#include "xxh.h"

namespace warpfs::fs {

uint64_t checksum(const void* data, size_t len, uint64_t seed) {
  return XXH64(data, len, seed);
}

uint64_t block_checksum(const void* block, size_t field_offset, uint64_t seed) {
  // Hash the block in three pieces around the zeroed checksum field, without copying it.
  XXH64_state_t st;  // on the stack: xxh.h inlines xxHash (no allocation, no failure)
  XXH64_reset(&st, seed);
  const auto* p = static_cast<const uint8_t*>(block);
  static const uint8_t zero[8] = {};
  XXH64_update(&st, p, field_offset);
  XXH64_update(&st, zero, 8);
  XXH64_update(&st, p + field_offset + 8, kBlockSize - field_offset - 8);
  const uint64_t h = XXH64_digest(&st);
  return h;
}

uint64_t superblock_checksum(const Superblock& sb) {
  // The superblock is checksummed with seed 0: the seed it carries cannot be trusted first.
  return XXH64(&sb, offsetof(Superblock, checksum), 0);
}

uint64_t group_checksum(const GroupDesc& gd, uint64_t seed) {
  return XXH64(&gd, offsetof(GroupDesc, checksum), seed);
}

uint64_t inode_checksum(const Inode& ino, uint64_t ino_number, uint64_t seed) {
  return XXH64(&ino, offsetof(Inode, checksum), seed ^ ino_number);
}

uint64_t name_hash(const char* name, size_t len, uint64_t dir_seed) {
  const uint64_t h = XXH64(name, len, dir_seed) & ~(1ull << 63);
  if (h < 2) return h + 2;                   // 0 and 1 are "." and ".."
  return h == kMaxNameHash + 1 ? h - 1 : h;  // readdir's cookie h + 1 must fit in an off_t
}

}  // namespace warpfs::fs
