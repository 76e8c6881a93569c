#include "warpfs/blockdev/raid.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

namespace warpfs::blockdev {

namespace {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: a label is written a
// few times per mount, so a table buys nothing.
uint32_t crc32c(const uint8_t* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
  }
  return ~c;
}

template <typename T>
void put(uint8_t* b, size_t at, T v) {
  std::memcpy(b + at, &v, sizeof v);
}
template <typename T>
T get(const uint8_t* b, size_t at) {
  T v;
  std::memcpy(&v, b + at, sizeof v);
  return v;
}

constexpr size_t kLabelBytes = 4096;
constexpr size_t kEntries = 128, kEntryBytes = 128, kNameBytes = 96, kCrcAt = 4088;

std::string hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

}  // namespace

// --- label --------------------------------------------------------------------------------

bool RaidIdentity::same_id(const RaidIdentity& o) const {
  return kind == o.kind && std::memcmp(id, o.id, sizeof id) == 0;
}

std::string RaidIdentity::id_text() const {
  switch (kind) {
    case kNguid:
      return "NGUID " + hex(id, 16);
    case kEui64:
      return "EUI64 " + hex(id, 8);
    case kGenerated:
      return "generated id " + hex(id, 16);
    default:
      return "no identity";
  }
}

void RaidLabel::encode(void* block) const {
  auto* b = static_cast<uint8_t*>(block);
  std::memset(b, 0, kLabelBytes);
  put(b, 0, kMagic);
  put(b, 8, kVersion);
  put(b, 12, level);
  std::memcpy(b + 16, set_uuid, 16);
  put(b, 32, stripe_blocks);
  put(b, 36, member_count);
  put(b, 40, position);
  put(b, 44, flags);
  put(b, 48, data_offset);
  put(b, 56, member_blocks);
  put(b, 64, generation);
  put(b, 72, failed);
  put(b, 76, block_size);
  for (uint32_t k = 0; k < kMaxMembers && k < member_count; ++k) {
    uint8_t* e = b + kEntries + k * kEntryBytes;
    put(e, 0, members[k].kind);
    put(e, 8, members[k].blocks);
    std::memcpy(e + 16, members[k].id, 16);
    std::memcpy(e + 32, members[k].name.data(), std::min(members[k].name.size(), kNameBytes - 1));
  }
  seal(b);
}

void RaidLabel::seal(void* block) {
  auto* b = static_cast<uint8_t*>(block);
  put(b, kCrcAt, crc32c(b, kCrcAt));
}

bool RaidLabel::has_magic(const void* block) {
  return get<uint64_t>(static_cast<const uint8_t*>(block), 0) == kMagic;
}

bool RaidLabel::decode(const void* block, RaidLabel* out, std::string* why) {
  const auto* b = static_cast<const uint8_t*>(block);
  if (!has_magic(b)) {
    *why = "no RAID member label (block 0 is something else)";
    return false;
  }
  if (get<uint32_t>(b, kCrcAt) != crc32c(b, kCrcAt)) {
    *why = "the RAID member label is damaged (checksum mismatch)";
    return false;
  }
  if (get<uint32_t>(b, 8) != kVersion) {
    *why = "RAID member label version " + std::to_string(get<uint32_t>(b, 8)) + " (knows 1)";
    return false;
  }
  RaidLabel l;
  l.level = get<uint32_t>(b, 12);
  std::memcpy(l.set_uuid, b + 16, 16);
  l.stripe_blocks = get<uint32_t>(b, 32);
  l.member_count = get<uint32_t>(b, 36);
  l.position = get<uint32_t>(b, 40);
  l.flags = get<uint32_t>(b, 44);
  l.data_offset = get<uint64_t>(b, 48);
  l.member_blocks = get<uint64_t>(b, 56);
  l.generation = get<uint64_t>(b, 64);
  l.failed = get<uint32_t>(b, 72);
  l.block_size = get<uint32_t>(b, 76);
  for (uint32_t k = 0; k < kMaxMembers && k < l.member_count; ++k) {
    const uint8_t* e = b + kEntries + k * kEntryBytes;
    l.members[k].kind = get<uint32_t>(e, 0);
    l.members[k].blocks = get<uint64_t>(e, 8);
    std::memcpy(l.members[k].id, e + 16, 16);
    const char* name = reinterpret_cast<const char*>(e + 32);
    l.members[k].name.assign(name, strnlen(name, kNameBytes));
  }
  if (std::string bad = l.invalid(); !bad.empty()) {
    *why = "the RAID member label is inconsistent: " + bad;
    return false;
  }
  *out = l;
  return true;
}

std::string raid_member_hint(const void* block0) {
  RaidLabel l;
  std::string why;
  if (!RaidLabel::has_magic(block0)) return "";
  if (!RaidLabel::decode(block0, &l, &why)) return "block 0 is a RAID member label (" + why + ")";
  return "it is member " + std::to_string(l.position) + " of the RAID " + std::to_string(l.level) +
         " set " + l.uuid_text() + " of " + std::to_string(l.member_count) +
         " devices: give all of them, in order, joined by commas";
}

std::string raid_level_problem(uint32_t level, uint32_t members) {
  if (level != 0 && level != 1 && level != 10)
    return "RAID level " + std::to_string(level) + " (knows 0, 1 and 10)";
  if (members < 2 || members > RaidLabel::kMaxMembers)
    return "RAID " + std::to_string(level) + " over " + std::to_string(members) +
           " devices (2 to 16)";
  if (level == 10 && (members < 4 || members % 2 != 0))
    return "RAID 10 needs an even number of devices, at least 4 (given " + std::to_string(members) +
           ")";
  return "";
}

uint32_t raid_copies(uint32_t level, uint32_t members) {
  return level == 1 ? members : level == 10 ? 2 : 1;
}

std::string RaidLabel::invalid() const {
  if (std::string p = raid_level_problem(level, member_count); !p.empty()) return p;
  if (stripe_blocks == 0 || (stripe_blocks & (stripe_blocks - 1)) != 0)
    return "stripe of " + std::to_string(stripe_blocks) + " blocks (a power of two)";
  if (position >= member_count) return "position beyond the member count";
  if (member_blocks == 0 || member_blocks % stripe_blocks != 0)
    return "member size not a whole number of stripes";
  if (data_offset == 0) return "data offset 0 (block 0 is the label)";
  if (block_size != 4096) return "block size " + std::to_string(block_size);
  if ((failed >> member_count) != 0) return "failed member beyond the member count";
  return "";
}

std::string RaidLabel::uuid_text() const {
  return hex(set_uuid, 16);
}

// --- map ----------------------------------------------------------------------------------

RaidMap RaidMap::of(const RaidLabel& l) {
  RaidMap m;
  m.stripe = l.stripe_blocks;
  m.members = l.member_count;
  m.copies = raid_copies(l.level, l.member_count);
  m.data_offset = l.data_offset;
  m.member_blocks = l.member_blocks;
  return m;
}

RaidMap::Piece RaidMap::piece(uint64_t block, uint64_t count) const {
  const uint32_t g = groups();
  Piece p;
  uint64_t len = 0;
  while (len < count) {
    const uint64_t b = block + len, s = b / stripe, o = b % stripe;
    const uint32_t grp = static_cast<uint32_t>(s % g);
    const uint64_t row = (s / g) * stripe + o;
    if (len == 0) {
      p.group = grp, p.row = row;
    } else if (grp != p.group || row != p.row + len) {
      break;
    }
    len += std::min<uint64_t>(stripe - o, count - len);
  }
  p.count = static_cast<uint32_t>(std::min<uint64_t>(len, UINT32_MAX));
  return p;
}

uint64_t RaidMap::rows_below(uint32_t group, uint64_t x) const {
  const uint64_t width = uint64_t{stripe} * groups();  // one row of stripes over the groups
  const uint64_t rem = x % width, start = uint64_t{group} * stripe;
  return (x / width) * stripe + (rem > start ? std::min<uint64_t>(rem - start, stripe) : 0);
}

// --- assembly -----------------------------------------------------------------------------

bool check_raid_set(const std::vector<RaidMemberSeen>& seen, RaidLabel* newest,
                    std::string* error) {
  if (seen.empty()) {
    *error = "no devices";
    return false;
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i].has_label) {
      *error = seen[i].name + " (given as member " + std::to_string(i) +
               "): not a member of a RAID set: " + seen[i].label_problem +
               " (a new device in a failed member's position is rebuilt by fsck.warpfs "
               "--resync)";
      return false;
    }
  }
  // The set most devices belong to (the first one's on a tie); the others are foreign.
  std::map<std::string, int> votes;
  for (const RaidMemberSeen& s : seen) ++votes[s.label.uuid_text()];
  std::string set = seen[0].label.uuid_text();
  for (const auto& [u, n] : votes)
    if (n > votes[set]) set = u;
  const RaidMemberSeen* ref = nullptr;
  for (const RaidMemberSeen& s : seen) {
    if (s.label.uuid_text() != set) {
      *error = s.name + " is a member of another RAID set (" + s.label.uuid_text() + ", not " +
               set + "): a foreign member";
      return false;
    }
    if (!ref || s.label.generation > ref->label.generation) ref = &s;
  }
  const RaidLabel& l = ref->label;
  for (const RaidMemberSeen& s : seen) {
    const RaidLabel& m = s.label;
    if (m.level != l.level || m.member_count != l.member_count ||
        m.stripe_blocks != l.stripe_blocks || m.data_offset != l.data_offset ||
        m.member_blocks != l.member_blocks) {
      *error = s.name + ": its label's geometry (RAID " + std::to_string(m.level) + ", " +
               std::to_string(m.member_count) + " members) disagrees with " + ref->name +
               "'s (RAID " + std::to_string(l.level) + ", " + std::to_string(l.member_count) +
               " members) of the same set";
      return false;
    }
  }
  const std::string in_set = " of RAID set " + set;
  std::vector<int> at(l.member_count, -1);  // position -> index in `seen`
  for (size_t i = 0; i < seen.size(); ++i) {
    const uint32_t p = seen[i].label.position;
    if (at[p] >= 0) {
      *error = seen[at[p]].name + " and " + seen[i].name + " are both member " + std::to_string(p) +
               in_set + " (a copy of one member?)";
      return false;
    }
    at[p] = static_cast<int>(i);
  }
  for (uint32_t p = 0; p < l.member_count; ++p) {
    if (at[p] < 0) {
      *error = "member " + std::to_string(p) + in_set + " (" + l.members[p].name + ", " +
               l.members[p].id_text() + ") is missing: " + std::to_string(seen.size()) + " of " +
               std::to_string(l.member_count) + " devices given";
      return false;
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (seen[i].label.position == i) continue;
    std::string order;
    for (uint32_t p = 0; p < l.member_count; ++p) order += (p ? "," : "") + seen[at[p]].name;
    *error = seen[i].name + " is member " + std::to_string(seen[i].label.position) + in_set +
             " but was given as member " + std::to_string(i) + ": give them in the order " + order;
    return false;
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    const RaidIdentity& rec = l.members[i];
    const RaidIdentity& dev = seen[i].identity;
    if ((rec.kind == RaidIdentity::kNguid || rec.kind == RaidIdentity::kEui64) &&
        !rec.same_id(dev)) {
      *error = seen[i].name + " is not the device recorded as member " + std::to_string(i) +
               in_set + " (recorded " + rec.id_text() + ", this device has " + dev.id_text() + ")";
      return false;
    }
    // A device's own label names it; a member replaced (and rebuilt) since is named otherwise
    // by the newer labels.
    if (!seen[i].label.members[i].same_id(rec)) {
      *error = seen[i].name + " was member " + std::to_string(i) + in_set +
               " but has been replaced (now " + rec.name + ", " + rec.id_text() + ")";
      return false;
    }
  }
  *newest = l;
  return true;
}

Status write_member_labels(const std::vector<BlockDevice*>& members, RaidLabel l,
                           std::string* error) {
  for (uint32_t k = 0; k < members.size(); ++k) {
    BlockDevice& d = *members[k];
    std::vector<uint8_t> area(l.data_offset * kLabelBytes, 0);
    l.position = k;
    l.encode(area.data());
    // The zeroes first, the label last, then durable.
    Status s = d.write(1, static_cast<uint32_t>(l.data_offset - 1), area.data() + kLabelBytes);
    if (s.is_ok()) s = d.write(0, 1, area.data());
    if (s.is_ok()) s = d.flush();
    if (!s.is_ok()) {
      *error = "member " + std::to_string(k) + " (" + l.members[k].name +
               "): writing the RAID label failed: " + s.to_string();
      return s;
    }
  }
  return Status::ok();
}

// --- resync -------------------------------------------------------------------------------

namespace {

// Writes `l` as member k's label (after zeroing blocks 1..data_offset-1 when `area`) and
// flushes it.
Status put_label(BlockDevice& d, RaidLabel l, uint32_t k, bool area) {
  l.position = k;
  std::vector<uint8_t> b((area ? l.data_offset : 1) * kLabelBytes, 0);
  l.encode(b.data());
  Status s = Status::ok();
  if (area) s = d.write(1, static_cast<uint32_t>(l.data_offset - 1), b.data() + kLabelBytes);
  if (s.is_ok()) s = d.write(0, 1, b.data());
  if (s.is_ok()) s = d.flush();
  return s;
}

}  // namespace

Status resync_raid_set(const std::vector<BlockDevice*>& members, std::vector<RaidMemberSeen> seen,
                       const std::function<void(uint64_t, uint64_t)>& progress,
                       RaidResyncReport* report, std::string* error, bool replace) {
  *report = RaidResyncReport{};
  auto refuse = [&](const std::string& why) {
    *error = why;
    return Status::error(Code::kInvalidArgument, "RAID resync refused (see the message)");
  };
  const size_t n = members.size();
  if (n < 2 || seen.size() != n) return refuse("a resync needs every device of the set, in order");
  std::vector<bool> blank(n, false);
  const RaidMemberSeen* ref = nullptr;
  for (size_t i = 0; i < n; ++i) {
    std::vector<uint8_t> b(members[i]->block_bytes());
    if (Status s = members[i]->read(0, 1, b.data()); !s.is_ok())
      return refuse(seen[i].name + ": reading block 0 failed: " + s.to_string());
    seen[i].has_label = RaidLabel::decode(b.data(), &seen[i].label, &seen[i].label_problem);
    if (!seen[i].has_label) {
      if (RaidLabel::has_magic(b.data()))
        return refuse(seen[i].name + " (given as member " + std::to_string(i) +
                      "): " + seen[i].label_problem +
                      "; if its data is not needed, zero its block 0 and give --replace");
      if (!replace && std::any_of(b.begin(), b.end(), [](uint8_t x) { return x != 0; }))
        return refuse(seen[i].name + " (given as member " + std::to_string(i) +
                      ") has no RAID label but is not blank (block 0 holds data: another "
                      "filesystem?); a resync would overwrite it: check the device list, or "
                      "give --replace to overwrite it");
      blank[i] = true;
      continue;
    }
    if (!ref || seen[i].label.generation > ref->label.generation) ref = &seen[i];
  }
  if (!ref) return refuse("none of the devices is a member of a RAID set (no label found)");
  // The set is the newest label's; every labelled device must belong to it, in its place.
  const RaidLabel& newest = ref->label;
  const std::string set = newest.uuid_text(), in_set = " of RAID set " + set;
  if (newest.level == 0)
    return refuse("RAID set " + set +
                  " is RAID 0: it keeps one copy of each block, so no member can be rebuilt");
  if (n != newest.member_count)
    return refuse("RAID set " + set + " has " + std::to_string(newest.member_count) + " members; " +
                  std::to_string(n) +
                  " devices given (give every position, a replacement in the failed one's)");
  for (size_t i = 0; i < n; ++i) {
    if (blank[i]) continue;
    const RaidLabel& m = seen[i].label;
    if (m.uuid_text() != set)
      return refuse(seen[i].name + " (given as member " + std::to_string(i) +
                    ") is a member of another RAID set (" + m.uuid_text() + ", not " + set +
                    "): a foreign member is not overwritten by a resync");
    if (m.level != newest.level || m.member_count != newest.member_count ||
        m.stripe_blocks != newest.stripe_blocks || m.data_offset != newest.data_offset ||
        m.member_blocks != newest.member_blocks)
      return refuse(seen[i].name + ": its label's geometry (RAID " + std::to_string(m.level) +
                    ") disagrees with " + ref->name + "'s (RAID " + std::to_string(newest.level) +
                    ") of the same set");
    if (m.position != i)
      return refuse(seen[i].name + " is member " + std::to_string(m.position) + in_set +
                    " but was given as member " + std::to_string(i));
    const RaidIdentity& rec = newest.members[i];
    if ((rec.kind == RaidIdentity::kNguid || rec.kind == RaidIdentity::kEui64) &&
        !rec.same_id(seen[i].identity))
      return refuse(seen[i].name + " is not the device recorded as member " + std::to_string(i) +
                    in_set + " (recorded " + rec.id_text() + ", this device has " +
                    seen[i].identity.id_text() + ")");
    if (!m.members[i].same_id(rec))
      return refuse(seen[i].name + " was member " + std::to_string(i) + in_set +
                    " but has been replaced (now " + rec.name +
                    "); zero its block 0 to use it as a blank replacement");
  }
  uint32_t targets = newest.failed;
  for (size_t i = 0; i < n; ++i) {
    if (!blank[i]) continue;
    if (!replace && !((newest.failed >> i) & 1))
      return refuse(seen[i].name + " is blank, but member " + std::to_string(i) + in_set +
                    " is not marked failed by the newest label given (" + ref->name +
                    "'s, generation " + std::to_string(newest.generation) +
                    "): its own device may hold newer data than these labels know of. Give "
                    "that device, or --replace to rebuild member " +
                    std::to_string(i) + " from the others anyway");
    targets |= 1u << i;
  }
  report->generation = newest.generation;
  if (targets == 0) {
    // Whole. A cut between a resync's final labels leaves older ones beside the newest
    // (harmless: the newest wins); they are brought level here.
    bool level = true;
    for (size_t i = 0; i < n; ++i) level &= seen[i].label.generation == newest.generation;
    if (level) return Status::ok();
    RaidLabel l = newest;
    l.generation += 1;
    for (uint32_t k = 0; k < n; ++k) {
      if (Status s = put_label(*members[k], l, k, false); !s.is_ok()) {
        *error = "member " + std::to_string(k) + " (" + seen[k].name +
                 "): writing its label failed: " + s.to_string();
        return s;
      }
    }
    report->generation = l.generation;
    return Status::ok();
  }
  const RaidMap map = RaidMap::of(newest);
  for (uint32_t g = 0; g < map.groups(); ++g) {
    bool source = false;
    for (uint32_t c = 0; c < map.copies; ++c) source |= !((targets >> map.member(g, c)) & 1);
    if (!source) {
      std::string which;
      for (uint32_t c = 0; c < map.copies; ++c)
        which += (c ? ", " : "") + std::to_string(map.member(g, c));
      return refuse("every copy of stripe group " + std::to_string(g) + " (members " + which +
                    ") is failed or new: nothing to rebuild them from");
    }
  }
  for (uint32_t k = 0; k < n; ++k) {
    if (!((targets >> k) & 1)) continue;
    if (members[k]->block_bytes() != newest.block_size ||
        members[k]->block_count() < map.data_offset + map.member_blocks)
      return refuse(seen[k].name + " (member " + std::to_string(k) +
                    "): " + std::to_string(members[k]->block_count()) + " blocks of " +
                    std::to_string(members[k]->block_bytes()) + " bytes; the set needs " +
                    std::to_string(map.data_offset + map.member_blocks) + " of " +
                    std::to_string(newest.block_size));
  }
  auto failed_at = [&](uint32_t k, const std::string& what, const Status& s) {
    *error = "member " + std::to_string(k) + " (" + seen[k].name + "): " + what + ": " +
             s.to_string() + "; the set stays degraded";
    return s;
  };
  // 1. The survivors record the targets failed (and a blank's identity), then the targets
  //    get the same label: from here a cut leaves a set that opens degraded, the targets
  //    unread.
  RaidLabel l = newest;
  l.failed |= targets;
  l.flags |= RaidLabel::kDegraded;
  l.generation = newest.generation + 1;
  std::random_device rd;
  for (uint32_t k = 0; k < n; ++k) {
    if (!blank[k]) continue;
    RaidIdentity& id = l.members[k];
    id = seen[k].identity;
    if (id.kind == RaidIdentity::kNone) {
      id.kind = RaidIdentity::kGenerated;
      for (uint8_t& x : id.id) x = static_cast<uint8_t>(rd());
    }
    id.blocks = members[k]->block_count();
    id.name = seen[k].name;
  }
  for (uint32_t k = 0; k < n; ++k) {
    if ((l.failed >> k) & 1) continue;
    if (Status s = put_label(*members[k], l, k, false); !s.is_ok())
      return failed_at(k, "writing its label failed", s);
  }
  for (uint32_t k = 0; k < n; ++k) {
    if (!((targets >> k) & 1)) continue;
    if (Status s = put_label(*members[k], l, k, true); !s.is_ok())
      return failed_at(k, "writing its label failed", s);
  }
  // 2. Every row of each target from a live copy of its group (the next one on a read error).
  constexpr uint32_t kChunk = 256;  // 1 MiB of 4 KiB blocks
  std::vector<uint8_t> buf(size_t{kChunk} * newest.block_size);
  uint64_t total = 0, done = 0;
  for (uint32_t k = 0; k < n; ++k)
    if ((targets >> k) & 1) total += map.member_blocks;
  for (uint32_t k = 0; k < n; ++k) {
    if (!((targets >> k) & 1)) continue;
    const uint32_t g = k / map.copies;
    for (uint64_t row = 0; row < map.member_blocks; row += kChunk) {
      const uint32_t cnt =
          static_cast<uint32_t>(std::min<uint64_t>(kChunk, map.member_blocks - row));
      Status rs = Status::error(Code::kIoError, "no live copy");
      for (uint32_t c = 0; c < map.copies && !rs.is_ok(); ++c) {
        const uint32_t src = map.member(g, c);
        if ((l.failed >> src) & 1) continue;
        rs = members[src]->read(map.data_offset + row, cnt, buf.data());
      }
      if (!rs.is_ok())
        return failed_at(k,
                         "reading rows " + std::to_string(row) + ".." +
                             std::to_string(row + cnt - 1) + " from its group's copies failed",
                         rs);
      if (Status s = members[k]->write(map.data_offset + row, cnt, buf.data()); !s.is_ok())
        return failed_at(k, "writing its data failed", s);
      done += cnt;
      if (progress) progress(done, total);
    }
  }
  // 3. The copies are durable before any label calls them current.
  for (uint32_t k = 0; k < n; ++k) {
    if (!((targets >> k) & 1)) continue;
    if (Status s = members[k]->flush(); !s.is_ok()) return failed_at(k, "flush failed", s);
  }
  // 4. Current again: the targets' labels first, then the survivors'. The highest generation
  //    wins at assembly, so either one written is enough.
  l.failed &= ~targets;
  if (l.failed == 0) l.flags &= ~RaidLabel::kDegraded;
  l.generation += 1;
  for (uint32_t pass = 0; pass < 2; ++pass) {
    for (uint32_t k = 0; k < n; ++k) {
      if ((((targets >> k) & 1) != 0) != (pass == 0)) continue;
      if ((l.failed >> k) & 1) continue;
      if (Status s = put_label(*members[k], l, k, false); !s.is_ok())
        return failed_at(k, "writing its final label failed", s);
    }
  }
  report->rebuilt = targets;
  report->blocks_copied = done;
  report->generation = l.generation;
  return Status::ok();
}

std::unique_ptr<RaidBlockDevice> RaidBlockDevice::assemble(
    const std::vector<BlockDevice*>& members, std::vector<RaidMemberSeen> seen,
    std::function<void(const std::string&)> log, std::string* error) {
  for (size_t i = 0; i < members.size() && i < seen.size(); ++i) {
    std::vector<uint8_t> b(members[i]->block_bytes());
    if (Status s = members[i]->read(0, 1, b.data()); !s.is_ok()) {
      seen[i].label_problem = "reading block 0 failed: " + s.to_string();
      continue;
    }
    seen[i].has_label = RaidLabel::decode(b.data(), &seen[i].label, &seen[i].label_problem);
  }
  RaidLabel newest;
  if (!check_raid_set(seen, &newest, error)) return nullptr;
  auto d = create(members, newest, log, error);
  if (!d) return nullptr;
  for (uint32_t k = 0; k < newest.member_count && log; ++k) {
    if ((newest.failed >> k) & 1)
      log("RAID set " + newest.uuid_text() + " is degraded: member " + std::to_string(k) + " (" +
          seen[k].name + ") failed and is not used");
  }
  return d;
}

// --- part pool ----------------------------------------------------------------------------

PartPool::PartPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { worker(); });
}

PartPool::~PartPool() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void PartPool::done(Join* j) {
  std::lock_guard<std::mutex> g(j->m);  // notify under the lock: the waiter owns j
  if (--j->left == 0) j->cv.notify_one();
}

void PartPool::worker() {
  for (;;) {
    Task* t;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [this] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stopping, nothing left
      t = q_.front();
      q_.pop_front();
    }
    (*t->fn)();
    done(t->join);
  }
}

void PartPool::run(const std::function<void()>* fns, int n) {
  if (n <= 0) return;
  Join j;
  j.left = n - 1;
  std::vector<Task> tasks(n > 1 ? n - 1 : 0);
  if (n > 1) {
    {
      std::lock_guard<std::mutex> g(mu_);
      for (int i = 1; i < n; ++i) {
        tasks[i - 1] = Task{&fns[i], &j};
        q_.push_back(&tasks[i - 1]);
      }
    }
    cv_.notify_all();
  }
  fns[0]();
  if (n == 1) return;
  // Take back what no thread has started: removed from the queue, it is ours alone.
  std::vector<Task*> mine;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto it = q_.begin(); it != q_.end();) {
      if ((*it)->join == &j) {
        mine.push_back(*it);
        it = q_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Task* t : mine) {
    (*t->fn)();
    done(&j);
  }
  std::unique_lock<std::mutex> g(j.m);
  j.cv.wait(g, [&] { return j.left == 0; });
}

// --- the device ---------------------------------------------------------------------------

RaidBlockDevice::RaidBlockDevice(std::vector<BlockDevice*> m, const RaidLabel& l,
                                 const RaidMap& map, std::function<void(const std::string&)> log)
    : m_(std::move(m)),
      map_(map),
      bb_(m_[0]->block_bytes()),
      st_(new MemberState[m_.size()]),
      label_(l),
      log_(std::move(log)),
      pool_(std::make_unique<PartPool>(static_cast<int>(std::min<size_t>(m_.size(), 8)))),
      bounces_(new Bounces[m_.size()]) {
  failed_.store(l.failed);
}

// Every read left in flight has ended (its owner polled or destroyed it): the bounces are
// all free.
RaidBlockDevice::~RaidBlockDevice() {
  for (size_t k = 0; k < m_.size(); ++k) {
    for (void* p : bounces_[k].free) m_[k]->free_io_buffer(p, bounce_bytes());
  }
}

std::unique_ptr<RaidBlockDevice> RaidBlockDevice::create(
    std::vector<BlockDevice*> members, const RaidLabel& label,
    std::function<void(const std::string&)> log, std::string* error) {
  if (std::string bad = label.invalid(); !bad.empty()) {
    *error = "RAID label: " + bad;
    return nullptr;
  }
  if (members.size() != label.member_count) {
    *error = "RAID set of " + std::to_string(label.member_count) + " members given " +
             std::to_string(members.size()) + " devices";
    return nullptr;
  }
  const RaidMap map = RaidMap::of(label);
  for (size_t k = 0; k < members.size(); ++k) {
    if (members[k]->block_bytes() != label.block_size ||
        members[k]->block_count() < map.data_offset + map.member_blocks) {
      *error = "member " + std::to_string(k) + " (" + label.members[k].name +
               ") is smaller than its label says or has another block size";
      return nullptr;
    }
  }
  for (uint32_t g = 0; g < map.groups(); ++g) {
    bool any = false;
    for (uint32_t c = 0; c < map.copies; ++c) any |= !((label.failed >> map.member(g, c)) & 1);
    if (!any) {
      *error = "every copy of stripe group " + std::to_string(g) + " has failed";
      return nullptr;
    }
  }
  return std::unique_ptr<RaidBlockDevice>(
      new RaidBlockDevice(std::move(members), label, map, std::move(log)));
}

std::string RaidBlockDevice::member_name(uint32_t k) const {
  return "member " + std::to_string(k) + " (" + label_.members[k].name + ")";
}

RaidBlockDevice::Stats RaidBlockDevice::stats() const {
  Stats s;
  s.members = map_.members;
  s.stripe_blocks = map_.stripe;
  s.failed = failed_.load();
  s.read_failovers = read_failovers_.load(std::memory_order_relaxed);
  s.split_requests = split_requests_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(const_cast<std::mutex&>(label_mu_));
  s.level = label_.level;
  s.generation = label_.generation;
  return s;
}

std::string RaidBlockDevice::copy_holder(uint64_t block, uint32_t c) const {
  if (c >= map_.copies || block >= block_count()) return "";
  const uint32_t k = map_.member(map_.piece(block, 1).group, c);
  if (!live(k)) return "";
  std::lock_guard<std::mutex> g(const_cast<std::mutex&>(label_mu_));
  return member_name(k);
}

// One copy's pieces in turn, with no failover: a failed member's copy is an error.
Status RaidBlockDevice::read_copy(uint64_t block, uint32_t count, uint32_t c, void* buf) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  if (c >= map_.copies) return Status::error(Code::kInvalidArgument, "RAID: no such copy");
  auto* p = static_cast<uint8_t*>(buf);
  for (uint64_t b = block, left = count; left > 0;) {
    const RaidMap::Piece piece = map_.piece(b, left);
    const uint32_t k = map_.member(piece.group, c);
    if (!live(k)) return Status::error(Code::kIoError, "RAID: that copy's member failed");
    if (Status s = m_[k]->read(map_.data_offset + piece.row, piece.count, p); !s.is_ok()) return s;
    b += piece.count, left -= piece.count, p += uint64_t{piece.count} * bb_;
  }
  return Status::ok();
}

Status RaidBlockDevice::write_copy(uint64_t block, uint32_t count, uint32_t c, const void* buf) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  if (c >= map_.copies) return Status::error(Code::kInvalidArgument, "RAID: no such copy");
  const auto* p = static_cast<const uint8_t*>(buf);
  for (uint64_t b = block, left = count; left > 0;) {
    const RaidMap::Piece piece = map_.piece(b, left);
    const uint32_t k = map_.member(piece.group, c);
    if (!live(k)) return Status::error(Code::kIoError, "RAID: that copy's member failed");
    Status s = m_[k]->write(map_.data_offset + piece.row, piece.count, p);
    st_[k].written.fetch_add(1, std::memory_order_release);  // the next flush reaches it
    if (!s.is_ok()) return s;
    b += piece.count, left -= piece.count, p += uint64_t{piece.count} * bb_;
  }
  return Status::ok();
}

Status RaidBlockDevice::read(uint64_t block, uint32_t count, void* buf) {
  return submit_one(block, count, buf, false);
}

Status RaidBlockDevice::read_uncached(uint64_t block, uint32_t count, void* buf) {
  Io io{block, count, false, static_cast<uint8_t*>(buf), {}};
  run(&io, 1, true);
  return io.status;
}

Status RaidBlockDevice::write(uint64_t block, uint32_t count, const void* buf) {
  return submit_one(block, count, const_cast<void*>(buf), true);
}

uint32_t RaidBlockDevice::next_live_copy(const RaidMap::Piece& piece, uint32_t* j) const {
  const uint32_t start = static_cast<uint32_t>((piece.row / map_.stripe) % map_.copies);
  for (; *j < map_.copies; ++*j) {
    const uint32_t k = map_.member(piece.group, (start + *j) % map_.copies);
    if (live(k)) return k;
  }
  return map_.members;
}

void* RaidBlockDevice::take_bounce(uint32_t k) {
  Bounces& b = bounces_[k];
  {
    std::lock_guard<std::mutex> g(b.mu);
    if (!b.free.empty()) {
      void* p = b.free.back();
      b.free.pop_back();
      return p;
    }
    if (b.made == kBounces) return nullptr;
    ++b.made;
  }
  void* p = nullptr;
  if (m_[k]->alloc_io_buffer(bounce_bytes(), &p).is_ok()) return p;
  std::lock_guard<std::mutex> g(b.mu);
  --b.made;
  return nullptr;
}

void RaidBlockDevice::give_bounce(uint32_t k, void* p) {
  std::lock_guard<std::mutex> g(bounces_[k].mu);
  bounces_[k].free.push_back(p);
}

RaidBlockDevice::Attempt RaidBlockDevice::start_on(uint32_t k, const RaidMap::Piece& piece,
                                                   uint8_t* data) {
  Attempt a;
  uint8_t* into = data;
  if (k != 0) {
    // A bounce holds a stripe, as much as a read's piece covers (run() and
    // read_uncached_start cut a mirrored read at its stripe's end; a striped piece ends there).
    a.bounce = piece.count <= map_.stripe ? take_bounce(k) : nullptr;
    if (a.bounce == nullptr) {  // none left: at once, into the caller's buffer
      a.status = m_[k]->read_uncached(map_.data_offset + piece.row, piece.count, data);
      return a;
    }
    into = static_cast<uint8_t*>(a.bounce);
  }
  a.status = m_[k]->read_uncached_start(map_.data_offset + piece.row, piece.count, into, &a.part);
  return a;
}

Status RaidBlockDevice::end_attempt(uint32_t k, Attempt* a, uint8_t* data, uint32_t count) {
  const Status s = a->part != nullptr ? a->part->status() : a->status;
  a->part.reset();
  if (a->bounce != nullptr) {
    if (s.is_ok()) std::memcpy(data, a->bounce, size_t{count} * bb_);
    give_bounce(k, a->bounce);
    a->bounce = nullptr;
  }
  return s;
}

// One piece's read in flight, on member k_; after an error on a mirror, on the next live copy
// not yet tried (a new attempt started by the polling thread, so that it keeps polling the
// reads it holds rather than wait for one), as run() fails over.
class RaidBlockDevice::PendingPiece final : public BlockDevice::PendingRead {
 public:
  PendingPiece(RaidBlockDevice* dev, const RaidMap::Piece& piece, uint8_t* data, uint32_t k,
               Attempt a)
      : dev_(dev), piece_(piece), data_(data), k_(k), a_(std::move(a)) {}
  ~PendingPiece() override {
    a_.part.reset();  // waits for the member's read
    if (a_.bounce != nullptr) dev_->give_bounce(k_, a_.bounce);
  }
  bool poll() override {
    while (!done_) {
      if (a_.part != nullptr && !a_.part->poll()) return false;
      const Status s = dev_->end_attempt(k_, &a_, data_, piece_.count);
      if (s.is_ok()) {
        if (tried_ != 0) dev_->read_failovers_.fetch_add(1, std::memory_order_relaxed);
        status_ = s;
        done_ = true;
        break;
      }
      if (tried_ == 0) status_ = s;  // the first error is the read's, if no copy serves it
      tried_ |= 1u << k_;
      const uint32_t next = next_copy();
      if (next == dev_->map_.members) {
        done_ = true;
        break;
      }
      k_ = next;
      a_ = dev_->start_on(k_, piece_, data_);
    }
    return true;
  }
  void idle(port::Backoff& b) override {
    if (a_.part != nullptr) a_.part->idle(b);
  }
  Status status() const override { return status_; }

 private:
  // A live copy not tried yet, in read order; map_.members when none is left.
  uint32_t next_copy() const {
    for (uint32_t j = 0;; ++j) {
      const uint32_t k = dev_->next_live_copy(piece_, &j);
      if (k == dev_->map_.members || !((tried_ >> k) & 1)) return k;
    }
  }

  RaidBlockDevice* const dev_;
  const RaidMap::Piece piece_;
  uint8_t* const data_;
  uint32_t k_;          // the member of the attempt under way
  Attempt a_;           // under way until done_
  uint32_t tried_ = 0;  // bit k: member k's copy failed
  bool done_ = false;
  Status status_;
};

Status RaidBlockDevice::read_uncached_start(uint64_t block, uint32_t count, void* buf,
                                            std::unique_ptr<PendingRead>* pending) {
  pending->reset();
  if (Status s = check(block, count); !s.is_ok()) return s;
  // As run() cuts a read: a mirrored piece ends at its stripe's end.
  const uint64_t span =
      map_.copies == 1 ? count : std::min<uint64_t>(count, map_.stripe - block % map_.stripe);
  const RaidMap::Piece piece = map_.piece(block, span);
  if (piece.count != count) return read_uncached(block, count, buf);  // several members
  uint32_t j = 0;
  const uint32_t k = next_live_copy(piece, &j);
  if (k == map_.members) return Status::error(Code::kIoError, "RAID: no live copy of the blocks");
  auto* data = static_cast<uint8_t*>(buf);
  auto r = std::make_unique<PendingPiece>(this, piece, data, k, start_on(k, piece, data));
  if (r->poll()) return r->status();  // ended at once (or failed on every copy)
  *pending = std::move(r);
  return Status::ok();
}

void RaidBlockDevice::for_members(const std::vector<std::function<void()>>& work) {
  std::vector<std::function<void()>> fns;
  for (const auto& w : work)
    if (w) fns.push_back(w);
  if (fns.size() == 1) return fns[0]();
  if (fns.empty()) return;
  split_requests_.fetch_add(1, std::memory_order_relaxed);
  pool_->run(fns.data(), static_cast<int>(fns.size()));
}

Status RaidBlockDevice::fail_members(uint32_t mask, const std::string& why) {
  std::lock_guard<std::mutex> g(label_mu_);
  const uint32_t old = failed_.load();
  uint32_t nf = old | mask;
  if (nf == old) return Status::ok();  // persisted by an earlier call
  std::vector<uint8_t> buf(kLabelBytes);
  for (;;) {
    for (uint32_t grp = 0; grp < map_.groups(); ++grp) {
      bool any = false;
      for (uint32_t c = 0; c < map_.copies; ++c) any |= !((nf >> map_.member(grp, c)) & 1);
      if (!any) return Status::error(Code::kIoError, "RAID: every copy of a stripe failed");
    }
    RaidLabel l = label_;
    l.failed = nf;
    l.flags |= RaidLabel::kDegraded;
    l.generation = label_.generation + 1;
    uint32_t more = 0;
    for (uint32_t k = 0; k < map_.members; ++k) {
      if ((nf >> k) & 1) continue;
      l.position = k;
      l.encode(buf.data());
      Status s = m_[k]->write(0, 1, buf.data());
      if (s.is_ok()) s = m_[k]->flush();
      if (!s.is_ok()) more |= 1u << k;
    }
    label_ = l;  // the generation is used; a retry takes the next
    if (more == 0) break;
    nf |= more;  // a survivor failed its label: it is failed too, and the labels say so again
  }
  failed_.store(nf, std::memory_order_release);
  if (log_) {
    for (uint32_t k = 0; k < map_.members; ++k) {
      if (!(((nf & ~old) >> k) & 1)) continue;
      log_("RAID: " + member_name(k) + " failed (" + why + "); the set is degraded (label " +
           "generation " + std::to_string(label_.generation) + ")");
    }
  }
  return Status::ok();
}

Status RaidBlockDevice::settle(uint32_t bad, const Status& first, const char* what) {
  if (bad == 0) return Status::ok();
  if (map_.copies == 1) return first;
  return fail_members(bad, std::string(what) + " failed: " + first.to_string());
}

void RaidBlockDevice::submit(Io* ios, int n) {
  run(ios, n, false);
}

void RaidBlockDevice::run(Io* ios, int n, bool uncached) {
  struct Piece {
    int io;
    uint32_t group, count;
    uint64_t row;
    uint8_t* data;
    int landed = 0, failed = 0;
    Status err;
  };
  std::vector<Piece> pieces;
  const uint32_t nm = map_.members;
  std::vector<std::vector<Io>> batch(nm);
  std::vector<std::vector<size_t>> of(nm);  // batch entry -> piece
  for (int i = 0; i < n; ++i) {
    Io& io = ios[i];
    io.status = check(io.block, io.count);
    if (!io.status.is_ok()) continue;
    uint64_t b = io.block, left = io.count;
    uint8_t* data = io.data;
    while (left > 0) {
      // A mirrored read stops at the stripe's end, so that the stripes of a long read go to
      // the copies in turn (a RAID 1 piece would otherwise run to the transfer's end, and a
      // 1 MiB read, eight stripes from a multiple of eight, would always land on copy 0).
      const uint64_t span = io.write || map_.copies == 1
                                ? left
                                : std::min<uint64_t>(left, map_.stripe - b % map_.stripe);
      const RaidMap::Piece p = map_.piece(b, span);
      pieces.push_back(Piece{i, p.group, p.count, p.row, data});
      const size_t pi = pieces.size() - 1;
      const Io part{map_.data_offset + p.row, p.count, io.write, data, {}, io.priority};
      // A write goes to every live copy, a read to the first (next_live_copy).
      for (uint32_t j = 0;; ++j) {
        const uint32_t k = next_live_copy(p, &j);
        if (k == map_.members) break;
        batch[k].push_back(part);
        of[k].push_back(pi);
        if (!io.write) break;
      }
      b += p.count, left -= p.count, data += uint64_t{p.count} * bb_;
    }
  }
  // One member's transfers: one submit, or (uncached) its reads one after another.
  auto transfer = [this, uncached](uint32_t k, Io* at, size_t count) {
    if (!uncached) return m_[k]->submit(at, static_cast<int>(count));
    for (size_t j = 0; j < count; ++j)
      at[j].status = m_[k]->read_uncached(at[j].block, at[j].count, at[j].data);
  };
  std::vector<std::function<void()>> work(nm);
  for (uint32_t k = 0; k < nm; ++k) {
    if (!batch[k].empty())
      work[k] = [&transfer, k, &batch] { transfer(k, batch[k].data(), batch[k].size()); };
  }
  for_members(work);
  uint32_t bad = 0;  // members whose write failed while another copy took it
  std::vector<std::pair<size_t, uint32_t>> retry;  // reads to serve from another copy
  for (uint32_t k = 0; k < nm; ++k) {
    bool wrote = false;
    for (size_t j = 0; j < batch[k].size(); ++j) {
      Piece& p = pieces[of[k][j]];
      const Status& s = batch[k][j].status;
      if (s.is_ok()) {
        ++p.landed;
        wrote |= batch[k][j].write;
        continue;
      }
      ++p.failed;
      if (p.err.is_ok()) p.err = s;
      if (batch[k][j].write) {
        bad |= 1u << k;
      } else {
        retry.emplace_back(of[k][j], k);
      }
    }
    if (wrote) st_[k].written.fetch_add(1, std::memory_order_release);
  }
  for (const auto& [pi, failed_on] : retry) {
    Piece& p = pieces[pi];
    for (uint32_t c = 0; c < map_.copies && p.landed == 0; ++c) {
      const uint32_t k = map_.member(p.group, c);
      if (k == failed_on || !live(k)) continue;
      Io one{map_.data_offset + p.row, p.count, false, p.data, {}, ios[p.io].priority};
      transfer(k, &one, 1);
      if (one.status.is_ok()) {
        ++p.landed;
        read_failovers_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  // A member whose write failed is failed (labels first) when every piece it missed landed
  // on another copy; a piece no copy took is its transfer's error.
  uint32_t needed = 0;
  if (bad != 0 && map_.copies > 1) {
    for (uint32_t k = 0; k < nm; ++k) {
      if (!((bad >> k) & 1)) continue;
      for (size_t j = 0; j < batch[k].size(); ++j)
        if (!batch[k][j].status.is_ok() && pieces[of[k][j]].landed > 0) needed |= 1u << k;
    }
  }
  const Status fm = needed ? fail_members(needed, "a write failed") : Status::ok();
  for (Piece& p : pieces) {
    Io& io = ios[p.io];
    if (!io.status.is_ok()) continue;
    if (p.landed == 0 && p.err.is_ok())
      p.err = Status::error(Code::kIoError, "RAID: no live copy of the blocks");
    if (p.landed == 0 || (io.write && p.failed > 0 && map_.copies == 1)) {
      io.status = p.err;
    } else if (p.failed > 0 && io.write && !fm.is_ok()) {
      io.status = fm;
    }
  }
}

// The member ranges of logical ranges: each group's rows of a range are one run.
Status RaidBlockDevice::write_back(const Range* ranges, size_t n) {
  const uint32_t nm = map_.members;
  std::vector<std::vector<Range>> per(nm);
  for (size_t i = 0; i < n; ++i) {
    if (Status s = check(ranges[i].block, ranges[i].count); !s.is_ok()) return s;
    const uint64_t b = ranges[i].block, e = b + ranges[i].count;
    for (uint32_t g = 0; g < map_.groups(); ++g) {
      const uint64_t lo = map_.rows_below(g, b), hi = map_.rows_below(g, e);
      if (hi == lo) continue;
      for (uint32_t c = 0; c < map_.copies; ++c) {
        const uint32_t k = map_.member(g, c);
        if (live(k)) per[k].push_back(Range{map_.data_offset + lo, hi - lo});
      }
    }
  }
  std::vector<Status> res(nm);
  std::vector<std::function<void()>> work(nm);
  for (uint32_t k = 0; k < nm; ++k) {
    if (!per[k].empty())
      work[k] = [&, k] { res[k] = m_[k]->write_back(per[k].data(), per[k].size()); };
  }
  for_members(work);
  uint32_t bad = 0;
  Status first;
  for (uint32_t k = 0; k < nm; ++k) {
    if (!work[k]) continue;
    st_[k].written.fetch_add(1, std::memory_order_release);  // it may have reached the device
    if (!res[k].is_ok()) {
      bad |= 1u << k;
      if (first.is_ok()) first = res[k];
    }
  }
  return settle(bad, first, "write-back");
}

Status RaidBlockDevice::trim(uint64_t block, uint64_t count) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  const uint32_t nm = map_.members;
  std::vector<Status> res(nm);
  std::vector<std::function<void()>> work(nm);
  for (uint32_t g = 0; g < map_.groups(); ++g) {
    const uint64_t lo = map_.rows_below(g, block), hi = map_.rows_below(g, block + count);
    if (hi == lo) continue;
    for (uint32_t c = 0; c < map_.copies; ++c) {
      const uint32_t k = map_.member(g, c);
      if (live(k))
        work[k] = [&, k, lo, hi] { res[k] = m_[k]->trim(map_.data_offset + lo, hi - lo); };
    }
  }
  for_members(work);
  uint32_t bad = 0;
  Status first;
  for (uint32_t k = 0; k < nm; ++k) {
    if (!work[k]) continue;
    st_[k].written.fetch_add(1, std::memory_order_release);
    if (!res[k].is_ok()) {
      bad |= 1u << k;
      if (first.is_ok()) first = res[k];
    }
  }
  return settle(bad, first, "trim");
}

// Every live member that took a write since its last flush began; each in parallel.
Status RaidBlockDevice::flush_members(bool device_only) {
  const uint32_t nm = map_.members;
  std::vector<Status> res(nm);
  std::vector<uint64_t> w(nm);
  std::vector<std::function<void()>> work(nm);
  for (uint32_t k = 0; k < nm; ++k) {
    if (!live(k)) continue;
    w[k] = st_[k].written.load(std::memory_order_acquire);
    const auto& done = device_only ? st_[k].flushed_device : st_[k].flushed;
    if (w[k] == done.load(std::memory_order_acquire)) continue;
    work[k] = [&, k] { res[k] = device_only ? m_[k]->flush_device() : m_[k]->flush(); };
  }
  for_members(work);
  uint32_t bad = 0;
  Status first;
  auto raise = [](std::atomic<uint64_t>& a, uint64_t v) {
    uint64_t cur = a.load();
    while (cur < v && !a.compare_exchange_weak(cur, v)) {
    }
  };
  for (uint32_t k = 0; k < nm; ++k) {
    if (!work[k]) continue;
    if (res[k].is_ok()) {
      raise(st_[k].flushed_device, w[k]);
      if (!device_only) raise(st_[k].flushed, w[k]);
    } else {
      bad |= 1u << k;
      if (first.is_ok()) first = res[k];
    }
  }
  return settle(bad, first, "flush");
}

}  // namespace warpfs::blockdev
