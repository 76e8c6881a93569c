// Several threads at once: creating, renaming and unlinking in the same and in different
// directories (the final listings must be exactly what the threads did), racing for one
// name (exactly one winner), link counts under concurrent link/unlink, and concurrent
// writers to different files, to disjoint ranges of one file (unaligned, so that two
// threads write into the same block) and through O_APPEND.
//
// Threads only make syscalls and record failures in their own slot; the checks run after
// join(), in the test's thread.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using ConcurrencyTest = PosixTest;

constexpr int kThreads = 8;

// Runs body(t) on kThreads threads released together; returns each thread's first error.
std::vector<std::string> run_threads(const std::function<std::string(int)>& body) {
  std::vector<std::string> errors(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      errors[t] = body(t);
    });
  }
  for (auto& th : threads) th.join();
  return errors;
}

std::string failed(const std::string& what, const std::string& name) {
  return what + " " + name + ": " + errno_name(errno);
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t t = 0; t < errors.size(); ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
}

std::string file_name(int t, int i) {
  return "t" + std::to_string(t) + "_" + std::to_string(i);
}

// Each thread creates its files in the shared directory, renames every third, unlinks
// every fifth (after the rename, under whichever name it then has).
TEST_F(ConcurrencyTest, CreateRenameUnlinkInOneDirectory) {
  constexpr int kPerThread = 300;
  const int d = dfd();
  const auto errors = run_threads([&](int t) -> std::string {
    for (int i = 0; i < kPerThread; ++i) {
      std::string n = file_name(t, i);
      const int fd = ::openat(d, n.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
      if (fd < 0) return failed("create", n);
      const std::string content = n;
      const bool wrote = ::write(fd, content.data(), content.size()) == ssize_t(content.size());
      ::close(fd);
      if (!wrote) return failed("write", n);
      if (i % 3 == 0) {
        const std::string to = n + "_renamed";
        if (::renameat(d, n.c_str(), d, to.c_str()) != 0) return failed("rename", n);
        n = to;
      }
      if (i % 5 == 0 && ::unlinkat(d, n.c_str(), 0) != 0) return failed("unlink", n);
    }
    return "";
  });
  expect_no_errors(errors);
  std::set<std::string> want;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      if (i % 5 == 0) continue;
      want.insert(file_name(t, i) + (i % 3 == 0 ? "_renamed" : ""));
    }
  }
  const std::set<std::string> got = list_dir_set(dir());
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "the listing differs from what the threads did";
  for (const std::string& n : want) {
    if (n.size() % 7 == 0) {
      EXPECT_EQ(read_file(path(n)), n.substr(0, n.find("_renamed"))) << n;
    }
  }
}

// Threads work in their own directories and move files into their neighbour's.
TEST_F(ConcurrencyTest, CreateAndMoveAcrossDirectories) {
  constexpr int kPerThread = 200;
  for (int t = 0; t < kThreads; ++t) xmkdir(path("d" + std::to_string(t)));
  const std::string base = dir();
  const auto errors = run_threads([&](int t) -> std::string {
    const std::string mine = base + "/d" + std::to_string(t) + "/";
    const std::string next = base + "/d" + std::to_string((t + 1) % kThreads) + "/";
    for (int i = 0; i < kPerThread; ++i) {
      const std::string n = file_name(t, i);
      const int fd = ::open((mine + n).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
      if (fd < 0) return failed("create", n);
      ::close(fd);
      if (i % 2 == 0 && ::rename((mine + n).c_str(), (next + n).c_str()) != 0) {
        return failed("move", n);
      }
      if (i % 8 == 1 && ::mkdir((mine + n + ".dir").c_str(), 0755) != 0) return failed("mkdir", n);
      if (i % 16 == 1 && ::rename((mine + n + ".dir").c_str(), (next + n + ".dir").c_str()) != 0) {
        return failed("move dir", n);
      }
    }
    return "";
  });
  expect_no_errors(errors);
  for (int t = 0; t < kThreads; ++t) {
    std::set<std::string> want;
    const int prev = (t + kThreads - 1) % kThreads;
    int subdirs = 0;
    for (int i = 0; i < kPerThread; ++i) {
      want.insert(i % 2 == 0 ? file_name(prev, i) : file_name(t, i));
      if (i % 8 == 1) {
        want.insert(i % 16 == 1 ? file_name(prev, i) + ".dir" : file_name(t, i) + ".dir");
        ++subdirs;
      }
    }
    const std::string d = path("d" + std::to_string(t));
    EXPECT_TRUE(list_dir_set(d) == want) << d;
    EXPECT_EQ(xstat(d).st_nlink, static_cast<nlink_t>(2 + subdirs)) << d;
  }
}

// All threads race to create the same names with O_EXCL, and to mkdir the same names:
// exactly one wins each, the others see EEXIST.
TEST_F(ConcurrencyTest, ExactlyOneExclusiveCreatorWinsEachName) {
  constexpr int kNames = 200;
  std::vector<std::atomic<int>> wins(kNames);
  std::vector<std::atomic<int>> dir_wins(kNames);
  const int d = dfd();
  const auto errors = run_threads([&](int t) -> std::string {
    for (int k = 0; k < kNames; ++k) {
      const int i = (k + t * 37) % kNames;  // threads start at different names
      const std::string n = "race" + std::to_string(i);
      const int fd = ::openat(d, n.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
      if (fd >= 0) {
        wins[i].fetch_add(1);
        const std::string id = std::to_string(t);
        if (::write(fd, id.data(), id.size()) != ssize_t(id.size())) return failed("write", n);
        ::close(fd);
      } else if (errno != EEXIST) {
        return failed("create", n);
      }
      const std::string dn = "racedir" + std::to_string(i);
      if (::mkdirat(d, dn.c_str(), 0755) == 0) {
        dir_wins[i].fetch_add(1);
      } else if (errno != EEXIST) {
        return failed("mkdir", dn);
      }
    }
    return "";
  });
  expect_no_errors(errors);
  for (int i = 0; i < kNames; ++i) {
    EXPECT_EQ(wins[i].load(), 1) << "race" << i;
    EXPECT_EQ(dir_wins[i].load(), 1) << "racedir" << i;
    EXPECT_EQ(read_file(path("race" + std::to_string(i))).size(), 1u);
  }
  EXPECT_EQ(list_dir(dir()).size(), static_cast<size_t>(2 * kNames));
}

// Threads rename their own files onto one shared name: the target ends up as exactly one
// of the sources, and every source name is gone.
TEST_F(ConcurrencyTest, RenamesOntoOneTargetLeaveExactlyOneWinner) {
  constexpr int kRounds = 100;
  const int d = dfd();
  const auto errors = run_threads([&](int t) -> std::string {
    for (int i = 0; i < kRounds; ++i) {
      const std::string n = file_name(t, i);
      const int fd = ::openat(d, n.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
      if (fd < 0) return failed("create", n);
      if (::write(fd, n.data(), n.size()) != ssize_t(n.size())) return failed("write", n);
      ::close(fd);
      if (::renameat(d, n.c_str(), d, "target") != 0) return failed("rename", n);
    }
    return "";
  });
  expect_no_errors(errors);
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{"target"});
  const std::string winner = read_file(path("target"));
  EXPECT_EQ(winner.substr(winner.find('_')), "_" + std::to_string(kRounds - 1))
      << "the last rename of some thread must have won: " << winner;
  EXPECT_EQ(xstat(path("target")).st_nlink, 1u);
}

// Concurrent link/unlink of one inode: the link count ends where it started.
TEST_F(ConcurrencyTest, LinkCountSurvivesConcurrentLinkAndUnlink) {
  write_file(path("f"), "x");
  const std::string f = path("f");
  const std::string base = dir();
  const auto errors = run_threads([&](int t) -> std::string {
    for (int i = 0; i < 200; ++i) {
      const std::string l = base + "/l" + std::to_string(t) + "_" + std::to_string(i % 5);
      if (::link(f.c_str(), l.c_str()) != 0) return failed("link", l);
      if (i % 5 == 4) {
        for (int k = 0; k < 5; ++k) {
          const std::string u = base + "/l" + std::to_string(t) + "_" + std::to_string(k);
          if (::unlink(u.c_str()) != 0) return failed("unlink", u);
        }
      }
    }
    return "";
  });
  expect_no_errors(errors);
  EXPECT_EQ(xstat(path("f")).st_nlink, 1u);
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{"f"});
}

TEST_F(ConcurrencyTest, WritersToDifferentFiles) {
  constexpr size_t kSize = 4 * 1024 * 1024 + 77;
  const std::string base = dir();
  const auto errors = run_threads([&](int t) -> std::string {
    const std::string p = base + "/w" + std::to_string(t);
    const std::string data = pattern(static_cast<uint64_t>(t), kSize);
    const int fd = ::open(p.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) return failed("create", p);
    // Chunks of a thread-dependent odd size, so that the writers are never in step.
    const size_t chunk = 4096 * static_cast<size_t>(t + 1) + 13;
    for (size_t off = 0; off < kSize; off += chunk) {
      const size_t n = std::min(chunk, kSize - off);
      if (::pwrite(fd, data.data() + off, n, static_cast<off_t>(off)) != ssize_t(n)) {
        ::close(fd);
        return failed("pwrite", p);
      }
    }
    ::close(fd);
    return "";
  });
  expect_no_errors(errors);
  for (int t = 0; t < kThreads; ++t) {
    const std::string got = read_file(path("w" + std::to_string(t)));
    const std::string want = pattern(static_cast<uint64_t>(t), kSize);
    EXPECT_TRUE(got == want) << "file " << t << ": " << first_difference(got, want);
  }
}

// Thread t writes stripes t, t + kThreads, ... of one file. The stripes are 1000 bytes, so
// neighbouring threads write different bytes of the same 4 KiB block at the same time: a
// read-modify-write of whole blocks without the right locking loses some of them.
TEST_F(ConcurrencyTest, WritersToDisjointRangesOfOneFile) {
  for (size_t stripe : {size_t{1000}, size_t{4096}, size_t{65536 + 3}}) {
    const size_t stripes = stripe < 4096 ? 8 * 256 : 8 * 16;
    const size_t size = stripe * stripes;
    Fd fd = xopen(path("shared"), O_CREAT | O_RDWR | O_TRUNC, 0644);
    const int f = fd.get();
    const std::string want = pattern(stripe, size);
    const auto errors = run_threads([&](int t) -> std::string {
      for (size_t s = static_cast<size_t>(t); s < stripes; s += kThreads) {
        const size_t off = s * stripe;
        if (::pwrite(f, want.data() + off, stripe, static_cast<off_t>(off)) != ssize_t(stripe)) {
          return failed("pwrite", std::to_string(off));
        }
      }
      return "";
    });
    expect_no_errors(errors);
    ASSERT_OK(::fsync(f));
    const std::string got = pread_upto(f, size + 1, 0);
    EXPECT_TRUE(got == want) << "stripe " << stripe << ": " << first_difference(got, want);
  }
}

// O_APPEND writers: every record lands whole, none overwrites another.
TEST_F(ConcurrencyTest, AppendersNeverOverwriteEachOther) {
  constexpr int kRecords = 500;
  constexpr size_t kRecordSize = 100;
  const std::string p = path("log");
  write_file(p, "");
  const auto errors = run_threads([&](int t) -> std::string {
    const int fd = ::open(p.c_str(), O_WRONLY | O_APPEND);
    if (fd < 0) return failed("open", p);
    for (int i = 0; i < kRecords; ++i) {
      std::string rec = "T" + std::to_string(t) + " R" + std::to_string(i) + " ";
      rec.resize(kRecordSize - 1, static_cast<char>('a' + t));
      rec.push_back('\n');
      if (::write(fd, rec.data(), rec.size()) != ssize_t(rec.size())) {
        ::close(fd);
        return failed("append", p);
      }
    }
    ::close(fd);
    return "";
  });
  expect_no_errors(errors);
  const std::string log = read_file(p);
  ASSERT_EQ(log.size(), kThreads * kRecords * kRecordSize);
  std::vector<int> next(kThreads, 0);
  for (size_t pos = 0; pos < log.size(); pos += kRecordSize) {
    const std::string rec = log.substr(pos, kRecordSize);
    int t = -1;
    int i = -1;
    ASSERT_EQ(std::sscanf(rec.c_str(), "T%d R%d ", &t, &i), 2) << "garbled record at " << pos;
    ASSERT_TRUE(t >= 0 && t < kThreads) << "at " << pos;
    EXPECT_EQ(i, next[t]) << "thread " << t << "'s records out of order at " << pos;
    next[t] = i + 1;
    EXPECT_EQ(rec.back(), '\n');
    EXPECT_EQ(rec[kRecordSize - 2], static_cast<char>('a' + t)) << "torn record at " << pos;
  }
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(next[t], kRecords) << "thread " << t;
}

}  // namespace
}  // namespace warpfs::posix_test
