// The power-cut crash harness: model, workload, checker, session (crash_harness.h).
#include "fs/crash_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <tuple>

namespace warpfs::fs::crash {

namespace {

constexpr uint64_t kB = kBlockSize;
// file.cc: a write commits per piece of at most this many bytes (less the first block's
// offset): a crash may show some of the pieces.
constexpr uint64_t kWritePiece = 256 * kB;

std::string dirname_of(const std::string& path) {
  const size_t s = path.rfind('/');
  return s == 0 ? "/" : path.substr(0, s);
}
std::string basename_of(const std::string& path) {
  return path.substr(path.rfind('/') + 1);
}
std::string join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}
// True if `path` is `dir` or inside it.
bool within(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path == dir || path.compare(0, dir.size() + 1, dir + "/") == 0;
}

std::string errno_name(int rc) {
  return rc == 0 ? "0" : std::string(strerrorname_np(rc) ? strerrorname_np(rc) : "?");
}

std::string type_name(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "file";
    case S_IFDIR:
      return "directory";
    case S_IFLNK:
      return "symlink";
    default:
      return "type " + std::to_string(mode & S_IFMT);
  }
}

std::string octal(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%o", v);
  return b;
}

std::string burst_name(uint64_t seed, uint64_t i) {
  return "p" + std::to_string(seed + i) + "_" + std::string(100, 'p');
}

}  // namespace

// --- model -------------------------------------------------------------------------------

Model::Model(Ino root_ino) : root_ino_(root_ino) {
  auto root = std::make_shared<MNode>();
  root->ino = root_ino;
  root->mode = S_IFDIR | 0755;  // mkfs
  root->links = 2;
  cur_.nodes[0] = root;
  hist_.push_back(cur_);
}

const MNode* Model::node(Id id) const {
  auto it = cur_.nodes.find(id);
  return it == cur_.nodes.end() ? nullptr : it->second.get();
}

MNode& Model::edit(Id id) {
  auto& p = cur_.nodes.at(id);
  // Shared with a recorded state: copy before changing (the history keeps the old one).
  // Every node is made non-const (make_shared<MNode>), so the cast is sound once unshared.
  if (p.use_count() > 1) p = std::make_shared<MNode>(*p);
  return const_cast<MNode&>(*p);
}

Id Model::add(const MNode& n) {
  const Id id = next_++;
  cur_.nodes[id] = std::make_shared<MNode>(n);
  return id;
}

void Model::remove(Id id) {
  cur_.nodes.erase(id);
}

bool Model::resolve(const std::string& path, Id* id) const {
  Id cur = 0;
  size_t pos = 1;
  while (pos < path.size()) {
    const size_t end = std::min(path.find('/', pos), path.size());
    const MNode* n = node(cur);
    auto it = n->entries.find(path.substr(pos, end - pos));
    if (it == n->entries.end()) return false;
    cur = it->second;
    pos = end + 1;
  }
  *id = cur;
  return true;
}

std::vector<std::pair<std::string, Id>> Model::names() const {
  std::vector<std::pair<std::string, Id>> out{{"/", 0}};
  for (size_t i = 0; i < out.size(); ++i) {
    const MNode* n = node(out[i].second);
    if (!S_ISDIR(n->mode)) continue;
    for (const auto& [name, child] : n->entries) out.emplace_back(join(out[i].first, name), child);
  }
  return out;
}

void Model::step() {
  const size_t k = current() + 1;  // the state this step makes
  for (const auto& [id, n] : cur_.nodes) {
    auto was = last_.nodes.find(id);
    if (was != last_.nodes.end() && was->second == n) continue;  // not edited (copy on write)
    const MNode* o = was == last_.nodes.end() ? nullptr : was->second.get();
    if (!o || o->mode != n->mode || o->size != n->size) size_at_[id] = meta_at_[id] = k;
    if (o && (o->links != n->links || o->xattrs != n->xattrs || o->entries != n->entries ||
              o->target != n->target))
      meta_at_[id] = k;
  }
  if (track_wb_) {
    for (const auto& [id, n] : cur_.nodes) {
      auto was = last_.nodes.find(id);
      if (was != last_.nodes.end() && was->second == n) continue;
      if (S_ISREG(n->mode))
        add_versions(id, was == last_.nodes.end() ? nullptr : was->second.get(), *n);
    }
  }
  last_ = cur_;
  if (!keep_) {
    ++base_;  // current() moves on; state(current()) is cur_
    return;
  }
  hist_.push_back(cur_);
}

void Model::track_writeback(bool on) {
  track_wb_ = on;
  versions_.clear();
  if (!on) return;
  for (const auto& [id, n] : cur_.nodes) {
    if (S_ISREG(n->mode)) versions_from(id, *n);
  }
}

void Model::versions_from(Id id, const MNode& n) {
  Versions& v = versions_[id];
  v.sizes = {n.size};
  v.blocks.assign(n.blocks.size(), {});
  for (size_t b = 0; b < n.blocks.size(); ++b) v.blocks[b].push_back(n.blocks[b]);
}

void Model::add_versions(Id id, const MNode* before, const MNode& n) {
  auto it = versions_.find(id);
  if (before == nullptr || it == versions_.end()) {
    versions_from(id, n);
    return;
  }
  Versions& v = it->second;
  v.sizes.insert(n.size);
  if (v.blocks.size() < n.blocks.size())
    v.blocks.resize(n.blocks.size(), {Block()});  // was past the end
  for (size_t b = 0; b < n.blocks.size(); ++b) {
    std::vector<Block>& seen = v.blocks[b];
    if (std::find(seen.begin(), seen.end(), n.blocks[b]) == seen.end()) seen.push_back(n.blocks[b]);
  }
}

void Model::synced(Id id, bool data_only) {
  const auto& at = data_only ? size_at_ : meta_at_;
  if (auto it = at.find(id); it != at.end()) durable(it->second);
  data_floor_[id] = current();
  if (track_wb_) {
    if (const MNode* n = node(id); n != nullptr && S_ISREG(n->mode)) versions_from(id, *n);
  }
}

void Model::durable(size_t k) {
  while (base_ < k && hist_.size() > 1) {
    hist_.pop_front();
    ++base_;
  }
}

void Model::restart(size_t k, const std::map<Id, std::string>& data) {
  State s = state(k);
  cur_.nodes.clear();
  std::vector<Id> todo{0};
  while (!todo.empty()) {
    const Id id = todo.back();
    todo.pop_back();
    if (cur_.nodes.count(id)) continue;  // a hard link seen before
    auto n = std::make_shared<MNode>(*s.nodes.at(id));
    n->opens = 0;
    for (const auto& [name, child] : n->entries) todo.push_back(child);
    if (auto d = data.find(id); d != data.end()) {
      n->size = 0;
      n->blocks.clear();
      model_write(*n, 0, d->second);
    }
    cur_.nodes[id] = n;
  }
  hist_.clear();
  hist_.push_back(cur_);
  base_ = 0;
  last_ = cur_;
  meta_at_.clear();
  size_at_.clear();
  data_floor_.clear();
  track_writeback(track_wb_);
}

void model_write(MNode& n, uint64_t off, const std::string& data) {
  const uint64_t end = off + data.size();
  if (end > n.size) {
    n.size = end;
    n.blocks.resize((end + kB - 1) / kB);
  }
  for (uint64_t pos = off; pos < end;) {
    const uint64_t b = pos / kB, bs = b * kB, e = std::min(bs + kB, end);
    auto blk = std::make_shared<std::string>(n.blocks[b] ? *n.blocks[b] : std::string(kB, '\0'));
    blk->replace(pos - bs, e - pos, data, pos - off, e - pos);
    n.blocks[b] = std::move(blk);
    pos = e;
  }
}

void model_zero(MNode& n, uint64_t off, uint64_t len) {
  const uint64_t end = std::min(off + len, n.size);
  for (uint64_t pos = off; pos < end;) {
    const uint64_t b = pos / kB, bs = b * kB, e = std::min(bs + kB, end);
    if (n.blocks[b]) {
      auto blk = std::make_shared<std::string>(*n.blocks[b]);
      std::fill(blk->begin() + static_cast<long>(pos - bs),
                blk->begin() + static_cast<long>(e - bs), '\0');
      n.blocks[b] = std::move(blk);
    }
    pos = e;
  }
}

void model_fallocate(Model& m, Id id, int mode, uint64_t off, uint64_t len) {
  if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
    model_zero(m.edit(id), off, len);
    m.step();
  }
  if (mode & (FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE)) {
    if (!(mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))) m.step();  // no visible change
    return;
  }
  // The size grows per allocation piece, each ending at a block boundary or at the end.
  const uint64_t end = off + len;
  for (uint64_t b = off / kB + 1; b * kB < end; ++b) {
    if (b * kB > m.node(id)->size) {
      model_truncate(m.edit(id), b * kB);
      m.step();
    }
  }
  if (end > m.node(id)->size) model_truncate(m.edit(id), end);
  m.step();
}

std::string check_read(const MNode& n, uint64_t off, const std::string& got) {
  for (uint64_t i = 0; i < got.size(); ++i) {
    const uint64_t pos = off + i;
    const uint64_t b = pos / kB;
    const char want =
        pos < n.size && b < n.blocks.size() && n.blocks[b] ? (*n.blocks[b])[pos % kB] : '\0';
    if (got[i] != want) {
      char w[64];
      std::snprintf(w, sizeof w, "byte %llu is 0x%02x, expected 0x%02x",
                    static_cast<unsigned long long>(pos), static_cast<unsigned char>(got[i]),
                    static_cast<unsigned char>(want));
      return w;
    }
  }
  return "";
}

void model_truncate(MNode& n, uint64_t size) {
  n.blocks.resize((size + kB - 1) / kB);
  if (size < n.size && size % kB && n.blocks.back()) {
    // The tail of the new last block reads as zeroes if the file grows again.
    auto blk = std::make_shared<std::string>(*n.blocks.back());
    std::fill(blk->begin() + static_cast<long>(size % kB), blk->end(), '\0');
    n.blocks.back() = std::move(blk);
  }
  n.size = size;
}

// --- observing a mounted filesystem --------------------------------------------------------

namespace {

std::string read_node(Filesystem& fs, Ino ino, const Attr& a, const std::string& path, ONode* o) {
  o->mode = a.mode;
  o->nlink = a.nlink;
  o->size = a.size;
  if (S_ISREG(a.mode)) {
    o->data.assign(a.size, '\0');
    size_t got = 0;
    if (int rc = fs.read(ino, 0, a.size, o->data.data(), &got); rc || got != a.size) {
      return path + ": read of " + std::to_string(a.size) + " bytes gave " + errno_name(rc) + ", " +
             std::to_string(got) + " bytes";
    }
  } else if (S_ISLNK(a.mode)) {
    if (int rc = fs.readlink(ino, &o->target); rc) return path + ": readlink: " + errno_name(rc);
  }
  std::string names;
  if (int rc = fs.listxattr(ino, &names); rc) return path + ": listxattr: " + errno_name(rc);
  for (size_t p = 0; p < names.size();) {
    const size_t e = names.find('\0', p);
    const std::string name = names.substr(p, e == std::string::npos ? std::string::npos : e - p);
    if (!name.empty()) {
      std::string v;
      if (int rc = fs.getxattr(ino, name, &v); rc)
        return path + ": getxattr " + name + ": " + errno_name(rc);
      o->xattrs[name] = v;
    }
    if (e == std::string::npos) break;
    p = e + 1;
  }
  return "";
}

}  // namespace

std::string observe(Filesystem& fs, Observed* out) {
  out->nodes.clear();
  Attr ra;
  if (int rc = fs.getattr(kRootInode, &ra); rc) return "/: getattr: " + errno_name(rc);
  if (std::string e = read_node(fs, kRootInode, ra, "/", &out->nodes[kRootInode]); !e.empty())
    return e;
  struct Dir {
    Ino ino, parent;
    std::string path;
  };
  std::vector<Dir> dirs{{kRootInode, kRootInode, "/"}};
  for (size_t i = 0; i < dirs.size(); ++i) {
    const Dir d = dirs[i];
    const Ino dino = d.ino;
    const std::string& dpath = d.path;
    std::vector<DirEntry> ents;
    if (int rc = fs.readdir(dino, 0,
                            [&](const DirEntry& e) {
                              ents.push_back(e);
                              return true;
                            });
        rc) {
      return dpath + ": readdir: " + errno_name(rc);
    }
    // ".." names the directory this one was found in (the root: itself).
    Attr up;
    if (int rc = fs.lookup(dino, "..", &up); rc) return dpath + ": lookup ..: " + errno_name(rc);
    fs.forget(up.ino, 1);
    if (up.ino != d.parent) {
      return dpath + ": '..' is inode " + std::to_string(up.ino) + ", but it is in inode " +
             std::to_string(d.parent);
    }
    for (const DirEntry& e : ents) {
      if (e.name == "." || e.name == "..") continue;
      const std::string path = join(dpath, e.name);
      Attr a;
      if (int rc = fs.lookup(dino, e.name, &a); rc)
        return path + ": listed but lookup gives " + errno_name(rc);
      fs.forget(a.ino, 1);
      if (a.ino != e.ino) {
        return path + ": readdir says inode " + std::to_string(e.ino) + ", lookup " +
               std::to_string(a.ino);
      }
      if (e.type != ((a.mode >> 12) & 017)) {
        return path + ": entry type " + std::to_string(e.type) + " but inode mode " + octal(a.mode);
      }
      out->nodes[dino].entries[e.name] = {a.ino, e.type};
      if (out->nodes.count(a.ino)) {
        if (S_ISDIR(a.mode))
          return path + ": directory inode " + std::to_string(a.ino) + " has two names";
        continue;  // a hard link: read once
      }
      if (std::string err = read_node(fs, a.ino, a, path, &out->nodes[a.ino]); !err.empty())
        return err;
      if (S_ISDIR(a.mode)) dirs.push_back({a.ino, dino, path});
    }
  }
  return "";
}

// --- checking ------------------------------------------------------------------------------

namespace {

std::string show(const std::string& s, size_t max = 40) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 32 && c < 127) {
      out += static_cast<char>(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  return s.size() > max ? out + "..." : out;
}

std::string show_xattrs(const std::map<std::string, std::string>& x) {
  std::string s = "{";
  for (const auto& [k, v] : x)
    s += (s.size() > 1 ? ", " : "") + k + "=" + show(v, 12) + "(" + std::to_string(v.size()) + ")";
  return s + "}";
}

// A regular file found in both the state and the observed tree, for the data check.
struct FileSeen {
  Id id;
  Ino ino;
  std::string path;
};

// "" if the metadata of `o` is state `s`; else the first difference. `files`: the regular
// files reached.
std::string compare_meta(const State& s, const Observed& o, std::vector<FileSeen>* files,
                         bool sizes_elsewhere = false) {
  std::set<Id> seen;
  std::vector<std::tuple<Id, Ino, std::string>> todo{{0, s.nodes.at(0)->ino, "/"}};
  while (!todo.empty()) {
    auto [id, ino, path] = todo.back();
    todo.pop_back();
    const MNode& m = *s.nodes.at(id);
    auto oi = o.nodes.find(ino);
    if (oi == o.nodes.end()) return path + ": inode " + std::to_string(ino) + " not read";
    const ONode& on = oi->second;
    if (m.ino != ino)
      return path + ": inode " + std::to_string(ino) + ", expected " + std::to_string(m.ino);
    if ((m.mode & S_IFMT) != (on.mode & S_IFMT))
      return path + ": a " + type_name(on.mode) + ", expected a " + type_name(m.mode);
    if ((m.mode & 07777) != (on.mode & 07777))
      return path + ": mode " + octal(on.mode & 07777) + ", expected " + octal(m.mode & 07777);
    if (m.links != on.nlink)
      return path + ": " + std::to_string(on.nlink) + " links, expected " + std::to_string(m.links);
    if (m.xattrs != on.xattrs)
      return path + ": xattrs " + show_xattrs(on.xattrs) + ", expected " + show_xattrs(m.xattrs);
    if (!seen.insert(id).second) continue;
    if (S_ISREG(m.mode)) {
      if (m.size != on.size && !sizes_elsewhere)  // else check_written_back's
        return path + ": size " + std::to_string(on.size) + ", expected " + std::to_string(m.size);
      files->push_back({id, ino, path});
    } else if (S_ISLNK(m.mode)) {
      if (m.target != on.target)
        return path + ": symlink to '" + show(on.target) + "', expected '" + show(m.target) + "'";
    } else if (S_ISDIR(m.mode)) {
      for (const auto& [name, ent] : on.entries) {
        if (!m.entries.count(name))
          return join(path, name) + ": exists (inode " + std::to_string(ent.first) +
                 "), expected absent";
      }
      for (const auto& [name, child] : m.entries) {
        auto e = on.entries.find(name);
        if (e == on.entries.end())
          return join(path, name) + ": missing (inode " + std::to_string(s.nodes.at(child)->ino) +
                 ")";
        todo.emplace_back(child, e->second.first, join(path, name));
      }
    }
  }
  return "";
}

// The model's block b of node n (zeroes where unwritten or past the end).
const std::string& model_block(const MNode& n, uint64_t b) {
  static const std::string zero(kB, '\0');
  return b < n.blocks.size() && n.blocks[b] ? *n.blocks[b] : zero;
}

// "" if every block of each file is one of its versions in states [k, hi], k being the state
// the metadata came back in (see the oracle).
std::string check_data(const Model& m, size_t k, size_t hi, const Observed& o,
                       const std::vector<FileSeen>& files) {
  for (const auto& [id, ino, path] : files) {
    const std::string& data = o.nodes.at(ino).data;
    for (uint64_t b = 0; b * kB < data.size(); ++b) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kB, data.size() - b * kB));
      const char* got = data.data() + b * kB;
      auto fits = [&](size_t t) {
        auto it = m.state(t).nodes.find(id);
        if (it == m.state(t).nodes.end()) return false;
        return std::memcmp(model_block(*it->second, b).data(), got, len) == 0;
      };
      // Not older than the file's last fsync, which made its data durable.
      const size_t from = std::max(k, m.data_floor(id));
      if (fits(from)) continue;
      bool ok = false;
      for (size_t t = from + 1; t <= hi && !ok; ++t) ok = fits(t);
      if (ok) continue;
      const std::string& want = model_block(*m.state(k).nodes.at(id), b);
      size_t at = 0;
      while (at < len && want[at] == got[at]) ++at;
      return path + " (inode " + std::to_string(ino) + ", size " + std::to_string(data.size()) +
             "): bytes " + std::to_string(b * kB) + ".." + std::to_string(b * kB + len) +
             " (block " + std::to_string(b) + ") match none of the block's contents in states " +
             std::to_string(k) + ".." + std::to_string(hi) + "; against state " +
             std::to_string(k) + " byte " + std::to_string(b * kB + at) + " is '" +
             show(std::string(got + at, std::min<size_t>(len - at, 16))) + "', expected '" +
             show(want.substr(at, 16)) + "'";
    }
  }
  return "";
}

// "" if each file's size and blocks are among its versions (Model::track_writeback).
std::string check_written_back(const Model& m, const Observed& o,
                               const std::vector<FileSeen>& files) {
  static const std::string zero(kB, '\0');
  for (const auto& [id, ino, path] : files) {
    const Model::Versions* v = m.versions(id);
    if (v == nullptr) return path + ": no versions kept (model)";
    const std::string& data = o.nodes.at(ino).data;
    const uint64_t size = data.size(), least = *v->sizes.begin(), most = *v->sizes.rbegin();
    if (!v->sizes.count(size) && !(size % kB == 0 && size >= least && size <= most)) {
      return path + " (inode " + std::to_string(ino) + "): size " + std::to_string(size) +
             ", none of " + std::to_string(v->sizes.size()) + " sizes since its last fsync (" +
             std::to_string(least) + ".." + std::to_string(most) + ") nor a page boundary between";
    }
    for (uint64_t b = 0; b * kB < size; ++b) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kB, size - b * kB));
      const char* got = data.data() + b * kB;
      bool ok = b >= v->blocks.size() && std::memcmp(zero.data(), got, len) == 0;
      if (b < v->blocks.size()) {
        for (const Block& blk : v->blocks[b]) {
          if (std::memcmp(blk ? blk->data() : zero.data(), got, len) == 0) ok = true;
        }
      }
      if (!ok) {
        return path + " (inode " + std::to_string(ino) + ", size " + std::to_string(size) +
               "): block " + std::to_string(b) + " ('" +
               show(std::string(got, std::min<size_t>(len, 16))) + "'...) is none of its " +
               std::to_string(b < v->blocks.size() ? v->blocks[b].size() : 0) +
               " versions since its last fsync";
      }
    }
  }
  return "";
}

}  // namespace

std::map<Id, std::string> recovered_data(const State& s, const Observed& o) {
  std::map<Id, std::string> data;
  std::vector<std::pair<Id, Ino>> todo{{0, s.nodes.at(0)->ino}};
  while (!todo.empty()) {
    const auto [id, ino] = todo.back();
    todo.pop_back();
    const MNode& n = *s.nodes.at(id);
    const ONode& on = o.nodes.at(ino);
    if (S_ISREG(n.mode)) data[id] = on.data;
    if (!S_ISDIR(n.mode)) continue;
    for (const auto& [name, child] : n.entries) todo.emplace_back(child, on.entries.at(name).first);
  }
  return data;
}

std::string check(const Model& m, size_t hi, const Observed& o, size_t* matched) {
  std::string data_failure;
  for (size_t k = hi + 1; k-- > m.lo();) {
    std::vector<FileSeen> files;
    if (!compare_meta(m.state(k), o, &files, m.tracks_writeback()).empty()) continue;
    std::string d =
        m.tracks_writeback() ? check_written_back(m, o, files) : check_data(m, k, hi, o, files);
    if (d.empty()) {
      if (matched) *matched = k;
      return "";
    }
    if (data_failure.empty()) data_failure = "tree as in state " + std::to_string(k) + ", but " + d;
  }
  if (!data_failure.empty()) return data_failure;
  std::vector<FileSeen> files;
  std::string s = "the recovered tree is none of states " + std::to_string(m.lo()) + ".." +
                  std::to_string(hi) + ": against state " + std::to_string(hi) + ": " +
                  compare_meta(m.state(hi), o, &files, m.tracks_writeback());
  if (hi != m.lo())
    s += "; against state " + std::to_string(m.lo()) + ": " +
         compare_meta(m.state(m.lo()), o, &files, m.tracks_writeback());
  return s;
}

// --- operations ----------------------------------------------------------------------------

std::string Op::describe() const {
  auto who = [&] { return "#" + std::to_string(id); };
  switch (kind) {
    case OpKind::kCreate:
      return "create " + path + " " + octal(perm);
    case OpKind::kBurst:
      return "create " + std::to_string(len) + " files " + join(path, burst_name(seed, 0)) + "...";
    case OpKind::kMkdir:
      return "mkdir " + path + " " + octal(perm);
    case OpKind::kSymlink:
      return "symlink " + path + " -> " + show(path2, 24);
    case OpKind::kWrite:
      return "write " + who() + " off " + std::to_string(off) + " len " + std::to_string(len) +
             " seed " + std::to_string(seed) +
             (via == Via::kDirect ? " direct"
              : via == Via::kMmap ? " mmap"
                                  : "");
    case OpKind::kTruncate:
      return "truncate " + who() + " to " + std::to_string(off);
    case OpKind::kChmod:
      return "chmod " + who() + " " + octal(perm);
    case OpKind::kRename:
      return std::string("rename ") + path + " -> " + path2 +
             (flags & RENAME_NOREPLACE ? " noreplace" : "");
    case OpKind::kExchange:
      return "exchange " + path + " <-> " + path2;
    case OpKind::kLink:
      return "link " + who() + " as " + path2;
    case OpKind::kUnlink:
      return "unlink " + path;
    case OpKind::kRmdir:
      return "rmdir " + path;
    case OpKind::kSetXattr:
      return "setxattr " + who() + " " + name + " (" + std::to_string(value.size()) + " bytes)";
    case OpKind::kRemoveXattr:
      return "removexattr " + who() + " " + name;
    case OpKind::kFsync:
      return "fsync " + who();
    case OpKind::kFdatasync:
      return "fdatasync " + who();
    case OpKind::kSync:
      return "sync";
    case OpKind::kOpen:
      return "open " + who();
    case OpKind::kRelease:
      return "release " + who();
    case OpKind::kFallocate:
      return "fallocate " + who() + " mode " + std::to_string(flags) + " off " +
             std::to_string(off) + " len " + std::to_string(len);
    case OpKind::kRead:
      return "read " + who() + " off " + std::to_string(off) + " len " + std::to_string(len) +
             (via == Via::kDirect ? " direct"
              : via == Via::kMmap ? " mmap"
                                  : "");
    case OpKind::kClone:
    case OpKind::kDedupe:
      return std::string(kind == OpKind::kClone ? "clone " : "dedupe ") + who() + " off " +
             std::to_string(off) + " len " + std::to_string(len) + " to #" + std::to_string(id2) +
             " off " + std::to_string(off2);
  }
  return "?";
}

namespace {

// Two runs of whole written blocks that the model holds equal (of two files, or apart in
// one), found by their contents: *op's id, off, id2, off2 and len. False if there are none.
bool pick_equal_blocks(const Model& m, const std::vector<Id>& files, std::mt19937_64& rng, Op* op) {
  struct Place {
    size_t hash;
    Id id;
    uint64_t b;
    bool operator<(const Place& o) const {
      return std::tie(hash, id, b) < std::tie(o.hash, o.id, o.b);
    }
  };
  auto whole = [&](Id id, uint64_t b) -> const Block* {
    const MNode* n = m.node(id);
    if ((b + 1) * kB > n->size || !n->blocks[b]) return nullptr;
    return &n->blocks[b];
  };
  std::vector<Place> places;
  for (Id id : files) {
    for (uint64_t b = 0; (b + 1) * kB <= m.node(id)->size; ++b) {
      if (const Block* blk = whole(id, b))
        places.push_back({std::hash<std::string>{}(**blk), id, b});
    }
  }
  std::sort(places.begin(), places.end());
  std::vector<std::pair<Place, Place>> pairs;  // equal neighbours in that order
  for (size_t i = 1; i < places.size(); ++i) {
    const Place &a = places[i - 1], &b = places[i];
    if (a.hash == b.hash && **whole(a.id, a.b) == **whole(b.id, b.b)) pairs.emplace_back(a, b);
  }
  if (pairs.empty()) return false;
  const auto [a, b] = pairs[rng() % pairs.size()];
  // As many of the blocks after them as are equal too (the runs apart in one file).
  uint64_t n = 1;
  while (n < 16) {
    const Block *x = whole(a.id, a.b + n), *y = whole(b.id, b.b + n);
    if (!x || !y || **x != **y) break;
    if (a.id == b.id && a.b + n + 1 > b.b && b.b + n + 1 > a.b) break;
    ++n;
  }
  const bool swap = rng() % 2 == 0;  // either one the source
  op->id = swap ? b.id : a.id;
  op->off = (swap ? b.b : a.b) * kB;
  op->id2 = swap ? a.id : b.id;
  op->off2 = (swap ? a.b : b.b) * kB;
  op->len = n * kB;
  return true;
}

}  // namespace

Op next_op(const Model& m, std::mt19937_64& rng) {
  static const char* const kNames[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"};
  static const uint32_t kPerms[] = {0644, 0600, 0755, 0700, 0640, 0444, 0750, 0604};
  std::vector<std::pair<std::string, Id>> dirs, nondirs, all;
  std::vector<Id> files, targets;  // regular files (linked or open); files and directories
  uint64_t total = 0;
  for (const auto& [path, id] : m.names()) {
    const MNode* n = m.node(id);
    if (S_ISDIR(n->mode)) {
      dirs.emplace_back(path, id);
      targets.push_back(id);
    } else {
      nondirs.emplace_back(path, id);
    }
    if (id != 0) all.emplace_back(path, id);
  }
  std::vector<Id> open_ids;
  for (const auto& [id, n] : m.now().nodes) {
    if (S_ISREG(n->mode)) {
      files.push_back(id);
      targets.push_back(id);
      total += n->size;
    }
    if (n->opens > 0) open_ids.push_back(id);
  }
  auto below = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };
  auto pick_id = [&](const std::vector<Id>& v) { return v[below(v.size())]; };
  auto pick = [&](const std::vector<std::pair<std::string, Id>>& v) { return v[below(v.size())]; };
  // A name for a new entry in `dir`, sometimes a long one (directory leaves fill sooner).
  auto new_name = [&](Id dir, std::string* name) {
    for (int t = 0; t < 4; ++t) {
      std::string nm = kNames[below(std::size(kNames))];
      if (below(6) == 0) nm += "_" + std::string(60 + below(120), 'n');
      if (!m.node(dir)->entries.count(nm)) {
        *name = nm;
        return true;
      }
    }
    return false;
  };
  Op op;
  for (int attempt = 0; attempt < 20; ++attempt) {
    op = Op{};
    const uint64_t r = below(118);
    if (r >= 110 && r < 115) {  // copy_file_range: between files or within one
      std::vector<Id> sources;
      for (Id id : files) {
        if (m.node(id)->size > 0) sources.push_back(id);
      }
      if (sources.empty()) continue;
      op.kind = OpKind::kClone;
      op.id = pick_id(sources);
      op.id2 = below(4) == 0 ? op.id : pick_id(files);
      const uint64_t size = m.node(op.id)->size, size2 = m.node(op.id2)->size;
      op.off = below(size);
      if (below(2) == 0) op.off -= op.off % kB;
      const uint64_t how = below(8);
      op.len = how == 0   ? size - op.off                      // to the end: its last block shared
               : how == 1 ? size - op.off + 1 + below(8 * kB)  // past the end: copies fewer
               : how == 2 ? 256 * 1024 + below(1280 * 1024)    // more than one journal piece
               : how < 5  ? 16 * 1024 + below(240 * 1024)
                          : 1 + below(16 * 1024);
      const uint64_t where = below(3);
      op.off2 = where == 0 ? size2 : where == 1 && size2 > 0 ? below(size2) : below(768 * 1024);
      // Two in three alike in a block, so that whole blocks are shared; the rest copied.
      if (below(3) != 0) op.off2 = op.off2 - op.off2 % kB + op.off % kB;
      const uint64_t n = std::min(op.len, size - op.off);
      if (op.id == op.id2 && op.off2 < op.off + n && op.off < op.off2 + n) continue;  // EINVAL
      if (op.off2 + n > 3ull << 20 || total + n > 20ull << 20) continue;              // room left
      return op;
    }
    if (r >= 115) {  // dedupe_range of ranges the model holds equal
      if (!pick_equal_blocks(m, files, rng, &op)) continue;
      op.kind = OpKind::kDedupe;
      return op;
    }
    if (r >= 100 && r < 104) {  // fallocate: allocate, keep size, punch a hole, zero a range
      static const int kModes[] = {0, FALLOC_FL_KEEP_SIZE,
                                   FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE,
                                   FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE};
      if (files.empty()) continue;
      op.kind = OpKind::kFallocate;
      op.id = pick_id(files);
      op.flags = static_cast<unsigned>(kModes[below(std::size(kModes))]);
      const uint64_t size = m.node(op.id)->size;
      op.off = size > 0 && below(3) ? below(size) : below(512 * 1024);
      op.len = 1 + below(256 * 1024);
      if (below(2) == 0) op.off -= op.off % kB;
      if (op.off + op.len > 3ull << 20 || total + op.len > 20ull << 20) continue;
      return op;
    }
    if (r >= 104) {  // read a file's bytes back and compare them with the model
      if (files.empty()) continue;
      op.kind = OpKind::kRead;
      op.id = pick_id(files);
      const uint64_t size = m.node(op.id)->size;
      op.off = size > 0 ? below(size) : 0;
      op.len = 1 + below(64 * 1024);
      const uint64_t how = below(4);
      if (how == 1) {
        op.off -= op.off % kB;
        op.len = kB * (1 + op.len / kB);
        op.via = Via::kDirect;
      } else if (how == 2 && size > 0) {
        op.via = Via::kMmap;
        op.len = std::min(op.len, size - op.off);
      }
      return op;
    }
    if (r == 0) {  // many files in one directory
      auto [dpath, did] = pick(dirs);
      op.kind = OpKind::kBurst;
      op.path = dpath;
      op.len = 20 + below(60);
      op.seed = rng() % 100000;  // names p<seed + i>_ppp...: free unless the seed repeats
      bool free = true;
      for (uint64_t i = 0; i < op.len && free; ++i) {
        free = !m.node(did)->entries.count(burst_name(op.seed, i));
      }
      if (!free) continue;
      return op;
    }
    if (r < 10) {  // create a file, or a symlink
      auto [dpath, did] = pick(dirs);
      std::string nm;
      if (!new_name(did, &nm)) continue;
      op.path = join(dpath, nm);
      if (below(4) == 0) {
        op.kind = OpKind::kSymlink;
        // Inline (< 128 bytes) or in a block of its own.
        op.path2 =
            below(2) ? "../t/" + std::to_string(rng() % 1000) : std::string(130 + below(800), 's');
      } else {
        op.kind = OpKind::kCreate;
        op.perm = kPerms[below(std::size(kPerms))];
      }
      return op;
    }
    if (r < 14) {  // mkdir
      if (dirs.size() >= 10) continue;
      auto [dpath, did] = pick(dirs);
      if (std::count(dpath.begin(), dpath.end(), '/') >= 4) continue;
      std::string nm;
      if (!new_name(did, &nm)) continue;
      op.kind = OpKind::kMkdir;
      op.path = join(dpath, nm);
      op.perm = below(2) ? 0755 : 0700;
      return op;
    }
    if (r < 38) {  // write: append, overwrite, or anywhere (holes)
      if (files.empty()) continue;
      op.kind = OpKind::kWrite;
      op.id = pick_id(files);
      const uint64_t size = m.node(op.id)->size;
      const uint64_t how = below(10);
      op.off = how < 4 ? size : how < 7 && size > 0 ? below(size) : below(768 * 1024);
      const uint64_t big = below(40);
      op.len = big == 0  ? 256 * 1024 + below(1280 * 1024)  // more than one journal piece
               : big < 6 ? 16 * 1024 + below(240 * 1024)
                         : 1 + below(16 * 1024);
      if (below(3) == 0) op.off -= op.off % kB;  // block-aligned: the direct path
      if (op.off + op.len > 3ull << 20 || total + op.len > 20ull << 20) continue;  // room left
      op.seed = rng();
      // One write in five uses one of three patterns: the same bytes at the same offsets of
      // several files (or of one file again), blocks that kDedupe finds equal.
      if (op.seed % 5 == 0) op.seed = op.seed / 5 % 3;
      const uint64_t via = below(4);
      if (via == 0 && op.off % kB == 0) {
        op.len = kB * (1 + op.len / kB);  // O_DIRECT: whole blocks
        if (op.off + op.len > 3ull << 20 || total + op.len > 20ull << 20) continue;
        op.via = Via::kDirect;
      } else if (via == 1 && op.off + op.len <= size) {
        op.via = Via::kMmap;
      }
      return op;
    }
    if (r < 45) {  // truncate: shrink or grow
      if (files.empty()) continue;
      op.kind = OpKind::kTruncate;
      op.id = pick_id(files);
      const uint64_t size = m.node(op.id)->size;
      op.off = below(3) == 0 ? size + below(256 * 1024) : below(size + 1);
      if (below(4) == 0) op.off -= op.off % kB;
      if (op.off > 3ull << 20) continue;
      return op;
    }
    if (r < 48) {  // chmod
      op.kind = OpKind::kChmod;
      op.id = pick_id(targets);
      op.perm = S_ISDIR(m.node(op.id)->mode) ? (below(2) ? 0755 : 0711)
                                             : kPerms[below(std::size(kPerms))];
      return op;
    }
    if (r < 57) {  // rename: to a free name, or over a compatible entry
      if (all.empty()) continue;
      auto [spath, sid] = pick(all);
      const bool sdir = S_ISDIR(m.node(sid)->mode);
      auto [dpath, did] = pick(dirs);
      if (sdir && within(dpath, spath)) continue;  // into its own subtree: EINVAL
      op.kind = OpKind::kRename;
      op.path = spath;
      const MNode* d = m.node(did);
      if (below(5) < 2 && !d->entries.empty()) {
        auto it = d->entries.begin();
        std::advance(it, static_cast<long>(below(d->entries.size())));
        const MNode* victim = m.node(it->second);
        const bool vdir = S_ISDIR(victim->mode);
        if (vdir != sdir) continue;
        if (vdir && !victim->entries.empty()) continue;
        op.path2 = join(dpath, it->first);
        return op;
      }
      std::string nm;
      if (!new_name(did, &nm)) continue;
      op.path2 = join(dpath, nm);
      if (below(3) == 0) op.flags = RENAME_NOREPLACE;
      return op;
    }
    if (r < 59) {  // exchange two names, neither inside the other
      if (all.size() < 2) continue;
      auto [a, aid] = pick(all);
      auto [b, bid] = pick(all);
      if (within(a, b) || within(b, a)) continue;
      op.kind = OpKind::kExchange;
      op.path = a;
      op.path2 = b;
      return op;
    }
    if (r < 63) {  // hard link
      if (nondirs.empty()) continue;
      auto [spath, sid] = pick(nondirs);
      auto [dpath, did] = pick(dirs);
      std::string nm;
      if (!new_name(did, &nm)) continue;
      op.kind = OpKind::kLink;
      op.id = sid;
      op.path2 = join(dpath, nm);
      return op;
    }
    if (r < 69) {  // unlink
      if (nondirs.empty()) continue;
      op.kind = OpKind::kUnlink;
      op.path = pick(nondirs).first;
      return op;
    }
    if (r < 72) {  // rmdir
      std::vector<std::pair<std::string, Id>> empty;
      for (const auto& d : dirs) {
        if (d.second != 0 && m.node(d.second)->entries.empty()) empty.push_back(d);
      }
      if (empty.empty()) continue;
      op.kind = OpKind::kRmdir;
      op.path = pick(empty).first;
      return op;
    }
    if (r < 79) {  // xattrs on files and directories
      op.id = pick_id(targets);
      const MNode* n = m.node(op.id);
      if (below(4) == 0 && !n->xattrs.empty()) {
        auto it = n->xattrs.begin();
        std::advance(it, static_cast<long>(below(n->xattrs.size())));
        op.kind = OpKind::kRemoveXattr;
        op.name = it->first;
        return op;
      }
      op.kind = OpKind::kSetXattr;
      op.name = "user.x" + std::to_string(below(5));
      // One value in 15 is out of line (value blocks, up to 64 KiB), one name in 7 a new
      // one (chains of xattr blocks); derived from the draws an older harness made, so a
      // seed's run keeps its other operations.
      uint64_t len = below(300);
      if (len % 7 == 3) op.name += "-" + std::to_string(len);
      if (len % 15 == 14) len = 2049 + len * 210;
      op.value = test::pattern(rng(), 0, len);
      return op;
    }
    if (r < 91) {  // fsync, fdatasync of a file or directory (open and unlinked ones too)
      op.kind = below(3) == 0 ? OpKind::kFdatasync : OpKind::kFsync;
      op.id = pick_id(targets);
      return op;
    }
    if (r < 93) {
      op.kind = OpKind::kSync;
      return op;
    }
    if (r < 97) {  // keep a file open, so that unlinking it leaves an orphan
      std::vector<Id> linked;
      for (Id id : files) {
        if (m.node(id)->links > 0 && m.node(id)->opens < 2) linked.push_back(id);
      }
      if (linked.empty()) continue;
      op.kind = OpKind::kOpen;
      op.id = pick_id(linked);
      return op;
    }
    if (open_ids.empty()) continue;
    op.kind = OpKind::kRelease;
    op.id = pick_id(open_ids);
    return op;
  }
  op.kind = OpKind::kSync;
  return op;
}

// --- session -------------------------------------------------------------------------------

std::unique_ptr<Session> Session::make(uint64_t seed, uint64_t mib, std::string* error,
                                       bool commit_each) {
  std::unique_ptr<Session> s(new Session());
  s->seed_ = seed;
  s->commit_each_ = commit_each;
  nvme::EmulatedConfig cfg;
  cfg.seed = mix(seed ^ ++s->power_ons_);  // the power-cut draws of the controllers
  s->devices_ = test::TestDevices::make(mib << 20, error, cfg);
  if (!s->devices_) return nullptr;
  s->cut_ = s->devices_->make_cut();
  MkfsOptions mo;
  mo.seed = 7;
  Geometry g;
  blockdev::BlockDevice& dev = s->devices_->device();
  if (!plan_geometry(dev.block_count(), mo, &g, error)) return nullptr;
  if (blockdev::Status st = format(dev, mo, g, nullptr); !st.is_ok()) {
    *error = "format: " + st.to_string();
    return nullptr;
  }
  // Clones share blocks (mkfs.warpfs may not set the feature yet).
  if (std::string e = enable_shared_blocks(dev); !e.empty()) {
    *error = e;
    return nullptr;
  }
  s->model_.set_block_sharing(true);
  if (std::string e = s->mount(); !e.empty()) {
    *error = e;
    return nullptr;
  }
  return s;
}

Session::~Session() {
  fs_.reset();
  cut_.reset();
  devices_.reset();
}

bool Session::power_on(uint64_t seed, std::string* error) {
  nvme::EmulatedConfig cfg;
  cfg.seed = mix(seed ^ ++power_ons_);  // the power-cut draws of the controllers
  if (!devices_->power_on(cfg, 0, nvme::EngineOptions{}.io_timeout_ns, error)) return false;
  cut_ = devices_->make_cut();
  return true;
}

std::string Session::mount() {
  MountOptions o;
  o.commit_interval_ms = 24u * 3600 * 1000;  // no timed commits: the run is deterministic
  o.commit_every_transaction = commit_each_;
  o.log = [this](const std::string& s) { log_ += s + "\n"; };
  std::string err;
  fs_ = Filesystem::mount(*cut_, o, &err);
  return fs_ ? "" : "mount failed: " + err;
}

std::string Session::fsck(const char* when) {
  FsckOptions o;  // check only; the journal is replayed in memory
  std::string out;
  FsckResult r = warpfs::fs::fsck(*cut_, o, [&](const std::string& s) { out += "  " + s + "\n"; });
  if (r.exit_code == kFsckClean) return "";
  return std::string("fsck ") + when + ": exit " + std::to_string(r.exit_code) + " " + r.error +
         "\n" + out;
}

void Session::power_cut(double persist) {
  cut_->cut();
  devices_->power_cut(persist);  // every member, each on its own draws
  fs_.reset();                   // its unmount fails against the cut-off device
  cut_.reset();
  devices_->power_off();
}

// --- the model side of operations ---------------------------------------------------------

uint64_t mix(uint64_t x) {  // splitmix64: consecutive seeds give unrelated streams
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace {
uint64_t stamp_sum(const uint8_t* b) {
  uint64_t sum = 0;
  for (size_t i = 0; i < kB - 8; i += 8) {
    uint64_t w;
    std::memcpy(&w, b + i, 8);
    sum = mix(sum ^ w);
  }
  return sum;
}
}  // namespace

void stamp_block(uint8_t* b, Ino ino, uint64_t lblk, uint64_t tag) {
  std::memcpy(b, &ino, 8);
  std::memcpy(b + 8, &lblk, 8);
  uint64_t x = mix(tag);
  for (size_t i = 16; i < kB - 8; i += 8) {
    x = mix(x);
    std::memcpy(b + i, &x, 8);
  }
  const uint64_t sum = stamp_sum(b);
  std::memcpy(b + kB - 8, &sum, 8);
}

std::string check_stamped_block(const uint8_t* b, Ino ino, uint64_t lblk, const MayHold& may_hold) {
  bool zero = true;
  for (size_t i = 0; i < kB && zero; ++i) zero = b[i] == 0;
  if (zero) return "";
  uint64_t got_ino, got_lblk, want;
  std::memcpy(&got_ino, b, 8);
  std::memcpy(&got_lblk, b + 8, 8);
  std::memcpy(&want, b + kB - 8, 8);
  if (stamp_sum(b) != want) {
    return "block " + std::to_string(lblk) + " of inode " + std::to_string(ino) +
           " is torn or foreign (checksum mismatch; it claims inode " + std::to_string(got_ino) +
           " block " + std::to_string(got_lblk) + ")";
  }
  if ((got_ino != ino && !(may_hold && may_hold(ino, got_ino))) || got_lblk != lblk) {
    return "block " + std::to_string(lblk) + " of inode " + std::to_string(ino) +
           " holds the data of inode " + std::to_string(got_ino) + " block " +
           std::to_string(got_lblk);
  }
  return "";
}

std::string check_invariants(const Observed& o, Ino stamped, const MayHold& may_hold) {
  std::map<Ino, uint32_t> names, subdirs;
  for (const auto& [ino, n] : o.nodes) {
    for (const auto& [name, ent] : n.entries) {
      names[ent.first] += 1;
      if (ent.second == DT_DIR) subdirs[ino] += 1;
    }
  }
  for (const auto& [ino, n] : o.nodes) {
    const uint32_t want = S_ISDIR(n.mode) ? 2 + subdirs[ino] : names[ino];
    if (n.nlink != want) {
      return "inode " + std::to_string(ino) + " (" + type_name(n.mode) + ") has link count " +
             std::to_string(n.nlink) + " but " + std::to_string(want) +
             (S_ISDIR(n.mode) ? " (2 + subdirectories)" : " names");
    }
  }
  std::vector<Ino> todo;
  if (stamped) todo.push_back(stamped);
  std::set<Ino> seen;
  while (!todo.empty()) {
    const Ino d = todo.back();
    todo.pop_back();
    auto it = o.nodes.find(d);
    if (it == o.nodes.end()) return "directory inode " + std::to_string(d) + " was not read";
    for (const auto& [name, ent] : it->second.entries) {
      if (ent.second == DT_DIR) {
        todo.push_back(ent.first);
        continue;
      }
      if (!seen.insert(ent.first).second) continue;
      const ONode& f = o.nodes.at(ent.first);
      if (!S_ISREG(f.mode)) continue;
      if (f.size % kB) {
        return "stamped file " + name + " (inode " + std::to_string(ent.first) + ") has size " +
               std::to_string(f.size) + ", not a multiple of the block size";
      }
      for (uint64_t b = 0; b * kB < f.data.size(); ++b) {
        if (std::string e = check_stamped_block(
                reinterpret_cast<const uint8_t*>(f.data.data()) + b * kB, ent.first, b, may_hold);
            !e.empty())
          return "stamped file " + name + ": " + e;
      }
    }
  }
  return "";
}

std::string model_create(Model& m, OpKind kind, Id dir, const std::string& name, Ino ino,
                         uint32_t perm, const std::string& target, uint32_t mode) {
  MNode n;
  n.ino = ino;
  n.links = 1;
  if (kind == OpKind::kMkdir) {
    n.mode = S_IFDIR | perm;
    n.links = 2;
    m.edit(dir).links += 1;
  } else if (kind == OpKind::kSymlink) {
    n.mode = S_IFLNK | 0777;
    n.target = target;
    n.size = target.size();
  } else {
    n.mode = S_IFREG | perm;
  }
  m.edit(dir).entries[name] = m.add(n);
  m.step();
  if (mode != n.mode) return "created with mode " + octal(mode) + ", expected " + octal(n.mode);
  return "";
}

void model_rename(Model& m, const Op& op) {
  Id sd, td, src, dst = 0;
  m.resolve(dirname_of(op.path), &sd);
  m.resolve(dirname_of(op.path2), &td);
  const std::string sn = basename_of(op.path), tn = basename_of(op.path2);
  m.resolve(op.path, &src);
  const bool has_dst = m.resolve(op.path2, &dst);
  if (has_dst && dst == src) {  // the same inode under both names: nothing happens
    m.step();
    return;
  }
  const bool sdir = S_ISDIR(m.node(src)->mode);
  const bool ddir = has_dst && S_ISDIR(m.node(dst)->mode);
  if (op.kind == OpKind::kExchange) {
    m.edit(sd).entries[sn] = dst;
    m.edit(td).entries[tn] = src;
    if (sd != td) {
      if (sdir) m.edit(td).links += 1, m.edit(sd).links -= 1;
      if (ddir) m.edit(sd).links += 1, m.edit(td).links -= 1;
    }
    m.step();
    return;
  }
  m.edit(sd).entries.erase(sn);
  m.edit(td).entries[tn] = src;
  if (sdir && sd != td) m.edit(sd).links -= 1, m.edit(td).links += 1;
  if (has_dst) {
    MNode& v = m.edit(dst);
    if (ddir) {
      v.links = 0;
      m.edit(td).links -= 1;
    } else {
      v.links -= 1;
    }
    if (v.links == 0 && v.opens == 0) m.remove(dst);
  }
  m.step();
}

void model_link(Model& m, const Op& op) {
  Id td;
  m.resolve(dirname_of(op.path2), &td);
  m.edit(op.id).links += 1;
  m.edit(td).entries[basename_of(op.path2)] = op.id;
  m.step();
}

void model_unlink(Model& m, const Op& op) {
  Id d, id;
  m.resolve(dirname_of(op.path), &d);
  m.resolve(op.path, &id);
  m.edit(d).entries.erase(basename_of(op.path));
  if (op.kind == OpKind::kRmdir) {
    m.edit(d).links -= 1;
    m.remove(id);
  } else {
    MNode& n = m.edit(id);
    n.links -= 1;
    if (n.links == 0 && n.opens == 0) m.remove(id);
  }
  m.step();
}

void model_release(Model& m, Id id) {
  MNode& n = m.edit(id);
  n.opens -= 1;
  if (n.links == 0 && n.opens == 0) m.remove(id);
}

void model_write_pieces(Model& m, const Op& op, uint64_t piece) {
  model_bytes_pieces(m, op.id, op.off, test::pattern(op.seed, op.off, op.len), piece);
}

void model_bytes_pieces(Model& m, Id id, uint64_t off, const std::string& data, uint64_t piece) {
  // Pieces are counted from the block the write begins in, as file.cc's write() cuts them:
  // a write at 395483 of 1354966 bytes commits [395483, 1441792) first, then the rest.
  const uint64_t base = off - off % kB;
  for (uint64_t done = 0; done < data.size();) {
    const uint64_t pos = off + done;
    const uint64_t n = std::min(data.size() - done, piece - (pos - base) % piece);
    model_write(m.edit(id), pos, data.substr(done, n));
    m.step();
    done += n;
  }
}

std::string model_read(const MNode& n, uint64_t off, uint64_t len) {
  if (off >= n.size) return "";
  std::string out(std::min(len, n.size - off), '\0');
  for (uint64_t i = 0; i < out.size();) {
    const uint64_t pos = off + i, b = pos / kB;
    const uint64_t k = std::min<uint64_t>(out.size() - i, kB - pos % kB);
    if (b < n.blocks.size() && n.blocks[b]) out.replace(i, k, *n.blocks[b], pos % kB, k);
    i += k;
  }
  return out;
}

void model_clone(Model& m, const Op& op, const std::string& data, bool shares) {
  if (!shares) {
    // share.cc copy_bytes: a write of each 1 MiB of the source, in its journal pieces.
    for (uint64_t done = 0; done < data.size(); done += kWritePiece) {
      model_bytes_pieces(m, op.id2, op.off2 + done, data.substr(done, kWritePiece), kWritePiece);
    }
    return;
  }
  // The bytes before the first whole block: a write. Then the old blocks are punched and the
  // source's mapped, in several transactions (a block a crash finds mapped is a later state's,
  // as the data oracle allows), the bytes after them written as a write, the size set. The
  // size may cover the mapped blocks as they come (a state per block: whichever transaction
  // raises it; where the core copies a block it cannot share, no table room or a count at its
  // limit, its write raises it too), or only at the end.
  const uint64_t head = std::min<uint64_t>(data.size(), (kB - op.off % kB) % kB);
  const uint64_t whole = (data.size() - head) / kB * kB;
  if (head > 0) model_bytes_pieces(m, op.id2, op.off2, data.substr(0, head), kWritePiece);
  if (whole > 0) {
    // The destination's old blocks there are punched first, a few extents a transaction
    // (share.cc clone_blocks: a crash then leaves a hole where the copy was to go).
    model_zero(m.edit(op.id2), op.off2 + head, whole);
    m.step();
    model_bytes_pieces(m, op.id2, op.off2 + head, data.substr(head, whole), kB);
  }
  if (head + whole < data.size()) {
    model_write(m.edit(op.id2), op.off2 + head + whole, data.substr(head + whole));
    m.step();
  }
}

std::string enable_shared_blocks(blockdev::BlockDevice& dev) {
  Superblock sb;
  if (auto st = dev.read(0, 1, &sb); !st.is_ok())
    return "reading the superblock: " + st.to_string();
  if (sb.features & kFeatureSharedBlocks) return "";
  sb.features |= kFeatureSharedBlocks;
  sb.checksum = superblock_checksum(sb);
  for (uint64_t at : {uint64_t{0}, sb.block_count - 1}) {
    if (auto st = dev.write(at, 1, &sb); !st.is_ok())
      return "writing the superblock: " + st.to_string();
  }
  if (auto st = dev.flush(); !st.is_ok()) return "flush: " + st.to_string();
  return "";
}

std::string check_shared_counts(Filesystem& fs, const Observed& o) {
  std::map<uint64_t, uint32_t> refs;  // device block -> written extents' blocks mapping it
  for (const auto& [ino, n] : o.nodes) {
    if (!S_ISREG(n.mode)) continue;
    InodeReport rep;
    if (int rc = fs.inspect(ino, &rep); rc)
      return "inspect of inode " + std::to_string(ino) + ": " + errno_name(rc);
    for (const Extent& e : rep.extents) {
      if (e.unwritten()) continue;
      for (uint32_t i = 0; i < e.blocks(); ++i) ++refs[e.physical + i];
    }
  }
  uint64_t shared = 0;
  for (const auto& [b, n] : refs) {
    const uint32_t want = n >= 2 ? n : 0, got = fs.block_refs(b);
    if (got != want) {
      return "block " + std::to_string(b) + ": reference count " + std::to_string(got) + ", " +
             std::to_string(n) + " reference" + (n == 1 ? "" : "s") + " from the files' extents";
    }
    shared += n >= 2;
  }
  if (const uint64_t s = fs.stats().shared_blocks; s != shared) {
    return "FsStats::shared_blocks " + std::to_string(s) + ", but " + std::to_string(shared) +
           " blocks are mapped more than once";
  }
  return "";
}

void model_change(Model& m, const Op& op) {
  MNode& n = m.edit(op.id);
  if (op.kind == OpKind::kTruncate) {
    model_truncate(n, op.off);
  } else if (op.kind == OpKind::kChmod) {
    n.mode = (n.mode & S_IFMT) | op.perm;
  } else if (op.kind == OpKind::kSetXattr) {
    n.xattrs[op.name] = op.value;
  } else if (op.kind == OpKind::kRemoveXattr) {
    n.xattrs.erase(op.name);
  }
  m.step();
}

std::string run_op(Filesystem& fs, Model& m, const Op& op, const CutDevice* cut, int* rc) {
  auto is_cut = [&] { return cut != nullptr && cut->is_cut(); };
  const bool was_cut = is_cut();
  *rc = 0;
  auto ino_of = [&](Id id) { return m.node(id)->ino; };
  auto dir_ino = [&](const std::string& path, Id* id) {
    m.resolve(dirname_of(path), id);
    return ino_of(*id);
  };
  // The model changes if the call succeeded, or if the device was cut meanwhile (then the
  // operation may or may not have happened: its states become possible).
  auto happened = [&] { return *rc == 0 || (!was_cut && is_cut()); };
  Attr a;
  switch (op.kind) {
    case OpKind::kCreate:
    case OpKind::kMkdir:
    case OpKind::kSymlink: {
      Id did;
      const Ino dino = dir_ino(op.path, &did);
      const std::string name = basename_of(op.path);
      if (op.kind == OpKind::kCreate) {
        *rc = fs.mknod(dino, name, S_IFREG | op.perm, 0, Caller{}, &a);
      } else if (op.kind == OpKind::kMkdir) {
        *rc = fs.mkdir(dino, name, op.perm, Caller{}, &a);
      } else {
        *rc = fs.symlink(dino, name, op.path2, Caller{}, &a);
      }
      if (*rc) return "";  // no inode number: it cannot have become durable either
      fs.forget(a.ino, 1);
      return model_create(m, op.kind, did, name, a.ino, op.perm, op.path2, a.mode);
    }
    case OpKind::kBurst: {
      Id did;
      m.resolve(op.path, &did);
      const Ino dino = ino_of(did);
      for (uint64_t i = 0; i < op.len; ++i) {  // one operation (and state) per file
        const std::string name = burst_name(op.seed, i);
        *rc = fs.mknod(dino, name, S_IFREG | 0644, 0, Caller{}, &a);
        if (*rc) return "";
        fs.forget(a.ino, 1);
        if (std::string bad = model_create(m, OpKind::kCreate, did, name, a.ino, 0644, "", a.mode);
            !bad.empty())
          return bad;
        if (is_cut()) return "";
      }
      return "";
    }
    case OpKind::kWrite: {
      const std::string data = test::pattern(op.seed, op.off, op.len);
      size_t written = 0;
      *rc = fs.write(ino_of(op.id), op.off, op.len, data.data(), &written);
      if (!happened()) return "";
      if (!is_cut() && written != op.len) {
        return "wrote " + std::to_string(written) + " of " + std::to_string(op.len) + " bytes";
      }
      model_write_pieces(m, op, kWritePiece);  // one state per journal piece (file.cc)
      return "";
    }
    case OpKind::kTruncate:
    case OpKind::kChmod: {
      SetAttr s;
      if (op.kind == OpKind::kTruncate) {
        s.size = true;
        s.new_size = op.off;
      } else {
        s.mode = true;
        s.new_mode = op.perm;
      }
      *rc = fs.setattr(ino_of(op.id), s, &a);
      if (!happened()) return "";
      model_change(m, op);
      const MNode& n = *m.node(op.id);
      if (*rc == 0 && (a.mode != n.mode || (S_ISREG(n.mode) && a.size != n.size))) {
        return "setattr gave mode " + octal(a.mode) + " size " + std::to_string(a.size);
      }
      return "";
    }
    case OpKind::kRename:
    case OpKind::kExchange: {
      Id sd, td;
      const Ino sdi = dir_ino(op.path, &sd), tdi = dir_ino(op.path2, &td);
      *rc = fs.rename(sdi, basename_of(op.path), tdi, basename_of(op.path2),
                      op.kind == OpKind::kExchange ? RENAME_EXCHANGE : op.flags);
      if (happened()) model_rename(m, op);
      return "";
    }
    case OpKind::kLink: {
      Id td;
      const Ino tdi = dir_ino(op.path2, &td);
      *rc = fs.link(ino_of(op.id), tdi, basename_of(op.path2), &a);
      if (*rc) return "";
      fs.forget(a.ino, 1);
      model_link(m, op);
      if (a.nlink != m.node(op.id)->links) return "link gave nlink " + std::to_string(a.nlink);
      return "";
    }
    case OpKind::kUnlink:
    case OpKind::kRmdir: {
      Id d;
      const Ino dino = dir_ino(op.path, &d);
      const std::string name = basename_of(op.path);
      *rc = op.kind == OpKind::kUnlink ? fs.unlink(dino, name) : fs.rmdir(dino, name);
      if (happened()) model_unlink(m, op);
      return "";
    }
    case OpKind::kSetXattr:
      *rc = fs.setxattr(ino_of(op.id), op.name, op.value.data(), op.value.size(), 0);
      if (happened()) model_change(m, op);
      return "";
    case OpKind::kRemoveXattr:
      *rc = fs.removexattr(ino_of(op.id), op.name);
      if (happened()) model_change(m, op);
      return "";
    case OpKind::kFsync:
    case OpKind::kFdatasync:
      *rc = fs.fsync(ino_of(op.id), op.kind == OpKind::kFdatasync);
      // Acknowledged: durable, whatever the device did.
      if (*rc == 0) m.synced(op.id, op.kind == OpKind::kFdatasync);
      return "";
    case OpKind::kSync:
      *rc = fs.sync();
      if (*rc == 0) m.durable(m.current());
      return "";
    case OpKind::kOpen:
      *rc = fs.open(ino_of(op.id), O_RDWR);
      if (*rc == 0) m.edit(op.id).opens += 1;
      return "";
    case OpKind::kRelease:
      fs.release(ino_of(op.id));
      model_release(m, op.id);
      return "";
    case OpKind::kFallocate:
      *rc = fs.fallocate(ino_of(op.id), static_cast<int>(op.flags), op.off, op.len);
      if (happened()) model_fallocate(m, op.id, static_cast<int>(op.flags), op.off, op.len);
      return "";
    case OpKind::kRead: {
      std::string buf(op.len, '\0');
      size_t got = 0;
      *rc = fs.read(ino_of(op.id), op.off, op.len, buf.data(), &got,
                    op.via == Via::kDirect ? ReadFor::kDirect : ReadFor::kCache);
      if (*rc || is_cut()) return "";  // a read of a cut device proves nothing
      const MNode& n = *m.node(op.id);
      const uint64_t want = op.off >= n.size ? 0 : std::min<uint64_t>(op.len, n.size - op.off);
      if (got != want)
        return "read " + std::to_string(got) + " bytes, expected " + std::to_string(want);
      buf.resize(got);
      if (std::string bad = check_read(n, op.off, buf); !bad.empty()) return "read back: " + bad;
      return "";
    }
    case OpKind::kClone: {
      const std::string data = model_read(*m.node(op.id), op.off, op.len);
      uint64_t copied = 0;
      *rc = fs.copy_file_range(ino_of(op.id), op.off, ino_of(op.id2), op.off2, op.len, &copied);
      if (!happened()) return "";
      if (!is_cut() && copied != data.size()) {
        return "copied " + std::to_string(copied) + " of " + std::to_string(data.size()) + " bytes";
      }
      model_clone(m, op, data, m.block_sharing() && op.off % kB == op.off2 % kB);
      if (is_cut()) return "";
      // The copy reads back at once (a read of a cut device proves nothing).
      std::string buf(data.size(), '\0');
      size_t got = 0;
      if ((*rc = fs.read(ino_of(op.id2), op.off2, buf.size(), buf.data(), &got)) || is_cut())
        return "";
      if (got != buf.size()) return "read " + std::to_string(got) + " bytes of the copy";
      if (std::string bad = check_read(*m.node(op.id2), op.off2, buf); !bad.empty())
        return "the copy read back: " + bad;
      return "";
    }
    case OpKind::kDedupe: {
      uint64_t deduped = 0;
      *rc = fs.dedupe_range(ino_of(op.id), op.off, ino_of(op.id2), op.off2, op.len, &deduped);
      if (*rc == EOPNOTSUPP && !m.block_sharing()) *rc = 0;  // no feature: nothing shared
      if (*rc || is_cut()) return "";
      if (deduped > op.len || deduped % kB)
        return "deduped " + std::to_string(deduped) + " of " + std::to_string(op.len) + " bytes";
      // Both ranges read as before.
      for (const auto& [id, off] : {std::pair{op.id, op.off}, std::pair{op.id2, op.off2}}) {
        std::string buf(op.len, '\0');
        size_t got = 0;
        *rc = fs.read(ino_of(id), off, op.len, buf.data(), &got);
        if (*rc || is_cut()) return "";
        if (got != op.len) return "read " + std::to_string(got) + " bytes after the dedupe";
        if (std::string bad = check_read(*m.node(id), off, buf); !bad.empty())
          return "after the dedupe, #" + std::to_string(id) + ": " + bad;
      }
      if (!m.block_sharing_alone()) return "";
      // Every block both map written is now one block, counted (FORMAT.md "Shared blocks").
      std::map<uint64_t, uint64_t> at[2];  // logical -> device block, of the two ranges
      for (int k = 0; k < 2; ++k) {
        InodeReport rep;
        if ((*rc = fs.inspect(ino_of(k ? op.id2 : op.id), &rep))) return "";
        const uint64_t first = (k ? op.off2 : op.off) / kB, count = op.len / kB;
        for (const Extent& e : rep.extents) {
          if (e.unwritten()) continue;
          for (uint32_t i = 0; i < e.blocks(); ++i) {
            if (e.logical + i >= first && e.logical + i < first + count)
              at[k][e.logical + i - first] = e.physical + i;
          }
        }
      }
      for (const auto& [i, p] : at[0]) {
        auto it = at[1].find(i);
        if (it == at[1].end()) continue;
        if (it->second != p || fs.block_refs(p) < 2) {
          return "block " + std::to_string(op.off2 / kB + i) + " of #" + std::to_string(op.id2) +
                 " is device block " + std::to_string(it->second) + ", the source's " +
                 std::to_string(p) + " (" + std::to_string(fs.block_refs(p)) +
                 " references): equal blocks not shared";
        }
      }
      return "";
    }
  }
  return "";
}

std::string Session::apply(const Op& op) {
  const bool was_cut = cut_->is_cut();
  const size_t before = model_.current();
  const uint64_t commits = fs_->stats().commits;
  int rc = 0;
  std::string bad = run_op(*fs_, model_, op, cut_.get(), &rc);
  // A commit counted during the operation is durable: everything before the operation is.
  if (fs_->stats().commits != commits) model_.durable(before);
  if (!bad.empty()) return bad;
  if (rc != 0 && !was_cut && !cut_->is_cut())
    return "returned " + errno_name(rc) + " before the cut\n" + log_;
  return "";
}

std::string Session::recover(uint64_t cut_after, double persist) {
  std::string err;
  if (!power_on(seed_, &err)) return err;
  if (cut_after > 0) {
    // The power goes again while the journal is being replayed or the mount commits.
    cut_->cut_at(cut_after, true, mix(seed_ + cut_after));
    (void)mount();
    power_cut(persist);
    if (!power_on(seed_, &err)) return err;
  }
  if (std::string e = fsck("of the crashed image"); !e.empty()) return e;
  if (std::string e = mount(); !e.empty()) return e + "\n" + log_;
  Observed o;
  if (std::string e = observe(*fs_, &o); !e.empty()) return "reading the recovered tree: " + e;
  size_t k = 0;
  if (std::string e = check(model_, model_.current(), o, &k); !e.empty()) return e;
  if (std::string e = check_shared_counts(*fs_, o); !e.empty())
    return "after recovery, the reference counts: " + e;
  matched_ = k;
  // Continue from what is there.
  std::vector<FileSeen> files;
  compare_meta(model_.state(k), o, &files);
  std::map<Id, std::string> data;
  for (const FileSeen& f : files) data[f.id] = o.nodes.at(f.ino).data;
  model_.restart(k, data);
  if (int rc = fs_->unmount(); rc) return "unmount after recovery: " + errno_name(rc) + "\n" + log_;
  fs_.reset();
  if (std::string e = fsck("after recovery"); !e.empty()) return e;
  return mount();
}

std::string Session::clean_cycle() {
  if (int rc = fs_->unmount(); rc) return "unmount: " + errno_name(rc) + "\n" + log_;
  fs_.reset();
  if (std::string e = fsck("after a clean unmount"); !e.empty()) return e;
  if (std::string e = mount(); !e.empty()) return e;
  model_.durable(model_.current());
  Observed o;
  if (std::string e = observe(*fs_, &o); !e.empty()) return "reading the tree: " + e;
  if (std::string e = check_shared_counts(*fs_, o); !e.empty()) return "reference counts: " + e;
  return check(model_, model_.current(), o);
}

// --- one cut -------------------------------------------------------------------------------

namespace {
// Mutating device calls per operation of next_op's mix, measured (about 2.3: most operations
// only change cached metadata; writes, and the commits of fsync and of the journal's
// half-full rule, reach the device): the cut point is drawn from [1, ops * kCallsPerOp], so
// that it nearly always lands inside the workload.
constexpr uint64_t kCallsPerOp = 2;
constexpr uint64_t kFlushesPerOp = 40;  // per 100 operations, measured likewise (about 41)
// The same with a commit at the end of every transaction scope (about 10.3 and 274).
constexpr uint64_t kCallsPerOpEach = 10;
constexpr uint64_t kFlushesPerOpEach = 270;
}  // namespace

CutReport run_cut(const CutOptions& o) {
  CutReport r;
  std::mt19937_64 work(mix(o.seed));          // the operations
  std::mt19937_64 cuts(mix(o.seed) ^ 0xc07);  // where and how the power goes
  auto trace = [&](const std::string& s) {
    if (o.verbose) r.trace.push_back(s);
  };
  std::string err;
  auto s = Session::make(o.seed, 64, &err, o.commit_each);
  if (!s) {
    r.failure = "setup: " + err;
    return r;
  }
  // Where the power goes: after the last operation (one cut in ten); as a flush is issued
  // (three in ten: everything written since the previous flush is still volatile, which is
  // what finds a missing flush); or at any write (torn), flush or trim.
  const uint64_t ops = static_cast<uint64_t>(std::max(o.ops, 1));
  const uint64_t where = cuts() % 10;
  const uint64_t flushes_per_op = o.commit_each ? kFlushesPerOpEach : kFlushesPerOp;
  const uint64_t calls_per_op = o.commit_each ? kCallsPerOpEach : kCallsPerOp;
  if (where >= 1 && where <= 3) {
    s->device().cut_at_flush(1 + cuts() % (ops * flushes_per_op / 100 + 1));
  } else if (where > 3) {
    const uint64_t n = 1 + cuts() % (ops * calls_per_op);
    s->device().cut_at(n, true, cuts());
  }
  for (int i = 0; i < o.ops && !s->device().is_cut(); ++i) {
    const Op op = next_op(s->model(), work);
    const uint64_t calls = s->device().mutations();
    std::string bad = s->apply(op);
    ++r.ops_run;
    r.clones += op.kind == OpKind::kClone;
    r.dedupes += op.kind == OpKind::kDedupe;
    trace("op " + std::to_string(i) + ": " + op.describe() + "  [device calls " +
          std::to_string(calls) + ".." + std::to_string(s->device().mutations()) + ", states " +
          std::to_string(s->model().lo()) + ".." + std::to_string(s->model().current()) + "]");
    if (!bad.empty()) {
      r.failure = "op " + std::to_string(i) + " (" + op.describe() + "): " + bad;
      return r;
    }
  }
  r.calls = s->device().mutations();
  r.flushes = s->device().flushes();
  r.cloned_blocks = s->fs().stats().cloned_blocks;
  r.deduped_blocks = s->fs().stats().deduped_blocks;
  r.cut_call = s->device().is_cut() ? r.calls : 0;
  r.cut_at_flush = where >= 1 && where <= 3 && r.cut_call;
  // How much of the volatile cache survives: none, all, half, any share, or nearly all
  // (a few writes lost among many kept: what catches a missing flush) or nearly none.
  std::uniform_real_distribution<double> share(0, 1);
  const int how = static_cast<int>(cuts() % 6);
  r.persist = how == 0   ? 0.0
              : how == 1 ? 1.0
              : how == 2 ? 0.5
              : how == 3 ? share(cuts)
              : how == 4 ? 1 - 0.1 * share(cuts)
                         : 0.1 * share(cuts);
  r.lo = s->model().lo();
  r.hi = s->model().current();
  trace(r.cut_call ? "cut at device call " + std::to_string(r.cut_call) : "cut after the workload");
  s->power_cut(r.persist);
  if (cuts() % 5 == 0) r.recovery_cut = 1 + cuts() % 40;
  const double persist2 = static_cast<double>(cuts() % 3) / 2;
  trace("power cut, persist " + std::to_string(r.persist) +
        (r.recovery_cut ? "; recovery cut at call " + std::to_string(r.recovery_cut) : ""));
  if (std::string e = s->recover(r.recovery_cut, persist2); !e.empty()) {
    r.failure =
        "recovery (states " + std::to_string(r.lo) + ".." + std::to_string(r.hi) + "): " + e;
    return r;
  }
  r.matched = s->matched();
  if (o.verbose) {
    trace("recovered state " + std::to_string(r.matched) + ":");
    for (const auto& [path, id] : s->model().names()) {
      const MNode* n = s->model().node(id);
      trace("  " + path + " #" + std::to_string(id) + " inode " + std::to_string(n->ino) + " " +
            type_name(n->mode) + (S_ISREG(n->mode) ? " size " + std::to_string(n->size) : ""));
    }
  }
  // The recovered filesystem works: a few more operations, then a clean unmount and check.
  const int more = 5 + static_cast<int>(work() % 16);
  for (int i = 0; i < more; ++i) {
    const Op op = next_op(s->model(), work);
    std::string bad = s->apply(op);
    r.clones += op.kind == OpKind::kClone;
    r.dedupes += op.kind == OpKind::kDedupe;
    trace("after recovery, op " + std::to_string(i) + ": " + op.describe());
    if (!bad.empty()) {
      r.failure = "after recovery, op " + std::to_string(i) + " (" + op.describe() + "): " + bad;
      return r;
    }
  }
  if (std::string e = s->clean_cycle(); !e.empty()) {
    r.failure = "after recovery: " + e;
    return r;
  }
  r.passed = true;
  return r;
}

bool parse_number(const char* s, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  *out = std::strtoull(s, &end, 0);
  return errno == 0 && end != s && *end == '\0';
}

std::string one_line(const std::string& s, size_t max) {
  std::string out;
  bool line_start = false;
  for (char c : s) {
    if (c == '\n') {
      while (!out.empty() && out.back() == ' ') out.pop_back();
      line_start = true;
    } else if (!(line_start && c == ' ')) {
      if (line_start && !out.empty()) out += " | ";
      line_start = false;
      out += c;
    }
  }
  if (max && out.size() > max) out = out.substr(0, max) + "...";
  return out;
}

}  // namespace warpfs::fs::crash
