#include "page_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WARPFS_PAGE_POOL_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define WARPFS_PAGE_POOL_ASAN 1
#endif
#if defined(WARPFS_PAGE_POOL_ASAN)
#include <sanitizer/asan_interface.h>
#define POOL_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define POOL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POOL_POISON(p, n) ((void)(p), (void)(n))
#define POOL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace warpfs::fs {

namespace {

// Room for `more` elements past v's size, growing the capacity geometrically (reserve alone
// would grow it by exactly what is asked, and copy the whole vector each time).
void reserve_more(std::vector<uint8_t*>& v, size_t more) {
  const size_t need = v.size() + more;
  if (need > v.capacity()) v.reserve(std::max(need, 2 * v.capacity()));
}

}  // namespace

PagePool& PagePool::instance() {
  // Never destroyed: a buffer may be given back from a static destructor after main().
  static PagePool* const pool = new PagePool;
  return *pool;
}

void PagePool::add_chunk() {
  // Room first: nothing may throw once the chunk is mapped, or its mapping would leak (and
  // for the pages a trim() has out: they come back into cold_ without a throw).
  reserve_more(chunks_, 1);
  reserve_more(cold_, trimming_ + kChunk / kPage);
  void* m = mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  auto* base = static_cast<uint8_t*>(m);
  chunks_.push_back(base);
  // Untouched pages hold no memory yet: cold. Highest address first, so that take() hands
  // the chunk out in address order.
  for (size_t off = kChunk; off > 0; off -= kPage) cold_.push_back(base + off - kPage);
  POOL_POISON(base, kChunk);
}

uint8_t* PagePool::take() {
  std::lock_guard<std::mutex> g(mu_);
  uint8_t* p;
  if (!warm_.empty()) {
#if defined(WARPFS_PAGE_POOL_ASAN)
    p = warm_.front();  // the page freed longest ago: a late use of it is reported longest
    warm_.pop_front();
#else
    p = warm_.back();
    warm_.pop_back();
#endif
  } else {
    if (cold_.empty()) add_chunk();
    p = cold_.back();
    cold_.pop_back();
  }
  ++in_use_;
  POOL_UNPOISON(p, kPage);
  return p;
}

void PagePool::give(uint8_t* p) {
#if defined(WARPFS_PAGE_POOL_ASAN)
  // A held page is unpoisoned (take()); a free one is poisoned.
  if (__asan_address_is_poisoned(p)) {
    std::fprintf(stderr, "PagePool::give: page %p is already free (given back twice)\n",
                 static_cast<void*>(p));
    std::abort();
  }
#endif
  POOL_POISON(p, kPage);
  std::lock_guard<std::mutex> g(mu_);
  warm_.push_back(p);
  --in_use_;
}

size_t PagePool::trim() {
  // The free pages leave the pool a batch at a time while the kernel takes their memory, so
  // that take() and give() do not wait for madvise, and a take() meanwhile finds the batches
  // trimmed so far (cold) rather than mapping a new chunk. Only the pages free when it
  // started: what is given back meanwhile waits for the next trim.
  size_t todo, done = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    todo = warm_.size();
  }
  std::vector<uint8_t*> batch;
  batch.reserve(kTrimBatch);
  while (done < todo) {
    {
      std::lock_guard<std::mutex> g(mu_);
      const size_t n = std::min({kTrimBatch, todo - done, warm_.size()});
      if (n == 0) break;
      // cold_ keeps room for every page out (add_chunk too): they come back without a throw.
      reserve_more(cold_, trimming_ + n);
      // The oldest first: what is given back meanwhile goes to the other end.
      batch.assign(warm_.begin(), warm_.begin() + static_cast<std::ptrdiff_t>(n));
      warm_.erase(warm_.begin(), warm_.begin() + static_cast<std::ptrdiff_t>(n));
      trimming_ += n;
    }
    std::sort(batch.begin(), batch.end());
    // One madvise per run of neighbouring pages.
    for (size_t i = 0; i < batch.size();) {
      size_t k = i + 1;
      while (k < batch.size() && batch[k] == batch[k - 1] + kPage) ++k;
      // ASan does not intercept madvise; the pages stay poisoned.
      madvise(batch[i], (k - i) * kPage, MADV_DONTNEED);
      i = k;
    }
    std::lock_guard<std::mutex> g(mu_);
    cold_.insert(cold_.end(), batch.begin(), batch.end());
    trimming_ -= batch.size();
    done += batch.size();
  }
  return done;
}

PagePool::Counts PagePool::counts() const {
  std::lock_guard<std::mutex> g(mu_);
  return Counts{in_use_, warm_.size(), cold_.size() + trimming_, chunks_.size()};
}

}  // namespace warpfs::fs
