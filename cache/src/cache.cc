#include "warpfs/cache/cache.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <vector>

#include "warpfs/cache/line_state.h"
#include "warpfs/nvme/check.h"

namespace warpfs::cache {
namespace {

// The state word (BaM Table 6.1) and line flags: one definition for the CPU and GPU caches.
using line_state::kAhead;  // filled by read-ahead, not yet used
using line_state::kBusy;
using line_state::kCountMask;
using line_state::kDirty;
using line_state::kMeta;        // dirty data written by a metadata-class lane
using line_state::kReaderMask;  // readers copying out of the line (copy_out)
using line_state::kReaderOne;
using line_state::kRef;  // clock: referenced since the hand last passed
using line_state::kValid;
using line_state::kWriter;   // a writer copying into the line (copy_in)
using line_state::kWriting;  // a flusher's write-back of the line is in flight

enum Stat {
  kHits,
  kMisses,
  kLockedHits,
  kEvictions,
  kWritebacks,
  kCoalesced,
  kRaLines,
  kRaHits,
  kBypassed,
  kSetFull,
  kFillErrors,
  kCleaned,
  kDropped
};

uint32_t stripe_of_thread() {
  static std::atomic<uint32_t> next{0};
  thread_local uint32_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return mine;
}

Intent combine(Intent a, Intent b) {
  if (a == Intent::kWriteFull && b == Intent::kWriteFull) return Intent::kWriteFull;
  if (a == Intent::kRead && b == Intent::kRead) return Intent::kRead;
  return Intent::kWrite;  // any mix with a write: fill, then let the writers write
}

}  // namespace

// SPIN's P-readahead in the background: a thread that takes (first, count) requests and
// fills those lines, so a sequential reader finds them cached. Requests are hints: when the
// queue is full they are dropped. It sleeps on a condition variable when idle.
class Cache::ReadAhead {
 public:
  explicit ReadAhead(Cache& c) : c_(c), th_([this] { run(); }) {}
  ~ReadAhead() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    th_.join();
  }
  void request(uint64_t first, uint64_t count) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (q_.size() >= 64) return;
      q_.emplace_back(first, count);
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> l(mu_);
    idle_cv_.wait(l, [this] { return q_.empty() && !busy_; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [this] { return stop_ || !q_.empty(); });
      if (stop_) return;
      auto [first, count] = q_.front();
      q_.pop_front();
      busy_ = true;
      l.unlock();
      c_.prefetch(first, count);
      l.lock();
      busy_ = false;
      if (q_.empty()) idle_cv_.notify_all();
    }
  }
  Cache& c_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::pair<uint64_t, uint64_t>> q_;
  bool stop_ = false, busy_ = false;
  std::thread th_;  // last: starts after the rest is constructed
};

// The background write-back: a thread that sleeps until kicked (the dirty count reached its
// high mark, or an eviction had to write a dirty victim back itself), then runs clean()
// passes until nothing is left to do. Its fields other than c_ and th_ are under mu_.
class Cache::Cleaner {
 public:
  explicit Cleaner(Cache& c) : c_(c), th_([this] { run(); }) {}
  ~Cleaner() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    th_.join();
  }
  void kick() {
    {
      std::lock_guard<std::mutex> g(mu_);
      ++kicks_;
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> l(mu_);
    idle_cv_.wait(l, [this] { return kicks_ == seen_ && !busy_; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [this] { return stop_ || kicks_ != seen_; });
      if (stop_) return;
      seen_ = kicks_;
      busy_ = true;
      l.unlock();
      // A failed write ends the pass and leaves its lines dirty: the next kick (a line
      // dirtied to the high mark, an eviction that wrote a dirty victim) tries again, so a
      // failing device is retried at the pace of its users.
      c_.clean();
      l.lock();
      busy_ = false;
      if (kicks_ == seen_) idle_cv_.notify_all();
    }
  }
  Cache& c_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  uint64_t kicks_ = 0, seen_ = 0;
  bool stop_ = false, busy_ = false;
  std::thread th_;  // last: starts after the rest is constructed
};

Cache::Cache(Backend& b, const CacheOptions& o)
    : b_(b), o_(o), nsets_(o.sets), ways_(o.ways), line_bytes_(b.line_bytes()), set_shift_(0) {
  set_shift_ = static_cast<uint32_t>(__builtin_ctz(nsets_));
}

std::unique_ptr<Cache> Cache::create(Backend& backend, const CacheOptions& o, std::string* error) {
  if (o.sets == 0 || (o.sets & (o.sets - 1)) != 0 || o.ways == 0 || o.ways > 64) {
    *error = "cache sets must be a power of two and ways 1..64";
    return nullptr;
  }
  if (backend.line_count() == 0) {
    *error = "the device has no lines";
    return nullptr;
  }
  std::unique_ptr<Cache> c(new Cache(backend, o));
  void* mem = nullptr;
  Status s = backend.alloc(c->lines() * c->line_bytes_, &mem);
  if (!s.is_ok()) {
    *error = "cache line memory (" + std::to_string(c->lines() * c->line_bytes_ >> 20) +
             " MiB): " + s.to_string();
    return nullptr;
  }
  c->data_ = static_cast<uint8_t*>(mem);
  c->meta_.reset(new LineMeta[c->lines()]());
  c->tags_ = static_cast<port::Atomic<uint64_t>*>(
      ::operator new (c->lines() * sizeof(uint64_t), std::align_val_t{port::kCacheLine}));
  std::memset(static_cast<void*>(c->tags_), 0, c->lines() * sizeof(uint64_t));
  c->sets_.reset(new SetMeta[c->nsets_]());
  c->stats_.reset(new Stripe[kStripes]());
  if (o.readahead_thread && o.readahead_lines > 0) c->ra_ = std::make_unique<ReadAhead>(*c);
  if (o.writeback_percent > 0) {
    const uint64_t pct = std::min<uint32_t>(o.writeback_percent, 100);
    c->dirty_high_ = std::max<int64_t>(1, static_cast<int64_t>(c->lines() * pct / 100));
    c->dirty_low_ = c->dirty_high_ / 2;
    c->cleaner_ = std::make_unique<Cleaner>(*c);
  }
  return c;
}

Cache::~Cache() {
  cleaner_.reset();
  ra_.reset();
  // The REQUIRES: a reference left would point into the memory freed below.
  if constexpr (port::kDebugChecks) {
    for (uint64_t a = 0; meta_ != nullptr && a < lines(); ++a) {
      WARPFS_DCHECK((meta_[a].state.load(port::Order::kAcquire) & kCountMask) == 0,
                    "Cache destroyed with a reference held");
    }
  }
  if (tags_ != nullptr) ::operator delete (tags_, std::align_val_t{port::kCacheLine});
  if (data_ != nullptr) b_.free(data_, lines() * line_bytes_);
}

void Cache::count(int stat, uint64_t n) {
  stats_[stripe_of_thread() % kStripes].v[stat].fetch_add(n, port::Order::kRelaxed);
}

CacheStats Cache::stats() const {
  uint64_t v[kStats] = {};
  for (int s = 0; s < kStripes; ++s) {
    for (int i = 0; i < kStats; ++i) v[i] += stats_[s].v[i].load(port::Order::kRelaxed);
  }
  CacheStats r;
  r.hits = v[kHits], r.misses = v[kMisses], r.locked_hits = v[kLockedHits];
  r.evictions = v[kEvictions], r.writebacks = v[kWritebacks], r.coalesced_lanes = v[kCoalesced];
  r.readahead_lines = v[kRaLines], r.readahead_hits = v[kRaHits];
  r.bypassed_bytes = v[kBypassed], r.set_full = v[kSetFull], r.fill_errors = v[kFillErrors];
  r.cleaned = v[kCleaned], r.direct_dropped = v[kDropped];
  r.dirty_lines =
      static_cast<uint64_t>(std::max<int64_t>(0, dirty_.load(std::memory_order_relaxed)));
  return r;
}

std::string Cache::audit(bool quiescent) {
  std::string out;
  for (uint32_t set = 0; set < nsets_; ++set) {
    SetMeta& sm = sets_[set];
    sm.lock.lock();
    for (uint32_t a = set * ways_; a < (set + 1) * ways_; ++a) {
      const uint64_t tag = tags_[a].load(port::Order::kAcquire);
      const uint32_t s = meta_[a].state.load(port::Order::kAcquire);
      if (quiescent && ((s & kCountMask) || (s & kBusy))) {
        out += "line " + std::to_string(a) + " has references or Busy at rest; ";
      }
      if (tag == 0) continue;
      if (set_of(tag - 1) != set) out += "block " + std::to_string(tag - 1) + " in the wrong set; ";
      for (uint32_t b = a + 1; b < (set + 1) * ways_; ++b) {
        if (tags_[b].load(port::Order::kAcquire) == tag) {
          out += "block " + std::to_string(tag - 1) + " cached twice; ";
        }
      }
    }
    sm.lock.unlock();
  }
  return out;
}

int Cache::probe(uint32_t set, uint64_t block) const {
  const uint32_t base = set * ways_;
  for (uint32_t w = 0; w < ways_; ++w) {
    if (tags_[base + w].load(port::Order::kAcquire) == block + 1) return static_cast<int>(base + w);
  }
  return -1;
}

bool Cache::wait_not_busy(LineMeta& m, uint64_t block) {
  // Thesis §4.2.3: wait for Busy to clear or for the mapping to change.
  port::Backoff b;
  for (;;) {
    const uint32_t s = m.state.load(port::Order::kAcquire);
    if (tag_of(m).load(port::Order::kAcquire) != block + 1) return false;
    if (!(s & kBusy)) return (s & kValid) != 0;
    b.pause();
  }
}

// Writes a dirty victim back before its line is reused. Called under the set lock, so a
// reader of the old block (same set) cannot fetch stale data from the device meanwhile.
Status Cache::write_back_locked(uint32_t line, uint64_t block, nvme::Priority p) {
  Backend::Op op = item_op(Writing{line, block, p});
  b_.io(&op, 1);
  if (op.status.is_ok()) count(kWritebacks);
  return op.status;
}

// An eviction's write-back while the background one is on: the victim goes to the device in
// one batch with the set's other dirty lines that nobody holds (the lines Cache::clean takes),
// so that the device round trip the evicting lane waits for also cleans the set for the next
// misses. Random 4 KiB overwrites of a file four times the cache left half of all write-backs
// to evicting lanes, each waited for alone: the background thread, one among the FUSE
// workers, cleaned about half of what they dirtied. REQUIRES: the set's lock, the victim Busy.
Status Cache::write_back_victim_and_set_locked(uint32_t set, uint32_t victim, uint64_t block,
                                               nvme::Priority p) {
  WriteBack wb;
  for (uint32_t w = set * ways_;
       w < (set + 1) * ways_ && wb.items.size() + 1 < static_cast<size_t>(Backend::kMaxOps); ++w) {
    if (w != victim && cleanable(meta_[w])) collect_line(w, &wb);
  }
  Backend::Op ops[Backend::kMaxOps];
  ops[0] = item_op(Writing{victim, block, p});
  const int n = 1 + static_cast<int>(wb.items.size());
  for (int k = 1; k < n; ++k) ops[k] = item_op(wb.items[k - 1]);
  b_.io(ops, n);
  for (int k = 1; k < n; ++k) finish_item(wb.items[k - 1], ops[k], &wb);
  if (ops[0].status.is_ok()) count(kWritebacks);
  return ops[0].status;
}

void Cache::mark_dirty(LineMeta& m, port::Order o, bool kick) {
  if (m.state.fetch_or(kDirty, o) & kDirty) return;
  // The change that takes the count to the high mark wakes the background write-back.
  if (dirty_.fetch_add(1, std::memory_order_relaxed) + 1 == dirty_high_ && kick && cleaner_) {
    cleaner_->kick();
  }
}

uint32_t Cache::clear_bits(LineMeta& m, uint32_t bits, port::Order o) {
  const uint32_t prev = m.state.fetch_and(~bits, o);
  if ((bits & kDirty) && (prev & kDirty)) dirty_.fetch_sub(1, std::memory_order_relaxed);
  return prev;
}

// Clock over the set (BaM §6.3): skip referenced or busy lines, give recently used ones a
// second chance, claim with fetch_or(Busy) and back off if someone raced in.
int Cache::pick_victim(uint32_t set, bool skip_dirty, uint32_t* prev) {
  SetMeta& sm = sets_[set];
  for (uint32_t i = 0; i < 2 * ways_; ++i) {
    const uint32_t w = set * ways_ + sm.hand;
    sm.hand = sm.hand + 1 == ways_ ? 0 : sm.hand + 1;
    LineMeta& m = meta_[w];
    const uint32_t s = m.state.load(port::Order::kRelaxed);
    if ((s & kCountMask) || (s & kBusy)) continue;
    if ((s & kValid) && (m.flags.load(port::Order::kRelaxed) & kRef)) {
      m.flags.fetch_and(~kRef, port::Order::kRelaxed);
      continue;
    }
    if (skip_dirty && (s & kValid) && (s & kDirty)) continue;
    *prev = m.state.fetch_or(kBusy, port::Order::kAcquire);
    if ((*prev & kCountMask) || (*prev & kBusy)) {
      if (!(*prev & kBusy)) m.state.fetch_and(~kBusy, port::Order::kRelease);
      continue;
    }
    if (skip_dirty && (*prev & kValid) && (*prev & kDirty)) {  // dirtied since the load
      m.state.fetch_and(~kBusy, port::Order::kRelease);
      continue;
    }
    return static_cast<int>(w);
  }
  return -1;
}

Cache::Got Cache::try_acquire(const Lane& lane, uint16_t cnt, bool prefetch, LineRef* out) {
  const uint64_t block = lane.block;
  const uint32_t set = set_of(block);
  auto hit = [&](uint32_t line, bool locked) {
    LineMeta& m = meta_[line];
    const uint32_t f = m.flags.load(port::Order::kRelaxed);
    if (!(f & kRef)) m.flags.fetch_or(kRef, port::Order::kRelaxed);
    if ((f & kAhead) && !prefetch) {
      m.flags.fetch_and(~kAhead, port::Order::kRelaxed);
      count(kRaHits);
    }
    if (!prefetch) count(locked ? kLockedHits : kHits);  // demand accesses only
    *out = LineRef{data_of(line), line, cnt, false, Status::ok()};
    return Got::kHit;
  };
  // Fast path: no lock.
  if (int w = probe(set, block); w >= 0) {
    LineMeta& m = meta_[w];
    // Acquire: the line's data and tag, published by the filler's release, are visible.
    const uint32_t s = m.state.fetch_add(cnt, port::Order::kAcquire);
    const bool ours = tag_of(m).load(port::Order::kAcquire) == block + 1;
    if ((s & kValid) && !(s & kBusy) && ours) return hit(static_cast<uint32_t>(w), false);
    if ((s & kBusy) && ours) {
      *out = LineRef{nullptr, static_cast<uint32_t>(w), cnt, false, Status::ok()};
      return Got::kBusy;
    }
    m.state.fetch_sub(cnt, port::Order::kRelease);
  }
  // Slow path: the set lock orders inserters, so a block is inserted once.
  SetMeta& sm = sets_[set];
  sm.lock.lock();
  if (int w = probe(set, block); w >= 0) {
    LineMeta& m = meta_[w];
    const uint32_t s = m.state.fetch_add(cnt, port::Order::kAcquire);
    if ((s & kValid) && !(s & kBusy)) {
      sm.lock.unlock();
      return hit(static_cast<uint32_t>(w), true);
    }
    sm.lock.unlock();
    // Busy: being filled by someone else. (Valid-less, non-busy lines with a tag do not
    // exist: a failed fill clears the tag before it clears Busy.)
    *out = LineRef{nullptr, static_cast<uint32_t>(w), cnt, false, Status::ok()};
    return Got::kBusy;
  }
  // With the background write-back a clean victim is preferred (the thread gets the dirty
  // ones back to the device); a set with none gives up a dirty one.
  uint32_t prev = 0;
  int victim = cleaner_ ? pick_victim(set, true, &prev) : -1;
  if (victim < 0) victim = pick_victim(set, false, &prev);
  if (victim < 0) {
    sm.lock.unlock();
    count(kSetFull);
    out->status = Status::error(Code::kSetFull, "cache set full: every line is referenced");
    return Got::kError;
  }
  LineMeta& m = meta_[victim];
  const bool dirty_victim = (prev & kValid) && (prev & kDirty);
  if (dirty_victim) {
    // The evicting lane waits on the write-back: the more urgent of its class and the data's.
    const nvme::Priority p =
        (m.flags.load(port::Order::kRelaxed) & kMeta) ? nvme::Priority::kMetadata : lane.priority;
    const uint64_t victim_block = tag_of(m).load(port::Order::kRelaxed) - 1;
    Status st =
        cleaner_ && o_.evict_with_set
            ? write_back_victim_and_set_locked(set, static_cast<uint32_t>(victim), victim_block, p)
            : write_back_locked(static_cast<uint32_t>(victim), victim_block, p);
    if (!st.is_ok()) {  // keep the dirty line: its data must not be lost
      m.state.fetch_and(~kBusy, port::Order::kRelease);
      sm.lock.unlock();
      out->status = st;
      return Got::kError;
    }
  }
  if (prev & kValid) count(kEvictions);
  clear_bits(m, kValid | kDirty, port::Order::kRelaxed);  // Busy stays
  tag_of(m).store(block + 1, port::Order::kRelease);
  m.flags.store(prefetch ? kAhead : kRef, port::Order::kRelaxed);
  m.state.fetch_add(cnt, port::Order::kRelaxed);
  sm.lock.unlock();
  // This lane waited for a write-back: the background one is behind (or off).
  if (dirty_victim && cleaner_) cleaner_->kick();
  if (!prefetch) count(kMisses);  // read-ahead fills are counted as readahead_lines
  *out = LineRef{data_of(static_cast<uint32_t>(victim)), static_cast<uint32_t>(victim), cnt, false,
                 Status::ok()};
  if (lane.intent == Intent::kWriteFull && lane.src != nullptr) {
    // The whole line is being replaced: no read. Copy, then publish Valid + Dirty.
    std::memcpy(out->data, lane.src, line_bytes_);
    out->holds_src = true;
    if (lane.priority == nvme::Priority::kMetadata) m.flags.fetch_or(kMeta, port::Order::kRelaxed);
    mark_dirty(m, port::Order::kRelaxed);
    m.state.fetch_xor(kBusy | kValid, port::Order::kRelease);
    return Got::kHit;
  }
  return Got::kReserved;
}

int Cache::acquire(const Lane* lanes, int n, LineRef* out) {
  return acquire_lanes(lanes, n, out, false);
}

int Cache::acquire_lanes(const Lane* lanes, int n, LineRef* out, bool prefetch) {
  n = std::min(n, kWarp);
  // Coalesce (the CPU form of __match_any_sync / __popc / __ffs / __any_sync, BaM Ch. 7):
  // the first lane on a block leads; its group's count and combined intent go with it.
  // Groups live in uninitialised storage: building 32 of them per call was the hit path's
  // largest cost. One lane, or every lane on one block, is one group without comparisons.
  struct Group {
    Lane lane;  // the leader's block, the combined intent, a source for kWriteFull
    int leader;
    uint16_t count;
  };
  alignas(Group) unsigned char storage[sizeof(Group) * kWarp];
  auto* groups = reinterpret_cast<Group*>(storage);
  int8_t group_of[kWarp];
  int ng = 0, active = 0;
  bool one_block = true;
  for (int i = 0; i < n; ++i) {
    if (lanes[i].intent == Intent::kNone) continue;
    ++active;
    one_block &= lanes[i].block == lanes[0].block && lanes[0].intent != Intent::kNone;
  }
  for (int i = 0; i < n; ++i) {
    group_of[i] = -1;
    if (lanes[i].intent == Intent::kNone) continue;
    int g = -1;
    if (one_block && ng == 1) {
      g = 0;
    } else if (!one_block) {
      for (int k = 0; k < ng; ++k) {
        if (groups[k].lane.block == lanes[i].block) {
          g = k;
          break;
        }
      }
    }
    if (g < 0) {
      g = ng++;
      new (&groups[g]) Group{lanes[i], i, 0};
    } else {
      groups[g].lane.intent = combine(groups[g].lane.intent, lanes[i].intent);
      groups[g].lane.priority = std::min(groups[g].lane.priority, lanes[i].priority);
      if (lanes[i].src != nullptr) groups[g].lane.src = lanes[i].src;
    }
    ++groups[g].count;
    group_of[i] = static_cast<int8_t>(g);
  }
  if (active > ng) count(kCoalesced, static_cast<uint64_t>(active - ng));

  alignas(LineRef) unsigned char ref_storage[sizeof(LineRef) * kWarp];
  auto* gref = reinterpret_cast<LineRef*>(ref_storage);
  int todo[kWarp], ntodo = 0;
  for (int g = 0; g < ng; ++g) {
    new (&gref[g]) LineRef{};
    Lane& l = groups[g].lane;
    if (l.intent == Intent::kWriteFull && l.src == nullptr) l.intent = Intent::kWrite;
    if (l.block >= b_.line_count()) {
      gref[g].status = Status::error(Code::kInvalidArgument, "block beyond the device");
    } else {
      todo[ntodo++] = g;
    }
  }

  // Rounds: attempt every pending group without waiting; fill what was reserved (one
  // batch); only then wait on lines others are filling, holding nothing unfilled ourselves.
  while (ntodo > 0) {
    int busy[kWarp], nbusy = 0;
    int fill[kWarp], nfill = 0;
    for (int k = 0; k < ntodo; ++k) {
      const int g = todo[k];
      switch (try_acquire(groups[g].lane, groups[g].count, prefetch, &gref[g])) {
        case Got::kReserved:
          fill[nfill++] = g;
          break;
        case Got::kBusy:
          busy[nbusy++] = g;
          break;
        case Got::kHit:
        case Got::kError:
          break;
      }
    }
    if (nfill > 0) {
      Backend::Op ops[kWarp];
      for (int k = 0; k < nfill; ++k) {
        ops[k] = Backend::Op{};
        ops[k].block = groups[fill[k]].lane.block;
        ops[k].priority = groups[fill[k]].lane.priority;
        ops[k].data = gref[fill[k]].data;
      }
      b_.io(ops, nfill);
      for (int k = 0; k < nfill; ++k) {
        LineRef& r = gref[fill[k]];
        LineMeta& m = meta_[r.line];
        if (ops[k].status.is_ok()) {
          if (prefetch) count(kRaLines);
          // BaM §6.4: one xor sets Valid and clears Busy; release publishes the data.
          m.state.fetch_xor(kBusy | kValid, port::Order::kRelease);
        } else {
          count(kFillErrors);
          tag_of(m).store(0, port::Order::kRelease);  // first: waiters then see the mapping gone
          m.state.fetch_and(~kBusy, port::Order::kRelease);
          m.state.fetch_sub(r.count, port::Order::kRelease);
          r = LineRef{};
          r.status = ops[k].status;
        }
      }
    }
    ntodo = 0;
    for (int k = 0; k < nbusy; ++k) {
      const int g = busy[k];
      LineMeta& m = meta_[gref[g].line];
      if (wait_not_busy(m, groups[g].lane.block)) {  // a locked hit: someone else filled it
        if (!prefetch) count(kLockedHits);
        gref[g].data = data_of(gref[g].line);
        continue;
      }
      // The line went to another block (evicted) or its fill failed: try again.
      m.state.fetch_sub(gref[g].count, port::Order::kRelease);
      gref[g] = LineRef{};
      todo[ntodo++] = g;
    }
  }

  // Every lane gets its group's line; only the leader holds the group's references.
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    if (group_of[i] < 0) {
      out[i] = LineRef{};
      continue;
    }
    const Group& grp = groups[group_of[i]];
    out[i] = gref[group_of[i]];
    if (grp.leader != i) out[i].count = 0;
    if (!out[i].status.is_ok()) ++failed;
  }
  return failed;
}

void Cache::release(const Lane* lanes, int n, LineRef* refs, const bool* wrote) {
  n = std::min(n, kWarp);
  for (int i = 0; i < n; ++i) {
    if (lanes[i].intent == Intent::kNone || refs[i].count == 0) continue;
    bool dirty = false, meta = false;
    if (wrote != nullptr) {
      for (int j = 0; j < n; ++j) {
        const bool mine = wrote[j] && refs[j].line == refs[i].line;
        dirty |= mine;
        meta |= mine && lanes[j].priority == nvme::Priority::kMetadata;
      }
    }
    LineMeta& m = meta_[refs[i].line];
    if (meta) m.flags.fetch_or(kMeta, port::Order::kRelaxed);
    // Release: the lane's writes to the line happen before the Dirty bit a flusher reads
    // and before the count drop an evictor reads.
    if (dirty) mark_dirty(m, port::Order::kRelease);
    m.state.fetch_sub(refs[i].count, port::Order::kRelease);
  }
  for (int i = 0; i < n; ++i) refs[i] = LineRef{};
}

// A scalar caller holds nothing inside the call, so when its set is momentarily full of
// other threads' references it may wait for them, briefly: a bounded number of backed-off
// retries, then the "set full" error (the caller may hold references that fill the set).
int Cache::acquire_scalar(Lane* l, LineRef* r) {
  port::Backoff b;
  for (int attempt = 0;; ++attempt) {
    if (acquire(l, 1, r) == 0) return 0;
    if (r->status.code() != Code::kSetFull || attempt == kScalarRetries) return 1;
    b.pause();
  }
}

Status Cache::read(uint64_t block, uint32_t offset, void* buf, uint32_t len) {
  if (offset > line_bytes_ || len > line_bytes_ - offset) {
    return Status::error(Code::kInvalidArgument, "read crosses a line");
  }
  Lane l{block, Intent::kRead, nullptr};
  LineRef r;
  if (acquire_scalar(&l, &r) != 0) return r.status;
  copy_out(r, offset, buf, len);
  release(&l, 1, &r, nullptr);
  return Status::ok();
}

Status Cache::write(uint64_t block, uint32_t offset, const void* buf, uint32_t len) {
  if (offset > line_bytes_ || len > line_bytes_ - offset) {
    return Status::error(Code::kInvalidArgument, "write crosses a line");
  }
  const bool whole = offset == 0 && len == line_bytes_;
  Lane l{block, whole ? Intent::kWriteFull : Intent::kWrite, whole ? buf : nullptr};
  LineRef r;
  if (acquire_scalar(&l, &r) != 0) return r.status;
  bool wrote = true;
  // A whole-line write was published by acquire() (unless the line was already cached, in
  // which case it is overwritten here like any write).
  if (!r.holds_src) copy_in(r, offset, buf, len);
  release(&l, 1, &r, &wrote);
  return Status::ok();
}

void Cache::copy_in(uint32_t line, uint32_t offset, const void* src, uint32_t len) {
  LineMeta& m = meta_[line];
  port::Backoff b;
  // kWriter is taken only while no write-back and no other writer is at the line: one
  // atomic step on the flags word, so it and a flusher's kWriting come in one order.
  // Acquire: a write-back or a writer that ended before is done with the line.
  uint32_t f = m.flags.load(port::Order::kRelaxed);
  for (;;) {
    if (f & (kWriting | kWriter)) {
      b.pause();
      f = m.flags.load(port::Order::kRelaxed);
    } else if (m.flags.compare_exchange(f, f | kWriter, port::Order::kAcquire)) {
      break;
    }
  }
  // Readers that came before finish their copies (no new one starts while kWriter is set).
  if (f & kReaderMask) wait_flags_clear(m, kReaderMask);
  std::memcpy(data_of(line) + offset, src, len);
  // Release: the copy happens before a flusher or reader that sees kWriter clear reads it.
  m.flags.fetch_and(~kWriter, port::Order::kRelease);
}

void Cache::copy_out(uint32_t line, uint32_t offset, void* dst, uint32_t len) {
  LineMeta& m = meta_[line];
  // Counted in while no writer copies (a writer waits for the count to fall to zero).
  // Acquire: the last writer's copy is visible.
  while (m.flags.fetch_add(kReaderOne, port::Order::kAcquire) & kWriter) {
    m.flags.fetch_sub(kReaderOne, port::Order::kRelaxed);
    wait_flags_clear(m, kWriter);
  }
  std::memcpy(dst, data_of(line) + offset, len);
  // Release: our copy happens before a writer that sees the count fall overwrites the line.
  m.flags.fetch_sub(kReaderOne, port::Order::kRelease);
}

void Cache::wait_flags_clear(const LineMeta& m, uint32_t bits) {
  port::Backoff b;
  while (m.flags.load(port::Order::kAcquire) & bits) b.pause();
}

void Cache::collect_line(uint32_t w, WriteBack* wb) {
  LineMeta& m = meta_[w];
  const uint64_t tag = tag_of(m).load(port::Order::kAcquire);
  const uint32_t s = m.state.load(port::Order::kAcquire);
  if (tag == 0 || !(s & kValid) || (s & kBusy)) return;
  if (!(s & kDirty) && !(m.flags.load(port::Order::kAcquire) & kWriting)) return;
  m.state.fetch_add(1, port::Order::kAcquire);  // pinned: the tag stays, not evictable
  // No writer starts a copy into the line from here on (copy_in). kWriting is set only here,
  // under the set's lock; finish_item clears it without the lock, hence the one atomic step.
  uint32_t f = m.flags.fetch_or(kWriting, port::Order::kAcqRel);
  if (f & kWriting) {
    // Another flusher's write-back of the line is in flight. It must reach the device before
    // this call may say the block did, and if the line is dirty again (a writer's release
    // after that flusher cleared Dirty), it is written once that write-back ends
    // (finish_write_back): two write-backs of one line at once could not both keep the
    // writers off until their own ended.
    wb->waits.push_back(w);
    return;
  }
  if (!(m.state.load(port::Order::kAcquire) & kDirty)) {
    finish_unwritten(m);  // clean, and that flusher's write-back ended since the first look
    return;
  }
  // A writer already copying finishes first (a copy of at most a line: this waits under the
  // set lock, and no copy waits for a set lock). Acquire: its copy happens before the device
  // reads the line.
  if (f & kWriter) wait_flags_clear(m, kWriter);
  clear_bits(m, kDirty, port::Order::kAcqRel);
  // A metadata writer racing this may set kMeta and Dirty after we clear them apart: the
  // line is then written back later in the bulk class. Its class, never its data, is lost.
  const bool meta = (m.flags.fetch_and(~kMeta, port::Order::kRelaxed) & kMeta) != 0;
  wb->items.push_back(
      Writing{w, tag - 1, meta ? nvme::Priority::kMetadata : nvme::Priority::kBulk});
}

// A line collect_line pinned and took kWriting on, then found nothing to write: let go.
void Cache::finish_unwritten(LineMeta& m) {
  m.flags.fetch_and(~kWriting, port::Order::kRelease);
  m.state.fetch_sub(1, port::Order::kRelease);
}

void Cache::write_items(WriteBack* wb) {
  for (size_t at = 0; at < wb->items.size(); at += Backend::kMaxOps) {
    const int n = static_cast<int>(std::min<size_t>(Backend::kMaxOps, wb->items.size() - at));
    Backend::Op ops[Backend::kMaxOps];
    for (int k = 0; k < n; ++k) ops[k] = item_op(wb->items[at + k]);
    b_.io(ops, n);
    for (int k = 0; k < n; ++k) finish_item(wb->items[at + k], ops[k], wb);
  }
  wb->items.clear();
}

// A dirty line the background write-back may take: nobody holds it (a writer may be copying
// into one that is held, and a held line is not the next victim), it is not Busy (being
// filled or evicted), and no other flusher is writing it. REQUIRES: its set's lock.
bool Cache::cleanable(const LineMeta& m) const {
  const uint32_t st = m.state.load(port::Order::kAcquire);
  if ((st & kCountMask) || (st & kBusy) || !(st & kValid) || !(st & kDirty)) return false;
  return !(m.flags.load(port::Order::kAcquire) & kWriting);
}

Backend::Op Cache::item_op(const Writing& it) const {
  Backend::Op op;
  op.block = it.block;
  op.write = true;
  op.data = data_of(it.line);
  op.priority = it.priority;
  return op;
}

void Cache::finish_item(const Writing& it, const Backend::Op& op, WriteBack* wb) {
  LineMeta& m = meta_[it.line];
  if (op.status.is_ok()) {
    count(kWritebacks);
    if (wb->background) count(kCleaned);
  } else {
    // Still dirty: not lost. No kick: the background write-back's own failure would
    // start it again at once, on a device that fails every write.
    mark_dirty(m, port::Order::kRelaxed, false);
    if (wb->result.is_ok()) wb->result = op.status;
  }
  m.flags.fetch_and(~kWriting, port::Order::kRelease);
  m.state.fetch_sub(1, port::Order::kRelease);
}

Status Cache::finish_write_back(WriteBack* wb) {
  write_items(wb);
  // Rounds: wait until every write-back of the waited-for lines in flight has ended, then look
  // at each again (a line dirty again is taken and written). Nothing is waited for while this
  // call holds kWriting on a line it has not written yet: a line it took in this round could
  // also be one it waits for next (a range naming a block twice, re-dirtied meanwhile), and a
  // writer of that line would wait with it, forever.
  while (!wb->waits.empty()) {
    std::vector<uint32_t> waits;
    waits.swap(wb->waits);
    std::sort(waits.begin(), waits.end());
    for (size_t i = 1; i < waits.size(); ++i) {  // one pin per line is enough to wait on
      if (waits[i] == waits[i - 1]) meta_[waits[i]].state.fetch_sub(1, port::Order::kRelease);
    }
    waits.erase(std::unique(waits.begin(), waits.end()), waits.end());
    for (uint32_t w : waits) wait_flags_clear(meta_[w], kWriting);
    for (uint32_t w : waits) {
      // Dirty again (the other write-back failed, or a newer write): written here. Taken by
      // yet another flusher since: waited for in the next round.
      SetMeta& sm = sets_[w / ways_];
      sm.lock.lock();
      collect_line(w, wb);
      sm.lock.unlock();
      meta_[w].state.fetch_sub(1, port::Order::kRelease);  // our pin, the tag held meanwhile
    }
    write_items(wb);
  }
  return wb->result;
}

Status Cache::flush_range(uint64_t first, uint64_t count_lines) {
  // Collect dirty lines (pinned with one reference, Dirty cleared) a set at a time, write
  // them in batches of up to 32, re-mark the ones that failed.
  WriteBack wb;
  auto collect_set = [&](uint32_t set) {
    SetMeta& sm = sets_[set];
    sm.lock.lock();
    for (uint32_t w = set * ways_; w < (set + 1) * ways_; ++w) {
      const uint64_t tag = tag_of(meta_[w]).load(port::Order::kAcquire);
      if (tag == 0 || tag - 1 < first || tag - 1 - first >= count_lines) continue;
      collect_line(w, &wb);
    }
    sm.lock.unlock();
    if (wb.items.size() >= Backend::kMaxOps) write_items(&wb);
  };
  if (count_lines >= nsets_) {  // the range touches (nearly) every set: visit each once
    for (uint32_t set = 0; set < nsets_; ++set) collect_set(set);
  } else {  // a short range: only its blocks' sets, each once
    std::vector<uint32_t> seen;
    for (uint64_t b = first; b < first + count_lines; ++b) {
      const uint32_t set = set_of(b);
      if (std::find(seen.begin(), seen.end(), set) != seen.end()) continue;
      seen.push_back(set);
      collect_set(set);
    }
  }
  return finish_write_back(&wb);
}

Status Cache::write_back(const Range* ranges, size_t n) {
  WriteBack wb;
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += ranges[i].count;
  if (total >= lines()) {
    // More blocks than lines: visiting every line once is cheaper than probing every block.
    std::vector<Range> sorted(ranges, ranges + n);
    std::sort(sorted.begin(), sorted.end(),
              [](const Range& a, const Range& b) { return a.first < b.first; });
    size_t out = 0;  // overlapping runs merged: the run before a block is the only candidate
    for (size_t i = 1; i < sorted.size(); ++i) {
      Range& last = sorted[out];
      if (sorted[i].first <= last.first + last.count) {
        last.count = std::max(last.count, sorted[i].first + sorted[i].count - last.first);
      } else {
        sorted[++out] = sorted[i];
      }
    }
    sorted.resize(out + 1);
    auto named = [&](uint64_t block) {
      auto it = std::upper_bound(sorted.begin(), sorted.end(), block,
                                 [](uint64_t b, const Range& r) { return b < r.first; });
      return it != sorted.begin() && block - std::prev(it)->first < std::prev(it)->count;
    };
    for (uint32_t set = 0; set < nsets_; ++set) {
      SetMeta& sm = sets_[set];
      sm.lock.lock();
      for (uint32_t w = set * ways_; w < (set + 1) * ways_; ++w) {
        const uint64_t tag = tag_of(meta_[w]).load(port::Order::kAcquire);
        if (tag != 0 && named(tag - 1)) collect_line(w, &wb);
      }
      sm.lock.unlock();
      if (wb.items.size() >= Backend::kMaxOps) write_items(&wb);
    }
    return finish_write_back(&wb);
  }
  for (size_t i = 0; i < n; ++i) {
    const uint64_t end = std::min(ranges[i].first + ranges[i].count, b_.line_count());
    for (uint64_t b = ranges[i].first; b < end; ++b) {
      const uint32_t set = set_of(b);
      SetMeta& sm = sets_[set];
      sm.lock.lock();  // also waits for an eviction writing the block back under it
      if (const int w = probe(set, b); w >= 0) collect_line(static_cast<uint32_t>(w), &wb);
      sm.lock.unlock();
      if (wb.items.size() >= Backend::kMaxOps) write_items(&wb);
    }
  }
  return finish_write_back(&wb);
}

void Cache::clean() {
  WriteBack wb;
  wb.background = true;
  // Sets visited since the last one that had something to write: a whole lap of nothing
  // (every dirty line referenced, Busy or being written by someone else) ends the pass.
  uint32_t idle = 0;
  while (dirty_.load(std::memory_order_relaxed) > dirty_low_ && idle < nsets_) {
    const uint32_t set = clean_hand_;
    clean_hand_ = (clean_hand_ + 1) & (nsets_ - 1);
    const size_t before = wb.items.size();
    SetMeta& sm = sets_[set];
    sm.lock.lock();
    for (uint32_t w = set * ways_; w < (set + 1) * ways_; ++w) {
      if (cleanable(meta_[w])) collect_line(w, &wb);
    }
    sm.lock.unlock();
    idle = wb.items.size() > before ? 0 : idle + 1;
    if (wb.items.size() >= Backend::kMaxOps) {
      write_items(&wb);
      if (!wb.result.is_ok()) return;
    }
  }
  write_items(&wb);  // collect_line queued no waits: every line taken was dirty and ours
}

void Cache::drain_writeback() {
  if (cleaner_) cleaner_->drain();
}

Status Cache::flush_all() {
  Status s = flush_range(0, ~0ull);
  Status f = b_.flush();  // then make it durable: NVMe Flush after the writes completed
  return s.is_ok() ? f : s;
}

Status Cache::invalidate_range(uint64_t first, uint64_t count_lines) {
  Status result;
  for (uint64_t b = first; b < first + count_lines; ++b) {
    const uint32_t set = set_of(b);
    SetMeta& sm = sets_[set];
    sm.lock.lock();
    const int w = probe(set, b);
    if (w >= 0 && !try_drop_locked(static_cast<uint32_t>(w), false)) {
      result = Status::error(Code::kSetFull, "a line to invalidate is in use");
    }
    sm.lock.unlock();
  }
  return result;
}

// Claimed as an evictor claims (fetch_or Busy, BaM Fig 6.5): a lock-free hit that takes a
// reference after the claim sees Busy and lets go; one that took it before shows in the count.
bool Cache::try_drop_locked(uint32_t w, bool clean_only) {
  LineMeta& m = meta_[w];
  const uint32_t prev = m.state.fetch_or(kBusy, port::Order::kAcquire);
  if ((prev & kCountMask) || (prev & kBusy) || (clean_only && (prev & kDirty))) {
    if (!(prev & kBusy)) m.state.fetch_and(~kBusy, port::Order::kRelease);
    return false;
  }
  tag_of(m).store(0, port::Order::kRelease);
  clear_bits(m, kValid | kDirty | kBusy, port::Order::kRelease);
  return true;
}

// Takes one reference on every cached, valid line of the range (under each set's lock), so
// none of them can be evicted or retagged until unpin(); with `drop_clean`, drops the clean
// ones nobody references instead.
std::vector<std::pair<uint64_t, uint32_t>> Cache::pin_range(uint64_t first, uint64_t count_lines,
                                                            bool drop_clean) {
  std::vector<std::pair<uint64_t, uint32_t>> pins;
  for (uint64_t b = first; b < first + count_lines; ++b) {
    const uint32_t set = set_of(b);
    SetMeta& sm = sets_[set];
    sm.lock.lock();
    if (const int w = probe(set, b); w >= 0) {
      if (drop_clean && try_drop_locked(static_cast<uint32_t>(w), true)) {
        count(kDropped);
        sm.lock.unlock();
        continue;
      }
      LineMeta& m = meta_[w];
      const uint32_t s = m.state.fetch_add(1, port::Order::kAcquire);
      if ((s & kValid) && !(s & kBusy)) {
        pins.emplace_back(b, static_cast<uint32_t>(w));
      } else {
        m.state.fetch_sub(1, port::Order::kRelease);
      }
    }
    sm.lock.unlock();
  }
  return pins;
}

void Cache::unpin(const std::vector<std::pair<uint64_t, uint32_t>>& pins) {
  for (const auto& p : pins) meta_[p.second].state.fetch_sub(1, port::Order::kRelease);
}

// Reads the device with every cached line of the range pinned, then lays those lines over
// the result: a cached line is never older than the device (SPIN's consistency rule, §4),
// and a block that was not cached has its newest data on the device (evictions write back
// under the set lock before the block leaves; flushes pin the line while they write). A
// range the cache holds whole is copied from its lines, without the device.
namespace {

class NamespaceStarted final : public Backend::Started {
 public:
  explicit NamespaceStarted(nvme::NamespaceIo& ns) : s(ns) {}
  bool poll() override { return s.poll(); }
  void idle(port::Backoff& b) override { s.idle(b); }
  nvme::NamespaceIo::Started s;
};

}  // namespace

void NamespaceBackend::start(Op* op, std::unique_ptr<Started>* out) {
  auto s = std::make_unique<NamespaceStarted>(ns_);
  ns_.start(op, 1, &s->s);
  if (s->s.poll()) {
    out->reset();
  } else {
    *out = std::move(s);
  }
}

// The range's cached lines pinned, the device's read of it described (not started).
Cache::DirectRead::DirectRead(Cache& c, uint64_t first, uint64_t count_lines, void* buf,
                              nvme::Priority p)
    : c_(c), pins_(c.pin_range(first, count_lines)) {
  op_.block = first;
  op_.count = static_cast<uint32_t>(count_lines);
  op_.priority = p;
  op_.data = static_cast<uint8_t*>(buf);
}

Status Cache::read_direct(uint64_t first, uint64_t count_lines, void* buf, nvme::Priority p) {
  DirectRead r(*this, first, count_lines, buf, p);
  if (r.pins_.size() < count_lines) b_.io(&r.op_, 1);
  r.finish();
  return r.op_.status;
}

Status Cache::read_direct_start(uint64_t first, uint64_t count_lines, void* buf, nvme::Priority p,
                                std::unique_ptr<DirectRead>* pending) {
  std::unique_ptr<DirectRead> r(new DirectRead(*this, first, count_lines, buf, p));
  if (r->pins_.size() < count_lines) b_.start(&r->op_, &r->started_);
  if (r->started_ != nullptr) {
    *pending = std::move(r);
    return Status::ok();
  }
  pending->reset();
  r->finish();
  return r->op_.status;
}

Cache::DirectRead::~DirectRead() {
  if (started_ == nullptr) return;
  port::Backoff b;
  while (!started_->poll()) started_->idle(b);
  finish();
}

bool Cache::DirectRead::poll() {
  if (started_ == nullptr) return true;  // ended (finish() ran)
  if (!started_->poll()) return false;
  finish();
  return true;
}

// The device's data is in (or the range was cached whole): the pinned lines over it, which
// are never older than the device (SPIN's consistency rule, §4), then the pins go.
void Cache::DirectRead::finish() {
  started_.reset();
  if (op_.status.is_ok()) {
    for (const auto& [b, w] : pins_) {
      c_.copy_out(w, 0, op_.data + (b - op_.block) * c_.line_bytes_, c_.line_bytes_);
    }
    if (pins_.size() < op_.count) {
      c_.count(kBypassed, uint64_t{op_.count} * c_.line_bytes_);
    } else {
      c_.count(kHits, op_.count);
    }
  }
  c_.unpin(pins_);
  pins_.clear();
}

// 1. Drop the clean cached lines of the range that nobody holds: the write replaces each
//    whole, so keeping them would cost a copy into the line and, the line then Dirty, a
//    second device write of the same data later (the kernel's direct I/O drops its cached
//    pages the same way). Pin the others and put the new data in them (Dirty): no eviction
//    or in-flight flush of their old data can then be the last word on the device. A Dirty
//    line is not dropped: were this write to fail, its data, written by a call that
//    succeeded, would be lost.
// 2. Write the device.
// 3. A fill that started before the device write finished (read-ahead, a set-full fallback
//    elsewhere, a read of a line step 1 dropped) may hold old data: wait for it and
//    overwrite it too.
Status Cache::write_direct(uint64_t first, uint64_t count_lines, const void* buf,
                           nvme::Priority p) {
  const auto* src = static_cast<const uint8_t*>(buf);
  const auto pins = pin_range(first, count_lines, true);
  for (const auto& [b, w] : pins) {
    copy_in(w, 0, src + (b - first) * line_bytes_, line_bytes_);
    mark_dirty(meta_[w], port::Order::kRelease);
  }
  Backend::Op op;
  op.block = first;
  op.count = static_cast<uint32_t>(count_lines);
  op.priority = p;
  op.write = true;
  op.data = const_cast<uint8_t*>(src);
  b_.io(&op, 1);
  if (op.status.is_ok()) {
    size_t next_pin = 0;
    for (uint64_t b = first; b < first + count_lines; ++b) {
      if (next_pin < pins.size() && pins[next_pin].first == b) {
        // Dirty again now that the device has this write: another writer of the block may
        // have copied into the line after us and had the line written back before our device
        // write landed, which would leave the line clean over different data on the device.
        // Marked after our write, the line (the last copy into it) is written once more.
        mark_dirty(meta_[pins[next_pin].second], port::Order::kRelease);
        ++next_pin;
        continue;
      }
      refresh_after_direct_write(b, src + (b - first) * line_bytes_);
    }
    count(kBypassed, count_lines * line_bytes_);
  }
  unpin(pins);
  return op.status;
}

void Cache::refresh_after_direct_write(uint64_t block, const uint8_t* data) {
  const uint32_t set = set_of(block);
  SetMeta& sm = sets_[set];
  for (;;) {
    sm.lock.lock();
    const int w = probe(set, block);
    if (w < 0) {
      sm.lock.unlock();
      return;
    }
    LineMeta& m = meta_[w];
    // Pinned, the line keeps its block once the lock is dropped.
    const uint32_t s = m.state.fetch_add(1, port::Order::kAcquire);
    sm.lock.unlock();
    if (!(s & kBusy)) {
      if (s & kValid) {
        // Outside the set lock: the copy may wait for a write-back of the line, whose
        // flusher may want this set's lock before it sends its writes.
        copy_in(static_cast<uint32_t>(w), 0, data, line_bytes_);
        mark_dirty(m, port::Order::kRelease);
      }
      m.state.fetch_sub(1, port::Order::kRelease);
      return;
    }
    // A fill is in flight (it holds no set lock): wait for it, then look again.
    wait_not_busy(m, block);
    m.state.fetch_sub(1, port::Order::kRelease);
  }
}

void Cache::prefetch(uint64_t first, uint64_t count_lines) {
  const uint64_t end = std::min(first + count_lines, b_.line_count());
  for (uint64_t b = first; b < end; b += kWarp) {
    Lane lanes[kWarp];
    LineRef refs[kWarp];
    const int n = static_cast<int>(std::min<uint64_t>(kWarp, end - b));
    for (int i = 0; i < n; ++i)
      lanes[i] = Lane{b + static_cast<uint64_t>(i), Intent::kRead, nullptr};
    acquire_lanes(lanes, n, refs, /*prefetch=*/true);
    release(lanes, n, refs, nullptr);
  }
}

void Cache::note_read(ReadStream* st, uint64_t block, uint64_t count_lines) {
  const bool sequential = block == st->next;
  st->run = sequential ? st->run + count_lines : count_lines;
  if (!sequential) st->ahead_until = 0;
  st->next = block + count_lines;
  if (!st->readahead || o_.readahead_lines == 0 || !sequential) return;
  // Keep a window of readahead_lines ahead of the reader; top it up when half is used.
  const uint64_t window = o_.readahead_lines;
  if (st->ahead_until > st->next && st->ahead_until - st->next >= window / 2) return;
  const uint64_t from = std::max(st->next, st->ahead_until);
  const uint64_t to = std::min(st->next + window, b_.line_count());
  if (from >= to) return;
  st->ahead_until = to;
  if (ra_) {
    ra_->request(from, to - from);
  } else {
    prefetch(from, to - from);
  }
}

void Cache::drain_readahead() {
  if (ra_) ra_->drain();
}

uint8_t* Cache::Cursor::get(uint64_t block) {
  if (held_ && lane_.block == block) return ref_.data;
  reset();
  lane_ = Lane{block, intent_ == Intent::kWriteFull ? Intent::kWrite : intent_, nullptr};
  if (c_.acquire_scalar(&lane_, &ref_) != 0) return nullptr;
  held_ = true;
  return ref_.data;
}

void Cache::Cursor::reset() {
  if (!held_) return;
  const bool w = wrote_;
  c_.release(&lane_, 1, &ref_, &w);
  held_ = false;
  wrote_ = false;
}

}  // namespace warpfs::cache
