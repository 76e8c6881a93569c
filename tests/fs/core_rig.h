// Test rig for the filesystem core: a RAM-backed emulated NVMe device, formatted, with the
// filesystem mounted on it through a device wrapper that can be cut off to simulate a crash.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>

#include "cache/cache_rig.h"
#include "warpfs/blockdev/devices.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/fs/fsck.h"
#include "warpfs/fs/mkfs.h"
#include "warpfs/fs/replay.h"

namespace warpfs::fs::test {

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
  blockdev::Status write(uint64_t b, uint32_t n, const void* buf) override {
    if (cut_) return dead();
    if (arrive()) {
      if (tear_.load(std::memory_order_relaxed)) tear(b, n, buf);
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
  std::unique_ptr<cache::test::Stack> stack;
  std::unique_ptr<blockdev::NvmeBlockDevice> dev;
  std::unique_ptr<CutDevice> cut;
  std::unique_ptr<Filesystem> fs;

  // `io_timeout_ns`: the engine's watchdog (tests of hung commands shorten it).
  static std::unique_ptr<Rig> make(uint64_t mib = 64, MkfsOptions mo = {},
                                   uint64_t io_timeout_ns = nvme::EngineOptions{}.io_timeout_ns) {
    auto r = std::make_unique<Rig>();
    r->stack = cache::test::Stack::make(mib << 20, nullptr, {}, io_timeout_ns);
    if (!r->stack) return nullptr;
    std::string err;
    r->dev = blockdev::NvmeBlockDevice::create(*r->stack->engine, 1, kBlockSize, &err);
    EXPECT_TRUE(r->dev) << err;
    Geometry g;
    if (!mo.seed) mo.seed = 7;
    EXPECT_TRUE(plan_geometry(r->dev->block_count(), mo, &g, &err)) << err;
    EXPECT_TRUE(format(*r->dev, mo, g, nullptr).is_ok());
    if (!r->mount()) return nullptr;
    return r;
  }

  uint32_t meta_cache_mb = MountOptions{}.meta_cache_mb;  // for the next mount()
  // Tests commit explicitly (fsync, unmount); 0: the superblock's default, for the next mount().
  uint32_t commit_interval_ms = 60000;

  bool mount(bool read_only = false) {
    cut = std::make_unique<CutDevice>(*dev);
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
    stack->transport->power_cut(persist);
    fs.reset();  // its unmount fails against the cut-off device
    cut.reset();
    dev.reset();
    // Power back on: a new controller over the same media.
    auto store = stack->store;
    stack.reset();
    stack = cache::test::Stack::make(0, store);
    if (!stack) return false;
    std::string err;
    dev = blockdev::NvmeBlockDevice::create(*stack->engine, 1, kBlockSize, &err);
    EXPECT_TRUE(dev) << err;
    log.clear();
    cut = std::make_unique<CutDevice>(*dev);
    return dev != nullptr;
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
