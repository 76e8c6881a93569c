// The latency histograms (nvme/latency.h): bucket bounds, quantiles within a bucket of the
// truth, and no sample lost when many threads add at once.
#include "warpfs/nvme/latency.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace warpfs::nvme {
namespace {

TEST(Latency, BucketsCoverEveryValueWithinAQuarterOfItsPowerOfTwo) {
  for (uint64_t v : {0ull, 1ull, 3ull, 4ull, 5ull, 7ull, 8ull, 1000ull, 1023ull, 1024ull,
                     123456789ull, ~0ull >> 1, ~0ull}) {
    const unsigned b = LatencyHistogram::bucket_of(v);
    ASSERT_LT(b, LatencyHistogram::kBuckets) << v;
    EXPECT_LE(v, LatencyHistogram::upper_of(b)) << v;
    if (b > 0) {
      EXPECT_GT(v, LatencyHistogram::upper_of(b - 1)) << v;
    }
    EXPECT_LE(static_cast<double>(LatencyHistogram::upper_of(b)), static_cast<double>(v) * 1.25 + 1)
        << v;
  }
}

TEST(Latency, QuantilesLandInTheRightBucket) {
  LatencyHistogram h;
  for (int i = 0; i < 990; ++i) h.add(1000);
  for (int i = 0; i < 9; ++i) h.add(50'000);
  h.add(2'000'000);
  const auto s = h.snapshot();
  EXPECT_EQ(s.count, 1000u);
  EXPECT_EQ(s.max_ns, 2'000'000u);
  EXPECT_GE(s.quantile_ns(0.5), 1000u);
  EXPECT_LT(s.quantile_ns(0.5), 1250u);
  EXPECT_LT(s.quantile_ns(0.99), 1250u) << "990 of 1000 samples are 1 us";
  EXPECT_GE(s.quantile_ns(0.995), 50'000u);
  EXPECT_LT(s.quantile_ns(0.995), 62'500u);
  EXPECT_EQ(s.quantile_ns(1.0), 2'000'000u) << "capped at the maximum";
  EXPECT_EQ(LatencyHistogram{}.snapshot().quantile_ns(0.5), 0u);
}

TEST(Latency, ConcurrentAddsLoseNothing) {
  LatencyHistogram h;
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&h, t] {
      for (int i = 0; i < 20000; ++i) h.add(static_cast<uint64_t>(t * 1000 + i % 977));
    });
  }
  for (auto& t : ts) t.join();
  const auto s = h.snapshot();
  EXPECT_EQ(s.count, 8u * 20000);
  uint64_t total = 0;
  for (uint64_t b : s.buckets) total += b;
  EXPECT_EQ(total, s.count);
  EXPECT_EQ(s.max_ns, 7u * 1000 + 976);
}

}  // namespace
}  // namespace warpfs::nvme
