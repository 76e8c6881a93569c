// The metadata cache's block buffers: page-sized, page-aligned, taken from and given back to
// one pool instead of the heap.
//
// Why not the heap. A MetaBuf's 4 KiB buffer from operator new came from the calling FUSE
// worker's glibc arena, and glibc grows a thread arena's heap by exactly what one allocation
// needs, an mprotect system call and a page fault per new buffer (no top pad off the main
// arena). A storm of mkdirs allocates a directory block each: 12 % of the daemon's CPU in a
// mkdir storm went to operator new's heap growth, and the frees to its consolidation. The
// pool keeps released pages on a free list and hands them out again without a system call;
// its pages come from the kernel 1 MiB at a time.
//
// Giving memory back. Released pages stay the pool's until trim(), which tells the kernel
// it may take the frames of every free page (MADV_DONTNEED, runs of neighbours in one call):
// the address range stays, its memory goes, and the next use of such a page faults in a zero
// page. The metadata cache calls it where it called malloc_trim, on the committer's timed
// pass after evictions (FsImpl::trim_heap), not after each eviction: under pressure freed
// buffers are taken again at once. Chunks are never unmapped (their address space only).
//
// Thread-safety: take(), give() and trim() may be called from any thread at once; `mu_` (a
// leaf lock: nothing is called under it but mmap) guards every member. trim() takes the free
// pages out under it, kTrimBatch at a time, and gives their memory back without it.
//
// Under AddressSanitizer a free page is poisoned, so a use after give() is reported until the
// page is taken again, and free pages are taken oldest first (FIFO, where the optimised build
// takes the newest: LIFO) so that this is as late as the pool allows, as the heap's
// quarantine did; give() of a page already free aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace warpfs::fs {

class PagePool {
 public:
  static constexpr size_t kPage = 4096;
  static constexpr size_t kChunk = size_t{1} << 20;  // pages come from the kernel this many at once
  static constexpr size_t kTrimBatch = 256;          // pages a trim() has out at once, at most

  // The process's pool (every mounted filesystem and tool in the process shares it).
  static PagePool& instance();

  // A page-aligned kPage buffer, contents undefined. Throws std::bad_alloc when the kernel
  // has no memory for a new chunk, as operator new would.
  uint8_t* take();
  // Back to the pool. REQUIRES: `p` came from take() and is not used afterwards.
  void give(uint8_t* p);
  // Gives the memory of every free page touched since the last trim back to the kernel (those
  // free when it starts). Returns how many pages it gave back.
  size_t trim();

  // For tests and the stats: pages handed out now, free pages that hold memory, free pages
  // whose memory the kernel has (trimmed or never touched), and chunks mapped.
  struct Counts {
    size_t in_use = 0, free_resident = 0, free_released = 0, chunks = 0;
  };
  Counts counts() const;

 private:
  void add_chunk();  // REQUIRES: mu_

  mutable std::mutex mu_;
  std::deque<uint8_t*> warm_;   // free pages that may hold memory: taken first (LIFO, cache-warm)
  std::vector<uint8_t*> cold_;  // free pages whose memory the kernel has
  std::vector<uint8_t*> chunks_;
  size_t in_use_ = 0;
  size_t trimming_ = 0;  // free pages a trim() has out of the lists (counted as released)
};

}  // namespace warpfs::fs
