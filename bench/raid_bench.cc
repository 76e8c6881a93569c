// warpfs-bench-raid: what a RAID set of emulated namespaces gives over one namespace, at the
// block device (DeviceStack::open of "DEV,DEV,...", no cache): sequential 1 MiB and random
// (64 KiB by default, aligned to their size) reads and writes from several threads, over one
// namespace, RAID 0 over 2 and 4, and RAID 1 over 2 (read scaling: a mirrored read goes to one
// copy, picked by the stripe). Every namespace has the same latency and a media bandwidth limit
// (EmulatedConfig:: bandwidth_bytes_per_s): a device that is busy transferring costs no CPU, so on
// 2 cores the scaling a set gets from its members shows, and it is the devices' and not the host's.
// One JSON object per line; each set's line carries its ratio to one namespace measured in
// the same run.
//
//   warpfs-bench-raid [--seconds S] [--mb-s N] [--latency-us N] [--seq-threads N]
//                     [--rand-threads N] [--rand-kib N] [--size-mb N] [--configs LIST] [--dir D]
//
// Random transfers default to 64 KiB, not 4 KiB: on 2 cores a 4 KiB workload is bound by
// the host (about 26k commands/s per emulated controller here), which no set of devices
// changes; --rand-kib 4 measures that.
#include <getopt.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "warpfs/blockdev/stack.h"

namespace {

using namespace warpfs;
using Clock = std::chrono::steady_clock;

struct Options {
  double seconds = 2;
  uint64_t mb_s = 200;  // per namespace
  uint64_t latency_us = 50;
  uint64_t seq_threads = 4, rand_threads = 16;
  uint64_t rand_kib = 64;
  uint64_t size_mb = 256;  // per namespace
  std::vector<std::string> configs{"single", "raid0x2", "raid0x4", "raid1x2"};
  std::string dir = "/dev/shm";
};

void usage(FILE* f) {
  std::fprintf(f,
               "usage: warpfs-bench-raid [--seconds S] [--mb-s N] [--latency-us N] "
               "[--seq-threads N] [--rand-threads N] [--rand-kib N] [--size-mb N] [--configs LIST] "
               "[--dir D]\n"
               "  --seconds S       each workload on each configuration (default 2)\n"
               "  --mb-s N          each namespace's media bandwidth, MB/s (default 200)\n"
               "  --latency-us N    each namespace's command latency (default 50)\n"
               "  --seq-threads N   threads of the sequential 1 MiB workloads (default 4)\n"
               "  --rand-threads N  threads of the random workloads (default 16)\n"
               "  --rand-kib N      the random transfers' size, a power of two (default 64)\n"
               "  --size-mb N       each namespace's size (default 256)\n"
               "  --configs LIST    of single, raid0x2, raid0x4, raid1x2, raid10x4 (default\n"
               "                    single,raid0x2,raid0x4,raid1x2; single is always run)\n"
               "  --dir D           where the images go (default /dev/shm)\n");
}

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "warpfs-bench-raid: %s\n", why.c_str());
  usage(stderr);
  std::exit(2);
}

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "warpfs-bench-raid: %s\n", why.c_str());
  std::exit(1);
}

Options parse(int argc, char** argv) {
  Options o;
  static const option longs[] = {{"seconds", required_argument, nullptr, 's'},
                                 {"mb-s", required_argument, nullptr, 'b'},
                                 {"latency-us", required_argument, nullptr, 'l'},
                                 {"seq-threads", required_argument, nullptr, 'q'},
                                 {"rand-threads", required_argument, nullptr, 'r'},
                                 {"rand-kib", required_argument, nullptr, 'k'},
                                 {"size-mb", required_argument, nullptr, 'z'},
                                 {"configs", required_argument, nullptr, 'c'},
                                 {"dir", required_argument, nullptr, 'd'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", longs, nullptr)) != -1) {
    const std::string v = optarg ? optarg : "";
    auto num = [&](uint64_t lo, uint64_t hi) {
      uint64_t x = 0;
      if (!bench::parse_uint(v, lo, hi, &x)) usage_error("bad value '" + v + "'");
      return x;
    };
    switch (c) {
      case 's':
        if (!bench::parse_double(v, 0.1, 3600, &o.seconds)) usage_error("--seconds: '" + v + "'");
        break;
      case 'b':
        o.mb_s = num(1, 100000);
        break;
      case 'l':
        o.latency_us = num(0, 4'000'000);
        break;
      case 'q':
        o.seq_threads = num(1, 256);
        break;
      case 'r':
        o.rand_threads = num(1, 256);
        break;
      case 'k':
        o.rand_kib = num(4, 1024);
        if (o.rand_kib & (o.rand_kib - 1)) usage_error("--rand-kib: not a power of two");
        break;
      case 'z':
        o.size_mb = num(16, 1 << 20);
        break;
      case 'c':
        o.configs = bench::split_list(v);
        for (const std::string& k : o.configs) {
          if (k != "single" && k != "raid0x2" && k != "raid0x4" && k != "raid1x2" &&
              k != "raid10x4")
            usage_error("--configs: unknown configuration '" + k + "'");
        }
        break;
      case 'd':
        o.dir = v;
        break;
      case 'h':
        usage(stdout);
        std::exit(0);
      default:
        usage(stderr);
        std::exit(2);
    }
  }
  if (optind != argc) usage_error("unexpected argument '" + std::string(argv[optind]) + "'");
  return o;
}

struct Config {
  std::string name;
  int level = -1;  // -1: one namespace
  uint32_t members = 1;
};

Config config_of(const std::string& name) {
  if (name == "raid0x2") return {name, 0, 2};
  if (name == "raid0x4") return {name, 0, 4};
  if (name == "raid1x2") return {name, 1, 2};
  if (name == "raid10x4") return {name, 10, 4};
  return {"single", -1, 1};
}

struct Workload {
  const char* name;
  bool write, random;
};
constexpr Workload kWorkloads[] = {{"seq_read", false, false},
                                   {"seq_write", true, false},
                                   {"rand_read", false, true},
                                   {"rand_write", true, true}};

struct Result {
  double mb_s = 0, iops = 0;
};

// Threads at once until the time is up: sequential ones stream 1 MiB transfers over a slice
// of the device each, random ones rand_kib at uniform positions aligned to their size.
Result measure(blockdev::BlockDevice& d, const Workload& w, const Options& o) {
  const uint32_t n =
      static_cast<uint32_t>((w.random ? o.rand_kib << 10 : 1u << 20) / d.block_bytes());
  const uint64_t threads = w.random ? o.rand_threads : o.seq_threads;
  const uint64_t blocks = d.block_count();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ops{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> th;
  for (uint64_t t = 0; t < threads; ++t) {
    th.emplace_back([&, t] {
      void* buf = nullptr;
      const size_t bytes = size_t{n} * d.block_bytes();
      if (!d.alloc_io_buffer(bytes, &buf).is_ok()) {
        errors.fetch_add(1);
        return;
      }
      std::memset(buf, static_cast<int>(t), bytes);
      bench::Rng rng(t + 1);
      const uint64_t slice = blocks / threads / n * n;
      uint64_t next = t * slice, done = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        uint64_t b;
        if (w.random) {
          b = rng.below(blocks / n) * n;
        } else {
          b = next;
          next += n;
          if (next + n > (t + 1) * slice) next = t * slice;
        }
        const blockdev::Status s = w.write ? d.write(b, n, buf) : d.read(b, n, buf);
        if (!s.is_ok()) {
          errors.fetch_add(1);
          break;
        }
        ++done;
      }
      ops.fetch_add(done);
      d.free_io_buffer(buf, bytes);
    });
  }
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  stop = true;
  for (auto& x : th) x.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (errors.load() != 0) fail(std::string(w.name) + ": an I/O failed");
  Result r;
  r.iops = static_cast<double>(ops.load()) / secs;
  r.mb_s = r.iops * n * d.block_bytes() / 1e6;
  return r;
}

std::map<std::string, Result> run_config(const Config& c, const Options& o) {
  std::vector<std::string> images;
  for (uint32_t k = 0; k < c.members; ++k) {
    images.push_back(o.dir + "/warpfs-bench-raid-" + std::to_string(getpid()) + "-" +
                     std::to_string(k) + ".img");
    ::unlink(images.back().c_str());
  }
  blockdev::StackOptions so;
  so.create_bytes = o.size_mb << 20;
  so.cache_mb = 0;
  so.wait_for_release_s = 0;
  so.emulated.latency_ns = static_cast<uint32_t>(o.latency_us * 1000);
  so.emulated.bandwidth_bytes_per_s = o.mb_s * 1'000'000;
  so.emulated.volatile_write_cache = false;  // the media is the limit, not flushes
  so.emulated.inline_io = true;              // the submitting thread runs the command
  so.emulated.worker_threads = 1;            // posts the timed completions
  std::string list, err;
  for (const std::string& i : images) list += (list.empty() ? "" : ",") + ("emu:" + i);
  if (c.level >= 0) {
    blockdev::RaidCreate rc;
    rc.level = static_cast<uint32_t>(c.level);
    std::vector<std::string> devs;
    for (const std::string& i : images) devs.push_back("emu:" + i);
    if (!blockdev::create_raid_set(devs, rc, so, true, &err)) fail(c.name + ": " + err);
  }
  auto stack = blockdev::DeviceStack::open(list, so, &err);
  if (!stack) fail(c.name + ": " + err);
  std::map<std::string, Result> out;
  for (const Workload& w : kWorkloads) out[w.name] = measure(stack->device(), w, o);
  stack.reset();
  for (const std::string& i : images) ::unlink(i.c_str());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::vector<Config> configs{config_of("single")};
  for (const std::string& k : o.configs)
    if (k != "single") configs.push_back(config_of(k));
  std::map<std::string, Result> single;
  for (const Config& c : configs) {
    const std::map<std::string, Result> r = run_config(c, o);
    if (c.level < 0) single = r;
    for (const Workload& w : kWorkloads) {
      const Result& x = r.at(w.name);
      const Result& base = single.at(w.name);
      std::printf(
          "{\"bench\":\"raid\",\"config\":\"%s\",\"level\":%d,\"members\":%u,\"workload\":\"%s\","
          "\"threads\":%llu,\"transfer_kib\":%u,\"device_mb_s\":%llu,\"device_latency_us\":%llu,"
          "\"mb_s\":%.1f,\"iops\":%.0f,\"ratio_to_single\":%.3f}\n",
          c.name.c_str(), c.level, c.members, w.name,
          static_cast<unsigned long long>(w.random ? o.rand_threads : o.seq_threads),
          static_cast<unsigned>(w.random ? o.rand_kib : 1024),
          static_cast<unsigned long long>(o.mb_s), static_cast<unsigned long long>(o.latency_us),
          x.mb_s, x.iops, base.mb_s > 0 ? x.mb_s / base.mb_s : 0.0);
      std::fflush(stdout);
    }
  }
  return 0;
}
