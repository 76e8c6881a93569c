// warpfs-stress: the concurrent stress harness on the filesystem core (tests/fs/stress.h).
//
//   warpfs-stress [--runs N | --seconds T | --soak] [--seed S] [--workers N] [--sharers N] [--ops
//   N]
//                 [--cut] [--cache-mb N] [--commit-each] [--verbose]
//
// --commit-each commits at the end of every transaction scope (warpfs-crash's option).
//
// Run i uses seed S + i. --seconds runs seeds one after another until T seconds have passed
// (a soak). Each failure prints one line naming its seed; ends with "N passed, N failed" and
// exit status 0 if every run passed, 1 if any failed, 2 on bad usage.
#include "fs/stress.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fs/crash_harness.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: warpfs-stress [--runs N | --seconds T | --soak] [--seed S] [--workers N] "
               "[--sharers N] [--ops N] [--cut] [--cache-mb N] [--commit-each] [--verbose]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t runs = 10, seed = 1, seconds = 0, workers = 4, sharers = 2, ops = 300, cache_mb = 0;
  bool cut = false, verbose = false, commit_each = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--soak") {  // for hours: seeds one after another, a line each, until interrupted
      seconds = 365ull * 24 * 3600;
      verbose = true;
    } else if (a == "--verbose" || a == "-v") {
      verbose = true;
    } else if (a == "--cut") {
      cut = true;
    } else if (a == "--commit-each") {
      commit_each = true;
    } else if ((a == "--runs" || a == "--seed" || a == "--seconds" || a == "--workers" ||
                a == "--sharers" || a == "--ops" || a == "--cache-mb") &&
               i + 1 < argc) {
      uint64_t v;
      if (!warpfs::fs::crash::parse_number(argv[++i], &v)) return usage();
      (a == "--runs"      ? runs
       : a == "--seed"    ? seed
       : a == "--seconds" ? seconds
       : a == "--workers" ? workers
       : a == "--sharers" ? sharers
       : a == "--ops"     ? ops
                          : cache_mb) = v;
    } else {
      return usage();
    }
  }
  if (workers == 0 || workers > 64 || sharers > 64 || ops == 0 || ops > 1000000) return usage();
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  uint64_t passed = 0, failed = 0, total_ops = 0, commits = 0, in_workload = 0;
  uint64_t clones = 0, dedupes = 0, passes = 0, cloned_blocks = 0, deduped_blocks = 0;
  for (uint64_t i = 0; seconds ? elapsed() < static_cast<double>(seconds) : i < runs; ++i) {
    warpfs::fs::stress::Options o;
    o.seed = seed + i;
    o.workers = static_cast<int>(workers);
    o.sharers = static_cast<int>(sharers);
    o.ops = ops;
    o.cut = cut;
    o.commit_each = commit_each;
    o.cache_mb = static_cast<uint32_t>(cache_mb);
    o.verbose = verbose;
    const warpfs::fs::stress::Report r = warpfs::fs::stress::run(o);
    total_ops += r.ops;
    commits += r.commits;
    in_workload += r.cut_call != 0;
    clones += r.clones;
    dedupes += r.dedupes;
    passes += r.dedup_passes;
    cloned_blocks += r.cloned_blocks;
    deduped_blocks += r.deduped_blocks;
    if (r.passed) {
      ++passed;
      if (verbose) {
        std::printf(
            "ok seed=%llu ops=%llu commits=%llu cut_call=%llu states durable/reached/matched "
            "%zu/%zu/%zu\n",
            static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(r.ops),
            static_cast<unsigned long long>(r.commits), static_cast<unsigned long long>(r.cut_call),
            r.durable_states, r.reached_states, r.matched_states);
        std::fflush(stdout);
      }
      continue;
    }
    ++failed;
    std::printf(
        "FAIL seed=%llu (rerun: warpfs-stress --seed %llu --runs 20 --workers %llu "
        "--sharers %llu --ops %llu%s%s%s --verbose): %s\n",
        static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(o.seed),
        static_cast<unsigned long long>(workers), static_cast<unsigned long long>(sharers),
        static_cast<unsigned long long>(ops), cut ? " --cut" : "",
        cache_mb ? (" --cache-mb " + std::to_string(cache_mb)).c_str() : "",
        commit_each ? " --commit-each" : "",
        warpfs::fs::crash::one_line(r.failure, verbose ? 0 : 1500).c_str());
    for (const std::string& t : r.trace) std::printf("  %s\n", t.c_str());
    std::fflush(stdout);
  }
  std::printf("%llu runs in %.1f s: %llu operations, %llu commits%s\n",
              static_cast<unsigned long long>(passed + failed), elapsed(),
              static_cast<unsigned long long>(total_ops), static_cast<unsigned long long>(commits),
              cut ? (", " + std::to_string(in_workload) + " cut inside the workload").c_str() : "");
  std::printf(
      "%llu clones (%llu blocks shared), %llu dedupes and %llu dedup passes (%llu blocks "
      "shared)\n",
      static_cast<unsigned long long>(clones), static_cast<unsigned long long>(cloned_blocks),
      static_cast<unsigned long long>(dedupes), static_cast<unsigned long long>(passes),
      static_cast<unsigned long long>(deduped_blocks));
  std::printf("%llu passed, %llu failed\n", static_cast<unsigned long long>(passed),
              static_cast<unsigned long long>(failed));
  return failed ? 1 : 0;
}
