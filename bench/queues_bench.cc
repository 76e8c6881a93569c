// warpfs-bench-queues: the queue-discipline benchmark (BaM Fig 5.6's experiment).
//
// T threads each keep one command in flight (QD1 per thread: "each thread does one 512 B
// read"), issuing random reads into a private DMA buffer, through one of:
//   virtual_queue  BaM's lock-light protocol (VirtualQueue; a QueueMapper over all queues
//                  when there is more than one queue pair),
//   locked_queue   one mutex per queue pair (LockedQueue; thread i uses queue i % queues),
//   raw_qd1        one thread on a RawQueuePair, polling the CQ in a tight loop: the floor
//                  the queue layers are compared against.
// Every implementation at every configuration gets a fresh emulated controller, so no run
// inherits another's queue state. The RAM store behind them is shared and pre-faulted once,
// so that no run pays page faults the others do not.
//
// Output: one JSON object per line on stdout (bench/README.md describes the keys). Any failed
// command aborts the program with a message naming it and exit status 1; bad options print
// the usage and exit 2.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/emulated.h"
#include "warpfs/nvme/io_engine.h"
#include "warpfs/nvme/locked_queue.h"
#include "warpfs/nvme/port.h"
#include "warpfs/nvme/queue_mapper.h"
#include "warpfs/nvme/queue_pair.h"
#include "warpfs/nvme/virtual_queue.h"

namespace {

namespace nvme = warpfs::nvme;
namespace port = warpfs::port;
using warpfs::bench::Failure;
using warpfs::bench::LatencyLog;
using warpfs::bench::parse_double;
using warpfs::bench::parse_uint;
using warpfs::bench::Rng;
using warpfs::bench::split_list;

constexpr const char* kProgram = "warpfs-bench-queues";
constexpr uint64_t kStoreBytes = 1ull << 30;  // 1 GiB: random reads miss the CPU caches
constexpr uint32_t kLbaBytes = 512;
constexpr uint32_t kNsid = 1;
constexpr uint64_t kPage = 4096;
constexpr unsigned kMaxThreads = 1024;
constexpr unsigned kMaxQueues = 64;   // EmulatedConfig's default grant
constexpr uint32_t kMaxDepth = 4096;  // EmulatedConfig::max_queue_entries (CAP.MQES + 1)

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

struct Options {
  std::vector<unsigned> threads;
  std::vector<unsigned> queues;
  std::vector<double> latency_us;
  uint32_t depth = 0;
  double duration_s = 0;
  uint32_t block_bytes = kLbaBytes;
  unsigned device_threads = 1;
  bool quick = false;
};

void print_usage(FILE* f) {
  std::fprintf(f,
               "usage: %s [--quick] [--threads LIST] [--queues LIST] [--depth N]\n"
               "       [--latency-us LIST] [--duration-s X] [--block-bytes N] "
               "[--device-threads N]\n"
               "  --quick             short sweep: threads 1,2,4; queues 1; depth 64;\n"
               "                      latency 0,20 us; 0.5 s per point\n"
               "                      (default: threads 1,2,4,8,16; queues 1,4; depth 256;\n"
               "                      latency 0,20 us; 2 s per point)\n"
               "  --threads LIST      host threads, comma-separated, 1..%u\n"
               "  --queues LIST       I/O queue pairs, comma-separated, 1..%u\n"
               "  --depth N           entries per queue pair, a power of two in 2..%u\n"
               "  --latency-us LIST   emulated device latency per command, microseconds\n"
               "  --duration-s X      measured seconds per point (plus a 10%% warm-up)\n"
               "  --block-bytes N     bytes per read, a multiple of %u (default %u)\n"
               "  --device-threads N  emulated controller worker threads (default 1)\n",
               kProgram, kMaxThreads, kMaxQueues, kMaxDepth, kLbaBytes, kLbaBytes);
}

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kProgram, what.c_str());
  print_usage(stderr);
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options o;
  bool have_depth = false, have_duration = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_inline_value = false;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline_value = true;
    }
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      std::exit(0);
    }
    if (arg == "--quick") {
      if (has_inline_value) usage_error("--quick takes no value");
      o.quick = true;
      continue;
    }
    static const char* const kValued[] = {"--threads",       "--queues",     "--depth",
                                          "--latency-us",    "--duration-s", "--block-bytes",
                                          "--device-threads"};
    if (std::find_if(std::begin(kValued), std::end(kValued),
                     [&](const char* k) { return arg == k; }) == std::end(kValued)) {
      usage_error("unknown option '" + arg + "'");
    }
    if (!has_inline_value) {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      value = argv[++i];
    }
    uint64_t u;
    if (arg == "--threads") {
      o.threads = warpfs::bench::parse_uint_list(arg, value, 1, kMaxThreads, usage_error);
    } else if (arg == "--queues") {
      o.queues = warpfs::bench::parse_uint_list(arg, value, 1, kMaxQueues, usage_error);
    } else if (arg == "--depth") {
      if (!parse_uint(value, 2, kMaxDepth, &u) || !port::is_pow2(u)) {
        usage_error("--depth: '" + value + "' is not a power of two in 2.." +
                    std::to_string(kMaxDepth) + " (the virtual-queue tickets need 2^k)");
      }
      o.depth = static_cast<uint32_t>(u);
      have_depth = true;
    } else if (arg == "--latency-us") {
      o.latency_us.clear();
      for (const std::string& p : split_list(value)) {
        double v;
        // EmulatedConfig::latency_ns is 32 bits: at most about 4.29 s.
        if (!parse_double(p, 0, 4'000'000, &v)) {
          usage_error("--latency-us: '" + p + "' is not a number of microseconds in 0..4000000");
        }
        o.latency_us.push_back(v);
      }
    } else if (arg == "--duration-s") {
      if (!parse_double(value, 0.001, 3600, &o.duration_s)) {
        usage_error("--duration-s: '" + value + "' is not a number of seconds in 0.001..3600");
      }
      have_duration = true;
    } else if (arg == "--block-bytes") {
      // The emulated controller's MDTS of 8 allows 1 MiB per command.
      if (!parse_uint(value, kLbaBytes, 1u << 20, &u) || u % kLbaBytes != 0) {
        usage_error("--block-bytes: '" + value + "' is not a multiple of " +
                    std::to_string(kLbaBytes) + " in " + std::to_string(kLbaBytes) + "..1048576");
      }
      o.block_bytes = static_cast<uint32_t>(u);
    } else if (arg == "--device-threads") {
      if (!parse_uint(value, 1, 64, &u)) {
        usage_error("--device-threads: '" + value + "' is not an integer in 1..64");
      }
      o.device_threads = static_cast<unsigned>(u);
    }
  }
  // --quick picks the defaults; any option given explicitly wins, whatever its position.
  if (o.threads.empty())
    o.threads = o.quick ? std::vector<unsigned>{1, 2, 4} : std::vector<unsigned>{1, 2, 4, 8, 16};
  if (o.queues.empty()) o.queues = o.quick ? std::vector<unsigned>{1} : std::vector<unsigned>{1, 4};
  if (o.latency_us.empty()) o.latency_us = {0, 20};
  if (!have_depth) o.depth = o.quick ? 64 : 256;
  if (!have_duration) o.duration_s = o.quick ? 0.5 : 2.0;
  return o;
}

// ---------------------------------------------------------------------------------------------
// The device: a fresh emulated controller with its I/O queue pairs
// ---------------------------------------------------------------------------------------------

class Rig {
 public:
  static std::unique_ptr<Rig> open(std::shared_ptr<nvme::BackingStore> store, uint32_t latency_ns,
                                   unsigned device_threads, unsigned queues, uint32_t depth,
                                   std::string* error) {
    std::unique_ptr<Rig> r(new Rig);
    nvme::EmulatedConfig cfg;
    cfg.namespaces = {nvme::NamespaceConfig{kLbaBytes, 0}};
    cfg.latency_ns = latency_ns;
    cfg.worker_threads = device_threads;
    cfg.volatile_write_cache = false;  // the benchmark only reads
    cfg.max_io_queues = static_cast<uint16_t>(std::max<unsigned>(queues, 1));
    r->transport_ = nvme::EmulatedTransport::create(cfg, std::move(store), error);
    if (!r->transport_) {
      *error = "creating the emulated controller: " + *error;
      return nullptr;
    }
    nvme::ControllerOptions co;
    co.io_queues = static_cast<uint16_t>(queues);
    r->controller_ = nvme::Controller::open(*r->transport_, co, error);
    if (!r->controller_) {
      *error = "opening the emulated controller: " + *error;
      return nullptr;
    }
    if (r->controller_->io_queues_granted() < queues) {
      *error = "the controller granted " + std::to_string(r->controller_->io_queues_granted()) +
               " I/O queues, " + std::to_string(queues) + " were asked for";
      return nullptr;
    }
    if (depth > r->controller_->max_queue_entries()) {
      *error = "queue depth " + std::to_string(depth) +
               " exceeds CAP.MQES + 1 = " + std::to_string(r->controller_->max_queue_entries());
      return nullptr;
    }
    const nvme::NamespaceInfo* ns = r->controller_->find_namespace(kNsid);
    if (ns == nullptr || ns->lba_bytes != kLbaBytes) {
      *error = "namespace 1 is missing or not formatted with 512-byte LBAs";
      return nullptr;
    }
    r->lba_count_ = ns->lba_count;
    for (unsigned q = 1; q <= queues; ++q) {
      nvme::QueueView v;
      const nvme::Status s = r->controller_->create_queue_pair(static_cast<uint16_t>(q), depth,
                                                               nvme::QueuePriority::kMedium, &v);
      if (!s.is_ok()) {
        *error = "creating I/O queue pair " + std::to_string(q) + ": " + s.to_string();
        return nullptr;
      }
      r->views_.push_back(v);
    }
    return r;
  }

  nvme::Transport& transport() { return *transport_; }
  nvme::Controller& controller() { return *controller_; }
  const std::vector<nvme::QueueView>& views() const { return views_; }
  uint64_t lba_count() const { return lba_count_; }

 private:
  Rig() = default;
  // Destroyed in reverse: the controller (which shuts the device down and frees its queues)
  // before the transport it talks through.
  std::unique_ptr<nvme::EmulatedTransport> transport_;
  std::unique_ptr<nvme::Controller> controller_;
  std::vector<nvme::QueueView> views_;
  uint64_t lba_count_ = 0;
};

// One thread's DMA memory: the data buffer and a PRP list page (used when a read spans
// more than two pages, NVM §3.2 / Base §4.3).
class ThreadDma {
 public:
  explicit ThreadDma(nvme::Transport& t) : t_(t) {}
  ~ThreadDma() {
    t_.dma_free(data_);
    t_.dma_free(prp_);
  }
  ThreadDma(const ThreadDma&) = delete;
  ThreadDma& operator=(const ThreadDma&) = delete;

  nvme::Status alloc(uint32_t bytes) {
    if (nvme::Status s = t_.dma_alloc(bytes, &data_); !s.is_ok()) return s;
    return t_.dma_alloc(kPage, &prp_);
  }
  uint64_t iova() const { return data_.iova; }
  nvme::PrpList prp_list() const {
    return nvme::PrpList{static_cast<uint64_t*>(prp_.vaddr), prp_.iova};
  }

 private:
  nvme::Transport& t_;
  nvme::DmaRegion data_{}, prp_{};
};

// ---------------------------------------------------------------------------------------------
// Measurement
// ---------------------------------------------------------------------------------------------

struct Point {
  const char* impl = "";
  unsigned threads = 1;
  unsigned queues = 1;
  uint32_t depth = 0;
  uint32_t block_bytes = kLbaBytes;
  double latency_us = 0;
  double duration_s = 0;
};

struct Stats {
  double iops = 0, p50_us = 0, p99_us = 0, p999_us = 0, max_us = 0;
};

std::string fmt_num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// Names a failed command; run_or_die() adds the configuration.
std::string describe(const Point& p, unsigned thread, const nvme::SubmissionEntry& cmd,
                     const nvme::Status& s) {
  // NVM §3.2.4: SLBA in CDW11:CDW10, NLB (0's based) in CDW12 15:0.
  const uint64_t slba = (uint64_t{cmd.cdw11} << 32) | cmd.cdw10;
  const uint32_t blocks = (cmd.cdw12 & 0xffff) + 1;
  return "read of " + std::to_string(blocks) + " block(s) at LBA " + std::to_string(slba) +
         " (nsid " + std::to_string(cmd.nsid) + ") through " + p.impl + " failed on thread " +
         std::to_string(thread) + ": " + s.to_string();
}

double percentile_us(const std::vector<uint64_t>& sorted, double p) {
  return static_cast<double>(warpfs::bench::percentile(sorted, p)) / 1000.0;
}

// Runs p.threads threads, each issuing one read at a time through `issue(thread, cmd)`
// (which returns the command's Status) until the window closes. Commands issued during the
// warm-up (10% of the duration, at most 0.2 s) are not recorded.
template <typename Issue>
bool measure(const Point& p, uint64_t lba_count, const std::vector<std::unique_ptr<ThreadDma>>& dma,
             Issue&& issue, Stats* out, std::string* error) {
  const uint32_t blocks = p.block_bytes / kLbaBytes;
  const uint64_t positions = lba_count / blocks;  // block-aligned read positions
  const uint64_t warmup_ns = static_cast<uint64_t>(std::min(0.2, p.duration_s * 0.1) * 1e9);
  const uint64_t window_ns = static_cast<uint64_t>(p.duration_s * 1e9);
  std::vector<LatencyLog> logs(p.threads);
  std::atomic<unsigned> ready{0};
  std::atomic<uint64_t> t0{0}, t1{0};  // published by the main thread once all are ready
  Failure failure;

  auto body = [&](unsigned t) {
    LatencyLog& log = logs[t];
    Rng rng(t + 1);
    ready.fetch_add(1, std::memory_order_relaxed);
    uint64_t end;
    while ((end = t1.load(std::memory_order_acquire)) == 0) std::this_thread::yield();
    const uint64_t start = t0.load(std::memory_order_relaxed);
    while (!failure.failed()) {
      const uint64_t slba = rng.next() % positions * blocks;
      nvme::SubmissionEntry cmd = nvme::make_read(kNsid, slba, blocks);
      if (!nvme::fill_prps(&cmd, dma[t]->iova(), p.block_bytes, dma[t]->prp_list())) {
        failure.report(describe(p, t, cmd,
                                nvme::Status::error(nvme::Code::kInvalidArgument,
                                                    "the transfer needs more than one PRP list")));
        break;
      }
      const uint64_t s = port::now_ns();
      if (s >= end) break;
      const nvme::Status st = issue(t, cmd);
      const uint64_t e = port::now_ns();
      if (!st.is_ok()) {
        failure.report(describe(p, t, cmd, st));
        break;
      }
      if (s >= start) log.add(e - s);
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(p.threads);
  for (unsigned t = 0; t < p.threads; ++t) threads.emplace_back(body, t);
  while (ready.load(std::memory_order_relaxed) < p.threads) std::this_thread::yield();
  const uint64_t now = port::now_ns();
  t0.store(now + warmup_ns, std::memory_order_relaxed);
  t1.store(now + warmup_ns + window_ns, std::memory_order_release);  // publishes t0 too
  for (std::thread& th : threads) th.join();

  if (failure.failed()) {
    *error = failure.what();
    return false;
  }
  std::vector<uint64_t> all;
  size_t n = 0;
  for (const LatencyLog& l : logs) n += l.size();
  all.reserve(n);
  for (const LatencyLog& l : logs) l.append_to(&all);
  if (all.empty()) {
    *error = std::string("no ") + p.impl + " command completed in the measurement window";
    return false;
  }
  std::sort(all.begin(), all.end());
  out->iops = static_cast<double>(all.size()) / (static_cast<double>(window_ns) / 1e9);
  out->p50_us = percentile_us(all, 0.50);
  out->p99_us = percentile_us(all, 0.99);
  out->p999_us = percentile_us(all, 0.999);
  out->max_us = static_cast<double>(all.back()) / 1000.0;
  return true;
}

// Polls a RawQueuePair, one command at a time, with no back-off sleep and no interrupt.
// After a short spin it yields between polls: on a small machine a pure spin would keep the
// emulated controller's worker (which yields while a timed completion is close) off the core
// for a whole scheduler tick; with nothing else runnable, a yield returns at once.
nvme::Status raw_execute(nvme::RawQueuePair& qp, nvme::SubmissionEntry cmd, uint16_t cid) {
  constexpr int kSpinPolls = 64;
  cmd.cid = cid;
  if (nvme::Status s = qp.push(cmd); !s.is_ok()) return s;
  qp.ring_sq();
  nvme::CompletionEntry cqe;
  for (int polls = 0; !qp.pop(&cqe); ++polls) {
    if (polls < kSpinPolls) {
      port::cpu_relax();
    } else {
      port::thread_yield();
    }
  }
  qp.ring_cq();
  if (cqe.cid != cid || cqe.sq_id != qp.view().qid) {
    return nvme::Status::error(nvme::Code::kIoError, "completion for another command or queue");
  }
  return nvme::Status::nvme(static_cast<uint16_t>(cqe.status >> 1));  // bit 0 is the phase tag
}

// One implementation at one configuration, on its own controller.
bool run_point(const Point& p, unsigned device_threads,
               const std::shared_ptr<nvme::BackingStore>& store, Stats* out, std::string* error) {
  const uint32_t latency_ns = static_cast<uint32_t>(std::llround(p.latency_us * 1000.0));
  std::unique_ptr<Rig> rig = Rig::open(store, latency_ns, device_threads, p.queues, p.depth, error);
  if (!rig) return false;
  if (p.block_bytes > rig->controller().max_transfer_bytes()) {
    *error = "--block-bytes " + std::to_string(p.block_bytes) + " exceeds the controller's " +
             "maximum transfer of " + std::to_string(rig->controller().max_transfer_bytes());
    return false;
  }
  std::vector<std::unique_ptr<ThreadDma>> dma;
  for (unsigned t = 0; t < p.threads; ++t) {
    dma.push_back(std::make_unique<ThreadDma>(rig->transport()));
    if (nvme::Status s = dma.back()->alloc(p.block_bytes); !s.is_ok()) {
      *error = "allocating DMA buffers for thread " + std::to_string(t) + ": " + s.to_string();
      return false;
    }
  }
  const std::vector<nvme::QueueView>& views = rig->views();
  const std::string impl = p.impl;

  if (impl == "raw_qd1") {
    nvme::RawQueuePair qp(views[0]);
    uint16_t cid = 0;
    return measure(
        p, rig->lba_count(), dma,
        [&](unsigned, const nvme::SubmissionEntry& cmd) {
          cid = static_cast<uint16_t>((cid + 1) % (p.depth - 1));
          return raw_execute(qp, cmd, cid);
        },
        out, error);
  }
  if (impl == "virtual_queue") {
    std::vector<nvme::VirtualQueuePtr> vqs;
    std::vector<nvme::VirtualQueue*> raw;
    for (const nvme::QueueView& v : views) {
      vqs.push_back(nvme::make_virtual_queue(v));
      raw.push_back(vqs.back().get());
    }
    if (vqs.size() == 1) {
      nvme::VirtualQueue& vq = *vqs[0];
      return measure(
          p, rig->lba_count(), dma,
          [&](unsigned, const nvme::SubmissionEntry& cmd) {
            return nvme::Status::nvme(vq.execute(cmd));
          },
          out, error);
    }
    // Every queue in both classes; the benchmark's reads are all bulk.
    nvme::QueueMapper mapper({raw, raw}, nvme::QueueMapper::Options{});
    return measure(
        p, rig->lba_count(), dma,
        [&](unsigned, const nvme::SubmissionEntry& cmd) {
          return nvme::Status::nvme(mapper.execute(cmd, nvme::Priority::kBulk));
        },
        out, error);
  }
  if (impl == "locked_queue") {
    std::vector<std::unique_ptr<nvme::LockedQueue>> lqs;
    for (const nvme::QueueView& v : views) lqs.push_back(std::make_unique<nvme::LockedQueue>(v));
    return measure(
        p, rig->lba_count(), dma,
        [&](unsigned t, const nvme::SubmissionEntry& cmd) {
          return nvme::Status::nvme(lqs[t % lqs.size()]->execute(cmd));
        },
        out, error);
  }
  *error = "unknown implementation " + impl;
  return false;
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

void print_point(const Point& p, const Stats& s) {
  std::printf(
      "{\"bench\":\"queues\",\"impl\":\"%s\",\"threads\":%u,\"queues\":%u,\"depth\":%u,"
      "\"block_bytes\":%u,\"device_latency_us\":%s,\"iops\":%.1f,\"p50_us\":%.2f,"
      "\"p99_us\":%.2f,\"p999_us\":%.2f,\"max_us\":%.2f}\n",
      p.impl, p.threads, p.queues, p.depth, p.block_bytes, fmt_num(p.latency_us).c_str(), s.iops,
      s.p50_us, s.p99_us, s.p999_us, s.max_us);
  std::fflush(stdout);
}

void print_ratio(const Point& p, double ratio) {
  std::printf(
      "{\"bench\":\"queues\",\"ratio\":\"virtual_queue/locked_queue\",\"threads\":%u,"
      "\"queues\":%u,\"depth\":%u,\"device_latency_us\":%s,\"iops_ratio\":%.3f}\n",
      p.threads, p.queues, p.depth, fmt_num(p.latency_us).c_str(), ratio);
  std::fflush(stdout);
}

void print_added_latency(double latency_us, double vq_p50, double raw_p50) {
  std::printf(
      "{\"bench\":\"queues\",\"metric\":\"qd1_added_latency_us\",\"device_latency_us\":%s,"
      "\"virtual_queue_p50_us\":%.2f,\"raw_p50_us\":%.2f,\"added_us\":%.2f}\n",
      fmt_num(latency_us).c_str(), vq_p50, raw_p50, vq_p50 - raw_p50);
  std::fflush(stdout);
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kProgram, what.c_str());
  std::exit(1);
}

Stats run_or_die(const Point& p, unsigned device_threads,
                 const std::shared_ptr<nvme::BackingStore>& store) {
  Stats s;
  std::string error;
  if (!run_point(p, device_threads, store, &s, &error)) {
    fail(std::string(p.impl) + " at threads=" + std::to_string(p.threads) +
         " queues=" + std::to_string(p.queues) + " depth=" + std::to_string(p.depth) +
         " device_latency_us=" + fmt_num(p.latency_us) + ": " + error +
         " (benchmark aborted; no numbers reported for this point)");
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);

  std::shared_ptr<nvme::BackingStore> store = nvme::BackingStore::ram(kStoreBytes);
  if (!store) fail("cannot allocate the 1 GiB RAM backing store");
  // Fault every page in once (reads map the shared zero page), so the first run does not pay
  // page faults that later runs, on the same store, do not.
  for (uint64_t off = 0; off < kStoreBytes; off += kPage) {
    uint8_t b;
    if (nvme::Status s = store->read(off, &b, 1); !s.is_ok()) {
      fail("pre-faulting the RAM store at offset " + std::to_string(off) + ": " + s.to_string());
    }
  }

  for (const double lat : o.latency_us) {
    Point base;
    base.depth = o.depth;
    base.block_bytes = o.block_bytes;
    base.latency_us = lat;
    base.duration_s = o.duration_s;

    Point raw = base;
    raw.impl = "raw_qd1";
    const Stats raw_stats = run_or_die(raw, o.device_threads, store);
    print_point(raw, raw_stats);

    bool have_vq_qd1 = false;
    double vq_qd1_p50 = 0;
    for (const unsigned queues : o.queues) {
      for (const unsigned threads : o.threads) {
        Point p = base;
        p.threads = threads;
        p.queues = queues;
        p.impl = "virtual_queue";
        const Stats vq = run_or_die(p, o.device_threads, store);
        print_point(p, vq);
        if (threads == 1 && !have_vq_qd1) {
          have_vq_qd1 = true;
          vq_qd1_p50 = vq.p50_us;
        }
        p.impl = "locked_queue";
        const Stats lq = run_or_die(p, o.device_threads, store);
        print_point(p, lq);
        print_ratio(p, lq.iops > 0 ? vq.iops / lq.iops : 0);
      }
    }
    if (have_vq_qd1) {
      print_added_latency(lat, vq_qd1_p50, raw_stats.p50_us);
    } else {
      std::fprintf(stderr,
                   "%s: no threads=1 point at device latency %s us: qd1_added_latency_us "
                   "not computed (add 1 to --threads)\n",
                   kProgram, fmt_num(lat).c_str());
    }
  }
  return 0;
}
