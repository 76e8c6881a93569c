// warpfs-bench-blockread: random 4 KiB reads, T threads each with one read in flight (T = 1:
// QD1 latency; T = 32: QD32 IOPS), from either
//   a DEVICE (emu:PATH, vfio:BDF, tcp:HOST:PORT/NQN[,ns=N]) through warpfs's own driver
//     (transport, Controller, IoEngine, NamespaceIo: what the filesystem uses), or
//   a PATH (a block device such as the kernel initiator's /dev/nvme0n2, or a file on any
//     filesystem), read with pread() and O_DIRECT.
// The reads fall in the first --span-mb MiB. bench/tcp-guest.sh runs it in the QEMU guest of
// tests/vfio/run-guest.sh tcp, beside the kernel's nvme-tcp initiator and through warpfs
// mounts.
//
// Output: one JSON object per line on stdout, per thread count: target, path ("driver" or
// "pread"), label, threads, ops, seconds, iops, MiB/s, latency mean/p50/p99/max in
// microseconds. A failed read aborts with a message naming it and exit status 1; bad options
// print the usage and exit 2.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/device.h"
#include "warpfs/nvme/io_engine.h"
#include "warpfs/nvme/namespace_io.h"
#include "warpfs/nvme/port.h"

namespace warpfs::bench {
namespace {

constexpr uint32_t kBlock = 4096;

struct Options {
  std::string target;
  std::string label;
  uint64_t span_mb = 32;
  double seconds = 5;
  std::vector<unsigned> threads{1, 32};
  // Emulated device only: commands run in the thread that rings the doorbell (the daemon's
  // default, EmulatedConfig::inline_io) or on the controller's own threads; I/O queue pairs
  // (the controller's threads: one per pair, as the daemon sets it; 0: the driver's default).
  bool inline_io = false;
  uint64_t queues = 0;
};

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr,
               "warpfs-bench-blockread: %s\n"
               "usage: warpfs-bench-blockread --target DEVICE|PATH [--label L] [--span-mb N]\n"
               "       [--seconds X] [--threads LIST] [--inline 0|1] [--queues N]\n"
               "  --target     emu:/vfio:/tcp: DEVICE (warpfs's driver) or a PATH (pread, "
               "O_DIRECT)\n"
               "  --label      a name for the JSON lines (default: the target)\n"
               "  --span-mb N  reads fall in the first N MiB (default 32)\n"
               "  --seconds X  measured seconds per thread count (default 5)\n"
               "  --threads L  thread counts, one read in flight each (default 1,32)\n"
               "  --inline B   emu: only: 1 runs each command in the thread that submits it,\n"
               "               as warpfs does (default 0: the controller's own threads)\n"
               "  --queues N   emu: only: I/O queue pairs, one controller thread each\n"
               "               (default: the driver's)\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") usage_error("usage");
    if (i + 1 >= argc) usage_error(a + " needs a value (or is unknown)");
    const std::string v = argv[++i];
    if (a == "--target") {
      o.target = v;
    } else if (a == "--label") {
      o.label = v;
    } else if (a == "--span-mb") {
      if (!parse_uint(v, 1, 1 << 20, &o.span_mb)) usage_error("--span-mb: '" + v + "'");
    } else if (a == "--seconds") {
      if (!parse_double(v, 0.01, 3600, &o.seconds)) usage_error("--seconds: '" + v + "'");
    } else if (a == "--threads") {
      o.threads = parse_uint_list("--threads", v, 1, 256, usage_error);
    } else if (a == "--inline") {
      uint64_t b = 0;
      if (!parse_uint(v, 0, 1, &b)) usage_error("--inline: '" + v + "'");
      o.inline_io = b != 0;
    } else if (a == "--queues") {
      if (!parse_uint(v, 1, 64, &o.queues)) usage_error("--queues: '" + v + "'");
    } else {
      usage_error("unknown option " + a);
    }
  }
  if (o.target.empty()) usage_error("--target is required");
  if (o.label.empty()) o.label = o.target;
  return o;
}

// One reader: reads block `b` into its buffer; false with a message on failure.
using ReadFn = std::function<bool(unsigned thread, uint64_t block, std::string* err)>;

void run_point(const Options& o, const char* path, unsigned threads, uint64_t blocks,
               const ReadFn& read) {
  std::atomic<bool> stop{false};
  Failure failure;
  std::vector<LatencyLog> logs(threads);
  std::vector<std::thread> ts;
  const uint64_t start = port::now_ns();
  for (unsigned t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      Rng rng(t + 1);
      std::string err;
      while (!stop.load(std::memory_order_relaxed) && !failure.failed()) {
        const uint64_t b = rng.below(blocks);
        const uint64_t t0 = port::now_ns();
        if (!read(t, b, &err)) {
          failure.report(err);
          return;
        }
        logs[t].add(port::now_ns() - t0);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));  // the measured span
  stop.store(true);
  for (std::thread& th : ts) th.join();
  const double secs = static_cast<double>(port::now_ns() - start) / 1e9;
  if (failure.failed()) {
    std::fprintf(stderr, "warpfs-bench-blockread: %s\n", failure.what().c_str());
    std::exit(1);
  }
  std::vector<uint64_t> all;
  for (const LatencyLog& l : logs) l.append_to(&all);
  std::sort(all.begin(), all.end());
  double sum = 0;
  for (uint64_t v : all) sum += static_cast<double>(v);
  const double n = static_cast<double>(all.size());
  std::printf(
      "{\"bench\":\"blockread\",\"label\":\"%s\",\"target\":\"%s\",\"path\":\"%s\","
      "\"threads\":%u,\"block_bytes\":%u,\"ops\":%zu,\"seconds\":%.3f,\"iops\":%.1f,"
      "\"mib_s\":%.2f,\"lat_mean_us\":%.1f,\"lat_p50_us\":%.1f,\"lat_p99_us\":%.1f,"
      "\"lat_max_us\":%.1f}\n",
      o.label.c_str(), o.target.c_str(), path, threads, kBlock, all.size(), secs, n / secs,
      n * kBlock / secs / (1 << 20), all.empty() ? 0 : sum / n / 1e3,
      all.empty() ? 0 : static_cast<double>(percentile(all, 0.50)) / 1e3,
      all.empty() ? 0 : static_cast<double>(percentile(all, 0.99)) / 1e3,
      all.empty() ? 0 : static_cast<double>(all.back()) / 1e3);
  std::fflush(stdout);
}

int run_driver(const Options& o, const nvme::DeviceSpec& spec) {
  std::string err;
  nvme::EmulatedConfig ec;
  ec.inline_io = o.inline_io;
  if (o.queues != 0) ec.worker_threads = static_cast<unsigned>(o.queues);
  auto transport = nvme::open_transport(spec, ec, nvme::VfioOptions{}, 0, &err);
  if (!transport) {
    std::fprintf(stderr, "warpfs-bench-blockread: %s: %s\n", o.target.c_str(), err.c_str());
    return 1;
  }
  nvme::ControllerOptions co;
  if (o.queues != 0) co.io_queues = static_cast<uint16_t>(o.queues);
  auto ctrl = nvme::Controller::open(*transport, co, &err);
  if (!ctrl) {
    std::fprintf(stderr, "warpfs-bench-blockread: %s: %s\n", o.target.c_str(), err.c_str());
    return 1;
  }
  nvme::EngineOptions eo;
  auto engine = nvme::IoEngine::create(*ctrl, eo, &err);
  const uint32_t nsid = spec.nsid != 0               ? spec.nsid
                        : ctrl->namespaces().empty() ? 1
                                                     : ctrl->namespaces()[0].nsid;
  std::unique_ptr<nvme::NamespaceIo> ns;
  if (engine) ns = nvme::NamespaceIo::create(*engine, nsid, kBlock, &err);
  if (!ns) {
    std::fprintf(stderr, "warpfs-bench-blockread: %s: %s\n", o.target.c_str(), err.c_str());
    return 1;
  }
  const uint64_t blocks = std::min<uint64_t>(ns->block_count(), o.span_mb * (1 << 20) / kBlock);
  unsigned most = *std::max_element(o.threads.begin(), o.threads.end());
  std::vector<uint8_t*> bufs(most);
  for (uint8_t*& b : bufs) {
    void* p = nullptr;
    if (!ns->alloc(kBlock, &p).is_ok()) {
      std::fprintf(stderr, "warpfs-bench-blockread: no DMA memory\n");
      return 1;
    }
    b = static_cast<uint8_t*>(p);
  }
  for (unsigned t : o.threads) {
    run_point(o, "driver", t, blocks, [&](unsigned th, uint64_t b, std::string* e) {
      nvme::BlockIo io;
      io.block = b;
      io.data = bufs[th];
      ns->io(&io, 1);
      if (!io.status.is_ok())
        *e = "read of block " + std::to_string(b) + ": " + io.status.to_string();
      return io.status.is_ok();
    });
  }
  for (uint8_t* b : bufs) ns->free(b, kBlock);
  return 0;
}

int run_pread(const Options& o) {
  const int fd = ::open(o.target.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "warpfs-bench-blockread: %s: %s\n", o.target.c_str(),
                 std::strerror(errno));
    return 1;
  }
  const off_t end = ::lseek(fd, 0, SEEK_END);
  const uint64_t blocks = std::min<uint64_t>(
      static_cast<uint64_t>(std::max<off_t>(end, 0)) / kBlock, o.span_mb * (1 << 20) / kBlock);
  if (blocks == 0) {
    std::fprintf(stderr, "warpfs-bench-blockread: %s: shorter than one block\n", o.target.c_str());
    return 1;
  }
  unsigned most = *std::max_element(o.threads.begin(), o.threads.end());
  std::vector<void*> bufs(most);
  for (void*& b : bufs) {
    if (posix_memalign(&b, kBlock, kBlock) != 0) return 1;
  }
  for (unsigned t : o.threads) {
    run_point(o, "pread", t, blocks, [&](unsigned th, uint64_t b, std::string* e) {
      const ssize_t n = ::pread(fd, bufs[th], kBlock, static_cast<off_t>(b * kBlock));
      if (n == kBlock) return true;
      *e = "pread of block " + std::to_string(b) + ": " +
           (n < 0 ? std::string(std::strerror(errno)) : "short read");
      return false;
    });
  }
  for (void* b : bufs) std::free(b);
  ::close(fd);
  return 0;
}

}  // namespace
}  // namespace warpfs::bench

int main(int argc, char** argv) {
  using namespace warpfs;
  const bench::Options o = bench::parse(argc, argv);
  nvme::DeviceSpec spec;
  std::string err;
  const bool device = o.target.rfind("emu:", 0) == 0 || o.target.rfind("vfio:", 0) == 0 ||
                      o.target.rfind("tcp:", 0) == 0;
  if (device) {
    if (!nvme::parse_device(o.target, &spec, &err)) bench::usage_error(err);
    return bench::run_driver(o, spec);
  }
  return bench::run_pread(o);
}
