// What the warpfs daemon (warpfs_main.cc) and warpfs-null (bench/null_fs.cc, the FUSE
// transport's ceiling in `bench/run fs`) negotiate with the kernel and how they run libfuse's
// session loop: one definition, so that the null daemon measures warpfs's transport. The
// includer defines FUSE_USE_VERSION (312) before including this header.
#pragma once

#include <fuse_lowlevel.h>
#include <unistd.h>

namespace warpfs::daemon {

// Entry and attribute timeouts (seconds) unless -o timeout= says otherwise: the kernel sees
// every change to a warpfs mount, and the daemon tells it those it makes on its own
// (warpfs(8), CACHING), so its caches may keep names and attributes as long as they like.
constexpr double kDefaultTimeoutS = 86400;

// Larger writes move more per request (FUSE's default is 128 KiB).
constexpr unsigned kMaxWrite = 1u << 20;

// Asynchronous requests the kernel lets through at once (its default, 12, was the depth of
// every O_DIRECT io_submit or io_uring job: the rest waited in the kernel, io_submit blocked).
// 128 lets four QD32 jobs reach the daemon together. The congestion threshold (the kernel's
// default is 3/4 of it) only stops asynchronous readahead.
constexpr unsigned kMaxBackground = 128;
constexpr unsigned kCongestionThreshold = kMaxBackground * 3 / 4;

// Worker threads where -o max_threads= is not given: 4 per CPU, at least libfuse's default
// (10), at most 64. A handler keeps its thread for the device's whole latency, so the
// requests a device serves together are at most the threads; but where the CPUs are the
// limit, more threads only add switches: on 2 cores, QD32 O_DIRECT random reads ran 22%
// (warpfs) and 48% (warpfs-null) slower with 64 threads than with 10. Idle threads stay
// (libfuse's max_idle_threads default).
inline unsigned default_max_threads() {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const unsigned four_per_cpu = cpus > 0 ? static_cast<unsigned>(cpus) * 4 : 0;
  return four_per_cpu < 10 ? 10 : four_per_cpu > 64 ? 64 : four_per_cpu;
}

// The connection options both daemons ask for in their init handler; returns whether the
// kernel's writeback cache is on. `writeback_cache` (-o writeback_cache): buffered writes stay
// in the kernel's page cache until fsync, close, memory pressure or its flusher writes them
// back, in any order; the kernel then owns mtime, ctime and the size of regular files and
// sends its times with a setattr (FUSE_SET_ATTR_CTIME). It also drops set-user-ID,
// set-group-ID and security.capability itself at write(2), with its own CAP_FSETID rule
// (FUSE_CAP_HANDLE_KILLPRIV off), since the daemon sees the write only at write-back, maybe
// after a chmod. Without it every write reaches the daemon before write(2) returns.
inline bool negotiate(fuse_conn_info* conn, bool writeback_cache) {
  if (conn->capable & FUSE_CAP_SPLICE_READ) conn->want &= ~FUSE_CAP_SPLICE_READ;
  const bool wb = writeback_cache && (conn->capable & FUSE_CAP_WRITEBACK_CACHE);
  if (wb) {
    conn->want |= FUSE_CAP_WRITEBACK_CACHE;
    conn->want &= ~FUSE_CAP_HANDLE_KILLPRIV;
  } else {
    conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  }
  conn->max_write = kMaxWrite;
  conn->max_background = kMaxBackground;
  conn->congestion_threshold = kCongestionThreshold;
  return wb;
}

// Whether -o max_threads=N is among the command line's options (fuse_parse_cmdline reports 10
// for both that and nothing). Leaves `args` as it found them.
inline bool max_threads_given(fuse_args* args) {
  bool given = false;
  const fuse_opt opts[] = {FUSE_OPT_KEY("max_threads=", 1), FUSE_OPT_END};
  fuse_opt_parse(args, &given, opts, [](void* data, const char*, int key, fuse_args*) {
    if (key == 1) *static_cast<bool*>(data) = true;
    return 1;  // kept for fuse_parse_cmdline
  });
  return given;
}

// Runs the session loop of `se` until it ends: single-threaded for -s, else libfuse's
// multithreaded loop with clone_fd and max_idle_threads from the command line, and
// max_threads from it where given (`threads_given`: max_threads_given before
// fuse_parse_cmdline), else default_max_threads(). Returns the loop's result.
inline int run_session_loop(fuse_session* se, const fuse_cmdline_opts& cl, bool threads_given) {
  if (cl.singlethread) return fuse_session_loop(se);
  fuse_loop_config* lc = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(lc, cl.clone_fd);
  fuse_loop_cfg_set_max_threads(lc, threads_given ? cl.max_threads : default_max_threads());
  // fuse_parse_cmdline leaves max_idle_threads at UINT_MAX (keep every idle thread) unless
  // given; passed on as it is, libfuse logs "Ignoring invalid max threads value".
  if (cl.max_idle_threads <= 100000) fuse_loop_cfg_set_idle_threads(lc, cl.max_idle_threads);
  const int rc = fuse_session_loop_mt(se, lc);
  fuse_loop_cfg_destroy(lc);
  return rc;
}

}  // namespace warpfs::daemon
