// fuzz_raid: RAID member labels as assembly reads them (fs/FORMAT.md "RAID member label").
// The input chooses a set (level, members, stripe), patches bytes of its members' labels
// (re-sealing the checksum when asked, so the fuzzer gets past it), and may fail members;
// then decode, check_raid_set and, when the set is accepted, a RaidBlockDevice over RAM
// members that writes, reads back and flushes.
// Promises: no crash or sanitizer report; a label that decodes re-encodes to one that decodes
// the same; an accepted set opens; blocks written read back as written while a copy of
// every group lives, else the operation says so.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "blockdev/mem_device.h"
#include "warpfs/blockdev/raid.h"

using namespace warpfs::blockdev;
using warpfs::blockdev::test::MemDevice;

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "warpfs fuzz: promise broken: %s\n", what.c_str());
  std::abort();
}

constexpr uint32_t kBB = 4096;

struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint16_t u16() { return static_cast<uint16_t>(byte() | byte() << 8); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  static const uint32_t kLevels[3] = {0, 1, 10};
  RaidLabel l;
  l.level = kLevels[in.byte() % 3];
  l.member_count = 2 + in.byte() % 4;  // 2..5
  if (l.level == 10) l.member_count = 4;
  l.stripe_blocks = 1u << (in.byte() % 6);  // 1..32 blocks
  l.member_blocks = l.stripe_blocks * (1 + in.byte() % 8);
  const uint8_t flags = in.byte();  // bit 0: re-seal checksums; bit 1: swap two members
  for (uint32_t k = 0; k < l.member_count; ++k) {
    l.members[k].kind = RaidIdentity::kGenerated;
    l.members[k].id[0] = static_cast<uint8_t>(k + 1);
    l.members[k].name = "m" + std::to_string(k);
  }
  l.set_uuid[0] = 0x5a;
  std::vector<std::unique_ptr<MemDevice>> mem;
  std::vector<BlockDevice*> devs;
  for (uint32_t k = 0; k < l.member_count; ++k) {
    mem.push_back(std::make_unique<MemDevice>(l.data_offset + l.member_blocks));
    devs.push_back(mem.back().get());
  }
  std::string err;
  if (!write_member_labels(devs, l, &err).is_ok()) broken("labels of a valid set: " + err);
  // Patches: (member, offset, value) until the input runs out or says stop (member 0xff).
  for (int i = 0; i < 64 && in.n >= 4; ++i) {
    const uint8_t m = in.byte();
    if (m == 0xff) break;
    const uint16_t off = in.u16() % kBB;
    mem[m % l.member_count]->at(0)[off] = in.byte();
  }
  if (flags & 1)
    for (auto& m : mem) RaidLabel::seal(m->at(0));
  if ((flags & 2) && l.member_count > 1) std::swap(devs[0], devs[1]);
  std::vector<RaidMemberSeen> seen(devs.size());
  for (size_t k = 0; k < devs.size(); ++k) {
    seen[k].name = "m" + std::to_string(k);
    std::vector<uint8_t> b(kBB);
    (void)devs[k]->read(0, 1, b.data());
    RaidLabel d, again;
    std::string why;
    if (RaidLabel::decode(b.data(), &d, &why)) {
      std::vector<uint8_t> e(kBB);
      d.encode(e.data());
      if (!RaidLabel::decode(e.data(), &again, &why) || again.generation != d.generation ||
          again.failed != d.failed || again.member_blocks != d.member_blocks ||
          again.position != d.position || again.uuid_text() != d.uuid_text())
        broken("a decoded label does not survive encode and decode: " + why);
    }
  }
  // Members that fail from the start (their I/O errors) and then the set.
  const uint8_t fail = in.byte();
  auto raid = RaidBlockDevice::assemble(devs, seen, nullptr, &err);
  if (!raid) return 0;  // refused, with a message
  for (uint32_t k = 0; k < raid->map().members; ++k) mem[k]->dead = (fail >> k) & 1;
  const uint64_t n = raid->block_count();
  std::vector<uint8_t> w(kBB * 8), r(kBB * 8);
  for (int op = 0; op < 8 && in.n >= 3; ++op) {
    const uint64_t b = in.u16() % n;
    const uint32_t c = 1 + static_cast<uint32_t>(std::min<uint64_t>(in.byte() % 8, n - b - 1));
    std::memset(w.data(), op + 1, w.size());
    const Status ws = raid->write(b, c, w.data());
    const Status rs = raid->read(b, c, r.data());
    if (ws.is_ok() && rs.is_ok() && std::memcmp(w.data(), r.data(), size_t{c} * kBB) != 0)
      broken("a block written reads back different");
    (void)raid->flush();
  }
  return 0;
}
