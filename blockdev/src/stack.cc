#include "warpfs/blockdev/stack.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "warpfs/nvme/emulated.h"
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
    if (source.rfind("vfio:", 0) == 0) continue;
    if (source.rfind("emu:", 0) == 0) source = source.substr(4);
    if (const size_t c = source.rfind(",ns="); c != std::string::npos) source.resize(c);
    if (same_file(source, path)) return unescape_mountinfo(mountpoint);
  }
  return "";
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

// A cache of `mb` MiB: 8 ways, the largest power-of-two number of sets that fits.
cache::CacheOptions cache_of_size(uint64_t mb, uint32_t block_bytes) {
  cache::CacheOptions co;
  co.ways = 8;
  const uint64_t lines = (mb << 20) / block_bytes;
  uint32_t sets = 1;
  while (uint64_t{sets} * 2 * co.ways <= lines) sets *= 2;
  co.sets = sets;
  return co;
}

std::unique_ptr<DeviceStack> DeviceStack::open(const std::string& device, const StackOptions& o,
                                               std::string* error) {
  std::unique_ptr<DeviceStack> s(new DeviceStack());
  s->name_ = device;
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
  nvme::NamespaceIo::Options no;
  no.priorities = o.priorities;
  if (!(ns_ = nvme::NamespaceIo::create(*engine_, nsid, o.block_bytes, no, error))) return false;
  raw_ = std::make_unique<NvmeBlockDevice>(*ns_);
  if (o.cache_mb == 0) return true;
  backend_ = std::make_unique<cache::NamespaceBackend>(*ns_);
  cached_ = CachedBlockDevice::create(*backend_, cache_of_size(o.cache_mb, o.block_bytes), error);
  if (!cached_) *error = "cache: " + *error;
  return cached_ != nullptr;
}

StackStats DeviceStack::stats() const {
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
  cached_.reset();
  backend_.reset();
  raw_.reset();
  ns_.reset();
  engine_.reset();
  ctrl_.reset();  // normal shutdown: the device's volatile write cache reaches the media
  transport_.reset();
}

}  // namespace warpfs::blockdev
