// crash_harness.h's operations as syscalls on a mount (syscall_ops.h).
#include "tools/syscall_ops.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace warpfs::fs::mounted {

namespace {

using crash::Id;
using crash::MNode;
using crash::Model;
using crash::Op;
using crash::OpKind;

constexpr uint64_t kB = 4096;

std::string dirname_of(const std::string& path) {
  const size_t s = path.rfind('/');
  return s == 0 ? "/" : path.substr(0, s);
}
std::string basename_of(const std::string& path) {
  return path.substr(path.rfind('/') + 1);
}

// SIGBUS of a mapping access: back to the guarded copy, which fails. Volatile, and fenced
// around the copy: otherwise the compiler may drop the store before the memcpy as dead (the
// memcpy does not read it) and the handler finds nothing to jump to.
thread_local sigjmp_buf* volatile g_bus_jump = nullptr;

void on_sigbus(int sig) {
  if (g_bus_jump != nullptr) siglongjmp(*g_bus_jump, 1);
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

// A SIGBUS (a mapped page the daemon could not provide, or one a truncate took away) is false.
bool guarded_memcpy(void* dst, const void* src, size_t n) {
  sigjmp_buf jb;
  if (sigsetjmp(jb, 1) != 0) {
    g_bus_jump = nullptr;
    return false;
  }
  g_bus_jump = &jb;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  g_bus_jump = nullptr;
  return true;
}

namespace {

// A block-aligned buffer (O_DIRECT).
struct Aligned {
  explicit Aligned(size_t n) {
    if (posix_memalign(&p, kB, std::max<size_t>(n, kB)) != 0) p = nullptr;
  }
  ~Aligned() { std::free(p); }
  void* p = nullptr;
};

}  // namespace

void install_sigbus_guard() {
  struct sigaction sa {};
  sa.sa_handler = on_sigbus;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
}

int SyscallRunner::write(int fd, const Op& op, const std::string& data) {
  if (op.via == crash::Via::kMmap) {
    const uint64_t start = op.off - op.off % kB, len = op.off + op.len - start;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
    if (p == MAP_FAILED) return errno;
    int rc = 0;
    if (!guarded_memcpy(static_cast<char*>(p) + (op.off - start), data.data(), op.len)) {
      rc = EIO;
    } else if (msync(p, len, MS_SYNC) != 0) {
      rc = errno;
    }
    munmap(p, len);
    return rc;
  }
  const char* src = data.data();
  Aligned buf(op.via == crash::Via::kDirect ? op.len : 0);
  if (op.via == crash::Via::kDirect) {
    if (buf.p == nullptr) return ENOMEM;
    std::memcpy(buf.p, data.data(), op.len);
    src = static_cast<const char*>(buf.p);
  }
  for (uint64_t done = 0; done < op.len;) {
    const ssize_t n = pwrite(fd, src + done, op.len - done, static_cast<off_t>(op.off + done));
    if (n <= 0) return n < 0 ? errno : EIO;
    done += static_cast<uint64_t>(n);
  }
  return 0;
}

int SyscallRunner::read(int fd, const Op& op, std::string* out) {
  out->clear();
  if (op.via == crash::Via::kMmap) {
    const uint64_t start = op.off - op.off % kB, len = op.off + op.len - start;
    void* p = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
    if (p == MAP_FAILED) return errno;
    out->resize(op.len);
    const bool ok = guarded_memcpy(out->data(), static_cast<char*>(p) + (op.off - start), op.len);
    munmap(p, len);
    return ok ? 0 : EIO;
  }
  Aligned buf(op.len);
  if (buf.p == nullptr) return ENOMEM;
  uint64_t done = 0;
  while (done < op.len) {
    const ssize_t n = pread(fd, static_cast<char*>(buf.p) + done, op.len - done,
                            static_cast<off_t>(op.off + done));
    if (n < 0) return errno;
    if (n == 0) break;  // end of file
    done += static_cast<uint64_t>(n);
    if (op.via == crash::Via::kDirect && done % kB) break;  // a short O_DIRECT read: the end
  }
  out->assign(static_cast<const char*>(buf.p), done);
  return 0;
}

void SyscallRunner::release_all() {
  std::vector<Id> ids;
  for (const auto& [id, v] : fds_) {
    for (size_t i = 0; i < v.size(); ++i) ids.push_back(id);
  }
  for (Id id : ids) {
    Op op;
    op.kind = OpKind::kRelease;
    op.id = id;
    int rc;
    (void)exec(op, &rc);
  }
}

bool SyscallRunner::path_of(Id id, std::string* out) const {
  for (const auto& [p, i] : m_.names()) {
    if (i == id) {
      *out = p;
      return true;
    }
  }
  return false;
}

int SyscallRunner::open_id(Id id, int flags, bool fresh, bool* temp) {
  *temp = false;
  auto it = fds_.find(id);
  const int held = it != fds_.end() && !it->second.empty() ? it->second.front() : -1;
  if (held >= 0 && !fresh) return held;
  std::string p;
  if (!path_of(id, &p)) {
    if (held < 0) return -ENOENT;                 // an unlinked inode the workload does not hold
    p = "/proc/self/fd/" + std::to_string(held);  // reopens the inode itself
  } else {
    p = path(p);
  }
  const int fd = open(p.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return -errno;
  *temp = true;
  return fd;
}

void SyscallRunner::close_all() {
  for (auto& [id, v] : fds_) {
    for (int fd : v) close(fd);
  }
  fds_.clear();
}

// Creates `path` (a file with `perm`, a directory, or a symlink to `target`); its inode
// number and mode in *ino and *mode. 0 or the errno.
int SyscallRunner::create(OpKind kind, const std::string& rel, uint32_t perm,
                          const std::string& target, Ino* ino, uint32_t* mode) {
  const std::string p = path(rel);
  struct stat st;
  if (kind == OpKind::kCreate) {
    const int fd = open(p.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, perm);
    if (fd < 0) return errno;
    const int rc = fstat(fd, &st) == 0 ? 0 : errno;
    close(fd);
    if (rc) return rc;
  } else {
    const int made =
        kind == OpKind::kMkdir ? mkdir(p.c_str(), perm) : symlink(target.c_str(), p.c_str());
    if (made != 0 || lstat(p.c_str(), &st) != 0) return errno;
  }
  *ino = st.st_ino;
  *mode = st.st_mode;
  return 0;
}

// The model side of a create, mkdir or symlink of `name` in `dir`: a new state.
std::string SyscallRunner::add_created(OpKind kind, Id dir, const std::string& name, Ino ino,
                                       uint32_t perm, const std::string& target, uint32_t mode) {
  return crash::model_create(m_, kind, dir, name, ino, perm, target, mode);
}

// Runs `op` on the mount and on the model (crash_harness.cc run_op, through syscalls).
std::string SyscallRunner::exec(const Op& op, int* rc) {
  Model& m = m_;
  *rc = 0;
  clear_pending();
  auto happened = [&] { return *rc == 0 || killed(); };
  auto sys = [&](int r) { *rc = r == 0 ? 0 : errno; };
  switch (op.kind) {
    case OpKind::kCreate:
    case OpKind::kMkdir:
    case OpKind::kSymlink:
    case OpKind::kBurst: {
      const bool burst = op.kind == OpKind::kBurst;
      Id did;
      m.resolve(burst ? op.path : dirname_of(op.path), &did);
      const std::string dpath = burst ? op.path : dirname_of(op.path);
      for (uint64_t i = 0; i < (burst ? op.len : 1); ++i) {  // one state per file
        const OpKind kind = burst ? OpKind::kCreate : op.kind;
        const std::string name =
            burst ? "p" + std::to_string(op.seed + i) + "_" + std::string(100, 'p')
                  : basename_of(op.path);
        const uint32_t perm = burst ? 0644 : op.perm;
        Ino ino = 0;
        uint32_t mode = 0;
        *rc = create(kind, (dpath == "/" ? "" : dpath) + "/" + name, perm, op.path2, &ino, &mode);
        if (*rc != 0) {
          if (killed()) pending_ = PendingCreate{true, kind, did, name, op.path2, perm};
          return "";
        }
        if (std::string bad = add_created(kind, did, name, ino, perm, op.path2, mode); !bad.empty())
          return bad;
      }
      return "";
    }
    case OpKind::kWrite: {
      const std::string data = warpfs::fs::test::pattern(op.seed, op.off, op.len);
      bool temp;
      const bool direct = op.via == crash::Via::kDirect;
      const int fd = open_id(op.id, direct ? O_WRONLY | O_DIRECT : O_RDWR, direct, &temp);
      if (fd < 0) {
        *rc = -fd;
      } else {
        *rc = write(fd, op, data);
        if (temp) close(fd);
      }
      if (happened()) crash::model_write_pieces(m, op, kB);  // a state at each page boundary
      return "";
    }
    case OpKind::kTruncate:
    case OpKind::kChmod:
    case OpKind::kSetXattr:
    case OpKind::kRemoveXattr: {
      bool temp = false;
      const bool dir = S_ISDIR(m.node(op.id)->mode);
      const int fd = open_id(op.id, dir ? O_RDONLY | O_DIRECTORY : O_RDWR, false, &temp);
      if (fd < 0) {
        *rc = -fd;
      } else if (op.kind == OpKind::kTruncate) {
        sys(ftruncate(fd, static_cast<off_t>(op.off)));
      } else if (op.kind == OpKind::kChmod) {
        sys(fchmod(fd, op.perm));
      } else if (op.kind == OpKind::kSetXattr) {
        sys(fsetxattr(fd, op.name.c_str(), op.value.data(), op.value.size(), 0));
      } else {
        sys(fremovexattr(fd, op.name.c_str()));
      }
      if (temp) close(fd);
      if (happened()) crash::model_change(m, op);
      return "";
    }
    case OpKind::kRename:
    case OpKind::kExchange:
      sys(renameat2(AT_FDCWD, path(op.path).c_str(), AT_FDCWD, path(op.path2).c_str(),
                    op.kind == OpKind::kExchange ? RENAME_EXCHANGE : op.flags));
      if (happened()) crash::model_rename(m, op);
      return "";
    case OpKind::kLink: {
      std::string src;
      if (!path_of(op.id, &src)) return "no name for #" + std::to_string(op.id);
      sys(linkat(AT_FDCWD, path(src).c_str(), AT_FDCWD, path(op.path2).c_str(), 0));
      if (happened()) crash::model_link(m, op);
      return "";
    }
    case OpKind::kUnlink:
    case OpKind::kRmdir: {
      const std::string p = path(op.path);
      sys(op.kind == OpKind::kUnlink ? unlink(p.c_str()) : rmdir(p.c_str()));
      if (happened()) crash::model_unlink(m, op);
      return "";
    }
    case OpKind::kFsync:
    case OpKind::kFdatasync: {
      bool temp;
      const bool dir = S_ISDIR(m.node(op.id)->mode);
      const int fd = open_id(op.id, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY, false, &temp);
      if (fd < 0) {
        *rc = -fd;
      } else {
        sys(op.kind == OpKind::kFsync ? fsync(fd) : fdatasync(fd));
        if (temp) close(fd);
      }
      // Acknowledged: the node's last change the call needs, and all before it, is durable.
      if (*rc == 0) m.synced(op.id, op.kind == OpKind::kFdatasync);
      return "";
    }
    case OpKind::kSync: {  // syncfs: not forwarded to a FUSE daemon, so no promise
      const int fd = open(base_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) {
        *rc = errno;
        return "";
      }
      sys(syncfs(fd));
      close(fd);
      return "";
    }
    case OpKind::kOpen: {
      std::string p;
      if (!path_of(op.id, &p)) return "no name for #" + std::to_string(op.id);
      const int fd = open(path(p).c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) {
        *rc = errno;
        return "";
      }
      fds_[op.id].push_back(fd);
      m.edit(op.id).opens += 1;
      return "";
    }
    case OpKind::kRelease: {  // FUSE_RELEASE goes asynchronously; it changes no state
      auto& v = fds_[op.id];
      if (!v.empty()) {
        close(v.back());
        v.pop_back();
      }
      crash::model_release(m, op.id);
      return "";
    }
    case OpKind::kFallocate: {
      bool temp;
      const int fd = open_id(op.id, O_RDWR, false, &temp);
      if (fd < 0) {
        *rc = -fd;
      } else {
        sys(fallocate(fd, static_cast<int>(op.flags), static_cast<off_t>(op.off),
                      static_cast<off_t>(op.len)));
        if (temp) close(fd);
      }
      if (happened()) crash::model_fallocate(m, op.id, static_cast<int>(op.flags), op.off, op.len);
      return "";
    }
    case OpKind::kRead: {
      bool temp;
      const bool direct = op.via == crash::Via::kDirect;
      const int fd = open_id(op.id, direct ? O_RDONLY | O_DIRECT : O_RDONLY, direct, &temp);
      std::string got;
      if (fd < 0) {
        *rc = -fd;
      } else {
        *rc = read(fd, op, &got);
        if (temp) close(fd);
      }
      if (*rc != 0 || killed()) return "";
      const MNode& n = *m.node(op.id);
      const uint64_t want = op.off >= n.size ? 0 : std::min<uint64_t>(op.len, n.size - op.off);
      if (got.size() != want) {
        return "read " + std::to_string(got.size()) + " bytes, expected " + std::to_string(want);
      }
      if (std::string bad = crash::check_read(n, op.off, got); !bad.empty())
        return "read back: " + bad;
      return "";
    }
    case OpKind::kClone: {
      // copy_file_range(2): the kernel sends FUSE_COPY_FILE_RANGE (after writing back both
      // ranges' cached pages) and the daemon clones; a short count means the source ended.
      const std::string data = crash::model_read(*m.node(op.id), op.off, op.len);
      bool temp_in = false, temp_out = false;
      const int in = open_id(op.id, O_RDONLY, false, &temp_in);
      const int out = in < 0 ? in : open_id(op.id2, O_WRONLY, false, &temp_out);
      uint64_t done = 0;
      if (in < 0 || out < 0) {
        *rc = in < 0 ? -in : -out;
      } else {
        loff_t off_in = static_cast<loff_t>(op.off), off_out = static_cast<loff_t>(op.off2);
        while (done < data.size()) {
          const ssize_t n = copy_file_range(in, &off_in, out, &off_out, data.size() - done, 0);
          if (n <= 0) {
            *rc = n < 0 ? errno : 0;
            break;
          }
          done += static_cast<uint64_t>(n);
        }
      }
      if (temp_in) close(in);
      if (temp_out) close(out);
      if (happened()) crash::model_bytes_pieces(m, op.id2, op.off2, data, kB);  // as a write
      if (*rc != 0 || killed()) return "";
      if (done != data.size()) {
        return "copy_file_range copied " + std::to_string(done) + " of " +
               std::to_string(data.size()) + " bytes";
      }
      // The copy reads back at once.
      Op rd;
      rd.kind = OpKind::kRead;
      rd.id = op.id2;
      rd.off = op.off2;
      rd.len = data.size();
      return exec(rd, rc);
    }
    case OpKind::kDedupe:  // FIDEDUPERANGE does not reach a FUSE daemon: nothing to do
      return "";
  }
  return "";
}

}  // namespace warpfs::fs::mounted
