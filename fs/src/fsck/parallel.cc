// The checker's one way of running work on several threads: oneTBB's parallel_for over block
// groups, as xfs_repair scans its allocation groups side by side (e2fsck scans in turn).
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

void for_each_index(unsigned threads, uint32_t n, const std::function<void(uint32_t)>& body) {
  if (threads == 1 || n <= 1) {
    for (uint32_t i = 0; i < n; ++i) body(i);
    return;
  }
  tbb::task_arena arena(threads == 0 ? tbb::task_arena::automatic : static_cast<int>(threads));
  arena.execute([&] {
    // One group per task: a group is 128 MiB of device, coarse enough to amortise a task.
    tbb::parallel_for(tbb::blocked_range<uint32_t>(0, n, 1),
                      [&](const tbb::blocked_range<uint32_t>& r) {
                        for (uint32_t i = r.begin(); i != r.end(); ++i) body(i);
                      });
  });
}

}  // namespace warpfs::fs::fsck_impl
