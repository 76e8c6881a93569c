// Errors as values for the NVMe layer (LevelDB style: no exceptions on any path).
//
// A Status is either ok, an NVMe completion status (the device said no), or a host-side
// failure (timeout, queue full, out of DMA memory, bad argument). It is trivially copyable
// and carries a static message, so the hot path never allocates.
//
// [[nodiscard]]: a Status returned and dropped is a compile error. Where dropping it is
// right (a best-effort step whose failure changes nothing for the caller), the call says so
// with (void) and a comment giving the reason.
#pragma once

#include <cstdint>
#include <string>

#include "warpfs/nvme/spec.h"

namespace warpfs::nvme {

enum class Code : uint8_t {
  kOk = 0,
  kNvme,             // the controller completed the command with an error status
  kTimeout,          // the controller did not answer in time
  kQueueFull,        // a raw queue pair has no free slot
  kNoMemory,         // DMA memory exhausted
  kInvalidArgument,  // the caller asked for something the device or layer cannot do
  kIoError,          // transport or backing-store failure
  kNotReady,         // controller disabled, failed (CSTS.CFS) or shut down
  kSetFull,          // the software cache: every line of the block's set is in use
};

class [[nodiscard]] Status {
 public:
  WARPFS_HD Status() : code_(Code::kOk), nvme_(0), what_(nullptr) {}
  WARPFS_HD static Status ok() { return Status(); }
  WARPFS_HD static Status nvme(uint16_t sf) {
    return status_ok(sf) ? Status() : Status(Code::kNvme, sf, nullptr);
  }
  WARPFS_HD static Status error(Code c, const char* what) { return Status(c, 0, what); }

  WARPFS_HD bool is_ok() const { return code_ == Code::kOk; }
  WARPFS_HD Code code() const { return code_; }
  // The NVMe status field (15 bits) when code() == kNvme, else 0.
  WARPFS_HD uint16_t nvme_status() const { return nvme_; }
  std::string to_string() const;

 private:
  WARPFS_HD Status(Code c, uint16_t sf, const char* what) : code_(c), nvme_(sf), what_(what) {}
  Code code_;
  uint16_t nvme_;
  const char* what_;  // static string; never owned
};

}  // namespace warpfs::nvme
