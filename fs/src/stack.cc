#include "warpfs/fs/stack.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "warpfs/fs/format.h"
#include "warpfs/nvme/emulated.h"

namespace warpfs::fs {

namespace {

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

std::unique_ptr<DeviceStack> DeviceStack::open(const std::string& device, const StackOptions& o,
                                               std::string* error) {
  auto s = std::unique_ptr<DeviceStack>(new DeviceStack());
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
  if (!s->transport_) return nullptr;
  if (spec.kind == nvme::DeviceSpec::Kind::kEmulated && o.log) {
    // The image holds every file's data whatever the files' own modes: one that others may
    // read or write gives them all of it (a block device is 0660 root:disk for this reason).
    struct stat st {};
    if (::stat(spec.path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      o.log("warning: " + spec.path + " has mode " + mode + ": users other than its owner can " +
            ((st.st_mode & 044) ? ((st.st_mode & 022) ? "read and change" : "read") : "change") +
            " every file's data in it; chmod 600 " + spec.path);
    }
  }
  nvme::ControllerOptions co;
  co.io_queues = o.io_queues;
  s->ctrl_ = nvme::Controller::open(*s->transport_, co, error);
  if (!s->ctrl_) {
    *error = device + ": " + *error;
    return nullptr;
  }
  if (s->ctrl_->namespaces().empty()) {
    *error = device + ": the controller has no usable namespace";
    return nullptr;
  }
  nvme::EngineOptions eo;
  eo.io_timeout_ns = o.io_timeout_ns;
  eo.log = o.log;
  s->engine_ = nvme::IoEngine::create(*s->ctrl_, eo, error);
  if (!s->engine_) {
    *error = device + ": " + *error;
    return nullptr;
  }
  uint32_t nsid = s->ctrl_->namespaces()[0].nsid;
  if (spec.nsid != 0) {
    if (s->ctrl_->find_namespace(spec.nsid) == nullptr) {
      std::string have;
      for (const nvme::NamespaceInfo& n : s->ctrl_->namespaces())
        have += (have.empty() ? "" : ", ") + std::to_string(n.nsid);
      *error = device + ": no usable namespace " + std::to_string(spec.nsid) +
               " (active namespaces: " + have + ")";
      return nullptr;
    }
    nsid = spec.nsid;
  }
  s->nsid_ = nsid;
  s->dev_ = blockdev::NvmeBlockDevice::create(*s->engine_, nsid, kBlockSize, error);
  if (!s->dev_) {
    *error = device + ": " + *error;
    return nullptr;
  }
  return s;
}

DeviceStack::~DeviceStack() {
  dev_.reset();
  engine_.reset();
  ctrl_.reset();  // normal shutdown: the device's volatile write cache reaches the media
  transport_.reset();
}

}  // namespace warpfs::fs
