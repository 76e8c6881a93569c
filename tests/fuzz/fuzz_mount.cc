// libFuzzer target: mount a corrupted warpfs image and use it (tests/fuzz/README.md).
//
// The input patches one of the base images (image.h: which structure, which bytes; the
// checksums are recomputed unless the input says not to). The image is mounted, read-write
// or read-only, on a RAM device that may be made to fail part-way; then walk() looks at
// everything and changes some of it, as the kernel would through FUSE, and it is unmounted.
// Promises checked besides "no crash, no sanitizer report, no hang": a failed mount says why;
// every call returns 0 or a documented errno (walk.h); a read-only mount writes nothing
// after the mount itself (a mount replays the journal, as ext4's does); unmount returns 0
// or EIO.
//
// byte 0 bits 3-7 (image.h): bit 3 read-only, bits 4-5 readdir page size (all, 1, 3, 64
// entries), bit 6 discard (trim freed blocks), bit 7 look only (no changes).
// WARPFS_FUZZ_VERBOSE=1 prints the mount's log and error (for triage).
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "image.h"
#include "walk.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/fs/format.h"

using namespace warpfs;

namespace {

// The primary superblock's state (clean, dirty), or 0 if it is not a valid superblock.
uint32_t superblock_state(const fuzz::CowDevice& dev) {
  fs::Superblock sb;
  std::memcpy(&sb, dev.block(0), sizeof sb);
  if (sb.magic != fs::kMagic || sb.checksum != fs::superblock_checksum(sb)) return 0;
  return sb.state;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::base_image(0);  // builds every base image once, outside the timed runs
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool verbose = std::getenv("WARPFS_FUZZ_VERBOSE") != nullptr;
  fuzz::Input in;
  std::unique_ptr<fuzz::CowDevice> dev = fuzz::make_device(data, size, &in);
  const uint8_t t = in.target_flags;
  static const size_t kPages[] = {0, 1, 3, 64};
  fuzz::WalkOptions wo;
  wo.readdir_page = kPages[(t >> 1) & 3];
  wo.write = !(t & 16);
  wo.faults = in.fault != 0;

  fuzz::MountLog log;
  fs::MountOptions mo;
  mo.read_only = t & 1;
  mo.discard = t & 8;
  mo.commit_interval_ms = 3'600'000;  // the walk's sync() and the unmount commit
  mo.log = [&log](const std::string& s) { log.add(s); };
  std::string err;
  const uint32_t state = superblock_state(*dev);
  std::unique_ptr<fs::Filesystem> f = fs::Filesystem::mount(*dev, mo, &err);
  if (verbose)
    std::fprintf(stderr, "base %u, %zu patches, mount: %s\n", in.base, in.patches,
                 f ? "ok" : err.c_str());
  if (!f) {
    fuzz::require(!err.empty(), "the mount failed without saying why");
    if (verbose)
      std::fprintf(stderr, "%s%llu blocks written\n", log.text().c_str(),
                   (unsigned long long)dev->writes());
    // fsck.warpfs without -f skips a clean filesystem: a failed mount must not say "clean".
    fuzz::require(state != fs::kStateDirty || superblock_state(*dev) != fs::kStateClean,
                  "a failed mount (" + err + ") marked the dirty filesystem clean");
    return 0;
  }
  const uint64_t writes = dev->writes();
  fuzz::walk(*f, log, wo);
  const int rc = f->unmount();
  fuzz::require(rc == 0 || rc == EIO, "unmount returned " + std::to_string(rc));
  if (mo.read_only) {
    fuzz::require(dev->writes() == writes, "the read-only mount wrote " +
                                               std::to_string(dev->writes() - writes) + " blocks");
  }
  if (verbose) std::fprintf(stderr, "%sunmount: %d\n", log.text().c_str(), rc);
  return 0;
}
