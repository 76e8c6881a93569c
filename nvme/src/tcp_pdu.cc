#include "warpfs/nvme/tcp_pdu.h"

#include <array>
#include <cstring>

namespace warpfs::nvme::tcp {
namespace {

// Slice-by-8 tables for the reflected Castagnoli polynomial, built once.
struct Crc32cTables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Crc32cTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82f63b78u : 0u);
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};
const Crc32cTables& tables() {
  static const Crc32cTables tab;
  return tab;
}

// Whether the type carries the header digest when negotiated (all but ICReq, ICResp and the
// termination requests: TCP §3.6.2).
bool has_digests(PduType t) {
  return t == PduType::kCapsuleCmd || t == PduType::kCapsuleResp || t == PduType::kH2CData ||
         t == PduType::kC2HData || t == PduType::kR2T;
}
// Whether the type carries data after PDO (and so a data digest when negotiated).
bool carries_data(PduType t) {
  return t == PduType::kCapsuleCmd || t == PduType::kH2CData || t == PduType::kC2HData;
}
bool is_term(PduType t) {
  return t == PduType::kH2CTermReq || t == PduType::kC2HTermReq;
}

// HLEN of each type; 0 for a type this end does not receive (or an unknown one).
uint8_t header_len(PduType t) {
  switch (t) {
    case PduType::kIcReq:
    case PduType::kIcResp:
      return kIcBytes;
    case PduType::kH2CTermReq:
    case PduType::kC2HTermReq:
      return kTermReqHeaderBytes;
    case PduType::kCapsuleCmd:
      return kCapsuleCmdHeaderBytes;
    case PduType::kCapsuleResp:
      return kCapsuleRespHeaderBytes;
    case PduType::kH2CData:
    case PduType::kC2HData:
    case PduType::kR2T:
      return kDataHeaderBytes;
  }
  return 0;
}

bool received_by(PduType t, bool host) {
  switch (t) {
    case PduType::kIcResp:
    case PduType::kC2HTermReq:
    case PduType::kCapsuleResp:
    case PduType::kC2HData:
    case PduType::kR2T:
      return host;
    case PduType::kIcReq:
    case PduType::kH2CTermReq:
    case PduType::kCapsuleCmd:
    case PduType::kH2CData:
      return !host;
  }
  return false;
}

bool fail(std::string* error, const std::string& what) {
  *error = "NVMe/TCP: " + what;
  return false;
}

}  // namespace

uint32_t crc32c_update(uint32_t crc, const void* data, size_t n) {
  const auto& t = tables().t;
  const auto* p = static_cast<const uint8_t*>(data);
  while (n >= 8) {
    const uint32_t lo = crc ^ get_le32(p);
    const uint32_t hi = get_le32(p + 4);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
          t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return crc;
}

size_t encode_header(const Pdu& p, uint32_t data_len, const Digests& d, uint8_t pda,
                     uint8_t out[kMaxHeaderBytes]) {
  const uint8_t hlen = header_len(p.type);
  const size_t hd = (d.header && has_digests(p.type)) ? kDigestBytes : 0;
  const size_t dd = (d.data && data_len > 0 && carries_data(p.type)) ? kDigestBytes : 0;
  std::memset(out, 0, kMaxHeaderBytes);
  uint8_t* h = out;
  h[0] = static_cast<uint8_t>(p.type);
  h[1] = static_cast<uint8_t>((p.flags & ~(flag::kHdgst | flag::kDdgst)) | (hd ? flag::kHdgst : 0) |
                              (dd ? flag::kDdgst : 0));
  h[2] = hlen;
  size_t before_data = hlen + hd;
  uint32_t plen = static_cast<uint32_t>(before_data);
  if (data_len > 0) {
    if (!is_term(p.type)) {
      const size_t align = (size_t{pda} + 1) * 4;
      before_data = (before_data + align - 1) / align * align;
      h[3] = static_cast<uint8_t>(before_data);
    }
    plen = static_cast<uint32_t>(before_data + data_len + dd);
  }
  put_le32(h + 4, plen);
  switch (p.type) {
    case PduType::kIcReq:
    case PduType::kIcResp:
      put_le16(h + 8, p.pfv);
      h[10] = p.pda;
      h[11] = p.dgst;
      put_le32(h + 12, p.type == PduType::kIcReq ? p.maxr2t : p.maxdata);
      break;
    case PduType::kH2CTermReq:
    case PduType::kC2HTermReq:
      put_le16(h + 8, p.fes);
      put_le32(h + 10, p.fei);
      break;
    case PduType::kCapsuleCmd:
      std::memcpy(h + 8, &p.cmd, sizeof p.cmd);
      break;
    case PduType::kCapsuleResp:
      std::memcpy(h + 8, &p.rsp, sizeof p.rsp);
      break;
    case PduType::kH2CData:
    case PduType::kC2HData:
    case PduType::kR2T:
      put_le16(h + 8, p.cccid);
      put_le16(h + 10, p.type == PduType::kC2HData ? 0 : p.ttag);
      put_le32(h + 12, p.offset);
      put_le32(h + 16, p.length);
      break;
  }
  if (hd) put_le32(h + hlen, crc32c(h, hlen));
  return before_data;
}

bool check_common(const uint8_t ch[kCommonHeaderBytes], const Limits& l, size_t* rest,
                  std::string* error) {
  const auto type = static_cast<PduType>(ch[0]);
  const uint8_t flags = ch[1];
  const uint8_t hlen = ch[2];
  const uint32_t plen = get_le32(ch + 4);
  if (header_len(type) == 0 || !received_by(type, l.host)) {
    return fail(error, "unexpected PDU type " + std::to_string(ch[0]) +
                           (l.host ? " from the controller" : " from the host"));
  }
  if (hlen != header_len(type)) {
    return fail(error, "PDU type " + std::to_string(ch[0]) + " with HLEN " + std::to_string(hlen) +
                           " (expected " + std::to_string(header_len(type)) + ")");
  }
  size_t hd = 0;
  if (has_digests(type)) {
    if (((flags & flag::kHdgst) != 0) != l.digests.header)
      return fail(error, "header digest flag disagrees with what was negotiated");
    hd = l.digests.header ? kDigestBytes : 0;
  } else if (flags & (flag::kHdgst | flag::kDdgst)) {
    return fail(error, "digest flags on a PDU that has no digests");
  }
  if (plen < hlen + hd)
    return fail(error, "PLEN " + std::to_string(plen) + " shorter than the header");
  *rest = hlen - kCommonHeaderBytes + hd;
  return true;
}

bool decode_header(const uint8_t* h, size_t n, const Limits& l, Pdu* out, std::string* error) {
  if (n < kCommonHeaderBytes) return fail(error, "short PDU header");
  size_t rest = 0;
  if (!check_common(h, l, &rest, error)) return false;
  if (n != kCommonHeaderBytes + rest) return fail(error, "PDU header of the wrong length");
  Pdu p;
  p.type = static_cast<PduType>(h[0]);
  p.flags = h[1];
  p.hlen = h[2];
  p.pdo = h[3];
  p.plen = get_le32(h + 4);
  const size_t hd = (p.flags & flag::kHdgst) ? kDigestBytes : 0;
  if (hd && crc32c(h, p.hlen) != get_le32(h + p.hlen)) return fail(error, "header digest error");
  const size_t header_end = p.hlen + hd;
  if (is_term(p.type)) {
    // The data is the offending PDU header, at most 128 bytes, right after the header.
    if (p.plen - header_end > kTermReqMaxData) return fail(error, "termination request too long");
    p.data_len = static_cast<uint32_t>(p.plen - header_end);
    p.pad = 0;
  } else if (carries_data(p.type) && p.plen > header_end) {
    const size_t dd = (p.flags & flag::kDdgst) ? kDigestBytes : 0;
    if ((dd != 0) != l.digests.data)
      return fail(error, "data digest flag disagrees with what was negotiated");
    if (p.pdo < header_end || p.pdo - header_end > kMaxPad)
      return fail(error, "PDO " + std::to_string(p.pdo) + " does not follow the header");
    if (p.plen < p.pdo + dd) return fail(error, "PLEN ends before PDO");
    p.pad = static_cast<uint32_t>(p.pdo - header_end);
    p.data_len = static_cast<uint32_t>(p.plen - p.pdo - dd);
    if (p.data_len == 0) return fail(error, "a data PDU without data");
    if (p.data_len > l.max_data) {
      return fail(error, "PDU data of " + std::to_string(p.data_len) + " bytes (at most " +
                             std::to_string(l.max_data) + " accepted)");
    }
  } else {
    if (p.plen != header_end) {
      return fail(error, "PLEN " + std::to_string(p.plen) + " of a PDU type " +
                             std::to_string(h[0]) + " that carries no data");
    }
    if (p.flags & flag::kDdgst) return fail(error, "data digest flag on a PDU without data");
  }
  switch (p.type) {
    case PduType::kIcReq:
    case PduType::kIcResp:
      p.pfv = get_le16(h + 8);
      p.pda = h[10];
      p.dgst = h[11];
      if (p.pfv != 0) return fail(error, "unsupported PDU format version " + std::to_string(p.pfv));
      if (p.pda > 31) return fail(error, "PDU data alignment beyond 31");
      if (p.type == PduType::kIcReq) {
        p.maxr2t = get_le32(h + 12);
      } else {
        p.maxdata = get_le32(h + 12);
        if (p.maxdata < 4096 || p.maxdata % 4 != 0)
          return fail(error,
                      "MAXH2CDATA " + std::to_string(p.maxdata) + " (at least 4096, dwords)");
      }
      break;
    case PduType::kH2CTermReq:
    case PduType::kC2HTermReq:
      p.fes = get_le16(h + 8);
      p.fei = get_le32(h + 10);
      break;
    case PduType::kCapsuleCmd:
      std::memcpy(&p.cmd, h + 8, sizeof p.cmd);
      break;
    case PduType::kCapsuleResp:
      std::memcpy(&p.rsp, h + 8, sizeof p.rsp);
      break;
    case PduType::kH2CData:
    case PduType::kC2HData:
    case PduType::kR2T:
      p.cccid = get_le16(h + 8);
      p.ttag = p.type == PduType::kC2HData ? 0 : get_le16(h + 10);
      p.offset = get_le32(h + 12);
      p.length = get_le32(h + 16);
      if (uint64_t{p.offset} + p.length > 0xffffffffull)
        return fail(error, "data offset plus length beyond 4 GiB");
      if (p.type == PduType::kR2T) {
        if (p.length == 0) return fail(error, "R2T for no data");
      } else {
        if (p.data_len == 0) return fail(error, "a data PDU without data");
        if (p.length != p.data_len) {
          return fail(error, "DATAL " + std::to_string(p.length) + " but the PDU holds " +
                                 std::to_string(p.data_len) + " bytes");
        }
        if ((p.flags & flag::kSuccess) && !(p.flags & flag::kLastPdu))
          return fail(error, "C2HData SUCCESS without LAST_PDU");
      }
      break;
  }
  *out = p;
  return true;
}

int decode_pdu(const uint8_t* buf, size_t n, const Limits& l, Pdu* out, const uint8_t** data,
               size_t* consumed, std::string* error) {
  if (n < kCommonHeaderBytes) return 0;
  size_t rest = 0;
  if (!check_common(buf, l, &rest, error)) return -1;
  const size_t hn = kCommonHeaderBytes + rest;
  if (n < hn) return 0;
  Pdu p;
  if (!decode_header(buf, hn, l, &p, error)) return -1;
  if (n < p.plen) return 0;
  const size_t at = hn + p.pad;
  *data = buf + at;
  if (p.data_len > 0 && (p.flags & flag::kDdgst)) {
    if (crc32c(buf + at, p.data_len) != get_le32(buf + at + p.data_len)) {
      fail(error, "data digest error");
      return -1;
    }
  }
  *out = p;
  *consumed = p.plen;
  return 1;
}

bool PduReader::read_exact(void* dst, size_t n, std::string* error) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t r = fn_(ctx_, p, n);
    if (r == 0) return fail(error, "connection closed by the peer");
    if (r < 0)
      return fail(error, std::string("receive failed: ") + std::strerror(static_cast<int>(-r)));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool PduReader::read_header(Pdu* out, std::string* error) {
  if (data_left_ != 0) return fail(error, "the previous PDU's data was not read");
  uint8_t h[kMaxHeaderBytes];
  if (!read_exact(h, kCommonHeaderBytes, error)) return false;
  size_t rest = 0;
  if (!check_common(h, limits_, &rest, error)) return false;
  if (!read_exact(h + kCommonHeaderBytes, rest, error)) return false;
  if (!decode_header(h, kCommonHeaderBytes + rest, limits_, out, error)) return false;
  if (out->pad > 0 && !read_exact(h, out->pad, error)) return false;
  data_left_ = out->data_len;
  data_digest_ = out->data_len > 0 && (out->flags & flag::kDdgst);
  crc_ = kCrc32cInit;
  return true;
}

bool PduReader::read_data(void* dst, size_t n, std::string* error) {
  if (n > data_left_) return fail(error, "reading past the PDU's data");
  if (!read_exact(dst, n, error)) return false;
  if (data_digest_) crc_ = crc32c_update(crc_, dst, n);
  data_left_ -= static_cast<uint32_t>(n);
  return true;
}

bool PduReader::skip_data(size_t n, std::string* error) {
  uint8_t buf[4096];
  while (n > 0) {
    const size_t k = n < sizeof buf ? n : sizeof buf;
    if (!read_data(buf, k, error)) return false;
    n -= k;
  }
  return true;
}

bool PduReader::finish_data(std::string* error) {
  if (data_left_ != 0) return fail(error, "the PDU's data was not all read");
  if (!data_digest_) return true;
  data_digest_ = false;
  uint8_t d[kDigestBytes];
  if (!read_exact(d, sizeof d, error)) return false;
  if (crc32c_final(crc_) != get_le32(d)) return fail(error, "data digest error");
  return true;
}

}  // namespace warpfs::nvme::tcp
