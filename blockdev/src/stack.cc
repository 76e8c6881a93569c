#include "warpfs/blockdev/stack.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "warpfs/nvme/emulated.h"
#include "warpfs/nvme/spec.h"
#include "warpfs/nvme/vfio.h"

namespace warpfs::blockdev {

namespace {

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// Waits (bounded) until nobody holds the image's lock. Returns at once when the image is
// missing or cannot be opened: open_file then says why.
void wait_for_release(const std::string& path, unsigned seconds, bool read_only,
                      const std::function<void(const std::string&)>& log) {
  const int fd = ::open(path.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fd < 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  bool said = false;
  while (!nvme::BackingStore::lock_image(fd, !read_only) &&
         std::chrono::steady_clock::now() < until) {
    if (!said && log) {
      log(path +
          " is held by a process that has no mount of it (a warpfs daemon finishing "
          "its unmount?): waiting up to " +
          std::to_string(seconds) + " s");
    }
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::close(fd);  // the probe's lock (if it got it) goes with it
}

}  // namespace

// mountinfo's escapes (\040 for a space, \134 for a backslash, ...) undone.
std::string unescape_mountinfo(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string warpfs_mount_of_image(const std::string& path) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
    std::string id, parent, dev, root, mountpoint, fstype, source;
    head >> id >> parent >> dev >> root >> mountpoint;
    tail >> fstype >> source;
    if (fstype != "fuse.warpfs") continue;
    source = unescape_mountinfo(source);
    for (std::string member : split_device_list(source)) {  // each member of a set
      if (member.rfind("vfio:", 0) == 0) continue;
      if (member.rfind("emu:", 0) == 0) member = member.substr(4);
      if (const size_t c = member.rfind(",ns="); c != std::string::npos) member.resize(c);
      if (same_file(member, path)) return unescape_mountinfo(mountpoint);
    }
  }
  return "";
}

// A piece such as "ns=2": lower-case letters (or _) and '='.
static bool is_option_piece(const std::string& p) {
  const size_t eq = p.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  for (size_t i = 0; i < eq; ++i)
    if (!((p[i] >= 'a' && p[i] <= 'z') || p[i] == '_')) return false;
  return true;
}

std::vector<std::string> split_device_list(const std::string& list) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t comma = list.find(',', at);
    const std::string piece = list.substr(at, comma == std::string::npos ? comma : comma - at);
    if (!out.empty() && is_option_piece(piece)) {
      out.back() += "," + piece;
    } else {
      out.push_back(piece);
    }
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

std::string absolute_device_name(const std::string& list) {
  std::string out;
  for (const std::string& named : split_device_list(list)) {
    std::string one = named;
    if (named.rfind("vfio:", 0) != 0) {
      std::string path = named.rfind("emu:", 0) == 0 ? named.substr(4) : named;
      std::string ns;
      if (const size_t c = path.rfind(",ns="); c != std::string::npos)
        ns = path.substr(c), path.resize(c);
      if (char* abs = realpath(path.c_str(), nullptr)) {
        one = "emu:" + std::string(abs) + ns;
        std::free(abs);
      }
    }
    out += (out.empty() ? "" : ",") + one;
  }
  return out;
}

namespace {

// Says (through `log`) when an image file gives every user its files' data.
void warn_if_shared(const std::string& path, const std::function<void(const std::string&)>& log) {
  // The image holds every file's data whatever the files' own modes: one that others may
  // read or write gives them all of it (a block device is 0660 root:disk for this reason).
  struct stat st {};
  if (!log || ::stat(path.c_str(), &st) != 0 || (st.st_mode & 077) == 0) return;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  log("warning: " + path + " has mode " + mode + ": users other than its owner can " +
      ((st.st_mode & 044) ? ((st.st_mode & 022) ? "read and change" : "read") : "change") +
      " every file's data in it; chmod 600 " + path);
}

// The namespace DEVICE names (",ns=N"), or the controller's first; 0 and a message if none.
uint32_t pick_namespace(const nvme::Controller& c, uint32_t asked, std::string* error) {
  if (c.namespaces().empty()) {
    *error = "the controller has no usable namespace";
    return 0;
  }
  if (asked == 0) return c.namespaces()[0].nsid;
  if (c.find_namespace(asked) != nullptr) return asked;
  std::string have;
  for (const nvme::NamespaceInfo& n : c.namespaces())
    have += (have.empty() ? "" : ", ") + std::to_string(n.nsid);
  *error = "no usable namespace " + std::to_string(asked) + " (active namespaces: " + have + ")";
  return 0;
}

}  // namespace

// The namespace's NGUID (Identify Namespace bytes 119:104), else its EUI64 (127:120), NVMe
// Base 2.0 §5.17.2.1; kind kNone when it reports neither (all zero) or Identify fails.
static RaidIdentity identity_of(nvme::Controller& c, uint32_t nsid) {
  RaidIdentity id;
  nvme::IdentifyNamespace ns{};
  nvme::SubmissionEntry cmd{};
  cmd.opcode = nvme::admin::kIdentify;
  cmd.nsid = nsid;
  cmd.cdw10 = nvme::cns::kNamespace;
  if (!c.admin(cmd, &ns, sizeof ns, false, nullptr).is_ok()) return id;
  const auto* b = reinterpret_cast<const uint8_t*>(&ns);
  auto zero = [](const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i)
      if (p[i]) return false;
    return true;
  };
  if (!zero(b + 104, 16)) {
    id.kind = RaidIdentity::kNguid;
    std::memcpy(id.id, b + 104, 16);
  } else if (!zero(b + 120, 8)) {
    id.kind = RaidIdentity::kEui64;
    std::memcpy(id.id, b + 120, 8);
  }
  return id;
}

// A cache of `mb` MiB: 8 ways, the largest power-of-two number of sets that fits, and the
// background write-back.
cache::CacheOptions cache_of_size(uint64_t mb, uint32_t block_bytes) {
  cache::CacheOptions co;
  co.ways = 8;
  const uint64_t lines = (mb << 20) / block_bytes;
  uint32_t sets = 1;
  while (uint64_t{sets} * 2 * co.ways <= lines) sets *= 2;
  co.sets = sets;
  // Dirty lines go back in the background past a fifth of the cache, so a miss finds a
  // clean victim instead of waiting for a write-back (random overwrites of a file larger
  // than the cache: every miss did).
  co.writeback_percent = 20;
  return co;
}

std::unique_ptr<DeviceStack> DeviceStack::open(const std::string& device, const StackOptions& o,
                                               std::string* error) {
  std::unique_ptr<DeviceStack> s(new DeviceStack());
  s->name_ = device;
  if (const std::vector<std::string> names = split_device_list(device); names.size() > 1)
    return open_set(names, o, error);
  nvme::DeviceSpec spec;
  if (!nvme::parse_device(device, &spec, error)) return nullptr;
  if (spec.kind == nvme::DeviceSpec::Kind::kEmulated) {
    if (std::string where = warpfs_mount_of_image(spec.path); !where.empty()) {
      *error = spec.path + ": mounted on " + where + " (unmount it first)";
      return nullptr;
    }
    if (o.wait_for_release_s > 0)
      wait_for_release(spec.path, o.wait_for_release_s, o.emulated.read_only, o.log);
  }
  nvme::VfioOptions vfio = o.vfio;
  vfio.max_vectors = static_cast<uint16_t>(o.io_queues + 1);  // admin + one per I/O queue
  s->transport_ = nvme::open_transport(spec, o.emulated, vfio, o.create_bytes, error);
  if (!s->transport_) return nullptr;  // its message names the device already
  s->vfio_ = spec.kind == nvme::DeviceSpec::Kind::kVfio;
  if (!s->vfio_) warn_if_shared(spec.path, o.log);
  if (!s->build(spec.nsid, o, error)) {
    *error = device + ": " + *error;
    return nullptr;
  }
  return s;
}

std::unique_ptr<DeviceStack> DeviceStack::open_store(const std::string& name,
                                                     std::shared_ptr<nvme::BackingStore> store,
                                                     const StackOptions& o, std::string* error) {
  std::unique_ptr<DeviceStack> s(new DeviceStack());
  s->name_ = name;
  s->transport_ = nvme::EmulatedTransport::create(o.emulated, std::move(store), error);
  if (!s->transport_ || !s->build(0, o, error)) {
    *error = name + ": " + *error;
    return nullptr;
  }
  return s;
}

// Everything above the transport.
bool DeviceStack::build(uint32_t nsid_asked, const StackOptions& o, std::string* error) {
  nvme::ControllerOptions co;
  co.io_queues = o.io_queues;
  if (!(ctrl_ = nvme::Controller::open(*transport_, co, error))) return false;
  nvme::EngineOptions eo;
  eo.io_timeout_ns = o.io_timeout_ns;
  eo.log = o.log;
  if (!(engine_ = nvme::IoEngine::create(*ctrl_, eo, error))) return false;
  const uint32_t nsid = pick_namespace(*ctrl_, nsid_asked, error);
  if (nsid == 0) return false;
  identity_ = identity_of(*ctrl_, nsid);
  nvme::NamespaceIo::Options no;
  no.priorities = o.priorities;
  if (!(ns_ = nvme::NamespaceIo::create(*engine_, nsid, o.block_bytes, no, error))) return false;
  raw_ = std::make_unique<NvmeBlockDevice>(*ns_);
  if (o.cache_mb == 0) return true;
  backend_ = std::make_unique<cache::NamespaceBackend>(*ns_);
  cache::CacheOptions cache_options = cache_of_size(o.cache_mb, o.block_bytes);
  cache_options.evict_with_set = !engine_->prompt();  // see CacheOptions::evict_with_set
  cached_ = CachedBlockDevice::create(*backend_, cache_options, error);
  if (!cached_) *error = "cache: " + *error;
  return cached_ != nullptr;
}

namespace {

// A device named twice in a list (the same image by two paths, or the same controller and
// namespace): a message naming both, else "".
std::string named_twice(const std::vector<std::string>& names) {
  std::vector<nvme::DeviceSpec> specs(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    std::string ignored;
    if (!nvme::parse_device(names[i], &specs[i], &ignored)) return "";  // open says why
    for (size_t j = 0; j < i; ++j) {
      const nvme::DeviceSpec &a = specs[j], &b = specs[i];
      const bool same =
          a.kind == b.kind && a.nsid == b.nsid &&
          (a.kind == nvme::DeviceSpec::Kind::kVfio ? a.bdf == b.bdf
                                                   : a.path == b.path || same_file(a.path, b.path));
      if (same) return names[j] + " and " + names[i] + " are the same device";
    }
  }
  return "";
}

}  // namespace

std::unique_ptr<DeviceStack> DeviceStack::open_set(const std::vector<std::string>& names,
                                                   const StackOptions& o, std::string* error) {
  if (std::string twice = named_twice(names); !twice.empty()) {
    *error = twice;
    return nullptr;
  }
  std::unique_ptr<DeviceStack> s(new DeviceStack());
  for (const std::string& n : names) s->name_ += (s->name_.empty() ? "" : ",") + n;
  StackOptions mo = o;  // each member a shard of the cache
  if (o.cache_mb > 0) mo.cache_mb = std::max<uint64_t>(1, o.cache_mb / names.size());
  std::vector<RaidMemberSeen> seen(names.size());
  std::vector<BlockDevice*> devs;
  for (size_t i = 0; i < names.size(); ++i) {
    std::unique_ptr<DeviceStack> m = DeviceStack::open(names[i], mo, error);
    if (!m) return nullptr;  // the message names the member
    seen[i].name = names[i];
    seen[i].identity = m->identity();
    devs.push_back(&m->device());
    s->members_.push_back(std::move(m));
  }
  s->raid_ = RaidBlockDevice::assemble(devs, std::move(seen), o.log, error);
  return s->raid_ ? std::move(s) : nullptr;
}

bool create_raid_set(const std::vector<std::string>& devices, const RaidCreate& rc,
                     const StackOptions& o, bool force, std::string* error) {
  const uint32_t n = static_cast<uint32_t>(devices.size());
  if (std::string p = raid_level_problem(rc.level, n); !p.empty()) {
    *error = p;
    return false;
  }
  if (std::string twice = named_twice(devices); !twice.empty()) {
    *error = twice;
    return false;
  }
  StackOptions mo = o;
  mo.cache_mb = 0;
  std::vector<std::unique_ptr<DeviceStack>> m;
  RaidLabel l;
  l.level = rc.level;
  l.member_count = n;
  uint32_t max_stripe = UINT32_MAX;
  uint64_t smallest = UINT64_MAX;
  std::random_device rd;
  for (uint32_t k = 0; k < n; ++k) {
    m.push_back(DeviceStack::open(devices[k], mo, error));
    if (!m.back()) return false;
    BlockDevice& d = m.back()->device();
    if (d.block_bytes() != l.block_size) {
      *error = devices[k] + ": blocks of " + std::to_string(d.block_bytes()) + " bytes";
      return false;
    }
    std::vector<uint8_t> b(d.block_bytes());
    RaidLabel old;
    std::string why;
    if (!force && d.read(0, 1, b.data()).is_ok() && RaidLabel::decode(b.data(), &old, &why)) {
      *error = devices[k] + " is member " + std::to_string(old.position) + " of RAID set " +
               old.uuid_text() + "; use --force to make a new set of it";
      return false;
    }
    max_stripe = std::min(max_stripe, m.back()->max_transfer_bytes() / d.block_bytes());
    smallest = std::min(smallest, d.block_count());
    RaidIdentity& id = l.members[k];
    id = m.back()->identity();
    if (id.kind == RaidIdentity::kNone) {
      id.kind = RaidIdentity::kGenerated;
      for (uint8_t& x : id.id) x = static_cast<uint8_t>(rd());
    }
    id.blocks = d.block_count();
    id.name = devices[k];
  }
  l.stripe_blocks = rc.stripe_blocks;
  if (l.stripe_blocks == 0) {  // the default, lowered to a power of two within every MDTS
    l.stripe_blocks = RaidLabel::kDefaultStripeBlocks;
    while (l.stripe_blocks > 1 && l.stripe_blocks > max_stripe) l.stripe_blocks /= 2;
  }
  if (smallest < l.data_offset + l.stripe_blocks) {
    *error = "a member is smaller than its label area and one stripe (" +
             std::to_string((l.data_offset + l.stripe_blocks) * l.block_size) + " bytes)";
    return false;
  }
  l.member_blocks = (smallest - l.data_offset) / l.stripe_blocks * l.stripe_blocks;
  for (uint8_t& x : l.set_uuid) x = static_cast<uint8_t>(rd());
  if (std::string bad = l.invalid(); !bad.empty()) {
    *error = bad;
    return false;
  }
  std::vector<BlockDevice*> devs;
  for (const auto& st : m) devs.push_back(&st->device());
  return write_member_labels(devs, l, error).is_ok();
}

bool resync_raid_devices(const std::string& list, const StackOptions& o,
                         const std::function<void(uint64_t, uint64_t)>& progress,
                         RaidResyncReport* report, std::string* error, bool replace) {
  const std::vector<std::string> names = split_device_list(list);
  if (names.size() < 2) {
    *error = list + ": one device; a resync takes a RAID set's devices, DEV,DEV,... in order";
    return false;
  }
  if (std::string twice = named_twice(names); !twice.empty()) {
    *error = twice;
    return false;
  }
  StackOptions mo = o;
  mo.cache_mb = 0;
  std::vector<std::unique_ptr<DeviceStack>> m;
  std::vector<BlockDevice*> devs;
  std::vector<RaidMemberSeen> seen(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    m.push_back(DeviceStack::open(names[i], mo, error));
    if (!m.back()) return false;  // the message names the member
    seen[i].name = names[i];
    seen[i].identity = m.back()->identity();
    devs.push_back(&m.back()->device());
  }
  return resync_raid_set(devs, std::move(seen), progress, report, error, replace).is_ok();
}

uint32_t DeviceStack::max_transfer_bytes() const {
  if (members_.empty()) return ctrl_->max_transfer_bytes();
  uint32_t v = UINT32_MAX;
  for (const auto& m : members_) v = std::min(v, m->max_transfer_bytes());
  return v;
}

bool DeviceStack::prompt() const {
  if (members_.empty()) return engine_->prompt();
  for (const auto& m : members_) {
    if (!m->prompt()) return false;
  }
  return true;
}

StackStats DeviceStack::stats() const {
  if (!members_.empty()) {
    StackStats st = members_[0]->stats();
    st.is_raid = true;
    st.raid = raid_->stats();
    return st;
  }
  StackStats st;
  st.transport = transport_->name();
  st.nsid = ns_->nsid();
  const nvme::NamespaceInfo* ns = ctrl_->find_namespace(st.nsid);
  st.lba_bytes = ns ? ns->lba_bytes : 0;
  st.io_queues = ctrl_->io_queues_granted();
  st.max_transfer = ctrl_->max_transfer_bytes();
  st.engine = engine_->counters();
  if (vfio_) {  // open() made this transport from a vfio: DEVICE
    const auto& v = static_cast<const nvme::VfioTransport&>(*transport_);
    st.vfio = true;
    st.iommu_group = v.iommu_group();
    st.vfio_counters = v.counters();
  }
  nvme::QueueMapper& m = engine_->mapper();
  st.metadata_queues = m.queues(nvme::Priority::kMetadata);
  st.bulk_queues = m.queues(nvme::Priority::kBulk);
  st.remaps = m.remaps();
  st.pairs = engine_->queue_loads();
  for (unsigned k = 0; k < nvme::NamespaceIo::kClasses; ++k)
    st.commands[k] = ns_->stats(static_cast<nvme::NamespaceIo::Class>(k));
  if (cached_) {
    st.cached = true;
    st.cache = cached_->cache().stats();
  }
  return st;
}

DeviceStack::~DeviceStack() {
  raid_.reset();
  members_.clear();
  cached_.reset();
  backend_.reset();
  raw_.reset();
  ns_.reset();
  engine_.reset();
  ctrl_.reset();  // normal shutdown: the device's volatile write cache reaches the media
  transport_.reset();
}

}  // namespace warpfs::blockdev
