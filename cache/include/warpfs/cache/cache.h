// The warp-coalesced set-associative software cache (GPU4FS thesis §4.2 over BaM Ch. 6-7).
//
// Layout (thesis Fig 4.6): N sets × K ways; line data is one contiguous array of N·K lines
// in backend memory (DMA memory, so fills and write-backs need no copy) and line metadata is
// one contiguous array of N·K entries, each alone on its cache line (the thesis blamed
// unpadded atomics for its tails, §6.4). A block lives in set
// (block ^ (block >> log2 N)) mod N: neighbouring blocks land in neighbouring sets (thesis
// §4.2.3) and power-of-two strides still spread.
//
// The state word (BaM Table 6.1, thesis Table 4.1): Valid, Busy, Dirty bits and a 29-bit
// reference count. Hits are one fetch_add (acquire) and releases one fetch_sub (release): no
// CAS loops on the hit path.
//   hit:     s = fetch_add(count); V && !B && tag == block  -> hit;  otherwise undo.
//   busy:    B set with our tag: a fill (or an eviction) is in progress. Keep the reference,
//            wait for B to clear, then re-check V and the tag ("locked hit", thesis §6.3).
//   miss:    take the set's fair ticket lock (FIFO, so no thread starves: the thesis's
//            unfair set spinlocks gave 100 ms "locked hits"), probe again, pick a victim by
//            clock, claim it with fetch_or(B) and re-check that its count was 0 and B clear
//            (BaM Fig 6.5: a lane that raced in backs us off), write it back if Dirty, retag
//            it, add our count, unlock, fill. fetch_xor(B|V) publishes the line (BaM §6.4).
//   copy:    lanes copy into and out of their lines through copy_in() and copy_out(), a
//            reader/writer lock of the line's bytes in its flags word held for the copy's
//            length. A flusher sets kWriting and waits for a writer's copy to end before the
//            device reads the line; a writer that finds kWriting waits until the device has
//            read it. So a write-back (stable lines: the kernel's stable pages, which it
//            keeps for devices that checksum their blocks) and a reader get each line whole,
//            old or new, never torn; two writers of one line come one after the other.
//   release: fetch_or(D) if the lane wrote (Dirty is set when the write is done, not at
//            acquire, so a flush that clears D after a writer's copy and before its release
//            cannot lose the writer's data: the release sets D again), then fetch_sub(count).
// Invariants: at most one copy of a block (retagging happens under the set lock, and every
// inserter re-probes under it); a line with references or Busy is never evicted (the claim's
// fetch_or sees them); concurrent misses on one block cause one device read (the first
// inserter retags under the lock; the others find the tag and wait on B).
//
// Full sets. When every way of a set is referenced or busy, acquire() does not wait (a warp
// holding references to lines of that set would wait on itself: BaM's array_ref deadlock,
// §7.2.2). The lane fails with Code::kSetFull ("set full") and the caller bypasses the cache
// for that block (blockdev's CachedBlockDevice does so, going straight to the device).
//
// Writes of whole lines (Intent::kWriteFull) never read the old data (BaM's open issue): the
// lane brings the new contents, which are copied into the line before it is published.
//
// No waiting while holding an unfilled line. acquire() works in rounds: every lane either
// hits, reserves a line (claimed Busy, to be filled), or finds its block Busy elsewhere; the
// round's fills are issued and published; only then does it wait on the Busy lines of others.
// A thread that waits therefore never holds a line someone else waits for, so warps cannot
// wait on each other in a cycle.
//
// Thread-safety: acquire/release/flush/read-ahead may be called from any number of threads.
// The warp arrays passed to acquire/release belong to the calling thread. The read-ahead and
// background write-back threads are two more of those callers (they take the same set locks
// and line pins as flush_range).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "warpfs/cache/backend.h"
#include "warpfs/nvme/port.h"

namespace warpfs::cache {

namespace port = warpfs::port;

enum class Intent : uint8_t {
  kNone = 0,  // inactive lane
  kRead = 1,
  kWrite = 2,      // read-modify-write: the line is filled first
  kWriteFull = 3,  // the lane overwrites the whole line: no fill read
};

struct Lane {
  uint64_t block = 0;
  Intent intent = Intent::kNone;
  const void* src = nullptr;  // kWriteFull: the line's new contents (line_bytes bytes)
  // The class of the device I/O this lane causes (its fill, a victim's write-back); lanes
  // that coalesce take the most urgent of theirs.
  nvme::Priority priority = nvme::Priority::kBulk;
};

// What a lane gets back. Only the group's leader holds the references (count of them).
struct LineRef {
  static constexpr uint32_t kNoLine = ~0u;
  uint8_t* data = nullptr;
  uint32_t line = kNoLine;
  uint16_t count = 0;  // references held by this lane (the leader's group size, else 0)
  // kWriteFull: the line already holds the group's `src` (a miss published it with the new
  // contents), so the lane need not copy it again. The group's src is its last writer's.
  bool holds_src = false;
  Status status;
};

struct CacheOptions {
  uint32_t sets = 1024;  // a power of two
  uint32_t ways = 8;
  // Window fetched ahead of a sequential stream (note_read). 0, the default: off, and no
  // read-ahead thread (the filesystem does not drive it: the kernel's page cache reads ahead
  // of buffered readers, and reads of bypass_lines or more skip the cache).
  uint32_t readahead_lines = 0;
  uint32_t bypass_lines = 32;    // transfers of at least this many lines skip the cache
  bool readahead_thread = true;  // fetch the window in the background
  // Background write-back, the kernel's dirty_background_ratio: once more than this share
  // of the lines (percent) is dirty, a thread writes dirty lines back, a set at a time, until
  // half that share is left, and an eviction takes a clean line of its set over a dirty one
  // where it can. A miss then rarely waits for a victim's write-back (a device round trip
  // under the set lock). 0, the default: no thread; a dirty victim is written back by the
  // evicting lane, and lines are written back by flush_range, write_back and flush_all.
  uint32_t writeback_percent = 0;
  // With the background write-back on: a miss that must write its dirty victim back sends
  // the set's other dirty lines that nobody holds in the same batch, so that the one device
  // round trip it waits for cleans the set for the next misses. For devices whose commands
  // take tens of microseconds (4 KiB random overwrites at QD32 with 80 µs of emulated
  // latency, 2 cores: 1.05-1.17x per round); where commands complete at once the batch only holds
  // the set's lock longer (0.92x there at zero latency), so the device stack sets it for those that
  // are not prompt.
  bool evict_with_set = false;
};

struct CacheStats {
  uint64_t hits = 0, misses = 0, locked_hits = 0, evictions = 0, writebacks = 0;
  uint64_t coalesced_lanes = 0, readahead_lines = 0, readahead_hits = 0, bypassed_bytes = 0;
  uint64_t set_full = 0, fill_errors = 0;
  uint64_t cleaned = 0;         // of the writebacks, those of the background write-back
  uint64_t direct_dropped = 0;  // clean lines a direct write replaced whole and dropped
  uint64_t dirty_lines = 0;     // dirty now (a momentary figure)
};

// Per-stream read-ahead state (one per open file, say). Not thread-safe: one user at a time.
struct ReadStream {
  uint64_t next = ~0ull;     // the block a sequential continuation would read
  uint64_t run = 0;          // lines read sequentially so far
  uint64_t ahead_until = 0;  // read-ahead already requested up to here
  bool readahead = true;     // fadvise(RANDOM) turns it off
};

class Cache {
 public:
  static constexpr int kWarp = 32;

  static std::unique_ptr<Cache> create(Backend& backend, const CacheOptions& o, std::string* error);
  // REQUIRES: no references held. Does not write dirty lines back: call flush_all() first.
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  uint32_t line_bytes() const { return line_bytes_; }
  uint64_t lines() const { return uint64_t{nsets_} * ways_; }
  Backend& backend() { return b_; }

  // The warp API. Lanes on the same block coalesce: the first lane of a group (the leader)
  // takes `count` references for the group and every lane gets the pointer; intents are
  // OR-ed. The group's misses are filled together (one IoBatch). Returns the number of
  // lanes that failed (their status says why; Code::kSetFull means "set full").
  int acquire(const Lane* lanes, int n, LineRef* out);
  // Copies `len` bytes from `src` into the line `r` holds (acquire() with a write intent)
  // at `offset`, and out of it into `dst`. Every copy into or out of a line goes through
  // these (r.data is the line's address, for a caller that knows no one else is at the line):
  // a line's copies in exclude each other, its copies out and its write-back, so a
  // write-back or a reader of a line another thread writes gets it whole, old or new, never
  // torn. A copy in waits while a write-back of the line is in flight (a device round trip);
  // otherwise the waits are for other copies, which hold no lock and wait for none.
  void copy_in(const LineRef& r, uint32_t offset, const void* src, uint32_t len) {
    copy_in(r.line, offset, src, len);
  }
  void copy_out(const LineRef& r, uint32_t offset, void* dst, uint32_t len) {
    copy_out(r.line, offset, dst, len);
  }
  // Releases what acquire() handed out. `wrote[i]` (may be null: none wrote) marks lanes
  // that modified their line; their lines become dirty.
  void release(const Lane* lanes, int n, LineRef* refs, const bool* wrote);

  // Scalar helpers over one block. A full set is retried briefly (the helper holds nothing
  // meanwhile) before the kSetFull error.
  Status read(uint64_t block, uint32_t offset, void* buf, uint32_t len);
  Status write(uint64_t block, uint32_t offset, const void* buf, uint32_t len);

  // Write-back of dirty lines in [first, first + count) / everywhere, then (flush_all) a
  // device flush so that everything acknowledged before is durable. A line another flusher
  // is writing back meanwhile is waited for: when these return, every write released before
  // the call that falls in the range is on the device.
  Status flush_range(uint64_t first, uint64_t count);
  Status flush_all();
  // The same as flush_range over exactly these blocks (fsync of one file: its blocks), no
  // device flush: each block's set is probed for that block alone, the rest of the cache is
  // not visited.
  struct Range {
    uint64_t first = 0, count = 0;
  };
  Status write_back(const Range* ranges, size_t n);
  // Drops cached lines in the range without writing them back (their data is discarded:
  // trim). Lines still referenced are left alone and reported with kSetFull.
  Status invalidate_range(uint64_t first, uint64_t count);

  // SPIN's P-router: moves [first, first + count) directly between the device and `buf`,
  // taking no line. Cached lines of the range stay authoritative (pinned meanwhile): reads
  // take them over the device's data (a range cached whole does not touch the device).
  // Writes drop the clean lines of the range that nobody holds (the write replaces them
  // whole, as the kernel's direct I/O drops its cached pages), update the others (Dirty),
  // and also any line a concurrent fill (say, read-ahead) brought in while the device write
  // was in flight. A read racing a write of a block gets either content, as through
  // acquire().
  // Two writers of one block at once (the filesystem's whole-block overwrites under a file's
  // shared lock) land in either order: each marks the lines it updated Dirty again after its
  // device write, so the device ends with what the line holds (the last copy into it).
  Status read_direct(uint64_t first, uint64_t count, void* buf,
                     nvme::Priority p = nvme::Priority::kBulk);
  Status write_direct(uint64_t first, uint64_t count, const void* buf,
                      nvme::Priority p = nvme::Priority::kBulk);

  // read_direct() in two halves, for a caller that answers a request when its data is in
  // and meanwhile does other work (the FUSE daemon's reads): the range's cached lines are
  // pinned and the device's read started; poll() lays the lines over the device's data once
  // it is in, and unpins. Destroying one in flight waits for it. Thread-safety: one thread at
  // a time; it may pass between threads where a lock or a queue orders their uses.
  class DirectRead {
   public:
    ~DirectRead();
    DirectRead(const DirectRead&) = delete;
    DirectRead& operator=(const DirectRead&) = delete;
    // True once the read has ended; status() then says how.
    bool poll();
    // Sleeps (bounded) or backs off until it may have ended: after a poll() that said no.
    void idle(port::Backoff& b) { started_->idle(b); }
    Status status() const { return op_.status; }

   private:
    friend class Cache;
    DirectRead(Cache& c, uint64_t first, uint64_t count, void* buf, nvme::Priority p);
    void finish();

    Cache& c_;
    Backend::Op op_;
    std::vector<std::pair<uint64_t, uint32_t>> pins_;
    std::unique_ptr<Backend::Started> started_;
  };
  // Starts read_direct(): where the device's read is in flight on return, `*pending` is set
  // and its poll() says when the read has ended (`buf` stays until then); else the read
  // has ended, `*pending` is empty and the result is returned.
  Status read_direct_start(uint64_t first, uint64_t count, void* buf, nvme::Priority p,
                           std::unique_ptr<DirectRead>* pending);

  // SPIN's P-readahead: call after a read of [block, block + count) on `stream`; when the
  // stream is sequential, the next readahead_lines lines are fetched in the background.
  void note_read(ReadStream* stream, uint64_t block, uint64_t count);
  // Blocks until queued read-ahead has been issued and filled (tests, unmount).
  void drain_readahead();
  // Blocks until the background write-back (writeback_percent) has nothing left to do:
  // no more than its low mark dirty, or nothing more it can write (tests).
  void drain_writeback();

  CacheStats stats() const;
  // Test hook: checks the invariants under each set's lock and describes any violation
  // (empty when all hold): at most one copy of a block, every block in its own set, and,
  // when `quiescent` (no thread inside the cache), no references and no Busy lines left.
  std::string audit(bool quiescent);

  // BaM's array_ref (§7.2.2): keeps one line referenced while consecutive accesses stay in
  // it, re-acquiring only when the block changes. Holds at most one reference at a time.
  class Cursor {
   public:
    Cursor(Cache& c, Intent intent) : c_(c), intent_(intent) {}
    ~Cursor() { reset(); }
    Cursor(const Cursor&) = delete;
    Cursor& operator=(const Cursor&) = delete;
    // The line holding `block`, or null (status() says why).
    uint8_t* get(uint64_t block);
    // Copies into and out of the line get() returned, through Cache::copy_in / copy_out.
    void copy_in(uint32_t offset, const void* src, uint32_t len) {
      c_.copy_in(ref_, offset, src, len);
      wrote_ = true;
    }
    void copy_out(uint32_t offset, void* dst, uint32_t len) { c_.copy_out(ref_, offset, dst, len); }
    void mark_written() { wrote_ = true; }
    void reset();
    const Status& status() const { return ref_.status; }

   private:
    Cache& c_;
    Intent intent_;
    Lane lane_;
    LineRef ref_;
    bool held_ = false;
    bool wrote_ = false;
  };

 private:
  // Per-line state, alone on its cache line: hits on different lines of a set do not
  // contend. The tags are apart from it, a set's tags contiguous (8 ways: one cache line),
  // so a probe reads one line instead of one per way.
  struct alignas(port::kCacheLine) LineMeta {
    port::Atomic<uint32_t> state;  // V | B | D | 29-bit count
    port::Atomic<uint32_t> flags;  // kRef, kAhead, kMeta, kWriting, kWriter, readers copying
  };
  struct alignas(port::kCacheLine) SetMeta {
    port::TicketLock lock;  // Lock order: at most one set lock at a time.
    uint32_t hand;          // clock hand, under lock
  };
  enum class Got { kHit, kReserved, kBusy, kError };
  class ReadAhead;
  class Cleaner;

  Cache(Backend& b, const CacheOptions& o);
  uint32_t set_of(uint64_t block) const {
    return static_cast<uint32_t>((block ^ (block >> set_shift_)) & (nsets_ - 1));
  }
  uint8_t* data_of(uint32_t line) const { return data_ + uint64_t{line} * line_bytes_; }
  int probe(uint32_t set, uint64_t block) const;
  // One group's attempt, without waiting on others. kReserved: `out` names a claimed line
  // that needs a fill (unless the intent was kWriteFull, which is published here). kBusy:
  // the block's line is Busy; `out->line` holds a reference to wait on.
  Got try_acquire(const Lane& lane, uint16_t count, bool prefetch, LineRef* out);
  // Waits until the line is not Busy or no longer holds `block`; true if it is valid for it.
  bool wait_not_busy(LineMeta& m, uint64_t block);
  int acquire_lanes(const Lane* lanes, int n, LineRef* out, bool prefetch);
  int acquire_scalar(Lane* lane, LineRef* out);
  static constexpr int kScalarRetries = 200;  // ~2 ms of backed-off retries
  Status write_back_locked(uint32_t line, uint64_t block, nvme::Priority p);
  Status write_back_victim_and_set_locked(uint32_t set, uint32_t victim, uint64_t block,
                                          nvme::Priority p);
  // Every change of a line's Dirty bit goes through these two, which count dirty lines for
  // the background write-back (the previous state word says whether the bit changed).
  void mark_dirty(LineMeta& m, port::Order o, bool kick = true);
  uint32_t clear_bits(LineMeta& m, uint32_t bits, port::Order o);  // returns the old state
  // The clock over a set (its lock held): claims a victim (Busy) and returns it, or -1.
  // `skip_dirty`: pass over unreferenced dirty lines, taking only clean ones.
  int pick_victim(uint32_t set, bool skip_dirty, uint32_t* prev);
  // The background write-back's pass: dirty, unreferenced lines of one set after another
  // (from where the last pass stopped), batches of kMaxOps, until dirty_low_ is reached or a
  // whole lap finds nothing to write, or a write fails (its lines stay dirty).
  void clean();
  // flush_range's and write_back's steps. A line to write: pinned, Dirty cleared, kWriting
  // set; a line someone else is writing back: pinned, to wait on.
  struct Writing {
    uint32_t line;
    uint64_t block;
    nvme::Priority priority;  // the class of the data's writer (kMeta)
  };
  struct WriteBack {
    std::vector<Writing> items;
    std::vector<uint32_t> waits;
    Status result;
    bool background = false;  // the background write-back's: its lines also count as cleaned
  };
  // Line w of `set` (its lock held) joins `wb`: as an item if it is dirty (kWriting taken,
  // Dirty cleared), as a wait if another flusher's write-back of it is in flight (to be
  // looked at again once that one ends).
  void collect_line(uint32_t w, WriteBack* wb);
  void finish_unwritten(LineMeta& m);
  void write_items(WriteBack* wb);          // writes the items (batches of kMaxOps), unpins them
  bool cleanable(const LineMeta& m) const;  // clean() may take it (set lock held)
  Backend::Op item_op(const Writing& it) const;  // the device write of one item
  // After its write: counted, or dirty again on failure (wb->result); unpinned.
  void finish_item(const Writing& it, const Backend::Op& op, WriteBack* wb);
  Status finish_write_back(WriteBack* wb);  // the rest, then waits for the others' lines
  void prefetch(uint64_t first, uint64_t count);
  // Takes one reference on every cached, valid line of the range; with `drop_clean`, a clean
  // line that nobody references is dropped instead (try_drop_locked).
  std::vector<std::pair<uint64_t, uint32_t>> pin_range(uint64_t first, uint64_t count,
                                                       bool drop_clean = false);
  // Drops line w (its set's lock held): tag and Valid gone, its data discarded. Only a line
  // that nobody references and that is not Busy, and with `clean_only` not Dirty; false (the
  // line unchanged) otherwise.
  bool try_drop_locked(uint32_t w, bool clean_only);
  void unpin(const std::vector<std::pair<uint64_t, uint32_t>>& pins);
  void refresh_after_direct_write(uint64_t block, const uint8_t* data);
  // copy_in() and copy_out() of a line this thread holds (a reference or a pin).
  void copy_in(uint32_t line, uint32_t offset, const void* src, uint32_t len);
  void copy_out(uint32_t line, uint32_t offset, void* dst, uint32_t len);
  // Spins, backing off, until none of `bits` is set in the line's flags (acquire: what the
  // thread that cleared them did to the line is visible).
  static void wait_flags_clear(const LineMeta& m, uint32_t bits);
  void count(int stat, uint64_t n = 1);

  Backend& b_;
  CacheOptions o_;
  uint32_t nsets_, ways_, line_bytes_, set_shift_;
  uint8_t* data_ = nullptr;
  std::unique_ptr<LineMeta[]> meta_;
  port::Atomic<uint64_t>* tags_ = nullptr;  // block + 1 per line; 0: empty (cache-line aligned)
  port::Atomic<uint64_t>& tag_of(const LineMeta& m) const { return tags_[&m - meta_.get()]; }
  std::unique_ptr<SetMeta[]> sets_;
  static constexpr int kStats = 13;
  static constexpr int kStripes = 16;
  struct alignas(port::kCacheLine) Stripe {
    port::Atomic<uint64_t> v[kStats];
  };
  std::unique_ptr<Stripe[]> stats_;
  std::unique_ptr<ReadAhead> ra_;
  // The background write-back (writeback_percent > 0). dirty_ counts dirty lines (relaxed:
  // a figure for the thread's start and stop, momentarily off by the changes in flight);
  // the thread starts when a change takes it to dirty_high_ and stops at dirty_low_.
  // clean_hand_ is the thread's own.
  alignas(port::kCacheLine) std::atomic<int64_t> dirty_{0};
  int64_t dirty_high_ = 0, dirty_low_ = 0;
  uint32_t clean_hand_ = 0;
  std::unique_ptr<Cleaner> cleaner_;
};

}  // namespace warpfs::cache
