// mkfs.warpfs: formats a DEVICE (an emulated NVMe image, created if missing, or a VFIO
// controller), or with --raid a set of them, with an empty warpfs (fs/FORMAT.md). Refuses to
// overwrite a filesystem or data without --force.
#include <getopt.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "args.h"
#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/format.h"
#include "warpfs/fs/mkfs.h"

using namespace warpfs;

namespace {

void usage(FILE* f) {
  std::fprintf(
      f,
      "usage: mkfs.warpfs [options] DEVICE\n"
      "       mkfs.warpfs --raid 0|1|10 [--stripe SIZE] [options] DEVICE...\n"
      "  DEVICE              emu:PATH or PATH (an image file), or vfio:DDDD:BB:DD.F\n"
      "      --raid LEVEL    make a RAID 0, 1 or 10 set of the DEVICEs, in that order\n"
      "                      (mount it as DEVICE,DEVICE,...)\n"
      "      --stripe SIZE   RAID stripe unit, a power of two from 4 KiB (default 128 KiB,\n"
      "                      lowered to the smallest member's largest transfer)\n"
      "  -s, --size SIZE     create a missing image of SIZE bytes (K, M, G, T suffixes)\n"
      "  -f, --force         overwrite an existing filesystem or data\n"
      "  -N, --inodes N      number of inodes (default: one per 16 KiB)\n"
      "  -L, --label LABEL   volume label (up to 63 bytes)\n"
      "  -J, --journal-size SIZE  journal size (default: 1/64 of the device, 1-128 MiB)\n"
      "  -m, --reserved PERCENT   data blocks kept for root (0-50, default 5)\n"
      "      --resuid UID    a user who may use the kept blocks too\n"
      "      --resgid GID    a group whose members may use them too\n"
      "  -E resize=SIZE      keep room to grow to SIZE (resize.warpfs; blocks, or bytes\n"
      "                      with K, M, G, T; default: 1024 times the device, at most 64 TiB)\n"
      "  -q, --quiet         print nothing but errors\n"
      "  -V, --version       print the version\n");
}

std::string human(uint64_t bytes) {
  char buf[32];
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  std::snprintf(buf, sizeof buf, "%.1f %s", v, unit[u]);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  static const option longs[] = {{"size", required_argument, nullptr, 's'},
                                 {"force", no_argument, nullptr, 'f'},
                                 {"inodes", required_argument, nullptr, 'N'},
                                 {"label", required_argument, nullptr, 'L'},
                                 {"journal-size", required_argument, nullptr, 'J'},
                                 {"reserved", required_argument, nullptr, 'm'},
                                 {"resuid", required_argument, nullptr, 'U'},
                                 {"resgid", required_argument, nullptr, 'G'},
                                 {"quiet", no_argument, nullptr, 'q'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {"version", no_argument, nullptr, 'V'},
                                 {"raid", required_argument, nullptr, 'R'},
                                 {"stripe", required_argument, nullptr, 'S'},
                                 {nullptr, 0, nullptr, 0}};
  uint64_t size = 0, journal = 0;
  bool force = false, quiet = false;
  fs::MkfsOptions mo;
  mo.reserved_percent = 5;  // as mke2fs
  bool raid = false;
  blockdev::RaidCreate rc;
  int c;
  while ((c = getopt_long(argc, argv, "s:fN:L:J:m:E:qhV", longs, nullptr)) != -1) {
    switch (c) {
      case 's':
        if (!tools::parse_size(optarg, &size) || size == 0) {
          std::fprintf(stderr, "mkfs.warpfs: bad size '%s'\n", optarg);
          return 2;
        }
        break;
      case 'f':
        force = true;
        break;
      case 'E': {
        uint64_t blocks = 0;
        if (std::strncmp(optarg, "resize=", 7) != 0 || !tools::parse_blocks(optarg + 7, &blocks) ||
            blocks == 0) {
          std::fprintf(stderr, "mkfs.warpfs: -E knows resize=SIZE only ('%s')\n", optarg);
          return 2;
        }
        mo.resize_max_blocks = blocks;
        break;
      }
      case 'N':
        if (!tools::parse_size(optarg, &mo.inodes) || mo.inodes == 0) {
          std::fprintf(stderr, "mkfs.warpfs: bad inode count '%s'\n", optarg);
          return 2;
        }
        break;
      case 'L':
        mo.label = optarg;
        if (mo.label.size() > 63) {
          std::fprintf(stderr, "mkfs.warpfs: the label is longer than 63 bytes\n");
          return 2;
        }
        break;
      case 'J':
        if (!tools::parse_size(optarg, &journal) || journal < 64 * fs::kBlockSize) {
          std::fprintf(stderr, "mkfs.warpfs: bad journal size '%s' (at least 256 KiB)\n", optarg);
          return 2;
        }
        mo.journal_blocks =
            static_cast<uint32_t>(std::min<uint64_t>(journal / fs::kBlockSize, 1u << 20));
        break;
      case 'm':
        if (!tools::parse_reserved_percent(optarg, &mo.reserved_percent)) {
          std::fprintf(stderr, "mkfs.warpfs: bad reserved percentage '%s' (0 to 50)\n", optarg);
          return 2;
        }
        break;
      case 'U':
      case 'G': {
        uint64_t v = 0;
        if (!tools::parse_u64(optarg, UINT32_MAX - 1, &v)) {
          std::fprintf(stderr, "mkfs.warpfs: bad %s '%s' (a number)\n", c == 'U' ? "uid" : "gid",
                       optarg);
          return 2;
        }
        (c == 'U' ? mo.reserved_uid : mo.reserved_gid) = static_cast<uint32_t>(v);
        break;
      }
      case 'q':
        quiet = true;
        break;
      case 'R': {
        uint64_t v = 0;
        if (!tools::parse_u64(optarg, 10, &v) || (v != 0 && v != 1 && v != 10)) {
          std::fprintf(stderr, "mkfs.warpfs: --raid takes 0, 1 or 10 ('%s')\n", optarg);
          return 2;
        }
        raid = true;
        rc.level = static_cast<uint32_t>(v);
        break;
      }
      case 'S': {
        uint64_t bytes = 0;
        if (!tools::parse_size(optarg, &bytes) || bytes < fs::kBlockSize || bytes > (16u << 20) ||
            (bytes & (bytes - 1)) != 0) {
          std::fprintf(stderr,
                       "mkfs.warpfs: bad stripe '%s' (a power of two from 4 KiB to 16 MiB)\n",
                       optarg);
          return 2;
        }
        rc.stripe_blocks = static_cast<uint32_t>(bytes / fs::kBlockSize);
        break;
      }
      default:  // -h, -V, or not an option
        return tools::help_version_or_usage(c, "mkfs.warpfs", usage, 0, 2);
    }
  }
  // The DEVICEs: one, or with --raid several (as arguments or one comma-separated list).
  std::vector<std::string> members;
  for (int i = optind; i < argc; ++i)
    for (const std::string& m : blockdev::split_device_list(argv[i])) members.push_back(m);
  if (members.empty() || (!raid && argc - optind != 1)) {
    usage(stderr);
    return 2;
  }
  if (!raid && members.size() > 1) {
    std::fprintf(stderr, "mkfs.warpfs: several devices make a RAID set: give --raid 0, 1 or 10\n");
    return 2;
  }
  if (raid) {
    if (std::string p = blockdev::raid_level_problem(rc.level, members.size()); !p.empty()) {
      std::fprintf(stderr, "mkfs.warpfs: %s\n", p.c_str());
      return 2;
    }
  }
  if (rc.stripe_blocks != 0 && !raid) {
    std::fprintf(stderr, "mkfs.warpfs: --stripe needs --raid\n");
    return 2;
  }
  std::string device;
  for (const std::string& m : members) device += (device.empty() ? "" : ",") + m;
  mo.root_uid = static_cast<uint32_t>(getuid());
  mo.root_gid = static_cast<uint32_t>(getgid());

  std::string err;
  bool creating = false;
  for (const std::string& m : members) {
    nvme::DeviceSpec spec;
    if (!nvme::parse_device(m, &spec, &err)) {
      std::fprintf(stderr, "mkfs.warpfs: %s\n", err.c_str());
      return 2;
    }
    const bool missing =
        spec.kind == nvme::DeviceSpec::Kind::kEmulated && access(spec.path.c_str(), F_OK) != 0;
    if (missing && size == 0) {
      std::fprintf(stderr, "mkfs.warpfs: %s does not exist; give --size to create it\n",
                   spec.path.c_str());
      return 1;
    }
    creating |= missing;
    if (!missing && size != 0 && spec.kind == nvme::DeviceSpec::Kind::kEmulated && !quiet) {
      std::fprintf(stderr, "mkfs.warpfs: %s exists; --size ignored (it keeps its size)\n",
                   spec.path.c_str());
    }
  }
  blockdev::StackOptions so;
  so.create_bytes = size;  // for missing images only
  so.log = [](const std::string& s) { std::fprintf(stderr, "mkfs.warpfs: %s\n", s.c_str()); };
  so.block_bytes = fs::kBlockSize;
  if (raid) {
    // Each member is checked for a filesystem or data first: the labels overwrite block 0.
    for (const std::string& m : members) {
      auto one = blockdev::DeviceStack::open(m, so, &err);
      if (!one) {
        std::fprintf(stderr, "mkfs.warpfs: %s\n", err.c_str());
        return 1;
      }
      std::string what;
      if (!force && fs::probe_existing(one->device(), &what) != fs::Existing::kNothing) {
        std::fprintf(stderr, "mkfs.warpfs: %s contains %s; use --force to overwrite it\n",
                     m.c_str(), what.c_str());
        return 1;
      }
    }
    if (!blockdev::create_raid_set(members, rc, so, force, &err)) {
      std::fprintf(stderr, "mkfs.warpfs: %s\n", err.c_str());
      return 1;
    }
  }
  auto stack = blockdev::DeviceStack::open(device, so, &err);
  if (!stack) {
    std::fprintf(stderr, "mkfs.warpfs: %s\n", err.c_str());
    return 1;
  }
  blockdev::BlockDevice& dev = stack->device();
  if (!creating && !force && !raid) {
    std::string what;
    if (fs::probe_existing(dev, &what) != fs::Existing::kNothing) {
      std::fprintf(stderr, "mkfs.warpfs: %s contains %s; use --force to overwrite it\n",
                   device.c_str(), what.c_str());
      return 1;
    }
  }
  fs::Geometry g;
  if (!fs::plan_geometry(dev.block_count(), mo, &g, &err)) {
    std::fprintf(stderr, "mkfs.warpfs: %s: %s\n", device.c_str(), err.c_str());
    return 1;
  }
  if (!quiet) {
    std::printf("formatting %s: %s, %" PRIu64 " blocks of %u B\n", device.c_str(),
                human(g.block_count * fs::kBlockSize).c_str(), g.block_count, fs::kBlockSize);
    if (blockdev::RaidBlockDevice* r = stack->raid()) {
      std::printf("  RAID %u over %u members, stripe %u KiB\n", rc.level, r->map().members,
                  r->map().stripe * fs::kBlockSize / 1024);
    }
    std::printf("  %u block groups of up to %u blocks, %u inodes each (%" PRIu64 " inodes)\n",
                g.group_count, fs::kBlocksPerGroup, g.inodes_per_group, g.inode_count);
    std::printf("  journal %u blocks (%s), metadata %" PRIu64 " blocks, label '%s'\n",
                g.journal_blocks, human(uint64_t{g.journal_blocks} * fs::kBlockSize).c_str(),
                g.metadata_blocks, mo.label.c_str());
    std::printf("  %" PRIu64 " blocks (%g %%) kept for root\n",
                fs::reserved_blocks_for(g.block_count - g.metadata_blocks, mo.reserved_percent),
                mo.reserved_percent);
  }
  const bool show_progress = !quiet && g.group_count >= 16 && isatty(STDOUT_FILENO);
  const bool log_progress = !quiet && g.group_count >= 16 && !show_progress;
  blockdev::Status s = fs::format(dev, mo, g, [&](uint64_t done, uint64_t total) {
    if (show_progress) {
      std::printf("\r  writing block groups: %" PRIu64 "/%" PRIu64, done, total);
      if (done == total) std::printf("\n");
      std::fflush(stdout);
    } else if (log_progress && (done == total || done % 64 == 0)) {
      std::printf("  writing block groups: %" PRIu64 "/%" PRIu64 "\n", done, total);
    }
  });
  if (!s.is_ok()) {
    std::fprintf(stderr, "mkfs.warpfs: %s: writing the filesystem failed: %s\n", device.c_str(),
                 s.to_string().c_str());
    return 1;
  }
  if (!quiet) std::printf("done: %s holds an empty warpfs\n", device.c_str());
  return 0;
}
