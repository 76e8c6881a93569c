// warpfs-crash: power-cut crash harness for the filesystem core (tests/fs/crash_harness.h).
//
//   warpfs-crash [--cuts N] [--seed S] [--ops N] [--threads T] [--commit-each] [--verbose]
//
// With --commit-each, every transaction scope commits as it ends, so that the cut can fall
// between any two scopes of one operation.
// With --threads T (> 1), each cut runs T workload threads at once on the one filesystem,
// each with a subtree and a model of its own (tests/fs/stress.h with no sharers): the
// oracle then allows any interleaving of the threads' operations, each thread's in order.
//
// Runs N cuts; cut i uses seed S + i, so `--seed S+i --cuts 1` (with the same --ops)
// replays cut i exactly: the same operations, the same cut point, the same power-cut draws.
// Each failure prints one line naming its seed; --verbose adds the operations of each
// failing cut (and a line per passing one). Ends with "N passed, N failed"; exit status 0
// if every cut passed, 1 if any failed, 2 on bad usage.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fs/crash_harness.h"
#include "fs/stress.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: warpfs-crash [--cuts N] [--seed S] [--ops N] [--threads T] [--commit-each] "
               "[--verbose]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t cuts = 100, seed = 1, ops = 150, threads = 1;
  bool verbose = false, commit_each = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--verbose" || a == "-v") {
      verbose = true;
    } else if (a == "--commit-each") {
      commit_each = true;
    } else if ((a == "--cuts" || a == "--seed" || a == "--ops" || a == "--threads") &&
               i + 1 < argc) {
      uint64_t v;
      if (!warpfs::fs::crash::parse_number(argv[++i], &v)) return usage();
      (a == "--cuts" ? cuts : a == "--seed" ? seed : a == "--ops" ? ops : threads) = v;
    } else {
      return usage();
    }
  }
  if (ops == 0 || ops > 100000 || threads == 0 || threads > 64) return usage();
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t passed = 0, failed = 0, in_workload = 0, recovery_cuts = 0;
  // copy_file_range and dedupe_range operations run, and the blocks they shared.
  uint64_t clones = 0, dedupes = 0, cloned_blocks = 0, deduped_blocks = 0;
  for (uint64_t i = 0; i < cuts && threads > 1; ++i) {
    warpfs::fs::stress::Options o;
    o.seed = seed + i;
    o.workers = static_cast<int>(threads);
    o.sharers = 0;
    o.observer = false;
    o.ops = ops;
    o.cut = true;
    o.commit_each = commit_each;
    o.mib = 64 * threads;
    o.verbose = verbose;
    const warpfs::fs::stress::Report r = warpfs::fs::stress::run(o);
    in_workload += r.cut_call != 0;
    clones += r.clones;
    dedupes += r.dedupes;
    cloned_blocks += r.cloned_blocks;
    deduped_blocks += r.deduped_blocks;
    if (r.passed) {
      ++passed;
      if (verbose) {
        std::printf(
            "ok seed=%llu threads=%llu ops=%llu cut=%llu states durable/reached/matched "
            "%zu/%zu/%zu\n",
            static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(threads),
            static_cast<unsigned long long>(r.ops), static_cast<unsigned long long>(r.cut_call),
            r.durable_states, r.reached_states, r.matched_states);
      }
      continue;
    }
    ++failed;
    std::printf(
        "FAIL seed=%llu (rerun: warpfs-crash --seed %llu --cuts 1 --ops %llu --threads %llu%s "
        "--verbose, several times: the threads' interleaving varies): %s\n",
        static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(o.seed),
        static_cast<unsigned long long>(ops), static_cast<unsigned long long>(threads),
        commit_each ? " --commit-each" : "",
        warpfs::fs::crash::one_line(r.failure, verbose ? 0 : 600).c_str());
    for (const std::string& t : r.trace) std::printf("  %s\n", t.c_str());
    std::fflush(stdout);
  }
  for (uint64_t i = 0; i < cuts && threads == 1; ++i) {
    warpfs::fs::crash::CutOptions o;
    o.seed = seed + i;
    o.ops = static_cast<int>(ops);
    o.commit_each = commit_each;
    o.verbose = verbose;
    const warpfs::fs::crash::CutReport r = warpfs::fs::crash::run_cut(o);
    in_workload += r.cut_call != 0;
    recovery_cuts += r.recovery_cut != 0;
    clones += static_cast<uint64_t>(r.clones);
    dedupes += static_cast<uint64_t>(r.dedupes);
    cloned_blocks += r.cloned_blocks;
    deduped_blocks += r.deduped_blocks;
    if (r.passed) {
      ++passed;
      if (verbose) {
        std::printf(
            "ok seed=%llu ops=%d calls=%llu flushes=%llu cut=%llu%s persist=%.2f recovery_cut=%llu "
            "states=%zu..%zu matched=%zu\n",
            static_cast<unsigned long long>(o.seed), r.ops_run,
            static_cast<unsigned long long>(r.calls), static_cast<unsigned long long>(r.flushes),
            static_cast<unsigned long long>(r.cut_call), r.cut_at_flush ? "(flush)" : "", r.persist,
            static_cast<unsigned long long>(r.recovery_cut), r.lo, r.hi, r.matched);
      }
      continue;
    }
    ++failed;
    std::printf(
        "FAIL seed=%llu (rerun: warpfs-crash --seed %llu --cuts 1 --ops %llu%s --verbose): %s\n",
        static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(o.seed),
        static_cast<unsigned long long>(ops), commit_each ? " --commit-each" : "",
        warpfs::fs::crash::one_line(r.failure, verbose ? 0 : 600).c_str());
    if (verbose) std::printf("%s\n", r.failure.c_str());  // with the reports' own lines
    for (const std::string& t : r.trace) std::printf("  %s\n", t.c_str());
    std::fflush(stdout);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%llu cuts in %.1f s (%llu inside the workload, %llu with recovery cut too)\n",
              static_cast<unsigned long long>(cuts), secs,
              static_cast<unsigned long long>(in_workload),
              static_cast<unsigned long long>(recovery_cuts));
  std::printf(
      "%llu clones (%llu blocks shared), %llu dedupes (%llu blocks shared)\n",
      static_cast<unsigned long long>(clones), static_cast<unsigned long long>(cloned_blocks),
      static_cast<unsigned long long>(dedupes), static_cast<unsigned long long>(deduped_blocks));
  std::printf("%llu passed, %llu failed\n", static_cast<unsigned long long>(passed),
              static_cast<unsigned long long>(failed));
  return failed ? 1 : 0;
}
