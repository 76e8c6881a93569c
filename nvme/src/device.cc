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

// tcp:HOST:PORT/SUBNQN[,hostnqn=NQN][,digest=header|data|both] with any `,ns=N` already
// removed.
static bool parse_tcp(const std::string& arg, std::string name, TcpOptions* o, std::string* error) {
  const std::string usage = "'" + arg +
                            "': expected tcp:HOST:PORT/SUBNQN[,ns=N][,hostnqn=NQN]"
                            "[,digest=header|data|both]";
  if (const size_t d = name.find(",digest="); d != std::string::npos) {
    const size_t next = name.find(',', d + 1);
    const std::string kind =
        name.substr(d + 8, next == std::string::npos ? std::string::npos : next - d - 8);
    name.erase(d, next == std::string::npos ? std::string::npos : next - d);
    o->header_digest = kind == "header" || kind == "both";
    o->data_digest = kind == "data" || kind == "both";
    if (!o->header_digest && !o->data_digest) {
      *error = usage;
      return false;
    }
  }
  if (const size_t h = name.find(",hostnqn="); h != std::string::npos) {
    o->hostnqn = name.substr(h + 9);
    name.resize(h);
    if (o->hostnqn.empty() || o->hostnqn.find(',') != std::string::npos) {
      *error = usage;
      return false;
    }
  }
  name = name.substr(4);
  const size_t slash = name.find('/');
  if (slash == std::string::npos) {
    *error = usage;
    return false;
  }
  o->subnqn = name.substr(slash + 1);
  const std::string hostport = name.substr(0, slash);
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos || o->subnqn.empty() || o->subnqn.find(',') != std::string::npos) {
    *error = usage;
    return false;
  }
  o->host = hostport.substr(0, colon);
  o->port = hostport.substr(colon + 1);
  if (o->host.size() > 2 && o->host.front() == '[' && o->host.back() == ']')
    o->host = o->host.substr(1, o->host.size() - 2);
  char* end = nullptr;
  const unsigned long port = std::strtoul(o->port.c_str(), &end, 10);
  if (o->host.empty() || o->host.find_first_of("[]") != std::string::npos || o->port.empty() ||
      *end != 0 || port == 0 || port > 65535) {
    *error = usage;
    return false;
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
  // `,hostnqn=` and `,digest=` may follow `,ns=N` in a tcp: name: set aside while ns= is read.
  std::string tail;
  if (name.rfind("tcp:", 0) == 0) {
    for (const char* key : {",hostnqn=", ",digest="}) {
      if (const size_t h = name.find(key); h != std::string::npos) {
        const size_t next = name.find(',', h + 1);
        const std::string part =
            name.substr(h, next == std::string::npos ? std::string::npos : next - h);
        name.erase(h, part.size());
        tail += part;
      }
    }
  }
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
  if (name.rfind("tcp:", 0) == 0) {
    out->kind = DeviceSpec::Kind::kTcp;
    return parse_tcp(arg, name + tail, &out->tcp, error);
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

bool parse_discovery_target(const std::string& arg, TcpOptions* o, std::string* error) {
  const std::string usage = "'" + arg + "': expected tcp:HOST[:PORT][,hostnqn=NQN]";
  if (arg.rfind("tcp:", 0) != 0) {
    *error = usage;
    return false;
  }
  std::string name = arg.substr(4);
  *o = TcpOptions{};
  o->port = "8009";
  if (const size_t h = name.find(",hostnqn="); h != std::string::npos) {
    o->hostnqn = name.substr(h + 9);
    name.resize(h);
    if (o->hostnqn.empty() || o->hostnqn.find(',') != std::string::npos) {
      *error = usage;
      return false;
    }
  }
  if (!name.empty() && name.front() == '[') {  // [IPv6][:PORT]
    const size_t close = name.find(']');
    if (close == std::string::npos) {
      *error = usage;
      return false;
    }
    o->host = name.substr(1, close - 1);
    const std::string rest = name.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') {
        *error = usage;
        return false;
      }
      o->port = rest.substr(1);
    }
  } else {
    const size_t colon = name.find(':');
    o->host = name.substr(0, colon);
    if (colon != std::string::npos) o->port = name.substr(colon + 1);
  }
  char* end = nullptr;
  const unsigned long port = std::strtoul(o->port.c_str(), &end, 10);
  if (o->host.empty() || o->host.find_first_of("[]/,") != std::string::npos || o->port.empty() ||
      *end != 0 || port == 0 || port > 65535) {
    *error = usage;
    return false;
  }
  o->subnqn = kDiscoveryNqn;
  return true;
}

std::string discovery_device_name(const DiscoveryEntry& e) {
  constexpr uint8_t kTrtypeTcp = 3, kAdrfamIpv4 = 1, kAdrfamIpv6 = 2, kSubtypeNvm = 2;
  if (e.trtype != kTrtypeTcp || e.subtype != kSubtypeNvm) return "";
  if (e.adrfam != kAdrfamIpv4 && e.adrfam != kAdrfamIpv6) return "";
  // Printable, no blank, and nothing the DEVICE syntax gives a meaning ('/' only in the NQN).
  auto plain = [](const std::string& s, bool slash_ok) {
    if (s.empty()) return false;
    for (const char c : s) {
      if (c <= ' ' || c > '~' || c == ',' || c == '[' || c == ']') return false;
      if (c == '/' && !slash_ok) return false;
    }
    return true;
  };
  if (!plain(e.traddr, false) || !plain(e.trsvcid, false) || !plain(e.subnqn, true)) return "";
  const std::string host = e.adrfam == kAdrfamIpv6 ? "[" + e.traddr + "]" : e.traddr;
  std::string name = "tcp:" + host + ":" + e.trsvcid + "/" + e.subnqn;
  DeviceSpec check;
  std::string err;
  return parse_device(name, &check, &err) ? name : "";
}

std::unique_ptr<Transport> open_transport(const DeviceSpec& spec, const EmulatedConfig& config,
                                          const VfioOptions& vfio, uint64_t create_bytes,
                                          std::string* error) {
  if (spec.kind == DeviceSpec::Kind::kTcp) return TcpTransport::open(spec.tcp, error);
  if (spec.kind == DeviceSpec::Kind::kVfio) {
    return VfioTransport::open(spec.bdf, vfio, error);
  }
  auto store = BackingStore::open_file(spec.path, create_bytes, error, config.read_only);
  if (store == nullptr) return nullptr;
  return EmulatedTransport::create(config, store, error);
}

}  // namespace warpfs::nvme
