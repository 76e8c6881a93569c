// libFuzzer target: fsck of a corrupted warpfs image (tests/fuzz/README.md).
//
// The input patches one of the base images (image.h). Then, on the same device:
//   1. fsck in check mode (fsck -n): it never writes; its exit code is 0 (nothing found),
//      4 (problems, each reported) or 8 (operational, with a message);
//   2. fsck in repair mode (fsck -y): a valid exit code (1, 4, 8 or'ed, or 0);
//   3. if it claims to have fixed everything (exit 0 or 1) and the device did not fail on
//      purpose: a second check finds nothing, the filesystem mounts, and (unless the input
//      says not to) survives a walk with changes and an unmount, after which a check still
//      finds nothing.
// Step 3 is fsck's contract (fsck.h: repairs as e2fsck -y does; fsck_test: "a third run is
// clean and the filesystem mounts"); a violation aborts, and the message names the lines.
//
// byte 0 bits 3-7 (image.h): bit 3 replay_journal = false, bit 4 verbose, bit 5
// skip_if_clean, bit 6 no walk after the repair.
// WARPFS_FUZZ_VERBOSE=1 prints every report line (for triage).
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "image.h"
#include "walk.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/fs/fsck.h"

using namespace warpfs;

namespace {

struct Run {
  fs::FsckResult r;
  std::string text;
};

Run run_fsck(fuzz::CowDevice& dev, const fs::FsckOptions& o, const char* what) {
  static const bool verbose = std::getenv("WARPFS_FUZZ_VERBOSE") != nullptr;
  Run run;
  size_t lines = 0;
  run.r = fs::fsck(dev, o, [&](const std::string& s) {
    if (++lines <= 40) run.text += "  " + s + "\n";
  });
  if (!run.r.error.empty()) run.text += "  error: " + run.r.error + "\n";
  if (verbose)
    std::fprintf(stderr, "fsck %s: exit %d\n%s", what, run.r.exit_code, run.text.c_str());
  return run;
}

// The promises every result keeps.
void check_result(const Run& run, bool repair) {
  const fs::FsckResult& r = run.r;
  const int e = r.exit_code;
  fuzz::require((e & ~(fs::kFsckCorrected | fs::kFsckUncorrected | fs::kFsckOperational)) == 0,
                "fsck returned exit code " + std::to_string(e));
  if (e & fs::kFsckOperational) {
    fuzz::require(!r.error.empty(), "fsck exit 8 without an error message");
    return;
  }
  if (!repair) {
    fuzz::require(!(e & fs::kFsckCorrected), "fsck -n says it corrected something");
    fuzz::require(
        (e == fs::kFsckUncorrected) == (r.problems > 0),
        "fsck -n exit " + std::to_string(e) + " with " + std::to_string(r.problems) + " problems");
  }
  fuzz::require(r.problems == 0 || !r.lines.empty(), "fsck counted problems but reported none");
  fuzz::require(r.corrected <= r.problems, "fsck corrected more problems than it found");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::base_image(0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in;
  std::unique_ptr<fuzz::CowDevice> dev = fuzz::make_device(data, size, &in);
  const uint8_t t = in.target_flags;
  fs::FsckOptions o;
  o.replay_journal = !(t & 1);
  o.verbose = t & 2;
  o.skip_if_clean = t & 4;

  const uint64_t before = dev->writes();
  const Run check = run_fsck(*dev, o, "-n");
  fuzz::require(dev->writes() == before,
                "fsck -n wrote " + std::to_string(dev->writes() - before) + " blocks");
  check_result(check, false);

  o.repair = true;
  const Run fix = run_fsck(*dev, o, "-y");
  check_result(fix, true);
  if (in.fault != 0 || (fix.r.exit_code & ~fs::kFsckCorrected) != 0 || fix.r.skipped) return 0;

  // It says everything is fixed.
  fs::FsckOptions again;
  const Run after = run_fsck(*dev, again, "-n after -y");
  fuzz::require(after.r.exit_code == fs::kFsckClean,
                "fsck -y exited " + std::to_string(fix.r.exit_code) +
                    " (all fixed), but a check then exits " + std::to_string(after.r.exit_code) +
                    ":\n" + after.text + "what -y reported:\n" + fix.text);
  fuzz::MountLog log;
  fs::MountOptions mo;
  mo.commit_interval_ms = 3'600'000;
  mo.log = [&log](const std::string& s) { log.add(s); };
  std::string err;
  std::unique_ptr<fs::Filesystem> f = fs::Filesystem::mount(*dev, mo, &err);
  fuzz::require(f != nullptr,
                "fsck -y left a filesystem that does not mount: " + err + "\n" + log.text());
  // A repaired image with shared blocks (base 3) is walked too: its copy-on-write and the
  // counts lowered by truncate and unlink are the core's, and fsck judges them after.
  if (t & 8) return 0;
  fuzz::WalkOptions wo;
  fuzz::walk(*f, log, wo);
  const int rc = f->unmount();
  fuzz::require(rc == 0,
                "unmount of a repaired filesystem: " + std::to_string(rc) + "\n" + log.text());
  f.reset();
  const Run last = run_fsck(*dev, again, "-n after use");
  fuzz::require(last.r.exit_code == fs::kFsckClean,
                "a repaired filesystem, mounted, changed and unmounted, then fails fsck -n:\n" +
                    last.text + "mount log:\n" + log.text());
  return 0;
}
