// One directory with many entries (WARPFS_BIGDIR_COUNT, default 100,000): create them all,
// look a sample up by name, see every one exactly once in readdir, remove half and list
// again, remove the rest. Names vary in length so that directory blocks fill unevenly.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using BigDirTest = PosixTest;

int bigdir_count() {
  const char* env = std::getenv("WARPFS_BIGDIR_COUNT");
  if (env == nullptr || *env == '\0') return 100000;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 1 || n > 100'000'000) {
    throw std::runtime_error(std::string("WARPFS_BIGDIR_COUNT=") + env + " is not a count");
  }
  return static_cast<int>(n);
}

// Entry i's name: its number, then padding of 0..63 bytes that depends on it.
std::string big_name(int i) {
  std::string n = "e" + std::to_string(i) + "_";
  n.append(static_cast<size_t>((i * 2654435761u) >> 26), static_cast<char>('a' + i % 26));
  return n;
}

// The entry number in a name made by big_name, or -1.
int parse_big_name(const char* name) {
  int i = -1;
  int used = 0;
  if (std::sscanf(name, "e%d_%n", &i, &used) != 1 || used == 0) return -1;
  return big_name(i) == name ? i : -1;
}

// Reads the directory and counts how often each entry number appears; anything that is
// not an entry name, or "." and ".." appearing other than once, is a failure message.
std::string count_entries(const std::string& dir, std::vector<int>* seen) {
  Dir d(::opendir(dir.c_str()));
  if (d.get() == nullptr) return std::string("opendir: ") + std::strerror(errno);
  int dots = 0;
  errno = 0;
  while (dirent* e = ::readdir(d.get())) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) {
      ++dots;
    } else {
      const int i = parse_big_name(e->d_name);
      if (i < 0 || i >= static_cast<int>(seen->size())) {
        return std::string("unexpected entry ") + e->d_name;
      }
      ++(*seen)[static_cast<size_t>(i)];
    }
    errno = 0;
  }
  if (errno != 0) return std::string("readdir: ") + std::strerror(errno);
  if (dots != 2) return ". and .. appeared " + std::to_string(dots) + " times in all";
  return "";
}

TEST_F(BigDirTest, ManyEntriesInOneDirectory) {
  const int count = bigdir_count();
  xmkdir(path("big"));
  Fd big = xopen(path("big"), O_RDONLY | O_DIRECTORY);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    const int fd = ::openat(big.get(), big_name(i).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    ASSERT_GE(fd, 0) << "create " << big_name(i) << ": " << std::strerror(errno);
    ::close(fd);
  }
  const auto t1 = std::chrono::steady_clock::now();

  // Lookups by name: a sample of existing names and some that are not there.
  const int step = std::max(1, count / 1000);
  for (int i = 0; i < count; i += step) {
    struct stat st;
    ASSERT_OK(::fstatat(big.get(), big_name(i).c_str(), &st, 0)) << big_name(i);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_ERRNO(ENOENT, ::fstatat(big.get(), big_name(count + i).c_str(), &st, 0));
    EXPECT_ERRNO(ENOENT, ::fstatat(big.get(), (big_name(i) + "x").c_str(), &st, 0));
  }
  EXPECT_EQ(xstat(path("big")).st_nlink, 2u);

  std::vector<int> seen(static_cast<size_t>(count), 0);
  ASSERT_EQ(count_entries(path("big"), &seen), "");
  int wrong = 0;
  for (int i = 0; i < count; ++i) {
    if (seen[static_cast<size_t>(i)] != 1 && ++wrong <= 10) {
      ADD_FAILURE() << big_name(i) << " appeared " << seen[static_cast<size_t>(i)] << " times";
    }
  }
  EXPECT_EQ(wrong, 0) << "entries not seen exactly once";
  const auto t2 = std::chrono::steady_clock::now();

  // Remove every other entry, then list again.
  for (int i = 0; i < count; i += 2) {
    ASSERT_OK(::unlinkat(big.get(), big_name(i).c_str(), 0)) << big_name(i);
  }
  std::fill(seen.begin(), seen.end(), 0);
  ASSERT_EQ(count_entries(path("big"), &seen), "");
  wrong = 0;
  for (int i = 0; i < count; ++i) {
    if (seen[static_cast<size_t>(i)] != i % 2 && ++wrong <= 10) {
      ADD_FAILURE() << big_name(i) << " appeared " << seen[static_cast<size_t>(i)]
                    << " times after half were removed";
    }
  }
  EXPECT_EQ(wrong, 0);

  for (int i = 1; i < count; i += 2) {
    ASSERT_OK(::unlinkat(big.get(), big_name(i).c_str(), 0)) << big_name(i);
  }
  EXPECT_EQ(list_dir(path("big")), std::vector<std::string>{});
  big.reset();
  EXPECT_OK(::rmdir(path("big").c_str()));
  const auto t3 = std::chrono::steady_clock::now();
  auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
  RecordProperty("entries", count);
  std::printf("  %d entries: create %lld ms, lookups + readdir %lld ms, unlink + readdir %lld ms\n",
              count, static_cast<long long>(ms(t1 - t0)), static_cast<long long>(ms(t2 - t1)),
              static_cast<long long>(ms(t3 - t2)));
}

}  // namespace
}  // namespace warpfs::posix_test
