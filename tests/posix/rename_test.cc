// rename/renameat2: moving files and directories within and across directories, replacing
// targets (and every refusal to), RENAME_NOREPLACE and RENAME_EXCHANGE, and the link counts
// and ".." entries that follow a moved directory.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>  // RENAME_NOREPLACE, RENAME_EXCHANGE
#include <iterator>
#include <set>
#include <string>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using RenameTest = PosixTest;

// renameat2 through the raw syscall, as the brief's callers use it.
long renameat2(int olddir, const std::string& from, int newdir, const std::string& to,
               unsigned flags) {
  return ::syscall(SYS_renameat2, olddir, from.c_str(), newdir, to.c_str(), flags);
}

TEST_F(RenameTest, FileToANewName) {
  write_file(path("a"), "content");
  const ino_t ino = xstat(path("a")).st_ino;
  ASSERT_OK(::rename(path("a").c_str(), path("b").c_str()));
  EXPECT_FALSE(exists(path("a")));
  EXPECT_EQ(read_file(path("b")), "content");
  EXPECT_EQ(xstat(path("b")).st_ino, ino);
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{"b"});
}

TEST_F(RenameTest, OverAnExistingFileReplacesIt) {
  write_file(path("src"), "new");
  write_file(path("dst"), "old");
  xlink(path("dst"), path("dst_other_name"));
  const ino_t src_ino = xstat(path("src")).st_ino;
  ASSERT_OK(::rename(path("src").c_str(), path("dst").c_str()));
  EXPECT_FALSE(exists(path("src")));
  EXPECT_EQ(read_file(path("dst")), "new");
  EXPECT_EQ(xstat(path("dst")).st_ino, src_ino);
  EXPECT_EQ(xstat(path("dst_other_name")).st_nlink, 1u) << "the replaced inode lost a link";
  EXPECT_EQ(read_file(path("dst_other_name")), "old");
}

TEST_F(RenameTest, AcrossDirectoriesAdjustsLinkCountsAndDotDot) {
  xmkdir(path("from"));
  xmkdir(path("to"));
  xmkdir(path("from/sub"));
  write_file(path("from/sub/f"), "deep");
  write_file(path("from/file"), "flat");
  const nlink_t from_links = xstat(path("from")).st_nlink;
  const nlink_t to_links = xstat(path("to")).st_nlink;
  ASSERT_OK(::rename(path("from/file").c_str(), path("to/file").c_str()));
  EXPECT_EQ(xstat(path("from")).st_nlink, from_links) << "moving a file changes no dir links";
  ASSERT_OK(::rename(path("from/sub").c_str(), path("to/moved").c_str()));
  EXPECT_EQ(xstat(path("from")).st_nlink, from_links - 1);
  EXPECT_EQ(xstat(path("to")).st_nlink, to_links + 1);
  EXPECT_EQ(xstat(path("to/moved/..")).st_ino, xstat(path("to")).st_ino);
  EXPECT_EQ(read_file(path("to/moved/f")), "deep");
  EXPECT_EQ(read_file(path("to/file")), "flat");
  EXPECT_EQ(list_dir(path("from")), std::vector<std::string>{});
  EXPECT_EQ(list_dir(path("to")), (std::vector<std::string>{"file", "moved"}));
}

TEST_F(RenameTest, DirectoryOverAnEmptyDirectoryReplacesIt) {
  xmkdir(path("a"));
  write_file(path("a/inside"), "x");
  xmkdir(path("empty"));
  const ino_t ino = xstat(path("a")).st_ino;
  const nlink_t parent_links = xstat(dir()).st_nlink;
  ASSERT_OK(::rename(path("a").c_str(), path("empty").c_str()));
  EXPECT_EQ(xstat(path("empty")).st_ino, ino);
  EXPECT_EQ(read_file(path("empty/inside")), "x");
  EXPECT_EQ(xstat(dir()).st_nlink, parent_links - 1);
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{"empty"});
}

TEST_F(RenameTest, DirectoryOverANonEmptyDirectoryIsENOTEMPTY) {
  xmkdir(path("a"));
  xmkdir(path("full"));
  write_file(path("full/f"), "x");
  EXPECT_ERRNO(ENOTEMPTY, ::rename(path("a").c_str(), path("full").c_str()));
  xmkdir(path("full2"));
  xmkdir(path("full2/sub"));
  EXPECT_ERRNO(ENOTEMPTY, ::rename(path("a").c_str(), path("full2").c_str()));
  EXPECT_TRUE(exists(path("a")));
  EXPECT_EQ(read_file(path("full/f")), "x");
}

TEST_F(RenameTest, FileOverDirectoryIsEISDIRAndDirectoryOverFileIsENOTDIR) {
  write_file(path("f"), "x");
  xmkdir(path("d"));
  EXPECT_ERRNO(EISDIR, ::rename(path("f").c_str(), path("d").c_str()));
  EXPECT_ERRNO(ENOTDIR, ::rename(path("d").c_str(), path("f").c_str()));
  EXPECT_TRUE(S_ISREG(xstat(path("f")).st_mode));
  EXPECT_TRUE(S_ISDIR(xstat(path("d")).st_mode));
}

TEST_F(RenameTest, DirectoryIntoItsOwnSubtreeIsEINVAL) {
  xmkdir(path("a"));
  xmkdir(path("a/b"));
  xmkdir(path("a/b/c"));
  EXPECT_ERRNO(EINVAL, ::rename(path("a").c_str(), path("a/b/x").c_str()));
  EXPECT_ERRNO(EINVAL, ::rename(path("a").c_str(), path("a/b/c/x").c_str()));
  EXPECT_ERRNO(EINVAL, ::rename(path("a").c_str(), path("a/x").c_str()));
  EXPECT_ERRNO(EINVAL, ::rename(path("a/b").c_str(), path("a/b/c/b").c_str()));
  EXPECT_TRUE(exists(path("a/b/c")));
  EXPECT_EQ(list_dir(path("a")), std::vector<std::string>{"b"});
}

TEST_F(RenameTest, MissingSourceOrTargetParentIsENOENT) {
  write_file(path("f"), "x");
  EXPECT_ERRNO(ENOENT, ::rename(path("missing").c_str(), path("new").c_str()));
  EXPECT_ERRNO(ENOENT, ::rename(path("f").c_str(), path("nodir/new").c_str()));
  EXPECT_ERRNO(ENOTDIR, ::rename(path("f").c_str(), path("f/new").c_str()));
  EXPECT_TRUE(exists(path("f")));
  EXPECT_FALSE(exists(path("new")));
}

TEST_F(RenameTest, ToItselfOrAnotherLinkOfTheSameInodeChangesNothing) {
  write_file(path("a"), "same");
  xlink(path("a"), path("b"));
  ASSERT_OK(::rename(path("a").c_str(), path("a").c_str()));
  ASSERT_OK(::rename(path("a").c_str(), path("b").c_str()));
  EXPECT_TRUE(exists(path("a"))) << "renaming onto a link of the same inode does nothing";
  EXPECT_TRUE(exists(path("b")));
  EXPECT_EQ(xstat(path("a")).st_nlink, 2u);
  xmkdir(path("d"));
  ASSERT_OK(::rename(path("d").c_str(), path("d").c_str()));
  EXPECT_TRUE(S_ISDIR(xstat(path("d")).st_mode));
}

TEST_F(RenameTest, SymlinkIsRenamedNotItsTarget) {
  write_file(path("target"), "t");
  xsymlink("target", path("link"));
  ASSERT_OK(::rename(path("link").c_str(), path("moved").c_str()));
  EXPECT_TRUE(S_ISLNK(xlstat(path("moved")).st_mode));
  EXPECT_TRUE(exists(path("target")));
  EXPECT_EQ(read_file(path("moved")), "t");
}

TEST_F(RenameTest, OpenDescriptorFollowsTheRenamedFile) {
  write_file(path("a"), "before");
  Fd fd = xopen(path("a"), O_RDWR);
  ASSERT_OK(::rename(path("a").c_str(), path("b").c_str()));
  pwrite_all(fd.get(), "AFTER!", 0);
  EXPECT_EQ(read_file(path("b")), "AFTER!");
  EXPECT_EQ(xfstat(fd.get()).st_nlink, 1u);
}

TEST_F(RenameTest, NoReplaceRefusesAnExistingTarget) {
  write_file(path("a"), "a");
  write_file(path("b"), "b");
  xmkdir(path("d"));
  EXPECT_ERRNO(EEXIST, renameat2(dfd(), "a", dfd(), "b", RENAME_NOREPLACE));
  EXPECT_ERRNO(EEXIST, renameat2(dfd(), "a", dfd(), "d", RENAME_NOREPLACE));
  EXPECT_ERRNO(EEXIST, renameat2(dfd(), "d", dfd(), "b", RENAME_NOREPLACE));
  EXPECT_EQ(read_file(path("a")), "a");
  EXPECT_EQ(read_file(path("b")), "b");
  ASSERT_OK(renameat2(dfd(), "a", dfd(), "c", RENAME_NOREPLACE));
  EXPECT_FALSE(exists(path("a")));
  EXPECT_EQ(read_file(path("c")), "a");
  EXPECT_ERRNO(ENOENT, renameat2(dfd(), "missing", dfd(), "x", RENAME_NOREPLACE));
}

TEST_F(RenameTest, ExchangeSwapsTwoFiles) {
  write_file(path("a"), "content of a");
  write_file(path("b"), "b");
  const ino_t ia = xstat(path("a")).st_ino;
  const ino_t ib = xstat(path("b")).st_ino;
  ASSERT_OK(renameat2(dfd(), "a", dfd(), "b", RENAME_EXCHANGE));
  EXPECT_EQ(read_file(path("a")), "b");
  EXPECT_EQ(read_file(path("b")), "content of a");
  EXPECT_EQ(xstat(path("a")).st_ino, ib);
  EXPECT_EQ(xstat(path("b")).st_ino, ia);
}

TEST_F(RenameTest, ExchangeAFileAndADirectoryAcrossDirectories) {
  xmkdir(path("p"));
  xmkdir(path("q"));
  xmkdir(path("p/dir"));
  write_file(path("p/dir/inside"), "i");
  write_file(path("q/file"), "f");
  const nlink_t p_links = xstat(path("p")).st_nlink;
  const nlink_t q_links = xstat(path("q")).st_nlink;
  Fd p = xopen(path("p"), O_RDONLY | O_DIRECTORY);
  Fd q = xopen(path("q"), O_RDONLY | O_DIRECTORY);
  ASSERT_OK(renameat2(p.get(), "dir", q.get(), "file", RENAME_EXCHANGE));
  EXPECT_TRUE(S_ISREG(xstat(path("p/dir")).st_mode));
  EXPECT_EQ(read_file(path("p/dir")), "f");
  EXPECT_TRUE(S_ISDIR(xstat(path("q/file")).st_mode));
  EXPECT_EQ(read_file(path("q/file/inside")), "i");
  EXPECT_EQ(xstat(path("q/file/..")).st_ino, xstat(path("q")).st_ino);
  EXPECT_EQ(xstat(path("p")).st_nlink, p_links - 1);
  EXPECT_EQ(xstat(path("q")).st_nlink, q_links + 1);
}

TEST_F(RenameTest, ExchangeErrors) {
  write_file(path("a"), "a");
  xmkdir(path("d"));
  xmkdir(path("d/sub"));
  EXPECT_ERRNO(ENOENT, renameat2(dfd(), "a", dfd(), "missing", RENAME_EXCHANGE));
  EXPECT_ERRNO(ENOENT, renameat2(dfd(), "missing", dfd(), "a", RENAME_EXCHANGE));
  EXPECT_ERRNO(EINVAL, renameat2(dfd(), "a", dfd(), "d", RENAME_EXCHANGE | RENAME_NOREPLACE));
  EXPECT_ERRNO(EINVAL, renameat2(dfd(), "d", dfd(), "d/sub", RENAME_EXCHANGE));
  EXPECT_EQ(read_file(path("a")), "a");
  EXPECT_TRUE(exists(path("d/sub")));
}

TEST_F(RenameTest, ManyRenamesInOneDirectoryKeepTheListingExact) {
  std::set<std::string> want;
  for (int i = 0; i < 300; ++i) {
    write_file(path("n" + std::to_string(i)), std::to_string(i));
    want.insert("n" + std::to_string(i));
  }
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 300; i += 1 + round) {
      const std::string from = *std::next(want.begin(), i % static_cast<int>(want.size()));
      const std::string to = from + "_" + std::to_string(round);
      ASSERT_OK(::rename(path(from).c_str(), path(to).c_str()));
      want.erase(from);
      want.insert(to);
    }
  }
  EXPECT_EQ(list_dir_set(dir()), want);
  for (const std::string& n : want) {
    EXPECT_EQ(read_file(path(n)), n.substr(1, n.find('_') - 1)) << n;
  }
}

}  // namespace
}  // namespace warpfs::posix_test
