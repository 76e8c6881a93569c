// FUSE over io_uring (Linux 6.14, FUSE 7.42) beside libfuse 3.14, which does not speak it:
// the transport `-o io_uring` selects in warpfs and warpfs-null (fuse_session.h's
// SessionLoop starts it after INIT). Each ring entry is a pair of buffers registered with the
// kernel once (FUSE_IO_URING_CMD_REGISTER): a header (struct RingHeader) and a payload as
// large as the largest request. The kernel copies a request into a free entry of the queue
// of the CPU its caller runs on and completes that entry's command; the daemon answers into
// the same buffers and hands the entry back with one command that also fetches the next
// request (FUSE_IO_URING_CMD_COMMIT_AND_FETCH). One io_uring_enter per request, where
// /dev/fuse costs a read and a writev, and no thread that another CPU's request wakes.
// The kernel's design: Documentation/filesystems/fuse-io-uring.rst.
//
// What stays on /dev/fuse: INIT, FORGET, INTERRUPT and notifications (the kernel sends the
// first three there; replies with unique 0 cannot go through a ring). SessionLoop keeps its
// /dev/fuse workers for them. Once the INIT reply has asked for the transport, the kernel
// holds every new request until each queue has an entry, or until a registration fails,
// which turns the transport off for the connection and sends the held requests to
// /dev/fuse. So whatever can fail is set up before INIT (prepare()), and a start that cannot
// give every queue a thread withdraws the transport that way.
//
// libfuse still decodes and dispatches every request: a fetched request is laid out as
// /dev/fuse would have delivered it (header, the opcode's fixed part, payload) in front of
// the payload, with no copy of the payload, and handed to fuse_session_process_buf. The
// handler's reply reaches the session's custom writev (fuse_session_custom_io), which copies
// it into the entry when it answers the request this thread is processing, and writes it to
// /dev/fuse otherwise. Every reply goes through that writev while FUSE_CAP_SPLICE_WRITE is
// off (negotiate() keeps it off: libfuse 3.14 splices a reply past the writev only with it).
// So a handler must answer on the thread that called it, before it returns (every handler of
// both daemons does): an entry whose handler returned without an answer is handed back with
// EIO. And the writev reports success once the answer is in the entry: libfuse's cleanup
// after a reply the kernel refuses (fuse_reply_open returning -ENOENT for a request the
// kernel has ended meanwhile; the handler then releases what the open took) never runs over
// the ring. The kernel's refusal comes back as the commit's error instead, which ends the
// session (below), so nothing is left open unnoticed.
//
// Limits of this transport, which is a measured prototype (the data-path benchmarks in
// bench/fs/run.sh, warpfs_uring and null_uring): a handler that waits for another request
// of the same CPU's queue waits for one of that queue's other entries, and there are only
// io_uring_depth of them. A data-range invalidation does, where a shared mapping has dirty
// pages in the range (the kernel writes them back first): warpfs sends one after an
// O_DIRECT write into a file also open cached and after copy_file_range, and routinely
// under the writeback cache, with which it therefore refuses the transport. A fatal ring
// error (an io_uring_enter that fails, a commit the kernel refuses) ends the session, as
// libfuse's own transport does, rather than leave a queue without the entries its requests
// wait for. At stop() the last answers are handed back with commands that also fetch: a
// request the kernel puts in an entry then is never read, and its caller gets ECONNABORTED
// when the session's unmount aborts the connection, as a request left unread on /dev/fuse
// does.
//
// Thread safety: prepare(), start() and stop() are called by one thread (the session loop's
// caller); each ring thread owns its Uring and its Entry; what they share is read-only after
// start() (o_, stop_fd_, the entries' memory, each thread its own slice) or says at its
// declaration what keeps it safe. The includer defines FUSE_USE_VERSION (312).
#pragma once

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace warpfs::daemon {

// The kernel's interface (include/uapi/linux/fuse.h of Linux 6.14), which Debian 12's
// headers predate.
constexpr uint64_t kFuseOverIoUring = uint64_t{1} << 41;  // INIT flag (flags2 bit 9)
constexpr uint32_t kRingCmdRegister = 1;
constexpr uint32_t kRingCmdCommitAndFetch = 2;
constexpr uint32_t kRingIovecs = 2;  // header, payload
struct RingEntInOut {
  uint64_t flags;
  uint64_t commit_id;   // the request's unique, named again in the commit
  uint32_t payload_sz;  // bytes of the payload used, either way
  uint32_t padding;
  uint64_t reserved;
};
struct RingHeader {
  char in_out[128];  // fuse_in_header from the kernel, fuse_out_header back
  char op_in[128];   // the opcode's fixed part (in_args[0]; empty for name-only requests)
  RingEntInOut ent;
};
struct RingCmdReq {  // in the SQE's command area
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};
static_assert(sizeof(RingHeader) == 288 && sizeof(RingCmdReq) == 24, "the kernel's layout");

// A minimal io_uring with 128-byte SQEs (what IORING_OP_URING_CMD's 80-byte command area
// needs), used by one thread only (IORING_SETUP_SINGLE_ISSUER): no locks. Task work (the
// kernel copying a request into an entry, or taking an answer) runs when that thread enters
// the kernel to wait (IORING_SETUP_DEFER_TASKRUN), not as an interruption elsewhere.
class Uring {
 public:
  Uring() = default;
  Uring(const Uring&) = delete;
  Uring& operator=(const Uring&) = delete;
  ~Uring() {
    if (sqes_ != MAP_FAILED) munmap(sqes_, sqes_bytes_);
    if (rings_ != MAP_FAILED) munmap(rings_, rings_bytes_);
    if (fd_ >= 0) ::close(fd_);
  }

  // Returns 0 or a negative errno. The ring starts disabled: the thread that calls enable()
  // is the one that submits (IORING_SETUP_SINGLE_ISSUER), so a ring set up in one thread can
  // be handed to another.
  int setup(unsigned entries) {
    io_uring_params p{};
    p.flags = IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
              IORING_SETUP_R_DISABLED;
    fd_ = static_cast<int>(syscall(__NR_io_uring_setup, entries, &p));
    if (fd_ < 0) return -errno;
    if (!(p.features & IORING_FEAT_SINGLE_MMAP)) return -ENOSYS;  // Linux 5.4 and later have it
    const size_t sq_bytes = p.sq_off.array + p.sq_entries * sizeof(uint32_t);
    const size_t cq_bytes = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    rings_bytes_ = sq_bytes > cq_bytes ? sq_bytes : cq_bytes;
    rings_ = mmap(nullptr, rings_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                  IORING_OFF_SQ_RING);
    if (rings_ == MAP_FAILED) return -errno;
    sqes_bytes_ = p.sq_entries * 2 * sizeof(io_uring_sqe);  // SQE128: two slots each
    sqes_ = mmap(nullptr, sqes_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                 IORING_OFF_SQES);
    if (sqes_ == MAP_FAILED) return -errno;
    char* r = static_cast<char*>(rings_);
    sq_head_ = reinterpret_cast<unsigned*>(r + p.sq_off.head);
    sq_tail_ = reinterpret_cast<unsigned*>(r + p.sq_off.tail);
    sq_mask_ = *reinterpret_cast<unsigned*>(r + p.sq_off.ring_mask);
    sq_entries_ = p.sq_entries;
    sq_array_ = reinterpret_cast<unsigned*>(r + p.sq_off.array);
    cq_head_ = reinterpret_cast<unsigned*>(r + p.cq_off.head);
    cq_tail_ = reinterpret_cast<unsigned*>(r + p.cq_off.tail);
    cq_mask_ = *reinterpret_cast<unsigned*>(r + p.cq_off.ring_mask);
    cqes_ = reinterpret_cast<io_uring_cqe*>(r + p.cq_off.cqes);
    tail_ = *sq_tail_;
    return 0;
  }

  // Makes the calling thread the ring's submitter. Returns 0 or a negative errno.
  int enable() {
    const long rc = syscall(__NR_io_uring_register, fd_, IORING_REGISTER_ENABLE_RINGS, nullptr, 0);
    return rc < 0 ? -errno : 0;
  }

  // A zeroed SQE for the next submission, or null while the ring holds `entries` SQEs the
  // kernel has not consumed.
  io_uring_sqe* next_sqe() {
    if (tail_ - consumed() == sq_entries_) return nullptr;
    const unsigned idx = tail_ & sq_mask_;
    auto* sqe =
        reinterpret_cast<io_uring_sqe*>(static_cast<char*>(sqes_) + idx * 2 * sizeof(io_uring_sqe));
    std::memset(sqe, 0, 2 * sizeof(io_uring_sqe));
    sq_array_[idx] = idx;
    ++tail_;
    return sqe;
  }

  // SQEs filled that the kernel has not consumed yet.
  unsigned pending() const { return tail_ - consumed(); }

  // Publishes the SQEs filled, submits every one the kernel has not consumed and, with
  // `wait`, waits for a completion. Returns 0 or a negative errno; whatever the result, an
  // SQE the kernel did not consume stays in the ring for the next call (-EINTR: a signal,
  // -EAGAIN and -EBUSY: the kernel is short of memory or completion room; call again).
  int enter(bool wait) {
    // Release: the SQEs' contents before the tail that hands them over.
    __atomic_store_n(sq_tail_, tail_, __ATOMIC_RELEASE);
    const long rc = syscall(__NR_io_uring_enter, fd_, pending(), wait ? 1 : 0,
                            wait ? IORING_ENTER_GETEVENTS : 0, nullptr, 0);
    return rc < 0 ? -errno : 0;
  }

  // Calls f(cqe) for each completion posted, then releases them to the kernel.
  template <class F>
  void reap(F&& f) {
    unsigned head = *cq_head_;
    // Acquire: the completions' contents, written before the kernel moved the tail.
    const unsigned tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
    for (; head != tail; ++head) f(cqes_[head & cq_mask_]);
    // Release: done reading those entries before the kernel may reuse them.
    __atomic_store_n(cq_head_, head, __ATOMIC_RELEASE);
  }

 private:
  // Acquire: the kernel moves the head as it consumes (in this thread's io_uring_enter).
  unsigned consumed() const { return __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE); }

  int fd_ = -1;
  void* rings_ = MAP_FAILED;
  size_t rings_bytes_ = 0;
  void* sqes_ = MAP_FAILED;
  size_t sqes_bytes_ = 0;
  unsigned* sq_head_ = nullptr;
  unsigned* sq_tail_ = nullptr;
  unsigned sq_mask_ = 0;
  unsigned sq_entries_ = 0;
  unsigned* sq_array_ = nullptr;
  unsigned* cq_head_ = nullptr;
  unsigned* cq_tail_ = nullptr;
  unsigned cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
  unsigned tail_ = 0;  // the SQ tail with the SQEs filled since the last enter()
};

// Where the daemon's receive buffers come from: SessionLoop's (fuse_session.h) and the ring
// entries' payloads. warpfs gives memory its device moves data from without a copy (DMA memory
// under NVMe): a large FUSE_WRITE's data then goes from the buffer the kernel filled straight
// to the device, with no bounce copy. `alloc` may return null: that buffer comes from the heap.
struct ReceiveMemory {
  void* (*alloc)(void* ctx, size_t bytes) = nullptr;
  void (*free)(void* ctx, void* p, size_t bytes) = nullptr;
  void* ctx = nullptr;
};

// The ring threads of one session: one queue for each possible CPU (the kernel's layout),
// `per_queue` threads for each online CPU's queue and one for any other (the kernel needs
// an entry in every queue before it uses any), one entry per thread: a handler that waits
// for the device keeps its thread, and an entry parked behind it would wait too. Threads of
// queue q run on CPU q where `pin`.
class RingTransport {
 public:
  static constexpr unsigned kMaxPerQueue = 64;

  struct Options {
    unsigned per_queue = 2;  // 1..kMaxPerQueue
    bool pin = false;
    // The kernel's max_payload_sz or more: max_write, or max_pages pages if that is more.
    size_t payload_bytes = 0;
    // Where the entries' memory comes from (one allocation for all of them).
    ReceiveMemory mem;
    // Called once, from a ring thread, when the transport fails past recovery: it ends the
    // session (fuse_session_exit, then wakes whatever waits for the session to end).
    void (*fatal)(void* ctx) = nullptr;
    void* fatal_ctx = nullptr;
  };

  RingTransport(fuse_session* se, const Options& o) : se_(se), o_(o) {}
  RingTransport(const RingTransport&) = delete;
  RingTransport& operator=(const RingTransport&) = delete;
  ~RingTransport() { stop(); }

  // Before INIT, in the thread that will call start(): sets up what the threads need (each
  // thread's ring, disabled until its thread enables it; the entries' memory; the stop
  // eventfd) and routes the session's replies through the rings (the custom writev). Once
  // INIT has asked for the transport, the kernel holds every new request until each queue
  // has an entry, so what can fail is found out here, while /dev/fuse can still serve
  // everything: io_uring refused (kernel.io_uring_disabled, a seccomp filter), no memory.
  // Returns 0, or a negative errno with `*what` saying which step failed.
  int prepare(const char** what) {
    queues_ = static_cast<unsigned>(possible_cpus().size());
    const std::vector<bool> online = cpu_list("/sys/devices/system/cpu/online");
    const unsigned per_queue =
        o_.per_queue < 1 ? 1 : (o_.per_queue > kMaxPerQueue ? kMaxPerQueue : o_.per_queue);
    // Thread i < queues_ serves queue i: the first queues_ threads give every queue an entry.
    std::vector<uint16_t> qids;
    for (unsigned q = 0; q < queues_; ++q) qids.push_back(static_cast<uint16_t>(q));
    for (unsigned k = 1; k < per_queue; ++k) {
      for (unsigned q = 0; q < queues_; ++q) {
        if (online.empty() || (q < online.size() && online[q])) {
          qids.push_back(static_cast<uint16_t>(q));
        }
      }
    }
    *what = "allocating the entries";
    if (const int rc = alloc_entries(static_cast<unsigned>(qids.size())); rc != 0) return rc;
    threads_.reserve(qids.size());
    for (size_t i = 0; i < qids.size(); ++i) {
      auto t = std::make_unique<Thread>();
      t->owner = this;
      t->qid = qids[i];
      t->entry = &entries_[i];
      // A thread has at most two commands in the kernel (its entry's, the stop poll) and one
      // SQE filled between enters: four SQEs (a power of two) hold them all, and the
      // completion ring the kernel sizes at twice that never overflows.
      *what = "setting up a ring";
      if (const int rc = t->ring.setup(4); rc != 0) return rc;
      threads_.push_back(std::move(t));
    }
    *what = "creating the stop eventfd";
    stop_fd_ = eventfd(0, EFD_CLOEXEC);
    if (stop_fd_ < 0) return -errno;
    *what = "routing replies";
    static const fuse_custom_io io = {&RingTransport::writev, &RingTransport::read, nullptr,
                                      nullptr};
    return fuse_session_custom_io(se_, &io, fuse_session_fd(se_));
  }

  // After INIT asked for the transport: starts the threads. Returns 0, or a negative errno
  // once the transport has been withdrawn (requests go to /dev/fuse); fewer threads than
  // planned, but one for each queue, is not an error. A thread that cannot register logs
  // why and ends (the kernel then turns the transport off by itself).
  int start() {
    // Every signal blocked from a thread's first instruction: signals are the main thread's
    // (a stop signal must interrupt its wait, not a ring thread's io_uring_enter).
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    size_t started = 0;
    int err = 0;
    for (; started < threads_.size(); ++started) {
      Thread& t = *threads_[started];
      err = pthread_create(&t.thread, nullptr, &RingTransport::run, &t);
      if (err != 0) break;
      t.started = true;
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (err == 0) return 0;
    if (started >= queues_) {  // every queue has a thread: the ring works, a little shallower
      fuse_log(FUSE_LOG_ERR, "io_uring transport: %zu of %zu threads: %s\n", started,
               threads_.size(), std::strerror(err));
      return 0;
    }
    // A queue without an entry: the kernel would hold requests for it forever.
    withdraw(*threads_[started]);
    stop();
    return -err;
  }

  // Ends every thread (each finishes the request in hand and hands its answer back) and
  // joins them.
  void stop() {
    if (stop_fd_ >= 0) {
      const uint64_t one = 1;  // stays readable: every thread's poll sees it
      if (::write(stop_fd_, &one, sizeof one) != sizeof one) report(-errno, "stopping");
    }
    bool registered = keep_entries_;
    for (auto& t : threads_) {
      if (!t->started) continue;
      pthread_join(t->thread, nullptr);
      registered = registered || t->registered;
    }
    threads_.clear();  // closes the rings
    if (stop_fd_ >= 0) ::close(stop_fd_);
    stop_fd_ = -1;
    // Closing a ring cancels its registered entry asynchronously (io_ring_exit_work): memory
    // the kernel may still hold is left to the process's exit.
    keep_entries_ = registered;
    if (!registered) free_entries();
  }

  // The kernel's queues: one for each possible CPU (num_possible_cpus(): the last CPU of
  // /sys/devices/system/cpu/possible plus one), which may exceed the CPUs online.
  static std::vector<bool> possible_cpus() {
    std::vector<bool> cpus = cpu_list("/sys/devices/system/cpu/possible");
    if (cpus.empty()) {
      const long n = sysconf(_SC_NPROCESSORS_CONF);
      cpus.assign(n > 0 ? static_cast<size_t>(n) : 1, true);
    }
    return cpus;
  }

  // The CPUs a kernel CPU list file names ("0-3,6"), by id; empty if it cannot be read.
  static std::vector<bool> cpu_list(const char* path) {
    std::vector<bool> set;
    FILE* f = std::fopen(path, "re");
    if (f == nullptr) return set;
    char line[4096];
    if (std::fgets(line, sizeof line, f) != nullptr) {
      const char* p = line;
      while (*p >= '0' && *p <= '9') {
        char* end = nullptr;
        const unsigned long first = std::strtoul(p, &end, 10);
        unsigned long last = first;
        if (*end == '-') last = std::strtoul(end + 1, &end, 10);
        if (last < first || last >= 65536) break;  // not a CPU list
        if (set.size() <= last) set.resize(last + 1);
        for (unsigned long c = first; c <= last; ++c) set[c] = true;
        p = *end == ',' ? end + 1 : end;
      }
    }
    std::fclose(f);
    return set;
  }

  // Requests this process has answered through a ring (its stats file shows them).
  static uint64_t answered() { return answered_.load(std::memory_order_relaxed); }

 private:
  static constexpr uint64_t kStopTag = ~uint64_t{0};
  // Room in front of the payload for the header and fixed part a request is laid out with.
  static constexpr size_t kHeadroom = 4096;
  static constexpr size_t kPage = 4096;
  static constexpr size_t kHeaderStride = (sizeof(RingHeader) + 63) / 64 * 64;

  // One registered entry, used only by its thread.
  struct Entry {
    RingHeader* header = nullptr;  // in headers_
    char* block = nullptr;         // in blocks_: kHeadroom bytes, then the payload
    size_t payload_cap = 0;        // the payload's bytes
    iovec iov[kRingIovecs]{};
    uint64_t unique = 0;    // the request being processed
    bool answered = false;  // the writev hook has put its answer in the buffers
  };

  // Set up by prepare(); then its thread's alone until stop() joins it.
  struct Thread {
    RingTransport* owner = nullptr;
    pthread_t thread{};
    bool started = false;  // start() only
    uint16_t qid = 0;
    Entry* entry = nullptr;
    Uring ring;               // disabled until the thread enables it
    bool registered = false;  // the kernel may still hold the entry: read after the join
  };

  // The entry whose request this thread is processing: the writev hook answers it.
  static Entry*& current() {
    static thread_local Entry* e = nullptr;
    return e;
  }

  static ssize_t read(int fd, void* buf, size_t len, void*) { return ::read(fd, buf, len); }

  // libfuse's reply: [fuse_out_header, arguments...]. Into the current entry when it answers
  // that entry's request; to /dev/fuse otherwise (INIT, notifications, a reply from another
  // thread). The copies tolerate a reply whose data lies in the request's own payload.
  static ssize_t writev(int fd, iovec* iov, int count, void*) {
    Entry* e = current();
    if (e == nullptr || count < 1 || iov[0].iov_len < sizeof(fuse_out_header)) {
      return ::writev(fd, iov, count);
    }
    fuse_out_header out;
    std::memcpy(&out, iov[0].iov_base, sizeof out);
    if (out.unique != e->unique || e->answered) return ::writev(fd, iov, count);
    const size_t cap = e->payload_cap;
    char* payload = e->block + kHeadroom;
    size_t used = 0;
    bool fits = true;
    auto put = [&](const char* p, size_t n) {
      if (!fits || n == 0) return;
      if (n > cap - used) {
        fits = false;
        return;
      }
      std::memmove(payload + used, p, n);
      used += n;
    };
    put(static_cast<const char*>(iov[0].iov_base) + sizeof out, iov[0].iov_len - sizeof out);
    for (int i = 1; i < count; ++i) put(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
    ssize_t total = static_cast<ssize_t>(sizeof out + used);
    if (!fits) {  // cannot happen with the negotiated sizes; answer rather than hang
      out.error = -EIO;
      used = 0;
      total = static_cast<ssize_t>(out.len);
    }
    out.len = static_cast<uint32_t>(sizeof out + used);
    std::memcpy(e->header->in_out, &out, sizeof out);
    e->header->ent.payload_sz = static_cast<uint32_t>(used);
    e->answered = true;
    return total;
  }

  // Queues a command for entry `e`; false when the ring is full, which its sizing rules out.
  bool queue_cmd(Uring& ring, uint32_t op, uint16_t qid, Entry* e, uint64_t commit_id) {
    io_uring_sqe* sqe = ring.next_sqe();
    if (sqe == nullptr) return false;
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = fuse_session_fd(se_);
    sqe->cmd_op = op;
    sqe->user_data = reinterpret_cast<uint64_t>(e);
    if (op == kRingCmdRegister) {
      sqe->addr = reinterpret_cast<uint64_t>(e->iov);
      sqe->len = kRingIovecs;
    }
    RingCmdReq req{};
    req.commit_id = commit_id;
    req.qid = qid;
    std::memcpy(sqe->cmd, &req, sizeof req);
    return true;
  }

  // The entries' memory, in two allocations whatever their number: the headers, and the
  // payload blocks (from o_.mem where it gives memory, so one DMA region for all of them).
  int alloc_entries(unsigned n) {
    block_bytes_ = (kHeadroom + o_.payload_bytes + kPage - 1) / kPage * kPage;
    blocks_bytes_ = block_bytes_ * n;
    if (o_.mem.alloc != nullptr)
      blocks_ = static_cast<char*>(o_.mem.alloc(o_.mem.ctx, blocks_bytes_));
    blocks_dma_ = blocks_ != nullptr;
    void* p = nullptr;
    if (blocks_ == nullptr) {
      if (posix_memalign(&p, kPage, blocks_bytes_) != 0) return -ENOMEM;
      blocks_ = static_cast<char*>(p);
    }
    // Each header on cache lines of its own: the kernel fills one entry's from one CPU
    // while another entry's thread reads its own on another.
    if (posix_memalign(&p, kPage, kHeaderStride * n) != 0) {
      free_entries();
      return -ENOMEM;
    }
    headers_ = static_cast<char*>(p);
    std::memset(headers_, 0, kHeaderStride * n);
    entries_.assign(n, Entry{});
    for (unsigned i = 0; i < n; ++i) {
      Entry& e = entries_[i];
      e.header = reinterpret_cast<RingHeader*>(headers_ + kHeaderStride * i);
      e.block = blocks_ + block_bytes_ * i;
      e.payload_cap = o_.payload_bytes;
      e.iov[0] = {e.header, sizeof(RingHeader)};
      e.iov[1] = {e.block + kHeadroom, o_.payload_bytes};
    }
    return 0;
  }

  void free_entries() {
    entries_.clear();
    std::free(headers_);
    headers_ = nullptr;
    if (blocks_ != nullptr && blocks_dma_) {
      o_.mem.free(o_.mem.ctx, blocks_, blocks_bytes_);
    } else {
      std::free(blocks_);
    }
    blocks_ = nullptr;
  }

  // Lays the fetched request out as /dev/fuse delivers it, processes it, and queues the
  // answer with the fetch of the next request. Returns false if it cannot be queued.
  bool process(Uring& ring, Entry& e, uint16_t qid) {
    RingHeader& h = *e.header;
    fuse_in_header in;
    std::memcpy(&in, h.in_out, sizeof in);
    const uint64_t commit_id = h.ent.commit_id;
    const size_t payload = h.ent.payload_sz;
    e.unique = in.unique;
    e.answered = false;
    if (in.len >= sizeof in + payload && in.len - sizeof in - payload <= sizeof h.op_in &&
        payload <= o_.payload_bytes) {
      const size_t fixed = in.len - sizeof in - payload;
      char* start = e.block + kHeadroom - fixed - sizeof in;
      std::memcpy(start, &in, sizeof in);
      std::memcpy(start + sizeof in, h.op_in, fixed);
      fuse_buf buf{};
      buf.mem = start;
      buf.size = in.len;
      current() = &e;
      fuse_session_process_buf(se_, &buf);
      current() = nullptr;
    }
    if (!e.answered) {  // malformed, or a handler that did not answer: EIO, entry kept
      fuse_out_header out{};
      out.len = sizeof out;
      out.error = -EIO;
      out.unique = in.unique;
      std::memcpy(h.in_out, &out, sizeof out);
      h.ent.payload_sz = 0;
    } else {
      answered_.fetch_add(1, std::memory_order_relaxed);
    }
    return queue_cmd(ring, kRingCmdCommitAndFetch, qid, &e, commit_id);
  }

  static void* run(void* arg) {
    auto* t = static_cast<Thread*>(arg);
    t->owner->serve(*t);
    return nullptr;
  }

  void serve(Thread& t) {
    pthread_setname_np(pthread_self(), "fuse-ring");  // what ps and the tests look for
    if (o_.pin) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(t.qid, &set);
      (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // offline CPU: unpinned
    }
    if (const int rc = t.ring.enable(); rc != 0) {  // cannot fail on a ring set up disabled
      fatal(rc, "enabling a ring");
      return;
    }
    t.registered = loop(t.ring, *t.entry, t.qid);
  }

  // Makes the kernel give the transport up for this connection, with `t`'s ring (its thread
  // never started): a registration it refuses (a queue that does not exist) turns FUSE over
  // io_uring off and wakes the requests held for it, which go to /dev/fuse then. Only while
  // some queue has no entry yet (the kernel has not switched).
  void withdraw(Thread& t) {
    Entry e;
    if (t.ring.enable() == 0 && queue_cmd(t.ring, kRingCmdRegister, 0xffff, &e, 0)) {
      int rc;
      while ((rc = t.ring.enter(true)) != 0 && retry(rc)) {
      }
      if (rc == 0) {
        int res = 0;
        t.ring.reap([&](const io_uring_cqe& c) { res = c.res; });
        if (res < 0) {
          fuse_log(FUSE_LOG_ERR, "io_uring transport: withdrawn: requests go to /dev/fuse\n");
          return;
        }
      }
    }
    fatal(-EIO, "withdrawing from the kernel");
  }

  static bool retry(int rc) { return rc == -EINTR || rc == -EAGAIN || rc == -EBUSY; }

  // Registers the entry and serves it until the kernel ends it (unmount), stop() or a fatal
  // error. Returns whether the entry may still be registered.
  bool loop(Uring& ring, Entry& e, uint16_t qid) {
    queue_cmd(ring, kRingCmdRegister, qid, &e, 0);
    io_uring_sqe* poll = ring.next_sqe();
    poll->opcode = IORING_OP_POLL_ADD;
    poll->fd = stop_fd_;
    poll->poll32_events = POLLIN;
    poll->user_data = kStopTag;
    bool live = true, stopping = false, fetched = false, failed = false;
    while (live && !stopping) {
      if (const int rc = ring.enter(true); rc < 0) {
        if (!retry(rc)) {
          fatal(rc, "waiting for a request");
          return true;
        }
        if (rc != -EINTR) sched_yield();  // let the kernel free what it lacks
      }
      ring.reap([&](const io_uring_cqe& c) {
        if (c.user_data == kStopTag) {
          stopping = true;
        } else if (!live) {
          // Nothing else is in flight once the entry has ended.
        } else if (c.res == -ENOTCONN || c.res == -ECONNABORTED) {
          live = false;  // unmounted: the kernel ends every entry
        } else if (c.res < 0 && !fetched) {
          // The kernel refused the registration: this entry serves nothing, and if a queue
          // is left without any, requests stay on /dev/fuse.
          report(c.res, "registering an entry");
          live = false;
        } else if (c.res < 0) {
          fatal(c.res, "handing an answer back");
          live = false;
          failed = true;
        } else {
          fetched = true;
          if (!process(ring, e, qid)) {
            fatal(-EOVERFLOW, "queueing an answer");
            live = false;
            failed = true;
          }
        }
      });
    }
    // The answer to the last request processed may still sit in the ring (its completion
    // and the stop came together): hand it to the kernel before the ring closes.
    for (int tries = 0; live && ring.pending() > 0 && tries < 1000; ++tries) {
      const int rc = ring.enter(false);
      if (rc < 0 && !retry(rc)) {
        report(rc, "handing the last answer back");
        break;
      }
      if (rc < 0 && rc != -EINTR) sched_yield();  // let the kernel free what it lacks
    }
    return live || failed;  // after a failure, whatever the kernel holds stays allocated
  }

  // One line for the whole transport.
  void report(int rc, const char* what) {
    std::lock_guard<std::mutex> g(report_mu_);
    if (reported_) return;
    reported_ = true;
    fuse_log(FUSE_LOG_ERR, "io_uring transport: %s: %s\n", what, std::strerror(-rc));
  }

  // An error the transport does not recover from: ends the session, once.
  void fatal(int rc, const char* what) {
    if (fatal_.exchange(true, std::memory_order_relaxed)) return;  // the first one says it
    fuse_log(FUSE_LOG_ERR, "io_uring transport: %s: %s: ending the session\n", what,
             std::strerror(-rc));
    fuse_session_exit(se_);
    if (o_.fatal != nullptr) o_.fatal(o_.fatal_ctx);
  }

  fuse_session* const se_;
  const Options o_;
  // Written by start() before any thread exists, freed by stop() after the last has ended.
  unsigned queues_ = 0;
  int stop_fd_ = -1;
  std::vector<Entry> entries_;  // entries_[i] is thread i's alone
  bool keep_entries_ = false;   // stop() found an entry the kernel may hold: never freed
  char* headers_ = nullptr;     // kHeaderStride bytes an entry
  char* blocks_ = nullptr;
  size_t block_bytes_ = 0, blocks_bytes_ = 0;
  bool blocks_dma_ = false;                       // blocks_ from o_.mem.alloc, else posix_memalign
  std::vector<std::unique_ptr<Thread>> threads_;  // start() and stop() only (one caller)
  static inline std::atomic<uint64_t> answered_{0};  // relaxed: a count, ordering nothing
  std::atomic<bool> fatal_{false};  // relaxed: only which thread reports, ordering nothing
  std::mutex report_mu_;            // guards reported_
  bool reported_ = false;
};

}  // namespace warpfs::daemon
