// warpfs-bench-cache: the cache's hit and miss paths against two baselines.
//
// Every implementation caches 4 KiB lines of one namespace of the emulated NVMe controller
// (RAM store, zero latency, no volatile write cache) through the same cache::NamespaceBackend:
//   warpcache  warpfs::cache::Cache: set-associative, one fetch_add per hit, per-set ticket
//              locks on the miss path, 32-lane warps coalesced per block,
//   mutex_lru  a hash map and an LRU list behind one std::mutex, filled under the lock
//              (GPUfs's global-lock cache),
//   tbb_hash   a tbb::concurrent_hash_map from block to line with a clock over the lines
//              (GPUfs's per-bucket-locking redesign); built only where oneTBB is installed.
// The baselines are fully associative and hold as many lines as warpcache (sets x ways).
//
// One op acquires a block, reads 8 bytes of its line (at an offset fixed per block) and
// releases it; the 8 bytes are checked against the pattern the device was written with, so a
// cache that hands out the wrong line (or an unfilled one) aborts the run instead of producing
// a number. An acquire that finds no line free (warpcache: the block's set; a baseline: every
// line pinned) reads the block from the device instead, as blockdev does; stderr counts them.
// Patterns:
//   all_hit            uniform over a working set of a quarter of the capacity, prefilled
//   all_miss           a random permutation of a region 8x the capacity, shared by all
//                      threads: no block comes back within 8 capacities of accesses
//   zipf               Zipf(0.99) over 4x the capacity (ranks scattered over the region)
//   warp_same_block    one op is a 32-lane warp whose lanes all name one block of the all_hit
//                      working set: one 32-lane acquire for warpcache, 32 scalar acquires
//                      for the baselines (what a warp does without coalescing)
//   sequential_ra_on   each thread scans its slice of a region 4x the capacity, calling
//   sequential_ra_off  Cache::note_read after each line, with read-ahead on or off
//                      (baselines: sequential_ra_off only)
//
// Timing: throughput counts every op; latency is taken on one op in kSampleEvery, because a
// clock read (~20 ns) is a large part of a ~50-100 ns hit. Each implementation at each point
// gets a fresh controller and a fresh cache over the same RAM store.
//
// Output: one JSON object per line on stdout (bench/README.md describes the keys). A failed
// acquire or I/O, or a line with the wrong contents, aborts with a message and exit status 1
// (no numbers are printed for that point); bad options print the usage and exit 2.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench_common.h"
#include "warpfs/cache/backend.h"
#include "warpfs/cache/cache.h"
#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/emulated.h"
#include "warpfs/nvme/io_engine.h"
#include "warpfs/nvme/namespace_io.h"
#include "warpfs/nvme/port.h"

#if defined(WARPFS_HAVE_TBB)
#include <tbb/concurrent_hash_map.h>
#endif

namespace {

namespace cache = warpfs::cache;
namespace nvme = warpfs::nvme;
namespace port = warpfs::port;
using warpfs::bench::Failure;
using warpfs::bench::LatencyLog;
using warpfs::bench::parse_double;
using warpfs::bench::parse_uint;
using warpfs::bench::percentile;
using warpfs::bench::Rng;
using warpfs::bench::split_list;

constexpr const char* kProgram = "warpfs-bench-cache";
constexpr uint32_t kLineBytes = 4096;  // one line is one 4 KiB LBA
constexpr uint32_t kWords = kLineBytes / 8;
constexpr uint32_t kNsid = 1;
constexpr unsigned kMaxThreads = 1024;
constexpr int kWarp = cache::Cache::kWarp;
constexpr uint64_t kSampleEvery = 16;  // latency sampled on 1 op in 16 (a power of two)
constexpr uint64_t kMaxStoreBytes = 8ull << 30;
constexpr uint32_t kMissRegion = 8;  // all_miss region, in capacities
constexpr uint32_t kScanRegion = 4;  // zipf and sequential regions, in capacities
constexpr uint32_t kZipfTable = 1u << 20;
constexpr double kZipfTheta = 0.99;

const char* const kAllPatterns[] = {"all_hit",         "all_miss",         "zipf",
                                    "warp_same_block", "sequential_ra_on", "sequential_ra_off"};

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

struct Options {
  std::vector<unsigned> threads;
  std::vector<std::string> patterns;  // in kAllPatterns order
  double duration_s = 0;
  uint32_t sets = 1024;
  uint32_t ways = 8;
  bool quick = false;
};

void print_usage(FILE* f) {
  std::fprintf(f,
               "usage: %s [--quick] [--threads LIST] [--patterns LIST] [--duration-s X]\n"
               "       [--sets N] [--ways N]\n"
               "  --quick            short sweep: threads 1,2; 0.3 s per point\n"
               "                     (default: threads 1,2,4,8,16; 1 s per point)\n"
               "  --threads LIST     host threads, comma-separated, 1..%u\n"
               "  --patterns LIST    comma-separated, from: all_hit, all_miss, zipf,\n"
               "                     warp_same_block, sequential (both read-ahead settings),\n"
               "                     sequential_ra_on, sequential_ra_off (default: all)\n"
               "  --duration-s X     measured seconds per point (plus a 10%% warm-up)\n"
               "  --sets N           warpcache sets, a power of two (default 1024)\n"
               "  --ways N           warpcache ways, 1..64 (default 8); the baselines hold\n"
               "                     sets x ways lines\n",
               kProgram, kMaxThreads);
}

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kProgram, what.c_str());
  print_usage(stderr);
  std::exit(2);
}

// The patterns named in `s`, in kAllPatterns order (all_hit first: the warp comparison needs
// its scalar numbers), each once.
std::vector<std::string> parse_patterns(const std::string& s) {
  std::vector<bool> want(std::size(kAllPatterns), false);
  for (const std::string& p : split_list(s)) {
    bool known = false;
    for (size_t k = 0; k < std::size(kAllPatterns); ++k) {
      const std::string name = kAllPatterns[k];
      if (p == name || (p == "sequential" && name.rfind("sequential_", 0) == 0)) {
        want[k] = true;
        known = true;
      }
    }
    if (!known) usage_error("--patterns: unknown pattern '" + p + "'");
  }
  std::vector<std::string> out;
  for (size_t k = 0; k < std::size(kAllPatterns); ++k) {
    if (want[k]) out.push_back(kAllPatterns[k]);
  }
  return out;
}

Options parse_options(int argc, char** argv) {
  Options o;
  bool have_duration = false;
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
    static const char* const kValued[] = {"--threads", "--patterns", "--duration-s", "--sets",
                                          "--ways"};
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
    } else if (arg == "--patterns") {
      o.patterns = parse_patterns(value);
    } else if (arg == "--duration-s") {
      if (!parse_double(value, 0.001, 3600, &o.duration_s)) {
        usage_error("--duration-s: '" + value + "' is not a number of seconds in 0.001..3600");
      }
      have_duration = true;
    } else if (arg == "--sets") {
      if (!parse_uint(value, 1, 1u << 24, &u) || !port::is_pow2(u)) {
        usage_error("--sets: '" + value + "' is not a power of two in 1..16777216");
      }
      o.sets = static_cast<uint32_t>(u);
    } else if (arg == "--ways") {
      if (!parse_uint(value, 1, 64, &u)) usage_error("--ways: '" + value + "' is not in 1..64");
      o.ways = static_cast<uint32_t>(u);
    }
  }
  // --quick picks the defaults; any option given explicitly wins, whatever its position.
  if (o.threads.empty())
    o.threads = o.quick ? std::vector<unsigned>{1, 2} : std::vector<unsigned>{1, 2, 4, 8, 16};
  if (o.patterns.empty()) o.patterns.assign(std::begin(kAllPatterns), std::end(kAllPatterns));
  if (!have_duration) o.duration_s = o.quick ? 0.3 : 1.0;
  // The device holds the all_miss region: 8 capacities of 4 KiB lines, in RAM.
  const uint64_t store_bytes = uint64_t{o.sets} * o.ways * kMissRegion * kLineBytes;
  if (store_bytes > kMaxStoreBytes) {
    usage_error("--sets x --ways = " + std::to_string(uint64_t{o.sets} * o.ways) +
                " lines needs a " + std::to_string(store_bytes >> 20) +
                " MiB device (8 capacities); at most " + std::to_string(kMaxStoreBytes >> 20) +
                " MiB is allowed");
  }
  const uint64_t lines = uint64_t{o.sets} * o.ways;
  const bool sequential =
      std::any_of(o.patterns.begin(), o.patterns.end(),
                  [](const std::string& p) { return p.rfind("sequential_", 0) == 0; });
  for (const unsigned t : sequential ? o.threads : std::vector<unsigned>{}) {
    // Each sequential thread scans its own slice of the 4-capacity region.
    if (t > lines * kScanRegion) {
      usage_error("--threads " + std::to_string(t) + " exceeds the " +
                  std::to_string(lines * kScanRegion) + " lines of the sequential region");
    }
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// The device: a fresh emulated controller, engine and backend over the shared RAM store
// ---------------------------------------------------------------------------------------------

class Rig {
 public:
  static std::unique_ptr<Rig> open(std::shared_ptr<nvme::BackingStore> store, std::string* error) {
    std::unique_ptr<Rig> r(new Rig);
    nvme::EmulatedConfig cfg;
    cfg.namespaces = {nvme::NamespaceConfig{kLineBytes, 0}};
    cfg.latency_ns = 0;
    cfg.volatile_write_cache = false;  // writes reach the store at once; no flush needed
    r->transport_ = nvme::EmulatedTransport::create(cfg, std::move(store), error);
    if (!r->transport_) {
      *error = "creating the emulated controller: " + *error;
      return nullptr;
    }
    r->controller_ = nvme::Controller::open(*r->transport_, nvme::ControllerOptions{}, error);
    if (!r->controller_) {
      *error = "opening the emulated controller: " + *error;
      return nullptr;
    }
    r->engine_ = nvme::IoEngine::create(*r->controller_, nvme::EngineOptions{}, error);
    if (!r->engine_) {
      *error = "creating the I/O engine: " + *error;
      return nullptr;
    }
    r->ns_ = nvme::NamespaceIo::create(*r->engine_, kNsid, kLineBytes, error);
    if (!r->ns_) {
      *error = "opening the namespace: " + *error;
      return nullptr;
    }
    r->backend_ = std::make_unique<cache::NamespaceBackend>(*r->ns_);
    return r;
  }
  cache::Backend& backend() { return *backend_; }

 private:
  Rig() = default;
  // Destroyed in reverse: backend, namespace, engine, controller (which shuts the device
  // down), then the transport they all talk through.
  std::unique_ptr<nvme::EmulatedTransport> transport_;
  std::unique_ptr<nvme::Controller> controller_;
  std::unique_ptr<nvme::IoEngine> engine_;
  std::unique_ptr<nvme::NamespaceIo> ns_;
  std::unique_ptr<cache::NamespaceBackend> backend_;
};

// What word `word` of block `block` holds on the device: (index + 1) times an odd constant,
// a bijection on 64 bits, so no two (block, word) pairs share a value and none is 0 (what a
// zero-filled, never-filled line holds).
inline uint64_t pattern_word(uint64_t block, uint32_t word) {
  return (block * kWords + word + 1) * 0x9e3779b97f4a7c15ull;
}

// Writes the pattern to lines [0, lines) through the backend, 32 ops of 64 lines at a time.
bool write_pattern(cache::Backend& b, uint64_t lines, std::string* error) {
  constexpr uint32_t kOpLines = 64;  // 256 KiB per command, within MDTS (1 MiB)
  constexpr int kOps = cache::Backend::kMaxOps;
  const size_t bytes = size_t{kOps} * kOpLines * kLineBytes;
  void* mem = nullptr;
  if (cache::Status s = b.alloc(bytes, &mem); !s.is_ok()) {
    *error = "allocating the pattern buffer: " + s.to_string();
    return false;
  }
  auto* buf = static_cast<uint8_t*>(mem);
  bool ok = true;
  for (uint64_t first = 0; first < lines && ok; first += uint64_t{kOps} * kOpLines) {
    cache::Backend::Op ops[kOps];
    int n = 0;
    for (uint64_t at = first; at < lines && n < kOps; at += kOpLines, ++n) {
      ops[n] = cache::Backend::Op{};
      ops[n].block = at;
      ops[n].count = static_cast<uint32_t>(std::min<uint64_t>(kOpLines, lines - at));
      ops[n].write = true;
      ops[n].data = buf + size_t{static_cast<unsigned>(n)} * kOpLines * kLineBytes;
      for (uint32_t l = 0; l < ops[n].count; ++l) {
        auto* line = ops[n].data + size_t{l} * kLineBytes;
        for (uint32_t w = 0; w < kWords; ++w) {
          const uint64_t v = pattern_word(at + l, w);
          std::memcpy(line + size_t{w} * 8, &v, 8);
        }
      }
    }
    b.io(ops, n);
    for (int k = 0; k < n; ++k) {
      if (!ops[k].status.is_ok()) {
        *error = "writing the pattern to lines " + std::to_string(ops[k].block) + ".." +
                 std::to_string(ops[k].block + ops[k].count - 1) + ": " + ops[k].status.to_string();
        ok = false;
        break;
      }
    }
  }
  if (ok) {
    if (cache::Status s = b.flush(); !s.is_ok()) {
      *error = "flushing the pattern: " + s.to_string();
      ok = false;
    }
  }
  b.free(mem, bytes);
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Shared helpers: random numbers, block sequences, errors, latency records
// ---------------------------------------------------------------------------------------------

std::vector<uint32_t> random_permutation(uint64_t n, uint64_t seed) {
  std::vector<uint32_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<uint32_t>(i);
  Rng rng(seed);
  for (uint64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.below(i + 1)]);
  return p;
}

// kZipfTable samples of Zipf(theta) over n items (Gray et al., "Quickly generating
// billion-record synthetic databases", as in YCSB), rank r mapped to block scatter[r] so the
// hot blocks are spread over the region rather than packed at its start.
std::vector<uint32_t> zipf_table(uint64_t n, double theta, uint64_t seed) {
  double zetan = 0;
  for (uint64_t i = 1; i <= n; ++i) zetan += 1.0 / std::pow(static_cast<double>(i), theta);
  const double zeta2 = 1.0 + std::pow(0.5, theta);
  const double alpha = 1.0 / (1.0 - theta);
  const double eta =
      (1.0 - std::pow(2.0 / static_cast<double>(n), 1.0 - theta)) / (1.0 - zeta2 / zetan);
  const std::vector<uint32_t> scatter = random_permutation(n, seed + 1);
  std::vector<uint32_t> t(kZipfTable);
  Rng rng(seed);
  for (uint32_t i = 0; i < kZipfTable; ++i) {
    const double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
    const double uz = u * zetan;
    uint64_t rank;
    if (uz < 1.0) {
      rank = 0;
    } else if (uz < zeta2) {
      rank = 1;
    } else {
      rank = static_cast<uint64_t>(static_cast<double>(n) * std::pow(eta * u - eta + 1.0, alpha));
    }
    t[i] = scatter[std::min(rank, n - 1)];
  }
  return t;
}

// The block sequences, one generator per thread.
struct UniformGen {  // all_hit, warp_same_block
  Rng rng;
  uint64_t n;
  uint64_t next() { return rng.below(n); }
};
struct TableGen {  // zipf: walks the shared sample table from its own starting point
  const uint32_t* table;
  uint32_t at;
  uint64_t next() { return table[at++ & (kZipfTable - 1)]; }
};
struct SharedCursorGen {  // all_miss: one cursor through one permutation for all threads
  const uint32_t* perm;
  uint64_t n;
  std::atomic<uint64_t>* cursor;
  uint64_t next() { return perm[cursor->fetch_add(1, std::memory_order_relaxed) % n]; }
};
struct ScanGen {  // sequential: this thread's slice, over and over
  uint64_t lo, hi, cur;
  uint64_t next() {
    const uint64_t b = cur;
    cur = cur + 1 == hi ? lo : cur + 1;
    return b;
  }
};

// The word an op reads from `block`'s line (a warp's lanes read the 32 words from here). Fixed
// per block, so an op touches one CPU cache line of line data: the hit path, not the memory
// system, is measured, and every implementation's data costs the same however its lines are
// laid out (a rolling word made the all_hit data 8 MiB, whose placement then dominated).
inline uint32_t word_of(uint64_t block) {
  return static_cast<uint32_t>((block * 37) & (kWords - 1));
}

// Reads word `word` of the line holding `block` and checks it. The value goes into `sum` so
// the load cannot be optimised away.
inline bool read_word(const uint8_t* line, uint64_t block, uint32_t word, uint64_t* sum,
                      std::string* error) {
  uint64_t v;
  std::memcpy(&v, line + size_t{word} * 8, 8);
  *sum += v;
  if (v == pattern_word(block, word)) [[likely]]
    return true;
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "line for block %" PRIu64 " holds 0x%016" PRIx64
                " at word %u, expected 0x%016" PRIx64
                " (the cache returned a wrong or unfilled line)",
                block, v, word, pattern_word(block, word));
  *error = buf;
  return false;
}

// A line that did not fit: when acquire fails with kSetFull (warpcache: every way of the set
// is referenced or busy; a baseline: every line is pinned) the op reads the block from the
// device into this thread's own DMA line instead, as blockdev's CachedBlockDevice does. Any
// other failure aborts the run.
class Bypass {
 public:
  explicit Bypass(cache::Backend& b) : b_(b) {}
  ~Bypass() {
    if (line_ != nullptr) b_.free(line_, kLineBytes);
  }
  Bypass(const Bypass&) = delete;
  Bypass& operator=(const Bypass&) = delete;

  bool prepare(std::string* error) {
    void* p = nullptr;
    if (cache::Status s = b_.alloc(kLineBytes, &p); !s.is_ok()) {
      *error = "allocating a bypass line: " + s.to_string();
      return false;
    }
    line_ = static_cast<uint8_t*>(p);
    return true;
  }
  // Reads `block` into line() if `why` is "full"; otherwise reports `why` as the failure.
  bool read(uint64_t block, const cache::Status& why, std::string* error) {
    if (why.code() != cache::Code::kSetFull) {
      *error = "acquire of block " + std::to_string(block) + " failed: " + why.to_string();
      return false;
    }
    cache::Backend::Op op;
    op.block = block;
    op.data = line_;
    b_.io(&op, 1);
    if (!op.status.is_ok()) {
      *error = "bypass read of block " + std::to_string(block) +
               " (cache full) failed: " + op.status.to_string();
      return false;
    }
    ++count_;
    return true;
  }
  const uint8_t* line() const { return line_; }
  uint64_t count() const { return count_; }

 private:
  cache::Backend& b_;
  uint8_t* line_ = nullptr;
  uint64_t count_ = 0;
};

// ---------------------------------------------------------------------------------------------
// warpcache: warpfs::cache::Cache
// ---------------------------------------------------------------------------------------------

// One thread's use of the cache. Scalar ops use the one-lane API, warp ops the 32-lane API.
class WarpCacheSession {
 public:
  WarpCacheSession(cache::Cache& c, bool readahead) : c_(c), bypass_(c.backend()) {
    stream_.readahead = readahead;
    for (cache::Lane& l : lanes_) l = cache::Lane{0, cache::Intent::kRead, nullptr};
  }
  WarpCacheSession(const WarpCacheSession&) = delete;
  WarpCacheSession& operator=(const WarpCacheSession&) = delete;

  bool prepare(std::string* error) { return bypass_.prepare(error); }
  void set_sequential(bool on) { sequential_ = on; }
  void set_counting(bool) {}  // warpcache's hits come from Cache::stats()
  uint64_t hits() const { return 0; }
  uint64_t lookups() const { return 0; }
  uint64_t bypassed() const { return bypass_.count(); }

  bool scalar(uint64_t block, uint32_t word, uint64_t* sum, std::string* error) {
    lanes_[0].block = block;
    cache::LineRef ref;
    bool ok;
    if (c_.acquire(lanes_, 1, &ref) == 0) [[likely]] {
      ok = read_word(ref.data, block, word, sum, error);
      c_.release(lanes_, 1, &ref, nullptr);
    } else {
      ok = bypass_.read(block, ref.status, error) &&
           read_word(bypass_.line(), block, word, sum, error);
    }
    // Read-ahead sees every line the stream reads (P-readahead); off: the stream is RANDOM.
    if (sequential_) c_.note_read(&stream_, block, 1);
    return ok;
  }

  bool warp(uint64_t block, uint32_t word, uint64_t* sum, std::string* error) {
    for (cache::Lane& l : lanes_) l.block = block;
    cache::LineRef refs[kWarp];
    const int failed = c_.acquire(lanes_, kWarp, refs);
    bool ok = true;
    if (failed == 0) [[likely]] {
      for (int k = 0; k < kWarp && ok; ++k) {
        ok = read_word(refs[k].data, block, (word + k) & (kWords - 1), sum, error);
      }
    } else {
      // One block, one group: it fails as a whole (followers copy the leader's status) and
      // then holds nothing.
      if (failed != kWarp) {
        *error = "a 32-lane acquire of one block failed on " + std::to_string(failed) +
                 " lanes only (lanes of one group must share the leader's status)";
        return false;
      }
      ok = bypass_.read(block, refs[0].status, error);
      for (int k = 0; k < kWarp && ok; ++k) {
        ok = read_word(bypass_.line(), block, (word + k) & (kWords - 1), sum, error);
      }
      return ok;
    }
    c_.release(lanes_, kWarp, refs, nullptr);
    return ok;
  }

 private:
  cache::Cache& c_;
  Bypass bypass_;
  cache::Lane lanes_[kWarp];
  cache::ReadStream stream_;
  bool sequential_ = false;
};

// ---------------------------------------------------------------------------------------------
// Baselines
// ---------------------------------------------------------------------------------------------

// Line memory for a baseline, from the backend (DMA memory: fills need no bounce copy).
class LineArena {
 public:
  explicit LineArena(cache::Backend& b) : b_(b) {}
  ~LineArena() {
    if (data_ != nullptr) b_.free(data_, bytes_);
  }
  LineArena(const LineArena&) = delete;
  LineArena& operator=(const LineArena&) = delete;
  bool alloc(uint64_t lines, std::string* error) {
    bytes_ = lines * kLineBytes;
    void* p = nullptr;
    if (cache::Status s = b_.alloc(bytes_, &p); !s.is_ok()) {
      *error =
          "allocating " + std::to_string(bytes_ >> 20) + " MiB of line memory: " + s.to_string();
      return false;
    }
    data_ = static_cast<uint8_t*>(p);
    return true;
  }
  uint8_t* line(uint32_t l) const { return data_ + uint64_t{l} * kLineBytes; }
  cache::Backend& backend() { return b_; }

 private:
  cache::Backend& b_;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

// mutex_lru: a hash map and an LRU list behind one mutex (GPUfs's global-lock buffer cache).
// A hit takes the lock once (look up, move to the front, pin); the release drops the pin
// without the lock. A miss evicts the least recently used unpinned line and fills it, all
// under the lock.
class MutexLru {
 public:
  struct Node {
    uint64_t block;              // under mu_; kNoBlock: free
    uint32_t line;               // fixed
    std::atomic<uint32_t> pins;  // raised under mu_, dropped without it
  };
  using Handle = Node*;
  static constexpr uint64_t kNoBlock = ~0ull;

  MutexLru(cache::Backend& b, uint64_t lines) : arena_(b), lines_(lines) {}
  bool init(std::string* error) {
    if (!arena_.alloc(lines_, error)) return false;
    map_.reserve(lines_ * 2);  // no rehash during the run
    for (uint64_t l = 0; l < lines_; ++l) {
      Node& n = lru_.emplace_back();
      n.block = kNoBlock;
      n.line = static_cast<uint32_t>(l);
      n.pins.store(0, std::memory_order_relaxed);
    }
    return true;
  }

  // The pinned line holding `block`. `hit` says whether it was cached.
  cache::Status acquire(uint64_t block, Handle* out, bool* hit) {
    std::lock_guard<std::mutex> g(mu_);
    if (auto it = map_.find(block); it != map_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      it->second->pins.fetch_add(1, std::memory_order_relaxed);  // under mu_: no evictor races
      *out = &*it->second;
      *hit = true;
      return cache::Status::ok();
    }
    *hit = false;
    auto victim = lru_.end();
    for (auto r = lru_.rbegin(); r != lru_.rend(); ++r) {
      // Acquire: the last reader's loads from the line happen before our fill overwrites it.
      if (r->pins.load(std::memory_order_acquire) == 0) {
        victim = std::prev(r.base());
        break;
      }
    }
    if (victim == lru_.end()) {
      return cache::Status::error(cache::Code::kSetFull, "mutex_lru: every line is pinned");
    }
    if (victim->block != kNoBlock) map_.erase(victim->block);
    victim->block = kNoBlock;
    cache::Backend::Op op;
    op.block = block;
    op.data = arena_.line(victim->line);
    arena_.backend().io(&op, 1);
    if (!op.status.is_ok()) return op.status;  // the node stays free, at the back
    victim->block = block;
    map_.emplace(block, victim);
    lru_.splice(lru_.begin(), lru_, victim);
    victim->pins.fetch_add(1, std::memory_order_relaxed);
    *out = &*victim;
    return cache::Status::ok();
  }
  const uint8_t* data(Handle h) const { return arena_.line(h->line); }
  cache::Backend& backend() { return arena_.backend(); }
  // Release: our loads from the line happen before an evictor that sees the pin gone.
  void release(Handle h) { h->pins.fetch_sub(1, std::memory_order_release); }

 private:
  LineArena arena_;
  uint64_t lines_;
  std::mutex mu_;        // guards map_, lru_ and each node's block; the fill runs under it
  std::list<Node> lru_;  // front: most recently used
  std::unordered_map<uint64_t, std::list<Node>::iterator> map_;
};

#if defined(WARPFS_HAVE_TBB)
// tbb_hash: GPUfs's redesign, a concurrent hash map (per-bucket/per-element locks) from block
// to line, over a preallocated line array evicted by a clock with an atomic hand.
//
// Protocol. pins counts readers; kClaimed marks a line an evictor owns. A reader pins only
// while holding the block's map element (a const_accessor), with fetch_add; if it sees
// kClaimed it undoes and retries. An evictor claims with CAS(pins: 0 -> kClaimed), so a
// pinned line is never claimed and a claimed one is never pinned. A miss inserts the block
// (an exclusive accessor: concurrent missers of the block wait in the map until it is filled),
// claims a victim, erases the victim's old block from the map (which waits for readers holding
// that element; they never wait for us), fills the line, publishes block -> line, and turns
// the claim into its own pin with one fetch_sub (readers' undone increments stay balanced).
class TbbHash {
 public:
  using Handle = uint32_t;
  static constexpr uint32_t kClaimed = 1u << 31;
  static constexpr uint64_t kNoBlock = ~0ull;

  TbbHash(cache::Backend& b, uint64_t lines)
      : arena_(b), lines_(lines), map_(static_cast<size_t>(lines * 2)) {}
  bool init(std::string* error) {
    if (!arena_.alloc(lines_, error)) return false;
    meta_.reset(new Meta[lines_]);
    for (uint64_t l = 0; l < lines_; ++l) {
      meta_[l].pins.store(0, std::memory_order_relaxed);
      meta_[l].ref.store(0, std::memory_order_relaxed);
      meta_[l].block = kNoBlock;
    }
    return true;
  }

  cache::Status acquire(uint64_t block, Handle* out, bool* hit) {
    for (;;) {
      {
        Map::const_accessor a;
        if (map_.find(a, block) && pin(a->second)) {
          *out = a->second;
          *hit = true;
          return cache::Status::ok();
        }
      }
      Map::accessor a;
      if (!map_.insert(a, block)) {
        // Inserted by another thread, which held the element until the line was filled.
        if (pin(a->second)) {
          *out = a->second;
          *hit = true;
          return cache::Status::ok();
        }
        a.release();  // its line is being evicted: retry once the evictor erased it
        std::this_thread::yield();
        continue;
      }
      *hit = false;
      uint32_t v;
      if (!claim_victim(&v)) {
        map_.erase(a);
        return cache::Status::error(cache::Code::kSetFull, "tbb_hash: every line is pinned");
      }
      Meta& m = meta_[v];
      if (m.block != kNoBlock) map_.erase(m.block);
      m.block = kNoBlock;
      cache::Backend::Op op;
      op.block = block;
      op.data = arena_.line(v);
      arena_.backend().io(&op, 1);
      if (!op.status.is_ok()) {
        m.pins.fetch_sub(kClaimed, std::memory_order_release);  // free again, unmapped
        map_.erase(a);
        return op.status;
      }
      m.block = block;
      m.ref.store(1, std::memory_order_relaxed);
      a->second = v;
      // Release: the fill is visible to whoever pins the line next. Claim -> one pin (ours).
      m.pins.fetch_sub(kClaimed - 1, std::memory_order_release);
      *out = v;
      return cache::Status::ok();
    }
  }
  const uint8_t* data(Handle h) const { return arena_.line(h); }
  cache::Backend& backend() { return arena_.backend(); }
  // Release: our loads from the line happen before an evictor's claim sees the pin gone.
  void release(Handle h) { meta_[h].pins.fetch_sub(1, std::memory_order_release); }

 private:
  using Map = tbb::concurrent_hash_map<uint64_t, uint32_t>;
  struct alignas(port::kCacheLine) Meta {
    std::atomic<uint32_t> pins;
    std::atomic<uint32_t> ref;  // clock reference bit
    uint64_t block;             // written only by the line's claimer
  };

  bool pin(uint32_t l) {
    Meta& m = meta_[l];
    // Acquire: pairs with the filler's release, so the line's data is visible.
    if (m.pins.fetch_add(1, std::memory_order_acquire) & kClaimed) {
      m.pins.fetch_sub(1, std::memory_order_relaxed);
      return false;
    }
    if (m.ref.load(std::memory_order_relaxed) == 0) m.ref.store(1, std::memory_order_relaxed);
    return true;
  }
  // Clock: skip pinned or claimed lines, give referenced ones a second chance.
  bool claim_victim(uint32_t* out) {
    for (uint64_t i = 0; i < 4 * lines_; ++i) {
      const auto l = static_cast<uint32_t>(hand_.fetch_add(1, std::memory_order_relaxed) % lines_);
      Meta& m = meta_[l];
      if (m.pins.load(std::memory_order_relaxed) != 0) continue;
      if (m.ref.load(std::memory_order_relaxed) != 0) {
        m.ref.store(0, std::memory_order_relaxed);
        continue;
      }
      uint32_t zero = 0;
      // Acquire: the last reader's loads from the line happen before our fill.
      if (m.pins.compare_exchange_strong(zero, kClaimed, std::memory_order_acquire,
                                         std::memory_order_relaxed)) {
        *out = l;
        return true;
      }
    }
    return false;
  }

  LineArena arena_;
  uint64_t lines_;
  Map map_;
  std::unique_ptr<Meta[]> meta_;
  std::atomic<uint64_t> hand_{0};
};
#endif  // WARPFS_HAVE_TBB

// One thread's use of a baseline table. A warp op is 32 scalar acquires of the same block
// (no coalescing), then the 32 reads, then the 32 releases.
template <class Table>
class BaselineSession {
 public:
  explicit BaselineSession(Table& t) : t_(t), bypass_(t.backend()) {}
  BaselineSession(const BaselineSession&) = delete;
  BaselineSession& operator=(const BaselineSession&) = delete;

  bool prepare(std::string* error) { return bypass_.prepare(error); }
  void set_sequential(bool) {}
  void set_counting(bool on) { counting_ = on; }
  uint64_t hits() const { return hits_; }
  uint64_t lookups() const { return lookups_; }
  uint64_t bypassed() const { return bypass_.count(); }

  bool scalar(uint64_t block, uint32_t word, uint64_t* sum, std::string* error) {
    typename Table::Handle h;
    bool held = false;
    if (!get(block, &h, &held, error)) return false;
    const bool ok = read_word(held ? t_.data(h) : bypass_.line(), block, word, sum, error);
    if (held) t_.release(h);
    return ok;
  }
  bool warp(uint64_t block, uint32_t word, uint64_t* sum, std::string* error) {
    typename Table::Handle h[kWarp];
    bool held = false;
    if (!get(block, &h[0], &held, error)) return false;
    int got = held ? 1 : 0;
    bool ok = true;
    // While lane 0 pins the line the other lanes hit it; if lane 0 was bypassed, all are.
    for (; held && got < kWarp && ok; ++got) {
      bool again = false;
      ok = get(block, &h[got], &again, error);
      if (ok && !again) {
        *error = "block " + std::to_string(block) + " did not fit although lane 0 pins it";
        ok = false;
      }
      if (!ok || !again) break;
    }
    for (int k = 0; k < kWarp && ok; ++k) {
      ok = read_word(held ? t_.data(h[k]) : bypass_.line(), block, (word + k) & (kWords - 1), sum,
                     error);
    }
    for (int k = 0; k < got; ++k) t_.release(h[k]);
    return ok;
  }

 private:
  // Acquires `block` (*held) or, when the table is full, reads it into the bypass line.
  bool get(uint64_t block, typename Table::Handle* h, bool* held, std::string* error) {
    bool hit = false;
    const cache::Status s = t_.acquire(block, h, &hit);
    *held = s.is_ok();
    if (!s.is_ok() && !bypass_.read(block, s, error)) return false;
    if (counting_) {
      ++lookups_;
      hits_ += hit ? 1 : 0;
    }
    return true;
  }
  Table& t_;
  Bypass bypass_;
  bool counting_ = false;
  uint64_t hits_ = 0, lookups_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Measurement
// ---------------------------------------------------------------------------------------------

struct Point {
  std::string impl;
  std::string pattern;
  unsigned threads = 1;
  double duration_s = 0;
};

struct Stats {
  double ops_per_s = 0, hit_rate = 0;
  uint64_t p50_ns = 0, p99_ns = 0, p999_ns = 0, max_ns = 0;
  uint64_t bypassed = 0;  // warpcache lanes served from the device because their set was full
};

// The shared inputs of the block generators, built once.
struct Workload {
  uint64_t lines = 0;               // capacity in lines
  std::vector<uint32_t> miss_perm;  // all_miss: a permutation of 8 capacities
  std::vector<uint32_t> zipf;       // zipf: kZipfTable samples over 4 capacities
  uint64_t hot_set() const { return std::max<uint64_t>(lines / 4, 1); }
};

// One thread: its session, its block sequence, its record.
template <class Session, class Gen>
struct Worker {
  // The session is built in place: a warpcache session owns DMA memory and does not move.
  template <class Make>
  Worker(Make& make, Gen g, bool w) : session(make()), gen(g), warp(w) {}
  Session session;
  Gen gen;
  bool warp;
  LatencyLog log;
  uint64_t ops = 0;  // in the measured window
  uint64_t sum = 0;
  std::string error;
  bool op() {
    const uint64_t block = gen.next();
    const uint32_t word = word_of(block);
    return warp ? session.warp(block, word, &sum, &error)
                : session.scalar(block, word, &sum, &error);
  }
};

std::atomic<uint64_t> g_sink{0};  // checksums end here, so no read is dead code

// Runs the workers, one per thread, for the point's window after a warm-up (10% of the
// duration, at most 0.2 s). Each thread reads the clock on every kSampleEvery-th op only:
// that op's latency is recorded, and the window's start and end are checked there, so a
// thread's op count is exact to kSampleEvery ops at either end. `c` (warpcache only) gives the
// hit rate from the cache's own counters, snapshotted at the window's ends.
template <class W>
bool measure(const Point& p, std::vector<std::unique_ptr<W>>& workers, const cache::Cache* c,
             Stats* out, std::string* error) {
  const uint64_t warmup_ns = static_cast<uint64_t>(std::min(0.2, p.duration_s * 0.1) * 1e9);
  const uint64_t window_ns = static_cast<uint64_t>(p.duration_s * 1e9);
  std::atomic<unsigned> ready{0};
  std::atomic<uint64_t> t0{0}, t1{0};  // published by the main thread once all are ready
  Failure failure;

  auto body = [&](unsigned t) {
    W& w = *workers[t];
    ready.fetch_add(1, std::memory_order_relaxed);
    uint64_t end;
    while ((end = t1.load(std::memory_order_acquire)) == 0) std::this_thread::yield();
    const uint64_t start = t0.load(std::memory_order_relaxed);
    bool counting = false;
    for (uint64_t i = 0;; ++i) {
      if ((i & (kSampleEvery - 1)) == 0) {
        if (failure.failed()) break;
        const uint64_t s = port::now_ns();
        if (s >= end) break;
        if (!counting && s >= start) {
          counting = true;
          w.session.set_counting(true);
        }
        if (!w.op()) {
          failure.report(w.error);
          break;
        }
        const uint64_t e = port::now_ns();
        if (counting) w.log.add(e - s);
      } else if (!w.op()) {
        failure.report(w.error);
        break;
      }
      if (counting) ++w.ops;
    }
    w.session.set_counting(false);
    g_sink.fetch_add(w.sum, std::memory_order_relaxed);
  };

  std::vector<std::thread> threads;
  threads.reserve(p.threads);
  for (unsigned t = 0; t < p.threads; ++t) threads.emplace_back(body, t);
  while (ready.load(std::memory_order_relaxed) < p.threads) std::this_thread::yield();
  const uint64_t now = port::now_ns();
  t0.store(now + warmup_ns, std::memory_order_relaxed);
  t1.store(now + warmup_ns + window_ns, std::memory_order_release);  // publishes t0 too
  cache::CacheStats before, after;
  if (c != nullptr) {
    port::sleep_ns(warmup_ns);
    before = c->stats();
    port::sleep_ns(window_ns);
    after = c->stats();
  }
  for (std::thread& th : threads) th.join();

  if (failure.failed()) {
    *error = failure.what();
    return false;
  }
  std::vector<uint64_t> all;
  uint64_t ops = 0, hits = 0, lookups = 0;
  for (const auto& w : workers) {
    w->log.append_to(&all);
    ops += w->ops;
    hits += w->session.hits();
    lookups += w->session.lookups();
    out->bypassed += w->session.bypassed();
  }
  if (all.empty()) {
    *error = "no op completed in the measurement window";
    return false;
  }
  if (c != nullptr) {
    // The cache counts demand acquires only (read-ahead fills are readahead_lines): hits and
    // locked hits over every acquire group (hit, locked hit, miss, set full). A warp of one
    // block is one group.
    const uint64_t h = (after.hits - before.hits) + (after.locked_hits - before.locked_hits);
    hits = h;
    lookups = h + (after.misses - before.misses) + (after.set_full - before.set_full);
  }
  std::sort(all.begin(), all.end());
  out->ops_per_s = static_cast<double>(ops) / (static_cast<double>(window_ns) / 1e9);
  out->p50_ns = percentile(all, 0.50);
  out->p99_ns = percentile(all, 0.99);
  out->p999_ns = percentile(all, 0.999);
  out->max_ns = all.back();
  out->hit_rate = lookups > 0 ? std::min(1.0, static_cast<double>(hits) / lookups) : 0;
  return true;
}

// Builds the point's block generator for thread t.
template <class Fn>
bool with_generator(const Point& p, const Workload& wl, unsigned t, std::atomic<uint64_t>* cursor,
                    Fn&& fn) {
  const std::string& pat = p.pattern;
  if (pat == "all_hit" || pat == "warp_same_block") {
    return fn(UniformGen{Rng(t + 1), wl.hot_set()});
  }
  if (pat == "zipf") {
    // Each thread starts at its own place in the table, far from the others.
    return fn(TableGen{wl.zipf.data(), static_cast<uint32_t>(uint64_t{t} * 0x9e3779b9u)});
  }
  if (pat == "all_miss") {
    return fn(SharedCursorGen{wl.miss_perm.data(), wl.miss_perm.size(), cursor});
  }
  // sequential_*: slice t of the 4-capacity region.
  const uint64_t region = wl.lines * kScanRegion;
  const uint64_t lo = region * t / p.threads, hi = region * (t + 1) / p.threads;
  return fn(ScanGen{lo, hi, lo});
}

// Brings the implementation to the pattern's starting state, through its own acquire path:
// all_hit / warp_same_block: the working set cached; all_miss: the cache full of the blocks
// the permutation reaches last, so the window's misses evict (and nothing it asks for is
// cached). zipf and sequential start cold; the warm-up takes them to a steady state.
template <class Session>
bool prefill(const Point& p, const Workload& wl, Session& s, std::string* error) {
  uint64_t sum = 0;
  if (p.pattern == "all_hit" || p.pattern == "warp_same_block") {
    for (uint64_t b = 0; b < wl.hot_set(); ++b) {
      if (!s.scalar(b, word_of(b), &sum, error)) return false;
    }
  } else if (p.pattern == "all_miss") {
    const uint64_t n = wl.miss_perm.size();
    for (uint64_t i = n - std::min(n, wl.lines); i < n; ++i) {
      const uint64_t b = wl.miss_perm[i];
      if (!s.scalar(b, word_of(b), &sum, error)) return false;
    }
  }
  g_sink.fetch_add(sum, std::memory_order_relaxed);
  return true;
}

// Runs `p` with sessions made by make_session(); see measure().
template <class MakeSession>
bool run_sessions(const Point& p, const Workload& wl, MakeSession&& make_session,
                  const cache::Cache* c, Stats* out, std::string* error) {
  using Session = decltype(make_session());
  const bool warp = p.pattern == "warp_same_block";
  const bool sequential = p.pattern.rfind("sequential_", 0) == 0;
  {
    Session s = make_session();
    if (!s.prepare(error) || !prefill(p, wl, s, error)) {
      *error = "prefill: " + *error;
      return false;
    }
  }
  std::atomic<uint64_t> cursor{0};
  // One vector per generator type; only the pattern's one is used.
  std::vector<std::unique_ptr<Worker<Session, UniformGen>>> wu;
  std::vector<std::unique_ptr<Worker<Session, TableGen>>> wt;
  std::vector<std::unique_ptr<Worker<Session, SharedCursorGen>>> wc;
  std::vector<std::unique_ptr<Worker<Session, ScanGen>>> ws;
  for (unsigned t = 0; t < p.threads; ++t) {
    const bool ok = with_generator(p, wl, t, &cursor, [&](auto gen) {
      using Gen = decltype(gen);
      auto w = std::make_unique<Worker<Session, Gen>>(make_session, gen, warp);
      w->session.set_sequential(sequential);
      if (!w->session.prepare(error)) return false;
      if constexpr (std::is_same_v<Gen, UniformGen>) wu.push_back(std::move(w));
      if constexpr (std::is_same_v<Gen, TableGen>) wt.push_back(std::move(w));
      if constexpr (std::is_same_v<Gen, SharedCursorGen>) wc.push_back(std::move(w));
      if constexpr (std::is_same_v<Gen, ScanGen>) ws.push_back(std::move(w));
      return true;
    });
    if (!ok) return false;
  }
  if (!wu.empty()) return measure(p, wu, c, out, error);
  if (!wt.empty()) return measure(p, wt, c, out, error);
  if (!wc.empty()) return measure(p, wc, c, out, error);
  return measure(p, ws, c, out, error);
}

// One implementation at one point, on its own controller and a fresh cache.
bool run_point(const Point& p, const Options& o, const Workload& wl,
               const std::shared_ptr<nvme::BackingStore>& store, Stats* out, std::string* error) {
  std::unique_ptr<Rig> rig = Rig::open(store, error);
  if (!rig) return false;
  if (p.impl == "warpcache") {
    cache::CacheOptions co;
    co.sets = o.sets;
    co.ways = o.ways;
    co.readahead_lines = 32;  // the sessions turn it off per stream where asked
    std::unique_ptr<cache::Cache> c = cache::Cache::create(rig->backend(), co, error);
    if (!c) {
      *error = "creating the cache: " + *error;
      return false;
    }
    const bool readahead = p.pattern == "sequential_ra_on";
    const bool ok = run_sessions(
        p, wl, [&] { return WarpCacheSession(*c, readahead); }, c.get(), out, error);
    c->drain_readahead();
    return ok;
  }
  if (p.impl == "mutex_lru") {
    MutexLru t(rig->backend(), wl.lines);
    if (!t.init(error)) return false;
    return run_sessions(
        p, wl, [&] { return BaselineSession<MutexLru>(t); }, nullptr, out, error);
  }
#if defined(WARPFS_HAVE_TBB)
  if (p.impl == "tbb_hash") {
    TbbHash t(rig->backend(), wl.lines);
    if (!t.init(error)) return false;
    return run_sessions(
        p, wl, [&] { return BaselineSession<TbbHash>(t); }, nullptr, out, error);
  }
#endif
  *error = "unknown implementation " + p.impl;
  return false;
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

void print_point(const Point& p, const Options& o, const Stats& s) {
  std::printf(
      "{\"bench\":\"cache\",\"impl\":\"%s\",\"threads\":%u,\"pattern\":\"%s\",\"line_bytes\":%u,"
      "\"ways\":%u,\"ops_per_s\":%.1f,\"p50_ns\":%" PRIu64 ",\"p99_ns\":%" PRIu64
      ",\"p999_ns\":%" PRIu64 ",\"max_ns\":%" PRIu64 ",\"hit_rate\":%.4f}\n",
      p.impl.c_str(), p.threads, p.pattern.c_str(), kLineBytes, o.ways, s.ops_per_s, s.p50_ns,
      s.p99_ns, s.p999_ns, s.max_ns, s.hit_rate);
  std::fflush(stdout);
}

void print_ratio(const std::string& name, const std::string& pattern, unsigned threads, double a,
                 double b) {
  std::printf(
      "{\"bench\":\"cache\",\"ratio\":\"%s\",\"pattern\":\"%s\",\"threads\":%u,"
      "\"ops_ratio\":%.3f}\n",
      name.c_str(), pattern.c_str(), threads, b > 0 ? a / b : 0.0);
  std::fflush(stdout);
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kProgram, what.c_str());
  std::exit(1);
}

Stats run_or_die(const Point& p, const Options& o, const Workload& wl,
                 const std::shared_ptr<nvme::BackingStore>& store) {
  Stats s;
  std::string error;
  if (!run_point(p, o, wl, store, &s, &error)) {
    fail(p.impl + " pattern=" + p.pattern + " threads=" + std::to_string(p.threads) + ": " + error +
         " (benchmark aborted; no numbers reported for this point)");
  }
  if (s.bypassed > 0) {
    std::fprintf(stderr,
                 "%s: %s pattern=%s threads=%u: %" PRIu64
                 " acquires found their set full and read the device directly\n",
                 kProgram, p.impl.c_str(), p.pattern.c_str(), p.threads, s.bypassed);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);

  Workload wl;
  wl.lines = uint64_t{o.sets} * o.ways;
  const uint64_t device_lines = wl.lines * kMissRegion;
  std::shared_ptr<nvme::BackingStore> store = nvme::BackingStore::ram(device_lines * kLineBytes);
  if (!store)
    fail("cannot allocate the " + std::to_string(device_lines * kLineBytes >> 20) +
         " MiB RAM backing store");
  {
    // The pattern goes through the same path the caches read it back by.
    std::string error;
    std::unique_ptr<Rig> rig = Rig::open(store, &error);
    if (!rig || !write_pattern(rig->backend(), device_lines, &error)) {
      fail("preparing the device: " + error);
    }
  }
  for (const std::string& pat : o.patterns) {
    if (pat == "all_miss") wl.miss_perm = random_permutation(device_lines, 7);
    if (pat == "zipf") wl.zipf = zipf_table(wl.lines * kScanRegion, kZipfTheta, 11);
  }

  std::vector<std::string> baselines = {"mutex_lru"};
#if defined(WARPFS_HAVE_TBB)
  baselines.push_back("tbb_hash");
#endif
  std::map<unsigned, double> scalar_hit_ops;  // warpcache all_hit ops/s by threads
  for (const std::string& pat : o.patterns) {
    for (const unsigned threads : o.threads) {
      Point p;
      p.pattern = pat;
      p.threads = threads;
      p.duration_s = o.duration_s;
      p.impl = "warpcache";
      const Stats wc = run_or_die(p, o, wl, store);
      print_point(p, o, wc);
      if (pat == "all_hit") scalar_hit_ops[threads] = wc.ops_per_s;
      if (pat == "sequential_ra_on") continue;  // the baselines have no read-ahead
      std::vector<std::pair<std::string, double>> base_ops;
      for (const std::string& b : baselines) {
        p.impl = b;
        const Stats bs = run_or_die(p, o, wl, store);
        print_point(p, o, bs);
        base_ops.emplace_back(b, bs.ops_per_s);
      }
      for (const auto& [b, ops] : base_ops)
        print_ratio("warpcache/" + b, pat, threads, wc.ops_per_s, ops);
      if (pat == "warp_same_block" && scalar_hit_ops.count(threads)) {
        // The coalescing claim: a 32-lane same-block warp costs about one scalar acquire.
        print_ratio("warpcache_warp32/warpcache_scalar", pat, threads, wc.ops_per_s,
                    scalar_hit_ops[threads]);
      }
    }
  }
  return 0;
}
