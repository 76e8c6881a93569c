// warpfs-fsx: a randomized file-operation checker in the style of fsx.
//
// It drives one file through a random mix of pwrite/pread, ftruncate, mmap reads and
// writes, fallocate (allocate, keep-size, punch hole), fsync/fdatasync, close+reopen,
// lseek(SEEK_DATA/SEEK_HOLE) and copy_file_range (within the file, the ranges apart, and to
// and from a second file, FILE.copy, that has a model too; on warpfs whole blocks are then
// shared where both offsets lie alike in a page), and checks every result against an
// in-memory model of the file (its bytes and its size). Written data is a pattern derived from the
// op number and the file offset, so stale or misplaced data can be told apart from correct data.
//
// Exit status: 0 every check passed (one JSON line on stdout); 1 the file disagreed with
// the model: data, size, short read or an lseek result (report on stderr); 2 a system call
// failed unexpectedly, a SIGBUS on a mapping, or bad usage. Failures also print a JSON line
// with "result":"mismatch" or "error". The seed is always printed at start on stderr:
// `-S seed` with the same options replays a run (the op sequence depends only on the seed,
// the options and the model, never on what the filesystem returned).
//
// What it cannot see: anything about durability (fsync is only called, never verified
// across a crash or remount), concurrent access, metadata other than the size, or O_DIRECT
// paths; holes may legally be reported as data, so SEEK_DATA/SEEK_HOLE are only checked
// for never skipping data and never calling data a hole.

#include <fcntl.h>
#include <getopt.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

enum Op : int {
  kWrite,
  kRead,
  kTruncate,
  kMapRead,
  kMapWrite,
  kFalloc,
  kFallocKeep,
  kPunch,
  kFsync,
  kFdatasync,
  kReopen,
  kSeekData,
  kSeekHole,
  kCopy,     // copy_file_range within the file
  kCopyIn,   // from FILE.copy into the file
  kCopyOut,  // from the file into FILE.copy
  kNumRandomOps,
  kInject = kNumRandomOps,  // --inject-fault: the file is corrupted behind the model's back
  kNumOps,
};

const char* const kOpNames[kNumOps] = {
    "write",       "read",  "truncate", "mapread",   "mapwrite", "falloc",
    "falloc_keep", "punch", "fsync",    "fdatasync", "reopen",   "seek_data",
    "seek_hole",   "copy",  "copy_in",  "copy_out",  "inject",
};

// Relative frequencies of the randomly chosen operations.
constexpr unsigned kWeights[kNumRandomOps] = {
    /*write*/ 20,   /*read*/ 18,     /*truncate*/ 4,  /*mapread*/ 7, /*mapwrite*/ 7,
    /*falloc*/ 3,   /*keep*/ 3,      /*punch*/ 5,     /*fsync*/ 1,   /*fdatasync*/ 1,
    /*reopen*/ 1,   /*seek_data*/ 4, /*seek_hole*/ 4, /*copy*/ 4,    /*copy_in*/ 3,
    /*copy_out*/ 3,
};

constexpr size_t kLogShown = 20;      // ops printed on failure
constexpr size_t kHistory = 1 << 16;  // ops remembered for explaining a mismatch

struct Options {
  uint64_t nops = 100000;
  uint64_t seed = 0;
  bool seed_given = false;
  uint64_t maxlen = 1 << 20;
  uint64_t maxop = 64 << 10;
  uint64_t closeprob = 0;  // 0: never reopen outside the "reopen" op
  uint64_t check_every = 1000;
  uint64_t inject_at = 0;  // 0: no fault injection
  bool quiet = false;
  bool no_mmap = false;
  bool no_falloc = false;
  bool no_punch = false;
  bool no_seek = false;
  bool no_copy = false;
  std::string path;
};

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n); 0 when n == 0.
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
};

// The byte written at file offset `off` by op `opnum`. Never zero, so written data is
// distinguishable from holes, and different for neighbouring offsets and ops, so data
// that landed at the wrong offset or is left over from an older op is recognisable.
inline uint8_t pattern_byte(uint64_t opnum, uint64_t off) {
  uint32_t x = static_cast<uint32_t>(off) * 0x9E3779B1u;
  x ^= static_cast<uint32_t>(opnum) * 0x85EBCA77u + static_cast<uint32_t>(off >> 32) * 0xC2B2AE3Du;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 13;
  const uint8_t b = static_cast<uint8_t>(x >> 24);
  return b != 0 ? b : 0x5A;
}

void fill_pattern(uint8_t* buf, uint64_t opnum, uint64_t off, uint64_t len) {
  for (uint64_t i = 0; i < len; ++i) buf[i] = pattern_byte(opnum, off + i);
}

// Index of the first nonzero byte in [p, p+n), or n.
uint64_t first_nonzero(const uint8_t* p, uint64_t n) {
  uint64_t i = 0;
  while (i < n && (reinterpret_cast<uintptr_t>(p + i) & 7) != 0) {
    if (p[i] != 0) return i;
    ++i;
  }
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w != 0) break;
  }
  for (; i < n; ++i)
    if (p[i] != 0) return i;
  return n;
}

uint64_t round_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

// SIGBUS while touching a mapping (an I/O error on a page fault, or a mapping past
// EOF) is turned into a reported error instead of killing the checker silently.
sigjmp_buf g_bus_jmp;
volatile sig_atomic_t g_in_guard = 0;

void bus_handler(int sig) {
  if (g_in_guard) siglongjmp(g_bus_jmp, 1);
  signal(sig, SIG_DFL);
  raise(sig);
}

// memcpy that returns false instead of dying when it takes a SIGBUS.
bool guarded_memcpy(void* dst, const void* src, size_t n) {
  if (sigsetjmp(g_bus_jmp, 1) != 0) {
    g_in_guard = 0;
    return false;
  }
  g_in_guard = 1;
  std::memcpy(dst, src, n);
  g_in_guard = 0;
  return true;
}

struct Record {
  uint64_t opnum = 0;
  uint64_t off = 0;
  uint64_t len = 0;
  uint64_t size_before = 0;
  uint64_t size_after = 0;
  int64_t result = 0;  // lseek result (-errno on failure)
  uint64_t src = 0;    // copy, copy_in: where the bytes came from (in the file, FILE.copy)
  int op = 0;
};

class Fsx {
 public:
  explicit Fsx(const Options& o) : opt_(o), rng_{o.seed}, inj_rng_{o.seed ^ 0x1BADC0DEFACEFEEDull} {
    page_ = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    model_.assign(opt_.maxlen + page_, 0);
    cmodel_.assign(opt_.maxlen + page_, 0);
    scratch_.assign(std::max(opt_.maxlen, opt_.maxop) + 2 * page_, 0);
    history_.resize(kHistory);
    for (int i = 0; i < kNumRandomOps; ++i) {
      unsigned w = kWeights[i];
      if (opt_.no_mmap && (i == kMapRead || i == kMapWrite)) w = 0;
      if (opt_.no_falloc && (i == kFalloc || i == kFallocKeep)) w = 0;
      if (opt_.no_punch && i == kPunch) w = 0;
      if (opt_.no_seek && (i == kSeekData || i == kSeekHole)) w = 0;
      if (opt_.no_copy && (i == kCopy || i == kCopyIn || i == kCopyOut)) w = 0;
      weights_[i] = w;
      total_weight_ += w;
    }
  }

  int run();

 private:
  // --- failure reporting -------------------------------------------------------------
  [[noreturn]] void fail_errno(const char* call, int err);
  [[noreturn]] void fail_error(const std::string& what);
  [[noreturn]] void fail_mismatch(const std::string& what);
  [[noreturn]] void fail_data(const char* what, uint64_t file_off, const uint8_t* actual,
                              uint64_t len);
  void print_log(FILE* f) const;
  void explain_byte(FILE* f, uint64_t x, const uint8_t* actual, uint64_t avail) const;
  void print_json_failure(const char* result) const;
  std::string replay_line() const;

  // --- model and history -------------------------------------------------------------
  Record& note(int op, uint64_t off, uint64_t len) {
    Record& r = history_[nrec_ % kHistory];
    ++nrec_;
    r = Record{};
    r.opnum = opnum_;
    r.op = op;
    r.off = off;
    r.len = len;
    r.size_before = size_;
    r.size_after = size_;
    ++counts_[op];
    return r;
  }
  void set_size(uint64_t n) {
    if (n < size_) std::memset(model_.data() + n, 0, size_ - n);
    size_ = n;
  }
  void check_data(const char* what, uint64_t off, const uint8_t* actual, uint64_t len) {
    if (len != 0 && std::memcmp(model_.data() + off, actual, len) != 0)
      fail_data(what, off, actual, len);
  }

  // --- random choices ----------------------------------------------------------------
  uint64_t pick_len(uint64_t limit);
  uint64_t pick_off(uint64_t len, uint64_t end_limit);
  int pick_op();

  // --- I/O helpers -------------------------------------------------------------------
  void open_file(bool create);
  uint64_t pread_full(uint8_t* buf, uint64_t len, uint64_t off) {
    return pread_fd(fd_, buf, len, off);
  }
  uint64_t pread_fd(int fd, uint8_t* buf, uint64_t len, uint64_t off);
  void pwrite_full(const uint8_t* buf, uint64_t len, uint64_t off);
  void check_size(const char* when);
  void full_check();
  void check_copy_file(const char* when, uint64_t off, uint64_t len);  // FILE.copy

  // --- operations ----------------------------------------------------------------------
  void do_write();
  void do_read();
  void read_at(uint64_t off, uint64_t len);
  void do_truncate();
  void do_mapread();
  void do_mapwrite();
  void do_falloc(int op);
  void do_sync(int op);
  void do_reopen();
  void do_seek(int op);
  void do_copy(int op);
  void do_inject();

  const Options& opt_;
  Rng rng_;
  Rng inj_rng_;  // separate stream, so --inject-fault does not change the op sequence before it
  uint64_t page_ = 4096;
  std::vector<uint8_t> model_;    // file contents; bytes at and beyond size_ are always zero
  std::vector<uint8_t> scratch_;  // read/write buffer
  uint64_t size_ = 0;
  int fd_ = -1;
  // FILE.copy, the other end of copy_in and copy_out: its descriptor, contents and size.
  std::string copy_path_;
  int cfd_ = -1;
  std::vector<uint8_t> cmodel_;
  uint64_t csize_ = 0;
  uint64_t opnum_ = 0;
  const char* cur_op_ = "open";
  std::vector<Record> history_;
  uint64_t nrec_ = 0;
  unsigned weights_[kNumRandomOps] = {};
  unsigned total_weight_ = 0;
  uint64_t counts_[kNumOps] = {};
  uint64_t full_checks_ = 0;
  bool injected_ = false;
  bool forced_read_pending_ = false;
  uint64_t forced_read_at_ = 0;
};

// ------------------------------------------------------------------------------------
// Failure reporting

std::string Fsx::replay_line() const {
  std::string s = "warpfs-fsx -N " + std::to_string(opt_.nops) + " -S " +
                  std::to_string(opt_.seed) + " -l " + std::to_string(opt_.maxlen) + " -o " +
                  std::to_string(opt_.maxop);
  if (opt_.closeprob) s += " -c " + std::to_string(opt_.closeprob);
  if (opt_.check_every != 1000) s += " --check-every " + std::to_string(opt_.check_every);
  if (opt_.no_mmap) s += " --no-mmap";
  if (opt_.no_falloc) s += " --no-fallocate";
  if (opt_.no_punch) s += " --no-punch";
  if (opt_.no_seek) s += " --no-seek";
  if (opt_.no_copy) s += " --no-copy-range";
  if (opt_.inject_at) s += " --inject-fault " + std::to_string(opt_.inject_at);
  return s + " " + opt_.path;
}

void Fsx::print_log(FILE* f) const {
  const uint64_t n = std::min<uint64_t>(nrec_, kLogShown);
  std::fprintf(f, "last %llu operations (oldest first; offsets and lengths in hex):\n",
               static_cast<unsigned long long>(n));
  for (uint64_t i = n; i > 0; --i) {
    const Record& r = history_[(nrec_ - i) % kHistory];
    std::fprintf(f, "  op %-8llu %-11s off 0x%-8llx len 0x%-6llx size 0x%llx",
                 static_cast<unsigned long long>(r.opnum), kOpNames[r.op],
                 static_cast<unsigned long long>(r.off), static_cast<unsigned long long>(r.len),
                 static_cast<unsigned long long>(r.size_before));
    if (r.size_after != r.size_before)
      std::fprintf(f, " -> 0x%llx", static_cast<unsigned long long>(r.size_after));
    if (r.op == kSeekData || r.op == kSeekHole) {
      if (r.result < 0)
        std::fprintf(f, "  => %s",
                     strerrorname_np(static_cast<int>(-r.result))
                         ? strerrorname_np(static_cast<int>(-r.result))
                         : "error");
      else
        std::fprintf(f, "  => 0x%llx", static_cast<unsigned long long>(r.result));
    }
    std::fputc('\n', f);
  }
}

void Fsx::print_json_failure(const char* result) const {
  std::printf(
      "{\"tool\":\"fsx\",\"ops\":%llu,\"seed\":%llu,\"result\":\"%s\",\"failed_op\":%llu,\"op_"
      "type\":\"%s\"}\n",
      static_cast<unsigned long long>(opt_.nops), static_cast<unsigned long long>(opt_.seed),
      result, static_cast<unsigned long long>(opnum_), cur_op_);
  std::fflush(stdout);
}

void Fsx::fail_errno(const char* call, int err) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s failed: %s (%s, errno %d)", call, std::strerror(err),
                strerrorname_np(err) ? strerrorname_np(err) : "?", err);
  fail_error(buf);
}

void Fsx::fail_error(const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "\nwarpfs-fsx: ERROR at op %llu (%s): %s\n",
               static_cast<unsigned long long>(opnum_), cur_op_, what.c_str());
  std::fprintf(stderr, "seed %llu, file %s, model size 0x%llx\n",
               static_cast<unsigned long long>(opt_.seed), opt_.path.c_str(),
               static_cast<unsigned long long>(size_));
  print_log(stderr);
  std::fprintf(stderr, "replay: %s\n", replay_line().c_str());
  print_json_failure("error");
  std::exit(2);
}

void Fsx::fail_mismatch(const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "\nwarpfs-fsx: MISMATCH at op %llu (%s): %s\n",
               static_cast<unsigned long long>(opnum_), cur_op_, what.c_str());
  std::fprintf(stderr, "seed %llu, file %s, model size 0x%llx\n",
               static_cast<unsigned long long>(opt_.seed), opt_.path.c_str(),
               static_cast<unsigned long long>(size_));
  print_log(stderr);
  std::fprintf(stderr, "replay: %s\n", replay_line().c_str());
  print_json_failure("mismatch");
  std::exit(1);
}

// Says which op last defined byte x in the model and which op's data the actual bytes
// look like (stale data from an older write, or data that belongs at another offset).
void Fsx::explain_byte(FILE* f, uint64_t x, const uint8_t* actual, uint64_t avail) const {
  const uint64_t nhist = std::min<uint64_t>(nrec_, kHistory);
  bool found = false;
  for (uint64_t i = 0; i < nhist && !found; ++i) {
    const Record& r = history_[(nrec_ - 1 - i) % kHistory];
    const bool covers = x >= r.off && x < r.off + r.len;
    switch (r.op) {
      case kWrite:
      case kMapWrite:
        if (covers) {
          std::fprintf(f, "  expected byte was written by op %llu (%s off 0x%llx len 0x%llx)\n",
                       static_cast<unsigned long long>(r.opnum), kOpNames[r.op],
                       static_cast<unsigned long long>(r.off),
                       static_cast<unsigned long long>(r.len));
          found = true;
        }
        break;
      case kTruncate:
        if (r.size_before > x && r.size_after <= x) {
          std::fprintf(
              f, "  expected zero: offset was cut off by op %llu (truncate 0x%llx -> 0x%llx)\n",
              static_cast<unsigned long long>(r.opnum),
              static_cast<unsigned long long>(r.size_before),
              static_cast<unsigned long long>(r.size_after));
          found = true;
        }
        break;
      case kPunch:
        if (covers && x < r.size_before) {
          std::fprintf(f, "  expected zero: hole punched by op %llu (off 0x%llx len 0x%llx)\n",
                       static_cast<unsigned long long>(r.opnum),
                       static_cast<unsigned long long>(r.off),
                       static_cast<unsigned long long>(r.len));
          found = true;
        }
        break;
      case kCopy:
      case kCopyIn:
        if (covers) {
          std::fprintf(
              f, "  expected byte was copied by op %llu (%s from 0x%llx%s to 0x%llx len 0x%llx)\n",
              static_cast<unsigned long long>(r.opnum), kOpNames[r.op],
              static_cast<unsigned long long>(r.src + (x - r.off)),
              r.op == kCopyIn ? " of FILE.copy" : "", static_cast<unsigned long long>(x),
              static_cast<unsigned long long>(r.len));
          found = true;
        }
        break;
      case kInject:
        if (covers)
          std::fprintf(f, "  NOTE: --inject-fault deliberately corrupted this byte at op %llu\n",
                       static_cast<unsigned long long>(r.opnum));
        break;
      default:
        break;
    }
  }
  if (!found)
    std::fprintf(f, "  expected zero: no write to this offset in the last %llu ops\n",
                 static_cast<unsigned long long>(nhist));
  if (avail == 0) return;
  if (actual[0] == 0) {
    std::fprintf(f, "  actual byte is zero (reads as a hole / unwritten / truncated range)\n");
    return;
  }
  // Stale data: an older write to this very offset.
  const uint64_t w = std::min<uint64_t>(avail, 8);
  int shown = 0;
  for (uint64_t i = 0; i < nhist && shown < 3; ++i) {
    const Record& r = history_[(nrec_ - 1 - i) % kHistory];
    if ((r.op != kWrite && r.op != kMapWrite) || x < r.off || x >= r.off + r.len) continue;
    uint64_t k = 0;
    while (k < w && x + k < r.off + r.len && pattern_byte(r.opnum, x + k) == actual[k]) ++k;
    if (k == std::min<uint64_t>(w, r.off + r.len - x)) {
      std::fprintf(f,
                   "  actual bytes match op %llu's data for this offset (%s off 0x%llx len "
                   "0x%llx): stale data?\n",
                   static_cast<unsigned long long>(r.opnum), kOpNames[r.op],
                   static_cast<unsigned long long>(r.off), static_cast<unsigned long long>(r.len));
      ++shown;
    }
  }
  // Misplaced data: a recent write's data for another offset.
  if (w < 4) return;
  shown = 0;
  uint64_t writes_seen = 0;
  for (uint64_t i = 0; i < nhist && writes_seen < 256 && shown < 3; ++i) {
    const Record& r = history_[(nrec_ - 1 - i) % kHistory];
    if (r.op != kWrite && r.op != kMapWrite) continue;
    ++writes_seen;
    for (uint64_t y = r.off; y + w <= r.off + r.len && shown < 3; ++y) {
      if (y == x) continue;
      uint64_t k = 0;
      while (k < w && pattern_byte(r.opnum, y + k) == actual[k]) ++k;
      if (k == w) {
        std::fprintf(
            f, "  actual bytes match op %llu's data for offset 0x%llx (displaced by %+lld bytes)\n",
            static_cast<unsigned long long>(r.opnum), static_cast<unsigned long long>(y),
            static_cast<long long>(x) - static_cast<long long>(y));
        ++shown;
      }
    }
  }
}

void Fsx::fail_data(const char* what, uint64_t file_off, const uint8_t* actual, uint64_t len) {
  const uint8_t* expect = model_.data() + file_off;
  uint64_t first = len, last = 0, ndiff = 0;
  for (uint64_t i = 0; i < len; ++i) {
    if (expect[i] != actual[i]) {
      if (first == len) first = i;
      last = i;
      ++ndiff;
    }
  }
  std::fflush(stdout);
  std::fprintf(stderr,
               "\nwarpfs-fsx: MISMATCH at op %llu (%s): %s of 0x%llx bytes at 0x%llx differs from "
               "the model\n",
               static_cast<unsigned long long>(opnum_), cur_op_, what,
               static_cast<unsigned long long>(len), static_cast<unsigned long long>(file_off));
  std::fprintf(stderr, "seed %llu, file %s, model size 0x%llx\n",
               static_cast<unsigned long long>(opt_.seed), opt_.path.c_str(),
               static_cast<unsigned long long>(size_));
  if (first < len) {
    std::fprintf(stderr, "first differing offset 0x%llx (%llu): expected 0x%02x, actual 0x%02x\n",
                 static_cast<unsigned long long>(file_off + first),
                 static_cast<unsigned long long>(file_off + first), expect[first], actual[first]);
    std::fprintf(stderr, "%llu differing bytes, last at 0x%llx\n",
                 static_cast<unsigned long long>(ndiff),
                 static_cast<unsigned long long>(file_off + last));
    // Rows of 16 aligned on file offsets, from the row holding the first difference.
    const uint64_t row = std::max(file_off, (file_off + first) & ~uint64_t{15}) - file_off;
    const uint64_t row_end = std::min<uint64_t>(len, row + 32);
    std::fprintf(stderr, "  offset      expected / actual (* differs)\n");
    for (uint64_t r = row; r < row_end; r += 16) {
      std::fprintf(stderr, "  0x%08llx ", static_cast<unsigned long long>(file_off + r));
      for (uint64_t i = r; i < std::min<uint64_t>(row_end, r + 16); ++i)
        std::fprintf(stderr, " %02x", expect[i]);
      std::fprintf(stderr, "\n             ");
      for (uint64_t i = r; i < std::min<uint64_t>(row_end, r + 16); ++i)
        std::fprintf(stderr, "%c%02x", actual[i] != expect[i] ? '*' : ' ', actual[i]);
      std::fprintf(stderr, "\n");
    }
    explain_byte(stderr, file_off + first, actual + first, len - first);
  }
  print_log(stderr);
  std::fprintf(stderr, "replay: %s\n", replay_line().c_str());
  print_json_failure("mismatch");
  std::exit(1);
}

// ------------------------------------------------------------------------------------
// Random choices

// A length in [1, limit], biased towards small, page-sized and page-multiple lengths.
uint64_t Fsx::pick_len(uint64_t limit) {
  if (limit == 0) return 0;
  switch (rng_.below(8)) {
    case 0:
    case 1:
      return 1 + rng_.below(std::min<uint64_t>(limit, 64));
    case 2:
    case 3:
      return 1 + rng_.below(std::min<uint64_t>(limit, 2 * page_));
    case 4:
      return std::min(limit, page_ * (1 + rng_.below(16)));
    default:
      return 1 + rng_.below(limit);
  }
}

// An offset with off + len <= end_limit, biased towards the current EOF and page boundaries.
uint64_t Fsx::pick_off(uint64_t len, uint64_t end_limit) {
  const uint64_t hi = end_limit - len;
  uint64_t off;
  switch (rng_.below(6)) {
    case 0: {  // around EOF
      const uint64_t d = rng_.below(2 * page_ + 1);
      off = rng_.below(2) ? size_ + d : (size_ > d ? size_ - d : 0);
      break;
    }
    case 1:  // page aligned
      off = rng_.below(hi + 1) & ~(page_ - 1);
      break;
    case 2:  // inside the file
      off = rng_.below(size_ + 1);
      break;
    default:
      off = rng_.below(hi + 1);
      break;
  }
  return std::min(off, hi);
}

int Fsx::pick_op() {
  uint64_t r = rng_.below(total_weight_);
  for (int i = 0; i < kNumRandomOps; ++i) {
    if (r < weights_[i]) return i;
    r -= weights_[i];
  }
  return kWrite;
}

// ------------------------------------------------------------------------------------
// I/O helpers

void Fsx::open_file(bool create) {
  const int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0);
  fd_ = open(opt_.path.c_str(), flags, 0644);
  if (fd_ < 0) fail_errno("open", errno);
}

uint64_t Fsx::pread_fd(int fd, uint8_t* buf, uint64_t len, uint64_t off) {
  uint64_t got = 0;
  while (got < len) {
    const ssize_t r = pread(fd, buf + got, len - got, static_cast<off_t>(off + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_errno("pread", errno);
    }
    if (r == 0) break;
    got += static_cast<uint64_t>(r);
  }
  return got;
}

void Fsx::pwrite_full(const uint8_t* buf, uint64_t len, uint64_t off) {
  uint64_t done = 0;
  while (done < len) {
    const ssize_t r = pwrite(fd_, buf + done, len - done, static_cast<off_t>(off + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_errno("pwrite", errno);
    }
    if (r == 0) fail_error("pwrite returned 0 (no progress)");
    done += static_cast<uint64_t>(r);
  }
}

void Fsx::check_size(const char* when) {
  struct stat st;
  if (fstat(fd_, &st) != 0) fail_errno("fstat", errno);
  if (static_cast<uint64_t>(st.st_size) != size_) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s: fstat size 0x%llx (%llu) != model size 0x%llx (%llu)", when,
                  static_cast<unsigned long long>(st.st_size),
                  static_cast<unsigned long long>(st.st_size),
                  static_cast<unsigned long long>(size_), static_cast<unsigned long long>(size_));
    fail_mismatch(buf);
  }
}

void Fsx::full_check() {
  const char* saved = cur_op_;
  cur_op_ = "full check";
  check_size("full check");
  // Read one byte more than the model size: reading must stop at EOF.
  const uint64_t got = pread_full(scratch_.data(), size_ + 1, 0);
  if (got != size_) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "full-file read returned 0x%llx bytes, model size 0x%llx",
                  static_cast<unsigned long long>(got), static_cast<unsigned long long>(size_));
    fail_mismatch(buf);
  }
  check_data("full-file read", 0, scratch_.data(), size_);
  if (cfd_ >= 0) check_copy_file("full check of FILE.copy", 0, csize_);
  ++full_checks_;
  cur_op_ = saved;
}

// ------------------------------------------------------------------------------------
// Operations

void Fsx::do_write() {
  const uint64_t len = pick_len(std::min(opt_.maxop, opt_.maxlen));
  const uint64_t off = pick_off(len, opt_.maxlen);
  Record& r = note(kWrite, off, len);
  fill_pattern(scratch_.data(), opnum_, off, len);
  pwrite_full(scratch_.data(), len, off);
  std::memcpy(model_.data() + off, scratch_.data(), len);
  size_ = std::max(size_, off + len);
  r.size_after = size_;
}

void Fsx::read_at(uint64_t off, uint64_t len) {
  note(kRead, off, len);
  const uint64_t expect = off < size_ ? std::min(len, size_ - off) : 0;
  const uint64_t got = pread_full(scratch_.data(), len, off);
  if (got != expect) {
    char buf[200];
    std::snprintf(
        buf, sizeof buf,
        "pread(off 0x%llx, len 0x%llx) returned 0x%llx bytes, expected 0x%llx (model size 0x%llx)",
        static_cast<unsigned long long>(off), static_cast<unsigned long long>(len),
        static_cast<unsigned long long>(got), static_cast<unsigned long long>(expect),
        static_cast<unsigned long long>(size_));
    fail_mismatch(buf);
  }
  check_data("pread", off, scratch_.data(), got);
}

void Fsx::do_read() {
  const uint64_t len = pick_len(opt_.maxop);
  uint64_t off;
  switch (rng_.below(8)) {
    case 0: {  // across or past EOF (separate statements: the draw order must not depend on the
               // compiler)
      const uint64_t ahead = rng_.below(2 * page_);
      const uint64_t back = rng_.below(2 * page_);
      off = size_ + ahead - std::min(size_, back);
      break;
    }
    default:
      off = size_ > len ? rng_.below(size_ - len + 1) : rng_.below(size_ + 1);
      break;
  }
  read_at(off, len);
}

void Fsx::do_truncate() {
  // Mostly small moves of EOF (partial-page zeroing is where bugs live); large cuts are
  // rarer, so the file keeps enough data for reads to compare against.
  uint64_t n;
  const uint64_t kind = rng_.below(32);
  if (kind == 0) {
    n = 0;
  } else if (kind < 25) {
    const uint64_t d = rng_.below(2 * page_ + 1);
    n = rng_.below(2) ? size_ + d : (size_ > d ? size_ - d : 0);
  } else if (kind < 28) {
    n = rng_.below(opt_.maxlen + 1) & ~(page_ - 1);
  } else {
    n = rng_.below(opt_.maxlen + 1);
  }
  n = std::min(n, opt_.maxlen);
  Record& r = note(kTruncate, n, 0);
  if (ftruncate(fd_, static_cast<off_t>(n)) != 0) fail_errno("ftruncate", errno);
  set_size(n);
  r.size_after = size_;
}

void Fsx::do_mapread() {
  const uint64_t len = pick_len(std::min(opt_.maxop, size_));
  const uint64_t off = rng_.below(size_ - len + 1);
  note(kMapRead, off, len);
  const uint64_t map_off = off & ~(page_ - 1);
  const uint64_t end = off + len;
  const uint64_t map_end = round_up(end, page_);
  const uint64_t map_len = map_end - map_off;
  void* p = mmap(nullptr, map_len, PROT_READ, MAP_SHARED, fd_, static_cast<off_t>(map_off));
  if (p == MAP_FAILED) fail_errno("mmap(PROT_READ)", errno);
  const uint8_t* base = static_cast<const uint8_t*>(p);
  // The mapped range plus, when its last page holds EOF, the rest of that page: POSIX
  // says the part of the last page beyond EOF reads as zero.
  const uint64_t copy_end = map_end > size_ ? map_end : end;
  if (!guarded_memcpy(scratch_.data(), base + (off - map_off), copy_end - off)) {
    munmap(p, map_len);
    fail_error(
        "SIGBUS while reading the mapping: a page fault failed (I/O error, or the file is shorter "
        "than the model)");
  }
  if (munmap(p, map_len) != 0) fail_errno("munmap", errno);
  check_data("mapped read", off, scratch_.data(), len);
  if (copy_end > end)
    check_data("mapped read of the EOF page's tail (must be zero)", end, scratch_.data() + len,
               copy_end - end);
}

void Fsx::do_mapwrite() {
  const uint64_t len = pick_len(std::min(opt_.maxop, size_));
  const uint64_t off = rng_.below(size_ - len + 1);
  note(kMapWrite, off, len);
  const uint64_t map_off = off & ~(page_ - 1);
  const uint64_t map_len = off + len - map_off;
  void* p =
      mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, static_cast<off_t>(map_off));
  if (p == MAP_FAILED) fail_errno("mmap(PROT_WRITE)", errno);
  uint8_t* base = static_cast<uint8_t*>(p);
  fill_pattern(scratch_.data(), opnum_, off, len);
  if (!guarded_memcpy(base + (off - map_off), scratch_.data(), len)) {
    munmap(p, map_len);
    fail_error(
        "SIGBUS while writing the mapping: a page fault failed (I/O error, ENOSPC, or the file is "
        "shorter than the model)");
  }
  if (msync(p, map_len, MS_SYNC) != 0) fail_errno("msync(MS_SYNC)", errno);
  if (munmap(p, map_len) != 0) fail_errno("munmap", errno);
  std::memcpy(model_.data() + off, scratch_.data(), len);
}

void Fsx::do_falloc(int op) {
  const uint64_t len = pick_len(std::min(opt_.maxop, opt_.maxlen));
  const uint64_t off = pick_off(len, opt_.maxlen);
  Record& r = note(op, off, len);
  int mode = 0;
  const char* call = "fallocate(0)";
  if (op == kFallocKeep) {
    mode = FALLOC_FL_KEEP_SIZE;
    call = "fallocate(KEEP_SIZE)";
  } else if (op == kPunch) {
    mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    call = "fallocate(PUNCH_HOLE|KEEP_SIZE)";
  }
  if (fallocate(fd_, mode, static_cast<off_t>(off), static_cast<off_t>(len)) != 0) {
    const int err = errno;
    if (err == EOPNOTSUPP)
      std::fprintf(stderr, "warpfs-fsx: %s is not supported here; rerun with %s\n", call,
                   op == kPunch ? "--no-punch" : "--no-fallocate");
    fail_errno(call, err);
  }
  if (op == kFalloc) {
    size_ = std::max(size_, off + len);  // the new range reads as zero: already so in the model
  } else if (op == kPunch && off < size_) {
    std::memset(model_.data() + off, 0, std::min(off + len, size_) - off);
  }
  r.size_after = size_;
}

void Fsx::do_sync(int op) {
  note(op, 0, 0);
  if ((op == kFsync ? fsync(fd_) : fdatasync(fd_)) != 0)
    fail_errno(op == kFsync ? "fsync" : "fdatasync", errno);
}

void Fsx::do_reopen() {
  note(kReopen, 0, 0);
  if (close(fd_) != 0) fail_errno("close", errno);
  fd_ = -1;
  open_file(false);
  check_size("after reopen");
}

void Fsx::do_seek(int op) {
  uint64_t off;
  switch (rng_.below(8)) {
    case 0: {  // at or beyond EOF: ENXIO
      const bool beyond = rng_.below(2) != 0;
      off = size_ + (beyond ? rng_.below(2 * page_) : 0);
      break;
    }
    default:
      off = rng_.below(size_ + 1);
      break;
  }
  Record& r = note(op, off, 0);
  const bool data = op == kSeekData;
  const off_t res = lseek(fd_, static_cast<off_t>(off), data ? SEEK_DATA : SEEK_HOLE);
  const int err = res < 0 ? errno : 0;
  r.result = res < 0 ? -err : res;
  char buf[256];
  const auto ull = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  if (off >= size_) {
    if (res >= 0 || err != ENXIO) {
      if (res < 0 && err != ENXIO) fail_errno(data ? "lseek(SEEK_DATA)" : "lseek(SEEK_HOLE)", err);
      std::snprintf(buf, sizeof buf,
                    "lseek(0x%llx, %s) at/after EOF (size 0x%llx) returned 0x%llx, expected ENXIO",
                    ull(off), data ? "SEEK_DATA" : "SEEK_HOLE", ull(size_),
                    ull(static_cast<uint64_t>(res)));
      fail_mismatch(buf);
    }
    return;
  }
  // off < size: the first nonzero byte at or after off must not be skipped.
  if (data) {
    if (res < 0) {
      if (err != ENXIO) fail_errno("lseek(SEEK_DATA)", err);
      // ENXIO claims no data from off to EOF: legal only if the model holds only zeroes.
      const uint64_t nz = first_nonzero(model_.data() + off, size_ - off);
      if (nz < size_ - off) {
        std::snprintf(buf, sizeof buf,
                      "lseek(0x%llx, SEEK_DATA) returned ENXIO but the model has data at 0x%llx "
                      "(size 0x%llx)",
                      ull(off), ull(off + nz), ull(size_));
        fail_mismatch(buf);
      }
      return;
    }
    const uint64_t got = static_cast<uint64_t>(res);
    if (got < off || got >= size_) {
      std::snprintf(buf, sizeof buf,
                    "lseek(0x%llx, SEEK_DATA) returned 0x%llx, outside [0x%llx, size 0x%llx)",
                    ull(off), ull(got), ull(off), ull(size_));
      fail_mismatch(buf);
    }
    // Everything it skipped must be zero in the model (holes read as zero).
    const uint64_t nz = first_nonzero(model_.data() + off, got - off);
    if (nz < got - off) {
      std::snprintf(buf, sizeof buf,
                    "lseek(0x%llx, SEEK_DATA) returned 0x%llx, skipping data at 0x%llx", ull(off),
                    ull(got), ull(off + nz));
      fail_mismatch(buf);
    }
  } else {
    if (res < 0) fail_errno("lseek(SEEK_HOLE)", err);
    const uint64_t got = static_cast<uint64_t>(res);
    // A hole (possibly the implicit one at EOF) at or after off; a hole reads as zero.
    if (got < off || got > size_) {
      std::snprintf(buf, sizeof buf,
                    "lseek(0x%llx, SEEK_HOLE) returned 0x%llx, outside [0x%llx, size 0x%llx]",
                    ull(off), ull(got), ull(off), ull(size_));
      fail_mismatch(buf);
    }
    if (got < size_ && model_[got] != 0) {
      std::snprintf(
          buf, sizeof buf,
          "lseek(0x%llx, SEEK_HOLE) returned 0x%llx, but the model has data there (0x%02x)",
          ull(off), ull(got), model_[got]);
      fail_mismatch(buf);
    }
  }
}

// FILE.copy's size and bytes [off, off + len) against its model.
void Fsx::check_copy_file(const char* when, uint64_t off, uint64_t len) {
  struct stat st;
  if (fstat(cfd_, &st) != 0) fail_errno("fstat (FILE.copy)", errno);
  char buf[200];
  if (static_cast<uint64_t>(st.st_size) != csize_) {
    std::snprintf(buf, sizeof buf, "%s: FILE.copy has size 0x%llx, its model 0x%llx", when,
                  static_cast<unsigned long long>(st.st_size),
                  static_cast<unsigned long long>(csize_));
    fail_mismatch(buf);
  }
  const uint64_t got = pread_fd(cfd_, scratch_.data(), len, off);
  uint64_t at = 0;
  while (at < got && scratch_[at] == cmodel_[off + at]) ++at;
  if (got != len || at < got) {
    std::snprintf(buf, sizeof buf,
                  "%s: FILE.copy read 0x%llx of 0x%llx bytes at 0x%llx; first difference at "
                  "0x%llx",
                  when, static_cast<unsigned long long>(got), static_cast<unsigned long long>(len),
                  static_cast<unsigned long long>(off), static_cast<unsigned long long>(off + at));
    fail_mismatch(buf);
  }
}

// copy_file_range(2) of a range of the file to another range of it (apart: overlapping ones
// are EINVAL), from FILE.copy into the file, or from the file into FILE.copy. The length
// asked for may reach past the source's end: fewer bytes are copied, and the count must say
// so. Half the time the offsets lie alike in a page, so that warpfs shares whole blocks.
void Fsx::do_copy(int op) {
  const bool from_file = op != kCopyIn, to_file = op != kCopyOut;
  const uint64_t src_size = from_file ? size_ : csize_;
  const uint64_t len = pick_len(std::min(opt_.maxop, opt_.maxlen));
  uint64_t off_in = rng_.below(src_size);
  if (rng_.below(4) == 0) off_in &= ~(page_ - 1);
  const uint64_t n = std::min(len, src_size - off_in);  // what is copied
  uint64_t off_out = pick_off(n, opt_.maxlen);
  if (rng_.below(2) == 0) {
    const uint64_t alike = (off_out & ~(page_ - 1)) + off_in % page_;
    if (alike + n <= opt_.maxlen) off_out = alike;
  }
  if (op == kCopy && off_out < off_in + n && off_in < off_out + n) {
    // Apart: after the source if there is room, else before it, else not at all.
    if (off_in + n + n <= opt_.maxlen) {
      off_out = off_in + n;
    } else if (off_in >= n) {
      off_out = off_in - n;
    } else {
      read_at(off_in, n);
      return;
    }
  }
  Record& r = note(op, to_file ? off_out : off_in, n);
  r.src = off_in;
  const int in = from_file ? fd_ : cfd_, out = to_file ? fd_ : cfd_;
  loff_t oi = static_cast<loff_t>(off_in), oo = static_cast<loff_t>(off_out);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t got = copy_file_range(in, &oi, out, &oo, len - done, 0);
    if (got < 0) {
      const int err = errno;
      if (err == EOPNOTSUPP || err == ENOSYS || err == EXDEV)
        std::fprintf(stderr,
                     "warpfs-fsx: copy_file_range is not supported here; rerun with "
                     "--no-copy-range\n");
      fail_errno("copy_file_range", err);
    }
    if (got == 0) break;
    done += static_cast<uint64_t>(got);
  }
  if (done != n) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "copy_file_range(0x%llx -> 0x%llx, len 0x%llx) copied 0x%llx bytes, expected "
                  "0x%llx (source size 0x%llx)",
                  static_cast<unsigned long long>(off_in), static_cast<unsigned long long>(off_out),
                  static_cast<unsigned long long>(len), static_cast<unsigned long long>(done),
                  static_cast<unsigned long long>(n), static_cast<unsigned long long>(src_size));
    fail_mismatch(buf);
  }
  // The model: the source's bytes (a copy first: the same buffer when within the file).
  const std::vector<uint8_t>& src = from_file ? model_ : cmodel_;
  const std::vector<uint8_t> bytes(src.begin() + static_cast<long>(off_in),
                                   src.begin() + static_cast<long>(off_in + n));
  std::vector<uint8_t>& dst = to_file ? model_ : cmodel_;
  std::memcpy(dst.data() + off_out, bytes.data(), n);
  uint64_t& dst_size = to_file ? size_ : csize_;
  dst_size = std::max(dst_size, off_out + n);
  if (to_file) r.size_after = size_;
  // The copy reads back at once.
  if (to_file) {
    const uint64_t got = pread_full(scratch_.data(), n, off_out);
    if (got != n) fail_mismatch("the copy read back short");
    check_data("read back of the copy", off_out, scratch_.data(), n);
  } else {
    check_copy_file("read back of the copy", off_out, n);
  }
}

// Corrupts one byte of the file through a second descriptor, behind the model's back,
// and arranges for the next op to read it back through the normal read path.
void Fsx::do_inject() {
  const uint64_t x = inj_rng_.below(size_);
  note(kInject, x, 1);
  const int fd2 = open(opt_.path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd2 < 0) fail_errno("open (inject)", errno);
  uint8_t b = 0;
  if (pread(fd2, &b, 1, static_cast<off_t>(x)) != 1) fail_errno("pread (inject)", errno);
  b ^= 0xA5;
  if (pwrite(fd2, &b, 1, static_cast<off_t>(x)) != 1) fail_errno("pwrite (inject)", errno);
  if (close(fd2) != 0) fail_errno("close (inject)", errno);
  if (!opt_.quiet)
    std::fprintf(stderr, "warpfs-fsx: op %llu: injected a fault at offset 0x%llx\n",
                 static_cast<unsigned long long>(opnum_), static_cast<unsigned long long>(x));
  injected_ = true;
  forced_read_pending_ = true;
  forced_read_at_ = x;
}

int Fsx::run() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = bus_handler;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);

  const auto t0 = std::chrono::steady_clock::now();
  open_file(true);
  check_size("after create");
  if (!opt_.no_copy) {
    copy_path_ = opt_.path + ".copy";
    cfd_ = open(copy_path_.c_str(), O_RDWR | O_CLOEXEC | O_CREAT | O_TRUNC, 0644);
    if (cfd_ < 0) fail_errno("open (FILE.copy)", errno);
  }
  const uint64_t progress_every = std::max<uint64_t>(opt_.nops / 10, 1);

  for (opnum_ = 1; opnum_ <= opt_.nops; ++opnum_) {
    if (forced_read_pending_) {
      forced_read_pending_ = false;
      cur_op_ = kOpNames[kRead];
      const uint64_t x = forced_read_at_;
      const uint64_t back = inj_rng_.below(std::min<uint64_t>({x, opt_.maxop - 1, 4096}) + 1);
      const uint64_t fwd =
          inj_rng_.below(std::min<uint64_t>(opt_.maxop - 1 - back, size_ - x - 1) + 1);
      read_at(x - back, back + 1 + fwd);
    } else if (opt_.inject_at != 0 && !injected_ && opnum_ >= opt_.inject_at && size_ > 0) {
      cur_op_ = kOpNames[kInject];
      do_inject();
    } else {
      int op = pick_op();
      if ((op == kMapRead || op == kMapWrite) && size_ == 0) op = kWrite;
      if ((op == kCopy || op == kCopyOut) && size_ == 0) op = kWrite;
      if (op == kCopyIn && csize_ == 0) op = size_ > 0 ? kCopyOut : kWrite;
      cur_op_ = kOpNames[op];
      switch (op) {
        case kWrite:
          do_write();
          break;
        case kRead:
          do_read();
          break;
        case kTruncate:
          do_truncate();
          break;
        case kMapRead:
          do_mapread();
          break;
        case kMapWrite:
          do_mapwrite();
          break;
        case kFalloc:
        case kFallocKeep:
        case kPunch:
          do_falloc(op);
          break;
        case kFsync:
        case kFdatasync:
          do_sync(op);
          break;
        case kReopen:
          do_reopen();
          break;
        case kSeekData:
        case kSeekHole:
          do_seek(op);
          break;
        case kCopy:
        case kCopyIn:
        case kCopyOut:
          do_copy(op);
          break;
        default:
          break;
      }
    }
    if (opt_.closeprob != 0 && rng_.below(opt_.closeprob) == 0) {
      cur_op_ = kOpNames[kReopen];
      do_reopen();
    }
    if (opt_.check_every != 0 && opnum_ % opt_.check_every == 0) full_check();
    if (!opt_.quiet && opnum_ % progress_every == 0)
      std::fprintf(stderr, "warpfs-fsx: %llu ops, size 0x%llx\n",
                   static_cast<unsigned long long>(opnum_), static_cast<unsigned long long>(size_));
  }
  opnum_ = opt_.nops;
  full_check();
  if (close(fd_) != 0) fail_errno("close", errno);
  fd_ = -1;
  if (cfd_ >= 0) {
    if (close(cfd_) != 0) fail_errno("close (FILE.copy)", errno);
    if (unlink(copy_path_.c_str()) != 0) fail_errno("unlink (FILE.copy)", errno);
    cfd_ = -1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::string json = "{\"tool\":\"fsx\",\"ops\":" + std::to_string(opt_.nops) +
                     ",\"seed\":" + std::to_string(opt_.seed) + ",\"result\":\"ok\"";
  for (int i = 0; i < kNumOps; ++i)
    json += ",\"" + std::string(kOpNames[i]) + "\":" + std::to_string(counts_[i]);
  char tail[160];
  std::snprintf(
      tail, sizeof tail,
      ",\"full_checks\":%llu,\"final_size\":%llu,\"maxlen\":%llu,\"maxop\":%llu,\"seconds\":%.3f}",
      static_cast<unsigned long long>(full_checks_), static_cast<unsigned long long>(size_),
      static_cast<unsigned long long>(opt_.maxlen), static_cast<unsigned long long>(opt_.maxop),
      secs);
  json += tail;
  std::printf("%s\n", json.c_str());
  return 0;
}

// ------------------------------------------------------------------------------------
// Command line

[[noreturn]] void usage(const char* msg) {
  if (msg) std::fprintf(stderr, "warpfs-fsx: %s\n", msg);
  std::fprintf(
      stderr,
      "usage: warpfs-fsx [options] FILE\n"
      "  -N ops            number of operations (default 100000)\n"
      "  -S seed           random seed (default: time based; always printed)\n"
      "  -l maxlen         maximum file size (default 1M; suffixes K, M, G)\n"
      "  -o maxop          maximum bytes per operation (default 64K)\n"
      "  -c P              also close+reopen the file with probability 1/P after each op\n"
      "  -q                quiet: only the seed line, failures and the final JSON line\n"
      "  --check-every N   fstat + full-file compare every N ops (default 1000; 0: only at the "
      "end)\n"
      "  --no-mmap         no mmap reads/writes\n"
      "  --no-fallocate    no fallocate (mode 0 and KEEP_SIZE)\n"
      "  --no-punch        no FALLOC_FL_PUNCH_HOLE\n"
      "  --no-seek         no lseek SEEK_DATA/SEEK_HOLE checks\n"
      "  --no-copy-range   no copy_file_range (within FILE, and to and from FILE.copy)\n"
      "  --inject-fault N  self-test: corrupt the file behind the model's back at op N\n"
      "                    (or the first op after it with a non-empty file); must exit 1\n"
      "exit status: 0 ok, 1 data/size mismatch, 2 unexpected syscall error or bad usage\n");
  std::exit(2);
}

uint64_t parse_num(const char* s, bool suffixes, const char* what) {
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 0);
  if (errno != 0 || end == s || *s == '-') usage((std::string("bad ") + what + ": " + s).c_str());
  if (suffixes && *end != '\0') {
    unsigned shift = 0;
    switch (*end) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      default:
        usage((std::string("bad ") + what + ": " + s).c_str());
    }
    ++end;
    if (*end == 'i' && end[1] == 'B')
      end += 2;
    else if (*end == 'B')
      ++end;
    if (v > (~0ull >> shift)) usage((std::string("bad ") + what + ": " + s).c_str());
    v <<= shift;
  }
  if (*end != '\0') usage((std::string("bad ") + what + ": " + s).c_str());
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  enum {
    kOptNoMmap = 256,
    kOptNoFalloc,
    kOptNoPunch,
    kOptNoSeek,
    kOptNoCopy,
    kOptInject,
    kOptCheckEvery,
    kOptHelp
  };
  static const struct option longopts[] = {
      {"no-mmap", no_argument, nullptr, kOptNoMmap},
      {"no-fallocate", no_argument, nullptr, kOptNoFalloc},
      {"no-punch", no_argument, nullptr, kOptNoPunch},
      {"no-seek", no_argument, nullptr, kOptNoSeek},
      {"no-copy-range", no_argument, nullptr, kOptNoCopy},
      {"inject-fault", required_argument, nullptr, kOptInject},
      {"check-every", required_argument, nullptr, kOptCheckEvery},
      {"help", no_argument, nullptr, kOptHelp},
      {nullptr, 0, nullptr, 0},
  };
  int c;
  while ((c = getopt_long(argc, argv, "N:S:l:o:c:qh", longopts, nullptr)) != -1) {
    switch (c) {
      case 'N':
        opt.nops = parse_num(optarg, false, "op count");
        break;
      case 'S':
        opt.seed = parse_num(optarg, false, "seed");
        opt.seed_given = true;
        break;
      case 'l':
        opt.maxlen = parse_num(optarg, true, "maxlen");
        break;
      case 'o':
        opt.maxop = parse_num(optarg, true, "maxop");
        break;
      case 'c':
        opt.closeprob = parse_num(optarg, false, "close probability");
        break;
      case 'q':
        opt.quiet = true;
        break;
      case kOptNoMmap:
        opt.no_mmap = true;
        break;
      case kOptNoFalloc:
        opt.no_falloc = true;
        break;
      case kOptNoPunch:
        opt.no_punch = true;
        break;
      case kOptNoSeek:
        opt.no_seek = true;
        break;
      case kOptNoCopy:
        opt.no_copy = true;
        break;
      case kOptInject:
        opt.inject_at = parse_num(optarg, false, "inject-fault op");
        break;
      case kOptCheckEvery:
        opt.check_every = parse_num(optarg, false, "check-every");
        break;
      case 'h':
      case kOptHelp:
        usage(nullptr);
      default:
        usage(nullptr);
    }
  }
  if (optind != argc - 1) usage("exactly one FILE expected");
  opt.path = argv[optind];
  if (opt.maxlen == 0 || opt.maxop == 0) usage("maxlen and maxop must be positive");
  if (opt.maxlen > (uint64_t{1} << 34)) usage("maxlen above 16G: the model lives in memory");
  if (opt.maxop > opt.maxlen) opt.maxop = opt.maxlen;
  if (!opt.seed_given) {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    const uint64_t ns =
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
    opt.seed = (ns ^ (ns >> 32) ^ (static_cast<uint64_t>(getpid()) << 16)) & 0xFFFFFFFFu;
  }
  std::fprintf(stderr, "warpfs-fsx: seed %llu, %llu ops, maxlen %llu, maxop %llu, file %s\n",
               static_cast<unsigned long long>(opt.seed), static_cast<unsigned long long>(opt.nops),
               static_cast<unsigned long long>(opt.maxlen),
               static_cast<unsigned long long>(opt.maxop), opt.path.c_str());
  Fsx fsx(opt);
  return fsx.run();
}
