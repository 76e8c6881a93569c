// The NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0, "TCP"): encoding, strict decoding
// and the CRC32C digests, for both ends of a connection (the initiator in tcp.h, the scripted
// target the tests run).
//
// Every PDU starts with the 8-byte common header (TCP §3.6.1, Figure 21): PDU-Type, FLAGS,
// HLEN (header length), PDO (offset of the data from the PDU's start; 0 without data) and
// PLEN (the whole PDU: header, header digest, pad, data, data digest), PLEN little-endian.
// The PDU-specific header follows (its length is fixed per type), then the header digest
// (HDGST, 4 bytes) when negotiated, pad up to PDO, the data, and the data digest (DDGST).
// ICReq/ICResp and the termination requests never carry digests (TCP §3.6.2).
//
// Decoding is strict: a header whose type is not one this end receives, whose HLEN is not
// the type's, whose PDO/PLEN do not add up, whose digest flags disagree with what was
// negotiated, or whose data would be longer than the receiver allows, is rejected with a
// message naming the field (a peer that lies gets an error, never an access out of bounds).
//
// Thread-safety: the functions are pure; a PduReader is used by one thread at a time.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "warpfs/nvme/spec.h"

namespace warpfs::nvme::tcp {

// PDU types (TCP §3.6.2, Figure 22).
enum class PduType : uint8_t {
  kIcReq = 0x00,
  kIcResp = 0x01,
  kH2CTermReq = 0x02,
  kC2HTermReq = 0x03,
  kCapsuleCmd = 0x04,
  kCapsuleResp = 0x05,
  kH2CData = 0x06,
  kC2HData = 0x07,
  kR2T = 0x09,
};

// FLAGS (TCP §3.6.1, Figure 21, and the data PDUs' figures).
namespace flag {
inline constexpr uint8_t kHdgst = 1u << 0;    // HDGSTF: a header digest follows the header
inline constexpr uint8_t kDdgst = 1u << 1;    // DDGSTF: a data digest follows the data
inline constexpr uint8_t kLastPdu = 1u << 2;  // H2CData/C2HData: the last data of the transfer
inline constexpr uint8_t kSuccess = 1u << 3;  // C2HData: success, no CapsuleResp follows
}  // namespace flag

inline constexpr size_t kCommonHeaderBytes = 8;
inline constexpr size_t kIcBytes = 128;                // ICReq and ICResp (TCP §3.6.2.2-3)
inline constexpr size_t kTermReqHeaderBytes = 24;      // H2C/C2HTermReq (TCP §3.6.2.4-5)
inline constexpr size_t kTermReqMaxData = 128;         // the offending header, truncated
inline constexpr size_t kCapsuleCmdHeaderBytes = 72;   // CH + SQE (TCP §3.6.2.6)
inline constexpr size_t kCapsuleRespHeaderBytes = 24;  // CH + CQE (TCP §3.6.2.7)
inline constexpr size_t kDataHeaderBytes = 24;         // H2CData, C2HData, R2T (TCP §3.6.2.8-11)
inline constexpr size_t kDigestBytes = 4;
inline constexpr size_t kMaxPad = 128;  // PDA at most 31: 128-byte alignment (TCP §3.6.2.2)
// The longest header this codec writes or reads: ICReq/ICResp; a data PDU with digest and
// the largest pad is shorter.
inline constexpr size_t kMaxHeaderBytes = kDataHeaderBytes + kDigestBytes + kMaxPad;
static_assert(kMaxHeaderBytes >= kIcBytes);
static_assert(kMaxHeaderBytes >= kCapsuleCmdHeaderBytes + kDigestBytes);

// Fatal Error Status of a termination request (TCP §3.6.2.4, Figure 26).
namespace fes {
inline constexpr uint16_t kInvalidHeaderField = 0x01;
inline constexpr uint16_t kPduSequenceError = 0x02;
inline constexpr uint16_t kHeaderDigestError = 0x03;
inline constexpr uint16_t kDataOutOfRange = 0x04;
inline constexpr uint16_t kR2TLimitExceeded = 0x05;
inline constexpr uint16_t kUnsupportedParameter = 0x06;
}  // namespace fes

// SGL descriptor types in an NVMe/TCP command (TCP §3.3.2, Base §4.3.2): data in the
// capsule (Data Block, Offset subtype) or moved by H2CData/C2HData (Transport Data Block,
// Transport-specific subtype).
inline constexpr uint8_t kSglInCapsule = 0x01;
inline constexpr uint8_t kSglTransport = 0x5a;
inline constexpr uint8_t kPsdtSgl = 0x40;  // CDW0 PSDT = 01b: SGLs are used (Base §4.2)

// What a connection negotiated in ICReq/ICResp.
struct Digests {
  bool header = false;
  bool data = false;
};

// One decoded PDU header. Which fields mean something depends on `type`.
struct Pdu {
  PduType type = PduType::kIcReq;
  uint8_t flags = 0;
  uint8_t hlen = 0;
  uint8_t pdo = 0;
  uint32_t plen = 0;
  // ICReq: PFV, HPDA, DGST, MAXR2T; ICResp: PFV, CPDA, DGST, MAXH2CDATA (in `maxdata`).
  uint16_t pfv = 0;
  uint8_t pda = 0;   // 0's based dwords: data alignment (pda + 1) * 4 bytes
  uint8_t dgst = 0;  // bit 0 header digest, bit 1 data digest
  uint32_t maxr2t = 0;
  uint32_t maxdata = 0;
  SubmissionEntry cmd{};  // CapsuleCmd
  CompletionEntry rsp{};  // CapsuleResp
  uint16_t cccid = 0;     // H2CData, C2HData, R2T: the command's CID
  uint16_t ttag = 0;      // H2CData, R2T: the transfer tag
  uint32_t offset = 0;    // DATAO (data PDUs), R2TO (R2T)
  uint32_t length = 0;    // DATAL (data PDUs), R2TL (R2T)
  uint16_t fes = 0;       // termination requests
  uint32_t fei = 0;
  // Derived by decode_header: the bytes of data that follow (after `pad` bytes of pad).
  uint32_t data_len = 0;
  uint32_t pad = 0;
};

// What the decoding end accepts.
struct Limits {
  bool host = true;       // true: the initiator (receives ICResp, C2HTermReq, CapsuleResp,
                          // C2HData, R2T); false: a target (ICReq, H2CTermReq, CapsuleCmd,
                          // H2CData)
  Digests digests;        // negotiated; before ICResp both off
  uint32_t max_data = 0;  // longest data a C2HData/H2CData/CapsuleCmd may carry
};

// CRC32C (Castagnoli, reflected polynomial 82F63B78h), as NVMe/TCP's digests use it (TCP
// §3.6.3.3). crc32c_update chains: start with kCrc32cInit, finish with crc32c_final.
inline constexpr uint32_t kCrc32cInit = 0xffffffffu;
uint32_t crc32c_update(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c_final(uint32_t crc) {
  return crc ^ 0xffffffffu;
}
inline uint32_t crc32c(const void* data, size_t n) {
  return crc32c_final(crc32c_update(kCrc32cInit, data, n));
}

// Little-endian fields.
inline void put_le16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void put_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint16_t get_le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
inline uint32_t get_le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

// Writes the PDU's header, header digest and pad for `data_len` bytes of data that the caller
// sends next (followed, when `d.data` and data_len > 0, by the data digest over them). Fills
// in HLEN, PDO, PLEN and the digest flags; `pda` is the receiver's alignment (0's based
// dwords). Returns the bytes written to `out` (at most kMaxHeaderBytes).
size_t encode_header(const Pdu& p, uint32_t data_len, const Digests& d, uint8_t pda,
                     uint8_t out[kMaxHeaderBytes]);

// Checks the common header and returns in *rest how many more header bytes follow it
// (PDU-specific header plus header digest), which the caller reads before decode_header.
bool check_common(const uint8_t ch[kCommonHeaderBytes], const Limits& l, size_t* rest,
                  std::string* error);
// Decodes a whole header (`n` bytes: the common header and the `rest` check_common named),
// verifying the header digest and every length; fills data_len and pad.
bool decode_header(const uint8_t* hdr, size_t n, const Limits& l, Pdu* out, std::string* error);

// Decodes one whole PDU from a buffer (the fuzz target's entry, and the tests'): header, pad,
// data (returned as a pointer into `buf`), data digest. Returns 1 with *consumed set, 0 when
// `buf` holds only a prefix of a PDU, -1 on an error.
int decode_pdu(const uint8_t* buf, size_t n, const Limits& l, Pdu* out, const uint8_t** data,
               size_t* consumed, std::string* error);

// Reads PDUs from a byte stream that may deliver any number of bytes per call (a socket).
// read() returns the bytes read (> 0), 0 at end of stream, or -errno.
class PduReader {
 public:
  using ReadFn = ssize_t (*)(void* ctx, void* buf, size_t n);
  PduReader(ReadFn fn, void* ctx) : fn_(fn), ctx_(ctx) {}
  Limits& limits() { return limits_; }

  // Reads and checks the next PDU's header (and skips its pad). The PDU's data, if any, must
  // then be read whole with read_data (in pieces, in order) before finish_data.
  bool read_header(Pdu* out, std::string* error);
  bool read_data(void* dst, size_t n, std::string* error);
  // Discards `n` bytes of data (still covered by the digest).
  bool skip_data(size_t n, std::string* error);
  // Checks that all the data was read, and its digest.
  bool finish_data(std::string* error);

 private:
  bool read_exact(void* dst, size_t n, std::string* error);
  ReadFn fn_;
  void* ctx_;
  Limits limits_;
  uint32_t data_left_ = 0;
  bool data_digest_ = false;
  uint32_t crc_ = kCrc32cInit;
};

}  // namespace warpfs::nvme::tcp
