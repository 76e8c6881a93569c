#include "warpfs/fs/stack.h"

#include "warpfs/fs/format.h"

namespace warpfs::fs {

std::unique_ptr<DeviceStack> DeviceStack::open(const std::string& device, const StackOptions& o,
                                               std::string* error) {
  auto s = std::unique_ptr<DeviceStack>(new DeviceStack());
  s->name_ = device;
  nvme::DeviceSpec spec;
  if (!nvme::parse_device(device, &spec, error)) return nullptr;
  nvme::VfioOptions vfio = o.vfio;
  vfio.max_vectors = static_cast<uint16_t>(o.io_queues + 1);  // admin + one per I/O queue
  s->transport_ = nvme::open_transport(spec, o.emulated, vfio, o.create_bytes, error);
  if (!s->transport_) return nullptr;
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
