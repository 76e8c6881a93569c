// Extended attributes: set/get/list/remove, the XATTR_CREATE/XATTR_REPLACE flags, the size
// query (size 0), ERANGE for a small buffer, ENODATA, limits, and attributes following the
// inode through links, renames and unlinks.
#include <fcntl.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using XattrTest = PosixTest;

// The value of `name` on `p`, read with the size query first.
std::string get(const std::string& p, const std::string& name) {
  const ssize_t n = check(::getxattr(p.c_str(), name.c_str(), nullptr, 0), "getxattr " + name);
  std::string v(static_cast<size_t>(n), '\0');
  const ssize_t m =
      check(::getxattr(p.c_str(), name.c_str(), v.data(), v.size()), "getxattr " + name);
  v.resize(static_cast<size_t>(m));
  return v;
}

// The user.* names on `p` (other namespaces, such as security.*, may be added by the system).
std::set<std::string> user_names(const std::string& p) {
  const ssize_t n = check(::llistxattr(p.c_str(), nullptr, 0), "listxattr " + p);
  std::string buf(static_cast<size_t>(n), '\0');
  const ssize_t m = check(::llistxattr(p.c_str(), buf.data(), buf.size()), "listxattr " + p);
  std::set<std::string> names;
  for (size_t pos = 0; pos < static_cast<size_t>(m);) {
    const size_t end = buf.find('\0', pos);
    if (end == std::string::npos) throw std::runtime_error("listxattr: unterminated name");
    const std::string name = buf.substr(pos, end - pos);
    if (name.rfind("user.", 0) == 0 && !names.insert(name).second) {
      throw std::runtime_error("listxattr returns " + name + " twice");
    }
    pos = end + 1;
  }
  return names;
}

int set(const std::string& p, const std::string& name, const std::string& value, int flags = 0) {
  return ::setxattr(p.c_str(), name.c_str(), value.data(), value.size(), flags);
}

TEST_F(XattrTest, SetThenGetRoundTrips) {
  write_file(path("f"), "x");
  ASSERT_OK(set(path("f"), "user.greeting", "hello"));
  EXPECT_EQ(::getxattr(path("f").c_str(), "user.greeting", nullptr, 0), 5) << "size query";
  char buf[16];
  ASSERT_EQ(::getxattr(path("f").c_str(), "user.greeting", buf, sizeof buf), 5);
  EXPECT_EQ(std::string(buf, 5), "hello");
  ASSERT_OK(set(path("f"), "user.greeting", "a longer value than before"));
  EXPECT_EQ(get(path("f"), "user.greeting"), "a longer value than before");
  ASSERT_OK(set(path("f"), "user.greeting", "short"));
  EXPECT_EQ(get(path("f"), "user.greeting"), "short");
  EXPECT_EQ(user_names(path("f")), std::set<std::string>{"user.greeting"});
}

TEST_F(XattrTest, CreateAndReplaceFlags) {
  write_file(path("f"), "x");
  ASSERT_OK(set(path("f"), "user.a", "1", XATTR_CREATE));
  EXPECT_ERRNO(EEXIST, set(path("f"), "user.a", "2", XATTR_CREATE));
  EXPECT_EQ(get(path("f"), "user.a"), "1") << "a refused XATTR_CREATE must not write";
  EXPECT_ERRNO(ENODATA, set(path("f"), "user.b", "2", XATTR_REPLACE));
  EXPECT_ERRNO(ENODATA, ::getxattr(path("f").c_str(), "user.b", nullptr, 0))
      << "a refused XATTR_REPLACE must not create";
  ASSERT_OK(set(path("f"), "user.a", "3", XATTR_REPLACE));
  EXPECT_EQ(get(path("f"), "user.a"), "3");
  EXPECT_ERRNO(EINVAL, set(path("f"), "user.a", "4", XATTR_CREATE | XATTR_REPLACE | 4));
  EXPECT_EQ(get(path("f"), "user.a"), "3");
}

TEST_F(XattrTest, MissingAttributeIsENODATA) {
  write_file(path("f"), "x");
  char buf[8];
  EXPECT_ERRNO(ENODATA, ::getxattr(path("f").c_str(), "user.none", buf, sizeof buf));
  EXPECT_ERRNO(ENODATA, ::getxattr(path("f").c_str(), "user.none", nullptr, 0));
  EXPECT_ERRNO(ENODATA, ::removexattr(path("f").c_str(), "user.none"));
  EXPECT_ERRNO(ENOENT, ::getxattr(path("missing").c_str(), "user.none", buf, sizeof buf));
  EXPECT_EQ(user_names(path("f")), std::set<std::string>{});
}

TEST_F(XattrTest, SmallBufferIsERANGE) {
  write_file(path("f"), "x");
  ASSERT_OK(set(path("f"), "user.value", "0123456789"));
  ASSERT_OK(set(path("f"), "user.other", "x"));
  char buf[64];
  EXPECT_ERRNO(ERANGE, ::getxattr(path("f").c_str(), "user.value", buf, 9));
  EXPECT_EQ(::getxattr(path("f").c_str(), "user.value", buf, 10), 10) << "an exact fit is fine";
  const ssize_t list_size = ::listxattr(path("f").c_str(), nullptr, 0);
  ASSERT_GE(list_size, static_cast<ssize_t>(sizeof("user.value") + sizeof("user.other")));
  std::string list(static_cast<size_t>(list_size), '\0');
  EXPECT_ERRNO(ERANGE, ::listxattr(path("f").c_str(), list.data(), 5));
  EXPECT_ERRNO(ERANGE, ::listxattr(path("f").c_str(), list.data(), list.size() - 1));
  EXPECT_EQ(::listxattr(path("f").c_str(), list.data(), list.size()), list_size);
}

TEST_F(XattrTest, ListNamesEveryAttributeOnceAndRemoveTakesThemAway) {
  write_file(path("f"), "x");
  std::set<std::string> want;
  for (int i = 0; i < 40; ++i) {
    const std::string name = "user.attr" + std::to_string(i);
    ASSERT_OK(set(path("f"), name, std::to_string(i * i)));
    want.insert(name);
  }
  EXPECT_EQ(user_names(path("f")), want);
  for (int i = 0; i < 40; i += 3) {
    const std::string name = "user.attr" + std::to_string(i);
    ASSERT_OK(::removexattr(path("f").c_str(), name.c_str()));
    want.erase(name);
  }
  EXPECT_EQ(user_names(path("f")), want);
  for (const std::string& name : want) {
    EXPECT_EQ(get(path("f"), name),
              std::to_string(std::stoi(name.substr(9)) * std::stoi(name.substr(9))));
  }
}

TEST_F(XattrTest, EmptyBinaryAndLargeValues) {
  write_file(path("f"), "x");
  ASSERT_OK(set(path("f"), "user.empty", ""));
  EXPECT_EQ(::getxattr(path("f").c_str(), "user.empty", nullptr, 0), 0);
  EXPECT_EQ(get(path("f"), "user.empty"), "");
  std::string binary;
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(i));
  ASSERT_OK(set(path("f"), "user.binary", binary));
  EXPECT_EQ(get(path("f"), "user.binary"), binary);
  const std::string large = pattern(5, 2000);
  ASSERT_OK(set(path("f"), "user.large", large));
  EXPECT_EQ(get(path("f"), "user.large"), large);
  EXPECT_EQ(user_names(path("f")),
            (std::set<std::string>{"user.binary", "user.empty", "user.large"}));
}

TEST_F(XattrTest, NameAndValueLimits) {
  write_file(path("f"), "x");
  const std::string longest = "user." + std::string(250, 'n');  // XATTR_NAME_MAX = 255
  ASSERT_OK(set(path("f"), longest, "v"));
  EXPECT_EQ(get(path("f"), longest), "v");
  EXPECT_ERRNO(ERANGE, set(path("f"), longest + "n", "v"));
  EXPECT_ERRNO(ERANGE, set(path("f"), "", "v"));
  EXPECT_ERRNO(E2BIG, set(path("f"), "user.huge", std::string(65537, 'v')));
  EXPECT_EQ(user_names(path("f")), std::set<std::string>{longest});
}

TEST_F(XattrTest, DirectoriesAndDescriptorsHaveAttributesToo) {
  xmkdir(path("d"));
  ASSERT_OK(set(path("d"), "user.dir", "on a directory"));
  EXPECT_EQ(get(path("d"), "user.dir"), "on a directory");
  write_file(path("f"), "x");
  Fd fd = xopen(path("f"), O_RDONLY);
  ASSERT_OK(::fsetxattr(fd.get(), "user.fd", "via fd", 6, 0));
  char buf[16];
  EXPECT_EQ(::fgetxattr(fd.get(), "user.fd", buf, sizeof buf), 6);
  EXPECT_EQ(get(path("f"), "user.fd"), "via fd");
  EXPECT_GT(::flistxattr(fd.get(), nullptr, 0), 0);
  ASSERT_OK(::fremovexattr(fd.get(), "user.fd"));
  EXPECT_ERRNO(ENODATA, ::fgetxattr(fd.get(), "user.fd", buf, sizeof buf));
}

TEST_F(XattrTest, UserAttributesOnASymlinkAreRefused) {
  write_file(path("target"), "x");
  xsymlink("target", path("l"));
  EXPECT_ERRNO(EPERM, ::lsetxattr(path("l").c_str(), "user.x", "v", 1, 0));
  char buf[4];
  EXPECT_ERRNO(ENODATA, ::lgetxattr(path("l").c_str(), "user.x", buf, sizeof buf));
  // Without the l, the call follows the link to the target.
  ASSERT_OK(::setxattr(path("l").c_str(), "user.x", "v", 1, 0));
  EXPECT_EQ(get(path("target"), "user.x"), "v");
}

TEST_F(XattrTest, TrustedNamespaceForRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "trusted.* needs CAP_SYS_ADMIN";
  write_file(path("f"), "x");
  ASSERT_OK(set(path("f"), "trusted.t", "root only"));
  EXPECT_EQ(get(path("f"), "trusted.t"), "root only");
  ASSERT_OK(::removexattr(path("f").c_str(), "trusted.t"));
  char buf[16];
  EXPECT_ERRNO(ENODATA, ::getxattr(path("f").c_str(), "trusted.t", buf, sizeof buf));
}

// A write takes file capabilities away (as chmod-free suid clearing does), through the page
// cache and through O_DIRECT alike: warpfs does it itself for direct writes, which reach it
// without the kernel's check.
TEST_F(XattrTest, WritesDropFileCapabilities) {
  if (::geteuid() != 0) GTEST_SKIP() << "security.capability needs CAP_SETFCAP";
  vfs_cap_data cap{};
  cap.magic_etc = VFS_CAP_REVISION_2;
  cap.data[0].permitted = 1u << CAP_NET_BIND_SERVICE;
  const std::string value(reinterpret_cast<const char*>(&cap), XATTR_CAPS_SZ_2);
  write_file(path("f"), std::string(8192, 'x'), 0755);
  ASSERT_OK(set(path("f"), "user.keep", "v"));
  for (const int flags : {O_WRONLY, O_WRONLY | O_DIRECT}) {
    ASSERT_OK(set(path("f"), "security.capability", value));
    ASSERT_EQ(get(path("f"), "security.capability").size(), value.size());
    Fd fd = xopen(path("f"), flags);
    AlignedBuffer data = aligned_buffer(4096);
    std::memset(data.get(), 'y', 4096);
    ASSERT_EQ(::pwrite(fd.get(), data.get(), 4096, 4096), 4096) << std::strerror(errno);
    char buf[64];
    EXPECT_ERRNO(ENODATA, ::getxattr(path("f").c_str(), "security.capability", buf, sizeof buf))
        << (flags & O_DIRECT ? "O_DIRECT" : "buffered");
    EXPECT_EQ(get(path("f"), "user.keep"), "v") << "other attributes stay";
  }
}

TEST_F(XattrTest, AttributesBelongToTheInode) {
  write_file(path("f"), "x");
  ASSERT_OK(set(path("f"), "user.k", "v1"));
  xlink(path("f"), path("hard"));
  EXPECT_EQ(get(path("hard"), "user.k"), "v1");
  ASSERT_OK(set(path("hard"), "user.k", "v2"));
  EXPECT_EQ(get(path("f"), "user.k"), "v2");
  ASSERT_OK(::rename(path("f").c_str(), path("renamed").c_str()));
  EXPECT_EQ(get(path("renamed"), "user.k"), "v2");
  Fd fd = xopen(path("renamed"), O_RDONLY);
  xunlink(path("renamed"));
  xunlink(path("hard"));
  char buf[8];
  EXPECT_EQ(::fgetxattr(fd.get(), "user.k", buf, sizeof buf), 2) << "still there, unlinked";
  // A new file under an old name starts without attributes.
  write_file(path("renamed"), "new");
  EXPECT_EQ(user_names(path("renamed")), std::set<std::string>{});
}

TEST_F(XattrTest, SetxattrChangesCtimeNotMtime) {
  write_file(path("f"), "x");
  const timespec past[2] = {{1'000'000'000, 0}, {1'000'000'000, 0}};
  ASSERT_OK(::utimensat(dfd(), "f", past, 0));
  const struct stat st0 = xstat(path("f"));
  wait_clock_past(ns_of(st0.st_ctim));
  ASSERT_OK(set(path("f"), "user.k", "v"));
  const struct stat st1 = xstat(path("f"));
  EXPECT_GT(ns_of(st1.st_ctim), ns_of(st0.st_ctim));
  EXPECT_EQ(ns_of(st1.st_mtim), ns_of(st0.st_mtim));
  wait_clock_past(ns_of(st1.st_ctim));
  ASSERT_OK(::removexattr(path("f").c_str(), "user.k"));
  EXPECT_GT(ns_of(xstat(path("f")).st_ctim), ns_of(st1.st_ctim));
}

// warpfs chains xattr blocks and keeps large values in value blocks (fs/FORMAT.md "Extended
// attributes"): thousands of attributes and values up to XATTR_SIZE_MAX. (tmpfs limits the
// space of user.* attributes per inode, so these are warpfs-only.)
TEST_F(XattrTest, WarpfsHoldsThousandsOfAttributes) {
  if (!is_warpfs()) GTEST_SKIP() << "warpfs-only (WARPFS_TEST_FS=warpfs)";
  write_file(path("f"), "x");
  std::set<std::string> want;
  for (int i = 0; i < 3000; ++i) {
    const std::string name = "user.a" + std::to_string(i);
    ASSERT_OK(set(path("f"), name, "value" + std::to_string(i)));
    want.insert(name);
  }
  EXPECT_EQ(user_names(path("f")), want);
  for (int i = 0; i < 3000; ++i) {
    ASSERT_EQ(get(path("f"), "user.a" + std::to_string(i)), "value" + std::to_string(i));
  }
  for (int i = 0; i < 3000; i += 2) {
    const std::string name = "user.a" + std::to_string(i);
    ASSERT_OK(::removexattr(path("f").c_str(), name.c_str()));
    want.erase(name);
  }
  EXPECT_EQ(user_names(path("f")), want);
  EXPECT_ERRNO(ENODATA, ::getxattr(path("f").c_str(), "user.a0", nullptr, 0));
  EXPECT_EQ(get(path("f"), "user.a2999"), "value2999");
}

TEST_F(XattrTest, WarpfsHoldsA64KiBValue) {
  if (!is_warpfs()) GTEST_SKIP() << "warpfs-only (WARPFS_TEST_FS=warpfs)";
  write_file(path("f"), "x");
  const std::string big = pattern(9, 65536);
  ASSERT_OK(set(path("f"), "user.big", big));
  EXPECT_EQ(::getxattr(path("f").c_str(), "user.big", nullptr, 0), 65536) << "size query";
  EXPECT_EQ(get(path("f"), "user.big"), big);
  for (const size_t len : {2048, 2049, 4064, 4065, 8129, 65535}) {
    const std::string v = pattern(static_cast<int>(len), len);
    ASSERT_OK(set(path("f"), "user.v" + std::to_string(len), v));
    EXPECT_EQ(get(path("f"), "user.v" + std::to_string(len)), v) << len;
  }
  ASSERT_OK(set(path("f"), "user.big", "small now", XATTR_REPLACE));
  EXPECT_EQ(get(path("f"), "user.big"), "small now");
  ASSERT_OK(set(path("f"), "user.big", big, XATTR_REPLACE));
  EXPECT_EQ(get(path("f"), "user.big"), big);
  EXPECT_EQ(user_names(path("f")).size(), 7u);
}

// Several processes change the attributes of one file at once, each its own names; every
// name ends up once with its last value.
TEST_F(XattrTest, WarpfsProcessesSharingAFile) {
  if (!is_warpfs()) GTEST_SKIP() << "warpfs-only (WARPFS_TEST_FS=warpfs)";
  write_file(path("f"), "x");
  constexpr int kProcs = 4, kNames = 300;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int bad = 0;
      for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < kNames; ++i) {
          const std::string name = "user.p" + std::to_string(p) + "_" + std::to_string(i);
          const std::string v = std::string(i % 7 == 0 ? 3000 : 10, static_cast<char>('a' + round));
          if (set(path("f"), name, v) != 0) ++bad;
          if (round == 1 && i % 2 && ::removexattr(path("f").c_str(), name.c_str()) != 0) ++bad;
        }
      }
      ::_exit(bad == 0 ? 0 : 1);
    }
    kids.push_back(pid);
  }
  for (const pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::set<std::string> want;
  for (int p = 0; p < kProcs; ++p) {
    for (int i = 0; i < kNames; ++i) {
      const std::string name = "user.p" + std::to_string(p) + "_" + std::to_string(i);
      want.insert(name);
      EXPECT_EQ(get(path("f"), name), std::string(i % 7 == 0 ? 3000 : 10, 'c')) << name;
    }
  }
  EXPECT_EQ(user_names(path("f")), want);
}

}  // namespace
}  // namespace warpfs::posix_test
