// resize.warpfs: grows an unmounted warpfs to its device's or image's new size, or to SIZE
// (fs/resize.h), as resize2fs does for ext4. Grow the image first (truncate -s), then run it.
// Exit codes: 0 done, 1 refused or failed (nothing changed, unless it says to run fsck), 2 usage.
#include <getopt.h>

#include <cinttypes>
#include <cstdio>
#include <string>

#include "args.h"
#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/format.h"
#include "warpfs/fs/resize.h"

using namespace warpfs;

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: resize.warpfs [options] DEVICE [SIZE]\n"
               "  DEVICE              emu:PATH or PATH (an image file), or vfio:DDDD:BB:DD.F\n"
               "  SIZE                the new size: blocks of 4096 bytes, or bytes with a K, M,\n"
               "                      G or T suffix (default: the whole device or image)\n"
               "  -q, --quiet         print nothing but errors\n"
               "  -V, --version       print the version\n"
               "Grows only, and only an unmounted, cleanly unmounted filesystem.\n");
}

}  // namespace

int main(int argc, char** argv) {
  static const option longs[] = {{"quiet", no_argument, nullptr, 'q'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {"version", no_argument, nullptr, 'V'},
                                 {nullptr, 0, nullptr, 0}};
  bool quiet = false;
  int c;
  while ((c = getopt_long(argc, argv, "qhV", longs, nullptr)) != -1) {
    switch (c) {
      case 'q':
        quiet = true;
        break;
      default:  // -h, -V, or not an option
        return tools::help_version_or_usage(c, "resize.warpfs", usage, 0, 2);
    }
  }
  if (optind + 1 != argc && optind + 2 != argc) {
    usage(stderr);
    return 2;
  }
  const std::string device = argv[optind];
  uint64_t blocks = 0;
  if (optind + 2 == argc && (!tools::parse_blocks(argv[optind + 1], &blocks) || blocks == 0)) {
    std::fprintf(stderr, "resize.warpfs: bad size '%s'\n", argv[optind + 1]);
    return 2;
  }
  blockdev::StackOptions so;
  so.log = [](const std::string& s) { std::fprintf(stderr, "resize.warpfs: %s\n", s.c_str()); };
  so.block_bytes = fs::kBlockSize;
  std::string err;
  // The image's write lock: refused beside a mount, as mkfs and tune.warpfs are.
  auto stack = blockdev::DeviceStack::open(device, so, &err);
  if (!stack) {
    std::fprintf(stderr, "resize.warpfs: %s\n", err.c_str());
    return 1;
  }
  fs::ResizeOptions ro;
  ro.log = so.log;
  fs::ResizeResult r;
  if (std::string why = fs::grow(stack->device(), blocks, ro, &r); !why.empty()) {
    std::fprintf(stderr, "resize.warpfs: %s: %s\n", device.c_str(), why.c_str());
    return 1;
  }
  if (!quiet) {
    std::printf("resize.warpfs: %s: grown from %" PRIu64 " to %" PRIu64
                " blocks (%u to %u groups)\n",
                device.c_str(), r.old_blocks, r.new_blocks, r.old_groups, r.new_groups);
  }
  return 0;
}
