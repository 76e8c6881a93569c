// RAID 0, 1 and 10 (raid.h): the label, the stripe map's arithmetic at its boundaries, the
// assembly checks, and the device over RAM members that fail on demand: parallel parts,
// first error, mirror failover, degraded labels, flushes that reach the members written.
#include "warpfs/blockdev/raid.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "blockdev/mem_device.h"

namespace warpfs::blockdev::test {
namespace {

constexpr uint32_t kBB = 4096;

void fill(uint8_t* p, uint64_t block, uint64_t gen) {
  auto* w = reinterpret_cast<uint64_t*>(p);
  for (uint32_t i = 0; i < kBB / 8; ++i) w[i] = (block << 24) ^ (gen << 48) ^ i;
}
bool is(const uint8_t* p, uint64_t block, uint64_t gen) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  for (uint32_t i = 0; i < kBB / 8; ++i)
    if (w[i] != ((block << 24) ^ (gen << 48) ^ i)) return false;
  return true;
}

RaidLabel make_label(uint32_t level, uint32_t members, uint32_t stripe, uint64_t member_blocks) {
  RaidLabel l;
  l.level = level;
  l.member_count = members;
  l.stripe_blocks = stripe;
  l.member_blocks = member_blocks;
  for (int i = 0; i < 16; ++i) l.set_uuid[i] = static_cast<uint8_t>(0xa0 + i);
  for (uint32_t k = 0; k < members && k < RaidLabel::kMaxMembers; ++k) {
    l.members[k].kind = RaidIdentity::kGenerated;
    l.members[k].id[0] = static_cast<uint8_t>(k + 1);
    l.members[k].blocks = member_blocks + l.data_offset;
    l.members[k].name = "m" + std::to_string(k);
  }
  return l;
}

// A set of RAM members with their labels written, and the RAID device over them.
struct Set {
  std::vector<std::unique_ptr<MemDevice>> mem;
  std::unique_ptr<RaidBlockDevice> dev;
  std::vector<std::string> log;
  std::mutex log_mu;

  static std::unique_ptr<Set> make(uint32_t level, uint32_t members, uint32_t stripe = 4,
                                   uint64_t member_blocks = 256) {
    auto s = std::make_unique<Set>();
    RaidLabel l = make_label(level, members, stripe, member_blocks);
    std::vector<BlockDevice*> m;
    for (uint32_t k = 0; k < members; ++k) {
      s->mem.push_back(std::make_unique<MemDevice>(l.data_offset + member_blocks));
      m.push_back(s->mem[k].get());
    }
    std::string err;
    EXPECT_TRUE(write_member_labels(m, l, &err).is_ok()) << err;
    for (auto& d : s->mem) d->writes = 0, d->flushes = 0;  // the tests count from here
    Set* raw = s.get();
    s->dev = RaidBlockDevice::create(
        m, l,
        [raw](const std::string& line) {
          std::lock_guard<std::mutex> g(raw->log_mu);
          raw->log.push_back(line);
        },
        &err);
    EXPECT_TRUE(s->dev) << err;
    return s->dev ? std::move(s) : nullptr;
  }
  // make() with a stripe of 4 blocks and 256 a member, every block then written with
  // fill(gen), which *w holds.
  static std::unique_ptr<Set> make_filled(uint32_t level, uint32_t members, uint64_t gen,
                                          std::vector<uint8_t>* w) {
    auto s = make(level, members, 4, 256);
    if (!s) return nullptr;
    const uint64_t n = s->dev->block_count();
    w->assign(n * kBB, 0);
    for (uint64_t b = 0; b < n; ++b) fill(w->data() + b * kBB, b, gen);
    const Status st = s->dev->write(0, static_cast<uint32_t>(n), w->data());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return st.is_ok() ? std::move(s) : nullptr;
  }
  RaidLabel label_of(uint32_t k) {
    RaidLabel l;
    std::string why;
    EXPECT_TRUE(RaidLabel::decode(mem[k]->at(0), &l, &why)) << why;
    return l;
  }
};

TEST(RaidLabel, RoundTripsAndItsChecksumCatchesOneFlippedByte) {
  RaidLabel l = make_label(10, 4, 32, 1024);
  l.position = 2;
  l.members[3].kind = RaidIdentity::kNguid;
  l.members[3].name = std::string(200, 'x');  // kept to 95 bytes
  std::vector<uint8_t> b(kBB);
  l.encode(b.data());
  RaidLabel d;
  std::string why;
  ASSERT_TRUE(RaidLabel::decode(b.data(), &d, &why)) << why;
  EXPECT_EQ(d.level, 10u);
  EXPECT_EQ(d.position, 2u);
  EXPECT_EQ(d.member_blocks, 1024u);
  EXPECT_EQ(d.uuid_text(), l.uuid_text());
  EXPECT_EQ(d.members[3].kind, RaidIdentity::kNguid);
  EXPECT_EQ(d.members[3].name, std::string(95, 'x'));
  EXPECT_TRUE(d.members[1].same_id(l.members[1]));
  b[44] ^= 1;  // flags
  EXPECT_FALSE(RaidLabel::decode(b.data(), &d, &why));
  EXPECT_NE(why.find("checksum"), std::string::npos) << why;
  EXPECT_TRUE(RaidLabel::has_magic(b.data()));
  std::vector<uint8_t> zero(kBB);
  EXPECT_FALSE(RaidLabel::decode(zero.data(), &d, &why));
  EXPECT_NE(why.find("no RAID member label"), std::string::npos);
  // Geometry a set cannot have is refused even with a good checksum.
  for (auto bad :
       {make_label(10, 3, 32, 1024), make_label(5, 2, 32, 1024), make_label(0, 2, 24, 1024),
        make_label(1, 2, 32, 1000), make_label(1, 17, 32, 1024)}) {
    bad.encode(b.data());
    EXPECT_FALSE(RaidLabel::decode(b.data(), &d, &why)) << bad.level << " " << bad.member_count;
  }
}

// Every logical block lands on exactly one row of one group, pieces never cross a stripe
// boundary between groups, and rows_below agrees with the block-by-block map.
TEST(RaidMap, MapsEveryBlockOnceAndRowsBelowCountsThem) {
  for (auto [level, members] : std::vector<std::pair<uint32_t, uint32_t>>{
           {0, 2}, {0, 3}, {1, 2}, {1, 3}, {10, 4}, {10, 6}}) {
    for (uint32_t stripe : {1u, 4u, 32u}) {
      RaidLabel l = make_label(level, members, stripe, stripe * 8);
      const RaidMap m = RaidMap::of(l);
      ASSERT_EQ(m.block_count(), uint64_t{m.groups()} * stripe * 8);
      std::set<std::pair<uint32_t, uint64_t>> seen;
      std::vector<std::pair<uint32_t, uint64_t>> where(m.block_count());
      for (uint64_t b = 0; b < m.block_count(); ++b) {
        const RaidMap::Piece p = m.piece(b, 1);
        ASSERT_EQ(p.count, 1u);
        ASSERT_LT(p.group, m.groups());
        ASSERT_LT(p.row, m.member_blocks);
        ASSERT_TRUE(seen.insert({p.group, p.row}).second) << "block " << b << " mapped twice";
        where[b] = {p.group, p.row};
      }
      // Pieces of longer runs agree with single blocks and stop where the group changes.
      std::mt19937_64 rng(level * 100 + members * 10 + stripe);
      for (int t = 0; t < 200; ++t) {
        const uint64_t b = rng() % m.block_count();
        const uint64_t n = 1 + rng() % (m.block_count() - b);
        const RaidMap::Piece p = m.piece(b, n);
        ASSERT_GE(p.count, 1u);
        ASSERT_LE(p.count, n);
        for (uint32_t i = 0; i < p.count; ++i)
          ASSERT_EQ(where[b + i], std::make_pair(p.group, p.row + i));
        if (p.count < n) {
          ASSERT_NE(where[b + p.count], std::make_pair(p.group, p.row + p.count));
        }
        const uint64_t e = b + n;
        for (uint32_t g = 0; g < m.groups(); ++g) {
          uint64_t want = 0, lo = UINT64_MAX;
          for (uint64_t x = b; x < e; ++x) {
            if (where[x].first != g) continue;
            ++want;
            lo = std::min(lo, where[x].second);
          }
          const uint64_t r0 = m.rows_below(g, b), r1 = m.rows_below(g, e);
          ASSERT_EQ(r1 - r0, want) << "group " << g << " of [" << b << ", " << e << ")";
          if (want) {
            ASSERT_EQ(r0, lo);  // one contiguous run from the first row
          }
        }
      }
    }
  }
  // The boundaries by hand: RAID 0, 2 members, stripes of 4.
  const RaidMap m = RaidMap::of(make_label(0, 2, 4, 16));
  RaidMap::Piece p = m.piece(2, 10);  // 2,3 on group 0 rows 2,3
  EXPECT_EQ(p.group, 0u);
  EXPECT_EQ(p.row, 2u);
  EXPECT_EQ(p.count, 2u);
  p = m.piece(4, 4);  // exactly stripe 1: group 1 rows 0..3
  EXPECT_EQ(p.group, 1u);
  EXPECT_EQ(p.row, 0u);
  EXPECT_EQ(p.count, 4u);
  p = m.piece(8, 9);  // stripe 2: group 0 rows 4..7
  EXPECT_EQ(p.group, 0u);
  EXPECT_EQ(p.row, 4u);
  EXPECT_EQ(p.count, 4u);
  // RAID 1 is one group: a whole transfer is one piece.
  const RaidMap one = RaidMap::of(make_label(1, 2, 4, 16));
  p = one.piece(3, 13);
  EXPECT_EQ(p.row, 3u);
  EXPECT_EQ(p.count, 13u);
}

std::vector<RaidMemberSeen> seen_of(uint32_t level, uint32_t members) {
  RaidLabel l = make_label(level, members, 32, 1024);
  std::vector<RaidMemberSeen> s(members);
  for (uint32_t k = 0; k < members; ++k) {
    s[k].name = "emu:/img" + std::to_string(k);
    s[k].has_label = true;
    s[k].label = l;
    s[k].label.position = k;
  }
  return s;
}

TEST(RaidAssembly, RefusesWrongOrderForeignMissingAndCopiedMembersNamingWhich) {
  RaidLabel newest;
  std::string err;
  auto s = seen_of(1, 3);
  s[1].label.generation = 5;
  s[1].label.failed = 4;
  ASSERT_TRUE(check_raid_set(s, &newest, &err)) << err;
  EXPECT_EQ(newest.generation, 5u);  // the newest label's failed set wins
  EXPECT_EQ(newest.failed, 4u);

  s = seen_of(0, 3);
  std::swap(s[0], s[2]);
  EXPECT_FALSE(check_raid_set(s, &newest, &err));
  EXPECT_NE(err.find("emu:/img2 is member 2"), std::string::npos) << err;
  EXPECT_NE(err.find("given as member 0"), std::string::npos) << err;
  EXPECT_NE(err.find("order emu:/img0,emu:/img1,emu:/img2"), std::string::npos) << err;

  s = seen_of(0, 3);
  s[1].label.set_uuid[0] ^= 1;
  s[1].name = "emu:/other";
  EXPECT_FALSE(check_raid_set(s, &newest, &err));
  EXPECT_NE(err.find("emu:/other is a member of another RAID set"), std::string::npos) << err;

  s = seen_of(10, 4);
  s.pop_back();
  EXPECT_FALSE(check_raid_set(s, &newest, &err));
  EXPECT_NE(err.find("member 3 of RAID set"), std::string::npos) << err;
  EXPECT_NE(err.find("(m3, generated id 04"), std::string::npos) << err;
  EXPECT_NE(err.find("is missing: 3 of 4"), std::string::npos) << err;

  s = seen_of(1, 2);
  s[1] = s[0];
  s[1].name = "emu:/copy";
  EXPECT_FALSE(check_raid_set(s, &newest, &err));
  EXPECT_NE(err.find("emu:/img0 and emu:/copy are both member 0"), std::string::npos) << err;

  s = seen_of(1, 2);
  s[1].has_label = false;
  s[1].label_problem = "no RAID member label (block 0 is something else)";
  EXPECT_FALSE(check_raid_set(s, &newest, &err));
  EXPECT_NE(err.find("emu:/img1 (given as member 1): not a member"), std::string::npos) << err;
  EXPECT_NE(err.find("--resync"), std::string::npos) << err;

  // A position that records an NVMe identity takes only that device.
  s = seen_of(1, 2);
  for (auto& m : s) {
    m.label.members[1].kind = RaidIdentity::kNguid;
    m.label.members[1].id[15] = 0x77;
  }
  s[1].identity = s[1].label.members[1];
  s[1].identity.id[15] = 0x78;
  EXPECT_FALSE(check_raid_set(s, &newest, &err));
  EXPECT_NE(err.find("emu:/img1 is not the device recorded as member 1"), std::string::npos) << err;
  s[1].identity.id[15] = 0x77;
  EXPECT_TRUE(check_raid_set(s, &newest, &err)) << err;
}

// Writes land where the map says, on every copy; reads and writes across stripe boundaries
// round-trip; trims reach the members' rows.
TEST(RaidBlockDevice, StripesAndMirrorsLandWhereTheMapSays) {
  for (auto [level, members] :
       std::vector<std::pair<uint32_t, uint32_t>>{{0, 2}, {0, 3}, {1, 2}, {10, 4}}) {
    auto s = Set::make(level, members);
    ASSERT_TRUE(s);
    BlockDevice& d = *s->dev;
    const RaidMap& m = s->dev->map();
    ASSERT_EQ(d.block_count(), m.block_count());
    std::vector<uint8_t> w(d.block_count() * kBB), r(w.size());
    for (uint64_t b = 0; b < d.block_count(); ++b) fill(w.data() + b * kBB, b, 1);
    ASSERT_TRUE(d.write(0, static_cast<uint32_t>(d.block_count()), w.data()).is_ok());
    for (uint64_t b = 0; b < d.block_count(); ++b) {
      const RaidMap::Piece p = m.piece(b, 1);
      for (uint32_t c = 0; c < m.copies; ++c)
        ASSERT_TRUE(is(s->mem[m.member(p.group, c)]->at(m.data_offset + p.row), b, 1))
            << "level " << level << " block " << b << " copy " << c;
    }
    ASSERT_TRUE(d.read(3, 37, r.data()).is_ok());  // starts and ends inside stripes
    EXPECT_EQ(0, std::memcmp(r.data(), w.data() + 3 * kBB, 37 * kBB));
    EXPECT_EQ(d.read(d.block_count() - 1, 2, r.data()).code(), Code::kInvalidArgument);
    ASSERT_TRUE(d.trim(5, 9).is_ok());
    ASSERT_TRUE(d.read(0, 20, r.data()).is_ok());
    for (uint64_t b = 0; b < 20; ++b) {
      const bool zero = b >= 5 && b < 14;
      EXPECT_EQ(zero, std::count(r.data() + b * kBB, r.data() + (b + 1) * kBB, 0) == kBB)
          << "level " << level << " block " << b;
      if (!zero) {
        EXPECT_TRUE(is(r.data() + b * kBB, b, 1));
      }
    }
    // The labels are untouched: the members' block 0 is not the set's.
    for (uint32_t k = 0; k < members; ++k) EXPECT_EQ(s->label_of(k).position, k);
  }
}

// A request over several members runs its parts at once: each member's write waits until
// every member has one in progress (it would time out, failing, if they ran in turn).
TEST(RaidBlockDevice, PartsOfOneRequestRunInParallel) {
  auto s = Set::make(0, 3);
  ASSERT_TRUE(s);
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0;
  bool timed_out = false;
  for (auto& m : s->mem) {
    m->gate = [&] {
      std::unique_lock<std::mutex> g(mu);
      ++inside;
      cv.notify_all();
      if (!cv.wait_for(g, std::chrono::seconds(20), [&] { return inside >= 3; })) timed_out = true;
    };
  }
  std::vector<uint8_t> w(12 * kBB);  // stripes of 4: one part on each of the 3 members
  for (uint64_t b = 0; b < 12; ++b) fill(w.data() + b * kBB, b, 2);
  ASSERT_TRUE(s->dev->write(0, 12, w.data()).is_ok());
  EXPECT_FALSE(timed_out);
  EXPECT_EQ(s->dev->stats().split_requests, 1u);
  for (auto& m : s->mem) m->gate = nullptr;
}

// Several threads at once over each level, each on its own blocks, against the contents it
// wrote; with vectored submits of several transfers.
TEST(RaidBlockDevice, ThreadsAtOnceReadTheirOwnWrites) {
  for (auto [level, members] :
       std::vector<std::pair<uint32_t, uint32_t>>{{0, 2}, {1, 2}, {10, 4}, {0, 4}}) {
    auto s = Set::make(level, members, 4, 512);
    ASSERT_TRUE(s);
    constexpr int kThreads = 6;
    const uint64_t per = s->dev->block_count() / kThreads;
    std::atomic<int> bad{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        std::mt19937_64 rng(t + level * 7);
        const uint64_t base = per * t;
        std::vector<uint64_t> gen(per, 0);
        std::vector<uint8_t> buf(2 * 20 * kBB), rd(20 * kBB);
        for (int i = 0; i < 300; ++i) {
          // Two transfers in one submit, within this thread's blocks.
          const uint32_t n1 = 1 + rng() % 10, n2 = 1 + rng() % 10;
          const uint64_t b1 = rng() % (per - n1), b2 = rng() % (per - n2);
          const bool overlap = b1 < b2 + n2 && b2 < b1 + n1;
          for (uint32_t j = 0; j < n1; ++j) fill(buf.data() + j * kBB, base + b1 + j, i + 1);
          for (uint32_t j = 0; j < n2; ++j) fill(buf.data() + (10 + j) * kBB, base + b2 + j, i + 1);
          BlockDevice::Io ios[2] = {
              {base + b1, n1, true, buf.data(), {}},
              {base + b2, overlap ? 0u : n2, true, buf.data() + 10 * kBB, {}}};
          s->dev->submit(ios, overlap ? 1 : 2);
          if (!ios[0].status.is_ok() || (!overlap && !ios[1].status.is_ok())) ++bad;
          for (uint32_t j = 0; j < n1; ++j) gen[b1 + j] = i + 1;
          if (!overlap)
            for (uint32_t j = 0; j < n2; ++j) gen[b2 + j] = i + 1;
          const uint32_t rn = 1 + rng() % 20;
          const uint64_t rb = rng() % (per - rn);
          if (!s->dev->read(base + rb, rn, rd.data()).is_ok()) ++bad;
          for (uint32_t j = 0; j < rn; ++j) {
            const uint64_t g = gen[rb + j];
            if (g && !is(rd.data() + j * kBB, base + rb + j, g)) ++bad;
          }
          if (i % 50 == 0 && !s->dev->flush().is_ok()) ++bad;
        }
      });
    }
    for (auto& t : ts) t.join();
    EXPECT_EQ(bad.load(), 0) << "level " << level;
  }
}

TEST(RaidBlockDevice, MirroredReadFailsOverAndCountsIt) {
  for (auto [level, members] : std::vector<std::pair<uint32_t, uint32_t>>{{1, 2}, {10, 4}}) {
    auto s = Set::make(level, members);
    ASSERT_TRUE(s);
    const uint64_t n = s->dev->block_count();
    std::vector<uint8_t> w(n * kBB), r(n * kBB);
    for (uint64_t b = 0; b < n; ++b) fill(w.data() + b * kBB, b, 3);
    ASSERT_TRUE(s->dev->write(0, static_cast<uint32_t>(n), w.data()).is_ok());
    // Member 0 cannot read any of its data; member 1 (its mirror) can.
    s->mem[0]->bad_read_begin = 0;
    s->mem[0]->bad_read_end = UINT64_MAX;
    ASSERT_TRUE(s->dev->read(0, static_cast<uint32_t>(n), r.data()).is_ok());
    EXPECT_EQ(w, r);
    EXPECT_GT(s->dev->stats().read_failovers, 0u);
    EXPECT_EQ(s->dev->stats().failed, 0u);  // a read error alone fails no member
    // With both copies unreadable the read fails.
    s->mem[1]->bad_read_end = UINT64_MAX;
    EXPECT_FALSE(s->dev->read(0, 8, r.data()).is_ok());
  }
}

// An uncached read (O_DIRECT) reaches every member it needs through that member's
// read_uncached, never its plain read (a member's cache takes no line), with the copies
// spread and the failover of read(); from several threads at once.
TEST(RaidBlockDevice, UncachedReadsGoToTheMembersUncachedWithFailover) {
  for (auto [level, members] :
       std::vector<std::pair<uint32_t, uint32_t>>{{0, 2}, {1, 2}, {10, 4}}) {
    SCOPED_TRACE("RAID " + std::to_string(level));
    std::vector<uint8_t> w;
    auto s = Set::make_filled(level, members, 5, &w);
    ASSERT_TRUE(s);
    const uint64_t n = s->dev->block_count();
    std::vector<uint64_t> r0, u0;
    for (auto& m : s->mem) r0.push_back(m->reads.load()), u0.push_back(m->uncached_reads.load());
    std::vector<uint8_t> r(32 * kBB);
    ASSERT_TRUE(s->dev->read_uncached(2, 30, r.data()).is_ok());  // 8 stripes, 2 partial
    EXPECT_EQ(0, std::memcmp(r.data(), w.data() + 2 * kBB, 30 * kBB));
    uint64_t pieces = 0;
    for (size_t k = 0; k < s->mem.size(); ++k) {
      const uint64_t u = s->mem[k]->uncached_reads.load() - u0[k];
      EXPECT_EQ(s->mem[k]->reads.load() - r0[k], u) << "member " << k << " read past its cache";
      if (level != 0) {
        EXPECT_GT(u, 0u) << "member " << k << " took none of the stripes";
      }
      pieces += u;
    }
    EXPECT_EQ(pieces, 8u);
    std::vector<std::thread> ts;
    std::atomic<int> bad{0};
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        std::vector<uint8_t> x(9 * kBB);
        for (uint64_t k = 0; k < 60; ++k) {
          const uint64_t at = (static_cast<uint64_t>(t) * 61 + k * 7) % (n - 9);
          if (!s->dev->read_uncached(at, 9, x.data()).is_ok() ||
              std::memcmp(x.data(), w.data() + at * kBB, 9 * kBB) != 0)
            ++bad;
        }
      });
    for (auto& t : ts) t.join();
    EXPECT_EQ(bad.load(), 0);
    // Member 0 cannot read: a mirror serves its stripes from the other copy; RAID 0 fails.
    s->mem[0]->bad_read_begin = 0;
    s->mem[0]->bad_read_end = UINT64_MAX;
    const uint64_t f0 = s->dev->stats().read_failovers;
    const Status st = s->dev->read_uncached(0, 32, r.data());
    if (level == 0) {
      EXPECT_FALSE(st.is_ok());
    } else {
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_EQ(0, std::memcmp(r.data(), w.data(), 32 * kBB));
      EXPECT_GT(s->dev->stats().read_failovers, f0);
      EXPECT_EQ(s->dev->stats().failed, 0u);  // a read error alone fails no member
    }
  }
}

// read_uncached_start over a set, into the set's I/O memory (its first member's, as the
// daemon's buffers are): a range on one member's copy stays in flight on that member until
// polled (another member reads into a bounce of its own memory: 32 at most, then at once),
// on the copy read_uncached takes; a mirror's failed piece is started again on the other copy
// by the thread that polls it; a range over several members is read at once.
TEST(RaidBlockDevice, ReadsStartedOnOneMemberStayInFlightAndAMirrorFailsOverAtThePoll) {
  for (auto [level, members] :
       std::vector<std::pair<uint32_t, uint32_t>>{{0, 2}, {1, 2}, {10, 4}}) {
    SCOPED_TRACE("RAID " + std::to_string(level));
    std::vector<uint8_t> w;
    auto s = Set::make_filled(level, members, 7, &w);
    ASSERT_TRUE(s);
    const uint64_t n = s->dev->block_count();
    struct Read {
      uint64_t block;
      uint32_t count;
      uint8_t* buf;
      std::unique_ptr<BlockDevice::PendingRead> p;
    };
    // One- and two-block reads inside a stripe, 24 of them: under 32 a member.
    std::vector<Read> reads;
    for (uint64_t b = 0; reads.size() < 24; b += 5) {
      const uint64_t at = b % (n - 2);
      reads.push_back({at, at % 4 == 3 ? 1u : 2u, nullptr, {}});  // a stripe is 4 blocks
    }
    for (Read& r : reads) {
      void* p = nullptr;
      ASSERT_TRUE(s->dev->alloc_io_buffer(2 * kBB, &p).is_ok());
      r.buf = static_cast<uint8_t*>(p);
    }
    auto start_all = [&] {
      for (auto& m : s->mem) m->hold_started = true;
      for (Read& r : reads) {
        std::memset(r.buf, 0, 2 * kBB);
        ASSERT_TRUE(s->dev->read_uncached_start(r.block, r.count, r.buf, &r.p).is_ok());
        ASSERT_NE(r.p, nullptr) << "block " << r.block;
        EXPECT_FALSE(r.p->poll());
      }
      for (auto& m : s->mem) m->hold_started = false;
    };
    auto poll_all_elsewhere = [&] {  // another thread sees them through, as a reaper does
      std::thread poller([&] {
        for (Read& r : reads) {
          port::Backoff b;
          while (!r.p->poll()) r.p->idle(b);
        }
      });
      poller.join();
    };
    std::vector<uint64_t> started(members);
    for (uint32_t k = 0; k < members; ++k) started[k] = s->mem[k]->started_reads.load();
    start_all();
    poll_all_elsewhere();
    for (uint32_t k = 0; k < members; ++k)
      started[k] = s->mem[k]->started_reads.load() - started[k];
    uint64_t all = 0;
    for (uint64_t c : started) all += c;
    EXPECT_EQ(all, reads.size()) << "every read left in flight on its member";
    for (Read& r : reads) {
      ASSERT_TRUE(r.p->status().is_ok()) << r.p->status().to_string();
      EXPECT_EQ(0, std::memcmp(r.buf, w.data() + r.block * kBB, size_t{r.count} * kBB))
          << "block " << r.block;
    }
    // The copies read_uncached takes for the same reads.
    std::vector<uint64_t> u0(members);
    for (uint32_t k = 0; k < members; ++k) u0[k] = s->mem[k]->uncached_reads.load();
    for (Read& r : reads) ASSERT_TRUE(s->dev->read_uncached(r.block, r.count, r.buf).is_ok());
    for (uint32_t k = 0; k < members; ++k) {
      EXPECT_EQ(s->mem[k]->uncached_reads.load() - u0[k], started[k]) << "member " << k;
    }
    // Over a stripe's end: two members, read at once.
    std::unique_ptr<BlockDevice::PendingRead> none;
    s->mem[0]->hold_started = true;
    s->mem[1]->hold_started = true;
    ASSERT_TRUE(s->dev->read_uncached_start(3, 2, reads[0].buf, &none).is_ok());
    EXPECT_EQ(none, nullptr);
    EXPECT_EQ(0, std::memcmp(reads[0].buf, w.data() + 3 * kBB, 2 * kBB));
    // Member 0 fails every read: RAID 0 reports it, a mirror reads the other copy.
    s->mem[0]->bad_read_begin = 0;
    s->mem[0]->bad_read_end = UINT64_MAX;
    const uint64_t f0 = s->dev->stats().read_failovers;
    start_all();
    poll_all_elsewhere();
    uint64_t failed = 0;
    for (Read& r : reads) {
      if (!r.p->status().is_ok()) {
        ++failed;
        continue;
      }
      EXPECT_EQ(0, std::memcmp(r.buf, w.data() + r.block * kBB, size_t{r.count} * kBB))
          << "block " << r.block;
    }
    ASSERT_GT(started[0], 0u) << "no read went to member 0";
    if (level == 0) {
      EXPECT_EQ(failed, started[0]);  // no other copy
    } else {
      EXPECT_EQ(failed, 0u);
      EXPECT_EQ(s->dev->stats().read_failovers - f0, started[0]);
      EXPECT_EQ(s->dev->stats().failed, 0u);  // a read error alone fails no member
    }
    s->mem[0]->bad_read_end = 0;
    // More reads held on a member other than the first than it has bounces: 32 in flight,
    // the rest read at once.
    std::vector<Read> many;
    for (uint64_t b = 0; b < n && many.size() < 40; ++b) {
      const RaidMap::Piece pc = s->dev->map().piece(b, 1);
      const uint32_t start = static_cast<uint32_t>((pc.row / 4) % s->dev->map().copies);
      if (s->dev->map().member(pc.group, start) == 1) many.push_back({b, 1, nullptr, {}});
    }
    ASSERT_EQ(many.size(), 40u);
    for (auto& m : s->mem) m->hold_started = true;
    uint64_t held = 0;
    for (Read& r : many) {
      void* p = nullptr;
      ASSERT_TRUE(s->dev->alloc_io_buffer(kBB, &p).is_ok());
      r.buf = static_cast<uint8_t*>(p);
      ASSERT_TRUE(s->dev->read_uncached_start(r.block, 1, r.buf, &r.p).is_ok());
      if (r.p != nullptr) {
        ++held;
      } else {
        EXPECT_EQ(0, std::memcmp(r.buf, w.data() + r.block * kBB, kBB)) << "block " << r.block;
      }
    }
    EXPECT_EQ(held, 32u);
    for (auto& m : s->mem) m->hold_started = false;
    for (Read& r : many) {
      if (r.p != nullptr) {
        port::Backoff b;
        while (!r.p->poll()) r.p->idle(b);
        EXPECT_TRUE(r.p->status().is_ok());
        EXPECT_EQ(0, std::memcmp(r.buf, w.data() + r.block * kBB, kBB)) << "block " << r.block;
      }
      r.p.reset();
      s->dev->free_io_buffer(r.buf, kBB);
    }
    for (Read& r : reads) {
      r.p.reset();
      s->dev->free_io_buffer(r.buf, 2 * kBB);
    }
  }
}

// A read of several stripes from a mirror goes to the copies stripe by stripe in turn, from
// several threads at once, and reads back what was written.
TEST(RaidBlockDevice, AMirroredReadOfSeveralStripesSpreadsOverTheCopies) {
  auto s = Set::make(1, 2, 4, 256);
  ASSERT_TRUE(s);
  std::vector<uint8_t> w(32 * kBB);
  for (uint64_t b = 0; b < 32; ++b) fill(w.data() + b * kBB, b, 3);
  ASSERT_TRUE(s->dev->write(0, 32, w.data()).is_ok());
  const uint64_t r0 = s->mem[0]->reads.load(), r1 = s->mem[1]->reads.load();
  std::vector<uint8_t> r(32 * kBB);
  ASSERT_TRUE(s->dev->read(0, 32, r.data()).is_ok());  // 8 stripes of 4 blocks
  EXPECT_EQ(r, w);
  EXPECT_EQ(s->mem[0]->reads.load() - r0, 4u);
  EXPECT_EQ(s->mem[1]->reads.load() - r1, 4u);
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::vector<uint8_t> x(30 * kBB);
      for (int k = 0; k < 50; ++k) {
        const uint64_t at = static_cast<uint64_t>(t + k) % 3;
        if (!s->dev->read(at, 29, x.data()).is_ok() ||
            std::memcmp(x.data(), w.data() + at * kBB, 29 * kBB) != 0)
          ++bad;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(RaidBlockDevice, AFailedMirrorWriteDegradesTheSetInTheSurvivorsLabelsFirst) {
  auto s = Set::make(1, 3);
  ASSERT_TRUE(s);
  std::vector<uint8_t> w(8 * kBB), r(8 * kBB);
  for (uint64_t b = 0; b < 8; ++b) fill(w.data() + b * kBB, b, 4);
  s->mem[1]->fail_writes = true;
  // Several threads see the failure at once: one label rewrite, all writes succeed.
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      if (!s->dev->write(t * 16, 8, w.data()).is_ok()) ++bad;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_TRUE(s->dev->member_failed(1));
  EXPECT_EQ(s->dev->stats().generation, 2u);
  for (uint32_t k : {0u, 2u}) {
    const RaidLabel l = s->label_of(k);
    EXPECT_EQ(l.failed, 2u);
    EXPECT_TRUE(l.flags & RaidLabel::kDegraded);
    EXPECT_EQ(l.generation, 2u);
    EXPECT_EQ(l.position, k);
  }
  EXPECT_EQ(s->label_of(1).generation, 1u);  // the failed member's label is not rewritten
  {
    std::lock_guard<std::mutex> g(s->log_mu);
    ASSERT_EQ(s->log.size(), 1u);
    EXPECT_NE(s->log[0].find("member 1 (m1) failed"), std::string::npos) << s->log[0];
  }
  // The failed member takes no more writes; reads come from the survivors.
  const uint64_t before = s->mem[1]->writes.load();
  s->mem[1]->fail_writes = false;
  ASSERT_TRUE(s->dev->write(100, 8, w.data()).is_ok());
  ASSERT_TRUE(s->dev->flush().is_ok());
  EXPECT_EQ(s->mem[1]->writes.load(), before);
  EXPECT_EQ(s->mem[1]->reads.load(), 0u);
  ASSERT_TRUE(s->dev->read(100, 8, r.data()).is_ok());
  EXPECT_EQ(w, r);
  // A set reopened from the survivors' labels keeps the member failed.
  std::vector<RaidMemberSeen> seen(3);
  for (uint32_t k = 0; k < 3; ++k) {
    seen[k].name = "m" + std::to_string(k);
    std::string why;
    seen[k].has_label = RaidLabel::decode(s->mem[k]->at(0), &seen[k].label, &why);
  }
  RaidLabel newest;
  std::string err;
  ASSERT_TRUE(check_raid_set(seen, &newest, &err)) << err;
  EXPECT_EQ(newest.failed, 2u);
  // When the last copy fails too, the write is an error and the labels stay as they were.
  s->mem[0]->fail_writes = true;
  s->mem[2]->fail_writes = true;
  EXPECT_FALSE(s->dev->write(0, 1, w.data()).is_ok());
  EXPECT_EQ(s->dev->stats().failed, 2u);
}

TEST(RaidBlockDevice, Raid0MemberErrorIsTheRequestsFirstError) {
  auto s = Set::make(0, 2);
  ASSERT_TRUE(s);
  std::vector<uint8_t> w(16 * kBB, 1);
  s->mem[1]->fail_writes = true;
  EXPECT_TRUE(s->dev->write(0, 4, w.data()).is_ok());  // member 0 only
  const Status st = s->dev->write(0, 16, w.data());
  EXPECT_EQ(st.code(), Code::kIoError);
  EXPECT_EQ(s->dev->stats().failed, 0u);  // RAID 0 fails no member: it has no copies
  s->mem[1]->dead = true;
  EXPECT_FALSE(s->dev->flush().is_ok());
}

// flush() and flush_device() reach the members written since their last flush, every one of
// them, and no other.
TEST(RaidBlockDevice, FlushReachesTheMembersThatTookWrites) {
  auto s = Set::make(0, 3);
  ASSERT_TRUE(s);
  std::vector<uint8_t> w(4 * kBB, 7);
  ASSERT_TRUE(s->dev->flush().is_ok());  // the first reaches everyone
  for (auto& m : s->mem) EXPECT_EQ(m->flushes.load(), 1u);
  ASSERT_TRUE(s->dev->write(4, 4, w.data()).is_ok());  // stripe 1: member 1
  ASSERT_TRUE(s->dev->flush_device().is_ok());
  EXPECT_EQ(s->mem[0]->flushes.load(), 1u);
  EXPECT_EQ(s->mem[1]->flushes.load(), 2u);
  EXPECT_EQ(s->mem[2]->flushes.load(), 1u);
  // flush() after flush_device(): the member's own cache may still hold the write.
  ASSERT_TRUE(s->dev->flush().is_ok());
  EXPECT_EQ(s->mem[1]->flushes.load(), 3u);
  ASSERT_TRUE(s->dev->flush().is_ok());
  EXPECT_EQ(s->mem[1]->flushes.load(), 3u);
  const BlockDevice::Range r{8, 1};  // stripe 2: member 2
  ASSERT_TRUE(s->dev->write_back(&r, 1).is_ok());
  ASSERT_TRUE(s->dev->flush_device().is_ok());
  EXPECT_EQ(s->mem[2]->flushes.load(), 2u);
  EXPECT_EQ(s->mem[0]->flushes.load(), 1u);
}

// --- resync -------------------------------------------------------------------------------

// The set's members as assembly and resync see them: names, no NVMe identity.
std::vector<RaidMemberSeen> names_of(size_t n) {
  std::vector<RaidMemberSeen> seen(n);
  for (size_t k = 0; k < n; ++k) seen[k].name = "m" + std::to_string(k);
  return seen;
}

std::vector<BlockDevice*> devs_of(const std::vector<std::unique_ptr<MemDevice>>& mem) {
  std::vector<BlockDevice*> d;
  for (const auto& m : mem) d.push_back(m.get());
  return d;
}

// Writes generation `gen` of logical blocks [0, n) through the set, 8 at a time.
void write_all(BlockDevice& d, uint64_t n, uint64_t gen) {
  std::vector<uint8_t> w(8 * kBB);
  for (uint64_t b = 0; b < n; b += 8) {
    for (uint64_t i = 0; i < 8; ++i) fill(w.data() + i * kBB, b + i, gen);
    ASSERT_TRUE(d.write(b, 8, w.data()).is_ok()) << b;
  }
  ASSERT_TRUE(d.flush().is_ok());
}

// Every logical block of `d` holds generation `gen`: "" or the first block that does not.
std::string check_all(BlockDevice& d, uint64_t gen) {
  std::vector<uint8_t> r(kBB);
  for (uint64_t b = 0; b < d.block_count(); ++b) {
    if (!d.read(b, 1, r.data()).is_ok()) return "block " + std::to_string(b) + " unreadable";
    if (!is(r.data(), b, gen))
      return "block " + std::to_string(b) + " is not generation " + std::to_string(gen);
  }
  return "";
}

bool same_data(MemDevice& a, MemDevice& b, uint64_t member_blocks) {
  return std::memcmp(a.at(RaidLabel::kDataOffset), b.at(RaidLabel::kDataOffset),
                     member_blocks * kBB) == 0;
}

// A RAID 1 whose member 1 failed a write and then missed generation 2: resync copies
// member 0 onto it and relabels it current. A cut at every write of the resync (every device
// stops taking anything from that write on) leaves a set that opens degraded with member 1
// unread and generation 2 everywhere, or (a cut after the first final label) one that opens
// whole with member 1 a full copy; a resync after any cut finishes the job.
TEST(RaidResync, RebuildsAFailedMirrorAndEveryCutLeavesASetThatOpensAsBefore) {
  constexpr uint64_t kRows = 1024;  // 4 chunks of the resync's 256 blocks
  auto s = Set::make(1, 2, 4, kRows);
  ASSERT_TRUE(s);
  write_all(*s->dev, kRows, 1);
  s->mem[1]->fail_writes = true;
  write_all(*s->dev, kRows, 2);
  ASSERT_TRUE(s->dev->member_failed(1));
  s->dev.reset();
  s->mem[1]->fail_writes = false;
  // The degraded images, copied for each cut.
  std::vector<std::vector<uint8_t>> image(2);
  for (int k = 0; k < 2; ++k)
    image[k].assign(s->mem[k]->at(0), s->mem[k]->at(0) + (RaidLabel::kDataOffset + kRows) * kBB);
  bool finished = false;
  int opened_degraded = 0, opened_whole = 0;  // after a cut
  for (int cut = 0; !finished; ++cut) {
    ASSERT_LT(cut, 40) << "the resync never finished";
    std::vector<std::unique_ptr<MemDevice>> mem;
    std::atomic<int> writes{0};
    for (int k = 0; k < 2; ++k) {
      mem.push_back(std::make_unique<MemDevice>(RaidLabel::kDataOffset + kRows));
      std::memcpy(mem[k]->at(0), image[k].data(), image[k].size());
    }
    for (auto& m : mem) {
      m->gate = [&] {
        if (writes.fetch_add(1) == cut)
          for (auto& d : mem) d->dead = true;  // the power goes at this write
      };
    }
    RaidResyncReport rep;
    std::string err;
    finished = resync_raid_set(devs_of(mem), names_of(2), nullptr, &rep, &err).is_ok();
    for (auto& m : mem) m->dead = false, m->gate = nullptr;
    if (!finished) {
      EXPECT_NE(err.find("the set stays degraded"), std::string::npos) << err;
    }
    auto d = RaidBlockDevice::assemble(devs_of(mem), names_of(2), nullptr, &err);
    ASSERT_TRUE(d) << "cut " << cut << ": " << err;
    if (d->member_failed(1)) {
      EXPECT_FALSE(finished) << cut;
      ++opened_degraded;
    } else {
      opened_whole += !finished;
      EXPECT_TRUE(same_data(*mem[0], *mem[1], kRows)) << "cut " << cut;
    }
    EXPECT_FALSE(d->member_failed(0)) << cut;
    EXPECT_EQ(check_all(*d, 2), "") << "cut " << cut;
    d.reset();
    if (finished) {
      EXPECT_EQ(rep.rebuilt, 2u);
      EXPECT_EQ(rep.blocks_copied, kRows);
      EXPECT_EQ(rep.generation, 4u);  // 2 (degraded), 3 (resync begun), 4 (whole)
      for (int k = 0; k < 2; ++k) {
        RaidLabel l;
        ASSERT_TRUE(RaidLabel::decode(mem[k]->at(0), &l, &err)) << err;
        EXPECT_EQ(l.failed, 0u);
        EXPECT_FALSE(l.flags & RaidLabel::kDegraded);
        EXPECT_EQ(l.generation, 4u);
        EXPECT_EQ(l.position, uint32_t(k));
      }
    } else {
      // Whatever the cut left, a resync from there completes.
      ASSERT_TRUE(resync_raid_set(devs_of(mem), names_of(2), nullptr, &rep, &err).is_ok()) << err;
      d = RaidBlockDevice::assemble(devs_of(mem), names_of(2), nullptr, &err);
      ASSERT_TRUE(d) << err;
      EXPECT_EQ(d->stats().failed, 0u);
      EXPECT_TRUE(same_data(*mem[0], *mem[1], kRows)) << "cut " << cut;
    }
  }
  // Cuts at the writes up to the target's final label (the survivor's and the target's first
  // labels, the target's label area, four chunks, the target's final label: flushes are no
  // writes) and one at the survivor's final label.
  EXPECT_EQ(opened_degraded, 8);
  EXPECT_EQ(opened_whole, 1);
}

// RAID 10 of four: a blank device in member 2's place is refused by assembly (naming the
// position) and rebuilt by resync from member 3, recorded under its own name; the set is then
// whole and reads every block. Writes while the set is degraded and reads after run from
// several threads.
TEST(RaidResync, ABlankReplacementIsRebuiltFromItsGroupsOtherCopy) {
  constexpr uint64_t kRows = 512;
  auto s = Set::make(10, 4, 4, kRows);
  ASSERT_TRUE(s);
  write_all(*s->dev, 2 * kRows, 1);
  s->mem[2]->dead = true;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::vector<uint8_t> w(8 * kBB);
      for (uint64_t b = t * 8; b < 2 * kRows; b += 32) {
        for (uint64_t i = 0; i < 8; ++i) fill(w.data() + i * kBB, b + i, 2);
        EXPECT_TRUE(s->dev->write(b, 8, w.data()).is_ok()) << b;
      }
    });
  for (auto& t : ts) t.join();
  ASSERT_TRUE(s->dev->member_failed(2));
  s->dev.reset();
  s->mem[2] = std::make_unique<MemDevice>(RaidLabel::kDataOffset + kRows);  // blank
  std::vector<RaidMemberSeen> seen = names_of(4);
  seen[2].name = "new2";
  std::string err;
  EXPECT_FALSE(RaidBlockDevice::assemble(devs_of(s->mem), seen, nullptr, &err));
  EXPECT_NE(err.find("new2 (given as member 2): not a member"), std::string::npos) << err;
  RaidResyncReport rep;
  ASSERT_TRUE(resync_raid_set(devs_of(s->mem), seen, nullptr, &rep, &err).is_ok()) << err;
  EXPECT_EQ(rep.rebuilt, 4u);
  EXPECT_EQ(rep.blocks_copied, kRows);
  EXPECT_TRUE(same_data(*s->mem[2], *s->mem[3], kRows));
  auto d = RaidBlockDevice::assemble(devs_of(s->mem), seen, nullptr, &err);
  ASSERT_TRUE(d) << err;
  EXPECT_EQ(d->stats().failed, 0u);
  RaidLabel l;
  ASSERT_TRUE(RaidLabel::decode(s->mem[0]->at(0), &l, &err)) << err;
  EXPECT_EQ(l.members[2].name, "new2");
  EXPECT_EQ(l.members[2].kind, uint32_t(RaidIdentity::kGenerated));
  std::vector<std::string> bad(4);
  std::vector<std::thread> rs;
  for (int t = 0; t < 4; ++t)
    rs.emplace_back([&, t] {
      std::vector<uint8_t> r(kBB);
      for (uint64_t b = t; b < 2 * kRows && bad[t].empty(); b += 4) {
        if (!d->read(b, 1, r.data()).is_ok() || !is(r.data(), b, 2))
          bad[t] = "block " + std::to_string(b);
      }
    });
  for (auto& t : rs) t.join();
  for (const std::string& b : bad) EXPECT_EQ(b, "");
  // A whole set has nothing to resync: labels untouched.
  d.reset();
  ASSERT_TRUE(resync_raid_set(devs_of(s->mem), seen, nullptr, &rep, &err).is_ok()) << err;
  EXPECT_EQ(rep.rebuilt, 0u);
  EXPECT_EQ(rep.generation, l.generation);
}

TEST(RaidResync, RefusesRaid0ForeignMembersWrongGeometryAndNoSource) {
  RaidResyncReport rep;
  std::string err;
  {  // RAID 0 has no copies.
    auto s = Set::make(0, 2);
    ASSERT_TRUE(s);
    s->dev.reset();
    s->mem[1] = std::make_unique<MemDevice>(RaidLabel::kDataOffset + 256);
    EXPECT_FALSE(resync_raid_set(devs_of(s->mem), names_of(2), nullptr, &rep, &err).is_ok());
    EXPECT_NE(err.find("is RAID 0"), std::string::npos) << err;
  }
  auto s = Set::make(1, 2);
  ASSERT_TRUE(s);
  s->dev.reset();
  {  // A member of another set in member 1's place is not overwritten.
    auto other = Set::make(1, 2);
    ASSERT_TRUE(other);
    other->dev.reset();
    other->mem[1]->at(0)[16] ^= 0x5a;  // another set_uuid
    RaidLabel::seal(other->mem[1]->at(0));
    std::vector<BlockDevice*> d{s->mem[0].get(), other->mem[1].get()};
    const uint64_t w = other->mem[1]->writes.load();
    EXPECT_FALSE(resync_raid_set(d, names_of(2), nullptr, &rep, &err).is_ok());
    EXPECT_NE(err.find("m1 (given as member 1) is a member of another RAID set"), std::string::npos)
        << err;
    EXPECT_EQ(other->mem[1]->writes.load(), w);
  }
  {  // A label of the same set that says another level.
    std::vector<uint8_t> keep(s->mem[1]->at(0), s->mem[1]->at(0) + kBB);
    uint32_t zero = 0;
    std::memcpy(s->mem[1]->at(0) + 12, &zero, 4);
    RaidLabel::seal(s->mem[1]->at(0));
    EXPECT_FALSE(resync_raid_set(devs_of(s->mem), names_of(2), nullptr, &rep, &err).is_ok());
    EXPECT_NE(err.find("m1: its label's geometry (RAID 0)"), std::string::npos) << err;
    std::memcpy(s->mem[1]->at(0), keep.data(), kBB);
  }
  {  // A damaged label is not taken for a blank.
    s->mem[1]->at(0)[100] ^= 1;
    EXPECT_FALSE(resync_raid_set(devs_of(s->mem), names_of(2), nullptr, &rep, &err).is_ok());
    EXPECT_NE(err.find("damaged"), std::string::npos) << err;
    EXPECT_NE(err.find("zero its block 0"), std::string::npos) << err;
    s->mem[1]->at(0)[100] ^= 1;
  }
  {  // Wrong order, a count short, and a replacement too small.
    std::vector<BlockDevice*> d{s->mem[1].get(), s->mem[0].get()};
    EXPECT_FALSE(resync_raid_set(d, names_of(2), nullptr, &rep, &err).is_ok());
    EXPECT_NE(err.find("m0 is member 1"), std::string::npos) << err;
    std::vector<BlockDevice*> one{s->mem[0].get()};
    EXPECT_FALSE(resync_raid_set(one, names_of(1), nullptr, &rep, &err).is_ok());
    MemDevice small(RaidLabel::kDataOffset + 8);
    std::vector<BlockDevice*> sm{s->mem[0].get(), &small};
    EXPECT_FALSE(resync_raid_set(sm, names_of(2), nullptr, &rep, &err, true).is_ok());
    EXPECT_NE(err.find("m1 (member 1): 264 blocks"), std::string::npos) << err;
  }
  {  // RAID 10 with both copies of group 1 blank: nothing to rebuild them from.
    auto t = Set::make(10, 4);
    ASSERT_TRUE(t);
    t->dev.reset();
    for (int k : {2, 3}) t->mem[k] = std::make_unique<MemDevice>(RaidLabel::kDataOffset + 256);
    // Members 2 and 3 are not marked failed: without --replace that is refused first.
    EXPECT_FALSE(resync_raid_set(devs_of(t->mem), names_of(4), nullptr, &rep, &err).is_ok());
    EXPECT_NE(err.find("m2 is blank, but member 2"), std::string::npos) << err;
    EXPECT_NE(err.find("not marked failed"), std::string::npos) << err;
    EXPECT_FALSE(resync_raid_set(devs_of(t->mem), names_of(4), nullptr, &rep, &err, true).is_ok());
    EXPECT_NE(err.find("every copy of stripe group 1 (members 2, 3)"), std::string::npos) << err;
    EXPECT_EQ(t->mem[2]->writes.load(), 0u);
  }
  {  // A device with data but no label (another filesystem, a typo) is not taken for a blank
     // unless --replace says so; the newest label marks member 1 failed here.
    auto t = Set::make(1, 2);
    ASSERT_TRUE(t);
    t->mem[1]->dead = true;
    std::vector<uint8_t> w(kBB);
    fill(w.data(), 0, 3);
    EXPECT_TRUE(t->dev->write(0, 1, w.data()).is_ok());
    ASSERT_TRUE(t->dev->member_failed(1));
    t->dev.reset();
    t->mem[1] = std::make_unique<MemDevice>(RaidLabel::kDataOffset + 256);
    t->mem[1]->at(0)[100] = 0x53;  // not blank
    const uint64_t w0 = t->mem[0]->writes.load();
    EXPECT_FALSE(resync_raid_set(devs_of(t->mem), names_of(2), nullptr, &rep, &err).is_ok());
    EXPECT_NE(err.find("has no RAID label but is not blank"), std::string::npos) << err;
    EXPECT_EQ(t->mem[1]->writes.load(), 0u);
    EXPECT_EQ(t->mem[0]->writes.load(), w0);
    ASSERT_TRUE(resync_raid_set(devs_of(t->mem), names_of(2), nullptr, &rep, &err, true).is_ok())
        << err;
    EXPECT_EQ(rep.rebuilt, 2u);
  }
}

}  // namespace
}  // namespace warpfs::blockdev::test
