// gpu::Volume's host side on the CPU: paths resolve through the filesystem core without
// following links, each file block maps to the device block that holds its data (checked
// against the image file read directly), holes and unwritten extents map to kHoleBlock, the
// image lock decides who may open, and a writer's close leaves a clean filesystem with the
// data and the times a writer would leave. GPU threads use exactly these maps
// (tests/gpu/gpu_volume_test.cu runs the same image on the GPU).
#include "warpfs/gpu/file_map.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "volume_image.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/gpu/host_volume.h"
#include "warpfs/nvme/emulated.h"

namespace warpfs::gpu::test {
namespace {

class FileMapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/warpfs-filemap-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    image_ = dir_ + "/image";
    ASSERT_EQ(make_test_image(image_, 64, 7, &files_), "");
  }
  void TearDown() override {
    ::unlink(image_.c_str());
    ::rmdir(dir_.c_str());
  }
  const TestFile& file(const std::string& path) const {
    for (const TestFile& f : files_)
      if (f.path == path) return f;
    static TestFile none;
    ADD_FAILURE() << "no test file " << path;
    return none;
  }
  // Every block of the map against the image read directly: data blocks hold the file's
  // bytes, holes are zeros in the file.
  void check_map(const MappedFile& m, const TestFile& f) const {
    ASSERT_EQ(m.size, f.data.size());
    ASSERT_EQ(m.blocks.size(), (f.data.size() + 4095) / 4096);
    EXPECT_EQ(m.holes, f.hole_blocks) << f.path;
    std::vector<uint8_t> b;
    for (uint64_t k = 0; k < m.blocks.size(); ++k) {
      const size_t n = std::min<size_t>(4096, f.data.size() - k * 4096);
      if (m.blocks[k] == kHoleBlock) {
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(f.data[k * 4096 + i], 0) << f.path << " block " << k;
        continue;
      }
      ASSERT_EQ(read_device_block(image_, m.blocks[k], &b), "");
      ASSERT_EQ(std::memcmp(b.data(), &f.data[k * 4096], n), 0) << f.path << " block " << k;
    }
  }
  std::string dir_, image_;
  std::vector<TestFile> files_;
};

TEST_F(FileMapTest, MapsEveryBlockToTheDataTheFileHolds) {
  std::string error;
  auto v = HostVolume::open(image_, false, &error);
  ASSERT_TRUE(v) << error;
  for (const TestFile& f : files_) {
    MappedFile m;
    ASSERT_EQ(v->map(f.path, false, &m, &error), 0) << error;
    check_map(m, f);
  }
  // The interleaved file is fragmented: nearly every block starts a new run.
  MappedFile m;
  ASSERT_EQ(v->map("/data/frag.bin", false, &m, &error), 0) << error;
  uint64_t breaks = 0;
  for (size_t k = 1; k < m.blocks.size(); ++k) breaks += m.blocks[k] != m.blocks[k - 1] + 1;
  EXPECT_GT(breaks, 200u);
  EXPECT_TRUE(v->close(false, &error)) << error;
}

TEST_F(FileMapTest, PathsResolveWithoutFollowingLinks) {
  std::string error;
  auto v = HostVolume::open(image_, false, &error);
  ASSERT_TRUE(v) << error;
  MappedFile m;
  EXPECT_EQ(v->map("/link", false, &m, &error), ELOOP);
  EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
  EXPECT_EQ(v->map("/data", false, &m, &error), EISDIR);
  EXPECT_EQ(v->map("/data/none", false, &m, &error), ENOENT);
  EXPECT_NE(error.find("/data/none"), std::string::npos) << error;
  EXPECT_EQ(v->map("/data/dense.bin/x", false, &m, &error), ENOTDIR);
  EXPECT_EQ(v->map("data/dense.bin", false, &m, &error), EINVAL);
  EXPECT_EQ(v->map("/data/dense.bin", true, &m, &error), EROFS);
  // Redundant slashes and dot-dot are names like any other.
  ASSERT_EQ(v->map("//data/../data//dense.bin", false, &m, &error), 0) << error;
  check_map(m, file("/data/dense.bin"));
}

TEST_F(FileMapTest, TheImageLockDecidesWhoOpens) {
  std::string error;
  auto r1 = HostVolume::open(image_, false, &error);
  ASSERT_TRUE(r1) << error;
  auto r2 = HostVolume::open(image_, false, &error);
  EXPECT_TRUE(r2) << "readers share the image: " << error;
  EXPECT_FALSE(HostVolume::open(image_, true, &error));
  EXPECT_NE(error.find(nvme::BackingStore::kImageBusy), std::string::npos) << error;
  r1.reset();
  r2.reset();
  auto w = HostVolume::open(image_, true, &error);
  ASSERT_TRUE(w) << error;
  EXPECT_FALSE(HostVolume::open(image_, false, &error));
  EXPECT_NE(error.find(nvme::BackingStore::kImageBusy), std::string::npos) << error;
  EXPECT_FALSE(HostVolume::open(dir_ + "/missing", false, &error));
  EXPECT_NE(error.find("missing"), std::string::npos) << error;
  EXPECT_FALSE(HostVolume::open(image_ + "," + image_, false, &error));
}

// A writer changes allocated blocks through the shared store (as the GPU's controller does)
// and closes: the core sees the data, the file's mtime moved, fsck finds nothing.
TEST_F(FileMapTest, AWritersCloseLeavesDataTimesAndACleanImage) {
  std::string error;
  std::vector<uint8_t> before;
  ASSERT_EQ(read_via_core(image_, "/data/holes.bin", &before), "");
  int64_t mtime0 = 0, other0 = 0;
  ASSERT_EQ(mtime_via_core(image_, "/data/holes.bin", &mtime0), "");
  ASSERT_EQ(mtime_via_core(image_, "/data/other.bin", &other0), "");
  {
    auto v = HostVolume::open(image_, true, &error);
    ASSERT_TRUE(v) << error;
    MappedFile m;
    ASSERT_EQ(v->map("/data/holes.bin", true, &m, &error), 0) << error;
    std::vector<uint8_t> block(4096, 0xa5);
    for (uint64_t k : {0ull, 25ull, 699ull}) {
      ASSERT_NE(m.blocks[k], kHoleBlock);
      ASSERT_TRUE(v->store()->write(m.blocks[k] * 4096, block.data(), 4096).is_ok());
      std::memset(&before[k * 4096], 0xa5, 4096);
    }
    ASSERT_TRUE(v->close(true, &error)) << error;
    EXPECT_TRUE(v->close(true, &error)) << "idempotent";
  }
  std::vector<uint8_t> after;
  ASSERT_EQ(read_via_core(image_, "/data/holes.bin", &after), "");
  EXPECT_TRUE(after == before);
  EXPECT_EQ(fsck_image(image_), "");
  // The file mapped writable got a writer's mtime; a file not mapped kept its own.
  int64_t mtime1 = 0, other1 = 0;
  ASSERT_EQ(mtime_via_core(image_, "/data/holes.bin", &mtime1), "");
  ASSERT_EQ(mtime_via_core(image_, "/data/other.bin", &other1), "");
  EXPECT_GT(mtime1, mtime0);
  EXPECT_EQ(other1, other0);
}

// A file that shares its blocks with another (a clone) and is mapped writable gets blocks of
// its own first: GPU writes into its map never reach the other file.
TEST_F(FileMapTest, AWritableMapOfACloneHasBlocksOfItsOwn) {
  std::string error;
  uint64_t shared = 0;
  ASSERT_EQ(clone_via_core(image_, "/data/dense.bin", "/data", "clone.bin", &shared), "");
  const TestFile& dense = file("/data/dense.bin");
  ASSERT_EQ(shared, (dense.data.size() + 4095) / 4096);  // every block of it
  {
    auto v = HostVolume::open(image_, true, &error);
    ASSERT_TRUE(v) << error;
    MappedFile c, d;
    ASSERT_EQ(v->map("/data/clone.bin", true, &c, &error), 0) << error;
    ASSERT_EQ(v->map("/data/dense.bin", false, &d, &error), 0) << error;
    std::set<uint64_t> theirs(d.blocks.begin(), d.blocks.end());
    uint64_t common = 0;
    for (uint64_t b : c.blocks) common += theirs.count(b);
    EXPECT_EQ(common, 0u);
    std::vector<uint8_t> block(4096, 0x5a);
    ASSERT_TRUE(v->store()->write(c.blocks[3] * 4096, block.data(), 4096).is_ok());
    ASSERT_TRUE(v->close(true, &error)) << error;
  }
  std::vector<uint8_t> got;
  ASSERT_EQ(read_via_core(image_, "/data/dense.bin", &got), "");
  EXPECT_TRUE(got == dense.data) << "the clone's write reached the original";
  ASSERT_EQ(read_via_core(image_, "/data/clone.bin", &got), "");
  std::vector<uint8_t> want = dense.data;
  std::memset(&want[3 * 4096], 0x5a, 4096);
  EXPECT_TRUE(got == want);
  EXPECT_EQ(fsck_image(image_), "");
}

// Readers in several threads, each with its own volume over the same image, map every file
// at once; all see the same maps (what a job's several processes would do).
TEST_F(FileMapTest, ConcurrentReadersMapTheSameBlocks) {
  std::string error;
  auto ref = HostVolume::open(image_, false, &error);
  ASSERT_TRUE(ref) << error;
  std::vector<MappedFile> want(files_.size());
  for (size_t i = 0; i < files_.size(); ++i)
    ASSERT_EQ(ref->map(files_[i].path, false, &want[i], &error), 0) << error;
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      std::string e;
      auto v = HostVolume::open(image_, false, &e);
      if (!v) {
        ++wrong;
        return;
      }
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < files_.size(); ++i) {
          MappedFile m;
          if (v->map(files_[i].path, false, &m, &e) != 0 || m.blocks != want[i].blocks) ++wrong;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace warpfs::gpu::test
