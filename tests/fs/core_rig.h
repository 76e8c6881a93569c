// Test rig for the filesystem core: a RAM-backed emulated NVMe device, formatted, with the
// filesystem mounted on it through a device wrapper that can be cut off to simulate a crash.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "cache/cache_rig.h"
#include "warpfs/blockdev/devices.h"
#include "warpfs/blockdev/raid.h"
#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/fs/fsck.h"
#include "warpfs/fs/mkfs.h"
#include "warpfs/fs/replay.h"

namespace warpfs::fs::test {

// Runs a shell command line (a program under test); its exit status (-1 if it did not exit)
// and, through `out`, its standard output and error together.
inline int run_command(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  out->clear();
  while (std::fgets(buf, sizeof buf, p) != nullptr) *out += buf;
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Forwards to a device until cut(): from then on every call fails, as if the machine died.
// cut_at() arms the cut for a later call instead, so that it can land inside a journal
// commit, a checkpoint or a data write rather than only between operations.
class CutDevice final : public blockdev::BlockDevice {
 public:
  explicit CutDevice(blockdev::BlockDevice& d) : d_(d) {}
  void cut() { cut_ = true; }
  // Cuts when the nth write, flush or trim from now arrives (1: the next one): that call
  // fails, and so does every later one. With `tear`, a write cut this way first sends a
  // random subset (drawn from `seed`) of its blocks on, as a multi-block command that was
  // partly written when the power went (whole blocks only: 4 KiB is the atomic unit).
  // May be called while other threads call the device (the stress harness arms cuts under
  // running workers): the tear settings are published before the count that selects a call
  // (release), and read after it was seen (acquire). A torn write's blocks may interleave
  // with other threads' writes of the same blocks, as on a device losing power.
  void cut_at(uint64_t n, bool tear = false, uint64_t seed = 0) {
    tear_.store(tear, std::memory_order_relaxed);
    tear_seed_.store(seed, std::memory_order_relaxed);
    cut_at_.store(mutations_.load() + n, std::memory_order_release);
  }
  // A RAID set's members, each behind a CutDevice of its own (TestDevices::make_cut): a
  // write cut with a tear goes on whole to the set, and each member tears its own part on
  // its own draws, so a mirrored write reaches each copy in part, independently: the members
  // lose power at independent points of their own write streams. Set before use.
  void tear_members(std::vector<CutDevice*> m) { members_ = std::move(m); }
  // A member's CutDevice (below a set) passes a batch on whole while no cut is armed or
  // done, as the member would take it (its own submit: queued together, each in its class);
  // armed or cut, transfer by transfer as any CutDevice. Set before use.
  void pass_batches() { pass_batches_ = true; }
  void submit(Io* ios, int n) override {
    if (!pass_batches_ || cut_ || cut_at_.load(std::memory_order_acquire) != 0)
      return BlockDevice::submit(ios, n);
    for (int i = 0; i < n; ++i) {
      if (ios[i].write) {
        mutations_.fetch_add(1, std::memory_order_relaxed);
        writes_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    d_.submit(ios, n);
  }
  // Cuts when the nth flush from now arrives: the moment the most is still volatile.
  void cut_at_flush(uint64_t n) { cut_at_flush_ = flushes_.load() + n; }
  bool is_cut() const { return cut_; }
  // Writes, flushes and trims that arrived, the failed ones included; flushes alone.
  uint64_t mutations() const { return mutations_.load(); }
  uint64_t flushes() const { return flushes_.load(); }
  uint32_t block_bytes() const override { return d_.block_bytes(); }
  uint64_t block_count() const override { return d_.block_count(); }
  blockdev::Status read(uint64_t b, uint32_t n, void* buf) override {
    return cut_ ? dead() : d_.read(b, n, buf);
  }
  blockdev::Status read_uncached(uint64_t b, uint32_t n, void* buf) override {
    return cut_ ? dead() : d_.read_uncached(b, n, buf);
  }
  // A read already in flight when the cut comes ends as the device below ends it.
  blockdev::Status read_uncached_start(uint64_t b, uint32_t n, void* buf,
                                       std::unique_ptr<PendingRead>* pending) override {
    pending->reset();
    return cut_ ? dead() : d_.read_uncached_start(b, n, buf, pending);
  }
  // The device's own memory, as the filesystem would get it without the cut between (a RAID
  // set's buffers come from its first member: DMA memory there, not bounced).
  blockdev::Status alloc_io_buffer(size_t bytes, void** out) override {
    return d_.alloc_io_buffer(bytes, out);
  }
  void free_io_buffer(void* p, size_t bytes) override { d_.free_io_buffer(p, bytes); }
  blockdev::Status write(uint64_t b, uint32_t n, const void* buf) override {
    if (cut_) return dead();
    if (arrive()) {
      if (tear_.load(std::memory_order_relaxed)) {
        if (members_.empty()) {
          tear(b, n, buf);
        } else {
          const uint64_t seed = tear_seed_.load(std::memory_order_relaxed);
          for (size_t k = 0; k < members_.size(); ++k)
            members_[k]->cut_at(1, true, seed ^ ((k + 1) * 0xbf58476d1ce4e5b9ull));
          (void)d_.write(b, n, buf);  // each member tears its part, then is cut
        }
      }
      return dead();
    }
    writes_.fetch_add(1, std::memory_order_relaxed);
    return d_.write(b, n, buf);
  }
  blockdev::Status flush() override {
    if (cut_here_at_flush()) return dead();
    return d_.flush();
  }
  // A write-back sends writes (a cache below): a mutating call. The device's Flush alone is
  // a flush like flush().
  blockdev::Status write_back(const Range* r, size_t n) override {
    if (cut_ || arrive()) return dead();
    return d_.write_back(r, n);
  }
  blockdev::Status flush_device() override {
    if (cut_here_at_flush()) return dead();
    return d_.flush_device();
  }
  blockdev::Status trim(uint64_t b, uint64_t n) override {
    if (cut_ || arrive()) return dead();
    trims_.fetch_add(n, std::memory_order_relaxed);
    return d_.trim(b, n);
  }
  uint64_t trimmed() const { return trims_.load(); }

 private:
  static blockdev::Status dead() {
    return blockdev::Status::error(blockdev::Code::kIoError, "cut off");
  }
  // Counts a mutating call; true (and cut from now on) if it is the one cut_at() chose.
  bool arrive() {
    const uint64_t k = mutations_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (k != cut_at_.load(std::memory_order_acquire)) return false;
    cut_ = true;
    return true;
  }
  // A flush (flush() or flush_device(): both count as flushes and as mutating calls): true,
  // and cut from now on, if the device is cut already or this is the flush or the mutating
  // call chosen.
  bool cut_here_at_flush() {
    if (cut_) return true;
    const bool chosen =
        flushes_.fetch_add(1, std::memory_order_relaxed) + 1 == cut_at_flush_.load();
    if (arrive() || chosen) {
      cut_ = true;
      return true;
    }
    return false;
  }
  void tear(uint64_t b, uint32_t n, const void* buf) {
    // xorshift's state is never 0
    uint64_t x = (tear_seed_.load(std::memory_order_relaxed) ^ 0x9e3779b97f4a7c15ull) | 1;
    for (uint32_t i = 0; i < n; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
      if (x & 1)
        (void)d_.write(b + i, 1, static_cast<const char*>(buf) + size_t{i} * d_.block_bytes());
    }
  }
  blockdev::BlockDevice& d_;
  std::atomic<bool> cut_{false};
  std::atomic<uint64_t> writes_{0}, trims_{0};
  std::atomic<uint64_t> mutations_{0}, cut_at_{0};  // cut_at_ 0: not armed
  std::atomic<uint64_t> flushes_{0}, cut_at_flush_{0};
  // Set by cut_at() before cut_at_ (release); read by the call that cut_at_ selects.
  std::atomic<bool> tear_{false};
  std::atomic<uint64_t> tear_seed_{0};
  std::vector<CutDevice*> members_;  // set before use, then read only
  bool pass_batches_ = false;        // likewise
};

// The emulated namespaces under a filesystem test: one, or, with WARPFS_TEST_RAID=0, 1 or 10
// in the environment, a RAID set of two (four for 10) namespaces, each its own controller
// (and, when asked, its own cache) over its own media, so that a power cut loses each
// member's volatile write cache on its own draws. Tests of one device's faults and counters
// poke stacks[0]. Thread-safety: none; one test thread powers it on and off.
struct TestDevices {
  std::vector<std::shared_ptr<nvme::BackingStore>> stores;  // kept across power cycles
  std::vector<std::unique_ptr<cache::test::Stack>> stacks;
  std::vector<std::unique_ptr<blockdev::NvmeBlockDevice>> nvme;
  std::vector<std::unique_ptr<blockdev::CachedBlockDevice>> cached;
  std::vector<std::unique_ptr<CutDevice>> member_cuts;  // a set: one below the set per member
  std::unique_ptr<blockdev::RaidBlockDevice> raid;

  // -1 without WARPFS_TEST_RAID, else the level it names.
  static int raid_level() {
    const char* e = std::getenv("WARPFS_TEST_RAID");
    return e && *e ? std::atoi(e) : -1;
  }
  // Fresh media of `bytes` (split among the members of a set); powered on; a set labelled.
  static std::unique_ptr<TestDevices> make(
      uint64_t bytes, std::string* err, nvme::EmulatedConfig cfg = {}, uint64_t cache_mb = 0,
      uint64_t io_timeout_ns = nvme::EngineOptions{}.io_timeout_ns) {
    auto t = std::make_unique<TestDevices>();
    const int level = raid_level();
    const uint32_t n = level < 0 ? 1 : level == 10 ? 4 : 2;
    // A set has the capacity asked for: each member holds its group's share (all of it for
    // RAID 1), plus the label area, in whole stripes.
    const uint64_t groups = n / (level < 0 ? 1 : blockdev::raid_copies(level, n));
    const uint64_t each =
        n == 1 ? bytes
               : (bytes / groups + (1u << 20) + (128u << 10) - 1) & ~uint64_t{(128u << 10) - 1};
    for (uint32_t k = 0; k < n; ++k) t->stores.push_back(nvme::BackingStore::ram(each));
    if (!t->power_on(cfg, cache_mb, io_timeout_ns, err, true)) return nullptr;
    return t;
  }
  // A new controller per member over its media; `label`: write a new set's labels first.
  bool power_on(nvme::EmulatedConfig cfg, uint64_t cache_mb, uint64_t io_timeout_ns,
                std::string* err, bool label = false) {
    const uint64_t seed = cfg.seed;
    std::vector<blockdev::BlockDevice*> devs;
    for (size_t k = 0; k < stores.size(); ++k) {
      cfg.seed = seed + k * 0x9e3779b97f4a7c15ull;  // each member's own power-cut draws
      stacks.push_back(cache::test::Stack::make(0, stores[k], cfg, io_timeout_ns));
      if (!stacks.back()) return (*err = "cannot start the emulated controller"), false;
      nvme.push_back(blockdev::NvmeBlockDevice::create(*stacks.back()->engine, 1, 4096, err));
      if (!nvme.back()) return false;
      blockdev::BlockDevice* d = nvme.back().get();
      if (cache_mb > 0) {
        cached.push_back(blockdev::CachedBlockDevice::create(
            *stacks.back()->backend, blockdev::cache_of_size(cache_mb, 4096), err));
        if (!cached.back()) return false;
        d = cached.back().get();
      }
      devs.push_back(d);
    }
    if (stores.size() == 1) return true;
    for (blockdev::BlockDevice*& d : devs) {
      member_cuts.push_back(std::make_unique<CutDevice>(*d));
      member_cuts.back()->pass_batches();
      d = member_cuts.back().get();
    }
    std::vector<blockdev::RaidMemberSeen> seen(devs.size());
    for (size_t k = 0; k < devs.size(); ++k) seen[k].name = "member" + std::to_string(k);
    if (label) {
      blockdev::RaidLabel l;
      l.level = static_cast<uint32_t>(raid_level());
      l.member_count = static_cast<uint32_t>(devs.size());
      l.member_blocks =
          (devs[0]->block_count() - l.data_offset) / l.stripe_blocks * l.stripe_blocks;
      for (size_t k = 0; k < devs.size(); ++k) {
        l.set_uuid[k] = static_cast<uint8_t>(k + 1);
        l.members[k].kind = blockdev::RaidIdentity::kGenerated;
        l.members[k].id[0] = static_cast<uint8_t>(k + 1);
        l.members[k].name = seen[k].name;
      }
      if (!blockdev::write_member_labels(devs, l, err).is_ok()) return false;
    }
    raid = blockdev::RaidBlockDevice::assemble(devs, seen, nullptr, err);
    return raid != nullptr;
  }
  blockdev::BlockDevice& device() {
    if (raid) return *raid;
    return cached.empty() ? static_cast<blockdev::BlockDevice&>(*nvme[0]) : *cached[0];
  }
  // The CutDevice a test cuts the power with, over device(); for a set its torn writes tear
  // on each member independently (CutDevice::tear_members).
  std::unique_ptr<CutDevice> make_cut() {
    auto c = std::make_unique<CutDevice>(device());
    std::vector<CutDevice*> m;
    for (const auto& mc : member_cuts) m.push_back(mc.get());
    c->tear_members(std::move(m));
    return c;
  }
  // The power goes: every member's controller loses its volatile cache (`persist`: the share
  // of its 4 KiB units that reach the media anyway, each member drawing on its own). Then
  // power_off() once nothing above uses the devices.
  void power_cut(double persist) {
    for (auto& s : stacks) s->transport->power_cut(persist);
  }
  void power_off() {
    raid.reset();
    member_cuts.clear();
    cached.clear();
    nvme.clear();
    stacks.clear();
  }
  ~TestDevices() { power_off(); }
};

// A formatted device that nothing mounts, for tests of the journal alone: its superblock,
// and where replay says the next transaction goes. Null (with a failed expectation) if any
// step fails.
struct Formatted {
  std::unique_ptr<cache::test::Stack> stack;
  std::unique_ptr<blockdev::NvmeBlockDevice> dev;
  Superblock sb{};
  ReplayResult rr;

  static std::unique_ptr<Formatted> make(uint64_t bytes) {
    auto f = std::make_unique<Formatted>();
    f->stack = cache::test::Stack::make(bytes);
    if (!f->stack) return nullptr;
    std::string err;
    f->dev = blockdev::NvmeBlockDevice::create(*f->stack->engine, 1, kBlockSize, &err);
    EXPECT_TRUE(f->dev) << err;
    if (!f->dev) return nullptr;
    Geometry g;
    MkfsOptions mo;
    mo.seed = 7;
    const bool ok = plan_geometry(f->dev->block_count(), mo, &g, &err) &&
                    format(*f->dev, mo, g, nullptr).is_ok() && f->dev->read(0, 1, &f->sb).is_ok() &&
                    replay_journal(*f->dev, f->sb, true, &f->rr).is_ok();
    EXPECT_TRUE(ok) << err;
    return ok ? std::move(f) : nullptr;
  }
};

struct Rig {
  std::string log;  // first: destroyed last, after the filesystem's unmount has logged
  std::unique_ptr<TestDevices> devices;
  cache::test::Stack* stack = nullptr;   // the (first member's) controller stack
  blockdev::BlockDevice* dev = nullptr;  // what the filesystem is on (a RAID set's device)
  std::unique_ptr<CutDevice> cut;
  std::unique_ptr<Filesystem> fs;

  // `io_timeout_ns`: the engine's watchdog (tests of hung commands shorten it).
  // `cfg`, `cache_mb`: the emulated controller (a latency model, say) and a software cache of
  // that size over it (0: none), until a power cycle (which powers on defaults).
  static std::unique_ptr<Rig> make(uint64_t mib = 64, MkfsOptions mo = {},
                                   uint64_t io_timeout_ns = nvme::EngineOptions{}.io_timeout_ns,
                                   nvme::EmulatedConfig cfg = {}, uint64_t cache_mb = 0) {
    auto r = std::make_unique<Rig>();
    r->io_timeout_ns = io_timeout_ns;
    std::string err;
    r->devices = TestDevices::make(mib << 20, &err, cfg, cache_mb, io_timeout_ns);
    EXPECT_TRUE(r->devices) << err;
    if (!r->devices) return nullptr;
    r->stack = r->devices->stacks[0].get();
    r->dev = &r->devices->device();
    Geometry g;
    if (!mo.seed) mo.seed = 7;
    EXPECT_TRUE(plan_geometry(r->dev->block_count(), mo, &g, &err)) << err;
    EXPECT_TRUE(format(*r->dev, mo, g, nullptr).is_ok());
    if (!r->mount()) return nullptr;
    return r;
  }

  uint64_t io_timeout_ns = nvme::EngineOptions{}.io_timeout_ns;
  uint32_t meta_cache_mb = MountOptions{}.meta_cache_mb;  // for the next mount()
  // Tests commit explicitly (fsync, unmount); 0: the superblock's default, for the next mount().
  uint32_t commit_interval_ms = 60000;

  bool mount(bool read_only = false) {
    cut = devices->make_cut();
    MountOptions o;
    o.read_only = read_only;
    o.meta_cache_mb = meta_cache_mb;
    o.commit_interval_ms = commit_interval_ms;
    o.log = [this](const std::string& s) { log += s + "\n"; };
    std::string err;
    fs = Filesystem::mount(*cut, o, &err);
    EXPECT_TRUE(fs) << err << "\n" << log;
    return fs != nullptr;
  }
  bool remount() {
    EXPECT_EQ(fs->unmount(), 0) << log;
    fs.reset();
    return mount();
  }
  // The machine dies: nothing more reaches the device, and the device loses what its
  // volatile write cache held (a random part of it persisted, torn at 4 KiB).
  bool crash_and_remount(double persist = 0.5) { return power_cycle(persist) && mount(); }
  // The same without the mount: the device is back, nothing mounted (fsck may look first).
  bool power_cycle(double persist = 0.5) {
    cut->cut();
    devices->power_cut(persist);
    fs.reset();  // its unmount fails against the cut-off device
    cut.reset();
    devices->power_off();
    stack = nullptr, dev = nullptr;
    // Power back on: a new controller over the same media.
    std::string err;
    const bool ok = devices->power_on({}, 0, io_timeout_ns, &err);
    EXPECT_TRUE(ok) << err;
    if (!ok) return false;
    stack = devices->stacks[0].get();
    dev = &devices->device();
    log.clear();
    cut = devices->make_cut();
    return true;
  }
  // The superblock stored at `block` (0: the primary; the backup is the filesystem's last).
  Superblock superblock_at(uint64_t block) {
    Superblock sb{};
    EXPECT_TRUE(dev->read(block, 1, &sb).is_ok()) << block;
    return sb;
  }
  // Unmounts, rewrites both superblocks with `features` (an image of older code: without
  // kFeatureXattrChain) and mounts again.
  bool set_features(uint32_t features) {
    EXPECT_EQ(fs->unmount(), 0) << log;
    fs.reset();
    Superblock sb = superblock_at(0);
    sb.features = features;
    sb.checksum = superblock_checksum(sb);
    const bool ok = dev->write(0, 1, &sb).is_ok() &&
                    dev->write(sb.block_count - 1, 1, &sb).is_ok() && dev->flush().is_ok();
    EXPECT_TRUE(ok);
    return ok && mount();
  }
  // fsck of the unmounted filesystem: "" when clean, else its report.
  std::string fsck_unmounted() {
    FsckOptions o;
    std::string out;
    FsckResult r = warpfs::fs::fsck(*dev, o, [&](const std::string& s) { out += s + "\n"; });
    if (r.exit_code != kFsckClean)
      return "exit " + std::to_string(r.exit_code) + ":\n" + out + r.error;
    return "";
  }
  std::string check_and_remount() {
    EXPECT_EQ(fs->unmount(), 0) << log;
    fs.reset();
    std::string r = fsck_unmounted();
    mount();
    return r;
  }

  // Helpers returning errno values.
  Ino create(Ino parent, const std::string& name, uint32_t mode = 0644) {
    Attr a;
    const int rc = fs->mknod(parent, name, S_IFREG | mode, 0, Caller{}, &a);
    EXPECT_EQ(rc, 0) << name << "\n" << log;
    return rc ? 0 : a.ino;
  }
  Ino mkdir(Ino parent, const std::string& name) {
    Attr a;
    const int rc = fs->mkdir(parent, name, 0755, Caller{}, &a);
    EXPECT_EQ(rc, 0) << name << "\n" << log;
    return rc ? 0 : a.ino;
  }
  int lookup(Ino parent, const std::string& name, Ino* ino = nullptr) {
    Attr a;
    const int rc = fs->lookup(parent, name, &a);
    if (rc == 0 && ino) *ino = a.ino;
    if (rc == 0) fs->forget(a.ino, 1);
    return rc;
  }
  int write(Ino ino, uint64_t off, const std::string& data) {
    size_t w;
    const int rc = fs->write(ino, off, data.size(), data.data(), &w);
    if (rc == 0 && w != data.size()) return ENOSPC;
    return rc;
  }
  std::string read(Ino ino, uint64_t off, size_t len) {
    std::string buf(len, '\0');
    size_t got = 0;
    EXPECT_EQ(fs->read(ino, off, len, buf.data(), &got), 0);
    buf.resize(got);
    return buf;
  }
  uint64_t size(Ino ino) {
    Attr a;
    EXPECT_EQ(fs->getattr(ino, &a), 0);
    return a.size;
  }
};

// Deterministic content: byte i of "file" seed s.
inline std::string pattern(uint64_t seed, uint64_t off, size_t len) {
  std::string s(len, '\0');
  for (size_t i = 0; i < len; ++i) {
    const uint64_t x = (off + i) * 0x9e3779b97f4a7c15ull ^ seed * 0xbf58476d1ce4e5b9ull;
    s[i] = static_cast<char>(x >> 56);
  }
  return s;
}

}  // namespace warpfs::fs::test
