// warpfs [options] DEVICE MOUNTPOINT: the FUSE daemon. A thin translation of libfuse's
// low-level requests (multithreaded loop) into fs::Filesystem calls; the filesystem does the
// work and the locking. See the README for the options.
// 3.12: fuse_session_loop_mt() takes the fuse_loop_config of fuse_loop_cfg_create(). Under
// an older version the call resolves to the 3.2 entry point, which reads that config as its
// old struct (idle threads 0, clone_fd on): a thread was created, opened /dev/fuse and exited
// for almost every request.
#define FUSE_USE_VERSION 312
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fs.h>
#include <linux/fuse.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <syslog.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fuse_session.h"
#include "read_reaper.h"
#include "warpfs/blockdev/devices.h"
#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/fs/tune.h"
#include "warpfs/nvme/device.h"
#include "warpfs/nvme/latency.h"
#include "warpfs/nvme/vfio.h"
#ifdef WARPFS_HAVE_LIBPCI
#include "warpfs/nvme/pci.h"
#endif

namespace {

using warpfs::fs::Attr;
using warpfs::fs::Filesystem;
using warpfs::fs::Ino;

constexpr unsigned kCommitUnset = ~0u;      // commit= not given: the filesystem's default
constexpr unsigned kMetaCacheUnset = ~0u;   // meta_cache_mb= not given: the superblock's, else 32
constexpr unsigned kWorkersUnset = ~0u;     // workers= not given: one per I/O queue
constexpr unsigned kAsyncReadsUnset = ~0u;  // async_reads= not given: by the CPUs
constexpr unsigned kSharedFdUnset = ~0u;    // shared_fd= not given: by the device

struct Options {
  char* device = nullptr;
  unsigned cache_mb = 64;
  unsigned queues = 4;
  unsigned latency_us = 0;
  unsigned workers = kWorkersUnset;
  unsigned inline_io = 1;
  unsigned async_reads = kAsyncReadsUnset;
  unsigned vwc_model = 0;
  unsigned commit_s = kCommitUnset;
  unsigned meta_cache_mb = kMetaCacheUnset;
  unsigned io_timeout_s = 30;
  double timeout_s = warpfs::daemon::kDefaultTimeoutS;  // entry and attribute timeouts
  char* stats = nullptr;
  int ro = -1;              // -1: neither ro nor rw given (the superblock's default, else rw)
  int remount = 0;          // -o remount: mount(8) runs the helper again for mount -o remount
  int discard = -1;         // -1: neither discard nor nodiscard given (the superblock's, else on)
  int writeback_cache = 0;  // -o writeback_cache (nowriteback_cache: off, the default)
  int dedup = 0;            // -o dedup: a deduplication pass in the background after mount
  warpfs::daemon::UringOptions uring;   // -o io_uring[,io_uring_depth=N,io_uring_cpu]
  unsigned shared_fd = kSharedFdUnset;  // -o shared_fd=0|1 (worker_threads.h)
  unsigned dedup_table_mb = 64;
  int help = 0;
  int list_devices = 0;
  int version = 0;
};

#define WARPFS_OPT(t, p) \
  { t, offsetof(Options, p), 1 }
// "ro" and "rw" are seen here and kept for libfuse's mount (FUSE_OPT_KEY_KEEP would hide them
// from opt_proc altogether).
enum {
  kKeyRo = 1,
  kKeyRw = 2,
  kKeyDiscard = 3,
  kKeyNoDiscard = 4,
  kKeyWritebackCache = 5,
  kKeyNoWritebackCache = 6
};
const fuse_opt kOpts[] = {WARPFS_OPT("cache_mb=%u", cache_mb),
                          WARPFS_OPT("queues=%u", queues),
                          WARPFS_OPT("latency_us=%u", latency_us),
                          WARPFS_OPT("workers=%u", workers),
                          WARPFS_OPT("commit=%u", commit_s),
                          WARPFS_OPT("stats=%s", stats),
                          FUSE_OPT_KEY("nodiscard", kKeyNoDiscard),
                          FUSE_OPT_KEY("discard", kKeyDiscard),
                          FUSE_OPT_KEY("nowriteback_cache", kKeyNoWritebackCache),
                          FUSE_OPT_KEY("writeback_cache", kKeyWritebackCache),
                          FUSE_OPT_KEY("ro", kKeyRo),
                          WARPFS_OPT("remount", remount),
                          FUSE_OPT_KEY("rw", kKeyRw),
                          WARPFS_OPT("io_timeout=%u", io_timeout_s),
                          WARPFS_OPT("timeout=%lf", timeout_s),
                          WARPFS_OPT("inline_io=%u", inline_io),
                          WARPFS_OPT("async_reads=%u", async_reads),
                          WARPFS_OPT("vwc_model=%u", vwc_model),
                          WARPFS_OPT("meta_cache_mb=%u", meta_cache_mb),
                          WARPFS_OPT("dedup", dedup),
                          WARPFS_URING_OPTS(Options),
                          WARPFS_OPT("shared_fd=%u", shared_fd),
                          WARPFS_OPT("dedup_table_mb=%u", dedup_table_mb),
                          WARPFS_OPT("-h", help),
                          WARPFS_OPT("--help", help),
                          WARPFS_OPT("--list-devices", list_devices),
                          WARPFS_OPT("-V", version),
                          WARPFS_OPT("--version", version),
                          FUSE_OPT_END};

int opt_proc(void* data, const char* arg, int key, fuse_args*) {
  auto* o = static_cast<Options*>(data);
  if (key == FUSE_OPT_KEY_NONOPT && o->device == nullptr) {
    o->device = strdup(arg);
    return 0;  // consumed: the mountpoint is the next non-option, left to libfuse
  }
  if (key == kKeyRo) o->ro = 1;
  if (key == kKeyRw) o->ro = 0;  // the last one wins
  if (key == kKeyDiscard || key == kKeyNoDiscard) {
    o->discard = key == kKeyDiscard;
    return 0;  // ours alone: not a mount option of the kernel's
  }
  if (key == kKeyWritebackCache || key == kKeyNoWritebackCache) {
    o->writeback_cache = key == kKeyWritebackCache;
    return 0;  // ours alone, as discard
  }
  return 1;
}

// Page-cache coherence for O_DIRECT opens. They are answered with FOPEN_DIRECT_IO: their
// reads and writes go straight to the daemon (no page cache, and no GETXATTR of
// security.capability before every write, which the kernel's buffered and generic O_DIRECT
// paths send: 3.5x on 4 KiB O_DIRECT writes; the filesystem drops that attribute itself).
// Other opens keep the page cache between opens (keep_cache), so a direct write must not
// leave stale pages there: while the inode has cached opens, the written range is
// invalidated at once; otherwise the next cached open starts without the old pages. (Recent
// kernels also invalidate after a synchronous FOPEN_DIRECT_IO write, never after an
// asynchronous one; 6.1, Debian 12's, after neither.)
class PageCacheTracker {
 public:
  // A cached open: whether it may keep the inode's page cache.
  bool open_cached(Ino ino) {
    std::lock_guard<std::mutex> g(mu_);
    State& s = m_[ino];
    ++s.cached_opens;
    const bool keep = !s.stale;
    s.stale = false;
    return keep;
  }
  void release_cached(Ino ino) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = m_.find(ino);
    if (it == m_.end()) return;
    if (it->second.cached_opens > 0) --it->second.cached_opens;
    if (idle(it->second) && !it->second.stale) m_.erase(it);
  }
  // What the kernel must be told after a direct write changed the file's times.
  enum class Tell {
    kNothing,     // no reply with the old times can be cached
    kAttributes,  // the attributes: call told() once the notification has gone
    kRange,       // the written range, with the attributes (cached opens exist)
  };
  // After a direct write, with `replies` the count of attribute replies begun so far, read
  // after the write's change (Daemon::attr_replies). The kernel bumps the attributes'
  // version when an asynchronous direct write completes but does not invalidate them, so a
  // reply with the old times that it accepted meanwhile would stay cached; such a reply began
  // before the change and so counts in `replies`. Nothing to tell where no reply began since
  // the last notification for this inode had gone out (that one came after the reply was
  // asked for: the kernel invalidated it, or refused it for its older version). Replies it
  // takes whatever their version go out already expired (attr_timeout).
  Tell wrote_direct(Ino ino, uint64_t replies) {
    std::lock_guard<std::mutex> g(mu_);
    State& s = m_[ino];
    if (s.cached_opens > 0) return Tell::kRange;
    s.stale = true;
    if (s.telling == 0 && s.told_at == replies) return Tell::kNothing;
    // One telling now: a write answered before it has gone must tell as well.
    s.told_at = replies;
    ++s.telling;
    return Tell::kAttributes;
  }
  // `sent`: whether the kernel took the notification (else the next write tells again).
  void told(Ino ino, bool sent) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = m_.find(ino);
    if (it == m_.end()) return;
    if (it->second.telling > 0) --it->second.telling;
    if (!sent) it->second.told_at = kNeverTold;
  }
  void forget(Ino ino) {  // the kernel dropped the inode, and its pages with it
    std::lock_guard<std::mutex> g(mu_);
    auto it = m_.find(ino);
    if (it != m_.end() && idle(it->second)) m_.erase(it);
  }
  // Direct (FOPEN_DIRECT_IO) opens. While a file has one, its attributes go out already
  // expired (attr_timeout), so that no reply with times from before a direct write can stay
  // cached: under load (the POSIX suite's IoTest.StatAfterEachDirectWrite... beside the test
  // suite, 3-8 % of its runs) the kernel kept a GETATTR reply with the old mtime, sent before
  // an asynchronous write and answered just before it, past that write's notification, and a
  // stat after the write returned it without asking (a daemon notifying after every direct
  // write failed alike). The cost: a stat of such a file is a round trip each time.
  void open_direct(Ino ino) {
    std::lock_guard<std::mutex> g(mu_);
    ++m_[ino].direct_opens;
    direct_opens_.fetch_add(1, std::memory_order_release);
  }
  void release_direct(Ino ino) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = m_.find(ino);
    if (it == m_.end() || it->second.direct_opens == 0) return;
    --it->second.direct_opens;
    direct_opens_.fetch_sub(1, std::memory_order_release);
    if (idle(it->second) && !it->second.stale) m_.erase(it);
  }
  bool has_direct(Ino ino) {
    if (direct_opens_.load(std::memory_order_acquire) == 0) return false;  // none anywhere
    std::lock_guard<std::mutex> g(mu_);
    auto it = m_.find(ino);
    return it != m_.end() && it->second.direct_opens > 0;
  }

 private:
  struct State {
    uint32_t cached_opens = 0;
    bool stale = false;             // written directly since the last cached open
    uint32_t telling = 0;           // attribute notifications being sent
    uint64_t told_at = kNeverTold;  // attr_replies when the last one began
    uint32_t direct_opens = 0;      // FOPEN_DIRECT_IO opens not yet released
  };
  static constexpr uint64_t kNeverTold = std::numeric_limits<uint64_t>::max();
  // No open and no notification under way: the entry is needed no more, but for `stale`
  // while the kernel still has the inode's pages (release_cached, release_direct; forget
  // drops it whatever `stale` says, the pages going with the inode).
  static bool idle(const State& s) {
    return s.cached_opens == 0 && s.direct_opens == 0 && s.telling == 0;
  }
  std::mutex mu_;
  std::unordered_map<Ino, State> m_;
  // The direct opens of every inode (m_'s direct_opens summed): lets has_direct answer
  // without the mutex where there are none, as for every stat of a workload without O_DIRECT.
  std::atomic<uint64_t> direct_opens_{0};
};

// The FUSE operations the live view times (warpfs-stat), in the order of their names.
enum OpId : unsigned {
  kOp_lookup,
  kOp_forget,
  kOp_forget_multi,
  kOp_getattr,
  kOp_setattr,
  kOp_readlink,
  kOp_mknod,
  kOp_mkdir,
  kOp_unlink,
  kOp_rmdir,
  kOp_symlink,
  kOp_rename,
  kOp_link,
  kOp_open,
  kOp_read,
  kOp_write,
  kOp_release,
  kOp_fsync,
  kOp_opendir,
  kOp_readdir,
  kOp_readdirplus,
  kOp_releasedir,
  kOp_fsyncdir,
  kOp_statfs,
  kOp_setxattr,
  kOp_getxattr,
  kOp_listxattr,
  kOp_removexattr,
  kOp_create,
  kOp_fallocate,
  kOp_lseek,
  kOp_ioctl,
  kOp_copy_file_range,
  kOpCount
};
constexpr const char* kOpNames[kOpCount] = {
    "lookup",   "forget",   "forget_multi",   "getattr",     "setattr",  "readlink",
    "mknod",    "mkdir",    "unlink",         "rmdir",       "symlink",  "rename",
    "link",     "open",     "read",           "write",       "release",  "fsync",
    "opendir",  "readdir",  "readdirplus",    "releasedir",  "fsyncdir", "statfs",
    "setxattr", "getxattr", "listxattr",      "removexattr", "create",   "fallocate",
    "lseek",    "ioctl",    "copy_file_range"};

// Read buffers in memory the device moves data to without a copy (DMA memory on NVMe): a
// large read lands there straight from the device, not through a bounce buffer, and reaches
// the kernel with fuse_reply_buf's one copy. A read leases one until it is answered; the
// pool keeps as many as reads were ever in flight at once (the FUSE workers, or with read
// reapers the reads the kernel lets through: max_background, 128), each grown to the largest
// read it served and never shrunk. Heap memory where the device has none to give (an NVMe
// namespace has room for 256 regions): reads into it are bounced, and performed at once.
class ReadBuffers {
  using Buf = warpfs::blockdev::IoBuffer;

 public:
  void set_device(warpfs::blockdev::BlockDevice* dev) { dev_ = dev; }
  // Gives every buffer back to the device. REQUIRES: no lease outstanding.
  void clear() {
    std::lock_guard<std::mutex> g(mu_);
    free_.clear();
  }

  class Lease {
   public:
    Lease(ReadBuffers& pool, size_t bytes) : pool_(pool), b_(pool.take(bytes)) {}
    ~Lease() { pool_.give(std::move(b_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    char* data() { return reinterpret_cast<char*>(b_.data()); }
    size_t size() const { return b_.size(); }

   private:
    ReadBuffers& pool_;
    Buf b_;
  };

 private:
  Buf take(size_t bytes) {
    Buf b(dev_);
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!free_.empty()) {
        b = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (b.size() < bytes) b.reserve(std::max<size_t>((bytes + 4095) & ~size_t{4095}, 128 << 10));
    return b;
  }
  void give(Buf b) {
    std::lock_guard<std::mutex> g(mu_);
    free_.push_back(std::move(b));
  }
  warpfs::blockdev::BlockDevice* dev_ = nullptr;  // set before the workers start, then read-only
  std::mutex mu_;
  std::vector<Buf> free_;  // mu_
};

// What every FUSE worker thread reaches through fuse_req_userdata(). Set up before the
// session loop starts and torn down after it ends: read-only while the workers run, except
// page_cache (its own mutex) and the live view's counters (atomics). The filesystem and the
// device stack are thread-safe themselves (filesystem.h, block_device.h).
struct Daemon {
  std::unique_ptr<warpfs::blockdev::DeviceStack> stack;
  ReadBuffers read_buffers;  // thread-safe itself; emptied before the stack goes
  std::unique_ptr<Filesystem> fs;
  std::string stats_path;
  double timeout = warpfs::daemon::kDefaultTimeoutS;  // entry and attribute (-o timeout=)
  PageCacheTracker page_cache;
  bool want_writeback_cache = false;  // -o writeback_cache
  // The kernel's writeback cache is on (negotiate): set by op_init, which libfuse runs before
  // it hands any other request to a worker; read by every worker after.
  std::atomic<bool> writeback_cache{false};
  // The kernel takes FOPEN_PARALLEL_DIRECT_WRITES (FUSE 7.38): set by op_init, as above.
  std::atomic<bool> parallel_direct_writes{false};
  fuse_session* se = nullptr;
  // The live view's counters: each its own atomics, written by every worker (latency.h).
  warpfs::nvme::LatencyHistogram latency[kOpCount];
  // Each operation's requests being served now, and the most at once since the mount: whether
  // the kernel sends requests in parallel (Timed; a read answered by a reaper counts until its
  // answer, OpHandover). Relaxed atomics, written by every worker and reaper.
  std::atomic<uint32_t> in_flight[kOpCount] = {};
  std::atomic<uint32_t> peak_in_flight[kOpCount] = {};
  std::atomic<uint64_t> read_bytes{0}, written_bytes{0};
  // Reads answered when their device commands complete (-o async_reads, op_read): null when
  // off. Started before the session loop and stopped (every read answered) after it, before
  // the filesystem goes; thread-safe itself.
  std::unique_ptr<warpfs::daemon::ReadReaper> reaper;
  // Replies carrying attributes begun (Timed: counted before the handler reads them); a direct
  // write reads it after its change (attr_replies_after_change, PageCacheTracker).
  std::atomic<uint64_t> attr_replies{0};
  // -o dedup's pass: its state and, once done, its report (dedup_mu, leaf).
  mutable std::mutex dedup_mu;
  std::string dedup_state = "off";  // "off", "running", "done", "stopped" or "failed: ..."
  warpfs::fs::DedupReport dedup_report;
};

Daemon* daemon_of(fuse_req_t req) {
  return static_cast<Daemon*>(fuse_req_userdata(req));
}
Filesystem& fs_of(fuse_req_t req) {
  return *daemon_of(req)->fs;
}

// The attribute timeout of a reply for `a`. `unversioned`: a SETATTR's or LINK's reply. The
// kernel takes those attributes whatever their version (fuse_do_setattr, and fuse_iget with
// version 0), so a regular file's, read before an asynchronous direct write changed its times
// (or blocks) and applied after that write's notification, would stay cached: answered as
// already expired, they are asked for again (GETATTR, whose reply the kernel refuses when its
// version is older) before the next use. The same for every reply about a regular file that
// has a direct open (PageCacheTracker::open_direct: the kernel's version check did not hold
// there under load). Other files take no direct writes.
double attr_timeout(fuse_req_t req, const Attr& a, bool unversioned) {
  Daemon* d = daemon_of(req);
  if (!S_ISREG(a.mode)) return d->timeout;
  return unversioned || d->page_cache.has_direct(a.ino) ? 0.0 : d->timeout;
}

void fill_entry(fuse_req_t req, const Attr& a, fuse_entry_param* e, bool unversioned = false) {
  std::memset(e, 0, sizeof *e);
  e->ino = a.ino;
  // The kernel's root node has generation 0 and a reply that says otherwise is corrected with
  // a warning (fuse_lookup_name): a ".." lookup that lands on the root answers 0 too.
  e->generation = a.ino == FUSE_ROOT_ID ? 0 : a.generation;
  a.to_stat(&e->attr);
  e->attr_timeout = attr_timeout(req, a, unversioned);
  e->entry_timeout = daemon_of(req)->timeout;
}

void reply_entry_or_err(fuse_req_t req, int rc, const Attr& a, bool unversioned = false) {
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fuse_entry_param e;
  fill_entry(req, a, &e, unversioned);
  fuse_reply_entry(req, &e);
}

void reply_attr_or_err(fuse_req_t req, int rc, const Attr& a, bool unversioned = false) {
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  struct stat st;
  a.to_stat(&st);
  fuse_reply_attr(req, &st, attr_timeout(req, a, unversioned));
}

// An attribute the kernel caches (for `timeout` seconds) changed beyond what it updates itself
// after the request: it must ask again. Attributes only (offset -1): the kernel takes no
// inode lock for it, so this is safe inside a request that holds one (write, setxattr, the
// fileattr ioctls). Returns fuse_lowlevel_notify_inval_inode's result.
int attributes_changed(fuse_req_t req, fuse_ino_t ino) {
  return fuse_lowlevel_notify_inval_inode(daemon_of(req)->se, ino, -1, 0);
}

// The caller's ids and umask. The kernel leaves the umask to the daemon (FUSE_CAP_DONT_MASK):
// the core applies it, unless the directory's default ACL takes its place.
warpfs::fs::Caller caller(fuse_req_t req) {
  const fuse_ctx* c = fuse_req_ctx(req);
  return warpfs::fs::Caller{c->uid, c->gid, static_cast<uint32_t>(c->umask)};
}

void log_line(const std::string& s);

// ---- the operations -----------------------------------------------------------------------

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Attr a;
  reply_entry_or_err(req, fs_of(req).lookup(parent, name, &a), a);
}

void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  daemon_of(req)->page_cache.forget(ino);
  fs_of(req).forget(ino, n);
  fuse_reply_none(req);
}

void op_forget_multi(fuse_req_t req, size_t count, fuse_forget_data* f) {
  for (size_t i = 0; i < count; ++i) {
    daemon_of(req)->page_cache.forget(f[i].ino);
    fs_of(req).forget(f[i].ino, f[i].nlookup);
  }
  fuse_reply_none(req);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  Attr a;
  reply_attr_or_err(req, fs_of(req).getattr(ino, &a), a);
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* st, int to_set, fuse_file_info*) {
  warpfs::fs::SetAttr s;
  s.mode = to_set & FUSE_SET_ATTR_MODE;
  s.uid = to_set & FUSE_SET_ATTR_UID;
  s.gid = to_set & FUSE_SET_ATTR_GID;
  s.size = to_set & FUSE_SET_ATTR_SIZE;
  s.atime = to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW);
  s.mtime = to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW);
  s.atime_now = to_set & FUSE_SET_ATTR_ATIME_NOW;
  s.mtime_now = to_set & FUSE_SET_ATTR_MTIME_NOW;
  s.ctime = to_set & FUSE_SET_ATTR_CTIME;  // the writeback cache's times (negotiate)
  // libfuse 3.14's FUSE_SET_ATTR_KILL_SUID is the bit of the kernel's FATTR_KILL_SUIDGID,
  // which a truncate by a caller without CAP_FSETID carries under FUSE_HANDLE_KILLPRIV_V2
  // (answer_init).
  s.kill_suidgid = (to_set & FUSE_SET_ATTR_KILL_SUID) != 0;
  static_assert(FUSE_SET_ATTR_KILL_SUID == FATTR_KILL_SUIDGID, "libfuse passes the bit on");
  s.new_mode = st->st_mode;
  s.new_uid = st->st_uid;
  s.new_gid = st->st_gid;
  s.new_size = static_cast<uint64_t>(st->st_size);
  // Signed: a date before 1970 has negative seconds (FORMAT.md "Inode").
  // Any int64 seconds the kernel passes (utimensat): kept exactly (FORMAT.md "Inode").
  s.new_atime = {st->st_atim.tv_sec, st->st_atim.tv_nsec};
  s.new_mtime = {st->st_mtim.tv_sec, st->st_mtim.tv_nsec};
  s.new_ctime = {st->st_ctim.tv_sec, st->st_ctim.tv_nsec};
  Attr a;
  reply_attr_or_err(req, fs_of(req).setattr(ino, s, &a), a, /*unversioned=*/true);
}

void op_readlink(fuse_req_t req, fuse_ino_t ino) {
  std::string t;
  if (int rc = fs_of(req).readlink(ino, &t); rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fuse_reply_readlink(req, t.c_str());
}

void op_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  Attr a;
  reply_entry_or_err(req,
                     fs_of(req).mknod(parent, name, static_cast<uint32_t>(mode),
                                      static_cast<uint64_t>(rdev), caller(req), &a),
                     a);
}

void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  Attr a;
  reply_entry_or_err(
      req, fs_of(req).mkdir(parent, name, static_cast<uint32_t>(mode), caller(req), &a), a);
}

void op_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, fs_of(req).unlink(parent, name));
}

void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, fs_of(req).rmdir(parent, name));
}

void op_symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  Attr a;
  reply_entry_or_err(req, fs_of(req).symlink(parent, name, link, caller(req), &a), a);
}

void op_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
               const char* newname, unsigned int flags) {
  fuse_reply_err(req, fs_of(req).rename(parent, name, newparent, newname, flags));
}

void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  Attr a;
  reply_entry_or_err(req, fs_of(req).link(ino, newparent, newname, &a), a, /*unversioned=*/true);
}

// What an open's file handle (fi->fh) says about it. libfuse hands fh back with every
// request on the open (write, release, ...) but not the direct_io flag the open was answered
// with, and the flags it passes are the file's at that moment (fcntl may have changed
// O_DIRECT since), so the mode the kernel was given is kept here.
constexpr uint64_t kFhCached = 0;  // page cache (counted in PageCacheTracker)
constexpr uint64_t kFhDirect = 1;  // FOPEN_DIRECT_IO: no page cache

// O_DIRECT: FOPEN_DIRECT_IO. Otherwise the page cache, kept between opens unless a direct
// write went around it (PageCacheTracker). Under the writeback cache O_DIRECT takes the
// kernel's own direct path instead (generic_file_direct_write): it writes back and drops the
// cached pages of the range first, as a local filesystem does, and sets the times, which the
// kernel owns then (an FOPEN_DIRECT_IO write would leave its cached mtime as it was).
void set_cache_mode(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if ((fi->flags & O_DIRECT) && !daemon_of(req)->writeback_cache.load(std::memory_order_relaxed)) {
    fi->direct_io = 1;
    fi->fh = kFhDirect;
    daemon_of(req)->page_cache.open_direct(ino);
    return;
  }
  fi->fh = kFhCached;
  fi->keep_cache = daemon_of(req)->page_cache.open_cached(ino) ? 1 : 0;
}

// fuse_reply_open and fuse_reply_create with FOPEN_PARALLEL_DIRECT_WRITES where the kernel
// takes it (fuse_session.h, reply_open).
int reply_open(fuse_req_t req, const fuse_file_info* fi) {
  return warpfs::daemon::reply_open(
      req, fi, daemon_of(req)->parallel_direct_writes.load(std::memory_order_relaxed));
}
int reply_create(fuse_req_t req, const fuse_entry_param& e, const fuse_file_info* fi) {
  return warpfs::daemon::reply_create(
      req, e, fi, daemon_of(req)->parallel_direct_writes.load(std::memory_order_relaxed));
}

// Whether `ino` has set-user-ID or set-group-ID now: a change the core may drop them in
// (an O_TRUNC open, a fallocate) must then tell the kernel, which under
// FUSE_HANDLE_KILLPRIV_V2 neither drops them in its cached mode nor refetches it.
bool has_set_id_bits(fuse_req_t req, fuse_ino_t ino) {
  Attr a;
  return fs_of(req).getattr(ino, &a) == 0 && (a.mode & (S_ISUID | S_ISGID)) != 0;
}

void release_cache_mode(fuse_req_t req, fuse_ino_t ino, const fuse_file_info* fi) {
  if (fi->fh == kFhCached) {
    daemon_of(req)->page_cache.release_cached(ino);
  } else if (fi->fh == kFhDirect) {
    daemon_of(req)->page_cache.release_direct(ino);
  }
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  // An O_TRUNC open drops set-user-ID and set-group-ID in the core: told to the kernel, or
  // an exec would honour the bits its cached mode still shows.
  const bool trunc_privs =
      (fi->flags & O_TRUNC) && (fi->flags & O_ACCMODE) != O_RDONLY && has_set_id_bits(req, ino);
  if (int rc = fs_of(req).open(ino, fi->flags); rc) {
    fuse_reply_err(req, rc);
    return;
  }
  if (trunc_privs) attributes_changed(req, ino);
  set_cache_mode(req, ino, fi);
  if (reply_open(req, fi) == -ENOENT) {  // interrupted
    release_cache_mode(req, ino, fi);
    fs_of(req).release(ino);
  }
}

void op_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
               fuse_file_info* fi) {
  Attr a;
  Filesystem& fs = fs_of(req);
  int rc =
      fs.mknod(parent, name, S_IFREG | (static_cast<uint32_t>(mode) & 07777), 0, caller(req), &a);
  if (rc == 0) rc = fs.open(a.ino, fi->flags);
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fuse_entry_param e;
  fill_entry(req, a, &e);
  set_cache_mode(req, a.ino, fi);
  if (reply_create(req, e, fi) == -ENOENT) {
    release_cache_mode(req, a.ino, fi);
    fs.release(a.ino);
    fs.forget(a.ino, 1);
  }
}

// Every read the kernel sends keeps its data above the daemon: an O_DIRECT reader in its own
// buffer, any other in the kernel's page cache (kept between opens: set_cache_mode). So no
// read takes a line of the device's cache (ReadFor::kDirect): a second copy there would only
// push out the lines that matter (written data not yet on the device, the journal's) and
// cost a victim, a fill and a copy per miss. What the cache misses goes from the device into
// the reply's buffer, DMA memory (ReadBuffers), with no copy in user space; lines the cache
// holds are copied from.
void reply_read(fuse_req_t req, int rc, const char* data, size_t got) {
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  daemon_of(req)->read_bytes.fetch_add(got, std::memory_order_relaxed);
  fuse_reply_buf(req, data, got);
}

uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// What Timed tells a handler, and the handler tells Timed back, about the request on this
// thread: when it arrived, and whether the handler handed it to a reaper, which then times it
// to its answer (ReadInFlight) so that the read's latency in the stats runs to the answer, as
// it does for a read answered by its handler. One worker's own request at a time.
struct OpHandover {
  uint64_t t0 = 0;
  bool handed = false;
};
thread_local OpHandover t_op;

// A read whose device commands were still in flight when its handler returned: the reaper
// answers it when they complete. The buffer stays leased until the answer has gone.
class ReadInFlight final : public warpfs::daemon::ReadReaper::Item {
 public:
  ReadInFlight(fuse_req_t req, size_t size)
      : req_(req), d_(daemon_of(req)), t0_(t_op.t0), buf_(d_->read_buffers, size) {}
  bool poll() override { return read_->poll(); }
  void idle(warpfs::port::Backoff& b) override { read_->idle(b); }
  void answer() override {
    size_t got = 0;
    const int rc = read_->result(&got);
    read_.reset();  // the file's blocks are free to change before the answer goes
    reply_read(req_, rc, buf_.data(), got);
    if (handed_) {  // Timed left the timing of this read to us
      d_->in_flight[kOp_read].fetch_sub(1, std::memory_order_relaxed);
      d_->latency[kOp_read].add(mono_ns() - t0_);
    }
  }
  // Given to a reaper: the request is timed to its answer here, not by Timed.
  void hand_over() {
    handed_ = true;
    t_op.handed = true;
  }
  // The read, from Filesystem::read_start.
  int start(fuse_ino_t ino, size_t size, off_t off, size_t* got) {
    return fs_of(req_).read_start(ino, static_cast<uint64_t>(off), size, buf_.data(), buf_.size(),
                                  got, &read_);
  }
  bool in_flight() const { return read_ != nullptr; }
  const char* data() { return buf_.data(); }

 private:
  fuse_req_t req_;
  Daemon* const d_;
  const uint64_t t0_;  // the request's arrival (Timed)
  bool handed_ = false;
  ReadBuffers::Lease buf_;
  std::unique_ptr<warpfs::fs::Filesystem::PendingRead> read_;
};

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  Daemon* d = daemon_of(req);
  if (d->reaper != nullptr) {
    auto r = std::make_unique<ReadInFlight>(req, size);
    const uint64_t others = d->reaper->enter();
    size_t got = 0;
    const int rc = r->start(ino, size, off, &got);
    if (r->in_flight() && others != 0) {
      r->hand_over();
      d->reaper->add(std::move(r));  // answered, timed and counted out by a reaper
      return;
    }
    if (!r->in_flight()) {
      reply_read(req, rc, r->data(), got);
    } else {
      // No other read in flight (a reader at QD1): waiting here costs one wake-up, handing
      // over two (the reaper's, then this read's).
      warpfs::port::Backoff b;
      while (!r->poll()) r->idle(b);
      r->answer();
    }
    r.reset();
    d->reaper->leave();
    return;
  }
  ReadBuffers::Lease buf(d->read_buffers, size);
  size_t got = 0;
  const int rc = fs_of(req).read(ino, static_cast<uint64_t>(off), size, buf.data(), &got,
                                 warpfs::fs::ReadFor::kDirect);
  reply_read(req, rc, buf.data(), got);
}

// Daemon::attr_replies as a direct write reads it, after its change to the times. Both sides
// are read-modify-writes of the counter (acq_rel, no fences: TSan does not model them): if
// this one comes later in the counter's order it sees the reply counted; if earlier, the
// reply's count reads what it wrote and so happens after the change, and its handler reads
// the new times.
uint64_t attr_replies_after_change(Daemon* d) {
  return d->attr_replies.fetch_add(0, std::memory_order_acq_rel);
}

void op_write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
              fuse_file_info* fi) {
  size_t written = 0;
  bool dropped_privs = false;
  // The blocks kept for root are not every caller's. A write-back of a shared mapping's pages
  // (fi->writepage) comes from whoever flushes them, often the kernel's flusher as root.
  const warpfs::fs::CallerScope as(caller(req));
  Daemon* d = daemon_of(req);
  // Under the writeback cache every write is the kernel's write-back (O_DIRECT included: its
  // direct path set the times and dropped the privileges at the call).
  const warpfs::fs::WriteFrom from = d->writeback_cache.load(std::memory_order_relaxed)
                                         ? warpfs::fs::WriteFrom::kPageCache
                                         : warpfs::fs::WriteFrom::kWriter;
  // A direct write is never answered short. The kernel turns a short reply to an asynchronous
  // one (io_submit, io_uring) into EIO (fuse_get_res_by_io), so a write that ran out of room
  // part way would tell the caller "Input/output error" for a full disk. The rest is tried
  // again (room may have come back), and what stops it is the reply: ENOSPC, EFBIG. The
  // bytes written stay, as they do after a failed write on ext4; the kernel cuts an extending
  // asynchronous one back to the size it had (fuse_direct_IO) and refetches the size after
  // any direct write. A synchronous O_DIRECT writer so sees the error where a short count
  // would have said how far it got.
  const bool direct = !fi->writepage && (fi->fh == kFhDirect || (fi->flags & O_DIRECT) != 0);
  PageCacheTracker::Tell tell = PageCacheTracker::Tell::kNothing;
  int rc = 0;
  do {
    size_t more = 0;
    bool dropped = false;
    rc = fs_of(req).write(ino, static_cast<uint64_t>(off) + written, size - written, buf + written,
                          &more, &dropped, from);
    written += more;
    dropped_privs = dropped_privs || dropped;
    // A retry with no progress and no reason: not expected.
    if (direct && rc == 0 && more == 0 && written < size) rc = EIO;
  } while (direct && rc == 0 && written < size);
  if (dropped_privs) {
    // The core dropped set-user-ID or set-group-ID (the kernel leaves that to us: an
    // O_DIRECT write never asks, and FUSE_HANDLE_KILLPRIV_V2 is on: answer_init): the
    // kernel's cached mode still has the bits, and an exec would honour them.
    attributes_changed(req, ino);
  }
  // A direct write that failed part way (written > 0, rc set) changed what it wrote all the
  // same: the kernel's caches are told below before the error goes back.
  if (rc && written == 0) {
    fuse_reply_err(req, rc);
    return;
  }
  if (written > 0 && !fi->writepage && d->writeback_cache.load(std::memory_order_relaxed)) {
    // Under the writeback cache a write that is not a page's write-back (FUSE_WRITE_CACHE)
    // comes from the kernel's direct path, which dropped the range's pages before it and,
    // for an asynchronous write, drops nothing after it: pages a buffered reader refilled
    // meanwhile go here, as below.
    fuse_lowlevel_notify_inval_inode(d->se, ino, off, static_cast<off_t>(written));
  } else if (fi->fh == kFhDirect && written > 0 &&
             (tell = d->page_cache.wrote_direct(ino, attr_replies_after_change(d))) ==
                 PageCacheTracker::Tell::kRange) {
    // Cached opens read this range from the page cache: drop it there, before the reply, so
    // that a read which starts once the write has returned cannot find a page filled before
    // the new bytes were in place (a buffered reader refills pages while the write is under
    // way). The kernel's own invalidation after an FOPEN_DIRECT_IO write runs only for a
    // synchronous one: an asynchronous (io_submit) write is queued and answered later.
    // Safe inside the write: the kernel invalidates pages and attributes without the inode
    // lock.
    fuse_lowlevel_notify_inval_inode(d->se, ino, off, static_cast<off_t>(written));
  } else if (tell == PageCacheTracker::Tell::kAttributes) {
    // The times too (that call invalidated them as well): for an asynchronous write the
    // kernel marks the attributes stale when it queues the write (fuse_direct_IO) and only
    // bumps their version when it completes, so the old mtime and ctime of a GETATTR answered
    // while the write was under way would stay cached for the whole timeout. Only where such
    // a reply may have gone out (wrote_direct): the notification was 6 % of the daemon's
    // samples on 4 KiB O_DIRECT writes. (A cached open that fcntl made O_DIRECT reaches the
    // same kernel path and is not told: its writes look buffered here.)
    // Told if the kernel took it, or had no such inode (then nothing of it is cached).
    const int sent = attributes_changed(req, ino);
    d->page_cache.told(ino, sent == 0 || sent == -ENOENT);
  }
  d->written_bytes.fetch_add(written, std::memory_order_relaxed);
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fuse_reply_write(req, written);
}

void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  release_cache_mode(req, ino, fi);
  fs_of(req).release(ino);
  fuse_reply_err(req, 0);
}

void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info*) {
  fuse_reply_err(req, fs_of(req).fsync(ino, datasync != 0));
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (int rc = fs_of(req).opendir(ino); rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fi->cache_readdir = 0;
  if (fuse_reply_open(req, fi) == -ENOENT) fs_of(req).release(ino);
}

void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  std::vector<char> buf(size);
  size_t pos = 0;
  Filesystem& fs = fs_of(req);
  const int rc = fs.readdir(ino, static_cast<uint64_t>(off), [&](const warpfs::fs::DirEntry& e) {
    const auto next = static_cast<off_t>(e.next_offset);
    if (!plus) {
      struct stat st {};
      st.st_ino = e.ino;
      st.st_mode = static_cast<mode_t>(e.type) << 12;
      const size_t need =
          fuse_add_direntry(req, buf.data() + pos, size - pos, e.name.c_str(), &st, next);
      if (need > size - pos) return false;
      pos += need;
      return true;
    }
    // readdirplus: each entry returned with attributes counts a lookup, so check the room
    // first and count only what goes out ("." and ".." are not counted).
    const size_t need = fuse_add_direntry_plus(req, nullptr, 0, e.name.c_str(), nullptr, next);
    if (need > size - pos) return false;
    fuse_entry_param ep{};
    if (e.name != "." && e.name != "..") {
      Attr a;
      if (fs.lookup_ino(e.ino, &a) != 0) return true;  // vanished meanwhile: skip it
      fill_entry(req, a, &ep);
    } else {
      ep.attr.st_ino = e.ino;
      ep.attr.st_mode = S_IFDIR;
    }
    pos += fuse_add_direntry_plus(req, buf.data() + pos, size - pos, e.name.c_str(), &ep, next);
    return true;
  });
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fuse_reply_buf(req, buf.data(), pos);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  readdir_common(req, ino, size, off, false);
}

void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  readdir_common(req, ino, size, off, true);
}

void op_releasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  fs_of(req).release(ino);
  fuse_reply_err(req, 0);
}

void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info*) {
  fuse_reply_err(req, fs_of(req).fsync(ino, datasync != 0));
}

void op_statfs(fuse_req_t req, fuse_ino_t) {
  struct statvfs st;
  if (int rc = fs_of(req).statfs(&st); rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fuse_reply_statfs(req, &st);
}

// After setxattr and removexattr the kernel marks only ctime stale (fuse_update_ctime), but
// the attribute block may come or go with them: st_blocks changes too (a statx asking for
// STATX_BLOCKS alone would be answered from the cache).
void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                 int flags) {
  const int rc = fs_of(req).setxattr(ino, name, value, size, flags);
  if (rc == 0) attributes_changed(req, ino);
  fuse_reply_err(req, rc);
}

void reply_sized(fuse_req_t req, int rc, const std::string& v, size_t size) {
  if (rc) {
    fuse_reply_err(req, rc);
  } else if (size == 0) {
    fuse_reply_xattr(req, v.size());
  } else if (v.size() > size) {
    fuse_reply_err(req, ERANGE);
  } else {
    fuse_reply_buf(req, v.data(), v.size());
  }
}

void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  std::string v;
  const int rc = fs_of(req).getxattr(ino, name, &v);
  reply_sized(req, rc, v, size);
}

void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  std::string v;
  const int rc = fs_of(req).listxattr(ino, &v);
  reply_sized(req, rc, v, size);
}

void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  const int rc = fs_of(req).removexattr(ino, name);
  if (rc == 0) attributes_changed(req, ino);
  fuse_reply_err(req, rc);
}

void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, fuse_file_info*) {
  if (off < 0 || len <= 0) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  const warpfs::fs::CallerScope as(caller(req));  // the root reserve is not every caller's
  // The core drops set-user-ID and set-group-ID first: told to the kernel, as after a write.
  const bool privs = has_set_id_bits(req, ino);
  const int rc =
      fs_of(req).fallocate(ino, mode, static_cast<uint64_t>(off), static_cast<uint64_t>(len));
  if (privs) attributes_changed(req, ino);
  fuse_reply_err(req, rc);
}

// copy_file_range(2) (cp, since coreutils 9): whole blocks are shared, not copied
// (Filesystem::copy_file_range). The kernel wrote back both ranges' dirty pages before the
// request and drops the destination's after the reply; cached opens of this daemon's own
// page-cache modes are told here, as after a write.
void op_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in, fuse_file_info*,
                        fuse_ino_t ino_out, off_t off_out, fuse_file_info*, size_t len, int flags) {
  if (flags != 0) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  if (off_in < 0 || off_out < 0) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  const warpfs::fs::CallerScope as(caller(req));  // the root reserve is not every caller's
  // The reply's count is 32 bits (fuse_write_out.size): a longer copy answers short, and the
  // caller (cp, the kernel's splice fallback) asks for the rest.
  len = std::min<size_t>(len, UINT32_MAX & ~size_t{warpfs::fs::kBlockSize - 1});
  uint64_t copied = 0;
  const int rc = fs_of(req).copy_file_range(ino_in, static_cast<uint64_t>(off_in), ino_out,
                                            static_cast<uint64_t>(off_out), len, &copied);
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  Daemon* d = daemon_of(req);
  if (copied > 0) {
    fuse_lowlevel_notify_inval_inode(d->se, ino_out, off_out, static_cast<off_t>(copied));
  }
  d->written_bytes.fetch_add(copied, std::memory_order_relaxed);
  fuse_reply_write(req, copied);
}

void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, fuse_file_info*) {
  if (off >= 0 && daemon_of(req)->writeback_cache.load(std::memory_order_relaxed)) {
    // The kernel writes no dirty page back before FUSE_LSEEK: the pages from `off` on are
    // written back (laundered, by other workers: hence no writeback cache with -s) and
    // dropped first, so that the answer sees their data.
    fuse_lowlevel_notify_inval_inode(daemon_of(req)->se, ino, off, 0);
  }
  uint64_t out = 0;
  if (off < 0) {
    fuse_reply_err(req, ENXIO);
    return;
  }
  if (int rc = fs_of(req).lseek(ino, static_cast<uint64_t>(off), whence, &out); rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fuse_reply_lseek(req, static_cast<off_t>(out));
}

// chattr/lsattr: the kernel turns FS_IOC_GETFLAGS/SETFLAGS and FS_IOC_FSGETXATTR/FSSETXATTR
// alike into its fileattr calls, which reach a FUSE daemon as one of these ioctls (an int of
// FS_*_FL flags, or a struct fsxattr with FS_XFLAG_*); anything else is not for warpfs.
void op_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void*, fuse_file_info*,
              unsigned flags, const void* in_buf, size_t in_bufsz, size_t out_bufsz) {
  if (flags & FUSE_IOCTL_COMPAT) {
    fuse_reply_err(req, ENOSYS);
    return;
  }
  uint32_t v = 0;
  if (cmd == FS_IOC_GETFLAGS && out_bufsz >= sizeof(int)) {
    if (int rc = fs_of(req).get_flags(ino, &v); rc) {
      fuse_reply_err(req, rc);
      return;
    }
    const int out = static_cast<int>(v);
    fuse_reply_ioctl(req, 0, &out, sizeof out);
    return;
  }
  if (cmd == FS_IOC_SETFLAGS && in_bufsz >= sizeof(int)) {
    int in = 0;
    std::memcpy(&in, in_buf, sizeof in);
    const int rc = fs_of(req).set_flags(ino, static_cast<uint32_t>(in));
    if (rc) {
      fuse_reply_err(req, rc);
      return;
    }
    attributes_changed(req, ino);  // ctime: the kernel's fileattr_set marks nothing stale
    fuse_reply_ioctl(req, 0, nullptr, 0);
    return;
  }
  if (cmd == FS_IOC_FSGETXATTR && out_bufsz >= sizeof(fsxattr)) {
    if (int rc = fs_of(req).get_flags(ino, &v); rc) {
      fuse_reply_err(req, rc);
      return;
    }
    fsxattr fa{};
    fa.fsx_xflags =
        (v & FS_IMMUTABLE_FL ? FS_XFLAG_IMMUTABLE : 0u) | (v & FS_APPEND_FL ? FS_XFLAG_APPEND : 0u);
    fuse_reply_ioctl(req, 0, &fa, sizeof fa);
    return;
  }
  if (cmd == FS_IOC_FSSETXATTR && in_bufsz >= sizeof(fsxattr)) {
    fsxattr fa;
    std::memcpy(&fa, in_buf, sizeof fa);
    if (fa.fsx_xflags & ~static_cast<uint32_t>(FS_XFLAG_IMMUTABLE | FS_XFLAG_APPEND) ||
        fa.fsx_extsize || fa.fsx_projid || fa.fsx_cowextsize) {
      fuse_reply_err(req, EOPNOTSUPP);
      return;
    }
    v = (fa.fsx_xflags & FS_XFLAG_IMMUTABLE ? FS_IMMUTABLE_FL : 0u) |
        (fa.fsx_xflags & FS_XFLAG_APPEND ? FS_APPEND_FL : 0u);
    const int rc = fs_of(req).set_flags(ino, v);
    if (rc) {
      fuse_reply_err(req, rc);
      return;
    }
    attributes_changed(req, ino);  // ctime, as FS_IOC_SETFLAGS
    fuse_reply_ioctl(req, 0, nullptr, 0);
    return;
  }
  fuse_reply_err(req, ENOTTY);
}

void op_init(void* userdata, fuse_conn_info* conn) {
  // No splice reads, the writeback cache where asked for, 1 MiB writes, the asynchronous
  // queue's depth: as warpfs-null (fuse_session.h).
  auto* d = static_cast<Daemon*>(userdata);
  const bool wb = warpfs::daemon::negotiate(conn, d->want_writeback_cache);
  d->writeback_cache.store(wb, std::memory_order_relaxed);
  if (d->want_writeback_cache && !wb) log_line("the kernel offers no writeback cache: not used");
  d->parallel_direct_writes.store(warpfs::daemon::takes_parallel_direct_writes(conn),
                                  std::memory_order_relaxed);
  // File handles (name_to_handle_at, NFS export): the kernel decodes one it no longer caches
  // by looking up "." of its inode and ".." of a directory (Filesystem::lookup).
  if (conn->capable & FUSE_CAP_EXPORT_SUPPORT) conn->want |= FUSE_CAP_EXPORT_SUPPORT;
  // POSIX ACLs: the kernel enforces and caches them and writes system.posix_acl_* (keeping the
  // mode in step); the core stores them and hands default ACLs down (acl.cc), for which the
  // umask must reach it unapplied. Both or neither.
  if ((conn->capable & FUSE_CAP_POSIX_ACL) && (conn->capable & FUSE_CAP_DONT_MASK)) {
    conn->want |= FUSE_CAP_POSIX_ACL | FUSE_CAP_DONT_MASK;
  }
}

void op_destroy(void*) {}

// The operations whose replies carry attributes of an existing inode that the kernel caches
// (lookup, getattr, readdirplus): it refuses them when their version is older than the
// inode's, which a notification bumps. A new inode's (mknod, mkdir, symlink, create) cannot
// predate a direct write to it; SETATTR's and LINK's replies the kernel takes whatever their
// version: a regular file's go out already expired instead (attr_timeout).
constexpr bool carries_attributes(OpId k) {
  return k == kOp_lookup || k == kOp_getattr || k == kOp_readdirplus;
}

// An operation timed from its arrival to the return of its handler (which has replied: the
// request is gone then, so the daemon is taken first), or, for a read its handler gave to a
// reaper (OpHandover), to its answer by the reaper.
template <OpId K, auto Fn>
struct Timed;
template <OpId K, typename... A, void (*Fn)(fuse_req_t, A...)>
struct Timed<K, Fn> {
  static void call(fuse_req_t req, A... a) {
    Daemon* d = daemon_of(req);
    if constexpr (carries_attributes(K)) {
      d->attr_replies.fetch_add(1, std::memory_order_acq_rel);  // before the handler reads them
    }
    const uint64_t t0 = mono_ns();
    const uint32_t now = d->in_flight[K].fetch_add(1, std::memory_order_relaxed) + 1;
    uint32_t peak = d->peak_in_flight[K].load(std::memory_order_relaxed);
    while (now > peak &&
           !d->peak_in_flight[K].compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    if constexpr (K == kOp_read) t_op = OpHandover{t0, false};
    Fn(req, a...);
    if constexpr (K == kOp_read) {
      if (t_op.handed) return;  // ReadInFlight::answer times it
    }
    d->in_flight[K].fetch_sub(1, std::memory_order_relaxed);
    d->latency[K].add(mono_ns() - t0);
  }
};

fuse_lowlevel_ops make_ops() {
  fuse_lowlevel_ops o{};
  o.init = op_init;
  o.destroy = op_destroy;
  o.lookup = Timed<kOp_lookup, op_lookup>::call;
  o.forget = Timed<kOp_forget, op_forget>::call;
  o.forget_multi = Timed<kOp_forget_multi, op_forget_multi>::call;
  o.getattr = Timed<kOp_getattr, op_getattr>::call;
  o.setattr = Timed<kOp_setattr, op_setattr>::call;
  o.readlink = Timed<kOp_readlink, op_readlink>::call;
  o.mknod = Timed<kOp_mknod, op_mknod>::call;
  o.mkdir = Timed<kOp_mkdir, op_mkdir>::call;
  o.unlink = Timed<kOp_unlink, op_unlink>::call;
  o.rmdir = Timed<kOp_rmdir, op_rmdir>::call;
  o.symlink = Timed<kOp_symlink, op_symlink>::call;
  o.rename = Timed<kOp_rename, op_rename>::call;
  o.link = Timed<kOp_link, op_link>::call;
  o.open = Timed<kOp_open, op_open>::call;
  o.read = Timed<kOp_read, op_read>::call;
  o.write = Timed<kOp_write, op_write>::call;
  // No flush: close() has nothing to push (locks are the kernel's; under the writeback cache
  // the kernel writes the file's dirty pages back and sends its times before it would send
  // FLUSH), and without the op the kernel learns that at the first close (ENOSYS) and stops
  // sending FLUSH: one round trip less per close.
  o.release = Timed<kOp_release, op_release>::call;
  o.fsync = Timed<kOp_fsync, op_fsync>::call;
  o.opendir = Timed<kOp_opendir, op_opendir>::call;
  o.readdir = Timed<kOp_readdir, op_readdir>::call;
  o.readdirplus = Timed<kOp_readdirplus, op_readdirplus>::call;
  o.releasedir = Timed<kOp_releasedir, op_releasedir>::call;
  o.fsyncdir = Timed<kOp_fsyncdir, op_fsyncdir>::call;
  o.statfs = Timed<kOp_statfs, op_statfs>::call;
  o.setxattr = Timed<kOp_setxattr, op_setxattr>::call;
  o.getxattr = Timed<kOp_getxattr, op_getxattr>::call;
  o.listxattr = Timed<kOp_listxattr, op_listxattr>::call;
  o.removexattr = Timed<kOp_removexattr, op_removexattr>::call;
  o.create = Timed<kOp_create, op_create>::call;
  o.fallocate = Timed<kOp_fallocate, op_fallocate>::call;
  o.copy_file_range = Timed<kOp_copy_file_range, op_copy_file_range>::call;
  o.lseek = Timed<kOp_lseek, op_lseek>::call;
  o.ioctl = Timed<kOp_ioctl, op_ioctl>::call;
  return o;
}

// ---- stats dump -----------------------------------------------------------------------------

// The stats file's schema is in warpfs(8), STATS FILE: one object, a member per layer.
std::string stats_json(const Daemon& d) {
  using json = nlohmann::ordered_json;
  const warpfs::fs::FsStats s = d.fs->stats();
  json j;
  j["fs"] = {{"commits", s.commits},
             {"journal_blocks", s.journal_blocks_written},
             {"checkpoint_blocks", s.checkpoint_blocks},
             {"meta_reads", s.meta_reads},
             {"meta_cached", s.meta_cached},
             {"checksum_errors", s.checksum_errors},
             {"trims", s.trims},
             {"trimmed_blocks", s.trimmed_blocks},
             {"replayed_transactions", s.replayed_transactions},
             {"orphans_freed_at_mount", s.orphans_freed_at_mount},
             {"nodes", s.nodes},
             {"meta_buffers", s.meta_buffers},
             {"meta_evicted", s.meta_evicted},
             {"commit_interval_ms", s.commit_interval_ms},
             {"read_only", s.read_only},
             {"discard", s.discard},
             {"meta_cache_mb", s.meta_cache_mb}};
  j["transport"] = {{"io_uring_requests", warpfs::daemon::RingTransport::answered()},
                    {"reads_answered_later", d.reaper ? d.reaper->answered() : 0},
                    {"worker_descriptors", warpfs::daemon::OwnDescriptors::descriptors()},
                    {"replies_rerouted", warpfs::daemon::OwnDescriptors::rerouted()}};
  j["shared"] = {{"shared_blocks", s.shared_blocks},
                 {"saved_bytes", s.saved_blocks * warpfs::fs::kBlockSize},
                 {"clones", s.clones},
                 {"cloned_blocks", s.cloned_blocks},
                 {"cow_blocks", s.cow_blocks},
                 {"deduped_blocks", s.deduped_blocks}};
  {
    std::lock_guard<std::mutex> g(d.dedup_mu);
    {
      const warpfs::fs::DedupReport& r = d.dedup_report;
      j["dedup"] = {{"state", d.dedup_state},           {"files", r.files},
                    {"blocks_hashed", r.blocks_hashed}, {"candidates", r.candidates},
                    {"blocks_shared", r.blocks_shared}, {"not_shared", r.not_shared},
                    {"table_full", r.table_full},       {"seconds", r.seconds}};
    }
  }
  const warpfs::blockdev::StackStats st = d.stack->stats();
  if (st.cached) {
    const warpfs::cache::CacheStats& c = st.cache;
    j["cache"] = {{"hits", c.hits},
                  {"misses", c.misses},
                  {"locked_hits", c.locked_hits},
                  {"evictions", c.evictions},
                  {"writebacks", c.writebacks},
                  {"writebacks_background", c.cleaned},
                  {"dirty_lines", c.dirty_lines},
                  {"coalesced_lanes", c.coalesced_lanes},
                  {"bypassed_bytes", c.bypassed_bytes},
                  {"direct_dropped", c.direct_dropped},
                  {"set_full", c.set_full}};
  }
  json dev = {{"transport", st.transport},
              {"nsid", st.nsid},
              {"lba_bytes", st.lba_bytes},
              {"io_queues", st.io_queues},
              {"max_transfer", st.max_transfer},
              {"timeouts", st.engine.timeouts},
              {"fatal_status", st.engine.fatal_status},
              {"resets", st.engine.resets},
              {"failed_resets", st.engine.failed_resets},
              {"dead", st.engine.dead}};
  if (st.vfio) {
    dev["iommu_group"] = st.iommu_group;
    dev["interrupts"] = st.vfio_counters.interrupts;
    dev["dma_bytes"] = st.vfio_counters.dma_bytes;
    dev["dma_mappings"] = st.vfio_counters.dma_mappings;
    dev["hugepage_bytes"] = st.vfio_counters.hugepage_bytes;
  }
  j["device"] = std::move(dev);
  if (st.is_raid) {  // "device" above is member 0's
    j["raid"] = {{"level", st.raid.level},
                 {"members", st.raid.members},
                 {"stripe_blocks", st.raid.stripe_blocks},
                 {"failed_members", st.raid.failed},
                 {"degraded", st.raid.failed != 0},
                 {"label_generation", st.raid.generation},
                 {"read_failovers", st.raid.read_failovers},
                 {"split_requests", st.raid.split_requests}};
  }
  json pairs = json::array();
  for (const warpfs::nvme::IoEngine::QueueLoad& q : st.pairs) {
    pairs.push_back({{"qid", q.qid}, {"outstanding", q.outstanding}, {"completed", q.completed}});
  }
  j["queues"] = {{"metadata_queues", st.metadata_queues},
                 {"bulk_queues", st.bulk_queues},
                 {"remaps", st.remaps},
                 {"pairs", std::move(pairs)}};
  json commands = json::object();
  using Ns = warpfs::nvme::NamespaceIo;
  for (unsigned k = 0; k < Ns::kClasses; ++k) {
    const warpfs::nvme::LatencyHistogram::Snapshot& h = st.commands[k].latency;
    commands[Ns::kClassNames[k]] = {{"count", h.count},
                                    {"bytes", st.commands[k].bytes},
                                    {"bounced_bytes", st.commands[k].bounced},
                                    {"p50_ns", h.quantile_ns(0.50)},
                                    {"p99_ns", h.quantile_ns(0.99)},
                                    {"p999_ns", h.quantile_ns(0.999)},
                                    {"max_ns", h.max_ns}};
  }
  j["commands"] = std::move(commands);
  j["io"] = {{"read_bytes", d.read_bytes.load(std::memory_order_relaxed)},
             {"written_bytes", d.written_bytes.load(std::memory_order_relaxed)}};
  json ops = json::object();
  for (unsigned k = 0; k < kOpCount; ++k) {
    const warpfs::nvme::LatencyHistogram::Snapshot h = d.latency[k].snapshot();
    ops[kOpNames[k]] = {{"count", h.count},
                        {"p50_ns", h.quantile_ns(0.50)},
                        {"p99_ns", h.quantile_ns(0.99)},
                        {"p999_ns", h.quantile_ns(0.999)},
                        {"max_ns", h.max_ns},
                        {"peak_in_flight", d.peak_in_flight[k].load(std::memory_order_relaxed)}};
  }
  j["ops"] = std::move(ops);
  // Names from the device come as they are; bytes that are not UTF-8 become U+FFFD.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Where a file root writes may be written: "" or why not. Its directory must not be
// writable by others unless sticky (anyone could swap the file), and what is there now must
// be a regular file of ours: not a symlink (root would write wherever it points), not a
// device or fifo, not another user's file.
std::string unsafe_target(int dirfd, const std::string& dir, const std::string& base) {
  struct stat ds;
  if (fstat(dirfd, &ds) != 0) return dir + ": " + std::strerror(errno);
  if ((ds.st_mode & S_IWOTH) && !(ds.st_mode & S_ISVTX))
    return dir + " is writable by every user and not sticky";
  struct stat ts;
  if (fstatat(dirfd, base.c_str(), &ts, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? "" : dir + "/" + base + ": " + std::strerror(errno);
  }
  if (S_ISLNK(ts.st_mode)) return dir + "/" + base + " is a symlink";
  if (!S_ISREG(ts.st_mode)) return dir + "/" + base + " is not a regular file";
  if (ts.st_uid != geteuid()) return dir + "/" + base + " belongs to another user";
  return "";
}

// Writes `text` to `path` the way a program running as root must: never through a symlink,
// into a new file (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) under a temporary name in the same
// directory, then renamed over the target. "" or why not (nothing written).
std::string write_private_file(const std::string& path, const std::string& text) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty()) return path + ": not a file name";
  const int dirfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return dir + ": " + std::strerror(errno);
  std::string why = unsafe_target(dirfd, dir, base);
  if (why.empty()) {
    const std::string tmp = "." + base + "." + std::to_string(getpid()) + ".tmp";
    const int fd =
        openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      why = dir + "/" + tmp + ": " + std::strerror(errno);
    } else {
      size_t off = 0;
      while (off < text.size()) {
        const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      if (off != text.size() || ::close(fd) != 0) {
        why = dir + "/" + tmp + ": write failed";
        unlinkat(dirfd, tmp.c_str(), 0);
      } else if (renameat(dirfd, tmp.c_str(), dirfd, base.c_str()) != 0) {
        why = path + ": " + std::strerror(errno);
        unlinkat(dirfd, tmp.c_str(), 0);
      }
    }
  }
  ::close(dirfd);
  return why;
}

// The stats file's place, checked at mount: "" or why it is refused.
std::string check_stats_path(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int dirfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return dir + ": " + std::strerror(errno);
  std::string why =
      unsafe_target(dirfd, dir, slash == std::string::npos ? path : path.substr(slash + 1));
  ::close(dirfd);
  return why;
}

void write_stats(const Daemon& d) {
  if (d.stats_path.empty()) return;
  if (std::string why = write_private_file(d.stats_path, stats_json(d) + "\n"); !why.empty())
    log_line("stats not written: " + why + " (refused)");
}

// SIGUSR1 asks for a stats dump. A handler may not write files: it pokes an eventfd that a
// small thread sleeps on (no polling: an idle daemon does not wake up).
int g_dump_fd = -1;
std::atomic<bool> g_detached{false};  // logs go to syslog once stderr is /dev/null

// One log line from the filesystem or the device stack: standard error, syslog once detached.
void log_line(const std::string& s) {
  if (g_detached) {
    syslog(LOG_ERR, "%s", s.c_str());
  } else {
    std::fprintf(stderr, "warpfs: %s\n", s.c_str());
  }
}
// libfuse's messages (and the io_uring transport's, which logs through it) as log lines.
void log_fuse(fuse_log_level level, const char* fmt, va_list ap) {
  if (level > FUSE_LOG_NOTICE) {  // -d's trace, as libfuse prints it (-d runs in the foreground)
    vfprintf(stderr, fmt, ap);
    return;
  }
  char line[1024];
  const int n = vsnprintf(line, sizeof line, fmt, ap);
  if (n <= 0) return;
  size_t len = std::strlen(line);
  while (len > 0 && line[len - 1] == '\n') line[--len] = 0;
  log_line(line);
}
void on_usr1(int) {
  const uint64_t one = 1;
  if (::write(g_dump_fd, &one, sizeof one) < 0) {
    // Nothing to do in a handler; the dump is lost.
  }
}

// ---- remount ----------------------------------------------------------------------------
// `mount -o remount,ro|rw MOUNTPOINT` reaches the kernel, which makes the superblock read-only
// or writable (refusing read-only while files are open for writing), and through mount(8)
// runs the mount helper again: `warpfs -o remount` does the remount and starts no daemon.
// The running daemon follows the kernel's flag: it watches its mount table (poll() on
// /proc/self/mountinfo wakes on every change; no polling when idle) and commits, cleans and
// refuses changes, or marks the image dirty again, with Filesystem::set_read_only.

// Whether the superblock mounted at `mountpoint` is read-only (mountinfo's super options);
// false with *found = false where no such mount is listed.
bool mount_is_read_only(const std::string& mountpoint, bool* found,
                        std::string* devno_out = nullptr) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  *found = false;
  bool ro = false;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, devno, root, point;
    f >> id >> parent >> devno >> root >> point;
    if (warpfs::blockdev::unescape_mountinfo(point) != mountpoint) continue;
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype, source, super;
    tail >> fstype >> source >> super;
    if (fstype.rfind("fuse", 0) != 0) continue;
    *found = true;  // the last one listed is the one on top
    ro = super.rfind("ro", 0) == 0 && (super.size() == 2 || super[2] == ',');
    if (devno_out) *devno_out = devno;
  }
  return ro;
}

// `warpfs -o remount[,ro|,rw] DEVICE MOUNTPOINT`: the kernel side of the remount, keeping the
// mount's other flags; the daemon then follows (above). Returns once the kernel remounted.
int remount_helper(const char* mountpoint, bool ro) {
  char* abs = realpath(mountpoint, nullptr);
  if (!abs) {
    std::fprintf(stderr, "warpfs: remount: %s: %s\n", mountpoint, std::strerror(errno));
    return 1;
  }
  const std::string mnt = abs;
  free(abs);
  bool found = false;
  mount_is_read_only(mnt, &found);
  struct statvfs sv;
  if (!found || statvfs(mnt.c_str(), &sv) != 0) {
    std::fprintf(stderr, "warpfs: remount: %s is not a warpfs mount\n", mnt.c_str());
    return 1;
  }
  unsigned long flags = MS_REMOUNT | (ro ? MS_RDONLY : 0);
  if (sv.f_flag & ST_NOSUID) flags |= MS_NOSUID;
  if (sv.f_flag & ST_NODEV) flags |= MS_NODEV;
  if (sv.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
  if (sv.f_flag & ST_NOATIME) flags |= MS_NOATIME;
  if (sv.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
  if (sv.f_flag & ST_RELATIME) flags |= MS_RELATIME;
  if (::mount(nullptr, mnt.c_str(), nullptr, flags, nullptr) != 0) {
    std::fprintf(stderr, "warpfs: remount of %s %s: %s%s\n", mnt.c_str(),
                 ro ? "read-only" : "read-write", std::strerror(errno),
                 errno == EBUSY ? " (files are open for writing)" : "");
    return 1;
  }
  // The daemon follows within milliseconds (it logs "remounted read-only|read-write"); the
  // kernel refuses writes from now on already. Back to read-write, a write in those
  // milliseconds can still see EROFS from the daemon.
  return 0;
}

// The daemon's side: follows its superblock's read-only flag in the mount table until `stop`
// (an eventfd) is written.
void follow_remounts(Filesystem& fs, const std::string& mountpoint, int stop) {
  const int mi = ::open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  if (mi < 0) return;
  for (;;) {
    pollfd p[2] = {{mi, POLLPRI, 0}, {stop, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) break;
    if (p[1].revents & POLLIN) break;
    if (!(p[0].revents & (POLLPRI | POLLERR))) continue;
    char buf[4096];
    ::lseek(mi, 0, SEEK_SET);  // re-arms the notification
    while (::read(mi, buf, sizeof buf) > 0) {
    }
    bool found = false;
    const bool ro = mount_is_read_only(mountpoint, &found);
    if (!found || ro == fs.read_only()) continue;
    const int rc = fs.set_read_only(ro);
    log_line(rc == 0
                 ? std::string("remounted ") + (ro ? "read-only: the image is clean" : "read-write")
                 : std::string("remount ") + (ro ? "read-only" : "read-write") +
                       " failed: " + std::strerror(rc));
  }
  ::close(mi);
}

// ---- the live view ----------------------------------------------------------------------
// warpfs-stat MOUNTPOINT connects to /run/warpfs/MAJ:MIN.sock (the mount's device number, as
// stat(2) of the mountpoint gives it) and reads one JSON object: the stats file's (warpfs(8),
// STATS FILE). The directory is root's (0700), the socket 0600: only root connects. One
// thread serves it, waking only for a connection or for the unmount.
constexpr const char* kRunDir = "/run/warpfs";

std::string live_socket_path(const std::string& devno) {
  return std::string(kRunDir) + "/" + devno + ".sock";
}

// Listens on the live view's socket of the mount at `mountpoint`; -1 (logged) where it
// cannot be made safely. *path receives its path.
int open_live_socket(const std::string& mountpoint, std::string* path) {
  bool found = false;
  std::string devno;
  mount_is_read_only(mountpoint, &found, &devno);
  if (!found || devno.empty()) return -1;
  if (::mkdir(kRunDir, 0700) != 0 && errno != EEXIST) {
    log_line(std::string("live view: ") + kRunDir + ": " + std::strerror(errno) +
             " (warpfs-stat will not connect)");
    return -1;
  }
  struct stat ds;
  if (::lstat(kRunDir, &ds) != 0 || !S_ISDIR(ds.st_mode) || ds.st_uid != geteuid() ||
      (ds.st_mode & 077)) {
    log_line(std::string("live view: ") + kRunDir +
             " is not a directory of ours closed to others: no socket");
    return -1;
  }
  *path = live_socket_path(devno);
  struct stat ss;
  if (::lstat(path->c_str(), &ss) == 0) {
    if (!S_ISSOCK(ss.st_mode) || ss.st_uid != geteuid()) {
      log_line("live view: " + *path + " exists and is not our socket: no socket");
      return -1;
    }
    ::unlink(path->c_str());  // a socket a killed daemon left behind
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path->size() >= sizeof a.sun_path) {
    ::close(fd);
    return -1;
  }
  std::memcpy(a.sun_path, path->c_str(), path->size() + 1);
  const mode_t old = ::umask(077);  // born closed to others (the directory is closed anyway)
  const int b = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::umask(old);
  if (b != 0 || ::chmod(path->c_str(), 0600) != 0 || ::listen(fd, 16) != 0) {
    log_line("live view: " + *path + ": " + std::strerror(errno));
    ::close(fd);
    return -1;
  }
  return fd;
}

// Answers each connection with one JSON line until `stop` (an eventfd) is written.
void serve_live_view(const Daemon& d, int listen_fd, int stop) {
  for (;;) {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {stop, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) break;
    if (p[1].revents & POLLIN) break;
    if (!(p[0].revents & POLLIN)) continue;
    const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    const std::string out = stats_json(d) + "\n";
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::send(c, out.data() + done, out.size() - done, MSG_NOSIGNAL);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(c);
  }
}

void usage(const char* prog) {
  std::printf(
      "usage: %s [options] DEVICE MOUNTPOINT\n"
      "  DEVICE: emu:PATH (an emulated NVMe controller over the image PATH; a bare path is the\n"
      "          same), vfio:DDDD:BB:DD.F (a controller bound to vfio-pci: see warpfs-pci) or\n"
      "          tcp:HOST:PORT/SUBNQN[,hostnqn=NQN][,digest=header|data|both] (an NVMe/TCP\n"
      "          target); any may end in ,ns=N\n"
      "          for namespace N (default: the first active one)\n"
      "options (-o name=value,...):\n"
      "  cache_mb=N      software cache size in MiB (default 64; 0: no cache)\n"
      "  queues=N        NVMe I/O queue pairs (default 4)\n"
      "  latency_us=N    emulated device: completion latency in microseconds (default 0)\n"
      "  workers=N       emulated device: controller worker threads (default: queues)\n"
      "  inline_io=0|1   emulated device: run commands in the thread that rings the doorbell\n"
      "                  (1, default) or only on the worker threads (0)\n"
      "  vwc_model=0|1   emulated device: unflushed writes wait in the image's page cache (0,\n"
      "                  default: a killed daemon leaves them in the image) or in a model of\n"
      "                  the drive's volatile write cache that dies with the daemon (1: a\n"
      "                  kill -9 is then a power cut; one more copy per write)\n"
      "  async_reads=N   N threads answer the reads whose device commands are still in flight,\n"
      "                  their workers free for the next requests (default: three per 4\n"
      "                  CPUs, at most 32, none below 4; not with io_uring); 0: each worker\n"
      "                  waits for its own\n"
      "  commit=N        commit the journal at least every N seconds (default: the\n"
      "                  filesystem's, set by tune.warpfs --commit, else 5)\n"
      "  meta_cache_mb=N cap of the metadata cache in MiB (default: the filesystem's, else 32;\n"
      "                  0: no cap); blocks of inodes the kernel has forgotten are dropped\n"
      "                  whatever the size\n"
      "  dedup           after mounting, share the identical data blocks of all files (one\n"
      "                  pass in the background; needs the shared_blocks feature)\n"
      "  dedup_table_mb=N the pass's hash table bound in MiB (default 64)\n"
      "  io_uring        take requests through FUSE over io_uring where the kernel offers it\n"
      "                  (/sys/module/fuse/parameters/enable_uring), else through /dev/fuse\n"
      "  io_uring_depth=N threads, each with one ring entry, per CPU's queue (default: the\n"
      "                  worker threads over the CPUs, at least 2; at most 64)\n"
      "  io_uring_cpu    run each queue's threads on that queue's CPU only\n"
      "  shared_fd=0|1   worker threads read one /dev/fuse descriptor (1) or each a clone\n"
      "                  of its own (0: their requests and replies do not contend for one\n"
      "                  kernel lock); default 1 with the emulated device at no latency, else 0\n"
      "  timeout=SECONDS how long the kernel may cache names and attributes (default 86400;\n"
      "                  0: ask the daemon every time)\n"
      "  io_timeout=N    reset the controller when a busy queue completes nothing for N\n"
      "                  seconds; the commands in flight fail with EIO (default 30; 0: never)\n"
      "  stats=FILE      write cache and journal counters as JSON to FILE at unmount and on "
      "SIGUSR1\n"
      "  nodiscard       do not trim freed blocks (discard: do, the default)\n"
      "  writeback_cache keep buffered writes in the kernel's page cache until fsync, close or\n"
      "                  write-back (nowriteback_cache: send each write at once, the default;\n"
      "                  see warpfs(8), CACHING, for what changes)\n"
      "  ro              read-only (rw: read-write, the default)\n"
      "  ro/rw, discard/nodiscard and meta_cache_mb= not given here come from the filesystem's\n"
      "  default mount options (tune.warpfs -o), if it has any\n"
      "  max_threads=N   FUSE worker threads at most (default: 1 per 2 CPUs, 10 to 64)\n"
      "  and the FUSE options (-f foreground, -d debug, -s single-threaded, allow_other, ...)\n"
      "%s --list-devices: the NVMe controllers (as warpfs-pci list)\n"
      "%s --list-devices tcp:HOST[:PORT]: the NVMe/TCP subsystems a discovery controller names\n"
      "                  (PORT 8009 if left out), one DEVICE name a line\n"
      "%s --version (-V): the version\n",
      prog, prog, prog, prog);
}

// --list-devices tcp:HOST[:PORT]: the NVM subsystems the discovery controller there names,
// one DEVICE name a line (for mkfs.warpfs, warpfs, fsck.warpfs); the entries that are not an
// NVM subsystem over TCP as comments.
int list_tcp_devices(const std::string& target) {
  warpfs::nvme::TcpOptions o;
  std::string err;
  if (!warpfs::nvme::parse_discovery_target(target, &o, &err)) {
    std::fprintf(stderr, "warpfs: --list-devices %s\n", err.c_str());
    return 1;
  }
  std::vector<warpfs::nvme::DiscoveryEntry> entries;
  if (!warpfs::nvme::TcpTransport::discover(o, &entries, &err)) {
    std::fprintf(stderr, "warpfs: %s\n", err.c_str());
    return 1;
  }
  for (const warpfs::nvme::DiscoveryEntry& e : entries) {
    const std::string name = warpfs::nvme::discovery_device_name(e);
    if (!name.empty()) {
      std::printf("%s\n", name.c_str());
      continue;
    }
    const char* what = e.subtype == 1   ? "referral to a discovery service"
                       : e.subtype == 3 ? "discovery subsystem"
                       : e.subtype == 2 ? "NVM subsystem"
                                        : "entry";
    std::printf("# %s %s at %s %s (transport type %u, address family %u)\n", what, e.subnqn.c_str(),
                e.traddr.c_str(), e.trsvcid.c_str(), e.trtype, e.adrfam);
  }
  return 0;
}

// --list-devices: the table of `warpfs-pci list`.
int list_devices() {
#ifdef WARPFS_HAVE_LIBPCI
  std::vector<warpfs::nvme::pci::NvmeFunction> fns;
  std::string err;
  if (!warpfs::nvme::pci::list_nvme(warpfs::nvme::pci::Roots{}, &fns, &err)) {
    std::fprintf(stderr, "warpfs: %s\n", err.c_str());
    return 1;
  }
  std::fputs(warpfs::nvme::pci::format_table(fns).c_str(), stdout);
  return 0;
#else
  std::fprintf(stderr,
               "warpfs: built without libpci: --list-devices is not available (install "
               "libpci-dev and rebuild)\n");
  return 1;
#endif
}

}  // namespace

// The superblock's default mount options (tune.warpfs -o) for what the command line left
// unset. A list this daemon cannot parse is named and ignored: the mount goes on with the
// built-in defaults. A damaged primary superblock is left to the mount (which falls back on
// the backup) and gives no defaults.
void apply_default_options(warpfs::blockdev::BlockDevice& dev, Options* o) {
  warpfs::fs::DefaultMountOptions d;
  if (dev.block_bytes() == warpfs::fs::kBlockSize) {
    auto sb = std::make_unique<warpfs::fs::Superblock>();
    if (dev.read(0, 1, sb.get()).is_ok() && sb->magic == warpfs::fs::kMagic &&
        sb->checksum == warpfs::fs::superblock_checksum(*sb)) {
      const std::string list = warpfs::fs::default_mount_options(*sb);
      if (std::string why = warpfs::fs::parse_default_mount_options(list, &d); !why.empty()) {
        log_line("the superblock's default mount options are ignored: " + why);
        d = {};
      }
    }
  }
  if (o->ro < 0) o->ro = d.read_only.value_or(false) ? 1 : 0;
  if (o->discard < 0) o->discard = d.discard.value_or(true) ? 1 : 0;
  if (o->meta_cache_mb == kMetaCacheUnset) o->meta_cache_mb = d.meta_cache_mb.value_or(32);
}

int main(int argc, char** argv) {
  fuse_args args = FUSE_ARGS_INIT(argc, argv);
  Options o;
  if (fuse_opt_parse(&args, &o, kOpts, opt_proc) != 0) return 1;
  if (o.help) {
    usage(argv[0]);
    fuse_opt_free_args(&args);
    return 0;
  }
  if (o.version) {
    std::printf("warpfs %s (libfuse %s)\n", WARPFS_VERSION, fuse_pkgversion());
    free(o.device);
    fuse_opt_free_args(&args);
    return 0;
  }
  if (o.list_devices) {
    const std::string target = o.device != nullptr ? o.device : "";
    free(o.device);
    fuse_opt_free_args(&args);
    return target.empty() ? list_devices() : list_tcp_devices(target);
  }
  const bool threads_given = warpfs::daemon::max_threads_given(&args);
  fuse_cmdline_opts cl{};
  if (fuse_parse_cmdline(&args, &cl) != 0) return 1;
  if (o.device == nullptr || cl.mountpoint == nullptr) {
    usage(argv[0]);
    return 1;
  }
  if (o.remount) return remount_helper(cl.mountpoint, o.ro == 1);
  if (o.writeback_cache && (cl.singlethread || (threads_given && cl.max_threads < 2))) {
    // A request may wait for the kernel to write pages back (op_lseek), which takes another
    // worker.
    std::fprintf(stderr, "warpfs: writeback_cache needs two worker threads or more: not used\n");
    o.writeback_cache = 0;
  }
  if (o.writeback_cache && o.uring.on) {
    // Under the writeback cache a request routinely waits for pages to be written back
    // (op_lseek, a direct write's invalidation): over the ring that write-back would wait
    // for a free entry of the same CPU's queue, of which there are only io_uring_depth
    // (fs/daemon/fuse_uring.h).
    std::fprintf(stderr,
                 "warpfs: io_uring is not used with writeback_cache: requests stay on /dev/fuse\n");
    o.uring.on = 0;
  }
  // One emulated controller thread per queue pair, as a controller serves its queues side by
  // side: with one for all, the FUSE workers' inline runs of the device (inline_io) waited for
  // each other on its lock and handed their commands to its thread, a sleep and a wake-up
  // each (QD32 O_DIRECT 4 KiB reads and writes through the mount 1.13-1.30x on 2 cores).
  if (o.workers == kWorkersUnset) o.workers = o.queues;
  if (o.queues == 0 || o.queues > 64 || o.workers == 0 || o.workers > 64 || o.commit_s == 0 ||
      (o.commit_s > 86400 && o.commit_s != kCommitUnset)) {
    std::fprintf(stderr, "warpfs: queues and workers must be 1..64, commit 1..86400 seconds\n");
    return 1;
  }
  if (!(o.timeout_s >= 0 && o.timeout_s <= 1e9)) {
    std::fprintf(stderr, "warpfs: timeout must be 0..1000000000 seconds\n");
    return 1;
  }
  // Permissions are checked by the kernel; the daemon names itself in /proc/mounts, an
  // emulated image by its absolute path (so that mkfs and fsck recognise it as mounted
  // whatever directory they run in: blockdev::warpfs_mount_of_image).
  const std::string named = warpfs::blockdev::absolute_device_name(o.device);
  // libfuse splits -o values at commas: a DEVICE such as vfio:...,ns=2 keeps its comma escaped.
  std::string escaped;
  for (const char* c = named.c_str(); *c; ++c) {
    if (*c == ',' || *c == '\\') escaped += '\\';
    escaped += *c;
  }
  const std::string fsname = "-ofsname=" + escaped + ",subtype=warpfs,default_permissions";
  fuse_opt_add_arg(&args, fsname.c_str());

  // SIGTERM, SIGINT and SIGHUP must reach the thread that runs the FUSE loop (libfuse's
  // handler ends the loop from there): block them in every thread the stack and the
  // filesystem start, and unblock them in this one just before the loop.
  sigset_t stop_signals, old_mask;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &old_mask);

  // Daemonize before the device stack starts its threads (a fork keeps only the caller's),
  // but report failures of the mount to the caller: the child writes one status byte.
  int status_pipe[2] = {-1, -1};
  if (!cl.foreground) {
    if (pipe(status_pipe) != 0) return 1;
    const pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid > 0) {
      close(status_pipe[1]);
      char st = 1;
      if (::read(status_pipe[0], &st, 1) != 1) st = 1;
      return st;
    }
    close(status_pipe[0]);
    setsid();
  }
  auto report_ready = [&](char st) {
    if (status_pipe[1] < 0) return;
    if (::write(status_pipe[1], &st, 1) != 1) {
      // The parent is gone: nothing to tell.
    }
    close(status_pipe[1]);
    status_pipe[1] = -1;
  };

  Daemon d;
  d.timeout = o.timeout_s;
  d.want_writeback_cache = o.writeback_cache != 0;
  d.stats_path = o.stats ? o.stats : "";
  if (!d.stats_path.empty()) {
    if (std::string why = check_stats_path(d.stats_path); !why.empty()) {
      std::fprintf(stderr, "warpfs: stats=%s: %s: refused\n", d.stats_path.c_str(), why.c_str());
      report_ready(1);
      return 1;
    }
  }
  warpfs::blockdev::StackOptions so;
  so.io_queues = static_cast<uint16_t>(o.queues);
  so.emulated.latency_ns = o.latency_us * 1000;
  so.emulated.worker_threads = o.workers;
  so.emulated.inline_io = o.inline_io != 0;
  so.emulated.cache_in_store = o.vwc_model == 0;
  // SIGTERM/SIGINT/SIGHUP end the FUSE loop and unmount cleanly (libfuse installs its handlers
  // only where the disposition is still the default, so the transport must leave them).
  so.vfio.teardown_on_signal = false;
  so.io_timeout_ns = uint64_t{o.io_timeout_s} * 1'000'000'000ull;
  so.log = [](const std::string& s) { log_line("nvme: " + s); };
  so.block_bytes = warpfs::fs::kBlockSize;
  so.cache_mb = o.cache_mb;
  std::string err;
  d.stack = warpfs::blockdev::DeviceStack::open(o.device, so, &err);
  if (!d.stack) {
    std::fprintf(stderr, "warpfs: %s\n", err.c_str());
    report_ready(1);
    return 1;
  }
  warpfs::blockdev::BlockDevice* dev = &d.stack->device();
  d.read_buffers.set_device(dev);
  apply_default_options(*dev, &o);
  if (o.ro == 1) fuse_opt_add_arg(&args, "-oro");  // also where only the superblock said so
  warpfs::fs::MountOptions mo;
  mo.read_only = o.ro == 1;
  mo.discard = o.discard != 0;
  mo.commit_interval_ms =
      o.commit_s == kCommitUnset ? 0 : o.commit_s * 1000;  // 0: the superblock's
  mo.meta_cache_mb = o.meta_cache_mb;
  mo.log = log_line;
  d.fs = Filesystem::mount(*dev, mo, &err);
  if (!d.fs) {
    std::fprintf(stderr, "warpfs: %s: %s\n", o.device, err.c_str());
    report_ready(1);
    return 1;
  }

  const fuse_lowlevel_ops ops = make_ops();
  fuse_set_log_func(log_fuse);
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, &d);
  d.se = se;
  int rc = 1;
  bool looped = false;  // the session loop ran: rc is its result
  if (se != nullptr) {
    if (fuse_set_signal_handlers(se) == 0) {
      g_dump_fd = eventfd(0, EFD_CLOEXEC);
      if (g_dump_fd >= 0) signal(SIGUSR1, on_usr1);
      if (fuse_session_mount(se, cl.mountpoint) == 0) {
        report_ready(0);
        if (!cl.foreground) {
          // Detached: stdio to /dev/null, as fuse_daemonize() would.
          if (chdir("/") != 0) {
            // stays where it was
          }
          openlog("warpfs", LOG_PID, LOG_DAEMON);
          g_detached = true;
          const int nul = ::open("/dev/null", O_RDWR);
          if (nul >= 0) {
            dup2(nul, 0);
            dup2(nul, 1);
            dup2(nul, 2);
            if (nul > 2) close(nul);
          }
        }
        std::string mounted_at = cl.mountpoint;
        if (char* abs = realpath(cl.mountpoint, nullptr)) {
          mounted_at = abs;
          free(abs);
        }
        const int follow_stop = eventfd(0, EFD_CLOEXEC);
        std::thread follower([&] {
          if (follow_stop >= 0) follow_remounts(*d.fs, mounted_at, follow_stop);
        });
        std::string live_path;
        const int live_fd = open_live_socket(mounted_at, &live_path);
        std::thread live([&] {
          if (live_fd >= 0 && follow_stop >= 0) serve_live_view(d, live_fd, follow_stop);
        });
        std::atomic<bool> done{false};
        // -o dedup: one pass beside the requests, stopped by the unmount.
        std::thread deduper([&] {
          if (!o.dedup) return;
          {
            std::lock_guard<std::mutex> g(d.dedup_mu);
            d.dedup_state = "running";
          }
          warpfs::fs::DedupOptions dopt;
          dopt.table_mb = o.dedup_table_mb;
          dopt.stop = [&] { return done.load() || d.fs->read_only(); };
          warpfs::fs::DedupReport r;
          const int drc = d.fs->dedup(dopt, &r);
          std::lock_guard<std::mutex> g(d.dedup_mu);
          d.dedup_report = r;
          d.dedup_state = drc           ? std::string("failed: ") + std::strerror(drc)
                          : done.load() ? "stopped"
                                        : "done";
          log_line("dedup " + d.dedup_state + ": " + std::to_string(r.files) + " files, " +
                   std::to_string(r.blocks_shared) + " blocks shared in " +
                   std::to_string(r.seconds) + " s");
        });
        std::thread dumper([&] {
          uint64_t n = 0;
          while (::read(g_dump_fd, &n, sizeof n) == sizeof n || errno == EINTR) {
            if (done) break;
            write_stats(d);
          }
        });
        // Reads answered as their commands complete, except over io_uring, whose answers
        // go back on the thread that took the request (fuse_uring.h). Started, as the threads
        // above, with the stop signals blocked: they go to the session loop's threads.
        const unsigned reapers = o.async_reads == kAsyncReadsUnset
                                     ? warpfs::daemon::default_read_reapers()
                                     : std::min(o.async_reads, 64u);
        if (reapers != 0 && o.uring.on == 0) {
          d.reaper = std::make_unique<warpfs::daemon::ReadReaper>();
          d.reaper->start(reapers);
        }
        pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
        looped = true;
        // Receive buffers in the device's DMA memory: a large write's data moves from there
        // to the device with no bounce copy (NamespaceIo takes PRP1 at its offset).
        warpfs::daemon::ReceiveMemory mem;
        mem.ctx = dev;
        mem.alloc = [](void* ctx, size_t bytes) -> void* {
          void* p = nullptr;
          auto* bd = static_cast<warpfs::blockdev::BlockDevice*>(ctx);
          return bd->alloc_io_buffer(bytes, &p).is_ok() ? p : nullptr;
        };
        mem.free = [](void* ctx, void* p, size_t bytes) {
          static_cast<warpfs::blockdev::BlockDevice*>(ctx)->free_io_buffer(p, bytes);
        };
        // A handler waits out its device command on its thread where the device takes tens
        // of microseconds per command (a drive, or the emulation with a latency model) and no
        // reaper answers the read: more threads by default then, so that the commands overlap.
        const unsigned default_threads =
            warpfs::daemon::default_worker_threads(d.stack->prompt(), d.reaper ? reapers : 0);
        const bool shared_fd = o.shared_fd == kSharedFdUnset
                                   ? warpfs::daemon::default_shared_fd(d.stack->prompt())
                                   : o.shared_fd != 0;
        rc = warpfs::daemon::run_session_loop(se, cl, threads_given, mem, o.uring, default_threads,
                                              shared_fd);
        if (d.reaper != nullptr) d.reaper->stop();  // every read answered: the workers ended
        // A second Ctrl-C or SIGTERM must not cut the unmount below short.
        pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
        const uint64_t stop_one = 1;  // the eventfd stays readable: it stops both threads
        if (follow_stop >= 0 &&
            ::write(follow_stop, &stop_one, sizeof stop_one) == sizeof stop_one) {
          follower.join();  // no remount after this: unmount() comes next
          live.join();
        } else {
          follower.detach();
          live.detach();
        }
        if (live_fd >= 0) {
          ::close(live_fd);
          ::unlink(live_path.c_str());
        }
        if (follow_stop >= 0) ::close(follow_stop);
        done = true;
        deduper.join();
        const uint64_t one = 1;
        if (::write(g_dump_fd, &one, sizeof one) != sizeof one) {
          dumper.detach();  // cannot happen with an eventfd; never block the unmount on it
        } else {
          dumper.join();
        }
        fuse_session_unmount(se);
      }
      fuse_remove_signal_handlers(se);
    }
    fuse_session_destroy(se);
  }
  report_ready(1);  // no-op after success: the mount itself failed
  // Everything to the device, the superblock clean (also after SIGTERM / fusermount3 -u).
  // The loop returns the number of the signal that ended it (SIGTERM, SIGINT, SIGHUP): a
  // normal way to stop, like fusermount3 -u.
  // (Only then: a failure before the loop leaves rc = 1, which is also SIGHUP's number.)
  if (looped && (rc == SIGTERM || rc == SIGINT || rc == SIGHUP)) rc = 0;
  const int urc = d.fs->unmount();
  write_stats(d);
  if (urc != 0) {
    std::fprintf(stderr, "warpfs: %s: unmount failed (%s); run fsck.warpfs\n", o.device,
                 std::strerror(urc));
    rc = 1;
  }
  d.fs.reset();
  d.read_buffers.clear();  // the workers have ended: no lease is out
  // unmount() flushed the cache when it worked; after a failed one, try once more.
  if (const warpfs::blockdev::Status s = d.stack->device().flush(); !s.is_ok()) {
    std::fprintf(stderr, "warpfs: %s: flush at exit failed: %s\n", o.device, s.to_string().c_str());
    rc = 1;
  }
  d.stack.reset();
  free(cl.mountpoint);
  free(o.device);
  fuse_opt_free_args(&args);
  return rc ? 1 : 0;
}
