// Pieces every benchmark program shares: option parsing, a per-thread random generator,
// first-failure reporting, per-thread latency logs and percentiles.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace warpfs::bench {

// A decimal integer in [lo, hi].
inline bool parse_uint(const std::string& s, uint64_t lo, uint64_t hi, uint64_t* out) {
  if (s.empty() || s[0] < '0' || s[0] > '9') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// A finite decimal number in [lo, hi].
inline bool parse_double(const std::string& s, double lo, double hi, double* out) {
  if (s.empty() || !((s[0] >= '0' && s[0] <= '9') || s[0] == '.')) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t comma = s.find(',', start);
    parts.push_back(s.substr(start, comma - start));
    if (comma == std::string::npos) return parts;
    start = comma + 1;
  }
}

// A comma-separated list of integers in [lo, hi]; `usage_error` (which does not return)
// names a bad element.
template <typename UsageError>
std::vector<unsigned> parse_uint_list(const std::string& opt, const std::string& s, unsigned lo,
                                      unsigned hi, UsageError&& usage_error) {
  std::vector<unsigned> out;
  for (const std::string& p : split_list(s)) {
    uint64_t v = 0;  // usage_error does not return
    if (!parse_uint(p, lo, hi, &v)) {
      usage_error(opt + ": '" + p + "' is not an integer in " + std::to_string(lo) + ".." +
                  std::to_string(hi));
    }
    out.push_back(static_cast<unsigned>(v));
  }
  return out;
}

// xorshift64*: cheap, and each thread draws its own sequence.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9e3779b97f4a7c15ull | 1) {}
  uint64_t next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return s_ * 0x2545f4914f6cdd1dull;
  }
  // Uniform in [0, n) (multiply-shift: no division on the hot path).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

 private:
  uint64_t s_;
};

// The first failure any thread meets; the rest stop at their next operation.
class Failure {
 public:
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  void report(std::string what) {
    std::lock_guard<std::mutex> g(mu_);
    if (!failed_.load(std::memory_order_relaxed)) what_ = std::move(what);
    failed_.store(true, std::memory_order_relaxed);
  }
  std::string what() {
    std::lock_guard<std::mutex> g(mu_);
    return what_;
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::string what_;
};

// Per-thread latency record. Chunks, not one growing vector: a vector's reallocation copies
// megabytes in the middle of the run and shows up as a fake maximum.
class LatencyLog {
 public:
  static constexpr size_t kChunk = size_t{1} << 16;
  LatencyLog() { grow(); }
  void add(uint64_t ns) {
    if (used_ == kChunk) grow();
    chunks_.back()[used_++] = ns;
  }
  size_t size() const { return (chunks_.size() - 1) * kChunk + used_; }
  void append_to(std::vector<uint64_t>* out) const {
    for (size_t c = 0; c < chunks_.size(); ++c) {
      const size_t n = c + 1 == chunks_.size() ? used_ : kChunk;
      out->insert(out->end(), chunks_[c].get(), chunks_[c].get() + n);
    }
  }

 private:
  void grow() {
    chunks_.emplace_back(new uint64_t[kChunk]);
    std::memset(chunks_.back().get(), 0, kChunk * sizeof(uint64_t));  // fault it in now
    used_ = 0;
  }
  std::vector<std::unique_ptr<uint64_t[]>> chunks_;
  size_t used_ = 0;
};

// Nearest-rank percentile of sorted, non-empty samples.
inline uint64_t percentile(const std::vector<uint64_t>& sorted, double p) {
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

}  // namespace warpfs::bench
