// mkdir/rmdir/readdir: creating and removing directories and their errors, readdir's
// entries and types, and the stability of directory offsets (telldir/seekdir, getdents
// cookies) while entries are added and removed, concurrently included.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using DirTest = PosixTest;

// One entry as getdents64 returns it.
struct RawEntry {
  std::string name;
  off_t off;  // the cookie that resumes reading after this entry
  ino_t ino;
  unsigned char type;
};

// One getdents64 call into a buffer of `bufsize` bytes; returns -1 with errno on error.
ssize_t getdents_once(int fd, size_t bufsize, std::vector<RawEntry>* out) {
  // Layout of struct linux_dirent64 (getdents64(2)).
  struct LinuxDirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
  };
  std::vector<char> buf(bufsize);
  const long n = ::syscall(SYS_getdents64, fd, buf.data(), buf.size());
  if (n <= 0) return n;
  for (long pos = 0; pos < n;) {
    const auto* e = reinterpret_cast<const LinuxDirent64*>(buf.data() + pos);
    out->push_back(
        {e->d_name, static_cast<off_t>(e->d_off), static_cast<ino_t>(e->d_ino), e->d_type});
    pos += e->d_reclen;
  }
  return n;
}

std::string name_of(int i) {
  return "entry" + std::to_string(i);
}

bool dot(const std::string& n) {
  return n == "." || n == "..";
}

TEST_F(DirTest, NewDirectoryHoldsOnlyDotAndDotDot) {
  ASSERT_OK(::mkdir(path("d").c_str(), 0750));
  const struct stat st = xstat(path("d"));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_nlink, 2u);
  Dir d(::opendir(path("d").c_str()));
  ASSERT_NE(d.get(), nullptr);
  std::map<std::string, ino_t> entries;
  while (dirent* e = ::readdir(d.get())) {
    EXPECT_TRUE(entries.emplace(e->d_name, e->d_ino).second) << "twice: " << e->d_name;
    EXPECT_EQ(e->d_type, DT_DIR) << e->d_name;
  }
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries["."], st.st_ino);
  EXPECT_EQ(entries[".."], xstat(dir()).st_ino);
  EXPECT_EQ(xstat(path("d/..")).st_ino, xstat(dir()).st_ino);
  EXPECT_EQ(xstat(path("d/.")).st_ino, st.st_ino);
}

TEST_F(DirTest, MkdirErrors) {
  xmkdir(path("d"));
  write_file(path("f"), "x");
  xsymlink("nowhere", path("dangling"));
  EXPECT_ERRNO(EEXIST, ::mkdir(path("d").c_str(), 0755));
  EXPECT_ERRNO(EEXIST, ::mkdir(path("f").c_str(), 0755));
  EXPECT_ERRNO(EEXIST, ::mkdir(path("dangling").c_str(), 0755));
  EXPECT_ERRNO(EEXIST, ::mkdir(path("d/.").c_str(), 0755));
  EXPECT_ERRNO(ENOENT, ::mkdir(path("missing/d").c_str(), 0755));
  EXPECT_ERRNO(ENOTDIR, ::mkdir(path("f/d").c_str(), 0755));
  EXPECT_FALSE(exists(path("nowhere"))) << "mkdir must not follow a dangling symlink";
  EXPECT_TRUE(S_ISREG(xstat(path("f")).st_mode));
}

TEST_F(DirTest, MkdirKeepsTheStickyBitAndInheritsSetgid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  ASSERT_OK(::mkdir(path("sticky").c_str(), 01777));
  EXPECT_EQ(xstat(path("sticky")).st_mode & 07777, 01755u) << "umask 022 applies, S_ISVTX stays";
  xmkdir(path("sg"));
  ASSERT_OK(::chown(path("sg").c_str(), 0, 1234));
  ASSERT_OK(::chmod(path("sg").c_str(), 02775));
  xmkdir(path("sg/sub"));
  write_file(path("sg/file"), "x");
  const struct stat sub = xstat(path("sg/sub"));
  EXPECT_EQ(sub.st_gid, 1234u) << "a setgid directory's group is inherited";
  EXPECT_NE(sub.st_mode & S_ISGID, 0u) << "and so is S_ISGID, by subdirectories";
  const struct stat file = xstat(path("sg/file"));
  EXPECT_EQ(file.st_gid, 1234u);
  EXPECT_EQ(file.st_mode & S_ISGID, 0u);
}

TEST_F(DirTest, RmdirRemovesOnlyEmptyDirectories) {
  xmkdir(path("d"));
  xmkdir(path("full"));
  write_file(path("full/f"), "x");
  xmkdir(path("nested"));
  xmkdir(path("nested/inner"));
  write_file(path("f"), "x");
  const nlink_t parent_links = xstat(dir()).st_nlink;
  EXPECT_ERRNO(ENOTEMPTY, ::rmdir(path("full").c_str()));
  EXPECT_ERRNO(ENOTEMPTY, ::rmdir(path("nested").c_str()));
  EXPECT_ERRNO(ENOTDIR, ::rmdir(path("f").c_str()));
  EXPECT_ERRNO(ENOENT, ::rmdir(path("missing").c_str()));
  EXPECT_ERRNO(EINVAL, ::rmdir(path("d/.").c_str()));
  EXPECT_ERRNO(ENOTDIR, ::rmdir(path("f/x").c_str()));
  xsymlink("d", path("link"));
  EXPECT_ERRNO(ENOTDIR, ::rmdir(path("link").c_str())) << "rmdir does not follow symlinks";
  EXPECT_TRUE(exists(path("full/f")));
  ASSERT_OK(::rmdir(path("d").c_str()));
  EXPECT_FALSE(exists(path("d")));
  EXPECT_EQ(xstat(dir()).st_nlink, parent_links - 1);
  ASSERT_OK(::unlinkat(dfd(), "nested/inner", AT_REMOVEDIR));
  ASSERT_OK(::rmdir(path("nested").c_str()));
  EXPECT_EQ(list_dir(dir()), (std::vector<std::string>{"f", "full", "link"}));
}

TEST_F(DirTest, ReaddirListsEveryEntryOnceWithItsType) {
  std::map<std::string, unsigned char> want;
  for (int i = 0; i < 40; ++i) {
    const std::string n = name_of(i);
    switch (i % 4) {
      case 0:
        write_file(path(n), n);
        want[n] = DT_REG;
        break;
      case 1:
        xmkdir(path(n));
        want[n] = DT_DIR;
        break;
      case 2:
        xsymlink("somewhere", path(n));
        want[n] = DT_LNK;
        break;
      case 3:
        ASSERT_OK(::mkfifo(path(n).c_str(), 0644));
        want[n] = DT_FIFO;
        break;
    }
  }
  Dir d(::opendir(dir().c_str()));
  ASSERT_NE(d.get(), nullptr);
  std::map<std::string, int> count;
  while (dirent* e = ::readdir(d.get())) {
    ++count[e->d_name];
    if (dot(e->d_name)) continue;
    auto it = want.find(e->d_name);
    ASSERT_NE(it, want.end()) << "unexpected entry " << e->d_name;
    EXPECT_EQ(e->d_type, it->second) << e->d_name;
    struct stat st;
    ASSERT_OK(::fstatat(dfd(), e->d_name, &st, AT_SYMLINK_NOFOLLOW));
    EXPECT_EQ(e->d_ino, st.st_ino) << e->d_name;
  }
  EXPECT_EQ(count.size(), want.size() + 2);
  for (const auto& [n, c] : count) EXPECT_EQ(c, 1) << n;
}

TEST_F(DirTest, RewinddirSeesEntriesAddedAndRemoved) {
  for (int i = 0; i < 10; ++i) write_file(path(name_of(i)), "x");
  Dir d(::opendir(dir().c_str()));
  ASSERT_NE(d.get(), nullptr);
  auto read_all = [&] {
    std::set<std::string> s;
    errno = 0;
    while (dirent* e = ::readdir(d.get())) {
      if (!dot(e->d_name)) {
        EXPECT_TRUE(s.insert(e->d_name).second) << e->d_name;
      }
    }
    EXPECT_EQ(errno, 0);
    return s;
  };
  EXPECT_EQ(read_all().size(), 10u);
  write_file(path("added"), "x");
  xunlink(path(name_of(3)));
  ::rewinddir(d.get());
  const std::set<std::string> after = read_all();
  EXPECT_EQ(after.size(), 10u);
  EXPECT_TRUE(after.count("added"));
  EXPECT_FALSE(after.count(name_of(3)));
}

TEST_F(DirTest, SeekdirReturnsToTheSamePosition) {
  for (int i = 0; i < 500; ++i) write_file(path(name_of(i)), "");
  Dir d(::opendir(dir().c_str()));
  ASSERT_NE(d.get(), nullptr);
  for (int i = 0; i < 100; ++i) ASSERT_NE(::readdir(d.get()), nullptr);
  const long pos = ::telldir(d.get());
  ASSERT_NE(pos, -1);
  std::vector<std::string> first;
  for (int i = 0; i < 150; ++i) {
    dirent* e = ::readdir(d.get());
    ASSERT_NE(e, nullptr);
    first.emplace_back(e->d_name);
  }
  ::seekdir(d.get(), pos);
  for (int i = 0; i < 150; ++i) {
    dirent* e = ::readdir(d.get());
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->d_name, first[i]) << "entry " << i << " after seekdir";
  }
}

// telldir/seekdir across unlinks and creations: reading in rounds, the position is saved,
// entries are removed (some already read, some not) and created, and reading resumes with
// seekdir, which makes the C library drop its buffer and ask the filesystem again from the
// saved cookie. Every entry that existed all along must come out exactly once; an entry
// removed before a round must not come out in a later round; nothing comes out twice.
TEST_F(DirTest, TelldirSeekdirAcrossUnlinksLosesAndDuplicatesNothing) {
  constexpr int kEntries = 2000;
  for (int i = 0; i < kEntries; ++i) write_file(path(name_of(i)), "");
  Dir d(::opendir(dir().c_str()));
  ASSERT_NE(d.get(), nullptr);
  std::map<std::string, int> seen;           // name -> times returned
  std::map<std::string, int> removed_round;  // name -> round it was unlinked in
  std::set<std::string> created;
  int next_new = kEntries;
  uint64_t rng = 12345;
  auto rand_below = [&](int n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((rng >> 33) % static_cast<uint64_t>(n));
  };
  bool done = false;
  for (int round = 0; !done; ++round) {
    ASSERT_LT(round, 10 * kEntries) << "readdir does not terminate";
    for (int k = 0; k < 37; ++k) {
      errno = 0;
      dirent* e = ::readdir(d.get());
      if (e == nullptr) {
        ASSERT_EQ(errno, 0) << "readdir failed";
        done = true;
        break;
      }
      const std::string n = e->d_name;
      if (dot(n)) continue;
      ++seen[n];
      auto r = removed_round.find(n);
      if (r != removed_round.end()) {
        EXPECT_GE(r->second, round)
            << n << " returned in round " << round << " although unlinked in round " << r->second;
      }
    }
    if (done) break;
    const long pos = ::telldir(d.get());
    ASSERT_NE(pos, -1);
    for (int k = 0; k < 20; ++k) {
      const std::string victim = name_of(rand_below(kEntries));
      if (removed_round.count(victim)) continue;
      ASSERT_OK(::unlinkat(dfd(), victim.c_str(), 0));
      removed_round[victim] = round;
    }
    for (int k = 0; k < 10; ++k) {
      const std::string n = name_of(next_new++);
      write_file(path(n), "");
      created.insert(n);
    }
    ::seekdir(d.get(), pos);
  }
  int survivors = 0;
  for (int i = 0; i < kEntries; ++i) {
    const std::string n = name_of(i);
    if (removed_round.count(n)) continue;
    ++survivors;
    EXPECT_EQ(seen[n], 1) << n << " existed throughout and must be returned exactly once";
  }
  for (const auto& [n, c] : seen) {
    EXPECT_LE(c, 1) << n << " returned " << c << " times";
    EXPECT_TRUE(n.rfind("entry", 0) == 0) << "unknown entry " << n;
  }
  EXPECT_GT(survivors, kEntries / 2);
  EXPECT_GT(removed_round.size(), 100u);
}

// The same property at the level of the filesystem's cookies, with another thread
// unlinking (and creating) while this one reads a few entries per getdents64 call.
TEST_F(DirTest, ConcurrentUnlinkAndCreateDuringReaddirKeepSurvivorsExactlyOnce) {
  constexpr int kEntries = 3000;
  for (int i = 0; i < kEntries; ++i) write_file(path(name_of(i)), "");
  Fd fd = xopen(dir(), O_RDONLY | O_DIRECTORY);
  std::atomic<bool> go{false};
  std::atomic<int> failures{0};
  std::thread churn([&] {
    while (!go.load(std::memory_order_acquire)) {
    }
    // Odd entries go away; new ones appear.
    for (int i = 1; i < kEntries; i += 2) {
      if (::unlinkat(dfd(), name_of(i).c_str(), 0) != 0) failures.fetch_add(1);
      const std::string n = "new" + std::to_string(i);
      const int c = ::openat(dfd(), n.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
      if (c < 0) {
        failures.fetch_add(1);
      } else {
        ::close(c);
      }
    }
  });
  std::map<std::string, int> seen;
  std::vector<RawEntry> batch;
  int read_error = 0;
  go.store(true, std::memory_order_release);
  for (;;) {
    batch.clear();
    const ssize_t n = getdents_once(fd.get(), 512, &batch);
    if (n < 0) read_error = errno;
    if (n <= 0) break;
    for (const RawEntry& e : batch) ++seen[e.name];
  }
  churn.join();
  ASSERT_EQ(read_error, 0) << "getdents64: " << std::strerror(read_error);
  EXPECT_EQ(failures.load(), 0);
  for (int i = 0; i < kEntries; i += 2) {
    EXPECT_EQ(seen[name_of(i)], 1) << name_of(i) << " was never touched";
  }
  for (const auto& [n, c] : seen) EXPECT_EQ(c, 1) << n;
  EXPECT_EQ(list_dir(dir()).size(), static_cast<size_t>(kEntries));
}

// A cookie from one open directory resumes the listing in another open of it, after
// entries were removed and added in between: what NFS export and FUSE readdir rely on.
TEST_F(DirTest, GetdentsCookiesStayValidAcrossOpensAndChanges) {
  constexpr int kEntries = 600;
  for (int i = 0; i < kEntries; ++i) write_file(path(name_of(i)), "");
  std::map<std::string, int> seen;
  std::set<std::string> removed;
  off_t cookie = 0;
  for (int round = 0;; ++round) {
    ASSERT_LT(round, 10 * kEntries);
    Fd fd = xopen(dir(), O_RDONLY | O_DIRECTORY);
    ASSERT_EQ(::lseek(fd.get(), cookie, SEEK_SET), cookie);
    std::vector<RawEntry> batch;
    const ssize_t n = getdents_once(fd.get(), 400, &batch);
    ASSERT_GE(n, 0) << std::strerror(errno);
    if (n == 0) break;
    for (const RawEntry& e : batch) {
      ++seen[e.name];
      EXPECT_FALSE(removed.count(e.name)) << e.name << " returned after it was unlinked";
    }
    cookie = batch.back().off;
    EXPECT_GE(cookie, 0) << "directory cookies must fit 63 bits";
    // Between calls, remove a few entries (read and unread) and add some.
    for (int k = 0; k < 3; ++k) {
      const std::string victim = name_of((round * 7 + k * 211) % kEntries);
      if (removed.insert(victim).second) xunlink(path(victim));
    }
    write_file(path("late" + std::to_string(round)), "");
  }
  for (int i = 0; i < kEntries; ++i) {
    if (removed.count(name_of(i))) continue;
    EXPECT_EQ(seen[name_of(i)], 1) << name_of(i);
  }
  for (const auto& [n, c] : seen) EXPECT_EQ(c, 1) << n;
}

TEST_F(DirTest, DirectoryEmptiedOfManyEntriesListsNothingAndCanBeRemoved) {
  xmkdir(path("d"));
  for (int i = 0; i < 1000; ++i) write_file(path("d/" + name_of(i)), "");
  EXPECT_EQ(list_dir(path("d")).size(), 1000u);
  EXPECT_ERRNO(ENOTEMPTY, ::rmdir(path("d").c_str()));
  for (int i = 0; i < 1000; ++i) xunlink(path("d/" + name_of(i)));
  EXPECT_EQ(list_dir(path("d")), std::vector<std::string>{});
  EXPECT_OK(::rmdir(path("d").c_str()));
}

TEST_F(DirTest, DotDotFollowsTheDirectoryWhenItMoves) {
  xmkdir(path("a"));
  xmkdir(path("b"));
  xmkdir(path("a/child"));
  EXPECT_EQ(xstat(path("a/child/..")).st_ino, xstat(path("a")).st_ino);
  ASSERT_OK(::rename(path("a/child").c_str(), path("b/child").c_str()));
  EXPECT_EQ(xstat(path("b/child/..")).st_ino, xstat(path("b")).st_ino);
  Dir d(::opendir(path("b/child").c_str()));
  ASSERT_NE(d.get(), nullptr);
  bool found = false;
  while (dirent* e = ::readdir(d.get())) {
    if (std::string(e->d_name) == "..") {
      found = true;
      EXPECT_EQ(e->d_ino, xstat(path("b")).st_ino) << "readdir's .. after the move";
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace warpfs::posix_test
