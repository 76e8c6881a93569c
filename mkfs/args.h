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

// A decimal number in [0, max]: no sign, no suffix, nothing after it.
inline bool parse_u64(const char* s, uint64_t max, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0' || errno != 0 || *s == '-' || *s == '+' || v > max) return false;
  *out = v;
  return true;
}

// The share of the data blocks kept for root (FORMAT.md "Reserved blocks"): 0 to 50.
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
  std::snprintf(u, sizeof u, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", sb.uuid[0],
                sb.uuid[1], sb.uuid[2], sb.uuid[3], sb.uuid[4], sb.uuid[5], sb.uuid[6], sb.uuid[7], sb.uuid[8],
                sb.uuid[9], sb.uuid[10], sb.uuid[11], sb.uuid[12], sb.uuid[13], sb.uuid[14], sb.uuid[15]);
  return u;
}

inline std::string label_string(const fs::Superblock& sb) {
  return std::string(sb.label, strnlen(sb.label, sizeof sb.label));
}

}  // namespace warpfs::tools
