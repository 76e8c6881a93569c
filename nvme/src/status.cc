#include "warpfs/nvme/status.h"

#include <cstdio>

namespace warpfs::nvme {

const char* status_name(uint16_t s) {
  const uint8_t type = status_sct(s), code = status_sc(s);
  if (type == sct::kGeneric) {
    switch (code) {
      case sc::kSuccess:
        return "Successful Completion";
      case sc::kInvalidOpcode:
        return "Invalid Command Opcode";
      case sc::kInvalidField:
        return "Invalid Field in Command";
      case sc::kCidConflict:
        return "Command ID Conflict";
      case sc::kDataTransferError:
        return "Data Transfer Error";
      case sc::kPowerLossAbort:
        return "Commands Aborted due to Power Loss Notification";
      case sc::kInternalError:
        return "Internal Error";
      case sc::kAbortRequested:
        return "Command Abort Requested";
      case sc::kSqDeletionAbort:
        return "Command Aborted due to SQ Deletion";
      case sc::kInvalidNamespace:
        return "Invalid Namespace or Format";
      case sc::kCommandSequenceError:
        return "Command Sequence Error";
      case sc::kInvalidPrpOffset:
        return "PRP Offset Invalid";
      case sc::kLbaOutOfRange:
        return "LBA Out of Range";
      case sc::kCapacityExceeded:
        return "Capacity Exceeded";
      case sc::kNamespaceNotReady:
        return "Namespace Not Ready";
      default:
        return "Generic Command Status (unknown code)";
    }
  }
  if (type == sct::kCommandSpecific) {
    switch (code) {
      case sc::kCqInvalid:
        return "Completion Queue Invalid";
      case sc::kInvalidQueueId:
        return "Invalid Queue Identifier";
      case sc::kInvalidQueueSize:
        return "Invalid Queue Size";
      case sc::kInvalidInterruptVector:
        return "Invalid Interrupt Vector";
      case sc::kInvalidLogPage:
        return "Invalid Log Page";
      case sc::kInvalidQueueDeletion:
        return "Invalid Queue Deletion";
      case sc::kFeatureNotSaveable:
        return "Feature Identifier Not Saveable";
      default:
        return "Command Specific Status (unknown code)";
    }
  }
  if (type == sct::kMedia) {
    switch (code) {
      case sc::kWriteFault:
        return "Write Fault";
      case sc::kUnrecoveredReadError:
        return "Unrecovered Read Error";
      default:
        return "Media and Data Integrity Error (unknown code)";
    }
  }
  if (type == sct::kPath) {
    return code == sc::kHostAbortedCommand ? "Host Aborted Command (controller reset)"
                                           : "Path Related Status (unknown code)";
  }
  return "Unknown Status Code Type";
}

std::string Status::to_string() const {
  switch (code_) {
    case Code::kOk:
      return "ok";
    case Code::kNvme: {
      char buf[160];
      std::snprintf(buf, sizeof buf, "NVMe status %s (SCT %u SC 0x%02x)", status_name(nvme_),
                    status_sct(nvme_), status_sc(nvme_));
      return buf;
    }
    default:
      break;
  }
  static const char* const kNames[] = {"ok",
                                       "nvme",
                                       "timeout",
                                       "queue full",
                                       "out of DMA memory",
                                       "invalid argument",
                                       "I/O error",
                                       "controller not ready",
                                       "cache set full"};
  std::string s = kNames[static_cast<int>(code_)];
  if (what_ != nullptr) s += std::string(": ") + what_;
  return s;
}

}  // namespace warpfs::nvme
