// The concurrent stress harness (stress.h).
#include "fs/stress.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "fs/crash_harness.h"
#include "warpfs/blockdev/devices.h"
#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/fsck.h"
#include "warpfs/fs/mkfs.h"

namespace warpfs::fs::stress {

namespace {

using crash::CutDevice;
using crash::Id;
using crash::MNode;
using crash::Model;
using crash::Observed;
using crash::Op;
using crash::OpKind;

constexpr uint64_t kB = kBlockSize;

// Lookup references a test thread holds, as the kernel holds a dentry's inode: every inode
// in `inos` from `first` on is forgotten once, by release() or at the end of the scope.
struct HeldRefs {
  Filesystem& fs;
  std::vector<Ino>& inos;
  size_t first = 0;  // inos[0, first) are not references of ours
  void release() {
    for (size_t i = first; i < inos.size(); ++i) fs.forget(inos[i], 1);
    inos.resize(std::min(first, inos.size()));
  }
  ~HeldRefs() { release(); }
};

std::string errno_name(int rc) {
  return rc == 0 ? "0" : std::string(strerrorname_np(rc) ? strerrorname_np(rc) : "?");
}

// The device stack of one power-on: controller, driver, optional cache, and the CutDevice
// the filesystem sees.
struct Machine {
  std::unique_ptr<test::TestDevices> devices;  // one namespace, or a RAID set's members
  std::unique_ptr<CutDevice> cut;
  std::unique_ptr<Filesystem> fs;
  std::mutex log_mu;
  std::string log;  // log_mu
  uint64_t power_ons = 0;

  std::string power_on(const Options& o) {
    nvme::EmulatedConfig cfg;
    cfg.seed = crash::mix(o.seed ^ ++power_ons);
    cfg.inline_io = (o.seed & 1) != 0;  // as the daemon runs it, or on the worker threads
    cfg.worker_threads = 1 + static_cast<unsigned>((o.seed >> 1) & 1);
    std::string err;
    const uint64_t timeout = nvme::EngineOptions{}.io_timeout_ns;
    if (!devices) {  // the first power-on: fresh media
      devices = test::TestDevices::make(o.mib << 20, &err, cfg, o.cache_mb, timeout);
      if (!devices) return err;
    } else if (!devices->power_on(cfg, o.cache_mb, timeout, &err)) {
      return err;
    }
    cut = devices->make_cut();
    return "";
  }
  std::string mount(const Options& o) {
    MountOptions mo;
    mo.commit_interval_ms = o.commit_ms;
    mo.commit_every_transaction = o.commit_each;
    // A tiny metadata cache on every other seed: blocks are evicted and read back all the time.
    mo.meta_cache_mb = o.meta_cache_mb ? o.meta_cache_mb : (o.seed & 2) ? 1 : 32;
    mo.log = [this](const std::string& s) {
      std::lock_guard<std::mutex> g(log_mu);
      log += s + "\n";
    };
    std::string err;
    fs = Filesystem::mount(*cut, mo, &err);
    return fs ? "" : "mount failed: " + err + "\n" + logged();
  }
  std::string logged() {
    std::lock_guard<std::mutex> g(log_mu);
    return log;
  }
  void clear_log() {
    std::lock_guard<std::mutex> g(log_mu);
    log.clear();
  }
  std::string fsck(const char* when) {
    FsckOptions fo;  // check only
    std::string out;
    FsckResult r =
        warpfs::fs::fsck(*cut, fo, [&](const std::string& s) { out += "  " + s + "\n"; });
    if (r.exit_code == kFsckClean) return "";
    return std::string("fsck ") + when + ": exit " + std::to_string(r.exit_code) + " " + r.error +
           "\n" + out;
  }
  // Unmount; "" or why it failed (an error, or anything the filesystem logged).
  std::string unmount(const char* when) {
    const int rc = fs->unmount();
    fs.reset();
    std::string l = logged();
    if (rc != 0) return std::string("unmount ") + when + ": " + errno_name(rc) + "\n" + l;
    if (std::string w = warnings(l); !w.empty())
      return std::string("the filesystem logged ") + when + ":\n" + w;
    return "";
  }
  // The lines of `l` that tell of trouble: all but a group's first reference-count table
  // being made (refcount.cc), which any first clone of a group logs.
  static std::string warnings(const std::string& l) {
    std::string out;
    for (size_t at = 0; at < l.size();) {
      const size_t end = std::min(l.find('\n', at), l.size());
      const std::string line = l.substr(at, end - at);
      if (line.find(": reference-count table made at block ") == std::string::npos)
        out += line + "\n";
      at = end + 1;
    }
    return out;
  }
  void power_cut(double persist) {
    cut->cut();
    devices->power_cut(persist);  // every member, each on its own draws
    fs.reset();
    cut.reset();
    devices->power_off();
  }
  ~Machine() {
    fs.reset();
    cut.reset();
    devices.reset();
  }
};

// The first failure of any thread; the others stop once it is set.
class Failure {
 public:
  void set(const std::string& s) {
    std::lock_guard<std::mutex> g(mu_);
    if (what_.empty()) what_ = s;
    failed_.store(true);
  }
  bool failed() const { return failed_.load(); }
  std::string what() {
    std::lock_guard<std::mutex> g(mu_);
    return what_;
  }

 private:
  std::mutex mu_;
  std::string what_;  // mu_
  std::atomic<bool> failed_{false};
};

// One worker: a subtree, its model, and the operations it ran.
struct Worker {
  int index = 0;
  Ino dir = 0;
  std::unique_ptr<Model> model;
  std::mt19937_64 rng;
  std::deque<std::pair<size_t, uint64_t>> pending;  // (state reached, commits when it was)
  std::deque<std::string> trace;                    // the last operations (verbose)
  uint64_t ops = 0;
  Ino sink = 0;          // /clones/wK: where its clones of other workers' files go
  std::mt19937_64 xrng;  // those clones' draws (next_op's stay as they were)
  uint64_t clones = 0, dedupes = 0;
};

class Run {
 public:
  explicit Run(const Options& o) : o_(o) {}
  Report go();

 private:
  std::string setup();
  // The concurrent phase: workers run `ops` operations each (stopping at a cut).
  void phase(uint64_t ops, bool allow_cut);
  void worker_loop(Worker& w, uint64_t ops, bool allow_cut);
  void sharer_loop(int index, uint64_t seed);
  void observer_loop(uint64_t seed);
  // A range of another worker's file (found by readdir) cloned into w's sink; "" or why not.
  std::string clone_across(Worker& w);
  // Whether a stamped block of `ino` may carry `stamp`'s stamp: `stamp` was cloned into it,
  // or into a file cloned into it, and so on (cloned_from_).
  bool may_hold(Ino ino, Ino stamp);
  void cloned(Ino from, Ino to) {
    std::lock_guard<std::mutex> g(clones_mu_);
    cloned_from_[to].insert(from);
  }
  bool stop() const { return done_.load() || failure_.failed(); }
  bool cut() const { return m_.cut && m_.cut->is_cut(); }
  // Every worker's held opens released (the model follows).
  std::string release_all();
  // The tree's invariants and each worker's subtree against its model (`hi`: the states up
  // to the last reached are allowed, from its lower bound; exact when lo == hi).
  // `fresh_mount`: nothing ran since the mount, so the shared blocks' counts are checked too.
  std::string check_all(const char* when, bool after_crash, bool fresh_mount);

  const Options& o_;
  Machine m_;
  std::vector<Worker> workers_;
  Ino shared_ = 0;
  // The sharers' clones: each destination inode, the inodes cloned into it. Entries are
  // made before the clone and never dropped (an inode number reused only loosens the check).
  std::mutex clones_mu_;
  std::map<Ino, std::set<Ino>> cloned_from_;  // clones_mu_
  std::atomic<uint64_t> sharer_clones_{0}, sharer_dedupes_{0}, dedup_passes_{0};
  std::atomic<bool> done_{false};
  std::atomic<int> workers_running_{0};
  std::atomic<uint64_t> other_ops_{0};
  Failure failure_;
  Report r_;
};

std::string Run::setup() {
  if (std::string e = m_.power_on(o_); !e.empty()) return e;
  MkfsOptions mo;
  mo.seed = 7;
  Geometry g;
  std::string err;
  if (!plan_geometry(m_.cut->block_count(), mo, &g, &err)) return err;
  if (blockdev::Status st = format(*m_.cut, mo, g, nullptr); !st.is_ok())
    return "format: " + st.to_string();
  if (std::string e = crash::enable_shared_blocks(*m_.cut); !e.empty()) return e;
  if (std::string e = m_.mount(o_); !e.empty()) return e;
  Attr a;
  Ino clones_dir = 0;
  if (int rc = m_.fs->mkdir(kRootInode, "clones", 0755, Caller{}, &a); rc)
    return "mkdir /clones: " + errno_name(rc);
  m_.fs->forget(a.ino, 1);
  clones_dir = a.ino;
  for (int k = 0; k < o_.workers; ++k) {
    if (int rc = m_.fs->mkdir(kRootInode, "w" + std::to_string(k), 0755, Caller{}, &a); rc)
      return "mkdir /w" + std::to_string(k) + ": " + errno_name(rc);
    m_.fs->forget(a.ino, 1);
    Worker w;
    w.index = k;
    w.dir = a.ino;
    w.model = std::make_unique<Model>(a.ino);
    // Shared blocks, and others move them: the dedup pass, clones of its files by others.
    w.model->set_block_sharing(true, false);
    std::seed_seq ss{static_cast<uint32_t>(o_.seed), static_cast<uint32_t>(o_.seed >> 32),
                     static_cast<uint32_t>(k), 0x5eedu};
    w.rng.seed(ss);
    w.xrng.seed(crash::mix(o_.seed * 131 + static_cast<uint64_t>(k)));
    if (int rc = m_.fs->mknod(clones_dir, "w" + std::to_string(k), S_IFREG | 0644, 0, Caller{}, &a);
        rc)
      return "create /clones/w" + std::to_string(k) + ": " + errno_name(rc);
    m_.fs->forget(a.ino, 1);
    w.sink = a.ino;
    workers_.push_back(std::move(w));
  }
  if (int rc = m_.fs->mkdir(kRootInode, "shared", 0755, Caller{}, &a); rc)
    return "mkdir /shared: " + errno_name(rc);
  m_.fs->forget(a.ino, 1);
  shared_ = a.ino;
  // The directories are there before any worker's first state.
  if (int rc = m_.fs->sync(); rc) return "sync: " + errno_name(rc);
  return "";
}

void Run::worker_loop(Worker& w, uint64_t ops, bool allow_cut) {
  Model& m = *w.model;
  m.keep_history(allow_cut);  // the states a crash may show; without one only the last counts
  Filesystem& fs = *m_.fs;
  for (uint64_t i = 0; i < ops && !failure_.failed() && !cut(); ++i) {
    if (allow_cut) {
      // What a commit that began after an operation ended made durable.
      const uint64_t commits = fs.stats().commits;
      while (!w.pending.empty() && w.pending.front().second + 2 <= commits) {
        m.durable(w.pending.front().first);
        w.pending.pop_front();
      }
    }
    if (workers_.size() > 1 && w.xrng() % 16 == 0) {
      if (std::string e = clone_across(w); !e.empty()) {
        failure_.set("worker " + std::to_string(w.index) + ", a clone of another's file: " + e +
                     "\n" + m_.logged());
        return;
      }
    }
    const Op op = crash::next_op(m, w.rng);
    const bool was_cut = cut();
    int rc = 0;
    const std::string bad = crash::run_op(fs, m, op, m_.cut.get(), &rc);
    ++w.ops;
    w.clones += op.kind == OpKind::kClone;
    w.dedupes += op.kind == OpKind::kDedupe;
    if (o_.verbose) {
      w.trace.push_back(op.describe() + " -> " + errno_name(rc));
      if (w.trace.size() > 40) w.trace.pop_front();
    }
    if (!bad.empty() || (rc != 0 && !was_cut && !cut())) {
      failure_.set("worker " + std::to_string(w.index) + ", op " + std::to_string(i) + " (" +
                   op.describe() + "): " + (bad.empty() ? "returned " + errno_name(rc) : bad) +
                   "\n" + m_.logged());
      return;
    }
    if (allow_cut) w.pending.emplace_back(m.current(), fs.stats().commits);
  }
}

std::string Run::clone_across(Worker& w) {
  Filesystem& fs = *m_.fs;
  const Worker& v = workers_[(static_cast<size_t>(w.index) + 1 + w.xrng() % (workers_.size() - 1)) %
                             workers_.size()];
  std::vector<std::string> names;
  int rc = fs.readdir(v.dir, 0, [&](const DirEntry& e) {
    if (e.type == DT_REG) names.push_back(e.name);
    return true;
  });
  if (rc) return cut() ? "" : "readdir: " + errno_name(rc);
  if (names.empty()) return "";
  Attr a;
  rc = fs.lookup(v.dir, names[w.xrng() % names.size()], &a);
  if (rc) return rc == ENOENT || cut() ? "" : "lookup: " + errno_name(rc);  // removed since
  std::vector<Ino> held{a.ino};
  HeldRefs forget{fs, held};
  if (!S_ISREG(a.mode) || a.size == 0) return "";  // the name went to another inode
  // Anywhere in the source, alike in a block or not, to the sink's first 4 MiB.
  uint64_t off = w.xrng() % a.size, off2 = w.xrng() % (4 << 20);
  if (w.xrng() % 3 != 0) off2 = off2 - off2 % kB + off % kB;
  const uint64_t len = 1 + w.xrng() % (256 * 1024);
  uint64_t copied = 0;
  ++w.clones;
  rc = fs.copy_file_range(a.ino, off, w.sink, off2, len, &copied);
  if (rc && !cut()) return "copy_file_range returned " + errno_name(rc);
  if (copied > len) return "copied " + std::to_string(copied) + " of " + std::to_string(len);
  return "";
}

bool Run::may_hold(Ino ino, Ino stamp) {
  std::lock_guard<std::mutex> g(clones_mu_);
  std::set<Ino> seen{ino};
  std::vector<Ino> todo{ino};
  while (!todo.empty()) {
    auto it = cloned_from_.find(todo.back());
    todo.pop_back();
    if (it == cloned_from_.end()) continue;
    for (Ino from : it->second) {
      if (from == stamp) return true;
      if (seen.insert(from).second) todo.push_back(from);
    }
  }
  return false;
}

// The errors a racing call in /shared may legitimately return.
bool expected(int rc, std::initializer_list<int> ok) {
  if (rc == 0) return true;
  for (int e : ok) {
    if (rc == e) return true;
  }
  return false;
}

void Run::sharer_loop(int index, uint64_t seed) {
  Filesystem& fs = *m_.fs;
  std::mt19937_64 rng(crash::mix(seed));
  auto below = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };
  // The lookup references taken by pick_dir in this iteration, given back at its end. They
  // are held while the directory is used, as the kernel holds a dentry's inode: without one
  // a removed directory's inode number may be reused at once, by a regular file, say, and
  // the operation would then see ENOTDIR, which no caller of the kernel can see.
  std::vector<Ino> refs;
  HeldRefs forget_refs{fs, refs};
  // A directory of /shared ("" = /shared itself, or d0..d2) and a name in it.
  auto pick_dir = [&](Ino* dir) -> int {
    if (below(3) == 0) {
      *dir = shared_;
      return 0;
    }
    Attr a;
    const int rc = fs.lookup(shared_, "d" + std::to_string(below(3)), &a);
    if (rc) return rc;
    refs.push_back(a.ino);
    if (!S_ISDIR(a.mode)) return ENOTDIR;
    *dir = a.ino;  // may be removed before it is used: its operations then see ENOENT
    return 0;
  };
  auto name = [&] {
    return below(4) == 0 ? "d" + std::to_string(below(3)) : "s" + std::to_string(below(10));
  };
  std::vector<std::pair<Ino, uint32_t>> held;  // inodes opened and not released
  auto fail = [&](const std::string& what, int rc) {
    failure_.set("sharer " + std::to_string(index) + ": " + what + " returned " + errno_name(rc) +
                 "\n" + m_.logged());
  };
  std::vector<uint8_t> buf(16 * kB);
  // Racing with a removal of the directory itself: ENOENT; with a rename over a directory
  // being emptied: ENOTEMPTY; and so on.
  const std::initializer_list<int> kNameRaces = {ENOENT,  EEXIST, ENOTEMPTY, EISDIR,
                                                 ENOTDIR, EINVAL, EPERM,     EMLINK};
  while (!stop() && !cut()) {
    forget_refs.release();
    other_ops_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t r = below(106);
    Ino dir;
    if (int rc = pick_dir(&dir); rc) {
      if (!expected(rc, {ENOENT, ENOTDIR})) return fail("lookup of a shared directory", rc);
      continue;
    }
    Attr a;
    const std::string n = name();
    int rc;
    if (r < 12) {
      rc = n[0] == 'd' ? fs.mkdir(dir, n, 0755, Caller{}, &a)
                       : fs.mknod(dir, n, S_IFREG | 0644, 0, Caller{}, &a);
      if (rc == 0) fs.forget(a.ino, 1);
      if (!expected(rc, {ENOENT, EEXIST}) && !cut()) return fail("create " + n, rc);
    } else if (r < 22) {
      rc = below(3) == 0 ? fs.rmdir(dir, n) : fs.unlink(dir, n);
      if (!expected(rc, kNameRaces) && !cut()) return fail("unlink/rmdir " + n, rc);
    } else if (r < 34) {
      Ino dir2;
      if (pick_dir(&dir2) != 0) continue;
      const unsigned flags = below(4) == 0 ? RENAME_EXCHANGE : below(4) == 0 ? RENAME_NOREPLACE : 0;
      rc = fs.rename(dir, n, dir2, name(), flags);
      if (!expected(rc, kNameRaces) && !cut()) return fail("rename " + n, rc);
    } else if (r < 40) {
      if (fs.lookup(dir, n, &a) != 0) continue;
      Ino dir2;
      if (pick_dir(&dir2) == 0) {
        Attr b;
        rc = fs.link(a.ino, dir2, name(), &b);
        if (rc == 0) fs.forget(b.ino, 1);
        if (!expected(rc, kNameRaces) && !cut()) {
          fs.forget(a.ino, 1);
          return fail("link " + n, rc);
        }
      }
      fs.forget(a.ino, 1);
    } else if (r < 80) {
      // Data through a looked-up inode: it stays valid (an orphan at worst) while we hold it.
      if (fs.lookup(dir, n, &a) != 0) continue;
      const Ino ino = a.ino;
      if (S_ISDIR(a.mode)) {
        std::vector<DirEntry> ents;
        rc = fs.readdir(ino, 0, [&](const DirEntry& e) {
          ents.push_back(e);
          return true;
        });
        if (rc && !cut()) {
          fs.forget(ino, 1);
          return fail("readdir", rc);
        }
      } else if (S_ISREG(a.mode)) {
        const uint64_t blk = below(48), nb = 1 + below(4);
        const uint64_t what = below(10);
        if (what < 4) {
          for (uint64_t i = 0; i < nb; ++i)
            crash::stamp_block(buf.data() + i * kB, ino, blk + i, rng());
          size_t w = 0;
          rc = fs.write(ino, blk * kB, nb * kB, reinterpret_cast<const char*>(buf.data()), &w);
        } else if (what < 7) {
          size_t got = 0;
          rc = fs.read(ino, blk * kB, nb * kB, reinterpret_cast<char*>(buf.data()), &got,
                       what == 6 ? ReadFor::kDirect : ReadFor::kCache);
          if (rc == 0 && !cut()) {
            for (uint64_t i = 0; i * kB < got; ++i) {
              if (std::string e = crash::check_stamped_block(
                      buf.data() + i * kB, ino, blk + i,
                      [this](Ino file, Ino stamp) { return may_hold(file, stamp); });
                  !e.empty()) {
                fs.forget(ino, 1);
                failure_.set("sharer " + std::to_string(index) + ": read of " + n + ": " + e);
                return;
              }
            }
          }
        } else if (what == 7) {
          SetAttr s;
          s.size = true;
          s.new_size = below(40) * kB;
          Attr out;
          rc = fs.setattr(ino, s, &out);
        } else if (what == 8) {
          rc = fs.fallocate(ino, below(2) ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE : 0,
                            blk * kB, nb * kB);
        } else {
          const std::string v(below(200), 'v');
          rc = fs.setxattr(ino, "user.s" + std::to_string(below(3)), v.data(), v.size(), 0);
        }
        if (rc && !cut()) {
          fs.forget(ino, 1);
          return fail("data operation on " + n, rc);
        }
      }
      if (below(8) == 0 && held.size() < 4 && fs.open(ino, O_RDWR) == 0) {
        held.emplace_back(ino, 0);  // kept open: unlinking it leaves an orphan
      }
      fs.forget(ino, 1);
    } else if (r < 86) {
      if (!held.empty()) {
        fs.release(held.back().first);
        held.pop_back();
      }
    } else if (r < 94) {
      // Readdir of a shared directory: each name listed resolves, or was removed meanwhile.
      std::vector<DirEntry> ents;
      rc = fs.readdir(dir, 0, [&](const DirEntry& e) {
        ents.push_back(e);
        return true;
      });
      if (rc && !expected(rc, {ENOENT}) && !cut()) return fail("readdir", rc);
      for (const DirEntry& e : ents) {
        if (e.name == "." || e.name == "..") continue;
        rc = fs.lookup(dir, e.name, &a);
        if (rc == 0) {
          fs.forget(a.ino, 1);
        } else if (!expected(rc, {ENOENT}) && !cut()) {
          return fail("lookup of listed " + e.name, rc);
        }
      }
    } else if (r < 97) {
      rc = fs.fsync(dir, false);
      if (rc && !cut()) return fail("fsync", rc);
    } else if (r >= 100) {
      // Whole blocks of one file cloned to the same offset of another (the stamps stay
      // right for their offset; the destination may now hold the source's), or a dedupe of
      // two ranges, which shares only equal blocks and changes no byte.
      Ino dir2;
      if (pick_dir(&dir2) != 0) continue;
      Attr b;
      if (fs.lookup(dir, n, &a) != 0) continue;
      refs.push_back(a.ino);  // given back with pick_dir's at the next turn
      if (fs.lookup(dir2, name(), &b) != 0) continue;
      refs.push_back(b.ino);
      if (!S_ISREG(a.mode) || !S_ISREG(b.mode) || a.ino == b.ino) continue;
      const uint64_t blk = below(48), nb = 1 + below(8);
      uint64_t done = 0;
      if (r < 104) {
        cloned(a.ino, b.ino);  // before: a reader may see the blocks as soon as they are mapped
        sharer_clones_.fetch_add(1, std::memory_order_relaxed);
        rc = fs.copy_file_range(a.ino, blk * kB, b.ino, blk * kB, nb * kB, &done);
        if (rc && !cut()) return fail("clone of " + n, rc);
      } else {
        sharer_dedupes_.fetch_add(1, std::memory_order_relaxed);
        rc = fs.dedupe_range(a.ino, blk * kB, b.ino, below(48) * kB, nb * kB, &done);
        // EINVAL: a range past the end of a file that a truncate just shortened.
        if (!expected(rc, {EINVAL}) && !cut()) return fail("dedupe of " + n, rc);
      }
    } else {
      struct statvfs sv;
      rc = fs.statfs(&sv);
      if (rc) return fail("statfs", rc);
    }
  }
  for (auto [ino, unused] : held) fs.release(ino);
}

void Run::observer_loop(uint64_t seed) {
  Filesystem& fs = *m_.fs;
  std::mt19937_64 rng(crash::mix(seed ^ 0x0b5));
  bool passed_once = false;  // the first walk that meets a file ends with a dedup pass
  while (!stop() && !cut() && !workers_.empty()) {
    bool saw_file = false;
    other_ops_.fetch_add(1, std::memory_order_relaxed);
    // A walk down a worker's subtree, as `find` would do beside it. The directories found
    // are held (a lookup reference each, as the kernel holds them) until they are read.
    std::vector<Ino> dirs{workers_[rng() % workers_.size()].dir};
    HeldRefs forget{fs, dirs, 1};  // dirs[0], the worker's directory, was not looked up
    for (size_t i = 0; i < dirs.size() && i < 16 && !stop(); ++i) {
      std::vector<DirEntry> ents;
      int rc = fs.readdir(dirs[i], 0, [&](const DirEntry& e) {
        ents.push_back(e);
        return true;
      });
      if (rc) {
        if (expected(rc, {ENOENT}) || cut()) continue;  // removed since we found it
        failure_.set("observer: readdir of inode " + std::to_string(dirs[i]) + " returned " +
                     errno_name(rc) + "\n" + m_.logged());
        return;
      }
      for (const DirEntry& e : ents) {
        if (e.name == "." || e.name == "..") continue;
        Attr a;
        rc = fs.lookup(dirs[i], e.name, &a);
        if (rc) {
          if (expected(rc, {ENOENT}) || cut()) continue;
          failure_.set("observer: lookup of '" + e.name + "' (listed in inode " +
                       std::to_string(dirs[i]) + ") returned " + errno_name(rc) + "\n" +
                       m_.logged());
          return;
        }
        Attr b;
        rc = fs.getattr(a.ino, &b);
        if (rc == 0 && b.ino != a.ino) rc = EIO;
        if (rc && !cut()) {
          fs.forget(a.ino, 1);
          failure_.set("observer: getattr of a looked-up inode returned " + errno_name(rc));
          return;
        }
        saw_file |= S_ISREG(a.mode);
        if (S_ISREG(a.mode) && rng() % 4 == 0) {
          std::string x;
          (void)fs.listxattr(a.ino, &x);
        }
        if (S_ISDIR(a.mode)) {
          dirs.push_back(a.ino);  // forgotten once read
        } else {
          fs.forget(a.ino, 1);
        }
      }
    }
    struct statvfs sv;
    (void)fs.statfs(&sv);
    // A deduplication pass among all of it: one loop in 64, and the first that met a file
    // (how many loops a run makes depends on the machine's speed; a pass must be among them).
    if ((saw_file && !passed_once) || rng() % 64 == 0) {
      passed_once = true;
      dedup_passes_.fetch_add(1, std::memory_order_relaxed);
      DedupOptions d;
      d.table_mb = 1;
      d.stop = [this] { return stop() || cut(); };
      DedupReport rep;
      if (int rc = fs.dedup(d, &rep); rc && !cut()) {
        failure_.set("observer: the dedup pass returned " + errno_name(rc) + "\n" + m_.logged());
        return;
      }
    }
  }
}

void Run::phase(uint64_t ops, bool allow_cut) {
  done_ = false;
  const uint64_t c0 = m_.fs->stats().commits;
  std::vector<std::thread> others;
  for (int k = 0; k < o_.sharers; ++k)
    others.emplace_back(
        [this, k] { sharer_loop(k, crash::mix(o_.seed * 31 + static_cast<uint64_t>(k))); });
  if (o_.observer) others.emplace_back([this] { observer_loop(o_.seed); });
  std::vector<std::thread> ws;
  for (Worker& w : workers_)
    ws.emplace_back([this, &w, ops, allow_cut] { worker_loop(w, ops, allow_cut); });
  for (auto& t : ws) t.join();
  done_ = true;
  for (auto& t : others) t.join();
  const FsStats st = m_.fs->stats();
  if (!cut()) r_.commits += st.commits - c0;
  r_.cloned_blocks += st.cloned_blocks;  // since this mount: one phase per mount
  r_.deduped_blocks += st.deduped_blocks;
}

std::string Run::release_all() {
  for (Worker& w : workers_) {
    Model& m = *w.model;
    std::vector<std::pair<Id, uint32_t>> open;
    for (const auto& [id, n] : m.now().nodes) {
      if (n->opens > 0) open.emplace_back(id, n->opens);
    }
    for (auto [id, count] : open) {
      for (uint32_t i = 0; i < count; ++i) {
        Op op;
        op.kind = OpKind::kRelease;
        op.id = id;
        int rc = 0;
        if (std::string bad = crash::run_op(*m_.fs, m, op, nullptr, &rc); !bad.empty()) return bad;
      }
    }
    m.durable(m.current());
  }
  return "";
}

std::string Run::check_all(const char* when, bool after_crash, bool fresh_mount) {
  Observed o;
  if (std::string e = crash::observe(*m_.fs, &o); !e.empty())
    return std::string("reading the tree ") + when + ": " + e;
  for (Worker& w : workers_) {
    Model& m = *w.model;
    size_t k = 0;
    if (std::string e = crash::check(m, m.current(), o, &k); !e.empty())
      return std::string("worker ") + std::to_string(w.index) + "'s subtree " + when + ": " + e;
    if (after_crash) {
      r_.durable_states += m.lo();
      r_.reached_states += m.current();
      r_.matched_states += k;
      m.restart(k, crash::recovered_data(m.state(k), o));
      w.pending.clear();
    }
  }
  if (std::string e = crash::check_invariants(
          o, shared_, [this](Ino file, Ino stamp) { return may_hold(file, stamp); });
      !e.empty())
    return std::string(when) + ": " + e;
  // Right after a mount every inode that maps a block is in the tree (orphans are freed).
  if (fresh_mount) {
    if (std::string e = crash::check_shared_counts(*m_.fs, o); !e.empty())
      return std::string("the reference counts ") + when + ": " + e;
  }
  return "";
}

Report Run::go() {
  if (std::string e = setup(); !e.empty()) {
    r_.failure = "setup: " + e;
    return r_;
  }
  std::mt19937_64 draw(crash::mix(o_.seed ^ 0xc07));
  if (o_.cut && draw() % 8 != 0) {
    // Mutating device calls: about two per worker operation, timed commits aside.
    const uint64_t n = 1 + draw() % (o_.ops * static_cast<uint64_t>(o_.workers) * 2 + 1);
    m_.cut->cut_at(n, true, draw());
  }
  phase(o_.ops, o_.cut);
  for (const Worker& w : workers_) r_.ops += w.ops;
  r_.ops += other_ops_.load();
  auto count_shares = [&] {
    r_.clones = sharer_clones_.load();
    r_.dedupes = sharer_dedupes_.load();
    r_.dedup_passes = dedup_passes_.load();
    for (const Worker& w : workers_) {
      r_.clones += w.clones;
      r_.dedupes += w.dedupes;
    }
  };
  count_shares();
  auto fail = [&](const std::string& e) {
    r_.failure = e;
    for (const Worker& w : workers_) {
      for (const std::string& t : w.trace)
        r_.trace.push_back("w" + std::to_string(w.index) + ": " + t);
    }
    return r_;
  };
  if (failure_.failed()) return fail(failure_.what());
  if (o_.cut) {
    r_.cut_call = cut() ? m_.cut->mutations() : 0;
    std::uniform_real_distribution<double> share(0, 1);
    m_.power_cut(draw() % 3 == 0 ? 0.0 : share(draw));
    if (std::string e = m_.power_on(o_); !e.empty()) return fail("power on: " + e);
    m_.clear_log();
    if (std::string e = m_.fsck("of the crashed image"); !e.empty()) return fail(e);
    if (std::string e = m_.mount(o_); !e.empty()) return fail("recovery: " + e);
    if (std::string e = check_all("after the power cut", true, true); !e.empty()) return fail(e);
    // The recovered filesystem takes the same load again.
    m_.clear_log();
    phase(std::max<uint64_t>(o_.ops / 4, 10), false);
    if (failure_.failed()) return fail("after recovery: " + failure_.what());
    count_shares();
  }
  if (std::string e = release_all(); !e.empty()) return fail(e);
  if (o_.tamper_model && !workers_.empty()) {
    Model& m = *workers_[0].model;
    bool done = false;
    for (const auto& [id, n] : m.now().nodes) {
      if (S_ISREG(n->mode) && n->size > 0) {
        const char first = n->blocks[0] ? (*n->blocks[0])[0] : '\0';
        crash::model_write(m.edit(id), 0, std::string(1, static_cast<char>(~first)));
        done = true;
        break;
      }
    }
    if (!done) {  // no data anywhere: claim a name instead
      MNode f;
      f.mode = S_IFREG | 0644;
      f.links = 1;
      f.ino = 999999;
      m.edit(0).entries["tampered"] = m.add(f);
    }
    m.step();
    m.durable(m.current());
  }
  if (std::string e = check_all("at the end of the workload", false, false); !e.empty())
    return fail(e);
  if (std::string e = m_.unmount("at the end"); !e.empty()) return fail(e);
  if (std::string e = m_.fsck("after the unmount"); !e.empty()) return fail(e);
  if (std::string e = m_.mount(o_); !e.empty()) return fail(e);
  if (std::string e = check_all("after a remount", false, true); !e.empty()) return fail(e);
  if (std::string e = m_.unmount("after the remount"); !e.empty()) return fail(e);
  if (std::string e = m_.fsck("at last"); !e.empty()) return fail(e);
  r_.passed = true;
  return r_;
}

}  // namespace

Report run(const Options& o) {
  Run r(o);
  return r.go();
}

}  // namespace warpfs::fs::stress
