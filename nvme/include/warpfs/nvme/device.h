// Opening a DEVICE as users name it (DESIGN.md "Names users see"): `emu:PATH` or a bare PATH
// is the emulated controller over the image file PATH; `vfio:DDDD:BB:DD.F` is a PCI NVMe
// controller bound to vfio-pci; `tcp:HOST:PORT/SUBNQN` is subsystem SUBNQN of an NVMe/TCP
// target (HOST a name, an IPv4 address or a bracketed IPv6 one), optionally followed by
// `,hostnqn=NQN` and `,digest=header|data|both` (CRC32C digests asked for in ICReq). Any may
// end in `,ns=N` to pick namespace N instead of the controller's first active namespace.
#pragma once

#include <memory>
#include <string>

#include "warpfs/nvme/emulated.h"
#include "warpfs/nvme/tcp.h"
#include "warpfs/nvme/transport.h"
#include "warpfs/nvme/vfio.h"

namespace warpfs::nvme {

struct DeviceSpec {
  enum class Kind { kEmulated, kVfio, kTcp };
  Kind kind = Kind::kEmulated;
  std::string path;   // image file (emulated)
  std::string bdf;    // PCI address (vfio)
  TcpOptions tcp;     // host, port, subnqn, hostnqn, digests (tcp); the rest as defaults
  uint32_t nsid = 0;  // 0: the first active namespace
};

// Parses a DEVICE argument; false with a message naming the problem.
bool parse_device(const std::string& arg, DeviceSpec* out, std::string* error);

// `tcp:HOST[:PORT][,hostnqn=NQN]`, a discovery service to ask (`--list-devices`): HOST a
// name, an IPv4 address or a bracketed IPv6 one; PORT 8009 when left out (IANA's port for
// NVMe/TCP discovery; 4420 is the I/O one). False with a message naming the expected form.
bool parse_discovery_target(const std::string& arg, TcpOptions* out, std::string* error);

// The DEVICE name (`tcp:HOST:PORT/SUBNQN`) of a Discovery Log Page entry for an NVM subsystem
// over TCP; "" for any other entry (another transport, a referral, the discovery subsystem
// itself) or one whose fields cannot form a name (a comma, a slash in the address, ...).
std::string discovery_device_name(const DiscoveryEntry& e);

// Opens the transport. For an emulated device, `create_bytes` > 0 creates a missing image of
// that size; `config` shapes the emulated controller (its namespaces cover the image).
// `vfio` shapes the VFIO transport.
std::unique_ptr<Transport> open_transport(const DeviceSpec& spec, const EmulatedConfig& config,
                                          const VfioOptions& vfio, uint64_t create_bytes,
                                          std::string* error);

}  // namespace warpfs::nvme
