// What mkfs.warpfs, tune.warpfs and dump.warpfs parse and print alike: numbers from the
// command line, and the superblock's uuid and label as text.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "warpfs/fs/format.h"

namespace warpfs::tools {

// The end of every tool's option switch: -h prints the usage to standard output and -V the
// version, both ending with `ok`; anything else prints the usage to standard error and ends
// with `bad`. Returns the exit status.
inline int help_version_or_usage(int c, const char* prog, void (*usage)(FILE*), int ok, int bad) {
  if (c == 'h' || c == 'V') {
    if (c == 'h') {
      usage(stdout);
    } else {
      std::printf("%s %s\n", prog, WARPFS_VERSION);
    }
    return ok;
  }
  usage(stderr);
  return bad;
}

// A decimal number in [0, max]: no sign, no suffix, nothing after it.
inline bool parse_u64(const char* s, uint64_t max, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0' || errno != 0 || *s == '-' || *s == '+' || v > max) return false;
  *out = v;
  return true;
}

// A size in bytes, with an optional binary suffix K, M, G or T (and "iB" or "B" after it):
// "64M" -> 67108864. False on junk.
inline bool parse_size(const char* s, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || errno != 0) return false;
  uint64_t mul = 1;
  switch (*end) {
    case '\0':
      break;
    case 'k':
    case 'K':
      mul = 1ull << 10;
      ++end;
      break;
    case 'm':
    case 'M':
      mul = 1ull << 20;
      ++end;
      break;
    case 'g':
    case 'G':
      mul = 1ull << 30;
      ++end;
      break;
    case 't':
    case 'T':
      mul = 1ull << 40;
      ++end;
      break;
    default:
      return false;
  }
  if (*end == 'i' || *end == 'B') ++end;  // "MiB", "MB"
  if (*end == 'B') ++end;
  if (*end != '\0' || v > UINT64_MAX / mul) return false;
  *out = v * mul;
  return true;
}

// A size in blocks of 4096 bytes: a bare number counts blocks (as mke2fs and resize2fs do), a
// K, M, G or T suffix bytes (rounded down to whole blocks).
inline bool parse_blocks(const char* s, uint64_t* out) {
  const size_t n = std::strlen(s);
  if (n == 0) return false;
  if (s[n - 1] >= '0' && s[n - 1] <= '9') return parse_u64(s, UINT64_MAX, out);
  uint64_t bytes = 0;
  if (!parse_size(s, &bytes)) return false;
  *out = bytes / fs::kBlockSize;
  return true;
}

inline bool parse_reserved_percent(const char* s, double* out) {
  char* end = nullptr;
  errno = 0;
  const double p = std::strtod(s, &end);
  if (end == s || *end != '\0' || errno != 0 || !(p >= 0 && p <= 50)) return false;
  *out = p;
  return true;
}

inline std::string uuid_string(const fs::Superblock& sb) {
  char u[40];
  std::snprintf(u, sizeof u, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                sb.uuid[0], sb.uuid[1], sb.uuid[2], sb.uuid[3], sb.uuid[4], sb.uuid[5], sb.uuid[6],
                sb.uuid[7], sb.uuid[8], sb.uuid[9], sb.uuid[10], sb.uuid[11], sb.uuid[12],
                sb.uuid[13], sb.uuid[14], sb.uuid[15]);
  return u;
}

inline std::string label_string(const fs::Superblock& sb) {
  return std::string(sb.label, strnlen(sb.label, sizeof sb.label));
}

}  // namespace warpfs::tools
