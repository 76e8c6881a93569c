// warpfs-null [FUSE options] MOUNTPOINT: a FUSE daemon that stores nothing, the ceiling of
// the FUSE transport beside warpfs in `bench/run fs`. Reads answer zeros from memory up to
// the file's size, writes are dropped (answered with their size, the size grows), fsync and
// flush do nothing. Just enough namespace for fio: files and directories can be created,
// looked up, listed and removed; sizes are tracked so that fio's layout and its reads of a
// written range work. Everything is lost at unmount.
//
// What it shares with warpfs (fs/daemon/warpfs_main.cc) so that it measures the same
// transport: the connection's options and the session loop, from fs/daemon/fuse_session.h
// (max_write 1 MiB, no writeback cache, no splice reads, the asynchronous queue's depth, the
// worker threads; export support and POSIX ACLs off here: they change no data-path request),
// warpfs's default entry and attribute timeouts, the mount options (default_permissions),
// O_DIRECT opens answered with FOPEN_DIRECT_IO and other opens with keep_cache, no FLUSH
// handler (the kernel stops sending it after the first ENOSYS, as for warpfs), GETXATTR
// answered (ENODATA) as warpfs answers it, and FUSE_HANDLE_KILLPRIV_V2 from the same session
// loop (answer_init; this daemon stores no mode bits, so it has none to drop). A change to
// the handlers' side of these in warpfs_main.cc must be made here too.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fuse_session.h"  // fs/daemon: warpfs's connection options and session loop

namespace {

constexpr double kTimeoutS = warpfs::daemon::kDefaultTimeoutS;  // warpfs's default timeout
constexpr size_t kZeroBytes = size_t{1} << 20;  // one read may reference it several times

// One file or directory. The fuse inode number is the Node's address (the root's is
// FUSE_ROOT_ID), so the data path finds it without a table. Nodes are never freed before
// the daemon exits: a number the kernel still holds cannot dangle, and a benchmark's files
// number thousands.
struct Node {
  Node(mode_t m, uid_t u, gid_t g) : type(m & S_IFMT), perm(m & 07777), uid(u), gid(g) {
    clock_gettime(CLOCK_REALTIME, &time);
  }
  const mode_t type;  // S_IFREG or S_IFDIR, for the node's life
  // Read and written by every worker without a lock: only its own value matters (writes
  // extend it with a CAS loop, so concurrent extensions keep the largest end).
  std::atomic<uint64_t> size{0};
  // Guarded by attr_mu: the attributes setattr may change.
  std::mutex attr_mu;
  mode_t perm;
  uid_t uid;
  gid_t gid;
  timespec time{};  // atime, mtime and ctime alike
  // Guarded by the namespace lock (g_ns_mu): a directory's entries and a node's link count.
  std::map<std::string, Node*> children;
  nlink_t nlink = 1;
};

// Protects every directory's children and every nlink. Taken alone (attr_mu is never held
// with it), so there is no order to keep.
std::mutex g_ns_mu;
// Owns every Node (guarded by g_ns_mu); the root is the first.
std::vector<std::unique_ptr<Node>> g_nodes;
Node* g_root = nullptr;
const char g_zeros[kZeroBytes] = {};

Node* node_of(fuse_ino_t ino) {
  return ino == FUSE_ROOT_ID ? g_root : reinterpret_cast<Node*>(ino);
}
fuse_ino_t ino_of(const Node* n) {
  return n == g_root ? FUSE_ROOT_ID : reinterpret_cast<fuse_ino_t>(n);
}

void fill_stat(Node* n, struct stat* st) {
  std::memset(st, 0, sizeof *st);
  st->st_ino = ino_of(n);
  st->st_size = static_cast<off_t>(n->size.load(std::memory_order_relaxed));
  st->st_blksize = 4096;
  st->st_blocks = (st->st_size + 511) / 512;
  {
    std::lock_guard<std::mutex> g(n->attr_mu);
    st->st_mode = n->type | n->perm;
    st->st_uid = n->uid;
    st->st_gid = n->gid;
    st->st_atim = st->st_mtim = st->st_ctim = n->time;
  }
  std::lock_guard<std::mutex> g(g_ns_mu);
  st->st_nlink = n->nlink;
}

fuse_entry_param entry_of(Node* n) {
  fuse_entry_param e{};
  e.ino = ino_of(n);
  e.attr_timeout = kTimeoutS;
  e.entry_timeout = kTimeoutS;
  fill_stat(n, &e.attr);
  return e;
}

void reply_entry(fuse_req_t req, Node* n) {
  const fuse_entry_param e = entry_of(n);
  fuse_reply_entry(req, &e);
}

// Grows a file's size to END (never shrinks it: writers race, the largest end wins).
void extend(Node* n, uint64_t end) {
  uint64_t cur = n->size.load(std::memory_order_relaxed);
  while (cur < end && !n->size.compare_exchange_weak(cur, end, std::memory_order_relaxed)) {
  }
}

// A new node named NAME in directory PARENT; 0 or an errno.
int make_node(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, Node** out) {
  const fuse_ctx* c = fuse_req_ctx(req);
  Node* dir = node_of(parent);
  if (!S_ISDIR(dir->type)) return ENOTDIR;
  auto n = std::make_unique<Node>(mode & ~c->umask, c->uid, c->gid);
  std::lock_guard<std::mutex> g(g_ns_mu);
  if (dir->children.count(name)) return EEXIST;
  if (S_ISDIR(mode)) {
    n->nlink = 2;
    ++dir->nlink;
  }
  *out = n.get();
  dir->children.emplace(name, n.get());
  g_nodes.push_back(std::move(n));
  return 0;
}

// Removes NAME from PARENT if it is a directory (DIR) or not; 0 or an errno.
int remove_node(fuse_ino_t parent, const char* name, bool dir) {
  Node* p = node_of(parent);
  std::lock_guard<std::mutex> g(g_ns_mu);
  auto it = p->children.find(name);
  if (it == p->children.end()) return ENOENT;
  Node* n = it->second;
  if (dir != S_ISDIR(n->type)) return dir ? ENOTDIR : EISDIR;
  if (dir && !n->children.empty()) return ENOTEMPTY;
  p->children.erase(it);
  n->nlink = 0;
  if (dir) --p->nlink;
  return 0;
}

// FOPEN_PARALLEL_DIRECT_WRITES on O_DIRECT opens, as warpfs: set by op_init before any other
// request, read by every worker after.
std::atomic<bool> g_parallel_direct_writes{false};

void op_init(void*, fuse_conn_info* conn) {
  warpfs::daemon::negotiate(conn, false);  // no writeback cache: warpfs's default
  g_parallel_direct_writes.store(warpfs::daemon::takes_parallel_direct_writes(conn),
                                 std::memory_order_relaxed);
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Node* n = nullptr;
  {
    std::lock_guard<std::mutex> g(g_ns_mu);
    const Node* p = node_of(parent);
    auto it = p->children.find(name);
    if (it != p->children.end()) n = it->second;
  }
  if (n == nullptr) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  reply_entry(req, n);
}

void op_forget(fuse_req_t req, fuse_ino_t, uint64_t) {
  fuse_reply_none(req);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  struct stat st;
  fill_stat(node_of(ino), &st);
  fuse_reply_attr(req, &st, kTimeoutS);
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  Node* n = node_of(ino);
  if (to_set & FUSE_SET_ATTR_SIZE) {
    if (S_ISDIR(n->type)) {
      fuse_reply_err(req, EISDIR);
      return;
    }
    n->size.store(static_cast<uint64_t>(attr->st_size), std::memory_order_relaxed);
  }
  {
    std::lock_guard<std::mutex> g(n->attr_mu);
    if (to_set & FUSE_SET_ATTR_MODE) n->perm = attr->st_mode & 07777;
    if (to_set & FUSE_SET_ATTR_UID) n->uid = attr->st_uid;
    if (to_set & FUSE_SET_ATTR_GID) n->gid = attr->st_gid;
    if (to_set & FUSE_SET_ATTR_MTIME) n->time = attr->st_mtim;
    if (to_set & (FUSE_SET_ATTR_MTIME_NOW | FUSE_SET_ATTR_SIZE))
      clock_gettime(CLOCK_REALTIME, &n->time);
  }
  struct stat st;
  fill_stat(n, &st);
  fuse_reply_attr(req, &st, kTimeoutS);
}

void op_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t) {
  if (!S_ISREG(mode)) {
    fuse_reply_err(req, EPERM);  // files and directories only
    return;
  }
  Node* n = nullptr;
  if (int rc = make_node(req, parent, name, mode, &n); rc) {
    fuse_reply_err(req, rc);
    return;
  }
  reply_entry(req, n);
}

void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  Node* n = nullptr;
  if (int rc = make_node(req, parent, name, S_IFDIR | (mode & 07777), &n); rc) {
    fuse_reply_err(req, rc);
    return;
  }
  reply_entry(req, n);
}

void op_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, remove_node(parent, name, false));
}

void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, remove_node(parent, name, true));
}

// As warpfs's set_cache_mode: O_DIRECT opens bypass the page cache, others keep it.
void set_cache_mode(fuse_file_info* fi) {
  if (fi->flags & O_DIRECT) {
    fi->direct_io = 1;
  } else {
    fi->keep_cache = 1;
  }
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (S_ISDIR(node_of(ino)->type)) {
    fuse_reply_err(req, EISDIR);
    return;
  }
  set_cache_mode(fi);
  warpfs::daemon::reply_open(req, fi, g_parallel_direct_writes.load(std::memory_order_relaxed));
}

void op_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
               fuse_file_info* fi) {
  Node* n = nullptr;
  if (int rc = make_node(req, parent, name, S_IFREG | (mode & 07777), &n); rc) {
    fuse_reply_err(req, rc);
    return;
  }
  const fuse_entry_param e = entry_of(n);
  set_cache_mode(fi);
  warpfs::daemon::reply_create(req, e, fi,
                               g_parallel_direct_writes.load(std::memory_order_relaxed));
}

// Zeros up to the file's end, from one static buffer referenced as often as the size needs.
void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  const uint64_t end = node_of(ino)->size.load(std::memory_order_relaxed);
  const uint64_t start = static_cast<uint64_t>(off);
  size_t left = start >= end ? 0 : static_cast<size_t>(std::min<uint64_t>(size, end - start));
  iovec iov[16];
  int n = 0;
  while (left > 0 && n < 16) {
    iov[n].iov_base = const_cast<char*>(g_zeros);
    iov[n].iov_len = std::min(left, kZeroBytes);
    left -= iov[n++].iov_len;
  }
  fuse_reply_iov(req, iov, n);  // a read over 16 MiB (never sent: max_pages) comes back short
}

void op_write(fuse_req_t req, fuse_ino_t ino, const char*, size_t size, off_t off,
              fuse_file_info*) {
  extend(node_of(ino), static_cast<uint64_t>(off) + size);
  fuse_reply_write(req, size);
}

void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, fuse_file_info*) {
  if (mode != 0) {
    fuse_reply_err(req, EOPNOTSUPP);
    return;
  }
  extend(node_of(ino), static_cast<uint64_t>(off + len));
  fuse_reply_err(req, 0);
}

void op_reply_ok(fuse_req_t req, fuse_ino_t, fuse_file_info*) {
  fuse_reply_err(req, 0);
}
void op_fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  fuse_reply_err(req, 0);
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (!S_ISDIR(node_of(ino)->type)) {
    fuse_reply_err(req, ENOTDIR);
    return;
  }
  fuse_reply_open(req, fi);
}

// Entries in name order; an entry's offset is its index + 1 in that order, so a directory
// that changes between calls may skip or repeat a name (enough for a benchmark).
void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  std::vector<char> buf(size);
  size_t pos = 0;
  Node* dir = node_of(ino);
  std::lock_guard<std::mutex> g(g_ns_mu);
  off_t i = 0;
  auto add = [&](const char* name, const Node* n) {
    ++i;
    if (i <= off) return true;
    struct stat st {};
    st.st_ino = ino_of(n);
    st.st_mode = n->type;
    const size_t need = fuse_add_direntry(req, buf.data() + pos, size - pos, name, &st, i);
    if (need > size - pos) return false;
    pos += need;
    return true;
  };
  if (add(".", dir) && add("..", dir)) {
    for (const auto& [name, n] : dir->children) {
      if (!add(name.c_str(), n)) break;
    }
  }
  fuse_reply_buf(req, buf.data(), pos);
}

void op_fsyncdir(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  fuse_reply_err(req, 0);
}

void op_statfs(fuse_req_t req, fuse_ino_t) {
  struct statvfs st {};
  st.f_bsize = st.f_frsize = 4096;
  st.f_blocks = st.f_bfree = st.f_bavail = uint64_t{1} << 40 >> 12;  // 1 TiB, always free
  st.f_files = st.f_ffree = st.f_favail = uint64_t{1} << 32;
  st.f_namemax = 255;
  fuse_reply_statfs(req, &st);
}

void op_getxattr(fuse_req_t req, fuse_ino_t, const char*, size_t) {
  fuse_reply_err(req, ENODATA);
}

void op_listxattr(fuse_req_t req, fuse_ino_t, size_t size) {
  if (size == 0) {
    fuse_reply_xattr(req, 0);
  } else {
    fuse_reply_buf(req, nullptr, 0);
  }
}

fuse_lowlevel_ops make_ops() {
  fuse_lowlevel_ops o{};
  o.init = op_init;
  o.lookup = op_lookup;
  o.forget = op_forget;
  o.getattr = op_getattr;
  o.setattr = op_setattr;
  o.mknod = op_mknod;
  o.mkdir = op_mkdir;
  o.unlink = op_unlink;
  o.rmdir = op_rmdir;
  o.open = op_open;
  o.create = op_create;
  o.read = op_read;
  o.write = op_write;
  o.release = op_reply_ok;  // no flush: as warpfs
  o.fsync = op_fsync;
  o.opendir = op_opendir;
  o.readdir = op_readdir;
  o.releasedir = op_reply_ok;
  o.fsyncdir = op_fsyncdir;
  o.statfs = op_statfs;
  o.getxattr = op_getxattr;
  o.listxattr = op_listxattr;
  o.fallocate = op_fallocate;
  return o;
}

void usage(const char* prog) {
  std::printf(
      "usage: %s [-f] [-s] [-o "
      "clone_fd,max_threads=N,max_idle_threads=N,io_uring,io_uring_depth=N,io_uring_cpu,"
      "shared_fd=0|1]\n"
      "       MOUNTPOINT\n"
      "A FUSE filesystem that stores nothing (reads give zeros, writes are dropped): the\n"
      "FUSE transport's ceiling beside warpfs, with warpfs's connection options and thread\n"
      "configuration. See bench/README.md.\n",
      prog);
}

}  // namespace

int main(int argc, char** argv) {
  fuse_args args = FUSE_ARGS_INIT(argc, argv);
  const bool threads_given = warpfs::daemon::max_threads_given(&args);
  // -o io_uring[,io_uring_depth=N,io_uring_cpu]: FUSE over io_uring (fs/daemon/fuse_uring.h),
  // and -o shared_fd=0|1 (one /dev/fuse descriptor for all workers, or one each), as warpfs
  // takes them; shared by default, as warpfs has it with a device that answers at once.
  struct {
    warpfs::daemon::UringOptions uring;
    unsigned shared_fd = 1;
  } o;
  using NullOptions = decltype(o);
  const fuse_opt null_opts[] = {WARPFS_URING_OPTS(NullOptions),
                                {"shared_fd=%u", offsetof(NullOptions, shared_fd), 0},
                                FUSE_OPT_END};
  if (fuse_opt_parse(&args, &o, null_opts, nullptr) != 0) return 1;
  fuse_cmdline_opts cl{};
  if (fuse_parse_cmdline(&args, &cl) != 0) return 1;
  if (cl.show_help || cl.show_version || cl.mountpoint == nullptr) {
    usage(argv[0]);
    free(cl.mountpoint);
    fuse_opt_free_args(&args);
    return cl.mountpoint == nullptr && !cl.show_help && !cl.show_version ? 1 : 0;
  }
  fuse_opt_add_arg(&args, "-ofsname=warpfs-null,subtype=warpfs-null,default_permissions");
  g_nodes.push_back(std::make_unique<Node>(S_IFDIR | 0755, getuid(), getgid()));
  g_root = g_nodes.back().get();
  g_root->nlink = 2;

  const fuse_lowlevel_ops ops = make_ops();
  int rc = 1;
  bool looped = false;  // the session loop ran: rc is its result
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, nullptr);
  if (se != nullptr) {
    if (fuse_set_signal_handlers(se) == 0) {
      if (fuse_session_mount(se, cl.mountpoint) == 0) {
        if (fuse_daemonize(cl.foreground) == 0) {
          looped = true;
          rc = warpfs::daemon::run_session_loop(se, cl, threads_given, {}, o.uring, 0,
                                                o.shared_fd != 0);
        }
        fuse_session_unmount(se);
      }
      fuse_remove_signal_handlers(se);
    }
    fuse_session_destroy(se);
  }
  free(cl.mountpoint);
  fuse_opt_free_args(&args);
  // The loop returns the signal that ended it (SIGTERM, SIGINT, SIGHUP): a normal stop. (Only
  // then: a failure before the loop leaves rc = 1, which is also SIGHUP's number.)
  if (looped && (rc == SIGTERM || rc == SIGINT || rc == SIGHUP)) rc = 0;
  return rc ? 1 : 0;
}
