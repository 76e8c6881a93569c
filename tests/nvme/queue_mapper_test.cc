// The queue mapper: a randomized model-based test of its remapping (invariants after every
// step, movement away from a slow queue, no collapse under uniform load), and priority
// classes landing on their own queues.
#include "warpfs/nvme/queue_mapper.h"

#include <algorithm>
#include <random>

#include "nvme/rig.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::nvme::test {
namespace {

// A synthetic device: queue q completes each outstanding command per step with
// probability rate[q]; pressure is the largest backlog a router saw since the last reading.
struct Model {
  std::vector<uint64_t> load, pressure;
  std::vector<double> rate;
};

void check_invariants(const QueueMapper& m, Priority p, uint32_t k) {
  std::vector<uint32_t> count(k, 0);
  for (uint32_t s = 0; s < m.slots(p); ++s) {
    const uint32_t q = m.slot_queue(p, s);
    ASSERT_LT(q, k) << "slot " << s << " maps outside its class";
    ++count[q];
  }
  for (uint32_t q = 0; q < k; ++q) {
    ASSERT_EQ(count[q], m.mapped(p, q)) << "mapped count of queue " << q;
    ASSERT_LE(count[q], m.max_mapped(p)) << "queue " << q << " owns too many slots";
    ASSERT_GE(count[q], 1u) << "queue " << q << " lost its last slot";
  }
}

// Runs `steps` routed commands against the model; returns final slots per queue.
std::vector<uint32_t> run_model(QueueMapper& m, Model& md, uint32_t k, int steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (int i = 0; i < steps; ++i) {
    QueueMapper::Route r = m.route(Priority::kBulk);
    md.load[r.queue] += 1;
    md.pressure[r.queue] = std::max(md.pressure[r.queue], md.load[r.queue]);
    for (uint32_t q = 0; q < k; ++q) {  // service
      if (md.load[q] > 0 && u(rng) < md.rate[q]) md.load[q] -= 1;
    }
    m.rebalance(
        r, [&](uint32_t q) { return md.load[q]; }, [&] { return md.pressure[r.queue]; },
        [&] { return std::exchange(md.pressure[r.queue], 0); });
    check_invariants(m, Priority::kBulk, k);
    if (::testing::Test::HasFatalFailure()) return {};
  }
  std::vector<uint32_t> out;
  for (uint32_t q = 0; q < k; ++q) out.push_back(m.mapped(Priority::kBulk, q));
  return out;
}

QueueMapper make_mapper(uint32_t k, uint64_t threshold) {
  // The mapper only reads entries() from real queues at construction: give it real ones.
  static std::vector<VirtualQueuePtr> keep;
  static DmaRegion dummy_sq[8], dummy_cq[8];
  std::vector<VirtualQueue*> qs;
  for (uint32_t q = 0; q < k; ++q) {
    QueueView v;
    v.entries = 64;
    keep.push_back(make_virtual_queue(v));
    qs.push_back(keep.back().get());
  }
  (void)dummy_sq, (void)dummy_cq;
  QueueMapper::Options o;
  o.slots_per_queue = 4;
  o.remap_threshold = threshold;
  return QueueMapper({qs, qs}, o);
}

TEST(QueueMapperModel, SlotsMoveAwayFromASlowQueue) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    constexpr uint32_t k = 6;
    QueueMapper m = make_mapper(k, 8);
    Model md{std::vector<uint64_t>(k, 0), std::vector<uint64_t>(k, 0), std::vector<double>(k, 0.9)};
    md.rate[2] = 0.02;  // queue 2 is slow
    std::vector<uint32_t> slots = run_model(m, md, k, 4000, seed);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_LT(slots[2], 4u) << "seed " << seed;  // it started with 4
    EXPECT_GT(m.remaps(), 0u);
  }
}

TEST(QueueMapperModel, UniformLoadDoesNotCollapse) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    constexpr uint32_t k = 8;
    QueueMapper m = make_mapper(k, 4);
    // Every queue equally slow: pressure builds everywhere and movers keep trying.
    Model md{std::vector<uint64_t>(k, 0), std::vector<uint64_t>(k, 0),
             std::vector<double>(k, 0.11)};
    std::vector<uint32_t> slots = run_model(m, md, k, 6000, seed);
    ASSERT_FALSE(HasFatalFailure());
    const uint32_t used = static_cast<uint32_t>(
        std::count_if(slots.begin(), slots.end(), [](uint32_t s) { return s > 0; }));
    EXPECT_EQ(used, k) << "seed " << seed;
    EXPECT_LE(*std::max_element(slots.begin(), slots.end()), m.max_mapped(Priority::kBulk));
  }
}

TEST(QueueMapperModel, NoRemapBelowThreshold) {
  constexpr uint32_t k = 4;
  QueueMapper m = make_mapper(k, 1000);
  Model md{std::vector<uint64_t>(k, 0), std::vector<uint64_t>(k, 0), std::vector<double>(k, 0.3)};
  md.rate[0] = 0.01;
  run_model(m, md, k, 2000, 3);
  EXPECT_EQ(m.remaps(), 0u);
}

TEST(QueueMapperModel, RoutesRoundRobinOverSlots) {
  constexpr uint32_t k = 3;
  QueueMapper m = make_mapper(k, 8);
  std::vector<int> hits(k, 0);
  for (int i = 0; i < 300; ++i) hits[m.route(Priority::kMetadata).queue]++;
  for (uint32_t q = 0; q < k; ++q) EXPECT_EQ(hits[q], 100);
}

// End to end over the device's queues: metadata commands go to the high-priority SQ, bulk
// ones to the others, and each class's data comes back intact. On the emulated controller the
// device's own fetch trace confirms which SQ each command came from.
TEST(QueueMapper, PriorityClassesUseTheirOwnQueues) {
  ControllerOptions o;
  o.io_queues = 3;
  auto r = Rig::make({}, 8ull << 20, o);
  ASSERT_TRUE(r);
  if (r->ctrl->io_queues_granted() < 3) GTEST_SKIP() << "needs three I/O queue pairs";
  EngineOptions eo;
  eo.metadata_queues = 1;
  std::string err;
  auto e = IoEngine::create(*r->ctrl, eo, &err);
  ASSERT_TRUE(e) << err;
  ASSERT_EQ(e->mapper().queues(Priority::kMetadata), 1u);
  ASSERT_EQ(e->mapper().queues(Priority::kBulk), 2u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(e->mapper().route(Priority::kMetadata).vq->view().qid, 1);
    const uint16_t q = e->mapper().route(Priority::kBulk).vq->view().qid;
    EXPECT_TRUE(q == 2 || q == 3) << q;
  }

  DmaRegion buf = r->alloc(kPage);
  if (r->emu) r->emu->trace_fetches(true);
  for (int i = 0; i < 20; ++i) {  // metadata writes blocks 0..19, bulk ones 20..39
    for (const Priority p : {Priority::kMetadata, Priority::kBulk}) {
      const uint64_t lba = static_cast<uint64_t>(i) + (p == Priority::kBulk ? 20 : 0);
      fill_pattern(buf.vaddr, r->lba, lba, 5);
      SubmissionEntry w = make_write(r->nsid, lba, 1);
      w.prp1 = buf.iova;
      ASSERT_TRUE(e->execute(w, p).is_ok());
    }
  }
  std::vector<uint16_t> fetched;
  if (r->emu) fetched = r->emu->fetch_trace();
  for (uint64_t lba = 0; lba < 40; ++lba) {
    std::memset(buf.vaddr, 0, r->lba);
    SubmissionEntry rd = make_read(r->nsid, lba, 1);
    rd.prp1 = buf.iova;
    ASSERT_TRUE(e->execute(rd, lba < 20 ? Priority::kMetadata : Priority::kBulk).is_ok());
    EXPECT_TRUE(check_pattern(buf.vaddr, r->lba, lba, 5)) << lba;
  }
  if (r->emu) {  // commands alternate metadata, bulk, metadata, ...
    ASSERT_EQ(fetched.size(), 40u);
    for (size_t i = 0; i < fetched.size(); i += 2) EXPECT_EQ(fetched[i], 1) << i;
    for (size_t i = 1; i < fetched.size(); i += 2) {
      EXPECT_TRUE(fetched[i] == 2 || fetched[i] == 3) << fetched[i];
    }
    EXPECT_GT(std::count(fetched.begin(), fetched.end(), 2), 0);
    EXPECT_GT(std::count(fetched.begin(), fetched.end(), 3), 0);
  }
}

}  // namespace
}  // namespace warpfs::nvme::test
