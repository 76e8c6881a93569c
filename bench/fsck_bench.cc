// warpfs-bench-fsck: how long fsck takes on an image with many files, at several thread
// counts side by side (FsckOptions::threads: passes 1, 2 and 5 fan out to the workers).
//
// The image is built in-process through the Filesystem API on an emulated NVMe controller
// over a RAM store (commands run in the submitting thread: inline_io), mkfs'd with just
// enough inodes: --files empty regular files spread over directories of --per-dir files
// each. Then each thread count of --threads is timed --repeat times, interleaved (1, 2, 1,
// 2, ...) so that drift on a shared machine hits every count alike; fsck runs in check mode
// with -f (skip_if_clean off), and every run must find the image clean.
//
// Output: one JSON object per line on stdout (bench/README.md describes the keys):
//   {"bench":"fsck","phase":"build","files":1000000,"dirs":1000,"groups":31,...,"seconds":41.2}
//   {"bench":"fsck","files":1000000,"threads":2,"runs":3,"seconds":1.23,"min_seconds":1.2,
//    "speedup_vs_1":1.6}
// seconds is the median of the runs; speedup_vs_1 is the 1-thread median over this one
// (present when 1 is among --threads). A failure prints a message and exits 1.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "warpfs/blockdev/devices.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/fs/fsck.h"
#include "warpfs/fs/layout.h"
#include "warpfs/fs/mkfs.h"
#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/emulated.h"
#include "warpfs/nvme/io_engine.h"

using namespace warpfs;

namespace {

constexpr const char* kProgram = "warpfs-bench-fsck";

struct Options {
  uint64_t files = 1'000'000;
  uint64_t per_dir = 1000;
  uint64_t repeat = 3;
  std::vector<unsigned> threads{1, 2};
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kProgram, what.c_str());
  std::exit(1);
}

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "%s: %s (--help lists the options)\n", kProgram, what.c_str());
  std::exit(2);
}

void usage() {
  std::printf(
      "usage: %s [--files N] [--per-dir N] [--threads LIST] [--repeat R]\n"
      "  --files N       empty regular files in the image (default 1000000)\n"
      "  --per-dir N     files per directory (default 1000)\n"
      "  --threads LIST  fsck thread counts, comma-separated (default 1,2)\n"
      "  --repeat R      timed runs per thread count, interleaved (default 3)\n",
      kProgram);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error(a + " needs a value (or is unknown)");
    const std::string v = argv[++i];
    if (a == "--files") {
      if (!bench::parse_uint(v, 1, 100'000'000, &o.files)) usage_error("--files: " + v);
    } else if (a == "--per-dir") {
      if (!bench::parse_uint(v, 1, 1'000'000, &o.per_dir)) usage_error("--per-dir: " + v);
    } else if (a == "--repeat") {
      if (!bench::parse_uint(v, 1, 100, &o.repeat)) usage_error("--repeat: " + v);
    } else if (a == "--threads") {
      o.threads = bench::parse_uint_list(a, v, 0, 1024, usage_error);
    } else {
      usage_error("unknown option " + a);
    }
  }
  return o;
}

// The emulated controller, its engine and the namespace as a block device.
struct Device {
  std::unique_ptr<nvme::EmulatedTransport> transport;
  std::unique_ptr<nvme::Controller> ctrl;
  std::unique_ptr<nvme::IoEngine> engine;
  std::unique_ptr<blockdev::NvmeBlockDevice> dev;

  static Device open(uint64_t bytes) {
    Device d;
    std::string err;
    auto store = nvme::BackingStore::ram(bytes);
    if (!store) die("cannot map a RAM store of " + std::to_string(bytes) + " bytes");
    nvme::EmulatedConfig cfg;
    cfg.inline_io = true;  // two cores: no hand-off to a controller thread per command
    d.transport = nvme::EmulatedTransport::create(cfg, store, &err);
    if (d.transport) d.ctrl = nvme::Controller::open(*d.transport, nvme::ControllerOptions{}, &err);
    if (d.ctrl) d.engine = nvme::IoEngine::create(*d.ctrl, nvme::EngineOptions{}, &err);
    if (d.engine) d.dev = blockdev::NvmeBlockDevice::create(*d.engine, 1, fs::kBlockSize, &err);
    if (!d.dev) die("emulated device: " + err);
    return d;
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// mkfs with room for the files and directories, then the files through the core. Returns
// the block groups.
uint32_t build_image(blockdev::BlockDevice& dev, const Options& o, uint64_t dirs, uint64_t inodes) {
  fs::MkfsOptions mo;
  mo.inodes = inodes;
  mo.seed = 1;
  fs::Geometry g;
  std::string err;
  if (!fs::plan_geometry(dev.block_count(), mo, &g, &err)) die("mkfs: " + err);
  if (!fs::format(dev, mo, g, nullptr).is_ok()) die("mkfs: format failed");
  fs::MountOptions mount;
  mount.commit_interval_ms = 60'000;  // commits come from the journal filling up
  auto f = fs::Filesystem::mount(dev, mount, &err);
  if (!f) die("mount: " + err);
  uint64_t made = 0;
  for (uint64_t d = 0; d < dirs; ++d) {
    fs::Attr dir;
    if (int rc = f->mkdir(fs::kRootInode, "d" + std::to_string(d), 0755, fs::Caller{}, &dir))
      die("mkdir: errno " + std::to_string(rc));
    for (uint64_t i = 0; i < o.per_dir && made < o.files; ++i, ++made) {
      fs::Attr a;
      if (int rc = f->mknod(dir.ino, "f" + std::to_string(i), S_IFREG | 0644, 0, fs::Caller{}, &a))
        die("mknod: errno " + std::to_string(rc));
      f->forget(a.ino, 1);
    }
    f->forget(dir.ino, 1);
  }
  if (int rc = f->unmount()) die("unmount: errno " + std::to_string(rc));
  return g.group_count;
}

// One timed check; the image must be clean.
double time_fsck(blockdev::BlockDevice& dev, unsigned threads) {
  fs::FsckOptions o;
  o.threads = threads;
  std::string lines;
  const auto t0 = std::chrono::steady_clock::now();
  const fs::FsckResult r = fs::fsck(dev, o, [&](const std::string& s) { lines += s + "\n"; });
  const double s = seconds_since(t0);
  if (r.exit_code != fs::kFsckClean) {
    die("fsck at " + std::to_string(threads) + " threads exited " + std::to_string(r.exit_code) +
        ": " + r.error + "\n" + lines);
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const uint64_t dirs = fs::div_up(o.files, o.per_dir);
  const uint64_t inodes = o.files + dirs + 1024;  // the root, lost+found and some slack
  // A group holds at most 32768 inodes (one bitmap block): groups enough, plus one.
  const uint64_t room = fs::div_up(inodes, fs::kBlocksPerGroup) + 1;
  Device d = Device::open((room * fs::kBlocksPerGroup + 16384) * fs::kBlockSize);
  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t groups = build_image(*d.dev, o, dirs, inodes);
  std::printf("{\"bench\":\"fsck\",\"phase\":\"build\",\"files\":%" PRIu64 ",\"dirs\":%" PRIu64
              ",\"inodes\":%" PRIu64 ",\"groups\":%u,\"seconds\":%.3f}\n",
              o.files, dirs, inodes, groups, seconds_since(t0));
  std::fflush(stdout);
  std::map<unsigned, std::vector<double>> times;
  for (uint64_t r = 0; r < o.repeat; ++r) {
    for (unsigned t : o.threads) times[t].push_back(time_fsck(*d.dev, t));
  }
  const bool have_one = times.count(1) != 0;
  const double one = have_one ? median(times[1]) : 0;
  for (unsigned t : o.threads) {
    const std::vector<double>& v = times[t];
    const double m = median(v);
    std::printf("{\"bench\":\"fsck\",\"files\":%" PRIu64
                ",\"threads\":%u,\"runs\":%zu,"
                "\"seconds\":%.4f,\"min_seconds\":%.4f",
                o.files, t, v.size(), m, *std::min_element(v.begin(), v.end()));
    if (have_one) std::printf(",\"speedup_vs_1\":%.3f", one / m);
    std::printf("}\n");
  }
  return 0;
}
