// Names: the 255-byte limit (every call that takes a new name says ENAMETOOLONG at 256),
// PATH_MAX, deep trees, and names made of unusual bytes, which must come back from readdir
// exactly as given.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using NamesTest = PosixTest;

TEST_F(NamesTest, A255ByteNameWorksEverywhere) {
  const std::string n(255, 'a');
  const std::string m(255, 'b');
  write_file(path(n), "long");
  EXPECT_EQ(read_file(path(n)), "long");
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{n});
  ASSERT_OK(::rename(path(n).c_str(), path(m).c_str()));
  xmkdir(path(n));
  xlink(path(m), path(n + "/" + m));
  xsymlink(n, path(n + "/" + n));
  EXPECT_EQ(list_dir(path(n)), (std::vector<std::string>{n, m}));
  EXPECT_EQ(read_file(path(n + "/" + m)), "long");
  EXPECT_EQ(xstat(path(n + "/" + m)).st_nlink, 2u);
}

TEST_F(NamesTest, A256ByteNameIsENAMETOOLONG) {
  const std::string n(256, 'x');
  write_file(path("f"), "x");
  xmkdir(path("d"));
  struct stat st;
  EXPECT_ERRNO(ENAMETOOLONG, ::open(path(n).c_str(), O_CREAT | O_WRONLY, 0644));
  EXPECT_ERRNO(ENAMETOOLONG, ::open(path(n).c_str(), O_RDONLY));
  EXPECT_ERRNO(ENAMETOOLONG, ::stat(path(n).c_str(), &st));
  EXPECT_ERRNO(ENAMETOOLONG, ::mkdir(path(n).c_str(), 0755));
  EXPECT_ERRNO(ENAMETOOLONG, ::symlink("f", path(n).c_str()));
  EXPECT_ERRNO(ENAMETOOLONG, ::link(path("f").c_str(), path(n).c_str()));
  EXPECT_ERRNO(ENAMETOOLONG, ::rename(path("f").c_str(), path(n).c_str()));
  EXPECT_ERRNO(ENAMETOOLONG, ::rename(path("d").c_str(), path(n).c_str()));
  EXPECT_ERRNO(ENAMETOOLONG, ::mkfifo(path(n).c_str(), 0644));
  EXPECT_ERRNO(ENAMETOOLONG, ::unlink(path(n).c_str()));
  EXPECT_ERRNO(ENAMETOOLONG, ::stat(path(n + "/x").c_str(), &st)) << "as a directory component";
  EXPECT_EQ(list_dir(dir()), (std::vector<std::string>{"d", "f"}));
}

TEST_F(NamesTest, PathsLongerThanPathMaxAreENAMETOOLONG) {
  std::string p = dir();
  while (p.size() <= 4096) p += "/" + std::string(100, 'p');
  struct stat st;
  EXPECT_ERRNO(ENAMETOOLONG, ::stat(p.c_str(), &st));
  EXPECT_ERRNO(ENAMETOOLONG, ::open(p.c_str(), O_CREAT | O_WRONLY, 0644));
  EXPECT_ERRNO(ENAMETOOLONG, ::mkdir(p.c_str(), 0755));
}

TEST_F(NamesTest, HundredLevelsDeep) {
  std::string rel;
  for (int i = 0; i < 100; ++i) {
    rel += (i == 0 ? "" : "/") + std::string("level") + std::to_string(i);
    ASSERT_OK(::mkdir(path(rel).c_str(), 0755)) << "depth " << i;
  }
  write_file(path(rel + "/leaf"), "bottom");
  EXPECT_EQ(read_file(path(rel + "/leaf")), "bottom");
  EXPECT_EQ(xstat(path(rel)).st_nlink, 2u);
  // Walking down with openat, one level at a time.
  Fd cur = xopenat(dfd(), "level0", O_RDONLY | O_DIRECTORY);
  for (int i = 1; i < 100; ++i) {
    cur = xopenat(cur.get(), "level" + std::to_string(i), O_RDONLY | O_DIRECTORY);
  }
  Fd leaf = xopenat(cur.get(), "leaf", O_RDONLY);
  EXPECT_EQ(pread_upto(leaf.get(), 100, 0), "bottom");
  // ".." all the way back up.
  std::string up = rel;
  for (int i = 0; i < 100; ++i) up += "/..";
  EXPECT_EQ(xstat(path(up)).st_ino, xstat(dir()).st_ino);
}

// Deeper than PATH_MAX allows as one string: only *at() calls reach the bottom.
TEST_F(NamesTest, TreeDeeperThanPathMaxThroughOpenat) {
  const std::string n(200, 'd');
  Fd cur = xopen(dir(), O_RDONLY | O_DIRECTORY);
  for (int i = 0; i < 30; ++i) {
    ASSERT_OK(::mkdirat(cur.get(), n.c_str(), 0755)) << "depth " << i;
    cur = xopenat(cur.get(), n, O_RDONLY | O_DIRECTORY);
  }
  Fd f = xopenat(cur.get(), "leaf", O_CREAT | O_RDWR, 0644);
  pwrite_all(f.get(), "deep", 0);
  EXPECT_EQ(pread_upto(xopenat(cur.get(), "leaf", O_RDONLY).get(), 10, 0), "deep");
  std::string full = dir();
  for (int i = 0; i < 30; ++i) full += "/" + n;
  struct stat st;
  EXPECT_ERRNO(ENAMETOOLONG, ::stat((full + "/leaf").c_str(), &st));
}

TEST_F(NamesTest, UnusualBytesRoundTrip) {
  std::vector<std::string> names = {
      " ",
      "  two  spaces  ",
      "tab\there",
      "new\nline",
      "back\\slash",
      "quote\"'`",
      "-leading-dash",
      "...",
      ".hidden",
      "..x",
      "x..",
      "star*?[]{}",
      "semi;colon&amp|pipe",
      "dollar$HOME",
      "\x01\x02\x1f\x7f",
      "caf\xc3\xa9",
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",
      "emoji\xf0\x9f\x98\x80",
      "not utf8 \xff\xfe\x80\xc0",
      "percent%s%n",
  };
  // Every byte a name may hold (1..255 except '/'), each once, in one 254-byte name.
  std::string all;
  for (int c = 1; c < 256; ++c) {
    if (c != '/') all.push_back(static_cast<char>(c));
  }
  names.push_back(all);
  for (const std::string& n : names) {
    ASSERT_OK(::mknodat(dfd(), n.c_str(), S_IFREG | 0644, 0)) << "name of " << n.size() << " bytes";
    Fd fd = xopenat(dfd(), n, O_WRONLY);
    pwrite_all(fd.get(), n, 0);
  }
  const std::set<std::string> want(names.begin(), names.end());
  EXPECT_EQ(list_dir_set(dir()), want);
  for (const std::string& n : names) {
    EXPECT_EQ(pread_upto(xopenat(dfd(), n, O_RDONLY).get(), 300, 0), n);
    const std::string renamed = n + "~";
    ASSERT_OK(::renameat(dfd(), n.c_str(), dfd(), renamed.c_str()));
    struct stat st;
    EXPECT_ERRNO(ENOENT, ::fstatat(dfd(), n.c_str(), &st, 0));
    ASSERT_OK(::unlinkat(dfd(), renamed.c_str(), 0));
  }
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{});
}

TEST_F(NamesTest, NamesAreCaseSensitiveAndExact) {
  for (const char* n : {"name", "Name", "NAME", "nAmE", "name ", " name", "name."}) {
    Fd fd = xopen(path(n), O_CREAT | O_EXCL | O_WRONLY, 0644);
    pwrite_all(fd.get(), n, 0);
  }
  EXPECT_EQ(list_dir(dir()).size(), 7u);
  EXPECT_EQ(read_file(path("nAmE")), "nAmE");
  EXPECT_EQ(read_file(path("name.")), "name.");
  struct stat st;
  EXPECT_ERRNO(ENOENT, ::stat(path("naMe").c_str(), &st));
}

TEST_F(NamesTest, DotAndDotDotAreNotOrdinaryNames) {
  EXPECT_ERRNO(EEXIST, ::mkdir(path(".").c_str(), 0755));
  EXPECT_ERRNO(EEXIST, ::mkdir(path("..").c_str(), 0755));
  EXPECT_ERRNO(EISDIR, ::open(path(".").c_str(), O_CREAT | O_WRONLY, 0644));
  EXPECT_ERRNO(EINVAL, ::rmdir(path(".").c_str()));
  EXPECT_ERRNO(ENOTEMPTY, ::rmdir(path("..").c_str()));
  write_file(path("f"), "x");
  EXPECT_ERRNO(EBUSY, ::rename(path("f").c_str(), path(".").c_str()));
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{"f"});
}

TEST_F(NamesTest, XattrNamesAreBytesToo) {
  write_file(path("f"), "x");
  const std::string name = "user.odd \t\xc3\xa9\xff";
  ASSERT_OK(::setxattr(path("f").c_str(), name.c_str(), "v", 1, 0));
  char buf[4];
  EXPECT_EQ(::getxattr(path("f").c_str(), name.c_str(), buf, sizeof buf), 1);
  EXPECT_ERRNO(ENODATA, ::getxattr(path("f").c_str(), "user.odd \t\xc3\xa9", buf, sizeof buf));
}

}  // namespace
}  // namespace warpfs::posix_test
