// gpu::Volume end to end on the GPU: a warpfs image with files written through the
// filesystem core (dense, with holes and an unwritten range, fragmented into an extent tree),
// read by GPU threads through file_array<T> and compared word for word with what the core
// reads; then GPU threads overwrite every 7th element of two files (holes included: those
// writes are dropped and counted), the volume closes, and the image checks clean with fsck
// and reads back through a fresh mount of the core exactly as the GPU wrote it. The cache is
// smaller than the files, so reads evict and writes are written back under load.
//
// Usage: gpu_volume_test [--small] [--keep DIR]    Exit: 0 passed, 1 failed, 77 no GPU.
//   --keep DIR: leaves the image as DIR/volume.img and each regular file's expected contents
//   as DIR/expected/NAME, so that a FUSE mount of the image can be compared with them
//   (scripts/gpu-run.sh's tests step does, where it has the daemon).
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gpu_test.cuh"
#include "volume_image.h"
#include "warpfs/gpu/volume.cuh"

namespace warpfs::gpu::test {
namespace {

template <typename T>
__global__ void read_all(file_array<T> a, uint64_t n, T* out) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = a.read(i);
}

// Every 7th element (i % 7 == 3) gets value(i); the writes of one warp to one block coalesce.
__global__ void write_sevenths(file_array<uint32_t> a, uint64_t n, uint32_t seed,
                               unsigned long long* ok) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (i % 7 != 3) continue;
    if (a.write(i, static_cast<uint32_t>(mix(seed ^ i)))) atomicAdd(ok, 1ull);
  }
}

template <typename T>
bool gpu_reads_equal(file_array<T>& a, const std::vector<uint8_t>& want, uint64_t* wrong) {
  const uint64_t n = a.size();
  if (n != want.size() / sizeof(T)) return false;
  // One past the end reads as zero too.
  T* d = nullptr;
  WARPFS_CUDA_CHECK(cudaMalloc(&d, (n + 1) * sizeof(T)));
  WARPFS_CUDA_CHECK(cudaMemset(d, 0xee, (n + 1) * sizeof(T)));
  read_all<<<120, 256>>>(a, n + 1, d);
  sync_or_die("read_all", 300);
  std::vector<T> got(n + 1);
  WARPFS_CUDA_CHECK(cudaMemcpy(got.data(), d, (n + 1) * sizeof(T), cudaMemcpyDeviceToHost));
  WARPFS_CUDA_CHECK(cudaFree(d));
  *wrong = 0;
  for (uint64_t i = 0; i < n; ++i) {
    T w;
    std::memcpy(&w, &want[i * sizeof(T)], sizeof(T));
    *wrong += got[i] != w;
  }
  *wrong += got[n] != T{};
  return *wrong == 0;
}

bool write_expected(const std::string& path, const std::vector<uint8_t>& data) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  return std::fclose(f) == 0 && ok;
}

int run(bool small, uint64_t seed, const std::string& keep) {
  Tally t;
  const std::string dir = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  const std::string image = keep.empty()
                                ? dir + "/warpfs-gpu-volume-" + std::to_string(::getpid()) + ".img"
                                : keep + "/volume.img";
  std::vector<TestFile> files;
  std::string e = make_test_image(image, 64, seed, &files);
  t.check(e.empty(), ("image made through the filesystem core " + e).c_str());
  if (!e.empty()) return 1;

  VolumeOptions o;
  o.rig.queues = small ? 1 : 4;
  o.rig.device_threads = small ? 1 : 2;
  o.cache.sets = small ? 32 : 128;  // 1 or 4 MiB: smaller than the files
  o.cache.ways = 8;
  {
    std::string error;
    auto v = Volume::open(image, o, &error);
    t.check(v != nullptr, ("read-only volume opened " + error).c_str());
    if (!v) return 1;
    for (const TestFile& f : files) {
      if (small && f.path == "/data/dense.bin") continue;
      file_array<uint32_t> a;
      const int rc = v->open_array(f.path, false, &a, &error);
      t.check(rc == 0, ("open_array " + f.path + " " + error).c_str());
      if (rc) continue;
      uint64_t wrong = 0;
      const bool ok = gpu_reads_equal(a, f.data, &wrong);
      t.check(ok, ("GPU threads read " + f.path + " as the core does (" + std::to_string(wrong) +
                   " of " + std::to_string(a.size()) + " words differ)")
                      .c_str());
    }
    if (!small) {
      file_array<uint64_t> a64;
      t.check(v->open_array("/data/dense.bin", false, &a64, &error) == 0, "open_array<u64>");
      uint64_t wrong = 0;
      t.check(gpu_reads_equal(a64, files[0].data, &wrong), "64-bit elements read the same bytes");
    }
    {  // The image lock: no writer beside a reader (the failed open unwinds cleanly).
      VolumeOptions wo = o;
      wo.writable = true;
      std::string werror;
      auto w = Volume::open(image, wo, &werror);
      t.check(w == nullptr && werror.find(nvme::BackingStore::kImageBusy) != std::string::npos,
              ("a writable volume beside a reader is refused: " + werror).c_str());
    }
    file_array<uint32_t> bad;
    t.check(v->open_array("/link", false, &bad, &error) == ELOOP, "a symlink is refused (ELOOP)");
    t.check(v->open_array("/data/holes.bin", true, &bad, &error) == EROFS,
            "writable array on a read-only volume refused (EROFS)");
    const GpuCacheStats s = v->cache().stats();
    t.check(s.errors == 0 && s.evictions > 0,
            ("no I/O errors, evictions " + std::to_string(s.evictions)).c_str());
    t.check(v->close(&error), ("read-only volume closed " + error).c_str());
  }

  // GPU threads overwrite holes.bin and frag.bin; dense.bin stays read-only in the same run.
  const uint32_t wseed = static_cast<uint32_t>(seed * 31 + 7);
  uint64_t expect_dropped = 0;
  std::vector<TestFile*> written;
  for (TestFile& f : files)
    if (f.path == "/data/holes.bin" || f.path == "/data/frag.bin") written.push_back(&f);
  {
    o.writable = true;
    std::string error;
    auto v = Volume::open(image, o, &error);
    t.check(v != nullptr, ("writable volume opened " + error).c_str());
    if (!v) return 1;
    unsigned long long* ok = nullptr;
    WARPFS_CUDA_CHECK(cudaMalloc(&ok, sizeof *ok));
    WARPFS_CUDA_CHECK(cudaMemset(ok, 0, sizeof *ok));
    uint64_t expect_ok = 0;
    for (TestFile* f : written) {
      file_array<uint32_t> a;
      t.check(v->open_array(f->path, true, &a, &error) == 0, ("writable " + f->path).c_str());
      write_sevenths<<<120, 256>>>(a, a.size(), wseed, ok);
      sync_or_die("write_sevenths", 300);
      // The model: what landed, and what a hole dropped (holes stay zeros).
      for (uint64_t i = 3; i < a.size(); i += 7) {
        const uint64_t block = i * 4 / 4096;
        const bool hole =
            f->path == "/data/holes.bin" &&
            ((block >= 10 && block < 20) || (block >= 40 && block < 48) || block >= 700);
        if (hole) {
          ++expect_dropped;
          continue;
        }
        ++expect_ok;
        const uint32_t w = static_cast<uint32_t>(mix(wseed ^ i));
        std::memcpy(&f->data[i * 4], &w, 4);
      }
    }
    // A read-only array in a writable volume drops its writes too.
    file_array<uint32_t> ro;
    t.check(v->open_array("/data/other.bin", false, &ro, &error) == 0, "read-only array");
    write_sevenths<<<1, 32>>>(ro, 64, wseed, ok);
    sync_or_die("write_sevenths ro", 60);
    expect_dropped += 9;  // i = 3, 10, ..., 59
    unsigned long long landed = 0;
    WARPFS_CUDA_CHECK(cudaMemcpy(&landed, ok, sizeof landed, cudaMemcpyDeviceToHost));
    WARPFS_CUDA_CHECK(cudaFree(ok));
    t.check(landed == expect_ok,
            ("writes that landed: " + std::to_string(landed) + " of " + std::to_string(expect_ok))
                .c_str());
    t.check(v->dropped_writes() == expect_dropped,
            ("writes dropped (holes, read-only): " + std::to_string(v->dropped_writes()) +
             ", expected " + std::to_string(expect_dropped))
                .c_str());
    t.check(v->close(&error), ("writable volume closed (write-back, NVMe Flush) " + error).c_str());
  }
  e = fsck_image(image);
  t.check(e.empty(), ("fsck clean after the GPU's writes " + e).c_str());
  for (const TestFile& f : files) {
    std::vector<uint8_t> got;
    e = read_via_core(image, f.path, &got);
    t.check(e.empty() && got == f.data,
            ("the core reads " + f.path + " as the GPU left it " + e).c_str());
  }
  if (keep.empty()) {
    ::unlink(image.c_str());
  } else {
    const std::string exp = keep + "/expected";
    ::mkdir(exp.c_str(), 0700);
    bool ok = true;
    for (const TestFile& f : files)
      ok &= write_expected(exp + f.path.substr(f.path.rfind('/')), f.data);
    t.check(ok, ("image and expected contents kept in " + keep).c_str());
  }
  return t.failed ? 1 : 0;
}

}  // namespace
}  // namespace warpfs::gpu::test

int main(int argc, char** argv) {
  using namespace warpfs::gpu::test;
  bool small = false;
  std::string keep;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--small") == 0) {
      small = true;
    } else if (std::strcmp(argv[i], "--keep") == 0 && i + 1 < argc) {
      keep = argv[++i];
    } else {
      std::fprintf(stderr, "usage: gpu_volume_test [--small] [--keep DIR]\n");
      return 2;
    }
  }
  require_gpu("gpu_volume_test");
  const uint64_t seed = 0x5eed0000ull + static_cast<uint64_t>(::getpid());
  const int failed = run(small, seed, keep);
  std::printf("gpu_volume_test: %s\n", failed ? "FAILED" : "passed");
  return failed;
}
