// The default mount options a superblock may keep (tune.h, FORMAT.md "Default mount
// options"): the mounted core's daemon applies them, tune.warpfs sets them. The rest of
// tune.h is offline code (fs/src/offline/tune.cc).
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "warpfs/fs/tune.h"

namespace warpfs::fs {

std::string parse_default_mount_options(const std::string& s, DefaultMountOptions* out) {
  if (s.size() >= sizeof(Superblock::mount_opts)) return "longer than 63 bytes";
  DefaultMountOptions o;
  size_t pos = 0;
  while (pos <= s.size() && !s.empty()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string opt = s.substr(pos, comma - pos);
    pos = comma + 1;
    if (opt == "ro" || opt == "rw") {
      o.read_only = opt == "ro";
    } else if (opt == "discard" || opt == "nodiscard") {
      o.discard = opt == "discard";
    } else if (opt.rfind("meta_cache_mb=", 0) == 0) {
      const std::string v = opt.substr(14);
      char* end = nullptr;
      errno = 0;
      const unsigned long n = std::strtoul(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno != 0 || v[0] == '-' || n > 65536) {
        return "meta_cache_mb wants a number of MiB, 0 to 65536: \"" + v + "\"";
      }
      o.meta_cache_mb = static_cast<uint32_t>(n);
    } else {
      return "\"" + opt +
             "\" is not a filesystem mount option (ro, rw, discard, nodiscard, meta_cache_mb=N)";
    }
  }
  *out = o;
  return "";
}

std::string default_mount_options(const Superblock& sb) {
  const size_t n = strnlen(sb.mount_opts, sizeof sb.mount_opts);
  return n == sizeof sb.mount_opts ? "" : std::string(sb.mount_opts, n);
}

}  // namespace warpfs::fs
