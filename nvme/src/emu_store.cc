#include "emu_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>

#include "warpfs/nvme/port.h"

namespace warpfs::nvme {
namespace {

class RamStore final : public BackingStore {
 public:
  explicit RamStore(uint64_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~RamStore() override {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  bool ok() const { return data_ != nullptr; }
  uint64_t bytes() const override { return bytes_; }
  Status read(uint64_t off, void* buf, size_t len) override {
    if (off + len > bytes_) return Status::error(Code::kIoError, "read past end of RAM store");
    std::memcpy(buf, data_ + off, len);
    return Status::ok();
  }
  Status write(uint64_t off, const void* buf, size_t len) override {
    if (off + len > bytes_) return Status::error(Code::kIoError, "write past end of RAM store");
    std::memcpy(data_ + off, buf, len);
    return Status::ok();
  }
  Status punch(uint64_t off, size_t len) override {
    if (off + len > bytes_) return Status::error(Code::kIoError, "punch past end of RAM store");
    std::memset(data_ + off, 0, len);
    return Status::ok();
  }
  Status sync() override { return Status::ok(); }

 private:
  uint64_t bytes_;
  uint8_t* data_;
};

// Copies out of a mapped image survive the SIGBUS a mapped page raises when it cannot be
// had (an I/O error below the file, the file truncated under the mapping, no room for the page
// of a hole on a full tmpfs): the copy reports failure, and the caller reads with pread, which
// says why. The handler is process-wide; a SIGBUS outside a guarded copy puts back whatever
// handled SIGBUS before (or the default action, which kills the process as ever) and goes
// there.
// t_guard: this thread's copy in progress, read by the handler on the same thread.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* volatile t_guard = nullptr;
struct sigaction g_chained_sigbus;  // written once, before the handler can run

void on_sigbus(int, siginfo_t* info, void*) {
  // A fault (si_code > 0; kill(2) and friends send <= 0) inside a guarded copy is ours.
  if (sigjmp_buf* j = t_guard; j != nullptr && info != nullptr && info->si_code > 0) {
    siglongjmp(*j, 1);
  }
  // Anyone else's: the handler before ours takes over, with its own flags and mask (a VFIO
  // device's teardown relies on SA_RESETHAND). A fault is raised again, with its address,
  // when the access re-runs on return; a sent signal is sent again.
  sigaction(SIGBUS, &g_chained_sigbus, nullptr);
  if (info == nullptr || info->si_code <= 0) raise(SIGBUS);
}

// ThreadSanitizer cannot leave a synchronous signal's handler by siglongjmp (the process dies
// of the SIGBUS all the same), so a build with it reads and writes the image with pread and
// pwrite only.
constexpr bool kMapImages = !WARPFS_TSAN;

bool install_sigbus_guard() {
  if (!kMapImages) return false;
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    // SA_NODEFER: a copy left by siglongjmp (sigsetjmp saves no mask: no system call per copy)
    // must not leave SIGBUS blocked, or the next one would kill the process.
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ok = sigaction(SIGBUS, &sa, &g_chained_sigbus) == 0;
  });
  return ok;
}

// memcpy to or from a mapping; false if a page could not be had (then part of dst may be
// written).
bool copy_guarded(void* dst, const void* src, size_t len) {
  // A thread with SIGBUS blocked (the io_uring transport's start with every signal blocked)
  // would be killed by the fault instead of entering the handler: unblock it, once a thread.
  // Blocking SIGBUS protects from nothing: a fault raised while it is blocked is fatal.
  thread_local bool unblocked = false;
  if (!unblocked) {
    sigset_t bus;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    unblocked = pthread_sigmask(SIG_UNBLOCK, &bus, nullptr) == 0;
    if (!unblocked) return false;
  }
  sigjmp_buf j;
  if (sigsetjmp(j, 0) != 0) {
    t_guard = nullptr;
    return false;
  }
  t_guard = &j;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the copy stays inside the guard
  std::memcpy(dst, src, len);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return true;
}

class FileStore final : public BackingStore {
 public:
  // Data moves through a shared mapping of the image where one can be made: a 4 KiB read or
  // write costs a memcpy rather than a pread or pwrite (a system call and a page cache lookup
  // per page: a fifth of the daemon's CPU in 4 KiB random reads). As DMA from a real device
  // costs the host's CPU nothing, the emulated media should cost as little as it can. The
  // page cache is one: pread, pwrite, hole punches and fdatasync see and cover the mapping's
  // pages. A copy that faults (see copy_guarded) is done again with pread or pwrite.
  //
  // Large writes (kPopulateMinBytes or more) into pages the mapping has not had yet: copied
  // into the mapping they take a page fault per 4 KiB page, each allocating and clearing a
  // page (67 % of the daemon's samples in 1 MiB appends on a tmpfs image);
  // madvise(MADV_POPULATE_WRITE) first saves the faults but not the page-table walk (74 % of
  // the samples). The kernel's write path allocates the pages without the page tables: on a
  // tmpfs image (1 GiB in 1 MiB writes, 2-core VM) pwrite ran at 2.4 GB/s into holes, populate
  // and copy at 1.3, faulting copies at 1.0. So the store keeps two bits per region, of what
  // it did there since the open or the last punch: a large write that touches a region with
  // neither goes through pwrite, and the regions it touches become `written_`; a later
  // large write there populates them (the page tables alone: populate and copy 2.6 GB/s on
  // present pages, pwrite 4.8) and marks them `populated_`, whose writes are a copy alone
  // (10.6 GB/s) with no madvise (which walks present pages too: +31 µs per MiB).
  FileStore(int fd, uint64_t bytes, bool writable) : fd_(fd), bytes_(bytes) {
    if (install_sigbus_guard()) {
      void* p =
          mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        map_ = static_cast<uint8_t*>(p);
        writable_ = writable;
      }
    }
    if (writable_) {
      const uint64_t regions = (bytes + kRegionBytes - 1) / kRegionBytes;
      populated_ = std::make_unique<std::atomic<uint64_t>[]>((regions + 63) / 64);
      written_ = std::make_unique<std::atomic<uint64_t>[]>((regions + 63) / 64);
    }
  }
  ~FileStore() override {
    if (map_ != nullptr) munmap(map_, bytes_);
    close(fd_);
  }
  uint64_t bytes() const override { return bytes_; }
  Status read(uint64_t off, void* buf, size_t len) override {
    if (mapped(off, len) && copy_guarded(buf, map_ + off, len)) return Status::ok();
    auto* p = static_cast<uint8_t*>(buf);
    while (len > 0) {
      ssize_t n = pread(fd_, p, len, static_cast<off_t>(off));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::error(Code::kIoError, "pread of the image file failed");
      if (n == 0) {  // a hole at the end of a short file reads as zeroes
        std::memset(p, 0, len);
        break;
      }
      p += n, off += static_cast<uint64_t>(n), len -= static_cast<size_t>(n);
    }
    return Status::ok();
  }
  Status write(uint64_t off, const void* buf, size_t len) override {
    if (writable_ && mapped(off, len) &&
        (len < kPopulateMinBytes || !first_large_write(off, len))) {
      if (len >= kPopulateMinBytes) populate(off, len);
      if (copy_guarded(map_ + off, buf, len)) return Status::ok();
    }
    const auto* p = static_cast<const uint8_t*>(buf);
    while (len > 0) {
      ssize_t n = pwrite(fd_, p, len, static_cast<off_t>(off));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::error(Code::kIoError, "pwrite of the image file failed");
      p += n, off += static_cast<uint64_t>(n), len -= static_cast<size_t>(n);
    }
    return Status::ok();
  }
  Status punch(uint64_t off, size_t len) override {
    if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(off),
                  static_cast<off_t>(len)) == 0) {
      forget_populated(off, len);  // the pages are gone from the mapping
      return Status::ok();
    }
    // Filesystems without hole punching: write zeroes instead.
    static const std::vector<uint8_t> zero(1 << 20, 0);
    while (len > 0) {
      size_t n = std::min(len, zero.size());
      Status s = write(off, zero.data(), n);
      if (!s.is_ok()) return s;
      off += n, len -= n;
    }
    return Status::ok();
  }
  Status sync() override {
    return fdatasync(fd_) == 0 ? Status::ok()
                               : Status::error(Code::kIoError, "fdatasync of the image failed");
  }

 private:
  static constexpr uint64_t kRegionBytes = 64 << 10;     // one bit of populated_, written_
  static constexpr size_t kPopulateMinBytes = 64 << 10;  // smaller writes just fault

  bool mapped(uint64_t off, size_t len) const {
    return map_ != nullptr && off <= bytes_ && len <= bytes_ - off;
  }
  static bool bit(const std::unique_ptr<std::atomic<uint64_t>[]>& map, uint64_t region) {
    return (map[region / 64].load(std::memory_order_relaxed) >> (region % 64)) & 1;
  }
  static void set_bit(const std::unique_ptr<std::atomic<uint64_t>[]>& map, uint64_t region) {
    map[region / 64].fetch_or(uint64_t{1} << (region % 64), std::memory_order_relaxed);
  }
  static void clear_bit(const std::unique_ptr<std::atomic<uint64_t>[]>& map, uint64_t region) {
    map[region / 64].fetch_and(~(uint64_t{1} << (region % 64)), std::memory_order_relaxed);
  }
  bool is_populated(uint64_t region) const { return bit(populated_, region); }
  // Whether a large write of [off, off + len) is the first the store sees in one of the
  // regions it touches (neither written_ nor populated_): then it goes through pwrite, and
  // every region it touches becomes written_, those at its ends too (else a write that is
  // not region-aligned would find its ends new again every time and never take the
  // mapping). REQUIRES: writable_, mapped(off, len).
  bool first_large_write(uint64_t off, size_t len) {
    const uint64_t end = off + len;
    bool first = false;
    for (uint64_t r = off / kRegionBytes; r * kRegionBytes < end && !first; ++r)
      first = !bit(written_, r) && !is_populated(r);
    if (!first) return false;
    for (uint64_t r = off / kRegionBytes; r * kRegionBytes < end; ++r) set_bit(written_, r);
    return true;
  }
  // Populates the regions of [off, off + len) not known to be, in runs; marks those the
  // populated span covers whole. REQUIRES: writable_, mapped(off, len).
  void populate(uint64_t off, size_t len) {
    if (!populate_works_.load(std::memory_order_relaxed)) return;
    const uint64_t end = off + len;
    for (uint64_t r = off / kRegionBytes; r * kRegionBytes < end;) {
      if (is_populated(r)) {
        ++r;
        continue;
      }
      uint64_t q = r + 1;
      while (q * kRegionBytes < end && !is_populated(q)) ++q;
      // The run's part of the write, widened to pages (madvise's unit; the mapping reaches
      // the page that holds the image's last byte).
      const uint64_t page = page_bytes_;
      const uint64_t from = std::max(off, r * kRegionBytes) / page * page;
      const uint64_t to = std::min(end, q * kRegionBytes);
      const uint64_t to_page = (to + page - 1) / page * page;
      if (madvise(map_ + from, to_page - from, MADV_POPULATE_WRITE) == 0) {
        for (uint64_t k = r; k < q; ++k) {
          if (k * kRegionBytes >= from && std::min((k + 1) * kRegionBytes, bytes_) <= to) {
            set_bit(populated_, k);
          }
        }
      } else if (errno == EINVAL) {
        populate_works_.store(false, std::memory_order_relaxed);  // a kernel before 5.14
        return;
      }
      // Else (no room for the pages, the file cut short under the mapping): the copy faults
      // and the write goes through pwrite, which says why.
      r = q;
    }
  }
  // Every region [off, off + len) touches may have lost its pages.
  void forget_populated(uint64_t off, size_t len) {
    if (!populated_ || len == 0) return;
    const uint64_t last = std::min(off + len - 1, bytes_ - 1) / kRegionBytes;
    for (uint64_t r = off / kRegionBytes; r <= last; ++r) {
      clear_bit(populated_, r);
      clear_bit(written_, r);
    }
  }
  int fd_;
  uint64_t bytes_;
  uint8_t* map_ = nullptr;  // the whole image; null: pread and pwrite only
  bool writable_ = false;   // map_ is writable too (not for a read-only open)
  // One bit per kRegionBytes of the image each: populated_, the mapping was populated there
  // for writing; written_, a large write went there through pwrite (the file has the pages,
  // the mapping's page tables may not). Hints only (any bit may be stale: the kernel can drop
  // mapped pages, another process can cut the file), so relaxed atomics from every writer
  // and puncher are enough; a wrong bit costs page faults, one madvise or one pwrite, never
  // data. Null for a read-only open.
  std::unique_ptr<std::atomic<uint64_t>[]> populated_;
  std::unique_ptr<std::atomic<uint64_t>[]> written_;
  std::atomic<bool> populate_works_{true};  // cleared once if the kernel lacks the advice
  const uint64_t page_bytes_ = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
};

}  // namespace

const char* const BackingStore::kImageBusy =
    "in use by another process (a mounted warpfs, mkfs.warpfs or fsck.warpfs)";

std::string BackingStore::image_holders(int fd) {
  // The kernel reports no owner for an open-file-description lock (F_OFD_GETLK and
  // /proc/locks give pid -1), but /proc/PID/fdinfo/FD lists the locks on that descriptor's
  // file as "lock: ... OFDLCK ADVISORY WRITE -1 MAJ:MIN:INO ...": the descriptors whose file
  // carries one are the holder's (and its children's, which share the description).
  struct stat st {};
  if (fstat(fd, &st) != 0) return "";
  char key[64];
  std::snprintf(key, sizeof key, " %02x:%02x:%llu ", major(st.st_dev), minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::string out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return "";
  const std::string self = std::to_string(getpid());
  while (dirent* p = readdir(proc)) {
    const std::string pid = p->d_name;
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || pid == self)
      continue;
    const std::string fdinfo = "/proc/" + pid + "/fdinfo";
    DIR* fds = opendir(fdinfo.c_str());
    if (fds == nullptr) continue;  // gone, or not ours to look at
    bool holds = false;
    while (dirent* f = readdir(fds)) {
      if (f->d_name[0] == '.') continue;
      std::ifstream in(fdinfo + "/" + f->d_name);
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind("lock:", 0) == 0 && line.find("OFDLCK") != std::string::npos &&
            (line + " ").find(key) != std::string::npos) {
          holds = true;
        }
      }
      if (holds) break;
    }
    closedir(fds);
    if (!holds) continue;
    std::string comm;
    std::ifstream c("/proc/" + pid + "/comm");
    std::getline(c, comm);
    out += (out.empty() ? "" : ", ") + ("pid " + pid) + (comm.empty() ? "" : " (" + comm + ")");
  }
  closedir(proc);
  return out;
}

bool BackingStore::lock_image(int fd, bool write) {
  struct flock fl {};
  fl.l_type = write ? F_WRLCK : F_RDLCK;
  fl.l_whence = SEEK_SET;  // the whole file
  return fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

std::shared_ptr<BackingStore> BackingStore::open_file(const std::string& path,
                                                      uint64_t create_bytes, std::string* error,
                                                      bool read_only) {
  if (read_only) create_bytes = 0;
  // A new image is the owner's only (0600: it holds every file's data, whatever the files'
  // own modes), and is never created through a symlink (root runs mkfs in shared directories).
  int flags =
      (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | (create_bytes > 0 ? O_CREAT | O_NOFOLLOW : 0);
  int fd = open(path.c_str(), flags, 0600);
  if (fd < 0) {
    *error = path + ": " + std::strerror(errno) +
             (errno == ELOOP && create_bytes > 0 ? " (a symlink: refused)" : "");
    return nullptr;
  }
  // One user at a time, as a PCIe function has one driver: a second mount, mkfs or fsck of
  // the same image would corrupt it. An open-file-description write lock, which only a
  // descriptor open for writing can take: a user who may merely read the image cannot block
  // its owner (a flock, which any reader could take, did).
  if (!lock_image(fd, !read_only)) {
    const std::string who = image_holders(fd);
    *error = path + ": " + kImageBusy + (who.empty() ? "" : ": held by " + who);
    close(fd);
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *error = path + ": not a regular file";
    close(fd);
    return nullptr;
  }
  uint64_t bytes = static_cast<uint64_t>(st.st_size);
  if (bytes == 0 && create_bytes > 0) {
    if (ftruncate(fd, static_cast<off_t>(create_bytes)) != 0) {
      *error = path + ": cannot size the image: " + std::strerror(errno);
      close(fd);
      return nullptr;
    }
    bytes = create_bytes;
  }
  if (bytes == 0) {
    *error = path + ": the image file is empty";
    close(fd);
    return nullptr;
  }
  return std::make_shared<FileStore>(fd, bytes, !read_only);
}

std::shared_ptr<BackingStore> BackingStore::ram(uint64_t bytes) {
  auto s = std::make_shared<RamStore>(bytes);
  return s->ok() ? s : nullptr;
}

namespace emu {

Media::Media(std::shared_ptr<BackingStore> store, bool cache_enabled, uint64_t cache_bytes,
             bool in_store)
    : store_(std::move(store)),
      in_store_(in_store),
      cache_enabled_(cache_enabled),
      cache_limit_units_(std::max<uint64_t>(cache_bytes / kUnit, 1)) {}

void Media::set_cache_enabled(bool on) {
  std::lock_guard<std::mutex> g(mu_);
  if (!on) (void)destage_locked();
  cache_enabled_ = on;
}

bool Media::cache_enabled() const {
  std::lock_guard<std::mutex> g(mu_);
  return cache_enabled_;
}

Status Media::destage_locked() {
  for (auto& [unit, data] : cache_) {
    Status s = store_->write(unit * kUnit, data.get(), kUnit);
    if (!s.is_ok()) return s;
  }
  clear_cache_locked();
  return Status::ok();
}

void Media::recycle_locked(std::unique_ptr<uint8_t[]> buf) {
  if (buf && spare_.size() < cache_limit_units_) spare_.push_back(std::move(buf));
}

void Media::clear_cache_locked() {
  for (auto& [unit, data] : cache_) recycle_locked(std::move(data));
  cache_.clear();
}

// The cached copy of `unit`, created on first write. A partial write needs the old contents.
Status Media::unit_for_write_locked(uint64_t unit, bool whole, uint8_t** out) {
  auto it = cache_.find(unit);
  if (it != cache_.end()) {
    *out = it->second.get();
    return Status::ok();
  }
  if (cache_.size() >= cache_limit_units_) {
    Status s = destage_locked();
    if (!s.is_ok()) return s;
  }
  std::unique_ptr<uint8_t[]> buf;
  if (!spare_.empty()) {
    buf = std::move(spare_.back());
    spare_.pop_back();
  } else {
    buf = std::make_unique_for_overwrite<uint8_t[]>(kUnit);  // a whole write fills it
  }
  if (!whole) {
    Status s = store_->read(unit * kUnit, buf.get(), kUnit);
    if (!s.is_ok()) return s;
  }
  *out = buf.get();
  cache_.emplace(unit, std::move(buf));
  return Status::ok();
}

// Walks [offset, offset+len) unit by unit together with the segment list.
template <typename Fn>
static Status for_each_piece(uint64_t offset, const std::vector<Segment>& segs, Fn&& fn) {
  size_t si = 0, so = 0;
  while (si < segs.size()) {
    const uint64_t unit = offset / Media::kUnit;
    const uint64_t in_unit = offset % Media::kUnit;
    size_t n = std::min<uint64_t>(Media::kUnit - in_unit, segs[si].len - so);
    Status s = fn(unit, in_unit, segs[si].ptr + so, n);
    if (!s.is_ok()) return s;
    offset += n, so += n;
    if (so == segs[si].len) ++si, so = 0;
  }
  return Status::ok();
}

Status Media::write_store(uint64_t offset, const std::vector<Segment>& segs) {
  for (const Segment& sg : segs) {
    Status s = store_->write(offset, sg.ptr, sg.len);
    if (!s.is_ok()) return s;
    offset += sg.len;
  }
  return Status::ok();
}

Status Media::read_store(uint64_t offset, const std::vector<Segment>& segs) {
  for (const Segment& sg : segs) {
    Status s = store_->read(offset, sg.ptr, sg.len);
    if (!s.is_ok()) return s;
    offset += sg.len;
  }
  return Status::ok();
}

// With in_store_ every access goes straight to the store, unlocked: commands that overlap
// are the host's race, as on a real drive (the filesystem above never issues them).
Status Media::write(uint64_t offset, const std::vector<Segment>& segs, bool fua) {
  if (in_store_) return write_store(offset, segs);
  std::lock_guard<std::mutex> g(mu_);
  if (!cache_enabled_) return write_store(offset, segs);
  return for_each_piece(offset, segs, [&](uint64_t unit, uint64_t at, uint8_t* p, size_t n) {
    uint8_t* data = nullptr;
    Status s = unit_for_write_locked(unit, n == kUnit, &data);
    if (!s.is_ok()) return s;
    std::memcpy(data + at, p, n);
    if (fua) {  // Force Unit Access: this unit reaches the media before completion
      s = store_->write(unit * kUnit, data, kUnit);
      auto it = cache_.find(unit);
      recycle_locked(std::move(it->second));
      cache_.erase(it);
    }
    return s;
  });
}

Status Media::read(uint64_t offset, const std::vector<Segment>& segs) {
  if (in_store_) return read_store(offset, segs);
  std::lock_guard<std::mutex> g(mu_);
  if (cache_.empty()) return read_store(offset, segs);
  return for_each_piece(offset, segs, [&](uint64_t unit, uint64_t at, uint8_t* p, size_t n) {
    auto it = cache_.find(unit);
    if (it != cache_.end()) {
      std::memcpy(p, it->second.get() + at, n);
      return Status::ok();
    }
    return store_->read(unit * kUnit + at, p, n);
  });
}

Status Media::write_zeroes(uint64_t offset, uint64_t len, bool fua) {
  static std::vector<uint8_t> zero(kUnit, 0);
  std::vector<Segment> segs;
  while (len > 0) {
    size_t n = std::min<uint64_t>(len, kUnit);
    segs.assign(1, Segment{zero.data(), n});
    Status s = write(offset, segs, fua);
    if (!s.is_ok()) return s;
    offset += n, len -= n;
  }
  return Status::ok();
}

Status Media::deallocate(uint64_t offset, uint64_t len) {
  if (in_store_) return store_->punch(offset, len);
  std::lock_guard<std::mutex> g(mu_);
  // Cached units inside the range are dropped; partial units at the edges are zeroed in
  // place so that a later destage cannot resurrect deallocated bytes.
  const uint64_t end = offset + len;
  for (uint64_t u = offset / kUnit; u * kUnit < end; ++u) {
    auto it = cache_.find(u);
    if (it == cache_.end()) continue;
    const uint64_t lo = std::max(offset, u * kUnit), hi = std::min(end, (u + 1) * kUnit);
    if (lo == u * kUnit && hi == (u + 1) * kUnit) {
      recycle_locked(std::move(it->second));
      cache_.erase(it);
    } else {
      std::memset(it->second.get() + (lo - u * kUnit), 0, hi - lo);
    }
  }
  return store_->punch(offset, len);
}

Status Media::flush() {
  if (in_store_) return store_->sync();
  std::lock_guard<std::mutex> g(mu_);
  Status s = destage_locked();
  return s.is_ok() ? store_->sync() : s;
}

void Media::lose_power(double persist_probability, std::mt19937_64& rng) {
  std::lock_guard<std::mutex> g(mu_);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (auto& [unit, data] : cache_) {
    // A power cut: whatever fails to persist is lost, as the cut may lose it anyway.
    if (coin(rng) < persist_probability) (void)store_->write(unit * kUnit, data.get(), kUnit);
  }
  clear_cache_locked();
}

// ---------------------------------------------------------------------------------------------

DmaSpace::DmaSpace() : entries_(new Entry[kMaxRegions]()), next_iova_(0x10'0000'0000ull) {
  used_.store(0, port::Order::kRelaxed);
}

DmaSpace::~DmaSpace() {
  const uint32_t n = used_.load(port::Order::kAcquire);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t b = entries_[i].bytes.load(port::Order::kRelaxed);
    if (b != 0) munmap(reinterpret_cast<void*>(entries_[i].vaddr.load(port::Order::kRelaxed)), b);
  }
}

Status DmaSpace::alloc(size_t bytes, DmaRegion* out) {
  constexpr uint64_t kPage = 4096, kGap = 2ull << 20;
  const uint64_t len = (std::max<uint64_t>(bytes, 1) + kPage - 1) & ~(kPage - 1);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::error(Code::kNoMemory, "mmap of DMA memory failed");
  std::lock_guard<std::mutex> g(mu_);
  uint32_t n = used_.load(port::Order::kRelaxed);
  uint32_t slot = n;
  for (uint32_t i = 0; i < n; ++i) {
    if (entries_[i].bytes.load(port::Order::kRelaxed) == 0) {
      slot = i;
      break;
    }
  }
  if (slot == kMaxRegions) {
    munmap(p, len);
    return Status::error(Code::kNoMemory, "too many DMA regions");
  }
  const uint64_t iova = next_iova_;
  next_iova_ += (len + kGap + kGap - 1) & ~(kGap - 1);  // a gap between regions catches overruns
  Entry& e = entries_[slot];
  e.iova.store(iova, port::Order::kRelaxed);
  e.vaddr.store(reinterpret_cast<uint64_t>(p), port::Order::kRelaxed);
  e.bytes.store(len, port::Order::kRelease);  // publish: translate() reads bytes first
  if (slot == n) used_.store(n + 1, port::Order::kRelease);
  *out = DmaRegion{p, iova, static_cast<size_t>(len)};
  return Status::ok();
}

void DmaSpace::free(const DmaRegion& r) {
  if (r.vaddr == nullptr) return;
  std::lock_guard<std::mutex> g(mu_);
  const uint32_t n = used_.load(port::Order::kRelaxed);
  for (uint32_t i = 0; i < n; ++i) {
    Entry& e = entries_[i];
    if (e.bytes.load(port::Order::kRelaxed) != 0 && e.iova.load(port::Order::kRelaxed) == r.iova) {
      const uint64_t len = e.bytes.load(port::Order::kRelaxed);
      e.bytes.store(0, port::Order::kRelease);
      munmap(r.vaddr, len);
      return;
    }
  }
}

uint8_t* DmaSpace::translate(uint64_t iova, uint64_t len) const {
  const uint32_t n = used_.load(port::Order::kAcquire);
  for (uint32_t i = 0; i < n; ++i) {
    const Entry& e = entries_[i];
    const uint64_t bytes = e.bytes.load(port::Order::kAcquire);
    if (bytes == 0) continue;
    const uint64_t base = e.iova.load(port::Order::kRelaxed);
    if (iova >= base && iova - base < bytes && len <= bytes - (iova - base)) {
      return reinterpret_cast<uint8_t*>(e.vaddr.load(port::Order::kRelaxed)) + (iova - base);
    }
  }
  return nullptr;
}

}  // namespace emu
}  // namespace warpfs::nvme
