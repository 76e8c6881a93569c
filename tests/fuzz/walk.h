// Drives a mounted (possibly corrupt) filesystem the way the FUSE daemon would on behalf of
// the kernel, and checks the promises every call makes whatever the image holds:
//   - every call returns: success or an errno from the set the filesystem documents;
//   - readdir's resume offsets never go backwards (a caller resuming there could loop);
//   - a read or write reports at most what was asked; getattr(1) names inode 1.
// A broken promise aborts (libFuzzer saves the input). Softer oddities are notes, printed
// once per kind by note(): an EIO with no log line naming the structure, a name the kernel
// would refuse (empty, over 255 bytes, '/', NUL, "." or ".."), a page of readdir entries
// that all resume at the offset asked (a caller with pages that small would loop), an empty
// or over-long symlink target. (The read-only promise is fuzz_mount's: it owns the device.)
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "warpfs/fs/filesystem.h"

namespace warpfs::fuzz {

struct WalkOptions {
  bool write = true;        // also create, write, rename, unlink, ... (not on read-only)
  size_t readdir_page = 0;  // entries per readdir call (0: all in one)
  bool faults = false;      // the device fails on purpose: EIO needs no log line
};

// What the filesystem logs (MountOptions::log), from any of its threads.
class MountLog {
 public:
  void add(const std::string& line) {
    std::lock_guard<std::mutex> g(mu_);
    text_ += line + "\n";
    ++lines_;
  }
  size_t lines() const {
    std::lock_guard<std::mutex> g(mu_);
    return lines_;
  }
  std::string text() const {
    std::lock_guard<std::mutex> g(mu_);
    return text_;
  }

 private:
  mutable std::mutex mu_;
  std::string text_;
  size_t lines_ = 0;
};

// Looks around the mounted filesystem (bounded: a few hundred calls), then, with o.write,
// changes it; does not unmount.
void walk(fs::Filesystem& f, const MountLog& log, const WalkOptions& o);

// Aborts with a message when `ok` is false: a promise was broken.
void require(bool ok, const std::string& what);
// A soft finding: printed once per `kind` per process, to stderr.
void note(const std::string& kind, const std::string& detail);
// True if `rc` is 0 or an errno the filesystem may return (filesystem.h's calls).
bool known_errno(int rc);

}  // namespace warpfs::fuzz
