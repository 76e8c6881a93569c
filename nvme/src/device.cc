#include "warpfs/nvme/device.h"

#include <cctype>

namespace warpfs::nvme {

static bool valid_bdf(const std::string& s) {
  // DDDD:BB:DD.F, hexadecimal.
  if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == 4 || i == 7 || i == 10) continue;
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

bool parse_device(const std::string& arg, DeviceSpec* out, std::string* error) {
  if (arg.empty()) {
    *error = "no device given";
    return false;
  }
  if (arg.rfind("vfio:", 0) == 0) {
    out->kind = DeviceSpec::Kind::kVfio;
    out->bdf = arg.substr(5);
    if (!valid_bdf(out->bdf)) {
      *error = "'" + arg + "': expected vfio:DDDD:BB:DD.F (for example vfio:0000:01:00.0)";
      return false;
    }
    return true;
  }
  out->kind = DeviceSpec::Kind::kEmulated;
  out->path = arg.rfind("emu:", 0) == 0 ? arg.substr(4) : arg;
  if (out->path.empty()) {
    *error = "'" + arg + "': expected emu:PATH";
    return false;
  }
  return true;
}

std::unique_ptr<Transport> open_transport(const DeviceSpec& spec, const EmulatedConfig& config,
                                          uint64_t create_bytes, std::string* error) {
  if (spec.kind == DeviceSpec::Kind::kVfio) {
    *error = "vfio:" + spec.bdf + ": the VFIO transport is not built into this version of warpfs";
    return nullptr;
  }
  auto store = BackingStore::open_file(spec.path, create_bytes, error);
  if (store == nullptr) return nullptr;
  return EmulatedTransport::create(config, store, error);
}

}  // namespace warpfs::nvme
