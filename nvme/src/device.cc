#include "warpfs/nvme/device.h"

#include <cctype>
#include <cstdlib>

#include "warpfs/nvme/vfio.h"

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
  std::string name = arg;
  out->nsid = 0;
  if (const size_t comma = name.rfind(",ns="); comma != std::string::npos) {
    const std::string n = name.substr(comma + 4);
    char* end = nullptr;
    const unsigned long v = std::strtoul(n.c_str(), &end, 10);
    if (n.empty() || *end != 0 || v == 0 || v > 0xfffffffeul) {
      *error = "'" + arg + "': ns= takes a namespace id from 1 to 4294967294";
      return false;
    }
    out->nsid = static_cast<uint32_t>(v);
    name.resize(comma);
  }
  if (name.rfind("vfio:", 0) == 0) {
    out->kind = DeviceSpec::Kind::kVfio;
    out->bdf = name.substr(5);
    if (!valid_bdf(out->bdf)) {
      *error = "'" + arg + "': expected vfio:DDDD:BB:DD.F (for example vfio:0000:01:00.0)";
      return false;
    }
    return true;
  }
  out->kind = DeviceSpec::Kind::kEmulated;
  out->path = name.rfind("emu:", 0) == 0 ? name.substr(4) : name;
  if (out->path.empty()) {
    *error = "'" + arg + "': expected emu:PATH";
    return false;
  }
  return true;
}

std::unique_ptr<Transport> open_transport(const DeviceSpec& spec, const EmulatedConfig& config,
                                          const VfioOptions& vfio, uint64_t create_bytes,
                                          std::string* error) {
  if (spec.kind == DeviceSpec::Kind::kVfio) {
    return VfioTransport::open(spec.bdf, vfio, error);
  }
  auto store = BackingStore::open_file(spec.path, create_bytes, error, config.read_only);
  if (store == nullptr) return nullptr;
  return EmulatedTransport::create(config, store, error);
}

}  // namespace warpfs::nvme
