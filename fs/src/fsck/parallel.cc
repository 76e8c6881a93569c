// The checker's one way of running work on several threads: oneTBB's parallel_for over block
// groups (and directories), as xfs_repair scans its allocation groups side by side (e2fsck scans in
// turn).
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "fsck/checker.h"
#include "warpfs/nvme/port.h"

namespace warpfs::fs::fsck_impl {

namespace {

unsigned resolve(unsigned threads) {
  return threads != 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
}

// The same work on plain threads, for ThreadSanitizer builds only. oneTBB's scheduler
// (libtbb.so) is not built with ThreadSanitizer, so the happens-before edges of its task
// hand-off and join are invisible to it and every task reports races it does not have (its
// task objects, and the caller's stack that its tasks touch). Thread creation and join are
// edges ThreadSanitizer sees: the workers' bodies, the only code of ours that runs in
// parallel, are checked the same, on a scheduler it can follow.
[[maybe_unused]] void run_on_threads(unsigned t, uint32_t n,
                                     const std::function<void(uint32_t)>& body) {
  std::atomic<uint32_t> next{0};  // the next index to take; relaxed: join orders the results
  std::vector<std::thread> workers;
  for (unsigned w = 0; w < std::min<uint32_t>(t, n); ++w) {
    workers.emplace_back([&] {
      for (uint32_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) body(i);
    });
  }
  for (std::thread& w : workers) w.join();
}

}  // namespace

struct Workers::Arena {
  explicit Arena(unsigned t) : arena(static_cast<int>(t)) {}
  tbb::task_arena arena;
};

Workers::Workers(unsigned threads) : count_(resolve(threads)) {
  if (count_ > 1) arena_ = std::make_unique<Arena>(count_);
}

Workers::~Workers() = default;

void Workers::for_each_index(uint32_t n, const std::function<void(uint32_t)>& body) {
  if (!arena_ || n <= 1) {
    for (uint32_t i = 0; i < n; ++i) body(i);
    return;
  }
#if WARPFS_TSAN
  run_on_threads(count_, n, body);
#else
  arena_->arena.execute([&] {
    // One group (or directory) per task: coarse enough to amortise a task.
    tbb::parallel_for(tbb::blocked_range<uint32_t>(0, n, 1),
                      [&](const tbb::blocked_range<uint32_t>& r) {
                        for (uint32_t i = r.begin(); i != r.end(); ++i) body(i);
                      });
  });
#endif
}

}  // namespace warpfs::fs::fsck_impl
