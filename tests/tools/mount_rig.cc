// Child processes and a mounted tree read back with syscalls (mount_rig.h).
#include "tools/mount_rig.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

namespace warpfs::fs::mounted {

namespace {

std::string read_file(const std::string& path) {
  std::string out;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

// For clean_up_on_termination(): the daemon alive now, if any, and the paths to remove.
std::atomic<pid_t> g_daemon{-1};
char g_dir[1024], g_mnt[1100], g_img[1100], g_log[1100];

void on_terminate(int sig) {
  if (const pid_t p = g_daemon.load(); p > 0) kill(p, SIGKILL);
  umount2(g_mnt, MNT_DETACH);
  unlink(g_img);
  unlink(g_log);
  rmdir(g_mnt);
  rmdir(g_dir);
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

std::string errno_name(int e) {
  if (e == 0) return "0";
  const char* n = strerrorname_np(e);
  return n ? n : "errno " + std::to_string(e);
}

std::string last_lines(const std::string& s, size_t n) {
  size_t pos = s.size();
  if (pos > 0 && s[pos - 1] == '\n') --pos;
  while (n-- > 0 && pos > 0) {
    const size_t nl = s.rfind('\n', pos - 1);
    pos = nl == std::string::npos ? 0 : nl;
  }
  return s.substr(pos == 0 ? 0 : pos + 1);
}

pid_t spawn(const std::vector<std::string>& argv, int out_fd, std::string* error) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int p[2];  // carries exec's errno back; closed by a successful exec
  if (pipe2(p, O_CLOEXEC) != 0) {
    *error = std::string("pipe: ") + std::strerror(errno);
    return -1;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Async-signal-safe calls only until exec: the killer thread may hold locks.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent is already gone
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaction(sig, &dfl, nullptr);
    execvp(args[0], args.data());
    const int e = errno;
    if (write(p[1], &e, sizeof e) < 0) _exit(127);
    _exit(127);
  }
  close(p[1]);
  if (pid < 0) {
    close(p[0]);
    *error = std::string("fork: ") + std::strerror(errno);
    return -1;
  }
  int e = 0;
  ssize_t n;
  while ((n = read(p[0], &e, sizeof e)) < 0 && errno == EINTR) {
  }
  close(p[0]);
  if (n == sizeof e) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    *error = argv[0] + ": cannot start: " + std::strerror(e);
    return -1;
  }
  return pid;
}

int status_code(int st) {
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int run_program(const std::vector<std::string>& argv, std::string* out) {
  out->clear();
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    *out = std::string("pipe: ") + std::strerror(errno);
    return -1;
  }
  const pid_t pid = spawn(argv, p[1], out);
  close(p[1]);
  if (pid < 0) {
    close(p[0]);
    return -1;
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) != 0) {
    if (n > 0)
      out->append(buf, static_cast<size_t>(n));
    else if (errno != EINTR)
      break;
  }
  close(p[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return status_code(st);
}

Daemon::Daemon(const std::string& warpfs, const std::string& dir)
    : prog_(warpfs), dir_(dir), img_(dir + "/img"), mnt_(dir + "/mnt"), log_(dir + "/daemon.log") {}

std::string Daemon::log() const {
  return read_file(log_);
}

void Daemon::set_pid(pid_t p) {
  pid_ = p;
  g_daemon.store(p);
}

std::string Daemon::launch(const std::string& options) {
  const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return log_ + ": " + std::strerror(errno);
  std::string err;
  ended_.clear();
  set_pid(spawn({prog_, "-f", "emu:" + img_, mnt_, "-o", options}, fd, &err));
  close(fd);
  return pid_ < 0 ? err : "";
}

std::string Daemon::describe_end(int st) {
  set_pid(-1);
  ended_ = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL
               ? "killed"
               : "the daemon ended by itself (status " + std::to_string(status_code(st)) +
                     "); its log: " + last_lines(log(), 10);
  return ended_;
}

std::string Daemon::start(const std::string& options) {
  if (std::string e = launch(options); !e.empty()) return e;
  struct stat parent;
  if (stat(dir_.c_str(), &parent) != 0) return dir_ + ": " + std::strerror(errno);
  for (int i = 0; i < 3000; ++i) {  // 30 s
    struct stat st;
    if (stat(mnt_.c_str(), &st) == 0 && st.st_dev != parent.st_dev) return "";
    if (!ended().empty()) return "no mount: " + ended_;
    usleep(10000);
  }
  return "no mount after 30 s: " + last_lines(log(), 10);
}

std::string Daemon::start_and_kill(const std::string& options, uint64_t delay_us) {
  if (std::string e = launch(options); !e.empty()) return e;
  usleep(static_cast<useconds_t>(delay_us));
  kill(pid_, SIGKILL);
  std::string e = reap_killed();
  detach();
  return e;
}

std::string Daemon::ended() {
  int st = 0;
  if (pid_ > 0 && waitpid(pid_, &st, WNOHANG) == pid_) describe_end(st);
  return ended_;
}

std::string Daemon::reap_killed() {
  if (pid_ > 0) {
    int st = 0;
    while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    describe_end(st);
  }
  return ended_ == "killed" ? "" : ended_;
}

void Daemon::detach() {
  if (umount2(mnt_.c_str(), MNT_DETACH) != 0 && errno != EINVAL) {
    std::string out;
    run_program({"fusermount3", "-u", "-z", mnt_}, &out);
  }
}

std::string Daemon::unmount() {
  std::string out;
  if (int rc = run_program({"fusermount3", "-u", mnt_}, &out); rc != 0)
    return "fusermount3 -u: exit " + std::to_string(rc) + ": " + out;
  for (int i = 0; i < 3000; ++i) {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      set_pid(-1);
      if (status_code(st) == 0) return "";
      return "the daemon exited with " + std::to_string(status_code(st)) +
             " at unmount: " + last_lines(log(), 10);
    }
    usleep(10000);
  }
  return "the daemon did not exit within 30 s of the unmount";
}

void Daemon::abandon() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int st;
    while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    set_pid(-1);
  }
  detach();
}

void clean_up_on_termination(const std::string& dir) {
  std::snprintf(g_dir, sizeof g_dir, "%s", dir.c_str());
  std::snprintf(g_mnt, sizeof g_mnt, "%s/mnt", g_dir);
  std::snprintf(g_img, sizeof g_img, "%s/img", g_dir);
  std::snprintf(g_log, sizeof g_log, "%s/daemon.log", g_dir);
  signal(SIGINT, on_terminate);
  signal(SIGTERM, on_terminate);
}

// --- reading the tree through the mount ----------------------------------------------------

namespace {

std::string read_xattrs(const std::string& path, std::map<std::string, std::string>* out) {
  const ssize_t len = llistxattr(path.c_str(), nullptr, 0);
  if (len < 0) return path + ": listxattr: " + errno_name(errno);
  std::string names(static_cast<size_t>(len), '\0');
  const ssize_t got = llistxattr(path.c_str(), names.data(), names.size());
  if (got < 0) return path + ": listxattr: " + errno_name(errno);
  names.resize(static_cast<size_t>(got));
  for (size_t p = 0; p < names.size();) {
    const std::string name = names.c_str() + p;
    p += name.size() + 1;
    if (name.empty()) continue;
    std::string v(65536, '\0');
    const ssize_t n = lgetxattr(path.c_str(), name.c_str(), v.data(), v.size());
    if (n < 0) return path + ": getxattr " + name + ": " + errno_name(errno);
    v.resize(static_cast<size_t>(n));
    (*out)[name] = v;
  }
  return "";
}

std::string read_node(const std::string& path, const struct stat& st, crash::ONode* o) {
  o->mode = st.st_mode;
  o->nlink = static_cast<uint32_t>(st.st_nlink);
  o->size = static_cast<uint64_t>(st.st_size);
  if (S_ISREG(st.st_mode)) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return path + ": open: " + errno_name(errno);
    o->data.assign(o->size, '\0');
    size_t got = 0;
    while (got < o->size) {
      const ssize_t n = pread(fd, o->data.data() + got, o->size - got, static_cast<off_t>(got));
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    const int e = errno;
    close(fd);
    if (got != o->size) {
      return path + ": read " + std::to_string(got) + " of " + std::to_string(o->size) +
             " bytes (" + errno_name(e) + ")";
    }
  } else if (S_ISLNK(st.st_mode)) {
    std::string t(4096, '\0');
    const ssize_t n = readlink(path.c_str(), t.data(), t.size());
    if (n < 0) return path + ": readlink: " + errno_name(errno);
    o->target = t.substr(0, static_cast<size_t>(n));
  }
  return read_xattrs(path, &o->xattrs);
}

}  // namespace

std::string observe(const std::string& mnt, crash::Observed* out) {
  return observe(mnt, 0, out);
}

std::string observe(const std::string& mnt, Ino parent, crash::Observed* out) {
  out->nodes.clear();
  struct stat st;
  if (lstat(mnt.c_str(), &st) != 0) return "/: lstat: " + errno_name(errno);
  if (std::string e = read_node(mnt, st, &out->nodes[st.st_ino]); !e.empty()) return e;
  struct Dir {
    Ino ino, parent;
    std::string path;  // in the mount: "" is the root
  };
  std::vector<Dir> dirs{{st.st_ino, parent ? parent : st.st_ino, ""}};
  for (size_t i = 0; i < dirs.size(); ++i) {
    const Dir d = dirs[i];
    const std::string dpath = d.path.empty() ? "/" : d.path;
    DIR* dir = opendir((mnt + d.path).c_str());
    if (!dir) return dpath + ": opendir: " + errno_name(errno);
    std::vector<std::pair<std::string, dirent>> ents;
    errno = 0;
    while (const dirent* e = readdir(dir)) ents.emplace_back(e->d_name, *e);
    const int e = errno;
    closedir(dir);
    if (e) return dpath + ": readdir: " + errno_name(e);
    for (const auto& [name, ent] : ents) {
      if (name == "." || name == "..") {
        const Ino want = name == "." ? d.ino : d.parent;
        if (ent.d_ino != want) {
          return dpath + ": readdir gives '" + name + "' inode " + std::to_string(ent.d_ino) +
                 ", expected " + std::to_string(want);
        }
        continue;
      }
      const std::string rel = d.path + "/" + name;
      struct stat a;
      if (lstat((mnt + rel).c_str(), &a) != 0)
        return rel + ": listed but lstat gives " + errno_name(errno);
      if (a.st_ino != ent.d_ino) {
        return rel + ": readdir says inode " + std::to_string(ent.d_ino) + ", lstat " +
               std::to_string(a.st_ino);
      }
      if (ent.d_type != ((a.st_mode >> 12) & 017)) {
        return rel + ": entry type " + std::to_string(ent.d_type) + " but mode " +
               std::to_string(a.st_mode);
      }
      out->nodes[d.ino].entries[name] = {a.st_ino, ent.d_type};
      if (out->nodes.count(a.st_ino)) {
        if (S_ISDIR(a.st_mode))
          return rel + ": directory inode " + std::to_string(a.st_ino) + " has two names";
        continue;  // a hard link: read once
      }
      if (std::string err = read_node(mnt + rel, a, &out->nodes[a.st_ino]); !err.empty()) {
        return err.substr(mnt.size());
      }
      if (S_ISDIR(a.st_mode)) dirs.push_back({a.st_ino, d.ino, rel});
    }
  }
  return "";
}

}  // namespace warpfs::fs::mounted
