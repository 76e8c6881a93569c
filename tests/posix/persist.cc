// posix_persist: what a remount must keep.
//
//   posix_persist populate DIR   builds a deterministic tree in DIR (created if missing, must
//                                be empty) and writes nothing else
//   posix_persist verify DIR     re-derives the tree and compares: types, modes, owners,
//                                sizes, link counts, atime/mtime to the nanosecond, symlink
//                                targets, xattrs, directory listings, contents (checksummed),
//                                holes and preallocated space
//
// Exit status: 0 success, 1 a difference (the first is named first), 2 a usage or setup
// error. Run as root (it sets owners and trusted.* attributes).
//
// verify changes nothing it checks: it stats everything before reading anything, opens
// files and directories with O_NOATIME, and symlinks carry atimes in the future, which
// relatime never updates on readlink. So verify can be run again after a second remount.
#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kGiB = 1024 * kMiB;
constexpr int64_t kNs = 1'000'000'000;

enum class Kind { kDir, kFile, kSymlink, kFifo };

struct Range {
  uint64_t off, len;
};

struct Node {
  std::string path;  // relative to DIR
  Kind kind = Kind::kFile;
  mode_t mode = 0644;  // permission bits with setuid/setgid/sticky; unused for symlinks
  uid_t uid = 0;
  gid_t gid = 0;
  // Regular files: `size` bytes; the bytes in `data` ranges come from content_at(), all
  // others are zero. `punch` ranges are punched out after writing (so they read as zero);
  // `prealloc` allocates [0, size) with fallocate first.
  uint64_t size = 0;
  std::vector<Range> data;
  std::vector<Range> punch;
  bool prealloc = false;
  uint64_t max_alloc = UINT64_MAX;   // st_blocks * 512 at most (holes stay holes)
  uint64_t min_alloc = 0;            // and at least (preallocation survives)
  std::string target;                // symlinks
  std::vector<std::string> aliases;  // further hard links to this inode
  std::vector<std::pair<std::string, std::string>> xattrs;
  timespec atime{}, mtime{};
};

uint64_t fnv1a(std::string_view s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Byte `off` of the file at `path` wherever it holds data: a function of both, so that a
// block written to the wrong file or offset is noticed.
void content_at(const std::string& path, uint64_t off, size_t len, char* out) {
  const uint64_t seed = fnv1a(path);
  for (size_t i = 0; i < len;) {
    const uint64_t word = (off + i) / 8;
    const uint64_t v = mix(seed ^ (word * 0xd6e8feb86659fd93ull));
    const size_t in_word = (off + i) % 8;
    const size_t n = std::min<size_t>(8 - in_word, len - i);
    std::memcpy(out + i, reinterpret_cast<const char*>(&v) + in_word, n);
    i += n;
  }
}

// The expected bytes [off, off + len) of a file node.
std::string expected_bytes(const Node& n, uint64_t off, size_t len) {
  std::string out(len, '\0');
  for (const Range& r : n.data) {
    const uint64_t lo = std::max(off, r.off), hi = std::min(off + len, r.off + r.len);
    if (lo < hi) content_at(n.path, lo, hi - lo, out.data() + (lo - off));
  }
  for (const Range& r : n.punch) {
    const uint64_t lo = std::max(off, r.off), hi = std::min(off + len, r.off + r.len);
    if (lo < hi) std::memset(out.data() + (lo - off), 0, hi - lo);
  }
  return out;
}

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

// The tree. Everything is derived from this list; nothing depends on time or randomness.
std::vector<Node> build_spec() {
  std::vector<Node> nodes;
  auto dir = [&](const std::string& p, mode_t mode = 0755) -> Node& {
    Node n;
    n.path = p;
    n.kind = Kind::kDir;
    n.mode = mode;
    nodes.push_back(n);
    return nodes.back();
  };
  auto file = [&](const std::string& p, uint64_t size, mode_t mode = 0644) -> Node& {
    Node n;
    n.path = p;
    n.size = size;
    n.mode = mode;
    if (size > 0) n.data.push_back({0, size});
    nodes.push_back(n);
    return nodes.back();
  };
  auto symlink = [&](const std::string& p, const std::string& target) -> Node& {
    Node n;
    n.path = p;
    n.kind = Kind::kSymlink;
    n.target = target;
    nodes.push_back(n);
    return nodes.back();
  };

  dir("files");
  for (uint64_t size : std::initializer_list<uint64_t>{0, 1, 511, 512, 4095, 4096, 4097, 65536,
                                                       65537, kMiB + 1, 8 * kMiB + 17}) {
    file("files/size_" + std::to_string(size), size);
  }
  file("files/hardlinked", 12345).aliases = {"files/hardlinked_too", "links/hard_a",
                                             "links/hard_b"};
  {
    Node n;
    n.path = "files/fifo";
    n.kind = Kind::kFifo;
    n.mode = 0640;
    nodes.push_back(n);
  }

  dir("sparse");
  {
    Node& n = file("sparse/holey_5g", 5 * kGiB + 4103);
    n.data = {{0, 4096}, {kMiB + 100, 5000}, {5 * kGiB, 4103}};
    n.max_alloc = 4 * kMiB;
  }
  {
    Node& n = file("sparse/tail_hole", 3 * kMiB);
    n.data = {{0, 10000}};
    n.max_alloc = kMiB;
  }
  {
    // Written 20000 bytes, cut to 5000, grown to 9000: the cut bytes must stay zero.
    Node& n = file("sparse/shrunk", 9000);
    n.data = {{0, 5000}};
  }
  {
    Node& n = file("sparse/punched", 256 * kKiB);
    n.punch = {{64 * kKiB, 64 * kKiB}, {200000, 1000}};
    n.max_alloc = 256 * kKiB - 32 * kKiB;
  }
  {
    Node& n = file("sparse/prealloc", kMiB);
    n.prealloc = true;
    n.data = {{4096, 100}};
    n.min_alloc = kMiB;
  }

  dir("links");
  symlink("links/sym_rel", "../files/size_4097");
  symlink("links/sym_abs", "/nonexistent/absolute/target");
  symlink("links/sym_dir", "../files");
  symlink("links/sym_dangling", "missing");
  {
    std::string long_target;
    for (int i = 0; long_target.size() < 300; ++i)
      long_target += "segment" + std::to_string(i) + "/";
    symlink("links/sym_300", long_target.substr(0, 300));
    std::string longer;
    for (int i = 0; longer.size() < 4000; ++i) longer += "d" + std::to_string(i) + "/";
    symlink("links/sym_4000", longer.substr(0, 4000));
  }

  dir("modes");
  dir("modes/d0700", 0700);
  dir("modes/d0755", 0755);
  dir("modes/d1777", 01777);
  dir("modes/d2775", 02775).gid = 100;
  dir("modes/d0000", 0000);
  for (mode_t m : {00000, 00400, 00644, 00755, 00777, 01755, 02755, 04755, 06711}) {
    char name[32];
    std::snprintf(name, sizeof name, "modes/f%04o", m);
    file(name, 100 + m % 100, m);
  }

  dir("owners");
  const std::pair<uid_t, gid_t> owners[] = {{1000, 1000}, {65534, 100}, {0, 65534}, {4242, 4242}};
  for (const auto& [u, g] : owners) {
    Node& n = file("owners/f_" + std::to_string(u) + "_" + std::to_string(g), 1000 + u % 7);
    n.uid = u;
    n.gid = g;
  }
  {
    Node& n = file("owners/setuid_4242", 50, 04750);
    n.uid = 4242;
    n.gid = 4242;
  }
  {
    Node& n = dir("owners/dir_1234_5678", 0750);
    n.uid = 1234;
    n.gid = 5678;
  }
  {
    Node& n = symlink("owners/sym_4321_8765", "f_1000_1000");
    n.uid = 4321;
    n.gid = 8765;
  }

  dir("times");
  file("times/t_1970", 1).mtime = {1, 0};
  file("times/t_2001", 2).mtime = {1'000'000'001, 987'654'321};
  file("times/t_2038", 3).mtime = {2'147'483'648, 1};
  file("times/t_2100", 4).mtime = {4'102'444'800, 999'999'999};
  file("times/t_1960", 5).mtime = {-315'619'200, 500'000'000};
  file("times/t_1901", 6).mtime = {-2'147'483'648, 1};
  dir("times/dir").mtime = {1'234'567'890, 123'456'789};
  symlink("times/sym", "t_2001").mtime = {1'500'000'000, 500'000'000};

  dir("xattrs");
  {
    std::string binary;
    for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(i));
    std::string long_value(1000, '\0');
    content_at("xattr value", 0, long_value.size(), long_value.data());
    Node& n = file("xattrs/x_file", 10);
    n.xattrs = {{"user.a", "1"},
                {"user.empty", ""},
                {"user.binary", binary},
                {"user.long_value", long_value},
                {"user." + std::string(200, 'n'), "long name"},
                {"trusted.root", "root only"}};
  }
  dir("xattrs/x_dir").xattrs = {{"user.dir", "on a directory"}};
  {
    Node& n = file("xattrs/x_many", 0);
    for (int i = 0; i < 30; ++i) {
      n.xattrs.push_back({"user.k" + std::to_string(i), "value " + std::to_string(i * i)});
    }
  }

  std::string deep = "deep";
  dir(deep);
  for (int i = 0; i < 24; ++i) {
    char level[8];
    std::snprintf(level, sizeof level, "/l%02d", i);
    deep += level;
    dir(deep);
  }
  file(deep + "/leaf", 777);

  dir("many");
  for (int i = 0; i < 600; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "many/m%03d", i);
    file(name, static_cast<uint64_t>(i % 300));
  }

  dir("names");
  for (const std::string& n :
       {std::string(255, 'L'), std::string("sp ace"), std::string("new\nline"),
        std::string("caf\xc3\xa9"),
        std::string("\x01"
                    "ctl"),
        std::string("not utf8 \xff\xfe"), std::string("..."), std::string(".hidden")}) {
    file("names/" + n, n.size());
  }

  // Times: derived from the path where not chosen above. Symlinks get atimes in the future
  // (see the top of the file); everything else in the past.
  for (Node& n : nodes) {
    const uint64_t h = fnv1a(n.path);
    if (n.mtime.tv_sec == 0 && n.mtime.tv_nsec == 0) {
      n.mtime = {static_cast<time_t>(946'684'800 + h % 1'000'000'000),
                 static_cast<long>((h >> 20) % kNs)};
    }
    const uint64_t h2 = mix(h);
    if (n.kind == Kind::kSymlink) {
      n.atime = {static_cast<time_t>(4'102'444'800 + h2 % 100'000'000),
                 static_cast<long>((h2 >> 30) % kNs)};
    } else {
      n.atime = {static_cast<time_t>(946'684'800 + h2 % 1'000'000'000),
                 static_cast<long>((h2 >> 30) % kNs)};
    }
  }
  return nodes;
}

std::string parent_of(const std::string& p) {
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? "" : p.substr(0, slash);
}

std::string base_of(const std::string& p) {
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// ---------------------------------------------------------------------------------------
// populate

struct SetupError {
  std::string what;
};

void must(long rc, const std::string& what) {
  if (rc == -1) throw SetupError{what + ": " + std::strerror(errno)};
}

void write_range(int fd, const Node& n, Range r) {
  std::string buf;
  for (uint64_t off = r.off; off < r.off + r.len;) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kMiB, r.off + r.len - off));
    buf.resize(len);
    content_at(n.path, off, len, buf.data());
    size_t done = 0;
    while (done < len) {
      const ssize_t w = ::pwrite(fd, buf.data() + done, len - done, static_cast<off_t>(off + done));
      must(w, "pwrite " + n.path);
      done += static_cast<size_t>(w);
    }
    off += len;
  }
}

void make_file(const std::string& root, const Node& n) {
  const std::string p = root + "/" + n.path;
  const int fd = ::open(p.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
  must(fd, "create " + n.path);
  if (n.prealloc) must(::fallocate(fd, 0, 0, static_cast<off_t>(n.size)), "fallocate " + n.path);
  if (n.path == "sparse/shrunk") {
    // The history that matters: more data than is kept, cut mid-block, then grown.
    write_range(fd, n, {0, 20000});
    must(::ftruncate(fd, 5000), "truncate " + n.path);
  }
  for (const Range& r : n.data) write_range(fd, n, r);
  for (const Range& r : n.punch) {
    must(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(r.off),
                     static_cast<off_t>(r.len)),
         "punch hole in " + n.path);
  }
  must(::ftruncate(fd, static_cast<off_t>(n.size)), "truncate " + n.path);
  must(::fsync(fd), "fsync " + n.path);
  ::close(fd);
}

int populate(const std::string& root, const std::vector<Node>& nodes) {
  ::umask(0);
  if (::mkdir(root.c_str(), 0755) != 0 && errno != EEXIST) {
    must(-1, "mkdir " + root);
  }
  {
    DIR* d = ::opendir(root.c_str());
    if (d == nullptr) must(-1, "opendir " + root);
    int entries = 0;
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++entries;
    }
    ::closedir(d);
    if (entries != 0) throw SetupError{root + " is not empty"};
  }
  // 1. The tree: directories (writable while being filled), files, symlinks, fifos, links.
  for (const Node& n : nodes) {
    const std::string p = root + "/" + n.path;
    switch (n.kind) {
      case Kind::kDir:
        must(::mkdir(p.c_str(), 0755), "mkdir " + n.path);
        break;
      case Kind::kFile:
        make_file(root, n);
        break;
      case Kind::kSymlink:
        must(::symlink(n.target.c_str(), p.c_str()), "symlink " + n.path);
        break;
      case Kind::kFifo:
        must(::mkfifo(p.c_str(), 0600), "mkfifo " + n.path);
        break;
    }
  }
  for (const Node& n : nodes) {
    for (const std::string& a : n.aliases) {
      must(::link((root + "/" + n.path).c_str(), (root + "/" + a).c_str()), "link " + a);
    }
  }
  // 2. Attributes: xattrs, then owners (chown clears setuid), then modes, then times last,
  // once nothing will add entries to a directory or write to a file any more.
  for (const Node& n : nodes) {
    const std::string p = root + "/" + n.path;
    for (const auto& [name, value] : n.xattrs) {
      must(::lsetxattr(p.c_str(), name.c_str(), value.data(), value.size(), XATTR_CREATE),
           "setxattr " + name + " on " + n.path);
    }
  }
  for (const Node& n : nodes) {
    must(::lchown((root + "/" + n.path).c_str(), n.uid, n.gid), "chown " + n.path);
  }
  for (const Node& n : nodes) {
    if (n.kind == Kind::kSymlink) continue;
    must(::chmod((root + "/" + n.path).c_str(), n.mode), "chmod " + n.path);
  }
  for (const Node& n : nodes) {
    const timespec ts[2] = {n.atime, n.mtime};
    must(::utimensat(AT_FDCWD, (root + "/" + n.path).c_str(), ts, AT_SYMLINK_NOFOLLOW),
         "utimensat " + n.path);
  }
  const int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY);
  must(fd, "open " + root);
  must(::syncfs(fd), "syncfs");
  ::close(fd);
  std::printf("populate: %zu entries in %s\n", nodes.size(), root.c_str());
  return 0;
}

// ---------------------------------------------------------------------------------------
// verify

class Verifier {
 public:
  Verifier(std::string root, const std::vector<Node>& nodes)
      : root_(std::move(root)), nodes_(nodes) {}

  int run() {
    // Pass 1: metadata only (lstat), before anything could touch an access time.
    std::map<std::string, struct stat> st;
    for (const Node& n : nodes_) {
      struct stat s;
      if (::lstat(full(n.path).c_str(), &s) != 0) {
        diff(n.path, std::string("lstat: ") + std::strerror(errno));
        continue;
      }
      st[n.path] = s;
      check_metadata(n, s);
      for (const std::string& a : n.aliases) {
        struct stat as;
        if (::lstat(full(a).c_str(), &as) != 0) {
          diff(a, std::string("lstat: ") + std::strerror(errno));
        } else if (as.st_ino != s.st_ino) {
          diff(a, "is not a hard link of " + n.path);
        }
      }
    }
    // Pass 2: listings, symlink targets, xattrs, contents.
    check_listings();
    for (const Node& n : nodes_) {
      auto it = st.find(n.path);
      if (it == st.end()) continue;
      if (n.kind == Kind::kSymlink && (it->second.st_mode & S_IFMT) == S_IFLNK) check_target(n);
      if (n.kind == Kind::kFile && S_ISREG(it->second.st_mode)) check_content(n, it->second);
      check_xattrs(n);
    }
    if (diffs_.empty()) {
      std::printf("verify: OK: %zu entries, %" PRIu64 " bytes of content, checksum %016" PRIx64
                  "\n",
                  nodes_.size(), bytes_checked_, checksum_);
      return 0;
    }
    for (size_t i = 0; i < diffs_.size() && i < 20; ++i) {
      std::fprintf(stderr, "verify: DIFF %s\n", diffs_[i].c_str());
    }
    if (diffs_.size() > 20)
      std::fprintf(stderr, "verify: ... %zu differences in all\n", diffs_.size());
    return 1;
  }

 private:
  std::string full(const std::string& rel) const { return rel.empty() ? root_ : root_ + "/" + rel; }

  void diff(const std::string& path, const std::string& what) {
    diffs_.push_back(printable(path) + ": " + what);
  }

  static std::string octal(unsigned v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0%o", v);
    return buf;
  }

  static std::string time_str(const timespec& t) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%lld.%09ld", static_cast<long long>(t.tv_sec), t.tv_nsec);
    return buf;
  }

  nlink_t expected_links(const Node& n) const {
    if (n.kind != Kind::kDir) return static_cast<nlink_t>(1 + n.aliases.size());
    nlink_t links = 2;
    for (const Node& c : nodes_) {
      if (c.kind == Kind::kDir && parent_of(c.path) == n.path) ++links;
    }
    return links;
  }

  void check_metadata(const Node& n, const struct stat& s) {
    const mode_t type = s.st_mode & S_IFMT;
    const mode_t want_type = n.kind == Kind::kDir       ? S_IFDIR
                             : n.kind == Kind::kSymlink ? S_IFLNK
                             : n.kind == Kind::kFifo    ? S_IFIFO
                                                        : S_IFREG;
    if (type != want_type) {
      diff(n.path, "type " + octal(type) + ", expected " + octal(want_type));
      return;
    }
    if (n.kind != Kind::kSymlink && (s.st_mode & 07777) != n.mode) {
      diff(n.path, "mode " + octal(s.st_mode & 07777) + ", expected " + octal(n.mode));
    }
    if (s.st_uid != n.uid || s.st_gid != n.gid) {
      diff(n.path, "owner " + std::to_string(s.st_uid) + ":" + std::to_string(s.st_gid) +
                       ", expected " + std::to_string(n.uid) + ":" + std::to_string(n.gid));
    }
    if (s.st_nlink != expected_links(n)) {
      diff(n.path, "link count " + std::to_string(s.st_nlink) + ", expected " +
                       std::to_string(expected_links(n)));
    }
    const uint64_t want_size = n.kind == Kind::kSymlink ? n.target.size() : n.size;
    if (n.kind != Kind::kDir && n.kind != Kind::kFifo &&
        static_cast<uint64_t>(s.st_size) != want_size) {
      diff(n.path, "size " + std::to_string(s.st_size) + ", expected " + std::to_string(want_size));
    }
    if (s.st_mtim.tv_sec != n.mtime.tv_sec || s.st_mtim.tv_nsec != n.mtime.tv_nsec) {
      diff(n.path, "mtime " + time_str(s.st_mtim) + ", expected " + time_str(n.mtime));
    }
    if (s.st_atim.tv_sec != n.atime.tv_sec || s.st_atim.tv_nsec != n.atime.tv_nsec) {
      diff(n.path, "atime " + time_str(s.st_atim) + ", expected " + time_str(n.atime));
    }
    if (n.kind == Kind::kFile) {
      const uint64_t alloc = static_cast<uint64_t>(s.st_blocks) * 512;
      if (alloc > n.max_alloc) {
        diff(n.path, std::to_string(alloc) + " bytes allocated, at most " +
                         std::to_string(n.max_alloc) + " expected (holes filled in?)");
      }
      if (alloc < n.min_alloc) {
        diff(n.path, std::to_string(alloc) + " bytes allocated, at least " +
                         std::to_string(n.min_alloc) + " expected (preallocation lost?)");
      }
    }
  }

  // Opens without updating atime where the filesystem allows (owner or CAP_FOWNER).
  int open_noatime(const std::string& p, int flags) {
    int fd = ::open(p.c_str(), flags | O_NOATIME);
    if (fd < 0 && errno == EPERM) fd = ::open(p.c_str(), flags);
    return fd;
  }

  void check_listings() {
    std::map<std::string, std::set<std::string>> want;
    want[""];
    for (const Node& n : nodes_) {
      if (n.kind == Kind::kDir) want[n.path];
      want[parent_of(n.path)].insert(base_of(n.path));
      for (const std::string& a : n.aliases) want[parent_of(a)].insert(base_of(a));
    }
    for (const auto& [dir, names] : want) {
      const int fd = open_noatime(full(dir), O_RDONLY | O_DIRECTORY);
      if (fd < 0) {
        diff(dir.empty() ? "." : dir, std::string("open: ") + std::strerror(errno));
        continue;
      }
      DIR* d = ::fdopendir(fd);
      std::set<std::string> got;
      while (dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
        if (!got.insert(e->d_name).second) diff(dir + "/" + e->d_name, "listed twice");
      }
      ::closedir(d);
      for (const std::string& n : names) {
        if (!got.count(n)) diff(dir.empty() ? n : dir + "/" + n, "missing from the listing");
      }
      for (const std::string& n : got) {
        if (!names.count(n)) diff(dir.empty() ? n : dir + "/" + n, "unexpected entry");
      }
    }
  }

  void check_target(const Node& n) {
    std::string buf(8192, '\0');
    const ssize_t len = ::readlink(full(n.path).c_str(), buf.data(), buf.size());
    if (len < 0) {
      diff(n.path, std::string("readlink: ") + std::strerror(errno));
      return;
    }
    buf.resize(static_cast<size_t>(len));
    if (buf != n.target) diff(n.path, "symlink target \"" + printable(buf.substr(0, 80)) + "\"...");
  }

  void check_xattrs(const Node& n) {
    if (n.kind == Kind::kSymlink || n.kind == Kind::kFifo) return;
    const std::string p = full(n.path);
    std::set<std::string> got;
    const ssize_t size = ::llistxattr(p.c_str(), nullptr, 0);
    if (size < 0) {
      diff(n.path, std::string("listxattr: ") + std::strerror(errno));
      return;
    }
    std::string list(static_cast<size_t>(size), '\0');
    const ssize_t m = ::llistxattr(p.c_str(), list.data(), list.size());
    if (m < 0) {
      diff(n.path, std::string("listxattr: ") + std::strerror(errno));
      return;
    }
    for (size_t pos = 0; pos < static_cast<size_t>(m);) {
      const size_t end = list.find('\0', pos);
      const std::string name = list.substr(pos, end - pos);
      // Namespaces the system may add on its own (security.selinux, system.posix_acl_*).
      if (name.rfind("user.", 0) == 0 || name.rfind("trusted.", 0) == 0) got.insert(name);
      pos = end == std::string::npos ? list.size() : end + 1;
    }
    std::set<std::string> want;
    for (const auto& [name, value] : n.xattrs) {
      want.insert(name);
      std::string v(65536, '\0');
      const ssize_t len = ::lgetxattr(p.c_str(), name.c_str(), v.data(), v.size());
      if (len < 0) {
        diff(n.path, "xattr " + name + ": " + std::strerror(errno));
        continue;
      }
      v.resize(static_cast<size_t>(len));
      if (v != value) diff(n.path, "xattr " + name + " has a different value");
    }
    for (const std::string& name : want) {
      if (!got.count(name)) diff(n.path, "xattr " + name + " is not listed");
    }
    for (const std::string& name : got) {
      if (!want.count(name)) diff(n.path, "unexpected xattr " + printable(name));
    }
  }

  // Compares [off, off + len) of the open file with the expected bytes.
  bool compare_range(const Node& n, int fd, uint64_t off, uint64_t len) {
    std::string got;
    for (uint64_t pos = off; pos < off + len;) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(kMiB, off + len - pos));
      got.resize(chunk);
      size_t done = 0;
      while (done < chunk) {
        const ssize_t r =
            ::pread(fd, got.data() + done, chunk - done, static_cast<off_t>(pos + done));
        if (r < 0) {
          diff(n.path, "read at " + std::to_string(pos + done) + ": " + std::strerror(errno));
          return false;
        }
        if (r == 0) {
          diff(n.path, "read ends early at " + std::to_string(pos + done));
          return false;
        }
        done += static_cast<size_t>(r);
      }
      const std::string want = expected_bytes(n, pos, chunk);
      if (got != want) {
        size_t i = 0;
        while (got[i] == want[i]) ++i;
        char msg[128];
        std::snprintf(msg, sizeof msg, "byte %" PRIu64 " is 0x%02x, expected 0x%02x", pos + i,
                      static_cast<unsigned char>(got[i]), static_cast<unsigned char>(want[i]));
        diff(n.path, msg);
        return false;
      }
      checksum_ = fnv1a(got, checksum_);
      bytes_checked_ += chunk;
      pos += chunk;
    }
    return true;
  }

  void check_content(const Node& n, const struct stat& s) {
    if (static_cast<uint64_t>(s.st_size) != n.size) return;  // already reported
    const int fd = open_noatime(full(n.path), O_RDONLY);
    if (fd < 0) {
      diff(n.path, std::string("open: ") + std::strerror(errno));
      return;
    }
    if (n.size <= 64 * kMiB) {
      compare_range(n, fd, 0, n.size);
    } else {
      // Too large to read whole: every data range, and the edges and middle of every hole.
      bool ok = true;
      uint64_t prev_end = 0;
      std::vector<Range> holes;
      for (const Range& r : n.data) {
        ok = ok && compare_range(n, fd, r.off, r.len);
        if (r.off > prev_end) holes.push_back({prev_end, r.off - prev_end});
        prev_end = r.off + r.len;
      }
      if (n.size > prev_end) holes.push_back({prev_end, n.size - prev_end});
      for (const Range& h : holes) {
        const uint64_t probe = std::min<uint64_t>(64 * kKiB, h.len);
        for (uint64_t at : {h.off, h.off + h.len / 2, h.off + h.len - probe}) {
          ok = ok && compare_range(n, fd, std::min(at, h.off + h.len - probe), probe);
        }
      }
      // Past the end, nothing.
      char c;
      if (ok && ::pread(fd, &c, 1, static_cast<off_t>(n.size)) != 0) {
        diff(n.path, "readable past its size");
      }
    }
    ::close(fd);
  }

  std::string root_;
  const std::vector<Node>& nodes_;
  std::vector<std::string> diffs_;
  uint64_t checksum_ = 0xcbf29ce484222325ull;
  uint64_t bytes_checked_ = 0;
};

int usage() {
  std::fprintf(stderr, "usage: posix_persist populate DIR | verify DIR\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return usage();
  const std::string cmd = argv[1];
  std::string root = argv[2];
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  const std::vector<Node> nodes = build_spec();
  try {
    if (cmd == "populate") {
      if (::geteuid() != 0) throw SetupError{"populate needs root (chown, trusted.* xattrs)"};
      return populate(root, nodes);
    }
    if (cmd == "verify") {
      struct stat st;
      if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        throw SetupError{root + " is not a directory"};
      }
      return Verifier(root, nodes).run();
    }
  } catch (const SetupError& e) {
    std::fprintf(stderr, "posix_persist %s: %s\n", cmd.c_str(), e.what.c_str());
    return 2;
  }
  return usage();
}
