// libFuzzer target: the NVMe/TCP PDU parser (nvme/src/tcp_pdu.cc) fed by a hostile peer.
//
// Input: byte 0 configures the receiving end (bit 0: the target's side, else the
// initiator's; bit 1: header digests negotiated; bit 2: data digests; bits 7:3 pick the
// stream's chunk size for the second pass); the rest is the byte stream the peer sends.
//
// Two passes over the same stream: decode_pdu over the whole buffer, PDU after PDU, and a
// PduReader reading it in chunks (as a socket delivers it), data in two pieces. Promises
// checked besides "no crash, no sanitizer report": a decoded PDU's data lies inside the
// buffer and within Limits::max_data, its PLEN covers what was consumed, and both passes
// agree on how many PDUs the stream holds before the first error.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "warpfs/nvme/tcp_pdu.h"

using namespace warpfs::nvme::tcp;

namespace {

constexpr uint32_t kMaxData = 8192;

void promise(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "promise broken: %s\n", what);
    std::abort();
  }
}

struct Chunks {
  const uint8_t* p;
  size_t n;
  size_t at = 0;
  size_t chunk;
  static ssize_t read(void* ctx, void* buf, size_t want) {
    auto* c = static_cast<Chunks*>(ctx);
    const size_t k = std::min({want, c->chunk, c->n - c->at});
    std::memcpy(buf, c->p + c->at, k);
    c->at += k;
    return static_cast<ssize_t>(k);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* in, size_t size) {
  if (size < 1) return 0;
  Limits l;
  l.host = !(in[0] & 1);
  l.digests.header = in[0] & 2;
  l.digests.data = in[0] & 4;
  l.max_data = kMaxData;
  const size_t chunk = 1 + (in[0] >> 3) * 7;
  const uint8_t* buf = in + 1;
  const size_t n = size - 1;

  size_t at = 0;
  int whole = 0;
  for (;;) {
    Pdu p;
    const uint8_t* data = nullptr;
    size_t used = 0;
    std::string err;
    const int r = decode_pdu(buf + at, n - at, l, &p, &data, &used, &err);
    if (r != 1) {
      promise(r == 0 || !err.empty(), "an error without a message");
      break;
    }
    promise(used >= kCommonHeaderBytes && used <= n - at && used == p.plen, "PLEN and consumed");
    promise(
        p.data_len <= kMaxData || p.type == PduType::kH2CTermReq || p.type == PduType::kC2HTermReq,
        "data within max_data");
    promise(data >= buf + at && data + p.data_len <= buf + at + used, "data inside the PDU");
    at += used;
    ++whole;
  }

  Chunks c{buf, n, 0, chunk};
  PduReader reader(&Chunks::read, &c);
  reader.limits() = l;
  std::vector<uint8_t> sink(kMaxData + 256);
  int streamed = 0;
  for (;;) {
    Pdu p;
    std::string err;
    if (!reader.read_header(&p, &err)) break;
    promise(p.data_len <= sink.size(), "reader data within bounds");
    const size_t half = p.data_len / 2;
    if (!reader.read_data(sink.data(), half, &err)) break;
    if (!reader.read_data(sink.data() + half, p.data_len - half, &err)) break;
    if (!reader.finish_data(&err)) break;
    ++streamed;
  }
  promise(streamed == whole, "the stream reader and the buffer decoder agree");
  return 0;
}
