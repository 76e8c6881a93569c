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

PagePool& PagePool::instance() {
  // Never destroyed: a buffer may be given back from a static destructor after main().
  static PagePool* const pool = new PagePool;
  return *pool;
}

void PagePool::add_chunk() {
  // Room first: nothing may throw once the chunk is mapped, or its mapping would leak.
  chunks_.reserve(chunks_.size() + 1);
  cold_.reserve(cold_.size() + kChunk / kPage);
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
  // The free pages leave the pool while the kernel takes their memory, so that take() and
  // give() do not wait for madvise: a take() meanwhile finds a cold page or a new chunk.
  std::deque<uint8_t*> pages;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (warm_.empty()) return 0;
    cold_.reserve(cold_.size() + warm_.size());  // the pages come back without a throw
    pages.swap(warm_);
    trimming_ += pages.size();
  }
  std::sort(pages.begin(), pages.end());
  // One madvise per run of neighbouring pages.
  size_t i = 0;
  while (i < pages.size()) {
    size_t j = i + 1;
    while (j < pages.size() && pages[j] == pages[j - 1] + kPage) ++j;
    // ASan does not intercept madvise; the pages stay poisoned.
    madvise(pages[i], (j - i) * kPage, MADV_DONTNEED);
    i = j;
  }
  std::lock_guard<std::mutex> g(mu_);
  cold_.insert(cold_.end(), pages.begin(), pages.end());
  trimming_ -= pages.size();
  return pages.size();
}

PagePool::Counts PagePool::counts() const {
  std::lock_guard<std::mutex> g(mu_);
  return Counts{in_use_, warm_.size(), cold_.size() + trimming_, chunks_.size()};
}

}  // namespace warpfs::fs
