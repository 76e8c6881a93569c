// File handles: name_to_handle_at / open_by_handle_at (what NFS export, fanotify's
// FAN_REPORT_FID and backup tools use). A handle opens its file again, also once the kernel
// has dropped its caches (the filesystem decodes it then); a handle of a deleted file is
// ESTALE. open_by_handle_at needs CAP_DAC_READ_SEARCH: the suite runs as root.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using HandleTest = PosixTest;

struct Handle {
  std::vector<char> buf;
  int mount_id = 0;
  file_handle* get() { return reinterpret_cast<file_handle*>(buf.data()); }
};

// The handle of `p`, or an empty one (with errno) when the filesystem gives none.
Handle handle_of(const std::string& p, int flags = 0) {
  Handle h;
  h.buf.assign(sizeof(file_handle) + MAX_HANDLE_SZ, 0);
  h.get()->handle_bytes = MAX_HANDLE_SZ;
  if (::name_to_handle_at(AT_FDCWD, p.c_str(), h.get(), &h.mount_id, flags) != 0) h.buf.clear();
  return h;
}

// The kernel forgets every unused dentry and inode (FUSE: FORGET for each): a handle must
// then be decoded by the filesystem itself, not found in the kernel's cache.
bool drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "2\n";
  return static_cast<bool>(f);
}

TEST_F(HandleTest, AHandleOpensItsFileAgainAfterTheCachesAreDropped) {
  if (::geteuid() != 0) GTEST_SKIP() << "open_by_handle_at needs CAP_DAC_READ_SEARCH";
  write_file(path("f"), "through a handle");
  xmkdir(path("d"));
  write_file(path("d/g"), "in a directory");
  Handle hf = handle_of(path("f")), hd = handle_of(path("d")), hg = handle_of(path("d/g"));
  ASSERT_FALSE(hf.buf.empty()) << "name_to_handle_at: " << std::strerror(errno);
  ASSERT_FALSE(hd.buf.empty() || hg.buf.empty());
  Fd mount_fd = xopen(dir(), O_RDONLY | O_DIRECTORY);
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {
      ASSERT_TRUE(drop_caches()) << "cannot write /proc/sys/vm/drop_caches";
    }
    const int fd = ::open_by_handle_at(mount_fd.get(), hf.get(), O_RDONLY);
    ASSERT_GE(fd, 0) << "round " << round << ": " << std::strerror(errno);
    Fd f(fd);
    char buf[64] = {};
    ASSERT_EQ(::pread(f.get(), buf, sizeof buf, 0), 16);
    EXPECT_EQ(std::string(buf), "through a handle");
    const int dfd = ::open_by_handle_at(mount_fd.get(), hd.get(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(dfd, 0) << "directory, round " << round << ": " << std::strerror(errno);
    Fd d(dfd);
    struct stat st;
    ASSERT_EQ(::fstatat(d.get(), "g", &st, 0), 0) << "the directory's entries through its handle";
    EXPECT_EQ(st.st_size, 14);
    const int gfd = ::open_by_handle_at(mount_fd.get(), hg.get(), O_RDWR);
    ASSERT_GE(gfd, 0) << std::strerror(errno);
    ::close(gfd);
  }
}

TEST_F(HandleTest, TheHandleOfADeletedFileIsStale) {
  if (::geteuid() != 0) GTEST_SKIP() << "open_by_handle_at needs CAP_DAC_READ_SEARCH";
  write_file(path("gone"), "x");
  Handle h = handle_of(path("gone"));
  ASSERT_FALSE(h.buf.empty()) << std::strerror(errno);
  ASSERT_OK(::unlink(path("gone").c_str()));
  // Its number may be reused by the next file: the generation tells them apart.
  write_file(path("new"), "y");
  ASSERT_TRUE(drop_caches());
  Fd mount_fd = xopen(dir(), O_RDONLY | O_DIRECTORY);
  const int fd = ::open_by_handle_at(mount_fd.get(), h.get(), O_RDONLY);
  const int err = errno;
  if (fd >= 0) ::close(fd);
  EXPECT_EQ(fd, -1) << "a deleted file opened through its old handle";
  EXPECT_EQ(err, ESTALE) << std::strerror(err);
}

// Threads create, take handles of, delete and replace files while others decode old handles
// and the caches are dropped now and then: a handle opens its own file (its contents say
// which) or is stale, never another file that took over its inode number.
TEST_F(HandleTest, ConcurrentDecodesNeverOpenAnotherFile) {
  if (::geteuid() != 0) GTEST_SKIP() << "open_by_handle_at needs CAP_DAC_READ_SEARCH";
  constexpr int kThreads = 4, kRounds = 40;
  Fd mount_fd = xopen(dir(), O_RDONLY | O_DIRECTORY);
  std::atomic<int> wrong{0}, opened{0}, stale{0}, other{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<std::pair<Handle, std::string>> old;
      for (int k = 0; k < kRounds; ++k) {
        const std::string name = path("t" + std::to_string(t) + "_" + std::to_string(k));
        const std::string id = "file " + std::to_string(t) + "/" + std::to_string(k);
        write_file(name, id);
        Handle h = handle_of(name);
        if (h.buf.empty()) {
          other++;
          continue;
        }
        old.emplace_back(std::move(h), id);
        if (k % 2 == 0) ::unlink(name.c_str());
        if (t == 0 && k % 8 == 0) drop_caches();
        for (auto& [oh, oid] : old) {
          const int fd = ::open_by_handle_at(mount_fd.get(), oh.get(), O_RDONLY);
          if (fd < 0) {
            (errno == ESTALE ? stale : other)++;
            continue;
          }
          char buf[64] = {};
          const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
          ::close(fd);
          opened++;
          if (n < 0 || std::string(buf) != oid) wrong++;
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(wrong.load(), 0) << "a handle opened another file";
  EXPECT_EQ(other.load(), 0) << "errors other than ESTALE";
  EXPECT_GT(opened.load(), 0);
}

}  // namespace
}  // namespace warpfs::posix_test
