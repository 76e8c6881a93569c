// POSIX ACLs in the core (acl.cc, FORMAT.md "Extended attributes"): the mode follows an
// access ACL set through system.posix_acl_access, chmod updates the ACL, and new inodes in a
// directory with a default ACL inherit it instead of taking the umask. Alone and with threads.
#include <sys/stat.h>

#include <array>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "fs/core_rig.h"
#include "internal.h"

namespace warpfs::fs::test {
namespace {

// An ACL in its xattr form: {tag, perm, id} entries after a version-2 header.
std::string acl_value(std::initializer_list<std::array<uint32_t, 3>> entries) {
  std::string v(4, '\0');
  const uint32_t version = 2;
  std::memcpy(v.data(), &version, 4);
  for (const auto& e : entries) {
    const uint16_t tag = static_cast<uint16_t>(e[0]), perm = static_cast<uint16_t>(e[1]);
    const uint32_t id = e[2];
    v.append(reinterpret_cast<const char*>(&tag), 2);
    v.append(reinterpret_cast<const char*>(&perm), 2);
    v.append(reinterpret_cast<const char*>(&id), 4);
  }
  return v;
}
constexpr uint32_t kUserObj = 1, kUser = 2, kGroupObj = 4, kGroup = 8, kMask = 0x10, kOther = 0x20;

uint32_t perms(Rig& r, Ino ino) {
  Attr a;
  EXPECT_EQ(r.fs->getattr(ino, &a), 0);
  return a.mode & 07777;
}

TEST(Acl, InheritMasksTheModeAndTheAcl) {
  const std::string dflt = acl_value(
      {{kUserObj, 7, 0}, {kUser, 7, 65534}, {kGroupObj, 5, 0}, {kMask, 7, 0}, {kOther, 5, 0}});
  uint32_t mode = S_IFREG | 0666;
  std::string access;
  ASSERT_TRUE(acl::inherit(dflt, &mode, &access));
  EXPECT_EQ(mode, S_IFREG | 0664u) << std::oct << mode;  // user rw, mask rw, other r
  uint32_t p;
  bool eq;
  ASSERT_TRUE(acl::mode_of(access, &p, &eq));
  EXPECT_EQ(p, 0664u);
  EXPECT_FALSE(eq);
  // Only the three base entries: the mode says it all, no access ACL.
  mode = S_IFREG | 0640;
  ASSERT_TRUE(acl::inherit(acl_value({{kUserObj, 7, 0}, {kGroupObj, 7, 0}, {kOther, 0, 0}}), &mode,
                           &access));
  EXPECT_EQ(mode, S_IFREG | 0640u);
  EXPECT_TRUE(access.empty());
  EXPECT_FALSE(acl::inherit("junk", &mode, &access));
  std::string a = acl_value(
      {{kUserObj, 6, 0}, {kUser, 4, 65534}, {kGroupObj, 0, 0}, {kMask, 4, 0}, {kOther, 0, 0}});
  ASSERT_TRUE(acl::chmod(&a, 0751));
  ASSERT_TRUE(acl::mode_of(a, &p, &eq));
  EXPECT_EQ(p, 0751u) << "owner, mask and other follow chmod";
}

TEST(Acl, ModeFollowsTheAccessAclAndChmodTheAcl) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f", 0600);
  const std::string a = acl_value(
      {{kUserObj, 6, 0}, {kUser, 4, 65534}, {kGroupObj, 0, 0}, {kMask, 4, 0}, {kOther, 0, 0}});
  ASSERT_EQ(r->fs->setxattr(f, "system.posix_acl_access", a.data(), a.size(), 0), 0);
  EXPECT_EQ(perms(*r, f), 0640u) << "the mask shows as the group bits";
  SetAttr s;
  s.mode = true;
  s.new_mode = 0600;
  Attr out;
  ASSERT_EQ(r->fs->setattr(f, s, &out), 0);
  std::string got;
  ASSERT_EQ(r->fs->getxattr(f, "system.posix_acl_access", &got), 0);
  uint32_t p;
  bool eq;
  ASSERT_TRUE(acl::mode_of(got, &p, &eq));
  EXPECT_EQ(p, 0600u) << "chmod g-r emptied the mask";
  // An ACL the mode says all of is not kept.
  const std::string base = acl_value({{kUserObj, 6, 0}, {kGroupObj, 4, 0}, {kOther, 4, 0}});
  ASSERT_EQ(r->fs->setxattr(f, "system.posix_acl_access", base.data(), base.size(), 0), 0);
  EXPECT_EQ(perms(*r, f), 0644u);
  EXPECT_EQ(r->fs->getxattr(f, "system.posix_acl_access", &got), ENODATA);
  EXPECT_EQ(r->fs->setxattr(f, "system.posix_acl_access", "bad", 3, 0), EINVAL);
  EXPECT_EQ(r->fs->setxattr(f, "system.other", "x", 1, 0), EOPNOTSUPP);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Acl, DefaultAclIsInheritedAndTheUmaskIgnored) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino d = r->mkdir(kRootInode, "d");
  const std::string dflt = acl_value(
      {{kUserObj, 7, 0}, {kUser, 7, 65534}, {kGroupObj, 5, 0}, {kMask, 7, 0}, {kOther, 5, 0}});
  ASSERT_EQ(r->fs->setxattr(d, "system.posix_acl_default", dflt.data(), dflt.size(), 0), 0);
  Caller c;
  c.umask = 077;
  Attr a;
  ASSERT_EQ(r->fs->mknod(d, "f", S_IFREG | 0666, 0, c, &a), 0);
  EXPECT_EQ(a.mode & 07777, 0664u) << "the default ACL, not the umask";
  std::string got;
  EXPECT_EQ(r->fs->getxattr(a.ino, "system.posix_acl_access", &got), 0);
  EXPECT_EQ(r->fs->getxattr(a.ino, "system.posix_acl_default", &got), ENODATA)
      << "files get no default ACL";
  ASSERT_EQ(r->fs->mkdir(d, "sub", 0777, c, &a), 0);
  EXPECT_EQ(a.mode & 07777, 0775u);
  ASSERT_EQ(r->fs->getxattr(a.ino, "system.posix_acl_default", &got), 0);
  EXPECT_EQ(got, dflt) << "subdirectories hand it on";
  // Without a default ACL the umask applies.
  ASSERT_EQ(r->fs->mknod(kRootInode, "plain", S_IFREG | 0666, 0, c, &a), 0);
  EXPECT_EQ(a.mode & 07777, 0600u);
  EXPECT_EQ(r->check_and_remount(), "");
}

// Creators racing a thread that switches the directory's default ACL between two: each new
// inode carries one of them whole (the directory's lock orders them), and fsck is clean.
TEST(Acl, CreatesRacingDefaultAclChanges) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino d = r->mkdir(kRootInode, "d");
  const std::string one = acl_value(
      {{kUserObj, 7, 0}, {kUser, 7, 1000}, {kGroupObj, 5, 0}, {kMask, 7, 0}, {kOther, 5, 0}});
  const std::string two = acl_value(
      {{kUserObj, 6, 0}, {kGroup, 6, 2000}, {kGroupObj, 4, 0}, {kMask, 6, 0}, {kOther, 0, 0}});
  ASSERT_EQ(r->fs->setxattr(d, "system.posix_acl_default", one.data(), one.size(), 0), 0);
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread switcher([&] {
    for (int i = 0; !stop.load(); ++i) {
      const std::string& v = i % 2 ? one : two;
      if (r->fs->setxattr(d, "system.posix_acl_default", v.data(), v.size(), 0) != 0) bad++;
    }
  });
  std::vector<std::thread> creators;
  for (int t = 0; t < 3; ++t) {
    creators.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        Attr a;
        const std::string name = "f" + std::to_string(t) + "_" + std::to_string(i);
        if (r->fs->mknod(d, name, S_IFREG | 0666, 0, Caller{}, &a) != 0) {
          bad++;
          continue;
        }
        std::string got;
        if (r->fs->getxattr(a.ino, "system.posix_acl_access", &got) != 0) {
          bad++;
        } else {
          uint32_t p;
          bool eq;
          // From `one`: 0664 (mask rw-); from `two`: 0660.
          if (!acl::mode_of(got, &p, &eq) || (p != 0664 && p != 0660) || (a.mode & 0777) != p)
            bad++;
        }
        r->fs->forget(a.ino, 1);
      }
    });
  }
  for (auto& t : creators) t.join();
  stop = true;
  switcher.join();
  EXPECT_EQ(bad.load(), 0) << r->log;
  EXPECT_EQ(r->check_and_remount(), "");
}

}  // namespace
}  // namespace warpfs::fs::test
