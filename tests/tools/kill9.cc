// warpfs-kill9: power cuts through a real FUSE mount: kill -9 of the warpfs daemon
// while a workload of real syscalls runs on its mount.
//
//   warpfs-kill9 [--cuts N] [--seed S] [--ops N] [--repeat R] [--keep DIR] [--verbose]
//
// Cut i uses seed S + i (each seed R times with --repeat); each cut formats its own image.
//   1. mkfs.warpfs of a 64 MiB emulated image; `warpfs -f` (a child process) mounts it with
//      options drawn from the seed: commit interval, software cache, emulated controller
//      workers and latency, the kernel's writeback cache or not.
//   2. crash_harness.h's workload (next_op: creates, writes, truncates, renames, exchanges,
//      links, unlinks, mkdir/rmdir, xattrs, fsync/fdatasync of files and directories, files
//      held open and unlinked) runs as syscalls on the mount from this thread, one cut in
//      four paced (up to 2 ms between operations, so that timed commits land among them);
//      its model follows.
//   3. Another thread sends SIGKILL to the daemon once a drawn operation has started, a drawn
//      0-20 ms later: while operations are in flight (one cut in ten: after the last one).
//   4. The dead mount is detached (umount -l); fsck.warpfs -f -n of the crashed image must
//      exit 0 (it replays the journal in memory). One cut in five mounts it again and kills
//      that daemon within 100 ms (during journal replay or just after), and fscks again.
//   5. warpfs mounts it (replaying the journal); the tree read through the mount must be a
//      state the model allows; 5-20 more operations; fusermount3 -u must see the daemon exit
//      0; fsck -f -n must exit 0; a last mount must show exactly the model's last state.
//
// What the kill loses is the daemon's memory: cached metadata, the running transaction, and
// (with vwc_model=1, three cuts in four) the emulated controller's volatile write cache.
// What the controller had written to the image file is in the host's page cache and
// survives, as a drive's media would.
//
// The oracle is warpfs-crash's (crash_harness.h check()): the recovered tree is one state S_k
// the workload passed through, k no earlier than the last acknowledged fsync, and each 4 KiB
// block of file data comes from a state in [k, last]. That holds through FUSE because one
// thread issues every operation (per subtree) and, without the kernel's writeback cache, each
// syscall's FUSE requests are answered, in order, before it returns. One cut in two mounts
// with -o writeback_cache: buffered writes and stores into mappings then stay in the kernel
// until it writes them back, page by page in any order, and a kill loses what it had not:
// each file's size and blocks are held instead to what POSIX and ext4 promise, any version
// each block had since the file's last acknowledged fsync/fdatasync, and a size it had since
// (or a page boundary between), so every fsync'd byte is there (Model::track_writeback);
// the names, modes, links and xattrs to S_k as before. What differs:
//   - The lower bound rises only when an fsync or fdatasync (of a file or a directory:
//     FUSE_FSYNC, FUSE_FSYNCDIR) returns 0, to that node's last change the call needs
//     (Model::synced; warpfs's other commits are not visible from here), and at a clean
//     unmount. The
//     workload's "sync" is syncfs(2) on the mount, which the kernel does not pass on to a
//     FUSE daemon (only virtiofs gets FUSE_SYNCFS): it makes nothing durable.
//   - The operation the kill interrupts may or may not have happened, whatever it returned
//     (the daemon may have done it and died before replying). The inode number of such a
//     create, mkdir or symlink comes from the recovered tree.
//   - The kernel cuts a write(2) into FUSE_WRITEs at page boundaries (Linux 6.18: the first
//     ends at the first boundary, then 1 MiB each, the daemon's max_write), which file.cc
//     commits in pieces of at most 1 MiB ending at block boundaries; a commit may come
//     between any two. So the model has a state at every 4 KiB boundary inside a write.
//
// Reproducing: the seed fixes the workload, the mount options, the operation the killer
// waits for and its delay; where SIGKILL lands after that depends on timing, so a failure's
// line gives `--seed S --cuts 1 --repeat 20`, the same cut 20 times. --verbose prints each
// cut's operations; --keep DIR keeps the image of a failing cut as it was right after the
// kill. Ends with "N passed, N failed"; exit status 0 if every cut passed, 1 if any failed,
// 2 on bad usage. Needs root (or a user allowed to mount FUSE) and /dev/fuse. The programs
// come from the environment (WARPFS, MKFS, FSCK), else from the build tree.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fs/crash_harness.h"
#include "tools/mount_rig.h"
#include "tools/syscall_ops.h"

namespace {

namespace crash = warpfs::fs::crash;
using crash::Id;
using crash::MNode;
using crash::Model;
using crash::Observed;
using crash::Op;
using crash::OpKind;
using warpfs::fs::Ino;
using warpfs::fs::mounted::Daemon;
using warpfs::fs::mounted::errno_name;
using warpfs::fs::mounted::last_lines;
using warpfs::fs::mounted::run_program;
using warpfs::fs::mounted::SyscallRunner;

constexpr uint64_t kImageMiB = 64;  // as warpfs-crash's RAM store: the workload keeps < 20 MiB
constexpr uint64_t kB = 4096;

struct Programs {
  std::string warpfs, mkfs, fsck;
};

#ifndef WARPFS_DAEMON_BIN
#define WARPFS_DAEMON_BIN "warpfs"
#endif
#ifndef WARPFS_MKFS_BIN
#define WARPFS_MKFS_BIN "mkfs.warpfs"
#endif
#ifndef WARPFS_FSCK_BIN
#define WARPFS_FSCK_BIN "fsck.warpfs"
#endif

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// Sends SIGKILL to a pid from its own thread, once operation `at_op` has started (or the
// workload is over) and `delay_us` more have passed (cut short when the workload ends).
class Killer {
 public:
  Killer(pid_t pid, uint64_t at_op, uint64_t delay_us)
      : pid_(pid), at_op_(at_op), delay_(delay_us), t_([this] { loop(); }) {}
  ~Killer() { finish(); }
  Killer(const Killer&) = delete;
  Killer& operator=(const Killer&) = delete;

  // The workload starts operation i (0, 1, ...).
  void started(uint64_t i) {
    std::lock_guard<std::mutex> l(mu_);
    started_ = i + 1;
    cv_.notify_all();
  }
  // No more operations: the kill goes now if it has not; returns once it has.
  void finish() {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
      cv_.notify_all();
    }
    if (t_.joinable()) t_.join();
  }
  // Set before the signal is sent: an operation that fails and finds this false failed
  // while the daemon was alive.
  bool fired() const { return fired_.load(); }
  uint64_t fired_during() const { return fired_during_; }        // operations started by then
  bool fired_in_workload() const { return fired_in_workload_; }  // before finish()

 private:
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return started_ > at_op_ || done_; });
    cv_.wait_for(l, std::chrono::microseconds(delay_), [&] { return done_; });
    fired_during_ = started_;
    fired_in_workload_ = !done_;
    fired_.store(true);
    kill(pid_, SIGKILL);
  }

  const pid_t pid_;
  const uint64_t at_op_, delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t started_ = 0;       // guarded by mu_
  bool done_ = false;          // guarded by mu_
  uint64_t fired_during_ = 0;  // written before fired_ is set, read after finish()
  bool fired_in_workload_ = false;
  std::atomic<bool> fired_{false};
  std::thread t_;  // last: starts once the rest is initialised
};

// A generator for one purpose (`salt`) of a seed: consecutive seeds give unrelated streams.
std::mt19937_64 seeded(uint64_t seed, uint32_t salt) {
  std::seed_seq s{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), salt};
  return std::mt19937_64(s);
}

// --- one cut -------------------------------------------------------------------------------

struct Options {
  uint64_t ops = 150;    // operations of all workload threads together
  uint64_t threads = 1;  // workload threads (1: on the root, as before; more: /wK each)
  bool verbose = false;
  std::string keep;  // a directory for the crashed images of failing cuts
};

struct Report {
  bool passed = false;
  std::string failure;
  std::string mount_options;
  uint64_t kill_at_op = 0, delay_us = 0;
  uint64_t ops_run = 0;           // operations started
  uint64_t killed_in = 0;         // operations started when the signal went
  bool after_workload = false;    // the kill was drawn to come after the last operation
  bool in_workload = false;       // it came while operations were still being issued
  uint64_t recovery_kill_us = 0;  // > 0: the first recovery mount dies this long after its start
  size_t lo = 0, hi = 0, matched = 0;  // summed over the workload threads
  std::string kept;                    // --keep: the crashed image's copy
  std::vector<std::string> trace;
};

// One workload thread: a subtree (the whole tree when alone), its model and its syscalls.
struct Worker {
  std::string base;  // the model's root in the mount
  std::unique_ptr<Model> model;
  std::unique_ptr<SyscallRunner> runner;
  std::mt19937_64 rng;
  std::vector<std::string> trace;
};

class Cut {
 public:
  Cut(const Programs& p, const std::string& dir, const Options& o, uint64_t seed)
      : progs_(p), img_(dir + "/img"), opt_(o), seed_(seed), daemon_(p.warpfs, dir) {}
  Report run();

 private:
  bool killed() const { return killer_ && killer_->fired(); }
  void trace(const std::string& s) {
    if (opt_.verbose) report_.trace.push_back(s);
  }
  std::string fsck(const char* when);
  // Runs one operation of worker w; "" or the failure. An fsync makes only what its node
  // needs durable (Model::synced), so one worker's fsync says nothing of another's states.
  std::string apply(Worker& w, const Op& op);
  // `ops` operations on every worker at once (the killer counts them); "" or the first
  // failure.
  std::string run_workers(uint64_t ops, uint64_t pace_us, bool count_for_killer);
  std::string recover();
  std::string check_final();

  const Programs& progs_;
  const std::string img_;
  const Options& opt_;
  const uint64_t seed_;
  Daemon daemon_;
  std::unique_ptr<Killer> killer_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<uint64_t> started_{0};  // operations started (for the killer)
  Report report_;
};

std::string Cut::fsck(const char* when) {
  std::string out;
  const int rc = run_program({progs_.fsck, "-f", "-n", "emu:" + img_}, &out);
  if (rc == 0) return "";
  return std::string("fsck.warpfs -f -n ") + when + ": exit " + std::to_string(rc) + "\n" + out;
}

std::string Cut::apply(Worker& w, const Op& op) {
  int rc = 0;
  std::string bad = w.runner->exec(op, &rc);
  if (!bad.empty()) return bad;
  if (rc != 0 && !killed()) {
    if (std::string how = daemon_.ended(); !how.empty())
      return "returned " + errno_name(rc) + ": " + how;
    return "returned " + errno_name(rc) +
           " (the daemon is alive); its log: " + last_lines(daemon_.log(), 10);
  }
  return "";
}

std::string Cut::run_workers(uint64_t ops, uint64_t pace_us, bool count_for_killer) {
  std::mutex mu;
  std::string failure;
  auto loop = [&](Worker& w, uint64_t n) {
    for (uint64_t i = 0; i < n && !killed(); ++i) {
      {
        std::lock_guard<std::mutex> g(mu);
        if (!failure.empty()) return;
      }
      const Op op = crash::next_op(*w.model, w.rng);
      if (count_for_killer) killer_->started(started_.fetch_add(1));
      const std::string bad = apply(w, op);
      if (opt_.verbose) {
        w.trace.push_back(op.describe() + "  [states " + std::to_string(w.model->lo()) + ".." +
                          std::to_string(w.model->current()) + "]" +
                          (killed() ? " (daemon killed)" : ""));
      }
      if (!bad.empty()) {
        std::lock_guard<std::mutex> g(mu);
        if (failure.empty())
          failure = w.base + ": op " + std::to_string(i) + " (" + op.describe() + "): " + bad;
        return;
      }
      if (pace_us && !killed()) usleep(static_cast<useconds_t>(w.rng() % pace_us));
    }
  };
  const uint64_t per = std::max<uint64_t>(1, ops / workers_.size());
  if (workers_.size() == 1) {
    loop(*workers_[0], per);
  } else {
    std::vector<std::thread> ts;
    for (auto& w : workers_) ts.emplace_back(loop, std::ref(*w), per);
    for (auto& t : ts) t.join();
  }
  for (auto& w : workers_) {
    for (const std::string& t : w->trace) trace(w->base.substr(daemon_.mnt().size()) + " " + t);
    w->trace.clear();
  }
  return failure;
}

// After the kill: fsck, mount, check every worker's subtree against its model, and the models
// go on from what is there. "" or the failure.
std::string Cut::recover() {
  if (std::string e = fsck("of the crashed image"); !e.empty()) return e;
  if (report_.recovery_kill_us > 0) {  // the power goes again while the journal replays
    if (std::string e = daemon_.start_and_kill(report_.mount_options, report_.recovery_kill_us);
        !e.empty()) {
      return "the recovery mount that was to be killed: " + e;
    }
    if (std::string e = fsck("after the killed recovery"); !e.empty()) return e;
  }
  if (std::string e = daemon_.start(report_.mount_options); !e.empty())
    return "recovery mount: " + e;
  Observed o;
  if (std::string e = warpfs::fs::mounted::observe(daemon_.mnt(), &o); !e.empty())
    return "reading the recovered tree: " + e;
  report_.hi = report_.lo = report_.matched = 0;
  for (auto& wp : workers_) {
    Worker& w = *wp;
    Model& model = *w.model;
    const warpfs::fs::mounted::PendingCreate& pending = w.runner->pending();
    if (pending.set) {  // the interrupted create: there if its entry is (by inode number)
      const Ino dino = model.node(pending.dir)->ino;
      const uint8_t type = pending.kind == OpKind::kMkdir     ? DT_DIR
                           : pending.kind == OpKind::kSymlink ? DT_LNK
                                                              : DT_REG;
      if (auto d = o.nodes.find(dino); d != o.nodes.end()) {
        if (auto e = d->second.entries.find(pending.name);
            e != d->second.entries.end() && e->second.second == type) {
          const uint32_t mode = o.nodes.at(e->second.first).mode;
          w.runner->add_created(pending.kind, pending.dir, pending.name, e->second.first,
                                pending.perm, pending.target, mode);
          trace("the interrupted create of " + pending.name + " came back as inode " +
                std::to_string(e->second.first));
        }
      }
      w.runner->clear_pending();
    }
    size_t k = 0;
    if (std::string e = crash::check(model, model.current(), o, &k); !e.empty())
      return (workers_.size() > 1 ? w.base.substr(daemon_.mnt().size()) + ": " : "") + e;
    report_.lo += model.lo();
    report_.hi += model.current();
    report_.matched += k;
    model.restart(k, crash::recovered_data(model.state(k), o));
  }
  return "";
}

// After a clean unmount: fsck, mount, every subtree is its model's last state, unmount.
std::string Cut::check_final() {
  if (std::string e = fsck("after a clean unmount"); !e.empty()) return e;
  if (std::string e = daemon_.start(report_.mount_options); !e.empty()) return "mount: " + e;
  Observed o;
  if (std::string e = warpfs::fs::mounted::observe(daemon_.mnt(), &o); !e.empty())
    return "reading the tree: " + e;
  for (auto& w : workers_) {
    w->model->durable(w->model->current());
    if (std::string e = crash::check(*w->model, w->model->current(), o); !e.empty()) return e;
  }
  return daemon_.unmount();
}

Report Cut::run() {
  std::mt19937_64 draw = seeded(seed_, 2);  // the mount options and the kill
  Report& r = report_;
  // Mount options: timed commits every second or five (the default); no software cache, a
  // small one or the default; the emulated controller with one or two workers (two complete
  // out of order), with or without latency.
  static const char* const kCommit[] = {"1", "5"};
  static const char* const kCache[] = {"0", "4", "64"};
  static const char* const kWorkers[] = {"1", "2"};
  static const char* const kLatency[] = {"0", "0", "20"};
  r.mount_options = std::string("commit=") + kCommit[draw() % 2] +
                    ",cache_mb=" + kCache[draw() % 3] + ",workers=" + kWorkers[draw() % 2] +
                    ",latency_us=" + kLatency[draw() % 3];
  // The kill: once a drawn operation has started (one cut in ten: after the last), after
  // none, up to 0.2 ms, 2 ms or 20 ms more.
  r.after_workload = draw() % 10 == 0;
  r.kill_at_op = r.after_workload ? opt_.ops : draw() % opt_.ops;
  static const uint64_t kDelayMax[] = {0, 200, 2000, 20000};
  const uint64_t dmax = kDelayMax[draw() % 4];
  r.delay_us = dmax ? draw() % dmax : 0;
  // One cut in five kills the first recovery mount too, within its first 100 ms (a mount
  // takes 50-150 ms, journal replay first).
  r.recovery_kill_us = draw() % 5 == 0 ? 1 + draw() % 100000 : 0;
  // One cut in four paces the workload (up to 2 ms between operations), so that timed
  // commits land among the operations.
  const uint64_t pace_us = draw() % 4 == 0 ? 2000 : 0;
  // One cut in two mounts with the kernel's writeback cache (drawn last: the draws above are
  // what they were for every seed).
  const bool writeback_cache = draw() % 2 == 0;
  if (writeback_cache) r.mount_options += ",writeback_cache";
  // Three cuts in four keep the emulated drive's volatile write cache in the daemon
  // (vwc_model=1), so the kill is a power cut that loses it; the rest leave unflushed writes
  // in the image's page cache (the daemon's default), as a drive keeps what it received when
  // its driver dies. Drawn apart from the rest, so seeds keep their other choices.
  std::mt19937_64 vwc = seeded(seed_, 3);
  r.mount_options += vwc() % 4 != 0 ? ",vwc_model=1" : ",vwc_model=0";

  std::string out;
  if (int rc = run_program(
          {progs_.mkfs, "-q", "--force", "--size", std::to_string(kImageMiB) + "M", "emu:" + img_},
          &out);
      rc != 0) {
    r.failure = "mkfs.warpfs: exit " + std::to_string(rc) + ": " + out;
    return r;
  }
  if (std::string e = daemon_.start(r.mount_options); !e.empty()) {
    r.failure = "mount: " + e;
    return r;
  }
  // The workers: the root when alone (the single-threaded harness as it always was), else
  // a directory each, made durable before the workload (an fsync of the root).
  for (uint64_t k = 0; k < opt_.threads; ++k) {
    auto w = std::make_unique<Worker>();
    Ino root = warpfs::fs::kRootInode;
    w->base = daemon_.mnt();
    if (opt_.threads > 1) {
      w->base += "/w" + std::to_string(k);
      struct stat st;
      if (mkdir(w->base.c_str(), 0755) != 0 || lstat(w->base.c_str(), &st) != 0) {
        r.failure = "mkdir " + w->base + ": " + errno_name(errno);
        return r;
      }
      root = st.st_ino;
    }
    w->model = std::make_unique<Model>(root);
    w->model->track_writeback(writeback_cache);
    w->runner =
        std::make_unique<SyscallRunner>(w->base, w->model.get(), [this] { return killed(); });
    w->rng = seeded(seed_, k == 0 ? 1 : static_cast<uint32_t>(100 + k));  // thread 0: as before
    workers_.push_back(std::move(w));
  }
  if (opt_.threads > 1) {
    const int fd = open(daemon_.mnt().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const bool ok = fd >= 0 && fsync(fd) == 0;
    if (fd >= 0) close(fd);
    if (!ok) {
      r.failure = "fsync of the root: " + errno_name(errno);
      return r;
    }
  }
  trace("mounted -o " + r.mount_options + "; kill once op " + std::to_string(r.kill_at_op) +
        " has started, " + std::to_string(r.delay_us) + " us later");
  killer_ = std::make_unique<Killer>(daemon_.pid(), r.kill_at_op, r.delay_us);
  std::string failure = run_workers(opt_.ops, pace_us, true);
  r.ops_run = started_.load();
  killer_->finish();
  r.killed_in = killer_->fired_during();
  r.in_workload = killer_->fired_in_workload();
  killer_.reset();
  for (auto& w : workers_) w->runner->close_all();
  if (failure.empty()) failure = daemon_.reap_killed();
  daemon_.abandon();
  if (!failure.empty()) {
    r.failure = failure;
    return r;
  }
  for (auto& w : workers_) {
    r.lo += w->model->lo();
    r.hi += w->model->current();
  }
  trace("killed with " + std::to_string(r.killed_in) + " operations started; states " +
        std::to_string(r.lo) + ".." + std::to_string(r.hi) +
        (r.recovery_kill_us
             ? "; the recovery mount is killed after " + std::to_string(r.recovery_kill_us) + " us"
             : ""));
  const size_t lo = r.lo, hi = r.hi;
  const std::string kept = opt_.keep + "/kill9-seed-" + std::to_string(seed_) + ".img";
  if (!opt_.keep.empty() && run_program({"cp", "--sparse=always", img_, kept}, &out) == 0)
    r.kept = kept;
  if (std::string e = recover(); !e.empty()) {
    r.failure = "recovery (states " + std::to_string(lo) + ".." + std::to_string(hi) + "): " + e;
    return r;
  }
  trace("recovered states summing to " + std::to_string(r.matched));
  // The recovered filesystem works: a few more operations, a clean unmount, and it is all there.
  const uint64_t more = (5 + draw() % 16) * workers_.size();
  if (std::string e = run_workers(more, 0, false); !e.empty()) {
    r.failure = "after recovery: " + e;
    return r;
  }
  for (auto& w : workers_) w->runner->close_all();
  if (std::string e = daemon_.unmount(); !e.empty()) {
    r.failure = "after recovery: " + e;
    return r;
  }
  if (std::string e = check_final(); !e.empty()) {
    r.failure = "after recovery and a clean unmount: " + e;
    return r;
  }
  if (!r.kept.empty()) std::remove(r.kept.c_str());
  r.kept.clear();
  r.passed = true;
  return r;
}

// --- main ----------------------------------------------------------------------------------

int usage() {
  std::fprintf(stderr,
               "usage: warpfs-kill9 [--cuts N] [--seed S] [--ops N] [--threads T] [--repeat R] "
               "[--keep DIR] [--verbose]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t cuts = 20, seed = 1, repeat = 1;
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--verbose" || a == "-v") {
      o.verbose = true;
    } else if (a == "--keep" && i + 1 < argc) {
      o.keep = argv[++i];
    } else if ((a == "--cuts" || a == "--seed" || a == "--ops" || a == "--repeat" ||
                a == "--threads") &&
               i + 1 < argc) {
      uint64_t v;
      if (!crash::parse_number(argv[++i], &v)) return usage();
      (a == "--cuts"      ? cuts
       : a == "--seed"    ? seed
       : a == "--ops"     ? o.ops
       : a == "--threads" ? o.threads
                          : repeat) = v;
    } else {
      return usage();
    }
  }
  if (o.ops == 0 || o.ops > 100000 || repeat == 0 || o.threads == 0 || o.threads > 64)
    return usage();
  const Programs progs{env_or("WARPFS", WARPFS_DAEMON_BIN), env_or("MKFS", WARPFS_MKFS_BIN),
                       env_or("FSCK", WARPFS_FSCK_BIN)};
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/warpfs-kill9.XXXXXX";
  if (!mkdtemp(dir.data()) || mkdir((dir + "/mnt").c_str(), 0755) != 0) {
    std::fprintf(stderr, "warpfs-kill9: %s: %s\n", dir.c_str(), std::strerror(errno));
    return 2;
  }
  umask(0);  // the daemon applies the caller's umask: the model's modes are the ones asked for
  signal(SIGPIPE, SIG_IGN);
  warpfs::fs::mounted::install_sigbus_guard();
  warpfs::fs::mounted::clean_up_on_termination(dir);
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t passed = 0, failed = 0, in_workload = 0, after = 0, recovery_kills = 0;
  for (uint64_t i = 0; i < cuts * repeat; ++i) {
    const uint64_t s = seed + i / repeat;
    Cut cut(progs, dir, o, s);
    const Report r = cut.run();
    in_workload += r.in_workload;
    after += r.after_workload;
    recovery_kills += r.recovery_kill_us > 0;
    if (r.passed) {
      ++passed;
      if (o.verbose) {
        std::printf(
            "ok seed=%llu -o %s kill at op %llu +%llu us: %llu ops run, killed with %llu "
            "started; states %zu..%zu matched %zu\n",
            static_cast<unsigned long long>(s), r.mount_options.c_str(),
            static_cast<unsigned long long>(r.kill_at_op),
            static_cast<unsigned long long>(r.delay_us), static_cast<unsigned long long>(r.ops_run),
            static_cast<unsigned long long>(r.killed_in), r.lo, r.hi, r.matched);
        for (const std::string& t : r.trace) std::printf("  %s\n", t.c_str());
        std::fflush(stdout);
      }
      continue;
    }
    ++failed;
    std::printf(
        "FAIL seed=%llu (rerun: warpfs-kill9 --seed %llu --cuts 1 --ops %llu --threads %llu "
        "--repeat 20 --verbose) -o %s: %s\n",
        static_cast<unsigned long long>(s), static_cast<unsigned long long>(s),
        static_cast<unsigned long long>(o.ops), static_cast<unsigned long long>(o.threads),
        r.mount_options.c_str(), crash::one_line(r.failure, o.verbose ? 0 : 800).c_str());
    if (!r.kept.empty()) std::printf("  the crashed image: %s\n", r.kept.c_str());
    if (o.verbose) std::printf("%s\n", r.failure.c_str());
    for (const std::string& t : r.trace) std::printf("  %s\n", t.c_str());
    std::fflush(stdout);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "%llu cuts in %.1f s (%llu killed among the operations, %llu drawn after the last, "
      "%llu with the recovery mount killed too)\n",
      static_cast<unsigned long long>(cuts * repeat), secs,
      static_cast<unsigned long long>(in_workload), static_cast<unsigned long long>(after),
      static_cast<unsigned long long>(recovery_kills));
  std::printf("%llu passed, %llu failed\n", static_cast<unsigned long long>(passed),
              static_cast<unsigned long long>(failed));
  rmdir((dir + "/mnt").c_str());
  std::remove((dir + "/img").c_str());
  std::remove((dir + "/daemon.log").c_str());
  rmdir(dir.c_str());
  return failed ? 1 : 0;
}
