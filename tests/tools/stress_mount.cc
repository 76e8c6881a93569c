// warpfs-stress-mount: many processes at once on a real warpfs mount.
//
//   warpfs-stress-mount [--runs N | --seconds T | --soak] [--seed S] [--procs M] [--sharers K]
//                       [--ops N] [--sharer-ops N] [--size SIZE] [--options O] [--keep DIR]
//                       [--verbose]
//
// Each run:
//   1. mkfs.warpfs of a fresh sparse emulated image (--size, default 4G); `warpfs -f` (a
//      child process) mounts it with -o O (default: the daemon's defaults plus a 1 s commit).
//   2. M worker processes, each in a directory /pK of its own, run crash_harness.h's workload
//      as syscalls (tests/tools/syscall_ops.h): creates, pwrite, O_DIRECT and mmap writes and
//      reads, truncates, fallocate in every mode, renames, exchanges, links, unlinks,
//      mkdir/rmdir, xattrs, fsync/fdatasync/syncfs, files held open and unlinked. Each keeps
//      a crash::Model of its subtree; every read must match it.
//   3. K sharer processes (N operations each, or fewer if the workers finish first) work on
//      /shared together: creates, mkdir, unlink, rmdir, renames
//      (plain, noreplace, exchange), links, readdir + lstat of what it lists, and data in
//      whole stamped 4 KiB blocks (sharer j writes only blocks j, j + K, ..., so no two
//      processes write one block) through pwrite, O_DIRECT and mmap, truncates and punches at
//      block boundaries, xattrs, fsync. A call may fail only with the errors its races explain;
//      an O_DIRECT read must find each block zero or stamped for its inode and offset.
//   4. When the workers are done the sharers stop; fusermount3 -u; the daemon must exit 0
//      with nothing in its log that names a problem; fsck.warpfs -f -n must exit 0.
//   5. warpfs mounts the image again; each worker reads its subtree back and must find
//      exactly its model's last state; the parent checks the whole tree's link counts and the
//      shared files' blocks (stamped or zero); unmount; fsck again.
// A failure prints one line naming the seed (which fixes every process's operations; their
// interleaving depends on timing) and the daemon's last log lines; --keep DIR keeps the
// image of a failing run. Ends with "N passed, N failed": exit status 0 if every run passed,
// 1 if any failed, 2 on bad usage. Needs root (or a user allowed to mount FUSE) and
// /dev/fuse. The programs come from the environment (WARPFS, MKFS, FSCK), else the build tree.
#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fs/crash_harness.h"
#include "tools/mount_rig.h"
#include "tools/syscall_ops.h"

#ifndef WARPFS_DAEMON_BIN
#define WARPFS_DAEMON_BIN "warpfs"
#endif
#ifndef WARPFS_MKFS_BIN
#define WARPFS_MKFS_BIN "mkfs.warpfs"
#endif
#ifndef WARPFS_FSCK_BIN
#define WARPFS_FSCK_BIN "fsck.warpfs"
#endif

namespace {

namespace crash = warpfs::fs::crash;
using warpfs::fs::Ino;
using warpfs::fs::mounted::Daemon;
using warpfs::fs::mounted::errno_name;
using warpfs::fs::mounted::last_lines;
using warpfs::fs::mounted::run_program;

constexpr uint64_t kB = 4096;

struct Options {
  uint64_t procs = 8, sharers = 2, ops = 2000;
  uint64_t sharer_ops = 0;  // 0: as many as a worker's
  std::string size = "4G";
  std::string mount_options = "commit=1";
  std::string keep;
  bool verbose = false;
};

struct Programs {
  std::string warpfs, mkfs, fsck;
};

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// --- a child process and its two pipes ------------------------------------------------------

struct Child {
  pid_t pid = -1;
  int to = -1, from = -1;  // parent -> child, child -> parent
};

// A line from fd ("" at end of file).
std::string read_line(int fd) {
  std::string s;
  char c;
  while (::read(fd, &c, 1) == 1) {
    if (c == '\n') return s;
    s += c;
  }
  return s;
}

void write_line(int fd, const std::string& s) {
  const std::string l = s + "\n";
  size_t off = 0;
  while (off < l.size()) {
    const ssize_t n = ::write(fd, l.data() + off, l.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Forks f(to_parent_fd, from_parent_fd); the child _exits with f's status.
template <typename F>
Child fork_child(F f) {
  int down[2], up[2];
  Child c;
  if (pipe2(down, O_CLOEXEC) != 0 || pipe2(up, O_CLOEXEC) != 0) return c;
  c.pid = fork();
  if (c.pid == 0) {
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    close(down[1]);
    close(up[0]);
    _exit(f(up[1], down[0]));
  }
  close(down[0]);
  close(up[1]);
  c.to = down[1];
  c.from = up[0];
  return c;
}

// --- the processes ----------------------------------------------------------------------------

// A worker: its subtree's workload, "done" (or "fail ..."), then on "verify" the subtree
// read back against the model: "ok" or "fail ...".
int worker_main(const std::string& base, Ino root, uint64_t seed, uint64_t ops, int up, int down) {
  crash::Model m(root);
  m.keep_history(false);  // no crash here: only the last state is ever checked
  warpfs::fs::mounted::SyscallRunner runner(base, &m);
  std::mt19937_64 rng(crash::mix(seed));
  for (uint64_t i = 0; i < ops; ++i) {
    const crash::Op op = crash::next_op(m, rng);
    int rc = 0;
    const std::string bad = runner.exec(op, &rc);
    if (!bad.empty() || rc != 0) {
      write_line(up, "fail op " + std::to_string(i) + " (" + op.describe() +
                         "): " + (bad.empty() ? "returned " + errno_name(rc) : bad));
      return 1;
    }
  }
  runner.release_all();
  m.durable(m.current());
  write_line(up, "done");
  if (read_line(down) != "verify") return 0;
  crash::Observed o;
  std::string e = warpfs::fs::mounted::observe(base, warpfs::fs::kRootInode, &o);
  if (e.empty()) e = crash::check(m, m.current(), o);
  write_line(up, e.empty() ? "ok" : "fail after the remount: " + crash::one_line(e, 1500));
  return e.empty() ? 0 : 1;
}

bool raced(int e) {
  switch (e) {
    case ENOENT:
    case EEXIST:
    case ENOTEMPTY:
    case EISDIR:
    case ENOTDIR:
    case EINVAL:
    case EPERM:
    case EMLINK:
      return true;
    default:
      return false;
  }
}

// A sharer: `ops` racing operations on /shared (fewer if its parent writes a line first, or
// goes away), then "ok N" once told to stop.
int sharer_main(const std::string& shared, int index, int sharers, uint64_t seed, uint64_t ops,
                int up, int down) {
  std::mt19937_64 rng(crash::mix(seed));
  auto below = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };
  auto name = [&] {
    std::string d = below(3) == 0 ? "" : "/d" + std::to_string(below(3));
    return shared + d + "/" +
           (below(5) == 0 ? "d" + std::to_string(below(3)) : "s" + std::to_string(below(10)));
  };
  void* raw = nullptr;
  if (posix_memalign(&raw, kB, 8 * kB) != 0) return 1;
  auto* buf = static_cast<uint8_t*>(raw);
  auto fail = [&](const std::string& what, int e) {
    write_line(up, "fail sharer " + std::to_string(index) + ": " + what + ": " + errno_name(e));
    std::free(raw);
    return 1;
  };
  uint64_t n_ops = 0;
  for (; n_ops < ops; ++n_ops) {
    pollfd p{down, POLLIN, 0};
    if (poll(&p, 1, 0) != 0) break;  // told to stop, or the parent is gone
    const uint64_t r = below(100);
    const std::string a = name(), b = name();
    if (r < 12) {
      const bool dir = a[a.rfind('/') + 1] == 'd';
      int rc = dir ? mkdir(a.c_str(), 0755) : 0;
      if (!dir) {
        const int fd = open(a.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
        rc = fd < 0 ? -1 : 0;
        if (fd >= 0) close(fd);
      }
      if (rc != 0 && !raced(errno)) return fail("create " + a, errno);
    } else if (r < 22) {
      if ((below(3) == 0 ? rmdir(a.c_str()) : unlink(a.c_str())) != 0 && !raced(errno))
        return fail("unlink/rmdir " + a, errno);
    } else if (r < 34) {
      const unsigned flags = below(4) == 0 ? RENAME_EXCHANGE : below(4) == 0 ? RENAME_NOREPLACE : 0;
      if (renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), flags) != 0 && !raced(errno))
        return fail("rename " + a + " " + b, errno);
    } else if (r < 40) {
      if (link(a.c_str(), b.c_str()) != 0 && !raced(errno))
        return fail("link " + a + " " + b, errno);
    } else if (r < 85) {
      const int fd = open(a.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) {
        if (!raced(errno)) return fail("open " + a, errno);
        continue;
      }
      struct stat st;
      if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        continue;
      }
      const Ino ino = st.st_ino;
      const uint64_t what = below(12);
      const uint64_t blk =
          below(16) * static_cast<uint64_t>(sharers) + static_cast<uint64_t>(index);
      int rc = 0;
      std::string op;
      if (what < 3) {  // a stamped block: pwrite, or O_DIRECT
        op = "write";
        crash::stamp_block(buf, ino, blk, rng());
        int wfd = fd;
        if (what == 2) {
          op = "O_DIRECT write";
          wfd = open(("/proc/self/fd/" + std::to_string(fd)).c_str(),
                     O_WRONLY | O_DIRECT | O_CLOEXEC);
        }
        if (wfd < 0 ||
            pwrite(wfd, buf, kB, static_cast<off_t>(blk * kB)) != static_cast<ssize_t>(kB))
          rc = errno;
        if (wfd >= 0 && wfd != fd) close(wfd);
      } else if (what == 3) {  // a stamped block through a shared mapping, within the size
        op = "mmap write";
        if ((blk + 1) * kB <= static_cast<uint64_t>(st.st_size)) {
          void* m = mmap(nullptr, kB, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                         static_cast<off_t>(blk * kB));
          if (m == MAP_FAILED) {
            rc = errno;
          } else {
            crash::stamp_block(buf, ino, blk, rng());
            // A concurrent truncate may take the page away (SIGBUS, caught): a legitimate race.
            if (warpfs::fs::mounted::guarded_memcpy(m, buf, kB) && msync(m, kB, MS_SYNC) != 0)
              rc = errno;
            munmap(m, kB);
          }
        }
      } else if (what < 6) {  // O_DIRECT read of any blocks: stamped or zero, never torn
        op = "O_DIRECT read";
        const uint64_t first = below(48), nb = 1 + below(8);
        const int rfd =
            open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
        const ssize_t got = rfd < 0 ? -1 : pread(rfd, buf, nb * kB, static_cast<off_t>(first * kB));
        if (got < 0) {
          rc = errno;
        } else {
          for (uint64_t i = 0; i * kB < static_cast<uint64_t>(got); ++i) {
            if (std::string e = crash::check_stamped_block(buf + i * kB, ino, first + i);
                !e.empty()) {
              if (rfd >= 0) close(rfd);
              close(fd);
              write_line(up, "fail sharer " + std::to_string(index) + ": O_DIRECT read of " + a +
                                 ": " + e);
              std::free(raw);
              return 1;
            }
          }
        }
        if (rfd >= 0) close(rfd);
      } else if (what < 8) {  // buffered and mapped reads (not checked: they may see a page
                              // another process is writing)
        op = "read";
        if (pread(fd, buf, 8 * kB, static_cast<off_t>(below(48) * kB)) < 0) rc = errno;
        if (rc == 0 && st.st_size >= static_cast<off_t>(kB)) {
          void* m = mmap(nullptr, kB, PROT_READ, MAP_SHARED, fd, 0);
          if (m != MAP_FAILED) {
            (void)warpfs::fs::mounted::guarded_memcpy(buf, m, kB);
            munmap(m, kB);
          }
        }
      } else if (what == 8) {
        op = "ftruncate";
        if (ftruncate(fd, static_cast<off_t>(below(64) * kB)) != 0) rc = errno;
      } else if (what == 9) {
        op = "fallocate";
        const int mode = below(2) ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE : 0;
        if (fallocate(fd, mode, static_cast<off_t>(below(48) * kB),
                      static_cast<off_t>((1 + below(8)) * kB)) != 0)
          rc = errno;
      } else if (what == 10) {
        op = "setxattr";
        const std::string v(below(200), 'v');
        if (fsetxattr(fd, ("user.s" + std::to_string(below(3))).c_str(), v.data(), v.size(), 0) !=
            0)
          rc = errno;
      } else {
        op = "fsync";
        if (fsync(fd) != 0) rc = errno;
      }
      close(fd);
      if (rc != 0) return fail(op + " of " + a, rc);
    } else if (r < 97) {
      const std::string d = below(2) ? shared : shared + "/d" + std::to_string(below(3));
      DIR* dir = opendir(d.c_str());
      if (!dir) {
        if (!raced(errno)) return fail("opendir " + d, errno);
        continue;
      }
      std::vector<std::string> names;
      errno = 0;
      while (const dirent* e = readdir(dir)) names.push_back(e->d_name);
      const int e = errno;
      closedir(dir);
      if (e) return fail("readdir " + d, e);
      for (const std::string& nm : names) {
        struct stat st;
        if (lstat((d + "/" + nm).c_str(), &st) != 0 && !raced(errno))
          return fail("lstat " + nm, errno);
      }
    } else {
      struct statvfs sv;
      if (statvfs(shared.c_str(), &sv) != 0) return fail("statvfs", errno);
    }
  }
  std::free(raw);
  (void)read_line(down);  // done: wait to be told to stop
  write_line(up, "ok " + std::to_string(n_ops));
  return 0;
}

// --- the parent's checks --------------------------------------------------------------------

// Link counts against names over the whole tree, and /shared's blocks.
std::string check_tree(const std::string& mnt) {
  crash::Observed o;
  if (std::string e = warpfs::fs::mounted::observe(mnt, &o); !e.empty())
    return "reading the tree: " + e;
  struct stat st;
  if (lstat((mnt + "/shared").c_str(), &st) != 0) return "/shared: " + errno_name(errno);
  return crash::check_invariants(o, st.st_ino);
}

// Lines of the daemon's log that name a problem.
std::string log_problems(const std::string& log) {
  std::string out;
  size_t pos = 0;
  while (pos < log.size()) {
    size_t e = log.find('\n', pos);
    if (e == std::string::npos) e = log.size();
    const std::string line = log.substr(pos, e - pos);
    for (const char* w :
         {"fsck", "failed", "error", "read-only", "Sanitizer", "corrupt", "mismatch"}) {
      if (line.find(w) != std::string::npos) {
        out += line + "\n";
        break;
      }
    }
    pos = e + 1;
  }
  return out;
}

struct RunReport {
  bool passed = false;
  std::string failure;
  uint64_t sharer_ops = 0;
};

class Run {
 public:
  Run(const Programs& p, const std::string& dir, const Options& o, uint64_t seed)
      : progs_(p), dir_(dir), img_(dir + "/img"), o_(o), seed_(seed), daemon_(p.warpfs, dir) {}
  RunReport go();

 private:
  std::string fsck(const char* when) {
    std::string out;
    const int rc = run_program({progs_.fsck, "-f", "-n", "emu:" + img_}, &out);
    return rc == 0 ? ""
                   : std::string("fsck.warpfs -f -n ") + when + ": exit " + std::to_string(rc) +
                         "\n" + out;
  }
  std::string unmount(const char* when) {
    if (std::string e = daemon_.unmount(); !e.empty())
      return std::string("unmount ") + when + ": " + e;
    if (std::string p = log_problems(daemon_.log()); !p.empty())
      return std::string("the daemon logged ") + when + ":\n" + p;
    return "";
  }
  void stop_all(std::vector<Child>& cs) {
    for (Child& c : cs) {
      if (c.pid > 0) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, nullptr, 0);
        c.pid = -1;
      }
      if (c.to >= 0) close(c.to);
      if (c.from >= 0) close(c.from);
      c.to = c.from = -1;
    }
  }

  const Programs& progs_;
  const std::string dir_, img_;
  const Options& o_;
  const uint64_t seed_;
  Daemon daemon_;
};

RunReport Run::go() {
  RunReport r;
  std::string out;
  std::remove(img_.c_str());
  if (int rc = run_program({progs_.mkfs, "-q", "--force", "--size", o_.size, "emu:" + img_}, &out);
      rc) {
    r.failure = "mkfs.warpfs: exit " + std::to_string(rc) + ": " + out;
    return r;
  }
  if (std::string e = daemon_.start(o_.mount_options); !e.empty()) {
    r.failure = "mount: " + e;
    return r;
  }
  const std::string mnt = daemon_.mnt();
  std::vector<Ino> roots;
  for (uint64_t k = 0; k < o_.procs; ++k) {
    const std::string d = mnt + "/p" + std::to_string(k);
    struct stat st;
    if (mkdir(d.c_str(), 0755) != 0 || lstat(d.c_str(), &st) != 0) {
      r.failure = "mkdir " + d + ": " + errno_name(errno);
      return r;
    }
    roots.push_back(st.st_ino);
  }
  if (mkdir((mnt + "/shared").c_str(), 0755) != 0) {
    r.failure = "mkdir /shared: " + errno_name(errno);
    return r;
  }
  std::vector<Child> workers, sharers;
  for (uint64_t k = 0; k < o_.procs; ++k) {
    const std::string base = mnt + "/p" + std::to_string(k);
    const uint64_t s = seed_ * 1000 + k;
    const Ino root = roots[k];
    const uint64_t ops = o_.ops;
    workers.push_back(fork_child([&, base, s, root, ops](int up, int down) {
      return worker_main(base, root, s, ops, up, down);
    }));
  }
  for (uint64_t k = 0; k < o_.sharers; ++k) {
    const uint64_t s = seed_ * 1000 + 500 + k;
    const int idx = static_cast<int>(k), n = static_cast<int>(o_.sharers);
    const uint64_t ops = o_.sharer_ops ? o_.sharer_ops : o_.ops;
    sharers.push_back(fork_child([&, s, idx, n, ops](int up, int down) {
      return sharer_main(mnt + "/shared", idx, n, s, ops, up, down);
    }));
  }
  auto finish = [&](const std::string& failure) {
    stop_all(workers);
    stop_all(sharers);
    r.failure = failure;
    if (!failure.empty()) {
      r.failure += "\nthe daemon's log: " + last_lines(daemon_.log(), 10);
      if (!o_.keep.empty()) {
        const std::string kept = o_.keep + "/stress-mount-seed-" + std::to_string(seed_) + ".img";
        daemon_.abandon();
        if (run_program({"cp", "--sparse=always", img_, kept}, &out) == 0)
          r.failure += "\nimage kept: " + kept;
      }
    }
    return r;
  };
  // How a child that said nothing ended.
  auto died = [](Child& c) {
    int st = 0;
    if (waitpid(c.pid, &st, 0) != c.pid) return std::string("died");
    c.pid = -1;
    return WIFSIGNALED(st) ? "died of signal " + std::to_string(WTERMSIG(st))
                           : "exited with status " + std::to_string(WEXITSTATUS(st));
  };
  std::string failure;
  for (size_t k = 0; k < workers.size(); ++k) {
    const std::string line = read_line(workers[k].from);
    if (line != "done" && failure.empty())
      failure = "worker " + std::to_string(k) + ": " + (line.empty() ? died(workers[k]) : line);
  }
  for (Child& c : sharers) write_line(c.to, "stop");
  for (size_t k = 0; k < sharers.size(); ++k) {
    const std::string line = read_line(sharers[k].from);
    if (line.rfind("ok ", 0) == 0) {
      r.sharer_ops += std::strtoull(line.c_str() + 3, nullptr, 10);
    } else if (failure.empty()) {
      failure = line.empty() ? "sharer " + std::to_string(k) + " " + died(sharers[k]) : line;
    }
    if (sharers[k].pid > 0) waitpid(sharers[k].pid, nullptr, 0);
    sharers[k].pid = -1;
  }
  if (!failure.empty()) return finish(failure);
  if (std::string e = unmount("at the end"); !e.empty()) return finish(e);
  if (std::string e = fsck("after the unmount"); !e.empty()) return finish(e);
  if (std::string e = daemon_.start(o_.mount_options); !e.empty()) return finish("remount: " + e);
  for (Child& c : workers) write_line(c.to, "verify");
  for (size_t k = 0; k < workers.size(); ++k) {
    const std::string line = read_line(workers[k].from);
    if (line != "ok" && failure.empty())
      failure = "worker " + std::to_string(k) + ": " + (line.empty() ? died(workers[k]) : line);
    if (workers[k].pid > 0) waitpid(workers[k].pid, nullptr, 0);
    workers[k].pid = -1;
  }
  if (!failure.empty()) return finish(failure);
  if (std::string e = check_tree(mnt); !e.empty()) return finish("after the remount: " + e);
  if (std::string e = unmount("after the remount"); !e.empty()) return finish(e);
  if (std::string e = fsck("at last"); !e.empty()) return finish(e);
  finish("");
  r.passed = true;
  return r;
}

int usage() {
  std::fprintf(
      stderr,
      "usage: warpfs-stress-mount [--runs N | --seconds T | --soak] [--seed S] [--procs M] "
      "[--sharers K] [--ops N] [--sharer-ops N] [--size SIZE] [--options O] [--keep DIR] "
      "[--verbose]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t runs = 1, seed = 1, seconds = 0;
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--soak") {  // for hours: seeds one after another, a line each, until interrupted
      seconds = 365ull * 24 * 3600;
      o.verbose = true;
    } else if (a == "--verbose" || a == "-v") {
      o.verbose = true;
    } else if (a == "--keep" && i + 1 < argc) {
      o.keep = argv[++i];
    } else if (a == "--size" && i + 1 < argc) {
      o.size = argv[++i];
    } else if (a == "--options" && i + 1 < argc) {
      o.mount_options = argv[++i];
    } else if ((a == "--runs" || a == "--seed" || a == "--seconds" || a == "--procs" ||
                a == "--sharers" || a == "--ops" || a == "--sharer-ops") &&
               i + 1 < argc) {
      uint64_t v;
      if (!crash::parse_number(argv[++i], &v)) return usage();
      (a == "--runs"         ? runs
       : a == "--seed"       ? seed
       : a == "--seconds"    ? seconds
       : a == "--procs"      ? o.procs
       : a == "--sharers"    ? o.sharers
       : a == "--sharer-ops" ? o.sharer_ops
                             : o.ops) = v;
    } else {
      return usage();
    }
  }
  if (o.procs == 0 || o.procs > 64 || o.sharers > 64 || o.ops == 0) return usage();
  const Programs progs{env_or("WARPFS", WARPFS_DAEMON_BIN), env_or("MKFS", WARPFS_MKFS_BIN),
                       env_or("FSCK", WARPFS_FSCK_BIN)};
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/warpfs-stress-mount.XXXXXX";
  if (!mkdtemp(dir.data()) || mkdir((dir + "/mnt").c_str(), 0755) != 0) {
    std::fprintf(stderr, "warpfs-stress-mount: %s: %s\n", dir.c_str(), std::strerror(errno));
    return 2;
  }
  umask(0);  // the model's modes are the ones asked for
  signal(SIGPIPE, SIG_IGN);
  warpfs::fs::mounted::install_sigbus_guard();
  warpfs::fs::mounted::clean_up_on_termination(dir);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  uint64_t passed = 0, failed = 0, sharer_ops = 0;
  for (uint64_t i = 0; seconds ? elapsed() < static_cast<double>(seconds) : i < runs; ++i) {
    const uint64_t s = seed + i;
    Run run(progs, dir, o, s);
    const RunReport r = run.go();
    sharer_ops += r.sharer_ops;
    if (r.passed) {
      ++passed;
      if (o.verbose) {
        std::printf("ok seed=%llu (%.0f s so far)\n", static_cast<unsigned long long>(s),
                    elapsed());
        std::fflush(stdout);
      }
      continue;
    }
    ++failed;
    std::printf(
        "FAIL seed=%llu (rerun: warpfs-stress-mount --seed %llu --runs 10 --procs %llu --sharers "
        "%llu --ops %llu --options %s): %s\n",
        static_cast<unsigned long long>(s), static_cast<unsigned long long>(s),
        static_cast<unsigned long long>(o.procs), static_cast<unsigned long long>(o.sharers),
        static_cast<unsigned long long>(o.ops), o.mount_options.c_str(),
        crash::one_line(r.failure, o.verbose ? 0 : 2000).c_str());
    std::fflush(stdout);
  }
  std::printf(
      "%llu runs of %llu processes x %llu operations and %llu sharers (%llu sharer operations) in "
      "%.1f s\n",
      static_cast<unsigned long long>(passed + failed), static_cast<unsigned long long>(o.procs),
      static_cast<unsigned long long>(o.ops), static_cast<unsigned long long>(o.sharers),
      static_cast<unsigned long long>(sharer_ops), elapsed());
  std::printf("%llu passed, %llu failed\n", static_cast<unsigned long long>(passed),
              static_cast<unsigned long long>(failed));
  rmdir((dir + "/mnt").c_str());
  std::remove((dir + "/img").c_str());
  std::remove((dir + "/daemon.log").c_str());
  rmdir(dir.c_str());
  return failed ? 1 : 0;
}
