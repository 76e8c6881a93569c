// The one place where a device's status becomes the errno a filesystem call returns, as
// Linux's nvme_error_status() is for the block layer.
#include <cerrno>

#include "internal.h"

namespace warpfs::fs {

int errno_of(const blockdev::Status& st) {
  if (st.is_ok()) return 0;
  if (st.code() == nvme::Code::kNvme) {
    const uint16_t sf = st.nvme_status() & 0x7ff;  // status code type and code, no DNR/More
    // A thin-provisioned namespace out of space is a full disk to the application.
    if (sf == nvme::make_status(nvme::sct::kGeneric, nvme::sc::kCapacityExceeded, false))
      return ENOSPC;
    // A command the device does not implement (a trim on a drive without Dataset Management).
    if (sf == nvme::make_status(nvme::sct::kGeneric, nvme::sc::kInvalidOpcode, false))
      return EOPNOTSUPP;
  }
  // Media and transport errors, timeouts, resets, a dead controller, and a request the
  // device refused as malformed (from damaged metadata): the data is not there.
  return EIO;
}

}  // namespace warpfs::fs
