#include "volume_image.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/fs/fsck.h"
#include "warpfs/fs/mkfs.h"
#include "warpfs/gpu/file_map.h"

namespace warpfs::gpu::test {

namespace {

std::unique_ptr<blockdev::DeviceStack> open_image(const std::string& image, uint64_t create,
                                                  std::string* error) {
  blockdev::StackOptions so;
  so.create_bytes = create;
  so.io_queues = 1;
  so.emulated.cache_in_store = true;
  so.wait_for_release_s = 0;
  return blockdev::DeviceStack::open(image, so, error);
}

// Creates `name` in `dir` and writes `data` at `off` pieces; returns the inode or 0.
int create_file(fs::Filesystem& f, fs::Ino dir, const std::string& name, fs::Ino* ino) {
  fs::Attr a;
  if (int rc = f.mknod(dir, name, S_IFREG | 0644, 0, fs::Caller{}, &a); rc) return rc;
  *ino = a.ino;
  return f.open(a.ino, O_RDWR);
}

int put(fs::Filesystem& f, fs::Ino ino, uint64_t off, const uint8_t* p, size_t n) {
  size_t done = 0;
  if (int rc = f.write(ino, off, n, reinterpret_cast<const char*>(p), &done); rc) return rc;
  return done == n ? 0 : EIO;
}

}  // namespace

std::string make_test_image(const std::string& image, uint64_t mib, uint64_t seed,
                            std::vector<TestFile>* files) {
  ::unlink(image.c_str());
  std::string error;
  auto stack = open_image(image, mib << 20, &error);
  if (!stack) return "open: " + error;
  fs::MkfsOptions mo;
  mo.seed = seed;
  fs::Geometry g;
  if (!fs::plan_geometry(stack->device().block_count(), mo, &g, &error)) return "mkfs: " + error;
  if (blockdev::Status s = fs::format(stack->device(), mo, g, nullptr); !s.is_ok())
    return "mkfs: " + s.to_string();
  fs::MountOptions mount;
  auto f = fs::Filesystem::mount(stack->device(), mount, &error);
  if (!f) return "mount: " + error;
  std::mt19937_64 rng(seed);
  const auto fail = [](const char* what, int rc) {
    return std::string(what) + ": " + std::strerror(rc);
  };
  fs::Attr d;
  if (int rc = f->mkdir(fs::kRootInode, "data", 0755, fs::Caller{}, &d); rc)
    return fail("mkdir", rc);
  files->clear();

  // dense.bin
  TestFile dense{"/data/dense.bin", std::vector<uint8_t>((6u << 20) + 1000), 0};
  for (size_t i = 0; i + 4 <= dense.data.size(); i += 4) {
    const uint32_t w = static_cast<uint32_t>(rng());
    std::memcpy(&dense.data[i], &w, 4);
  }
  fs::Ino ino = 0;
  if (int rc = create_file(*f, d.ino, "dense.bin", &ino); rc) return fail("dense.bin", rc);
  if (int rc = put(*f, ino, 0, dense.data.data(), dense.data.size()); rc) return fail("dense", rc);
  f->release(ino);
  files->push_back(std::move(dense));

  // holes.bin: written [0,10), [20,40), [48,700) blocks; size 768 blocks.
  TestFile holes{"/data/holes.bin", std::vector<uint8_t>(768u * 4096), 0};
  if (int rc = create_file(*f, d.ino, "holes.bin", &ino); rc) return fail("holes.bin", rc);
  const uint64_t ranges[][2] = {{0, 10}, {20, 40}, {48, 700}};
  for (const auto& r : ranges) {
    for (uint64_t b = r[0] * 4096; b < r[1] * 4096; ++b)
      holes.data[b] = static_cast<uint8_t>(rng());
    if (int rc = put(*f, ino, r[0] * 4096, &holes.data[r[0] * 4096], (r[1] - r[0]) * 4096); rc)
      return fail("holes", rc);
  }
  if (int rc = f->fallocate(ino, FALLOC_FL_KEEP_SIZE, 40 * 4096, 8 * 4096); rc)
    return fail("fallocate", rc);
  fs::SetAttr sz;
  sz.size = true;
  sz.new_size = holes.data.size();
  fs::Attr ignored;
  if (int rc = f->setattr(ino, sz, &ignored); rc) return fail("truncate", rc);
  holes.hole_blocks = 10 + 8 + (768 - 700);
  f->release(ino);
  files->push_back(std::move(holes));

  // frag.bin and other.bin, interleaved, last block first.
  TestFile frag{"/data/frag.bin", std::vector<uint8_t>(256u * 4096), 0};
  TestFile other{"/data/other.bin", std::vector<uint8_t>(256u * 4096), 0};
  for (auto& b : frag.data) b = static_cast<uint8_t>(rng());
  for (auto& b : other.data) b = static_cast<uint8_t>(rng());
  fs::Ino fi = 0, oi = 0;
  if (int rc = create_file(*f, d.ino, "frag.bin", &fi); rc) return fail("frag.bin", rc);
  if (int rc = create_file(*f, d.ino, "other.bin", &oi); rc) return fail("other.bin", rc);
  for (uint64_t k = 256; k-- > 0;) {
    if (int rc = put(*f, fi, k * 4096, &frag.data[k * 4096], 4096); rc) return fail("frag", rc);
    if (int rc = put(*f, oi, k * 4096, &other.data[k * 4096], 4096); rc) return fail("other", rc);
  }
  f->release(fi);
  f->release(oi);
  files->push_back(std::move(frag));
  files->push_back(std::move(other));

  TestFile empty{"/empty", {}, 0};
  if (int rc = create_file(*f, fs::kRootInode, "empty", &ino); rc) return fail("empty", rc);
  f->release(ino);
  files->push_back(std::move(empty));
  fs::Attr l;
  if (int rc = f->symlink(fs::kRootInode, "link", "/data/dense.bin", fs::Caller{}, &l); rc)
    return fail("symlink", rc);
  if (int rc = f->unmount(); rc) return fail("unmount", rc);
  return "";
}

std::string fsck_image(const std::string& image) {
  std::string error;
  auto stack = open_image(image, 0, &error);
  if (!stack) return "open: " + error;
  fs::FsckOptions o;
  o.threads = 1;
  fs::FsckResult r = fs::fsck(stack->device(), o, nullptr);
  if (r.exit_code == fs::kFsckClean) return "";
  std::string out = "fsck exit " + std::to_string(r.exit_code) + " " + r.error;
  for (const std::string& l : r.lines) out += "\n  " + l;
  return out;
}

// A read-only mount of the core on `image` and the attributes of `path` in it.
std::string mount_and_walk(const std::string& image, const std::string& path,
                           std::unique_ptr<blockdev::DeviceStack>* stack,
                           std::unique_ptr<fs::Filesystem>* f, fs::Attr* a) {
  std::string error;
  if (!(*stack = open_image(image, 0, &error))) return "open: " + error;
  fs::MountOptions mo;
  mo.read_only = true;
  if (!(*f = fs::Filesystem::mount((*stack)->device(), mo, &error))) return "mount: " + error;
  if (gpu::resolve_path(**f, path, a, &error) != 0) return error;
  return "";
}

std::string read_via_core(const std::string& image, const std::string& path,
                          std::vector<uint8_t>* out) {
  std::unique_ptr<blockdev::DeviceStack> stack;
  std::unique_ptr<fs::Filesystem> f;
  fs::Attr a;
  if (std::string e = mount_and_walk(image, path, &stack, &f, &a); !e.empty()) return e;
  out->assign(a.size, 0);
  if (int rc = f->open(a.ino, O_RDONLY); rc) return std::strerror(rc);
  size_t got = 0;
  int rc = a.size ? f->read(a.ino, 0, a.size, reinterpret_cast<char*>(out->data()), &got) : 0;
  f->release(a.ino);
  if (rc) return path + ": read: " + std::strerror(rc);
  if (got != a.size) return path + ": short read";
  return "";
}

std::string mtime_via_core(const std::string& image, const std::string& path, int64_t* ns) {
  std::unique_ptr<blockdev::DeviceStack> stack;
  std::unique_ptr<fs::Filesystem> f;
  fs::Attr a;
  if (std::string e = mount_and_walk(image, path, &stack, &f, &a); !e.empty()) return e;
  *ns = a.mtime.sec * 1'000'000'000 + a.mtime.nsec;
  return "";
}

std::string clone_via_core(const std::string& image, const std::string& from,
                           const std::string& dir, const std::string& name, uint64_t* shared) {
  std::string error;
  auto stack = open_image(image, 0, &error);
  if (!stack) return "open: " + error;
  fs::MountOptions mo;
  auto f = fs::Filesystem::mount(stack->device(), mo, &error);
  if (!f) return "mount: " + error;
  fs::Attr src, d, out;
  if (gpu::resolve_path(*f, from, &src, &error) != 0) return error;
  if (gpu::resolve_path(*f, dir, &d, &error) != 0) return error;
  if (int rc = f->mknod(d.ino, name, S_IFREG | 0644, 0, fs::Caller{}, &out); rc)
    return name + ": " + std::strerror(rc);
  uint64_t copied = 0;
  if (int rc = f->copy_file_range(src.ino, 0, out.ino, 0, src.size, &copied); rc)
    return "copy_file_range: " + std::string(std::strerror(rc));
  if (copied != src.size) return "copy_file_range: short";
  *shared = f->stats().shared_blocks;
  f->forget(out.ino, 1);
  if (int rc = f->unmount(); rc) return "unmount: " + std::string(std::strerror(rc));
  return "";
}

std::string read_device_block(const std::string& image, uint64_t block, std::vector<uint8_t>* out) {
  const int fd = ::open(image.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return image + ": " + std::strerror(errno);
  out->assign(4096, 0);
  const ssize_t n = ::pread(fd, out->data(), 4096, static_cast<off_t>(block * 4096));
  ::close(fd);
  return n == 4096 ? "" : image + ": short read at block " + std::to_string(block);
}

}  // namespace warpfs::gpu::test
