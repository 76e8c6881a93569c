// The NVM Express structures warpfs speaks, as code.
//
// Section numbers cite the NVM Express Base Specification 2.0c ("Base") and the NVM Command
// Set Specification 1.0c ("NVM"); where 1.4 numbering differs the 1.4 section is given too.
// Every layout has a static_assert on its size and on the offsets a device reads, so a
// mistake fails the build rather than corrupting a command.
//
// This header is plain data: it compiles for the host and (later) for CUDA devices.
#pragma once

#include <cstddef>
#include <cstdint>

#include "warpfs/nvme/port.h"

namespace warpfs::nvme {

// ---------------------------------------------------------------------------------------------
// Controller registers (Base §3.1.4, Figure 35; 1.4 §3.1). Offsets into BAR0.
// ---------------------------------------------------------------------------------------------
namespace reg {
inline constexpr uint32_t kCap = 0x00;    // Controller Capabilities, 64-bit
inline constexpr uint32_t kVs = 0x08;     // Version
inline constexpr uint32_t kIntms = 0x0c;  // Interrupt Mask Set
inline constexpr uint32_t kIntmc = 0x10;  // Interrupt Mask Clear
inline constexpr uint32_t kCc = 0x14;     // Controller Configuration
inline constexpr uint32_t kCsts = 0x1c;   // Controller Status
inline constexpr uint32_t kNssr = 0x20;   // NVM Subsystem Reset
inline constexpr uint32_t kAqa = 0x24;    // Admin Queue Attributes
inline constexpr uint32_t kAsq = 0x28;    // Admin SQ Base Address, 64-bit
inline constexpr uint32_t kAcq = 0x30;    // Admin CQ Base Address, 64-bit
inline constexpr uint32_t kDoorbellBase = 0x1000;

// Base §3.1.4.23/24: SQ y Tail Doorbell at 1000h + (2y * (4 << CAP.DSTRD)),
// CQ y Head Doorbell at 1000h + ((2y + 1) * (4 << CAP.DSTRD)).
constexpr uint32_t sq_doorbell(uint16_t qid, uint32_t dstrd) {
  return kDoorbellBase + (2u * qid) * (4u << dstrd);
}
constexpr uint32_t cq_doorbell(uint16_t qid, uint32_t dstrd) {
  return kDoorbellBase + (2u * qid + 1u) * (4u << dstrd);
}
}  // namespace reg

// CAP fields (Base §3.1.4.1, Figure 36).
struct Cap {
  uint64_t raw;
  uint32_t mqes() const { return static_cast<uint32_t>(raw & 0xffff); }  // 0's based
  bool cqr() const { return (raw >> 16) & 1; }                           // contiguous queues
  bool ams_wrr() const { return (raw >> 17) & 1; }  // WRR with urgent priority class
  uint32_t to_500ms() const { return static_cast<uint32_t>((raw >> 24) & 0xff); }
  uint32_t dstrd() const { return static_cast<uint32_t>((raw >> 32) & 0xf); }
  bool css_nvm() const { return (raw >> 37) & 1; }
  uint32_t mpsmin() const { return static_cast<uint32_t>((raw >> 48) & 0xf); }  // 2^(12+x)
  uint32_t mpsmax() const { return static_cast<uint32_t>((raw >> 52) & 0xf); }

  static constexpr uint64_t make(uint32_t mqes, bool wrr, uint32_t to, uint32_t dstrd,
                                 uint32_t mpsmin, uint32_t mpsmax) {
    return uint64_t{mqes & 0xffff} | (uint64_t{1} << 16) | (uint64_t{wrr ? 1u : 0u} << 17) |
           (uint64_t{to & 0xff} << 24) | (uint64_t{dstrd & 0xf} << 32) | (uint64_t{1} << 37) |
           (uint64_t{mpsmin & 0xf} << 48) | (uint64_t{mpsmax & 0xf} << 52);
  }
};

// CC fields (Base §3.1.4.5, Figure 41).
namespace cc {
inline constexpr uint32_t kEn = 1u << 0;
inline constexpr uint32_t kCssShift = 4;   // 000b: NVM command set
inline constexpr uint32_t kMpsShift = 7;   // memory page size 2^(12+MPS)
inline constexpr uint32_t kAmsShift = 11;  // 000b round robin, 001b WRR with urgent
inline constexpr uint32_t kAmsMask = 7u << kAmsShift;
inline constexpr uint32_t kShnShift = 14;  // 01b normal shutdown, 10b abrupt
inline constexpr uint32_t kShnMask = 3u << kShnShift;
inline constexpr uint32_t kIosqesShift = 16;  // 2^n bytes, 6 for 64 B
inline constexpr uint32_t kIocqesShift = 20;  // 2^n bytes, 4 for 16 B
inline constexpr uint32_t kAmsWrr = 1;
}  // namespace cc

// CSTS fields (Base §3.1.4.6, Figure 42).
namespace csts {
inline constexpr uint32_t kRdy = 1u << 0;
inline constexpr uint32_t kCfs = 1u << 1;  // controller fatal status
inline constexpr uint32_t kShstShift = 2;  // 00b normal, 01b occurring, 10b complete
inline constexpr uint32_t kShstMask = 3u << kShstShift;
inline constexpr uint32_t kShstComplete = 2u << kShstShift;
}  // namespace csts

// ---------------------------------------------------------------------------------------------
// Submission Queue Entry (Base §4.2, Figure 88) and Completion Queue Entry (Base §4.6,
// Figure 90). Command Dword 0 (Figure 91): opcode 7:0, FUSE 9:8, PSDT 15:14, CID 31:16.
// ---------------------------------------------------------------------------------------------
struct SubmissionEntry {
  uint8_t opcode;
  uint8_t flags;  // FUSE 1:0, PSDT 7:6 (00b: PRPs are used)
  uint16_t cid;
  uint32_t nsid;
  uint32_t cdw2;
  uint32_t cdw3;
  uint64_t mptr;
  uint64_t prp1;
  uint64_t prp2;
  uint32_t cdw10;
  uint32_t cdw11;
  uint32_t cdw12;
  uint32_t cdw13;
  uint32_t cdw14;
  uint32_t cdw15;
};
static_assert(sizeof(SubmissionEntry) == 64, "Base §4.2: an SQE is 64 bytes");
static_assert(offsetof(SubmissionEntry, cid) == 2, "Figure 91: CID is CDW0 31:16");
static_assert(offsetof(SubmissionEntry, nsid) == 4, "Figure 88: NSID is dword 1");
static_assert(offsetof(SubmissionEntry, mptr) == 16, "Figure 88: MPTR is dwords 5:4");
static_assert(offsetof(SubmissionEntry, prp1) == 24, "Figure 88: PRP1 is dwords 7:6");
static_assert(offsetof(SubmissionEntry, prp2) == 32, "Figure 88: PRP2 is dwords 9:8");
static_assert(offsetof(SubmissionEntry, cdw10) == 40, "Figure 88: CDW10 at byte 40");
static_assert(offsetof(SubmissionEntry, cdw15) == 60, "Figure 88: CDW15 at byte 60");

struct CompletionEntry {
  uint32_t dw0;      // command specific
  uint32_t dw1;      // reserved / command specific
  uint16_t sq_head;  // SQ Head Pointer: how far the controller has consumed the SQ
  uint16_t sq_id;
  uint16_t cid;
  uint16_t status;  // bit 0: Phase Tag; 15:1 Status Field (Figure 92)
};
static_assert(sizeof(CompletionEntry) == 16, "Base §4.6: a CQE is 16 bytes");
static_assert(offsetof(CompletionEntry, sq_head) == 8, "Figure 90: SQHD is DW2 15:0");
static_assert(offsetof(CompletionEntry, cid) == 12, "Figure 90: CID is DW3 15:0");
static_assert(offsetof(CompletionEntry, status) == 14, "Figure 90: status is DW3 31:17");

// DW3 read as one 32-bit word, so that phase, CID and status are seen together.
inline constexpr size_t kCqeDw3Offset = 12;
WARPFS_HD constexpr uint16_t dw3_cid(uint32_t dw3) {
  return static_cast<uint16_t>(dw3 & 0xffff);
}
WARPFS_HD constexpr bool dw3_phase(uint32_t dw3) {
  return (dw3 >> 16) & 1;
}
WARPFS_HD constexpr uint16_t dw3_status(uint32_t dw3) {
  return static_cast<uint16_t>(dw3 >> 17);  // 15-bit Status Field without the phase tag
}

// ---------------------------------------------------------------------------------------------
// Status Field (Base §4.6.1, Figure 92): SC 7:0, SCT 10:8, CRD 12:11, M 13, DNR 14
// (bit positions within the 15-bit field, i.e. CQE DW3 bits 31:17).
// ---------------------------------------------------------------------------------------------
namespace sct {
inline constexpr uint8_t kGeneric = 0;          // Base §4.6.1.2.1
inline constexpr uint8_t kCommandSpecific = 1;  // Base §4.6.1.2.2
inline constexpr uint8_t kMedia = 2;            // Base §4.6.1.2.3
inline constexpr uint8_t kPath = 3;             // Base §4.6.1.2.4
}  // namespace sct

namespace sc {
// Generic Command Status (Base Figure 94).
inline constexpr uint8_t kSuccess = 0x00;
inline constexpr uint8_t kInvalidOpcode = 0x01;
inline constexpr uint8_t kInvalidField = 0x02;
inline constexpr uint8_t kCidConflict = 0x03;
inline constexpr uint8_t kDataTransferError = 0x04;
inline constexpr uint8_t kPowerLossAbort = 0x05;
inline constexpr uint8_t kInternalError = 0x06;
inline constexpr uint8_t kAbortRequested = 0x07;
inline constexpr uint8_t kSqDeletionAbort = 0x08;
inline constexpr uint8_t kInvalidNamespace = 0x0b;
inline constexpr uint8_t kCommandSequenceError = 0x0c;
inline constexpr uint8_t kInvalidPrpOffset = 0x13;
// Generic, NVM command set specific (NVM Figure 26).
inline constexpr uint8_t kLbaOutOfRange = 0x80;
inline constexpr uint8_t kCapacityExceeded = 0x81;
inline constexpr uint8_t kNamespaceNotReady = 0x82;
// Command Specific Status (Base Figure 95).
inline constexpr uint8_t kCqInvalid = 0x00;
inline constexpr uint8_t kInvalidQueueId = 0x01;
inline constexpr uint8_t kInvalidQueueSize = 0x02;
inline constexpr uint8_t kInvalidLogPage = 0x09;
inline constexpr uint8_t kInvalidInterruptVector = 0x08;
inline constexpr uint8_t kInvalidQueueDeletion = 0x0c;
inline constexpr uint8_t kFeatureNotSaveable = 0x0d;
// Media and Data Integrity Errors (NVM Figure 27).
inline constexpr uint8_t kWriteFault = 0x80;
inline constexpr uint8_t kUnrecoveredReadError = 0x81;
// Path Related Status (Base Figure 98).
inline constexpr uint8_t kHostAbortedCommand = 0x71;  // the host gave up on it (a reset)
}  // namespace sc

// A status field value (15 bits, no phase tag).
WARPFS_HD constexpr uint16_t make_status(uint8_t type, uint8_t code, bool dnr = true) {
  return static_cast<uint16_t>(code | (type << 8) | ((dnr ? 1 : 0) << 14));
}
WARPFS_HD constexpr uint8_t status_sc(uint16_t s) {
  return static_cast<uint8_t>(s & 0xff);
}
WARPFS_HD constexpr uint8_t status_sct(uint16_t s) {
  return static_cast<uint8_t>((s >> 8) & 7);
}
WARPFS_HD constexpr bool status_ok(uint16_t s) {
  return (s & 0x7ff) == 0;
}
// Human-readable name of a status field value, for logs and error messages.
const char* status_name(uint16_t status);

// ---------------------------------------------------------------------------------------------
// Opcodes: Admin (Base §5, Figure 138) and NVM I/O (NVM §3, Figure 32).
// ---------------------------------------------------------------------------------------------
namespace admin {
inline constexpr uint8_t kDeleteIoSq = 0x00;   // Base §5.7
inline constexpr uint8_t kCreateIoSq = 0x01;   // Base §5.5
inline constexpr uint8_t kGetLogPage = 0x02;   // Base §5.16
inline constexpr uint8_t kDeleteIoCq = 0x04;   // Base §5.6
inline constexpr uint8_t kCreateIoCq = 0x05;   // Base §5.4
inline constexpr uint8_t kIdentify = 0x06;     // Base §5.17
inline constexpr uint8_t kAbort = 0x08;        // Base §5.1
inline constexpr uint8_t kSetFeatures = 0x09;  // Base §5.27
inline constexpr uint8_t kGetFeatures = 0x0a;  // Base §5.15
}  // namespace admin

namespace io {
inline constexpr uint8_t kFlush = 0x00;              // NVM §3.2 (Base §7.1)
inline constexpr uint8_t kWrite = 0x01;              // NVM §3.2.6
inline constexpr uint8_t kRead = 0x02;               // NVM §3.2.4
inline constexpr uint8_t kWriteZeroes = 0x08;        // NVM §3.2.8
inline constexpr uint8_t kDatasetManagement = 0x09;  // NVM §3.2.3
// CDW12 of Read/Write/Write Zeroes (NVM Figures 43/62): NLB 15:0 (0's based), FUA bit 30.
inline constexpr uint32_t kCdw12Fua = 1u << 30;
inline constexpr uint32_t kCdw12WriteZeroesDeac = 1u << 25;
// CDW11 of Dataset Management (NVM Figure 38): AD (deallocate) bit 2.
inline constexpr uint32_t kDsmDeallocate = 1u << 2;
inline constexpr uint32_t kBroadcastNsid = 0xffffffffu;
}  // namespace io

// Dataset Management range (NVM §3.2.3, Figure 39).
struct DsmRange {
  uint32_t attributes;
  uint32_t lba_count;
  uint64_t slba;
};
static_assert(sizeof(DsmRange) == 16, "NVM Figure 39: a DSM range is 16 bytes");
inline constexpr uint32_t kDsmMaxRanges = 256;

// Identify CNS values (Base §5.17.1, Figure 273).
namespace cns {
inline constexpr uint8_t kNamespace = 0x00;
inline constexpr uint8_t kController = 0x01;
inline constexpr uint8_t kActiveNamespaceList = 0x02;
}  // namespace cns

// Feature identifiers (Base §5.27.1, Figure 317).
namespace fid {
inline constexpr uint8_t kArbitration = 0x01;         // Base §5.27.1.1
inline constexpr uint8_t kVolatileWriteCache = 0x06;  // Base §5.27.1.4
inline constexpr uint8_t kNumberOfQueues = 0x07;      // Base §5.27.1.5
}  // namespace fid

// Log page identifiers (Base §5.16.1, Figure 202).
namespace lid {
inline constexpr uint8_t kErrorInformation = 0x01;  // Base §5.16.1.2
inline constexpr uint8_t kSmartHealth = 0x02;       // Base §5.16.1.3
}  // namespace lid

// Create I/O SQ CDW11 QPRIO (Base §5.5, Figure 151): the WRR class of the queue.
enum class QueuePriority : uint8_t { kUrgent = 0, kHigh = 1, kMedium = 2, kLow = 3 };

// ---------------------------------------------------------------------------------------------
// Identify Controller data structure (Base §5.17.2.1, Figure 275). Only the fields warpfs
// reads or the emulated controller fills are named; the rest is reserved padding.
// ---------------------------------------------------------------------------------------------
struct IdentifyController {
  uint16_t vid;           // 1:0
  uint16_t ssvid;         // 3:2
  char sn[20];            // 23:4
  char mn[40];            // 63:24
  char fr[8];             // 71:64
  uint8_t rab;            // 72
  uint8_t ieee[3];        // 75:73
  uint8_t cmic;           // 76
  uint8_t mdts;           // 77: max transfer 2^MDTS units of CAP.MPSMIN, 0 = no limit
  uint16_t cntlid;        // 79:78
  uint32_t ver;           // 83:80
  uint32_t rtd3r;         // 87:84: RTD3 resume latency (microseconds)
  uint32_t rtd3e;         // 91:88: RTD3 entry latency (microseconds): shutdown time
  uint8_t rsvd92[164];    // 255:92
  uint16_t oacs;          // 257:256
  uint8_t acl;            // 258
  uint8_t aerl;           // 259
  uint8_t frmw;           // 260
  uint8_t lpa;            // 261
  uint8_t elpe;           // 262: error log page entries, 0's based
  uint8_t npss;           // 263
  uint8_t rsvd264[248];   // 511:264
  uint8_t sqes;           // 512: 3:0 required, 7:4 maximum (log2 bytes)
  uint8_t cqes;           // 513
  uint16_t maxcmd;        // 515:514
  uint32_t nn;            // 519:516: number of namespaces
  uint16_t oncs;          // 521:520: optional NVM command support
  uint16_t fuses;         // 523:522
  uint8_t fna;            // 524
  uint8_t vwc;            // 525: bit 0 volatile write cache present
  uint16_t awun;          // 527:526 (0's based, in logical blocks)
  uint16_t awupf;         // 529:528 (0's based)
  uint8_t rsvd530[3566];  // 4095:530
};
static_assert(sizeof(IdentifyController) == 4096, "Base §5.17.2.1: 4096 bytes");
static_assert(offsetof(IdentifyController, mdts) == 77, "Figure 275: MDTS at byte 77");
static_assert(offsetof(IdentifyController, rtd3e) == 88, "Figure 275: RTD3E at byte 88");
static_assert(offsetof(IdentifyController, elpe) == 262, "Figure 275: ELPE at byte 262");
static_assert(offsetof(IdentifyController, sqes) == 512, "Figure 275: SQES at byte 512");
static_assert(offsetof(IdentifyController, nn) == 516, "Figure 275: NN at byte 516");
static_assert(offsetof(IdentifyController, oncs) == 520, "Figure 275: ONCS at byte 520");
static_assert(offsetof(IdentifyController, vwc) == 525, "Figure 275: VWC at byte 525");
static_assert(offsetof(IdentifyController, awupf) == 528, "Figure 275: AWUPF at byte 528");

namespace oncs {
inline constexpr uint16_t kDatasetManagement = 1u << 2;
inline constexpr uint16_t kWriteZeroes = 1u << 3;
}  // namespace oncs

// LBA Format (NVM §4.1.5.1, Figure 98): MS 15:0, LBADS 23:16 (log2 bytes), RP 25:24.
struct LbaFormat {
  uint16_t ms;
  uint8_t lbads;
  uint8_t rp;
};
static_assert(sizeof(LbaFormat) == 4, "NVM Figure 98: 4 bytes");

// Identify Namespace data structure (NVM §4.1.5.1, Figure 97).
struct IdentifyNamespace {
  uint64_t nsze;          // 7:0 size in logical blocks
  uint64_t ncap;          // 15:8
  uint64_t nuse;          // 23:16
  uint8_t nsfeat;         // 24: bit 1 NSABP (NAWUN/NAWUPF/... valid)
  uint8_t nlbaf;          // 25: number of LBA formats, 0's based
  uint8_t flbas;          // 26: 3:0 index of the format in use
  uint8_t mc;             // 27
  uint8_t dpc;            // 28
  uint8_t dps;            // 29
  uint8_t nmic;           // 30
  uint8_t rescap;         // 31
  uint8_t fpi;            // 32
  uint8_t dlfeat;         // 33: 2:0 = 001b deallocated blocks read as zeroes
  uint16_t nawun;         // 35:34
  uint16_t nawupf;        // 37:36: namespace atomic write unit power fail, 0's based
  uint16_t nacwu;         // 39:38
  uint16_t nabsn;         // 41:40
  uint16_t nabo;          // 43:42
  uint16_t nabspf;        // 45:44: atomic boundary size power fail, 0's based
  uint16_t noiob;         // 47:46
  uint8_t nvmcap[16];     // 63:48
  uint8_t rsvd64[64];     // 127:64
  LbaFormat lbaf[16];     // 191:128
  uint8_t rsvd192[3904];  // 4095:192
};
static_assert(sizeof(IdentifyNamespace) == 4096, "NVM §4.1.5.1: 4096 bytes");
static_assert(offsetof(IdentifyNamespace, nsfeat) == 24, "Figure 97: NSFEAT at byte 24");
static_assert(offsetof(IdentifyNamespace, dlfeat) == 33, "Figure 97: DLFEAT at byte 33");
static_assert(offsetof(IdentifyNamespace, nawupf) == 36, "Figure 97: NAWUPF at byte 36");
static_assert(offsetof(IdentifyNamespace, nabspf) == 44, "Figure 97: NABSPF at byte 44");
static_assert(offsetof(IdentifyNamespace, lbaf) == 128, "Figure 97: LBAF0 at byte 128");

// Error Information log entry (Base §5.16.1.2, Figure 205).
struct ErrorLogEntry {
  uint64_t error_count;     // 7:0, unique and increasing; 0 = entry unused
  uint16_t sqid;            // 9:8
  uint16_t cid;             // 11:10
  uint16_t status;          // 13:12: bit 0 phase tag, 15:1 status field
  uint16_t param_location;  // 15:14
  uint64_t lba;             // 23:16
  uint32_t nsid;            // 27:24
  uint8_t vs;               // 28
  uint8_t trtype;           // 29
  uint8_t rsvd30[2];
  uint64_t csi;          // 39:32
  uint16_t trtype_info;  // 41:40
  uint8_t rsvd42[22];
};
static_assert(sizeof(ErrorLogEntry) == 64, "Base Figure 205: 64 bytes");
static_assert(offsetof(ErrorLogEntry, lba) == 16, "Figure 205: LBA at byte 16");

// SMART / Health Information log (Base §5.16.1.3, Figure 207). 128-bit counters are
// little-endian byte arrays.
struct SmartLog {
  uint8_t critical_warning;        // 0
  uint16_t temperature;            // 2:1, Kelvin
  uint8_t available_spare;         // 3
  uint8_t spare_threshold;         // 4
  uint8_t percentage_used;         // 5
  uint8_t eg_critical;             // 6
  uint8_t rsvd7[25];               // 31:7
  uint8_t data_units_read[16];     // 47:32, thousands of 512-byte units
  uint8_t data_units_written[16];  // 63:48
  uint8_t host_reads[16];          // 79:64
  uint8_t host_writes[16];         // 95:80
  uint8_t busy_time[16];           // 111:96
  uint8_t power_cycles[16];        // 127:112
  uint8_t power_on_hours[16];      // 143:128
  uint8_t unsafe_shutdowns[16];    // 159:144
  uint8_t media_errors[16];        // 175:160
  uint8_t error_log_entries[16];   // 191:176
  uint8_t rsvd192[320];
} __attribute__((packed));
static_assert(sizeof(SmartLog) == 512, "Base §5.16.1.3: 512 bytes");
static_assert(offsetof(SmartLog, data_units_read) == 32, "Figure 207: byte 32");
static_assert(offsetof(SmartLog, unsafe_shutdowns) == 144, "Figure 207: byte 144");
static_assert(offsetof(SmartLog, error_log_entries) == 176, "Figure 207: byte 176");

inline constexpr uint32_t kAdminQueueMaxEntries = 4096;  // Base §3.1.4.8: AQA.ASQS ≤ 4095
inline constexpr uint32_t kIoQueueMaxEntries = 65536;    // Base §4.1.3 (CAP.MQES 0's based)

}  // namespace warpfs::nvme
