// warpfs-bench-priority: what the metadata priority class buys. A metadata-heavy workload
// (create a small file, write 4 KiB, fsync: each fsync commits the journal, a metadata-class
// write and flush) runs beside streaming writers (1 MiB writes that bypass the cache as
// bulk-class commands) on one filesystem, in-process, over the emulated controller with
// weighted round robin arbitration (NVMe Base §4.13.2). Each round runs the same workload
// twice on fresh images, once with the metadata class honoured and once with every command
// in the bulk class (StackOptions::priorities), alternating which goes first; each prints a
// JSON line, and the pair prints the ratio of the metadata latencies (off / on: above 1
// means the class helps).
//
//   warpfs-bench-priority [--rounds N] [--seconds S] [--writers N] [--latency-us N] [--dir D]
#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/fs/mkfs.h"

namespace {

using namespace warpfs;
using Clock = std::chrono::steady_clock;

struct Options {
  uint64_t rounds = 3;
  double seconds = 3;
  uint64_t writers = 2;
  uint64_t latency_us = 10;
  std::string dir = "/dev/shm";
};

struct Result {
  std::vector<uint64_t> meta_ns;  // one create + write + fsync each
  uint64_t streamed_bytes = 0;
  double seconds = 0;
};

void usage(FILE* f) {
  std::fprintf(f,
               "usage: warpfs-bench-priority [--rounds N] [--seconds S] [--writers N] "
               "[--latency-us N] [--dir D]\n"
               "  --rounds N      pairs of runs, honoured and not, alternating first (default 3)\n"
               "  --seconds S     metadata workload per run (default 3)\n"
               "  --writers N     streaming writers beside it (default 2)\n"
               "  --latency-us N  the emulated device's latency (default 10)\n"
               "  --dir D         where the 2 GiB images go (default /dev/shm)\n");
}

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "warpfs-bench-priority: %s\n", why.c_str());
  usage(stderr);
  std::exit(2);
}

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "warpfs-bench-priority: %s\n", why.c_str());
  std::exit(1);
}

Options parse(int argc, char** argv) {
  Options o;
  static const option longs[] = {{"rounds", required_argument, nullptr, 'r'},
                                 {"seconds", required_argument, nullptr, 's'},
                                 {"writers", required_argument, nullptr, 'w'},
                                 {"latency-us", required_argument, nullptr, 'l'},
                                 {"dir", required_argument, nullptr, 'd'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "", longs, nullptr)) != -1;) {
    const std::string a = optarg ? optarg : "";
    bool ok = true;
    if (c == 'r') ok = bench::parse_uint(a, 1, 1000, &o.rounds);
    if (c == 's') ok = bench::parse_double(a, 0.1, 3600, &o.seconds);
    if (c == 'w') ok = bench::parse_uint(a, 0, 64, &o.writers);
    if (c == 'l') ok = bench::parse_uint(a, 0, 100000, &o.latency_us);
    if (c == 'd') o.dir = a;
    if (c == 'h') {
      usage(stdout);
      std::exit(0);
    }
    if (c == '?' || !ok) usage_error(c == '?' ? "bad option" : "bad value: " + a);
  }
  if (optind != argc) usage_error("unexpected argument: " + std::string(argv[optind]));
  return o;
}

uint64_t pct(std::vector<uint64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// A streaming writer: 1 MiB writes to its own file until `stop`, wrapping at 64 MiB.
void stream(fs::Filesystem& f, fs::Ino ino, const std::atomic<bool>& stop,
            std::atomic<uint64_t>* bytes) {
  std::vector<char> buf(1 << 20, 'w');
  for (uint64_t off = 0; !stop.load(std::memory_order_relaxed);
       off = (off + buf.size()) % (64 << 20)) {
    size_t n = 0;
    if (f.write(ino, off, buf.size(), buf.data(), &n) != 0) fail("streaming write failed");
    bytes->fetch_add(n, std::memory_order_relaxed);
  }
}

Result run(const Options& o, bool priorities, int round) {
  const std::string image = o.dir + "/warpfs-bench-priority-" + std::to_string(getpid()) + ".img";
  ::unlink(image.c_str());
  blockdev::StackOptions so;
  so.create_bytes = 2ull << 30;
  so.cache_mb = 64;
  so.block_bytes = fs::kBlockSize;
  so.priorities = priorities;
  so.emulated.latency_ns = static_cast<uint32_t>(o.latency_us * 1000);
  so.emulated.mdts = 5;  // 128 KiB: a 1 MiB write is eight bulk commands at once
  so.emulated.worker_threads = 1;
  // Writes reach the store as they complete: a Flush then costs nothing of its own, so what
  // is measured is where the commit's commands wait (behind the bulk ones, or not).
  so.emulated.volatile_write_cache = false;
  so.wait_for_release_s = 0;
  std::string err;
  auto stack = blockdev::DeviceStack::open("emu:" + image, so, &err);
  if (!stack) fail(err);
  fs::Geometry g;
  if (!fs::plan_geometry(stack->device().block_count(), fs::MkfsOptions{}, &g, &err)) fail(err);
  if (!fs::format(stack->device(), fs::MkfsOptions{}, g, nullptr).is_ok()) fail("mkfs failed");
  fs::MountOptions mo;
  mo.log = [](const std::string&) {};
  auto f = fs::Filesystem::mount(stack->device(), mo, &err);
  if (!f) fail(err);
  const fs::Caller root;
  std::vector<fs::Ino> files;
  for (uint64_t w = 0; w < o.writers; ++w) {
    fs::Attr a;
    if (f->mknod(fs::kRootInode, "stream" + std::to_string(w), 0100644, 0, root, &a) != 0)
      fail("create failed");
    files.push_back(a.ino);
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> streamed{0};
  std::vector<std::thread> th;
  for (fs::Ino ino : files) th.emplace_back(stream, std::ref(*f), ino, std::cref(stop), &streamed);
  Result r;
  std::vector<char> small(4096, 'm');
  const auto t0 = Clock::now();
  const auto until = t0 + std::chrono::duration<double>(o.seconds);
  for (int i = 0; Clock::now() < until; ++i) {
    const auto s = Clock::now();
    fs::Attr a;
    const std::string name = "m" + std::to_string(round) + "." + std::to_string(i);
    size_t n = 0;
    if (f->mknod(fs::kRootInode, name, 0100644, 0, root, &a) != 0 ||
        f->write(a.ino, 0, small.size(), small.data(), &n) != 0 || f->fsync(a.ino, false) != 0)
      fail("metadata operation failed");
    r.meta_ns.push_back(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - s).count()));
  }
  stop = true;
  for (auto& t : th) t.join();
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.streamed_bytes = streamed.load();
  if (f->unmount() != 0) fail("unmount failed");
  f.reset();
  stack.reset();
  ::unlink(image.c_str());
  return r;
}

void print(const Options& o, bool priorities, const Result& r) {
  std::printf(
      "{\"bench\":\"priority\",\"metadata_class\":%s,\"writers\":%llu,\"device_latency_us\":%llu,"
      "\"meta_ops\":%zu,\"meta_p50_us\":%.1f,\"meta_p99_us\":%.1f,\"stream_mb_s\":%.1f}\n",
      priorities ? "true" : "false", static_cast<unsigned long long>(o.writers),
      static_cast<unsigned long long>(o.latency_us), r.meta_ns.size(),
      static_cast<double>(pct(r.meta_ns, 0.5)) / 1e3,
      static_cast<double>(pct(r.meta_ns, 0.99)) / 1e3,
      static_cast<double>(r.streamed_bytes) / r.seconds / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  for (uint64_t k = 0; k < o.rounds; ++k) {
    Result on, off;
    if (k % 2 == 0) {
      on = run(o, true, static_cast<int>(k));
      off = run(o, false, static_cast<int>(k));
    } else {
      off = run(o, false, static_cast<int>(k));
      on = run(o, true, static_cast<int>(k));
    }
    print(o, true, on);
    print(o, false, off);
    const auto ratio = [](uint64_t a, uint64_t b) {
      return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b);
    };
    std::printf(
        "{\"bench\":\"priority\",\"ratio\":\"off/on\",\"round\":%llu,\"meta_p50_ratio\":%.2f,"
        "\"meta_p99_ratio\":%.2f,\"meta_ops_ratio\":%.2f}\n",
        static_cast<unsigned long long>(k), ratio(pct(off.meta_ns, 0.5), pct(on.meta_ns, 0.5)),
        ratio(pct(off.meta_ns, 0.99), pct(on.meta_ns, 0.99)),
        ratio(off.meta_ns.size(), on.meta_ns.size()));
    std::fflush(stdout);
  }
  return 0;
}
