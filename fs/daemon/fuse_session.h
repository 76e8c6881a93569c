// What the warpfs daemon (warpfs_main.cc) and warpfs-null (bench/null_fs.cc, the FUSE
// transport's ceiling in `bench/run fs`) negotiate with the kernel and how they run libfuse's
// session loop: one definition, so that the null daemon measures warpfs's transport. The
// includer defines FUSE_USE_VERSION (312) before including this header.
#pragma once

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "fuse_uring.h"
#include "reader_gate.h"
#include "worker_fds.h"
#include "worker_threads.h"

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
  // Every reply goes through the session's writev then (libfuse splices a reply to the
  // descriptor, past it, only with this): FUSE over io_uring answers through that writev.
  conn->want &= ~FUSE_CAP_SPLICE_WRITE;
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

// Whether the kernel takes FOPEN_PARALLEL_DIRECT_WRITES (FUSE 7.38, Linux 6.2): from the init
// handler.
inline bool takes_parallel_direct_writes(const fuse_conn_info* conn) {
  return conn->proto_major > 7 || conn->proto_minor >= 38;
}

// The open's reply (struct fuse_open_out) as libfuse's fill_open makes it, plus
// FOPEN_PARALLEL_DIRECT_WRITES on an FOPEN_DIRECT_IO open where the kernel knows the flag
// (libfuse 3.14's fuse_file_info has no bit for it). Without it the kernel holds the inode
// lock exclusive across each synchronous direct write of the file, so writers of different
// blocks of one file (a database's threads, fio's pwrite jobs) reach the daemon one at a
// time; with it they come in parallel under the lock shared. The kernel still takes it
// exclusive for an O_APPEND write, a write past the end of the file, and while another open
// of the inode uses the page cache (fuse_dio_wr_exclusive_lock), so the core serialises
// what changes the size as before; writes to allocated blocks take its shared fast path
// (FsImpl::overwrite) side by side. `parallel_direct_writes`: takes_parallel_direct_writes().
inline fuse_open_out open_out(const fuse_file_info* fi, bool parallel_direct_writes) {
  fuse_open_out o{};
  o.fh = fi->fh;
  if (fi->direct_io) o.open_flags |= FOPEN_DIRECT_IO;
  if (fi->keep_cache) o.open_flags |= FOPEN_KEEP_CACHE;
  if (fi->nonseekable) o.open_flags |= FOPEN_NONSEEKABLE;
  if (fi->cache_readdir) o.open_flags |= FOPEN_CACHE_DIR;
  if (fi->noflush) o.open_flags |= FOPEN_NOFLUSH;
  if (fi->direct_io && parallel_direct_writes) o.open_flags |= FOPEN_PARALLEL_DIRECT_WRITES;
  return o;
}

// fuse_reply_open with open_out's flags. Returns what fuse_reply_open would: -ENOENT when the
// request was interrupted.
inline int reply_open(fuse_req_t req, const fuse_file_info* fi, bool parallel_direct_writes) {
  const fuse_open_out o = open_out(fi, parallel_direct_writes);
  // fuse_reply_buf sends without allocating (fuse_reply_iov allocates, and a failure there
  // would answer ENOMEM yet return 0: the open's reference would never be released).
  return fuse_reply_buf(req, reinterpret_cast<const char*>(&o), sizeof o);
}

// fuse_reply_create with open_out's flags: struct fuse_entry_out then struct fuse_open_out,
// the entry as libfuse's fill_entry and convert_stat make it (a kernel of FUSE 7.9 or later:
// libfuse 3 speaks no older one).
inline int reply_create(fuse_req_t req, const fuse_entry_param& e, const fuse_file_info* fi,
                        bool parallel_direct_writes) {
  struct {
    fuse_entry_out entry;
    fuse_open_out open;
  } out{};
  static_assert(sizeof out == sizeof(fuse_entry_out) + sizeof(fuse_open_out), "no padding");
  // libfuse's calc_timeout_sec and calc_timeout_nsec.
  auto secs = [](double t) -> uint64_t {
    return t <= 0 ? 0 : t >= 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(t);
  };
  auto nsecs = [&](double t) -> uint32_t {
    const double f = t - static_cast<double>(secs(t));
    return f <= 0 ? 0 : f >= 0.999999999 ? 999999999u : static_cast<uint32_t>(f * 1e9);
  };
  out.entry.nodeid = e.ino;
  out.entry.generation = e.generation;
  out.entry.entry_valid = secs(e.entry_timeout);
  out.entry.entry_valid_nsec = nsecs(e.entry_timeout);
  out.entry.attr_valid = secs(e.attr_timeout);
  out.entry.attr_valid_nsec = nsecs(e.attr_timeout);
  fuse_attr& a = out.entry.attr;
  const struct stat& st = e.attr;
  a.ino = st.st_ino;
  a.mode = st.st_mode;
  a.nlink = static_cast<uint32_t>(st.st_nlink);
  a.uid = st.st_uid;
  a.gid = st.st_gid;
  a.rdev = static_cast<uint32_t>(st.st_rdev);
  a.size = static_cast<uint64_t>(st.st_size);
  a.blksize = static_cast<uint32_t>(st.st_blksize);
  a.blocks = static_cast<uint64_t>(st.st_blocks);
  a.atime = static_cast<uint64_t>(st.st_atim.tv_sec);
  a.mtime = static_cast<uint64_t>(st.st_mtim.tv_sec);
  a.ctime = static_cast<uint64_t>(st.st_ctim.tv_sec);
  a.atimensec = static_cast<uint32_t>(st.st_atim.tv_nsec);
  a.mtimensec = static_cast<uint32_t>(st.st_mtim.tv_nsec);
  a.ctimensec = static_cast<uint32_t>(st.st_ctim.tv_nsec);
  out.open = open_out(fi, parallel_direct_writes);
  return fuse_reply_buf(req, reinterpret_cast<const char*>(&out), sizeof out);
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

// The bytes libfuse reads from /dev/fuse at once (libfuse 3.14's session bufsize: 256 pages
// and a page for the header), and one page more. A request is never longer than max_write
// (kMaxWrite) and its header, whatever the read asks for.
inline size_t receive_bytes() {
  const long page = sysconf(_SC_PAGESIZE);
  return (256 + 2) * static_cast<size_t>(page > 0 ? page : 4096);
}

// Reads the kernel's first request, FUSE_INIT, and has libfuse answer it, adding
// FUSE_HANDLE_KILLPRIV_V2 (FUSE 7.33) to the reply where the kernel offers it and the
// writeback cache is off. libfuse 3.14 cannot ask for it (and, whatever its defaults say,
// never passes FUSE_HANDLE_KILLPRIV or FUSE_PARALLEL_DIROPS on either). Without it the
// kernel keeps no "nothing to drop" mark on a FUSE inode (the superblock lacks SB_NOSEC),
// so before every buffered write(2) it asks the daemon for security.capability: a GETXATTR
// round trip per write, as many as the WRITEs themselves. With it the kernel marks an inode
// once it has found neither set-user-ID, set-group-ID nor a capability (S_NOSEC), and
// unmarks it at a chmod to such a mode and at any security.* setxattr; it still removes a
// capability it finds itself (removexattr). What it leaves to the daemon, the core does:
// drop set-user-ID, set-group-ID (with group execute) and security.capability at every write
// whoever the caller (FUSE_WRITE_KILL_SUIDGID, which would spare a caller with CAP_FSETID,
// does not reach it through libfuse; the kernel's own rule differs there only for such a
// caller); both bits at a chown of a non-directory and at an O_TRUNC open; and at a
// truncate whose caller lacks CAP_FSETID, which the kernel says with FATTR_KILL_SUIDGID
// (SetAttr::kill_suidgid). libfuse writes its reply to the session's file descriptor; for
// this one reply that descriptor is a pipe, and what comes out of the pipe goes on to
// /dev/fuse, patched. Runs before any worker exists, so nothing else reads or writes the
// descriptor meanwhile; no other thread may send a notification (fuse_lowlevel_notify_*)
// before the session loop starts either: it would land in the pipe, joined to the reply.
// `want_uring` (-o io_uring): also add FUSE_OVER_IO_URING where the kernel offers it (it does
// when the fuse module's enable_uring is on), and say in `*uring` what came of it.
// Returns 0 (INIT answered, or the session ended first), the negative error of a failed
// read or write, or that of libfuse's refusal of the INIT.
enum class UringGrant {
  kNotAsked,
  kNotOffered,   // the kernel does not offer it (CONFIG_FUSE_IO_URING, enable_uring)
  kNotAnswered,  // offered, but the INIT reply could not take it (no pipe, an error reply)
  kGranted,
};
inline int answer_init(fuse_session* se, bool want_uring = false, UringGrant* uring = nullptr) {
  UringGrant grant = want_uring ? UringGrant::kNotAnswered : UringGrant::kNotAsked;
  struct Tell {  // *uring = grant on every return
    UringGrant* out;
    const UringGrant& g;
    ~Tell() {
      if (out != nullptr) *out = g;
    }
  } tell{uring, grant};
  std::vector<char> mem(receive_bytes());
  fuse_buf buf{};
  int res;
  do {
    buf = fuse_buf{};
    buf.mem = mem.data();
    buf.size = mem.size();
    res = fuse_session_receive_buf(se, &buf);
  } while (res == -EINTR && !fuse_session_exited(se));
  if (res <= 0) return res == -EINTR ? 0 : res;
  fuse_in_header in{};
  fuse_init_in init{};
  if (static_cast<size_t>(res) >= sizeof in + offsetof(fuse_init_in, flags2)) {
    std::memcpy(&in, mem.data(), sizeof in);
    std::memcpy(&init, mem.data() + sizeof in, offsetof(fuse_init_in, flags2));
  }
  if (static_cast<size_t>(res) >= sizeof in + offsetof(fuse_init_in, flags2) + sizeof(uint32_t) &&
      (init.flags & FUSE_INIT_EXT)) {
    std::memcpy(&init.flags2, mem.data() + sizeof in + offsetof(fuse_init_in, flags2),
                sizeof init.flags2);
  }
  const bool offer_uring = want_uring && (init.flags2 & (kFuseOverIoUring >> 32));
  if (want_uring && !offer_uring && in.opcode == FUSE_INIT) grant = UringGrant::kNotOffered;
  const int fd = fuse_session_fd(se);
  int device = -1, pipefd[2] = {-1, -1};
  const int fd_flags = fcntl(fd, F_GETFD);
  bool redirected = in.opcode == FUSE_INIT &&
                    ((init.flags & FUSE_HANDLE_KILLPRIV_V2) || offer_uring) && fd_flags >= 0 &&
                    pipe2(pipefd, O_CLOEXEC) == 0;
  if (redirected) {
    device = fcntl(fd, F_DUPFD_CLOEXEC, 0);  // /dev/fuse stays open here meanwhile
    redirected = device >= 0 && dup2(pipefd[1], fd) == fd;
  }
  fuse_session_process_buf(se, &buf);
  if (!redirected) {
    if (device >= 0) close(device);
    if (pipefd[0] >= 0) close(pipefd[0]), close(pipefd[1]);
    return 0;
  }
  int rc = 0;
  if (dup2(device, fd) != fd) {
    rc = -errno;
  } else {
    (void)fcntl(fd, F_SETFD, fd_flags);  // close-on-exec as it was; not worth failing for
  }
  close(device);
  close(pipefd[1]);
  char reply[512];
  const ssize_t n = rc == 0 ? read(pipefd[0], reply, sizeof reply) : -1;
  close(pipefd[0]);
  if (rc != 0) return rc;
  if (n < static_cast<ssize_t>(sizeof(fuse_out_header))) return -EIO;
  fuse_out_header out;
  std::memcpy(&out, reply, sizeof out);
  const size_t flags_at = sizeof out + offsetof(fuse_init_out, flags);
  const size_t flags2_at = sizeof out + offsetof(fuse_init_out, flags2);
  bool uring_added = false;
  if (out.error == 0 && static_cast<size_t>(n) >= flags_at + sizeof(uint32_t)) {
    uint32_t flags;
    std::memcpy(&flags, reply + flags_at, sizeof flags);
    if (!(flags & FUSE_WRITEBACK_CACHE) && (init.flags & FUSE_HANDLE_KILLPRIV_V2)) {
      flags |= FUSE_HANDLE_KILLPRIV_V2;
    }
    uring_added = offer_uring && static_cast<size_t>(n) >= flags2_at + sizeof(uint32_t);
    if (uring_added) {
      uint32_t flags2;
      std::memcpy(&flags2, reply + flags2_at, sizeof flags2);
      flags2 |= static_cast<uint32_t>(kFuseOverIoUring >> 32);
      std::memcpy(reply + flags2_at, &flags2, sizeof flags2);
      flags |= FUSE_INIT_EXT;  // flags2 counts only with it
    }
    std::memcpy(reply + flags_at, &flags, sizeof flags);
  }
  const ssize_t w = write(fd, reply, static_cast<size_t>(n));
  if (w != n) return w < 0 ? -errno : -EIO;
  if (uring_added) grant = UringGrant::kGranted;
  return out.error;  // libfuse refused the kernel (e.g. its protocol version): the loop ends
}

// -o io_uring, io_uring_depth=N and io_uring_cpu, as both daemons take them (uring_opts).
struct UringOptions {
  int on = 0;          // io_uring: ask for FUSE over io_uring
  unsigned depth = 0;  // io_uring_depth: threads (one ring entry each) a queue; 0: the default
  int pin = 0;         // io_uring_cpu: a queue's threads run on that queue's CPU only
};
// fuse_opt entries for them, into the member `uring` of the options struct T.
#define WARPFS_URING_OPTS(T)                                                             \
  {"io_uring", offsetof(T, uring.on), 1}, {"io_uring_cpu", offsetof(T, uring.pin), 1}, { \
    "io_uring_depth=%u", offsetof(T, uring.depth), 0                                     \
  }

// Each SessionLoop worker's own /dev/fuse descriptor, and the custom I/O hooks that read from
// it and route every reply to the descriptor its request came from (worker_fds.h says why and
// how). One session a process uses them: the hooks are libfuse's session-wide callbacks,
// with nothing of ours passed to them, so the table is this process's.
class OwnDescriptors {
 public:
  // Routes the session's reads and replies through the hooks. Before INIT (answer_init
  // reads and answers it through them). Returns 0 or libfuse's negative error.
  static int install(fuse_session* se) {
    static const fuse_custom_io io = {&OwnDescriptors::writev, &OwnDescriptors::read, nullptr,
                                      nullptr};
    return fuse_session_custom_io(se, &io, fuse_session_fd(se));
  }
  // Gives the calling worker a descriptor of its own, cloned from the session's
  // (FUSE_DEV_IOC_CLONE, Linux 4.5), from which its reads come from now on. Fails (the worker
  // reads the session's descriptor, and nothing else changes) where /dev/fuse cannot be
  // opened or cloned here. Returns 0 or the errno of the failure.
  static int adopt(int session_fd) {
    const int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0) return errno;
    uint32_t master = static_cast<uint32_t>(session_fd);
    if (ioctl(fd, FUSE_DEV_IOC_CLONE, &master) != 0) {
      const int err = errno;
      close(fd);
      return err;
    }
    table().add(fd);
    mine() = fd;
    return 0;
  }
  // For the daemon's statistics: workers reading a descriptor of their own, and replies the
  // table sent to the wrong one first (WorkerFds::rerouted).
  static size_t descriptors() { return table().size(); }
  static uint64_t rerouted() { return table().rerouted.load(std::memory_order_relaxed); }

 private:
  static WorkerFds& table() {
    static WorkerFds* t = new WorkerFds;  // never freed: replies may come until the exit
    return *t;
  }
  static int& mine() {  // this thread's descriptor, or -1: the session's
    static thread_local int fd = -1;
    return fd;
  }
  static ssize_t read(int fd, void* buf, size_t len, void*) {
    const int from = mine() >= 0 ? mine() : fd;
    const ssize_t n = ::read(from, buf, len);
    if (n >= static_cast<ssize_t>(sizeof(fuse_in_header))) {
      uint64_t unique;
      std::memcpy(&unique, static_cast<const char*>(buf) + offsetof(fuse_in_header, unique),
                  sizeof unique);
      table().note(unique, from);
    }
    return n;  // errno as ::read left it
  }
  // A reply (libfuse's [fuse_out_header, arguments...]) to its request's descriptor; a
  // notification (unique 0) to the session's, as any of the connection's would do.
  static ssize_t writev(int fd, iovec* iov, int count, void*) {
    uint64_t unique = 0;
    if (count >= 1 && iov[0].iov_len >= sizeof(fuse_out_header)) {
      std::memcpy(&unique,
                  static_cast<const char*>(iov[0].iov_base) + offsetof(fuse_out_header, unique),
                  sizeof unique);
    }
    const int to = unique != 0 ? table().find(unique) : -1;
    const int tried = to >= 0 ? to : fd;
    ssize_t n = ::writev(tried, iov, count);
    if (n >= 0 || errno != ENOENT || unique == 0) return n;
    // Not a request of that descriptor (a slot another request took since), or one the
    // kernel has ended: try the others. ENOENT from all of them is the kernel's answer.
    auto take = [&](int f) {
      if (f == tried) return false;
      n = ::writev(f, iov, count);
      return n >= 0 || errno != ENOENT;
    };
    if (take(fd) || table().any(take)) {
      if (n >= 0) table().rerouted.fetch_add(1, std::memory_order_relaxed);
      return n;
    }
    errno = ENOENT;
    return -1;
  }
};

// The multithreaded session loop with the receive buffers from `mem` (libfuse's own loop
// allocates its own). As in libfuse's loop: one worker to begin with, and another (up to
// `threads`) whenever a worker takes a request while no other is waiting for one, so a
// light load keeps few threads and their buffers warm; workers stay until the loop ends.
// Unlike libfuse's loop, on 8 CPUs or more not every idle worker waits in the kernel: a
// ReaderGate (reader_gate.h) parks those the recent load did not need, so that a light load
// after a burst is served by warm threads, not by the one idle longest. A worker reads and
// processes requests until the session has exited (unmount, or a signal handler's
// fuse_session_exit); the calling thread waits for the first worker to finish, then cancels the
// rest, which take cancellation only while they wait for a request or are parked. Unless
// `shared_fd`, each worker reads from a /dev/fuse descriptor of its own (OwnDescriptors,
// worker_fds.h; not with io_uring, where /dev/fuse carries only INIT, FORGET and INTERRUPT).
// Returns 0, or the negative error of a failed read (INIT's write too: answer_init), or
// -ENOMEM (no first worker).
class SessionLoop {
 public:
  // `uring`: whether and how to ask for FUSE over io_uring (fuse_uring.h); its threads are
  // `threads` spread over the kernel's queues, at least 4 a queue, unless uring.depth says.
  SessionLoop(fuse_session* se, unsigned threads, const ReceiveMemory& mem,
              const UringOptions& uring = {}, bool shared_fd = false)
      : se_(se),
        threads_(threads > 0 ? threads : 1),
        mem_(mem),
        uring_(uring),
        own_fds_(!shared_fd && !uring.on),
        workers_(threads_) {}

  int run() {
    if (sem_init(&finish_, 0, 0) != 0) return -errno;
    std::unique_ptr<RingTransport> ring;
    if (uring_.on) ring = make_ring();
    if (own_fds_) {
      if (const int err = OwnDescriptors::install(se_); err != 0) {
        fuse_log(FUSE_LOG_ERR, "per-worker descriptors: %s: the workers share one\n",
                 std::strerror(-err));
        own_fds_ = false;
      }
    }
    UringGrant grant = UringGrant::kNotAsked;
    int rc = answer_init(se_, ring != nullptr, &grant);
    if (rc >= 0 && ring != nullptr && !fuse_session_exited(se_)) {
      if (grant == UringGrant::kNotOffered) {
        fuse_log(FUSE_LOG_ERR,
                 "io_uring: the kernel does not offer FUSE over io_uring (it needs "
                 "CONFIG_FUSE_IO_URING and /sys/module/fuse/parameters/enable_uring on): "
                 "requests stay on /dev/fuse\n");
        ring.reset();
      } else if (grant != UringGrant::kGranted) {
        fuse_log(FUSE_LOG_ERR,
                 "io_uring: the INIT reply could not ask for it: requests stay on /dev/fuse\n");
        ring.reset();
      } else if (const int err = ring->start(); err != 0) {
        fuse_log(FUSE_LOG_ERR, "io_uring transport: starting its threads: %s\n",
                 std::strerror(-err));
      }
    }
    if (rc >= 0) rc = loop();
    if (ring != nullptr) ring->stop();
    if (rc == 0) rc = error_.load();  // a ring's fatal error after the loop ended
    sem_destroy(&finish_);
    return rc;
  }

 private:
  // The transport -o io_uring asks for, prepared (RingTransport::prepare); null where it
  // cannot run here. Its threads are `threads_` spread over the kernel's queues (one a
  // possible CPU), at least 4 a queue (what the earlier default of four workers a CPU gave:
  // one thread holds one request, and a queue serves its CPU's requests alone), unless
  // io_uring_depth says.
  std::unique_ptr<RingTransport> make_ring() {
    RingTransport::Options o;
    o.per_queue = threads_ / static_cast<unsigned>(RingTransport::possible_cpus().size());
    if (o.per_queue < 4) o.per_queue = 4;
    if (uring_.depth > 0) o.per_queue = uring_.depth;
    o.pin = uring_.pin != 0;
    // The kernel's max_payload_sz: max_write, which libfuse's max_pages covers exactly; a
    // page more for what the kernel may round up.
    o.payload_bytes = kMaxWrite + 4096;
    o.mem = mem_;
    o.fatal = [](void* ctx) {
      auto* l = static_cast<SessionLoop*>(ctx);
      int none = 0;
      l->error_.compare_exchange_strong(none, -EIO);  // the daemon exits with an error
      sem_post(&l->finish_);
    };
    o.fatal_ctx = this;
    auto ring = std::make_unique<RingTransport>(se_, o);
    const char* what = "";
    if (const int rc = ring->prepare(&what); rc != 0) {
      fuse_log(FUSE_LOG_ERR, "io_uring transport: %s: %s: requests stay on /dev/fuse\n", what,
               std::strerror(-rc));
      return nullptr;
    }
    return ring;
  }

  int loop() {
    if (fuse_session_exited(se_)) {  // a signal (or a ring's fatal error) before the loop
      fuse_session_reset(se_);
      return error_.load();
    }
    const bool started = start_worker();
    while (started && !fuse_session_exited(se_)) sem_wait(&finish_);  // EINTR: look again
    unsigned n;
    {
      std::lock_guard<std::mutex> g(spawn_mu_);
      ending_ = true;  // no worker starts another now
      n = started_;
    }
    for (unsigned i = 0; i < n; ++i) pthread_cancel(workers_[i].thread);
    for (unsigned i = 0; i < n; ++i) {
      pthread_join(workers_[i].thread, nullptr);
      release(workers_[i]);
    }
    fuse_session_reset(se_);
    return started ? error_.load() : -ENOMEM;
  }

  struct Worker {
    SessionLoop* loop = nullptr;
    pthread_t thread{};
    void* mem = nullptr;  // the receive buffer, `bytes` long
    size_t bytes = 0;
    bool dma = false;  // from mem_.alloc, else malloc
    fuse_buf buf{};    // the request in mem (here, not on the worker's stack: see work())
    ReaderGate::Parking parking;  // where it waits while the gate has parked it
  };

  // Starts workers_[started_] with its buffer, if the loop is not ending and below its limit.
  bool start_worker() {
    std::lock_guard<std::mutex> g(spawn_mu_);
    if (ending_ || started_ == threads_) return false;
    Worker& w = workers_[started_];
    w.loop = this;
    w.bytes = receive_bytes();
    if (mem_.alloc != nullptr) w.mem = mem_.alloc(mem_.ctx, w.bytes);
    w.dma = w.mem != nullptr;
    if (w.mem == nullptr) w.mem = std::malloc(w.bytes);
    if (w.mem == nullptr) return false;
    gate_.add_reader();
    if (pthread_create(&w.thread, nullptr, &SessionLoop::work, &w) != 0) {
      gate_.remove_reader();
      release(w);
      return false;
    }
    ++started_;
    return true;
  }

  // Not instrumented by AddressSanitizer: a cancelled worker is unwound from inside its wait
  // for a request, and ASan leaves the unwound frames' stack redzones poisoned (it cleans up
  // after longjmp and exceptions, not after a cancellation), so tearing the thread down then
  // reports a stack-buffer-underflow that is not there. Handlers run in frames of their own,
  // instrumented as usual, and never while cancellation is enabled.
  __attribute__((no_sanitize("address"))) static void* work(void* arg) {
    auto* w = static_cast<Worker*>(arg);
    SessionLoop& l = *w->loop;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, nullptr);
    if (l.own_fds_) {
      if (const int err = OwnDescriptors::adopt(fuse_session_fd(l.se_)); err != 0) {
        bool unsaid = true;  // said once: every worker would fail alike
        if (l.clone_failure_unsaid_.compare_exchange_strong(unsaid, false)) {
          fuse_log(FUSE_LOG_ERR,
                   "per-worker descriptors: cloning /dev/fuse: %s: the workers share one\n",
                   std::strerror(err));
        }
      }
    }
    while (!fuse_session_exited(l.se_)) {
      fuse_buf& buf = w->buf;
      buf = fuse_buf{};
      buf.mem = w->mem;
      buf.size = w->bytes;
      pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, nullptr);
      const int res = fuse_session_receive_buf(l.se_, &buf);
      pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, nullptr);
      if (res == -EINTR) continue;
      if (res <= 0) {  // 0: unmounted (the session has exited)
        if (res < 0) {
          int none = 0;
          l.error_.compare_exchange_strong(none, res);
          fuse_session_exit(l.se_);
        }
        break;
      }
      // The last reader took this request: wake parked workers, or start another, to wait
      // for the next.
      ReaderGate::Parking* wake[ReaderGate::kWake];
      bool start = false;
      const unsigned n = l.gate_.took(wake, &start);
      for (unsigned i = 0; i < n; ++i) ReaderGate::wake(wake[i]);
      if (start) l.start_worker();
      fuse_session_process_buf(l.se_, &buf);
      if (!l.gate_.done(&w->parking)) {
        pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, nullptr);
        ReaderGate::wait(&w->parking);
        pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, nullptr);
      }
    }
    l.gate_.remove_reader();
    sem_post(&l.finish_);
    return nullptr;
  }

  void release(Worker& w) {
    if (w.mem == nullptr) return;
    if (w.dma) {
      mem_.free(mem_.ctx, w.mem, w.bytes);
    } else {
      std::free(w.mem);
    }
    w.mem = nullptr;
  }

  fuse_session* const se_;
  const unsigned threads_;
  const ReceiveMemory mem_;
  const UringOptions uring_;
  bool own_fds_;  // set before the first worker starts; read-only afterwards
  std::atomic<bool> clone_failure_unsaid_{true};  // no worker has logged a failed clone
  // Sized once; workers_[i] is written by start_worker() before thread i starts, then read
  // by that thread and, after it has been joined, by run().
  std::vector<Worker> workers_;
  std::mutex spawn_mu_;                   // guards started_ and ending_
  unsigned started_ = 0;                  // spawn_mu_
  bool ending_ = false;                   // spawn_mu_
  ReaderGate gate_{park_idle_workers()};  // which idle workers read /dev/fuse (thread-safe)
  sem_t finish_;               // posted by each worker as it ends, and by a ring's fatal error
  std::atomic<int> error_{0};  // the first failed read's error, or a ring's fatal one
};

// Runs the session loop of `se` until it ends: single-threaded for -s, libfuse's
// multithreaded loop where -o clone_fd is given, else SessionLoop with receive buffers from
// `mem`. The worker threads, at most: max_threads from the command line where given
// (`threads_given`: max_threads_given before fuse_parse_cmdline), else `default_threads`, or
// default_max_threads() where that is 0;
// SessionLoop keeps every one it started (max_idle_threads applies to libfuse's loop only).
// Only SessionLoop answers INIT through answer_init: under -s and -o clone_fd libfuse's
// reply goes out as it is, and the kernel drops privileges itself (a GETXATTR before each
// buffered write). Returns the loop's result.
inline int run_session_loop(fuse_session* se, const fuse_cmdline_opts& cl, bool threads_given,
                            const ReceiveMemory& mem = {}, const UringOptions& uring = {},
                            unsigned default_threads = 0, bool shared_fd = false) {
  if (uring.on && (cl.singlethread || cl.clone_fd)) {
    fuse_log(FUSE_LOG_ERR, "io_uring: not used with %s: requests stay on /dev/fuse\n",
             cl.singlethread ? "-s" : "clone_fd");
  }
  if (cl.singlethread) return fuse_session_loop(se);
  const unsigned threads = threads_given          ? cl.max_threads
                           : default_threads != 0 ? default_threads
                                                  : default_max_threads();
  if (!cl.clone_fd) return SessionLoop(se, threads, mem, uring, shared_fd).run();
  fuse_loop_config* lc = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(lc, cl.clone_fd);
  fuse_loop_cfg_set_max_threads(lc, threads);
  // fuse_parse_cmdline leaves max_idle_threads at UINT_MAX (keep every idle thread) unless
  // given; passed on as it is, libfuse logs "Ignoring invalid max threads value".
  if (cl.max_idle_threads <= 100000) fuse_loop_cfg_set_idle_threads(lc, cl.max_idle_threads);
  const int rc = fuse_session_loop_mt(se, lc);
  fuse_loop_cfg_destroy(lc);
  return rc;
}

}  // namespace warpfs::daemon
