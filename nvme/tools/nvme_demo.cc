// warpfs-nvme-demo: drives the emulated NVMe controller end to end, the project's main job
// until the filesystem exists. It creates (or opens) an image, brings the controller up,
// prints what Identify says, writes a patterned region with several threads keeping 32
// commands each in flight, flushes, verifies, shuts down, powers the controller up again on
// the same image and verifies once more, then prints the SMART log.
#include <getopt.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/device.h"
#include "warpfs/nvme/io_batch.h"
#include "warpfs/nvme/io_engine.h"

using namespace warpfs::nvme;

namespace {

struct Options {
  std::string device;
  uint64_t size = 256ull << 20;
  uint32_t lba_bytes = 512;
  unsigned threads = 2;
  uint64_t blocks = 16384;  // blocks written and verified
};

void usage(FILE* f) {
  std::fprintf(f,
               "usage: warpfs-nvme-demo [--size BYTES] [--lba-bytes 512|4096] [--threads N]\n"
               "                        [--blocks N] DEVICE\n"
               "DEVICE is emu:PATH or PATH (an image file; created with --size if missing).\n");
}

bool parse(int argc, char** argv, Options* o) {
  static const option longs[] = {
      {"size", required_argument, nullptr, 's'},    {"lba-bytes", required_argument, nullptr, 'l'},
      {"threads", required_argument, nullptr, 't'}, {"blocks", required_argument, nullptr, 'b'},
      {"help", no_argument, nullptr, 'h'},          {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", longs, nullptr)) != -1) {
    char* end = nullptr;
    const uint64_t v = optarg ? std::strtoull(optarg, &end, 0) : 0;
    const bool bad = optarg && (*end != '\0' || end == optarg);
    switch (c) {
      case 's':
        o->size = v;
        break;
      case 'l':
        o->lba_bytes = static_cast<uint32_t>(v);
        break;
      case 't':
        o->threads = static_cast<unsigned>(v);
        break;
      case 'b':
        o->blocks = v;
        break;
      case 'h':
        usage(stdout);
        std::exit(0);
      default:
        return false;
    }
    if (bad) {
      std::fprintf(stderr, "warpfs-nvme-demo: '%s' is not a number\n", optarg);
      return false;
    }
  }
  if (optind + 1 != argc) return false;
  o->device = argv[optind];
  if ((o->lba_bytes != 512 && o->lba_bytes != 4096) || o->threads == 0 || o->threads > 64 ||
      o->blocks == 0 || o->size < (1u << 20)) {
    std::fprintf(stderr,
                 "warpfs-nvme-demo: --lba-bytes must be 512 or 4096, --threads 1..64, "
                 "--blocks > 0, --size >= 1 MiB\n");
    return false;
  }
  return true;
}

std::string trimmed(const char* s, size_t n) {
  std::string r(s, n);
  while (!r.empty() && (r.back() == ' ' || r.back() == '\0')) r.pop_back();
  return r;
}

uint64_t word(uint64_t lba, uint64_t i, uint64_t gen) {
  return (lba * 0x9e3779b97f4a7c15ull) ^ (gen << 48) ^ i;
}

// Writes (or reads and checks) `blocks` blocks from LBA 0 with `threads` threads, each
// keeping up to 32 commands of 8 blocks in flight through an IoBatch.
bool pass(Transport& t, IoEngine& e, const NamespaceInfo& ns, const Options& o, bool write,
          uint64_t gen, double* seconds) {
  const uint32_t per_cmd = std::max<uint32_t>(1, 4096 / ns.lba_bytes);
  const uint64_t cmds = (o.blocks + per_cmd - 1) / per_cmd;
  std::atomic<uint64_t> next{0}, bad{0}, failed{0};
  const uint64_t t0 = warpfs::port::now_ns();
  std::vector<std::thread> ts;
  for (unsigned th = 0; th < o.threads; ++th) {
    ts.emplace_back([&] {
      DmaRegion buf;
      if (!t.dma_alloc(IoBatch::kWidth * 4096ull, &buf).is_ok()) return failed.fetch_add(1), void();
      auto* base = static_cast<uint64_t*>(buf.vaddr);
      for (;;) {
        const uint64_t first = next.fetch_add(IoBatch::kWidth);
        if (first >= cmds) break;
        const uint64_t n = std::min<uint64_t>(IoBatch::kWidth, cmds - first);
        IoBatch b(e.mapper());
        for (uint64_t i = 0; i < n; ++i) {
          const uint64_t lba = (first + i) * per_cmd;
          uint64_t* p = base + i * 512;
          if (write) {
            for (uint64_t w = 0; w < 512; ++w) p[w] = word(lba, w, gen);
          } else {
            std::memset(p, 0, 4096);
          }
          SubmissionEntry c =
              write ? make_write(ns.nsid, lba, per_cmd) : make_read(ns.nsid, lba, per_cmd);
          c.prp1 = buf.iova + i * 4096;
          b.submit(c, Priority::kBulk);
        }
        failed += static_cast<uint64_t>(b.wait_all());
        if (write) continue;
        for (uint64_t i = 0; i < n; ++i) {
          const uint64_t lba = (first + i) * per_cmd;
          for (uint64_t w = 0; w < 512; ++w) {
            if (base[i * 512 + w] != word(lba, w, gen)) {
              bad.fetch_add(1);
              break;
            }
          }
        }
      }
      t.dma_free(buf);
    });
  }
  for (auto& th : ts) th.join();
  *seconds = static_cast<double>(warpfs::port::now_ns() - t0) / 1e9;
  if (failed.load() != 0) {
    std::fprintf(stderr, "warpfs-nvme-demo: %" PRIu64 " commands failed\n", failed.load());
    return false;
  }
  if (bad.load() != 0) {
    std::fprintf(stderr, "warpfs-nvme-demo: %" PRIu64 " blocks read back wrong\n", bad.load());
    return false;
  }
  return true;
}

// One power cycle of the controller: bring-up, identify, work, shutdown.
bool session(const Options& o, bool first, uint64_t gen) {
  DeviceSpec spec;
  std::string err;
  if (!parse_device(o.device, &spec, &err)) {
    std::fprintf(stderr, "warpfs-nvme-demo: %s\n", err.c_str());
    return false;
  }
  EmulatedConfig cfg;
  cfg.namespaces = {NamespaceConfig{o.lba_bytes, 0}};
  auto t = open_transport(spec, cfg, VfioOptions{}, o.size, &err);
  if (!t) {
    std::fprintf(stderr, "warpfs-nvme-demo: %s\n", err.c_str());
    return false;
  }
  auto c = Controller::open(*t, ControllerOptions{}, &err);
  if (!c) {
    std::fprintf(stderr, "warpfs-nvme-demo: %s: %s\n", o.device.c_str(), err.c_str());
    return false;
  }
  const IdentifyController& id = c->identify();
  if (c->namespaces().empty()) {
    std::fprintf(stderr, "warpfs-nvme-demo: %s has no usable namespace\n", o.device.c_str());
    return false;
  }
  const NamespaceInfo& ns = c->namespaces()[0];
  if (first) {
    std::printf("controller: %s, serial %s, firmware %s, NVMe %u.%u\n",
                trimmed(id.mn, sizeof id.mn).c_str(), trimmed(id.sn, sizeof id.sn).c_str(),
                trimmed(id.fr, sizeof id.fr).c_str(), id.ver >> 16, (id.ver >> 8) & 0xff);
    std::printf(
        "            max transfer %u KiB, %u I/O queue pairs of up to %u entries, %s "
        "arbitration, volatile write cache %s\n",
        c->max_transfer_bytes() / 1024, c->io_queues_granted(), c->max_queue_entries(),
        c->wrr() ? "weighted round robin" : "round robin",
        c->volatile_write_cache() ? "present" : "absent");
    for (const NamespaceInfo& n : c->namespaces()) {
      std::printf("namespace %u: %" PRIu64
                  " blocks of %u B (%.1f MiB), atomic write unit %u "
                  "blocks\n",
                  n.nsid, n.lba_count, n.lba_bytes,
                  static_cast<double>(n.lba_count * n.lba_bytes) / (1 << 20),
                  n.atomic_write_blocks);
    }
  }
  Options run = o;
  run.blocks = std::min<uint64_t>(o.blocks, ns.lba_count);
  auto e = IoEngine::create(*c, EngineOptions{}, &err);
  if (!e) {
    std::fprintf(stderr, "warpfs-nvme-demo: %s\n", err.c_str());
    return false;
  }
  double secs = 0;
  const double mib = static_cast<double>(run.blocks * ns.lba_bytes) / (1 << 20);
  if (first) {
    if (!pass(*t, *e, ns, run, true, gen, &secs)) return false;
    std::printf("wrote    %.1f MiB with %u threads x 32 in flight: %.0f MiB/s\n", mib, run.threads,
                mib / secs);
    Status s = e->execute(make_flush(ns.nsid), Priority::kMetadata);
    if (!s.is_ok()) {
      std::fprintf(stderr, "warpfs-nvme-demo: flush failed: %s\n", s.to_string().c_str());
      return false;
    }
  }
  if (!pass(*t, *e, ns, run, false, gen, &secs)) return false;
  std::printf("verified %.1f MiB %s: %.0f MiB/s\n", mib,
              first ? "after flush" : "after shutdown and power-up", mib / secs);
  if (!first) {
    SmartLog log{};
    SubmissionEntry cmd{};
    cmd.opcode = admin::kGetLogPage;
    cmd.nsid = io::kBroadcastNsid;
    cmd.cdw10 = lid::kSmartHealth | ((sizeof log / 4 - 1) << 16);
    if (c->admin(cmd, &log, sizeof log, false, nullptr).is_ok()) {
      uint64_t reads = 0, errors = 0;
      std::memcpy(&reads, log.host_reads, 8);
      std::memcpy(&errors, log.error_log_entries, 8);
      std::printf("SMART: %" PRIu64 " read commands this power cycle, %" PRIu64
                  " error log entries, temperature %d C\n",
                  reads, errors, log.temperature - 273);
    }
  }
  e.reset();
  Status s = c->shutdown();
  if (!s.is_ok()) {
    std::fprintf(stderr, "warpfs-nvme-demo: shutdown failed: %s\n", s.to_string().c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) {
    usage(stderr);
    return 2;
  }
  const uint64_t gen = warpfs::port::now_ns();
  if (!session(o, true, gen) || !session(o, false, gen)) return 1;
  std::printf("ok: %s\n", o.device.c_str());
  return 0;
}
