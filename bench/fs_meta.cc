// warpfs-bench-meta: a metadata and small-file benchmark for any mounted filesystem.
//
// One invocation runs one layout inside a fresh directory it makes under --dir (and removes
// at the end), single-threaded, with plain POSIX calls, so the same program measures warpfs,
// tmpfs, passthrough_ll and fuse2fs alike:
//   flat (default)  N empty files in one directory: create, stat (random order, once after
//                   FUSE's caches expired, once from the kernel's caches), readdir, unlink
//   --tree          N empty files spread over a two-level tree of directories of at most
//                   kFilesPerDir files: mkdir, create, stat (both passes), readdir (every
//                   directory), unlink, rmdir. mkdir and rmdir time --dirs directories (the
//                   tree's, then empty ones under its top level), N/4 by default: the tree
//                   alone has only N/kFilesPerDir + sqrt of that, too few to time
//   --mix           N small files (1..16 KiB, seeded sizes) written, then --mix-ops operations
//                   on random files: 70% read the whole file back and check its bytes, 30%
//                   rewrite it (O_TRUNC) with new contents
// A phase's time covers its system calls only; the setup of name lists and buffers is outside.
//
// Output: one JSON object per phase on stdout:
//   {"bench":"fs_meta","layout":"flat","op":"create","files":10000,"ops":10000,
//    "seconds":1.2,"ops_per_s":8333.3,"client_cpu_s":0.9,"daemon_cpu_s":0.7}
// client_cpu_s is this process's user + system time (what the kernel spends on its system
// calls included); daemon_cpu_s is the user + system time of the --pid processes (all their
// threads) over the phase, from /proc/PID/stat, or null without --pid.
//
// Only libc and the C++ standard library: it builds where libfuse does not. A failed system
// call or a wrong byte read back stops the run with a message naming the file and exit status
// 1; bad options print the usage and exit 2.
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"

namespace {

using warpfs::bench::parse_uint;
using warpfs::bench::Rng;
using warpfs::bench::split_list;

constexpr const char* kProgram = "warpfs-bench-meta";
constexpr uint64_t kFilesPerDir = 100;     // --tree: files per leaf directory
constexpr uint64_t kMinSmallBytes = 1024;  // --mix: file sizes, uniform in this range
constexpr uint64_t kMaxSmallBytes = 16384;
constexpr unsigned kReadPercent = 70;       // --mix: the rest are rewrites
constexpr double kMinReaddirSeconds = 0.3;  // readdir repeats whole passes at least this long
constexpr size_t kCachedChunk = 256;        // stat_cached: files stat'd twice in a row

struct Options {
  std::string dir;
  uint64_t files = 10000;
  uint64_t mix_ops = 0;  // 0: as many as --files
  uint64_t dirs = 0;     // --tree: directories mkdir and rmdir time; 0: files / 4
  enum Layout { kFlat, kTree, kMix } layout = kFlat;
  std::vector<int> pids;
  uint64_t seed = 1;
  uint64_t settle_ms = 1100;  // longer than a 1 s entry and attribute timeout (passthrough_ll's)
};

void print_usage(FILE* f) {
  std::fprintf(f,
               "usage: %s --dir DIR [--files N] [--tree [--dirs D] | --mix] [--mix-ops M]\n"
               "       [--pid LIST] [--seed S] [--settle-ms MS]\n"
               "  --dir DIR      an existing directory on the filesystem to measure; the run\n"
               "                 works in a new subdirectory and removes it at the end\n"
               "  --files N      files per phase (default 10000)\n"
               "  --tree         spread the files over a two-level tree, %llu per directory\n"
               "                 (default: all in one directory)\n"
               "  --dirs D       --tree: directories the mkdir and rmdir phases time, the\n"
               "                 tree's and then empty ones beside them (default N/4)\n"
               "  --mix          small files (%llu..%llu bytes): write them, then a %u/%u\n"
               "                 read/rewrite mix\n"
               "  --mix-ops M    operations in the --mix phase (default: N)\n"
               "  --pid LIST     daemon process ids whose CPU time each phase reports\n"
               "  --seed S       file sizes and operation order (default 1)\n"
               "  --settle-ms MS wait before the stat phase, so that FUSE's cached names\n"
               "                 and attributes expire (default 1100)\n",
               kProgram, static_cast<unsigned long long>(kFilesPerDir),
               static_cast<unsigned long long>(kMinSmallBytes),
               static_cast<unsigned long long>(kMaxSmallBytes), kReadPercent, 100 - kReadPercent);
}

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kProgram, what.c_str());
  print_usage(stderr);
  std::exit(2);
}

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  std::fprintf(stderr, "%s: %s %s: %s\n", kProgram, what.c_str(), path.c_str(),
               std::strerror(errno));
  std::exit(1);
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      std::exit(0);
    }
    if (arg == "--tree" || arg == "--mix") {
      if (o.layout != Options::kFlat) usage_error("--tree and --mix exclude each other");
      o.layout = arg == "--tree" ? Options::kTree : Options::kMix;
      continue;
    }
    if (arg != "--dir" && arg != "--files" && arg != "--mix-ops" && arg != "--pid" &&
        arg != "--seed" && arg != "--settle-ms" && arg != "--dirs") {
      usage_error("unknown option '" + arg + "'");
    }
    if (i + 1 >= argc) usage_error(arg + " needs a value");
    const std::string value = argv[++i];
    uint64_t u = 0;
    if (arg == "--dir") {
      o.dir = value;
    } else if (arg == "--files") {
      if (!parse_uint(value, 1, 100'000'000, &o.files)) {
        usage_error("--files: '" + value + "' is not in 1..100000000");
      }
    } else if (arg == "--dirs") {
      if (!parse_uint(value, 1, 100'000'000, &o.dirs)) {
        usage_error("--dirs: '" + value + "' is not in 1..100000000");
      }
    } else if (arg == "--mix-ops") {
      if (!parse_uint(value, 1, 1'000'000'000, &o.mix_ops)) {
        usage_error("--mix-ops: '" + value + "' is not in 1..1000000000");
      }
    } else if (arg == "--pid") {
      for (const std::string& p : split_list(value)) {
        if (!parse_uint(p, 1, 1u << 30, &u)) usage_error("--pid: '" + p + "' is not a pid");
        o.pids.push_back(static_cast<int>(u));
      }
    } else if (arg == "--seed") {
      if (!parse_uint(value, 0, UINT64_MAX, &o.seed)) usage_error("--seed: '" + value + "'");
    } else if (arg == "--settle-ms") {
      if (!parse_uint(value, 0, 60'000, &o.settle_ms)) {
        usage_error("--settle-ms: '" + value + "' is not in 0..60000");
      }
    }
  }
  if (o.dir.empty()) usage_error("--dir is required");
  if (o.dirs != 0 && o.layout != Options::kTree) usage_error("--dirs needs --tree");
  if (o.mix_ops == 0) o.mix_ops = o.files;
  return o;
}

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double self_cpu_s() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// utime + stime of the processes (all their threads), in seconds; -1 where one has gone.
// /proc/PID/stat fields 14 and 15 (proc(5)), counted after the ")" that ends the name.
double daemons_cpu_s(const std::vector<int>& pids) {
  static const double kTicks = static_cast<double>(sysconf(_SC_CLK_TCK));
  double total = 0;
  for (const int pid : pids) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(f, line)) return -1;
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos) return -1;
    std::istringstream rest(line.substr(paren + 1));
    std::string field;
    uint64_t utime = 0, stime = 0;
    for (int n = 3; n <= 15 && rest >> field; ++n) {
      if (n == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
      if (n == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
    }
    total += static_cast<double>(utime + stime) / kTicks;
  }
  return total;
}

// Measures one phase: wall time, this process's CPU time and the daemons' CPU time, summed
// over the stretches between start() and stop(), so that a phase can leave out untimed work.
class Phase {
 public:
  Phase(const Options& o, const char* layout) : o_(o), layout_(layout) {}

  void start() {
    d0_ = o_.pids.empty() ? 0 : daemons_cpu_s(o_.pids);
    c0_ = self_cpu_s();
    t0_ = now_s();
  }
  void stop() {
    const double t1 = now_s();
    const double c1 = self_cpu_s();
    const double d1 = o_.pids.empty() ? 0 : daemons_cpu_s(o_.pids);
    secs_ += t1 - t0_;
    client_ += c1 - c0_;
    if (d0_ < 0 || d1 < 0) daemon_gone_ = true;
    daemon_ += d1 - d0_;
  }
  // Prints the phase's line and resets the sums.
  void report(const char* op, uint64_t ops) {
    const double secs = std::max(secs_, 1e-9);
    char daemon[32] = "null";
    if (!o_.pids.empty() && !daemon_gone_) std::snprintf(daemon, sizeof daemon, "%.2f", daemon_);
    std::printf(
        "{\"bench\":\"fs_meta\",\"layout\":\"%s\",\"op\":\"%s\",\"files\":%llu,\"ops\":%llu,"
        "\"seconds\":%.4f,\"ops_per_s\":%.1f,\"client_cpu_s\":%.3f,\"daemon_cpu_s\":%s}\n",
        layout_, op, static_cast<unsigned long long>(o_.files),
        static_cast<unsigned long long>(ops), secs, static_cast<double>(ops) / secs, client_,
        daemon);
    std::fflush(stdout);
    secs_ = client_ = daemon_ = 0;
    daemon_gone_ = false;
  }
  // The common case: all of `body` (which returns its op count) is timed.
  template <typename Body>
  void run(const char* op, Body&& body) {
    start();
    const uint64_t ops = body();
    stop();
    report(op, ops);
  }

 private:
  const Options& o_;
  const char* layout_;
  double t0_ = 0, c0_ = 0, d0_ = 0;
  double secs_ = 0, client_ = 0, daemon_ = 0;
  bool daemon_gone_ = false;
};

void create_empty(const std::string& path) {
  const int fd = open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) fail("create", path);
  if (close(fd) != 0) fail("close", path);
}

void make_dir(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0) fail("mkdir", path);
}

// Reads every entry of `dir` (without . and ..); a count other than `expect` is an error.
uint64_t read_dir(const std::string& dir, uint64_t expect) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) fail("opendir", dir);
  uint64_t n = 0;
  errno = 0;
  while (const dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
    errno = 0;
  }
  if (errno != 0) fail("readdir", dir);
  closedir(d);
  if (n != expect) {
    std::fprintf(stderr, "%s: readdir %s: %llu entries, expected %llu\n", kProgram, dir.c_str(),
                 static_cast<unsigned long long>(n), static_cast<unsigned long long>(expect));
    std::exit(1);
  }
  return n;
}

std::vector<size_t> shuffled(size_t n, Rng* rng) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng->below(i)]);
  return order;
}

std::string file_name(uint64_t i) {
  char name[32];
  std::snprintf(name, sizeof name, "f%07llu", static_cast<unsigned long long>(i));
  return name;
}

// flat and --tree: `dirs` are the directories to make (parents first, `work` excluded),
// `leaves` where the files go, file i in leaves[i / per_leaf].
void run_namespace(const Options& o, const char* layout, const std::vector<std::string>& dirs,
                   const std::vector<std::string>& leaves, uint64_t per_leaf) {
  std::vector<std::string> paths(o.files);
  for (uint64_t i = 0; i < o.files; ++i) paths[i] = leaves[i / per_leaf] + "/" + file_name(i);
  Rng rng(o.seed);
  const std::vector<size_t> order = shuffled(paths.size(), &rng);
  Phase phase(o, layout);
  if (!dirs.empty()) {
    phase.run("mkdir", [&] {
      for (const std::string& d : dirs) make_dir(d);
      return static_cast<uint64_t>(dirs.size());
    });
  }
  phase.run("create", [&] {
    for (const std::string& p : paths) create_empty(p);
    return o.files;
  });
  // A FUSE filesystem's kernel caches names and attributes for the timeout its daemon gives
  // (1 s in passthrough_ll and fuse2fs; a day in warpfs, whose stats the kernel answers): a
  // stat right after a fast create phase never reaches the daemon, one after a slow phase
  // does. So "stat" first waits a 1 s timeout out (every lookup goes to such a filesystem).
  // "stat_cached" then stats each chunk of kCachedChunk files twice and times only the second
  // pass, which finds what the first put in the kernel's caches however slow the filesystem is.
  timespec settle{static_cast<time_t>(o.settle_ms / 1000),
                  static_cast<long>(o.settle_ms % 1000) * 1'000'000};
  while (nanosleep(&settle, &settle) != 0 && errno == EINTR) {
  }
  auto stat_file = [&](size_t i) {
    struct stat st;
    if (stat(paths[i].c_str(), &st) != 0) fail("stat", paths[i]);
    if (!S_ISREG(st.st_mode) || st.st_size != 0) {
      std::fprintf(stderr, "%s: stat %s: not an empty regular file\n", kProgram, paths[i].c_str());
      std::exit(1);
    }
  };
  phase.run("stat", [&] {
    for (const size_t i : order) stat_file(i);
    return o.files;
  });
  for (size_t first = 0; first < order.size(); first += kCachedChunk) {
    const size_t last = std::min(order.size(), first + kCachedChunk);
    for (size_t k = first; k < last; ++k) stat_file(order[k]);
    phase.start();
    for (size_t k = first; k < last; ++k) stat_file(order[k]);
    phase.stop();
  }
  phase.report("stat_cached", o.files);
  phase.run("readdir", [&] {
    uint64_t entries = 0;
    const double start = now_s();
    do {
      for (size_t l = 0; l < leaves.size(); ++l) {
        const uint64_t first = l * per_leaf;
        read_dir(leaves[l], std::min(per_leaf, o.files - first));
        entries += std::min(per_leaf, o.files - first);
      }
    } while (now_s() - start < kMinReaddirSeconds);
    return entries;
  });
  phase.run("unlink", [&] {
    for (const size_t i : order) {
      if (unlink(paths[i].c_str()) != 0) fail("unlink", paths[i]);
    }
    return o.files;
  });
  if (!dirs.empty()) {
    phase.run("rmdir", [&] {
      for (size_t d = dirs.size(); d-- > 0;) {
        if (rmdir(dirs[d].c_str()) != 0) fail("rmdir", dirs[d]);
      }
      return static_cast<uint64_t>(dirs.size());
    });
  }
}

void run_flat(const Options& o, const std::string& work) {
  run_namespace(o, "flat", {}, {work}, o.files);
}

// ceil(sqrt(leaves)) top-level directories, each with up to as many leaf directories, then
// empty directories spread over the top level until --dirs are made in all.
void run_tree(const Options& o, const std::string& work) {
  const uint64_t leaves_n = (o.files + kFilesPerDir - 1) / kFilesPerDir;
  const uint64_t top_n = static_cast<uint64_t>(std::ceil(std::sqrt(static_cast<double>(leaves_n))));
  std::vector<std::string> dirs;  // parents before their children: mkdir order
  std::vector<std::string> leaves(leaves_n);
  for (uint64_t t = 0; t < top_n; ++t) {
    const std::string top = work + "/d" + std::to_string(t);
    dirs.push_back(top);
    for (uint64_t l = t; l < leaves_n; l += top_n) {
      leaves[l] = top + "/e" + std::to_string(l);
      dirs.push_back(leaves[l]);
    }
  }
  const uint64_t want = o.dirs != 0 ? o.dirs : std::max<uint64_t>(o.files / 4, 1);
  for (uint64_t x = 0; dirs.size() < want; ++x) {
    dirs.push_back(work + "/d" + std::to_string(x % top_n) + "/x" + std::to_string(x));
  }
  run_namespace(o, "tree", dirs, leaves, kFilesPerDir);
}

// --mix: file i's contents at generation g are a function of (i, g), so every read is checked.
void fill(std::vector<char>* buf, uint64_t i, uint32_t gen, size_t bytes) {
  buf->resize(bytes);
  uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t{gen} << 32);
  for (size_t k = 0; k < bytes; ++k) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    (*buf)[k] = static_cast<char>(x);
  }
}

void write_file(const std::string& path, const std::vector<char>& buf, int flags) {
  const int fd = open(path.c_str(), flags | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) fail("open for writing", path);
  if (write(fd, buf.data(), buf.size()) != static_cast<ssize_t>(buf.size())) fail("write", path);
  if (close(fd) != 0) fail("close", path);
}

void check_file(const std::string& path, const std::vector<char>& want, std::vector<char>* got) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("open for reading", path);
  got->resize(want.size() + 1);  // one more: a longer file shows up as a short read's absence
  size_t n = 0;
  for (ssize_t r; (r = read(fd, got->data() + n, got->size() - n)) != 0;
       n += static_cast<size_t>(r)) {
    if (r < 0) fail("read", path);
    if (n + static_cast<size_t>(r) == got->size()) break;
  }
  close(fd);
  if (n != want.size() || std::memcmp(got->data(), want.data(), n) != 0) {
    std::fprintf(stderr, "%s: %s: read back %zu bytes that differ from the %zu written\n", kProgram,
                 path.c_str(), n, want.size());
    std::exit(1);
  }
}

void run_mix(const Options& o, const std::string& work) {
  Rng rng(o.seed);
  std::vector<std::string> paths(o.files);
  std::vector<uint32_t> sizes(o.files), gens(o.files, 0);
  for (uint64_t i = 0; i < o.files; ++i) {
    paths[i] = work + "/" + file_name(i);
    sizes[i] =
        static_cast<uint32_t>(kMinSmallBytes + rng.below(kMaxSmallBytes - kMinSmallBytes + 1));
  }
  std::vector<uint64_t> picks(o.mix_ops);
  std::vector<bool> is_read(o.mix_ops);
  for (uint64_t k = 0; k < o.mix_ops; ++k) {
    picks[k] = rng.below(o.files);
    is_read[k] = rng.below(100) < kReadPercent;
  }
  std::vector<char> buf, got;
  Phase phase(o, "mix");
  // Contents are generated inside the timed loop: xorshift over at most 16 KiB costs a few
  // microseconds, small beside a create + write + close through any filesystem.
  phase.run("smallfile_write", [&] {
    for (uint64_t i = 0; i < o.files; ++i) {
      fill(&buf, i, 0, sizes[i]);
      write_file(paths[i], buf, O_CREAT | O_EXCL);
    }
    return o.files;
  });
  phase.run("smallfile_mix", [&] {
    for (uint64_t k = 0; k < o.mix_ops; ++k) {
      const uint64_t i = picks[k];
      if (is_read[k]) {
        fill(&buf, i, gens[i], sizes[i]);
        check_file(paths[i], buf, &got);
      } else {
        fill(&buf, i, ++gens[i], sizes[i]);
        write_file(paths[i], buf, O_TRUNC);
      }
    }
    return o.mix_ops;
  });
  for (const std::string& p : paths) {
    if (unlink(p.c_str()) != 0) fail("unlink", p);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  struct stat st;
  if (stat(o.dir.c_str(), &st) != 0) fail("--dir", o.dir);
  if (!S_ISDIR(st.st_mode)) usage_error("--dir " + o.dir + " is not a directory");
  const char* names[] = {"flat", "tree", "mix"};
  const std::string work =
      o.dir + "/meta-" + names[o.layout] + "-" + std::to_string(static_cast<long>(getpid()));
  make_dir(work);
  switch (o.layout) {
    case Options::kFlat:
      run_flat(o, work);
      break;
    case Options::kTree:
      run_tree(o, work);
      break;
    case Options::kMix:
      run_mix(o, work);
      break;
  }
  if (rmdir(work.c_str()) != 0) fail("rmdir", work);
  return 0;
}
