// tune.warpfs: shows or changes the adjustable fields of an unmounted warpfs (fs/tune.h):
// label, blocks kept for root and who may use them, default journal commit interval, default
// mount options, the xattr_chain and shared_blocks features.
// Exit codes: 0 done, 1 refused or failed (nothing changed), 2 usage.
#include <getopt.h>

#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "args.h"
#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/format.h"
#include "warpfs/fs/tune.h"

using namespace warpfs;

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: tune.warpfs [options] DEVICE\n"
               "  DEVICE              emu:PATH or PATH (an image file), or vfio:DDDD:BB:DD.F\n"
               "  -l, --list          print the superblock's fields (also with no change asked)\n"
               "  -L, --label LABEL   set the volume label (up to 63 bytes)\n"
               "  -m, --reserved PERCENT   keep this share of the data blocks for root (0-50)\n"
               "  -r, --reserved-blocks N  keep N blocks for root\n"
               "  -u, --resuid UID    a user who may use the kept blocks too (0: root only)\n"
               "  -g, --resgid GID    a group whose members may use them too (0: root only)\n"
               "  -c, --commit SECONDS     default journal commit interval (0: 5 s)\n"
               "  -o, --mount-options OPTS default mount options: ro, rw, discard, nodiscard,\n"
               "                      meta_cache_mb=N, comma-separated (\"\": none); the command\n"
               "                      line's own options win\n"
               "  -E mount_opts=OPTS  the same, as tune2fs spells it\n"
               "  -O xattr_chain      enable extended attributes beyond one block (one way)\n"
               "  -O shared_blocks    enable data blocks shared by several files (one way)\n"
               "  -V, --version       print the version\n");
}

void list(const fs::Superblock& sb) {
  std::printf("label:                 %s\n", tools::label_string(sb).c_str());
  std::printf("uuid:                  %s\n", tools::uuid_string(sb).c_str());
  std::printf("state:                 %s\n", sb.state == fs::kStateClean ? "clean" : "not clean");
  std::printf("block size:            %u\n", sb.block_size);
  std::printf("blocks:                %" PRIu64 "\n", sb.block_count);
  std::printf("data blocks:           %" PRIu64 "\n", fs::data_blocks(sb));
  std::printf("free blocks:           %" PRIu64 "\n", sb.free_blocks);
  std::printf("reserved blocks:       %" PRIu64 "\n", sb.reserved_blocks);
  std::printf("reserved uid:          %u\n", sb.reserved_uid);
  std::printf("reserved gid:          %u\n", sb.reserved_gid);
  std::printf("inodes:                %" PRIu64 "\n", sb.inode_count);
  std::printf("free inodes:           %" PRIu64 "\n", sb.free_inodes);
  std::printf("block groups:          %u\n", sb.group_count);
  std::printf("journal blocks:        %u\n", sb.journal_blocks);
  std::printf("commit interval:       %u s%s\n", sb.commit_interval_s ? sb.commit_interval_s : 5,
              sb.commit_interval_s ? "" : " (default)");
  const std::string mo = fs::default_mount_options(sb);
  std::printf("default mount options: %s\n", mo.empty() ? "(none)" : mo.c_str());
  std::printf("mount count:           %" PRIu64 "\n", sb.mount_count);
  std::printf("xattr_chain:           %s\n",
              (sb.features & fs::kFeatureXattrChain) ? "on" : "off (one xattr block per inode)");
  std::printf("shared_blocks:         %s\n",
              (sb.features & fs::kFeatureSharedBlocks) ? "on" : "off (no block shared by files)");
}

}  // namespace

int main(int argc, char** argv) {
  static const option longs[] = {{"list", no_argument, nullptr, 'l'},
                                 {"label", required_argument, nullptr, 'L'},
                                 {"reserved", required_argument, nullptr, 'm'},
                                 {"reserved-blocks", required_argument, nullptr, 'r'},
                                 {"resuid", required_argument, nullptr, 'u'},
                                 {"resgid", required_argument, nullptr, 'g'},
                                 {"commit", required_argument, nullptr, 'c'},
                                 {"mount-options", required_argument, nullptr, 'o'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {"version", no_argument, nullptr, 'V'},
                                 {nullptr, 0, nullptr, 0}};
  fs::TuneRequest r;
  bool show = false;
  int c;
  uint64_t v = 0;
  while ((c = getopt_long(argc, argv, "lL:m:r:u:g:c:o:E:O:hV", longs, nullptr)) != -1) {
    switch (c) {
      case 'l':
        show = true;
        break;
      case 'L':
        if (std::strlen(optarg) > 63) {
          std::fprintf(stderr, "tune.warpfs: the label is longer than 63 bytes\n");
          return 2;
        }
        r.label = optarg;
        break;
      case 'm': {
        double p = 0;
        if (!tools::parse_reserved_percent(optarg, &p)) {
          std::fprintf(stderr, "tune.warpfs: bad reserved percentage '%s' (0 to 50)\n", optarg);
          return 2;
        }
        r.reserved_percent = p;
        break;
      }
      case 'r':
        if (!tools::parse_u64(optarg, UINT64_MAX, &v)) {
          std::fprintf(stderr, "tune.warpfs: bad block count '%s'\n", optarg);
          return 2;
        }
        r.reserved_blocks = v;
        break;
      case 'u':
      case 'g':
        if (!tools::parse_u64(optarg, UINT32_MAX - 1, &v)) {
          std::fprintf(stderr, "tune.warpfs: bad %s '%s' (a number)\n", c == 'u' ? "uid" : "gid",
                       optarg);
          return 2;
        }
        (c == 'u' ? r.reserved_uid : r.reserved_gid) = static_cast<uint32_t>(v);
        break;
      case 'c':
        if (!tools::parse_u64(optarg, 86400, &v)) {
          std::fprintf(stderr, "tune.warpfs: bad commit interval '%s' (0 to 86400 seconds)\n",
                       optarg);
          return 2;
        }
        r.commit_interval_s = static_cast<uint32_t>(v);
        break;
      case 'o':
      case 'E': {
        std::string opts = optarg;
        if (c == 'E') {
          if (opts.rfind("mount_opts=", 0) != 0) {
            std::fprintf(stderr, "tune.warpfs: -E knows mount_opts=OPTS only\n");
            return 2;
          }
          opts = opts.substr(11);
        }
        fs::DefaultMountOptions unused;
        if (std::string why = fs::parse_default_mount_options(opts, &unused); !why.empty()) {
          std::fprintf(stderr, "tune.warpfs: mount options: %s\n", why.c_str());
          return 2;
        }
        r.mount_opts = opts;
        break;
      }
      case 'O':
        if (std::string(optarg) == "xattr_chain") {
          r.enable_xattr_chain = true;
        } else if (std::string(optarg) == "shared_blocks") {
          r.enable_shared_blocks = true;
        } else {
          std::fprintf(stderr, "tune.warpfs: -O knows xattr_chain and shared_blocks only\n");
          return 2;
        }
        break;
      default:  // -h, -V, or not an option
        return tools::help_version_or_usage(c, "tune.warpfs", usage, 0, 2);
    }
  }
  if (optind + 1 != argc) {
    usage(stderr);
    return 2;
  }
  if (r.reserved_percent && r.reserved_blocks) {
    std::fprintf(stderr, "tune.warpfs: give -m or -r, not both\n");
    return 2;
  }
  const std::string device = argv[optind];
  const bool change = r.label || r.reserved_percent || r.reserved_blocks || r.reserved_uid ||
                      r.reserved_gid || r.commit_interval_s || r.mount_opts ||
                      r.enable_xattr_chain || r.enable_shared_blocks;
  blockdev::StackOptions so;
  so.log = [](const std::string& s) { std::fprintf(stderr, "tune.warpfs: %s\n", s.c_str()); };
  so.block_bytes = fs::kBlockSize;
  std::string err;
  // Like mkfs: the image's write lock (refused beside a mount, waited for beside a daemon
  // that is finishing its unmount).
  auto stack = blockdev::DeviceStack::open(device, so, &err);
  if (!stack) {
    std::fprintf(stderr, "tune.warpfs: %s\n", err.c_str());
    return 1;
  }
  fs::Superblock sb;
  if (!change) {
    if (std::string why = fs::read_tunable_superblock(stack->device(), &sb);
        !why.empty() && why.rfind("the filesystem was not cleanly", 0) != 0) {
      std::fprintf(stderr, "tune.warpfs: %s: %s\n", device.c_str(), why.c_str());
      return 1;
    }
    list(sb);
    return 0;
  }
  if (std::string why = fs::tune(stack->device(), r, &sb); !why.empty()) {
    std::fprintf(stderr, "tune.warpfs: %s: %s\n", device.c_str(), why.c_str());
    return 1;
  }
  if (show) list(sb);
  return 0;
}
