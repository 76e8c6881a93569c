// The emulated NVMe controller: an in-process device model behind the Transport interface.
//
// It is reached only as a real controller is: through its register file (BAR0) and through
// DMA memory addressed by bus addresses (IOVAs). Worker threads fetch commands from
// submission queues when doorbells ring, move data through PRP lists, and post completions
// with phase tags, out of submission order when a latency model with jitter is configured.
// Idle workers park on a futex, so an idle controller uses no CPU.
//
// Persistence: a BackingStore (an image file or RAM) sits behind a volatile write cache of
// atomic-write-unit (4 KiB) chunks. Flush, FUA and a normal shutdown (CC.SHN) make data
// durable; power_cut() discards whatever is still volatile, persisting a random subset of
// cached chunks first so that writes can be torn at 4 KiB boundaries but never inside one.
// With EmulatedConfig::cache_in_store the store's own cache (an image file's page cache)
// plays the volatile write cache instead, and the model's is not used.
//
// Thread-safety: every Transport method may be called from any thread. The test hooks
// (pause, power_cut, counters) are also thread-safe unless noted.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "warpfs/nvme/transport.h"

namespace warpfs::nvme {

// Where the namespace data lives when the controller is powered off.
class BackingStore {
 public:
  virtual ~BackingStore() = default;
  virtual uint64_t bytes() const = 0;
  virtual Status read(uint64_t offset, void* buf, size_t len) = 0;
  virtual Status write(uint64_t offset, const void* buf, size_t len) = 0;
  // Deallocate: the range reads back as zeroes afterwards.
  virtual Status punch(uint64_t offset, size_t len) = 0;
  virtual Status sync() = 0;

  // An image file. With create_bytes > 0 a missing file is created with that size (mode
  // 0600, never through a symlink); an existing file keeps its size. The file is locked for
  // the store's life (lock_image). `error` receives a message naming the path on failure;
  // "PATH: " + kImageBusy when another process holds the lock, then ": held by pid N (COMM)"
  // where /proc shows who (image_holders).
  // read_only: opened for reading under a read lock (fsck.warpfs without -y): several such
  // users may share the image, none beside a writer; writes then fail.
  static std::shared_ptr<BackingStore> open_file(const std::string& path, uint64_t create_bytes,
                                                 std::string* error, bool read_only = false);
  static const char* const kImageBusy;
  // The image lock: an open-file-description write lock on the whole file (F_OFD_SETLK), which
  // needs a descriptor open for writing and goes with its last close; a read lock (write =
  // false) for a reader, which needs one open for reading. False if a conflicting one is held.
  static bool lock_image(int fd, bool write = true);
  // "pid N (COMM)[, ...]": the processes holding an image lock on fd's file, found through
  // /proc/*/fdinfo (root sees every process; others their own); "" if none is found.
  static std::string image_holders(int fd);
  // Zero-filled memory; survives the controller as long as someone holds the pointer, which
  // is how tests power a new controller up on the same "media" after a cut.
  static std::shared_ptr<BackingStore> ram(uint64_t bytes);
};

struct NamespaceConfig {
  uint32_t lba_bytes = 512;  // 512 or 4096
  uint64_t lba_count = 0;    // 0: the rest of the backing store
};

struct EmulatedConfig {
  std::vector<NamespaceConfig> namespaces{NamespaceConfig{}};
  uint32_t max_queue_entries = 4096;  // CAP.MQES + 1
  uint16_t max_io_queues = 64;        // granted by Number of Queues
  uint16_t interrupt_vectors = 65;    // MSI-X vectors: admin + one per I/O CQ by default
  uint8_t mdts = 8;                   // max transfer 2^MDTS pages: 1 MiB with 4 KiB pages
  uint8_t doorbell_stride = 0;        // CAP.DSTRD
  bool wrr = true;                    // CAP.AMS: weighted round robin with urgent class
  uint32_t latency_ns = 0;            // completion posted this long after the fetch
  uint32_t latency_jitter_ns = 0;     // plus uniform 0..jitter: completions reorder
  // The media's bandwidth in bytes per second (0: unlimited). One channel per controller:
  // each Read and Write occupies it for its bytes / bandwidth, in the order they are
  // fetched, and completes latency_ns after its transfer ends. No CPU is spent waiting, so
  // devices that share few cores each still show their own bandwidth (benchmarks of sets).
  uint64_t bandwidth_bytes_per_s = 0;
  bool shuffle_completions = false;  // post each batch of completions in random order
  bool volatile_write_cache = true;  // Identify VWC; Flush and FUA honour it
  uint64_t write_cache_bytes = 64ull << 20;
  // Where written data waits until a Flush. false: the model's own cache of 4 KiB units
  // (write_cache_bytes), which power_cut() loses at random: for tests that cut power. true:
  // the store's (for an image file, the kernel's page cache): each write reaches the store
  // at once, in one copy instead of two (into the model's cache, then out of it), with no
  // device-wide lock around media access, and a Flush syncs the store. power_cut() then
  // loses nothing, and a process killed before its Flush leaves what it wrote in the image,
  // as a real drive keeps what it has received when its driver dies. The daemon uses this.
  bool cache_in_store = false;
  unsigned worker_threads = 1;
  uint64_t idle_spin_ns = 50'000;  // poll this long after the last command, then park
  // Run commands in the thread that rings the SQ (or CQ) doorbell when no worker is at it,
  // posting their completions before the ring returns; the worker threads then only post
  // timed completions (latency_ns) and what a busy ringer left. Saves two thread hand-offs
  // per command where cores are few. Same queues, commands and completions either way.
  bool inline_io = false;
  bool read_only = false;  // the image file: BackingStore::open_file's read_only
  uint64_t seed = 1;       // latency jitter, shuffling, power-cut persistence
  std::string serial = "WARPFS-EMU-0001";
  // Tests only: called by a worker thread in park() after it has planned its sleep
  // (`wake_at`: when it means to wake for a completion it holds, 0 for none) and before it
  // announces itself parked, so a test can ring a doorbell inside that window.
  std::function<void(uint64_t wake_at)> park_window_hook;
};

struct EmulatedCounters {
  uint64_t admin_commands = 0;
  uint64_t io_commands = 0;
  uint64_t reads = 0;
  uint64_t writes = 0;
  uint64_t flushes = 0;
  uint64_t errors = 0;
  uint64_t doorbell_kicks = 0;  // futex wake-ups of parked workers
  uint32_t parked_workers = 0;  // workers asleep on their futex right now
  uint64_t transfer_ns = 0;     // bandwidth_bytes_per_s: channel time the transfers took
  // Host time the worker threads spent in arbitration rounds that found work (fetching,
  // executing, posting): the device model's cost, without its idle polling. Rounds run
  // inline by a doorbell ringer (inline_io) are not counted.
  uint64_t busy_ns = 0;
};

// Device faults the emulated controller can inject : what a worn or failing drive
// does to the commands that touch the affected blocks.
enum class FaultKind : uint8_t {
  kReadError,   // reads fail: Media Errors / Unrecovered Read Error (NVM §4.1.2.3)
  kWriteFault,  // writes (and Write Zeroes) fail: Media Errors / Write Fault
  // Reads, writes and Write Zeroes are fetched and never completed: a hung command, which
  // only the host's timeout and a controller reset get out of.
  kNoCompletion,
};
struct Fault {
  FaultKind kind = FaultKind::kReadError;
  uint32_t nsid = 1;
  uint64_t slba = 0;            // the first affected LBA of the namespace
  uint64_t nlb = 1;             // how many
  uint32_t times = UINT32_MAX;  // fail this many commands, then heal (UINT32_MAX: for good)
};

class EmulatedController;

class EmulatedTransport final : public Transport {
 public:
  // The store must hold every configured namespace. `error` receives a message on failure.
  static std::unique_ptr<EmulatedTransport> create(const EmulatedConfig& config,
                                                   std::shared_ptr<BackingStore> store,
                                                   std::string* error);
  ~EmulatedTransport() override;
  EmulatedTransport(const EmulatedTransport&) = delete;
  EmulatedTransport& operator=(const EmulatedTransport&) = delete;

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

  // --- test hooks -----------------------------------------------------------------------
  // While paused, workers fetch nothing (doorbells still latch), so a test can queue work on
  // several SQs and observe arbitration, or fill a queue.
  void pause(bool paused);
  EmulatedCounters counters() const;
  // Records the SQ id of every fetched I/O command, in fetch order, while enabled.
  void trace_fetches(bool enable);
  std::vector<uint16_t> fetch_trace() const;
  // Stops the device at once: in-flight commands never complete; each volatile cached chunk
  // reaches the media with probability `persist_probability`, the rest is lost. Every later
  // register read returns all ones, as a device that fell off the bus. Not thread-safe with
  // respect to commands being submitted (it is the power going out).
  void power_cut(double persist_probability);
  const EmulatedConfig& config() const;

  // --- fault injection (thread-safe; takes effect for commands fetched afterwards) ---------
  void inject(const Fault& f);
  void clear_faults();
  // A full namespace: every write fails with Capacity Exceeded (Base §4.6.1.2.1, SC 81h)
  // while set, as a thin-provisioned or zoned device does when it runs out of space.
  void set_capacity_exceeded(bool full);
  // Controller Fatal Status (Base §3.1.4.6): CSTS.CFS is set and the controller fetches and
  // completes nothing more (commands in flight are lost) until the host resets it
  // (CC.EN = 0). `persistent`: every later enable fails with CFS again, a controller that
  // is broken for good.
  void inject_fatal(bool persistent);
  // Commands failed or swallowed by inject(), set_capacity_exceeded(), and fatal statuses
  // raised by inject_fatal().
  uint64_t faults_hit() const;

 private:
  explicit EmulatedTransport(std::unique_ptr<EmulatedController> c);
  std::unique_ptr<EmulatedController> c_;
};

}  // namespace warpfs::nvme
