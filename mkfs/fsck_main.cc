// fsck.warpfs: checks a warpfs on DEVICE (an emulated NVMe image or a VFIO controller) and,
// with -y, repairs it (fs/FORMAT.md "Invariants"; what is checked and repaired is in
// fs/src/fsck.cc). Without -y nothing is written: the device stays byte-identical, unless
// --resync first rebuilds a RAID set's failed members (fs/FORMAT.md "Resync").
//
// Exit codes are e2fsck's: 0 clean, 1 errors corrected, 4 errors left uncorrected,
// 8 operational error (no device, not a warpfs, I/O error), 16 usage error.
#include <fcntl.h>
#include <getopt.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "args.h"
#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/format.h"
#include "warpfs/fs/fsck.h"

using namespace warpfs;

namespace {

void usage(FILE* f) {
  std::fprintf(
      f,
      "usage: fsck.warpfs [-y | -p | -a | -n] [-f] [-v] [-j N] [-C FD] [--resync [--replace]]\n"
      "                   DEVICE\n"
      "  DEVICE  emu:PATH or PATH (an image file), or vfio:DDDD:BB:DD.F; a RAID set's\n"
      "          devices as DEV,DEV,... in order\n"
      "  -y      repair what is found (answer yes to every question)\n"
      "  -p, -a  repair without questions, as fsck(8) and systemd-fsck ask (as -y:\n"
      "          warpfs asks nothing)\n"
      "  -n      check only, write nothing (the default)\n"
      "  -f      check even a filesystem that was cleanly unmounted\n"
      "  -v      verbose: also say what each pass found\n"
      "  -j N    scan inodes and groups on N threads (default 0: every hardware\n"
      "          thread; 1: one); the outcome is the same at any N\n"
      "  -C FD   progress: lines \"PASS DONE TOTAL DEVICE\" to descriptor FD (e2fsck's\n"
      "          format, for fsck(8) and systemd-fsck); 0: a progress line on a terminal\n"
      "  --resync  a RAID 1/10 set: first rebuild its failed members, and blank\n"
      "          devices given in a member's position, from their mirrors (offline;\n"
      "          writes the set even without -y), then check it as -f\n"
      "  --replace  with --resync: also overwrite a device given in a member's place\n"
      "          that is not blank, and rebuild a member the newest label does not\n"
      "          mark failed (its own device lost or gone)\n"
      "  -V      print the version (also --version)\n");
}

}  // namespace

int main(int argc, char** argv) {
  bool yes = false, no = false, force = false, verbose = false, resync = false, replace = false;
  static const option longs[] = {{"help", no_argument, nullptr, 'h'},
                                 {"version", no_argument, nullptr, 'V'},
                                 {"resync", no_argument, nullptr, 'R'},
                                 {"replace", no_argument, nullptr, 'P'},
                                 {nullptr, 0, nullptr, 0}};
  int c;
  int progress_fd = -1;  // -C FD
  unsigned threads = 0;  // -j N
  while ((c = getopt_long(argc, argv, "ynfvpaC:j:hV", longs, nullptr)) != -1) {
    switch (c) {
      case 'y':
      case 'p':
      case 'a':
        yes = true;
        break;
      case 'C': {
        char* end = nullptr;
        const long fd = std::strtol(optarg, &end, 10);
        if (end == optarg || *end != '\0' || fd < 0 || fd > 1 << 20 ||
            (fd > 0 && fcntl(static_cast<int>(fd), F_GETFD) < 0)) {
          std::fprintf(stderr, "fsck.warpfs: -C %s: not an open file descriptor\n", optarg);
          return fs::kFsckUsage;
        }
        progress_fd = static_cast<int>(fd);
        break;
      }
      case 'j': {
        char* end = nullptr;
        const unsigned long n = std::strtoul(optarg, &end, 10);
        if (end == optarg || *end != '\0' || optarg[0] == '-' || n > 1024) {
          std::fprintf(stderr, "fsck.warpfs: -j %s: not a thread count (0 to 1024)\n", optarg);
          return fs::kFsckUsage;
        }
        threads = static_cast<unsigned>(n);
        break;
      }
      case 'n':
        no = true;
        break;
      case 'R':
        resync = true;
        break;
      case 'P':
        replace = true;
        break;
      case 'f':
        force = true;
        break;
      case 'v':
        verbose = true;
        break;
      default:  // -h, -V, or not an option
        return tools::help_version_or_usage(c, "fsck.warpfs", usage, fs::kFsckClean,
                                            fs::kFsckUsage);
    }
  }
  if (optind + 1 != argc || (yes && no) || (resync && no) || (replace && !resync)) {
    if (replace && !resync) std::fprintf(stderr, "fsck.warpfs: --replace goes with --resync\n");
    if (yes && no) std::fprintf(stderr, "fsck.warpfs: -y and -n exclude each other\n");
    if (resync && no) std::fprintf(stderr, "fsck.warpfs: --resync writes; -n excludes it\n");
    usage(stderr);
    return fs::kFsckUsage;
  }
  const std::string device = argv[optind];
  std::string err;
  for (const std::string& member : blockdev::split_device_list(device)) {  // a RAID set's too
    nvme::DeviceSpec spec;
    if (!nvme::parse_device(member, &spec, &err)) {
      std::fprintf(stderr, "fsck.warpfs: %s\n", err.c_str());
      return fs::kFsckUsage;
    }
    if (spec.kind == nvme::DeviceSpec::Kind::kEmulated && access(spec.path.c_str(), F_OK) != 0) {
      std::fprintf(stderr, "fsck.warpfs: %s: no such device or image file\n", spec.path.c_str());
      return fs::kFsckOperational;
    }
  }
  blockdev::StackOptions so;
  so.log = [](const std::string& s) { std::fprintf(stderr, "fsck.warpfs: %s\n", s.c_str()); };
  so.block_bytes = fs::kBlockSize;
  const bool tty = isatty(STDOUT_FILENO);
  if (resync) {
    blockdev::RaidResyncReport rep;
    std::function<void(uint64_t, uint64_t)> progress;
    if (tty) {
      progress = [](uint64_t done, uint64_t total) {
        if (done % 4096 != 0 && done != total) return;  // every 16 MiB
        std::printf("\r  resync: %" PRIu64 "/%" PRIu64 " blocks", done, total);
        if (done == total) std::printf("\r\033[K");
        std::fflush(stdout);
      };
    }
    if (!blockdev::resync_raid_devices(device, so, progress, &rep, &err, replace)) {
      std::fprintf(stderr, "fsck.warpfs: resync: %s\n", err.c_str());
      return fs::kFsckOperational;
    }
    if (rep.rebuilt == 0) {
      std::printf("warpfs %s: RAID set not degraded: nothing to resync\n", device.c_str());
    } else {
      const std::vector<std::string> names = blockdev::split_device_list(device);
      for (uint32_t k = 0; k < names.size(); ++k) {
        if ((rep.rebuilt >> k) & 1)
          std::printf("warpfs %s: RAID member %u (%s) rebuilt\n", device.c_str(), k,
                      names[k].c_str());
      }
      std::printf("warpfs %s: resync copied %" PRIu64 " blocks; label generation %" PRIu64
                  ", not degraded\n",
                  device.c_str(), rep.blocks_copied, rep.generation);
    }
    force = true;  // the check that follows looks at the whole rebuilt set
  }
  // Without -y nothing is written: the image is opened read-only under a read lock, so
  // checks may run side by side (never beside a mount, mkfs or repair, which write-lock it).
  so.emulated.read_only = !yes;
  auto stack = blockdev::DeviceStack::open(device, so, &err);
  if (!stack) {
    std::fprintf(stderr, "fsck.warpfs: %s\n", err.c_str());
    return fs::kFsckOperational;
  }

  fs::FsckOptions o;
  o.repair = yes;
  o.skip_if_clean = !force;
  o.verbose = verbose;
  o.threads = threads;
  if (progress_fd > 0) {
    // e2fsck's -C FD protocol: "pass current max device", one line per step.
    o.progress = [progress_fd, device](uint64_t done, uint64_t total) {
      dprintf(progress_fd, "1 %" PRIu64 " %" PRIu64 " %s\n", done, total, device.c_str());
    };
  } else if (tty) {
    o.progress = [](uint64_t done, uint64_t total) {
      if (total < 16) return;
      std::printf("\r  inodes: group %" PRIu64 "/%" PRIu64, done, total);
      if (done == total) std::printf("\r\033[K");
      std::fflush(stdout);
    };
  }
  const fs::FsckResult r = fs::fsck(
      stack->device(), o, [](const std::string& line) { std::printf("%s\n", line.c_str()); });
  if (r.exit_code & fs::kFsckOperational) {
    std::fprintf(stderr, "fsck.warpfs: %s: %s\n", device.c_str(), r.error.c_str());
    return r.exit_code;
  }
  if (r.skipped) {
    std::printf("warpfs %s: clean, %" PRIu64 "/%" PRIu64 " files, %" PRIu64 "/%" PRIu64 " blocks\n",
                device.c_str(), r.inodes_used, r.inode_count, r.blocks_used, r.block_count);
  } else {
    std::printf("warpfs %s: %" PRIu64 "/%" PRIu64 " files (%" PRIu64 " directories), %" PRIu64
                "/%" PRIu64 " blocks\n",
                device.c_str(), r.inodes_used, r.inode_count, r.directories, r.blocks_used,
                r.block_count);
  }
  if (r.journal_transactions > 0 && !yes) {
    std::printf("warpfs %s: the journal holds %" PRIu64
                " committed transaction(s); a mount replays them\n",
                device.c_str(), r.journal_transactions);
  }
  if (r.exit_code & fs::kFsckCorrected) std::printf("***** the filesystem was modified *****\n");
  if (r.exit_code & fs::kFsckUncorrected) {
    std::printf("***** %s *****\n",
                yes ? "errors left uncorrected" : "errors found: run fsck.warpfs -y");
  }
  return r.exit_code;
}
