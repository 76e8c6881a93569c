// RAID 0, 1 and 10 across member block devices (docs/ARCHITECTURE.md "Several namespaces",
// fs/FORMAT.md "RAID member label"): the filesystem sees one BlockDevice, each member keeps
// its own controller, queues and cache below it.
//
//   RaidLabel     the label in block 0 of every member: encode, decode (CRC-32C), checks
//   RaidMap       logical block -> (group, row) -> member blocks; pure arithmetic
//   check_raid_set  assembly: same set, order, identities, none missing; names the culprit
//   RaidBlockDevice the device: parts in parallel, mirrors, failover, degraded labels
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "warpfs/blockdev/block_device.h"

namespace warpfs::blockdev {

// One member's identity as the label records it.
struct RaidIdentity {
  enum Kind : uint32_t { kNone = 0, kNguid = 1, kEui64 = 2, kGenerated = 3 };
  uint32_t kind = kNone;
  uint64_t blocks = 0;  // the member's size in blocks at mkfs
  uint8_t id[16] = {};
  std::string name;  // the DEVICE string at mkfs (messages only; up to 95 bytes kept)
  bool same_id(const RaidIdentity& o) const;
  std::string id_text() const;  // "NGUID 0011..." / "EUI64 ..." / "id ..."
};

struct RaidLabel {
  static constexpr uint64_t kMagic = 0x4449415250524157ull;  // "WARPRAID"
  static constexpr uint32_t kVersion = 1;
  static constexpr uint32_t kMaxMembers = 16;
  static constexpr uint64_t kDataOffset = 256;          // member blocks 0..255: label, then zero
  static constexpr uint32_t kDefaultStripeBlocks = 32;  // 128 KiB (FORMAT.md argues it)
  static constexpr uint32_t kDegraded = 1;              // flags bit 0
  uint32_t level = 0;                                   // 0, 1 or 10
  uint8_t set_uuid[16] = {};
  uint32_t stripe_blocks = kDefaultStripeBlocks;
  uint32_t member_count = 0;
  uint32_t position = 0;
  uint32_t flags = 0;
  uint64_t data_offset = kDataOffset;
  uint64_t member_blocks = 0;
  uint64_t generation = 1;
  uint32_t failed = 0;  // bit k: member k failed
  uint32_t block_size = 4096;
  RaidIdentity members[kMaxMembers];

  // Into one 4096-byte block (zero-filled, CRC set).
  void encode(void* block) const;
  // From one 4096-byte block: false, with why, if it is no label or a damaged one.
  static bool decode(const void* block, RaidLabel* out, std::string* why);
  // Sets the CRC of an encoded label in place (tools and fuzzers that patch a label).
  static void seal(void* block);
  // Whether the block starts with the label's magic (damaged or not).
  static bool has_magic(const void* block);
  // Level, member count, stripe and geometry are consistent: "" or what is wrong.
  std::string invalid() const;
  std::string uuid_text() const;
};

// For a device opened alone whose block 0 is `block0`: "" when that is no member label, else
// a sentence naming the set and how to open it whole (for "not a filesystem" messages).
std::string raid_member_hint(const void* block0);

// Copies per group: 1 for RAID 0, every member for RAID 1, 2 for RAID 10.
uint32_t raid_copies(uint32_t level, uint32_t members);
// "" if `level` over `members` devices is a set we build, else why not.
std::string raid_level_problem(uint32_t level, uint32_t members);

// The stripe map (fs/FORMAT.md): immutable, so any number of threads may use one.
struct RaidMap {
  uint32_t stripe = RaidLabel::kDefaultStripeBlocks;
  uint32_t members = 2;
  uint32_t copies = 1;
  uint64_t data_offset = RaidLabel::kDataOffset;
  uint64_t member_blocks = 0;  // a multiple of stripe

  static RaidMap of(const RaidLabel& l);
  uint32_t groups() const { return members / copies; }
  uint64_t block_count() const { return groups() * member_blocks; }
  // A maximal run of logical blocks from `block` (at most `count`) on one group's
  // consecutive rows.
  struct Piece {
    uint32_t group = 0;
    uint64_t row = 0;  // member block = data_offset + row
    uint32_t count = 0;
  };
  Piece piece(uint64_t block, uint64_t count) const;
  // Rows of `group` that logical blocks [0, x) cover: [rows_below(g, b), rows_below(g, e))
  // are the group's rows of logical [b, e), one contiguous run.
  uint64_t rows_below(uint32_t group, uint64_t x) const;
  // The member of `group`'s copy `c`.
  uint32_t member(uint32_t group, uint32_t c) const { return group * copies + c; }
};

// A device as assembly sees it: what was given, its label (if it has one) and its identity.
struct RaidMemberSeen {
  std::string name;
  bool has_label = false;
  RaidLabel label;
  std::string label_problem;  // why no label was decoded (no magic, bad CRC, ...)
  RaidIdentity identity;      // kind kNone when the device reports no NGUID/EUI64
};

// Checks that `seen` (in the order given) is one whole set in its order. Returns the newest
// label (highest generation: its failed set is the set's) through `newest`; false with a
// message naming the device and the problem.
bool check_raid_set(const std::vector<RaidMemberSeen>& seen, RaidLabel* newest, std::string* error);

// Writes `l` (position set per member) to block 0 of each of `members`, in position order,
// after zeroing blocks 1..data_offset-1, and flushes each: a new set's labels. The message
// names the position that failed.
Status write_member_labels(const std::vector<BlockDevice*>& members, RaidLabel l,
                           std::string* error);

// What resync_raid_set did.
struct RaidResyncReport {
  uint32_t rebuilt = 0;  // bit k: member k was rebuilt (0: the set was not degraded)
  uint64_t blocks_copied = 0;
  uint64_t generation = 0;  // the set's label generation afterwards
};

// Rebuilds members of a mirrored set offline (fs/FORMAT.md "Resync"): `members` are the
// set's devices in position order, each either a member (its label read from block 0) or, in
// a position, a blank device (no label: no RAID magic in block 0) that replaces it. The
// targets are the members the newest label marks failed and the blank devices. From every
// group's surviving copy each target gets every data row, then a label that names it (a
// blank's identity from `seen`, whose names and identities the caller filled in) with its
// failed bit clear. Order, so that a cut leaves a set that opens degraded as before: the
// survivors' labels (generation + 1, the targets failed, a blank's identity recorded), the
// targets' label areas, the data, a flush of the targets, then the final labels (generation
// + 1, not failed) on the targets and then on the survivors. `progress` (may be empty)
// hears (blocks done, blocks total). Refuses, naming the device or position: RAID 0, a
// device of another set, a damaged label, a wrong order or count, a blank in a position
// whose group has no other copy, a target smaller than the set's members. Without
// `replace`, also: a blank whose block 0 is not all zero (another filesystem, a typo in the
// list: it would be overwritten), and a blank in the place of a member the newest label among
// the devices given does not mark failed (that member's own device may hold newer data than
// the labels given know of: a rebuild from them would roll the set back).
// REQUIRES: nothing else uses the members meanwhile (an offline tool).
Status resync_raid_set(const std::vector<BlockDevice*>& members, std::vector<RaidMemberSeen> seen,
                       const std::function<void(uint64_t, uint64_t)>& progress,
                       RaidResyncReport* report, std::string* error, bool replace = false);

// A few threads that run the parts of requests spanning several members. run() takes the
// caller's parts back from the queue when no thread has started them, so it never waits on
// a busy pool. Thread-safety: run() from any number of threads; q_ under mu_.
class PartPool {
 public:
  explicit PartPool(int threads);
  ~PartPool();
  // Runs fns[0..n): fns[0] on the caller; returns when all have run.
  void run(const std::function<void()>* fns, int n);

 private:
  struct Join {
    std::mutex m;
    std::condition_variable cv;
    int left = 0;  // under m
  };
  struct Task {
    const std::function<void()>* fn;
    Join* join;
  };
  void worker();
  static void done(Join* j);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task*> q_;  // under mu_
  bool stop_ = false;    // under mu_
  std::vector<std::thread> threads_;
};

class RaidBlockDevice final : public BlockDevice {
 public:
  struct Stats {
    uint32_t level = 0, members = 0, stripe_blocks = 0;
    uint32_t failed = 0;  // bit k: member k failed
    uint64_t generation = 0;
    uint64_t read_failovers = 0;  // reads a mirror served after a member's error
    uint64_t split_requests = 0;  // submit() calls whose parts went to several members
  };
  // Over `members` in position order (not owned; they outlive the device), each with the
  // label at block 0 and data from data_offset; `label` is the set's newest label (any
  // position). `log` (may be empty) hears of failed members.
  // assemble() first reads every member's label into `seen` (whose names and identities the
  // caller filled in) and checks the set (check_raid_set); it says when the set is degraded.
  static std::unique_ptr<RaidBlockDevice> create(std::vector<BlockDevice*> members,
                                                 const RaidLabel& label,
                                                 std::function<void(const std::string&)> log,
                                                 std::string* error);
  static std::unique_ptr<RaidBlockDevice> assemble(const std::vector<BlockDevice*>& members,
                                                   std::vector<RaidMemberSeen> seen,
                                                   std::function<void(const std::string&)> log,
                                                   std::string* error);
  ~RaidBlockDevice() override;
  uint32_t block_bytes() const override { return bb_; }
  uint64_t block_count() const override { return map_.block_count(); }
  Status read(uint64_t block, uint32_t count, void* buf) override;
  // As read(), each piece through its member's read_uncached (their caches take no line),
  // with the same choice of copy and the same failover.
  Status read_uncached(uint64_t block, uint32_t count, void* buf) override;
  // read_uncached() left in flight where the range lies on one member's copy (one piece: a
  // 4 KiB read always does), through that member's read_uncached_start, the copy chosen as
  // read_uncached() chooses it; a range over several members is read at once. A member
  // other than the first reads into memory of its own (the set's buffers are the first
  // member's, which another member's driver would bounce and read at once), copied over when
  // the read ends. A mirrored piece whose read fails is started again on another live copy
  // by the thread that polls it, as read_uncached() fails over.
  Status read_uncached_start(uint64_t block, uint32_t count, void* buf,
                             std::unique_ptr<PendingRead>* pending) override;
  Status write(uint64_t block, uint32_t count, const void* buf) override;
  Status flush() override { return flush_members(false); }
  Status write_back(const Range* ranges, size_t n) override;
  Status flush_device() override { return flush_members(true); }
  Status trim(uint64_t block, uint64_t count) override;
  void submit(Io* ios, int n) override;
  // Member 0's memory: it moves without a copy there, and is bounced by the others.
  Status alloc_io_buffer(size_t bytes, void** out) override {
    return m_[0]->alloc_io_buffer(bytes, out);
  }
  void free_io_buffer(void* p, size_t bytes) override { m_[0]->free_io_buffer(p, bytes); }
  // Copy c of a block is the c-th member of its stripe group (fsck compares them).
  uint32_t copies() const override { return map_.copies; }
  uint64_t copy_run(uint64_t block, uint64_t count) const override {
    return map_.piece(block, count).count;
  }
  std::string copy_holder(uint64_t block, uint32_t c) const override;
  Status read_copy(uint64_t block, uint32_t count, uint32_t c, void* buf) override;
  Status write_copy(uint64_t block, uint32_t count, uint32_t c, const void* buf) override;
  const RaidMap& map() const { return map_; }
  bool member_failed(uint32_t k) const { return (failed_.load() >> k) & 1; }
  Stats stats() const;

 private:
  // Per member: a count of the writes (write-backs, trims) that completed, and the count
  // read at the start of the last successful flush() / flush() or flush_device(): a flush
  // may skip the member when nothing completed since. Atomics, padded.
  struct alignas(64) MemberState {
    std::atomic<uint64_t> written{1};  // 1: the first flush always reaches the member
    std::atomic<uint64_t> flushed{0}, flushed_device{0};
  };
  RaidBlockDevice(std::vector<BlockDevice*> m, const RaidLabel& l, const RaidMap& map,
                  std::function<void(const std::string&)> log);
  // Runs one function per member that has work (work[k] non-empty), in parallel.
  void for_members(const std::vector<std::function<void()>>& work);
  // Marks the members in `mask` failed: persists the survivors' labels first. Not ok when
  // that fails everywhere or a group would be left with no live copy.
  Status fail_members(uint32_t mask, const std::string& why);
  // After a whole-device operation (flush, write-back, trim) failed on the `bad` members:
  // ok when they could be failed (mirrors: every group keeps a live copy), else `first`.
  Status settle(uint32_t bad, const Status& first, const char* what);
  class PendingPiece;
  // One try at a piece's read on one member (read_uncached_start): in flight while `part`
  // is set; `bounce`: the member's own buffer it reads into, if any (Bounces).
  struct Attempt {
    std::unique_ptr<PendingRead> part;
    void* bounce = nullptr;
    Status status;
  };
  Attempt start_on(uint32_t k, const RaidMap::Piece& piece, uint8_t* data);
  // The attempt has ended (its part polled to the end, or none): its status; the bounce's
  // data copied into `data` if it succeeded, and the bounce given back.
  Status end_attempt(uint32_t k, Attempt* a, uint8_t* data, uint32_t count);
  // Buffers of a member's own I/O memory for reads left in flight on it, a stripe each: up
  // to kBounces a member, made as reads need them and kept until the set goes. None free
  // and no more to make: that read is done at once. Each member's under its mutex.
  struct Bounces {
    std::mutex mu;
    std::vector<void*> free;  // under mu
    uint32_t made = 0;        // under mu
  };
  static constexpr uint32_t kBounces = 32;
  size_t bounce_bytes() const { return size_t{map_.stripe} * bb_; }
  void* take_bounce(uint32_t k);
  void give_bounce(uint32_t k, void* p);
  // submit(); `uncached`: every transfer a read, through the members' read_uncached.
  void run(Io* ios, int n, bool uncached);
  // The member of the first live copy of `piece` at or after the j-th (*j moves to it), in
  // the order a read tries them: from the copy the stripe's index picks, so that a
  // sequential read spreads over the copies. map_.members when no live copy is left.
  uint32_t next_live_copy(const RaidMap::Piece& piece, uint32_t* j) const;
  Status flush_members(bool device_only);
  bool live(uint32_t k) const { return !((failed_.load(std::memory_order_acquire) >> k) & 1); }
  std::string member_name(uint32_t k) const;

  std::vector<BlockDevice*> m_;  // immutable after create
  const RaidMap map_;
  const uint32_t bb_;
  std::unique_ptr<MemberState[]> st_;
  std::atomic<uint32_t> failed_{0};  // published after the labels say so (release)
  std::atomic<uint64_t> read_failovers_{0}, split_requests_{0};
  std::mutex label_mu_;  // a leaf: label rewrites, one at a time
  RaidLabel label_;      // under label_mu_ (generation read by stats() under it too)
  std::function<void(const std::string&)> log_;
  std::unique_ptr<PartPool> pool_;
  std::unique_ptr<Bounces[]> bounces_;  // one per member
};

}  // namespace warpfs::blockdev
