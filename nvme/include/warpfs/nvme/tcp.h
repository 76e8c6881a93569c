// The NVMe/TCP transport: a controller on another host, reached over TCP (NVMe over Fabrics
// 1.1 "NVMe-oF" and the NVMe/TCP Transport Specification 1.0 "TCP"), behind the same
// Transport interface as the emulated and VFIO controllers, so the Controller, the virtual
// queues and the mapper above run unchanged.
//
// How the PCIe-shaped interface maps onto fabrics (the driver above does not know):
//   registers    CAP and VS are read once with Property Get; CC writes become Property Set
//                (NVMe-oF §3.5); CSTS reads become Property Get while connected. AQA/ASQ/ACQ
//                stay here: they name the host memory the admin queue lives in.
//   CC.EN 0→1    connects the admin queue (ICReq/ICResp, TCP §3.6.2.2-3; Fabrics Connect
//                with queue id 0, NVMe-oF §3.3) unless still connected, then Property Set.
//                A target that does not answer yet is retried while CSTS is polled, so a
//                target that comes back within the controller's CAP.TO is used again.
//   CC.EN 1→0    closes every connection: the controller forgets its queues, as a reset
//                does. The engine's recovery (io_engine.h) is thus a reconnect.
//   queues       Create I/O CQ/SQ are answered here: creating SQ n opens TCP connection n
//                and sends Fabrics Connect for queue n (one queue pair per connection, TCP
//                §2); Delete I/O SQ closes it.
//   doorbells    ringing an SQ tail doorbell sends the new entries as CapsuleCmd PDUs in
//                the ringing thread; PRPs are turned into the memory they name, and the
//                command carries an SGL: its write data in the capsule when it fits the
//                controller's IOCCSZ (TCP §3.3.2), else moved by R2T/H2CData and
//                C2HData PDUs. Each connection's receive thread sleeps in recv() and posts
//                completions into the host's CQ memory (phase tag last), then raises the
//                queue's InterruptLine: an idle mount sleeps in the kernel, nothing polls.
//   keep-alive   Connect sets KATO; a thread sends Keep Alive every KATO/2.
//   failures     a connection that closes, times out or breaks the protocol fails its
//                commands in flight (Transient Transport Error, which callers see as EIO)
//                and makes CSTS read CFS, so the engine's watchdog resets, which reconnects.
//
// Discovery (TcpTransport::discover): the discovery controller of NVMe-oF §5 (well-known NQN
// nqn.2014-08.org.nvmexpress.discovery) is connected on the admin queue alone, enabled, and
// its Discovery Log Page (Log Identifier 70h, NVMe-oF §5.3) read whole.
//
// R2Ts: ICReq offers MAXR2T 15 (16 outstanding per command, TCP §3.6.2.2); each R2T may ask
// for any range of the command not asked for before, and is answered with its H2CData as
// it arrives. (The kernel's nvmet sends one R2T per command whatever the host offers.)
//
// Not done yet: TLS, SGL-capable memory without PRPs.
//
// Thread-safety: as Transport. open() and the destructor are not concurrent with anything.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "warpfs/nvme/transport.h"

namespace warpfs::nvme {

struct TcpOptions {
  std::string host;  // name or address
  std::string port = "4420";
  std::string subnqn;          // the NVM subsystem to connect to
  std::string hostnqn;         // empty: nqn.2014-08.org.nvmexpress:uuid:<this transport's host id>
  bool header_digest = false;  // ask for HDGST/DDGST in ICReq (TCP §3.6.2.2)
  bool data_digest = false;
  uint32_t kato_ms = 15'000;  // keep-alive timeout sent in Connect; 0: no keep-alive
  uint64_t connect_timeout_ns = 5'000'000'000ull;  // TCP connect, ICResp, Connect response
  uint64_t command_timeout_ns = 5'000'000'000ull;  // Property Get/Set and Keep Alive
};

struct TcpCounters {
  uint64_t connects = 0;             // successful queue connections (admin and I/O)
  uint64_t connection_failures = 0;  // connections lost or refused
  uint64_t capsules = 0;             // commands sent
  uint64_t r2ts = 0;                 // R2T PDUs answered
  uint64_t c2h_pdus = 0;             // C2HData PDUs received
  uint64_t keep_alives = 0;          // Keep Alive commands completed
};

// The well-known NQN of discovery controllers (NVMe-oF 1.1 §5).
inline constexpr const char* kDiscoveryNqn = "nqn.2014-08.org.nvmexpress.discovery";

// One Discovery Log Page Entry (NVMe-oF 1.1 §5.3, Figure 41), strings with their padding
// (spaces or NULs) removed.
struct DiscoveryEntry {
  uint8_t trtype = 0;   // 1 RDMA, 2 FC, 3 TCP, 254 intra-host
  uint8_t adrfam = 0;   // 1 IPv4, 2 IPv6, 3 InfiniBand, 4 FC, 254 intra-host
  uint8_t subtype = 0;  // 1 referral to a discovery service, 2 NVM subsystem, 3 this discovery
  uint8_t treq = 0;
  uint16_t portid = 0;
  uint16_t cntlid = 0;
  uint16_t asqsz = 0;
  std::string trsvcid, subnqn, traddr;
};
// Decodes a Discovery Log Page (header and entries, `n` bytes): its generation counter and
// the entries the header counts (at most those the bytes hold). False with a message if the
// page is shorter than its header or names an unknown record format.
bool parse_discovery_log(const uint8_t* page, size_t n, uint64_t* genctr,
                         std::vector<DiscoveryEntry>* out, std::string* error);

class TcpTransport final : public Transport {
 public:
  // Connects to the discovery controller at o.host:o.port (o.subnqn is ignored: the
  // well-known discovery NQN is used) and reads its Discovery Log Page; the entries in
  // `out`. False with a message on failure.
  static bool discover(const TcpOptions& o, std::vector<DiscoveryEntry>* out, std::string* error);

  // Connects the admin queue and reads CAP and VS; null and a message on failure.
  static std::unique_ptr<TcpTransport> open(const TcpOptions& o, std::string* error);
  ~TcpTransport() override;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  std::string name() const override;
  uint32_t read32(uint32_t offset) override;
  void write32(uint32_t offset, uint32_t value) override;
  uint64_t read64(uint32_t offset) override;
  void write64(uint32_t offset, uint64_t value) override;
  Doorbell doorbell(uint16_t qid, bool cq) override;
  InterruptLine* interrupt(uint16_t vector) override;
  uint16_t interrupt_vectors() const override;
  Status dma_alloc(size_t bytes, DmaRegion* out) override;
  void dma_free(const DmaRegion& region) override;

  TcpCounters counters() const;
  // The last connection error, for messages ("" if none).
  std::string last_error() const;

  struct Impl;

 private:
  explicit TcpTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace warpfs::nvme
