// GPU-initiated I/O against the emulated controller: GPU threads submit reads and
// writes through VirtualQueue (one queue pair, then several over several controller threads)
// and through the GPU LockedQueue, with no CPU code in the per-command path.
//
// Checks: every LBA of the image read through the GPU carries the expected content (single
// LBAs, and 4 KiB reads placed across a page boundary of the buffer so that PRP2 is used);
// every command succeeds; blocks written by GPU threads read back through the GPU and, after
// a controller shutdown, sit in the backing store exactly as the model says, with every other
// block untouched; with several queue pairs, every command was routed through the queue
// mapper's tables in GPU memory. Per-thread results are poisoned before each kernel, so a thread
// that never wrote its result fails the check.
//
// Usage: gpu_io_test [--small]   (--small: fewer threads and LBAs, for compute-sanitizer)
// Exit: 0 all passed, 1 a check failed or a CUDA call failed, 77 no GPU (skipped).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test.cuh"
#include "warpfs/gpu/io.cuh"
#include "warpfs/gpu/locked_queue.cuh"
#include "warpfs/gpu/rig.cuh"

namespace {

using namespace warpfs;
using gpu::IoView;
using gpu::test::image_word;

constexpr uint32_t kLba = 512;
constexpr uint32_t kSlot = 8192;  // per-thread buffer: two pages
constexpr double kTimeout = 60;

// Result codes per thread: 0 good; else bits saying what went wrong.
constexpr uint32_t kBadStatus = 1u << 0;
constexpr uint32_t kBadData = 1u << 1;

enum class Via { kVirtual, kLocked };

struct Target {
  Via via;
  IoView io;
  gpu::LockedQueueGpu* lq;
};

__device__ uint16_t do_rw(const Target& t, bool write, uint64_t offset, uint32_t bytes,
                          uint64_t iova) {
  if (t.via == Via::kVirtual) return gpu::rw(t.io, write, offset, bytes, iova);
  const nvme::SubmissionEntry c = gpu::make_rw(write ? nvme::io::kWrite : nvme::io::kRead,
                                               t.io.nsid, offset / kLba, bytes / kLba, iova, bytes);
  return t.lq->execute(c);
}

// Thread i reads LBAs i, i + T, i + 2T, ... (one LBA each: every LBA once) when `wide` is
// false; with `wide`, 8 LBAs (4 KiB) from LBA (i * 8 + r * 8T) placed at byte offset
// 512 * (i % 8) of its slot, so that 7 of 8 transfers cross a page boundary (PRP2).
// `seed_of(lba)`: blocks in [w_first, w_end) hold the written seed.
__global__ void read_verify(Target t, uint8_t* buf, uint64_t buf_iova, uint64_t lbas, uint64_t seed,
                            uint64_t wseed, uint64_t w_first, uint64_t w_end, bool wide,
                            uint32_t* result) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t nthreads = gridDim.x * blockDim.x;
  const uint32_t off = wide ? kLba * (tid % 8) : 0;
  const uint32_t nlb = wide ? 8 : 1;
  uint8_t* mine = buf + uint64_t{tid} * kSlot + off;
  const uint64_t iova = buf_iova + uint64_t{tid} * kSlot + off;
  uint32_t bad = 0;
  for (uint64_t lba = uint64_t{tid} * nlb; lba + nlb <= lbas; lba += uint64_t{nthreads} * nlb) {
    const uint16_t s = do_rw(t, false, lba * kLba, nlb * kLba, iova);
    if (!nvme::status_ok(s)) {
      bad |= kBadStatus;
      continue;
    }
    const auto* w = reinterpret_cast<const uint64_t*>(mine);
    for (uint32_t i = 0; i < nlb * kLba / 8; ++i) {
      const uint64_t b = lba + i / (kLba / 8);
      const uint64_t want =
          image_word(b >= w_first && b < w_end ? wseed : seed, b * (kLba / 8) + i % (kLba / 8));
      if (w[i] != want) bad |= kBadData;
    }
  }
  result[tid] = bad;
}

// Thread i writes LBAs [first + i * per, first + (i + 1) * per) with the `wseed` content,
// one command of `per` LBAs.
__global__ void write_blocks(Target t, uint8_t* buf, uint64_t buf_iova, uint64_t first,
                             uint32_t per, uint64_t wseed, uint32_t* result) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  uint8_t* mine = buf + uint64_t{tid} * kSlot;
  const uint64_t lba = first + uint64_t{tid} * per;
  auto* w = reinterpret_cast<uint64_t*>(mine);
  for (uint32_t i = 0; i < per * kLba / 8; ++i) w[i] = image_word(wseed, lba * (kLba / 8) + i);
  const uint16_t s = do_rw(t, true, lba * kLba, per * kLba, buf_iova + uint64_t{tid} * kSlot);
  result[tid] = nvme::status_ok(s) ? 0 : kBadStatus;
}

struct Config {
  const char* name;
  Via via;
  uint16_t queues;
  unsigned device_threads;
  uint32_t threads;
  uint64_t lbas;
};

uint32_t count_bad(const std::vector<uint32_t>& r) {
  uint32_t n = 0;
  for (uint32_t v : r) n += v != 0;
  return n;
}

void run(const Config& cfg, uint64_t seed, gpu::test::Tally* tally) {
  std::printf("%s: %u GPU threads, %u queue pair(s), %u controller thread(s), %llu LBAs\n",
              cfg.name, cfg.threads, cfg.queues, cfg.device_threads,
              static_cast<unsigned long long>(cfg.lbas));
  auto store = nvme::BackingStore::ram(cfg.lbas * kLba);
  {
    std::vector<uint64_t> words(cfg.lbas * kLba / 8);
    for (uint64_t i = 0; i < words.size(); ++i) words[i] = image_word(seed, i);
    if (!store->write(0, words.data(), words.size() * 8).is_ok()) {
      tally->check(false, "filling the RAM store");
      return;
    }
  }
  gpu::RigOptions o;
  o.lba_bytes = kLba;
  o.queues = cfg.queues;
  o.depth = 1024;
  o.device_threads = cfg.device_threads;
  std::string err;
  auto rig = gpu::Rig::open(o, store, &err);
  if (!rig) {
    tally->check(false, ("rig: " + err).c_str());
    return;
  }
  gpu::MappedRegion buf;
  if (!rig->map_dma(size_t{cfg.threads} * kSlot, &buf, &err)) {
    tally->check(false, err.c_str());
    return;
  }
  Target t{cfg.via, rig->io(), nullptr};
  if (cfg.via == Via::kLocked) t.lq = gpu::LockedQueueGpu::create(rig->device_view(0));
  uint32_t* d_result = nullptr;
  WARPFS_CUDA_CHECK(cudaMalloc(&d_result, cfg.threads * sizeof(uint32_t)));
  std::vector<uint32_t> result(cfg.threads);
  const uint32_t block = std::min<uint32_t>(256, cfg.threads);
  const uint32_t grid = cfg.threads / block;
  auto poison = [&] {
    WARPFS_CUDA_CHECK(cudaMemset(d_result, 0xef, cfg.threads * sizeof(uint32_t)));
    std::memset(buf.host, 0xa5, buf.bytes);  // stale buffers must not pass as data
  };
  auto fetch = [&] {
    WARPFS_CUDA_CHECK(cudaMemcpy(result.data(), d_result, cfg.threads * sizeof(uint32_t),
                                 cudaMemcpyDeviceToHost));
    uint32_t unwritten = 0;
    for (uint32_t v : result) unwritten += v == 0xefefefefu;
    return unwritten;
  };
  const uint64_t wseed = seed * 7 + 1;
  // Written range: each thread 2 LBAs, from the middle of the image.
  const uint32_t per = 2;
  const uint64_t w_first = cfg.lbas / 2;
  const uint64_t w_end = w_first + uint64_t{cfg.threads} * per;
  const bool can_write = w_end <= cfg.lbas;

  // 1. Every LBA, one by one.
  poison();
  read_verify<<<grid, block>>>(t, buf.dev, buf.iova, cfg.lbas, seed, wseed, 0, 0, false, d_result);
  gpu::sync_or_die("read_verify (single LBAs)", kTimeout);
  uint32_t unwritten = fetch();
  tally->check(unwritten == 0 && count_bad(result) == 0,
               ("every LBA read by GPU threads is intact (" + std::to_string(count_bad(result)) +
                " bad threads, " + std::to_string(unwritten) + " unwritten)")
                   .c_str());
  // 2. 4 KiB reads across page boundaries of the buffer.
  poison();
  read_verify<<<grid, block>>>(t, buf.dev, buf.iova, cfg.lbas, seed, wseed, 0, 0, true, d_result);
  gpu::sync_or_die("read_verify (4 KiB, PRP2)", kTimeout);
  unwritten = fetch();
  tally->check(unwritten == 0 && count_bad(result) == 0,
               ("4 KiB reads crossing a page (PRP2) are intact (" +
                std::to_string(count_bad(result)) + " bad threads)")
                   .c_str());
  if (can_write) {
    // 3. Writes, read back through the GPU.
    poison();
    write_blocks<<<grid, block>>>(t, buf.dev, buf.iova, w_first, per, wseed, d_result);
    gpu::sync_or_die("write_blocks", kTimeout);
    unwritten = fetch();
    tally->check(unwritten == 0 && count_bad(result) == 0, "GPU writes complete with success");
    poison();
    read_verify<<<grid, block>>>(t, buf.dev, buf.iova, cfg.lbas, seed, wseed, w_first, w_end, false,
                                 d_result);
    gpu::sync_or_die("read_verify after writes", kTimeout);
    unwritten = fetch();
    tally->check(unwritten == 0 && count_bad(result) == 0,
                 "every LBA reads back as the model says after the GPU writes");
  }
  if (cfg.via == Via::kVirtual && cfg.queues > 1) {
    // Every command went through the queue mapper's tables in GPU memory (one ticket each),
    // and its slot map is consistent: each slot names one of the class's queues, and the
    // per-queue counts the movers keep match the map.
    const uint64_t commands =
        cfg.lbas + cfg.lbas / 8 + (can_write ? uint64_t{cfg.threads} + cfg.lbas : 0);
    auto tables = std::make_unique<nvme::QueueMapper::Tables>();
    WARPFS_CUDA_CHECK(
        cudaMemcpy(tables.get(), rig->io().mapper, sizeof *tables, cudaMemcpyDeviceToHost));
    nvme::QueueMapper::Class& bulk = tables->cls[static_cast<int>(nvme::Priority::kBulk)];
    std::vector<uint32_t> owned(bulk.nqueues, 0);
    bool in_range = bulk.nqueues == cfg.queues;
    for (uint32_t s = 0; s < bulk.nslots && in_range; ++s) {
      const uint32_t q = bulk.slots[s].value.unsafe_ref();
      in_range = q < bulk.nqueues;
      if (in_range) ++owned[q];
    }
    bool counts = in_range;
    for (uint32_t q = 0; q < bulk.nqueues && counts; ++q) {
      counts = owned[q] == bulk.mapped[q].value.unsafe_ref();
    }
    tally->check(
        bulk.ticket.value.unsafe_ref() == commands,
        ("every GPU command was routed by the queue mapper (" +
         std::to_string(bulk.ticket.value.unsafe_ref()) + " of " + std::to_string(commands) + ", " +
         std::to_string(tables->remaps.value.unsafe_ref()) + " slot moves)")
            .c_str());
    tally->check(counts, "the mapper's slot map is consistent after the run");
  }
  if (t.lq != nullptr) gpu::LockedQueueGpu::destroy(t.lq);
  WARPFS_CUDA_CHECK(cudaFree(d_result));
  // 4. The store itself, after a shutdown (which makes the volatile write cache durable).
  if (can_write) {
    nvme::Status s = rig->shutdown();
    tally->check(s.is_ok(), "controller shutdown");
    std::vector<uint64_t> words(cfg.lbas * kLba / 8);
    (void)store->read(0, words.data(), words.size() * 8);  // RAM: a failure shows as wrong words
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < words.size(); ++i) {
      const uint64_t b = i / (kLba / 8);
      wrong += words[i] != image_word(b >= w_first && b < w_end ? wseed : seed, i);
    }
    tally->check(wrong == 0,
                 ("the backing store matches the model (" + std::to_string(wrong) + " wrong words)")
                     .c_str());
  }
  rig.reset();
}

}  // namespace

int main(int argc, char** argv) {
  const bool small = argc > 1 && std::strcmp(argv[1], "--small") == 0;
  gpu::test::require_gpu("gpu_io_test");
  const uint64_t seed = 0x5eed0000ull + static_cast<uint64_t>(time(nullptr));
  gpu::test::Tally tally;
  if (small) {
    run({"virtual_queue", Via::kVirtual, 1, 1, 64, 2048}, seed, &tally);
    run({"virtual_queue x2", Via::kVirtual, 2, 1, 64, 2048}, seed, &tally);
    run({"locked_queue", Via::kLocked, 1, 1, 64, 2048}, seed, &tally);
  } else {
    run({"virtual_queue", Via::kVirtual, 1, 1, 8192, 1u << 15}, seed, &tally);
    run({"virtual_queue x4", Via::kVirtual, 4, 2, 16384, 1u << 16}, seed, &tally);
    run({"locked_queue", Via::kLocked, 1, 1, 4096, 1u << 14}, seed, &tally);
  }
  std::printf("gpu_io_test: %s (%d failed)\n", tally.failed ? "FAILED" : "PASSED", tally.failed);
  return tally.failed ? 1 : 0;
}
