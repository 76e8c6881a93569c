// The NVMe/TCP PDU codec (tcp_pdu.h): round trips of every PDU type with and without
// digests, streams split at every byte, and peers that lie about lengths, digests, types and
// offsets.
#include "warpfs/nvme/tcp_pdu.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace warpfs::nvme::tcp {
namespace {

// A whole PDU as bytes: header (as encode_header writes it), data, data digest.
std::vector<uint8_t> build(const Pdu& p, const std::vector<uint8_t>& data, const Digests& d,
                           uint8_t pda = 0) {
  uint8_t h[kMaxHeaderBytes];
  const size_t n = encode_header(p, static_cast<uint32_t>(data.size()), d, pda, h);
  std::vector<uint8_t> out(h, h + n);
  out.insert(out.end(), data.begin(), data.end());
  if (d.data && !data.empty() && (h[1] & flag::kDdgst)) {
    uint8_t dg[4];
    put_le32(dg, crc32c(data.data(), data.size()));
    out.insert(out.end(), dg, dg + 4);
  }
  EXPECT_EQ(out.size(), get_le32(h + 4)) << "PLEN covers the whole PDU";
  return out;
}

Limits host_limits(Digests d = {}) {
  Limits l;
  l.host = true;
  l.digests = d;
  l.max_data = 1 << 20;
  return l;
}
Limits target_limits(Digests d = {}) {
  Limits l = host_limits(d);
  l.host = false;
  return l;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

Pdu c2h(uint16_t cid, uint32_t off, uint32_t len, uint8_t flags = 0) {
  Pdu p;
  p.type = PduType::kC2HData;
  p.cccid = cid;
  p.offset = off;
  p.length = len;
  p.flags = flags;
  return p;
}

// Stream source handing out at most `chunk` bytes per read (1: every byte split).
struct Source {
  const std::vector<uint8_t>* bytes;
  size_t at = 0;
  size_t chunk = 1;
  static ssize_t read(void* ctx, void* buf, size_t n) {
    auto* s = static_cast<Source*>(ctx);
    const size_t k = std::min({n, s->chunk, s->bytes->size() - s->at});
    std::memcpy(buf, s->bytes->data() + s->at, k);
    s->at += k;
    return static_cast<ssize_t>(k);
  }
};

TEST(TcpPdu, Crc32cKnownAnswer) {
  // The CRC-32C check value (RFC 3720 §B.4 gives the same polynomial).
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  const std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);  // RFC 3720 §B.4
  // Chaining over pieces gives the digest of the whole.
  const auto v = pattern(1000, 3);
  uint32_t c = kCrc32cInit;
  c = crc32c_update(c, v.data(), 13);
  c = crc32c_update(c, v.data() + 13, 987);
  EXPECT_EQ(crc32c_final(c), crc32c(v.data(), v.size()));
}

TEST(TcpPdu, EveryTypeRoundTripsWithAndWithoutDigests) {
  for (int dg = 0; dg < 4; ++dg) {
    const Digests d{(dg & 1) != 0, (dg & 2) != 0};
    SCOPED_TRACE("digests " + std::to_string(dg));
    std::string err;
    Pdu out;
    const uint8_t* data = nullptr;
    size_t used = 0;
    // CapsuleCmd with in-capsule data, to a target, its data aligned to 32 bytes.
    Pdu cmd;
    cmd.type = PduType::kCapsuleCmd;
    cmd.cmd.opcode = 0x01;
    cmd.cmd.cid = 77;
    cmd.cmd.cdw10 = 0x12345678;
    const auto payload = pattern(600, 9);
    auto b = build(cmd, payload, d, 7);
    ASSERT_EQ(decode_pdu(b.data(), b.size(), target_limits(d), &out, &data, &used, &err), 1) << err;
    EXPECT_EQ(used, b.size());
    EXPECT_EQ(out.pdo % 32, 0);
    EXPECT_EQ(out.cmd.cid, 77);
    EXPECT_EQ(out.cmd.cdw10, 0x12345678u);
    ASSERT_EQ(out.data_len, payload.size());
    EXPECT_EQ(std::memcmp(data, payload.data(), payload.size()), 0);
    // CapsuleResp.
    Pdu rsp;
    rsp.type = PduType::kCapsuleResp;
    rsp.rsp.cid = 5;
    rsp.rsp.dw0 = 0xabcd;
    rsp.rsp.status = 0x2 << 1;
    b = build(rsp, {}, d);
    ASSERT_EQ(decode_pdu(b.data(), b.size(), host_limits(d), &out, &data, &used, &err), 1) << err;
    EXPECT_EQ(out.rsp.cid, 5);
    EXPECT_EQ(out.rsp.dw0, 0xabcdu);
    EXPECT_EQ(out.data_len, 0u);
    // C2HData with SUCCESS.
    b = build(c2h(9, 4096, 512, flag::kLastPdu | flag::kSuccess), pattern(512, 1), d);
    ASSERT_EQ(decode_pdu(b.data(), b.size(), host_limits(d), &out, &data, &used, &err), 1) << err;
    EXPECT_EQ(out.cccid, 9);
    EXPECT_EQ(out.offset, 4096u);
    EXPECT_EQ(out.length, 512u);
    EXPECT_TRUE(out.flags & flag::kSuccess);
    // R2T and H2CData.
    Pdu r2t;
    r2t.type = PduType::kR2T;
    r2t.cccid = 3;
    r2t.ttag = 44;
    r2t.offset = 8192;
    r2t.length = 65536;
    b = build(r2t, {}, d);
    ASSERT_EQ(decode_pdu(b.data(), b.size(), host_limits(d), &out, &data, &used, &err), 1) << err;
    EXPECT_EQ(out.ttag, 44);
    EXPECT_EQ(out.offset, 8192u);
    EXPECT_EQ(out.length, 65536u);
    Pdu h2c;
    h2c.type = PduType::kH2CData;
    h2c.cccid = 3;
    h2c.ttag = 44;
    h2c.offset = 8192;
    h2c.length = 100;
    h2c.flags = flag::kLastPdu;
    b = build(h2c, pattern(100, 4), d);
    ASSERT_EQ(decode_pdu(b.data(), b.size(), target_limits(d), &out, &data, &used, &err), 1) << err;
    EXPECT_EQ(out.ttag, 44);
    EXPECT_TRUE(out.flags & flag::kLastPdu);
  }
  // ICReq / ICResp never carry digests, whatever was negotiated.
  Pdu ic;
  ic.type = PduType::kIcReq;
  ic.pda = 0;
  ic.dgst = 3;
  ic.maxr2t = 0;
  auto b = build(ic, {}, Digests{true, true});
  ASSERT_EQ(b.size(), kIcBytes);
  Pdu out;
  const uint8_t* data = nullptr;
  size_t used = 0;
  std::string err;
  ASSERT_EQ(decode_pdu(b.data(), b.size(), target_limits(), &out, &data, &used, &err), 1) << err;
  EXPECT_EQ(out.dgst, 3);
  ic.type = PduType::kIcResp;
  ic.maxdata = 131072;
  ic.pda = 3;
  b = build(ic, {}, {});
  ASSERT_EQ(decode_pdu(b.data(), b.size(), host_limits(), &out, &data, &used, &err), 1) << err;
  EXPECT_EQ(out.maxdata, 131072u);
  EXPECT_EQ(out.pda, 3);
}

TEST(TcpPdu, EveryPrefixIsIncompleteNotAnError) {
  const Digests d{true, true};
  const auto b = build(c2h(1, 0, 300, flag::kLastPdu), pattern(300, 2), d, 3);
  for (size_t n = 0; n < b.size(); ++n) {
    Pdu out;
    const uint8_t* data = nullptr;
    size_t used = 0;
    std::string err;
    ASSERT_EQ(decode_pdu(b.data(), n, host_limits(d), &out, &data, &used, &err), 0)
        << n << ": " << err;
  }
}

TEST(TcpPdu, ReaderHandlesSplitAndShortReads) {
  const Digests d{true, true};
  std::vector<uint8_t> stream;
  const auto a = pattern(5000, 1);
  const auto first = build(c2h(1, 0, 5000), a, d, 1);
  Pdu rsp;
  rsp.type = PduType::kCapsuleResp;
  rsp.rsp.cid = 1;
  const auto second = build(rsp, {}, d);
  stream.insert(stream.end(), first.begin(), first.end());
  stream.insert(stream.end(), second.begin(), second.end());
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{7}, size_t{4096}, size_t{1} << 20}) {
    SCOPED_TRACE(chunk);
    Source src{&stream, 0, chunk};
    PduReader r(&Source::read, &src);
    r.limits() = host_limits(d);
    Pdu p;
    std::string err;
    ASSERT_TRUE(r.read_header(&p, &err)) << err;
    ASSERT_EQ(p.type, PduType::kC2HData);
    std::vector<uint8_t> got(5000);
    // In uneven pieces, as the initiator scatters into pages.
    ASSERT_TRUE(r.read_data(got.data(), 17, &err)) << err;
    ASSERT_TRUE(r.read_data(got.data() + 17, 4000, &err)) << err;
    ASSERT_TRUE(r.read_data(got.data() + 4017, 983, &err)) << err;
    ASSERT_TRUE(r.finish_data(&err)) << err;
    EXPECT_EQ(got, a);
    ASSERT_TRUE(r.read_header(&p, &err)) << err;
    EXPECT_EQ(p.type, PduType::kCapsuleResp);
    ASSERT_TRUE(r.finish_data(&err)) << err;
    // The stream ends: a clean error, not a hang or a read past the end.
    EXPECT_FALSE(r.read_header(&p, &err));
    EXPECT_NE(err.find("closed"), std::string::npos) << err;
  }
}

TEST(TcpPdu, ReaderRejectsATruncatedPduAndReadingPastItsData) {
  const auto full = build(c2h(1, 0, 100), pattern(100, 1), {});
  const std::vector<uint8_t> cut(full.begin(), full.begin() + 50);
  Source src{&cut, 0, 1000};
  PduReader r(&Source::read, &src);
  r.limits() = host_limits();
  Pdu p;
  std::string err;
  ASSERT_TRUE(r.read_header(&p, &err)) << err;
  std::vector<uint8_t> buf(200);
  EXPECT_FALSE(r.read_data(buf.data(), 101, &err)) << "more than the PDU holds";
  EXPECT_FALSE(r.read_data(buf.data(), 100, &err)) << "the stream ends inside the data";
}

TEST(TcpPdu, BadDigestsAreCaught) {
  const Digests d{true, true};
  const auto good = build(c2h(1, 0, 256, flag::kLastPdu), pattern(256, 5), d);
  std::string err;
  Pdu out;
  const uint8_t* data = nullptr;
  size_t used = 0;
  // A bit flipped in the header (CCCID), in the header digest, in the data, in the data digest.
  for (size_t at : {size_t{8}, size_t{kDataHeaderBytes + 1}, size_t{kDataHeaderBytes + 4 + 10},
                    good.size() - 1}) {
    auto bad = good;
    bad[at] ^= 0x10;
    err.clear();
    EXPECT_EQ(decode_pdu(bad.data(), bad.size(), host_limits(d), &out, &data, &used, &err), -1)
        << at;
    EXPECT_NE(err.find("digest"), std::string::npos) << err;
    // Through the stream reader too.
    Source src{&bad, 0, 5};
    PduReader r(&Source::read, &src);
    r.limits() = host_limits(d);
    std::vector<uint8_t> buf(256);
    bool ok =
        r.read_header(&out, &err) && r.read_data(buf.data(), 256, &err) && r.finish_data(&err);
    EXPECT_FALSE(ok) << at;
  }
}

// Each mutation of a valid PDU that a lying or broken peer could send, and the field the
// error must name.
TEST(TcpPdu, LyingLengthsAndFieldsAreRejected) {
  const Digests none{};
  const auto base = build(c2h(1, 0, 64, flag::kLastPdu), pattern(64, 5), none);
  struct Case {
    const char* what;
    void (*mutate)(std::vector<uint8_t>&);
    const char* expect;
  };
  const Case cases[] = {
      {"PLEN beyond max_data",
       [](std::vector<uint8_t>& b) { put_le32(b.data() + 4, (1u << 20) + 100); }, "accepted"},
      {"PLEN shorter than the header", [](std::vector<uint8_t>& b) { put_le32(b.data() + 4, 10); },
       "shorter"},
      {"PLEN before PDO", [](std::vector<uint8_t>& b) { put_le32(b.data() + 4, 24); },
       "without data"},
      {"DATAL disagrees", [](std::vector<uint8_t>& b) { put_le32(b.data() + 16, 65); }, "DATAL"},
      {"HLEN wrong", [](std::vector<uint8_t>& b) { b[2] = 72; }, "HLEN"},
      {"PDO inside the header", [](std::vector<uint8_t>& b) { b[3] = 8; }, "PDO"},
      {"PDO far past the header", [](std::vector<uint8_t>& b) { b[3] = 200; }, "PDO"},
      {"host-bound type from the host", [](std::vector<uint8_t>& b) { b[0] = 0x06; },
       "unexpected PDU type"},
      {"unknown type", [](std::vector<uint8_t>& b) { b[0] = 0x08; }, "unexpected PDU type"},
      {"header digest flag not negotiated", [](std::vector<uint8_t>& b) { b[1] |= flag::kHdgst; },
       "header digest"},
      {"data digest flag not negotiated", [](std::vector<uint8_t>& b) { b[1] |= flag::kDdgst; },
       "data digest"},
      {"SUCCESS without LAST_PDU", [](std::vector<uint8_t>& b) { b[1] = flag::kSuccess; },
       "SUCCESS"},
      {"offset + length wraps",
       [](std::vector<uint8_t>& b) { put_le32(b.data() + 12, 0xfffffff0u); }, "beyond 4 GiB"},
  };
  for (const Case& c : cases) {
    auto b = base;
    c.mutate(b);
    Pdu out;
    const uint8_t* data = nullptr;
    size_t used = 0;
    std::string err;
    EXPECT_EQ(decode_pdu(b.data(), b.size(), host_limits(), &out, &data, &used, &err), -1)
        << c.what;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": " << err;
  }
  // A CapsuleResp or R2T claiming data; an ICResp with a bad MAXH2CDATA or version.
  Pdu rsp;
  rsp.type = PduType::kCapsuleResp;
  auto b = build(rsp, {}, none);
  put_le32(b.data() + 4, 64);
  b.resize(64);
  Pdu out;
  const uint8_t* data = nullptr;
  size_t used = 0;
  std::string err;
  EXPECT_EQ(decode_pdu(b.data(), b.size(), host_limits(), &out, &data, &used, &err), -1);
  EXPECT_NE(err.find("carries no data"), std::string::npos) << err;
  Pdu r2t;
  r2t.type = PduType::kR2T;
  r2t.length = 0;
  b = build(r2t, {}, none);
  EXPECT_EQ(decode_pdu(b.data(), b.size(), host_limits(), &out, &data, &used, &err), -1);
  Pdu ic;
  ic.type = PduType::kIcResp;
  ic.maxdata = 1000;
  b = build(ic, {}, none);
  EXPECT_EQ(decode_pdu(b.data(), b.size(), host_limits(), &out, &data, &used, &err), -1);
  EXPECT_NE(err.find("MAXH2CDATA"), std::string::npos) << err;
  ic.maxdata = 8192;
  ic.pfv = 1;
  b = build(ic, {}, none);
  EXPECT_EQ(decode_pdu(b.data(), b.size(), host_limits(), &out, &data, &used, &err), -1);
  EXPECT_NE(err.find("version"), std::string::npos) << err;
}

// Random bytes never make the decoder read out of bounds (ASan runs this) and, when they
// decode, the lengths it reports lie within the buffer.
TEST(TcpPdu, RandomBytesDecodeWithinBounds) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> b(rng() % 300);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    if (!b.empty()) b[0] = static_cast<uint8_t>(rng() % 10);
    if (b.size() > 2) b[2] = static_cast<uint8_t>(rng() % 2 ? 24 : b[2]);
    Pdu out;
    const uint8_t* data = nullptr;
    size_t used = 0;
    std::string err;
    const int r = decode_pdu(b.data(), b.size(), host_limits(Digests{bool(i & 1), bool(i & 2)}),
                             &out, &data, &used, &err);
    if (r == 1) {
      ASSERT_LE(used, b.size());
      ASSERT_LE(data + out.data_len, b.data() + b.size());
    }
  }
}

}  // namespace
}  // namespace warpfs::nvme::tcp
