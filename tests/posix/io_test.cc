// read/write and friends: O_APPEND, O_TRUNC, O_EXCL, pread/pwrite at any offset, a model
// check of random writes, sparse files (past 4 GiB too), SEEK_DATA/SEEK_HOLE, fallocate and
// hole punching, fsync/fdatasync, and mmap coherence with read()/write().
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using IoTest = PosixTest;

constexpr off_t kKiB = 1024;
constexpr off_t kMiB = 1024 * kKiB;
constexpr off_t kGiB = 1024 * kMiB;

bool all_zero(std::string_view s) {
  return s.find_first_not_of('\0') == std::string_view::npos;
}

TEST_F(IoTest, AppendAlwaysWritesAtTheEnd) {
  write_file(path("f"), "start");
  Fd a = xopen(path("f"), O_WRONLY | O_APPEND);
  Fd b = xopen(path("f"), O_WRONLY | O_APPEND);
  ASSERT_EQ(::lseek(a.get(), 0, SEEK_SET), 0);
  ASSERT_EQ(::write(a.get(), "-a1", 3), 3);
  EXPECT_EQ(::lseek(a.get(), 0, SEEK_CUR), 8) << "the offset moves to the new end";
  ASSERT_EQ(::write(b.get(), "-b1", 3), 3);
  ASSERT_EQ(::write(a.get(), "-a2", 3), 3);
  EXPECT_EQ(read_file(path("f")), "start-a1-b1-a2");
  // Linux appends even with pwrite on an O_APPEND descriptor (pwrite(2), BUGS).
  ASSERT_EQ(::pwrite(b.get(), "-p", 2, 0), 2);
  EXPECT_EQ(read_file(path("f")), "start-a1-b1-a2-p");
  // Someone else extending the file moves the end the next append writes at.
  {
    Fd plain = xopen(path("f"), O_WRONLY);
    pwrite_all(plain.get(), "0123456789", 100);
  }
  ASSERT_EQ(::write(a.get(), "!", 1), 1);
  EXPECT_EQ(xstat(path("f")).st_size, 111);
  EXPECT_EQ(pread_upto(xopen(path("f"), O_RDONLY).get(), 1, 110), "!");
}

TEST_F(IoTest, TruncOnOpenEmptiesTheFile) {
  write_file(path("f"), pattern(1, 100000));
  Fd fd = xopen(path("f"), O_RDWR | O_TRUNC);
  const struct stat st = xfstat(fd.get());
  EXPECT_EQ(st.st_size, 0);
  EXPECT_EQ(st.st_blocks, 0);
  char c;
  EXPECT_EQ(::read(fd.get(), &c, 1), 0);
  pwrite_all(fd.get(), "new", 0);
  fd.reset();
  EXPECT_EQ(read_file(path("f")), "new");
  // O_TRUNC on an empty file, and through a second open while the first is still open.
  Fd keep = xopen(path("f"), O_RDONLY);
  Fd again = xopen(path("f"), O_WRONLY | O_TRUNC);
  EXPECT_EQ(pread_upto(keep.get(), 10, 0), "");
}

TEST_F(IoTest, ExclCreatesOnlyOnce) {
  Fd first(::open(path("f").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644));
  ASSERT_TRUE(first.ok()) << std::strerror(errno);
  EXPECT_ERRNO(EEXIST, ::open(path("f").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644));
  xmkdir(path("d"));
  EXPECT_ERRNO(EEXIST, ::open(path("d").c_str(), O_CREAT | O_EXCL | O_RDONLY, 0644));
  // O_EXCL does not follow symlinks, dangling ones included.
  xsymlink("nowhere", path("dangling"));
  EXPECT_ERRNO(EEXIST, ::open(path("dangling").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644));
  EXPECT_FALSE(exists(path("nowhere")));
}

TEST_F(IoTest, PreadPwriteAtOffsetsDoNotMoveTheFileOffset) {
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  ASSERT_EQ(::lseek(fd.get(), 7, SEEK_SET), 7);
  std::string model;
  const std::pair<off_t, size_t> writes[] = {{0, 1},     {1, 4094},     {4095, 2}, {4097, 10000},
                                             {65535, 3}, {kMiB - 1, 2}, {3, 5}};
  for (const auto& [off, len] : writes) {
    const std::string data = pattern(static_cast<uint64_t>(off) + len, len);
    pwrite_all(fd.get(), data, off);
    if (model.size() < static_cast<size_t>(off) + len) model.resize(static_cast<size_t>(off) + len);
    model.replace(static_cast<size_t>(off), len, data);
    EXPECT_EQ(pread_upto(fd.get(), len, off), data) << "at " << off;
  }
  EXPECT_EQ(::lseek(fd.get(), 0, SEEK_CUR), 7);
  const std::string got = pread_upto(fd.get(), model.size() + 100, 0);
  EXPECT_EQ(got, model) << first_difference(got, model);
}

// fsx in miniature: a deterministic sequence of writes, truncates and reads of random sizes
// at random offsets, each checked against an in-memory model of the file.
TEST_F(IoTest, RandomWritesAndTruncatesMatchAModel) {
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  std::string model;
  uint64_t rng = 42;
  auto next = [&](uint64_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng % n;
  };
  for (int op = 0; op < 600; ++op) {
    const uint64_t kind = next(10);
    if (kind < 6) {
      const size_t len = 1 + next(20000);
      const off_t off = static_cast<off_t>(next(3 * kMiB));
      const std::string data = pattern(static_cast<uint64_t>(op), len);
      pwrite_all(fd.get(), data, off);
      if (model.size() < static_cast<size_t>(off) + len)
        model.resize(static_cast<size_t>(off) + len);
      model.replace(static_cast<size_t>(off), len, data);
    } else if (kind < 7) {
      const off_t size = static_cast<off_t>(next(3 * kMiB));
      ASSERT_OK(::ftruncate(fd.get(), size));
      model.resize(static_cast<size_t>(size));
    } else {
      const off_t off = static_cast<off_t>(next(model.size() + 1));
      const size_t len = 1 + next(30000);
      const std::string got = pread_upto(fd.get(), len, off);
      const std::string want = model.substr(static_cast<size_t>(off), len);
      ASSERT_EQ(got, want) << "op " << op << ": read " << len << " at " << off << ": "
                           << first_difference(got, want);
    }
    ASSERT_EQ(xfstat(fd.get()).st_size, static_cast<off_t>(model.size())) << "op " << op;
  }
  const std::string all = read_file(path("f"));
  EXPECT_EQ(all, model) << first_difference(all, model);
}

TEST_F(IoTest, ReadsAtAndPastTheEndAreShort) {
  write_file(path("f"), "0123456789");
  Fd fd = xopen(path("f"), O_RDONLY);
  char buf[32];
  EXPECT_EQ(::pread(fd.get(), buf, sizeof buf, 0), 10);
  EXPECT_EQ(::pread(fd.get(), buf, sizeof buf, 6), 4);
  EXPECT_EQ(::pread(fd.get(), buf, sizeof buf, 10), 0);
  EXPECT_EQ(::pread(fd.get(), buf, sizeof buf, 1000000), 0);
  ASSERT_EQ(::lseek(fd.get(), 0, SEEK_END), 10);
  EXPECT_EQ(::read(fd.get(), buf, sizeof buf), 0);
  ASSERT_EQ(::lseek(fd.get(), 100, SEEK_END), 110) << "seeking past the end is allowed";
  EXPECT_EQ(::read(fd.get(), buf, sizeof buf), 0);
  EXPECT_ERRNO(EINVAL, ::lseek(fd.get(), -11, SEEK_END));
  EXPECT_ERRNO(EINVAL, ::pread(fd.get(), buf, 1, -1));
}

TEST_F(IoTest, HolesReadAsZeroesAndCostNoSpace) {
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  pwrite_all(fd.get(), "X", kMiB + 3);
  ASSERT_OK(::fsync(fd.get()));
  const struct stat st = xfstat(fd.get());
  EXPECT_EQ(st.st_size, kMiB + 4);
  EXPECT_LE(st.st_blocks * 512, 64 * kKiB) << "a 1-byte write must not fill the hole";
  const std::string data = pread_upto(fd.get(), static_cast<size_t>(kMiB + 10), 0);
  ASSERT_EQ(data.size(), static_cast<size_t>(kMiB + 4));
  EXPECT_TRUE(all_zero(std::string_view(data).substr(0, static_cast<size_t>(kMiB + 3))));
  EXPECT_EQ(data.back(), 'X');
  // Writing into the middle of the hole leaves both sides of it zero.
  pwrite_all(fd.get(), "middle", 300 * kKiB + 17);
  const std::string around = pread_upto(fd.get(), 8192, 300 * kKiB);
  EXPECT_TRUE(all_zero(std::string_view(around).substr(0, 17)));
  EXPECT_EQ(around.substr(17, 6), "middle");
  EXPECT_TRUE(all_zero(std::string_view(around).substr(23)));
}

TEST_F(IoTest, SparseFileBeyondFourGiB) {
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  const std::string at5 = pattern(5, 4096 + 123);
  pwrite_all(fd.get(), at5, 5 * kGiB + 123);
  // Straddling the 32-bit boundary catches offsets truncated to 32 bits.
  const std::string straddle = pattern(4, 64);
  pwrite_all(fd.get(), straddle, 4 * kGiB - 32);
  ASSERT_OK(::fsync(fd.get()));
  const struct stat st = xfstat(fd.get());
  EXPECT_EQ(st.st_size, 5 * kGiB + 123 + 4096 + 123);
  EXPECT_LE(st.st_blocks * 512, kMiB);
  EXPECT_EQ(pread_upto(fd.get(), at5.size(), 5 * kGiB + 123), at5);
  EXPECT_EQ(pread_upto(fd.get(), straddle.size(), 4 * kGiB - 32), straddle);
  EXPECT_TRUE(all_zero(pread_upto(fd.get(), 4096, 0))) << "nothing leaked to offset 0";
  EXPECT_TRUE(all_zero(pread_upto(fd.get(), 4096, kGiB + 123)));
  EXPECT_TRUE(all_zero(pread_upto(fd.get(), 123, 5 * kGiB)));
  EXPECT_TRUE(all_zero(pread_upto(fd.get(), 65536, 4 * kGiB + 32)));
  // And back, through a fresh descriptor.
  fd.reset();
  Fd again = xopen(path("f"), O_RDONLY);
  EXPECT_EQ(pread_upto(again.get(), at5.size(), 5 * kGiB + 123), at5);
}

TEST_F(IoTest, SeekDataAndSeekHoleFindTheExtents) {
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  pwrite_all(fd.get(), pattern(1, 64 * kKiB), 0);
  pwrite_all(fd.get(), pattern(2, 64 * kKiB), kMiB);
  ASSERT_OK(::fsync(fd.get()));
  const int f = fd.get();
  EXPECT_EQ(::lseek(f, 0, SEEK_DATA), 0);
  EXPECT_EQ(::lseek(f, 0, SEEK_HOLE), 64 * kKiB);
  EXPECT_EQ(::lseek(f, 100, SEEK_HOLE), 64 * kKiB);
  EXPECT_EQ(::lseek(f, 64 * kKiB, SEEK_DATA), kMiB);
  EXPECT_EQ(::lseek(f, 500 * kKiB, SEEK_DATA), kMiB);
  EXPECT_EQ(::lseek(f, 500 * kKiB, SEEK_HOLE), 500 * kKiB) << "already in a hole";
  EXPECT_EQ(::lseek(f, kMiB, SEEK_HOLE), kMiB + 64 * kKiB) << "the end is a hole";
  EXPECT_EQ(::lseek(f, kMiB + 100, SEEK_DATA), kMiB + 100);
  EXPECT_ERRNO(ENXIO, ::lseek(f, kMiB + 64 * kKiB, SEEK_DATA));
  EXPECT_ERRNO(ENXIO, ::lseek(f, 10 * kMiB, SEEK_HOLE));
  // A trailing hole made by truncate.
  ASSERT_OK(::ftruncate(f, 4 * kMiB));
  EXPECT_EQ(::lseek(f, kMiB, SEEK_HOLE), kMiB + 64 * kKiB);
  EXPECT_ERRNO(ENXIO, ::lseek(f, kMiB + 64 * kKiB, SEEK_DATA));
  EXPECT_EQ(::lseek(f, 2 * kMiB, SEEK_HOLE), 2 * kMiB);
}

TEST_F(IoTest, FallocateAllocatesZeroes) {
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  ASSERT_OK(::fallocate(fd.get(), 0, 0, kMiB));
  struct stat st = xfstat(fd.get());
  EXPECT_EQ(st.st_size, kMiB);
  EXPECT_GE(st.st_blocks * 512, kMiB);
  EXPECT_TRUE(all_zero(pread_upto(fd.get(), static_cast<size_t>(kMiB), 0)));
  ASSERT_OK(::fallocate(fd.get(), FALLOC_FL_KEEP_SIZE, kMiB, kMiB));
  st = xfstat(fd.get());
  EXPECT_EQ(st.st_size, kMiB) << "KEEP_SIZE";
  EXPECT_GE(st.st_blocks * 512, 2 * kMiB);
  char c;
  EXPECT_EQ(::pread(fd.get(), &c, 1, kMiB), 0) << "nothing is readable past the size";
  // Data written into the allocated range reads back, the rest stays zero.
  pwrite_all(fd.get(), "data", 1000);
  const std::string head = pread_upto(fd.get(), 8192, 0);
  EXPECT_TRUE(all_zero(std::string_view(head).substr(0, 1000)));
  EXPECT_EQ(head.substr(1000, 4), "data");
  EXPECT_TRUE(all_zero(std::string_view(head).substr(1004)));
  EXPECT_ERRNO(EINVAL, ::fallocate(fd.get(), 0, 0, 0));
  EXPECT_ERRNO(EINVAL, ::fallocate(fd.get(), 0, -1, 10));
  Fd ro = xopen(path("f"), O_RDONLY);
  EXPECT_ERRNO(EBADF, ::fallocate(ro.get(), 0, 0, 4096));
}

TEST_F(IoTest, PunchHoleZeroesTheRangeAndFreesItsBlocks) {
  const std::string data = pattern(9, static_cast<size_t>(kMiB));
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  pwrite_all(fd.get(), data, 0);
  ASSERT_OK(::fsync(fd.get()));
  const blkcnt_t before = xfstat(fd.get()).st_blocks;
  ASSERT_OK(
      ::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 256 * kKiB, 512 * kKiB));
  ASSERT_OK(::fsync(fd.get()));
  const struct stat st = xfstat(fd.get());
  EXPECT_EQ(st.st_size, kMiB) << "KEEP_SIZE";
  EXPECT_LE(st.st_blocks * 512, before * 512 - 448 * kKiB) << "the punched blocks are freed";
  std::string want = data;
  want.replace(256 * kKiB, 512 * kKiB, std::string(512 * kKiB, '\0'));
  std::string got = pread_upto(fd.get(), static_cast<size_t>(kMiB), 0);
  EXPECT_EQ(got, want) << first_difference(got, want);
  EXPECT_EQ(::lseek(fd.get(), 0, SEEK_HOLE), 256 * kKiB);
  EXPECT_EQ(::lseek(fd.get(), 256 * kKiB, SEEK_DATA), 768 * kKiB);
  // An unaligned punch zeroes exactly its bytes.
  ASSERT_OK(::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1000, 8000));
  want.replace(1000, 8000, std::string(8000, '\0'));
  got = pread_upto(fd.get(), static_cast<size_t>(kMiB), 0);
  EXPECT_EQ(got, want) << first_difference(got, want);
  // Punching past the end changes nothing; punching without KEEP_SIZE is not allowed.
  ASSERT_OK(::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, kMiB, kMiB));
  EXPECT_EQ(xfstat(fd.get()).st_size, kMiB);
  EXPECT_ERRNO(EOPNOTSUPP, ::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE, 0, 4096));
}

TEST_F(IoTest, FsyncAndFdatasync) {
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  pwrite_all(fd.get(), pattern(3, 100000), 0);
  EXPECT_OK(::fdatasync(fd.get()));
  EXPECT_OK(::fsync(fd.get()));
  Fd ro = xopen(path("f"), O_RDONLY);
  EXPECT_OK(::fsync(ro.get()));
  Fd d = xopen(dir(), O_RDONLY | O_DIRECTORY);
  EXPECT_OK(::fsync(d.get()));
  EXPECT_OK(::syncfs(fd.get()));
  EXPECT_ERRNO(EBADF, ::fsync(-1));
  EXPECT_ERRNO(EBADF, ::fdatasync(12345));
  EXPECT_EQ(read_file(path("f")), pattern(3, 100000));
  Fd sync = xopen(path("g"), O_CREAT | O_WRONLY | O_SYNC, 0644);
  ASSERT_EQ(::write(sync.get(), "synchronous", 11), 11);
  EXPECT_EQ(read_file(path("g")), "synchronous");
}

TEST_F(IoTest, MmapSharedWritesAreSeenByRead) {
  constexpr size_t kLen = 3 * 4096 + 100;
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  ASSERT_OK(::ftruncate(fd.get(), kLen));
  void* m = ::mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(m, MAP_FAILED) << std::strerror(errno);
  const std::string data = pattern(77, kLen);
  std::memcpy(m, data.data(), kLen);
  EXPECT_OK(::msync(m, kLen, MS_SYNC));
  EXPECT_OK(::munmap(m, kLen));
  EXPECT_EQ(read_file(path("f")), data);
  EXPECT_EQ(xfstat(fd.get()).st_size, static_cast<off_t>(kLen)) << "mmap does not extend";
}

TEST_F(IoTest, WritesAreSeenThroughAnExistingMapping) {
  constexpr size_t kLen = 2 * 4096;
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  pwrite_all(fd.get(), std::string(kLen, 'a'), 0);
  void* m = ::mmap(nullptr, kLen, PROT_READ, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(m, MAP_FAILED) << std::strerror(errno);
  const auto* p = static_cast<const char*>(m);
  EXPECT_EQ(p[5000], 'a');
  pwrite_all(fd.get(), "written", 4999);
  EXPECT_EQ(std::string(p + 4999, 7), "written");
  ::munmap(m, kLen);
}

// O_DIRECT descriptors bypass the page cache (warpfs: FOPEN_DIRECT_IO); what they write must
// be what a cached descriptor reads next, whether it was open during the write (and had the
// pages cached) or opens afterwards, and what a cached descriptor wrote must be what they read.
TEST_F(IoTest, ODirectAndCachedDescriptorsSeeEachOthersWrites) {
  constexpr size_t kLen = 4 * 4096;
  write_file(path("f"), std::string(kLen, 'a'));
  EXPECT_EQ(read_file(path("f")), std::string(kLen, 'a'));  // its pages are cached now
  Fd cached = xopen(path("f"), O_RDWR);
  EXPECT_EQ(pread_upto(cached.get(), kLen, 0), std::string(kLen, 'a'));
  void* map = ::mmap(nullptr, kLen, PROT_READ, MAP_SHARED, cached.get(), 0);
  ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);
  const auto* mapped = static_cast<const char*>(map);
  EXPECT_EQ(mapped[4096], 'a');  // the page is mapped now
  Fd direct = xopen(path("f"), O_RDWR | O_DIRECT);
  AlignedBuffer aligned = aligned_buffer(kLen);
  char* buf = aligned.get();
  std::memset(buf, 'b', 4096);
  ASSERT_EQ(::pwrite(direct.get(), buf, 4096, 4096), 4096) << std::strerror(errno);
  EXPECT_EQ(pread_upto(cached.get(), 3 * 4096, 0),
            std::string(4096, 'a') + std::string(4096, 'b') + std::string(4096, 'a'))
      << "a descriptor open during the direct write";
  EXPECT_EQ(std::string(mapped + 4096, 4096), std::string(4096, 'b'))
      << "a mapping made before the direct write (no read() to revalidate it)";
  ::munmap(map, kLen);
  cached.reset();
  std::memset(buf, 'c', 4096);
  ASSERT_EQ(::pwrite(direct.get(), buf, 4096, 2 * 4096), 4096) << std::strerror(errno);
  EXPECT_EQ(read_file(path("f")), std::string(4096, 'a') + std::string(4096, 'b') +
                                      std::string(4096, 'c') + std::string(4096, 'a'))
      << "a descriptor opened after the direct write";
  {
    Fd writer = xopen(path("f"), O_WRONLY);
    pwrite_all(writer.get(), std::string(4096, 'd'), 3 * 4096);
  }
  ASSERT_EQ(::pread(direct.get(), buf, kLen, 0), static_cast<ssize_t>(kLen));
  EXPECT_EQ(std::string(buf + 3 * 4096, 4096), std::string(4096, 'd'))
      << "a direct read after a cached write";
  EXPECT_EQ(std::string(buf + 4096, 4096), std::string(4096, 'b'));
}

// Linux AIO (io_submit): the asynchronous O_DIRECT path, where the write completes after
// io_submit has returned.
class Aio {
 public:
  Aio() { ok_ = syscall(SYS_io_setup, 4, &ctx_) == 0; }
  ~Aio() {
    if (ok_) syscall(SYS_io_destroy, ctx_);
  }
  bool ok() const { return ok_; }
  // Writes and waits for the completion; its result (bytes or -errno).
  long pwrite(int fd, const void* buf, size_t n, off_t off) {
    iocb cb{};
    cb.aio_fildes = static_cast<uint32_t>(fd);
    cb.aio_lio_opcode = IOCB_CMD_PWRITE;
    cb.aio_buf = reinterpret_cast<uint64_t>(buf);
    cb.aio_nbytes = n;
    cb.aio_offset = off;
    iocb* list[1] = {&cb};
    if (syscall(SYS_io_submit, ctx_, 1, list) != 1) return -errno;
    io_event ev{};
    if (syscall(SYS_io_getevents, ctx_, 1, 1, &ev, nullptr) != 1) return -errno;
    return static_cast<long>(ev.res);
  }

 private:
  aio_context_t ctx_ = 0;
  bool ok_ = false;
};

// Coherence under concurrency: another process reads with the page cache, keeping the file's
// pages cached and re-reading them from a second thread all the while; once an O_DIRECT
// write (asynchronous through io_submit, or a plain pwrite) has returned, the reader's next
// read() and its mapping show the new bytes, every time.
TEST_F(IoTest, BufferedReaderInAnotherProcessSeesEachDirectWriteOnceItReturns) {
  constexpr size_t kBlocks = 16, kLen = kBlocks * 4096;
  write_file(path("f"), std::string(kLen, 'a'));
  int ask[2], tell[2];
  ASSERT_EQ(::pipe(ask), 0);
  ASSERT_EQ(::pipe(tell), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The reader: for each (block, byte) asked, a read() and the mapping must show it.
    ::close(ask[1]);
    ::close(tell[0]);
    const int fd = ::open(path("f").c_str(), O_RDONLY);
    void* map = fd < 0 ? MAP_FAILED : ::mmap(nullptr, kLen, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) _exit(2);
    std::atomic<bool> stop{false};
    std::thread hammer([&] {  // keeps every page cached and being refilled
      std::string b(kLen, '\0');
      while (!stop.load()) (void)::pread(fd, b.data(), kLen, 0);
    });
    int status = 0;
    unsigned char q[2];
    while (::read(ask[0], q, 2) == 2) {
      std::string b(4096, '\0');
      const bool read_ok = ::pread(fd, b.data(), 4096, q[0] * 4096) == 4096 &&
                           b == std::string(4096, static_cast<char>(q[1]));
      const bool map_ok = static_cast<const unsigned char*>(map)[q[0] * 4096 + 17] == q[1];
      const char a = read_ok && map_ok ? 'y' : !read_ok ? 'r' : 'm';
      if (a != 'y') status = 1;
      if (::write(tell[1], &a, 1) != 1) break;
    }
    stop = true;
    hammer.join();
    _exit(status);
  }
  ::close(ask[0]);
  ::close(tell[1]);
  Fd direct = xopen(path("f"), O_RDWR | O_DIRECT);
  AlignedBuffer aligned = aligned_buffer(4096);
  Aio aio;
  ASSERT_TRUE(aio.ok()) << "io_setup: " << std::strerror(errno);
  int stale_reads = 0, stale_maps = 0;
  std::string stale_after;  // which writes: " async@17 sync@40"
  for (int i = 0; i < 300; ++i) {
    const unsigned char block = static_cast<unsigned char>((i * 7) % kBlocks);
    const unsigned char byte = static_cast<unsigned char>('b' + i % 20);
    std::memset(aligned.get(), byte, 4096);
    const long n = i % 2 ? aio.pwrite(direct.get(), aligned.get(), 4096, block * 4096)
                         : ::pwrite(direct.get(), aligned.get(), 4096, block * 4096);
    ASSERT_EQ(n, 4096) << (n < 0 ? std::strerror(static_cast<int>(-n)) : "short write") << " at "
                       << i;
    const unsigned char q[2] = {block, byte};
    ASSERT_EQ(::write(ask[1], q, 2), 2);
    char a = 0;
    ASSERT_EQ(::read(tell[0], &a, 1), 1);
    stale_reads += a == 'r';
    stale_maps += a == 'm';
    if (a != 'y') stale_after += std::string(i % 2 ? " async" : " sync") + "@" + std::to_string(i);
  }
  ::close(ask[1]);
  int st = 0;
  ::waitpid(child, &st, 0);
  ::close(tell[0]);
  EXPECT_EQ(stale_reads, 0) << "reads that returned the old contents after a direct write returned:"
                            << stale_after;
  EXPECT_EQ(stale_maps, 0) << "mappings that kept the old contents after a direct write returned:"
                           << stale_after;
}

// The times under concurrency: while another thread stats the file all along (its replies
// keep the attributes cached), each O_DIRECT write (asynchronous through io_submit, or a
// plain pwrite) moves the mtime, and once it has returned a stat shows that. Each round
// first sets the mtime far in the past, so a stat that shows it saw an attribute reply from
// before the write that stayed cached.
TEST_F(IoTest, StatAfterEachDirectWriteShowsItsTimesWhileAnotherThreadStats) {
  write_file(path("f"), std::string(16 * 4096, 'a'));
  Fd direct = xopen(path("f"), O_RDWR | O_DIRECT);
  AlignedBuffer aligned = aligned_buffer(4096);
  std::memset(aligned.get(), 'b', 4096);
  Aio aio;
  ASSERT_TRUE(aio.ok()) << "io_setup: " << std::strerror(errno);
  // One block written directly, through io_submit or pwrite: its result (bytes or -errno).
  auto write_block = [&](bool async, off_t at) {
    return async ? aio.pwrite(direct.get(), aligned.get(), 4096, at)
                 : ::pwrite(direct.get(), aligned.get(), 4096, at);
  };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> stats{0}, tries{0};
  const std::string f = path("f");
  std::thread hammer([&] {
    struct stat st {};
    while (!stop.load()) {
      if (::stat(f.c_str(), &st) == 0) stats.fetch_add(1);
      tries.fetch_add(1);
    }
  });
  // The rounds start once the other thread stats (on tmpfs all 400 take a few milliseconds).
  while (tries.load() == 0) std::this_thread::yield();
  int stale = 0;
  std::string stale_after;
  for (int i = 0; i < 400; ++i) {
    const timespec old[2] = {{1000 + i, 0}, {1000 + i, 0}};
    ASSERT_EQ(::futimens(direct.get(), old), 0) << std::strerror(errno);
    const off_t at = (i % 16) * 4096;
    const long n = write_block(i % 2, at);
    ASSERT_EQ(n, 4096) << (n < 0 ? std::strerror(static_cast<int>(-n)) : "short write") << " at "
                       << i;
    struct stat st {};
    ASSERT_EQ(::stat(f.c_str(), &st), 0);
    if (st.st_mtim.tv_sec == 1000 + i) {
      ++stale;
      stale_after += std::string(i % 2 ? " async" : " sync") + "@" + std::to_string(i);
    }
  }
  stop = true;
  hammer.join();
  EXPECT_GT(stats.load(), 0u);
  // Then without the other thread: several writes between two stats, so that the ones after
  // the first have no attribute reply to tell the kernel about (warpfs sends nothing then).
  for (int i = 0; i < 200; ++i) {
    const timespec old[2] = {{5000 + i, 0}, {5000 + i, 0}};
    ASSERT_EQ(::futimens(direct.get(), old), 0) << std::strerror(errno);
    struct stat st {};
    ASSERT_EQ(::stat(f.c_str(), &st), 0);
    ASSERT_EQ(st.st_mtim.tv_sec, 5000 + i) << "futimens did not set the mtime";
    for (int k = 0; k < 4; ++k) {
      const off_t at = ((i + k) % 16) * 4096;
      const long n = write_block(k % 2, at);
      ASSERT_EQ(n, 4096) << (n < 0 ? std::strerror(static_cast<int>(-n)) : "short write");
    }
    ASSERT_EQ(::stat(f.c_str(), &st), 0);
    if (st.st_mtim.tv_sec == 5000 + i) {
      ++stale;
      stale_after += " burst@" + std::to_string(i);
    }
  }
  EXPECT_EQ(stale, 0) << "stats that showed the mtime from before a direct write had returned:"
                      << stale_after;
}

TEST_F(IoTest, LargeSequentialRoundTripWithOddSizedChunks) {
  const std::string data = pattern(123, static_cast<size_t>(16 * kMiB + 4321));
  {
    Fd fd = xopen(path("f"), O_CREAT | O_WRONLY, 0644);
    size_t pos = 0;
    while (pos < data.size()) {
      const size_t n = std::min<size_t>(kMiB + 511, data.size() - pos);
      ASSERT_EQ(::write(fd.get(), data.data() + pos, n), static_cast<ssize_t>(n));
      pos += n;
    }
  }
  Fd fd = xopen(path("f"), O_RDONLY);
  std::string back;
  char buf[3001];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    ASSERT_GE(n, 0) << std::strerror(errno);
    if (n == 0) break;
    back.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(back.size(), data.size());
  EXPECT_TRUE(back == data) << first_difference(back, data);
}

// warpfs maps files with 32-bit logical block numbers: 16 TiB at most (fs/FORMAT.md).
TEST_F(IoTest, WarpfsRefusesWritesPastSixteenTiB) {
  if (!is_warpfs()) GTEST_SKIP() << "warpfs-only (WARPFS_TEST_FS=warpfs)";
  constexpr off_t k16TiB = off_t{16} << 40;
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  EXPECT_ERRNO(EFBIG, ::pwrite(fd.get(), "x", 1, k16TiB));
  EXPECT_ERRNO(EFBIG, ::ftruncate(fd.get(), k16TiB + 1));
  EXPECT_EQ(xfstat(fd.get()).st_size, 0);
}

}  // namespace
}  // namespace warpfs::posix_test
