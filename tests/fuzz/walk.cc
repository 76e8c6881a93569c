// The walk over a mounted filesystem (walk.h).
#include "walk.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "warpfs/fs/format.h"

namespace warpfs::fuzz {

void require(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "\nwarpfs fuzz: promise broken: %s\n", what.c_str());
  std::abort();
}

void note(const std::string& kind, const std::string& detail) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> g(mu);
  if (!seen.insert(kind).second) return;
  std::fprintf(stderr, "warpfs fuzz: NOTE %s: %s\n", kind.c_str(), detail.c_str());
}

bool known_errno(int rc) {
  switch (rc) {
    case 0:
    case ENOENT:
    case EIO:
    case ENOTDIR:
    case EISDIR:
    case ENOSPC:
    case ENOTEMPTY:
    case EEXIST:
    case EINVAL:
    case ENODATA:
    case ERANGE:
    case E2BIG:
    case EFBIG:
    case ENAMETOOLONG:
    case EROFS:
    case EPERM:
    case ENXIO:
    case EOPNOTSUPP:
    case EMLINK:
    case EBUSY:
    case ENODEV:
      return true;
    default:
      return false;
  }
}

namespace {

using fs::Attr;
using fs::Ino;

class Walker {
 public:
  Walker(fs::Filesystem& f, const MountLog& log, const WalkOptions& o) : f_(f), log_(log), o_(o) {}

  void run() {
    struct statvfs st;
    op("statfs", [&] { return f_.statfs(&st); });
    Attr root;
    if (op("getattr root", [&] { return f_.getattr(fs::kRootInode, &root); }) == 0) {
      require(root.ino == fs::kRootInode, "getattr(1) names inode " + std::to_string(root.ino));
    }
    std::vector<Ino> queue{fs::kRootInode};
    seen_.insert(fs::kRootInode);
    for (size_t i = 0; i < queue.size() && i < 16; ++i) visit_dir(queue[i], &queue);
    if (!files_.empty()) {
      op("readdir on a file",
         [&] { return f_.readdir(files_[0], 0, [](const fs::DirEntry&) { return true; }); });
    }
    if (o_.write && !f_.read_only()) change();
    op("statfs", [&] { return f_.statfs(&st); });
    for (Ino ino : refs_) f_.forget(ino, 1);
  }

 private:
  // Runs one call and checks its result (walk.h).
  template <typename F>
  int op(const std::string& what, F&& fn) {
    const size_t before = log_.lines();
    const int rc = fn();
    if (verbose_) std::fprintf(stderr, "  %s -> %d\n", what.c_str(), rc);
    require(known_errno(rc),
            what + " returned " + std::to_string(rc) + " (" + std::strerror(rc) + ")");
    if (rc == EIO && !o_.faults && log_.lines() == before) {
      note("EIO without a log line",
           what + " failed with EIO and logged nothing naming the structure");
    }
    return rc;
  }

  void check_name(const std::string& name, Ino dir) {
    const bool ok = !name.empty() && name.size() <= fs::kMaxName &&
                    name.find('/') == std::string::npos && name.find('\0') == std::string::npos &&
                    name != "." && name != "..";
    if (!ok) {
      note("readdir hands out an invalid name", "directory " + std::to_string(dir) +
                                                    ": a name of " + std::to_string(name.size()) +
                                                    " bytes that the kernel refuses (empty, '/', "
                                                    "NUL, '.' or '..'), with no error logged");
    }
  }

  // Lists a directory in pages of o_.readdir_page entries, as the kernel does, resuming at
  // the offset of the last entry taken.
  void list(Ino dir, std::vector<fs::DirEntry>* out) {
    uint64_t off = 0;
    const size_t cap = o_.readdir_page ? o_.readdir_page : 100000;
    for (int pages = 0; pages < 300 && out->size() < 300; ++pages) {
      std::vector<fs::DirEntry> page;
      const int rc = op("readdir", [&] {
        return f_.readdir(dir, off, [&](const fs::DirEntry& e) {
          page.push_back(e);
          return page.size() < cap;
        });
      });
      if (rc != 0 || page.empty()) return;
      bool moved = false;
      for (const fs::DirEntry& e : page) {
        require(e.next_offset >= off, "readdir of directory " + std::to_string(dir) +
                                          " from offset " + std::to_string(off) +
                                          " returned an entry resuming at " +
                                          std::to_string(e.next_offset) + ": a caller would loop");
        moved |= e.next_offset > off;
        if (out->size() >= 2 || (e.name != "." && e.name != "..")) check_name(e.name, dir);
        out->push_back(e);
      }
      if (!moved) {
        note("readdir makes no progress",
             "a page of " + std::to_string(page.size()) + " entries all resume at offset " +
                 std::to_string(off) + " (entries sharing a hash fill the page)");
        return;
      }
      off = page.back().next_offset;
      if (page.size() < cap) return;  // the directory ended
    }
  }

  void visit_dir(Ino dir, std::vector<Ino>* queue) {
    op("opendir", [&] { return f_.opendir(dir); });
    std::vector<fs::DirEntry> entries;
    list(dir, &entries);
    int looked = 0;
    for (const fs::DirEntry& e : entries) {
      if (e.name == "." || e.name == "..") continue;
      if (++looked > 48) break;
      // readdirplus: the daemon asks for the attributes of the inode the entry names.
      Attr a;
      if (op("lookup_ino", [&] { return f_.lookup_ino(e.ino, &a); }) == 0) f_.forget(e.ino, 1);
      if (e.name.empty() || e.name.size() > fs::kMaxName) continue;  // the kernel stops these
      if (op("lookup", [&] { return f_.lookup(dir, e.name, &a); }) != 0) continue;
      refs_.push_back(a.ino);
      names_.emplace_back(dir, e.name);
      inspect(a, queue);
    }
    Attr a;
    op("lookup missing", [&] { return f_.lookup(dir, "no-such-name-here", &a); });
  }

  void inspect(const Attr& a, std::vector<Ino>* queue) {
    Attr b;
    op("getattr", [&] { return f_.getattr(a.ino, &b); });
    if (!inspected_.insert(a.ino).second) return;  // another name of an inode seen already
    if (S_ISDIR(a.mode)) {
      if (seen_.insert(a.ino).second) queue->push_back(a.ino);
      dirs_.push_back(a.ino);
    } else if (S_ISREG(a.mode)) {
      files_.push_back(a.ino);
      read_file(a);
    } else if (S_ISLNK(a.mode)) {
      std::string t;
      if (op("readlink", [&] { return f_.readlink(a.ino, &t); }) == 0 &&
          (t.empty() || t.size() > 4095)) {
        note("readlink target length", "inode " + std::to_string(a.ino) + ": a target of " +
                                           std::to_string(t.size()) + " bytes");
      }
    }
    std::string names;
    if (op("listxattr", [&] { return f_.listxattr(a.ino, &names); }) == 0) {
      size_t start = 0;
      std::set<std::string> listed;
      for (int k = 0; k < 400 && start < names.size(); ++k) {
        size_t end = names.find('\0', start);
        if (end == std::string::npos) end = names.size();
        const std::string name = names.substr(start, end - start);
        if (!listed.insert(name).second) {
          note("listxattr repeats a name", "inode " + std::to_string(a.ino) + ": " + name);
        }
        std::string v;
        if (op("getxattr", [&] { return f_.getxattr(a.ino, name, &v); }) == ENODATA) {
          note("a listed attribute is not found", "inode " + std::to_string(a.ino) + ": " + name);
        }
        require(v.size() <= fs::kXattrValueMax, "getxattr returned more than 64 KiB");
        if (xattr_name_.empty() || (xattr_ino_ == a.ino && k == 1)) {
          xattr_ino_ = a.ino, xattr_name_ = name;
        }
        start = end + 1;
      }
    }
    std::string v;
    op("getxattr missing", [&] { return f_.getxattr(a.ino, "user.no-such-attribute", &v); });
  }

  void read_file(const Attr& a) {
    if (op("open", [&] { return f_.open(a.ino, O_RDONLY); }) != 0) return;
    std::vector<char> buf(3 * fs::kBlockSize);
    const uint64_t offs[] = {0,          a.size > 100 ? a.size - 100 : 0,
                             a.size,     8 * fs::kBlockSize + 17,
                             a.size / 2, uint64_t{1} << 40};
    for (uint64_t off : offs) {
      size_t got = 0;
      if (op("read", [&] { return f_.read(a.ino, off, buf.size(), buf.data(), &got); }) == 0) {
        require(got <= buf.size(), "read returned " + std::to_string(got) + " bytes, asked for " +
                                       std::to_string(buf.size()));
      }
    }
    uint64_t out;
    op("lseek data", [&] { return f_.lseek(a.ino, 0, SEEK_DATA, &out); });
    op("lseek hole", [&] { return f_.lseek(a.ino, 0, SEEK_HOLE, &out); });
    op("lseek data mid", [&] { return f_.lseek(a.ino, a.size / 3, SEEK_DATA, &out); });
    // What dump.warpfs shows of it: extents in order, none past the device.
    fs::InodeReport r;
    if (op("inspect", [&] { return f_.inspect(a.ino, &r); }) == 0) {
      uint64_t prev_end = 0;
      for (const fs::Extent& e : r.extents) {
        require(e.logical >= prev_end, "inspect: extents out of order");
        prev_end = uint64_t{e.logical} + e.blocks();
      }
    }
    f_.release(a.ino);
  }

  Ino make(const std::string& what, int rc, const Attr& a) {
    if (rc != 0) return 0;
    refs_.push_back(a.ino);
    (void)what;
    return a.ino;
  }

  void write_file(Ino ino, uint64_t off, size_t len) {
    std::vector<char> data(len);
    for (size_t i = 0; i < len; ++i) data[i] = static_cast<char>('A' + i % 26);
    size_t w = 0;
    if (op("write", [&] { return f_.write(ino, off, len, data.data(), &w); }) == 0) {
      require(w <= len, "write reports " + std::to_string(w) + " bytes of " + std::to_string(len));
    }
  }

  // Many small attributes (a chain of blocks), values around the inline limit and of 64 KiB
  // (value blocks); what a set said it stored reads back; then half of them go.
  void change_xattrs(Ino ino) {
    std::vector<std::pair<std::string, std::string>> set;
    for (int i = 0; i < 200; ++i) {
      set.emplace_back("user.fzm" + std::to_string(i), "v" + std::to_string(i * 37));
    }
    for (size_t len : {size_t{fs::kXattrInlineMax}, size_t{fs::kXattrInlineMax} + 1,
                       size_t{fs::kXattrValuePayload} + 1, size_t{fs::kXattrValueMax}}) {
      set.emplace_back("user.fzbig" + std::to_string(len), std::string(len, 'L'));
    }
    std::vector<bool> stored(set.size());
    for (size_t i = 0; i < set.size(); ++i) {
      const std::string& k = set[i].first;
      const std::string& v = set[i].second;
      stored[i] =
          op("setxattr many", [&] { return f_.setxattr(ino, k, v.data(), v.size(), 0); }) == 0;
    }
    for (size_t i = 0; i < set.size(); ++i) {
      std::string v;
      if (stored[i] &&
          op("getxattr many", [&] { return f_.getxattr(ino, set[i].first, &v); }) == 0) {
        require(v == set[i].second, "getxattr of " + set[i].first + " differs from what was set");
      }
    }
    std::string names;
    op("listxattr many", [&] { return f_.listxattr(ino, &names); });
    for (size_t i = 0; i < set.size(); i += 2) {
      op("removexattr many", [&] { return f_.removexattr(ino, set[i].first); });
    }
  }

  // Times out of the field's range (the internal record) and back in range; what setattr
  // stored reads back exactly.
  void change_times(Ino ino) {
    const fs::TimeSpec times[] = {{INT64_MAX, 999999999}, {INT64_MIN, 0}, {-11676096000LL, 7}};
    for (const fs::TimeSpec& t : times) {
      fs::SetAttr s;
      s.atime = s.mtime = true;
      s.new_atime = t;
      s.new_mtime = times[0];
      Attr a;
      if (op("setattr times", [&] { return f_.setattr(ino, s, &a); }) != 0) continue;
      if (op("getattr times", [&] { return f_.getattr(ino, &a); }) == 0 && a.atime != t) {
        note("an out-of-range time reads back otherwise", "inode " + std::to_string(ino));
      }
    }
    fs::SetAttr now;
    now.atime = now.mtime = now.atime_now = now.mtime_now = true;
    Attr a;
    op("setattr now", [&] { return f_.setattr(ino, now, &a); });
  }

  void truncate(Ino ino, uint64_t size) {
    fs::SetAttr s;
    s.size = true;
    s.new_size = size;
    Attr a;
    op("truncate", [&] { return f_.setattr(ino, s, &a); });
  }

  // Changes: new objects, then the objects found on the image.
  void change() {
    const fs::Caller c{};
    const Ino root = fs::kRootInode;
    Attr a;
    const Ino file =
        make("mknod",
             op("mknod", [&] { return f_.mknod(root, "fz-file", S_IFREG | 0644, 0, c, &a); }), a);
    if (file) {
      op("open rw", [&] { return f_.open(file, O_RDWR); });
      write_file(file, 0, 6000);
      write_file(file, 3 << 20, 100);
      truncate(file, 50);
      op("fallocate", [&] { return f_.fallocate(file, 0, 0, 3 * fs::kBlockSize); });
      op("setxattr", [&] { return f_.setxattr(file, "user.fz", "0123456789", 10, 0); });
      change_xattrs(file);
      change_times(file);
      op("fsync", [&] { return f_.fsync(file, false); });
      f_.release(file);
    }
    const Ino dir =
        make("mkdir", op("mkdir", [&] { return f_.mkdir(root, "fz-dir", 0755, c, &a); }), a);
    if (dir) {
      make("symlink",
           op("symlink", [&] { return f_.symlink(dir, "fz-link", "../fz-file", c, &a); }), a);
      op("rename", [&] { return f_.rename(root, "fz-file", dir, "moved", 0); });
    }
    if (file) make("link", op("link", [&] { return f_.link(file, root, "fz-hard", &a); }), a);
    // What the image holds.
    for (size_t i = 0; i < files_.size() && i < 3; ++i) {
      if (op("open rw", [&] { return f_.open(files_[i], O_RDWR); }) != 0) continue;
      write_file(files_[i], 0, 100);
      write_file(files_[i], 5 * fs::kBlockSize + 3, 2 * fs::kBlockSize);
      truncate(files_[i], fs::kBlockSize + 1);
      op("fallocate keep",
         [&] { return f_.fallocate(files_[i], FALLOC_FL_KEEP_SIZE, 0, 4 * fs::kBlockSize); });
      f_.release(files_[i]);
    }
    for (size_t i = 0; i < dirs_.size() && i < 2; ++i) {
      make("mknod child",
           op("mknod child",
              [&] { return f_.mknod(dirs_[i], "fz-child", S_IFREG | 0600, 0, c, &a); }),
           a);
      make("mkdir child",
           op("mkdir child", [&] { return f_.mkdir(dirs_[i], "fz-subdir", 0700, c, &a); }), a);
    }
    if (xattr_ino_) {
      op("setxattr replace", [&] { return f_.setxattr(xattr_ino_, xattr_name_, "new", 3, 0); });
      const std::string big(fs::kXattrInlineMax + 100, 'q');
      op("setxattr replace large",
         [&] { return f_.setxattr(xattr_ino_, xattr_name_, big.data(), big.size(), 0); });
      op("removexattr", [&] { return f_.removexattr(xattr_ino_, xattr_name_); });
      change_xattrs(xattr_ino_);
    }
    if (names_.size() >= 2) {
      const Ino p0 = names_[0].first, p1 = names_[names_.size() / 2].first;
      const std::string n0 = names_[0].second, n1 = names_[names_.size() / 2].second;
      op("rename exchange", [&] { return f_.rename(p0, n0, p1, n1, RENAME_EXCHANGE); });
      op("rename", [&] { return f_.rename(p1, n1, root, "fz-renamed", 0); });
      op("unlink", [&] { return f_.unlink(p0, n0); });
      const Ino p2 = names_.back().first;
      const std::string n2 = names_.back().second;
      op("rmdir", [&] { return f_.rmdir(p2, n2); });
    }
    if (dir) {
      op("unlink", [&] { return f_.unlink(dir, "fz-link"); });
      op("rmdir non-empty", [&] { return f_.rmdir(root, "fz-dir"); });
    }
    op("sync", [&] { return f_.sync(); });
  }

  fs::Filesystem& f_;
  const MountLog& log_;
  const WalkOptions o_;
  std::set<Ino> seen_, inspected_;
  std::vector<Ino> refs_, dirs_, files_;
  std::vector<std::pair<Ino, std::string>> names_;
  Ino xattr_ino_ = 0;
  std::string xattr_name_;
  const bool verbose_ = std::getenv("WARPFS_FUZZ_VERBOSE") != nullptr;
};

}  // namespace

void walk(fs::Filesystem& f, const MountLog& log, const WalkOptions& o) {
  Walker(f, log, o).run();
}

}  // namespace warpfs::fuzz
