// Latency histograms: log-linear buckets, four per power of two of nanoseconds (a value
// lands within 19 % of its bucket's bounds), updated with relaxed atomics from any number of
// threads at once and read without stopping them. The namespace I/O unit times its commands
// with them; the FUSE daemon its operations.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>

namespace warpfs::nvme {

class LatencyHistogram {
 public:
  static constexpr unsigned kSub = 4;              // buckets per power of two
  static constexpr unsigned kBuckets = 63 * kSub;  // up to 2^64 - 1 ns

  // Thread-safe: relaxed atomics (a reader may see a sample in the count before the bucket).
  void add(uint64_t ns) {
    buckets_[bucket_of(ns)].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    uint64_t m = max_.load(std::memory_order_relaxed);
    while (ns > m && !max_.compare_exchange_weak(m, ns, std::memory_order_relaxed)) {
    }
  }

  struct Snapshot {
    uint64_t count = 0, max_ns = 0;
    uint64_t buckets[kBuckets] = {};
    // The upper bound of the bucket holding the q-th quantile (0 < q <= 1); 0 when empty.
    // Never above max_ns.
    uint64_t quantile_ns(double q) const {
      uint64_t total = 0;
      for (uint64_t b : buckets) total += b;
      if (total == 0) return 0;
      const auto want = static_cast<uint64_t>(q * static_cast<double>(total) + 0.999999);
      uint64_t seen = 0;
      for (unsigned i = 0; i < kBuckets; ++i) {
        seen += buckets[i];
        if (seen >= want) {
          const uint64_t hi = upper_of(i);
          return hi < max_ns ? hi : max_ns;
        }
      }
      return max_ns;
    }
  };
  Snapshot snapshot() const {
    Snapshot s;
    s.count = count_.load(std::memory_order_relaxed);
    s.max_ns = max_.load(std::memory_order_relaxed);
    for (unsigned i = 0; i < kBuckets; ++i)
      s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    return s;
  }

  // Bucket i covers [lower_of(i), upper_of(i)]: values below 4 one each, then each power of
  // two [2^e, 2^(e+1)) cut in four.
  static unsigned bucket_of(uint64_t ns) {
    if (ns < kSub) return static_cast<unsigned>(ns);
    const unsigned e = 63u - static_cast<unsigned>(std::countl_zero(ns));  // 2^e <= ns
    const unsigned sub = static_cast<unsigned>((ns >> (e - 2)) & (kSub - 1));
    return (e - 1) * kSub + sub;
  }
  static uint64_t upper_of(unsigned i) {
    if (i < kSub) return i;
    const unsigned e = i / kSub + 1, sub = i % kSub;
    const uint64_t step = uint64_t{1} << (e - 2);
    const uint64_t lower = (uint64_t{1} << e) + sub * step;
    return lower + step - 1;
  }

 private:
  std::atomic<uint64_t> buckets_[kBuckets] = {};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> max_{0};
};

}  // namespace warpfs::nvme
