// The blocks kept for root (FORMAT.md "Reserved blocks"): file data written for an ordinary
// caller (CallerScope) stops short of them, root's and the reserved user's and group's do
// not, and statfs reports them as not available. Alone and with threads.
#include <fcntl.h>
#include <sys/statvfs.h>

#include <atomic>
#include <thread>
#include <vector>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

constexpr Caller kUser{1000, 1000};

struct Space {
  uint64_t free = 0, avail = 0;
};
Space space(Filesystem& fs) {
  struct statvfs st;
  EXPECT_EQ(fs.statfs(&st), 0);
  return {st.f_bfree, st.f_bavail};
}

Superblock superblock(Rig& r) {
  Superblock sb{};
  EXPECT_TRUE(r.dev->read(0, 1, &sb).is_ok());
  return sb;
}

// Writes 256 KiB pieces to `ino` from `off` until ENOSPC or another error; the bytes written.
uint64_t fill(Rig& r, Ino ino, uint64_t off, int* last_rc) {
  const std::string piece(256 << 10, 'u');
  uint64_t written = 0;
  for (;;) {
    size_t w = 0;
    const int rc = r.fs->write(ino, off + written, piece.size(), piece.data(), &w);
    written += w;
    if (rc != 0 || w < piece.size()) {
      *last_rc = rc ? rc : ENOSPC;
      return written;
    }
  }
}

std::unique_ptr<Rig> rig_with_reserve(double percent, uint32_t resuid = 0, uint32_t resgid = 0) {
  MkfsOptions mo;
  mo.reserved_percent = percent;
  mo.reserved_uid = resuid;
  mo.reserved_gid = resgid;
  return Rig::make(64, mo);
}

TEST(Reserve, MkfsRecordsTheShareOfTheDataBlocks) {
  auto r = rig_with_reserve(10, 1234, 5678);
  ASSERT_TRUE(r);
  Geometry g;
  std::string err;
  ASSERT_TRUE(plan_geometry(r->dev->block_count(), MkfsOptions{}, &g, &err)) << err;
  const Superblock sb = superblock(*r);
  EXPECT_EQ(sb.reserved_blocks, (g.block_count - g.metadata_blocks) / 10);
  EXPECT_EQ(sb.reserved_uid, 1234u);
  EXPECT_EQ(sb.reserved_gid, 5678u);
  // df: free counts them, available does not.
  const Space s = space(*r->fs);
  EXPECT_GE(s.free, s.avail + sb.reserved_blocks);
}

TEST(Reserve, AUserStopsShortOfTheReserveAndRootWritesOn) {
  auto r = rig_with_reserve(10);
  ASSERT_TRUE(r);
  const uint64_t reserved = superblock(*r).reserved_blocks;
  ASSERT_GT(reserved, 1000u);
  const Ino u = r->create(kRootInode, "user");
  int rc = 0;
  {
    CallerScope as(kUser);
    EXPECT_GT(fill(*r, u, 0, &rc), 0u);
    EXPECT_EQ(rc, ENOSPC) << r->log;
    // Nothing more for the user, not even one block, nor through fallocate.
    EXPECT_EQ(r->write(u, 1ull << 40, "x"), ENOSPC);
    const Ino u2 = r->create(kRootInode, "user2");
    EXPECT_EQ(r->fs->fallocate(u2, 0, 0, 1 << 20), ENOSPC);
  }
  const Space s = space(*r->fs);
  EXPECT_EQ(s.avail, 0u) << "df shows nothing left for users";
  EXPECT_GE(s.free, reserved) << "the user took blocks kept for root";
  // Root (no scope, or uid 0) writes into the reserve.
  const Ino root_file = r->create(kRootInode, "root");
  EXPECT_EQ(r->write(root_file, 0, std::string(reserved / 2 * kBlockSize, 'r')), 0) << r->log;
  {
    CallerScope as(Caller{0, 0});
    EXPECT_EQ(r->write(root_file, reserved / 2 * kBlockSize, std::string(64 << 10, 'r')), 0)
        << r->log;
  }
  // Freeing the user's data gives the user room again.
  ASSERT_EQ(r->fs->unlink(kRootInode, "user"), 0);
  r->fs->forget(u, 1);  // the create's reference, as the kernel drops it at eviction
  {
    CallerScope as(kUser);
    EXPECT_EQ(r->write(r->create(kRootInode, "again"), 0, std::string(1 << 20, 'a')), 0) << r->log;
  }
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(superblock(*r).reserved_blocks, reserved) << "kept across a remount";
}

TEST(Reserve, TheReservedUserAndGroupMayUseIt) {
  auto r = rig_with_reserve(10, 2000, 3000);
  ASSERT_TRUE(r);
  int rc = 0;
  {
    CallerScope as(kUser);
    fill(*r, r->create(kRootInode, "user"), 0, &rc);
    ASSERT_EQ(rc, ENOSPC);
  }
  {
    CallerScope as(Caller{2000, 1000});
    EXPECT_EQ(r->write(r->create(kRootInode, "resuid"), 0, std::string(1 << 20, 'u')), 0) << r->log;
  }
  {
    CallerScope as(Caller{1000, 3000});
    EXPECT_EQ(r->write(r->create(kRootInode, "resgid"), 0, std::string(1 << 20, 'g')), 0) << r->log;
  }
  {
    CallerScope as(kUser);
    EXPECT_EQ(r->write(r->create(kRootInode, "user2"), 0, "x"), ENOSPC);
  }
  EXPECT_EQ(r->check_and_remount(), "");
}

// Users' threads racing for the last blocks together stay above the line, while a root
// thread writes beside them; root's data is all there afterwards.
TEST(Reserve, UsersRacingForTheLastBlocksLeaveTheReserve) {
  auto r = rig_with_reserve(10);
  ASSERT_TRUE(r);
  const uint64_t reserved = superblock(*r).reserved_blocks;
  constexpr int kUsers = 6;
  std::vector<Ino> files;
  for (int i = 0; i < kUsers; ++i) files.push_back(r->create(kRootInode, "u" + std::to_string(i)));
  const Ino root_file = r->create(kRootInode, "root");
  std::atomic<int> other{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < kUsers; ++i) {
    ts.emplace_back([&, i] {
      CallerScope as(Caller{1000u + static_cast<uint32_t>(i), 1000});
      int rc = 0;
      fill(*r, files[i], 0, &rc);
      if (rc != ENOSPC) other++;
    });
  }
  const std::string root_piece(64 << 10, 'R');
  const uint64_t root_pieces = reserved * kBlockSize / 4 / root_piece.size();
  int root_rc = 0;
  for (uint64_t k = 0; k < root_pieces && root_rc == 0; ++k) {
    root_rc = r->write(root_file, k * root_piece.size(), root_piece);
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(other.load(), 0) << r->log;
  EXPECT_EQ(root_rc, 0) << "root could not write a quarter of its reserve beside the users\n"
                        << r->log;
  // What is left: at least the reserve less what root took of it.
  EXPECT_GE(space(*r->fs).free + root_pieces * root_piece.size() / kBlockSize, reserved);
  EXPECT_EQ(r->read(root_file, (root_pieces - 1) * root_piece.size(), root_piece.size()),
            root_piece);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Reserve, ImagesWithoutTheFieldReserveNothing) {
  auto r = rig_with_reserve(0);
  ASSERT_TRUE(r);
  EXPECT_EQ(superblock(*r).reserved_blocks, 0u);
  CallerScope as(kUser);
  const Space before = space(*r->fs);
  EXPECT_GT(before.avail, 0u);
  int rc = 0;
  const uint64_t wrote = fill(*r, r->create(kRootInode, "user"), 0, &rc);
  EXPECT_EQ(rc, ENOSPC);
  EXPECT_GE(wrote / kBlockSize + 1, before.avail)
      << "a user could not fill what df said was available";
}

}  // namespace
}  // namespace warpfs::fs::test
