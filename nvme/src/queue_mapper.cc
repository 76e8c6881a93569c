#include "warpfs/nvme/queue_mapper.h"

#include <algorithm>

namespace warpfs::nvme {

QueueMapper::QueueMapper(std::vector<std::vector<VirtualQueue*>> queues, const Options& o)
    : t_(new Tables()) {  // value-initialised: counters, slots and queues zero
  WARPFS_DCHECK(!queues.empty(), "QueueMapper without queues");
  for (int ci = 0; ci < kPriorityClasses; ++ci) {
    Class& c = t_->cls[ci];
    const std::vector<VirtualQueue*>& qs = queues[static_cast<size_t>(ci) % queues.size()];
    WARPFS_DCHECK(!qs.empty() && qs.size() <= kMaxQueues, "a class needs 1..kMaxQueues queues");
    c.nqueues = static_cast<uint32_t>(std::min<size_t>(qs.size(), kMaxQueues));
    for (uint32_t q = 0; q < c.nqueues; ++q) c.queues[q] = qs[q];
    c.nslots = std::min(kMaxSlots, std::max(1u, o.slots_per_queue) * c.nqueues);
    c.max_mapped =
        o.max_slots_per_queue ? o.max_slots_per_queue : 2 * std::max(1u, c.nslots / c.nqueues);
    const uint32_t entries = o.queue_entries ? o.queue_entries
                             : c.nqueues     ? c.queues[0]->entries()
                                             : 2;
    c.threshold = o.remap_threshold ? o.remap_threshold : std::max<uint64_t>(entries / 4, 2);
    c.ticket.value.store(0, port::Order::kRelaxed);
    for (uint32_t s = 0; s < c.nslots; ++s) {
      c.slots[s].value.store(s % c.nqueues, port::Order::kRelaxed);  // round robin to start
      c.mapped[s % c.nqueues].value.fetch_add(1, port::Order::kRelaxed);
    }
  }
}

}  // namespace warpfs::nvme
